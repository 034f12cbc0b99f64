//! ROS 2 over rmw_zenoh, on zenoh-cuda-shm: a Rust process as a well-formed participant
//! of an rmw_zenoh graph, publishing and receiving `sensor_msgs/msg/Image` and
//! `tensor_msgs/msg/ExperimentalTensor` whose data may stay on the GPU, and
//! `std_msgs/msg/String` ([`StringMsg`](zenoh_cuda_shm::tensor_codec::cdr::StringMsg), its
//! text as the data).
//!
//! - [`RosNode`] declares the node token (`@ros2_lv/<domain>/<zid>/<nid>/<nid>/NN/…`),
//!   watches the domain's graph tokens, resolves topic names as rcl does, and reports
//!   publishers that never reach a subscription ([`SilentPublisher`]).
//! - [`RosPublisher`] declares an `MP` token and publishes each message on **our
//!   channel** (`<base key>/@zcs_ros2`, zero-copy to our subscriptions on the same GPU)
//!   and, while ordinary ROS subscriptions exist, as CDR with the 33-byte rmw_zenoh
//!   attachment on the **base key** `<domain>/<topic>/<pkg>::msg::dds_::<Msg>_/RIHS01_<hash>`,
//!   which every rmw_zenoh subscription of every release hears.
//! - [`RosSubscriber`] declares an `MS` token (and a marker saying it takes our
//!   channel), and receives from all: our publishers through the channel, other ROS
//!   publishers through the base key, and buffer-aware rmw_zenoh publishers (0.10.5 /
//!   0.12.0 and later) through `<base key>/_buf_cpu`, each message once.
//! - On the buffer-aware wire (Lyrical 0.10.5+, Rolling 0.12.0+), volatile endpoints of
//!   types with a top-level `uint8[]` list the `cpu` backend in their tokens
//!   ([`backends`]), as rmw_zenoh's buffer-aware endpoints do; on Jazzy and Kilted they
//!   list none, so that those releases hash our tokens to our GIDs ([`RmwWire`], from
//!   `ROS_DISTRO`). On Humble (rmw_zenoh 0.1.2 and later) they list none either, and
//!   base keys and tokens carry `TypeHashNotSupported` in place of the type hash, as
//!   Humble's do. GIDs are those rmw_zenoh computes ([`names::gid_of`]).
//! - [`cuda_backend`]: blocks of ROS 2's CUDA buffer backend (`rosidl::Buffer`)
//!   imported into this process and read in place after their writer's event (our
//!   subscriptions that list `cuda`), and our blocks lent to that backend's
//!   subscriptions (our publishers).
//!
//! `@zcs_ros2` (and `@zcs_ros2_end`, our publishers' [end notices](end_key)) are
//! verbatim chunks: `**` never matches them, so nothing of rmw_zenoh
//! (which subscribes to exact keys: the base key, `<base>/_buf_cpu`, `<base>/_buf/<gid>`)
//! ever sees our descriptors. Wire details: `docs/ros2.md`.
//!
//! ```no_run
//! use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RosNode};
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

// The crate applications use: every public item documented, with the errors and panics
// of every fallible function (CI runs clippy with `-D warnings`).
#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc, clippy::missing_safety_doc)]

pub mod attachment;
pub mod backends;
pub mod cuda_backend;
mod distro;
mod graph;
pub mod message;
pub mod names;
mod node;
mod publisher;
mod qos;
pub mod resolve;
mod silence;
mod subscriber;

pub use attachment::{ATTACHMENT_LEN, Attachment, AttachmentError};
pub use backends::{Backends, BackendsError};
pub use distro::{RmwWire, UnknownDistro};
pub use graph::{MARKER_PREFIX, marker_token, publisher_marker_token};
pub use message::{DataField, EnvelopeError, RosDataMessage, check_data};
pub use names::{Entity, EntityKind, NameError, TopicInfo};
pub use node::{DEFAULT_SILENCE_WINDOW, GraphView, NodeOptions, RosDeclareError, RosNode};
pub use publisher::{RosPublishError, RosPublisher, RosPublisherStats, RosPutReport};
pub use qos::{Durability, History, Liveliness, Qos, Reliability};
pub use silence::{SilenceReason, SilentPublisher, silence_token};
pub use subscriber::{KEEP_ALL_WARN, RosSample, RosSubscriber, RosSubscriberStats};

// The layers below, under the names the modules of this crate use.
pub(crate) use zcs_memory::sync;
pub(crate) use zcs_pool as pool;
pub(crate) use zcs_transport as transport;
pub(crate) use zenoh_cuda_shm::{GpuSession, api, config, error, sample};

/// The verbatim chunk of our channel under a topic's base key.
pub const CHANNEL_CHUNK: &str = "@zcs_ros2";

/// Our channel's key for a base key: `<base key>/@zcs_ros2`.
pub fn channel_key(base_key: &str) -> String {
    format!("{base_key}/{CHANNEL_CHUNK}")
}

/// The verbatim chunk under a topic's base key where our publishers put their end
/// notice.
pub const END_CHUNK: &str = "@zcs_ros2_end";

/// Where a publisher of ours says, when it is dropped, which sequence number it ended
/// at: `<base key>/@zcs_ros2_end`, an empty sample whose rmw_zenoh attachment names the
/// publisher's GID and its last message. Our subscriptions count what they missed of
/// that tail as lost; nothing of rmw_zenoh subscribes there.
pub fn end_key(base_key: &str) -> String {
    format!("{base_key}/{END_CHUNK}")
}

/// The key on which buffer-aware rmw_zenoh publishers (0.10.5 / 0.12.0 and later) put
/// plain CDR for every CPU-only buffer-aware subscription: `<base key>/_buf_cpu`.
pub fn buf_cpu_key(base_key: &str) -> String {
    format!("{base_key}/_buf_cpu")
}
