"""The DLPack protocol of received samples and of loans, read at the C level: capsule
names, the renaming on consumption, version, flags, device, deleters (counted by the
library), `stream`, `max_version`, `dl_device` and `copy`."""

import ctypes

import numpy as np
import pytest

import zenoh_cuda_shm as zcs
from zenoh_cuda_shm import _native
from zcs_testing import IO_TIMEOUT, Peer

api = ctypes.pythonapi
api.PyCapsule_GetName.restype = ctypes.c_char_p
api.PyCapsule_GetName.argtypes = [ctypes.py_object]
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

READ_ONLY, IS_COPIED = 1, 2


def capsule_name(cap) -> bytes:
    return api.PyCapsule_GetName(cap)


def read_versioned(cap):
    """(version, flags, device, ndim, dtype, shape, strides, byte_offset) of a
    DLManagedTensorVersioned (dlpack.h v1.3 layout on 64-bit)."""
    p = api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    u32 = lambda off: ctypes.c_uint32.from_address(p + off).value  # noqa: E731
    u64 = lambda off: ctypes.c_uint64.from_address(p + off).value  # noqa: E731
    i32 = lambda off: ctypes.c_int32.from_address(p + off).value  # noqa: E731
    version, flags = (u32(0), u32(4)), u64(24)
    t = 32
    device = (i32(t + 8), i32(t + 12))
    ndim = i32(t + 16)
    dtype = (ctypes.c_uint8.from_address(p + t + 20).value, ctypes.c_uint8.from_address(p + t + 21).value,
             ctypes.c_uint16.from_address(p + t + 22).value)
    shape_p, strides_p = u64(t + 24), u64(t + 32)
    shape = tuple((ctypes.c_int64 * ndim).from_address(shape_p)) if ndim else ()
    strides = tuple((ctypes.c_int64 * ndim).from_address(strides_p)) if ndim else ()
    return version, flags, device, ndim, dtype, shape, strides, u64(t + 40), u64(t)


@pytest.fixture
def samples(host_session, port, key):
    """Four samples from a peer: int32 arrays of value i, inline (even i) and zero-copy
    (odd i)."""
    sub = host_session.declare_subscriber(key)
    p = Peer("stream", port, key, 4)
    try:
        got = [sub.recv(timeout=IO_TIMEOUT) for _ in range(4)]
        assert [s.path for s in got] == ["inline", "zero-copy", "inline", "zero-copy"]
        yield got
    finally:
        p.finish()


def test_capsules_versions_flags_and_deleters(samples):
    base = _native._live_exports()
    for s in samples:
        assert s.__dlpack_device__() == (1, 0)
        legacy = s.__dlpack__()
        assert capsule_name(legacy) == b"dltensor"
        for mv in [(1, 0), (1, 3), (2, 0)]:
            cap = s.__dlpack__(max_version=mv)
            assert capsule_name(cap) == b"dltensor_versioned"
            version, flags, device, ndim, dtype, shape, strides, offset, data = read_versioned(cap)
            assert version[0] == 1
            assert data % 4 == 0  # aligned to the item size, whatever Zenoh's buffer offset
            if s.path == "zero-copy":
                assert flags == READ_ONLY  # in place: other subscribers read the same block
            else:
                # Inline bytes are read in place when aligned, else from an aligned copy.
                assert flags in (READ_ONLY, IS_COPIED)
            assert (device, ndim, dtype, shape, strides, offset) == ((1, 0), 1, (0, 32, 1), s.shape, (1,), 0)
            del cap
        assert capsule_name(s.__dlpack__(max_version=(0, 8))) == b"dltensor"
        copied = s.__dlpack__(max_version=(1, 0), copy=True)
        assert read_versioned(copied)[1] == IS_COPIED
        assert _native._live_exports() == base + 2  # `legacy` and `copied`
        del legacy, copied
    # Every unconsumed capsule's destructor ran its tensor's deleter, once.
    assert _native._live_exports() == base


def test_numpy_imports_and_copies(samples):
    base = _native._live_exports()
    for i, s in enumerate(samples):
        a = np.from_dlpack(s)
        assert (a == i).all()
        if s.path == "zero-copy":
            assert not a.flags.writeable  # in place, READ_ONLY
        c = np.from_dlpack(s, copy=True)
        assert c.flags.writeable
        c[:] = -1  # a private copy: the sample is unchanged
        assert (np.from_dlpack(s) == i).all()
        if s.path == "zero-copy":
            assert (np.from_dlpack(s, copy=False) == i).all()
        else:
            try:
                assert (np.from_dlpack(s, copy=False) == i).all()
            except BufferError as e:  # refused only when a copy is needed
                assert "aligned" in str(e) or "contiguous" in str(e)
        assert (np.from_dlpack(s, device="cpu") == i).all()
        del a, c
    assert _native._live_exports() == base


def test_consumed_capsule_is_not_deleted_twice(samples, host_session, key):
    """A consumer renames the capsule and owns the tensor: here the publisher takes it
    (forwarding a received sample), runs its deleter after the copy, and the capsule's
    destructor must leave it alone."""
    base = _native._live_exports()
    pub = host_session.declare_publisher(key + "/fwd")
    sub = host_session.declare_subscriber(key + "/fwd")
    seen = []

    class Forward:
        def __init__(self, s):
            self.s = s

        def __dlpack__(self, **kw):
            cap = self.s.__dlpack__(**kw)
            seen.append(cap)
            return cap

        def __dlpack_device__(self):
            return self.s.__dlpack_device__()

    for i, s in enumerate(samples):
        pub.put(Forward(s))
        assert capsule_name(seen[-1]) == b"used_dltensor_versioned"
        assert _native._live_exports() == base  # deleted by the publisher, after its copy
        got = sub.recv(timeout=IO_TIMEOUT)
        assert (np.from_dlpack(got) == i).all() and got.shape == s.shape
    seen.clear()  # the capsules' destructors see the used name: no second delete
    assert _native._live_exports() == base
    # A capsule that was already consumed cannot be taken again.
    used = samples[0].__dlpack__(max_version=(1, 0))
    assert api.PyCapsule_SetName(used, b"used_dltensor_versioned") == 0

    class Used:
        def __dlpack__(self, **kw):
            return used

    with pytest.raises(BufferError, match="already consumed"):
        pub.put(Used())
    # Renamed by hand, nobody owns it any more: the export leaks by design, the count shows it.
    del used
    assert _native._live_exports() == base + 1


def test_export_requests_refused(samples):
    s = samples[1]
    with pytest.raises(BufferError, match="stream must be None"):
        s.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="stream must be None"):
        s.__dlpack__(stream=0)
    s.__dlpack__(stream=-1)  # nothing to synchronise: accepted
    with pytest.raises(TypeError, match="stream must be"):
        s.__dlpack__(stream="default")
    with pytest.raises(BufferError, match="not \\(2, 0\\)"):
        s.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError):
        s.__dlpack__(1)  # keyword-only, as the protocol says


def test_loan_exports(host_session, key):
    pub = host_session.declare_publisher(key)
    loan = pub.loan((3, 4), np.float32)
    assert (loan.shape, loan.dtype, loan.nbytes, loan.device, loan.open) == ([3, 4], "float32", 48, "cpu", True)
    assert loan.__dlpack_device__() == (1, 0)
    cap = loan.__dlpack__(max_version=(1, 0))
    version, flags, device, ndim, dtype, shape, strides, offset, data = read_versioned(cap)
    assert data % 16 == 0
    assert (flags, device, dtype, shape, strides) == (0, (1, 0), (2, 32, 1), (3, 4), (4, 1))  # writable
    assert capsule_name(loan.__dlpack__()) == b"dltensor"
    del cap
    a = np.from_dlpack(loan)
    assert a.flags.writeable and a.shape == (3, 4)
    with pytest.raises(BufferError, match="in place only"):
        loan.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        loan.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="stream must be None"):
        loan.__dlpack__(stream=5)
    with pytest.raises(ValueError, match="exceeds"):
        loan.write(b"x" * 49)
    loan.release()
    assert not loan.open
    with pytest.raises(zcs.ClosedError):
        np.from_dlpack(loan)
    with pytest.raises(zcs.ClosedError):
        pub.put(loan)
    loan.release()  # idempotent
