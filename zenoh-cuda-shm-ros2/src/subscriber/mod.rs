//! A ROS subscription that takes the zero-copy channel from our publishers, the base
//! key from every other ROS publisher, and `<base key>/_buf_cpu` from buffer-aware
//! rmw_zenoh publishers (0.10.5 / 0.12.0 and later), which serve CPU-only buffer-aware
//! subscriptions there and nowhere else.
//!
//! Every path carries the rmw_zenoh attachment of each message (inside the envelope on
//! our channel), so a message is identified by `(GID, sequence number)` on any. A
//! message is delivered once, by whichever path brings it first; other copies are
//! dropped and counted. Our publishers put the channel copy first, so while they also
//! serve ordinary subscribers the zero-copy copy is the one kept. No switch-over can
//! lose a message: nothing is dropped that was not delivered already.
//!
//! A volatile subscription of a `uint8[]` type in a session on a GPU, on the
//! buffer-aware wire, lists ROS 2's CUDA buffer backend instead (see
//! [`NodeOptions::cuda_buffers`](crate::NodeOptions::cuda_buffers)): buffer-aware
//! publishers then serve it on `<base key>/_buf/<its GID>`, not `_buf_cpu`. There a
//! CUDA publisher's descriptor is imported (on a thread of the subscription, off
//! Zenoh's) and delivered as a sample of our channel read in place; CDR is delivered as
//! from the base key; a descriptor that cannot be imported is counted
//! ([`RosSubscriberStats::backend_refused`]) with its reason
//! ([`RosSubscriber::backend_refusal`]).
//!
//! Losses: a gap in a publisher's sequence numbers after its first delivered message
//! counts as lost, and a late message that fills a gap takes it back. A tail that
//! nothing follows shows when one of our publishers is dropped: its end notice on
//! `<base key>/@zcs_ros2_end` names its last sequence number (rmw_zenoh publishers send
//! none). Buffer-aware
//! rmw_zenoh publishers number each *put* (one message to `_buf_cpu` and to N other
//! keys uses N+1 numbers), so their gaps are not losses: a publisher is taken for one
//! of them once a message of its arrives on `_buf_cpu` or `_buf/<our GID>`.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the subscription: its keys, tokens, registry entry, `recv` and counters |
//! | `receive.rs` | each key's samples turned into messages, and the counters they bump |
//! | `dedup.rs` | exactly once per `(GID, sequence number)`, and losses |
//! | `sample.rs` | [`RosSample`], a received message |

mod dedup;
mod receive;
mod sample;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zenoh::Wait;

use super::cuda_backend::{Registration, imports_for, spawn_importer};
use super::graph::marker_token;
use super::message::RosDataMessage;
use super::names::{Durability, EntityKind, History, Qos, Reliability, gid_hex};
use super::node::{Endpoint, RosDeclareError, RosNode};
use super::silence::{SilentPublisher, Subject, Watch};
use super::{buf_cpu_key, channel_key, end_key};
use crate::api::{GpuSubscriber, RecvError};
use crate::config::PlainListen;
use crate::sync::Unpoisoned;
use crate::transport::subscriber::spin::{SpinWindow, count_polled, recv_queue};
pub use receive::KEEP_ALL_WARN;
use receive::{Core, Shared};
use sample::Body;
pub use sample::RosSample;

/// Counters of a [`RosSubscriber`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RosSubscriberStats {
    /// Messages delivered from our channel.
    pub channel: u64,
    /// Messages delivered from the base key.
    pub base: u64,
    /// Messages delivered from `<base key>/_buf_cpu` (buffer-aware rmw_zenoh publishers).
    pub buf_cpu: u64,
    /// Buffers of ROS 2's CUDA buffer backend delivered in place (descriptors on
    /// `<base key>/_buf/<our GID>`, imported): no copy was made.
    pub cuda_buffers: u64,
    /// CDR messages delivered from `<base key>/_buf/<our GID>` (a buffer-aware publisher
    /// without a CUDA buffer for us: host data, or a GPU we cannot map).
    pub buf_gid: u64,
    /// Descriptors that could not be imported (their messages are lost; see
    /// [`RosSubscriber::backend_refusal`]).
    pub backend_refused: u64,
    /// Messages missing from publishers that number their messages one by one: gaps
    /// after a publisher's first delivered message, less those filled late, and the
    /// messages after the last one delivered from a publisher of ours that has been
    /// dropped (its end notice; rmw_zenoh publishers send none, and one that dies sends
    /// nothing, so a tail of theirs stays uncounted).
    pub lost: u64,
    /// Publishers reported as silent (see [`RosSubscriber::silent_publishers`]).
    pub silent_publishers: u64,
    /// Second copies (the same GID and sequence number by the other path) dropped.
    pub duplicates: u64,
    /// Base-key samples without a valid attachment, dropped.
    pub bad_attachment: u64,
    /// Base-key samples whose CDR does not decode, dropped.
    pub bad_cdr: u64,
    /// Channel samples without a valid envelope (or, for a `std_msgs/msg/String`, whose
    /// text is not UTF-8 without NUL bytes), dropped.
    pub bad_envelope: u64,
    /// KEEP_LAST: messages dropped, oldest first, because the queue of `depth` was full
    /// (the application reads slower than they come).
    pub dropped_queue_full: u64,
    /// Messages received and not read yet. A KEEP_ALL queue has no limit: past
    /// [`KEEP_ALL_WARN`] unread messages a warning is logged, once each time it grows
    /// past that mark.
    pub queued: u64,
    /// Time this subscription's threads spent busy-polling for messages, in µs (its
    /// `recv` and its channel's link threads; see `spin_us`).
    pub polled_us: u64,
}

enum BaseSub {
    Plain(#[allow(dead_code)] zenoh::pubsub::Subscriber<()>),
    Advanced(#[allow(dead_code)] zenoh_ext::AdvancedSubscriber<()>),
}

/// A subscription to `M` on a ROS topic.
///
/// Declared with [`RosNode::subscriber`]; read with [`recv`](RosSubscriber::recv),
/// [`recv_timeout`](RosSubscriber::recv_timeout) or [`try_recv`](RosSubscriber::try_recv).
/// Each [`RosSample`] holds the fields, and the data where it arrived:
///
/// ```
/// use zenoh_cuda_shm::config::DeviceChoice;
/// use zenoh_cuda_shm::tensor_codec::cdr::{Header, Image};
/// use zenoh_cuda_shm::{GpuSession, ZcsConfig};
/// use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RmwWire, RosNode};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let mut zenoh = zenoh::Config::default();
/// # zenoh.insert_json5("scouting/multicast/enabled", "false")?;
/// let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
/// let session = GpuSession::open(zenoh, cfg).wait()?;
/// let node = RosNode::new(&session, NodeOptions::new("doc_subscriber").domain(42).rmw_wire(RmwWire::Classic))?;
/// let subscriber = node.subscriber::<Image<()>>("/camera/image", Qos::reliable(10))?;
/// match subscriber.recv_timeout(std::time::Duration::from_millis(10)) {
///     Ok(msg) => println!("{}x{}, {} bytes", msg.msg().width, msg.msg().height, msg.data_to_vec()?.len()),
///     Err(e) => println!("nothing yet: {e}"),
/// }
/// # Ok(()) }
/// ```
///
/// Fields drop in order: the tokens go first (publishers stop counting it), then the
/// base subscribers, then our channel.
pub struct RosSubscriber<M: RosDataMessage> {
    _token: zenoh::liveliness::LivelinessToken,
    _marker: zenoh::liveliness::LivelinessToken,
    /// Our entry in the CUDA backend's host registry (subscriptions listing `cuda`).
    _registration: Option<Registration>,
    _base: BaseSub,
    _buf_cpu: Option<zenoh::pubsub::Subscriber<()>>,
    /// `<base key>/_buf/<our GID>` (subscriptions listing `cuda`); its callback owns the
    /// import queue, whose thread ends once it is undeclared.
    _buf_gid: Option<zenoh::pubsub::Subscriber<()>>,
    /// `<base key>/@zcs_ros2_end`: our publishers' end notices.
    _end: zenoh::pubsub::Subscriber<()>,
    /// Why this subscription is not in the registry, if registering failed.
    registry_error: Option<String>,
    channel: Arc<GpuSubscriber<()>>,
    rx: flume::Receiver<RosSample<M>>,
    /// The polling window of `recv` on `rx`.
    spin: SpinWindow,
    core: Arc<Core>,
    watch: Arc<Watch>,
    key: String,
    topic: String,
    token: String,
    gid: [u8; 16],
    node: RosNode,
}

impl<M: RosDataMessage> std::fmt::Debug for RosSubscriber<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RosSubscriber").field("key", &self.key).field("token", &self.token).finish()
    }
}

impl<M: RosDataMessage> RosSubscriber<M> {
    pub(crate) fn new(node: RosNode, topic: &str, qos: Qos) -> Result<Self, RosDeclareError> {
        let Endpoint { topic, key, hash, token, gid, buffer_aware, cuda } =
            node.endpoint::<M>(EntityKind::Subscription, topic, &qos)?;
        let domain = node.0.name.domain;
        // KEEP_LAST: `depth` messages, the oldest dropped for a new one. KEEP_ALL: no
        // limit, as rmw_zenoh's subscriptions have none (rmw_subscription_data.cpp,
        // add_new_message, 0.6.7): no Zenoh thread ever waits for the application, and
        // a publisher is held back only on its own side (its pool of GPU blocks empties
        // while we hold them; congestion control for bytes).
        let keep_last = matches!(qos.history, History::KeepLast(_));
        let (tx, rx) = if keep_last { flume::bounded(qos.depth().max(1) as usize) } else { flume::unbounded() };
        let core = Arc::new(Core::default());
        let oldest = keep_last.then(|| rx.clone());
        let shared = Arc::new(Shared { tx, oldest, core: Arc::clone(&core) });

        // Nobody publishes plain samples on our channel key: never listen there.
        let sh = Arc::clone(&shared);
        let channel = node
            .0
            .session
            .with_plain_listen(PlainListen::Never)
            .declare_subscriber(channel_key(&key))
            .callback(move |s| sh.on_channel(s))
            .wait()?;
        let channel = Arc::new(channel);

        let z = node.0.session.zenoh().clone();
        let sh = Arc::clone(&shared);
        let base = match qos.durability {
            Durability::Volatile => {
                BaseSub::Plain(z.declare_subscriber(key.clone()).callback(move |s| sh.on_base(s, false)).wait()?)
            }
            Durability::TransientLocal => {
                use zenoh_ext::{AdvancedSubscriberBuilderExt, HistoryConfig, RecoveryConfig};
                let mut b = z
                    .declare_subscriber(key.clone())
                    .history(HistoryConfig::default().detect_late_publishers().max_samples(qos.depth() as usize))
                    .subscriber_detection()
                    // rmw_zenoh waits without limit; a day is as good and stays far from
                    // any deadline arithmetic overflow.
                    .query_timeout(Duration::from_secs(24 * 3600));
                if qos.reliability == Reliability::Reliable {
                    b = b.recovery(RecoveryConfig::default().heartbeat());
                }
                BaseSub::Advanced(b.callback(move |s| sh.on_base(s, false)).wait()?)
            }
        };
        let buf_cpu = match buffer_aware && !cuda {
            true => {
                let sh = Arc::clone(&shared);
                Some(z.declare_subscriber(buf_cpu_key(&key)).callback(move |s| sh.on_base(s, true)).wait()?)
            }
            false => None,
        };
        let (mut registration, mut registry_error, mut buf_gid) = (None, None, None);
        if let (true, Some(gpu)) = (cuda, node.0.session.gpu()) {
            // Registered before the token, as the backend's endpoints are: a publisher
            // that discovers us reads our device and uid there.
            match Registration::new(gid, zcs_wire::rosidl_cuda::EndpointKind::Subscription, gpu, M::TYPE_NAME) {
                Ok(r) => registration = Some(r),
                Err(e) => {
                    let why = crate::error::Chain(&e).to_string();
                    tracing::warn!(reason = %why, topic = %topic, "not in the CUDA buffer backend's host registry: publishers on another GPU or of another user will send descriptors this subscription must refuse");
                    registry_error = Some(why);
                }
            }
            let imports = imports_for(gpu).map_err(RosDeclareError::Thread)?;
            let buf_key = format!("{key}/_buf/{}", gid_hex(&gid));
            let (sh, weak, k) = (Arc::clone(&shared), Arc::downgrade(&channel), buf_key.clone());
            let queue = spawn_importer(format!("zcs-cuda-import-{}", gid_hex(&gid)), imports, move |with, r| {
                sh.on_imported(&weak, &k, with, r)
            })
            .map_err(RosDeclareError::Thread)?;
            let sh = Arc::clone(&shared);
            buf_gid = Some(z.declare_subscriber(buf_key).callback(move |s| sh.on_buf_gid(s, &queue)).wait()?);
        }
        let sh = Arc::clone(&shared);
        let end = z.declare_subscriber(end_key(&key)).callback(move |s| sh.on_end(&s)).wait()?;
        let heard_by = Arc::clone(&core);
        let watch = Arc::new(Watch {
            subject: Subject {
                topic: topic.clone(),
                dds_type: M::DDS_TYPE_NAME,
                hash,
                qos,
                has_backends: buffer_aware,
                key: key.clone(),
                gid,
                domain,
                since: Instant::now(),
                session: z.clone(),
            },
            heard: Box::new(move |gid| heard_by.dedup().heard(gid)),
            refused: {
                let core = Arc::clone(&core);
                Box::new(move |gid| core.refused_only.locked().get(gid).copied())
            },
            silent: Mutex::new(HashMap::new()),
            reports: AtomicU64::new(0),
        });
        node.watch(&watch)?;
        // The marker before the MS token: a publisher that sees the token already knows
        // this subscription takes our channel.
        let marker = z.liveliness().declare_token(marker_token(domain, &gid)).wait()?;
        let tok = z.liveliness().declare_token(token.clone()).wait()?;
        Ok(Self {
            _token: tok,
            _marker: marker,
            _registration: registration,
            _base: base,
            _buf_cpu: buf_cpu,
            _buf_gid: buf_gid,
            _end: end,
            registry_error,
            channel,
            rx,
            spin: SpinWindow::new(Duration::from_micros(node.0.session.config().spin_us)),
            core,
            watch,
            key,
            topic,
            token,
            gid,
            node,
        })
    }

    /// The topic name as resolved.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Publishers of this topic in the graph that have sent nothing that reached this
    /// subscription within the node's silence window, with the likely reasons. Each was
    /// also logged once (WARN) and counted in [`RosSubscriberStats::silent_publishers`];
    /// one that is heard from later, or leaves, drops off this list.
    pub fn silent_publishers(&self) -> Vec<SilentPublisher> {
        self.watch.silent.locked().values().map(|r| r.publisher.clone()).collect()
    }

    /// The publishers of this subscription's topic in the node's graph now that will not
    /// reach it, and why (another type or type hash, incompatible QoS, a key it does not
    /// hear, refused descriptors), without waiting for the silence window: what a
    /// subscription that hears nothing can tell its user at once. Publishers silent for
    /// reasons the graph does not show are left to
    /// [`silent_publishers`](Self::silent_publishers).
    pub fn unheard_publishers(&self) -> Vec<SilentPublisher> {
        crate::silence::unheard(&self.watch, &self.node.0.graph)
    }

    /// The data key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The liveliness token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The GID, as rmw_zenoh computes it.
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }

    /// Why `sample` came by its path, in words to print beside it (`None` for zero-copy).
    pub fn path_reason(&self, sample: &RosSample<M>) -> Option<String> {
        match &sample.body {
            Body::Channel(s) => self.channel.path_reason(s.info()),
            Body::Base { .. } => Some(
                "CDR on the topic's keys: an rmw_zenoh publisher, or one of ours whose channel this subscription \
                 did not hear first"
                    .to_owned(),
            ),
        }
    }

    /// Whether this subscription takes buffers of ROS 2's CUDA buffer backend in place
    /// (its token lists `cuda`; see [`NodeOptions::cuda_buffers`](crate::NodeOptions::cuda_buffers)).
    pub fn takes_cuda_buffers(&self) -> bool {
        self._buf_gid.is_some()
    }

    /// Why the last descriptor of ROS 2's CUDA buffer backend could not be imported
    /// (another device, a reused block, a socket of another user, a publisher gone…);
    /// each such message is lost and counted in [`RosSubscriberStats::backend_refused`].
    pub fn backend_refusal(&self) -> Option<String> {
        self.core.last_refusal.locked().clone()
    }

    /// Descriptors refused so far, by kind of reason (`reused`, `other-device`,
    /// `wrong-peer`, `descriptor`… see [`BackendImportError::kind`](crate::cuda_backend::BackendImportError::kind); `import-thread`
    /// if the subscription's import thread has ended); they add up to
    /// [`RosSubscriberStats::backend_refused`].
    pub fn backend_refusals(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.core.refusals.locked().clone()
    }

    /// Why this subscription, though it takes CUDA buffers, is not in the backend's host
    /// registry (publishers then cannot tell that it is on another GPU or of another
    /// user, and send it descriptors it must refuse).
    pub fn registry_error(&self) -> Option<&str> {
        self.registry_error.as_deref()
    }

    /// Our channel's subscriber (its publishers and counters).
    pub fn channel(&self) -> &GpuSubscriber<()> {
        &self.channel
    }

    /// Counters.
    pub fn stats(&self) -> RosSubscriberStats {
        let c = &self.core.counters;
        RosSubscriberStats {
            channel: c.channel.load(Ordering::Relaxed),
            base: c.base.load(Ordering::Relaxed),
            buf_cpu: c.buf_cpu.load(Ordering::Relaxed),
            cuda_buffers: c.cuda_buffers.load(Ordering::Relaxed),
            buf_gid: c.buf_gid.load(Ordering::Relaxed),
            backend_refused: c.backend_refused.load(Ordering::Relaxed),
            lost: self.core.dedup().lost(),
            silent_publishers: self.watch.reports.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            bad_attachment: c.bad_attachment.load(Ordering::Relaxed),
            bad_cdr: c.bad_cdr.load(Ordering::Relaxed),
            bad_envelope: c.bad_envelope.load(Ordering::Relaxed),
            dropped_queue_full: c.dropped_queue_full.load(Ordering::Relaxed),
            queued: self.rx.len() as u64,
            polled_us: c.polled_ns.load(Ordering::Relaxed) / 1000 + self.channel.stats().polled_us,
        }
    }

    /// Waits for the next message (polling first while messages have been coming
    /// within `spin_us`).
    ///
    /// # Errors
    /// [`RecvError::Closed`] once the subscription's channel is closed.
    pub fn recv(&self) -> Result<RosSample<M>, RecvError> {
        self.recv_within(Duration::MAX)
    }

    /// Waits up to `timeout` for the next message (polling first, within `timeout`,
    /// while messages have been coming within `spin_us`).
    ///
    /// # Errors
    /// [`RecvError::Timeout`] when no message came within `timeout`;
    /// [`RecvError::Closed`] once the subscription's channel is closed.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<RosSample<M>, RecvError> {
        self.recv_within(timeout)
    }

    fn recv_within(&self, within: Duration) -> Result<RosSample<M>, RecvError> {
        let (got, polled) = recv_queue(&self.rx, &self.spin, within);
        count_polled(&self.core.counters.polled_ns, polled);
        got.map_err(RecvError::from)
    }

    /// The next message if one is queued.
    pub fn try_recv(&self) -> Option<RosSample<M>> {
        self.rx.try_recv().ok()
    }
}

/// Declared by its node.
impl RosNode {
    /// Declares a subscription to `M` on `topic` that takes our channel from our
    /// publishers and the base key from every other ROS publisher.
    ///
    /// # Errors
    /// [`RosDeclareError::Name`] for a topic that does not resolve;
    /// [`RosDeclareError::Channel`] when our channel's subscriber cannot be declared;
    /// [`RosDeclareError::Zenoh`] when the base-key subscriber or a token cannot be
    /// declared; [`RosDeclareError::Thread`] when the node's silent-publisher check (on
    /// with a silence window) cannot start its thread.
    pub fn subscriber<M: RosDataMessage>(&self, topic: &str, qos: Qos) -> Result<RosSubscriber<M>, RosDeclareError> {
        RosSubscriber::new(self.clone(), topic, qos)
    }
}
