"""std_msgs/msg/String between real rclpy nodes (rmw_zenoh_cpp) and our ros2_talker /
ros2_listener, both ways, every text checked.

Both sides write and expect "Hello World: <seq>", seq being the message's rmw
publication sequence number (1, 2, ...), so a text that arrives changed, or under
another message's number, fails the test.
"""

import itertools

import pytest

COUNT, RATE = 20, 20.0
# keep-all and reliable (keep last 10): no message may be lost; sensor (best effort,
# depth 5): a loss is allowed, a wrong text is not.
QOS = ["keep-all", "reliable", "sensor"]
_topics = itertools.count()


def topic(tag):
    return f"/zcs_real/{tag.replace('-', '_')}_{next(_topics)}"


@pytest.mark.parametrize("qos", QOS)
def test_rclpy_talker_to_our_listener(routed, qos):
    """An rclpy String publisher → rmw_zenohd → our ros2_listener."""
    t = topic(f"strings_to_ours_{qos}")
    sub = routed.ours("ros2_listener", "ros2_listener", "--topic", t, "--qos", qos, "-n", COUNT,
                      "--idle-timeout", 30)
    sub.wait_line(r"^\[listener\] subscribed to", 30)
    pub = routed.rclpy("rclpy_talker", "pub", "--type", "string", "--topic", t, "--qos", qos, "--count", 0,
                       "--rate", RATE, "--timeout", 30)
    pub.wait_line(r'"event": "matched"', 40)
    res = sub.json_line("listener", COUNT / RATE + 60)
    code = sub.wait(10)
    pub.stop()
    assert res["messages"] == COUNT and res["bad"] == 0 and res["disorder"] == 0, res
    assert res["bad_cdr"] == 0 and res["bad_envelope"] == 0, res
    # rclpy has no channel of ours: every text came as CDR on the data key.
    assert res["paths"] == {"plain": COUNT} and res["channel"] == 0, res
    if qos != "sensor":
        assert res["gaps"] == 0 and res["lost"] == 0, res
    assert code == 0 or (qos == "sensor" and res["gaps"] > 0), sub.tail()
    assert sub.wait_line(r"^\[listener\] I heard: \[Hello World: \d+\]$", 1)


@pytest.mark.parametrize("qos", QOS)
def test_our_talker_to_rclpy_listener(routed, qos):
    """Our ros2_talker → rmw_zenohd → an rclpy String subscription."""
    t = topic(f"strings_from_ours_{qos}")
    sub = routed.rclpy("rclpy_listener", "sub", "--type", "string", "--topic", t, "--qos", qos, "--count", COUNT,
                       "--timeout", COUNT / RATE + 40)
    sub.wait_line(r'"event": "ready"', 30)
    pub = routed.ours("ros2_talker", "ros2_talker", "--topic", t, "--qos", qos, "-n", 0, "--rate", RATE,
                      "--wait-subscriptions", 1)
    s = sub.summary(COUNT / RATE + 50)
    pub.stop()
    if qos == "sensor" and s["timed_out"]:
        assert s["frames"] >= COUNT // 2, s
    else:
        assert not s["timed_out"] and s["frames"] == COUNT, s
    assert s["bad"] == 0 and s["disorder"] == 0, s
    if qos != "sensor":
        assert s["gaps"] == 0, s
    # rclpy's graph shows our talker as a String publisher.
    assert [(p["node_name"], p["topic_type"]) for p in s["publishers"]] == [("talker", "std_msgs/msg/String")], s
    assert pub.json_line("talker", 10)["messages"] >= COUNT
