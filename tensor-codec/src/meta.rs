//! Tensor metadata ([`TensorMeta`]) and the validator every decoder runs.
//!
//! # Rules
//!
//! [`TensorMeta::validate`] accepts a view of a payload of `payload_len` bytes if and only
//! if all of these hold, checked in this order (the first failure is reported):
//!
//! 1. `device.device_id >= 0` ([`MetaError::InvalidDeviceId`]).
//! 2. `shape.len() <= 64` ([`MetaError::RankTooLarge`]; NumPy's `NPY_MAXDIMS`).
//! 3. every `shape[i] >= 0` ([`MetaError::InvalidShape`]).
//! 4. `strides.len()` is 0 (compact row-major) or `shape.len()`
//!    ([`MetaError::StridesLenMismatch`]).
//! 5. every `strides[i] >= 0` ([`MetaError::NegativeStride`]). A stride of 0 (a
//!    broadcast view) is allowed; several elements then share memory, so consumers should
//!    treat such a view as read-only.
//! 6. for byte-sized types, `byte_offset % itemsize == 0` ([`MetaError::MisalignedOffset`]).
//!    Sub-byte types (fp6, single fp4) have no item size; their view starts at bit 0 of
//!    byte `byte_offset`.
//! 7. `numel = Π shape[i]` fits in `i64` ([`MetaError::Overflow`] with step `"numel"`).
//! 8. sub-byte types are compact: if `numel > 0` and strides are given, every dimension of
//!    size > 1 has its row-major stride ([`MetaError::NonCompactSubByte`]).
//! 9. the bytes the view touches fit: `byte_offset + size <= payload_len`
//!    ([`MetaError::SpanOutOfBounds`], or [`MetaError::Overflow`] when a step does not
//!    fit in `u64`, which also means out of bounds), where `size` is
//!    - 0 for a zero-size tensor (any dimension 0; its strides are not looked at),
//!    - `ceil(numel * bits * lanes / 8)` for sub-byte types and for empty strides,
//!    - `span * itemsize` otherwise, with `span = 1 + Σ (shape[i] - 1) * strides[i]`
//!      (so the stride of a size-1 dimension does not matter).
//!
//! The element type needs no check here: a [`DType`] can only hold a whitelisted triple.
//! Every arithmetic step is checked; nothing here panics on any input.
//!
//! ```
//! use tensor_codec::{DType, Device, MetaError, TensorMeta};
//!
//! // A 2x3 float32 view that skips every other column of a 2x6 buffer (48 bytes).
//! let view = TensorMeta::contiguous(DType::F32, vec![2, 3], Device::cuda(0))
//!     .with_strides(vec![6, 2]);
//! let extent = view.validate(48)?;
//! assert_eq!(extent.numel, 6);
//! assert_eq!(extent.end, 44); // (1 + 1*6 + 2*2) * 4 bytes
//! assert_eq!(
//!     view.validate(40),
//!     Err(MetaError::SpanOutOfBounds { needed: 44, available: 40 })
//! );
//! # Ok::<(), MetaError>(())
//! ```

use crate::{DType, Device};

/// The largest accepted rank (NumPy's `NPY_MAXDIMS`).
pub const MAX_RANK: usize = 64;

/// Why a [`TensorMeta`] (or an element type) was rejected. Every variant names the field
/// and carries the offending value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The `(code, bits, lanes)` triple is not on the whitelist (see [`crate::dtype`]).
    #[error("unsupported dtype (code {code}, bits {bits}, lanes {lanes})")]
    UnsupportedDType {
        /// `dtype.code` as received.
        code: u8,
        /// `dtype.bits` as received.
        bits: u8,
        /// `dtype.lanes` as received.
        lanes: u16,
    },
    /// `shape` has more than [`MAX_RANK`] dimensions.
    #[error("shape has rank {rank}, more than the maximum {max}")]
    RankTooLarge {
        /// Number of dimensions received.
        rank: usize,
        /// [`MAX_RANK`].
        max: usize,
    },
    /// `shape[dim]` is negative.
    #[error("shape[{dim}] = {value} is negative")]
    InvalidShape {
        /// Index of the dimension.
        dim: usize,
        /// The value received.
        value: i64,
    },
    /// `strides` is neither empty nor as long as `shape`.
    #[error("strides has {strides} entries but shape has rank {rank} (must be 0 or {rank})")]
    StridesLenMismatch {
        /// `strides.len()`.
        strides: usize,
        /// `shape.len()`.
        rank: usize,
    },
    /// `strides[dim]` is negative.
    #[error("strides[{dim}] = {value} is negative")]
    NegativeStride {
        /// Index of the dimension.
        dim: usize,
        /// The value received.
        value: i64,
    },
    /// A sub-byte (packed) tensor has a non-row-major stride.
    #[error("strides[{dim}] = {value}, but a packed sub-byte tensor needs the row-major stride {expected}")]
    NonCompactSubByte {
        /// Index of the dimension.
        dim: usize,
        /// The stride received.
        value: i64,
        /// The compact row-major stride for that dimension.
        expected: u64,
    },
    /// `byte_offset` is not a multiple of the item size.
    #[error("byte_offset {byte_offset} is not a multiple of the item size {itemsize}")]
    MisalignedOffset {
        /// `byte_offset` received.
        byte_offset: u64,
        /// Bytes per item of the dtype.
        itemsize: u64,
    },
    /// The view reaches past the end of the payload.
    #[error("the view needs bytes up to {needed} (byte_offset + size) but the payload has {available}")]
    SpanOutOfBounds {
        /// `byte_offset + size` (see the [module docs](self)).
        needed: u64,
        /// The payload length given to the validator.
        available: u64,
    },
    /// A size computation does not fit its integer type (`numel` must fit in `i64`, the
    /// byte extent in `u64`). Such a view is never in bounds.
    #[error("{step} overflows")]
    Overflow {
        /// The computation that overflowed: `"numel"`, `"span"`, `"span * itemsize"`,
        /// `"byte_offset + size"` or `"contiguous strides"`.
        step: &'static str,
    },
    /// `device.device_type` is not a DLPack `DLDeviceType` (only from decoders).
    #[error("device_type {value} is not a known DLPack DLDeviceType")]
    UnknownDeviceType {
        /// The value received.
        value: i32,
    },
    /// `device.device_id` is negative.
    #[error("device_id {value} is negative")]
    InvalidDeviceId {
        /// The value received.
        value: i32,
    },
}

/// What [`TensorMeta::validate`] found out about an accepted view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Number of elements (product of the shape; 1 for a scalar).
    pub numel: u64,
    /// Bytes the view touches, counted from `byte_offset` (0 for a zero-size tensor).
    pub bytes: u64,
    /// `byte_offset + bytes`: the view lies in `payload[byte_offset..end]`.
    pub end: u64,
}

/// DLPack-style tensor metadata: what a consumer needs, besides the data pointer, to build
/// a `DLTensor` over a payload.
///
/// Fields are public; call [`TensorMeta::validate`] (the encoder and every decoder do)
/// before trusting them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (DLPack `int64`); each must be `>= 0`.
    pub shape: Vec<i64>,
    /// Strides in **elements**, not bytes. Empty means compact row-major. Otherwise one
    /// per dimension, each `>= 0`.
    pub strides: Vec<i64>,
    /// Offset of the first element from the start of the payload, in bytes.
    pub byte_offset: u64,
    /// Where the payload lives.
    pub device: Device,
}

impl TensorMeta {
    /// A compact row-major tensor at offset 0 (strides left empty).
    pub fn contiguous(dtype: DType, shape: impl Into<Vec<i64>>, device: Device) -> Self {
        TensorMeta { dtype, shape: shape.into(), strides: Vec::new(), byte_offset: 0, device }
    }

    /// Replaces the strides (in elements; empty = compact row-major).
    #[must_use]
    pub fn with_strides(mut self, strides: impl Into<Vec<i64>>) -> Self {
        self.strides = strides.into();
        self
    }

    /// Replaces the byte offset.
    #[must_use]
    pub fn with_byte_offset(mut self, byte_offset: u64) -> Self {
        self.byte_offset = byte_offset;
        self
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Checks the view against a payload of `payload_len` bytes. See the
    /// [module docs](self) for the exact rules. Producers call this before sending;
    /// every decoder in this crate calls it on what it decoded.
    ///
    /// # Errors
    /// The first rule that fails, as a [`MetaError`] naming the field.
    pub fn validate(&self, payload_len: u64) -> Result<Extent, MetaError> {
        if self.device.device_id < 0 {
            return Err(MetaError::InvalidDeviceId { value: self.device.device_id });
        }
        check_layout(self.dtype, &self.shape, &self.strides, self.byte_offset, payload_len)
    }

    /// Number of elements, checked (must fit in `i64`).
    ///
    /// # Errors
    /// [`MetaError::InvalidShape`] for a negative dimension, [`MetaError::Overflow`] if
    /// the product does not fit in `i64`.
    pub fn numel(&self) -> Result<u64, MetaError> {
        numel(&self.shape)
    }

    /// The strides to hand to a consumer: `strides` if given, else the compact row-major
    /// strides of `shape` (DLPack v1.2+ wants explicit strides).
    ///
    /// # Errors
    /// As [`contiguous_strides`] when `strides` is empty.
    pub fn effective_strides(&self) -> Result<Vec<i64>, MetaError> {
        if self.strides.is_empty() { contiguous_strides(&self.shape) } else { Ok(self.strides.clone()) }
    }

    /// True if the view is compact row-major: strides empty, a zero-size tensor, or every
    /// dimension of size > 1 has its row-major stride. False for an invalid shape or a
    /// negative stride.
    pub fn is_contiguous(&self) -> bool {
        if self.strides.is_empty() {
            return true;
        }
        if self.strides.len() != self.shape.len() || self.strides.iter().any(|&s| s < 0) {
            return false;
        }
        match numel(&self.shape) {
            Ok(0) => true,
            Ok(_) => first_non_compact_dim(&self.shape, &self.strides).is_none(),
            Err(_) => false,
        }
    }
}

/// Compact row-major strides (in elements) for `shape`: the last dimension has stride 1,
/// and each other stride is the product of the later dimensions, counting a dimension of
/// size 0 as 1 (as PyTorch does), so strides are never 0.
///
/// # Errors
/// [`MetaError::InvalidShape`] for a negative dimension, [`MetaError::Overflow`] (step
/// `"contiguous strides"`) if a stride does not fit in `i64`.
pub fn contiguous_strides(shape: &[i64]) -> Result<Vec<i64>, MetaError> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (dim, &size) in shape.iter().enumerate().rev() {
        if size < 0 {
            return Err(MetaError::InvalidShape { dim, value: size });
        }
        strides[dim] = acc;
        if dim > 0 {
            acc = acc.checked_mul(size.max(1)).ok_or(MetaError::Overflow { step: "contiguous strides" })?;
        }
    }
    Ok(strides)
}

/// Product of the shape, which must fit in `i64`; 0 as soon as a dimension is 0.
fn numel(shape: &[i64]) -> Result<u64, MetaError> {
    if let Some((dim, &value)) = shape.iter().enumerate().find(|&(_, &v)| v < 0) {
        return Err(MetaError::InvalidShape { dim, value });
    }
    if shape.contains(&0) {
        return Ok(0);
    }
    let mut acc: i64 = 1;
    for &size in shape {
        acc = acc.checked_mul(size).ok_or(MetaError::Overflow { step: "numel" })?;
    }
    // Non-negative: every factor is >= 1.
    Ok(acc.unsigned_abs())
}

/// The first dimension of size > 1 whose stride is not the row-major one, with that
/// expected stride. Callers guarantee `numel(shape)` fits in `i64` and is non-zero, so
/// every expected stride (a partial product) fits too; the checked multiply is belt and
/// braces.
fn first_non_compact_dim(shape: &[i64], strides: &[i64]) -> Option<(usize, u64)> {
    let mut expected: u64 = 1;
    for dim in (0..shape.len()).rev() {
        let size = shape[dim].unsigned_abs();
        if size != 1 && strides[dim].unsigned_abs() != expected {
            return Some((dim, expected));
        }
        expected = expected.checked_mul(size)?;
    }
    None
}

/// The validator proper, shared by [`TensorMeta::validate`] and the decoders (which check
/// rank before building vectors).
pub(crate) fn check_layout(
    dtype: DType,
    shape: &[i64],
    strides: &[i64],
    byte_offset: u64,
    payload_len: u64,
) -> Result<Extent, MetaError> {
    let rank = shape.len();
    if rank > MAX_RANK {
        return Err(MetaError::RankTooLarge { rank, max: MAX_RANK });
    }
    if let Some((dim, &value)) = shape.iter().enumerate().find(|&(_, &v)| v < 0) {
        return Err(MetaError::InvalidShape { dim, value });
    }
    if !strides.is_empty() && strides.len() != rank {
        return Err(MetaError::StridesLenMismatch { strides: strides.len(), rank });
    }
    if let Some((dim, &value)) = strides.iter().enumerate().find(|&(_, &v)| v < 0) {
        return Err(MetaError::NegativeStride { dim, value });
    }
    let itemsize = dtype.itemsize();
    if let Some(itemsize) = itemsize
        && !byte_offset.is_multiple_of(itemsize)
    {
        return Err(MetaError::MisalignedOffset { byte_offset, itemsize });
    }
    let numel = numel(shape)?;

    let bytes = if numel == 0 {
        0
    } else if let (Some(itemsize), false) = (itemsize, strides.is_empty()) {
        // Byte-sized, explicit strides: span = 1 + Σ (d - 1) * s. All values are
        // non-negative here, so unsigned arithmetic is exact while it does not overflow.
        let mut span: u64 = 1;
        for (&size, &stride) in shape.iter().zip(strides) {
            let term = (size.unsigned_abs() - 1)
                .checked_mul(stride.unsigned_abs())
                .ok_or(MetaError::Overflow { step: "span" })?;
            span = span.checked_add(term).ok_or(MetaError::Overflow { step: "span" })?;
        }
        span.checked_mul(itemsize).ok_or(MetaError::Overflow { step: "span * itemsize" })?
    } else {
        // Compact: either no strides, or a sub-byte type, which must be compact.
        if itemsize.is_none()
            && !strides.is_empty()
            && let Some((dim, expected)) = first_non_compact_dim(shape, strides)
        {
            return Err(MetaError::NonCompactSubByte { dim, value: strides[dim], expected });
        }
        dtype.storage_bytes(numel).ok_or(MetaError::Overflow { step: "span * itemsize" })?
    };

    let end = byte_offset.checked_add(bytes).ok_or(MetaError::Overflow { step: "byte_offset + size" })?;
    if end > payload_len {
        return Err(MetaError::SpanOutOfBounds { needed: end, available: payload_len });
    }
    Ok(Extent { numel, bytes, end })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceType;

    fn meta(dtype: DType, shape: &[i64], strides: &[i64], byte_offset: u64) -> TensorMeta {
        TensorMeta::contiguous(dtype, shape, Device::cuda(0)).with_strides(strides).with_byte_offset(byte_offset)
    }

    #[test]
    fn contiguous_accepts_exact_fit() {
        let m = meta(DType::F32, &[2, 3], &[], 0);
        assert_eq!(m.validate(24), Ok(Extent { numel: 6, bytes: 24, end: 24 }));
        assert_eq!(m.validate(100).map(|e| e.end), Ok(24));
        assert_eq!(m.validate(23), Err(MetaError::SpanOutOfBounds { needed: 24, available: 23 }));
    }

    #[test]
    fn scalar_and_zero_size() {
        let scalar = meta(DType::F64, &[], &[], 8);
        assert_eq!(scalar.validate(16), Ok(Extent { numel: 1, bytes: 8, end: 16 }));
        assert!(scalar.validate(15).is_err());
        // Zero-size: any strides, no bytes; offset must still be inside the payload.
        let empty = meta(DType::F32, &[4, 0, 3], &[i64::MAX, 7, i64::MAX], 8);
        assert_eq!(empty.validate(8), Ok(Extent { numel: 0, bytes: 0, end: 8 }));
        assert_eq!(empty.validate(4), Err(MetaError::SpanOutOfBounds { needed: 8, available: 4 }));
        // Zero-size with otherwise huge dimensions: numel is 0, not an overflow.
        let huge_empty = meta(DType::U8, &[i64::MAX, i64::MAX, 0], &[], 0);
        assert_eq!(huge_empty.validate(0).map(|e| e.numel), Ok(0));
    }

    #[test]
    fn strided_span() {
        // Transposed 3x2 view of a 2x3 buffer.
        let t = meta(DType::I16, &[3, 2], &[1, 3], 0);
        assert_eq!(t.validate(12).map(|e| e.bytes), Ok(12));
        assert!(t.validate(11).is_err());
        // Size-1 dimensions may carry any stride.
        let one = meta(DType::U8, &[1, 4], &[i64::MAX, 1], 0);
        assert_eq!(one.validate(4).map(|e| e.end), Ok(4));
        // Broadcast (stride 0).
        let bcast = meta(DType::U32, &[1000, 4], &[0, 1], 4);
        assert_eq!(bcast.validate(20).map(|e| e.end), Ok(20));
    }

    #[test]
    fn rejects_bad_device_id() {
        let mut m = meta(DType::U8, &[1], &[], 0);
        m.device = Device::new(DeviceType::Cuda, -1);
        assert_eq!(m.validate(1), Err(MetaError::InvalidDeviceId { value: -1 }));
    }

    #[test]
    fn rejects_rank_above_64() {
        let ok = meta(DType::U8, &[1; 64], &[], 0);
        assert!(ok.validate(1).is_ok());
        let bad = meta(DType::U8, &[1; 65], &[], 0);
        assert_eq!(bad.validate(1), Err(MetaError::RankTooLarge { rank: 65, max: 64 }));
    }

    #[test]
    fn rejects_negative_dim() {
        let m = meta(DType::U8, &[2, -3, 4], &[], 0);
        assert_eq!(m.validate(100), Err(MetaError::InvalidShape { dim: 1, value: -3 }));
        assert_eq!(m.numel(), Err(MetaError::InvalidShape { dim: 1, value: -3 }));
    }

    #[test]
    fn rejects_strides_len_mismatch() {
        let m = meta(DType::U8, &[2, 3], &[1], 0);
        assert_eq!(m.validate(100), Err(MetaError::StridesLenMismatch { strides: 1, rank: 2 }));
        let scalar = meta(DType::U8, &[], &[1], 0);
        assert_eq!(scalar.validate(100), Err(MetaError::StridesLenMismatch { strides: 1, rank: 0 }));
    }

    #[test]
    fn rejects_negative_stride() {
        let m = meta(DType::U8, &[2, 3], &[3, -1], 0);
        assert_eq!(m.validate(100), Err(MetaError::NegativeStride { dim: 1, value: -1 }));
    }

    #[test]
    fn rejects_misaligned_offset() {
        let m = meta(DType::F32, &[2], &[], 6);
        assert_eq!(m.validate(100), Err(MetaError::MisalignedOffset { byte_offset: 6, itemsize: 4 }));
        // Zero-size tensors are not exempt.
        let e = meta(DType::C128, &[0], &[], 8);
        assert_eq!(e.validate(100), Err(MetaError::MisalignedOffset { byte_offset: 8, itemsize: 16 }));
        // Sub-byte types have no item size: any byte offset.
        let f4 = meta(DType::F4_E2M1FN, &[3], &[], 7);
        assert_eq!(f4.validate(9).map(|e| e.end), Ok(9));
    }

    #[test]
    fn rejects_numel_overflow() {
        let m = meta(DType::U8, &[1 << 32, 1 << 31], &[0, 0], 0);
        assert_eq!(m.validate(u64::MAX), Err(MetaError::Overflow { step: "numel" }));
        // 2^62 * 2 = 2^63 does not fit in i64.
        let m = meta(DType::U8, &[1 << 62, 2], &[0, 0], 0);
        assert_eq!(m.validate(u64::MAX), Err(MetaError::Overflow { step: "numel" }));
        // 2^62 fits.
        let m = meta(DType::U8, &[1 << 62], &[0], 0);
        assert_eq!(m.validate(1).map(|e| e.numel), Ok(1 << 62));
    }

    #[test]
    fn rejects_span_overflow() {
        // The dlpark wrap case: [2^62] * 3 with a large stride.
        let m = meta(DType::U8, &[1 << 62], &[8], 0);
        assert_eq!(m.validate(u64::MAX), Err(MetaError::Overflow { step: "span" }));
        let m = meta(DType::U8, &[3, 3], &[i64::MAX, i64::MAX], 0);
        assert_eq!(m.validate(u64::MAX), Err(MetaError::Overflow { step: "span" }));
        let m = meta(DType::C128, &[1 << 61], &[1], 0);
        assert_eq!(m.validate(u64::MAX), Err(MetaError::Overflow { step: "span * itemsize" }));
        let m = meta(DType::C128, &[1 << 61], &[], 0);
        assert_eq!(m.validate(u64::MAX), Err(MetaError::Overflow { step: "span * itemsize" }));
        let m = meta(DType::U8, &[2], &[], u64::MAX - 1);
        assert_eq!(m.validate(u64::MAX), Err(MetaError::Overflow { step: "byte_offset + size" }));
        // Just fits.
        let m = meta(DType::U8, &[1], &[], u64::MAX - 1);
        assert_eq!(m.validate(u64::MAX).map(|e| e.end), Ok(u64::MAX));
    }

    #[test]
    fn sub_byte_sizes_and_compactness() {
        // 3 fp6 values = 18 bits = 3 bytes.
        let m = meta(DType::F6_E2M3FN, &[3], &[], 0);
        assert_eq!(m.validate(3).map(|e| e.bytes), Ok(3));
        assert_eq!(m.validate(2), Err(MetaError::SpanOutOfBounds { needed: 3, available: 2 }));
        // Explicit compact strides are fine, size-1 dims may carry anything.
        let m = meta(DType::F4_E2M1FN, &[2, 1, 3], &[3, 99, 1], 0);
        assert_eq!(m.validate(3).map(|e| e.bytes), Ok(3));
        // A transposed fp4 view is rejected.
        let m = meta(DType::F4_E2M1FN, &[3, 2], &[1, 3], 0);
        assert_eq!(m.validate(100), Err(MetaError::NonCompactSubByte { dim: 1, value: 3, expected: 1 }));
        let m = meta(DType::F6_E3M2FN, &[3, 2], &[4, 1], 0);
        assert_eq!(m.validate(100), Err(MetaError::NonCompactSubByte { dim: 0, value: 4, expected: 2 }));
        // Zero-size sub-byte tensors accept any strides.
        let m = meta(DType::F6_E3M2FN, &[3, 0], &[5, 5], 0);
        assert!(m.validate(0).is_ok());
        // fp4 x2 is byte-sized: strided views and offset alignment 1 apply.
        let m = meta(DType::F4_E2M1FN_X2, &[2, 2], &[1, 2], 1);
        assert_eq!(m.validate(5).map(|e| e.end), Ok(5));
    }

    #[test]
    fn contiguous_strides_helper() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), Ok(vec![12, 4, 1]));
        assert_eq!(contiguous_strides(&[]), Ok(vec![]));
        assert_eq!(contiguous_strides(&[2, 0, 4]), Ok(vec![4, 4, 1]));
        assert_eq!(contiguous_strides(&[5, -1]), Err(MetaError::InvalidShape { dim: 1, value: -1 }));
        assert_eq!(contiguous_strides(&[2, 1 << 32, 1 << 31]), Err(MetaError::Overflow { step: "contiguous strides" }));
        // The first dimension never enters a product.
        assert_eq!(contiguous_strides(&[i64::MAX, 1]), Ok(vec![1, 1]));
    }

    #[test]
    fn effective_strides_and_contiguity() {
        let m = meta(DType::F32, &[2, 3], &[], 0);
        assert_eq!(m.effective_strides(), Ok(vec![3, 1]));
        assert!(m.is_contiguous());
        let t = m.clone().with_strides(vec![1, 2]);
        assert_eq!(t.effective_strides(), Ok(vec![1, 2]));
        assert!(!t.is_contiguous());
        assert!(meta(DType::F32, &[2, 1], &[1, 7], 0).is_contiguous());
        assert!(meta(DType::F32, &[0, 3], &[9, 9], 0).is_contiguous());
        assert!(!meta(DType::F32, &[2, 3], &[1], 0).is_contiguous());
        assert!(!meta(DType::F32, &[-2, 3], &[3, 1], 0).is_contiguous());
        assert!(!meta(DType::F32, &[2, 3], &[3, -1], 0).is_contiguous());
        assert!(!meta(DType::F32, &[2, 3], &[-3, 1], 0).is_contiguous());
        assert_eq!(m.rank(), 2);
    }
}
