//! Zenoh's own shared memory with user copies: how a user moves a GPU buffer to
//! another process with Zenoh's POSIX SHM transport instead of ours.
//!
//! The publisher (this process) allocates each payload from a Zenoh `ShmProvider`
//! (POSIX backend, the default talc allocator), copies the GPU buffer device→host into
//! it and puts it. Zenoh hands an SHM payload to a subscriber on the same host by
//! reference: a descriptor goes over the socket, the bytes stay in the segment, which
//! the subscriber maps. The subscriber copies the bytes host→device on its own stream
//! and synchronises. Both processes enable `transport/shared_memory` (and turn off its
//! implicit copying of large ordinary payloads into SHM, so only the buffers allocated
//! here travel that way); every payload a subscriber receives must be an SHM buffer
//! (`ZBytes::as_shm`), and the run panics if one is not — that would mean Zenoh fell
//! back to sending the bytes through the socket.
//!
//! With CUDA, each process registers the SHM segment it uses with the driver
//! (`cuMemHostRegister`, whole mapping, once), so the device→host and host→device
//! copies are pinned copies; `--pageable` leaves the segments unregistered (paths gain
//! `-pageable`). Rows carry `pub_host_registered` and `sub_host_registered`.
//!
//! Rows (one JSON object per line, the formats of `zcs_latency` and `zcs_throughput`,
//! so `zcs_report` puts them next to those):
//! - `zenoh-shm-setup`: the run's settings.
//! - `latency` / `zenoh-shm`: ping-pong as in `zcs_latency`. The ping allocates the
//!   SHM buffer (untimed, like a loan), then times D2H into it → put → the pong's H2D
//!   into a reused device buffer and synchronize → the pong's reply, itself a small
//!   SHM buffer. RTT/2 and the pong-measured one way from the moment the ping started
//!   its copy. A size the SHM pool cannot hold gets a `skipped` row with the reason.
//! - `throughput` / `zenoh-shm-user-copies`: as `zcs_throughput`'s `zenoh-pinned`
//!   path, with the pinned staging buffer replaced by a Zenoh SHM buffer: fill kernel
//!   into a device frame, D2H into an SHM buffer from a pool of `--pool-frames`
//!   frames (fewer if the host cannot hold them: the row's `pool_frames`; allocation
//!   waits while subscribers hold them all), put; each subscriber copies H2D into a
//!   reused device buffer, runs `Kernels::check` and synchronises.
//!
//! `--shm-out` puts our publisher in the user's place: a `GpuPublisher` of a session
//! with `zenoh_shm_out_bytes` (its segment registered with CUDA), on the same Zenoh
//! session. Each round or frame is a loan (filled by the fill kernel in the throughput
//! rows) and a put; the publisher makes the device→host copy into Zenoh SHM itself for
//! the plain subscribers, which are the same processes as above (they read the sequence
//! number and publication time from our attachment). Paths: `zenoh-shm-out`.
//!
//! `--backend host` needs no GPU: a `memcpy` stands in for each CUDA copy and the
//! frames are checked on the CPU.
//!
//! Built only with the `zenoh-shm` feature (Zenoh's `shared-memory`), in a cargo
//! invocation of its own, so no other binary of the workspace gets Zenoh's SHM:
//!
//! ```text
//! cargo build --profile gpu -p zcs-bench --features zenoh-shm --bin zcs_zenoh_shm
//! zcs_zenoh_shm --backend cuda                     # H100/H200: every row
//! zcs_zenoh_shm --backend cuda --shm-out           # the same rows, our publisher copying out
//! zcs_zenoh_shm --backend host --sizes 4KiB,1MiB --iters 20 --frame-sizes 64KiB --subscribers 1 --frames 20
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::json;
use zcs_bench::check::Checker;
use zcs_bench::frames::{CHILD_LIMIT, DRAIN_IDLE, FRAME_4K_RGBA, FRAME_1080P_RGB, ROUTE_TIMEOUT, SUB_FIFO};
use zcs_bench::latency::{Plan, Samples, row};
use zcs_bench::{cpu_secs, fill_loan, loan_waiting, now_ns, parse_any_stamp, stamp};
use zcs_memory::cuda::kernels::fill_pattern;
use zcs_memory::cuda::pinned::HostRegistration;
use zcs_memory::cuda::{DeviceBlock, Gpu, Kernels, Stream, sys};
use zcs_memory::host::{Mapping, mapping_of};
use zcs_tests::{
    child_role, free_tcp_port, loopback_shm_zenoh_config, parse_size, percentile, recv_msg, send_msg, spawn_child_bin,
    wait_child, watchdog_guard,
};
use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};
use zenoh::Wait;
use zenoh::shm::{
    AllocAlignment, GarbageCollect, PosixShmProviderBackend, ShmProvider, ShmProviderBuilder, ZAllocError,
    ZLayoutAllocError, ZShmMut,
};
use zenoh_cuda_shm::config::{DeviceChoice, ProviderMode};
use zenoh_cuda_shm::{GpuPublisher, GpuSession, ZcsConfig};

#[derive(Parser, Debug)]
#[command(about = "Zenoh's own POSIX shared memory with user D2H/H2D copies: latency and throughput rows (JSON lines)")]
struct Args {
    /// Backend: `cuda` (copies between the GPU and the SHM buffers) or `host` (no GPU:
    /// memcpy stands in for the copies).
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Which rows: `latency`, `throughput`.
    #[arg(long, value_delimiter = ',', default_value = "latency,throughput")]
    rows: Vec<String>,
    #[command(flatten)]
    plan: Plan,
    /// Throughput frame sizes. Default: 1080p RGB and 4K RGBA (cuda), 64KiB,1MiB (host).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    frame_sizes: Option<Vec<usize>>,
    /// Subscriber process counts of the throughput rows.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    subscribers: Vec<usize>,
    /// Timed frames per throughput row (fewer if the row reaches --frame-max-secs).
    #[arg(long, default_value_t = 2000)]
    frames: u64,
    /// Untimed frames first.
    #[arg(long, default_value_t = 20)]
    frame_warmup: u64,
    /// Time budget of the timed frames of one throughput row, in seconds.
    #[arg(long, default_value_t = 5.0)]
    frame_max_secs: f64,
    /// Frames the publisher's SHM pool holds in the throughput rows (`zcs_throughput`
    /// caps its pools at 32 blocks): allocation waits once they are all out.
    #[arg(long, default_value_t = 32)]
    pool_frames: usize,
    /// Leave the SHM segments unregistered with CUDA (pageable copies).
    #[arg(long, conflicts_with = "shm_out")]
    pageable: bool,
    /// Our publisher copies out into Zenoh SHM (`zenoh_shm_out_bytes`) instead of the
    /// user (rows `zenoh-shm-out`).
    #[arg(long)]
    shm_out: bool,
}

const PREFIX: &str = "zcs-zshm";
const LAT_KEY: &str = "zcs-zshm/lat";
const REPLY_KEY: &str = "zcs-zshm/lat/reply";
const PORT_ENV: &str = "ZCS_ZSHM_PORT";
const SOCK_ENV: &str = "ZCS_ZSHM_SOCK";
const BACKEND_ENV: &str = "ZCS_ZSHM_BACKEND";
const PAGEABLE_ENV: &str = "ZCS_ZSHM_PAGEABLE";
const KEY_ENV: &str = "ZCS_ZSHM_KEY";
const WARMUP_ENV: &str = "ZCS_ZSHM_WARMUP";
const IO: Duration = Duration::from_secs(60);
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);
/// SHM chunks are page-aligned (2^12): copies start on a page boundary.
const CHUNK_ALIGN_POW: u8 = 12;
const PAGE: usize = 1 << CHUNK_ALIGN_POW;
/// The pong's pool for its replies.
const REPLY_POOL: usize = 1 << 20;
/// A reply: seq, the one way the pong measured (ns), payload was SHM, payload was in a
/// range registered with CUDA.
const REPLY_LEN: usize = 18;

/// Control messages between the ping/publisher and its child processes.
#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    /// Child → parent: subscribed, reply publisher matched (pong).
    Ready,
    /// Parent → pong: done.
    Stop,
    /// Parent → subscriber: this many frames were published in all.
    Done { sent: u64 },
    /// Subscriber → parent: what it saw.
    Report(SubReport),
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
    /// Payloads that arrived as SHM buffers, and those that did not.
    shm: u64,
    not_shm: u64,
    /// Payloads read from a segment registered with CUDA.
    registered: u64,
}

/// Peer on loopback TCP as every benchmark here, with Zenoh's SHM transport on and its
/// implicit copying of large ordinary payloads into SHM off.
fn zenoh_config(listen: Option<u16>, connect: Option<u16>) -> zenoh::Config {
    loopback_shm_zenoh_config(listen, connect, Some(PREFIX))
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

// ---------------------------------------------------------------------------------
// SHM segments: the publisher's pool and the registrations with CUDA
// ---------------------------------------------------------------------------------

/// The Zenoh SHM segment mappings this process has seen payloads in, each registered
/// with CUDA (whole mapping, once) when there is a GPU to register them with. Without
/// one (`--backend host`, `--pageable`) the lookup still runs, so a host run checks it.
struct Segments {
    gpu: Option<Gpu>,
    /// `(start, len)` of every mapping seen.
    mappings: Vec<(usize, usize)>,
    regs: Vec<HostRegistration>,
}

impl Segments {
    fn new(gpu: Option<&Gpu>) -> Self {
        Self { gpu: gpu.cloned(), mappings: Vec::new(), regs: Vec::new() }
    }

    fn seen(&self, bytes: &[u8]) -> bool {
        let (p, end) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
        self.mappings.iter().any(|&(start, len)| p >= start && end <= start + len)
    }

    /// Whether `bytes` lies in a segment registered with CUDA.
    fn registered(&self, bytes: &[u8]) -> bool {
        self.regs.iter().any(|r| r.contains(bytes.as_ptr(), bytes.len()))
    }

    /// Finds the Zenoh SHM segment mapping that holds `bytes` (unless seen before) and
    /// registers it with CUDA if this value has a GPU.
    ///
    /// # Safety
    /// With a GPU: that mapping stays mapped as long as this value lives.
    unsafe fn note(&mut self, bytes: &[u8]) {
        if self.seen(bytes) {
            return;
        }
        let Mapping { start, len, path } =
            mapping_of(bytes.as_ptr()).expect("/proc/self/maps").expect("an SHM payload outside every mapping");
        assert!(
            path.starts_with("/dev/shm/") && path.ends_with(".zenoh"),
            "the payload's mapping is {path:?}, not a Zenoh SHM segment (/dev/shm/*.zenoh)"
        );
        self.mappings.push((start, len));
        assert!(self.seen(bytes), "the mapping does not hold the whole payload");
        let Some(gpu) = &self.gpu else { return };
        // SAFETY: `start..start+len` is one whole mapping, not seen before, so it
        // overlaps no earlier registration (mappings do not overlap); the caller keeps
        // it mapped while `self`, which owns the registration, lives; every copy into or
        // out of it is synchronised right after it is queued (`Source::copy_into`,
        // `Upload::copy`, `Checker::host`).
        let reg = unsafe { HostRegistration::new(gpu, start as *mut u8, len) }
            .unwrap_or_else(|e| panic!("registering the SHM segment {path} ({len} bytes) with CUDA: {e}"));
        self.regs.push(reg);
    }
}

/// A Zenoh SHM provider (POSIX backend) and, with CUDA, the registration of its
/// segment. Fields drop top to bottom: unregister, then the provider (the segment is
/// unmapped once the last buffer allocated from it is gone too).
struct ShmPool {
    segments: Segments,
    provider: ShmProvider<PosixShmProviderBackend>,
    bytes: usize,
}

impl ShmPool {
    /// A pool of `bytes` (rounded up to a page), registered with `gpu` if given.
    fn new(bytes: usize, gpu: Option<&Gpu>) -> Result<Self, String> {
        let bytes = round_up(bytes.max(PAGE), PAGE);
        let align = AllocAlignment::new(CHUNK_ALIGN_POW).map_err(|e| e.to_string())?;
        let backend = PosixShmProviderBackend::builder((bytes, align))
            .wait()
            .map_err(|e| format!("Zenoh POSIX SHM segment of {bytes} bytes: {e}"))?;
        let provider = ShmProviderBuilder::backend(backend).wait();
        let mut pool = Self { segments: Segments::new(gpu), provider, bytes };
        let probe = pool.alloc(1);
        // SAFETY: the probe lies in the provider's segment, which the provider keeps
        // mapped while it lives; `segments` is dropped before `provider` (field order),
        // so the segment stays mapped as long as the registration.
        unsafe { pool.segments.note(&probe[..]) };
        Ok(pool)
    }

    /// A buffer of `len` bytes; while the pool is full, collects the buffers every
    /// receiver has dropped and tries again (panics after `IO`).
    fn alloc(&self, len: usize) -> ZShmMut {
        let t = Instant::now();
        loop {
            match self.provider.alloc(len).with_policy::<GarbageCollect>().wait() {
                Ok(b) => return b,
                Err(ZLayoutAllocError::Alloc(ZAllocError::OutOfMemory | ZAllocError::NeedDefragment))
                    if t.elapsed() < IO =>
                {
                    std::thread::sleep(Duration::from_micros(20))
                }
                Err(e) => panic!("SHM allocation of {len} bytes from a {}-byte pool: {e:?}", self.bytes),
            }
        }
    }

    fn registered(&self) -> bool {
        self.segments.gpu.is_some()
    }
}

/// The user's GPU buffer on the publishing side, and the copy out of it into SHM.
enum Source {
    Cuda { gpu: Gpu, kernels: Kernels, stream: Stream, frame: DeviceBlock },
    Host(Vec<u8>),
}

impl Source {
    fn new(gpu: Option<&Gpu>, size: usize) -> Self {
        match gpu {
            Some(g) => Source::Cuda {
                gpu: g.clone(),
                kernels: Kernels::load(g).expect("kernels"),
                stream: g.new_stream().expect("stream"),
                frame: DeviceBlock::allocate(g, size.max(1)).expect("device buffer"),
            },
            None => Source::Host(vec![0u8; size]),
        }
    }

    /// Writes `seq`'s pattern into the first `len` bytes of the buffer (fill kernel, or
    /// on the CPU).
    fn fill(&mut self, len: usize, seq: u64) {
        match self {
            Source::Cuda { kernels, stream, frame, .. } => {
                // SAFETY: the frame has ≥ len bytes and lives as long as `self`; every copy
                // out of it is synchronised (`copy_into`) before the next fill.
                unsafe { kernels.fill(stream, frame.device_ptr(), len as u64, seq) }.expect("fill")
            }
            Source::Host(v) => fill_pattern(&mut v[..len], 0, seq),
        }
    }

    /// Copies the first `buf.len()` bytes device→host into `buf` and waits for the copy
    /// (or memcpy without a GPU).
    fn copy_into(&self, buf: &mut ZShmMut) {
        let len = buf.len();
        match self {
            Source::Cuda { gpu, stream, frame, .. } => {
                gpu.bind().expect("bind");
                // SAFETY: the frame holds ≥ len bytes, written by work ordered before on
                // `stream` and unchanged until the synchronize; `buf` is an exclusively
                // owned SHM buffer of len bytes that lives until after the synchronize.
                unsafe { sys::memcpy_dtoh_async(buf.as_mut_ptr(), frame.device_ptr(), len, stream.cu_stream()) }
                    .expect("D2H into SHM");
                // SAFETY: a stream of the current context.
                unsafe { sys::stream_synchronize(stream.cu_stream()) }.expect("synchronize");
            }
            Source::Host(v) => buf.copy_from_slice(&v[..len]),
        }
    }
}

/// The pong's "ready": host→device into a reused device buffer on its stream, then a
/// synchronize; or a memcpy into a reused host buffer without a GPU.
enum Upload {
    Cuda { gpu: Gpu, stream: Stream, staging: Option<DeviceBlock> },
    Host(Vec<u8>),
}

impl Upload {
    fn new(gpu: Option<&Gpu>) -> Self {
        match gpu {
            Some(g) => Upload::Cuda { gpu: g.clone(), stream: g.new_stream().expect("stream"), staging: None },
            None => Upload::Host(Vec::new()),
        }
    }

    fn copy(&mut self, bytes: &[u8]) {
        match self {
            Upload::Cuda { gpu, stream, staging } => {
                if staging.as_ref().is_none_or(|d| d.size() < bytes.len()) {
                    *staging = Some(DeviceBlock::allocate(gpu, bytes.len().max(1)).expect("staging block"));
                }
                let dst = staging.as_ref().expect("staging").device_ptr();
                gpu.bind().expect("bind");
                // SAFETY: `dst` has ≥ len bytes (allocated above); `bytes` is borrowed for
                // this whole call, which synchronises the stream before returning.
                unsafe { sys::memcpy_htod_async(dst, bytes.as_ptr(), bytes.len(), stream.cu_stream()) }.expect("H2D");
                // SAFETY: a stream of the current context, owned by this thread.
                unsafe { sys::stream_synchronize(stream.cu_stream()) }.expect("synchronize");
            }
            Upload::Host(v) => {
                v.clear();
                v.extend_from_slice(bytes);
                std::hint::black_box((v.first(), v.last()));
            }
        }
    }
}

/// What a child process reads from its environment.
struct ChildEnv {
    conn: ControlConn,
    port: u16,
    cuda: bool,
    pageable: bool,
}

impl ChildEnv {
    fn read() -> Self {
        let sock = SocketName::from_key_chunk(&var(SOCK_ENV)).expect("socket");
        Self {
            conn: ControlConn::connect(&sock, IO).expect("connect to the parent"),
            port: var(PORT_ENV).parse().expect("port"),
            cuda: var(BACKEND_ENV) == "cuda",
            pageable: std::env::var_os(PAGEABLE_ENV).is_some(),
        }
    }

    fn gpu(&self) -> Option<Gpu> {
        self.cuda.then(|| Gpu::probe().expect("GPU for the H2D copies"))
    }

    fn zenoh(&self) -> zenoh::Session {
        zenoh::open(zenoh_config(None, Some(self.port))).wait().expect("open zenoh")
    }
}

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"))
}

/// The payload of `s` and whether it arrived as an SHM buffer.
fn payload(s: &zenoh::sample::Sample) -> (std::borrow::Cow<'_, [u8]>, bool) {
    (s.payload().to_bytes(), s.payload().as_shm().is_some())
}

// ---------------------------------------------------------------------------------
// Latency: pong
// ---------------------------------------------------------------------------------

fn pong() {
    let env = ChildEnv::read();
    let z = env.zenoh();
    let gpu = env.gpu();
    let reply = z.declare_publisher(REPLY_KEY).wait().expect("reply publisher");
    let sub = z.declare_subscriber(LAT_KEY).wait().expect("subscriber");
    let t = Instant::now();
    while !reply.matching_status().wait().expect("matching").matching() {
        assert!(t.elapsed() < IO, "pong: the ping's reply subscriber never matched");
        std::thread::sleep(Duration::from_millis(5));
    }
    let pageable = env.pageable;
    std::thread::Builder::new()
        .name("pong".into())
        .spawn(move || {
            let replies = ShmPool::new(REPLY_POOL, None).expect("the pong's reply pool");
            let mut segments = Segments::new(gpu.as_ref().filter(|_| !pageable));
            let mut upload = Upload::new(gpu.as_ref());
            while let Ok(s) = sub.recv() {
                let (seq, _) = s.attachment().and_then(|a| parse_any_stamp(&a.to_bytes())).expect("stamp");
                let (bytes, shm) = payload(&s);
                if shm {
                    // SAFETY: the payload is in a segment Zenoh's SHM reader attached; the
                    // reader's segment table (in the global client storage, a static)
                    // keeps every attached segment mapped until the process exits.
                    unsafe { segments.note(&bytes) };
                }
                let registered = segments.registered(&bytes);
                upload.copy(&bytes);
                let done_ns = now_ns();
                // The publisher's chunk goes back before the reply leaves.
                drop(bytes);
                drop(s);
                let mut r = replies.alloc(REPLY_LEN);
                r[..8].copy_from_slice(&seq.to_le_bytes());
                r[8..16].copy_from_slice(&done_ns.to_le_bytes());
                r[16] = u8::from(shm);
                r[17] = u8::from(registered);
                reply.put(r).wait().expect("reply");
            }
        })
        .expect("spawn");
    send_msg(&env.conn, &Msg::Ready, &[]);
    let (m, _) = recv_msg::<Msg>(&env.conn, Duration::MAX);
    assert!(matches!(m, Msg::Stop), "pong: unexpected {m:?}");
    // The receive thread blocks in recv; leave without tearing anything down.
    std::process::exit(0);
}

// ---------------------------------------------------------------------------------
// Latency: ping
// ---------------------------------------------------------------------------------

type Fifo = zenoh::handlers::FifoChannelHandler<zenoh::sample::Sample>;

/// What the pong said about one round.
struct Reply {
    /// When the pong had the payload on its GPU (ns since the epoch).
    done_ns: u64,
    /// The payload reached the pong as an SHM buffer.
    shm: bool,
    /// ... inside a segment the pong registered with CUDA.
    registered: bool,
}

/// Waits for the pong's reply to `seq`; panics if the reply itself was not an SHM
/// buffer.
fn wait_reply(replies: &zenoh::pubsub::Subscriber<Fifo>, seq: u64) -> Reply {
    let t = Instant::now();
    loop {
        let left = REPLY_TIMEOUT.saturating_sub(t.elapsed());
        let s = replies
            .recv_timeout(left)
            .expect("reply channel")
            .unwrap_or_else(|| panic!("no reply to seq {seq} within {REPLY_TIMEOUT:?}"));
        let (b, shm) = payload(&s);
        assert!(shm, "the pong's reply arrived as bytes, not as an SHM buffer: Zenoh fell back to the socket");
        let word = |i: usize| b.get(i..i + 8).and_then(|w| w.try_into().ok()).map(u64::from_le_bytes);
        if word(0) == Some(seq) && b.len() == REPLY_LEN {
            return Reply { done_ns: word(8).expect("reply"), shm: b[16] == 1, registered: b[17] == 1 };
        }
        // A late reply from an earlier round: ignore it.
    }
}

/// The largest prefix of `sizes` (sorted) whose largest size fits a pool this process
/// can create: the pool, and the sizes left out with the reason.
fn latency_pool(sizes: &[usize], gpu: Option<&Gpu>) -> (Option<ShmPool>, Vec<(usize, String)>) {
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut skipped = Vec::new();
    while let Some(&largest) = sorted.last() {
        // One payload at a time (a round waits for the previous one to come back), the
        // probe chunk, and room for the allocator's own bookkeeping.
        match ShmPool::new(round_up(largest, PAGE) + 4 * PAGE + (1 << 20), gpu) {
            Ok(pool) => return (Some(pool), skipped),
            Err(e) => {
                skipped.push((largest, format!("the SHM pool for this size could not be created: {e}")));
                sorted.pop();
            }
        }
    }
    (None, skipped)
}

/// `--shm-out`: a session of ours on the benchmark's Zenoh session, copying out into a
/// Zenoh SHM pool of `bytes`, and its publisher on `key` (pool capped at `max_blocks`).
struct Ours {
    publisher: GpuPublisher,
    kernels: Option<Kernels>,
    _session: GpuSession,
}

impl Ours {
    fn new(ctx: &Ctx, key: &str, bytes: usize, max_blocks: usize) -> Self {
        let device = if ctx.gpu.is_some() { DeviceChoice::Cuda } else { DeviceChoice::Host };
        let mut cfg = ZcsConfig { device, provider: ProviderMode::Off, ..ZcsConfig::default() };
        cfg.zenoh_shm_out_bytes = bytes as u64;
        cfg.pool.max_blocks = max_blocks;
        let session =
            GpuSession::from_zenoh(ctx.z.clone(), cfg).wait().expect("open our session (zenoh_shm_out_bytes)");
        let publisher = session.declare_publisher(key.to_owned()).wait().expect("publisher");
        let kernels = session.gpu().map(|g| Kernels::load(g).expect("kernels"));
        Self { publisher, kernels, _session: session }
    }

    /// Loans a block of `size` bytes (waiting while subscribers hold every block), fills
    /// it with `seq`'s pattern if asked, and puts it: the publisher copies it out.
    /// Whether the copy out landed in the SHM pool (else it went through staging).
    fn put(&self, size: usize, seq: Option<u64>) -> bool {
        let before = self.publisher.stats().shm_out;
        let mut loan = loan_waiting(&self.publisher, size, IO);
        if let Some(seq) = seq {
            fill_loan(&mut loan, self.kernels.as_ref(), seq);
        }
        self.publisher.put(loan).expect("put");
        self.publisher.stats().shm_out > before
    }
}

fn latency_rows(ctx: &Ctx) {
    let args = &ctx.args;
    let (pool, skipped) = latency_pool(&args.plan.sizes, ctx.pool_gpu());
    let path = match (args.shm_out, args.pageable) {
        (true, _) => "zenoh-shm-out",
        (false, true) => "zenoh-shm-pageable",
        (false, false) => "zenoh-shm",
    };
    for (size, why) in &skipped {
        println!(
            "{}",
            json!({"bench": "latency", "path": path, "backend": &ctx.backend, "size": size, "skipped": why})
        );
    }
    let Some(pool) = pool else { return };
    let sizes: Vec<usize> = args.plan.sizes.iter().copied().filter(|s| !skipped.iter().any(|(k, _)| k == s)).collect();
    let max = sizes.iter().copied().max().unwrap_or(1);
    let z = &ctx.z;
    // The user's buffer and the pool they copy into, or our publisher with a pool for
    // two of the largest payload (the user's pool is dropped first). Two: the buffer of
    // the previous round may not be reclaimed yet when the next one is allocated (the
    // user's allocation comes before the timer and finds it reclaimed; ours is in the
    // put), and a pool too small for both falls back to the socket.
    let pool_bytes = pool.bytes;
    let (user, ours) = if args.shm_out {
        let bytes = 2 * pool.bytes;
        drop(pool);
        (None, Some(Ours::new(ctx, LAT_KEY, bytes, 4)))
    } else {
        (Some((pool, Source::new(ctx.gpu.as_ref(), max))), None)
    };
    let publisher = z.declare_publisher(LAT_KEY).wait().expect("publisher");
    let replies = z.declare_subscriber(REPLY_KEY).wait().expect("reply subscriber");

    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).expect("bind");
    let child = spawn_child_bin("pong", &ctx.child_env(&name, None));
    let conn = listener.accept_timeout(IO).expect("pong connects");
    let (m, _) = recv_msg::<Msg>(&conn, IO);
    assert!(matches!(m, Msg::Ready), "unexpected {m:?}");
    let t = Instant::now();
    while !publisher.matching_status().wait().expect("matching").matching() {
        assert!(t.elapsed() < IO, "the pong's subscriber never matched");
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(o) = &ours {
        let t = Instant::now();
        while !o.publisher.plain_subscribers() {
            assert!(t.elapsed() < IO, "our publisher never saw the pong's plain subscriber");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    let ready = match (ctx.gpu.is_some(), args.shm_out) {
        (true, false) => {
            "D2H by the publisher into a Zenoh SHM buffer, put by reference, H2D on the pong's stream, synchronized"
        }
        (true, true) => {
            "put of a loaned GPU block: our publisher's D2H into a Zenoh SHM buffer (zenoh_shm_out_bytes), put by \
             reference, H2D on the pong's stream, synchronized"
        }
        (false, _) => "memcpy by the publisher into a Zenoh SHM buffer, put by reference, memcpy out by the pong",
    };
    let mut seq = 0u64;
    for &size in &sizes {
        let (mut shm, mut registered, mut rounds_all) = (0u64, 0u64, 0u64);
        let s: Samples = args.plan.rounds(|| {
            seq += 1;
            let (t, sent_ns) = match (&user, &ours) {
                (Some((pool, source)), _) => {
                    // Untimed, like a loan: the previous round's buffer is back by now
                    // (the pong drops it before replying), so this collects it and
                    // reuses the space.
                    let mut buf = pool.alloc(size);
                    let (t, sent_ns) = (Instant::now(), now_ns());
                    source.copy_into(&mut buf);
                    publisher.put(buf).attachment(stamp(seq, sent_ns)).wait().expect("put");
                    (t, sent_ns)
                }
                (None, Some(o)) => {
                    let (t, sent_ns) = (Instant::now(), now_ns());
                    let in_shm = o.put(size, None);
                    // Through the socket, a payload over Zenoh's max_message_size (1 GiB
                    // by default) would be dropped by the receiver: say why no reply comes.
                    assert!(
                        in_shm,
                        "{size} B, round {seq}: our copy out did not fit the SHM pool ({} B) and went through \
                         staging and the socket",
                        2 * pool_bytes
                    );
                    (t, sent_ns)
                }
                (None, None) => unreachable!("one publisher or the other"),
            };
            let r = wait_reply(&replies, seq);
            rounds_all += 1;
            shm += u64::from(r.shm);
            registered += u64::from(r.registered);
            (t.elapsed(), r.done_ns.saturating_sub(sent_ns) as f64 / 1e3)
        });
        assert_eq!(
            shm,
            rounds_all,
            "{path} {size} B: {} of {rounds_all} payloads reached the pong as bytes, not SHM buffers: Zenoh fell back \
             to copying through the socket",
            rounds_all - shm
        );
        let shm_pool_bytes = user.as_ref().map(|(p, _)| p.bytes);
        row(
            path,
            &ctx.backend,
            size,
            &s,
            json!({
                "ready": ready,
                "shm_payloads_with_warmup": shm,
                "payloads_with_warmup": rounds_all,
                "pub_host_registered": user.as_ref().map_or(ctx.gpu.is_some(), |(p, _)| p.registered()),
                "sub_host_registered": registered == rounds_all && ctx.gpu.is_some(),
                "shm_pool_bytes": shm_pool_bytes,
                "alloc": if args.shm_out { "loan untimed, the copy out in put" }
                         else { "untimed, before each round (GarbageCollect policy)" },
            }),
        );
    }
    send_msg(&conn, &Msg::Stop, &[]);
    wait_child(child, "pong", IO);
}

// ---------------------------------------------------------------------------------
// Throughput: subscriber
// ---------------------------------------------------------------------------------

fn sub_child() {
    let _wd = watchdog_guard("zcs_zenoh_shm subscriber", CHILD_LIMIT);
    let env = ChildEnv::read();
    let key = var(KEY_ENV);
    let warmup: u64 = var(WARMUP_ENV).parse().expect("warmup");
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let cpu0 = cpu_secs();
    let z = env.zenoh();
    let sub =
        z.declare_subscriber(key.clone()).with(zenoh::handlers::FifoChannel::new(SUB_FIFO)).wait().expect("subscriber");
    let _token = z.liveliness().declare_token(format!("{key}/@tput/{}", std::process::id())).wait().expect("token");
    let gpu = env.gpu();
    let pageable = env.pageable;
    let (tx, rx) = std::sync::mpsc::channel::<SubReport>();
    let goal = Arc::clone(&target);
    std::thread::spawn(move || {
        let mut segments = Segments::new(gpu.as_ref().filter(|_| !pageable));
        let cuda = gpu.is_some();
        let mut checker = Checker::new(gpu);
        let mut host_copy = Vec::new();
        let mut rep = SubReport::default();
        let mut lat_us = Vec::new();
        let mut idle = Instant::now();
        loop {
            let g = goal.load(Ordering::Acquire);
            if g != u64::MAX && (rep.received >= g || idle.elapsed() > DRAIN_IDLE) {
                break;
            }
            let Some(s) = sub.recv_timeout(Duration::from_millis(100)).expect("subscriber channel") else {
                if g == u64::MAX {
                    idle = Instant::now();
                }
                continue;
            };
            let (seq, ts) = s.attachment().and_then(|a| parse_any_stamp(&a.to_bytes())).expect("stamp");
            let (bytes, shm) = payload(&s);
            if shm {
                rep.shm += 1;
                // SAFETY: as in the pong: the segment stays attached (mapped) in the
                // global client storage until the process exits.
                unsafe { segments.note(&bytes) };
            } else {
                rep.not_shm += 1;
            }
            rep.registered += u64::from(segments.registered(&bytes));
            if cuda {
                checker.host(&bytes, seq);
            } else {
                // The host backend's stand-in for the H2D copy, then the CPU check.
                host_copy.clear();
                host_copy.extend_from_slice(&bytes);
                checker.host(&host_copy, seq);
            }
            rep.received += 1;
            rep.last_done_ns = now_ns();
            if seq > warmup {
                lat_us.push(rep.last_done_ns.saturating_sub(ts) as f64 / 1e3);
            }
            idle = Instant::now();
        }
        lat_us.sort_by(f64::total_cmp);
        rep.errors = checker.errors();
        rep.lat_p50_us = percentile(&lat_us, 50.0);
        rep.lat_p99_us = percentile(&lat_us, 99.0);
        let _ = tx.send(rep);
    });
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

// ---------------------------------------------------------------------------------
// Throughput: publisher
// ---------------------------------------------------------------------------------

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

fn throughput_row(ctx: &Ctx, size: usize, subs: usize) {
    let args = &ctx.args;
    let _wd = watchdog_guard("zcs_zenoh_shm throughput row", Duration::from_secs_f64(args.frame_max_secs) + 3 * IO);
    let path = match (args.shm_out, args.pageable) {
        (true, _) => "zenoh-shm-out",
        (false, true) => "zenoh-shm-user-copies-pageable",
        (false, false) => "zenoh-shm-user-copies",
    };
    let key = format!("{PREFIX}/tput/{size}/{subs}");
    // `--pool-frames` frames, or fewer (down to 2) where the host cannot hold that many.
    // Ours: its GPU pool holds `--pool-frames` blocks, and the SHM copies out live on
    // in the subscribers' queues after their blocks are back and in the publisher's
    // bytes lane (two in flight), so room for those too.
    let mut pool_frames = args.pool_frames.max(2) + if args.shm_out { SUB_FIFO + 3 } else { 0 };
    let pool = loop {
        match ShmPool::new(pool_frames * (round_up(size, PAGE) + PAGE) + (1 << 20), ctx.pool_gpu()) {
            Ok(p) => break p,
            Err(e) if pool_frames <= 2 => {
                println!(
                    "{}",
                    json!({"bench": "throughput", "path": path, "backend": &ctx.backend, "size": size,
                           "subscribers": subs, "skipped": format!("no SHM pool of 2 frames could be created: {e}")})
                );
                return;
            }
            Err(e) => {
                eprintln!("zcs_zenoh_shm: an SHM pool of {pool_frames} frames of {size} B: {e}; trying half");
                pool_frames /= 2;
            }
        }
    };
    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).expect("bind");
    let env = ctx.child_env(&name, Some((&key, args.frame_warmup)));
    let children: Vec<(std::process::Child, ControlConn)> = (0..subs)
        .map(|_| {
            let child = spawn_child_bin("sub", &env);
            (child, listener.accept_timeout(IO).expect("a subscriber connects"))
        })
        .collect();
    for (_, c) in &children {
        let (m, _) = recv_msg::<Msg>(c, IO);
        assert!(matches!(m, Msg::Ready), "unexpected {m:?}");
    }
    let free0 = ctx.free_gpu_mem();
    let (pool, ours) = if args.shm_out {
        let bytes = pool.bytes;
        drop(pool);
        (None, Some(Ours::new(ctx, &key, bytes, args.pool_frames)))
    } else {
        (Some(pool), None)
    };
    let mut source = Source::new(ctx.gpu.as_ref(), if ours.is_some() { 1 } else { size });
    let publisher = ctx.z.declare_publisher(key.clone()).wait().expect("publisher");
    // Zenoh's matching status is yes/no: count the subscribers' liveliness tokens.
    wait_until(&key, || {
        let replies = ctx.z.liveliness().get(format!("{key}/@tput/*")).timeout(Duration::from_secs(1)).wait();
        replies.map(|r| r.iter().filter(|x| x.result().is_ok()).count() == subs).unwrap_or(false)
    });

    let mut seq = 0u64;
    if let Some(o) = &ours {
        wait_until(&key, || o.publisher.plain_subscribers());
    }
    let mut send = |source: &mut Source| {
        seq += 1;
        if let Some(o) = &ours {
            o.put(size, Some(seq));
            return;
        }
        let pool = pool.as_ref().expect("the user's pool");
        let ts = now_ns();
        source.fill(size, seq);
        let mut buf = pool.alloc(size);
        source.copy_into(&mut buf);
        publisher.put(buf).attachment(stamp(seq, ts)).wait().expect("put");
    };
    for _ in 0..args.frame_warmup {
        send(&mut source);
    }
    let (start_ns, t, cpu0) = (now_ns(), Instant::now(), cpu_secs());
    let budget = Duration::from_secs_f64(args.frame_max_secs);
    let mut timed = 0u64;
    while timed < args.frames && (timed < 5 || t.elapsed() < budget) {
        send(&mut source);
        timed += 1;
    }
    let pub_cpu = cpu_secs() - cpu0;
    let sent = seq;
    children.iter().for_each(|(_, c)| send_msg(c, &Msg::Done { sent }, &[]));
    let reports: Vec<SubReport> = children
        .iter()
        .map(|(_, c)| match recv_msg::<Msg>(c, IO).0 {
            Msg::Report(r) => r,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    children.into_iter().for_each(|(child, _)| wait_child(child, "subscriber", IO));
    let mem_delta = free0.zip(ctx.free_gpu_mem()).map(|(a, b)| a as i64 - b as i64);
    let not_shm: u64 = reports.iter().map(|r| r.not_shm).sum();
    // Ours falls back to staging when its SHM pool is full: counted, not a failure.
    let copies_out = ours.as_ref().map(|o| o.publisher.stats());
    assert!(
        ours.is_some() || not_shm == 0,
        "{path} {size} B × {subs}: {not_shm} payloads reached subscribers as bytes, not SHM buffers: Zenoh fell back \
         to copying through the socket"
    );

    let end_ns = reports.iter().map(|r| r.last_done_ns).max().unwrap_or(start_ns);
    let secs = end_ns.saturating_sub(start_ns) as f64 / 1e9;
    let msgs_per_s = timed as f64 / secs;
    let worst = |f: fn(&SubReport) -> f64| reports.iter().map(f).fold(f64::NAN, f64::max);
    let r0 = &reports[0];
    let note = if let Some(st) = &copies_out {
        format!(
            "our publisher: loan, fill kernel (CPU fill on host), put; its copy out lands in a Zenoh SHM buffer \
             (zenoh_shm_out_bytes; {} of {} copies out, the rest through staging when the SHM pool was full), \
             put by reference; subscriber H2D from the mapped segment into a reused buffer, check kernel, synchronized",
            st.shm_out, st.copies_out
        )
    } else if ctx.gpu.is_some() {
        "zenoh SHM; publisher fill kernel + D2H into a Zenoh POSIX SHM buffer (no further copy), put by reference; \
         subscriber H2D from the mapped segment into a reused buffer, check kernel, synchronized"
            .to_owned()
    } else {
        "zenoh SHM; filled on the CPU and memcpy'd into a Zenoh POSIX SHM buffer, put by reference; subscriber \
         memcpy out of the mapped segment, CPU check"
            .to_owned()
    };
    println!(
        "{}",
        json!({
            "bench": "throughput",
            "path": path,
            "backend": &ctx.backend,
            "size": size,
            "subscribers": subs,
            "frames": timed,
            "warmup": args.frame_warmup,
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
            "sub_shm_samples": reports.iter().map(|r| r.shm).sum::<u64>(),
            "sub_not_shm_samples": not_shm,
            "pub_host_registered": pool.as_ref().map_or(ctx.gpu.is_some(), ShmPool::registered),
            "sub_host_registered": ctx.gpu.is_some() && reports.iter().all(|r| r.registered == r.received),
            "shm_pool_bytes": pool.as_ref().map(|p| p.bytes),
            "pub_stats": copies_out,
            "pool_frames": pool_frames,
            "gpu_mem_delta_bytes": mem_delta,
            "gpu_mem_delta_scope": "device-wide drop of free memory from subscribers ready to end of row: \
                publisher frame buffer, subscribers' staging (not their CUDA contexts)",
            "note": note,
        })
    );
}

// ---------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------

struct Ctx {
    args: Args,
    port: u16,
    z: zenoh::Session,
    gpu: Option<Gpu>,
    backend: String,
}

impl Ctx {
    fn registered(&self) -> bool {
        self.gpu.is_some() && !self.args.pageable
    }

    fn free_gpu_mem(&self) -> Option<usize> {
        self.gpu.as_ref().map(|g| g.mem_info().expect("mem_info").0)
    }

    /// Registration with CUDA in this process's pools: with a GPU, unless `--pageable`.
    fn pool_gpu(&self) -> Option<&Gpu> {
        self.gpu.as_ref().filter(|_| !self.args.pageable)
    }

    fn child_env(&self, sock: &SocketName, sub: Option<(&str, u64)>) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (PORT_ENV, self.port.to_string()),
            (SOCK_ENV, sock.to_key_chunk()),
            (BACKEND_ENV, self.backend.clone()),
        ];
        if self.args.pageable {
            env.push((PAGEABLE_ENV, "1".into()));
        }
        if let Some((key, warmup)) = sub {
            env.push((KEY_ENV, key.to_owned()));
            env.push((WARMUP_ENV, warmup.to_string()));
        }
        env
    }
}

fn main() {
    match child_role().as_deref() {
        Some("pong") => return pong(),
        Some("sub") => return sub_child(),
        _ => {}
    }
    let args = Args::parse();
    let gpu = match args.backend.as_str() {
        "cuda" => Some(Gpu::probe().unwrap_or_else(|e| panic!("--backend cuda: {e}"))),
        "host" => None,
        other => panic!("unknown backend {other:?} (cuda or host)"),
    };
    for r in &args.rows {
        assert!(matches!(r.as_str(), "latency" | "throughput"), "unknown row kind {r:?} (latency, throughput)");
    }
    let port = free_tcp_port();
    let z = zenoh::open(zenoh_config(Some(port), None)).wait().expect("open zenoh");
    let backend = args.backend.clone();
    let ctx = Ctx { args, port, z, gpu, backend };
    let args = &ctx.args;
    let mut setup = json!({
        "bench": "zenoh-shm-setup",
        "backend": &ctx.backend,
        "iters": args.plan.iters,
        "warmup": args.plan.warmup,
        "max_secs_per_row": args.plan.max_secs,
        "frames": args.frames,
        "frame_warmup": args.frame_warmup,
        "frame_max_secs_per_row": args.frame_max_secs,
        "pool_frames": args.pool_frames,
        "subscriber_fifo": SUB_FIFO,
        "transport": "zenoh peer, tcp 127.0.0.1, congestion control block; transport/shared_memory enabled in every \
            process (transport_optimization off): SHM payloads pass by reference",
        "shm": "zenoh::shm::PosixShmProviderBackend (talc), chunks 4 KiB aligned",
        "host_registered": ctx.registered(),
        "subscriber_work": if ctx.gpu.is_some() {
            "latency: H2D + synchronize; throughput: H2D, Kernels::check on every frame, stream synchronized"
        } else {
            "latency: memcpy; throughput: memcpy, CPU pattern check"
        },
    });
    if let (Some(g), Some(o)) = (&ctx.gpu, setup.as_object_mut()) {
        o.insert("gpu".into(), json!(g.name()));
        o.insert("uuid".into(), json!(g.uuid().to_string()));
    }
    println!("{setup}");

    if args.rows.iter().any(|r| r == "latency") {
        latency_rows(&ctx);
    }
    if args.rows.iter().any(|r| r == "throughput") {
        let sizes = args.frame_sizes.clone().unwrap_or(if ctx.gpu.is_some() {
            vec![FRAME_1080P_RGB, FRAME_4K_RGBA]
        } else {
            vec![64 << 10, 1 << 20]
        });
        for &size in &sizes {
            for &subs in &args.subscribers {
                throughput_row(&ctx, size, subs);
            }
        }
    }
}
