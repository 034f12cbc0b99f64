//! The native module of the `zenoh_cuda_shm` Python package (`zenoh_cuda_shm._native`).
//!
//! A thin layer over the Rust library: sessions, publishers (bytes, any object with
//! `__dlpack__`, and loans written in place), subscribers and received samples that
//! implement the DLPack protocol. The pure-Python package around it adds iteration,
//! async iteration, callbacks, context managers and dtype normalisation.
//!
//! Blocking calls (open, declare, put, loan, recv, exports that copy) run with the GIL
//! released. No Zenoh thread ever takes the GIL: callbacks are run by a Python thread
//! that receives from the subscriber's queue. DLPack deleters are pure Rust and never
//! unwind (see the `capsule` module).

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

mod capsule;
mod closable;
mod dtype;
mod loan;
mod publisher;
mod ros_node;
mod ros_publisher;
mod ros_subscription;
mod session;
mod stream;
mod subscriber;
mod wait;

create_exception!(_native, ZcsError, PyException, "Base class of the errors of zenoh_cuda_shm.");
create_exception!(_native, ClosedError, ZcsError, "The session, publisher or subscriber is closed.");
create_exception!(
    _native,
    LoanError,
    ZcsError,
    "No block could be loaned (pool exhausted, too large, allocation failed)."
);

pub(crate) use zenoh_cuda_shm::error::chain;

/// `ZcsError` with the error's chain of causes.
pub(crate) fn zcs_err(e: &dyn std::error::Error) -> PyErr {
    ZcsError::new_err(chain(e))
}

/// Installs a `tracing` subscriber that prints the library's log to stderr, filtered as
/// `RUST_LOG` would be (e.g. `"info"`, or `"zenoh_cuda_shm=debug,zcs=debug"`: the API's
/// targets start with `zenoh_cuda_shm`, its layer crates' with `zcs`). Only the first
/// call has an effect; returns whether it installed one.
#[pyfunction]
#[pyo3(signature = (filter = "info"))]
fn init_logging(filter: &str) -> PyResult<bool> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init().is_ok())
}

/// The element type names `loan()` accepts.
#[pyfunction]
fn dtype_names() -> Vec<&'static str> {
    dtype::names()
}

/// DLPack exports of received samples whose deleter has not run yet (for tests).
#[pyfunction]
fn _live_exports() -> usize {
    zenoh_cuda_shm::dlpack::live_exports()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ZcsError", py.get_type::<ZcsError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("LoanError", py.get_type::<LoanError>())?;
    m.add_function(wrap_pyfunction!(session::open, m)?)?;
    m.add_function(wrap_pyfunction!(init_logging, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(_live_exports, m)?)?;
    m.add_class::<session::Session>()?;
    m.add_class::<publisher::Publisher>()?;
    m.add_class::<loan::Loan>()?;
    m.add_class::<subscriber::Subscriber>()?;
    m.add_class::<subscriber::Sample>()?;
    m.add_function(wrap_pyfunction!(ros_node::ros2_node, m)?)?;
    m.add_function(wrap_pyfunction!(ros_node::pixel_layout, m)?)?;
    m.add_class::<ros_node::Node>()?;
    m.add_class::<ros_publisher::RosPub>()?;
    m.add_class::<ros_subscription::RosSub>()?;
    m.add_class::<ros_subscription::RosMsg>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
