#!/usr/bin/env python3
"""Device-to-device copy on one GPU: the cost a copying transport would add.

For each size, one `dst.copy_(src)` (torch) and/or one `cudaMemcpyAsync` D2D (CuPy
`MemoryPointer.copy_from_device_async`) on a dedicated stream, timed three ways:
- `event_*`: CUDA events around the single copy (GPU time),
- `wall_*`: perf_counter around launch + event synchronize (what a host thread waits),
- `batched_*`: `--batch` back-to-back copies between two events, divided by the count
  (launch gaps hidden: the copy engine / kernel throughput).
GB/s = size / time (10^9 bytes/s, one direction; a copy moves 2x that through HBM).

    python3 bench/python/d2d_reference.py [--iters 200] [--sizes 4KiB,1MiB,32MiB,256MiB,1GiB]
"""

import argparse
import json
import os
import platform
import signal
import sys
import time

NAME = "d2d_reference"

from benchcommon import emit, parse_size, parse_sizes, percentile
import benchcommon


def skip(reason):
    benchcommon.skip(NAME, reason)



def gbps(size, us):
    return size / (us * 1e-6) / 1e9 if us and us > 0 else float("nan")


def row(backend, op, size, ev_us, wall_us, batched_us, batch):
    ev, wall = sorted(ev_us), sorted(wall_us)
    emit({
        "bench": "d2d-copy", "backend": backend, "op": op, "size": size, "n": len(ev),
        "event_p50_us": percentile(ev, 50), "event_p99_us": percentile(ev, 99),
        "wall_p50_us": percentile(wall, 50), "wall_p99_us": percentile(wall, 99),
        "gbps_p50": gbps(size, percentile(ev, 50)),
        "batched_us_per_copy": batched_us, "batched_gbps": gbps(size, batched_us), "batch": batch,
    })


def iters_for(size, iters, max_bytes):
    """Cap the bytes copied per size so 1 GiB rows stay short."""
    return max(10, min(iters, max_bytes // max(size, 1)))


# ---------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------

def bench_torch(torch, sizes, args):
    s = torch.cuda.Stream()
    for size in sizes:
        src = torch.empty(size, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        n = iters_for(size, args.iters, args.max_bytes)
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            src.fill_(1)
            for _ in range(args.warmup):
                dst.copy_(src)
            s.synchronize()
            ev, wall = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                e0.record(s)
                dst.copy_(src)
                e1.record(s)
                e1.synchronize()
                wall.append((time.perf_counter() - t0) * 1e6)
                ev.append(e0.elapsed_time(e1) * 1e3)
            e0.record(s)
            for _ in range(args.batch):
                dst.copy_(src)
            e1.record(s)
            e1.synchronize()
            batched = e0.elapsed_time(e1) * 1e3 / args.batch
        if not bool((dst[:16] == 1).all()) or int(dst[-1].item()) != 1:
            raise RuntimeError(f"torch copy of {size} bytes produced wrong data")
        row("torch", "dst.copy_(src)", size, ev, wall, batched, args.batch)
        del src, dst
        torch.cuda.empty_cache()


def bench_cupy(cp, sizes, args):
    s = cp.cuda.Stream(non_blocking=True)
    for size in sizes:
        src = cp.ones(size, dtype=cp.uint8)
        dst = cp.empty_like(src)
        n = iters_for(size, args.iters, args.max_bytes)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        cp.cuda.Device().synchronize()

        def copy():
            dst.data.copy_from_device_async(src.data, size, stream=s)

        for _ in range(args.warmup):
            copy()
        s.synchronize()
        ev, wall = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            e0.record(s)
            copy()
            e1.record(s)
            e1.synchronize()
            wall.append((time.perf_counter() - t0) * 1e6)
            ev.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        e0.record(s)
        for _ in range(args.batch):
            copy()
        e1.record(s)
        e1.synchronize()
        batched = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / args.batch
        if int(dst[0]) != 1 or int(dst[-1]) != 1:
            raise RuntimeError(f"cupy copy of {size} bytes produced wrong data")
        row("cupy", "cudaMemcpyAsync D2D", size, ev, wall, batched, args.batch)
        del src, dst
        cp.get_default_memory_pool().free_all_blocks()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("4KiB,1MiB,32MiB,256MiB,1GiB"))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=20, help="back-to-back copies in the batched figure")
    ap.add_argument("--max-bytes", type=int, default=64 << 30,
                    help="cap on bytes copied per size in the timed loop (fewer iters for big sizes)")
    ap.add_argument("--backend", choices=["all", "torch", "cupy"], default="all")
    ap.add_argument("--timeout", type=int, default=120, help="hard limit for the whole script, s")
    args = ap.parse_args()

    reasons = []
    torch = cp = None
    if args.backend in ("all", "torch"):
        try:
            import torch as _t
            if _t.cuda.is_available():
                torch = _t
            else:
                reasons.append("torch.cuda.is_available() is False")
        except Exception as e:
            reasons.append(f"torch not importable ({type(e).__name__}: {e})")
    if args.backend in ("all", "cupy"):
        try:
            import cupy as _c
            if _c.cuda.runtime.getDeviceCount() > 0:
                cp = _c
            else:
                reasons.append("cupy sees no device")
        except Exception as e:
            reasons.append(f"cupy not usable ({type(e).__name__}: {e})")
    if torch is None and cp is None:
        skip("; ".join(reasons) or "no backend")

    def on_alarm(signum, frame):
        emit({"bench": "d2d-error", "script": NAME, "error": f"hard timeout after {args.timeout} s"})
        os._exit(3)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.timeout)
    import faulthandler
    faulthandler.dump_traceback_later(args.timeout + 15, exit=True)

    setup = {"bench": "d2d-setup", "script": NAME, "python": platform.python_version(),
             "iters": args.iters, "warmup": args.warmup, "batch": args.batch,
             "max_bytes_per_size": args.max_bytes, "skipped_backends": reasons}
    if torch is not None:
        setup.update({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "torch_cuda": torch.version.cuda})
    if cp is not None:
        setup["cupy"] = cp.__version__
        setup["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
        if "gpu" not in setup:
            name = cp.cuda.runtime.getDeviceProperties(0)["name"]
            setup["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
    emit(setup)

    rc = 0
    try:
        if torch is not None:
            torch.cuda.set_device(0)
            bench_torch(torch, args.sizes, args)
        if cp is not None:
            cp.cuda.Device(0).use()
            bench_cupy(cp, args.sizes, args)
    except Exception as e:
        emit({"bench": "d2d-error", "script": NAME, "error": f"{type(e).__name__}: {e}"})
        rc = 1
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
    sys.exit(rc)


if __name__ == "__main__":
    main()
