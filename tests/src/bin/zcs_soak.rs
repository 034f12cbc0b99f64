//! Soak: one long-lived publisher and subscriber in this process, with publisher and
//! subscriber processes joining and leaving around them (half of those leaving by
//! SIGKILL), until a message count or a duration is reached. Every few seconds one JSON
//! line reports this process's RSS, descriptors and threads, free device memory (CUDA),
//! the publisher's pool and the traffic so far; the last line is a summary with the
//! growth of each figure between the first and last sample after warm-up.
//!
//! ```text
//! zcs_soak [--backend host|cuda] [--messages N] [--secs S] [--sample-secs S] [--len BYTES]
//!          [--churn-ms MS] [--churn ours|ours-pub|ours-sub|zenoh|zenoh-topic|zenoh-keys|none]
//! ```
//! Defaults: host, 1,000,000 messages or 1800 s (whichever comes first), a sample every
//! 10 s, 128 KiB messages, a process joins or leaves every 300 ms.
//!
//! `--churn` says what the joining processes are: `ours` (default) the publishers and
//! subscribers above (one in three a publisher), `ours-pub` or `ours-sub` only one of
//! the two; `zenoh` plain Zenoh peers that only open a session and declare a subscriber
//! on an unrelated key (the Zenoh-level cost of peers coming and going, without any of
//! this crate's work); `zenoh-topic` the same peers subscribing to the soak's topic,
//! which the long-lived subscriber listens on too (the Zenoh-level cost of subscribers
//! of a shared key coming and going); `zenoh-keys` plain Zenoh peers that declare what
//! ours declare at the Zenoh level, on keys of the same shape: a liveliness token and a
//! subscriber on keys that carry a per-process id, and a liveliness subscriber with
//! history (the cost of Zenoh's per-key state for keys that are never seen again);
//! `none` no processes at all. Comparing the RSS curves tells what a growth comes from.
//! Each sample also reports the allocator's view (glibc `mallinfo2`): bytes the heap
//! has in use and bytes it holds from the kernel, which separates retained objects from
//! fragmentation; the summary adds RSS after `malloc_trim(0)`.
//!
//! Every message the long-lived subscriber receives from the long-lived publisher must
//! be the next sequence number; its first and last 4 KiB are checked on every message
//! and every byte on every 64th (a full check of a million messages would measure the
//! checker). Samples from the churning publishers are checked the same way. Any
//! mismatch ends the run with exit code 1.

use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::{Kernels, check_pattern, fill_pattern};
use zcs_tests::{child_role, free_tcp_port, loopback_zenoh_config, spawn_child_bin};
use zcs_tests::{open_fd_count, thread_count};
use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuLoan, GpuPublisher, GpuSample, GpuSession, GpuSubscriber, ReadError, ZcsConfig};

const KEY_ROOT: &str = "zcs-soak";
const PORT_ENV: &str = "ZCS_SOAK_PORT";
const KEY_ENV: &str = "ZCS_SOAK_KEY";
const BACKEND_ENV: &str = "ZCS_SOAK_BACKEND";
const LEN_ENV: &str = "ZCS_SOAK_LEN";
const LIFE_ENV: &str = "ZCS_SOAK_LIFE_MS";
/// Bytes checked at each end of every message.
const EDGE: usize = 4096;

struct Args {
    cuda: bool,
    messages: u64,
    secs: u64,
    sample_secs: u64,
    len: usize,
    churn_ms: u64,
    churn: Churn,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Churn {
    Ours,
    OursPub,
    OursSub,
    Zenoh,
    ZenohTopic,
    ZenohKeys,
    None,
}

impl Churn {
    const ALL: [Churn; 7] =
        [Churn::Ours, Churn::OursPub, Churn::OursSub, Churn::Zenoh, Churn::ZenohTopic, Churn::ZenohKeys, Churn::None];

    fn name(self) -> &'static str {
        match self {
            Churn::Ours => "ours",
            Churn::OursPub => "ours-pub",
            Churn::OursSub => "ours-sub",
            Churn::Zenoh => "zenoh",
            Churn::ZenohTopic => "zenoh-topic",
            Churn::ZenohKeys => "zenoh-keys",
            Churn::None => "none",
        }
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        cuda: false,
        messages: 1_000_000,
        secs: 1800,
        sample_secs: 10,
        len: 128 * 1024,
        churn_ms: 300,
        churn: Churn::Ours,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--backend" => {
                a.cuda = match value()?.as_str() {
                    "cuda" => true,
                    "host" => false,
                    other => return Err(format!("unknown backend {other} (host or cuda)")),
                }
            }
            "--messages" => a.messages = num(value()?)?,
            "--secs" => a.secs = num(value()?)?,
            "--sample-secs" => a.sample_secs = num(value()?)?.max(1),
            "--len" => a.len = zcs_tests::parse_size(&value()?)?,
            "--churn-ms" => a.churn_ms = num(value()?)?.max(10),
            "--churn" => {
                let v = value()?;
                a.churn = Churn::ALL.into_iter().find(|c| c.name() == v).ok_or_else(|| {
                    let names: Vec<&str> = Churn::ALL.iter().map(|c| c.name()).collect();
                    format!("unknown churn {v} ({})", names.join(", "))
                })?;
            }
            "-h" | "--help" => {
                return Err("usage: zcs_soak [--backend host|cuda] [--messages N] [--secs S] [--sample-secs S] \
                            [--len BYTES] [--churn-ms MS] [--churn ours|ours-pub|ours-sub|zenoh|zenoh-topic|zenoh-keys|none]"
                    .into());
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.len <= 64 * 1024 {
        return Err("--len must exceed the 64 KiB inline threshold (the soak is about blocks)".into());
    }
    Ok(a)
}

fn session(cuda: bool, port: u16, listen: bool) -> GpuSession {
    let (l, c) = if listen { (Some(port), None) } else { (None, Some(port)) };
    let device = if cuda { DeviceChoice::Cuda } else { DeviceChoice::Host };
    GpuSession::open(loopback_zenoh_config(l, c, Some(KEY_ROOT)), ZcsConfig { device, ..Default::default() })
        .wait()
        .unwrap_or_else(|e| panic!("open session: {e}"))
}

/// Fills a loan with the pattern of `seed`: the fill kernel for CUDA, the CPU for host.
fn fill(kernels: Option<&Kernels>, loan: &mut GpuLoan, seed: u64) {
    match kernels {
        Some(k) => {
            let (ptr, len) = (loan.device_ptr().expect("CUDA loan"), loan.len() as u64);
            let stream = loan.stream().expect("CUDA loan");
            // SAFETY: the loan owns ≥ len mapped bytes until `put`, which orders the ready
            // signal after this launch on the loan's stream.
            unsafe { k.fill(stream, ptr, len, seed) }.expect("fill kernel");
        }
        None => fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seed),
    }
}

fn publish(p: &GpuPublisher, kernels: Option<&Kernels>, len: usize, seq: u64) -> bool {
    match p.loan(len) {
        Ok(mut loan) => {
            fill(kernels, &mut loan, seq);
            p.put(loan).is_ok()
        }
        Err(_) => false,
    }
}

/// Checks a sample's bytes against the pattern of its sequence number: both edges
/// always, everything when `full`. A read refused because its publisher died before
/// the ready signal is not data and passes.
fn check(s: &GpuSample, full: bool) -> Result<(), String> {
    let seq = s.info().seq;
    let bytes = match s.to_vec() {
        Ok(b) => b,
        Err(ReadError::PublisherDied) => return Ok(()),
        Err(e) => return Err(format!("seq {seq}: read failed: {e}")),
    };
    let ranges: Vec<(usize, usize)> = if full || bytes.len() <= 2 * EDGE {
        vec![(0, bytes.len())]
    } else {
        vec![(0, EDGE), (bytes.len() - EDGE, bytes.len())]
    };
    for (a, b) in ranges {
        if let Some((first, bad)) = check_pattern(&bytes[a..b], a as u64, seq) {
            return Err(format!("seq {seq}: {bad} wrong bytes from offset {}", a as u64 + first));
        }
    }
    Ok(())
}

/// A `kB` line of `/proc/self/status`.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// The allocator's view of this process: (bytes in use, bytes held from the kernel), in
/// KiB, both counting large `mmap`ed chunks.
fn heap_kib() -> (u64, u64) {
    // SAFETY: mallinfo2 only reads the allocator's counters (under its own locks) and
    // returns them by value.
    let m = unsafe { libc::mallinfo2() };
    (((m.uordblks + m.hblkhd) >> 10) as u64, ((m.arena + m.hblkhd) >> 10) as u64)
}

#[derive(Clone, Copy)]
struct Sample {
    t: f64,
    messages: u64,
    rss_kib: u64,
    /// Resident anonymous memory: heaps, stacks, Zenoh's buffers.
    rss_anon_kib: u64,
    /// Resident shared memory: the pool's host blocks mapped here.
    rss_shmem_kib: u64,
    heap_used_kib: u64,
    heap_held_kib: u64,
    fds: usize,
    threads: usize,
    gpu_free_mib: Option<u64>,
    pool_blocks: usize,
    pool_mib: f64,
    /// GPU-aware subscribers the long-lived publisher knows (from their tokens).
    aware_subscribers: usize,
    /// Publishers the long-lived subscriber knows.
    known_publishers: usize,
    in_use: usize,
    joined: u64,
    killed: u64,
}

impl Sample {
    fn json(&self) -> String {
        format!(
            "{{\"t_s\":{:.1},\"messages\":{},\"rss_kib\":{},\"rss_anon_kib\":{},\"rss_shmem_kib\":{},\"heap_used_kib\":{},\"heap_held_kib\":{},\"fds\":{},\"threads\":{},\"gpu_free_mib\":{},\
             \"pool_blocks\":{},\"pool_mib\":{:.1},\"aware_subscribers\":{},\"known_publishers\":{},\"blocks_in_use\":{},\"processes_joined\":{},\"processes_killed\":{}}}",
            self.t,
            self.messages,
            self.rss_kib,
            self.rss_anon_kib,
            self.rss_shmem_kib,
            self.heap_used_kib,
            self.heap_held_kib,
            self.fds,
            self.threads,
            self.gpu_free_mib.map_or("null".to_owned(), |v| v.to_string()),
            self.pool_blocks,
            self.pool_mib,
            self.aware_subscribers,
            self.known_publishers,
            self.in_use,
            self.joined,
            self.killed
        )
    }
}

fn main() {
    if let Some(role) = child_role() {
        child(&role);
        return;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let port = free_tcp_port();
    // The long-lived publisher on `<key>/main`, churning ones on `<key>/churn`; every
    // subscriber listens on `<key>/*`.
    let key = format!("{KEY_ROOT}/{}", std::process::id());
    let main_key = format!("{key}/main");
    let pub_session = session(args.cuda, port, true);
    let publisher = pub_session.declare_publisher(main_key.clone()).wait().expect("publisher");
    let sub_session = session(args.cuda, port, false);
    let sub: Arc<GpuSubscriber<flume::Receiver<GpuSample>>> =
        Arc::new(sub_session.declare_subscriber(format!("{key}/*")).wait().expect("subscriber"));
    let kernels = pub_session.gpu().map(|g| Kernels::load(g).expect("load kernels"));
    // With `zenoh-keys`, this process watches the churning peers' tokens as our
    // publisher watches our subscribers' tokens: with a callback, as ours do (a default
    // FIFO handler that nobody drains fills up, then blocks the session's receive path).
    let _watch_keys = (args.churn == Churn::ZenohKeys).then(|| {
        let root = format!("@{KEY_ROOT}/v1");
        let watch = pub_session.zenoh().liveliness().declare_subscriber(format!("{root}/sub/**"));
        watch.history(true).callback(|_| {}).wait().expect("watch")
    });

    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let (stop2, received2, failed2, sub2) =
        (Arc::clone(&stop), Arc::clone(&received), Arc::clone(&failed), Arc::clone(&sub));
    let checker = std::thread::spawn(move || {
        let mut last_main = 0u64;
        let mut n = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            let Ok(s) = sub2.recv_timeout(Duration::from_millis(50)) else { continue };
            n += 1;
            let info = s.info();
            if info.key == main_key {
                if info.seq != last_main + 1 {
                    eprintln!("soak: long-lived publisher: seq {} after {last_main}", info.seq);
                    failed2.store(true, Ordering::Relaxed);
                }
                last_main = info.seq;
            }
            if let Err(e) = check(&s, n.is_multiple_of(64)) {
                eprintln!("soak: {e}");
                failed2.store(true, Ordering::Relaxed);
            }
            received2.store(n, Ordering::Relaxed);
        }
    });
    // Wait for the long-lived subscriber before counting.
    let t0 = Instant::now();
    while publisher.zero_copy_subscribers() < 1 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }

    let (stop3, len, cuda) = (Arc::clone(&stop), args.len, args.cuda);
    let joined = Arc::new(AtomicU64::new(0));
    let killed = Arc::new(AtomicU64::new(0));
    // Churning processes that exited with an error status (a subscriber child exits with
    // status 1 when a sample's bytes were not written for it).
    let child_failures = Arc::new(AtomicU64::new(0));
    let (joined2, killed2, key2, churn_ms) = (Arc::clone(&joined), Arc::clone(&killed), key.clone(), args.churn_ms);
    let what = args.churn;
    let (failures2, failed2) = (Arc::clone(&child_failures), Arc::clone(&failed));
    let churn = std::thread::spawn(move || {
        // A child that ended by itself with an error status (not by our SIGKILL).
        let judge = |status: std::io::Result<std::process::ExitStatus>| {
            if let Ok(st) = status
                && st.code().is_some_and(|c| c != 0)
            {
                eprintln!("soak: a churning process failed: {st}");
                failures2.fetch_add(1, Ordering::Relaxed);
                failed2.store(true, Ordering::Relaxed);
            }
        };
        let mut kids: Vec<(Child, Instant, bool)> = Vec::new();
        let mut k = 0u64;
        while what != Churn::None && !stop3.load(Ordering::Relaxed) {
            k += 1;
            let life = 200 + (k * 7919) % 2800;
            let role = match what {
                Churn::Ours if k.is_multiple_of(3) => "pub",
                Churn::Ours | Churn::OursSub => "sub",
                Churn::OursPub => "pub",
                plain => plain.name(),
            };
            let env = [
                (PORT_ENV, port.to_string()),
                (KEY_ENV, key2.clone()),
                (BACKEND_ENV, if cuda { "cuda" } else { "host" }.to_owned()),
                (LEN_ENV, len.to_string()),
                (LIFE_ENV, life.to_string()),
            ];
            kids.push((
                spawn_child_bin(role, &env),
                Instant::now() + Duration::from_millis(life / 2),
                k.is_multiple_of(2),
            ));
            joined2.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(churn_ms));
            kids.retain_mut(|(c, kill_at, kill)| {
                if *kill && Instant::now() >= *kill_at {
                    let _ = c.kill();
                    judge(c.wait());
                    killed2.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                match c.try_wait() {
                    Ok(Some(st)) => {
                        judge(Ok(st));
                        false
                    }
                    _ => true,
                }
            });
        }
        for (mut c, _, _) in kids {
            let _ = c.kill();
            judge(c.wait());
        }
    });

    let start = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = start;
    let mut seq = 0u64;
    let mut refused_loans = 0u64;
    while seq < args.messages && start.elapsed() < Duration::from_secs(args.secs) && !failed.load(Ordering::Relaxed) {
        if Instant::now() >= next_sample {
            let ps = publisher.pool_stats();
            let (heap_used_kib, heap_held_kib) = heap_kib();
            let s = Sample {
                t: start.elapsed().as_secs_f64(),
                messages: seq,
                rss_kib: rss_kib(),
                rss_anon_kib: status_kib("RssAnon:"),
                rss_shmem_kib: status_kib("RssShmem:"),
                heap_used_kib,
                heap_held_kib,
                fds: open_fd_count().unwrap_or(0),
                threads: thread_count().unwrap_or(0),
                gpu_free_mib: pub_session.gpu().and_then(|g| g.mem_info().ok()).map(|(f, _)| (f >> 20) as u64),
                pool_blocks: ps.blocks,
                pool_mib: ps.bytes as f64 / (1 << 20) as f64,
                aware_subscribers: publisher.aware_subscribers(),
                known_publishers: sub.publishers().len(),
                in_use: ps.blocks_in_use,
                joined: joined.load(Ordering::Relaxed),
                killed: killed.load(Ordering::Relaxed),
            };
            println!("{}", s.json());
            samples.push(s);
            next_sample += Duration::from_secs(args.sample_secs);
        }
        if publish(&publisher, kernels.as_ref(), args.len, seq + 1) {
            seq += 1;
        } else {
            refused_loans += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().expect("churn thread");
    checker.join().expect("checker thread");
    let ok = !failed.load(Ordering::Relaxed);
    // Growth after warm-up: from the second sample (the first is before any churn).
    let (first, last) = (samples.get(1).or(samples.first()).copied(), samples.last().copied());
    if let (Some(a), Some(b)) = (first, last) {
        let max_rss = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
        // What of the RSS is free heap the allocator could give back.
        let rss_before_trim = rss_kib();
        // SAFETY: malloc_trim only returns unused heap pages to the kernel.
        unsafe { libc::malloc_trim(0) };
        let rss_trimmed = rss_kib();
        println!(
            "{{\"summary\":true,\"ok\":{ok},\"backend\":\"{}\",\"churn\":\"{}\",\"messages\":{seq},\"received\":{},\"secs\":{:.1},\
             \"msgs_per_s\":{:.0},\"loan_retries\":{refused_loans},\"processes_joined\":{},\"processes_killed\":{},\
             \"child_failures\":{},\"rss_kib_growth\":{},\"rss_kib_max\":{max_rss},\"rss_kib_before_trim\":{rss_before_trim},\
             \"rss_kib_after_trim\":{rss_trimmed},\"rss_anon_kib_growth\":{},\"rss_shmem_kib_growth\":{},\"heap_used_kib_growth\":{},\"heap_held_kib_growth\":{},\"fds_growth\":{},\"threads_growth\":{},\
             \"gpu_free_mib_change\":{},\"pool_blocks_first\":{},\"pool_blocks_last\":{}}}",
            if args.cuda { "cuda" } else { "host" },
            args.churn.name(),
            received.load(Ordering::Relaxed),
            start.elapsed().as_secs_f64(),
            seq as f64 / start.elapsed().as_secs_f64(),
            joined.load(Ordering::Relaxed),
            killed.load(Ordering::Relaxed),
            child_failures.load(Ordering::Relaxed),
            b.rss_kib as i64 - a.rss_kib as i64,
            b.rss_anon_kib as i64 - a.rss_anon_kib as i64,
            b.rss_shmem_kib as i64 - a.rss_shmem_kib as i64,
            b.heap_used_kib as i64 - a.heap_used_kib as i64,
            b.heap_held_kib as i64 - a.heap_held_kib as i64,
            b.fds as i64 - a.fds as i64,
            b.threads as i64 - a.threads as i64,
            match (a.gpu_free_mib, b.gpu_free_mib) {
                (Some(x), Some(y)) => (y as i64 - x as i64).to_string(),
                _ => "null".into(),
            },
            a.pool_blocks,
            b.pool_blocks
        );
    }
    if !ok {
        std::process::exit(1);
    }
}

/// A per-process id: the pid and the clock, mixed.
fn rand_id() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    (t ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A churning process: a subscriber that holds a few samples and checks them, or a
/// publisher; either runs for its life time (unless SIGKILLed first) and exits.
fn child(role: &str) {
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let port: u16 = env(PORT_ENV).parse().expect("port");
    let cuda = env(BACKEND_ENV) == "cuda";
    let len: usize = env(LEN_ENV).parse().expect("len");
    let life = Duration::from_millis(env(LIFE_ENV).parse().expect("life"));
    if role == "zenoh" || role == "zenoh-topic" {
        // A key of its own, or the soak's topic, which the long-lived subscriber also
        // listens on.
        let key = format!("{}/{}", env(KEY_ENV), if role == "zenoh" { "unrelated" } else { "*" });
        let z = zenoh::open(loopback_zenoh_config(None, Some(port), Some(KEY_ROOT))).wait().expect("open zenoh");
        // A callback, not the default FIFO handler: a queue nobody drains fills up and
        // then holds back the session's receive path, and with it the publisher's puts.
        let _sub = z.declare_subscriber(key).callback(|_| {}).wait().expect("subscriber");
        std::thread::sleep(life);
        return;
    }
    if role == "zenoh-keys" {
        // The Zenoh-level declarations of one of our subscribers, on keys of the same
        // shape, outside our token root: a token and a subscriber whose keys carry a
        // per-process id, and a liveliness subscriber with history.
        let z = zenoh::open(loopback_zenoh_config(None, Some(port), Some(KEY_ROOT))).wait().expect("open zenoh");
        let id = format!("{:016x}", rand_id());
        let root = format!("@{KEY_ROOT}/v1");
        let watch = z.liveliness().declare_subscriber(format!("{root}/pub/**"));
        let _watch = watch.history(true).callback(|_| {}).wait().expect("watch");
        let _tok = z.liveliness().declare_token(format!("{root}/sub/{id}/host/0")).wait().expect("token");
        let _sub = z.declare_subscriber(format!("{}/{id}/@zcs/b", env(KEY_ENV))).wait().expect("subscriber");
        std::thread::sleep(life);
        return;
    }
    let s = session(cuda, port, false);
    let t = Instant::now();
    match role {
        "sub" => {
            let sub: GpuSubscriber<flume::Receiver<GpuSample>> =
                s.declare_subscriber(format!("{}/*", env(KEY_ENV))).wait().expect("subscriber");
            let mut held = std::collections::VecDeque::new();
            let mut n = 0u64;
            while t.elapsed() < life {
                if let Ok(sample) = sub.recv_timeout(Duration::from_millis(20)) {
                    n += 1;
                    if let Err(e) = check(&sample, n.is_multiple_of(64)) {
                        eprintln!("soak sub child: {e}");
                        std::process::exit(1);
                    }
                    held.push_back(sample);
                    if held.len() > 4 {
                        held.pop_front();
                    }
                }
            }
        }
        "pub" => {
            let p = s.declare_publisher(format!("{}/churn", env(KEY_ENV))).wait().expect("publisher");
            let kernels = s.gpu().map(|g| Kernels::load(g).expect("load kernels"));
            let mut seq = 0;
            while t.elapsed() < life {
                if publish(&p, kernels.as_ref(), len, seq + 1) {
                    seq += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        other => panic!("unknown role {other}"),
    }
}
