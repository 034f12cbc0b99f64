//! Stream-ordered ready signals, and the write and read guards built on them.
//!
//! A publisher owns one [`ReadySignals`] block: 64-bit slots in device memory, one per
//! pool block id, exported by FD like any block. When a write ends, the publisher's
//! stream writes the block's generation into its slot (`cuStreamWriteValue64`), after
//! all the work queued before it. A subscriber that imported the signal block makes
//! *its own* stream wait until the slot reaches that generation (`cuStreamWaitValue64`,
//! `>=`), then reads. No host thread waits, no IPC event is opened, and no `/dev/shm`
//! needs to be shared. Generations only grow, and a block is not reused while a
//! subscriber holds it, so `>=` can never be satisfied by a later write to the block.
//!
//! Any stream works, including the legacy default stream (a null `CUstream`): the
//! wait is enqueued on it like on any other, never skipped.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use zcs_memory::cuda::Gpu;
//! # use zcs_pool::{CudaBackend, Pool, PoolConfig};
//! # use zcs_pool::signal::{ReadySignals, WriteGuard};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = Gpu::probe()?;
//! let pool = Pool::new(CudaBackend::new(gpu.clone()), PoolConfig::default())?;
//! let signals = Arc::new(ReadySignals::create(&gpu)?);
//! let stream = gpu.new_stream()?;
//! let guard = WriteGuard::new(pool.loan(8 << 20)?, stream.clone(), Arc::clone(&signals));
//! // … enqueue kernels writing guard.device_ptr() .. + guard.len() on `stream` …
//! let published = guard.finish()?; // the ready signal follows the writes on `stream`
//! # drop(published); Ok(()) }
//! ```

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::cuda::{CudaError, DeviceBlock, Fence, Gpu, ImportedBlock, Stream, copy, event};
use crate::{CudaBackend, Loan, Published};

/// A ready signal could not be enqueued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignalError {
    /// A read range lies outside the block.
    #[error("read of {len} bytes at offset {offset} exceeds the {size}-byte block")]
    OutOfBounds {
        /// Offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Block size.
        size: usize,
    },
    /// The slot is outside the signal block.
    #[error("signal slot {slot} out of range (the block has {slots} slots)")]
    SlotOutOfRange {
        /// The slot asked for.
        slot: u32,
        /// Slots in the block.
        slots: usize,
    },
    /// The device does not support 64-bit stream memory operations.
    #[error("GPU does not support 64-bit stream memory operations")]
    Unsupported,
    /// A driver call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

enum SignalMemory {
    Owned(DeviceBlock),
    Imported(ImportedBlock),
}

/// A block of 64-bit ready slots in device memory (see the module docs).
pub struct ReadySignals {
    mem: SignalMemory,
    gpu: Gpu,
}

impl std::fmt::Debug for ReadySignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadySignals").field("addr", &self.base()).field("slots", &self.slots()).finish()
    }
}

impl ReadySignals {
    /// Allocates one granule of slots (262,144 with a 2 MiB granularity), all zero.
    pub fn create(gpu: &Gpu) -> Result<Self, SignalError> {
        if !gpu.supports_stream_mem_ops_64() {
            return Err(SignalError::Unsupported);
        }
        let block = DeviceBlock::allocate(gpu, gpu.granularity())?;
        let stream = gpu.legacy_default_stream();
        // SAFETY: the block was just allocated and mapped read-write with `size()` bytes,
        // and lives past the wait below.
        unsafe { copy::fill(&stream, block.device_ptr(), 0, block.size()) }?;
        copy::wait(&stream)?;
        Ok(Self { mem: SignalMemory::Owned(block), gpu: gpu.clone() })
    }

    /// Imports a publisher's signal block from its FD.
    pub fn import(gpu: &Gpu, fd: OwnedFd, size: usize) -> Result<Self, SignalError> {
        if !gpu.supports_stream_mem_ops_64() {
            return Err(SignalError::Unsupported);
        }
        Ok(Self { mem: SignalMemory::Imported(ImportedBlock::import(gpu, fd, size)?), gpu: gpu.clone() })
    }

    /// The FD to send to subscribers (only for a block created here).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.mem {
            SignalMemory::Owned(b) => Some(b.fd()),
            SignalMemory::Imported(_) => None,
        }
    }

    /// Size in bytes (what an importer must pass to [`ReadySignals::import`]).
    pub fn size(&self) -> usize {
        match &self.mem {
            SignalMemory::Owned(b) => b.size(),
            SignalMemory::Imported(b) => b.size(),
        }
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.size() / 8
    }

    fn base(&self) -> u64 {
        match &self.mem {
            SignalMemory::Owned(b) => b.device_ptr(),
            SignalMemory::Imported(b) => b.device_ptr(),
        }
    }

    fn slot_addr(&self, slot: u32) -> Result<u64, SignalError> {
        if (slot as usize) < self.slots() {
            Ok(self.base() + 8 * slot as u64)
        } else {
            Err(SignalError::SlotOutOfRange { slot, slots: self.slots() })
        }
    }

    /// Enqueues `slot = value` on `stream`, after the work already queued there.
    pub fn signal(&self, stream: &Stream, slot: u32, value: u64) -> Result<(), SignalError> {
        Ok(event::write_value64(&self.gpu, stream, self.slot_addr(slot)?, value)?)
    }

    /// The slot's current value, read on `stream` (8 bytes device→host, waited for).
    pub fn read_slot_on(&self, slot: u32, stream: &Stream) -> Result<u64, SignalError> {
        let addr = self.slot_addr(slot)?;
        let mut v = [0u8; 8];
        // SAFETY: `addr` is an 8-byte slot inside this mapped block (checked by
        // `slot_addr`), which `self` keeps mapped.
        unsafe { copy::device_to_host(stream, addr, &mut v) }?;
        Ok(u64::from_le_bytes(v))
    }

    /// Makes work enqueued on `stream` after this call wait until `slot >= value`.
    pub fn wait(&self, stream: &Stream, slot: u32, value: u64) -> Result<(), SignalError> {
        Ok(event::wait_value64(&self.gpu, stream, self.slot_addr(slot)?, value)?)
    }
}

/// The writer of a loaned device block, bound to the producer's stream.
///
/// [`WriteGuard::finish`] enqueues the ready signal after the writes and publishes
/// the block. Dropped without `finish`, the block goes back to the pool once the work
/// queued on the stream so far has completed.
pub struct WriteGuard {
    loan: Option<Loan<CudaBackend>>,
    stream: Stream,
    signals: Arc<ReadySignals>,
}

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGuard").field("loan", &self.loan).finish()
    }
}

impl WriteGuard {
    /// Binds `loan` to `stream`; the signal slot is the block id. A pool with more
    /// blocks than `signals` has slots is refused where it is declared; should an id
    /// still exceed them, [`WriteGuard::finish`] fails and publishes nothing.
    pub fn new(loan: Loan<CudaBackend>, stream: Stream, signals: Arc<ReadySignals>) -> Self {
        Self { loan: Some(loan), stream, signals }
    }

    fn loan(&self) -> &Loan<CudaBackend> {
        self.loan.as_ref().expect("present until finish or drop")
    }

    /// Device address of the block.
    pub fn device_ptr(&self) -> u64 {
        self.loan().addr()
    }

    /// The length loaned.
    pub fn len(&self) -> usize {
        self.loan().len()
    }

    /// Whether the loaned length is zero (never).
    pub fn is_empty(&self) -> bool {
        self.loan().is_empty()
    }

    /// The producer's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The loan (key, capability, memory).
    pub fn inner(&self) -> &Loan<CudaBackend> {
        self.loan()
    }

    /// Enqueues the ready signal (slot = block id, value = generation) after the
    /// writes on the stream, and publishes the block. The publisher's own hold keeps
    /// a fence after the signal, so the block is never reused under pending writes.
    pub fn finish(mut self) -> Result<Published<CudaBackend>, SignalError> {
        let mut loan = self.loan.take().expect("present until finish or drop");
        let key = loan.key();
        let signalled = self.signals.signal(&self.stream, key.id, key.generation);
        let fenced = Fence::record(&self.signals.gpu, &self.stream);
        match fenced {
            Ok(f) => loan.add_fence(f),
            // A context that cannot record an event is broken; nothing is published.
            Err(e) => return Err(e.into()),
        }
        // On error the loan drops here and its block returns after the fence.
        signalled?;
        Ok(loan.publish())
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if let Some(mut loan) = self.loan.take() {
            match Fence::record(&self.signals.gpu, &self.stream) {
                Ok(f) => loan.add_fence(f),
                Err(e) => {
                    tracing::warn!(error = %crate::error::Chain(&e), "cannot fence an abandoned write; returning its block now")
                }
            }
        }
    }
}

/// A read of an imported block, ordered on the consumer's stream after the
/// producer's ready signal.
#[derive(Debug)]
pub struct ReadGuard {
    block: Arc<ImportedBlock>,
    offset: usize,
    len: usize,
    stream: Stream,
    gpu: Gpu,
    ended: bool,
}

impl ReadGuard {
    /// Enqueues on `stream` a wait for `signals[slot] >= generation`; work enqueued on
    /// `stream` afterwards sees the producer's writes.
    pub fn begin(
        signals: &ReadySignals,
        block: Arc<ImportedBlock>,
        slot: u32,
        generation: u64,
        offset: usize,
        len: usize,
        stream: Stream,
    ) -> Result<Self, SignalError> {
        if offset.checked_add(len).is_none_or(|end| end > block.size()) {
            return Err(SignalError::OutOfBounds { offset, len, size: block.size() });
        }
        signals.wait(&stream, slot, generation)?;
        let gpu = signals.gpu.clone();
        Ok(Self { block, offset, len, stream, gpu, ended: false })
    }

    /// Device address of the first readable byte.
    pub fn device_ptr(&self) -> u64 {
        self.block.device_ptr() + self.offset as u64
    }

    /// Readable length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the readable length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The consumer's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Ends the read: returns a fence after the reads enqueued on the stream, which
    /// keeps the block mapped until it completes. The consumer releases its lease only
    /// once the fence is complete.
    pub fn end(mut self) -> Result<ReadFence, CudaError> {
        self.ended = true;
        let fence = Fence::record(&self.gpu, &self.stream)?;
        Ok(ReadFence { fence, _block: Arc::clone(&self.block) })
    }
}

/// The end of a read: complete once the GPU has passed the reads; holds the block's
/// mapping until then.
#[derive(Debug)]
pub struct ReadFence {
    fence: Fence,
    _block: Arc<ImportedBlock>,
}

impl ReadFence {
    /// Whether the reads have completed (does not block).
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        self.fence.is_complete()
    }

    /// Blocks until the reads have completed.
    pub fn wait(&self) -> Result<(), CudaError> {
        self.fence.wait()
    }
}

impl crate::Fence for ReadFence {
    fn is_complete(&self) -> bool {
        crate::Fence::is_complete(&self.fence)
    }
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        if !self.ended {
            // Without `end` no fence reaches the releaser; waiting here keeps the block
            // from being released under a running reader.
            match Fence::record(&self.gpu, &self.stream).and_then(|f| f.wait()) {
                Ok(()) => {}
                Err(e) => tracing::warn!(error = %crate::error::Chain(&e), "cannot fence a dropped read guard"),
            }
        }
    }
}
