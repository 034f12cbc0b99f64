#!/usr/bin/env bash
# Builds every test binary, the benchmarks and the examples with the `gpu` profile (release, stripped)
# into .gpu-bin/, ready to carry to a GPU machine that has the driver but no Rust.
# No CUDA is needed here: cudarc opens libcuda at run time.
# `--soak` builds only the soak (zcs_soak) into .gpu-soak/, for the soak parts of
# scripts/gpu-run.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# The folders below stay out of git: listed in info/exclude (in a linked worktree too,
# where .git is a file).
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
# Cargo's target folder (CARGO_TARGET_DIR or the workspace's `target/`).
gpu_target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/gpu
if [ "${1:-}" = --soak ]; then
  grep -qx '/.gpu-soak/' "$exclude" 2>/dev/null || echo '/.gpu-soak/' >> "$exclude"
  cargo build --profile gpu -p zcs-tests --bin zcs_soak
  rm -rf .gpu-soak && mkdir -p .gpu-soak && cp "$gpu_target"/zcs_soak .gpu-soak/
  du -sh .gpu-soak
  exit 0
fi
out=.gpu-bin
rm -rf "$out"
mkdir -p "$out"
grep -qx '/.gpu-bin/' "$exclude" 2>/dev/null || echo '/.gpu-bin/' >> "$exclude"
grep -qx '/.gpu-pack/' "$exclude" 2>/dev/null || echo '/.gpu-pack/' >> "$exclude"

cargo test --profile gpu --workspace --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        pkg = m["package_id"].split("#")[0].rsplit("/", 1)[-1].split("@")[0]
        # What needs the GPU machine: the GPU suites, the suites whose bodies run on
        # host memory and on CUDA in one binary (tensor, ros2_stream, pubsub_fanout,
        # crash_matrix, provider: scripts/gpu-run.sh runs their CUDA tests), and the
        # unit tests of the library and its layer crates. The CPU-only suites run in CI, and the carried
        # folder must stay under 64 MiB.
        libs = ("zcs_memory", "zcs_pool", "zcs_wire", "zcs_provider", "zcs_transport", "zenoh_cuda_shm",
                "zenoh_cuda_shm_ros2", "pool_leaks", "tensor", "ros2_stream", "pubsub_fanout", "crash_matrix",
                "provider")
        if not (t["name"].startswith("gpu") or t["name"] in libs):
            continue
        name = "test-" + pkg + "-" + t["name"]
        shutil.copy2(m["executable"], sys.argv[1] + "/" + name)
        print(name)
' "$out"
# Copies out into Zenoh's shared memory: the feature changes zenoh::FEATURES, so its test
# has a cargo invocation of its own (as in scripts/test.sh).
cargo test --profile gpu -p zcs-shm-tests --features zenoh-shm --test shm_out --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "shm_out":
        shutil.copy2(m["executable"], sys.argv[1] + "/test-tests-shm_out")
        print("test-tests-shm_out")
' "$out"
cargo build --profile gpu -p zcs-bench --bins -p zcs-examples --examples --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] not in ("z_cuda_pub", "z_cuda_sub"):
        shutil.copy2(m["executable"], sys.argv[1] + "/")
        print(m["target"]["name"])
' "$out"
# Zenoh's own SHM benchmark: Zenoh's `shared-memory` feature is for this binary only
# (bench/Cargo.toml), so it has a cargo invocation of its own.
cargo build --profile gpu -p zcs-bench --features zenoh-shm --bin zcs_zenoh_shm --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        shutil.copy2(m["executable"], sys.argv[1] + "/")
        print(m["target"]["name"])
' "$out"
# ROS 2's CUDA buffer backend built from its sources (scripts/cuda-buffer-core.sh), for
# tests/tests/gpu_rosidl_cuda_theirs.rs: only where ZCS_CUDA_BUFFER_SRC and
# ZCS_ROSIDL_SRC name them (they are in no package registry); the tests print SKIPPED
# without it. Carried in the first tests archive as cuda-buffer-core/{bin,lib}.
if [ -n "${ZCS_CUDA_BUFFER_SRC:-}" ]; then
  core=$(scripts/cuda-buffer-core.sh --out "$(dirname "$gpu_target")/cuda-buffer-core")
  mkdir -p "$out/cuda-buffer-core"
  cp -r "$core/bin" "$core/lib" "$out/cuda-buffer-core/"
  rm -f "$out"/cuda-buffer-core/bin/*.built-from
  [ -x "$out/cuda-buffer-core/bin/core_peer" ] || echo "gpu-build.sh: no core_peer (ZCS_ROSIDL_SRC not set): its GPU tests will print SKIPPED"
else
  echo "gpu-build.sh: ZCS_CUDA_BUFFER_SRC not set: the GPU tests against the CUDA buffer backend's own code will print SKIPPED"
fi
du -sh "$out"
# The Python package: one abi3 wheel (gpu profile, stripped), carried as it is (a wheel
# is already compressed); scripts/gpu-run.sh installs it offline.
venv=target/py-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.9.4,<2"
rm -rf .gpu-pack/wheels
"$venv/bin/maturin" build --profile gpu --locked -m python/Cargo.toml -i "$venv/bin/python" -o .gpu-pack/wheels
# The device tool carries at most 64 MiB: ship the binaries as xz archives (about a
# quarter of their size), the tests in two and the benchmarks in one, so that each
# device call carries what it runs; scripts/gpu-run.sh unpacks what it finds.
# Tests, two calls: `.gpu-pack/tests-1.tar.xz` (the library and the data-path suites,
# the demo), then `.gpu-pack/tests-2.tar.xz` (crash matrix, provider, copies into Zenoh
# SHM, peer GPUs, ROS 2 with its example programs) with `.gpu-pack/ros-wheels` (the
# ROS 2 peer) and `.gpu-pack/wheels` (the Python GPU tests, which run the ROS 2
# examples).
# Benchmarks: `.gpu-pack/bench.tar.xz` and `.gpu-pack/wheels`.
mkdir -p .gpu-pack
rm -f .gpu-pack/*.tar.xz
bench_bins=(zcs_pool_bench zcs_latency zcs_throughput zcs_zenoh_shm zcs_peer_bench zcs_rosidl_bench zcs_stall_bench
  zcs_report)
# The second archive also holds gpu_rosidl_cuda: its child publisher serves the Python
# GPU test of a CUDA buffer backend publisher, run in the same call (with the wheel).
tests_2=(test-tests-crash_matrix test-tests-provider test-tests-shm_out test-tests-gpu_peer test-tests-ros2_stream
  test-tests-gpu_rosidl_cuda ros2_image_pub ros2_image_sub ros2_tensor_pub ros2_tensor_sub)
# The bench archive holds the ROS 2 image examples as well, for the Python-against-Rust
# subscriber benchmark.
(cd "$out" && tar -cf - --ignore-failed-read "${bench_bins[@]}" ros2_image_pub ros2_image_sub 2>/dev/null) | xz -T2 -6 > .gpu-pack/bench.tar.xz
(cd "$out" && tar -cf - $(printf -- "--exclude=./%s " "${bench_bins[@]}" "${tests_2[@]}") .) | xz -T2 -6 > .gpu-pack/tests-1.tar.xz
(cd "$out" && tar -cf - --ignore-failed-read "${tests_2[@]}" 2>/dev/null) | xz -T2 -6 > .gpu-pack/tests-2.tar.xz
# The ROS 2 GPU test's Python peer needs eclipse-zenoh and rosbags, and xxhash for
# rmw_zenoh's GIDs; the GPU machine has no network. The first two run on any CPython
# >= 3.9 (abi3 / pure); xxhash's extension is built per CPython version, so one wheel
# for each of 3.10-3.13 (their modules have distinct names and unpack side by side).
# numpy, the peer's other dependency, comes with the machine's PyTorch.
rm -rf .gpu-pack/ros-wheels
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  -d .gpu-pack/ros-wheels eclipse-zenoh==1.10.2 rosbags==0.11.9
for v in 3.10 3.11 3.12 3.13; do
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$v" --platform manylinux2014_x86_64 -d .gpu-pack/ros-wheels xxhash==3.5.0
done
# The cross-host rows (ZCS_GPU_PART=cross-host) make a veth pair with `ip`, which the GPU
# machine's image lacks: carry this machine's, with the libraries it links but libc.
rm -rf .gpu-pack/iproute
if ipbin=$(command -v ip); then
  mkdir -p .gpu-pack/iproute && cp "$ipbin" .gpu-pack/iproute/
  ldd "$ipbin" | awk '/=> \// {print $3}' | grep -v -e '/libc\.so' | xargs -r cp -t .gpu-pack/iproute/
fi
ls -l .gpu-pack/wheels .gpu-pack/ros-wheels
du -sh .gpu-pack
# The C ABI on the GPU (ZCS_GPU_PART=c): the library, the C and C++ examples and the C++
# latency benchmark built with its CMake package (cmake from pip where missing; no CUDA
# toolkit needed), the Rust examples they exchange frames with, the tensor test
# (tests/c_tensor.rs: z_tensor against Rust and the Python examples), zcs_latency for
# the Rust rows beside the C++ ones, and the Python wheel, in .gpu-pack/c.tar.xz (carried
# alone).
cargo build --profile gpu --locked -p zenoh-cuda-shm-c 2>/dev/null
cargo build --profile gpu --locked -p zcs-examples --example z_cuda_pub --example z_cuda_sub 2>/dev/null
cargo build --profile gpu --locked -p zcs-bench --bin zcs_latency 2>/dev/null
c_tensor_test=$(cargo test --profile gpu --locked -p zenoh-cuda-shm-c --test c_tensor --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "c_tensor":
        print(m["executable"])
')
command -v cmake >/dev/null || python3 -m pip install -q --disable-pip-version-check "cmake>=3.16"
cdir=$(mktemp -d)
scripts/c-install.sh --from "$gpu_target" "$cdir/prefix" >/dev/null
cmake -S examples/c -B "$cdir/build" -DCMAKE_PREFIX_PATH="$cdir/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$cdir/build" -j 2 >/dev/null
mkdir -p "$cdir/pack"
cp "$cdir/prefix/lib/libzenoh_cuda_shm_c.so" "$gpu_target"/examples/z_cuda_pub "$gpu_target"/examples/z_cuda_sub "$cdir/pack/"
cp "$cdir/build/z_cuda_pub" "$cdir/pack/z_cuda_pub_c"
cp "$cdir/build/z_cuda_sub" "$cdir/pack/z_cuda_sub_cpp" && strip "$cdir/pack/z_cuda_sub_cpp"
cp "$cdir/build/z_tensor" "$cdir/build/zcs_latency_cpp" "$cdir/pack/" && strip "$cdir/pack/z_tensor" "$cdir/pack/zcs_latency_cpp"
cp "$gpu_target"/zcs_latency "$cdir/pack/"
cp "$c_tensor_test" "$cdir/pack/test-c_tensor"
mkdir -p "$cdir/pack/wheels" && cp .gpu-pack/wheels/*.whl "$cdir/pack/wheels/"
tar -C "$cdir/pack" -cf - . | xz -T2 -6 > .gpu-pack/c.tar.xz
rm -rf "$cdir"
ls -l .gpu-pack/c.tar.xz
# The second pack, `.gpu-pack-extra` (carried on its own: with it the first would pass
# 64 MiB): stock zenohd 1.10.2 and its REST plugin (release, scripts/zenohd.sh), our
# plugin, the plugin test binary laid out as it expects (`<dir>/deps/plugin-*` with the
# plugin's .so beside it, `<dir>/examples/`, `<dir>/zenoh-bridge-cuda-shm`), zcs_latency
# for the row with the zenohd plugin as provider, and zcs_soak.
# `ZCS_GPU_PART=extra scripts/gpu-run.sh` runs it.
zenohd_dir=$(ZCS_ZENOHD_PROFILE=release ./scripts/zenohd.sh)
extra=.gpu-extra
rm -rf "$extra" .gpu-pack-extra
mkdir -p "$extra/zenohd" "$extra/gpu/deps" "$extra/gpu/examples" .gpu-pack-extra
grep -qx '/.gpu-extra/' "$exclude" || echo '/.gpu-extra/' >> "$exclude"
grep -qx '/.gpu-pack-extra/' "$exclude" || echo '/.gpu-pack-extra/' >> "$exclude"
cp -r "$zenohd_dir/bin" "$zenohd_dir/lib" "$zenohd_dir/FEATURES" "$zenohd_dir/VERSION" "$extra/zenohd/"
strip "$extra/zenohd/bin/zenohd" "$extra/zenohd/lib/libzenoh_plugin_rest.so"
cargo test --profile gpu -p zcs-tests --test plugin --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "plugin":
        shutil.copy2(m["executable"], sys.argv[1] + "/deps/plugin-test")
' "$extra/gpu"
# The plugin's .so as the test build left it (a later build of the bridge, which links
# the plugin statically without `dynamic_plugin`, may write another over it).
cp "$gpu_target"/deps/libzenoh_plugin_cuda_shm.so "$extra/gpu/deps/"
cargo build --profile gpu -p zenoh-bridge-cuda-shm 2>/dev/null
cargo build --profile gpu -p zcs-tests --bin zcs_soak 2>/dev/null
cargo build --profile gpu -p zcs-examples --example z_cuda_pub --example z_cuda_sub 2>/dev/null
cp "$gpu_target"/zenoh-bridge-cuda-shm "$extra/gpu/"
cp "$gpu_target"/examples/z_cuda_pub "$gpu_target"/examples/z_cuda_sub "$extra/gpu/examples/"
cp "$gpu_target"/zcs_soak .gpu-bin/zcs_latency "$extra/"
tar -C "$extra" -cf - . | xz -T2 -6 > .gpu-pack-extra/extra.tar.xz
du -sh "$extra" .gpu-pack-extra
