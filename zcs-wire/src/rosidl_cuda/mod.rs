//! The host-side objects of ROS 2's CUDA buffer backend (`cuda_buffer` 0.1.2 of
//! ros2/rosidl_buffer_backends), spoken from our side: what an importer of that
//! backend's descriptors, or an exporter of ours, needs besides CUDA calls. Facts, with their sources:
//! `docs/cuda-buffer-backend.md`.
//!
//! | module | what |
//! |---|---|
//! | [`fd_socket`] | a block's FD: one byte and one `SCM_RIGHTS` FD per connection to its socket |
//! | [`block_meta`] | a block's 24 shared bytes in `/dev/shm`: subscribers' count and the reuse id |
//! | [`holds`] | our counts on those blocks, journaled so that a dead process's go back |
//! | [`registry`] | the host endpoint registry: each endpoint's GID, device ordinal and uid, read by publishers |
//! | [`server`] | our blocks' FDs served to their subscribers, from a private directory |
//!
//! What upstream does not check and we do: the socket's peer is the descriptor's
//! process and our user (`SO_PEERCRED`), the shared file is a regular file of our user
//! (no symlink followed), sizes before mapping.

pub mod block_meta;
pub mod fd_socket;
pub mod holds;
pub mod registry;
pub mod server;
mod sys;

pub use block_meta::{BlockMeta, BlockMetaError, CountHold};
pub use fd_socket::{BlockFdError, Served, receive_block_fd, serve_block_fd};
pub use holds::{Reaped, reap_dead_holders};
pub use registry::{EndpointKind, HostRegistry, RegistryError};
pub use server::{BlockServer, ServedSocket};
