//! `RosSub` and `RosMsg`: a ROS 2 subscription of Image, ExperimentalTensor or String
//! (`zenoh_cuda_shm.ros2.Subscription`) and the messages it receives, whose data
//! exports through DLPack in place where it arrived in a block.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use zenoh_cuda_shm::RecvError;
use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Image, StringMsg};
use zenoh_cuda_shm::tensor_codec::{Device, DeviceType, MetaError, TensorMeta};
use zenoh_cuda_shm_ros2::names::gid_hex;
use zenoh_cuda_shm_ros2::{RosSample, RosSubscriber};

use crate::closable::{Closable, Handle};
use crate::subscriber::{DlpackArgs, export};
use crate::{dtype, wait, zcs_err};

pub(crate) enum TypedSub {
    Image(RosSubscriber<Image<()>>),
    Tensor(RosSubscriber<ExperimentalTensor<()>>),
    Text(RosSubscriber<StringMsg<()>>),
}

/// Calls `$body` with `$s` bound to the typed subscription, whatever its message type.
macro_rules! with_sub {
    ($typed:expr, $s:ident => $body:expr) => {
        match $typed {
            TypedSub::Image($s) => $body,
            TypedSub::Tensor($s) => $body,
            TypedSub::Text($s) => $body,
        }
    };
}

enum TypedSample {
    Image(RosSample<Image<()>>),
    Tensor(RosSample<ExperimentalTensor<()>>),
    Text(RosSample<StringMsg<()>>),
}

macro_rules! with_sample {
    ($typed:expr, $s:ident => $body:expr) => {
        match $typed {
            TypedSample::Image($s) => $body,
            TypedSample::Tensor($s) => $body,
            TypedSample::Text($s) => $body,
        }
    };
}

pub(crate) struct RosSubState {
    sub: Handle<TypedSub>,
    topic: String,
}

impl RosSubState {
    pub(crate) fn new(typed: TypedSub) -> Self {
        let topic = with_sub!(&typed, s => s.topic().to_owned());
        Self { sub: Handle::new(typed, format!("subscription on {topic:?}")), topic }
    }

    fn get(&self) -> PyResult<Arc<TypedSub>> {
        self.sub.get()
    }
}

impl Closable for RosSubState {
    fn close(&self) {
        self.sub.close();
    }
}

/// A received message of `sub`, with why it came by its path.
fn message(sub: &TypedSub, mut try_take: impl FnMut(&TypedSub) -> Option<TypedSample>) -> Option<RosMsg> {
    let sample = try_take(sub)?;
    let reason = match (sub, &sample) {
        (TypedSub::Image(s), TypedSample::Image(m)) => s.path_reason(m),
        (TypedSub::Tensor(s), TypedSample::Tensor(m)) => s.path_reason(m),
        (TypedSub::Text(s), TypedSample::Text(m)) => s.path_reason(m),
        _ => None,
    };
    Some(RosMsg { sample, reason })
}

fn recv_within(sub: &TypedSub, wait: Duration) -> Result<TypedSample, RecvError> {
    Ok(match sub {
        TypedSub::Image(s) => TypedSample::Image(s.recv_timeout(wait)?),
        TypedSub::Tensor(s) => TypedSample::Tensor(s.recv_timeout(wait)?),
        TypedSub::Text(s) => TypedSample::Text(s.recv_timeout(wait)?),
    })
}

/// The description an ExperimentalTensor message gives its `len` bytes of data on
/// `device`, validated against them.
pub(crate) fn tensor_meta(t: &ExperimentalTensor<()>, len: usize, device: Device) -> Result<TensorMeta, MetaError> {
    let m = TensorMeta {
        dtype: t.dtype()?,
        shape: t.shape.clone(),
        strides: t.strides.clone(),
        byte_offset: t.byte_offset,
        device,
    };
    m.validate(len as u64)?;
    Ok(m)
}

/// A ROS 2 subscription (see `Node.create_subscription`).
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct RosSub {
    pub(crate) state: Arc<RosSubState>,
}

#[pymethods]
impl RosSub {
    /// Waits for the next message, up to `timeout` seconds (`None`: forever). Raises
    /// `TimeoutError` when none came, `ClosedError` once closed. The GIL is released while
    /// waiting; Ctrl-C interrupts the wait.
    #[pyo3(signature = (timeout = None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<RosMsg> {
        let topic = &self.state.topic;
        let (what, closed) = (format!("message on {topic:?}"), format!("subscription on {topic:?}"));
        let state = &self.state;
        wait::recv_within(py, timeout, &what, &closed, |wait| {
            let sub = state.get()?;
            let mut failed = None;
            let got = message(&sub, |s| recv_within(s, wait).map_err(|e| failed = Some(e)).ok());
            Ok(got.ok_or_else(|| failed.unwrap_or(RecvError::Timeout)))
        })
    }

    /// The next message if one is queued, else `None`.
    fn try_recv(&self) -> PyResult<Option<RosMsg>> {
        let sub = self.state.get()?;
        Ok(message(&sub, |s| match s {
            TypedSub::Image(s) => s.try_recv().map(TypedSample::Image),
            TypedSub::Tensor(s) => s.try_recv().map(TypedSample::Tensor),
            TypedSub::Text(s) => s.try_recv().map(TypedSample::Text),
        }))
    }

    /// Publishers of the topic that have not reached this subscription, each as
    /// `(gid, token, [reasons])` in words (another type, incompatible QoS, …).
    fn silent_publishers(&self) -> PyResult<Vec<(String, String, Vec<String>)>> {
        let v = with_sub!(&*self.state.get()?, s => s.silent_publishers());
        Ok(v.into_iter()
            .map(|p| (gid_hex(&p.gid), p.token, p.reasons.iter().map(ToString::to_string).collect()))
            .collect())
    }

    /// Publishers of the topic in the graph now that will not reach this subscription,
    /// each as `(gid, node, [reasons])` in words, without waiting for the silence window.
    fn unheard_publishers(&self) -> PyResult<Vec<(String, String, Vec<String>)>> {
        let v = with_sub!(&*self.state.get()?, s => s.unheard_publishers());
        Ok(v.into_iter()
            .map(|p| (gid_hex(&p.gid), p.node, p.reasons.iter().map(ToString::to_string).collect()))
            .collect())
    }

    /// The counters, as `(name, value)` pairs.
    fn stats(&self) -> PyResult<Vec<(&'static str, u64)>> {
        let s = with_sub!(&*self.state.get()?, s => s.stats());
        Ok(vec![
            ("channel", s.channel),
            ("base", s.base),
            ("buf_cpu", s.buf_cpu),
            ("cuda_buffers", s.cuda_buffers),
            ("buf_gid", s.buf_gid),
            ("backend_refused", s.backend_refused),
            ("lost", s.lost),
            ("silent_publishers", s.silent_publishers),
            ("duplicates", s.duplicates),
            ("bad_attachment", s.bad_attachment),
            ("bad_cdr", s.bad_cdr),
            ("bad_envelope", s.bad_envelope),
            ("dropped_queue_full", s.dropped_queue_full),
            ("queued", s.queued),
        ])
    }

    /// The full topic name.
    #[getter]
    fn topic(&self) -> &str {
        &self.state.topic
    }

    /// The data key.
    #[getter]
    fn key(&self) -> PyResult<String> {
        Ok(with_sub!(&*self.state.get()?, s => s.key().to_owned()))
    }

    /// The GID, as hex.
    #[getter]
    fn gid(&self) -> PyResult<String> {
        Ok(with_sub!(&*self.state.get()?, s => gid_hex(&s.gid())))
    }

    /// Undeclares the subscription. Messages already received stay readable. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.state.close());
    }

    /// Whether the subscription (or its session) is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.state.get().is_err()
    }

    fn __repr__(&self) -> String {
        format!(
            "<zenoh_cuda_shm.ros2.Subscription {:?}{}>",
            self.state.topic,
            if self.closed() { " closed" } else { "" }
        )
    }
}

/// A received message: its header fields, and its data through DLPack or as bytes.
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct RosMsg {
    sample: TypedSample,
    reason: Option<String>,
}

impl RosMsg {
    fn image(&self) -> PyResult<&Image<()>> {
        match &self.sample {
            TypedSample::Image(s) => Ok(s.msg()),
            _ => Err(PyValueError::new_err("not an Image")),
        }
    }

    fn tensor(&self) -> PyResult<&ExperimentalTensor<()>> {
        match &self.sample {
            TypedSample::Tensor(s) => Ok(s.msg()),
            _ => Err(PyValueError::new_err("not an ExperimentalTensor")),
        }
    }

    /// The tensor view of the data on `device`: `[height, width, channels]` for an
    /// Image, the message's own description for a tensor.
    fn meta(&self, device: Device) -> PyResult<TensorMeta> {
        let len = with_sample!(&self.sample, s => s.data_len());
        match &self.sample {
            TypedSample::Image(s) => {
                s.msg().pixel_meta(len, device).map_err(|e| PyBufferError::new_err(crate::chain(&e)))
            }
            TypedSample::Tensor(s) => tensor_meta(s.msg(), len, device)
                .map_err(|e| PyBufferError::new_err(format!("invalid tensor description: {e}"))),
            TypedSample::Text(_) => Err(PyBufferError::new_err("a String's data is text, not a tensor (read .text)")),
        }
    }
}

#[pymethods]
impl RosMsg {
    /// Exports the data as a tensor (DLPack), in place where it arrived in a block (on
    /// the GPU, ordered on `stream` after the publisher's writes, without a host wait).
    /// CDR bytes (from ordinary ROS publishers) raise `BufferError`: the Python layer
    /// serves those from a copy. Arguments as `Sample.__dlpack__`.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let g = with_sample!(&self.sample, s => s.gpu_sample())
            .ok_or_else(|| PyBufferError::new_err("the data arrived as CDR bytes, not in a block"))?;
        let own = g.dlpack_device();
        let device =
            if own.device_type == DeviceType::Cuda.as_i32() { Device::cuda(own.device_id) } else { Device::CPU };
        let meta = self.meta(device)?;
        export(py, g, Some(&meta), DlpackArgs { stream, max_version, dl_device, copy })
    }

    /// `(device_type, device_id)` of an export: `(2, ordinal)` for data in a GPU block,
    /// `(1, 0)` otherwise.
    fn __dlpack_device__(&self) -> (i32, i32) {
        match with_sample!(&self.sample, s => s.gpu_sample()) {
            Some(g) => {
                let d = g.dlpack_device();
                (d.device_type, d.device_id)
            }
            None => (DeviceType::Cpu.as_i32(), 0),
        }
    }

    /// Whether the data came on our channel, which `__dlpack__` exports itself: in place
    /// for the zero-copy paths, as the library's other paths serve it otherwise; `False`
    /// for CDR bytes (exported from a copy by the Python layer).
    #[getter]
    fn in_place(&self) -> bool {
        with_sample!(&self.sample, s => s.gpu_sample().is_some())
    }

    /// `(dtype name, shape, strides)` of the tensor view of the data.
    fn layout<'py>(&self, py: Python<'py>) -> PyResult<(&'static str, Bound<'py, PyTuple>, Bound<'py, PyTuple>)> {
        let m = self.meta(Device::CPU)?;
        let strides = m.effective_strides().map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((dtype::name(m.dtype), PyTuple::new(py, &m.shape)?, PyTuple::new(py, strides)?))
    }

    /// The data as bytes (a copy; device→host for data in a GPU block).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let v = py.detach(|| with_sample!(&self.sample, s => s.data_to_vec())).map_err(|e| zcs_err(&e))?;
        Ok(PyBytes::new(py, &v))
    }

    /// The message kind: `"image"`, `"tensor"` or `"string"`.
    #[getter]
    fn kind(&self) -> &'static str {
        match &self.sample {
            TypedSample::Image(_) => "image",
            TypedSample::Tensor(_) => "tensor",
            TypedSample::Text(_) => "string",
        }
    }

    /// The publisher's sequence number (rmw_zenoh's attachment).
    #[getter]
    fn seq(&self) -> i64 {
        with_sample!(&self.sample, s => s.attachment().seq)
    }

    /// The source timestamp, ns since the epoch (rmw_zenoh's attachment).
    #[getter]
    fn source_timestamp_ns(&self) -> i64 {
        with_sample!(&self.sample, s => s.attachment().timestamp_ns)
    }

    /// The publisher's GID, as hex.
    #[getter]
    fn publisher_gid(&self) -> String {
        with_sample!(&self.sample, s => gid_hex(&s.attachment().gid))
    }

    /// How the data came: `"zero-copy"`, `"host-block"`, `"inline"`, `"plain"` (CDR), ….
    #[getter]
    fn path(&self) -> String {
        with_sample!(&self.sample, s => s.path().to_string())
    }

    /// Why it came by that path, in words (`None` for zero-copy).
    #[getter]
    fn path_reason(&self) -> Option<String> {
        self.reason.clone()
    }

    /// Length of the data in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        with_sample!(&self.sample, s => s.data_len())
    }

    /// Image: `header.stamp` as `(sec, nanosec)`.
    #[getter]
    fn stamp(&self) -> PyResult<(i32, u32)> {
        let h = &self.image()?.header;
        Ok((h.stamp.sec, h.stamp.nanosec))
    }

    /// Image: `header.frame_id`.
    #[getter]
    fn frame_id(&self) -> PyResult<String> {
        Ok(self.image()?.header.frame_id.clone())
    }

    /// Image: `height`.
    #[getter]
    fn height(&self) -> PyResult<u32> {
        Ok(self.image()?.height)
    }

    /// Image: `width`.
    #[getter]
    fn width(&self) -> PyResult<u32> {
        Ok(self.image()?.width)
    }

    /// Image: `encoding`.
    #[getter]
    fn encoding(&self) -> PyResult<String> {
        Ok(self.image()?.encoding.clone())
    }

    /// Image: `is_bigendian`.
    #[getter]
    fn is_bigendian(&self) -> PyResult<bool> {
        Ok(self.image()?.is_bigendian != 0)
    }

    /// Image: `step`.
    #[getter]
    fn step(&self) -> PyResult<u32> {
        Ok(self.image()?.step)
    }

    /// Tensor: the element type's name (`"float32"`, …; `"unknown"` outside the table).
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        let t = self.tensor()?;
        Ok(t.dtype().map_or("unknown", dtype::name))
    }

    /// Tensor: `shape`.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.tensor()?.shape)
    }

    /// Tensor: `strides` as sent (elements; empty: contiguous).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.tensor()?.strides)
    }

    /// Tensor: `byte_offset`.
    #[getter]
    fn byte_offset(&self) -> PyResult<u64> {
        Ok(self.tensor()?.byte_offset)
    }

    /// String: the text (a copy of the data, which is UTF-8).
    #[getter]
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        let TypedSample::Text(s) = &self.sample else { return Err(PyValueError::new_err("not a String")) };
        let m = py.detach(|| s.to_message()).map_err(|e| zcs_err(&e))?;
        Ok(m.data)
    }

    fn __repr__(&self) -> String {
        format!(
            "<zenoh_cuda_shm.ros2 {} seq={} path={} nbytes={}>",
            self.kind(),
            self.seq(),
            self.path(),
            self.nbytes()
        )
    }
}
