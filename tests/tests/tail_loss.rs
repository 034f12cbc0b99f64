//! Messages lost at the end of a publisher's stream are counted (`SubscriberStats::lost`,
//! and `RosSubscriberStats::lost` for our ROS 2 publishers),
//! not only gaps that a later message reveals: a subscriber off the zero-copy path learns
//! the publisher's last sequence number from its end notice when it is dropped; a
//! subscriber on it counts a message as soon as it gives up on it. Host memory, two
//! sessions in this process; losses are made by `zcs_transport::fault`, which drops our
//! bytes on their way to this process's subscribers as a lossy link would.

use std::sync::Mutex;
use std::time::Duration;

use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_tests::{free_tcp_port, loopback_zenoh_config, wait_until, watchdog_guard};
use zcs_transport::fault;
use zenoh_cuda_shm::config::{DeviceChoice, HostId};
use zenoh_cuda_shm::tensor_codec::cdr::StringMsg;
use zenoh_cuda_shm::{GpuPublisher, GpuSession, GpuSubscriber, Path, ZcsConfig};
use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RmwWire, RosNode};

/// The fault settings are the process's: one test at a time.
static FAULTS: Mutex<()> = Mutex::new(());

const LEN: usize = 256 << 10;
const IO: Duration = Duration::from_secs(20);

fn session(listen: Option<u16>, connect: Option<u16>, host: &str, cfg: impl FnOnce(&mut ZcsConfig)) -> GpuSession {
    let mut c =
        ZcsConfig { device: DeviceChoice::Host, host_id: Some(HostId::new(host).unwrap()), ..ZcsConfig::default() };
    cfg(&mut c);
    GpuSession::open(loopback_zenoh_config(listen, connect, None), c).wait().expect("a host-memory session")
}

fn publish(p: &GpuPublisher, seq: u64) {
    let mut loan = p.loan(LEN).expect("loan");
    fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq);
    assert_eq!(p.put(loan).expect("put").seq, seq);
}

/// Receives messages `seqs` in order, every byte checked, each by `path`.
fn receive(
    sub: &GpuSubscriber<flume::Receiver<zenoh_cuda_shm::GpuSample>>,
    seqs: std::ops::RangeInclusive<u64>,
    path: Path,
) {
    for seq in seqs {
        let s = sub.recv_timeout(IO).unwrap_or_else(|e| panic!("message {seq}: {e}"));
        assert_eq!((s.info().seq, s.path()), (seq, path));
        assert_eq!(check_pattern(&s.host_bytes().expect("host memory"), 0, seq), None, "message {seq}");
    }
}

fn wait_lost(sub: &GpuSubscriber<flume::Receiver<zenoh_cuda_shm::GpuSample>>, want: u64, within: Duration) {
    wait_until(&format!("lost = {want} (now {})", sub.stats().lost), within, || sub.stats().lost == want);
}

/// A subscriber on another host (bytes through Zenoh): the last two messages of a
/// stream vanish; nothing after them shows the gap, until the publisher is dropped and
/// its end notice names its last message. A stream received whole counts nothing.
#[test]
fn the_lost_tail_of_a_stream_is_counted_when_its_publisher_ends() {
    const TEST: &str = "the_lost_tail_of_a_stream_is_counted_when_its_publisher_ends";
    let _faults = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let _w = watchdog_guard(TEST, Duration::from_secs(60));
    let port = free_tcp_port();
    let ours = session(Some(port), None, "host-a", |_| {});
    let theirs = session(None, Some(port), "host-b", |_| {});
    let key = format!("zcs-test/tail/{}/bytes", std::process::id());
    let sub = theirs.declare_subscriber(key.clone()).wait().unwrap();

    // Whole: the end notice finds nothing missing.
    let p = ours.declare_publisher(key.clone()).wait().unwrap();
    wait_until("the subscriber's token", IO, || p.aware_subscribers() == 1);
    for seq in 1..=3 {
        publish(&p, seq);
    }
    receive(&sub, 1..=3, Path::CpuBytes);
    drop(p);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sub.stats().lost, 0, "a whole stream loses nothing");

    // Messages 5 and 6 of 6 vanish: unseen until the publisher ends.
    fault::set_bytes_lost_from(5);
    let p = ours.declare_publisher(key).wait().unwrap();
    wait_until("the subscriber's token", IO, || p.aware_subscribers() == 1);
    for seq in 1..=6 {
        publish(&p, seq);
    }
    receive(&sub, 1..=4, Path::CpuBytes);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sub.stats().lost, 0, "nothing after the lost messages shows them yet");
    drop(p);
    wait_lost(&sub, 2, IO);
    fault::set_bytes_lost_from(0);
    assert!(sub.try_recv().is_none());
}

/// A subscriber on the zero-copy path at its lease limit gets the last messages as
/// bytes through Zenoh (`ViaBytes`); those vanish, and it counts each as lost once it
/// gives up waiting for it (1 s), while the publisher still lives and nothing follows.
#[test]
fn a_zero_copy_subscriber_counts_the_bytes_it_gave_up_on() {
    const TEST: &str = "a_zero_copy_subscriber_counts_the_bytes_it_gave_up_on";
    let _faults = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let _w = watchdog_guard(TEST, Duration::from_secs(60));
    let port = free_tcp_port();
    let ours = session(Some(port), None, "host-a", |c| {
        c.pool.max_holds_per_holder = 2;
        c.lease_wait_ms = 0;
    });
    let theirs = session(None, Some(port), "host-a", |_| {});
    let key = format!("zcs-test/tail/{}/via-bytes", std::process::id());
    let sub = theirs.declare_subscriber(key.clone()).wait().unwrap();
    let p = ours.declare_publisher(key).wait().unwrap();
    wait_until("the subscriber on the zero-copy path", IO, || p.zero_copy_subscribers() == 1 && !p.plain_subscribers());
    fault::set_bytes_lost_from(4);
    // 1 and 2 in place (held: the lease limit is reached), 3 to 5 as bytes; 4 and 5 vanish.
    for seq in 1..=5 {
        publish(&p, seq);
    }
    let held: Vec<_> = (1..=2)
        .map(|seq| {
            let s = sub.recv_timeout(IO).unwrap();
            assert_eq!((s.info().seq, s.path()), (seq, Path::ZeroCopy));
            s
        })
        .collect();
    receive(&sub, 3..=3, Path::CpuBytes);
    wait_lost(&sub, 2, Duration::from_secs(10));
    fault::set_bytes_lost_from(0);
    drop(held);
    // The end notice after the link's own account adds nothing.
    drop(p);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sub.stats().lost, 2);
}

/// ROS 2: a subscription of ours on another host (our channel's bytes) misses the last
/// two of six messages of one of our publishers; nothing after them shows the gap in
/// `RosSubscriberStats::lost` until the publisher is dropped and its end notice names
/// its last sequence number. A publisher whose messages all came counts nothing.
#[test]
fn a_ros_subscription_counts_the_lost_tail_when_our_publisher_ends() {
    const TEST: &str = "a_ros_subscription_counts_the_lost_tail_when_our_publisher_ends";
    let _faults = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    let _w = watchdog_guard(TEST, Duration::from_secs(60));
    let port = free_tcp_port();
    let (ours, theirs) = (session(Some(port), None, "host-a", |_| {}), session(None, Some(port), "host-b", |_| {}));
    let options = |name: &str| NodeOptions::new(name).domain(23).rmw_wire(RmwWire::BufferAware);
    let talker = RosNode::new(&ours, options("talker")).unwrap();
    let listener = RosNode::new(&theirs, options("listener")).unwrap();
    let qos = Qos::reliable(10).keep_all();
    let sub = listener.subscriber::<StringMsg<()>>("/tail", qos).unwrap();
    let receive = |texts: std::ops::RangeInclusive<u32>| {
        for i in texts {
            let s = sub.recv_timeout(IO).unwrap_or_else(|e| panic!("message {i}: {e}"));
            assert_eq!(
                (s.attachment().seq, s.host_data().unwrap().as_ref()),
                (i64::from(i), format!("{i}").as_bytes())
            );
        }
    };
    let publisher = || {
        let p = talker.publisher::<StringMsg<()>>("/tail", qos).unwrap();
        wait_until("the subscription's token", IO, || p.channel().aware_subscribers() == 1);
        p
    };

    // Whole: the end notice finds nothing missing.
    let p = publisher();
    for i in 1..=3 {
        p.publish_str(&i.to_string()).unwrap();
    }
    receive(1..=3);
    drop(p);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sub.stats().lost, 0, "a whole stream loses nothing");

    // Messages 5 and 6 of 6 vanish: unseen until the publisher ends.
    fault::set_bytes_lost_from(5);
    let p = publisher();
    for i in 1..=6 {
        p.publish_str(&i.to_string()).unwrap();
    }
    receive(1..=4);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sub.stats().lost, 0, "nothing after the lost messages shows them yet");
    drop(p);
    wait_until(&format!("lost = 2 (now {})", sub.stats().lost), IO, || sub.stats().lost == 2);
    fault::set_bytes_lost_from(0);
    assert!(sub.try_recv().is_none());
}
