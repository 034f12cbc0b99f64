"""zenoh-cuda-shm's ROS 2 examples against an independent rmw_zenoh peer (ros2_peer.py,
eclipse-zenoh + rosbags), over loopback TCP on a free port, no multicast scouting, with
host-memory blocks (the same protocol as on a GPU; see tests/tests/gpu_ros2.rs there).

Every message is checked by whoever receives it (pixels, fields, attachment sequence
numbers / timestamps / GID, CDR byte-exact against rosbags); each test then checks the
counters both sides print.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(__file__).with_name("ros2_peer.py")
TIMEOUT = 120


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


def zcs(examples, name, port, *args, listen=False):
    endpoint = ["-l" if listen else "-e", f"tcp/127.0.0.1:{port}"]
    cmd = [str(examples / name), "--no-multicast-scouting", "--device", "host", *endpoint, *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def peer(role, port, *args, listen=True):
    endpoint = ["-l" if listen else "-e", f"tcp/127.0.0.1:{port}"]
    cmd = [sys.executable, str(PEER), role, *endpoint, *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def result(proc, role):
    """The process's JSON line with `role`, after checking it exited 0."""
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, f"{role} exited {proc.returncode}\n{out}\n{err}"
    for line in out.splitlines():
        if line.startswith("{") and f'"{role}"' in line:
            return json.loads(line), out
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
    # Our subscriber: every frame once, through our channel or (before its channel was
    # known to the publisher) the base key; every other base-key copy dropped as a duplicate.
    assert s["frames"] == n and s["extra"] == 0 and s["gaps"] == 0 and s["disorder"] == 0
    assert s["channel"] + s["base"] == n and s["channel"] >= n - 2
    assert s["base"] + s["duplicates"] == n
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
    assert s["paths"] == {"zero-copy": n}


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


def test_transient_local_late_subscriber_gets_the_last_depth_messages(examples):
    """TRANSIENT_LOCAL: a subscriber that joins after the last publish still receives
    the last `depth` messages (from the publication cache on the base key)."""
    port, n, depth = free_port(), 15, 5
    pub = zcs(
        examples, "ros2_image_pub", port, "-n", n, "--width", 32, "--height", 8, "--qos", "transient",
        "--depth", depth, "--linger", 15, listen=True,
    )
    # Wait until the publisher is done publishing (its JSON line comes before the linger).
    for line in pub.stdout:
        if '"ros2_pub"' in line:
            assert json.loads(line)["base_puts"] == n
            break
    sub = zcs(examples, "ros2_image_sub", port, "-n", depth, "--qos", "transient", "--depth", depth)
    s, _ = result(sub, "ros2_sub")
    pub.kill()
    pub.wait()
    assert s["frames"] == depth and s["base"] == depth and s["extra"] == 0 and s["gaps"] == 0
