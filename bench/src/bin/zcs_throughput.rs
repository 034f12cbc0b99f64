//! Throughput of the zero-copy path against every way a user could move GPU frames
//! instead, with 1 and several subscriber processes that run a real kernel on every
//! frame.
//!
//! The publisher (this process) fills each frame with a pattern seeded by its sequence
//! number (`Kernels::fill` on the GPU); every subscriber (this binary re-run as a child)
//! makes the frame ready on its own stream and runs `Kernels::check` against the same
//! pattern, counting differing bytes in a device counter (`errors` must be 0), then
//! synchronises its stream. The publisher goes as fast as back-pressure allows: pool
//! loans wait while subscribers hold blocks, Zenoh puts block when queues are full.
//!
//! Paths (`path` in the rows):
//! - `zero-copy`: ours, CUDA sessions on both sides; the block is read in place.
//! - `cpu-bytes`: ours, subscribers opened with `device: host` and `host_blocks: false`:
//!   the publisher copies each block device→host once and sends bytes; each subscriber
//!   copies them host→device into a reused buffer and runs the kernel.
//! - `host-block`: ours, CPU consumers (`device: host`): the publisher copies each block
//!   device→host once into a shared host block, which every subscriber reads in place
//!   and checks on the CPU, 8 bytes of every 4 KiB page (a full CPU check of a 4K frame
//!   takes longer than the transport).
//! - `zenoh-pinned` / `zenoh-pageable`: plain Zenoh, the user copying: the frame is
//!   filled in a device buffer, copied device→host into pinned memory (recycled by a
//!   `PinnedPool`, handed to Zenoh without another copy) or into a fresh `Vec`, and put;
//!   the subscriber copies host→device and runs the kernel.
//! - `zenoh-bytes` (`--backend host` only): plain Zenoh, filled and checked on the CPU.
//! - `zenoh-host`: plain Zenoh moving host payloads, what the link itself carries: the
//!   publisher puts one buffer filled once per size (no GPU, no fill per frame), each
//!   subscriber checks 8 bytes of every 4 KiB page on the CPU. The anchor of the
//!   cross-host rows. The buffer is hot in the publisher's caches when it is put, as a
//!   payload the CPU has just written would be.
//! - `zenoh-host-cold` (only when named in `--paths`): the same, cycling through
//!   256 MiB of buffers, so that each one put is no longer in the caches, as a frame the
//!   GPU has just copied out is not.
//! - `zenoh-host-gpu` (only when named): `zenoh-host` with a GPU consumer, as `zenoh-pinned`'s
//!   (H2D into a reused buffer, check kernel): which side a GPU costs the link.
//!
//! Across hosts (`--remote-netns`): the subscriber processes enter a network namespace
//! joined to this one by a veth pair (`scripts/netns-link.sh`) and take their own
//! `host_id`, so our sessions treat them as another host; Zenoh runs over the link
//! (`--link-ip`), the control sockets are path sockets. Rows gain `link: veth` and their
//! paths a `cross-host` name: `cross-host` is ours (a CUDA subscriber on another host:
//! bytes, then its H2D and check kernel), `zenoh-host-cross-host` the link's anchor,
//! `zenoh-pinned-cross-host` a user's own copies.
//!
//! Rows (one JSON object per line): `throughput-setup`, then `throughput` per path,
//! size and subscriber count (msgs/s, GB/s, errors, lost frames, publish→checked
//! latency p50/p99, CPU µs per message of the publisher and of a subscriber, pool bytes
//! and the device-wide GPU memory delta; on our paths also where each frame's host time
//! goes: the publisher's `loan` / `fill_launch` / `put`, the subscriber's `recv` (waiting
//! for the frame) / `read` / `check_launch` / `end` / `synchronize` / `drop`, means in
//! µs); `first-message` (declare → first sample ready, and → first zero-copy sample, over
//! `--first-subs` fresh subscriber processes joining a publisher at `--first-rate` Hz,
//! with the milestones before it); `d2d-copy` (one `cuMemcpyDtoDAsync` +
//! synchronize per size: the physical reference).
//!
//! ```text
//! zcs_throughput --backend cuda                    # H100/H200: every row (~3 min)
//! zcs_throughput --backend host --frames 50        # CI smoke, no GPU: memfd blocks vs plain bytes
//! zcs_throughput --backend cuda --sub-gpu 1 --paths zero-copy   # two GPUs: zero-copy-peer
//! zcs_throughput --backend cuda --sub-gpu 1 --peer-copy --paths zero-copy   # peer-copy
//! zcs_throughput --backend cuda --sub-gpu 1 --peer-host --paths zero-copy   # host-copy
//! eval "$(scripts/netns-link.sh up)"      # NETNS=/proc/<pid>/ns/net LINK_IP=10.77.0.1
//! zcs_throughput --backend cuda --remote-netns "$NETNS" --link-ip "$LINK_IP" \
//!     --paths zero-copy,zenoh-host,zenoh-pinned --first-subs 0   # cross-host rows
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::json;
use zcs_bench::check::{Checker, StageClock, Stages};
use zcs_bench::frames::{CHILD_LIMIT, DRAIN_IDLE, FRAME_4K_RGBA, FRAME_1080P_RGB, ROUTE_TIMEOUT, SUB_FIFO};
use zcs_bench::{cpu_secs, fill_loan, loan_waiting, now_ns, parse_stamp, stamp};
use zcs_memory::cuda::kernels::fill_pattern;
use zcs_memory::cuda::pinned::PinnedPool;
use zcs_memory::cuda::{DeviceBlock, Gpu, Kernels, Stream, sys};
use zcs_tests::{
    child_role, free_tcp_port, loopback_zenoh_config, parse_size, percentile, recv_msg, send_msg, spawn_child_bin,
    wait_child, watchdog_guard,
};
use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};
use zenoh::Wait;
use zenoh::bytes::ZBytes;
use zenoh_cuda_shm::config::{DeviceChoice, HostId, PeerGpus};
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, Path, ZcsConfig};

#[derive(Parser, Debug)]
#[command(
    about = "zenoh-cuda-shm throughput against plain Zenoh with user copies, N subscriber processes (JSON lines)"
)]
struct Args {
    /// Backend: `cuda` (every path, kernels on both sides) or `host` (no GPU, no CUDA
    /// call: zero-copy over memfd blocks and plain Zenoh bytes, checked on the CPU).
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Frame sizes (bytes, or with a KiB/MiB/GiB suffix). Default: 1080p RGB and 4K
    /// RGBA (cuda), 64KiB,1MiB (host).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// Subscriber process counts.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    subscribers: Vec<usize>,
    /// Paths to run (default: all of the backend's).
    #[arg(long, value_delimiter = ',')]
    paths: Option<Vec<String>>,
    /// Timed frames per row (fewer if the row reaches --max-secs).
    #[arg(long, default_value_t = 2000)]
    frames: u64,
    /// Untimed frames first (pool, imports and staging buffers warm up).
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// Time budget of the timed frames of one row, in seconds.
    #[arg(long, default_value_t = 5.0)]
    max_secs: f64,
    /// Most blocks in each publisher's pool: loans wait for blocks to come back once
    /// this many are out (kept below the per-subscriber lease limit of 64, so a
    /// subscriber that falls behind slows the publisher instead of being sent bytes).
    #[arg(long, default_value_t = 32)]
    pool_blocks: usize,
    /// Fresh subscriber processes for the first-message rows (0: skip).
    #[arg(long, default_value_t = 10)]
    first_subs: usize,
    /// Publish rate while new subscribers join (Hz).
    #[arg(long, default_value_t = 1000.0)]
    first_rate: f64,
    /// Frame size while new subscribers join.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    first_size: usize,
    /// The subscribers' GPU (cuda backend): another GPU than the publisher's (0) reads
    /// the frames over NVLink or PCIe (row `zero-copy-peer`).
    #[arg(long, default_value_t = 0)]
    sub_gpu: usize,
    /// With `--sub-gpu`: the subscribers copy each frame onto their GPU on arrival
    /// (`peer_gpus: copy`, row `peer-copy`).
    #[arg(long, conflicts_with = "peer_host")]
    peer_copy: bool,
    /// With `--sub-gpu`: the subscribers take each frame through a host block and copy
    /// it onto their GPU, as without peer access (`peer_gpus: host`, row `host-copy`).
    #[arg(long)]
    peer_host: bool,
    /// A network namespace (e.g. `/proc/<pid>/ns/net`) the subscriber processes enter,
    /// standing in for another host (rows `cross-host…`). Needs `--link-ip`.
    #[arg(long, requires = "link_ip")]
    remote_netns: Option<std::path::PathBuf>,
    /// This process's address on the link to `--remote-netns`: Zenoh listens there.
    #[arg(long, requires = "remote_netns")]
    link_ip: Option<std::net::IpAddr>,
}

const PREFIX: &str = "zcs-tput";
const PORT_ENV: &str = "ZCS_TPUT_PORT";
const SOCK_ENV: &str = "ZCS_TPUT_SOCK";
const BACKEND_ENV: &str = "ZCS_TPUT_BACKEND";
const PATH_ENV: &str = "ZCS_TPUT_PATH";
const KEY_ENV: &str = "ZCS_TPUT_KEY";
const SUB_GPU_ENV: &str = "ZCS_TPUT_SUB_GPU";
const PEER_MODE_ENV: &str = "ZCS_TPUT_PEER_MODE";
const NETNS_ENV: &str = "ZCS_TPUT_NETNS";
const LINK_IP_ENV: &str = "ZCS_TPUT_LINK_IP";
const HOST_ID_ENV: &str = "ZCS_TPUT_HOST_ID";
/// `--sub-gpu`, set once by `main` (the parent) or read from the environment (a child).
static SUB_GPU: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
/// `--peer-copy` or `--peer-host` as the subscribers' `peer_gpus`, likewise.
static PEER_MODE: std::sync::OnceLock<PeerGpus> = std::sync::OnceLock::new();

fn sub_gpu() -> usize {
    *SUB_GPU.get_or_init(|| std::env::var(SUB_GPU_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0))
}

fn peer_mode() -> PeerGpus {
    *PEER_MODE.get_or_init(|| match std::env::var(PEER_MODE_ENV).as_deref() {
        Ok("copy") => PeerGpus::Copy,
        Ok("host") => PeerGpus::Host,
        _ => PeerGpus::InPlace,
    })
}

/// A row's path: `zero-copy` is `zero-copy-peer` when the subscribers are on another GPU,
/// `peer-copy` when they copy each frame onto it, `host-copy` when through host memory;
/// across the link every path is named `cross-host…`.
fn row_path(route: Route) -> String {
    let name = match (route, sub_gpu() != 0, peer_mode()) {
        (Route::ZeroCopy, true, PeerGpus::Copy) => "peer-copy",
        (Route::ZeroCopy, true, PeerGpus::Host) => "host-copy",
        (Route::ZeroCopy, true, _) => "zero-copy-peer",
        _ => route.name(),
    };
    match (link().remote(), route) {
        (false, _) => name.to_owned(),
        (true, Route::ZeroCopy) => "cross-host".to_owned(),
        (true, _) => format!("{name}-cross-host"),
    }
}

/// Where the subscriber processes run: beside the publisher (loopback), or in a network
/// namespace standing in for another host, over a veth link.
#[derive(Debug, Clone, Default)]
struct Link {
    /// The namespace and the publisher's address on the link.
    remote: Option<(std::path::PathBuf, std::net::IpAddr)>,
}

static LINK: std::sync::OnceLock<Link> = std::sync::OnceLock::new();

/// The link, set once by `main` (the parent) or read from the environment (a child).
fn link() -> &'static Link {
    LINK.get_or_init(|| {
        let netns = std::env::var_os(NETNS_ENV).map(std::path::PathBuf::from);
        let ip = std::env::var(LINK_IP_ENV).ok().map(|v| v.parse().expect("link address"));
        Link { remote: netns.zip(ip) }
    })
}

impl Link {
    fn remote(&self) -> bool {
        self.remote.is_some()
    }

    /// A peer on loopback, or on the link's address when remote (the publisher listens
    /// there, the subscribers connect to it).
    fn zenoh_config(&self, listen: Option<u16>, connect: Option<u16>) -> zenoh::Config {
        let mut c = loopback_zenoh_config(listen, connect, Some(PREFIX));
        if let Some((_, ip)) = &self.remote {
            let at = |port: u16| format!("[\"tcp/{}\"]", std::net::SocketAddr::new(*ip, port));
            if let Some(port) = listen {
                c.insert_json5("listen/endpoints", &at(port)).expect("listen endpoint");
            }
            if let Some(port) = connect {
                c.insert_json5("listen/endpoints", "[]").expect("listen endpoint");
                c.insert_json5("connect/endpoints", &at(port)).expect("connect endpoint");
            }
        }
        c
    }

    /// The parent's control socket: abstract names are private to a network namespace,
    /// so a remote child reaches a path socket instead.
    fn control_socket(&self) -> SocketName {
        match self.remote {
            None => SocketName::random_abstract(),
            Some(_) => {
                SocketName::random_path_in(&std::env::temp_dir().join(format!("zcs-tput-{}", std::process::id())))
                    .expect("a directory for path sockets")
            }
        }
    }

    /// The child's environment for the link.
    fn child_env(&self) -> Vec<(&'static str, String)> {
        match &self.remote {
            None => Vec::new(),
            Some((netns, ip)) => vec![
                (NETNS_ENV, netns.display().to_string()),
                (LINK_IP_ENV, ip.to_string()),
                (HOST_ID_ENV, format!("remote-{}", std::process::id())),
            ],
        }
    }

    /// A child enters the namespace first, before it opens any socket or starts a thread
    /// that would (threads inherit the namespace of the thread that creates them).
    fn enter(&self) {
        let Some((netns, _)) = &self.remote else { return };
        let f = std::fs::File::open(netns).unwrap_or_else(|e| panic!("{}: {e}", netns.display()));
        // SAFETY: `f` is an open namespace file for the duration of the call.
        let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {}: {}", netns.display(), std::io::Error::last_os_error());
    }
}
const WARMUP_ENV: &str = "ZCS_TPUT_WARMUP";
const IO: Duration = Duration::from_secs(60);

/// A way of moving frames from the publisher to the subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    ZeroCopy,
    CpuBytes,
    HostBlock,
    ZenohPinned,
    ZenohPageable,
    ZenohBytes,
    ZenohHost,
    ZenohHostCold,
    ZenohHostGpu,
}

impl Route {
    const ALL: [Route; 9] = [
        Route::ZeroCopy,
        Route::CpuBytes,
        Route::HostBlock,
        Route::ZenohPinned,
        Route::ZenohPageable,
        Route::ZenohBytes,
        Route::ZenohHost,
        Route::ZenohHostCold,
        Route::ZenohHostGpu,
    ];

    fn name(self) -> &'static str {
        match self {
            Route::ZeroCopy => "zero-copy",
            Route::CpuBytes => "cpu-bytes",
            Route::HostBlock => "host-block",
            Route::ZenohPinned => "zenoh-pinned",
            Route::ZenohPageable => "zenoh-pageable",
            Route::ZenohBytes => "zenoh-bytes",
            Route::ZenohHost => "zenoh-host",
            Route::ZenohHostCold => "zenoh-host-cold",
            Route::ZenohHostGpu => "zenoh-host-gpu",
        }
    }

    fn parse(s: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.name() == s)
    }

    /// Whether the route runs on this backend.
    fn available(self, cuda: bool) -> bool {
        match self {
            Route::ZeroCopy | Route::ZenohHost | Route::ZenohHostCold => true,
            Route::ZenohHostGpu => cuda,
            Route::CpuBytes | Route::HostBlock | Route::ZenohPinned | Route::ZenohPageable => cuda,
            Route::ZenohBytes => !cuda,
        }
    }

    fn ours(self) -> bool {
        matches!(self, Route::ZeroCopy | Route::CpuBytes | Route::HostBlock)
    }

    fn note(self) -> &'static str {
        match self {
            Route::ZeroCopy => {
                "block read in place (CUDA: check kernel on the subscriber's stream, synchronized; host: CPU check of the mapped memfd)"
            }
            Route::CpuBytes => {
                "subscriber session device: host; publisher D2H once per message, bytes over zenoh, \
                 subscriber H2D (pageable) into a reused buffer, check kernel, synchronized"
            }
            Route::HostBlock => {
                "subscriber session device: host (a CPU consumer); publisher D2H once per message into a shared \
                 host block, read in place, CPU check of 8 bytes per 4 KiB page"
            }
            Route::ZenohPinned => {
                "plain zenoh; publisher fill kernel + D2H into recycled pinned memory (no further copy into \
                 ZBytes); subscriber H2D (pageable) into a reused buffer, check kernel, synchronized"
            }
            Route::ZenohPageable => {
                "plain zenoh; publisher fill kernel + D2H into a fresh Vec per frame; subscriber H2D \
                 (pageable) into a reused buffer, check kernel, synchronized"
            }
            Route::ZenohBytes => "plain zenoh; filled and checked on the CPU",
            Route::ZenohHost => {
                "plain zenoh moving host payloads: one buffer filled once per size, put every frame; \
                 subscriber checks 8 bytes per 4 KiB page on the CPU (what the link carries)"
            }
            Route::ZenohHostCold => {
                "plain zenoh moving host payloads, as zenoh-host but cycling through 256 MiB of buffers \
                 (each one put is out of the caches, like a frame just copied out of the GPU)"
            }
            Route::ZenohHostGpu => {
                "plain zenoh moving host payloads, as zenoh-host; subscriber H2D (pageable) into a reused \
                 buffer, check kernel, synchronized"
            }
        }
    }
}

/// Control messages between the publisher and its subscriber processes.
#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    /// Child → parent: subscribed (and, for plain routes, its liveliness token is up).
    Ready,
    /// Parent → child: this many frames were published in all.
    Done { sent: u64 },
    /// Child → parent: what a throughput subscriber saw.
    Report(SubReport),
    /// Child → parent: what a joining subscriber saw.
    First {
        any_us: f64,
        /// `any_us` less the time spent waiting for the publisher's next frame.
        any_net_us: f64,
        zero_copy_us: Option<f64>,
        zero_copy_net_us: Option<f64>,
        /// `zero_copy_net_us` up to `recv` returning it (before the consumer's check).
        zero_copy_recv_net_us: Option<f64>,
        first_path: String,
        samples_before_zero_copy: u64,
        /// Milestones after the declaration (µs): `declare_subscriber` returned, the
        /// publisher's token seen, the zero-copy link up (handshake done).
        declared_us: f64,
        seen_us: Option<f64>,
        linked_us: Option<f64>,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct SubReport {
    received: u64,
    errors: u64,
    /// Publish → check done, timed frames only.
    lat_p50_us: f64,
    lat_p99_us: f64,
    /// Wall clock (ns since the epoch) when the last frame was checked.
    last_done_ns: u64,
    cpu_s: f64,
    zero_copy: u64,
    cpu_bytes: u64,
    /// Mean host time per frame in each step of the receive loop (µs).
    stages_us: Stages,
}

fn zcs_config(device: DeviceChoice) -> ZcsConfig {
    ZcsConfig { device, ..ZcsConfig::default() }
}

fn device_choice(cuda: bool) -> DeviceChoice {
    if cuda { DeviceChoice::Cuda } else { DeviceChoice::Host }
}

/// Polls `ok` every 5 ms until it has held for 200 ms; panics after `ROUTE_TIMEOUT`.
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    let mut quiet = Instant::now();
    loop {
        if !ok() {
            quiet = Instant::now();
        } else if quiet.elapsed() >= Duration::from_millis(200) {
            return;
        }
        assert!(t.elapsed() < ROUTE_TIMEOUT, "{what}: not ready within {ROUTE_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------
// Subscriber side: making a frame ready on the GPU and checking it
// ---------------------------------------------------------------------------------

/// What a subscriber child needs from its environment.
struct ChildEnv {
    conn: ControlConn,
    port: u16,
    cuda: bool,
    route: Route,
    key: String,
    warmup: u64,
}

impl ChildEnv {
    fn read() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
        let sock = SocketName::from_key_chunk(&var(SOCK_ENV)).expect("socket");
        Self {
            conn: ControlConn::connect(&sock, IO).expect("connect to the publisher"),
            port: var(PORT_ENV).parse().expect("port"),
            cuda: var(BACKEND_ENV) == "cuda",
            route: Route::parse(&var(PATH_ENV)).expect("path"),
            key: var(KEY_ENV),
            warmup: var(WARMUP_ENV).parse().expect("warmup"),
        }
    }

    fn zenoh(&self) -> zenoh::Session {
        zenoh::open(link().zenoh_config(None, Some(self.port))).wait().expect("open zenoh")
    }

    /// Our session: CUDA for `zero-copy` on the cuda backend, else host memory.
    fn gpu_session(&self) -> GpuSession {
        let device = device_choice(self.cuda && self.route == Route::ZeroCopy);
        let peer_gpus = peer_mode();
        let host_blocks = self.route != Route::CpuBytes;
        // Across the link: another host, as our sessions see it.
        let host_id = std::env::var(HOST_ID_ENV).ok().map(|id| HostId::new(id).expect("host id"));
        let cfg = ZcsConfig { gpu_ordinal: sub_gpu(), peer_gpus, host_blocks, host_id, ..zcs_config(device) };
        GpuSession::from_zenoh(self.zenoh(), cfg).wait().expect("open the subscriber session")
    }
}

/// One checked frame, in the subscriber's receive thread.
struct Tally {
    warmup: u64,
    received: u64,
    lat_us: Vec<f64>,
    last_done_ns: u64,
}

impl Tally {
    fn done(&mut self, seq: u64, published_ns: u64) {
        self.received += 1;
        self.last_done_ns = now_ns();
        if seq > self.warmup && published_ns > 0 {
            self.lat_us.push(self.last_done_ns.saturating_sub(published_ns) as f64 / 1e3);
        }
    }
}

/// Receives frames with `next` (which checks each with the checker) until the
/// publisher's total is reached, or nothing came for `DRAIN_IDLE` after it was
/// announced; returns the report.
fn receive_loop(
    target: &AtomicU64,
    warmup: u64,
    checker: &mut Checker,
    mut next: impl FnMut(&mut Checker, Duration) -> Option<(u64, u64)>,
) -> SubReport {
    let mut t = Tally { warmup, received: 0, lat_us: Vec::new(), last_done_ns: 0 };
    let mut idle = Instant::now();
    loop {
        let goal = target.load(Ordering::Acquire);
        if goal != u64::MAX && (t.received >= goal || idle.elapsed() > DRAIN_IDLE) {
            break;
        }
        if let Some((seq, ts)) = next(checker, Duration::from_millis(100)) {
            t.done(seq, ts);
            idle = Instant::now();
        } else if goal == u64::MAX {
            idle = Instant::now();
        }
    }
    t.lat_us.sort_by(f64::total_cmp);
    SubReport {
        stages_us: checker.clock.means(),
        received: t.received,
        errors: checker.errors(),
        lat_p50_us: percentile(&t.lat_us, 50.0),
        lat_p99_us: percentile(&t.lat_us, 99.0),
        last_done_ns: t.last_done_ns,
        ..SubReport::default()
    }
}

fn sub_child() {
    let _wd = watchdog_guard("zcs_throughput subscriber", CHILD_LIMIT);
    let env = ChildEnv::read();
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let cpu0 = cpu_secs();
    let (tx, rx) = std::sync::mpsc::channel::<SubReport>();
    // Sessions and subscribers stay alive until the report is sent.
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    if env.route.ours() {
        let session = env.gpu_session();
        // cpu-bytes: the session has no GPU; the H2D and the kernel use a context of ours.
        // host-block: a CPU consumer, no GPU at all.
        let pages = env.route == Route::HostBlock;
        let gpu = match (env.cuda && !pages, session.gpu()) {
            (false, _) => None,
            (true, Some(g)) => Some(g.clone()),
            (true, None) => Some(Gpu::open(sub_gpu()).expect("GPU for the H2D copy and the kernel")),
        };
        let sub = session.declare_subscriber(env.key.clone()).fifo(SUB_FIFO).wait().expect("subscriber");
        let (target, warmup) = (Arc::clone(&target), env.warmup);
        std::thread::spawn(move || {
            let mut rep = receive_loop(&target, warmup, &mut Checker::new(gpu), |c, t| {
                c.clock.start();
                let s = sub.recv_timeout(t).ok()?;
                c.clock.lap("recv");
                if pages {
                    c.host_pages(&s);
                } else {
                    c.sample(&s);
                }
                c.clock.lap("host_check");
                let r = Some((s.seq(), s.info().timestamp_ns));
                drop(s);
                c.clock.lap("drop");
                c.clock.frames += 1;
                r
            });
            let st = sub.stats();
            // Frames that came over the link: read in place, copied on arrival, or from a
            // host block.
            (rep.zero_copy, rep.cpu_bytes) = (st.zero_copy + st.peer_copy + st.host_block, st.cpu_bytes);
            let _ = tx.send(rep);
        });
        keep.push(Box::new(session));
    } else {
        let z = env.zenoh();
        let fifo = zenoh::handlers::FifoChannel::new(SUB_FIFO);
        let sub = z.declare_subscriber(env.key.clone()).with(fifo).wait().expect("plain subscriber");
        let token = z.liveliness().declare_token(format!("{}/@tput/{}", env.key, std::process::id())).wait();
        keep.push(Box::new(token.expect("liveliness token")));
        // zenoh-host: a host consumer, no GPU.
        let pages = matches!(env.route, Route::ZenohHost | Route::ZenohHostCold);
        let gpu = (env.cuda && !pages).then(|| Gpu::open(sub_gpu()).expect("GPU for the H2D copy and the kernel"));
        let (target, warmup, route) = (Arc::clone(&target), env.warmup, env.route);
        std::thread::spawn(move || {
            let rep = receive_loop(&target, warmup, &mut Checker::new(gpu), |c, t| {
                let s = sub.recv_timeout(t).ok()??;
                let (seq, ts) = parse_stamp(&s.attachment()?.to_bytes())?;
                match (pages, route) {
                    (true, _) => c.pages(&s.payload().to_bytes(), HOST_SEED),
                    (false, Route::ZenohHostGpu) => c.host(&s.payload().to_bytes(), HOST_SEED),
                    (false, _) => c.host(&s.payload().to_bytes(), seq),
                }
                Some((seq, ts))
            });
            let _ = tx.send(rep);
        });
        keep.push(Box::new(z));
    }
    send_msg(&env.conn, &Msg::Ready, &[]);
    let (m, _) = recv_msg::<Msg>(&env.conn, CHILD_LIMIT);
    let Msg::Done { sent } = m else { panic!("subscriber: unexpected {m:?}") };
    target.store(sent, Ordering::Release);
    let mut rep = rx.recv_timeout(IO).expect("the receive thread reports");
    rep.cpu_s = cpu_secs() - cpu0;
    send_msg(&env.conn, &Msg::Report(rep), &[]);
    // Zenoh's threads may still run; leave without tearing anything down.
    std::process::exit(0);
}

/// A subscriber joining a running publisher: declare → first sample ready on its
/// stream, and → first zero-copy sample.
fn first_child() {
    let _wd = watchdog_guard("zcs_throughput joining subscriber", CHILD_LIMIT);
    let env = ChildEnv::read();
    let session = env.gpu_session();
    let mut checker = Checker::new(session.gpu().cloned());
    checker.warm_up();
    let (t, t0_ns) = (Instant::now(), now_ns());
    tracing::trace!(target: "zcs_join", "bench: declare_subscriber called");
    let sub = Arc::new(session.declare_subscriber(env.key.clone()).wait().expect("subscriber"));
    let declared_us = t.elapsed().as_secs_f64() * 1e6;
    // Where the time goes: a thread polls the subscriber's view of its publishers
    // (every ~20 µs) for the moment the token is seen and the moment the link is up.
    let milestones = {
        let sub = Arc::clone(&sub);
        std::thread::spawn(move || {
            let (mut seen, mut linked) = (None, None);
            while linked.is_none() && t.elapsed() < Duration::from_secs(10) {
                let pubs = sub.publishers();
                let now = t.elapsed().as_secs_f64() * 1e6;
                if seen.is_none() && !pubs.is_empty() {
                    seen = Some(now);
                }
                if pubs.iter().any(|&(_, zero_copy)| zero_copy) {
                    linked = Some(now);
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            (seen, linked)
        })
    };
    // The part of a delay spent waiting for a frame published after the declaration.
    let waited_us = |s: &GpuSample| s.info().timestamp_ns.saturating_sub(t0_ns) as f64 / 1e3;
    let (mut any, mut first_path, mut before) = (None, String::new(), 0u64);
    let zero_copy = loop {
        let Ok(s) = sub.recv_timeout(Duration::from_secs(10).saturating_sub(t.elapsed())) else { break None };
        let recv_us = t.elapsed().as_secs_f64() * 1e6;
        checker.sample(&s);
        let us = t.elapsed().as_secs_f64() * 1e6;
        if any.is_none() {
            (any, first_path) = (Some((us, us - waited_us(&s))), s.path().to_string());
        }
        if matches!(s.path(), Path::ZeroCopy | Path::ZeroCopyPeer | Path::PeerCopy) {
            break Some((us, us - waited_us(&s), recv_us - waited_us(&s)));
        }
        before += 1;
    };
    assert_eq!(checker.errors(), 0, "joining subscriber: content mismatch");
    let (any_us, any_net_us) = any.expect("no sample within 10 s");
    let (seen_us, linked_us) = milestones.join().expect("milestone thread");
    let msg = Msg::First {
        any_us,
        any_net_us,
        zero_copy_us: zero_copy.map(|z| z.0),
        zero_copy_net_us: zero_copy.map(|z| z.1),
        zero_copy_recv_net_us: zero_copy.map(|z| z.2),
        first_path,
        samples_before_zero_copy: before,
        declared_us,
        seen_us,
        linked_us,
    };
    send_msg(&env.conn, &msg, &[]);
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------
// Publisher side
// ---------------------------------------------------------------------------------

/// What a plain-Zenoh user has on the GPU: a frame buffer the fill kernel writes, and
/// (pinned path) a pool of page-locked staging buffers.
struct UserFrame {
    gpu: Gpu,
    kernels: Kernels,
    stream: Stream,
    frame: DeviceBlock,
    pinned: Option<PinnedPool>,
}

impl UserFrame {
    /// Fills the frame with `seq`'s pattern and copies it device→host.
    fn produce(&self, size: usize, seq: u64) -> ZBytes {
        let (ptr, st) = (self.frame.device_ptr(), self.stream.cu_stream());
        // SAFETY: the frame block has ≥ size bytes and lives as long as `self`; every
        // copy out of it is synchronised before the next fill.
        unsafe { self.kernels.fill(&self.stream, ptr, size as u64, seq) }.expect("fill");
        if let Some(pool) = &self.pinned {
            // SAFETY: the frame holds ≥ size bytes written by the fill ordered before on
            // the stream; nothing else writes it until the copy completes.
            let buf = unsafe { pool.copy_from_device(ptr, size, &self.stream) }.expect("D2H pinned");
            return ZBytes::from(bytes::Bytes::from_owner(buf));
        }
        let mut v = vec![0u8; size];
        self.gpu.bind().expect("bind");
        // SAFETY: `v` has size bytes and lives until the synchronize; the source as above.
        unsafe { sys::memcpy_dtoh_async(v.as_mut_ptr(), ptr, size, st) }.expect("D2H pageable");
        // SAFETY: a stream of the current context.
        unsafe { sys::stream_synchronize(st) }.expect("synchronize");
        ZBytes::from(v)
    }
}

enum Sink {
    Ours(Box<GpuPublisher>, Option<Kernels>),
    Plain(zenoh::pubsub::Publisher<'static>, Option<Box<UserFrame>>),
    /// `zenoh-host`: the host buffers put in turn (one for `zenoh-host`), and the next.
    Host(zenoh::pubsub::Publisher<'static>, Vec<bytes::Bytes>, usize),
}

/// The pattern seed of the `zenoh-host` buffer, filled once.
const HOST_SEED: u64 = 0;

/// Publishes frames of one route, each filled with the pattern of its sequence number.
struct Producer {
    sink: Sink,
    sent: u64,
    /// Host time per message in each step of `send` (ours only).
    clock: StageClock,
}

impl Producer {
    fn new(session: &GpuSession, route: Route, key: &str, max_size: usize) -> Self {
        let sink = if route.ours() {
            let p = session.declare_publisher(key.to_owned()).wait().expect("publisher");
            Sink::Ours(Box::new(p), session.gpu().map(|g| Kernels::load(g).expect("kernels")))
        } else if matches!(route, Route::ZenohHost | Route::ZenohHostCold | Route::ZenohHostGpu) {
            let p = session.zenoh().declare_publisher(key.to_owned()).wait().expect("plain publisher");
            let mut v = vec![0u8; max_size];
            fill_pattern(&mut v, 0, HOST_SEED);
            let n = if route == Route::ZenohHost { 1 } else { (256 << 20) / max_size.max(1) + 2 };
            Sink::Host(p, (0..n).map(|_| bytes::Bytes::copy_from_slice(&v)).collect(), 0)
        } else {
            let p = session.zenoh().declare_publisher(key.to_owned()).wait().expect("plain publisher");
            let frame = session.gpu().map(|g| {
                Box::new(UserFrame {
                    gpu: g.clone(),
                    kernels: Kernels::load(g).expect("kernels"),
                    stream: g.new_stream().expect("stream"),
                    frame: DeviceBlock::allocate(g, max_size).expect("frame buffer"),
                    pinned: (route == Route::ZenohPinned).then(|| PinnedPool::new(g, 256 << 20)),
                })
            });
            Sink::Plain(p, frame)
        };
        Self { sink, sent: 0, clock: StageClock::default() }
    }

    fn send(&mut self, size: usize) {
        let seq = self.sent + 1;
        match &mut self.sink {
            Sink::Ours(p, kernels) => {
                self.clock.start();
                let mut loan = loan_waiting(p, size, IO);
                self.clock.lap("loan");
                fill_loan(&mut loan, kernels.as_ref(), seq);
                self.clock.lap("fill_launch");
                let r = p.put(loan).expect("put");
                self.clock.lap("put");
                self.clock.frames += 1;
                assert_eq!(r.seq, seq, "the publisher's sequence numbers start at 1");
            }
            Sink::Plain(p, frame) => {
                let ts = now_ns();
                let payload = match frame {
                    Some(f) => f.produce(size, seq),
                    None => {
                        let mut v = vec![0u8; size];
                        fill_pattern(&mut v, 0, seq);
                        ZBytes::from(v)
                    }
                };
                p.put(payload).attachment(stamp(seq, ts)).wait().expect("plain put");
            }
            Sink::Host(p, bufs, next) => {
                let ts = now_ns();
                let buf = bufs[*next].slice(..size);
                *next = (*next + 1) % bufs.len();
                p.put(ZBytes::from(buf)).attachment(stamp(seq, ts)).wait().expect("plain put");
            }
        }
        self.sent = seq;
    }

    /// Waits until `subs` subscribers are on this route's path.
    fn wait_route(&self, route: Route, subs: usize, z: &zenoh::Session, key: &str) {
        match &self.sink {
            Sink::Ours(p, _) => {
                // Across the link nobody takes blocks.
                let zc = if matches!(route, Route::ZeroCopy | Route::HostBlock) && !link().remote() { subs } else { 0 };
                wait_until(key, || {
                    p.zero_copy_subscribers() == zc && p.aware_subscribers() == subs && !p.plain_subscribers()
                });
            }
            // Zenoh's matching status is yes/no: count the subscribers' liveliness tokens.
            Sink::Plain(..) | Sink::Host(..) => wait_until(key, || {
                let replies = z.liveliness().get(format!("{key}/@tput/*")).timeout(Duration::from_secs(1)).wait();
                replies.map(|r| r.iter().filter(|x| x.result().is_ok()).count() == subs).unwrap_or(false)
            }),
        }
    }
}

/// Subscriber processes of one row, connected over the control socket.
struct Children {
    procs: Vec<(std::process::Child, ControlConn)>,
}

impl Children {
    fn spawn(role: &str, n: usize, port: u16, backend: &str, route: Route, key: &str, warmup: u64) -> Self {
        let name = link().control_socket();
        let listener = ControlListener::bind(&name).expect("bind");
        let mut env = vec![
            (PORT_ENV, port.to_string()),
            (SOCK_ENV, name.to_key_chunk()),
            (BACKEND_ENV, backend.to_owned()),
            (PATH_ENV, route.name().to_owned()),
            (KEY_ENV, key.to_owned()),
            (WARMUP_ENV, warmup.to_string()),
            (SUB_GPU_ENV, sub_gpu().to_string()),
            (PEER_MODE_ENV, format!("{:?}", peer_mode()).to_lowercase()),
        ];
        env.extend(link().child_env());
        let mut procs = Vec::new();
        for _ in 0..n {
            let child = spawn_child_bin(role, &env);
            procs.push((child, listener.accept_timeout(IO).expect("a subscriber connects")));
        }
        Self { procs }
    }

    fn recv_each(&self) -> Vec<Msg> {
        self.procs.iter().map(|(_, c)| recv_msg::<Msg>(c, IO).0).collect()
    }

    fn send_each(&self, m: &Msg) {
        self.procs.iter().for_each(|(_, c)| send_msg(c, m, &[]));
    }

    fn wait(self) {
        self.procs.into_iter().for_each(|(child, _)| wait_child(child, "subscriber", IO));
    }
}

struct Ctx {
    args: Args,
    port: u16,
    session: GpuSession,
}

impl Ctx {
    fn free_gpu_mem(&self) -> Option<usize> {
        self.session.gpu().map(|g| g.mem_info().expect("mem_info").0)
    }

    fn throughput_row(&self, route: Route, size: usize, subs: usize) {
        let args = &self.args;
        let _wd = watchdog_guard("zcs_throughput row", Duration::from_secs_f64(args.max_secs) + 3 * IO);
        let key = format!("{PREFIX}/{}/{size}/{subs}", route.name());
        let children = Children::spawn("sub", subs, self.port, &args.backend, route, &key, args.warmup);
        for m in children.recv_each() {
            assert!(matches!(m, Msg::Ready), "unexpected {m:?}");
        }
        let free0 = self.free_gpu_mem();
        let mut producer = Producer::new(&self.session, route, &key, size);
        producer.wait_route(route, subs, self.session.zenoh(), &key);

        for _ in 0..args.warmup {
            producer.send(size);
        }
        producer.clock = StageClock::default();
        let (start_ns, t, cpu0) = (now_ns(), Instant::now(), cpu_secs());
        let budget = Duration::from_secs_f64(args.max_secs);
        let mut timed = 0u64;
        while timed < args.frames && (timed < 5 || t.elapsed() < budget) {
            producer.send(size);
            timed += 1;
        }
        let pub_cpu = cpu_secs() - cpu0;
        let sent = producer.sent;
        children.send_each(&Msg::Done { sent });
        let reports: Vec<SubReport> = children
            .recv_each()
            .into_iter()
            .map(|m| match m {
                Msg::Report(r) => r,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        children.wait();
        let mem_delta = free0.zip(self.free_gpu_mem()).map(|(a, b)| a as i64 - b as i64);

        let end_ns = reports.iter().map(|r| r.last_done_ns).max().unwrap_or(start_ns);
        let secs = end_ns.saturating_sub(start_ns) as f64 / 1e9;
        let msgs_per_s = timed as f64 / secs;
        let worst = |f: fn(&SubReport) -> f64| reports.iter().map(f).fold(f64::NAN, f64::max);
        // The publisher's counters say why frames went as bytes (lease limit, slow
        // disconnects, a subscriber not yet handshaken).
        let (pool_bytes, copies_out, pub_stats) = match &producer.sink {
            Sink::Ours(p, _) => (Some(p.pool_stats().bytes), Some(p.stats().copies_out), Some(p.stats())),
            Sink::Plain(..) | Sink::Host(..) => (None, None, None),
        };
        let r0 = &reports[0];
        println!(
            "{}",
            json!({
                "bench": "throughput",
                "path": row_path(route),
                "backend": self.session.backend().to_string(),
                "link": if link().remote() { "veth" } else { "loopback" },
                "size": size,
                "subscribers": subs,
                "frames": timed,
                "warmup": args.warmup,
                "secs": secs,
                "msgs_per_s": msgs_per_s,
                "gb_per_s": msgs_per_s * size as f64 / 1e9,
                "gb_per_s_all_subscribers": msgs_per_s * (size * subs) as f64 / 1e9,
                "errors": reports.iter().map(|r| r.errors).sum::<u64>(),
                "lost": reports.iter().map(|r| sent.saturating_sub(r.received)).sum::<u64>(),
                "latency_p50_us": worst(|r| r.lat_p50_us),
                "latency_p99_us": worst(|r| r.lat_p99_us),
                "pub_cpu_us_per_msg": pub_cpu / timed as f64 * 1e6,
                "sub_cpu_us_per_msg": r0.cpu_s / r0.received.max(1) as f64 * 1e6,
                "sub_zero_copy_samples": route.ours().then_some(r0.zero_copy),
                "sub_cpu_bytes_samples": route.ours().then_some(r0.cpu_bytes),
                "pub_stages_us": route.ours().then(|| producer.clock.means()),
                "sub_stages_us": route.ours().then_some(&r0.stages_us),
                "copies_out": copies_out,
                "pub_stats": pub_stats,
                "pool_bytes": pool_bytes,
                "gpu_mem_delta_bytes": mem_delta,
                "gpu_mem_delta_scope": "device-wide drop of free memory from subscribers ready to end of row: \
                    publisher pool and frame buffer, subscribers' staging (not their CUDA contexts)",
                "note": route.note(),
            })
        );
    }

    fn first_message_rows(&self) {
        let args = &self.args;
        let _wd = watchdog_guard("zcs_throughput first-message", 3 * IO + IO * args.first_subs as u32);
        let key = format!("{PREFIX}/first");
        let route = Route::ZeroCopy;
        let mut producer = Producer::new(&self.session, route, &key, args.first_size);
        let stop = Arc::new(AtomicBool::new(false));
        let (size, period) = (args.first_size, Duration::from_secs_f64(1.0 / args.first_rate.max(1.0)));
        let feeder = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    producer.send(size);
                    next += period;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            })
        };
        let (mut any, mut zc, mut paths) = (Vec::new(), Vec::new(), Vec::new());
        let (mut any_net, mut zc_net) = (Vec::new(), Vec::new());
        let (mut declared, mut seen, mut linked) = (Vec::new(), Vec::new(), Vec::new());
        let (mut zc_recv_net, mut setup) = (Vec::new(), Vec::new());
        for _ in 0..args.first_subs {
            let c = Children::spawn("first", 1, self.port, &args.backend, route, &key, 0);
            for m in c.recv_each() {
                let Msg::First {
                    any_us,
                    any_net_us,
                    zero_copy_us,
                    zero_copy_net_us,
                    zero_copy_recv_net_us,
                    first_path,
                    samples_before_zero_copy,
                    declared_us,
                    seen_us,
                    linked_us,
                } = m
                else {
                    panic!("unexpected {m:?}")
                };
                declared.push(declared_us);
                seen.extend(seen_us);
                linked.extend(linked_us);
                any.push(any_us);
                any_net.push(any_net_us);
                zc.extend(zero_copy_us);
                zc_net.extend(zero_copy_net_us);
                zc_recv_net.extend(zero_copy_recv_net_us);
                setup.extend(linked_us.zip(zero_copy_net_us).map(|(l, n)| l + n));
                paths.push(json!({"first_path": first_path, "samples_before_zero_copy": samples_before_zero_copy}));
            }
            c.wait();
        }
        stop.store(true, Ordering::Relaxed);
        feeder.join().expect("feeder");
        for v in [
            &mut any,
            &mut zc,
            &mut any_net,
            &mut zc_net,
            &mut declared,
            &mut seen,
            &mut linked,
            &mut zc_recv_net,
            &mut setup,
        ] {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "{}",
            json!({
                "bench": "first-message",
                "path": row_path(route),
                "backend": self.session.backend().to_string(),
                "size": size,
                "rate_hz": args.first_rate,
                "subscribers": any.len(),
                "first_ready_p50_us": percentile(&any, 50.0),
                "first_ready_max_us": any.last(),
                "first_zero_copy_p50_us": percentile(&zc, 50.0),
                "first_zero_copy_max_us": zc.last(),
                "first_ready_net_p50_us": percentile(&any_net, 50.0),
                "first_ready_net_max_us": any_net.last(),
                "first_zero_copy_net_p50_us": percentile(&zc_net, 50.0),
                "first_zero_copy_net_max_us": zc_net.last(),
                "zero_copy_reached": zc.len(),
                "declared_p50_us": percentile(&declared, 50.0),
                "publisher_seen_p50_us": percentile(&seen, 50.0),
                "publisher_seen_max_us": seen.last(),
                "linked_p50_us": percentile(&linked, 50.0),
                "linked_max_us": linked.last(),
                "first_zero_copy_recv_net_p50_us": percentile(&zc_recv_net, 50.0),
                "setup_p50_us": percentile(&setup, 50.0),
                "setup_max_us": setup.last(),
                "per_subscriber": paths,
                "note": "declare_subscriber → first sample checked and ready on the subscriber's stream \
                         (handshake + first import); first_ready counts any path, first_zero_copy the first \
                         sample read in place; *_net_* leave out the time spent waiting for a frame \
                         published after the declaration (the publisher runs at rate_hz); milestones after \
                         the declaration: declared (declare_subscriber returned), publisher_seen (its \
                         liveliness token reached the subscriber), linked (handshake done, zero-copy link up), \
                         polled every ~20 µs; first_zero_copy_recv_net: the first zero-copy frame's trip up to \
                         recv returning it (the rest is the consumer's check); setup = linked + \
                         first_zero_copy_net, the subscriber's own cost with the wait for a frame left out; \
                         each subscriber ran its check kernel once before declaring",
            })
        );
    }

    /// One device→device copy of each size, synchronised: the physical reference.
    fn d2d_rows(&self, gpu: &Gpu, sizes: &[usize]) {
        let stream = gpu.new_stream().expect("stream");
        for &size in sizes {
            let (src, dst) = (DeviceBlock::allocate(gpu, size), DeviceBlock::allocate(gpu, size));
            let (src, dst) = (src.expect("src"), dst.expect("dst"));
            let copy = || {
                let t = Instant::now();
                gpu.bind().expect("bind");
                let st = stream.cu_stream();
                // SAFETY: both blocks hold ≥ size bytes and outlive the synchronize.
                unsafe { sys::memcpy_dtod_async(dst.device_ptr(), src.device_ptr(), size, st) }.expect("D2D");
                // SAFETY: a stream of the current context.
                unsafe { sys::stream_synchronize(st) }.expect("synchronize");
                t.elapsed().as_secs_f64() * 1e6
            };
            (0..10).for_each(|_| {
                copy();
            });
            let mut us: Vec<f64> = (0..200).map(|_| copy()).collect();
            us.sort_by(f64::total_cmp);
            let p50 = percentile(&us, 50.0);
            println!(
                "{}",
                json!({"bench": "d2d-copy", "path": "d2d-copy", "size": size, "n": us.len(), "p50_us": p50,
                       "p99_us": percentile(&us, 99.0), "gb_per_s": size as f64 / p50 / 1e3,
                       "msgs_per_s": 1e6 / p50,
                       "note": "cuMemcpyDtoDAsync + cuStreamSynchronize, one device"})
            );
        }
    }
}

fn main() {
    // Log lines go to stderr: stdout carries the JSON lines.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(std::io::stderr).try_init();
    if let Some(role @ ("sub" | "first")) = child_role().as_deref() {
        link().enter();
        return if role == "sub" { sub_child() } else { first_child() };
    }
    let args = Args::parse();
    LINK.set(Link { remote: args.remote_netns.clone().zip(args.link_ip) }).expect("set once, before any child starts");
    SUB_GPU.set(args.sub_gpu).expect("set once, before any child starts");
    assert!(!(args.peer_copy || args.peer_host) || args.sub_gpu != 0, "--peer-copy and --peer-host need --sub-gpu");
    let mode = match (args.peer_copy, args.peer_host) {
        (true, _) => PeerGpus::Copy,
        (_, true) => PeerGpus::Host,
        _ => PeerGpus::InPlace,
    };
    PEER_MODE.set(mode).expect("set once, before any child starts");
    let cuda = match args.backend.as_str() {
        "cuda" => true,
        "host" => false,
        other => panic!("unknown backend {other:?} (cuda or host)"),
    };
    let sizes =
        args.sizes.clone().unwrap_or(if cuda { vec![FRAME_1080P_RGB, FRAME_4K_RGBA] } else { vec![64 << 10, 1 << 20] });
    let routes: Vec<Route> = match &args.paths {
        Some(names) => names.iter().map(|n| Route::parse(n).unwrap_or_else(|| panic!("unknown path {n:?}"))).collect(),
        // zenoh-host-cold and zenoh-host-gpu diagnose the anchor, run when named.
        None => Route::ALL
            .into_iter()
            .filter(|&r| r.available(cuda) && !matches!(r, Route::ZenohHostCold | Route::ZenohHostGpu))
            .collect(),
    };
    for r in &routes {
        assert!(r.available(cuda), "path {} needs --backend {}", r.name(), if cuda { "host" } else { "cuda" });
    }
    let port = free_tcp_port();
    // The publisher's pool is capped (subscribers publish nothing: their pools stay empty).
    let mut config = zcs_config(device_choice(cuda));
    config.pool.max_blocks = args.pool_blocks;
    let session = GpuSession::open(link().zenoh_config(Some(port), None), config)
        .wait()
        .unwrap_or_else(|e| panic!("--backend {}: {e}", args.backend));

    let mut setup = json!({"bench": "throughput-setup", "backend": session.backend().to_string(),
        "frames": args.frames, "warmup": args.warmup,
        "pool_max_blocks": args.pool_blocks, "subscriber_fifo": SUB_FIFO, "max_secs_per_row": args.max_secs,
        "transport": match link().remote {
            None => "zenoh peer, tcp 127.0.0.1, congestion control block".to_owned(),
            Some((_, ip)) => format!("zenoh peer, tcp {ip} over a veth pair into another network namespace, \
                subscribers with their own host_id (another host), congestion control block"),
        },
        "subscriber_work": if cuda { "Kernels::check on every frame, stream synchronized" } else { "CPU pattern check" }});
    if let (Some(g), Some(o)) = (session.gpu(), setup.as_object_mut()) {
        o.insert("gpu".into(), json!(g.name()));
        o.insert("uuid".into(), json!(g.uuid().to_string()));
    }
    println!("{setup}");

    let ctx = Ctx { args, port, session };
    for &route in &routes {
        for &size in &sizes {
            for &subs in &ctx.args.subscribers {
                ctx.throughput_row(route, size, subs);
            }
        }
    }
    if ctx.args.first_subs > 0 {
        ctx.first_message_rows();
    }
    if let Some(gpu) = ctx.session.gpu() {
        ctx.d2d_rows(gpu, &sizes);
    }
}
