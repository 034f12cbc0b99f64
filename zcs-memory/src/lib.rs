//! The lowest layer of zenoh-cuda-shm: every CUDA driver and OS memory call, each
//! behind an RAII owner, and nothing about Zenoh.
//!
//! | module | what |
//! |---|---|
//! | [`cuda`] | devices, VMM blocks (allocated and exported, or imported from an FD), events, copies on a stream |
//! | [`host`] | sealed memfds (host-memory blocks), the boot id |
//! | [`fd_table`] | the process's descriptor table, grown once so that opening a block's descriptor never waits for it to grow |
//! | [`sync`] | the synchronisation primitives of the layers above (swapped for loom's models under `loom-model`) |
//! | [`error`] | errors as people read them: a message followed by its causes |
//!
//! Not a stable API: applications use the `zenoh-cuda-shm` crate, which re-exports
//! what they need of this one.

pub mod cuda;
pub mod error;
pub mod fd_table;
pub mod host;
pub mod sync;
