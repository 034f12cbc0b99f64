"""ROS 2 from Python (zenoh_cuda_shm.ros2) on host-memory sessions: Python nodes with
each other and with the Rust example nodes, every byte and header field checked, and
bad input refused with nothing lost. Real rclpy nodes: tests/ros2_real/test_python.py."""

import asyncio
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import zenoh_cuda_shm as zcs
from zenoh_cuda_shm import ros2
from zcs_testing import IO_TIMEOUT, free_port, zenoh_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "python"))
from ros2_pub import pattern  # noqa: E402  (the examples' pattern, tested here too)


@pytest.fixture
def nodes():
    """Two host-memory sessions on loopback, a node on each, in a domain of their own."""
    port = free_port()
    domain = random.randrange(1, 200)
    a = zcs.open({"device": "host"}, zenoh=zenoh_config(listen=port))
    b = zcs.open({"device": "host"}, zenoh=zenoh_config(connect=port))
    yield ros2.Node(a, "py_talker", domain=domain), ros2.Node(b, "py_listener", domain=domain), port, domain
    a.close()
    b.close()


def wait_for(what, f, timeout=IO_TIMEOUT):
    end = time.monotonic() + timeout
    while not f():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_images_tensors_and_strings_between_python_nodes(nodes):
    talker, listener, _, _ = nodes
    sub = listener.create_subscription(ros2.Image, "camera/image", qos_profile=10)
    pub = talker.create_publisher(ros2.Image, "/camera/image", ros2.QoSProfile(depth=10))
    wait_for("our subscription on the zero-copy path", lambda: pub.zero_copy_subscribers == 1)
    rng = np.random.default_rng(7)
    for shape, dtype, encoding in [((480, 640, 3), np.uint8, "rgb8"), ((4, 6), np.uint16, "mono16"),
                                   ((5, 7, 4), np.uint8, "bgra8"), ((3, 2), np.float32, "32FC1")]:
        frame = (rng.random(shape) * 60000).astype(dtype)
        seq = pub.publish(frame, encoding=encoding, frame_id="cam0", stamp=ros2.Stamp(12, 345))
        msg = sub.recv(timeout=IO_TIMEOUT)
        assert msg.seq == seq and msg.publisher_gid == pub.gid
        assert msg.header == ros2.Header(ros2.Stamp(12, 345), "cam0")
        channels = shape[2] if len(shape) == 3 else 1
        itemsize = np.dtype(dtype).itemsize
        assert (msg.height, msg.width, msg.encoding, msg.step, msg.is_bigendian) == \
            (shape[0], shape[1], encoding, shape[1] * channels * itemsize, False)
        assert msg.in_place and msg.path in ("zero-copy", "inline")
        got = np.from_dlpack(msg)
        assert got.shape == (shape[0], shape[1], channels) and got.dtype == dtype
        assert not got.flags.writeable, "read in place, read-only"
        assert got.tobytes() == frame.tobytes()
        assert msg.to_bytes() == frame.tobytes()
    assert sub.stats()["channel"] == 4 and sub.stats()["lost"] == 0

    tsub = listener.create_subscription(ros2.Tensor, "/features")
    tpub = talker.create_publisher(ros2.Tensor, "/features")
    wait_for("our tensor subscription on the zero-copy path", lambda: tpub.zero_copy_subscribers == 1)
    x = np.arange(2 * 3 * 40000, dtype=np.float64).reshape(2, 3, 40000) / 7
    tpub.publish(x)
    m = tsub.recv(timeout=IO_TIMEOUT)
    assert (m.dtype, m.shape, m.strides, m.byte_offset) == ("float64", (2, 3, 40000), (), 0)
    assert m.path == "zero-copy" and np.array_equal(np.from_dlpack(m), x)

    ssub = listener.create_subscription(ros2.String, "chatter")
    spub = talker.create_publisher(ros2.String, "chatter")
    wait_for("our String subscription", lambda: spub.our_subscriptions == 1)
    for text in ["Hello World: 1", "", "ünïcödé ✓"]:
        spub.publish(text)
        assert ssub.recv(timeout=IO_TIMEOUT).data == text


def test_callbacks_iteration_and_async(nodes):
    talker, listener, _, _ = nodes
    got, done = [], threading.Event()

    def on_message(msg):
        got.append(msg.data)
        if len(got) == 3:
            done.set()

    cb = listener.create_subscription(ros2.String, "/cb", on_message)
    it = listener.create_subscription(ros2.String, "/it")
    pub_cb = talker.create_publisher(ros2.String, "/cb")
    pub_it = talker.create_publisher(ros2.String, "/it")
    wait_for("both subscriptions", lambda: pub_cb.our_subscriptions == 1 and pub_it.our_subscriptions == 1)
    for i in range(3):
        pub_cb.publish(f"cb {i}")
        pub_it.publish(f"it {i}")
    assert done.wait(IO_TIMEOUT) and got == ["cb 0", "cb 1", "cb 2"]
    texts = []
    for msg in it:
        texts.append(msg.data)
        if len(texts) == 2:
            break

    async def third():
        return (await it.recv_async(timeout=IO_TIMEOUT)).data

    assert texts + [asyncio.run(third())] == ["it 0", "it 1", "it 2"]
    cb.close()
    it.close()
    with pytest.raises(zcs.ClosedError):
        it.recv(timeout=0.1)


def test_bad_input_is_refused_and_loses_nothing(nodes):
    talker, listener, _, _ = nodes
    sub = listener.create_subscription(ros2.Image, "/img")
    pub = talker.create_publisher(ros2.Image, "/img")
    wait_for("our subscription", lambda: pub.our_subscriptions == 1)
    frame = np.zeros((4, 5, 3), np.uint8)
    with pytest.raises(ValueError, match="'rgb8' is 3 channels of uint8, but the data is 3 channels of float32"):
        pub.publish(frame.astype(np.float32), encoding="rgb8")
    with pytest.raises(ValueError, match="not contiguous"):
        pub.publish(frame[:, ::2])
    with pytest.raises(ValueError, match="no default encoding for 2 channels"):
        pub.publish(np.zeros((4, 5, 2), np.uint8))
    with pytest.raises(ValueError, match="has no tensor layout"):
        pub.publish(frame, encoding="jpeg")
    with pytest.raises(TypeError):
        pub.publish(b"raw bytes")
    # A loan of the wrong size for its Image is refused and stays the caller's.
    loan = pub.loan((4, 5, 4), "uint8")
    with pytest.raises(ValueError, match="needs 60 bytes of data, not 80"):
        pub._native.publish_image(0, "", 4, 5, "rgb8", False, 15, loan=loan)
    np.from_dlpack(loan)[...] = 9
    assert pub.publish(loan, encoding="rgba8") == 1, "nothing above used a sequence number"
    msg = sub.recv(timeout=IO_TIMEOUT)
    assert msg.seq == 1 and np.all(np.from_dlpack(msg) == 9)
    with pytest.raises(zcs.ClosedError):
        pub.publish(loan, encoding="rgba8")

    spub = talker.create_publisher(ros2.String, "/s")
    with pytest.raises(ValueError, match="NUL"):
        spub.publish("a\0b")
    with pytest.raises(TypeError):
        spub.publish(b"bytes")
    tpub = talker.create_publisher(ros2.Tensor, "/t")
    with pytest.raises(ValueError, match="does not fit"):
        tpub._native.publish_tensor("float32", [3, 3], [], 0, data=bytes(8))
    with pytest.raises(ValueError):
        talker.create_publisher(ros2.Image, "/x", 0)
    with pytest.raises(ValueError, match="1camera"):
        talker.create_publisher(ros2.Image, "1camera")
    with pytest.raises(TypeError):
        talker.create_publisher("sensor_msgs/msg/Image", "/x")
    with pytest.raises(ValueError, match="unknown ROS distro"):
        ros2.Node(talker._session, "n", distro="ardent")
    # A String message is text, not a tensor.
    ssub = listener.create_subscription(ros2.String, "/s")
    wait_for("our String subscription", lambda: spub.our_subscriptions == 1)
    spub.publish("x")
    with pytest.raises(BufferError, match="text"):
        np.from_dlpack(ssub.recv(timeout=IO_TIMEOUT))
    pub.close()
    with pytest.raises(zcs.ClosedError):
        pub.publish(frame)
    talker.close()
    with pytest.raises(zcs.ClosedError):
        talker.create_publisher(ros2.Image, "/y")


def test_qos_as_rclpy_names_it(nodes):
    talker, _, _, _ = nodes
    assert ros2._qos(7) == ("reliable", "volatile", "keep_last", 7)
    assert ros2._qos(ros2.qos_profile_sensor_data) == ("best_effort", "volatile", "keep_last", 5)
    all_latched = ros2.QoSProfile(depth=3, durability=ros2.DurabilityPolicy.TRANSIENT_LOCAL,
                                  history=ros2.HistoryPolicy.KEEP_ALL)
    assert ros2._qos(all_latched) == ("reliable", "transient_local", "keep_all", 3)

    class RclpyLike:  # rclpy's QoSProfile, read by attribute and enum member name
        class _E:
            def __init__(self, name):
                self.name = name
        reliability, durability, history, depth = _E("BEST_EFFORT"), _E("VOLATILE"), _E("KEEP_LAST"), 4

    assert ros2._qos(RclpyLike()) == ("best_effort", "volatile", "keep_last", 4)
    pub = talker.create_publisher(ros2.Image, "/q", all_latched)
    assert pub.topic == "/q"


def examples_dir():
    """Where the Rust example binaries are: ZCS_EXAMPLES_DIR, else target/debug/examples
    (built here when missing)."""
    d = os.environ.get("ZCS_EXAMPLES_DIR")
    if d:
        return pathlib.Path(d)
    target = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT,
                                       check=True, capture_output=True, text=True).stdout)["target_directory"]
    d = pathlib.Path(target) / "debug" / "examples"
    if not (d / "ros2_image_pub").exists() or not (d / "ros2_image_sub").exists():
        subprocess.run(["cargo", "build", "-q", "-p", "zcs-examples", "--example", "ros2_image_pub",
                        "--example", "ros2_image_sub"], cwd=ROOT, check=True)
    return d


def rust_node(name, *args):
    return subprocess.Popen([str(examples_dir() / name), "--device", "host", "--no-multicast-scouting", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summary(proc, role):
    out, _ = proc.communicate(timeout=IO_TIMEOUT * 2)
    lines = [line for line in out.splitlines() if line.startswith('{"role":"%s"' % role)]
    assert lines, out
    return json.loads(lines[-1]), proc.returncode, out


def test_python_and_rust_nodes_both_ways():
    port, domain, n = free_port(), random.randrange(1, 200), 12
    with zcs.open({"device": "host"}, zenoh=zenoh_config(listen=port)) as session:
        node = ros2.Node(session, "py_node", domain=domain)
        # Rust → Python: every byte is the pattern of its sequence number.
        sub = node.create_subscription(ros2.Image, "/from_rust", qos_profile=ros2.QoSProfile(
            depth=10, history=ros2.HistoryPolicy.KEEP_ALL))
        rust_pub = rust_node("ros2_image_pub", "-e", f"tcp/127.0.0.1:{port}", "--domain", domain, "--topic",
                             "/from_rust", "--width", 320, "--height", 240, "-n", n, "-r", 50,
                             "--wait-zero-copy", 1, "--linger", 1)
        for seq in range(1, n + 1):
            msg = sub.recv(timeout=IO_TIMEOUT)
            assert (msg.seq, msg.encoding, msg.height, msg.width, msg.frame_id) == (seq, "rgba8", 240, 320, "camera")
            assert msg.in_place and msg.path == "zero-copy", msg.path_reason
            want = pattern(320 * 240 * 4, seq, np).astype(np.uint8)
            assert np.array_equal(np.from_dlpack(msg).reshape(-1), want), seq
        res, code, out = summary(rust_pub, "ros2_pub")
        assert code == 0 and res["frames"] == n, out

        # Python → Rust: the Rust subscriber checks every byte and sequence number.
        pub = node.create_publisher(ros2.Image, "/to_rust", ros2.QoSProfile(depth=10,
                                                                             history=ros2.HistoryPolicy.KEEP_ALL))
        rust_sub = rust_node("ros2_image_sub", "-e", f"tcp/127.0.0.1:{port}", "--domain", domain, "--topic",
                             "/to_rust", "-n", n, "--idle-timeout", 30)
        wait_for("the Rust subscription on the zero-copy path", lambda: pub.zero_copy_subscribers == 1)
        for _ in range(n):
            seq = pub.next_seq
            pub.publish(pattern(320 * 240 * 4, seq, np).astype(np.uint8).reshape(240, 320, 4), encoding="rgba8",
                        frame_id="camera")
        res, code, out = summary(rust_sub, "ros2_sub")
        assert code == 0, out
        assert (res["frames"], res["bad"], res["gaps"], res["disorder"]) == (n, 0, 0, 0), res
        assert res["paths"] == {"zero-copy": n}, res


@pytest.mark.parametrize("script,ready,role", [("ros2_pub.py", "[ros2] publishing on", "ros2_pub"),
                                               ("ros2_sub.py", "[ros2] subscribed to", "ros2_sub")],
                         ids=["ros2_pub", "ros2_sub"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_python_examples_stop_on_signals_with_a_summary(script, ready, role, sig):
    """Started the way a script's background job is (SIGINT ignored), the examples still
    stop on SIGINT and SIGTERM, and say how far they got."""
    def ignore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "python" / script), "--device", "host",
                             "--no-multicast-scouting", "-l", f"tcp/127.0.0.1:{free_port()}",
                             "--domain", str(random.randrange(1, 200)), "-n", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore_sigint)
    try:
        first = proc.stdout.readline()
        assert first.startswith(ready), first
        time.sleep(0.3)
        proc.send_signal(sig)
        res, code, out = summary(proc, role)
    finally:
        proc.kill()
        proc.wait()
    assert code == 0 and (res["frames"] > 0) == (role == "ros2_pub"), out


def test_a_waiting_python_subscriber_names_a_publisher_it_will_not_hear():
    """ros2_sub.py waits aloud, then names a publisher of its topic of another type (the
    graph's word, before any silence window); a publisher of another topic is not named."""
    port, domain, topic = free_port(), random.randrange(1, 200), f"/py_hints_{os.getpid()}"
    with zcs.open({"device": "host"}, zenoh=zenoh_config(listen=port)) as session:
        node = ros2.Node(session, "py_text_pub", domain=domain)
        pubs = [node.create_publisher(ros2.String, topic), node.create_publisher(ros2.Image, "/elsewhere")]
        proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "python" / "ros2_sub.py"), "--device",
                                 "host", "--no-multicast-scouting", "-e", f"tcp/127.0.0.1:{port}", "--domain",
                                 str(domain), "-t", topic, "--idle-timeout", "5"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        res, code, out = summary(proc, "ros2_sub")
        assert all(not p.closed for p in pubs)
    lines = out.splitlines()
    waiting = lines.index(f"[ros2] waiting for a publisher on {topic}…")
    hints = [i for i, line in enumerate(lines) if "will not be heard" in line]
    assert len(hints) == 1 and waiting < hints[0], out
    assert re.fullmatch(rf"\[ros2\] publisher [0-9a-f]{{32}} of {topic} \(node /py_text_pub\) will not be heard: "
                        r"it publishes another type \(std_msgs::msg::dds_::String_\)", lines[hints[0]]), out
    assert code == 1 and res["frames"] == 0, out
