//! A ROS node on an rmw_zenoh graph: its token, its view of the graph, and the
//! factory of publishers and subscriptions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use zenoh::Wait;

use super::graph::Graph;
use super::message::RosDataMessage;
use super::names::{Entity, NameError, NodeName, Qos, check_name};
use super::publisher::RosPublisher;
use super::subscriber::RosSubscriber;
use crate::GpuSession;
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
}

impl NodeOptions {
    /// A node named `name` in the root namespace.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), namespace: "/".into(), domain: None, enclave: "/".into() }
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
    /// A Zenoh declaration failed.
    #[error("zenoh: {0}")]
    Zenoh(String),
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
    token: String,
    _token: zenoh::liveliness::LivelinessToken,
}

/// A ROS node. Cheap to clone; its token is undeclared when the last clone (and the
/// last publisher or subscription made from it) is dropped.
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
    pub fn new(session: &GpuSession, options: NodeOptions) -> Result<Self, RosDeclareError> {
        check_name("node name", &options.name, false)?;
        for (what, v) in [("namespace", &options.namespace), ("enclave", &options.enclave)] {
            if v != "/" {
                check_name(what, v, true)?;
                if !v.starts_with('/') || v.ends_with('/') {
                    return Err(NameError::Invalid { what, name: v.clone() }.into());
                }
            }
        }
        let domain = match options.domain {
            Some(d) => d,
            None => match std::env::var("ROS_DOMAIN_ID") {
                Ok(v) if !v.is_empty() => v.trim().parse().map_err(|_| RosDeclareError::DomainId(v))?,
                _ => 0,
            },
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
        Ok(Self(Arc::new(NodeInner { session: session.clone(), name, graph, token, _token: tok })))
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
    /// tokens were ignored as malformed.
    pub fn graph(&self) -> (Vec<Entity>, u64) {
        self.0.graph.snapshot()
    }

    /// Subscriptions on the data key `key` that are not GPU-capable subscriptions of
    /// ours: the ones a GPU publisher copies device→host for.
    pub fn ordinary_subscriptions(&self, key: &str) -> usize {
        self.0.graph.ordinary_subscriptions(key)
    }

    /// Declares a publisher of `M` on `topic` (e.g. `/camera/image`).
    pub fn publisher<M: RosDataMessage>(&self, topic: &str, qos: Qos) -> Result<RosPublisher<M>, RosDeclareError> {
        RosPublisher::new(self.clone(), topic, qos)
    }

    /// Declares a subscription to `M` on `topic` that takes our channel from our
    /// publishers and the base key from every other ROS publisher.
    pub fn subscriber<M: RosDataMessage>(&self, topic: &str, qos: Qos) -> Result<RosSubscriber<M>, RosDeclareError> {
        RosSubscriber::new(self.clone(), topic, qos)
    }
}
