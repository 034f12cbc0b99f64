//! DLPack capsules: wrapping our exports, and taking ownership of a producer's.
//!
//! The names are DLPack's (`dltensor_versioned` / `dltensor`, renamed to `used_…` by the
//! consumer that takes the tensor). Capsules are made with the C API, not with PyO3's
//! capsule type: its destructor frees the value whatever the capsule's current name, so a
//! consumer that renamed the capsule and adopted the tensor would see it freed twice. Our
//! destructor calls the tensor's deleter only while the capsule still has its unused name.
//!
//! The DLPack deleters themselves are `zenoh_cuda_shm::dlpack`'s and this module's loan
//! deleters: pure Rust, no Python objects, never unwinding — they may run on any thread,
//! without the GIL, after the interpreter has finalised.

use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use zenoh_cuda_shm::dlpack::{DLManagedTensor, DLManagedTensorVersioned, ManagedTensorLegacy, ManagedTensorVersioned};

const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// A producer's tensor taken out of its capsule.
pub enum Taken {
    /// A `DLManagedTensorVersioned`.
    Versioned(ManagedTensorVersioned),
    /// A legacy `DLManagedTensor`.
    Legacy(ManagedTensorLegacy),
}

/// Takes ownership of the tensor in an unused DLPack capsule and renames the capsule to
/// its `used_…` name, so that the producer's capsule destructor leaves it alone.
pub fn take(capsule: &Bound<'_, PyAny>) -> PyResult<Taken> {
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object (borrowed through `capsule`, GIL held); the check
    // reads only its type.
    if unsafe { ffi::PyCapsule_CheckExact(cap) } == 0 {
        return Err(PyBufferError::new_err(format!(
            "__dlpack__ returned {}, not a DLPack capsule",
            capsule.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        )));
    }
    for (name, used, versioned) in [(VERSIONED, USED_VERSIONED, true), (LEGACY, USED_LEGACY, false)] {
        // SAFETY: `cap` is a capsule (checked above); `name` is a NUL-terminated static
        // string. `PyCapsule_IsValid` never sets an exception.
        if unsafe { ffi::PyCapsule_IsValid(cap, name.as_ptr()) } == 0 {
            continue;
        }
        // SAFETY: the capsule is valid under `name` (checked above), so this returns its
        // non-NULL pointer without setting an exception.
        let ptr = unsafe { ffi::PyCapsule_GetPointer(cap, name.as_ptr()) };
        // SAFETY: as above; `used` is static, as `PyCapsule_SetName` requires (the
        // capsule keeps the pointer, not a copy).
        if unsafe { ffi::PyCapsule_SetName(cap, used.as_ptr()) } != 0 {
            return Err(PyErr::fetch(capsule.py()));
        }
        let null = || PyBufferError::new_err("the DLPack capsule holds a NULL tensor");
        return if versioned {
            // SAFETY: DLPack's protocol: the tensor in an unused capsule belongs to whoever
            // renames it, and its producer made it valid until its deleter runs (which the
            // Python spec lets any thread call). After the rename the capsule's own
            // destructor no longer deletes it; the returned owner calls the deleter once.
            let t = unsafe { ManagedTensorVersioned::from_raw(ptr.cast::<DLManagedTensorVersioned>()) };
            t.map(Taken::Versioned).ok_or_else(null)
        } else {
            // SAFETY: as above, for the legacy struct.
            let t = unsafe { ManagedTensorLegacy::from_raw(ptr.cast::<DLManagedTensor>()) };
            t.map(Taken::Legacy).ok_or_else(null)
        };
    }
    Err(PyBufferError::new_err(
        "the capsule is not an unused DLPack capsule (expected 'dltensor_versioned' or 'dltensor'; \
         a 'used_' capsule was already consumed)",
    ))
}

/// The capsule destructor of versioned exports: deletes the tensor unless a consumer
/// took it (renamed the capsule). Python calls it with the GIL held.
unsafe extern "C" fn destroy_versioned(cap: *mut ffi::PyObject) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: Python passes the capsule being destroyed; `IsValid` never sets an
        // exception, and fails (0) once a consumer renamed it.
        if unsafe { ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) } == 0 {
            return;
        }
        // SAFETY: valid under this name (checked), so the pointer is ours and non-NULL.
        let p = unsafe { ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr()) }.cast::<DLManagedTensorVersioned>();
        // SAFETY: nobody took the tensor (the name is unchanged), so this capsule still
        // owns it and deletes it exactly once: Python destroys a capsule once.
        drop(unsafe { ManagedTensorVersioned::from_raw(p) });
    }));
    // Unwinding into Python's C code would abort; a caught panic leaks the tensor.
    drop(r);
}

/// The capsule destructor of legacy exports (see [`destroy_versioned`]).
unsafe extern "C" fn destroy_legacy(cap: *mut ffi::PyObject) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as in `destroy_versioned`.
        if unsafe { ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) } == 0 {
            return;
        }
        // SAFETY: as in `destroy_versioned`.
        let p = unsafe { ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr()) }.cast::<DLManagedTensor>();
        // SAFETY: as in `destroy_versioned`.
        drop(unsafe { ManagedTensorLegacy::from_raw(p) });
    }));
    drop(r);
}

/// Wraps a versioned export in a `dltensor_versioned` capsule. On failure the tensor is
/// deleted.
pub fn versioned(py: Python<'_>, tensor: ManagedTensorVersioned) -> PyResult<Bound<'_, PyAny>> {
    let raw = tensor.into_raw();
    // SAFETY: `raw` is a live export whose ownership moves into the capsule; the name is
    // static; the destructor deletes it only while unused.
    let cap = unsafe { ffi::PyCapsule_New(raw.cast::<c_void>(), VERSIONED.as_ptr(), Some(destroy_versioned)) };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so `raw` is still ours alone.
        drop(unsafe { ManagedTensorVersioned::from_raw(raw) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new, non-NULL reference returned by `PyCapsule_New`.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

/// Wraps a legacy export in a `dltensor` capsule. On failure the tensor is deleted.
pub fn legacy(py: Python<'_>, tensor: ManagedTensorLegacy) -> PyResult<Bound<'_, PyAny>> {
    let raw = tensor.into_raw();
    // SAFETY: as in `versioned`.
    let cap = unsafe { ffi::PyCapsule_New(raw.cast::<c_void>(), LEGACY.as_ptr(), Some(destroy_legacy)) };
    if cap.is_null() {
        // SAFETY: as in `versioned`.
        drop(unsafe { ManagedTensorLegacy::from_raw(raw) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: as in `versioned`.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}
