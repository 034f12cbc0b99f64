//! `open()` and `Session`.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use zenoh::Wait;
use zenoh_cuda_shm::config::PeerGpus;
use zenoh_cuda_shm::{GpuSession, ZcsConfig};

use crate::closable::Closable;
use crate::publisher::{PubState, Publisher};
use crate::subscriber::{SubState, Subscriber};
use crate::{ClosedError, chain, zcs_err};

pub(crate) struct SessionState {
    session: RwLock<Option<GpuSession>>,
    children: Mutex<Vec<Weak<dyn Closable>>>,
}

impl SessionState {
    pub(crate) fn get(&self) -> PyResult<GpuSession> {
        self.session
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ClosedError::new_err("the session is closed"))
    }

    pub(crate) fn adopt(&self, child: Weak<dyn Closable>) {
        let mut c = self.children.lock().unwrap_or_else(|p| p.into_inner());
        c.retain(|w| w.strong_count() > 0);
        c.push(child);
    }
}

/// A configuration given as JSON5 text or a path to a JSON5 file.
enum ConfigSource {
    Text(String),
    File(std::path::PathBuf),
}

fn config_source(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<ConfigSource>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    if let Ok(s) = obj.extract::<String>() {
        return Ok(Some(ConfigSource::Text(s)));
    }
    if let Ok(p) = obj.extract::<std::path::PathBuf>() {
        return Ok(Some(ConfigSource::File(p)));
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be JSON5 text or a path (the Python layer also takes a dict), not {}",
        obj.get_type().name()?
    )))
}

/// Opens a session. `config` configures this library (`ZcsConfig`: JSON5 text or a
/// file path; `ZCS_*` environment variables override it), `zenoh` configures Zenoh
/// (JSON5 text or a file path; Zenoh's defaults when `None`).
#[pyfunction]
#[pyo3(signature = (config = None, zenoh = None))]
pub fn open(py: Python<'_>, config: Option<&Bound<'_, PyAny>>, zenoh: Option<&Bound<'_, PyAny>>) -> PyResult<Session> {
    let bad = |what: &str, e: &dyn std::error::Error| PyValueError::new_err(format!("{what}: {}", chain(e)));
    let cfg = match config_source(config, "config")? {
        None => ZcsConfig::default(),
        // The error says "invalid configuration: …" itself.
        Some(ConfigSource::Text(t)) => ZcsConfig::from_json5(&t).map_err(|e| PyValueError::new_err(chain(&e)))?,
        Some(ConfigSource::File(p)) => ZcsConfig::from_file(p).map_err(|e| PyValueError::new_err(chain(&e)))?,
    };
    let cfg = cfg.with_env_overrides().map_err(|e| bad("invalid environment override", &e))?;
    let zcfg = match config_source(zenoh, "zenoh")? {
        None => zenoh::Config::default(),
        Some(ConfigSource::Text(t)) => {
            zenoh::Config::from_json5(&t).map_err(|e| PyValueError::new_err(format!("invalid zenoh config: {e}")))?
        }
        Some(ConfigSource::File(p)) => {
            zenoh::Config::from_file(p).map_err(|e| PyValueError::new_err(format!("invalid zenoh config: {e}")))?
        }
    };
    let session = py.detach(|| GpuSession::open(zcfg, cfg).wait()).map_err(|e| zcs_err(&e))?;
    Ok(Session {
        state: Arc::new(SessionState { session: RwLock::new(Some(session)), children: Mutex::new(Vec::new()) }),
    })
}

/// A Zenoh session with a GPU (or host-memory) block provider.
#[pyclass(frozen, module = "zenoh_cuda_shm._native")]
pub struct Session {
    pub(crate) state: Arc<SessionState>,
}

#[pymethods]
impl Session {
    /// Declares a publisher on a concrete key.
    fn declare_publisher(&self, py: Python<'_>, key: String) -> PyResult<Publisher> {
        let s = self.state.get()?;
        let publisher = py.detach(|| s.declare_publisher(key.clone()).wait()).map_err(|e| zcs_err(&e))?;
        let state = Arc::new(PubState::new(publisher, s.gpu().cloned(), key).map_err(|e| zcs_err(&e))?);
        self.state.adopt(Arc::downgrade(&state) as Weak<dyn Closable>);
        Ok(Publisher { state })
    }

    /// Declares a subscriber on a key expression, delivering through a FIFO queue of
    /// `capacity` samples (when it is full, a new sample replaces the oldest, counted in
    /// `dropped_queue_full`: delivery never waits for the application).
    /// `peer_gpus` (`"in_place"`, `"copy"`, `"host"` or `"off"`) overrides the session's
    /// choice for publishers on another GPU of this host.
    #[pyo3(signature = (key, capacity = 256, peer_gpus = None))]
    fn declare_subscriber(
        &self,
        py: Python<'_>,
        key: String,
        capacity: usize,
        peer_gpus: Option<&str>,
    ) -> PyResult<Subscriber> {
        if capacity == 0 {
            return Err(PyValueError::new_err("capacity must be at least 1"));
        }
        let peer_gpus = match peer_gpus {
            None => None,
            Some("in_place") => Some(PeerGpus::InPlace),
            Some("copy") => Some(PeerGpus::Copy),
            Some("host") => Some(PeerGpus::Host),
            Some("off") => Some(PeerGpus::Off),
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "peer_gpus must be \"in_place\", \"copy\", \"host\" or \"off\", not {other:?}"
                )));
            }
        };
        let s = self.state.get()?;
        let sub = py
            .detach(|| {
                let b = s.declare_subscriber(key.clone()).fifo(capacity);
                match peer_gpus {
                    Some(mode) => b.peer_gpus(mode).wait(),
                    None => b.wait(),
                }
            })
            .map_err(|e| zcs_err(&e))?;
        let state = Arc::new(SubState::new(sub, key));
        self.state.adopt(Arc::downgrade(&state) as Weak<dyn Closable>);
        Ok(Subscriber { state })
    }

    /// Closes every publisher and subscriber of the session, then the Zenoh session.
    /// Samples already received stay readable. Idempotent.
    fn close(&self, py: Python<'_>) {
        let Some(session) = self.state.session.write().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let children = std::mem::take(&mut *self.state.children.lock().unwrap_or_else(|p| p.into_inner()));
        py.detach(|| {
            for c in children.iter().filter_map(Weak::upgrade) {
                c.close();
            }
            if let Err(e) = session.zenoh().close().wait() {
                tracing::warn!(error = %e, "closing the zenoh session failed");
            }
            drop(session);
        });
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.state.session.read().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Where blocks live: `"cuda-vmm"` or `"host-memfd"`.
    #[getter]
    fn backend(&self) -> PyResult<String> {
        Ok(self.state.get()?.backend().to_string())
    }

    /// Why the session uses host memory, if it does.
    #[getter]
    fn host_reason(&self) -> PyResult<Option<String>> {
        Ok(self.state.get()?.host_reason().map(str::to_owned))
    }

    /// The CUDA device ordinal, for CUDA sessions.
    #[getter]
    fn gpu_ordinal(&self) -> PyResult<Option<usize>> {
        Ok(self.state.get()?.gpu().map(|g| g.ordinal()))
    }

    /// The GPU's name, for CUDA sessions.
    #[getter]
    fn gpu_name(&self) -> PyResult<Option<String>> {
        Ok(self.state.get()?.gpu().map(|g| g.name().to_owned()))
    }

    /// The keys of this library's publishers the session sees now (sorted, each once),
    /// waiting at most `timeout` seconds for answers; with `other_than`, those that key
    /// expression does not match (where to look when a subscriber hears nothing). Plain
    /// Zenoh publishers are not listed.
    #[pyo3(signature = (timeout = 0.5, other_than = None))]
    fn publisher_keys(&self, py: Python<'_>, timeout: f64, other_than: Option<String>) -> PyResult<Vec<String>> {
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(PyValueError::new_err(format!("timeout must be a finite number ≥ 0, got {timeout}")));
        }
        if let Some(k) = &other_than {
            zenoh::key_expr::KeyExpr::try_from(k.as_str())
                .map_err(|e| PyValueError::new_err(format!("other_than is not a key expression: {}", chain(&*e))))?;
        }
        let s = self.state.get()?;
        let timeout = Duration::from_secs_f64(timeout);
        py.detach(|| match &other_than {
            Some(k) => s.other_publisher_keys(k, timeout),
            None => s.publisher_keys(timeout),
        })
        .map_err(|e| zcs_err(&*e))
    }

    /// The Zenoh session id.
    #[getter]
    fn zid(&self) -> PyResult<String> {
        Ok(self.state.get()?.zenoh().zid().to_string())
    }

    fn __repr__(&self) -> String {
        match self.state.get() {
            Ok(s) => format!("<zenoh_cuda_shm.Session backend={}>", s.backend()),
            Err(_) => "<zenoh_cuda_shm.Session closed>".to_owned(),
        }
    }
}
