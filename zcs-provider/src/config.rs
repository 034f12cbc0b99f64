//! The provider's configuration (which GPUs and host memory it lends, its pools), and
//! what can stop it from starting.

use std::path::PathBuf;

use crate::cuda::ProbeError;
use crate::pool::{PoolConfig, PoolError};

/// Which GPUs a provider serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSelection {
    /// Every GPU that supports the zero-copy path (default).
    #[default]
    All,
    /// None: host memory only (no CUDA context in this process).
    None,
    /// These ordinals (as the driver numbers them in this process).
    Ordinals(Vec<usize>),
}

/// What a provider serves, and to whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// GPUs whose blocks it lends.
    pub gpus: GpuSelection,
    /// Whether it lends host memory blocks (sealed memfds) too.
    pub host: bool,
    /// Caps and timings of each device's pool.
    pub pool: PoolConfig,
    /// Directory for a path socket; `None`: the abstract namespace.
    pub socket_dir: Option<PathBuf>,
    /// Users besides our own allowed to connect.
    pub allowed_uids: Vec<u32>,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            gpus: GpuSelection::All,
            host: true,
            pool: PoolConfig::default(),
            socket_dir: None,
            allowed_uids: Vec::new(),
        }
    }
}

/// Starting a provider failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The boot id could not be read.
    #[error("cannot read the boot id")]
    BootId(#[source] std::io::Error),
    /// The socket directory cannot be used.
    #[error("the provider's socket directory cannot be used")]
    SocketDir(#[from] crate::ipc::RuntimeDirError),
    /// The socket could not be bound.
    #[error("cannot bind the provider's socket")]
    Bind(#[from] crate::ipc::BindError),
    /// The thread accepting connections could not be started.
    #[error("cannot start the provider's thread")]
    Thread(#[source] std::io::Error),
    /// A GPU that was asked for by ordinal cannot be used.
    #[error("GPU {ordinal}")]
    Gpu {
        /// Its ordinal.
        ordinal: usize,
        /// Why.
        #[source]
        source: ProbeError,
    },
    /// A pool could not be created (bad caps).
    #[error("cannot create a block pool")]
    Pool(#[from] PoolError),
    /// Nothing to lend: no GPU selected or usable, and host blocks off.
    #[error("nothing to lend: no usable GPU selected and host blocks disabled")]
    Empty,
    /// The liveliness token could not be declared.
    #[error("cannot declare the provider's liveliness token")]
    Zenoh(#[source] zenoh::Error),
}
