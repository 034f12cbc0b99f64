#!/usr/bin/env python3
"""Publishes camera frames on a ROS 2 topic from Python, as ros2_image_pub does from Rust.

Each frame is an rgba8 sensor_msgs/msg/Image whose pixels are the examples' pattern
seeded with the message's ROS sequence number, made on the GPU with PyTorch in a CUDA
session (and published from there: one device-to-device copy into the block, no host
copy), with NumPy otherwise. ros2_sub.py, ros2_image_sub and rclpy subscribers read it.

    python3 examples/python/ros2_pub.py

Flags: -t/--topic (/camera/image), --width 640, --height 480, -r (30 messages per
second), -n (0: until Ctrl-C), --qos (keep-all, reliable, sensor), --domain, --device,
-m/--mode (peer), -e/--connect, -l/--listen, -c/--config (a Zenoh JSON5 file, alone),
--no-multicast-scouting, --wait-subscriptions N, --wait-zero-copy N.
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
from zenoh_flags import add_zenoh_flags, zenoh_config  # beside this file
from zenoh_cuda_shm import ros2

QOS = {
    "keep-all": ros2.QoSProfile(depth=10, history=ros2.HistoryPolicy.KEEP_ALL),
    "reliable": ros2.qos_profile_default,
    "sensor": ros2.qos_profile_sensor_data,
}


def pattern(n, seed, xp, device=None):
    """zcs_memory's pattern_byte for offsets 0..n (below 4 GiB), in int64 arithmetic that
    NumPy and PyTorch share: products wrap, and only their low 32 bits are kept."""
    m = 0xFFFFFFFF
    arange = xp.arange(n, dtype=xp.int64) if device is None else xp.arange(n, dtype=xp.int64, device=device)
    x = arange & m
    h = ((x * 0x9E3779B1) & m) + ((seed * 0x85EBCA77) & m)
    return (((h & m) >> 24) ^ x) & 0xFF


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--topic", default="/camera/image")
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("-r", "--rate", type=float, default=30.0, help="messages per second (0: as fast as possible)")
    ap.add_argument("-n", type=int, default=0, help="messages to publish (0: until Ctrl-C)")
    ap.add_argument("--qos", choices=sorted(QOS), default="keep-all")
    ap.add_argument("--domain", type=int, default=None, help="ROS domain id (default: ROS_DOMAIN_ID, else 0)")
    add_zenoh_flags(ap)
    ap.add_argument("--wait-subscriptions", type=int, default=0,
                    help="wait (up to 60 s) until this many subscriptions are in the graph")
    ap.add_argument("--wait-zero-copy", type=int, default=0,
                    help="wait (up to 60 s) until this many of our subscriptions are on the zero-copy path")
    args = ap.parse_args()

    zenoh = zenoh_config(ap, args)
    # Ctrl-C and SIGTERM end the loop and print the summary, also when this process
    # started with SIGINT ignored (as a background job of a script does).
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(1))
    with zcs.open({"device": args.device}, zenoh=zenoh) as session:
        node = ros2.Node(session, "zcs_py_image_pub", domain=args.domain)
        pub = node.create_publisher(ros2.Image, args.topic, QOS[args.qos])
        on_gpu = session.backend == "cuda-vmm" and torch is not None
        print(f"[ros2] publishing on {pub.topic!r} gid {pub.gid} "
              f"({'frames made on the GPU with PyTorch' if on_gpu else 'frames made with NumPy'})", flush=True)
        end = time.monotonic() + 60
        while args.wait_subscriptions and not stop and time.monotonic() < end:
            subs = [e for e in node.graph() if e["kind"] == "subscription" and e.get("topic") == pub.topic]
            if len(subs) >= args.wait_subscriptions:
                break
            time.sleep(0.02)
        while pub.zero_copy_subscribers < args.wait_zero_copy and not stop and time.monotonic() < end:
            time.sleep(0.01)
        n, nbytes = 0, args.width * args.height * 4
        period = 1.0 / args.rate if args.rate > 0 else 0.0
        start = nxt = time.monotonic()
        while (args.n == 0 or n < args.n) and not stop:
            seq = pub.next_seq
            if on_gpu:
                frame = pattern(nbytes, seq, torch, "cuda").to(torch.uint8)
            else:
                frame = pattern(nbytes, seq, numpy).astype(numpy.uint8)
            pub.publish(frame.reshape(args.height, args.width, 4), encoding="rgba8", frame_id="camera")
            n += 1
            if period:
                nxt += period
                time.sleep(max(0.0, nxt - time.monotonic()))
        secs = time.monotonic() - start
        s = pub.stats()
        print(json.dumps({"role": "ros2_pub", "frames": n, "bytes": nbytes, "fps": round(n / secs, 2) if secs else 0,
                          "base_puts": s["base_puts"], "device_to_host": s["device_to_host"],
                          "zero_copy_subscribers": pub.zero_copy_subscribers,
                          "ordinary_subscriptions": pub.ordinary_subscriptions}, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
