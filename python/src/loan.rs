//! `Loan`: a block being written in place, exported writable through DLPack.
//!
//! A framework writes the block through the tensor it imports (`torch.from_dlpack(loan)`,
//! `np.from_dlpack(loan)`, …) on the stream it named in `__dlpack__`; `put()` makes the
//! loan's stream wait for each such stream, then the ready signal follows on the loan's
//! stream: the publisher's host never waits for the writes.
//!
//! The exported tensor keeps the loan's block alive (not the publisher) until its deleter
//! runs or the loan is published. It must not be used after `put()`: the block then
//! belongs to the subscribers, and later to other loans.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use zenoh_cuda_shm::cuda::{CudaError, Fence, Gpu, Stream};
use zenoh_cuda_shm::dlpack::{
    DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPACK_VERSION, DLTensor, ManagedTensorLegacy,
    ManagedTensorVersioned,
};
use zenoh_cuda_shm::tensor_codec::{Device, TensorMeta};
use zenoh_cuda_shm::{GpuLoan, WriteError};

use crate::{ClosedError, capsule, chain, dtype, stream, zcs_err};

/// The state a `Loan` and its exports share.
pub(crate) struct LoanCell {
    loan: Mutex<Option<GpuLoan>>,
    pub(crate) meta: TensorMeta,
    /// Address of the block's first byte (device or host, per `meta.device`).
    addr: u64,
    nbytes: usize,
    gpu: Option<Gpu>,
    /// DLPack stream values the loan was exported to: its ready signal must follow the
    /// writes enqueued on them.
    streams: Mutex<Vec<i64>>,
}

impl LoanCell {
    pub(crate) fn new(mut loan: GpuLoan, meta: TensorMeta, gpu: Option<Gpu>) -> Self {
        let addr = match loan.device_ptr() {
            Some(p) => p,
            None => loan.as_mut_slice().map_or(0, |s| s.as_mut_ptr() as u64),
        };
        let nbytes = loan.len();
        Self { loan: Mutex::new(Some(loan)), meta, addr, nbytes, gpu, streams: Mutex::new(Vec::new()) }
    }

    /// The loaned length in bytes.
    pub(crate) fn nbytes(&self) -> usize {
        self.nbytes
    }

    fn is_open(&self) -> bool {
        self.loan.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Takes the loan out (to publish or release it) with the consumer streams it was
    /// exported to, which `order_after` then orders its stream after (without the GIL).
    pub(crate) fn take(&self) -> PyResult<(GpuLoan, Vec<i64>)> {
        let loan = self
            .loan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| ClosedError::new_err("the loan was already published or released"))?;
        let streams = std::mem::take(&mut *self.streams.lock().unwrap_or_else(|p| p.into_inner()));
        Ok((loan, streams))
    }

    /// Makes the loan's stream wait for the work enqueued so far on each consumer stream
    /// (`-1`: the consumer asked for no synchronisation, so the whole device is waited
    /// for on the host).
    ///
    /// When that fails, the device is waited for instead, so that the block can go back
    /// to the pool whatever happens next; the error is returned all the same.
    pub(crate) fn order_after(&self, loan: &GpuLoan, streams: &[i64]) -> Result<(), CudaError> {
        let (Some(gpu), Some(own)) = (&self.gpu, loan.stream()) else { return Ok(()) };
        let ordered = streams.iter().try_for_each(|&v| match v {
            -1 => gpu.synchronize(),
            v => Fence::order_after(gpu, own, &consumer_stream(gpu, v)),
        });
        if ordered.is_err() {
            let _ = gpu.synchronize();
        }
        ordered
    }
}

impl Drop for LoanCell {
    fn drop(&mut self) {
        // Dropped unpublished: the block goes back to the pool only after the consumers'
        // writes (the loan's own stream orders its return).
        if let Some(loan) = self.loan.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let streams = std::mem::take(self.streams.get_mut().unwrap_or_else(|p| p.into_inner()));
            if let Err(e) = self.order_after(&loan, &streams) {
                tracing::warn!(error = %e, "cannot order a released loan after its writers");
            }
        }
    }
}

/// The consumer stream a DLPack stream value names (`1` legacy default, `2` this thread's
/// per-thread default, anything above a `CUstream` of the consumer's).
fn consumer_stream(gpu: &Gpu, v: i64) -> Stream {
    match v {
        1 => gpu.legacy_default_stream(),
        2 => gpu.per_thread_stream(),
        // SAFETY: DLPack's contract: a stream value above 2 is a live `CUstream` of the
        // consumer, on this device's primary context (the loan's `__dlpack__` checked the
        // device); the loan's documentation asks that it stay alive until `put()`. The
        // wrapper borrows it and never destroys it.
        p => unsafe { Stream::from_raw(gpu, p as usize as *mut std::ffi::c_void) },
    }
}

/// A block loaned for writing in place: export it with DLPack (`torch.from_dlpack(loan)`,
/// `np.from_dlpack(loan)`, …), write it, then `Publisher.put(loan)`.
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct Loan {
    pub(crate) cell: Arc<LoanCell>,
}

#[pymethods]
impl Loan {
    /// Exports the block as a writable tensor (DLPack).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let cell = &self.cell;
        if !cell.is_open() {
            return Err(ClosedError::new_err("the loan was already published or released"));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err("a loan is exported in place only (copy=True is not served)"));
        }
        let device = DLDevice::from(cell.meta.device);
        if let Some((t, id)) = dl_device
            && (t, id) != (device.device_type, device.device_id)
        {
            return Err(PyBufferError::new_err(format!(
                "the loan lives on device ({}, {}), not ({t}, {id})",
                device.device_type, device.device_id
            )));
        }
        let s = stream::parse(stream)?;
        match &cell.gpu {
            None => stream::check_cpu(s)?,
            Some(gpu) => {
                let v = s.unwrap_or(1);
                if v == 0 || v < -1 {
                    return Err(PyValueError::new_err(format!(
                        "stream {v} is not a valid DLPack stream (0 is forbidden; -1, 1, 2 or a CUstream)"
                    )));
                }
                let guard = cell.loan.lock().unwrap_or_else(|p| p.into_inner());
                let loan = guard.as_ref().ok_or_else(|| ClosedError::new_err("the loan was already published"))?;
                if v != -1
                    && let Some(own) = loan.stream()
                {
                    // Whatever the loan's stream still has queued on the block comes first.
                    Fence::order_after(gpu, &consumer_stream(gpu, v), own).map_err(|e| zcs_err(&e))?;
                }
                drop(guard);
                let mut streams = cell.streams.lock().unwrap_or_else(|p| p.into_inner());
                if !streams.contains(&v) {
                    streams.push(v);
                }
            }
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let shape: Box<[i64]> = cell.meta.shape.clone().into();
        let strides: Box<[i64]> =
            cell.meta.effective_strides().map_err(|e| PyValueError::new_err(e.to_string()))?.into();
        let tensor = DLTensor {
            data: cell.addr as usize as *mut c_void,
            device,
            // At most 64: the description was validated.
            ndim: shape.len() as i32,
            dtype: cell.meta.dtype.to_dl(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let keep = Arc::clone(cell);
        if versioned {
            let managed = DLManagedTensorVersioned {
                version: DLPACK_VERSION,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor: tensor,
            };
            let ptr = into_export(managed, shape, strides, keep, |m| &mut m.dl_tensor, |m, c| m.manager_ctx = c);
            // SAFETY: `ptr` was just built by `into_export` and is owned by nobody else;
            // its deleter frees it once, from any thread.
            let owned = unsafe { ManagedTensorVersioned::from_raw(ptr.as_ptr()) }.expect("non-null");
            capsule::versioned(py, owned)
        } else {
            let managed =
                DLManagedTensor { dl_tensor: tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_legacy) };
            let ptr = into_export(managed, shape, strides, keep, |m| &mut m.dl_tensor, |m, c| m.manager_ctx = c);
            // SAFETY: as above.
            let owned = unsafe { ManagedTensorLegacy::from_raw(ptr.as_ptr()) }.expect("non-null");
            capsule::legacy(py, owned)
        }
    }

    /// `(device_type, device_id)`: `(2, ordinal)` for CUDA blocks, `(1, 0)` for host memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = DLDevice::from(self.cell.meta.device);
        (d.device_type, d.device_id)
    }

    /// Copies `data` into the block at byte `offset` (host→device on the loan's stream
    /// for CUDA blocks).
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &[u8], offset: usize) -> PyResult<()> {
        let mut guard = self.cell.loan.lock().unwrap_or_else(|p| p.into_inner());
        let loan = guard.as_mut().ok_or_else(|| ClosedError::new_err("the loan was already published or released"))?;
        py.detach(|| loan.write_bytes(offset, data)).map_err(|e| match e {
            WriteError::OutOfBounds { .. } => PyValueError::new_err(chain(&e)),
            e => zcs_err(&e),
        })
    }

    /// Returns the block to the pool without publishing it (after the writes enqueued on
    /// the streams it was exported to). Idempotent.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        if !self.cell.is_open() {
            return Ok(());
        }
        let (loan, streams) = self.cell.take()?;
        let cell = &self.cell;
        py.detach(move || {
            let ordered = cell.order_after(&loan, &streams);
            drop(loan);
            ordered
        })
        .map_err(|e| zcs_err(&e))
    }

    /// Whether the loan can still be written and published.
    #[getter]
    fn open(&self) -> bool {
        self.cell.is_open()
    }

    /// Dimensions.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.cell.meta.shape.clone()
    }

    /// Element type name.
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype::name(self.cell.meta.dtype)
    }

    /// Bytes loaned (the tensor's size).
    #[getter]
    fn nbytes(&self) -> usize {
        self.cell.nbytes
    }

    /// `"cuda"` or `"cpu"`.
    #[getter]
    fn device(&self) -> &'static str {
        if self.cell.meta.device == Device::CPU { "cpu" } else { "cuda" }
    }

    fn __repr__(&self) -> String {
        format!(
            "<zenoh_cuda_shm.Loan shape={:?} dtype={} device={} {}>",
            self.cell.meta.shape,
            dtype::name(self.cell.meta.dtype),
            self.device(),
            if self.cell.is_open() { "open" } else { "closed" }
        )
    }
}

/// A loan export: the managed struct first (a pointer to it is a pointer to the whole),
/// then the arrays it points into and the loan it keeps alive.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    _keep: Arc<LoanCell>,
}

const _: () = {
    const fn send<T: Send>() {}
    send::<Arc<LoanCell>>();
};

trait Managed {
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

fn into_export<M>(
    managed: M,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    keep: Arc<LoanCell>,
    tensor: impl Fn(&mut M) -> &mut DLTensor,
    set_ctx: impl Fn(&mut M, *mut c_void),
) -> NonNull<M> {
    let mut b = Box::new(Export { managed, shape, strides, _keep: keep });
    let (shape_ptr, strides_ptr) = if b.shape.is_empty() {
        (std::ptr::null_mut(), std::ptr::null_mut())
    } else {
        // Own heap allocations: they do not move with the box.
        (b.shape.as_mut_ptr(), b.strides.as_mut_ptr())
    };
    let t = tensor(&mut b.managed);
    t.shape = shape_ptr;
    t.strides = strides_ptr;
    let this: *mut Export<M> = &mut *b;
    set_ctx(&mut b.managed, this.cast());
    // `Export` is `repr(C)` with `managed` first: the box's address is the struct's.
    NonNull::from(Box::leak(b)).cast::<M>()
}

/// Frees an export made by [`into_export`].
///
/// # Safety
/// `p` is null or a pointer returned by [`into_export`] whose deleter has not run.
unsafe fn free_export<M: Managed>(p: *mut M) {
    if p.is_null() {
        return;
    }
    // SAFETY: per the contract, `p` points to a live `M`, the first field of an `Export`.
    if unsafe { &*p }.ctx() != p.cast::<c_void>() {
        // Not a struct this module handed out: leak rather than free foreign memory.
        return;
    }
    // SAFETY: `p` came from `Box::leak` of an `Export<M>` (same address, `repr(C)` with
    // `managed` first) and the deleter runs once per the contract. Dropping it drops an
    // `Arc<LoanCell>`: pure Rust, no Python object, callable on any thread.
    drop(unsafe { Box::from_raw(p.cast::<Export<M>>()) });
}

/// Deleter of versioned loan exports. Never unwinds.
unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    // SAFETY: DLPack's deleter contract: `p` is the struct handed out, deleted once.
    drop(catch_unwind(AssertUnwindSafe(|| unsafe { free_export(p) })));
}

/// Deleter of legacy loan exports. Never unwinds.
unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    // SAFETY: as for `delete_versioned`.
    drop(catch_unwind(AssertUnwindSafe(|| unsafe { free_export(p) })));
}
