//! What this process sees of the host's GPUs: each visible device's UUID, and which
//! of them can map memory that lives on which (peer access over NVLink or PCIe).
//!
//! Processes may number the same GPUs differently (`CUDA_VISIBLE_DEVICES`), so GPUs are
//! compared by UUID, never by ordinal. No context is created: only device queries.

// Re-exported by `zenoh-cuda-shm`: errors and panics documented as there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use cudarc::driver::result::device;

use super::GpuUuid;
use super::sys::{self as cu, CudaError, wrap};

/// The visible GPUs and their peer access, as the driver reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// UUID of each visible device, by ordinal.
    devices: Vec<GpuUuid>,
    /// `access[a][b]`: device `a` can map memory on device `b` (false where `a == b`,
    /// which needs no peer access).
    access: Vec<Vec<bool>>,
}

impl Topology {
    /// Asks the driver. Call after [`super::Gpu::open`] succeeded (the driver is then
    /// loaded and initialised).
    ///
    /// # Errors
    /// [`CudaError`] naming the driver call that failed (counting devices, reading a
    /// UUID or a peer-access attribute).
    pub fn probe() -> Result<Self, CudaError> {
        let count = device::get_count().map_err(wrap("cuDeviceGetCount"))?;
        let handles = (0..count).map(|o| device::get(o).map_err(wrap("cuDeviceGet"))).collect::<Result<Vec<_>, _>>()?;
        let devices = handles
            .iter()
            .map(|&d| {
                let uuid = device::get_uuid(d).map_err(wrap("cuDeviceGetUuid"))?;
                Ok(GpuUuid(uuid.bytes.map(|c| c as u8)))
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        let mut access = vec![vec![false; handles.len()]; handles.len()];
        for (a, &da) in handles.iter().enumerate() {
            for (b, &db) in handles.iter().enumerate() {
                if a != b {
                    // SAFETY: the driver is initialised (see above) and both handles come
                    // from `cuDeviceGet`.
                    access[a][b] = unsafe { cu::device_can_access_peer(da, db) }?;
                }
            }
        }
        Ok(Self { devices, access })
    }

    /// A topology described rather than probed: `devices` by ordinal, and the pairs
    /// `(a, b)` where device `a` can map memory on device `b`. Pairs naming devices
    /// that do not exist are ignored.
    pub fn described(devices: Vec<GpuUuid>, peer_pairs: &[(usize, usize)]) -> Self {
        let n = devices.len();
        let mut access = vec![vec![false; n]; n];
        for &(a, b) in peer_pairs {
            if a < n && b < n && a != b {
                access[a][b] = true;
            }
        }
        Self { devices, access }
    }

    /// The ordinal under which this process sees the GPU `uuid`, if it sees it.
    pub fn ordinal_of(&self, uuid: &GpuUuid) -> Option<usize> {
        self.devices.iter().position(|d| d == uuid)
    }

    /// Whether device `from` can map memory on device `to` (both ordinals).
    pub fn can_access(&self, from: usize, to: usize) -> bool {
        self.access.get(from).and_then(|r| r.get(to)).copied().unwrap_or(false)
    }

    /// How many GPUs this process sees.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether this process sees no GPU.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}
