//! The subscriber side: its liveliness token, the publishers it knows of, the
//! handshake, link thread and import cache per publisher, delivery order across the
//! two ways a message can arrive, deduplication, and releases.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zenoh::Wait;
use zenoh::key_expr::KeyExpr;
use zenoh::sample::{Sample, SampleKind};

use super::RateLimitedWarn;
use super::medium::{Imported, Mapped, Opened};
use crate::config::PlainListen;
use crate::cuda::{Gpu, ImportedBlock};
use crate::host::HostBlock;
use crate::ipc::{ConnectError, ControlConn, Frame, RecvError, SocketName};
use crate::pool::recycler::{Job, Recycler, RecyclerHandle};
use crate::pool::{BlockKey, CapabilityKey, Fence};
use crate::protocol::{self, BytesHeader, Descriptor, Group, Reply, Request, Role, Token};
use crate::sample::{Body, GpuSample, Path, SampleInfo, ZeroCopy};
use crate::signal::ReadySignals;

/// Counters of one subscriber. All monotonic.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SubscriberStats {
    /// Samples delivered on the zero-copy path.
    pub zero_copy: u64,
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
    /// forged bytes header cannot inflate it further). Bytes announced by `ViaBytes`
    /// that never came, Zenoh drops under congestion, failed imports: each shows here
    /// once a later message of the publisher is delivered.
    pub lost: u64,
}

#[derive(Default)]
struct Counters {
    zero_copy: AtomicU64,
    inline: AtomicU64,
    cpu_bytes: AtomicU64,
    plain: AtomicU64,
    duplicates: AtomicU64,
    bad_descriptors: AtomicU64,
    bad_bytes: AtomicU64,
    imports: AtomicU64,
    import_failures: AtomicU64,
    handshakes: AtomicU64,
    handshake_failures: AtomicU64,
    evictions: AtomicU64,
    releases: AtomicU64,
    late_bytes: AtomicU64,
    lost: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What a subscriber maps blocks into.
#[derive(Clone)]
pub(crate) enum SubMedium {
    Cuda(Gpu),
    Host,
}

/// A handshaken connection to one publisher, and the blocks imported from it. Its
/// link thread alone receives on the connection; sends are atomic frames and may come
/// from any thread (releases, `Leave`).
pub(crate) struct Link {
    conn: ControlConn,
    /// The publisher's instance id.
    publisher: u64,
    /// The first message routed over this link (`Reply::Ready`).
    first_seq: u64,
    /// Its publisher's delivery order (shared with the publisher's entry).
    order: Arc<Order>,
    cap_key: CapabilityKey,
    pub(crate) signals: Option<Arc<ReadySignals>>,
    /// Imported blocks by id, with the allocation serial they were imported for. A new
    /// serial for an id means the publisher trimmed the old block: the entry is
    /// replaced, which unmaps the old import once no sample reads it any more.
    cache: Mutex<HashMap<u32, (u64, Imported)>>,
    alive: AtomicBool,
    /// The publisher's liveliness token vanished while this link was open: the Zenoh
    /// route between us is down (a router between us died), not the publisher, which
    /// keeps serving us here. Cleared when the token comes back; if the link ends
    /// first, its end forgets the publisher (`link_thread`).
    token_gone: AtomicBool,
    /// The publisher process (0 when in another PID namespace: unknown).
    peer_pid: i32,
    /// Highest generation handed to samples, per ready-signal slot (CUDA only): what
    /// our streams may be waiting for.
    awaited: Mutex<HashMap<u32, u64>>,
    /// Block generations whose ready signal never came because the publisher died
    /// first: reads of them are refused (`ReadError::PublisherDied`).
    unready: Mutex<std::collections::HashSet<(u32, u64)>>,
    /// The subscriber's stream for writing a dead publisher's signals
    /// (`Shared::release_stream`).
    release_stream: ReleaseStream,
    /// The host provider the publisher's lent blocks are opened at.
    provider: Option<Arc<crate::provider::ProviderClient>>,
}

impl Link {
    /// Whether the publisher died before signalling this block generation ready.
    pub(crate) fn died_unready(&self, key: BlockKey) -> bool {
        self.unready.lock().unwrap_or_else(|p| p.into_inner()).contains(&(key.id, key.generation))
    }

    /// The publisher process has exited: any ready signal it had not yet written never
    /// will be, and a stream of ours waiting on one would wait forever. Write the awaited
    /// values ourselves (the signal block is mapped here read-write; nobody else writes
    /// it any more) and remember which generations were not ready.
    fn release_waiters_of_dead_publisher(&self) {
        let Some(signals) = &self.signals else { return };
        let awaited: Vec<(u32, u64)> =
            self.awaited.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(s, g)| (*s, *g)).collect();
        // Created by the subscriber's declaration, unless this comes first.
        let stream = match self.release_stream.get() {
            Some(s) => s.clone(),
            None => match signals.gpu().new_stream() {
                Ok(s) => self.release_stream.get_or_init(|| s).clone(),
                Err(e) => {
                    return tracing::error!(error = %e, "no stream to release waits on a dead publisher's signals");
                }
            },
        };
        let mut unready = 0;
        for (slot, generation) in awaited {
            match signals.read_slot_on(slot, &stream) {
                Ok(v) if v >= generation => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, slot, "cannot read a dead publisher's signal slot"),
            }
            unready += 1;
            self.unready.lock().unwrap_or_else(|p| p.into_inner()).insert((slot, generation));
            if let Err(e) = signals.signal(&stream, slot, generation) {
                tracing::error!(error = %e, slot, "cannot release a wait on a dead publisher's signal");
            }
        }
        if unready > 0 {
            tracing::warn!(
                unready,
                "publisher died before signalling blocks ready; their readers were released and reads of them are refused"
            );
        }
    }

    /// Sends a release, also on a link that ended: a publisher that disconnected us as
    /// slow still reads them (it keeps our leases until we release them or close);
    /// one that died or closed does not, and the send fails harmlessly.
    pub(crate) fn release(&self, key: BlockKey) {
        let msg = protocol::encode(&Request::Release { blocks: vec![key] });
        if let Err(e) = self.conn.send(&msg, &[]) {
            tracing::debug!(error = %e, "release not sent (publisher gone?)");
        }
    }

    /// Asks for a block's FD. Routed frames that arrive before the answer are kept in
    /// `backlog`, in order, for the link thread.
    fn request_fd(
        &self,
        backlog: &mut VecDeque<Frame>,
        key: BlockKey,
        capability: u64,
    ) -> Result<(OwnedFd, usize), String> {
        let conn = &self.conn;
        conn.send(&protocol::encode(&Request::Fd { block: key, capability }), &[]).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + FD_REPLY_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut frame = conn.recv(left).map_err(|e| e.to_string())?;
            match protocol::decode::<Reply>("control reply", &frame.bytes) {
                Ok(Reply::Fd { block, size }) if block == key && frame.fds.len() == 1 => {
                    return Ok((frame.fds.pop().expect("one fd"), usize::try_from(size).map_err(|e| e.to_string())?));
                }
                Ok(Reply::FdDenied { reason, .. }) => return Err(format!("denied: {reason}")),
                Ok(Reply::Fd { .. }) => return Err("FD reply for another block, or without its FD".into()),
                // Routed frames (and anything malformed, reported in turn) wait.
                _ => backlog.push_back(frame),
            }
        }
    }
}

/// How long an FD request waits for its answer.
const FD_REPLY_WAIT: Duration = Duration::from_secs(5);
/// How long the first message routed over a new link waits for the bytes sent through
/// Zenoh just before it (Zenoh keeps their order, so they are near).
const SWITCH_WAIT: Duration = Duration::from_millis(500);
/// How long a `ViaBytes` message waits for its bytes through Zenoh.
const VIA_BYTES_WAIT: Duration = Duration::from_secs(1);
/// Bytes kept for messages routed `ViaBytes` whose notice has not come yet.
const INBOX_LIMIT: usize = 256;

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

/// Keeps one publisher's messages in order across the two ways they arrive: bytes
/// through Zenoh, and the routed frames of its link (descriptors, inline messages,
/// `ViaBytes` notices), which are in sequence order on the connection.
///
/// Before a link is ready every message comes as bytes and is delivered as it
/// arrives. From `Reply::Ready { first_seq }` on, the link thread delivers everything:
/// its first delivery waits for the bytes sent just before `first_seq` (if this
/// subscriber was receiving bytes), and bytes of later messages wait in `inbox` until
/// their `ViaBytes` notice comes.
#[derive(Default)]
struct Order {
    m: Mutex<OrderState>,
    cv: Condvar,
}

#[derive(Default)]
struct OrderState {
    /// The ready link's first routed message.
    first_seq: Option<u64>,
    /// Bytes deliveries (before `first_seq`) under way.
    direct_inflight: usize,
    /// Highest sequence number delivered from bytes before `first_seq`.
    direct_max: u64,
    /// Whether the link has delivered: bytes from before `first_seq` are late now.
    switched: bool,
    /// Bytes of messages the link routes, waiting for their turn.
    inbox: BTreeMap<u64, GpuSample>,
    /// Highest sequence number whose bytes were dropped from a full inbox: a notice for
    /// it, or for anything before it that is not in the inbox, waits for nothing (the
    /// bytes of one publisher arrive in order).
    inbox_dropped: u64,
}

impl OrderState {
    /// A new link's routing starts at `first_seq`, or (`None`) the link ended and bytes
    /// are delivered as they arrive: nothing waits for the old link's notices any more.
    fn restart(&mut self, first_seq: Option<u64>) {
        self.first_seq = first_seq;
        self.switched = false;
        self.inbox.clear();
        self.inbox_dropped = 0;
    }
}

impl Order {
    fn lock(&self) -> MutexGuard<'_, OrderState> {
        self.m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits on the condition variable until `deadline`; false once it has passed.
    fn wait<'a>(&self, g: MutexGuard<'a, OrderState>, deadline: Instant) -> (MutexGuard<'a, OrderState>, bool) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (g, false);
        }
        let (g, _) = self.cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner());
        (g, true)
    }

    /// Before the link's first delivery: let the bytes sent just before `first_seq`
    /// land first.
    fn switch_over<'a>(&'a self, mut g: MutexGuard<'a, OrderState>, first_seq: u64) -> MutexGuard<'a, OrderState> {
        if g.switched {
            return g;
        }
        let deadline = Instant::now() + SWITCH_WAIT;
        while g.direct_inflight > 0 || (g.direct_max > 0 && g.direct_max + 1 < first_seq) {
            let (g2, more) = self.wait(g, deadline);
            g = g2;
            if !more {
                tracing::debug!(
                    first_seq,
                    direct_max = g.direct_max,
                    "bytes before the switch to zero-copy never came"
                );
                break;
            }
        }
        g.switched = true;
        g
    }
}

#[derive(Default)]
struct State {
    /// Publishers of ours whose key meets ours, by instance.
    pubs: HashMap<u64, PubEntry>,
    /// Sequence numbers recently delivered, per publisher.
    seen: HashMap<u64, Seen>,
}

/// The last [`Seen::WINDOW`] sequence numbers delivered from one publisher, and the
/// highest, for loss accounting.
///
/// Deduplication only has to catch the same message arriving by two paths (a
/// descriptor and bytes, while a handshake completes), which arrive close together. A
/// set rather than a high-water mark: bytes headers are not authenticated, and a forged
/// huge sequence number must not make every later real message look like a duplicate.
#[derive(Default)]
struct Seen {
    order: std::collections::VecDeque<u64>,
    set: std::collections::HashSet<u64>,
    high: Option<u64>,
}

/// What recording one delivery did to the loss count.
#[derive(Debug, PartialEq, Eq)]
enum Gap {
    /// In sequence, or the first message.
    None,
    /// This many messages were skipped.
    Skipped(u64),
    /// A message below the highest delivered: it fills a gap (if one was counted).
    Filled,
}

impl Seen {
    const WINDOW: usize = 4096;

    /// Records `seq`: `None` if it was delivered already.
    fn insert(&mut self, seq: u64) -> Option<Gap> {
        if !self.set.insert(seq) {
            return None;
        }
        self.order.push_back(seq);
        if self.order.len() > Self::WINDOW
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        Some(match self.high {
            Some(h) if seq > h => {
                self.high = Some(seq);
                match seq - h - 1 {
                    0 => Gap::None,
                    n => Gap::Skipped(n.min(Self::WINDOW as u64)),
                }
            }
            Some(_) => Gap::Filled,
            None => {
                self.high = Some(seq);
                Gap::None
            }
        })
    }
}

pub(crate) type Deliver = Box<dyn Fn(GpuSample) + Send + Sync>;

pub(crate) struct Shared {
    key: String,
    instance: u64,
    group: Group,
    medium: SubMedium,
    state: Mutex<State>,
    counters: Counters,
    /// Taken on close: samples still queued in a channel hold this `Shared`, and the
    /// channel's sender lives in `deliver`, so keeping it would be a cycle.
    deliver: Mutex<Option<Arc<Deliver>>>,
    releaser: RecyclerHandle,
    handshake_timeout: Duration,
    /// How long the link threads poll before sleeping (`spin_us`).
    spin: Duration,
    bad_input: RateLimitedWarn,
    plain_listen: PlainListen,
    plain_sub: Mutex<Option<zenoh::pubsub::Subscriber<()>>>,
    session: zenoh::Session,
    closed: AtomicBool,
    /// Host providers reached by this session (lent blocks are opened there).
    providers: Arc<crate::provider::Providers>,
    /// For writing a dead publisher's ready signals (CUDA). Created with the subscriber,
    /// not when needed: creating a stream blocks while another of our streams waits on
    /// a signal that never comes (measured on an H200, driver 580), which is exactly
    /// when it is needed; and not per link, to keep it out of every handshake.
    release_stream: ReleaseStream,
}

/// Set once, by the subscriber's declaration after its first handshakes have started
/// (or by a link that needs it before that).
type ReleaseStream = Arc<std::sync::OnceLock<crate::cuda::Stream>>;

pub(crate) struct SubscriberCore {
    shared: Arc<Shared>,
    _recycler: Recycler,
    _token: zenoh::liveliness::LivelinessToken,
    _bytes: zenoh::pubsub::Subscriber<()>,
    _pubs: zenoh::pubsub::Subscriber<()>,
}

impl SubscriberCore {
    #[allow(clippy::too_many_arguments)] // one call site, in api.rs
    pub(crate) fn new(
        session: &zenoh::Session,
        key: &str,
        group: Group,
        medium: SubMedium,
        plain_listen: PlainListen,
        handshake_timeout: Duration,
        spin: Duration,
        deliver: Deliver,
        providers: Arc<crate::provider::Providers>,
    ) -> Result<Self, super::publisher::DeclareError> {
        use super::publisher::DeclareError;
        let zerr = |e: zenoh::Error| DeclareError::Zenoh(e.to_string());
        let ke = KeyExpr::try_from(key.to_owned())
            .map_err(|e| DeclareError::Key { key: key.into(), detail: e.to_string() })?;
        super::step!("subscriber: declaring");
        let instance = rand::random::<u64>() | 1;
        // What is not needed to see the publishers already there and start handshaking
        // with them comes after: their handshakes run meanwhile, on their link threads.
        let (mut recycler, releaser) = Recycler::prepare(Duration::from_secs(3600));
        let shared = Arc::new(Shared {
            key: key.to_owned(),
            instance,
            group: group.clone(),
            medium,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            deliver: Mutex::new(Some(Arc::new(deliver))),
            releaser,
            handshake_timeout,
            spin,
            bad_input: RateLimitedWarn::new(Duration::from_secs(5)),
            plain_listen,
            plain_sub: Mutex::new(None),
            session: session.clone(),
            closed: AtomicBool::new(false),
            providers,
            release_stream: ReleaseStream::default(),
        });
        let s = Arc::clone(&shared);
        let pubs = super::watch_tokens(session, Role::Pub, ke.clone(), move |kind, t| match kind {
            SampleKind::Put => publisher_appeared(&s, t),
            SampleKind::Delete => publisher_vanished(&s, t.instance),
        })
        .map_err(zerr)?;
        let mut rest = || -> Result<_, DeclareError> {
            // The token goes before the bytes subscription: declarations travel in order
            // on a link, so a publisher learns of this subscriber (and serves it bytes
            // until the handshake) before any of its subscriptions can match a put. A
            // handshake may finish first; the publisher then knows it as linked.
            let token = Token { role: Role::Sub, key: key.to_owned(), instance, group: group.clone(), socket: None };
            let token = session.liveliness().declare_token(token.to_key()).wait().map_err(zerr)?;
            let s = Arc::clone(&shared);
            let bytes = session
                .declare_subscriber(protocol::bytes_key(key))
                .callback(move |sample| on_bytes(&s, &sample, false))
                .wait()
                .map_err(zerr)?;
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
        super::step!("subscriber: declared");
        Ok(Self { shared, _recycler: recycler, _token: token, _bytes: bytes, _pubs: pubs })
    }

    /// How long receivers poll before sleeping (`spin_us`).
    pub(crate) fn spin(&self) -> Duration {
        self.shared.spin
    }

    pub(crate) fn stats(&self) -> SubscriberStats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SubscriberStats {
            zero_copy: l(&c.zero_copy),
            inline: l(&c.inline),
            cpu_bytes: l(&c.cpu_bytes),
            plain: l(&c.plain),
            duplicates: l(&c.duplicates),
            bad_descriptors: l(&c.bad_descriptors),
            bad_bytes: l(&c.bad_bytes),
            imports: l(&c.imports),
            import_failures: l(&c.import_failures),
            handshakes: l(&c.handshakes),
            handshake_failures: l(&c.handshake_failures),
            evictions: l(&c.evictions),
            releases: l(&c.releases),
            late_bytes: l(&c.late_bytes),
            lost: l(&c.lost),
        }
    }

    /// Publishers of ours this subscriber knows, and whether each is on the zero-copy
    /// path.
    pub(crate) fn publishers(&self) -> Vec<(u64, bool)> {
        let st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pubs.iter().map(|(i, e)| (*i, e.live())).collect()
    }

    /// Why `publisher` serves this subscriber bytes rather than its blocks; `None` while
    /// it is on the zero-copy path, or for a publisher this subscriber does not know.
    pub(crate) fn bytes_reason(&self, publisher: u64) -> Option<String> {
        let st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pubs.get(&publisher).and_then(PubEntry::bytes_reason)
    }

    /// Reports this subscriber while it exists (the session sends such reports to its
    /// provider); `None` once it is gone.
    pub(crate) fn reporter(&self) -> impl Fn() -> Option<protocol::SubscriberReport> + Send + Sync + 'static {
        let shared = Arc::downgrade(&self.shared);
        move || {
            let sh = shared.upgrade()?;
            let publishers = {
                let st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
                st.pubs
                    .iter()
                    .map(|(i, e)| protocol::PathReport {
                        peer: *i,
                        path: if e.live() { "zero-copy" } else { "bytes" }.to_owned(),
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
                zero_copy: l(&c.zero_copy),
                cpu_bytes: l(&c.cpu_bytes),
                bad_descriptors: l(&c.bad_descriptors),
                import_failures: l(&c.import_failures),
                lost: l(&c.lost),
            })
        }
    }

    pub(crate) fn key(&self) -> &str {
        &self.shared.key
    }
}

impl Drop for SubscriberCore {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// How long a closing subscriber's link thread waits for the publisher's `Left`.
const LEAVE_WAIT: Duration = Duration::from_secs(1);

impl Shared {
    /// Returns at once. Each link thread sees `closed`, releases what is still routed
    /// to it until the publisher's `Left` (or within `LEAVE_WAIT`), and exits; samples
    /// the application still holds keep their leases until dropped.
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.plain_sub.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.deliver.lock().unwrap_or_else(|p| p.into_inner()).take();
        let links: Vec<Arc<Link>> = {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.pubs.values().filter_map(|e| e.link.clone()).collect()
        };
        for link in links {
            if let Err(e) = link.conn.send(&protocol::encode(&Request::Leave), &[]) {
                tracing::debug!(error = %e, "leave not sent (publisher gone?)");
            }
        }
        // Wake link threads waiting for bytes, and drop bytes still waiting for their
        // turn (each holds this subscriber's shared state).
        let orders: Vec<Arc<Order>> = {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.pubs.values().map(|e| Arc::clone(&e.order)).collect()
        };
        for order in orders {
            order.lock().inbox.clear();
            order.cv.notify_all();
        }
    }

    /// Listens on the plain key, or stops, as `plain_listen` and the publishers known
    /// now say (`auto`: while none is known). Decided under the plain-key lock, so
    /// calls racing each other leave the state the last one saw.
    fn refresh_plain(self: &Arc<Self>) {
        let mut sub = self.plain_sub.lock().unwrap_or_else(|p| p.into_inner());
        let on = match self.plain_listen {
            PlainListen::Always => true,
            PlainListen::Never => false,
            PlainListen::Auto => self.state.lock().unwrap_or_else(|p| p.into_inner()).pubs.is_empty(),
        };
        if on == sub.is_some() || self.closed.load(Ordering::Relaxed) {
            return;
        }
        if on {
            let s = Arc::clone(self);
            match self
                .session
                .declare_subscriber(self.key.clone())
                .callback(move |sample| on_bytes(&s, &sample, true))
                .wait()
            {
                Ok(x) => *sub = Some(x),
                Err(e) => tracing::warn!(error = %e, key = %self.key, "cannot listen on the plain key"),
            }
        } else {
            *sub = None;
        }
        tracing::debug!(key = %self.key, on, "plain-key listening changed");
    }

    /// Whether `seq` of `publisher` was delivered.
    fn seen(&self, publisher: u64, seq: u64) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.seen.get(&publisher).is_some_and(|s| s.set.contains(&seq))
    }

    /// Delivers `seq` of `publisher` unless it was delivered already; counts gaps.
    fn first_delivery(&self, publisher: u64, seq: u64) -> bool {
        self.first_copy(publisher, seq, true)
    }

    /// [`Shared::first_delivery`]; `count_duplicate`: count a copy already delivered in
    /// `duplicates` (not for the plain key's copies, which are expected).
    fn first_copy(&self, publisher: u64, seq: u64, count_duplicate: bool) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.seen.entry(publisher).or_default().insert(seq) {
            None => {
                if count_duplicate {
                    inc(&self.counters.duplicates);
                }
                false
            }
            Some(gap) => {
                let lost = &self.counters.lost;
                match gap {
                    Gap::None => {}
                    Gap::Skipped(n) => {
                        lost.fetch_add(n, Ordering::Relaxed);
                    }
                    // Relaxed: a counter; updates happen under the state lock anyway.
                    Gap::Filled => {
                        let _ = lost.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
                    }
                }
                true
            }
        }
    }

    fn deliver(&self, sample: GpuSample) {
        let d = self.deliver.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(d) = d {
            d(sample);
        }
    }

    /// Runs `f` once every fence is complete, off the caller's thread.
    pub(crate) fn defer(&self, fences: Vec<Box<dyn Fence>>, f: Box<dyn FnOnce() + Send>) {
        if fences.iter().all(|x| x.is_complete()) {
            f();
        } else {
            self.releaser.submit(Job { fences, done: f });
        }
    }

    /// Releases a lease once every fence is complete, off the caller's thread.
    pub(crate) fn release_after(&self, link: Arc<Link>, key: BlockKey, block: Imported, fences: Vec<Box<dyn Fence>>) {
        inc(&self.counters.releases);
        self.defer(
            fences,
            Box::new(move || {
                drop(block);
                link.release(key);
            }),
        );
    }
}

fn publisher_appeared(sh: &Arc<Shared>, t: Token) {
    {
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = st.pubs.get(&t.instance) {
            // Back after a Zenoh outage that its link outlived.
            if let Some(link) = &e.link {
                link.token_gone.store(false, Ordering::Relaxed);
            }
            return;
        }
        let why = (t.group != sh.group).then(|| super::publisher::path_reason(&sh.group, &t.group));
        st.pubs.insert(t.instance, PubEntry { link: None, order: Arc::default(), why });
    }
    let socket = match &t.socket {
        Some(s) if t.group == sh.group => s.clone(),
        // Another host or device: bytes only.
        _ => return sh.refresh_plain(),
    };
    let s = Arc::clone(sh);
    super::step!("subscriber: publisher seen");
    // Connect and say Hello here, without waiting: the publisher's side of the
    // handshake then runs while the link thread starts. A connection that cannot be
    // made at once (a full backlog) is retried by the thread, with the full timeout.
    let opened = hello(sh, &socket, Duration::ZERO).ok();
    // A handshake held back for a test starts in the link thread.
    #[cfg(feature = "test-support")]
    let opened = opened.filter(|_| !crate::test_support::handshake_delayed());
    let spawned =
        std::thread::Builder::new().name("zcs-sub-link".into()).spawn(move || link_thread(&s, &t, &socket, opened));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a link thread");
    }
    sh.refresh_plain();
}

/// Handshakes with a publisher (on `opened`, a connection that said Hello, if given)
/// and runs the link until it ends; handshakes again (with back-off) if the publisher
/// ended a link while it is still there.
fn link_thread(sh: &Arc<Shared>, t: &Token, socket: &str, mut opened: Option<ControlConn>) {
    #[cfg(feature = "test-support")]
    crate::test_support::delay_handshake();
    let mut backoff = Duration::from_millis(20);
    loop {
        let conn = match opened.take() {
            Some(c) => Ok(c),
            None => hello(sh, socket, sh.handshake_timeout),
        };
        let link = match conn.and_then(|c| handshake(sh, c)) {
            Ok(link) => link,
            Err(why) => {
                inc(&sh.counters.handshake_failures);
                tracing::info!(publisher = %super::Id(t.instance), why, "no zero-copy path to this publisher; receiving bytes");
                if let Some(e) = sh.state.lock().unwrap_or_else(|p| p.into_inner()).pubs.get_mut(&t.instance) {
                    e.why = Some(format!("handshake failed: {why}"));
                }
                return;
            }
        };
        inc(&sh.counters.handshakes);
        let end = run_link(sh, &link);
        // The ended link stays in the publisher's entry, marked dead, until a new
        // handshake replaces it or the publisher's token vanishes, which evicts its
        // imports and, if the process died, releases streams waiting on its signals.
        // If the token vanished while the link was open, the publisher goes now.
        link.alive.store(false, Ordering::Relaxed);
        let (still_there, gone) = {
            let mut o = link.order.lock();
            let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
            let entry = st.pubs.get(&link.publisher);
            if entry.and_then(|e| e.link.as_ref()).is_some_and(|l| Arc::ptr_eq(l, &link)) {
                // From here on, bytes are delivered as they arrive.
                o.restart(None);
            }
            let still_there = entry.is_some();
            // Its token vanished while the link was open; with the link gone too,
            // nothing says the publisher is there any more.
            let gone =
                (still_there && link.token_gone.load(Ordering::Relaxed)).then(|| forget(&mut st, link.publisher));
            (still_there && gone.is_none(), gone)
        };
        if let Some((ended, none_left)) = gone {
            forgotten(sh, link.publisher, ended, none_left);
            return;
        }
        if sh.closed.load(Ordering::Relaxed) || !still_there || !matches!(end, LinkEnd::Dropped) {
            return;
        }
        tracing::info!(publisher = %super::Id(t.instance), "zero-copy link ended by the publisher; receiving bytes, reconnecting");
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Why a link thread stopped.
enum LinkEnd {
    /// We are closing (the publisher said `Left`, or did not in time).
    Closed,
    /// The connection ended (the publisher died, closed, or dropped us as slow).
    Dropped,
    /// The publisher broke the protocol; no new handshake.
    Violation,
}

/// Receives and delivers what the publisher routes over the link, in order.
fn run_link(sh: &Arc<Shared>, link: &Arc<Link>) -> LinkEnd {
    let mut backlog: VecDeque<Frame> = VecDeque::new();
    let mut leaving: Option<Instant> = None;
    loop {
        if leaving.is_none() && sh.closed.load(Ordering::Relaxed) {
            leaving = Some(Instant::now());
        }
        if leaving.is_some_and(|t| t.elapsed() > LEAVE_WAIT) {
            return LinkEnd::Closed;
        }
        let mut frame = match backlog.pop_front() {
            Some(f) => f,
            None => match link.conn.recv_spinning(Duration::from_millis(100), sh.spin) {
                Ok(f) => f,
                Err(RecvError::Timeout(_)) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, publisher = %super::Id(link.publisher), "link ended");
                    return if leaving.is_some() { LinkEnd::Closed } else { LinkEnd::Dropped };
                }
            },
        };
        let reply = match protocol::decode::<Reply>("control frame", &frame.bytes) {
            Ok(r) => r,
            Err(e) => {
                inc(&sh.counters.bad_descriptors);
                sh.bad_input.warn("malformed frame from a publisher; closing the link", &e);
                link.conn.shutdown();
                return LinkEnd::Violation;
            }
        };
        match reply {
            Reply::Block(d) if leaving.is_some() => link.release(d.block),
            // The publisher sends a block's FD with the first descriptor of it.
            Reply::Block(d) => on_block(sh, link, &mut backlog, d, frame.fds.pop()),
            Reply::Inline { .. } | Reply::ViaBytes { .. } if leaving.is_some() => {}
            Reply::Inline { seq, timestamp_ns, meta, data } => {
                let info = SampleInfo {
                    key: sh.key.clone(),
                    publisher: link.publisher,
                    seq,
                    timestamp_ns,
                    path: Path::Inline,
                    meta,
                };
                let sample = GpuSample::new(info, Body::Bytes(data.into()), sh.medium.clone(), Arc::clone(sh));
                deliver_routed(sh, link, sample, &sh.counters.inline);
            }
            Reply::ViaBytes { seq } => on_via_bytes(sh, link, seq),
            Reply::Left => return LinkEnd::Closed,
            other => {
                inc(&sh.counters.bad_descriptors);
                sh.bad_input.warn("unexpected frame from a publisher; closing the link", &format!("{other:?}"));
                link.conn.shutdown();
                return LinkEnd::Violation;
            }
        }
    }
}

/// Delivers a message routed over `link` (in its turn), unless it was delivered
/// already; counts it in `counter`.
fn deliver_routed(sh: &Shared, link: &Link, sample: GpuSample, counter: &AtomicU64) {
    let seq = sample.seq();
    {
        let mut o = link.order.switch_over(link.order.lock(), link.first_seq);
        // The same message may also have come as bytes (for another subscriber).
        o.inbox.remove(&seq);
    }
    if sh.first_delivery(link.publisher, seq) {
        inc(counter);
        sh.deliver(sample);
    }
}

/// Message `seq` comes as bytes through Zenoh: deliver it from the inbox, waiting up
/// to `VIA_BYTES_WAIT` for it.
fn on_via_bytes(sh: &Shared, link: &Link, seq: u64) {
    let deadline = Instant::now() + VIA_BYTES_WAIT;
    let order = &link.order;
    let mut o = order.switch_over(order.lock(), link.first_seq);
    let sample = loop {
        if let Some(s) = o.inbox.remove(&seq) {
            break Some(s);
        }
        if sh.closed.load(Ordering::Relaxed) || sh.seen(link.publisher, seq) {
            break None;
        }
        let (o2, more) = if seq <= o.inbox_dropped { (o, false) } else { order.wait(o, deadline) };
        o = o2;
        if !more {
            // Counted in `lost` as a gap once a later message is delivered.
            tracing::warn!(publisher = %super::Id(link.publisher), seq, "bytes routed through Zenoh never came; message lost");
            break None;
        }
    };
    drop(o);
    if let Some(s) = sample
        && sh.first_delivery(link.publisher, seq)
    {
        inc(if s.path() == Path::Inline { &sh.counters.inline } else { &sh.counters.cpu_bytes });
        sh.deliver(s);
    }
}

/// How long a subscriber watches a vanished publisher's process for its exit.
const DEAD_PUBLISHER_WATCH: Duration = Duration::from_secs(600);

fn publisher_vanished(sh: &Arc<Shared>, instance: u64) {
    let (link, none_left) = {
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        // The token came through Zenoh; the link does not. While the link is open its
        // publisher is alive and routing to us (descriptors, leases and releases all
        // go over it), so the token vanishing means the Zenoh route between us is down
        // — a router died — and the link stays. If the link ends before the token is
        // back, its end forgets the publisher (`link_thread`). `alive` is stored false
        // by the link thread before it takes this lock, so under the lock exactly one
        // of the two sees the other's mark.
        let open = st.pubs.get(&instance).and_then(|e| e.link.clone()).filter(|l| l.alive.load(Ordering::Relaxed));
        match open {
            Some(link) => {
                link.token_gone.store(true, Ordering::Relaxed);
                drop(st);
                tracing::debug!(
                    publisher = %super::Id(instance),
                    "publisher's token gone while its link is open; keeping the link"
                );
                // The token also goes first when the publisher's process dies with a
                // kernel running (its Zenoh sockets close before its control socket):
                // watch it, so that none of our streams waits on a signal never written.
                return watch_publisher_process(&link);
            }
            None => forget(&mut st, instance),
        }
    };
    forgotten(sh, instance, link, none_left);
}

/// Removes a publisher's entry; [`forgotten`] finishes the job outside the lock.
fn forget(st: &mut State, instance: u64) -> (Option<Arc<Link>>, bool) {
    let e = st.pubs.remove(&instance);
    st.seen.remove(&instance);
    (e.and_then(|e| e.link), st.pubs.is_empty())
}

/// A forgotten publisher's link goes: its imports are evicted and, on CUDA, its process
/// is watched; with no publisher left, the plain key is listened on again (`auto`).
fn forgotten(sh: &Arc<Shared>, instance: u64, link: Option<Arc<Link>>, none_left: bool) {
    if let Some(link) = link {
        link.alive.store(false, Ordering::Relaxed);
        // Mappings still read by samples stay alive through their Arcs.
        link.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
        inc(&sh.counters.evictions);
        tracing::debug!(publisher = %super::Id(instance), "publisher gone; its imports evicted");
        // A link whose token vanished while it was open is watched since then.
        if !link.token_gone.load(Ordering::Relaxed) {
            watch_publisher_process(&link);
        }
    }
    if none_left {
        sh.refresh_plain();
    }
}

/// Watches the process behind a CUDA link whose publisher's token vanished, and once
/// it has exited releases our streams' waits on the ready signals it never wrote.
///
/// A token vanishes as soon as the process's Zenoh sockets close, which can be long
/// before it has exited: a killed process with a kernel still running stays in the
/// driver's context teardown for seconds. It also vanishes when the publisher is merely
/// dropped (then its signals still come), or while a router between us is down. So
/// watch off Zenoh's callback thread, for up to `DEAD_PUBLISHER_WATCH`, or until the
/// token is back on a link that is still open.
fn watch_publisher_process(link: &Arc<Link>) {
    if link.signals.is_none() || link.peer_pid <= 0 {
        return;
    }
    let link = Arc::clone(link);
    let spawned = std::thread::Builder::new().name("zcs-dead-publisher".into()).spawn(move || {
        let t = std::time::Instant::now();
        let mut nap = Duration::from_millis(5);
        while t.elapsed() < DEAD_PUBLISHER_WATCH {
            if crate::host::process_gone(link.peer_pid) {
                link.release_waiters_of_dead_publisher();
                return;
            }
            if link.alive.load(Ordering::Relaxed) && !link.token_gone.load(Ordering::Relaxed) {
                // Seen again; a later vanishing starts a new watch.
                return;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(100));
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot watch a vanished publisher's process");
    }
}

/// The start of a handshake: connects to a publisher's control socket (waiting up to
/// `timeout` for room in its backlog) and says Hello.
fn hello(sh: &Shared, socket: &str, timeout: Duration) -> Result<ControlConn, String> {
    let name = SocketName::from_key_chunk(socket).map_err(|e| e.to_string())?;
    let conn = ControlConn::connect(&name, timeout).map_err(|e| match e {
        // Its liveliness token outlived it (a router keeps a token until it notices
        // the session is gone): say so, not just which socket was empty.
        ConnectError::NotListening { .. } => format!("the publisher is gone ({e}); its token has outlived it"),
        e => e.to_string(),
    })?;
    // Without a lifeline the publisher learns of our death when our end closes.
    let lifeline = crate::ipc::Lifeline::ours()
        .inspect_err(|e| tracing::warn!(error = %e, "no lifeline: a publisher learns of this process's death late"))
        .ok();
    let hello = Request::Hello { subscriber: sh.instance, group: sh.group.clone(), lifeline: lifeline.is_some() };
    let fds: Vec<_> = lifeline.iter().map(|l| l.fd()).collect();
    conn.send(&protocol::encode(&hello), &fds).map_err(|e| e.to_string())?;
    super::step!("subscriber: Hello sent");
    Ok(conn)
}

/// The rest of a handshake on a connection that said Hello: the probe, then `Ready`.
fn handshake(sh: &Arc<Shared>, conn: ControlConn) -> Result<Arc<Link>, String> {
    let peer_pid = conn.peer_cred().pid;
    let mut frame = conn.recv(sh.handshake_timeout).map_err(|e| e.to_string())?;
    super::step!("subscriber: Welcome received");
    let (publisher, cap_key, probe_size, probe_token, provider) =
        match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(|e| e.to_string())? {
            Reply::Welcome { publisher, capability_key, probe_size, probe_token, provider, .. } => {
                (publisher, capability_key, probe_size, probe_token, provider)
            }
            Reply::Refused { reason } => return Err(format!("refused: {reason}")),
            other => return Err(format!("unexpected {other:?}")),
        };
    let probe = frame.fds.pop().ok_or("Welcome without a probe FD")?;
    let probe_size = usize::try_from(probe_size).map_err(|e| e.to_string())?;
    // The publisher's blocks may be lent by a provider: we must reach it to open them.
    let provider = match provider.map(|p| sh.providers.get(&p, sh.handshake_timeout)).transpose() {
        Ok(p) => p,
        Err(e) => {
            let error = format!("cannot reach the publisher's host provider: {e}");
            let _ = conn.send(&protocol::encode(&Request::Ack { token: None, error: Some(error.clone()) }), &[]);
            return Err(error);
        }
    };
    let imported = match &sh.medium {
        SubMedium::Cuda(gpu) => {
            ReadySignals::import(gpu, probe, probe_size).map(|s| (Some(Arc::new(s)), 0)).map_err(|e| e.to_string())
        }
        SubMedium::Host => HostBlock::import(probe, probe_size).map_err(|e| e.to_string()).and_then(|b| {
            if b.size() < 8 {
                return Err("probe too small".to_owned());
            }
            // SAFETY: the probe is mapped with ≥ 8 bytes (checked above), sealed
            // against shrinking (checked by import), and only read.
            Ok((None, unsafe { (b.as_ptr() as *const u64).read_unaligned() }))
        }),
    };
    let link_signals = match imported {
        Ok((signals, token)) => {
            if matches!(sh.medium, SubMedium::Host) && token != probe_token {
                return Err("probe token mismatch".into());
            }
            signals
        }
        Err(e) => {
            let _ = conn.send(&protocol::encode(&Request::Ack { token: None, error: Some(e.clone()) }), &[]);
            return Err(format!("probe import failed: {e}"));
        }
    };
    super::step!("subscriber: probe imported");
    conn.send(&protocol::encode(&Request::Ack { token: Some(probe_token), error: None }), &[])
        .map_err(|e| e.to_string())?;
    let frame = conn.recv(sh.handshake_timeout).map_err(|e| e.to_string())?;
    let first_seq = match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(|e| e.to_string())? {
        Reply::Ready { first_seq } => first_seq,
        Reply::Refused { reason } => return Err(format!("refused: {reason}")),
        other => return Err(format!("unexpected {other:?}")),
    };
    // Lock order everywhere: an `Order` before the state, never the state first.
    let order = sh.state.lock().unwrap_or_else(|p| p.into_inner()).pubs.get(&publisher).map(|e| Arc::clone(&e.order));
    let order = order.ok_or("publisher vanished during the handshake")?;
    let link = Arc::new(Link {
        conn,
        publisher,
        first_seq,
        order: Arc::clone(&order),
        cap_key: CapabilityKey::from_bytes(cap_key),
        signals: link_signals,
        cache: Mutex::new(HashMap::new()),
        alive: AtomicBool::new(true),
        token_gone: AtomicBool::new(false),
        peer_pid,
        awaited: Mutex::new(HashMap::new()),
        unready: Mutex::new(std::collections::HashSet::new()),
        release_stream: sh.release_stream.clone(),
        provider,
    });
    let mut o = order.lock();
    o.restart(Some(first_seq));
    match sh.state.lock().unwrap_or_else(|p| p.into_inner()).pubs.get_mut(&publisher) {
        Some(e) => {
            e.why = None;
            if let Some(old) = e.link.replace(Arc::clone(&link)) {
                // A link that ended while its publisher stayed: its imports go.
                old.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
            }
        }
        None => return Err("publisher vanished during the handshake".into()),
    }
    drop(o);
    super::step!("subscriber: Ready received, linked");
    Ok(link)
}

fn decode_meta(sample: &Sample) -> Option<BytesHeader> {
    let att = sample.attachment()?;
    protocol::decode_attachment(&att.to_bytes()).ok().flatten()
}

fn on_bytes(sh: &Arc<Shared>, sample: &Sample, plain_key: bool) {
    if sample.kind() != SampleKind::Put {
        return;
    }
    #[cfg(feature = "test-support")]
    if crate::test_support::bytes_delayed() {
        let (sh, sample) = (Arc::clone(sh), sample.clone());
        return crate::test_support::delay_bytes(Box::new(move || take_bytes(&sh, &sample, plain_key)));
    }
    take_bytes(sh, sample, plain_key);
}

fn take_bytes(sh: &Arc<Shared>, sample: &Sample, plain_key: bool) {
    let header = decode_meta(sample);
    // Ours on the plain key (while this subscriber listens there) is a second copy of
    // bytes that usually also come on our channel, but not always: a publisher that has
    // not yet seen this subscriber's token puts them on the plain key only. So it is
    // taken unless the link routes that message; a copy already delivered is dropped
    // without counting it as a duplicate.
    let h = match header {
        Some(h) => h,
        None if plain_key => {
            inc(&sh.counters.plain);
            let info = SampleInfo {
                key: sample.key_expr().as_str().to_owned(),
                publisher: 0,
                seq: 0,
                timestamp_ns: 0,
                path: Path::Plain,
                meta: None,
            };
            let body = Body::Bytes(sample.payload().clone());
            return sh.deliver(GpuSample::new(info, body, sh.medium.clone(), Arc::clone(sh)));
        }
        None => {
            inc(&sh.counters.bad_bytes);
            sh.bad_input.warn("bytes without a valid header on our channel", &sample.key_expr());
            return;
        }
    };
    let (link, order) = {
        let st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.pubs.get(&h.publisher) {
            Some(e) => (e.link.clone(), Some(Arc::clone(&e.order))),
            None => (None, None),
        }
    };
    // Handshaken with this publisher: we hold its key and can tell a forgery.
    if let Some(link) = &link
        && link.cap_key.bytes_tag(h.publisher, h.seq, sample.payload().len() as u64) != h.tag
    {
        inc(&sh.counters.bad_bytes);
        sh.bad_input.warn("bytes with a forged header dropped", &sample.key_expr());
        return;
    }
    let path = if h.from_block { Path::CpuBytes } else { Path::Inline };
    let (publisher, seq) = (h.publisher, h.seq);
    let info = SampleInfo {
        key: sample.key_expr().as_str().to_owned(),
        publisher,
        seq,
        timestamp_ns: h.timestamp_ns,
        path,
        meta: h.meta,
    };
    let sample = GpuSample::new(info, Body::Bytes(sample.payload().clone()), sh.medium.clone(), Arc::clone(sh));
    let counter = if path == Path::CpuBytes { &sh.counters.cpu_bytes } else { &sh.counters.inline };
    let Some(order) = order else {
        // A publisher whose token has not reached us yet: deliver as it comes.
        if sh.first_copy(publisher, seq, !plain_key) {
            inc(counter);
            sh.deliver(sample);
        }
        return;
    };
    let mut o = order.lock();
    match o.first_seq {
        // The link routes this message; its bytes, if any, come on our channel.
        Some(first) if seq >= first && plain_key => {}
        // The link routes this message: it waits for its turn.
        Some(first) if seq >= first => {
            if sh.seen(publisher, seq) {
                inc(&sh.counters.duplicates);
                return;
            }
            o.inbox.insert(seq, sample);
            while o.inbox.len() > INBOX_LIMIT {
                if let Some((dropped, _)) = o.inbox.pop_first() {
                    o.inbox_dropped = o.inbox_dropped.max(dropped);
                }
            }
            order.cv.notify_all();
        }
        // Bytes of a message before the link's first, which the link has already passed:
        // this subscriber gets the message only this way, so it is delivered now, out of
        // order, rather than lost. (The switch-over waits for such bytes only when it has
        // seen bytes before; the first bytes of a subscriber can still be under way
        // through a router when its link delivers.)
        Some(_) if o.switched => {
            drop(o);
            if sh.first_copy(publisher, seq, !plain_key) {
                inc(&sh.counters.late_bytes);
                inc(counter);
                tracing::debug!(publisher = %super::Id(publisher), seq, "bytes from before the switch to zero-copy delivered late");
                sh.deliver(sample);
            }
        }
        _ => {
            if !sh.first_copy(publisher, seq, !plain_key) {
                return;
            }
            o.direct_inflight += 1;
            drop(o);
            inc(counter);
            sh.deliver(sample);
            let mut o = order.lock();
            o.direct_inflight -= 1;
            o.direct_max = o.direct_max.max(seq);
            order.cv.notify_all();
        }
    }
}

/// A block routed to us: verify, import on first sight, deliver in its turn.
fn on_block(sh: &Arc<Shared>, link: &Arc<Link>, backlog: &mut VecDeque<Frame>, d: Descriptor, fd: Option<OwnedFd>) {
    let bad = |what: &str, detail: &dyn std::fmt::Display| {
        inc(&sh.counters.bad_descriptors);
        sh.bad_input.warn(what, detail);
    };
    if d.publisher != link.publisher || link.cap_key.capability(d.block) != d.capability {
        link.release(d.block);
        return bad("descriptor with a wrong publisher or capability dropped", &format_args!("block {:?}", d.block));
    }
    let end = d.offset.checked_add(d.len);
    if end.is_none_or(|e| e > d.block_size) {
        link.release(d.block);
        return bad("descriptor out of its block's bounds", &format_args!("{}+{} > {}", d.offset, d.len, d.block_size));
    }
    let cached = link.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&d.block.id).cloned();
    let imported = match cached {
        Some((alloc, i)) if alloc == d.block.alloc && i.size() as u64 == d.block_size => i,
        _ => match import(sh, link, backlog, &d, fd) {
            Ok(i) => {
                super::step!(seq = d.seq, block = d.block.id, "subscriber: block imported");
                link.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(d.block.id, (d.block.alloc, i.clone()));
                inc(&sh.counters.imports);
                i
            }
            Err(e) => {
                inc(&sh.counters.import_failures);
                link.release(d.block);
                tracing::error!(error = %e, block = ?d.block, "cannot import a block: message lost for this subscriber");
                return;
            }
        },
    };
    if matches!(imported, Imported::Cuda(_)) {
        let mut awaited = link.awaited.lock().unwrap_or_else(|p| p.into_inner());
        let g = awaited.entry(d.block.id).or_insert(0);
        *g = (*g).max(d.block.generation);
    }
    let info = SampleInfo {
        key: sh.key.clone(),
        publisher: d.publisher,
        seq: d.seq,
        timestamp_ns: d.timestamp_ns,
        path: Path::ZeroCopy,
        meta: d.meta,
    };
    // A duplicate is dropped at once, which releases its lease.
    let zc = ZeroCopy::new(imported, d.block, d.offset as usize, d.len as usize, Arc::clone(link), Arc::clone(sh));
    let sample = GpuSample::new(info, Body::ZeroCopy(zc), sh.medium.clone(), Arc::clone(sh));
    deliver_routed(sh, link, sample, &sh.counters.zero_copy);
}

fn import(
    sh: &Shared,
    link: &Link,
    backlog: &mut VecDeque<Frame>,
    d: &Descriptor,
    sent: Option<OwnedFd>,
) -> Result<Imported, String> {
    // A lent block is opened at the provider, which from then on counts us as mapping
    // it (until `Opened` drops with the mapping); an owned one came with the descriptor
    // (sized by it: the import maps exactly that many bytes and fails on a smaller
    // allocation) or is asked of the publisher.
    let (fd, size, opened) = match (d.lent, &link.provider) {
        (Some(loan), Some(client)) => {
            let (fd, size) = client.open(loan).map_err(|e| e.to_string())?;
            (fd, size, Some(Opened { client: Arc::clone(client), loan }))
        }
        (Some(_), None) => return Err("a lent block from a publisher that named no provider".into()),
        (None, _) => match sent {
            Some(fd) => (fd, usize::try_from(d.block_size).map_err(|e| e.to_string())?, None),
            None => {
                let (fd, size) = link.request_fd(backlog, d.block, d.capability)?;
                (fd, size, None)
            }
        },
    };
    if size as u64 != d.block_size {
        return Err(format!("FD of {size} bytes for a {}-byte block", d.block_size));
    }
    match &sh.medium {
        SubMedium::Cuda(gpu) => ImportedBlock::import(gpu, fd, size)
            .map(|b| Imported::Cuda(Arc::new(Mapped::new(b, opened))))
            .map_err(|e| e.to_string()),
        SubMedium::Host => HostBlock::import(fd, size)
            .map(|b| Imported::Host(Arc::new(Mapped::new(b, opened))))
            .map_err(|e| e.to_string()),
    }
}
