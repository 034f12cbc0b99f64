//! The DLPack C ABI: export received tensors to frameworks, and publish tensors that
//! frameworks export.
//!
//! # Structs
//! [`DLDevice`], [`DLDataType`], [`DLTensor`], [`DLPackVersion`], [`DLManagedTensor`]
//! (legacy, deprecated since DLPack 0.8 but still the only one JAX imports) and
//! [`DLManagedTensorVersioned`] (v1.x), `#[repr(C)]` with their layout asserted at
//! compile time. Owned pointers to either managed struct are [`ManagedTensorVersioned`]
//! and [`ManagedTensorLegacy`]: they call the struct's deleter exactly once, on drop,
//! unless handed off with `into_raw`.
//!
//! # Export ([`GpuSample::to_dlpack_versioned`], [`GpuSample::to_dlpack_legacy`])
//! - One heap allocation per export holds the managed struct, the shape and strides
//!   arrays and the manager context; `manager_ctx` points at it and the deleter frees it.
//! - `data` is the payload's address plus the description's `byte_offset`, and the
//!   `byte_offset` field is 0: older PyTorch and cuda-python ignored the field (pytorch
//!   #168177), so the offset is folded, as IREE does.
//! - Strides are always explicit (DLPack v1.2+); `shape`/`strides` are NULL only for
//!   `ndim == 0`.
//! - The device is `kDLCUDA` with the subscriber's local ordinal for CUDA sessions
//!   (bytes samples are first copied host→device into a private block), `kDLCPU` for
//!   host-memory sessions.
//! - Flags (versioned only): `READ_ONLY` for in-place exports — the block is the
//!   publisher's and other subscribers read it too — and `IS_COPIED` (never with
//!   `READ_ONLY`) only when the export owns a private copy.
//! - DLPack's `copy` and `dl_device` requests ([`ExportOptions`], the `*_with` exports):
//!   `copy: true` always exports a private copy, `copy: false` refuses where in-place
//!   export is impossible, and a host export of a CUDA sample is a device→host copy.
//!
//! # Streams and the lease
//! The consumer names its stream as DLPack does ([`ConsumerStream::from_dlpack`]: `1` the
//! legacy default stream, `2` the per-thread default stream, `-1` no synchronisation,
//! `0` an error, anything else a `CUstream`). Before the export returns, a wait for the
//! publisher's ready signal is enqueued on that stream, so the consumer's work on it sees
//! the data; the host never waits. The manager context owns a clone of the sample, which
//! keeps its lease, and the consumer stream. The deleter (an `extern "C"` function that
//! never unwinds) records a fence on the consumer stream and hands it to the
//! subscriber's releaser: the lease goes back to the publisher only once the GPU has
//! passed every read the consumer enqueued before calling the deleter.
//!
//! With `-1` no stream is known: the export then waits on the host until the data is
//! ready, and the deleter waits for the whole context before it releases the lease. The
//! per-thread default stream belongs to the thread that exported; a deleter running on
//! another thread also falls back to a context-wide wait.
//!
//! # Import ([`GpuPublisher::put_dlpack`])
//! A framework's tensor (versioned or legacy) is validated — version major 1, known
//! flags, rank ≤ 64, non-null shape, a whitelisted dtype, the [`TensorMeta`] rules, an
//! aligned data pointer, a device this publisher can read — then the bytes its view
//! touches are copied into a loaned block (device→device on the caller's stream for
//! `kDLCUDA` on this publisher's GPU; host bytes for `kDLCPU`) and published with the
//! description. Its deleter is called once the copy has completed, never before.
//!
//! ```no_run
//! use zenoh_cuda_shm::dlpack::{ConsumerStream, DLPACK_FLAG_BITMASK_READ_ONLY};
//! use zenoh_cuda_shm::{GpuSession, ZcsConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let session = GpuSession::open(zenoh::Config::default(), ZcsConfig::default()).wait()?;
//! let subscriber = session.declare_subscriber("demo/tensor").wait()?;
//! let stream = session.gpu().expect("a CUDA session").new_stream()?;
//!
//! let sample = subscriber.recv()?;
//! // `stream` now waits for the publisher's ready signal; the host does not.
//! let managed = sample.to_dlpack_versioned(&ConsumerStream::stream(&stream))?;
//! let m = managed.get().expect("version 1.x");
//! assert_eq!(m.dl_tensor.byte_offset, 0); // folded into `data`
//! assert_ne!(m.flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
//! // Hand the pointer to a consumer; its deleter ends the read and releases the lease.
//! let raw = managed.into_raw();
//! # // SAFETY: `raw` came from `into_raw` and is deleted once.
//! # unsafe { ((*raw).deleter.unwrap())(raw) };
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::ThreadId;

use cudarc::driver::sys::CUstream;
pub use tensor_codec::DLDataType;
use tensor_codec::{DType, DecodeError, Device, DeviceType, MetaError, TensorMeta};

use crate::api::GpuPublisher;
use crate::cuda::{CudaError, DeviceBlock, Fence, Gpu, Stream, copy};
use crate::pool::{BackendKind, Fence as PoolFence};
use crate::sample::{GpuSample, ReadError};
use crate::tensor::TensorPublishError;
use crate::transport::publisher::PutReport;

/// The DLPack version this module implements (`DLPACK_MAJOR_VERSION`,
/// `DLPACK_MINOR_VERSION` of `dlpack.h` v1.3).
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 3 };
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the data is a copy the consumer owns alone until the
/// deleter runs.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: sub-byte elements are padded to a byte
/// each instead of packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;
const KNOWN_FLAGS: u64 =
    DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_COPIED | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;

/// `DLDevice {int32 device_type; int32 device_id}` (`device_type` is a `DLDeviceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct DLDevice {
    /// `DLDeviceType`: 1 = `kDLCPU`, 2 = `kDLCUDA`, … (see [`DeviceType`]).
    pub device_type: i32,
    /// Device ordinal in the process that reads the struct (0 for the CPU).
    pub device_id: i32,
}

impl From<Device> for DLDevice {
    fn from(d: Device) -> Self {
        Self { device_type: d.device_type.as_i32(), device_id: d.device_id }
    }
}

/// `DLTensor`: a plain view; the managed structs own one.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct DLTensor {
    /// Address of the data (device or host, per `device`).
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` dimensions (NULL allowed only for `ndim == 0`).
    pub shape: *mut i64,
    /// `ndim` strides in elements (NULL meant compact row-major before DLPack v1.2).
    pub strides: *mut i64,
    /// Offset of the first element from `data`, in bytes.
    pub byte_offset: u64,
}

/// `DLPackVersion {uint32 major; uint32 minor}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct DLPackVersion {
    /// Major version: consumers must refuse anything but 1.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// The legacy `DLManagedTensor {DLTensor dl_tensor; void* manager_ctx; void (*deleter)(…)}`.
#[derive(Debug)]
#[repr(C)]
pub struct DLManagedTensor {
    /// The view.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the struct (and everything it owns); called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (DLPack v1.x). Fields up to `flags` are ABI-stable across
/// versions: a consumer that finds `version.major != 1` may only call the deleter.
#[derive(Debug)]
#[repr(C)]
pub struct DLManagedTensorVersioned {
    /// The producer's DLPack version.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the struct (and everything it owns); called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The view.
    pub dl_tensor: DLTensor,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLTensor>() == 48);
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
};

// ---------------------------------------------------------------------------------------
// Owned managed tensors
// ---------------------------------------------------------------------------------------

/// An owned `DLManagedTensorVersioned*`: its deleter runs exactly once, when this drops
/// (unless handed off with [`ManagedTensorVersioned::into_raw`]).
#[derive(Debug)]
pub struct ManagedTensorVersioned {
    ptr: NonNull<DLManagedTensorVersioned>,
}

/// An owned legacy `DLManagedTensor*`: its deleter runs exactly once, when this drops
/// (unless handed off with [`ManagedTensorLegacy::into_raw`]).
#[derive(Debug)]
pub struct ManagedTensorLegacy {
    ptr: NonNull<DLManagedTensor>,
}

// SAFETY: exports of this module own only `Send` data (`Owner` is asserted `Send`
// below), and `from_raw` requires of foreign tensors that their deleter may run on any
// thread (the DLPack Python spec asks this of producers: deleters take the GIL
// themselves). The struct is only read through `&self`, and freed once, by `Drop`.
unsafe impl Send for ManagedTensorVersioned {}
// SAFETY: as for `ManagedTensorVersioned`.
unsafe impl Send for ManagedTensorLegacy {}

impl ManagedTensorVersioned {
    /// Takes ownership of a managed tensor: its deleter will be called once, when the
    /// returned value drops. `None` for a null pointer.
    ///
    /// # Safety
    /// `ptr` is null or points to a `DLManagedTensorVersioned` that nobody else will
    /// delete, valid until its deleter runs, whose deleter may be called from any thread.
    /// If `version.major == 1`, its `dl_tensor` is valid until then too: `shape` and
    /// `strides` (when not NULL) point to `ndim` integers, and `data` is memory of the
    /// named device covering every byte the view reaches.
    pub unsafe fn from_raw(ptr: *mut DLManagedTensorVersioned) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self { ptr })
    }

    /// Gives up ownership without calling the deleter: whoever receives the pointer must
    /// call it once.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The pointer, still owned by `self`.
    pub fn as_ptr(&self) -> *mut DLManagedTensorVersioned {
        self.ptr.as_ptr()
    }

    /// The producer's version (always readable).
    pub fn version(&self) -> DLPackVersion {
        // SAFETY: valid until the deleter runs (`from_raw`, or built by this module), which
        // only `Drop` calls; `version` is ABI-stable across DLPack versions.
        unsafe { self.ptr.as_ref() }.version
    }

    /// The struct, if its major version is 1 (otherwise DLPack allows reading nothing
    /// but the version and the deleter).
    pub fn get(&self) -> Option<&DLManagedTensorVersioned> {
        // SAFETY: as in `version`; the borrow is tied to `&self`, and the struct is freed
        // only by `Drop`.
        let m = unsafe { self.ptr.as_ref() };
        (m.version.major == DLPACK_VERSION.major).then_some(m)
    }
}

impl Drop for ManagedTensorVersioned {
    fn drop(&mut self) {
        // SAFETY: valid until its deleter runs, which happens only here; `deleter` is an
        // ABI-stable field in every version.
        let deleter = unsafe { self.ptr.as_ref() }.deleter;
        if let Some(deleter) = deleter {
            // SAFETY: the DLPack contract: the owner calls the deleter once, with the
            // struct's own address. Ours never unwinds; a C one cannot.
            unsafe { deleter(self.ptr.as_ptr()) };
        }
    }
}

impl ManagedTensorLegacy {
    /// Takes ownership of a legacy managed tensor: its deleter will be called once, when
    /// the returned value drops. `None` for a null pointer.
    ///
    /// # Safety
    /// As [`ManagedTensorVersioned::from_raw`] (a legacy struct has no version).
    pub unsafe fn from_raw(ptr: *mut DLManagedTensor) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self { ptr })
    }

    /// Gives up ownership without calling the deleter.
    pub fn into_raw(self) -> *mut DLManagedTensor {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The pointer, still owned by `self`.
    pub fn as_ptr(&self) -> *mut DLManagedTensor {
        self.ptr.as_ptr()
    }

    /// The struct.
    pub fn get(&self) -> &DLManagedTensor {
        // SAFETY: valid until the deleter runs, which only `Drop` calls; the borrow is
        // tied to `&self`.
        unsafe { self.ptr.as_ref() }
    }
}

impl Drop for ManagedTensorLegacy {
    fn drop(&mut self) {
        if let Some(deleter) = self.get().deleter {
            // SAFETY: the DLPack contract: the owner calls the deleter once, with the
            // struct's own address.
            unsafe { deleter(self.ptr.as_ptr()) };
        }
    }
}

// ---------------------------------------------------------------------------------------
// Consumer streams
// ---------------------------------------------------------------------------------------

/// The stream a consumer will use the exported tensor on (DLPack's `stream` argument).
#[derive(Debug, Clone)]
pub struct ConsumerStream(StreamKind);

#[derive(Debug, Clone)]
enum StreamKind {
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
        Self(StreamKind::Owned(std::sync::Arc::clone(stream)))
    }

    /// No synchronisation (DLPack `-1`): see the [module docs](self).
    pub fn no_sync() -> Self {
        Self(StreamKind::NoSync)
    }

    /// A raw `CUstream` owned by the consumer (a null handle is the legacy default
    /// stream).
    ///
    /// # Safety
    /// The stream belongs to the primary context of the exported sample's device, and
    /// stays alive until the export's deleter has returned (the deleter records a fence
    /// on it).
    pub unsafe fn from_raw(stream: CUstream) -> Self {
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
            v if v > 2 => Ok(unsafe { Self::from_raw(v as usize as CUstream) }),
            v => Err(ExportError::InvalidStream { value: v }),
        }
    }
}

/// Where the export's reads are ordered, and how its deleter ends them.
enum EndOn {
    /// A stream that outlives the deleter: fence it.
    Stream(Stream),
    /// The per-thread default stream of `thread`: fence it from that thread only.
    PerThread { stream: Stream, thread: ThreadId },
    /// No stream known: wait for the whole context.
    Context,
}

// ---------------------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------------------

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
            Some(block) => sample.defer_until(fences, Box::new(move || drop(block))),
            None => {
                for fence in fences {
                    // A sample without a lease hands the fence back: nothing to hold.
                    drop(sample.hold_lease_until(fence));
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
        match self.subscriber_gpu() {
            Some(gpu) => Device::cuda(gpu.ordinal() as i32).into(),
            None => Device::CPU.into(),
        }
    }

    /// Exports the tensor as a `DLManagedTensorVersioned` (see the [module docs](self)):
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
        let p = self.export_parts(stream, options)?;
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
        let p = self.export_parts(stream, options)?;
        let managed = DLManagedTensor {
            dl_tensor: tensor_of(&p),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        };
        let ptr = into_export(managed, p.shape, p.strides, p.owner, |m| &mut m.dl_tensor, |m, c| m.manager_ctx = c);
        Ok(ManagedTensorLegacy { ptr })
    }

    fn export_parts(&self, stream: &ConsumerStream, options: ExportOptions) -> Result<Parts, ExportError> {
        let meta = self.tensor_meta()?.ok_or(ExportError::NoMeta)?;
        let strides = meta.effective_strides().map_err(DecodeError::from)?.into_boxed_slice();
        let shape = meta.shape.clone().into_boxed_slice();
        let dtype = meta.dtype.to_dl();
        let no_copy = |why| if options.copy == Some(false) { Err(ExportError::CopyRequired { why }) } else { Ok(()) };
        if options.to_host && self.subscriber_gpu().is_some() {
            no_copy("the payload is in device memory")?;
            // The bytes the view touches, rebased to offset 0 (same explicit strides).
            let (_, data) = self.to_owned_tensor().map_err(ExportError::HostCopy)?.into_parts();
            let (copy, at) = aligned_copy(&data);
            let base = copy.as_ptr() as u64 + at as u64;
            let owner = Owner::Host { _sample: self.clone(), _copy: Some(copy) };
            let (device, flags) = (Device::CPU.into(), DLPACK_FLAG_BITMASK_IS_COPIED);
            return Ok(Parts { data: base, device, dtype, shape, strides, flags, owner });
        }
        let Some(gpu) = self.subscriber_gpu() else {
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
                (std::sync::Arc::clone(&s), EndOn::Stream(s))
            }
            StreamKind::PerThreadDefault => {
                let s = gpu.per_thread_stream();
                (std::sync::Arc::clone(&s), EndOn::PerThread { stream: s, thread: std::thread::current().id() })
            }
            StreamKind::Owned(s) => {
                let stream_ordinal = s.context().ordinal();
                if stream_ordinal != gpu.ordinal() {
                    return Err(ExportError::StreamDevice { stream_ordinal, ordinal: gpu.ordinal() });
                }
                (std::sync::Arc::clone(s), EndOn::Stream(std::sync::Arc::clone(s)))
            }
            StreamKind::Raw(p) => {
                // SAFETY: `ConsumerStream::from_raw`'s contract: a stream of this device's
                // primary context, alive until the deleter has returned (`EndOn` keeps the
                // borrowed wrapper no longer than that).
                let s = unsafe { gpu.borrow_stream(*p as CUstream) };
                (std::sync::Arc::clone(&s), EndOn::Stream(s))
            }
            StreamKind::NoSync => (gpu.new_stream()?, EndOn::Context),
        };
        let (base, staged, flags) = match self.begin_detached_read(&work)? {
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

// ---------------------------------------------------------------------------------------
// Import
// ---------------------------------------------------------------------------------------

/// A framework's tensor, either struct, owned (its deleter runs when this drops).
#[derive(Debug)]
pub enum DlpackTensor {
    /// A `DLManagedTensorVersioned`.
    Versioned(ManagedTensorVersioned),
    /// A legacy `DLManagedTensor`.
    Legacy(ManagedTensorLegacy),
}

impl From<ManagedTensorVersioned> for DlpackTensor {
    fn from(t: ManagedTensorVersioned) -> Self {
        Self::Versioned(t)
    }
}

impl From<ManagedTensorLegacy> for DlpackTensor {
    fn from(t: ManagedTensorLegacy) -> Self {
        Self::Legacy(t)
    }
}

/// A framework's tensor was refused, or publishing it failed. In every case its deleter
/// has run (or, if its copy could not be shown complete, it was leaked on purpose).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// `version.major` is not 1: nothing but the deleter may be used.
    #[error("DLPack version {major}.{minor} is not supported (major must be 1)")]
    UnsupportedVersion {
        /// The producer's major version.
        major: u32,
        /// The producer's minor version.
        minor: u32,
    },
    /// `flags` has bits DLPack 1.3 does not define.
    #[error("unknown DLPack flags {flags:#x}")]
    UnknownFlags {
        /// The flags.
        flags: u64,
    },
    /// `IS_SUBBYTE_TYPE_PADDED` on a sub-byte dtype: only packed sub-byte data travels.
    #[error("padded sub-byte data is not supported (only packed)")]
    PaddedSubByte,
    /// `ndim` is negative or above 64.
    #[error("ndim {ndim} is negative or above 64")]
    InvalidRank {
        /// The value received.
        ndim: i32,
    },
    /// `shape` (or `strides`, when given) is NULL or misaligned while `ndim > 0`.
    #[error("{field} is NULL or misaligned with ndim > 0")]
    BadArray {
        /// `"shape"` or `"strides"`.
        field: &'static str,
    },
    /// The dtype, shape, strides or `byte_offset` break the [`TensorMeta`] rules.
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// `data` is NULL for a non-empty tensor.
    #[error("data is NULL for a tensor of {bytes} bytes")]
    NullData {
        /// Bytes the view touches.
        bytes: u64,
    },
    /// `data + byte_offset` is not aligned to the item size.
    #[error("first element at {address:#x} is not aligned to the item size {itemsize}")]
    MisalignedData {
        /// `data + byte_offset`.
        address: u64,
        /// Bytes per item.
        itemsize: u64,
    },
    /// The view reaches past the address space.
    #[error("the view of {bytes} bytes at {address:#x} does not fit the address space")]
    TooLarge {
        /// `data + byte_offset`.
        address: u64,
        /// Bytes the view touches.
        bytes: u64,
    },
    /// The tensor's device is not one this publisher can copy from.
    #[error("a tensor on device type {} id {} cannot be published by a {backend} publisher{}", .device.device_type, .device.device_id, on_gpu(.ordinal))]
    Device {
        /// The tensor's device.
        device: DLDevice,
        /// Where this publisher's blocks live.
        backend: BackendKind,
        /// The stream's GPU, when one was given.
        ordinal: Option<usize>,
    },
    /// CUDA publishers need the stream the tensor is ready on.
    #[error("a CUDA publisher needs the stream the tensor is ready on")]
    StreamRequired,
    /// Publishing the copy failed.
    #[error(transparent)]
    Publish(#[from] TensorPublishError),
    /// Waiting for the copy failed; the tensor was leaked, not deleted, since the copy
    /// may still read it.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

fn on_gpu(ordinal: &Option<usize>) -> String {
    ordinal.map(|o| format!(" on GPU {o}")).unwrap_or_default()
}

/// A validated source view: its description (as the producer gave it), the address of
/// its first byte and how many bytes it touches.
struct Source {
    meta: TensorMeta,
    addr: u64,
    bytes: u64,
}

impl DlpackTensor {
    /// The view and flags, after the version check.
    fn view(&self) -> Result<(&DLTensor, u64), ImportError> {
        match self {
            Self::Versioned(t) => {
                let v = t.version();
                let m = t.get().ok_or(ImportError::UnsupportedVersion { major: v.major, minor: v.minor })?;
                Ok((&m.dl_tensor, m.flags))
            }
            Self::Legacy(t) => Ok((&t.get().dl_tensor, 0)),
        }
    }

    /// The tensor's description, validated (see the [module docs](self)); its
    /// `byte_offset` and device are the producer's.
    ///
    /// # Errors
    /// The first check that fails, as an [`ImportError`] naming the field.
    pub fn tensor_meta(&self) -> Result<TensorMeta, ImportError> {
        self.source().map(|s| s.meta)
    }

    fn source(&self) -> Result<Source, ImportError> {
        let (t, flags) = self.view()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(ImportError::UnknownFlags { flags });
        }
        let ndim = usize::try_from(t.ndim)
            .ok()
            .filter(|&n| n <= tensor_codec::MAX_RANK)
            .ok_or(ImportError::InvalidRank { ndim: t.ndim })?;
        let dtype = DType::from_dl(t.dtype)?;
        if dtype.is_sub_byte() && flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED != 0 {
            return Err(ImportError::PaddedSubByte);
        }
        let shape = read_array(t.shape, ndim, "shape")?.ok_or(ImportError::BadArray { field: "shape" })?;
        // NULL strides: compact row-major (what DLPack < 1.2 producers meant).
        let strides = read_array(t.strides, ndim, "strides")?.unwrap_or_default();
        let device = match DeviceType::from_i32(t.device.device_type) {
            Some(ty) => Device::new(ty, t.device.device_id),
            None => return Err(MetaError::UnknownDeviceType { value: t.device.device_type }.into()),
        };
        let meta = TensorMeta { dtype, shape, strides, byte_offset: t.byte_offset, device };
        // DLPack carries no allocation size: the bound is the address space.
        let extent = meta.validate(u64::MAX)?;
        let addr = (t.data as usize as u64)
            .checked_add(t.byte_offset)
            .filter(|a| a.checked_add(extent.bytes).is_some_and(|end| end <= usize::MAX as u64))
            .ok_or(ImportError::TooLarge { address: t.data as usize as u64, bytes: extent.bytes })?;
        if extent.bytes > 0 {
            if t.data.is_null() {
                return Err(ImportError::NullData { bytes: extent.bytes });
            }
            if let Some(itemsize) = dtype.itemsize()
                && addr % itemsize != 0
            {
                return Err(ImportError::MisalignedData { address: addr, itemsize });
            }
        }
        Ok(Source { meta, addr, bytes: extent.bytes })
    }
}

/// Copies `ndim` integers from a DLPack array: `Ok(None)` for NULL with `ndim > 0`, an
/// empty vector for `ndim == 0`.
fn read_array(p: *const i64, ndim: usize, field: &'static str) -> Result<Option<Vec<i64>>, ImportError> {
    if ndim == 0 {
        return Ok(Some(Vec::new()));
    }
    if p.is_null() {
        return Ok(None);
    }
    if !p.is_aligned() {
        return Err(ImportError::BadArray { field });
    }
    // SAFETY: `DlpackTensor`'s owners were built with `from_raw`, whose contract says a
    // non-NULL `shape`/`strides` points to `ndim` integers valid until the deleter runs,
    // which cannot happen while `self` is borrowed; non-null and aligned checked above.
    Ok(Some(unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec()))
}

impl GpuPublisher {
    /// Publishes a framework's tensor: validates it (see the [module docs](self)),
    /// copies the bytes its view touches into a block and publishes them with its
    /// description (offset 0, same shape, strides and dtype, this publisher's device),
    /// then calls its deleter once the copy has completed.
    ///
    /// `kDLCUDA` tensors must be on this publisher's GPU: the copy is device→device on
    /// `stream`, which must be ordered after the producer's writes (e.g. the stream given
    /// to its `__dlpack__`); this waits for the copy on the host before calling the
    /// deleter. `kDLCPU` tensors are copied from host memory before this returns.
    /// CUDA publishers need `stream` in both cases; host-memory publishers take `None`.
    ///
    /// # Errors
    /// An [`ImportError`] naming what was refused; the tensor's deleter has run then,
    /// except for [`ImportError::Cuda`] (see there).
    pub fn put_dlpack(
        &self,
        tensor: impl Into<DlpackTensor>,
        stream: Option<&Stream>,
    ) -> Result<PutReport, ImportError> {
        let tensor = tensor.into();
        let src = tensor.source()?;
        let backend = self.backend();
        let ordinal = stream.map(|s| s.context().ordinal());
        let refused = || ImportError::Device { device: src.meta.device.into(), backend, ordinal };
        let out_device = match (backend, ordinal) {
            (BackendKind::HostMemfd, _) => Device::CPU,
            (BackendKind::CudaVmm, Some(o)) => Device::cuda(o as i32),
            (BackendKind::CudaVmm, None) => return Err(ImportError::StreamRequired),
        };
        let out = TensorMeta { byte_offset: 0, device: out_device, ..src.meta.clone() };
        let bytes =
            usize::try_from(src.bytes).map_err(|_| ImportError::TooLarge { address: src.addr, bytes: src.bytes })?;
        match src.meta.device.device_type {
            DeviceType::Cpu => {
                let data: &[u8] = if bytes == 0 {
                    &[]
                } else {
                    // SAFETY: `from_raw`'s contract: `data` is host memory covering the view,
                    // valid until the deleter runs (after this borrow ends); `src` was
                    // validated: non-null, in the address space, `bytes` from the first byte.
                    unsafe { std::slice::from_raw_parts(src.addr as usize as *const u8, bytes) }
                };
                // Every path of `put_bytes_meta` has copied `data` when it returns.
                let r = self.put_tensor_from_host(data, &out);
                drop(tensor);
                Ok(r?)
            }
            DeviceType::Cuda => {
                let (Some(stream), Some(o)) = (stream, ordinal) else { return Err(refused()) };
                if backend != BackendKind::CudaVmm || i64::from(src.meta.device.device_id) != o as i64 {
                    return Err(refused());
                }
                // SAFETY: `from_raw`'s contract: `data` is device memory of this GPU (checked
                // above) covering the view until the deleter runs, which happens only after
                // the copy has completed (waited for below); the caller orders `stream`
                // after the producer's writes.
                let r = unsafe { self.put_tensor_from_device(src.addr, &out, bytes, stream) };
                if let Err(e) = copy::wait(stream) {
                    // The copy may still be reading the tensor: leak it rather than delete
                    // memory a running copy reads.
                    tracing::error!(error = %crate::error::Chain(&e), "cannot wait for a DLPack import's copy; leaking the tensor");
                    match tensor {
                        DlpackTensor::Versioned(t) => drop(t.into_raw()),
                        DlpackTensor::Legacy(t) => drop(t.into_raw()),
                    }
                    return Err(e.into());
                }
                drop(tensor);
                Ok(r?)
            }
            _ => Err(refused()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    static DELETED: AtomicU32 = AtomicU32::new(0);

    /// A foreign producer: a heap struct over `data`, whose deleter counts its calls.
    struct Foreign {
        managed: DLManagedTensorVersioned,
        shape: Vec<i64>,
        strides: Vec<i64>,
    }

    unsafe extern "C" fn foreign_deleter(p: *mut DLManagedTensorVersioned) {
        DELETED.fetch_add(1, Ordering::SeqCst);
        // SAFETY: `p` is the first field of a leaked `Foreign` (repr(Rust) but `managed`
        // is recovered through `manager_ctx`, which holds the box pointer).
        let ctx = unsafe { (*p).manager_ctx };
        // SAFETY: `manager_ctx` is `Box::into_raw` of the `Foreign`, deleted once.
        drop(unsafe { Box::from_raw(ctx.cast::<Foreign>()) });
    }

    fn foreign(data: *mut c_void, dtype: DType, shape: &[i64], strides: Option<&[i64]>, major: u32) -> DlpackTensor {
        let mut f = Box::new(Foreign {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(foreign_deleter),
                flags: 0,
                dl_tensor: DLTensor {
                    data,
                    device: Device::CPU.into(),
                    ndim: shape.len() as i32,
                    dtype: dtype.to_dl(),
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
            },
            shape: shape.to_vec(),
            strides: strides.map(<[i64]>::to_vec).unwrap_or_default(),
        });
        f.managed.dl_tensor.shape = f.shape.as_mut_ptr();
        if strides.is_some() {
            f.managed.dl_tensor.strides = f.strides.as_mut_ptr();
        }
        let raw = Box::into_raw(f);
        // SAFETY: `raw` is a live, uniquely owned box.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        // SAFETY: `raw` points to its first field's struct, valid until the deleter, which
        // only the returned owner calls.
        let p = unsafe { std::ptr::addr_of_mut!((*raw).managed) };
        // SAFETY: as above: a valid struct whose deleter frees it, callable from any thread.
        DlpackTensor::Versioned(unsafe { ManagedTensorVersioned::from_raw(p) }.unwrap())
    }

    #[test]
    fn import_validation_names_the_field_and_deletes_once() {
        let mut buf = [0u64; 8];
        let data = buf.as_mut_ptr().cast::<c_void>();
        let before = DELETED.load(Ordering::SeqCst);
        let t = foreign(data, DType::F32, &[2, 3], None, 1);
        let meta = t.tensor_meta().unwrap();
        assert_eq!((meta.shape.as_slice(), meta.strides.as_slice()), (&[2i64, 3][..], &[][..]));
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), before + 1);

        let t = foreign(data, DType::F32, &[2, 3], None, 2);
        assert!(matches!(t.tensor_meta(), Err(ImportError::UnsupportedVersion { major: 2, minor: 0 })));
        drop(t);
        let t = foreign(data, DType::F32, &[2, -3], None, 1);
        assert!(matches!(t.tensor_meta(), Err(ImportError::Meta(MetaError::InvalidShape { dim: 1, value: -3 }))));
        drop(t);
        let t = foreign(data, DType::F32, &[2, 3], Some(&[1, -1]), 1);
        assert!(matches!(t.tensor_meta(), Err(ImportError::Meta(MetaError::NegativeStride { dim: 1, value: -1 }))));
        drop(t);
        let t = foreign(std::ptr::null_mut(), DType::F32, &[2], None, 1);
        assert!(matches!(t.tensor_meta(), Err(ImportError::NullData { bytes: 8 })));
        drop(t);
        // A zero-size tensor may have NULL data.
        let t = foreign(std::ptr::null_mut(), DType::F32, &[0, 4], None, 1);
        assert_eq!(t.tensor_meta().unwrap().numel().unwrap(), 0);
        drop(t);
        // SAFETY: one byte into a live buffer: a misaligned but valid address.
        let odd = unsafe { data.cast::<u8>().add(2) }.cast::<c_void>();
        let t = foreign(odd, DType::F32, &[1], None, 1);
        assert!(matches!(t.tensor_meta(), Err(ImportError::MisalignedData { itemsize: 4, .. })));
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), before + 7);
    }

    #[test]
    fn consumer_stream_values() {
        // SAFETY: only non-pointer values.
        unsafe {
            assert!(matches!(ConsumerStream::from_dlpack(0), Err(ExportError::InvalidStream { value: 0 })));
        }
        // SAFETY: as above.
        let s = unsafe { ConsumerStream::from_dlpack(-2) };
        assert!(matches!(s, Err(ExportError::InvalidStream { value: -2 })));
        // SAFETY: as above.
        let s = unsafe { ConsumerStream::from_dlpack(-1) }.unwrap();
        assert!(matches!(s.0, StreamKind::NoSync));
        // SAFETY: as above.
        let s = unsafe { ConsumerStream::from_dlpack(1) }.unwrap();
        assert!(matches!(s.0, StreamKind::LegacyDefault));
        // SAFETY: as above.
        let s = unsafe { ConsumerStream::from_dlpack(2) }.unwrap();
        assert!(matches!(s.0, StreamKind::PerThreadDefault));
    }
}
