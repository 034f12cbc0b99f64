#!/usr/bin/env python3
"""Round trip of a CUDA tensor between two Python processes over zenoh-cuda-shm.

The Python counterpart of torch_ipc_latency.py, with the same timer and rows: the
producer (this process) loans a block per message, fills it through
`torch.from_dlpack(loan)` on its own stream and synchronizes; only then does the timer
start. It puts the loan (zero-copy: the consumer maps the block once and reads it in
place); the consumer (a second process) takes `torch.from_dlpack(sample)` on its stream
(a GPU-side wait for the ready signal), reads one element (`t[0].item()`, which
synchronizes), drops the tensor and the sample (the lease goes back) and replies with a
tiny bytes message. One way = round trip / 2. The consumer is PyTorch, then CuPy,
then JAX (one consumer process each, where the framework imports and sees the GPU).

Each row also breaks its round trip down (`breakdown_p50_us`, the median of each step
over the timed rounds, from CLOCK_MONOTONIC stamps both processes share): `put` (the
producer's call), `wake` (put returned → the consumer's recv returned), `export` (our
`__dlpack__`), `framework` (the rest of from_dlpack), `read` (element 0 to the host),
`release` (dropping the tensor and the sample), `reply_put`, `reply_wake` (→ the
producer has the reply).

Rows (JSON lines, keys as in bench/src/bin/zcs_latency.rs):
- `latency-setup`: GPU, versions, parameters, consumer start time (one per framework).
- `latency` path `zcs-py-plain`: tiny bytes both ways (the Python + Zenoh floor).
- `latency` path `zcs-py-first-message`: the first tensor the fresh consumer receives.
- `latency` path `zcs-py-loan`: loans written in place, zero-copy to the consumer.
- `latency` path `zcs-py-put`: `put(tensor)` of a recycled torch tensor (a device copy
  into a block, waited for on the host, then zero-copy to the consumer).
- `zcs-py-first-message-cupy`, `zcs-py-loan-cupy`, and the same for `jax`: the loan
  rows with that consumer.

    PYTHONPATH=<dir with zenoh_cuda_shm> python3 bench/python/zcs_python_latency.py \
        [--iters 200] [--sizes 1MiB,32MiB,256MiB] [--frameworks torch,cupy,jax]
"""

import argparse
import os
import platform
import signal
import struct
import subprocess
import sys
import time

from benchcommon import emit, latency_row, parse_sizes, percentile, run_rounds
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


def spin_suffix(spin_us):
    """Row name suffix: '' for the library's default, '-nospin' for 0, '-spin' else."""
    return "" if spin_us is None else "-nospin" if spin_us == 0 else "-spin"


def zcs_config(spin_us):
    """Our session configuration: CUDA, and `spin_us` if given (None: the library's
    default, adaptive polling; 0: receivers sleep at once)."""
    cfg = {"device": "cuda"}
    if spin_us is not None:
        cfg["spin_us"] = spin_us
    return cfg


def framework(name):
    """The consumer's framework: (import a DLPack producer on the current stream, read
    element 0 to the host, which waits for the stream)."""
    if name == "torch":
        import torch
        torch.cuda.set_device(0)
        torch.cuda.set_stream(torch.cuda.Stream())
        torch.zeros(1, device="cuda").add_(1).item()
        return torch.from_dlpack, lambda t: int(t.view(-1)[0].item())
    if name == "cupy":
        import cupy
        cupy.cuda.Device(0).use()
        cupy.cuda.Stream(non_blocking=True).use()
        int(cupy.zeros(1, dtype=cupy.uint8)[0])
        return cupy.from_dlpack, lambda t: int(t.ravel()[0])
    if name == "jax":
        import jax
        import jax.numpy as jnp
        gpu = jax.devices("gpu")[0]
        int(jax.device_put(jnp.zeros(1, dtype=jnp.uint8), gpu)[0])
        return jax.dlpack.from_dlpack, lambda t: int(t.ravel()[0])
    raise ValueError(f"unknown framework {name!r}")


def consumer(args):
    signal.alarm(args.timeout + 10)
    try:
        from_dlpack, read = framework(args.framework)
    except Exception as e:
        print(f"skip {type(e).__name__}: {e}", flush=True)
        return
    import zenoh_cuda_shm as zcs
    s = zcs.open(zcs_config(args.spin_us), zenoh=zenoh_config(connect=args.port))
    pong = s.declare_publisher(args.key + "/pong")
    sub = s.declare_subscriber(args.key + "/ping")
    print("ready", flush=True)
    now = time.perf_counter_ns
    shim = ExportTimer()
    while True:
        smp = sub.recv(timeout=120)
        c0 = now()
        if not smp.is_tensor:
            msg = smp.to_bytes()
            if msg == b"stop":
                break
            pong.put(msg + STEPS.pack(c0, 0, c0, c0, c0, now()))
            continue
        seq = smp.seq
        shim.sample = smp
        t = from_dlpack(shim)
        c1 = now()
        bad = int(read(t) != (seq % 251))
        c2 = now()
        del t, smp
        shim.sample = None
        c3 = now()
        pong.put(seq.to_bytes(8, "little") + bytes([bad]) + STEPS.pack(c0, shim.ns, c1, c2, c3, now()))
    s.close()


# The consumer's step times (CLOCK_MONOTONIC ns, shared by both processes): received,
# our __dlpack__'s duration, from_dlpack returned, read, released, reply about to be put.
STEPS = struct.Struct("<6q")


class ExportTimer:
    """Stands in for a sample in torch.from_dlpack and times its __dlpack__ call (ours),
    so the breakdown can tell our export from the framework's part."""

    def __init__(self):
        self.sample = None
        self.ns = 0

    def __dlpack_device__(self):
        return self.sample.__dlpack_device__()

    def __dlpack__(self, **kw):
        t = time.perf_counter_ns()
        cap = self.sample.__dlpack__(**kw)
        self.ns = time.perf_counter_ns() - t
        return cap


# The steps of one round trip, from the producer's put to its receiving the reply.
BREAKDOWN = ["put", "wake", "export", "framework", "read", "release", "reply_put", "reply_wake"]


def breakdown(rounds):
    """The median and the 99th percentile of each step over the timed rounds (µs; they
    need not add up to the round trip's)."""
    cols = [sorted(c) for c in zip(*rounds)]
    return {f"breakdown_p{p}_us": {name: round(percentile(c, p), 2) for name, c in zip(BREAKDOWN, cols)}
            for p in (50, 99)}


def steps_of(a, b, reply, z):
    """The round trip's steps in µs: the producer's put (a → b), the consumer's steps from
    the reply's timestamps, and the reply's way back (→ z)."""
    c0, export, c1, c2, c3, c4 = STEPS.unpack(reply[-STEPS.size:])
    us = lambda ns: ns / 1e3  # noqa: E731
    return [us(b - a), us(c0 - b), us(export), us(c1 - c0 - export), us(c2 - c1), us(c3 - c2), us(c4 - c3),
            us(z - c4)]


class Producer:
    def __init__(self, torch, zcs, port, key, spin_us):
        self.torch = torch
        self.session = zcs.open(zcs_config(spin_us), zenoh=zenoh_config(listen=port))
        self.ping = self.session.declare_publisher(key + "/ping")
        self.pong = self.session.declare_subscriber(key + "/pong")
        self.stream = torch.cuda.Stream()
        self.last = 0  # the sequence number of the last put
        self.steps = []  # per round trip: the BREAKDOWN steps, µs

    def connect(self):
        """Waits until a fresh consumer answers and takes the zero-copy path."""
        deadline = time.time() + 30
        while True:
            try:
                self.send(b"hello")
                self.pong.recv(timeout=0.2)
                break
            except TimeoutError:
                if time.time() > deadline:
                    raise
        while self.ping.zero_copy_subscribers < 1:
            if time.time() > deadline:
                raise RuntimeError("the consumer never reached the zero-copy path")
            time.sleep(0.01)
        while self.pong.try_recv() is not None:
            pass

    def send(self, obj):
        self.last = self.ping.put(obj)
        return self.last

    def wait_reply(self, want):
        while True:
            r = self.pong.recv(timeout=REPLY_TIMEOUT_S).to_bytes()
            if r[:len(want)] == want:
                return r

    def plain(self, tag=b"p"):
        a = time.perf_counter_ns()
        self.send(tag)
        b = time.perf_counter_ns()
        r = self.wait_reply(tag)
        z = time.perf_counter_ns()
        self.steps.append(steps_of(a, b, r, z))
        return (z - a) / 1e3, 0

    def _roundtrip(self, publish):
        seq = self.last + 1
        a = time.perf_counter_ns()
        got = publish()
        b = time.perf_counter_ns()
        assert got == seq, (got, seq)
        r = self.wait_reply(seq.to_bytes(8, "little"))
        z = time.perf_counter_ns()
        self.steps.append(steps_of(a, b, r, z))
        return (z - a) / 1e3, r[8]

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
    ap.add_argument("--frameworks", default="torch,cupy,jax",
                    help="consumer frameworks, one consumer process each (those that do not import are skipped)")
    ap.add_argument("--spin-us", type=int, default=None,
                    help="both sessions' spin_us, the most receivers poll before sleeping (default: the "
                         "library's; rows get '-nospin' for 0, '-spin' for another value)")
    ap.add_argument("--framework", default="torch", help=argparse.SUPPRESS)
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

    port = benchcommon.free_port()
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
        prod = Producer(torch, zcs, port, key, args.spin_us)
        props = torch.cuda.get_device_properties(0)
        first = True
        for fw in [f.strip() for f in args.frameworks.split(",") if f.strip()]:
            t_start = time.perf_counter()
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "consumer", "--port",
                                  str(port), "--key", key, "--timeout", str(args.timeout), "--framework", fw,
                                  *([] if args.spin_us is None else ["--spin-us", str(args.spin_us)])],
                                 stdout=subprocess.PIPE, text=True)
            children.append(p)
            line = p.stdout.readline().strip()
            if line != "ready":
                emit({"bench": "latency-skip", "script": NAME, "framework": fw, "reason": line or "no answer"})
                p.wait(timeout=20)
                continue
            prod.connect()
            emit({
                "bench": "latency-setup", "script": NAME, "gpu": torch.cuda.get_device_name(0),
                "gpu_mem_bytes": int(props.total_memory), "torch": torch.__version__,
                "torch_cuda": torch.version.cuda, "python": platform.python_version(),
                "zenoh_cuda_shm": zcs.__version__, "backend": prod.session.backend, "framework": fw,
                "channel": "zenoh-cuda-shm (loopback TCP Zenoh, zero-copy VMM blocks)",
                "read": "element 0 to the host", "iters": args.iters, "warmup": args.warmup,
                "warm_secs": benchcommon.WARM_SECS, "pool": args.pool, "max_secs_per_row": args.max_secs,
                "consumer_start_s": round(time.perf_counter() - t_start, 3),
                "timer": "perf_counter from put to reply; fill + synchronize before the timer",
                "breakdown": "breakdown_p50_us, breakdown_p99_us: " + ", ".join(BREAKDOWN),
                "spin_us": "library default" if args.spin_us is None else args.spin_us, "cpus": len(os.sched_getaffinity(0)), "loadavg": os.getloadavg(),
            })
            suffix = ("" if fw == "torch" else f"-{fw}") + spin_suffix(args.spin_us)
            if first:
                rtt, _ = run_rounds(prod.plain, args.warmup, args.iters, args.max_secs)
                latency_row("zcs-py-plain" + suffix, 0, rtt, {"ready": "tiny bytes echoed", **breakdown(prod.steps[-len(rtt):])})
                first = False
            us, bad = prod.loan(1 << 20)
            latency_row(f"zcs-py-first-message{suffix}", 1 << 20, [us],
                        {"ready": "first tensor of the consumer process", "mismatches": bad})
            # The put rows measure the producer's copy, the same for every consumer.
            modes = [m.strip() for m in args.modes.split(",") if m.strip() and (fw == "torch" or m.strip() == "loan")]
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
                    latency_row(f"zcs-py-{mode}{suffix}", size, rtt, {
                        **breakdown(prod.steps[-len(rtt):]),
                        "ready": f"stream wait on the ready signal ({fw} from_dlpack), then element 0 to the host",
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
