//! Pub/sub between processes where every publisher and subscriber is its own process,
//! run by `pubsub_fanout.rs` on CUDA VMM blocks (the GPU machine) and on host memfd
//! blocks (CI); included with `#[path]`. Each public function is one test's body,
//! generic over the medium it runs on (it returns early where that medium is missing).
//!
//! Each participant is the including test binary re-run as a child (entry test
//! [`ENTRY`], see [`child_entry`]), with its own Zenoh session and, on CUDA, its own
//! context; one child listens on a port the parent picked, the others connect. The
//! parent only orchestrates, over the crate's control socket (`Ctl` messages).
//!
//! Every byte of every message is checked: on CUDA by the check kernel (counting
//! mismatches into a device counter), on host memory on the CPU; a subset also on the
//! CPU after `GpuSample::to_vec`. The pattern depends on the publisher, the sequence
//! number and the relay stage ([`seed`]), and each publisher's messages have lengths of
//! their own ([`msg_len`]), so a misplaced, stale or duplicated block shows up as wrong
//! bytes or a wrong length. Each subscriber asserts that every publisher's sequence
//! numbers arrive exactly as 1..=N, once. Host runs use fewer and smaller messages.

#![allow(dead_code)] // each including binary uses its own subset

use std::collections::HashMap;
use std::process::Child;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use zcs_memory::cuda::kernels::check_pattern;
use zcs_tests::{
    child_role, free_tcp_port, from_hex, loopback_zenoh_config, spawn_child, to_hex, wait_child, watchdog_guard,
};
use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};
use zenoh::Wait;
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, Path, ZcsConfig};

use zcs_tests::{Cuda, Medium, MediumKind, Pattern};

/// The `#[ignore]`d test of the including binary that calls [`child_entry`].
pub const ENTRY: &str = "fanout_child";

const MIB: usize = 1 << 20;
const SOCK_ENV: &str = "ZCS_PS_SOCK";
const PORT_ENV: &str = "ZCS_PS_PORT";
const LISTEN_ENV: &str = "ZCS_PS_LISTEN";
const NAME_ENV: &str = "ZCS_PS_NAME";
const MODE_ENV: &str = "ZCS_PS_MODE";
const PARAMS_ENV: &str = "ZCS_PS_PARAMS";
/// Key prefix of every test key (puts under it use congestion control `Block`).
pub const PREFIX: &str = "zcs-test";
/// Bound on one control message or one sample.
const IO: Duration = Duration::from_secs(60);
/// Bound on route setup (handshakes, declarations).
const SETUP: Duration = Duration::from_secs(20);
/// Most blocks a publisher keeps in use before it loans the next: back-pressure from
/// the publisher's side, so a GPU publisher does not outrun a subscriber that checks
/// every message (at `PoolConfig::max_holds_per_holder`, 64, unreleased samples a put
/// would wait for that subscriber, up to `lease_wait_ms`, and then serve it bytes).
const WINDOW: usize = 16;

/// The bound a SIGKILLed subscriber's blocks are asserted back within: the target on
/// the GPU machine, 1 s in CI, whose two cores are shared with the build (as in
/// `support/crash.rs`).
fn reclaim_limit(mode: MediumKind) -> Duration {
    pick(mode, Duration::from_millis(100), Duration::from_secs(1))
}

/// The tests share the GPU and count the publishers' blocks: one at a time, whatever
/// `--test-threads`.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The pattern seed of message `seq` of publisher `idx` after `stage` relays.
/// The fill pattern uses the low 32 bits, so the fields are packed there.
fn seed(idx: u8, seq: u64, stage: u8) -> u64 {
    seq * 64 + u64::from(idx) * 8 + u64::from(stage)
}

/// The length of message `seq` of publisher `idx`: `sizes` cycled, plus 4 KiB per
/// publisher index, so that each publisher's messages keep a length of their own.
fn msg_len(sizes: &[usize], idx: u8, seq: u64) -> usize {
    sizes[((seq - 1) % sizes.len() as u64) as usize] + usize::from(idx) * 4096
}

fn pick<T>(mode: MediumKind, cuda: T, host: T) -> T {
    match mode {
        MediumKind::Cuda => cuda,
        MediumKind::Host => host,
    }
}

fn test_key(name: &str) -> String {
    format!("{PREFIX}/{name}")
}

/// Liveliness key a plain subscriber declares once its subscriber is declared.
fn plain_ready_key(key: &str) -> String {
    format!("{key}/plain-ready")
}

// ---------------------------------------------------------------------------------
// Control messages and parameters
// ---------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize)]
enum Ctl {
    /// Child → parent, first message (after its Zenoh session is open).
    Hello { name: String },
    /// Publisher → parent: its subscribers are on the expected paths.
    Ready,
    /// Parent → child: go on.
    Go,
    /// Publisher → parent: all messages of the phase are published.
    Published(PubFigures),
    /// Subscriber → parent: all messages received and checked.
    Done(SubFigures),
    /// Parent → child: wrap up (publishers then answer `Report`).
    Finish,
    /// Publisher → parent, after `Finish`: final counters, pool drained.
    Report(PubFigures),
    /// Subscriber → parent: holding `held` samples after receiving `received`.
    Holding { held: u64, received: u64 },
    /// Parent → publisher: wait until only the held blocks are in use.
    Settle,
    /// Publisher → parent: blocks in use now.
    InUse { blocks: u64 },
    /// Parent → child: the peer was SIGKILLed just now.
    Killed,
    /// Publisher → parent: blocks back `us` µs after `Killed` arrived.
    Recovered { us: u64 },
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct PubFigures {
    messages: u64,
    copies_out: u64,
    leases: u64,
    descriptors: u64,
    plain_puts: u64,
    aware_bytes_puts: u64,
    lease_limited: u64,
    fds_pushed: u64,
    fd_handouts: u64,
    fd_denied: u64,
    bad_releases: u64,
    handshakes: u64,
    disconnects: u64,
    allocations: u64,
    blocks_in_use: u64,
    /// Blocks released because their holder's connection ended.
    holder_releases: u64,
    bytes: u64,
    secs: f64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct SubFigures {
    received: u64,
    zero_copy: u64,
    cpu_bytes: u64,
    inline: u64,
    plain: u64,
    bad_descriptors: u64,
    handshakes: u64,
    /// Wrong bytes found by the check of every message: the check kernel (CUDA) or the
    /// CPU (host).
    check_errors: u64,
    cpu_checked: u64,
    cpu_bad: u64,
    duplicates: u64,
    evictions: u64,
    evict_ms: f64,
    bytes: u64,
    secs: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PubParams {
    key: String,
    /// Publisher index (in the seed and the metadata).
    idx: u8,
    /// Messages.
    n: u64,
    /// Payload sizes, cycled.
    sizes: Vec<usize>,
    /// Zero-copy subscribers to wait for before publishing.
    wait_zero_copy: usize,
    /// Liveliness key of a plain subscriber to wait for (else: wait until nobody
    /// listens on the plain key).
    plain_token: Option<String>,
    /// Every put must lease to exactly this many subscribers.
    expect_zero_copy: Option<usize>,
    /// No put may copy bytes out.
    expect_no_copy: bool,
    /// Most blocks in use before loaning the next (0: no limit).
    window: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SubParams {
    key: String,
    /// Publishers (indices 0..pubs).
    pubs: u8,
    /// Messages per publisher.
    n: u64,
    /// The publishers' payload sizes (see [`msg_len`]).
    sizes: Vec<usize>,
    /// Relay stages the data went through.
    stage: u8,
    /// CPU check of messages with `(seq - 1) % cpu_every == 0` (0: none).
    cpu_every: u64,
    /// Read the GPU error counter every this many messages.
    gpu_batch: u64,
    /// Bytes for a sequence number already delivered zero-copy may arrive (they are
    /// dropped and counted as duplicates): when another GPU-aware subscriber of the
    /// key is off the zero-copy path, the bytes it needs reach every aware subscriber.
    allow_duplicates: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct RelayParams {
    input: String,
    output: String,
    /// Stage of the input data (the output is `stage + 1`).
    stage: u8,
    n: u64,
    /// The source's payload sizes.
    sizes: Vec<usize>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct KillParams {
    key: String,
    /// Messages before the kill.
    n1: u64,
    /// Messages after the kill.
    n2: u64,
    /// Samples the victim keeps.
    hold: u64,
    size: usize,
}

fn enc<T: Serialize>(v: &T) -> String {
    to_hex(&postcard::to_stdvec(v).expect("encode params"))
}

fn child_params<T: DeserializeOwned>() -> T {
    let hex = std::env::var(PARAMS_ENV).expect("params in the environment");
    postcard::from_bytes(&from_hex(&hex).expect("hex params")).expect("decode params")
}

fn send(conn: &ControlConn, msg: &Ctl) {
    conn.send(&postcard::to_stdvec(msg).expect("encode control message"), &[]).expect("send control message");
}

fn recv(conn: &ControlConn, who: &str, timeout: Duration) -> Ctl {
    let frame = conn.recv(timeout).unwrap_or_else(|e| panic!("no control message from {who} within {timeout:?}: {e}"));
    postcard::from_bytes(&frame.bytes).expect("decode control message")
}

// ---------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------

/// The parent of one test: its control socket, its children and their connections.
struct Harness {
    test: &'static str,
    mode: MediumKind,
    port: u16,
    listener: ControlListener,
    sock: String,
    children: Vec<(String, Child)>,
    conns: HashMap<String, ControlConn>,
}

impl Harness {
    fn new(test: &'static str, mode: MediumKind) -> Self {
        let name = SocketName::random_abstract();
        let listener = ControlListener::bind(&name).expect("bind the test control socket");
        Self {
            test,
            mode,
            port: free_tcp_port(),
            sock: name.to_key_chunk(),
            listener,
            children: Vec::new(),
            conns: HashMap::new(),
        }
    }

    /// Starts a child; it reports with `Hello` once its Zenoh session is open.
    fn spawn(&mut self, name: &str, role: &str, listen: bool, params: String) {
        let env = [
            (SOCK_ENV, self.sock.clone()),
            (PORT_ENV, self.port.to_string()),
            (LISTEN_ENV, if listen { "1" } else { "0" }.to_owned()),
            (NAME_ENV, name.to_owned()),
            (MODE_ENV, self.mode.name().to_owned()),
            (PARAMS_ENV, params),
        ];
        self.children.push((name.to_owned(), spawn_child(ENTRY, role, &env)));
    }

    /// Accepts children's connections until `names` all said `Hello`.
    fn accept(&mut self, names: &[&str]) {
        let mut left: Vec<&str> = names.to_vec();
        while !left.is_empty() {
            let conn = self
                .listener
                .accept_timeout(IO)
                .unwrap_or_else(|e| panic!("{}: children {left:?} did not connect: {e}", self.test));
            let Ctl::Hello { name } = recv(&conn, "a new child", IO) else { panic!("{}: expected Hello", self.test) };
            left.retain(|n| *n != name);
            self.conns.insert(name, conn);
        }
    }

    /// Spawns the listening child and waits for it, then the others.
    fn start(&mut self, listener: (&str, &str, String), others: Vec<(&str, &str, String)>) {
        self.spawn(listener.0, listener.1, true, listener.2);
        self.accept(&[listener.0]);
        let names: Vec<&str> = others.iter().map(|o| o.0).collect();
        for (name, role, params) in others {
            self.spawn(name, role, false, params);
        }
        self.accept(&names);
    }

    fn conn(&self, name: &str) -> &ControlConn {
        self.conns.get(name).unwrap_or_else(|| panic!("{}: no child {name}", self.test))
    }

    fn send(&self, name: &str, msg: &Ctl) {
        send(self.conn(name), msg);
    }

    fn recv(&self, name: &str) -> Ctl {
        recv(self.conn(name), &format!("{}/{name}", self.test), IO)
    }

    fn expect_ready(&self, name: &str) {
        let m = self.recv(name);
        assert!(matches!(m, Ctl::Ready), "{}: {name} sent {m:?}, expected Ready", self.test);
    }

    fn expect_published(&self, name: &str) -> PubFigures {
        match self.recv(name) {
            Ctl::Published(f) => f,
            m => panic!("{}: {name} sent {m:?}, expected Published", self.test),
        }
    }

    fn expect_done(&self, name: &str) -> SubFigures {
        match self.recv(name) {
            Ctl::Done(f) => f,
            m => panic!("{}: {name} sent {m:?}, expected Done", self.test),
        }
    }

    /// `Finish` to a publisher; its final report.
    fn finish_pub(&self, name: &str) -> PubFigures {
        self.send(name, &Ctl::Finish);
        match self.recv(name) {
            Ctl::Report(f) => f,
            m => panic!("{}: {name} sent {m:?}, expected Report", self.test),
        }
    }

    /// SIGKILLs a child; returns when the signal was sent.
    fn kill(&mut self, name: &str) -> (Instant, Child) {
        let pos = self.children.iter().position(|(n, _)| n == name).expect("child to kill");
        let (_, mut child) = self.children.remove(pos);
        child.kill().expect("SIGKILL");
        (Instant::now(), child)
    }

    /// `Finish` to every child still connected that is not done, then waits for all.
    fn finish(mut self, subs: &[&str]) {
        for s in subs {
            self.send(s, &Ctl::Finish);
        }
        for (name, child) in std::mem::take(&mut self.children) {
            wait_child(child, &format!("{}/{name}", self.test), IO);
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Only after a failure: leave no child behind.
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------
// Child side
// ---------------------------------------------------------------------------------

struct ChildEnv {
    name: String,
    mode: MediumKind,
    port: u16,
    listen: bool,
}

impl ChildEnv {
    fn read() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set in the child"));
        Self {
            name: var(NAME_ENV),
            mode: MediumKind::from_env(MODE_ENV),
            port: var(PORT_ENV).parse().expect("port"),
            listen: var(LISTEN_ENV) == "1",
        }
    }

    fn zenoh_config(&self) -> zenoh::Config {
        let (listen, connect) = if self.listen { (Some(self.port), None) } else { (None, Some(self.port)) };
        loopback_zenoh_config(listen, connect, Some(PREFIX))
    }

    fn gpu_session(&self) -> GpuSession {
        GpuSession::open(self.zenoh_config(), ZcsConfig { device: self.mode.device(), ..ZcsConfig::default() })
            .wait()
            .unwrap_or_else(|e| panic!("{}: open session: {e}", self.name))
    }

    /// Connects to the parent and says hello.
    fn connect(&self) -> Ctl2 {
        let sock = std::env::var(SOCK_ENV).expect("control socket name");
        let name = SocketName::from_key_chunk(&sock).expect("socket name");
        let conn = ControlConn::connect(&name, IO).expect("connect to the parent");
        send(&conn, &Ctl::Hello { name: self.name.clone() });
        Ctl2 { conn, name: self.name.clone() }
    }
}

/// A child's control connection to the parent.
struct Ctl2 {
    conn: ControlConn,
    name: String,
}

impl Ctl2 {
    fn send(&self, m: &Ctl) {
        send(&self.conn, m);
    }

    fn recv(&self, timeout: Duration) -> Ctl {
        recv(&self.conn, "the parent", timeout)
    }

    fn expect_go(&self) {
        let m = self.recv(IO);
        assert!(matches!(m, Ctl::Go), "{}: expected Go, got {m:?}", self.name);
    }

    fn expect_finish(&self) {
        let m = self.recv(IO);
        assert!(matches!(m, Ctl::Finish), "{}: expected Finish, got {m:?}", self.name);
    }
}

/// CPU check after an owned host copy (`to_vec`: a device→host copy for device
/// samples, ordered after the ready signal).
fn cpu_bad(s: &GpuSample, seed: u64) -> u64 {
    let v = s.to_vec().expect("to_vec");
    assert_eq!(v.len(), s.len());
    check_pattern(&v, 0, seed).map_or(0, |(_, bad)| bad)
}

fn meta_idx(s: &GpuSample) -> u8 {
    match s.info().meta.as_deref() {
        Some([idx]) => *idx,
        other => panic!("sample {} carries metadata {other:?}, expected [publisher index]", s.seq()),
    }
}

/// The subscriber's counters; the caller adds what it checked.
fn sub_figures(st: &zenoh_cuda_shm::SubscriberStats) -> SubFigures {
    SubFigures {
        zero_copy: st.zero_copy,
        cpu_bytes: st.cpu_bytes,
        inline: st.inline,
        plain: st.plain,
        bad_descriptors: st.bad_descriptors,
        handshakes: st.handshakes,
        duplicates: st.duplicates,
        evictions: st.evictions,
        ..SubFigures::default()
    }
}

fn pub_figures(p: &GpuPublisher, bytes: u64, secs: f64) -> PubFigures {
    let s = p.stats();
    PubFigures {
        messages: s.messages,
        copies_out: s.copies_out,
        leases: s.leases,
        descriptors: s.descriptors,
        plain_puts: s.plain_puts,
        aware_bytes_puts: s.aware_bytes_puts,
        lease_limited: s.lease_limited,
        fds_pushed: s.fds_pushed,
        fd_handouts: s.fd_handouts,
        fd_denied: s.fd_denied,
        bad_releases: s.bad_releases,
        handshakes: s.handshakes,
        disconnects: s.disconnects,
        allocations: p.pool_stats().allocations,
        blocks_in_use: p.pool_stats().blocks_in_use as u64,
        holder_releases: p.pool_stats().holder_releases,
        bytes,
        secs,
    }
}

fn poll_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
    t.elapsed()
}

fn token_present(z: &zenoh::Session, key: &str) -> bool {
    let replies = z.liveliness().get(key).timeout(Duration::from_millis(500)).wait().expect("liveliness get");
    while let Ok(r) = replies.recv() {
        if r.result().is_ok() {
            return true;
        }
    }
    false
}

/// Waits until `p` leases to `zero_copy` subscribers and the plain key has the
/// listeners the test expects: the plain subscriber named by `plain_token`, or none
/// (GPU subscribers stop listening there once they see one of our publishers).
fn wait_routes(who: &str, p: &GpuPublisher, zero_copy: usize, plain_token: Option<&str>) {
    let diag = |p: &GpuPublisher| {
        format!(
            "zero-copy {} aware {} plain {}",
            p.zero_copy_subscribers(),
            p.aware_subscribers(),
            p.plain_subscribers()
        )
    };
    let t = Instant::now();
    while p.zero_copy_subscribers() < zero_copy {
        assert!(t.elapsed() < SETUP, "{who}: {zero_copy} zero-copy subscribers not ready: {}", diag(p));
        std::thread::sleep(Duration::from_millis(5));
    }
    match plain_token {
        Some(tok) => {
            // The plain subscriber declares its token after its subscriber, on the
            // same session: once we see the token, its subscription has reached us.
            while !token_present(p.session(), tok) {
                assert!(t.elapsed() < SETUP, "{who}: plain subscriber token {tok} not seen");
            }
            poll_until(&format!("{who}: plain subscriber matched"), SETUP, || p.plain_subscribers());
        }
        None => {
            let mut quiet_since = Instant::now();
            loop {
                if p.plain_subscribers() {
                    quiet_since = Instant::now();
                } else if quiet_since.elapsed() >= Duration::from_millis(200) {
                    break;
                }
                assert!(t.elapsed() < SETUP, "{who}: the plain key still has listeners: {}", diag(p));
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    println!("{who}: routes ready after {:.0} ms ({})", t.elapsed().as_secs_f64() * 1e3, diag(p));
}

/// Waits until the pool has no block in use (every lease released); returns how many
/// are still in use after `limit`.
fn wait_pool_idle(p: &GpuPublisher, limit: Duration) -> u64 {
    let t = Instant::now();
    loop {
        let n = p.pool_stats().blocks_in_use as u64;
        if n == 0 || t.elapsed() > limit {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until fewer than `window` blocks of `p` are in use (0: no limit).
fn wait_window(who: &str, p: &GpuPublisher, window: usize) {
    let t = Instant::now();
    while window > 0 && p.pool_stats().blocks_in_use >= window {
        assert!(t.elapsed() < IO, "{who}: subscribers hold {window} blocks for {IO:?}");
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Publishes `seqs` with the pattern of (`idx`, seq, 0).
fn publish(who: &str, dev: &Pattern, p: &GpuPublisher, pp: &PubParams, seqs: std::ops::RangeInclusive<u64>) -> u64 {
    let mut bytes = 0u64;
    for seq in seqs {
        let len = msg_len(&pp.sizes, pp.idx, seq);
        wait_window(who, p, pp.window);
        let mut loan = dev.loan(p, len);
        dev.fill(&mut loan, seed(pp.idx, seq, 0));
        loan.set_meta(vec![pp.idx]);
        let r = p.put(loan).unwrap_or_else(|e| panic!("{who}: put {seq}: {e}"));
        assert_eq!(r.seq, seq, "{who}: sequence numbers");
        if let Some(z) = pp.expect_zero_copy {
            assert_eq!(r.zero_copy, z, "{who}: message {seq} leased to {} subscribers: {r:?}", r.zero_copy);
        }
        if pp.expect_no_copy {
            assert!(!(r.copied_out || r.plain || r.aware_bytes), "{who}: message {seq} went out as bytes: {r:?}");
        }
        bytes += len as u64;
    }
    bytes
}

/// Receives `n` messages of each of `pubs` publishers; checks order, path, length and
/// bytes.
struct Receiver {
    /// The publishers' payload sizes (see [`msg_len`]).
    sizes: Vec<usize>,
    next: HashMap<u8, u64>,
    instances: HashMap<u64, u8>,
    check_errors: u64,
    unread: u64,
    bytes: u64,
}

impl Receiver {
    fn new(sizes: &[usize]) -> Self {
        Self {
            sizes: sizes.to_vec(),
            next: HashMap::new(),
            instances: HashMap::new(),
            check_errors: 0,
            unread: 0,
            bytes: 0,
        }
    }

    /// Checks a sample's identity, order and length; returns its publisher index.
    fn admit(&mut self, who: &str, s: &GpuSample, pubs: u8) -> u8 {
        assert_eq!(s.path(), Path::ZeroCopy, "{who}: message {} came by {}", s.seq(), s.path());
        let idx = meta_idx(s);
        let len = msg_len(&self.sizes, idx, s.seq());
        assert_eq!(s.len(), len, "{who}: publisher {idx} message {}: length", s.seq());
        assert!(idx < pubs, "{who}: publisher index {idx} (expected < {pubs})");
        let known = *self.instances.entry(s.info().publisher).or_insert(idx);
        assert_eq!(known, idx, "{who}: publisher {:016x} changed its index", s.info().publisher);
        assert_eq!(
            self.instances.values().filter(|&&i| i == idx).count(),
            1,
            "{who}: two publisher instances claim index {idx}"
        );
        let next = self.next.entry(idx).or_insert(1);
        assert_eq!(s.seq(), *next, "{who}: publisher {idx}: got seq {} (gap, reorder or duplicate)", s.seq());
        *next += 1;
        self.bytes += s.len() as u64;
        idx
    }

    fn check(&mut self, who: &str, dev: &Pattern, s: &GpuSample, seed: u64, batch: u64) {
        dev.check(s, seed);
        self.unread += 1;
        if self.unread >= batch.max(1) {
            self.flush(who, dev);
        }
    }

    fn flush(&mut self, who: &str, dev: &Pattern) {
        let e = dev.take_errors();
        self.check_errors += e;
        self.unread = 0;
        assert_eq!(e, 0, "{who}: the check found {e} wrong bytes");
    }
}

// ---------------------------------------------------------------------------------
// Child roles
// ---------------------------------------------------------------------------------

fn role_pub(env: &ChildEnv) {
    let pp: PubParams = child_params();
    let who = env.name.as_str();
    let session = env.gpu_session();
    let dev = Pattern::new(&session);
    let p = session.declare_publisher(pp.key.clone()).wait().expect("declare publisher");
    let ctl = env.connect();
    wait_routes(who, &p, pp.wait_zero_copy, pp.plain_token.as_deref());
    ctl.send(&Ctl::Ready);
    ctl.expect_go();
    let t = Instant::now();
    let bytes = publish(who, &dev, &p, &pp, 1..=pp.n);
    let secs = t.elapsed().as_secs_f64();
    ctl.send(&Ctl::Published(pub_figures(&p, bytes, secs)));
    ctl.expect_finish();
    wait_pool_idle(&p, Duration::from_secs(5));
    ctl.send(&Ctl::Report(pub_figures(&p, bytes, secs)));
}

fn role_sub(env: &ChildEnv) {
    let sp: SubParams = child_params();
    let who = env.name.as_str();
    let session = env.gpu_session();
    let dev = Pattern::new(&session);
    let sub = session.declare_subscriber(sp.key.clone()).wait().expect("declare subscriber");
    let ctl = env.connect();
    // CPU checks run on their own thread, so they do not slow the receive loop.
    let (cpu_tx, cpu_rx) = std::sync::mpsc::channel::<(u64, u64, Vec<u8>)>();
    let cpu = std::thread::spawn(move || {
        let (mut n, mut bad) = (0u64, 0u64);
        for (seq, seed, v) in cpu_rx {
            let b = check_pattern(&v, 0, seed).map_or(0, |(_, bad)| bad);
            assert_eq!(b, 0, "CPU check of message {seq}: {b} wrong bytes");
            n += 1;
            bad += b;
        }
        (n, bad)
    });
    let total = sp.n * u64::from(sp.pubs);
    let mut rx = Receiver::new(&sp.sizes);
    let mut t0 = None;
    for i in 0..total {
        let s = sub
            .recv_timeout(IO)
            .unwrap_or_else(|e| panic!("{who}: after {i} of {total} messages: {e}; stats {:?}", sub.stats()));
        t0.get_or_insert_with(Instant::now);
        let idx = rx.admit(who, &s, sp.pubs);
        let seed = seed(idx, s.seq(), sp.stage);
        rx.check(who, &dev, &s, seed, sp.gpu_batch);
        if sp.cpu_every > 0 && (s.seq() - 1).is_multiple_of(sp.cpu_every) {
            cpu_tx.send((s.seq(), seed, s.to_vec().expect("to_vec"))).expect("CPU checker");
        }
    }
    rx.flush(who, &dev);
    let secs = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
    drop(cpu_tx);
    let (cpu_checked, cpu_bad) = cpu.join().expect("CPU checker");
    // Nothing more may come: no duplicate, nothing unexpected.
    std::thread::sleep(Duration::from_millis(200));
    if let Some(s) = sub.try_recv() {
        panic!("{who}: unexpected extra message {:?}", s.info());
    }
    let st = sub.stats();
    assert_eq!(st.zero_copy, total, "{who}: {st:?}");
    if !sp.allow_duplicates {
        assert_eq!(st.duplicates, 0, "{who}: {st:?}");
    }
    let f = SubFigures {
        received: total,
        check_errors: rx.check_errors,
        cpu_checked,
        cpu_bad,
        bytes: rx.bytes,
        secs,
        ..sub_figures(&st)
    };
    ctl.send(&Ctl::Done(f));
    ctl.expect_finish();
}

/// A plain Zenoh subscriber (no zenoh-cuda-shm): receives bytes on the user key.
fn role_plain_sub(env: &ChildEnv) {
    let sp: SubParams = child_params();
    let who = env.name.as_str();
    let z = zenoh::open(env.zenoh_config()).wait().expect("open zenoh");
    let sub = z.declare_subscriber(sp.key.clone()).wait().expect("declare plain subscriber");
    let _token = z.liveliness().declare_token(plain_ready_key(&sp.key)).wait().expect("token");
    let ctl = env.connect();
    let (mut bad, mut bytes) = (0u64, 0u64);
    let t = Instant::now();
    for seq in 1..=sp.n {
        let s = sub
            .recv_timeout(IO)
            .expect("plain receive")
            .unwrap_or_else(|| panic!("{who}: message {seq} did not arrive within {IO:?}"));
        let att = s.attachment().expect("our attachment").to_bytes();
        let h = zcs_wire::protocol::decode_attachment(&att).expect("decode").expect("our header");
        assert_eq!(h.seq, seq, "{who}: sequence numbers");
        assert!(h.from_block, "{who}: message {seq} should come from a block");
        let payload = s.payload().to_bytes();
        assert_eq!(payload.len(), msg_len(&sp.sizes, 0, seq), "{who}: message {seq}: length");
        let b = check_pattern(&payload, 0, seed(0, seq, 0)).map_or(0, |(_, bad)| bad);
        assert_eq!(b, 0, "{who}: message {seq}: {b} wrong bytes");
        bad += b;
        bytes += payload.len() as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(200));
    assert!(sub.try_recv().expect("try_recv").is_none(), "{who}: unexpected extra message");
    let f = SubFigures { received: sp.n, cpu_checked: sp.n, cpu_bad: bad, bytes, secs, ..SubFigures::default() };
    ctl.send(&Ctl::Done(f));
    ctl.expect_finish();
}

/// Subscribes to stage k, checks, writes stage k+1 into its own loan on the same
/// stream, publishes it.
fn role_relay(env: &ChildEnv) {
    let rp: RelayParams = child_params();
    let who = env.name.as_str();
    let session = env.gpu_session();
    let dev = Pattern::new(&session);
    let sub = session.declare_subscriber(rp.input.clone()).wait().expect("declare subscriber");
    let p = session.declare_publisher(rp.output.clone()).wait().expect("declare publisher");
    let ctl = env.connect();
    wait_routes(who, &p, 1, None);
    ctl.send(&Ctl::Ready);
    let mut rx = Receiver::new(&rp.sizes);
    let mut bytes = 0u64;
    let (mut cpu_checked, mut cpu_bad_total) = (0u64, 0u64);
    let t = Instant::now();
    for seq in 1..=rp.n {
        let s = sub.recv_timeout(IO).unwrap_or_else(|e| panic!("{who}: message {seq}: {e}; {:?}", sub.stats()));
        rx.admit(who, &s, 1);
        let in_seed = seed(0, seq, rp.stage);
        wait_window(who, &p, WINDOW);
        let mut out = dev.loan(&p, s.len());
        dev.relay(&s, in_seed, &mut out, in_seed + 1);
        out.set_meta(vec![0]);
        let r = p.put(out).unwrap_or_else(|e| panic!("{who}: put {seq}: {e}"));
        assert_eq!((r.seq, r.zero_copy, r.copied_out), (seq, 1, false), "{who}: {r:?}");
        rx.flush(who, &dev);
        if (seq - 1).is_multiple_of(10) {
            let b = cpu_bad(&s, in_seed);
            assert_eq!(b, 0, "{who}: CPU check of input {seq}: {b} wrong bytes");
            cpu_checked += 1;
            cpu_bad_total += b;
        }
        bytes += s.len() as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    let st = sub.stats();
    let f = SubFigures {
        received: rp.n,
        check_errors: rx.check_errors,
        cpu_checked,
        cpu_bad: cpu_bad_total,
        bytes,
        secs,
        ..sub_figures(&st)
    };
    ctl.send(&Ctl::Done(f));
    ctl.expect_finish();
    wait_pool_idle(&p, Duration::from_secs(5));
    ctl.send(&Ctl::Report(pub_figures(&p, bytes, secs)));
}

/// The publisher of the subscriber-crash test.
fn role_kill_sub_pub(env: &ChildEnv) {
    let kp: KillParams = child_params();
    let who = env.name.as_str();
    let session = env.gpu_session();
    let dev = Pattern::new(&session);
    let p = session.declare_publisher(kp.key.clone()).wait().expect("declare publisher");
    let ctl = env.connect();
    wait_routes(who, &p, 2, None);
    ctl.send(&Ctl::Ready);
    ctl.expect_go();
    let pp = PubParams {
        key: kp.key.clone(),
        sizes: vec![kp.size],
        expect_zero_copy: Some(2),
        expect_no_copy: true,
        window: kp.hold as usize + WINDOW,
        ..PubParams::default()
    };
    let t = Instant::now();
    let mut bytes = publish(who, &dev, &p, &pp, 1..=kp.n1);
    ctl.send(&Ctl::Published(pub_figures(&p, bytes, t.elapsed().as_secs_f64())));
    let m = ctl.recv(IO);
    assert!(matches!(m, Ctl::Settle), "{who}: expected Settle, got {m:?}");
    // Only the victim's held blocks stay in use once the other subscriber is done.
    poll_until(&format!("{who}: only the held blocks in use"), SETUP, || {
        p.pool_stats().blocks_in_use as u64 == kp.hold
    });
    ctl.send(&Ctl::InUse { blocks: p.pool_stats().blocks_in_use as u64 });
    let m = ctl.recv(IO);
    assert!(matches!(m, Ctl::Killed), "{who}: expected Killed, got {m:?}");
    let t_kill = Instant::now();
    while p.pool_stats().blocks_in_use != 0 {
        assert!(t_kill.elapsed() < Duration::from_secs(10), "{who}: the victim's blocks never came back");
        std::thread::sleep(Duration::from_micros(20));
    }
    let us = t_kill.elapsed().as_micros() as u64;
    // They came back because the victim's connection ended: the counters, bumped just
    // after the blocks are freed, are in the report of the next phase.
    poll_until(&format!("{who}: the dead holder's releases counted"), SETUP, || {
        p.pool_stats().holder_releases >= kp.hold && p.stats().disconnects >= 1
    });
    ctl.send(&Ctl::Recovered { us });
    ctl.expect_go();
    // The victim's token may outlive its connection briefly: until it is gone the
    // publisher still copies bytes out for it, so copies are allowed here.
    let pp = PubParams { expect_zero_copy: Some(1), expect_no_copy: false, ..pp };
    bytes += publish(who, &dev, &p, &pp, kp.n1 + 1..=kp.n1 + kp.n2);
    let secs = t.elapsed().as_secs_f64();
    ctl.send(&Ctl::Published(pub_figures(&p, bytes, secs)));
    ctl.expect_finish();
    wait_pool_idle(&p, Duration::from_secs(5));
    ctl.send(&Ctl::Report(pub_figures(&p, bytes, secs)));
}

/// The subscriber that keeps `hold` samples and is SIGKILLed.
fn role_kill_sub_victim(env: &ChildEnv) {
    let kp: KillParams = child_params();
    let who = env.name.as_str();
    let session = env.gpu_session();
    let dev = Pattern::new(&session);
    let sub = session.declare_subscriber(kp.key.clone()).wait().expect("declare subscriber");
    let ctl = env.connect();
    let mut rx = Receiver::new(&[kp.size]);
    let mut held = Vec::new();
    for seq in 1..=kp.n1 {
        let s = sub.recv_timeout(IO).unwrap_or_else(|e| panic!("{who}: message {seq}: {e}"));
        rx.admit(who, &s, 1);
        rx.check(who, &dev, &s, seed(0, seq, 0), 1);
        if (held.len() as u64) < kp.hold {
            held.push(s);
        }
    }
    ctl.send(&Ctl::Holding { held: held.len() as u64, received: kp.n1 });
    // Wait to be killed, holding the samples.
    let m = ctl.recv(Duration::from_secs(150));
    panic!("{who}: still alive (got {m:?}); it should have been killed");
}

/// The publisher of the publisher-crash test: publishes, waits for its writes, waits
/// to be killed.
fn role_kill_pub_pub(env: &ChildEnv) {
    let kp: KillParams = child_params();
    let who = env.name.as_str();
    let session = env.gpu_session();
    let dev = Pattern::new(&session);
    let p = session.declare_publisher(kp.key.clone()).wait().expect("declare publisher");
    let ctl = env.connect();
    wait_routes(who, &p, 1, None);
    ctl.send(&Ctl::Ready);
    ctl.expect_go();
    let pp = PubParams {
        key: kp.key.clone(),
        sizes: vec![kp.size],
        expect_zero_copy: Some(1),
        expect_no_copy: true,
        ..PubParams::default()
    };
    let bytes = publish(who, &dev, &p, &pp, 1..=kp.n1);
    // Let the fills and ready signals complete before we can be killed: a process
    // killed mid-write never signals, and its subscribers would wait for ever.
    dev.synchronize();
    ctl.send(&Ctl::Published(pub_figures(&p, bytes, 0.0)));
    let m = ctl.recv(Duration::from_secs(150));
    panic!("{who}: still alive (got {m:?}); it should have been killed");
}

/// The subscriber of the publisher-crash test.
fn role_kill_pub_sub(env: &ChildEnv) {
    let kp: KillParams = child_params();
    let who = env.name.as_str();
    let session = env.gpu_session();
    let dev = Pattern::new(&session);
    let sub = session.declare_subscriber(kp.key.clone()).wait().expect("declare subscriber");
    let ctl = env.connect();
    let mut rx = Receiver::new(&[kp.size]);
    let mut held = Vec::new();
    for seq in 1..=kp.n1 {
        let s = sub.recv_timeout(IO).unwrap_or_else(|e| panic!("{who}: message {seq}: {e}"));
        rx.admit(who, &s, 1);
        held.push(s); // not read yet
    }
    ctl.send(&Ctl::Holding { held: held.len() as u64, received: kp.n1 });
    let m = ctl.recv(IO);
    assert!(matches!(m, Ctl::Killed), "{who}: expected Killed, got {m:?}");
    // The publisher's token vanishes with its process: its imports are evicted. The
    // samples keep their mappings (and the signal block) alive.
    let evict = poll_until(&format!("{who}: eviction of the dead publisher"), SETUP, || sub.stats().evictions >= 1);
    let mut cpu_checked = 0;
    let mut cpu_bad_total = 0;
    for s in &held {
        let seed = seed(0, s.seq(), 0);
        rx.check(who, &dev, s, seed, 1);
        let b = cpu_bad(s, seed);
        assert_eq!(b, 0, "{who}: CPU check of held message {}: {b} wrong bytes", s.seq());
        cpu_checked += 1;
        cpu_bad_total += b;
    }
    drop(held);
    let st = sub.stats();
    let f = SubFigures {
        received: kp.n1,
        check_errors: rx.check_errors,
        cpu_checked,
        cpu_bad: cpu_bad_total,
        evict_ms: evict.as_secs_f64() * 1e3,
        bytes: rx.bytes,
        ..sub_figures(&st)
    };
    ctl.send(&Ctl::Done(f));
    ctl.expect_finish();
}

/// The child processes' entry: the including binary's `#[ignore]`d [`ENTRY`] test calls
/// it; a no-op when run without a role.
pub fn child_entry() {
    let Some(role) = child_role() else {
        println!("{ENTRY}: not started by a test (no role); nothing to do");
        return;
    };
    let _watchdog = watchdog_guard("fanout child", Duration::from_secs(170));
    let env = ChildEnv::read();
    match role.as_str() {
        "pub" => role_pub(&env),
        "sub" => role_sub(&env),
        "plain_sub" => role_plain_sub(&env),
        "relay" => role_relay(&env),
        "kill_sub_pub" => role_kill_sub_pub(&env),
        "kill_sub_victim" => role_kill_sub_victim(&env),
        "kill_pub_pub" => role_kill_pub_pub(&env),
        "kill_pub_sub" => role_kill_pub_sub(&env),
        other => panic!("unknown child role {other:?}"),
    }
}

// ---------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------

struct Fanout {
    pubs: u8,
    subs: usize,
    n: u64,
    sizes: Vec<usize>,
    cpu_every: u64,
    gpu_batch: u64,
}

struct FanoutResult {
    published: Vec<PubFigures>,
    reports: Vec<PubFigures>,
    subs: Vec<SubFigures>,
}

/// Runs a fan-out case, alone and under a watchdog of `limit`, and asserts that every
/// subscriber received every message zero-copy.
fn fanout(test: &'static str, mode: MediumKind, f: &Fanout, limit: Duration) -> FanoutResult {
    let _serial = serial();
    let _wd = watchdog_guard(test, limit);
    let r = run_fanout(test, mode, f);
    assert_fanout(test, f, &r);
    r
}

/// `pubs` publishers to `subs` subscribers on one key, all zero-copy.
fn run_fanout(test: &'static str, mode: MediumKind, f: &Fanout) -> FanoutResult {
    let key = test_key(test);
    let mut h = Harness::new(test, mode);
    let pub_names: Vec<String> = (0..f.pubs).map(|i| format!("pub{i}")).collect();
    let sub_names: Vec<String> = (0..f.subs).map(|i| format!("sub{i}")).collect();
    let pub_params = |i: u8| {
        enc(&PubParams {
            key: key.clone(),
            idx: i,
            n: f.n,
            sizes: f.sizes.clone(),
            wait_zero_copy: f.subs,
            plain_token: None,
            expect_zero_copy: Some(f.subs),
            expect_no_copy: true,
            window: WINDOW,
        })
    };
    let sub_params = enc(&SubParams {
        key: key.clone(),
        pubs: f.pubs,
        n: f.n,
        sizes: f.sizes.clone(),
        stage: 0,
        cpu_every: f.cpu_every,
        gpu_batch: f.gpu_batch,
        allow_duplicates: false,
    });
    let mut all: Vec<(&str, &str, String)> = pub_names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), "pub", pub_params(i as u8)))
        .chain(sub_names.iter().map(|n| (n.as_str(), "sub", sub_params.clone())))
        .collect();
    // One process listens: the single publisher, else the first subscriber.
    let first = if f.pubs == 1 { 0 } else { f.pubs as usize };
    let listener = all.remove(first);
    h.start(listener, all);
    for p in &pub_names {
        h.expect_ready(p);
    }
    for p in &pub_names {
        h.send(p, &Ctl::Go);
    }
    let subs: Vec<SubFigures> = sub_names.iter().map(|s| h.expect_done(s)).collect();
    let published: Vec<PubFigures> = pub_names.iter().map(|p| h.expect_published(p)).collect();
    let reports: Vec<PubFigures> = pub_names.iter().map(|p| h.finish_pub(p)).collect();
    let names: Vec<&str> = sub_names.iter().map(String::as_str).collect();
    h.finish(&names);
    for (name, s) in sub_names.iter().zip(&subs) {
        println!(
            "{test}/{name}: {} msgs zero-copy, wrong bytes {}, cpu-checked {} (bad {}), {:.0} msgs/s, {:.2} GB/s",
            s.received,
            s.check_errors,
            s.cpu_checked,
            s.cpu_bad,
            s.received as f64 / s.secs.max(1e-9),
            s.bytes as f64 / s.secs.max(1e-9) / 1e9
        );
    }
    for (name, r) in pub_names.iter().zip(&reports) {
        println!("{test}/{name}: {r:?}");
    }
    FanoutResult { published, reports, subs }
}

/// Every message zero-copy to every subscriber, checked, once; no copy, no bytes path,
/// one handshake per publisher and subscriber; every lease released while the
/// subscribers are still alive.
fn assert_fanout(test: &str, f: &Fanout, r: &FanoutResult) {
    let (pubs, subs) = (u64::from(f.pubs), f.subs as u64);
    for s in &r.subs {
        assert_eq!(s.received, f.n * pubs, "{test}: {s:?}");
        assert_eq!(s.zero_copy, s.received, "{test}: {s:?}");
        assert_eq!((s.check_errors, s.cpu_bad, s.duplicates), (0, 0, 0), "{test}: {s:?}");
        assert_eq!((s.cpu_bytes, s.inline, s.plain, s.bad_descriptors), (0, 0, 0, 0), "{test}: {s:?}");
        assert_eq!(s.handshakes, pubs, "{test}: one handshake per publisher: {s:?}");
        assert!(f.cpu_every == 0 || s.cpu_checked > 0, "{test}: no CPU check ran");
    }
    for p in &r.reports {
        assert_eq!(p.messages, f.n, "{test}: {p:?}");
        assert_eq!(p.copies_out, 0, "{test}: no device→host copy on the zero-copy path: {p:?}");
        assert_eq!((p.plain_puts, p.aware_bytes_puts, p.lease_limited), (0, 0, 0), "{test}: {p:?}");
        assert_eq!((p.leases, p.descriptors), (f.n * subs, f.n), "{test}: {p:?}");
        assert_eq!((p.fd_denied, p.bad_releases, p.handshakes), (0, 0, subs), "{test}: {p:?}");
        assert_eq!(p.blocks_in_use, 0, "{test}: every lease released: {p:?}");
        // Every block's FD went out with its first descriptor to each subscriber.
        assert_eq!((p.fds_pushed, p.fd_handouts), (p.allocations * subs, 0), "{test}: {p:?}");
    }
}

/// One publisher, one subscriber, sizes that change from message to message.
pub fn one_to_one<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    let f = Fanout {
        pubs: 1,
        subs: 1,
        n: pick(mode, 500, 50),
        sizes: pick(mode, vec![2 * MIB, 8 * MIB, 3 * MIB + 5], vec![MIB, 3 * MIB + 5]),
        cpu_every: pick(mode, 25, 10),
        gpu_batch: 1,
    };
    let r = fanout(test, mode, &f, Duration::from_secs(120));
    assert_eq!(r.published[0].copies_out, 0);
}

/// One publisher, three subscribers: one lease per subscriber per message.
pub fn one_to_three<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    let f = Fanout {
        pubs: 1,
        subs: 3,
        n: pick(mode, 300, 30),
        sizes: pick(mode, vec![8 * MIB], vec![MIB + 3]),
        cpu_every: pick(mode, 50, 10),
        gpu_batch: 1,
    };
    fanout(test, mode, &f, Duration::from_secs(120));
}

/// Three publishers publishing at once, one subscriber: each publisher's sequence
/// complete and in order, each with its own lengths.
pub fn three_to_one<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    let f = Fanout {
        pubs: 3,
        subs: 1,
        n: pick(mode, 300, 30),
        sizes: pick(mode, vec![4 * MIB], vec![MIB + 1]),
        cpu_every: pick(mode, 50, 10),
        gpu_batch: 1,
    };
    fanout(test, mode, &f, Duration::from_secs(120));
}

/// Two GPU-aware subscribers and a plain Zenoh subscriber on one key: the aware ones
/// read in place, the plain one gets bytes, and the publisher copies each message out
/// once (for the plain subscriber), not once per subscriber.
pub fn mixed_aware_and_plain_subscribers<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    let _serial = serial();
    let _wd = watchdog_guard(test, Duration::from_secs(120));
    let key = test_key("mixed");
    let n = pick(mode, 200, 30);
    let mut h = Harness::new(test, mode);
    let pp = PubParams {
        key: key.clone(),
        idx: 0,
        n,
        sizes: vec![MIB],
        wait_zero_copy: 2,
        plain_token: Some(plain_ready_key(&key)),
        expect_zero_copy: Some(2),
        expect_no_copy: false,
        window: WINDOW,
    };
    let sp = SubParams {
        key: key.clone(),
        pubs: 1,
        n,
        sizes: pp.sizes.clone(),
        stage: 0,
        cpu_every: 20,
        gpu_batch: 1,
        allow_duplicates: false,
    };
    h.start(
        ("pub", "pub", enc(&pp)),
        vec![("gpu0", "sub", enc(&sp)), ("gpu1", "sub", enc(&sp)), ("plain", "plain_sub", enc(&sp))],
    );
    h.expect_ready("pub");
    h.send("pub", &Ctl::Go);
    let subs: Vec<SubFigures> = ["gpu0", "gpu1", "plain"].iter().map(|s| h.expect_done(s)).collect();
    h.expect_published("pub");
    let r = h.finish_pub("pub");
    h.finish(&["gpu0", "gpu1", "plain"]);
    println!("{test}: publisher {r:?}");
    for s in &subs {
        println!("{test}: subscriber {s:?}");
        assert_eq!((s.received, s.check_errors, s.cpu_bad), (n, 0, 0), "{test}: {s:?}");
    }
    for s in &subs[..2] {
        assert_eq!((s.zero_copy, s.cpu_bytes, s.duplicates), (n, 0, 0), "{test}: the GPU subscribers read in place");
    }
    assert_eq!(subs[2].cpu_checked, n, "{test}: the plain subscriber checked every message");
    assert_eq!(r.messages, n);
    assert_eq!(r.copies_out, n, "{test}: one device→host copy per message (for the plain subscriber), not three");
    assert_eq!((r.plain_puts, r.aware_bytes_puts), (n, 0), "{test}: {r:?}");
    assert_eq!(r.leases, 2 * n, "{test}: {r:?}");
    assert_eq!(r.blocks_in_use, 0, "{test}: {r:?}");
}

/// A source, three relays (each checks its input and writes its own block for the
/// next stage) and a final subscriber: every hop zero-copy, every byte checked.
pub fn relay_chain_of_three<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    let _serial = serial();
    let _wd = watchdog_guard(test, Duration::from_secs(120));
    let n = pick(mode, 200, 30);
    let stage_key = |k: u8| test_key(&format!("relay/s{k}"));
    let sizes = pick(mode, vec![8 * MIB, 2 * MIB + 1], vec![MIB, 2 * MIB + 1]);
    let mut h = Harness::new(test, mode);
    let source = PubParams {
        key: stage_key(0),
        idx: 0,
        n,
        sizes: sizes.clone(),
        wait_zero_copy: 1,
        plain_token: None,
        expect_zero_copy: Some(1),
        expect_no_copy: true,
        window: WINDOW,
    };
    let relays: Vec<(String, String)> = (0..3u8)
        .map(|k| {
            let p = RelayParams { input: stage_key(k), output: stage_key(k + 1), stage: k, n, sizes: sizes.clone() };
            (format!("relay{}", k + 1), enc(&p))
        })
        .collect();
    let fin = SubParams {
        key: stage_key(3),
        pubs: 1,
        n,
        sizes,
        stage: 3,
        cpu_every: 10,
        gpu_batch: 1,
        allow_duplicates: false,
    };
    let mut others: Vec<(&str, &str, String)> =
        relays.iter().map(|(name, p)| (name.as_str(), "relay", p.clone())).collect();
    others.push(("final", "sub", enc(&fin)));
    h.start(("source", "pub", enc(&source)), others);
    for (name, _) in &relays {
        h.expect_ready(name);
    }
    h.expect_ready("source");
    h.send("source", &Ctl::Go);
    let fin_fig = h.expect_done("final");
    let relay_figs: Vec<SubFigures> = relays.iter().map(|(name, _)| h.expect_done(name)).collect();
    h.expect_published("source");
    let mut reports = vec![("source".to_owned(), h.finish_pub("source"))];
    for (name, _) in &relays {
        reports.push((name.clone(), h.finish_pub(name)));
    }
    h.finish(&["final"]);
    for (f, (name, _)) in relay_figs.iter().zip(&relays) {
        println!("{test}/{name}: in {f:?}");
        assert_eq!((f.received, f.zero_copy, f.check_errors, f.cpu_bad), (n, n, 0, 0), "{test}/{name}: {f:?}");
        assert_eq!((f.cpu_bytes, f.duplicates), (0, 0), "{test}/{name}: {f:?}");
    }
    for (name, r) in &reports {
        println!("{test}/{name}: out {r:?}");
        assert_eq!((r.messages, r.copies_out, r.leases, r.blocks_in_use), (n, 0, n, 0), "{test}/{name}: {r:?}");
    }
    println!(
        "{test}/final: {} msgs after 3 relays, {:.0} msgs/s end to end, wrong bytes {}, cpu-checked {}",
        fin_fig.received,
        fin_fig.received as f64 / fin_fig.secs.max(1e-9),
        fin_fig.check_errors,
        fin_fig.cpu_checked
    );
    assert_eq!((fin_fig.received, fin_fig.zero_copy, fin_fig.check_errors, fin_fig.cpu_bad), (n, n, 0, 0));
}

/// 10,000 messages cycling 1, 4, 16 and 64 MiB, one publisher to one subscriber, every
/// one checked by the check kernel. CUDA only: on host memory the CPU checks alone
/// would take minutes of CI's two cores, and the host fan-out tests cover that path.
pub fn volume_10k_messages_1_to_64_mib(test: &'static str) {
    if !Cuda::available(test) {
        return;
    }
    let f = Fanout {
        pubs: 1,
        subs: 1,
        n: 10_000,
        sizes: vec![MIB, 4 * MIB, 16 * MIB, 64 * MIB],
        // 625 ≡ 1 (mod 4): the CPU-checked messages cycle through every size.
        cpu_every: 625,
        gpu_batch: 32,
    };
    let r = fanout(test, MediumKind::Cuda, &f, Duration::from_secs(170));
    let (s, p) = (&r.subs[0], &r.published[0]);
    println!(
        "{test}: {} messages, {:.1} GB: subscriber {:.0} msgs/s ({:.1} GB/s), publisher {:.0} msgs/s; every message checked on the GPU, {} on the CPU",
        s.received,
        s.bytes as f64 / 1e9,
        s.received as f64 / s.secs.max(1e-9),
        s.bytes as f64 / s.secs.max(1e-9) / 1e9,
        p.messages as f64 / p.secs.max(1e-9),
        s.cpu_checked
    );
}

/// A subscriber holding samples is SIGKILLed: every block it held returns to the
/// publisher's pool at once (its connection's holder released), and the publisher and
/// another subscriber carry on.
pub fn subscriber_killed_holding_blocks_returns_them<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    use std::os::unix::process::ExitStatusExt;
    let _serial = serial();
    let _wd = watchdog_guard(test, Duration::from_secs(120));
    let (n1, n2) = pick(mode, (40, 40), (20, 20));
    let kp = KillParams { key: test_key("kill_sub"), n1, n2, hold: 8, size: pick(mode, 4 * MIB, MIB + 11) };
    let healthy = SubParams {
        key: kp.key.clone(),
        pubs: 1,
        n: kp.n1 + kp.n2,
        sizes: vec![kp.size],
        stage: 0,
        cpu_every: 10,
        gpu_batch: 1,
        allow_duplicates: true,
    };
    let mut h = Harness::new(test, mode);
    h.start(
        ("pub", "kill_sub_pub", enc(&kp)),
        vec![("victim", "kill_sub_victim", enc(&kp)), ("healthy", "sub", enc(&healthy))],
    );
    h.expect_ready("pub");
    h.send("pub", &Ctl::Go);
    let a = h.expect_published("pub");
    match h.recv("victim") {
        Ctl::Holding { held, received } => assert_eq!((held, received), (kp.hold, kp.n1)),
        m => panic!("{test}: victim sent {m:?}"),
    }
    h.send("pub", &Ctl::Settle);
    match h.recv("pub") {
        Ctl::InUse { blocks } => assert_eq!(blocks, kp.hold, "{test}: the victim's blocks are in use"),
        m => panic!("{test}: pub sent {m:?}"),
    }
    let (t_kill, mut victim) = h.kill("victim");
    h.send("pub", &Ctl::Killed);
    let pub_us = match h.recv("pub") {
        Ctl::Recovered { us } => us,
        m => panic!("{test}: pub sent {m:?}"),
    };
    let since_kill = t_kill.elapsed();
    let status = victim.wait().expect("reap the victim");
    println!(
        "{test}: {} blocks held by the SIGKILLed subscriber came back {:.2} ms after the kill ({:.2} ms after the publisher heard of it); victim {status}",
        kp.hold,
        since_kill.as_secs_f64() * 1e3,
        pub_us as f64 / 1e3
    );
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{test}: victim {status:?}");
    let limit = reclaim_limit(mode);
    assert!(since_kill < limit, "{test}: blocks came back only after {since_kill:?} (limit {limit:?})");
    h.send("pub", &Ctl::Go);
    let b = h.expect_published("pub");
    let s = h.expect_done("healthy");
    let r = h.finish_pub("pub");
    h.finish(&["healthy"]);
    println!("{test}: before the kill {a:?}\n{test}: after {b:?}\n{test}: healthy subscriber {s:?}");
    assert_eq!((b.holder_releases, b.disconnects), (kp.hold, 1), "{test}: released with the victim's connection");
    assert_eq!((s.received, s.zero_copy, s.check_errors, s.cpu_bad), (kp.n1 + kp.n2, kp.n1 + kp.n2, 0, 0));
    assert_eq!(r.messages, kp.n1 + kp.n2);
    assert_eq!(r.blocks_in_use, 0, "{test}: {r:?}");
}

/// A publisher is SIGKILLed while a subscriber holds samples it has not read yet: the
/// subscriber evicts the dead publisher and still reads every held sample, intact.
pub fn publisher_killed_subscriber_reads_held_samples<M: Medium>(test: &'static str) {
    let Some(mode) = M::gate(test) else { return };
    let _serial = serial();
    let _wd = watchdog_guard(test, Duration::from_secs(120));
    let kp = KillParams { key: test_key("kill_pub"), n1: 3, n2: 0, hold: 3, size: pick(mode, 8 * MIB, MIB + 5) };
    let mut h = Harness::new(test, mode);
    // The subscriber listens: it must keep its Zenoh network when the publisher dies.
    h.start(("sub", "kill_pub_sub", enc(&kp)), vec![("pub", "kill_pub_pub", enc(&kp))]);
    h.expect_ready("pub");
    h.send("pub", &Ctl::Go);
    h.expect_published("pub");
    match h.recv("sub") {
        Ctl::Holding { held, .. } => assert_eq!(held, kp.hold),
        m => panic!("{test}: sub sent {m:?}"),
    }
    let (_, mut publisher) = h.kill("pub");
    let status = publisher.wait().expect("reap the publisher");
    h.send("sub", &Ctl::Killed);
    let s = h.expect_done("sub");
    h.finish(&["sub"]);
    println!(
        "{test}: publisher {status}; subscriber evicted it {:.1} ms after being told, then read its {} held samples: wrong bytes {}, cpu bad {} ({s:?})",
        s.evict_ms, kp.hold, s.check_errors, s.cpu_bad
    );
    assert!(s.evictions >= 1, "{test}: {s:?}");
    assert_eq!((s.received, s.zero_copy, s.check_errors, s.cpu_bad, s.cpu_checked), (kp.n1, kp.n1, 0, 0, kp.n1));
}
