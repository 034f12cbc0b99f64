#!/usr/bin/env bash
# The project's test command (README), also run by CI:
#   1. every Rust test in the workspace (GPU tests print "SKIPPED <name>: <reason>"
#      without a usable GPU; ZCS_REQUIRE_GPU=1 turns that into a failure);
#   2. the CDR cross-check against an independent implementation (rosbags, PyPI);
#   3. the one-command demo and one tiny run of each benchmark on the host backend,
#      so neither can rot.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test"
cargo test --workspace --locked

echo "== CDR cross-check against rosbags"
python3 -m pip install -q --disable-pip-version-check -r tensor-codec/python/requirements.txt
python3 -m pytest -q tensor-codec/python

echo "== demo (two processes)"
cargo run -q --locked -p zcs-examples --example zcs_demo -- -n 10 -s 3000000

echo "== benchmark smoke (host backend)"
cargo run -q --locked -p zcs-bench --bin zcs_pool_bench -- --backend host --iters 200 --warmup 10
cargo run -q --locked -p zcs-bench --bin zcs_latency -- --backend host --sizes 4KiB,1MiB --iters 20 --warmup 5
echo "== all tests passed"
