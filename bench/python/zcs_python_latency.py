#!/usr/bin/env python3
"""Round trip of a CUDA tensor between two Python processes over zenoh-cuda-shm.

The Python counterpart of torch_ipc_latency.py, with the same timer and rows: the
producer (this process) loans a block per message, fills it through
`torch.from_dlpack(loan)` on its own stream and synchronizes; only then does the timer
start. It puts the loan (zero-copy: the consumer maps the block once and reads it in
place); the consumer (a second process) takes `torch.from_dlpack(sample)` on its stream
(a GPU-side wait for the ready signal), reads one element (`t[0].item()`, which
synchronizes), drops the tensor and the sample (the lease goes back) and replies with a
tiny bytes message. One way = round trip / 2.

Rows (JSON lines, keys as in bench/src/bin/zcs_latency.rs):
- `latency-setup`: GPU, versions, parameters, consumer start time.
- `latency` path `zcs-py-plain`: tiny bytes both ways (the Python + Zenoh floor).
- `latency` path `zcs-py-first-message`: the first tensor the fresh consumer receives.
- `latency` path `zcs-py-loan`: loans written in place, zero-copy to the consumer.
- `latency` path `zcs-py-put`: `put(tensor)` of a recycled torch tensor (a device copy
  into a block, waited for on the host, then zero-copy to the consumer).

    PYTHONPATH=<dir with zenoh_cuda_shm> python3 bench/python/zcs_python_latency.py \
        [--iters 200] [--sizes 1MiB,32MiB,256MiB]
"""

import argparse
import os
import platform
import signal
import subprocess
import sys
import time

from benchcommon import emit, latency_row, parse_sizes, run_rounds
import benchcommon

NAME = "zcs_python_latency"
REPLY_TIMEOUT_S = 30.0


def skip(reason):
    benchcommon.skip(NAME, reason)


def zenoh_config(listen=None, connect=None):
    c = {"mode": "peer", "scouting": {"multicast": {"enabled": False}},
         "listen": {"endpoints": [f"tcp/127.0.0.1:{listen or 0}"]}}
    if connect is not None:
        c["connect"] = {"endpoints": [f"tcp/127.0.0.1:{connect}"]}
    return c


def consumer(args):
    signal.alarm(args.timeout + 10)
    import torch
    import zenoh_cuda_shm as zcs
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    torch.zeros(1, device="cuda").add_(1).item()
    s = zcs.open({"device": "cuda"}, zenoh=zenoh_config(connect=args.port))
    pong = s.declare_publisher(args.key + "/pong")
    sub = s.declare_subscriber(args.key + "/ping")
    print("ready", flush=True)
    while True:
        smp = sub.recv(timeout=120)
        if not smp.is_tensor:
            msg = smp.to_bytes()
            if msg == b"stop":
                break
            pong.put(msg)
            continue
        seq = smp.seq
        t = torch.from_dlpack(smp)
        bad = int(t.view(-1)[0].item() != (seq % 251))
        del t, smp
        pong.put(seq.to_bytes(8, "little") + bytes([bad]))
    s.close()


class Producer:
    def __init__(self, torch, zcs, port, key):
        self.torch = torch
        self.session = zcs.open({"device": "cuda"}, zenoh=zenoh_config(listen=port))
        self.ping = self.session.declare_publisher(key + "/ping")
        self.pong = self.session.declare_subscriber(key + "/pong")
        self.stream = torch.cuda.Stream()
        self.last = 0  # the sequence number of the last put

    def send(self, obj):
        self.last = self.ping.put(obj)
        return self.last

    def wait_reply(self, want):
        while True:
            r = self.pong.recv(timeout=REPLY_TIMEOUT_S).to_bytes()
            if r[:len(want)] == want:
                return r

    def plain(self, tag=b"p"):
        t0 = time.perf_counter()
        self.send(tag)
        self.wait_reply(tag)
        return (time.perf_counter() - t0) * 1e6, 0

    def _roundtrip(self, publish):
        seq = self.last + 1
        t0 = time.perf_counter()
        got = publish()
        assert got == seq, (got, seq)
        r = self.wait_reply(seq.to_bytes(8, "little"))
        return (time.perf_counter() - t0) * 1e6, r[8]

    def loan(self, size):
        torch = self.torch
        seq = self.last + 1
        with torch.cuda.stream(self.stream):
            loan = self.ping.loan(size, "uint8")
            torch.from_dlpack(loan).fill_(seq % 251)
        self.stream.synchronize()
        return self._roundtrip(lambda: self.send(loan))

    def put(self, t):
        torch = self.torch
        seq = self.last + 1
        with torch.cuda.stream(self.stream):
            t.fill_(seq % 251)
        self.stream.synchronize()
        with torch.cuda.stream(self.stream):
            return self._roundtrip(lambda: self.send(t))



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1MiB,32MiB,256MiB"))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--pool", type=int, default=4, help="recycled torch tensors per size (put rows)")
    ap.add_argument("--modes", default="loan,put", help="rows per size: loan, put")
    ap.add_argument("--max-secs", type=float, default=10.0, help="time budget per row")
    ap.add_argument("--timeout", type=int, default=120, help="hard limit for the whole script, s")
    ap.add_argument("--role", default="producer", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--key", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "consumer":
        consumer(args)
        return

    try:
        import torch
    except Exception as e:
        skip(f"torch not importable ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        skip("torch.cuda.is_available() is False (no GPU or no driver)")
    try:
        import zenoh_cuda_shm as zcs
    except Exception as e:
        skip(f"zenoh_cuda_shm not importable ({type(e).__name__}: {e}); install the wheel or set PYTHONPATH")

    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    key = f"zcsbench{os.getpid()}"
    children = []

    def on_alarm(signum, frame):
        emit({"bench": "latency-error", "script": NAME, "error": f"hard timeout after {args.timeout} s"})
        for p in children:
            p.kill()
        os._exit(3)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.timeout)
    import faulthandler
    faulthandler.dump_traceback_later(args.timeout + 15, exit=True)

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda").item()
    rc = 0
    prod = None
    try:
        prod = Producer(torch, zcs, port, key)
        t_start = time.perf_counter()
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "consumer", "--port", str(port),
                              "--key", key, "--timeout", str(args.timeout)], stdout=subprocess.PIPE, text=True)
        children.append(p)
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("the consumer did not start")
        # The first replies prove both directions are routed.
        deadline = time.time() + 30
        while True:
            try:
                prod.send(b"hello")
                prod.pong.recv(timeout=0.2)
                break
            except TimeoutError:
                if time.time() > deadline:
                    raise
        while prod.ping.zero_copy_subscribers < 1:
            if time.time() > deadline:
                raise RuntimeError("the consumer never reached the zero-copy path")
            time.sleep(0.01)
        while prod.pong.try_recv() is not None:
            pass
        consumer_start_s = time.perf_counter() - t_start
        props = torch.cuda.get_device_properties(0)
        emit({
            "bench": "latency-setup", "script": NAME, "gpu": torch.cuda.get_device_name(0),
            "gpu_mem_bytes": int(props.total_memory), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "python": platform.python_version(),
            "zenoh_cuda_shm": zcs.__version__, "backend": prod.session.backend,
            "channel": "zenoh-cuda-shm (loopback TCP Zenoh, zero-copy VMM blocks)",
            "read": "t[0].item()", "iters": args.iters, "warmup": args.warmup, "pool": args.pool,
            "max_secs_per_row": args.max_secs, "consumer_start_s": round(consumer_start_s, 3),
            "timer": "perf_counter from put to reply; fill + synchronize before the timer",
        })
        rtt, _ = run_rounds(prod.plain, args.warmup, args.iters, args.max_secs)
        latency_row("zcs-py-plain", 0, rtt, {"ready": "tiny bytes echoed"})

        us, bad = prod.loan(1 << 20)
        latency_row("zcs-py-first-message", 1 << 20, [us],
                    {"ready": "first tensor of the consumer process", "mismatches": bad})

        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        for size in args.sizes:
            for mode in modes:
                if mode == "loan":
                    one = lambda size=size: prod.loan(size)  # noqa: E731
                    note = "loan filled in place, put, consumer reads in place"
                    firsts = [one()[0] for _ in range(args.pool)]
                else:
                    pool = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(args.pool)]
                    state = {"i": 0}

                    def one(pool=pool, state=state):
                        state["i"] += 1
                        return prod.put(pool[state["i"] % len(pool)])

                    note = "put(tensor): device copy into a block, then zero-copy"
                    firsts = [one()[0] for _ in range(len(pool))]
                rtt, bad = run_rounds(one, args.warmup, args.iters, args.max_secs)
                latency_row(f"zcs-py-{mode}", size, rtt, {
                    "ready": "stream wait on the ready signal (from_dlpack), then t[0].item()",
                    "mode": note, "first_rtt_us": firsts[0], "first_slot_rtt_us": firsts,
                    "mismatches": bad,
                })
            torch.cuda.synchronize()
        prod.send(b"stop")
        p.wait(timeout=20)
    except Exception as e:
        emit({"bench": "latency-error", "script": NAME, "error": f"{type(e).__name__}: {e}"})
        rc = 1
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait(timeout=5)
        if prod is not None:
            prod.session.close()
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
    sys.exit(rc)


if __name__ == "__main__":
    main()
