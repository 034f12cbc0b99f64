"""The second process of the CPU tests: a publisher on a host-memory session.

    python peer.py <role> <port> <key> [n]

It connects to the test's session on 127.0.0.1:<port>, waits until the test's subscriber
is on the zero-copy path, publishes what `role` says, prints `published <count>`, and
stays until its stdin gets a line (so that nothing is cut short by its exit)."""

from __future__ import annotations

import sys
import time

import numpy as np

import cases
import zenoh_cuda_shm as zcs
from zcs_testing import IO_TIMEOUT, zenoh_config


def loan_cases():
    """(shape, dtype, fill) of the loans the `loans` role publishes."""
    return [
        ((4, 5), "float64", lambda a: a.__setitem__(..., np.arange(20).reshape(4, 5) * 0.5)),
        ((300, 256), np.float32, lambda a: a.__setitem__(..., np.arange(300 * 256, dtype=np.float32).reshape(300, 256))),
        ((7,), np.dtype("int16"), lambda a: a.__setitem__(..., np.array([-7, -1, 0, 1, 2, 300, -300]))),
        ((2, 2, 2), "bool", lambda a: a.__setitem__(..., np.array([True, False] * 4).reshape(2, 2, 2))),
        ((3,), "complex64", lambda a: a.__setitem__(..., np.array([1 + 2j, -3.5j, 4]))),
    ]


def main() -> int:
    role, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    session = zcs.open({"device": "host"}, zenoh=zenoh_config(connect=port, block_prefix=key.split("/")[0]))
    pub = session.declare_publisher(key)
    end = time.monotonic() + IO_TIMEOUT
    while pub.zero_copy_subscribers < 1:
        if time.monotonic() > end:
            print("the subscriber never reached the zero-copy path", file=sys.stderr)
            return 2
        time.sleep(0.01)
    count = 0
    if role == "cases":
        for c in cases.CASES:
            pub.put(c.make())
            count += 1
    elif role == "loans":
        for shape, dtype, fill in loan_cases():
            loan = pub.loan(shape, dtype)
            fill(np.from_dlpack(loan))
            pub.put(loan)
            count += 1
        # Written with Loan.write instead of through NumPy.
        loan = pub.loan(11, "uint8")
        loan.write(b"hello", 0)
        loan.write(b" world", 5)
        pub.put(loan)
        count += 1
    elif role == "bytes":
        for payload in (b"", b"x", b"hello bytes", bytes(range(256)) * 1024):
            pub.put(payload)
            count += 1
        pub.put(bytearray(b"from a bytearray"))
        pub.put(memoryview(b"from a memoryview"))
        count += 2
    elif role == "stream":
        # n messages; message i holds the value i, sizes alternating around the inline
        # threshold so both paths are taken.
        for i in range(n):
            size = 1000 if i % 2 == 0 else 40000
            pub.put(np.full(size, i, dtype=np.int32))
            count += 1
    else:
        print(f"unknown role {role}", file=sys.stderr)
        return 2
    print(f"published {count}", flush=True)
    sys.stdin.readline()
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
