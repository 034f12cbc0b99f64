#!/usr/bin/env python3
"""Round trip of a cuda.core IPC buffer between two processes.

Same ping-pong as torch_ipc_latency.py, with cuda.core's IPC-enabled stream-ordered
memory pool (`DeviceMemoryResourceOptions(ipc_enabled=True, max_size=...)`): the pool
is exported once to the spawned consumer (its allocation handle, a file descriptor, as
a Process argument; the consumer imports it with `from_allocation_handle`, which
registers the mapped pool under its UUID), then each message is `pickle.dumps(buffer)`
(MR UUID + `cuMemPoolExportPointer` descriptor, the documented "send the MR once, then
pickle buffers" path) sent over a multiprocessing Pipe. The consumer unpickles (which
imports the pointer), copies one byte to the host on its own stream and synchronizes,
and replies with a tiny tuple. The producer fills the buffer and synchronizes its stream
before the timer starts. One way = round trip / 2.

Rows (JSON lines, keys as in bench/src/bin/zcs_latency.rs):
- `latency-setup`: GPU, versions, parameters, pool import time in the consumer.
- `latency` path `cuda-core-ipc-hold`: the consumer keeps the imported buffer for each
  pool slot and reuses it when the same pickled buffer arrives again (one import per
  slot: what a pipeline that caches imports pays). `first_rtt_us` / `first_slot_rtt_us`
  carry the cold imports.
- `latency` path `cuda-core-ipc-drop`: every message is unpickled (one
  `cuMemPoolImportPointer`) and closed (`cuMemFreeAsync` of the import) before the reply.
- `latency` path `mp-pipe-plain`: a tiny tuple over the same pipes.

    python3 bench/python/cuda_core_ipc_latency.py [--iters 200] [--sizes 1MiB,32MiB,256MiB]
"""

import argparse
import ctypes
import json
import os
import pickle
import platform
import signal
import sys
import time

NAME = "cuda_core_ipc_latency"

from benchcommon import emit, latency_row, parse_size, parse_sizes, percentile, run_rounds
import benchcommon


def skip(reason):
    benchcommon.skip(NAME, reason)

REPLY_TIMEOUT_S = 30.0
MiB = 1 << 20


# ---------------------------------------------------------------------------------
# API discovery (cuda.core moved out of `experimental`, and changed signatures)
# ---------------------------------------------------------------------------------

def load_cuda_core():
    """Returns (module with Device etc., driver bindings module, versions dict) or skips."""
    errors = []
    cc = None
    for name in ("cuda.core", "cuda.core.experimental"):
        try:
            m = __import__(name, fromlist=["Device"])
        except Exception as e:
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        if all(hasattr(m, a) for a in ("Device", "DeviceMemoryResource")):
            cc = m
            break
        errors.append(f"{name}: no Device/DeviceMemoryResource")
    if cc is None:
        skip("cuda.core not usable (" + "; ".join(errors) + ")")
    try:
        from cuda.bindings import driver
    except Exception:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6 layout
        except Exception as e:
            skip(f"cuda.bindings driver module not importable ({type(e).__name__}: {e})")
    versions = {}
    try:
        import cuda.core as top
        versions["cuda.core"] = getattr(top, "__version__", "unknown")
    except Exception:
        versions["cuda.core"] = "unknown"
    try:
        import cuda.bindings as b
        versions["cuda.bindings"] = getattr(b, "__version__", "unknown")
    except Exception:
        versions["cuda.bindings"] = "unknown"
    return cc, driver, versions


def check(driver, res, what):
    """cuda.bindings calls return (CUresult, *values)."""
    if not isinstance(res, tuple):
        res = (res,)
    err = res[0]
    if int(err) != int(driver.CUresult.CUDA_SUCCESS):
        raise RuntimeError(f"{what}: {err!r}")
    return res[1:]


def ipc_options_class(cc):
    opts = getattr(cc, "DeviceMemoryResourceOptions", None)
    if opts is None:
        return None, "installed cuda.core has no DeviceMemoryResourceOptions"
    try:
        opts(ipc_enabled=True, max_size=64 * MiB)
    except TypeError as e:
        return None, f"DeviceMemoryResourceOptions(ipc_enabled=, max_size=) rejected: {e}"
    return opts, None


def mr_allocate(mr, size, stream):
    try:
        return mr.allocate(size, stream=stream)  # current cuda.core: stream is keyword-only
    except TypeError:
        return mr.allocate(size, stream)


def export_pool_handle(mr):
    """The pool's shareable handle (property in current cuda.core, method before)."""
    h = getattr(type(mr), "allocation_handle", None)
    if h is not None:
        return mr.allocation_handle
    if hasattr(mr, "get_allocation_handle"):
        return mr.get_allocation_handle()
    return None


def buffer_fill(driver, buf, value, stream):
    if hasattr(buf, "fill"):
        try:
            buf.fill(value, stream=stream)
            return
        except TypeError:
            pass
    check(driver, driver.cuMemsetD8Async(int(buf.handle), value, buf.size, stream.handle),
          "cuMemsetD8Async")


def stream_sync(stream):
    if hasattr(stream, "sync"):
        stream.sync()
    else:
        stream.synchronize()


# ---------------------------------------------------------------------------------
# Consumer (spawned process)
# ---------------------------------------------------------------------------------

def consumer(pool_arg, arg_is_handle, data_rx, reply_tx, hard_timeout_s):
    signal.alarm(int(hard_timeout_s) + 10)  # default action terminates
    cc, driver, _ = load_cuda_core()
    dev = cc.Device(0)
    dev.set_current()
    stream = dev.create_stream()
    host = (ctypes.c_uint8 * 8)()
    host_addr = ctypes.addressof(host)

    t0 = time.perf_counter()
    if arg_is_handle:
        mmr = cc.DeviceMemoryResource.from_allocation_handle(dev, pool_arg)
    else:
        mmr = pool_arg  # already imported while unpickling the Process arguments
    import_us = (time.perf_counter() - t0) * 1e6
    # The registry holds mapped pools weakly: keep `mmr` alive for the whole run.
    reply_tx.send(("ready", os.getpid(), import_us, bool(getattr(mmr, "is_mapped", True))))

    cached = {}  # pickled bytes -> imported Buffer (hold mode)

    def read(buf):
        check(driver, driver.cuMemcpyDtoHAsync(host_addr, int(buf.handle), 1, stream.handle),
              "cuMemcpyDtoHAsync")
        stream_sync(stream)
        return host[0]

    def close(buf):
        try:
            buf.close(stream)
        except TypeError:
            buf.close()
        stream_sync(stream)  # the import is released before the next one can be made

    while True:
        if not data_rx.poll(120.0):
            raise TimeoutError("producer silent for 120 s")
        msg = data_rx.recv()
        kind = msg[0]
        if kind == "ping":
            reply_tx.send(("ok", msg[1], 0))
        elif kind == "b":
            _, seq, value, mode, payload = msg
            if mode == "hold":
                buf = cached.get(payload)
                if buf is None:
                    buf = pickle.loads(payload)
                    cached[payload] = buf
                bad = int(read(buf) != value)
            else:
                buf = pickle.loads(payload)
                bad = int(read(buf) != value)
                close(buf)
            del buf
            reply_tx.send(("ok", seq, bad))
        elif kind in ("release", "stop"):
            n_imports = len(cached)
            for b in cached.values():
                close(b)
            cached.clear()
            reply_tx.send(("released" if kind == "release" else "bye", msg[1], n_imports))
            if kind == "stop":
                return
        else:
            raise RuntimeError(f"unknown message {kind!r}")


# ---------------------------------------------------------------------------------
# Producer (this process)
# ---------------------------------------------------------------------------------

class Producer:
    def __init__(self, driver, stream, tx, rx):
        self.driver = driver
        self.stream = stream
        self.tx = tx
        self.rx = rx
        self.seq = 0

    def _wait(self, seq):
        while True:
            if not self.rx.poll(REPLY_TIMEOUT_S):
                raise TimeoutError(f"no reply to seq {seq} within {REPLY_TIMEOUT_S} s")
            r = self.rx.recv()
            if r[1] == seq:
                return r

    def plain(self):
        self.seq += 1
        t0 = time.perf_counter()
        self.tx.send(("ping", self.seq))
        self._wait(self.seq)
        return (time.perf_counter() - t0) * 1e6, 0

    def buffer(self, buf, value, mode):
        buffer_fill(self.driver, buf, value, self.stream)
        stream_sync(self.stream)
        self.seq += 1
        t0 = time.perf_counter()
        self.tx.send(("b", self.seq, value, mode, pickle.dumps(buf)))
        r = self._wait(self.seq)
        return (time.perf_counter() - t0) * 1e6, r[2]

    def control(self, kind):
        self.seq += 1
        self.tx.send((kind, self.seq))
        return self._wait(self.seq)



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1MiB,32MiB,256MiB"))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--pool", type=int, default=4, help="recycled buffers per size")
    ap.add_argument("--modes", default="hold,drop", help="consumer modes: hold, drop")
    ap.add_argument("--max-secs", type=float, default=10.0, help="time budget per row")
    ap.add_argument("--timeout", type=int, default=120, help="hard limit for the whole script, s")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("hold", "drop"):
            ap.error(f"bad mode {m!r}")

    cc, driver, versions = load_cuda_core()
    try:
        check(driver, driver.cuInit(0), "cuInit")
        (count,) = check(driver, driver.cuDeviceGetCount(), "cuDeviceGetCount")
    except Exception as e:
        skip(f"no usable CUDA driver/GPU ({type(e).__name__}: {e})")
    if count < 1:
        skip("no CUDA device")
    Opts, why = ipc_options_class(cc)
    if Opts is None:
        skip(why)
    if not hasattr(cc.DeviceMemoryResource, "from_allocation_handle") and \
            not hasattr(cc.DeviceMemoryResource, "from_registry"):
        skip("installed cuda.core DeviceMemoryResource has no IPC import API")

    import multiprocessing as mp
    # cuda.core warns at Process start when the *global* start method is fork, even
    # for a spawn context: make spawn the global method too.
    mp.set_start_method("spawn", force=True)
    ctx = mp.get_context("spawn")
    children = []

    def on_alarm(signum, frame):
        emit({"bench": "latency-error", "script": NAME, "error": f"hard timeout after {args.timeout} s"})
        for p in children:
            try:
                p.kill()
            except Exception:
                pass
        os._exit(3)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.timeout)
    import faulthandler
    faulthandler.dump_traceback_later(args.timeout + 15, exit=True)

    dev = cc.Device(0)
    dev.set_current()
    stream = dev.create_stream()
    need = sum(-(-s // (2 * MiB)) * 2 * MiB for s in args.sizes) * args.pool
    max_size = max(1 << 30, -(-(need * 5 // 4 + 64 * MiB) // (32 * MiB)) * 32 * MiB)
    try:
        mr = cc.DeviceMemoryResource(dev, Opts(ipc_enabled=True, max_size=max_size))
    except TypeError as e:
        skip(f"DeviceMemoryResource(device, options) rejected: {e}")
    if not getattr(mr, "is_ipc_enabled", False):
        skip("DeviceMemoryResource with ipc_enabled=True reports is_ipc_enabled False")
    handle = export_pool_handle(mr) if hasattr(cc.DeviceMemoryResource, "from_allocation_handle") else None
    pool_arg, arg_is_handle = (handle, True) if handle is not None else (mr, False)

    data_rx, data_tx = ctx.Pipe(duplex=False)
    reply_rx, reply_tx = ctx.Pipe(duplex=False)
    t_start = time.perf_counter()
    p = ctx.Process(target=consumer, args=(pool_arg, arg_is_handle, data_rx, reply_tx, args.timeout),
                    daemon=True)
    p.start()
    children.append(p)
    rc = 0
    pools = []
    try:
        if not reply_rx.poll(60.0):
            raise TimeoutError("consumer not ready within 60 s")
        ready = reply_rx.recv()
        if ready[0] != "ready":
            raise RuntimeError(f"consumer said {ready!r}")
        consumer_start_s = time.perf_counter() - t_start
        prod = Producer(driver, stream, data_tx, reply_rx)
        emit({
            "bench": "latency-setup", "script": NAME, "gpu": dev.name, **versions,
            "python": platform.python_version(), "start_method": "spawn",
            "channel": "multiprocessing Pipe, pickle.dumps(Buffer) per message",
            "pool_export": "allocation handle as Process arg" if arg_is_handle else "MR as Process arg",
            "pool_import_us": ready[2] if arg_is_handle else None,
            "pool_max_size": max_size, "read": "1-byte cuMemcpyDtoHAsync + stream sync",
            "iters": args.iters, "warmup": args.warmup, "pool": args.pool,
            "max_secs_per_row": args.max_secs, "consumer_start_s": round(consumer_start_s, 3),
            "timer": "perf_counter from pickle+send to reply; fill + stream sync before the timer",
        })

        rtt, _ = run_rounds(prod.plain, args.warmup, args.iters, args.max_secs)
        latency_row("mp-pipe-plain", 0, rtt, {"ready": "tiny tuple echoed"})

        value = 0
        for size in args.sizes:
            pool = [mr_allocate(mr, size, stream) for _ in range(args.pool)]
            pools.append(pool)
            stream_sync(stream)
            for mode in modes:
                state = {"i": 0}

                def one(mode=mode, pool=pool, state=state):
                    nonlocal value
                    i = state["i"]
                    state["i"] += 1
                    value = value % 255 + 1
                    return prod.buffer(pool[i % len(pool)], value, mode)

                firsts = [one()[0] for _ in range(len(pool))]
                rtt, bad = run_rounds(one, args.warmup, args.iters, args.max_secs)
                held_imports = prod.control("release")[2]
                note = ("consumer keeps one imported buffer per slot (one import per slot)"
                        if mode == "hold" else
                        "consumer unpickles (imports) and closes each buffer before replying")
                latency_row(f"cuda-core-ipc-{mode}", size, rtt, {
                    "ready": "1-byte D2H read on the consumer's stream, synchronized",
                    "mode": note, "pool": len(pool),
                    "first_rtt_us": firsts[0], "first_slot_rtt_us": firsts,
                    "mismatches": bad,
                    **({"held_imports": held_imports} if mode == "hold" else {}),
                })

        prod.tx.send(("stop", -1))
        if reply_rx.poll(REPLY_TIMEOUT_S):
            reply_rx.recv()
        p.join(timeout=20)
    except Exception as e:
        emit({"bench": "latency-error", "script": NAME, "error": f"{type(e).__name__}: {e}"})
        rc = 1
    finally:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
        if rc == 0:
            for pool in pools:
                for b in pool:
                    try:
                        b.close(stream)
                    except Exception:
                        pass
            stream_sync(stream)
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
    sys.exit(rc)


if __name__ == "__main__":
    main()
