//! Every raw CUDA driver call the crate makes, and nothing else.
//!
//! This is the `result` level of cudarc's three levels (`sys` → `result` → safe): thin
//! `unsafe fn`s that call one `cudarc::driver::sys` function, turn its `CUresult` into
//! a [`CudaError`] naming the call, and trace their arguments. cudarc 0.19 wraps
//! contexts, streams, events and copies safely, but not the VMM (`cuMem*`), stream
//! memory operations, IPC event handles or module loading from PTX text without NVRTC;
//! those live here. The RAII owners in [`super::vmm`], [`super::event`] and
//! `kernels` (test support) and the stream operations of [`super::copy`] call them; nothing
//! outside the CUDA layer does.
//!
//! Every function here requires that the driver library was found and initialised
//! (see [`super::Gpu::probe`]): with cudarc's `dynamic-loading`, calling any of them on
//! a machine without libcuda panics inside cudarc.

use std::ffi::{CStr, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use cudarc::driver::DriverError;
use cudarc::driver::sys;

/// A failed driver call: which call, and the `CUresult` it returned.
///
/// Its [`source`](std::error::Error::source) is the driver's error, whose `Display`
/// asks the driver for the code's description.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{call} failed: {source}")]
pub struct CudaError {
    /// The driver entry point that failed, e.g. `"cuMemCreate"`.
    pub call: &'static str,
    /// The driver's error code.
    #[source]
    source: DriverError,
}

impl CudaError {
    /// The driver's `CUresult` code as a number, as `cuda.h` defines it (`2`
    /// `CUDA_ERROR_OUT_OF_MEMORY`, `4` `CUDA_ERROR_DEINITIALIZED`, …). Never `0`
    /// (`CUDA_SUCCESS`).
    pub fn code(&self) -> u32 {
        self.source.0 as u32
    }

    /// Whether the driver is shutting down (`CUDA_ERROR_DEINITIALIZED`): the process is
    /// exiting and the driver releases everything the process held.
    pub fn is_driver_shutdown(&self) -> bool {
        self.source.0 == sys::CUresult::CUDA_ERROR_DEINITIALIZED
    }

    /// An error of `call` with the driver's code `rc`, for failures found without a
    /// driver call (an invalid size, a failed `dup`), named as the driver would.
    pub(crate) fn from_code(call: &'static str, rc: sys::CUresult) -> Self {
        Self { call, source: DriverError(rc) }
    }
}

/// Turns a `CUresult` into `Result`, naming the call.
pub(crate) fn check(call: &'static str, rc: sys::CUresult) -> Result<(), CudaError> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        tracing::debug!(call, ?rc, "driver call failed");
        Err(CudaError { call, source: DriverError(rc) })
    }
}

/// Wraps a cudarc `DriverError` from its safe API with the call it came from.
pub(crate) fn wrap(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |source| {
        tracing::debug!(call, ?source, "driver call failed");
        CudaError { call, source }
    }
}

fn device_location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal }
}

fn pinned_posix_fd_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: device_location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `cuMemGetAllocationGranularity(MINIMUM)` for pinned, FD-exportable device memory.
///
/// # Safety
/// The driver is initialised and a context for `ordinal` is current on this thread.
pub unsafe fn granularity(ordinal: i32) -> Result<usize, CudaError> {
    let prop = pinned_posix_fd_prop(ordinal);
    let mut gran = 0usize;
    // SAFETY: `prop` is a fully initialised allocation property and `gran` is a valid
    // out-pointer for the duration of the call.
    let rc = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut gran,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    check("cuMemGetAllocationGranularity", rc)?;
    tracing::trace!(ordinal, gran, "cuMemGetAllocationGranularity");
    Ok(gran)
}

/// `cuMemCreate`: `size` bytes of pinned device memory on `ordinal`, exportable as a
/// POSIX file descriptor. Returns the generic allocation handle.
///
/// # Safety
/// The driver is initialised, a context for `ordinal` is current, and `size` is a
/// multiple of [`granularity`]. The caller owns the handle and must `cuMemRelease` it.
pub unsafe fn mem_create(size: usize, ordinal: i32) -> Result<sys::CUmemGenericAllocationHandle, CudaError> {
    let prop = pinned_posix_fd_prop(ordinal);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `prop` is initialised, `handle` is a valid out-pointer; the size rule is
    // the caller's contract.
    let rc = unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) };
    tracing::trace!(size, ordinal, handle, ?rc, "cuMemCreate");
    check("cuMemCreate", rc)?;
    Ok(handle)
}

/// `cuMemRelease`.
///
/// # Safety
/// `handle` came from [`mem_create`] or [`import_fd`] and is released exactly once.
/// Memory still mapped stays alive until it is unmapped (CUDA VMM semantics).
pub unsafe fn mem_release(handle: sys::CUmemGenericAllocationHandle) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees `handle` is live and released once.
    let rc = unsafe { sys::cuMemRelease(handle) };
    tracing::trace!(handle, ?rc, "cuMemRelease");
    check("cuMemRelease", rc)
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor.
///
/// The returned descriptor is owned by the caller; the driver keeps no reference to it.
///
/// # Safety
/// `handle` is a live allocation created with the POSIX-FD handle type.
pub unsafe fn export_fd(handle: sys::CUmemGenericAllocationHandle) -> Result<OwnedFd, CudaError> {
    let mut fd: libc::c_int = -1;
    // SAFETY: for CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the shareable handle is an
    // `int` written through the pointer; `fd` lives across the call.
    let rc = unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut libc::c_int).cast::<c_void>(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    tracing::trace!(handle, fd, ?rc, "cuMemExportToShareableHandle");
    check("cuMemExportToShareableHandle", rc)?;
    // SAFETY: on success the driver returned a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `cuMemImportFromShareableHandle` from a POSIX file descriptor.
///
/// The driver does not take ownership of `fd` for this handle type (unlike external
/// memory); the caller closes it after the call, as NVIDIA's `memMapIPCDrv` sample does.
///
/// # Safety
/// The driver is initialised and a context is current on this thread.
pub unsafe fn import_fd(fd: BorrowedFd<'_>) -> Result<sys::CUmemGenericAllocationHandle, CudaError> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    let raw = fd.as_raw_fd();
    // SAFETY: for the POSIX-FD handle type the "pointer" argument carries the fd value
    // itself (`(void*)(uintptr_t)fd`); `fd` is open for the duration of the call.
    let rc = unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            raw as usize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    };
    tracing::trace!(fd = raw, handle, ?rc, "cuMemImportFromShareableHandle");
    check("cuMemImportFromShareableHandle", rc)?;
    Ok(handle)
}

/// `cuMemAddressReserve(size, align)`.
///
/// # Safety
/// The driver is initialised. The caller frees the range with [`address_free`].
pub unsafe fn address_reserve(size: usize, align: usize) -> Result<sys::CUdeviceptr, CudaError> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer; no fixed address is requested.
    let rc = unsafe { sys::cuMemAddressReserve(&mut ptr, size, align, 0, 0) };
    tracing::trace!(size, align, ptr, ?rc, "cuMemAddressReserve");
    check("cuMemAddressReserve", rc)?;
    Ok(ptr)
}

/// `cuMemAddressFree`.
///
/// # Safety
/// `(ptr, size)` is a range from [`address_reserve`] with nothing mapped in it, freed once.
pub unsafe fn address_free(ptr: sys::CUdeviceptr, size: usize) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the range is reserved, unmapped and freed once.
    let rc = unsafe { sys::cuMemAddressFree(ptr, size) };
    tracing::trace!(ptr, size, ?rc, "cuMemAddressFree");
    check("cuMemAddressFree", rc)
}

/// `cuMemMap(ptr, size, 0, handle, 0)`.
///
/// # Safety
/// `(ptr, size)` lies in a reserved, unmapped range and `handle` owns at least `size` bytes.
pub unsafe fn map(
    ptr: sys::CUdeviceptr,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the range and handle sizes.
    let rc = unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) };
    tracing::trace!(ptr, size, handle, ?rc, "cuMemMap");
    check("cuMemMap", rc)
}

/// `cuMemUnmap`.
///
/// # Safety
/// `(ptr, size)` was mapped by [`map`]; no work that uses it is still queued.
pub unsafe fn unmap(ptr: sys::CUdeviceptr, size: usize) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the range is mapped and unused.
    let rc = unsafe { sys::cuMemUnmap(ptr, size) };
    tracing::trace!(ptr, size, ?rc, "cuMemUnmap");
    check("cuMemUnmap", rc)
}

/// `cuMemSetAccess`: read-write access for device `ordinal`.
///
/// # Safety
/// `(ptr, size)` is mapped.
pub unsafe fn set_access_rw(ptr: sys::CUdeviceptr, size: usize, ordinal: i32) -> Result<(), CudaError> {
    let desc = sys::CUmemAccessDesc {
        location: device_location(ordinal),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `desc` is one initialised descriptor, and the count passed is 1.
    let rc = unsafe { sys::cuMemSetAccess(ptr, size, &desc, 1) };
    tracing::trace!(ptr, size, ordinal, ?rc, "cuMemSetAccess");
    check("cuMemSetAccess", rc)
}

/// `cuStreamWriteValue64_v2(stream, addr, value, DEFAULT)`.
///
/// # Safety
/// `stream` belongs to the current context (null = the legacy default stream) and
/// `addr` is 8-byte aligned device memory mapped read-write for this device.
pub unsafe fn stream_write_value64(stream: sys::CUstream, addr: sys::CUdeviceptr, value: u64) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the stream and address.
    let rc = unsafe { sys::cuStreamWriteValue64_v2(stream, addr, value, 0) };
    tracing::trace!(?stream, addr, value, ?rc, "cuStreamWriteValue64");
    check("cuStreamWriteValue64", rc)
}

/// `cuStreamWaitValue64_v2(stream, addr, value, GEQ)`: later work on `stream` waits
/// until `*addr >= value`.
///
/// # Safety
/// As for [`stream_write_value64`].
pub unsafe fn stream_wait_value64_geq(
    stream: sys::CUstream,
    addr: sys::CUdeviceptr,
    value: u64,
) -> Result<(), CudaError> {
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: the caller guarantees the stream and address.
    let rc = unsafe { sys::cuStreamWaitValue64_v2(stream, addr, value, flags) };
    tracing::trace!(?stream, addr, value, ?rc, "cuStreamWaitValue64");
    check("cuStreamWaitValue64", rc)
}

/// `cuIpcGetEventHandle`.
///
/// # Safety
/// `event` was created with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`.
pub unsafe fn ipc_get_event_handle(event: sys::CUevent) -> Result<[u8; 64], CudaError> {
    let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out-pointer; the event rule is the caller's contract.
    let rc = unsafe { sys::cuIpcGetEventHandle(&mut h, event) };
    tracing::trace!(?event, ?rc, "cuIpcGetEventHandle");
    check("cuIpcGetEventHandle", rc)?;
    Ok(h.reserved.map(|c| c as u8))
}

/// `cuIpcOpenEventHandle`. The caller owns the event and destroys it.
///
/// # Safety
/// A context is current on this thread.
pub unsafe fn ipc_open_event_handle(handle: &[u8; 64]) -> Result<sys::CUevent, CudaError> {
    let h = sys::CUipcEventHandle { reserved: handle.map(|b| b as libc::c_char) };
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: `ev` is a valid out-pointer; the handle is passed by value.
    let rc = unsafe { sys::cuIpcOpenEventHandle(&mut ev, h) };
    tracing::trace!(?ev, ?rc, "cuIpcOpenEventHandle");
    check("cuIpcOpenEventHandle", rc)?;
    Ok(ev)
}

/// `cuEventCreate(flags)`.
///
/// # Safety
/// A context is current on this thread. The caller destroys the event.
pub unsafe fn event_create(flags: u32) -> Result<sys::CUevent, CudaError> {
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: `ev` is a valid out-pointer.
    let rc = unsafe { sys::cuEventCreate(&mut ev, flags) };
    tracing::trace!(flags, ?ev, ?rc, "cuEventCreate");
    check("cuEventCreate", rc)?;
    Ok(ev)
}

/// `cuEventDestroy_v2`.
///
/// # Safety
/// `ev` is live and destroyed once.
pub unsafe fn event_destroy(ev: sys::CUevent) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees `ev` is live and destroyed once.
    let rc = unsafe { sys::cuEventDestroy_v2(ev) };
    tracing::trace!(?ev, ?rc, "cuEventDestroy");
    check("cuEventDestroy", rc)
}

/// `cuEventRecord(ev, stream)`.
///
/// # Safety
/// `ev` is live and `stream` belongs to the event's context (null = legacy default).
pub unsafe fn event_record(ev: sys::CUevent, stream: sys::CUstream) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees both handles.
    let rc = unsafe { sys::cuEventRecord(ev, stream) };
    tracing::trace!(?ev, ?stream, ?rc, "cuEventRecord");
    check("cuEventRecord", rc)
}

/// `cuEventQuery`: `Ok(true)` when all work captured by the event has completed.
///
/// # Safety
/// `ev` is live.
pub unsafe fn event_query(ev: sys::CUevent) -> Result<bool, CudaError> {
    // SAFETY: the caller guarantees `ev` is live.
    let rc = unsafe { sys::cuEventQuery(ev) };
    match rc {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => check("cuEventQuery", other).map(|()| false),
    }
}

/// `cuEventSynchronize`.
///
/// # Safety
/// `ev` is live.
pub unsafe fn event_synchronize(ev: sys::CUevent) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees `ev` is live.
    let rc = unsafe { sys::cuEventSynchronize(ev) };
    check("cuEventSynchronize", rc)
}

/// `cuStreamWaitEvent(stream, ev, 0)`.
///
/// # Safety
/// Both handles are live; `stream` is in the current context (null = legacy default).
pub unsafe fn stream_wait_event(stream: sys::CUstream, ev: sys::CUevent) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees both handles.
    let rc = unsafe { sys::cuStreamWaitEvent(stream, ev, 0) };
    tracing::trace!(?stream, ?ev, ?rc, "cuStreamWaitEvent");
    check("cuStreamWaitEvent", rc)
}

/// `cuModuleLoadData` from NUL-terminated PTX text (JIT-compiled by the driver).
///
/// # Safety
/// A context is current on this thread. The caller unloads the module.
pub unsafe fn module_load_ptx(ptx: &CStr) -> Result<sys::CUmodule, CudaError> {
    let mut m: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `ptx` is NUL-terminated text, which is what cuModuleLoadData expects for PTX.
    let rc = unsafe { sys::cuModuleLoadData(&mut m, ptx.as_ptr().cast()) };
    tracing::trace!(?m, ?rc, "cuModuleLoadData");
    check("cuModuleLoadData", rc)?;
    Ok(m)
}

/// `cuModuleUnload`.
///
/// # Safety
/// `m` is live, unloaded once, and no launch of its functions is still queued.
pub unsafe fn module_unload(m: sys::CUmodule) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees `m` is live and unloaded once.
    let rc = unsafe { sys::cuModuleUnload(m) };
    check("cuModuleUnload", rc)
}

/// `cuModuleGetFunction`.
///
/// # Safety
/// `m` is live.
pub unsafe fn module_get_function(m: sys::CUmodule, name: &CStr) -> Result<sys::CUfunction, CudaError> {
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `name` is NUL-terminated and `f` is a valid out-pointer.
    let rc = unsafe { sys::cuModuleGetFunction(&mut f, m, name.as_ptr()) };
    check("cuModuleGetFunction", rc)?;
    Ok(f)
}

/// `cuLaunchKernel` with a 1-D grid.
///
/// # Safety
/// `f` is live; `params` points at one pointer per kernel parameter, each to a value
/// of the parameter's exact type, all valid for the duration of the call.
pub unsafe fn launch_1d(
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the parameter array matches the kernel signature.
    let rc = unsafe {
        sys::cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, params.as_mut_ptr(), std::ptr::null_mut())
    };
    tracing::trace!(?f, grid, block, ?stream, ?rc, "cuLaunchKernel");
    check("cuLaunchKernel", rc)
}

/// `cuMemcpyHtoDAsync_v2`.
///
/// # Safety
/// `dst..dst+len` is mapped device memory and `src..src+len` stays valid and unchanged
/// until the copy completes on `stream` (pageable memory: the driver stages it before
/// returning; pinned memory: until the stream passes the copy).
pub unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const u8,
    len: usize,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees both ranges.
    let rc = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream) };
    tracing::trace!(dst, len, ?stream, ?rc, "cuMemcpyHtoDAsync");
    check("cuMemcpyHtoDAsync", rc)
}

/// `cuMemcpyDtoHAsync_v2`.
///
/// # Safety
/// `src..src+len` is mapped device memory and `dst..dst+len` is writable host memory
/// that nothing reads or frees until the copy completes on `stream`.
pub unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: sys::CUdeviceptr,
    len: usize,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees both ranges.
    let rc = unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream) };
    tracing::trace!(src, len, ?stream, ?rc, "cuMemcpyDtoHAsync");
    check("cuMemcpyDtoHAsync", rc)
}

/// `cuMemcpyDtoDAsync_v2`.
///
/// # Safety
/// Both ranges are mapped device memory of at least `len` bytes on this context.
pub unsafe fn memcpy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    len: usize,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees both ranges.
    let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream) };
    tracing::trace!(dst, src, len, ?stream, ?rc, "cuMemcpyDtoDAsync");
    check("cuMemcpyDtoDAsync", rc)
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `dst..dst+len` is mapped device memory on this context.
pub unsafe fn memset_d8_async(
    dst: sys::CUdeviceptr,
    value: u8,
    len: usize,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the range.
    let rc = unsafe { sys::cuMemsetD8Async(dst, value, len, stream) };
    check("cuMemsetD8Async", rc)
}

/// `cuStreamSynchronize`.
///
/// # Safety
/// `stream` is live in the current context (null = legacy default).
pub unsafe fn stream_synchronize(stream: sys::CUstream) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees the stream.
    let rc = unsafe { sys::cuStreamSynchronize(stream) };
    check("cuStreamSynchronize", rc)
}

/// `cuDeviceCanAccessPeer`: whether device `dev` can map memory that lives on `peer`.
///
/// # Safety
/// The driver is initialised; `dev` and `peer` come from `cuDeviceGet`.
pub unsafe fn device_can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool, CudaError> {
    let mut can = 0;
    // SAFETY: `can` is a live local the call writes; the caller guarantees the devices.
    let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) };
    check("cuDeviceCanAccessPeer", rc).map(|()| can != 0)
}

/// `cuMemHostAlloc(size, 0)`: page-locked host memory, usable by every context.
///
/// # Safety
/// A context is current on this thread. The caller frees it with [`mem_free_host`].
pub unsafe fn mem_host_alloc(size: usize) -> Result<*mut u8, CudaError> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer.
    let rc = unsafe { sys::cuMemHostAlloc(&mut p, size, 0) };
    tracing::trace!(size, ?p, ?rc, "cuMemHostAlloc");
    check("cuMemHostAlloc", rc)?;
    Ok(p.cast())
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`mem_host_alloc`], is freed once, and no copy into or out of it is
/// still queued.
pub unsafe fn mem_free_host(p: *mut u8) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees `p` is live and freed once.
    let rc = unsafe { sys::cuMemFreeHost(p.cast()) };
    check("cuMemFreeHost", rc)
}

/// `cuMemHostRegister_v2(p, size, CU_MEMHOSTREGISTER_PORTABLE)`: page-locks an
/// existing host range and registers it with CUDA (for every context), so copies to
/// and from it run as pinned-memory copies.
///
/// # Safety
/// A context is current on this thread; `p..p+size` is mapped host memory that stays
/// mapped until [`mem_host_unregister`] is called with the same `p`, and overlaps no
/// range registered before.
pub unsafe fn mem_host_register(p: *mut u8, size: usize) -> Result<(), CudaError> {
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
    // SAFETY: the caller guarantees the range and its lifetime.
    let rc = unsafe { sys::cuMemHostRegister_v2(p.cast(), size, flags) };
    tracing::trace!(?p, size, flags, ?rc, "cuMemHostRegister");
    check("cuMemHostRegister", rc)
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `p` is the start of a range registered with [`mem_host_register`], unregistered
/// once, and no copy into or out of it is still queued.
pub unsafe fn mem_host_unregister(p: *mut u8) -> Result<(), CudaError> {
    // SAFETY: the caller guarantees `p` is a live registration.
    let rc = unsafe { sys::cuMemHostUnregister(p.cast()) };
    tracing::trace!(?p, ?rc, "cuMemHostUnregister");
    check("cuMemHostUnregister", rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_shutdown_is_told_apart_from_other_errors() {
        let err = |rc| CudaError::from_code("cuCtxSetCurrent", rc);
        assert!(err(sys::CUresult::CUDA_ERROR_DEINITIALIZED).is_driver_shutdown());
        assert_eq!(err(sys::CUresult::CUDA_ERROR_DEINITIALIZED).code(), 4, "cuda.h's number");
        assert_eq!(err(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY).code(), 2, "cuda.h's number");
        assert!(!err(sys::CUresult::CUDA_ERROR_INVALID_CONTEXT).is_driver_shutdown());
        assert!(!err(sys::CUresult::CUDA_ERROR_NOT_INITIALIZED).is_driver_shutdown());
    }
}
