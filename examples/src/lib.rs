//! Shared code of the examples: Zenoh flags in the style of `z_pub`/`z_sub`, and the
//! publisher and subscriber loops (used by `z_cuda_pub`, `z_cuda_sub` and `zcs_demo`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_memory::cuda::{DeviceBlock, Kernels};
use zenoh_cuda_shm::{GpuSample, GpuSession, Path, RecvError, ZcsConfig};

/// Zenoh connection flags, as in Zenoh's examples.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Zenoh mode: peer, client or router.
    #[arg(short, long, default_value = "peer", value_parser = ["peer", "client", "router"])]
    pub mode: String,
    /// Endpoints to connect to (e.g. tcp/127.0.0.1:7447).
    #[arg(short = 'e', long)]
    pub connect: Vec<String>,
    /// Endpoints to listen on.
    #[arg(short, long)]
    pub listen: Vec<String>,
    /// Disable multicast scouting (use with --connect/--listen).
    #[arg(long)]
    pub no_multicast_scouting: bool,
    /// A Zenoh JSON5 configuration file.
    #[arg(short, long)]
    pub config: Option<String>,
    /// A zenoh-cuda-shm JSON5 configuration file (see examples/config.json5).
    #[arg(long)]
    pub zcs_config: Option<String>,
    /// Block memory: auto (GPU if usable), host or cuda.
    #[arg(long, value_parser = ["auto", "host", "cuda"])]
    pub device: Option<String>,
}

fn json_list(v: &[String]) -> String {
    format!("[{}]", v.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(","))
}

/// Zenoh's message in an error, without what only its developers need: the Debug
/// wrapping of a JSON5 error (`Json5Err(Message { msg: "…", … })`) and the source
/// location Zenoh appends (` at …/config.rs:86.`).
pub fn plain_error(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let mut text = match text.split_once("msg: \"") {
        // The message inside the Debug form, up to its closing quote.
        Some((_, rest)) => rest.split_once("\", ").map_or(rest, |(m, _)| m).replace("\\\"", "\""),
        None => text,
    };
    if let Some(at) = text.rfind(" at ")
        && text[at..].contains(".rs:")
    {
        text.truncate(at);
    }
    text.trim_end_matches('.').to_owned()
}

/// Checks a key given with `flag`: a Zenoh key expression, named in the error.
pub fn check_key(flag: &str, key: &str) -> Result<(), String> {
    zenoh::key_expr::KeyExpr::try_from(key).map(drop).map_err(|e| {
        let hint = if key.starts_with('/') { " (Zenoh keys do not start with '/')" } else { "" };
        format!("{flag} '{key}' is not a Zenoh key expression{hint}: {}", plain_error(&e))
    })
}

/// The Zenoh configuration file given with `-c`, with errors that name the flag.
fn zenoh_config_file(f: &str) -> Result<zenoh::Config, String> {
    if let Err(e) = std::fs::metadata(f) {
        return Err(format!("-c/--config {f}: cannot read it: {e}"));
    }
    zenoh::Config::from_file(f).map_err(|e| {
        // Our own configuration given where Zenoh's is expected: say which flag it wants.
        if ZcsConfig::from_file(f).is_ok() {
            format!("-c/--config {f} is a zenoh-cuda-shm configuration, not a Zenoh one: pass it with --zcs-config")
        } else {
            format!("-c/--config {f} is not a Zenoh configuration: {}", plain_error(&e))
        }
    })
}

/// Opens the session these flags describe and prints which memory it uses.
pub fn open(args: &CommonArgs) -> Result<GpuSession, Box<dyn std::error::Error + Send + Sync>> {
    let mut z = match &args.config {
        Some(f) => zenoh_config_file(f)?,
        None => zenoh::Config::default(),
    };
    z.insert_json5("mode", &format!("{:?}", args.mode))?;
    if !args.connect.is_empty() {
        z.insert_json5("connect/endpoints", &json_list(&args.connect))?;
    }
    if !args.listen.is_empty() {
        z.insert_json5("listen/endpoints", &json_list(&args.listen))?;
    }
    if args.no_multicast_scouting {
        z.insert_json5("scouting/multicast/enabled", "false")?;
    }
    let mut cfg = match &args.zcs_config {
        Some(f) => ZcsConfig::from_file(f)?,
        None => ZcsConfig::default(),
    }
    .with_env_overrides()?;
    if let Some(d) = &args.device {
        cfg = ZcsConfig::from_json5(&format!("{{ device: {d:?} }}"))
            .map(|c| ZcsConfig { device: c.device, ..cfg.clone() })?;
    }
    let session = with_progress("opening the session (Zenoh, and CUDA where a GPU is found)", || {
        GpuSession::open(z, cfg).wait()
    })?;
    match (session.gpu(), session.host_reason()) {
        (Some(g), _) => println!("[zcs] blocks: cuda-vmm on {} ({})", g.name(), g.uuid()),
        (None, reason) => println!("[zcs] no GPU path ({}); falling back to host-memory blocks", reason.unwrap_or("?")),
    }
    match session.provider() {
        Ok(p) => println!("[zcs] blocks lent by the host provider {:016x}", p.id),
        Err(why) => println!("[zcs] blocks allocated in this process ({why})"),
    }
    Ok(session)
}

/// Flags of the publisher example.
#[derive(Args, Debug, Clone)]
pub struct PubArgs {
    /// Key to publish on.
    #[arg(short, long, default_value = "demo/zcs/frame")]
    pub key: String,
    /// Payload size in bytes.
    #[arg(short, long, default_value_t = 8 << 20)]
    pub size: usize,
    /// Messages per second (0: as fast as possible).
    #[arg(short, long, default_value_t = 10.0)]
    pub rate: f64,
    /// Messages to publish (0: forever).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub count: u64,
    /// Wait for this many subscribers on the zero-copy path (or 30 s) before starting.
    #[arg(long, default_value_t = 0)]
    pub wait_zero_copy: usize,
}

/// Publishes frames filled with a pattern that depends on the sequence number.
pub fn run_pub(common: &CommonArgs, args: &PubArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    check_key("-k/--key", &args.key)?;
    catch_interrupt();
    let session = open(common)?;
    let publisher = session.declare_publisher(args.key.clone()).wait()?;
    println!("[zcs] publishing {} bytes on '{}' ({})", args.size, args.key, publisher.backend());
    let kernels = match session.gpu() {
        Some(g) => Some(with_progress("loading the CUDA kernels", || Kernels::load(g))?),
        None => None,
    };
    let t = Instant::now();
    while publisher.zero_copy_subscribers() < args.wait_zero_copy
        && t.elapsed() < Duration::from_secs(30)
        && !interrupted()
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let period = if args.rate > 0.0 { Duration::from_secs_f64(1.0 / args.rate) } else { Duration::ZERO };
    let mut next = Instant::now();
    let mut last_report = Instant::now();
    let mut sent_bytes = 0u64;
    let (mut n, mut sent) = (0u64, 0u64);
    // Time in loan and put this interval: where a slow subscriber holds the loop back.
    let mut waited = Duration::ZERO;
    while (args.count == 0 || n < args.count) && !interrupted() {
        let loaning = Instant::now();
        let mut loan = publisher.loan(args.size)?;
        waited += loaning.elapsed();
        let seed = n + 1; // the seq this message will carry
        match (&kernels, loan.device_ptr()) {
            // SAFETY: the loan owns ≥ size mapped bytes until `put`, which orders the
            // ready signal after this launch on the loan's stream.
            (Some(k), Some(ptr)) => unsafe { k.fill(loan.stream().expect("CUDA loan"), ptr, args.size as u64, seed) }?,
            _ => fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seed),
        }
        let putting = Instant::now();
        let report = publisher.put(loan)?;
        waited += putting.elapsed();
        debug_assert_eq!(report.seq, seed);
        (n, sent) = (n + 1, sent + 1);
        sent_bytes += args.size as u64;
        if last_report.elapsed() >= Duration::from_secs(1) || (args.count != 0 && n == args.count) {
            let s = publisher.stats();
            let secs = last_report.elapsed().as_secs_f64();
            if let Some(line) = held_back(args.rate, sent, last_report.elapsed(), waited, &publisher.holders()) {
                println!("{line}");
            }
            println!(
                "[pub] {n} msgs  {:.1} MB/s  zero-copy subscribers: {}  aware: {}  plain listeners: {}  copies out: {}",
                sent_bytes as f64 / secs / 1e6,
                publisher.zero_copy_subscribers(),
                publisher.aware_subscribers(),
                publisher.plain_subscribers(),
                s.copies_out
            );
            (sent_bytes, sent, waited) = (0, 0, Duration::ZERO);
            last_report = Instant::now();
        }
        if !period.is_zero() {
            next += period;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
    }
    let s = publisher.stats();
    let how = if interrupted() { "interrupted" } else { "done" };
    let copies = if session.gpu().is_some() { "device->host copies out" } else { "block->bytes copies out" };
    println!("[pub] {how}: {n} messages; {copies}: {}", s.copies_out);
    // Give subscribers a moment to finish reading before the publisher goes away.
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// Flags of the subscriber example.
#[derive(Args, Debug, Clone)]
pub struct SubArgs {
    /// Key expression to subscribe to.
    #[arg(short, long, default_value = "demo/zcs/frame")]
    pub key: String,
    /// Messages to receive before exiting (0: forever).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub count: u64,
    /// Do not check each payload against the publisher's pattern.
    #[arg(long)]
    pub no_check: bool,
    /// Give up after this many seconds without a message (0: never).
    #[arg(long, default_value_t = 0)]
    pub idle_timeout: u64,
}

/// Checks device samples against the pattern on the GPU: its stream, kernels and counter
/// made once, not per message.
pub struct DeviceChecker {
    stream: zenoh_cuda_shm::cuda::Stream,
    kernels: Kernels,
    counter: DeviceBlock,
}

impl DeviceChecker {
    /// Loads the kernels (saying so if that takes a while) on `gpu`.
    pub fn new(gpu: &zenoh_cuda_shm::cuda::Gpu) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let kernels = with_progress("loading the CUDA kernels", || Kernels::load(gpu))?;
        Ok(Self { stream: gpu.new_stream()?, kernels, counter: DeviceBlock::allocate(gpu, 4)? })
    }

    /// The number of the sample's bytes that differ from the pattern of `seed`, read on
    /// the checker's stream after the publisher's ready signal.
    pub fn mismatches(&self, sample: &GpuSample, seed: u64) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
        let read = sample.read(&self.stream)?;
        // SAFETY: the read range is mapped and held by `sample` until `end`.
        let bad = unsafe {
            self.kernels.count_mismatches(&self.stream, read.device_ptr(), read.len() as u64, seed, &self.counter)
        }?;
        read.end()?;
        Ok(bad)
    }
}

/// Receives frames, checks every byte, and reports the path each publisher uses.
pub fn run_sub(common: &CommonArgs, args: &SubArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    check_key("-k/--key", &args.key)?;
    catch_interrupt();
    let session = open(common)?;
    let subscriber = session.declare_subscriber(args.key.clone()).wait()?;
    println!("[zcs] subscribed to '{}'", args.key);
    let checker = session.gpu().map(DeviceChecker::new).transpose()?;
    let mut paths: HashMap<u64, Path> = HashMap::new();
    let (mut n, mut bad, mut bytes) = (0u64, 0u64, 0u64);
    let mut lat_us: Vec<f64> = Vec::new();
    let mut last_report = Instant::now();
    let idle = (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout));
    let mut waiting = WaitingNotice::new();
    let verb = if args.no_check { "read" } else { "checked" };
    // Why the loop ended early, reported after the summary.
    let mut failed: Option<String> = None;
    while args.count == 0 || n < args.count {
        let recv = |t| {
            let r = subscriber.recv_timeout(t);
            if r.is_err() && waiting.due(n) {
                println!("{}", waiting.line("sub", &format!("'{}'", args.key)));
                // Only before a first message: after one, the key was right.
                if let Some(hint) = (n == 0).then(|| publishers_elsewhere(&session, &args.key)).flatten() {
                    println!("{hint}");
                }
            }
            r
        };
        let sample = match next_or_interrupt(idle, recv, |e| *e == RecvError::Timeout) {
            Ok(Some(s)) => s,
            Ok(None) => break,
            Err(e) => {
                failed = Some(ended_early(&e, n, args.idle_timeout));
                break;
            }
        };
        let info = sample.info();
        if info.timestamp_ns > 0 {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
            lat_us.push(now.saturating_sub(info.timestamp_ns) as f64 / 1e3);
        }
        if paths.insert(info.publisher, info.path) != Some(info.path) {
            match subscriber.path_reason(info) {
                Some(why) => println!("[zcs] publisher {:016x}: path {} ({why})", info.publisher, info.path),
                None => println!("[zcs] publisher {:016x}: path {}", info.publisher, info.path),
            }
        }
        let ok = if args.no_check {
            true
        } else if let Some(host) = sample.host_bytes() {
            check_pattern(&host, 0, info.seq).is_none()
        } else {
            checker.as_ref().ok_or("a device sample without a GPU")?.mismatches(&sample, info.seq)? == 0
        };
        if !ok {
            bad += 1;
            eprintln!("[sub] message {} from {:016x}: CONTENT MISMATCH", info.seq, info.publisher);
        }
        n += 1;
        bytes += sample.len() as u64;
        drop(sample);
        if last_report.elapsed() >= Duration::from_secs(1) || (args.count != 0 && n == args.count) {
            lat_us.sort_by(f64::total_cmp);
            let p = |q| percentile(&lat_us, q);
            let s = subscriber.stats();
            println!(
                "[sub] {n} msgs {verb}{}  {:.1} MB/s  publish->receive p50 {:.0} us p99 {:.0} us  zero-copy {}  cpu-bytes {}  inline {}  plain {}  bad {bad}",
                Received::of(&s, n).behind(),
                bytes as f64 / last_report.elapsed().as_secs_f64() / 1e6,
                p(0.5).unwrap_or(f64::NAN),
                p(0.99).unwrap_or(f64::NAN),
                s.zero_copy,
                s.cpu_bytes,
                s.inline,
                s.plain
            );
            bytes = 0;
            lat_us.clear();
            last_report = Instant::now();
        }
    }
    let s = subscriber.stats();
    let how = if interrupted() {
        "interrupted"
    } else if failed.is_some() {
        "stopped"
    } else {
        "done"
    };
    let r = Received::of(&s, n);
    println!(
        "[sub] {how}: {n} messages {verb} of {} received (zero-copy {}, cpu-bytes {}, inline {}, plain {}){}; lost {}, duplicates dropped {}",
        r.received,
        s.zero_copy,
        s.cpu_bytes,
        s.inline,
        s.plain,
        r.unread_text(),
        s.lost,
        s.duplicates
    );
    if bad > 0 {
        return Err(format!("{bad} of {n} messages had wrong content").into());
    }
    if let Some(why) = failed {
        return Err(why.into());
    }
    // Nothing received, nothing checked: not worth a line that reads as a success.
    if !args.no_check && n > 0 {
        println!("[sub] every byte checked");
    }
    Ok(())
}

/// The `q` quantile (0..=1) of sorted values, nearest rank below; `None` when empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    sorted.get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1))).copied()
}

/// `{"p50":…,"p99":…}` of publish→receive times in µs, for a summary line (`null`s
/// when no message carried a source timestamp). Sorts `lat_us`.
pub fn latency_json(lat_us: &mut [f64]) -> String {
    lat_us.sort_by(f64::total_cmp);
    let f = |q| percentile(lat_us, q).map_or("null".to_string(), |v| format!("{v:.1}"));
    format!("{{\"p50\":{},\"p99\":{}}}", f(0.5), f(0.99))
}

/// Runs `step`; if it takes longer than a second, says so while it runs and how long it
/// took once done (starting CUDA, or the driver compiling the kernels on first use, can
/// take seconds on a busy or freshly booted machine, with nothing else on the screen).
pub fn with_progress<T>(what: &str, step: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let watcher = scope.spawn(move || {
            let slow = finished.recv_timeout(Duration::from_secs(1)).is_err();
            if slow {
                println!("[zcs] {what}… (still working)");
            }
            slow
        });
        let out = step();
        let _ = done.send(());
        if watcher.join().unwrap_or(false) {
            println!("[zcs] {what}: done in {:.1} s", started.elapsed().as_secs_f64());
        }
        out
    })
}

/// How long a subscriber goes without its first message before it says that it waits.
pub const WAITING_NOTICE: Duration = Duration::from_secs(2);

/// How long a subscriber that has received messages goes without one before it says so.
pub const SILENCE_NOTICE: Duration = Duration::from_secs(5);

/// Says when a subscriber receives nothing: [`WaitingNotice::due`] is true once
/// [`WAITING_NOTICE`] after its creation with no message received, and once in each
/// silence of [`SILENCE_NOTICE`] after messages (a publisher stopped or went away).
#[derive(Debug)]
pub struct WaitingNotice {
    /// The creation, or the first time a new count of messages was seen.
    since: Instant,
    /// The count of messages seen at `since`.
    seen: u64,
    /// Whether this silence was told already.
    said: bool,
}

impl Default for WaitingNotice {
    fn default() -> Self {
        Self::new()
    }
}

impl WaitingNotice {
    /// Starts the wait now.
    pub fn new() -> Self {
        Self { since: Instant::now(), seen: 0, said: false }
    }

    /// Whether to say now that nothing comes, `received` messages having arrived so far.
    pub fn due(&mut self, received: u64) -> bool {
        self.due_at(received, Instant::now())
    }

    fn due_at(&mut self, received: u64, now: Instant) -> bool {
        if received != self.seen {
            (self.seen, self.since, self.said) = (received, now, false);
        }
        let after = if received == 0 { WAITING_NOTICE } else { SILENCE_NOTICE };
        if self.said || now.saturating_duration_since(self.since) < after {
            return false;
        }
        self.said = true;
        true
    }

    /// The line to print for a subscriber `who` of `what` (a quoted key or a topic).
    pub fn line(&self, who: &str, what: &str) -> String {
        match self.seen {
            0 => format!("[{who}] waiting for a publisher on {what}…"),
            n => format!(
                "[{who}] nothing for {} s after {n} messages; waiting for a publisher on {what}…",
                SILENCE_NOTICE.as_secs()
            ),
        }
    }
}

/// What a subscriber of `key` that hears nothing can learn of the graph: the keys of
/// this library's publishers its session sees that `key` does not match (a mistyped
/// key, say). `None` when there are none, or they cannot be asked for.
pub fn publishers_elsewhere(session: &GpuSession, key: &str) -> Option<String> {
    let keys = session.other_publisher_keys(key, Duration::from_millis(500)).ok()?;
    let other: Vec<String> = keys.iter().map(|k| format!("'{k}'")).collect();
    (!other.is_empty()).then(|| {
        format!("[sub] publishers seen on other keys: {} (plain Zenoh publishers are not listed)", other.join(", "))
    })
}

/// Why a subscriber's loop ended before its count: a receive error, or `--idle-timeout`
/// seconds without a message (`idle_timeout`).
pub fn ended_early(e: &RecvError, received: u64, idle_timeout: u64) -> String {
    match e {
        RecvError::Timeout => format!("no message for {idle_timeout} s (--idle-timeout), after {received} messages"),
        e => format!("after {received} messages: {e}"),
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Makes Ctrl-C (SIGINT) and `kill` (SIGTERM) end the example's loop, which then prints
/// its summary, rather than kill the process mid-line. A second one of the same signal
/// kills it as usual.
pub fn catch_interrupt() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action =
        SigAction::new(SigHandler::Handler(on_interrupt), SaFlags::SA_RESETHAND | SaFlags::SA_RESTART, SigSet::empty());
    for (signal, what) in [(Signal::SIGINT, "Ctrl-C (SIGINT)"), (Signal::SIGTERM, "SIGTERM")] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        if let Err(e) = unsafe { sigaction(signal, &action) } {
            eprintln!("[zcs] cannot catch {what} ({e}); it ends the process without a summary");
        }
    }
}

/// Whether SIGINT or SIGTERM arrived since [`catch_interrupt`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// How often a waiting receive looks at [`interrupted`].
const INTERRUPT_POLL: Duration = Duration::from_millis(100);

/// Waits for the next message with `recv_timeout`, in slices that notice Ctrl-C:
/// `Ok(None)` once interrupted, `Err` on any error but a timeout, or once `idle` (if
/// given) has passed without a message.
pub fn next_or_interrupt<T, E: std::fmt::Display>(
    idle: Option<Duration>,
    mut recv_timeout: impl FnMut(Duration) -> Result<T, E>,
    is_timeout: impl Fn(&E) -> bool,
) -> Result<Option<T>, E> {
    let t = Instant::now();
    loop {
        if interrupted() {
            return Ok(None);
        }
        let slice = idle.map_or(INTERRUPT_POLL, |i| i.saturating_sub(t.elapsed()).min(INTERRUPT_POLL));
        match recv_timeout(slice) {
            Ok(v) => return Ok(Some(v)),
            Err(e) if is_timeout(&e) && idle.is_none_or(|i| t.elapsed() < i) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Ends an example's `main`: on `Err`, prints `error: <error>: <its source>: …` on stderr
/// and returns status 1.
///
/// A `main` that returns the `Result` itself would print the error's `Debug` form
/// (`Error: NoGpu(NoDriver)`), which hides the messages that say what went wrong and what
/// to do about it.
pub fn exit_status(result: Result<(), Box<dyn std::error::Error + Send + Sync>>) -> std::process::ExitCode {
    let Err(error) = result else { return std::process::ExitCode::SUCCESS };
    eprintln!("error: {}", zenoh_cuda_shm::error::chain(error.as_ref()));
    std::process::ExitCode::FAILURE
}

/// Sets up logging from `RUST_LOG` (default: warnings).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
pub mod chatter;
mod progress;
pub mod ros2;

pub use progress::{Received, held_back};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zenoh_errors_lose_their_debug_form_and_source_location() {
        let debug = r#"Json5Err(Message { msg: "unknown variant `clinet`, expected one of `peer`, `client`", location: Some(Location { line: 1, column: 1 }) }) at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zenoh-1.10.2/src/api/config.rs:86."#;
        assert_eq!(plain_error(&debug), "unknown variant `clinet`, expected one of `peer`, `client`");
        assert_eq!(plain_error(&"no such thing at src/a.rs:3."), "no such thing");
        assert_eq!(plain_error(&"look at the key"), "look at the key", "an ordinary ' at ' stays");
    }

    #[test]
    fn a_bad_key_or_config_file_names_its_flag_in_plain_words() {
        let e = check_key("-k/--key", "/demo/frame").unwrap_err();
        assert!(
            e.starts_with("-k/--key '/demo/frame' is not a Zenoh key expression (Zenoh keys do not start with '/'): "),
            "{e}"
        );
        assert!(!e.contains(".rs:"), "{e}");
        check_key("-k/--key", "demo/frame").unwrap();

        let e = zenoh_config_file("/nonexistent/zenoh.json5").unwrap_err();
        assert!(e.starts_with("-c/--config /nonexistent/zenoh.json5: cannot read it: "), "{e}");
        let dir = std::env::temp_dir().join(format!("zcs-examples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.json5");
        std::fs::write(&bad, "{ mode: 'clinet' }").unwrap();
        let e = zenoh_config_file(bad.to_str().unwrap()).unwrap_err();
        assert!(e.contains("is not a Zenoh configuration: ") && e.contains("clinet"), "{e}");
        assert!(!e.contains(".rs:") && !e.contains("Json5Err"), "{e}");
        let ours = dir.join("ours.json5");
        std::fs::write(&ours, "{ device: 'host' }").unwrap();
        let e = zenoh_config_file(ours.to_str().unwrap()).unwrap_err();
        assert!(e.ends_with("pass it with --zcs-config"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_waiting_notice_comes_once_per_silence() {
        let mut w = WaitingNotice::new();
        let t0 = w.since;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(!w.due_at(0, at(1999)), "too early");
        assert!(w.due_at(0, at(2000)));
        assert_eq!(w.line("sub", "'k'"), "[sub] waiting for a publisher on 'k'…");
        assert!(!w.due_at(0, at(9000)), "said once");
        // Messages: quiet while they come, then once after five seconds without one.
        assert!(!w.due_at(3, at(10_000)));
        assert!(!w.due_at(3, at(14_999)));
        assert!(w.due_at(3, at(15_000)));
        assert_eq!(w.line("sub", "'k'"), "[sub] nothing for 5 s after 3 messages; waiting for a publisher on 'k'…");
        assert!(!w.due_at(3, at(60_000)), "said once in this silence");
        assert!(!w.due_at(4, at(61_000)), "a message came");
        assert!(w.due_at(4, at(66_000)), "the next silence is told too");
    }

    #[test]
    fn an_early_end_says_why_in_words() {
        assert_eq!(ended_early(&RecvError::Timeout, 0, 3), "no message for 3 s (--idle-timeout), after 0 messages");
        assert_eq!(ended_early(&RecvError::Closed, 7, 3), "after 7 messages: subscriber closed");
    }

    #[test]
    fn sigterm_ends_the_loop_as_sigint_does() {
        use nix::sys::signal::{Signal, raise};
        // Only this test raises signals in this process; each signal's handler is reset
        // once it has run (SA_RESETHAND), so each is raised once.
        for signal in [Signal::SIGTERM, Signal::SIGINT] {
            INTERRUPTED.store(false, Ordering::Relaxed);
            catch_interrupt();
            raise(signal).unwrap();
            assert!(interrupted(), "{signal} did not end the loop");
        }
        INTERRUPTED.store(false, Ordering::Relaxed);
    }

    #[test]
    fn a_mode_or_device_clap_does_not_know_names_its_flag() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            common: CommonArgs,
        }
        let e = Cli::try_parse_from(["x", "-m", "clinet"]).err().unwrap().to_string();
        assert!(e.contains("'clinet'") && e.contains("--mode") && e.contains("peer, client, router"), "{e}");
        let e = Cli::try_parse_from(["x", "--device", "gpu"]).err().unwrap().to_string();
        assert!(e.contains("'gpu'") && e.contains("--device") && e.contains("auto, host, cuda"), "{e}");
        assert!(Cli::try_parse_from(["x", "-m", "client", "--device", "host"]).is_ok());
    }
}
