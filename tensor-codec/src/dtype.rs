//! DLPack element types: the type codes, the `(code, bits, lanes)` triple and the
//! whitelist of combinations this crate accepts.
//!
//! [`DTypeCode`] lists every `DLDataTypeCode` of DLPack v1.3 (codes 0–17).
//! [`DLDataType`] is the raw, unchecked triple exactly as DLPack lays it out.
//! [`DType`] is a triple that passed the whitelist; it can only be built through
//! [`DType::new`], [`DType::from_dl`] or the associated constants, so holding one is
//! proof that the element type is supported.
//!
//! # The whitelist
//!
//! | code | name | bits |
//! |---|---|---|
//! | 0, 1 | `kDLInt`, `kDLUInt` | 8, 16, 32, 64 |
//! | 2 | `kDLFloat` | 16, 32, 64 |
//! | 3 | `kDLOpaqueHandle` | never accepted |
//! | 4 | `kDLBfloat` | 16 |
//! | 5 | `kDLComplex` | 32, 64, 128 |
//! | 6 | `kDLBool` | 8 |
//! | 7–14 | `kDLFloat8_*` | 8 |
//! | 15, 16 | `kDLFloat6_*` | 6 |
//! | 17 | `kDLFloat4_e2m1fn` | 4 |
//!
//! `lanes` must be 1, with one exception: `(17, 4, 2)` is accepted. That is how PyTorch
//! exports `float4_e2m1fn_x2` (two fp4 values packed in one byte). It is byte-sized, so it
//! follows the ordinary byte-addressed rules. Vector types in general are rejected because
//! no consumer we target (PyTorch, CuPy, JAX, NumPy, ROS `torch_conversions`) imports them.
//!
//! `complex32` (code 5, 32 bits) is accepted because PyTorch's `chalf` uses it; other
//! frameworks reject it on import, which is their call, not the transport's.
//!
//! ```
//! use tensor_codec::{DType, DTypeCode};
//!
//! let f32 = DType::new(2, 32, 1)?;
//! assert_eq!(f32, DType::F32);
//! assert_eq!(f32.code(), DTypeCode::Float);
//! assert_eq!(f32.itemsize(), Some(4));
//! assert!(DType::new(3, 64, 1).is_err()); // kDLOpaqueHandle
//! assert_eq!(DType::F4_E2M1FN.storage_bytes(3), Some(2)); // ceil(3 * 4 / 8)
//! # Ok::<(), tensor_codec::MetaError>(())
//! ```

use std::fmt;

use crate::MetaError;

/// A DLPack `DLDataTypeCode` (DLPack v1.3 defines codes 0 to 17).
///
/// The discriminant is the wire value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[non_exhaustive]
pub enum DTypeCode {
    /// `kDLInt`: signed integer.
    Int = 0,
    /// `kDLUInt`: unsigned integer.
    UInt = 1,
    /// `kDLFloat`: IEEE floating point.
    Float = 2,
    /// `kDLOpaqueHandle`: an opaque pointer-sized handle. Never accepted: the bytes mean
    /// nothing in another process.
    OpaqueHandle = 3,
    /// `kDLBfloat`: bfloat16.
    Bfloat = 4,
    /// `kDLComplex`: complex number (real and imaginary halves).
    Complex = 5,
    /// `kDLBool`: boolean stored in one byte.
    Bool = 6,
    /// `kDLFloat8_e3m4`.
    Float8E3M4 = 7,
    /// `kDLFloat8_e4m3`.
    Float8E4M3 = 8,
    /// `kDLFloat8_e4m3b11fnuz`.
    Float8E4M3B11Fnuz = 9,
    /// `kDLFloat8_e4m3fn`.
    Float8E4M3Fn = 10,
    /// `kDLFloat8_e4m3fnuz`.
    Float8E4M3Fnuz = 11,
    /// `kDLFloat8_e5m2`.
    Float8E5M2 = 12,
    /// `kDLFloat8_e5m2fnuz`.
    Float8E5M2Fnuz = 13,
    /// `kDLFloat8_e8m0fnu`.
    Float8E8M0Fnu = 14,
    /// `kDLFloat6_e2m3fn` (6-bit, packed).
    Float6E2M3Fn = 15,
    /// `kDLFloat6_e3m2fn` (6-bit, packed).
    Float6E3M2Fn = 16,
    /// `kDLFloat4_e2m1fn` (4-bit, packed).
    Float4E2M1Fn = 17,
}

impl DTypeCode {
    /// Every code, in wire order.
    pub const ALL: [DTypeCode; 18] = [
        DTypeCode::Int,
        DTypeCode::UInt,
        DTypeCode::Float,
        DTypeCode::OpaqueHandle,
        DTypeCode::Bfloat,
        DTypeCode::Complex,
        DTypeCode::Bool,
        DTypeCode::Float8E3M4,
        DTypeCode::Float8E4M3,
        DTypeCode::Float8E4M3B11Fnuz,
        DTypeCode::Float8E4M3Fn,
        DTypeCode::Float8E4M3Fnuz,
        DTypeCode::Float8E5M2,
        DTypeCode::Float8E5M2Fnuz,
        DTypeCode::Float8E8M0Fnu,
        DTypeCode::Float6E2M3Fn,
        DTypeCode::Float6E3M2Fn,
        DTypeCode::Float4E2M1Fn,
    ];

    /// The code for a wire value, or `None` for a value DLPack v1.3 does not define.
    pub const fn from_u8(value: u8) -> Option<Self> {
        if (value as usize) < Self::ALL.len() { Some(Self::ALL[value as usize]) } else { None }
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The bit widths this crate accepts for the code (with `lanes == 1`). Empty for
    /// [`DTypeCode::OpaqueHandle`].
    pub const fn allowed_bits(self) -> &'static [u8] {
        match self {
            DTypeCode::Int | DTypeCode::UInt => &[8, 16, 32, 64],
            DTypeCode::Float => &[16, 32, 64],
            DTypeCode::OpaqueHandle => &[],
            DTypeCode::Bfloat => &[16],
            DTypeCode::Complex => &[32, 64, 128],
            DTypeCode::Bool
            | DTypeCode::Float8E3M4
            | DTypeCode::Float8E4M3
            | DTypeCode::Float8E4M3B11Fnuz
            | DTypeCode::Float8E4M3Fn
            | DTypeCode::Float8E4M3Fnuz
            | DTypeCode::Float8E5M2
            | DTypeCode::Float8E5M2Fnuz
            | DTypeCode::Float8E8M0Fnu => &[8],
            DTypeCode::Float6E2M3Fn | DTypeCode::Float6E3M2Fn => &[6],
            DTypeCode::Float4E2M1Fn => &[4],
        }
    }

    /// The enumerator's name in `dlpack.h`, e.g. `"kDLFloat"`.
    pub const fn dlpack_name(self) -> &'static str {
        match self {
            DTypeCode::Int => "kDLInt",
            DTypeCode::UInt => "kDLUInt",
            DTypeCode::Float => "kDLFloat",
            DTypeCode::OpaqueHandle => "kDLOpaqueHandle",
            DTypeCode::Bfloat => "kDLBfloat",
            DTypeCode::Complex => "kDLComplex",
            DTypeCode::Bool => "kDLBool",
            DTypeCode::Float8E3M4 => "kDLFloat8_e3m4",
            DTypeCode::Float8E4M3 => "kDLFloat8_e4m3",
            DTypeCode::Float8E4M3B11Fnuz => "kDLFloat8_e4m3b11fnuz",
            DTypeCode::Float8E4M3Fn => "kDLFloat8_e4m3fn",
            DTypeCode::Float8E4M3Fnuz => "kDLFloat8_e4m3fnuz",
            DTypeCode::Float8E5M2 => "kDLFloat8_e5m2",
            DTypeCode::Float8E5M2Fnuz => "kDLFloat8_e5m2fnuz",
            DTypeCode::Float8E8M0Fnu => "kDLFloat8_e8m0fnu",
            DTypeCode::Float6E2M3Fn => "kDLFloat6_e2m3fn",
            DTypeCode::Float6E3M2Fn => "kDLFloat6_e3m2fn",
            DTypeCode::Float4E2M1Fn => "kDLFloat4_e2m1fn",
        }
    }
}

impl fmt::Display for DTypeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dlpack_name())
    }
}

/// The raw DLPack `DLDataType {uint8 code; uint8 bits; uint16 lanes}`, unchecked.
///
/// `#[repr(C)]` so its layout is that of the C struct. Turn it into a [`DType`] with
/// [`DType::from_dl`] (or `TryFrom`) before trusting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct DLDataType {
    /// Type code (`DLDataTypeCode`).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Number of lanes (1 for scalars).
    pub lanes: u16,
}

/// A supported element type: a `(code, bits, lanes)` triple that passed the whitelist
/// described in the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType {
    code: DTypeCode,
    bits: u8,
    lanes: u16,
}

macro_rules! dtype_consts {
    ($($(#[$doc:meta])* $name:ident = ($code:ident, $bits:literal, $lanes:literal, $text:literal);)*) => {
        impl DType {
            $(
                $(#[$doc])*
                pub const $name: DType = DType { code: DTypeCode::$code, bits: $bits, lanes: $lanes };
            )*

            /// Every accepted `(code, bits, lanes)` combination, one constant each.
            pub const ALL: &'static [DType] = &[$(DType::$name),*];

            /// The conventional name (`"float32"`, `"float4_e2m1fn_x2"`, ...).
            pub const fn name(self) -> &'static str {
                $(
                    if self.code as u8 == DTypeCode::$code as u8
                        && self.bits == $bits
                        && self.lanes == $lanes
                    {
                        return $text;
                    }
                )*
                // Unreachable for a `DType` built through this module; kept total anyway.
                "unknown"
            }
        }
    };
}

dtype_consts! {
    /// `int8` `(0, 8, 1)`.
    I8 = (Int, 8, 1, "int8");
    /// `int16` `(0, 16, 1)`.
    I16 = (Int, 16, 1, "int16");
    /// `int32` `(0, 32, 1)`.
    I32 = (Int, 32, 1, "int32");
    /// `int64` `(0, 64, 1)`.
    I64 = (Int, 64, 1, "int64");
    /// `uint8` `(1, 8, 1)`.
    U8 = (UInt, 8, 1, "uint8");
    /// `uint16` `(1, 16, 1)`.
    U16 = (UInt, 16, 1, "uint16");
    /// `uint32` `(1, 32, 1)`.
    U32 = (UInt, 32, 1, "uint32");
    /// `uint64` `(1, 64, 1)`.
    U64 = (UInt, 64, 1, "uint64");
    /// `float16` `(2, 16, 1)`.
    F16 = (Float, 16, 1, "float16");
    /// `float32` `(2, 32, 1)`.
    F32 = (Float, 32, 1, "float32");
    /// `float64` `(2, 64, 1)`.
    F64 = (Float, 64, 1, "float64");
    /// `bfloat16` `(4, 16, 1)`.
    BF16 = (Bfloat, 16, 1, "bfloat16");
    /// `complex32` `(5, 32, 1)`: two float16 halves (PyTorch `chalf`).
    C32 = (Complex, 32, 1, "complex32");
    /// `complex64` `(5, 64, 1)`.
    C64 = (Complex, 64, 1, "complex64");
    /// `complex128` `(5, 128, 1)`.
    C128 = (Complex, 128, 1, "complex128");
    /// `bool` `(6, 8, 1)`, one byte per value.
    BOOL = (Bool, 8, 1, "bool");
    /// `float8_e3m4` `(7, 8, 1)`.
    F8_E3M4 = (Float8E3M4, 8, 1, "float8_e3m4");
    /// `float8_e4m3` `(8, 8, 1)`.
    F8_E4M3 = (Float8E4M3, 8, 1, "float8_e4m3");
    /// `float8_e4m3b11fnuz` `(9, 8, 1)`.
    F8_E4M3B11FNUZ = (Float8E4M3B11Fnuz, 8, 1, "float8_e4m3b11fnuz");
    /// `float8_e4m3fn` `(10, 8, 1)`.
    F8_E4M3FN = (Float8E4M3Fn, 8, 1, "float8_e4m3fn");
    /// `float8_e4m3fnuz` `(11, 8, 1)`.
    F8_E4M3FNUZ = (Float8E4M3Fnuz, 8, 1, "float8_e4m3fnuz");
    /// `float8_e5m2` `(12, 8, 1)`.
    F8_E5M2 = (Float8E5M2, 8, 1, "float8_e5m2");
    /// `float8_e5m2fnuz` `(13, 8, 1)`.
    F8_E5M2FNUZ = (Float8E5M2Fnuz, 8, 1, "float8_e5m2fnuz");
    /// `float8_e8m0fnu` `(14, 8, 1)`.
    F8_E8M0FNU = (Float8E8M0Fnu, 8, 1, "float8_e8m0fnu");
    /// `float6_e2m3fn` `(15, 6, 1)`, packed (sub-byte).
    F6_E2M3FN = (Float6E2M3Fn, 6, 1, "float6_e2m3fn");
    /// `float6_e3m2fn` `(16, 6, 1)`, packed (sub-byte).
    F6_E3M2FN = (Float6E3M2Fn, 6, 1, "float6_e3m2fn");
    /// `float4_e2m1fn` `(17, 4, 1)`, packed (sub-byte).
    F4_E2M1FN = (Float4E2M1Fn, 4, 1, "float4_e2m1fn");
    /// `float4_e2m1fn_x2` `(17, 4, 2)`: PyTorch's two-fp4-per-byte type; one byte per item.
    F4_E2M1FN_X2 = (Float4E2M1Fn, 4, 2, "float4_e2m1fn_x2");
}

impl DType {
    /// Checks a raw triple against the whitelist.
    ///
    /// # Errors
    /// [`MetaError::UnsupportedDType`] naming the triple when the code is unknown, is
    /// `kDLOpaqueHandle`, the bit width is not allowed for the code, or `lanes` is not 1
    /// (except `(17, 4, 2)`).
    pub const fn new(code: u8, bits: u8, lanes: u16) -> Result<Self, MetaError> {
        let Some(type_code) = DTypeCode::from_u8(code) else {
            return Err(MetaError::UnsupportedDType { code, bits, lanes });
        };
        let lanes_ok = lanes == 1 || (code == DTypeCode::Float4E2M1Fn as u8 && bits == 4 && lanes == 2);
        if !lanes_ok {
            return Err(MetaError::UnsupportedDType { code, bits, lanes });
        }
        let allowed = type_code.allowed_bits();
        let mut i = 0;
        while i < allowed.len() {
            if allowed[i] == bits {
                return Ok(DType { code: type_code, bits, lanes });
            }
            i += 1;
        }
        Err(MetaError::UnsupportedDType { code, bits, lanes })
    }

    /// Checks a raw [`DLDataType`]; see [`DType::new`].
    ///
    /// # Errors
    /// As [`DType::new`].
    pub const fn from_dl(raw: DLDataType) -> Result<Self, MetaError> {
        Self::new(raw.code, raw.bits, raw.lanes)
    }

    /// The raw DLPack triple.
    pub const fn to_dl(self) -> DLDataType {
        DLDataType { code: self.code as u8, bits: self.bits, lanes: self.lanes }
    }

    /// The type code.
    pub const fn code(self) -> DTypeCode {
        self.code
    }

    /// Bits per lane.
    pub const fn bits(self) -> u8 {
        self.bits
    }

    /// Number of lanes (1, or 2 for [`DType::F4_E2M1FN_X2`]).
    pub const fn lanes(self) -> u16 {
        self.lanes
    }

    /// Bits per item: `bits * lanes`.
    pub const fn item_bits(self) -> u32 {
        self.bits as u32 * self.lanes as u32
    }

    /// True when an item is not a whole number of bytes (fp6, single fp4). Such tensors are
    /// bit-packed and must be compact; see [`crate::TensorMeta::validate`].
    pub const fn is_sub_byte(self) -> bool {
        !self.item_bits().is_multiple_of(8)
    }

    /// Bytes per item, or `None` for a sub-byte type.
    pub const fn itemsize(self) -> Option<u64> {
        if self.is_sub_byte() { None } else { Some(self.item_bits() as u64 / 8) }
    }

    /// Bytes needed to store `numel` packed items: `ceil(numel * bits * lanes / 8)`.
    /// `None` only if the result does not fit in `u64`.
    pub const fn storage_bytes(self, numel: u64) -> Option<u64> {
        // u64 * u32 always fits in u128; the division brings it back near u64.
        let total_bits = numel as u128 * self.item_bits() as u128;
        let bytes = total_bits.div_ceil(8);
        if bytes > u64::MAX as u128 { None } else { Some(bytes as u64) }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<DLDataType> for DType {
    type Error = MetaError;

    fn try_from(raw: DLDataType) -> Result<Self, Self::Error> {
        DType::from_dl(raw)
    }
}

impl From<DType> for DLDataType {
    fn from(dtype: DType) -> Self {
        dtype.to_dl()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for (i, code) in DTypeCode::ALL.iter().enumerate() {
            assert_eq!(code.as_u8() as usize, i);
            assert_eq!(DTypeCode::from_u8(i as u8), Some(*code));
        }
        for v in 18..=255u8 {
            assert_eq!(DTypeCode::from_u8(v), None);
        }
    }

    #[test]
    fn whitelist_is_exactly_all() {
        // Brute force over every triple with lanes in 0..4 (and a few large lane counts):
        // accepted iff listed in DType::ALL. Under Miri (an interpreter, ~1000x slower)
        // every listed code and width plus their neighbours, not all 65,536 pairs.
        let all: Vec<u8> = if cfg!(miri) {
            let mut v: Vec<u8> = (0..=8).chain([16, 32, 64, 127, 128, 255]).collect();
            v.extend(
                DType::ALL.iter().flat_map(|d| [d.code as u8, d.bits.wrapping_sub(1), d.bits, d.bits.wrapping_add(1)]),
            );
            v.sort_unstable();
            v.dedup();
            v
        } else {
            (0..=255u8).collect()
        };
        for &code in &all {
            for &bits in &all {
                for lanes in [0u16, 1, 2, 3, 4, 256, u16::MAX] {
                    let listed = DType::ALL.iter().any(|d| d.code as u8 == code && d.bits == bits && d.lanes == lanes);
                    match DType::new(code, bits, lanes) {
                        Ok(d) => {
                            assert!(listed, "({code},{bits},{lanes}) accepted but not listed");
                            assert_eq!(d.to_dl(), DLDataType { code, bits, lanes });
                        }
                        Err(e) => {
                            assert!(!listed, "({code},{bits},{lanes}) listed but rejected");
                            assert_eq!(e, MetaError::UnsupportedDType { code, bits, lanes });
                        }
                    }
                }
            }
        }
        assert_eq!(DType::ALL.len(), 28);
    }

    #[test]
    fn rejections_named() {
        // Opaque handle at any width.
        assert!(DType::new(3, 64, 1).is_err());
        // Unknown code.
        assert_eq!(DType::new(18, 8, 1), Err(MetaError::UnsupportedDType { code: 18, bits: 8, lanes: 1 }));
        // Zero bits, zero lanes, vector lanes.
        assert!(DType::new(2, 0, 1).is_err());
        assert!(DType::new(2, 32, 0).is_err());
        assert!(DType::new(2, 32, 4).is_err());
        // fp4 x2 only with bits 4.
        assert!(DType::new(17, 8, 2).is_err());
        assert!(DType::new(16, 6, 2).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::C128.itemsize(), Some(16));
        assert_eq!(DType::BOOL.itemsize(), Some(1));
        assert_eq!(DType::F4_E2M1FN_X2.itemsize(), Some(1));
        assert!(!DType::F4_E2M1FN_X2.is_sub_byte());
        assert_eq!(DType::F6_E2M3FN.itemsize(), None);
        assert_eq!(DType::F6_E2M3FN.storage_bytes(5), Some(4)); // 30 bits
        assert_eq!(DType::F4_E2M1FN.storage_bytes(0), Some(0));
        assert_eq!(DType::F4_E2M1FN.storage_bytes(u64::MAX), Some(u64::MAX / 2 + 1));
        assert_eq!(DType::C128.storage_bytes(u64::MAX), None);
        assert_eq!(DType::F32.storage_bytes(3), Some(12));
    }

    #[test]
    fn names_and_conversions() {
        let mut names: Vec<_> = DType::ALL.iter().map(|d| d.name()).collect();
        assert!(!names.contains(&"unknown"));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DType::ALL.len());
        assert_eq!(DType::F4_E2M1FN_X2.to_string(), "float4_e2m1fn_x2");
        assert_eq!(DTypeCode::Float8E8M0Fnu.to_string(), "kDLFloat8_e8m0fnu");
        let raw = DLDataType { code: 4, bits: 16, lanes: 1 };
        assert_eq!(DType::try_from(raw), Ok(DType::BF16));
        assert_eq!(DLDataType::from(DType::BF16), raw);
        assert_eq!(std::mem::size_of::<DLDataType>(), 4);
    }
}
