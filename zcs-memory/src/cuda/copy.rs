//! Copies and fills enqueued on a stream: the only layer above `sys` (the raw calls) that
//! moves bytes. Each call first makes the stream's own context current, so a caller
//! never binds a context for a copy.

// Re-exported by `zenoh-cuda-shm`: errors and panics documented as there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use super::Stream;
use super::sys::{self as cu, CudaError};

fn bind(stream: &Stream) -> Result<(), CudaError> {
    stream.bind()
}

/// Enqueues a host→device copy of `src` to `dst` on `stream`. Pageable `src` is staged
/// by the driver before the call returns, so it may be dropped afterwards; page-locked
/// `src` (pinned, or registered with the driver) is read by the copy itself, later.
///
/// # Safety
/// `dst..dst + src.len()` is device memory mapped read-write in the stream's context,
/// and stays mapped until the stream has passed the copy. Page-locked `src` stays valid
/// and unwritten until then too.
///
/// # Errors
/// [`CudaError`] when the stream's context cannot be made current (`cuCtxSetCurrent`) or
/// the driver refuses the copy (`cuMemcpyHtoDAsync`).
pub unsafe fn host_to_device(stream: &Stream, dst: u64, src: &[u8]) -> Result<(), CudaError> {
    if src.is_empty() {
        return Ok(());
    }
    bind(stream)?;
    // SAFETY: the caller guarantees the device range; `src` is a live slice of exactly
    // `src.len()` bytes, pageable, which the driver stages before returning.
    unsafe { cu::memcpy_htod_async(dst, src.as_ptr(), src.len(), stream.cu_stream()) }
}

/// Copies `dst.len()` device bytes at `src` into `dst` on `stream`, after the work
/// queued there, and waits for the stream to pass the copy.
///
/// # Safety
/// `src..src + dst.len()` is device memory mapped in the stream's context until the
/// copy has completed (this call returns after it).
///
/// # Errors
/// [`CudaError`] when the stream's context cannot be made current (`cuCtxSetCurrent`) or
/// the driver refuses the copy (`cuMemcpyDtoHAsync`); also an error of
/// earlier work on the stream, reported by the wait (`cuStreamSynchronize`).
pub unsafe fn device_to_host(stream: &Stream, src: u64, dst: &mut [u8]) -> Result<(), CudaError> {
    bind(stream)?;
    if !dst.is_empty() {
        // SAFETY: the caller guarantees the device range; `dst` is writable for its
        // length and borrowed mutably until the synchronize below has returned.
        unsafe { cu::memcpy_dtoh_async(dst.as_mut_ptr(), src, dst.len(), stream.cu_stream()) }?;
    }
    // SAFETY: `stream` is a live stream of the context bound above.
    unsafe { cu::stream_synchronize(stream.cu_stream()) }
}

/// Enqueues a copy of `len` device bytes at `src` into host memory at `dst` on
/// `stream`, after the work queued there, without waiting for it.
///
/// # Safety
/// `src..src + len` is device memory mapped in the stream's context, and
/// `dst..dst + len` host memory writable by the copy that nothing else reads or writes,
/// both until the stream has passed the copy. For a copy at full speed `dst` is
/// page-locked (registered with the driver).
///
/// # Errors
/// [`CudaError`] when the stream's context cannot be made current (`cuCtxSetCurrent`) or
/// the driver refuses the copy (`cuMemcpyDtoHAsync`).
pub unsafe fn device_to_host_async(stream: &Stream, dst: *mut u8, src: u64, len: usize) -> Result<(), CudaError> {
    if len == 0 {
        return Ok(());
    }
    bind(stream)?;
    // SAFETY: the caller guarantees both ranges until the stream has passed the copy.
    unsafe { cu::memcpy_dtoh_async(dst, src, len, stream.cu_stream()) }
}

/// Enqueues a device→device copy of `len` bytes on `stream`.
///
/// # Safety
/// Both ranges are device memory mapped in (or accessible from) the stream's context
/// and stay mapped until the stream has passed the copy; `dst` is writable and nothing
/// else writes either range meanwhile.
///
/// # Errors
/// [`CudaError`] when the stream's context cannot be made current (`cuCtxSetCurrent`) or
/// the driver refuses the copy (`cuMemcpyDtoDAsync`).
pub unsafe fn device_to_device(stream: &Stream, dst: u64, src: u64, len: usize) -> Result<(), CudaError> {
    if len == 0 {
        return Ok(());
    }
    bind(stream)?;
    // SAFETY: the caller guarantees both ranges.
    unsafe { cu::memcpy_dtod_async(dst, src, len, stream.cu_stream()) }
}

/// Enqueues a fill of `len` bytes at `dst` with `value` on `stream`.
///
/// # Safety
/// `dst..dst + len` is device memory mapped read-write in the stream's context until
/// the stream has passed the fill.
///
/// # Errors
/// [`CudaError`] when the stream's context cannot be made current (`cuCtxSetCurrent`) or
/// the driver refuses the fill (`cuMemsetD8Async`).
pub unsafe fn fill(stream: &Stream, dst: u64, value: u8, len: usize) -> Result<(), CudaError> {
    if len == 0 {
        return Ok(());
    }
    bind(stream)?;
    // SAFETY: the caller guarantees the range.
    unsafe { cu::memset_d8_async(dst, value, len, stream.cu_stream()) }
}

/// Waits until the stream has passed everything queued on it so far.
///
/// # Errors
/// [`CudaError`] when the stream's context cannot be made current, or the work on the
/// stream failed (`cuStreamSynchronize` reports an error of earlier asynchronous work).
pub fn wait(stream: &Stream) -> Result<(), CudaError> {
    bind(stream)?;
    // SAFETY: `stream` is a live stream (the borrow keeps it) of the context bound above.
    unsafe { cu::stream_synchronize(stream.cu_stream()) }
}
