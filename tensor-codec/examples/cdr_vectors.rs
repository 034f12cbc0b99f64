//! CDR test vectors shared with an independent implementation (the Python `rosbags`
//! package; see `tensor-codec/python/test_cdr_rosbags.py`).
//!
//! ```text
//! cargo run -p tensor-codec --example cdr_vectors -- write  <dir>   # our bytes for others to read
//! cargo run -p tensor-codec --example cdr_vectors -- verify <dir>   # others' bytes for us to read
//! cargo run -p tensor-codec --example cdr_vectors -- hashes         # type names and RIHS01 hashes
//! ```
//!
//! Both directions use the same `manifest.json` in `<dir>`:
//! `{"messages": [{"file": ..., "type": "sensor_msgs/msg/Image" | "tensor_msgs/msg/ExperimentalTensor",
//! "big_endian": bool, <every field>, "data_len": n, "data_sha256": hex}]}`.
//! `verify` decodes every file (borrowed and owned), compares every field with the
//! manifest, and requires little-endian files to re-encode to the identical bytes.

use std::path::Path;
use std::process::ExitCode;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tensor_codec::cdr::{ExperimentalTensor, Header, Image, Time};
use tensor_codec::type_hash::RosMessage;
use tensor_codec::{DType, Device, TensorMeta};

type Error = Box<dyn std::error::Error>;

const IMAGE: &str = "sensor_msgs/msg/Image";
const TENSOR: &str = "tensor_msgs/msg/ExperimentalTensor";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["write", dir] => write(Path::new(dir)),
        ["verify", dir] => verify(Path::new(dir)),
        ["hashes"] => {
            println!("{}", hashes());
            Ok(())
        }
        _ => Err("usage: cdr_vectors write <dir> | verify <dir> | hashes".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cdr_vectors: {e}");
            ExitCode::FAILURE
        }
    }
}

fn hashes() -> Value {
    json!({
        "sensor_msgs/msg/Image": {
            "dds": Image::<Vec<u8>>::DDS_TYPE_NAME,
            "hash": Image::<Vec<u8>>::type_hash().to_string(),
        },
        "tensor_msgs/msg/ExperimentalTensor": {
            "dds": ExperimentalTensor::<Vec<u8>>::DDS_TYPE_NAME,
            "hash": ExperimentalTensor::<Vec<u8>>::type_hash().to_string(),
        },
        "std_msgs/msg/Header": {
            "dds": Header::DDS_TYPE_NAME,
            "hash": Header::type_hash().to_string(),
        },
        "builtin_interfaces/msg/Time": {
            "dds": Time::DDS_TYPE_NAME,
            "hash": Time::type_hash().to_string(),
        },
    })
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// Deterministic filler bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

fn image_fields<D: AsRef<[u8]>>(m: &Image<D>) -> Value {
    json!({
        "type": IMAGE,
        "header": {
            "stamp": { "sec": m.header.stamp.sec, "nanosec": m.header.stamp.nanosec },
            "frame_id": m.header.frame_id,
        },
        "height": m.height,
        "width": m.width,
        "encoding": m.encoding,
        "is_bigendian": m.is_bigendian,
        "step": m.step,
        "data_len": m.data.as_ref().len(),
        "data_sha256": sha256_hex(m.data.as_ref()),
    })
}

fn tensor_fields<D: AsRef<[u8]>>(m: &ExperimentalTensor<D>) -> Value {
    json!({
        "type": TENSOR,
        "dtype_code": m.dtype_code,
        "dtype_bits": m.dtype_bits,
        "dtype_lanes": m.dtype_lanes,
        "shape": m.shape,
        "strides": m.strides,
        "byte_offset": m.byte_offset,
        "data_len": m.data.as_ref().len(),
        "data_sha256": sha256_hex(m.data.as_ref()),
    })
}

/// An image; `geometry` is `(height, width, step)`.
fn image(
    (sec, nanosec): (i32, u32),
    frame_id: &str,
    geometry: (u32, u32, u32),
    encoding: &str,
    data: Vec<u8>,
) -> Image {
    let (height, width, step) = geometry;
    Image {
        header: Header { stamp: Time { sec, nanosec }, frame_id: frame_id.into() },
        height,
        width,
        encoding: encoding.into(),
        is_bigendian: 0,
        step,
        data,
    }
}

fn images() -> Vec<Image> {
    let mut out = vec![
        // The 2x2 rgb8 example of research/rmw_zenoh.md §3 (64 bytes).
        image((1_700_000_000, 123), "camera", (2, 2, 6), "rgb8", pattern(12, 1)),
        // 640x480 rgb8.
        image((1_700_000_001, 999_999_999), "camera", (480, 640, 1920), "rgb8", pattern(921_600, 2)),
        // Non-ASCII strings.
        image((-1, 0), "カメラ/左", (1, 3, 9), "bgr8", pattern(9, 3)),
        // Extremes: the codec carries fields as they are.
        Image {
            header: Header { stamp: Time { sec: i32::MIN, nanosec: u32::MAX }, frame_id: String::new() },
            height: u32::MAX,
            width: u32::MAX,
            encoding: String::new(),
            is_bigendian: 1,
            step: u32::MAX,
            data: Vec::new(),
        },
    ];
    // Every string length modulo 4 (and data length modulo 8) shifts the padding.
    for n in 0..9u32 {
        let frame_id = "f".repeat(n as usize);
        let encoding = ["mono8", "rgb8", "16UC1", "bayer_rggb8", "", "a", "yuv422", "32FC1", "mono16"][n as usize];
        let stamp = (i32::try_from(n).unwrap_or(0), n);
        out.push(image(stamp, &frame_id, (1, n, n), encoding, pattern(n as usize, u64::from(n) + 10)));
    }
    out
}

fn tensors() -> Result<Vec<ExperimentalTensor>, Error> {
    let mut out = Vec::new();
    // The float32 [2,3] example of research/rmw_zenoh.md §3 (72 bytes).
    let meta = TensorMeta::contiguous(DType::F32, vec![2, 3], Device::CPU);
    out.push(meta.to_experimental_tensor(pattern(24, 100))?);
    // Every supported dtype: a valid view, alternating contiguous / strided / offset.
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        let seed = 200 + i as u64;
        let meta = match (i % 3, dtype.is_sub_byte()) {
            (0, _) | (_, true) => TensorMeta::contiguous(dtype, vec![3, 5], Device::CPU),
            (1, false) => TensorMeta::contiguous(dtype, vec![5, 3], Device::CPU).with_strides(vec![1, 5]),
            _ => {
                let itemsize = dtype.itemsize().unwrap_or(1);
                TensorMeta::contiguous(dtype, vec![2, 2, 2], Device::CPU)
                    .with_strides(vec![8, 1, 2])
                    .with_byte_offset(3 * itemsize)
            }
        };
        let len = usize::try_from(meta.validate(u64::MAX)?.end)? + i;
        out.push(meta.to_experimental_tensor(pattern(len, seed))?);
    }
    // A scalar and a zero-size tensor.
    out.push(TensorMeta::contiguous(DType::F64, Vec::new(), Device::CPU).to_experimental_tensor(pattern(8, 300))?);
    out.push(
        TensorMeta::contiguous(DType::I32, vec![0, 5], Device::CPU)
            .with_strides(vec![5, 1])
            .to_experimental_tensor(Vec::new())?,
    );
    // A float16 [256, 1024] tensor (512 KiB).
    out.push(
        TensorMeta::contiguous(DType::F16, vec![256, 1024], Device::CPU)
            .to_experimental_tensor(pattern(524_288, 301))?,
    );
    // Raw extremes the message can carry even though no validator would accept them.
    out.push(ExperimentalTensor {
        dtype_code: 255,
        dtype_bits: 0,
        dtype_lanes: u16::MAX,
        shape: vec![i64::MIN, -1, i64::MAX],
        strides: vec![i64::MIN],
        byte_offset: u64::MAX,
        data: Vec::new(),
    });
    out.push(ExperimentalTensor {
        dtype_code: 3,
        dtype_bits: 64,
        dtype_lanes: 1,
        shape: vec![1; 70],
        strides: Vec::new(),
        byte_offset: 1,
        data: pattern(7, 302),
    });
    Ok(out)
}

fn write(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let mut manifest = Vec::new();
    for (i, m) in images().iter().enumerate() {
        let file = format!("rust_image_{i:02}.cdr");
        std::fs::write(dir.join(&file), m.encode_cdr()?)?;
        manifest.push(with_file(image_fields(m), &file));
    }
    for (i, m) in tensors()?.iter().enumerate() {
        let file = format!("rust_tensor_{i:02}.cdr");
        std::fs::write(dir.join(&file), m.encode_cdr()?)?;
        manifest.push(with_file(tensor_fields(m), &file));
    }
    let count = manifest.len();
    std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&json!({ "messages": manifest }))?)?;
    println!("wrote {count} messages to {}", dir.display());
    Ok(())
}

fn with_file(mut fields: Value, file: &str) -> Value {
    if let Value::Object(map) = &mut fields {
        map.insert("file".into(), json!(file));
        map.insert("big_endian".into(), json!(false));
    }
    fields
}

/// Decodes one file and checks it against its manifest entry.
fn verify_one(dir: &Path, entry: &Value) -> Result<String, String> {
    let file = entry["file"].as_str().ok_or("manifest entry without \"file\"")?;
    let fail = |what: &dyn std::fmt::Display| format!("{file}: {what}");
    let big_endian = entry["big_endian"].as_bool().ok_or_else(|| fail(&"no \"big_endian\""))?;
    let bytes = std::fs::read(dir.join(file)).map_err(|e| fail(&e))?;
    let mut expected = entry.clone();
    if let Value::Object(map) = &mut expected {
        map.remove("file");
        map.remove("big_endian");
    }
    let (got, reencoded) = match entry["type"].as_str() {
        Some(IMAGE) => {
            let view = Image::decode_cdr_borrowed(&bytes).map_err(|e| fail(&e))?;
            if Image::decode_cdr(&bytes).map_err(|e| fail(&e))? != view.to_owned_data() {
                return Err(fail(&"owned and borrowed decodes differ"));
            }
            (image_fields(&view), view.encode_cdr().map_err(|e| fail(&e))?)
        }
        Some(TENSOR) => {
            let view = ExperimentalTensor::decode_cdr_borrowed(&bytes).map_err(|e| fail(&e))?;
            if ExperimentalTensor::decode_cdr(&bytes).map_err(|e| fail(&e))? != view.to_owned_data() {
                return Err(fail(&"owned and borrowed decodes differ"));
            }
            (tensor_fields(&view), view.encode_cdr().map_err(|e| fail(&e))?)
        }
        other => return Err(fail(&format!("unknown type {other:?}"))),
    };
    if got != expected {
        return Err(fail(&format!("fields differ\n  decoded:  {got}\n  manifest: {expected}")));
    }
    if !big_endian && reencoded != bytes {
        return Err(fail(&format!("re-encoding is not byte-identical ({} vs {} bytes)", reencoded.len(), bytes.len())));
    }
    let kind = if big_endian { "big-endian" } else { "little-endian, byte-exact" };
    Ok(format!("ok {file} ({} bytes, {kind})", bytes.len()))
}

fn verify(dir: &Path) -> Result<(), Error> {
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json"))?)?;
    let entries = manifest["messages"].as_array().ok_or("manifest without \"messages\"")?;
    let mut failures = 0usize;
    for entry in entries {
        match verify_one(dir, entry) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                failures += 1;
                println!("FAIL {e}");
            }
        }
    }
    println!("verified {} messages, {failures} failed", entries.len());
    if failures == 0 { Ok(()) } else { Err(format!("{failures} of {} messages failed", entries.len()).into()) }
}
