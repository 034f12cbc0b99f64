//! What a provider shows of itself: counters, devices, clients and their loans (the
//! zenohd plugin publishes this in the admin space).

use serde::Serialize;

use crate::pool::PoolStats;
use crate::protocol::{ProcessReport, ProviderRef};

/// Counters since start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProviderCounters {
    /// Blocks lent.
    pub lent: u64,
    /// Loans given back by living borrowers.
    pub returned: u64,
    /// Lent blocks opened by importers.
    pub opened: u64,
    /// Borrows refused (caps, unknown device).
    pub borrow_refused: u64,
    /// Opens refused (unknown or ended loan).
    pub open_refused: u64,
    /// Loans orphaned by a borrower's death.
    pub orphaned: u64,
    /// Orphaned loans taken back into the pool once nobody mapped them.
    pub reclaimed: u64,
    /// Malformed requests (connection dropped).
    pub bad_requests: u64,
    /// Connections refused by the access policy.
    pub refused_connections: u64,
}

/// One device's pool, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceSnapshot {
    /// `cuda-<uuid>` or `host`.
    pub device: String,
    /// GPU name and ordinal (CUDA devices).
    pub gpu: Option<(String, usize)>,
    /// Its pool's counters: bytes allocated (`bytes`) and lent (`bytes_in_use`).
    pub pool: PoolStats,
    /// Live loans (lent to a living borrower).
    pub loans: usize,
    /// Orphaned loans still mapped by someone.
    pub orphaned: usize,
}

/// One connected process, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct ClientSnapshot {
    /// Its session's random id.
    pub client: String,
    /// Program name.
    pub program: String,
    /// PID (0 when in another PID namespace) and UID, from `SO_PEERCRED`.
    pub pid: i32,
    /// UID.
    pub uid: u32,
    /// Connected since (ms since the Unix epoch).
    pub since_ms: u64,
    /// Blocks it holds on loan now.
    pub loans: usize,
    /// Lent blocks it maps now.
    pub mapped: usize,
    /// Blocks borrowed and opened since it connected.
    pub borrowed_total: u64,
    /// Opens since it connected.
    pub opened_total: u64,
    /// Its latest report (publishers, subscribers, paths, copies), if it sent one.
    pub report: Option<ProcessReport>,
    /// When that report came (ms since the Unix epoch).
    pub reported_ms: Option<u64>,
}

/// Everything a provider can tell about itself (the plugin's admin space shows it).
#[derive(Debug, Clone, Serialize)]
pub struct ProviderSnapshot {
    /// Id (hex) and socket.
    pub provider: ProviderRef,
    /// The kernel it serves.
    pub boot_id: String,
    /// Its pools.
    pub devices: Vec<DeviceSnapshot>,
    /// GPUs it could not use, and why.
    pub unusable_gpus: Vec<String>,
    /// Connected processes.
    pub clients: Vec<ClientSnapshot>,
    /// Counters.
    pub counters: ProviderCounters,
}
