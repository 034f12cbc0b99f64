//! RAII owners over CUDA virtual memory management.
//!
//! One owner per driver lifetime, as in cuda.core's ownership model:
//!
//! | owner | acquired by | released by |
//! |---|---|---|
//! | [`PhysicalAllocation`] | `cuMemCreate` / `cuMemImportFromShareableHandle` | `cuMemRelease` |
//! | [`VaRange`] | `cuMemAddressReserve` | `cuMemAddressFree` |
//! | [`Mapping`] | `cuMemMap` + `cuMemSetAccess` | `cuMemUnmap` |
//!
//! [`VmmMapping`] holds the three in the order that makes their drops correct: unmap,
//! then release the handle, then free the address range, then (last) let go of the
//! context. [`DeviceBlock`] is a mapping this process allocated, with its POSIX FD
//! exported once at creation; [`ImportedBlock`] is a mapping of another process's
//! allocation, imported from a received FD that is closed right after the import.
//!
//! Drops never panic. A failing driver call in `Drop` is logged at WARN and counted
//! ([`drop_errors`]).

// Re-exported by `zenoh-cuda-shm`: errors and panics documented as there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cudarc::driver::sys::{CUdeviceptr, CUmemGenericAllocationHandle};

use super::Gpu;
use super::sys::{self, CudaError};

static DROP_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Driver calls that failed inside a `Drop` of this module since the process started.
pub fn drop_errors() -> u64 {
    DROP_ERRORS.load(std::sync::atomic::Ordering::Relaxed)
}

fn drop_call(gpu: &Gpu, what: &'static str, r: impl FnOnce() -> Result<(), CudaError>) {
    if !gpu.bind_for_drop(what) {
        return;
    }
    if let Err(e) = r() {
        // Logged and counted, not recorded in cudarc's context: cudarc's next
        // `bind_to_thread` would return a recorded error, failing an unrelated call.
        tracing::warn!(error = %crate::error::Chain(&e), what, "driver call failed in drop");
        DROP_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A physical device allocation (a generic allocation handle).
#[derive(Debug)]
pub struct PhysicalAllocation {
    handle: CUmemGenericAllocationHandle,
    size: usize,
    gpu: Gpu,
}

impl PhysicalAllocation {
    /// Allocates `size` bytes (a multiple of [`Gpu::granularity`]) of pinned device
    /// memory that can be exported as a POSIX file descriptor.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or `cuMemCreate` fails
    /// (out of device memory, a size that is not a multiple of the granularity).
    pub fn create(gpu: &Gpu, size: usize) -> Result<Self, CudaError> {
        gpu.bind()?;
        // SAFETY: the context is current (bind above); `VmmMapping::allocate` and the
        // pool round `size` up to the granularity before calling this.
        let handle = unsafe { sys::mem_create(size, gpu.ordinal() as i32) }?;
        Ok(Self { handle, size, gpu: gpu.clone() })
    }

    /// Imports an allocation exported by another process. `size` must be the size
    /// it was created with (it travels in our protocol; the FD does not carry it).
    /// The caller keeps ownership of `fd` and may close it right after this returns.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or
    /// `cuMemImportFromShareableHandle` refuses `fd` (not an allocation's descriptor, of
    /// another device).
    pub fn import(gpu: &Gpu, fd: BorrowedFd<'_>, size: usize) -> Result<Self, CudaError> {
        gpu.bind()?;
        // SAFETY: the context is current; `fd` is open for the duration of the call.
        let handle = unsafe { sys::import_fd(fd) }?;
        Ok(Self { handle, size, gpu: gpu.clone() })
    }

    /// Exports the allocation as a new POSIX file descriptor owned by the caller.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or
    /// `cuMemExportToShareableHandle` fails (out of file descriptors, say).
    pub fn export_fd(&self) -> Result<OwnedFd, CudaError> {
        // SAFETY: `handle` is live for `self`'s lifetime and was created with the
        // POSIX-FD handle type (`create`) or imported from one (`import`).
        unsafe { sys::export_fd(self.handle) }
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for PhysicalAllocation {
    fn drop(&mut self) {
        // SAFETY: `handle` is owned by `self` and released exactly once, here.
        drop_call(&self.gpu, "cuMemRelease", || unsafe { sys::mem_release(self.handle) });
    }
}

/// A reserved range of device virtual addresses.
#[derive(Debug)]
pub struct VaRange {
    ptr: CUdeviceptr,
    size: usize,
    gpu: Gpu,
}

impl VaRange {
    /// Reserves `size` bytes of virtual address space aligned to the granularity.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current or `cuMemAddressReserve`
    /// fails (address space exhausted).
    pub fn reserve(gpu: &Gpu, size: usize) -> Result<Self, CudaError> {
        gpu.bind()?;
        // SAFETY: the context is current; the range is freed by `Drop`.
        let ptr = unsafe { sys::address_reserve(size, gpu.granularity()) }?;
        Ok(Self { ptr, size, gpu: gpu.clone() })
    }
}

impl Drop for VaRange {
    fn drop(&mut self) {
        // SAFETY: the range was reserved by `reserve`; `VmmMapping` declares its
        // `Mapping` before its `VaRange`, so the range is unmapped before this runs.
        drop_call(&self.gpu, "cuMemAddressFree", || unsafe { sys::address_free(self.ptr, self.size) });
    }
}

/// A physical allocation mapped read-write into a reserved range.
#[derive(Debug)]
pub struct Mapping {
    ptr: CUdeviceptr,
    size: usize,
    gpu: Gpu,
}

impl Mapping {
    /// Maps `phys` at the start of `va` and grants this device read-write access.
    ///
    /// # Errors
    /// [`CudaError`] when the context cannot be made current, `cuMemMap` fails (`va`
    /// smaller than `phys`) or `cuMemSetAccess` fails.
    pub fn map(gpu: &Gpu, va: &VaRange, phys: &PhysicalAllocation) -> Result<Self, CudaError> {
        let size = phys.size;
        debug_assert!(size <= va.size);
        gpu.bind()?;
        // SAFETY: `va` is reserved with at least `size` bytes and nothing mapped in it
        // (a fresh VaRange is only ever mapped once, by this call); `phys` owns `size`.
        unsafe { sys::map(va.ptr, size, phys.handle) }?;
        let mapping = Self { ptr: va.ptr, size, gpu: gpu.clone() };
        // SAFETY: the range was mapped just above. On failure `mapping` drops and unmaps.
        unsafe { sys::set_access_rw(va.ptr, size, gpu.ordinal() as i32) }?;
        Ok(mapping)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `map` and is unmapped once. Callers of the
        // crate's guards order GPU work before the owner drops (see docs/safety.md).
        drop_call(&self.gpu, "cuMemUnmap", || unsafe { sys::unmap(self.ptr, self.size) });
    }
}

/// Physical memory mapped at a device address in this process.
///
/// Fields drop top to bottom: unmap, release the handle, free the VA range. Each owner
/// holds a [`Gpu`], which keeps the primary context alive until the last one is gone.
#[derive(Debug)]
pub struct VmmMapping {
    mapping: Mapping,
    #[expect(dead_code, reason = "held only for its Drop, which must run after the unmap")]
    phys: PhysicalAllocation,
    va: VaRange,
}

impl VmmMapping {
    fn new(gpu: &Gpu, phys: PhysicalAllocation) -> Result<Self, CudaError> {
        let va = VaRange::reserve(gpu, phys.size)?;
        let mapping = Mapping::map(gpu, &va, &phys)?;
        Ok(Self { mapping, phys, va })
    }

    /// Device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.mapping.ptr
    }

    /// Mapped size in bytes.
    pub fn size(&self) -> usize {
        self.mapping.size
    }

    /// The device this mapping lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.va.gpu
    }
}

/// Rounds `len` up to a multiple of the device's allocation granularity.
pub fn round_to_granularity(gpu: &Gpu, len: usize) -> Option<usize> {
    let g = gpu.granularity();
    len.max(1).checked_next_multiple_of(g)
}

/// A device allocation made by this process, mapped here, with its POSIX FD exported
/// once at creation so handing it to a peer costs no driver call.
#[derive(Debug)]
pub struct DeviceBlock {
    map: VmmMapping,
    fd: OwnedFd,
}

impl DeviceBlock {
    /// Allocates, maps and exports `len` bytes rounded up to the granularity.
    ///
    /// # Errors
    /// [`CudaError`] naming `cuMemCreate` with `CUDA_ERROR_INVALID_VALUE` when `len`
    /// rounded up overflows `usize`; otherwise the failed call of the allocation
    /// ([`PhysicalAllocation::create`]), the export or the mapping ([`VaRange::reserve`], [`Mapping::map`]).
    pub fn allocate(gpu: &Gpu, len: usize) -> Result<Self, CudaError> {
        let size = round_to_granularity(gpu, len)
            .ok_or(CudaError::from_code("cuMemCreate", cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE))?;
        let _span = tracing::trace_span!("export", size).entered();
        let phys = PhysicalAllocation::create(gpu, size)?;
        let fd = phys.export_fd()?;
        let map = VmmMapping::new(gpu, phys)?;
        Ok(Self { map, fd })
    }

    /// The mapping in this process.
    pub fn mapping(&self) -> &VmmMapping {
        &self.map
    }

    /// Device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.map.device_ptr()
    }

    /// Size in bytes (a multiple of the granularity).
    pub fn size(&self) -> usize {
        self.map.size()
    }

    /// The exported FD. Send it with `SCM_RIGHTS` (the kernel duplicates it); it stays
    /// owned by the block and is closed when the block drops.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Runs the import path once on a block of our own (allocate, export, import the FD,
/// map, unmap, free). The first import in a process costs two to three times a later
/// one (169 µs against 65 µs for 2 MiB on an H200, `docs/benchmarks.md`), and doing it
/// once on our own block is enough: a first import from another process then costs
/// ≈ 77 µs. Done when a session opens, it keeps that cost out of the first handshake.
///
/// # Errors
/// The [`CudaError`] of the first step that fails ([`DeviceBlock::allocate`],
/// [`ImportedBlock::import`]), or one naming `dup` when the descriptor cannot be
/// duplicated.
pub fn warm_import_path(gpu: &Gpu) -> Result<(), CudaError> {
    let block = DeviceBlock::allocate(gpu, 1)?;
    let fd = block
        .fd()
        .try_clone_to_owned()
        .map_err(|_| CudaError::from_code("dup", cudarc::driver::sys::CUresult::CUDA_ERROR_OPERATING_SYSTEM))?;
    let imported = ImportedBlock::import(gpu, fd, block.size())?;
    drop((imported, block));
    Ok(())
}

/// Another process's device allocation, imported from its FD and mapped here.
///
/// The physical memory stays alive while this mapping exists, even if the exporting
/// process exits (VMM keeps memory alive while any process maps it).
#[derive(Debug)]
pub struct ImportedBlock {
    map: VmmMapping,
}

impl ImportedBlock {
    /// Imports `fd` (an allocation of exactly `size` bytes), maps it read-write and
    /// closes the descriptor.
    ///
    /// # Errors
    /// As [`PhysicalAllocation::import`], [`VaRange::reserve`] and [`Mapping::map`];
    /// `fd` is closed in every case.
    pub fn import(gpu: &Gpu, fd: OwnedFd, size: usize) -> Result<Self, CudaError> {
        let _span = tracing::trace_span!("import", size).entered();
        let phys = PhysicalAllocation::import(gpu, fd.as_fd(), size)?;
        drop(fd);
        Ok(Self { map: VmmMapping::new(gpu, phys)? })
    }

    /// The mapping in this process.
    pub fn mapping(&self) -> &VmmMapping {
        &self.map
    }

    /// Device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.map.device_ptr()
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.map.size()
    }
}
