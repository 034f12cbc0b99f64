//! The host provider: one process per host (the router, through the zenohd plugin, or
//! any process that starts a [`Provider`]) owns the block pools of the host's GPUs and
//! of host memory, and lends blocks to the publishers of that host.
//!
//! Why: with in-process pools a block's memory belongs to its publisher; a publisher that
//! crashes takes its pool with it, and nothing on the host knows which blocks are still
//! being read. With a provider,
//!
//! - publishers borrow blocks (an FD once per block) and recycle them locally, exactly
//!   like owned blocks: loans, leases and generations stay in the publisher's pool, so
//!   the per-message path gains no hop;
//! - subscribers open a lent block's FD at the provider (once per block, then cached),
//!   so the provider knows every process that maps each block;
//! - when a borrower dies, each of its loans is *orphaned*: the provider keeps the block
//!   until every process that mapped it has closed it (or died), then takes it back
//!   into its pool. Readers of a dead publisher's blocks keep reading them; no block is
//!   reused under them, and none leaks.
//!
//! Processes find a provider through its liveliness token (same `boot_id` only) and use
//! it when the session's `provider` setting (`ProviderMode` of zcs-transport's `config`) allows; without one they use their own pool
//! with the same descriptors and guarantees. Wire format: `ProviderRequest` and
//! `ProviderReply` in the `protocol` module of `zcs-wire`.

mod client;
mod config;
mod server;
mod snapshot;

pub use client::{ClientError, DeviceLender, NoProvider, ProviderClient, ProviderWatch, Providers};
pub use config::{GpuSelection, ProviderConfig, ProviderError};
pub use server::Provider;
pub use snapshot::{ClientSnapshot, DeviceSnapshot, ProviderCounters, ProviderSnapshot};

// The layers below, under the names the modules of this crate use.
pub(crate) use zcs_memory::{cuda, error, host, sync};
pub(crate) use zcs_pool as pool;
pub(crate) use zcs_wire::{ipc, protocol};

#[cfg(test)]
mod tests;
