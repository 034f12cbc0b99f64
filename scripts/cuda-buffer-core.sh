#!/usr/bin/env bash
# Builds parts of ROS 2's CUDA buffer backend (the `cuda_buffer` package of
# ros2/rosidl_buffer_backends) from its released sources, without ROS: CUDA's headers and
# runtime and ROS's rcutils / rmw come from PyPI wheels. Our tests then run against that
# code instead of against our reading of it (docs/cuda-buffer-backend.md).
#
#   scripts/cuda-buffer-core.sh --src DIR [--out DIR]
#
# --src DIR  a source tree of rosidl_buffer_backends 0.1.1 or 0.1.2 (its `cuda_buffer`
#            package is the same in both): the repository, or its `cuda_buffer` folder.
#            Default: $ZCS_CUDA_BUFFER_SRC.
# --out DIR  where to build (default target/cuda-buffer-core); a second run with the
#            same sources rebuilds nothing.
#
# It builds <out>/bin/hem_peer: the backend's host endpoint registry
# (src/host_endpoint_manager.cpp) behind the command loop of
# tests/rosidl_cuda/hem_peer.cpp, and prints <out> on stdout (progress goes to stderr).
# Tests find it through ZCS_CUDA_BUFFER_CORE=<out> (tests/tests/rosidl_registry_theirs.rs);
# scripts/test.sh builds it when ZCS_CUDA_BUFFER_SRC is set. Needs g++, python3 and PyPI.
set -euo pipefail
exec 3>&1 1>&2
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${ZCS_CUDA_BUFFER_SRC:-}"
out="$root/target/cuda-buffer-core"
while [ $# -gt 0 ]; do
    case "$1" in
        --src) src="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "cuda-buffer-core.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$src" ]; then
    echo "cuda-buffer-core.sh: name the backend's sources with --src DIR or ZCS_CUDA_BUFFER_SRC" >&2
    exit 2
fi
pkg=""
for d in "$src" "$src/cuda_buffer" "$src/cuda_buffer_backend/cuda_buffer"; do
    if [ -f "$d/src/host_endpoint_manager.cpp" ] && [ -f "$d/package.xml" ]; then pkg="$(cd "$d" && pwd)"; break; fi
done
if [ -z "$pkg" ]; then
    echo "cuda-buffer-core.sh: no cuda_buffer package (src/host_endpoint_manager.cpp, package.xml) in $src" >&2
    exit 2
fi
version="$(sed -n 's:.*<version>\(.*\)</version>.*:\1:p' "$pkg/package.xml" | head -1)"
case "$version" in
    0.1.1|0.1.2) ;;
    *) echo "cuda-buffer-core.sh: cuda_buffer $version: these tests were written from 0.1.1 / 0.1.2" >&2; exit 2 ;;
esac
mkdir -p "$out/bin"
out="$(cd "$out" && pwd)"

# Wheels: CUDA 13.0 (the driver of our GPU machines is 580: CUDA 13.0), and rcutils /
# rmw of Jazzy (the registry's headers need rmw_gid_t; their logging macros rcutils).
wheels=("nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" "ros-jazzy-rcutils" "ros-jazzy-rmw")
venv="$out/venv"
if [ "$(cat "$venv/wheels" 2>/dev/null)" != "${wheels[*]}" ]; then
    echo "==> wheels: ${wheels[*]}"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "${wheels[@]}"
    echo "${wheels[*]}" >"$venv/wheels"
fi
cuda="$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)"
[ -f "$cuda/include/cuda_runtime.h" ] || { echo "cuda-buffer-core.sh: no cuda_runtime.h under $cuda" >&2; exit 1; }
includes=(-I"$pkg/include" -I"$cuda/include")
for d in "$venv"/include/*/; do includes+=(-I"$d"); done
libs=(-L"$venv/lib" -lrcutils -L"$cuda/lib" -l:libcudart.so.13 -lrt -pthread
      -Wl,-rpath,"$venv/lib" -Wl,-rpath,"$cuda/lib")

# What was built from what, so that a changed source or peer rebuilds.
stamp="cuda_buffer $version $(cd "$pkg" && sha256sum src/host_endpoint_manager.cpp include/cuda_buffer/host_endpoint_manager.hpp | sha256sum | cut -c1-16) peer $(sha256sum "$root/tests/rosidl_cuda/hem_peer.cpp" | cut -c1-16)"
if [ "$(cat "$out/bin/hem_peer.built-from" 2>/dev/null)" != "$stamp" ] || [ ! -x "$out/bin/hem_peer" ]; then
    echo "==> hem_peer (cuda_buffer $version: host_endpoint_manager.cpp)"
    t0=$(date +%s)
    g++ -std=c++17 -O1 -Wall -Wextra "${includes[@]}" -o "$out/bin/hem_peer" \
        "$pkg/src/host_endpoint_manager.cpp" "$root/tests/rosidl_cuda/hem_peer.cpp" "${libs[@]}"
    echo "$stamp" >"$out/bin/hem_peer.built-from"
    echo "<== hem_peer: $(($(date +%s) - t0)) s"
fi
echo "$stamp" >"$out/SOURCE"
echo "cuda_buffer $version from $pkg: ZCS_CUDA_BUFFER_CORE=$out"
echo "$out" >&3
