//! A subscriber whose application stops reading holds up no other key of its process:
//! its FIFO drops the oldest sample for a new one that arrives in a Zenoh callback
//! (counted in `dropped_queue_full`) instead of making Zenoh's thread wait, which would
//! stall every key of the link (docs/reliability.md, "Slow consumers").
//!
//! Host-memory sessions, loopback TCP; the stalled key is fed by a plain Zenoh
//! publisher (samples delivered in Zenoh's callback) and by ours (the zero-copy link).
//! A publisher names the subscriber that holds its blocks (what the examples say when it
//! is held back).

use std::time::Duration;

use zcs_tests::{free_tcp_port, loopback_zenoh_config, watchdog_guard};
use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuSession, Path, ZcsConfig};

const IO: Duration = Duration::from_secs(10);

/// A publisher's session and a subscribers' session on host memory, over loopback TCP.
fn host_pair() -> (GpuSession, GpuSession) {
    let port = free_tcp_port();
    let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
    let open = |listen, connect| GpuSession::open(loopback_zenoh_config(listen, connect, None), cfg.clone()).wait();
    (open(Some(port), None).unwrap(), open(None, Some(port)).unwrap())
}

#[test]
fn a_stalled_fifo_drops_its_oldest_and_holds_up_no_other_key() {
    let _w = watchdog_guard("a_stalled_fifo_drops_its_oldest_and_holds_up_no_other_key", Duration::from_secs(60));
    let port = free_tcp_port();
    let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
    let subs = GpuSession::open(loopback_zenoh_config(Some(port), None, None), cfg.clone()).wait().unwrap();
    let raw = zenoh::open(loopback_zenoh_config(None, Some(port), None)).wait().unwrap();

    let stalled = subs.declare_subscriber("zcs-test/stalled/a").fifo(4).wait().unwrap();
    let healthy = subs.declare_subscriber("zcs-test/stalled/b").wait().unwrap();
    let block = raw.declare_publisher("zcs-test/stalled/a").congestion_control(zenoh::qos::CongestionControl::Block);
    let a = block.wait().unwrap();
    let b = raw.declare_publisher("zcs-test/stalled/b").wait().unwrap();
    // Routes: the first sample of each key arrives.
    let t = std::time::Instant::now();
    while healthy.try_recv().is_none() {
        b.put(vec![0u8]).wait().unwrap();
        assert!(t.elapsed() < IO, "no route to the healthy subscriber");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.put(vec![0u8]).wait().unwrap();
    assert_eq!(stalled.recv_timeout(IO).unwrap().to_vec().unwrap(), [0]);
    while healthy.try_recv().is_some() {}

    // The application stops reading `a`; 50 samples come.
    for i in 1..=50u8 {
        a.put(vec![i]).wait().unwrap();
    }
    b.put(vec![42u8]).wait().unwrap();
    let s = healthy.recv_timeout(IO).expect("the other key is delivered while `a` is not read");
    assert_eq!((s.to_vec().unwrap(), s.path()), (vec![42], Path::Plain));
    let t = std::time::Instant::now();
    while stalled.stats().dropped_queue_full < 46 {
        assert!(t.elapsed() < IO, "drops not counted: {:?}", stalled.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(stalled.stats().dropped_queue_full, 46);
    let kept: Vec<u8> = (0..4).map(|_| stalled.recv_timeout(IO).unwrap().to_vec().unwrap()[0]).collect();
    assert_eq!(kept, [47, 48, 49, 50], "the newest four, in order");
    assert!(stalled.try_recv().is_none());
    assert_eq!(healthy.stats().dropped_queue_full, 0);
}

/// A publisher names the subscriber that holds its blocks (`GpuPublisher::holders`):
/// a zero-copy subscriber that keeps three samples holds three blocks, under its own
/// process id, and none once it lets them go.
#[test]
fn a_publisher_names_the_subscriber_holding_its_blocks() {
    let _w = watchdog_guard("a_publisher_names_the_subscriber_holding_its_blocks", Duration::from_secs(60));
    let (ours, theirs) = host_pair();
    let sub = theirs.declare_subscriber("zcs-test/holders").wait().unwrap();
    let publisher = ours.declare_publisher("zcs-test/holders").wait().unwrap();
    zcs_tests::wait_until("the zero-copy path", IO, || publisher.zero_copy_subscribers() == 1);
    assert_eq!(publisher.holders().iter().map(|h| h.holds).collect::<Vec<_>>(), [0]);
    let held: Vec<_> = (0..3)
        .map(|_| {
            let mut loan = publisher.loan(64 << 10).unwrap();
            loan.write_bytes(0, &[7u8; 64 << 10]).unwrap();
            publisher.put(loan).unwrap();
            let s = sub.recv_timeout(IO).unwrap();
            assert_eq!(s.path(), Path::ZeroCopy);
            s
        })
        .collect();
    let h = publisher.holders();
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!((h[0].pid, h[0].holds, h[0].at_limit), (std::process::id() as i32, 3, false), "{h:?}");
    drop(held);
    zcs_tests::wait_until("the blocks released", IO, || publisher.holders()[0].holds == 0);
}

/// On the zero-copy path too, a full FIFO drops its oldest sample (its block goes back
/// to the publisher) instead of holding the subscriber's link, and with it the
/// publisher and the publisher's other subscribers.
#[test]
fn a_stalled_fifo_on_the_zero_copy_path_drops_its_oldest_and_holds_up_nobody() {
    const TEST: &str = "a_stalled_fifo_on_the_zero_copy_path_drops_its_oldest_and_holds_up_nobody";
    let _w = watchdog_guard(TEST, Duration::from_secs(60));
    let (ours, theirs) = host_pair();
    let stalled = theirs.declare_subscriber("zcs-test/stalled/zc").fifo(4).wait().unwrap();
    let healthy = theirs.declare_subscriber("zcs-test/stalled/zc").wait().unwrap();
    let publisher = ours.declare_publisher("zcs-test/stalled/zc").wait().unwrap();
    zcs_tests::wait_until("both on the zero-copy path", IO, || publisher.zero_copy_subscribers() == 2);
    for seq in 1..=20u64 {
        let mut loan = publisher.loan(64 << 10).unwrap();
        loan.write_bytes(0, &seq.to_le_bytes()).unwrap();
        publisher.put(loan).unwrap();
        let s = healthy.recv_timeout(IO).expect("the healthy subscriber keeps receiving");
        assert_eq!((s.info().seq, s.path()), (seq, Path::ZeroCopy));
    }
    zcs_tests::wait_until("16 dropped", IO, || stalled.stats().dropped_queue_full == 16);
    let kept: Vec<(u64, Path)> =
        (0..4).map(|_| stalled.recv_timeout(IO).unwrap()).map(|s| (s.info().seq, s.path())).collect();
    assert_eq!(kept, (17..=20).map(|seq| (seq, Path::ZeroCopy)).collect::<Vec<_>>(), "the newest four, in order");
    zcs_tests::wait_until("the dropped samples' blocks back", IO, || publisher.holders().iter().all(|h| h.holds == 0));
}
