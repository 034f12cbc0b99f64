#!/usr/bin/env bash
# Installs zenoh-cuda-shm's C ABI under PREFIX: the header, the shared and static
# libraries, a CMake package (find_package(zenoh_cuda_shm)) and a pkg-config file.
#
#   scripts/c-install.sh PREFIX                  # builds with cargo (release) first
#   scripts/c-install.sh --from LIBDIR PREFIX    # lays out libraries already built in LIBDIR
set -euo pipefail
cd "$(dirname "$0")/.."
libdir=
if [ "${1:-}" = --from ]; then
  libdir=$2
  shift 2
fi
prefix=${1:?usage: scripts/c-install.sh [--from LIBDIR] PREFIX}
if [ -z "$libdir" ]; then
  cargo build --release --locked -p zenoh-cuda-shm-c
  libdir=target/release
fi
mkdir -p "$prefix/include" "$prefix/lib/cmake/zenoh_cuda_shm" "$prefix/lib/pkgconfig"
prefix=$(cd "$prefix" && pwd)
cp zenoh-cuda-shm-c/include/zenoh_cuda_shm.h zenoh-cuda-shm-c/include/zenoh_cuda_shm.hpp "$prefix/include/"
cp "$libdir/libzenoh_cuda_shm_c.so" "$prefix/lib/"
[ -f "$libdir/libzenoh_cuda_shm_c.a" ] && cp "$libdir/libzenoh_cuda_shm_c.a" "$prefix/lib/"
cp zenoh-cuda-shm-c/cmake/zenoh_cuda_shmConfig.cmake "$prefix/lib/cmake/zenoh_cuda_shm/"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" zenoh-cuda-shm-c/cmake/zenoh_cuda_shm.pc.in \
  >"$prefix/lib/pkgconfig/zenoh_cuda_shm.pc"
echo "installed under $prefix"
