//! Our blocks lent to subscriptions of ROS 2's CUDA buffer backend, in its own format,
//! so that an unmodified rclcpp node reads our frames in place.
//!
//! What a publisher of the backend provides for each block (`cuda_buffer` 0.1.2,
//! `cuda_memory_pool.cpp:213-287`, `cuda_buffer_ipc_manager.cpp:401-427`,
//! `cuda_buffer_backend_plugin.cpp:157-211`), we provide for each allocation of our
//! pool that reaches one of their subscriptions: a number unique in this process, from
//! 2³¹ up so as never to meet the backend's own pool in the same process (their
//! importers cache a mapping per (pid, number) until they exit, so a number never names
//! two allocations), the 24 shared bytes at `/dev/shm/cuda_vmm_<pid>_<number>`
//! (mode 0600), a socket serving the allocation's FD (from a private directory, to our
//! user only), and an interprocess event recorded after the writes of each message.
//!
//! Each publish draws a new reuse id, and the block stays out of our pool until their
//! count says no subscriber holds it **and** 100 ms have passed since the publish (their
//! subscribers count themselves only when the application takes the message:
//! `cuda_memory_pool.cpp:170-194`). Before the block goes back, its reuse id changes
//! again, so that a subscriber taking the message later is refused rather than handed
//! memory a new message is being written into. A block whose count stays up while every
//! process that was given its FD has died gets its count cleared: nothing else would
//! ever give it back. At most [`MAX_LENT`] blocks of one publisher are out at a time: a
//! publish at that limit waits up to [`GRACE`] for one to come back (the grace window
//! bounds the rate of lending, as it grows their publishers' pools), and past that
//! their subscriptions get CDR, so that a subscriber that keeps its messages cannot
//! drain our pool or stall us.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tensor_codec::cdr::{CudaBufferDescriptor, CudaDescriptorLayout};
use zcs_memory::cuda::{CudaError, Gpu, IpcEvent};
use zcs_wire::rosidl_cuda::server::default_dir;
use zcs_wire::rosidl_cuda::{BlockMeta, BlockMetaError, BlockServer, ServedSocket};
use zenoh_cuda_shm::api::{Allocation, DeviceAllocation, GpuLoan, SharedBlock};

use crate::sync::Unpoisoned;

/// How long a block stays out of our pool after a publish even at a count of zero: their
/// publishers' grace window (`grace_period_us_`, `cuda_memory_pool.hpp:147`).
pub const GRACE: Duration = Duration::from_millis(100);
/// The most blocks of one publisher lent to their subscriptions at a time. A publish
/// at this limit waits up to [`GRACE`] for one to come back.
pub const MAX_LENT: usize = 64;
/// How long a count may stay up with nobody given the block's FD before it is taken
/// for a subscriber that died between counting itself and connecting.
const UNCLAIMED: Duration = Duration::from_secs(2);
/// How often lent blocks are looked at.
const POLL: Duration = Duration::from_millis(5);

/// Our block numbers start here: a process may also run the backend's own pool, whose
/// numbers are a per-process counter (`cuda_memory_pool.cpp:213-287`), and a number names both a
/// shared file and, for their importers, a cached mapping.
const FIRST_NUMBER: u32 = 1 << 31;
static NEXT_NUMBER: AtomicU32 = AtomicU32::new(FIRST_NUMBER);
static SERVER: OnceLock<Result<BlockServer, String>> = OnceLock::new();

/// Why a block could not be lent (its subscriptions then get CDR).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The socket directory or the serving thread could not be made.
    #[error("cannot serve block FDs: {0}")]
    Server(String),
    /// The block's socket could not be bound, or its FD duplicated.
    #[error("cannot serve the block's FD")]
    Socket(#[source] std::io::Error),
    /// The block's shared bytes could not be made (a file of another user in the way).
    #[error(transparent)]
    Meta(#[from] BlockMetaError),
    /// The event could not be created, recorded or exported.
    #[error("CUDA refused the block's event")]
    Cuda(#[from] CudaError),
    /// The data is in host memory (the backend lends device memory only).
    #[error("the data is in host memory")]
    HostData,
    /// [`MAX_LENT`] blocks are out already.
    #[error("{MAX_LENT} blocks are lent already")]
    TooManyLent,
}

impl ExportError {
    /// A short name of the reason: `server`, `socket`, `block-file`, `cuda`,
    /// `host-data`, `too-many-lent`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Server(_) => "server",
            Self::Socket(_) => "socket",
            Self::Meta(_) => "block-file",
            Self::Cuda(_) => "cuda",
            Self::HostData => "host-data",
            Self::TooManyLent => "too-many-lent",
        }
    }
}

/// One allocation of ours as their subscribers know it.
struct Exported {
    allocation: Allocation,
    number: u32,
    size: usize,
    meta: BlockMeta,
    socket: ServedSocket,
    event: IpcEvent,
    handle: [u8; 64],
}

impl Drop for Exported {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.meta.path());
    }
}

/// A block lent for one publish.
struct Lent {
    /// Held: the block stays out of our pool until this is dropped.
    _block: SharedBlock,
    exported: Arc<Exported>,
    since: Instant,
}

/// Counters of a publisher's lending.
#[derive(Debug, Default)]
pub(crate) struct LendCounters {
    /// Blocks lent now.
    pub(crate) out: AtomicU64,
    /// Blocks whose count was cleared because their takers died.
    pub(crate) reclaimed: AtomicU64,
}

struct Shared {
    lent: Mutex<Vec<Lent>>,
    wake: Condvar,
    /// Signalled when blocks go back.
    returned: Condvar,
    counters: LendCounters,
    /// The publisher is gone.
    closed: AtomicBool,
}

/// The lending of one publisher's blocks.
pub(crate) struct Exports {
    gpu: Gpu,
    known: Mutex<Vec<Arc<Exported>>>,
    shared: Arc<Shared>,
}

impl Exports {
    /// Lends blocks of `gpu`; a thread gives them back to the pool. It ends once this is
    /// dropped and every block is back.
    ///
    /// # Errors
    /// The thread could not be started.
    pub(crate) fn new(gpu: &Gpu) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            lent: Mutex::default(),
            wake: Condvar::new(),
            returned: Condvar::new(),
            counters: LendCounters::default(),
            closed: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new().name("zcs-rosidl-lend".into()).spawn(move || give_back(&s))?;
        Ok(Self { gpu: gpu.clone(), known: Mutex::default(), shared })
    }

    /// The counters.
    pub(crate) fn counters(&self) -> &LendCounters {
        &self.shared.counters
    }

    /// Readies the block of `loan` for lending: its export (made on the allocation's
    /// first lending), and its writer's event recorded on the loan's stream after the
    /// writes enqueued so far.
    ///
    /// # Errors
    /// [`ExportError`]; nothing is lent.
    pub(crate) fn prepare(&self, loan: &GpuLoan) -> Result<Prepared, ExportError> {
        let (Some(block), Some(stream)) = (loan.device_allocation(), loan.stream()) else {
            return Err(ExportError::HostData);
        };
        let lent = self.shared.lent.locked();
        let (lent, _) = self
            .shared
            .returned
            .wait_timeout_while(lent, GRACE, |l| l.len() >= MAX_LENT)
            .unwrap_or_else(|p| p.into_inner());
        if lent.len() >= MAX_LENT {
            return Err(ExportError::TooManyLent);
        }
        drop(lent);
        let exported = self.exported(block)?;
        exported.event.record(stream)?;
        Ok(Prepared(exported))
    }

    /// Lends the prepared block, now published as `block`, for one publish: the
    /// descriptor of its first `block.len()` bytes (0.1.2 layout).
    pub(crate) fn lend(&self, prepared: Prepared, block: SharedBlock) -> CudaBufferDescriptor {
        let exported = prepared.0;
        let uid = fresh_uid();
        exported.meta.publish(uid, monotonic_us());
        let d = CudaBufferDescriptor {
            size: block.len() as u64,
            element_type_name: "h".into(),
            device_id: i32::try_from(self.gpu.ordinal()).unwrap_or(i32::MAX),
            use_ipc: true,
            vmm_pid: std::process::id() as i32,
            vmm_block_id: exported.number,
            vmm_block_size: exported.size as u64,
            vmm_socket_path: exported.socket.path().display().to_string(),
            ipc_uid: uid,
            ipc_event_handle: exported.handle,
            layout: CudaDescriptorLayout::V0_1_2,
        };
        self.shared.lent.locked().push(Lent { _block: block, exported, since: Instant::now() });
        self.shared.counters.out.fetch_add(1, Ordering::Relaxed);
        self.shared.wake.notify_one();
        d
    }

    /// The export of `block`'s allocation, made on its first lending.
    fn exported(&self, block: DeviceAllocation<'_>) -> Result<Arc<Exported>, ExportError> {
        let mut known = self.known.locked();
        // Allocations freed since are forgotten: their numbers are never used again.
        known.retain(|e| e.allocation.is_live());
        if let Some(e) = known.iter().find(|e| e.allocation == block.allocation) {
            return Ok(Arc::clone(e));
        }
        let server = SERVER.get_or_init(|| BlockServer::start(&default_dir()).map_err(|e| e.to_string()));
        let server = server.as_ref().map_err(|e| ExportError::Server(e.clone()))?;
        let number = NEXT_NUMBER.fetch_add(1, Ordering::Relaxed);
        let fd = block.fd.try_clone_to_owned().map_err(ExportError::Socket)?;
        let socket = server.serve(number, fd).map_err(ExportError::Socket)?;
        let path = BlockMeta::path_of(std::process::id() as i32, number);
        // A file left at our pid and number by a dead process of ours that had our pid.
        let _ = std::fs::remove_file(&path);
        let meta = BlockMeta::create_at(&path)?;
        let event = IpcEvent::create(&self.gpu)?;
        let handle = event.handle()?;
        let e = Arc::new(Exported {
            allocation: block.allocation,
            number,
            size: block.capacity,
            meta,
            socket,
            event,
            handle,
        });
        known.push(Arc::clone(&e));
        Ok(e)
    }
}

/// A block readied for lending by [`Exports::prepare`].
pub(crate) struct Prepared(Arc<Exported>);

impl Drop for Exports {
    fn drop(&mut self) {
        // The thread ends once every lent block is back.
        self.shared.closed.store(true, Ordering::Release);
        let _lent = self.shared.lent.locked();
        self.shared.wake.notify_one();
    }
}

/// What the lending thread does with a lent block now.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Keep,
    Back,
    /// Back, after clearing counts that dead subscribers left.
    Reclaim,
}

fn verdict(l: &Lent, now: Instant) -> Verdict {
    let held_for = now.saturating_duration_since(l.since);
    if held_for < GRACE {
        return Verdict::Keep;
    }
    if l.exported.meta.count() <= 0 {
        return Verdict::Back;
    }
    let takers = l.exported.socket.peers();
    let all_gone = takers.iter().all(|&pid| zcs_memory::host::process_gone(pid));
    if all_gone && (!takers.is_empty() || held_for >= UNCLAIMED) { Verdict::Reclaim } else { Verdict::Keep }
}

/// Gives lent blocks back to the pool as [`verdict`] allows; returns once the
/// publisher is gone and nothing is lent.
fn give_back(s: &Shared) {
    let mut lent = s.lent.locked();
    loop {
        if lent.is_empty() && s.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        while i < lent.len() {
            let v = verdict(&lent[i], now);
            let meta = &lent[i].exported.meta;
            let back = match v {
                Verdict::Keep => false,
                Verdict::Back | Verdict::Reclaim => {
                    if v == Verdict::Reclaim {
                        tracing::warn!(
                            block = lent[i].exported.number,
                            count = meta.count(),
                            "every process given this block died holding it: its counts are cleared"
                        );
                        meta.clear_count();
                        s.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
                    }
                    // A new id before the block goes back: a subscriber that takes the
                    // message from now on is refused. One that compared the old id first
                    // had counted itself first, and is seen here.
                    meta.publish(fresh_uid(), 0);
                    meta.count() <= 0
                }
            };
            if back {
                drop(lent.swap_remove(i));
                s.counters.out.fetch_sub(1, Ordering::Relaxed);
                s.returned.notify_all();
            } else {
                i += 1;
            }
        }
        let wait = if lent.is_empty() { Duration::from_secs(3600) } else { POLL };
        lent = s.wake.wait_timeout(lent, wait).unwrap_or_else(|p| p.into_inner()).0;
    }
}

fn fresh_uid() -> u64 {
    loop {
        let uid = rand::random::<u64>();
        if uid != 0 {
            return uid;
        }
    }
}

/// Microseconds of the monotonic clock (their publishers write `steady_clock`'s).
fn monotonic_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}
