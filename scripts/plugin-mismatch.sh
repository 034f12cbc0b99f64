#!/usr/bin/env bash
# Builds zenoh-plugin-cuda-shm with one zenoh feature more than zenohd and the plugin
# have (auth_usrpwd), so that its zenoh::FEATURES differs: what tests/tests/plugin.rs
# loads into zenohd to check that a mismatched plugin is refused with zenoh's message,
# not a crash. Prints the library's absolute path as the last line of stdout (everything
# else goes to stderr); scripts/test.sh exports it as ZCS_MISMATCH_PLUGIN.
#
# It builds in its own target dir, target/plugin-mismatch: the plugin's cdylib has no
# hash in its file name, so built in target/debug it would replace the real one. To
# compile only what the feature changes (zenoh-transport, zenoh and the crates above
# them), that dir is first refreshed with hard links to target/debug's compiled crates:
# run this right after the workspace is built (scripts/test.sh does), not while a build
# runs in target/debug.
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/plugin-mismatch
mkdir -p "$out/debug"
if [ -d target/debug/deps ]; then
  for d in deps build .fingerprint; do
    if [ -d "target/debug/$d" ]; then
      mkdir -p "$out/debug/$d"
      cp -al --remove-destination "target/debug/$d/." "$out/debug/$d/"
    fi
  done
  # Never share the plugin's own unhashed outputs with target/debug: a link to the real
  # library would be overwritten in place by the mismatched one.
  rm -f "$out/debug/deps/"*zenoh_plugin_cuda_shm*
fi

start=$SECONDS
cargo build --locked -p zenoh-plugin-cuda-shm --lib --features zenoh/auth_usrpwd --target-dir "$out" >&2
so="$PWD/$out/debug/libzenoh_plugin_cuda_shm.so"
if [ ! -f "$so" ]; then
  echo "plugin-mismatch.sh: the build produced no $so" >&2
  exit 1
fi
echo "plugin-mismatch.sh: built in $((SECONDS - start))s: $so" >&2
echo "$so"
