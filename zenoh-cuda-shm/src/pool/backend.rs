//! Where a pool's blocks come from: CUDA VMM device memory, or sealed host memfds.
//!
//! The pool's logic (size classes, generations, leases, caps, recycling, trimming) is
//! the same for both; only allocation differs. The host backend is what runs where
//! there is no GPU — in CI, and as the CPU fallback of the examples — so every line of
//! the pool is exercised without a GPU.

use std::ffi::CString;
use std::os::fd::BorrowedFd;

use crate::cuda::{CudaError, DeviceBlock, Gpu};
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
}

/// One allocation a pool can lend: an address in this process and an FD for peers.
pub trait BlockMemory: Send + Sync + 'static {
    /// Address of the first byte in this process (a device pointer for CUDA memory).
    fn addr(&self) -> u64;
    /// Size in bytes.
    fn size(&self) -> usize;
    /// The exported descriptor, to send to peers with `SCM_RIGHTS`.
    fn fd(&self) -> BorrowedFd<'_>;
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

/// Device memory of one GPU through CUDA VMM.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    gpu: Gpu,
}

impl CudaBackend {
    /// Blocks on `gpu`.
    pub fn new(gpu: Gpu) -> Self {
        Self { gpu }
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Backend for CudaBackend {
    type Memory = DeviceBlock;
    fn kind(&self) -> BackendKind {
        BackendKind::CudaVmm
    }
    fn granularity(&self) -> usize {
        self.gpu.granularity()
    }
    fn allocate(&self, size: usize) -> Result<DeviceBlock, AllocError> {
        DeviceBlock::allocate(&self.gpu, size).map_err(|source| AllocError::Cuda { size, source })
    }
}

/// Host shared memory (sealed memfds).
#[derive(Debug, Clone)]
pub struct HostBackend {
    granularity: usize,
    name: CString,
}

impl HostBackend {
    /// The default granularity: 2 MiB, the same as current GPUs, so size classes and
    /// caps behave the same on both backends.
    pub const DEFAULT_GRANULARITY: usize = 2 << 20;

    /// Blocks in multiples of `granularity` bytes (rounded up to the page size).
    pub fn new(granularity: usize) -> Self {
        let page = 4096;
        let granularity = granularity.max(page).next_multiple_of(page);
        Self { granularity, name: c"zcs-block".to_owned() }
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new(Self::DEFAULT_GRANULARITY)
    }
}

impl Backend for HostBackend {
    type Memory = HostBlock;
    fn kind(&self) -> BackendKind {
        BackendKind::HostMemfd
    }
    fn granularity(&self) -> usize {
        self.granularity
    }
    fn allocate(&self, size: usize) -> Result<HostBlock, AllocError> {
        HostBlock::create(&self.name, size).map_err(|source| AllocError::Host { size, source })
    }
}
