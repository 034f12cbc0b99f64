#!/usr/bin/env python3
"""A PyTorch node that takes camera frames from a ROS 2 graph in place.

It subscribes to sensor_msgs/msg/Image and reads each frame with
`torch.from_dlpack(msg)`: a frame from one of our publishers on this GPU is read in its
block, ordered after the publisher's writes on the current stream (no copy, no host
wait); a frame from an rclpy or rclcpp publisher arrives as CDR and is copied once.
Without PyTorch (or without a GPU) it does the same with NumPy on host memory.

Every frame is checked against the examples' pattern seeded with its ROS sequence
number (what ros2_pub.py, ros2_image_pub and the tests' rclpy publishers write);
a frame that differs is printed as MISMATCH and the program exits with status 1.

    python3 examples/python/ros2_sub.py -n 100

Flags: -t/--topic (/camera/image), -n (100 messages; 0: until Ctrl-C), --qos
(keep-all, reliable, sensor), --domain, --device, -m/--mode (peer), -e/--connect,
-l/--listen, -c/--config (a Zenoh JSON5 file, alone), --no-multicast-scouting,
--idle-timeout (60 s; 0: never give up), --no-check (take each frame, check nothing:
for other publishers).
It says when it waits for a publisher and names those of the topic that it will not
hear (another type or type hash, incompatible QoS). The summary's counts add up:
received = frames + dropped_queue_full + unread.
"""

import argparse
import json
import signal
import sys
import time

import numpy

try:
    import torch
except ImportError:
    torch = None

import zenoh_cuda_shm as zcs
from waiting import receive  # beside this file
from zenoh_flags import add_zenoh_flags, zenoh_config
from zenoh_cuda_shm import ros2
from ros2_pub import QOS, pattern  # the publisher's pattern and QoS names, beside this file


def mismatches(msg, use_torch):
    """Bytes of the frame that are not the pattern of its sequence number."""
    # In place; on the GPU when it came there.
    return mismatches_of(torch.from_dlpack(msg) if use_torch else numpy.from_dlpack(msg), msg.seq, use_torch)


def mismatches_of(frame, seq, use_torch):
    if use_torch:
        want = pattern(frame.numel(), seq, torch, frame.device).to(torch.uint8)
        return int((frame.reshape(-1) != want).sum())
    return int((frame.reshape(-1) != pattern(frame.size, seq, numpy).astype(numpy.uint8)).sum())


def taken(msg, use_torch):
    """`--no-check`: the frame taken as a tensor (in place, ordered after its writes on
    the current stream), nothing read; 0 mismatches."""
    (torch.from_dlpack if use_torch else numpy.from_dlpack)(msg)
    return 0


def percentiles(lat_us):
    """p50 and p99 of publish→receive times in µs, as the Rust subscriber reports them
    (nearest rank below; None when no message carried a source timestamp)."""
    v = sorted(lat_us)
    at = lambda q: round(v[min(int(len(v) * q), len(v) - 1)], 1) if v else None  # noqa: E731
    return {"p50": at(0.5), "p99": at(0.99)}


def unheard(sub, told):
    """Names each publisher of the topic in the graph that will not be heard, once
    (`told`: the GIDs named so far)."""
    for gid, node, reasons in sub.unheard_publishers():
        if gid not in told:
            told.add(gid)
            print(f"[ros2] publisher {gid} of {sub.topic} (node {node}) will not be heard: {'; '.join(reasons)}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--topic", default="/camera/image")
    ap.add_argument("-n", type=int, default=100, help="messages to receive (0: until Ctrl-C)")
    ap.add_argument("--qos", choices=sorted(QOS), default="keep-all")
    ap.add_argument("--domain", type=int, default=None, help="ROS domain id (default: ROS_DOMAIN_ID, else 0)")
    add_zenoh_flags(ap)
    ap.add_argument("--idle-timeout", type=float, default=60.0, help="give up after this long without a message")
    ap.add_argument("--no-check", action="store_true",
                    help="take each frame (torch.from_dlpack) but do not check its bytes (frames of other publishers)")
    args = ap.parse_args()

    zenoh = zenoh_config(ap, args)
    # Ctrl-C and SIGTERM end the loop and print the summary, also when this process
    # started with SIGINT ignored (as a background job of a script does).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    with zcs.open({"device": args.device}, zenoh=zenoh) as session:
        use_torch = torch is not None and (session.backend == "cuda-vmm" or not hasattr(numpy, "from_dlpack"))
        if use_torch and session.backend == "cuda-vmm":
            # CUDA loads PyTorch's kernels on first use: here, not while the first frames wait.
            mismatches_of(torch.zeros(4, dtype=torch.uint8, device="cuda"), 0, True)
        node = ros2.Node(session, "zcs_py_image_sub", domain=args.domain)
        sub = node.create_subscription(ros2.Image, args.topic, qos_profile=QOS[args.qos])
        print(f"[ros2] subscribed to {sub.topic!r} gid {sub.gid} (checking with {'PyTorch' if use_torch else 'NumPy'})",
              flush=True)
        n = bad = gaps = disorder = 0
        told = set()  # publishers named as not heard
        paths, last = {}, {}
        lat_us = []  # publish (the source timestamp) → received
        start = None
        interrupted = False
        try:
            while args.n == 0 or n < args.n:
                waiting = (f"[ros2] waiting for a publisher on {sub.topic}…" if n == 0 else
                           f"[ros2] nothing for 5 s after {n} messages; waiting for a publisher on {sub.topic}…")
                msg = receive(sub.recv, n, args.idle_timeout, waiting, lambda: unheard(sub, told))
                if msg is None:
                    print(f"[ros2] no message for {args.idle_timeout} s", file=sys.stderr)
                    break
                start = start or time.monotonic()
                if msg.source_timestamp_ns > 0:
                    lat_us.append((time.time_ns() - msg.source_timestamp_ns) / 1e3)
                if msg.path not in paths:
                    why = msg.path_reason
                    print(f"[ros2] first message by path {msg.path}" + (f" ({why})" if why else ""), flush=True)
                paths[msg.path] = paths.get(msg.path, 0) + 1
                prev = last.get(msg.publisher_gid)
                if prev is not None:
                    disorder += msg.seq <= prev
                    gaps += max(0, msg.seq - prev - 1)
                last[msg.publisher_gid] = msg.seq
                if msg.encoding != "rgba8" or (mismatches(msg, use_torch) if not args.no_check else taken(msg, use_torch)):
                    bad += 1
                    print(f"[ros2] message {msg.seq} from {msg.publisher_gid}: MISMATCH", file=sys.stderr)
                n += 1
        except KeyboardInterrupt:
            interrupted = True
        if use_torch and torch.cuda.is_available():
            torch.cuda.synchronize()
        secs = time.monotonic() - start if start else 0.0
        s = sub.stats()
        received = sum(s[k] for k in ("channel", "base", "buf_cpu", "cuda_buffers", "buf_gid"))
        unread = max(0, received - n - s["dropped_queue_full"])
        print(json.dumps({"role": "ros2_sub", "frames": n, "received": received, "unread": unread,
                          "bad": bad, "gaps": gaps, "disorder": disorder,
                          "fps": round((n - 1) / secs, 2) if n > 1 and secs else 0,
                          "latency_us": percentiles(lat_us), "paths": paths,
                          "channel": s["channel"], "base": s["base"], "lost": s["lost"],
                          "dropped_queue_full": s["dropped_queue_full"], "interrupted": interrupted},
                         separators=(",", ":")), flush=True)
    return 1 if bad or disorder or (args.n and n < args.n) else 0


if __name__ == "__main__":
    sys.exit(main())
