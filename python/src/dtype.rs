//! Element type names as Python frameworks spell them (`"float32"`, `"bfloat16"`, …),
//! to and from the DLPack triples the library accepts.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use zenoh_cuda_shm::tensor_codec::DType;

/// `(name, code, bits, lanes)`: every triple of the library's whitelist, named as NumPy,
/// PyTorch and `ml_dtypes` name them.
const NAMES: &[(&str, u8, u8, u16)] = &[
    ("int8", 0, 8, 1),
    ("int16", 0, 16, 1),
    ("int32", 0, 32, 1),
    ("int64", 0, 64, 1),
    ("uint8", 1, 8, 1),
    ("uint16", 1, 16, 1),
    ("uint32", 1, 32, 1),
    ("uint64", 1, 64, 1),
    ("float16", 2, 16, 1),
    ("float32", 2, 32, 1),
    ("float64", 2, 64, 1),
    ("bfloat16", 4, 16, 1),
    ("complex32", 5, 32, 1),
    ("complex64", 5, 64, 1),
    ("complex128", 5, 128, 1),
    ("bool", 6, 8, 1),
    ("float8_e3m4", 7, 8, 1),
    ("float8_e4m3", 8, 8, 1),
    ("float8_e4m3b11fnuz", 9, 8, 1),
    ("float8_e4m3fn", 10, 8, 1),
    ("float8_e4m3fnuz", 11, 8, 1),
    ("float8_e5m2", 12, 8, 1),
    ("float8_e5m2fnuz", 13, 8, 1),
    ("float8_e8m0fnu", 14, 8, 1),
    ("float6_e2m3fn", 15, 6, 1),
    ("float6_e3m2fn", 16, 6, 1),
    ("float4_e2m1fn", 17, 4, 1),
    ("float4_e2m1fn_x2", 17, 4, 2),
];

/// The name of a supported element type.
pub fn name(d: DType) -> &'static str {
    let dl = d.to_dl();
    NAMES.iter().find(|(_, c, b, l)| (*c, *b, *l) == (dl.code, dl.bits, dl.lanes)).map_or("unknown", |(n, ..)| *n)
}

/// The element type a name stands for (`ValueError` for an unknown name).
pub fn parse(name: &str) -> PyResult<DType> {
    let (_, code, bits, lanes) = NAMES.iter().find(|(n, ..)| *n == name).ok_or_else(|| {
        let known: Vec<&str> = NAMES.iter().map(|(n, ..)| *n).collect();
        PyValueError::new_err(format!("unknown dtype {name:?} (known: {})", known.join(", ")))
    })?;
    DType::new(*code, *bits, *lanes).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Every name, in table order.
pub fn names() -> Vec<&'static str> {
    NAMES.iter().map(|(n, ..)| *n).collect()
}
