//! The block pool: size classes, generations, capabilities, leases, back-pressure,
//! recycling and trimming, over any [`Backend`].
//!
//! ```
//! # use zcs_pool::{HostBackend, Pool, PoolConfig, HolderId};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = Pool::new(HostBackend::default(), PoolConfig::default())?;
//! let loan = pool.loan(3 << 20)?;            // 3 MiB → two 2 MiB granules
//! assert_eq!(loan.capacity(), 4 << 20);
//! let published = loan.publish();           // the publisher's own hold
//! let reader = HolderId::new(7);
//! published.lease(reader)?;                 // a subscriber's hold, charged before the put
//! let key = published.key();
//! drop(published);                          // still held by the subscriber…
//! assert_eq!(pool.stats().blocks_in_use, 1);
//! pool.release(key, reader)?;               // …until it releases
//! assert_eq!(pool.stats().blocks_in_use, 0);
//! # Ok(()) }
//! ```
//!
//! # Life of a block
//! `Free` → [`Pool::loan`] → `Loaned` (one writer; generation bumped, new random
//! capability) → [`Loan::publish`] → `Held` (by the publisher's [`Published`] handles
//! and by every holder given a [`Published::lease`]) → `Free` once no hold remains.
//! A hold released with a [`Fence`] stays until the fence completes (GPU work that
//! still touches the block has finished); the recycler thread polls the fences, so no
//! caller ever blocks on the GPU and no slow release delays another
//! (no head-of-line blocking). A holder that disappears (a subscriber's connection
//! closes) is released at once with [`Pool::release_holder`].
//!
//! # Back-pressure
//! The pool never exceeds [`PoolConfig::max_bytes`] or [`PoolConfig::max_blocks`].
//! [`Pool::loan`] takes, in order: a free block of the exact size class; a new block if
//! the caps allow; a free block of up to twice the class; room made by freeing the
//! oldest idle blocks of other classes (a larger free block can always be evicted to
//! make room, so no larger block is ever used beyond twice the class). Failing all of these it waits for a block to come back, at most
//! [`PoolConfig::loan_timeout_ms`], then returns [`LoanError::Exhausted`]. A failed
//! device allocation (out of memory) frees idle blocks and retries once, then returns
//! [`LoanError::Alloc`]. One holder may hold at most
//! [`PoolConfig::max_holds_per_holder`] blocks: beyond that [`Published::lease`]
//! refuses, and the transport waits for that subscriber ([`Published::wait_lease_room`])
//! or serves it differently (a slow reader cannot pin the whole pool).
//!
//! Idle blocks are trimmed by the recycler: a block free for longer than
//! [`PoolConfig::idle_trim_ms`] is released, except for the most recently used
//! [`PoolConfig::keep_idle_bytes`].

pub mod backend;
mod errors;
mod fence;
mod handle;
mod ids;
mod loan;
pub mod recycler;
pub mod signal;
mod state;

// The layer below, under the names the modules of this crate use.
pub(crate) use zcs_memory::{cuda, error, host, sync};

pub use backend::{
    AllocError, Backend, BackendKind, BlockMemory, BorrowError, Borrowed, CudaBackend, HostBackend, Lender, LentMemory,
    MappedMemory, Sourced,
};

pub use errors::*;
pub use fence::Fence;
pub use handle::*;
pub use ids::*;
pub use loan::*;
pub use state::PoolStats;
use state::*;

/// Pool limits and timings. Every field has a documented default.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Most bytes the pool allocates in all (default 4 GiB).
    pub max_bytes: u64,
    /// Most blocks the pool allocates (default 1024).
    pub max_blocks: usize,
    /// How long a loan waits for a block to come back when at the caps
    /// (default 1000 ms). 0 means fail at once.
    pub loan_timeout_ms: u64,
    /// A block free for longer than this is released by the recycler (default 10 s).
    pub idle_trim_ms: u64,
    /// Free bytes kept despite `idle_trim_ms`, most recently used first (default 256 MiB).
    pub keep_idle_bytes: u64,
    /// Most blocks one holder (e.g. one subscriber process) may hold (default 64).
    pub max_holds_per_holder: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_bytes: 4 << 30,
            max_blocks: 1024,
            loan_timeout_ms: 1000,
            idle_trim_ms: 10_000,
            keep_idle_bytes: 256 << 20,
            max_holds_per_holder: 64,
        }
    }
}

/// The size class for `len` bytes: whole granules, and above four granules rounded
/// to a quarter of the enclosing power of two, so no block wastes more than 25%.
pub fn size_class(len: usize, granularity: usize) -> Option<usize> {
    let g = len.max(1).div_ceil(granularity);
    let class = if g <= 4 {
        g
    } else {
        let log2 = usize::BITS - 1 - g.leading_zeros();
        g.checked_next_multiple_of(1usize << (log2 - 2))?
    };
    class.checked_mul(granularity)
}

#[cfg(all(test, not(feature = "loom-model")))]
mod tests;

#[cfg(all(test, feature = "loom-model"))]
mod loom_tests;
