//! Property tests: encode/decode round trips for the postcard `TensorMeta` form and both
//! CDR messages, big-endian input through an encoder written here, and decoders that
//! never panic on arbitrary or damaged input.

use proptest::prelude::*;
use tensor_codec::cdr::{CdrDecodeError, ExperimentalTensor, Header, Image, Time};
use tensor_codec::{DType, DecodeError, Device, DeviceType, TensorMeta};

fn device() -> impl Strategy<Value = Device> {
    (proptest::sample::select(DeviceType::ALL.to_vec()), 0i32..=i32::MAX).prop_map(|(ty, id)| Device::new(ty, id))
}

/// Valid metas with the smallest payload that holds them (and some slack).
fn valid_meta() -> impl Strategy<Value = (TensorMeta, u64)> {
    (
        proptest::sample::select(DType::ALL),
        prop::collection::vec(0i64..=9, 0..=6),
        any::<bool>(),
        prop::collection::vec(0i64..=40, 6),
        0u64..8,
        device(),
        0u64..100,
    )
        .prop_filter_map("invalid view", |(dtype, shape, strided, strides, k, device, slack)| {
            let strides = if strided { strides[..shape.len()].to_vec() } else { Vec::new() };
            let offset = k * dtype.itemsize().unwrap_or(1);
            let meta = TensorMeta { dtype, shape, strides, byte_offset: offset, device };
            let extent = meta.validate(u64::MAX).ok()?;
            Some((meta, extent.end + slack))
        })
}

fn time() -> impl Strategy<Value = Time> {
    (any::<i32>(), any::<u32>()).prop_map(|(sec, nanosec)| Time { sec, nanosec })
}

fn image() -> impl Strategy<Value = Image<Vec<u8>>> {
    (
        time(),
        "\\PC{0,12}",
        any::<u32>(),
        any::<u32>(),
        "[a-z0-9_]{0,10}",
        any::<u8>(),
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..80),
    )
        .prop_map(|(stamp, frame_id, height, width, encoding, is_bigendian, step, data)| Image {
            header: Header { stamp, frame_id },
            height,
            width,
            encoding,
            is_bigendian,
            step,
            data,
        })
}

fn tensor() -> impl Strategy<Value = ExperimentalTensor<Vec<u8>>> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        prop::collection::vec(any::<i64>(), 0..6),
        prop::collection::vec(any::<i64>(), 0..6),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..80),
    )
        .prop_map(|(dtype_code, dtype_bits, dtype_lanes, shape, strides, byte_offset, data)| ExperimentalTensor {
            dtype_code,
            dtype_bits,
            dtype_lanes,
            shape,
            strides,
            byte_offset,
            data,
        })
}

/// A big-endian XCDR1 writer written for this test, independent of the crate's writer.
struct Be(Vec<u8>);

impl Be {
    fn new() -> Self {
        Be(vec![0x00, 0x00, 0x00, 0x00])
    }
    fn pad(&mut self, n: usize) {
        while !(self.0.len() - 4).is_multiple_of(n) {
            self.0.push(0);
        }
    }
    fn put(&mut self, bytes: &[u8]) {
        self.pad(bytes.len());
        self.0.extend_from_slice(bytes);
    }
    fn string(&mut self, s: &str) {
        self.put(&(s.len() as u32 + 1).to_be_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
    }
    fn i64s(&mut self, v: &[i64]) {
        self.put(&(v.len() as u32).to_be_bytes());
        for x in v {
            self.put(&x.to_be_bytes());
        }
    }
    fn bytes(&mut self, v: &[u8]) {
        self.put(&(v.len() as u32).to_be_bytes());
        self.0.extend_from_slice(v);
    }
}

fn image_be(m: &Image<Vec<u8>>) -> Vec<u8> {
    let mut w = Be::new();
    w.put(&m.header.stamp.sec.to_be_bytes());
    w.put(&m.header.stamp.nanosec.to_be_bytes());
    w.string(&m.header.frame_id);
    w.put(&m.height.to_be_bytes());
    w.put(&m.width.to_be_bytes());
    w.string(&m.encoding);
    w.put(&[m.is_bigendian]);
    w.put(&m.step.to_be_bytes());
    w.bytes(&m.data);
    w.0
}

fn tensor_be(m: &ExperimentalTensor<Vec<u8>>) -> Vec<u8> {
    let mut w = Be::new();
    w.put(&[m.dtype_code]);
    w.put(&[m.dtype_bits]);
    w.put(&m.dtype_lanes.to_be_bytes());
    w.i64s(&m.shape);
    w.i64s(&m.strides);
    w.put(&m.byte_offset.to_be_bytes());
    w.bytes(&m.data);
    w.0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn meta_round_trip((meta, len) in valid_meta()) {
        let bytes = meta.encode(len).unwrap();
        prop_assert_eq!(TensorMeta::decode(&bytes, len), Ok(meta.clone()));
        // One byte less of payload is rejected exactly when the view used the last byte.
        let end = meta.validate(len).unwrap().end;
        if end > 0 {
            prop_assert!(TensorMeta::decode(&bytes, end - 1).is_err());
        }
        // Every strict prefix fails to decode.
        for cut in 0..bytes.len() {
            prop_assert!(TensorMeta::decode(&bytes[..cut], len).is_err());
        }
    }

    #[test]
    fn meta_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64), len in any::<u64>()) {
        if let Ok(meta) = TensorMeta::decode(&bytes, len) {
            let again = meta.encode(len).unwrap();
            prop_assert_eq!(TensorMeta::decode(&again, len), Ok(meta));
        }
    }

    #[test]
    fn meta_decode_survives_mutation(
        (meta, len) in valid_meta(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = meta.encode(len).unwrap();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        match TensorMeta::decode(&bytes, len) {
            Ok(m) => prop_assert!(m.validate(len).is_ok()),
            Err(DecodeError::UnknownVersion { found, .. }) => prop_assert_ne!(found, 1),
            Err(_) => {}
        }
    }

    #[test]
    fn image_round_trip(m in image()) {
        let bytes = m.encode_cdr().unwrap();
        prop_assert_eq!(&bytes[..4], &[0u8, 1, 0, 0]);
        let view = Image::decode_cdr_borrowed(&bytes).unwrap();
        prop_assert_eq!(view.data.as_ptr(), bytes[bytes.len() - m.data.len()..].as_ptr());
        prop_assert_eq!(view.to_owned_data(), m.clone());
        prop_assert_eq!(Image::decode_cdr(&bytes).unwrap(), m.clone());
        // Prefix + data is the whole message.
        let mut joined = m.encode_cdr_prefix(m.data.len()).unwrap();
        joined.extend_from_slice(&m.data);
        prop_assert_eq!(&joined, &bytes);
        // Big-endian input from an independent writer decodes to the same message.
        prop_assert_eq!(Image::decode_cdr(&image_be(&m)).unwrap(), m.clone());
        // Truncations fail, up to 3 trailing bytes pass, 4 do not.
        for cut in 0..bytes.len() {
            let is_truncated = matches!(
                Image::decode_cdr_borrowed(&bytes[..cut]),
                Err(CdrDecodeError::Truncated { .. })
            );
            prop_assert!(is_truncated);
        }
        let mut padded = bytes.clone();
        padded.extend_from_slice(&[0, 0, 0]);
        prop_assert_eq!(Image::decode_cdr(&padded).unwrap(), m.clone());
        padded.push(0);
        prop_assert_eq!(Image::decode_cdr(&padded), Err(CdrDecodeError::TrailingBytes { count: 4 }));
    }

    #[test]
    fn tensor_round_trip(m in tensor()) {
        let bytes = m.encode_cdr().unwrap();
        let view = ExperimentalTensor::decode_cdr_borrowed(&bytes).unwrap();
        prop_assert_eq!(view.data.as_ptr(), bytes[bytes.len() - m.data.len()..].as_ptr());
        prop_assert_eq!(view.to_owned_data(), m.clone());
        prop_assert_eq!(ExperimentalTensor::decode_cdr(&bytes).unwrap(), m.clone());
        let mut joined = m.encode_cdr_prefix(m.data.len()).unwrap();
        joined.extend_from_slice(&m.data);
        prop_assert_eq!(&joined, &bytes);
        prop_assert_eq!(ExperimentalTensor::decode_cdr(&tensor_be(&m)).unwrap(), m.clone());
        for cut in 0..bytes.len() {
            let is_truncated = matches!(
                ExperimentalTensor::decode_cdr_borrowed(&bytes[..cut]),
                Err(CdrDecodeError::Truncated { .. })
            );
            prop_assert!(is_truncated);
        }
        // The validated view of a message agrees with TensorMeta::validate.
        let as_meta = TensorMeta {
            dtype: match m.dtype() { Ok(d) => d, Err(_) => return Ok(()) },
            shape: m.shape.clone(),
            strides: m.strides.clone(),
            byte_offset: m.byte_offset,
            device: Device::CPU,
        };
        prop_assert_eq!(
            m.meta(Device::CPU).map(|_| ()),
            as_meta.validate(m.data.len() as u64).map(|_| ())
        );
    }

    #[test]
    fn valid_meta_through_cdr((meta, len) in valid_meta()) {
        let data = vec![0xa5u8; usize::try_from(len).unwrap()];
        let msg = meta.to_experimental_tensor(&data[..]).unwrap();
        let bytes = msg.encode_cdr().unwrap();
        let back = ExperimentalTensor::decode_cdr_borrowed(&bytes).unwrap();
        prop_assert_eq!(back.meta(meta.device), Ok(meta));
    }

    #[test]
    fn cdr_decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        if let Ok(m) = Image::decode_cdr_borrowed(&bytes) {
            let again = m.encode_cdr().unwrap();
            prop_assert_eq!(Image::decode_cdr_borrowed(&again).unwrap(), m);
        }
        if let Ok(m) = ExperimentalTensor::decode_cdr_borrowed(&bytes) {
            let again = m.encode_cdr().unwrap();
            prop_assert_eq!(ExperimentalTensor::decode_cdr_borrowed(&again).unwrap(), m);
        }
    }

    #[test]
    fn cdr_decoders_survive_mutation(
        m in tensor(),
        i in image(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut t = m.encode_cdr().unwrap();
        let mut g = i.encode_cdr().unwrap();
        for (at, value) in flips {
            let k = at.index(t.len());
            t[k] = value;
            let k = at.index(g.len());
            g[k] = value;
        }
        let _ = ExperimentalTensor::decode_cdr(&t);
        let _ = Image::decode_cdr(&g);
        let _ = ExperimentalTensor::decode_cdr(&g);
        let _ = Image::decode_cdr(&t);
    }
}
