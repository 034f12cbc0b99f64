//! The block pool: size classes, generations, capabilities, leases, back-pressure,
//! recycling and trimming, over any [`Backend`].
//!
//! ```
//! # use zenoh_cuda_shm::pool::{HostBackend, Pool, PoolConfig, HolderId};
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
pub(crate) mod recycler;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::Unpoisoned;
use crate::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use backend::{
    AllocError, Backend, BackendKind, BlockMemory, BorrowError, Borrowed, CudaBackend, HostBackend, Lender, LentMemory,
    MappedMemory, Sourced,
};

use recycler::{Recycler, RecyclerHandle};

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

/// Identifies a block generation: which block, which allocation behind its id, and
/// which use of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BlockKey {
    /// Block id (a slot index; reused after a block is trimmed).
    pub id: u32,
    /// Serial number of the allocation behind the id, unique in this pool: an importer
    /// caches mappings by `(id, alloc)`, so a reused id is never mistaken for the old
    /// block.
    pub alloc: u64,
    /// Generation: taken from one pool-wide counter at every loan, so it only grows,
    /// also across blocks that reuse an id (ready signals rely on this).
    pub generation: u64,
}

/// The keyed PRF behind capabilities. Its key is given to subscribers over the
/// authenticated control socket, so they can check a descriptor's capability without
/// a round trip; without the key a capability cannot be forged.
#[derive(Clone)]
pub struct CapabilityKey([u8; 16]);

impl fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CapabilityKey(..)")
    }
}

impl CapabilityKey {
    /// A fresh random key.
    pub fn random() -> Self {
        Self(rand::random())
    }
    /// The raw key, to hand to a subscriber.
    pub fn to_bytes(&self) -> [u8; 16] {
        self.0
    }
    /// A key received from a publisher.
    pub fn from_bytes(b: [u8; 16]) -> Self {
        Self(b)
    }
    /// A tag authenticating a bytes message `(publisher, seq, len)`, checked by the
    /// subscribers that hold this key (those handshaken with the publisher).
    pub fn bytes_tag(&self, publisher: u64, seq: u64, len: u64) -> u64 {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher24::new_with_key(&self.0);
        h.write_u8(0xb7); // domain separation from capabilities
        h.write_u64(publisher);
        h.write_u64(seq);
        h.write_u64(len);
        h.finish()
    }

    /// The capability of a block generation.
    pub fn capability(&self, key: BlockKey) -> u64 {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher24::new_with_key(&self.0);
        h.write_u32(key.id);
        h.write_u64(key.alloc);
        h.write_u64(key.generation);
        h.finish()
    }
}

/// Who holds a block: [`HolderId::LOCAL`] for the pool owner's own handles, another
/// value per peer connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(u64);

impl HolderId {
    /// The pool owner's own handles ([`Published`]).
    pub const LOCAL: Self = Self(0);

    /// A holder id for a peer. `0` is reserved for [`HolderId::LOCAL`].
    pub fn new(id: u64) -> Self {
        assert!(id != 0, "holder id 0 is reserved for LOCAL");
        Self(id)
    }

    /// The raw value.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Completion of GPU (or other asynchronous) work that still uses a block.
pub trait Fence: Send + 'static {
    /// Whether the work has completed. Must not block. An error (a broken context)
    /// should report `true` after logging: work on a dead context never completes.
    fn is_complete(&self) -> bool;
}

impl Fence for crate::cuda::Fence {
    fn is_complete(&self) -> bool {
        match crate::cuda::Fence::is_complete(self) {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "fence query failed; treating the work as finished");
                true
            }
        }
    }
}

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

/// A lease could not be added.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
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

/// A snapshot of the pool's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Blocks allocated now.
    pub blocks: usize,
    /// Bytes allocated now.
    pub bytes: u64,
    /// Blocks loaned or held.
    pub blocks_in_use: usize,
    /// Bytes loaned or held.
    pub bytes_in_use: u64,
    /// Loans granted since creation.
    pub loans: u64,
    /// Blocks allocated since creation.
    pub allocations: u64,
    /// Blocks released by trimming or eviction since creation.
    pub frees: u64,
    /// Loans that had to wait for a block.
    pub waits: u64,
    /// Loans that failed with [`LoanError::Exhausted`].
    pub exhausted: u64,
    /// Leases refused by the per-holder limit.
    pub holder_limit_refusals: u64,
    /// Holds dropped because their holder went away.
    pub holder_releases: u64,
    /// Releases waiting on a fence right now.
    pub pending_fences: u64,
}

#[derive(Debug)]
enum Phase {
    Free { since: Instant },
    Loaned,
    Held,
}

struct Slot<M> {
    mem: Arc<M>,
    size: usize,
    alloc: u64,
    generation: u64,
    capability: u64,
    phase: Phase,
    /// Holders and how many holds each has on the current generation.
    holds: Vec<(HolderId, u32)>,
}

struct State<M> {
    slots: Vec<Option<Slot<M>>>,
    vacant: Vec<u32>,
    /// Free block ids by size, most recently freed last.
    free: BTreeMap<usize, Vec<u32>>,
    bytes: u64,
    blocks: usize,
    bytes_in_use: u64,
    blocks_in_use: usize,
    /// Holds per holder across all blocks.
    holder_counts: BTreeMap<HolderId, usize>,
    /// The last [`DEPARTED_MEMORY`] holders released with `release_holder`, refused
    /// by `lease` (a set for lookup, a queue for the order of eviction).
    departed: BTreeSet<HolderId>,
    departed_order: VecDeque<HolderId>,
    /// Last generation handed out (pool-wide, only grows).
    generation: u64,
    /// Last allocation serial handed out.
    allocs: u64,
}

#[derive(Default)]
struct Counters {
    loans: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
    waits: AtomicU64,
    exhausted: AtomicU64,
    holder_limit_refusals: AtomicU64,
    holder_releases: AtomicU64,
    pending_fences: AtomicU64,
}

pub(crate) struct Shared<B: Backend> {
    backend: B,
    cfg: PoolConfig,
    state: Mutex<State<B::Memory>>,
    returned: Condvar,
    counters: Counters,
    recycler: RecyclerHandle,
    cap_key: CapabilityKey,
}

impl<B: Backend> Shared<B> {
    fn lock(&self) -> MutexGuard<'_, State<B::Memory>> {
        // A panic while holding the lock cannot leave the state half-updated in a way
        // that matters more than losing the pool, so poisoning is ignored.
        self.state.locked()
    }

    /// Drops one hold of `holder` on `key`; frees the block when none remain.
    fn release_now(&self, key: BlockKey, holder: HolderId) -> Result<(), StaleError> {
        let mut st = self.lock();
        let mut was_at_limit = false;
        let slot = st.slots.get_mut(key.id as usize).and_then(Option::as_mut).ok_or(StaleError::NoBlock(key.id))?;
        if slot.generation != key.generation || slot.alloc != key.alloc {
            return Err(StaleError::Generation { id: key.id, current: slot.generation, claimed: key.generation });
        }
        match slot.phase {
            Phase::Loaned if holder == HolderId::LOCAL => {}
            Phase::Held => {
                let Some(pos) = slot.holds.iter().position(|(h, _)| *h == holder) else {
                    return Err(StaleError::NotHeld { id: key.id, holder: holder.0 });
                };
                slot.holds[pos].1 -= 1;
                if slot.holds[pos].1 > 0 {
                    return Ok(());
                }
                slot.holds.swap_remove(pos);
                if holder != HolderId::LOCAL {
                    was_at_limit = dec_holder(&mut st.holder_counts, holder) >= self.cfg.max_holds_per_holder;
                }
            }
            _ => return Err(StaleError::NotHeld { id: key.id, holder: holder.0 }),
        }
        // Wakes waiting loans (a block came back) and puts waiting for this holder to
        // drop below its lease limit (`Published::wait_lease_room`).
        let slot = st.slots[key.id as usize].as_mut().expect("checked above");
        let freed = slot.holds.is_empty();
        if freed {
            Self::make_free(&mut st, key.id);
        }
        drop(st);
        if freed || was_at_limit {
            self.returned.notify_all();
        }
        Ok(())
    }

    fn make_free(st: &mut State<B::Memory>, id: u32) {
        let slot = st.slots[id as usize].as_mut().expect("live slot");
        slot.phase = Phase::Free { since: Instant::now() };
        let size = slot.size;
        st.bytes_in_use -= size as u64;
        st.blocks_in_use -= 1;
        st.free.entry(size).or_default().push(id);
    }

    /// Releases `holder`'s hold, after `fence` completes if there is one.
    fn release_after(self: &Arc<Self>, key: BlockKey, holder: HolderId, fences: Vec<Box<dyn Fence>>) {
        let pending: Vec<_> = fences.into_iter().filter(|f| !f.is_complete()).collect();
        if pending.is_empty() {
            if let Err(e) = self.release_now(key, holder) {
                tracing::warn!(error = %crate::error::Chain(&e), "internal release of a local hold failed");
            }
            return;
        }
        self.counters.pending_fences.fetch_add(1, Ordering::Relaxed);
        let this = Arc::clone(self);
        let job = recycler::Job {
            fences: pending,
            done: Box::new(move || {
                this.counters.pending_fences.fetch_sub(1, Ordering::Relaxed);
                if let Err(e) = this.release_now(key, holder) {
                    tracing::warn!(error = %crate::error::Chain(&e), "deferred release failed");
                }
            }),
        };
        self.recycler.submit(job);
    }

    /// Frees idle blocks: those idle longer than `older_than` beyond the most recent
    /// `keep_bytes`. Returns the memory to drop outside the lock.
    fn collect_idle(st: &mut State<B::Memory>, older_than: Option<Duration>, keep_bytes: u64) -> Vec<Arc<B::Memory>> {
        let now = Instant::now();
        let mut idle: Vec<(Instant, u32, usize)> = Vec::new();
        for ids in st.free.values() {
            for &id in ids {
                let slot = st.slots[id as usize].as_ref().expect("free slot");
                if let Phase::Free { since } = slot.phase {
                    idle.push((since, id, slot.size));
                }
            }
        }
        // Most recently freed first: those are kept.
        idle.sort_by_key(|i| std::cmp::Reverse(i.0));
        let mut kept = 0u64;
        let mut out = Vec::new();
        for (since, id, size) in idle {
            let old_enough = older_than.is_none_or(|d| now.duration_since(since) >= d);
            if kept + size as u64 <= keep_bytes || !old_enough {
                kept += size as u64;
                continue;
            }
            out.push(Self::remove_free(st, id));
        }
        out
    }

    fn remove_free(st: &mut State<B::Memory>, id: u32) -> Arc<B::Memory> {
        let slot = st.slots[id as usize].take().expect("free slot");
        if let Some(ids) = st.free.get_mut(&slot.size) {
            ids.retain(|&x| x != id);
            if ids.is_empty() {
                st.free.remove(&slot.size);
            }
        }
        st.vacant.push(id);
        st.bytes -= slot.size as u64;
        st.blocks -= 1;
        slot.mem
    }

    pub(crate) fn trim_idle(&self) {
        let now_idle = {
            let mut st = self.lock();
            Self::collect_idle(&mut st, Some(Duration::from_millis(self.cfg.idle_trim_ms)), self.cfg.keep_idle_bytes)
        };
        if !now_idle.is_empty() {
            let _span = tracing::debug_span!("trim", blocks = now_idle.len()).entered();
            self.counters.frees.fetch_add(now_idle.len() as u64, Ordering::Relaxed);
            drop(now_idle);
        }
    }
}

/// Drops one of `holder`'s holds from the tally; returns how many it had.
fn dec_holder(counts: &mut BTreeMap<HolderId, usize>, holder: HolderId) -> usize {
    let Some(c) = counts.get_mut(&holder) else { return 0 };
    let before = *c;
    *c -= 1;
    if *c == 0 {
        counts.remove(&holder);
    }
    before
}

/// Compares two capabilities in constant time.
fn cap_eq(a: u64, b: u64) -> bool {
    std::hint::black_box(a ^ b) == 0
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

/// A pool of exportable blocks. Cheap to clone; the recycler thread stops (and is
/// joined) when the last clone drops. Loans and published blocks outlive it safely.
pub struct Pool<B: Backend> {
    shared: Arc<Shared<B>>,
    _recycler: Arc<Recycler>,
}

impl<B: Backend> Clone for Pool<B> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared), _recycler: Arc::clone(&self._recycler) }
    }
}

impl<B: Backend> fmt::Debug for Pool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("kind", &self.shared.backend.kind()).field("stats", &self.stats()).finish()
    }
}

/// A pool could not be made (its configuration refused).
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

impl<B: Backend> Pool<B> {
    /// A pool over `backend`, with its recycler thread started.
    pub fn new(backend: B, cfg: PoolConfig) -> Result<Self, PoolError> {
        if cfg.max_blocks == 0 || cfg.max_bytes < backend.granularity() as u64 {
            return Err(PoolError::Config("max_blocks must be ≥ 1 and max_bytes ≥ one granule"));
        }
        if cfg.max_holds_per_holder == 0 {
            return Err(PoolError::Config("max_holds_per_holder must be ≥ 1"));
        }
        let (recycler, handle) =
            Recycler::start(Duration::from_millis(cfg.idle_trim_ms.clamp(10, 1000))).map_err(PoolError::Thread)?;
        let shared = Arc::new(Shared {
            backend,
            cfg,
            state: Mutex::new(State {
                slots: Vec::new(),
                vacant: Vec::new(),
                free: BTreeMap::new(),
                bytes: 0,
                blocks: 0,
                bytes_in_use: 0,
                blocks_in_use: 0,
                holder_counts: BTreeMap::new(),
                departed: BTreeSet::new(),
                departed_order: VecDeque::new(),
                generation: 0,
                allocs: 0,
            }),
            returned: Condvar::new(),
            counters: Counters::default(),
            recycler: handle,
            cap_key: CapabilityKey::random(),
        });
        let weak = Arc::downgrade(&shared);
        recycler.set_trim(Box::new(move || {
            if let Some(s) = weak.upgrade() {
                s.trim_idle();
            }
        }));
        Ok(Self { shared, _recycler: Arc::new(recycler) })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.cfg
    }

    /// The key subscribers use to verify capabilities.
    pub fn capability_key(&self) -> &CapabilityKey {
        &self.shared.cap_key
    }

    /// The size class a loan of `len` bytes gets.
    pub fn size_class(&self, len: usize) -> Option<usize> {
        size_class(len, self.shared.backend.granularity())
    }

    /// Loans a block of at least `len` bytes, waiting up to the configured timeout
    /// (see the module docs for the policy).
    pub fn loan(&self, len: usize) -> Result<Loan<B>, LoanError> {
        self.loan_timeout(len, Duration::from_millis(self.shared.cfg.loan_timeout_ms))
    }

    /// [`Pool::loan`] with an explicit timeout.
    pub fn loan_timeout(&self, len: usize, timeout: Duration) -> Result<Loan<B>, LoanError> {
        if len == 0 {
            return Err(LoanError::ZeroLength);
        }
        let sh = &self.shared;
        let cfg = &sh.cfg;
        let class = self.size_class(len).filter(|&c| c as u64 <= cfg.max_bytes).ok_or(LoanError::TooLarge {
            requested: self.size_class(len).map_or(u64::MAX, |c| c as u64),
            max_bytes: cfg.max_bytes,
        })?;
        let start = Instant::now();
        // A timeout too large to represent waits without a deadline (asked for).
        let deadline = start.checked_add(timeout);
        let mut retried_alloc = false;
        let mut waited = false;
        let mut st = sh.lock();
        loop {
            // 1. A free block of exactly this class (the most recently used: warmest).
            if let Some(id) = st.free.get_mut(&class).and_then(Vec::pop) {
                if st.free.get(&class).is_some_and(Vec::is_empty) {
                    st.free.remove(&class);
                }
                return Ok(self.grant(st, id, len));
            }
            // 2. Grow, if the caps allow.
            if st.bytes + class as u64 <= cfg.max_bytes && st.blocks < cfg.max_blocks {
                st.bytes += class as u64;
                st.blocks += 1;
                drop(st);
                let made = sh.backend.allocate(class);
                st = sh.lock();
                match made {
                    Ok(mem) => {
                        sh.counters.allocations.fetch_add(1, Ordering::Relaxed);
                        let id = match st.vacant.pop() {
                            Some(id) => id,
                            None => {
                                st.slots.push(None);
                                (st.slots.len() - 1) as u32
                            }
                        };
                        st.allocs += 1;
                        let alloc = st.allocs;
                        st.slots[id as usize] = Some(Slot {
                            mem: Arc::new(mem),
                            size: class,
                            alloc,
                            generation: 0,
                            capability: 0,
                            phase: Phase::Free { since: Instant::now() },
                            holds: Vec::new(),
                        });
                        return Ok(self.grant(st, id, len));
                    }
                    Err(e) => {
                        st.bytes -= class as u64;
                        st.blocks -= 1;
                        let idle = Shared::<B>::collect_idle(&mut st, None, 0);
                        if retried_alloc || idle.is_empty() {
                            drop(st);
                            drop(idle); // frees outside the lock
                            tracing::debug!(error = %crate::error::Chain(&e), class, "pool allocation failed");
                            return Err(LoanError::Alloc(e));
                        }
                        tracing::warn!(error = %crate::error::Chain(&e), freed = idle.len(), "allocation failed; freed idle blocks and retrying");
                        retried_alloc = true;
                        sh.counters.frees.fetch_add(idle.len() as u64, Ordering::Relaxed);
                        drop(st);
                        drop(idle);
                        st = sh.lock();
                        continue;
                    }
                }
            }
            // 3. A free block of a larger class, if it wastes at most half of itself.
            if let Some((&size, _)) = st.free.range(class..=class.saturating_mul(2)).next() {
                let ids = st.free.get_mut(&size).expect("present");
                let id = ids.pop().expect("non-empty by invariant");
                if ids.is_empty() {
                    st.free.remove(&size);
                }
                return Ok(self.grant(st, id, len));
            }
            // 4. Make room by freeing idle blocks of other classes, if that suffices.
            let free_bytes: u64 = st.free.iter().map(|(s, ids)| *s as u64 * ids.len() as u64).sum();
            let free_blocks: usize = st.free.values().map(Vec::len).sum();
            if free_blocks > 0
                && st.bytes - free_bytes + class as u64 <= cfg.max_bytes
                && st.blocks - free_blocks < cfg.max_blocks
            {
                let mut evicted = Vec::new();
                while st.bytes + class as u64 > cfg.max_bytes || st.blocks >= cfg.max_blocks {
                    // Oldest idle block first.
                    let oldest = st
                        .free
                        .values()
                        .flatten()
                        .filter_map(|&id| match st.slots[id as usize].as_ref().map(|s| &s.phase) {
                            Some(Phase::Free { since }) => Some((*since, id)),
                            _ => None,
                        })
                        .min();
                    let Some((_, id)) = oldest else { break };
                    evicted.push(Shared::<B>::remove_free(&mut st, id));
                }
                sh.counters.frees.fetch_add(evicted.len() as u64, Ordering::Relaxed);
                drop(st);
                drop(evicted);
                st = sh.lock();
                continue;
            }
            // 5. Wait for a block to come back.
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                sh.counters.exhausted.fetch_add(1, Ordering::Relaxed);
                let in_use = st.bytes_in_use;
                tracing::debug!(class, in_use, "pool exhausted");
                return Err(LoanError::Exhausted {
                    class,
                    waited: now - start,
                    in_use_bytes: in_use,
                    max_bytes: cfg.max_bytes,
                });
            }
            if !waited {
                waited = true;
                sh.counters.waits.fetch_add(1, Ordering::Relaxed);
            }
            st = match deadline {
                Some(d) => sh.returned.wait_timeout(st, d - now).unwrap_or_else(|p| p.into_inner()).0,
                None => sh.returned.wait(st).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }

    fn grant(&self, mut st: MutexGuard<'_, State<B::Memory>>, id: u32, len: usize) -> Loan<B> {
        st.generation += 1;
        let generation = st.generation;
        let slot = st.slots[id as usize].as_mut().expect("granted slot exists");
        debug_assert!(matches!(slot.phase, Phase::Free { .. }));
        let key = BlockKey { id, alloc: slot.alloc, generation };
        slot.generation = generation;
        slot.capability = self.shared.cap_key.capability(key);
        slot.phase = Phase::Loaned;
        slot.holds.clear();
        let (cap, mem, size) = (slot.capability, Arc::clone(&slot.mem), slot.size);
        st.bytes_in_use += size as u64;
        st.blocks_in_use += 1;
        drop(st);
        self.shared.counters.loans.fetch_add(1, Ordering::Relaxed);
        Loan { shared: Arc::clone(&self.shared), key, capability: cap, mem, len, fences: Vec::new(), live: true }
    }

    /// Releases one hold of `holder` on `key` (a peer said it is done). Errors name
    /// what did not match; nothing changes then.
    pub fn release(&self, key: BlockKey, holder: HolderId) -> Result<(), StaleError> {
        if holder == HolderId::LOCAL {
            return Err(StaleError::NotHeld { id: key.id, holder: 0 });
        }
        self.shared.release_now(key, holder)
    }

    /// How many blocks `holder` holds.
    pub fn holds(&self, holder: HolderId) -> usize {
        self.shared.lock().holder_counts.get(&holder).copied().unwrap_or(0)
    }

    /// Releases every hold of `holder` at once (its connection closed: exit, crash,
    /// SIGKILL). Returns how many holds were dropped.
    pub fn release_holder(&self, holder: HolderId) -> usize {
        if holder == HolderId::LOCAL {
            return 0;
        }
        let sh = &self.shared;
        let mut st = sh.lock();
        let mut dropped = 0;
        let mut freed = false;
        for id in 0..st.slots.len() {
            let Some(slot) = st.slots[id].as_mut() else { continue };
            if !matches!(slot.phase, Phase::Held) {
                continue;
            }
            if let Some(pos) = slot.holds.iter().position(|(h, _)| *h == holder) {
                dropped += slot.holds[pos].1 as usize;
                slot.holds.swap_remove(pos);
                if slot.holds.is_empty() {
                    Shared::<B>::make_free(&mut st, id as u32);
                    freed = true;
                }
            }
        }
        st.holder_counts.remove(&holder);
        if st.departed.insert(holder) {
            st.departed_order.push_back(holder);
            if st.departed_order.len() > DEPARTED_MEMORY
                && let Some(oldest) = st.departed_order.pop_front()
            {
                st.departed.remove(&oldest);
            }
        }
        drop(st);
        if freed || dropped > 0 {
            sh.returned.notify_all();
        }
        if dropped > 0 {
            sh.counters.holder_releases.fetch_add(dropped as u64, Ordering::Relaxed);
            tracing::debug!(holder = holder.0, dropped, "released every hold of a departed holder");
        }
        dropped
    }

    /// The memory of a published block, for handing its FD to a peer that presented
    /// `capability` for `key`. A block lent by the host provider is refused
    /// ([`StaleError::Lent`]): its FD is opened there, which counts who maps it.
    pub fn handout(&self, key: BlockKey, capability: u64) -> Result<Arc<B::Memory>, StaleError> {
        let st = self.shared.lock();
        let slot = st.slots.get(key.id as usize).and_then(Option::as_ref).ok_or(StaleError::NoBlock(key.id))?;
        if slot.generation != key.generation || slot.alloc != key.alloc {
            return Err(StaleError::Generation { id: key.id, current: slot.generation, claimed: key.generation });
        }
        if !cap_eq(slot.capability, capability) {
            return Err(StaleError::Capability(key.id));
        }
        if !matches!(slot.phase, Phase::Held) {
            return Err(StaleError::NotPublished(key.id));
        }
        if slot.mem.lent().is_some() {
            return Err(StaleError::Lent);
        }
        Ok(Arc::clone(&slot.mem))
    }

    /// Frees every idle block now.
    pub fn trim(&self) -> usize {
        let idle = {
            let mut st = self.shared.lock();
            Shared::<B>::collect_idle(&mut st, None, 0)
        };
        let n = idle.len();
        self.shared.counters.frees.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let c = &self.shared.counters;
        let st = self.shared.lock();
        PoolStats {
            blocks: st.blocks,
            bytes: st.bytes,
            blocks_in_use: st.blocks_in_use,
            bytes_in_use: st.bytes_in_use,
            loans: c.loans.load(Ordering::Relaxed),
            allocations: c.allocations.load(Ordering::Relaxed),
            frees: c.frees.load(Ordering::Relaxed),
            waits: c.waits.load(Ordering::Relaxed),
            exhausted: c.exhausted.load(Ordering::Relaxed),
            holder_limit_refusals: c.holder_limit_refusals.load(Ordering::Relaxed),
            holder_releases: c.holder_releases.load(Ordering::Relaxed),
            pending_fences: c.pending_fences.load(Ordering::Relaxed),
        }
    }
}

/// An exclusive loan of a block generation: the one writer.
///
/// Dropped without [`Loan::publish`], the block goes back to the pool (after any
/// fence given with [`Loan::add_fence`] completes).
pub struct Loan<B: Backend> {
    shared: Arc<Shared<B>>,
    key: BlockKey,
    capability: u64,
    mem: Arc<B::Memory>,
    len: usize,
    fences: Vec<Box<dyn Fence>>,
    live: bool,
}

impl<B: Backend> fmt::Debug for Loan<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loan")
            .field("key", &self.key)
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl<B: Backend> Loan<B> {
    /// Which block generation this is.
    pub fn key(&self) -> BlockKey {
        self.key
    }
    /// The capability a peer must present to receive this block's FD.
    pub fn capability(&self) -> u64 {
        self.capability
    }
    /// The length asked for.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length asked for is zero (never: loans refuse zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The block's size (its size class).
    pub fn capacity(&self) -> usize {
        self.mem.size()
    }
    /// Address of the block in this process.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }
    /// The block's memory.
    pub fn memory(&self) -> &Arc<B::Memory> {
        &self.mem
    }
    /// Work still using the block: it is not reused before the fence completes.
    pub fn add_fence(&mut self, fence: impl Fence) {
        self.fences.push(Box::new(fence));
    }
    /// Ends the write: the block becomes readable, held by the returned handle.
    pub fn publish(mut self) -> Published<B> {
        self.live = false;
        {
            let mut st = self.shared.lock();
            let slot = st.slots[self.key.id as usize].as_mut().expect("loaned slot exists");
            slot.phase = Phase::Held;
            slot.holds.push((HolderId::LOCAL, 1));
        }
        Published(Arc::new(PublishedInner {
            shared: Arc::clone(&self.shared),
            key: self.key,
            capability: self.capability,
            mem: Arc::clone(&self.mem),
            len: self.len,
            fences: std::sync::Mutex::new(std::mem::take(&mut self.fences)),
        }))
    }
}

impl<B: Backend> Drop for Loan<B> {
    fn drop(&mut self) {
        if self.live {
            let fences = std::mem::take(&mut self.fences);
            self.shared.release_after(self.key, HolderId::LOCAL, fences);
        }
    }
}

struct PublishedInner<B: Backend> {
    shared: Arc<Shared<B>>,
    key: BlockKey,
    capability: u64,
    mem: Arc<B::Memory>,
    len: usize,
    fences: std::sync::Mutex<Vec<Box<dyn Fence>>>,
}

impl<B: Backend> Drop for PublishedInner<B> {
    fn drop(&mut self) {
        let fences = std::mem::take(self.fences.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.shared.release_after(self.key, HolderId::LOCAL, fences);
    }
}

/// A published block: readable, held by this handle (and its clones) and by every
/// leased holder. The publisher's hold ends when the last clone drops.
pub struct Published<B: Backend>(Arc<PublishedInner<B>>);

impl<B: Backend> Clone for Published<B> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<B: Backend> fmt::Debug for Published<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Published").field("key", &self.0.key).field("len", &self.0.len).finish()
    }
}

impl<B: Backend> Published<B> {
    /// Which block generation this is.
    pub fn key(&self) -> BlockKey {
        self.0.key
    }
    /// The capability a peer must present to receive this block's FD.
    pub fn capability(&self) -> u64 {
        self.0.capability
    }
    /// The published length.
    pub fn len(&self) -> usize {
        self.0.len
    }
    /// Whether the published length is zero.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
    /// Address of the block in this process.
    pub fn addr(&self) -> u64 {
        self.0.mem.addr()
    }
    /// The block's memory.
    pub fn memory(&self) -> &Arc<B::Memory> {
        &self.0.mem
    }
    /// Local work reading the block (e.g. a device→host copy): the publisher's hold
    /// lasts until it completes.
    pub fn add_fence(&self, fence: impl Fence) {
        self.0.fences.locked().push(Box::new(fence));
    }
    /// Waits until `holder` may be charged a lease on this block: until it holds fewer
    /// than [`PoolConfig::max_holds_per_holder`] blocks (or already holds this one, or
    /// has departed: [`Published::lease`] then refuses it at once), or until `deadline`.
    /// `Ok(true)` if it had to wait, `Ok(false)` if there was room at once,
    /// [`LeaseError::HolderLimit`] if the deadline came first. This is how a publisher
    /// lets a subscriber at its limit slow it down rather than serve it another way.
    pub fn wait_lease_room(&self, holder: HolderId, deadline: Instant) -> Result<bool, LeaseError> {
        let sh = &self.0.shared;
        let mut st = sh.lock();
        let mut waited = false;
        loop {
            let held = st.holder_counts.get(&holder).copied().unwrap_or(0);
            let slot = st.slots[self.0.key.id as usize].as_ref().expect("published slot exists");
            if held < sh.cfg.max_holds_per_holder
                || st.departed.contains(&holder)
                || slot.holds.iter().any(|(h, _)| *h == holder)
            {
                return Ok(waited);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LeaseError::HolderLimit { holder: holder.0, held });
            }
            waited = true;
            st = sh.returned.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// How many blocks `holder` holds, and the most it may hold.
    pub fn holds_of(&self, holder: HolderId) -> (usize, usize) {
        let sh = &self.0.shared;
        (sh.lock().holder_counts.get(&holder).copied().unwrap_or(0), sh.cfg.max_holds_per_holder)
    }

    /// Adds a hold for `holder` (charged before the descriptor is sent). Refused when
    /// the holder is at its limit (the caller then serves that holder another way) or
    /// has departed (released with [`Pool::release_holder`]: nobody would release it).
    pub fn lease(&self, holder: HolderId) -> Result<(), LeaseError> {
        let sh = &self.0.shared;
        let mut st = sh.lock();
        if st.departed.contains(&holder) {
            return Err(LeaseError::Departed { holder: holder.0 });
        }
        let held = st.holder_counts.get(&holder).copied().unwrap_or(0);
        let slot = st.slots[self.0.key.id as usize].as_mut().expect("published slot exists");
        let existing = slot.holds.iter().position(|(h, _)| *h == holder);
        if existing.is_none() && held >= sh.cfg.max_holds_per_holder {
            sh.counters.holder_limit_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(LeaseError::HolderLimit { holder: holder.0, held });
        }
        match existing {
            Some(pos) => slot.holds[pos].1 += 1,
            None => {
                slot.holds.push((holder, 1));
                *st.holder_counts.entry(holder).or_default() += 1;
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(feature = "loom-model")))]
mod tests;

#[cfg(all(test, feature = "loom-model"))]
mod loom_tests;
