"""Images between real rclpy nodes (rmw_zenoh_cpp) and our ros2_image_pub / ros2_image_sub.

Both sides check every byte: our examples fill and check the pattern of
zenoh_cuda_shm::cuda::kernels::pattern_byte seeded with the message's rmw sequence
number; rclpy_peer.py computes the same pattern in numpy.
"""

import itertools

import pytest

# name: (width, height, messages, messages per second)
SIZES = {
    "640x480": (640, 480, 30, 30.0),
    "3840x2160": (3840, 2160, 6, 2.0),
}
# keep-all: reliable, keep all (publishers block rather than drop: no message may be
# lost); sensor: best effort, depth 5 (a loss is allowed, a wrong byte is not).
# Reliable keep-last is not here: both rmw_zenoh and we drop under congestion with it,
# so whether a slow Python subscriber misses messages is a matter of load.
QOS = ["keep-all", "sensor"]
_topics = itertools.count()


def topic(tag):
    return f"/zcs_real/{tag.replace('-', '_')}_{next(_topics)}"


def check_our_sub(res, count, qos):
    assert res["frames"] == count, res
    for k in ("bad", "disorder", "extra", "bad_attachment", "bad_cdr"):
        assert res[k] == 0, (k, res)
    if qos != "sensor":
        assert res["gaps"] == 0 and res["lost"] == 0, res
    # An rclpy publisher has no zero-copy channel: everything comes as CDR on the data
    # key (`base` counts what came after the `count` messages too).
    assert res["paths"] == {"plain": count} and res["channel"] == 0 and res["base"] >= count, res


def check_rclpy_sub(s, count, qos):
    if qos == "sensor" and s["timed_out"]:
        # Best effort on a loaded machine: a slow Python subscriber of 4K frames may get
        # few of them (each lost fragment loses its message); what it gets must be exact.
        assert s["frames"] >= 2, s
    else:
        assert not s["timed_out"] and s["frames"] == count, s
    assert s["field_errors"] == 0, s
    assert s["bad"] == 0, s
    assert s["disorder"] == 0, s
    if qos != "sensor":
        assert s["gaps"] == 0, s
    assert "publication_sequence_number" in s["info_keys"], s


def rclpy_to_ours(net, size, qos, **where):
    w, h, count, rate = SIZES[size]
    t = topic(f"to_ours_{qos}")
    sub = net.ours("ros2_image_sub", "ros2_image_sub", "--topic", t, "--qos", qos, "-n", count,
                   "--idle-timeout", 30, **where)
    sub.wait_line(r"^\[ros2\] subscribed to", 30)
    # The rclpy publisher runs until our subscriber has had its `count` messages.
    pub = net.rclpy("rclpy_pub", "pub", "--topic", t, "--qos", qos, "--width", w, "--height", h,
                    "--count", 0, "--rate", rate, "--timeout", 30, **where)
    pub.wait_line(r'"event": "matched"', 40)
    res = sub.json_line("ros2_sub", count / rate + 60)
    code = sub.wait(10)
    pub.stop()
    check_our_sub(res, count, qos)
    # Our subscriber exits 1 on a sequence gap, allowed with best effort.
    assert code == 0 or (qos == "sensor" and res["gaps"] > 0), sub.tail()


def ours_to_rclpy(net, size, qos, **where):
    w, h, count, rate = SIZES[size]
    t = topic(f"from_ours_{qos}")
    patience = 30 if qos == "sensor" else 60
    sub = net.rclpy("rclpy_sub", "sub", "--topic", t, "--qos", qos, "--width", w, "--height", h,
                    "--count", count, "--timeout", count / rate + patience, **where)
    sub.wait_line(r'"event": "ready"', 30)
    # Ours publishes (after the subscription is in its graph) until rclpy has had `count`.
    pub = net.ours("ros2_image_pub", "ros2_image_pub", "--topic", t, "--qos", qos, "--width", w,
                   "--height", h, "-n", 0, "--rate", rate, "--wait-subscriptions", 1, **where)
    s = sub.summary(count / rate + 70)
    pub.stop()
    check_rclpy_sub(s, count, qos)
    assert pub.json_line("ros2_pub", 10)["frames"] >= count


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("size", SIZES)
def test_rclpy_pub_to_our_sub(routed, size, qos):
    """An rclpy Image publisher → rmw_zenohd → our ros2_image_sub, every byte checked."""
    rclpy_to_ours(routed, size, qos)


@pytest.mark.parametrize("qos", QOS)
@pytest.mark.parametrize("size", SIZES)
def test_our_pub_to_rclpy_sub(routed, size, qos):
    """Our ros2_image_pub → rmw_zenohd → an rclpy subscription, every byte checked."""
    ours_to_rclpy(routed, size, qos)


def test_peer_to_peer_rclpy_pub_to_our_sub(net):
    """No router: the rclpy node connects to our subscriber's process directly."""
    from conftest import free_port

    port = free_port()
    w, h, count, rate = SIZES["640x480"]
    t = topic("p2p_to_ours")
    sub = net.ours("ros2_image_sub", "ros2_image_sub", "--topic", t, "--qos", "keep-all", "-n", count,
                   "--idle-timeout", 30, listen=f"tcp/127.0.0.1:{port}")
    sub.wait_line(r"^\[ros2\] subscribed to", 30)
    pub = net.rclpy("rclpy_pub", "pub", "--topic", t, "--qos", "keep-all", "--width", w, "--height", h,
                    "--count", 0, "--rate", rate, "--timeout", 30, connect=f"tcp/127.0.0.1:{port}")
    pub.wait_line(r'"event": "matched"', 40)
    res = sub.json_line("ros2_sub", count / rate + 60)
    assert sub.wait(10) == 0, sub.tail()
    pub.stop()
    check_our_sub(res, count, "keep-all")


def test_peer_to_peer_our_pub_to_rclpy_sub(net):
    """No router: our publisher's process connects to the rclpy node directly."""
    from conftest import free_port

    port = free_port()
    w, h, count, rate = SIZES["640x480"]
    t = topic("p2p_from_ours")
    sub = net.rclpy("rclpy_sub", "sub", "--topic", t, "--qos", "keep-all", "--width", w, "--height", h,
                    "--count", count, "--timeout", count / rate + 60, listen=f"tcp/127.0.0.1:{port}",
                    connect=False)
    sub.wait_line(r'"event": "ready"', 30)
    pub = net.ours("ros2_image_pub", "ros2_image_pub", "--topic", t, "--qos", "keep-all", "--width", w,
                   "--height", h, "-n", 0, "--rate", rate, "--wait-subscriptions", 1,
                   connect=f"tcp/127.0.0.1:{port}")
    s = sub.summary(count / rate + 70)
    pub.stop()
    check_rclpy_sub(s, count, "keep-all")


def test_transient_local_late_rclpy_sub(routed):
    """A TRANSIENT_LOCAL rclpy subscription that joins after our publisher has sent
    everything still gets the last `depth` messages, byte-exact."""
    w, h, count = 640, 480, 5
    t = topic("transient_from_ours")
    pub = routed.ours("ros2_image_pub", "ros2_image_pub", "--topic", t, "--qos", "transient", "--depth", 10,
                      "--width", w, "--height", h, "-n", count, "--rate", 20, "--linger", 120)
    pub.json_line("ros2_pub", 60)  # all sent before the subscription exists
    sub = routed.rclpy("rclpy_sub", "sub", "--topic", t, "--qos", "transient", "--width", w, "--height", h,
                       "--count", count, "--timeout", 60)
    s = sub.summary(90)
    check_rclpy_sub(s, count, "transient")
    assert list(s["last_seq"].values()) == [count], s  # keyed by GID where rclpy gives it


def test_transient_local_late_our_sub(routed):
    """Our TRANSIENT_LOCAL subscriber that joins after an rclpy publisher has sent
    everything still gets the last `depth` messages, byte-exact."""
    w, h, count = 640, 480, 5
    t = topic("transient_to_ours")
    pub = routed.rclpy("rclpy_pub", "pub", "--topic", t, "--qos", "transient", "--width", w, "--height", h,
                       "--count", count, "--rate", 20, "--wait-subs", 0, "--linger", 120)
    pub.summary(60)  # all sent before the subscription exists
    sub = routed.ours("ros2_image_sub", "ros2_image_sub", "--topic", t, "--qos", "transient", "--depth", 10,
                      "-n", count, "--idle-timeout", 30)
    res = sub.json_line("ros2_sub", 90)
    assert sub.wait(10) == 0, sub.tail()
    check_our_sub(res, count, "transient")
