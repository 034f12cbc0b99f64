//! Publish→subscriber-ready latency between two processes, by ping-pong.
//!
//! The ping (this process) publishes a block on a key; the pong (this binary re-run as
//! a child) receives it, makes it ready on its own CUDA stream — `sample.read(&stream)`
//! then a synchronize of that stream, so the wait on the publisher's ready signal has
//! passed — and replies with a tiny message over the same kind of path. Each row
//! reports two figures: round trip / 2 (`one_way_*`), and the one-way latency the pong
//! measured itself, from the sample's publication timestamp to the moment its stream
//! had passed the ready signal (`measured_one_way_*`; both processes read the same
//! host clock).
//!
//! Rows (one JSON object per line):
//! - `zero-copy`: the pong's CUDA session is in the publisher's locality group and
//!   reads the block in place; it replies through its own publisher, which reaches the
//!   ping's subscriber the same way (a small message routed over the control socket).
//! - `cpu-bytes`: a second pong session configured with `device: host` and
//!   `host_blocks: false` takes bytes: the publisher copies the block device→host and
//!   sends bytes; the pong copies them host→device into a reused device buffer and
//!   synchronises; it replies through that session's publisher (bytes over Zenoh).
//! - `host-block`: a third pong session, `device: host` (a CPU consumer), is served host
//!   blocks: the publisher copies the block device→host into shared host memory, and
//!   the pong reads it in place there; it replies as the cpu-bytes pong does.
//! - `d2h-pinned`: the physical reference of `host-block`, in the ping's process: one
//!   device→host copy into page-locked memory, launch to synchronize (no round trip:
//!   `one_way_*` and `measured_one_way_*` are that copy's time).
//! - `zenoh-plain`: a 64-byte plain Zenoh put and reply between the same processes.
//!
//! With `--provider`, a third process runs a host provider (what the zenohd plugin
//! runs in the router) and every session borrows its blocks from it: the zero-copy row
//! is then `zero-copy-provider`, to compare with `zero-copy` from a run without it.
//! With `--zenohd <zenohd> --plugin <libzenoh_plugin_cuda_shm.so>`, that third process
//! is stock zenohd running our plugin (connected to the ping as a router), and the row
//! is `zero-copy-zenohd`.
//!
//! The ping writes nothing into the blocks (no kernel before `put`): the figures are
//! the transport's, not a producer's. Both processes talk over loopback TCP, with
//! congestion control `Block` on the benchmark's keys (Zenoh's default `Drop` loses
//! large fragmented messages).
//!
//! ```text
//! zcs_latency --backend cuda                       # H100/H200: all rows
//! zcs_latency --backend host --iters 50            # CI smoke, no GPU: host memfd blocks
//! zcs_latency --backend cuda --provider            # blocks lent by a provider process
//! zcs_latency --backend cuda --zenohd bin/zenohd --plugin libzenoh_plugin_cuda_shm.so
//! zcs_latency --backend cuda --spin-us 0            # subscribers never busy-poll
//! zcs_latency --backend cuda --pong-gpu 1           # two GPUs: the peer path
//! zcs_latency --backend cuda --pong-gpu 1 --peer-copy   # two GPUs: one copy on arrival
//! zcs_latency --backend cuda --pong-gpu 1 --peer-host   # two GPUs: through host memory
//! ```
//!
//! With `--pong-gpu 1` the pong runs on another GPU than the ping's: its zero-copy row
//! is `zero-copy-peer`, the ping's blocks mapped for the pong's GPU over NVLink or PCIe.
//! Adding `--peer-copy`, the pong's subscriber has `peer_gpus: copy`: each block is
//! copied onto the pong's GPU on arrival and the ready point is that copy's completion
//! (row `peer-copy`); the cpu-bytes rows, the same as without it, are left out. With
//! `--peer-host` instead (`peer_gpus: host`, what a GPU without peer access does), the
//! publisher copies each block into a host block and the pong copies that onto its GPU;
//! the ready point is that second copy's completion (row `host-copy`).
//!
//! With `--spin-us`, every session of ours on both sides has that `spin_us` (the most
//! its subscribers poll before sleeping) instead of the library's default, and the rows
//! of ours are named `…-nospin` (0) or `…-spin` (another value); the `zenoh-plain` row
//! stays plain Zenoh, the anchor of the same run.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::json;
use zcs_bench::latency::{Plan, row};
use zcs_bench::now_ns;
use zcs_memory::cuda::pinned::PinnedPool;
use zcs_memory::cuda::{DeviceBlock, sys};
use zcs_tests::{child_role, free_tcp_port, loopback_zenoh_config, recv_msg, send_msg, spawn_child_bin};
use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};
use zenoh::Wait;
use zenoh_cuda_shm::config::{DeviceChoice, PeerGpus, ProviderMode};
use zenoh_cuda_shm::provider::{GpuSelection, Provider, ProviderClient, ProviderConfig};
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, GpuSubscriber, Path, ZcsConfig};

#[derive(Parser, Debug)]
#[command(about = "zenoh-cuda-shm publish→subscriber-ready latency, ping-pong across two processes (JSON lines)")]
struct Args {
    /// Backend: `cuda` (zero-copy, cpu-bytes and plain rows) or `host` (no GPU:
    /// zero-copy over memfd blocks and the plain row).
    #[arg(long, default_value = "cuda")]
    backend: String,
    #[command(flatten)]
    plan: Plan,
    /// Blocks lent by a host provider in a third process, not allocated by the
    /// publishers (the zero-copy row becomes `zero-copy-provider`).
    #[arg(long)]
    provider: bool,
    /// Blocks lent by the zenohd plugin: the zenohd binary to start (with `--plugin`;
    /// the zero-copy row becomes `zero-copy-zenohd`).
    #[arg(long, requires = "plugin", conflicts_with = "provider")]
    zenohd: Option<std::path::PathBuf>,
    /// The plugin's shared library for `--zenohd`.
    #[arg(long, requires = "zenohd")]
    plugin: Option<std::path::PathBuf>,
    /// `spin_us` of our sessions on both sides: the most subscribers busy-poll before
    /// sleeping (rows `…-nospin` for 0, `…-spin` for another value than the default).
    #[arg(long, default_value_t = ZcsConfig::default().spin_us)]
    spin_us: u64,
    /// The pong's GPU (CUDA): another GPU than the ping's (0) measures the peer path,
    /// blocks mapped over NVLink or PCIe (row `zero-copy-peer`).
    #[arg(long, default_value_t = 0)]
    pong_gpu: usize,
    /// With `--pong-gpu`: the pong copies each block onto its GPU on arrival
    /// (`peer_gpus: copy`, row `peer-copy`); no cpu-bytes or host-block rows.
    #[arg(long, conflicts_with = "peer_host")]
    peer_copy: bool,
    /// With `--pong-gpu`: the pong takes each block through a host block and copies it
    /// onto its GPU, as without peer access (`peer_gpus: host`, row `host-copy`); no
    /// cpu-bytes or host-block rows.
    #[arg(long)]
    peer_host: bool,
}

/// Where the blocks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lender {
    /// Each publisher's own pool.
    Own,
    /// A provider in a child process (the library's `Provider`).
    Process,
    /// The zenohd plugin.
    Zenohd,
}

impl Lender {
    fn row(self) -> &'static str {
        match self {
            Lender::Own => "zero-copy",
            Lender::Process => "zero-copy-provider",
            Lender::Zenohd => "zero-copy-zenohd",
        }
    }
    fn blocks(self) -> &'static str {
        match self {
            Lender::Own => "the publishers' own pools",
            Lender::Process => "lent by a provider process",
            Lender::Zenohd => "lent by the zenohd plugin",
        }
    }
}

/// Starts zenohd with our plugin as the host's provider, listening on `router_port` and
/// connected to the ping's Zenoh endpoint; stdout and stderr go to
/// `zcs_latency-zenohd.log` in the temp directory.
fn start_zenohd(
    zenohd: &std::path::Path,
    plugin: &std::path::Path,
    port: u16,
    router_port: u16,
    cuda: bool,
) -> std::process::Child {
    let log_path = std::env::temp_dir().join("zcs_latency-zenohd.log");
    let log = std::fs::File::create(&log_path).unwrap_or_else(|e| panic!("{}: {e}", log_path.display()));
    let gpus = if cuda { "[0]" } else { "\"none\"" };
    std::process::Command::new(zenohd)
        .args(["--no-multicast-scouting", "-l", &format!("tcp/127.0.0.1:{router_port}")])
        .args(["-e", &format!("tcp/127.0.0.1:{port}")])
        .arg("-P")
        .arg(format!("cuda_shm:{}", plugin.display()))
        .args(["--cfg", &format!("plugins/cuda_shm/provider/gpus:{gpus}")])
        .args(["--cfg", &format!("plugins/cuda_shm/provider/host:{}", !cuda)])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", zenohd.display()))
}

const PREFIX: &str = "zcs-lat";
const ZC_KEY: &str = "zcs-lat/zero-copy";
const CPU_KEY: &str = "zcs-lat/cpu-bytes";
const BASE_KEY: &str = "zcs-lat/plain";
const REPLY_ZC_KEY: &str = "zcs-lat/reply/zero-copy";
const REPLY_CPU_KEY: &str = "zcs-lat/reply/cpu-bytes";
const HB_KEY: &str = "zcs-lat/host-block";
const REPLY_HB_KEY: &str = "zcs-lat/reply/host-block";
const REPLY_BASE_KEY: &str = "zcs-lat/reply/plain";
const PORT_ENV: &str = "ZCS_LAT_PORT";
const SOCK_ENV: &str = "ZCS_LAT_SOCK";
const BACKEND_ENV: &str = "ZCS_LAT_BACKEND";
const PROVIDER_ENV: &str = "ZCS_LAT_PROVIDER";
const SPIN_ENV: &str = "ZCS_LAT_SPIN_US";
const PONG_GPU_ENV: &str = "ZCS_LAT_PONG_GPU";
const PEER_COPY_ENV: &str = "ZCS_LAT_PEER_COPY";
const PEER_HOST_ENV: &str = "ZCS_LAT_PEER_HOST";
/// zenohd's port, which the pong connects to as well: a peer does not relay another
/// node's liveliness tokens, so the pong must see the router's provider itself.
const ROUTER_PORT_ENV: &str = "ZCS_LAT_ROUTER_PORT";
const IO: Duration = Duration::from_secs(60);
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);
/// Zenoh's default `transport/link/rx/max_message_size`: larger messages are dropped.
const ZENOH_MAX_MESSAGE: usize = 1 << 30;

/// Which row a reply belongs to.
const PATH_ZC: u8 = 0;
const PATH_CPU: u8 = 1;
const PATH_BASE: u8 = 2;
const PATH_HB: u8 = 3;

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Ready,
    Stop,
}

/// A reply: the row, the sequence number, and the one-way latency the pong measured.
fn reply_payload(path: u8, seq: u64, one_way_ns: u64) -> Vec<u8> {
    let mut v = vec![path];
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&one_way_ns.to_le_bytes());
    v
}

fn parse_reply(b: &[u8]) -> Option<(u8, u64, u64)> {
    let (&path, rest) = b.split_first()?;
    let word = |i: usize| Some(u64::from_le_bytes(rest.get(i..i + 8)?.try_into().ok()?));
    Some((path, word(0)?, word(8)?))
}

/// `lent`: blocks from the provider process (required); otherwise never from one, so a
/// provider elsewhere on the host cannot change what the rows measure.
fn zcs_config(device: DeviceChoice, lent: bool, spin_us: u64) -> ZcsConfig {
    let provider = if lent { ProviderMode::Required } else { ProviderMode::Off };
    ZcsConfig { device, provider, provider_discovery_ms: 2000, spin_us, ..ZcsConfig::default() }
}

/// A host-memory session of the pong's, on its own Zenoh session; `host_blocks` as
/// given (false: bytes from GPU publishers).
fn open_host_session(port: u16, spin_us: u64, host_blocks: bool) -> GpuSession {
    let z = zenoh::open(loopback_zenoh_config(None, Some(port), Some(PREFIX))).wait().expect("open zenoh");
    let cfg = ZcsConfig { host_blocks, ..zcs_config(DeviceChoice::Host, false, spin_us) };
    GpuSession::from_zenoh(z, cfg).wait().expect("host session")
}

/// The provider process: lends the backend's blocks until killed.
fn provider_process() {
    let port: u16 = std::env::var(PORT_ENV).expect("port").parse().expect("port");
    let cuda = std::env::var(BACKEND_ENV).as_deref() == Ok("cuda");
    let z = zenoh::open(loopback_zenoh_config(None, Some(port), Some(PREFIX))).wait().expect("open zenoh");
    let cfg = ProviderConfig {
        gpus: if cuda { GpuSelection::Ordinals(vec![0]) } else { GpuSelection::None },
        host: !cuda,
        ..ProviderConfig::default()
    };
    let _provider = Provider::start(&cfg, &z).expect("start the provider");
    loop {
        std::thread::park();
    }
}

/// Waits until a provider's token is visible on `z`.
fn wait_provider(z: &zenoh::Session) {
    let boot_id = zcs_memory::host::boot_id().expect("boot id");
    let t = Instant::now();
    while ProviderClient::discover(z, &boot_id, Duration::from_millis(200)).is_none() {
        assert!(t.elapsed() < IO, "the provider process never announced itself");
    }
}

// ---------------------------------------------------------------------------------
// Pong
// ---------------------------------------------------------------------------------

fn pong() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let port: u16 = var(PORT_ENV).parse().expect("port");
    let cuda = var(BACKEND_ENV) == "cuda";
    let lent = std::env::var_os(PROVIDER_ENV).is_some();
    let spin_us: u64 = var(SPIN_ENV).parse().expect("spin");
    let conn = ControlConn::connect(&SocketName::from_key_chunk(&var(SOCK_ENV)).expect("socket"), IO).expect("ctl");
    let mut cfg = loopback_zenoh_config(None, Some(port), Some(PREFIX));
    if let Ok(router) = std::env::var(ROUTER_PORT_ENV) {
        cfg.insert_json5("connect/endpoints", &format!("[\"tcp/127.0.0.1:{port}\", \"tcp/127.0.0.1:{router}\"]"))
            .expect("connect endpoints");
    }
    let z = zenoh::open(cfg).wait().expect("open zenoh");
    let gpu_ordinal: usize = var(PONG_GPU_ENV).parse().expect("pong GPU");
    let cfg = zcs_config(if cuda { DeviceChoice::Cuda } else { DeviceChoice::Host }, lent, spin_us);
    let session =
        GpuSession::from_zenoh(z.clone(), ZcsConfig { gpu_ordinal, ..cfg }).wait().expect("open the pong session");
    let reply_base = Arc::new(z.declare_publisher(REPLY_BASE_KEY).wait().expect("reply publisher"));
    let reply_zc = Arc::new(session.declare_publisher(REPLY_ZC_KEY).wait().expect("zero-copy reply publisher"));

    // Zero-copy path: read on our stream, synchronise (the ready-signal wait passed, or
    // with `--peer-copy` the copy onto this GPU completed).
    let (peer_copy, peer_host) = (std::env::var_os(PEER_COPY_ENV).is_some(), std::env::var_os(PEER_HOST_ENV).is_some());
    let zc = session.declare_subscriber(ZC_KEY);
    let zc = match (peer_copy, peer_host) {
        (true, _) => zc.peer_gpus(PeerGpus::Copy),
        (_, true) => zc.peer_gpus(PeerGpus::Host),
        _ => zc,
    };
    let zc = zc.wait().expect("zero-copy subscriber");
    let r = Arc::clone(&reply_zc);
    let gpu = session.gpu().cloned();
    std::thread::Builder::new()
        .name("pong-zc".into())
        .spawn(move || {
            let stream = gpu.as_ref().map(|g| g.new_stream().expect("stream"));
            while let Ok(s) = zc.recv() {
                // A row must measure the path it is named after.
                assert!(!peer_copy || s.path() == Path::PeerCopy, "peer-copy row, {} sample", s.path());
                assert!(!peer_host || s.path() == Path::HostCopy, "host-copy row, {} sample", s.path());
                match (&gpu, &stream) {
                    (Some(gpu), Some(stream)) => {
                        let read = s.read(stream).expect("read");
                        gpu.bind().expect("bind");
                        // SAFETY: a stream of the current context, owned by this thread.
                        unsafe { sys::stream_synchronize(stream.cu_stream()) }.expect("synchronize");
                        read.end().expect("end");
                    }
                    _ => {
                        let b = s.host_bytes().expect("host sample");
                        black_box((b.first(), b.last()));
                    }
                }
                let one_way = now_ns().saturating_sub(s.info().timestamp_ns);
                r.put_bytes(&reply_payload(PATH_ZC, s.seq(), one_way)).expect("reply");
                drop(s);
            }
        })
        .expect("spawn");

    // CPU-bytes path: a host-memory session (another locality group) gets bytes; they
    // go host→device into a reused buffer on our stream. `GpuSample::read` cannot do
    // this copy here: a `device: host` session has no GPU (it returns NoGpu).
    let host_session = if cuda {
        let gpu = session.gpu().cloned().expect("CUDA session");
        let host = open_host_session(port, spin_us, false);
        let cpu = host.declare_subscriber(CPU_KEY).wait().expect("cpu-bytes subscriber");
        let r = Arc::new(host.declare_publisher(REPLY_CPU_KEY).wait().expect("cpu-bytes reply publisher"));
        let r2 = Arc::clone(&r);
        std::thread::Builder::new()
            .name("pong-cpu".into())
            .spawn(move || {
                let stream = gpu.new_stream().expect("stream");
                let mut staging: Option<DeviceBlock> = None;
                while let Ok(s) = cpu.recv() {
                    let b = s.host_bytes().expect("bytes sample");
                    if staging.as_ref().is_none_or(|d| d.size() < b.len()) {
                        staging = Some(DeviceBlock::allocate(&gpu, b.len().max(1)).expect("staging block"));
                    }
                    let dst = staging.as_ref().expect("staging").device_ptr();
                    gpu.bind().expect("bind");
                    // SAFETY: `dst` has ≥ len bytes (allocated above); pageable `b` is
                    // staged by the driver before the call returns, and lives until the
                    // synchronize anyway.
                    unsafe { sys::memcpy_htod_async(dst, b.as_ptr(), b.len(), stream.cu_stream()) }.expect("H2D");
                    // SAFETY: a stream of the current context, owned by this thread.
                    unsafe { sys::stream_synchronize(stream.cu_stream()) }.expect("synchronize");
                    let one_way = now_ns().saturating_sub(s.info().timestamp_ns);
                    r2.put_bytes(&reply_payload(PATH_CPU, s.seq(), one_way)).expect("reply");
                }
            })
            .expect("spawn");
        Some((host, r))
    } else {
        None
    };

    // Host-block path: a CPU consumer reads the publisher's host copy in place.
    let host_block_session = if cuda {
        let host = open_host_session(port, spin_us, true);
        let hb = host.declare_subscriber(HB_KEY).wait().expect("host-block subscriber");
        let r = Arc::new(host.declare_publisher(REPLY_HB_KEY).wait().expect("host-block reply publisher"));
        let r2 = Arc::clone(&r);
        std::thread::Builder::new()
            .name("pong-hb".into())
            .spawn(move || {
                while let Ok(s) = hb.recv() {
                    assert_eq!(s.path(), Path::HostBlock, "host-block row, {} sample", s.path());
                    let b = s.host_bytes().expect("host sample");
                    black_box((b.first(), b.last()));
                    let one_way = now_ns().saturating_sub(s.info().timestamp_ns);
                    r2.put_bytes(&reply_payload(PATH_HB, s.seq(), one_way)).expect("reply");
                }
            })
            .expect("spawn");
        Some((host, r))
    } else {
        None
    };

    // Plain baseline: reply from the Zenoh callback. The payload starts with the
    // sequence number and the ping's clock.
    let r = Arc::clone(&reply_base);
    let _base = z
        .declare_subscriber(BASE_KEY)
        .callback(move |s| {
            let received = now_ns();
            let b = s.payload().to_bytes();
            let word = |i: usize| b.get(i..i + 8).and_then(|w| w.try_into().ok()).map(u64::from_le_bytes);
            if let (Some(seq), Some(sent)) = (word(0), word(8)) {
                r.put(reply_payload(PATH_BASE, seq, received.saturating_sub(sent))).wait().expect("reply");
            }
        })
        .wait()
        .expect("plain subscriber");

    let t = Instant::now();
    while !reply_base.matching_status().wait().expect("matching").matching() {
        assert!(t.elapsed() < IO, "pong: the ping's reply subscriber never matched");
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_route(&reply_zc, 1, 1);
    // These reply publishers are in host memory: the ping's CUDA subscriber links to
    // them (`host-copy`), and the small replies go inline over that link.
    for (_, r) in host_session.iter().chain(&host_block_session) {
        wait_route(r, 1, 1);
    }
    send_msg(&conn, &Msg::Ready, &[]);
    let (m, _) = recv_msg::<Msg>(&conn, Duration::MAX);
    assert!(matches!(m, Msg::Stop), "pong: unexpected {m:?}");
    // Receive threads block in recv; leave without tearing anything down.
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------
// Ping
// ---------------------------------------------------------------------------------

/// Where a row's replies arrive: our subscriber (zero-copy and cpu-bytes rows) or a
/// plain Zenoh one.
enum Replies {
    Ours(GpuSubscriber<flume::Receiver<GpuSample>>),
    Plain(zenoh::pubsub::Subscriber<zenoh::handlers::FifoChannelHandler<zenoh::sample::Sample>>),
}

impl Replies {
    fn recv_timeout(&self, timeout: Duration) -> Option<Vec<u8>> {
        match self {
            Self::Ours(s) => s.recv_timeout(timeout).ok().map(|s| s.to_vec().expect("reply bytes")),
            Self::Plain(s) => s.recv_timeout(timeout).expect("reply channel").map(|s| s.payload().to_bytes().to_vec()),
        }
    }
}

/// Waits for the reply to `seq`; returns the one-way latency the pong measured (µs).
fn wait_reply(replies: &Replies, path: u8, seq: u64) -> f64 {
    let t = Instant::now();
    loop {
        let left = REPLY_TIMEOUT.saturating_sub(t.elapsed());
        let b = replies
            .recv_timeout(left)
            .unwrap_or_else(|| panic!("no reply to path {path} seq {seq} within {REPLY_TIMEOUT:?}"));
        match parse_reply(&b) {
            Some((p, s, one_way_ns)) if (p, s) == (path, seq) => return one_way_ns as f64 / 1e3,
            // A late reply from an earlier round: ignore it.
            _ => {}
        }
    }
}

/// Waits until `p` serves exactly `zero_copy` subscribers in place and, if `aware`,
/// one GPU-aware subscriber by bytes, with nobody on the plain key.
fn wait_route(p: &GpuPublisher, zero_copy: usize, aware: usize) {
    let t = Instant::now();
    let mut quiet = Instant::now();
    loop {
        let ok = p.zero_copy_subscribers() == zero_copy && p.aware_subscribers() == aware;
        if !ok || p.plain_subscribers() {
            quiet = Instant::now();
        } else if quiet.elapsed() >= Duration::from_millis(200) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{}: route not ready (zero-copy {} aware {} plain {})",
            p.key(),
            p.zero_copy_subscribers(),
            p.aware_subscribers(),
            p.plain_subscribers()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One block round trip on `p`: waits for the previous block (and its host copy) to
/// come back (so warm blocks are reused), loans, then times put → reply.
fn block_round(p: &GpuPublisher, replies: &Replies, path: u8, size: usize) -> (Duration, f64) {
    let t = Instant::now();
    while p.pool_stats().blocks_in_use > 0 || p.host_pool_stats().is_some_and(|h| h.blocks_in_use > 0) {
        assert!(t.elapsed() < REPLY_TIMEOUT, "{}: the previous block never came back", p.key());
        std::thread::sleep(Duration::from_micros(10));
    }
    let loan = p.loan(size).expect("loan");
    let t = Instant::now();
    let r = p.put(loan).expect("put");
    let one_way = wait_reply(replies, path, r.seq);
    (t.elapsed(), one_way)
}

fn main() {
    match child_role().as_deref() {
        Some("pong") => return pong(),
        Some("provider") => return provider_process(),
        _ => {}
    }
    let args = Args::parse();
    let cuda = match args.backend.as_str() {
        "cuda" => true,
        "host" => false,
        other => panic!("unknown backend {other:?} (cuda or host)"),
    };
    let port = free_tcp_port();
    let z = zenoh::open(loopback_zenoh_config(Some(port), None, Some(PREFIX))).wait().expect("open zenoh");
    let lender = match (&args.zenohd, args.provider) {
        (Some(_), _) => Lender::Zenohd,
        (None, true) => Lender::Process,
        (None, false) => Lender::Own,
    };
    let router_port = args.zenohd.is_some().then(free_tcp_port);
    let provider = match (&args.zenohd, &args.plugin, router_port) {
        (Some(zenohd), Some(plugin), Some(router_port)) => Some(start_zenohd(zenohd, plugin, port, router_port, cuda)),
        _ if args.provider => {
            Some(spawn_child_bin("provider", &[(PORT_ENV, port.to_string()), (BACKEND_ENV, args.backend.clone())]))
        }
        _ => None,
    }
    .map(KillOnDrop);
    if provider.is_some() {
        wait_provider(&z);
    }
    let lent = lender != Lender::Own;
    let device = if cuda { DeviceChoice::Cuda } else { DeviceChoice::Host };
    let session = GpuSession::from_zenoh(z, zcs_config(device, lent, args.spin_us))
        .wait()
        .unwrap_or_else(|e| panic!("--backend {}: {e}", args.backend));
    let backend = session.backend().to_string();
    let z = session.zenoh();
    let replies_zc = Replies::Ours(session.declare_subscriber(REPLY_ZC_KEY).wait().expect("reply subscriber"));
    let replies_cpu =
        Replies::Ours(session.declare_subscriber(REPLY_CPU_KEY).wait().expect("cpu-bytes reply subscriber"));
    let replies_base = Replies::Plain(z.declare_subscriber(REPLY_BASE_KEY).wait().expect("reply subscriber"));
    let zc_pub = session.declare_publisher(ZC_KEY).wait().expect("zero-copy publisher");
    let cpu_pub = cuda.then(|| session.declare_publisher(CPU_KEY).wait().expect("cpu-bytes publisher"));
    let hb_pub = cuda.then(|| session.declare_publisher(HB_KEY).wait().expect("host-block publisher"));
    let replies_hb =
        Replies::Ours(session.declare_subscriber(REPLY_HB_KEY).wait().expect("host-block reply subscriber"));
    let base_pub = z.declare_publisher(BASE_KEY).wait().expect("plain publisher");

    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).expect("bind");
    let mut env = vec![
        (PORT_ENV, port.to_string()),
        (SOCK_ENV, name.to_key_chunk()),
        (BACKEND_ENV, args.backend.clone()),
        (SPIN_ENV, args.spin_us.to_string()),
        (PONG_GPU_ENV, args.pong_gpu.to_string()),
    ];
    assert!(!args.peer_copy || args.pong_gpu != 0, "--peer-copy needs --pong-gpu on another GPU");
    assert!(!args.peer_host || args.pong_gpu != 0, "--peer-host needs --pong-gpu on another GPU");
    if args.peer_copy {
        env.push((PEER_COPY_ENV, "1".to_owned()));
    }
    if args.peer_host {
        env.push((PEER_HOST_ENV, "1".to_owned()));
    }
    if lent {
        env.push((PROVIDER_ENV, "1".to_owned()));
    }
    if let Some(p) = router_port {
        env.push((ROUTER_PORT_ENV, p.to_string()));
    }
    let child = spawn_child_bin("pong", &env);
    let conn = listener.accept_timeout(IO).expect("pong connects");
    let (m, _) = recv_msg::<Msg>(&conn, IO);
    assert!(matches!(m, Msg::Ready), "unexpected {m:?}");
    wait_route(&zc_pub, 1, 1);
    if let Some(p) = &cpu_pub {
        wait_route(p, 0, 1);
    }
    if let Some(p) = &hb_pub {
        wait_route(p, 1, 1);
    }
    let t = Instant::now();
    while !base_pub.matching_status().wait().expect("matching").matching() {
        assert!(t.elapsed() < IO, "the pong's plain subscriber never matched");
        std::thread::sleep(Duration::from_millis(5));
    }

    let blocks = lender.blocks();
    let mut setup = json!({"bench": "latency-setup", "backend": backend, "iters": args.plan.iters, "warmup": args.plan.warmup,
        "max_secs_per_row": args.plan.max_secs, "transport": "zenoh peer, tcp 127.0.0.1, congestion control block",
        "blocks": blocks, "spin_us": args.spin_us, "pong_gpu": args.pong_gpu});
    if let (Some(g), Some(o)) = (session.gpu(), setup.as_object_mut()) {
        o.insert("gpu".into(), json!(g.name()));
        o.insert("uuid".into(), json!(g.uuid().to_string()));
    }
    println!("{setup}");

    let spin = match args.spin_us {
        0 => "-nospin",
        s if s == ZcsConfig::default().spin_us => "",
        _ => "-spin",
    };
    let ready = if cuda { "read on the pong's stream, then stream synchronized" } else { "host bytes mapped" };
    for &size in &args.plan.sizes {
        let before = zc_pub.stats().copies_out;
        let rtt = args.plan.rounds(|| block_round(&zc_pub, &replies_zc, PATH_ZC, size));
        let copies = zc_pub.stats().copies_out - before;
        let path = match (args.peer_copy || args.peer_host, args.pong_gpu != 0) {
            (true, _) if args.peer_host => format!("host-copy{spin}"),
            (true, _) => format!("peer-copy{spin}"),
            (false, true) => format!("{}-peer{spin}", lender.row()),
            (false, false) => format!("{}{spin}", lender.row()),
        };
        row(&path, &backend, size, &rtt, json!({"ready": ready, "copies_out_with_warmup": copies, "blocks": blocks}));
    }
    let peer_mode = args.peer_copy || args.peer_host;
    if let Some(p) = cpu_pub.as_ref().filter(|_| !peer_mode) {
        for &size in &args.plan.sizes {
            if size >= ZENOH_MAX_MESSAGE {
                // Zenoh drops a message above its receive limit: no reply would come.
                println!(
                    "{}",
                    json!({"bench": "latency", "path": format!("cpu-bytes{spin}"), "backend": &backend, "size": size,
                           "skipped": "payload at or above Zenoh's default max_message_size (1 GiB)"})
                );
                continue;
            }
            let before = p.stats().copies_out;
            let rtt = args.plan.rounds(|| block_round(p, &replies_cpu, PATH_CPU, size));
            let copies = p.stats().copies_out - before;
            row(
                &format!("cpu-bytes{spin}"),
                &backend,
                size,
                &rtt,
                json!({"ready": "D2H by the publisher, bytes over zenoh, H2D on the pong's stream, synchronized",
                       "copies_out_with_warmup": copies}),
            );
        }
    }
    if let (Some(p), Some(gpu)) = (hb_pub.as_ref().filter(|_| !peer_mode), session.gpu()) {
        let staging = PinnedPool::new(gpu, 2 << 30);
        let stream = gpu.new_stream().expect("stream");
        for &size in &args.plan.sizes {
            let before = p.stats().host_blocks;
            let rtt = args.plan.rounds(|| block_round(p, &replies_hb, PATH_HB, size));
            let copies = p.stats().host_blocks - before;
            row(
                &format!("host-block{spin}"),
                &backend,
                size,
                &rtt,
                json!({"ready": "D2H by the publisher into a shared host block, read in place by a CPU process",
                       "host_blocks_with_warmup": copies}),
            );
            // The reference: one pinned copy of the same size, launch to synchronize.
            let block = DeviceBlock::allocate(gpu, size).expect("device block");
            let rtt = args.plan.rounds(|| {
                let t = Instant::now();
                // SAFETY: `block` holds ≥ size bytes, mapped and unchanged during the copy.
                let buf = unsafe { staging.copy_from_device(block.device_ptr(), size, &stream) }.expect("D2H");
                let took = t.elapsed();
                drop(buf);
                (took * 2, took.as_secs_f64() * 1e6)
            });
            row("d2h-pinned", &backend, size, &rtt, json!({"ready": "one D2H copy into pinned memory, synchronized"}));
        }
    }
    let mut seq = 0u64;
    let payload_size = 64;
    let rtt = args.plan.rounds(|| {
        seq += 1;
        let mut payload = vec![0u8; payload_size];
        payload[..8].copy_from_slice(&seq.to_le_bytes());
        let t = Instant::now();
        payload[8..16].copy_from_slice(&now_ns().to_le_bytes());
        base_pub.put(payload).wait().expect("plain put");
        let one_way = wait_reply(&replies_base, PATH_BASE, seq);
        (t.elapsed(), one_way)
    });
    row("zenoh-plain", "none", payload_size, &rtt, json!({"ready": "received"}));

    send_msg(&conn, &Msg::Stop, &[]);
    zcs_tests::wait_child(child, "pong", IO);
    drop(provider);
}

/// The provider process (zenohd or a child of ours), killed and reaped when dropped, so
/// that a run stopped by a panic leaves no lender behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
