//! The crash matrix, run by `crash_matrix.rs` on host memfd blocks (CI) and on CUDA VMM
//! blocks (the GPU machine); included with `#[path]`. Each cell is one body, generic
//! over the medium.
//!
//! A victim process is SIGKILLed at a random moment, re-spawned, and killed again,
//! `ZCS_CRASH_ITERS` times per cell (default 200), with real Zenoh sessions on loopback
//! TCP. The kill moment is random over a window that covers the victim's start, its
//! Zenoh session, the control handshake and steady traffic (loans, writes, puts on one
//! side; leases held and samples read on the other), so every phase is hit many times;
//! each report line says how often the victim was killed in which phase.
//!
//! After every kill, in the surviving process (the test's own):
//! - every sample it received carried exactly the bytes written for its sequence
//!   number, with no duplicate and, for the surviving subscriber of a surviving
//!   publisher, no gap (a CUDA read of a publisher that died before its ready signal
//!   is refused with `PublisherDied`, counted, never delivered as data);
//! - the publisher's pool is whole again (no block loaned or leased) — the target is
//!   100 ms after a subscriber's death, asserted on the GPU machine ([`reclaim_limit`]);
//!   CI, whose two cores are shared with the build, asserts [`RECLAIM_LIMIT`]; both
//!   print the measured distribution;
//! - descriptors (sockets included; per block the pool allocated, the exported fd and
//!   a host import's memfd) and our threads are back to the baseline, no new entry of
//!   ours exists in `/dev/shm`, and on CUDA the free device memory (`cuMemGetInfo`)
//!   is back within 64 MiB of the baseline plus what the pool grew by;
//! - the survivor keeps working: traffic continues with the next victim.
//!
//! In the relay cell ([`relay_killed`]) the victim is the Zenoh router that the
//! survivors' client sessions all go through. There the subscriber keeps every message
//! through the router's death (no gap), the pool is checked once it lets go of the
//! samples it held across the death, and resources are checked once everything is back
//! through the re-spawned router (with the router dead, Zenoh's sockets are gone and,
//! on CUDA, the subscriber watches the publisher's process until its token is back).
//!
//! Zenoh's runtime adds and retires its own idle workers; they are allowed a margin
//! between kills and checked exactly at the end of each cell, once they have retired.

#![allow(dead_code)] // each including binary uses its own subset

use std::collections::{BTreeSet, HashMap};
use std::process::Child;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use zenoh::Wait;

use zcs_memory::cuda::kernels::{Kernels, check_pattern, fill_pattern};
use zcs_tests::{child_role, free_tcp_port, loopback_zenoh_config, spawn_child, watchdog_guard};
use zcs_tests::{open_fd_count, thread_count};
use zenoh_cuda_shm::{GpuLoan, GpuPublisher, GpuSample, GpuSession, GpuSubscriber, Path, ReadError, ZcsConfig};

/// Iterations per cell.
pub const ITERS_ENV: &str = "ZCS_CRASH_ITERS";
const MODE_ENV: &str = "ZCS_CRASH_MODE";
/// The GPU a victim subscriber opens its session on (CUDA; default 0, the publisher's).
const GPU_ENV: &str = "ZCS_CRASH_GPU";
const PORT_ENV: &str = "ZCS_CRASH_PORT";
const KEY_ENV: &str = "ZCS_CRASH_KEY";
const SEED_ENV: &str = "ZCS_CRASH_SEED";
const ROUTER_ID_ENV: &str = "ZCS_CRASH_ROUTER_ID";
const KEY_ROOT: &str = "zcs-test/crash";
/// Payload of every message: above the inline threshold, so it goes through a block.
const LEN: usize = 96 * 1024 + 7;
/// The victim is killed at a random moment after spawn: half of the kills uniformly in
/// `[0, EARLY_WINDOW)` (start, session, handshake), half in `[0, KILL_WINDOW)`.
const KILL_WINDOW: Duration = Duration::from_millis(450);
const EARLY_WINDOW: Duration = Duration::from_millis(120);
/// Bound on any single wait.
const IO: Duration = Duration::from_secs(20);
/// CI's bound for a dead subscriber's blocks to be back (the target is 100 ms; the
/// measured figures are printed).
const RECLAIM_LIMIT: Duration = Duration::from_secs(1);
const TARGET: Duration = Duration::from_millis(100);

/// The bound a dead subscriber's blocks are asserted back within: the target on the
/// GPU machine (16 cores, nothing else running), [`RECLAIM_LIMIT`] in CI.
fn reclaim_limit(mode: MediumKind) -> Duration {
    match mode {
        MediumKind::Cuda => TARGET,
        MediumKind::Host => RECLAIM_LIMIT,
    }
}

/// Device memory that may differ from the baseline without being a leak (allocator
/// and context bookkeeping).
const GPU_SLACK: usize = 64 << 20;

type Sub = GpuSubscriber<flume::Receiver<GpuSample>>;

/// The cells run one at a time: each counts this process's descriptors and threads.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn iterations() -> usize {
    std::env::var(ITERS_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

use zcs_tests::{Medium, MediumKind};

/// Descriptors this process keeps per block it publishes and per block it imported: the
/// memfd or the exported VMM handle; a host mapping keeps its memfd, a CUDA import
/// closes its fd right after `cuMemImportFromShareableHandle`.
fn fds_per_block(mode: MediumKind) -> u64 {
    match mode {
        MediumKind::Host => 2,
        MediumKind::Cuda => 1,
    }
}

fn session(mode: MediumKind, port: u16, listen: bool) -> GpuSession {
    let (l, c) = if listen { (Some(port), None) } else { (None, Some(port)) };
    let device = mode.device();
    let gpu_ordinal = std::env::var(GPU_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    GpuSession::open(
        loopback_zenoh_config(l, c, Some(KEY_ROOT)),
        ZcsConfig { device, gpu_ordinal, ..Default::default() },
    )
    .wait()
    .expect("open session")
}

/// Fills loans: on the CPU (host), or with the fill kernel on the loan's stream (CUDA).
struct Filler(Option<Kernels>);

impl Filler {
    fn new(s: &GpuSession) -> Self {
        Self(s.gpu().map(|g| Kernels::load(g).expect("load kernels")))
    }
    fn fill(&self, loan: &mut GpuLoan, seed: u64) {
        match &self.0 {
            Some(k) => {
                let (ptr, len) = (loan.device_ptr().expect("CUDA loan"), loan.len() as u64);
                let stream = loan.stream().expect("CUDA loan");
                // SAFETY: the loan owns ≥ len mapped bytes until `put`, which orders the
                // ready signal after this launch on the loan's stream.
                unsafe { k.fill(stream, ptr, len, seed) }.expect("fill kernel");
            }
            None => {
                let buf = loan.as_mut_slice().expect("host loan");
                // Written in pieces, so a kill lands mid-write often.
                let piece = LEN / 4 + 1;
                for (k, chunk) in buf.chunks_mut(piece).enumerate() {
                    fill_pattern(chunk, (k * piece) as u64, seed);
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Loans `LEN` bytes from `p`, fills them with the pattern of `seq` and puts them.
    fn publish(&self, p: &GpuPublisher, seq: u64) {
        let mut loan = p.loan(LEN).expect("loan");
        self.fill(&mut loan, seq);
        p.put(loan).expect("put");
    }
}

/// Free device memory (`cuMemGetInfo`), for CUDA sessions.
fn gpu_free(s: &GpuSession) -> Option<usize> {
    s.gpu().map(|g| g.mem_info().expect("cuMemGetInfo").0)
}

/// The victims' GPU where it is not this process's session's (cells on two GPUs), with
/// its free memory at the start of the cell: after each kill it must be back there too.
struct VictimGpu {
    gpu: zenoh_cuda_shm::cuda::Gpu,
    base_free: usize,
    settle: Duration,
}

impl VictimGpu {
    fn open(mode: MediumKind, ordinal: usize) -> Option<Self> {
        (mode == MediumKind::Cuda && ordinal != 0).then(|| {
            let gpu = zenoh_cuda_shm::cuda::Gpu::open(ordinal).expect("the victims' GPU");
            let base_free = gpu.mem_info().expect("cuMemGetInfo").0;
            Self { gpu, base_free, settle: Duration::ZERO }
        })
    }

    /// Waits until the victims' GPU has its memory back (the dead victim's context, and
    /// its blocks once nobody maps them).
    fn wait_back(&mut self) {
        let (gpu, base) = (&self.gpu, self.base_free);
        let t = wait_until("the victims' GPU memory back to the baseline", IO, || {
            gpu.mem_info().expect("cuMemGetInfo").0 + GPU_SLACK >= base
        });
        self.settle = self.settle.max(t);
    }

    fn report(v: &Option<Self>) -> String {
        v.as_ref().map_or(String::new(), |v| {
            format!("; the victims' GPU {} back within {:.1} ms", v.gpu.ordinal(), v.settle.as_secs_f64() * 1e3)
        })
    }
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
    t.elapsed()
}

/// A small deterministic generator (xorshift), seeded per run and printed, so a
/// failing sequence of kill moments can be replayed with `ZCS_CRASH_SEED`.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = std::env::var(SEED_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random::<u64>) | 1;
        println!("crash matrix seed {seed} (replay with {SEED_ENV}={seed})");
        Self(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, d: Duration) -> Duration {
        Duration::from_micros(self.next() % d.as_micros().max(1) as u64)
    }
    fn kill_moment(&mut self) -> Duration {
        let window = if self.next() & 1 == 0 { EARLY_WINDOW } else { KILL_WINDOW };
        self.below(window)
    }
}

/// What this process has open, for the baseline checks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resources {
    fds: usize,
    sockets: usize,
    /// Threads of this crate (all named `zcs-…`).
    ours: usize,
    /// All threads, Zenoh's runtimes included.
    threads: usize,
}

fn resources() -> Resources {
    let sockets = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
                .count()
        })
        .unwrap_or(0);
    let names = thread_names();
    let ours = names.iter().filter(|(n, _)| n.starts_with("zcs-") && *n != "zcs-watchdog").map(|(_, c)| c).sum();
    Resources { fds: open_fd_count().expect("fds"), sockets, ours, threads: thread_count().expect("threads") }
}

/// Names of this process's threads, with counts.
fn thread_names() -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim().to_owned();
        *m.entry(name).or_insert(0) += 1;
    }
    m
}

fn dev_shm() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Fails if `/dev/shm` has an entry that was not there at the baseline and that could
/// be ours: named like ours (`zcs`), or open or mapped by this process. Other entries
/// are another program's on this shared machine (this crate links no Zenoh
/// shared-memory code and creates only unnamed memfds); they are reported once.
fn check_dev_shm(base: &BTreeSet<String>, foreign: &mut BTreeSet<String>, what: &str) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let open: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.filter_map(Result::ok).filter_map(|e| std::fs::read_link(e.path()).ok()))
        .into_iter()
        .flatten()
        .map(|l| l.to_string_lossy().into_owned())
        .collect();
    for name in dev_shm().difference(base) {
        let path = format!("/dev/shm/{name}");
        let ours = name.contains("zcs") || maps.contains(&path) || open.contains(&path);
        assert!(!ours, "{what}: /dev/shm/{name} left behind");
        if foreign.insert(name.clone()) {
            println!("note: /dev/shm/{name} appeared, created by another program (not open or mapped here)");
        }
    }
}

/// Zenoh's runtimes add blocking-pool workers under load (`rx-7`, `net-2`, …) that
/// retire after 10 s idle; between kills they may be above the baseline by this much.
/// The end of each cell waits for them to retire and checks the exact baseline.
const ZENOH_WORKER_SLACK: usize = 24;

/// Waits until descriptors, sockets and our threads are back to the baseline, and
/// Zenoh's workers within [`ZENOH_WORKER_SLACK`] (exactly, with `exact`). Descriptors
/// may exceed the baseline by `per_block` for each block the pool allocated since
/// (`pool_blocks` counts allocations): the publisher keeps a memfd per block, and a
/// subscriber in this process keeps its import of it (cached per block id). Once the
/// pool has reached its working size nothing is allocated and the bound is exact.
fn back_to_baseline(
    base: &Resources,
    base_blocks: u64,
    pool_blocks: &dyn Fn() -> u64,
    per_block: u64,
    exact: bool,
    what: &str,
) -> Duration {
    let t = Instant::now();
    let slack = if exact { 0 } else { ZENOH_WORKER_SLACK };
    loop {
        let now = resources();
        let blocks = pool_blocks();
        if (now.fds as u64) <= base.fds as u64 + per_block * (blocks - base_blocks)
            && now.sockets <= base.sockets
            && now.ours <= base.ours
            && now.threads <= base.threads + slack
        {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < IO,
            "{what}: {now:?} ({} blocks allocated since) after {IO:?}, baseline {base:?}; threads {:?}",
            blocks - base_blocks,
            thread_names()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn kill(mut child: Child) {
    child.kill().expect("SIGKILL");
    reap(child);
}

/// Waits for a SIGKILLed victim's exit.
fn reap(mut child: Child) {
    let status = child.wait().expect("reap");
    use std::os::unix::process::ExitStatusExt;
    // A victim that died by itself would be a bug it reported above (its stderr).
    assert_eq!(status.signal(), Some(libc::SIGKILL), "victim exited before the kill: {status:?}");
}

/// Nearest-rank percentile in milliseconds.
fn pct(sorted: &[Duration], p: f64) -> f64 {
    zcs_tests::percentile(&sorted.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>(), p)
}

/// Per-publisher order and content check of every received sample. `contiguous`:
/// sequence numbers must also have no gap.
#[derive(Default)]
struct Checker {
    last: HashMap<u64, u64>,
    /// Every `(publisher, seq)` received.
    seen: std::collections::HashSet<(u64, u64)>,
    received: u64,
    /// Reads refused because the publisher died before its ready signal (CUDA; gap G4).
    refused: u64,
}

impl Checker {
    fn check(&mut self, s: &GpuSample, contiguous: bool) {
        let info = s.info();
        let bytes = match s.to_vec() {
            Ok(b) => b,
            // Never delivered as data: the read is refused. Only a dead publisher's.
            Err(ReadError::PublisherDied) if !contiguous => {
                self.refused += 1;
                return;
            }
            Err(e) => panic!("seq {}: read failed: {e}", info.seq),
        };
        assert_eq!(bytes.len(), LEN, "seq {} length", info.seq);
        assert_eq!(check_pattern(&bytes, 0, info.seq), None, "seq {}: bytes not written for it", info.seq);
        assert!(self.seen.insert((info.publisher, info.seq)), "publisher {:x}: seq {} twice", info.publisher, info.seq);
        let last = self.last.entry(info.publisher).or_insert(0);
        if contiguous {
            assert_eq!(info.seq, *last + 1, "publisher {:x}: gap or duplicate", info.publisher);
        } else if info.seq < *last {
            // Bytes sent while this subscriber's link came up may arrive after the link
            // has delivered later messages: they are delivered then, once, out of order
            // (docs/protocol.md, "Order across the two ways in"). Nothing else may be late.
            assert!(
                matches!(info.path, Path::CpuBytes | Path::Inline),
                "publisher {:x}: seq {} after {} by the {} path",
                info.publisher,
                info.seq,
                *last,
                info.path
            );
            self.received += 1;
            return;
        }
        *last = info.seq;
        self.received += 1;
    }
}

/// Drains `sub` on a thread, checking every sample and dropping it at once; returns
/// the number of refused reads.
fn drain(
    sub: Arc<Sub>,
    contiguous: bool,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
) -> std::thread::JoinHandle<u64> {
    drain_holding(sub, contiguous, stop, count, Arc::default())
}

/// How many samples a draining thread keeps.
#[derive(Default)]
struct Holding {
    /// Set by the test: keep the latest this many.
    target: AtomicU64,
    /// Set by the thread: how many it keeps now.
    now: AtomicU64,
}

/// As [`drain`], but keeps the latest `hold.target` samples (their leases) and checks
/// each one's bytes again when it lets go of it: a block reused under a held lease
/// would show there.
fn drain_holding(
    sub: Arc<Sub>,
    contiguous: bool,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    hold: Arc<Holding>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut c = Checker::default();
        let mut held = std::collections::VecDeque::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(s) = sub.recv_timeout(Duration::from_millis(2)) {
                c.check(&s, contiguous);
                held.push_back(s);
            }
            let keep = hold.target.load(Ordering::Acquire) as usize;
            if held.len() > keep {
                let go: Vec<GpuSample> = held.drain(..held.len() - keep).collect();
                for s in &go {
                    if let Ok(bytes) = s.to_vec() {
                        let seq = s.info().seq;
                        assert_eq!(check_pattern(&bytes, 0, seq), None, "seq {seq}: bytes changed while it was held");
                    }
                }
            }
            hold.now.store(held.len() as u64, Ordering::Release);
            // Counted once dropped (unless held): a caller that sees everything
            // received knows every sample it did not ask to be held is released.
            count.store(c.received + c.refused, Ordering::Release);
        }
        c.refused
    })
}

/// The cell where subscribers die: this process publishes continuously; a victim
/// subscriber process is killed at random moments; a second subscriber in this
/// process must see every message, intact and in order.
pub fn subscriber_killed<M: Medium>(test: &'static str) {
    if let Some(kind) = M::gate(test) {
        subscriber_killed_on(kind, test, 0);
    }
}

/// [`subscriber_killed`] with the victims on GPU `victim_gpu` (CUDA): on another GPU than
/// the publisher's (0), they map its blocks over NVLink or PCIe (`zero-copy-peer`).
pub fn subscriber_killed_on(mode: MediumKind, test: &'static str, victim_gpu: usize) {
    const TEST: &str = "subscriber killed";
    let _l = serial();
    // Before any baseline: a context of this process on that GPU opens descriptors and
    // starts threads of the driver.
    let mut victim_dev = VictimGpu::open(mode, victim_gpu);
    let n = iterations();
    let _w = watchdog_guard(test, Duration::from_secs(60 + 3 * n as u64));
    let t_all = Instant::now();
    let mut rng = Rng::new();
    let (port, key) = (free_tcp_port(), format!("{KEY_ROOT}/{}/{}/sub", std::process::id(), mode.name()));
    let pub_session = session(mode, port, true);
    let publisher = pub_session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let filler = Filler::new(&pub_session);
    let survivor_session = session(mode, port, false);
    let survivor: Arc<Sub> = Arc::new(survivor_session.declare_subscriber(key.clone()).wait().expect("subscriber"));
    wait_until("the survivor on the zero-copy path", IO, || {
        publisher.zero_copy_subscribers() == 1 && !publisher.plain_subscribers()
    });
    let (stop, got) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let drainer = drain(Arc::clone(&survivor), true, Arc::clone(&stop), Arc::clone(&got));
    let mut seq = 0u64;
    let publish = |seq: u64| filler.publish(&publisher, seq);
    // Warm up so Zenoh's and the pool's steady state is the baseline.
    for _ in 0..20 {
        seq += 1;
        publish(seq);
    }
    wait_until("the survivor to catch up", IO, || got.load(Ordering::Acquire) == seq);
    wait_until("the pool to be whole", IO, || publisher.pool_stats().blocks_in_use == 0);
    let (base, base_blocks, shm) = (resources(), publisher.pool_stats().allocations, dev_shm());
    let mut foreign = BTreeSet::new();
    let pool_blocks = || publisher.pool_stats().allocations;
    // This process publishes every block and (the survivor) imports every one.
    let per_block = fds_per_block(mode);
    let (base_free, base_pool_bytes) = (gpu_free(&pub_session), publisher.pool_stats().bytes);
    let mut gpu_settle = Duration::ZERO;

    let (mut reclaims, mut reaps, mut settle) = (Vec::with_capacity(n), Vec::with_capacity(n), Duration::ZERO);
    let (mut unseen, mut handshaking, mut while_ready, mut held_at_kill, mut over_target) = (0, 0, 0, 0u64, 0);
    for i in 0..n {
        let kill_at = rng.kill_moment();
        if std::env::var_os("ZCS_CRASH_TRACE").is_some() {
            eprintln!("{TEST}: iteration {i}, kill at {kill_at:?}");
        }
        let mut victim = spawn_child(
            "child_entry",
            "victim-sub",
            &[
                (PORT_ENV, port.to_string()),
                (KEY_ENV, key.clone()),
                (SEED_ENV, rng.next().to_string()),
                (MODE_ENV, mode.name().to_owned()),
                (GPU_ENV, victim_gpu.to_string()),
            ],
        );
        let t = Instant::now();
        while t.elapsed() < kill_at {
            seq += 1;
            publish(seq);
            std::thread::sleep(Duration::from_millis(2));
        }
        let ready = publisher.zero_copy_subscribers() == 2;
        let announced = publisher.aware_subscribers() == 2;
        let in_use = publisher.pool_stats().blocks_in_use;
        let killed = Instant::now();
        // Timed from the SIGKILL, not from the victim's exit: a CUDA process's exit
        // takes tens of milliseconds, and its blocks are back before it ends.
        victim.kill().expect("SIGKILL");
        // The survivor releases what it reads at once; once it has everything, every
        // block still in use is one the dead victim held.
        wait_until("the survivor to catch up", IO, || got.load(Ordering::Acquire) == seq);
        while publisher.pool_stats().blocks_in_use != 0 {
            assert!(
                killed.elapsed() < reclaim_limit(mode),
                "iteration {i}: {} blocks still in use {:?} after the kill",
                publisher.pool_stats().blocks_in_use,
                killed.elapsed()
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        let reclaimed = killed.elapsed();
        reap(victim);
        reaps.push(killed.elapsed());
        if reclaimed > TARGET {
            over_target += 1;
        }
        reclaims.push(reclaimed);
        if ready {
            while_ready += 1;
            held_at_kill += in_use as u64;
        } else if announced {
            handshaking += 1;
        } else {
            unseen += 1;
        }
        wait_until("the publisher to drop the dead subscriber", IO, || publisher.zero_copy_subscribers() == 1);
        settle =
            settle.max(back_to_baseline(&base, base_blocks, &pool_blocks, per_block, false, &format!("iteration {i}")));
        check_dev_shm(&shm, &mut foreign, &format!("iteration {i}"));
        if let Some(base_free) = base_free {
            // The dead victim's context is torn down by the driver (seconds, with a
            // kernel running); what stays is what our pool (and its import) grew by.
            let grown = 2 * (publisher.pool_stats().bytes - base_pool_bytes) as usize;
            let t = Instant::now();
            wait_until("device memory back to the baseline", IO, || {
                gpu_free(&pub_session).expect("free") + grown + GPU_SLACK >= base_free
            });
            gpu_settle = gpu_settle.max(t.elapsed());
        }
        if let Some(v) = &mut victim_dev {
            v.wait_back();
        }
    }
    // The survivor is still served after all of it.
    for _ in 0..10 {
        seq += 1;
        publish(seq);
    }
    wait_until("the survivor's last messages", IO, || got.load(Ordering::Acquire) == seq);
    wait_until("the pool to be whole", IO, || publisher.pool_stats().blocks_in_use == 0);
    let idle = back_to_baseline(&base, base_blocks, &pool_blocks, per_block, true, "end of the cell");
    stop.store(true, Ordering::Relaxed);
    let refused = drainer.join().expect("the survivor's checks failed (see above)");
    assert_eq!(refused, 0, "the survivor's publisher never died");
    reclaims.sort();
    reaps.sort();
    println!(
        "{test} ({}): {n} kills in {:.1} s ({unseen} before the publisher saw the victim, {handshaking} after its token \
         but before it was zero-copy ready, {while_ready} while ready, with {held_at_kill} blocks in use at those \
         kills); pool whole after the kill: p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms ({over_target} over {} ms); victim reaped after p50 {:.2} ms, max {:.2} ms; \
         resources back within {:.1} ms \
         (Zenoh's idle workers retired {:.1} s after the last kill); survivor received {seq} messages, all checked{}{}",
        mode.name(),
        t_all.elapsed().as_secs_f64(),
        pct(&reclaims, 50.0),
        pct(&reclaims, 99.0),
        pct(&reclaims, 100.0),
        TARGET.as_millis(),
        pct(&reaps, 50.0),
        pct(&reaps, 100.0),
        settle.as_secs_f64() * 1e3,
        idle.as_secs_f64(),
        base_free.map_or(String::new(), |_| format!(
            "; device memory back within {:.1} ms of each kill",
            gpu_settle.as_secs_f64() * 1e3
        )),
        VictimGpu::report(&victim_dev)
    );
    let _ = TEST;
    assert!(while_ready > 0 && unseen + handshaking > 0, "the kill window must cover every phase");
}

/// The cell where publishers die: a victim publisher process loans, writes (in
/// pieces) and puts continuously and is killed at random moments; this process
/// subscribes, checks every sample, and must drop each dead publisher's imports.
pub fn publisher_killed<M: Medium>(test: &'static str) {
    if let Some(kind) = M::gate(test) {
        publisher_killed_on(kind, test, 0);
    }
}

/// [`publisher_killed`] with the victims on GPU `victim_gpu` (CUDA): on another GPU than
/// this subscriber's (0), it maps their blocks over NVLink or PCIe (`zero-copy-peer`).
pub fn publisher_killed_on(mode: MediumKind, test: &'static str, victim_gpu: usize) {
    const TEST: &str = "publisher killed";
    let _l = serial();
    // Before any baseline: a context of this process on that GPU opens descriptors and
    // starts threads of the driver.
    let mut victim_dev = VictimGpu::open(mode, victim_gpu);
    let n = iterations();
    let _w = watchdog_guard(test, Duration::from_secs(60 + 3 * n as u64));
    let t_all = Instant::now();
    let mut rng = Rng::new();
    let (port, key) = (free_tcp_port(), format!("{KEY_ROOT}/{}/{}/pub", std::process::id(), mode.name()));
    let sub_session = session(mode, port, true);
    let sub: Arc<Sub> = Arc::new(sub_session.declare_subscriber(key.clone()).wait().expect("subscriber"));
    let (stop, got) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let drainer = drain(Arc::clone(&sub), false, Arc::clone(&stop), Arc::clone(&got));
    let victim_pub = |rng: &mut Rng| {
        spawn_child(
            "child_entry",
            "victim-pub",
            &[
                (PORT_ENV, port.to_string()),
                (KEY_ENV, key.clone()),
                (SEED_ENV, rng.next().to_string()),
                (MODE_ENV, mode.name().to_owned()),
                (GPU_ENV, victim_gpu.to_string()),
            ],
        )
    };
    // Warm up: one victim that delivers, then dies, so Zenoh's lazily started runtimes
    // and the subscriber's threads are part of the baseline.
    let victim = victim_pub(&mut rng);
    wait_until("the warm-up publisher's first messages", IO, || got.load(Ordering::Acquire) > 5);
    kill(victim);
    wait_until("the subscriber to forget the warm-up publisher", IO, || sub.publishers().is_empty());
    std::thread::sleep(Duration::from_millis(200));
    let (base, shm) = (resources(), dev_shm());
    let mut foreign = BTreeSet::new();
    let no_blocks = || 0;
    let base_free = gpu_free(&sub_session);
    let mut gpu_settle = Duration::ZERO;

    let (mut silent, mut delivering, mut settle, mut forget) = (0, 0, Duration::ZERO, Vec::with_capacity(n));
    for i in 0..n {
        let kill_at = rng.kill_moment();
        if std::env::var_os("ZCS_CRASH_TRACE").is_some() {
            eprintln!("{TEST}: iteration {i}, kill at {kill_at:?}");
        }
        let before = got.load(Ordering::Acquire);
        let victim = victim_pub(&mut rng);
        std::thread::sleep(kill_at);
        let killed = Instant::now();
        kill(victim);
        if got.load(Ordering::Acquire) > before {
            delivering += 1;
        } else {
            silent += 1;
        }
        // The dead publisher's token goes with its Zenoh session; its imports with it.
        let gone = wait_until("the subscriber to forget the dead publisher", IO, || sub.publishers().is_empty());
        forget.push(gone.max(killed.elapsed()));
        settle = settle.max(back_to_baseline(&base, 0, &no_blocks, 0, false, &format!("iteration {i}")));
        check_dev_shm(&shm, &mut foreign, &format!("iteration {i}"));
        if let Some(base_free) = base_free {
            // Imports are evicted with the dead publisher; its memory goes with the
            // driver's teardown of its context.
            let t = Instant::now();
            wait_until("device memory back to the baseline", IO, || {
                gpu_free(&sub_session).expect("free") + GPU_SLACK >= base_free
            });
            gpu_settle = gpu_settle.max(t.elapsed());
        }
        if let Some(v) = &mut victim_dev {
            v.wait_back();
        }
    }
    let idle = back_to_baseline(&base, 0, &no_blocks, 0, true, "end of the cell");
    stop.store(true, Ordering::Relaxed);
    let refused = drainer.join().expect("the subscriber's checks failed (see above)");
    forget.sort();
    println!(
        "{test} ({}): {n} kills in {:.1} s ({silent} before the victim delivered anything, {delivering} while \
         delivering); {} messages received, all checked ({refused} reads refused: publisher died before its \
         ready signal); dead publisher forgotten after p50 {:.1} ms, max \
         {:.1} ms; resources back within {:.1} ms (Zenoh's idle workers retired {:.1} s after the last kill){}{}",
        mode.name(),
        t_all.elapsed().as_secs_f64(),
        got.load(Ordering::Acquire),
        pct(&forget, 50.0),
        pct(&forget, 100.0),
        settle.as_secs_f64() * 1e3,
        idle.as_secs_f64(),
        base_free.map_or(String::new(), |_| format!(
            "; device memory back within {:.1} ms of each kill",
            gpu_settle.as_secs_f64() * 1e3
        )),
        VictimGpu::report(&victim_dev)
    );
    let _ = TEST;
    assert!(delivering > 0 && silent > 0, "the kill window must cover both phases");
    if victim_dev.is_some() {
        // On two GPUs the cell is about the peer path: it must have been taken.
        let zero_copy = sub.stats().zero_copy;
        println!("{test}: {zero_copy} messages read in place over the link from the victims' GPU");
        assert!(zero_copy > 0, "no message came over the peer path");
    }
}

/// How often a client of the relay cell retries the router once it is gone: from
/// `RECONNECT_FIRST` doubling up to `RECONNECT_MAX` (Zenoh's defaults, 1 s up to 4 s,
/// would make every restart cost seconds).
const RECONNECT_FIRST: Duration = Duration::from_millis(10);
const RECONNECT_MAX: Duration = Duration::from_millis(50);
/// After the router's death, traffic goes on for a random time below this before the
/// pool is checked and the router re-spawned.
const OUTAGE_WINDOW: Duration = Duration::from_millis(100);
/// The surviving subscriber holds up to this many samples (leases) at a time.
const MAX_HELD: u64 = 8;

/// Zenoh configuration of the relay cell's sessions: clients of the router on `port`
/// and of nothing else (a client has no listener, and clients are never linked to each
/// other: everything between them goes through the router), which they retry every
/// `RECONNECT_FIRST`…`RECONNECT_MAX` while it is gone.
fn client_config(port: u16) -> zenoh::Config {
    let mut c = loopback_zenoh_config(None, Some(port), Some(KEY_ROOT));
    let mut set = |key: &str, value: String| {
        c.insert_json5(key, &value).unwrap_or_else(|e| panic!("zenoh config {key} = {value}: {e}"));
    };
    set("mode", "\"client\"".into());
    set("listen/endpoints", "[]".into());
    // Opening waits for the router (a client's default is one attempt).
    set("connect/timeout_ms", IO.as_millis().to_string());
    set(
        "connect/retry",
        format!(
            "{{ period_init_ms: {}, period_max_ms: {}, period_increase_factor: 2 }}",
            RECONNECT_FIRST.as_millis(),
            RECONNECT_MAX.as_millis()
        ),
    );
    c
}

/// The relay: a Zenoh router listening on `port`, and nothing else.
fn router_config(port: u16, zid: &str) -> zenoh::Config {
    let mut c = zenoh::Config::default();
    let mut set = |key: &str, value: String| {
        c.insert_json5(key, &value).unwrap_or_else(|e| panic!("zenoh config {key} = {value}: {e}"));
    };
    set("id", format!("\"{zid}\""));
    set("mode", "\"router\"".into());
    set("scouting/multicast/enabled", "false".into());
    set("listen/endpoints", format!("[\"tcp/127.0.0.1:{port}\"]"));
    c
}

/// A router process, with the Zenoh id it was given (new at every spawn, so that the
/// clients can be seen to have reached this one).
struct Router {
    child: Child,
    zid: String,
    spawned: Instant,
}

impl Router {
    fn spawn(port: u16, rng: &mut Rng) -> Self {
        let zid = format!("{:x}", rng.next() | 1);
        let env = [(PORT_ENV, port.to_string()), (ROUTER_ID_ENV, zid.clone())];
        let child = spawn_child("child_entry", "victim-router", &env);
        Self { child, zid, spawned: Instant::now() }
    }
}

/// Whether every session is linked to `router` and to nothing else. Fails if any has
/// a peer: the cell is only about a relay if nothing bypasses it.
fn linked_only_to(sessions: &[&zenoh::Session], router: &Router) -> bool {
    sessions.iter().all(|s| {
        let info = s.info();
        let peers: Vec<_> = info.peers_zid().wait().collect();
        assert!(peers.is_empty(), "a client session has a direct link to {peers:?}");
        let routers: Vec<String> = info.routers_zid().wait().map(|z| z.to_string()).collect();
        routers == [router.zid.as_str()]
    })
}

/// A plain Zenoh subscriber (no zenoh-cuda-shm: the bytes path, through the router).
/// Its thread checks every sample: the exact bytes written for the sequence number in
/// the header, sequence numbers increasing (messages published while the router was
/// down never reach it: gaps are expected, counted by the caller).
#[derive(Default)]
struct PlainWatch {
    received: AtomicU64,
    last: AtomicU64,
    /// The first sample with a sequence number above `mark` arrived at this moment.
    mark: AtomicU64,
    resumed: std::sync::Mutex<Option<Instant>>,
}

impl PlainWatch {
    fn start(
        session: &zenoh::Session,
        key: &str,
        stop: Arc<AtomicBool>,
    ) -> (
        Arc<Self>,
        std::thread::JoinHandle<()>,
        zenoh::pubsub::Subscriber<zenoh::handlers::FifoChannelHandler<zenoh::sample::Sample>>,
    ) {
        let sub = session.declare_subscriber(key.to_owned()).wait().expect("plain subscriber");
        let handler = sub.handler().clone();
        let w = Arc::new(Self::default());
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(Some(sample)) = handler.recv_timeout(Duration::from_millis(20)) else { continue };
                let att = sample.attachment().expect("our bytes carry a header").to_bytes();
                let h = zcs_wire::protocol::decode_attachment(&att).expect("header").expect("our header");
                let bytes = sample.payload().to_bytes();
                assert_eq!(bytes.len(), LEN, "plain seq {} length", h.seq);
                assert_eq!(check_pattern(&bytes, 0, h.seq), None, "plain seq {}: bytes not written for it", h.seq);
                let last = w2.last.load(Ordering::Relaxed);
                assert!(h.seq > last, "plain: seq {} after {last}", h.seq);
                if h.seq > w2.mark.load(Ordering::Acquire) {
                    w2.resumed.lock().unwrap().get_or_insert_with(Instant::now);
                }
                w2.last.store(h.seq, Ordering::Release);
                w2.received.fetch_add(1, Ordering::Release);
            }
        });
        (w, t, sub)
    }

    /// Starts waiting for the first sample after `seq`.
    fn mark(&self, seq: u64) {
        let mut r = self.resumed.lock().unwrap();
        self.mark.store(seq, Ordering::Release);
        *r = None;
    }

    fn resumed(&self) -> Option<Instant> {
        *self.resumed.lock().unwrap()
    }
}

/// The cell where the relay dies: this process publishes and subscribes (zero-copy)
/// through Zenoh client sessions whose only link is a router process, and a third
/// client listens with plain Zenoh (the bytes path). The router is killed at random
/// moments — while the clients reconnect to it, while discovery comes back, while
/// bytes flow through it — traffic goes on for a while without it, and it is
/// re-spawned on the same port.
///
/// What must hold: the zero-copy subscriber keeps receiving every message, in order,
/// intact, with or without the router (descriptors, leases and releases travel on its
/// own control connection, which the router's death does not touch: one connection,
/// one handshake, for the whole cell); samples it holds across a death keep their
/// bytes; the pool is whole once it lets go; the plain subscriber gets only intact,
/// increasing messages and resumes after each re-spawn; resources stay at the baseline.
pub fn relay_killed<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    const TEST: &str = "relay killed";
    let _l = serial();
    let n = iterations();
    let _w = watchdog_guard(test, Duration::from_secs(60 + 3 * n as u64));
    let t_all = Instant::now();
    let mut rng = Rng::new();
    let (port, key) = (free_tcp_port(), format!("{KEY_ROOT}/{}/{}/relay", std::process::id(), mode.name()));
    let device = mode.device();
    let client = || GpuSession::open(client_config(port), ZcsConfig { device, ..Default::default() }).wait();
    let mut router = Router::spawn(port, &mut rng);
    let pub_session = client().expect("open the publisher's session");
    let publisher = pub_session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let filler = Filler::new(&pub_session);
    let sub_session = client().expect("open the subscriber's session");
    let sub: Arc<Sub> = Arc::new(sub_session.declare_subscriber(key.clone()).wait().expect("subscriber"));
    let plain_session = zenoh::open(client_config(port)).wait().expect("open the plain session");
    let sessions = [pub_session.zenoh(), sub_session.zenoh(), &plain_session];
    let (stop, got, hold) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(Holding::default()));
    let drainer = drain_holding(Arc::clone(&sub), true, Arc::clone(&stop), Arc::clone(&got), Arc::clone(&hold));
    let (plain, plain_thread, _plain_sub) = PlainWatch::start(&plain_session, &key, Arc::clone(&stop));
    wait_until("the subscriber on the zero-copy path, the plain one matched", IO, || {
        publisher.zero_copy_subscribers() == 1 && publisher.plain_subscribers() && linked_only_to(&sessions, &router)
    });
    let mut seq = 0u64;
    let publish = |seq: u64| filler.publish(&publisher, seq);
    // Warm up so Zenoh's and the pool's steady state is the baseline.
    for _ in 0..20 {
        seq += 1;
        publish(seq);
    }
    wait_until("the subscribers to catch up", IO, || {
        got.load(Ordering::Acquire) == seq && plain.last.load(Ordering::Acquire) == seq
    });
    wait_until("the pool to be whole", IO, || publisher.pool_stats().blocks_in_use == 0);
    let (base, base_blocks, shm) = (resources(), publisher.pool_stats().allocations, dev_shm());
    let mut foreign = BTreeSet::new();
    let pool_blocks = || publisher.pool_stats().allocations;
    // This process publishes every block and (the subscriber) imports every one.
    let per_block = fds_per_block(mode);
    let (base_free, base_pool_bytes) = (gpu_free(&pub_session), publisher.pool_stats().bytes);
    let mut gpu_settle = Duration::ZERO;
    // The warm-up router dies too: every router of the loop is a re-spawned one.
    kill(router.child);

    let (mut reconnects, mut resumes, mut reclaims) = (Vec::new(), Vec::new(), Vec::with_capacity(n));
    let (mut connecting, mut discovering, mut flowing) = (0, 0, 0);
    let (mut during_outages, mut held_at_kill, mut checks, mut settle) = (0u64, 0u64, 0, Duration::ZERO);
    for i in 0..n {
        let kill_at = rng.kill_moment();
        if std::env::var_os("ZCS_CRASH_TRACE").is_some() {
            eprintln!("{TEST}: iteration {i}, kill at {kill_at:?}");
        }
        hold.target.store(rng.next() % (MAX_HELD + 1), Ordering::Release);
        plain.mark(seq);
        router = Router::spawn(port, &mut rng);
        let (mut reconnected, mut discovered, mut resumed, mut checked) = (false, false, false, false);
        while router.spawned.elapsed() < kill_at {
            seq += 1;
            publish(seq);
            std::thread::sleep(Duration::from_millis(2));
            if !reconnected && linked_only_to(&sessions, &router) {
                reconnected = true;
                reconnects.push(router.spawned.elapsed());
            }
            discovered = discovered || reconnected && publisher.aware_subscribers() == 1;
            if !resumed && let Some(at) = plain.resumed() {
                resumed = true;
                resumes.push(at - router.spawned);
            }
            if resumed && discovered && !checked {
                // Once per iteration that gets this far: everything is back through the
                // new router, so this process holds what it held at the baseline.
                (checked, checks) = (true, checks + 1);
                let t = Instant::now();
                back_to_baseline(&base, base_blocks, &pool_blocks, per_block, false, &format!("iteration {i}"));
                if let Some(base_free) = base_free {
                    let grown = 2 * (publisher.pool_stats().bytes - base_pool_bytes) as usize;
                    wait_until("device memory back to the baseline", IO, || {
                        gpu_free(&pub_session).expect("free") + grown + GPU_SLACK >= base_free
                    });
                    gpu_settle = gpu_settle.max(t.elapsed());
                }
                settle = settle.max(t.elapsed());
            }
        }
        match (reconnected, discovered && resumed) {
            (false, _) => connecting += 1,
            (true, false) => discovering += 1,
            (true, true) => flowing += 1,
        }
        held_at_kill += publisher.pool_stats().blocks_in_use as u64;
        kill(router.child);
        let (killed, outage) = (Instant::now(), rng.below(OUTAGE_WINDOW));
        let before = seq;
        while killed.elapsed() < outage {
            seq += 1;
            publish(seq);
            std::thread::sleep(Duration::from_millis(2));
        }
        during_outages += seq - before;
        // The router is still dead: what reaches the zero-copy subscriber does not go
        // through it. Then it lets go of what it holds, and the pool is whole.
        wait_until("the subscriber to receive everything without the router", IO, || {
            got.load(Ordering::Acquire) == seq
        });
        hold.target.store(0, Ordering::Release);
        wait_until("the subscriber to let go of its samples", IO, || hold.now.load(Ordering::Acquire) == 0);
        let released = Instant::now();
        while publisher.pool_stats().blocks_in_use != 0 {
            assert!(
                released.elapsed() < RECLAIM_LIMIT,
                "iteration {i}: {} blocks still in use {:?} after the subscriber let go of its samples",
                publisher.pool_stats().blocks_in_use,
                released.elapsed()
            );
            std::thread::sleep(Duration::from_micros(100));
        }
        reclaims.push(released.elapsed());
        check_dev_shm(&shm, &mut foreign, &format!("iteration {i}"));
        // Never a second connection or handshake: the link outlived the router.
        assert_eq!(publisher.zero_copy_subscribers(), 1, "iteration {i}: control connections");
        assert_eq!(sub.publishers().len(), 1, "iteration {i}: the subscriber forgot its publisher");
    }
    // A last router: everything comes back through it, and the cell ends at the baseline.
    plain.mark(seq);
    router = Router::spawn(port, &mut rng);
    let t = Instant::now();
    while !(linked_only_to(&sessions, &router) && publisher.aware_subscribers() == 1 && plain.resumed().is_some()) {
        assert!(t.elapsed() < IO, "not back through the last router (or the plain subscriber's checks failed above)");
        seq += 1;
        publish(seq);
        std::thread::sleep(Duration::from_millis(2));
    }
    for _ in 0..10 {
        seq += 1;
        publish(seq);
    }
    wait_until("the subscribers' last messages", IO, || {
        got.load(Ordering::Acquire) == seq && plain.last.load(Ordering::Acquire) == seq
    });
    hold.target.store(0, Ordering::Release);
    wait_until("the pool to be whole", IO, || publisher.pool_stats().blocks_in_use == 0);
    let idle = back_to_baseline(&base, base_blocks, &pool_blocks, per_block, true, "end of the cell");
    check_dev_shm(&shm, &mut foreign, "end of the cell");
    let (ps, ss) = (publisher.stats(), sub.stats());
    assert_eq!((ps.handshakes, ss.handshakes, ps.disconnects), (1, 1, 0), "one link for the whole cell");
    assert_eq!(ss.evictions, 0, "the subscriber never evicted its publisher");
    stop.store(true, Ordering::Relaxed);
    let refused = drainer.join().expect("the subscriber's checks failed (see above)");
    assert_eq!(refused, 0, "the publisher never died");
    plain_thread.join().expect("the plain subscriber's checks failed (see above)");
    kill(router.child);
    let plain_received = plain.received.load(Ordering::Acquire);
    reconnects.sort();
    resumes.sort();
    reclaims.sort();
    println!(
        "{test} ({}): {n} kills in {:.1} s ({connecting} before the clients were back on the new router, \
         {discovering} after they were but before discovery and the bytes path were, {flowing} with bytes flowing \
         through it again; {held_at_kill} blocks in use at those kills); {seq} messages, all received zero-copy \
         and checked, in order ({during_outages} published while the router was dead), one control connection \
         throughout; plain subscriber received {plain_received}, all checked; clients back on the re-spawned router \
         after p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} times); bytes path delivering again after p50 {:.1} ms, \
         p99 {:.1} ms, max {:.1} ms ({} times); pool whole after the subscriber let go: p50 {:.2} ms, max {:.2} ms; \
         resources back within {:.1} ms ({checks} checks; Zenoh's idle workers retired {:.1} s after the last \
         kill){}",
        mode.name(),
        t_all.elapsed().as_secs_f64(),
        pct(&reconnects, 50.0),
        pct(&reconnects, 99.0),
        pct(&reconnects, 100.0),
        reconnects.len(),
        pct(&resumes, 50.0),
        pct(&resumes, 99.0),
        pct(&resumes, 100.0),
        resumes.len(),
        pct(&reclaims, 50.0),
        pct(&reclaims, 100.0),
        settle.as_secs_f64() * 1e3,
        idle.as_secs_f64(),
        base_free
            .map_or(String::new(), |_| format!("; device memory back within {:.1} ms", gpu_settle.as_secs_f64() * 1e3))
    );
    assert!(connecting > 0 && flowing > 0, "the kill window must cover the reconnection and the traffic");
}

// ------------------------------------------------------------------ victims

/// The victims' side: call from the test binary's `child_entry` (an ignored test).
pub fn child_entry() {
    let Some(role) = child_role() else { return };
    let mode = MediumKind::from_env(MODE_ENV);
    // Killed long before; never outlive a parent that died.
    let _w = watchdog_guard("crash victim", Duration::from_secs(30));
    let port: u16 = std::env::var(PORT_ENV).expect("port").parse().expect("port number");
    if role == "victim-router" {
        let zid = std::env::var(ROUTER_ID_ENV).expect("router id");
        let _router = zenoh::open(router_config(port, &zid)).wait().expect("open the router");
        loop {
            std::thread::park();
        }
    }
    let key = std::env::var(KEY_ENV).expect("key");
    let mut rng = Rng(std::env::var(SEED_ENV).expect("seed").parse::<u64>().expect("seed") | 1);
    let s = session(mode, port, false);
    match role.as_str() {
        "victim-sub" => {
            // Holds a random number of samples (leases) and reads each fully.
            let sub: Sub = s.declare_subscriber(key).wait().expect("subscriber");
            let hold = (rng.next() % 8) as usize;
            let mut held = std::collections::VecDeque::new();
            let mut c = Checker::default();
            loop {
                if let Ok(sample) = sub.recv_timeout(Duration::from_millis(50)) {
                    c.check(&sample, false);
                    held.push_back(sample);
                    while held.len() > hold {
                        held.pop_front();
                    }
                }
            }
        }
        "victim-pub" => {
            let p = s.declare_publisher(key).wait().expect("publisher");
            let filler = Filler::new(&s);
            for seq in 1.. {
                filler.publish(&p, seq);
                std::thread::sleep(Duration::from_micros(500 + rng.next() % 1500));
            }
        }
        other => panic!("unknown role {other}"),
    }
}
