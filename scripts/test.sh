#!/usr/bin/env bash
# The project's test command (README), also run by CI:
#   1. every Rust test in the workspace (GPU tests print "SKIPPED <name>: <reason>"
#      without a usable GPU; ZCS_REQUIRE_GPU=1 turns that into a failure), the C ABI's
#      among them (the C and C++ examples built with CMake under AddressSanitizer and run
#      against Rust in other processes; cmake comes from pip), the router
#      plugin's among them: in stock zenohd 1.10.2 and its REST plugin, built from
#      crates.io by scripts/zenohd.sh (cached per machine), and in the static bridge;
#      zenohd refusing a plugin built with other zenoh features (scripts/plugin-mismatch.sh);
#      then, in a cargo invocation of its own, the copies out into Zenoh's shared memory
#      (tests/zenoh-shm/tests/shm_out.rs, feature zenoh-shm; a package without the plugin);
#      with ZCS_CUDA_BUFFER_SRC naming the sources of ROS 2's CUDA buffer backend, our
#      registry against that backend's own (scripts/cuda-buffer-core.sh builds it);
#   2. the CDR cross-check against an independent implementation (rosbags, PyPI), and
#      the ROS 2 examples against an independent rmw_zenoh peer (tests/python);
#   3. the Python package's pytest suites (CPU path in two processes; the GPU suite
#      prints SKIPPED without a GPU); the package is built (dev profile, same target dir:
#      nothing of the workspace is compiled twice) and installed into target/py-venv
#      before the Rust tests, whose C ABI suite runs the Python examples against it;
#   4. the one-command demo and one tiny run of each benchmark on the host backend,
#      so neither can rot.
#
# Python packages go into venvs under target/ only, never into the system's Python:
# target/test-venv for the test tools (cmake, the ROS 2 peer's packages, rosbags), put
# first on PATH so that every `python3` and `cmake` below and in the tests is its own;
# target/py-venv for the Python package (scripts/python-test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT

venv=$PWD/target/test-venv
if [ ! -x "$venv/bin/python3" ]; then
  echo "== a venv for the test tools: target/test-venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
export PATH="$venv/bin:$PATH"

echo "== zenohd and its REST plugin for the plugin tests (scripts/zenohd.sh, cached)"
ZCS_ZENOHD_DIR=$(./scripts/zenohd.sh)
export ZCS_ZENOHD_DIR

echo "== cmake for the C and C++ examples' build (tests of zenoh-cuda-shm-c; pip)"
command -v cmake >/dev/null || python3 -m pip install -q --disable-pip-version-check "cmake>=3.16"

if [ -n "${ZCS_CUDA_BUFFER_SRC:-}" ] && [ -z "${ZCS_CUDA_BUFFER_CORE:-}" ]; then
  echo "== the CUDA buffer backend's registry, built from ZCS_CUDA_BUFFER_SRC (scripts/cuda-buffer-core.sh)"
  ZCS_CUDA_BUFFER_CORE=$(./scripts/cuda-buffer-core.sh)
  export ZCS_CUDA_BUFFER_CORE
fi

echo "== the ROS 2 peer's Python packages (tests/ros2_stream.rs runs it on host memory; pip)"
python3 -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt

echo "== cargo test"
# Build first: the mismatched plugin is built from what this build leaves in target/debug.
cargo test --workspace --locked --no-run
echo "== the Python package, built and installed into target/py-venv (scripts/python-build.sh)"
./scripts/python-build.sh
ZCS_MISMATCH_PLUGIN=$(./scripts/plugin-mismatch.sh)
export ZCS_MISMATCH_PLUGIN
# The C ABI's suite runs the Python examples: it must not skip for want of the package.
ZCS_REQUIRE_PYTHON=1 cargo test --workspace --locked 2>&1 | tee "$log"

echo "== copies out into Zenoh's shared memory (feature zenoh-shm, a cargo invocation of its own)"
# Zenoh's `shared-memory` changes zenoh::FEATURES for everything this invocation builds,
# the plugin included: it must not share an invocation with the plugin's tests.
cargo test --locked -p zcs-shm-tests --features zenoh-shm --test shm_out 2>&1 | tee -a "$log"

echo "== CDR cross-check against rosbags"
python3 -m pip install -q --disable-pip-version-check -r tensor-codec/python/requirements.txt
python3 -m pytest -q tensor-codec/python 2>&1 | tee -a "$log"

echo "== ROS 2 over rmw_zenoh against an independent peer (eclipse-zenoh + rosbags)"
python3 -m pytest -q tests/python 2>&1 | tee -a "$log"

echo "== Python package (pytest; built and installed above)"
./scripts/python-test.sh --installed 2>&1 | tee -a "$log"

echo "== demo (two processes)"
cargo run -q --locked -p zcs-examples --example zcs_demo -- -n 10 -s 3000000

echo "== benchmark smoke (host backend)"
smoke=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$smoke"' EXIT
cargo run -q --locked -p zcs-bench --bin zcs_pool_bench -- --backend host --iters 200 --warmup 10 | tee "$smoke/zcs_pool_bench.jsonl"
cargo run -q --locked -p zcs-bench --bin zcs_latency -- --backend host --sizes 4KiB,1MiB --iters 20 --warmup 5 | tee "$smoke/zcs_latency.jsonl"
cargo run -q --locked -p zcs-bench --bin zcs_latency -- --backend host --sizes 4KiB --iters 20 --warmup 5 \
  --zenohd "$ZCS_ZENOHD_DIR/bin/zenohd" --plugin target/debug/deps/libzenoh_plugin_cuda_shm.so | tee "$smoke/zcs_latency_zenohd.jsonl"
cargo run -q --locked -p zcs-bench --bin zcs_throughput -- --backend host --sizes 64KiB --subscribers 1 --frames 20 --first-subs 2 | tee "$smoke/zcs_throughput.jsonl"
# Zenoh's own shared memory with user copies: Zenoh's `shared-memory` feature is on for
# this one binary only (bench/Cargo.toml), hence a cargo invocation of its own.
cargo run -q --locked -p zcs-bench --features zenoh-shm --bin zcs_zenoh_shm -- --backend host --sizes 4KiB,1MiB \
  --iters 20 --warmup 5 --frame-sizes 64KiB --subscribers 1 --frames 20 | tee "$smoke/zcs_zenoh_shm.jsonl"
cargo run -q --locked -p zcs-bench --features zenoh-shm --bin zcs_zenoh_shm -- --backend host --shm-out --sizes 4KiB,1MiB \
  --iters 20 --warmup 5 --frame-sizes 64KiB --subscribers 1 --frames 20 | tee "$smoke/zcs_zenoh_shm_out.jsonl"
cargo run -q --locked -p zcs-bench --bin zcs_report -- "$smoke" "$smoke/report"
# One closing line for the whole run: Rust test binaries, doc tests and pytest added up
# (child processes that re-run a test binary for one entry test report "N filtered out"
# and are not counted); "skipped" counts the GPU tests that printed SKIPPED (libtest
# counts them as passed: they return early), which are taken out of "passed".
awk '
  /^test result: / && / 0 filtered out/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
  /^[0-9]+ passed/ && !/^test result/ { p += $1 }
  /^SKIPPED / { s += 1 }
  END { printf "tests: %d passed, %d failed, %d skipped\n", p - s, f, s }
' "$log"
