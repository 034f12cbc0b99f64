#!/usr/bin/env python3
"""An independent rmw_zenoh participant, written from the protocol description only
(docs/ros2.md) with `eclipse-zenoh` and `rosbags`, to test zenoh-cuda-shm's ROS 2
module against something it does not share code with.

Roles:
  receive  declare a node and a subscription token (NN, MS), subscribe to the topic's
           data key, and check every message: the 33-byte attachment (sequence numbers
           1, 2, 3... with no gap, timestamps non-decreasing and recent, one constant
           GID), the CDR (decoded by rosbags, re-encoded by rosbags and compared byte
           for byte), the fields, and every data byte against the pattern.
  publish  declare a node and a publisher token (NN, MP), wait for a subscription
           token on the data key, then publish Images (CDR by rosbags, attachment
           built here); with --inject-bad, also malformed samples that a subscriber
           must drop and count.

Each role prints one JSON line and exits 0 only if every check passed.
"""

import argparse
import hashlib
import json
import queue
import struct
import sys
import time

import numpy as np
import zenoh
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

IMAGE = "sensor_msgs/msg/Image"
TENSOR = "tensor_msgs/msg/ExperimentalTensor"
TENSOR_MSG = """uint8 dtype_code
uint8 dtype_bits
uint16 dtype_lanes
int64[] shape
int64[] strides
uint64 byte_offset
uint8[] data
"""
HASHES = {
    IMAGE: "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47",
    TENSOR: "RIHS01_3137fa014c7c094b5e604cc24a07f342da9efe8d34af7b7169a3eac8447cab9f",
}
# The wrong hash the bad-input injection uses (a valid RIHS01 shape, not the type's).
WRONG_HASH = "RIHS01_" + "ab" * 32


def typestore():
    ts = get_typestore(Stores.ROS2_JAZZY)
    ts.register(get_types_from_msg(TENSOR_MSG, TENSOR))
    return ts


def dds_name(type_name):
    pkg, kind, name = type_name.split("/")
    return f"{pkg}::{kind}::dds_::{name}_"


def data_key(domain, topic, type_name, type_hash=None):
    t = topic[1:] if topic.startswith("/") else topic
    t = t[:-1] if t.endswith("/") else t
    return f"{domain}/{t}/{dds_name(type_name)}/{type_hash or HASHES[type_name]}"


def mangle(s):
    return s.replace("/", "%")


class Pattern:
    """pattern_byte(i, seed) of zenoh-cuda-shm's kernels, vectorised."""

    def __init__(self):
        self.cache = {}

    def __call__(self, n, seed):
        if n not in self.cache:
            i = np.arange(n, dtype=np.uint64)
            x = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32) ^ (
                (i >> np.uint64(32)).astype(np.uint32) * np.uint32(0x27D4EB2F)
            )
            self.cache = {n: (x, x * np.uint32(0x9E3779B1))}
        x, xm = self.cache[n]
        h = xm + np.uint32((seed * 0x85EBCA77) & 0xFFFFFFFF)
        return ((h >> np.uint32(24)) ^ x).astype(np.uint8)


def open_session(args):
    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("scouting/multicast/enabled", "false")
    if args.listen:
        conf.insert_json5("listen/endpoints", json.dumps(args.listen))
    else:
        conf.insert_json5("listen/endpoints", '["tcp/127.0.0.1:0"]')
    if args.connect:
        conf.insert_json5("connect/endpoints", json.dumps(args.connect))
    return zenoh.open(conf)


class Graph:
    """Graph tokens of the domain, as rmw_zenoh parses them."""

    def __init__(self, session, domain):
        self.tokens = set()
        self.sub = session.liveliness().declare_subscriber(f"@ros2_lv/{domain}/**", self._on, history=True)

    def _on(self, sample):
        k = str(sample.key_expr)
        if sample.kind == zenoh.SampleKind.PUT:
            self.tokens.add(k)
        else:
            self.tokens.discard(k)

    def endpoints(self, kind, key):
        out = []
        for tok in list(self.tokens):
            p = tok.split("/")
            if len(p) < 13 or p[5] != kind:
                continue
            t = p[9].replace("%", "/")
            t = t[1:] if t.startswith("/") else t
            t = t[:-1] if t.endswith("/") else t
            if f"{p[1]}/{t}/{p[10]}/{p[11]}" == key:
                out.append(tok)
        return out


def tokens(session, args, kind, type_name, qos):
    zid = str(session.zid())
    nid, eid = 0, 1
    node = f"@ros2_lv/{args.domain}/{zid}/{nid}/{nid}/NN/%/%/{args.node}"
    ep = (
        f"@ros2_lv/{args.domain}/{zid}/{nid}/{eid}/{kind}/%/%/{args.node}/{mangle(args.topic)}/"
        f"{dds_name(type_name)}/{HASHES[type_name]}/{qos}"
    )
    return node, ep


def fields_ok(args, type_name, msg, n):
    if type_name == IMAGE:
        return (
            msg.header.frame_id == "camera"
            and (msg.width, msg.height) == (args.width, args.height)
            and msg.encoding == "rgba8"
            and msg.step == args.width * 4
            and n == msg.step * msg.height
            and msg.header.stamp.sec > 1_600_000_000
        )
    return (
        (msg.dtype_code, msg.dtype_bits, msg.dtype_lanes) == (2, 32, 1)
        and list(msg.shape) == [args.height, args.width]
        and len(msg.strides) == 0
        and n == args.width * args.height * 4
    )


def receive(args):
    type_name = IMAGE if args.type == "image" else TENSOR
    ts = typestore()
    pattern = Pattern()
    session = open_session(args)
    key = data_key(args.domain, args.topic, type_name)
    graph = Graph(session, args.domain)
    node, ms = tokens(session, args, "MS", type_name, "1:2:2,10:,:,:1,,")
    q = queue.Queue(maxsize=4)  # a full queue blocks Zenoh's delivery: back-pressure, not memory
    sub = session.declare_subscriber(key, lambda s: q.put((s.payload.to_bytes(), s.attachment)))
    node_tok = session.liveliness().declare_token(node)
    ms_tok = session.liveliness().declare_token(ms)
    print(f"peer: subscribed to {key} as {ms}", file=sys.stderr, flush=True)
    got, errors = 0, []
    gids, last_seq, last_ts = set(), 0, 0
    cdr_exact = 0
    t_first = None
    deadline = time.monotonic() + args.timeout
    while got < args.frames:
        try:
            payload, att = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            errors.append(f"timeout after {got} messages")
            break
        t_first = t_first or time.monotonic()
        got += 1
        if att is None:
            errors.append(f"message {got}: no attachment")
            continue
        a = att.to_bytes()
        if len(a) != 33 or a[16] != 0x10:
            errors.append(f"message {got}: attachment {a.hex()}")
            continue
        seq, stamp = struct.unpack_from("<qq", a, 0)
        gids.add(a[17:].hex())
        if seq != last_seq + 1:
            errors.append(f"sequence {seq} after {last_seq}")
        if stamp < last_ts or abs(stamp - time.time_ns()) > 120e9:
            errors.append(f"timestamp {stamp} after {last_ts}")
        last_seq, last_ts = seq, stamp
        if payload[:4] != b"\x00\x01\x00\x00":
            errors.append(f"message {seq}: encapsulation {payload[:4].hex()}")
        try:
            msg = ts.deserialize_cdr(payload, type_name)
        except Exception as e:  # noqa: BLE001 - any decoder error fails the check
            errors.append(f"message {seq}: rosbags cannot decode: {e}")
            continue
        data = np.asarray(msg.data, dtype=np.uint8)
        if not fields_ok(args, type_name, msg, data.size):
            errors.append(f"message {seq}: fields {msg!r:.200}")
            continue
        expected = pattern(data.size, seq)
        bad = int(np.count_nonzero(data != expected))
        if bad:
            errors.append(f"message {seq}: {bad} data bytes differ")
        if bytes(ts.serialize_cdr(msg, type_name)) == payload:
            cdr_exact += 1
        else:
            errors.append(f"message {seq}: rosbags re-encodes it differently")
    secs = time.monotonic() - t_first if t_first else 0.0
    if len(gids) != 1:
        errors.append(f"{len(gids)} GIDs")
    time.sleep(0.3)
    if not q.empty():
        errors.append(f"{q.qsize()} messages beyond the {args.frames} expected")
    publishers = graph.endpoints("MP", key)
    del sub, ms_tok, node_tok
    print(
        json.dumps(
            {
                "role": "peer_receive",
                "frames": got,
                "fps": round((got - 1) / secs, 2) if got > 1 and secs > 0 else 0.0,
                "cdr_exact": cdr_exact,
                "gids": sorted(gids),
                "publishers": publishers,
                "errors": errors[:20],
            }
        ),
        flush=True,
    )
    session.close()
    return 0 if not errors else 1


def image(ts, args, seq, data):
    T = ts.types
    now = time.time_ns()
    return T["sensor_msgs/msg/Image"](
        header=T["std_msgs/msg/Header"](
            stamp=T["builtin_interfaces/msg/Time"](sec=now // 10**9, nanosec=now % 10**9), frame_id="camera"
        ),
        height=args.height,
        width=args.width,
        encoding="rgba8",
        is_bigendian=0,
        step=args.width * 4,
        data=data,
    )


def publish(args):
    ts = typestore()
    pattern = Pattern()
    session = open_session(args)
    key = data_key(args.domain, args.topic, IMAGE)
    graph = Graph(session, args.domain)
    node, mp = tokens(session, args, "MP", IMAGE, "1:2:2,10:,:,:1,,")
    # A GID only has to be 16 bytes that identify the publisher; rmw_zenoh hashes the
    # token with XXH3-128, this peer (standard library only) with SHA-256.
    gid = hashlib.sha256(mp.encode()).digest()[:16]
    pub = session.declare_publisher(
        key, congestion_control=zenoh.CongestionControl.BLOCK, reliability=zenoh.Reliability.RELIABLE
    )
    node_tok = session.liveliness().declare_token(node)
    mp_tok = session.liveliness().declare_token(mp)
    deadline = time.monotonic() + args.timeout
    while not graph.endpoints("MS", key):
        if time.monotonic() > deadline:
            print(json.dumps({"role": "peer_publish", "errors": ["no subscription appeared"]}), flush=True)
            return 1
        time.sleep(0.02)
    time.sleep(0.3)  # let the subscription's data subscriber be routed too
    injected = {"no_attachment": 0, "bad_attachment": 0, "bad_cdr": 0, "wrong_hash": 0}

    def inject(k):
        bad_gid = hashlib.sha256(b"bad" + mp.encode()).digest()[:16]
        good = bytes(ts.serialize_cdr(image(ts, args, 0, pattern(args.width * args.height * 4, 99)), IMAGE))
        att = lambda s: struct.pack("<qq", s, time.time_ns()) + b"\x10" + bad_gid  # noqa: E731
        pub.put(good)  # no attachment
        pub.put(good, attachment=att(1000 + k)[:32])  # 32 bytes
        pub.put(good, attachment=att(1001 + k)[:16] + b"\x08" + bad_gid)  # GID length 8
        injected["no_attachment"] += 1
        injected["bad_attachment"] += 2
        pub.put(good[: len(good) // 2], attachment=att(1002 + k))  # truncated CDR
        pub.put(b"\x00\x02\x00\x00" + good[4:], attachment=att(1003 + k))  # unknown encapsulation
        injected["bad_cdr"] += 2
        session.put(data_key(args.domain, args.topic, IMAGE, WRONG_HASH), good, attachment=att(1004 + k))
        injected["wrong_hash"] += 1

    t0 = time.monotonic()
    for seq in range(1, args.frames + 1):
        if args.inject_bad and seq in (1, args.frames // 2 + 1):
            inject(seq * 10)
        msg = image(ts, args, seq, pattern(args.width * args.height * 4, seq))
        att = struct.pack("<qq", seq, time.time_ns()) + b"\x10" + gid
        pub.put(bytes(ts.serialize_cdr(msg, IMAGE)), attachment=att)
        if args.rate > 0:
            time.sleep(max(0.0, t0 + seq / args.rate - time.monotonic()))
    secs = time.monotonic() - t0
    time.sleep(0.5)
    del mp_tok, node_tok, pub
    print(
        json.dumps(
            {
                "role": "peer_publish",
                "frames": args.frames,
                "fps": round(args.frames / secs, 2) if secs > 0 else 0.0,
                "gid": gid.hex(),
                "injected": injected,
                "errors": [],
            }
        ),
        flush=True,
    )
    session.close()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["receive", "publish"])
    ap.add_argument("-e", "--connect", action="append", default=[])
    ap.add_argument("-l", "--listen", action="append", default=[])
    ap.add_argument("--domain", type=int, default=0)
    ap.add_argument("--topic", default="/camera/image")
    ap.add_argument("--node", default="python_peer")
    ap.add_argument("--type", choices=["image", "tensor"], default="image")
    ap.add_argument("-n", "--frames", type=int, default=10)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--height", type=int, default=48)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--inject-bad", action="store_true")
    args = ap.parse_args()
    return receive(args) if args.role == "receive" else publish(args)


if __name__ == "__main__":
    sys.exit(main())
