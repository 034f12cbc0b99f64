#!/usr/bin/env python3
"""A ROS 2 subscriber in Python against one in Rust, same publisher, same run, same GPU.

One publisher, our Rust example `ros2_image_pub` (frames filled on the GPU, rgba8,
sensor_msgs/msg/Image over rmw_zenoh, KEEP_ALL), sends to one subscriber at a time:
our Rust example `ros2_image_sub`, then our Python example
`examples/python/ros2_sub.py` (PyTorch). Both receive every frame zero-copy (the
publisher waits until the subscription is on that path).

Rows (JSON lines), per `--frames` size and subscriber, `--repeats` times alternating:
- `latency`: the publisher at `--latency-rate` frames per second (one frame in flight),
  publish (the message's source timestamp) → received by the subscriber's loop, from
  each subscriber's own summary (`latency_us`, p50 and p99 over the frames); every byte
  then checked on the GPU;
- `rate`: the publisher as fast as it can, each frame taken in place (Python:
  `torch.from_dlpack`) and not checked (`--no-check`); frames per second at the
  subscriber;
- `rate-checked`: the same with every byte checked on the GPU (Rust: one kernel;
  Python: the pattern built from PyTorch operations), which costs Python more than the
  transport does.
A wrong byte, a frame off the zero-copy path or a device→host copy fails the run.
Then one `ros2-sub-ratio` row per size: Python over Rust of the `latency` p50s and the
`rate`s, medians over the repeats, against the goal (latency p50 at most 1.5x Rust's,
frame rate at least 80 % of Rust's).

    PYTHONPATH=.gpu-py python3 bench/python/zcs_ros2_sub_bench.py --examples .gpu-bin
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys

from benchcommon import emit, free_port
import benchcommon

NAME = "zcs_ros2_sub_bench"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY_SUB = os.path.join(ROOT, "examples", "python", "ros2_sub.py")


def summary(out, role):
    lines = [line for line in out.splitlines() if line.startswith('{"role":"%s"' % role)]
    if not lines:
        raise RuntimeError(f"no {role} summary in:\n{out[-3000:]}")
    return json.loads(lines[-1])


def one(args, lang, width, height, n, rate, check=True):
    """One subscriber process and one publisher process; the subscriber's summary."""
    port, domain, topic = free_port(), random.randrange(1, 200), f"/bench/image_{width}"
    common = ["--no-multicast-scouting", "--domain", str(domain), "-t", topic]
    if lang == "rust":
        sub_cmd = [os.path.join(args.examples, "ros2_image_sub")]
    else:
        sub_cmd = [sys.executable, PY_SUB, "--device", "cuda"]
    if not check:
        sub_cmd.append("--no-check")
    sub = subprocess.Popen(sub_cmd + common + ["-l", f"tcp/127.0.0.1:{port}", "-n", str(n), "--idle-timeout", "30"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pub = subprocess.Popen([os.path.join(args.examples, "ros2_image_pub")] + common
                           + ["-e", f"tcp/127.0.0.1:{port}", "--width", str(width), "--height", str(height),
                              "-n", str(n), "-r", str(rate), "--wait-zero-copy", "1", "--linger", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        sub_out, _ = sub.communicate(timeout=args.timeout)
        pub_out, _ = pub.communicate(timeout=30)
    finally:
        for p in (sub, pub):
            if p.poll() is None:
                p.kill()
                p.wait()
    s, p = summary(sub_out, "ros2_sub"), summary(pub_out, "ros2_pub")
    if sub.returncode or s["frames"] != n or s["bad"] or s.get("paths") != {"zero-copy": n}:
        raise RuntimeError(f"{lang} subscriber, {width}x{height}: {s} (exit {sub.returncode})\n{sub_out[-2000:]}")
    if p["device_to_host"]:
        raise RuntimeError(f"the publisher copied device to host: {p}")
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", default=os.path.join(ROOT, ".gpu-bin"),
                    help="folder with ros2_image_pub and ros2_image_sub (gpu profile)")
    ap.add_argument("--frames", default="1920x1080,3840x2160")
    ap.add_argument("--latency-frames", type=int, default=300)
    ap.add_argument("--latency-rate", type=float, default=100.0)
    ap.add_argument("--rate-frames", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="per subscriber process")
    args = ap.parse_args()
    for prog in ("ros2_image_pub", "ros2_image_sub"):
        if not os.access(os.path.join(args.examples, prog), os.X_OK):
            benchcommon.skip(NAME, f"no {prog} in {args.examples} (scripts/gpu-build.sh)")
    try:
        import torch
        import zenoh_cuda_shm  # noqa: F401
    except ImportError as e:
        benchcommon.skip(NAME, f"{e} (PyTorch and the zenoh_cuda_shm wheel are needed)")
    if not torch.cuda.is_available():
        benchcommon.skip(NAME, "no CUDA device")
    emit({"bench": "ros2-sub-setup", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
          "python": sys.version.split()[0], "cpus": os.cpu_count(), "loadavg": os.getloadavg()[0],
          "latency_rate": args.latency_rate, "latency_frames": args.latency_frames,
          "rate_frames": args.rate_frames, "repeats": args.repeats})
    for frame in args.frames.split(","):
        width, height = (int(v) for v in frame.lower().split("x"))
        got = {("rust", "latency"): [], ("python", "latency"): [], ("rust", "rate"): [], ("python", "rate"): []}
        for _ in range(args.repeats):
            for lang in ("rust", "python"):
                s = one(args, lang, width, height, args.latency_frames, args.latency_rate)
                emit({"bench": "ros2-sub", "row": "latency", "subscriber": lang, "frame": frame,
                      "size": width * height * 4, "frames": s["frames"], "one_way_p50_us": s["latency_us"]["p50"],
                      "one_way_p99_us": s["latency_us"]["p99"], "rate": args.latency_rate,
                      "what": "publish -> received by the subscriber's loop, every byte then checked on the GPU"})
                got[(lang, "latency")].append(s["latency_us"]["p50"])
                s = one(args, lang, width, height, args.rate_frames, 0, check=False)
                emit({"bench": "ros2-sub", "row": "rate", "subscriber": lang, "frame": frame,
                      "size": width * height * 4, "frames": s["frames"], "fps": s["fps"],
                      "what": "frames per second at the subscriber, each taken in place (Python: torch.from_dlpack), "
                              "none checked"})
                got[(lang, "rate")].append(s["fps"])
                s = one(args, lang, width, height, args.rate_frames, 0)
                emit({"bench": "ros2-sub", "row": "rate-checked", "subscriber": lang, "frame": frame,
                      "size": width * height * 4, "frames": s["frames"], "fps": s["fps"],
                      "what": "frames per second at the subscriber, every byte checked on the GPU (Rust: one kernel; "
                              "Python: the pattern computed with PyTorch operations)"})
        lat = statistics.median(got[("python", "latency")]) / statistics.median(got[("rust", "latency")])
        fps = statistics.median(got[("python", "rate")]) / statistics.median(got[("rust", "rate")])
        emit({"bench": "ros2-sub-ratio", "frame": frame, "latency_p50_python_over_rust": round(lat, 3),
              "fps_python_over_rust": round(fps, 3), "goal": "latency <= 1.5, fps >= 0.8",
              "met": lat <= 1.5 and fps >= 0.8})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a row, not a traceback only, says what failed
        emit({"bench": "ros2-sub-error", "error": f"{type(e).__name__}: {e}"})
        sys.exit(1)
