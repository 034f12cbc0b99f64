"""Failure paths: what cannot be published, refused tensors and loans, timeouts, closed
objects and bad configurations — each with the exception type and message it raises."""

import json
import threading
import time

import numpy as np
import pytest

import zenoh_cuda_shm as zcs
from zcs_testing import zenoh_config


class FakeDevice:
    """An object claiming a device, whose __dlpack__ must not even be called."""

    def __init__(self, device):
        self.device = device
        self.called = False

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kw):
        self.called = True
        raise AssertionError("__dlpack__ called for a device that is refused first")


def test_unpublishable_objects(host_session, key):
    pub = host_session.declare_publisher(key)
    for obj in (object(), "text", 12, 1.5, None, [1, 2, 3], {"a": 1}):
        with pytest.raises(TypeError, match="cannot publish"):
            pub.put(obj)
    for dev, msg in (((2, 0), "host-memory session"), ((4, 0), "device type 4")):
        f = FakeDevice(dev)
        with pytest.raises(ValueError, match=msg):
            pub.put(f)
        assert not f.called

    class NotACapsule:
        def __dlpack__(self, **kw):
            return b"bytes"

    with pytest.raises(BufferError, match="not a DLPack capsule"):
        pub.put(NotACapsule())

    class Raises:
        def __dlpack__(self, **kw):
            raise BufferError("producer refused")

    with pytest.raises(BufferError, match="producer refused"):
        pub.put(Raises())
    assert pub.stats()["messages"] == 0


def test_refused_tensors(host_session, key):
    pub = host_session.declare_publisher(key)
    sub = host_session.declare_subscriber(key)
    with pytest.raises(ValueError, match="is negative"):
        pub.put(np.arange(10, dtype=np.int32)[::-1])
    with pytest.raises(ValueError, match="is negative"):
        pub.put(np.arange(12.0).reshape(3, 4)[:, ::-2])
    # Nothing was sent for them; a valid tensor afterwards arrives as sequence 1.
    assert pub.put(np.arange(3, dtype=np.uint8)) == 1
    s = sub.recv(timeout=10)
    assert s.seq == 1 and np.from_dlpack(s).tolist() == [0, 1, 2]


def test_legacy_producer_without_max_version(host_session, key):
    """A producer older than DLPack 1.0 rejects `max_version`: the put retries without."""
    pub = host_session.declare_publisher(key)
    sub = host_session.declare_subscriber(key)
    calls = []

    class Old:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            calls.append(stream)
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    pub.put(Old(np.arange(5, dtype=np.int64)))
    assert calls == [None]
    assert np.from_dlpack(sub.recv(timeout=10)).tolist() == [0, 1, 2, 3, 4]


def test_loan_errors(host_session, key):
    pub = host_session.declare_publisher(key)
    with pytest.raises(ValueError, match="unknown dtype \"float128\""):
        pub.loan(4, "float128")
    with pytest.raises(TypeError, match="cannot read a dtype"):
        pub.loan(4, object())
    with pytest.raises(ValueError, match="at least one byte"):
        pub.loan((0, 3), "float32")
    with pytest.raises(ValueError, match="invalid tensor"):
        pub.loan((2, -1), "float32")
    with pytest.raises(zcs.LoanError, match="exceed"):
        pub.loan(1 << 40, "uint8")
    loan = pub.loan(8, np.int16)
    np.from_dlpack(loan)[:] = 5
    assert pub.put(loan) == 1
    with pytest.raises(zcs.ClosedError, match="already published"):
        pub.put(loan)
    with pytest.raises(zcs.ClosedError):
        np.from_dlpack(loan)
    with pytest.raises(zcs.ClosedError):
        loan.write(b"x")


def test_timeouts(host_session, key):
    sub = host_session.declare_subscriber(key)
    t = time.monotonic()
    with pytest.raises(TimeoutError, match="within"):
        sub.recv(timeout=0.3)
    assert 0.29 <= time.monotonic() - t < 3
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0)
    assert sub.try_recv() is None
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            sub.recv(timeout=bad)


def test_peer_gpus_choice(host_session, key):
    # Accepted on any session (it only matters for publishers on another GPU)...
    for mode in ("in_place", "copy", "host", "off"):
        host_session.declare_subscriber(key + "/" + mode, peer_gpus=mode)
    # ...and a misspelt one is refused by name, not ignored.
    with pytest.raises(ValueError, match='peer_gpus must be "in_place", "copy", "host" or "off"'):
        host_session.declare_subscriber(key, peer_gpus="in-place")


def test_closed_objects(port, key):
    s = zcs.open({"device": "host"}, zenoh=zenoh_config(listen=port))
    pub = s.declare_publisher(key)
    sub = s.declare_subscriber(key)
    pub.put(b"before close")
    kept = sub.recv(timeout=10)
    loan = pub.loan(4)
    s.close()
    assert s.closed and pub.closed and sub.closed
    s.close()  # idempotent
    assert kept.to_bytes() == b"before close"  # received samples stay readable
    for call in (lambda: pub.put(b"x"), lambda: pub.put(np.zeros(3)), lambda: pub.loan(4), lambda: pub.put(loan),
                 lambda: sub.recv(timeout=1), lambda: sub.try_recv(), lambda: s.declare_publisher(key),
                 lambda: s.declare_subscriber(key), lambda: s.backend, lambda: pub.stats(), lambda: sub.stats()):
        with pytest.raises(zcs.ClosedError, match="closed"):
            call()
    assert list(sub) == []
    assert "closed" in repr(s) and "closed" in repr(pub) and "closed" in repr(sub)


def test_closing_one_publisher_keeps_the_session(host_session, key):
    a = host_session.declare_publisher(key + "/a")
    b = host_session.declare_publisher(key + "/b")
    with a:
        pass
    assert a.closed and not b.closed and not host_session.closed
    with pytest.raises(zcs.ClosedError):
        a.put(b"x")
    b.put(b"x")


def test_bad_configurations():
    # A dict has no lines: the message names the key alone, said once.
    with pytest.raises(ValueError, match=r"^invalid configuration: devise: unknown field `devise`, expected one of"):
        zcs.open({"devise": "host"})
    with pytest.raises(ValueError, match=r"^invalid configuration: line 1: device: unknown variant `tpu`"):
        zcs.open("{ device: 'tpu' }")
    # A host id is a chunk of our key expressions: no '/' or wildcard gets through.
    with pytest.raises(ValueError, match="host_id"):
        zcs.open({"device": "host", "host_id": "robot/a"})
    with pytest.raises(ValueError, match="invalid zenoh config"):
        zcs.open({"device": "host"}, zenoh={"mode": "not-a-mode"})
    with pytest.raises(ValueError, match="invalid zenoh config"):
        zcs.open({"device": "host"}, zenoh="{ this is not json5")
    with pytest.raises(ValueError, match="cannot read"):
        zcs.open(__import__("pathlib").Path("/nonexistent/zcs.json5"))
    with pytest.raises(TypeError, match="configuration must be"):
        zcs.open(42)


def test_config_from_file(tmp_path, port):
    f = tmp_path / "zcs.json5"
    f.write_text("{ device: 'host', inline_threshold: 1024 }")
    z = tmp_path / "zenoh.json5"
    z.write_text('{ mode: "peer", scouting: { multicast: { enabled: false } }, '
                 f'listen: {{ endpoints: ["tcp/127.0.0.1:{port}"] }} }}')
    with zcs.open(f, zenoh=z) as s:
        assert s.backend == "host-memfd"
        assert "device: host" in s.host_reason
        assert len(s.zid) > 0


def test_config_path_given_as_str(tmp_path, monkeypatch):
    """A str naming a file is read as a file, relative to the working directory too; a
    str that looks like a file name but names none is a missing file, not bad JSON5."""
    (tmp_path / "zcs.json5").write_text("{ device: 'host' }")
    (tmp_path / "zenoh.json").write_text(json.dumps(zenoh_config()))  # an ephemeral port
    with zcs.open(str(tmp_path / "zcs.json5"), zenoh=str(tmp_path / "zenoh.json")) as s:
        assert s.backend == "host-memfd"
        assert "device: host" in s.host_reason
    monkeypatch.chdir(tmp_path)
    with zcs.open("zcs.json5", zenoh="zenoh.json") as s:
        assert s.backend == "host-memfd"
    with pytest.raises(FileNotFoundError, match="'missing.json5' not found"):
        zcs.open("missing.json5")
    with pytest.raises(FileNotFoundError, match="'conf/zenoh.json' not found"):
        zcs.open({"device": "host"}, zenoh="conf/zenoh.json")
    # Text stays text, also when it mentions a file name.
    with pytest.raises(ValueError, match="invalid config"):
        zcs.open("{ device: 'x.json5' }")


def test_invalid_keys(host_session):
    with pytest.raises(zcs.ZcsError, match="key"):
        host_session.declare_publisher("a/*/wild")
    with pytest.raises(zcs.ZcsError):
        host_session.declare_subscriber("")
    with pytest.raises(ValueError, match="capacity"):
        host_session.declare_subscriber("ok/key", capacity=0)


def test_gil_is_released_while_waiting(host_session, key):
    """Another Python thread keeps running while recv blocks."""
    sub = host_session.declare_subscriber(key)
    count = 0
    stop = threading.Event()

    def spin():
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0.5)
    stop.set()
    t.join()
    assert count > 1000
