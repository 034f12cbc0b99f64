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

Flags: -k/--key (demo/tensor), -n (100 messages), --device, -e/--connect, -l/--listen,
-m/--mode (peer).
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", "--key", default="demo/tensor", help="key to subscribe to")
    ap.add_argument("-n", type=int, default=100, help="messages to receive")
    ap.add_argument("--device", choices=["auto", "cuda", "host"], default="auto")
    ap.add_argument("-e", "--connect", action="append", default=[], help="Zenoh endpoint to connect to")
    ap.add_argument("-l", "--listen", action="append", default=[], help="Zenoh endpoint to listen on")
    ap.add_argument("-m", "--mode", choices=["peer", "client", "router"], default="peer", help="Zenoh mode")
    args = ap.parse_args()

    zenoh = {"mode": args.mode}
    if args.connect:
        zenoh["connect"] = {"endpoints": args.connect}
    if args.listen:
        zenoh["listen"] = {"endpoints": args.listen}
    device = args.device
    if torch is None:
        # NumPy reads host memory only: a GPU session would hand it device blocks.
        if device == "cuda":
            sys.exit("sub.py: --device cuda needs PyTorch (pip install torch); --device host runs with NumPy")
        device = "host"
        print("PyTorch not found: reading samples with NumPy, in host memory")
    # Ctrl-C ends the loop, also when this process started with SIGINT ignored (as a
    # background job of a script does).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with zcs.open({"device": device}, zenoh=zenoh) as session:
        cuda = session.backend == "cuda-vmm"
        sub = session.declare_subscriber(args.key)
        stream = torch.cuda.Stream() if cuda else None
        print(f"waiting on {args.key!r} ({session.backend})")
        paths, n, bad = {}, 0, 0
        try:
            for sample in sub:
                n += 1
                bad += not show(sub, sample, paths, cuda, stream)
                del sample
                if n == args.n:
                    break
        except KeyboardInterrupt:  # Ctrl-C: say how far it got
            print(f"interrupted after {n} messages")
        else:
            print(f"done: {n} messages")
    if bad:
        sys.exit(f"{bad} of {n} messages did not hold seq - 1 in every element")


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
