//! A ROS publisher whose data can live on the GPU.
//!
//! Every message goes on our channel (`<base key>/@zcs_ros2`, a [`GpuPublisher`]):
//! zero-copy to our GPU-capable subscriptions on the same GPU, bytes to the other ones
//! of ours. The CDR message with its rmw_zenoh attachment goes on the base key only
//! while an ordinary ROS subscription of the topic exists (counted from the graph's
//! `MS` tokens, minus our GPU-capable subscriptions' markers), or always for
//! TRANSIENT_LOCAL (the base key's publication cache is what late joiners query).
//!
//! On the buffer-aware wire in a session on a GPU, a message whose data is in one of
//! our device blocks is lent to each subscription of ROS 2's CUDA buffer backend on
//! our GPU instead: a descriptor on `<base key>/_buf/<its GID>`, the block read in
//! place (`route.rs` says who gets what, `cuda_backend/export.rs` how a block is
//! lent). Every put of one message carries the same attachment, so its sequence
//! number counts messages, as on the classic wire.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the publisher: its keys, tokens, puts and counters |
//! | `route.rs` | one message's destinations on the buffer-aware wire |
//! | `lending.rs` | the publisher's side of the CUDA buffer backend: registry, verdicts, lending |

mod lending;
mod route;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use zenoh::Wait;
use zenoh::bytes::ZBytes;
use zenoh::qos::{CongestionControl, Reliability as ZReliability};

use super::attachment::{Attachment, now_ns};
use super::graph::publisher_marker_token;
use super::message::{RosDataMessage, check_data, data_suffix, encode_envelope};
use super::names::{Durability, EntityKind, History, Qos, Reliability, gid_hex};
use super::node::{Endpoint, RosDeclareError, RosNode};
use super::{channel_key, end_key};
use crate::api::{GpuLoan, GpuPublisher, PublishError};
use crate::pool::LoanError;
use crate::sync::Unpoisoned;
use crate::transport::publisher::{PutError, PutReport};
use lending::Lending;
use route::Plan;
use tensor_codec::cdr::{CdrEncodeError, StringMsg};

/// Publishing a ROS message failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RosPublishError {
    /// The message fields do not encode.
    #[error(transparent)]
    Encode(#[from] CdrEncodeError),
    /// The device→host copy for ordinary subscribers failed.
    #[error("the copy for ordinary ROS subscribers failed")]
    Copy(#[source] crate::api::WriteError),
    /// Our channel refused the message.
    #[error(transparent)]
    Channel(#[from] PutError),
    /// Our channel refused host data.
    #[error(transparent)]
    ChannelBytes(#[from] PublishError),
    /// The base-key put failed.
    #[error("the zenoh put on the base key failed")]
    Base(#[source] zenoh::Error),
}

enum Base {
    Plain(zenoh::pubsub::Publisher<'static>),
    Advanced(zenoh_ext::AdvancedPublisher<'static>),
}

/// What one publish did.
#[derive(Debug, Clone)]
pub struct RosPutReport {
    /// The message's sequence number (attachment).
    pub seq: i64,
    /// Our channel's report (`None` when host data was not sent there: no subscriber of
    /// ours was known).
    pub channel: Option<PutReport>,
    /// Whether the CDR message went on the base key.
    pub base: bool,
}

/// Counters of a [`RosPublisher`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RosPublisherStats {
    /// Descriptors of ROS 2's CUDA buffer backend put (one per subscription and
    /// message): each such subscription read the block in place.
    pub descriptors: u64,
    /// CDR messages put on `<base key>/_buf_cpu` or `<base key>/_buf/<GID>` (messages
    /// that also went out as descriptors, for the subscriptions not given one).
    pub buf_puts: u64,
    /// Subscriptions listing the CUDA backend served CDR instead of a descriptor, one
    /// per subscription and message ([`RosPublisher::cuda_fallbacks`] says why).
    pub cuda_fallbacks: u64,
    /// Our blocks lent to the backend's subscriptions now (out of our pool until their
    /// count is back to zero and 100 ms have passed).
    pub lent_blocks: u64,
    /// Lent blocks whose counts were cleared because every process given them died.
    pub lent_reclaimed: u64,
    /// Messages published.
    pub published: u64,
    /// CDR messages put on the base key.
    pub base_puts: u64,
    /// Device→host copies made for them.
    pub device_to_host: u64,
    /// Of `base_puts`, those whose CDR message was written into a buffer of the
    /// session's Zenoh shared-memory pool (`zenoh_shm_out_bytes`, feature `zenoh-shm`):
    /// ROS nodes of this host with shared memory on get it by reference.
    pub base_shm: u64,
}

/// A publisher of `M` on a ROS topic. See the module docs for the routing.
///
/// Declared with [`RosNode::publisher`]. Publish data written in a loan
/// ([`loan`](RosPublisher::loan), [`publish`](RosPublisher::publish)), on a GPU in
/// place, or host data ([`publish_host`](RosPublisher::publish_host)):
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
/// let node = RosNode::new(&session, NodeOptions::new("doc_publisher").domain(42).rmw_wire(RmwWire::Classic))?;
/// let publisher = node.publisher::<Image<()>>("/camera/image", Qos::reliable(10))?;
/// let fields = Image { header: Header::default(), height: 1, width: 4,
///     encoding: "mono8".into(), is_bigendian: 0, step: 4, data: () };
/// let mut loan = publisher.loan(4)?;
/// loan.write_bytes(0, &[9, 8, 7, 6])?; // on a GPU: kernels on loan.stream()
/// let report = publisher.publish(&fields, loan)?;
/// assert_eq!(report.seq, 1);
/// # Ok(()) }
/// ```
///
///
/// The node (a session handle) is declared after the Zenoh entities so that it drops
/// after them: a base publisher undeclared once the node's drop has closed the session
/// would keep the closed session's memory alive (see `transport::publisher::PublisherCore`).
pub struct RosPublisher<M: RosDataMessage> {
    key: String,
    topic: String,
    token: String,
    gid: [u8; 16],
    qos: Qos,
    seq: AtomicI64,
    gpu: GpuPublisher,
    base: Base,
    /// Its token lists backends (rmw_zenoh's buffer-aware wire).
    buffer_aware: bool,
    lending: Option<Lending>,
    descriptors: AtomicU64,
    buf_puts: AtomicU64,
    /// Zenoh publishers of `_buf_cpu` and `_buf/<GID>`, by suffix.
    buf_publishers: Mutex<HashMap<String, zenoh::pubsub::Publisher<'static>>>,
    published: AtomicU64,
    base_puts: AtomicU64,
    d2h: AtomicU64,
    base_shm: AtomicU64,
    _token: zenoh::liveliness::LivelinessToken,
    _marker: zenoh::liveliness::LivelinessToken,
    node: RosNode,
    _m: PhantomData<fn(M)>,
}

impl<M: RosDataMessage> std::fmt::Debug for RosPublisher<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RosPublisher").field("key", &self.key).field("token", &self.token).finish()
    }
}

impl<M: RosDataMessage> RosPublisher<M> {
    pub(crate) fn new(node: RosNode, topic: &str, qos: Qos) -> Result<Self, RosDeclareError> {
        let Endpoint { topic, key, token, gid, buffer_aware, cuda, .. } =
            node.endpoint::<M>(EntityKind::Publisher, topic, &qos)?;
        let domain = node.0.name.domain;
        let z = node.0.session.zenoh().clone();
        let gpu = node.0.session.declare_publisher(channel_key(&key)).wait()?;
        let reliability = match qos.reliability {
            Reliability::Reliable => ZReliability::Reliable,
            Reliability::BestEffort => ZReliability::BestEffort,
        };
        // As rmw_zenoh: block only for reliable keep-all, else drop under congestion.
        let congestion = match (qos.reliability, qos.history) {
            (Reliability::Reliable, History::KeepAll) => CongestionControl::Block,
            _ => CongestionControl::Drop,
        };
        let builder = z.declare_publisher(key.clone()).reliability(reliability).congestion_control(congestion);
        let base = match qos.durability {
            Durability::Volatile => Base::Plain(builder.wait()?),
            Durability::TransientLocal => {
                use zenoh_ext::{AdvancedPublisherBuilderExt, CacheConfig, MissDetectionConfig};
                let mut b =
                    builder.cache(CacheConfig::default().max_samples(qos.depth() as usize)).publisher_detection();
                if qos.reliability == Reliability::Reliable {
                    b = b.sample_miss_detection(
                        MissDetectionConfig::default().sporadic_heartbeat(std::time::Duration::from_millis(500)),
                    );
                }
                Base::Advanced(b.wait()?)
            }
        };
        // Registered before the token, as rmw_zenoh does.
        let lending = match (cuda, node.0.session.gpu()) {
            (true, Some(gpu)) => Some(Lending::new(gid, gpu, M::TYPE_NAME).map_err(RosDeclareError::Thread)?),
            _ => None,
        };
        // The marker before the MP token: a subscription that sees the token already knows
        // this publisher numbers its messages one by one.
        let marker = z.liveliness().declare_token(publisher_marker_token(domain, &gid)).wait()?;
        let tok = z.liveliness().declare_token(token.clone()).wait()?;
        Ok(Self {
            key,
            topic,
            token,
            gid,
            qos,
            seq: AtomicI64::new(1),
            gpu,
            base,
            buffer_aware,
            lending,
            descriptors: AtomicU64::new(0),
            buf_puts: AtomicU64::new(0),
            buf_publishers: Mutex::default(),
            published: AtomicU64::new(0),
            base_puts: AtomicU64::new(0),
            d2h: AtomicU64::new(0),
            base_shm: AtomicU64::new(0),
            _token: tok,
            _marker: marker,
            node,
            _m: PhantomData,
        })
    }

    /// The data key (`<domain>/<topic>/<type>/<hash>`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The topic name as resolved (`/robot1/camera/image` for `camera/image` in
    /// namespace `/robot1`).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The liveliness token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The GID, as rmw_zenoh computes it (what `ros2 topic info -v` shows; also in
    /// every message's attachment).
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }

    /// The QoS.
    pub fn qos(&self) -> Qos {
        self.qos
    }

    /// Our channel's publisher (zero-copy and bytes paths, its counters).
    pub fn channel(&self) -> &GpuPublisher {
        &self.gpu
    }

    /// Ordinary ROS subscriptions of this topic now (each makes publishes copy the data
    /// to host and put CDR on the base key).
    pub fn ordinary_subscriptions(&self) -> usize {
        self.node.ordinary_subscriptions(&self.key)
    }

    /// Counters.
    pub fn stats(&self) -> RosPublisherStats {
        let fallbacks = self.lending.as_ref().map(|l| l.fallbacks().values().sum()).unwrap_or(0);
        RosPublisherStats {
            descriptors: self.descriptors.load(Ordering::Relaxed),
            buf_puts: self.buf_puts.load(Ordering::Relaxed),
            cuda_fallbacks: fallbacks,
            lent_blocks: self.lending.as_ref().map_or(0, Lending::lent_now),
            lent_reclaimed: self.lending.as_ref().map_or(0, Lending::reclaimed),
            published: self.published.load(Ordering::Relaxed),
            base_puts: self.base_puts.load(Ordering::Relaxed),
            device_to_host: self.d2h.load(Ordering::Relaxed),
            base_shm: self.base_shm.load(Ordering::Relaxed),
        }
    }

    /// Whether this publisher lends its device blocks to subscriptions of ROS 2's CUDA
    /// buffer backend (see [`NodeOptions::cuda_buffers`](crate::NodeOptions::cuda_buffers)).
    pub fn lends_cuda_buffers(&self) -> bool {
        self.lending.is_some()
    }

    /// Why subscriptions listing the CUDA backend were served CDR instead of a
    /// descriptor, with how many times (per subscription and message):
    /// `legacy-subscription` (a subscription of the topic lists no backends, so every
    /// message goes on the data key), `host-data` (a message published from host
    /// memory), `not-registered` (not in the host registry: another host, say),
    /// `other-device`, `other-user`, `not-capable`, `same-process`, `registry` (the
    /// registry unusable), and the block's lending failures: `server`, `socket`,
    /// `block-file`, `cuda`, `too-many-lent` ([`ExportError`](crate::cuda_backend::ExportError)).
    pub fn cuda_fallbacks(&self) -> Vec<(&'static str, u64)> {
        self.lending.as_ref().map(|l| l.fallbacks().into_iter().collect()).unwrap_or_default()
    }

    /// Why the CUDA backend's host registry could not be used (no descriptors are then
    /// sent), if it could not.
    pub fn registry_error(&self) -> Option<&str> {
        self.lending.as_ref().and_then(Lending::registry_error)
    }

    /// The sequence number the next publish will carry (exact while one thread
    /// publishes: e.g. to write data that depends on it before publishing).
    pub fn next_seq(&self) -> i64 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Loans a block for the data of one message (write it on the loan's stream).
    ///
    /// # Errors
    /// As [`GpuPublisher::loan`](zenoh_cuda_shm::GpuPublisher::loan): [`LoanError`]
    /// for a zero length, a length above the pool's cap, an exhausted pool or a failed
    /// allocation.
    pub fn loan(&self, len: usize) -> Result<GpuLoan, LoanError> {
        self.gpu.loan(len)
    }

    fn next_attachment(&self) -> Attachment {
        // Relaxed: the counter only has to hand out distinct, increasing numbers.
        Attachment { seq: self.seq.fetch_add(1, Ordering::Relaxed), timestamp_ns: now_ns(), gid: self.gid }
    }

    fn wants_base(&self) -> bool {
        self.qos.durability == Durability::TransientLocal || self.ordinary_subscriptions() > 0
    }

    /// The CDR message of `msg` with `len` bytes of data written by `fill`: in a buffer of
    /// the session's Zenoh SHM pool when there is one with room, else on the heap.
    fn base_payload(
        &self,
        msg: &M,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), RosPublishError>,
    ) -> Result<ZBytes, RosPublishError> {
        let mut cdr = msg.encode_cdr_prefix(len)?;
        let (at, suffix) = (cdr.len(), data_suffix::<M>());
        let end = at + len;
        #[cfg(feature = "zenoh-shm")]
        if let Some(mut buf) = self.gpu.shm_buffer(end + suffix.len()) {
            buf[..at].copy_from_slice(&cdr);
            fill(&mut buf[at..end])?;
            buf[end..].copy_from_slice(suffix);
            self.base_shm.fetch_add(1, Ordering::Relaxed);
            return Ok(ZBytes::from(buf));
        }
        cdr.resize(end, 0);
        fill(&mut cdr[at..])?;
        cdr.extend_from_slice(suffix);
        Ok(ZBytes::from(cdr))
    }

    fn put_base(&self, cdr: ZBytes, att: &Attachment) -> Result<(), RosPublishError> {
        let a = att.encode().to_vec();
        let r = match &self.base {
            Base::Plain(p) => p.put(cdr).attachment(a).wait(),
            Base::Advanced(p) => p.put(cdr).attachment(a).wait(),
        };
        r.map_err(RosPublishError::Base)?;
        self.base_puts.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Puts `payload` on `<base key>/<suffix>` (`_buf_cpu`, `_buf/<GID>`), as the base
    /// key's puts are made.
    /// One Zenoh publisher per such key, declared at its first put (as rmw_zenoh declares
    /// one per subscription), undeclared once no subscription of the topic needs it.
    fn put_buf(&self, suffix: &str, payload: ZBytes, att: &Attachment) -> Result<(), RosPublishError> {
        let mut keys = self.buf_publishers.locked();
        let publisher = match keys.get(suffix) {
            Some(p) => p,
            None => {
                let (reliability, congestion) = self.base_qos();
                let p = (self.node.0.session.zenoh())
                    .declare_publisher(format!("{}/{suffix}", self.key))
                    .reliability(reliability)
                    .congestion_control(congestion)
                    .wait()
                    .map_err(RosPublishError::Base)?;
                keys.entry(suffix.to_owned()).or_insert(p)
            }
        };
        publisher.put(payload).attachment(att.encode().to_vec()).wait().map_err(RosPublishError::Base)
    }

    /// The reliability and congestion control of the base key's puts.
    fn base_qos(&self) -> (ZReliability, CongestionControl) {
        match &self.base {
            Base::Plain(p) => (p.reliability(), p.congestion_control()),
            Base::Advanced(_) => (ZReliability::Reliable, CongestionControl::Block),
        }
    }

    /// Undeclares the `_buf/<GID>` publishers of subscriptions no longer in `plan`.
    fn prune_buf_publishers(&self, plan: &Plan) {
        let mut keys = self.buf_publishers.locked();
        if keys.len() > 1 + plan.cdr.len() + plan.descriptors.len() {
            let live: Vec<String> =
                plan.cdr.iter().chain(&plan.descriptors).map(|g| format!("_buf/{}", gid_hex(g))).collect();
            keys.retain(|k, _| k == "_buf_cpu" || live.contains(k));
        }
    }

    /// Publishes a message whose data is the whole `loan`: `msg` carries every other
    /// field. The channel gets the block (with the fields and attachment as metadata);
    /// ordinary ROS subscribers, if any, get the CDR message, copied device→host once.
    ///
    /// # Errors
    /// [`RosPublishError::Encode`] when the fields do not encode, or the text of a
    /// `std_msgs/msg/String` is not UTF-8 without NUL bytes;
    /// [`RosPublishError::Copy`] when the device→host copy for ordinary subscribers
    /// (or of a String's text, to check it) fails; [`RosPublishError::Channel`] when our channel refuses the loan (one of
    /// another publisher's, a Zenoh failure); [`RosPublishError::Base`] when the put on
    /// the base key fails (the channel has the message by then).
    pub fn publish(&self, msg: &M, mut loan: GpuLoan) -> Result<RosPutReport, RosPublishError> {
        if M::DATA_IS_TEXT {
            // Text is small: checked in a host copy, whichever memory the loan is.
            let mut text = vec![0; loan.len()];
            loan.read_to_host(0, &mut text).map_err(RosPublishError::Copy)?;
            check_data::<M>(&text)?;
        }
        let att = self.next_attachment();
        let mut plan = match (&self.lending, self.buffer_aware) {
            (Some(l), true) => l.plan(&self.node.0.graph.ordinary_subscribers(&self.key), loan.device_ptr().is_some()),
            _ => Plan { data_key: self.wants_base(), ..Plan::default() },
        };
        plan.data_key |= self.qos.durability == Durability::TransientLocal;
        let prepared = self.lending.as_ref().and_then(|l| l.prepare(&loan, &mut plan));
        let cdr = if plan.needs_cdr() {
            let cdr =
                self.base_payload(msg, loan.len(), |dst| loan.read_to_host(0, dst).map_err(RosPublishError::Copy))?;
            if loan.device_ptr().is_some() {
                self.d2h.fetch_add(1, Ordering::Relaxed);
            }
            Some(cdr)
        } else {
            None
        };
        loan.set_meta(encode_envelope(&att, msg)?);
        // The channel first: a subscriber that gets both keeps the first copy to arrive,
        // and this makes it the zero-copy one.
        let (channel, shared) = self.gpu.put_shared(loan)?;
        self.prune_buf_publishers(&plan);
        if let Some(cdr) = cdr {
            if plan.data_key {
                self.put_base(cdr.clone(), &att)?;
            }
            if plan.buf_cpu {
                self.put_buf("_buf_cpu", cdr.clone(), &att)?;
                self.buf_puts.fetch_add(1, Ordering::Relaxed);
            }
            for gid in &plan.cdr {
                self.put_buf(&format!("_buf/{}", gid_hex(gid)), cdr.clone(), &att)?;
                self.buf_puts.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let (Some(l), Some(p), Some(block)) = (&self.lending, prepared, shared) {
            let payload = ZBytes::from(msg.encode_cdr_cuda(&l.lend(p, block))?);
            for gid in &plan.descriptors {
                self.put_buf(&format!("_buf/{}", gid_hex(gid)), payload.clone(), &att)?;
                self.descriptors.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.published.fetch_add(1, Ordering::Relaxed);
        Ok(RosPutReport { seq: att.seq, channel: Some(channel), base: plan.data_key })
    }

    /// Publishes a message whose data is in host memory: on our channel while any
    /// subscription of ours is known, and as CDR on the base key while an ordinary one
    /// is (or always, for TRANSIENT_LOCAL).
    ///
    /// # Errors
    /// [`RosPublishError::Encode`] when the fields do not encode, or the text of a
    /// `std_msgs/msg/String` is not UTF-8 without NUL bytes (nothing is sent);
    /// [`RosPublishError::ChannelBytes`] when our channel refuses the data (no block,
    /// a failed copy or put); [`RosPublishError::Base`] when the put on the base key
    /// fails.
    pub fn publish_host(&self, msg: &M, data: &[u8]) -> Result<RosPutReport, RosPublishError> {
        check_data::<M>(data)?;
        let att = self.next_attachment();
        let channel = if self.gpu.aware_subscribers() > 0 {
            Some(self.gpu.put_bytes_meta(data, Some(encode_envelope(&att, msg)?))?)
        } else {
            None
        };
        let base = self.wants_base();
        if base {
            let cdr = self.base_payload(msg, data.len(), |dst| {
                dst.copy_from_slice(data);
                Ok(())
            })?;
            self.put_base(cdr, &att)?;
        }
        self.published.fetch_add(1, Ordering::Relaxed);
        Ok(RosPutReport { seq: att.seq, channel, base })
    }
}

impl RosPublisher<StringMsg<()>> {
    /// Publishes a `std_msgs/msg/String` with `text` as its `data`
    /// ([`RosPublisher::publish_host`] with the text's bytes).
    ///
    /// # Errors
    /// As [`RosPublisher::publish_host`]: [`RosPublishError::Encode`] for text with a NUL
    /// byte (nothing is sent).
    pub fn publish_str(&self, text: &str) -> Result<RosPutReport, RosPublishError> {
        self.publish_host(&StringMsg { data: () }, text.as_bytes())
    }
}

/// The end notice: an empty sample on [`end_key`] whose attachment carries this
/// publisher's GID and last sequence number, put after its last message and before its
/// Zenoh entities go, so that our subscriptions count a tail they missed
/// ([`RosSubscriberStats::lost`](crate::RosSubscriberStats::lost)). Nothing is put
/// by a publisher that published nothing; a process that dies puts nothing either.
impl<M: RosDataMessage> Drop for RosPublisher<M> {
    fn drop(&mut self) {
        let last = self.seq.load(Ordering::Relaxed) - 1;
        if last < 1 {
            return;
        }
        let notice = Attachment { seq: last, timestamp_ns: now_ns(), gid: self.gid };
        let (_, congestion) = self.base_qos();
        let put = (self.node.0.session.zenoh())
            .put(end_key(&self.key), ZBytes::new())
            .attachment(notice.encode().to_vec())
            .congestion_control(congestion)
            .wait();
        if let Err(e) = put {
            tracing::debug!(key = %self.key, error = %e, "no end notice: subscriptions will not count a lost tail");
        }
    }
}

/// Declared by its node.
impl RosNode {
    /// Declares a publisher of `M` on `topic` (e.g. `/camera/image`, or a name relative
    /// to the node, see [`RosNode::resolve_topic`]).
    ///
    /// # Errors
    /// [`RosDeclareError::Name`] for a topic that does not resolve;
    /// [`RosDeclareError::Channel`] when our channel's publisher cannot be declared;
    /// [`RosDeclareError::Zenoh`] when the base-key publisher or a token cannot be
    /// declared.
    pub fn publisher<M: RosDataMessage>(&self, topic: &str, qos: Qos) -> Result<RosPublisher<M>, RosDeclareError> {
        RosPublisher::new(self.clone(), topic, qos)
    }
}
