//! ROS nodes: a name in a namespace and a domain, on a session.

use std::ffi::c_char;

use zenoh_cuda_shm_ros2::{NodeOptions, RosNode};

use crate::error::{guard, non_null, set_out, str_arg, zcs_result_t};
use crate::handle::{Registry, end};
use crate::session::{SESSIONS, zcs_session_t};

/// A ROS node.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_ros_node_t {
    /// The handle (0: null).
    pub id: u64,
}

/// `zcs_ros_node_create`'s domain: `ROS_DOMAIN_ID` from the environment, else 0.
pub const ZCS_ROS_DOMAIN_FROM_ENV: u32 = u32::MAX;

pub(crate) static NODES: Registry<RosNode> = Registry::new("ROS node");

/// Creates a node named `name` (one ROS name token: letters, digits, `_`) in
/// `namespace_` (NULL: `/`; else absolute, e.g. `/robot1`) of ROS domain `domain`
/// (`ZCS_ROS_DOMAIN_FROM_ENV`: `ROS_DOMAIN_ID`, else 0) on `session`: it appears in
/// the domain's graph (`ros2 node list`) until dropped. A name that is not a ROS name
/// is `ZCS_ERR_INVALID`, with the rule it breaks.
///
/// # Safety
/// `name` and `namespace_` are NULL or NUL-terminated; `out` is NULL or points to a
/// handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_node_create(
    session: zcs_session_t,
    name: *const c_char,
    namespace_: *const c_char,
    domain: u32,
    out: *mut zcs_ros_node_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let name = unsafe { str_arg(name, "name") }?;
        let namespace = match namespace_.is_null() {
            true => "/",
            // SAFETY: as above.
            false => unsafe { str_arg(namespace_, "namespace_") }?,
        };
        let s = SESSIONS.get(session.id)?;
        let mut options = NodeOptions::new(name).namespace(namespace);
        if domain != ZCS_ROS_DOMAIN_FROM_ENV {
            options = options.domain(domain);
        }
        let node =
            RosNode::new(&s, options).map_err(|e| super::declare_failed(&format!("create node {name:?}"), &e))?;
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, zcs_ros_node_t { id: NODES.insert(node) }) };
        Ok(())
    })
}

/// The node's ROS domain id (the one `ZCS_ROS_DOMAIN_FROM_ENV` found).
///
/// # Safety
/// `out` is NULL or points to a `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_node_domain(node: zcs_ros_node_t, out: *mut u32) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let n = NODES.get(node.id)?;
        // SAFETY: not null (checked above); the caller passes a writable value.
        unsafe { set_out(out, n.domain()) };
        Ok(())
    })
}

/// Drops this handle of a node and zeroes it. Publishers and subscriptions declared
/// from it keep the node in the graph until they are dropped.
///
/// # Safety
/// `node` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_node_drop(node: *mut zcs_ros_node_t) -> zcs_result_t {
    // SAFETY: `node` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&NODES, node, "ROS node") })
}
