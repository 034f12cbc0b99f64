//! What a session closes when it closes (its publishers, subscribers and nodes), and the
//! handle each of them keeps its Rust object in until then.

use std::sync::{Arc, RwLock};

use pyo3::PyResult;

use crate::ClosedError;

/// Something a session closes when it closes.
pub(crate) trait Closable: Send + Sync {
    /// Undeclares and lets go of the Rust object (idempotent).
    fn close(&self);
}

/// A Rust object until it is closed, then `ClosedError` naming `what` ("the publisher on
/// \"k\"").
pub(crate) struct Handle<T> {
    inner: RwLock<Option<Arc<T>>>,
    what: String,
}

impl<T> Handle<T> {
    pub(crate) fn new(value: T, what: String) -> Self {
        Self { inner: RwLock::new(Some(Arc::new(value))), what }
    }

    /// The object, or `ClosedError` once closed.
    pub(crate) fn get(&self) -> PyResult<Arc<T>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ClosedError::new_err(format!("the {} is closed", self.what)))
    }

    /// Lets go of the object (it is undeclared once the last `get` clone is dropped).
    pub(crate) fn close(&self) {
        drop(self.inner.write().unwrap_or_else(|p| p.into_inner()).take());
    }
}
