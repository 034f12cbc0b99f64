//! Tensors: publishing a payload with its DLPack description, reading a sample's
//! description, and exporting a sample as a `DLManagedTensorVersioned`.

use std::ffi::c_void;

use zenoh_cuda_shm::dlpack::{ConsumerStream, ExportError, ExportOptions, ManagedTensorVersioned};
use zenoh_cuda_shm::tensor_codec::Device;
use zenoh_cuda_shm::{BackendKind, GpuLoan, GpuPublisher, TensorPublishError};

use crate::description::{TensorOut, meta_in, zcs_tensor_t};
use crate::error::{
    Error, ZCS_ERR_INVALID, ZCS_ERR_MEMORY, ZCS_ERR_NO_TENSOR, ZCS_ERR_NULL, bytes_arg, chain, guard, non_null,
    set_opt_out, set_out, zcs_result_t,
};
use crate::publisher::{PUBLISHERS, put_loan, zcs_loan_t, zcs_publisher_t};
use crate::sample::{SAMPLES, zcs_sample_t};
use crate::session::caller_stream;

/// `zcs_sample_to_dlpack`: always export a private copy (DLPack's `copy=True`).
pub const ZCS_DLPACK_COPY: u32 = 1;
/// `zcs_sample_to_dlpack`: never copy; `ZCS_ERR_MEMORY` where serving needs a copy.
pub const ZCS_DLPACK_NO_COPY: u32 = 2;
/// `zcs_sample_to_dlpack`: export to host memory (`kDLCPU`; a device→host copy for
/// samples on the GPU, finished before the call returns).
pub const ZCS_DLPACK_TO_HOST: u32 = 4;

/// DLPack's managed tensor (`dlpack/dlpack.h`, version 1). Opaque here: include
/// DLPack's header to read it, or hand it to a framework (`at::fromDLPack`, CuPy, …).
/// Not `repr(C)` on purpose, so that the header only names it and DLPack's own
/// definition can sit beside ours.
pub struct DLManagedTensorVersioned {
    _opaque: [u8; 0],
}

/// Where a publisher's payload lives, for descriptions that leave it to us.
fn device_of(p: &GpuPublisher, ordinal: Option<usize>) -> Device {
    match (p.backend(), ordinal) {
        (BackendKind::CudaVmm, Some(o)) => Device::cuda(o as i32),
        (BackendKind::CudaVmm, None) => Device::cuda(0),
        _ => Device::CPU,
    }
}

/// A tensor put's error: `ZCS_ERR_INVALID` for a description that does not fit,
/// `ZCS_ERR_MEMORY` for device memory asked of a host publisher.
fn put_failed(e: &TensorPublishError) -> Error {
    match e {
        TensorPublishError::Invalid { .. } | TensorPublishError::DeviceMismatch { .. } => {
            Error::new(ZCS_ERR_INVALID, format!("put the tensor: {}", chain(e)))
        }
        TensorPublishError::NoGpu => Error::new(ZCS_ERR_MEMORY, format!("put the tensor: {}", chain(e))),
        _ => Error::failed("put the tensor", e),
    }
}

/// Publishes a loan written by the caller as the tensor `tensor` describes, which is
/// checked against the loan's length and travels with it. On success the loan's
/// handle is zeroed. A description that does not fit is `ZCS_ERR_INVALID` and the
/// loan stays the caller's, unchanged; a failed put zeroes it (its block goes back).
///
/// # Safety
/// `loan` is NULL or points to a handle; `tensor` as `zcs_tensor_t` says; `seq` is
/// NULL or points to a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_put_tensor(
    publisher: zcs_publisher_t,
    loan: *mut zcs_loan_t,
    tensor: *const zcs_tensor_t,
    seq: *mut u64,
) -> zcs_result_t {
    guard(|| {
        non_null(loan, "loan")?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        // The description is read against the loan's device before it is taken.
        // SAFETY: the caller's contract.
        let describe = |l: &GpuLoan| unsafe { meta_in(tensor, device_of(p, l.stream().map(|s| s.ordinal()))) };
        let publish = |l, meta| {
            p.put_tensor(l, &meta).map_err(|mut e| {
                // Refused before anything was sent: the loan goes back to its handle.
                let back = match &mut e {
                    TensorPublishError::Invalid { loan, .. } | TensorPublishError::DeviceMismatch { loan, .. } => {
                        loan.take()
                    }
                    _ => None,
                };
                (put_failed(&e), back)
            })
        };
        // SAFETY: not null (checked); points to a handle.
        let report = unsafe { put_loan(loan, |l| p.owns(l), describe, publish) }?;
        // SAFETY: NULL or a writable `uint64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// Publishes `len` bytes at `data` (copied before the call returns) as the tensor
/// `tensor` describes.
///
/// # Safety
/// `data` points to `len` readable bytes (anything when `len` is 0); `tensor` as
/// `zcs_tensor_t` says; `seq` is NULL or points to a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_put_tensor_host(
    publisher: zcs_publisher_t,
    data: *const u8,
    len: usize,
    tensor: *const zcs_tensor_t,
    seq: *mut u64,
) -> zcs_result_t {
    guard(|| {
        // SAFETY: `len` readable bytes at `data` (the caller's contract).
        let bytes = unsafe { bytes_arg(data, len) }?;
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        let ordinal = entry.gpu.as_ref().map(|g| g.ordinal());
        // SAFETY: the caller's contract.
        let meta = unsafe { meta_in(tensor, device_of(p, ordinal)) }?;
        let report = p.put_tensor_from_host(bytes, &meta).map_err(|e| put_failed(&e))?;
        // SAFETY: NULL or a writable `uint64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// Publishes `len` bytes of device memory at `src` as the tensor `tensor` describes:
/// copied device→device on `stream` (a `CUstream` of the session's device; NULL: the
/// legacy default stream) into a block, whose readers are ordered after that copy.
/// Returns once the copy is enqueued: the host does not wait for the stream.
/// `ZCS_ERR_MEMORY` for a host-memory publisher.
///
/// # Safety
/// `src..src+len` is device memory of the session's GPU, readable by work on `stream`
/// and unchanged until that stream has passed the copy; `stream` is NULL or a live
/// stream of that device; `tensor` as `zcs_tensor_t` says; `seq` is NULL or points to
/// a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_publisher_put_tensor_device(
    publisher: zcs_publisher_t,
    src: u64,
    len: usize,
    tensor: *const zcs_tensor_t,
    stream: *mut c_void,
    seq: *mut u64,
) -> zcs_result_t {
    guard(|| {
        let entry = PUBLISHERS.get(publisher.id)?;
        let p = &entry.publisher;
        let Some(gpu) = &entry.gpu else {
            return Err(Error::new(ZCS_ERR_MEMORY, "a host-memory publisher has no device memory to copy into"));
        };
        if src == 0 && len > 0 {
            return Err(Error::new(ZCS_ERR_NULL, "src is null"));
        }
        // SAFETY: the caller's contract.
        let meta = unsafe { meta_in(tensor, Device::cuda(gpu.ordinal() as i32)) }?;
        // SAFETY: NULL or a live stream of the session's device (the caller's contract).
        let stream = unsafe { caller_stream(gpu, stream) };
        // SAFETY: the source range and its lifetime are the caller's contract.
        let report = unsafe { p.put_tensor_from_device(src, &meta, len, &stream) }.map_err(|e| put_failed(&e))?;
        // SAFETY: NULL or a writable `uint64_t` (the caller's contract).
        unsafe { set_opt_out(seq, report.seq) };
        Ok(())
    })
}

/// The sample's tensor description. `ZCS_ERR_NO_TENSOR` for a sample published as
/// plain bytes; `ZCS_ERR_INVALID` for a description that does not fit its payload.
/// `shape` and `strides` (always given, in elements) stay valid while the sample does.
///
/// # Safety
/// `out` is NULL or points to a `zcs_tensor_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_tensor(sample: zcs_sample_t, out: *mut zcs_tensor_t) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        let t = match s.tensor.get() {
            Some(t) => t,
            None => {
                let meta = s
                    .sample
                    .tensor_meta()
                    .map_err(|e| {
                        Error::new(ZCS_ERR_INVALID, format!("the sample's tensor description: {}", chain(&e)))
                    })?
                    .ok_or_else(|| Error::new(ZCS_ERR_NO_TENSOR, "the sample carries no tensor description"))?;
                let t = TensorOut::new(meta)?;
                s.tensor.get_or_init(|| t)
            }
        };
        // SAFETY: not null (checked); a writable description (the caller's contract).
        // The arrays live in the sample's entry, kept until the sample is dropped.
        unsafe { set_out(out, t.desc()) };
        Ok(())
    })
}

/// Exports a tensor sample as DLPack's `DLManagedTensorVersioned`, for the consumer's
/// `stream` (a `CUstream` of the session's device, or DLPack's 1 / 2; NULL: the legacy
/// default stream; ignored for host memory). In place and `READ_ONLY` where the block
/// can be read there, with the stream ordered after the producer and no host wait.
/// `flags`: `ZCS_DLPACK_COPY`, `ZCS_DLPACK_NO_COPY`, `ZCS_DLPACK_TO_HOST`. The caller
/// owns the result: its deleter (or `zcs_dlpack_free`) ends the reads on `stream` and
/// gives the block back. `ZCS_ERR_NO_TENSOR` for a sample published as plain bytes.
///
/// # Safety
/// `stream` is NULL, 1, 2 or a live stream of the session's device that outlives the
/// export; `out` is NULL or points to a `DLManagedTensorVersioned*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_sample_to_dlpack(
    sample: zcs_sample_t,
    stream: *mut c_void,
    flags: u32,
    out: *mut *mut DLManagedTensorVersioned,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let known = ZCS_DLPACK_COPY | ZCS_DLPACK_NO_COPY | ZCS_DLPACK_TO_HOST;
        if flags & !known != 0 || flags & (ZCS_DLPACK_COPY | ZCS_DLPACK_NO_COPY) == ZCS_DLPACK_COPY | ZCS_DLPACK_NO_COPY
        {
            return Err(Error::new(ZCS_ERR_INVALID, format!("flags {flags:#x}: unknown bits, or COPY with NO_COPY")));
        }
        let options = ExportOptions {
            copy: match (flags & ZCS_DLPACK_COPY != 0, flags & ZCS_DLPACK_NO_COPY != 0) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            to_host: flags & ZCS_DLPACK_TO_HOST != 0,
        };
        let s = SAMPLES.get(sample.id)?;
        // SAFETY: the caller's contract (a stream of the sample's device that outlives
        // the export, or a special value).
        let consumer = unsafe { ConsumerStream::from_raw(stream.cast()) };
        let m = s.sample.to_dlpack_versioned_with(&consumer, options).map_err(|e| match e {
            ExportError::NoMeta => Error::new(ZCS_ERR_NO_TENSOR, "the sample carries no tensor description"),
            ExportError::Meta(_) | ExportError::InvalidStream { .. } | ExportError::StreamDevice { .. } => {
                Error::new(ZCS_ERR_INVALID, format!("export the sample: {}", chain(&e)))
            }
            ExportError::CopyRequired { .. } => Error::new(ZCS_ERR_MEMORY, format!("export the sample: {}", chain(&e))),
            _ => Error::failed("export the sample", &e),
        })?;
        // SAFETY: not null (checked); the caller passes a writable pointer. It now owns
        // the export (its deleter).
        unsafe { set_out(out, m.into_raw().cast::<DLManagedTensorVersioned>()) };
        Ok(())
    })
}

/// Calls a `DLManagedTensorVersioned`'s deleter (ours or any producer's); NULL does
/// nothing.
///
/// # Safety
/// `tensor` is NULL or a managed tensor nobody else will delete.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_dlpack_free(tensor: *mut DLManagedTensorVersioned) -> zcs_result_t {
    guard(|| {
        // SAFETY: NULL or a managed tensor owned by the caller, now by us; dropping
        // it calls its deleter once.
        drop(unsafe { ManagedTensorVersioned::from_raw(tensor.cast()) });
        Ok(())
    })
}
