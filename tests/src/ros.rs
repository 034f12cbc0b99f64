//! ROS 2 test sessions: a node of ours on host memory and a raw Zenoh session that plays
//! the other participants, on loopback TCP.

use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuSession, ZcsConfig};
use zenoh_cuda_shm_ros2::{NodeOptions, RosNode};

use super::{free_tcp_port, loopback_zenoh_config};

/// A node of `options` (which must name a domain; puts under it block rather than drop)
/// in a host-memory session, and a raw session connected to it.
///
/// # Panics
/// When `options` names no domain, or a session or the node cannot be opened.
pub fn host_node(options: NodeOptions) -> (RosNode, zenoh::Session) {
    let domain = options.domain.expect("a domain");
    let port = free_tcp_port();
    let ours = GpuSession::open(
        loopback_zenoh_config(Some(port), None, Some(&domain.to_string())),
        ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() },
    )
    .wait()
    .expect("our session");
    let raw = zenoh::open(loopback_zenoh_config(None, Some(port), None)).wait().expect("a raw session");
    (RosNode::new(&ours, options).expect("our node"), raw)
}
