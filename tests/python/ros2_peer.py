#!/usr/bin/env python3
"""An independent rmw_zenoh participant, written from the protocol description only
(docs/ros2.md) with `eclipse-zenoh`, `rosbags` and `xxhash`, to test zenoh-cuda-shm's
ROS 2 module against something it does not share code with.

Wires (--wire):
  old  rmw_zenoh before buffer backends (Jazzy, Kilted, Lyrical <= 0.10.4, Rolling
       <= 0.11): 13-chunk endpoint tokens; publishers put every message on the data
       key `<domain>/<topic>/<dds type>/<RIHS01 hash>` ("base"), numbered 1, 2, 3...
  humble  Humble's rmw_zenoh, 0.1.2 to 0.1.9 (docs/ros2-humble.md, from the 0.1.9
       sources): the old wire with the fixed text `TypeHashNotSupported` in place of
       the type hash, for every type, in the data key and in the tokens' hash chunk.
       No token has a 14th chunk, and Humble's parser reads nothing after the 13th;
       it accepts liveliness 0, 1, 3 and 4 only (no BEST_AVAILABLE). The typestore is
       rosbags' Humble one (Image and Header have the same fields as in Jazzy).
  new  rmw_zenoh with buffer backends (Lyrical 0.10.5, Rolling 0.12.0), for volatile
       endpoints (both types here have a top-level uint8[]): the token gets a 14th
       chunk `backends:<name>:<meta>;...` (--backends, default `cpu:`; `cuda:` for a
       subscription that accepts CUDA buffers, `cpu:;cuda:` for a publisher with the
       CUDA plugin). Transient-local endpoints (--qos durability 1) keep the old wire.
  Tokens are always written as rmw_zenoh writes them: QoS in compact form (fields
  equal to rmw_zenoh's defaults left empty; --qos may be explicit, it is rewritten),
  backends sorted and escaped. An endpoint's GID is XXH3-128 of that canonical token.

Roles:
  receive  declare a node and a subscription token (NN, MS) and subscribe to the base
           key; on the new wire also to `<base>/_buf_cpu` (advertising exactly `cpu`)
           or `<base>/_buf/<own GID>` (anything else). Every sample is counted by the
           key it came on (base, buf_cpu, buf_gid) and checked: the 33-byte attachment
           (per publisher GID: sequence numbers increasing, timestamps non-decreasing
           and recent), that the uint8[] field is not in descriptor form, the CDR
           (decoded by rosbags, re-encoded by rosbags and compared byte for byte), the
           fields, and every data byte against the pattern seeded with the sequence
           number. A second arrival of one (GID, sequence number) is an error
           ("duplicate": an rmw_zenoh application would see that message twice).
           Sequence gaps are counted as `lost` (rmw_zenoh's MESSAGE_LOST). With
           --no-gaps (the default on the old and Humble wires) every publisher must
           also number 1, 2, 3... with no gap, and a gap is an error; --allow-gaps
           (the default on the new wire, whose publishers number per put) only counts
           them.
           `gid_matches_token` says whether every GID received is the XXH3-128 of the
           canonical form of an MP token seen in the graph on the topic. --publishers
           (default 1) is the number of publisher GIDs expected.
           -n 0: expect nothing; listen for --timeout seconds, any message is an error.
  publish  declare a node and a publisher token (NN, MP), wait until --wait-subscriptions
           subscription tokens are on the topic, then publish Images or tensors (CDR by
           rosbags, attachment built here); with --inject-bad, also malformed samples on
           the base key that a subscriber must drop and count.
           Old and Humble wires: every message on the base key, numbered per message
           from 1 (Humble: rmw_publisher_data.cpp:189, :296-297 of 0.1.9).
           New wire, as rmw_zenoh 0.12.0's publisher does it: every MS token ever seen
           on the topic (with or without backends; never forgotten) is "discovered";
           one that advertises exactly `cpu` is served on `_buf_cpu`, any other one
           (a token without backends, i.e. every pre-buffer-backends subscription,
           included) on `_buf/<its GID>`. Per message: if the subscriptions now in the
           graph whose QoS is compatible are no more than the discovered ones, the
           message goes once to `_buf_cpu` (if any discovered one is CPU-only) and
           once to each other discovered one's `_buf/<GID>` (none discovered: not sent
           at all); otherwise once to the base key. The sequence number grows per put,
           so a message served on k keys uses k numbers and every receiver sees gaps.
           A consequence, modelled on purpose: a new-wire publisher never reaches an
           old-wire subscription (it is served on a key that subscription does not
           subscribe to).
           Each put carries the pattern seeded with its own sequence number, so that
           receivers can check the data against the attachment they got (rmw_zenoh
           would put the same bytes on every key; no receiver can tell).

Each role prints one JSON line and exits 0 only if every check passed (without the
xxhash package only the old-wire receive role runs, and reports no GIDs of its own).
  receive: role, wire, token, gid, frames, fps, cdr_exact, keys {base, buf_cpu,
           buf_gid}, lost, duplicates, descriptor, gids, gid_matches_token, publishers,
           errors.
  publish: role, wire, token, gid, frames, fps, puts {base, buf_cpu, buf_gid}, unsent,
           last_seq, discovered {GID: buf_cpu | buf_gid}, injected, errors.
"""

import argparse
import json
import queue
import re
import struct
import sys
import threading
import time
from urllib.parse import unquote

import numpy as np
import zenoh
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

try:
    import xxhash
except ImportError:
    # Some machines carry only eclipse-zenoh and rosbags (and numpy): the old-wire
    # receive role still runs there, without GIDs; everything else needs xxhash.
    xxhash = None

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
# Humble's rmw_zenoh writes this where later releases write the type hash.
HUMBLE_TYPE_HASH = "TypeHashNotSupported"
# The wrong hash the bad-input injection uses (a valid RIHS01 shape, not the type's).
WRONG_HASH = "RIHS01_" + "ab" * 32
ADMIN_SPACE = "@ros2_lv"
ENTITY_KINDS = ("NN", "MP", "MS", "SS", "SC")
# Today's QoS of both roles, written explicitly (reliable, volatile, keep all, depth
# 10, automatic liveliness); the tokens carry it in compact form (`::2,10:,:,:,,`).
DEFAULT_QOS = "1:2:2,10:,:,:1,,"
# The first two words of a uint8[] field in descriptor form: the field then names a
# backend and carries that backend's descriptor instead of the bytes.
DESCRIPTOR_MARKER = b"\xff\xff\xff\xff\x32\x53\x4f\x52"

# --- QoS component and canonical tokens -------------------------------------------

# rmw_zenoh's default profile, field by field in token order: reliability (reliable),
# durability (volatile), history (keep last), depth, deadline s/ns, lifespan s/ns,
# liveliness (automatic), lease s/ns. Durations default to RMW_DURATION_INFINITE.
INF_S, INF_NS = 9_223_372_036, 854_775_807
QOS_DEFAULTS = (1, 2, 1, 42, INF_S, INF_NS, INF_S, INF_NS, 1, INF_S, INF_NS)
# The values rmw_zenoh's parser looks up for the enumerations (rmw/types.h; 0 is
# "system default"), by field index; it looks them up by exact text, so "01" fails.
QOS_ENUMS = {0: {0, 1, 2, 3}, 1: {0, 1, 2, 3}, 2: {0, 1, 2, 3}, 8: {0, 1, 3, 4, 5}}
# Humble's rmw has no BEST_AVAILABLE liveliness (5) for its parser to accept.
QOS_ENUMS_HUMBLE = {**QOS_ENUMS, 8: {0, 1, 3, 4}}
RELIABLE, BEST_EFFORT = 1, 2
TRANSIENT_LOCAL, VOLATILE = 1, 2


def parse_qos(s, wire="old"):
    """The 11 QoS values of a token's QoS component (empty fields take rmw_zenoh's
    defaults), or None where the parser of `wire`'s rmw_zenoh refuses it."""
    enums = QOS_ENUMS_HUMBLE if wire == "humble" else QOS_ENUMS
    parts = s.split(":")
    if len(parts) < 6:
        return None
    fields = [parts[0], parts[1]]
    for i, n in ((2, 2), (3, 2), (4, 2), (5, 3)):
        sub = parts[i].split(",")
        if len(sub) < n:
            return None
        fields += sub[:n]
    values = []
    for i, f in enumerate(fields):
        if f == "":
            values.append(QOS_DEFAULTS[i])
            continue
        if not re.fullmatch(r"[0-9]+", f):
            return None
        v = int(f)
        if i in enums and (v not in enums[i] or f != str(v)):
            return None
        values.append(v)
    return tuple(values)


def format_qos(values):
    """The compact QoS component, as rmw_zenoh writes it: defaults left empty."""
    f = ["" if v == d else str(v) for v, d in zip(values, QOS_DEFAULTS)]
    return "{}:{}:{},{}:{},{}:{},{}:{},{},{}".format(*f)


def qos_compatible(pub, sub):
    """Whether a subscription with QoS `sub` matches a publisher with QoS `pub`, for the
    two policies that can refuse a match here: a best-effort publisher cannot serve a
    reliable subscription, nor a volatile publisher a transient-local one."""
    if pub[0] == BEST_EFFORT and sub[0] == RELIABLE:
        return False
    if pub[1] == VOLATILE and sub[1] == TRANSIENT_LOCAL:
        return False
    return True


def _escape(s):
    # `%` first, so that the escapes added after it are not escaped again.
    return s.replace("%", "%25").replace(";", "%3B").replace(":", "%3A").replace("/", "%2F")


def parse_backends(body):
    """{name: metadata} of a backends list (`cpu:;cuda:`, the part after `backends:`).
    Entries split at their first `:`; empty entries and empty names are dropped."""
    out = {}
    for entry in body.split(";"):
        name, _, meta = entry.partition(":")
        name = unquote(name)
        if name:
            out[name] = unquote(meta)
    return out


def backends_chunk(backends):
    """The token's 14th chunk for {name: metadata}, names in byte order, or None when
    there is no backend (the chunk is then left out)."""
    if not backends:
        return None
    names = sorted(backends, key=lambda n: n.encode())
    return "backends:" + ";".join(f"{_escape(n)}:{_escape(backends[n])}" for n in names)


def token_backends(parts):
    """The backends a split token advertises, or None for a token without them."""
    if len(parts) > 13 and parts[13].startswith("backends:"):
        return parse_backends(parts[13][len("backends:") :]) or None
    return None


def canonical_token(token, wire="old"):
    """A token as rmw_zenoh rebuilds it from what it parsed (and then hashes): domain
    as a plain number, QoS in compact form, backends re-sorted and re-escaped, a 14th
    chunk without any backend (or not starting with `backends:`) and later chunks
    dropped. On Humble's wire every chunk after the 13th is dropped. None for a token
    rmw_zenoh refuses."""
    p = token.split("/")
    if len(p) < 9 or p[0] != ADMIN_SPACE or any(not x for x in p) or p[5] not in ENTITY_KINDS:
        return None
    if not re.fullmatch(r"[0-9]+", p[1]):
        return None
    out = [ADMIN_SPACE, str(int(p[1]))] + p[2:9]
    if p[5] == "NN":
        return "/".join(out)
    if len(p) < 13:
        return None
    qos = parse_qos(p[12], wire)
    if qos is None:
        return None
    out += p[9:12] + [format_qos(qos)]
    if wire == "humble":
        return "/".join(out)
    chunk = backends_chunk(token_backends(p))
    if chunk:
        out.append(chunk)
    return "/".join(out)


def hash_token(s):
    """XXH3-128 (seed 0) of a token: low 64 bits, then high 64 bits, little-endian."""
    if xxhash is None:
        raise RuntimeError("GIDs need the xxhash package (tests/python/requirements.txt)")
    return xxhash.xxh3_128_intdigest(s.encode()).to_bytes(16, "little")


def gid_of(token, wire="old"):
    """The GID that `wire`'s rmw_zenoh gives the entity a token declares."""
    return hash_token(canonical_token(token, wire) or token)


# --- names and keys ---------------------------------------------------------------


def typestore(wire="old"):
    ts = get_typestore(Stores.ROS2_HUMBLE if wire == "humble" else Stores.ROS2_JAZZY)
    ts.register(get_types_from_msg(TENSOR_MSG, TENSOR))
    return ts


def dds_name(type_name):
    pkg, kind, name = type_name.split("/")
    return f"{pkg}::{kind}::dds_::{name}_"


def type_hash_text(wire, type_name):
    """What `wire`'s rmw_zenoh writes for the type's hash in keys and tokens."""
    return HUMBLE_TYPE_HASH if wire == "humble" else HASHES[type_name]


def data_key(domain, topic, type_name, type_hash=None):
    t = topic[1:] if topic.startswith("/") else topic
    t = t[:-1] if t.endswith("/") else t
    return f"{domain}/{t}/{dds_name(type_name)}/{type_hash or HASHES[type_name]}"


def mangle(s):
    return s.replace("/", "%")


def endpoint_token(domain, zid, nid, eid, kind, node, topic, type_name, qos, backends=None, type_hash=None):
    """An endpoint token in canonical form (root namespace and enclave); `type_hash`:
    the hash text (default: the type's RIHS01 hash)."""
    tok = (
        f"{ADMIN_SPACE}/{domain}/{zid}/{nid}/{eid}/{kind}/%/%/{node}/{mangle(topic)}/"
        f"{dds_name(type_name)}/{type_hash or HASHES[type_name]}/{format_qos(qos)}"
    )
    chunk = backends_chunk(backends)
    return f"{tok}/{chunk}" if chunk else tok


def buf_cpu_key(key):
    return f"{key}/_buf_cpu"


def buf_gid_key(key, gid):
    return f"{key}/_buf/{gid.hex()}"


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


def token_key(parts):
    """The data key of a split endpoint token."""
    t = parts[9].replace("%", "/")
    t = t[1:] if t.startswith("/") else t
    t = t[:-1] if t.endswith("/") else t
    return f"{parts[1]}/{t}/{parts[10]}/{parts[11]}"


class Graph:
    """Graph tokens of the domain: those alive now, and every one ever seen (in order
    of arrival), since rmw_zenoh's buffer-aware publishers never forget a subscription
    they discovered."""

    def __init__(self, session, domain):
        self.lock = threading.Lock()
        self.tokens = set()
        self.seen = []
        self._seen = set()
        self.sub = session.liveliness().declare_subscriber(f"{ADMIN_SPACE}/{domain}/**", self._on, history=True)

    def _on(self, sample):
        k = str(sample.key_expr)
        with self.lock:
            if sample.kind == zenoh.SampleKind.PUT:
                self.tokens.add(k)
                if k not in self._seen:
                    self._seen.add(k)
                    self.seen.append(k)
            else:
                self.tokens.discard(k)

    def endpoints(self, kind, key, ever=False):
        with self.lock:
            toks = list(self.seen) if ever else sorted(self.tokens)
        out = []
        for tok in toks:
            p = tok.split("/")
            if len(p) >= 13 and p[5] == kind and token_key(p) == key:
                out.append(tok)
        return out


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


def data_field_offset(payload, type_name):
    """Where the uint8[] field's first word lies in an XCDR1 payload, found by walking
    the fields before it (alignment counts from the byte after the 4-byte header);
    None for a payload too short to hold them."""
    body = memoryview(payload)[4:]
    pos = 0

    def align(n):
        nonlocal pos
        pos = (pos + n - 1) // n * n

    def u32():
        nonlocal pos
        align(4)
        (v,) = struct.unpack_from("<I", body, pos)
        pos += 4
        return v

    try:
        if type_name == IMAGE:
            pos += 8  # header.stamp: int32 sec, uint32 nanosec
            n = u32()  # header.frame_id (read first: u32 moves `pos`)
            pos += n
            u32()  # height
            u32()  # width
            n = u32()  # encoding
            pos += n
            pos += 1  # is_bigendian
            u32()  # step
        else:
            pos += 4  # dtype_code, dtype_bits, dtype_lanes
            for _ in range(2):  # shape, strides: int64[]
                n = u32()
                if n:
                    align(8)
                    pos += 8 * n
            align(8)
            pos += 8  # byte_offset
        align(4)
    except struct.error:
        return None
    return 4 + pos if 4 + pos + 4 <= len(payload) else None


def receive(args):
    type_name = IMAGE if args.type == "image" else TENSOR
    qos = parse_qos(args.qos, args.wire)
    if qos is None:
        print(json.dumps({"role": "peer_receive", "errors": [f"bad --qos {args.qos}"]}), flush=True)
        return 1
    # Buffer-aware (new wire, volatile): the token lists the accepted backends.
    buffer_aware = args.wire == "new" and qos[1] != TRANSIENT_LOCAL
    backends = parse_backends(args.backends) if buffer_aware else None
    strict = args.no_gaps if args.no_gaps is not None else args.wire != "new"
    ts = typestore(args.wire)
    pattern = Pattern()
    session = open_session(args)
    hash_text = type_hash_text(args.wire, type_name)
    key = data_key(args.domain, args.topic, type_name, hash_text)
    graph = Graph(session, args.domain)
    zid = str(session.zid())
    node = f"{ADMIN_SPACE}/{args.domain}/{zid}/0/0/NN/%/%/{args.node}"
    ms = endpoint_token(args.domain, zid, 0, 1, "MS", args.node, args.topic, type_name, qos, backends, hash_text)
    gid = gid_of(ms, args.wire) if xxhash or buffer_aware else None
    keys = {"base": key}
    if buffer_aware:
        if backends and set(backends) == {"cpu"}:
            keys["buf_cpu"] = buf_cpu_key(key)
        else:
            keys["buf_gid"] = buf_gid_key(key, gid)
    q = queue.Queue(maxsize=4)  # a full queue blocks Zenoh's delivery: back-pressure, not memory
    stop = threading.Event()

    def on_sample(kind):
        def callback(s):
            item = (kind, s.payload.to_bytes(), s.attachment)
            # Block while the checks run behind, but not once they are over: a callback
            # stuck on a full queue would keep the subscriber from being undeclared.
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return
                except queue.Full:
                    pass

        return callback

    # Data subscribers before the token: whoever sees the token can already reach us.
    subs = [session.declare_subscriber(k, on_sample(kind)) for kind, k in keys.items()]
    node_tok = session.liveliness().declare_token(node)
    ms_tok = session.liveliness().declare_token(ms)
    print(f"peer: subscribed to {sorted(keys.values())} as {ms}", file=sys.stderr, flush=True)

    got, cdr_exact, lost, duplicates, descriptor = 0, 0, 0, 0, 0
    errors = []
    per_key = {"base": 0, "buf_cpu": 0, "buf_gid": 0}
    last = {}  # GID -> (last sequence number, last timestamp)
    seen = set()  # (GID, sequence number) of every message received
    gids = []

    def handle(kind, payload, att):
        """Checks one sample; returns whether it was a message not seen before."""
        nonlocal cdr_exact, lost, duplicates, descriptor
        per_key[kind] += 1
        if att is None:
            errors.append(f"sample on {kind}: no attachment")
            return True
        a = att.to_bytes()
        if len(a) != 33 or a[16] != 0x10:
            errors.append(f"sample on {kind}: attachment {a.hex()}")
            return True
        seq, stamp = struct.unpack_from("<qq", a, 0)
        g = a[17:].hex()
        if (g, seq) in seen:
            duplicates += 1
            errors.append(f"message {seq} from {g}: duplicate (again on {kind})")
            return False
        seen.add((g, seq))
        if g not in last:
            gids.append(g)
            if strict and seq != 1:
                errors.append(f"first sequence {seq} from {g}")
        else:
            last_seq, last_ts = last[g]
            if seq <= last_seq:
                errors.append(f"sequence {seq} after {last_seq} from {g}")
            elif seq > last_seq + 1:
                lost += seq - last_seq - 1
                if strict:
                    errors.append(f"sequence {seq} after {last_seq} from {g}: gap")
            if stamp < last_ts:
                errors.append(f"timestamp {stamp} after {last_ts} from {g}")
        if abs(stamp - time.time_ns()) > 120e9:
            errors.append(f"message {seq}: timestamp {stamp} not recent")
        last[g] = (max(seq, last.get(g, (0, 0))[0]), stamp)
        if payload[:4] != b"\x00\x01\x00\x00":
            errors.append(f"message {seq}: encapsulation {payload[:4].hex()}")
        off = data_field_offset(payload, type_name)
        if off is not None and payload[off : off + 8] == DESCRIPTOR_MARKER:
            descriptor += 1
            errors.append(f"message {seq} on {kind}: data in descriptor form")
            return True
        try:
            msg = ts.deserialize_cdr(payload, type_name)
        except Exception as e:  # noqa: BLE001 - any decoder error fails the check
            errors.append(f"message {seq}: rosbags cannot decode: {e}")
            return True
        data = np.asarray(msg.data, dtype=np.uint8)
        if not fields_ok(args, type_name, msg, data.size):
            errors.append(f"message {seq}: fields {msg!r:.200}")
            return True
        bad = int(np.count_nonzero(data != pattern(data.size, seq)))
        if bad:
            errors.append(f"message {seq}: {bad} data bytes differ")
        if bytes(ts.serialize_cdr(msg, type_name)) == payload:
            cdr_exact += 1
        else:
            errors.append(f"message {seq}: rosbags re-encodes it differently")
        return True

    t_first = None
    deadline = time.monotonic() + args.timeout
    # -n 0: listen until the deadline (expecting nothing); otherwise until n messages.
    while args.frames == 0 or got < args.frames:
        try:
            item = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            if args.frames:
                errors.append(f"timeout after {got} messages")
            break
        t_first = t_first or time.monotonic()
        got += handle(*item)
    secs = time.monotonic() - t_first if t_first else 0.0
    # Whatever arrives within a grace period is checked too: a repeat is a duplicate,
    # anything else is one message more than the publishers sent.
    grace = time.monotonic() + 0.3
    extra = 0
    while (left := grace - time.monotonic()) > 0:
        try:
            extra += handle(*q.get(timeout=left))
        except queue.Empty:
            break
    if got + extra > args.frames:
        errors.append(f"{got + extra - args.frames} messages beyond the {args.frames} expected")
    if args.frames and len(gids) != args.publishers:
        errors.append(f"{len(gids)} GIDs, expected {args.publishers}")
    publishers = graph.endpoints("MP", key, ever=True)
    known = {gid_of(t, args.wire).hex() for t in publishers} if xxhash else None
    stop.set()
    del subs, ms_tok, node_tok
    print(
        json.dumps(
            {
                "role": "peer_receive",
                "wire": args.wire,
                "token": ms,
                "gid": gid.hex() if gid else None,
                "frames": got,
                "fps": round((got - 1) / secs, 2) if got > 1 and secs > 0 else 0.0,
                "cdr_exact": cdr_exact,
                "keys": per_key,
                "lost": lost,
                "duplicates": duplicates,
                "descriptor": descriptor,
                "gids": sorted(gids),
                "gid_matches_token": all(g in known for g in gids) if gids and known is not None else None,
                "publishers": publishers,
                "errors": errors[:20],
            }
        ),
        flush=True,
    )
    session.close()
    return 0 if not errors else 1


def image(ts, args, data):
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


def tensor(ts, args, data):
    return ts.types[TENSOR](
        dtype_code=2,
        dtype_bits=32,
        dtype_lanes=1,
        shape=np.array([args.height, args.width], dtype=np.int64),
        strides=np.array([], dtype=np.int64),
        byte_offset=0,
        data=data,
    )


def plan_puts(discovered, total_matched):
    """Where rmw_zenoh 0.12.0's buffer-aware publisher puts one message, in order:
    a list of "base", "buf_cpu" or a subscription's GID (its `_buf/<GID>` key).
    `discovered` maps the GID of every subscription ever discovered to True if it
    advertises exactly `cpu`; `total_matched` counts the QoS-compatible subscriptions
    in the graph now."""
    if total_matched > len(discovered):
        return ["base"]
    puts = ["buf_cpu"] if any(discovered.values()) else []
    return puts + [g for g, cpu in discovered.items() if not cpu]


def publish(args):
    type_name = IMAGE if args.type == "image" else TENSOR
    make = image if type_name == IMAGE else tensor
    qos = parse_qos(args.qos, args.wire)
    if qos is None:
        print(json.dumps({"role": "peer_publish", "errors": [f"bad --qos {args.qos}"]}), flush=True)
        return 1
    buffer_aware = args.wire == "new" and qos[1] != TRANSIENT_LOCAL
    backends = parse_backends(args.backends) if buffer_aware else None
    ts = typestore(args.wire)
    pattern = Pattern()
    session = open_session(args)
    hash_text = type_hash_text(args.wire, type_name)
    key = data_key(args.domain, args.topic, type_name, hash_text)
    graph = Graph(session, args.domain)
    zid = str(session.zid())
    node = f"{ADMIN_SPACE}/{args.domain}/{zid}/0/0/NN/%/%/{args.node}"
    mp = endpoint_token(args.domain, zid, 0, 1, "MP", args.node, args.topic, type_name, qos, backends, hash_text)
    gid = gid_of(mp, args.wire)
    opts = dict(congestion_control=zenoh.CongestionControl.BLOCK, reliability=zenoh.Reliability.RELIABLE)
    pubs = {"base": session.declare_publisher(key, **opts)}
    if buffer_aware:
        # rmw_zenoh declares the CPU group's publisher with the endpoint.
        pubs["buf_cpu"] = session.declare_publisher(buf_cpu_key(key), **opts)
    node_tok = session.liveliness().declare_token(node)
    mp_tok = session.liveliness().declare_token(mp)
    print(f"peer: publishing on {key} as {mp}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.timeout
    while len(graph.endpoints("MS", key)) < args.wait_subscriptions:
        if time.monotonic() > deadline:
            print(json.dumps({"role": "peer_publish", "errors": ["no subscription appeared"]}), flush=True)
            return 1
        time.sleep(0.02)
    time.sleep(0.3)  # let the subscriptions' data subscribers be routed too
    injected = {"no_attachment": 0, "bad_attachment": 0, "bad_cdr": 0, "wrong_hash": 0}
    base = pubs["base"]

    def inject(k):
        bad_gid = hash_token("bad" + mp)
        good = bytes(ts.serialize_cdr(make(ts, args, pattern(args.width * args.height * 4, 99)), type_name))
        att = lambda s: struct.pack("<qq", s, time.time_ns()) + b"\x10" + bad_gid  # noqa: E731
        base.put(good)  # no attachment
        base.put(good, attachment=att(1000 + k)[:32])  # 32 bytes
        base.put(good, attachment=att(1001 + k)[:16] + b"\x08" + bad_gid)  # GID length 8
        injected["no_attachment"] += 1
        injected["bad_attachment"] += 2
        base.put(good[: len(good) // 2], attachment=att(1002 + k))  # truncated CDR
        base.put(b"\x00\x02\x00\x00" + good[4:], attachment=att(1003 + k))  # unknown encapsulation
        injected["bad_cdr"] += 2
        session.put(data_key(args.domain, args.topic, type_name, WRONG_HASH), good, attachment=att(1004 + k))
        injected["wrong_hash"] += 1

    # GID -> whether that subscription advertises exactly `cpu`, in discovery order.
    discovered = {}

    def targets():
        with graph.lock:
            now, ever = list(graph.tokens), list(graph.seen)
        for tok in ever:
            p = tok.split("/")
            if len(p) >= 13 and p[5] == "MS" and token_key(p) == key:
                g = gid_of(tok)
                if g not in discovered:
                    b = token_backends(p)
                    discovered[g] = b is not None and set(b) == {"cpu"}
                    if not discovered[g]:
                        pubs[g] = session.declare_publisher(buf_gid_key(key, g), **opts)
        total = 0
        for tok in now:
            p = tok.split("/")
            if len(p) >= 13 and p[5] == "MS" and token_key(p) == key:
                sub_qos = parse_qos(p[12])
                total += sub_qos is not None and qos_compatible(qos, sub_qos)
        return plan_puts(discovered, total)

    puts = {"base": 0, "buf_cpu": 0, "buf_gid": 0}
    seq, unsent = 0, 0
    n = args.width * args.height * 4
    t0 = time.monotonic()
    for i in range(1, args.frames + 1):
        if args.inject_bad and i in (1, args.frames // 2 + 1):
            inject(i * 10)
        plan = targets() if buffer_aware else ["base"]
        if not plan:
            unsent += 1
        for target in plan:
            # rmw_zenoh numbers every put, not every message.
            seq += 1
            payload = bytes(ts.serialize_cdr(make(ts, args, pattern(n, seq)), type_name))
            att = struct.pack("<qq", seq, time.time_ns()) + b"\x10" + gid
            pubs[target].put(payload, attachment=att)
            puts[target if isinstance(target, str) else "buf_gid"] += 1
        if args.rate > 0:
            time.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))
    secs = time.monotonic() - t0
    time.sleep(0.5)
    del mp_tok, node_tok
    pubs.clear()
    print(
        json.dumps(
            {
                "role": "peer_publish",
                "wire": args.wire,
                "token": mp,
                "gid": gid.hex(),
                "frames": args.frames,
                "fps": round(args.frames / secs, 2) if secs > 0 else 0.0,
                "puts": puts,
                "unsent": unsent,
                "last_seq": seq,
                "discovered": {g.hex(): "buf_cpu" if cpu else "buf_gid" for g, cpu in discovered.items()},
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
    ap.add_argument(
        "--wire", choices=["old", "new", "humble"], default="old",
        help="before or after rmw_zenoh's buffer backends, or Humble's (0.1.2 and later)",
    )
    ap.add_argument("--backends", default="cpu:", help="new wire: the token's backends (`cpu:`, `cuda:`, ...)")
    ap.add_argument("--qos", default=DEFAULT_QOS, help="QoS component (explicit or compact; the token has it compact)")
    ap.add_argument("-n", "--frames", type=int, default=10)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--height", type=int, default=48)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--inject-bad", action="store_true")
    ap.add_argument("--wait-subscriptions", type=int, default=1, help="publish: subscriptions to wait for")
    ap.add_argument("--publishers", type=int, default=1, help="receive: distinct publisher GIDs expected")
    gaps = ap.add_mutually_exclusive_group()
    gaps.add_argument("--no-gaps", dest="no_gaps", action="store_const", const=True, default=None,
                      help="receive: numbering 1, 2, 3... per publisher required (default on the old and Humble wires)")
    gaps.add_argument("--allow-gaps", dest="no_gaps", action="store_const", const=False,
                      help="receive: gaps only counted as lost (default on the new wire)")
    args = ap.parse_args()
    return receive(args) if args.role == "receive" else publish(args)


if __name__ == "__main__":
    sys.exit(main())
