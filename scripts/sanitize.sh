#!/usr/bin/env bash
# The library's unit tests and the CPU-path integration tests (host memfd blocks, the
# control channel, real processes and Zenoh on loopback) under a sanitizer; results and
# figures in docs/reliability.md, "Concurrency checking". Needs the nightly toolchain
# (and its rust-src component for tsan).
#
#   scripts/sanitize.sh asan   AddressSanitizer, with LeakSanitizer at every exit
#   scripts/sanitize.sh tsan   ThreadSanitizer; std is rebuilt instrumented (-Zbuild-std)
#
# Further arguments go to `cargo test` (e.g. `--no-run`), those after `--` to the test
# binaries (e.g. `-- --test-threads=1`). ASAN_OPTIONS / TSAN_OPTIONS from the
# environment are appended to the script's own (e.g. TSAN_OPTIONS=print_suppressions=1).
# Each mode has its own target directory (target/asan, target/tsan; CARGO_TARGET_DIR
# overrides), so neither rebuilds the ordinary one. Child processes (tests re-run their
# own binary) inherit the sanitizer options, and a report in a child fails its parent.
# With --target given, RUSTFLAGS reach the target crates only, not build scripts or
# proc-macros, which run uninstrumented on the host.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case $mode in
  asan | tsan) shift ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [cargo test arguments] [-- test binary arguments]" >&2
    exit 2
    ;;
esac
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "SKIPPED $mode: no nightly toolchain on this machine"
  exit 0
fi
supp=$PWD/scripts/sanitizers
export CARGO_INCREMENTAL=0
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/$mode}
# Dependencies carry no debug info ([profile.dev.package."*"] in Cargo.toml): reports
# still name every frame, with file:line for our crates.
extra=()
skip=()
case $mode in
  asan)
    export RUSTFLAGS="-Zsanitizer=address"
    export ASAN_OPTIONS="detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    ;;
  tsan)
    export RUSTFLAGS="-Zsanitizer=thread"
    export TSAN_OPTIONS="suppressions=$supp/tsan.supp:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
    extra=(-Zbuild-std)
    # This test needs its 512 idle connections to be accepted faster than the handshake
    # timeout (400 ms) closes the first ones. Under ThreadSanitizer the publisher takes
    # about 16 ms per connection (accept, thread start), so fewer than 100 are ever
    # open at once, the limit of 256 is never reached, and its assertion that the
    # surplus was closed at once cannot hold. It runs under asan.
    skip=(--skip connection_flood_is_bounded_and_recovers)
    ;;
esac
cargo_args=()
while (($#)) && [[ $1 != -- ]]; do
  cargo_args+=("$1")
  shift
done
(($#)) && shift
# The library's crates (unit tests) and every integration test that runs without a GPU
# and goes through our unsafe code: memfd blocks, SCM_RIGHTS, the pool and its recycler,
# publishers and subscribers across processes, DLPack exports to C.
# All packages in one invocation, so that features are unified as in the ordinary
# workspace build and Zenoh is compiled once. (`--lib` also selects zcs-tests' library,
# whose tests check its medium helpers on host memory.)
tests=(
  -p zcs-memory -p zcs-pool -p zcs-wire -p zcs-provider -p zcs-transport -p zenoh-cuda-shm
  -p zenoh-cuda-shm-ros2 -p zcs-tests --lib
  --test ipc_channel --test ipc_hostile --test ipc_process --test ipc_refusal_log --test pool_leaks
  --test control_hostile --test crash_matrix --test drop_order --test provider --test pubsub --test pubsub_fanout
  --test ros2 --test shutdown --test tensor
)
echo "== $mode: RUSTFLAGS=$RUSTFLAGS ${ASAN_OPTIONS:+ASAN_OPTIONS=$ASAN_OPTIONS }${TSAN_OPTIONS:+TSAN_OPTIONS=$TSAN_OPTIONS }CARGO_TARGET_DIR=$CARGO_TARGET_DIR"
exec cargo +nightly test --locked -j "${JOBS:-2}" "${extra[@]}" --target x86_64-unknown-linux-gnu \
  --no-fail-fast "${tests[@]}" "${cargo_args[@]}" -- "${skip[@]}" "$@"
