//! Host blocks, for the subscribers of a CUDA publisher's host that do not map its GPU's
//! memory (processes without CUDA, which read them in place, and GPUs without peer
//! access, which copy them onto theirs): each message copied once, device→host, into a
//! sealed memfd block page-locked for the driver, on a stream of the lane's own after
//! the producer's ready signal, and shared by every such subscriber. The put only enqueues
//! the copy; the lane's thread waits for it and then sends the descriptors. Every frame
//! to these subscribers goes through the lane, so each sees its messages in sequence.
//!
//! The lane is made when the first such subscriber says Hello, and copies only while
//! one is routed to.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::server::send_reply;
use super::{Shared, inc};
use crate::cuda::{Fence, Gpu, Stream};
use crate::host::HostBlock;
use crate::ipc::ControlConn;
use crate::medium::PublishedAny;
use crate::pool::backend::PinnedHostBackend;
use crate::pool::{BlockMemory, CapabilityKey, HolderId, Pool, PoolConfig, Published};
use crate::protocol::{Descriptor, Reply};
use crate::signal::ReadySignals;
use crate::sync::Unpoisoned;

/// A publisher's host blocks: their pool, the stream their copies run on, the probe a
/// host-memory subscriber imports in its handshake, and the thread that sends what
/// goes to those subscribers.
pub(crate) struct HostLane {
    pool: Pool<PinnedHostBackend>,
    gpu: Gpu,
    stream: Stream,
    probe: HostBlock,
    pub(super) probe_token: u64,
    jobs: flume::Sender<Job>,
}

/// What the lane's thread sends, in the order it was given.
enum Job {
    /// A message being copied into `block`: once `done`, `descriptor` goes to each of
    /// `holders` (each already charged a lease).
    Copied { done: Arc<Fence>, block: Published<PinnedHostBackend>, descriptor: Vec<u8>, holders: Vec<u64> },
    /// A frame that needs no copy (an inline message, a `ViaBytes`).
    Frame { frame: Vec<u8>, holders: Vec<u64> },
    /// A subscriber left: `Left` is the last frame it is sent.
    Left { conn: Arc<ControlConn> },
}

/// Why a host block could not be prepared for a message (its host-memory subscribers
/// get it as bytes).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LaneError {
    /// No host block is free, or none can be allocated.
    #[error("no host block")]
    Loan(#[from] crate::pool::LoanError),
    /// The copy could not be enqueued.
    #[error("cannot enqueue the device→host copy")]
    Copy(#[from] crate::signal::SignalError),
}

impl HostLane {
    /// A lane for a publisher on `gpu` whose pool is configured by `cfg` and keyed by
    /// `cap_key`; its thread sends through `sh` while the publisher exists.
    pub(super) fn new(
        gpu: &Gpu,
        cfg: &PoolConfig,
        cap_key: CapabilityKey,
        sh: Weak<Shared>,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        // A loan never waits: with no host block free, those subscribers get bytes and
        // the put goes on (a slow CPU reader must not slow the GPU ones).
        let cfg = PoolConfig { loan_timeout_ms: 0, ..cfg.clone() };
        let pool = Pool::keyed(PinnedHostBackend::new(gpu.clone()), cfg, cap_key)?;
        let stream = gpu.new_stream()?;
        let probe_token = rand::random::<u64>();
        let probe = HostBlock::create(c"zcs-probe", 4096)?;
        // SAFETY: the probe block is 4096 bytes, mapped read-write, and not yet shared.
        unsafe { (probe.as_ptr() as *mut u64).write(probe_token) };
        let (jobs, rx) = flume::unbounded();
        std::thread::Builder::new().name("zcs-pub-host".into()).spawn(move || run(&rx, &sh))?;
        Ok(Self { pool, gpu: gpu.clone(), stream, probe, probe_token, jobs })
    }

    pub(crate) fn pool(&self) -> &Pool<PinnedHostBackend> {
        &self.pool
    }

    pub(super) fn probe(&self) -> &HostBlock {
        &self.probe
    }

    /// Loans a host block for `source`'s first `len` bytes (at once or not at all) and
    /// enqueues the copy into it, ordered after `source`'s ready signal; returns the
    /// block, published, and the fence the copy completes. `source` is held until then
    /// by the fence (the recycler's, not the lane's: a lane held up by a slow reader
    /// never keeps GPU blocks from the producer).
    pub(super) fn copy(
        &self,
        signals: &ReadySignals,
        source: &PublishedAny,
        len: usize,
    ) -> Result<(Published<PinnedHostBackend>, Arc<Fence>), LaneError> {
        let block = self.pool.loan_timeout(len, Duration::ZERO)?;
        let PublishedAny::Cuda(src) = source else { unreachable!("a lane belongs to a CUDA publisher") };
        let key = src.key();
        signals.wait(&self.stream, key.id, key.generation)?;
        // SAFETY: `src` holds its block (mapped, ≥ len bytes) and nothing writes it once
        // published; the host block is loaned to us for ≥ len bytes and nobody reads it
        // before its descriptor goes out, after the fence. The fence added to `src`
        // below, and the job that carries the host block, keep both until the copy is
        // done.
        unsafe { crate::cuda::copy::device_to_host_async(&self.stream, block.addr() as *mut u8, src.addr(), len) }
            .map_err(crate::signal::SignalError::from)?;
        let done = Fence::record(&self.gpu, &self.stream).map_err(|e| {
            // The block goes back to the pool with this error: not before the copy ends.
            let _ = crate::cuda::copy::wait(&self.stream);
            crate::signal::SignalError::from(e)
        })?;
        let done = Arc::new(done);
        src.add_fence(Arc::clone(&done));
        Ok((block.publish(), done))
    }

    /// Queues a copied message for `holders`; sent once the copy is done.
    pub(super) fn send_copied(
        &self,
        done: Arc<Fence>,
        block: Published<PinnedHostBackend>,
        descriptor: Vec<u8>,
        holders: Vec<u64>,
    ) {
        let _ = self.jobs.send(Job::Copied { done, block, descriptor, holders });
    }

    /// Queues a frame for `holders`, after what is queued already.
    pub(super) fn send_frame(&self, frame: Vec<u8>, holders: Vec<u64>) {
        let _ = self.jobs.send(Job::Frame { frame, holders });
    }

    /// Queues the `Left` of a subscriber that left, after what is queued for it.
    pub(super) fn send_left(&self, conn: Arc<ControlConn>) {
        let _ = self.jobs.send(Job::Left { conn });
    }

    /// The descriptor of a host block holding a message.
    pub(super) fn descriptor(block: &Published<PinnedHostBackend>, mut d: Descriptor) -> Descriptor {
        d.block = block.key();
        d.capability = block.capability();
        d.block_size = block.memory().block().size() as u64;
        d.offset = 0;
        d.lent = None;
        d
    }
}

/// The lane's thread: sends each job in turn, until the publisher is gone.
fn run(jobs: &flume::Receiver<Job>, sh: &Weak<Shared>) {
    while let Ok(job) = jobs.recv() {
        let Some(sh) = sh.upgrade() else { return };
        match job {
            Job::Copied { done, block, descriptor, holders } => {
                let copied = done.wait();
                let Some(lane) = sh.host_lane.get() else { unreachable!("jobs come from the lane") };
                match copied {
                    Ok(()) => lane.announce(&sh, &block, &descriptor, &holders),
                    Err(e) => {
                        for &h in &holders {
                            let _ = lane.pool.release(block.key(), HolderId::new(h));
                        }
                        tracing::error!(
                            error = %crate::error::Chain(&e),
                            subscribers = holders.len(),
                            "device→host copy failed: message lost for host-memory subscribers"
                        );
                    }
                }
            }
            Job::Frame { frame, holders } => {
                let mut st = sh.state.locked();
                for h in holders {
                    st.push(h, &frame, &sh.counters);
                }
            }
            Job::Left { conn } => {
                send_reply(&conn, &Reply::Left, &[]);
            }
        }
    }
}

impl HostLane {
    /// Sends a copied block's descriptor to each holder still routed to (its FD with
    /// the first descriptor of that block), releasing the leases of those that are gone.
    fn announce(&self, sh: &Shared, block: &Published<PinnedHostBackend>, descriptor: &[u8], holders: &[u64]) {
        let key = block.key();
        let c = &sh.counters;
        let fd = block.memory().fd();
        let mut st = sh.state.locked();
        for &h in holders {
            let first = match st.ready.get_mut(&h) {
                Some(r) => r.first_descriptor_of(key),
                None => {
                    // Gone or left since the put: nobody will release it.
                    let _ = self.pool.release(key, HolderId::new(h));
                    continue;
                }
            };
            if st.push_with(h, descriptor, if first { std::slice::from_ref(&fd) } else { &[] }, c) {
                if first {
                    inc(&c.fds_pushed);
                }
            } else {
                let _ = self.pool.release(key, HolderId::new(h));
            }
        }
    }
}
