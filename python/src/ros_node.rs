//! `RosNode`: a node of this library in an rmw_zenoh graph (`zenoh_cuda_shm.ros2.Node`),
//! which declares publishers and subscriptions of Image, ExperimentalTensor and String.

use std::sync::{Arc, Weak};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zenoh_cuda_shm_ros2::names::gid_hex;
use zenoh_cuda_shm_ros2::{Durability, History, NodeOptions, Qos, Reliability, RmwWire, RosNode};

use crate::closable::{Closable, Handle};
use crate::ros_publisher::{RosPub, RosPubState, TypedPub};
use crate::ros_subscription::{RosSub, RosSubState, TypedSub};
use crate::session::{Session, SessionState};
use crate::zcs_err;

/// The message types, as the Python layer names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Image,
    Tensor,
    Text,
}

impl Kind {
    fn parse(kind: &str) -> PyResult<Self> {
        match kind {
            "image" => Ok(Kind::Image),
            "tensor" => Ok(Kind::Tensor),
            "string" => Ok(Kind::Text),
            k => Err(PyValueError::new_err(format!("unknown message kind {k:?} (image, tensor or string)"))),
        }
    }
}

/// A QoS profile as `(reliability, durability, history, depth)` in rclpy's words
/// (`"reliable"`/`"best_effort"`, `"volatile"`/`"transient_local"`,
/// `"keep_last"`/`"keep_all"`).
pub(crate) fn qos(profile: (String, String, String, u32)) -> PyResult<Qos> {
    let (reliability, durability, history, depth) = profile;
    let reliability = match reliability.as_str() {
        "reliable" => Reliability::Reliable,
        "best_effort" => Reliability::BestEffort,
        r => return Err(PyValueError::new_err(format!("reliability must be reliable or best_effort, not {r:?}"))),
    };
    let durability = match durability.as_str() {
        "volatile" => Durability::Volatile,
        "transient_local" => Durability::TransientLocal,
        d => return Err(PyValueError::new_err(format!("durability must be volatile or transient_local, not {d:?}"))),
    };
    let history = match (history.as_str(), depth) {
        ("keep_all", _) => History::KeepAll,
        ("keep_last", 0) => return Err(PyValueError::new_err("keep_last needs a depth of at least 1")),
        ("keep_last", d) => History::KeepLast(d),
        (h, _) => return Err(PyValueError::new_err(format!("history must be keep_last or keep_all, not {h:?}"))),
    };
    Ok(Qos { reliability, durability, history, ..Qos::default() })
}

pub(crate) struct NodeState {
    node: Handle<RosNode>,
    session: Arc<SessionState>,
    pub(crate) name: String,
}

impl NodeState {
    pub(crate) fn get(&self) -> PyResult<RosNode> {
        self.node.get().map(|n| RosNode::clone(&n))
    }
}

impl Closable for NodeState {
    fn close(&self) {
        self.node.close();
    }
}

/// Declares a node named `name` in `namespace`. `domain`: the ROS domain id (`None`:
/// `ROS_DOMAIN_ID`, else 0); `distro`: the ROS distro whose rmw_zenoh wire to speak
/// (`None`: `ROS_DISTRO`, else the current wire); `silence_after`: seconds after which
/// a publisher that never reached a subscription is reported (`None`: never).
#[pyfunction]
#[pyo3(signature = (session, name, namespace = "/".to_owned(), domain = None, distro = None, silence_after = Some(5.0)))]
pub fn ros2_node(
    py: Python<'_>,
    session: &Session,
    name: String,
    namespace: String,
    domain: Option<u32>,
    distro: Option<&str>,
    silence_after: Option<f64>,
) -> PyResult<Node> {
    let s = session.state.get()?;
    let window = match silence_after {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 => Some(Duration::from_secs_f64(t)),
        Some(t) => return Err(PyValueError::new_err(format!("silence_after must be a number > 0 or None, got {t}"))),
    };
    let mut options = NodeOptions::new(name.clone()).namespace(namespace).silence_window(window);
    options.domain = domain;
    if let Some(d) = distro {
        let wire = RmwWire::for_distro(d).ok_or_else(|| {
            PyValueError::new_err(format!("unknown ROS distro {d:?} (humble, jazzy, kilted, lyrical, rolling)"))
        })?;
        options = options.rmw_wire(wire);
    }
    let node = py.detach(|| RosNode::new(&s, options)).map_err(|e| match e {
        zenoh_cuda_shm_ros2::RosDeclareError::Name(_) | zenoh_cuda_shm_ros2::RosDeclareError::DomainId(_) => {
            PyValueError::new_err(crate::chain(&e))
        }
        e => zcs_err(&e),
    })?;
    let state = Arc::new(NodeState {
        node: Handle::new(node, format!("node {name:?}")),
        session: Arc::clone(&session.state),
        name,
    });
    session.state.adopt(Arc::downgrade(&state) as Weak<dyn Closable>);
    Ok(Node { state })
}

/// `(dtype name, channels)` of an Image encoding (`"rgb8"` → `("uint8", 3)`), as
/// `sensor_msgs/image_encodings.hpp` defines it; `None` for one with no tensor layout.
#[pyfunction]
pub fn pixel_layout(encoding: &str) -> Option<(&'static str, u32)> {
    zenoh_cuda_shm::tensor_codec::cdr::pixel_layout(encoding).map(|(d, c)| (crate::dtype::name(d), c))
}

/// A ROS 2 node (see `ros2_node`).
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct Node {
    state: Arc<NodeState>,
}

fn declare_err(e: &zenoh_cuda_shm_ros2::RosDeclareError) -> PyErr {
    match e {
        zenoh_cuda_shm_ros2::RosDeclareError::Name(_) => PyValueError::new_err(crate::chain(e)),
        e => zcs_err(e),
    }
}

#[pymethods]
impl Node {
    /// Declares a publisher of `kind` (`"image"`, `"tensor"`, `"string"`) on `topic`
    /// (absolute, relative to the node's namespace, or `~/…`) with `qos`.
    fn create_publisher(
        &self,
        py: Python<'_>,
        kind: &str,
        topic: &str,
        qos_profile: (String, String, String, u32),
    ) -> PyResult<RosPub> {
        let (kind, q, node) = (Kind::parse(kind)?, qos(qos_profile)?, self.state.get()?);
        let typed = py
            .detach(|| -> Result<TypedPub, zenoh_cuda_shm_ros2::RosDeclareError> {
                Ok(match kind {
                    Kind::Image => TypedPub::Image(node.publisher(topic, q)?),
                    Kind::Tensor => TypedPub::Tensor(node.publisher(topic, q)?),
                    Kind::Text => TypedPub::Text(node.publisher(topic, q)?),
                })
            })
            .map_err(|e| declare_err(&e))?;
        let state = Arc::new(RosPubState::new(typed, node.session().gpu().cloned()));
        self.state.session.adopt(Arc::downgrade(&state) as Weak<dyn Closable>);
        Ok(RosPub { state })
    }

    /// Declares a subscription of `kind` on `topic` with `qos`.
    fn create_subscription(
        &self,
        py: Python<'_>,
        kind: &str,
        topic: &str,
        qos_profile: (String, String, String, u32),
    ) -> PyResult<RosSub> {
        let (kind, q, node) = (Kind::parse(kind)?, qos(qos_profile)?, self.state.get()?);
        let typed = py
            .detach(|| -> Result<TypedSub, zenoh_cuda_shm_ros2::RosDeclareError> {
                Ok(match kind {
                    Kind::Image => TypedSub::Image(node.subscriber(topic, q)?),
                    Kind::Tensor => TypedSub::Tensor(node.subscriber(topic, q)?),
                    Kind::Text => TypedSub::Text(node.subscriber(topic, q)?),
                })
            })
            .map_err(|e| declare_err(&e))?;
        let state = Arc::new(RosSubState::new(typed));
        self.state.session.adopt(Arc::downgrade(&state) as Weak<dyn Closable>);
        Ok(RosSub { state })
    }

    /// The full topic name `topic` resolves to for this node, as rcl resolves it.
    fn resolve_topic(&self, topic: &str) -> PyResult<String> {
        self.state.get()?.resolve_topic(topic).map_err(|e| PyValueError::new_err(crate::chain(&e)))
    }

    /// The node's graph as its tokens show it: one dict per node, publisher and
    /// subscription of its domain (`kind`, `node`, `namespace`, `gid`, and for
    /// endpoints `topic`, `type`, `type_hash`).
    fn graph<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let g = self.state.get()?.graph();
        g.entities
            .iter()
            .map(|e| {
                let d = PyDict::new(py);
                d.set_item("kind", format!("{:?}", e.kind).to_lowercase())?;
                d.set_item("node", &e.node)?;
                d.set_item("namespace", &e.namespace)?;
                d.set_item("gid", gid_hex(&e.gid))?;
                if let Some(t) = &e.topic {
                    d.set_item("topic", &t.name)?;
                    d.set_item("type", &t.dds_type)?;
                    d.set_item("type_hash", &t.hash)?;
                }
                Ok(d)
            })
            .collect()
    }

    /// Undeclares the node's token. Its publishers and subscriptions stay until closed.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.state.close());
    }

    /// Whether the node (or its session) is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.state.get().is_err()
    }

    /// The node's name.
    #[getter]
    fn name(&self) -> &str {
        &self.state.name
    }

    /// The ROS domain id.
    #[getter]
    fn domain(&self) -> PyResult<u32> {
        Ok(self.state.get()?.domain())
    }

    /// The rmw_zenoh wire the node speaks: `"classic"`, `"buffer-aware"` or `"humble"`.
    #[getter]
    fn wire(&self) -> PyResult<&'static str> {
        Ok(match self.state.get()?.rmw_wire() {
            RmwWire::Classic => "classic",
            RmwWire::BufferAware => "buffer-aware",
            RmwWire::Humble => "humble",
        })
    }

    /// The node's liveliness token.
    #[getter]
    fn token(&self) -> PyResult<String> {
        Ok(self.state.get()?.token().to_owned())
    }

    fn __repr__(&self) -> String {
        format!("<zenoh_cuda_shm.ros2.Node {:?}{}>", self.state.name, if self.closed() { " closed" } else { "" })
    }
}
