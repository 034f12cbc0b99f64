#!/usr/bin/env bash
# A short smoke run of every cargo-fuzz target (CI), where a nightly toolchain exists:
# cargo-fuzz needs nightly for the sanitizer flags. Installs cargo-fuzz if missing.
# Longer runs: see tensor-codec/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECS:-20}
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "SKIPPED fuzz smoke: no nightly toolchain on this machine"
  exit 0
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install -q --locked cargo-fuzz
cd tensor-codec/fuzz
log=$(mktemp)
for t in meta_decode cdr_image cdr_tensor; do
  echo "== fuzz $t (${secs}s)"
  if ! cargo +nightly fuzz run "$t" -- -max_total_time="$secs" >"$log" 2>&1; then
    tail -40 "$log"
    echo "FAILED: fuzz target $t"
    exit 1
  fi
  grep -E "^Done [0-9]+ runs" "$log" || tail -2 "$log"
done
rm -f "$log"
echo "== fuzz smoke passed"
