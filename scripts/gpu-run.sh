#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, with .gpu-pack/ (or .gpu-bin/)
# carried over:
# every test binary with ZCS_REQUIRE_GPU=1 (a missing GPU fails), the demo, then the
# benchmarks. With .gpu-pack-extra/ carried instead, ZCS_GPU_PART=extra runs the plugin
# suite in zenohd and latency with the zenohd plugin as provider; ZCS_GPU_PART=soak
# runs the soak from the same pack (or from .gpu-soak/), soak-detach and soak-collect
# one longer than a device call, soak-churn the host-backend soak once per kind of
# churning process.
# Logs go to $OUT (or ./gpu-out); the last lines are a summary.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export ZCS_REQUIRE_GPU=1 RUST_BACKTRACE=1
# A call that carries test archives runs the tests in them only: the test binaries an
# earlier call left in .gpu-bin go, and each archive is moved aside once unpacked, so
# that a later call on the same machine does not unpack it again.
if ls .gpu-pack/tests*.tar.xz >/dev/null 2>&1; then
  rm -f .gpu-bin/test-* .gpu-bin/zcs_demo
fi
for archive in .gpu-pack/*.tar.xz; do
  # The C pack is unpacked by part c into a folder of its own: its test binary needs
  # the pack's programs beside it and must not join the test loop below.
  [ -f "$archive" ] && [ "$archive" != .gpu-pack/c.tar.xz ] || continue
  mkdir -p .gpu-bin && xz -dc "$archive" | tar -C .gpu-bin -xf -
  case "$archive" in .gpu-pack/tests*) mkdir -p .gpu-pack/unpacked && mv "$archive" .gpu-pack/unpacked/ ;; esac
done
{ nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv; nvidia-smi | head -5; nvidia-smi topo -m; uname -r; } > "$out/machine.txt" 2>&1
# Two GPUs or more: the peer-GPU tests must run (not skip), and latency gets peer rows.
gpus=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | wc -l)
[ "$gpus" -ge 2 ] && export ZCS_REQUIRE_PEER_GPUS=1
# The ROS 2 test's Python peer: the carried wheels (abi3 / pure Python) unpacked onto
# PYTHONPATH; no pip, venv or network needed. numpy comes with the machine's PyTorch.
if [ -d .gpu-pack/ros-wheels ]; then
  rm -rf .gpu-pylib
  if python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(".gpu-pylib") for w in sys.argv[1:]]' .gpu-pack/ros-wheels/*.whl \
    && PYTHONPATH=$PWD/.gpu-pylib python3 -c 'import zenoh, rosbags, numpy' >"$out/python-peer.log" 2>&1; then
    export PYTHONPATH=$PWD/.gpu-pylib${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "ROS 2 peer: the carried wheels do not import (see python-peer.log)" | tee -a "$out/python-peer.log"
  fi
fi
# The CUDA buffer backend's core library, where scripts/gpu-build.sh built it.
[ -x .gpu-bin/cuda-buffer-core/bin/core_peer ] && export ZCS_CUDA_BUFFER_CORE=$PWD/.gpu-bin/cuda-buffer-core
fail=0
# ZCS_GPU_PART=tests or bench runs one half (each fits one device call); default: all.
# ZCS_GPU_PART=peer (two GPUs): the peer-GPU benchmark rows with their same-GPU anchors.
# ZCS_GPU_PART=host: the host-block rows (CPU consumers) with their anchors: zero-copy,
# cpu-bytes and one pinned device→host copy.
# ZCS_GPU_TESTS="gpu_peer demo python …": only these test targets (the name after the
# last "-" of .gpu-bin/test-*), `demo` and `python` for those two.
# ZCS_GPU_PART=shm-out: Zenoh SHM latency and throughput rows, user copies and ours
# (`--shm-out`). ZCS_GPU_PART=cross-host: throughput to subscribers in a network
# namespace standing in for another host (scripts/netns-link.sh; `ip` from
# .gpu-pack/iproute/ where the machine has none), ours against Zenoh's host payloads.
# ZCS_GPU_PART=ros2-bench: the ROS 2 rows only (zcs_rosidl_bench, zcs_ros2_sub_bench.py).
# ZCS_GPU_PART=stall: a stalled subscriber beside a healthy one (zcs_stall_bench), on the
# GPU and on host memory.
# Several parts at once: ZCS_GPU_PART="host shm-out cross-host".
part=${ZCS_GPU_PART:-all}
want() { [ "$part" = all ] || [[ " $part " == *" $1 "* ]]; }
picked() {
  [ -z "${ZCS_GPU_TESTS:-}" ] && return 0
  for w in $ZCS_GPU_TESTS; do [ "$w" = "$1" ] && return 0; done
  return 1
}
want tests && for t in .gpu-bin/test-*; do
  picked "${t##*-}" || continue
  echo "== $t" | tee -a "$out/gpu-tests.log"
  args="--test-threads=1"
  # The GPU suites' figures (`ROS2 ` lines, the slow producer's timings) are printed by
  # passing tests: keep their output. Binaries that hold one body per medium run their
  # CUDA tests here (`gpu` in the name); their host twins run in CI, and would make the
  # second archive's call outlast its ten minutes.
  case "${t##*/}" in
    *-tensor|*-ros2_stream|*-pubsub_fanout|*-crash_matrix|*-provider) args="$args --nocapture gpu";;
    *) case "$t" in *gpu*) args="$args --nocapture";; esac;;
  esac
  if ! timeout 600 "$t" $args >>"$out/gpu-tests.log" 2>&1; then
    echo "FAILED: $t" | tee -a "$out/gpu-tests.log"; fail=1
  fi
done
if want tests && picked demo && [ -x .gpu-bin/zcs_demo ]; then
  echo "== demo" | tee -a "$out/demo.log"
  timeout 120 .gpu-bin/zcs_demo -n 200 -s 33554432 >>"$out/demo.log" 2>&1 || { echo "FAILED: demo" | tee -a "$out/demo.log"; fail=1; }
fi
want bench && for b in .gpu-bin/zcs_*bench .gpu-bin/zcs_latency .gpu-bin/zcs_throughput .gpu-bin/zcs_zenoh_shm; do
  [ -x "$b" ] || continue
  [ "$b" = .gpu-bin/zcs_peer_bench ] && continue  # two GPUs only, below
  [ "$b" = .gpu-bin/zcs_stall_bench ] && continue  # both memories, below
  echo "== $b" | tee -a "$out/bench.log"
  timeout 300 "$b" --backend cuda >"$out/$(basename "$b").jsonl" 2>>"$out/bench.log" || { echo "FAILED: $b" | tee -a "$out/bench.log"; fail=1; }
done
# The same latency rows with blocks lent by a provider process (the zenohd plugin's role).
if want bench && [ -x .gpu-bin/zcs_latency ]; then
  echo "== zcs_latency --provider" | tee -a "$out/bench.log"
  timeout 300 .gpu-bin/zcs_latency --backend cuda --provider --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB \
    >"$out/zcs_latency_provider.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_latency --provider" | tee -a "$out/bench.log"; fail=1; }
fi
# Peer GPUs: the same latency rows with the pong on GPU 1 (blocks read over NVLink or
# PCIe), next to the same-GPU rows of this run.
if want peer && [ -x .gpu-bin/zcs_latency ]; then
  echo "== zcs_latency (same-GPU anchors)" | tee -a "$out/bench.log"
  timeout 300 .gpu-bin/zcs_latency --backend cuda --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB,1GiB \
    >"$out/zcs_latency.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_latency" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_throughput (same-GPU anchors)" | tee -a "$out/bench.log"
  timeout 200 .gpu-bin/zcs_throughput --backend cuda --paths zero-copy,cpu-bytes --subscribers 1 --first-subs 0 \
    >"$out/zcs_throughput.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_throughput" | tee -a "$out/bench.log"; fail=1; }
fi
# Host blocks: CPU consumers of a GPU publisher, next to zero-copy, cpu-bytes and the
# pinned copy of this run (the latency rows hold all four).
if want host && [ -x .gpu-bin/zcs_latency ]; then
  echo "== zcs_latency (host-block rows and anchors)" | tee -a "$out/bench.log"
  timeout 300 .gpu-bin/zcs_latency --backend cuda --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB,1GiB \
    >"$out/zcs_latency.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_latency" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_throughput (host-block rows and anchors)" | tee -a "$out/bench.log"
  timeout 240 .gpu-bin/zcs_throughput --backend cuda --paths zero-copy,cpu-bytes,host-block --subscribers 1,4 \
    --first-subs 0 >"$out/zcs_throughput.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_throughput" | tee -a "$out/bench.log"; fail=1; }
fi
# Zenoh's SHM: a plain subscriber with shared memory on, fed by a user's own copies
# (`zenoh-shm`) and by our publisher copying out itself (`zenoh-shm-out`).
if want shm-out && [ -x .gpu-bin/zcs_zenoh_shm ]; then
  for mode in user ours; do
    args=(--backend cuda --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB)
    [ "$mode" = ours ] && args+=(--shm-out)
    echo "== zcs_zenoh_shm ($mode copies)" | tee -a "$out/bench.log"
    timeout 300 .gpu-bin/zcs_zenoh_shm "${args[@]}" >"$out/zcs_zenoh_shm_$mode.jsonl" 2>>"$out/bench.log" \
      || { echo "FAILED: zcs_zenoh_shm $mode" | tee -a "$out/bench.log"; fail=1; }
  done
  # 1 GiB on its own (it cannot fail the run): a payload this large needs a segment of
  # over 2 GiB for ours, and through the socket it would exceed Zenoh's max_message_size.
  for mode in user ours; do
    args=(--backend cuda --rows latency --sizes 1GiB --iters 50)
    [ "$mode" = ours ] && args+=(--shm-out)
    echo "== zcs_zenoh_shm 1 GiB ($mode copies)" | tee -a "$out/bench.log"
    mkdir -p "$out/shm-1gib"
    timeout 120 .gpu-bin/zcs_zenoh_shm "${args[@]}" >"$out/shm-1gib/zcs_zenoh_shm_$mode.jsonl" 2>>"$out/bench.log" \
      || echo "zcs_zenoh_shm 1 GiB ($mode) failed (see bench.log)" | tee -a "$out/bench.log"
  done
fi
# Across hosts: the subscribers in another network namespace, over a veth pair, with a
# host id of their own; ours (`cross-host`) against Zenoh's host payloads on the link.
if want cross-host && [ -x .gpu-bin/zcs_throughput ]; then
  if ! command -v ip >/dev/null && [ -x .gpu-pack/iproute/ip ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$PWD/.gpu-pack/iproute" "$PWD/.gpu-pack/iproute/ip" >.gpu-bin/ip
    chmod +x .gpu-bin/ip && export ZCS_IP=$PWD/.gpu-bin/ip
  fi
  echo "== cross-host link" | tee -a "$out/bench.log"
  if link=$(scripts/netns-link.sh up 2>>"$out/bench.log"); then
    eval "$link"
    echo "$link" >>"$out/bench.log"
    timeout 400 .gpu-bin/zcs_throughput --backend cuda --remote-netns "$NETNS" --link-ip "$LINK_IP" \
      --paths zero-copy,zenoh-host,zenoh-host-cold,zenoh-host-gpu,zenoh-pinned --sizes 1MiB,6220800,33177600 --subscribers 1,4 --first-subs 0 \
      --max-secs 4 >"$out/zcs_throughput_cross_host.jsonl" 2>>"$out/bench.log" \
      || { echo "FAILED: zcs_throughput cross-host" | tee -a "$out/bench.log"; fail=1; }
    scripts/netns-link.sh down "$NETNS"
  else
    echo "FAILED: the cross-host link could not be made (see bench.log)" | tee -a "$out/bench.log"; fail=1
  fi
fi
if { want bench || want peer; } && [ -x .gpu-bin/zcs_latency ] && [ "$gpus" -ge 2 ]; then
  echo "== zcs_latency --pong-gpu 1" | tee -a "$out/bench.log"
  timeout 300 .gpu-bin/zcs_latency --backend cuda --pong-gpu 1 --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB,1GiB \
    >"$out/zcs_latency_peer.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_latency --pong-gpu 1" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_throughput --sub-gpu 1" | tee -a "$out/bench.log"
  timeout 200 .gpu-bin/zcs_throughput --backend cuda --sub-gpu 1 --paths zero-copy --subscribers 1 --first-subs 0 \
    >"$out/zcs_throughput_peer.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_throughput --sub-gpu 1" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_latency --pong-gpu 1 --peer-copy" | tee -a "$out/bench.log"
  timeout 300 .gpu-bin/zcs_latency --backend cuda --pong-gpu 1 --peer-copy --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB,1GiB \
    >"$out/zcs_latency_peer_copy.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_latency --peer-copy" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_throughput --sub-gpu 1 --peer-copy" | tee -a "$out/bench.log"
  timeout 200 .gpu-bin/zcs_throughput --backend cuda --sub-gpu 1 --peer-copy --paths zero-copy --subscribers 1 --first-subs 0 \
    >"$out/zcs_throughput_peer_copy.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_throughput --peer-copy" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_latency --pong-gpu 1 --peer-host" | tee -a "$out/bench.log"
  timeout 300 .gpu-bin/zcs_latency --backend cuda --pong-gpu 1 --peer-host --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB,1GiB \
    >"$out/zcs_latency_peer_host.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_latency --peer-host" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_throughput --sub-gpu 1 --peer-host" | tee -a "$out/bench.log"
  timeout 200 .gpu-bin/zcs_throughput --backend cuda --sub-gpu 1 --peer-host --paths zero-copy --subscribers 1 --first-subs 0 \
    >"$out/zcs_throughput_peer_host.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_throughput --peer-host" | tee -a "$out/bench.log"; fail=1; }
  echo "== zcs_peer_bench" | tee -a "$out/bench.log"
  timeout 200 .gpu-bin/zcs_peer_bench >"$out/zcs_peer_bench.jsonl" 2>>"$out/bench.log" \
    || { echo "FAILED: zcs_peer_bench" | tee -a "$out/bench.log"; fail=1; }
fi
# An experiment beside the goal rows (its own folder, so the report does not mix it in):
# the zero-copy throughput rows again under CUDA MPS, with a control daemon private to
# these processes (its own pipe and log folders; the card's settings are not touched),
# to see whether time-slicing between the processes' contexts is what holds four
# subscribers down. It cannot fail the run.
if want bench && [ -x .gpu-bin/zcs_throughput ] && command -v nvidia-cuda-mps-control >/dev/null; then
  mkdir -p "$out/mps/log" && mps_pipe=$(mktemp -d) && mps_log=$(cd "$out/mps/log" && pwd)
  mps() { CUDA_MPS_PIPE_DIRECTORY=$mps_pipe CUDA_MPS_LOG_DIRECTORY=$mps_log "$@"; }
  if mps nvidia-cuda-mps-control -d >>"$out/mps/mps.log" 2>&1; then
    echo "== zcs_throughput under MPS" | tee -a "$out/bench.log"
    mps timeout 200 .gpu-bin/zcs_throughput --backend cuda --subscribers 1,4 --paths zero-copy --first-subs 0 \
      >"$out/mps/zcs_throughput.jsonl" 2>>"$out/mps/mps.log" || echo "MPS experiment failed (see mps/mps.log)" | tee -a "$out/bench.log"
    echo quit | mps nvidia-cuda-mps-control >>"$out/mps/mps.log" 2>&1
  else
    echo "MPS daemon did not start (see mps/mps.log)" | tee -a "$out/bench.log"
  fi
fi
# Where a joining subscriber's time goes: first-message rows again, with the trace
# events of each step of joining (`RUST_LOG=zcs_join=trace`, timestamped, both sides);
# scripts/join-steps.py reads them.
if want bench && [ -x .gpu-bin/zcs_throughput ]; then
  echo "== join steps" | tee -a "$out/bench.log"
  mkdir -p "$out/join"
  RUST_LOG=zcs_join=trace timeout 120 .gpu-bin/zcs_throughput --backend cuda --subscribers 1 --paths zero-copy \
    --sizes 1MiB --frames 50 --first-subs 30 >"$out/join/first.jsonl" 2>"$out/join/steps.log" \
    || echo "join steps failed" | tee -a "$out/bench.log"
fi
# Another experiment beside the goal rows (its own folder; it cannot fail the run): the
# latency rows with our subscribers never polling (`spin_us` 0 on both sides), against
# the default adaptive polling of the goal rows: what waking sleeping threads costs.
if want bench && [ -x .gpu-bin/zcs_latency ]; then
  echo "== zcs_latency --spin-us 0" | tee -a "$out/bench.log"
  mkdir -p "$out/spin"
  timeout 200 .gpu-bin/zcs_latency --backend cuda --spin-us 0 --sizes 4KiB,1MiB,32MiB,256MiB \
    >"$out/spin/zcs_latency.jsonl" 2>>"$out/bench.log" || echo "spin experiment failed" | tee -a "$out/bench.log"
fi
# The Python package: the wheel from scripts/gpu-build.sh, installed offline into .gpu-py
# (no pip: unzipping a wheel installs it), then the GPU suite (pytest if the image has
# it, else a plain runner of the same tests).
if ls .gpu-pack/wheels/*.whl >/dev/null 2>&1; then
  rm -rf .gpu-py
  python3 -m pip install -q --no-index --no-deps --target .gpu-py .gpu-pack/wheels/*.whl 2>>"$out/python-tests.log" \
    || python3 -m zipfile -e .gpu-pack/wheels/*.whl .gpu-py
  export PYTHONPATH="$PWD/.gpu-py${PYTHONPATH:+:$PYTHONPATH}" XLA_PYTHON_CLIENT_PREALLOCATE=false
  if want tests && picked python; then
    echo "== python GPU tests" | tee -a "$out/python-tests.log"
    if python3 -c "import pytest" 2>/dev/null; then
      pyt=(python3 -m pytest -q -p no:cacheprovider python/tests/gpu -s)
    else
      pyt=(python3 python/tests/gpu/run_without_pytest.py)
    fi
    timeout 600 "${pyt[@]}" >>"$out/python-tests.log" 2>&1 || { echo "FAILED: python GPU tests" | tee -a "$out/python-tests.log"; fail=1; }
  fi
fi
# ZCS_GPU_PART=py-bench: only these Python benchmarks (with the wheel carried).
# torch's IPC and our Python rows alternate twice (this machine's figures drift by up to
# 2x between minutes, so ratios are taken within a pair, by scripts/py-latency-ratio.py);
# each pair also has our rows with spin_us 0 (receivers never poll: the control for the
# default, adaptive polling).
if { want bench || want py-bench; } && [ -d bench/python ]; then
  pybench() { # output name, script, arguments
    local name=$1 py=$2
    shift 2
    echo "== $py $*" | tee -a "$out/bench.log"
    timeout 150 python3 "$py" "$@" >"$out/$name.jsonl" 2>>"$out/bench.log" || { echo "FAILED: $py $*" | tee -a "$out/bench.log"; fail=1; }
  }
  pybench cuda_core_ipc_latency bench/python/cuda_core_ipc_latency.py
  pybench d2d_reference bench/python/d2d_reference.py
  for r in 1 2; do
    pybench "torch_ipc_latency-$r" bench/python/torch_ipc_latency.py
    pybench "zcs_python_latency-$r" bench/python/zcs_python_latency.py
    pybench "zcs_python_latency_nospin-$r" bench/python/zcs_python_latency.py --spin-us 0 --frameworks torch
  done
  # A pair without our rows (the wheel not carried: the script skips) fails the part.
  python3 scripts/py-latency-ratio.py "$out"/torch_ipc_latency-*.jsonl "$out"/zcs_python_latency*-[12].jsonl | tee -a "$out/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "FAILED: scripts/py-latency-ratio.py (a pair lacks torch's or our rows)" | tee -a "$out/bench.log"; fail=1; }
fi
if { want bench || want stall; } && [ -x .gpu-bin/zcs_stall_bench ]; then
  for backend in cuda host; do
    echo "== .gpu-bin/zcs_stall_bench --backend $backend" | tee -a "$out/bench.log"
    timeout 200 .gpu-bin/zcs_stall_bench --backend "$backend" >"$out/zcs_stall_bench-$backend.jsonl" 2>>"$out/bench.log" \
      || { echo "FAILED: zcs_stall_bench --backend $backend" | tee -a "$out/bench.log"; fail=1; }
  done
fi
# ROS 2 rows (in `bench`, or alone as ZCS_GPU_PART=ros2-bench with the bench archive and
# the wheel): the CUDA buffer backend's paths against ours (zcs_rosidl_bench; `bench`
# runs it in its loop above), and our Python ROS 2 subscriber beside our Rust one, same
# publisher (the ROS 2 image examples come in the bench archive).
if want ros2-bench && [ -x .gpu-bin/zcs_rosidl_bench ]; then
  echo "== .gpu-bin/zcs_rosidl_bench" | tee -a "$out/bench.log"
  timeout 300 .gpu-bin/zcs_rosidl_bench --backend cuda >"$out/zcs_rosidl_bench.jsonl" 2>>"$out/bench.log" \
    || { echo "FAILED: zcs_rosidl_bench" | tee -a "$out/bench.log"; fail=1; }
fi
if want bench || want ros2-bench; then
  echo "== bench/python/zcs_ros2_sub_bench.py" | tee -a "$out/bench.log"
  timeout 400 python3 bench/python/zcs_ros2_sub_bench.py --examples .gpu-bin >"$out/zcs_ros2_sub_bench.jsonl" 2>>"$out/bench.log" \
    || { echo "FAILED: bench/python/zcs_ros2_sub_bench.py" | tee -a "$out/bench.log"; fail=1; }
fi
# The second pack (.gpu-pack-extra, carried alone): the plugin suite in stock zenohd on
# the GPU, and latency with the zenohd plugin as provider against own pools
# (alternating runs).
# The C ABI (ZCS_GPU_PART=c, .gpu-pack/c.tar.xz carried alone): C and C++ programs
# exchange 200 frames of 32 MiB with the Rust examples and with each other, every session
# on the GPU; each subscriber checks every byte and says how the frames came. Then
# tensors: z_tensor (C++) with Rust and with the Python examples on PyTorch, both ways
# (tests/c_tensor.rs, with the pack's programs); and latency: zcs_latency's zero-copy
# rows (Rust) and zcs_latency_cpp's (C++), alternately twice, with the C++/Rust ratio.
if [ "$part" = c ]; then
  cbin=$PWD/.gpu-c && rm -rf "$cbin" && mkdir -p "$cbin" && xz -dc .gpu-pack/c.tar.xz | tar -C "$cbin" -xf -
  exchange() { # name port subscriber publisher [publisher args]
    local name=$1 port=$2 sub=$3 pub=$4 s
    shift 4
    echo "== C ABI: $name" | tee -a "$out/c.log"
    LD_LIBRARY_PATH=$cbin "$cbin/$sub" -k "c/$name" -l "tcp/127.0.0.1:$port" -n 200 --device cuda >"$out/c-$name-sub.log" 2>&1 &
    s=$!
    sleep 3
    LD_LIBRARY_PATH=$cbin timeout 60 "$cbin/$pub" -k "c/$name" -e "tcp/127.0.0.1:$port" -n 200 -s 33554432 --device cuda "$@" \
      >"$out/c-$name-pub.log" 2>&1 || { echo "FAILED: C ABI $name publisher" | tee -a "$out/c.log"; fail=1; }
    timeout 60 tail --pid="$s" -f /dev/null
    wait "$s" || { echo "FAILED: C ABI $name subscriber" | tee -a "$out/c.log"; fail=1; }
    tail -n 2 "$out/c-$name-sub.log" | tee -a "$out/c.log"
  }
  exchange rust-to-cpp 7450 z_cuda_sub_cpp z_cuda_pub -r 100 --wait-zero-copy 1 --no-multicast-scouting
  exchange c-to-rust 7451 z_cuda_sub z_cuda_pub_c
  exchange c-to-cpp 7452 z_cuda_sub_cpp z_cuda_pub_c
  # The Python package: installed above where .gpu-pack/wheels came too, else from the
  # wheel in the c pack, the same way.
  if ! python3 -c 'import zenoh_cuda_shm' >/dev/null 2>&1 && ls "$cbin"/wheels/*.whl >/dev/null 2>&1; then
    rm -rf .gpu-py
    python3 -m pip install -q --no-index --no-deps --target .gpu-py "$cbin"/wheels/*.whl 2>>"$out/c.log" \
      || python3 -m zipfile -e "$cbin"/wheels/*.whl .gpu-py
    export PYTHONPATH="$PWD/.gpu-py${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # No Rust example puts tensors on a plain key: the Rust side is the library, in the
  # test. Each exchange checks every element and the description, and prints its paths.
  echo "== C ABI: tensors, z_tensor with Rust and with the Python examples" | tee -a "$out/c.log"
  LD_LIBRARY_PATH=$cbin ZCS_C_PROGRAMS=$cbin ZCS_C_DEVICE=cuda ZCS_PYTHON=python3 ZCS_REQUIRE_PYTHON=1 \
    timeout 400 "$cbin/test-c_tensor" --test-threads=1 --nocapture >"$out/c-tensor.log" 2>&1 \
    || { echo "FAILED: C ABI tensors (see c-tensor.log)" | tee -a "$out/c.log"; fail=1; }
  # (libtest prints a test's first line after its name: match anywhere in the line.)
  grep -oE "(rust|c\+\+|python) → .*|zcs_latency_cpp \(.*|test result.*|SKIPPED.*|panicked.*" "$out/c-tensor.log" | tee -a "$out/c.log"
  # Latency, C++ against Rust: the same rows, method and flags, one program after the
  # other, twice (--max-secs bounds zcs_latency's other rows; no zero-copy row reaches it).
  for i in 1 2; do
    echo "== C ABI: zcs_latency (Rust) run $i" | tee -a "$out/c.log"
    timeout 300 "$cbin/zcs_latency" --backend cuda --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB --max-secs 4 \
      >"$out/c-latency-rust-$i.jsonl" 2>"$out/c-latency-rust-$i.log" || { echo "FAILED: zcs_latency run $i" | tee -a "$out/c.log"; fail=1; }
    echo "== C ABI: zcs_latency_cpp run $i" | tee -a "$out/c.log"
    LD_LIBRARY_PATH=$cbin timeout 200 "$cbin/zcs_latency_cpp" --backend cuda --sizes 4KiB,64KiB,1MiB,8MiB,32MiB,256MiB \
      --max-secs 4 >"$out/c-latency-cpp-$i.jsonl" 2>"$out/c-latency-cpp-$i.log" || { echo "FAILED: zcs_latency_cpp run $i" | tee -a "$out/c.log"; fail=1; }
  done
  python3 scripts/c-latency-ratio.py "$out"/c-latency-*.jsonl 2>&1 | tee -a "$out/c.log" \
    || { echo "FAILED: C++/Rust latency rows incomplete" | tee -a "$out/c.log"; fail=1; }
fi
if [ "$part" = extra ]; then
  rm -rf .gpu-extra && mkdir -p .gpu-extra && xz -dc .gpu-pack-extra/extra.tar.xz | tar -C .gpu-extra -xf -
  export ZCS_ZENOHD_DIR=$PWD/.gpu-extra/zenohd
  echo "== plugin tests in zenohd" | tee -a "$out/plugin-tests.log"
  timeout 300 .gpu-extra/gpu/deps/plugin-test --test-threads=1 --nocapture >>"$out/plugin-tests.log" 2>&1 \
    || { echo "FAILED: plugin tests" | tee -a "$out/plugin-tests.log"; fail=1; }
  for i in 1 2; do
    for lender in own zenohd; do
      extra_args=()
      [ "$lender" = zenohd ] && extra_args=(--zenohd .gpu-extra/zenohd/bin/zenohd --plugin .gpu-extra/gpu/deps/libzenoh_plugin_cuda_shm.so)
      echo "== zcs_latency $lender run $i" | tee -a "$out/bench.log"
      timeout 120 .gpu-extra/zcs_latency --backend cuda --sizes 4KiB,1MiB,32MiB,256MiB --iters 1000 "${extra_args[@]}" \
        >"$out/zcs_latency_${lender}_$i.jsonl" 2>>"$out/bench.log" || { echo "FAILED: zcs_latency $lender" | tee -a "$out/bench.log"; fail=1; }
    done
  done
fi
# The soak's binary: .gpu-soak/zcs_soak where that folder was carried alone
# (`scripts/gpu-build.sh --soak`), else the one in the extra pack.
soak_bin() {
  if [ -x .gpu-soak/zcs_soak ]; then echo .gpu-soak/zcs_soak; return; fi
  rm -rf .gpu-extra && mkdir -p .gpu-extra && xz -dc .gpu-pack-extra/extra.tar.xz | tar -C .gpu-extra -xf - \
    && echo .gpu-extra/zcs_soak
}
# ZCS_GPU_PART=soak: the soak alone, as long as one device call allows, flat out,
# sampled every 30 s, to show whether the figures level off.
if [ "$part" = soak ]; then
  soak=$(soak_bin)
  secs=${ZCS_SOAK_SECS:-540}
  echo "== zcs_soak for ${secs}s" | tee -a "$out/soak.log"
  timeout $((secs + 60)) "$soak" --backend cuda --messages 1000000000 --secs "$secs" --sample-secs 30 \
    >"$out/soak.jsonl" 2>>"$out/soak.log" || { echo "FAILED: zcs_soak" | tee -a "$out/soak.log"; fail=1; }
fi
# A soak longer than one device call: ZCS_GPU_PART=soak-detach starts it in a process
# session of its own (it outlives the call, up to the machine's return) and returns;
# a later call with ZCS_GPU_PART=soak-collect on the same machine waits for its end and
# brings its output back.
long=/tmp/zcs-soak-long
if [ "$part" = soak-detach ]; then
  soak=$(soak_bin)
  secs=${ZCS_SOAK_SECS:-1500}
  rm -rf "$long" && mkdir -p "$long" && cp "$soak" "$long/zcs_soak"
  echo "== zcs_soak for ${secs}s, detached" | tee -a "$out/soak.log"
  setsid bash -c "'$long/zcs_soak' --backend cuda --messages 1000000000 --secs $secs --sample-secs 60 \
    >'$long/soak-long.jsonl' 2>'$long/soak-long.log'; echo \$? >'$long/rc'" </dev/null >/dev/null 2>&1 &
  sleep 5
  head -1 "$long/soak-long.jsonl" | tee -a "$out/soak.log"
fi
if [ "$part" = soak-collect ]; then
  echo "== waiting for the detached zcs_soak" | tee -a "$out/soak.log"
  for _ in $(seq 1 ${ZCS_SOAK_WAIT:-540}); do [ -f "$long/rc" ] && break; sleep 1; done
  if [ "$(cat "$long/rc" 2>/dev/null)" = 0 ]; then cp "$long"/soak-long.* "$out/"
  else echo "FAILED: detached zcs_soak (rc $(cat "$long/rc" 2>/dev/null || echo 'none: still running or gone'))" | tee -a "$out/soak.log"
    cp "$long"/soak-long.* "$out/" 2>/dev/null; fail=1
  fi
fi
# ZCS_GPU_PART=soak-churn: what the long-lived process's RSS grows with. The
# host-backend soak once per kind of joining process (`--churn`), side by side on the
# machine's cores, each with its own ports and keys.
if [ "$part" = soak-churn ]; then
  soak=$(soak_bin)
  secs=${ZCS_SOAK_SECS:-480}
  pids=()
  for churn in ${ZCS_SOAK_CHURNS:-ours ours-pub ours-sub zenoh-topic zenoh none}; do
    echo "== zcs_soak --churn $churn for ${secs}s" | tee -a "$out/soak.log"
    timeout $((secs + 60)) "$soak" --backend host --churn "$churn" --messages 1000000000 --secs "$secs" \
      --sample-secs 30 >"$out/soak-$churn.jsonl" 2>"$out/soak-$churn.log" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "FAILED: a zcs_soak --churn run" | tee -a "$out/soak.log"; fail=1; }; done
fi
echo "== summary"
head -2 "$out/machine.txt"
grep -E "^test result|^FAILED|SKIPPED|panicked" "$out/gpu-tests.log" | sort | uniq -c
grep -E "^ROS2 " "$out/gpu-tests.log"
grep -E "^(PASSED|FAILED|SKIPPED)|slow producer|ROS 2 slow publisher|[0-9]+ (passed|failed)" "$out/python-tests.log" 2>/dev/null
grep -E "^\[(demo|sub|zcs)\]" "$out/demo.log" 2>/dev/null | tail -4
grep -E "^test result|^FAILED|SKIPPED|panicked|loans at the kill" "$out/plugin-tests.log" 2>/dev/null
grep -h '"summary"' "$out"/soak*.jsonl 2>/dev/null
[ "$part" = c ] && grep -vE "^== " "$out/c.log"
cat "$out"/*.jsonl 2>/dev/null | grep -v '"rss_kib"' 
# The device tool brings back only a few files: with $OUT set, everything goes back as
# one archive (unpack it and run scripts/bench-report.sh on the folder).
if [ -n "${OUT:-}" ]; then
  tmp=$(mktemp -d)
  tar -C "$out" -czf "$tmp/gpu-run.tgz" . && find "$out" -mindepth 1 -delete && mv "$tmp/gpu-run.tgz" "$out/"
fi
exit $fail
