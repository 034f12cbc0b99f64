"""Namespaces, relative and private (`~/`) names between our nodes and real rclpy nodes.

Both nodes of a test are in the namespace /robot1; the publisher's node is `cam`, the
subscription's `viewer`. Each side resolves its own name (ours in RosNode, rclpy's in
rcl), and the two must meet on one topic, every byte checked, both directions. The
graph as rclpy sees it must show our node in its namespace.
"""

import re

import pytest

NS = "/robot1"
W, H, COUNT, RATE = 640, 480, 20, 20.0

# case: (publisher's topic, subscription's topic, the name both resolve to)
CASES = {
    "relative": ("image", "image", "/robot1/image"),
    "private_pub": ("~/image", "cam/image", "/robot1/cam/image"),
    "private_sub": ("viewer/image", "~/image", "/robot1/viewer/image"),
}


def data_key_topic(line):
    """The topic part of the data key our example printed (`<domain>/<topic>/<type>/<hash>`)."""
    key = re.search(r"'([^']+)'", line).group(1)
    m = re.match(r"^\d+/(.+)/sensor_msgs::msg::dds_::Image_/RIHS01_[0-9a-f]{64}$", key)
    assert m, key
    return "/" + m.group(1)


def mangled(name):
    return name.replace("/", "%")


@pytest.mark.parametrize("case", CASES)
def test_names_our_pub_to_rclpy_sub(routed, case):
    """Our publisher (node /robot1/cam) → an rclpy subscription (node /robot1/viewer)."""
    pub_topic, sub_topic, full = CASES[case]
    sub = routed.rclpy("rclpy_sub", "sub", "--node", "viewer", "--namespace", NS, "--topic", sub_topic,
                       "--qos", "keep-all", "--width", W, "--height", H, "--count", COUNT,
                       "--timeout", COUNT / RATE + 60)
    ready = sub.wait_line(r'"event": "ready"', 30)
    assert f'"topic": "{full}"' in ready, ready  # rclpy's own resolution
    pub = routed.ours("ros2_image_pub", "ros2_image_pub", "--node", "cam", "--namespace", NS, "--topic",
                      pub_topic, "--qos", "keep-all", "--width", W, "--height", H, "-n", 0, "--rate", RATE,
                      "--wait-subscriptions", 1)
    line = pub.wait_line(r"^\[ros2\] publishing on", 30)
    assert data_key_topic(line) == full, line
    # Our token names the node in its namespace, and the topic as resolved.
    assert f"/{mangled(NS)}/cam/{mangled(full)}/" in line, line
    s = sub.summary(COUNT / RATE + 70)
    pub.stop()
    assert not s["timed_out"] and s["frames"] == COUNT, s
    assert s["bad"] == 0 and s["field_errors"] == 0 and s["gaps"] == 0 and s["disorder"] == 0, s
    assert s["topic"] == full, s
    # rclpy's graph: our publisher under node `cam` in /robot1, and the node itself.
    ours = [e for e in s["publishers"] if e["node_name"] == "cam"]
    assert len(ours) == 1 and ours[0]["node_namespace"] == NS, s["publishers"]
    assert ["cam", NS] in s["nodes"], s["nodes"]


@pytest.mark.parametrize("case", CASES)
def test_names_rclpy_pub_to_our_sub(routed, case):
    """An rclpy publisher (node /robot1/cam) → our subscriber (node /robot1/viewer)."""
    pub_topic, sub_topic, full = CASES[case]
    sub = routed.ours("ros2_image_sub", "ros2_image_sub", "--node", "viewer", "--namespace", NS, "--topic",
                      sub_topic, "--qos", "keep-all", "-n", COUNT, "--idle-timeout", 30)
    line = sub.wait_line(r"^\[ros2\] subscribed to", 30)
    assert data_key_topic(line) == full, line
    assert f"/{mangled(NS)}/viewer/{mangled(full)}/" in line, line
    pub = routed.rclpy("rclpy_pub", "pub", "--node", "cam", "--namespace", NS, "--topic", pub_topic,
                       "--qos", "keep-all", "--width", W, "--height", H, "--count", 0, "--rate", RATE,
                       "--timeout", 30)
    created = pub.wait_line(r'"event": "created"', 30)
    assert f'"topic": "{full}"' in created, created  # rclpy's own resolution
    pub.wait_line(r'"event": "matched"', 40)
    matched = next(e for e in pub.events() if e.get("event") == "matched")
    res = sub.json_line("ros2_sub", COUNT / RATE + 60)
    code = sub.wait(10)
    pub.stop()
    assert res["frames"] == COUNT and code == 0, sub.tail()
    for k in ("bad", "gaps", "disorder", "extra", "lost", "bad_attachment", "bad_cdr"):
        assert res[k] == 0, (k, res)
    assert res["paths"] == {"plain": COUNT}, res
    # rclpy's graph, when its publisher matched: our subscription under node `viewer`
    # in /robot1, and the node itself.
    ours = [e for e in matched["subscription_endpoints"] if e["node_name"] == "viewer"]
    assert len(ours) == 1 and ours[0]["node_namespace"] == NS, matched
    assert ["viewer", NS] in matched["nodes"], matched
