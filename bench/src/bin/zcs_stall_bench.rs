//! A consumer that stops reading must not slow the others: one publisher at a fixed
//! rate, a healthy subscriber that reads every message, and beside it, in the same
//! process and on the same key or topic, a subscriber whose application never reads.
//!
//! Rows (JSON lines, `"bench": "stall"`), each a fresh publisher and subscriber
//! session, for the healthy subscriber: messages received, their rate, publish→receive
//! p50 / p99 / max; the publisher's puts that took longest; what the stalled one and
//! the publisher counted.
//! - `plain-alone`, `plain-beside-reader` (a second subscriber that reads everything: the
//!   cost of serving two) and `plain-beside-stalled`: `GpuSubscriber`s with a FIFO of 256
//!   on one key;
//! - `ros-alone`, `ros-beside-reader`, `ros-beside-stalled-keep-last` (depth 10) and
//!   `ros-beside-stalled-keep-all`: ROS 2 Image subscriptions of one topic.
//!
//! The goal: beside a stalled subscriber, the healthy one's rate and latency are those it
//! has beside a second subscriber that reads (docs/benchmarks.md, "A stalled consumer").
//!
//! ```text
//! zcs_stall_bench --backend host --secs 5 --rate 200 --size 1MiB
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};
use tensor_codec::cdr::{Header, Image};
use zcs_bench::{fill_loan, loan_waiting, now_ns};
use zcs_memory::cuda::Kernels;
use zcs_tests::{free_tcp_port, loopback_zenoh_config, parse_size, percentile};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuSession, ZcsConfig, tensor_codec};
use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RmwWire, RosNode};

#[derive(Parser, Debug)]
#[command(about = "a stalled subscriber beside a healthy one: the healthy one's rate and latency (JSON lines)")]
struct Args {
    /// Block memory: auto (a GPU if usable), host or cuda.
    #[arg(long, default_value = "auto", value_parser = ["auto", "host", "cuda"])]
    backend: String,
    /// Message size (e.g. `1MiB`).
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    size: usize,
    /// Messages per second.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Seconds each row publishes.
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Rows to run (default: all).
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,
}

const ROWS: [&str; 7] = [
    "plain-alone",
    "plain-beside-reader",
    "plain-beside-stalled",
    "ros-alone",
    "ros-beside-reader",
    "ros-beside-stalled-keep-last",
    "ros-beside-stalled-keep-all",
];

/// Who shares the healthy subscriber's key or topic.
#[derive(Clone, Copy)]
enum Beside {
    Nobody,
    /// A second subscriber that reads (and drops) every message on a thread of its own.
    Reader,
    /// A second subscriber whose application never reads (a ROS 2 one of this QoS).
    Stalled(Qos),
}

/// Runs `row` while, if `reads`, `read_one` is called on a thread of its own until the
/// row is over: the second subscriber that reads.
fn with_reader<T>(reads: bool, read_one: impl Fn() + Sync, row: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        if reads {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    read_one();
                }
            });
        }
        let out = row();
        stop.store(true, Ordering::Relaxed);
        out
    })
}

/// A publisher's session and the subscribers' session, connected over loopback TCP.
fn sessions(device: DeviceChoice) -> (GpuSession, GpuSession) {
    let port = free_tcp_port();
    let cfg = ZcsConfig { device, ..ZcsConfig::default() };
    let open = |listen, connect| GpuSession::open(loopback_zenoh_config(listen, connect, None), cfg.clone()).wait();
    (
        open(Some(port), None).expect("the publisher's session"),
        open(None, Some(port)).expect("the subscribers' session"),
    )
}

/// What the healthy subscriber saw: publish→receive times in µs, one per message.
struct Healthy {
    lat_us: Vec<f64>,
}

impl Healthy {
    /// The row's line: `puts_us` holds each message's (publish, loan) times in µs.
    fn row(mut self, name: &str, args: &Args, puts_us: &[(f64, f64)], extra: Value) -> Value {
        self.lat_us.sort_by(f64::total_cmp);
        // The slowest publish: its sequence number (from 1) and the part of it spent
        // loaning and writing the block.
        let slowest = (puts_us.iter().enumerate()).max_by(|a, b| a.1.0.total_cmp(&b.1.0));
        let slowest = slowest.map(|(i, (_, loan))| json!({"seq": i + 1, "loan_us": loan}));
        let mut puts_us: Vec<f64> = puts_us.iter().map(|p| p.0).collect();
        puts_us.sort_by(f64::total_cmp);
        let puts_us = puts_us.as_slice();
        let p = |v: &[f64], q| if v.is_empty() { f64::NAN } else { percentile(v, q) };
        json!({
            "bench": "stall", "row": name, "size": args.size, "rate": args.rate, "secs": args.secs,
            "healthy_msgs": self.lat_us.len(), "healthy_rate": self.lat_us.len() as f64 / args.secs,
            "p50_us": p(&self.lat_us, 50.0), "p99_us": p(&self.lat_us, 99.0),
            "max_us": self.lat_us.last().copied().unwrap_or(f64::NAN),
            "put_p99_us": p(puts_us, 99.0), "put_max_us": puts_us.last().copied().unwrap_or(f64::NAN),
            "slowest_put": slowest,
            "counters": extra,
        })
    }
}

/// Runs `publish` (which returns the µs it spent loaning and writing the block) at the
/// rate for the row's seconds, with `receive` on a thread of its own until the publisher
/// is done and 1 s has passed; returns each message's (publish, loan) times (µs) and
/// what the receiver saw.
fn drive(
    args: &Args,
    mut publish: impl FnMut(u64) -> f64,
    receive: impl FnOnce(&AtomicBool) -> Healthy + Send,
) -> (Vec<(f64, f64)>, Healthy) {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let receiver = scope.spawn(|| receive(&done));
        let period = Duration::from_secs_f64(1.0 / args.rate);
        let (start, mut puts) = (Instant::now(), Vec::new());
        let mut next = start;
        let mut seq = 0;
        while start.elapsed().as_secs_f64() < args.secs {
            seq += 1;
            let t = Instant::now();
            let loan_us = publish(seq);
            puts.push((t.elapsed().as_secs_f64() * 1e6, loan_us));
            next += period;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        done.store(true, Ordering::Relaxed);
        (puts, receiver.join().expect("the healthy subscriber's thread"))
    })
}

fn latency_us(published_ns: u64) -> f64 {
    now_ns().saturating_sub(published_ns) as f64 / 1e3
}

fn plain_row(args: &Args, device: DeviceChoice, kernels: Option<&Kernels>, beside: Beside, name: &str) -> Value {
    let (p, s) = sessions(device);
    let key = format!("zcs-bench/stall/{}", std::process::id());
    let healthy = s.declare_subscriber(key.clone()).fifo(256).wait().expect("healthy subscriber");
    let second = match beside {
        Beside::Nobody => None,
        _ => Some(s.declare_subscriber(key.clone()).fifo(256).wait().expect("second subscriber")),
    };
    let publisher = p.declare_publisher(key).wait().expect("publisher");
    let want = 1 + usize::from(second.is_some());
    let t = Instant::now();
    while publisher.zero_copy_subscribers() < want {
        assert!(t.elapsed() < Duration::from_secs(30), "subscribers not on the zero-copy path");
        std::thread::sleep(Duration::from_millis(10));
    }
    let read_one = || drop(second.as_ref().map(|x| x.recv_timeout(Duration::from_millis(50))));
    let (puts, seen) = with_reader(matches!(beside, Beside::Reader), read_one, || {
        drive(
            args,
            |seq| {
                let t = Instant::now();
                let mut loan = loan_waiting(&publisher, args.size, Duration::from_secs(30));
                fill_loan(&mut loan, kernels, seq);
                let loan_us = t.elapsed().as_secs_f64() * 1e6;
                publisher.put(loan).expect("put");
                loan_us
            },
            |done| {
                let mut lat_us = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    if let Ok(sample) = healthy.recv_timeout(Duration::from_millis(50)) {
                        lat_us.push(latency_us(sample.info().timestamp_ns));
                    }
                }
                Healthy { lat_us }
            },
        )
    });
    let ps = publisher.stats();
    let counters = json!({
        "second": second.as_ref().map(|x| x.stats()),
        "healthy_lost": healthy.stats().lost,
        "publisher": {"slow_disconnects": ps.slow_disconnects, "lease_waits": ps.lease_waits,
                      "lease_limited": ps.lease_limited, "copies_out": ps.copies_out},
    });
    seen.row(name, args, &puts, counters)
}

fn ros_row(args: &Args, device: DeviceChoice, kernels: Option<&Kernels>, beside: Beside, name: &str) -> Value {
    let (p, s) = sessions(device);
    let domain = 100 + (std::process::id() % 100);
    let options = |n: &str| NodeOptions::new(n).domain(domain).rmw_wire(RmwWire::BufferAware);
    let (talker, listener) =
        (RosNode::new(&p, options("stall_pub")).expect("node"), RosNode::new(&s, options("stall_sub")).expect("node"));
    let qos = Qos::reliable(10);
    let healthy = listener.subscriber::<Image<()>>("/stall", qos).expect("healthy subscription");
    let second = match beside {
        Beside::Nobody => None,
        Beside::Reader => Some(qos),
        Beside::Stalled(q) => Some(q),
    }
    .map(|q| listener.subscriber::<Image<()>>("/stall", q).expect("second subscription"));
    let publisher = talker.publisher::<Image<()>>("/stall", qos).expect("publisher");
    let want = 1 + usize::from(second.is_some());
    let t = Instant::now();
    while publisher.channel().zero_copy_subscribers() < want {
        assert!(t.elapsed() < Duration::from_secs(30), "subscriptions not on the zero-copy path");
        std::thread::sleep(Duration::from_millis(10));
    }
    let width = (args.size / 4) as u32;
    let fields = Image {
        header: Header::default(),
        height: 1,
        width,
        encoding: "rgba8".into(),
        is_bigendian: 0,
        step: width * 4,
        data: (),
    };
    let read_one = || drop(second.as_ref().map(|x| x.recv_timeout(Duration::from_millis(50))));
    let (puts, seen) = with_reader(matches!(beside, Beside::Reader), read_one, || {
        drive(
            args,
            |seq| {
                let t = Instant::now();
                let mut loan = loan_waiting(publisher.channel(), width as usize * 4, Duration::from_secs(30));
                fill_loan(&mut loan, kernels, seq);
                let loan_us = t.elapsed().as_secs_f64() * 1e6;
                publisher.publish(&fields, loan).expect("publish");
                loan_us
            },
            |done| {
                let mut lat_us = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    if let Ok(m) = healthy.recv_timeout(Duration::from_millis(50)) {
                        lat_us.push(latency_us(u64::try_from(m.attachment().timestamp_ns).unwrap_or(0)));
                    }
                }
                Healthy { lat_us }
            },
        )
    });
    let ps = publisher.channel().stats();
    let counters = json!({
        "second": second.as_ref().map(|x| { let st = x.stats(); json!({"dropped_queue_full": st.dropped_queue_full, "queued": st.queued, "channel": st.channel}) }),
        "healthy_lost": healthy.stats().lost,
        "publisher": {"slow_disconnects": ps.slow_disconnects, "lease_waits": ps.lease_waits,
                      "lease_limited": ps.lease_limited, "copies_out": ps.copies_out},
    });
    seen.row(name, args, &puts, counters)
}

fn main() {
    let args = Args::parse();
    // Warnings by default, on stderr; RUST_LOG=zcs_memory=trace, say, times each block made.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(std::io::stderr).try_init();
    let device = match args.backend.as_str() {
        "host" => DeviceChoice::Host,
        "cuda" => DeviceChoice::Cuda,
        _ => DeviceChoice::Auto,
    };
    let probe = sessions(device).0;
    let gpu = probe.gpu();
    let kernels = gpu.as_ref().map(|g| Kernels::load(g).expect("the pattern kernels"));
    println!(
        "{}",
        json!({"bench": "stall-setup", "memory": if gpu.is_some() { "cuda" } else { "host" },
               "gpu": gpu.as_ref().map(|g| g.name().to_owned()), "size": args.size, "rate": args.rate, "secs": args.secs})
    );
    let k = kernels.as_ref();
    let keep_all = Qos::reliable(10).keep_all();
    for name in ROWS.iter().filter(|r| args.rows.is_empty() || args.rows.iter().any(|a| a == *r)) {
        let row = match *name {
            "plain-alone" => plain_row(&args, device, k, Beside::Nobody, name),
            "plain-beside-reader" => plain_row(&args, device, k, Beside::Reader, name),
            "plain-beside-stalled" => plain_row(&args, device, k, Beside::Stalled(keep_all), name),
            "ros-alone" => ros_row(&args, device, k, Beside::Nobody, name),
            "ros-beside-reader" => ros_row(&args, device, k, Beside::Reader, name),
            "ros-beside-stalled-keep-last" => ros_row(&args, device, k, Beside::Stalled(Qos::reliable(10)), name),
            _ => ros_row(&args, device, k, Beside::Stalled(keep_all), name),
        };
        println!("{row}");
    }
}
