//! Zero-copy CUDA device buffers between processes, over Zenoh.
//!
//! Layers, lowest first; each uses only the ones before it. The lower ones are crates of
//! their own, so the compiler keeps them to that order:
//!
//! | where | what |
//! |---|---|
//! | crate `zcs-memory` ([`cuda`]) | RAII owners over the CUDA driver and over sealed host memory (memfd) |
//! | crate `zcs-pool` | blocks with size classes, generations, capabilities, leases, back-pressure, recycling; ready signals |
//! | crate `zcs-wire` | the Unix-socket control channel (framing, FD passing, peer credentials) and the protocol (keys, tokens, descriptors, control messages) |
//! | crate `zcs-provider` ([`provider`]) | the host's block provider (the zenohd plugin runs one) and its clients |
//! | crate `zcs-transport` ([`config`]) | per-put routing, handshakes, import caches, leases per connection, the received sample |
//! | [`sample`] | [`GpuSample`]: a received message, read in place on a stream, as host bytes or copied |
//! | [`api`] | [`GpuSession`], [`GpuPublisher`], [`GpuSubscriber`] |
//! | [`tensor`] | tensors: publish with a DLPack description, receive views and copies |
//! | [`dlpack`] | the DLPack C ABI: export received tensors, publish frameworks' tensors |
//!
//! The layer crates are not a stable API; what applications need of them is
//! re-exported here. ROS 2 over rmw_zenoh is the crate `zenoh-cuda-shm-ros2`, above
//! this one.
//!
//! See `docs/architecture.md` for the design and `docs/safety.md` for every invariant
//! the `unsafe` code relies on.

// The crate applications use: every public item documented, with the errors and panics
// of every fallible function (CI runs clippy with `-D warnings`).
#![deny(missing_docs)]
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc, clippy::missing_safety_doc)]

pub mod api;
/// The CUDA layer (crate `zcs-memory`): devices, streams, VMM blocks, events, copies.
pub mod cuda {
    pub use zcs_memory::cuda::{
        CudaError, DeviceBlock, Fence, Filling, Gpu, GpuUuid, ImportedBlock, IpcEvent, ProbeError, Stream, Topology,
        VmmMapping, copy, device, event, topology, vmm, warm_import_path,
    };
}
pub mod dlpack;
pub mod sample;
pub mod tensor;

pub use zcs_memory::error;
pub use zcs_provider as provider;
pub use zcs_transport::config;

// The layers below, under the names the modules of this crate use.
pub(crate) use zcs_memory::{host, sync};
pub(crate) use zcs_pool::{self as pool, signal};
pub(crate) use zcs_transport as transport;
pub(crate) use zcs_wire::{ipc, protocol};

pub use api::{GpuLoan, GpuPublisher, GpuSession, GpuSubscriber, OpenError, PublishError, RecvError, WriteError};
pub use config::ZcsConfig;
pub use pool::{AllocError, BackendKind, LoanError, PoolConfig, PoolError, PoolStats};
pub use protocol::ProcessReport;
pub use sample::{DeviceRead, GpuSample, Path, ReadError, SampleInfo};
pub use signal::SignalError;
pub use tensor::{HostTensor, OwnedTensor, TensorPublishError, TensorReadError, TensorView};
/// The tensor metadata crate ([`tensor_codec::TensorMeta`], [`tensor_codec::DType`], …).
pub use tensor_codec;
pub use transport::publisher::{BlockHolder, DeclareError, PublisherStats, PutError, PutReport};
pub use transport::shm_out::ShmOutError;
pub use transport::subscriber::SubscriberStats;

/// The repository's README: its Rust example is compiled and run as a doc test (on host
/// memory without a GPU), so that the first code a user copies cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExample;
