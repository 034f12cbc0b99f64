//! Result codes, this thread's last error message, and the guard every exported function
//! runs its body in (argument checks, errors kept with their causes, panics caught).

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// What every function returns: `ZCS_OK` or one of the negative `ZCS_ERR_*` codes.
pub type zcs_result_t = i32;

/// Success.
pub const ZCS_OK: zcs_result_t = 0;
/// A required pointer argument is null.
pub const ZCS_ERR_NULL: zcs_result_t = -1;
/// The handle is null, was closed or dropped already, or was never valid.
pub const ZCS_ERR_STALE: zcs_result_t = -2;
/// An argument is out of its range or malformed (a key, a configuration, a length).
pub const ZCS_ERR_INVALID: zcs_result_t = -3;
/// Nothing arrived within the timeout.
pub const ZCS_ERR_TIMEOUT: zcs_result_t = -4;
/// The subscriber's session is closed: nothing more will arrive.
pub const ZCS_ERR_CLOSED: zcs_result_t = -5;
/// The sample's data is not where the call needs it (device memory asked for as host
/// memory, or the reverse).
pub const ZCS_ERR_MEMORY: zcs_result_t = -6;
/// The operation failed (Zenoh, CUDA, the OS): the message says why.
pub const ZCS_ERR_FAILED: zcs_result_t = -7;
/// A bug in this library was caught at the boundary (nothing was unwound into C).
pub const ZCS_ERR_PANIC: zcs_result_t = -8;
/// The sample carries no tensor description (it was published as plain bytes).
pub const ZCS_ERR_NO_TENSOR: zcs_result_t = -9;

/// An error of a call: its code and message.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) code: zcs_result_t,
    pub(crate) message: String,
}

impl Error {
    pub(crate) fn new(code: zcs_result_t, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// `ZCS_ERR_FAILED` with `what` and the error's chain of causes.
    pub(crate) fn failed(what: &str, e: &(dyn std::error::Error + 'static)) -> Self {
        Self::new(ZCS_ERR_FAILED, format!("{what}: {}", chain(e)))
    }
}

/// An error and its sources, joined by ": ", without the source locations Zenoh's
/// errors carry (` at <file>.rs:<line>`).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    zenoh_cuda_shm::error::chain(e)
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last(message: &str) {
    // An interior NUL cannot be carried in a C string: shown as a space.
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Runs an exported function's body: its error becomes the returned code and this
/// thread's last error, and a panic is caught (`ZCS_ERR_PANIC`).
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Error>) -> zcs_result_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ZCS_OK,
        Ok(Err(e)) => {
            set_last(&e.message);
            e.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last(&format!("internal error (a bug in zenoh-cuda-shm): {what}"));
            ZCS_ERR_PANIC
        }
    }
}

/// A failed declaration: `ZCS_ERR_INVALID` for a key that is not one, else
/// `ZCS_ERR_FAILED`.
pub(crate) fn declare_failed(key: &str, e: &zenoh_cuda_shm::DeclareError) -> Error {
    use zenoh_cuda_shm::DeclareError as D;
    let what = format!("declare on {key:?}");
    match e {
        D::Key { .. } | D::WildcardKey { .. } => Error::new(ZCS_ERR_INVALID, format!("{what}: {}", chain(e))),
        _ => Error::failed(&what, e),
    }
}

/// `p`, or `ZCS_ERR_NULL` naming the argument.
pub(crate) fn non_null<T>(p: *const T, name: &str) -> Result<(), Error> {
    if p.is_null() { Err(Error::new(ZCS_ERR_NULL, format!("{name} is null"))) } else { Ok(()) }
}

/// Writes a result through an out-parameter.
///
/// # Safety
/// `out` is not null and points to a writable `T`.
pub(crate) unsafe fn set_out<T>(out: *mut T, value: T) {
    // SAFETY: the caller's contract.
    unsafe { out.write(value) }
}

/// Writes a result through an optional out-parameter (nothing when it is NULL).
///
/// # Safety
/// `out` is null or points to a writable `T`.
pub(crate) unsafe fn set_opt_out<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: not null (checked); writable (the caller's contract).
        unsafe { out.write(value) }
    }
}

/// The `len` bytes at `data` (anything when `len` is 0).
///
/// # Safety
/// `data` points to `len` readable bytes that stay valid for `'a`, or `len` is 0.
pub(crate) unsafe fn bytes_arg<'a>(data: *const u8, len: usize) -> Result<&'a [u8], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    non_null(data, "data")?;
    // SAFETY: not null (checked); `len` readable bytes (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// The UTF-8 string at `p` (not null, NUL-terminated).
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that stays valid for `'a`.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, name: &str) -> Result<&'a str, Error> {
    non_null(p, name)?;
    // SAFETY: not null (checked above); NUL-terminated and valid for 'a (the caller's
    // contract).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| Error::new(ZCS_ERR_INVALID, format!("{name} is not UTF-8")))
}

/// This thread's last error message: what the last call that failed on this thread
/// said, with its causes ("" if none failed). Valid until the next failing call on
/// this thread; never null.
#[unsafe(no_mangle)]
pub extern "C" fn zcs_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// A static name for a result code ("ZCS_OK", "ZCS_ERR_STALE", …); never null.
#[unsafe(no_mangle)]
pub extern "C" fn zcs_result_name(code: zcs_result_t) -> *const c_char {
    let name: &'static CStr = match code {
        ZCS_OK => c"ZCS_OK",
        ZCS_ERR_NULL => c"ZCS_ERR_NULL",
        ZCS_ERR_STALE => c"ZCS_ERR_STALE",
        ZCS_ERR_INVALID => c"ZCS_ERR_INVALID",
        ZCS_ERR_TIMEOUT => c"ZCS_ERR_TIMEOUT",
        ZCS_ERR_CLOSED => c"ZCS_ERR_CLOSED",
        ZCS_ERR_MEMORY => c"ZCS_ERR_MEMORY",
        ZCS_ERR_FAILED => c"ZCS_ERR_FAILED",
        ZCS_ERR_PANIC => c"ZCS_ERR_PANIC",
        ZCS_ERR_NO_TENSOR => c"ZCS_ERR_NO_TENSOR",
        _ => c"unknown result code",
    };
    name.as_ptr()
}
