"""Cross-checks tensor-codec's CDR against an independent implementation, `rosbags`.

(a) Bytes written by the Rust encoders (`cdr_vectors write`) are deserialised by rosbags,
    every field is compared with the manifest, and rosbags must re-serialise them to the
    identical bytes.
(b) Messages built and serialised by rosbags (little- and big-endian) must be read by the
    Rust decoders with every field identical (`cdr_vectors verify`), and little-endian ones
    must re-encode byte for byte.
(c) The RIHS01 hashes computed in Rust match rosbags' `hash_rihs01`.

Run from the repository root:  python -m pytest tensor-codec/python -q
The example is run with `cargo run -p tensor-codec --example cdr_vectors`; CARGO_TARGET_DIR
and CARGO are honoured. Set CDR_VECTORS_BIN to a prebuilt example binary to skip cargo.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore, get_types_from_msg

REPO_ROOT = Path(__file__).resolve().parents[2]

IMAGE = "sensor_msgs/msg/Image"
TENSOR = "tensor_msgs/msg/ExperimentalTensor"

# tensor_msgs/msg/ExperimentalTensor.msg (rosidl_buffer_backends), field lines only.
TENSOR_MSG = """\
uint8 dtype_code
uint8 dtype_bits
uint16 dtype_lanes
int64[] shape
int64[] strides
uint64 byte_offset
uint8[] data
"""


@pytest.fixture(scope="module")
def typestore():
    store = get_typestore(Stores.ROS2_JAZZY)
    store.register(get_types_from_msg(TENSOR_MSG, TENSOR))
    return store


def run_example(*args: str) -> str:
    """Runs the cdr_vectors example and returns its stdout; fails the test on error."""
    binary = os.environ.get("CDR_VECTORS_BIN")
    if binary:
        cmd = [binary, *args]
    else:
        cargo = os.environ.get("CARGO", "cargo")
        cmd = [cargo, "run", "--quiet", "-p", "tensor-codec", "--example", "cdr_vectors", "--", *args]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.stdout


def sha256(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def fields_of(msg, typename: str) -> dict:
    """The manifest form of a rosbags message (same keys as the Rust example writes)."""
    if typename == IMAGE:
        return {
            "type": IMAGE,
            "header": {
                "stamp": {"sec": int(msg.header.stamp.sec), "nanosec": int(msg.header.stamp.nanosec)},
                "frame_id": msg.header.frame_id,
            },
            "height": int(msg.height),
            "width": int(msg.width),
            "encoding": msg.encoding,
            "is_bigendian": int(msg.is_bigendian),
            "step": int(msg.step),
            "data_len": int(len(msg.data)),
            "data_sha256": sha256(msg.data),
        }
    return {
        "type": TENSOR,
        "dtype_code": int(msg.dtype_code),
        "dtype_bits": int(msg.dtype_bits),
        "dtype_lanes": int(msg.dtype_lanes),
        "shape": [int(v) for v in msg.shape],
        "strides": [int(v) for v in msg.strides],
        "byte_offset": int(msg.byte_offset),
        "data_len": int(len(msg.data)),
        "data_sha256": sha256(msg.data),
    }


# ---------------------------------------------------------------- (a) Rust -> rosbags


def test_rosbags_reads_rust_bytes(tmp_path: Path, typestore):
    run_example("write", str(tmp_path))
    manifest = json.loads((tmp_path / "manifest.json").read_text())["messages"]
    types = {entry["type"] for entry in manifest}
    assert types == {IMAGE, TENSOR}
    for entry in manifest:
        raw = (tmp_path / entry["file"]).read_bytes()
        assert raw[:4] == b"\x00\x01\x00\x00", entry["file"]
        msg = typestore.deserialize_cdr(raw, entry["type"])
        expected = {k: v for k, v in entry.items() if k not in ("file", "big_endian")}
        assert fields_of(msg, entry["type"]) == expected, entry["file"]
        # Byte-exact: rosbags writes exactly what we wrote.
        again = bytes(typestore.serialize_cdr(msg, entry["type"], little_endian=True))
        assert again == raw, entry["file"]


def test_documented_layouts(tmp_path: Path, typestore):
    """The two worked examples of research/rmw_zenoh.md §3 (64 and 72 bytes)."""
    run_example("write", str(tmp_path))
    image = (tmp_path / "rust_image_00.cdr").read_bytes()
    tensor = (tmp_path / "rust_tensor_00.cdr").read_bytes()
    assert len(image) == 64
    assert len(tensor) == 72
    img = typestore.deserialize_cdr(image, IMAGE)
    assert (img.header.frame_id, img.height, img.width, img.encoding, img.step) == ("camera", 2, 2, "rgb8", 6)
    ten = typestore.deserialize_cdr(tensor, TENSOR)
    assert (ten.dtype_code, ten.dtype_bits, ten.dtype_lanes) == (2, 32, 1)
    assert list(ten.shape) == [2, 3] and list(ten.strides) == [] and len(ten.data) == 24


# ---------------------------------------------------------------- (b) rosbags -> Rust


def random_string(rng: random.Random) -> str:
    alphabet = "abcXYZ019_/ -.émß東京カメラ😀"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 14)))


def random_bytes(rng: random.Random, n: int) -> np.ndarray:
    return np.frombuffer(rng.randbytes(n), dtype=np.uint8).copy()


def make_images(store, rng: random.Random) -> list:
    Image = store.types[IMAGE]
    Header = store.types["std_msgs/msg/Header"]
    Time = store.types["builtin_interfaces/msg/Time"]

    def image(sec, nanosec, frame_id, height, width, encoding, is_bigendian, step, data):
        return Image(
            header=Header(stamp=Time(sec=sec, nanosec=nanosec), frame_id=frame_id),
            height=height,
            width=width,
            encoding=encoding,
            is_bigendian=is_bigendian,
            step=step,
            data=data,
        )

    out = [
        image(0, 0, "", 0, 0, "", 0, 0, np.zeros(0, dtype=np.uint8)),
        image(-(2**31), 2**32 - 1, "camera", 2**32 - 1, 2**32 - 1, "rgb8", 1, 2**32 - 1, random_bytes(rng, 3)),
        image(1_700_000_000, 5, "camera_optical_frame", 480, 640, "mono16", 0, 1280, random_bytes(rng, 614_400)),
    ]
    for _ in range(40):
        out.append(
            image(
                rng.randrange(-(2**31), 2**31),
                rng.randrange(0, 2**32),
                random_string(rng),
                rng.randrange(0, 2**32),
                rng.randrange(0, 2**32),
                random_string(rng),
                rng.randrange(0, 256),
                rng.randrange(0, 2**32),
                random_bytes(rng, rng.randrange(0, 300)),
            )
        )
    return out


def make_tensors(store, rng: random.Random) -> list:
    Tensor = store.types[TENSOR]

    def tensor(code, bits, lanes, shape, strides, byte_offset, data):
        return Tensor(
            dtype_code=code,
            dtype_bits=bits,
            dtype_lanes=lanes,
            shape=np.array(shape, dtype=np.int64),
            strides=np.array(strides, dtype=np.int64),
            byte_offset=byte_offset,
            data=data,
        )

    out = [
        tensor(2, 32, 1, [2, 3], [], 0, random_bytes(rng, 24)),
        tensor(0, 0, 0, [], [], 0, np.zeros(0, dtype=np.uint8)),
        tensor(255, 255, 2**16 - 1, [-(2**63), 2**63 - 1], [-1], 2**64 - 1, random_bytes(rng, 1)),
        tensor(17, 4, 2, [64, 64], [64, 1], 0, random_bytes(rng, 4096)),
        tensor(4, 16, 1, [128, 1024], [], 0, random_bytes(rng, 262_144)),
    ]
    for _ in range(40):
        rank = rng.randrange(0, 5)
        shape = [rng.choice([rng.randrange(0, 9), rng.randrange(-(2**63), 2**63)]) for _ in range(rank)]
        strides = [rng.randrange(-(2**63), 2**63) for _ in range(rng.choice([0, rank, rng.randrange(0, 4)]))]
        out.append(
            tensor(
                rng.randrange(0, 256),
                rng.randrange(0, 256),
                rng.randrange(0, 2**16),
                shape,
                strides,
                rng.randrange(0, 2**64),
                random_bytes(rng, rng.randrange(0, 300)),
            )
        )
    return out


def test_rust_reads_rosbags_bytes(tmp_path: Path, typestore):
    rng = random.Random(0x5EED_CD2)
    manifest = []
    for typename, messages in ((IMAGE, make_images(typestore, rng)), (TENSOR, make_tensors(typestore, rng))):
        stem = "image" if typename == IMAGE else "tensor"
        for i, msg in enumerate(messages):
            for little_endian in (True, False):
                raw = bytes(typestore.serialize_cdr(msg, typename, little_endian=little_endian))
                assert raw[:2] == (b"\x00\x01" if little_endian else b"\x00\x00")
                name = f"py_{stem}_{i:02}_{'le' if little_endian else 'be'}.cdr"
                (tmp_path / name).write_bytes(raw)
                manifest.append({"file": name, "big_endian": not little_endian, **fields_of(msg, typename)})
    (tmp_path / "manifest.json").write_text(json.dumps({"messages": manifest}, ensure_ascii=False))

    out = run_example("verify", str(tmp_path))
    lines = out.strip().splitlines()
    assert lines[-1] == f"verified {len(manifest)} messages, 0 failed", out
    assert sum(line.startswith("ok ") for line in lines) == len(manifest)


# ---------------------------------------------------------------- (c) type hashes


def test_type_hashes_match_rosbags(typestore):
    ours = json.loads(run_example("hashes"))
    expected_dds = {
        IMAGE: "sensor_msgs::msg::dds_::Image_",
        TENSOR: "tensor_msgs::msg::dds_::ExperimentalTensor_",
        "std_msgs/msg/Header": "std_msgs::msg::dds_::Header_",
        "builtin_interfaces/msg/Time": "builtin_interfaces::msg::dds_::Time_",
    }
    assert set(ours) == set(expected_dds)
    for typename, entry in ours.items():
        assert entry["hash"] == typestore.hash_rihs01(typename), typename
        assert entry["dds"] == expected_dds[typename], typename
