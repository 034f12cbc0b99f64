#!/usr/bin/env bash
# Builds a real ROS 2 peer (rclpy on rmw_zenoh_cpp) for the tests in tests/ros2_real/.
# Run with -h for what it does and its options.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/ros2-real.sh <jazzy|kilted> [--src DIR] [--cache DIR] [--env-file FILE]

Builds, once per version, what a process needs to run rclpy on the real rmw_zenoh_cpp:
  1. Debian packages (cmake, g++, nlohmann-json3-dev, python3-venv), only those missing;
  2. a Python venv with the distro's rclpy wheels from PyPI (+ sensor_msgs, std_msgs,
     the build dependencies of rmw_zenoh_cpp), then what the tests use (pytest,
     pytest-timeout, numpy, eclipse-zenoh);
  3. zenoh-c (shared-memory, unstable API, serial transport, as rmw_zenoh vendors it),
     against the zenoh sources it pins, without fat LTO; one build serves both distros;
  4. zenoh-cpp (headers and CMake package);
  5. rmw_zenoh_cpp and rmw_zenohd of the distro's rmw_zenoh release
     (jazzy: 0.2.10, kilted: 0.6.7), against the venv's ROS packages.
It prints each step and how long it took; a step whose inputs did not change is skipped,
so a second run builds nothing. At the end it writes <cache>/env.sh: source it (or pass
`env $(cat <cache>/env.list)`) to run rclpy on rmw_zenoh; rmw_zenohd is <cache>/bin/rmw_zenohd.

Sources (released archives, or the same trees unpacked), looked for in this order:
  --src DIR  or  ROS2_REAL_SRC=DIR   a folder holding
        rmw_zenoh-0.2.10.tar.xz / rmw_zenoh-0.6.7.tar.xz, zenoh-c-05bd370.tar.xz,
        zenoh-cpp-af381b4.tar.xz, zenoh-2687c51.tar.xz (or folders of those names)
  ../shared/thirdparty beside the repository root (the default)

Cache (outside the checkout):
  --cache DIR  or  ROS2_REAL_CACHE=DIR   (default: ${XDG_CACHE_HOME:-$HOME/.cache}/zenoh-cuda-shm/ros2-real)
  <cache>/<distro>-<rmw_zenoh version>/   the venv, rmw_zenoh build and install, env.sh
  <cache>/zenoh-c-<commit>/               zenoh-c and zenoh-cpp, shared by both distros
  ROS2_REAL_DIR=DIR overrides the per-distro folder alone.

Other environment:
  ROS2_REAL_JOBS=N     parallel build jobs (default: nproc)
  ROS2_REAL_PYTHON=P   the Python that makes the venv (default: python3; the wheels are cp311)
  ROS2_REAL_RUST_TOOLCHAIN=T  the rustup toolchain that builds zenoh-c (default: stable;
                       zenoh-c pins one that may not be installed, and needs Rust >= 1.88)
  --env-file FILE      also write the environment (KEY=VALUE lines) to FILE
EOF
}

distro=""
src="${ROS2_REAL_SRC:-}"
cache="${ROS2_REAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zenoh-cuda-shm/ros2-real}"
env_file=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --src) src="$2"; shift 2 ;;
        --src=*) src="${1#--src=}"; shift ;;
        --cache) cache="$2"; shift 2 ;;
        --cache=*) cache="${1#--cache=}"; shift ;;
        --env-file) env_file="$2"; shift 2 ;;
        --env-file=*) env_file="${1#--env-file=}"; shift ;;
        jazzy|kilted) distro="$1"; shift ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
[ -n "$distro" ] || { usage >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
[ -n "$src" ] || src="$root/../shared/thirdparty"
src="$(cd "$src" && pwd)" || { echo "no source folder $src" >&2; exit 1; }

ZENOH_C=zenoh-c-05bd370
ZENOH_CPP=zenoh-cpp-af381b4
ZENOH=zenoh-2687c51
case "$distro" in
    jazzy) RMW_VERSION=0.2.10; RCLPY_VERSION=7.1.6 ;;
    kilted) RMW_VERSION=0.6.7; RCLPY_VERSION=9.1.2 ;;
esac
RMW=rmw_zenoh-$RMW_VERSION
for name in $ZENOH_C $ZENOH_CPP $ZENOH $RMW; do
    [ -f "$src/$name.tar.xz" ] || [ -d "$src/$name" ] || {
        echo "missing $src/$name.tar.xz (or the folder $src/$name): see --help" >&2
        exit 1
    }
done
jobs="${ROS2_REAL_JOBS:-$(nproc)}"
python="${ROS2_REAL_PYTHON:-python3}"

mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
zdir="$cache/$ZENOH_C"                       # shared by both distros
ddir="${ROS2_REAL_DIR:-$cache/$distro-$RMW_VERSION}"
mkdir -p "$zdir" "$ddir"
venv="$ddir/venv"
# One run at a time per distro, and one build of the shared zenoh-c at a time.
exec 9>"$ddir/.lock"
flock 9

total_start=$(date +%s)
declare -a summary=()

# A fingerprint of a source (archive or folder): what a cached step was built from.
fingerprint() {
    local name="$1"
    if [ -f "$src/$name.tar.xz" ]; then
        sha256sum "$src/$name.tar.xz" | cut -d' ' -f1
    elif [ -d "$src/$name" ]; then
        # A folder: its file list and contents (cheap for these sizes).
        (cd "$src/$name" && find . -type f ! -path './target/*' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
    else
        echo "missing $src/$name.tar.xz (or the folder $src/$name)" >&2
        return 1
    fi
}

# Unpacks (or copies) a source into $2/$1, fresh.
unpack() {
    local name="$1" into="$2"
    rm -rf "${into:?}/$name"
    mkdir -p "$into"
    if [ -f "$src/$name.tar.xz" ]; then
        tar -xJf "$src/$name.tar.xz" -C "$into"
    else
        cp -a "$src/$name" "$into/$name"
    fi
}

# step NAME STAMP KEY FUNCTION: runs FUNCTION unless STAMP holds KEY; prints the time.
step() {
    local name="$1" stamp="$2" key="$3" fn="$4"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
        echo "==> $name: cached"
        summary+=("$(printf '%-28s cached' "$name")")
        return 0
    fi
    echo "==> $name: building"
    rm -f "$stamp"
    local t0 t1
    t0=$(date +%s)
    "$fn"
    t1=$(date +%s)
    echo "$key" >"$stamp"
    echo "<== $name: $((t1 - t0)) s"
    summary+=("$(printf '%-28s %4d s' "$name" $((t1 - t0)))")
}

# --- 1. Debian packages -----------------------------------------------------------
debian() {
    local missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v g++ >/dev/null || missing+=(g++)
    command -v make >/dev/null || missing+=(make)
    command -v xz >/dev/null || missing+=(xz-utils)
    command -v pkg-config >/dev/null || missing+=(pkg-config)
    [ -f /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ] ||
        [ -f /usr/lib/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ] || missing+=(nlohmann-json3-dev)
    "$python" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing ${missing[*]}"
        if [ "$(id -u)" != 0 ]; then
            echo "missing Debian packages (${missing[*]}) and not root: install them first" >&2
            exit 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "all present"
    fi
}
t0=$(date +%s)
echo "==> debian packages"
debian
summary+=("$(printf '%-28s %4d s' "debian packages" $(($(date +%s) - t0)))")

# --- 2. Python venv with the distro's wheels --------------------------------------
pip_packages() {
    local d="ros-$distro"
    echo "$d-rclpy==$RCLPY_VERSION $d-rmw-fastrtps-cpp $d-sensor-msgs $d-std-msgs $d-rmw $d-rcl $d-rcutils $d-rcpputils" \
        "$d-fastcdr $d-rosidl-typesupport-fastrtps-c $d-rosidl-typesupport-fastrtps-cpp $d-tracetools" \
        "$d-ament-cmake $d-ament-index-cpp $d-ament-package $d-ament-cmake-include-directories" \
        "$d-ament-cmake-libraries $d-ament-cmake-export-libraries catkin_pkg"
    [ "$distro" = kilted ] && echo "$d-rmw-test-fixture"
    return 0
}
# What tests/ros2_real needs besides (not part of what rmw_zenoh is built against).
TEST_PACKAGES="pytest pytest-timeout numpy eclipse-zenoh==1.10.2"
make_venv() {
    rm -rf "$venv"
    "$python" -m venv "$venv"
    # shellcheck disable=SC2046
    "$venv/bin/pip" install -q $(pip_packages)
    "$venv/bin/pip" freeze >"$ddir/pip-freeze.txt"
    echo "$(wc -l <"$ddir/pip-freeze.txt") Python packages (list: $ddir/pip-freeze.txt)"
}
step "venv ($distro rclpy $RCLPY_VERSION)" "$ddir/.stamp-venv" "$("$python" --version 2>&1) $(pip_packages | tr '\n' ' ')" make_venv
test_packages() {
    # shellcheck disable=SC2086
    "$venv/bin/pip" install -q $TEST_PACKAGES
    "$venv/bin/pip" freeze >"$ddir/pip-freeze.txt"
}
step "venv: test packages" "$ddir/.stamp-test-packages" "$(cat "$ddir/.stamp-venv") $TEST_PACKAGES" test_packages

# --- 3. zenoh-c -------------------------------------------------------------------
zenoh_c_key="$(fingerprint $ZENOH_C) $(fingerprint $ZENOH) lto=off cgu=16 shm,unstable,serial"
build_zenoh_c() {
    local work="$zdir/src"
    unpack $ZENOH "$work"
    unpack $ZENOH_C "$work"
    # zenoh-c takes zenoh by git; point every such dependency at the unpacked zenoh,
    # in the main manifest and in the opaque-types one (built --offline by build.rs).
    "$python" - "$work/$ZENOH" "$work/$ZENOH_C/Cargo.toml.in" "$work/$ZENOH_C/build-resources/opaque-types/Cargo.toml" <<'PY'
import pathlib, re, sys, tomllib
zenoh = pathlib.Path(sys.argv[1])
crates = {}
for manifest in zenoh.rglob("Cargo.toml"):
    name = tomllib.loads(manifest.read_text()).get("package", {}).get("name")
    if name:
        crates[name] = manifest.parent
git = re.compile(r'^(\s*(?:@\w+@)?)([\w-]+)(\s*=\s*\{.*?)git\s*=\s*"https://github.com/eclipse-zenoh/zenoh(?:\.git)?"\s*,\s*branch\s*=\s*"[^"]*"', re.M)
for f in map(pathlib.Path, sys.argv[2:]):
    text, n = git.subn(lambda m: f'{m.group(1)}{m.group(2)}{m.group(3)}path = "{crates[m.group(2)]}"', f.read_text())
    left = text.count("eclipse-zenoh/zenoh.git")
    if n == 0 or left:
        sys.exit(f"{f}: {n} dependencies rewritten, {left} left by git")
    f.write_text(text)
    print(f"{f.name}: {n} zenoh dependencies now by path")
PY
    local b="$zdir/build"
    mkdir -p "$b"
    # The pinned toolchain cannot be installed offline; release without fat LTO, 16 units.
    (
        export RUSTUP_TOOLCHAIN="${ROS2_REAL_RUST_TOOLCHAIN:-stable}"
        export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
        export CARGO_BUILD_JOBS="$jobs"
        unset CARGO_TARGET_DIR
        cmake -S "$work/$ZENOH_C" -B "$b" -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_INSTALL_PREFIX="$zdir/install" \
            "-DZENOHC_CARGO_FLAGS=--features=shared-memory zenoh/transport_serial" \
            -DZENOHC_BUILD_WITH_UNSTABLE_API=TRUE -DZENOHC_BUILD_TESTS_WITH_CXX=FALSE >"$zdir/cmake-configure.log"
        cmake --build "$b" --config Release -j "$jobs" 2>&1 | tee "$zdir/build.log" | grep -E '^\s*(Compiling zenoh|Finished|error)' || true
        [ "${PIPESTATUS[0]}" = 0 ] || { echo "zenoh-c build failed: $zdir/build.log" >&2; exit 1; }
        cmake --install "$b" --config Release >/dev/null
    )
    # The sources and the build tree are not needed once installed (the stamp says
    # this step is done).
    rm -rf "$b" "$work"
}
exec 8>"$zdir/.lock"
flock 8
step "zenoh-c ${ZENOH_C#zenoh-c-}" "$zdir/.stamp-zenoh-c" "$zenoh_c_key" build_zenoh_c

# --- 4. zenoh-cpp -----------------------------------------------------------------
build_zenoh_cpp() {
    local work="$zdir/src"
    unpack $ZENOH_CPP "$work"
    cmake -S "$work/$ZENOH_CPP" -B "$zdir/build-cpp" -DCMAKE_INSTALL_PREFIX="$zdir/install" \
        -DZENOHCXX_ZENOHC=OFF -DZENOHCXX_ENABLE_TESTS=OFF -DZENOHCXX_ENABLE_EXAMPLES=OFF >/dev/null
    cmake --install "$zdir/build-cpp" >/dev/null
    rm -rf "$work" "$zdir/build-cpp"
}
step "zenoh-cpp ${ZENOH_CPP#zenoh-cpp-}" "$zdir/.stamp-zenoh-cpp" "$(fingerprint $ZENOH_CPP) $zenoh_c_key" build_zenoh_cpp
flock -u 8

# --- 5. rmw_zenoh_cpp and rmw_zenohd ----------------------------------------------
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
build_rmw() {
    local work="$ddir/src" prefix="$ddir/install" shim="$ddir/shim"
    unpack $RMW "$work"
    # The vendor package downloads zenoh-c and zenoh-cpp: stand in for it with a package
    # that finds the ones built above.
    mkdir -p "$shim/share/zenoh_cpp_vendor/cmake"
    cat >"$shim/share/zenoh_cpp_vendor/cmake/zenoh_cpp_vendorConfig.cmake" <<EOF
# Finds the zenoh-c and zenoh-cpp installed under $zdir/install.
list(APPEND CMAKE_PREFIX_PATH "$zdir/install")
find_package(zenohc REQUIRED)
find_package(zenohcxx REQUIRED)
set(zenoh_cpp_vendor_FOUND TRUE)
EOF
    # The wheels ship liblttng-ust under a hashed name: give the linker its plain one.
    local lttng
    lttng="$(find "$site" -name 'liblttng-ust-*.so*' ! -name '*ctl*' ! -name '*common*' ! -name '*tracepoint*' | head -n1)"
    mkdir -p "$shim/lib"
    [ -n "$lttng" ] && ln -sf "$lttng" "$shim/lib/liblttng-ust.so"
    local prefixes
    prefixes="$shim;$zdir/install;$(ros_prefixes)"
    cmake -S "$work/$RMW/rmw_zenoh_cpp" -B "$ddir/build" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_PREFIX_PATH="$prefixes" -DBUILD_TESTING=OFF \
        -DPython3_EXECUTABLE="$venv/bin/python" -DCMAKE_LIBRARY_PATH="$shim/lib" \
        "-DCMAKE_SHARED_LINKER_FLAGS=-L$shim/lib -Wl,--as-needed" "-DCMAKE_EXE_LINKER_FLAGS=-L$shim/lib -Wl,--as-needed" \
        >"$ddir/cmake-configure.log" 2>&1 || { tail -n 40 "$ddir/cmake-configure.log" >&2; exit 1; }
    cmake --build "$ddir/build" -j "$jobs" >"$ddir/build.log" 2>&1 || { tail -n 40 "$ddir/build.log" >&2; exit 1; }
    cmake --install "$ddir/build" >/dev/null
    rm -rf "$work" "$ddir/build"
}
# Where the wheels install ament prefixes (each has share/<pkg>/cmake).
ros_prefixes() {
    "$venv/bin/python" - <<'PY'
import pathlib, sys, sysconfig
roots = {pathlib.Path(sys.prefix)}
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for marker in site.rglob("share/ament_index"):
    roots.add(marker.parent.parent)
print(";".join(sorted(map(str, roots))))
PY
}
step "rmw_zenoh $RMW_VERSION" "$ddir/.stamp-rmw" "$(fingerprint $RMW) $zenoh_c_key $(cat "$ddir/.stamp-venv")" build_rmw

# --- 6. the environment -----------------------------------------------------------
mkdir -p "$ddir/bin" "$ddir/rmwlink"
ln -sf "$ddir/install/lib/rmw_zenoh_cpp/rmw_zenohd" "$ddir/bin/rmw_zenohd"
# The wheels have no RMW dispatcher: rcl links librmw_fastrtps_cpp.so itself. A folder
# first on the library path where that name is rmw_zenoh_cpp makes rcl load it.
ln -sf "$ddir/install/lib/librmw_zenoh_cpp.so" "$ddir/rmwlink/librmw_fastrtps_cpp.so"
# Then what the wheels' bootstrapper would add (in no fixed order): <venv>/lib and the
# wheels' ros_*.libs folders.
libdirs="$ddir/rmwlink:$ddir/install/lib:$zdir/install/lib:$venv/lib"
for d in "$site"/ros_*.libs; do [ -d "$d" ] && libdirs="$libdirs:$d"; done
{
    echo "PATH=$venv/bin:$ddir/bin:${PATH}"
    echo "VIRTUAL_ENV=$venv"
    echo "LD_LIBRARY_PATH=$libdirs"
    echo "AMENT_PREFIX_PATH=$ddir/install:$(ros_prefixes | tr ';' ':')"
    echo "RMW_IMPLEMENTATION=rmw_zenoh_cpp"
    echo "_ROS_WHEELS_BOOTSTRAP_COMPLETE=1"
    echo "ROS_DISTRO=$distro"
    echo "ROS2_REAL_RMW_ZENOHD=$ddir/bin/rmw_zenohd"
    echo "ROS2_REAL_RMW_ZENOH_VERSION=$RMW_VERSION"
} >"$ddir/env.list"
sed -e 's/^\([A-Z_0-9]*\)=\(.*\)$/export \1="\2"/' "$ddir/env.list" >"$ddir/env.sh"
[ -z "$env_file" ] || cp "$ddir/env.list" "$env_file"

# A smoke check: rclpy loads and names rmw_zenoh as its middleware.
rmw_id="$(env -i HOME="$HOME" $(cat "$ddir/env.list") "$venv/bin/python" -c \
    'import rclpy; print(rclpy.get_rmw_implementation_identifier())' 2>&1 | tail -n1)"
if [ "$rmw_id" != rmw_zenoh_cpp ]; then
    echo "rclpy does not load rmw_zenoh_cpp (it says: $rmw_id)" >&2
    exit 1
fi

echo
echo "== ros2-real $distro (rmw_zenoh $RMW_VERSION, rclpy $RCLPY_VERSION): done in $(($(date +%s) - total_start)) s"
printf '   %s\n' "${summary[@]}"
echo "   disk: $(du -sh "$ddir" | cut -f1) in $ddir, $(du -sh "$zdir" | cut -f1) in $zdir"
echo "== environment for rclpy on rmw_zenoh (also in $ddir/env.sh${env_file:+ and $env_file}):"
sed 's/^/   /' "$ddir/env.list"
