"""Two Python processes over loopback Zenoh on host-memory sessions (no GPU): NumPy
tensors of many dtypes, shapes and strides, loans, bytes, and every way to receive."""

import asyncio
import threading
import time

import numpy as np
import pytest

import cases
import peer as peer_roles
import zenoh_cuda_shm as zcs
from zcs_testing import IO_TIMEOUT, Peer, zenoh_config


def same_values(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit-exact equality (NaN payloads and signed zeros included)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    return np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def test_numpy_cases_round_trip(host_session, port, key):
    sub = host_session.declare_subscriber(key)
    p = Peer("cases", port, key)
    try:
        for i, case in enumerate(cases.CASES):
            s = sub.recv(timeout=IO_TIMEOUT)
            want = case.make()
            assert (s.seq, s.key) == (i + 1, key), case.name
            assert s.is_tensor
            assert s.dtype == want.dtype.name, case.name
            assert s.shape == want.shape, case.name
            assert s.strides == cases.elem_strides(want), case.name
            assert s.byte_offset == 0
            assert s.source_device == (1, 0)
            assert s.nbytes == cases.touched_bytes(want), case.name
            expected_path = "zero-copy" if s.nbytes > cases.INLINE_THRESHOLD else "inline"
            assert s.path == expected_path, case.name
            got = np.from_dlpack(s)
            assert got.strides == want.strides, case.name
            assert same_values(got, want), case.name
            # Read in place: NumPy marks imports of read-only exports read-only.
            if s.path == "zero-copy":
                assert not got.flags.writeable
        p.expect("published")
        assert sub.try_recv() is None
    finally:
        p.finish()


def test_loans_written_in_place(host_session, port, key):
    sub = host_session.declare_subscriber(key)
    p = Peer("loans", port, key)
    try:
        for shape, dtype, fill in peer_roles.loan_cases():
            s = sub.recv(timeout=IO_TIMEOUT)
            want = np.zeros(shape, dtype=dtype)
            fill(want)
            assert s.dtype == want.dtype.name
            assert s.shape == shape
            assert same_values(np.from_dlpack(s), want)
        s = sub.recv(timeout=IO_TIMEOUT)
        assert (s.dtype, s.shape) == ("uint8", (11,))
        assert np.from_dlpack(s).tobytes() == b"hello world"
        assert s.to_bytes() == b"hello world"
        p.expect("published 6")
    finally:
        p.finish()


def test_bytes(host_session, port, key):
    sub = host_session.declare_subscriber(key)
    p = Peer("bytes", port, key)
    try:
        for want in (b"", b"x", b"hello bytes", bytes(range(256)) * 1024, b"from a bytearray",
                     b"from a memoryview"):
            s = sub.recv(timeout=IO_TIMEOUT)
            assert s.to_bytes() == want
            assert len(s) == s.nbytes == len(want)
            assert s.path == ("zero-copy" if len(want) > cases.INLINE_THRESHOLD else "inline")
            reason = sub.path_reason(s)
            assert (reason is None) if s.path == "zero-copy" else ("inline_threshold" in reason), reason
            assert not s.is_tensor and s.meta is None
            with pytest.raises(BufferError, match="no tensor description"):
                np.from_dlpack(s)
            with pytest.raises(BufferError):
                s.shape
        p.expect("published 6")
    finally:
        p.finish()


N = 20


def check_stream(samples):
    assert [s.seq for s in samples] == list(range(1, N + 1))
    for i, s in enumerate(samples):
        a = np.from_dlpack(s)
        assert a.shape == ((1000,) if i % 2 == 0 else (40000,))
        assert (a == i).all()
        assert s.path == ("inline" if i % 2 == 0 else "zero-copy")


def test_iteration(host_session, port, key):
    sub = host_session.declare_subscriber(key)
    p = Peer("stream", port, key, N)
    try:
        got = []
        for s in sub:
            got.append(s)
            if len(got) == N:
                break
        check_stream(got)
    finally:
        p.finish()


def test_callback(host_session, port, key):
    got, done, threads = [], threading.Event(), set()

    def on_sample(s):
        threads.add(threading.current_thread().name)
        got.append(s)
        if len(got) == 3:
            raise RuntimeError("a failing callback must not end the subscription")
        if len(got) == N:
            done.set()

    sub = host_session.declare_subscriber(key, callback=on_sample)
    p = Peer("stream", port, key, N)
    try:
        assert done.wait(IO_TIMEOUT), f"{len(got)} of {N} samples"
        check_stream(got)
        assert threads == {f"zcs-callback:{key}"}
        sub.close()
        assert sub._thread is not None and not sub._thread.is_alive()
    finally:
        p.finish()


def test_async_iteration(host_session, port, key):
    sub = host_session.declare_subscriber(key)
    p = Peer("stream", port, key, N)

    async def run():
        got = []
        ticks = 0

        async def ticker():
            # The event loop keeps running while samples are awaited.
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        async for s in sub:
            got.append(s)
            if len(got) == N:
                break
        with pytest.raises(TimeoutError):
            await sub.recv_async(timeout=0.2)
        t.cancel()
        return got, ticks

    try:
        got, ticks = asyncio.run(run())
        check_stream(got)
        assert ticks > 10
    finally:
        p.finish()


def test_async_cancellation_loses_nothing(host_session, port, key):
    sub = host_session.declare_subscriber(key)

    async def run():
        # Cancel receives again and again while the peer publishes: every sample must
        # still come out, in order.
        got = []
        while len(got) < N:
            task = asyncio.ensure_future(sub.recv_async())
            done, _ = await asyncio.wait([task], timeout=0.003)
            if task in done:
                got.append(task.result())
            else:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        return got

    p = Peer("stream", port, key, N)
    try:
        check_stream(asyncio.run(run()))
    finally:
        p.finish()


def test_close_wakes_a_blocked_recv(host_session, key):
    sub = host_session.declare_subscriber(key)
    caught = []

    def waiter():
        try:
            sub.recv()
        except zcs.ClosedError as e:
            caught.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    sub.close()
    t.join(5)
    assert not t.is_alive() and len(caught) == 1
    assert time.monotonic() - t0 < 2
    assert list(sub) == []


def test_publisher_keys_name_ours_and_those_a_key_misses(host_session, port, key):
    root = key.split("/")[0]
    mine = lambda keys: [k for k in keys if k.startswith(root + "/")]  # noqa: E731
    with zcs.open({"device": "host"}, zenoh=zenoh_config(connect=port)) as other:
        pubs = [other.declare_publisher(f"{root}/camera/left"), other.declare_publisher(f"{root}/lidar")]
        end = time.monotonic() + IO_TIMEOUT
        while len(mine(host_session.publisher_keys())) < 2:
            assert time.monotonic() < end, host_session.publisher_keys()
        assert mine(host_session.publisher_keys()) == [f"{root}/camera/left", f"{root}/lidar"]
        assert mine(host_session.publisher_keys(other_than=f"{root}/camera/*")) == [f"{root}/lidar"]
        assert mine(host_session.publisher_keys(timeout=0.5, other_than=f"{root}/**")) == []
        with pytest.raises(ValueError, match="other_than is not a key expression: Invalid Key Expr `/lidar`: .*slashes$"):
            host_session.publisher_keys(other_than="/lidar")
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            host_session.publisher_keys(timeout=-1)
        for p in pubs:
            p.close()
