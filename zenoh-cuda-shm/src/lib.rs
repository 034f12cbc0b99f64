//! Zero-copy CUDA device buffers between processes, over Zenoh.
//!
//! Layers, each using only the ones below it:
//!
//! | module | what |
//! |---|---|
//! | [`cuda`] | RAII owners over the CUDA driver: devices, VMM blocks, events, copies on a stream |
//! | `host` | OS calls: sealed memfds, boot id |
//! | `pool` | blocks with size classes, generations, capabilities, leases, back-pressure, recycling |
//! | `signal` | stream-ordered ready signals and the read/write guards built on them |
//! | `ipc` | the Unix-socket control channel: framing, FD passing, peer credentials |
//! | `protocol` | key layout, liveliness tokens, descriptors, control messages (versioned) |
//! | `transport` | per-put routing, handshakes, import caches, leases per connection |
//! | [`provider`] | the host's block provider (the zenohd plugin runs one) and its clients |
//! | [`api`] | [`GpuSession`], [`GpuPublisher`], [`GpuSubscriber`], [`GpuSample`] |
//! | [`tensor`] | tensors: publish with a DLPack description, receive views and copies |
//! | [`dlpack`] | the DLPack C ABI: export received tensors, publish frameworks' tensors |
//! | `ros2` | (feature `ros2`) ROS 2 over rmw_zenoh: graph tokens, CDR on the base key, GPU channel beside it |
//!
//! The layers without a link are internal: private, unless feature `internals` makes
//! them public for this workspace's router plugin, tests and benchmarks. They are not a
//! stable API; what applications need of them is re-exported here. Feature
//! `test-support` adds what only test suites and demos need (fault injection, resource
//! counters, the pattern kernels of [`cuda`]).
//!
//! See `docs/architecture.md` for the design and `docs/safety.md` for every invariant
//! the `unsafe` code relies on.

/// An internal layer (see the crate docs): public with feature `internals`, private
/// otherwise. Without the feature, items only the workspace's other crates use are
/// unused here, hence the `allow`.
macro_rules! internal_layer {
    ($name:ident) => {
        #[cfg(feature = "internals")]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        #[allow(dead_code, unused_imports)]
        pub(crate) mod $name;
    };
}

pub mod api;
pub mod config;
pub mod cuda;
pub mod dlpack;
pub mod error;
internal_layer!(host);
internal_layer!(ipc);
internal_layer!(pool);
internal_layer!(protocol);
pub mod provider;
#[cfg(feature = "ros2")]
pub mod ros2;
pub mod sample;
internal_layer!(signal);
mod sync;
pub mod tensor;
#[cfg(feature = "test-support")]
pub mod test_support;
internal_layer!(transport);

pub use api::{GpuLoan, GpuPublisher, GpuSession, GpuSubscriber, OpenError, PublishError, RecvError, WriteError};
pub use config::ZcsConfig;
pub use pool::{AllocError, BackendKind, LoanError, PoolConfig, PoolError, PoolStats};
pub use protocol::ProcessReport;
pub use sample::{DeviceRead, GpuSample, Path, ReadError, SampleInfo};
pub use signal::SignalError;
pub use tensor::{HostTensor, OwnedTensor, TensorPublishError, TensorReadError, TensorView};
/// The tensor metadata crate ([`tensor_codec::TensorMeta`], [`tensor_codec::DType`], …).
pub use tensor_codec;
pub use transport::publisher::{DeclareError, PublisherStats, PutError, PutReport};
pub use transport::shm_out::ShmOutError;
pub use transport::subscriber::SubscriberStats;

/// The repository's README: its Rust example is compiled and run as a doc test (on host
/// memory without a GPU), so that the first code a user copies cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExample;
