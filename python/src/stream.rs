//! DLPack's `stream` argument as Python passes it.

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// The stream value a consumer passed: `None`, an integer, or an object with
/// `__cuda_stream__()` (the CUDA stream protocol: `(version, handle)`).
pub fn parse(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    let Some(s) = stream else { return Ok(None) };
    if s.is_none() {
        return Ok(None);
    }
    if let Ok(v) = s.extract::<i64>() {
        return Ok(Some(v));
    }
    if s.hasattr("__cuda_stream__")? {
        let t = s.call_method0("__cuda_stream__")?;
        let t = t.cast::<PyTuple>().map_err(|_| PyTypeError::new_err("__cuda_stream__() must return a tuple"))?;
        let handle: i64 = t.get_item(1)?.extract()?;
        // A null handle is the legacy default stream; DLPack spells it 1.
        return Ok(Some(if handle == 0 { 1 } else { handle }));
    }
    Err(PyTypeError::new_err(format!(
        "stream must be None, an int or an object with __cuda_stream__, not {}",
        s.get_type().name()?
    )))
}

/// CPU memory takes no stream (DLPack: `None` only; `-1`, "do not synchronise", is
/// accepted as well since there is nothing to synchronise).
pub fn check_cpu(stream: Option<i64>) -> PyResult<()> {
    match stream {
        None | Some(-1) => Ok(()),
        Some(v) => Err(PyBufferError::new_err(format!("stream must be None for host (kDLCPU) memory, got {v}"))),
    }
}
