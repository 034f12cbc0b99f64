//! Samples: what a subscriber received, its metadata, and its bytes in host memory.

use std::ffi::{CString, c_char};
use std::sync::{Mutex, OnceLock};

use zenoh_cuda_shm::cuda::Gpu;
use zenoh_cuda_shm::{DeviceRead, GpuSample};

use crate::description::TensorOut;
use crate::error::{Error, ZCS_ERR_INVALID, ZCS_ERR_MEMORY, guard, non_null, set_out, zcs_result_t};
use crate::handle::{Registry, end};
use crate::session::{SESSIONS, caller_stream, zcs_session_t};

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
    pub(crate) sample: GpuSample,
    /// The subscriber's GPU (its session's), for reads on a caller's stream.
    gpu: Option<Gpu>,
    host: OnceLock<Vec<u8>>,
    path: OnceLock<CString>,
    /// Its tensor description, once asked for.
    pub(crate) tensor: OnceLock<TensorOut>,
}

pub(crate) static SAMPLES: Registry<SampleEntry> = Registry::new("sample");

/// Registers a sample received by a subscriber of a session on `gpu`; its handle.
pub(crate) fn register(sample: GpuSample, gpu: Option<Gpu>) -> zcs_sample_t {
    let entry = SampleEntry { sample, gpu, host: OnceLock::new(), path: OnceLock::new(), tensor: OnceLock::new() };
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

/// The sample's publication time: nanoseconds since the Unix epoch on the publisher's
/// clock (`CLOCK_REALTIME`; one clock for every process of a host), 0 when unknown (a
/// plain Zenoh publisher's).
///
/// # Safety
/// `out` is NULL or points to a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_timestamp_ns(sample: zcs_sample_t, out: *mut u64) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        // SAFETY: not null (checked above); the caller passes a writable value.
        unsafe { set_out(out, s.sample.info().timestamp_ns) };
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

/// A read of a sample in device memory, ordered on the caller's stream.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_read_t {
    /// The handle (0: null).
    pub id: u64,
}

/// A read and the sample it reads. Fields drop in order: the read (its fence recorded)
/// before the sample it borrows.
struct ReadEntry {
    read: Mutex<Option<DeviceRead<'static>>>,
    _sample: std::sync::Arc<SampleEntry>,
}

static READS: Registry<ReadEntry> = Registry::new("read");

/// Begins a read of a sample of a CUDA session on `stream` (a `CUstream` of the
/// session's device; NULL: the legacy default stream): `device_ptr` receives the
/// address of its first byte, readable by work enqueued on that stream from now on.
/// A block is read in place: the stream waits for the producer's work, the host does
/// not. Bytes are copied onto the GPU on that stream first. End the read
/// (`zcs_read_end`) once the work that reads it is enqueued; the block goes back to
/// its publisher only when the stream has passed that work. `ZCS_ERR_MEMORY` for a
/// sample of a host-memory session (use `zcs_sample_host_data`).
///
/// # Safety
/// `stream` is NULL or a live stream of the session's device that outlives the read;
/// `read` and `device_ptr` are NULL or point to a handle and a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_read(
    sample: zcs_sample_t,
    stream: *mut std::ffi::c_void,
    read: *mut zcs_read_t,
    device_ptr: *mut u64,
) -> zcs_result_t {
    guard(|| {
        non_null(read, "read")?;
        non_null(device_ptr, "device_ptr")?;
        let s = SAMPLES.get(sample.id)?;
        let Some(gpu) = &s.gpu else {
            return Err(Error::new(
                ZCS_ERR_MEMORY,
                "a host-memory session's samples are in host memory: use zcs_sample_host_data",
            ));
        };
        // SAFETY: NULL or a live stream of this device that outlives the read (the
        // caller's contract).
        let stream = unsafe { caller_stream(gpu, stream) };
        let r = s.sample.read(&stream).map_err(|e| Error::failed("read the sample on the stream", &e))?;
        let ptr = r.device_ptr();
        // SAFETY: `r` borrows the sample inside the `Arc` `s` (a heap value that does not
        // move); the entry keeps that `Arc` and drops the read before it (field order),
        // so the borrow never outlives what it borrows.
        let r = unsafe { std::mem::transmute::<DeviceRead<'_>, DeviceRead<'static>>(r) };
        let id = READS.insert(ReadEntry { read: Mutex::new(Some(r)), _sample: s });
        // SAFETY: not null (checked above); the caller passes writable values.
        unsafe { set_out(read, zcs_read_t { id }) };
        // SAFETY: as above.
        unsafe { set_out(device_ptr, ptr) };
        Ok(())
    })
}

/// Ends a read once the work that reads it is enqueued on its stream (a fence is
/// recorded there), and zeroes its handle.
///
/// # Safety
/// `read` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_read_end(read: *mut zcs_read_t) -> zcs_result_t {
    guard(|| {
        non_null(read, "read")?;
        // SAFETY: not null (checked); points to a handle.
        let h = unsafe { &mut *read };
        let entry = READS.remove(h.id)?;
        h.id = 0;
        let taken = entry.read.lock().unwrap_or_else(|p| p.into_inner()).take();
        match taken {
            Some(r) => r.end().map_err(|e| Error::failed("record the read's fence", &e)),
            None => Ok(()),
        }
    })
}

/// Makes the session's CUDA context (its device's primary context) current on the
/// calling thread, so that driver API calls there (`cuStreamCreate`, copies on a
/// loan's or a read's stream) use the session's device. `ZCS_ERR_MEMORY` for a
/// host-memory session.
#[unsafe(no_mangle)]
pub extern "C" fn zcs_session_bind_gpu(session: zcs_session_t) -> zcs_result_t {
    guard(|| {
        let s = SESSIONS.get(session.id)?;
        let gpu = s.gpu().ok_or_else(|| Error::new(ZCS_ERR_MEMORY, "a host-memory session has no GPU"))?;
        gpu.bind().map_err(|e| Error::failed("make the session's CUDA context current", &e))
    })
}
