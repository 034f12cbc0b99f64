//! ROS publishers of Image or ExperimentalTensor: a message's data is a loan of the
//! publisher (written as any loan, then published with the other fields) or host
//! bytes.

use std::ffi::{CString, c_char};
use std::sync::Mutex;

use zenoh_cuda_shm::GpuLoan;
use zenoh_cuda_shm::tensor_codec::Device;
use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Image};
use zenoh_cuda_shm_ros2::{RosDataMessage, RosPublishError, RosPublisher};

use super::message::{image_in, tensor_in, zcs_ros_image_t};
use super::node::{NODES, zcs_ros_node_t};
use super::qos::{qos_in, zcs_ros_qos_t};
use super::{IMAGE, TENSOR, declare_failed, wrong_type};
use crate::description::zcs_tensor_t;
use crate::error::{
    Error, ZCS_ERR_INVALID, bytes_arg, chain, guard, non_null, set_opt_out, set_out, str_arg, zcs_result_t,
};
use crate::handle::{Registry, end};
use crate::publisher::{LOANS, put_loan, zcs_loan_t};

/// A publisher of one message type on a ROS topic.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_ros_publisher_t {
    /// The handle (0: null).
    pub id: u64,
}

enum Typed {
    Image(RosPublisher<Image<()>>),
    Tensor(RosPublisher<ExperimentalTensor<()>>),
}

/// Runs `$body` on the publisher of either type as `$p`.
macro_rules! either {
    ($typed:expr, $p:ident => $body:expr) => {
        match $typed {
            Typed::Image($p) => $body,
            Typed::Tensor($p) => $body,
        }
    };
}

struct PublisherEntry {
    typed: Typed,
    /// The topic as resolved, for C.
    topic: CString,
}

impl PublisherEntry {
    fn image(&self) -> Result<&RosPublisher<Image<()>>, Error> {
        match &self.typed {
            Typed::Image(p) => Ok(p),
            Typed::Tensor(_) => Err(wrong_type("publisher", TENSOR, IMAGE)),
        }
    }

    fn tensor(&self) -> Result<&RosPublisher<ExperimentalTensor<()>>, Error> {
        match &self.typed {
            Typed::Tensor(p) => Ok(p),
            Typed::Image(_) => Err(wrong_type("publisher", IMAGE, TENSOR)),
        }
    }
}

static PUBLISHERS: Registry<PublisherEntry> = Registry::new("ROS publisher");

/// Declares a publisher of `M` on `topic` from `node`.
///
/// # Safety
/// `topic` is NULL or NUL-terminated; `qos` is NULL or readable; `out` is NULL or
/// points to a handle.
unsafe fn declare<M: RosDataMessage>(
    node: zcs_ros_node_t,
    topic: *const c_char,
    qos: *const zcs_ros_qos_t,
    out: *mut zcs_ros_publisher_t,
    typed: fn(RosPublisher<M>) -> Typed,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let topic = unsafe { str_arg(topic, "topic") }?;
        // SAFETY: NULL or readable (the caller's contract).
        let qos = unsafe { qos_in(qos) }?;
        let n = NODES.get(node.id)?;
        let p = n
            .publisher::<M>(topic, qos)
            .map_err(|e| declare_failed(&format!("declare a publisher of {} on {topic:?}", M::TYPE_NAME), &e))?;
        // A resolved ROS name has no NUL (only letters, digits, `_`, `/`).
        let resolved = CString::new(p.topic()).unwrap_or_default();
        let id = PUBLISHERS.insert(PublisherEntry { typed: typed(p), topic: resolved });
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, zcs_ros_publisher_t { id }) };
        Ok(())
    })
}

/// Declares a publisher of `sensor_msgs/msg/Image` on `topic` (absolute, or relative
/// to the node's namespace, as rcl resolves it), with the QoS profile at `qos` (NULL:
/// `zcs_ros_qos_default`'s). A topic that is not a ROS name, or a profile with a
/// value out of its range, is `ZCS_ERR_INVALID`.
///
/// # Safety
/// `topic` is NULL or NUL-terminated; `qos` is NULL or points to a profile; `out` is
/// NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_declare_image(
    node: zcs_ros_node_t,
    topic: *const c_char,
    qos: *const zcs_ros_qos_t,
    out: *mut zcs_ros_publisher_t,
) -> zcs_result_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { declare::<Image<()>>(node, topic, qos, out, Typed::Image) }
}

/// Declares a publisher of `tensor_msgs/msg/ExperimentalTensor` on `topic`, as
/// `zcs_ros_publisher_declare_image` does.
///
/// # Safety
/// As `zcs_ros_publisher_declare_image`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_declare_tensor(
    node: zcs_ros_node_t,
    topic: *const c_char,
    qos: *const zcs_ros_qos_t,
    out: *mut zcs_ros_publisher_t,
) -> zcs_result_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { declare::<ExperimentalTensor<()>>(node, topic, qos, out, Typed::Tensor) }
}

/// The topic as resolved (`/robot1/camera/image` for `camera/image` in namespace
/// `/robot1`); valid while the publisher is.
///
/// # Safety
/// `out` is NULL or points to a `const char*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_topic(
    publisher: zcs_ros_publisher_t,
    out: *mut *const c_char,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let p = PUBLISHERS.get(publisher.id)?;
        // SAFETY: not null (checked above); writable. The string lives in the entry,
        // which lives until the publisher is dropped.
        unsafe { set_out(out, p.topic.as_ptr()) };
        Ok(())
    })
}

/// The subscriptions of the topic now: `ours` (of this library, served through our
/// channel: zero-copy where they share the memory) and `ordinary` (any other ROS
/// node's, served CDR messages: a device loan is then copied to the host once per
/// message). A message published while there are none reaches nobody (except
/// late-joining subscriptions, with `ZCS_ROS_DURABILITY_TRANSIENT_LOCAL`): a producer
/// may wait for its first subscription. Either pointer may be NULL.
///
/// # Safety
/// `ours` and `ordinary` are NULL or point to a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_subscriptions(
    publisher: zcs_ros_publisher_t,
    ours: *mut usize,
    ordinary: *mut usize,
) -> zcs_result_t {
    guard(|| {
        let p = PUBLISHERS.get(publisher.id)?;
        let (o, n) = either!(&p.typed, p => (p.channel().aware_subscribers(), p.ordinary_subscriptions()));
        if !ours.is_null() {
            // SAFETY: not null (checked); the caller passes a writable value.
            unsafe { set_out(ours, o) };
        }
        if !ordinary.is_null() {
            // SAFETY: as above.
            unsafe { set_out(ordinary, n) };
        }
        Ok(())
    })
}

/// Loans a block of `len` bytes for one message's data (waiting, up to the pool's
/// `loan_timeout_ms`, while every block is in use): write it as any loan
/// (`zcs_loan_host_ptr`, or `zcs_loan_device_ptr` and its stream), then publish it
/// with `zcs_ros_publisher_publish_image` / `…_tensor`, or drop it (`zcs_loan_drop`).
///
/// # Safety
/// `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_loan(
    publisher: zcs_ros_publisher_t,
    len: usize,
    out: *mut zcs_loan_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        if len == 0 {
            return Err(Error::new(ZCS_ERR_INVALID, "a loan of 0 bytes (publish empty data from host memory)"));
        }
        let p = PUBLISHERS.get(publisher.id)?;
        let loan = either!(&p.typed, p => p.loan(len)).map_err(|e| Error::failed(&format!("loan {len} bytes"), &e))?;
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, zcs_loan_t { id: LOANS.insert(Mutex::new(Some(loan))) }) };
        Ok(())
    })
}

fn publish_failed(e: &RosPublishError) -> Error {
    match e {
        RosPublishError::Encode(_) => Error::new(ZCS_ERR_INVALID, format!("publish: {}", chain(e))),
        _ => Error::failed("publish", e),
    }
}

/// Where a loan's memory is.
fn device_of(l: &GpuLoan) -> Device {
    match l.stream() {
        Some(s) => Device::cuda(s.ordinal() as i32),
        None => Device::CPU,
    }
}

/// Publishes the loan `loan` names as the data of the message `fields` makes of it.
/// Fields that are refused leave the loan with the caller, unchanged; once it is
/// taken its handle is zeroed, whether the publish succeeds or not.
///
/// # Safety
/// `loan` is NULL or points to a handle; `seq` is NULL or points to an `int64_t`.
unsafe fn publish_loan<M: RosDataMessage>(
    p: &RosPublisher<M>,
    loan: *mut zcs_loan_t,
    seq: *mut i64,
    fields: impl FnOnce(&GpuLoan) -> Result<M, Error>,
) -> Result<(), Error> {
    let publish = |l, msg: M| p.publish(&msg, l).map_err(|e| (publish_failed(&e), None));
    // SAFETY: not null and points to a handle (the caller's contract).
    let report = unsafe { put_loan(loan, |l| p.channel().owns(l), fields, publish) }?;
    // SAFETY: NULL or a writable `int64_t` (the caller's contract).
    unsafe { set_opt_out(seq, report.seq) };
    Ok(())
}

/// Publishes an image whose data is the whole of `loan` (a loan of this publisher,
/// written): `image` gives every other field, and the loan's length must be
/// `image->step * image->height`. Our subscriptions get the block (zero-copy where
/// they share its memory), ordinary ones the CDR message. On success the loan's
/// handle is zeroed; fields that are refused (`ZCS_ERR_NULL`, `ZCS_ERR_INVALID`)
/// leave the loan with the caller; a publish that fails after taking it zeroes it
/// too (its block goes back). `seq`, if not NULL, receives the message's ROS sequence
/// number (from 1, per publisher).
///
/// # Safety
/// `image` is NULL or points to a `zcs_ros_image_t` whose strings are NULL or
/// NUL-terminated; `loan` is NULL or points to a handle; `seq` is NULL or points to
/// an `int64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_publish_image(
    publisher: zcs_ros_publisher_t,
    image: *const zcs_ros_image_t,
    loan: *mut zcs_loan_t,
    seq: *mut i64,
) -> zcs_result_t {
    guard(|| {
        non_null(loan, "loan")?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = entry.image()?;
        // SAFETY: `image` as documented (the caller's contract).
        let fields = |l: &GpuLoan| unsafe { image_in(image, l.len()) };
        // SAFETY: `loan` is not null (checked) and points to a handle; `seq` as documented.
        unsafe { publish_loan(p, loan, seq, fields) }
    })
}

/// Publishes an image whose data is the `len` bytes at `data` (copied before the call
/// returns; `len` must be `image->step * image->height`). `seq` as in
/// `zcs_ros_publisher_publish_image`.
///
/// # Safety
/// `image` as in `zcs_ros_publisher_publish_image`; `data` points to `len` readable
/// bytes (anything when `len` is 0); `seq` is NULL or points to an `int64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_publish_image_host(
    publisher: zcs_ros_publisher_t,
    image: *const zcs_ros_image_t,
    data: *const u8,
    len: usize,
    seq: *mut i64,
) -> zcs_result_t {
    guard(|| {
        // SAFETY: the caller's contract.
        let data = unsafe { bytes_arg(data, len) }?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = entry.image()?;
        // SAFETY: the caller's contract.
        let msg = unsafe { image_in(image, len) }?;
        let report = p.publish_host(&msg, data).map_err(|e| publish_failed(&e))?;
        // SAFETY: NULL or a writable `int64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// Publishes an ExperimentalTensor whose data is the whole of `loan` (a loan of this
/// publisher, written), as `tensor` describes it: the description must fit the loan's
/// length, and a device it names (`device_type` not 0) must be the loan's memory. The
/// loan's handle and `seq` as in `zcs_ros_publisher_publish_image`.
///
/// # Safety
/// `tensor` as `zcs_tensor_t` says for publishing; `loan` is NULL or points to a
/// handle; `seq` is NULL or points to an `int64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_publish_tensor(
    publisher: zcs_ros_publisher_t,
    tensor: *const zcs_tensor_t,
    loan: *mut zcs_loan_t,
    seq: *mut i64,
) -> zcs_result_t {
    guard(|| {
        non_null(loan, "loan")?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = entry.tensor()?;
        // SAFETY: `tensor` as documented (the caller's contract).
        let fields = |l: &GpuLoan| unsafe { tensor_in(tensor, device_of(l), l.len()) };
        // SAFETY: `loan` is not null (checked) and points to a handle; `seq` as documented.
        unsafe { publish_loan(p, loan, seq, fields) }
    })
}

/// Publishes an ExperimentalTensor whose data is the `len` bytes at `data` (copied
/// before the call returns), as `tensor` describes it (host memory: `device_type` 0 or
/// `kDLCPU`). `seq` as in `zcs_ros_publisher_publish_image`.
///
/// # Safety
/// `tensor` as `zcs_tensor_t` says for publishing; `data` points to `len` readable
/// bytes (anything when `len` is 0); `seq` is NULL or points to an `int64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_publish_tensor_host(
    publisher: zcs_ros_publisher_t,
    tensor: *const zcs_tensor_t,
    data: *const u8,
    len: usize,
    seq: *mut i64,
) -> zcs_result_t {
    guard(|| {
        // SAFETY: the caller's contract.
        let data = unsafe { bytes_arg(data, len) }?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = entry.tensor()?;
        // SAFETY: the caller's contract.
        let msg = unsafe { tensor_in(tensor, Device::CPU, len) }?;
        let report = p.publish_host(&msg, data).map_err(|e| publish_failed(&e))?;
        // SAFETY: NULL or a writable `int64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// Undeclares a publisher and zeroes its handle. Its loans not yet published stay
/// valid until dropped.
///
/// # Safety
/// `publisher` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_publisher_drop(publisher: *mut zcs_ros_publisher_t) -> zcs_result_t {
    // SAFETY: `publisher` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&PUBLISHERS, publisher, "ROS publisher") })
}
