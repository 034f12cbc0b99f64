#!/usr/bin/env python3
"""Where a joining subscriber's time goes, from the `zcs_join` trace events.

Reads the stderr of `RUST_LOG=zcs_join=trace zcs_throughput ... --first-subs N`
(scripts/gpu-run.sh writes it to join/steps.log): the publisher and every joining
subscriber log each step of joining with a wall-clock timestamp. Each joining starts at
the bench's "declare_subscriber called"; for each step, this prints the p50 and max
time from there and the p50 of the time since the step before it.

    python3 scripts/join-steps.py gpu-out/join/steps.log
"""

import re
import statistics
import sys
from datetime import datetime

START = "bench: declare_subscriber called"
LINE = re.compile(r"^(\S+Z)\s+TRACE\s+zcs_join:\s+(.*?)\s*$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse(path):
    events = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            m = LINE.match(ANSI.sub("", raw))
            if not m:
                continue
            ts = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            # The step is the message, without its fields (`seq=3 block=1`).
            step = re.sub(r"(\s+\w+=\S+)+$", "", m.group(2))
            events.append((ts, step))
    events.sort()
    return events


def joinings(events):
    """Per joining: the first time (µs after its start) each step was seen."""
    runs, cur = [], None
    for ts, step in events:
        if step == START:
            cur = {"t0": ts, "steps": {}}
            runs.append(cur)
        elif cur is not None and step not in cur["steps"]:
            cur["steps"][step] = (ts - cur["t0"]) * 1e6
    return runs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = joinings(parse(sys.argv[1]))
    if not runs:
        sys.exit(f"no '{START}' event in {sys.argv[1]}")
    # Steps in the order of their median time.
    names = {s for r in runs for s in r["steps"]}
    at = {s: [r["steps"][s] for r in runs if s in r["steps"]] for s in names}
    order = sorted(names, key=lambda s: statistics.median(at[s]))
    print(f"{len(runs)} joinings; µs after declare_subscriber was called")
    print(f"{'step':<40} {'p50':>8} {'max':>8} {'p50 since previous':>20} {'seen':>5}")
    prev = None
    for s in order:
        since = [r["steps"][s] - r["steps"][prev] for r in runs if s in r["steps"] and prev in r["steps"]] if prev else []
        gap = f"{statistics.median(since):.0f}" if since else ""
        print(f"{s:<40} {statistics.median(at[s]):>8.0f} {max(at[s]):>8.0f} {gap:>20} {len(at[s]):>5}")
        prev = s


if __name__ == "__main__":
    main()
