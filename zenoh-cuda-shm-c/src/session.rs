//! Sessions: opened from a Zenoh JSON5 configuration and ours.

use std::ffi::{CStr, c_char, c_void};
use zenoh_cuda_shm::cuda::{Gpu, Stream};

use zenoh_cuda_shm::{GpuSession, ZcsConfig};

use crate::error::{Error, ZCS_ERR_INVALID, chain, guard, non_null, str_arg, zcs_result_t};
use crate::handle::{Registry, end};

/// A session: a Zenoh session with our transport on top.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_session_t {
    /// The handle (0: null).
    pub id: u64,
}

pub(crate) static SESSIONS: Registry<GpuSession> = Registry::new("session");

/// Opens a session. `zenoh_json5`: Zenoh's configuration as JSON5 text (NULL: Zenoh's
/// defaults); `zcs_json5`: ours (NULL: our defaults; the keys of `examples/config.json5`).
/// A configuration that does not parse is `ZCS_ERR_INVALID`, with its line and key.
///
/// # Safety
/// The strings are NULL or NUL-terminated; `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_session_open(
    zenoh_json5: *const c_char,
    zcs_json5: *const c_char,
    out: *mut zcs_session_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let zenoh_config = match zenoh_json5.is_null() {
            true => zenoh::Config::default(),
            // SAFETY: not null; NUL-terminated (the caller's contract).
            false => zenoh::Config::from_json5(unsafe { str_arg(zenoh_json5, "zenoh_json5") }?)
                .map_err(|e| Error::new(ZCS_ERR_INVALID, format!("Zenoh configuration: {}", chain(&*e))))?,
        };
        let config = match zcs_json5.is_null() {
            true => ZcsConfig::default(),
            // SAFETY: as above.
            false => ZcsConfig::from_json5(unsafe { str_arg(zcs_json5, "zcs_json5") }?)
                .map_err(|e| Error::new(ZCS_ERR_INVALID, format!("zenoh-cuda-shm configuration: {e}")))?,
        };
        let session =
            GpuSession::open(zenoh_config, config).wait().map_err(|e| Error::failed("open the session", &e))?;
        // SAFETY: `out` is not null (checked) and points to a handle.
        unsafe { out.write(zcs_session_t { id: SESSIONS.insert(session) }) };
        Ok(())
    })
}

/// Closes this handle of a session and zeroes it. Publishers and subscribers declared
/// on it keep it open until they are dropped.
///
/// # Safety
/// `session` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_session_close(session: *mut zcs_session_t) -> zcs_result_t {
    // SAFETY: `session` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&SESSIONS, session, "session") })
}

/// Where the session's blocks live: "cuda" or "host" (a static string).
///
/// # Safety
/// `out` is NULL or points to a `const char*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_session_backend(session: zcs_session_t, out: *mut *const c_char) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SESSIONS.get(session.id)?;
        let name: &'static CStr = match s.gpu() {
            Some(_) => c"cuda",
            None => c"host",
        };
        // SAFETY: not null (checked); points to a `const char*`.
        unsafe { out.write(name.as_ptr()) };
        Ok(())
    })
}

/// A stream a caller passed as a raw `CUstream` (NULL: the legacy default stream),
/// wrapped without taking ownership.
///
/// # Safety
/// `raw` is NULL or a live stream of `gpu`'s primary context that outlives every use
/// of the wrapper.
pub(crate) unsafe fn caller_stream(gpu: &Gpu, raw: *mut c_void) -> Stream {
    match raw.is_null() {
        true => gpu.legacy_default_stream(),
        // SAFETY: the caller's contract.
        false => unsafe { Stream::from_raw(gpu, raw) },
    }
}

/// Called by [`zcs_session_publisher_keys`] once per key, on the caller's thread, before
/// it returns; `key` is valid during the call only. `context` is the pointer given.
pub type zcs_key_callback_t = Option<unsafe extern "C" fn(key: *const c_char, context: *mut c_void)>;

/// Calls `callback(key, context)` for each key of this library's publishers the session
/// sees now (sorted, each once), waiting at most `timeout_ms` for answers. With
/// `other_than` (not NULL), only the keys that key expression does not match: where to
/// look when a subscriber of `other_than` hears nothing (a mistyped key). Plain Zenoh
/// publishers are not listed. An `other_than` that is not a key expression is
/// `ZCS_ERR_INVALID`.
///
/// # Safety
/// `other_than` is NULL or NUL-terminated; `callback` is NULL or a function that does not
/// unwind.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_session_publisher_keys(
    session: zcs_session_t,
    other_than: *const c_char,
    timeout_ms: u64,
    callback: zcs_key_callback_t,
    context: *mut c_void,
) -> zcs_result_t {
    guard(|| {
        let Some(callback) = callback else { return Err(Error::new(crate::error::ZCS_ERR_NULL, "callback is null")) };
        let other_than = match other_than.is_null() {
            true => None,
            // SAFETY: not null; NUL-terminated (the caller's contract).
            false => Some(unsafe { str_arg(other_than, "other_than") }?),
        };
        if let Some(k) = other_than {
            zenoh::key_expr::KeyExpr::try_from(k).map_err(|e| {
                Error::new(ZCS_ERR_INVALID, format!("other_than is not a key expression: {}", chain(&*e)))
            })?;
        }
        let s = SESSIONS.get(session.id)?;
        let timeout = std::time::Duration::from_millis(timeout_ms);
        let keys = match other_than {
            Some(k) => s.other_publisher_keys(k, timeout),
            None => s.publisher_keys(timeout),
        }
        .map_err(|e| Error::failed("ask for the publishers' keys", &*e))?;
        for key in keys {
            // Key expressions hold no NUL.
            let Ok(key) = std::ffi::CString::new(key) else { continue };
            // SAFETY: a function that does not unwind (the contract), given a string that
            // lives through the call and the caller's context.
            unsafe { callback(key.as_ptr(), context) };
        }
        Ok(())
    })
}
