//! Blocking receives from Python: waiting in slices, without the GIL, that notice Ctrl-C
//! and `close()`.

use std::time::{Duration, Instant};

use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use zenoh_cuda_shm::RecvError;

use crate::ClosedError;

/// How long a blocking receive sleeps at most between checks for signals (Ctrl-C) and
/// for `close()`.
const POLL: Duration = Duration::from_millis(50);

/// Calls `attempt(wait)` without the GIL, in slices of at most [`POLL`], until it gives a
/// value or `timeout` seconds (`None`: forever) have passed: `TimeoutError` then, naming
/// `what` ("sample on \"k\""); `ClosedError` naming `closed` when it reports the queue
/// closed; `ValueError` for a timeout that is not a finite number ≥ 0. `attempt` runs
/// anew each slice, so a `close()` in between is seen.
pub(crate) fn recv_within<T: Send>(
    py: Python<'_>,
    timeout: Option<f64>,
    what: &str,
    closed: &str,
    mut attempt: impl FnMut(Duration) -> PyResult<Result<T, RecvError>> + Send,
) -> PyResult<T> {
    let deadline = match timeout {
        None => None,
        Some(t) if t.is_finite() && t >= 0.0 => Some(Instant::now() + Duration::from_secs_f64(t)),
        Some(t) => return Err(PyValueError::new_err(format!("timeout must be a finite number ≥ 0, got {t}"))),
    };
    loop {
        let wait = deadline.map_or(POLL, |d| d.saturating_duration_since(Instant::now()).min(POLL));
        match py.detach(|| attempt(wait))? {
            Ok(v) => return Ok(v),
            Err(RecvError::Closed) => return Err(ClosedError::new_err(format!("the {closed} is closed"))),
            Err(_) => {}
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(PyTimeoutError::new_err(format!("no {what} within {timeout:?} s")));
        }
    }
}
