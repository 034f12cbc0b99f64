#!/usr/bin/env python3
"""Round trip of a CUDA tensor between two processes over torch.multiprocessing IPC.

The anchor for zcs_latency's `zero-copy` row: the producer (this process) fills a
tensor from a small pool of recycled tensors on its own stream, synchronizes, and
sends it through a torch.multiprocessing channel (a Queue by default); the consumer
(a spawned process) receives it (torch opens the CUDA IPC handle, or finds it in its
cache, and makes its stream wait on the producer's IPC event), reads one byte on its
stream (`t[0].item()`, which synchronizes), and replies with a tiny tuple on a second
channel. The timer starts after the fill and its synchronize, right before the send,
so the figures are the transport's (like zcs_latency, whose ping writes nothing).
One way = round trip / 2.

Rows (JSON lines, keys as in bench/src/bin/zcs_latency.rs):
- `latency-setup`: GPU, versions, parameters, consumer start time.
- `latency` path `torch-mp-first-message`: the first CUDA tensor the fresh consumer
  ever receives (process-wide one-off costs: first IPC handle open, first event open).
- `latency` path `torch-mp-ipc-hold`: the consumer keeps the last tensor it got for
  each pool slot, so torch's IPC cache hits and no handle is reopened (a pipeline that
  keeps references). `first_rtt_us` / `first_slot_rtt_us` give the cold opens.
- `latency` path `torch-mp-ipc-drop`: the consumer drops each tensor before replying,
  so every message pays cudaIpcOpenMemHandle + close (the usual `q.get()` loop).
- `latency` path `torch-mp-plain`: a tiny tuple over the same channels (the Python
  transport floor to subtract).

    python3 bench/python/torch_ipc_latency.py [--iters 200] [--sizes 1MiB,32MiB,256MiB]
"""

import argparse
import json
import os
import platform
import signal
import sys
import time

NAME = "torch_ipc_latency"

from benchcommon import emit, latency_row, parse_size, parse_sizes, percentile, run_rounds
import benchcommon


def skip(reason):
    benchcommon.skip(NAME, reason)

REPLY_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------------
# Channels: torch.multiprocessing Queue (default) or Pipe, same interface.
# ---------------------------------------------------------------------------------

class QueueTx:
    def __init__(self, q):
        self.q = q

    def send(self, obj):
        self.q.put(obj)


class QueueRx:
    def __init__(self, q):
        self.q = q

    def recv(self, timeout):
        import queue
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"nothing received within {timeout} s") from None


class PipeTx:
    def __init__(self, c):
        self.c = c

    def send(self, obj):
        self.c.send(obj)


class PipeRx:
    def __init__(self, c):
        self.c = c

    def recv(self, timeout):
        if not self.c.poll(timeout):
            raise TimeoutError(f"nothing received within {timeout} s")
        return self.c.recv()


def make_channel(ctx, kind):
    if kind == "queue":
        q = ctx.Queue()
        return QueueTx(q), QueueRx(q)
    rx, tx = ctx.Pipe(duplex=False)
    return PipeTx(tx), PipeRx(rx)


# ---------------------------------------------------------------------------------
# Consumer (spawned process)
# ---------------------------------------------------------------------------------

def consumer(data_rx, reply_tx, read_mode, hard_timeout_s):
    # Default SIGALRM action terminates: a hung consumer cannot outlive the run.
    signal.alarm(int(hard_timeout_s) + 10)
    import torch

    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)  # rebuild_cuda_tensor waits on the IPC event here
    torch.zeros(1, device="cuda").add_(1).item()  # context + allocator up
    reply_tx.send(("ready", os.getpid()))
    held = {}
    while True:
        msg = data_rx.recv(timeout=120.0)
        kind = msg[0]
        if kind == "ping":
            reply_tx.send(("ok", msg[1], 0))
        elif kind == "t":
            _, seq, slot, t, expected, mode = msg
            del msg
            bad = 0
            if read_mode == "item":
                bad = int(t.view(-1)[0].item() != expected)
            else:
                stream.synchronize()
            if mode == "hold":
                held[slot] = t
            del t  # drop mode: last reference, storage (and handle) released here
            reply_tx.send(("ok", seq, bad))
        elif kind == "release":
            held.clear()
            torch.cuda.synchronize()
            reply_tx.send(("released", msg[1], 0))
        elif kind == "stop":
            held.clear()
            torch.cuda.synchronize()
            reply_tx.send(("bye", 0, 0))
            return
        else:
            raise RuntimeError(f"unknown message {kind!r}")


# ---------------------------------------------------------------------------------
# Producer (this process)
# ---------------------------------------------------------------------------------

class Producer:
    def __init__(self, torch, tx, rx):
        self.torch = torch
        self.tx = tx
        self.rx = rx
        self.seq = 0
        self.stream = torch.cuda.Stream()

    def _wait(self, seq):
        while True:
            r = self.rx.recv(timeout=REPLY_TIMEOUT_S)
            if r[1] == seq:
                return r
            # A late reply from an earlier round: ignore it.

    def plain(self):
        self.seq += 1
        t0 = time.perf_counter()
        self.tx.send(("ping", self.seq))
        self._wait(self.seq)
        return (time.perf_counter() - t0) * 1e6, 0

    def tensor(self, t, slot, value, mode):
        with self.torch.cuda.stream(self.stream):
            t.fill_(value)
        self.stream.synchronize()
        self.seq += 1
        t0 = time.perf_counter()
        self.tx.send(("t", self.seq, slot, t, value, mode))
        r = self._wait(self.seq)
        return (time.perf_counter() - t0) * 1e6, r[2]

    def control(self, kind):
        self.seq += 1
        self.tx.send((kind, self.seq))
        self._wait(self.seq)



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1MiB,32MiB,256MiB"))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--pool", type=int, default=4, help="recycled tensors per size")
    ap.add_argument("--modes", default="hold,drop", help="consumer modes: hold, drop")
    ap.add_argument("--channel", choices=["queue", "pipe"], default="queue")
    ap.add_argument("--read", choices=["item", "sync"], default="item",
                    help="consumer read: t[0].item() (default) or a stream synchronize only")
    ap.add_argument("--max-secs", type=float, default=10.0, help="time budget per row")
    ap.add_argument("--timeout", type=int, default=120, help="hard limit for the whole script, s")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("hold", "drop"):
            ap.error(f"bad mode {m!r}")

    try:
        import torch
        import torch.multiprocessing as tmp
    except Exception as e:  # ImportError, or a broken install
        skip(f"torch not importable ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        skip("torch.cuda.is_available() is False (no GPU or no driver)")

    ctx = tmp.get_context("spawn")
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
    # Backstop if the main thread hangs inside C code where the handler cannot run.
    faulthandler.dump_traceback_later(args.timeout + 15, exit=True)

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda").item()
    data_tx, data_rx = make_channel(ctx, args.channel)
    reply_tx, reply_rx = make_channel(ctx, args.channel)
    t_start = time.perf_counter()
    p = ctx.Process(target=consumer, args=(data_rx, reply_tx, args.read, args.timeout), daemon=True)
    p.start()
    children.append(p)
    rc = 0
    try:
        ready = reply_rx.recv(timeout=60.0)
        if ready[0] != "ready":
            raise RuntimeError(f"consumer said {ready!r}")
        consumer_start_s = time.perf_counter() - t_start
        prod = Producer(torch, data_tx, reply_rx)
        props = torch.cuda.get_device_properties(0)
        emit({
            "bench": "latency-setup", "script": NAME, "gpu": torch.cuda.get_device_name(0),
            "gpu_mem_bytes": int(props.total_memory), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "python": platform.python_version(),
            "start_method": "spawn", "channel": f"torch.multiprocessing {args.channel}",
            "read": args.read, "iters": args.iters, "warmup": args.warmup, "pool": args.pool,
            "max_secs_per_row": args.max_secs, "consumer_start_s": round(consumer_start_s, 3),
            "timer": "perf_counter from send to reply; fill_ + synchronize before the timer",
        })

        # Python transport floor.
        rtt, _ = run_rounds(prod.plain, args.warmup, args.iters, args.max_secs)
        latency_row("torch-mp-plain", 0, rtt, {"ready": "tiny tuple echoed"})

        # The first CUDA tensor this consumer ever gets (process-wide one-off costs).
        first = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        us, bad = prod.tensor(first, -1, 7, "drop")
        latency_row("torch-mp-first-message", first.numel(), [us],
                    {"ready": "first CUDA tensor of the consumer process", "mismatches": bad})
        prod.control("release")
        del first

        value = 0
        for size in args.sizes:
            pool = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(args.pool)]
            torch.cuda.synchronize()
            for mode in modes:
                state = {"i": 0}

                def one(mode=mode, pool=pool, state=state):
                    nonlocal value
                    i = state["i"]
                    state["i"] += 1
                    value = value % 255 + 1
                    return prod.tensor(pool[i % len(pool)], i % len(pool), value, mode)

                firsts = [one()[0] for _ in range(len(pool))]  # each slot's first message
                rtt, bad = run_rounds(one, args.warmup, args.iters, args.max_secs)
                note = ("consumer keeps the last tensor per slot: torch's IPC cache hits"
                        if mode == "hold" else
                        "consumer drops each tensor before replying: open + close per message")
                latency_row(f"torch-mp-ipc-{mode}", size, rtt, {
                    "ready": f"IPC event wait on the consumer's stream, then "
                             f"{'t[0].item()' if args.read == 'item' else 'stream synchronize'}",
                    "mode": note, "pool": len(pool),
                    "first_rtt_us": firsts[0], "first_slot_rtt_us": firsts,
                    "mismatches": bad,
                })
                prod.control("release")
            del pool
            torch.cuda.synchronize()
            torch.cuda.ipc_collect()

        prod.tx.send(("stop", 0))
        prod.rx.recv(timeout=REPLY_TIMEOUT_S)
        p.join(timeout=20)
    except Exception as e:
        emit({"bench": "latency-error", "script": NAME, "error": f"{type(e).__name__}: {e}"})
        rc = 1
    finally:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
    sys.exit(rc)


if __name__ == "__main__":
    main()
