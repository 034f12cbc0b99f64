"""NumPy tensors both processes build identically: the publisher puts them, the
subscriber checks every received description field and value against its own copy."""

from __future__ import annotations

from typing import Callable, List, NamedTuple

import numpy as np

INLINE_THRESHOLD = 64 * 1024  # the library's default


class Case(NamedTuple):
    name: str
    make: Callable[[], np.ndarray]


def _f16_specials() -> np.ndarray:
    # +0, -0, 1, -2, max, min subnormal, max subnormal, +inf, -inf, a quiet NaN, a NaN
    # with payload: the bit patterns must survive exactly.
    bits = [0x0000, 0x8000, 0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x7C00, 0xFC00, 0x7E00, 0x7D01, 0x1234]
    return np.array(bits, dtype=np.uint16).view(np.float16).reshape(3, 4)


def _ramp(dtype: str, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + 3) % 113).astype(dtype)


def _i64_extremes() -> np.ndarray:
    i = np.iinfo(np.int64)
    return np.array([i.min, i.min + 1, -1, 0, 1, i.max - 1, i.max], dtype=np.int64)


def _u64_extremes() -> np.ndarray:
    return np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)


def _complex(dtype: str) -> np.ndarray:
    re = np.linspace(-3.5, 9.25, 24)
    return (re + 1j * re[::-1]).astype(dtype).reshape(2, 3, 4)


def _bool() -> np.ndarray:
    return (np.arange(40) % 3 == 0).reshape(5, 8)


def _big(dtype: str) -> np.ndarray:
    # 256 x 300 elements: above the inline threshold for every dtype here.
    return _ramp(dtype, 256 * 300).reshape(256, 300)


CASES: List[Case] = [
    Case("float16 specials", _f16_specials),
    Case("float32 2x3", lambda: np.arange(6, dtype=np.float32).reshape(2, 3) / 3),
    Case("float64 ramp", lambda: np.linspace(-1e300, 1e300, 17)),
    Case("int8", lambda: np.array([-128, -1, 0, 1, 127], dtype=np.int8)),
    Case("int16", lambda: _ramp("int16", 33)),
    Case("int32 3d", lambda: _ramp("int32", 60).reshape(3, 4, 5)),
    Case("int64 extremes", _i64_extremes),
    Case("uint8", lambda: _ramp("uint8", 300)),
    Case("uint16", lambda: _ramp("uint16", 19)),
    Case("uint32", lambda: _ramp("uint32", 23)),
    Case("uint64 extremes", _u64_extremes),
    Case("bool 5x8", _bool),
    Case("complex64", lambda: _complex("complex64")),
    Case("complex128", lambda: _complex("complex128")),
    Case("scalar float64", lambda: np.array(3.25)),
    Case("scalar bool", lambda: np.array(True)),
    Case("zero-size 0x3", lambda: np.zeros((0, 3), dtype=np.float32)),
    Case("zero-size 5x0x2", lambda: np.zeros((5, 0, 2), dtype=np.int16)),
    Case("size-1 dims", lambda: _ramp("float32", 6).reshape(1, 6, 1)),
    Case("strided rows and columns", lambda: _ramp("int32", 120).reshape(10, 12)[1::3, 2::4]),
    Case("transposed", lambda: _ramp("float64", 12).reshape(3, 4).T),
    Case("fortran order", lambda: np.asfortranarray(_ramp("uint16", 30).reshape(5, 6))),
    Case("broadcast-free 3d step", lambda: _ramp("int8", 4 * 5 * 6).reshape(4, 5, 6)[::2, ::-1][:, ::-1, 1::2]),
    Case("big contiguous float32", lambda: _big("float32")),
    Case("big strided int64", lambda: _big("int64")[::3, 5::7]),
    Case("big float16", lambda: _big("float16")),
    Case("big complex128 transposed", lambda: _big("complex128")[:64].T),
]


def elem_strides(a: np.ndarray) -> tuple:
    return tuple(s // a.itemsize for s in a.strides)


def touched_bytes(a: np.ndarray) -> int:
    """Bytes from the first element to the end of the last one (the payload a put copies)."""
    if a.size == 0:
        return 0
    return (1 + sum((d - 1) * s for d, s in zip(a.shape, elem_strides(a)))) * a.itemsize
