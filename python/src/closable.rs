//! What a session closes when it closes: its publishers and subscribers.

/// Something a session closes when it closes.
pub(crate) trait Closable: Send + Sync {
    /// Undeclares and lets go of the Rust object (idempotent).
    fn close(&self);
}
