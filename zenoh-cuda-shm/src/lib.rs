//! Zero-copy CUDA device buffers between processes, over Zenoh.
//!
//! Layers, each using only the ones below it:
//!
//! | module | what |
//! |---|---|
//! | [`cuda`] | RAII owners over the CUDA driver: devices, VMM blocks, events, stream memory ops |
//! | [`host`] | OS calls: sealed memfds, boot id |
//! | [`pool`] | blocks with size classes, generations, capabilities, leases, back-pressure, recycling |
//! | [`signal`] | stream-ordered ready signals and the read/write guards built on them |
//! | [`ipc`] | the Unix-socket control channel: framing, FD passing, peer credentials |
//!
//! See `docs/architecture.md` for the design and `docs/safety.md` for every invariant
//! the `unsafe` code relies on.

pub mod cuda;
pub mod host;
pub mod ipc;
pub mod pool;
pub mod signal;
