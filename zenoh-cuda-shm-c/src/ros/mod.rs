//! ROS 2 over rmw_zenoh: a node, and publishers and subscriptions of
//! `sensor_msgs/msg/Image` and `tensor_msgs/msg/ExperimentalTensor`, over the library's
//! `ros2` module (`docs/ros2.md`).
//!
//! One publisher, subscriber and sample handle type serves both message types: the
//! type is chosen at declaration (`…_declare_image`, `…_declare_tensor`), and a call
//! for the other type is `ZCS_ERR_INVALID`. A message's data is a loan of the
//! publisher (`zcs_loan_t`, written as any loan) or host bytes; a received message's
//! data that came by our channel is also a `zcs_sample_t`, so the sample functions
//! (`zcs_sample_read`, …) read it where it lies.
//!
//! Files: `qos.rs` (the QoS profile), `node.rs`, `message.rs` (the fields of both
//! types, to and from C), `publisher.rs`, `subscriber.rs`, `sample.rs`.

mod message;
mod node;
mod publisher;
mod qos;
mod sample;
mod subscriber;

pub use message::*;
pub use node::*;
pub use publisher::*;
pub use qos::*;
pub use sample::*;
pub use subscriber::*;

use zenoh_cuda_shm_ros2::RosDeclareError;

use crate::error::{Error, ZCS_ERR_INVALID, chain};

/// A failed declaration of a node, publisher or subscription: `ZCS_ERR_INVALID` for a
/// name that is not a ROS name (or a `ROS_DOMAIN_ID` that is not a number), else
/// `ZCS_ERR_FAILED`.
fn declare_failed(what: &str, e: &RosDeclareError) -> Error {
    match e {
        RosDeclareError::Name(_) | RosDeclareError::DomainId(_) => {
            Error::new(ZCS_ERR_INVALID, format!("{what}: {}", chain(e)))
        }
        _ => Error::failed(what, e),
    }
}

/// The two message types, named in messages.
const IMAGE: &str = "sensor_msgs/msg/Image";
const TENSOR: &str = "tensor_msgs/msg/ExperimentalTensor";

/// `ZCS_ERR_INVALID` for a handle of the other message type.
fn wrong_type(what: &str, is: &str, wanted: &str) -> Error {
    Error::new(ZCS_ERR_INVALID, format!("this {what} is of {is}, not {wanted}"))
}
