"""What the latency ratio scripts share: reading the latency rows of JSON-lines files
(bench/ and bench/python/ print them) and naming a size."""

import json


def latency_rows(path):
    """The `"bench": "latency"` rows of a JSON-lines file; other lines are skipped."""
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and r.get("bench") == "latency":
                yield r


def size_text(n):
    """`n` bytes as `4 KiB`, `1 MiB`, … where it is a whole number of them."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
