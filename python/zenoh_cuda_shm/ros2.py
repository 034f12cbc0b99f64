"""ROS 2 nodes over rmw_zenoh, from Python: camera frames and tensors in place.

A :class:`Node` joins an rmw_zenoh graph like any ROS 2 node (rclpy, rclcpp): its
publishers and subscriptions are in the graph, rclpy nodes hear them and are heard.
Between nodes of this library on one host and GPU the data stays in its block, and a
received :class:`Message` is read in place through DLPack::

    import torch
    import zenoh_cuda_shm as zcs
    from zenoh_cuda_shm import ros2

    with zcs.open() as session:
        node = ros2.Node(session, "detector")
        for msg in node.create_subscription(ros2.Image, "/camera/image", qos_profile=ros2.qos_profile_sensor_data):
            frame = torch.from_dlpack(msg)  # [height, width, channels], on the GPU when it came there

Message types: :data:`Image` (``sensor_msgs/msg/Image``), :data:`Tensor`
(``tensor_msgs/msg/ExperimentalTensor``) and :data:`String` (``std_msgs/msg/String``).
QoS is given as rclpy gives it: a depth, a :class:`QoSProfile`, or one of rclpy's own
profiles.
"""

from __future__ import annotations

import enum
import time as _time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

from . import Loan, Session, Subscriber, _dtype_name, _native

__all__ = [
    "DurabilityPolicy",
    "HistoryPolicy",
    "Image",
    "Message",
    "Node",
    "Publisher",
    "QoSProfile",
    "ReliabilityPolicy",
    "String",
    "Subscription",
    "Tensor",
    "pixel_layout",
    "qos_profile_default",
    "qos_profile_sensor_data",
]


class _MsgType(NamedTuple):
    kind: str
    type_name: str

    def __repr__(self) -> str:
        return self.type_name


#: ``sensor_msgs/msg/Image``: received as ``[height, width, channels]``.
Image = _MsgType("image", "sensor_msgs/msg/Image")
#: ``tensor_msgs/msg/ExperimentalTensor``: any dtype, shape and strides.
Tensor = _MsgType("tensor", "tensor_msgs/msg/ExperimentalTensor")
#: ``std_msgs/msg/String``.
String = _MsgType("string", "std_msgs/msg/String")


class ReliabilityPolicy(enum.Enum):
    RELIABLE = "reliable"
    BEST_EFFORT = "best_effort"


class DurabilityPolicy(enum.Enum):
    VOLATILE = "volatile"
    TRANSIENT_LOCAL = "transient_local"


class HistoryPolicy(enum.Enum):
    KEEP_LAST = "keep_last"
    KEEP_ALL = "keep_all"


@dataclass(frozen=True)
class QoSProfile:
    """A QoS profile, named as rclpy names it. ``depth`` counts with ``KEEP_LAST``."""

    depth: int = 10
    reliability: ReliabilityPolicy = ReliabilityPolicy.RELIABLE
    durability: DurabilityPolicy = DurabilityPolicy.VOLATILE
    history: HistoryPolicy = HistoryPolicy.KEEP_LAST


#: rclpy's ``qos_profile_sensor_data``: best effort, keep last 5, volatile.
qos_profile_sensor_data = QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT)
#: rclpy's default for a depth of 10: reliable, keep last 10, volatile.
qos_profile_default = QoSProfile()

QoSLike = Union[int, QoSProfile, Any]


def _policy(value: Any, enum_type: type, what: str) -> str:
    """A policy's wire name from ours, rclpy's enum (by member name) or a string."""
    if isinstance(value, enum_type):
        return value.value
    name = getattr(value, "name", value)
    if isinstance(name, str):
        for member in enum_type:
            if name.upper() == member.name or name.lower() == member.value:
                return member.value
        if name.upper() == "SYSTEM_DEFAULT":
            return next(iter(enum_type)).value
    raise ValueError(f"unsupported {what} {value!r} (one of {', '.join(m.name for m in enum_type)})")


def _qos(profile: QoSLike) -> Tuple[str, str, str, int]:
    """``(reliability, durability, history, depth)`` from a depth, a QoSProfile of ours or
    of rclpy (read by its attributes)."""
    if isinstance(profile, bool) or profile is None:
        raise TypeError(f"qos_profile must be a depth or a QoSProfile, not {profile!r}")
    if isinstance(profile, int):
        if profile < 1:
            raise ValueError(f"a depth must be at least 1, got {profile}")
        return ("reliable", "volatile", "keep_last", profile)
    try:
        r, d, h, depth = profile.reliability, profile.durability, profile.history, profile.depth
    except AttributeError:
        raise TypeError(f"qos_profile must be a depth or a QoSProfile, not {type(profile).__name__}") from None
    return (
        _policy(r, ReliabilityPolicy, "reliability"),
        _policy(d, DurabilityPolicy, "durability"),
        _policy(h, HistoryPolicy, "history"),
        int(depth),
    )


def pixel_layout(encoding: str) -> Optional[Tuple[str, int]]:
    """``(dtype name, channels)`` of an Image encoding (``"rgb8"`` → ``("uint8", 3)``), or
    ``None`` for one with no tensor layout (compressed, planar)."""
    return _native.pixel_layout(encoding)


# Encodings given to a frame of (dtype, channels) when the caller names none.
_DEFAULT_ENCODINGS = {
    ("uint8", 1): "mono8",
    ("uint8", 3): "rgb8",
    ("uint8", 4): "rgba8",
    ("uint16", 1): "mono16",
    ("uint16", 3): "rgb16",
    ("uint16", 4): "rgba16",
}


class Stamp(NamedTuple):
    """``builtin_interfaces/msg/Time``."""

    sec: int
    nanosec: int

    @classmethod
    def now(cls) -> "Stamp":
        ns = _time.time_ns()
        return cls(ns // 1_000_000_000, ns % 1_000_000_000)

    def to_ns(self) -> int:
        return self.sec * 1_000_000_000 + self.nanosec


class Header(NamedTuple):
    """``std_msgs/msg/Header``."""

    stamp: Stamp
    frame_id: str


def _stamp_ns(stamp: Any) -> int:
    if stamp is None:
        return _time.time_ns()
    if isinstance(stamp, int):
        return stamp
    if hasattr(stamp, "sec") and hasattr(stamp, "nanosec"):
        return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)
    raise TypeError(f"stamp must be ns since the epoch, a Stamp or a Time, not {type(stamp).__name__}")


class Node:
    """A ROS 2 node in an rmw_zenoh graph.

    ``domain`` defaults to ``ROS_DOMAIN_ID`` (else 0); ``distro`` picks the rmw_zenoh wire
    of a ROS distro (default ``ROS_DISTRO``, else the latest); a publisher of the topic
    that has not reached a subscription for ``silence_after`` seconds is reported (see
    :meth:`Subscription.silent_publishers`; ``None``: never).
    """

    def __init__(
        self,
        session: Session,
        name: str,
        *,
        namespace: str = "/",
        domain: Optional[int] = None,
        distro: Optional[str] = None,
        silence_after: Optional[float] = 5.0,
    ) -> None:
        if not isinstance(session, Session):
            raise TypeError(f"a Node needs a zenoh_cuda_shm Session, not {type(session).__name__}")
        self._native = _native.ros2_node(session._native, name, namespace, domain, distro, silence_after)
        self._session = session

    def create_publisher(self, msg_type: _MsgType, topic: str, qos_profile: QoSLike = 10) -> "Publisher":
        """A publisher of ``msg_type`` on ``topic`` (absolute, relative or ``~/…``)."""
        return Publisher(self._native.create_publisher(_kind(msg_type), topic, _qos(qos_profile)), msg_type)

    def create_subscription(
        self,
        msg_type: _MsgType,
        topic: str,
        callback: Optional[Callable[["Message"], Any]] = None,
        qos_profile: QoSLike = 10,
    ) -> "Subscription":
        """A subscription of ``msg_type`` on ``topic``. With ``callback``, a thread of this
        process calls it for every message, in order, holding the GIL only while it runs;
        without, read it with :meth:`Subscription.recv`, iteration or ``async for``."""
        sub = Subscription(self._native.create_subscription(_kind(msg_type), topic, _qos(qos_profile)))
        if callback is not None:
            sub._start_callback(callback)
        return sub

    def resolve_topic(self, topic: str) -> str:
        """The full name ``topic`` resolves to for this node."""
        return self._native.resolve_topic(topic)

    def graph(self) -> List[Dict[str, str]]:
        """Every node, publisher and subscription of the domain the graph shows."""
        return self._native.graph()

    def close(self) -> None:
        """Undeclares the node. Idempotent."""
        self._native.close()

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def domain(self) -> int:
        return self._native.domain

    @property
    def wire(self) -> str:
        """``"classic"`` (Jazzy, Kilted), ``"buffer-aware"`` (Lyrical, Rolling) or ``"humble"``."""
        return self._native.wire

    def __repr__(self) -> str:
        return repr(self._native)


def _kind(msg_type: Any) -> str:
    if isinstance(msg_type, _MsgType):
        return msg_type.kind
    raise TypeError(f"msg_type must be ros2.Image, ros2.Tensor or ros2.String, not {msg_type!r}")


def _dlpack_device(obj: Any) -> Tuple[int, int]:
    return tuple(obj.__dlpack_device__()) if hasattr(obj, "__dlpack_device__") else (1, 0)


def _host_array(obj: Any) -> Any:
    import numpy

    arr = numpy.from_dlpack(obj) if hasattr(obj, "__dlpack__") else numpy.asarray(obj)
    if not arr.flags.c_contiguous:
        raise ValueError(
            f"the array of shape {arr.shape} is not contiguous (strides {arr.strides}): "
            "publish numpy.ascontiguousarray(a) or a.contiguous()"
        )
    return arr


def _gpu_contiguous(obj: Any) -> bool:
    if hasattr(obj, "is_contiguous"):
        return bool(obj.is_contiguous())
    flags = getattr(obj, "flags", None)
    return bool(getattr(flags, "c_contiguous", True))


def _copy_into_loan(loan: Loan, obj: Any) -> None:
    """Copies a CUDA tensor into a loan on the GPU, with the framework that made it."""
    module = type(obj).__module__.split(".")[0]
    if module == "torch":
        import torch

        torch.from_dlpack(loan).copy_(obj.reshape(loan.shape))
        return
    if module == "cupy":
        import cupy

        cupy.from_dlpack(loan)[...] = obj.reshape(loan.shape)
        return
    try:
        import torch
    except ImportError:
        raise TypeError(
            f"cannot copy a CUDA {type(obj).__name__} into a block: install PyTorch or CuPy, "
            "or write a loan from publisher.loan() in place"
        ) from None
    torch.from_dlpack(loan).copy_(torch.from_dlpack(obj).reshape(loan.shape))


class Publisher:
    """A ROS 2 publisher. :meth:`publish` takes any ``__dlpack__`` object (PyTorch, CuPy,
    JAX, NumPy), a :class:`Loan` written in place, or text for :data:`String`."""

    def __init__(self, native: Any, msg_type: _MsgType) -> None:
        self._native = native
        self.msg_type = msg_type

    def loan(self, shape: Union[int, List[int], Tuple[int, ...]], dtype: Any = "uint8") -> Loan:
        """A block for a contiguous tensor of ``shape`` and ``dtype`` (on the GPU in CUDA
        sessions): write it in place (``torch.from_dlpack(loan)``), then
        ``publish(loan, …)``. It must not be used after that."""
        dims = [int(shape)] if isinstance(shape, int) else [int(d) for d in shape]
        return self._native.loan(dims, _dtype_name(dtype))

    def publish(
        self,
        data: Any,
        *,
        encoding: Optional[str] = None,
        frame_id: str = "",
        stamp: Any = None,
    ) -> int:
        """Publishes one message and returns its sequence number.

        - :data:`Image`: ``data`` is ``[height, width]`` or ``[height, width, channels]``
          of the encoding's element type (``encoding`` defaults to mono8 / rgb8 / rgba8 /
          mono16 / … by dtype and channels); ``frame_id`` and ``stamp`` (ns since the
          epoch, a :class:`Stamp` or an rclpy Time; default now) fill the header.
        - :data:`Tensor`: ``data`` is any tensor; its dtype and shape are sent.
        - :data:`String`: ``data`` is a ``str``.

        CUDA tensors are copied device→device into a block (no host copy); host arrays
        are copied once. Raises ``ValueError`` for data that does not fit (a wrong dtype
        for the encoding, a non-contiguous tensor, text with a NUL), ``TypeError`` for a
        wrong kind of object, ``ClosedError`` once closed; nothing is sent then.
        """
        kind = self.msg_type.kind
        if kind == "string":
            if not isinstance(data, str):
                raise TypeError(f"a String publisher publishes str, not {type(data).__name__}")
            return self._native.publish_string(data)
        if isinstance(data, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"an {self.msg_type!r} publisher publishes tensors or loans, not {type(data).__name__}")
        if isinstance(data, Loan):
            dtype, shape, loan, host = data.dtype, tuple(data.shape), data, None
        elif _dlpack_device(data)[0] == 2:
            if not _gpu_contiguous(data):
                raise ValueError("the CUDA tensor is not contiguous: publish tensor.contiguous()")
            shape = tuple(int(d) for d in data.shape)
            dtype = _dtype_name(data.dtype)
            loan, host = self.loan(shape, dtype), None
            _copy_into_loan(loan, data)
        else:
            host = _host_array(data)
            dtype, shape, loan = host.dtype.name, tuple(host.shape), None
        fields = self._image_fields(dtype, shape, encoding) if kind == "image" else None
        payload = None if host is None else host.tobytes()
        if kind == "image":
            height, width, enc, step = fields
            return self._native.publish_image(
                _stamp_ns(stamp), frame_id, height, width, enc, False, step, data=payload, loan=loan
            )
        return self._native.publish_tensor(dtype, list(shape), [], 0, data=payload, loan=loan)

    @staticmethod
    def _image_fields(dtype: str, shape: Tuple[int, ...], encoding: Optional[str]) -> Tuple[int, int, str, int]:
        if len(shape) not in (2, 3):
            raise ValueError(f"an Image is [height, width] or [height, width, channels], not {list(shape)}")
        height, width = shape[0], shape[1]
        channels = shape[2] if len(shape) == 3 else 1
        if encoding is None:
            encoding = _DEFAULT_ENCODINGS.get((dtype, channels))
            if encoding is None:
                raise ValueError(f"no default encoding for {channels} channels of {dtype}: name one")
        layout = pixel_layout(encoding)
        if layout is None:
            raise ValueError(f"encoding {encoding!r} has no tensor layout to publish from")
        if layout != (dtype, channels):
            raise ValueError(
                f"encoding {encoding!r} is {layout[1]} channels of {layout[0]}, "
                f"but the data is {channels} channels of {dtype}"
            )
        itemsize = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "int32": 4, "float32": 4, "float64": 8}[dtype]
        return height, width, encoding, width * channels * itemsize

    def close(self) -> None:
        """Undeclares the publisher. Idempotent."""
        self._native.close()

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> Dict[str, int]:
        """Counters: ``published``, ``base_puts`` (CDR for ordinary ROS subscriptions),
        ``device_to_host``, ``descriptors`` (ROS 2 CUDA buffers lent), …"""
        return dict(self._native.stats())

    @property
    def topic(self) -> str:
        return self._native.topic

    @property
    def gid(self) -> str:
        return self._native.gid

    @property
    def next_seq(self) -> int:
        """The sequence number the next message will carry (1, 2, …)."""
        return self._native.next_seq

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def ordinary_subscriptions(self) -> int:
        """ROS subscriptions not of this library (rclpy, rclcpp) on the topic."""
        return self._native.ordinary_subscriptions

    @property
    def zero_copy_subscribers(self) -> int:
        """Subscriptions of this library reading the blocks in place."""
        return self._native.zero_copy_subscribers

    @property
    def our_subscriptions(self) -> int:
        """Subscriptions of this library the publisher knows (zero-copy or not)."""
        return self._native.our_subscriptions

    def __repr__(self) -> str:
        return repr(self._native)


class Message:
    """A received message: header fields as attributes (``header``, ``height``, ``width``,
    ``encoding``, ``step`` of an Image; ``dtype``, ``shape``, ``strides`` of a Tensor;
    ``data`` of a String), the rmw_zenoh attachment (``seq``, ``publisher_gid``,
    ``source_timestamp_ns``), how it came (``path``, ``path_reason``), and the data
    through DLPack: ``torch.from_dlpack(msg)``, ``numpy.from_dlpack(msg)``.

    Data that came in a block is exported in place (read-only; on the GPU, ordered after
    the publisher's writes on the consumer's stream, with no host wait). Data that came as
    CDR from an ordinary ROS publisher is exported from a host copy made once.
    """

    __slots__ = ("_native", "_host")

    def __init__(self, native: Any) -> None:
        self._native = native
        self._host: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    @property
    def header(self) -> Header:
        sec, nanosec = self._native.stamp
        return Header(Stamp(sec, nanosec), self._native.frame_id)

    @property
    def data(self) -> Any:
        """A String's text; for Images and Tensors, a NumPy array of a host copy (use
        DLPack to read in place)."""
        if self._native.kind == "string":
            return self._native.text
        import numpy

        return numpy.array(self._host_array(), copy=True)

    def _host_array(self) -> Any:
        if self._host is None:
            import numpy

            dtype, shape, strides = self._native.layout()
            item = numpy.dtype(dtype).itemsize
            offset = self._native.byte_offset if self._native.kind == "tensor" else 0
            # Over the immutable bytes of one copy: read-only, as in-place exports are.
            self._host = numpy.ndarray(shape, dtype=dtype, buffer=self._native.to_bytes(), offset=offset,
                                       strides=[s * item for s in strides])
        return self._host

    def __dlpack__(self, **kwargs: Any) -> Any:
        if self._native.in_place:
            return self._native.__dlpack__(**kwargs)
        return self._host_array().__dlpack__(**{k: v for k, v in kwargs.items() if v is not None})

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self._native.__dlpack_device__()

    def __repr__(self) -> str:
        return repr(self._native)


class Subscription(Subscriber):
    """A ROS 2 subscription: :meth:`recv`, iteration, ``async for``, or a callback."""

    def recv(self, timeout: Optional[float] = None) -> Message:  # type: ignore[override]
        """The next message, waiting up to ``timeout`` seconds (``None``: forever).
        Raises ``TimeoutError`` when none came and ``ClosedError`` once closed."""
        return Message(self._native.recv(timeout))

    def try_recv(self) -> Optional[Message]:  # type: ignore[override]
        m = self._native.try_recv()
        return None if m is None else Message(m)

    def _poll(self, wait: float) -> Optional[Message]:  # type: ignore[override]
        try:
            return Message(self._native.recv(wait))
        except TimeoutError:
            return None

    @property
    def key(self) -> str:
        return self._native.topic

    @property
    def topic(self) -> str:
        return self._native.topic

    @property
    def gid(self) -> str:
        return self._native.gid

    def silent_publishers(self) -> List[Tuple[str, str, List[str]]]:
        """Publishers of the topic that have not reached this subscription:
        ``(gid, token, [reasons in words])``."""
        return self._native.silent_publishers()

    def unheard_publishers(self) -> List[Tuple[str, str, List[str]]]:
        """Publishers of the topic in the graph now that will not reach this
        subscription (another type or type hash, incompatible QoS, …), without waiting
        for the silence window: ``(gid, node, [reasons in words])``."""
        return self._native.unheard_publishers()

    def stats(self) -> Dict[str, int]:
        """Counters: per way in (``channel``, ``base``, ``buf_cpu``, ``cuda_buffers``),
        ``lost``, ``duplicates``, ``dropped_queue_full``, ``queued``, malformed input."""
        return dict(self._native.stats())

    def path_reason(self, sample: Any) -> Optional[str]:
        return sample.path_reason
