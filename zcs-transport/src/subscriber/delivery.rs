//! A received message as the subscriber hands it over: its payload where it lies (a
//! block read in place, a copy on this GPU, bytes), and access to it — a read on the
//! caller's CUDA stream, host bytes, or an owned copy.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use super::release::Releases;
use super::{Link, PeerCopy, SubMedium, Upload};
use crate::cuda::{CudaError, Fence, Stream, copy};
use crate::medium::Imported;
use crate::pool::{BlockKey, Fence as PoolFence};
use crate::sample::{Path, SampleInfo};
use crate::signal::SignalError;
use crate::sync::Unpoisoned;

/// A block read in place, with the lease held until every read of it has completed.
pub(crate) struct ZeroCopy {
    block: Imported,
    key: BlockKey,
    offset: usize,
    len: usize,
    link: Arc<Link>,
    releases: Arc<Releases>,
    fences: Mutex<Vec<Box<dyn PoolFence>>>,
}

impl ZeroCopy {
    pub fn new(
        block: Imported,
        key: BlockKey,
        offset: usize,
        len: usize,
        link: Arc<Link>,
        releases: Arc<Releases>,
    ) -> Self {
        Self { block, key, offset, len, link, releases, fences: Mutex::new(Vec::new()) }
    }
}

impl Drop for ZeroCopy {
    fn drop(&mut self) {
        let fences = std::mem::take(self.fences.get_mut().unwrap_or_else(|p| p.into_inner()));
        // The mapping must outlive the reads the fences cover: it moves into the
        // deferred release, which drops it only after they completed.
        self.releases.release_after(Arc::clone(&self.link), self.key, self.block.clone(), fences);
    }
}

/// A message copied onto this GPU on arrival, from a peer GPU's block (`peer_gpus:
/// copy`) or from a host block. Reads wait for the copy on their stream; the block goes
/// back to the subscriber's copier once this is gone and they have completed.
pub(crate) struct Copied {
    /// The block and the fence after the copy; `None` only inside `drop`, which takes it.
    copy: Option<PeerCopy>,
    len: usize,
    /// The publisher's link and block: a block whose publisher died before it was ready
    /// was copied unfinished, and reads of it are refused.
    link: Arc<Link>,
    key: BlockKey,
    fences: Mutex<Vec<Box<dyn PoolFence>>>,
    releases: Arc<Releases>,
}

impl Copied {
    pub(crate) fn new(copy: PeerCopy, len: usize, link: Arc<Link>, key: BlockKey, releases: Arc<Releases>) -> Self {
        Self { copy: Some(copy), len, link, key, fences: Mutex::new(Vec::new()), releases }
    }

    /// Orders work enqueued on `stream` after the copy; the block's device address.
    fn begin(&self, stream: &Stream) -> Result<u64, ReadError> {
        if self.link.signals.died_unready(self.key) {
            return Err(ReadError::PublisherDied);
        }
        let copy = self.copy.as_ref().expect("taken by drop only");
        copy.done.order(stream)?;
        Ok(copy.block.device_ptr())
    }
}

impl Drop for Copied {
    fn drop(&mut self) {
        let Some(PeerCopy { block, done }) = self.copy.take() else { return };
        let mut fences = std::mem::take(self.fences.get_mut().unwrap_or_else(|p| p.into_inner()));
        fences.push(Box::new(done));
        self.releases.recycle_after(block, fences);
    }
}

/// A block of another transport (ROS 2's CUDA buffer backend), mapped on this
/// subscriber's GPU and read in place. Its owner gives it back when it is dropped; the
/// sample drops it only once every read made through the sample has completed.
pub trait ForeignBlock: Send + Sync {
    /// The message's length in bytes.
    fn len(&self) -> usize;
    /// Whether the message is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes work enqueued on `stream` after this call wait for the block's writer (no
    /// host wait); the device address of the message's first byte.
    ///
    /// # Errors
    /// Ordering `stream` after the writer failed.
    fn begin(&self, stream: &Stream) -> Result<u64, CudaError>;
}

/// A [`ForeignBlock`] in a sample, with the fences of the reads made of it.
pub(crate) struct Foreign {
    /// `None` only inside `drop`, which takes it.
    block: Option<Box<dyn ForeignBlock>>,
    fences: Mutex<Vec<Box<dyn PoolFence>>>,
    releases: Arc<Releases>,
}

impl Foreign {
    pub(crate) fn new(block: Box<dyn ForeignBlock>, releases: Arc<Releases>) -> Self {
        Self { block: Some(block), fences: Mutex::new(Vec::new()), releases }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let fences = std::mem::take(self.fences.get_mut().unwrap_or_else(|p| p.into_inner()));
        let block = self.block.take();
        self.releases.defer(fences, Box::new(move || drop(block)));
    }
}

pub(crate) enum Body {
    ZeroCopy(ZeroCopy),
    Copied(Copied),
    Bytes(zenoh::bytes::ZBytes),
    Foreign(Foreign),
}

struct Inner {
    info: SampleInfo,
    body: Body,
    medium: SubMedium,
    releases: Arc<Releases>,
}

/// A received message as the transport delivers it; the API wraps it (`GpuSample` of
/// `zenoh-cuda-shm`, whose methods these are). Cheap to clone; a zero-copy sample's
/// lease is released once the last clone is gone and every read made through
/// [`Delivery::read`] has completed on its stream.
#[derive(Clone)]
pub struct Delivery(Arc<Inner>);

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery").field("info", &self.0.info).field("len", &self.len()).finish()
    }
}

/// Reading a sample failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// This subscriber has no GPU (host memory session).
    #[error("this session has no GPU (host-memory blocks): read the payload as host bytes instead")]
    NoGpu,
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Ordering the read after the publisher's signal failed.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// The publisher process died before its writes to this block were done: the
    /// data is incomplete.
    #[error("the publisher died before this block was ready")]
    PublisherDied,
}

impl Delivery {
    /// A delivery of `body`, received by a subscriber on `medium` whose release handle
    /// is `releases`.
    pub(crate) fn new(info: SampleInfo, body: Body, medium: SubMedium, releases: Arc<Releases>) -> Self {
        Self(Arc::new(Inner { info, body, medium, releases }))
    }

    /// Metadata.
    pub fn info(&self) -> &SampleInfo {
        &self.0.info
    }

    /// The path that delivered this sample.
    pub fn path(&self) -> Path {
        self.0.info.path
    }

    /// The publisher's sequence number.
    pub fn seq(&self) -> u64 {
        self.0.info.seq
    }

    /// Payload length in bytes.
    pub fn len(&self) -> usize {
        match &self.0.body {
            Body::ZeroCopy(z) => z.len,
            Body::Copied(c) => c.len,
            Body::Bytes(b) => b.len(),
            Body::Foreign(f) => f.block.as_ref().map_or(0, |b| b.len()),
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload as host bytes, without a copy where possible: bytes paths and
    /// zero-copy host blocks borrow; device blocks return `None` (use
    /// [`Delivery::read`] or [`Delivery::to_vec`]).
    pub fn host_bytes(&self) -> Option<Cow<'_, [u8]>> {
        match &self.0.body {
            Body::Bytes(b) => Some(b.to_bytes()),
            Body::ZeroCopy(z) => match &z.block {
                Imported::Host(b) => {
                    // SAFETY: the block is mapped with ≥ offset+len bytes (checked against
                    // the descriptor before delivery), kept alive by this sample, and
                    // published: the publisher does not write it while our lease is held.
                    let whole = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.size()) };
                    Some(Cow::Borrowed(&whole[z.offset..z.offset + z.len]))
                }
                Imported::Cuda(_) => None,
            },
            Body::Copied(_) | Body::Foreign(_) => None,
        }
    }

    /// An owned host copy of the payload (a device→host copy for device blocks,
    /// ordered after the publisher's ready signal).
    pub fn to_vec(&self) -> Result<Vec<u8>, ReadError> {
        if let Some(b) = self.host_bytes() {
            return Ok(b.into_owned());
        }
        let SubMedium::Cuda(gpu) = &self.0.medium else { return Err(ReadError::NoGpu) };
        let stream = gpu.new_stream()?;
        let read = self.read(&stream)?;
        let mut out = vec![0u8; read.len()];
        // SAFETY: the read range is mapped and held by this sample until `read` ends,
        // after the copy has completed.
        unsafe { copy::device_to_host(&stream, read.device_ptr(), &mut out) }?;
        read.end()?;
        Ok(out)
    }

    /// The payload in device memory, readable by work enqueued on `stream` after this
    /// call. Zero-copy samples: `stream` waits for the publisher's ready signal (no
    /// host wait). Bytes samples: staged in pinned memory by this call (a CPU copy),
    /// then copied host→device on `stream` (no host wait for that copy); the device
    /// copy and the staging are recycled once `stream` has passed the reads. Works with
    /// any stream, the legacy default stream included.
    pub fn read(&self, stream: &Stream) -> Result<DeviceRead<'_>, ReadError> {
        let SubMedium::Cuda(gpu) = &self.0.medium else { return Err(ReadError::NoGpu) };
        let (ptr, sink, staged) = match (self.begin_detached_read(stream)?, self.fences()) {
            // A block read in place, or this GPU's copy of one: the reads' fences go
            // with the sample's.
            (Some(ptr), Some(sink)) => (ptr, Some(sink), None),
            _ => {
                let Body::Bytes(bytes) = &self.0.body else {
                    unreachable!("a CUDA subscriber's blocks are device blocks")
                };
                let parts: Vec<&[u8]> = bytes.slices().collect();
                let upload = self.0.releases.copier()?.upload(&parts, stream)?;
                (upload.block.device_ptr(), None, Some(upload))
            }
        };
        Ok(DeviceRead {
            ptr,
            len: self.len(),
            stream: stream.clone(),
            gpu: gpu.clone(),
            sink,
            releases: &self.0.releases,
            staged,
            ended: false,
        })
    }

    /// The fences that the sample's lease (or its copy's block) waits for; `None` for
    /// bytes samples, which hold neither.
    fn fences(&self) -> Option<&Mutex<Vec<Box<dyn PoolFence>>>> {
        match &self.0.body {
            Body::ZeroCopy(z) => Some(&z.fences),
            Body::Copied(c) => Some(&c.fences),
            Body::Foreign(f) => Some(&f.fences),
            Body::Bytes(_) => None,
        }
    }
}

/// Device memory holding a sample's payload, ordered on a stream. End it (or drop it)
/// after enqueueing the reads: a fence is recorded so the block is released only when
/// the GPU has passed them.
pub struct DeviceRead<'a> {
    ptr: u64,
    len: usize,
    stream: Stream,
    gpu: crate::cuda::Gpu,
    sink: Option<&'a Mutex<Vec<Box<dyn PoolFence>>>>,
    releases: &'a Arc<Releases>,
    /// A bytes sample's copy onto the GPU, for this read only.
    staged: Option<Upload>,
    ended: bool,
}

impl std::fmt::Debug for DeviceRead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRead").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl DeviceRead<'_> {
    /// Device address of the first payload byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Payload length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the read is ordered on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Records the fence after the reads enqueued so far.
    pub fn end(mut self) -> Result<(), CudaError> {
        self.ended = true;
        self.finish()
    }

    fn finish(&mut self) -> Result<(), CudaError> {
        let fence = Fence::record(&self.gpu, &self.stream)?;
        match (self.sink, self.staged.take()) {
            (Some(sink), _) => sink.locked().push(Box::new(fence)),
            // The copy and its pinned source must outlive the reads: the subscriber's
            // releaser recycles them once they are done.
            (None, Some(staged)) => self.releases.recycle_upload_after(staged, Box::new(fence)),
            (None, None) => {}
        }
        Ok(())
    }
}

impl Drop for DeviceRead<'_> {
    fn drop(&mut self) {
        if !self.ended
            && let Err(e) = self.finish()
        {
            // Without a fence the only safe choice is to wait for the stream here.
            tracing::warn!(error = %crate::error::Chain(&e), "cannot fence a device read; waiting for its stream");
            let _ = copy::wait(&self.stream);
        }
    }
}

/// Hooks for the tensor and DLPack layers (`tensor` and `dlpack` of zenoh-cuda-shm): a read
/// that is not tied to a borrow of the sample, so that a DLPack export can own a clone of
/// the sample and end its read later, from the export's deleter.
impl Delivery {
    /// The GPU of the session that received this sample (`None` for host-memory sessions).
    pub fn subscriber_gpu(&self) -> Option<&crate::cuda::Gpu> {
        match &self.0.medium {
            SubMedium::Cuda(gpu) => Some(gpu),
            SubMedium::Host => None,
        }
    }

    /// For a device block read in place (or this GPU's copy of a peer GPU's block): makes
    /// work enqueued on `stream` after this call wait for the publisher's ready signal (or
    /// the copy), and returns the device address of the first payload byte. The address
    /// stays mapped while this sample or a clone of it is alive. A reader that outlives its
    /// borrow keeps a clone and, after its last read, hands a fence to
    /// [`Delivery::hold_lease_until`] so that the lease (or the copy) outlives the reads.
    ///
    /// `Ok(None)` for samples that are not device blocks (bytes paths).
    pub fn begin_detached_read(&self, stream: &Stream) -> Result<Option<u64>, ReadError> {
        if !matches!(self.0.medium, SubMedium::Cuda(_)) {
            return Err(ReadError::NoGpu);
        }
        match &self.0.body {
            Body::ZeroCopy(z) => match &z.block {
                Imported::Cuda(b) => {
                    z.link.signals.wait(stream, z.key)?;
                    Ok(Some(b.device_ptr() + z.offset as u64))
                }
                Imported::Host(_) => Ok(None),
            },
            Body::Copied(c) => c.begin(stream).map(Some),
            Body::Foreign(f) => Ok(f.block.as_ref().map(|b| b.begin(stream)).transpose()?),
            Body::Bytes(_) => Ok(None),
        }
    }

    /// Keeps this sample's lease (zero-copy samples) until `fence` has completed, even
    /// once the last clone is gone: the release then waits for it on the subscriber's
    /// releaser. Hands the fence back for samples that hold no lease.
    pub fn hold_lease_until(&self, fence: Box<dyn PoolFence>) -> Option<Box<dyn PoolFence>> {
        match self.fences() {
            Some(fences) => {
                fences.locked().push(fence);
                None
            }
            None => Some(fence),
        }
    }

    /// Runs `f` once every fence has completed: at once if they all have, else on the
    /// subscriber's releaser thread.
    pub fn defer_until(&self, fences: Vec<Box<dyn PoolFence>>, f: Box<dyn FnOnce() + Send>) {
        self.0.releases.defer(fences, f);
    }
}
