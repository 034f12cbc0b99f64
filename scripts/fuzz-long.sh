#!/usr/bin/env bash
# Long runs of every cargo-fuzz target: each until FUZZ_RUNS executions (default
# 10,000,000), one after the other. Prints libFuzzer's closing "Done N runs in S
# second(s)" per target, and fails on the first crash (its input is kept under the
# fuzz workspace's artifacts/<target>/). The figures in docs/reliability.md come from
# this script. Needs nightly and cargo-fuzz (scripts/fuzz-smoke.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${FUZZ_RUNS:-10000000}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() { # <fuzz workspace> <target>
  echo "== $1 $2 (-runs=$runs)"
  local t0=$SECONDS
  if ! (cd "$1" && cargo +nightly fuzz run -O "$2" -- -runs="$runs" -print_final_stats=1) >"$log" 2>&1; then
    tail -40 "$log"
    echo "FAILED: fuzz target $2"
    exit 1
  fi
  grep -E "^Done [0-9]+ runs" "$log"
  grep -E "^stat::(number_of_executed_units|peak_rss_mb):" "$log" || true
  echo "wall: $((SECONDS - t0)) s"
}
targets=${FUZZ_TARGETS:-"tensor-codec/fuzz:meta_decode tensor-codec/fuzz:cdr_image tensor-codec/fuzz:cdr_tensor
  zenoh-cuda-shm/fuzz:descriptor_decode zenoh-cuda-shm/fuzz:control_decode zenoh-cuda-shm/fuzz:control_frame
  zenoh-cuda-shm/fuzz:token_parse"}
for t in $targets; do
  run "${t%%:*}" "${t##*:}"
done
echo "== all fuzz targets passed $runs runs each"
