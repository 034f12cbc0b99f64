//! The wire of zenoh-cuda-shm between processes of one host: the Unix-socket control
//! channel, and the protocol spoken on it and on Zenoh.
//!
//! | module | what |
//! |---|---|
//! | [`ipc`] | the control channel: framing, FD passing, peer credentials, socket names, lifelines |
//! | [`protocol`] | key layout, liveliness tokens, descriptors, control and provider messages (versioned) |
//! | [`rosidl_cuda`] | ROS 2's CUDA buffer backend's host-side objects: block FD sockets, shared block counts |
//!
//! Not a stable API: applications use the `zenoh-cuda-shm` crate.

pub mod ipc;
pub mod protocol;
pub mod rosidl_cuda;

// The layers below, under the names the modules of this crate use.
pub(crate) use zcs_memory::{cuda, error, host, sync};
pub(crate) use zcs_pool as pool;
