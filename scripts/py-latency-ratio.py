#!/usr/bin/env python3
"""Our Python loan path against torch.multiprocessing's cached CUDA IPC, pair by pair.

Reads the JSON-lines output of bench/python/torch_ipc_latency.py and
zcs_python_latency.py from runs made in alternation; a file's pair is the number at the
end of its name (`torch_ipc_latency-1.jsonl` pairs with `zcs_python_latency-1.jsonl`
and `zcs_python_latency_nospin-1.jsonl`). The machine's figures drift between minutes, so
a ratio is only taken within a pair. Per pair and size it prints the one-way p50 of
`torch-mp-ipc-hold` and of each of our PyTorch loan rows (`zcs-py-loan`, and
`zcs-py-loan-nospin` or `zcs-py-loan-spin` where `--spin-us` was given), torch ÷ ours,
and each row's p99 ÷ p50; then, per row, the lowest ratio against the goal (≥ 2.5) and
the highest p99 ÷ p50 against its goal (≤ 2).

    scripts/py-latency-ratio.py out/torch_ipc_latency-*.jsonl out/zcs_python_latency*-[12].jsonl

Exits 1 when a pair lacks the torch row or all of ours.
"""

import re
import sys

from latencyrows import latency_rows, size_text

ANCHOR = "torch-mp-ipc-hold"
OURS = ("zcs-py-loan", "zcs-py-loan-nospin", "zcs-py-loan-spin")
GOAL_RATIO = 2.5
GOAL_TAIL = 2.0


def load(paths):
    """(pair, path, size) -> row, for the anchor and our rows."""
    rows = {}
    for path in paths:
        m = re.search(r"-(\d+)\.jsonl$", path)
        if not m:
            print(f"{path}: no pair number at the end of the name; skipped", file=sys.stderr)
            continue
        for r in latency_rows(path):
            if r.get("path") in (ANCHOR, *OURS):
                rows[(int(m.group(1)), r["path"], r["size"])] = r
    return rows


def main(paths):
    rows = load(paths)
    pairs = sorted({p for p, _, _ in rows})
    if not pairs:
        print("no torch-mp-ipc-hold or zcs-py-loan rows in " + " ".join(paths))
        return 1
    worst = {}  # row -> (lowest ratio, highest p99/p50)
    bad = []
    print(f"one way p50 (us); torch's cached IPC / ours; ours p99/p50 (goals: >= {GOAL_RATIO}, <= {GOAL_TAIL})")
    for pair in pairs:
        sizes = sorted({s for p, path, s in rows if p == pair and path == ANCHOR})
        ours = [o for o in OURS if any(p == pair and path == o for p, path, _ in rows)]
        if not sizes or not ours:
            bad.append(f"pair {pair}: " + ("no torch row" if not sizes else "none of our rows"))
            continue
        print(f"pair {pair}:")
        for size in sizes:
            torch = rows[(pair, ANCHOR, size)]["one_way_p50_us"]
            line = f"  {size_text(size):>8}  torch {torch:7.1f}"
            for o in ours:
                r = rows.get((pair, o, size))
                if r is None:
                    line += f" | {o} -"
                    continue
                ratio = torch / r["one_way_p50_us"]
                tail = r["one_way_p99_us"] / r["one_way_p50_us"]
                lo, hi = worst.get(o, (ratio, tail))
                worst[o] = (min(lo, ratio), max(hi, tail))
                line += f" | {o} {r['one_way_p50_us']:6.1f} x{ratio:4.2f} tail {tail:4.2f}"
            print(line)
    for o, (lo, hi) in worst.items():
        ratio_ok = "met" if lo >= GOAL_RATIO else "not met"
        tail_ok = "met" if hi <= GOAL_TAIL else "not met"
        print(f"{o}: lowest ratio {lo:.2f} ({ratio_ok}), highest p99/p50 {hi:.2f} ({tail_ok})")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
