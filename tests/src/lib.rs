//! Test support shared by the integration tests and benchmarks: the GPU gate, child
//! processes that re-run the current test binary, watchdogs, and a small message
//! codec for test control traffic.
//!
//! # The GPU gate
//! [`gpu_or_skip`] returns the GPU, or prints `SKIPPED <test>: <reason>` and returns
//! `None` so the test returns early. With `ZCS_REQUIRE_GPU=1` a missing GPU is a
//! failure instead (set it on GPU machines, so a broken driver cannot pass as a skip).
//!
//! # One body, two media
//! [`medium`]: a test body generic over [`Medium`] runs on host memory ([`Host`], CI)
//! and on CUDA ([`Cuda`], the GPU machine), filling and checking payloads with
//! [`Pattern`].

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Serialize, de::DeserializeOwned};
use zcs_wire::ipc::{ControlConn, Frame};
use zenoh_cuda_shm::cuda::Gpu;

pub mod line_peer;
pub mod medium;
pub mod ros;
pub mod rosidl;
pub use medium::{Cuda, Host, Medium, MediumKind, Pattern};

/// Environment variable that turns a missing GPU into a test failure.
pub const REQUIRE_GPU_ENV: &str = "ZCS_REQUIRE_GPU";
/// Environment variable naming the role a re-executed test binary plays.
pub const CHILD_ROLE_ENV: &str = "ZCS_CHILD_ROLE";

/// Whether `ZCS_REQUIRE_GPU` is set to a true value.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The GPU, or `None` after printing `SKIPPED <test>: <reason>`; panics instead when
/// `ZCS_REQUIRE_GPU=1`.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match Gpu::probe() {
        Ok(gpu) => Some(gpu),
        Err(why) if gpu_required() => panic!("{test}: {REQUIRE_GPU_ENV} is set but no usable GPU: {why}"),
        Err(why) => {
            // Written to the real stderr (not `eprintln!`, which the test harness
            // captures and hides for passing tests), so every run shows what it skipped.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
            None
        }
    }
}

/// Makes a missing second GPU (with peer access) a failure of the peer-GPU tests;
/// `scripts/gpu-run.sh` sets it on machines with two GPUs or more.
pub const REQUIRE_PEER_GPUS_ENV: &str = "ZCS_REQUIRE_PEER_GPUS";

/// GPUs 0 and 1 when both are there and 1 can map 0's memory; `None` after printing
/// `SKIPPED <test>: <reason>` (a panic under `ZCS_REQUIRE_PEER_GPUS=1`).
pub fn two_gpus_or_skip(test: &str) -> Option<(Gpu, Gpu)> {
    let required = std::env::var(REQUIRE_PEER_GPUS_ENV).is_ok_and(|v| v == "1");
    let why = match (Gpu::open(0), Gpu::open(1)) {
        (Ok(a), Ok(b)) => match zenoh_cuda_shm::cuda::Topology::probe() {
            Ok(t) if t.can_access(1, 0) => return Some((a, b)),
            Ok(_) => "GPU 1 has no peer access to GPU 0".to_owned(),
            Err(e) => format!("cannot query peer access: {e}"),
        },
        (Err(e), _) | (_, Err(e)) => format!("needs two GPUs with peer access: {e}"),
    };
    if required || (gpu_required() && Gpu::open(1).is_ok()) {
        panic!("{test}: two GPUs with peer access are required: {why}");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    None
}

/// The role this process was started for, if it is a child started by [`spawn_child`].
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ROLE_ENV).ok()
}

/// Re-runs the current test binary as a child process that executes only the test
/// `entry` (an `#[ignore]`d test that dispatches on [`child_role`]), with `role` and
/// extra environment variables. Its stdout/stderr are inherited so its output lands in
/// the test log.
pub fn spawn_child(entry: &str, role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", entry, "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE_ENV, role)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Re-runs the current (non-test) binary as a child with `role` and extra environment
/// variables, for benchmarks and examples that need a second process.
pub fn spawn_child_bin(role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.env(CHILD_ROLE_ENV, role).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child process")
}

/// Polls `f` every 5 ms until it holds; panics, naming `what`, after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for `child` to exit successfully within `timeout`; kills it and panics
/// otherwise.
pub fn wait_child(mut child: Child, what: &str, timeout: Duration) {
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            assert!(status.success(), "{what} exited with {status}");
            return;
        }
        if t.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends a test control message with optional descriptors.
pub fn send_msg<T: Serialize>(conn: &ControlConn, msg: &T, fds: &[std::os::fd::BorrowedFd<'_>]) {
    let bytes = postcard::to_stdvec(msg).expect("encode test message");
    conn.send(&bytes, fds).expect("send test message");
}

/// Receives a test control message and its descriptors.
pub fn recv_msg<T: DeserializeOwned>(conn: &ControlConn, timeout: Duration) -> (T, Frame) {
    let frame = conn.recv(timeout).expect("receive test message");
    let msg = postcard::from_bytes(&frame.bytes).expect("decode test message");
    (msg, frame)
}

/// Percentile of a sorted slice (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// An example program of `zcs-examples` built beside this test binary
/// (`target/<profile>/examples/<name>`; `cargo test --workspace` builds them).
///
/// # Panics
/// When it has not been built.
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile = exe.parent().and_then(std::path::Path::parent).expect("test binary under target/<profile>/deps");
    let path = profile.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first (`cargo build -p zcs-examples --examples`; `cargo test --workspace` builds it)",
        path.display()
    );
    path
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound, then released). Another
/// process could take it in between; on a test machine that is rare enough.
pub fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind an ephemeral TCP port");
    l.local_addr().expect("local_addr").port()
}

/// A Zenoh configuration for tests and benchmarks on one machine: peer mode, multicast
/// scouting off, TCP on 127.0.0.1 only. It listens on `listen` (`None`: an ephemeral
/// port, so gossip can link the peers to each other directly) and connects to
/// `connect`.
///
/// Puts on keys under `block_prefix` — the user keys and our `@zcs` channels below them
/// — use congestion control `Block` instead of Zenoh's default `Drop`, so a test that
/// counts every sequence number measures the library, not Zenoh's drop policy under a
/// momentarily full queue.
pub fn loopback_zenoh_config(listen: Option<u16>, connect: Option<u16>, block_prefix: Option<&str>) -> zenoh::Config {
    let mut c = zenoh::Config::default();
    let mut set = |key: &str, value: String| {
        c.insert_json5(key, &value).unwrap_or_else(|e| panic!("zenoh config {key} = {value}: {e}"));
    };
    set("mode", "\"peer\"".into());
    set("scouting/multicast/enabled", "false".into());
    set("listen/endpoints", format!("[\"tcp/127.0.0.1:{}\"]", listen.unwrap_or(0)));
    if let Some(port) = connect {
        set("connect/endpoints", format!("[\"tcp/127.0.0.1:{port}\"]"));
    }
    if let Some(prefix) = block_prefix {
        set(
            "qos/publication",
            format!(
                "[{{ key_exprs: [\"{prefix}/**\", \"{prefix}/**/@zcs/**\"], config: {{ congestion_control: \"block\" }} }}]"
            ),
        );
    }
    c
}

/// [`loopback_zenoh_config`] with Zenoh's shared memory on (for builds with Zenoh's
/// `shared-memory` feature) and its own copying of large ordinary payloads into SHM off,
/// so that only buffers a process allocated in SHM travel by reference.
pub fn loopback_shm_zenoh_config(
    listen: Option<u16>,
    connect: Option<u16>,
    block_prefix: Option<&str>,
) -> zenoh::Config {
    let mut c = loopback_zenoh_config(listen, connect, block_prefix);
    for (key, value) in [
        ("transport/shared_memory/enabled", "true"),
        ("transport/shared_memory/transport_optimization/enabled", "false"),
    ] {
        c.insert_json5(key, value).unwrap_or_else(|e| panic!("zenoh config {key} = {value}: {e}"));
    }
    c
}

/// Aborts the process if the returned guard is still alive after `limit`: a hung test
/// must fail, not stall CI. Dropping the guard disarms it, so tests that run one after
/// another in a process cannot be aborted by an earlier test's limit.
#[must_use = "the watchdog is disarmed when the guard drops"]
pub fn watchdog_guard(what: &'static str, limit: Duration) -> WatchdogGuard {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("zcs-watchdog".into())
        .spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!("watchdog: {what} still running after {limit:?}; aborting");
                std::process::abort();
            }
        })
        .expect("spawn watchdog");
    WatchdogGuard { _disarm_on_drop: tx }
}

/// Returned by [`watchdog_guard`]; disarms the watchdog when dropped.
pub struct WatchdogGuard {
    _disarm_on_drop: std::sync::mpsc::Sender<()>,
}

/// Lower-case hex of `bytes` (to pass small encoded parameters to a child in its
/// environment).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lower-case or upper-case hex text; `None` if it is not hex.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Parses a byte size for benchmark flags: a number with an optional unit (`B`, `K`/`KiB`,
/// `M`/`MiB`, `G`/`GiB`), e.g. `4KiB`, `32MiB`, `6220800`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?} (use KiB, MiB or GiB)")),
    };
    n.checked_mul(mult).filter(|&b| b > 0).ok_or_else(|| format!("bad size {s:?}"))
}

/// Number of open file descriptors of this process (entries of `/proc/self/fd`), for
/// leak checks.
pub fn open_fd_count() -> std::io::Result<usize> {
    // The directory handle itself is one entry while we iterate; don't count it.
    Ok(std::fs::read_dir("/proc/self/fd")?.count().saturating_sub(1))
}

/// Number of threads of this process (`/proc/self/task`), for leak checks.
pub fn thread_count() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}
