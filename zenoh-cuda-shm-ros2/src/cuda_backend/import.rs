//! Blocks of the CUDA buffer backend imported into this process, and the buffers a
//! descriptor names in them.
//!
//! An import follows the backend's own subscriber (`cuda_buffer_ipc_manager.cpp:429-558`
//! of `cuda_buffer` 0.1.2): count ourselves on the block and compare its reuse id first,
//! then get the block's FD from its socket, import and map it once per (process, block),
//! and open the writer's IPC event for every message. Unlike it, we refuse a block whose
//! shared count cannot be opened (upstream maps it uncounted, so the publisher may reuse
//! it under our reads), check the socket's peer, compare the device, and forget a dead
//! publisher's blocks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tensor_codec::cdr::{CudaBufferDescriptor, CudaDescriptorError};
use zcs_memory::cuda::{CudaError, Fence, Gpu, ImportedBlock, IpcEvent, Stream};
use zcs_pool::Fence as PoolFence;
use zcs_pool::recycler::{Job, Recycler, RecyclerHandle};
use zcs_wire::rosidl_cuda::{BlockFdError, BlockMeta, BlockMetaError, CountHold, receive_block_fd};

/// How long the block socket may take to hand out an FD.
const FD_WAIT: Duration = Duration::from_secs(2);

/// Why a descriptor's buffer was not imported (the message then has no data for us).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendImportError {
    /// The descriptor is not one we may act on.
    #[error("the descriptor is refused")]
    Descriptor(#[from] CudaDescriptorError),
    /// The buffer lives on another device than ours (the descriptor names ordinals).
    #[error("the buffer is on device {theirs}, we map device {ours}")]
    OtherDevice {
        /// The descriptor's ordinal.
        theirs: i32,
        /// Ours.
        ours: usize,
    },
    /// The block's shared count: missing, not ours, or the block was reused.
    #[error(transparent)]
    Meta(#[from] BlockMetaError),
    /// The block's FD could not be had from its socket.
    #[error(transparent)]
    Fd(#[from] BlockFdError),
    /// Importing or mapping the block, or opening the writer's event, failed.
    #[error("CUDA refused the import")]
    Cuda(#[from] CudaError),
    /// A block of that process and number is cached with another size.
    #[error("block {block} of pid {pid} was imported with {cached} bytes, the descriptor says {named}")]
    SizeChanged {
        /// The publisher.
        pid: i32,
        /// Its block number.
        block: u32,
        /// The size mapped.
        cached: usize,
        /// The descriptor's `vmm_block_size`.
        named: u64,
    },
}

impl BackendImportError {
    /// A short name of the reason, to count refusals by: `descriptor`, `other-device`,
    /// `reused` (the block's reuse id moved on), `block-file` (its shared count missing
    /// or not ours), `wrong-peer` (the socket's process or user is not the
    /// descriptor's), `socket`, `cuda`, `size-changed`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Descriptor(_) => "descriptor",
            Self::OtherDevice { .. } => "other-device",
            Self::Meta(BlockMetaError::Stale { .. }) => "reused",
            Self::Meta(_) => "block-file",
            Self::Fd(BlockFdError::WrongPeer { .. }) => "wrong-peer",
            Self::Fd(_) => "socket",
            Self::Cuda(_) => "cuda",
            Self::SizeChanged { .. } => "size-changed",
        }
    }
}

/// One block of a publisher, mapped here, with its shared count.
struct Block {
    mapping: ImportedBlock,
    meta: Arc<BlockMeta>,
}

/// The blocks of the backend imported into this process, by (publisher pid, block id),
/// for one GPU of ours.
pub struct BackendImports {
    gpu: Gpu,
    blocks: Mutex<HashMap<(i32, u32), Arc<Block>>>,
    releaser: Arc<RecyclerHandle>,
    _recycler: Recycler,
}

impl std::fmt::Debug for BackendImports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendImports").field("gpu", &self.gpu.ordinal()).field("blocks", &self.cached()).finish()
    }
}

impl BackendImports {
    /// Imports into `gpu`; a thread gives counts back once reads complete.
    ///
    /// # Errors
    /// The release thread could not be started.
    pub fn new(gpu: &Gpu) -> std::io::Result<Self> {
        let (mut recycler, releaser) = Recycler::prepare(Duration::from_secs(3600));
        recycler.start_thread()?;
        Ok(Self { gpu: gpu.clone(), blocks: Mutex::default(), releaser: Arc::new(releaser), _recycler: recycler })
    }

    /// Blocks mapped now.
    pub fn cached(&self) -> usize {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The buffer `d` describes, counted on its block and ordered after its writer.
    ///
    /// # Errors
    /// [`BackendImportError`]: the descriptor refused, another device, the block's count
    /// or FD not to be had (its publisher gone, another user), a reused block, CUDA.
    pub fn import(&self, d: &CudaBufferDescriptor) -> Result<BackendBuffer, BackendImportError> {
        match self.import_cached(d) {
            Some(imported) => imported,
            None => self.import_new(d),
        }
    }

    /// [`BackendImports::import`] when nothing can wait: `None` when `d`'s block is not
    /// mapped here yet (mapping it first takes its FD from a socket).
    pub fn import_cached(&self, d: &CudaBufferDescriptor) -> Option<Result<BackendBuffer, BackendImportError>> {
        if let Err(e) = self.check(d) {
            return Some(Err(e));
        }
        let key = (d.vmm_pid, d.vmm_block_id);
        let block = self.blocks.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned()?;
        if block.mapping.size() != usize::try_from(d.vmm_block_size).unwrap_or(usize::MAX) {
            return Some(Err(BackendImportError::SizeChanged {
                pid: key.0,
                block: key.1,
                cached: block.mapping.size(),
                named: d.vmm_block_size,
            }));
        }
        Some(block.meta.hold(d.ipc_uid).map_err(BackendImportError::from).and_then(|hold| self.buffer(d, block, hold)))
    }

    /// The checks before anything is counted or mapped.
    fn check(&self, d: &CudaBufferDescriptor) -> Result<(), BackendImportError> {
        d.check()?;
        if usize::try_from(d.device_id).ok() != Some(self.gpu.ordinal()) {
            return Err(BackendImportError::OtherDevice { theirs: d.device_id, ours: self.gpu.ordinal() });
        }
        Ok(())
    }

    /// Maps `d`'s block (not mapped here yet) and imports the buffer.
    fn import_new(&self, d: &CudaBufferDescriptor) -> Result<BackendBuffer, BackendImportError> {
        let key = (d.vmm_pid, d.vmm_block_id);
        let named = usize::try_from(d.vmm_block_size).unwrap_or(usize::MAX);
        // Counted before anything is mapped, as the backend's subscribers do: from here
        // on the publisher does not reuse the block under us.
        let meta = Arc::new(BlockMeta::open(d.vmm_pid, d.vmm_block_id)?);
        let hold = meta.hold(d.ipc_uid)?;
        let fd = receive_block_fd(std::path::Path::new(&d.vmm_socket_path), d.vmm_pid, FD_WAIT)?;
        let mapping = ImportedBlock::import(&self.gpu, fd, named)?;
        tracing::debug!(pid = d.vmm_pid, block = d.vmm_block_id, size = named, "CUDA backend block imported");
        let block = Arc::new(Block { mapping, meta });
        let block = Arc::clone(self.blocks.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(block));
        self.buffer(d, block, hold)
    }

    /// The buffer of `d` in `block`, counted by `hold`, with the writer's event opened.
    fn buffer(
        &self,
        d: &CudaBufferDescriptor,
        block: Arc<Block>,
        hold: CountHold,
    ) -> Result<BackendBuffer, BackendImportError> {
        let event = if d.has_event() { Some(IpcEvent::open(&self.gpu, &d.ipc_event_handle)?) } else { None };
        Ok(BackendBuffer {
            block,
            len: d.size as usize,
            event,
            gpu: self.gpu.clone(),
            fences: Mutex::default(),
            hold: Some(hold),
            releaser: Arc::clone(&self.releaser),
        })
    }

    /// Forgets the blocks of publishers whose process has exited; how many. Mappings
    /// still read by buffers stay until those are gone.
    pub fn evict_dead(&self) -> usize {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let before = blocks.len();
        blocks.retain(|(pid, _), _| !zcs_memory::host::process_gone(*pid));
        before - blocks.len()
    }

    /// Forgets the blocks of publisher process `pid`; how many.
    pub fn evict(&self, pid: i32) -> usize {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let before = blocks.len();
        blocks.retain(|(p, _), _| *p != pid);
        before - blocks.len()
    }
}

/// One message's buffer in a block of the backend, counted on the block until dropped
/// and every read made through [`BackendBuffer::read`] has completed.
pub struct BackendBuffer {
    block: Arc<Block>,
    len: usize,
    /// The writer's event (`None`: the publisher sent none).
    event: Option<IpcEvent>,
    gpu: Gpu,
    fences: Mutex<Vec<Box<dyn PoolFence>>>,
    /// Taken by `Drop` only.
    hold: Option<CountHold>,
    releaser: Arc<RecyclerHandle>,
}

impl std::fmt::Debug for BackendBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendBuffer").field("len", &self.len).field("event", &self.event.is_some()).finish()
    }
}

impl BackendBuffer {
    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer, readable by work enqueued on `stream` after this call: `stream`
    /// waits for the writer's event (no host wait). End the read (or drop it) after
    /// enqueueing the reads.
    ///
    /// # Errors
    /// Making `stream` wait on the event failed.
    pub fn read(&self, stream: &Stream) -> Result<BackendRead<'_>, CudaError> {
        if let Some(ev) = &self.event {
            ev.wait_on(stream)?;
        }
        Ok(BackendRead { buffer: self, stream: stream.clone(), ended: false })
    }
}

impl Drop for BackendBuffer {
    fn drop(&mut self) {
        let fences = std::mem::take(self.fences.get_mut().unwrap_or_else(|p| p.into_inner()));
        let (hold, block) = (self.hold.take(), Arc::clone(&self.block));
        // The count goes back (and the mapping may go) only after our reads: the
        // publisher may reuse the block as soon as the count says nobody holds it.
        let done: Box<dyn FnOnce() + Send> = Box::new(move || {
            drop(hold);
            drop(block);
        });
        if fences.iter().all(|f| f.is_complete()) {
            done();
        } else {
            self.releaser.submit(Job { fences, done });
        }
    }
}

/// How a subscription delivers the buffer: as a sample of its channel, read in place.
impl zenoh_cuda_shm::sample::ForeignBlock for BackendBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn begin(&self, stream: &Stream) -> Result<u64, CudaError> {
        if let Some(ev) = &self.event {
            ev.wait_on(stream)?;
        }
        Ok(self.block.mapping.device_ptr())
    }
}

/// A read of a [`BackendBuffer`] on a stream; a fence is recorded when it ends, and the
/// buffer's count goes back only once the GPU has passed it.
pub struct BackendRead<'a> {
    buffer: &'a BackendBuffer,
    stream: Stream,
    ended: bool,
}

impl BackendRead<'_> {
    /// Device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.buffer.block.mapping.device_ptr()
    }

    /// The buffer's length.
    pub fn len(&self) -> usize {
        self.buffer.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.buffer.len == 0
    }

    /// Records the fence after the reads enqueued so far.
    ///
    /// # Errors
    /// The fence could not be recorded; the buffer's count is then given back only
    /// after this thread has waited for the stream.
    pub fn end(mut self) -> Result<(), CudaError> {
        self.ended = true;
        self.finish()
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        let fence = Fence::record(&self.buffer.gpu, &self.stream)?;
        self.buffer.fences.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(fence));
        Ok(())
    }
}

impl Drop for BackendRead<'_> {
    fn drop(&mut self) {
        if !self.ended
            && let Err(e) = self.finish()
        {
            tracing::warn!(error = %zenoh_cuda_shm::error::Chain(&e), "cannot fence a read of a CUDA backend buffer; waiting for its stream");
            let _ = zcs_memory::cuda::copy::wait(&self.stream);
        }
    }
}
