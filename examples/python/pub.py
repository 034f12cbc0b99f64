#!/usr/bin/env python3
"""Publishes a PyTorch CUDA tensor ten times a second (run sub.py in another terminal).

Every other message is written in place into a loaned block (no copy at all); the
others are `put(tensor)` copies of an ordinary tensor. Subscribers on this host and GPU
read either in place. Without a GPU (or with `--device host`) it publishes CPU tensors
through host memory; without PyTorch it publishes NumPy arrays through host memory.

    python3 examples/python/pub.py

Flags, as the Rust examples': -k/--key (demo/tensor), --shape (4,1080,1920), -n (100
messages; 0: until Ctrl-C), -r/--rate (10 per second), --device, -m/--mode (peer),
-e/--connect, -l/--listen, -c/--config (a Zenoh JSON5 file, alone: not with -m, -e, -l),
--no-multicast-scouting. Ctrl-C or SIGTERM ends it with a summary.
"""

import argparse
import signal
import sys
import time

try:
    import torch
except ImportError:  # the host-memory path needs NumPy only
    torch = None
    try:
        import numpy
    except ImportError:
        sys.exit("pub.py needs PyTorch, or NumPy for host memory: pip install numpy")

import zenoh_cuda_shm as zcs
from zenoh_flags import add_zenoh_flags, zenoh_config  # beside this file


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", "--key", default="demo/tensor", help="key to publish on")
    ap.add_argument("--shape", default="4,1080,1920", help="comma-separated dimensions (float32)")
    ap.add_argument("-n", "--count", type=int, default=100, help="messages to publish (0: until Ctrl-C)")
    ap.add_argument("-r", "--rate", type=float, default=10.0, help="messages per second (0: as fast as possible)")
    add_zenoh_flags(ap)
    args = ap.parse_args()
    try:
        shape = tuple(int(d) for d in args.shape.split(","))
    except ValueError:
        ap.error(f"--shape takes comma-separated whole numbers, not {args.shape!r}")
    zenoh = zenoh_config(ap, args)
    device = args.device
    if torch is None:
        # NumPy arrays live in host memory, and NumPy cannot write a GPU block.
        if device == "cuda":
            sys.exit("pub.py: --device cuda needs PyTorch (pip install torch); --device host runs with NumPy")
        device = "host"
        print("PyTorch not found: publishing NumPy arrays through host memory")
    # Ctrl-C and SIGTERM end the loop with the summary, also when this process started
    # with SIGINT ignored (as a background job of a script does).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    with zcs.open({"device": device}, zenoh=zenoh) as session:
        dev = "cuda" if session.backend == "cuda-vmm" else "cpu"
        print(f"blocks in {session.backend}" + (f" ({session.gpu_name})" if session.gpu_name else
                                                  f": {session.host_reason}"))
        pub = session.declare_publisher(args.key)
        stream = torch.cuda.Stream() if dev == "cuda" else None
        i, how = 0, "done"
        try:
            while args.count == 0 or i < args.count:
                put_one(pub, i, shape, dev, stream)
                i += 1
                if args.rate > 0:
                    time.sleep(1 / args.rate)
        except KeyboardInterrupt:
            how = "interrupted"
        s = pub.stats()
        print(f"[pub] {how}: {i} messages ({s['descriptors']} by descriptor to zero-copy subscribers, "
              f"{s['copies_out']} copied out for subscribers that need bytes)", flush=True)


def put_one(pub, i, shape, dev, stream):
    """Message `i`, holding `i` in every element: written in place into a loaned block
    (odd `i`) or copied from an ordinary tensor (even `i`)."""
    value = float(i)
    if i % 2 == 1:
        if torch is None:
            loan = pub.loan(shape, "float32")
            numpy.from_dlpack(loan).fill(value)  # your code writes here
        else:
            loan = pub.loan(shape, torch.float32)
            with torch.cuda.stream(stream) if stream else _nothing():
                torch.from_dlpack(loan).fill_(value)  # your kernels write here
        seq = pub.put(loan)  # the ready signal follows the fill on `stream`
        how = "loan"
    else:
        if torch is None:
            t = numpy.full(shape, value, dtype=numpy.float32)
        else:
            t = torch.full(shape, value, dtype=torch.float32, device=dev)
        seq = pub.put(t)
        how = "copy"
    print(f"put #{seq} ({how}) value {value:g} to {pub.zero_copy_subscribers} zero-copy subscriber(s)"
          f"{' + bytes' if pub.plain_subscribers else ''}", flush=True)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main()
