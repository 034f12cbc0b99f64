#!/usr/bin/env python3
"""C++ against Rust: the `zero-copy` rows of zcs_latency and the `zero-copy-cpp` rows of
zcs_latency_cpp (bench/c) from JSON-lines files, any number of runs of each, same
backend. Per size: each program's one-way latency (RTT/2, p50 and p99) and the one way
its pong measured (p50), the median over its runs, and the ratio C++ / Rust; then the
largest p50 ratio against the goal (C++ within 1.1x of Rust).

    scripts/c-latency-ratio.py gpu-out/c-latency-*.jsonl

Exits 1 when a size has rows of only one of the two programs, or none at all.
"""

import statistics
import sys

from latencyrows import latency_rows, size_text

GOAL = 1.1
PROGRAMS = {"zero-copy": "Rust", "zero-copy-cpp": "C++"}
FIGURES = [("one_way_p50_us", "p50"), ("one_way_p99_us", "p99"), ("measured_one_way_p50_us", "measured p50")]


def main(paths):
    rows = {}  # (backend, size) -> program -> [row]
    for path in paths:
        for r in latency_rows(path):
            if r.get("path") in PROGRAMS:
                rows.setdefault((r["backend"], r["size"]), {}).setdefault(PROGRAMS[r["path"]], []).append(r)
    if not rows:
        print("no zero-copy or zero-copy-cpp latency rows in " + " ".join(paths))
        return 1
    header = f"{'backend':<11}{'size':>9}"
    for _, name in FIGURES:
        header += f" | {name + ' Rust':>17}{'C++':>9}{'C++/Rust':>9}"
    print("one-way latency (us), median over runs:")
    print(header)
    worst, missing = None, []
    for (backend, size), by in sorted(rows.items()):
        if set(by) != {"Rust", "C++"}:
            missing.append(f"{backend} {size_text(size)}: only {', '.join(sorted(by))}")
            continue
        line = f"{backend:<11}{size_text(size):>9}"
        for key, _ in FIGURES:
            rust = statistics.median(r[key] for r in by["Rust"])
            cpp = statistics.median(r[key] for r in by["C++"])
            ratio = cpp / rust
            line += f" | {rust:>17.1f}{cpp:>9.1f}{ratio:>9.2f}"
            if key == "one_way_p50_us" and (worst is None or ratio > worst[0]):
                worst = (ratio, backend, size)
        runs = f"  ({len(by['Rust'])} Rust, {len(by['C++'])} C++ runs)"
        print(line + runs)
    for m in missing:
        print("missing: " + m)
    if worst:
        ratio, backend, size = worst
        verdict = "met" if ratio <= GOAL else "NOT met"
        print(f"C++/Rust one-way p50: at most {ratio:.2f} ({backend} {size_text(size)}); goal <= {GOAL}: {verdict}")
    return 1 if missing or not worst else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
