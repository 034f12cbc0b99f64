//! Subscribers: a FIFO or a callback handler, receiving, and what is known of each
//! publisher's path.

use std::future::{IntoFuture, Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::PeerGpus;
use crate::cuda::Topology;
use crate::sample::{ForeignBlock, GpuSample, Path, SampleInfo};
use crate::transport::locality::PeerView;
use crate::transport::publisher::DeclareError;
use crate::transport::subscriber::spin::QueueEnd;
use crate::transport::subscriber::{SubMedium, SubscriberCore, SubscriberSpec, SubscriberStats};

use super::*;

/// Handler: a FIFO channel of the given capacity. When it is full, a new sample takes
/// the place of the oldest one queued, which is dropped (its block goes back to its
/// publisher) and counted in [`SubscriberStats::dropped_queue_full`]. Delivery never
/// waits for the application: waiting in a Zenoh callback would hold up every other key
/// of the session's link, and waiting on a zero-copy link would hold up the publisher
/// and with it every other subscriber it serves.
#[derive(Debug, Clone, Copy)]
pub struct Fifo(pub usize);

/// Handler: a callback run for every sample (keep it short: it runs on Zenoh's
/// receive thread).
pub struct Callback(Box<dyn Fn(GpuSample) + Send + Sync>);

/// Builder returned by [`GpuSession::declare_subscriber`].
#[must_use = "resolve with .wait() or .await"]
pub struct SubscriberBuilder<H> {
    pub(super) session: GpuSession,
    pub(super) key: String,
    pub(super) handler: H,
    /// This subscriber's choice for publishers on other GPUs (the session's otherwise).
    pub(super) peer_gpus: Option<PeerGpus>,
}

impl<H> SubscriberBuilder<H> {
    /// Delivers samples to `f`, on the library's threads; calls may overlap (samples of
    /// different publishers arrive on different threads). `f` may drop its own
    /// subscriber; no call starts after the drop.
    pub fn callback(self, f: impl Fn(GpuSample) + Send + Sync + 'static) -> SubscriberBuilder<Callback> {
        SubscriberBuilder {
            session: self.session,
            key: self.key,
            handler: Callback(Box::new(f)),
            peer_gpus: self.peer_gpus,
        }
    }

    /// Delivers samples through a FIFO channel of `capacity`.
    pub fn fifo(self, capacity: usize) -> SubscriberBuilder<Fifo> {
        SubscriberBuilder {
            session: self.session,
            key: self.key,
            handler: Fifo(capacity.max(1)),
            peer_gpus: self.peer_gpus,
        }
    }

    /// How this subscriber reads from publishers on another GPU of this host, in place of
    /// the session's `peer_gpus`: [`PeerGpus::Copy`] for data read many times or held
    /// long (one copy onto this GPU on arrival, the publisher's lease released once it
    /// completes), [`PeerGpus::InPlace`] to read over the link, [`PeerGpus::Off`] for bytes.
    pub fn peer_gpus(mut self, mode: PeerGpus) -> Self {
        self.peer_gpus = Some(mode);
        self
    }

    /// The subscriber's core; its handler counts in `queue_drops` what its queue drops.
    fn core(
        &self,
        queue_drops: Arc<AtomicU64>,
        deliver: Box<dyn Fn(GpuSample) + Send + Sync>,
    ) -> Result<SubscriberCore, DeclareError> {
        let s = &self.session.0;
        let medium = match &s.gpu {
            Some(g) => SubMedium::Cuda(g.clone()),
            None => SubMedium::Host,
        };
        // What this process sees of the host's GPUs, for publishers on other GPUs.
        let peer = s.gpu.as_ref().and_then(|g| match Topology::probe() {
            Ok(topology) => Some(PeerView { ordinal: g.ordinal(), topology, mode: self.peer_gpus.unwrap_or(s.cfg.peer_gpus) }),
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "cannot query the host's GPUs; publishers on other GPUs send bytes");
                None
            }
        });
        let spec = SubscriberSpec {
            key: self.key.clone(),
            group: s.group.clone(),
            medium,
            plain_listen: s.cfg.plain_listen,
            handshake_timeout: Duration::from_millis(s.cfg.handshake_timeout_ms),
            spin: Duration::from_micros(s.cfg.spin_us),
            providers: Arc::clone(&s.providers),
            peer,
            host_blocks: s.cfg.host_blocks,
            queue_drops,
        };
        let core = SubscriberCore::new(&s.zenoh, spec, Box::new(move |d| deliver(GpuSample::new(d))))?;
        let report = core.reporter();
        self.session.report(Box::new(move |out| report().map(|s| out.subscribers.push(s)).is_some()));
        Ok(core)
    }
}

impl SubscriberBuilder<Fifo> {
    /// Declares the subscriber (blocking).
    ///
    /// # Errors
    /// [`DeclareError::Key`] for an invalid key expression; [`DeclareError::Zenoh`] when
    /// a Zenoh declaration (subscriber, liveliness token or query) fails;
    /// [`DeclareError::Io`] when a delivery thread cannot be started.
    pub fn wait(self) -> Result<GpuSubscriber<flume::Receiver<GpuSample>>, DeclareError> {
        let (tx, rx) = flume::bounded(self.handler.0);
        let (oldest, drops) = (rx.clone(), Arc::new(AtomicU64::new(0)));
        let counted = Arc::clone(&drops);
        let key = self.key.clone();
        let core = self.core(drops, Box::new(move |s| {
            let dropped = crate::transport::subscriber::queue::push_dropping_oldest(&tx, &oldest, s);
            if dropped > 0 && counted.fetch_add(dropped, Ordering::Relaxed) == 0 {
                tracing::warn!(%key, "a subscriber's queue is full: its oldest samples are dropped (SubscriberStats::dropped_queue_full); the application reads slower than they come");
            }
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
    ///
    /// # Errors
    /// [`DeclareError::Key`] for an invalid key expression; [`DeclareError::Zenoh`] when
    /// a Zenoh declaration (subscriber, liveliness token or query) fails;
    /// [`DeclareError::Io`] when a delivery thread cannot be started.
    pub fn wait(mut self) -> Result<GpuSubscriber<()>, DeclareError> {
        let f = std::mem::replace(&mut self.handler.0, Box::new(|_| {}));
        let core = self.core(Arc::new(AtomicU64::new(0)), f)?;
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
///
/// Declared with [`GpuSession::declare_subscriber`]: with a FIFO (the default) it is
/// read with [`recv`](GpuSubscriber::recv), [`recv_timeout`](GpuSubscriber::recv_timeout),
/// [`try_recv`](GpuSubscriber::try_recv) or [`recv_async`](GpuSubscriber::recv_async);
/// with a [`callback`](SubscriberBuilder::callback) the samples go to the callback.
///
/// ```
/// use std::time::Duration;
/// use zenoh_cuda_shm::config::DeviceChoice;
/// use zenoh_cuda_shm::{GpuSession, ZcsConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let mut zenoh = zenoh::Config::default();
/// # zenoh.insert_json5("scouting/multicast/enabled", "false")?;
/// let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
/// let session = GpuSession::open(zenoh, cfg).wait()?;
/// let subscriber = session.declare_subscriber("doc/subscriber/**").wait()?;
/// let publisher = session.declare_publisher("doc/subscriber/a").wait()?;
/// publisher.put_bytes(b"hello")?;
///
/// let sample = subscriber.recv_timeout(Duration::from_secs(5))?;
/// assert_eq!(sample.host_bytes().as_deref(), Some(&b"hello"[..]));
/// if let Some(why) = subscriber.path_reason(sample.info()) {
///     println!("{} path: {why}", sample.path());
/// }
/// # Ok(()) }
/// ```
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
            Path::CpuBytes => self.bytes_reason(info.publisher).or_else(|| info.path.reason().map(str::to_owned)),
            path => path.reason().map(str::to_owned),
        }
    }

    /// A sample of this subscriber whose data is `block`, a block of another transport
    /// mapped on this subscriber's GPU (how the ROS 2 layer delivers buffers of ROS 2's
    /// CUDA buffer backend): read in place like a zero-copy sample, `block` dropped once
    /// the sample and every read of it are done. `None` (and `block` dropped) for a
    /// host-memory subscriber.
    pub fn foreign_sample(&self, info: SampleInfo, block: Box<dyn ForeignBlock>) -> Option<GpuSample> {
        self.core.foreign_sample(info, block).map(GpuSample::new)
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

impl From<QueueEnd> for RecvError {
    fn from(e: QueueEnd) -> Self {
        match e {
            QueueEnd::Timeout => RecvError::Timeout,
            QueueEnd::Closed => RecvError::Closed,
        }
    }
}

impl GpuSubscriber<flume::Receiver<GpuSample>> {
    /// Waits for the next sample (polling first while samples have been coming within
    /// `spin_us`).
    ///
    /// # Errors
    /// [`RecvError::Closed`] once the subscriber's channel is closed (undeclared).
    pub fn recv(&self) -> Result<GpuSample, RecvError> {
        self.core.recv_queue(&self.handler, Duration::MAX).map_err(RecvError::from)
    }

    /// Waits up to `timeout` for the next sample (polling first, within `timeout`,
    /// while samples have been coming within `spin_us`).
    ///
    /// # Errors
    /// [`RecvError::Timeout`] when no sample came within `timeout`;
    /// [`RecvError::Closed`] once the subscriber's channel is closed.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<GpuSample, RecvError> {
        self.core.recv_queue(&self.handler, timeout).map_err(RecvError::from)
    }

    /// The next sample if one is queued.
    pub fn try_recv(&self) -> Option<GpuSample> {
        self.handler.try_recv().ok()
    }

    /// Waits for the next sample, asynchronously.
    ///
    /// # Errors
    /// [`RecvError::Closed`] once the subscriber's channel is closed.
    pub async fn recv_async(&self) -> Result<GpuSample, RecvError> {
        self.handler.recv_async().await.map_err(|_| RecvError::Closed)
    }
}
