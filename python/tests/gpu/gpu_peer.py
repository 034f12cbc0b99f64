"""The peer processes of the GPU tests. Each opens a CUDA session on loopback Zenoh.

    python gpu_peer.py torch-pub <port> <key> <n> <subscribers>
    python gpu_peer.py slow-pub  <port> <key> <sleep_ms> <subscribers>
    python gpu_peer.py cupy-sub  <port> <key> <n>
    python gpu_peer.py jax-sub   <port> <key> <n>
    python gpu_peer.py ros2-slow-pub <port> <key> <sleep_ms> <domain> <width> <height>

Publishers wait until `subscribers` subscribers are on the zero-copy path, publish, print
`published …` and stay until stdin gets a line. Subscribers print `ready` once
declared, check every value of every message against `expected` and print `ok <n>`."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import zenoh_cuda_shm as zcs  # noqa: E402
from zcs_testing import IO_TIMEOUT, zenoh_config  # noqa: E402

SHAPE = (512, 1024)  # int32: 2 MiB, far above the inline threshold


def expected_np(i: int) -> np.ndarray:
    """Message i: a ramp offset by i, every element distinct (exact in int32)."""
    return (np.arange(SHAPE[0] * SHAPE[1], dtype=np.int64) * 3 + i * 7919).astype(np.int32).reshape(SHAPE)


def open_cuda(port: int, key: str, listen: bool = False):
    z = zenoh_config(listen=port if listen else None, connect=None if listen else port,
                     block_prefix=key.split("/")[0])
    return zcs.open({"device": "cuda"}, zenoh=z)


def wait_zero_copy(pub, k: int) -> None:
    end = time.monotonic() + IO_TIMEOUT
    while pub.zero_copy_subscribers < k:
        if time.monotonic() > end:
            raise SystemExit(f"only {pub.zero_copy_subscribers} of {k} subscribers reached the zero-copy path")
        time.sleep(0.01)


def torch_pub(port: int, key: str, n: int, subs: int) -> None:
    import torch
    session = open_cuda(port, key)
    pub = session.declare_publisher(key)
    wait_zero_copy(pub, subs)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(n):
            want = torch.from_numpy(expected_np(i)).cuda()
            if i % 2 == 0:
                pub.put(want)  # a copy into a block, ordered after `stream`
            else:
                loan = pub.loan(SHAPE, torch.int32)
                torch.from_dlpack(loan).copy_(want)  # written in place on `stream`
                pub.put(loan)
    print(f"published {n}", flush=True)
    sys.stdin.readline()
    session.close()


def sleep_cycles(torch, sleep_ms: int) -> int:
    """The clock cycles for which torch.cuda._sleep (a spin kernel) runs `sleep_ms`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * sleep_ms / max(start.elapsed_time(end), 1e-3))


def slow_pub(port: int, key: str, sleep_ms: int, subs: int) -> None:
    """One loan written after a slow kernel; `put` must return long before the kernel
    ends (the ready signal is ordered on the GPU, not waited for on the host)."""
    import torch
    session = open_cuda(port, key)
    pub = session.declare_publisher(key)
    wait_zero_copy(pub, subs)
    cycles = sleep_cycles(torch, sleep_ms)
    want = torch.from_numpy(expected_np(0)).cuda()
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        loan = pub.loan(SHAPE, torch.int32)
        t = torch.from_dlpack(loan)
        t.fill_(-1)
        torch.cuda._sleep(cycles)  # the publisher's slow kernel
        t.copy_(want)
        t0 = time.perf_counter()
        pub.put(loan)
        put_ms = (time.perf_counter() - t0) * 1e3
        busy = not stream.query()
    print(f"published put_ms={put_ms:.3f} busy_after_put={busy}", flush=True)
    sys.stdin.readline()
    session.close()


def ros2_slow_pub(port: int, key: str, sleep_ms: int, domain: int, width: int, height: int) -> None:
    """One ROS 2 Image (rgba8, the examples' pattern of its sequence number) on topic
    `/<key's first segment>`, written into a loan after a slow kernel; `publish` must
    return long before the kernel ends."""
    import torch
    from zenoh_cuda_shm import ros2
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python"))
    from ros2_pub import pattern
    session = open_cuda(port, key)
    node = ros2.Node(session, "py_slow_pub", domain=domain)
    pub = node.create_publisher(ros2.Image, "/" + key.split("/")[0], ros2.QoSProfile(
        depth=10, history=ros2.HistoryPolicy.KEEP_ALL))
    wait_zero_copy(pub, 1)
    cycles = sleep_cycles(torch, sleep_ms)
    want = pattern(width * height * 4, pub.next_seq, torch, "cuda").to(torch.uint8).reshape(height, width, 4)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        loan = pub.loan((height, width, 4), "uint8")
        t = torch.from_dlpack(loan)
        t.fill_(0)
        torch.cuda._sleep(cycles)  # the publisher's slow kernel
        t.copy_(want)
        t0 = time.perf_counter()
        pub.publish(loan, encoding="rgba8", frame_id="camera")
        put_ms = (time.perf_counter() - t0) * 1e3
        busy = not stream.query()
    print(f"published put_ms={put_ms:.3f} busy_after_put={busy} device_to_host={pub.stats()['device_to_host']}",
          flush=True)
    sys.stdin.readline()
    session.close()


def cupy_sub(port: int, key: str, n: int) -> None:
    import cupy
    session = open_cuda(port, key)
    sub = session.declare_subscriber(key)
    print("ready", flush=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(n):
            s = sub.recv(timeout=IO_TIMEOUT)
            assert s.path == "zero-copy", s
            x = cupy.from_dlpack(s)  # the export orders `stream` after the ready signal
            got = cupy.asnumpy(x * 1, stream=stream)  # a kernel reading in place
            stream.synchronize()
            assert np.array_equal(got, expected_np(i)), f"message {i}"
            del x, s
    print(f"ok {n}", flush=True)
    sys.stdin.readline()
    session.close()


def jax_sub(port: int, key: str, n: int) -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.dlpack
    session = open_cuda(port, key)
    sub = session.declare_subscriber(key)
    print(f"ready {jax.devices()[0]}", flush=True)
    for i in range(n):
        s = sub.recv(timeout=IO_TIMEOUT)
        assert s.path == "zero-copy", s
        x = jax.dlpack.from_dlpack(s)  # legacy capsule, JAX's ready-events stream
        got = np.asarray(x + 0)
        assert np.array_equal(got, expected_np(i)), f"message {i}"
        del x, s
    print(f"ok {n}", flush=True)
    sys.stdin.readline()
    session.close()


def main() -> int:
    role, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rest = [int(a) for a in sys.argv[4:]]
    {"torch-pub": torch_pub, "slow-pub": slow_pub, "ros2-slow-pub": ros2_slow_pub, "cupy-sub": cupy_sub,
     "jax-sub": jax_sub}[role](port, key, *rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
