//! The session: opening it (GPU or host memory, provider, Zenoh), and declaring
//! publishers and subscribers on it.

use std::future::{IntoFuture, Ready, ready};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{DeviceChoice, ProviderMode, ZcsConfig};
use crate::cuda::{Gpu, ProbeError};
use crate::pool::BackendKind;
use crate::protocol::Group;
use crate::provider::{NoProvider, ProviderClient, ProviderWatch};
use crate::transport::shm_out::ShmOut;

use super::*;

/// Opening a session failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Zenoh could not open, or a declaration the session makes at open failed.
    #[error("opening the Zenoh session failed")]
    Zenoh(#[source] zenoh::Error),
    /// `device: cuda` was asked for but no usable GPU was found.
    #[error(
        "device \"cuda\" needs a GPU and none is usable; set device to \"auto\" (a GPU when usable, host memory \
         otherwise) or \"host\" to run on host memory (ZCS_DEVICE, or --device in the examples)"
    )]
    NoGpu(#[source] ProbeError),
    /// The boot id could not be read.
    #[error("cannot read the boot id")]
    BootId(#[source] std::io::Error),
    /// The socket directory cannot be used.
    #[error("socket directory")]
    SocketDir(#[from] crate::ipc::RuntimeDirError),
    /// `provider: required` was configured and no host provider could be used.
    #[error("provider: required was configured, and no host provider can be used")]
    NoProvider(#[source] NoProvider),
    /// `zenoh_shm_out_bytes` is set and its pool cannot be made.
    #[error("the Zenoh shared-memory pool for copies out (zenoh_shm_out_bytes)")]
    ShmOut(#[source] crate::ShmOutError),
}

pub(super) struct SessionInner {
    pub(super) zenoh: zenoh::Session,
    pub(super) cfg: ZcsConfig,
    pub(super) gpu: Option<Gpu>,
    pub(super) group: Group,
    pub(super) why_host: Option<String>,
    /// Providers reached by this session (its own, and those publishers name).
    pub(super) providers: Arc<crate::provider::Providers>,
    /// The provider its publishers borrow from (`None` with `provider: off`).
    pub(super) watch: Option<Arc<ProviderWatch>>,
    /// What this session reports to its provider (shared with `with_plain_listen`).
    pub(super) reports: Arc<Mutex<Reports>>,
    /// The Zenoh SHM pool its publishers copy out into (`zenoh_shm_out_bytes`).
    pub(super) shm_out: Option<Arc<ShmOut>>,
    /// The largest message Zenoh's receivers take, from the configuration this session
    /// was opened with (Zenoh's default where it was opened elsewhere).
    pub(super) max_message: usize,
}

/// Zenoh's default `transport/link/rx/max_message_size` (zenoh-config 1.10.2).
const ZENOH_MAX_MESSAGE: usize = 1 << 30;
/// Descriptor-table slots a session reserves when it opens: room for a full pool's
/// blocks (1024 by default) and as many imports, with Zenoh's sockets beside them.
const FD_TABLE_SLOTS: usize = 4096;

/// A Zenoh session with a GPU (or host-memory) block provider. Cheap to clone.
///
/// Opened with [`GpuSession::open`] (or [`GpuSession::from_zenoh`] on a Zenoh session
/// of the application's); it declares [`GpuPublisher`]s and [`GpuSubscriber`]s.
/// Without a usable GPU, `device: auto` (the default) opens on host memory and
/// [`host_reason`](GpuSession::host_reason) says why.
///
/// ```
/// use zenoh_cuda_shm::config::DeviceChoice;
/// use zenoh_cuda_shm::{BackendKind, GpuSession, ZcsConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let mut zenoh = zenoh::Config::default();
/// # zenoh.insert_json5("scouting/multicast/enabled", "false")?;
/// let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
/// let session = GpuSession::open(zenoh, cfg).wait()?;
/// assert_eq!(session.backend(), BackendKind::HostMemfd);
/// assert!(session.gpu().is_none());
/// println!("host memory: {}", session.host_reason().unwrap_or("-"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct GpuSession(pub(super) Arc<SessionInner>);

impl std::fmt::Debug for GpuSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSession").field("backend", &self.backend()).field("group", &self.0.group).finish()
    }
}

/// Builder returned by [`GpuSession::open`].
#[must_use = "resolve with .wait() or .await"]
pub struct OpenBuilder {
    zenoh: Result<zenoh::Config, zenoh::Session>,
    cfg: ZcsConfig,
}

impl OpenBuilder {
    /// Opens the session (blocking): Zenoh (unless given an open session), the GPU per
    /// `device`, and the host provider per `provider`.
    ///
    /// # Errors
    /// [`OpenError::Zenoh`] when Zenoh cannot open or the provider watch cannot be
    /// declared; [`OpenError::NoGpu`] for `device: cuda` without a usable GPU (`auto`
    /// falls back to host memory instead); [`OpenError::SocketDir`] when the configured
    /// `socket_dir` cannot be created or used; [`OpenError::BootId`] when the boot id
    /// cannot be read (and no `host_id` is configured); [`OpenError::ShmOut`] when
    /// `zenoh_shm_out_bytes` is set and that pool cannot be made;
    /// [`OpenError::NoProvider`] for `provider: required` when no provider answered
    /// within `provider_discovery_ms`.
    pub fn wait(self) -> Result<GpuSession, OpenError> {
        use zenoh::Wait;
        // Before Zenoh starts its threads: growing the table later stalls whichever
        // thread opens a block's descriptor (`zcs_memory::fd_table`).
        if let Err(e) = zcs_memory::fd_table::reserve(FD_TABLE_SLOTS) {
            tracing::debug!(error = %e, "the descriptor table could not be grown up front");
        }
        let (zenoh, dials, max_message) = match self.zenoh {
            Ok(c) => {
                let dials = names_connect_endpoints(&c).then(|| c.get_json("connect/endpoints").unwrap_or_default());
                let max = c.get_json("transport/link/rx/max_message_size").ok().and_then(|v| v.trim().parse().ok());
                (zenoh::open(c).wait().map_err(OpenError::Zenoh)?, dials, max.unwrap_or(ZENOH_MAX_MESSAGE))
            }
            Err(s) => (s, None, ZENOH_MAX_MESSAGE),
        };
        let cfg = self.cfg;
        let (gpu, why_host) = match cfg.device {
            DeviceChoice::Host => (None, Some("host memory was configured (device: host)".to_owned())),
            DeviceChoice::Cuda => (Some(Gpu::open(cfg.gpu_ordinal).map_err(OpenError::NoGpu)?), None),
            DeviceChoice::Auto => match Gpu::open(cfg.gpu_ordinal) {
                Ok(g) if g.supports_stream_mem_ops_64() => (Some(g), None),
                Ok(g) => (None, Some(format!("{} lacks 64-bit stream memory operations", g.name()))),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        if let Some(dir) = &cfg.socket_dir {
            crate::ipc::ensure_runtime_dir(dir)?;
        }
        let boot_id = match &cfg.host_id {
            Some(id) => id.as_str().to_owned(),
            None => crate::host::boot_id().map_err(OpenError::BootId)?,
        };
        let device = match &gpu {
            Some(g) => Group::cuda_device(&g.uuid()),
            None => Group::HOST.to_owned(),
        };
        if let Some(g) = &gpu
            && let Err(e) = crate::cuda::warm_import_path(g)
        {
            // Not fatal here: the same calls fail again, with their context, where they matter.
            tracing::warn!(error = %crate::error::Chain(&e), "zenoh-cuda-shm: warming the CUDA import path failed");
        }
        match (&gpu, &why_host) {
            (Some(g), _) => tracing::info!(gpu = g.name(), uuid = %g.uuid(), "zenoh-cuda-shm: CUDA VMM blocks"),
            (None, Some(why)) => tracing::info!(why = %why, "zenoh-cuda-shm: no GPU path, using host memory blocks"),
            (None, None) => {}
        }
        let shm_out = match usize::try_from(cfg.zenoh_shm_out_bytes).unwrap_or(usize::MAX) {
            0 => None,
            bytes => Some(Arc::new(ShmOut::new(bytes, gpu.as_ref()).map_err(OpenError::ShmOut)?)),
        };
        let providers = Arc::new(crate::provider::Providers::new(rand::random::<u64>() | 1));
        let watch = match cfg.provider {
            ProviderMode::Off => None,
            ProviderMode::Auto | ProviderMode::Required => {
                let connect = Duration::from_millis(cfg.handshake_timeout_ms);
                let w = ProviderWatch::start(&zenoh, &boot_id, &device, Arc::clone(&providers), connect)
                    .map_err(OpenError::Zenoh)?;
                let timeout = Duration::from_millis(cfg.provider_discovery_ms);
                let found = if cfg.provider == ProviderMode::Required {
                    w.wait(timeout)
                } else {
                    // A peer's open may return before its connections are up (Zenoh
                    // connects in the background once `scouting/delay` has passed), and
                    // a query with nowhere to go ends at once, empty.
                    let deadline = Instant::now() + timeout;
                    if dials.is_some() {
                        wait_for_a_link(&zenoh, deadline);
                    }
                    // One query, answered at once by a router; the watch picks up a
                    // provider that shows up later.
                    let left = deadline.saturating_duration_since(Instant::now());
                    if let Some(r) = ProviderClient::discover(&zenoh, &boot_id, left) {
                        w.offer(r);
                    }
                    w.current()
                };
                match found {
                    Ok(c) => {
                        tracing::info!(provider = ?c.provider(), "zenoh-cuda-shm: blocks lent by the host provider")
                    }
                    Err(why) if cfg.provider == ProviderMode::Required => return Err(OpenError::NoProvider(why)),
                    Err(why) => tracing::debug!(why = %why, "zenoh-cuda-shm: no host provider (yet)"),
                }
                Some(Arc::new(w))
            }
        };
        let inner = Arc::new(SessionInner {
            zenoh,
            cfg,
            gpu,
            group: Group { boot_id, device },
            why_host,
            providers,
            watch,
            reports: Arc::default(),
            shm_out,
            max_message,
        });
        if let Some(endpoints) = dials {
            warn_if_unreached(Arc::downgrade(&inner), endpoints);
        }
        Ok(GpuSession(inner))
    }
}

impl IntoFuture for OpenBuilder {
    type Output = Result<GpuSession, OpenError>;
    type IntoFuture = Ready<Self::Output>;
    fn into_future(self) -> Self::IntoFuture {
        ready(self.wait())
    }
}

impl GpuSession {
    /// Opens a Zenoh session with `zenoh_config` and a block provider per `config`:
    /// resolve the builder with `.wait()` or `.await` ([`OpenBuilder::wait`] lists the
    /// errors).
    pub fn open(zenoh_config: zenoh::Config, config: ZcsConfig) -> OpenBuilder {
        OpenBuilder { zenoh: Ok(zenoh_config), cfg: config }
    }

    /// Wraps an open Zenoh session (resolve with `.wait()` or `.await`, as
    /// [`GpuSession::open`]).
    pub fn from_zenoh(session: zenoh::Session, config: ZcsConfig) -> OpenBuilder {
        OpenBuilder { zenoh: Err(session), cfg: config }
    }

    /// The host provider a publisher declared now borrows blocks from, or why its
    /// blocks are allocated in this process.
    ///
    /// # Errors
    /// [`NoProvider::Off`] with `provider: off`; [`NoProvider::NotAnnounced`] while no
    /// provider has announced itself on this host; [`NoProvider::NoSuchDevice`] when the
    /// provider does not lend blocks of this session's device; [`NoProvider::Unusable`]
    /// when it is announced but cannot be used.
    pub fn provider(&self) -> Result<crate::protocol::ProviderRef, NoProvider> {
        self.provider_client().map(|c| c.provider().clone())
    }

    /// Adds a publisher or subscriber to what this session reports to its provider, and
    /// starts the thread that sends the reports. Only while a provider is in use: a
    /// session without one keeps no reporters and runs no such thread.
    pub(super) fn report(&self, reporter: Reporter) {
        let Some(watch) = &self.0.watch else { return };
        let mut r = lock_reports(&self.0.reports);
        if !r.sending {
            if watch.current().is_err() {
                return;
            }
            let (reports, watch) = (Arc::downgrade(&self.0.reports), Arc::downgrade(watch));
            match std::thread::Builder::new().name("zcs-report".into()).spawn(move || send_reports(reports, watch)) {
                Ok(_) => r.sending = true,
                Err(e) => {
                    return tracing::warn!(error = %crate::error::Chain(&e), "cannot start the thread reporting to the provider");
                }
            }
        }
        r.reporters.push(reporter);
    }

    pub(super) fn provider_client(&self) -> Result<Arc<ProviderClient>, NoProvider> {
        match &self.0.watch {
            Some(w) => w.current(),
            None => Err(NoProvider::Off),
        }
    }

    /// The Zenoh session.
    pub fn zenoh(&self) -> &zenoh::Session {
        &self.0.zenoh
    }

    /// The keys of this library's publishers that this session can see now, from their
    /// liveliness tokens (sorted, each once), waiting at most `timeout` for answers.
    /// Plain Zenoh publishers declare no token and are not listed. A subscriber that
    /// hears nothing can name them, in case its key was mistyped.
    ///
    /// # Errors
    /// Zenoh's error when the liveliness query cannot be sent.
    pub fn publisher_keys(&self, timeout: Duration) -> Result<Vec<String>, zenoh::Error> {
        use zenoh::Wait;
        let replies =
            self.zenoh().liveliness().get(format!("{}/pub/**", crate::protocol::TOKEN_ROOT)).timeout(timeout).wait()?;
        let mut keys = std::collections::BTreeSet::new();
        while let Ok(reply) = replies.recv() {
            if let Some(t) = reply.result().ok().and_then(|s| crate::protocol::Token::parse(s.key_expr().as_str())) {
                keys.insert(t.key);
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// The keys of [`publisher_keys`](Self::publisher_keys) that `key` does not match:
    /// where to look when a subscriber of `key` hears nothing (a mistyped key, say).
    ///
    /// # Errors
    /// Zenoh's error when `key` is not a key expression or the liveliness query cannot
    /// be sent.
    pub fn other_publisher_keys(&self, key: &str, timeout: Duration) -> Result<Vec<String>, zenoh::Error> {
        let ours = zenoh::key_expr::KeyExpr::try_from(key)?;
        let mut keys = self.publisher_keys(timeout)?;
        keys.retain(|k| zenoh::key_expr::KeyExpr::try_from(k.as_str()).is_ok_and(|k| !k.intersects(&ours)));
        Ok(keys)
    }

    /// The GPU, if the session uses one.
    pub fn gpu(&self) -> Option<&Gpu> {
        self.0.gpu.as_ref()
    }

    /// Where blocks live.
    pub fn backend(&self) -> BackendKind {
        if self.0.gpu.is_some() { BackendKind::CudaVmm } else { BackendKind::HostMemfd }
    }

    /// Why the session uses host memory, if it does.
    pub fn host_reason(&self) -> Option<&str> {
        self.0.why_host.as_deref()
    }

    /// The session's configuration.
    pub fn config(&self) -> &ZcsConfig {
        &self.0.cfg
    }

    /// Declares a publisher on a concrete key.
    pub fn declare_publisher(&self, key: impl Into<String>) -> PublisherBuilder {
        PublisherBuilder { session: self.clone(), key: key.into() }
    }

    /// Declares a subscriber on a key expression (wildcards allowed). Without a
    /// handler it delivers through a FIFO channel of 256 samples (Zenoh's default).
    pub fn declare_subscriber(&self, key: impl Into<String>) -> SubscriberBuilder<Fifo> {
        SubscriberBuilder { session: self.clone(), key: key.into(), handler: Fifo(256), peer_gpus: None }
    }

    /// A handle on the same Zenoh session and GPU whose subscribers use `plain_listen`
    /// instead of the configured value (e.g. `Never` for keys no plain publisher uses,
    /// so that our publishers there never pay a copy for a listener that drops it).
    pub fn with_plain_listen(&self, plain_listen: crate::config::PlainListen) -> GpuSession {
        let s = &self.0;
        let cfg = ZcsConfig { plain_listen, ..s.cfg.clone() };
        GpuSession(Arc::new(SessionInner {
            zenoh: s.zenoh.clone(),
            cfg,
            gpu: s.gpu.clone(),
            group: s.group.clone(),
            why_host: s.why_host.clone(),
            providers: Arc::clone(&s.providers),
            watch: s.watch.clone(),
            reports: Arc::clone(&s.reports),
            shm_out: s.shm_out.clone(),
            max_message: s.max_message,
        }))
    }
}
