//! The binary form of [`TensorMeta`]: one version byte, then a postcard body.
//!
//! # Format, version 1
//!
//! ```text
//! byte 0      META_VERSION (= 1)
//! then        postcard encoding of, in this order:
//!   dtype_code   u8          (one byte)
//!   dtype_bits   u8          (one byte)
//!   dtype_lanes  u16         (varint)
//!   shape        seq of i64  (varint length, then zigzag varints)
//!   strides      seq of i64  (varint length, then zigzag varints; empty = row-major)
//!   byte_offset  u64         (varint)
//!   device_type  i32         (zigzag varint, DLPack DLDeviceType)
//!   device_id    i32         (zigzag varint)
//! ```
//!
//! Nothing may follow the body. A future incompatible layout gets a new version byte;
//! decoders reject versions they do not know with [`DecodeError::UnknownVersion`] before
//! reading further.
//!
//! [`TensorMeta::decode`] checks, in order: the version, the postcard body (which it reads
//! without allocating more than [`MAX_RANK`] entries per dimension list, whatever length a
//! hostile prefix claims), trailing bytes, the dtype whitelist, the device type, the rank,
//! and then runs [`TensorMeta::validate`] against the payload length.
//!
//! ```
//! use tensor_codec::{DType, DecodeError, Device, TensorMeta, META_VERSION};
//!
//! let meta = TensorMeta::contiguous(DType::BF16, vec![4, 4], Device::cuda(0));
//! let bytes = meta.encode(32)?;
//! assert_eq!(bytes[0], META_VERSION);
//! assert_eq!(TensorMeta::decode(&bytes, 32)?, meta);
//!
//! let mut future = bytes.clone();
//! future[0] = 9;
//! assert!(matches!(
//!     TensorMeta::decode(&future, 32),
//!     Err(DecodeError::UnknownVersion { found: 9, supported: 1 })
//! ));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::meta::MAX_RANK;
use crate::{DType, Device, DeviceType, MetaError, TensorMeta};

/// The wire version written by [`TensorMeta::encode`] and the only one
/// [`TensorMeta::decode`] accepts.
pub const META_VERSION: u8 = 1;

/// Why [`TensorMeta::decode`] rejected its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input is empty: not even the version byte is there.
    #[error("empty input: the version byte is missing")]
    Empty,
    /// The version byte is not one this build understands.
    #[error("unknown TensorMeta wire version {found} (this build reads version {supported})")]
    UnknownVersion {
        /// The version byte received.
        found: u8,
        /// [`META_VERSION`].
        supported: u8,
    },
    /// The body is not a valid postcard encoding of the version-1 layout (truncated,
    /// overlong varint, value out of range, ...).
    #[error("malformed TensorMeta body")]
    Malformed(#[source] postcard::Error),
    /// Bytes follow the body.
    #[error("{count} unexpected bytes after the TensorMeta body")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// The body decoded but describes an invalid or out-of-bounds view. Displays as the
    /// inner [`MetaError`].
    #[error(transparent)]
    Invalid(#[from] MetaError),
}

/// Why [`TensorMeta::encode`] refused to encode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The metadata fails [`TensorMeta::validate`] for the given payload length. Displays
    /// as the inner [`MetaError`].
    #[error(transparent)]
    Invalid(#[from] MetaError),
    /// postcard failed to serialize (not expected for this layout).
    #[error("postcard serialization failed")]
    Postcard(#[source] postcard::Error),
}

/// The version-1 body, borrowing the vectors for encoding.
#[derive(Serialize)]
struct BodyRef<'a> {
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: &'a [i64],
    strides: &'a [i64],
    byte_offset: u64,
    device_type: i32,
    device_id: i32,
}

/// The version-1 body as decoded. Field order and types must match [`BodyRef`].
#[derive(Deserialize)]
struct Body {
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: BoundedDims,
    strides: BoundedDims,
    byte_offset: u64,
    device_type: i32,
    device_id: i32,
}

/// A sequence of `i64` that keeps at most [`MAX_RANK`] values but counts them all, so a
/// hostile length prefix cannot make the decoder allocate (each counted element still
/// costs at least one input byte, so counting is bounded by the input length).
struct BoundedDims {
    values: Vec<i64>,
    len: usize,
}

impl<'de> Deserialize<'de> for BoundedDims {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(BoundedDimsVisitor)
    }
}

struct BoundedDimsVisitor;

impl<'de> Visitor<'de> for BoundedDimsVisitor {
    type Value = BoundedDims;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of i64")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<BoundedDims, A::Error> {
        let cap = seq.size_hint().unwrap_or(0).min(MAX_RANK);
        let mut values = Vec::with_capacity(cap);
        let mut len = 0usize;
        while let Some(v) = seq.next_element::<i64>()? {
            if values.len() < MAX_RANK {
                values.push(v);
            }
            len = len.checked_add(1).ok_or_else(|| de::Error::custom("sequence too long"))?;
        }
        Ok(BoundedDims { values, len })
    }
}

impl TensorMeta {
    /// Validates against `payload_len` (see [`TensorMeta::validate`]) and encodes:
    /// [`META_VERSION`] followed by the postcard body described in [`crate::wire`].
    ///
    /// # Errors
    /// [`EncodeError::Invalid`] when validation fails; nothing is encoded then.
    pub fn encode(&self, payload_len: u64) -> Result<Vec<u8>, EncodeError> {
        self.validate(payload_len)?;
        let dl = self.dtype.to_dl();
        let body = BodyRef {
            dtype_code: dl.code,
            dtype_bits: dl.bits,
            dtype_lanes: dl.lanes,
            shape: &self.shape,
            strides: &self.strides,
            byte_offset: self.byte_offset,
            device_type: self.device.device_type.as_i32(),
            device_id: self.device.device_id,
        };
        // Version byte + 3 fixed bytes + at most 10 bytes per varint.
        let capacity = 1 + 3 + 10 * (self.shape.len() + self.strides.len() + 5);
        let mut out = Vec::with_capacity(capacity);
        out.push(META_VERSION);
        postcard::to_extend(&body, out).map_err(EncodeError::Postcard)
    }

    /// Decodes bytes written by [`TensorMeta::encode`] and validates the result against a
    /// payload of `payload_len` bytes. Never panics, whatever the input.
    ///
    /// # Errors
    /// See [`DecodeError`]; checks run in the order given in [`crate::wire`].
    pub fn decode(bytes: &[u8], payload_len: u64) -> Result<TensorMeta, DecodeError> {
        let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
        if version != META_VERSION {
            return Err(DecodeError::UnknownVersion { found: version, supported: META_VERSION });
        }
        let (body, rest): (Body, &[u8]) = postcard::take_from_bytes(body).map_err(DecodeError::Malformed)?;
        if !rest.is_empty() {
            return Err(DecodeError::TrailingBytes { count: rest.len() });
        }
        let dtype = DType::new(body.dtype_code, body.dtype_bits, body.dtype_lanes)?;
        let device_type =
            DeviceType::from_i32(body.device_type).ok_or(MetaError::UnknownDeviceType { value: body.device_type })?;
        let rank = body.shape.len;
        if rank > MAX_RANK {
            return Err(MetaError::RankTooLarge { rank, max: MAX_RANK }.into());
        }
        if body.strides.len > MAX_RANK {
            // Cannot equal the rank; report it like any other length mismatch.
            return Err(MetaError::StridesLenMismatch { strides: body.strides.len, rank }.into());
        }
        let meta = TensorMeta {
            dtype,
            shape: body.shape.values,
            strides: body.strides.values,
            byte_offset: body.byte_offset,
            device: Device::new(device_type, body.device_id),
        };
        meta.validate(payload_len)?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a body by hand (bypassing the encoder's validation).
    #[allow(clippy::too_many_arguments)]
    fn raw(
        code: u8,
        bits: u8,
        lanes: u16,
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
        device_type: i32,
        device_id: i32,
    ) -> Vec<u8> {
        let body = BodyRef {
            dtype_code: code,
            dtype_bits: bits,
            dtype_lanes: lanes,
            shape,
            strides,
            byte_offset,
            device_type,
            device_id,
        };
        postcard::to_extend(&body, vec![META_VERSION]).unwrap()
    }

    #[test]
    fn golden_bytes() {
        // Pins the v1 layout: a change here is a wire break and needs a new version.
        let m = TensorMeta::contiguous(DType::F32, vec![2, 3], Device::cuda(1))
            .with_strides(vec![3, 1])
            .with_byte_offset(300);
        let bytes = m.encode(1000).unwrap();
        assert_eq!(
            bytes,
            [
                1, // version
                2, 32, 1, // dtype (code, bits, lanes varint)
                2, 4, 6, // shape: len 2, zigzag(2)=4, zigzag(3)=6
                2, 6, 2, // strides: len 2, zigzag(3)=6, zigzag(1)=2
                0xac, 0x02, // byte_offset 300 varint
                4, 2, // device_type zigzag(2)=4, device_id zigzag(1)=2
            ]
        );
        assert_eq!(TensorMeta::decode(&bytes, 1000), Ok(m));
    }

    #[test]
    fn round_trip_every_dtype_and_device() {
        for &dtype in DType::ALL {
            for device_type in DeviceType::ALL {
                let m = TensorMeta::contiguous(dtype, vec![3, 0, 5], Device::new(device_type, 7)).with_strides(vec![
                    i64::MAX,
                    0,
                    1,
                ]);
                let bytes = m.encode(0).unwrap();
                assert_eq!(TensorMeta::decode(&bytes, 0), Ok(m));
            }
        }
    }

    #[test]
    fn encode_validates_first() {
        let m = TensorMeta::contiguous(DType::F32, vec![2], Device::CPU);
        assert_eq!(m.encode(7), Err(EncodeError::Invalid(MetaError::SpanOutOfBounds { needed: 8, available: 7 })));
    }

    #[test]
    fn errors_display_the_field() {
        let e = DecodeError::from(MetaError::InvalidShape { dim: 1, value: -3 });
        assert_eq!(e.to_string(), "shape[1] = -3 is negative");
        let e = DecodeError::UnknownVersion { found: 2, supported: 1 };
        assert_eq!(e.to_string(), "unknown TensorMeta wire version 2 (this build reads version 1)");
        let e = EncodeError::from(MetaError::SpanOutOfBounds { needed: 8, available: 7 });
        assert!(e.to_string().contains("needs bytes up to 8"), "{e}");
    }

    #[test]
    fn rejects_empty_and_unknown_version() {
        assert_eq!(TensorMeta::decode(&[], 0), Err(DecodeError::Empty));
        for v in [0u8, 2, 255] {
            assert_eq!(
                TensorMeta::decode(&[v, 2, 32, 1, 0, 0, 0, 2, 0], 4),
                Err(DecodeError::UnknownVersion { found: v, supported: 1 })
            );
        }
    }

    #[test]
    fn rejects_malformed_and_trailing() {
        let good = raw(2, 32, 1, &[2], &[], 0, 2, 0);
        assert!(TensorMeta::decode(&good, 8).is_ok());
        for cut in 1..good.len() {
            assert!(matches!(TensorMeta::decode(&good[..cut], 8), Err(DecodeError::Malformed(_))), "cut at {cut}");
        }
        let mut long = good.clone();
        long.extend_from_slice(&[0, 0]);
        assert_eq!(TensorMeta::decode(&long, 8), Err(DecodeError::TrailingBytes { count: 2 }));
        // lanes varint that does not fit u16.
        let bad_lanes = [1u8, 2, 32, 0xff, 0xff, 0x7f, 0, 0, 0, 2, 0];
        assert!(matches!(TensorMeta::decode(&bad_lanes, 8), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn hostile_length_prefix_does_not_allocate() {
        // shape claims u64::MAX-ish entries but the input ends: Malformed, quickly.
        let mut bytes = vec![1u8, 2, 32, 1];
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        bytes.extend_from_slice(&[2, 4, 6]);
        assert!(matches!(TensorMeta::decode(&bytes, 8), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn rejects_bad_fields_by_name() {
        let d = |b: Vec<u8>, len| TensorMeta::decode(&b, len);
        assert_eq!(
            d(raw(3, 64, 1, &[1], &[], 0, 1, 0), 8),
            Err(DecodeError::Invalid(MetaError::UnsupportedDType { code: 3, bits: 64, lanes: 1 }))
        );
        assert_eq!(
            d(raw(2, 32, 4, &[1], &[], 0, 1, 0), 16),
            Err(DecodeError::Invalid(MetaError::UnsupportedDType { code: 2, bits: 32, lanes: 4 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[1], &[], 0, 5, 0), 4),
            Err(DecodeError::Invalid(MetaError::UnknownDeviceType { value: 5 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[1], &[], 0, 2, -3), 4),
            Err(DecodeError::Invalid(MetaError::InvalidDeviceId { value: -3 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[1; 65], &[], 0, 2, 0), 4),
            Err(DecodeError::Invalid(MetaError::RankTooLarge { rank: 65, max: 64 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[1; 64], &[1; 200], 0, 2, 0), 4),
            Err(DecodeError::Invalid(MetaError::StridesLenMismatch { strides: 200, rank: 64 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[1, 2], &[1], 0, 2, 0), 8),
            Err(DecodeError::Invalid(MetaError::StridesLenMismatch { strides: 1, rank: 2 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[-1], &[], 0, 2, 0), 8),
            Err(DecodeError::Invalid(MetaError::InvalidShape { dim: 0, value: -1 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[2], &[-1], 4, 2, 0), 8),
            Err(DecodeError::Invalid(MetaError::NegativeStride { dim: 0, value: -1 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[1], &[], 2, 2, 0), 8),
            Err(DecodeError::Invalid(MetaError::MisalignedOffset { byte_offset: 2, itemsize: 4 }))
        );
        assert_eq!(
            d(raw(2, 32, 1, &[3], &[], 0, 2, 0), 8),
            Err(DecodeError::Invalid(MetaError::SpanOutOfBounds { needed: 12, available: 8 }))
        );
        assert_eq!(
            d(raw(17, 4, 1, &[2, 2], &[1, 2], 0, 2, 0), 8),
            Err(DecodeError::Invalid(MetaError::NonCompactSubByte { dim: 1, value: 2, expected: 1 }))
        );
        assert_eq!(
            d(raw(1, 8, 1, &[1 << 62], &[8], 0, 2, 0), u64::MAX),
            Err(DecodeError::Invalid(MetaError::Overflow { step: "span" }))
        );
    }
}
