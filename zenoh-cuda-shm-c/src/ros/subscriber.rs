//! ROS subscriptions of Image or ExperimentalTensor, received from with a timeout.

use std::ffi::{CString, c_char};
use std::time::Duration;

use zenoh_cuda_shm::RecvError;
use zenoh_cuda_shm::cuda::Gpu;
use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Image};
use zenoh_cuda_shm_ros2::{RosDataMessage, RosSample, RosSubscriber};

use super::declare_failed;
use super::node::{NODES, zcs_ros_node_t};
use super::qos::{qos_in, zcs_ros_qos_t};
use super::sample::{Received, register, zcs_ros_sample_t};
use crate::error::{Error, ZCS_ERR_CLOSED, ZCS_ERR_TIMEOUT, guard, non_null, set_out, str_arg, zcs_result_t};
use crate::handle::{Registry, end};
use crate::subscriber::ZCS_TIMEOUT_INFINITE;

/// A subscription to one message type on a ROS topic.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_ros_subscriber_t {
    /// The handle (0: null).
    pub id: u64,
}

enum Typed {
    Image(RosSubscriber<Image<()>>),
    Tensor(RosSubscriber<ExperimentalTensor<()>>),
}

struct SubscriberEntry {
    typed: Typed,
    /// The session's GPU, for the samples' reads on a caller's stream.
    gpu: Option<Gpu>,
    /// The topic as resolved, for C.
    topic: CString,
}

static SUBSCRIBERS: Registry<SubscriberEntry> = Registry::new("ROS subscriber");

/// Declares a subscription to `M` on `topic` from `node`.
///
/// # Safety
/// `topic` is NULL or NUL-terminated; `qos` is NULL or readable; `out` is NULL or
/// points to a handle.
unsafe fn declare<M: RosDataMessage>(
    node: zcs_ros_node_t,
    topic: *const c_char,
    qos: *const zcs_ros_qos_t,
    out: *mut zcs_ros_subscriber_t,
    typed: fn(RosSubscriber<M>) -> Typed,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let topic = unsafe { str_arg(topic, "topic") }?;
        // SAFETY: NULL or readable (the caller's contract).
        let qos = unsafe { qos_in(qos) }?;
        let n = NODES.get(node.id)?;
        let s = n
            .subscriber::<M>(topic, qos)
            .map_err(|e| declare_failed(&format!("declare a subscription to {} on {topic:?}", M::TYPE_NAME), &e))?;
        // A resolved ROS name has no NUL (only letters, digits, `_`, `/`).
        let resolved = CString::new(s.topic()).unwrap_or_default();
        let entry = SubscriberEntry { typed: typed(s), gpu: n.session().gpu().cloned(), topic: resolved };
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, zcs_ros_subscriber_t { id: SUBSCRIBERS.insert(entry) }) };
        Ok(())
    })
}

/// Declares a subscription to `sensor_msgs/msg/Image` on `topic` (absolute, or relative
/// to the node's namespace), with the QoS profile at `qos` (NULL:
/// `zcs_ros_qos_default`'s). It receives from our publishers through our channel and
/// from every other ROS publisher of the topic, each message once. A topic that is not
/// a ROS name, or a profile with a value out of its range, is `ZCS_ERR_INVALID`.
///
/// # Safety
/// `topic` is NULL or NUL-terminated; `qos` is NULL or points to a profile; `out` is
/// NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_subscriber_declare_image(
    node: zcs_ros_node_t,
    topic: *const c_char,
    qos: *const zcs_ros_qos_t,
    out: *mut zcs_ros_subscriber_t,
) -> zcs_result_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { declare::<Image<()>>(node, topic, qos, out, Typed::Image) }
}

/// Declares a subscription to `tensor_msgs/msg/ExperimentalTensor` on `topic`, as
/// `zcs_ros_subscriber_declare_image` does.
///
/// # Safety
/// As `zcs_ros_subscriber_declare_image`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_subscriber_declare_tensor(
    node: zcs_ros_node_t,
    topic: *const c_char,
    qos: *const zcs_ros_qos_t,
    out: *mut zcs_ros_subscriber_t,
) -> zcs_result_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { declare::<ExperimentalTensor<()>>(node, topic, qos, out, Typed::Tensor) }
}

/// The topic as resolved; valid while the subscriber is.
///
/// # Safety
/// `out` is NULL or points to a `const char*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_subscriber_topic(
    subscriber: zcs_ros_subscriber_t,
    out: *mut *const c_char,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SUBSCRIBERS.get(subscriber.id)?;
        // SAFETY: not null (checked above); writable. The string lives in the entry,
        // which lives until the subscriber is dropped.
        unsafe { set_out(out, s.topic.as_ptr()) };
        Ok(())
    })
}

/// The next message of `s`, waiting up to `timeout_ms`.
fn next<M: RosDataMessage>(s: &RosSubscriber<M>, timeout_ms: u64) -> Result<RosSample<M>, Error> {
    let got = match timeout_ms {
        0 => s.try_recv().ok_or(RecvError::Timeout),
        ZCS_TIMEOUT_INFINITE => s.recv(),
        ms => s.recv_timeout(Duration::from_millis(ms)),
    };
    got.map_err(|e| match e {
        RecvError::Timeout => Error::new(ZCS_ERR_TIMEOUT, "no message within the timeout"),
        e => Error::new(ZCS_ERR_CLOSED, format!("no more messages: {e}")),
    })
}

/// Receives the next message, waiting up to `timeout_ms` (0: only what is there;
/// `ZCS_TIMEOUT_INFINITE`: until one comes): `ZCS_ERR_TIMEOUT` if none came,
/// `ZCS_ERR_CLOSED` once none can come. The caller owns the sample
/// (`zcs_ros_sample_drop`).
///
/// # Safety
/// `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_subscriber_recv(
    subscriber: zcs_ros_subscriber_t,
    timeout_ms: u64,
    out: *mut zcs_ros_sample_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SUBSCRIBERS.get(subscriber.id)?;
        let received = match &s.typed {
            Typed::Image(sub) => Received::Image(next(sub, timeout_ms)?),
            Typed::Tensor(sub) => Received::Tensor(next(sub, timeout_ms)?),
        };
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, register(received, s.gpu.clone())) };
        Ok(())
    })
}

/// Undeclares a subscription and zeroes its handle. Samples received from it stay
/// valid until dropped.
///
/// # Safety
/// `subscriber` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_subscriber_drop(subscriber: *mut zcs_ros_subscriber_t) -> zcs_result_t {
    // SAFETY: `subscriber` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&SUBSCRIBERS, subscriber, "ROS subscriber") })
}
