//! Messages copied onto this subscriber's GPU as they arrive, on its own stream: from a
//! publisher's block on another GPU of this host (`peer_gpus: copy`), after the
//! publisher's ready signal; or from a host block the publisher filled (a GPU this one
//! cannot map, or `peer_gpus: host`). The publisher's lease goes back as soon as the
//! copy completes, and reads of the sample are local.
//!
//! Bytes samples (another host, say) read on the GPU take the same blocks: the payload
//! is staged in pinned memory and copied on the reader's stream (`upload`).
//!
//! The local blocks are recycled: a sample's block comes back once its last clone is
//! gone and every read of it has completed, and serves a later copy of no greater size.

use std::sync::{Arc, Mutex};

use crate::cuda::pinned::{PinnedBuf, PinnedPool};
use crate::cuda::{CudaError, DeviceBlock, Fence, Gpu, Stream, copy};
use crate::pool::BlockKey;
use crate::signal::{ReadySignals, SignalError};
use crate::sync::Unpoisoned;

/// Local blocks kept for later copies once their samples are gone; more are freed.
const KEEP: usize = 8;
/// Idle pinned staging kept for bytes read on the GPU; more is freed.
const KEEP_STAGING_BYTES: usize = 256 << 20;

/// One subscriber's copies onto its GPU (from peer GPUs, host blocks, and bytes read on
/// the GPU): its stream, its recycled blocks and its pinned staging.
pub(crate) struct PeerCopier {
    gpu: Gpu,
    stream: Stream,
    /// Blocks whose samples are gone, oldest first. Its lock also keeps each message's
    /// wait, copy and fence together on the stream when several links copy at once.
    free: Mutex<Vec<DeviceBlock>>,
    /// Pinned buffers that bytes samples are staged in before their copy to the GPU.
    staging: PinnedPool,
}

/// A bytes sample's payload copied onto this GPU for a read: the local block, and the
/// pinned buffer it was copied from. Both are kept until the reader's stream has passed
/// the copy and the reads (`PeerCopier::recycle_upload`).
pub(crate) struct Upload {
    pub(crate) block: DeviceBlock,
    staged: PinnedBuf,
}

/// A message copied onto this GPU: the block and the fence after the copy (awaited by
/// the publisher's lease and by the local block's reads).
pub(crate) struct PeerCopy {
    pub(crate) block: DeviceBlock,
    pub(crate) done: Arc<Fence>,
}

impl PeerCopier {
    pub(super) fn new(gpu: &Gpu) -> Result<Self, CudaError> {
        Ok(Self {
            gpu: gpu.clone(),
            stream: gpu.new_stream()?,
            free: Mutex::new(Vec::new()),
            staging: PinnedPool::new(gpu, KEEP_STAGING_BYTES),
        })
    }

    /// Enqueues, on the subscriber's stream: the wait for the publisher's ready signal
    /// of `key`, then the copy of `len` bytes at `src` (the publisher's block as mapped
    /// for this GPU) into a local block. Returns at once; `done` completes with the copy.
    ///
    /// # Safety
    /// `src..src + len` is mapped for this GPU and stays mapped until `done` completes.
    pub(super) unsafe fn copy(
        &self,
        signals: &ReadySignals,
        key: BlockKey,
        src: u64,
        len: usize,
    ) -> Result<PeerCopy, SignalError> {
        self.copy_with(len, |stream, dst| {
            signals.wait(stream, key.id, key.generation)?;
            // SAFETY: `dst` is a local block of ≥ len bytes read by no one until `done`;
            // the caller guarantees the source range until then.
            Ok(unsafe { copy::device_to_device(stream, dst, src, len) }?)
        })
    }

    /// Enqueues, on the subscriber's stream, the copy of `src` (a host block the
    /// publisher filled before announcing it: nothing to wait for) into a local block.
    /// Returns at once; `done` completes with the copy.
    ///
    /// # Safety
    /// `src` stays mapped, and unwritten, until `done` completes.
    pub(super) unsafe fn copy_from_host(&self, src: &[u8]) -> Result<PeerCopy, SignalError> {
        // SAFETY: `dst` is a local block of ≥ src.len() bytes read by no one until
        // `done`; the caller keeps `src` until then.
        self.copy_with(src.len(), |stream, dst| Ok(unsafe { copy::host_to_device(stream, dst, src) }?))
    }

    /// A local block of ≥ `len` bytes (recycled, else new), `enqueue` of the copy into it
    /// on our stream, and a fence after it.
    fn copy_with(
        &self,
        len: usize,
        enqueue: impl FnOnce(&Stream, u64) -> Result<(), SignalError>,
    ) -> Result<PeerCopy, SignalError> {
        let mut free = self.free.locked();
        let block = self.take(&mut free, len)?;
        if let Err(e) = enqueue(&self.stream, block.device_ptr()) {
            free.push(block);
            return Err(e);
        }
        let done = match Fence::record(&self.gpu, &self.stream) {
            Ok(f) => f,
            Err(e) => {
                // Without a fence nobody knows when the copy ends: the block is not
                // reused before the stream has passed it.
                copy::wait(&self.stream)?;
                free.push(block);
                return Err(e.into());
            }
        };
        Ok(PeerCopy { block, done: Arc::new(done) })
    }

    /// The smallest free block that holds `len` bytes, else a new one.
    fn take(&self, free: &mut Vec<DeviceBlock>, len: usize) -> Result<DeviceBlock, CudaError> {
        let fit =
            free.iter().enumerate().filter(|(_, b)| b.size() >= len).min_by_key(|(_, b)| b.size()).map(|(i, _)| i);
        match fit {
            Some(i) => Ok(free.remove(i)),
            None => DeviceBlock::allocate(&self.gpu, len.max(1)),
        }
    }

    /// Stages `payload` (a bytes sample's, in one or more parts) in pinned memory and
    /// enqueues its copy into a local block on `stream`, after the work queued there.
    /// Returns at once: the CPU copy into pinned memory is done, the copy to the GPU runs
    /// on `stream`; keep the upload until the stream has passed it and the reads.
    pub(crate) fn upload(&self, payload: &[&[u8]], stream: &Stream) -> Result<Upload, CudaError> {
        let staged = self.staging.copy_from_host(payload)?;
        let block = self.take(&mut self.free.locked(), staged.as_ref().len())?;
        // SAFETY: `block` is a local block of ≥ len bytes that only this read uses; the
        // pinned source is kept with it in the `Upload` until the stream has passed the
        // copy (the caller's contract).
        if let Err(e) = unsafe { copy::host_to_device(stream, block.device_ptr(), staged.as_ref()) } {
            self.recycle(block);
            return Err(e);
        }
        Ok(Upload { block, staged })
    }

    /// Takes back an upload once its stream has passed the copy and every read of it.
    pub(crate) fn recycle_upload(&self, upload: Upload) {
        drop(upload.staged);
        self.recycle(upload.block);
    }

    /// Takes back a block whose sample is gone and whose reads have completed.
    pub(crate) fn recycle(&self, block: DeviceBlock) {
        let mut free = self.free.locked();
        free.push(block);
        if free.len() > KEEP {
            let oldest = free.remove(0);
            drop(free);
            drop(oldest);
        }
    }
}
