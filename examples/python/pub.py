#!/usr/bin/env python3
"""Publishes a PyTorch CUDA tensor ten times a second (run sub.py in another terminal).

Every other message is written in place into a loaned block (no copy at all); the
others are `put(tensor)` copies of an ordinary tensor. Subscribers on this host and GPU
read either in place. Without a GPU (or with `--device host`) it publishes CPU tensors
through host memory; without PyTorch it publishes NumPy arrays through host memory.

    python3 examples/python/pub.py

Flags: -k/--key (demo/tensor), --shape (4,1080,1920), -n (100 messages), --device,
-e/--connect, -l/--listen, -m/--mode (peer).
"""

import argparse
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", "--key", default="demo/tensor", help="key to publish on")
    ap.add_argument("--shape", default="4,1080,1920", help="comma-separated dimensions (float32)")
    ap.add_argument("-n", type=int, default=100, help="messages to publish")
    ap.add_argument("--device", choices=["auto", "cuda", "host"], default="auto")
    ap.add_argument("-e", "--connect", action="append", default=[], help="Zenoh endpoint to connect to")
    ap.add_argument("-l", "--listen", action="append", default=[], help="Zenoh endpoint to listen on")
    ap.add_argument("-m", "--mode", choices=["peer", "client", "router"], default="peer", help="Zenoh mode")
    args = ap.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))

    zenoh = {"mode": args.mode}
    if args.connect:
        zenoh["connect"] = {"endpoints": args.connect}
    if args.listen:
        zenoh["listen"] = {"endpoints": args.listen}
    device = args.device
    if torch is None:
        # NumPy arrays live in host memory, and NumPy cannot write a GPU block.
        if device == "cuda":
            sys.exit("pub.py: --device cuda needs PyTorch (pip install torch); --device host runs with NumPy")
        device = "host"
        print("PyTorch not found: publishing NumPy arrays through host memory")
    with zcs.open({"device": device}, zenoh=zenoh) as session:
        dev = "cuda" if session.backend == "cuda-vmm" else "cpu"
        print(f"blocks in {session.backend}" + (f" ({session.gpu_name})" if session.gpu_name else
                                                  f": {session.host_reason}"))
        pub = session.declare_publisher(args.key)
        stream = torch.cuda.Stream() if dev == "cuda" else None
        for i in range(args.n):
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
                  f"{' + bytes' if pub.plain_subscribers else ''}")
            time.sleep(0.1)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main()
