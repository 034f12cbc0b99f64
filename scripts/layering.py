#!/usr/bin/env python3
"""The workspace's layering, checked (CI runs it after the lints).

Fails when:
  1. a library crate's dependency on another workspace crate points up the layer order
     below (or the crates' dependencies form a cycle, dev-dependencies included);
  2. the top-level modules of a library crate depend on each other in a circle
     (`crate::a` used in module `b` and `crate::b` in `a`, directly or through others);
  3. a library source file has more than MAX_LINES lines;
  4. a shipped artefact (the zenohd plugin, the bridge, the C library, the Python wheel)
     gets a test-only feature: `cargo tree -e features` of each shows none of
     TEST_FEATURES.

Usage: scripts/layering.py [--no-cargo-tree]   (from anywhere in the repository)
"""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 600

# Lowest first: a crate may depend only on crates before it in this list.
LAYERS = [
    "tensor-codec",
    "zcs-memory",
    "zcs-pool",
    "zcs-wire",
    "zcs-provider",
    "zcs-transport",
    "zenoh-cuda-shm",
    "zenoh-cuda-shm-ros2",
    "zenoh-plugin-cuda-shm",
    "zenoh-bridge-cuda-shm",
    "zenoh-cuda-shm-c",
    "zcs-python",
]
SHIPPED = ["zenoh-plugin-cuda-shm", "zenoh-bridge-cuda-shm", "zenoh-cuda-shm-c", "zcs-python"]
TEST_FEATURES = ["test-kernels", "fault-injection", "loom-model", "test-support", "internals"]


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def check_crates(meta, errors):
    names = {p["name"]: p for p in meta["packages"]}
    missing = [n for n in LAYERS if n not in names]
    if missing:
        errors.append(f"layer list names crates the workspace lacks: {', '.join(missing)}")
    rank = {n: i for i, n in enumerate(LAYERS)}
    graph = {}
    for p in meta["packages"]:
        deps = [d["name"] for d in p["dependencies"] if d["name"] in names]
        graph[p["name"]] = deps
        if p["name"] not in rank:
            continue  # tests, benchmarks, examples: above everything
        for d in deps:
            kind = next(x.get("kind") for x in p["dependencies"] if x["name"] == d)
            if kind == "dev":
                continue
            if d not in rank:
                errors.append(f"{p['name']} depends on {d}, which is not a library layer")
            elif rank[d] >= rank[p["name"]]:
                errors.append(f"{p['name']} depends on {d}, a layer above or beside it")
    for cycle in cycles(graph):
        errors.append("crates depend on each other in a circle: " + " -> ".join(cycle + cycle[:1]))


def cycles(graph):
    """Every strongly connected component of more than one node (or a self-loop)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


USE_CRATE = re.compile(r"\bcrate::(\{[^}]*\}|[a-z_][a-z0-9_]*)")


def module_graph(src):
    """Top-level modules of a crate's src/ and which of the others each one uses."""
    mods = {}
    for p in src.iterdir():
        if p.name in ("lib.rs", "main.rs"):
            continue
        name = p.stem if p.suffix == ".rs" else p.name
        files = [p] if p.is_file() else sorted(p.rglob("*.rs"))
        mods.setdefault(name, []).extend(f for f in files if f.suffix == ".rs")
    graph = {}
    for name, files in mods.items():
        used = set()
        for f in files:
            text = strip_comments(f.read_text())
            for m in USE_CRATE.finditer(text):
                target = m.group(1)
                if target.startswith("{"):
                    used.update(t.strip().split("::")[0] for t in target[1:-1].split(","))
                else:
                    used.add(target)
            # A top-level module file's `super::x` is the crate's `x`.
            if f.parent == src:
                used.update(re.findall(r"\bsuper::([a-z_][a-z0-9_]*)", text))
        graph[name] = sorted(u for u in used if u in mods and u != name)
    return graph


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def check_modules(meta, errors):
    for p in meta["packages"]:
        if p["name"] not in LAYERS:
            continue
        src = pathlib.Path(p["manifest_path"]).parent / "src"
        if not src.is_dir():
            continue
        for cycle in cycles(module_graph(src)):
            errors.append(f"{p['name']}: modules use each other in a circle: {', '.join(cycle)}")
        for f in sorted(src.rglob("*.rs")):
            n = len(f.read_text().splitlines())
            if n > MAX_LINES:
                errors.append(f"{f.relative_to(ROOT)}: {n} lines (a library file has at most {MAX_LINES})")


def check_features(errors):
    for crate in SHIPPED:
        out = subprocess.run(
            ["cargo", "tree", "--locked", "-e", "features,no-dev", "-p", crate, "--prefix", "none"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout
        for feature in TEST_FEATURES:
            hits = sorted({line.strip() for line in out.splitlines() if f'feature "{feature}"' in line})
            if hits:
                errors.append(f"{crate} gets the test feature {feature!r}: {hits[0]}")


def main():
    errors = []
    meta = metadata()
    check_crates(meta, errors)
    check_modules(meta, errors)
    if "--no-cargo-tree" not in sys.argv:
        check_features(errors)
    for e in errors:
        print(f"layering: {e}")
    if errors:
        sys.exit(1)
    print(f"layering: {len(LAYERS)} library crates in order, no circles, files ≤ {MAX_LINES} lines, "
          f"no test feature in {', '.join(SHIPPED)}")


if __name__ == "__main__":
    main()
