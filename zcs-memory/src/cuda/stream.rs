//! [`Stream`]: a CUDA stream of a GPU's primary context, as the API hands it around.

// Re-exported by `zenoh-cuda-shm`: errors and panics documented as there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaStream, sys};

use super::Gpu;
use super::event::Fence;
use super::sys::{self as cu, CudaError, wrap};

/// A CUDA stream on one GPU: work enqueued on it runs in order.
///
/// Cheap to clone: clones share one stream, which is destroyed when the last clone of a
/// stream made by [`Gpu::new_stream`] drops (after the work queued on it, as
/// `cuStreamDestroy` does). The default streams ([`Gpu::legacy_default_stream`],
/// [`Gpu::per_thread_stream`]) and streams of other libraries ([`Stream::from_raw`]) are
/// never destroyed by this type.
///
/// Every clone keeps the GPU's primary context alive.
///
/// ```no_run
/// use zcs_memory::cuda::Gpu;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let gpu = Gpu::probe()?;
/// let stream = gpu.new_stream()?;
/// // … enqueue copies or kernels on `stream` …
/// stream.synchronize()?; // the host waits for all of it
/// assert_eq!(stream.ordinal(), gpu.ordinal());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    inner: Arc<CudaStream>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").field("ordinal", &self.ordinal()).field("raw", &self.as_raw()).finish()
    }
}

impl Stream {
    pub(crate) fn new(inner: Arc<CudaStream>) -> Self {
        Self { inner }
    }

    /// A stream another library created (a PyTorch `torch.cuda.Stream.cuda_stream`, a
    /// CuPy `Stream.ptr`, a `cudaStream_t` from C), wrapped without taking ownership:
    /// dropping the last clone does not destroy it. `null` is the legacy default stream
    /// and `2` (`CU_STREAM_PER_THREAD`) the calling thread's per-thread default stream.
    ///
    /// # Safety
    /// `raw` is a live stream of `gpu`'s primary context (the context the CUDA runtime,
    /// and so PyTorch and CuPy, use on that device), or one of the special handles
    /// (`null`, `1` legacy default, `2` per-thread default); a stream that is not a
    /// special handle stays alive until every clone of the returned value has dropped.
    pub unsafe fn from_raw(gpu: &Gpu, raw: *mut c_void) -> Self {
        // SAFETY: the caller's contract is cudarc's for `wrap_borrowed_stream`: a live
        // stream of this context, outliving the wrapper; the wrapper never destroys it.
        Self::new(unsafe { gpu.cudarc_context().wrap_borrowed_stream(raw.cast()) })
    }

    /// The raw `CUstream` (the runtime's `cudaStream_t`), to hand to another library
    /// (PyTorch's `torch.cuda.ExternalStream`, CuPy's `ExternalStream`, a kernel launch in
    /// C). `null` for the legacy default stream, `2` for the per-thread default stream.
    ///
    /// The handle stays valid while this stream (any clone) lives; using it after that is
    /// the other library's use-after-free.
    pub fn as_raw(&self) -> *mut c_void {
        self.inner.cu_stream().cast()
    }

    /// The ordinal of the stream's device in this process.
    pub fn ordinal(&self) -> usize {
        self.inner.context().ordinal()
    }

    /// Blocks the calling thread until the GPU has passed everything queued on this
    /// stream so far (`cuStreamSynchronize`).
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or the stream's work failed
    /// (an error of an earlier asynchronous call is reported here).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: `inner` is a live stream (this value keeps it) of the context bound
        // above.
        unsafe { cu::stream_synchronize(self.inner.cu_stream()) }
    }

    /// Makes work enqueued on this stream from now on wait until the GPU has passed
    /// `fence` (`cuStreamWaitEvent`: the host does not wait). Same as [`Fence::order`].
    ///
    /// # Errors
    /// [`CudaError`] when the driver refuses the wait.
    pub fn wait(&self, fence: &Fence) -> Result<(), CudaError> {
        fence.order(self)
    }

    /// Makes the stream's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.inner.context().bind_to_thread().map_err(wrap("cuCtxSetCurrent"))
    }

    /// The cudarc stream, for the layer crates' own driver calls. Not part of the API:
    /// cudarc is an implementation detail.
    #[doc(hidden)]
    pub fn cudarc(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// The raw handle as cudarc types it, for the `sys` calls of the layer crates, their
    /// tests and benchmarks. Not part of the API: use [`Stream::as_raw`].
    #[doc(hidden)]
    pub fn cu_stream(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// Whether both values are the same stream object (clones of one another).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }
}
