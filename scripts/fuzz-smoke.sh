#!/usr/bin/env bash
# A short smoke run of every cargo-fuzz target (CI), where a nightly toolchain exists:
# cargo-fuzz needs nightly for the sanitizer flags. Installs cargo-fuzz if missing.
# Longer runs (10 M executions each): scripts/fuzz-long.sh, figures in docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECS:-20}
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "SKIPPED fuzz smoke: no nightly toolchain on this machine"
  exit 0
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install -q --locked cargo-fuzz
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# tensor-codec's decoders, then the library's wire formats (descriptors, control
# requests/replies, whole control frames through a real socket, token names).
for t in tensor-codec/fuzz:meta_decode tensor-codec/fuzz:cdr_image tensor-codec/fuzz:cdr_tensor \
         zenoh-cuda-shm/fuzz:descriptor_decode zenoh-cuda-shm/fuzz:control_decode \
         zenoh-cuda-shm/fuzz:control_frame zenoh-cuda-shm/fuzz:token_parse; do
  dir=${t%%:*} target=${t##*:}
  echo "== fuzz $target (${secs}s)"
  if ! (cd "$dir" && cargo +nightly fuzz run -O "$target" -- -max_total_time="$secs") >"$log" 2>&1; then
    tail -40 "$log"
    echo "FAILED: fuzz target $target"
    exit 1
  fi
  grep -E "^Done [0-9]+ runs" "$log" || tail -2 "$log"
done
echo "== fuzz smoke passed"
