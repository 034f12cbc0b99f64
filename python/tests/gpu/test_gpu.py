"""GPU tests, in separate processes on the zero-copy path: PyTorch to PyTorch, CuPy and
JAX consumers of the same publisher, and a consumer kernel on its own stream ordered after
a slow producer kernel. Without a GPU each prints `SKIPPED <name>: <reason>` and returns
(ZCS_REQUIRE_GPU=1 makes that a failure)."""

import os
import time

import numpy as np

import zenoh_cuda_shm as zcs
from zcs_testing import IO_TIMEOUT, Peer, gpu_or_skip, module_or_skip, zenoh_config

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_PEER = os.path.join("gpu", "gpu_peer.py")


def cuda_session(port, key):
    return zcs.open({"device": "cuda"}, zenoh=zenoh_config(listen=port, block_prefix=key.split("/")[0]))


def expected(torch, i):
    import gpu_peer
    return torch.from_numpy(gpu_peer.expected_np(i)).cuda()


def test_torch_to_torch_zero_copy(port, key):
    torch = gpu_or_skip("test_torch_to_torch_zero_copy")
    if torch is None:
        return
    import sys
    sys.path.insert(0, HERE)
    n = 8
    with cuda_session(port, key) as s:
        assert s.backend == "cuda-vmm", s.host_reason
        sub = s.declare_subscriber(key)
        p = Peer("torch-pub", port, key, n, 1, script=GPU_PEER)
        try:
            stream = torch.cuda.Stream()  # a non-default consumer stream
            with torch.cuda.stream(stream):
                for i in range(n):
                    smp = sub.recv(timeout=IO_TIMEOUT)
                    assert (smp.seq, smp.path, smp.dtype, smp.shape) == (i + 1, "zero-copy", "int32", (512, 1024))
                    assert smp.__dlpack_device__() == (2, torch.cuda.current_device())
                    x = torch.from_dlpack(smp)  # waits on `stream`, no host wait
                    assert x.is_cuda and x.dtype == torch.int32
                    assert torch.equal(x, expected(torch, i)), f"message {i}"
                    del x, smp
            p.expect("published")
            assert sub.stats()["zero_copy"] == n
        finally:
            p.finish()


def test_cupy_and_jax_consumers_of_one_stream(port, key):
    torch = gpu_or_skip("test_cupy_and_jax_consumers_of_one_stream")
    if torch is None:
        return
    import sys
    sys.path.insert(0, HERE)
    consumers = [r for r, m in (("cupy-sub", "cupy"), ("jax-sub", "jax"))
                 if module_or_skip(f"test_cupy_and_jax_consumers_of_one_stream[{m}]", m) is not None]
    n = 6
    with cuda_session(port, key) as s:
        sub = s.declare_subscriber(key)  # PyTorch here, CuPy and JAX in their own processes
        peers = [Peer(role, port, key, n, script=GPU_PEER,
                      env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}) for role in consumers]
        try:
            for p in peers:
                p.expect("ready", timeout=120)
            pub = Peer("torch-pub", port, key, n, 1 + len(peers), script=GPU_PEER)
            peers.append(pub)
            for i in range(n):
                smp = sub.recv(timeout=IO_TIMEOUT)
                assert smp.path == "zero-copy"
                assert torch.equal(torch.from_dlpack(smp), expected(torch, i)), f"message {i}"
            for p in peers[:-1]:
                p.expect(f"ok {n}", timeout=120)
            pub.expect("published")
        finally:
            for p in peers:
                p.finish()


def test_consumer_stream_waits_for_a_slow_producer_kernel(port, key):
    torch = gpu_or_skip("test_consumer_stream_waits_for_a_slow_producer_kernel")
    if torch is None:
        return
    import sys
    sys.path.insert(0, HERE)
    sleep_ms = 400
    # PyTorch loads the multiply kernel and sets up streams on first use (over 100 ms on
    # an H200): do that before the timed part, which must measure only our waits.
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        (torch.arange(16, device="cuda", dtype=torch.int32) * 2).sum().item()
    with cuda_session(port, key) as s:
        sub = s.declare_subscriber(key)
        p = Peer("slow-pub", port, key, sleep_ms, 1, script=GPU_PEER)
        try:
            smp = sub.recv(timeout=IO_TIMEOUT)
            t_recv = time.perf_counter()
            assert smp.path == "zero-copy"
            with torch.cuda.stream(stream):
                x = torch.from_dlpack(smp)
                y = x * 2  # our kernel, on our stream, behind the wait for the ready signal
                host_ms = (time.perf_counter() - t_recv) * 1e3
                waiting = not stream.query()
            stream.synchronize()
            waited_ms = (time.perf_counter() - t_recv) * 1e3
            line = p.expect("published")
            assert torch.equal(y, expected(torch, 0) * 2), "the consumer kernel read data before it was ready"
            # The host did not wait: the export returned while the producer's kernel ran,
            # and it was our stream that waited.
            assert host_ms < sleep_ms / 4, (host_ms, line)
            assert waiting, "the consumer stream was idle: the publisher's kernel had already finished"
            assert waited_ms > sleep_ms / 4, (waited_ms, line)
            assert "busy_after_put=True" in line, line
            put_ms = float(line.split("put_ms=")[1].split()[0])
            assert put_ms < sleep_ms / 4, line
            print(f"slow producer: put {put_ms:.2f} ms, export {host_ms:.2f} ms, consumer done after {waited_ms:.1f} ms")
        finally:
            p.finish()


def test_cuda_sample_exports(port, key):
    """DLPack requests on a CUDA sample: legacy/versioned, copies, a host copy for NumPy,
    stream values, and deleters."""
    torch = gpu_or_skip("test_cuda_sample_exports")
    if torch is None:
        return
    import sys
    sys.path.insert(0, HERE)
    import gpu_peer
    from zenoh_cuda_shm import _native
    with cuda_session(port, key) as s:
        sub = s.declare_subscriber(key)
        p = Peer("torch-pub", port, key, 2, 1, script=GPU_PEER)
        try:
            smp = sub.recv(timeout=IO_TIMEOUT)
            base = _native._live_exports()
            host = np.from_dlpack(smp, device="cpu")  # dl_device=(1, 0): a device→host copy
            assert np.array_equal(host, gpu_peer.expected_np(0))
            for kw in ({}, {"stream": 1}, {"stream": 2}, {"stream": -1}, {"max_version": (1, 0)},
                       {"max_version": (1, 0), "copy": True}, {"dl_device": (2, torch.cuda.current_device())}):
                cap = smp.__dlpack__(**kw)
                del cap
            stream = torch.cuda.Stream()
            cap = smp.__dlpack__(stream=stream.cuda_stream, max_version=(1, 0), copy=False)
            del cap
            torch.cuda.synchronize()
            for bad, err in (({"stream": 0}, ValueError), ({"dl_device": (2, 99)}, BufferError),
                             ({"dl_device": (1, 0), "copy": False}, BufferError)):
                try:
                    smp.__dlpack__(**bad)
                except err:
                    pass
                else:
                    raise AssertionError(f"{bad} was not refused")
            del host
            assert _native._live_exports() == base
            assert smp.to_bytes() == gpu_peer.expected_np(0).tobytes()
        finally:
            p.finish()
