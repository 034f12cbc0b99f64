#!/usr/bin/env bash
# Builds the Zenoh router our plugin is tested in: stock `zenohd` 1.10.2 and zenoh's REST
# plugin (libzenoh_plugin_rest.so) 1.10.2, both from crates.io, with the zenoh feature
# set our plugin is built with, by this repository's pinned rustc. zenohd loads a plugin
# only if rustc, zenoh version and `zenoh::FEATURES` are all equal (docs/plugin.md).
#
# The result is cached in
#   ${ZCS_TOOLS_CACHE:-$HOME/.cache/zenoh-cuda-shm}/zenohd-<version>-rustc-<release>-<commit>-<features>-<profile>-<recipe>/
#     bin/zenohd  lib/libzenoh_plugin_rest.so  FEATURES  VERSION
# keyed by everything that changes the build, so a second run (or another checkout on
# the same machine) reuses it. The last line printed on stdout is that directory, which
# scripts/test.sh exports as ZCS_ZENOHD_DIR; everything else (progress, cargo's output)
# goes to stderr. `target/zenohd` in this checkout is made a symbolic link to it, so that
# the commands of docs/plugin.md and the search_dirs of zenoh-plugin-cuda-shm/config.json5
# name one fixed path. An interrupted build resumes where it stopped (its cargo target
# dir is kept until the build succeeds).
#
# Profile: debug (`cargo install --debug`, no debug info), the cheapest honest build:
# the compatibility check does not look at the profile, and the tests only need a
# working router. ZCS_ZENOHD_PROFILE=release builds optimised binaries (for deployment).
set -euo pipefail
cd "$(dirname "$0")/.."

zenoh_version=1.10.2
# Features of the zenoh crate beyond those zenohd and the REST plugin always enable
# (internal, plugins, unstable; runtime_plugins for zenohd): the transports the
# workspace's zenoh dependency enables (Cargo.toml). zenoh::FEATURES then reads
# EXPECTED_ZENOH_FEATURES in zenoh-plugin-cuda-shm/src/lib.rs, which a unit test there
# asserts for the plugin, and this script checks for the router below.
zenoh_features=(transport_tcp transport_unixsock-stream)
expected_features=" zenoh/transport_tcp zenoh/transport_unixsock-stream zenoh/unstable"
# Bump when the build commands below change in a way that changes the binaries.
recipe_version=1
profile=${ZCS_ZENOHD_PROFILE:-debug}
jobs=${ZCS_ZENOHD_JOBS:-2}

case "$profile" in
  debug) install_profile=(--debug); rest_profile=(); outdir=debug ;;
  release) install_profile=(); rest_profile=(--release); outdir=release ;;
  *) echo "zenohd.sh: ZCS_ZENOHD_PROFILE must be debug or release, not '$profile'" >&2; exit 2 ;;
esac

# rustc as this repository's rust-toolchain.toml selects it (we run from its root).
rustc_release=$(rustc -vV | sed -n 's/^release: //p')
rustc_commit=$(rustc -vV | sed -n 's/^commit-hash: //p')
if [ -z "$rustc_release" ] || [ -z "$rustc_commit" ]; then
  echo "zenohd.sh: cannot read rustc's release and commit from 'rustc -vV'" >&2
  exit 1
fi
recipe=$( (echo "$recipe_version"; cat scripts/zenohd-rest/Cargo.toml scripts/zenohd-rest/Cargo.lock) | sha256sum | cut -c1-12)
feature_slug=$(IFS=+; echo "${zenoh_features[*]}")
key="zenohd-${zenoh_version}-rustc-${rustc_release}-${rustc_commit:0:9}-${feature_slug}-${profile}-${recipe}"
cache=${ZCS_TOOLS_CACHE:-$HOME/.cache/zenoh-cuda-shm}
mkdir -p "$cache"
# Absolute, so that the target/zenohd link resolves from anywhere.
cache=$(cd "$cache" && pwd)
dir="$cache/$key"

# One build at a time per cache: a second caller waits, then finds the result.
exec 9>"$cache/.lock"
flock 9

# Points target/zenohd at the result. Replaced with a rename, so a reader never finds
# the link missing.
link_result() {
  mkdir -p target
  ln -sfn "$dir" target/zenohd.new
  mv -fT target/zenohd.new target/zenohd
  echo "zenohd.sh: target/zenohd -> $dir" >&2
}

if [ -f "$dir/FEATURES" ] && [ -x "$dir/bin/zenohd" ] && [ -f "$dir/lib/libzenoh_plugin_rest.so" ]; then
  echo "zenohd.sh: cached: $dir" >&2
  link_result
  echo "$dir"
  exit 0
fi

work="$cache/.build-$key"
rm -rf "$dir" "$work/out"
mkdir -p "$work/out/bin" "$work/out/lib"
# Both builds share one target dir and profile; crates they have in common with equal
# features are compiled once. No debug info: smaller, and faster to link.
export CARGO_TARGET_DIR="$work/target" CARGO_PROFILE_DEV_DEBUG=false CARGO_PROFILE_RELEASE_DEBUG=false
cargo_features=$(printf 'zenoh/%s,' "${zenoh_features[@]}")
cargo_features=${cargo_features%,}

# One line per step, between cargo's own output: the first run takes many minutes
# (docs/plugin.md has figures), later runs print only the cached directory.
step() {
  echo "zenohd.sh: [$1/3] $2" >&2
}
took() {
  echo "zenohd.sh: [$1/3] done in $(((SECONDS - $2) / 60)) min $(((SECONDS - $2) % 60)) s" >&2
}

echo "zenohd.sh: no cached build for this rustc and feature set; building zenohd $zenoh_version and its REST plugin ($profile) into $dir" >&2
echo "zenohd.sh: this takes minutes (4 to 15 on 2 cores), once per machine; an interrupted build resumes" >&2
start=$SECONDS
step 1 "zenohd $zenoh_version from crates.io (cargo install, $cargo_features)"
# --locked: the Cargo.lock zenohd 1.10.2 was published with. --no-default-features drops
# zenohd's `zenoh/default` (every transport, auth_*), which would change zenoh::FEATURES.
# cargo warns that the install root's bin/ is not on PATH; that folder is only a staging
# area (moved to $dir below), so it is put on cargo's PATH, which is what the warning
# checks, rather than telling the user to add a folder that will not exist.
PATH="$work/out/bin:$PATH" cargo install --locked --no-track --force -j "$jobs" "${install_profile[@]}" \
  --root "$work/out" --no-default-features --features "$cargo_features" \
  "zenohd@$zenoh_version" >&2
zenohd_s=$((SECONDS - start))
took 1 "$start"

start=$SECONDS
step 2 "libzenoh_plugin_rest.so $zenoh_version from crates.io (scripts/zenohd-rest, $cargo_features)"
(cd scripts/zenohd-rest && cargo build --locked -j "$jobs" "${rest_profile[@]}" --features "$cargo_features") >&2
rest_s=$((SECONDS - start))
took 2 "$start"
# Built as a dependency, the cdylib keeps its hashed name in deps/.
shopt -s nullglob
rest_so=("$CARGO_TARGET_DIR/$outdir/deps/"libzenoh_plugin_rest-*.so)
shopt -u nullglob
if [ "${#rest_so[@]}" -ne 1 ]; then
  echo "zenohd.sh: expected one libzenoh_plugin_rest-*.so in $CARGO_TARGET_DIR/$outdir/deps, found ${#rest_so[@]}" >&2
  exit 1
fi
cp "${rest_so[0]}" "$work/out/lib/libzenoh_plugin_rest.so"

step 3 "checking that the new zenohd loads the REST plugin with the expected zenoh features"
# Check the pair against the feature string our plugin is built with: start the router
# with the REST plugin required and read the compatibility record the loader logs. The
# router accepted the plugin, so the record is also the router's own.
probe_log="$work/probe.log"
RUST_LOG=zenoh_plugin_trait=debug,zenoh::api::loader=info "$work/out/bin/zenohd" \
  --no-multicast-scouting -l tcp/127.0.0.1:0 --plugin-search-dir "$work/out/lib" \
  --rest-http-port 127.0.0.1:0 >"$probe_log" 2>&1 &
probe=$!
for _ in $(seq 300); do
  if grep -q 'Successfully started plugin rest' "$probe_log" || ! kill -0 "$probe" 2>/dev/null; then break; fi
  sleep 0.1
done
kill "$probe" 2>/dev/null || true
wait "$probe" 2>/dev/null || true
record=$(grep -o 'zenoh_features: "[^"]*"' "$probe_log" | head -n1 | sed 's/^zenoh_features: "//; s/"$//') || true
if ! grep -q 'Successfully started plugin rest' "$probe_log" || [ "$record" != "$expected_features" ]; then
  echo "zenohd.sh: the REST plugin did not load into the new zenohd with the expected zenoh features" >&2
  echo "  expected: '$expected_features'" >&2
  echo "  recorded: '$record'" >&2
  tail -n 40 "$probe_log" >&2
  exit 1
fi
echo "$record" >"$work/out/FEATURES"
RUST_LOG=off "$work/out/bin/zenohd" --version >"$work/out/VERSION"
echo "zenohd.sh: $(cat "$work/out/VERSION"); zenoh::FEATURES '$record'" >&2
echo "zenohd.sh: built in zenohd ${zenohd_s}s + REST plugin ${rest_s}s" >&2

mv "$work/out" "$dir"
rm -rf "$work"
link_result
echo "$dir"
