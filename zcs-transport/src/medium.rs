//! The two kinds of block memory a session can use, behind one interface: CUDA VMM
//! device memory, or host memfds (where there is no GPU). Both travel the same way:
//! descriptor, FD over the control socket, import once, leases.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Instant;

use zenoh::bytes::ZBytes;

use crate::cuda::pinned::{HostRegistration, PinnedBuf, PinnedPool};
use crate::cuda::{Fence, Filling, ImportedBlock, Stream};
use crate::host::HostBlock;
use crate::pool::{
    Backend, BlockKey, BlockMemory, CapabilityKey, CudaBackend, HolderId, HostBackend, LeaseError, Pool, PoolStats,
    Published, StaleError,
};
use crate::shm_out::ShmOut;
use crate::signal::{ReadySignals, SignalError};

/// What the transport asks of a publisher's pool, whatever its memory (the pool is
/// generic over its backend; a session picks the memory at run time).
pub(crate) trait BlockPool {
    /// The pool's counters.
    fn stats(&self) -> PoolStats;
    /// The key the pool's block capabilities are made with.
    fn capability_key(&self) -> &CapabilityKey;
    /// Releases `holder`'s hold of block `key` (see `Pool::release`).
    fn release(&self, key: BlockKey, holder: HolderId) -> Result<(), StaleError>;
    /// Releases every hold of `holder` (a subscriber gone); returns how many.
    fn release_holder(&self, holder: HolderId) -> usize;
    /// How many blocks `holder` holds.
    fn holds(&self, holder: HolderId) -> usize;
    /// Runs `f` with the FD and size of a published block, if `capability` matches.
    fn with_handout(
        &self,
        key: BlockKey,
        capability: u64,
        f: &mut dyn FnMut(BorrowedFd<'_>, usize),
    ) -> Result<(), StaleError>;
}

impl<B: Backend> BlockPool for Pool<B> {
    fn stats(&self) -> PoolStats {
        Pool::stats(self)
    }
    fn capability_key(&self) -> &CapabilityKey {
        Pool::capability_key(self)
    }
    fn release(&self, key: BlockKey, holder: HolderId) -> Result<(), StaleError> {
        Pool::release(self, key, holder)
    }
    fn release_holder(&self, holder: HolderId) -> usize {
        Pool::release_holder(self, holder)
    }
    fn holds(&self, holder: HolderId) -> usize {
        Pool::holds(self, holder)
    }
    fn with_handout(
        &self,
        key: BlockKey,
        capability: u64,
        f: &mut dyn FnMut(BorrowedFd<'_>, usize),
    ) -> Result<(), StaleError> {
        self.handout(key, capability).map(|m| f(m.fd(), m.size()))
    }
}

/// What the transport asks of a published block, whatever its memory.
pub trait PublishedBlock: Send + Sync {
    /// The block's key (index and generation).
    fn key(&self) -> BlockKey;
    /// The capability subscribers present to open the block.
    fn capability(&self) -> u64;
    /// The block's size (whole granules).
    fn block_size(&self) -> usize;
    /// The block's FD, when it is our own (a lent block's FD is opened at the provider).
    fn own_fd(&self) -> Option<BorrowedFd<'_>>;
    /// The provider's loan id, when the block is lent by the host provider.
    fn lent(&self) -> Option<u64>;
    /// The bytes written (the message's length).
    fn len(&self) -> usize;
    /// Whether no bytes were written.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Adds a hold for holder `h` (a subscriber), charged before the put.
    fn lease(&self, h: HolderId) -> Result<(), LeaseError>;
    /// The holds of `h`, and its limit.
    fn holds_of(&self, h: HolderId) -> (usize, usize);
    /// Waits until `h` may hold one more block, at most until `deadline`; `false` at the
    /// deadline.
    fn wait_lease_room(&self, h: HolderId, deadline: Instant) -> Result<bool, LeaseError>;
}

impl<B: Backend> PublishedBlock for Published<B> {
    fn key(&self) -> BlockKey {
        Published::key(self)
    }
    fn capability(&self) -> u64 {
        Published::capability(self)
    }
    fn block_size(&self) -> usize {
        self.memory().size()
    }
    fn own_fd(&self) -> Option<BorrowedFd<'_>> {
        self.memory().lent().is_none().then(|| self.memory().fd())
    }
    fn lent(&self) -> Option<u64> {
        self.memory().lent()
    }
    fn len(&self) -> usize {
        Published::len(self)
    }
    fn lease(&self, h: HolderId) -> Result<(), LeaseError> {
        Published::lease(self, h)
    }
    fn holds_of(&self, h: HolderId) -> (usize, usize) {
        Published::holds_of(self, h)
    }
    fn wait_lease_room(&self, h: HolderId, deadline: Instant) -> Result<bool, LeaseError> {
        Published::wait_lease_room(self, h, deadline)
    }
}

/// What a publisher allocates from.
pub enum PubMedium {
    /// Device memory of one GPU.
    Cuda {
        /// The blocks.
        pool: Pool<CudaBackend>,
        /// The ready signals the pool's blocks are published with.
        signals: Arc<ReadySignals>,
        /// The producer's stream of loans that name none.
        stream: Stream,
        /// The stream of copies out to bytes subscribers.
        copy_stream: Stream,
        /// Pinned host memory the copies out land in.
        staging: PinnedPool,
    },
    /// Sealed host memory (memfd), without a GPU.
    Host {
        /// The blocks.
        pool: Pool<HostBackend>,
    },
}

impl PubMedium {
    /// The pool, whatever its memory.
    pub(crate) fn pool(&self) -> &dyn BlockPool {
        match self {
            Self::Cuda { pool, .. } => pool,
            Self::Host { pool } => pool,
        }
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        self.pool().stats()
    }

    /// Copies `len` bytes at `offset` of a published block out for a Zenoh payload,
    /// into a buffer of `shm` where it has room, else (device memory) into pinned
    /// staging, which becomes the payload without another copy. Host memory is copied
    /// at once ([`CopyOut::Done`]). Device memory is copied on a stream of its own after
    /// the block's ready signal, and the copy is only enqueued ([`CopyOut::Copying`]):
    /// the block is kept from reuse until it is done.
    pub(crate) fn copy_out(
        &self,
        p: &PublishedAny,
        offset: usize,
        len: usize,
        shm: Option<&ShmOut>,
    ) -> Result<CopyOut, SignalError> {
        #[cfg(not(feature = "zenoh-shm"))]
        let _ = shm;
        match (self, p) {
            (Self::Cuda { pool, signals, copy_stream, staging, .. }, PublishedAny::Cuda(p)) => {
                let key = p.key();
                signals.wait(copy_stream, key.id, key.generation)?;
                #[cfg(feature = "zenoh-shm")]
                let mut dest = match shm.and_then(|s| s.buffer(len)) {
                    Some(buf) => OutBuf::Shm(buf),
                    None => OutBuf::Staging(staging.spare(len)?),
                };
                #[cfg(not(feature = "zenoh-shm"))]
                let mut dest = OutBuf::Staging(staging.spare(len)?);
                // SAFETY: the block is held by `p` (mapped, ≥ offset+len bytes: the caller
                // passes the loaned range) and nothing writes it once published; `dest`
                // has ≥ len bytes and goes into a `Filling` below, which holds it until
                // the copy's fence (or, if the fence cannot be recorded, we wait here).
                unsafe {
                    crate::cuda::copy::device_to_host_async(
                        copy_stream,
                        dest.as_mut_ptr(),
                        p.addr() + offset as u64,
                        len,
                    )
                }?;
                let done = match Fence::record(pool.backend().gpu(), copy_stream) {
                    Ok(f) => Arc::new(f),
                    Err(e) => {
                        // `dest` must outlive the copy: wait for the stream before it goes.
                        let _ = crate::cuda::copy::wait(copy_stream);
                        return Err(e.into());
                    }
                };
                // The recycler keeps the block until the copy has read it.
                p.add_fence(Arc::clone(&done));
                let in_shm = !matches!(dest, OutBuf::Staging(_));
                Ok(CopyOut::Copying(Filling::new(dest, done), in_shm))
            }
            (Self::Host { .. }, PublishedAny::Host(p)) => {
                let src = host_range(p, offset, len);
                #[cfg(feature = "zenoh-shm")]
                if let Some(mut buf) = shm.and_then(|s| s.buffer(len)) {
                    buf.copy_from_slice(src);
                    return Ok(CopyOut::Done(ZBytes::from(buf), true));
                }
                Ok(CopyOut::Done(ZBytes::from(src.to_vec()), false))
            }
            _ => unreachable!("a publisher's blocks come from its own medium"),
        }
    }
}

/// A copy out of a block, for a Zenoh payload.
pub(crate) enum CopyOut {
    /// Copied: the payload, and whether it is in a Zenoh SHM buffer.
    Done(ZBytes, bool),
    /// Enqueued on the GPU: the payload once its fence is passed, and whether it will
    /// be in a Zenoh SHM buffer.
    Copying(Filling<OutBuf>, bool),
}

/// Where a device→host copy out lands.
pub(crate) enum OutBuf {
    /// Pinned staging of the publisher's.
    Staging(PinnedBuf),
    /// A buffer of the session's Zenoh SHM pool.
    #[cfg(feature = "zenoh-shm")]
    Shm(zenoh::shm::ZShmMut),
}

impl OutBuf {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            Self::Staging(b) => b.as_mut_ptr(),
            #[cfg(feature = "zenoh-shm")]
            Self::Shm(b) => b.as_mut_ptr(),
        }
    }

    /// The payload, and whether it is in a Zenoh SHM buffer.
    pub(crate) fn into_payload(self) -> (ZBytes, bool) {
        match self {
            Self::Staging(b) => (ZBytes::from(bytes::Bytes::from_owner(b)), false),
            #[cfg(feature = "zenoh-shm")]
            Self::Shm(b) => (ZBytes::from(b), true),
        }
    }
}

/// `len` bytes at `offset` of a published host block (the caller passes the loaned range).
fn host_range(p: &Published<HostBackend>, offset: usize, len: usize) -> &[u8] {
    let block = p.memory().block();
    // SAFETY: the block is mapped with `size()` bytes, held by `p` for the borrow, and
    // published: no writer touches it any more.
    let whole = unsafe { std::slice::from_raw_parts(block.as_ptr(), block.size()) };
    &whole[offset..offset + len]
}

/// A published block of either medium.
pub enum PublishedAny {
    /// A device block.
    Cuda(Published<CudaBackend>),
    /// A host-memory block.
    Host(Published<HostBackend>),
}

impl std::ops::Deref for PublishedAny {
    type Target = dyn PublishedBlock;
    fn deref(&self) -> &Self::Target {
        match self {
            Self::Cuda(p) => p,
            Self::Host(p) => p,
        }
    }
}

/// A mapping of a block, and (for a block lent by the host provider) the registration
/// that tells the provider we map it: closed once the mapping is gone. A host block a
/// CUDA subscriber copies from is also page-locked with its driver while mapped.
pub(crate) struct Mapped<T> {
    // Dropped in this order: unregister from the driver, unmap, then tell the provider.
    _pinned: Option<HostRegistration>,
    block: T,
    _opened: Option<Opened>,
}

impl<T> Mapped<T> {
    pub(crate) fn new(block: T, opened: Option<Opened>) -> Self {
        Self { _pinned: None, block, _opened: opened }
    }
}

impl Mapped<HostBlock> {
    /// A host block `gpu` copies from, page-locked with its driver so the copies run at
    /// full speed; without that (the lock limit, say), copied as pageable memory.
    pub(crate) fn pinned(block: HostBlock, gpu: &crate::cuda::Gpu) -> Self {
        // SAFETY: the range is this fresh mapping of the block, which outlives the
        // registration (dropped first, see the field order) and overlaps no other one;
        // copies from it hold this value (the sample's or the lease's) until they end.
        let pinned = unsafe { HostRegistration::new(gpu, block.as_ptr(), block.size()) }
            .inspect_err(|e| {
                tracing::warn!(error = %crate::error::Chain(e), "cannot page-lock a host block: its copies onto the GPU run slower");
            })
            .ok();
        Self { _pinned: pinned, block, _opened: None }
    }
}

impl<T> std::ops::Deref for Mapped<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.block
    }
}

/// This process maps a lent block: the provider keeps it out of reuse until closed.
pub(crate) struct Opened {
    pub(crate) client: Arc<crate::provider::ProviderClient>,
    pub(crate) loan: u64,
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.client.close(self.loan);
    }
}

/// A block imported from a publisher, of either medium.
pub(crate) enum Imported {
    Cuda(Arc<Mapped<ImportedBlock>>),
    Host(Arc<Mapped<HostBlock>>),
}

impl Clone for Imported {
    fn clone(&self) -> Self {
        match self {
            Self::Cuda(b) => Self::Cuda(Arc::clone(b)),
            Self::Host(b) => Self::Host(Arc::clone(b)),
        }
    }
}

impl Imported {
    pub(crate) fn size(&self) -> usize {
        match self {
            Self::Cuda(b) => b.size(),
            Self::Host(b) => b.size(),
        }
    }
}
