//! ROS 2 frames between publishers and subscriptions of the CUDA buffer backend
//! (`rosidl::Buffer`, as rmw_zenoh 0.12.0 with `cuda_buffer_backend` 0.1.2 sends them)
//! and ours, on one GPU, each direction against the backend's own paths:
//!
//! - `theirs-to-ours`: their publisher → our subscription, by descriptor (their block
//!   imported and read in place) and by their CPU path (their buffer copied device→host
//!   and sent as CDR, uploaded host→device by the consumer, which wants it on the GPU);
//! - `ours-to-theirs`: our publisher → their subscription, by descriptor (our block lent
//!   and read in place by them);
//! - `theirs-to-theirs`: their publisher → their subscription, by descriptor: the
//!   backend's own CUDA→CUDA path, the anchor of both directions.
//!
//! Their publisher and their subscription are written from the backend's sources (as
//! the GPU tests' are: `zcs_tests::rosidl`): the publisher exports its own VMM blocks as
//! POSIX FDs served on a socket each, keeps the 24 shared bytes per block, records a
//! fresh interprocess event per frame after the frame's fill kernel, and follows its
//! pool's reuse rule (a block whose count is back to 0 and whose last publish is 100 ms
//! old, else a new block); the subscription registers in the host registry, lists
//! `cuda`, and imports each descriptor (count, reuse id, FD, mapping, event). Ours are
//! `zenoh-cuda-shm-ros2` on a GPU session. Publishers run in a second process (this
//! program re-run), subscriptions in the first, over loopback TCP: an IPC event handle
//! cannot be opened in the process that made it.
//!
//! Rows (JSON lines), per `--frames` size, each path:
//! - `latency`: one frame in flight, the next asked for [`PACE`] after the last arrived
//!   (so that lent blocks come back within the 100 ms grace window of both sides); the
//!   put (after its fill is queued) → the frame received by the consumer, on the host's
//!   monotonic clock, p50 / p99 over `--iters`. The three descriptor paths take turns,
//!   one frame each, so that a drift of the machine (clocks, scheduling: their p50s
//!   move by up to 2× between runs) falls on all of them alike and their ratios hold;
//!   the CPU path's rounds come after them, its copies kept out of theirs;
//! - `rate`: the publisher as fast as it can, the consumer reading every frame (its
//!   check kernel on the GPU); frames per second at the consumer.
//!
//! Every frame is checked on the GPU against the pattern its publish filled in; a row
//! with a wrong byte is an error.
//!
//! ```text
//! zcs_rosidl_bench --frames 3840x2160 --iters 200
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use zcs_memory::cuda::kernels::Kernels;
use zcs_tests::percentile;
use zcs_tests::rosidl::{Registered, ServedBlock, TheirSubscription, cuda_session, rgba_frame};
use zenoh::Wait;
use zenoh_cuda_shm::cuda::{DeviceBlock, Gpu, IpcEvent, Stream, copy};
use zenoh_cuda_shm::tensor_codec::cdr::{BufferData, Header, Image, Time};
use zenoh_cuda_shm_ros2::cuda_backend::BackendImports;
use zenoh_cuda_shm_ros2::names::gid_hex;
use zenoh_cuda_shm_ros2::{Attachment, NodeOptions, Qos, RmwWire, RosNode, RosSample, RosSubscriber};

#[derive(Parser, Debug)]
#[command(about = "ROS 2 CUDA buffer backend publisher → our subscription: latency and frame rate (JSON lines)")]
struct Args {
    /// Frame sizes, WIDTHxHEIGHT of rgba8.
    #[arg(long, value_delimiter = ',', default_value = "1920x1080,3840x2160")]
    frames: Vec<String>,
    /// Timed frames per latency row (after `--warmup`).
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Frames per rate row.
    #[arg(long, default_value_t = 300)]
    rate_frames: usize,
    /// Untimed frames first.
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// Accepted for the benchmark loop of scripts/gpu-run.sh (this one is CUDA only).
    #[arg(long, default_value = "cuda")]
    backend: String,
}

/// The pause before each frame of a latency row.
const PACE: Duration = Duration::from_millis(2);

/// The backend's reuse grace (`grace_period_us_`, `cuda_memory_pool.hpp:147`).
const GRACE: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// A descriptor of the publisher's block.
    Cuda,
    /// The CPU form: the buffer copied to host and sent as CDR.
    Cpu,
}

struct TheirBlock {
    served: ServedBlock,
    published: Option<Instant>,
    /// The event of its last frame, alive until the block is reused.
    _event: Option<IpcEvent>,
}

/// The backend's publisher, as its sources describe it.
struct Theirs {
    gpu: Gpu,
    kernels: Kernels,
    stream: Stream,
    gid: [u8; 16],
    seq: i64,
    blocks: Vec<TheirBlock>,
    host: Vec<u8>,
}

impl Theirs {
    /// A block with nobody counted on it and its last publish `GRACE` old, else a new one.
    fn acquire(&mut self, len: usize) -> usize {
        let ready = self.blocks.iter().position(|b| {
            b.served.block.size() >= len
                && b.served.meta.count() <= 0
                && b.published.is_none_or(|t| t.elapsed() >= GRACE)
        });
        if let Some(i) = ready {
            return i;
        }
        let served = ServedBlock::new(&self.gpu, self.blocks.len() as u32 + 1, len);
        self.blocks.push(TheirBlock { served, published: None, _event: None });
        self.blocks.len() - 1
    }

    /// Fills a frame with `seed`'s pattern and publishes it with `to`, stamped (header
    /// and attachment) with the monotonic clock at its put.
    fn publish(&mut self, to: &zenoh::pubsub::Publisher<'_>, fields: &Image<()>, len: usize, seed: u64, wire: Wire) {
        let i = self.acquire(len);
        let ptr = self.blocks[i].served.block.device_ptr();
        // SAFETY: the block has ≥ len mapped bytes and lives as long as `self`.
        unsafe { self.kernels.fill(&self.stream, ptr, len as u64, seed) }.expect("fill");
        let stamp = monotonic_ns();
        let fields = &Image { header: Header { stamp: time_of(stamp), ..fields.header.clone() }, ..fields.clone() };
        let bytes = match wire {
            Wire::Cuda => {
                let event = IpcEvent::create(&self.gpu).expect("an interprocess event");
                event.record(&self.stream).expect("record");
                let uid = (seed << 1) | 1; // one id per allocation, never 0
                self.blocks[i].served.meta.publish(uid, 1);
                let d = self.blocks[i].served.descriptor(&self.gpu, len, uid, event.handle().expect("event handle"));
                self.blocks[i]._event = Some(event);
                fields.encode_cdr_cuda(&d).expect("encode")
            }
            Wire::Cpu => {
                // The CPU form: the serializer copies the buffer to host (a synchronous
                // copy: it waits for the fill), then writes ordinary CDR.
                self.host.resize(len, 0);
                // SAFETY: the block has ≥ len mapped bytes; `host` has len bytes; the call
                // returns once the copy is done.
                unsafe { copy::device_to_host(&self.stream, ptr, &mut self.host) }.expect("device→host");
                let mut m = fields.encode_cdr_prefix(len).expect("encode");
                m.extend_from_slice(&self.host);
                m
            }
        };
        self.blocks[i].published = Some(Instant::now());
        self.seq += 1;
        let att = Attachment { seq: self.seq, timestamp_ns: stamp, gid: self.gid };
        to.put(bytes).attachment(att.encode().to_vec()).wait().expect("put");
    }
}

impl Drop for Theirs {
    fn drop(&mut self) {
        // The blocks' files go with them, once the GPU is done with the frames.
        let _ = copy::wait(&self.stream);
    }
}

/// The consumer: the frame on the GPU, ordered on `stream`, checked there (errors
/// accumulate in `counter`); a bytes frame is uploaded first into `upload`.
struct Consumer {
    kernels: Kernels,
    stream: Stream,
    counter: DeviceBlock,
    upload: DeviceBlock,
}

impl Consumer {
    fn consume(&self, msg: &RosSample<Image<()>>, seed: u64) {
        let len = msg.data_len() as u64;
        match msg.gpu_sample() {
            Some(sample) => {
                let read = sample.read(&self.stream).expect("read in place");
                // SAFETY: the read range is mapped and held by the sample until the fence
                // `end` records after this launch; the counter lives as long as `self`.
                unsafe { self.kernels.check(&self.stream, read.device_ptr(), len, seed, self.counter.device_ptr()) }
                    .expect("check");
                read.end().expect("end the read");
            }
            None => {
                let bytes = msg.host_data().expect("host bytes");
                // SAFETY: `upload` has ≥ len mapped bytes; the call returns once `bytes`
                // has been read.
                unsafe { copy::host_to_device(&self.stream, self.upload.device_ptr(), &bytes) }.expect("upload");
                // SAFETY: as above, the upload block; the counter as above.
                unsafe {
                    self.kernels.check(&self.stream, self.upload.device_ptr(), len, seed, self.counter.device_ptr())
                }
                .expect("check");
            }
        }
    }

    /// A frame of their subscription: imported and read in place (a descriptor), or
    /// uploaded (CDR); whether it was in place.
    fn consume_theirs(&self, imports: &BackendImports, msg: &Image<BufferData<'_>>, seed: u64) -> bool {
        match &msg.data {
            BufferData::Cuda(d) => {
                let buffer = imports.import(d).expect("their import of the descriptor");
                let read = buffer.read(&self.stream).expect("read in place");
                // SAFETY: the buffer's bytes stay mapped and counted until the fence `end`
                // records after this launch; the counter lives as long as `self`.
                unsafe { self.kernels.check(&self.stream, read.device_ptr(), d.size, seed, self.counter.device_ptr()) }
                    .expect("check");
                read.end().expect("end the read");
                true
            }
            BufferData::Bytes(bytes) => {
                // SAFETY: `upload` has ≥ len mapped bytes; the call returns once `bytes`
                // has been read.
                unsafe { copy::host_to_device(&self.stream, self.upload.device_ptr(), bytes) }.expect("upload");
                // SAFETY: as above, the upload block; the counter as above.
                unsafe {
                    self.kernels.check(
                        &self.stream,
                        self.upload.device_ptr(),
                        bytes.len() as u64,
                        seed,
                        self.counter.device_ptr(),
                    )
                }
                .expect("check");
                false
            }
        }
    }

    /// Bytes that differed from their patterns since the last call (waits).
    fn errors(&self) -> u32 {
        let mut v = [0u8; 4];
        // SAFETY: the counter has ≥ 4 mapped bytes; the call returns after the copy.
        unsafe { copy::device_to_host(&self.stream, self.counter.device_ptr(), &mut v) }.expect("read the counter");
        // SAFETY: as above.
        unsafe { copy::fill(&self.stream, self.counter.device_ptr(), 0, 4) }.expect("reset");
        copy::wait(&self.stream).expect("wait");
        u32::from_le_bytes(v)
    }
}

fn recv(sub: &RosSubscriber<Image<()>>) -> RosSample<Image<()>> {
    sub.recv_timeout(Duration::from_secs(20)).expect("a frame within 20 s")
}

/// CLOCK_MONOTONIC in ns: one clock for both processes of the benchmark.
fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn time_of(ns: i64) -> Time {
    Time { sec: (ns / 1_000_000_000) as i32, nanosec: (ns % 1_000_000_000) as u32 }
}

fn ns_of(t: &Time) -> i64 {
    i64::from(t.sec) * 1_000_000_000 + i64::from(t.nanosec)
}

fn dims(f: &str) -> (u32, u32) {
    let (w, h) = f.split_once('x').expect("WIDTHxHEIGHT");
    (w.parse().expect("width"), h.parse().expect("height"))
}

fn fields(f: &str) -> (Image<()>, usize) {
    let (w, h) = dims(f);
    (rgba_frame(w, h), (w * h * 4) as usize)
}

/// Who sends to whom, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Their publisher → our subscription.
    TheirsToOurs(Wire),
    /// Our publisher → their subscription, by descriptor.
    OursToTheirs,
    /// Their publisher → their subscription, by descriptor.
    TheirsToTheirs,
}

impl Route {
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::TheirsToOurs(Wire::Cuda) => ("theirs-to-ours", "cuda-descriptor"),
            Self::TheirsToOurs(Wire::Cpu) => ("theirs-to-ours", "cpu-cdr"),
            Self::OursToTheirs => ("ours-to-theirs", "cuda-descriptor"),
            Self::TheirsToTheirs => ("theirs-to-theirs", "cuda-descriptor"),
        }
    }
}

/// The rows, in order: per frame size, each route.
fn plan(args: &Args) -> Vec<(String, Route)> {
    let mut rows = Vec::new();
    for f in &args.frames {
        for r in [
            Route::TheirsToOurs(Wire::Cuda),
            Route::TheirsToOurs(Wire::Cpu),
            Route::OursToTheirs,
            Route::TheirsToTheirs,
        ] {
            rows.push((f.clone(), r));
        }
    }
    rows
}

/// Frames of each row: `warmup + iters` one at a time, then `rate_frames` at once.
fn seeds(args: &Args, row: usize) -> (u64, u64) {
    let per_row = (args.warmup + args.iters + args.rate_frames) as u64;
    let first = 1 + row as u64 * per_row;
    (first, first + (args.warmup + args.iters) as u64)
}

/// The publisher process: it publishes what the subscriber process asks for on the
/// control key (a row, its first seed and a count), so that one frame is in flight in
/// the latency rows and `rate_frames` back to back in the rate rows. Their publisher
/// puts on the `_buf/<GID>` key of the row's subscription; ours publishes on
/// [`OUT_TOPIC`] and finds their subscription itself.
fn publisher_main(args: &Args) {
    let port: u16 = std::env::var(PORT_ENV).expect("port").parse().expect("port");
    let key = std::env::var(KEY_ENV).expect("key");
    let their_key = std::env::var(THEIR_KEY_ENV).expect("their key");
    let domain: u32 = std::env::var(DOMAIN_ENV).expect("domain").parse().expect("domain");
    let gpu = Gpu::open(0).expect("a GPU");
    let session = cuda_session(None, Some(port));
    let z = session.zenoh().clone();
    let go = z.declare_subscriber(format!("{key}/bench_go")).with(flume::unbounded()).wait().expect("control");
    // Blocking, so that the rate rows count frames, not Zenoh's drops.
    let declare = |k: &str| {
        z.declare_publisher(k.to_owned())
            .congestion_control(zenoh::qos::CongestionControl::Block)
            .wait()
            .expect("their publisher")
    };
    let (to_ours, to_theirs) = (declare(&key), declare(&their_key));
    let node = RosNode::new(&session, NodeOptions::new("bench_pub").domain(domain).rmw_wire(RmwWire::BufferAware))
        .expect("node");
    let ours = node.publisher::<Image<()>>(OUT_TOPIC, Qos::reliable(10).keep_all()).expect("our publisher");
    assert!(ours.lends_cuda_buffers(), "our publisher lends its blocks");
    let t = Instant::now();
    while !to_ours.matching_status().wait().expect("matching status").matching()
        || !to_theirs.matching_status().wait().expect("matching status").matching()
        || ours.ordinary_subscriptions() == 0
    {
        assert!(t.elapsed() < Duration::from_secs(30), "the publishers never saw both subscriptions");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut theirs = Theirs {
        kernels: Kernels::load(&gpu).expect("kernels"),
        stream: gpu.new_stream().expect("stream"),
        gpu: gpu.clone(),
        gid: [7; 16],
        seq: 0,
        blocks: Vec::new(),
        host: Vec::new(),
    };
    let rows = plan(args);
    // `<row> <first seed> <count>` per request, `end` once every frame is taken.
    loop {
        let ask = go.recv_timeout(Duration::from_secs(60)).expect("the subscriber's go");
        let text = String::from_utf8_lossy(&ask.payload().to_bytes()).into_owned();
        if text == "end" {
            break;
        }
        let mut words = text.split(' ').map(|w| w.parse::<u64>().expect("a number"));
        let (row, first, n) = (words.next().expect("row"), words.next().expect("seed"), words.next().expect("count"));
        let (f, route) = &rows[row as usize];
        let (image, len) = fields(f);
        for seed in first..first + n {
            match route {
                Route::TheirsToOurs(wire) => theirs.publish(&to_ours, &image, len, seed, *wire),
                Route::TheirsToTheirs => theirs.publish(&to_theirs, &image, len, seed, Wire::Cuda),
                Route::OursToTheirs => {
                    let loan = ours.loan(len).expect("a loan");
                    let ptr = loan.device_ptr().expect("a device block");
                    // SAFETY: the loan's len bytes are mapped until its stream has
                    // passed the kernel.
                    unsafe { theirs.kernels.fill(loan.stream().expect("a stream"), ptr, len as u64, seed) }
                        .expect("fill");
                    let stamped = Image {
                        header: Header { stamp: time_of(monotonic_ns()), ..image.header.clone() },
                        ..image.clone()
                    };
                    ours.publish(&stamped, loan).expect("our publish");
                }
            }
        }
    }
    // `end` came once the subscriber process had taken every frame: their blocks'
    // files go with this process.
    let s = ours.stats();
    eprintln!("our publisher: {s:?}, CDR instead of descriptors: {:?}", ours.cuda_fallbacks());
}

const PORT_ENV: &str = "ZCS_ROSIDL_BENCH_PORT";
const KEY_ENV: &str = "ZCS_ROSIDL_BENCH_KEY";
const THEIR_KEY_ENV: &str = "ZCS_ROSIDL_BENCH_THEIR_KEY";
const DOMAIN_ENV: &str = "ZCS_ROSIDL_BENCH_DOMAIN";
/// The topic of our publisher and their subscription.
const OUT_TOPIC: &str = "/camera/image_out";

fn main() {
    let args = Args::parse();
    if std::env::var(KEY_ENV).is_ok() {
        return publisher_main(&args);
    }
    let gpu = Gpu::open(0).expect("a GPU");
    let port = zcs_tests::free_tcp_port();
    let session = cuda_session(Some(port), None);
    let domain = 90 + std::process::id() % 100;
    let node = RosNode::new(&session, NodeOptions::new("bench_sub").domain(domain).rmw_wire(RmwWire::BufferAware))
        .expect("node");
    // KEEP_ALL: the rate rows must not lose frames to a full queue.
    let sub = node.subscriber::<Image<()>>("/camera/image", Qos::reliable(10).keep_all()).expect("subscription");
    assert!(sub.takes_cuda_buffers(), "the subscription lists cuda");
    let key = format!("{}/_buf/{}", sub.key(), gid_hex(&sub.gid()));
    let z = session.zenoh().clone();
    let their_sub = TheirSubscription::declare(&z, domain, OUT_TOPIC, &gpu, Registered::SameDevice);
    let their_key = format!("{}/_buf/{}", their_sub.key, gid_hex(&their_sub.gid));
    let imports = BackendImports::new(&gpu).expect("their import cache");
    let mut child = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(std::env::args().skip(1))
        .env(PORT_ENV, port.to_string())
        .env(KEY_ENV, &key)
        .env(THEIR_KEY_ENV, &their_key)
        .env(DOMAIN_ENV, domain.to_string())
        .spawn()
        .expect("the publisher process");
    let go_key = format!("{key}/bench_go");
    let go_publisher = z.declare_publisher(go_key).wait().expect("control");
    let t = Instant::now();
    while !go_publisher.matching_status().wait().expect("matching").matching() {
        assert!(t.elapsed() < Duration::from_secs(30), "the publisher process never came");
        std::thread::sleep(Duration::from_millis(10));
    }
    let go = |row: usize, seed: u64, n: usize| go_publisher.put(format!("{row} {seed} {n}")).wait().expect("go");
    // A frame of their subscription, its publish stamp, and whether it was in place.
    let take_theirs = |seed: u64, consumer: &Consumer| {
        let (_, bytes) = their_sub.rx.recv_timeout(Duration::from_secs(20)).expect("a frame within 20 s");
        let arrived = monotonic_ns();
        let msg = Image::decode_cdr_buffer(&bytes).expect("an Image");
        let in_place = consumer.consume_theirs(&imports, &msg, seed);
        (arrived - ns_of(&msg.header.stamp), in_place)
    };

    let max = args.frames.iter().map(|f| fields(f).1).max().unwrap_or(0);
    let consumer = Consumer {
        kernels: Kernels::load(&gpu).expect("kernels"),
        stream: gpu.new_stream().expect("stream"),
        counter: DeviceBlock::allocate(&gpu, 4).expect("counter"),
        upload: DeviceBlock::allocate(&gpu, max).expect("upload block"),
    };
    consumer.errors();
    println!(
        "{}",
        json!({"bench": "rosidl-setup", "gpu": gpu.name(), "iters": args.iters, "rate_frames": args.rate_frames,
               "warmup": args.warmup, "grace_ms": GRACE.as_millis() as u64})
    );
    let rows = plan(&args);
    // One frame of `row`, asked for `PACE` after the last one arrived: publish → arrival.
    let one_frame = |row: usize, seed: u64| {
        std::thread::sleep(PACE);
        go(row, seed, 1);
        match rows[row].1 {
            Route::TheirsToOurs(_) => {
                let msg = recv(&sub);
                let arrived = monotonic_ns();
                consumer.consume(&msg, seed);
                arrived - msg.attachment().timestamp_ns
            }
            _ => take_theirs(seed, &consumer).0,
        }
    };
    // `rate_frames` frames of `row` asked for at once: frames per second at the consumer.
    let rate_row = |row: usize| {
        let (f, route) = &rows[row];
        let (direction, path) = route.names();
        let before = sub.stats();
        let n = args.rate_frames;
        let rate_first = seeds(&args, row).1;
        let t = Instant::now();
        go(row, rate_first, n);
        let (mut in_place, mut cdr) = (0u64, 0u64);
        for k in 0..n as u64 {
            let placed = match route {
                Route::TheirsToOurs(_) => {
                    let msg = recv(&sub);
                    consumer.consume(&msg, rate_first + k);
                    msg.gpu_sample().is_some()
                }
                _ => take_theirs(rate_first + k, &consumer).1,
            };
            if placed {
                in_place += 1;
            } else {
                cdr += 1;
            }
        }
        let errors = consumer.errors();
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(errors, 0, "{direction} {path} {f}: wrong bytes at full rate");
        let after = sub.stats();
        assert_eq!(after.backend_refused, before.backend_refused, "refused: {:?}", sub.backend_refusal());
        println!(
            "{}",
            json!({"bench": "rosidl", "row": "rate", "direction": direction, "path": path, "frame": f,
                   "size": fields(f).1, "fps": n as f64 / secs, "frames": n, "in_place": in_place, "cdr": cdr,
                   "what": "frames per second at the consumer, each checked on the GPU"})
        );
    };
    for f in &args.frames {
        let of_size: Vec<usize> = (0..rows.len()).filter(|&r| rows[r].0 == *f).collect();
        let (descriptors, cpu): (Vec<usize>, Vec<usize>) =
            of_size.iter().partition(|&&r| rows[r].1 != Route::TheirsToOurs(Wire::Cpu));
        let mut us: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
        for group in [&descriptors, &cpu] {
            for i in 0..args.warmup + args.iters {
                for &row in group {
                    let ns = one_frame(row, seeds(&args, row).0 + i as u64);
                    if i >= args.warmup {
                        us[row].push(ns as f64 / 1e3);
                    }
                }
            }
        }
        assert_eq!(consumer.errors(), 0, "{f}: wrong bytes in the latency rounds");
        for &row in &of_size {
            let (direction, path) = rows[row].1.names();
            let us = &mut us[row];
            us.sort_by(f64::total_cmp);
            println!(
                "{}",
                json!({"bench": "rosidl", "row": "latency", "direction": direction, "path": path, "frame": f,
                       "size": fields(f).1, "p50_us": percentile(us, 50.0), "p99_us": percentile(us, 99.0),
                       "interleaved": descriptors.contains(&row),
                       "what": "publish (its put) → the frame received by the consumer, one in flight"})
            );
        }
        for &row in &of_size {
            rate_row(row);
        }
    }
    go_publisher.put("end").wait().expect("end");
    let status = child.wait().expect("the publisher process");
    assert!(status.success(), "the publisher process failed: {status}");
}
