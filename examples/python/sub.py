#!/usr/bin/env python3
"""Receives the tensors of pub.py and checks them with a kernel on its own CUDA stream.

Message `seq` must hold `seq - 1` in every element (what pub.py writes); one that does
not is printed as MISMATCH, and the program then exits with status 1.

`torch.from_dlpack(sample)` maps nothing and copies nothing on the zero-copy path: the
current stream is made to wait for the publisher's ready signal, and the tensor reads
the publisher's block in place. The block goes back to the publisher once the tensor is
gone and the kernels queued on this stream before that have finished. Without a GPU it
reads host memory in place; without PyTorch it does so with NumPy.

    python3 examples/python/sub.py

Flags, as the Rust examples': -k/--key (demo/tensor), -n (100 messages; 0: until
Ctrl-C), --device, -m/--mode (peer), -e/--connect, -l/--listen, -c/--config (a Zenoh
JSON5 file, alone: not with -m, -e, -l), --no-multicast-scouting, --idle-timeout (0 s:
never give up). It says when it waits for a publisher (and names ours on other keys),
and ends on Ctrl-C or SIGTERM with a summary whose counts add up: received = checked +
unread + dropped (queue full).
"""

import argparse
import signal
import sys

try:
    import torch
except ImportError:  # the host-memory path needs NumPy only
    torch = None
    try:
        import numpy
    except ImportError:
        sys.exit("sub.py needs PyTorch, or NumPy for host memory: pip install numpy")

import zenoh_cuda_shm as zcs
from waiting import receive  # beside this file
from zenoh_flags import add_zenoh_flags, zenoh_config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", "--key", default="demo/tensor", help="key to subscribe to")
    ap.add_argument("-n", "--count", type=int, default=100, help="messages to receive (0: until Ctrl-C)")
    ap.add_argument("--idle-timeout", type=float, default=0, help="give up after this many seconds without a message")
    add_zenoh_flags(ap)
    args = ap.parse_args()
    zenoh = zenoh_config(ap, args)
    device = args.device
    if torch is None:
        # NumPy reads host memory only: a GPU session would hand it device blocks.
        if device == "cuda":
            sys.exit("sub.py: --device cuda needs PyTorch (pip install torch); --device host runs with NumPy")
        device = "host"
        print("PyTorch not found: reading samples with NumPy, in host memory")
    # Ctrl-C and SIGTERM end the loop with the summary, also when this process started
    # with SIGINT ignored (as a background job of a script does).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    with zcs.open({"device": device}, zenoh=zenoh) as session:
        cuda = session.backend == "cuda-vmm"
        sub = session.declare_subscriber(args.key)
        stream = torch.cuda.Stream() if cuda else None
        print(f"[sub] subscribed to {args.key!r} ({session.backend})", flush=True)
        paths, n, bad, how = {}, 0, 0, "done"
        hint = elsewhere(session, args.key)
        try:
            while args.count == 0 or n < args.count:
                waiting = (f"[sub] waiting for a publisher on {sub.key!r}…" if n == 0 else
                           f"[sub] nothing for 5 s after {n} messages; waiting for a publisher on {sub.key!r}…")
                sample = receive(sub.recv, n, args.idle_timeout, waiting, hint)
                if sample is None:
                    print(f"[sub] no message for {args.idle_timeout:g} s", file=sys.stderr)
                    how = "stopped"
                    break
                n += 1
                bad += not show(sub, sample, paths, cuda, stream)
                del sample
        except KeyboardInterrupt:
            how = "interrupted"
        print(summary(how, n, sub.stats()), flush=True)
    if bad:
        sys.exit(f"{bad} of {n} messages did not hold seq - 1 in every element")
    if how == "stopped":
        sys.exit(1)


def elsewhere(session, key):
    """A hint that, the first time it runs, names our publishers on keys that `key` does
    not match (a mistyped key, say), as the Rust subscriber does once."""
    asked = False

    def hint():
        nonlocal asked
        if asked:
            return
        asked = True
        keys = session.publisher_keys(timeout=0.5, other_than=key)
        if keys:
            print(f"[sub] publishers seen on other keys: {', '.join(repr(k) for k in keys)} "
                  "(plain Zenoh publishers are not listed)", flush=True)

    return hint


def summary(how, n, s):
    """The last line: what came, by path, and what became of it (checked, unread at the
    end, dropped by the full queue), then what was lost on the way."""
    received = sum(s[p] for p in ("zero_copy", "peer_copy", "host_block", "inline", "cpu_bytes", "plain"))
    dropped = s["dropped_queue_full"]
    unread = max(0, received - n - dropped)
    fate = "".join([f", {unread} unread at the end" if unread else "",
                    f", {dropped} dropped as the queue was full" if dropped else ""])
    return (f"[sub] {how}: {n} messages checked of {received} received (zero-copy {s['zero_copy']}, "
            f"cpu-bytes {s['cpu_bytes']}, inline {s['inline']}, plain {s['plain']}){fate}; "
            f"lost {s['lost']}, duplicates dropped {s['duplicates']}")


def show(sub, sample, paths, cuda, stream):
    """Prints the path of a new publisher (with its reason) and the sample's value;
    returns whether every element is `seq - 1`."""
    if paths.get(sample.publisher_id) != sample.path:
        paths[sample.publisher_id] = sample.path
        why = sub.path_reason(sample)
        print(f"publisher {sample.publisher_id:016x}: path {sample.path}" + (f" ({why})" if why else ""))
    if cuda:
        with torch.cuda.stream(stream):
            t = torch.from_dlpack(sample)  # `stream` waits for the publisher
            lo, hi = t.min(), t.max()      # a kernel on `stream`, reading in place
        lo, hi = lo.item(), hi.item()      # synchronizes `stream`
        where = t.device
    elif torch is not None:
        t = torch.from_dlpack(sample)
        lo, hi = t.min().item(), t.max().item()
        where = t.device
    else:
        t = numpy.from_dlpack(sample)      # in place, read-only
        lo, hi = t.min().item(), t.max().item()
        where = "cpu (NumPy)"
    ok = lo == hi == sample.seq - 1
    print(f"#{sample.seq} {sample.path:9} {tuple(sample.shape)} {sample.dtype} on {where}: "
          f"value {lo:g} {'ok' if ok else 'MISMATCH'}")
    return ok


if __name__ == "__main__":
    main()
