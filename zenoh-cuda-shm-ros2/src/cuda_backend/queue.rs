//! Descriptors imported off Zenoh's threads where that can wait: the first import of a
//! block connects to its socket and may wait for it (up to 2 s), which must not hold up
//! the other keys a Zenoh thread delivers. That goes to one thread per subscription. A
//! descriptor of a block already mapped here is imported where it arrives (a count, a
//! reuse-id check and the event opened: no wait), unless earlier ones are still queued,
//! so arrival order is kept either way. Between messages the thread also forgets the
//! blocks of exited publishers, and gives back the counts that dead processes of ours
//! held on the backend's blocks ([`reap_dead_holders`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tensor_codec::cdr::CudaBufferDescriptor;
use zcs_wire::rosidl_cuda::reap_dead_holders;

use super::{BackendBuffer, BackendImportError, BackendImports};
use crate::sync::Unpoisoned;

/// How often the thread forgets the blocks of exited publishers.
const EVICT_EVERY: Duration = Duration::from_secs(1);
/// How often it looks for the hold journals of dead processes (a scan of `/dev/shm`).
const REAP_EVERY: Duration = Duration::from_secs(10);

type Done<T> = Arc<dyn Fn(T, Result<BackendBuffer, BackendImportError>) + Send + Sync>;

/// The sending end: descriptors with what the subscription needs to deliver each.
pub(crate) struct ImportQueue<T> {
    tx: flume::Sender<(Box<CudaBufferDescriptor>, T)>,
    imports: Arc<BackendImports>,
    done: Done<T>,
    /// Queued and not done yet: while any is, later descriptors queue behind them.
    pending: Arc<AtomicUsize>,
    /// Held while choosing between importing here and queueing.
    order: Mutex<()>,
}

impl<T> ImportQueue<T> {
    /// Imports `d` here if its block is mapped already and nothing is queued, else
    /// queues it; `false` once the thread is gone.
    pub(crate) fn push(&self, d: Box<CudaBufferDescriptor>, with: T) -> bool {
        let _order = self.order.locked();
        if self.pending.load(Ordering::Acquire) == 0
            && let Some(imported) = self.imports.import_cached(&d)
        {
            (self.done)(with, imported);
            return true;
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        let sent = self.tx.send((d, with)).is_ok();
        if !sent {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
        sent
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
    done: impl Fn(T, Result<BackendBuffer, BackendImportError>) + Send + Sync + 'static,
) -> std::io::Result<ImportQueue<T>> {
    let (tx, rx) = flume::unbounded::<(Box<CudaBufferDescriptor>, T)>();
    let done: Done<T> = Arc::new(done);
    let pending = Arc::new(AtomicUsize::new(0));
    let (thread_imports, thread_done, thread_pending) = (Arc::clone(&imports), Arc::clone(&done), Arc::clone(&pending));
    std::thread::Builder::new().name(name).spawn(move || {
        reap_dead_holders();
        let (mut evicted, mut reaped) = (Instant::now(), Instant::now());
        loop {
            match rx.recv_timeout(EVICT_EVERY) {
                Ok((d, with)) => {
                    thread_done(with, thread_imports.import(&d));
                    // After delivering: a descriptor imported where it arrives from now
                    // on comes after this one.
                    thread_pending.fetch_sub(1, Ordering::AcqRel);
                }
                Err(flume::RecvTimeoutError::Timeout) => {}
                Err(flume::RecvTimeoutError::Disconnected) => break,
            }
            if evicted.elapsed() >= EVICT_EVERY {
                thread_imports.evict_dead();
                evicted = Instant::now();
            }
            if reaped.elapsed() >= REAP_EVERY {
                reap_dead_holders();
                reaped = Instant::now();
            }
        }
    })?;
    Ok(ImportQueue { tx, imports, done, pending, order: Mutex::new(()) })
}
