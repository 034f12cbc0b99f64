"""Our silent-publisher report (docs/ros2.md, "Silent publishers") against real rclpy
publishers: quiet for those it hears, and firing, with the right reason, for those
whose data cannot reach our subscription.

Our subscriber runs with a short silence window; the report shows live as a WARN log
line, and, when the subscriber ends, as one `[ros2] silent publisher <gid> (<token>):
<reasons>` line per publisher still silent and the `silent` counter of its summary.
rmw_zenoh's tokens carry the node name, so each report names the rclpy node it is about.
"""

import itertools
import re
import signal
import time

WINDOW = 3.0  # --silence-after, seconds
_topics = itertools.count()
WARN = r"has sent nothing to this subscription"


def our_sub(net, t, qos, *extra):
    sub = net.ours("ros2_image_sub", "ros2_image_sub", "--topic", t, "--qos", qos, "--silence-after", WINDOW,
                   *extra)
    sub.wait_line(r"^\[ros2\] subscribed to", 30)
    return sub


def reports(sub):
    """{rclpy node name: reasons} from the report lines our subscriber printed at its end."""
    out = {}
    for line in sub.tail(10**6).splitlines():
        m = re.match(r"^\[ros2\] silent publisher ([0-9a-f]{32}) \((\S+)\): (.*)$", line)
        if m:
            node = m.group(2).split("/")[8]  # @ros2_lv/<domain>/<zid>/<nid>/<eid>/MP/<enclave>/<ns>/<node>/...
            out[node] = m.group(3)
    return out


def finish(sub):
    """Ends our subscriber (SIGINT) and returns its summary."""
    sub.signal(signal.SIGINT)
    res = sub.json_line("ros2_sub", 30)
    sub.wait(10)
    return res


def stay_quiet(net, qos_pub, qos_sub):
    """An rclpy publisher that our subscriber hears, for several silence windows."""
    t = f"/zcs_real/silence_quiet_{next(_topics)}"
    count = 80  # 8 s at 10/s: over two windows after the publisher is in our graph
    sub = our_sub(net, t, qos_sub, "-n", count, "--idle-timeout", 30)
    pub = net.rclpy("rclpy_pub", "pub", "--node", "rclpy_heard_pub", "--topic", t, "--qos", qos_pub, "--width",
                    64, "--height", 48, "--count", 0, "--rate", 10, "--timeout", 30)
    pub.wait_line(r'"event": "matched"', 40)
    res = sub.json_line("ros2_sub", 60)
    code = sub.wait(10)
    pub.stop()
    assert res["frames"] == count and res["bad"] == 0 and res["disorder"] == 0, res
    assert code == 0 or (qos_pub == "sensor" and res["gaps"] > 0), sub.tail()
    assert res["silent"] == 0 and reports(sub) == {}, sub.tail()
    assert not any(re.search(WARN, line) for line in sub.tail(10**6).splitlines()), sub.tail()


def test_silence_quiet_for_heard_rclpy_publisher_reliable(routed):
    """A reliable rclpy publisher, heard: no report."""
    stay_quiet(routed, "keep-all", "keep-all")


def test_silence_quiet_for_heard_rclpy_publisher_best_effort(routed):
    """A best-effort rclpy publisher and our best-effort subscriber: no report."""
    stay_quiet(routed, "sensor", "sensor")


def test_silence_reports_another_type(routed):
    """An rclpy std_msgs/String publisher on our Image topic is reported as publishing
    another type; an rclpy Image publisher on the same topic, heard, is not reported."""
    t = f"/zcs_real/silence_type_{next(_topics)}"
    sub = our_sub(routed, t, "keep-all", "-n", 0, "--idle-timeout", 0)
    heard = routed.rclpy("rclpy_image_pub", "pub", "--node", "rclpy_image_pub", "--topic", t, "--qos", "keep-all",
                         "--width", 64, "--height", 48, "--count", 0, "--rate", 10, "--timeout", 30)
    other = routed.rclpy("rclpy_string_pub", "pub", "--node", "rclpy_string_pub", "--type", "string", "--topic", t,
                         "--qos", "keep-all", "--count", 0, "--rate", 10, "--wait-subs", 0)
    other.wait_line(r'"event": "first_published"', 30)
    heard.wait_line(r'"event": "first_published"', 40)
    warn = sub.wait_line(WARN, WINDOW + 30)
    assert "rclpy_string_pub" in warn, warn
    sub.wait_line(r"^\[ros2\] first message by path plain", 30)
    # Both publishers have been in our graph for more than two windows by now: the one
    # we hear must still be unreported.
    time.sleep(2 * WINDOW)
    res = finish(sub)
    heard.stop()
    other.stop()
    r = reports(sub)
    assert list(r) == ["rclpy_string_pub"], sub.tail()
    assert r["rclpy_string_pub"] == "it publishes another type (std_msgs::msg::dds_::String_)", r
    assert res["silent"] == 1 and res["frames"] > 0 and res["bad"] == 0 and res["disorder"] == 0, res


def test_silence_quiet_for_heard_best_effort_publisher_reliable_sub(routed):
    """A best-effort rclpy publisher and our reliable subscriber: rmw_zenoh puts its data
    on the data key all the same, our subscriber hears it, and nothing is reported."""
    stay_quiet(routed, "sensor", "keep-all")


def silent_idle_publishers(net, sub_qos, idle):
    """Our subscriber (`sub_qos`) and rclpy publishers that publish nothing, {node name:
    qos}: returns the reasons of the reports our subscriber printed, by node name."""
    t = f"/zcs_real/silence_qos_{next(_topics)}"
    sub = our_sub(net, t, sub_qos, "-n", 0, "--idle-timeout", 0)
    pubs = [net.rclpy(node, "pub", "--node", node, "--idle", "--topic", t, "--qos", qos, "--timeout", 120)
            for node, qos in idle.items()]
    for p in pubs:
        p.wait_line(r'"event": "created"', 30)
    # One WARN line per publisher, each once its window has passed.
    deadline = time.monotonic() + WINDOW + 40
    while sum(bool(re.search(WARN, line)) for line in sub.tail(10**6).splitlines()) < len(idle):
        assert time.monotonic() < deadline and sub.p.poll() is None, sub.tail()
        time.sleep(0.1)
    res = finish(sub)
    for p in pubs:
        p.stop()
    assert res["silent"] == len(idle) and res["frames"] == 0, res
    return reports(sub)


def test_silence_reports_incompatible_qos_best_effort(routed):
    """An rclpy best-effort publisher silent to our reliable subscription is reported with
    incompatible QoS; a reliable one, as silent, with no reason the graph can give.
    (rmw_zenoh puts a best-effort publisher's data on the data key all the same, so one
    that publishes is heard: test_silence_quiet_for_heard_best_effort_publisher_reliable_sub.)"""
    r = silent_idle_publishers(routed, "keep-all", {"rclpy_best_effort": "sensor", "rclpy_reliable": "keep-all"})
    assert r == {
        "rclpy_best_effort": "incompatible QoS: a best-effort publisher and a reliable subscription",
        "rclpy_reliable": "nothing in the graph explains it: it may be idle, or its data does not reach this session",
    }, r


def test_silence_reports_incompatible_qos_volatile(routed):
    """An rclpy volatile publisher silent to our transient-local subscription is reported
    with incompatible QoS; a transient-local one, as silent, with no reason."""
    r = silent_idle_publishers(routed, "transient", {"rclpy_volatile": "reliable", "rclpy_transient": "transient"})
    assert r == {
        "rclpy_volatile": "incompatible QoS: a volatile publisher and a transient-local subscription",
        "rclpy_transient": "nothing in the graph explains it: it may be idle, or its data does not reach this session",
    }, r
