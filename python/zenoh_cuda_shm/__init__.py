"""Zero-copy GPU tensors between processes, over Zenoh.

A publisher puts any object with ``__dlpack__`` (PyTorch, CuPy, JAX, NumPy), bytes, or a
block it loaned and wrote in place. A subscriber on the same host and GPU receives the
publisher's block mapped into its own process, read in place on its own CUDA stream;
every other subscriber gets bytes. Received samples implement the DLPack protocol, so
``torch.from_dlpack(sample)``, ``cupy.from_dlpack(sample)``,
``jax.dlpack.from_dlpack(sample)`` and ``numpy.from_dlpack(sample)`` all work.

Without a GPU the same protocol runs over host memory, which NumPy reads in place.

    import zenoh_cuda_shm as zcs

    with zcs.open() as session:
        sub = session.declare_subscriber("demo/tensor")
        pub = session.declare_publisher("demo/tensor")
        pub.put(torch.arange(10, device="cuda"))
        t = torch.from_dlpack(sub.recv(timeout=5))  # waits on the current stream
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import threading
import traceback
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from . import _native
from ._native import ClosedError, Loan, LoanError, Sample, ZcsError, dtype_names, init_logging

__version__ = _native.__version__

__all__ = [
    "ClosedError",
    "Loan",
    "LoanError",
    "Publisher",
    "Sample",
    "Session",
    "Subscriber",
    "ZcsError",
    "dtype_names",
    "init_logging",
    "open",
]

ConfigLike = Union[None, str, "os.PathLike[str]", Dict[str, Any]]


_CONFIG_SUFFIXES = (".json5", ".json")


def _config_arg(cfg: ConfigLike) -> Any:
    """A dict becomes JSON text (JSON is JSON5); an ``os.PathLike`` passes through and a
    str naming an existing file becomes a ``pathlib.Path``, both read by the native
    layer as files; any other str is JSON5 text.

    The native layer takes every str as text, so a file name given as a str would fail
    as unparsable JSON5; a str that looks like a file name (ends in .json5 or .json) but
    names no file is refused here as a missing file instead.
    """
    if cfg is None:
        return None
    if isinstance(cfg, dict):
        return json.dumps(cfg)
    if isinstance(cfg, str):
        if os.path.isfile(cfg):
            return pathlib.Path(cfg)
        if cfg.strip().lower().endswith(_CONFIG_SUFFIXES):
            raise FileNotFoundError(
                f"configuration file {cfg!r} not found (relative paths start at {os.getcwd()}); "
                "pass the path of an existing file, JSON5 text or a dict"
            )
        return cfg
    if isinstance(cfg, os.PathLike):
        return cfg  # the native layer reads the file
    raise TypeError(f"a configuration must be a dict, JSON5 text or a path, not {type(cfg).__name__}")


def open(config: ConfigLike = None, *, zenoh: ConfigLike = None) -> "Session":  # noqa: A001 - the API's name
    """Opens a session.

    ``config`` configures this library (see ``examples/config.json5``: ``device``,
    ``inline_threshold``, ``pool``, …) and ``zenoh`` configures Zenoh (mode, endpoints,
    scouting, …). Each is a dict, JSON5 text or a path to a JSON5 file (an
    ``os.PathLike``, or a str that names an existing file); ``None`` gives the defaults.
    ``ZCS_DEVICE``, ``ZCS_INLINE_THRESHOLD`` and ``ZCS_SOCKET_DIR`` override ``config``.
    Raises ``ValueError`` for an invalid configuration (or an unreadable path given as
    an ``os.PathLike``), ``FileNotFoundError`` for a str ending in .json5 or .json that
    names no file, and ``ZcsError`` when Zenoh or the device cannot be opened.
    """
    try:
        return Session(_native.open(_config_arg(config), _config_arg(zenoh)))
    except ValueError as e:
        if isinstance(config, dict) and str(e).startswith("invalid configuration: line "):
            # A dict has no lines: the key the message names is what locates the fault.
            raise ValueError(re.sub(r"^invalid configuration: line \d+: ", "invalid configuration: ", str(e))) from None
        raise


def _dtype_name(dtype: Any) -> str:
    """The library's name for a dtype given as a name, a NumPy/CuPy/JAX dtype or scalar
    type, or a ``torch.dtype``."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text[len("torch."):]
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        try:
            return numpy.dtype(dtype).name
        except TypeError:
            pass
    raise TypeError(f"cannot read a dtype from {dtype!r}")


_W = TypeVar("_W", bound="_Native")


class _Native:
    """What the wrappers share: a context manager that closes, and the native repr."""

    _native: Any

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._native)


class Session(_Native):
    """A Zenoh session with a GPU (or host-memory) block provider. Close it (or use it
    as a context manager) to undeclare everything it declared."""

    def __init__(self, native: _native.Session) -> None:
        self._native = native

    def declare_publisher(self, key: str) -> "Publisher":
        """Declares a publisher on a concrete key."""
        return Publisher(self._native.declare_publisher(key))

    def declare_subscriber(
        self,
        key: str,
        callback: Optional[Callable[[Sample], Any]] = None,
        *,
        capacity: int = 256,
        peer_gpus: Optional[str] = None,
    ) -> "Subscriber":
        """Declares a subscriber on a key expression (wildcards allowed).

        Samples queue in a FIFO of ``capacity``. When it is full, a new sample replaces
        the oldest queued one (counted in ``stats()["dropped_queue_full"]``), so that
        neither another key nor the publisher's other subscribers wait for this one.
        With ``callback``, a thread of this process calls it for every sample, in order;
        Zenoh's own threads never wait for Python code or the GIL. ``peer_gpus``
        (``"in_place"``, ``"copy"``, ``"host"`` or ``"off"``) overrides the session's
        choice for publishers on another GPU of this host.
        """
        sub = Subscriber(self._native.declare_subscriber(key, capacity, peer_gpus))
        if callback is not None:
            sub._start_callback(callback)
        return sub

    def close(self) -> None:
        """Closes every publisher and subscriber of the session, then Zenoh. Samples
        already received stay readable. Idempotent."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def backend(self) -> str:
        """``"cuda-vmm"`` (GPU blocks) or ``"host-memfd"`` (host memory)."""
        return self._native.backend

    @property
    def host_reason(self) -> Optional[str]:
        """Why the session uses host memory, if it does."""
        return self._native.host_reason

    @property
    def gpu_ordinal(self) -> Optional[int]:
        return self._native.gpu_ordinal

    @property
    def gpu_name(self) -> Optional[str]:
        return self._native.gpu_name

    @property
    def zid(self) -> str:
        """The Zenoh session id."""
        return self._native.zid

    def publisher_keys(self, timeout: float = 0.5, other_than: Optional[str] = None) -> List[str]:
        """The keys of this library's publishers the session sees now (sorted), waiting
        at most ``timeout`` s for answers; with ``other_than``, those that key expression
        does not match: where to look when a subscriber hears nothing (a mistyped key).
        Plain Zenoh publishers are not listed."""
        return self._native.publisher_keys(timeout, other_than)



class Publisher(_Native):
    """Publishes on one key: zero-copy to subscribers on the same host and GPU (and on
    another GPU of the host with peer access, over NVLink or PCIe), bytes to everyone
    else."""

    def __init__(self, native: _native.Publisher) -> None:
        self._native = native

    def put(self, obj: Any) -> int:
        """Publishes ``obj`` and returns its sequence number.

        - a :class:`Loan` from :meth:`loan`: published in place, its ready signal after
          the writes enqueued on the streams it was exported to (no host wait);
        - any object with ``__dlpack__`` (``torch.Tensor``, ``cupy.ndarray``,
          ``jax.Array``, ``numpy.ndarray``): the bytes its view touches are copied into a
          block (device→device for CUDA tensors on this session's GPU) and published
          with its dtype, shape and strides;
        - ``bytes``, ``bytearray``, ``memoryview``: published as bytes.

        Raises ``TypeError`` for anything else, ``ValueError`` for a tensor the library
        refuses (e.g. negative strides, another device), ``LoanError`` when no block is
        free, ``ClosedError`` once closed.
        """
        if isinstance(obj, Loan):
            return self._native.put_loan(obj)
        if isinstance(obj, bytes):
            return self._native.put_bytes(obj)
        if isinstance(obj, (bytearray, memoryview)):
            return self._native.put_bytes(bytes(obj))
        if hasattr(obj, "__dlpack__"):
            return self._native.put_tensor(obj)
        raise TypeError(
            f"cannot publish {type(obj).__name__}: expected an object with __dlpack__, a Loan, or bytes"
        )

    def loan(self, shape: Union[int, Sequence[int]], dtype: Any = "uint8") -> Loan:
        """Loans a block for a contiguous tensor, to write in place.

        Import it with any framework (``torch.from_dlpack(loan)``, ``np.from_dlpack(loan)``),
        write it on the stream the framework uses, then ``put(loan)``. The tensor must not
        be used after ``put``: the block then belongs to the subscribers. ``dtype`` is a
        name (``"float32"``) or a NumPy/PyTorch/JAX dtype.
        """
        dims = [int(shape)] if isinstance(shape, int) else [int(d) for d in shape]
        return self._native.loan(dims, _dtype_name(dtype))

    def stats(self) -> Dict[str, int]:
        """The publisher's counters (messages, leases, copies, handshakes, …)."""
        return json.loads(self._native._stats_json())

    def close(self) -> None:
        """Undeclares the publisher. Idempotent."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def key(self) -> str:
        return self._native.key

    @property
    def backend(self) -> str:
        return self._native.backend

    @property
    def zero_copy_subscribers(self) -> int:
        """Subscriber connections on the zero-copy path."""
        return self._native.zero_copy_subscribers

    @property
    def aware_subscribers(self) -> int:
        """Subscribers of this library known to the publisher (on the zero-copy path or not)."""
        return self._native.aware_subscribers

    @property
    def plain_subscribers(self) -> bool:
        """Whether a subscriber needs bytes (each put then copies the payload once)."""
        return self._native.plain_subscribers



class Subscriber(_Native):
    """Receives samples: :meth:`recv`, iteration, async iteration, or a callback (one
    way per subscriber: samples go to whichever receive asks first)."""

    def __init__(self, native: _native.Subscriber) -> None:
        self._native = native
        self._thread: Optional[threading.Thread] = None
        self._pending: "Optional[asyncio.Future[Optional[Sample]]]" = None

    def recv(self, timeout: Optional[float] = None) -> Sample:
        """The next sample, waiting up to ``timeout`` seconds (``None``: forever).

        Raises ``TimeoutError`` when none came and ``ClosedError`` once closed. The GIL is
        released while waiting.
        """
        return self._native.recv(timeout)

    def try_recv(self) -> Optional[Sample]:
        """The next sample if one is queued, else ``None``."""
        return self._native.try_recv()

    def __iter__(self) -> Iterator[Sample]:
        """Samples until the subscriber is closed."""
        while True:
            try:
                yield self.recv()
            except ClosedError:
                return

    async def recv_async(self, timeout: Optional[float] = None) -> Sample:
        """The next sample, awaited without blocking the event loop. Raises
        ``TimeoutError`` when none came within ``timeout`` seconds, ``ClosedError`` once
        closed. Cancelling it loses no sample and keeps the order."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            # One receive at a time runs in the executor. A receive whose awaiting task
            # was cancelled keeps running; the next call awaits it instead of starting a
            # second one that could overtake it.
            fut = self._pending
            if fut is None or fut.get_loop() is not loop:
                wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - loop.time()))
                fut = loop.run_in_executor(None, self._poll, wait)
                self._pending = fut
            done, _ = await asyncio.wait([fut], timeout=None if deadline is None else
                                         max(0.0, deadline - loop.time()))
            if fut in done and self._pending is fut:
                # This task takes the result (another task awaiting the same receive
                # finds `_pending` changed and goes round again).
                self._pending = None
                sample = fut.result()
                if sample is not None:
                    return sample
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"no sample on {self.key!r} within {timeout} s")

    def _poll(self, wait: float) -> Optional[Sample]:
        try:
            return self._native.recv(wait)
        except TimeoutError:
            return None

    def __aiter__(self) -> AsyncIterator[Sample]:
        return self

    async def __anext__(self) -> Sample:
        try:
            return await self.recv_async()
        except ClosedError:
            raise StopAsyncIteration from None

    def _start_callback(self, callback: Callable[[Sample], Any]) -> None:
        def run() -> None:
            for sample in self:
                try:
                    callback(sample)
                except Exception:  # a failing callback must not end the subscription
                    traceback.print_exc()
                finally:
                    del sample

        self._thread = threading.Thread(target=run, name=f"zcs-callback:{self.key}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Undeclares the subscriber; a callback thread ends after its current call.
        Samples already received stay readable. Idempotent."""
        self._native.close()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def key(self) -> str:
        return self._native.key

    def publishers(self) -> List[Tuple[int, bool]]:
        """Publishers of this library the subscriber knows: ``(instance id, zero-copy)``."""
        return self._native.publishers()

    def path_reason(self, sample: Sample) -> Optional[str]:
        """Why ``sample`` came by its path, to print beside it (``None`` for zero-copy):
        e.g. ``"on another host"`` or ``"handshake failed: …"`` for ``cpu-bytes``."""
        return self._native.path_reason(sample)

    def stats(self) -> Dict[str, int]:
        """The subscriber's counters (per path, imports, handshakes, …)."""
        return json.loads(self._native._stats_json())

