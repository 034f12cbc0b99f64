//! Export: a received sample as a DLPack tensor, its lease kept until the deleter.

use std::borrow::Cow;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use tensor_codec::{DecodeError, Device, TensorMeta};

use crate::cuda::{CudaError, DeviceBlock, Fence, Gpu, Stream, copy};
use crate::pool::Fence as PoolFence;
use crate::sample::{GpuSample, ReadError};

use super::*;

/// Exporting a received sample through DLPack failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The sample carries no tensor description.
    #[error("the sample carries no tensor description")]
    NoMeta,
    /// The sample's tensor description is invalid for its payload.
    #[error("invalid tensor description")]
    Meta(#[from] DecodeError),
    /// A DLPack stream value that is not allowed (`0`, or negative other than `-1`).
    #[error("stream {value} is not a valid DLPack stream (0 is forbidden; -1, 1, 2 or a CUstream)")]
    InvalidStream {
        /// The value given.
        value: i64,
    },
    /// The consumer stream belongs to another device than the sample.
    #[error("the consumer stream is on GPU {stream_ordinal}, the sample on GPU {ordinal}")]
    StreamDevice {
        /// The stream's device.
        stream_ordinal: usize,
        /// The sample's device.
        ordinal: usize,
    },
    /// The payload cannot be reached from this session.
    #[error("the payload is not readable from this session")]
    PayloadUnavailable,
    /// Ordering the read after the publisher's signal failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The export asked for no copy ([`ExportOptions::copy`] `Some(false)`), but serving
    /// it needs one.
    #[error("a copy is needed ({why}) but the consumer asked for none")]
    CopyRequired {
        /// Why a copy is needed.
        why: &'static str,
    },
    /// Copying the payload to host memory failed.
    #[error("copying the tensor to host memory failed")]
    HostCopy(#[source] crate::tensor::TensorReadError),
}

/// What a consumer asks of an export besides its stream: DLPack's `copy` and
/// `dl_device` arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// `Some(true)`: always export a private copy (`IS_COPIED`); `Some(false)`: never
    /// copy ([`ExportError::CopyRequired`] where one is needed); `None` (default): in
    /// place where possible.
    pub copy: Option<bool>,
    /// Export to host memory (`kDLCPU`). For CUDA sessions this is a device→host copy,
    /// ordered after the publisher's ready signal and waited for before the export
    /// returns; host-memory sessions export host memory anyway.
    pub to_host: bool,
}

/// What an export keeps alive until its deleter runs.
enum Owner {
    /// Host memory: the sample (its lease or bytes), and a private copy if the bytes
    /// were not contiguous.
    Host { _sample: GpuSample, _copy: Option<Box<[u8]>> },
    /// Device memory: the sample (its lease), where its reads are ordered, and the
    /// private device copy of a bytes sample.
    Device { sample: GpuSample, gpu: Gpu, end: EndOn, staged: Option<DeviceBlock> },
}

const _: () = {
    const fn send<T: Send>() {}
    send::<Owner>();
};

impl Owner {
    /// Ends the export's reads and lets go of everything: called by the deleter.
    fn release(self) {
        let Owner::Device { sample, gpu, end, staged } = self else { return };
        let fences: Vec<Box<dyn PoolFence>> =
            end_reads(&gpu, &end).into_iter().map(|f| Box::new(f) as Box<dyn PoolFence>).collect();
        match staged {
            // The private copy must outlive the consumer's reads: freed on the releaser.
            Some(block) => sample.delivery().defer_until(fences, Box::new(move || drop(block))),
            None => {
                for fence in fences {
                    // A sample without a lease hands the fence back: nothing to hold.
                    drop(sample.delivery().hold_lease_until(fence));
                }
            }
        }
        // The last clone of the sample going away releases the lease, after the fences.
        drop(sample);
    }
}

/// A fence after the consumer's reads, or `None` once they are known complete (after a
/// host wait: no stream known, or the fence could not be recorded).
fn end_reads(gpu: &Gpu, end: &EndOn) -> Option<Fence> {
    let stream = match end {
        EndOn::Stream(s) => Some(s),
        EndOn::PerThread { stream, thread } if *thread == std::thread::current().id() => Some(stream),
        EndOn::PerThread { .. } | EndOn::Context => None,
    };
    if let Some(stream) = stream {
        match Fence::record(gpu, stream) {
            Ok(fence) => return Some(fence),
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "cannot fence a DLPack export's reads; waiting for the context")
            }
        }
    }
    if let Err(e) = gpu.synchronize() {
        tracing::warn!(error = %crate::error::Chain(&e), "cuCtxSynchronize failed in a DLPack deleter; releasing anyway");
    }
    None
}

/// The fields of an export, before they are put into a managed struct.
struct Parts {
    data: u64,
    device: DLDevice,
    dtype: DLDataType,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    flags: u64,
    owner: Owner,
}

/// An export: the managed struct first (so a pointer to it is a pointer to the whole),
/// then what it points into and owns.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    owner: Owner,
}

/// The managed structs an [`Export`] can hold.
trait Managed: Sized {
    fn ctx(&self) -> *mut c_void;
}

impl Managed for DLManagedTensorVersioned {
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

impl Managed for DLManagedTensor {
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

static LIVE_EXPORTS: AtomicUsize = AtomicUsize::new(0);

/// DLPack exports of this process whose deleter has not run yet.
#[doc(hidden)] // for the test suites (Rust and Python), not part of the API
pub fn live_exports() -> usize {
    // Relaxed: a statistic; the deleter's effects are ordered by the lease machinery.
    LIVE_EXPORTS.load(Ordering::Relaxed)
}

/// Boxes an export, points its tensor at its own arrays and its `manager_ctx` at itself.
fn into_export<M: Managed>(
    managed: M,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    owner: Owner,
    tensor: impl Fn(&mut M) -> &mut DLTensor,
    set_ctx: impl Fn(&mut M, *mut c_void),
) -> NonNull<M> {
    let mut b = Box::new(Export { managed, shape, strides, owner });
    let ndim = b.shape.len();
    let (shape_ptr, strides_ptr) = if ndim == 0 {
        (std::ptr::null_mut(), std::ptr::null_mut())
    } else {
        // The arrays live in their own heap allocations, which do not move with the box.
        (b.shape.as_mut_ptr(), b.strides.as_mut_ptr())
    };
    let t = tensor(&mut b.managed);
    t.shape = shape_ptr;
    t.strides = strides_ptr;
    let this: *mut Export<M> = &mut *b;
    set_ctx(&mut b.managed, this.cast());
    LIVE_EXPORTS.fetch_add(1, Ordering::Relaxed);
    // `Export` is `repr(C)` with `managed` first: the box's address is the struct's.
    NonNull::from(Box::leak(b)).cast::<M>()
}

/// Frees an export made by [`into_export`]: the deleter's body.
///
/// # Safety
/// `p` is null or a pointer returned by [`into_export`] (as `*mut M`) whose deleter has
/// not run yet.
unsafe fn free_export<M: Managed>(p: *mut M) {
    if p.is_null() {
        return;
    }
    // SAFETY: per the contract `p` points to a live `M` (the first field of an `Export`).
    let ctx = unsafe { &*p }.ctx();
    if ctx != p.cast::<c_void>() {
        // Not the struct we handed out (a consumer passed a copy): freeing it would free
        // memory we do not own. Leak instead.
        tracing::error!("DLPack deleter called on a struct this crate did not export; leaking it");
        return;
    }
    // SAFETY: `p` came from `Box::leak` of an `Export<M>` in `into_export` (same address:
    // `managed` is its first field, `repr(C)`), and this runs once per the contract.
    let export = unsafe { Box::from_raw(p.cast::<Export<M>>()) };
    LIVE_EXPORTS.fetch_sub(1, Ordering::Relaxed);
    let Export { managed, shape, strides, owner } = *export;
    owner.release();
    drop((managed, shape, strides));
}

/// The deleter of versioned exports. Never unwinds.
unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    // SAFETY: DLPack's deleter contract: `p` is the pointer this module handed out and
    // the deleter runs once.
    let r = catch_unwind(AssertUnwindSafe(|| unsafe { free_export(p) }));
    // A panic was caught: whatever had not been released leaks; unwinding into C would
    // abort the process.
    drop(r);
}

/// The deleter of legacy exports. Never unwinds.
unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    // SAFETY: as for `delete_versioned`.
    let r = catch_unwind(AssertUnwindSafe(|| unsafe { free_export(p) }));
    drop(r);
}

impl GpuSample {
    /// Where an export of this sample lives: `kDLCUDA` with the subscriber's local
    /// ordinal for CUDA sessions, `kDLCPU` for host-memory sessions (DLPack's
    /// `__dlpack_device__`).
    pub fn dlpack_device(&self) -> DLDevice {
        match self.delivery().subscriber_gpu() {
            Some(gpu) => Device::cuda(gpu.ordinal() as i32).into(),
            None => Device::CPU.into(),
        }
    }

    /// Exports the tensor as a `DLManagedTensorVersioned` (see the [module docs](crate::dlpack)):
    /// zero-copy and `READ_ONLY` where the payload is read in place, ordered on `stream`
    /// before this returns. Host-memory sessions export `kDLCPU` and ignore `stream`.
    ///
    /// # Errors
    /// [`ExportError::NoMeta`] / [`ExportError::Meta`] for a missing or invalid
    /// description; stream, read and CUDA failures.
    pub fn to_dlpack_versioned(&self, stream: &ConsumerStream) -> Result<ManagedTensorVersioned, ExportError> {
        self.to_dlpack_versioned_with(stream, ExportOptions::default())
    }

    /// [`GpuSample::to_dlpack_versioned`] with DLPack's `copy` and `dl_device` requests
    /// ([`ExportOptions`]).
    ///
    /// # Errors
    /// As [`GpuSample::to_dlpack_versioned`]; [`ExportError::CopyRequired`] when
    /// `copy: Some(false)` cannot be served in place; [`ExportError::HostCopy`] when a
    /// host copy fails.
    pub fn to_dlpack_versioned_with(
        &self,
        stream: &ConsumerStream,
        options: ExportOptions,
    ) -> Result<ManagedTensorVersioned, ExportError> {
        self.versioned(None, stream, options)
    }

    /// Exports the tensor as a legacy `DLManagedTensor`: as
    /// [`GpuSample::to_dlpack_versioned`], without flags (the legacy struct cannot say
    /// `READ_ONLY`: treat in-place exports as read-only).
    ///
    /// # Errors
    /// As [`GpuSample::to_dlpack_versioned`].
    pub fn to_dlpack_legacy(&self, stream: &ConsumerStream) -> Result<ManagedTensorLegacy, ExportError> {
        self.to_dlpack_legacy_with(stream, ExportOptions::default())
    }

    /// [`GpuSample::to_dlpack_legacy`] with DLPack's `copy` and `dl_device` requests
    /// ([`ExportOptions`]).
    ///
    /// # Errors
    /// As [`GpuSample::to_dlpack_versioned_with`].
    pub fn to_dlpack_legacy_with(
        &self,
        stream: &ConsumerStream,
        options: ExportOptions,
    ) -> Result<ManagedTensorLegacy, ExportError> {
        self.legacy(None, stream, options)
    }

    /// [`GpuSample::to_dlpack_versioned_with`] for a sample whose metadata is not a
    /// tensor description (a ROS message's data, say), with `meta` describing its
    /// payload instead. `meta` is checked against the payload's length.
    ///
    /// # Errors
    /// [`ExportError::Meta`] when `meta` does not fit the payload; as
    /// [`GpuSample::to_dlpack_versioned_with`] otherwise.
    pub fn to_dlpack_versioned_as(
        &self,
        meta: &TensorMeta,
        stream: &ConsumerStream,
        options: ExportOptions,
    ) -> Result<ManagedTensorVersioned, ExportError> {
        self.versioned(Some(meta), stream, options)
    }

    /// [`GpuSample::to_dlpack_legacy_with`] with `meta` describing the payload (see
    /// [`GpuSample::to_dlpack_versioned_as`]).
    ///
    /// # Errors
    /// As [`GpuSample::to_dlpack_versioned_as`].
    pub fn to_dlpack_legacy_as(
        &self,
        meta: &TensorMeta,
        stream: &ConsumerStream,
        options: ExportOptions,
    ) -> Result<ManagedTensorLegacy, ExportError> {
        self.legacy(Some(meta), stream, options)
    }

    /// A versioned export described by `given`, else by the sample's own metadata.
    fn versioned(
        &self,
        given: Option<&TensorMeta>,
        stream: &ConsumerStream,
        options: ExportOptions,
    ) -> Result<ManagedTensorVersioned, ExportError> {
        let p = self.export_parts(given, stream, options)?;
        let managed = DLManagedTensorVersioned {
            version: DLPACK_VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: p.flags,
            dl_tensor: tensor_of(&p),
        };
        let ptr = into_export(managed, p.shape, p.strides, p.owner, |m| &mut m.dl_tensor, |m, c| m.manager_ctx = c);
        Ok(ManagedTensorVersioned { ptr })
    }

    /// A legacy export described by `given`, else by the sample's own metadata.
    fn legacy(
        &self,
        given: Option<&TensorMeta>,
        stream: &ConsumerStream,
        options: ExportOptions,
    ) -> Result<ManagedTensorLegacy, ExportError> {
        let p = self.export_parts(given, stream, options)?;
        let managed = DLManagedTensor {
            dl_tensor: tensor_of(&p),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        };
        let ptr = into_export(managed, p.shape, p.strides, p.owner, |m| &mut m.dl_tensor, |m, c| m.manager_ctx = c);
        Ok(ManagedTensorLegacy { ptr })
    }

    /// The parts of an export, described by `given` or else by the sample's own metadata.
    fn export_parts(
        &self,
        given: Option<&TensorMeta>,
        stream: &ConsumerStream,
        options: ExportOptions,
    ) -> Result<Parts, ExportError> {
        let meta = match given {
            Some(m) => {
                m.validate(self.len() as u64).map_err(DecodeError::from)?;
                m.clone()
            }
            None => self.tensor_meta()?.ok_or(ExportError::NoMeta)?,
        };
        let strides = meta.effective_strides().map_err(DecodeError::from)?.into_boxed_slice();
        let shape = meta.shape.clone().into_boxed_slice();
        let dtype = meta.dtype.to_dl();
        let no_copy = |why| if options.copy == Some(false) { Err(ExportError::CopyRequired { why }) } else { Ok(()) };
        if options.to_host && self.delivery().subscriber_gpu().is_some() {
            no_copy("the payload is in device memory")?;
            // The bytes the view touches, rebased to offset 0 (same explicit strides); for
            // a given description, the whole payload at its offset.
            let (data, offset) = match given {
                None => (self.to_owned_tensor().map_err(ExportError::HostCopy)?.into_parts().1, 0),
                Some(m) => (self.to_vec().map_err(|e| ExportError::HostCopy(e.into()))?, m.byte_offset),
            };
            let (copy, at) = aligned_copy(&data);
            let base = copy.as_ptr() as u64 + at as u64 + offset;
            let owner = Owner::Host { _sample: self.clone(), _copy: Some(copy) };
            let (device, flags) = (Device::CPU.into(), DLPACK_FLAG_BITMASK_IS_COPIED);
            return Ok(Parts { data: base, device, dtype, shape, strides, flags, owner });
        }
        let Some(gpu) = self.delivery().subscriber_gpu() else {
            let bytes = self.host_bytes().ok_or(ExportError::PayloadUnavailable)?;
            // Bytes that arrived inline sit wherever Zenoh's buffer put them: a first element
            // that is not aligned to its item size is served from an aligned copy.
            let first = bytes.as_ptr() as u64 + meta.byte_offset;
            let misaligned =
                meta.numel().is_ok_and(|n| n > 0) && meta.dtype.itemsize().is_some_and(|i| !first.is_multiple_of(i));
            let (base, copy, flags) = match bytes {
                Cow::Borrowed(b) if options.copy != Some(true) && !misaligned => {
                    (b.as_ptr() as u64, None, DLPACK_FLAG_BITMASK_READ_ONLY)
                }
                // Asked for, not contiguous in memory, or misaligned: a private copy, which
                // the export owns.
                bytes => {
                    if options.copy != Some(true) {
                        no_copy(if misaligned {
                            "the payload is not aligned to its item size"
                        } else {
                            "the payload is not contiguous in memory"
                        })?;
                    }
                    let (v, at) = aligned_copy(&bytes);
                    (v.as_ptr() as u64 + at as u64, Some(v), DLPACK_FLAG_BITMASK_IS_COPIED)
                }
            };
            let owner = Owner::Host { _sample: self.clone(), _copy: copy };
            let device = Device::CPU.into();
            return Ok(Parts { data: base + meta.byte_offset, device, dtype, shape, strides, flags, owner });
        };
        let (work, end) = match &stream.0 {
            StreamKind::LegacyDefault => {
                let s = gpu.legacy_default_stream();
                (s.clone(), EndOn::Stream(s))
            }
            StreamKind::PerThreadDefault => {
                let s = gpu.per_thread_stream();
                (s.clone(), EndOn::PerThread { stream: s, thread: std::thread::current().id() })
            }
            StreamKind::Owned(s) => {
                let stream_ordinal = s.ordinal();
                if stream_ordinal != gpu.ordinal() {
                    return Err(ExportError::StreamDevice { stream_ordinal, ordinal: gpu.ordinal() });
                }
                (s.clone(), EndOn::Stream(s.clone()))
            }
            StreamKind::Raw(p) => {
                // SAFETY: `ConsumerStream::from_raw`'s contract: a stream of this device's
                // primary context, alive until the deleter has returned (`EndOn` keeps the
                // borrowed wrapper no longer than that).
                let s = unsafe { Stream::from_raw(gpu, *p as *mut c_void) };
                (s.clone(), EndOn::Stream(s))
            }
            StreamKind::NoSync => (gpu.new_stream()?, EndOn::Context),
        };
        let (base, staged, flags) = match self.delivery().begin_detached_read(&work)? {
            Some(ptr) if options.copy == Some(true) => {
                // A private device copy, enqueued on the consumer's stream after its wait.
                let block = DeviceBlock::allocate(gpu, self.len().max(1))?;
                // SAFETY: `ptr` is the mapped payload of `self.len()` bytes, kept alive by the
                // clone of the sample the export owns and ordered on `work`; `block` has ≥
                // that many bytes and is owned by the export until its reads are fenced.
                unsafe { copy::device_to_device(&work, block.device_ptr(), ptr, self.len()) }?;
                (block.device_ptr(), Some(block), DLPACK_FLAG_BITMASK_IS_COPIED)
            }
            Some(ptr) => (ptr, None, DLPACK_FLAG_BITMASK_READ_ONLY),
            None => {
                no_copy("the payload arrived as bytes, not in device memory")?;
                // Bytes: a private device copy, enqueued on the consumer's stream.
                let host = self.host_bytes().ok_or(ExportError::PayloadUnavailable)?;
                let block = DeviceBlock::allocate(gpu, host.len().max(1))?;
                // SAFETY: `block` is mapped with ≥ host.len() bytes and owned by the export
                // until its reads are fenced.
                unsafe { copy::host_to_device(&work, block.device_ptr(), &host) }?;
                (block.device_ptr(), Some(block), DLPACK_FLAG_BITMASK_IS_COPIED)
            }
        };
        if matches!(end, EndOn::Context) {
            // No consumer stream to order on: the data must be complete at hand-off.
            copy::wait(&work)?;
        }
        let owner = Owner::Device { sample: self.clone(), gpu: gpu.clone(), end, staged };
        let device = Device::cuda(gpu.ordinal() as i32).into();
        Ok(Parts { data: base + meta.byte_offset, device, dtype, shape, strides, flags, owner })
    }
}

/// Alignment of host copies: enough for every item size (complex128 is 16 bytes).
const HOST_COPY_ALIGN: usize = 16;

/// `bytes` copied into a new allocation, and the offset in it where they start: an
/// address aligned to [`HOST_COPY_ALIGN`] (a `Box<[u8]>` itself promises alignment 1).
fn aligned_copy(bytes: &[u8]) -> (Box<[u8]>, usize) {
    let mut v = vec![0u8; bytes.len() + HOST_COPY_ALIGN - 1].into_boxed_slice();
    let at = v.as_ptr().align_offset(HOST_COPY_ALIGN).min(HOST_COPY_ALIGN - 1);
    v[at..at + bytes.len()].copy_from_slice(bytes);
    (v, at)
}

fn tensor_of(p: &Parts) -> DLTensor {
    DLTensor {
        data: p.data as usize as *mut c_void,
        device: p.device,
        // At most 64 (`MAX_RANK`, checked by the decoder).
        ndim: p.shape.len() as i32,
        dtype: p.dtype,
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}
