//! Publishers: declaring one, loans written in place, puts of loans, bytes and device
//! memory.

use std::future::{IntoFuture, Ready, ready};
use std::sync::Arc;
use std::time::Duration;

use crate::cuda::{Stream, copy};
use crate::ipc::{AccessPolicy, SocketName};
use crate::pool::{BackendKind, BlockMemory, CudaBackend, HostBackend, Loan, LoanError, Pool, PoolStats};
use crate::provider::DeviceLender;
use crate::signal::{ReadySignals, SignalError, WriteGuard};
use crate::transport::medium::{PubMedium, PublishedAny};
use crate::transport::publisher::{DeclareError, PublisherCore, PublisherSpec, PublisherStats, PutError, PutReport};

use super::*;

/// Builder returned by [`GpuSession::declare_publisher`].
#[must_use = "resolve with .wait() or .await"]
pub struct PublisherBuilder {
    pub(super) session: GpuSession,
    pub(super) key: String,
}

impl PublisherBuilder {
    /// Declares the publisher (blocking): its block pool, its control socket, and on a
    /// GPU its ready signals and streams.
    ///
    /// # Errors
    /// [`DeclareError::Key`] or [`DeclareError::WildcardKey`] for a key that is not one
    /// concrete key expression; [`DeclareError::Zenoh`] when a Zenoh declaration fails;
    /// [`DeclareError::SocketDir`] or [`DeclareError::Bind`] when the control socket
    /// cannot be made; [`DeclareError::Pool`] for a pool configuration the pool refuses
    /// (or `pool.max_blocks` above the ready-signal slots); [`DeclareError::Signal`] when
    /// the GPU's ready signals or streams cannot be created; [`DeclareError::Io`] when a
    /// thread cannot be started.
    pub fn wait(self) -> Result<GpuPublisher, DeclareError> {
        let s = &self.session.0;
        let provider = self.session.provider_client().ok();
        let lender = provider.as_ref().map(|c| -> Arc<dyn crate::pool::Lender> {
            let timeout = Duration::from_millis(s.cfg.pool.loan_timeout_ms);
            Arc::new(DeviceLender::new(Arc::clone(c), s.group.device.clone(), timeout))
        });
        let medium = match &s.gpu {
            Some(gpu) => PubMedium::Cuda {
                pool: Pool::new(CudaBackend::new(gpu.clone()).with_lender(lender), s.cfg.pool.clone())?,
                signals: {
                    let signals = ReadySignals::create(gpu)?;
                    // One ready slot per block id: more blocks than slots cannot be signalled.
                    if s.cfg.pool.max_blocks > signals.slots() {
                        return Err(
                            crate::pool::PoolError::Config("pool.max_blocks exceeds the ready-signal slots").into()
                        );
                    }
                    Arc::new(signals)
                },
                stream: gpu.new_stream().map_err(SignalError::from)?,
                copy_stream: gpu.new_stream().map_err(SignalError::from)?,
                // Idle staging kept: enough for a few 4K RGBA frames.
                staging: zcs_memory::cuda::pinned::PinnedPool::new(gpu, 256 << 20),
            },
            None => {
                PubMedium::Host { pool: Pool::new(HostBackend::default().with_lender(lender), s.cfg.pool.clone())? }
            }
        };
        let socket = match &s.cfg.socket_dir {
            Some(dir) => SocketName::random_path_in(dir)?,
            None => SocketName::random_abstract(),
        };
        let mut policy = AccessPolicy::same_uid();
        for uid in &s.cfg.allowed_uids {
            policy = policy.with_uid(*uid);
        }
        let spec = PublisherSpec {
            key: self.key,
            group: s.group.clone(),
            medium,
            socket,
            policy,
            handshake_timeout: Duration::from_millis(s.cfg.handshake_timeout_ms),
            congestion: s.cfg.congestion,
            lease_wait: Duration::from_millis(s.cfg.lease_wait_ms),
            provider: provider.as_ref().map(|c| c.provider().clone()),
            shm_out: s.shm_out.clone(),
            max_message: s.max_message,
        };
        let core = PublisherCore::new(&s.zenoh, spec)?;
        let report = core.reporter();
        self.session.report(Box::new(move |out| report().map(|p| out.publishers.push(p)).is_some()));
        Ok(GpuPublisher { core, inline_threshold: s.cfg.inline_threshold })
    }
}

impl IntoFuture for PublisherBuilder {
    type Output = Result<GpuPublisher, DeclareError>;
    type IntoFuture = Ready<Self::Output>;
    fn into_future(self) -> Self::IntoFuture {
        ready(self.wait())
    }
}

/// Publishes blocks (zero-copy to GPU-ready subscribers, bytes to everyone else).
///
/// Declared with [`GpuSession::declare_publisher`]. Write a [`GpuLoan`] in place and
/// [`put`](GpuPublisher::put) it, or publish host bytes ([`put_bytes`](GpuPublisher::put_bytes))
/// or device memory ([`put_device`](GpuPublisher::put_device)), which are copied into a
/// block. Undeclared when dropped.
///
/// ```
/// use zenoh_cuda_shm::config::DeviceChoice;
/// use zenoh_cuda_shm::{GpuSession, ZcsConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let mut zenoh = zenoh::Config::default();
/// # zenoh.insert_json5("scouting/multicast/enabled", "false")?;
/// let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
/// let session = GpuSession::open(zenoh, cfg).wait()?;
/// let publisher = session.declare_publisher("doc/publisher").wait()?;
///
/// let mut loan = publisher.loan(1 << 20)?;
/// loan.write_bytes(0, b"header")?; // or write `loan.as_mut_slice()`, or kernels on a GPU
/// let report = publisher.put(loan)?;
/// println!("{report:?}");
/// publisher.put_bytes(&[1, 2, 3])?; // small: sent inline
/// # Ok(()) }
/// ```
pub struct GpuPublisher {
    core: PublisherCore,
    inline_threshold: usize,
}

impl std::fmt::Debug for GpuPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPublisher").field("key", &self.core.key()).finish()
    }
}

/// Publishing host or device data failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Device memory was given to a publisher whose session has no GPU.
    #[error(
        "this publisher's session has no GPU (host-memory blocks; its host_reason says why): publish host memory \
         instead, or open the session on a GPU"
    )]
    NoGpu,
    /// No block could be loaned.
    #[error(transparent)]
    Loan(#[from] LoanError),
    /// Writing into the block failed.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The put failed.
    #[error(transparent)]
    Put(#[from] PutError),
}

/// Writing into a loan failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The write does not fit the loaned length.
    #[error("write of {len} bytes at {offset} exceeds the loaned {loaned} bytes")]
    OutOfBounds {
        /// Offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Loaned length.
        loaned: usize,
    },
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// Enqueueing the ready signal failed.
    #[error(transparent)]
    Signal(#[from] SignalError),
}

enum LoanInner {
    Cuda(WriteGuard),
    Host(Loan<HostBackend>),
}

/// A block being written. Publish it with [`GpuPublisher::put`]; dropped unpublished,
/// it returns to the pool (after the work queued on its stream).
///
/// On a GPU, enqueue writes to [`device_ptr`](GpuLoan::device_ptr) on
/// [`stream`](GpuLoan::stream) (kernels, copies, [`write_bytes`](GpuLoan::write_bytes));
/// in a host-memory session write [`as_mut_slice`](GpuLoan::as_mut_slice).
///
/// ```
/// use zenoh_cuda_shm::config::DeviceChoice;
/// use zenoh_cuda_shm::{GpuSession, ZcsConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let mut zenoh = zenoh::Config::default();
/// # zenoh.insert_json5("scouting/multicast/enabled", "false")?;
/// let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
/// let session = GpuSession::open(zenoh, cfg).wait()?;
/// let publisher = session.declare_publisher("doc/loan").wait()?;
/// let mut loan = publisher.loan(4096)?;
/// match loan.as_mut_slice() {
///     Some(host) => host.fill(7),
///     None => { /* a GPU block: enqueue kernels on loan.stream() writing loan.device_ptr() */ }
/// }
/// let mut check = [0u8; 4];
/// loan.read_to_host(0, &mut check)?;
/// assert_eq!(check, [7; 4]);
/// publisher.put(loan)?;
/// # Ok(()) }
/// ```
pub struct GpuLoan {
    inner: LoanInner,
    meta: Option<Vec<u8>>,
    /// The instance of the publisher whose pool lent the block: only it may put it.
    owner: u64,
}

impl std::fmt::Debug for GpuLoan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLoan").field("len", &self.len()).field("device_ptr", &self.device_ptr()).finish()
    }
}

impl GpuLoan {
    /// The loaned length.
    pub fn len(&self) -> usize {
        match &self.inner {
            LoanInner::Cuda(g) => g.len(),
            LoanInner::Host(l) => l.len(),
        }
    }

    /// Whether the loaned length is zero (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device address to write (CUDA sessions).
    pub fn device_ptr(&self) -> Option<u64> {
        match &self.inner {
            LoanInner::Cuda(g) => Some(g.device_ptr()),
            LoanInner::Host(_) => None,
        }
    }

    /// The stream writes must be enqueued on (CUDA sessions): the ready signal follows
    /// them on it.
    pub fn stream(&self) -> Option<&Stream> {
        match &self.inner {
            LoanInner::Cuda(g) => Some(g.stream()),
            LoanInner::Host(_) => None,
        }
    }

    /// The device block's allocation (CUDA sessions): for lending the block to another
    /// transport once published ([`GpuPublisher::put_shared`]).
    pub fn device_allocation(&self) -> Option<DeviceAllocation<'_>> {
        match &self.inner {
            LoanInner::Cuda(g) => {
                let memory = g.inner().memory();
                Some(DeviceAllocation { allocation: Allocation::of(memory), fd: memory.fd(), capacity: memory.size() })
            }
            LoanInner::Host(_) => None,
        }
    }

    /// The block as host memory to write (host-memory sessions).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match &mut self.inner {
            LoanInner::Cuda(_) => None,
            LoanInner::Host(l) => Some(host_bytes_mut(l)),
        }
    }

    /// Copies host bytes into the loan at `offset` (host→device on the loan's stream
    /// for CUDA sessions).
    ///
    /// # Errors
    /// [`WriteError::OutOfBounds`] when `offset + data.len()` exceeds the loaned length
    /// (nothing is written); [`WriteError::Cuda`] when the copy cannot be enqueued.
    pub fn write_bytes(&mut self, offset: usize, data: &[u8]) -> Result<(), WriteError> {
        let loaned = self.len();
        if offset.checked_add(data.len()).is_none_or(|end| end > loaned) {
            return Err(WriteError::OutOfBounds { offset, len: data.len(), loaned });
        }
        match &mut self.inner {
            // SAFETY: the range is inside the loaned block (checked above), which this
            // loan owns and keeps mapped past the copy (a loan returns its block only
            // after its stream's work).
            LoanInner::Cuda(g) => unsafe { copy::host_to_device(g.stream(), g.device_ptr() + offset as u64, data) }?,
            LoanInner::Host(l) => host_bytes_mut(l)[offset..offset + data.len()].copy_from_slice(data),
        }
        Ok(())
    }

    /// Attaches typed metadata (e.g. an encoded tensor description).
    pub fn set_meta(&mut self, meta: Vec<u8>) {
        self.meta = Some(meta);
    }

    /// Copies `dst.len()` bytes of the loan at `offset` to host memory: for CUDA
    /// sessions a device→host copy on the loan's stream (after the writes enqueued
    /// there so far), waited for before returning.
    ///
    /// # Errors
    /// [`WriteError::OutOfBounds`] when `offset + dst.len()` exceeds the loaned length;
    /// [`WriteError::Cuda`] when the copy fails.
    pub fn read_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), WriteError> {
        let loaned = self.len();
        if offset.checked_add(dst.len()).is_none_or(|end| end > loaned) {
            return Err(WriteError::OutOfBounds { offset, len: dst.len(), loaned });
        }
        match &self.inner {
            // SAFETY: the range is inside the loaned block (checked above), which this
            // loan owns and keeps mapped while the copy runs (it returns after it).
            LoanInner::Cuda(g) => unsafe { copy::device_to_host(g.stream(), g.device_ptr() + offset as u64, dst) }?,
            LoanInner::Host(l) => {
                // SAFETY: the block is mapped with ≥ len bytes and owned by this loan; the
                // shared borrow of `self` excludes writes through `as_mut_slice` meanwhile.
                let src = unsafe { std::slice::from_raw_parts(l.addr() as *const u8, l.len()) };
                dst.copy_from_slice(&src[offset..offset + dst.len()]);
            }
        }
        Ok(())
    }
}

/// A host loan's bytes, to write.
fn host_bytes_mut(loan: &mut Loan<HostBackend>) -> &mut [u8] {
    // SAFETY: the loan owns the block exclusively until it is published, the block is
    // mapped with ≥ len bytes, and the slice borrows the loan mutably.
    unsafe { std::slice::from_raw_parts_mut(loan.addr() as *mut u8, loan.len()) }
}

impl GpuPublisher {
    /// A buffer of `len` bytes in the session's Zenoh SHM pool for copies out
    /// (`zenoh_shm_out_bytes`), for a payload put beside this publisher's (a ROS 2
    /// message's CDR): `None` without such a pool, or while it has no room.
    #[cfg(feature = "zenoh-shm")]
    pub fn shm_buffer(&self, len: usize) -> Option<zenoh::shm::ZShmMut> {
        self.core.shm_out().and_then(|s| s.buffer(len))
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.core.key()
    }

    /// Where this publisher's blocks live.
    pub fn backend(&self) -> BackendKind {
        match self.core.medium() {
            PubMedium::Cuda { .. } => BackendKind::CudaVmm,
            PubMedium::Host { .. } => BackendKind::HostMemfd,
        }
    }

    /// Loans a block of `len` bytes bound to the publisher's own stream.
    ///
    /// # Errors
    /// [`LoanError::ZeroLength`] for `len == 0`; [`LoanError::TooLarge`] when `len`
    /// alone exceeds the pool's byte cap; [`LoanError::Exhausted`] when the pool is at its
    /// caps and no block came back within `pool.loan_timeout_ms`; [`LoanError::Alloc`]
    /// when memory cannot be allocated.
    pub fn loan(&self, len: usize) -> Result<GpuLoan, LoanError> {
        self.loan_inner(len, None)
    }

    /// Loans a block bound to `stream`: enqueue the writes there; the ready signal
    /// follows them (any stream, the legacy default stream included). Host-memory
    /// publishers have no stream and ignore it.
    ///
    /// # Errors
    /// As [`GpuPublisher::loan`].
    pub fn loan_on(&self, len: usize, stream: &Stream) -> Result<GpuLoan, LoanError> {
        self.loan_inner(len, Some(stream))
    }

    /// A loan on `stream`, or on the publisher's own stream when `None`.
    fn loan_inner(&self, len: usize, stream: Option<&Stream>) -> Result<GpuLoan, LoanError> {
        let inner = match self.core.medium() {
            PubMedium::Cuda { pool, signals, stream: own, .. } => {
                let stream = stream.unwrap_or(own).clone();
                LoanInner::Cuda(WriteGuard::new(pool.loan(len)?, stream, Arc::clone(signals)))
            }
            PubMedium::Host { pool } => LoanInner::Host(pool.loan(len)?),
        };
        Ok(GpuLoan { inner, meta: None, owner: self.core.instance() })
    }

    /// Whether `loan` came from this publisher (only its own loans can be put).
    pub fn owns(&self, loan: &GpuLoan) -> bool {
        loan.owner == self.core.instance()
    }

    /// Publishes a loan: its ready signal is enqueued after its writes, then it goes
    /// out by the cheapest path for each subscriber.
    ///
    /// # Errors
    /// [`PutError::ForeignLoan`] for another publisher's loan (its block, which
    /// subscribers of this one could not tell from one of this pool's, goes back to its
    /// own pool unpublished); Zenoh and copy-out failures.
    pub fn put(&self, loan: GpuLoan) -> Result<PutReport, PutError> {
        self.put_shared(loan).map(|(report, _)| report)
    }

    /// [`GpuPublisher::put`], also returning a hold on a device block
    /// ([`SharedBlock`], `None` for a host block): the pool keeps the block out of reuse
    /// until the hold drops, for readers it cannot see (another transport's).
    ///
    /// # Errors
    /// As [`GpuPublisher::put`].
    pub fn put_shared(&self, loan: GpuLoan) -> Result<(PutReport, Option<SharedBlock>), PutError> {
        if !self.owns(&loan) {
            return Err(PutError::ForeignLoan { key: self.key().to_string() });
        }
        let (published, shared) = match loan.inner {
            LoanInner::Cuda(g) => {
                let p = g.finish()?;
                let shared = SharedBlock(p.clone());
                (PublishedAny::Cuda(p), Some(shared))
            }
            LoanInner::Host(l) => (PublishedAny::Host(l.publish()), None),
        };
        Ok((self.core.put_block(published, loan.meta)?, shared))
    }

    /// Publishes host bytes: inline up to the inline threshold, else through a block.
    ///
    /// # Errors
    /// [`PublishError::Loan`] when no block can be loaned (see [`GpuPublisher::loan`]);
    /// [`PublishError::Write`] when the copy into the block fails;
    /// [`PublishError::Put`] as for [`GpuPublisher::put`].
    pub fn put_bytes(&self, data: &[u8]) -> Result<PutReport, PublishError> {
        self.put_bytes_meta(data, None)
    }

    /// [`GpuPublisher::put_bytes`] with typed metadata.
    ///
    /// # Errors
    /// As [`GpuPublisher::put_bytes`].
    pub fn put_bytes_meta(&self, data: &[u8], meta: Option<Vec<u8>>) -> Result<PutReport, PublishError> {
        if data.len() <= self.inline_threshold {
            return Ok(self.core.put_inline(data.to_vec(), meta)?);
        }
        let mut loan = self.loan(data.len())?;
        loan.write_bytes(0, data)?;
        loan.meta = meta;
        Ok(self.put(loan)?)
    }

    /// Publishes `len` bytes of device memory at `src`, copied device→device on
    /// `stream` into a block (or to host, inline, below the threshold).
    ///
    /// # Safety
    /// `src..src+len` is device memory of this session's GPU, readable by work on
    /// `stream` and unchanged until that work has passed this copy.
    ///
    /// # Errors
    /// [`PublishError::NoGpu`] for a host-memory publisher; [`PublishError::Loan`] when
    /// no block can be loaned; [`PublishError::Write`] when the copy fails;
    /// [`PublishError::Put`] as for [`GpuPublisher::put`].
    pub unsafe fn put_device(&self, src: u64, len: usize, stream: &Stream) -> Result<PutReport, PublishError> {
        let PubMedium::Cuda { pool, signals, .. } = self.core.medium() else {
            return Err(PublishError::NoGpu);
        };
        if len <= self.inline_threshold {
            let mut host = vec![0u8; len];
            // SAFETY: the caller guarantees the source range.
            unsafe { copy::device_to_host(stream, src, &mut host) }.map_err(WriteError::from)?;
            return Ok(self.core.put_inline(host, None)?);
        }
        let guard = WriteGuard::new(pool.loan(len)?, stream.clone(), Arc::clone(signals));
        // SAFETY: the destination is the loaned block (≥ len bytes, owned by the guard,
        // which returns it only after the stream's work); the source is the caller's
        // contract.
        unsafe { copy::device_to_device(stream, guard.device_ptr(), src, len) }.map_err(WriteError::from)?;
        Ok(self.put(GpuLoan { inner: LoanInner::Cuda(guard), meta: None, owner: self.core.instance() })?)
    }

    /// Counters.
    pub fn stats(&self) -> PublisherStats {
        self.core.stats()
    }

    /// The subscribers on the zero-copy path and how many blocks each holds now, most
    /// first: when puts or loans wait (the pool runs dry, a subscriber at its lease
    /// limit), the first is the one holding the publisher back.
    pub fn holders(&self) -> Vec<crate::BlockHolder> {
        self.core.holders()
    }

    /// The pool's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.core.medium().stats()
    }

    /// The counters of the host blocks a CUDA publisher copies its messages into for
    /// subscribers of its host without CUDA; `None` until the first of them connects.
    pub fn host_pool_stats(&self) -> Option<PoolStats> {
        self.core.host_pool_stats()
    }

    /// GPU-ready subscriber connections (on the zero-copy path).
    pub fn zero_copy_subscribers(&self) -> usize {
        self.core.ready_count()
    }

    /// GPU-aware subscribers known from their tokens (ready or not).
    pub fn aware_subscribers(&self) -> usize {
        self.core.aware_count()
    }

    /// Whether someone listens on the plain key (and so costs a copy per message).
    pub fn plain_subscribers(&self) -> bool {
        self.core.plain_matching()
    }

    /// The Zenoh session.
    pub fn session(&self) -> &zenoh::Session {
        self.core.session()
    }
}
