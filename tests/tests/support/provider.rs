//! Pub/sub with blocks lent by a host provider, and a publisher killed mid-stream;
//! run by `provider.rs` on host memfd blocks (CI) and on CUDA VMM blocks (the GPU
//! machine), one body generic over the medium; included with `#[path]`.
//!
//! The provider runs in the test process (`provider.rs`) or in zenohd
//! through the plugin (`plugin.rs`, which reads its state from the admin space); a
//! publisher in a child process borrows its blocks (`provider: required`), and two subscriber
//! sessions (two provider clients) read them zero-copy. Each subscriber keeps the first
//! samples it receives. The publisher is SIGKILLed mid-stream; then:
//! - the dead publisher's loans are orphaned, not reused: the blocks the subscribers
//!   hold stay out of the pool;
//! - the held samples still read exactly the bytes written for their sequence numbers;
//! - once the subscribers drop them (and forget the dead publisher), every orphaned
//!   block is reclaimed and the provider's pool has nothing lent;
//! - a new publisher borrows again and both subscribers receive from it.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::check_pattern;
use zcs_tests::{
    Medium, MediumKind, Pattern, child_role, free_tcp_port, loopback_zenoh_config, spawn_child, watchdog_guard,
};
use zenoh::Wait;
use zenoh_cuda_shm::config::ProviderMode;
use zenoh_cuda_shm::provider::{GpuSelection, Provider, ProviderConfig, ProviderSnapshot};
use zenoh_cuda_shm::{GpuSample, GpuSession, GpuSubscriber, Path, ZcsConfig};

const MODE_ENV: &str = "ZCS_PROVIDER_TEST_MODE";
const PORT_ENV: &str = "ZCS_PROVIDER_TEST_PORT";
const KEY_ENV: &str = "ZCS_PROVIDER_TEST_KEY";
const KEY_ROOT: &str = "zcs-test/provider";
/// Above the inline threshold and one granule: every message is a 4 MiB block.
const LEN: usize = (3 << 20) + 7;
/// Samples each subscriber keeps across the kill.
const HELD: usize = 6;
const IO: Duration = Duration::from_secs(20);

type Sub = GpuSubscriber<flume::Receiver<GpuSample>>;

fn session(mode: MediumKind, port: u16, provider: ProviderMode) -> GpuSession {
    let cfg = ZcsConfig { device: mode.device(), provider, provider_discovery_ms: 2000, ..Default::default() };
    GpuSession::open(loopback_zenoh_config(None, Some(port), Some(KEY_ROOT)), cfg).wait().expect("open session")
}

fn check(s: &GpuSample, what: &str) {
    let seq = s.info().seq;
    let bytes = s.to_vec().unwrap_or_else(|e| panic!("{what}: seq {seq}: read failed: {e}"));
    assert_eq!(bytes.len(), LEN, "{what}: seq {seq} length");
    assert_eq!(check_pattern(&bytes, 0, seq), None, "{what}: seq {seq}: bytes not written for it");
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < IO, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
    t.elapsed()
}

/// What the scenario reads of the provider: from its snapshot when it runs in this
/// process, or from the router's admin space when the zenohd plugin runs it.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Live loans of the mode's device.
    pub loans: u64,
    /// Orphaned loans of that device still mapped by someone.
    pub orphaned: u64,
    /// Bytes of that device's pool not in its free lists.
    pub bytes_in_use: u64,
    /// Loans orphaned since the provider started.
    pub orphaned_total: u64,
    /// Orphaned loans taken back since the provider started.
    pub reclaimed_total: u64,
    /// Connected processes holding loans.
    pub borrowers: usize,
    /// Connected processes mapping lent blocks.
    pub importers: usize,
}

impl View {
    /// From a snapshot of a provider in this process.
    pub fn of(snap: &ProviderSnapshot, mode: MediumKind) -> Self {
        let dev = snap
            .devices
            .iter()
            .find(|d| (mode == MediumKind::Host) == (d.device == "host"))
            .expect("the provider lends this mode's device");
        Self {
            loans: dev.loans as u64,
            orphaned: dev.orphaned as u64,
            bytes_in_use: dev.pool.bytes_in_use,
            orphaned_total: snap.counters.orphaned,
            reclaimed_total: snap.counters.reclaimed,
            borrowers: snap.clients.iter().filter(|c| c.loans > 0).count(),
            importers: snap.clients.iter().filter(|c| c.mapped > 0).count(),
        }
    }
}

/// The provider the scenario runs against.
pub struct ProviderHost<'a> {
    /// The Zenoh port the scenario's sessions connect to.
    pub port: u16,
    /// The provider's id, as its token announces it.
    pub id: u64,
    /// Its state now.
    pub view: &'a dyn Fn() -> View,
}

/// A subscriber that keeps its first [`HELD`] samples and checks and drops the rest.
struct Reader {
    sub: Arc<Sub>,
    held: Arc<std::sync::Mutex<Vec<GpuSample>>>,
    got: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(s: &GpuSession, key: &str, name: &'static str) -> Self {
        let sub = Arc::new(s.declare_subscriber(key).wait().expect("subscriber"));
        let held: Arc<std::sync::Mutex<Vec<GpuSample>>> = Arc::default();
        let (got, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let thread = {
            let (sub, held, got, stop) = (Arc::clone(&sub), Arc::clone(&held), Arc::clone(&got), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let Ok(s) = sub.recv_timeout(Duration::from_millis(20)) else { continue };
                    assert_eq!(s.path(), Path::ZeroCopy, "{name}: seq {} not zero-copy", s.info().seq);
                    check(&s, name);
                    let mut h = held.lock().unwrap();
                    if h.len() < HELD {
                        h.push(s);
                    }
                    got.fetch_add(1, Ordering::Release);
                }
            })
        };
        Self { sub, held, got, stop, thread: Some(thread) }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("reader thread");
        }
    }
}

/// The scenario in the module docs, with the provider in this process, on `M`'s memory.
pub fn publisher_killed<M: Medium>(test: &str) {
    let Some(mode) = M::gate(test) else { return };
    let port = free_tcp_port();
    let router = zenoh::open(loopback_zenoh_config(Some(port), None, Some(KEY_ROOT))).wait().expect("provider session");
    let cfg = ProviderConfig {
        gpus: if mode == MediumKind::Cuda { GpuSelection::Ordinals(vec![0]) } else { GpuSelection::None },
        host: mode == MediumKind::Host,
        ..ProviderConfig::default()
    };
    let provider = Provider::start(&cfg, &router).expect("start the provider");
    let view = || View::of(&provider.snapshot(), mode);
    publisher_killed_at::<M>(test, &ProviderHost { port, id: provider.provider().id, view: &view });
}

/// The scenario in the module docs, against the provider of `host` (in this process or
/// in a router), on `M`'s memory (the caller has checked [`Medium::available`]).
pub fn publisher_killed_at<M: Medium>(test: &str, host: &ProviderHost<'_>) {
    let mode = M::KIND;
    let _w = watchdog_guard("provider test", Duration::from_secs(120));
    let port = host.port;
    let key = format!("{KEY_ROOT}/{}/{}", std::process::id(), mode.name());
    let (s1, s2) = (session(mode, port, ProviderMode::Auto), session(mode, port, ProviderMode::Auto));
    assert_eq!(s1.provider().ok().map(|p| p.id), Some(host.id), "subscriber sessions find the provider");
    let mut readers = [Reader::start(&s1, &key, "subscriber 1"), Reader::start(&s2, &key, "subscriber 2")];

    let victim = spawn_child(
        "child_entry",
        "provider-pub",
        &[(MODE_ENV, mode.name().to_owned()), (PORT_ENV, port.to_string()), (KEY_ENV, key.clone())],
    );
    wait_until("both subscribers to hold their samples and read on", || {
        readers.iter().all(|r| r.got.load(Ordering::Acquire) > 3 * HELD as u64)
    });
    let before = (host.view)();
    assert!(before.loans > 0, "the publisher borrowed its blocks: {before:#?}");
    assert!(before.borrowers >= 1 && before.importers >= 2, "one borrower, two importers: {before:#?}");

    let mut child = victim;
    child.kill().expect("SIGKILL the publisher");
    let status = child.wait().expect("reap");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the publisher died on its own: {status:?}");
    let killed = Instant::now();
    let lent_at_kill = before.loans;
    wait_until("the dead publisher's loans to be orphaned", || (host.view)().orphaned_total >= lent_at_kill);
    for r in &mut readers {
        r.stop();
    }
    let mid = (host.view)();
    assert!(mid.orphaned >= 1, "blocks the subscribers map are kept, not reused: {mid:#?}");
    assert_eq!(mid.loans, 0, "nothing is lent to the dead publisher any more: {mid:#?}");
    assert!(mid.bytes_in_use > 0, "kept blocks are not in the free lists: {mid:#?}");

    // The samples held across the kill still read what was written for them.
    for (i, r) in readers.iter().enumerate() {
        let held = r.held.lock().unwrap();
        assert_eq!(held.len(), HELD, "subscriber {} holds its samples", i + 1);
        for s in held.iter() {
            check(s, "held across the kill");
        }
    }
    // Dropped: the held samples and whatever arrived after the readers stopped.
    for r in &readers {
        r.held.lock().unwrap().clear();
        while let Some(s) = r.sub.try_recv() {
            check(&s, "queued at the kill");
        }
    }
    let forget = wait_until("the subscribers to forget the dead publisher", || {
        readers.iter().all(|r| r.sub.publishers().is_empty())
    });
    let reclaim = wait_until("every orphaned block to be reclaimed", || {
        let v = (host.view)();
        v.orphaned == 0 && v.loans == 0 && v.bytes_in_use == 0
    });
    let after = (host.view)();
    assert_eq!(after.reclaimed_total, after.orphaned_total, "{after:#?}");
    println!(
        "{test}: {} loans at the kill, {} orphaned, {} kept while mapped; after the samples were dropped the dead \
         publisher was forgotten in {:.0} ms and the last block reclaimed {:.0} ms later ({:.0} ms after the kill)",
        lent_at_kill,
        after.orphaned_total,
        mid.orphaned,
        forget.as_secs_f64() * 1e3,
        reclaim.as_secs_f64() * 1e3,
        killed.elapsed().as_secs_f64() * 1e3,
    );

    // The provider lends again: a publisher here, read by both subscribers.
    let s3 = session(mode, port, ProviderMode::Required);
    let p = s3.declare_publisher(key.clone()).wait().expect("publisher");
    wait_until("both subscribers to be zero-copy", || p.zero_copy_subscribers() == 2);
    let pattern = Pattern::new(&s3);
    for seq in 1..=4 {
        let mut loan = p.loan(LEN).expect("loan");
        pattern.fill(&mut loan, seq);
        assert_eq!(p.put(loan).expect("put").zero_copy, 2);
    }
    for r in &readers {
        for _ in 0..4 {
            let s = r.sub.recv_timeout(IO).expect("a sample from the new publisher");
            assert_eq!(s.path(), Path::ZeroCopy);
            check(&s, "new publisher");
        }
    }
    assert!((host.view)().loans > 0);
    drop(p);
    wait_until("the new publisher's loans to come back", || (host.view)().loans == 0);
}

/// Entry point of the re-executed test binary (the publisher).
pub fn child_entry() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "provider-pub");
    let _w = watchdog_guard("provider test publisher", Duration::from_secs(60));
    let mode = MediumKind::from_env(MODE_ENV);
    let port: u16 = std::env::var(PORT_ENV).expect("port").parse().expect("port number");
    let key = std::env::var(KEY_ENV).expect("key");
    let s = session(mode, port, ProviderMode::Required);
    let pattern = Pattern::new(&s);
    let p = s.declare_publisher(key).wait().expect("publisher");
    while p.zero_copy_subscribers() < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    for seq in 1.. {
        let mut loan = p.loan(LEN).expect("loan");
        pattern.fill(&mut loan, seq);
        p.put(loan).expect("put");
        std::thread::sleep(Duration::from_millis(2));
    }
}
