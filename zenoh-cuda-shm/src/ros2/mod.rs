//! ROS 2 over rmw_zenoh (feature `ros2`): a Rust process as a well-formed participant
//! of an rmw_zenoh graph, publishing and receiving `sensor_msgs/msg/Image` and
//! `tensor_msgs/msg/ExperimentalTensor` whose data may stay on the GPU.
//!
//! - [`RosNode`] declares the node token (`@ros2_lv/<domain>/<zid>/<nid>/<nid>/NN/…`)
//!   and watches the domain's graph tokens.
//! - [`RosPublisher`] declares an `MP` token and publishes each message on **our
//!   channel** (`<base key>/@zcs_ros2`, zero-copy to our subscriptions on the same GPU)
//!   and, while ordinary ROS subscriptions exist, as CDR with the 33-byte rmw_zenoh
//!   attachment on the **base key** `<domain>/<topic>/<pkg>::msg::dds_::<Msg>_/RIHS01_<hash>`.
//! - [`RosSubscriber`] declares an `MS` token (and a marker saying it takes our
//!   channel), and receives from both: our publishers through the channel, every other
//!   ROS publisher through the base key, each message once.
//!
//! `@zcs_ros2` is a verbatim chunk: `**` never matches it, so nothing of rmw_zenoh
//! (which subscribes to the exact base key and, on Rolling, uses `<base>/_buf_cpu` and
//! `<base>/_buf/<gid>`) ever sees our descriptors. Wire details: `docs/ros2.md`.
//!
//! ```no_run
//! use zenoh_cuda_shm::ros2::{NodeOptions, Qos, RosNode};
//! use zenoh_cuda_shm::tensor_codec::cdr::{Header, Image};
//! use zenoh_cuda_shm::{GpuSession, ZcsConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let session = GpuSession::open(zenoh::Config::default(), ZcsConfig::default()).wait()?;
//! let node = RosNode::new(&session, NodeOptions::new("camera_driver"))?;
//! let publisher = node.publisher::<Image<()>>("/camera/image", Qos::reliable(10))?;
//!
//! let fields = Image { header: Header::default(), height: 1080, width: 1920,
//!     encoding: "rgba8".into(), is_bigendian: 0, step: 1920 * 4, data: () };
//! let loan = publisher.loan(1920 * 1080 * 4)?;
//! // enqueue kernels writing loan.device_ptr() on loan.stream() …
//! publisher.publish(&fields, loan)?;
//!
//! let subscriber = node.subscriber::<Image<()>>("/camera/image", Qos::reliable(10))?;
//! let sample = subscriber.recv()?;
//! println!("{}x{} by the {} path", sample.msg().width, sample.msg().height, sample.path());
//! # Ok(()) }
//! ```

pub mod attachment;
mod graph;
pub mod message;
pub mod names;
mod node;
mod publisher;
mod subscriber;

pub use attachment::{ATTACHMENT_LEN, Attachment, AttachmentError};
pub use graph::{MARKER_PREFIX, marker_token};
pub use message::{EnvelopeError, RosDataMessage};
pub use names::{Durability, Entity, EntityKind, History, Liveliness, NameError, Qos, Reliability, TopicInfo};
pub use node::{NodeOptions, RosDeclareError, RosNode};
pub use publisher::{RosPublishError, RosPublisher, RosPublisherStats, RosPutReport};
pub use subscriber::{RosSample, RosSubscriber, RosSubscriberStats};

/// The verbatim chunk of our channel under a topic's base key.
pub const CHANNEL_CHUNK: &str = "@zcs_ros2";

/// Our channel's key for a base key: `<base key>/@zcs_ros2`.
pub fn channel_key(base_key: &str) -> String {
    format!("{base_key}/{CHANNEL_CHUNK}")
}
