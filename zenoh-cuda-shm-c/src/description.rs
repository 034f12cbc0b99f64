//! A tensor's description across the ABI: `zcs_tensor_t` as C passes and reads it, and
//! its conversions to and from the library's `TensorMeta`.

use zenoh_cuda_shm::tensor_codec::{DLDataType, DType, Device, DeviceType, MAX_RANK, TensorMeta};

use crate::error::{Error, ZCS_ERR_INVALID, non_null};

/// A tensor's description, as DLPack's `DLTensor` has it, without the data pointer.
///
/// Publishing: `ndim` values at `shape`; `strides` NULL for compact row-major, else
/// `ndim` values in elements; `device_type` 0 means "this publisher's memory" (else
/// DLPack's `kDLCPU` 1 or `kDLCUDA` 2, which must be it). Received: `shape` and
/// `strides` (always given) stay valid while the sample does.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcs_tensor_t {
    /// DLPack's type code (`kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4, …).
    pub dtype_code: u8,
    /// Bits per lane.
    pub dtype_bits: u8,
    /// Lanes (1 for scalars).
    pub dtype_lanes: u16,
    /// DLPack's device type (`kDLCPU` 1, `kDLCUDA` 2; 0 when publishing: the publisher's).
    pub device_type: i32,
    /// The device's ordinal, as the producer sees it.
    pub device_id: i32,
    /// Number of dimensions (0 to 64).
    pub ndim: i32,
    /// `ndim` dimensions.
    pub shape: *const i64,
    /// `ndim` strides in elements, or NULL for compact row-major.
    pub strides: *const i64,
    /// Offset of the first element from the start of the payload, in bytes.
    pub byte_offset: u64,
}

/// A received description with its explicit strides, kept with the sample so the
/// pointers C reads stay valid.
pub(crate) struct TensorOut {
    meta: TensorMeta,
    strides: Vec<i64>,
}

impl TensorOut {
    /// `meta` (already validated) with its explicit strides; `ZCS_ERR_INVALID` where
    /// they cannot be computed.
    pub(crate) fn new(meta: TensorMeta) -> Result<Self, Error> {
        let strides = meta
            .effective_strides()
            .map_err(|e| Error::new(ZCS_ERR_INVALID, format!("the tensor description: {e}")))?;
        Ok(Self { meta, strides })
    }

    /// The description; its arrays live as long as `self`.
    pub(crate) fn desc(&self) -> zcs_tensor_t {
        let m = &self.meta;
        let dt = m.dtype.to_dl();
        zcs_tensor_t {
            dtype_code: dt.code,
            dtype_bits: dt.bits,
            dtype_lanes: dt.lanes,
            device_type: m.device.device_type as i32,
            device_id: m.device.device_id,
            ndim: m.shape.len() as i32,
            shape: m.shape.as_ptr(),
            strides: self.strides.as_ptr(),
            byte_offset: m.byte_offset,
        }
    }
}

/// The description C passed, checked: `default_device` where `device_type` is 0.
///
/// # Safety
/// `t` is NULL or points to a `zcs_tensor_t` whose `shape` (and `strides`, when not
/// NULL) point to `ndim` readable values.
pub(crate) unsafe fn meta_in(t: *const zcs_tensor_t, default_device: Device) -> Result<TensorMeta, Error> {
    non_null(t, "tensor")?;
    // SAFETY: not null (checked); a readable description (the caller's contract).
    let t = unsafe { &*t };
    let invalid = |m: String| Error::new(ZCS_ERR_INVALID, m);
    let rank = usize::try_from(t.ndim)
        .ok()
        .filter(|r| *r <= MAX_RANK)
        .ok_or_else(|| invalid(format!("ndim {} is not in 0..={MAX_RANK}", t.ndim)))?;
    let dims = |p: *const i64, name: &str| -> Result<Vec<i64>, Error> {
        if rank == 0 {
            return Ok(Vec::new());
        }
        non_null(p, name)?;
        // SAFETY: not null (checked); `ndim` readable values (the caller's contract).
        Ok(unsafe { std::slice::from_raw_parts(p, rank) }.to_vec())
    };
    let shape = dims(t.shape, "tensor.shape")?;
    let strides = if t.strides.is_null() { Vec::new() } else { dims(t.strides, "tensor.strides")? };
    let raw = DLDataType { code: t.dtype_code, bits: t.dtype_bits, lanes: t.dtype_lanes };
    let dtype = DType::from_dl(raw).map_err(|e| invalid(format!("tensor dtype: {e}")))?;
    let device = match t.device_type {
        0 => default_device,
        d => Device::new(
            DeviceType::from_i32(d).ok_or_else(|| invalid(format!("tensor.device_type {d} is not a DLPack device")))?,
            t.device_id,
        ),
    };
    Ok(TensorMeta { dtype, shape, strides, byte_offset: t.byte_offset, device })
}
