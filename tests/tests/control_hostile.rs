//! Hostile peers on a real publisher's control socket (host backend, no GPU needed).
//!
//! The publisher runs in this process with a real Zenoh session on loopback TCP; the
//! attackers are raw [`ControlConn`]s that speak the control protocol by hand. Each
//! test checks what the issue asks of hostile input: a clear, bounded outcome (the
//! connection is refused or closed within the handshake timeout), nothing handed out,
//! the publisher's pool whole again, descriptors and threads back to their baseline,
//! and a real subscriber served correctly afterwards.
//!
//! `other_uid_peer_gets_no_fd` runs its attacker as uid 65534 (a re-executed copy of
//! this binary that drops privileges), so it needs root; elsewhere it prints
//! `SKIPPED other_uid_peer_gets_no_fd: <reason>`.
//!
//! The tests of this binary run one at a time (a shared lock): they count the
//! process's descriptors and threads.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_memory::host::{HostBlock, boot_id};
use zcs_pool::{BlockKey, CapabilityKey};
use zcs_tests::{child_role, free_tcp_port, loopback_zenoh_config, spawn_child, watchdog_guard};
use zcs_tests::{open_fd_count, thread_count};
use zcs_wire::ipc::{
    AccessPolicy, ControlConn, DEFAULT_MAX_CONNECTIONS, MAX_FRAME_BYTES, MAX_FRAME_FDS, RecvError, SocketName,
};
use zcs_wire::protocol::{self, Descriptor, Group, Reply, Request, Role, Token};
use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, GpuSubscriber, Path, ZcsConfig};

const MIB: usize = 1 << 20;
/// Bound on any single wait.
const IO: Duration = Duration::from_secs(20);
/// The publisher's handshake timeout in these tests (short, so silent peers go fast).
const HANDSHAKE: Duration = Duration::from_millis(400);
/// The handshake timeout of the flood test: longer than opening its connections takes
/// even on a loaded machine under AddressSanitizer, so that no slot frees up before the
/// last connection arrives (one did, and the publisher rightly accepted a connection
/// over the count, with two cores shared with a build).
const FLOOD_HANDSHAKE: Duration = Duration::from_secs(3);
/// How long after the handshake timeout a silent or hostile peer may still be connected.
const CLOSE_MARGIN: Duration = Duration::from_secs(3);
const TEST_LIMIT: Duration = Duration::from_secs(120);
const KEY_ROOT: &str = "zcs-test/hostile";
/// Child role and environment for the other-uid attacker.
const OTHER_UID_ROLE: &str = "other-uid";
const SOCKET_ENV: &str = "ZCS_HOSTILE_SOCKET";
const FD_REQUEST_ENV: &str = "ZCS_HOSTILE_FD_REQUEST";
const NOBODY: u32 = 65534;
/// Exit code of a child that could not drop privileges.
const CHILD_CANNOT_SETUID: i32 = 77;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
    t.elapsed()
}

fn host_group() -> Group {
    Group { boot_id: boot_id().expect("boot_id"), device: "host".into() }
}

/// Descriptors and threads of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    fds: usize,
    threads: usize,
}

fn usage() -> Usage {
    Usage { fds: open_fd_count().expect("fd count"), threads: thread_count().expect("thread count") }
}

/// Waits until descriptors and threads are back to (at most) `base`, counting one
/// descriptor for each block the publisher's pool keeps (a memfd each; free blocks
/// stay allocated until trimmed). Threads may be fewer: Zenoh retires idle workers.
fn back_to(base: Usage, pool_blocks_at_base: usize, publisher: &GpuPublisher, what: &str) -> Duration {
    let t = Instant::now();
    loop {
        let now = usage();
        let blocks = publisher.pool_stats().blocks;
        if now.fds + pool_blocks_at_base <= base.fds + blocks && now.threads <= base.threads {
            return t.elapsed();
        }
        assert!(t.elapsed() < IO, "{what}: still {now:?} ({blocks} pool blocks) after {IO:?}, baseline {base:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A publisher in this process, a raw Zenoh session beside it, and the publisher's
/// advertised control socket.
struct Rig {
    port: u16,
    key: String,
    _raw: zenoh::Session,
    publisher: GpuPublisher,
    session: GpuSession,
    socket: SocketName,
}

fn rig(test: &str) -> Rig {
    rig_with(test, HANDSHAKE)
}

/// [`rig`] with the publisher's handshake timeout `handshake`.
fn rig_with(test: &str, handshake: Duration) -> Rig {
    let port = free_tcp_port();
    let key = format!("{KEY_ROOT}/{}/{test}", std::process::id());
    let cfg = ZcsConfig {
        device: DeviceChoice::Host,
        handshake_timeout_ms: handshake.as_millis() as u64,
        ..Default::default()
    };
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(KEY_ROOT)), cfg)
        .wait()
        .expect("open publisher session");
    let publisher = session.declare_publisher(key.clone()).wait().expect("declare publisher");
    let raw = zenoh::open(loopback_zenoh_config(None, Some(port), Some(KEY_ROOT))).wait().expect("raw session");
    // The socket comes from the publisher's liveliness token, as any peer would read it.
    let mut socket = None;
    wait_until("the publisher's token", IO, || {
        let replies = raw.liveliness().get(format!("{}/pub/**", protocol::TOKEN_ROOT)).wait().expect("get");
        while let Ok(r) = replies.recv() {
            if let Ok(s) = r.result()
                && let Some(t) = Token::parse(s.key_expr().as_str())
                && t.role == Role::Pub
                && t.key == key
            {
                socket = t.socket;
            }
        }
        socket.is_some()
    });
    let socket = SocketName::from_key_chunk(&socket.expect("socket chunk")).expect("advertised socket name");
    // Unguessable: 128 random bits, no PID.
    let SocketName::Abstract(name) = &socket else { panic!("expected an abstract socket, got {socket}") };
    let name = std::str::from_utf8(name).expect("ascii name");
    assert!(name.len() == 36 && name.starts_with("zcs-") && name[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    Rig { port, key, _raw: raw, publisher, session, socket }
}

impl Rig {
    fn connect(&self) -> ControlConn {
        ControlConn::connect(&self.socket, IO).expect("connect to the publisher")
    }

    /// Publishes a block of `len` bytes holding the pattern of `seq`.
    fn publish(&self, seq: u64, len: usize) {
        let mut loan = self.publisher.loan(len).expect("loan");
        fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq);
        let r = self.publisher.put(loan).expect("put");
        assert_eq!(r.seq, seq);
    }

    /// A real subscriber in a second session gets `n` zero-copy messages, every byte
    /// checked: the publisher still serves correctly.
    fn real_subscriber_is_served(&self, first_seq: u64, n: u64) {
        let cfg = ZcsConfig { device: DeviceChoice::Host, ..Default::default() };
        let s = GpuSession::open(loopback_zenoh_config(None, Some(self.port), Some(KEY_ROOT)), cfg)
            .wait()
            .expect("subscriber session");
        let sub: GpuSubscriber<flume::Receiver<GpuSample>> =
            s.declare_subscriber(self.key.clone()).wait().expect("declare subscriber");
        // Its own view (a count of the publisher's would also include hostile clients
        // whose connection threads have not yet seen their end).
        wait_until("the real subscriber's handshake", IO, || {
            sub.publishers().iter().any(|&(_, zero_copy)| zero_copy) && !self.publisher.plain_subscribers()
        });
        let len = MIB + 5;
        for seq in first_seq..first_seq + n {
            self.publish(seq, len);
            let sample = sub.recv_timeout(IO).expect("sample");
            assert_eq!((sample.info().seq, sample.info().path, sample.len()), (seq, Path::ZeroCopy, len));
            assert_eq!(check_pattern(&sample.to_vec().expect("read"), 0, seq), None, "seq {seq}");
        }
        drop(sub);
        drop(s);
        wait_until("the pool to be whole", IO, || self.publisher.pool_stats().blocks_in_use == 0);
    }
}

/// What a hostile connection ended with.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// `Refused { reason }`, then the connection closed.
    Refused(String),
    /// Closed without a reply.
    Closed,
}

/// Reads until the publisher closes the connection: at most one `Refused` (and never
/// a descriptor) may come first.
fn expect_closed(conn: &ControlConn, what: &str) -> End {
    expect_closed_within(conn, what, false, HANDSHAKE + CLOSE_MARGIN)
}

/// As [`expect_closed`]; with `welcome`, a `Welcome` carrying the probe (one fd, not a
/// block) must come first: the peer sent a valid `Hello` and then nothing.
fn expect_closed_after(conn: &ControlConn, what: &str, welcome: bool) -> End {
    expect_closed_within(conn, what, welcome, HANDSHAKE + CLOSE_MARGIN)
}

/// As [`expect_closed_after`], each wait at most `wait`.
fn expect_closed_within(conn: &ControlConn, what: &str, welcome: bool, wait: Duration) -> End {
    if welcome {
        let f = conn.recv(wait).expect("Welcome");
        assert!(matches!(protocol::decode::<Reply>("reply", &f.bytes), Ok(Reply::Welcome { .. })), "{what}");
        assert_eq!(f.fds.len(), 1, "{what}: the probe only");
    }
    let mut end = End::Closed;
    loop {
        match conn.recv(wait) {
            Ok(frame) => {
                assert!(frame.fds.is_empty(), "{what}: the publisher handed out {} fds", frame.fds.len());
                match protocol::decode::<Reply>("reply", &frame.bytes) {
                    Ok(Reply::Refused { reason }) if end == End::Closed => end = End::Refused(reason),
                    other => panic!("{what}: unexpected reply {other:?}"),
                }
            }
            Err(RecvError::Closed) => return end,
            Err(e) => panic!("{what}: expected the publisher to close the connection, got {e:?}"),
        }
    }
}

/// Sends a frame the way a peer that ignores our framing rules would: raw `sendmsg`,
/// any size, any number of descriptors.
fn raw_send(conn: &ControlConn, bytes: &[u8], nfds: usize) {
    let devnull: OwnedFd = std::fs::File::open("/dev/null").expect("/dev/null").into();
    let raw = vec![devnull.as_raw_fd(); nfds];
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    sendmsg::<()>(conn.as_fd().as_raw_fd(), &[IoSlice::new(bytes)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .expect("raw sendmsg");
}

fn hello(group: Group) -> Vec<u8> {
    protocol::encode(&Request::Hello { subscriber: rand::random(), group, lifeline: false, handles: protocol::HANDLES })
}

/// A subscriber played by hand: it finishes the real handshake (Hello, probe import,
/// Ack, Ready) and then sends whatever a test wants. Descriptors arrive on its
/// connection.
struct RawClient {
    conn: ControlConn,
    cap_key: CapabilityKey,
    /// Descriptors that arrived while waiting for an FD answer.
    pending: Mutex<std::collections::VecDeque<Descriptor>>,
}

impl RawClient {
    fn handshake(rig: &Rig) -> Self {
        let conn = rig.connect();
        conn.send(&hello(host_group()), &[]).expect("send Hello");
        let mut frame = conn.recv(IO).expect("Welcome");
        let Ok(Reply::Welcome { capability_key, probe_size, probe_token, .. }) =
            protocol::decode::<Reply>("reply", &frame.bytes)
        else {
            panic!("expected Welcome, got {:?}", protocol::decode::<Reply>("reply", &frame.bytes));
        };
        let probe = HostBlock::import(frame.fds.pop().expect("probe fd"), probe_size as usize).expect("probe");
        // SAFETY: the probe is a sealed memfd of `probe_size` ≥ 8 bytes (checked by
        // `import` against its size), mapped here and only read.
        let token = unsafe { (probe.as_ptr() as *const u64).read_unaligned() };
        assert_eq!(token, probe_token);
        conn.send(&protocol::encode(&Request::Ack { token: Some(token), error: None }), &[]).expect("Ack");
        let f = conn.recv(IO).expect("Ready");
        assert!(matches!(protocol::decode::<Reply>("reply", &f.bytes), Ok(Reply::Ready { .. })), "expected Ready");
        Self { conn, cap_key: CapabilityKey::from_bytes(capability_key), pending: Mutex::default() }
    }

    /// The next descriptor routed to us (charged a lease).
    fn next_descriptor(&self) -> Descriptor {
        if let Some(d) = self.pending.lock().unwrap_or_else(PoisonError::into_inner).pop_front() {
            return d;
        }
        loop {
            let f = self.conn.recv(IO).expect("descriptor");
            if let Ok(Reply::Block(d)) = protocol::decode::<Reply>("reply", &f.bytes) {
                assert_eq!(self.cap_key.capability(d.block), d.capability, "capability verifies");
                return d;
            }
        }
    }

    fn request_fd(&self, block: BlockKey, capability: u64) -> Result<(OwnedFd, u64), String> {
        self.conn.send(&protocol::encode(&Request::Fd { block, capability }), &[]).expect("send Fd");
        loop {
            let mut f = self.conn.recv(IO).expect("Fd reply");
            match protocol::decode::<Reply>("reply", &f.bytes).expect("decodable reply") {
                Reply::Fd { block: b, size } => {
                    assert_eq!((b, f.fds.len()), (block, 1));
                    return Ok((f.fds.pop().expect("fd"), size));
                }
                Reply::FdDenied { block: b, reason } => {
                    assert_eq!((b, f.fds.len()), (block, 0));
                    return Err(reason);
                }
                Reply::Block(d) => self.pending.lock().unwrap_or_else(PoisonError::into_inner).push_back(d),
                Reply::Inline { .. } | Reply::ViaBytes { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn release(&self, blocks: Vec<BlockKey>) {
        self.conn.send(&protocol::encode(&Request::Release { blocks }), &[]).expect("send Release");
    }
}

/// Garbage, unknown versions, truncated, oversized and empty frames, too many fds, the
/// wrong first message, another group, and silence: each connection is refused or
/// closed within the handshake timeout (plus a margin), never gets a descriptor, and
/// nothing else is disturbed.
#[test]
fn hostile_frames_before_the_handshake_are_refused_and_bounded() {
    const TEST: &str = "hostile_frames_before_the_handshake_are_refused_and_bounded";
    let _l = serial();
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let r = rig(TEST);
    let base = usage();
    let good = hello(host_group());
    let mut version2 = good.clone();
    version2[0] = protocol::VERSION + 1;
    let mut version0 = good.clone();
    version0[0] = 0;
    let mut trailing = good.clone();
    trailing.push(0);
    // Hello { subscriber: 1, group: { boot_id: <string of 2^32-1 bytes> ...: a length
    // far beyond the frame must be refused without allocating it.
    let huge_len = vec![protocol::VERSION, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f, b'x'];
    let lifeline = protocol::encode(&Request::Hello {
        subscriber: 1,
        group: host_group(),
        lifeline: true,
        handles: protocol::HANDLES,
    });
    let (lifeline2, good2) = (lifeline.clone(), good.clone());
    let other_group = hello(Group { boot_id: host_group().boot_id, device: "cuda-00".into() });
    let fabric_only = protocol::encode(&Request::Hello {
        subscriber: 1,
        group: host_group(),
        lifeline: false,
        handles: protocol::HANDLE_FABRIC,
    });
    let fd_first = protocol::encode(&Request::Fd { block: BlockKey { id: 0, alloc: 1, generation: 1 }, capability: 7 });
    let release_first =
        protocol::encode(&Request::Release { blocks: vec![BlockKey { id: 0, alloc: 1, generation: 1 }] });
    type Act = Box<dyn Fn(&ControlConn)>;
    let send = |b: Vec<u8>| -> Act { Box::new(move |c: &ControlConn| c.send(&b, &[]).expect("send")) };
    let cases: Vec<(&str, Act)> = vec![
        ("garbage", send(vec![0xa5; 300])),
        ("a later version", send(version2)),
        ("version 0", send(version0)),
        ("truncated Hello", send(good[..good.len() / 2].to_vec())),
        ("Hello + trailing byte", send(trailing)),
        ("length beyond the frame", send(huge_len)),
        ("another locality group", send(other_group)),
        ("no handle type in common", send(fabric_only)),
        ("Fd before Hello", send(fd_first)),
        ("Release before Hello", send(release_first)),
        // A Hello carries its lifeline's descriptor and nothing else: stray fds, a
        // lifeline announced but missing, or one that is not a sealed memfd whose word
        // names a thread are refused (the fds closed unread).
        ("Hello with stray fds", Box::new(move |c: &ControlConn| raw_send(c, &good, 3))),
        // A valid Hello: the handshake goes on (Welcome with the probe), then times out
        // waiting for the Ack.
        ("Hello, then silence", send(good2)),
        ("Hello announcing a lifeline without it", send(lifeline.clone())),
        ("Hello with /dev/null as its lifeline", Box::new(move |c: &ControlConn| raw_send(c, &lifeline, 1))),
        (
            "Hello with a lifeline nobody holds",
            Box::new(move |c: &ControlConn| {
                let unheld = zcs_memory::host::HostBlock::create(c"zcs-test-unheld", 4).expect("memfd");
                c.send(&lifeline2, &[unheld.fd()]).expect("send");
            }),
        ),
        ("oversized frame", Box::new(|c: &ControlConn| raw_send(c, &vec![1u8; MAX_FRAME_BYTES + 1], 0))),
        ("too many fds", Box::new(|c: &ControlConn| raw_send(c, &[protocol::VERSION, 0], MAX_FRAME_FDS + 4))),
        ("empty frame", Box::new(|c: &ControlConn| raw_send(c, &[], 2))),
        ("silence", Box::new(|_: &ControlConn| {})),
    ];
    let mut slowest = Duration::ZERO;
    for (what, act) in &cases {
        let conn = r.connect();
        let t = Instant::now();
        act(&conn);
        let end = expect_closed_after(&conn, what, what.starts_with("Hello, then"));
        if what.contains("lifeline") || what.contains("stray") {
            assert!(matches!(&end, End::Refused(r) if r.contains("lifeline")), "{what}: {end:?}");
        }
        if what.contains("handle type") {
            assert!(matches!(&end, End::Refused(r) if r.contains("handle type")), "{what}: {end:?}");
        }
        let took = t.elapsed();
        slowest = slowest.max(took);
        println!("{TEST}: {what}: {end:?} after {:.1} ms", took.as_secs_f64() * 1e3);
        if what.ends_with("silence") {
            assert!(took >= HANDSHAKE, "{what}: closed before the handshake timeout");
        }
        assert!(took < HANDSHAKE + CLOSE_MARGIN, "{what}: took {took:?}");
    }
    let st = r.publisher.stats();
    assert_eq!((st.handshakes, st.handshake_failures, st.fd_handouts), (0, cases.len() as u64, 0));
    let settled = back_to(base, 0, &r.publisher, "after the hostile frames");
    r.real_subscriber_is_served(1, 5);
    println!(
        "{TEST}: {} cases, slowest close {:.1} ms, resources back {:.1} ms later",
        cases.len(),
        slowest.as_secs_f64() * 1e3,
        settled.as_secs_f64() * 1e3
    );
    drop(r.session);
}

/// After a complete handshake, with leases held: a malformed or unexpected frame
/// closes the connection, and every lease it held is released at once.
#[test]
fn hostile_frames_after_the_handshake_release_every_lease() {
    const TEST: &str = "hostile_frames_after_the_handshake_release_every_lease";
    let _l = serial();
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let r = rig(TEST);
    let base = usage();
    let mut version2 = protocol::encode(&Request::Release { blocks: vec![] });
    version2[0] = protocol::VERSION + 1;
    type Act = Box<dyn Fn(&ControlConn)>;
    let send = |b: Vec<u8>| -> Act { Box::new(move |c: &ControlConn| c.send(&b, &[]).expect("send")) };
    let cases: Vec<(&str, Act)> = vec![
        ("garbage", send(vec![0x5a; 64])),
        ("a later version", send(version2)),
        ("second Hello", send(hello(host_group()))),
        ("stray Ack", send(protocol::encode(&Request::Ack { token: Some(1), error: None }))),
        ("oversized frame", Box::new(|c: &ControlConn| raw_send(c, &vec![1u8; MAX_FRAME_BYTES + 100], 0))),
        ("too many fds", Box::new(|c: &ControlConn| raw_send(c, b"\x01\x04\x00", MAX_FRAME_FDS + 1))),
    ];
    let mut seq = 0;
    let mut slowest = Duration::ZERO;
    for (what, act) in &cases {
        let client = RawClient::handshake(&r);
        for _ in 0..3 {
            seq += 1;
            r.publish(seq, MIB);
            client.next_descriptor();
        }
        assert_eq!(r.publisher.pool_stats().blocks_in_use, 3, "{what}: our three leases hold three blocks");
        let t = Instant::now();
        act(&client.conn);
        let end = expect_closed(&client.conn, what);
        assert_eq!(end, End::Closed, "{what}");
        let freed = wait_until("the hostile client's leases to be released", IO, || {
            r.publisher.pool_stats().blocks_in_use == 0
        });
        slowest = slowest.max(t.elapsed());
        println!("{TEST}: {what}: closed, 3 leases released {:.1} ms after the frame", freed.as_secs_f64() * 1e3);
    }
    wait_until("every disconnect counted", IO, || r.publisher.stats().disconnects == cases.len() as u64);
    back_to(base, 0, &r.publisher, "after the hostile clients");
    r.real_subscriber_is_served(seq + 1, 3);
    println!("{TEST}: slowest release {:.1} ms", slowest.as_secs_f64() * 1e3);
    drop(r.session);
}

/// A wrong capability, a capability of another block, a replay of a released block's
/// capability after the block was reused, and a new generation with the old
/// capability: all refused with `FdDenied` and counted; the right one is granted and
/// maps the bytes that were written. Releases of blocks not leased are refused.
#[test]
fn wrong_and_replayed_capabilities_are_refused() {
    const TEST: &str = "wrong_and_replayed_capabilities_are_refused";
    let _l = serial();
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let r = rig(TEST);
    let c = RawClient::handshake(&r);
    let len = MIB + 3;
    r.publish(1, len);
    let d1 = c.next_descriptor();
    r.publish(2, len);
    let d2 = c.next_descriptor();
    assert_ne!(d1.block.id, d2.block.id);

    let mut denied = 0;
    let mut deny = |block: BlockKey, cap: u64, what: &str| {
        let reason = c.request_fd(block, cap).expect_err(what);
        println!("{TEST}: {what}: denied ({reason})");
        denied += 1;
    };
    deny(d1.block, d1.capability ^ 1, "wrong capability");
    deny(d1.block, d2.capability, "another block's capability");
    deny(BlockKey { generation: d1.block.generation + 100, ..d1.block }, d1.capability, "future generation");
    deny(BlockKey { id: 4000, ..d1.block }, d1.capability, "unknown block");

    // The right one: granted, and the block holds what was written for seq 1.
    let (fd, size) = c.request_fd(d1.block, d1.capability).expect("the right capability is granted");
    let block = HostBlock::import(fd, size as usize).expect("import");
    // SAFETY: `block` maps `size` bytes of a sealed memfd; we hold a lease on it, so the
    // publisher does not write it while we read.
    let bytes = unsafe { std::slice::from_raw_parts(block.as_ptr(), len) };
    assert_eq!(check_pattern(bytes, 0, 1), None);
    drop(block);

    // Release seq 1 and 2: both blocks are free again, then reused by seq 3 and 4
    // with new generations.
    c.release(vec![d1.block, d2.block]);
    wait_until("our releases", IO, || r.publisher.pool_stats().blocks_in_use == 0);
    c.release(vec![d1.block]);
    c.release(vec![BlockKey { id: 77, alloc: 1, generation: 1 }]);
    wait_until("bad releases counted", IO, || r.publisher.stats().bad_releases == 2);
    r.publish(3, len);
    let d3 = c.next_descriptor();
    r.publish(4, len);
    let d4 = c.next_descriptor();
    assert!(d3.block.id == d1.block.id || d3.block.id == d2.block.id, "the pool reused a block");
    let old = if d3.block.id == d1.block.id { &d1 } else { &d2 };
    assert!(d3.block.generation > old.block.generation);
    deny(old.block, old.capability, "replayed capability of the block's previous generation");
    deny(d3.block, old.capability, "current generation with the previous capability");
    deny(
        BlockKey { generation: old.block.generation, ..d3.block },
        d3.capability,
        "current capability, old generation",
    );
    let (fd, _) = c.request_fd(d3.block, d3.capability).expect("current capability granted");
    drop(fd);
    // Counted by the publisher's thread after the FD went out: wait for it.
    wait_until("the handouts to be counted", IO, || r.publisher.stats().fd_handouts == 2);
    assert_eq!(r.publisher.stats().fd_denied, denied);
    c.release(vec![d3.block, d4.block]);
    wait_until("our last releases", IO, || r.publisher.pool_stats().blocks_in_use == 0);
    drop(r.session);
}

/// Twice the connection limit of idle peers: the publisher keeps at most the limit
/// (threads and descriptors bounded), closes the rest at once and the idle ones at
/// the handshake timeout, and returns to its baseline and serves a real subscriber.
#[test]
fn connection_flood_is_bounded_and_recovers() {
    const TEST: &str = "connection_flood_is_bounded_and_recovers";
    let _l = serial();
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let r = rig_with(TEST, FLOOD_HANDSHAKE);
    let base = usage();
    let n = 2 * DEFAULT_MAX_CONNECTIONS;
    let t = Instant::now();
    let mut flood = Vec::with_capacity(n);
    let mut peak = base;
    for i in 0..n {
        match ControlConn::connect(&r.socket, IO) {
            Ok(c) => flood.push(c),
            Err(e) => panic!("connect {i}: {e}"),
        }
        if i % 32 == 0 {
            let u = usage();
            peak = Usage { fds: peak.fds.max(u.fds), threads: peak.threads.max(u.threads) };
        }
    }
    // Counting what was closed at once means nothing if early connections timed out
    // (freeing slots) before the last ones came.
    let opened = t.elapsed();
    assert!(opened < FLOOD_HANDSHAKE, "opening {n} connections took {opened:?}, beyond the handshake timeout");
    let mut closed_early = 0;
    let mut last = Duration::ZERO;
    for (i, c) in flood.iter().enumerate() {
        let u = usage();
        peak = Usage { fds: peak.fds.max(u.fds), threads: peak.threads.max(u.threads) };
        let end = expect_closed_within(c, &format!("flood connection {i}"), false, FLOOD_HANDSHAKE + CLOSE_MARGIN);
        last = t.elapsed();
        if end == End::Closed {
            closed_early += 1;
        }
    }
    // Our own n client sockets are in this process's count too; the publisher's share
    // is at most the limit (accepted sockets) and one thread per accepted connection.
    let extra_threads = peak.threads - base.threads;
    let extra_fds = peak.fds - base.fds - n;
    println!(
        "{TEST}: {n} connections, {closed_early} closed at once, all closed {:.0} ms after the first; \
         peak +{extra_threads} threads, +{extra_fds} publisher-side fds",
        last.as_secs_f64() * 1e3
    );
    assert!(extra_threads <= DEFAULT_MAX_CONNECTIONS + 8, "threads not bounded: +{extra_threads}");
    assert!(extra_fds <= DEFAULT_MAX_CONNECTIONS + 8, "descriptors not bounded: +{extra_fds}");
    assert!(closed_early >= n - DEFAULT_MAX_CONNECTIONS, "only {closed_early} closed over the limit");
    assert!(last < FLOOD_HANDSHAKE + CLOSE_MARGIN + Duration::from_secs(5), "flood not cleared: {last:?}");
    drop(flood);
    back_to(base, 0, &r.publisher, "after the flood");
    r.real_subscriber_is_served(1, 3);
    drop(r.session);
}

// ------------------------------------------------------------------ other uid

/// WARN events of this crate, recorded process-wide (the publisher's accept loop runs
/// on its own thread).
fn warnings() -> &'static Mutex<Vec<String>> {
    static LOG: OnceLock<Arc<Mutex<Vec<String>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let rec = WarnRecorder(Arc::clone(&log));
        tracing::subscriber::set_global_default(rec).expect("no other global subscriber in this binary");
        log
    })
}

struct WarnRecorder(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl tracing::Subscriber for WarnRecorder {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        // The library's crates: zenoh-cuda-shm* and its layers zcs-*.
        *m.level() <= tracing::Level::WARN
            && (m.target().starts_with("zenoh_cuda_shm") || m.target().starts_with("zcs_"))
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = Fields(String::new());
        event.record(&mut f);
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(f.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A process running as uid 65534 connects to the publisher three times — once with a
/// Hello, once with an FD request naming a block that is published right now with its
/// valid capability, once saying nothing: every connection is closed before a single
/// frame is read, no descriptor reaches it, and the publisher logs the refusal once
/// with the peer's pid and uid. The same request from a handshaken same-uid peer is
/// granted, so only the uid stopped it.
#[test]
fn other_uid_peer_gets_no_fd() {
    const TEST: &str = "other_uid_peer_gets_no_fd";
    if !nix::unistd::geteuid().is_root() {
        // An unprivileged user namespace maps only our own uid, so the kernel would
        // still report that uid through SO_PEERCRED: another uid needs root (setuid).
        eprintln!("SKIPPED {TEST}: needs root to run the peer under another uid");
        return;
    }
    let _l = serial();
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let log = warnings();
    let r = rig(TEST);
    let legit = RawClient::handshake(&r);
    r.publish(1, MIB);
    let d = legit.next_descriptor();
    let request = protocol::encode(&Request::Fd { block: d.block, capability: d.capability });
    let child = spawn_child(
        "child_entry",
        OTHER_UID_ROLE,
        &[(SOCKET_ENV, r.socket.to_key_chunk()), (FD_REQUEST_ENV, zcs_tests::to_hex(&request))],
    );
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for the other-uid child");
    if out.status.code() == Some(CHILD_CANNOT_SETUID) {
        eprintln!("SKIPPED {TEST}: cannot setuid to {NOBODY} here");
        return;
    }
    assert!(out.status.success(), "other-uid child failed: {:?}", out.status);
    let refusals: Vec<String> = log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|m| m.contains("refused by access policy") && m.contains(&format!("uid={NOBODY} ")))
        .cloned()
        .collect();
    assert_eq!(refusals.len(), 1, "one warning for three refused connections: {refusals:?}");
    assert!(refusals[0].contains(&format!("pid={pid} ")), "{}", refusals[0]);
    let st = r.publisher.stats();
    assert_eq!((st.fd_handouts, st.handshakes), (0, 1));
    let (fd, _) = legit.request_fd(d.block, d.capability).expect("same request, same-uid handshaken peer");
    drop(fd);
    println!("{TEST}: uid {NOBODY} refused 3 times, logged once: {}", refusals[0]);
    drop(legit);
    drop(r.session);
}

/// Entry point of the re-executed test binary; a no-op in a normal test run.
#[test]
#[ignore = "child-process entry, run by other_uid_peer_gets_no_fd"]
fn child_entry() {
    if child_role().as_deref() != Some(OTHER_UID_ROLE) {
        return;
    }
    let _w = watchdog_guard("child_entry", Duration::from_secs(60));
    let dropped = nix::unistd::setgroups(&[])
        .and_then(|()| nix::unistd::setgid(nix::unistd::Gid::from_raw(NOBODY)))
        .and_then(|()| nix::unistd::setuid(nix::unistd::Uid::from_raw(NOBODY)));
    match dropped {
        Ok(()) => assert_eq!(nix::unistd::geteuid().as_raw(), NOBODY),
        Err(e) => {
            eprintln!("child: cannot drop to uid {NOBODY}: {e}");
            std::process::exit(CHILD_CANNOT_SETUID);
        }
    }
    let name = SocketName::from_key_chunk(&std::env::var(SOCKET_ENV).expect("socket")).expect("name");
    let request = zcs_tests::from_hex(&std::env::var(FD_REQUEST_ENV).expect("request")).expect("hex");
    let frames: [Option<Vec<u8>>; 3] = [Some(hello(host_group())), Some(request), None];
    for f in frames {
        // Our side accepts the root listener; the listener refuses us.
        let conn = ControlConn::connect_with_policy(&name, IO, &AccessPolicy::uids([0])).expect("connect");
        if let Some(f) = f {
            // The listener may already have closed us: a send error is fine too.
            let _ = conn.send(&f, &[]);
        }
        match conn.recv(IO) {
            Err(RecvError::Closed) => {}
            Ok(frame) => panic!("uid {NOBODY} got a frame with {} fds", frame.fds.len()),
            Err(e) => panic!("expected Closed, got {e:?}"),
        }
    }
}

/// Subscribers that leave while the publisher is in the middle of a put: a put takes
/// its list of ready subscribers, then charges each a lease; a subscriber that leaves in
/// between must not be charged a lease nobody will ever release. Raw clients handshake
/// and leave over and over (`Leave`, then releasing every descriptor that came up to
/// `Left`, then closing) while a thread publishes without pause; afterwards the pool
/// must be whole. (The window is microseconds, so this run rarely lands in it;
/// `pool::tests::a_departed_holder_cannot_be_charged_a_lease` pins the rule itself. A
/// client that closed without releasing would keep its leases while this process runs:
/// `slow_subscriber.rs` checks that.)
#[test]
fn subscribers_leaving_during_puts_leak_no_lease() {
    const TEST: &str = "subscribers_leaving_during_puts_leak_no_lease";
    let _l = serial();
    let _w = watchdog_guard(TEST, TEST_LIMIT);
    let r = Arc::new(rig(TEST));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (r2, stop2) = (Arc::clone(&r), Arc::clone(&stop));
    let putter = std::thread::spawn(move || {
        let mut seq = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            seq += 1;
            r2.publish(seq, 100 * 1024);
        }
        seq
    });
    let rounds = 60;
    for _ in 0..rounds {
        let c = RawClient::handshake(&r);
        let mut got = vec![c.next_descriptor().block];
        c.conn.send(&protocol::encode(&Request::Leave), &[]).expect("send Leave");
        loop {
            let f = c.conn.recv(IO).expect("frames up to Left");
            match protocol::decode::<Reply>("reply", &f.bytes) {
                Ok(Reply::Block(d)) => got.push(d.block),
                Ok(Reply::Left) => break,
                _ => {}
            }
        }
        got.extend(c.pending.lock().unwrap_or_else(PoisonError::into_inner).drain(..).map(|d| d.block));
        c.release(got);
        drop(c);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let puts = putter.join().expect("putter");
    let t = Instant::now();
    while r.publisher.pool_stats().blocks_in_use != 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = r.publisher.pool_stats();
    println!("{TEST}: {rounds} subscribers left during {puts} puts; blocks still in use: {}", st.blocks_in_use);
    assert_eq!(st.blocks_in_use, 0, "leases charged to departed subscribers: {st:?}");
}
