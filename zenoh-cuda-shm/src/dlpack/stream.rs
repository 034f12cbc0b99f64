//! The consumer's stream, as DLPack names it, and how an export's reads end on it.

use std::ffi::c_void;
use std::thread::ThreadId;

use crate::cuda::Stream;

use super::*;

/// The stream a consumer will use the exported tensor on (DLPack's `stream` argument).
///
/// ```
/// use zenoh_cuda_shm::dlpack::{ConsumerStream, ExportError};
/// # fn main() -> Result<(), ExportError> {
/// let legacy = ConsumerStream::legacy_default(); // what `stream=None` means for CUDA
/// // DLPack's integers: 1 and 2 name the default streams, -1 asks for no ordering.
/// // SAFETY: none of these values names a stream (only values above 2 do).
/// let no_sync = unsafe { ConsumerStream::from_dlpack(-1) }?;
/// assert!(matches!(unsafe { ConsumerStream::from_dlpack(0) }, Err(ExportError::InvalidStream { value: 0 })));
/// # let _ = (legacy, no_sync);
/// # Ok(()) }
/// ```
///
/// A stream of ours, or a framework's by its raw handle:
///
/// ```no_run
/// # use zenoh_cuda_shm::cuda::Gpu;
/// # use zenoh_cuda_shm::dlpack::ConsumerStream;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let gpu = Gpu::probe()?;
/// let stream = gpu.new_stream()?;
/// let ours = ConsumerStream::stream(&stream); // kept alive by the export
/// let raw: *mut std::ffi::c_void = stream.as_raw(); // e.g. torch.cuda.current_stream().cuda_stream
/// // SAFETY: `stream` is a live stream of the device's primary context and outlives the
/// // exports made for it (it is dropped at the end of this function, after them).
/// let theirs = unsafe { ConsumerStream::from_raw(raw) };
/// # let _ = (ours, theirs);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConsumerStream(pub(super) StreamKind);

#[derive(Debug, Clone)]
pub(super) enum StreamKind {
    LegacyDefault,
    PerThreadDefault,
    Owned(Stream),
    Raw(usize),
    NoSync,
}

impl ConsumerStream {
    /// The legacy default stream (DLPack `1`; also what Python's `stream=None` means for
    /// CUDA).
    pub fn legacy_default() -> Self {
        Self(StreamKind::LegacyDefault)
    }

    /// The exporting thread's per-thread default stream (DLPack `2`).
    pub fn per_thread_default() -> Self {
        Self(StreamKind::PerThreadDefault)
    }

    /// A stream of this crate (kept alive by the export until its deleter has run).
    pub fn stream(stream: &Stream) -> Self {
        Self(StreamKind::Owned(stream.clone()))
    }

    /// No synchronisation (DLPack `-1`): see the [module docs](crate::dlpack).
    pub fn no_sync() -> Self {
        Self(StreamKind::NoSync)
    }

    /// A raw `CUstream` (`cudaStream_t`) owned by the consumer, such as PyTorch's
    /// `torch.cuda.current_stream().cuda_stream` as a pointer. A null handle and `1` are
    /// the legacy default stream, `2` the per-thread default stream.
    ///
    /// # Safety
    /// The stream belongs to the primary context of the exported sample's device, and
    /// stays alive until the export's deleter has returned (the deleter records a fence
    /// on it).
    pub unsafe fn from_raw(stream: *mut c_void) -> Self {
        match stream as usize {
            0 | 1 => Self::legacy_default(),
            2 => Self::per_thread_default(),
            p => Self(StreamKind::Raw(p)),
        }
    }

    /// DLPack's integer: `1` legacy default, `2` per-thread default, `-1` no
    /// synchronisation, `> 2` a `CUstream`.
    ///
    /// # Safety
    /// A value above 2 is used as in [`ConsumerStream::from_raw`].
    ///
    /// # Errors
    /// [`ExportError::InvalidStream`] for `0` (forbidden by DLPack) and negative values
    /// other than `-1`.
    pub unsafe fn from_dlpack(value: i64) -> Result<Self, ExportError> {
        match value {
            -1 => Ok(Self::no_sync()),
            1 => Ok(Self::legacy_default()),
            2 => Ok(Self::per_thread_default()),
            // SAFETY: the caller's contract for values above 2.
            v if v > 2 => Ok(unsafe { Self::from_raw(v as usize as *mut c_void) }),
            v => Err(ExportError::InvalidStream { value: v }),
        }
    }
}

/// Where the export's reads are ordered, and how its deleter ends them.
pub(super) enum EndOn {
    /// A stream that outlives the deleter: fence it.
    Stream(Stream),
    /// The per-thread default stream of `thread`: fence it from that thread only.
    PerThread { stream: Stream, thread: ThreadId },
    /// No stream known: wait for the whole context.
    Context,
}
