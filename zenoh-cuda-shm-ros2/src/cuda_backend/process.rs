//! What this process shares among its subscriptions of the CUDA buffer backend: one
//! import cache per GPU (upstream keeps one per process, `cuda_buffer_ipc_manager.cpp:103-115`)
//! and one handle on the host endpoint registry, each made with the first subscription
//! that needs it and dropped with the last.

use std::sync::{Arc, Mutex, Weak};

use zcs_memory::cuda::Gpu;
use zcs_wire::rosidl_cuda::{EndpointKind, HostRegistry, RegistryError};

use super::BackendImports;
use crate::sync::Unpoisoned;

/// The registry's domain: the backend's plugin always uses 0, whatever
/// `ROS_DOMAIN_ID` is (`cuda_buffer_backend_plugin.cpp:58`).
const REGISTRY_DOMAIN: u32 = 0;

static IMPORTS: Mutex<Vec<(usize, Weak<BackendImports>)>> = Mutex::new(Vec::new());
static REGISTRY: Mutex<Weak<HostRegistry>> = Mutex::new(Weak::new());

/// The import cache of `gpu`.
///
/// # Errors
/// Its release thread could not be started.
pub(crate) fn imports_for(gpu: &Gpu) -> std::io::Result<Arc<BackendImports>> {
    let mut all = IMPORTS.locked();
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(i) = all.iter().find(|(o, _)| *o == gpu.ordinal()).and_then(|(_, w)| w.upgrade()) {
        return Ok(i);
    }
    let imports = Arc::new(BackendImports::new(gpu)?);
    all.push((gpu.ordinal(), Arc::downgrade(&imports)));
    Ok(imports)
}

/// The registry handle this process shares, attached with its first user.
fn shared_registry() -> Result<Arc<HostRegistry>, RegistryError> {
    let mut shared = REGISTRY.locked();
    if let Some(r) = shared.upgrade() {
        return Ok(r);
    }
    let r = Arc::new(HostRegistry::open(REGISTRY_DOMAIN)?);
    *shared = Arc::downgrade(&r);
    Ok(r)
}

/// An endpoint's entry in the host endpoint registry, marked inactive when dropped.
pub(crate) struct Registration {
    registry: Arc<HostRegistry>,
    gid: [u8; 16],
}

impl Registration {
    /// Registers endpoint `gid` (a publisher or subscription of type `type_name`) on
    /// `gpu`, as able to share blocks.
    ///
    /// # Errors
    /// [`RegistryError`]: the registry cannot be attached to or written.
    pub(crate) fn new(gid: [u8; 16], kind: EndpointKind, gpu: &Gpu, type_name: &str) -> Result<Self, RegistryError> {
        let registry = shared_registry()?;
        let ordinal = i32::try_from(gpu.ordinal()).unwrap_or(i32::MAX);
        // `ipc_capable`: this process maps the backend's blocks and exports its own.
        registry.register(gid, kind, ordinal, true, type_name)?;
        Ok(Self { registry, gid })
    }

    /// The registry, to look other endpoints up.
    pub(crate) fn registry(&self) -> &HostRegistry {
        &self.registry
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Err(e) = self.registry.unregister(self.gid) {
            tracing::warn!(error = %zenoh_cuda_shm::error::Chain(&e), "cannot mark our registry entry inactive; it stays until this process exits");
        }
    }
}
