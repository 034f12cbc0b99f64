//! Publishers and their loans: bytes put from host memory, or a block loaned, written
//! (by the CPU for host memory, by the producer's kernels on the loan's stream for
//! device memory) and put.

use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use zenoh_cuda_shm::cuda::Gpu;
use zenoh_cuda_shm::{GpuLoan, GpuPublisher};

use crate::error::{
    Error, ZCS_ERR_INVALID, ZCS_ERR_MEMORY, ZCS_ERR_NULL, ZCS_ERR_STALE, bytes_arg, declare_failed, guard, non_null,
    set_opt_out, set_out, str_arg, zcs_result_t,
};
use crate::handle::{Registry, end};
use crate::session::{SESSIONS, caller_stream, zcs_session_t};

/// A publisher on one key.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_publisher_t {
    /// The handle (0: null).
    pub id: u64,
}

/// A block loaned from a publisher's pool, to write and then put (or drop).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_loan_t {
    /// The handle (0: null).
    pub id: u64,
}

/// A publisher and its session's GPU (for the streams callers pass as raw handles).
pub(crate) struct PublisherEntry {
    pub(crate) publisher: GpuPublisher,
    pub(crate) gpu: Option<Gpu>,
}

pub(crate) static PUBLISHERS: Registry<PublisherEntry> = Registry::new("publisher");
/// A loan until it is put (then `None`, while its handle is being removed).
pub(crate) static LOANS: Registry<Mutex<Option<GpuLoan>>> = Registry::new("loan");

/// Declares a publisher on `key` (one key, no wildcards).
///
/// # Safety
/// `key` is NULL or NUL-terminated; `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_declare(
    session: zcs_session_t,
    key: *const c_char,
    out: *mut zcs_publisher_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let key = unsafe { str_arg(key, "key") }?;
        let s = SESSIONS.get(session.id)?;
        let publisher = s.declare_publisher(key).wait().map_err(|e| declare_failed(key, &e))?;
        let entry = PublisherEntry { publisher, gpu: s.gpu().cloned() };
        // SAFETY: not null (checked above); the caller passes a writable value (the contract).
        unsafe { set_out(out, zcs_publisher_t { id: PUBLISHERS.insert(entry) }) };
        Ok(())
    })
}

/// Undeclares a publisher and zeroes its handle; the bytes it still had to send go
/// out first. Its loans not yet put stay valid until dropped.
///
/// # Safety
/// `publisher` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_drop(publisher: *mut zcs_publisher_t) -> zcs_result_t {
    // SAFETY: `publisher` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&PUBLISHERS, publisher, "publisher") })
}

/// Publishes `len` bytes at `data` (copied before the call returns); `seq`, if not
/// NULL, receives the message's sequence number.
///
/// # Safety
/// `data` points to `len` readable bytes (or is anything when `len` is 0); `seq` is
/// NULL or points to a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_put_bytes(
    publisher: zcs_publisher_t,
    data: *const u8,
    len: usize,
    seq: *mut u64,
) -> zcs_result_t {
    guard(|| {
        // SAFETY: `len` readable bytes at `data` (the caller's contract).
        let bytes = unsafe { bytes_arg(data, len) }?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        let report = p.put_bytes(bytes).map_err(|e| Error::failed("put bytes", &e))?;
        // SAFETY: NULL or a writable `uint64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// Publishes `len` bytes of device memory at `src`: copied device→device on `stream`
/// (a `CUstream` of the session's device; NULL: the legacy default stream) into a
/// block, whose readers are ordered after that copy. Returns once the copy is
/// enqueued, without waiting for the stream (a payload below the inline threshold is
/// copied to the host and waited for). `ZCS_ERR_MEMORY` for a host-memory publisher.
///
/// # Safety
/// `src..src+len` is device memory of the session's GPU, readable by work on `stream`
/// and unchanged until that stream has passed the copy; `stream` is NULL or a live
/// stream of that device; `seq` is NULL or points to a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_put_device(
    publisher: zcs_publisher_t,
    src: u64,
    len: usize,
    stream: *mut c_void,
    seq: *mut u64,
) -> zcs_result_t {
    guard(|| {
        let entry = PUBLISHERS.get(publisher.id)?;
        let Some(gpu) = &entry.gpu else {
            return Err(Error::new(ZCS_ERR_MEMORY, "a host-memory publisher has no device memory to copy into"));
        };
        if src == 0 && len > 0 {
            return Err(Error::new(ZCS_ERR_NULL, "src is null"));
        }
        // SAFETY: NULL or a live stream of the session's device (the caller's contract).
        let stream = unsafe { caller_stream(gpu, stream) };
        // SAFETY: the source range and its lifetime are the caller's contract.
        let report = unsafe { entry.publisher.put_device(src, len, &stream) }
            .map_err(|e| Error::failed(&format!("put {len} bytes from device memory"), &e))?;
        // SAFETY: NULL or a writable `uint64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// How many GPU-aware subscribers (ours, on any path) the publisher knows of, and
/// whether a plain Zenoh subscriber listens on its key: what a producer may wait for
/// before its first put.
///
/// # Safety
/// `aware` and `plain` are NULL or point to a `size_t` and a `bool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_subscribers(
    publisher: zcs_publisher_t,
    aware: *mut usize,
    plain: *mut bool,
) -> zcs_result_t {
    guard(|| {
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        if !aware.is_null() {
            // SAFETY: not null (checked); the caller passes a writable value.
            unsafe { set_out(aware, p.aware_subscribers()) };
        }
        if !plain.is_null() {
            // SAFETY: as above.
            unsafe { set_out(plain, p.plain_subscribers()) };
        }
        Ok(())
    })
}

/// How many subscribers the publisher serves in place now (connected and ready on a
/// zero-copy path: they map its blocks), a subset of `zcs_publisher_subscribers`'s
/// `aware`: what a producer that wants every message on those paths waits for.
///
/// # Safety
/// `out` is NULL or points to a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_zero_copy_subscribers(
    publisher: zcs_publisher_t,
    out: *mut usize,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let entry = PUBLISHERS.get(publisher.id)?;
        // SAFETY: not null (checked above); the caller passes a writable value.
        unsafe { set_out(out, entry.publisher.zero_copy_subscribers()) };
        Ok(())
    })
}

/// How many of the publisher's blocks are loaned or held now: its pool's and, for a
/// CUDA publisher serving consumers without a GPU, its host blocks'. 0 once every loan
/// was put or dropped and every subscriber gave its blocks back.
///
/// # Safety
/// `out` is NULL or points to a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_blocks_in_use(publisher: zcs_publisher_t, out: *mut usize) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        let n = p.pool_stats().blocks_in_use + p.host_pool_stats().map_or(0, |h| h.blocks_in_use);
        // SAFETY: not null (checked above); the caller passes a writable value.
        unsafe { set_out(out, n) };
        Ok(())
    })
}

/// Loans a block of `len` bytes (waiting, up to the pool's `loan_timeout_ms`, while
/// every block is in use).
///
/// # Safety
/// `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_loan(
    publisher: zcs_publisher_t,
    len: usize,
    out: *mut zcs_loan_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        if len == 0 {
            return Err(Error::new(ZCS_ERR_INVALID, "a loan of 0 bytes"));
        }
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        let loan = p.loan(len).map_err(|e| Error::failed(&format!("loan {len} bytes"), &e))?;
        // SAFETY: not null (checked above); the caller passes a writable value (the contract).
        unsafe { set_out(out, zcs_loan_t { id: LOANS.insert(Mutex::new(Some(loan))) }) };
        Ok(())
    })
}

/// The refusal of another publisher's loan (which stays with the caller, usable).
fn foreign_loan() -> Error {
    Error::new(ZCS_ERR_INVALID, "this loan came from another publisher: only the publisher that lent it can put it")
}

/// Hands the loan `loan` names to `publish`, the one way every put of a loan takes.
///
/// The loan must be one `owns` accepts (else `foreign_loan`), and `prepare` reads it
/// first (the message's fields, a description) and may refuse it: either refusal leaves
/// the loan with the caller, unchanged. Once `publish` has taken it, the handle is
/// zeroed, whether it succeeds or not, unless `publish` gives the loan back (refused
/// before anything was sent): then it returns to its handle.
///
/// # Safety
/// `loan` is not NULL and points to a handle.
pub(crate) unsafe fn put_loan<P, R>(
    loan: *mut zcs_loan_t,
    owns: impl FnOnce(&GpuLoan) -> bool,
    prepare: impl FnOnce(&GpuLoan) -> Result<P, Error>,
    publish: impl FnOnce(GpuLoan, P) -> Result<R, (Error, Option<Box<GpuLoan>>)>,
) -> Result<R, Error> {
    // SAFETY: not null and points to a handle (the caller's contract).
    let h = unsafe { &mut *loan };
    let slot = LOANS.get(h.id)?;
    let mut held = slot.lock().unwrap_or_else(|p| p.into_inner());
    let Some(l) = held.take() else { return Err(Error::new(ZCS_ERR_STALE, "this loan was put already")) };
    let prepared = if owns(&l) { prepare(&l) } else { Err(foreign_loan()) };
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            *held = Some(l);
            return Err(e);
        }
    };
    match publish(l, prepared) {
        Err((e, Some(back))) => {
            *held = Some(*back);
            Err(e)
        }
        result => {
            drop(held);
            let _ = LOANS.remove(h.id);
            h.id = 0;
            result.map_err(|(e, _)| e)
        }
    }
}

/// Runs `f` on the loan `loan` names.
fn with_loan<R>(loan: zcs_loan_t, f: impl FnOnce(&mut GpuLoan) -> Result<R, Error>) -> Result<R, Error> {
    let l = LOANS.get(loan.id)?;
    let mut g = l.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_mut() {
        Some(loan) => f(loan),
        None => Err(Error::new(ZCS_ERR_STALE, "this loan was put already")),
    }
}

/// The loan's length in bytes.
///
/// # Safety
/// `out` is NULL or points to a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_loan_len(loan: zcs_loan_t, out: *mut usize) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let len = with_loan(loan, |l| Ok(l.len()))?;
        // SAFETY: not null (checked above); the caller passes a writable value (the contract).
        unsafe { set_out(out, len) };
        Ok(())
    })
}

/// The loan's memory for the CPU to write, when it is host memory (`ZCS_ERR_MEMORY`
/// for device memory: see `zcs_loan_device_ptr`). Valid until the loan is put or
/// dropped.
///
/// # Safety
/// `out` is NULL or points to a `uint8_t*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_loan_host_ptr(loan: zcs_loan_t, out: *mut *mut u8) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let ptr = with_loan(loan, |l| match l.as_mut_slice() {
            Some(s) => Ok(s.as_mut_ptr()),
            None => Err(Error::new(ZCS_ERR_MEMORY, "this loan is device memory: use zcs_loan_device_ptr")),
        })?;
        // SAFETY: not null (checked above); the caller passes a writable value (the contract).
        unsafe { set_out(out, ptr) };
        Ok(())
    })
}

/// The loan's device address (a `CUdeviceptr`) and the stream (a `CUstream`) the
/// producer must enqueue its writes on: `zcs_publisher_put` orders the subscribers'
/// reads after the work on that stream, without waiting on the host. `ZCS_ERR_MEMORY`
/// for host memory (see `zcs_loan_host_ptr`). Valid until the loan is put or dropped.
///
/// # Safety
/// `ptr` and `stream` are NULL or point to a `uint64_t` and a `void*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_loan_device_ptr(
    loan: zcs_loan_t,
    ptr: *mut u64,
    stream: *mut *mut c_void,
) -> zcs_result_t {
    guard(|| {
        non_null(ptr, "ptr")?;
        non_null(stream, "stream")?;
        let (p, s) = with_loan(loan, |l| match (l.device_ptr(), l.stream()) {
            (Some(p), Some(s)) => Ok((p, s.as_raw())),
            _ => Err(Error::new(ZCS_ERR_MEMORY, "this loan is host memory: use zcs_loan_host_ptr")),
        })?;
        // SAFETY: not null (checked above); the caller passes a writable value (the contract).
        unsafe { set_out(ptr, p) };
        // SAFETY: not null (checked above); the caller passes a writable value (the contract).
        unsafe { set_out(stream, s) };
        Ok(())
    })
}

/// Publishes a loaned block and zeroes the loan's handle (also when the put fails: the
/// block then goes back to the pool). Another publisher's loan is `ZCS_ERR_INVALID`
/// and stays with the caller. `seq`, if not NULL, receives the message's sequence
/// number.
///
/// # Safety
/// `loan` is NULL or points to a handle; `seq` is NULL or points to a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_put(
    publisher: zcs_publisher_t,
    loan: *mut zcs_loan_t,
    seq: *mut u64,
) -> zcs_result_t {
    guard(|| {
        non_null(loan, "loan")?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        // SAFETY: not null (checked); points to a handle.
        let report = unsafe {
            put_loan(loan, |l| p.owns(l), |_| Ok(()), |l, ()| p.put(l).map_err(|e| (Error::failed("put", &e), None)))
        }?;
        // SAFETY: NULL or a writable `uint64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// Gives a loan back unpublished and zeroes its handle.
///
/// # Safety
/// `loan` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_loan_drop(loan: *mut zcs_loan_t) -> zcs_result_t {
    // SAFETY: `loan` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&LOANS, loan, "loan") })
}
