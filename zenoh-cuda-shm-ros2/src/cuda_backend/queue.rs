//! Descriptors imported off Zenoh's threads: the first import of a block connects to
//! its socket and may wait for it (up to 2 s), which must not hold up the other keys a
//! Zenoh thread delivers. One thread per subscription keeps arrival order. Between
//! messages it also forgets the blocks of exited publishers, and gives back the counts
//! that dead processes of ours held on the backend's blocks
//! ([`reap_dead_holders`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensor_codec::cdr::CudaBufferDescriptor;
use zcs_wire::rosidl_cuda::reap_dead_holders;

use super::{BackendBuffer, BackendImportError, BackendImports};

/// How often the thread forgets the blocks of exited publishers.
const EVICT_EVERY: Duration = Duration::from_secs(1);
/// How often it looks for the hold journals of dead processes (a scan of `/dev/shm`).
const REAP_EVERY: Duration = Duration::from_secs(10);

/// The sending end: descriptors with what the subscription needs to deliver each.
pub(crate) struct ImportQueue<T>(flume::Sender<(Box<CudaBufferDescriptor>, T)>);

impl<T> ImportQueue<T> {
    /// Queues `d`; `false` once the thread is gone.
    pub(crate) fn push(&self, d: Box<CudaBufferDescriptor>, with: T) -> bool {
        self.0.send((d, with)).is_ok()
    }
}

/// Starts the thread: every queued descriptor is imported into `imports` and handed
/// to `done` with its companion, in order. It ends when the queue is dropped.
///
/// # Errors
/// The thread could not be started.
pub(crate) fn spawn_importer<T: Send + 'static>(
    name: String,
    imports: Arc<BackendImports>,
    done: impl Fn(T, Result<BackendBuffer, BackendImportError>) + Send + 'static,
) -> std::io::Result<ImportQueue<T>> {
    let (tx, rx) = flume::unbounded::<(Box<CudaBufferDescriptor>, T)>();
    std::thread::Builder::new().name(name).spawn(move || {
        reap_dead_holders();
        let (mut evicted, mut reaped) = (Instant::now(), Instant::now());
        loop {
            match rx.recv_timeout(EVICT_EVERY) {
                Ok((d, with)) => done(with, imports.import(&d)),
                Err(flume::RecvTimeoutError::Timeout) => {}
                Err(flume::RecvTimeoutError::Disconnected) => break,
            }
            if evicted.elapsed() >= EVICT_EVERY {
                imports.evict_dead();
                evicted = Instant::now();
            }
            if reaped.elapsed() >= REAP_EVERY {
                reap_dead_holders();
                reaped = Instant::now();
            }
        }
    })?;
    Ok(ImportQueue(tx))
}
