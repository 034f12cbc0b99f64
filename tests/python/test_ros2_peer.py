"""zenoh-cuda-shm's ROS 2 examples against an independent rmw_zenoh peer (ros2_peer.py,
eclipse-zenoh + rosbags + xxhash), over loopback TCP on a free port, no multicast
scouting, with host-memory blocks (the same protocol as on a GPU; see
tests/tests/ros2_stream.rs, which runs the same stream on host memory and on a GPU).

Every message is checked by whoever receives it (pixels, fields, attachment sequence
numbers / timestamps / GID, CDR byte-exact against rosbags); each test then checks the
counters both sides print.

The peer speaks three wires: `old` (rmw_zenoh before buffer backends), `new` (rmw_zenoh
0.12.0 / 0.10.5: a `backends:` token chunk, `_buf_cpu` and `_buf/<GID>` keys, sequence
numbers per put) and `humble` (rmw_zenoh 0.1.2 - 0.1.9: the old wire with
`TypeHashNotSupported` in place of the type hash; our examples speak it with
ROS_DISTRO=humble). The tests named `test_peer_*` check the peer's wire model and run the
peer against itself, without our binaries (`pytest -k test_peer_`); the others run it
against our examples.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ros2_peer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(__file__).with_name("ros2_peer.py")
TIMEOUT = 120
# Processes a test started: any still running when it ends (a failed test) are killed.
STARTED = []


@pytest.fixture(autouse=True)
def reap():
    yield
    while STARTED:
        p = STARTED.pop()
        if p.poll() is None:
            p.kill()
            p.communicate()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def examples():
    """The example binaries (built here if needed; a no-op after `cargo test`)."""
    subprocess.run(
        ["cargo", "build", "-q", "--locked", "-p", "zcs-examples", "--examples"], cwd=ROOT, check=True
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "examples"


def zcs(examples, name, port, *args, listen=False, distro=None):
    """One of our examples; `distro`: its ROS_DISTRO (which picks its rmw_zenoh wire)."""
    endpoint = ["-l" if listen else "-e", f"tcp/127.0.0.1:{port}"]
    cmd = [str(examples / name), "--no-multicast-scouting", "--device", "host", *endpoint, *map(str, args)]
    env = None if distro is None else {**os.environ, "ROS_DISTRO": distro}
    STARTED.append(
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    )
    return STARTED[-1]


def peer(role, port, *args, listen=True):
    endpoint = ["-l" if listen else "-e", f"tcp/127.0.0.1:{port}"]
    cmd = [sys.executable, str(PEER), role, *endpoint, *map(str, args)]
    STARTED.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
    return STARTED[-1]


def result(proc, role):
    """The process's JSON line with `role`, after checking it exited 0, and its stdout."""
    line, out, _ = result_err(proc, role)
    return line, out


def result_err(proc, role):
    """As `result`, with its stderr too."""
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, f"{role} exited {proc.returncode}\n{out}\n{err}"
    for line in out.splitlines():
        if line.startswith("{") and f'"{role}"' in line:
            return json.loads(line), out, err
    raise AssertionError(f"no {role} line in:\n{out}\n{err}")


def publisher_gid(out):
    return next(line.rsplit(" gid ", 1)[1] for line in out.splitlines() if line.startswith("[ros2] publishing"))


def test_image_from_us_to_peer_and_our_subscriber(examples):
    """Our publisher, the Python peer (an ordinary ROS subscriber: CDR on the base key)
    and our subscriber (our channel) on one topic: both receive every frame, once."""
    port, n = free_port(), 30
    rx = peer("receive", port, "-n", n, "--width", 320, "--height", 240)
    sub = zcs(examples, "ros2_image_sub", port, "-n", n)
    pub = zcs(examples, "ros2_image_pub", port, "-n", n, "--width", 320, "--height", 240, "--wait-subscriptions", 2)
    p, pub_out = result(pub, "ros2_pub")
    r, _ = result(rx, "peer_receive")
    s, _ = result(sub, "ros2_sub")
    assert r["errors"] == [] and r["frames"] == n and r["cdr_exact"] == n
    assert r["gids"] == [publisher_gid(pub_out)]
    assert any("/MP/%/%/zcs_image_pub/%camera%image/" in t for t in r["publishers"])
    assert p["base_puts"] == n and p["ordinary_subscriptions"] == 1
    # Our subscriber: every frame once, through our channel or the base key, whichever
    # copy came first; the other copy dropped as a duplicate. Every channel frame's base
    # copy comes; a frame first taken from the base key has a channel copy too unless it
    # was put before the publisher knew of the channel (so n - base to n duplicates): a
    # first block's import on a busy machine can let the base copy win although both
    # were sent.
    assert s["frames"] == n and s["extra"] == 0 and s["gaps"] == 0 and s["disorder"] == 0
    assert s["channel"] + s["base"] == n and s["channel"] >= n - 2
    assert n - s["base"] <= s["duplicates"] <= n
    assert s["bad_attachment"] == s["bad_cdr"] == s["bad_envelope"] == 0


def test_no_base_key_copy_without_ordinary_subscribers(examples):
    port, n = free_port(), 20
    sub = zcs(examples, "ros2_image_sub", port, "-n", n, listen=True)
    pub = zcs(
        examples, "ros2_image_pub", port, "-n", n, "--width", 64, "--height", 64, "--wait-subscriptions", 1,
        "--wait-zero-copy", 1,
    )
    p, _ = result(pub, "ros2_pub")
    s, _ = result(sub, "ros2_sub")
    assert p["base_puts"] == 0 and p["ordinary_subscriptions"] == 0 and p["zero_copy_subscribers"] == 1
    assert s["frames"] == n and s["channel"] == n and s["base"] == 0 and s["duplicates"] == 0
    assert s["paths"] == {"zero-copy": n} and s["path_reasons"] == {"zero-copy": ""}


def test_image_from_peer_to_us_with_malformed_samples(examples):
    """The peer publishes Images (and malformed samples around them); our subscriber
    decodes every frame and drops and counts each malformed sample."""
    port, n = free_port(), 24
    sub = zcs(examples, "ros2_image_sub", port, "-n", n, listen=True)
    tx = peer("publish", port, "-n", n, "--width", 200, "--height", 100, "--inject-bad", listen=False)
    t, _ = result(tx, "peer_publish")
    s, _ = result(sub, "ros2_sub")
    inj = t["injected"]
    assert s["frames"] == n and s["bad"] == 0 and s["gaps"] == 0 and s["extra"] == 0
    assert s["base"] == n and s["paths"] == {"plain": n}
    assert "rmw_zenoh publisher" in s["path_reasons"]["plain"]
    assert s["bad_attachment"] == inj["no_attachment"] + inj["bad_attachment"] == 6
    assert s["bad_cdr"] == inj["bad_cdr"] == 4
    assert inj["wrong_hash"] == 2  # on another key: never received (frames and extra above)


def test_tensor_from_us_to_peer_and_our_subscriber(examples):
    port, n = free_port(), 12
    rx = peer("receive", port, "--type", "tensor", "--topic", "/tensor", "-n", n, "--width", 33, "--height", 7)
    sub = zcs(examples, "ros2_tensor_sub", port, "-n", n)
    pub = zcs(examples, "ros2_tensor_pub", port, "-n", n, "--width", 33, "--height", 7, "--wait-subscriptions", 2)
    p, pub_out = result(pub, "ros2_pub")
    r, _ = result(rx, "peer_receive")
    s, _ = result(sub, "ros2_sub")
    assert r["errors"] == [] and r["frames"] == n and r["cdr_exact"] == n
    assert r["gids"] == [publisher_gid(pub_out)]
    assert s["frames"] == n and s["extra"] == 0 and s["channel"] + s["base"] == n


@pytest.mark.parametrize("distro", [None, "humble"])
def test_transient_local_late_subscriber_gets_the_last_depth_messages(examples, distro):
    """TRANSIENT_LOCAL: a subscriber that joins after the last publish still receives
    the last `depth` messages (from the publication cache on the base key), on the
    default wire and on Humble's."""
    port, n, depth = free_port(), 15, 5
    pub = zcs(
        examples, "ros2_image_pub", port, "-n", n, "--width", 32, "--height", 8, "--qos", "transient",
        "--depth", depth, "--linger", 15, listen=True, distro=distro,
    )
    # Wait until the publisher is done publishing (its JSON line comes before the linger).
    for line in pub.stdout:
        if '"ros2_pub"' in line:
            assert json.loads(line)["base_puts"] == n
            break
    sub = zcs(examples, "ros2_image_sub", port, "-n", depth, "--qos", "transient", "--depth", depth, distro=distro)
    s, sub_out = result(sub, "ros2_sub")
    pub.kill()
    pub.wait()
    assert s["frames"] == depth and s["base"] == depth and s["extra"] == 0 and s["gaps"] == 0
    assert ("/TypeHashNotSupported'" in sub_out) == (distro == "humble"), sub_out


# --- the peer's wire model, without processes ---------------------------------------

P = "@ros2_lv/0/aac3178e146ba6f1fc6e6a4085e77f21/0"
H = "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47"
MP = f"{P}/5/MP/%/%/camera_driver/%camera%image/sensor_msgs::msg::dds_::Image_/{H}/::,10:,:,:,,"
MS = f"{P}/7/MS/%/%/viewer/%camera%image/sensor_msgs::msg::dds_::Image_/{H}/2::,5:,:,:,,"


@pytest.mark.parametrize(
    "token, gid",
    [
        (MP, "e9975392dbe9f91f7b4d3e837baae760"),
        (MP + "/backends:cpu:;cuda:", "08be57d0cd6dd8ba72537dbbe96ebe4c"),
        (MP + "/backends:cpu:", "ddced2a886bf5d0fdb670f7d4cbced9e"),
        (MS, "f2eeca687e7b86a00735368f2fc22bd3"),
        (MS + "/backends:cpu:", "6dfd10e4cc60941304adbc26e928d5e9"),
        (MS + "/backends:cuda:", "1b123fed7b70ed905028346b9ef66e25"),
        # Explicit QoS: rmw_zenoh hashes its compact rebuild, i.e. the token above.
        (MS.replace("/2::,5:,:,:,,", "/2:2:1,5:,:,:1,,"), "f2eeca687e7b86a00735368f2fc22bd3"),
        # Backends out of order: rmw_zenoh sorts them before hashing.
        (MP + "/backends:cuda:;cpu:", "08be57d0cd6dd8ba72537dbbe96ebe4c"),
    ],
)
def test_peer_gids_of_the_worked_example(token, gid):
    assert ros2_peer.gid_of(token).hex() == gid


# The worked example on Humble's wire (docs/ros2-humble.md): only the hash chunk differs.
MP_HUMBLE = MP.replace(H, "TypeHashNotSupported")


def test_peer_humble_wire_names():
    """Humble's data key, token and GID of the worked example, written from the 0.1.9
    sources: `TypeHashNotSupported` for the hash, nothing after the 13th chunk, no
    BEST_AVAILABLE liveliness."""
    assert ros2_peer.type_hash_text("humble", ros2_peer.IMAGE) == "TypeHashNotSupported"
    assert ros2_peer.type_hash_text("old", ros2_peer.IMAGE) == H
    key = ros2_peer.data_key(0, "/camera/image", ros2_peer.IMAGE, ros2_peer.type_hash_text("humble", ros2_peer.IMAGE))
    assert key == "0/camera/image/sensor_msgs::msg::dds_::Image_/TypeHashNotSupported"
    qos = ros2_peer.parse_qos("::,10:,:,:,,", "humble")
    tok = ros2_peer.endpoint_token(
        0, "aac3178e146ba6f1fc6e6a4085e77f21", 0, 5, "MP", "camera_driver", "/camera/image", ros2_peer.IMAGE, qos,
        type_hash="TypeHashNotSupported",
    )
    assert tok == MP_HUMBLE
    assert ros2_peer.token_key(tok.split("/")) == key
    assert ros2_peer.gid_of(MP_HUMBLE, "humble").hex() == "2e31dda785253c05d87f8406c5186be4"
    c = ros2_peer.canonical_token
    assert c(MP_HUMBLE + "/backends:cpu:", "humble") == MP_HUMBLE  # Humble reads 13 chunks
    assert c(MP_HUMBLE + "/backends:cpu:", "old") == MP_HUMBLE + "/backends:cpu:"
    assert c(MP_HUMBLE.replace("/::,10:,:,:,,", "/::,10:,:,:5,,"), "humble") is None
    assert c(MP_HUMBLE.replace("/::,10:,:,:,,", "/::,10:,:,:5,,"), "old") is not None


def test_peer_canonical_tokens():
    c = ros2_peer.canonical_token
    assert c(MS.replace("/2::,5:,:,:,,", "/2:2:1,5:,:,:1,,")) == MS
    assert c(MP + "/backends:cuda:;cpu:") == MP + "/backends:cpu:;cuda:"
    assert c(MP + "/backends:") == MP  # lists no backend: dropped
    assert c(MP + "/backends:;cpu:") == MP + "/backends:cpu:"  # empty entries dropped
    assert c(MP + "/other") == MP  # a 14th chunk that is not a backends list is ignored
    assert c(MP + "/backends:cpu:/more") == MP + "/backends:cpu:"  # later chunks too
    assert c(MP + "/backends:a%3ab:x%2fy%3B%25") == MP + "/backends:a%3Ab:x%2Fy%3B%25"  # upper-case hex
    assert c(f"{P}/0/NN/%/%/camera_driver") == f"{P}/0/NN/%/%/camera_driver"
    assert c(MP.replace("/::,10:", "/01::,10:")) is None  # rmw_zenoh looks enums up by exact text
    assert c(MP.rsplit("/", 1)[0]) is None  # 12 chunks: no QoS
    q = ros2_peer.parse_qos
    assert ros2_peer.format_qos(q("1:2:1,10:,:,:1,,")) == "::,10:,:,:,,"
    assert ros2_peer.format_qos(q("1:1:1,5:,:,:1,,")) == ":1:,5:,:,:,,"
    assert ros2_peer.format_qos(q(ros2_peer.DEFAULT_QOS)) == "::2,10:,:,:,,"
    assert ros2_peer.format_qos(q("::,:9223372036,854775807:1,0:,,")) == "::,:,:1,0:,,"


def test_peer_publisher_routing_rule():
    plan = ros2_peer.plan_puts
    assert plan({}, 0) == []  # nothing discovered: not sent at all
    assert plan({}, 1) == ["base"]  # a match not yet discovered: the base key
    assert plan({b"c": True, b"g": False, b"h": False}, 3) == ["buf_cpu", b"g", b"h"]
    assert plan({b"c": True, b"d": True}, 1) == ["buf_cpu"]  # one put serves every CPU-only one
    assert plan({b"g": False}, 1) == [b"g"]  # a legacy subscription: its own `_buf/<GID>`
    assert plan({b"g": False}, 2) == ["base"]
    ok = ros2_peer.qos_compatible
    pq = ros2_peer.parse_qos
    assert not ok(pq("2::,5:,:,:,,"), pq("::,5:,:,:,,"))  # best effort -> reliable
    assert ok(pq("::,5:,:,:,,"), pq("2::,5:,:,:,,"))  # reliable -> best effort
    assert not ok(pq("::,5:,:,:,,"), pq(":1:,5:,:,:,,"))  # volatile -> transient local
    assert ok(pq(":1:,5:,:,:,,"), pq("::,5:,:,:,,"))


def test_peer_descriptor_form_is_recognised():
    ts = ros2_peer.typestore()

    class A:
        width, height = 8, 2

    for make, name in ((ros2_peer.image, ros2_peer.IMAGE), (ros2_peer.tensor, ros2_peer.TENSOR)):
        cdr = bytes(ts.serialize_cdr(make(ts, A, ros2_peer.Pattern()(64, 1)), name))
        off = ros2_peer.data_field_offset(cdr, name)
        assert cdr[off : off + 4] == (64).to_bytes(4, "little") and len(cdr) == off + 4 + 64
        forged = cdr[:off] + ros2_peer.DESCRIPTOR_MARKER + b"\x05\x00\x00\x00cuda\x00"
        assert ros2_peer.data_field_offset(forged, name) == off


# --- the peer against itself ---------------------------------------------------------


def test_peer_old_wire_to_old_wire():
    port, n = free_port(), 15
    rx = peer("receive", port, "-n", n, "--timeout", 30)
    tx = peer("publish", port, "-n", n, listen=False)
    t, _ = result(tx, "peer_publish")
    r, _ = result(rx, "peer_receive")
    assert "/backends:" not in t["token"] and "/backends:" not in r["token"]
    assert t["puts"] == {"base": n, "buf_cpu": 0, "buf_gid": 0} and t["last_seq"] == n
    assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n and r["lost"] == 0
    assert r["keys"] == {"base": n, "buf_cpu": 0, "buf_gid": 0}
    assert r["gids"] == [t["gid"]] and r["gid_matches_token"] is True
    assert t["gid"] == ros2_peer.gid_of(t["token"]).hex() and t["token"] == ros2_peer.canonical_token(t["token"])


@pytest.mark.parametrize("kind", ["image", "tensor"])
def test_peer_new_publisher_to_cpu_and_cuda_receivers(kind):
    """A CPU-only receiver gets every message on `_buf_cpu`, a `cuda:` one on its own
    `_buf/<GID>`; the publisher numbers per put, so each sees every other number."""
    port, n = free_port(), 12
    common = ["--type", kind, "--width", 40, "--height", 6, "--timeout", 30]
    cpu = peer("receive", port, "--wire", "new", "-n", n, *common)
    cuda = peer("receive", port, "--wire", "new", "--backends", "cuda:", "-n", n, *common, listen=False)
    tx = peer("publish", port, "--wire", "new", "-n", n, "--wait-subscriptions", 2, *common, listen=False)
    t, _ = result(tx, "peer_publish")
    c, _ = result(cpu, "peer_receive")
    g, _ = result(cuda, "peer_receive")
    assert t["token"].endswith("/backends:cpu:") and c["token"].endswith("/backends:cpu:")
    assert g["token"].endswith("/backends:cuda:")
    assert t["puts"] == {"base": 0, "buf_cpu": n, "buf_gid": n} and t["last_seq"] == 2 * n and t["unsent"] == 0
    assert t["discovered"] == {c["gid"]: "buf_cpu", g["gid"]: "buf_gid"}
    for r, where in ((c, "buf_cpu"), (g, "buf_gid")):
        assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n and r["duplicates"] == 0
        assert r["keys"] == {"base": 0, "buf_cpu": 0, "buf_gid": 0, where: n}
        assert r["lost"] == n - 1 and r["descriptor"] == 0
        assert r["gids"] == [t["gid"]] and r["gid_matches_token"] is True


def test_peer_new_publisher_to_one_cpu_receiver_loses_nothing():
    port, n = free_port(), 15
    rx = peer("receive", port, "--wire", "new", "--no-gaps", "-n", n, "--timeout", 30)
    tx = peer("publish", port, "--wire", "new", "--backends", "cpu:;cuda:", "-n", n, listen=False)
    t, _ = result(tx, "peer_publish")
    r, _ = result(rx, "peer_receive")
    assert t["token"].endswith("/backends:cpu:;cuda:")
    assert t["puts"] == {"base": 0, "buf_cpu": n, "buf_gid": 0}
    assert r["errors"] == [] and r["frames"] == n and r["keys"]["buf_cpu"] == n and r["lost"] == 0


def test_peer_old_publisher_to_new_receivers():
    """An old-wire publisher serves everyone on the base key, numbering per message."""
    port, n = free_port(), 15
    cpu = peer("receive", port, "--wire", "new", "--no-gaps", "-n", n, "--timeout", 30)
    cuda = peer("receive", port, "--wire", "new", "--backends", "cuda:", "--no-gaps", "-n", n, "--timeout", 30,
                listen=False)
    tx = peer("publish", port, "-n", n, "--wait-subscriptions", 2, listen=False)
    t, _ = result(tx, "peer_publish")
    for proc in (cpu, cuda):
        r, _ = result(proc, "peer_receive")
        assert r["errors"] == [] and r["frames"] == n and r["lost"] == 0 and r["duplicates"] == 0
        assert r["keys"] == {"base": n, "buf_cpu": 0, "buf_gid": 0} and r["gids"] == [t["gid"]]


def test_peer_mixed_publishers_to_new_receiver():
    port, n = free_port(), 12
    rx = peer("receive", port, "--wire", "new", "--publishers", 2, "-n", 2 * n, "--timeout", 30)
    old = peer("publish", port, "--node", "old_pub", "-n", n, listen=False)
    new = peer("publish", port, "--node", "new_pub", "--wire", "new", "-n", n, listen=False)
    o, _ = result(old, "peer_publish")
    w, _ = result(new, "peer_publish")
    r, _ = result(rx, "peer_receive")
    assert r["errors"] == [] and r["frames"] == 2 * n and r["lost"] == 0
    assert r["keys"] == {"base": n, "buf_cpu": n, "buf_gid": 0}
    assert r["gids"] == sorted([o["gid"], w["gid"]]) and r["gid_matches_token"] is True


def test_peer_new_transient_local_endpoints_keep_the_old_wire():
    port, n, qos = free_port(), 10, "1:1:1,5:,:,:1,,"
    rx = peer("receive", port, "--wire", "new", "--qos", qos, "--no-gaps", "-n", n, "--timeout", 30)
    tx = peer("publish", port, "--wire", "new", "--qos", qos, "-n", n, listen=False)
    t, _ = result(tx, "peer_publish")
    r, _ = result(rx, "peer_receive")
    assert t["token"].endswith("/:1:,5:,:,:,,") and r["token"].endswith("/:1:,5:,:,:,,")
    assert t["puts"] == {"base": n, "buf_cpu": 0, "buf_gid": 0}
    assert r["errors"] == [] and r["frames"] == n and r["keys"]["base"] == n


def test_peer_new_publisher_never_reaches_an_old_receiver():
    """Models rmw_zenoh 0.12.0 / 0.10.5, not zenoh-cuda-shm: a buffer-aware publisher
    treats a subscription without backends (any pre-buffer-backends release) as one to
    serve on `_buf/<its GID>`, a key that subscription never subscribes to, and stops
    using the base key; the old subscription receives nothing. The publisher's choice
    of key also checks that both sides compute the same (canonical) GID."""
    port, n = free_port(), 10
    # The publisher first: it starts publishing as soon as the receiver's token is in
    # the graph, well within the receiver's listening window.
    tx = peer("publish", port, "--wire", "new", "-n", n)
    rx = peer("receive", port, "-n", 0, "--timeout", 5, listen=False)
    t, _ = result(tx, "peer_publish")
    r, _ = result(rx, "peer_receive")
    assert t["puts"] == {"base": 0, "buf_cpu": 0, "buf_gid": n}
    assert t["discovered"] == {r["gid"]: "buf_gid"}
    assert r["errors"] == [] and r["frames"] == 0 and r["keys"] == {"base": 0, "buf_cpu": 0, "buf_gid": 0}


def test_peer_humble_and_old_wires_never_meet():
    """A Humble publisher and an old-wire one on one topic: each receiver hears exactly
    the publisher of its own wire (one GID), numbered 1, 2, 3..."""
    a, b, n = free_port(), free_port(), 12
    common = ["--timeout", 30, "-n", n]
    # Each receiver listens, each publisher connects to both: every pair that matters
    # has a link of its own, whatever Zenoh's gossip does.
    both = ["-e", f"tcp/127.0.0.1:{b}"]
    rx_h = peer("receive", a, "--wire", "humble", *common)
    rx_o = peer("receive", b, "--node", "old_rx", *common)
    tx_h = peer("publish", a, "--wire", "humble", "--node", "humble_pub", *common, *both, listen=False)
    tx_o = peer("publish", a, "--node", "old_pub", *common, *both, listen=False)
    h, _ = result(tx_h, "peer_publish")
    o, _ = result(tx_o, "peer_publish")
    assert "/TypeHashNotSupported/" in h["token"] and "/RIHS01_" in o["token"]
    for proc, own in ((rx_h, h), (rx_o, o)):
        r, _ = result(proc, "peer_receive")
        assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n and r["lost"] == 0
        assert r["keys"] == {"base": n, "buf_cpu": 0, "buf_gid": 0}
        assert r["gids"] == [own["gid"]] and r["gid_matches_token"] is True
        assert r["publishers"] == [own["token"]]


# --- Humble's wire against our examples (ROS_DISTRO=humble) ---------------------------


def test_humble_receiver_from_us(examples):
    """Our publisher on Humble's wire to a Humble subscription: every message once, on
    the `TypeHashNotSupported` key, with the GID of our Humble token, CDR byte-exact by
    rosbags' Humble typestore, every pixel checked."""
    port, n = free_port(), 20
    size = ["--width", 64, "--height", 32]
    rx = peer("receive", port, "--wire", "humble", "-n", n, *size, "--timeout", 30)
    pub = zcs(examples, "ros2_image_pub", port, "-n", n, *size, "--wait-subscriptions", 1, distro="humble")
    p, pub_out = result(pub, "ros2_pub")
    r, _ = result(rx, "peer_receive")
    assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n, r
    assert r["keys"] == {"base": n, "buf_cpu": 0, "buf_gid": 0} and r["duplicates"] == 0 and r["lost"] == 0
    assert r["gids"] == [publisher_gid(pub_out)] and r["gid_matches_token"] is True, r
    [ours] = r["publishers"]
    assert "/zcs_image_pub/%camera%image/sensor_msgs::msg::dds_::Image_/TypeHashNotSupported/" in ours
    assert "/backends:" not in ours
    assert "'0/camera/image/sensor_msgs::msg::dds_::Image_/TypeHashNotSupported'" in pub_out
    assert p["base_puts"] == n and p["ordinary_subscriptions"] == 1


def test_humble_publisher_to_our_subscriber(examples):
    """A Humble publisher to our subscriber on Humble's wire: every frame decoded, the
    malformed samples dropped and counted, nothing reported silent."""
    port, n = free_port(), 24
    sub = zcs(examples, "ros2_image_sub", port, "-n", n, listen=True, distro="humble")
    tx = peer("publish", port, "--wire", "humble", "-n", n, "--width", 200, "--height", 100, "--inject-bad",
              listen=False)
    t, _ = result(tx, "peer_publish")
    s, _ = result(sub, "ros2_sub")
    inj = t["injected"]
    assert t["puts"] == {"base": n, "buf_cpu": 0, "buf_gid": 0} and "/TypeHashNotSupported/" in t["token"]
    assert s["frames"] == n and s["bad"] == 0 and s["gaps"] == 0 and s["extra"] == 0 and s["lost"] == 0
    assert s["base"] == n and s["paths"] == {"plain": n} and s["duplicates"] == 0
    assert s["bad_attachment"] == inj["no_attachment"] + inj["bad_attachment"] == 6
    assert s["bad_cdr"] == inj["bad_cdr"] == 4
    assert not s["silent"]


def test_humble_and_jazzy_peers_each_heard_by_their_own_wire(examples):
    """A Humble and a Jazzy publisher on one topic, our subscriptions on both wires:
    each receives its own wire's publisher, in order and complete, and reports the
    other one as silent, with the reason for that pair of wires."""
    a, b, n = free_port(), free_port(), 10
    size = ["--width", 64, "--height", 32]
    quick = ["--silence-after", 0.5, "--idle-timeout", 15]
    # Each subscriber listens, each publisher connects to both (a link per pair).
    on_humble = zcs(examples, "ros2_image_sub", a, "-n", n, *quick, listen=True, distro="humble")
    on_jazzy = zcs(examples, "ros2_image_sub", b, "-n", n, *quick, listen=True, distro="jazzy")
    # The publishers outlast the subscribers: a report stands only while its publisher
    # is in the graph, and the subscribers print the reports that stand when they end.
    paced = ["-n", 3 * n, *size, "--rate", 10, "-e", f"tcp/127.0.0.1:{b}"]
    humble = peer("publish", a, "--wire", "humble", "--node", "humble_pub", *paced, listen=False)
    jazzy = peer("publish", a, "--node", "jazzy_pub", *paced, listen=False)
    h, _ = result(humble, "peer_publish")
    j, _ = result(jazzy, "peer_publish")
    for proc, other, why in ((on_humble, j, "after Humble"), (on_jazzy, h, "a Humble node")):
        s, out, err = result_err(proc, "ros2_sub")
        # `base` also counts what came during the subscriber's closing grace period.
        assert s["frames"] == n and s["paths"] == {"plain": n} and s["base"] >= n, s
        assert s["bad"] == 0 and s["extra"] == 0
        assert s["gaps"] == 0 and s["lost"] == 0 and s["disorder"] == 0 and s["duplicates"] == 0
        # Its own wire's publisher was heard (not silent); the other never was.
        assert s["silent"] == 1, (s, err)
        [line] = [x for x in err.splitlines() if x.startswith("[ros2] silent publisher ")]
        assert line.startswith(f"[ros2] silent publisher {other['gid']} ") and why in line, line


def test_our_humble_and_jazzy_publishers_each_reach_their_own_wire(examples):
    """Our publishers on both wires and a Humble and a Jazzy subscription on one topic:
    each subscription receives every message of the publisher of its own wire and
    nothing of the other; each publisher counts only its own wire's subscription."""
    a, b, n = free_port(), free_port(), 15
    size = ["--width", 64, "--height", 32]
    # Each subscription listens, each publisher connects to both (a link per pair).
    rx_h = peer("receive", a, "--wire", "humble", "-n", n, *size, "--timeout", 30)
    rx_j = peer("receive", b, "--node", "jazzy_rx", "-n", n, *size, "--timeout", 30)
    wait = ["--wait-subscriptions", 1, "--silence-after", 0, "-e", f"tcp/127.0.0.1:{b}"]
    pub_h = zcs(examples, "ros2_image_pub", a, "--node", "humble_pub", "-n", n, *size, *wait, distro="humble")
    pub_j = zcs(examples, "ros2_image_pub", a, "--node", "jazzy_pub", "-n", n, *size, *wait, distro="jazzy")
    ph, out_h = result(pub_h, "ros2_pub")
    pj, out_j = result(pub_j, "ros2_pub")
    for p in (ph, pj):
        assert p["base_puts"] == n and p["ordinary_subscriptions"] == 1, p
    for proc, out in ((rx_h, out_h), (rx_j, out_j)):
        r, _ = result(proc, "peer_receive")
        assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n and r["lost"] == 0, r
        assert r["gids"] == [publisher_gid(out)] and r["gid_matches_token"] is True, r


# --- the peer's new wire against our examples (needs the Rust side's backends support) --


def test_new_cpu_receiver_from_us(examples):
    """A new-wire CPU-only receiver gets every message from our publisher once, on the
    base key, numbered per message."""
    port, n = free_port(), 20
    rx = peer("receive", port, "--wire", "new", "--no-gaps", "-n", n, "--width", 64, "--height", 32, "--timeout", 30)
    pub = zcs(examples, "ros2_image_pub", port, "-n", n, "--width", 64, "--height", 32, "--wait-subscriptions", 1)
    p, pub_out = result(pub, "ros2_pub")
    r, _ = result(rx, "peer_receive")
    assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n
    assert r["keys"] == {"base": n, "buf_cpu": 0, "buf_gid": 0} and r["duplicates"] == 0 and r["lost"] == 0
    assert r["gids"] == [publisher_gid(pub_out)] and r["gid_matches_token"] is True, r
    assert any(t.endswith("/backends:cpu:") for t in r["publishers"])
    assert p["base_puts"] == n and p["ordinary_subscriptions"] == 1


def test_new_cuda_receiver_from_us(examples):
    """A `cuda:`-advertising receiver: our publisher keeps to plain CDR on the base key,
    every message exactly once, never in descriptor form."""
    port, n = free_port(), 20
    rx = peer("receive", port, "--wire", "new", "--backends", "cuda:", "--no-gaps", "-n", n, "--width", 64,
              "--height", 32, "--timeout", 30)
    pub = zcs(examples, "ros2_image_pub", port, "-n", n, "--width", 64, "--height", 32, "--wait-subscriptions", 1)
    p, pub_out = result(pub, "ros2_pub")
    r, _ = result(rx, "peer_receive")
    assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n
    assert r["keys"] == {"base": n, "buf_cpu": 0, "buf_gid": 0} and r["duplicates"] == 0
    assert r["descriptor"] == 0 and r["lost"] == 0
    assert r["gids"] == [publisher_gid(pub_out)] and r["gid_matches_token"] is True, r
    assert p["base_puts"] == n


def test_new_publisher_to_our_subscriber(examples):
    """A new-wire publisher serves our subscriber on `_buf_cpu` and a second, `cuda:`
    receiver on its `_buf/<GID>`, numbering per put: our subscriber sees every other
    number, yet reports no gap and nothing lost (the publisher numbers per put)."""
    port, n = free_port(), 20
    sub = zcs(examples, "ros2_image_sub", port, "-n", n, "--idle-timeout", 15, listen=True)
    cuda = peer("receive", port, "--wire", "new", "--backends", "cuda:", "-n", n, "--width", 64, "--height", 32,
                "--timeout", 30, listen=False)
    tx = peer("publish", port, "--wire", "new", "-n", n, "--width", 64, "--height", 32, "--wait-subscriptions", 2,
              listen=False)
    t, _ = result(tx, "peer_publish")
    g, _ = result(cuda, "peer_receive")
    s, _ = result(sub, "ros2_sub")
    assert t["puts"] == {"base": 0, "buf_cpu": n, "buf_gid": n} and t["last_seq"] == 2 * n
    assert list(t["discovered"].values()).count("buf_cpu") == 1
    assert g["errors"] == [] and g["keys"]["buf_gid"] == n and g["lost"] == n - 1
    assert s["frames"] == n and s["buf_cpu"] == n and s["bad"] == 0 and s["extra"] == 0
    assert s["gaps"] == 0 and s["lost"] == 0 and s["disorder"] == 0 and s["duplicates"] == 0
    assert not s["silent"]


def test_mixed_receivers_on_one_topic(examples):
    """Our publisher, an old-wire receiver, a new-wire CPU-only receiver, a new-wire
    `cuda:` receiver and our subscriber: every receiver gets every message exactly once."""
    port, n = free_port(), 20
    size = ["--width", 64, "--height", 32]
    old = peer("receive", port, "-n", n, *size, "--timeout", 30)
    cpu = peer("receive", port, "--wire", "new", "--no-gaps", "-n", n, *size, "--timeout", 30, listen=False)
    cuda = peer("receive", port, "--wire", "new", "--backends", "cuda:", "--no-gaps", "-n", n, *size, "--timeout", 30,
                listen=False)
    sub = zcs(examples, "ros2_image_sub", port, "-n", n, "--idle-timeout", 15)
    pub = zcs(examples, "ros2_image_pub", port, "-n", n, *size, "--wait-subscriptions", 4)
    p, pub_out = result(pub, "ros2_pub")
    for proc in (old, cpu, cuda):
        r, _ = result(proc, "peer_receive")
        assert r["errors"] == [] and r["frames"] == r["cdr_exact"] == n, r
        assert r["keys"] == {"base": n, "buf_cpu": 0, "buf_gid": 0} and r["duplicates"] == 0 and r["lost"] == 0
        assert r["gids"] == [publisher_gid(pub_out)] and r["gid_matches_token"] is True, r
    s, _ = result(sub, "ros2_sub")
    assert p["base_puts"] == n and p["ordinary_subscriptions"] == 3
    assert s["frames"] == n and s["extra"] == 0 and s["gaps"] == 0 and s["disorder"] == 0 and s["lost"] == 0
    # Every message comes both ways and is delivered by the first to arrive: the base
    # copies of those the channel delivered are dropped as duplicates, and so is a
    # channel copy that lost the race to its base copy (either way at most once each).
    assert s["channel"] + s["base"] == n and s["channel"] <= s["duplicates"] <= n


def test_mixed_publishers_to_our_subscriber(examples):
    """An old-wire and a new-wire publisher on one topic: our subscriber receives both
    streams completely (the first on the base key, the second on `_buf_cpu`)."""
    port, n = free_port(), 15
    size = ["--width", 64, "--height", 32]
    sub = zcs(examples, "ros2_image_sub", port, "-n", 2 * n, "--idle-timeout", 15, listen=True)
    old = peer("publish", port, "--node", "old_pub", "-n", n, *size, listen=False)
    new = peer("publish", port, "--node", "new_pub", "--wire", "new", "-n", n, *size, listen=False)
    o, _ = result(old, "peer_publish")
    w, _ = result(new, "peer_publish")
    s, _ = result(sub, "ros2_sub")
    assert o["puts"]["base"] == n and w["puts"] == {"base": 0, "buf_cpu": n, "buf_gid": 0}
    assert s["frames"] == 2 * n and s["buf_cpu"] == n and s["bad"] == 0 and s["extra"] == 0
    assert s["gaps"] == 0 and s["lost"] == 0 and s["disorder"] == 0 and s["duplicates"] == 0
    assert not s["silent"]
