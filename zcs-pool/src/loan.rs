//! A loaned block (one writer) and a published one (held by the publisher and its
//! lessees).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::sync::Unpoisoned;

use super::*;

/// An exclusive loan of a block generation: the one writer.
///
/// Dropped without [`Loan::publish`], the block goes back to the pool (after any
/// fence given with [`Loan::add_fence`] completes).
pub struct Loan<B: Backend> {
    pub(super) shared: Arc<Shared<B>>,
    pub(super) key: BlockKey,
    pub(super) capability: u64,
    pub(super) mem: Arc<B::Memory>,
    pub(super) len: usize,
    pub(super) fences: Vec<Box<dyn Fence>>,
    pub(super) live: bool,
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
