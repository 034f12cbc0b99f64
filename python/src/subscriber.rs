//! `Subscriber` and `Sample`.

use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use zenoh_cuda_shm::dlpack::{ConsumerStream, ExportError, ExportOptions};
use zenoh_cuda_shm::tensor_codec::{DeviceType, TensorMeta};
use zenoh_cuda_shm::{GpuSample, GpuSubscriber};

use crate::closable::{Closable, Handle};
use crate::{capsule, chain, dtype, stream, wait, zcs_err};

type Fifo = GpuSubscriber<flume::Receiver<GpuSample>>;

pub(crate) struct SubState {
    sub: Handle<Fifo>,
    key: String,
}

impl SubState {
    pub(crate) fn new(sub: Fifo, key: String) -> Self {
        Self { sub: Handle::new(sub, format!("subscriber on {key:?}")), key }
    }

    fn get(&self) -> PyResult<Arc<Fifo>> {
        self.sub.get()
    }
}

impl Closable for SubState {
    fn close(&self) {
        self.sub.close();
    }
}

/// Receives from a key expression through a FIFO queue.
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct Subscriber {
    pub(crate) state: Arc<SubState>,
}

#[pymethods]
impl Subscriber {
    /// Waits for the next sample, up to `timeout` seconds (`None`: forever). Raises
    /// `TimeoutError` when none came, `ClosedError` once the subscriber is closed.
    /// The GIL is released while waiting; Ctrl-C interrupts the wait.
    #[pyo3(signature = (timeout = None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Sample> {
        let key = &self.state.key;
        let (what, closed) = (format!("sample on {key:?}"), format!("subscriber on {key:?}"));
        let state = &self.state;
        wait::recv_within(py, timeout, &what, &closed, |wait| Ok(state.get()?.recv_timeout(wait).map(Sample::new)))
    }

    /// The next sample if one is queued, else `None`.
    fn try_recv(&self) -> PyResult<Option<Sample>> {
        Ok(self.state.get()?.try_recv().map(Sample::new))
    }

    /// Undeclares the subscriber. Samples already received stay readable. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.state.close());
    }

    /// Whether the subscriber (or its session) is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.state.get().is_err()
    }

    /// The key expression.
    #[getter]
    fn key(&self) -> &str {
        &self.state.key
    }

    /// Publishers of ours this subscriber knows: `(instance id, on the zero-copy path)`.
    fn publishers(&self) -> PyResult<Vec<(u64, bool)>> {
        Ok(self.state.get()?.publishers())
    }

    /// Why `sample` came by its path, in words to print beside it (`None` for zero-copy):
    /// e.g. `"on another host"` or `"handshake failed: …"` for `cpu-bytes`.
    fn path_reason(&self, sample: &Sample) -> PyResult<Option<String>> {
        Ok(self.state.get()?.path_reason(sample.sample.info()))
    }

    /// The subscriber's counters as JSON.
    fn _stats_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.state.get()?.stats()).map_err(|e| zcs_err(&e))
    }

    fn __repr__(&self) -> String {
        format!("<zenoh_cuda_shm.Subscriber key={:?}{}>", self.state.key, if self.closed() { " closed" } else { "" })
    }
}

/// A received message: metadata, and the payload through DLPack or as bytes.
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct Sample {
    sample: GpuSample,
    /// The tensor description, decoded and validated once (`None`: sent as bytes; an
    /// invalid description is kept as its error text).
    meta: Result<Option<TensorMeta>, String>,
}

impl Sample {
    fn new(sample: GpuSample) -> Self {
        let meta = sample.tensor_meta().map_err(|e| chain(&e));
        Self { sample, meta }
    }

    fn tensor(&self) -> PyResult<&TensorMeta> {
        match &self.meta {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(PyBufferError::new_err("the sample carries no tensor description (it was sent as bytes)")),
            Err(e) => Err(PyValueError::new_err(format!("invalid tensor description: {e}"))),
        }
    }
}

fn export_err(e: &ExportError) -> PyErr {
    match e {
        ExportError::InvalidStream { .. } => PyValueError::new_err(chain(e)),
        ExportError::NoMeta
        | ExportError::CopyRequired { .. }
        | ExportError::PayloadUnavailable
        | ExportError::StreamDevice { .. } => PyBufferError::new_err(chain(e)),
        ExportError::Meta(_) => PyValueError::new_err(format!("invalid tensor description: {}", chain(e))),
        e => zcs_err(e),
    }
}

/// What a consumer passes to `__dlpack__`.
pub(crate) struct DlpackArgs<'a, 'py> {
    pub(crate) stream: Option<&'a Bound<'py, PyAny>>,
    pub(crate) max_version: Option<(u32, u32)>,
    pub(crate) dl_device: Option<(i32, i32)>,
    pub(crate) copy: Option<bool>,
}

/// Exports `sample` as DLPack asks (see `Sample.__dlpack__`), described by `meta` or, when
/// `None`, by the sample's own tensor description.
pub(crate) fn export<'py>(
    py: Python<'py>,
    sample: &GpuSample,
    meta: Option<&TensorMeta>,
    args: DlpackArgs<'_, 'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let DlpackArgs { stream, max_version, dl_device, copy } = args;
    let own = sample.dlpack_device();
    let cpu = DeviceType::Cpu.as_i32();
    let to_host = match dl_device {
        None => false,
        Some(d) if d == (own.device_type, own.device_id) => false,
        Some((t, 0)) if t == cpu => true,
        Some((t, id)) => {
            return Err(PyBufferError::new_err(format!(
                "the sample is on device ({}, {}) and can be exported there or to (1, 0), not ({t}, {id})",
                own.device_type, own.device_id
            )));
        }
    };
    let s = stream::parse(stream)?;
    let consumer = if own.device_type == cpu || to_host {
        stream::check_cpu(s)?;
        ConsumerStream::no_sync()
    } else {
        // SAFETY: DLPack's contract: a stream value above 2 is a live `cudaStream_t` of
        // the consumer on the sample's device (the primary context, which every runtime
        // API framework uses), which the consumer keeps alive while it uses the tensor,
        // i.e. until it calls the deleter.
        unsafe { ConsumerStream::from_dlpack(s.unwrap_or(1)) }.map_err(|e| export_err(&e))?
    };
    let options = ExportOptions { copy, to_host };
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    if versioned {
        let t = py
            .detach(|| match meta {
                None => sample.to_dlpack_versioned_with(&consumer, options),
                Some(m) => sample.to_dlpack_versioned_as(m, &consumer, options),
            })
            .map_err(|e| export_err(&e))?;
        capsule::versioned(py, t)
    } else {
        let t = py
            .detach(|| match meta {
                None => sample.to_dlpack_legacy_with(&consumer, options),
                Some(m) => sample.to_dlpack_legacy_as(m, &consumer, options),
            })
            .map_err(|e| export_err(&e))?;
        capsule::legacy(py, t)
    }
}

#[pymethods]
impl Sample {
    /// Exports the payload as a tensor (DLPack). On CUDA, `stream` is the consumer's
    /// stream: it waits for the publisher's ready signal before this returns, without a
    /// host wait (`None`/`1` legacy default stream, `2` per-thread default stream, `-1`
    /// no stream: the host waits, `> 2` a `cudaStream_t`). A versioned capsule when
    /// `max_version >= (1, 0)`, else a legacy one. In-place exports are read-only.
    /// `dl_device=(1, 0)` on a CUDA sample copies to host memory; `copy=True` always
    /// copies, `copy=False` refuses (`BufferError`) where a copy is needed.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.tensor()?;
        export(py, &self.sample, None, DlpackArgs { stream, max_version, dl_device, copy })
    }

    /// `(device_type, device_id)` of an export: `(2, ordinal)` in CUDA sessions, `(1, 0)`
    /// in host-memory sessions.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.sample.dlpack_device();
        (d.device_type, d.device_id)
    }

    /// The payload as bytes (a copy; device→host for device blocks).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let sample = &self.sample;
        let v = py.detach(|| sample.to_vec()).map_err(|e| zcs_err(&e))?;
        Ok(PyBytes::new(py, &v))
    }

    /// The key it was published on (without the library's `@zcs` channel suffix).
    #[getter]
    fn key(&self) -> &str {
        &self.sample.info().key
    }

    /// The publisher's sequence number (0 for plain Zenoh publishers).
    #[getter]
    fn seq(&self) -> u64 {
        self.sample.seq()
    }

    /// The publisher's instance id (0 for plain Zenoh publishers).
    #[getter]
    fn publisher_id(&self) -> u64 {
        self.sample.info().publisher
    }

    /// Publication time in ns since the Unix epoch (publisher clock; 0 if unknown).
    #[getter]
    fn timestamp_ns(&self) -> u64 {
        self.sample.info().timestamp_ns
    }

    /// How it arrived: `"zero-copy"`, `"zero-copy-peer"`, `"peer-copy"`, `"host-block"`,
    /// `"host-copy"`, `"inline"`, `"cpu-bytes"` or `"plain"`.
    #[getter]
    fn path(&self) -> String {
        self.sample.path().to_string()
    }

    /// Payload length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.sample.len()
    }

    fn __len__(&self) -> usize {
        self.sample.len()
    }

    /// The raw metadata bytes sent with the sample (the encoded tensor description).
    #[getter]
    fn meta<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.sample.info().meta.as_deref().map(|m| PyBytes::new(py, m))
    }

    /// Whether the sample carries a valid tensor description.
    #[getter]
    fn is_tensor(&self) -> bool {
        matches!(self.meta, Ok(Some(_)))
    }

    /// Tensor dimensions.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.tensor()?.shape)
    }

    /// Tensor strides in elements (always explicit).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let s = self.tensor()?.effective_strides().map_err(|e| PyValueError::new_err(e.to_string()))?;
        PyTuple::new(py, s)
    }

    /// Element type name (`"float32"`, `"bfloat16"`, …).
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(dtype::name(self.tensor()?.dtype))
    }

    /// Offset of the first element in the payload, in bytes.
    #[getter]
    fn byte_offset(&self) -> PyResult<u64> {
        Ok(self.tensor()?.byte_offset)
    }

    /// The device the publisher's description names: `(device_type, device_id)`.
    #[getter]
    fn source_device(&self) -> PyResult<(i32, i32)> {
        let d = self.tensor()?.device;
        Ok((d.device_type.as_i32(), d.device_id))
    }

    fn __repr__(&self) -> String {
        let t = match &self.meta {
            Ok(Some(m)) => format!(" shape={:?} dtype={}", m.shape, dtype::name(m.dtype)),
            _ => String::new(),
        };
        format!(
            "<zenoh_cuda_shm.Sample key={:?} seq={} path={} nbytes={}{t}>",
            &self.sample.info().key,
            self.sample.seq(),
            self.sample.path(),
            self.sample.len()
        )
    }
}
