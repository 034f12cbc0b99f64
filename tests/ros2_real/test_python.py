"""Our Python ROS 2 nodes (zenoh_cuda_shm.ros2: examples/python/ros2_pub.py and
ros2_sub.py) against real rclpy nodes on rmw_zenoh_cpp, both ways.

Both sides check every byte against the examples' pattern seeded with the message's
rmw sequence number. From rclpy the frames arrive as CDR, which ros2_sub.py reads
through a host copy with NumPy (these runs have no GPU)."""

import itertools

import pytest

COUNT, RATE = 20, 20.0
_topics = itertools.count()


def topic(tag):
    return f"/zcs_real/{tag.replace('-', '_')}_{next(_topics)}"


@pytest.mark.parametrize("qos", ["keep-all", "sensor"])
def test_rclpy_pub_to_our_python_sub(routed, qos):
    t = topic(f"py_to_ours_{qos}")
    sub = routed.ours_py("ros2_sub.py", "ros2_sub.py", "--topic", t, "--qos", qos, "-n", COUNT,
                         "--idle-timeout", 30)
    sub.wait_line(r"^\[ros2\] subscribed to", 30)
    pub = routed.rclpy("rclpy_pub", "pub", "--topic", t, "--qos", qos, "--width", 640, "--height", 480,
                       "--count", 0, "--rate", RATE, "--timeout", 30)
    pub.wait_line(r'"event": "matched"', 40)
    res = sub.json_line("ros2_sub", COUNT / RATE + 60)
    code = sub.wait(10)
    pub.stop()
    assert res["frames"] == COUNT and res["bad"] == 0 and res["disorder"] == 0, res
    assert res["paths"] == {"plain": COUNT}, res
    if qos != "sensor":
        assert res["gaps"] == 0 and res["lost"] == 0, res
    assert code == 0, sub.tail()
    assert sub.wait_line(r"^\[ros2\] first message by path plain", 1)


def test_our_python_pub_to_rclpy_sub(routed):
    t = topic("py_from_ours")
    sub = routed.rclpy("rclpy_sub", "sub", "--topic", t, "--qos", "keep-all", "--width", 640, "--height", 480,
                       "--count", COUNT, "--timeout", COUNT / RATE + 60)
    sub.wait_line(r'"event": "ready"', 30)
    pub = routed.ours_py("ros2_pub.py", "ros2_pub.py", "--topic", t, "--qos", "keep-all", "--width", 640,
                         "--height", 480, "-n", 0, "-r", RATE, "--wait-subscriptions", 1)
    s = sub.summary(COUNT / RATE + 70)
    pub.stop()
    assert not s["timed_out"] and s["frames"] == COUNT, s
    assert s["bad"] == 0 and s["field_errors"] == 0 and s["disorder"] == 0 and s["gaps"] == 0, s
    # rclpy's graph shows our Python node as the Image publisher.
    assert [(p["node_name"], p["topic_type"]) for p in s["publishers"]] == \
        [("zcs_py_image_pub", "sensor_msgs/msg/Image")], s
    assert pub.json_line("ros2_pub", 10)["frames"] >= COUNT
