//! Samples: what a subscriber received, its metadata, and its bytes in host memory.

use std::ffi::{CString, c_char};
use std::sync::{Mutex, OnceLock};

use zenoh_cuda_shm::GpuSample;

use crate::error::{Error, ZCS_ERR_INVALID, ZCS_ERR_MEMORY, guard, non_null, set_out, zcs_result_t};
use crate::handle::{Registry, end};

/// A received message.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_sample_t {
    /// The handle (0: null).
    pub id: u64,
}

/// A sample and what was derived from it for C: a host copy of bytes that were not
/// contiguous, and its path's name.
pub(crate) struct SampleEntry {
    sample: GpuSample,
    host: OnceLock<Vec<u8>>,
    path: OnceLock<CString>,
    /// Serialises a sample's calls from several threads.
    lock: Mutex<()>,
}

static SAMPLES: Registry<SampleEntry> = Registry::new("sample");

/// Registers a received sample; its handle.
pub(crate) fn register(sample: GpuSample) -> zcs_sample_t {
    let entry = SampleEntry { sample, host: OnceLock::new(), path: OnceLock::new(), lock: Mutex::new(()) };
    zcs_sample_t { id: SAMPLES.insert(entry) }
}

/// The sample's sequence number (per publisher, from 1; 0 for a plain Zenoh publisher's).
///
/// # Safety
/// `out` is NULL or points to a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_seq(sample: zcs_sample_t, out: *mut u64) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        // SAFETY: not null (checked above); the caller passes a writable value.
        unsafe { set_out(out, s.sample.seq()) };
        Ok(())
    })
}

/// The sample's length in bytes.
///
/// # Safety
/// `out` is NULL or points to a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_len(sample: zcs_sample_t, out: *mut usize) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        // SAFETY: not null (checked above); the caller passes a writable value.
        unsafe { set_out(out, s.sample.len()) };
        Ok(())
    })
}

/// How the sample came: "zero-copy", "cpu-bytes", "inline", "plain", "host-block", …
/// (the names of `docs/quickstart.md`). Valid while the sample is.
///
/// # Safety
/// `out` is NULL or points to a `const char*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_path(sample: zcs_sample_t, out: *mut *const c_char) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        let name = s.path.get_or_init(|| CString::new(s.sample.path().to_string()).unwrap_or_default());
        // SAFETY: not null (checked above); the caller passes a writable value. The
        // string lives in the entry, which lives until the sample is dropped.
        unsafe { set_out(out, name.as_ptr()) };
        Ok(())
    })
}

/// The sample's bytes in host memory, read in place where they are there (bytes, and
/// blocks in shared host memory), valid until the sample is dropped.
/// `ZCS_ERR_MEMORY` for a block in device memory (use `zcs_sample_copy_to_host`).
///
/// # Safety
/// `data` and `len` are NULL or point to a `const uint8_t*` and a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_host_data(
    sample: zcs_sample_t,
    data: *mut *const u8,
    len: *mut usize,
) -> zcs_result_t {
    guard(|| {
        non_null(data, "data")?;
        non_null(len, "len")?;
        let s = SAMPLES.get(sample.id)?;
        let _serial = s.lock.lock().unwrap_or_else(|p| p.into_inner());
        let slice: &[u8] = match s.sample.host_bytes() {
            Some(std::borrow::Cow::Borrowed(b)) => b,
            // Not contiguous: one copy, kept with the sample.
            Some(std::borrow::Cow::Owned(v)) => s.host.get_or_init(|| v),
            None => {
                return Err(Error::new(ZCS_ERR_MEMORY, "this sample is in device memory: use zcs_sample_copy_to_host"));
            }
        };
        // The borrowed bytes live in the sample (its Zenoh payload or mapped block), which
        // the entry keeps until the sample is dropped.
        let (p, n) = (slice.as_ptr(), slice.len());
        // SAFETY: not null (checked above); the caller passes writable values.
        unsafe { set_out(data, p) };
        // SAFETY: as above.
        unsafe { set_out(len, n) };
        Ok(())
    })
}

/// Copies the sample's bytes into `dst` (`dst_len` ≥ its length, else
/// `ZCS_ERR_INVALID`): from host memory, or device→host for a block on the GPU.
///
/// # Safety
/// `dst` points to `dst_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_copy_to_host(sample: zcs_sample_t, dst: *mut u8, dst_len: usize) -> zcs_result_t {
    guard(|| {
        let s = SAMPLES.get(sample.id)?;
        let len = s.sample.len();
        if dst_len < len {
            return Err(Error::new(ZCS_ERR_INVALID, format!("dst holds {dst_len} bytes, the sample {len}")));
        }
        if len == 0 {
            return Ok(());
        }
        non_null(dst, "dst")?;
        let v = s.sample.to_vec().map_err(|e| Error::failed("copy the sample to host memory", &e))?;
        // SAFETY: `dst` is not null (checked) and holds ≥ len writable bytes (checked
        // against the caller's `dst_len`); `v` is our own buffer of `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst, v.len()) };
        Ok(())
    })
}

/// Drops a sample and zeroes its handle: a block it held goes back to its publisher.
///
/// # Safety
/// `sample` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_drop(sample: *mut zcs_sample_t) -> zcs_result_t {
    // SAFETY: `sample` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&SAMPLES, sample, "sample") })
}
