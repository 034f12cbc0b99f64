#!/usr/bin/env bash
# Runs the tests of tests/ros2_real/ (our example nodes against real rclpy nodes on
# rmw_zenoh_cpp) for one distro: builds or reuses the stack (scripts/ros2-real.sh, same
# options and environment), builds our example binaries, then runs pytest.
#
#   scripts/ros2-real-test.sh <jazzy|kilted> [ros2-real.sh options] [-- pytest arguments]
#
# ZCS_EXAMPLES_DIR=DIR  take our example binaries (ros2_image_pub / _sub, ros2_talker /
#                       ros2_listener) from DIR, build nothing
# ZCS_PYTHON=PYTHON     the interpreter with our Python package (default: target/py-venv,
#                       made by scripts/python-test.sh when missing)
# ROS2_REAL_REPEAT=N    run the whole set N times in a row (default 1); stops at a failure
# Logs of every process: target/ros2-real/<distro>/run-<i>/<test>/
# See docs/ros2-real.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
setup_args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do setup_args+=("$1"); shift; done
[ "${1:-}" != -- ] || shift
case " ${setup_args[*]} " in
    *" -h "*|*" --help "*) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

env_file="$(mktemp)"
trap 'rm -f "$env_file"' EXIT
"$root/scripts/ros2-real.sh" "${setup_args[@]}" --env-file "$env_file"

if [ -z "${ZCS_EXAMPLES_DIR:-}" ]; then
    echo "==> our examples (cargo build --release -p zcs-examples)"
    t0=$(date +%s)
    (cd "$root" && cargo build --release -q -p zcs-examples --example ros2_image_pub --example ros2_image_sub --example ros2_talker --example ros2_listener)
    echo "<== our examples: $(($(date +%s) - t0)) s"
    target="$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    export ZCS_EXAMPLES_DIR="$target/release/examples"
fi

if [ -z "${ZCS_PYTHON:-}" ]; then
    # Our Python package, for the tests of examples/python/ros2_*.py (test_python.py).
    export ZCS_PYTHON="$root/target/py-venv/bin/python"
    if ! "$ZCS_PYTHON" -c "import zenoh_cuda_shm.ros2" 2>/dev/null; then
        echo "==> our Python package (scripts/python-build.sh)"
        "$root/scripts/python-build.sh" >/dev/null
    fi
fi
while IFS= read -r line; do export "${line?}"; done <"$env_file"
cd "$root/tests/ros2_real"
runs="${ROS2_REAL_REPEAT:-1}"
# Each run's process logs stay in target/ros2-real/<distro>/run-<i>/<test>/ (pytest
# would keep only its last three temporary folders).
logs="$root/target/ros2-real/${ROS_DISTRO:-distro}"
mkdir -p "$logs"
for i in $(seq 1 "$runs"); do
    [ "$runs" = 1 ] || echo "==> run $i of $runs"
    python -m pytest -c pytest.ini --basetemp="$logs/run-$i" "$@"
done
