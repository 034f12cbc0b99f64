//! What a release waits for: GPU (or other asynchronous) work that still uses a block.

/// Completion of GPU (or other asynchronous) work that still uses a block.
pub trait Fence: Send + 'static {
    /// Whether the work has completed. Must not block. An error (a broken context)
    /// should report `true` after logging: work on a dead context never completes.
    fn is_complete(&self) -> bool;
}

impl Fence for crate::cuda::Fence {
    fn is_complete(&self) -> bool {
        match crate::cuda::Fence::is_complete(self) {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "fence query failed; treating the work as finished");
                true
            }
        }
    }
}

/// One fence awaited by several releases (a copy that frees one block and makes another
/// readable).
impl<F: Fence + Sync> Fence for std::sync::Arc<F> {
    fn is_complete(&self) -> bool {
        F::is_complete(self)
    }
}
