"""Helpers shared by the benchmark scripts in this folder: JSON-line output, skipping,
size parsing, a free loopback port, percentiles, the warm-up/timed round loop, and the latency row format of
the Rust benchmarks."""

import argparse
import json
import socket
import sys
import time


def emit(obj):
    print(json.dumps(obj), flush=True)


def skip(name, reason):
    print(f"SKIPPED {name}: {reason}", flush=True)
    sys.exit(0)


def parse_size(s):
    s = s.strip()
    i = 0
    while i < len(s) and s[i].isdigit():
        i += 1
    if i == 0:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    mult = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
            "g": 1 << 30, "gib": 1 << 30}.get(s[i:].strip().lower())
    if mult is None:
        raise argparse.ArgumentTypeError(f"bad size unit in {s!r} (use KiB, MiB or GiB)")
    return int(s[:i]) * mult


def parse_sizes(s):
    return [parse_size(x) for x in s.split(",") if x.strip()]


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(sorted_vals, p):
    """Nearest rank, as zcs_tests::percentile."""
    if not sorted_vals:
        return float("nan")
    rank = int(-(-(p / 100.0) * len(sorted_vals) // 1))  # ceil
    return sorted_vals[min(max(rank, 1), len(sorted_vals)) - 1]


def latency_row(path, size, rtt_us, extra):
    rtt = sorted(rtt_us)
    row = {
        "bench": "latency",
        "path": path,
        "backend": "cuda",
        "size": size,
        "n": len(rtt),
        "one_way_p50_us": percentile(rtt, 50) / 2,
        "one_way_p99_us": percentile(rtt, 99) / 2,
        "one_way_max_us": (rtt[-1] / 2) if rtt else float("nan"),
        "rtt_p50_us": percentile(rtt, 50),
        "rtt_p99_us": percentile(rtt, 99),
    }
    row.update(extra)
    emit(row)


# Every row warms up for at least this long (and `warmup` rounds): a GPU left idle runs
# at low clocks for a while, and a row whose few warm-up rounds end before the clocks
# have risen (the first row of a run, typically) would carry that into its figures.
WARM_SECS = 0.3


def run_rounds(one, warmup, iters, max_secs):
    """Warm-up rounds (at least `warmup` rounds and WARM_SECS, at most a quarter of the
    budget), then timed rounds (at least 5, until `iters` or the budget); `one()` returns
    (µs, mismatches). Returns (rtt list, mismatches in the timed rounds)."""
    t = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - t < WARM_SECS:
        one()
        done += 1
        if time.perf_counter() - t > max_secs / 4:
            break
    rtt, bad = [], 0
    t = time.perf_counter()
    for i in range(iters):
        us, b = one()
        rtt.append(us)
        bad += b
        if i + 1 >= 5 and time.perf_counter() - t > max_secs:
            break
    return rtt, bad
