//! Control channel behaviour within one process: framing, fds, credentials, access
//! policy, path sockets and their 0700 directory. (Refusal logging is checked in
//! `ipc_refusal_log.rs`, alone in its binary so no other test races its callsites.)

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use zcs_wire::ipc::{
    AcceptError, AccessPolicy, BindError, ConnectError, ControlConn, ControlListener, DecodeNameError, MAX_FRAME_FDS,
    RecvError, RuntimeDirError, SocketName, ensure_runtime_dir,
};

const STEP: Duration = Duration::from_secs(5);

/// Aborts the process if not dropped within 30 s.
struct Watchdog {
    _alive: mpsc::Sender<()>,
}

fn watchdog(what: &'static str) -> Watchdog {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(30)) {
            eprintln!("WATCHDOG: {what} still running after 30s; aborting");
            std::process::abort();
        }
    });
    Watchdog { _alive: tx }
}

/// A scratch directory unique to this process and test, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let p = std::env::temp_dir().join(format!("zcs-ipc-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn memfd_with(content: &[u8]) -> OwnedFd {
    let fd = memfd_create(c"zcs-channel", MFdFlags::MFD_CLOEXEC).expect("memfd_create");
    assert_eq!(nix::sys::uio::pwrite(&fd, content, 0).expect("pwrite"), content.len());
    fd
}

fn read_all(fd: BorrowedFd<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let n = nix::sys::uio::pread(fd, &mut buf, 0).expect("pread");
    buf.truncate(n);
    buf
}

#[test]
fn ipc_channel_frames_with_fds_roundtrip() {
    let _wd = watchdog("ipc_channel_frames_with_fds_roundtrip");
    let (a, b) = ControlConn::pair().expect("pair");
    let files: Vec<OwnedFd> = (0..MAX_FRAME_FDS).map(|i| memfd_with(format!("block-{i}").as_bytes())).collect();
    let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(AsFd::as_fd).collect();
    a.send(b"sixteen", &borrowed).expect("send fds");
    // Message boundaries are kept: three frames in, three frames out.
    a.send(&[1], &[]).expect("send");
    a.send(&[2; 1000], &[]).expect("send");
    a.send(&[3; 3], &[]).expect("send");
    drop(files); // the receiver's copies are independent of ours

    let f = b.recv(STEP).expect("recv fds");
    assert_eq!(f.bytes, b"sixteen");
    assert_eq!(f.fds.len(), MAX_FRAME_FDS);
    for (i, fd) in f.fds.iter().enumerate() {
        let flags = FdFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFD).expect("F_GETFD"));
        assert!(flags.contains(FdFlag::FD_CLOEXEC), "fd {i} must be CLOEXEC");
        assert_eq!(read_all(fd.as_fd()), format!("block-{i}").as_bytes());
    }
    assert_eq!(b.recv(STEP).expect("1").bytes, [1]);
    assert_eq!(b.recv(STEP).expect("2").bytes, [2; 1000]);
    assert_eq!(b.try_recv().expect("3").expect("3").bytes, [3; 3]);
    assert!(b.try_recv().expect("none").is_none());

    // `a` sends on one thread and receives on another at once (`&self` methods);
    // `b` echoes every frame back.
    let a = Arc::new(a);
    let (a_tx, a_rx) = (Arc::clone(&a), Arc::clone(&a));
    let sender = std::thread::spawn(move || {
        for i in 0u32..2000 {
            a_tx.send(&i.to_le_bytes(), &[]).expect("send");
        }
    });
    let receiver = std::thread::spawn(move || {
        for i in 0u32..2000 {
            assert_eq!(a_rx.recv(STEP).expect("echo").bytes, i.to_le_bytes());
        }
    });
    for _ in 0u32..2000 {
        let f = b.recv(STEP).expect("recv");
        b.send(&f.bytes, &[]).expect("echo back");
    }
    sender.join().expect("sender");
    receiver.join().expect("receiver");
}

#[test]
fn ipc_channel_spinning_receive_gets_frames_and_keeps_its_timeout() {
    let _wd = watchdog("ipc_channel_spinning_receive_gets_frames_and_keeps_its_timeout");
    let (a, b) = ControlConn::pair().expect("pair");
    // A frame that comes while the receiver polls, and one that comes after the
    // polling gave way to sleeping in `poll`.
    let a = Arc::new(a);
    let a2 = Arc::clone(&a);
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        a2.send(b"during", &[]).expect("send");
        std::thread::sleep(Duration::from_millis(100));
        a2.send(b"after", &[]).expect("send");
    });
    assert_eq!(b.recv_spinning(STEP, Duration::from_millis(50)).expect("during").bytes, b"during");
    assert_eq!(b.recv_spinning(STEP, Duration::from_millis(10)).expect("after").bytes, b"after");
    sender.join().expect("sender");
    // A timeout shorter than the spin ends the wait.
    let t = Instant::now();
    let r = b.recv_spinning(Duration::from_millis(20), Duration::from_secs(5));
    assert!(matches!(r, Err(RecvError::Timeout(_))), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "waited {:?}", t.elapsed());
    // The peer's end is reported as while sleeping.
    drop(a);
    let r = b.recv_spinning(STEP, Duration::from_millis(50));
    assert!(matches!(r, Err(RecvError::Closed)), "{r:?}");
}

#[test]
fn ipc_channel_listener_accepts_same_uid_with_credentials() {
    let _wd = watchdog("ipc_channel_listener_accepts_same_uid_with_credentials");
    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).expect("bind");
    assert_eq!(listener.name(), &name);
    // The name travels through a liveliness-token chunk.
    let remote = SocketName::from_key_chunk(&name.to_key_chunk()).expect("decode");
    let client = ControlConn::connect(&remote, STEP).expect("connect");
    let server = listener.accept_timeout(STEP).expect("accept");
    let me = (std::process::id() as i32, nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    let s = server.peer_cred();
    let c = client.peer_cred();
    assert_eq!((s.pid, s.uid, s.gid), me);
    assert_eq!((c.pid, c.uid, c.gid), me);
    client.send(b"ping", &[]).expect("ping");
    assert_eq!(server.recv(STEP).expect("ping").bytes, b"ping");
    server.send(b"pong", &[]).expect("pong");
    assert_eq!(client.recv(STEP).expect("pong").bytes, b"pong");
    assert_eq!(listener.stats().accepted, 1);

    let start = Instant::now();
    assert!(matches!(listener.accept_timeout(Duration::from_millis(30)), Err(AcceptError::Timeout(_))));
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert!(listener.try_accept().expect("try_accept").is_none());
}

#[test]
fn ipc_channel_client_refuses_listener_of_other_uid() {
    let _wd = watchdog("ipc_channel_client_refuses_listener_of_other_uid");
    let listener = ControlListener::bind(&SocketName::random_abstract()).expect("bind");
    let other = nix::unistd::geteuid().as_raw().wrapping_add(4242);
    match ControlConn::connect_with_policy(listener.name(), STEP, &AccessPolicy::uids([other])) {
        Err(ConnectError::Refused { cred, .. }) => {
            assert_eq!(cred.pid, std::process::id() as i32);
        }
        other => panic!("expected Refused, got {other:?}"),
    }
}

#[test]
fn ipc_channel_connect_and_bind_errors() {
    let _wd = watchdog("ipc_channel_connect_and_bind_errors");
    let nobody = SocketName::random_abstract();
    assert!(matches!(ControlConn::connect(&nobody, STEP), Err(ConnectError::NotListening { .. })));
    let missing = SocketName::Path(std::env::temp_dir().join("zcs-ipc-no-such-dir/x.sock"));
    assert!(matches!(ControlConn::connect(&missing, STEP), Err(ConnectError::NotListening { .. })));
    assert!(matches!(
        ControlConn::connect(&SocketName::Abstract(vec![b'x'; 200]), STEP),
        Err(ConnectError::InvalidName { .. })
    ));
    let _l = ControlListener::bind(&nobody).expect("bind");
    assert!(matches!(ControlListener::bind(&nobody), Err(BindError::AddrInUse { .. })));
    assert!(matches!(
        ControlListener::bind(&SocketName::Path("relative.sock".into())),
        Err(BindError::InvalidName { .. })
    ));
    let e = SocketName::from_key_chunk("q00").unwrap_err();
    assert_eq!(e, DecodeNameError::UnknownKind { kind: 'q' });
}

#[test]
fn ipc_channel_path_socket_lifecycle() {
    let _wd = watchdog("ipc_channel_path_socket_lifecycle");
    let tmp = TempDir::new("path");
    let rt = tmp.0.join("nested").join("runtime");
    let name = SocketName::random_path_in(&rt).expect("runtime dir");
    let meta = std::fs::symlink_metadata(&rt).expect("runtime dir exists");
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    let SocketName::Path(path) = &name else { panic!("path name expected") };
    assert_eq!(path.parent(), Some(rt.as_path()));

    let listener = ControlListener::bind(&name).expect("bind path");
    assert!(std::fs::symlink_metadata(path).expect("socket file").file_type().is_socket());
    let remote = SocketName::from_key_chunk(&name.to_key_chunk()).expect("decode");
    assert_eq!(remote, name);
    let client = ControlConn::connect(&remote, STEP).expect("connect");
    let server = listener.accept_timeout(STEP).expect("accept");
    client.send(b"over a path", &[]).expect("send");
    assert_eq!(server.recv(STEP).expect("recv").bytes, b"over a path");
    drop(listener);
    assert!(!path.exists(), "socket file removed on drop");
    assert!(rt.is_dir(), "runtime dir stays");
    // Established connections outlive the listener.
    server.send(b"still here", &[]).expect("send");
    assert_eq!(client.recv(STEP).expect("recv").bytes, b"still here");

    // A file that replaced ours is not ours to remove.
    let name2 = SocketName::random_path_in(&rt).expect("name");
    let SocketName::Path(path2) = &name2 else { panic!("path name expected") };
    let listener2 = ControlListener::bind(&name2).expect("bind");
    std::fs::remove_file(path2).expect("remove");
    std::fs::write(path2, b"someone else's").expect("replace");
    drop(listener2);
    assert_eq!(std::fs::read(path2).expect("kept"), b"someone else's");
}

#[test]
fn ipc_channel_runtime_dir_refuses_insecure_dirs() {
    let _wd = watchdog("ipc_channel_runtime_dir_refuses_insecure_dirs");
    let tmp = TempDir::new("insecure");
    let open = tmp.0.join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert!(matches!(ensure_runtime_dir(&open), Err(RuntimeDirError::InsecureMode { mode: 0o755, .. })));
    assert!(matches!(
        ControlListener::bind(&SocketName::Path(open.join("s.sock"))),
        Err(BindError::RuntimeDir { source: RuntimeDirError::InsecureMode { .. }, .. })
    ));
    let private = tmp.0.join("private");
    ensure_runtime_dir(&private).expect("create");
    ensure_runtime_dir(&private).expect("idempotent");
    let link = tmp.0.join("link");
    std::os::unix::fs::symlink(&private, &link).expect("symlink");
    assert!(matches!(ensure_runtime_dir(&link), Err(RuntimeDirError::NotADirectory { .. })));
    let file = tmp.0.join("file");
    std::fs::write(&file, b"").expect("file");
    assert!(matches!(ensure_runtime_dir(&file), Err(RuntimeDirError::NotADirectory { .. })));
    if nix::unistd::geteuid().is_root() {
        // A directory of another user is refused even with the right mode.
        let theirs = tmp.0.join("theirs");
        ensure_runtime_dir(&theirs).expect("create");
        nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).expect("chown");
        assert!(matches!(ensure_runtime_dir(&theirs), Err(RuntimeDirError::WrongOwner { owner: 65534, .. })));
    }
}
