//! The subscriber side of the transport, one job per file:
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the subscriber's declaration (`SubscriberCore`), what its threads share, counters, close |
//! | `discovery.rs` | publishers' tokens appearing and vanishing; the plain key; dead publishers' processes watched |
//! | `handshake.rs` | `Hello` → probe → `Ack` → `Ready` with one publisher, which makes its `Link` |
//! | `link.rs` | `Link`: the connection to one publisher, and its thread receiving what it routes |
//! | `import.rs` | `ImportCache`: descriptors verified, blocks imported and cached per link |
//! | `ready.rs` | `PublisherSignals`: a publisher's ready signals as our reads wait on them; a dead one's written by us |
//! | `order.rs` | `Order`: bytes merged with routed messages in sequence order, per publisher |
//! | `dedup.rs` | `Dedup`: each message delivered once, losses counted |
//! | `delivery.rs` | `Delivery`: a received message, read in place, as host bytes or copied |
//! | `release.rs` | `Releases`: what a delivery holds of its subscriber (the releaser, the copier) |
//! | `spin.rs` | adaptive busy-polling: how long a waiting thread polls before it sleeps |
//! | `peer_copy.rs` | copies onto our GPU: another GPU's messages (`peer_gpus: copy`) and host blocks on arrival, bytes samples when read |
//!
//! A receive, in order: `link.rs` (a frame) → `import.rs` (the block) → `order.rs`
//! (its turn) → `dedup.rs` (once) → the subscriber's callback.
mod dedup;
mod delivery;
mod discovery;
mod handshake;
mod import;
mod link;
mod order;
mod peer_copy;
pub mod queue;
mod ready;
mod release;
pub mod spin;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zenoh::Wait;
use zenoh::key_expr::KeyExpr;
use zenoh::sample::SampleKind;

use super::RateLimitedWarn;
use super::locality::PeerView;
use super::publisher::DeclareError;
use crate::config::{PeerGpus, PlainListen};
use crate::cuda::Gpu;
use crate::pool::recycler::Recycler;
use crate::protocol::{self, Group, Request, Role, Token};
use crate::sync::Unpoisoned;
pub use delivery::{Delivery, DeviceRead, ForeignBlock, ReadError};

use dedup::Dedup;
use discovery::{publisher_appeared, publisher_vanished};
use link::Link;
use order::{Order, on_bytes};
pub(crate) use peer_copy::{PeerCopier, PeerCopy, Upload};
use ready::ReleaseStream;
use release::Releases;
use spin::{QueueEnd, SpinWindow, recv_queue};

/// Counters of one subscriber. All monotonic.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SubscriberStats {
    /// Samples delivered on the zero-copy path (the block read in place, on this GPU or
    /// over the link from another).
    pub zero_copy: u64,
    /// Samples from a publisher on another GPU copied onto this subscriber's GPU as they
    /// arrived (`peer_gpus: copy`).
    pub peer_copy: u64,
    /// Samples read in place from host blocks: the publisher's GPU block copied once into
    /// shared host memory for this host's subscribers without CUDA.
    pub host_block: u64,
    /// Samples delivered as inline bytes.
    pub inline: u64,
    /// Samples delivered as bytes copied out of a block.
    pub cpu_bytes: u64,
    /// Samples delivered from plain (non-zcs) publishers.
    pub plain: u64,
    /// Messages dropped because the same sequence number was already delivered.
    pub duplicates: u64,
    /// Frames from a publisher's control connection dropped: malformed, future
    /// version, bad capability, out of bounds (the link is closed after a malformed one).
    pub bad_descriptors: u64,
    /// Bytes on our channel dropped: no or malformed header, or a forged tag.
    pub bad_bytes: u64,
    /// Block FDs received and imported (cache misses).
    pub imports: u64,
    /// Imports that failed (the message is lost for this subscriber and counted).
    pub import_failures: u64,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes that failed (the publisher keeps serving bytes).
    pub handshake_failures: u64,
    /// Publishers whose cache was evicted after their token vanished.
    pub evictions: u64,
    /// Leases released back to publishers.
    pub releases: u64,
    /// Messages whose bytes (sent through Zenoh before the zero-copy link was ready)
    /// arrived after the link had delivered later messages of their publisher:
    /// delivered then, out of order, so that each message still arrives once.
    pub late_bytes: u64,
    /// Messages missing: gaps in a publisher's sequence numbers after the first message
    /// delivered from it, less gaps a late message filled (a gap counts at most 4096: a
    /// forged bytes header cannot inflate it further). Zenoh drops under congestion
    /// show here once a later message of the publisher is delivered, or, at the end
    /// of its stream, once its end notice comes (when it is dropped); bytes announced
    /// by `ViaBytes` that never came and failed imports as soon as they are given up.
    pub lost: u64,
    /// Time this subscriber's threads spent busy-polling for messages, in µs: what
    /// `spin_us` cost in CPU time (each polling thread keeps one core busy).
    pub polled_us: u64,
    /// Samples dropped, oldest first, by the subscriber's full queue (its FIFO never
    /// waits for the application: that would hold up a Zenoh thread or the publisher).
    pub dropped_queue_full: u64,
}

#[derive(Default)]
struct Counters {
    zero_copy: AtomicU64,
    peer_copy: AtomicU64,
    host_block: AtomicU64,
    inline: AtomicU64,
    cpu_bytes: AtomicU64,
    plain: AtomicU64,
    bad_descriptors: AtomicU64,
    bad_bytes: AtomicU64,
    imports: AtomicU64,
    import_failures: AtomicU64,
    handshakes: AtomicU64,
    handshake_failures: AtomicU64,
    evictions: AtomicU64,
    late_bytes: AtomicU64,
    polled_ns: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Shared {
    /// Adds a wait's polling to `polled_us`.
    fn count_polled(&self, polled: Duration) {
        spin::count_polled(&self.counters.polled_ns, polled);
    }
}

/// What a subscriber maps blocks into.
#[derive(Clone)]
pub enum SubMedium {
    /// Device memory of this GPU.
    Cuda(Gpu),
    /// Host memory only (no GPU).
    Host,
}

struct PubEntry {
    link: Option<Arc<Link>>,
    order: Arc<Order>,
    /// Why there is no zero-copy link (another group, a failed handshake), if known.
    why: Option<String>,
}

impl PubEntry {
    /// On the zero-copy path: its link is up.
    fn live(&self) -> bool {
        self.link.as_ref().is_some_and(|l| l.alive.load(Ordering::Relaxed))
    }

    /// Why it serves bytes (`None` while zero-copy).
    fn bytes_reason(&self) -> Option<String> {
        match (self.live(), &self.why) {
            (true, _) => None,
            (false, Some(why)) => Some(why.clone()),
            (false, None) => Some("handshake in progress".to_owned()),
        }
    }
}

#[derive(Default)]
struct State {
    /// Publishers of ours whose key meets ours, by instance.
    pubs: HashMap<u64, PubEntry>,
}

pub(crate) type Deliver = Box<dyn Fn(Delivery) + Send + Sync>;

/// What a subscriber's threads share.
pub(crate) struct Shared {
    key: String,
    instance: u64,
    group: Group,
    medium: SubMedium,
    state: Mutex<State>,
    counters: Counters,
    /// Exactly-once per publisher, and losses.
    dedup: Dedup,
    /// Taken on close: nothing is delivered after it.
    deliver: Mutex<Option<Arc<Deliver>>>,
    /// What samples hold of this subscriber: the releaser and the copier.
    releases: Arc<Releases>,
    handshake_timeout: Duration,
    /// The most a waiting thread polls before it sleeps (`spin_us`): each link thread
    /// adapts its own window up to it.
    spin_max: Duration,
    /// The polling window of `recv` on the subscriber's FIFO queue.
    queue_spin: SpinWindow,
    bad_input: RateLimitedWarn,
    plain_listen: PlainListen,
    plain_sub: Mutex<Option<zenoh::pubsub::Subscriber<()>>>,
    session: zenoh::Session,
    closed: AtomicBool,
    /// Host providers reached by this session (lent blocks are opened there).
    providers: Arc<crate::provider::Providers>,
    /// Samples the handler's queue dropped (counted by the handler).
    queue_drops: Arc<AtomicU64>,
    /// What this process sees of the host's GPUs (CUDA subscribers): decides whether
    /// a publisher on another GPU is read in place.
    peer: Option<PeerView>,
    /// Host-memory subscribers: whether GPU publishers of this host serve us host
    /// blocks (`host_blocks`).
    host_blocks: bool,
    /// For writing a dead publisher's ready signals (CUDA). Created with the subscriber,
    /// not when needed: creating a stream blocks while another of our streams waits on
    /// a signal that never comes (measured on an H200, driver 580), which is exactly
    /// when it is needed; and not per link, to keep it out of every handshake.
    release_stream: ReleaseStream,
}

/// A subscriber of our channels on one key: its token, its bytes subscription, the
/// watch of publishers and their links.
pub struct SubscriberCore {
    shared: Arc<Shared>,
    _recycler: Recycler,
    _token: zenoh::liveliness::LivelinessToken,
    _bytes: zenoh::pubsub::Subscriber<()>,
    _pubs: zenoh::pubsub::Subscriber<()>,
}

/// What a subscriber is declared with; the API layer fills it from the session's
/// configuration.
pub struct SubscriberSpec {
    /// The key expression it subscribes to.
    pub key: String,
    /// Where it maps blocks (host and device).
    pub group: Group,
    /// What it maps blocks into.
    pub medium: SubMedium,
    /// When it also listens on the plain key.
    pub plain_listen: PlainListen,
    /// How long a handshake step waits for the publisher.
    pub handshake_timeout: Duration,
    /// The most a waiting thread polls before it sleeps (`spin_us`).
    pub spin: Duration,
    /// Host providers reached by the session (lent blocks are opened there).
    pub providers: Arc<crate::provider::Providers>,
    /// What this process sees of the host's GPUs (CUDA subscribers).
    pub peer: Option<PeerView>,
    /// Host-memory subscribers: whether GPU publishers of this host serve it host
    /// blocks.
    pub host_blocks: bool,
    /// Samples its handler's queue dropped rather than make a Zenoh thread wait
    /// ([`SubscriberStats::dropped_queue_full`]; the handler counts them here).
    pub queue_drops: Arc<AtomicU64>,
}

impl SubscriberCore {
    /// Declares a subscriber; every sample received goes to `deliver`.
    pub fn new(session: &zenoh::Session, spec: SubscriberSpec, deliver: Deliver) -> Result<Self, DeclareError> {
        let SubscriberSpec {
            key,
            group,
            medium,
            plain_listen,
            handshake_timeout,
            spin,
            providers,
            peer,
            host_blocks,
            queue_drops,
        } = spec;
        let key = key.as_str();
        let ke = KeyExpr::try_from(key.to_owned()).map_err(|source| DeclareError::Key { key: key.into(), source })?;
        crate::step!("subscriber: declaring");
        let instance = rand::random::<u64>() | 1;
        // What is not needed to see the publishers already there and start handshaking
        // with them comes after: their handshakes run meanwhile, on their link threads.
        let (mut recycler, releaser) = Recycler::prepare(Duration::from_secs(3600));
        let gpu = match &medium {
            SubMedium::Cuda(gpu) => Some(gpu.clone()),
            SubMedium::Host => None,
        };
        let copier = match (&gpu, peer.as_ref().map(|p| p.mode)) {
            (Some(gpu), Some(PeerGpus::Copy)) => Some(PeerCopier::new(gpu).map_err(crate::signal::SignalError::from)?),
            _ => None,
        };
        let shared = Arc::new(Shared {
            key: key.to_owned(),
            instance,
            group: group.clone(),
            medium,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            dedup: Dedup::default(),
            deliver: Mutex::new(Some(Arc::new(deliver))),
            releases: Arc::new(Releases::new(releaser, gpu, copier)),
            handshake_timeout,
            spin_max: spin,
            queue_spin: SpinWindow::new(spin),
            bad_input: RateLimitedWarn::new(Duration::from_secs(5)),
            plain_listen,
            plain_sub: Mutex::new(None),
            session: session.clone(),
            closed: AtomicBool::new(false),
            providers,
            queue_drops,
            peer,
            host_blocks,
            release_stream: ReleaseStream::default(),
        });
        let s = Arc::clone(&shared);
        let pubs = super::watch_tokens(session, Role::Pub, ke.clone(), move |kind, t| match kind {
            SampleKind::Put => publisher_appeared(&s, t),
            SampleKind::Delete => publisher_vanished(&s, t.instance),
        })
        .map_err(DeclareError::Zenoh)?;
        let mut rest = || -> Result<_, DeclareError> {
            // The bytes subscription goes before the token: declarations travel in order
            // on a link, so a publisher that learns of this subscriber from its token and
            // puts bytes for it at once finds the subscription there. (With the token
            // first, about one first message in a hundred went to a subscription its
            // publisher's session did not know yet, and was lost.) Bytes that match it
            // before the token has arrived are a publisher's bytes for others: taken
            // like any bytes of a publisher this subscriber does not know yet. A
            // handshake may finish before the publisher sees the token; it then knows
            // the subscriber as linked.
            let s = Arc::clone(&shared);
            let bytes = session
                .declare_subscriber(protocol::bytes_key(key))
                .callback(move |sample| on_bytes(&s, &sample, false))
                .wait()
                .map_err(DeclareError::Zenoh)?;
            let token = Token { role: Role::Sub, key: key.to_owned(), instance, group: group.clone(), socket: None };
            let token = session.liveliness().declare_token(token.to_key()).wait().map_err(DeclareError::Zenoh)?;
            shared.refresh_plain();
            recycler.start_thread()?;
            if let SubMedium::Cuda(gpu) = &shared.medium {
                let stream = gpu.new_stream().map_err(crate::signal::SignalError::from)?;
                let _ = shared.release_stream.set(stream);
            }
            Ok((token, bytes))
        };
        let (token, bytes) = match rest() {
            Ok(x) => x,
            Err(e) => {
                drop(pubs);
                shared.close();
                return Err(e);
            }
        };
        crate::step!("subscriber: declared");
        Ok(Self { shared, _recycler: recycler, _token: token, _bytes: bytes, _pubs: pubs })
    }

    /// Receives from the subscriber's FIFO queue `rx` within `within` (`Duration::MAX`:
    /// no limit), polling first while samples have been coming within `spin_us`.
    pub fn recv_queue<T>(&self, rx: &flume::Receiver<T>, within: Duration) -> Result<T, QueueEnd> {
        let (got, polled) = recv_queue(rx, &self.shared.queue_spin, within);
        self.shared.count_polled(polled);
        got
    }

    /// A sample of this subscriber carrying `block`, a block of another transport mapped
    /// on this subscriber's GPU (the ROS 2 layer's CUDA buffer backend imports): read
    /// like a zero-copy sample, and `block` dropped once the sample and every read of it
    /// are done. `None` for a host-memory subscriber.
    pub fn foreign_sample(&self, info: crate::sample::SampleInfo, block: Box<dyn ForeignBlock>) -> Option<Delivery> {
        self.shared.foreign(info, block)
    }

    /// Counters of this subscriber.
    pub fn stats(&self) -> SubscriberStats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SubscriberStats {
            zero_copy: l(&c.zero_copy),
            peer_copy: l(&c.peer_copy),
            host_block: l(&c.host_block),
            inline: l(&c.inline),
            cpu_bytes: l(&c.cpu_bytes),
            plain: l(&c.plain),
            duplicates: self.shared.dedup.duplicates(),
            bad_descriptors: l(&c.bad_descriptors),
            bad_bytes: l(&c.bad_bytes),
            imports: l(&c.imports),
            import_failures: l(&c.import_failures),
            handshakes: l(&c.handshakes),
            handshake_failures: l(&c.handshake_failures),
            evictions: l(&c.evictions),
            releases: self.shared.releases.released(),
            late_bytes: l(&c.late_bytes),
            lost: self.shared.dedup.lost(),
            polled_us: l(&c.polled_ns) / 1000,
            dropped_queue_full: l(&self.shared.queue_drops),
        }
    }

    /// Publishers of ours this subscriber knows, and whether each is on the zero-copy
    /// path.
    pub fn publishers(&self) -> Vec<(u64, bool)> {
        let st = self.shared.state.locked();
        st.pubs.iter().map(|(i, e)| (*i, e.live())).collect()
    }

    /// Why `publisher` serves this subscriber bytes rather than its blocks; `None` while
    /// it is on the zero-copy path, or for a publisher this subscriber does not know.
    pub fn bytes_reason(&self, publisher: u64) -> Option<String> {
        let st = self.shared.state.locked();
        st.pubs.get(&publisher).and_then(PubEntry::bytes_reason)
    }

    /// Reports this subscriber while it exists (the session sends such reports to its
    /// provider); `None` once it is gone.
    pub fn reporter(&self) -> impl Fn() -> Option<protocol::SubscriberReport> + Send + Sync + 'static {
        let shared = Arc::downgrade(&self.shared);
        move || {
            let sh = shared.upgrade()?;
            let publishers = {
                let st = sh.state.locked();
                st.pubs
                    .iter()
                    .map(|(i, e)| protocol::PathReport {
                        peer: *i,
                        path: match &e.link {
                            Some(l) if e.live() && l.host_blocks && sh.group.is_host() => "host-block",
                            Some(l) if e.live() && l.host_blocks => "host-copy",
                            Some(l) if e.live() && l.peer && sh.copies_from_peers() => "peer-copy",
                            Some(l) if e.live() && l.peer => "zero-copy-peer",
                            _ if e.live() => "zero-copy",
                            _ => "bytes",
                        }
                        .to_owned(),
                        reason: e.bytes_reason().map(|why| why.chars().take(200).collect()),
                    })
                    .collect()
            };
            let c = &sh.counters;
            let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
            Some(protocol::SubscriberReport {
                key: sh.key.clone(),
                instance: sh.instance,
                device: sh.group.device.clone(),
                publishers,
                // The report's format predates `peer-copy` and `host-block`: such samples,
                // which came over the link as well, count with those read in place.
                zero_copy: l(&c.zero_copy) + l(&c.peer_copy) + l(&c.host_block),
                cpu_bytes: l(&c.cpu_bytes),
                bad_descriptors: l(&c.bad_descriptors),
                import_failures: l(&c.import_failures),
                lost: sh.dedup.lost(),
            })
        }
    }

    /// The key expression it subscribes to.
    pub fn key(&self) -> &str {
        &self.shared.key
    }
}

impl Drop for SubscriberCore {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl Shared {
    /// Returns at once. Each link thread sees `closed`, releases what is still routed
    /// to it until the publisher's `Left` (or within `LEAVE_WAIT`), and exits; samples
    /// the application still holds keep their leases until dropped.
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.plain_sub.locked().take();
        self.deliver.locked().take();
        let links: Vec<Arc<Link>> = {
            let st = self.state.locked();
            st.pubs.values().filter_map(|e| e.link.clone()).collect()
        };
        for link in links {
            if let Err(e) = link.conn.send(&protocol::encode(&Request::Leave), &[]) {
                tracing::debug!(error = %crate::error::Chain(&e), "leave not sent (publisher gone?)");
            }
        }
        // Wake link threads waiting for bytes, and drop bytes still waiting for their
        // turn (each holds this subscriber's shared state).
        let orders: Vec<Arc<Order>> = {
            let st = self.state.locked();
            st.pubs.values().map(|e| Arc::clone(&e.order)).collect()
        };
        for order in orders {
            order.lock().inbox.clear();
            order.cv.notify_all();
        }
    }

    fn deliver(&self, sample: Delivery) {
        let d = self.deliver.locked().clone();
        if let Some(d) = d {
            d(sample);
        }
    }

    /// Whether this subscriber copies messages from peer GPUs' blocks on arrival.
    pub(super) fn copies_from_peers(&self) -> bool {
        self.peer.as_ref().is_some_and(|p| p.mode == PeerGpus::Copy)
    }

    /// Whether the publisher of group `theirs` serves this subscriber host blocks.
    fn via_host(&self, theirs: &Group) -> bool {
        super::locality::decide(&self.group, theirs, self.peer.as_ref(), self.host_blocks)
            == super::locality::Locality::HostBlock
    }

    /// A sample of this subscriber whose data is `block`, a block of another transport
    /// mapped on this subscriber's GPU; `None` (and `block` dropped) for a host-memory
    /// subscriber, which cannot read device memory in place.
    fn foreign(&self, info: crate::sample::SampleInfo, block: Box<dyn ForeignBlock>) -> Option<Delivery> {
        matches!(self.medium, SubMedium::Cuda(_)).then(|| {
            self.sample(info, delivery::Body::Foreign(delivery::Foreign::new(block, Arc::clone(&self.releases))))
        })
    }

    /// A sample of this subscriber.
    fn sample(&self, info: crate::sample::SampleInfo, body: delivery::Body) -> Delivery {
        Delivery::new(info, body, self.medium.clone(), Arc::clone(&self.releases))
    }
}
