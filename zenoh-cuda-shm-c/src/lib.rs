//! The C ABI of zenoh-cuda-shm (`include/zenoh_cuda_shm.h`, generated from this crate).
//!
//! Conventions, for C and C++ callers:
//!
//! - Every function returns a [`zcs_result_t`]: `ZCS_OK` (0) or a negative code; after an
//!   error, [`zcs_last_error`] gives this thread's message (with its causes).
//! - Objects are handles (`zcs_session_t`, `zcs_publisher_t`, …): a 64-bit id in a
//!   struct, never a pointer. A zeroed handle is null. A handle that was closed, dropped
//!   or never valid is refused with `ZCS_ERR_STALE`, so a double free or a use after
//!   close is an error, not a crash. Functions that end an object take a pointer to its
//!   handle and zero it.
//! - Owned results come through out-parameters, written only on success.
//! - No panic crosses the boundary: one is caught and returned as `ZCS_ERR_PANIC`.
//! - Handles may be used from any thread.
//!
//! Layers: `error.rs` (codes, the thread's last error, the panic guard), `handle.rs`
//! (the registries of live objects), then one file per object, and `ros/` for ROS 2
//! nodes, publishers, subscriptions and their messages.

#![allow(non_camel_case_types)]

mod description;
mod error;
mod handle;
mod publisher;
mod sample;
mod session;
mod subscriber;
mod tensor;
// Last, so that its items come after the others in the generated header.
mod ros;

pub use description::zcs_tensor_t;
pub use error::*;
pub use publisher::*;
pub use ros::*;
pub use sample::*;
pub use session::*;
pub use subscriber::*;
pub use tensor::*;
