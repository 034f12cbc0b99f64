//! What can fail: loans, leases, stale releases and handouts, and making a pool.

use std::time::Duration;

use super::*;

/// A loan failed (`GpuPublisher::loan`, and the pool below it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoanError {
    /// A zero-length loan was asked for.
    #[error("cannot loan a zero-length block")]
    ZeroLength,
    /// The request alone exceeds the pool's byte cap.
    #[error("{requested} bytes exceed the pool cap of {max_bytes} bytes")]
    TooLarge {
        /// Bytes asked for (after rounding to the size class).
        requested: u64,
        /// [`PoolConfig::max_bytes`].
        max_bytes: u64,
    },
    /// At the caps, and no block came back within the timeout.
    #[error("pool exhausted: no {class}-byte block within {waited:?} ({in_use_bytes} of {max_bytes} bytes in use)")]
    Exhausted {
        /// The size class asked for.
        class: usize,
        /// How long the loan waited.
        waited: Duration,
        /// Bytes held by loans and leases.
        in_use_bytes: u64,
        /// [`PoolConfig::max_bytes`].
        max_bytes: u64,
    },
    /// The backend could not allocate, even after freeing idle blocks.
    #[error("allocation failed")]
    Alloc(#[from] AllocError),
}

/// A lease could not be added. Exhaustive on purpose: the transport handles each
/// reason its own way, and a new one must be handled there.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LeaseError {
    /// The holder already holds [`PoolConfig::max_holds_per_holder`] blocks.
    #[error("holder {holder} already holds {held} blocks (limit)")]
    HolderLimit {
        /// The holder.
        holder: u64,
        /// How many it holds.
        held: usize,
    },
    /// The holder departed ([`Pool::release_holder`]): a lease charged now would never
    /// be released. Its id stays refused for the next [`DEPARTED_MEMORY`] departures.
    #[error("holder {holder} has departed")]
    Departed {
        /// The holder.
        holder: u64,
    },
}

/// How many departed holders a pool remembers, to refuse leases for them (see
/// [`LeaseError::Departed`]). A caller that picks the holders of a put from a list and
/// then charges them cannot make that atomic with a holder's departure; a lease that
/// arrives after the departure must be refused. For one to slip through, this many
/// other holders would have to depart between the list and the charge of one put.
pub const DEPARTED_MEMORY: usize = 4096;

/// A release or FD handout named a block that is not in the state it claims.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaleError {
    /// No such block (never existed, or trimmed).
    #[error("no block {0}")]
    NoBlock(u32),
    /// The block has moved on to another generation.
    #[error("block {id} is at generation {current}, not {claimed}")]
    Generation {
        /// Block id.
        id: u32,
        /// Its generation now.
        current: u64,
        /// The generation named.
        claimed: u64,
    },
    /// The capability presented does not match.
    #[error("wrong capability for block {0}")]
    Capability(u32),
    /// The holder holds no lease on this block generation.
    #[error("holder {holder} holds no lease on block {id}")]
    NotHeld {
        /// Block id.
        id: u32,
        /// The holder.
        holder: u64,
    },
    /// The block is not published (free or still being written).
    #[error("block {0} is not published")]
    NotPublished(u32),
    /// The block is lent by the host provider: its FD is opened there.
    #[error("the block is lent by the host provider: open it there")]
    Lent,
}

/// A pool could not be made: its configuration cannot work, or its recycler thread
/// did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The recycler thread could not be started.
    #[error("cannot start the recycler thread")]
    Thread(#[source] std::io::Error),
    /// The configuration cannot work.
    #[error("invalid pool config: {0}")]
    Config(&'static str),
}
