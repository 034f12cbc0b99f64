//! Pub/sub suite without a GPU: the whole protocol (tokens, handshake, descriptors,
//! FD handout, leases, bytes fallbacks) between real processes, over real Zenoh
//! sessions on loopback TCP, with sealed memfd ("host") blocks.
//!
//! Fan-out and fan-in, aware and plain subscribers on one key, a relay chain, a
//! subscriber or a publisher SIGKILLed, with every participant a process of its own, are
//! in `pubsub_fanout.rs` (one body on host memory and on CUDA).
//!
//! Here the parent process opens the Zenoh session that listens on
//! `tcp/127.0.0.1:<free port>` (peer mode, no multicast scouting) and plays one side;
//! the other sides are this test binary re-run as children (see `child_entry`), which
//! connect to it (as does the raw session that injects bad input). Parent and children
//! coordinate over a Unix control socket (test traffic only, never the data under
//! test): the parent sends each child its [`Params`], the child says `Ready`, waits for
//! `Go`, reports `Done` and waits for `Stop` (so publishers outlive their subscribers'
//! last reads). Puts on the suite's keys use congestion control `Block` (see
//! [`zenoh_config`]).
//!
//! `late_joiner_behind_a_slow_link_leaks_no_lease` and
//! `forged_bytes_header_cannot_silence_a_publisher` guard two fixed bugs: leases charged
//! for messages a new subscriber never received, and a forged bytes header silencing a
//! publisher through deduplication.
//!
//! Every payload is the [`fill_pattern`] of its sequence number (or of its index for
//! plain publishers), and every byte of every message is checked; per publisher, each
//! subscriber must see exactly `1..=N` in order (a late joiner: a contiguous suffix),
//! and nothing more during a grace period after the last one.

use std::collections::{HashMap, VecDeque};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_pool::BlockKey;
use zcs_tests::{child_role, free_tcp_port, recv_msg, send_msg, spawn_child, watchdog_guard};
use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};
use zcs_wire::protocol::{self, BytesHeader, Descriptor, Group, Reply, Request, Role, Token};
use zenoh::Wait;
use zenoh::qos::CongestionControl;
use zenoh_cuda_shm::config::{DeviceChoice, HostId};
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, GpuSubscriber, Path, PutReport, RecvError, ZcsConfig};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Environment variable carrying the parent's control socket to a child.
const SOCK_ENV: &str = "ZCS_PUBSUB_SOCK";
/// Bound on any single wait for a message, a child or a state change.
const IO: Duration = Duration::from_secs(20);
/// How long a subscriber watches for extra (duplicate or stray) messages after the last.
const GRACE: Duration = Duration::from_millis(300);
/// Each test must finish within this, or the process aborts.
const TEST_LIMIT: Duration = Duration::from_secs(120);
/// A SIGKILLed subscriber's blocks must be back in the publisher's pool within this.
const RECLAIM_LIMIT: Duration = Duration::from_secs(1);

type Sub = GpuSubscriber<flume::Receiver<GpuSample>>;

// ---------------------------------------------------------------------------------
// Test control messages (parent <-> children)
// ---------------------------------------------------------------------------------

/// Expected payload length of a message.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum LenRule {
    /// Every message has this length.
    Fixed(usize),
    /// [`inline_len`] of the sequence number.
    Inline,
}

/// Expected delivery path of a message.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum PathRule {
    /// Every message by this path.
    Exact(Path),
    /// [`inline_path`] of the sequence number.
    Inline,
    /// A late joiner: bytes until its handshake completes, then zero-copy only (and at
    /// least one zero-copy message).
    Handover,
    /// Zero-copy up to this sequence number, bytes after (the lease limit was reached).
    LeaseLimit(u64),
    /// Zero-copy or bytes from a block, in any mix.
    Mixed,
}

/// What a child does; sent by the parent as the first control message.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Params {
    port: u16,
    key: String,
    /// Subscribers: messages to receive (late joiner: the last sequence number).
    /// Publishers: messages per `Go`.
    n: u64,
    len: LenRule,
    path: PathRule,
    /// Subscribers: keep this many most recent samples alive.
    hold: usize,
    /// Subscribers: declare only after `Go` and accept starting mid-stream.
    late: bool,
    /// Publishers: zero-copy subscribers to wait for before `Ready`.
    zero_copy_subs: usize,
    /// Plain subscribers: sequence number of the first message expected.
    first_seq: u64,
    /// Subscribers: once done, fork a process that keeps a copy of every descriptor
    /// (see [`fork_keeper`]) and report its pid.
    keeper: bool,
}

impl Params {
    fn new(port: u16, key: &str, n: u64, len: LenRule, path: PathRule) -> Self {
        Self {
            port,
            key: key.to_owned(),
            n,
            len,
            path,
            hold: 0,
            late: false,
            zero_copy_subs: 0,
            first_seq: 1,
            keeper: false,
        }
    }
}

/// What a child saw, for the parent's assertions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Summary {
    received: u64,
    first_seq: u64,
    last_seq: u64,
    /// Delivered samples by path, as the checker counted them.
    by_path: Vec<(Path, u64)>,
    /// The subscriber's counters.
    sub: Option<SubCounts>,
    /// The pid of the subscriber's keeper (`Params::keeper`).
    keeper: Option<i32>,
}

/// The [`zenoh_cuda_shm::SubscriberStats`] this suite checks.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct SubCounts {
    zero_copy: u64,
    cpu_bytes: u64,
    inline: u64,
    plain: u64,
    duplicates: u64,
    bad_descriptors: u64,
    handshakes: u64,
    releases: u64,
}

impl Summary {
    fn path(&self, p: Path) -> u64 {
        self.by_path.iter().find(|(q, _)| *q == p).map_or(0, |(_, n)| *n)
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Ctl {
    Params(Params),
    Ready,
    Go,
    Done(Summary),
    Stop,
}

// ---------------------------------------------------------------------------------
// Helpers shared by parent and children
// ---------------------------------------------------------------------------------

fn endpoint(port: u16) -> String {
    format!("[\"tcp/127.0.0.1:{port}\"]")
}

/// Root of every key this suite uses.
const KEY_ROOT: &str = "zcs-test/pubsub";

/// A peer-mode Zenoh config without multicast scouting that listens on `port`
/// (the parent) or connects to it (everyone else).
///
/// Puts under [`KEY_ROOT`], our `@zcs` channels included, use congestion control
/// `Block` instead of Zenoh's default `Drop`: with `Drop`, a loaded 2-core machine
/// loses whole messages in Zenoh's queues (seen here as gaps in the bytes paths), and
/// these tests count every sequence number of the library, not Zenoh's drop policy.
fn zenoh_config(port: u16, listen: bool) -> zenoh::Config {
    let mut c = zenoh::Config::default();
    let mut set = |k: &str, v: &str| c.insert_json5(k, v).unwrap_or_else(|e| panic!("zenoh config {k} = {v}: {e}"));
    set("mode", "\"peer\"");
    set("scouting/multicast/enabled", "false");
    let (l, k) = if listen { (endpoint(port), "[]".to_owned()) } else { ("[]".to_owned(), endpoint(port)) };
    set("listen/endpoints", &l);
    set("connect/endpoints", &k);
    set(
        "qos/publication",
        &format!(
            "[{{ key_exprs: [\"{KEY_ROOT}/**\", \"{KEY_ROOT}/**/@zcs/**\"], config: {{ congestion_control: \"block\" }} }}]"
        ),
    );
    c
}

fn host_config() -> ZcsConfig {
    ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() }
}

fn host_session(port: u16, listen: bool) -> GpuSession {
    host_session_with(port, listen, host_config())
}

fn host_session_with(port: u16, listen: bool, cfg: ZcsConfig) -> GpuSession {
    GpuSession::open(zenoh_config(port, listen), cfg).wait().expect("open host session")
}

fn raw_session(port: u16) -> zenoh::Session {
    zenoh::open(zenoh_config(port, false)).wait().expect("open zenoh session")
}

/// A unique key per test and run, so parallel runs never meet.
fn test_key(test: &str) -> String {
    format!("{KEY_ROOT}/{}/{test}", std::process::id())
}

/// Polls `f` every millisecond until it holds; panics after `timeout`.
fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    t.elapsed()
}

/// Payload length of inline-test message `seq`: around and at the 64 KiB threshold,
/// the last two just above it (those go through a block).
fn inline_len(seq: u64) -> usize {
    const LENS: [usize; 8] = [0, 1, 13, 1000, 4096, 32 * KIB + 3, 64 * KIB - 1, 64 * KIB];
    match seq {
        s if s > INLINE_N => 64 * KIB + 1 + (s - INLINE_N - 1) as usize * 40_000,
        s => LENS[(s as usize - 1) % LENS.len()],
    }
}
const INLINE_N: u64 = 40;
const INLINE_BIG: u64 = 2;

fn inline_path(seq: u64) -> Path {
    if inline_len(seq) <= 64 * KIB { Path::Inline } else { Path::ZeroCopy }
}

/// Loans a block of `len` bytes, fills it with the pattern of `seq` and publishes it.
fn publish_block(p: &GpuPublisher, seq: u64, len: usize) -> PutReport {
    let mut loan = p.loan(len).expect("loan");
    fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq);
    let r = p.put(loan).expect("put");
    assert_eq!(r.seq, seq, "publisher numbered the message differently");
    r
}

/// Waits until the publisher sees `k` GPU-aware subscribers, all on the zero-copy
/// path, and no one on the plain key (the aware subscribers' `plain_listen: auto`
/// listening has ended): from then on a put makes no copy.
fn wait_zero_copy_only(p: &GpuPublisher, k: usize) {
    wait_until(&format!("{k} zero-copy subscribers and no plain listener"), IO, || {
        p.zero_copy_subscribers() >= k && p.aware_subscribers() == k && !p.plain_subscribers()
    });
}

fn sub_counters(s: &Sub) -> SubCounts {
    let st = s.stats();
    SubCounts {
        zero_copy: st.zero_copy,
        cpu_bytes: st.cpu_bytes,
        inline: st.inline,
        plain: st.plain,
        duplicates: st.duplicates,
        bad_descriptors: st.bad_descriptors,
        handshakes: st.handshakes,
        releases: st.releases,
    }
}

/// Waits until no block of the publisher's pool is loaned or leased; on timeout says
/// what the pool, the publisher and `context` (the subscribers' summaries) report.
fn wait_pool_empty(p: &GpuPublisher, context: &dyn std::fmt::Debug) {
    let t = Instant::now();
    while p.pool_stats().blocks_in_use != 0 {
        if t.elapsed() > IO {
            panic!(
                "blocks still in use after {IO:?}:\npool {:?}\npublisher {:?}\ncontext {context:#?}",
                p.pool_stats(),
                p.stats()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks samples from our publishers: every byte against the pattern of its
/// sequence number, the length and the path, and per publisher that sequence numbers
/// are contiguous from 1 (or, for a late joiner, from the first one seen).
struct Checker {
    len: LenRule,
    path: PathRule,
    late: bool,
    next: HashMap<u64, u64>,
    last_path: HashMap<u64, Path>,
    summary: Summary,
}

impl Checker {
    fn new(len: LenRule, path: PathRule, late: bool) -> Self {
        Self { len, path, late, next: HashMap::new(), last_path: HashMap::new(), summary: Summary::default() }
    }

    fn check(&mut self, s: &GpuSample) {
        let info = s.info();
        let (publisher, seq, path) = (info.publisher, info.seq, info.path);
        assert_ne!(publisher, 0, "a sample from one of our publishers carries its instance id");
        let start = if self.late { seq } else { 1 };
        let next = self.next.entry(publisher).or_insert(start);
        assert_eq!(
            seq,
            *next,
            "publisher {publisher:016x}: expected seq {next}, got {seq} by {path} (gap or duplicate; previous by {:?})",
            self.last_path.get(&publisher)
        );
        *next += 1;
        let bytes = s.host_bytes().expect("host sessions read every sample as host bytes");
        assert_eq!(bytes.len(), s.len());
        match self.len {
            LenRule::Fixed(n) => assert_eq!(bytes.len(), n, "seq {seq}: length"),
            LenRule::Inline => assert_eq!(bytes.len(), inline_len(seq), "seq {seq}: length"),
        }
        if let Some((first, bad)) = check_pattern(&bytes, 0, seq) {
            panic!("publisher {publisher:016x} seq {seq} ({path}): {bad} wrong bytes, the first at offset {first}");
        }
        match self.path {
            PathRule::Exact(p) => assert_eq!(path, p, "seq {seq}: path"),
            PathRule::Inline => assert_eq!(path, inline_path(seq), "seq {seq} ({} bytes): path", bytes.len()),
            PathRule::LeaseLimit(k) => {
                let want = if seq <= k { Path::ZeroCopy } else { Path::CpuBytes };
                assert_eq!(path, want, "seq {seq}: path");
            }
            PathRule::Mixed => assert!(matches!(path, Path::CpuBytes | Path::ZeroCopy), "seq {seq}: path {path}"),
            PathRule::Handover => {
                assert!(matches!(path, Path::CpuBytes | Path::ZeroCopy), "seq {seq}: path {path}");
                if self.last_path.get(&publisher) == Some(&Path::ZeroCopy) {
                    assert_eq!(path, Path::ZeroCopy, "seq {seq}: back to bytes after the zero-copy path");
                }
            }
        }
        self.last_path.insert(publisher, path);
        let sm = &mut self.summary;
        if sm.received == 0 {
            sm.first_seq = seq;
        }
        sm.received += 1;
        sm.last_seq = seq;
        match sm.by_path.iter_mut().find(|(p, _)| *p == path) {
            Some((_, n)) => *n += 1,
            None => sm.by_path.push((path, 1)),
        }
    }

    fn finish(&self) {
        if matches!(self.path, PathRule::Handover) {
            assert!(self.summary.path(Path::ZeroCopy) > 0, "the late joiner never reached the zero-copy path");
        }
    }
}

/// Receives one sample within [`IO`].
fn recv(sub: &Sub, what: &str) -> GpuSample {
    match sub.recv_timeout(IO) {
        Ok(s) => s,
        Err(e) => panic!("{what}: no sample within {IO:?}: {e}"),
    }
}

/// Asserts that nothing more arrives during [`GRACE`].
fn assert_quiet(sub: &Sub, what: &str) {
    match sub.recv_timeout(GRACE) {
        Err(RecvError::Timeout) => {}
        Ok(s) => panic!("{what}: unexpected extra sample {:?}", s.info()),
        Err(e) => panic!("{what}: {e}"),
    }
}

// ---------------------------------------------------------------------------------
// Parent side: children and their control connections
// ---------------------------------------------------------------------------------

struct Kid {
    what: String,
    child: Option<Child>,
    conn: ControlConn,
}

/// The children of one test. Dropping it kills those still running, so a failed
/// test leaves no process behind.
struct Kids {
    listener: ControlListener,
    name: SocketName,
    kids: Vec<Kid>,
}

impl Kids {
    fn new() -> Self {
        let name = SocketName::random_abstract();
        let listener = ControlListener::bind(&name).expect("bind the test control socket");
        Self { listener, name, kids: Vec::new() }
    }

    /// Starts a child in `role`, sends it `params` and waits for its `Ready`.
    fn spawn(&mut self, role: &str, params: Params) -> usize {
        let mut child = spawn_child("child_entry", role, &[(SOCK_ENV, self.name.to_key_chunk())]);
        let what = format!("{role}#{}", self.kids.len());
        let conn = match self.listener.accept_timeout(IO) {
            Ok(c) => c,
            Err(e) => {
                let _ = child.kill();
                panic!("{what} did not connect: {e}; child status {:?}", child.wait());
            }
        };
        send_msg(&conn, &Ctl::Params(params), &[]);
        self.kids.push(Kid { what, child: Some(child), conn });
        let i = self.kids.len() - 1;
        match self.recv(i) {
            Ctl::Ready => i,
            other => panic!("{}: expected Ready, got {other:?}", self.kids[i].what),
        }
    }

    fn send(&self, i: usize, msg: &Ctl) {
        send_msg(&self.kids[i].conn, msg, &[]);
    }

    /// The next control message of child `i`; if it died instead, says how.
    fn recv(&mut self, i: usize) -> Ctl {
        let kid = &mut self.kids[i];
        match kid.conn.recv(IO) {
            Ok(frame) => postcard::from_bytes(&frame.bytes).expect("decode control message"),
            Err(e) => {
                let status = kid.child.as_mut().and_then(|c| {
                    let t = Instant::now();
                    loop {
                        match c.try_wait() {
                            Ok(Some(s)) => break Some(s),
                            _ if t.elapsed() > Duration::from_secs(2) => break None,
                            _ => std::thread::sleep(Duration::from_millis(10)),
                        }
                    }
                });
                panic!("{}: control connection failed ({e}); child status {status:?} (its output is above)", kid.what)
            }
        }
    }

    fn done(&mut self, i: usize) -> Summary {
        match self.recv(i) {
            Ctl::Done(s) => s,
            other => panic!("{}: expected Done, got {other:?}", self.kids[i].what),
        }
    }

    /// SIGKILLs child `i` and reaps it.
    fn kill(&mut self, i: usize) -> std::process::ExitStatus {
        let mut c = self.kids[i].child.take().expect("child running");
        c.kill().expect("SIGKILL");
        c.wait().expect("reap")
    }

    /// Tells every child still running to stop and waits for each to exit successfully.
    fn finish(mut self) {
        for k in &self.kids {
            if k.child.is_some() {
                send_msg(&k.conn, &Ctl::Stop, &[]);
            }
        }
        for k in &mut self.kids {
            if let Some(c) = k.child.take() {
                zcs_tests::wait_child(c, &k.what, IO);
            }
        }
    }
}

impl Drop for Kids {
    fn drop(&mut self) {
        for k in &mut self.kids {
            if let Some(mut c) = k.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Tests with this process as one side
// ---------------------------------------------------------------------------------

/// `spin_us`: a subscriber whose threads poll before sleeping gets every message, in
/// order, in place, through `recv` and `recv_timeout` alike; a wait with nothing to
/// receive still ends at its timeout, not before. Its threads poll while messages come
/// close together, and stop once they come further apart than `spin_us`.
#[test]
fn spinning_subscriber_receives_everything_and_keeps_timeouts() {
    const TEST: &str = "spinning_subscriber_receives_everything_and_keeps_timeouts";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let (port, key, n, len) = (free_tcp_port(), test_key(TEST), 200u64, 96 * KIB + 5);
    let pub_session = host_session(port, true);
    let publisher = pub_session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let sub_session = host_session_with(port, false, ZcsConfig { spin_us: 300, ..host_config() });
    let sub: Sub = sub_session.declare_subscriber(key.clone()).wait().expect("declare subscriber");
    wait_zero_copy_only(&publisher, 1);
    for seq in 1..=n {
        publish_block(&publisher, seq, len);
        let s = if seq % 2 == 0 { sub.recv().expect("recv") } else { recv(&sub, TEST) };
        assert_eq!((s.seq(), s.info().path), (seq, Path::ZeroCopy));
        let b = s.host_bytes().expect("host sample");
        assert_eq!((b.len(), check_pattern(&b, 0, seq)), (len, None), "seq {seq}");
    }
    for wait in [Duration::from_micros(100), Duration::from_millis(30)] {
        let t = Instant::now();
        assert_eq!(sub.recv_timeout(wait).err(), Some(RecvError::Timeout));
        assert!(t.elapsed() >= wait, "{wait:?}: returned after {:?}", t.elapsed());
    }
    let fast = sub.stats();
    assert_eq!((fast.zero_copy, fast.cpu_bytes, fast.duplicates), (n, 0, 0));
    assert!(fast.polled_us > 0, "back-to-back messages: the threads polled for them: {fast:?}");

    // A message every 20 ms, well beyond `spin_us`: a fixed poll would cost 300 µs per
    // message on each of the two waiting threads (link and queue), 12 ms in all.
    let slow = 20;
    std::thread::scope(|s| {
        s.spawn(|| {
            for seq in n + 1..=n + slow {
                std::thread::sleep(Duration::from_millis(20));
                publish_block(&publisher, seq, len);
            }
        });
        for seq in n + 1..=n + slow {
            assert_eq!(sub.recv().expect("recv").seq(), seq);
        }
    });
    let st = sub.stats();
    assert_eq!(st.zero_copy, n + slow);
    let polled = st.polled_us - fast.polled_us;
    assert!(polled < 4000, "slow messages: polling should stop after the first gaps, polled {polled} µs");
    println!(
        "{TEST}: {n} messages in place through spinning receives ({} µs polled), {slow} slow ones ({polled} µs polled)",
        fast.polled_us
    );
}

/// Phase A: two zero-copy subscribers only: no copy at all. Phase B: a plain Zenoh
/// subscriber joins: exactly one copy per message, shared by everyone who needs bytes,
/// while the aware subscribers stay on the zero-copy path.
#[test]
fn copy_out_only_when_someone_needs_bytes() {
    const TEST: &str = "copy_out_only_when_someone_needs_bytes";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let t = Instant::now();
    let (port, key, n, len) = (free_tcp_port(), test_key(TEST), 10, 2 * MIB + 1);
    let session = host_session(port, true);
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let mut kids = Kids::new();
    let aware: Vec<usize> = (0..2)
        .map(|_| {
            kids.spawn("sub", Params::new(port, &key, 2 * n, LenRule::Fixed(len), PathRule::Exact(Path::ZeroCopy)))
        })
        .collect();
    wait_zero_copy_only(&publisher, 2);
    for seq in 1..=n {
        let r = publish_block(&publisher, seq, len);
        assert_eq!((r.zero_copy, r.copied_out, r.plain, r.aware_bytes), (2, false, false, false), "seq {seq}: {r:?}");
    }
    assert_eq!(publisher.stats().copies_out, 0, "zero-copy subscribers only: no copy");

    let mut p = Params::new(port, &key, n, LenRule::Fixed(len), PathRule::Exact(Path::Plain));
    p.first_seq = n + 1;
    let plain = kids.spawn("plain_sub", p);
    wait_until("the plain subscriber to match", IO, || publisher.plain_subscribers());
    for seq in n + 1..=2 * n {
        let r = publish_block(&publisher, seq, len);
        assert_eq!((r.zero_copy, r.copied_out, r.plain, r.aware_bytes), (2, true, true, false), "seq {seq}: {r:?}");
    }
    let st = publisher.stats();
    assert_eq!((st.copies_out, st.copied_bytes, st.plain_puts, st.aware_bytes_puts), (n, n * len as u64, n, 0));
    assert_eq!((st.messages, st.leases), (2 * n, 4 * n));
    let summaries: Vec<Summary> = aware.iter().map(|&i| kids.done(i)).collect();
    for s in &summaries {
        assert_eq!((s.received, s.last_seq, s.path(Path::ZeroCopy)), (2 * n, 2 * n, 2 * n), "{s:?}");
        let SubCounts { zero_copy, cpu_bytes, plain, duplicates, .. } = s.sub.unwrap();
        assert_eq!((zero_copy, cpu_bytes, plain, duplicates), (2 * n, 0, 0, 0));
    }
    let s = kids.done(plain);
    assert_eq!((s.received, s.first_seq, s.last_seq), (n, n + 1, 2 * n), "{s:?}");
    wait_pool_empty(&publisher, &summaries);
    kids.finish();
    println!(
        "{TEST}: phase A {n} msgs, 0 copies; phase B {n} msgs, {} copies for 1 plain + 2 zero-copy subscribers; {:.2} s",
        st.copies_out,
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn plain_publisher_reaches_aware_subscriber() {
    const TEST: &str = "plain_publisher_reaches_aware_subscriber";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let t = Instant::now();
    let (port, key, n, len) = (free_tcp_port(), test_key(TEST), 20, 200 * KIB + 7);
    let session = host_session(port, true); // plain_listen: auto (the default)
    let sub = session.declare_subscriber(key.clone()).wait().expect("declare subscriber");
    let mut kids = Kids::new();
    let p = kids.spawn("plain_pub", Params::new(port, &key, n, LenRule::Fixed(len), PathRule::Exact(Path::Plain)));
    kids.send(p, &Ctl::Go);
    for i in 1..=n {
        let s = recv(&sub, TEST);
        let info = s.info();
        assert_eq!((info.path, info.publisher, info.seq, info.meta.as_ref()), (Path::Plain, 0, 0, None), "msg {i}");
        assert_eq!(info.key, key);
        let bytes = s.host_bytes().expect("bytes");
        assert_eq!(bytes.len(), len, "msg {i}: length");
        assert_eq!(check_pattern(&bytes, 0, i), None, "msg {i}: content");
    }
    assert_quiet(&sub, TEST);
    kids.done(p);
    let SubCounts { zero_copy, cpu_bytes, inline, plain, duplicates, bad_descriptors: bad, .. } = sub_counters(&sub);
    assert_eq!((zero_copy, cpu_bytes, inline, plain, duplicates, bad), (0, 0, 0, n, 0, 0));
    assert!(sub.publishers().is_empty(), "a plain publisher is not one of ours");
    kids.finish();
    println!("{TEST}: {n} plain messages (half with a foreign attachment) delivered as Plain; {:.2} s", elapsed(t));
}

fn elapsed(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// What [`late_join`] saw.
struct LateJoin {
    /// The last sequence number published before the late joiner subscribed.
    join_at: u64,
    /// The late joiner's first sequence number.
    first_seq: u64,
    /// Blocks still leased while both subscribers were alive and held nothing.
    stuck: usize,
}

/// A publisher streams `n` messages at a fixed rate to an early subscriber; a second
/// subscriber starts mid-stream (its Zenoh traffic to the publisher delayed by
/// `slow_link`, if given). Checks that the late joiner gets a contiguous suffix — bytes
/// until its handshake completes, zero-copy after, no gap and no duplicate at the
/// switch — and that every block comes back once the subscribers are gone; returns
/// how many blocks were still leased while both were alive and idle.
fn late_join(test: &'static str, slow_link: Option<Duration>) -> LateJoin {
    let t = Instant::now();
    let (port, key, n, len, join_at) = (free_tcp_port(), test_key(test), 240, 256 * KIB + 9, 40);
    let period = Duration::from_millis(5);
    // A subscriber that falls behind by more than its lease limit gets bytes instead
    // (see `lease_limit_falls_back_to_bytes_without_gaps`): lift the limit here so the
    // paths seen are the handover's alone, however slow the machine.
    let mut cfg = host_config();
    cfg.pool.max_holds_per_holder = 1024;
    let session = host_session_with(port, true, cfg);
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let mut kids = Kids::new();
    let early = kids.spawn("sub", Params::new(port, &key, n, LenRule::Fixed(len), PathRule::Exact(Path::ZeroCopy)));
    let late_port = slow_link.map_or(port, |d| delaying_proxy(port, d));
    let mut p = Params::new(late_port, &key, n, LenRule::Fixed(len), PathRule::Handover);
    p.late = true;
    let late = kids.spawn("sub", p); // session open; declares its subscriber on Go
    wait_zero_copy_only(&publisher, 1);
    let mut next = Instant::now();
    let mut copies_at_join = 0;
    for seq in 1..=n {
        if seq == join_at + 1 {
            copies_at_join = publisher.stats().copies_out;
            kids.send(late, &Ctl::Go);
        }
        publish_block(&publisher, seq, len);
        next += period;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    assert_eq!(copies_at_join, 0);
    let e = kids.done(early);
    assert_eq!((e.received, e.first_seq, e.last_seq, e.path(Path::ZeroCopy)), (n, 1, n, n), "{e:?}");
    let l = kids.done(late);
    assert!(l.first_seq > join_at, "the late joiner got seq {} published before it subscribed", l.first_seq);
    assert!(n - l.first_seq >= 40, "the late joiner started too late to test anything: {l:?}");
    assert_eq!((l.received, l.last_seq), (n - l.first_seq + 1, n), "{l:?}");
    let st = publisher.stats();
    assert_eq!(st.lease_limited, 0);
    // Both subscribers are idle and hold nothing. Their releases travel over their
    // control connections; give them time to land, then count what is still leased.
    let settle = Instant::now();
    while publisher.pool_stats().blocks_in_use != 0 && settle.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let stuck = publisher.pool_stats().blocks_in_use;
    kids.finish();
    // Gone subscribers' leases are released with their connections, stuck ones included.
    wait_pool_empty(&publisher, &(&e, &l));
    println!(
        "{test}: late joiner got seq {}..={n} ({} as bytes, {} zero-copy; publisher copies out {}); \
         {stuck} block(s) leased for messages it never got; {:.2} s",
        l.first_seq,
        l.path(Path::CpuBytes),
        l.path(Path::ZeroCopy),
        st.copies_out,
        elapsed(t)
    );
    LateJoin { join_at, first_seq: l.first_seq, stuck }
}

#[test]
fn late_joiner_gets_contiguous_suffix() {
    const TEST: &str = "late_joiner_gets_contiguous_suffix";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let r = late_join(TEST, None);
    assert!(r.first_seq > r.join_at, "the joiner started after message {}, got {} first", r.join_at, r.first_seq);
    assert_eq!(r.stuck, 0, "blocks leased to the live, idle late joiner for messages it never received");
}

/// The handshake (over the Unix socket) completes long before Zenoh routes anything
/// of the new subscriber: here the joiner's Zenoh link is slowed by 100 ms, as a
/// router hop or a loaded machine can. Descriptors travel over the socket, so no lease
/// may be charged for a message the joiner never receives, and the switch from bytes
/// (through the slow link) to the zero-copy path must keep the order.
#[test]
fn late_joiner_behind_a_slow_link_leaks_no_lease() {
    const TEST: &str = "late_joiner_behind_a_slow_link_leaks_no_lease";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let r = late_join(TEST, Some(Duration::from_millis(100)));
    assert!(r.first_seq > r.join_at, "the joiner started after message {}, got {} first", r.join_at, r.first_seq);
    assert_eq!(r.stuck, 0, "blocks leased to the live, idle late joiner for messages it never received");
}

/// A TCP proxy to `127.0.0.1:port` for one connection, that delays what the client
/// sends by `delay` (what the server sends passes at once). Returns its port.
fn delaying_proxy(port: u16, delay: Duration) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let proxy_port = listener.local_addr().unwrap().port();
    let pump = |mut from: TcpStream, mut to: TcpStream, delay: Duration| {
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * KIB];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for (due, chunk) in rx {
                if let Some(d) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(std::net::Shutdown::Both);
        });
    };
    std::thread::spawn(move || {
        let (client, _) = listener.accept().expect("proxy accept");
        let server = TcpStream::connect(("127.0.0.1", port)).expect("proxy connect");
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        pump(client.try_clone().unwrap(), server.try_clone().unwrap(), delay);
        pump(server, client, Duration::ZERO);
    });
    proxy_port
}

/// A killed subscriber whose control connection outlives it — a process it forked holds
/// a copy of the descriptor — still returns its blocks at once: the publisher learns of
/// the death from the subscriber's lifeline (a robust futex that the kernel releases as
/// the process's threads exit) and ends the connection itself. Waiting for the
/// connection's end, the blocks would stay leased until the forked process exits.
#[test]
fn a_killed_subscriber_whose_connection_outlives_it_returns_its_blocks() {
    use std::os::unix::process::ExitStatusExt;
    const TEST: &str = "a_killed_subscriber_whose_connection_outlives_it_returns_its_blocks";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let (port, key, len, n, hold) = (free_tcp_port(), test_key(TEST), MIB + 5, 10, 6);
    let session = host_session(port, true);
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let mut kids = Kids::new();
    let mut p = Params::new(port, &key, n, LenRule::Fixed(len), PathRule::Exact(Path::ZeroCopy));
    (p.hold, p.keeper) = (hold, true);
    let holder = kids.spawn("sub", p);
    wait_zero_copy_only(&publisher, 1);
    for seq in 1..=n {
        assert_eq!(publish_block(&publisher, seq, len).zero_copy, 1, "seq {seq}");
    }
    let keeper = kids.done(holder).keeper.expect("the subscriber's keeper");
    wait_until("the holder's releases", IO, || publisher.pool_stats().blocks_in_use == hold);

    let killed = Instant::now();
    let status = kids.kill(holder);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    while publisher.pool_stats().blocks_in_use != 0 {
        assert!(killed.elapsed() < RECLAIM_LIMIT, "blocks still held {:?} after the kill", killed.elapsed());
        std::thread::sleep(Duration::from_micros(100));
    }
    let reclaimed = killed.elapsed();
    wait_until("the connection to end", IO, || publisher.stats().disconnects == 1);
    assert!(!zcs_memory::host::process_gone(keeper), "the keeper holds the connection's other end");
    let st = publisher.stats();
    assert_eq!((st.lifeline_deaths, st.held_until_exit), (1, 0), "{st:?}");
    assert_eq!(publisher.zero_copy_subscribers(), 0);
    // SAFETY: kill(2) takes two integers.
    assert_eq!(unsafe { libc::kill(keeper, libc::SIGKILL) }, 0, "kill the keeper");
    kids.finish();
    println!(
        "{TEST}: {hold} blocks back {:.3} ms after the kill, the connection still open in the keeper",
        reclaimed.as_secs_f64() * 1e3
    );
}

/// A subscriber that holds on to every sample reaches its lease limit. The first put
/// over the limit waits `lease_wait_ms` for a release (congestion `block`), in vain;
/// from then on the subscriber gets every message as bytes (one copy each) without
/// further waits, with no gap, and the blocks it holds come back when it exits.
#[test]
fn lease_limit_falls_back_to_bytes_without_gaps() {
    const TEST: &str = "lease_limit_falls_back_to_bytes_without_gaps";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let t = Instant::now();
    let (port, key, n, len, limit) = (free_tcp_port(), test_key(TEST), 12, MIB + 17, 4);
    let mut cfg = host_config();
    cfg.pool.max_holds_per_holder = limit;
    cfg.lease_wait_ms = 200;
    let session = host_session_with(port, true, cfg);
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let mut kids = Kids::new();
    let mut p = Params::new(port, &key, n, LenRule::Fixed(len), PathRule::LeaseLimit(limit as u64));
    p.hold = n as usize;
    let sub = kids.spawn("sub", p);
    wait_zero_copy_only(&publisher, 1);
    for seq in 1..=n {
        let r = publish_block(&publisher, seq, len);
        let zc = seq <= limit as u64;
        assert_eq!((r.zero_copy, r.copied_out, r.aware_bytes), (usize::from(zc), !zc, !zc), "seq {seq}: {r:?}");
    }
    let s = kids.done(sub);
    let SubCounts { zero_copy, cpu_bytes, duplicates, .. } = s.sub.unwrap();
    assert_eq!((s.received, s.last_seq, zero_copy, cpu_bytes, duplicates), (n, n, limit as u64, n - limit as u64, 0));
    let st = publisher.stats();
    let over = n - limit as u64;
    assert_eq!((st.lease_limited, st.copies_out, st.aware_bytes_puts, st.plain_puts), (over, over, over, 0));
    assert_eq!(st.lease_waits, 1, "one wait in vain, then bytes at once while it keeps holding");
    assert_eq!(publisher.pool_stats().blocks_in_use, limit, "the subscriber still holds its leased blocks");
    kids.finish();
    wait_pool_empty(&publisher, &s);
    println!(
        "{TEST}: {limit} zero-copy, then {over} as bytes, contiguous; blocks back after exit; {:.2} s",
        elapsed(t)
    );
}

/// A subscriber that keeps its last few samples, more than its lease limit, while the
/// publisher streams flat out: messages alternate between the zero-copy path and bytes
/// through Zenoh as its leases come and go, and must still arrive exactly in order —
/// the descriptors over its control connection and the bytes through Zenoh are merged
/// by sequence number.
#[test]
fn paths_alternating_at_the_lease_limit_keep_order() {
    const TEST: &str = "paths_alternating_at_the_lease_limit_keep_order";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let t = Instant::now();
    let (port, key, n, len, limit) = (free_tcp_port(), test_key(TEST), 400, 256 * KIB + 3, 3);
    let mut cfg = host_config();
    cfg.pool.max_holds_per_holder = limit;
    cfg.lease_wait_ms = 0; // bytes at once at the limit
    let session = host_session_with(port, true, cfg);
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let mut kids = Kids::new();
    let mut p = Params::new(port, &key, n, LenRule::Fixed(len), PathRule::Mixed);
    p.hold = limit + 2;
    let sub = kids.spawn("sub", p);
    wait_zero_copy_only(&publisher, 1);
    for seq in 1..=n {
        publish_block(&publisher, seq, len);
    }
    let s = kids.done(sub);
    let SubCounts { zero_copy, cpu_bytes, duplicates, .. } = s.sub.unwrap();
    assert_eq!((s.received, s.first_seq, s.last_seq, duplicates), (n, 1, n, 0), "{s:?}");
    assert_eq!(zero_copy + cpu_bytes, n);
    let st = publisher.stats();
    assert_eq!(st.lease_limited, cpu_bytes, "every message over the limit went as bytes");
    assert!(zero_copy > limit as u64 && cpu_bytes > 0, "the paths did not alternate: {s:?}");
    kids.finish();
    wait_pool_empty(&publisher, &s);
    println!(
        "{TEST}: {n} messages in order, {zero_copy} zero-copy and {cpu_bytes} as bytes, interleaved; {:.2} s",
        elapsed(t)
    );
}

/// Congestion `block`: a put to a subscriber at its lease limit waits for it to release
/// a block, then goes zero-copy — no copy out, no bytes — as a full queue slows a
/// publisher instead of losing messages.
#[test]
fn a_subscriber_at_its_lease_limit_slows_the_publisher() {
    const TEST: &str = "a_subscriber_at_its_lease_limit_slows_the_publisher";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let t = Instant::now();
    let (port, key, len, limit) = (free_tcp_port(), test_key(TEST), MIB + 5, 4);
    let mut cfg = host_config();
    cfg.pool.max_holds_per_holder = limit;
    cfg.lease_wait_ms = 20_000; // far beyond the release below, also under sanitizers
    let pub_session = host_session_with(port, true, cfg);
    let publisher = pub_session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let sub_session = host_session(port, false);
    let sub = sub_session.declare_subscriber(key.clone()).wait().expect("declare subscriber");
    wait_zero_copy_only(&publisher, 1);
    let mut held = Vec::new();
    for seq in 1..=limit as u64 {
        let r = publish_block(&publisher, seq, len);
        assert_eq!((r.zero_copy, r.copied_out), (1, false), "seq {seq}: {r:?}");
        let s = recv(&sub, TEST);
        assert_eq!((s.info().seq, s.path()), (seq, Path::ZeroCopy));
        held.push(s);
    }
    // The subscriber lets go of one sample a while after the next put has started.
    let release_after = Duration::from_millis(150);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(release_after);
        drop(held.remove(0));
        held
    });
    let put_started = Instant::now();
    let r = publish_block(&publisher, limit as u64 + 1, len);
    let waited = put_started.elapsed();
    assert_eq!((r.zero_copy, r.copied_out, r.aware_bytes), (1, false, false), "{r:?}");
    assert!(waited >= release_after, "the put went out before any release: {waited:?}");
    let s = recv(&sub, TEST);
    assert_eq!((s.info().seq, s.path()), (limit as u64 + 1, Path::ZeroCopy));
    let st = publisher.stats();
    assert_eq!((st.lease_waits, st.lease_limited, st.copies_out, st.leases), (1, 0, 0, limit as u64 + 1));
    drop((s, releaser.join().expect("releaser")));
    wait_until("every block back", IO, || publisher.pool_stats().blocks_in_use == 0);
    println!(
        "{TEST}: the put over the limit waited {:.1} ms for a release, then zero-copy; {:.2} s",
        waited.as_secs_f64() * 1e3,
        elapsed(t)
    );
}

/// Beside another subscriber, a subscriber at its lease limit holds up nobody: the put
/// does not wait for it (it is served bytes at once), and the other keeps every message
/// zero-copy. The negative control is the test above (alone, the put waits).
#[test]
fn a_subscriber_at_its_lease_limit_beside_another_holds_up_nobody() {
    const TEST: &str = "a_subscriber_at_its_lease_limit_beside_another_holds_up_nobody";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let (port, key, len, limit) = (free_tcp_port(), test_key(TEST), MIB + 5, 4);
    let mut cfg = host_config();
    cfg.pool.max_holds_per_holder = limit;
    cfg.lease_wait_ms = 20_000;
    let pub_session = host_session_with(port, true, cfg);
    let publisher = pub_session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let sub_session = host_session(port, false);
    let stalled = sub_session.declare_subscriber(key.clone()).wait().expect("the stalled subscriber");
    let healthy = sub_session.declare_subscriber(key.clone()).wait().expect("the healthy subscriber");
    wait_zero_copy_only(&publisher, 2);
    let n = limit as u64 + 3;
    for seq in 1..=n {
        let put_started = Instant::now();
        let r = publish_block(&publisher, seq, len);
        assert!(put_started.elapsed() < Duration::from_secs(5), "seq {seq}: the put waited");
        assert_eq!(r.zero_copy, if seq <= limit as u64 { 2 } else { 1 }, "seq {seq}: {r:?}");
        let s = recv(&healthy, TEST);
        assert_eq!((s.info().seq, s.path()), (seq, Path::ZeroCopy));
    }
    let st = publisher.stats();
    assert_eq!((st.lease_waits, st.lease_limited), (0, n - limit as u64), "{st:?}");
    let got: Vec<(u64, Path)> = (1..=n).map(|_| recv(&stalled, TEST)).map(|s| (s.info().seq, s.path())).collect();
    let want: Vec<(u64, Path)> =
        (1..=n).map(|seq| (seq, if seq <= limit as u64 { Path::ZeroCopy } else { Path::CpuBytes })).collect();
    assert_eq!(got, want, "the stalled subscriber still gets every message, in order");
}

#[test]
fn small_messages_travel_inline() {
    const TEST: &str = "small_messages_travel_inline";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let t = Instant::now();
    let (port, key, n) = (free_tcp_port(), test_key(TEST), INLINE_N + INLINE_BIG);
    let session = host_session(port, true);
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let mut kids = Kids::new();
    let sub = kids.spawn("sub", Params::new(port, &key, n, LenRule::Inline, PathRule::Inline));
    wait_zero_copy_only(&publisher, 1);
    for seq in 1..=n {
        let mut data = vec![0u8; inline_len(seq)];
        fill_pattern(&mut data, 0, seq);
        let r = publisher.put_bytes(&data).expect("put_bytes");
        assert_eq!(r.seq, seq);
        let expect_zc = usize::from(inline_path(seq) == Path::ZeroCopy);
        assert_eq!((r.zero_copy, r.copied_out, r.plain), (expect_zc, false, false), "seq {seq}: {r:?}");
    }
    let s = kids.done(sub);
    assert_eq!((s.received, s.path(Path::Inline), s.path(Path::ZeroCopy)), (n, INLINE_N, INLINE_BIG), "{s:?}");
    let SubCounts { zero_copy, cpu_bytes, inline, duplicates, .. } = s.sub.unwrap();
    assert_eq!((zero_copy, cpu_bytes, inline, duplicates), (INLINE_BIG, 0, INLINE_N, 0));
    let st = publisher.stats();
    assert_eq!((st.messages, st.inline, st.copies_out), (n, INLINE_N, 0));
    kids.finish();
    println!("{TEST}: {INLINE_N} messages of 0..=64 KiB inline, {INLINE_BIG} just above by block; {:.2} s", elapsed(t));
}

/// A subscriber (this process) on the zero-copy path from one publisher process, and
/// a raw Zenoh session to throw bad input at it.
struct Target {
    _session: GpuSession,
    sub: Sub,
    kids: Kids,
    publ: usize,
    publisher_id: u64,
    checker: Checker,
    raw: zenoh::Session,
    key: String,
    n: u64,
}

impl Target {
    fn new(test: &str) -> Self {
        let (port, key, n, len) = (free_tcp_port(), test_key(test), 5, MIB + 13);
        let session = host_session(port, true);
        let sub = session.declare_subscriber(key.clone()).wait().expect("declare subscriber");
        let mut kids = Kids::new();
        let mut p = Params::new(port, &key, n, LenRule::Fixed(len), PathRule::Exact(Path::ZeroCopy));
        p.zero_copy_subs = 1;
        let publ = kids.spawn("pub", p);
        wait_until("a zero-copy link", IO, || sub.publishers().iter().any(|(_, zc)| *zc));
        let publisher_id = sub.publishers()[0].0;
        let checker = Checker::new(LenRule::Fixed(len), PathRule::Exact(Path::ZeroCopy), false);
        let raw = raw_session(port);
        Self { _session: session, sub, kids, publ, publisher_id, checker, raw, key, n }
    }

    /// The publisher sends its next `n` messages; all must arrive, in order, right.
    fn real_messages(&mut self, what: &str) {
        self.kids.send(self.publ, &Ctl::Go);
        for _ in 0..self.n {
            self.checker.check(&recv(&self.sub, what));
        }
        assert_quiet(&self.sub, what);
        self.kids.done(self.publ);
    }

    fn put(&self, key: &str, payload: Vec<u8>, attachment: Option<Vec<u8>>) {
        let b = self.raw.put(key, payload).congestion_control(CongestionControl::Block);
        match attachment {
            Some(a) => b.attachment(a).wait(),
            None => b.wait(),
        }
        .expect("raw put")
    }

    /// A bytes header naming the real publisher, with an absurd sequence number that
    /// would shadow the real stream if it were believed.
    fn forged_header(&self) -> Vec<u8> {
        let h = BytesHeader {
            publisher: self.publisher_id,
            seq: 1 << 40,
            timestamp_ns: 1,
            from_block: true,
            tag: 0,
            meta: None,
        };
        protocol::encode_attachment(&h)
    }
}

/// Hostile input on our channels: malformed, truncated, future-version and forged
/// descriptors, and garbage bytes with and without an attachment. Nothing wrong is
/// delivered, the subscriber counts what it drops, and the real stream goes on.
#[test]
fn bad_input_on_our_channels_is_dropped() {
    const TEST: &str = "bad_input_on_our_channels_is_dropped";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let t = Instant::now();
    let mut x = Target::new(TEST);
    x.real_messages(TEST);

    // Garbage on the bytes channel: no attachment, a foreign one, ours but malformed,
    // ours from a future version, ours truncated.
    let bytes_key = protocol::bytes_key(&x.key);
    let good_att = x.forged_header();
    let mut future_att = good_att.clone();
    future_att[4] = 2;
    let garbage = vec![0xa5u8; 4096];
    x.put(&bytes_key, garbage.clone(), None);
    x.put(&bytes_key, garbage.clone(), Some(b"rmw-foreign-attachment".to_vec()));
    x.put(&bytes_key, garbage.clone(), Some(b"ZCS\x01\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff".to_vec()));
    x.put(&bytes_key, garbage.clone(), Some(future_att));
    x.put(&bytes_key, garbage, Some(good_att[..good_att.len() - 2].to_vec()));

    // The raw session's puts arrive in order: once the last is counted, all were seen.
    wait_until("the bad bytes to be counted", IO, || x.sub.stats().bad_bytes >= 5);

    // Descriptors only come over a control connection, from a process that announced
    // itself as a publisher: play a hostile one.
    let expect_bad = hostile_publisher(&x);
    assert_quiet(&x.sub, "after the bad input");

    x.real_messages(TEST); // the real publisher goes on: seq n+1..=2n
    assert_eq!(x.checker.summary.last_seq, 2 * x.n);
    let SubCounts { zero_copy, cpu_bytes, inline, plain, duplicates, bad_descriptors: bad, handshakes, .. } =
        sub_counters(&x.sub);
    // Two handshakes: the real publisher's and the hostile one's.
    assert_eq!(
        (zero_copy, cpu_bytes, inline, plain, duplicates, bad, handshakes),
        (2 * x.n, 0, 0, 0, 0, expect_bad, 2)
    );
    let Target { kids, raw, .. } = x;
    kids.finish();
    drop(raw);
    println!(
        "{TEST}: {expect_bad} bad frames from a hostile publisher counted, 5 bad bytes messages dropped; \
         stream intact; {:.2} s",
        elapsed(t)
    );
}

/// Announces a publisher on the target's key, lets the subscriber handshake with it,
/// then routes it hostile frames: a descriptor naming the real publisher with a made-up
/// capability and an absurd sequence number (which would shadow the real stream if
/// believed), one out of its block's bounds, and finally a frame from a future
/// version, which must make the subscriber close the link. Returns how many frames the
/// subscriber must count as bad.
fn hostile_publisher(x: &Target) -> u64 {
    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).expect("bind the hostile publisher's socket");
    let group = Group { boot_id: zcs_memory::host::boot_id().unwrap(), device: "host".into() };
    let instance = 0x4057_11e0_0000_0001;
    let token = Token {
        role: Role::Pub,
        key: x.key.clone(),
        instance,
        group: group.clone(),
        socket: Some(name.to_key_chunk()),
    };
    let _token = x.raw.liveliness().declare_token(token.to_key()).wait().expect("declare token");
    let conn = listener.accept_timeout(IO).expect("the subscriber connects");
    let hello = protocol::decode::<Request>("hello", &conn.recv(IO).expect("hello").bytes).expect("decode hello");
    assert!(matches!(hello, Request::Hello { group: ref g, .. } if *g == group), "{hello:?}");
    let probe_token = 0x7e57_u64;
    let probe = zcs_memory::host::HostBlock::create(c"hostile-probe", 4096).expect("probe memfd");
    // SAFETY: 4096 bytes, mapped read-write, not yet shared.
    unsafe { (probe.as_ptr() as *mut u64).write(probe_token) };
    let welcome = Reply::Welcome {
        publisher: instance,
        holder: 1,
        capability_key: [7; 16],
        probe_size: 4096,
        probe_token,
        provider: None,
        handles: protocol::HANDLES,
    };
    conn.send(&protocol::encode(&welcome), &[probe.fd()]).expect("send welcome");
    let ack = protocol::decode::<Request>("ack", &conn.recv(IO).expect("ack").bytes).expect("decode ack");
    assert_eq!(ack, Request::Ack { token: Some(probe_token), error: None });
    conn.send(&protocol::encode(&Reply::Ready { first_seq: 1, bytes_through: 0 }), &[]).expect("send ready");

    let forged = Descriptor {
        publisher: x.publisher_id,
        seq: 1 << 40,
        block: BlockKey { id: 0, alloc: 1, generation: 1 },
        capability: 0x0bad_cafe_f00d_d00d,
        block_size: 2 * MIB as u64,
        offset: 0,
        len: MIB as u64,
        timestamp_ns: 1,
        meta: None,
        lent: None,
    };
    let out_of_bounds = Descriptor { publisher: instance, offset: u64::MAX - 3, len: 16, ..forged.clone() };
    let mut future = protocol::encode(&Reply::Block(forged.clone()));
    future[0] = protocol::VERSION + 1;
    for frame in [protocol::encode(&Reply::Block(forged)), protocol::encode(&Reply::Block(out_of_bounds)), future] {
        conn.send(&frame, &[]).expect("send a hostile frame");
    }
    // The subscriber releases what it refused, then closes the link on the bad version.
    let mut released = 0;
    loop {
        match conn.recv(IO) {
            Ok(f) => match protocol::decode::<Request>("request", &f.bytes).expect("decode request") {
                Request::Release { blocks } => released += blocks.len(),
                other => panic!("unexpected request from the subscriber: {other:?}"),
            },
            Err(zcs_wire::ipc::RecvError::Closed) => break,
            Err(e) => panic!("the subscriber did not close the link: {e}"),
        }
    }
    assert_eq!(released, 2, "both refused descriptors are released");
    wait_until("the bad frames to be counted", IO, || x.sub.stats().bad_descriptors >= 3);
    3
}

/// A publisher's token that outlives its process (a router keeps it until it notices the
/// session is gone) names a socket nobody listens on: the subscriber says the publisher
/// is gone, rather than only which socket was empty, and keeps no link to it.
#[test]
fn a_token_outliving_its_publisher_is_reported_as_a_gone_publisher() {
    const TEST: &str = "a_token_outliving_its_publisher_is_reported_as_a_gone_publisher";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let port = free_tcp_port();
    let session = host_session(port, true);
    let key = test_key(TEST);
    let sub = session.declare_subscriber(key.clone()).wait().expect("declare subscriber");
    let raw = raw_session(port);
    let instance = 0xdead_0000_0000_0001;
    let token = Token {
        role: Role::Pub,
        key,
        instance,
        group: Group { boot_id: zcs_memory::host::boot_id().unwrap(), device: "host".into() },
        socket: Some(SocketName::random_abstract().to_key_chunk()),
    };
    let _token = raw.liveliness().declare_token(token.to_key()).wait().expect("declare token");
    wait_until("the handshake to fail", IO, || sub.stats().handshake_failures == 1);
    let reason = sub.bytes_reason(instance).expect("a reason for the bytes path");
    assert!(reason.contains("the publisher is gone"), "{reason}");
    assert!(reason.contains("nothing listens on"), "the socket is still named: {reason}");
    assert_eq!(sub.stats().handshakes, 0);
}

/// A session lists the keys of our publishers it sees, and those a subscriber's key
/// does not match; a key that is not a key expression is an error, not an empty list.
#[test]
fn a_session_names_the_publishers_a_key_does_not_match() {
    const TEST: &str = "a_session_names_the_publishers_a_key_does_not_match";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let port = free_tcp_port();
    let session = host_session(port, true);
    let other = host_session(port, false);
    let root = test_key(TEST);
    let (a, b) = (format!("{root}/camera/left"), format!("{root}/lidar"));
    let _pa = other.declare_publisher(a.clone()).wait().expect("declare publisher");
    let _pb = other.declare_publisher(b.clone()).wait().expect("declare publisher");
    let t = Duration::from_millis(500);
    let mine = |keys: Vec<String>| keys.into_iter().filter(|k| k.starts_with(&root)).collect::<Vec<_>>();
    wait_until("both publishers to be listed", IO, || mine(session.publisher_keys(t).unwrap()).len() == 2);
    assert_eq!(mine(session.publisher_keys(t).unwrap()), [a.clone(), b.clone()]);
    assert_eq!(mine(session.other_publisher_keys(&format!("{root}/camera/*"), t).unwrap()), std::slice::from_ref(&b));
    assert_eq!(mine(session.other_publisher_keys(&format!("{root}/lidr"), t).unwrap()), [a, b]);
    assert!(mine(session.other_publisher_keys(&format!("{root}/**"), t).unwrap()).is_empty());
    assert!(session.other_publisher_keys("/leading/slash", t).is_err());
}

/// A publisher whose blocks travel only as a handle type this build cannot import (a
/// later release's fabric handles, say) is refused at its `Welcome`, with the reason,
/// and its messages keep coming as bytes.
#[test]
fn a_publisher_exporting_no_handle_type_we_import_is_refused() {
    const TEST: &str = "a_publisher_exporting_no_handle_type_we_import_is_refused";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let port = free_tcp_port();
    let session = host_session(port, true);
    let key = test_key(TEST);
    let sub = session.declare_subscriber(key.clone()).wait().expect("declare subscriber");
    let raw = raw_session(port);
    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).expect("bind the publisher's socket");
    let instance = 0xfab0_0000_0000_0001;
    let group = Group { boot_id: zcs_memory::host::boot_id().unwrap(), device: "host".into() };
    let token = Token { role: Role::Pub, key, instance, group, socket: Some(name.to_key_chunk()) };
    let _token = raw.liveliness().declare_token(token.to_key()).wait().expect("declare token");
    let conn = listener.accept_timeout(IO).expect("the subscriber connects");
    let hello = protocol::decode::<Request>("hello", &conn.recv(IO).expect("hello").bytes).expect("decode hello");
    assert!(matches!(hello, Request::Hello { handles, .. } if handles & protocol::HANDLE_POSIX_FD != 0), "{hello:?}");
    let probe = zcs_memory::host::HostBlock::create(c"fabric-probe", 4096).expect("probe memfd");
    let welcome = Reply::Welcome {
        publisher: instance,
        holder: 1,
        capability_key: [7; 16],
        probe_size: 4096,
        probe_token: 1,
        provider: None,
        handles: protocol::HANDLE_FABRIC,
    };
    conn.send(&protocol::encode(&welcome), &[probe.fd()]).expect("send welcome");
    wait_until("the handshake to fail", IO, || sub.stats().handshake_failures == 1);
    let reason = sub.bytes_reason(instance).expect("a reason for the bytes path");
    assert!(reason.contains("no block handle type in common (the publisher exports 0x08"), "{reason}");
    assert_eq!(sub.stats().handshakes, 0);
}

/// A publisher puts the bytes it copied out of a large block through its bytes lane
/// (the put returns before Zenoh has them), and smaller messages put while the lane
/// holds one go behind it. A plain subscriber gets every message once, in sequence
/// order, with its own length, including those the lane still held when the publisher
/// was dropped right after its last put.
#[test]
fn bytes_lane_keeps_sequence_order_and_empties_on_drop() {
    const TEST: &str = "bytes_lane_keeps_sequence_order_and_empties_on_drop";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let (port, key, n) = (free_tcp_port(), test_key(TEST), 90u64);
    let session = host_session(port, true);
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let raw = raw_session(port);
    let (tx, rx) = mpsc::channel();
    let _plain = raw
        .declare_subscriber(key)
        .callback(move |s| {
            let header = s.attachment().and_then(|a| protocol::decode_attachment(&a.to_bytes()).ok().flatten());
            let _ = tx.send((header.map(|h| h.seq), s.payload().len()));
        })
        .wait()
        .expect("declare plain subscriber");
    wait_until("the plain subscriber", IO, || publisher.plain_subscribers());
    // Through the lane (≥ 256 KiB), at once unless the lane is busy, and inline.
    let len_of = |seq: u64| match seq % 3 {
        0 => 300 * KIB + seq as usize,
        1 => 64 * KIB + seq as usize,
        _ => 100,
    };
    for seq in 1..=n {
        match len_of(seq) {
            100 => assert_eq!(publisher.put_bytes(&[seq as u8; 100]).expect("put bytes").seq, seq),
            len => _ = publish_block(&publisher, seq, len),
        }
    }
    assert!(len_of(n) >= 256 * KIB, "the last message goes through the lane");
    drop(publisher);
    let got: Vec<(Option<u64>, usize)> = (0..n).map(|_| rx.recv_timeout(IO).expect("a message")).collect();
    let want: Vec<(Option<u64>, usize)> = (1..=n).map(|seq| (Some(seq), len_of(seq))).collect();
    assert_eq!(got, want);
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "a message came twice");
}

/// A message larger than Zenoh's largest (`transport/link/rx/max_message_size`), put
/// as bytes, never reaches a receiver with that limit, and Zenoh tells neither side: the
/// publisher counts it (and logs it), and the messages around it still arrive.
#[test]
fn another_publishers_loan_is_refused_and_goes_back_to_its_pool() {
    const TEST: &str = "another_publishers_loan_is_refused_and_goes_back_to_its_pool";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let (port, key) = (free_tcp_port(), test_key(TEST));
    let session = host_session(port, true);
    let a = session.declare_publisher(format!("{key}/a")).wait().expect("declare a");
    let b = session.declare_publisher(format!("{key}/b")).wait().expect("declare b");
    let loan = a.loan(4096).expect("loan from a");
    assert!(a.owns(&loan) && !b.owns(&loan));
    match b.put(loan) {
        Err(zenoh_cuda_shm::PutError::ForeignLoan { key: k }) => assert_eq!(k, format!("{key}/b")),
        other => panic!("b put a's loan: {other:?}"),
    }
    assert_eq!(b.stats().messages, 0, "nothing was published");
    assert_eq!(a.pool_stats().blocks_in_use, 0, "the block went back to a's pool");
    assert_eq!(publish_block(&a, 1, 4096).seq, 1, "a still numbers from 1");
}

#[test]
fn bytes_over_zenohs_largest_message_are_counted() {
    const TEST: &str = "bytes_over_zenohs_largest_message_are_counted";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let limit = |mut c: zenoh::Config| {
        c.insert_json5("transport/link/rx/max_message_size", "1048576").expect("max_message_size");
        c
    };
    let port = free_tcp_port();
    let session = GpuSession::open(limit(zenoh_config(port, true)), host_config()).wait().expect("open host session");
    let raw = zenoh::open(limit(zenoh_config(port, false))).wait().expect("open zenoh session");
    let key = test_key(TEST);
    let plain = raw.declare_subscriber(key.clone()).wait().expect("plain subscriber");
    let p = session.declare_publisher(key).wait().expect("declare publisher");
    wait_until("the plain subscriber", IO, || p.plain_subscribers());
    publish_block(&p, 1, 2048 * KIB);
    publish_block(&p, 2, 256 * KIB);
    let s = plain.recv_timeout(IO).expect("subscriber channel").expect("the 256 KiB message");
    assert_eq!(s.payload().len(), 256 * KIB, "the 2 MiB message was not dropped: is the limit still enforced?");
    assert_eq!(check_pattern(&s.payload().to_bytes(), 0, 2), None);
    assert!(plain.recv_timeout(Duration::from_millis(300)).expect("subscriber channel").is_none());
    let st = p.stats();
    assert_eq!((st.copies_out, st.oversized_bytes), (2, 1), "{st:?}");
}

/// `host_id` is what says "this host": sessions of one kernel with different ids
/// exchange bytes, with the reason a user would see across hosts, and never try a
/// handshake; with the same id they link as usual.
#[test]
fn sessions_with_different_host_ids_take_bytes_as_hosts_do() {
    const TEST: &str = "sessions_with_different_host_ids_take_bytes_as_hosts_do";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let with_id = |id: &str| ZcsConfig { host_id: Some(HostId::new(id).unwrap()), ..host_config() };
    let port = free_tcp_port();
    let publisher_session = host_session_with(port, true, with_id("host-a"));
    for (sub_id, path) in [("host-b", Path::CpuBytes), ("host-a", Path::ZeroCopy)] {
        let key = format!("{}/{sub_id}", test_key(TEST));
        let session = host_session_with(port, false, with_id(sub_id));
        let sub = session.declare_subscriber(key.clone()).wait().expect("declare subscriber");
        let p = publisher_session.declare_publisher(key).wait().expect("declare publisher");
        wait_until("the subscriber to see its publisher", IO, || p.aware_subscribers() == 1);
        if path == Path::ZeroCopy {
            wait_zero_copy_only(&p, 1);
        }
        let len = 256 * KIB;
        publish_block(&p, 1, len);
        let s = recv(&sub, sub_id);
        assert_eq!(s.path(), path, "{sub_id}");
        assert_eq!(check_pattern(&s.host_bytes().expect("host memory"), 0, 1), None, "{sub_id}");
        assert_eq!(s.len(), len);
        let (instance, zero_copy) = sub.publishers()[0];
        assert_eq!(zero_copy, path == Path::ZeroCopy, "{sub_id}");
        let reason = sub.bytes_reason(instance);
        match path {
            Path::CpuBytes => assert_eq!(reason.as_deref(), Some("on another host")),
            _ => assert_eq!(reason, None),
        }
        assert_eq!(sub.stats().handshake_failures, 0, "{sub_id}: no handshake across host ids");
        assert_eq!(sub.stats().handshakes, u64::from(path == Path::ZeroCopy), "{sub_id}");
    }
}

/// One put on `<key>/@zcs/b` with a well-formed header that names the real publisher
/// and a huge sequence number: the subscriber delivers the forged payload and then
/// drops every real message of that publisher as a duplicate, zero-copy ones
/// included — unless deduplication only remembers sequence numbers it delivered (it
/// does), rather than a high-water mark an unauthenticated header could push.
#[test]
fn forged_bytes_header_cannot_silence_a_publisher() {
    const TEST: &str = "forged_bytes_header_cannot_silence_a_publisher";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let mut x = Target::new(TEST);
    x.real_messages(TEST);
    x.put(&protocol::bytes_key(&x.key), vec![0xa5u8; 4096], Some(x.forged_header()));
    assert_quiet(&x.sub, "after the forged bytes header");
    x.real_messages(TEST);
    let Target { kids, .. } = x;
    kids.finish();
}

// ---------------------------------------------------------------------------------
// Children
// ---------------------------------------------------------------------------------

/// Entry point of child processes; ignored in normal runs.
#[test]
#[ignore = "entry point of child processes started by the tests above"]
fn child_entry() {
    let Some(role) = child_role() else {
        return; // run directly (e.g. with --include-ignored): nothing to do
    };
    let _watchdog = watchdog_guard("pubsub child", TEST_LIMIT);
    let name = SocketName::from_key_chunk(&std::env::var(SOCK_ENV).expect(SOCK_ENV)).unwrap();
    let conn = ControlConn::connect(&name, IO).expect("connect to the parent");
    let (Ctl::Params(p), _) = recv_msg::<Ctl>(&conn, IO) else { panic!("expected Params") };
    match role.as_str() {
        "sub" => child_sub(&conn, &p),
        "pub" => child_pub(&conn, &p),
        "plain_sub" => child_plain_sub(&conn, &p),
        "plain_pub" => child_plain_pub(&conn, &p),
        other => panic!("unknown child role {other:?}"),
    }
}

fn expect_ctl(conn: &ControlConn, want: &str) -> Ctl {
    let (msg, _) = recv_msg::<Ctl>(conn, IO);
    assert!(format!("{msg:?}").starts_with(want), "expected {want}, got {msg:?}");
    msg
}

/// A GPU-aware subscriber: receives `n` messages (a late joiner: up to seq `n`),
/// checking each, optionally keeping the last `hold` alive.
fn child_sub(conn: &ControlConn, p: &Params) {
    let session = host_session(p.port, false);
    let declare = || session.declare_subscriber(p.key.clone()).wait().expect("declare subscriber");
    let early = (!p.late).then(declare);
    send_msg(conn, &Ctl::Ready, &[]);
    let sub = match early {
        Some(s) => s,
        None => {
            expect_ctl(conn, "Go");
            declare()
        }
    };
    let mut checker = Checker::new(p.len, p.path, p.late);
    let mut held = VecDeque::new();
    let summary = |c: &Checker, s: &Sub| Summary { sub: Some(sub_counters(s)), ..c.summary.clone() };
    loop {
        let sample = recv(&sub, "subscriber child");
        checker.check(&sample);
        if p.hold > 0 {
            held.push_back(sample);
            if held.len() > p.hold {
                held.pop_front();
            }
        }
        let done = if p.late { checker.summary.last_seq == p.n } else { checker.summary.received == p.n };
        if done {
            break;
        }
    }
    assert_quiet(&sub, "subscriber child");
    checker.finish();
    let keeper = p.keeper.then(fork_keeper);
    send_msg(conn, &Ctl::Done(Summary { keeper, ..summary(&checker, &sub) }), &[]);
    expect_ctl(conn, "Stop");
    drop(held);
}

/// Forks a process that inherits every descriptor of this one, its control connections
/// included, and only sleeps (30 s at most, or until killed): the way a helper forked
/// without `exec` keeps a dead process's connections open.
fn fork_keeper() -> i32 {
    // SAFETY: the child makes only async-signal-safe calls (nanosleep, _exit), so it
    // needs no lock that another thread of this process may have held at the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let tenth = libc::timespec { tv_sec: 0, tv_nsec: 100_000_000 };
        for _ in 0..300 {
            // SAFETY: `tenth` is a valid timespec and no remainder is asked for.
            unsafe { libc::nanosleep(&tenth, std::ptr::null_mut()) };
        }
        // SAFETY: ends this process at once, running nothing inherited from the parent.
        unsafe { libc::_exit(0) }
    }
    pid
}

/// One of our publishers: waits for its zero-copy subscribers, then publishes `n`
/// messages per `Go` until `Stop`.
fn child_pub(conn: &ControlConn, p: &Params) {
    let LenRule::Fixed(len) = p.len else { panic!("publishers take a fixed length") };
    let session = host_session(p.port, false);
    let publisher = session.declare_publisher(p.key.clone()).wait().expect("declare publisher");
    wait_until("zero-copy subscribers", IO, || publisher.zero_copy_subscribers() >= p.zero_copy_subs);
    send_msg(conn, &Ctl::Ready, &[]);
    let mut seq = 0;
    while let Ctl::Go = expect_ctl(conn, "") {
        for _ in 0..p.n {
            seq += 1;
            let r = publish_block(&publisher, seq, len);
            assert_eq!((r.zero_copy, r.copied_out), (p.zero_copy_subs, false), "seq {seq}: {r:?}");
        }
        send_msg(conn, &Ctl::Done(Summary::default()), &[]);
    }
}

/// A plain Zenoh subscriber (no zenoh-cuda-shm) on the user's key.
fn child_plain_sub(conn: &ControlConn, p: &Params) {
    let LenRule::Fixed(len) = p.len else { panic!("fixed length") };
    let session = raw_session(p.port);
    let sub = session.declare_subscriber(p.key.clone()).wait().expect("declare plain subscriber");
    send_msg(conn, &Ctl::Ready, &[]);
    let mut summary = Summary::default();
    for seq in p.first_seq..p.first_seq + p.n {
        let s =
            sub.recv_timeout(IO).expect("plain recv").unwrap_or_else(|| panic!("plain: no seq {seq} within {IO:?}"));
        let att = s.attachment().expect("our publishers attach a header").to_bytes();
        let h = protocol::decode_attachment(&att).expect("header").expect("ours");
        assert_eq!((h.seq, h.from_block), (seq, true), "plain: header (a gap or a duplicate)");
        let bytes = s.payload().to_bytes();
        assert_eq!(bytes.len(), len, "plain seq {seq}: length");
        assert_eq!(check_pattern(&bytes, 0, seq), None, "plain seq {seq}: content");
        summary.received += 1;
        if summary.first_seq == 0 {
            summary.first_seq = seq;
        }
        summary.last_seq = seq;
    }
    summary.by_path = vec![(Path::Plain, summary.received)];
    if let Ok(Some(s)) = sub.recv_timeout(GRACE) {
        panic!("plain: unexpected extra sample of {} bytes", s.payload().len());
    }
    send_msg(conn, &Ctl::Done(summary), &[]);
    expect_ctl(conn, "Stop");
}

/// A plain Zenoh publisher (no zenoh-cuda-shm); every other message carries an
/// attachment that is not ours.
fn child_plain_pub(conn: &ControlConn, p: &Params) {
    let LenRule::Fixed(len) = p.len else { panic!("fixed length") };
    let session = raw_session(p.port);
    let publisher = session
        .declare_publisher(p.key.clone())
        .congestion_control(CongestionControl::Block)
        .wait()
        .expect("declare plain publisher");
    wait_until("a subscriber on the plain key", IO, || publisher.matching_status().wait().unwrap().matching());
    send_msg(conn, &Ctl::Ready, &[]);
    expect_ctl(conn, "Go");
    for i in 1..=p.n {
        let mut data = vec![0u8; len];
        fill_pattern(&mut data, 0, i);
        let b = publisher.put(data);
        if i % 2 == 0 { b.attachment(b"rmw\x00gid".to_vec()).wait() } else { b.wait() }.expect("plain put");
    }
    send_msg(conn, &Ctl::Done(Summary::default()), &[]);
    expect_ctl(conn, "Stop");
}

/// A callback subscriber that drops itself from inside its callback: on a small message
/// (inline, delivered on a Zenoh thread) and on a block (delivered on the subscriber's
/// link thread). Neither call deadlocks or panics, no sample comes after the drop
/// returned, and the publisher sees the subscriber leave and gets its blocks back.
#[test]
fn callback_subscriber_dropped_inside_its_callback() {
    const TEST: &str = "callback_subscriber_dropped_inside_its_callback";
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    for (case, len) in [("inline", 100usize), ("block", 256 * KIB)] {
        let (port, key) = (free_tcp_port(), format!("{}/{case}", test_key(TEST)));
        let pub_session = host_session(port, true);
        let publisher = pub_session.declare_publisher(key.clone()).wait().expect("declare publisher");
        let sub_session = host_session(port, false);
        type Slot = std::sync::Mutex<Option<GpuSubscriber<()>>>;
        let slot: std::sync::Arc<Slot> = std::sync::Arc::default();
        let (tx, rx) = mpsc::channel::<(u64, bool)>();
        let held = std::sync::Arc::clone(&slot);
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let after = std::sync::Arc::clone(&dropped);
        let sub = sub_session
            .declare_subscriber(key.clone())
            .callback(move |s| {
                // Reports each call and whether the drop had already returned; the first
                // call drops the subscriber (the lock is not held across the drop).
                let _ = tx.send((s.seq(), after.load(std::sync::atomic::Ordering::SeqCst)));
                let mine = held.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(me) = mine {
                    drop(me);
                    after.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            })
            .wait()
            .expect("declare callback subscriber");
        *slot.lock().unwrap() = Some(sub);
        wait_until(&format!("{case}: the subscriber"), IO, || publisher.aware_subscribers() == 1);
        if len > 64 * KIB {
            wait_zero_copy_only(&publisher, 1);
        }
        // Put until the first call has dropped the subscriber (an early put may still
        // go to the plain key while the subscriber's listening there ends).
        let mut seq = 0;
        while !dropped.load(std::sync::atomic::Ordering::SeqCst) {
            seq += 1;
            publish_block(&publisher, seq, len);
            std::thread::sleep(Duration::from_millis(20));
            assert!(seq < 500, "{case}: the callback was never called");
        }
        for more in seq + 1..=seq + 5 {
            publish_block(&publisher, more, len);
        }
        wait_until(&format!("{case}: the subscriber gone"), IO, || publisher.aware_subscribers() == 0);
        let calls: Vec<(u64, bool)> = rx.try_iter().collect();
        assert!(!calls.is_empty(), "{case}: no call");
        assert!(calls.iter().all(|&(_, late)| !late), "{case}: a sample came after the drop: {calls:?}");
        wait_pool_empty(&publisher, &case);
    }
}
