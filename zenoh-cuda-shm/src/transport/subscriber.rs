//! The subscriber side: its liveliness token, the publishers it knows of, the
//! handshake and import cache per publisher, deduplication, and releases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zenoh::Wait;
use zenoh::key_expr::KeyExpr;
use zenoh::sample::{Sample, SampleKind};

use super::RateLimitedWarn;
use super::medium::Imported;
use crate::config::PlainListen;
use crate::cuda::{Gpu, ImportedBlock};
use crate::host::HostBlock;
use crate::ipc::{ControlConn, SocketName};
use crate::pool::recycler::{Job, Recycler, RecyclerHandle};
use crate::pool::{BlockKey, CapabilityKey, Fence};
use crate::protocol::{self, Announce, BytesHeader, Descriptor, Group, Reply, Request, Role, Token};
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
    /// Descriptors dropped: malformed, future version, bad capability, out of bounds.
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

/// A handshaken connection to one publisher, and the blocks imported from it.
pub(crate) struct Link {
    /// Sends are atomic frames and may come from any thread (releases, probe echoes);
    /// `request` serialises the request/reply pairs of FD requests.
    conn: ControlConn,
    request: Mutex<()>,
    holder: u64,
    cap_key: CapabilityKey,
    pub(crate) signals: Option<Arc<ReadySignals>>,
    /// Imported blocks by id, with the allocation serial they were imported for. A new
    /// serial for an id means the publisher trimmed the old block: the entry is
    /// replaced, which unmaps the old import once no sample reads it any more.
    cache: Mutex<HashMap<u32, (u64, Imported)>>,
    alive: AtomicBool,
    /// The publisher process (0 when in another PID namespace: unknown).
    peer_pid: i32,
    /// Highest generation handed to samples, per ready-signal slot (CUDA only): what
    /// our streams may be waiting for.
    awaited: Mutex<HashMap<u32, u64>>,
    /// Block generations whose ready signal never came because the publisher died
    /// first: reads of them are refused (`ReadError::PublisherDied`).
    unready: Mutex<std::collections::HashSet<(u32, u64)>>,
    /// Created with the link: creating a stream blocks while another of our streams
    /// waits on a signal that never comes (measured on an H200, driver 580), which is
    /// exactly when this stream is needed.
    release_stream: Option<crate::cuda::Stream>,
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
        let Some(stream) = self.release_stream.clone() else {
            return tracing::error!("no stream to release waits on a dead publisher's signals");
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

    /// Sends a release; a dead link needs none (the publisher released on close).
    pub(crate) fn release(&self, key: BlockKey) {
        if !self.alive.load(Ordering::Relaxed) {
            return;
        }
        let msg = protocol::encode(&Request::Release { blocks: vec![key] });
        if let Err(e) = self.conn.send(&msg, &[]) {
            tracing::debug!(error = %e, "release not sent (publisher gone?)");
        }
    }

    fn request_fd(&self, key: BlockKey, capability: u64) -> Result<(std::os::fd::OwnedFd, usize), String> {
        let _one_at_a_time = self.request.lock().unwrap_or_else(|p| p.into_inner());
        let conn = &self.conn;
        conn.send(&protocol::encode(&Request::Fd { block: key, capability }), &[]).map_err(|e| e.to_string())?;
        let mut frame = conn.recv(Duration::from_secs(5)).map_err(|e| e.to_string())?;
        match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(|e| e.to_string())? {
            Reply::Fd { block, size } if block == key && frame.fds.len() == 1 => {
                Ok((frame.fds.pop().expect("one fd"), usize::try_from(size).map_err(|e| e.to_string())?))
            }
            Reply::FdDenied { reason, .. } => Err(format!("denied: {reason}")),
            other => Err(format!("unexpected reply {other:?}")),
        }
    }
}

struct PubEntry {
    link: Option<Arc<Link>>,
}

#[derive(Default)]
struct State {
    /// Publishers of ours whose key meets ours, by instance.
    pubs: HashMap<u64, PubEntry>,
    /// Sequence numbers recently delivered, per publisher.
    seen: HashMap<u64, Seen>,
}

/// The last [`Seen::WINDOW`] sequence numbers delivered from one publisher.
///
/// Deduplication only has to catch the same message arriving by two paths (a
/// descriptor and bytes, while a handshake completes), which arrive close together. A
/// set rather than a high-water mark: bytes headers are not authenticated, and a forged
/// huge sequence number must not make every later real message look like a duplicate.
#[derive(Default)]
struct Seen {
    order: std::collections::VecDeque<u64>,
    set: std::collections::HashSet<u64>,
}

impl Seen {
    const WINDOW: usize = 4096;

    fn insert(&mut self, seq: u64) -> bool {
        if !self.set.insert(seq) {
            return false;
        }
        self.order.push_back(seq);
        if self.order.len() > Self::WINDOW
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
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
    bad_input: RateLimitedWarn,
    plain_listen: PlainListen,
    plain_sub: Mutex<Option<zenoh::pubsub::Subscriber<()>>>,
    session: zenoh::Session,
    closed: AtomicBool,
}

pub(crate) struct SubscriberCore {
    shared: Arc<Shared>,
    _recycler: Recycler,
    _token: zenoh::liveliness::LivelinessToken,
    _desc: zenoh::pubsub::Subscriber<()>,
    _bytes: zenoh::pubsub::Subscriber<()>,
    _pubs: zenoh::pubsub::Subscriber<()>,
}

impl SubscriberCore {
    pub(crate) fn new(
        session: &zenoh::Session,
        key: &str,
        group: Group,
        medium: SubMedium,
        plain_listen: PlainListen,
        handshake_timeout: Duration,
        deliver: Deliver,
    ) -> Result<Self, super::publisher::DeclareError> {
        use super::publisher::DeclareError;
        let zerr = |e: zenoh::Error| DeclareError::Zenoh(e.to_string());
        let ke = KeyExpr::try_from(key.to_owned())
            .map_err(|e| DeclareError::Key { key: key.into(), detail: e.to_string() })?;
        let instance = rand::random::<u64>() | 1;
        let (recycler, releaser) = Recycler::start(Duration::from_secs(3600))?;
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
            bad_input: RateLimitedWarn::new(Duration::from_secs(5)),
            plain_listen,
            plain_sub: Mutex::new(None),
            session: session.clone(),
            closed: AtomicBool::new(false),
        });
        // The token goes out first: declarations travel in order on a link, so a
        // publisher learns of this subscriber (and starts serving it bytes until the
        // handshake) before any of its subscriptions can match a put.
        let token = Token { role: Role::Sub, key: key.to_owned(), instance, group: group.clone(), socket: None };
        let token = session.liveliness().declare_token(token.to_key()).wait().map_err(zerr)?;
        let s = Arc::clone(&shared);
        let desc = session
            .declare_subscriber(protocol::descriptor_key(key, &group))
            .callback(move |sample| on_descriptor(&s, &sample))
            .wait()
            .map_err(zerr)?;
        let s = Arc::clone(&shared);
        let bytes = session
            .declare_subscriber(protocol::bytes_key(key))
            .callback(move |sample| on_bytes(&s, &sample, false))
            .wait()
            .map_err(zerr)?;
        if plain_listen == PlainListen::Always || plain_listen == PlainListen::Auto {
            shared.set_plain(true);
        }
        let s = Arc::clone(&shared);
        let pubs = super::watch_tokens(session, Role::Pub, ke.clone(), move |kind, t| match kind {
            SampleKind::Put => publisher_appeared(&s, t),
            SampleKind::Delete => publisher_vanished(&s, t.instance),
        })
        .map_err(zerr)?;
        Ok(Self { shared, _recycler: recycler, _token: token, _desc: desc, _bytes: bytes, _pubs: pubs })
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
        }
    }

    /// Publishers of ours this subscriber knows, and whether each is on the zero-copy
    /// path.
    pub(crate) fn publishers(&self) -> Vec<(u64, bool)> {
        let st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pubs.iter().map(|(i, e)| (*i, e.link.is_some())).collect()
    }

    pub(crate) fn key(&self) -> &str {
        &self.shared.key
    }
}

impl Drop for SubscriberCore {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.plain_sub.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.shared.deliver.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

impl Shared {
    fn set_plain(self: &Arc<Self>, on: bool) {
        let mut sub = self.plain_sub.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Delivers `seq` of `publisher` unless it was delivered already.
    fn first_delivery(&self, publisher: u64, seq: u64) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.seen.entry(publisher).or_default().insert(seq) {
            true
        } else {
            inc(&self.counters.duplicates);
            false
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
        if st.pubs.contains_key(&t.instance) {
            return;
        }
        st.pubs.insert(t.instance, PubEntry { link: None });
    }
    if sh.plain_listen == PlainListen::Auto {
        sh.set_plain(false);
    }
    if t.group != sh.group {
        return; // another host or device: bytes only
    }
    let Some(socket) = t.socket.clone() else { return };
    let s = Arc::clone(sh);
    let spawned =
        std::thread::Builder::new().name("zcs-sub-handshake".into()).spawn(move || match handshake(&s, &socket) {
            Ok(()) => inc(&s.counters.handshakes),
            Err(why) => {
                inc(&s.counters.handshake_failures);
                tracing::info!(publisher = t.instance, why, "no zero-copy path to this publisher; receiving bytes");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a handshake thread");
    }
}

/// How long a subscriber watches a vanished publisher's process for its exit.
const DEAD_PUBLISHER_WATCH: Duration = Duration::from_secs(600);

fn publisher_vanished(sh: &Arc<Shared>, instance: u64) {
    let (link, none_left) = {
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        let e = st.pubs.remove(&instance);
        st.seen.remove(&instance);
        (e.and_then(|e| e.link), st.pubs.is_empty())
    };
    if let Some(link) = link {
        link.alive.store(false, Ordering::Relaxed);
        // Mappings still read by samples stay alive through their Arcs.
        link.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
        inc(&sh.counters.evictions);
        tracing::debug!(publisher = instance, "publisher gone; its imports evicted");
        if link.signals.is_some() && link.peer_pid > 0 {
            // A token vanishes as soon as the process's sockets close, which can be long
            // before it has exited: a killed process with a kernel still running stays in
            // the driver's context teardown for seconds. The token also vanishes when the
            // publisher is merely dropped (then its signals still come). So watch the
            // process, off Zenoh's callback thread, for up to DEAD_PUBLISHER_WATCH.
            let spawned = std::thread::Builder::new().name("zcs-dead-publisher".into()).spawn(move || {
                let t = std::time::Instant::now();
                let mut nap = Duration::from_millis(5);
                while t.elapsed() < DEAD_PUBLISHER_WATCH {
                    if crate::host::process_gone(link.peer_pid) {
                        link.release_waiters_of_dead_publisher();
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
    }
    if none_left && sh.plain_listen == PlainListen::Auto {
        sh.set_plain(true);
    }
}

fn handshake(sh: &Arc<Shared>, socket: &str) -> Result<(), String> {
    let name = SocketName::from_key_chunk(socket).map_err(|e| e.to_string())?;
    let conn = ControlConn::connect(&name, sh.handshake_timeout).map_err(|e| e.to_string())?;
    let peer_pid = conn.peer_cred().pid;
    let hello = Request::Hello { subscriber: sh.instance, group: sh.group.clone() };
    conn.send(&protocol::encode(&hello), &[]).map_err(|e| e.to_string())?;
    let mut frame = conn.recv(sh.handshake_timeout).map_err(|e| e.to_string())?;
    let (publisher, holder, cap_key, probe_size, probe_token) =
        match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(|e| e.to_string())? {
            Reply::Welcome { publisher, holder, capability_key, probe_size, probe_token } => {
                (publisher, holder, capability_key, probe_size, probe_token)
            }
            Reply::Refused { reason } => return Err(format!("refused: {reason}")),
            other => return Err(format!("unexpected {other:?}")),
        };
    let probe = frame.fds.pop().ok_or("Welcome without a probe FD")?;
    let probe_size = usize::try_from(probe_size).map_err(|e| e.to_string())?;
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
    let link = Arc::new(Link {
        conn,
        request: Mutex::new(()),
        holder,
        cap_key: CapabilityKey::from_bytes(cap_key),
        signals: link_signals,
        cache: Mutex::new(HashMap::new()),
        alive: AtomicBool::new(true),
        peer_pid,
        awaited: Mutex::new(HashMap::new()),
        unready: Mutex::new(std::collections::HashSet::new()),
        release_stream: match &sh.medium {
            SubMedium::Cuda(gpu) => Some(gpu.new_stream().map_err(|e| e.to_string())?),
            SubMedium::Host => None,
        },
    });
    // Ready to take descriptors *before* the publisher lists us in any.
    {
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.pubs.get_mut(&publisher) {
            Some(e) => e.link = Some(Arc::clone(&link)),
            None => return Err("publisher vanished during the handshake".into()),
        }
    }
    let result = (|| {
        let conn = &link.conn;
        conn.send(&protocol::encode(&Request::Ack { token: Some(probe_token), error: None }), &[])
            .map_err(|e| e.to_string())?;
        // The publisher probes the descriptor route for up to its handshake timeout
        // before answering.
        let frame = conn.recv(sh.handshake_timeout * 2).map_err(|e| e.to_string())?;
        match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(|e| e.to_string())? {
            Reply::Ready => Ok(()),
            Reply::Refused { reason } => Err(format!("refused: {reason}")),
            other => Err(format!("unexpected {other:?}")),
        }
    })();
    if result.is_err() {
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = st.pubs.get_mut(&publisher) {
            e.link = None;
        }
    }
    result
}

fn decode_meta(sample: &Sample) -> Option<BytesHeader> {
    let att = sample.attachment()?;
    protocol::decode_attachment(&att.to_bytes()).ok().flatten()
}

fn on_bytes(sh: &Arc<Shared>, sample: &Sample, plain_key: bool) {
    if sample.kind() != SampleKind::Put {
        return;
    }
    let header = decode_meta(sample);
    let (path, publisher, seq, ts, meta) = match header {
        // Ours, on the plain key: we get it on our own channels instead.
        Some(_) if plain_key => return,
        Some(h) => {
            // Handshaken with this publisher: we hold its key and can tell a forgery.
            let link =
                sh.state.lock().unwrap_or_else(|p| p.into_inner()).pubs.get(&h.publisher).and_then(|e| e.link.clone());
            if let Some(link) = link
                && link.cap_key.bytes_tag(h.publisher, h.seq, sample.payload().len() as u64) != h.tag
            {
                inc(&sh.counters.bad_bytes);
                sh.bad_input.warn("bytes with a forged header dropped", &sample.key_expr());
                return;
            }
            if !sh.first_delivery(h.publisher, h.seq) {
                return;
            }
            (if h.from_block { Path::CpuBytes } else { Path::Inline }, h.publisher, h.seq, h.timestamp_ns, h.meta)
        }
        None if plain_key => (Path::Plain, 0, 0, 0, None),
        None => {
            inc(&sh.counters.bad_bytes);
            sh.bad_input.warn("bytes without a valid header on our channel", &sample.key_expr());
            return;
        }
    };
    match path {
        Path::CpuBytes => inc(&sh.counters.cpu_bytes),
        Path::Inline => inc(&sh.counters.inline),
        _ => inc(&sh.counters.plain),
    }
    let info = SampleInfo { key: sample.key_expr().as_str().to_owned(), publisher, seq, timestamp_ns: ts, path, meta };
    sh.deliver(GpuSample::new(info, Body::Bytes(sample.payload().clone()), sh.medium.clone(), Arc::clone(sh)));
}

fn on_descriptor(sh: &Arc<Shared>, sample: &Sample) {
    if sample.kind() != SampleKind::Put {
        return;
    }
    let bad = |what: &str, detail: &dyn std::fmt::Display| {
        inc(&sh.counters.bad_descriptors);
        sh.bad_input.warn(what, detail);
    };
    let d: Descriptor = match protocol::decode("descriptor", &sample.payload().to_bytes()) {
        Ok(Announce::Block(d)) => d,
        Ok(Announce::Probe { publisher, holder, nonce }) => return on_probe(sh, publisher, holder, nonce),
        Err(e) => return bad("descriptor dropped", &e),
    };
    let link = {
        let st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pubs.get(&d.publisher).and_then(|e| e.link.clone())
    };
    // Not handshaken with this publisher, or not charged for this message: the
    // publisher sends us bytes instead.
    let Some(link) = link else { return };
    if !d.leased.contains(&link.holder) {
        return;
    }
    if link.cap_key.capability(d.block) != d.capability {
        return bad("descriptor with a forged capability dropped", &format_args!("block {:?}", d.block));
    }
    if !sh.first_delivery(d.publisher, d.seq) {
        link.release(d.block);
        return;
    }
    let end = d.offset.checked_add(d.len);
    if end.is_none_or(|e| e > d.block_size) {
        link.release(d.block);
        return bad("descriptor out of its block's bounds", &format_args!("{}+{} > {}", d.offset, d.len, d.block_size));
    }
    let cached = link.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&d.block.id).cloned();
    let imported = match cached {
        Some((alloc, i)) if alloc == d.block.alloc && i.size() as u64 == d.block_size => i,
        _ => match import(sh, &link, &d) {
            Ok(i) => {
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
    inc(&sh.counters.zero_copy);
    let info = SampleInfo {
        key: sh.key.clone(),
        publisher: d.publisher,
        seq: d.seq,
        timestamp_ns: d.timestamp_ns,
        path: Path::ZeroCopy,
        meta: d.meta,
    };
    let zc = ZeroCopy::new(imported, d.block, d.offset as usize, d.len as usize, link, Arc::clone(sh));
    sh.deliver(GpuSample::new(info, Body::ZeroCopy(zc), sh.medium.clone(), Arc::clone(sh)));
}

/// Echoes a handshake probe meant for us over the control socket.
fn on_probe(sh: &Shared, publisher: u64, holder: u64, nonce: u64) {
    let link = {
        let st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pubs.get(&publisher).and_then(|e| e.link.clone())
    };
    if let Some(link) = link.filter(|l| l.holder == holder)
        && let Err(e) = link.conn.send(&protocol::encode(&Request::ProbeSeen { nonce }), &[])
    {
        tracing::debug!(error = %e, "probe echo not sent");
    }
}

fn import(sh: &Shared, link: &Link, d: &Descriptor) -> Result<Imported, String> {
    let (fd, size) = link.request_fd(d.block, d.capability)?;
    if size as u64 != d.block_size {
        return Err(format!("FD of {size} bytes for a {}-byte block", d.block_size));
    }
    match &sh.medium {
        SubMedium::Cuda(gpu) => {
            ImportedBlock::import(gpu, fd, size).map(|b| Imported::Cuda(Arc::new(b))).map_err(|e| e.to_string())
        }
        SubMedium::Host => HostBlock::import(fd, size).map(|b| Imported::Host(Arc::new(b))).map_err(|e| e.to_string()),
    }
}
