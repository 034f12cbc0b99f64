//! Import: a framework's DLPack tensor validated, copied into a block and published.

use tensor_codec::{DType, Device, DeviceType, MetaError, TensorMeta};

use crate::api::GpuPublisher;
use crate::cuda::{CudaError, Stream, copy};
use crate::pool::BackendKind;
use crate::tensor::TensorPublishError;
use crate::transport::publisher::PutReport;

use super::*;

/// A framework's tensor, either struct, owned (its deleter runs when this drops).
#[derive(Debug)]
pub enum DlpackTensor {
    /// A `DLManagedTensorVersioned`.
    Versioned(ManagedTensorVersioned),
    /// A legacy `DLManagedTensor`.
    Legacy(ManagedTensorLegacy),
}

impl From<ManagedTensorVersioned> for DlpackTensor {
    fn from(t: ManagedTensorVersioned) -> Self {
        Self::Versioned(t)
    }
}

impl From<ManagedTensorLegacy> for DlpackTensor {
    fn from(t: ManagedTensorLegacy) -> Self {
        Self::Legacy(t)
    }
}

/// A framework's tensor was refused, or publishing it failed. In every case its deleter
/// has run (or, if its copy could not be shown complete, it was leaked on purpose).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// `version.major` is not 1: nothing but the deleter may be used.
    #[error("DLPack version {major}.{minor} is not supported (major must be 1)")]
    UnsupportedVersion {
        /// The producer's major version.
        major: u32,
        /// The producer's minor version.
        minor: u32,
    },
    /// `flags` has bits DLPack 1.3 does not define.
    #[error("unknown DLPack flags {flags:#x}")]
    UnknownFlags {
        /// The flags.
        flags: u64,
    },
    /// `IS_SUBBYTE_TYPE_PADDED` on a sub-byte dtype: only packed sub-byte data travels.
    #[error("padded sub-byte data is not supported (only packed)")]
    PaddedSubByte,
    /// `ndim` is negative or above 64.
    #[error("ndim {ndim} is negative or above 64")]
    InvalidRank {
        /// The value received.
        ndim: i32,
    },
    /// `shape` (or `strides`, when given) is NULL or misaligned while `ndim > 0`.
    #[error("{field} is NULL or misaligned with ndim > 0")]
    BadArray {
        /// `"shape"` or `"strides"`.
        field: &'static str,
    },
    /// The dtype, shape, strides or `byte_offset` break the [`TensorMeta`] rules.
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// `data` is NULL for a non-empty tensor.
    #[error("data is NULL for a tensor of {bytes} bytes")]
    NullData {
        /// Bytes the view touches.
        bytes: u64,
    },
    /// `data + byte_offset` is not aligned to the item size.
    #[error("first element at {address:#x} is not aligned to the item size {itemsize}")]
    MisalignedData {
        /// `data + byte_offset`.
        address: u64,
        /// Bytes per item.
        itemsize: u64,
    },
    /// The view reaches past the address space.
    #[error("the view of {bytes} bytes at {address:#x} does not fit the address space")]
    TooLarge {
        /// `data + byte_offset`.
        address: u64,
        /// Bytes the view touches.
        bytes: u64,
    },
    /// The tensor's device is not one this publisher can copy from.
    #[error("a tensor on device type {} id {} cannot be published by a {backend} publisher{}", .device.device_type, .device.device_id, on_gpu(.ordinal))]
    Device {
        /// The tensor's device.
        device: DLDevice,
        /// Where this publisher's blocks live.
        backend: BackendKind,
        /// The stream's GPU, when one was given.
        ordinal: Option<usize>,
    },
    /// CUDA publishers need the stream the tensor is ready on.
    #[error("a CUDA publisher needs the stream the tensor is ready on")]
    StreamRequired,
    /// Publishing the copy failed.
    #[error(transparent)]
    Publish(#[from] TensorPublishError),
    /// Waiting for the copy failed; the tensor was leaked, not deleted, since the copy
    /// may still read it.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

fn on_gpu(ordinal: &Option<usize>) -> String {
    ordinal.map(|o| format!(" on GPU {o}")).unwrap_or_default()
}

/// A validated source view: its description (as the producer gave it), the address of
/// its first byte and how many bytes it touches.
struct Source {
    meta: TensorMeta,
    addr: u64,
    bytes: u64,
}

impl DlpackTensor {
    /// The view and flags, after the version check.
    fn view(&self) -> Result<(&DLTensor, u64), ImportError> {
        match self {
            Self::Versioned(t) => {
                let v = t.version();
                let m = t.get().ok_or(ImportError::UnsupportedVersion { major: v.major, minor: v.minor })?;
                Ok((&m.dl_tensor, m.flags))
            }
            Self::Legacy(t) => Ok((&t.get().dl_tensor, 0)),
        }
    }

    /// The tensor's description, validated (see the [module docs](crate::dlpack)); its
    /// `byte_offset` and device are the producer's.
    ///
    /// # Errors
    /// The first check that fails, as an [`ImportError`] naming the field.
    pub fn tensor_meta(&self) -> Result<TensorMeta, ImportError> {
        self.source().map(|s| s.meta)
    }

    fn source(&self) -> Result<Source, ImportError> {
        let (t, flags) = self.view()?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(ImportError::UnknownFlags { flags });
        }
        let ndim = usize::try_from(t.ndim)
            .ok()
            .filter(|&n| n <= tensor_codec::MAX_RANK)
            .ok_or(ImportError::InvalidRank { ndim: t.ndim })?;
        let dtype = DType::from_dl(t.dtype)?;
        if dtype.is_sub_byte() && flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED != 0 {
            return Err(ImportError::PaddedSubByte);
        }
        let shape = read_array(t.shape, ndim, "shape")?.ok_or(ImportError::BadArray { field: "shape" })?;
        // NULL strides: compact row-major (what DLPack < 1.2 producers meant).
        let strides = read_array(t.strides, ndim, "strides")?.unwrap_or_default();
        let device = match DeviceType::from_i32(t.device.device_type) {
            Some(ty) => Device::new(ty, t.device.device_id),
            None => return Err(MetaError::UnknownDeviceType { value: t.device.device_type }.into()),
        };
        let meta = TensorMeta { dtype, shape, strides, byte_offset: t.byte_offset, device };
        // DLPack carries no allocation size: the bound is the address space.
        let extent = meta.validate(u64::MAX)?;
        let addr = (t.data as usize as u64)
            .checked_add(t.byte_offset)
            .filter(|a| a.checked_add(extent.bytes).is_some_and(|end| end <= usize::MAX as u64))
            .ok_or(ImportError::TooLarge { address: t.data as usize as u64, bytes: extent.bytes })?;
        if extent.bytes > 0 {
            if t.data.is_null() {
                return Err(ImportError::NullData { bytes: extent.bytes });
            }
            if let Some(itemsize) = dtype.itemsize()
                && addr % itemsize != 0
            {
                return Err(ImportError::MisalignedData { address: addr, itemsize });
            }
        }
        Ok(Source { meta, addr, bytes: extent.bytes })
    }
}

/// Copies `ndim` integers from a DLPack array: `Ok(None)` for NULL with `ndim > 0`, an
/// empty vector for `ndim == 0`.
fn read_array(p: *const i64, ndim: usize, field: &'static str) -> Result<Option<Vec<i64>>, ImportError> {
    if ndim == 0 {
        return Ok(Some(Vec::new()));
    }
    if p.is_null() {
        return Ok(None);
    }
    if !p.is_aligned() {
        return Err(ImportError::BadArray { field });
    }
    // SAFETY: `DlpackTensor`'s owners were built with `from_raw`, whose contract says a
    // non-NULL `shape`/`strides` points to `ndim` integers valid until the deleter runs,
    // which cannot happen while `self` is borrowed; non-null and aligned checked above.
    Ok(Some(unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec()))
}

impl GpuPublisher {
    /// Publishes a framework's tensor: validates it (see the [module docs](crate::dlpack)),
    /// copies the bytes its view touches into a block and publishes them with its
    /// description (offset 0, same shape, strides and dtype, this publisher's device),
    /// then calls its deleter once the copy has completed.
    ///
    /// `kDLCUDA` tensors must be on this publisher's GPU: the copy is device→device on
    /// `stream`, which must be ordered after the producer's writes (e.g. the stream given
    /// to its `__dlpack__`); this waits for the copy on the host before calling the
    /// deleter. `kDLCPU` tensors are copied from host memory before this returns.
    /// CUDA publishers need `stream` in both cases; host-memory publishers take `None`.
    ///
    /// # Errors
    /// An [`ImportError`] naming what was refused; the tensor's deleter has run then,
    /// except for [`ImportError::Cuda`] (see there).
    pub fn put_dlpack(
        &self,
        tensor: impl Into<DlpackTensor>,
        stream: Option<&Stream>,
    ) -> Result<PutReport, ImportError> {
        let tensor = tensor.into();
        let src = tensor.source()?;
        let backend = self.backend();
        let ordinal = stream.map(|s| s.ordinal());
        let refused = || ImportError::Device { device: src.meta.device.into(), backend, ordinal };
        let out_device = match (backend, ordinal) {
            (BackendKind::HostMemfd, _) => Device::CPU,
            (BackendKind::CudaVmm, Some(o)) => Device::cuda(o as i32),
            (BackendKind::CudaVmm, None) => return Err(ImportError::StreamRequired),
        };
        let out = TensorMeta { byte_offset: 0, device: out_device, ..src.meta.clone() };
        let bytes =
            usize::try_from(src.bytes).map_err(|_| ImportError::TooLarge { address: src.addr, bytes: src.bytes })?;
        match src.meta.device.device_type {
            DeviceType::Cpu => {
                let data: &[u8] = if bytes == 0 {
                    &[]
                } else {
                    // SAFETY: `from_raw`'s contract: `data` is host memory covering the view,
                    // valid until the deleter runs (after this borrow ends); `src` was
                    // validated: non-null, in the address space, `bytes` from the first byte.
                    unsafe { std::slice::from_raw_parts(src.addr as usize as *const u8, bytes) }
                };
                // Every path of `put_bytes_meta` has copied `data` when it returns.
                let r = self.put_tensor_from_host(data, &out);
                drop(tensor);
                Ok(r?)
            }
            DeviceType::Cuda => {
                let (Some(stream), Some(o)) = (stream, ordinal) else { return Err(refused()) };
                if backend != BackendKind::CudaVmm || i64::from(src.meta.device.device_id) != o as i64 {
                    return Err(refused());
                }
                // SAFETY: `from_raw`'s contract: `data` is device memory of this GPU (checked
                // above) covering the view until the deleter runs, which happens only after
                // the copy has completed (waited for below); the caller orders `stream`
                // after the producer's writes.
                let r = unsafe { self.put_tensor_from_device(src.addr, &out, bytes, stream) };
                if let Err(e) = copy::wait(stream) {
                    // The copy may still be reading the tensor: leak it rather than delete
                    // memory a running copy reads.
                    tracing::error!(error = %crate::error::Chain(&e), "cannot wait for a DLPack import's copy; leaking the tensor");
                    match tensor {
                        DlpackTensor::Versioned(t) => drop(t.into_raw()),
                        DlpackTensor::Legacy(t) => drop(t.into_raw()),
                    }
                    return Err(e.into());
                }
                drop(tensor);
                Ok(r?)
            }
            _ => Err(refused()),
        }
    }
}
