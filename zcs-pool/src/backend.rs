//! Where a pool's blocks come from: CUDA VMM device memory, or sealed host memfds.
//!
//! The pool's logic (size classes, generations, leases, caps, recycling, trimming) is
//! the same for both; only allocation differs. The host backend is what runs where
//! there is no GPU — in CI, and as the CPU fallback of the examples — so every line of
//! the pool is exercised without a GPU.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::cuda::{CudaError, DeviceBlock, Gpu, ImportedBlock, VmmMapping};
use crate::host::HostBlock;

/// Which kind of memory a pool holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BackendKind {
    /// CUDA VMM device memory, exported as POSIX FDs.
    CudaVmm,
    /// Host shared memory (sealed memfd).
    HostMemfd,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::CudaVmm => "cuda-vmm",
            Self::HostMemfd => "host-memfd",
        })
    }
}

/// An allocation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The driver refused (out of device memory, or another driver error).
    #[error("device allocation of {size} bytes failed")]
    Cuda {
        /// Bytes asked for.
        size: usize,
        /// The driver error.
        #[source]
        source: CudaError,
    },
    /// The OS refused (memfd, ftruncate, mmap).
    #[error("host allocation of {size} bytes failed")]
    Host {
        /// Bytes asked for.
        size: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The host provider refused to lend a block (its caps), or lent one of another size.
    #[error("the host provider could not lend {size} bytes: {reason}")]
    Lent {
        /// Bytes asked for.
        size: usize,
        /// Why, in the provider's words.
        reason: String,
    },
    /// A block the host provider lent cannot be mapped here.
    #[error("cannot map the {size}-byte block the host provider lent")]
    LentMap {
        /// Bytes asked for.
        size: usize,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// A block lent by a [`Lender`]: its id there, its FD, its size.
#[derive(Debug)]
pub struct Borrowed {
    /// The loan id (what descriptors name).
    pub loan: u64,
    /// The block's FD.
    pub fd: OwnedFd,
    /// The block's size.
    pub size: usize,
}

/// Why a [`Lender`] did not lend.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct BorrowError {
    /// The lender is gone (or cannot serve this device): allocate locally instead.
    pub unavailable: bool,
    /// Why.
    pub reason: String,
}

/// Where a backend borrows blocks instead of allocating them: the host provider
/// (`crate::provider`). The pool above does not see the difference: a lent block is
/// loaned, leased, recycled and trimmed like an owned one, and given back when the pool
/// drops it.
pub trait Lender: Send + Sync + 'static {
    /// Borrows a block of `size` bytes (a multiple of the granularity).
    fn borrow(&self, size: usize) -> Result<Borrowed, BorrowError>;
    /// Gives a loan back. Must not block for long or panic (called from `Drop`).
    fn give_back(&self, loan: u64);
}

/// Memory lent by a [`Lender`], mapped here; given back once unmapped.
pub struct LentMemory<M> {
    // Fields drop in this order: the mapping, our FD, then the loan is given back, so
    // the lender never sees a block back that its borrower still maps.
    mem: M,
    fd: OwnedFd,
    loan: LoanGuard,
}

struct LoanGuard {
    loan: u64,
    lender: Arc<dyn Lender>,
}

impl Drop for LoanGuard {
    fn drop(&mut self) {
        self.lender.give_back(self.loan);
    }
}

impl<M> std::fmt::Debug for LentMemory<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentMemory").field("loan", &self.loan.loan).finish_non_exhaustive()
    }
}

/// What a lent mapping offers (an imported VMM mapping, or a mapped memfd).
pub trait MappedMemory: Send + Sync + 'static {
    /// Address of the first byte in this process.
    fn addr(&self) -> u64;
    /// Size in bytes.
    fn size(&self) -> usize;
}

impl MappedMemory for ImportedBlock {
    fn addr(&self) -> u64 {
        self.device_ptr()
    }
    fn size(&self) -> usize {
        ImportedBlock::size(self)
    }
}

impl MappedMemory for HostBlock {
    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }
    fn size(&self) -> usize {
        HostBlock::size(self)
    }
}

/// A block a pool can lend: allocated here, or borrowed from the host provider.
#[derive(Debug)]
pub enum Sourced<O, L> {
    /// Allocated by this process.
    Owned(O),
    /// Lent by the host provider.
    Lent(LentMemory<L>),
}

/// One allocation a pool can lend: an address in this process and an FD for peers.
pub trait BlockMemory: Send + Sync + 'static {
    /// Address of the first byte in this process (a device pointer for CUDA memory).
    fn addr(&self) -> u64;
    /// Size in bytes.
    fn size(&self) -> usize;
    /// The exported descriptor, to send to peers with `SCM_RIGHTS`.
    fn fd(&self) -> BorrowedFd<'_>;
    /// The provider's loan id when the block is lent by the host provider.
    fn lent(&self) -> Option<u64> {
        None
    }
}

impl<O: BlockMemory, L: MappedMemory> BlockMemory for Sourced<O, L> {
    fn addr(&self) -> u64 {
        match self {
            Self::Owned(o) => o.addr(),
            Self::Lent(l) => l.mem.addr(),
        }
    }
    fn size(&self) -> usize {
        match self {
            Self::Owned(o) => o.size(),
            Self::Lent(l) => l.mem.size(),
        }
    }
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Owned(o) => o.fd(),
            Self::Lent(l) => l.fd.as_fd(),
        }
    }
    fn lent(&self) -> Option<u64> {
        match self {
            Self::Owned(_) => None,
            Self::Lent(l) => Some(l.loan.loan),
        }
    }
}

impl Sourced<DeviceBlock, ImportedBlock> {
    /// The block's mapping in this process.
    pub fn mapping(&self) -> &VmmMapping {
        match self {
            Self::Owned(o) => o.mapping(),
            Self::Lent(l) => l.mem.mapping(),
        }
    }
}

impl Sourced<HostBlock, HostBlock> {
    /// The mapped block.
    pub fn block(&self) -> &HostBlock {
        match self {
            Self::Owned(o) => o,
            Self::Lent(l) => &l.mem,
        }
    }
}

/// Borrows from `lender` if there is one; a lender that is gone means allocating here.
fn borrow_or_allocate<O, L>(
    lender: Option<&Arc<dyn Lender>>,
    size: usize,
    map: impl FnOnce(OwnedFd, usize) -> Result<L, Box<dyn std::error::Error + Send + Sync>>,
    allocate: impl FnOnce() -> Result<O, AllocError>,
) -> Result<Sourced<O, L>, AllocError> {
    let Some(lender) = lender else { return allocate().map(Sourced::Owned) };
    match lender.borrow(size) {
        Ok(b) => {
            let loan = LoanGuard { loan: b.loan, lender: Arc::clone(lender) };
            if b.size != size {
                return Err(AllocError::Lent { size, reason: format!("lent a block of {} bytes", b.size) });
            }
            let fd = b.fd.try_clone().map_err(|e| AllocError::LentMap { size, source: e.into() })?;
            let mem = map(b.fd, size).map_err(|source| AllocError::LentMap { size, source })?;
            Ok(Sourced::Lent(LentMemory { mem, fd, loan }))
        }
        Err(e) if e.unavailable => {
            tracing::debug!(reason = %e, "host provider unavailable: allocating in this process");
            allocate().map(Sourced::Owned)
        }
        Err(e) => Err(AllocError::Lent { size, reason: e.reason }),
    }
}

/// A source of blocks.
pub trait Backend: Send + Sync + 'static {
    /// The allocation type.
    type Memory: BlockMemory;
    /// What kind of memory this is.
    fn kind(&self) -> BackendKind;
    /// Allocation granularity; block sizes are multiples of it.
    fn granularity(&self) -> usize;
    /// Allocates `size` bytes (a multiple of the granularity), exported once.
    fn allocate(&self, size: usize) -> Result<Self::Memory, AllocError>;
}

impl BlockMemory for DeviceBlock {
    fn addr(&self) -> u64 {
        self.device_ptr()
    }
    fn size(&self) -> usize {
        DeviceBlock::size(self)
    }
    fn fd(&self) -> BorrowedFd<'_> {
        DeviceBlock::fd(self)
    }
}

impl BlockMemory for HostBlock {
    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }
    fn size(&self) -> usize {
        HostBlock::size(self)
    }
    fn fd(&self) -> BorrowedFd<'_> {
        HostBlock::fd(self)
    }
}

/// Device memory of one GPU through CUDA VMM, allocated here or borrowed from the
/// host provider.
#[derive(Clone)]
pub struct CudaBackend {
    gpu: Gpu,
    lender: Option<Arc<dyn Lender>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("gpu", &self.gpu).field("lent", &self.lender.is_some()).finish()
    }
}

impl CudaBackend {
    /// Blocks on `gpu`, allocated by this process.
    pub fn new(gpu: Gpu) -> Self {
        Self { gpu, lender: None }
    }

    /// Blocks borrowed from `lender`, if there is one, while it lends (allocated here
    /// when it is gone).
    pub fn with_lender(mut self, lender: Option<Arc<dyn Lender>>) -> Self {
        self.lender = lender;
        self
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Backend for CudaBackend {
    type Memory = Sourced<DeviceBlock, ImportedBlock>;
    fn kind(&self) -> BackendKind {
        BackendKind::CudaVmm
    }
    fn granularity(&self) -> usize {
        self.gpu.granularity()
    }
    fn allocate(&self, size: usize) -> Result<Self::Memory, AllocError> {
        borrow_or_allocate(
            self.lender.as_ref(),
            size,
            |fd, size| ImportedBlock::import(&self.gpu, fd, size).map_err(Into::into),
            || DeviceBlock::allocate(&self.gpu, size).map_err(|source| AllocError::Cuda { size, source }),
        )
    }
}

/// Host shared memory (sealed memfds), allocated here or borrowed from the host
/// provider.
#[derive(Clone)]
pub struct HostBackend {
    granularity: usize,
    name: CString,
    lender: Option<Arc<dyn Lender>>,
}

impl std::fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBackend")
            .field("granularity", &self.granularity)
            .field("lent", &self.lender.is_some())
            .finish()
    }
}

impl HostBackend {
    /// The default granularity: 2 MiB, the same as current GPUs, so size classes and
    /// caps behave the same on both backends.
    pub const DEFAULT_GRANULARITY: usize = 2 << 20;

    /// Blocks in multiples of `granularity` bytes (rounded up to the page size).
    pub fn new(granularity: usize) -> Self {
        let page = 4096;
        let granularity = granularity.max(page).next_multiple_of(page);
        Self { granularity, name: c"zcs-block".to_owned(), lender: None }
    }

    /// Blocks borrowed from `lender`, if there is one, while it lends (allocated here
    /// when it is gone).
    pub fn with_lender(mut self, lender: Option<Arc<dyn Lender>>) -> Self {
        self.lender = lender;
        self
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new(Self::DEFAULT_GRANULARITY)
    }
}

impl Backend for HostBackend {
    type Memory = Sourced<HostBlock, HostBlock>;
    fn kind(&self) -> BackendKind {
        BackendKind::HostMemfd
    }
    fn granularity(&self) -> usize {
        self.granularity
    }
    fn allocate(&self, size: usize) -> Result<Self::Memory, AllocError> {
        borrow_or_allocate(
            self.lender.as_ref(),
            size,
            |fd, size| HostBlock::import(fd, size).map_err(Into::into),
            || HostBlock::create(&self.name, size).map_err(|source| AllocError::Host { size, source }),
        )
    }
}

/// Sealed host memfds page-locked and registered with one GPU's driver, so a
/// device→host copy into them runs at full speed: the blocks a CUDA publisher copies
/// its messages into for subscribers of its host that cannot map GPU memory. Never lent
/// by the host provider.
#[derive(Clone)]
pub struct PinnedHostBackend {
    gpu: Gpu,
    host: HostBackend,
}

impl PinnedHostBackend {
    /// Pinned host blocks of `gpu`'s granularity, registered with its context.
    pub fn new(gpu: Gpu) -> Self {
        let mut host = HostBackend::new(gpu.granularity());
        host.name = c"zcs-host-block".to_owned();
        Self { gpu, host }
    }
}

/// A memfd block registered with the driver while it lives.
pub struct PinnedHostBlock {
    // Dropped in this order: unregistered, then unmapped.
    registration: crate::cuda::pinned::HostRegistration,
    block: HostBlock,
}

impl PinnedHostBlock {
    /// The mapped block.
    pub fn block(&self) -> &HostBlock {
        &self.block
    }
}

impl BlockMemory for PinnedHostBlock {
    fn addr(&self) -> u64 {
        self.block.as_ptr() as u64
    }
    fn size(&self) -> usize {
        debug_assert_eq!(self.registration.len(), self.block.size());
        self.block.size()
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.block.fd()
    }
}

impl Backend for PinnedHostBackend {
    type Memory = PinnedHostBlock;
    fn kind(&self) -> BackendKind {
        BackendKind::HostMemfd
    }
    fn granularity(&self) -> usize {
        self.host.granularity
    }
    fn allocate(&self, size: usize) -> Result<Self::Memory, AllocError> {
        let block = HostBlock::create(&self.host.name, size).map_err(|source| AllocError::Host { size, source })?;
        // SAFETY: the range is the block's fresh mapping, which outlives the
        // registration (dropped first, see the field order) and overlaps no other
        // registration. The pool drops a block only once no hold remains, and the
        // publisher holds each block until the copies into it have completed.
        let registration = unsafe { crate::cuda::pinned::HostRegistration::new(&self.gpu, block.as_ptr(), size) }
            .map_err(|source| AllocError::Cuda { size, source })?;
        Ok(PinnedHostBlock { registration, block })
    }
}
