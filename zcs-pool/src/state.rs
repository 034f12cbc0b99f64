//! The pool's shared state under its lock: slots and their phases, free lists,
//! holds per holder, counters, and the operations on them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::sync::Unpoisoned;
use crate::sync::{Condvar, Mutex, MutexGuard};

use super::recycler::RecyclerHandle;
use super::*;

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
pub(super) enum Phase {
    Free { since: Instant },
    Loaned,
    Held,
}

pub(super) struct Slot<M> {
    pub(super) mem: Arc<M>,
    pub(super) size: usize,
    pub(super) alloc: u64,
    pub(super) generation: u64,
    pub(super) capability: u64,
    pub(super) phase: Phase,
    /// Holders and how many holds each has on the current generation.
    pub(super) holds: Vec<(HolderId, u32)>,
}

pub(super) struct State<M> {
    pub(super) slots: Vec<Option<Slot<M>>>,
    pub(super) vacant: Vec<u32>,
    /// Free block ids by size, most recently freed last.
    pub(super) free: BTreeMap<usize, Vec<u32>>,
    pub(super) bytes: u64,
    pub(super) blocks: usize,
    pub(super) bytes_in_use: u64,
    pub(super) blocks_in_use: usize,
    /// Holds per holder across all blocks.
    pub(super) holder_counts: BTreeMap<HolderId, usize>,
    /// The last [`DEPARTED_MEMORY`] holders released with `release_holder`, refused
    /// by `lease` (a set for lookup, a queue for the order of eviction).
    pub(super) departed: BTreeSet<HolderId>,
    pub(super) departed_order: VecDeque<HolderId>,
    /// Last generation handed out (pool-wide, only grows).
    pub(super) generation: u64,
    /// Last allocation serial handed out.
    pub(super) allocs: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) loans: AtomicU64,
    pub(super) allocations: AtomicU64,
    pub(super) frees: AtomicU64,
    pub(super) waits: AtomicU64,
    pub(super) exhausted: AtomicU64,
    pub(super) holder_limit_refusals: AtomicU64,
    pub(super) holder_releases: AtomicU64,
    pub(super) pending_fences: AtomicU64,
}

pub(crate) struct Shared<B: Backend> {
    pub(super) backend: B,
    pub(super) cfg: PoolConfig,
    pub(super) state: Mutex<State<B::Memory>>,
    pub(super) returned: Condvar,
    pub(super) counters: Counters,
    pub(super) recycler: RecyclerHandle,
    pub(super) cap_key: CapabilityKey,
}

impl<B: Backend> Shared<B> {
    pub(super) fn lock(&self) -> MutexGuard<'_, State<B::Memory>> {
        // A panic while holding the lock cannot leave the state half-updated in a way
        // that matters more than losing the pool, so poisoning is ignored.
        self.state.locked()
    }

    /// Drops one hold of `holder` on `key`; frees the block when none remain.
    pub(super) fn release_now(&self, key: BlockKey, holder: HolderId) -> Result<(), StaleError> {
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

    pub(super) fn make_free(st: &mut State<B::Memory>, id: u32) {
        let slot = st.slots[id as usize].as_mut().expect("live slot");
        slot.phase = Phase::Free { since: Instant::now() };
        let size = slot.size;
        st.bytes_in_use -= size as u64;
        st.blocks_in_use -= 1;
        st.free.entry(size).or_default().push(id);
    }

    /// Releases `holder`'s hold, after `fence` completes if there is one.
    pub(super) fn release_after(self: &Arc<Self>, key: BlockKey, holder: HolderId, fences: Vec<Box<dyn Fence>>) {
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
    pub(super) fn collect_idle(
        st: &mut State<B::Memory>,
        older_than: Option<Duration>,
        keep_bytes: u64,
    ) -> Vec<Arc<B::Memory>> {
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

    pub(super) fn remove_free(st: &mut State<B::Memory>, id: u32) -> Arc<B::Memory> {
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
pub(super) fn dec_holder(counts: &mut BTreeMap<HolderId, usize>, holder: HolderId) -> usize {
    let Some(c) = counts.get_mut(&holder) else { return 0 };
    let before = *c;
    *c -= 1;
    if *c == 0 {
        counts.remove(&holder);
    }
    before
}

/// Compares two capabilities in constant time.
pub(super) fn cap_eq(a: u64, b: u64) -> bool {
    std::hint::black_box(a ^ b) == 0
}
