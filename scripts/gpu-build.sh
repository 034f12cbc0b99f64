#!/usr/bin/env bash
# Builds every test binary, the benchmarks and the examples with the `gpu` profile (release, stripped)
# into .gpu-bin/, ready to carry to a GPU machine that has the driver but no Rust.
# No CUDA is needed here: cudarc opens libcuda at run time.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=.gpu-bin
rm -rf "$out"
mkdir -p "$out"
grep -qx '/.gpu-bin/' .git/info/exclude 2>/dev/null || echo '/.gpu-bin/' >> .git/info/exclude

cargo test --profile gpu --workspace --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        name = "test-" + m["package_id"].split("#")[0].rsplit("/", 1)[-1].split("@")[0] + "-" + t["name"]
        shutil.copy2(m["executable"], sys.argv[1] + "/" + name)
        print(name)
' "$out"
cargo build --profile gpu -p zcs-bench --bins -p zcs-examples --examples --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        shutil.copy2(m["executable"], sys.argv[1] + "/")
        print(m["target"]["name"])
' "$out"
du -sh "$out"
