//! The `Pool` handle: loans (with back-pressure), releases, FD handouts, trimming.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex, MutexGuard};

use super::recycler::Recycler;
use super::*;

/// A pool of exportable blocks. Cheap to clone; the recycler thread stops (and is
/// joined) when the last clone drops. Loans and published blocks outlive it safely.
pub struct Pool<B: Backend> {
    // Crate-visible for the loom models, which read the state after the pool is gone.
    pub(crate) shared: Arc<Shared<B>>,
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

impl<B: Backend> Pool<B> {
    /// A pool over `backend`, with its recycler thread started.
    pub fn new(backend: B, cfg: PoolConfig) -> Result<Self, PoolError> {
        Self::keyed(backend, cfg, CapabilityKey::random())
    }

    /// A pool whose capabilities derive from `cap_key`: a second pool of one publisher
    /// shares its first pool's key, so its subscribers hold one key whichever blocks
    /// they get (the key also tags the publisher's bytes).
    pub fn keyed(backend: B, cfg: PoolConfig, cap_key: CapabilityKey) -> Result<Self, PoolError> {
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
            cap_key,
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
