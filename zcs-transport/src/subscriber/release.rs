//! What a received sample needs of its subscriber once the application holds it: the
//! releaser thread that gives leases back after the reads' fences, and the copier whose
//! blocks (copies onto this GPU, staged bytes reads) go back to it. A sample holds this
//! handle, not the subscriber: a sample kept after its subscriber closed keeps only
//! these alive.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::Link;
use super::peer_copy::PeerCopier;
use crate::cuda::{CudaError, Gpu};
use crate::medium::Imported;
use crate::pool::recycler::{Job, RecyclerHandle};
use crate::pool::{BlockKey, Fence};

/// A subscriber's release handle, shared by its samples.
pub(crate) struct Releases {
    releaser: RecyclerHandle,
    /// The subscriber's GPU (`None`: host memory), for a copier made on first use.
    gpu: Option<Gpu>,
    /// Copies messages onto our GPU: from peer GPUs' blocks (`peer_gpus: copy`, made
    /// with the subscriber), from host blocks (made at the first handshake that needs
    /// it) and bytes samples read on a stream (made at the first such read).
    copier: OnceLock<PeerCopier>,
    /// Leases released back to publishers (`SubscriberStats::releases`).
    released: AtomicU64,
}

impl Releases {
    /// A handle over `releaser`; `copier` if one is made up front.
    pub(super) fn new(releaser: RecyclerHandle, gpu: Option<Gpu>, copier: Option<PeerCopier>) -> Self {
        let cell = OnceLock::new();
        if let Some(c) = copier {
            let _ = cell.set(c);
        }
        Self { releaser, gpu, copier: cell, released: AtomicU64::new(0) }
    }

    /// Leases released so far.
    pub(super) fn released(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// The copier, if one was made.
    pub(super) fn copier_if_made(&self) -> Option<&PeerCopier> {
        self.copier.get()
    }

    /// The copier, made now if this is its first use.
    pub(crate) fn copier(&self) -> Result<&PeerCopier, CudaError> {
        if let Some(c) = self.copier.get() {
            return Ok(c);
        }
        let Some(gpu) = &self.gpu else { unreachable!("only CUDA subscribers copy onto their GPU") };
        let made = PeerCopier::new(gpu)?;
        Ok(self.copier.get_or_init(|| made))
    }

    /// Runs `f` once every fence is complete: at once if they all are, else on the
    /// releaser thread.
    pub(crate) fn defer(&self, fences: Vec<Box<dyn Fence>>, f: Box<dyn FnOnce() + Send>) {
        if fences.iter().all(|x| x.is_complete()) {
            f();
        } else {
            self.releaser.submit(Job { fences, done: f });
        }
    }

    /// Releases the lease of `key` on `link` once every fence is complete; the mapping
    /// `block` is kept until then.
    pub(crate) fn release_after(&self, link: Arc<Link>, key: BlockKey, block: Imported, fences: Vec<Box<dyn Fence>>) {
        self.released.fetch_add(1, Ordering::Relaxed);
        self.defer(
            fences,
            Box::new(move || {
                drop(block);
                link.release(key);
            }),
        );
    }

    /// Gives `block` (a copy onto our GPU) back to the copier once every fence is
    /// complete.
    pub(super) fn recycle_after(self: &Arc<Self>, block: crate::cuda::DeviceBlock, fences: Vec<Box<dyn Fence>>) {
        let me = Arc::clone(self);
        self.defer(
            fences,
            Box::new(move || match me.copier.get() {
                Some(c) => c.recycle(block),
                None => drop(block),
            }),
        );
    }

    /// Gives a staged bytes read back to the copier once `fence` is complete.
    pub(super) fn recycle_upload_after(self: &Arc<Self>, upload: super::peer_copy::Upload, fence: Box<dyn Fence>) {
        let me = Arc::clone(self);
        self.defer(
            vec![fence],
            Box::new(move || match me.copier.get() {
                Some(c) => c.recycle_upload(upload),
                None => drop(upload),
            }),
        );
    }
}
