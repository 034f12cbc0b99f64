//! Events: fences that tell when a stream has passed a point, and interprocess events
//! (the fallback ready signal where 64-bit stream memory operations are missing).

// Re-exported by `zenoh-cuda-shm`: errors and panics documented as there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use std::sync::Arc;

use cudarc::driver::{CudaEvent, sys};

use super::sys::{self as cu, CudaError, wrap};
use super::{Gpu, Stream};

/// A point in a stream's work: complete once the GPU has passed it.
///
/// Recorded when a reader or writer finishes with a block; the recycler returns the
/// block (or releases the lease) only once every fence on it is complete.
#[derive(Debug)]
pub struct Fence {
    /// Always `Some` until dropped, when the event goes back to the GPU's spares.
    ev: Option<CudaEvent>,
    gpu: Gpu,
}

impl Fence {
    /// Records a new fence at the current end of `stream`.
    ///
    /// # Errors
    /// [`CudaError`] when no event can be created (`cuEventCreate`) or recorded on
    /// `stream` (`cuEventRecord`).
    pub fn record(gpu: &Gpu, stream: &Stream) -> Result<Self, CudaError> {
        let ev = gpu.event()?;
        ev.record(stream.cudarc()).map_err(wrap("cuEventRecord"))?;
        Ok(Self { ev: Some(ev), gpu: gpu.clone() })
    }

    /// Makes the work enqueued on `waiter` from now on wait for the work enqueued on
    /// `after` so far, without a host wait (a fence on `after`, waited for on `waiter`).
    ///
    /// # Errors
    /// As [`Fence::record`] and [`Fence::order`].
    pub fn order_after(gpu: &Gpu, waiter: &Stream, after: &Stream) -> Result<(), CudaError> {
        Self::record(gpu, after)?.order(waiter)
    }

    fn ev(&self) -> &CudaEvent {
        self.ev.as_ref().expect("present until dropped")
    }

    /// Whether the GPU has passed the fence (`cuEventQuery`; does not block).
    ///
    /// # Errors
    /// [`CudaError`] (`cuEventQuery`) when the work before the fence failed, or the
    /// context is broken.
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        self.ev().try_is_complete().map_err(wrap("cuEventQuery"))
    }

    /// Blocks the calling thread until the GPU has passed the fence.
    ///
    /// # Errors
    /// [`CudaError`] (`cuEventSynchronize`) when the work before the fence failed, or
    /// the context is broken.
    pub fn wait(&self) -> Result<(), CudaError> {
        self.ev().synchronize().map_err(wrap("cuEventSynchronize"))
    }

    /// Makes work enqueued on `stream` after this call wait until the GPU has passed the
    /// fence (`cuStreamWaitEvent`: the host does not wait).
    ///
    /// # Errors
    /// [`CudaError`] (`cuStreamWaitEvent`) when the driver refuses the wait (a stream
    /// of another context, a broken context).
    pub fn order(&self, stream: &Stream) -> Result<(), CudaError> {
        stream.cudarc().wait(self.ev()).map_err(wrap("cuStreamWaitEvent"))
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        if let Some(ev) = self.ev.take() {
            self.gpu.spare_event(ev);
        }
    }
}

/// The destination of a copy under way on a stream, given back once the GPU has passed
/// the copy's fence. Dropped before that, it waits for the fence first, so the memory
/// is never reused under the copy; if that wait fails (a broken context) the
/// destination is leaked rather than freed.
#[derive(Debug)]
pub struct Filling<T> {
    dest: Option<T>,
    done: Arc<Fence>,
}

impl<T> Filling<T> {
    /// `dest`, which a copy enqueued before `done` was recorded writes into.
    pub fn new(dest: T, done: Arc<Fence>) -> Self {
        Self { dest: Some(dest), done }
    }

    /// Waits for the copy and gives the destination back.
    ///
    /// # Errors
    /// As [`Fence::wait`]; the destination is then dropped after its fence is waited
    /// for again (or leaked if that fails too), never handed out under the copy.
    ///
    /// # Panics
    /// Never: the destination is present until this call (which takes `self`) or the
    /// drop.
    pub fn wait(mut self) -> Result<T, CudaError> {
        self.done.wait()?;
        Ok(self.dest.take().expect("present until waited for or dropped"))
    }
}

impl<T> Drop for Filling<T> {
    fn drop(&mut self) {
        if let Some(dest) = self.dest.take()
            && let Err(e) = self.done.wait()
        {
            tracing::warn!(error = %crate::error::Chain(&e), "a copy's fence failed: its destination is leaked");
            std::mem::forget(dest);
        }
    }
}

/// An interprocess CUDA event: exported as a 64-byte handle by its creator, opened by
/// peers. Needs a `/dev/shm` shared between the processes (the driver uses it), which
/// is why the ready signal prefers stream memory operations.
#[derive(Debug)]
pub struct IpcEvent {
    ev: sys::CUevent,
    gpu: Gpu,
}

// SAFETY: a CUevent is a driver handle valid in every thread once its context is made
// current; every method binds the context first, and the driver serialises access.
unsafe impl Send for IpcEvent {}
// SAFETY: as for Send; `&self` methods only record/query/wait, which the driver allows
// concurrently.
unsafe impl Sync for IpcEvent {}

impl IpcEvent {
    /// Creates an exportable event (`INTERPROCESS | DISABLE_TIMING`).
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or `cuEventCreate` fails.
    pub fn create(gpu: &Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        let flags =
            sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32 | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the context is current; the event is destroyed by `Drop`.
        let ev = unsafe { cu::event_create(flags) }?;
        Ok(Self { ev, gpu: gpu.clone() })
    }

    /// Opens a peer's event from its handle.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or
    /// `cuIpcOpenEventHandle` refuses the handle (not an event of this device, its
    /// creator gone, no shared `/dev/shm`).
    pub fn open(gpu: &Gpu, handle: &[u8; 64]) -> Result<Self, CudaError> {
        gpu.bind()?;
        // SAFETY: the context is current; the opened event is destroyed by `Drop`.
        let ev = unsafe { cu::ipc_open_event_handle(handle) }?;
        Ok(Self { ev, gpu: gpu.clone() })
    }

    /// The 64-byte handle a peer opens with [`IpcEvent::open`].
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or
    /// `cuIpcGetEventHandle` fails.
    pub fn handle(&self) -> Result<[u8; 64], CudaError> {
        self.gpu.bind()?;
        // SAFETY: `ev` is live and was created with the interprocess flag (`create`),
        // or opened from such a handle.
        unsafe { cu::ipc_get_event_handle(self.ev) }
    }

    /// Records the event at the current end of `stream`.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or `cuEventRecord`
    /// fails.
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        self.gpu.bind()?;
        // SAFETY: `ev` is live; `stream` belongs to the same device context.
        unsafe { cu::event_record(self.ev, stream.cu_stream()) }
    }

    /// Makes later work on `stream` wait for the last record of this event.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or `cuStreamWaitEvent`
    /// fails.
    pub fn wait_on(&self, stream: &Stream) -> Result<(), CudaError> {
        self.gpu.bind()?;
        // SAFETY: `ev` is live; `stream` belongs to the same device context.
        unsafe { cu::stream_wait_event(stream.cu_stream(), self.ev) }
    }

    /// Whether the last record has completed.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or `cuEventQuery`
    /// reports a failure.
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        self.gpu.bind()?;
        // SAFETY: `ev` is live.
        unsafe { cu::event_query(self.ev) }
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        if !self.gpu.bind_for_drop("IPC event") {
            return;
        }
        // SAFETY: `ev` is owned by `self` and destroyed once, here.
        if let Err(e) = unsafe { cu::event_destroy(self.ev) } {
            tracing::warn!(error = %crate::error::Chain(&e), "cuEventDestroy failed in drop");
        }
    }
}

/// Enqueues `*addr = value` on `stream` (`cuStreamWriteValue64`): the ready signal.
///
/// `addr` must be an 8-byte aligned address inside a live read-write mapping of this
/// device; the pool (crate `zcs-pool`) only passes slots of a mapped signal block.
///
/// # Errors
/// [`CudaError`] when the context cannot be made current or
/// `cuStreamWriteValue64` fails (a device without 64-bit stream memory operations,
/// an address outside a mapping).
pub fn write_value64(gpu: &Gpu, stream: &Stream, addr: u64, value: u64) -> Result<(), CudaError> {
    gpu.bind()?;
    // SAFETY: the caller passes a slot inside a mapped signal block (see above) and a
    // stream of this device's context; null is the legacy default stream, which is valid.
    unsafe { cu::stream_write_value64(stream.cu_stream(), addr, value) }
}

/// Makes later work on `stream` wait until `*addr >= value` (`cuStreamWaitValue64`).
///
/// # Errors
/// [`CudaError`] when the context cannot be made current or
/// `cuStreamWaitValue64` fails (as for [`write_value64`]).
pub fn wait_value64(gpu: &Gpu, stream: &Stream, addr: u64, value: u64) -> Result<(), CudaError> {
    gpu.bind()?;
    // SAFETY: as for `write_value64`.
    unsafe { cu::stream_wait_value64_geq(stream.cu_stream(), addr, value) }
}
