//! The publisher side: its liveliness token, the GPU-aware subscribers it knows of,
//! its control server (handshake, FD handout, releases), and the routing of each put.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use zenoh::Wait;
use zenoh::key_expr::KeyExpr;
use zenoh::qos::CongestionControl;
use zenoh::sample::SampleKind;

use super::medium::{PubMedium, PublishedAny};
use super::{RateLimitedWarn, now_ns};
use crate::config::Congestion;
use crate::host::HostBlock;
use crate::ipc::{AccessPolicy, ControlConn, ControlListener, RecvError, SocketName, Watch};
use crate::pool::{HolderId, LeaseError};
use crate::protocol::{self, BytesHeader, Descriptor, Group, Reply, Request, Role, Token};

/// How long a put waits for room in a subscriber's control socket. A subscriber that
/// has not read for this long (its handler is full) is disconnected: nothing more is
/// routed to it (it receives bytes, and it handshakes again on a new connection), but
/// the leases of that connection stay until the subscriber releases them or closes it,
/// so no block is reused under samples it holds or has queued (gap G14). One slow
/// reader never stalls the publisher for longer than this.
const PUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Counters of one publisher. All monotonic.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PublisherStats {
    /// Messages published.
    pub messages: u64,
    /// Messages sent inline (below the threshold, no block).
    pub inline: u64,
    /// Messages announced by descriptor (sent to every subscriber charged a lease).
    pub descriptors: u64,
    /// Leases charged to GPU-ready subscribers.
    pub leases: u64,
    /// Device→host (or block→bytes) copies made for subscribers that needed bytes.
    pub copies_out: u64,
    /// Bytes copied out.
    pub copied_bytes: u64,
    /// Puts of bytes on the plain key.
    pub plain_puts: u64,
    /// Puts of bytes on `<key>/@zcs/b` for GPU-aware subscribers off the zero-copy path.
    pub aware_bytes_puts: u64,
    /// Leases refused by a subscriber's lease limit (it got bytes instead): at once
    /// with congestion `drop`, after waiting `lease_wait_ms` with `block`.
    pub lease_limited: u64,
    /// Puts that waited for a subscriber at its lease limit to release a block
    /// (congestion `block`).
    pub lease_waits: u64,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes refused or failed.
    pub handshake_failures: u64,
    /// FDs handed out on request.
    pub fd_handouts: u64,
    /// FDs sent along with a block's first descriptor on a connection (no request
    /// needed: the subscriber imports on the first frame it sees).
    pub fds_pushed: u64,
    /// FD requests denied (stale or wrong capability).
    pub fd_denied: u64,
    /// Releases that named nothing we lease (stale, duplicate or forged).
    pub bad_releases: u64,
    /// Control connections that ended (each releases every lease it held, at once or,
    /// see `held_until_exit`, when its process exits).
    pub disconnects: u64,
    /// Subscribers disconnected because their control socket stayed full for
    /// `PUSH_TIMEOUT` (1 s) or failed.
    pub slow_disconnects: u64,
    /// Connections that ended, not for breaking the protocol, while their subscriber's
    /// process, still running, held leases: those blocks stay leased until that process
    /// exits, since it may still read them.
    pub held_until_exit: u64,
    /// Subscriber processes whose death their lifeline reported: each connection of
    /// theirs was ended (and its leases released) at once, before the kernel closed it.
    pub lifeline_deaths: u64,
}

#[derive(Default)]
struct Counters {
    messages: AtomicU64,
    inline: AtomicU64,
    descriptors: AtomicU64,
    leases: AtomicU64,
    copies_out: AtomicU64,
    copied_bytes: AtomicU64,
    plain_puts: AtomicU64,
    aware_bytes_puts: AtomicU64,
    lease_limited: AtomicU64,
    lease_waits: AtomicU64,
    handshakes: AtomicU64,
    handshake_failures: AtomicU64,
    fd_handouts: AtomicU64,
    fds_pushed: AtomicU64,
    fd_denied: AtomicU64,
    bad_releases: AtomicU64,
    disconnects: AtomicU64,
    slow_disconnects: AtomicU64,
    held_until_exit: AtomicU64,
    lifeline_deaths: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A GPU-ready subscriber connection.
struct Ready {
    subscriber: u64,
    conn: Arc<ControlConn>,
    /// A put waited `lease_wait` for it in vain: it keeps its samples until newer ones
    /// come (e.g. a ring of the last N frames, N above its lease limit), so waiting
    /// again would stall every put. It gets bytes at its limit, without waiting, until
    /// it holds at most half its limit again.
    lease_stalled: bool,
    /// Blocks whose FD this connection was sent with a descriptor: id → allocation.
    fds_sent: HashMap<u32, u64>,
}

#[derive(Default)]
struct State {
    /// GPU-aware subscribers whose key intersects ours, by instance (from tokens).
    aware: HashMap<u64, Token>,
    /// Handshaken connections by holder id. Frames are sent to them with this state
    /// locked, so each connection sees messages in sequence order, and `Ready` /
    /// `Left` exactly where its routing starts and ends.
    ready: HashMap<u64, Ready>,
    /// Sequence number of the last message (allocated with the state locked, together
    /// with the routing decision).
    seq: u64,
}

impl State {
    /// Sends `frame` to ready holder `h`; on failure stops routing to it, ends the
    /// stream it reads (it then reconnects) and returns false. Its connection thread
    /// keeps taking its releases, and releases the rest when the subscriber closes.
    fn push(&mut self, h: u64, frame: &[u8], c: &Counters) -> bool {
        self.push_with(h, frame, &[], c)
    }

    fn push_with(&mut self, h: u64, frame: &[u8], fds: &[BorrowedFd<'_>], c: &Counters) -> bool {
        let Some(r) = self.ready.get(&h) else { return false };
        match r.conn.send_timeout(frame, fds, PUSH_TIMEOUT) {
            Ok(()) => true,
            Err(e) => {
                let subscriber = super::Id(r.subscriber);
                tracing::warn!(%subscriber, error = %e, "subscriber not reading its control socket; disconnecting it");
                r.conn.shutdown_write();
                self.ready.remove(&h);
                inc(&c.slow_disconnects);
                false
            }
        }
    }

    /// Whether a GPU-aware subscriber is off the zero-copy path (needs bytes).
    fn aware_needs_bytes(&self) -> bool {
        self.aware.keys().any(|i| !self.ready.values().any(|r| r.subscriber == *i))
    }
}

pub(crate) struct Shared {
    pub(crate) key: String,
    pub(crate) instance: u64,
    pub(crate) group: Group,
    pub(crate) medium: PubMedium,
    state: Mutex<State>,
    counters: Counters,
    next_holder: AtomicU64,
    stop: AtomicBool,
    handshake_timeout: Duration,
    /// How long a put waits for a subscriber at its lease limit (zero with
    /// `Congestion::Drop`).
    lease_wait: Duration,
    bad_input: RateLimitedWarn,
    probe: Option<HostBlock>,
    probe_token: u64,
    /// The host provider our blocks may be lent by (named in `Welcome`).
    provider: Option<protocol::ProviderRef>,
}

/// Why a publisher and a subscriber are not on the zero-copy path, from their groups.
pub(crate) fn path_reason(ours: &Group, theirs: &Group) -> String {
    if ours.boot_id != theirs.boot_id {
        "on another host".to_owned()
    } else if ours.device != theirs.device {
        format!("on another device ({} there, {} here)", theirs.device, ours.device)
    } else {
        "same device, handshake not complete or failed".to_owned()
    }
}

/// Result of one put, for callers and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutReport {
    /// The message's sequence number.
    pub seq: u64,
    /// Subscribers charged a lease (zero-copy receivers).
    pub zero_copy: usize,
    /// Whether bytes were copied out of the block.
    pub copied_out: bool,
    /// Whether bytes went to the plain key.
    pub plain: bool,
    /// Whether bytes went to GPU-aware subscribers off the zero-copy path.
    pub aware_bytes: bool,
}

/// A put failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PutError {
    /// Zenoh refused the put.
    #[error("zenoh put on {key} failed: {detail}")]
    Zenoh {
        /// The key.
        key: String,
        /// Zenoh's error text.
        detail: String,
    },
    /// Copying the block out for subscribers that need bytes failed.
    #[error("copying the block out failed")]
    CopyOut(#[from] crate::signal::SignalError),
}

/// Fields drop in declaration order: the matching listener before the publisher it
/// listens on, the token before the server thread is stopped (in `Drop`), and the session
/// handle last. When it is the session's last handle its drop closes the session, and a
/// Zenoh publisher undeclared after that stays in the closed session's tables, holding
/// the session: its memory would never be freed (`tests/tests/drop_order.rs`).
pub(crate) struct PublisherCore {
    _matching: zenoh::matching::MatchingListener<()>,
    _token: zenoh::liveliness::LivelinessToken,
    _sub_tokens: zenoh::pubsub::Subscriber<()>,
    pub(crate) shared: Arc<Shared>,
    plain: zenoh::pubsub::Publisher<'static>,
    aware_bytes: zenoh::pubsub::Publisher<'static>,
    plain_matching: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
    session: zenoh::Session,
}

/// Creating a publisher failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeclareError {
    /// The key is not a valid concrete key expression.
    #[error("invalid publisher key {key:?}: {detail}")]
    Key {
        /// The key.
        key: String,
        /// Why.
        detail: String,
    },
    /// A Zenoh declaration failed.
    #[error("zenoh declaration failed: {0}")]
    Zenoh(String),
    /// The control socket could not be bound.
    #[error("control socket")]
    Bind(#[from] crate::ipc::BindError),
    /// A host probe block or thread could not be created.
    #[error("I/O")]
    Io(#[from] std::io::Error),
    /// The pool could not be created.
    #[error("pool")]
    Pool(#[from] crate::pool::PoolError),
    /// CUDA setup failed.
    #[error("CUDA")]
    Signal(#[from] crate::signal::SignalError),
}

fn zerr(e: impl std::fmt::Display) -> DeclareError {
    DeclareError::Zenoh(e.to_string())
}

impl PublisherCore {
    #[allow(clippy::too_many_arguments)] // one call site, in api.rs
    pub(crate) fn new(
        session: &zenoh::Session,
        key: &str,
        group: Group,
        medium: PubMedium,
        socket: SocketName,
        policy: AccessPolicy,
        handshake_timeout: Duration,
        congestion: Congestion,
        lease_wait: Duration,
        provider: Option<protocol::ProviderRef>,
    ) -> Result<Self, DeclareError> {
        let ke = KeyExpr::try_from(key.to_owned())
            .map_err(|e| DeclareError::Key { key: key.into(), detail: e.to_string() })?;
        // Verbatim chunks are concrete (e.g. the ROS channel `<base>/@zcs_ros2`); only our
        // own `@zcs` space is reserved.
        if key.contains('*') || key.contains('$') || key.split('/').any(|c| c == "@zcs") {
            return Err(DeclareError::Key { key: key.into(), detail: "a publisher key must be concrete".into() });
        }
        let instance = rand::random::<u64>() | 1;
        let (probe, probe_token) = match &medium {
            PubMedium::Host { .. } => {
                let token = rand::random::<u64>();
                let b = HostBlock::create(c"zcs-probe", 4096)?;
                // SAFETY: the probe block is 4096 bytes, mapped read-write, and not yet
                // shared with anyone.
                unsafe { (b.as_ptr() as *mut u64).write(token) };
                (Some(b), token)
            }
            PubMedium::Cuda { .. } => (None, 0),
        };
        let shared = Arc::new(Shared {
            key: key.to_owned(),
            instance,
            group: group.clone(),
            medium,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            next_holder: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            handshake_timeout,
            lease_wait: if congestion == Congestion::Block { lease_wait } else { Duration::ZERO },
            bad_input: RateLimitedWarn::new(Duration::from_secs(5)),
            probe,
            provider,
            probe_token,
        });

        let listener = ControlListener::bind_with_policy(&socket, policy)?;
        let s2 = Arc::clone(&shared);
        let server = std::thread::Builder::new().name("zcs-pub-ctl".into()).spawn(move || serve(s2, listener))?;

        let cc = match congestion {
            Congestion::Block => CongestionControl::Block,
            Congestion::Drop => CongestionControl::Drop,
        };
        let plain = session.declare_publisher(ke.clone()).congestion_control(cc).wait().map_err(zerr)?;
        let plain_matching = Arc::new(AtomicBool::new(plain.matching_status().wait().map_err(zerr)?.matching()));
        let pm = Arc::clone(&plain_matching);
        let matching = plain
            .matching_listener()
            .callback(move |m| pm.store(m.matching(), Ordering::Relaxed))
            .wait()
            .map_err(zerr)?;
        let aware_bytes =
            session.declare_publisher(protocol::bytes_key(key)).congestion_control(cc).wait().map_err(zerr)?;

        // GPU-aware subscribers announce themselves; track those whose key meets ours.
        let s3 = Arc::clone(&shared);
        let sub_tokens = super::watch_tokens(session, Role::Sub, ke.clone(), move |kind, t| {
            let mut st = s3.state.lock().unwrap_or_else(|p| p.into_inner());
            match kind {
                SampleKind::Put => {
                    st.aware.insert(t.instance, t);
                }
                SampleKind::Delete => {
                    st.aware.remove(&t.instance);
                }
            }
        })
        .map_err(zerr)?;

        let token =
            Token { role: Role::Pub, key: key.to_owned(), instance, group, socket: Some(socket.to_key_chunk()) };
        let token = session.liveliness().declare_token(token.to_key()).wait().map_err(zerr)?;
        Ok(Self {
            shared,
            session: session.clone(),
            plain,
            aware_bytes,
            plain_matching,
            _matching: matching,
            _token: token,
            _sub_tokens: sub_tokens,
            server: Some(server),
        })
    }

    /// Whether anyone listens on the plain key.
    pub(crate) fn plain_matching(&self) -> bool {
        self.plain_matching.load(Ordering::Relaxed)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put_bytes(
        &self,
        bytes: zenoh::bytes::ZBytes,
        header: &BytesHeader,
        to_aware: bool,
        to_plain: bool,
    ) -> Result<(), PutError> {
        let att = protocol::encode_attachment(header);
        let c = &self.shared.counters;
        if to_aware {
            self.aware_bytes
                .put(bytes.clone())
                .attachment(att.clone())
                .wait()
                .map_err(|e| PutError::Zenoh { key: protocol::bytes_key(&self.shared.key), detail: e.to_string() })?;
            inc(&c.aware_bytes_puts);
        }
        if to_plain {
            self.plain
                .put(bytes)
                .attachment(att)
                .wait()
                .map_err(|e| PutError::Zenoh { key: self.shared.key.clone(), detail: e.to_string() })?;
            inc(&c.plain_puts);
        }
        Ok(())
    }

    /// Publishes small host bytes inline: carried whole over the control connection of
    /// every GPU-ready subscriber (when the frame fits), as bytes through Zenoh to
    /// everyone else.
    pub(crate) fn put_inline(&self, data: Vec<u8>, meta: protocol::Meta) -> Result<PutReport, PutError> {
        let sh = &self.shared;
        let c = &sh.counters;
        let ts = now_ns();
        let (seq, to_aware, data, meta) = {
            let mut st = self.state();
            st.seq += 1;
            let seq = st.seq;
            let mut to_aware = st.aware_needs_bytes();
            if st.ready.is_empty() {
                (seq, to_aware, data, meta)
            } else {
                // Encoded from the message itself, which is taken back for the bytes path.
                let inline = Reply::Inline { seq, timestamp_ns: ts, meta, data };
                let mut frame = protocol::encode(&inline);
                let Reply::Inline { data, meta, .. } = inline else { unreachable!("built just above") };
                if frame.len() > crate::ipc::MAX_FRAME_BYTES {
                    to_aware = true;
                    frame = protocol::encode(&Reply::ViaBytes { seq });
                }
                let holders: Vec<u64> = st.ready.keys().copied().collect();
                for h in holders {
                    st.push(h, &frame, c);
                }
                (seq, to_aware, data, meta)
            }
        };
        inc(&c.messages);
        inc(&c.inline);
        let to_plain = self.plain_matching();
        let tag = sh.medium.capability_key().bytes_tag(sh.instance, seq, data.len() as u64);
        let header = BytesHeader { publisher: sh.instance, seq, timestamp_ns: ts, from_block: false, tag, meta };
        self.put_bytes(data.into(), &header, to_aware, to_plain)?;
        Ok(PutReport { seq, zero_copy: 0, copied_out: false, plain: to_plain, aware_bytes: to_aware })
    }

    /// Publishes a written block: a descriptor to every GPU-ready subscriber over its
    /// control connection (its lease charged first), bytes to everyone else, copied out
    /// once and only if someone needs them.
    pub(crate) fn put_block(&self, published: PublishedAny, meta: protocol::Meta) -> Result<PutReport, PutError> {
        let sh = &self.shared;
        let c = &sh.counters;
        if !sh.lease_wait.is_zero() {
            self.wait_for_lease_room(&published);
        }
        let ts = now_ns();
        let len = published.len();
        let (seq, zero_copy, aware_need_bytes) = {
            let mut st = self.state();
            st.seq += 1;
            let seq = st.seq;
            let mut aware_need_bytes = st.aware_needs_bytes();
            let mut zero_copy = 0;
            if !st.ready.is_empty() {
                let block = published.key();
                let d = Descriptor {
                    publisher: sh.instance,
                    seq,
                    block,
                    capability: published.capability(),
                    block_size: published.block_size() as u64,
                    offset: 0,
                    len: len as u64,
                    timestamp_ns: ts,
                    meta: meta.clone(),
                    lent: published.lent(),
                };
                let descriptor = protocol::encode(&Reply::Block(d));
                let via_bytes = || protocol::encode(&Reply::ViaBytes { seq });
                let holders: Vec<u64> = st.ready.keys().copied().collect();
                // A connection gets a block's FD with its first descriptor of it (our
                // own blocks: a lent one is opened at the provider), which spares the
                // subscriber an `Fd` round trip before its first read of the block.
                let own_fd = published.own_fd();
                for h in holders {
                    match published.lease(HolderId::new(h)) {
                        Ok(()) => {
                            // Marked before the send: a failed send drops the whole entry.
                            let fd = own_fd.filter(|_| {
                                st.ready
                                    .get_mut(&h)
                                    .is_some_and(|r| r.fds_sent.insert(block.id, block.alloc) != Some(block.alloc))
                            });
                            if st.push_with(h, &descriptor, fd.as_slice(), c) {
                                zero_copy += 1;
                                if fd.is_some() {
                                    inc(&c.fds_pushed);
                                }
                            } else {
                                // Never sent: nobody will release it.
                                let _ = sh.medium.release(block, HolderId::new(h));
                            }
                        }
                        Err(LeaseError::HolderLimit { .. }) => {
                            inc(&c.lease_limited);
                            aware_need_bytes = true;
                            st.push(h, &via_bytes(), c);
                        }
                        // Its connection is ending: nobody to serve or charge.
                        Err(LeaseError::Departed { .. }) => {}
                    }
                }
            }
            (seq, zero_copy, aware_need_bytes)
        };
        inc(&c.messages);
        c.leases.fetch_add(zero_copy as u64, Ordering::Relaxed);
        if zero_copy > 0 {
            inc(&c.descriptors);
        }
        let to_plain = self.plain_matching();
        let copied_out = to_plain || aware_need_bytes;
        if copied_out {
            let bytes = sh.medium.copy_out(&published, 0, len)?;
            inc(&c.copies_out);
            c.copied_bytes.fetch_add(len as u64, Ordering::Relaxed);
            let tag = sh.medium.capability_key().bytes_tag(sh.instance, seq, len as u64);
            let header = BytesHeader { publisher: sh.instance, seq, timestamp_ns: ts, from_block: true, tag, meta };
            self.put_bytes(bytes, &header, aware_need_bytes, to_plain)?;
        }
        drop(published);
        Ok(PutReport { seq, zero_copy, copied_out, plain: to_plain, aware_bytes: aware_need_bytes })
    }

    /// With congestion `block`, a subscriber at its lease limit slows the publisher as a
    /// full queue does: wait (at most `lease_wait_ms`) for it to release a block rather
    /// than copy this message out for it (a 33 MB frame costs ~10 ms to copy out, the
    /// time of hundreds of zero-copy frames). The wait is outside the state lock, so
    /// releases, handshakes and departures go on meanwhile; a holder still at its limit
    /// afterwards is served bytes by `put_block`.
    fn wait_for_lease_room(&self, published: &PublishedAny) {
        let holders: Vec<(u64, bool)> = self.state().ready.iter().map(|(h, r)| (*h, r.lease_stalled)).collect();
        let deadline = Instant::now() + self.shared.lease_wait;
        let mut waited = false;
        let set_stalled = |h: u64, on: bool| {
            if let Some(r) = self.state().ready.get_mut(&h) {
                r.lease_stalled = on;
            }
        };
        for (h, stalled) in holders {
            let holder = HolderId::new(h);
            if stalled {
                let (held, limit) = published.holds_of(holder);
                if held <= limit / 2 {
                    set_stalled(h, false);
                }
                continue;
            }
            match published.wait_lease_room(holder, deadline) {
                Ok(w) => waited |= w,
                Err(_) => {
                    waited = true;
                    tracing::debug!(holder = h, "subscriber kept its lease limit for the whole wait; bytes for now");
                    set_stalled(h, true);
                }
            }
        }
        if waited {
            inc(&self.shared.counters.lease_waits);
        }
    }

    /// Reports this publisher while it exists (the session sends such reports to its
    /// provider); `None` once it is gone.
    pub(crate) fn reporter(&self) -> impl Fn() -> Option<protocol::PublisherReport> + Send + Sync + 'static {
        let (shared, plain) = (Arc::downgrade(&self.shared), Arc::clone(&self.plain_matching));
        move || {
            let sh = shared.upgrade()?;
            let subscribers = {
                let st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
                st.aware
                    .iter()
                    .map(|(i, t)| {
                        let ready = st.ready.values().any(|r| r.subscriber == *i);
                        protocol::PathReport {
                            peer: *i,
                            path: if ready { "zero-copy" } else { "bytes" }.to_owned(),
                            reason: (!ready).then(|| path_reason(&sh.group, &t.group)),
                        }
                    })
                    .collect()
            };
            let c = &sh.counters;
            let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
            Some(protocol::PublisherReport {
                key: sh.key.clone(),
                instance: sh.instance,
                device: sh.group.device.clone(),
                subscribers,
                plain_listeners: plain.load(Ordering::Relaxed),
                messages: l(&c.messages),
                copies_out: l(&c.copies_out),
                copied_bytes: l(&c.copied_bytes),
                lease_limited: l(&c.lease_limited),
            })
        }
    }

    pub(crate) fn stats(&self) -> PublisherStats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PublisherStats {
            messages: l(&c.messages),
            inline: l(&c.inline),
            descriptors: l(&c.descriptors),
            leases: l(&c.leases),
            copies_out: l(&c.copies_out),
            copied_bytes: l(&c.copied_bytes),
            plain_puts: l(&c.plain_puts),
            aware_bytes_puts: l(&c.aware_bytes_puts),
            lease_limited: l(&c.lease_limited),
            lease_waits: l(&c.lease_waits),
            handshakes: l(&c.handshakes),
            handshake_failures: l(&c.handshake_failures),
            fd_handouts: l(&c.fd_handouts),
            fds_pushed: l(&c.fds_pushed),
            fd_denied: l(&c.fd_denied),
            bad_releases: l(&c.bad_releases),
            disconnects: l(&c.disconnects),
            slow_disconnects: l(&c.slow_disconnects),
            held_until_exit: l(&c.held_until_exit),
            lifeline_deaths: l(&c.lifeline_deaths),
        }
    }

    /// Number of GPU-ready subscriber connections.
    pub(crate) fn ready_count(&self) -> usize {
        self.state().ready.len()
    }

    /// Number of known GPU-aware subscribers.
    pub(crate) fn aware_count(&self) -> usize {
        self.state().aware.len()
    }

    pub(crate) fn session(&self) -> &zenoh::Session {
        &self.session
    }
}

impl Drop for PublisherCore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
    }
}

/// Serves control connections until stopped; one thread per connection (and one
/// [`Watcher`] of the subscriber's lifeline).
///
/// The thread that accepts a connection serves it: one acceptor waits in `accept` at a
/// time, and once it has a connection this thread starts the next acceptor while it
/// handshakes. A joining subscriber's handshake therefore waits neither for a thread to
/// be created nor for a handover between threads (each costs about 100 µs of the first
/// message's latency on a busy or virtualised host).
fn serve(sh: Arc<Shared>, listener: ControlListener) {
    let listener = Arc::new(listener);
    let (accepted_tx, accepted) = mpsc::channel::<()>();
    let mut workers: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while !sh.stop.load(Ordering::Relaxed) {
        let (s2, l2, tx) = (Arc::clone(&sh), Arc::clone(&listener), accepted_tx.clone());
        match std::thread::Builder::new().name("zcs-pub-conn".into()).spawn(move || accept_and_serve(&s2, &l2, &tx)) {
            Ok(t) => workers.push(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot spawn a control connection thread");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        // Until that acceptor has its connection (or we stop).
        while !sh.stop.load(Ordering::Relaxed) {
            match accepted.recv_timeout(Duration::from_millis(50)) {
                Err(mpsc::RecvTimeoutError::Timeout) => workers.retain(|t| !t.is_finished()),
                // Disconnected cannot happen: we hold a sender.
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        workers.retain(|t| !t.is_finished());
    }
    for t in workers {
        let _ = t.join();
    }
}

/// Accepts one connection (or gives up once stopped), says so, and serves it.
fn accept_and_serve(sh: &Arc<Shared>, listener: &ControlListener, accepted: &mpsc::Sender<()>) {
    while !sh.stop.load(Ordering::Relaxed) {
        match listener.accept_timeout(Duration::from_millis(50)) {
            Ok(conn) => {
                crate::transport::step!("publisher: connection accepted");
                let _ = accepted.send(());
                return connection(Arc::clone(sh), conn);
            }
            Err(crate::ipc::AcceptError::Timeout(_)) => {}
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn send_reply(conn: &ControlConn, r: &Reply, fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
    match conn.send(&protocol::encode(r), fds) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "control send failed");
            false
        }
    }
}

/// Why no request came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoRequest {
    Timeout,
    /// The connection ended (closed, shut down or failed).
    Ended,
    /// The peer broke the frame rules or sent something undecodable.
    Violation,
}

fn recv_request(sh: &Shared, conn: &ControlConn, timeout: Duration) -> Result<Request, NoRequest> {
    recv_request_with_fds(sh, conn, timeout).map(|(r, _)| r)
}

/// A request and the descriptors that came with it.
fn recv_request_with_fds(
    sh: &Shared,
    conn: &ControlConn,
    timeout: Duration,
) -> Result<(Request, Vec<std::os::fd::OwnedFd>), NoRequest> {
    match conn.recv(timeout) {
        Ok(frame) => match protocol::decode::<Request>("control request", &frame.bytes) {
            Ok(r) => Ok((r, frame.fds)),
            Err(e) => {
                sh.bad_input.warn("malformed control request; closing the connection", &e);
                Err(NoRequest::Violation)
            }
        },
        Err(RecvError::Timeout(_)) => Err(NoRequest::Timeout),
        Err(e @ (RecvError::Closed | RecvError::Sys { .. })) => {
            tracing::debug!(error = %e, "control connection ended");
            Err(NoRequest::Ended)
        }
        Err(e) => {
            sh.bad_input.warn("control frame against the rules; closing the connection", &e);
            Err(NoRequest::Violation)
        }
    }
}

/// One subscriber connection: handshake, then FD requests and releases until it ends.
fn connection(sh: Arc<Shared>, conn: ControlConn) {
    let conn = Arc::new(conn);
    let c = &sh.counters;
    let peer = conn.peer_cred();
    let holder = sh.next_holder.fetch_add(1, Ordering::Relaxed);
    let fail = |why: &str| {
        inc(&c.handshake_failures);
        tracing::debug!(pid = peer.pid, uid = peer.uid, why, "handshake failed");
        let _ = send_reply(&conn, &Reply::Refused { reason: why.into() }, &[]);
    };
    let (subscriber, lifeline) = match recv_request_with_fds(&sh, &conn, sh.handshake_timeout) {
        Ok((Request::Hello { subscriber, group, lifeline }, mut fds)) if group == sh.group => {
            if fds.len() != usize::from(lifeline) {
                return fail("a Hello carries its lifeline's descriptor and nothing else");
            }
            (subscriber, fds.pop())
        }
        Ok((Request::Hello { .. }, _)) => return fail("different locality group"),
        Ok(_) => return fail("expected Hello"),
        Err(_) => return fail("no Hello"),
    };
    crate::transport::step!("publisher: Hello received");
    // Checked here, so that a bad lifeline is refused at the Hello; watched only once
    // leases can exist (after Ready), keeping a thread start off the join's path.
    let lifeline = match lifeline.map(Watch::new).transpose() {
        Ok(w) => w,
        Err(e) => return fail(&format!("lifeline refused: {e}")),
    };
    let (probe_fd, probe_size) = match (&sh.medium, &sh.probe) {
        (PubMedium::Cuda { signals, .. }, _) => (signals.fd().expect("our own signal block"), signals.size()),
        (PubMedium::Host { .. }, Some(p)) => (p.fd(), p.size()),
        (PubMedium::Host { .. }, None) => unreachable!("host publishers always have a probe"),
    };
    let welcome = Reply::Welcome {
        publisher: sh.instance,
        holder,
        capability_key: sh.medium.capability_key().to_bytes(),
        probe_size: probe_size as u64,
        probe_token: sh.probe_token,
        provider: sh.provider.clone(),
    };
    if !send_reply(&conn, &welcome, &[probe_fd.as_fd()]) {
        return fail("send Welcome");
    }
    match recv_request(&sh, &conn, sh.handshake_timeout) {
        Ok(Request::Ack { token: Some(t), .. })
            if matches!(sh.medium, PubMedium::Cuda { .. }) || t == sh.probe_token => {}
        Ok(Request::Ack { error, .. }) => return fail(&format!("probe import failed: {}", error.unwrap_or_default())),
        _ => return fail("expected Ack"),
    }
    crate::transport::step!("publisher: Ack received");
    // Routing starts here: `Ready` names the first message routed over this connection
    // and goes out with the state locked, so no put can slip in between.
    {
        let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
        if !send_reply(&conn, &Reply::Ready { first_seq: st.seq + 1 }, &[]) {
            drop(st);
            return fail("send Ready");
        }
        let r = Ready { subscriber, conn: Arc::clone(&conn), lease_stalled: false, fds_sent: HashMap::new() };
        st.ready.insert(holder, r);
    }
    crate::transport::step!("publisher: Ready sent, routing");
    // From here on the subscriber's death ends this connection at once, not when the
    // kernel closes its end (a word already released is seen at the first look).
    let watcher = lifeline.and_then(|w| Watcher::spawn(w, &conn, &sh));
    inc(&c.handshakes);
    tracing::debug!(pid = peer.pid, subscriber = %super::Id(subscriber), holder, "subscriber is GPU-ready");
    // The peer broke the protocol: it is cut off and its leases go at once.
    let mut violation = false;
    loop {
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        match recv_request(&sh, &conn, Duration::from_millis(100)) {
            Ok(Request::Fd { block, capability }) => {
                let sent = sh.medium.with_handout(block, capability, |fd, size| {
                    send_reply(&conn, &Reply::Fd { block, size: size as u64 }, &[fd])
                });
                // After a slow disconnect our side no longer sends (SHUT_WR): a request
                // it still makes cannot be answered, and must not end the connection,
                // whose leases stay until the subscriber releases them or closes.
                let disconnected = || !sh.state.lock().unwrap_or_else(|p| p.into_inner()).ready.contains_key(&holder);
                match sent {
                    Ok(true) => inc(&c.fd_handouts),
                    Ok(false) if disconnected() => {}
                    Ok(false) => break,
                    Err(e) => {
                        inc(&c.fd_denied);
                        sh.bad_input.warn("FD request denied", &e);
                        if !send_reply(&conn, &Reply::FdDenied { block, reason: e.to_string() }, &[]) && !disconnected()
                        {
                            break;
                        }
                    }
                }
            }
            Ok(Request::Release { blocks }) => {
                for b in blocks {
                    if let Err(e) = sh.medium.release(b, HolderId::new(holder)) {
                        inc(&c.bad_releases);
                        sh.bad_input.warn("release of a block not leased to this subscriber", &e);
                    }
                }
            }
            Ok(Request::Leave) => {
                // Routing ends here: `Left` is the last routed frame. Leases still held
                // stay until released or until the connection ends.
                let mut st = sh.state.lock().unwrap_or_else(|p| p.into_inner());
                st.ready.remove(&holder);
                if !send_reply(&conn, &Reply::Left, &[]) {
                    break;
                }
            }
            Ok(other) => {
                sh.bad_input.warn("unexpected control request; closing", &format!("{other:?}"));
                violation = true;
                break;
            }
            Err(NoRequest::Timeout) => {}
            Err(NoRequest::Ended) => break,
            Err(NoRequest::Violation) => {
                violation = true;
                break;
            }
        }
    }
    sh.state.lock().unwrap_or_else(|p| p.into_inner()).ready.remove(&holder);
    let died = watcher.as_ref().is_some_and(Watcher::died);
    if !violation && !died {
        hold_until_exit(&sh, holder, &conn);
    }
    let dropped = sh.medium.release_holder(HolderId::new(holder));
    drop(watcher);
    inc(&c.disconnects);
    tracing::debug!(subscriber = %super::Id(subscriber), dropped, died, "subscriber connection closed; its leases are released");
}

/// Watches a subscriber's lifeline for as long as its connection is served: the
/// process's death shuts the connection down (the connection thread then ends it and
/// releases its leases). Dropping it stops and joins the thread (woken at once).
struct Watcher {
    watch: Arc<Watch>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// `None` if no thread can be started: the connection's end then tells the death.
    fn spawn(watch: Watch, conn: &Arc<ControlConn>, sh: &Arc<Shared>) -> Option<Self> {
        let (watch, stop) = (Arc::new(watch), Arc::new(AtomicBool::new(false)));
        let (w, s, conn, sh) = (Arc::clone(&watch), Arc::clone(&stop), Arc::clone(conn), Arc::clone(sh));
        let thread = std::thread::Builder::new().name("zcs-pub-life".into()).spawn(move || match w.wait(&s) {
            Ok(true) => {
                inc(&sh.counters.lifeline_deaths);
                tracing::debug!(pid = conn.peer_cred().pid, "a subscriber's process died; ending its connection");
                conn.shutdown();
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot wait on a subscriber's lifeline; its connection's end will tell")
            }
        });
        match thread {
            Ok(t) => Some(Self { watch, stop, thread: Some(t) }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a lifeline watcher; the connection's end will tell");
                None
            }
        }
    }

    fn died(&self) -> bool {
        self.watch.died()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.watch.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long a connection that ended with leases waits for its process's exit before it
/// counts the process as running on: a dying process closes its descriptors a moment
/// before the kernel reports its exit.
const EXIT_GRACE: Duration = Duration::from_millis(50);

/// A connection ended with leases outstanding. Normally its process died (its
/// descriptors close as it exits). If that process still runs, it may still map those
/// blocks and read samples of them (it shut its end of the connection by mistake, or
/// our answer to its `Fd` request could not be sent): releasing them would let the pool
/// hand them out under its reads. They stay leased until it exits or this publisher
/// closes (G14). Not called for a peer that broke the protocol (cut off, its leases
/// released at once) or whose lifeline told its death, nor where the peer's process
/// cannot be watched (another PID namespace, or already gone: released at once).
fn hold_until_exit(sh: &Shared, holder: u64, conn: &ControlConn) {
    let holds = sh.medium.holds(HolderId::new(holder));
    if holds == 0 || sh.stop.load(Ordering::Relaxed) {
        return;
    }
    // Opened only now (no descriptor per connection). The kernel's pidfd names the
    // process that connected even after its death; the fallback opens its pid, which a
    // process that just died cannot have passed on yet (it fails: gone).
    let Some(p) = conn.peer_process() else { return };
    if p.wait_exit(EXIT_GRACE) != Ok(false) {
        return;
    }
    let peer = conn.peer_cred();
    inc(&sh.counters.held_until_exit);
    sh.bad_input.warn(
        "a subscriber process closed its control connection while holding leases and runs on; \
         its blocks stay leased until it exits",
        &format_args!("pid {} uid {}, {holds} blocks", peer.pid, peer.uid),
    );
    // Each turn blocks in poll(2) on the pidfd for up to 100 ms; a pidfd that cannot be
    // polled ends the wait (the leases go, as without a pidfd).
    while !sh.stop.load(Ordering::Relaxed) {
        match p.wait_exit(Duration::from_millis(100)) {
            Ok(false) => {}
            Ok(true) => break,
            Err(e) => {
                tracing::warn!(pid = peer.pid, error = %e, "cannot watch a subscriber's process; releasing its leases");
                break;
            }
        }
    }
}
