//! The publisher side of the transport, one job per file:
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the publisher's state, its declaration (`PublisherCore`), errors |
//! | `stats.rs` | its counters |
//! | `route.rs` | each put routed (`PublisherCore::put_block`, `put_inline`): descriptors, inline, `ViaBytes`, bytes; the one device→host copy |
//! | `bytes_lane.rs` | bytes out through Zenoh in order; a CUDA publisher's copies out put while the next one runs |
//! | `server.rs` | the control socket: accepting subscribers, the handshake, each connection's requests |
//! | `fd.rs` | a block's FD sent: with a connection's first descriptor of it, or when asked |
//! | `host_lane.rs` | host blocks for host-memory subscribers: the copy, and every frame to them in order |
//! | `watch.rs` | a subscriber's death: its lifeline, and its leases held until its process exits |

mod bytes_lane;
mod fd;
mod host_lane;
mod route;
mod server;
mod stats;
mod watch;

use server::serve;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use zenoh::Wait;
use zenoh::key_expr::KeyExpr;
use zenoh::qos::CongestionControl;
use zenoh::sample::SampleKind;

use super::RateLimitedWarn;
use super::medium::{BlockPool, PubMedium};
use super::shm_out::ShmOut;
use crate::config::Congestion;
use crate::host::HostBlock;
use crate::ipc::{AccessPolicy, ControlConn, ControlListener, SocketName};
use crate::pool::{BlockKey, HolderId, StaleError};
use crate::protocol::{self, BytesHeader, Group, Role, Token};
use crate::sync::Unpoisoned;
use bytes_lane::{BytesLane, BytesOut};
use host_lane::HostLane;
pub use stats::{BlockHolder, PublisherStats};
use stats::{Counters, inc};

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
    /// A subscriber of a CUDA publisher that asked for host blocks (its Hello's group is
    /// `host`): every frame goes through the [`HostLane`].
    host: bool,
}

#[derive(Default)]
struct State {
    /// GPU-aware subscribers whose key intersects ours, by instance (from tokens).
    aware: HashMap<u64, Aware>,
    /// Handshaken connections by holder id. Frames are sent to them with this state
    /// locked, so each connection sees messages in sequence order, and `Ready` /
    /// `Left` exactly where its routing starts and ends.
    ready: HashMap<u64, Ready>,
    /// Sequence number of the last message (allocated with the state locked, together
    /// with the routing decision).
    seq: u64,
    /// Sequence number of the last message put as bytes on our channel (decided with
    /// the state locked; the put itself follows).
    aware_bytes_seq: u64,
}

/// A GPU-aware subscriber known from its token.
struct Aware {
    token: Token,
    /// `State::seq` when its token arrived: bytes on our channel of later messages
    /// were meant for it too.
    learned_at: u64,
}

impl State {
    /// The last message put as bytes on our channel since `subscriber`'s token
    /// arrived (0 if none): what `Ready` tells it to wait for before its link delivers.
    fn bytes_through(&self, subscriber: u64) -> u64 {
        match self.aware.get(&subscriber) {
            Some(a) if self.aware_bytes_seq > a.learned_at => self.aware_bytes_seq,
            _ => 0,
        }
    }
}

/// What a publisher's threads share: its key, instance, medium and routing state.
pub(crate) struct Shared {
    /// The key expression it publishes on.
    pub(crate) key: String,
    /// A random id of this publisher, which its loans carry.
    pub(crate) instance: u64,
    pub(crate) group: Group,
    /// What it allocates from.
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
    /// The session's Zenoh SHM pool for copies out, if it has one.
    pub(crate) shm_out: Option<Arc<ShmOut>>,
    /// The largest message Zenoh's receivers take (`transport/link/rx/max_message_size`).
    max_message: usize,
    /// Host blocks for host-memory subscribers (CUDA publishers), made at the first
    /// such subscriber's Hello.
    host_lane: OnceLock<HostLane>,
    host_lane_init: Mutex<()>,
}

impl Shared {
    /// The host lane, made now if this is its first subscriber.
    fn host_lane(self: &Arc<Self>) -> Result<&HostLane, String> {
        let _init = self.host_lane_init.locked();
        if let Some(lane) = self.host_lane.get() {
            return Ok(lane);
        }
        let PubMedium::Cuda { pool, .. } = &self.medium else {
            return Err("a host-memory publisher has no host lane".into());
        };
        let gpu = pool.backend().gpu();
        let key = pool.capability_key().clone();
        let lane = HostLane::new(gpu, pool.config(), key, Arc::downgrade(self))
            .map_err(|e| format!("cannot set up host blocks: {}", crate::error::chain(&*e)))?;
        Ok(self.host_lane.get_or_init(|| lane))
    }

    /// The pool of the blocks a subscriber is served: host blocks (`host`; `None`
    /// before the host lane is made) or our medium's.
    fn pool(&self, host: bool) -> Option<&dyn BlockPool> {
        match host {
            true => self.host_lane.get().map(|l| l.pool() as &dyn BlockPool),
            false => Some(self.medium.pool()),
        }
    }

    /// Both pools: our medium's, and the host lane's once made.
    fn pools(&self) -> impl Iterator<Item = &dyn BlockPool> {
        [self.pool(false), self.pool(true)].into_iter().flatten()
    }

    /// Releases `holder`'s lease on `key`, in the pool of the blocks it is served.
    fn release(&self, host: bool, key: BlockKey, holder: HolderId) -> Result<(), StaleError> {
        let pool = self.pool(host).ok_or(StaleError::NotHeld { id: key.id, holder: holder.get() })?;
        pool.release(key, holder)
    }

    /// Releases every lease of `holder`, in both pools; how many there were.
    fn release_holder(&self, holder: HolderId) -> usize {
        self.pools().map(|p| p.release_holder(holder)).sum()
    }

    /// How many blocks `holder` holds, in both pools.
    fn holds(&self, holder: HolderId) -> usize {
        self.pools().map(|p| p.holds(holder)).sum()
    }
}

/// Why a publisher and a subscriber are not on the zero-copy path, from their groups.
pub(crate) fn path_reason(ours: &Group, theirs: &Group) -> String {
    crate::locality::apart(ours, theirs).unwrap_or_else(|| "same device, handshake not complete or failed".to_owned())
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
    #[error("zenoh put on {key} failed")]
    Zenoh {
        /// The key.
        key: String,
        /// Zenoh's error.
        #[source]
        source: zenoh::Error,
    },
    /// Copying the block out for subscribers that need bytes failed.
    #[error("copying the block out failed")]
    CopyOut(#[from] crate::signal::SignalError),
    /// The loan came from another publisher's pool.
    #[error("the loan came from another publisher than the one on {key}")]
    ForeignLoan {
        /// The key of the publisher asked to put it.
        key: String,
    },
}

/// Fields drop in declaration order: the matching listener before the publisher it
/// listens on, the token before the server thread is stopped (in `Drop`), and the session
/// handle last. When it is the session's last handle its drop closes the session, and a
/// Zenoh publisher undeclared after that stays in the closed session's tables, holding
/// the session: its memory would never be freed (`tests/tests/drop_order.rs`).
pub struct PublisherCore {
    _matching: zenoh::matching::MatchingListener<()>,
    _token: zenoh::liveliness::LivelinessToken,
    _sub_tokens: zenoh::pubsub::Subscriber<()>,
    /// What the publisher's threads share.
    shared: Arc<Shared>,
    /// The bytes lane: emptied (putting what it holds) in `drop`, before anything else.
    lane: BytesLane,
    out: Arc<BytesOut>,
    plain_matching: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
    session: zenoh::Session,
}

/// Declaring a publisher or a subscriber failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeclareError {
    /// The key is not a valid key expression.
    #[error("invalid key expression {key:?}")]
    Key {
        /// The key.
        key: String,
        /// Zenoh's reason.
        #[source]
        source: zenoh::Error,
    },
    /// A publisher's key has wildcards: it must name one key.
    #[error("a publisher's key must name one key, without wildcards: {key:?}")]
    WildcardKey {
        /// The key.
        key: String,
    },
    /// A Zenoh declaration (publisher, subscriber, liveliness token) failed.
    #[error("a Zenoh declaration failed")]
    Zenoh(#[source] zenoh::Error),
    /// The control socket's name (in the configured `socket_dir`) cannot be made.
    #[error("no control socket name in the socket directory")]
    SocketDir(#[from] crate::ipc::RuntimeDirError),
    /// The control socket could not be bound.
    #[error("cannot bind the control socket")]
    Bind(#[from] crate::ipc::BindError),
    /// A host probe block or a thread could not be created.
    #[error("cannot create a host block or a thread")]
    Io(#[from] std::io::Error),
    /// The block pool could not be created.
    #[error("cannot create the block pool")]
    Pool(#[from] crate::pool::PoolError),
    /// The GPU's ready signals or stream could not be set up.
    #[error("cannot set up ready signals on the GPU")]
    Signal(#[from] crate::signal::SignalError),
}

/// What a publisher is declared with; the API layer fills it from the session's
/// configuration.
pub struct PublisherSpec {
    /// The key expression it publishes on (concrete: no wildcards).
    pub key: String,
    /// Where its blocks live (host and device).
    pub group: Group,
    /// What it allocates from.
    pub medium: PubMedium,
    /// Its control socket, open to `policy`.
    pub socket: SocketName,
    /// Who may connect to the control socket.
    pub policy: AccessPolicy,
    /// How long a handshake step waits for the subscriber.
    pub handshake_timeout: Duration,
    /// Zenoh's congestion control for its bytes, and whether puts wait for leases.
    pub congestion: Congestion,
    /// How long a put waits for a subscriber at its lease limit (`Congestion::Block`).
    pub lease_wait: Duration,
    /// The host provider its blocks may be lent by.
    pub provider: Option<protocol::ProviderRef>,
    /// The session's Zenoh SHM pool for copies out, if it has one.
    pub shm_out: Option<Arc<ShmOut>>,
    /// The largest message Zenoh's receivers take.
    pub max_message: usize,
}

impl PublisherCore {
    /// Declares a publisher: its token, its control socket, and the watch of
    /// subscribers' tokens.
    pub fn new(session: &zenoh::Session, spec: PublisherSpec) -> Result<Self, DeclareError> {
        let PublisherSpec {
            key,
            group,
            medium,
            socket,
            policy,
            handshake_timeout,
            congestion,
            lease_wait,
            provider,
            shm_out,
            max_message,
        } = spec;
        let key = key.as_str();
        let ke = KeyExpr::try_from(key.to_owned()).map_err(|source| DeclareError::Key { key: key.into(), source })?;
        // Verbatim chunks are concrete (e.g. the ROS channel `<base>/@zcs_ros2`); only our
        // own `@zcs` space is reserved.
        if key.contains('*') || key.contains('$') || key.split('/').any(|c| c == "@zcs") {
            return Err(DeclareError::WildcardKey { key: key.into() });
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
            shm_out,
            max_message,
            probe_token,
            host_lane: OnceLock::new(),
            host_lane_init: Mutex::new(()),
        });

        let listener = ControlListener::bind_with_policy(&socket, policy)?;
        let s2 = Arc::clone(&shared);
        let server = std::thread::Builder::new().name("zcs-pub-ctl".into()).spawn(move || serve(s2, listener))?;

        let cc = match congestion {
            Congestion::Block => CongestionControl::Block,
            Congestion::Drop => CongestionControl::Drop,
        };
        let plain = session.declare_publisher(ke.clone()).congestion_control(cc).wait().map_err(DeclareError::Zenoh)?;
        let plain_matching =
            Arc::new(AtomicBool::new(plain.matching_status().wait().map_err(DeclareError::Zenoh)?.matching()));
        let pm = Arc::clone(&plain_matching);
        let matching = plain
            .matching_listener()
            .callback(move |m| pm.store(m.matching(), Ordering::Relaxed))
            .wait()
            .map_err(DeclareError::Zenoh)?;
        let aware_bytes = session
            .declare_publisher(protocol::bytes_key(key))
            .congestion_control(cc)
            .wait()
            .map_err(DeclareError::Zenoh)?;

        // GPU-aware subscribers announce themselves; track those whose key meets ours.
        let s3 = Arc::clone(&shared);
        let learn = move |kind: SampleKind, t: Token| {
            let mut st = s3.state.locked();
            match kind {
                SampleKind::Put => {
                    let learned_at = st.seq;
                    st.aware.entry(t.instance).or_insert(Aware { token: t, learned_at });
                }
                SampleKind::Delete => {
                    st.aware.remove(&t.instance);
                }
            }
        };
        // The subscribers already there must be known before the first put. A put before
        // that would reach them neither as bytes on our channel (not known yet) nor on the
        // plain key (they stop listening there once they see this publisher's token), and
        // be lost to them unseen. Which ones exist is asked first (a liveliness query made
        // after the token subscriber below is declared finds none), and the declaration
        // waits until the subscriber's history has brought each of them; one whose token
        // vanished in between is waited for until the handshake timeout.
        let present = super::current_tokens(session, Role::Sub, &ke, handshake_timeout).map_err(DeclareError::Zenoh)?;
        let sub_tokens = super::watch_tokens(session, Role::Sub, ke.clone(), move |kind, t| {
            #[cfg(feature = "fault-injection")]
            if crate::fault::tokens_delayed() {
                let learn = learn.clone();
                return crate::fault::delay_token(Box::new(move || learn(kind, t)));
            }
            learn(kind, t)
        })
        .map_err(DeclareError::Zenoh)?;
        let deadline = Instant::now() + handshake_timeout;
        let known = || {
            let st = shared.state.locked();
            present.iter().all(|t| st.aware.contains_key(&t.instance))
        };
        while !known() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }

        let token =
            Token { role: Role::Pub, key: key.to_owned(), instance, group, socket: Some(socket.to_key_chunk()) };
        let token = session.liveliness().declare_token(token.to_key()).wait().map_err(DeclareError::Zenoh)?;
        let out = Arc::new(BytesOut { plain, aware: aware_bytes, late: RateLimitedWarn::new(Duration::from_secs(5)) });
        let lane = BytesLane::new(Arc::clone(&out), Arc::clone(&shared))?;
        Ok(Self {
            shared,
            session: session.clone(),
            lane,
            out,
            plain_matching,
            _matching: matching,
            _token: token,
            _sub_tokens: sub_tokens,
            server: Some(server),
        })
    }

    /// The key expression it publishes on.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// A random id of this publisher, which its loans carry.
    pub fn instance(&self) -> u64 {
        self.shared.instance
    }

    /// What it allocates from.
    pub fn medium(&self) -> &PubMedium {
        &self.shared.medium
    }

    /// The Zenoh SHM pool copies out land in, if the session has one.
    pub fn shm_out(&self) -> Option<&ShmOut> {
        self.shared.shm_out.as_deref()
    }

    /// The counters of the pool of host blocks (copies for subscribers without a GPU),
    /// once it exists.
    pub fn host_pool_stats(&self) -> Option<crate::pool::PoolStats> {
        self.shared.host_lane.get().map(|l| l.pool().stats())
    }

    /// Whether anyone listens on the plain key.
    pub fn plain_matching(&self) -> bool {
        self.plain_matching.load(Ordering::Relaxed)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.locked()
    }

    /// Reports this publisher while it exists (the session sends such reports to its
    /// provider); `None` once it is gone.
    pub fn reporter(&self) -> impl Fn() -> Option<protocol::PublisherReport> + Send + Sync + 'static {
        let (shared, plain) = (Arc::downgrade(&self.shared), Arc::clone(&self.plain_matching));
        move || {
            let sh = shared.upgrade()?;
            let subscribers = {
                let st = sh.state.locked();
                st.aware
                    .iter()
                    .map(|(i, a)| {
                        let t = &a.token;
                        let ready = st.ready.values().find(|r| r.subscriber == *i);
                        let path = match ready {
                            Some(r) if r.host => "host-block",
                            Some(_) if t.group.device != sh.group.device => "zero-copy-peer",
                            Some(_) => "zero-copy",
                            None => "bytes",
                        };
                        let ready = ready.is_some();
                        protocol::PathReport {
                            peer: *i,
                            path: path.to_owned(),
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

    /// Counters of this publisher.
    pub fn stats(&self) -> PublisherStats {
        self.shared.counters.snapshot()
    }

    /// Number of GPU-ready subscriber connections.
    pub fn ready_count(&self) -> usize {
        self.state().ready.len()
    }

    /// Number of known GPU-aware subscribers.
    pub fn aware_count(&self) -> usize {
        self.state().aware.len()
    }

    /// The Zenoh session it publishes in.
    pub fn session(&self) -> &zenoh::Session {
        &self.session
    }

    /// Puts the end notice (our last sequence number) on our channel, if we published.
    fn put_end(&self) {
        let sh = &self.shared;
        let last = sh.state.locked().seq;
        if last == 0 {
            return;
        }
        let tag = sh.medium.pool().capability_key().end_tag(sh.instance, last);
        let header = BytesHeader {
            publisher: sh.instance,
            seq: last,
            timestamp_ns: crate::now_ns(),
            from_block: false,
            tag,
            meta: None,
        };
        if let Err(e) = self.out.end(&header) {
            tracing::debug!(error = %crate::error::Chain(&e), "no end notice: losses at the end of our stream go uncounted");
        }
    }
}

impl Drop for PublisherCore {
    fn drop(&mut self) {
        // What the bytes lane holds goes out while the publisher is still announced,
        // then the end notice after it.
        self.lane.close();
        self.put_end();
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
    }
}
