//! The DLPack structs, `#[repr(C)]` as `dlpack.h` v1.3 lays them out (asserted at
//! compile time), and the constants of the flags field.

use std::ffi::c_void;

use tensor_codec::Device;

use super::*;

/// The DLPack version this module implements (`DLPACK_MAJOR_VERSION`,
/// `DLPACK_MINOR_VERSION` of `dlpack.h` v1.3).
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 3 };
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the data is a copy the consumer owns alone until the
/// deleter runs.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: sub-byte elements are padded to a byte
/// each instead of packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;
pub(super) const KNOWN_FLAGS: u64 =
    DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_COPIED | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;

/// `DLDevice {int32 device_type; int32 device_id}` (`device_type` is a `DLDeviceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct DLDevice {
    /// `DLDeviceType`: 1 = `kDLCPU`, 2 = `kDLCUDA`, … (see [`DeviceType`](tensor_codec::DeviceType)).
    pub device_type: i32,
    /// Device ordinal in the process that reads the struct (0 for the CPU).
    pub device_id: i32,
}

impl From<Device> for DLDevice {
    fn from(d: Device) -> Self {
        Self { device_type: d.device_type.as_i32(), device_id: d.device_id }
    }
}

/// `DLTensor`: a plain view; the managed structs own one.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct DLTensor {
    /// Address of the data (device or host, per `device`).
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` dimensions (NULL allowed only for `ndim == 0`).
    pub shape: *mut i64,
    /// `ndim` strides in elements (NULL meant compact row-major before DLPack v1.2).
    pub strides: *mut i64,
    /// Offset of the first element from `data`, in bytes.
    pub byte_offset: u64,
}

/// `DLPackVersion {uint32 major; uint32 minor}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct DLPackVersion {
    /// Major version: consumers must refuse anything but 1.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// The legacy `DLManagedTensor {DLTensor dl_tensor; void* manager_ctx; void (*deleter)(…)}`.
#[derive(Debug)]
#[repr(C)]
pub struct DLManagedTensor {
    /// The view.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the struct (and everything it owns); called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (DLPack v1.x). Fields up to `flags` are ABI-stable across
/// versions: a consumer that finds `version.major != 1` may only call the deleter.
#[derive(Debug)]
#[repr(C)]
pub struct DLManagedTensorVersioned {
    /// The producer's DLPack version.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the struct (and everything it owns); called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The view.
    pub dl_tensor: DLTensor,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLTensor>() == 48);
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
};
