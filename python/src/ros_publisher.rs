//! `RosPub`: a ROS 2 publisher of Image, ExperimentalTensor or String
//! (`zenoh_cuda_shm.ros2.Publisher`). Data comes as host bytes, or in a loan written in
//! place (on the GPU in CUDA sessions), and is never copied through the host for a loan.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use zenoh_cuda_shm::GpuLoan;
use zenoh_cuda_shm::cuda::Gpu;
use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Header, Image, StringMsg, Time};
use zenoh_cuda_shm::tensor_codec::{Device, TensorMeta};
use zenoh_cuda_shm_ros2::names::gid_hex;
use zenoh_cuda_shm_ros2::{RosPublishError, RosPublisher};

use crate::closable::{Closable, Handle};
use crate::loan::{Loan, LoanCell};
use crate::ros_subscription::tensor_meta;
use crate::{LoanError, chain, dtype, zcs_err};

pub(crate) enum TypedPub {
    Image(RosPublisher<Image<()>>),
    Tensor(RosPublisher<ExperimentalTensor<()>>),
    Text(RosPublisher<StringMsg<()>>),
}

/// Calls `$body` with `$p` bound to the typed publisher, whatever its message type.
macro_rules! with_pub {
    ($typed:expr, $p:ident => $body:expr) => {
        match $typed {
            TypedPub::Image($p) => $body,
            TypedPub::Tensor($p) => $body,
            TypedPub::Text($p) => $body,
        }
    };
}

pub(crate) struct RosPubState {
    publisher: Handle<TypedPub>,
    gpu: Option<Gpu>,
    topic: String,
}

impl RosPubState {
    pub(crate) fn new(typed: TypedPub, gpu: Option<Gpu>) -> Self {
        let topic = with_pub!(&typed, p => p.topic().to_owned());
        Self { publisher: Handle::new(typed, format!("publisher on {topic:?}")), gpu, topic }
    }

    fn get(&self) -> PyResult<Arc<TypedPub>> {
        self.publisher.get()
    }
}

impl Closable for RosPubState {
    fn close(&self) {
        self.publisher.close();
    }
}

fn publish_err(e: &RosPublishError) -> PyErr {
    match e {
        RosPublishError::Encode(_) => PyValueError::new_err(chain(e)),
        e => zcs_err(e),
    }
}

fn wrong_kind(topic: &str, what: &str) -> PyErr {
    PyValueError::new_err(format!("the publisher on {topic:?} does not publish {what}"))
}

/// A stamp in ns since the epoch as `builtin_interfaces/Time`.
fn stamp(ns: i64) -> Time {
    Time { sec: ns.div_euclid(1_000_000_000) as i32, nanosec: ns.rem_euclid(1_000_000_000) as u32 }
}

/// Where a message's data is.
enum Data<'a> {
    Host(&'a [u8]),
    Loan(GpuLoan, Vec<i64>, &'a Arc<LoanCell>),
}

/// A ROS 2 publisher (see `Node.create_publisher`).
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct RosPub {
    pub(crate) state: Arc<RosPubState>,
}

impl RosPub {
    /// The data given, once `check` accepted its length (a refused loan stays the
    /// caller's, to publish again).
    fn data<'a>(
        &self,
        data: Option<&'a [u8]>,
        loan: Option<&'a Loan>,
        check: impl FnOnce(usize) -> PyResult<()>,
    ) -> PyResult<Data<'a>> {
        match (data, loan) {
            (Some(d), None) => {
                check(d.len())?;
                Ok(Data::Host(d))
            }
            (None, Some(l)) => {
                check(l.cell.nbytes())?;
                let (gpu_loan, streams) = l.cell.take()?;
                Ok(Data::Loan(gpu_loan, streams, &l.cell))
            }
            _ => Err(PyValueError::new_err("give the data as bytes or as a loan, one of the two")),
        }
    }

    /// Publishes `msg` with `data`; returns the sequence number.
    fn send<M: zenoh_cuda_shm_ros2::RosDataMessage>(
        py: Python<'_>,
        p: &RosPublisher<M>,
        msg: &M,
        data: Data<'_>,
    ) -> PyResult<i64> {
        match data {
            Data::Host(bytes) => py.detach(|| p.publish_host(msg, bytes)).map(|r| r.seq).map_err(|e| publish_err(&e)),
            // Ordering after the writers and the publish run without the GIL.
            Data::Loan(gpu_loan, streams, cell) => py.detach(move || {
                cell.order_after(&gpu_loan, &streams).map_err(|e| zcs_err(&e))?;
                p.publish(msg, gpu_loan).map(|r| r.seq).map_err(|e| publish_err(&e))
            }),
        }
    }
}

#[pymethods]
impl RosPub {
    /// Loans a block for a contiguous tensor of `shape` and `dtype` (on this session's GPU
    /// in CUDA sessions), to write in place and publish with `publish_image` /
    /// `publish_tensor`.
    fn loan(&self, py: Python<'_>, shape: Vec<i64>, dtype: &str) -> PyResult<Loan> {
        let typed = self.state.get()?;
        let device = self.state.gpu.as_ref().map_or(Device::CPU, |g| Device::cuda(g.ordinal() as i32));
        let meta = TensorMeta::contiguous(dtype::parse(dtype)?, shape, device);
        let extent = meta.validate(u64::MAX).map_err(|e| PyValueError::new_err(format!("invalid tensor: {e}")))?;
        let nbytes = usize::try_from(extent.bytes).map_err(|_| PyValueError::new_err("the tensor is too large"))?;
        if nbytes == 0 {
            return Err(PyValueError::new_err("a loan needs at least one byte; publish empty data as bytes"));
        }
        let loan = py.detach(|| with_pub!(&*typed, p => p.loan(nbytes))).map_err(|e| LoanError::new_err(chain(&e)))?;
        Ok(Loan { cell: Arc::new(LoanCell::new(loan, meta, self.state.gpu.clone())) })
    }

    /// Publishes a `sensor_msgs/msg/Image`: the fields, and its data as `data` (bytes)
    /// or `loan`. Returns the sequence number.
    #[pyo3(signature = (stamp_ns, frame_id, height, width, encoding, is_bigendian, step, data = None, loan = None))]
    // One argument per message field: Python calls it with keywords.
    #[allow(clippy::too_many_arguments)]
    fn publish_image(
        &self,
        py: Python<'_>,
        stamp_ns: i64,
        frame_id: String,
        height: u32,
        width: u32,
        encoding: String,
        is_bigendian: bool,
        step: u32,
        data: Option<&[u8]>,
        loan: Option<&Loan>,
    ) -> PyResult<i64> {
        let typed = self.state.get()?;
        let TypedPub::Image(p) = &*typed else { return Err(wrong_kind(&self.state.topic, "Images")) };
        let msg = Image {
            header: Header { stamp: stamp(stamp_ns), frame_id },
            height,
            width,
            encoding,
            is_bigendian: u8::from(is_bigendian),
            step,
            data: (),
        };
        let want = u64::from(step) * u64::from(height);
        let data = self.data(data, loan, |len| {
            if len as u64 == want {
                Ok(())
            } else {
                Err(PyValueError::new_err(format!(
                    "an Image of {height} rows of {step} bytes needs {want} bytes of data, not {len}"
                )))
            }
        })?;
        Self::send(py, p, &msg, data)
    }

    /// Publishes a `tensor_msgs/msg/ExperimentalTensor` of `dtype` (a name), `shape`,
    /// `strides` (elements; empty: contiguous) and `byte_offset`, its data as `data`
    /// (bytes) or `loan`. Returns the sequence number.
    #[pyo3(signature = (dtype, shape, strides, byte_offset, data = None, loan = None))]
    // One argument per message field: Python calls it with keywords.
    #[allow(clippy::too_many_arguments)]
    fn publish_tensor(
        &self,
        py: Python<'_>,
        dtype: &str,
        shape: Vec<i64>,
        strides: Vec<i64>,
        byte_offset: u64,
        data: Option<&[u8]>,
        loan: Option<&Loan>,
    ) -> PyResult<i64> {
        let typed = self.state.get()?;
        let TypedPub::Tensor(p) = &*typed else { return Err(wrong_kind(&self.state.topic, "tensors")) };
        let dl = dtype::parse(dtype)?.to_dl();
        let msg = ExperimentalTensor {
            dtype_code: dl.code,
            dtype_bits: dl.bits,
            dtype_lanes: dl.lanes,
            shape,
            strides,
            byte_offset,
            data: (),
        };
        // A description that does not fit its data would reach every subscriber as such.
        let data = self.data(data, loan, |len| {
            tensor_meta(&msg, len, Device::CPU)
                .map(drop)
                .map_err(|e| PyValueError::new_err(format!("the tensor does not fit its {len} bytes of data: {e}")))
        })?;
        Self::send(py, p, &msg, data)
    }

    /// Publishes a `std_msgs/msg/String`. Returns the sequence number.
    fn publish_string(&self, py: Python<'_>, text: &str) -> PyResult<i64> {
        let typed = self.state.get()?;
        let TypedPub::Text(p) = &*typed else { return Err(wrong_kind(&self.state.topic, "strings")) };
        py.detach(|| p.publish_str(text)).map(|r| r.seq).map_err(|e| publish_err(&e))
    }

    /// The sequence number the next message will carry.
    #[getter]
    fn next_seq(&self) -> PyResult<i64> {
        Ok(with_pub!(&*self.state.get()?, p => p.next_seq()))
    }

    /// The full topic name.
    #[getter]
    fn topic(&self) -> &str {
        &self.state.topic
    }

    /// The data key (`<domain>/<topic>/<type>/<hash>`).
    #[getter]
    fn key(&self) -> PyResult<String> {
        Ok(with_pub!(&*self.state.get()?, p => p.key().to_owned()))
    }

    /// The GID, as hex.
    #[getter]
    fn gid(&self) -> PyResult<String> {
        Ok(with_pub!(&*self.state.get()?, p => gid_hex(&p.gid())))
    }

    /// Ordinary ROS subscriptions (not ours) of the topic the graph shows.
    #[getter]
    fn ordinary_subscriptions(&self) -> PyResult<usize> {
        Ok(with_pub!(&*self.state.get()?, p => p.ordinary_subscriptions()))
    }

    /// Subscriptions of ours on the zero-copy path.
    #[getter]
    fn zero_copy_subscribers(&self) -> PyResult<usize> {
        Ok(with_pub!(&*self.state.get()?, p => p.channel().zero_copy_subscribers()))
    }

    /// Subscriptions of ours known to the publisher (zero-copy or not).
    #[getter]
    fn our_subscriptions(&self) -> PyResult<usize> {
        Ok(with_pub!(&*self.state.get()?, p => p.channel().aware_subscribers()))
    }

    /// The counters, as `(name, value)` pairs.
    fn stats(&self) -> PyResult<Vec<(&'static str, u64)>> {
        let s = with_pub!(&*self.state.get()?, p => p.stats());
        Ok(vec![
            ("published", s.published),
            ("base_puts", s.base_puts),
            ("device_to_host", s.device_to_host),
            ("base_shm", s.base_shm),
            ("descriptors", s.descriptors),
            ("buf_puts", s.buf_puts),
            ("cuda_fallbacks", s.cuda_fallbacks),
            ("lent_blocks", s.lent_blocks),
            ("lent_reclaimed", s.lent_reclaimed),
        ])
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

    fn __repr__(&self) -> String {
        format!("<zenoh_cuda_shm.ros2.Publisher {:?}{}>", self.state.topic, if self.closed() { " closed" } else { "" })
    }
}
