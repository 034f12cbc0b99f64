//! `Publisher`: bytes, any object with `__dlpack__`, and loans.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zenoh_cuda_shm::cuda::{CudaError, Gpu, Stream};
use zenoh_cuda_shm::dlpack::{DlpackTensor, ImportError};
use zenoh_cuda_shm::tensor_codec::{Device, DeviceType, TensorMeta};
use zenoh_cuda_shm::{GpuPublisher, PublishError, TensorPublishError};

use crate::capsule::{self, Taken};
use crate::closable::{Closable, Handle};
use crate::loan::{Loan, LoanCell};
use crate::{LoanError, chain, dtype, zcs_err};

pub(crate) struct PubState {
    publisher: Handle<GpuPublisher>,
    gpu: Option<Gpu>,
    /// The stream frameworks make their tensors ready on, and the copies into blocks run
    /// on (CUDA sessions).
    stream: Option<Stream>,
    key: String,
}

impl PubState {
    pub(crate) fn new(publisher: GpuPublisher, gpu: Option<Gpu>, key: String) -> Result<Self, CudaError> {
        let stream = gpu.as_ref().map(Gpu::new_stream).transpose()?;
        Ok(Self { publisher: Handle::new(publisher, format!("publisher on {key:?}")), gpu, stream, key })
    }

    fn get(&self) -> PyResult<Arc<GpuPublisher>> {
        self.publisher.get()
    }
}

impl Closable for PubState {
    fn close(&self) {
        self.publisher.close();
    }
}

fn publish_err(e: &PublishError) -> PyErr {
    match e {
        PublishError::Loan(_) => LoanError::new_err(chain(e)),
        e => zcs_err(e),
    }
}

fn tensor_publish_err(e: &TensorPublishError) -> PyErr {
    match e {
        TensorPublishError::Invalid { .. } | TensorPublishError::DeviceMismatch { .. } => {
            PyValueError::new_err(chain(e))
        }
        TensorPublishError::Loan(_) => LoanError::new_err(chain(e)),
        e => zcs_err(e),
    }
}

fn import_err(e: &ImportError) -> PyErr {
    match e {
        ImportError::Publish(p) => tensor_publish_err(p),
        ImportError::Cuda(_) => zcs_err(e),
        // Everything else names what about the tensor was refused.
        e => PyValueError::new_err(chain(e)),
    }
}

/// Publishes on one key: zero-copy to GPU-ready subscribers of this host (on its GPU, or
/// on another with peer access), bytes to everyone else.
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct Publisher {
    pub(crate) state: Arc<PubState>,
}

#[pymethods]
impl Publisher {
    /// Publishes bytes (inline below the inline threshold, else through a block).
    /// Returns the sequence number.
    fn put_bytes(&self, py: Python<'_>, data: &[u8]) -> PyResult<u64> {
        let p = self.state.get()?;
        py.detach(|| p.put_bytes(data)).map(|r| r.seq).map_err(|e| publish_err(&e))
    }

    /// Publishes any object with `__dlpack__` (a copy into a block, on this publisher's
    /// stream for CUDA tensors: the producer makes its data ready there). Returns the
    /// sequence number.
    fn put_tensor(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<u64> {
        let p = self.state.get()?;
        if !obj.hasattr("__dlpack__")? {
            return Err(PyTypeError::new_err(format!(
                "expected an object with __dlpack__, got {}",
                obj.get_type().name()?
            )));
        }
        let device: (i32, i32) = if obj.hasattr("__dlpack_device__")? {
            obj.call_method0("__dlpack_device__")?.extract()?
        } else {
            (DeviceType::Cpu.as_i32(), 0)
        };
        let cuda = device.0 == DeviceType::Cuda.as_i32();
        if device.0 != DeviceType::Cpu.as_i32() && !cuda {
            return Err(PyValueError::new_err(format!(
                "tensors on DLPack device type {} cannot be published (kDLCPU or kDLCUDA only)",
                device.0
            )));
        }
        if cuda && self.state.gpu.is_none() {
            return Err(PyValueError::new_err(
                "a CUDA tensor cannot be published by a host-memory session (no usable GPU)",
            ));
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1u32, 3u32))?;
        if let (true, Some(s)) = (cuda, &self.state.stream) {
            kwargs.set_item("stream", s.as_raw() as usize)?;
        }
        let cap = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            // A producer older than DLPack 1.0 takes no `max_version`.
            Err(e) if e.is_instance_of::<PyTypeError>(py) => {
                kwargs.del_item("max_version")?;
                obj.call_method("__dlpack__", (), Some(&kwargs))?
            }
            Err(e) => return Err(e),
        };
        let tensor = match capsule::take(&cap)? {
            Taken::Versioned(t) => DlpackTensor::Versioned(t),
            Taken::Legacy(t) => DlpackTensor::Legacy(t),
        };
        let stream = self.state.stream.clone();
        py.detach(move || p.put_dlpack(tensor, stream.as_ref())).map(|r| r.seq).map_err(|e| import_err(&e))
    }

    /// Loans a block for a contiguous tensor of `shape` and `dtype` (a name such as
    /// `"float32"`), to be written in place and published with `put_loan`.
    fn loan(&self, py: Python<'_>, shape: Vec<i64>, dtype: &str) -> PyResult<Loan> {
        let p = self.state.get()?;
        let device = self.state.gpu.as_ref().map_or(Device::CPU, |g| Device::cuda(g.ordinal() as i32));
        let meta = TensorMeta::contiguous(dtype::parse(dtype)?, shape, device);
        let extent = meta.validate(u64::MAX).map_err(|e| PyValueError::new_err(format!("invalid tensor: {e}")))?;
        if extent.bytes == 0 {
            return Err(PyValueError::new_err("a loan needs at least one byte; publish empty tensors with put()"));
        }
        let nbytes = usize::try_from(extent.bytes).map_err(|_| PyValueError::new_err("the tensor is too large"))?;
        let loan = py.detach(|| p.loan(nbytes)).map_err(|e| LoanError::new_err(chain(&e)))?;
        Ok(Loan { cell: Arc::new(LoanCell::new(loan, meta, self.state.gpu.clone())) })
    }

    /// Publishes a loan with its tensor description, its ready signal after the writes
    /// enqueued on the streams it was exported to. Returns the sequence number.
    fn put_loan(&self, py: Python<'_>, loan: &Loan) -> PyResult<u64> {
        let p = self.state.get()?;
        let (gpu_loan, streams) = loan.cell.take()?;
        let cell = &loan.cell;
        // Ordering after the writers and the put itself run without the GIL.
        py.detach(move || match cell.order_after(&gpu_loan, &streams) {
            Ok(()) => p.put_tensor(gpu_loan, &cell.meta).map(|r| r.seq).map_err(|e| tensor_publish_err(&e)),
            Err(e) => Err(zcs_err(&e)),
        })
    }

    /// Undeclares the publisher. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.state.close());
    }

    /// Whether the publisher (or its session) is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.state.get().is_err()
    }

    /// The key.
    #[getter]
    fn key(&self) -> &str {
        &self.state.key
    }

    /// Where this publisher's blocks live: `"cuda-vmm"` or `"host-memfd"`.
    #[getter]
    fn backend(&self) -> PyResult<String> {
        Ok(self.state.get()?.backend().to_string())
    }

    /// Subscriber connections on the zero-copy path.
    #[getter]
    fn zero_copy_subscribers(&self) -> PyResult<usize> {
        Ok(self.state.get()?.zero_copy_subscribers())
    }

    /// GPU-aware subscribers known from their liveliness tokens (ready or not).
    #[getter]
    fn aware_subscribers(&self) -> PyResult<usize> {
        Ok(self.state.get()?.aware_subscribers())
    }

    /// Whether someone listens on the plain key (and so costs a copy per message).
    #[getter]
    fn plain_subscribers(&self) -> PyResult<bool> {
        Ok(self.state.get()?.plain_subscribers())
    }

    /// The publisher's counters as JSON.
    fn _stats_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.state.get()?.stats()).map_err(|e| zcs_err(&e))
    }

    fn __repr__(&self) -> String {
        format!("<zenoh_cuda_shm.Publisher key={:?}{}>", self.state.key, if self.closed() { " closed" } else { "" })
    }
}
