//! ROS 2's CUDA buffer backend (`cuda_buffer_backend` 0.1.2 of
//! ros2/rosidl_buffer_backends) from our side: its blocks imported into this process
//! ([`BackendImports`]), read in place on our streams after its writer's IPC event, and
//! given back to its pool as its own subscribers give them back; and our blocks lent to
//! its subscriptions in its format ([`ExportError`] says why one was not). The facts
//! this relies on, with their sources: `docs/cuda-buffer-backend.md`.
//!
//! | file | what |
//! |---|---|
//! | `import.rs` | a descriptor's block imported, counted and read ([`BackendImports`]) |
//! | `export.rs` | our blocks lent to their subscriptions: shared bytes, socket, event, give-back |
//! | `process.rs` | the import cache per GPU and the registry handle this process shares |
//! | `queue.rs` | the thread that imports a subscription's descriptors off Zenoh's threads |

mod export;
mod import;
mod process;
mod queue;

pub use export::{ExportError, GRACE, MAX_LENT};
pub(crate) use export::{Exports, Prepared};
pub use import::{BackendBuffer, BackendImportError, BackendImports, BackendRead};
pub(crate) use process::{Registration, imports_for};
pub(crate) use queue::{ImportQueue, spawn_importer};
