//! The public API, in the style of Zenoh 1.x: a session, builders that resolve with
//! `.wait()` or `.await`, publishers that loan blocks and subscribers with callback or
//! channel handlers.
//!
//! ```no_run
//! use zenoh_cuda_shm::{GpuSession, ZcsConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let session = GpuSession::open(zenoh::Config::default(), ZcsConfig::default()).wait()?;
//! println!("blocks live in {}", session.backend()); // cuda-vmm, or host-memfd without a GPU
//!
//! let subscriber = session.declare_subscriber("demo/tensor").wait()?;
//! let publisher = session.declare_publisher("demo/tensor").wait()?;
//!
//! let mut loan = publisher.loan(8 << 20)?;
//! loan.write_bytes(0, &vec![7u8; 8 << 20])?; // or launch kernels on loan.device_ptr()
//! publisher.put(loan)?;
//!
//! let sample = subscriber.recv()?;
//! println!("{} bytes by the {} path", sample.len(), sample.path());
//! # Ok(()) }
//! ```

use std::future::{IntoFuture, Ready, ready};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{DeviceChoice, ProviderMode, ZcsConfig};
use crate::cuda::{Gpu, ProbeError, Stream, copy};
use crate::ipc::{AccessPolicy, SocketName};
use crate::pool::{BackendKind, CudaBackend, HostBackend, Loan, LoanError, Pool, PoolStats};
use crate::protocol::Group;
use crate::provider::{DeviceLender, NoProvider, ProviderClient, ProviderWatch};
use crate::sample::{GpuSample, Path, SampleInfo};
use crate::signal::{ReadySignals, SignalError, WriteGuard};
use crate::sync::Unpoisoned;
use crate::transport::medium::{PubMedium, PublishedAny};
use crate::transport::publisher::{DeclareError, PublisherCore, PublisherStats, PutError, PutReport};
use crate::transport::subscriber::{SubMedium, SubscriberCore, SubscriberStats};

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
}

struct SessionInner {
    zenoh: zenoh::Session,
    cfg: ZcsConfig,
    gpu: Option<Gpu>,
    group: Group,
    why_host: Option<String>,
    /// Providers reached by this session (its own, and those publishers name).
    providers: Arc<crate::provider::Providers>,
    /// The provider its publishers borrow from (`None` with `provider: off`).
    watch: Option<Arc<ProviderWatch>>,
    /// What this session reports to its provider (shared with `with_plain_listen`).
    reports: Arc<Mutex<Reports>>,
}

/// One publisher or subscriber: adds its entry to the process's report while it
/// exists, and returns whether it still does.
type Reporter = Box<dyn Fn(&mut crate::protocol::ProcessReport) -> bool + Send + Sync>;

/// The session's publishers and subscribers, and whether the thread that sends their
/// reports (and forgets those that are gone) runs.
#[derive(Default)]
struct Reports {
    reporters: Vec<Reporter>,
    sending: bool,
}

fn lock_reports(r: &Mutex<Reports>) -> std::sync::MutexGuard<'_, Reports> {
    r.locked()
}

/// How often a session reports to its provider.
const REPORT_PERIOD: Duration = Duration::from_secs(1);

/// Sends the session's report to its provider now and every [`REPORT_PERIOD`], until the
/// session or its watch is gone.
fn send_reports(reports: std::sync::Weak<Mutex<Reports>>, watch: std::sync::Weak<ProviderWatch>) {
    loop {
        let (Some(reports), Some(watch)) = (reports.upgrade(), watch.upgrade()) else { return };
        let report = {
            let mut r = lock_reports(&reports);
            let mut out = crate::protocol::ProcessReport::default();
            r.reporters.retain(|f| f(&mut out));
            out
        };
        drop(reports);
        if let Ok(client) = watch.current() {
            client.report(report);
        }
        drop(watch);
        std::thread::sleep(REPORT_PERIOD);
    }
}

/// Whether `config` names endpoints to connect to, as one list or per mode.
fn names_connect_endpoints(config: &zenoh::Config) -> bool {
    fn any(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Array(a) => !a.is_empty(),
            serde_json::Value::Object(m) => m.values().any(any),
            _ => false,
        }
    }
    let json = config.get_json("connect/endpoints").unwrap_or_default();
    serde_json::from_str(&json).is_ok_and(|v| any(&v))
}

/// Whether `zenoh` is connected to a router or a peer.
fn linked(zenoh: &zenoh::Session) -> bool {
    use zenoh::Wait;
    let info = zenoh.info();
    info.routers_zid().wait().next().is_some() || info.peers_zid().wait().next().is_some()
}

/// Waits until `zenoh` has a router or a peer, or until `deadline`.
fn wait_for_a_link(zenoh: &zenoh::Session, deadline: Instant) {
    while !linked(zenoh) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How long a session that names connect endpoints may reach no router or peer before
/// it says so.
const UNREACHED_WARNING_AFTER: Duration = Duration::from_secs(3);

/// Warns (once) if the session has reached no router or peer [`UNREACHED_WARNING_AFTER`]
/// after opening, although it names endpoints to connect to: in peer mode Zenoh keeps
/// retrying them without a word, and a publisher runs on with nobody to hear it.
fn warn_if_unreached(session: std::sync::Weak<SessionInner>, endpoints: String) {
    let opened = Instant::now();
    let check = move || {
        loop {
            let Some(s) = session.upgrade() else { return };
            if linked(&s.zenoh) || s.zenoh.is_closed() {
                return;
            }
            if opened.elapsed() >= UNREACHED_WARNING_AFTER {
                return tracing::warn!(
                    endpoints = %endpoints,
                    "zenoh-cuda-shm: no Zenoh router or peer reached after {UNREACHED_WARNING_AFTER:?}; Zenoh keeps \
                     trying quietly. Is zenohd (or the other process) running and listening there?"
                );
            }
            drop(s);
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    if let Err(e) = std::thread::Builder::new().name("zcs-link-check".into()).spawn(check) {
        tracing::debug!(error = %crate::error::Chain(&e), "cannot start the check for unreached endpoints");
    }
}

/// A Zenoh session with a GPU (or host-memory) block provider. Cheap to clone.
#[derive(Clone)]
pub struct GpuSession(Arc<SessionInner>);

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
    /// Opens the session (blocking).
    pub fn wait(self) -> Result<GpuSession, OpenError> {
        use zenoh::Wait;
        let (zenoh, dials) = match self.zenoh {
            Ok(c) => {
                let dials = names_connect_endpoints(&c).then(|| c.get_json("connect/endpoints").unwrap_or_default());
                (zenoh::open(c).wait().map_err(OpenError::Zenoh)?, dials)
            }
            Err(s) => (s, None),
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
        let boot_id = crate::host::boot_id().map_err(OpenError::BootId)?;
        let device = match &gpu {
            Some(g) => Group::cuda_device(&g.uuid()),
            None => "host".to_owned(),
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
    /// Opens a Zenoh session with `zenoh_config` and a block provider per `config`.
    pub fn open(zenoh_config: zenoh::Config, config: ZcsConfig) -> OpenBuilder {
        OpenBuilder { zenoh: Ok(zenoh_config), cfg: config }
    }

    /// Wraps an open Zenoh session.
    pub fn from_zenoh(session: zenoh::Session, config: ZcsConfig) -> OpenBuilder {
        OpenBuilder { zenoh: Err(session), cfg: config }
    }

    /// The host provider a publisher declared now borrows blocks from, or why its
    /// blocks are allocated in this process.
    pub fn provider(&self) -> Result<crate::protocol::ProviderRef, NoProvider> {
        self.provider_client().map(|c| c.provider().clone())
    }

    /// Adds a publisher or subscriber to what this session reports to its provider, and
    /// starts the thread that sends the reports. Only while a provider is in use: a
    /// session without one keeps no reporters and runs no such thread.
    fn report(&self, reporter: Reporter) {
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

    fn provider_client(&self) -> Result<Arc<ProviderClient>, NoProvider> {
        match &self.0.watch {
            Some(w) => w.current(),
            None => Err(NoProvider::Off),
        }
    }

    /// The Zenoh session.
    pub fn zenoh(&self) -> &zenoh::Session {
        &self.0.zenoh
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
        SubscriberBuilder { session: self.clone(), key: key.into(), handler: Fifo(256) }
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
        }))
    }
}

/// Builder returned by [`GpuSession::declare_publisher`].
#[must_use = "resolve with .wait() or .await"]
pub struct PublisherBuilder {
    session: GpuSession,
    key: String,
}

impl PublisherBuilder {
    /// Declares the publisher (blocking).
    pub fn wait(self) -> Result<GpuPublisher, DeclareError> {
        let s = &self.session.0;
        let provider = self.session.provider_client().ok();
        let lender = provider.as_ref().map(|c| -> Arc<dyn crate::pool::Lender> {
            let timeout = Duration::from_millis(s.cfg.pool.loan_timeout_ms);
            Arc::new(DeviceLender::new(Arc::clone(c), s.group.device.clone(), timeout))
        });
        let medium = match &s.gpu {
            Some(gpu) => PubMedium::Cuda {
                pool: Pool::new(CudaBackend::new(gpu.clone()).with_lender(lender), s.cfg.pool.clone())?,
                signals: {
                    let signals = ReadySignals::create(gpu)?;
                    // One ready slot per block id: more blocks than slots cannot be signalled.
                    if s.cfg.pool.max_blocks > signals.slots() {
                        return Err(
                            crate::pool::PoolError::Config("pool.max_blocks exceeds the ready-signal slots").into()
                        );
                    }
                    Arc::new(signals)
                },
                stream: gpu.new_stream().map_err(SignalError::from)?,
                copy_stream: gpu.new_stream().map_err(SignalError::from)?,
                // Idle staging kept: enough for a few 4K RGBA frames.
                staging: crate::cuda::pinned::PinnedPool::new(gpu, 256 << 20),
            },
            None => {
                PubMedium::Host { pool: Pool::new(HostBackend::default().with_lender(lender), s.cfg.pool.clone())? }
            }
        };
        let socket = match &s.cfg.socket_dir {
            Some(dir) => SocketName::random_path_in(dir)?,
            None => SocketName::random_abstract(),
        };
        let mut policy = AccessPolicy::same_uid();
        for uid in &s.cfg.allowed_uids {
            policy = policy.with_uid(*uid);
        }
        let core = PublisherCore::new(
            &s.zenoh,
            &self.key,
            s.group.clone(),
            medium,
            socket,
            policy,
            Duration::from_millis(s.cfg.handshake_timeout_ms),
            s.cfg.congestion,
            Duration::from_millis(s.cfg.lease_wait_ms),
            provider.as_ref().map(|c| c.provider().clone()),
        )?;
        let report = core.reporter();
        self.session.report(Box::new(move |out| report().map(|p| out.publishers.push(p)).is_some()));
        Ok(GpuPublisher { core, inline_threshold: s.cfg.inline_threshold })
    }
}

impl IntoFuture for PublisherBuilder {
    type Output = Result<GpuPublisher, DeclareError>;
    type IntoFuture = Ready<Self::Output>;
    fn into_future(self) -> Self::IntoFuture {
        ready(self.wait())
    }
}

/// Publishes blocks (zero-copy to GPU-ready subscribers, bytes to everyone else).
pub struct GpuPublisher {
    core: PublisherCore,
    inline_threshold: usize,
}

impl std::fmt::Debug for GpuPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPublisher").field("key", &self.core.shared.key).finish()
    }
}

/// Publishing host or device data failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Device memory was given to a publisher whose session has no GPU.
    #[error(
        "this publisher's session has no GPU (host-memory blocks; its host_reason says why): publish host memory \
         instead, or open the session on a GPU"
    )]
    NoGpu,
    /// No block could be loaned.
    #[error(transparent)]
    Loan(#[from] LoanError),
    /// Writing into the block failed.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The put failed.
    #[error(transparent)]
    Put(#[from] PutError),
}

/// Writing into a loan failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The write does not fit the loaned length.
    #[error("write of {len} bytes at {offset} exceeds the loaned {loaned} bytes")]
    OutOfBounds {
        /// Offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Loaned length.
        loaned: usize,
    },
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// Enqueueing the ready signal failed.
    #[error(transparent)]
    Signal(#[from] SignalError),
}

enum LoanInner {
    Cuda(WriteGuard),
    Host(Loan<HostBackend>),
}

/// A block being written. Publish it with [`GpuPublisher::put`]; dropped unpublished,
/// it returns to the pool (after the work queued on its stream).
pub struct GpuLoan {
    inner: LoanInner,
    meta: Option<Vec<u8>>,
}

impl std::fmt::Debug for GpuLoan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLoan").field("len", &self.len()).field("device_ptr", &self.device_ptr()).finish()
    }
}

impl GpuLoan {
    /// The loaned length.
    pub fn len(&self) -> usize {
        match &self.inner {
            LoanInner::Cuda(g) => g.len(),
            LoanInner::Host(l) => l.len(),
        }
    }

    /// Whether the loaned length is zero (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device address to write (CUDA sessions).
    pub fn device_ptr(&self) -> Option<u64> {
        match &self.inner {
            LoanInner::Cuda(g) => Some(g.device_ptr()),
            LoanInner::Host(_) => None,
        }
    }

    /// The stream writes must be enqueued on (CUDA sessions): the ready signal follows
    /// them on it.
    pub fn stream(&self) -> Option<&Stream> {
        match &self.inner {
            LoanInner::Cuda(g) => Some(g.stream()),
            LoanInner::Host(_) => None,
        }
    }

    /// The block as host memory to write (host-memory sessions).
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match &mut self.inner {
            LoanInner::Cuda(_) => None,
            LoanInner::Host(l) => Some(host_bytes_mut(l)),
        }
    }

    /// Copies host bytes into the loan at `offset` (host→device on the loan's stream
    /// for CUDA sessions).
    pub fn write_bytes(&mut self, offset: usize, data: &[u8]) -> Result<(), WriteError> {
        let loaned = self.len();
        if offset.checked_add(data.len()).is_none_or(|end| end > loaned) {
            return Err(WriteError::OutOfBounds { offset, len: data.len(), loaned });
        }
        match &mut self.inner {
            // SAFETY: the range is inside the loaned block (checked above), which this
            // loan owns and keeps mapped past the copy (a loan returns its block only
            // after its stream's work).
            LoanInner::Cuda(g) => unsafe { copy::host_to_device(g.stream(), g.device_ptr() + offset as u64, data) }?,
            LoanInner::Host(l) => host_bytes_mut(l)[offset..offset + data.len()].copy_from_slice(data),
        }
        Ok(())
    }

    /// Attaches typed metadata (e.g. an encoded tensor description).
    pub fn set_meta(&mut self, meta: Vec<u8>) {
        self.meta = Some(meta);
    }

    /// Copies `dst.len()` bytes of the loan at `offset` to host memory: for CUDA
    /// sessions a device→host copy on the loan's stream (after the writes enqueued
    /// there so far), waited for before returning.
    pub fn read_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), WriteError> {
        let loaned = self.len();
        if offset.checked_add(dst.len()).is_none_or(|end| end > loaned) {
            return Err(WriteError::OutOfBounds { offset, len: dst.len(), loaned });
        }
        match &self.inner {
            // SAFETY: the range is inside the loaned block (checked above), which this
            // loan owns and keeps mapped while the copy runs (it returns after it).
            LoanInner::Cuda(g) => unsafe { copy::device_to_host(g.stream(), g.device_ptr() + offset as u64, dst) }?,
            LoanInner::Host(l) => {
                // SAFETY: the block is mapped with ≥ len bytes and owned by this loan; the
                // shared borrow of `self` excludes writes through `as_mut_slice` meanwhile.
                let src = unsafe { std::slice::from_raw_parts(l.addr() as *const u8, l.len()) };
                dst.copy_from_slice(&src[offset..offset + dst.len()]);
            }
        }
        Ok(())
    }
}

/// A host loan's bytes, to write.
fn host_bytes_mut(loan: &mut Loan<HostBackend>) -> &mut [u8] {
    // SAFETY: the loan owns the block exclusively until it is published, the block is
    // mapped with ≥ len bytes, and the slice borrows the loan mutably.
    unsafe { std::slice::from_raw_parts_mut(loan.addr() as *mut u8, loan.len()) }
}

impl GpuPublisher {
    /// The key.
    pub fn key(&self) -> &str {
        &self.core.shared.key
    }

    /// Where this publisher's blocks live.
    pub fn backend(&self) -> BackendKind {
        match self.core.shared.medium {
            PubMedium::Cuda { .. } => BackendKind::CudaVmm,
            PubMedium::Host { .. } => BackendKind::HostMemfd,
        }
    }

    /// Loans a block of `len` bytes bound to the publisher's own stream.
    pub fn loan(&self, len: usize) -> Result<GpuLoan, LoanError> {
        self.loan_inner(len, None)
    }

    /// Loans a block bound to `stream`: enqueue the writes there; the ready signal
    /// follows them (any stream, the legacy default stream included). Host-memory
    /// publishers have no stream and ignore it.
    pub fn loan_on(&self, len: usize, stream: &Stream) -> Result<GpuLoan, LoanError> {
        self.loan_inner(len, Some(stream))
    }

    /// A loan on `stream`, or on the publisher's own stream when `None`.
    fn loan_inner(&self, len: usize, stream: Option<&Stream>) -> Result<GpuLoan, LoanError> {
        let inner = match &self.core.shared.medium {
            PubMedium::Cuda { pool, signals, stream: own, .. } => {
                let stream = Arc::clone(stream.unwrap_or(own));
                LoanInner::Cuda(WriteGuard::new(pool.loan(len)?, stream, Arc::clone(signals)))
            }
            PubMedium::Host { pool } => LoanInner::Host(pool.loan(len)?),
        };
        Ok(GpuLoan { inner, meta: None })
    }

    /// Publishes a loan: its ready signal is enqueued after its writes, then it goes
    /// out by the cheapest path for each subscriber.
    pub fn put(&self, loan: GpuLoan) -> Result<PutReport, PutError> {
        let published = match loan.inner {
            LoanInner::Cuda(g) => PublishedAny::Cuda(g.finish()?),
            LoanInner::Host(l) => PublishedAny::Host(l.publish()),
        };
        self.core.put_block(published, loan.meta)
    }

    /// Publishes host bytes: inline up to the inline threshold, else through a block.
    pub fn put_bytes(&self, data: &[u8]) -> Result<PutReport, PublishError> {
        self.put_bytes_meta(data, None)
    }

    /// [`GpuPublisher::put_bytes`] with typed metadata.
    pub fn put_bytes_meta(&self, data: &[u8], meta: Option<Vec<u8>>) -> Result<PutReport, PublishError> {
        if data.len() <= self.inline_threshold {
            return Ok(self.core.put_inline(data.to_vec(), meta)?);
        }
        let mut loan = self.loan(data.len())?;
        loan.write_bytes(0, data)?;
        loan.meta = meta;
        Ok(self.put(loan)?)
    }

    /// Publishes `len` bytes of device memory at `src`, copied device→device on
    /// `stream` into a block (or to host, inline, below the threshold).
    ///
    /// # Safety
    /// `src..src+len` is device memory of this session's GPU, readable by work on
    /// `stream` and unchanged until that work has passed this copy.
    pub unsafe fn put_device(&self, src: u64, len: usize, stream: &Stream) -> Result<PutReport, PublishError> {
        let PubMedium::Cuda { pool, signals, .. } = &self.core.shared.medium else {
            return Err(PublishError::NoGpu);
        };
        if len <= self.inline_threshold {
            let mut host = vec![0u8; len];
            // SAFETY: the caller guarantees the source range.
            unsafe { copy::device_to_host(stream, src, &mut host) }.map_err(WriteError::from)?;
            return Ok(self.core.put_inline(host, None)?);
        }
        let guard = WriteGuard::new(pool.loan(len)?, Arc::clone(stream), Arc::clone(signals));
        // SAFETY: the destination is the loaned block (≥ len bytes, owned by the guard,
        // which returns it only after the stream's work); the source is the caller's
        // contract.
        unsafe { copy::device_to_device(stream, guard.device_ptr(), src, len) }.map_err(WriteError::from)?;
        Ok(self.put(GpuLoan { inner: LoanInner::Cuda(guard), meta: None })?)
    }

    /// Counters.
    pub fn stats(&self) -> PublisherStats {
        self.core.stats()
    }

    /// The pool's counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.core.shared.medium.stats()
    }

    /// GPU-ready subscriber connections (on the zero-copy path).
    pub fn zero_copy_subscribers(&self) -> usize {
        self.core.ready_count()
    }

    /// GPU-aware subscribers known from their tokens (ready or not).
    pub fn aware_subscribers(&self) -> usize {
        self.core.aware_count()
    }

    /// Whether someone listens on the plain key (and so costs a copy per message).
    pub fn plain_subscribers(&self) -> bool {
        self.core.plain_matching()
    }

    /// The Zenoh session.
    pub fn session(&self) -> &zenoh::Session {
        self.core.session()
    }
}

/// Handler: a FIFO channel of the given capacity (blocks the delivery when full,
/// like Zenoh's default handler).
#[derive(Debug, Clone, Copy)]
pub struct Fifo(pub usize);

/// Handler: a callback run for every sample (keep it short: it runs on Zenoh's
/// receive thread).
pub struct Callback(Box<dyn Fn(GpuSample) + Send + Sync>);

/// Builder returned by [`GpuSession::declare_subscriber`].
#[must_use = "resolve with .wait() or .await"]
pub struct SubscriberBuilder<H> {
    session: GpuSession,
    key: String,
    handler: H,
}

impl<H> SubscriberBuilder<H> {
    /// Delivers samples to `f`.
    pub fn callback(self, f: impl Fn(GpuSample) + Send + Sync + 'static) -> SubscriberBuilder<Callback> {
        SubscriberBuilder { session: self.session, key: self.key, handler: Callback(Box::new(f)) }
    }

    /// Delivers samples through a FIFO channel of `capacity`.
    pub fn fifo(self, capacity: usize) -> SubscriberBuilder<Fifo> {
        SubscriberBuilder { session: self.session, key: self.key, handler: Fifo(capacity.max(1)) }
    }

    fn core(&self, deliver: Box<dyn Fn(GpuSample) + Send + Sync>) -> Result<SubscriberCore, DeclareError> {
        let s = &self.session.0;
        let medium = match &s.gpu {
            Some(g) => SubMedium::Cuda(g.clone()),
            None => SubMedium::Host,
        };
        let core = SubscriberCore::new(
            &s.zenoh,
            &self.key,
            s.group.clone(),
            medium,
            s.cfg.plain_listen,
            Duration::from_millis(s.cfg.handshake_timeout_ms),
            Duration::from_micros(s.cfg.spin_us),
            deliver,
            Arc::clone(&s.providers),
        )?;
        let report = core.reporter();
        self.session.report(Box::new(move |out| report().map(|s| out.subscribers.push(s)).is_some()));
        Ok(core)
    }
}

impl SubscriberBuilder<Fifo> {
    /// Declares the subscriber (blocking).
    pub fn wait(self) -> Result<GpuSubscriber<flume::Receiver<GpuSample>>, DeclareError> {
        let (tx, rx) = flume::bounded(self.handler.0);
        let core = self.core(Box::new(move |s| {
            let _ = tx.send(s);
        }))?;
        Ok(GpuSubscriber { core, handler: rx })
    }
}

impl IntoFuture for SubscriberBuilder<Fifo> {
    type Output = Result<GpuSubscriber<flume::Receiver<GpuSample>>, DeclareError>;
    type IntoFuture = Ready<Self::Output>;
    fn into_future(self) -> Self::IntoFuture {
        ready(self.wait())
    }
}

impl SubscriberBuilder<Callback> {
    /// Declares the subscriber (blocking).
    pub fn wait(mut self) -> Result<GpuSubscriber<()>, DeclareError> {
        let f = std::mem::replace(&mut self.handler.0, Box::new(|_| {}));
        let core = self.core(f)?;
        Ok(GpuSubscriber { core, handler: () })
    }
}

impl IntoFuture for SubscriberBuilder<Callback> {
    type Output = Result<GpuSubscriber<()>, DeclareError>;
    type IntoFuture = Ready<Self::Output>;
    fn into_future(self) -> Self::IntoFuture {
        ready(self.wait())
    }
}

/// A GPU-aware subscriber. Dropping it undeclares it.
pub struct GpuSubscriber<H> {
    core: SubscriberCore,
    handler: H,
}

impl<H> std::fmt::Debug for GpuSubscriber<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSubscriber").field("key", &self.core.key()).finish()
    }
}

impl<H> GpuSubscriber<H> {
    /// Counters.
    pub fn stats(&self) -> SubscriberStats {
        self.core.stats()
    }

    /// Publishers of ours this subscriber knows: `(instance id, on the zero-copy path)`.
    pub fn publishers(&self) -> Vec<(u64, bool)> {
        self.core.publishers()
    }

    /// Why `publisher` (an instance id, as in [`GpuSubscriber::publishers`] and
    /// `SampleInfo::publisher`) serves this subscriber bytes rather than its blocks:
    /// `on another host`, `on another device (…)`, `handshake failed: …`, `handshake in
    /// progress`. `None` while it is on the zero-copy path, or for a publisher this
    /// subscriber does not know (a plain one).
    pub fn bytes_reason(&self, publisher: u64) -> Option<String> {
        self.core.bytes_reason(publisher)
    }

    /// Why a sample of this subscriber came by its path, in words to print beside it:
    /// `None` for [`Path::ZeroCopy`] (the fastest path needs no excuse).
    pub fn path_reason(&self, info: &SampleInfo) -> Option<String> {
        match info.path {
            Path::ZeroCopy => None,
            Path::Plain => Some("a plain Zenoh publisher, not one of ours".to_owned()),
            Path::Inline => Some("a small message, carried whole (the publisher's inline_threshold)".to_owned()),
            Path::CpuBytes => Some(self.bytes_reason(info.publisher).unwrap_or_else(|| {
                "copied out by the publisher: sent while the link came up, or this subscriber is at its lease limit"
                    .to_owned()
            })),
        }
    }

    /// The handler (the channel receiver for FIFO subscribers).
    pub fn handler(&self) -> &H {
        &self.handler
    }
}

/// The subscriber's channel was closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecvError {
    /// No sample within the timeout.
    #[error("no sample within the timeout")]
    Timeout,
    /// The subscriber is closed.
    #[error("subscriber closed")]
    Closed,
}

impl GpuSubscriber<flume::Receiver<GpuSample>> {
    /// Waits for the next sample (polling for up to `spin_us` first).
    pub fn recv(&self) -> Result<GpuSample, RecvError> {
        if let Some(s) = self.spin(Duration::MAX)? {
            return Ok(s);
        }
        self.handler.recv().map_err(|_| RecvError::Closed)
    }

    /// Waits up to `timeout` for the next sample (polling for up to `spin_us` of it
    /// first).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<GpuSample, RecvError> {
        let t = std::time::Instant::now();
        if let Some(s) = self.spin(timeout)? {
            return Ok(s);
        }
        self.handler.recv_timeout(timeout.saturating_sub(t.elapsed())).map_err(|e| match e {
            flume::RecvTimeoutError::Timeout => RecvError::Timeout,
            flume::RecvTimeoutError::Disconnected => RecvError::Closed,
        })
    }

    /// Polls the queue for up to `spin_us` (at most `within`) without sleeping.
    fn spin(&self, within: Duration) -> Result<Option<GpuSample>, RecvError> {
        let spin = self.core.spin().min(within);
        if spin.is_zero() {
            return Ok(None);
        }
        let t = std::time::Instant::now();
        loop {
            match self.handler.try_recv() {
                Ok(s) => return Ok(Some(s)),
                Err(flume::TryRecvError::Disconnected) => return Err(RecvError::Closed),
                Err(flume::TryRecvError::Empty) if t.elapsed() < spin => std::hint::spin_loop(),
                Err(flume::TryRecvError::Empty) => return Ok(None),
            }
        }
    }

    /// The next sample if one is queued.
    pub fn try_recv(&self) -> Option<GpuSample> {
        self.handler.try_recv().ok()
    }

    /// Waits for the next sample, asynchronously.
    pub async fn recv_async(&self) -> Result<GpuSample, RecvError> {
        self.handler.recv_async().await.map_err(|_| RecvError::Closed)
    }
}
