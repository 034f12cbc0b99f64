//! Where a tensor lives: DLPack's `DLDevice {DLDeviceType device_type; int32 device_id}`.
//!
//! ```
//! use tensor_codec::{Device, DeviceType};
//!
//! assert_eq!(Device::cuda(1).device_type.as_i32(), 2);
//! assert_eq!(DeviceType::from_i32(13), Some(DeviceType::CudaManaged));
//! assert_eq!(DeviceType::from_i32(5), None); // DLPack leaves 5 and 6 unassigned
//! ```

use std::fmt;

/// A DLPack `DLDeviceType` (DLPack v1.3). The discriminant is the wire value; 5 and 6 are
/// unassigned in DLPack and have no variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
#[non_exhaustive]
pub enum DeviceType {
    /// `kDLCPU`: host memory.
    Cpu = 1,
    /// `kDLCUDA`: CUDA device memory.
    Cuda = 2,
    /// `kDLCUDAHost`: page-locked host memory from `cudaMallocHost`.
    CudaHost = 3,
    /// `kDLOpenCL`.
    OpenCl = 4,
    /// `kDLVulkan`.
    Vulkan = 7,
    /// `kDLMetal`.
    Metal = 8,
    /// `kDLVPI`.
    Vpi = 9,
    /// `kDLROCM`: ROCm/HIP device memory.
    Rocm = 10,
    /// `kDLROCMHost`: pinned host memory from `hipMallocHost`.
    RocmHost = 11,
    /// `kDLExtDev`: reserved for extension devices.
    ExtDev = 12,
    /// `kDLCUDAManaged`: CUDA unified (managed) memory.
    CudaManaged = 13,
    /// `kDLOneAPI`: Intel oneAPI unified shared memory.
    OneApi = 14,
    /// `kDLWebGPU`.
    WebGpu = 15,
    /// `kDLHexagon`: Qualcomm Hexagon DSP.
    Hexagon = 16,
    /// `kDLMAIA`: Microsoft MAIA.
    Maia = 17,
    /// `kDLTrn`: AWS Trainium.
    Trn = 18,
}

impl DeviceType {
    /// Every device type, in wire order.
    pub const ALL: [DeviceType; 16] = [
        DeviceType::Cpu,
        DeviceType::Cuda,
        DeviceType::CudaHost,
        DeviceType::OpenCl,
        DeviceType::Vulkan,
        DeviceType::Metal,
        DeviceType::Vpi,
        DeviceType::Rocm,
        DeviceType::RocmHost,
        DeviceType::ExtDev,
        DeviceType::CudaManaged,
        DeviceType::OneApi,
        DeviceType::WebGpu,
        DeviceType::Hexagon,
        DeviceType::Maia,
        DeviceType::Trn,
    ];

    /// The device type for a wire value, or `None` if DLPack v1.3 does not define it.
    pub const fn from_i32(value: i32) -> Option<Self> {
        let mut i = 0;
        while i < Self::ALL.len() {
            if Self::ALL[i] as i32 == value {
                return Some(Self::ALL[i]);
            }
            i += 1;
        }
        None
    }

    /// The wire value.
    pub const fn as_i32(self) -> i32 {
        self as i32
    }

    /// The enumerator's name in `dlpack.h`, e.g. `"kDLCUDA"`.
    pub const fn dlpack_name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "kDLCPU",
            DeviceType::Cuda => "kDLCUDA",
            DeviceType::CudaHost => "kDLCUDAHost",
            DeviceType::OpenCl => "kDLOpenCL",
            DeviceType::Vulkan => "kDLVulkan",
            DeviceType::Metal => "kDLMetal",
            DeviceType::Vpi => "kDLVPI",
            DeviceType::Rocm => "kDLROCM",
            DeviceType::RocmHost => "kDLROCMHost",
            DeviceType::ExtDev => "kDLExtDev",
            DeviceType::CudaManaged => "kDLCUDAManaged",
            DeviceType::OneApi => "kDLOneAPI",
            DeviceType::WebGpu => "kDLWebGPU",
            DeviceType::Hexagon => "kDLHexagon",
            DeviceType::Maia => "kDLMAIA",
            DeviceType::Trn => "kDLTrn",
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dlpack_name())
    }
}

/// DLPack's `DLDevice`: a device type and an ordinal.
///
/// `device_id` is the *local* ordinal as the producer saw it (0 for host memory). It must
/// be non-negative; [`crate::TensorMeta::validate`] checks that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// The kind of memory.
    pub device_type: DeviceType,
    /// The device ordinal.
    pub device_id: i32,
}

impl Device {
    /// Host memory (`kDLCPU`, id 0).
    pub const CPU: Device = Device { device_type: DeviceType::Cpu, device_id: 0 };

    /// A device of any type.
    pub const fn new(device_type: DeviceType, device_id: i32) -> Self {
        Device { device_type, device_id }
    }

    /// CUDA device memory on ordinal `device_id`.
    pub const fn cuda(device_id: i32) -> Self {
        Device { device_type: DeviceType::Cuda, device_id }
    }
}

impl Default for Device {
    fn default() -> Self {
        Device::CPU
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.device_type, self.device_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_types_round_trip() {
        for ty in DeviceType::ALL {
            assert_eq!(DeviceType::from_i32(ty.as_i32()), Some(ty));
        }
        for v in [i32::MIN, -1, 0, 5, 6, 19, i32::MAX] {
            assert_eq!(DeviceType::from_i32(v), None, "{v}");
        }
        assert_eq!(Device::cuda(3).to_string(), "kDLCUDA:3");
        assert_eq!(Device::default(), Device::CPU);
    }
}
