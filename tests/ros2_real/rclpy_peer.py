#!/usr/bin/env python3
"""A real ROS 2 node (rclpy on rmw_zenoh_cpp) for the tests in this folder.

Roles:
  pub    publish sensor_msgs/msg/Image (rgba8) whose data is the examples' pattern
         seeded with the message's rmw sequence number (1, 2, 3, ... per publisher);
         first wait until the graph shows --wait-subs subscriptions of the topic.
         --count 0: until SIGTERM/SIGINT; --linger: stay that long after the last.
         --type string: std_msgs/msg/String instead ("Hello World: <seq>", as ROS's
         talker demo and our ros2_talker write it); --idle: declare
         the publisher and publish nothing until SIGTERM/SIGINT.
  sub    subscribe and check every message: fields, every data byte against the
         pattern seeded with the message's publication sequence number (--type
         string: the text against "Hello World: <seq>"), sequence
         numbers contiguous per publisher; exit after --count messages (or --timeout),
         or --grace seconds after them (what comes meanwhile is counted too).
  graph  wait until the topic has the expected publishers/subscriptions (node names),
         then print what rclpy's graph API says about them.
  raw    no rclpy: a plain Zenoh subscriber (eclipse-zenoh) on the topic's data keys,
         printing the publisher GIDs found in the rmw_zenoh attachments.

Every role prints JSON lines on stdout: {"event": ...} while running and one
{"summary": ...} at the end. Exit status 0 unless the role could not run at all; the
tests judge the summary.
"""

import argparse
import array
import json
import signal
import sys
import time

import numpy as np
import rclpy
from rclpy.signals import SignalHandlerOptions
from rclpy.topic_endpoint_info import TopicEndpointTypeEnum
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
from std_msgs.msg import String


def emit(kind, **fields):
    print(json.dumps({kind: fields} if kind == "summary" else {"event": kind, **fields}), flush=True)


class Pattern:
    """zenoh_cuda_shm::cuda::kernels::pattern_byte for offsets 0..n, any seed, in numpy."""

    def __init__(self, n):
        i = np.arange(n, dtype=np.uint64)
        lo = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        hi = (i >> np.uint64(32)).astype(np.uint32)
        self.x = lo ^ (hi * np.uint32(0x27D4EB2F))
        self.xm = self.x * np.uint32(0x9E3779B1)

    def bytes(self, seed):
        s = np.uint32(((seed & 0xFFFFFFFF) * 0x85EBCA77) & 0xFFFFFFFF)
        h = self.xm + s
        return ((h >> np.uint32(24)) ^ self.x).astype(np.uint8)


def qos_profile(name, depth):
    if name == "keep-all":
        return QoSProfile(reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_ALL,
                          depth=depth, durability=DurabilityPolicy.VOLATILE)
    if name == "reliable":
        return QoSProfile(reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                          depth=depth, durability=DurabilityPolicy.VOLATILE)
    if name == "transient":
        return QoSProfile(reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                          depth=depth, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    if name == "sensor":
        return QoSProfile(reliability=ReliabilityPolicy.BEST_EFFORT, history=HistoryPolicy.KEEP_LAST,
                          depth=5, durability=DurabilityPolicy.VOLATILE)
    raise SystemExit(f"unknown qos {name}")


def gid_hex(gid):
    return bytes(gid[:16]).hex()


def endpoints(node, topic, kind):
    infos = node.get_publishers_info_by_topic(topic) if kind == "pub" else node.get_subscriptions_info_by_topic(topic)
    out = []
    for e in infos:
        q = e.qos_profile
        out.append({
            "node_name": e.node_name,
            "node_namespace": e.node_namespace,
            "topic_type": e.topic_type,
            "type_hash": str(getattr(e, "topic_type_hash", "")),
            "endpoint_type": TopicEndpointTypeEnum(e.endpoint_type).name,
            "gid": gid_hex(e.endpoint_gid),
            "gid_len": len(e.endpoint_gid),
            "reliability": q.reliability.name,
            "durability": q.durability.name,
            "history": q.history.name,
            "depth": q.depth,
            "liveliness": q.liveliness.name,
        })
    return out


stop = False


def on_signal(_sig, _frame):
    global stop
    stop = True


def graph_nodes(node):
    return [[n, ns] for n, ns in node.get_node_names_and_namespaces()]


def run_pub(node, a):
    pub = node.create_publisher(String if a.type == "string" else Image, a.topic, qos_profile(a.qos, a.depth))
    # topic_name: the name as this node resolved it (relative and ~ names).
    emit("created", topic=pub.topic_name)
    if a.idle:
        deadline = time.monotonic() + a.timeout
        while not stop and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.1)
        emit("summary", frames=0, topic=pub.topic_name)
        return
    deadline = time.monotonic() + a.timeout
    while pub.get_subscription_count() < a.wait_subs:
        if time.monotonic() > deadline or stop:
            emit("summary", frames=0, error=f"no {a.wait_subs} subscription(s) within {a.timeout} s")
            return
        rclpy.spin_once(node, timeout_sec=0.05)
    # What this node's graph shows of the subscriptions it waited for.
    emit("matched", subscriptions=pub.get_subscription_count(), topic=pub.topic_name,
         subscription_endpoints=endpoints(node, pub.topic_name, "sub"), nodes=graph_nodes(node))
    if a.type == "string":
        return run_string_pub(node, pub, a)
    n = a.width * a.height * 4
    pattern = Pattern(n)
    msg = Image()
    msg.height, msg.width, msg.encoding, msg.is_bigendian, msg.step = a.height, a.width, "rgba8", 0, a.width * 4
    msg.header.frame_id = "camera"

    def fill(seq):  # rmw_zenoh numbers a publisher's messages 1, 2, 3, ...
        msg.data = array.array("B", pattern.bytes(seq).tobytes())
        now = time.time_ns()
        msg.header.stamp.sec, msg.header.stamp.nanosec = now // 1_000_000_000, now % 1_000_000_000

    sent = publish_paced(node, pub, a, msg, fill)
    emit("summary", frames=sent, bytes=n, subscriptions=pub.get_subscription_count(), topic=pub.topic_name)
    # Stay (TRANSIENT_LOCAL late joiners are served from this publisher's cache).
    end = time.monotonic() + a.linger
    while not stop and time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.1)


def publish_paced(node, pub, a, msg, fill):
    """Publishes `msg` `a.count` times (0: until stopped) at `a.rate` per second, after
    `fill(seq)` sets it for message seq (1, 2, ...); spins between messages. Returns how
    many were published."""
    period = 1.0 / a.rate if a.rate > 0 else 0.0
    sent = 0
    nxt = time.monotonic()
    while (a.count == 0 or sent < a.count) and not stop:
        fill(sent + 1)
        pub.publish(msg)
        sent += 1
        if sent == 1:
            emit("first_published")
        if period:
            nxt += period
            while not stop and time.monotonic() < nxt:
                rclpy.spin_once(node, timeout_sec=max(0.0, min(0.05, nxt - time.monotonic())))
    return sent


def run_string_pub(node, pub, a):
    msg = String()

    def fill(seq):
        msg.data = f"Hello World: {seq}"

    sent = publish_paced(node, pub, a, msg, fill)
    emit("summary", frames=sent, topic=pub.topic_name)


def run_sub(node, a):
    state = {"n": 0, "bad": 0, "gaps": 0, "disorder": 0, "field_errors": 0, "first_bad": None}
    last = {}
    first = {}
    gids = set()
    info_keys = set()
    patterns = {}

    def callback(msg, info):
        info_keys.update(info.keys())
        seq = info.get("publication_sequence_number")
        gid = info.get("publisher_gid")
        if gid is not None:
            gid = gid_hex(gid["data"] if isinstance(gid, dict) else gid)
            gids.add(gid)
        key = gid or "?"
        if seq is not None:
            if key in last:
                if seq <= last[key]:
                    state["disorder"] += 1
                elif seq > last[key] + 1:
                    state["gaps"] += seq - last[key] - 1
            last[key] = seq
            first.setdefault(key, seq)
        if a.type == "string":
            if msg.data != f"Hello World: {seq}":
                state["bad"] += 1
                if state["first_bad"] is None:
                    state["first_bad"] = {"seq": seq, "text": msg.data[:80]}
            state["n"] += 1
            if state["n"] == 1:
                emit("first_message", seq=seq, text=msg.data[:80])
            return
        ok_fields = (msg.encoding == "rgba8" and msg.step == msg.width * 4
                     and len(msg.data) == msg.step * msg.height
                     and (a.width == 0 or (msg.width, msg.height) == (a.width, a.height)))
        if not ok_fields:
            state["field_errors"] += 1
        elif not a.no_check:
            n = len(msg.data)
            if n not in patterns:
                patterns[n] = Pattern(n)
            got = np.frombuffer(msg.data, dtype=np.uint8)
            want = patterns[n].bytes(seq if seq is not None else 0)
            bad = int(np.count_nonzero(got != want))
            if bad:
                state["bad"] += 1
                if state["first_bad"] is None:
                    state["first_bad"] = {"seq": seq, "bytes_differing": bad}
        state["n"] += 1
        if state["n"] == 1:
            emit("first_message", seq=seq, width=msg.width, height=msg.height)

    sub = node.create_subscription(String if a.type == "string" else Image, a.topic, callback,
                                   qos_profile(a.qos, a.depth))
    emit("ready", topic=sub.topic_name)
    deadline = time.monotonic() + a.timeout
    while state["n"] < a.count and not stop and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.1)
    timed_out = state["n"] < a.count and not stop
    # After the last expected message: whatever else comes (a repeat, one too many) is
    # counted in `frames` too.
    end = time.monotonic() + a.grace
    while not timed_out and not stop and time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=max(0.0, min(0.1, end - time.monotonic())))
    summary = dict(state)
    summary.update(
        frames=state["n"],
        info_keys=sorted(info_keys),
        publisher_gids=sorted(gids),
        first_seq=first,
        last_seq=last,
        topic=sub.topic_name,
        publishers=endpoints(node, sub.topic_name, "pub"),
        nodes=graph_nodes(node),
        timed_out=timed_out,
    )
    emit("summary", **summary)


def run_graph(node, a):
    want_pub = set(a.expect_pub or [])
    want_sub = set(a.expect_sub or [])
    deadline = time.monotonic() + a.timeout
    while True:
        pubs = endpoints(node, a.topic, "pub")
        subs = endpoints(node, a.topic, "sub")
        have_pub = {e["node_name"] for e in pubs}
        have_sub = {e["node_name"] for e in subs}
        if (want_pub <= have_pub and want_sub <= have_sub) or time.monotonic() > deadline or stop:
            break
        rclpy.spin_once(node, timeout_sec=0.05)
    emit(
        "summary",
        complete=want_pub <= have_pub and want_sub <= have_sub,
        publishers=pubs,
        subscriptions=subs,
        topics=[[t, list(ts)] for t, ts in node.get_topic_names_and_types()],
        nodes=graph_nodes(node),
        count_publishers=node.count_publishers(a.topic),
        count_subscribers=node.count_subscribers(a.topic),
    )


def run_raw(a):
    """A plain Zenoh subscriber on the topic's data keys: the GID in each attachment."""
    import zenoh

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("connect/endpoints", json.dumps([a.connect]))
    conf.insert_json5("listen/endpoints", '["tcp/127.0.0.1:0"]')
    conf.insert_json5("scouting/multicast/enabled", "false")
    seen = {}
    with zenoh.open(conf) as session:
        key = f"{a.domain}/{a.topic.strip('/')}/**"
        sub = session.declare_subscriber(key)
        emit("ready", key=key)
        deadline = time.monotonic() + a.timeout
        n = 0
        while n < a.count and time.monotonic() < deadline and not stop:
            sample = sub.try_recv()
            if sample is None:
                time.sleep(0.01)
                continue
            att = sample.attachment.to_bytes() if sample.attachment is not None else b""
            # rmw_zenoh's attachment: sequence number (i64), source timestamp (i64), GID
            # length (one byte, 16), GID.
            if len(att) == 33 and att[16] == 16:
                gid = att[17:33].hex()
                seen[gid] = seen.get(gid, 0) + 1
            else:
                seen["bad"] = seen.get("bad", 0) + 1
            n += 1
    emit("summary", frames=n, gids=seen, key=key)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", choices=["pub", "sub", "graph", "raw"])
    p.add_argument("--connect", help="raw: the Zenoh endpoint to connect to")
    p.add_argument("--domain", type=int, help="raw: the ROS domain id")
    p.add_argument("--topic", default="/camera/image")
    p.add_argument("--node", default=None)
    p.add_argument("--namespace", default="", help="the node's namespace")
    p.add_argument("--type", default="image", choices=["image", "string"], help="pub, sub: the message type")
    p.add_argument("--idle", action="store_true", help="pub: publish nothing")
    p.add_argument("--grace", type=float, default=0.0, help="sub: seconds to stay after --count messages")
    p.add_argument("--qos", default="reliable", choices=["reliable", "keep-all", "sensor", "transient"])
    p.add_argument("--depth", type=int, default=10)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--wait-subs", type=int, default=1)
    p.add_argument("--linger", type=float, default=0.0, help="pub: seconds to stay after the last message")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--expect-pub", action="append")
    p.add_argument("--expect-sub", action="append")
    a = p.parse_args()
    if a.role == "raw":
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        return run_raw(a)
    # Our handlers, not rclpy's (which shut the context down under a spinning node).
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node = rclpy.create_node(a.node or f"rclpy_image_{a.role}", namespace=a.namespace)
    emit("started", rmw=rclpy.get_rmw_implementation_identifier(), node=node.get_name(),
         namespace=node.get_namespace())
    try:
        {"pub": run_pub, "sub": run_sub, "graph": run_graph}[a.role](node, a)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
