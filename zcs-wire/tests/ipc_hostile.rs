//! Hostile peers on the control channel: oversized frames, too many fds, empty frames,
//! hang-ups in the middle of an exchange. Each case must give a clear error, never a
//! panic, and leak no descriptor: every test counts `/proc/self/fd` before and after.
//! The tests of this binary run one at a time (a shared lock) so the counts are exact.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard, PoisonError, mpsc};
use std::time::{Duration, Instant};

use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use zcs_wire::ipc::{
    AccessPolicy, ControlConn, ControlListener, MAX_FRAME_BYTES, MAX_FRAME_FDS, RecvError, SendError, SocketName,
};

const STEP: Duration = Duration::from_secs(5);

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises the tests of this binary and checks that the fd table is the same size
/// at the end as at the start.
struct FdLeakCheck {
    before: usize,
    _lock: MutexGuard<'static, ()>,
    _watchdog: mpsc::Sender<()>,
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

fn leak_check(what: &'static str) -> FdLeakCheck {
    let lock = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(30)) {
            eprintln!("WATCHDOG: {what} still running after 30s; aborting");
            std::process::abort();
        }
    });
    FdLeakCheck { before: open_fds(), _lock: lock, _watchdog: tx }
}

impl FdLeakCheck {
    fn assert_no_leak(&self) {
        assert_eq!(open_fds(), self.before, "descriptor leak");
    }
}

fn memfds(n: usize) -> Vec<OwnedFd> {
    (0..n).map(|_| memfd_create(c"zcs-hostile", MFdFlags::MFD_CLOEXEC).expect("memfd_create")).collect()
}

/// A peer that ignores our framing rules: raw `sendmsg` on its socket.
fn raw_send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[OwnedFd]) -> nix::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    sendmsg::<()>(sock.as_raw_fd(), &[IoSlice::new(bytes)], cmsgs, MsgFlags::MSG_NOSIGNAL, None)
}

fn borrowed(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}

/// After a protocol violation both ends must see the connection as gone.
fn assert_dropped(us: &ControlConn, peer: &ControlConn) {
    assert!(matches!(us.recv(STEP), Err(RecvError::Closed)));
    assert!(matches!(us.send(b"x", &[]), Err(SendError::Closed)));
    assert!(matches!(peer.recv(STEP), Err(RecvError::Closed)));
    assert!(matches!(peer.send(b"x", &[]), Err(SendError::Closed)));
}

#[test]
fn ipc_hostile_oversized_frame() {
    let check = leak_check("ipc_hostile_oversized_frame");
    {
        let (a, b) = ControlConn::pair().expect("pair");
        // Ours: refused before anything is sent.
        let big = vec![7u8; MAX_FRAME_BYTES + 1];
        assert!(matches!(
            a.send(&big, &[]),
            Err(SendError::TooLarge { len, max }) if len == MAX_FRAME_BYTES + 1 && max == MAX_FRAME_BYTES
        ));
        // The limit itself is fine and arrives whole.
        a.send(&big[..MAX_FRAME_BYTES], &[]).expect("max-size frame");
        assert_eq!(b.recv(STEP).expect("recv").bytes.len(), MAX_FRAME_BYTES);
        // Theirs: MSG_TRUNC; the fds that came along are closed, the peer dropped.
        let fds = memfds(3);
        raw_send(a.as_fd(), &big, &fds).expect("raw send");
        drop(fds);
        match b.recv(STEP) {
            Err(e @ RecvError::TooLarge { max }) if max == MAX_FRAME_BYTES => {
                assert!(e.to_string().contains("longer than"));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_dropped(&b, &a);
    }
    check.assert_no_leak();
}

#[test]
fn ipc_hostile_too_many_fds() {
    let check = leak_check("ipc_hostile_too_many_fds");
    {
        let (a, b) = ControlConn::pair().expect("pair");
        let fds = memfds(MAX_FRAME_FDS + 4);
        assert!(matches!(
            a.send(b"x", &borrowed(&fds)),
            Err(SendError::TooManyFds { count, max }) if count == MAX_FRAME_FDS + 4 && max == MAX_FRAME_FDS
        ));
        // Exactly the maximum works.
        a.send(b"max", &borrowed(&fds[..MAX_FRAME_FDS])).expect("max fds");
        assert_eq!(b.recv(STEP).expect("recv").fds.len(), MAX_FRAME_FDS);
        // A peer that attaches more: MSG_CTRUNC; what arrived is closed.
        raw_send(a.as_fd(), b"many", &fds).expect("raw send");
        drop(fds);
        match b.recv(STEP) {
            Err(RecvError::TooManyFds { max, received }) => {
                assert_eq!(max, MAX_FRAME_FDS);
                assert_eq!(received, MAX_FRAME_FDS);
            }
            other => panic!("expected TooManyFds, got {other:?}"),
        }
        assert_dropped(&b, &a);
    }
    check.assert_no_leak();
}

#[test]
fn ipc_hostile_empty_frames() {
    let check = leak_check("ipc_hostile_empty_frames");
    {
        let (a, b) = ControlConn::pair().expect("pair");
        assert!(matches!(a.send(&[], &[]), Err(SendError::Empty)));
        raw_send(a.as_fd(), &[], &[]).expect("raw empty send");
        assert!(matches!(b.recv(STEP), Err(RecvError::Empty { fds: 0 })));
        assert_dropped(&b, &a);

        // Empty payload but descriptors attached: both closed, peer dropped.
        let (a, b) = ControlConn::pair().expect("pair");
        let fds = memfds(2);
        raw_send(a.as_fd(), &[], &fds).expect("raw empty send with fds");
        drop(fds);
        assert!(matches!(b.recv(STEP), Err(RecvError::Empty { fds: 2 })));
        assert_dropped(&b, &a);

        // Any number of descriptors with an empty payload, up to the limit and beyond.
        for n in 1..=MAX_FRAME_FDS + 4 {
            let (a, b) = ControlConn::pair().expect("pair");
            let fds = memfds(n);
            raw_send(a.as_fd(), &[], &fds).expect("raw empty send with fds");
            drop(fds);
            let before = open_fds();
            match b.recv(STEP) {
                Err(RecvError::Empty { fds }) => assert_eq!(fds, n.min(MAX_FRAME_FDS)),
                Err(RecvError::TooManyFds { max, .. }) => assert!(n > MAX_FRAME_FDS && max == MAX_FRAME_FDS),
                other => panic!("{n} fds: expected Empty or TooManyFds, got {other:?}"),
            }
            assert_eq!(open_fds(), before, "{n} fds with an empty frame: descriptor leaked");
            assert_dropped(&b, &a);
        }
    }
    check.assert_no_leak();
}

#[test]
fn ipc_hostile_peer_closes_mid_exchange() {
    let check = leak_check("ipc_hostile_peer_closes_mid_exchange");
    {
        // A frame sent just before the hang-up is delivered whole, then Closed.
        let (a, b) = ControlConn::pair().expect("pair");
        let fds = memfds(2);
        a.send(b"last words", &borrowed(&fds)).expect("send");
        drop(fds);
        drop(a);
        let f = b.recv(STEP).expect("frame before hang-up");
        assert_eq!((f.bytes.as_slice(), f.fds.len()), (&b"last words"[..], 2));
        drop(f);
        assert!(matches!(b.recv(STEP), Err(RecvError::Closed)));
        assert!(matches!(b.try_recv(), Err(RecvError::Closed)));
        assert!(matches!(b.send(b"x", &[]), Err(SendError::Closed)));

        // Hang-up while we are blocked in recv: Closed at once, not a timeout.
        let (a, b) = ControlConn::pair().expect("pair");
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(a);
        });
        let start = Instant::now();
        assert!(matches!(b.recv(STEP), Err(RecvError::Closed)));
        assert!(start.elapsed() < STEP);
        closer.join().expect("closer thread");

        // Hang-up with our frames unread on their side: our send sees Closed, no SIGPIPE.
        let (a, b) = ControlConn::pair().expect("pair");
        b.send(b"unread", &[]).expect("send");
        drop(a);
        assert!(matches!(b.send(b"x", &[]), Err(SendError::Closed)));
        assert!(matches!(b.recv(STEP), Err(RecvError::Closed)));

        // Same, but the peer had sent us a frame (with an fd) first: the kernel reports
        // ECONNRESET before it; the frame is still delivered, then Closed.
        let (a, b) = ControlConn::pair().expect("pair");
        b.send(b"unread", &[]).expect("send");
        let fds = memfds(1);
        a.send(b"final", &borrowed(&fds)).expect("send");
        drop(fds);
        drop(a);
        let f = b.recv(STEP).expect("frame survives the reset");
        assert_eq!((f.bytes.as_slice(), f.fds.len()), (&b"final"[..], 1));
        drop(f);
        assert!(matches!(b.recv(STEP), Err(RecvError::Closed)));
        assert!(matches!(b.send(b"x", &[]), Err(SendError::Closed)));

        // Explicit shutdown: the peer sees Closed while we still hold the fd.
        let (a, b) = ControlConn::pair().expect("pair");
        a.shutdown();
        assert!(matches!(b.recv(STEP), Err(RecvError::Closed)));
        assert!(matches!(a.recv(STEP), Err(RecvError::Closed)));
    }
    check.assert_no_leak();
}

#[test]
fn ipc_hostile_refused_peer_leaks_nothing() {
    let check = leak_check("ipc_hostile_refused_peer_leaks_nothing");
    {
        let me = nix::unistd::geteuid().as_raw();
        let listener = ControlListener::bind_with_policy(
            &SocketName::random_abstract(),
            AccessPolicy::uids([me.wrapping_add(4242)]),
        )
        .expect("bind");
        for _ in 0..3 {
            let client = ControlConn::connect(listener.name(), STEP).expect("connect");
            let fds = memfds(1);
            // A refused peer may already have queued a frame with fds: all released.
            client.send(b"hello?", &borrowed(&fds)).expect("send");
            assert!(listener.try_accept().expect("try_accept").is_none());
            assert!(matches!(client.recv(STEP), Err(RecvError::Closed)));
        }
        assert_eq!(listener.stats().refused, 3);
    }
    check.assert_no_leak();
}

#[test]
fn ipc_hostile_timeouts_leak_nothing() {
    let check = leak_check("ipc_hostile_timeouts_leak_nothing");
    {
        let (a, b) = ControlConn::pair().expect("pair");
        let start = Instant::now();
        assert!(matches!(b.recv(Duration::from_millis(30)), Err(RecvError::Timeout(_))));
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(b.try_recv().expect("try_recv").is_none());
        // Fill the socket: a reader that never reads makes send time out, not hang.
        let fds = memfds(1);
        let mut sent = 0usize;
        loop {
            match a.send_timeout(&[1u8; 4096], &borrowed(&fds), Duration::from_millis(20)) {
                Ok(()) => sent += 1,
                Err(SendError::Timeout(_)) => break,
                Err(e) => panic!("unexpected {e:?}"),
            }
            assert!(sent < 100_000, "socket never filled");
        }
        assert!(sent > 0);
        drop(fds);
        // Every queued frame (and its fd) is still delivered.
        for _ in 0..sent {
            let f = b.recv(STEP).expect("drain");
            assert_eq!(f.fds.len(), 1);
        }
        assert!(b.try_recv().expect("empty").is_none());
        // Dropping a connection with frames (and fds) still queued frees them too.
        let fds = memfds(2);
        a.send(b"queued", &borrowed(&fds)).expect("send");
        drop(fds);
        drop(b);
    }
    check.assert_no_leak();
}

#[test]
fn ipc_hostile_connection_flood_is_bounded() {
    let check = leak_check("ipc_hostile_connection_flood_is_bounded");
    {
        const MAX: usize = 4;
        let listener = ControlListener::bind(&SocketName::random_abstract()).expect("bind").with_max_connections(MAX);
        assert_eq!(listener.max_connections(), MAX);
        // More peers than the limit connect (and queue a frame) before anything is
        // accepted: the kernel's backlog holds them, accept keeps only MAX.
        let clients: Vec<ControlConn> = (0..5 * MAX)
            .map(|i| {
                let c = ControlConn::connect(listener.name(), STEP).expect("connect");
                c.send(format!("client {i}").as_bytes(), &[]).expect("send");
                c
            })
            .collect();
        let mut accepted = Vec::new();
        while let Some(conn) = listener.try_accept().expect("try_accept") {
            accepted.push(conn);
        }
        assert_eq!(accepted.len(), MAX);
        let stats = listener.stats();
        assert_eq!((stats.accepted, stats.over_limit, stats.live, stats.refused), (MAX as u64, 4 * MAX as u64, MAX, 0));
        // The first MAX are served; every other peer sees its connection closed, at once.
        for (i, c) in clients.iter().enumerate() {
            if i < MAX {
                assert_eq!(accepted[i].recv(STEP).expect("frame").bytes, format!("client {i}").as_bytes());
            } else {
                let start = Instant::now();
                assert!(matches!(c.recv(STEP), Err(RecvError::Closed)), "client {i}");
                assert!(start.elapsed() < STEP);
            }
        }
        // A slot given back is usable again.
        drop(accepted.pop());
        assert_eq!(listener.stats().live, MAX - 1);
        let late = ControlConn::connect(listener.name(), STEP).expect("connect");
        let again = listener.accept_timeout(STEP).expect("accept after a slot was freed");
        late.send(b"late", &[]).expect("send");
        assert_eq!(again.recv(STEP).expect("frame").bytes, b"late");
        drop((again, late, accepted, clients));
        assert_eq!(listener.stats().live, 0);
    }
    check.assert_no_leak();
}
