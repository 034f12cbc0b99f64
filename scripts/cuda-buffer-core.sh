#!/usr/bin/env bash
# Builds ROS 2's CUDA buffer backend's core library (the `cuda_buffer` package of
# ros2/rosidl_buffer_backends) from its released sources, without ROS: CUDA's headers and
# runtime and ROS's rcutils / rmw come from PyPI wheels. Our tests then run against that
# code instead of against our reading of it (docs/cuda-buffer-backend.md).
#
#   scripts/cuda-buffer-core.sh --src DIR [--rosidl DIR] [--out DIR]
#
# --src DIR     a source tree of rosidl_buffer_backends 0.1.1 or 0.1.2 (its `cuda_buffer`
#               package is the same in both): the repository, or its `cuda_buffer`
#               folder. Default: $ZCS_CUDA_BUFFER_SRC.
# --rosidl DIR  a source tree of ros2/rosidl with the header-only `rosidl_buffer` (5.3.x,
#               Lyrical / Rolling), needed by everything but the registry. Default:
#               $ZCS_ROSIDL_SRC; without it only hem_peer is built.
# --out DIR     where to build (default target/cuda-buffer-core); a second run with the
#               same sources rebuilds nothing.
#
# It builds, in <out>/bin, with the libraries they need in <out>/lib (so that <out> can
# be carried to another machine):
#   hem_peer   the host endpoint registry (src/host_endpoint_manager.cpp) behind the
#              command loop of tests/rosidl_cuda/hem_peer.cpp; runs without a GPU;
#   core_peer  the whole library (pool, IPC manager, buffers and their events) behind
#              tests/rosidl_cuda/core_peer.cpp, a publisher; needs a GPU to run.
# and prints <out> on stdout (progress goes to stderr). Tests find them through
# ZCS_CUDA_BUFFER_CORE=<out> (tests/tests/rosidl_registry_theirs.rs,
# tests/tests/gpu_rosidl_cuda_theirs.rs); scripts/test.sh and scripts/gpu-build.sh build
# them when ZCS_CUDA_BUFFER_SRC is set. Needs g++, nm, python3 and PyPI.
set -euo pipefail
exec 3>&1 1>&2
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${ZCS_CUDA_BUFFER_SRC:-}"
rosidl="${ZCS_ROSIDL_SRC:-}"
out="$root/target/cuda-buffer-core"
while [ $# -gt 0 ]; do
    case "$1" in
        --src) src="$2"; shift 2 ;;
        --rosidl) rosidl="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
    *) echo "cuda-buffer-core.sh: cuda_buffer $version: the peers were written from 0.1.1 / 0.1.2" >&2; exit 2 ;;
esac
rosidl_inc=""
if [ -n "$rosidl" ]; then
    for d in "$rosidl/rosidl_buffer/include" "$rosidl/include"; do
        if [ -f "$d/rosidl_buffer/buffer.hpp" ]; then rosidl_inc="$(cd "$d" && pwd)"; break; fi
    done
    [ -n "$rosidl_inc" ] || { echo "cuda-buffer-core.sh: no rosidl_buffer/include/rosidl_buffer/buffer.hpp in $rosidl" >&2; exit 2; }
fi
mkdir -p "$out/bin" "$out/lib"
out="$(cd "$out" && pwd)"

# Wheels: CUDA 13.0 (the driver of our GPU machines is 580: CUDA 13.0), and rcutils /
# rmw of Jazzy (the registry's header needs rmw_gid_t; all sources log with rcutils).
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
cp -L "$venv/lib/librcutils.so" "$out/lib/"
includes=(-I"$pkg/include" -I"$cuda/include")
for d in "$venv"/include/*/; do includes+=(-I"$d"); done
# The CUDA runtime linked statically; rcutils from <out>/lib.
libs=(-L"$out/lib" -lrcutils -L"$cuda/lib" -lcudart_static -ldl -lrt -pthread -Wl,-rpath,'$ORIGIN/../lib')
cxx=(g++ -std=c++17 -O1 -Wall -Wextra)
fingerprint() { sha256sum "$@" | sha256sum | cut -c1-16; }

# build NAME STAMP COMMAND...: runs COMMAND unless <out>/bin/NAME was built from STAMP.
build() {
    local name="$1" stamp="$2"
    shift 2
    if [ "$(cat "$out/bin/$name.built-from" 2>/dev/null)" = "$stamp" ] && [ -x "$out/bin/$name" ]; then return; fi
    echo "==> $name (cuda_buffer $version)"
    local t0
    t0=$(date +%s)
    "$@"
    echo "$stamp" >"$out/bin/$name.built-from"
    echo "<== $name: $(($(date +%s) - t0)) s"
}

build hem_peer "cuda_buffer $version $(cd "$pkg" && fingerprint src/host_endpoint_manager.cpp include/cuda_buffer/*.hpp) $(fingerprint "$root/tests/rosidl_cuda/hem_peer.cpp")" \
    "${cxx[@]}" "${includes[@]}" -o "$out/bin/hem_peer" \
    "$pkg/src/host_endpoint_manager.cpp" "$root/tests/rosidl_cuda/hem_peer.cpp" "${libs[@]}"

if [ -n "$rosidl_inc" ]; then
    core_peer() {
        local obj="$out/obj"
        rm -rf "$obj" && mkdir -p "$obj"
        for f in "$pkg"/src/*.cpp "$root/tests/rosidl_cuda/core_peer.cpp"; do
            "${cxx[@]}" "${includes[@]}" -I"$rosidl_inc" -c "$f" -o "$obj/$(basename "$f" .cpp).o"
        done
        # The driver library is the GPU machine's; a stand-in with its functions' names
        # (those the objects call, from nm) lets the link resolve them. It is never
        # shipped or loaded: at run time libcuda.so.1 is the driver's.
        local stub="$out/stub"
        mkdir -p "$stub"
        nm -u "$obj"/*.o | awk '$2 ~ /^cu[A-Z]/ {print $2}' | sort -u \
            | sed 's/.*/void &(void) {}/' >"$stub/libcuda.c"
        gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so" "$stub/libcuda.c"
        "${cxx[@]}" -o "$out/bin/core_peer" "$obj"/*.o -L"$stub" -lcuda "${libs[@]}"
    }
    build core_peer "cuda_buffer $version $(cd "$pkg" && fingerprint src/*.cpp include/cuda_buffer/*.hpp) rosidl $(fingerprint "$rosidl_inc"/rosidl_buffer/*) $(fingerprint "$root/tests/rosidl_cuda/core_peer.cpp")" \
        core_peer
else
    rm -f "$out/bin/core_peer" "$out/bin/core_peer.built-from"
    echo "(no rosidl_buffer sources: core_peer not built; see --rosidl)"
fi
echo "cuda_buffer $version from $pkg" >"$out/SOURCE"
echo "cuda_buffer $version from $pkg: ZCS_CUDA_BUFFER_CORE=$out"
echo "$out" >&3
