//! The GPU a process works on: probing, identity (UUID) and its primary context.

// Re-exported by `zenoh-cuda-shm`: errors and panics documented as there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, sys};

use super::Stream;
use super::sys::{CudaError, wrap};

/// A GPU's 16-byte UUID, as `cuDeviceGetUuid` reports it.
///
/// Unlike the ordinal it does not change with `CUDA_VISIBLE_DEVICES`, so two processes
/// compare UUIDs to know they share a device. Displays as nvidia-smi does
/// (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct GpuUuid(pub [u8; 16]);

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(f, "GPU-")?;
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                write!(f, "-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why no usable GPU was found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// `libcuda.so` could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver library (libcuda.so) on this machine")]
    NoDriver,
    /// The driver is there but a call failed (e.g. `cuInit` with no device node).
    #[error("CUDA driver present but unusable")]
    Driver(#[from] CudaError),
    /// The driver reports no device, or fewer than the ordinal asked for.
    #[error("no CUDA device with ordinal {ordinal} (the driver reports {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: i32,
    },
    /// The device lacks a capability the zero-copy path needs.
    #[error("GPU {ordinal} ({name}) does not support {what}")]
    Unsupported {
        /// The device ordinal.
        ordinal: usize,
        /// The device name.
        name: String,
        /// The missing capability.
        what: &'static str,
    },
}

struct GpuInner {
    ctx: Arc<CudaContext>,
    uuid: GpuUuid,
    name: String,
    granularity: usize,
    stream_mem_ops_64: bool,
    /// Events of fences that have gone, kept for the next fences: creating and destroying
    /// an event per fence cost microseconds on every message.
    spare_events: Mutex<Vec<CudaEvent>>,
}

/// How many spare events a GPU keeps at most (the fences of a few hundred messages in
/// flight; more are destroyed).
const SPARE_EVENTS: usize = 256;

/// One CUDA device with its primary context, checked to support what the zero-copy
/// path needs: virtual memory management, POSIX-FD export of allocations.
///
/// Cheap to clone. Every CUDA owner in this crate keeps the context alive through it.
///
/// ```no_run
/// use zcs_memory::cuda::{Gpu, ProbeError};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let gpu = match Gpu::probe() {
///     Ok(gpu) => gpu,
///     Err(ProbeError::NoDriver) => return Ok(()), // no NVIDIA driver: use host memory
///     Err(e) => return Err(e.into()),
/// };
/// println!("{} ({}), {} bytes granularity", gpu.name(), gpu.uuid(), gpu.granularity());
/// let stream = gpu.new_stream()?;
/// let (free, total) = gpu.mem_info()?;
/// println!("{free} of {total} bytes free");
/// stream.synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal())
            .field("name", &self.inner.name)
            .field("uuid", &self.inner.uuid)
            .finish()
    }
}

impl Gpu {
    /// Opens device 0. See [`Gpu::open`].
    ///
    /// # Errors
    /// As [`Gpu::open`].
    pub fn probe() -> Result<Self, ProbeError> {
        Self::open(0)
    }

    /// Opens device `ordinal`, retaining its primary context, and checks that it
    /// supports VMM and POSIX-FD handles. Never panics, also when no driver is
    /// installed: that is [`ProbeError::NoDriver`].
    ///
    /// # Errors
    /// [`ProbeError::NoDriver`] without `libcuda.so`; [`ProbeError::Driver`] when a
    /// driver call fails (`cuInit` without a device node, say); [`ProbeError::NoDevice`]
    /// when the driver reports no device `ordinal`; [`ProbeError::Unsupported`] when the
    /// device lacks VMM or POSIX-FD export of allocations.
    pub fn open(ordinal: usize) -> Result<Self, ProbeError> {
        // SAFETY: `is_culib_present` only tries to dlopen the library; it is the
        // non-panicking probe cudarc provides for exactly this purpose.
        if !unsafe { sys::is_culib_present() } {
            return Err(ProbeError::NoDriver);
        }
        // The library is present, so cudarc's lazy loader will not panic from here on.
        cudarc::driver::result::init().map_err(wrap("cuInit"))?;
        let count = CudaContext::device_count().map_err(wrap("cuDeviceGetCount"))?;
        if count <= 0 || ordinal >= count as usize {
            return Err(ProbeError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(wrap("cuDevicePrimaryCtxRetain"))?;
        let name = ctx.name().map_err(wrap("cuDeviceGetName"))?;
        let attr = |a: sys::CUdevice_attribute, call| ctx.attribute(a).map_err(wrap(call));
        let unsupported = |what| ProbeError::Unsupported { ordinal, name: name.clone(), what };
        if attr(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            "cuDeviceGetAttribute",
        )? == 0
        {
            return Err(unsupported("virtual memory management (cuMem* VMM API)"));
        }
        if attr(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            "cuDeviceGetAttribute",
        )? == 0
        {
            return Err(unsupported("POSIX file-descriptor export of allocations"));
        }
        let stream_mem_ops_64 =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, "cuDeviceGetAttribute")?
                != 0;
        let uuid = GpuUuid(ctx.uuid().map_err(wrap("cuDeviceGetUuid"))?.bytes.map(|c| c as u8));
        ctx.bind_to_thread().map_err(wrap("cuCtxSetCurrent"))?;
        // SAFETY: the driver is initialised and the device's primary context was just
        // made current on this thread.
        let granularity = unsafe { super::sys::granularity(ordinal as i32) }?;
        tracing::debug!(ordinal, %uuid, %name, granularity, stream_mem_ops_64, "GPU opened");
        let spare_events = Mutex::new(Vec::new());
        Ok(Self { inner: Arc::new(GpuInner { ctx, uuid, name, granularity, stream_mem_ops_64, spare_events }) })
    }

    /// The primary context, for this crate's streams and events.
    pub(crate) fn cudarc_context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The device ordinal in this process (depends on `CUDA_VISIBLE_DEVICES`).
    pub fn ordinal(&self) -> usize {
        self.inner.ctx.ordinal()
    }

    /// The device UUID: the identity to compare across processes.
    pub fn uuid(&self) -> GpuUuid {
        self.inner.uuid
    }

    /// The device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// VMM allocation granularity for FD-exportable memory (2 MiB on current GPUs).
    pub fn granularity(&self) -> usize {
        self.inner.granularity
    }

    /// Whether `cuStreamWriteValue64`/`cuStreamWaitValue64` are supported, which the
    /// ready signal uses (no IPC events, no shared `/dev/shm` needed).
    pub fn supports_stream_mem_ops_64(&self) -> bool {
        self.inner.stream_mem_ops_64
    }

    /// Makes the primary context current on the calling thread.
    ///
    /// # Errors
    /// [`CudaError`] (`cuCtxSetCurrent`) when the context cannot be made current (the
    /// driver shutting down at process exit, a broken context).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.inner.ctx.bind_to_thread().map_err(wrap("cuCtxSetCurrent"))
    }

    /// [`Gpu::bind`] for a `Drop` that frees `what`: on failure, logs that it is left
    /// to the driver and returns false. At process exit (static destructors after the
    /// driver's own teardown) that is the normal outcome and logged at debug level.
    pub(crate) fn bind_for_drop(&self, what: &'static str) -> bool {
        match self.bind() {
            Ok(()) => true,
            Err(e) if e.is_driver_shutdown() => {
                tracing::debug!(what, "CUDA driver shut down (process exiting); it frees the resource");
                false
            }
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), what, "cannot bind CUDA context in drop; leaking the resource");
                false
            }
        }
    }

    /// Waits until every stream of the primary context has passed its work
    /// (`cuCtxSynchronize`).
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current (`cuCtxSetCurrent`) or when
    /// work of the context failed (an error of an earlier asynchronous call shows here).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.inner.ctx.synchronize().map_err(wrap("cuCtxSynchronize"))
    }

    /// `(free, total)` device memory in bytes (`cuMemGetInfo`).
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current (`cuCtxSetCurrent`) or
    /// `cuMemGetInfo` fails.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        self.inner.ctx.mem_get_info().map_err(wrap("cuMemGetInfo"))
    }

    /// An event without timing, to record: a spare one if there is one, else a new one.
    pub(crate) fn event(&self) -> Result<CudaEvent, CudaError> {
        if let Some(ev) = self.inner.spare_events.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(ev);
        }
        self.inner.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(wrap("cuEventCreate"))
    }

    /// Keeps an event of [`Gpu::event`] for a later one. Recording it again is safe
    /// whatever waits on it: a wait or query binds to the record made before it.
    pub(crate) fn spare_event(&self, ev: CudaEvent) {
        let mut spare = self.inner.spare_events.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_EVENTS {
            spare.push(ev);
        }
    }

    /// How many events of finished fences this GPU keeps for the next ones.
    pub fn spare_events(&self) -> usize {
        self.inner.spare_events.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A new non-blocking stream on this device (`cuStreamCreate`), destroyed when its
    /// last clone drops.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or the driver cannot create
    /// a stream (out of resources).
    pub fn new_stream(&self) -> Result<Stream, CudaError> {
        self.inner.ctx.new_stream().map(Stream::new).map_err(wrap("cuStreamCreate"))
    }

    /// The calling thread's per-thread default stream (`CU_STREAM_PER_THREAD`). The handle
    /// names the stream of whichever thread uses it: keep work on it to one thread.
    pub fn per_thread_stream(&self) -> Stream {
        Stream::new(self.inner.ctx.per_thread_stream())
    }

    /// The legacy default stream (the null stream), which synchronises with every
    /// blocking stream of the context. Work ordered on it is ordered correctly.
    pub fn legacy_default_stream(&self) -> Stream {
        Stream::new(self.inner.ctx.default_stream())
    }
}
