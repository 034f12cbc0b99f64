//! A subscriber that stops reading until its publisher disconnects it as slow must still
//! read, byte-exact, every sample it held or had queued: the publisher stops routing to
//! it, but keeps that connection's leases until the subscriber has let go of them, so
//! none of those blocks is reused under a reader (gap G14). Host memfd blocks, two
//! sessions over loopback Zenoh and a real control socket.

use std::time::{Duration, Instant};

use zcs_tests::{free_tcp_port, loopback_zenoh_config, watchdog_guard};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::cuda::kernels::{check_pattern, fill_pattern};
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
    let sub = ss.declare_subscriber(KEY).fifo(FIFO).wait().expect("subscriber");
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
            let s = sub.recv_timeout(IO).expect("a held sample");
            assert_eq!(s.path(), Path::ZeroCopy);
            s
        })
        .collect();

    // The application stops reading: its queue fills, its link stops reading the control
    // socket, the socket fills, and a put gives up on it after the push timeout.
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
    while let Ok(s) = sub.recv_timeout(Duration::from_millis(300)) {
        check(&s, "queued at the disconnect");
        drained += 1;
    }
    assert!(drained >= FIFO, "only {drained} samples were queued");
    // It handshakes again and is back on the zero-copy path.
    let (t, mut zero_copy) = (Instant::now(), 0);
    while zero_copy < 10 {
        assert!(t.elapsed() < IO, "not back on the zero-copy path: {:?}", sub.stats());
        publish(&p);
        if let Ok(s) = sub.recv_timeout(Duration::from_millis(50)) {
            check(&s, "after the disconnect");
            zero_copy += usize::from(s.path() == Path::ZeroCopy);
        }
    }
    assert!(sub.stats().handshakes >= 2, "the subscriber handshook again: {:?}", sub.stats());
    // Its FD requests on the ended connection went unanswered, and ended nothing: the
    // held samples' blocks are still not handed out again.
    for _ in 0..300 {
        publish(&p);
        while sub.try_recv().is_some() {}
    }
    for s in &held {
        check(s, "held after the reconnection");
    }
    drop(held);
    drop(sub);
    // Once the subscriber let go of everything, every lease is back.
    let t = Instant::now();
    while p.pool_stats().blocks_in_use > 0 {
        assert!(t.elapsed() < IO, "blocks still leased after the subscriber let go: {:?}", p.pool_stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}
