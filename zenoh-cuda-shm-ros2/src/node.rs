//! A ROS node on an rmw_zenoh graph: its token, its view of the graph, and the
//! factory of publishers and subscriptions.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use zenoh::Wait;

use super::backends::{Backends, CUDA};
use super::distro::{RmwWire, UnknownDistro};
use super::graph::Graph;
use super::message::RosDataMessage;
use super::names::{Durability, Entity, EntityKind, NameError, NodeName, Qos, gid_of, topic_key};
use super::resolve::{resolve_topic, validate_absolute, validate_node_name};
use super::silence::{Watch, spawn_checker};
use crate::GpuSession;
use crate::sync::Unpoisoned;
use crate::transport::publisher::DeclareError;

/// Node and entity ids of this process: rmw_zenoh needs them unique within a Zenoh
/// session; one counter for the process is unique within each of its sessions.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

pub(crate) fn next_id() -> u64 {
    // Relaxed: only uniqueness matters, not ordering with other memory.
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// How a node is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOptions {
    /// Node name (one segment).
    pub name: String,
    /// Namespace (`/` for the root, else `/a/b`).
    pub namespace: String,
    /// ROS domain id; `None`: `ROS_DOMAIN_ID` from the environment, else 0.
    pub domain: Option<u32>,
    /// Security enclave (default `/`).
    pub enclave: String,
    /// How long a publisher of a subscription's topic may be in the graph without a
    /// message reaching the subscription before it is reported as silent, once (see
    /// [`RosSubscriber::silent_publishers`](crate::RosSubscriber::silent_publishers)); `None` turns the check off. Default 5 s.
    pub silence_window: Option<Duration>,
    /// The rmw_zenoh wire of its endpoints' tokens (and so their GIDs); `None`: from
    /// `ROS_DISTRO` ([`RmwWire::from_env`]).
    pub rmw_wire: Option<RmwWire>,
    /// Whether its endpoints speak ROS 2's CUDA buffer backend (default `true`). It
    /// applies on the buffer-aware wire, in a session on a GPU, to volatile endpoints of
    /// types with a `uint8[]` field, which register in the backend's host registry:
    /// subscriptions list the `cuda` backend and import the descriptors that publishers
    /// of the backend send them; publishers list `cpu` and `cuda` and lend their device
    /// blocks to the backend's subscriptions on the same GPU with a descriptor. `false`:
    /// they list `cpu` only, and bytes cross between us and the backend's nodes.
    pub cuda_buffers: bool,
}

/// The default [`NodeOptions::silence_window`].
pub const DEFAULT_SILENCE_WINDOW: Duration = Duration::from_secs(5);

impl NodeOptions {
    /// A node named `name` in the root namespace.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: "/".into(),
            domain: None,
            enclave: "/".into(),
            silence_window: Some(DEFAULT_SILENCE_WINDOW),
            rmw_wire: None,
            cuda_buffers: true,
        }
    }

    /// Sets whether endpoints speak ROS 2's CUDA buffer backend
    /// ([`NodeOptions::cuda_buffers`]).
    pub fn cuda_buffers(mut self, on: bool) -> Self {
        self.cuda_buffers = on;
        self
    }

    /// Sets the rmw_zenoh wire instead of taking it from `ROS_DISTRO`.
    pub fn rmw_wire(mut self, wire: RmwWire) -> Self {
        self.rmw_wire = Some(wire);
        self
    }

    /// Sets the silence window (`None`: no check).
    pub fn silence_window(mut self, window: Option<Duration>) -> Self {
        self.silence_window = window;
        self
    }

    /// Sets the namespace.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    /// Sets the domain id.
    pub fn domain(mut self, domain: u32) -> Self {
        self.domain = Some(domain);
        self
    }
}

/// A new endpoint's names ([`RosNode::endpoint`]).
pub(crate) struct Endpoint {
    pub(crate) topic: String,
    pub(crate) key: String,
    pub(crate) hash: String,
    pub(crate) token: String,
    pub(crate) gid: [u8; 16],
    /// Its token lists backends.
    pub(crate) buffer_aware: bool,
    /// It is a subscription that lists the `cuda` backend (and so takes descriptors).
    pub(crate) cuda: bool,
}

/// The graph of a node's domain, as [`RosNode::graph`] sees it.
#[derive(Debug, Clone)]
pub struct GraphView {
    /// Every entity known from its token (ours included).
    pub entities: Vec<Entity>,
    /// Tokens ignored as malformed.
    pub malformed: u64,
    /// Tokens whose `backends:` chunk was refused (their endpoints count as legacy).
    pub malformed_backends: u64,
}

/// Declaring a node, publisher or subscription failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RosDeclareError {
    /// A name is not usable.
    #[error(transparent)]
    Name(#[from] NameError),
    /// `ROS_DOMAIN_ID` is not a number.
    #[error("ROS_DOMAIN_ID={0:?} is not a domain id")]
    DomainId(String),
    /// `ROS_DISTRO` names a distribution whose rmw_zenoh this crate does not speak.
    #[error(transparent)]
    Distro(#[from] UnknownDistro),
    /// A Zenoh declaration failed.
    #[error("zenoh: {0}")]
    Zenoh(String),
    /// The thread that checks for silent publishers could not start.
    #[error("starting the silent-publisher check: {0}")]
    Thread(#[source] std::io::Error),
    /// Declaring our GPU channel failed.
    #[error(transparent)]
    Channel(#[from] DeclareError),
}

impl From<zenoh::Error> for RosDeclareError {
    fn from(e: zenoh::Error) -> Self {
        Self::Zenoh(e.to_string())
    }
}

pub(crate) struct NodeInner {
    pub(crate) session: GpuSession,
    pub(crate) name: NodeName,
    pub(crate) graph: Graph,
    wire: RmwWire,
    cuda_buffers: bool,
    silence_window: Option<Duration>,
    watches: Mutex<Vec<Weak<Watch>>>,
    checker_started: AtomicBool,
    token: String,
    _token: zenoh::liveliness::LivelinessToken,
}

/// A ROS node. Cheap to clone; its token is undeclared when the last clone (and the
/// last publisher or subscription made from it) is dropped.
///
/// Made with [`RosNode::new`] on a [`GpuSession`]; it declares publishers
/// ([`RosNode::publisher`]) and subscriptions ([`RosNode::subscriber`]). On host memory
/// (no GPU), as here:
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
/// let node = RosNode::new(&session, NodeOptions::new("doc_node").domain(42).rmw_wire(RmwWire::Classic))?;
/// assert_eq!(node.resolve_topic("image")?, "/image");
/// let subscriber = node.subscriber::<Image<()>>("image", Qos::reliable(10))?;
/// let publisher = node.publisher::<Image<()>>("image", Qos::reliable(10))?;
/// // Host data goes to our subscriptions once the publisher knows of one (its token).
/// while publisher.channel().aware_subscribers() == 0 {
///     std::thread::sleep(std::time::Duration::from_millis(5));
/// }
/// let fields = Image { header: Header::default(), height: 2, width: 3,
///     encoding: "mono8".into(), is_bigendian: 0, step: 3, data: () };
/// publisher.publish_host(&fields, &[1, 2, 3, 4, 5, 6])?;
///
/// let msg = subscriber.recv_timeout(std::time::Duration::from_secs(5))?;
/// assert_eq!((msg.msg().width, msg.data_to_vec()?), (3, vec![1, 2, 3, 4, 5, 6]));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RosNode(pub(crate) Arc<NodeInner>);

impl std::fmt::Debug for RosNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RosNode").field("token", &self.0.token).finish()
    }
}

impl RosNode {
    /// Declares a node on `session`'s Zenoh session: watches the domain's graph, then
    /// declares the node token.
    ///
    /// # Errors
    /// [`RosDeclareError::Name`] for an invalid node name, namespace or enclave;
    /// [`RosDeclareError::DomainId`] when `ROS_DOMAIN_ID` (read when no domain is given)
    /// is not a number; [`RosDeclareError::Distro`] when `ROS_DISTRO` (read when no wire
    /// is given) names a distribution whose rmw_zenoh this crate does not speak;
    /// [`RosDeclareError::Zenoh`] when the graph watch or the node token cannot be
    /// declared.
    pub fn new(session: &GpuSession, options: NodeOptions) -> Result<Self, RosDeclareError> {
        validate_node_name(&options.name)?;
        validate_absolute("namespace", &options.namespace)?;
        validate_absolute("enclave", &options.enclave)?;
        let domain = match options.domain {
            Some(d) => d,
            None => match std::env::var("ROS_DOMAIN_ID") {
                Ok(v) if !v.is_empty() => v.trim().parse().map_err(|_| RosDeclareError::DomainId(v))?,
                _ => 0,
            },
        };
        let wire = match options.rmw_wire {
            Some(w) => w,
            None => RmwWire::from_env()?,
        };
        let z = session.zenoh();
        let name = NodeName {
            domain,
            zid: z.zid().to_string(),
            nid: next_id(),
            enclave: options.enclave,
            namespace: options.namespace,
            name: options.name,
        };
        let graph = Graph::new(z, domain)?;
        let token = name.node_token();
        let tok = z.liveliness().declare_token(token.clone()).wait()?;
        Ok(Self(Arc::new(NodeInner {
            session: session.clone(),
            name,
            graph,
            wire,
            cuda_buffers: options.cuda_buffers,
            silence_window: options.silence_window,
            watches: Mutex::new(Vec::new()),
            checker_started: AtomicBool::new(false),
            token,
            _token: tok,
        })))
    }

    /// A topic name as rcl resolves it for this node: relative names take the node's
    /// namespace, `~` the node's full name, `{node}` / `{ns}` are substituted.
    ///
    /// # Errors
    /// [`NameError`] for a topic that breaks the rules of ROS names, before or after
    /// the expansion ([`resolve_topic`](crate::resolve::resolve_topic)).
    pub fn resolve_topic(&self, topic: &str) -> Result<String, NameError> {
        let n = &self.0.name;
        resolve_topic(topic, &n.namespace, &n.name)
    }

    /// Puts a subscription under the silent-publisher check (starting the node's
    /// checker thread with the first one).
    pub(crate) fn watch(&self, watch: &Arc<Watch>) -> Result<(), RosDeclareError> {
        let Some(window) = self.0.silence_window else { return Ok(()) };
        self.0.watches.locked().push(Arc::downgrade(watch));
        if !self.0.checker_started.swap(true, Ordering::AcqRel) {
            let started = spawn_checker(Arc::downgrade(&self.0), |n| &n.graph, |n| &n.watches, window);
            if let Err(e) = started {
                self.0.checker_started.store(false, Ordering::Release);
                return Err(RosDeclareError::Thread(e));
            }
        }
        Ok(())
    }

    /// The rmw_zenoh wire of this node's endpoint tokens.
    pub fn rmw_wire(&self) -> RmwWire {
        self.0.wire
    }

    /// The silence window (`None`: no check).
    pub fn silence_window(&self) -> Option<Duration> {
        self.0.silence_window
    }

    /// Names a new publisher or subscription of `M` on `topic`: the resolved topic, its
    /// data key, its token and GID. On the buffer-aware wire, a volatile endpoint of a
    /// type with a top-level `uint8[]` lists backends, as rmw_zenoh's buffer-aware
    /// endpoints do. A subscription in a session on a GPU (unless
    /// [`NodeOptions::cuda_buffers`] is off) lists `cuda` only, as an rmw_zenoh
    /// subscription accepting `cpu,cuda` does: buffer-aware publishers then serve it on
    /// `_buf/<its GID>`, descriptors from CUDA publishers and CDR from the others. A
    /// publisher there lists `cpu` and `cuda`, as an rmw_zenoh publisher with the CUDA
    /// backend installed does, and sends descriptors to CUDA subscriptions. Every other
    /// endpoint lists `cpu`: publishers serve such a subscription plain CDR on
    /// `_buf_cpu`. Our own GPU data travels on our channel either way. On the classic
    /// and Humble wires no token lists backends; on Humble's, the key and the token
    /// carry `TypeHashNotSupported` instead of the type hash.
    pub(crate) fn endpoint<M: RosDataMessage>(
        &self,
        kind: EntityKind,
        topic: &str,
        qos: &Qos,
    ) -> Result<Endpoint, NameError> {
        let topic = self.resolve_topic(topic)?;
        let n = &self.0.name;
        let hash = self.0.wire.type_hash_text(&M::type_hash());
        let key = topic_key(n.domain, &topic, M::DDS_TYPE_NAME, &hash);
        let listed = self.0.wire.lists_backends() && M::HAS_BUFFER_FIELDS && qos.durability == Durability::Volatile;
        let cuda = listed && self.0.cuda_buffers && self.0.session.gpu().is_some();
        let backends = match (listed, cuda, kind) {
            (true, true, EntityKind::Subscription) => Some(Backends::default().with(CUDA, "")),
            (true, true, _) => Some(Backends::cpu_only().with(CUDA, "")),
            (true, false, _) => Some(Backends::cpu_only()),
            (false, _, _) => None,
        };
        let token =
            n.endpoint_token(next_id(), kind, &topic, M::DDS_TYPE_NAME, &hash, &qos.to_keyexpr(), backends.as_ref());
        let gid = gid_of(&token);
        Ok(Endpoint { topic, key, hash, token, gid, buffer_aware: backends.is_some(), cuda })
    }

    /// The session.
    pub fn session(&self) -> &GpuSession {
        &self.0.session
    }

    /// Domain id.
    pub fn domain(&self) -> u32 {
        self.0.name.domain
    }

    /// The node token.
    pub fn token(&self) -> &str {
        &self.0.token
    }

    /// Every entity of the domain known from its tokens (ours included), and how many
    /// tokens were ignored or had their backends chunk refused.
    pub fn graph(&self) -> GraphView {
        let (entities, malformed, malformed_backends) = self.0.graph.snapshot();
        GraphView { entities, malformed, malformed_backends }
    }

    /// Subscriptions on the data key `key` that are not GPU-capable subscriptions of
    /// ours: the ones a GPU publisher copies device→host for.
    pub fn ordinary_subscriptions(&self, key: &str) -> usize {
        self.0.graph.ordinary_subscriptions(key)
    }
}
