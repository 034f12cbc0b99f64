//! A subscriber whose control connection ends while it still holds samples must read
//! them, byte-exact, for as long as it holds them (gap G14), whichever side ended it:
//! - the publisher disconnects it as slow (its callback stopped returning, so its link
//!   stopped reading): it stops routing to it, but keeps that connection's leases until
//!   the subscriber has let go of them;
//! - the subscriber's own end is shut while its process runs on: the publisher keeps the
//!   leases until that process exits (it may still map the blocks), then frees them.
//!
//! Host memfd blocks, sessions over loopback Zenoh and real control sockets.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_tests::{child_role, free_tcp_port, loopback_zenoh_config, spawn_child, wait_child, watchdog_guard};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, Path, ZcsConfig};

const KEY: &str = "zcs-test/slow/frames";
/// Above the inline threshold: every message is a block.
const LEN: usize = 128 * 1024;
const FIFO: usize = 4;
const IO: Duration = Duration::from_secs(20);

fn session(listen: Option<u16>, connect: Option<u16>) -> GpuSession {
    let cfg = ZcsConfig { device: DeviceChoice::Host, ..Default::default() };
    GpuSession::open(loopback_zenoh_config(listen, connect, Some("zcs-test")), cfg).wait().expect("open session")
}

fn publish(p: &GpuPublisher) -> u64 {
    let mut loan = p.loan(LEN).expect("loan");
    let seq = p.stats().messages + 1;
    fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq);
    let r = p.put(loan).expect("put");
    assert_eq!(r.seq, seq);
    seq
}

fn check(s: &GpuSample, what: &str) {
    let seq = s.info().seq;
    let bytes = s.to_vec().unwrap_or_else(|e| panic!("{what}: seq {seq}: read failed: {e}"));
    assert_eq!(bytes.len(), LEN, "{what}: seq {seq}");
    if let Some((at, bad)) = check_pattern(&bytes, 0, seq) {
        panic!("{what}: seq {seq}: {bad} bytes from offset {at} were not written for it (its block was reused)");
    }
}

#[test]
fn a_subscriber_disconnected_as_slow_reads_what_it_held_and_queued() {
    let _w = watchdog_guard("slow subscriber test", Duration::from_secs(120));
    let port = free_tcp_port();
    let ps = session(Some(port), None);
    let ss = session(None, Some(port));
    // A callback that waits for room in the application's queue of FIFO samples when one
    // comes on the zero-copy link, and drops one that comes by bytes (a Zenoh callback
    // must not wait): once the application stops reading, it holds its link.
    let (tx, queue) = flume::bounded(FIFO);
    let sub = ss
        .declare_subscriber(KEY)
        .callback(move |s| {
            let _ = if s.path() == Path::ZeroCopy { tx.send(s).map_err(drop) } else { tx.try_send(s).map_err(drop) };
        })
        .wait()
        .expect("subscriber");
    let p = ps.declare_publisher(KEY).wait().expect("publisher");
    let t = Instant::now();
    while p.zero_copy_subscribers() < 1 {
        assert!(t.elapsed() < IO, "the subscriber never got on the zero-copy path");
        std::thread::sleep(Duration::from_millis(5));
    }

    // Two samples the application holds across everything that follows.
    let held: Vec<GpuSample> = (0..2)
        .map(|_| {
            publish(&p);
            let s = queue.recv_timeout(IO).expect("a held sample");
            assert_eq!(s.path(), Path::ZeroCopy);
            s
        })
        .collect();

    // The application stops reading: its queue fills, its callback waits, its link stops
    // reading the control socket, the socket fills, and a put gives up on it after the
    // push timeout.
    let t = Instant::now();
    while p.stats().slow_disconnects == 0 {
        assert!(t.elapsed() < IO, "the publisher never disconnected the subscriber as slow: {:?}", p.stats());
        publish(&p);
    }
    // Enough traffic afterwards that any block given back would be handed out again.
    for _ in 0..300 {
        publish(&p);
    }
    let in_use = p.pool_stats().blocks_in_use;
    assert!(in_use > FIFO, "the slow subscriber's blocks stay out of the pool: {} in use", in_use);

    for s in &held {
        check(s, "held across the disconnect");
    }
    // What it had queued, and what its link delivers as it drains the socket.
    let mut drained = 0;
    while let Ok(s) = queue.recv_timeout(Duration::from_millis(300)) {
        check(&s, "queued at the disconnect");
        drained += 1;
    }
    assert!(drained >= FIFO, "only {drained} samples were queued");
    // It handshakes again and is back on the zero-copy path.
    let (t, mut zero_copy) = (Instant::now(), 0);
    while zero_copy < 10 {
        assert!(t.elapsed() < IO, "not back on the zero-copy path: {:?}", sub.stats());
        publish(&p);
        if let Ok(s) = queue.recv_timeout(Duration::from_millis(50)) {
            check(&s, "after the disconnect");
            zero_copy += usize::from(s.path() == Path::ZeroCopy);
        }
    }
    assert!(sub.stats().handshakes >= 2, "the subscriber handshook again: {:?}", sub.stats());
    // Its FD requests on the ended connection went unanswered, and ended nothing: the
    // held samples' blocks are still not handed out again.
    for _ in 0..300 {
        publish(&p);
        while queue.try_recv().is_ok() {}
    }
    for s in &held {
        check(s, "held after the reconnection");
    }
    drop(held);
    drop((sub, queue));
    // Once the subscriber let go of everything, every lease is back.
    let t = Instant::now();
    while p.pool_stats().blocks_in_use > 0 {
        assert!(t.elapsed() < IO, "blocks still leased after the subscriber let go: {:?}", p.pool_stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

const SHUT_KEY: &str = "zcs-test/slow/shut";
const PORT_ENV: &str = "ZCS_SHUT_PORT";
const STOP_ENV: &str = "ZCS_SHUT_STOP_FILE";

/// Shuts down, in both directions, every connected Unix `SOCK_SEQPACKET` socket this
/// process opened as a client (unnamed here, named at the peer): the control connections
/// of its subscribers. The descriptors stay open, as after a stray `shutdown(2)` or a
/// connection that failed under its owner. Returns how many it shut.
fn shut_own_control_connections() -> usize {
    use nix::sys::socket::{Shutdown, SockType, UnixAddr, getpeername, getsockname, getsockopt, shutdown, sockopt};
    let named = |a: &UnixAddr| a.path().is_some() || a.as_abstract().is_some();
    let mut shut = 0;
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").flatten() {
        let Some(raw) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        // SAFETY: only used while this loop runs, in a process whose other threads open
        // no SEQPACKET sockets meanwhile; a number closed in between makes the calls
        // below fail (EBADF), which skips it.
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        if getsockopt(&fd, sockopt::SockType).ok() != Some(SockType::SeqPacket) {
            continue;
        }
        let ours = getsockname::<UnixAddr>(fd.as_raw_fd()).is_ok_and(|a| !named(&a));
        let peer = getpeername::<UnixAddr>(fd.as_raw_fd()).is_ok_and(|a| named(&a));
        if ours && peer && shutdown(fd.as_raw_fd(), Shutdown::Both).is_ok() {
            shut += 1;
        }
    }
    shut
}

#[test]
fn a_subscriber_that_shuts_its_control_connection_keeps_its_blocks_until_it_exits() {
    let _w = watchdog_guard("shut control connection test", Duration::from_secs(120));
    let port = free_tcp_port();
    let ps = session(Some(port), None);
    let p = ps.declare_publisher(SHUT_KEY).wait().expect("publisher");
    let stop = std::env::temp_dir().join(format!("zcs-shut-{}-{port}", std::process::id()));
    let _ = std::fs::remove_file(&stop);
    let mut child = spawn_child(
        "shut_child_entry",
        "holder",
        &[(PORT_ENV, port.to_string()), (STOP_ENV, stop.display().to_string())],
    );
    // Its checks failing ends it early with an error status.
    let mut running = || {
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("the holding subscriber ended early ({st}): it read bytes not written for it");
        }
    };
    // The child takes two zero-copy samples, then shuts its control connection.
    let t = Instant::now();
    while p.stats().held_until_exit == 0 {
        running();
        assert!(t.elapsed() < IO, "the publisher never saw the connection end with leases: {:?}", p.stats());
        publish(&p);
        std::thread::sleep(Duration::from_millis(5));
    }
    // Enough traffic that a block given back would be handed out again (the child
    // handshakes again and reads along; any of its checks failing fails its exit status).
    for _ in 0..300 {
        publish(&p);
        std::thread::sleep(Duration::from_millis(1));
    }
    running();
    assert!(p.pool_stats().blocks_in_use >= 2, "the held blocks stay leased: {:?}", p.pool_stats());
    std::fs::write(&stop, b"").expect("stop file");
    wait_child(child, "the holding subscriber", IO);
    let exited = Instant::now();
    while p.pool_stats().blocks_in_use > 0 {
        assert!(exited.elapsed() < IO, "blocks still leased after the subscriber exited: {:?}", p.pool_stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("pool whole {:?} after the subscriber's exit was reaped", exited.elapsed());
    let _ = std::fs::remove_file(&stop);
    assert_eq!(p.stats().held_until_exit, 1, "{:?}", p.stats());
}

/// Entry point of the re-executed test binary (the subscriber that shuts its own
/// connection); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by a_subscriber_that_shuts_its_control_connection_keeps_its_blocks_until_it_exits"]
fn shut_child_entry() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "holder");
    let _w = watchdog_guard("holding subscriber", Duration::from_secs(100));
    let port: u16 = std::env::var(PORT_ENV).expect("port").parse().expect("port number");
    let stop = std::path::PathBuf::from(std::env::var(STOP_ENV).expect("stop file"));
    let s = session(None, Some(port));
    let sub = s.declare_subscriber(SHUT_KEY).wait().expect("subscriber");
    let mut held = Vec::new();
    while held.len() < 2 {
        let sample = sub.recv_timeout(IO).expect("a sample to hold");
        check(&sample, "before the shutdown");
        if sample.path() == Path::ZeroCopy {
            held.push(sample);
        }
    }
    assert!(shut_own_control_connections() >= 1, "no control connection to shut");
    while !stop.exists() {
        for s in &held {
            check(s, "held after its connection was shut");
        }
        while let Some(s) = sub.try_recv() {
            check(&s, "received after the shutdown");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for s in &held {
        check(s, "held until exit");
    }
}
