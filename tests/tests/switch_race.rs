//! The switch from bytes to zero-copy, through a router, forced to race: a message that
//! a publisher sends as bytes while a subscriber's zero-copy link comes up must reach
//! that subscriber exactly once, even when its bytes arrive after the link has already
//! delivered later messages; and a gap a subscriber does see is counted in `lost`.
//!
//! The layout of the report that found it: a Zenoh router, two subscribers in client
//! mode on overlapping key expressions (`camera/**` and `camera/front`), then a
//! publisher in client mode on `camera/front` sending 1 MiB messages at 20 Hz from the
//! start. The race is made certain (`test_support`): each subscriber's handshake starts
//! 300 ms late, so the first messages go as bytes, and every bytes sample reaches the
//! subscribers 400 ms late (in order, as through a lagging router). So a subscriber's link
//! is ready before any of its bytes arrived, delivers at once, and the bytes of the
//! messages before it come afterwards. Host blocks; everything in this process.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_tests::{free_tcp_port, watchdog_guard};
use zcs_transport::fault as test_support;
use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuSample, GpuSession, GpuSubscriber, ZcsConfig};

/// The fault injection applies to the whole process: tests take turns.
static HOOKS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The fault injection of one test, undone when it ends, even by a panic.
struct Hooks;

impl Hooks {
    fn set(handshake: Duration, bytes: Duration, tokens: Duration) -> Self {
        test_support::set_handshake_delay(handshake);
        test_support::set_bytes_delay(bytes);
        test_support::set_token_delay(tokens);
        Self
    }
}

impl Drop for Hooks {
    fn drop(&mut self) {
        test_support::set_handshake_delay(Duration::ZERO);
        test_support::set_bytes_delay(Duration::ZERO);
        test_support::set_token_delay(Duration::ZERO);
    }
}

type Sub = GpuSubscriber<flume::Receiver<GpuSample>>;

const N: u64 = 40;
const LEN: usize = 1 << 20;

fn config(mode: &str, port: u16) -> zenoh::Config {
    let mut c = zenoh::Config::default();
    let mut set = |k: &str, v: &str| c.insert_json5(k, v).unwrap_or_else(|e| panic!("zenoh config {k} = {v}: {e}"));
    set("mode", &format!("\"{mode}\""));
    set("scouting/multicast/enabled", "false");
    let endpoint = format!("[\"tcp/127.0.0.1:{port}\"]");
    if mode == "router" {
        set("listen/endpoints", &endpoint);
    } else {
        set("connect/endpoints", &endpoint);
    }
    // Block instead of dropping under congestion: this test counts the library's
    // sequence numbers, not Zenoh's drop policy on a loaded machine.
    set(
        "qos/publication",
        "[{ key_exprs: [\"camera/**\", \"camera/**/@zcs/**\"], config: { congestion_control: \"block\" } }]",
    );
    c
}

fn client(port: u16) -> GpuSession {
    GpuSession::open(config("client", port), ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() })
        .wait()
        .expect("open a client session")
}

/// The layout of the report: a router on a free port, and two client sessions
/// subscribed to `camera/**` and `camera/front`.
struct RouterLayout {
    port: u16,
    wide: Sub,
    exact: Sub,
    _sessions: [GpuSession; 2],
    _router: zenoh::Session,
}

impl RouterLayout {
    fn new() -> Self {
        let port = free_tcp_port();
        let router = zenoh::open(config("router", port)).wait().expect("open the router");
        let (s1, s2) = (client(port), client(port));
        let wide = s1.declare_subscriber("camera/**").wait().unwrap();
        let exact = s2.declare_subscriber("camera/front").wait().unwrap();
        Self { port, wide, exact, _sessions: [s1, s2], _router: router }
    }
}

/// A publisher on `camera/front` in a client session of the router at `port`, once it
/// knows both subscribers: publishing starts then, as z_cuda_pub's does once they are
/// there, so the first messages go as bytes while the handshakes run, the rest over the
/// links.
fn publisher_knowing_both(port: u16) -> (GpuSession, zenoh_cuda_shm::GpuPublisher) {
    let session = client(port);
    let publisher = session.declare_publisher("camera/front").wait().unwrap();
    let t = Instant::now();
    while publisher.aware_subscribers() < 2 {
        assert!(t.elapsed() < Duration::from_secs(10), "the publisher never saw both subscribers");
        std::thread::sleep(Duration::from_millis(1));
    }
    (session, publisher)
}

/// Receives until `N` messages came or nothing came for 15 s (delayed bytes are held
/// back one after another); checks every byte. The sequence numbers in arrival order.
fn receive(sub: &Sub) -> Vec<u64> {
    let mut order = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < N as usize {
        let Ok(s) = sub.recv_timeout(Duration::from_secs(15)) else { break };
        let data = s.host_bytes().expect("host data");
        assert_eq!(check_pattern(&data, 0, s.seq()), None, "message {} has wrong bytes", s.seq());
        seen.insert(s.seq());
        order.push(s.seq());
    }
    order
}

/// Publishes `N` messages of 1 MiB at 20 Hz.
fn publish(publisher: &zenoh_cuda_shm::GpuPublisher) {
    let t0 = Instant::now();
    for seq in 1..=N {
        let mut loan = publisher.loan(LEN).unwrap();
        fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq);
        assert_eq!(publisher.put(loan).unwrap().seq, seq);
        std::thread::sleep((t0 + Duration::from_millis(50 * seq)).saturating_duration_since(Instant::now()));
    }
}

/// Publishes `N` messages while both subscribers receive (as applications do: a full
/// queue would hold Zenoh back), and checks that each got every message exactly once and
/// counted nothing lost. Returns the publisher's copies out, and each subscriber's
/// sequence numbers in arrival order.
fn publish_to_both(publisher: &zenoh_cuda_shm::GpuPublisher, wide: &Sub, exact: &Sub) -> (u64, [Vec<u64>; 2]) {
    let (got, copies_out) = std::thread::scope(|scope| {
        let receivers = [scope.spawn(|| receive(wide)), scope.spawn(|| receive(exact))];
        publish(publisher);
        let copies_out = publisher.stats().copies_out;
        (receivers.map(|r| r.join().expect("receiver")), copies_out)
    });
    for (name, sub, order) in [("camera/**", wide, &got[0]), ("camera/front", exact, &got[1])] {
        let mut seen = BTreeMap::new();
        for &seq in order {
            *seen.entry(seq).or_insert(0u32) += 1;
        }
        let st = sub.stats();
        let missing: Vec<u64> = (1..=N).filter(|s| !seen.contains_key(s)).collect();
        assert!(missing.is_empty(), "{name}: messages {missing:?} never arrived ({st:?}, copies out {copies_out})");
        assert!(seen.values().all(|&n| n == 1), "{name}: a message arrived twice: {seen:?}");
        assert_eq!(st.lost, 0, "{name}: {st:?}");
        assert!(sub.try_recv().is_none(), "{name}: more than {N} messages");
    }
    (copies_out, got)
}

#[test]
fn bytes_sent_while_the_link_comes_up_arrive_once_through_a_router() {
    let _w =
        watchdog_guard("bytes_sent_while_the_link_comes_up_arrive_once_through_a_router", Duration::from_secs(120));
    let _turn = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    let x = RouterLayout::new();
    let (port, wide, exact) = (x.port, &x.wide, &x.exact);
    // Bytes lag longer than a link's first delivery waits for them (500 ms).
    let _hooks = Hooks::set(Duration::from_millis(300), Duration::from_millis(700), Duration::ZERO);
    let (_publisher_session, publisher) = publisher_knowing_both(port);
    let t = Instant::now();
    // Meanwhile each subscriber says why it gets bytes.
    while wide.publishers().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "the subscriber never saw the publisher");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (instance, live) = wide.publishers()[0];
    let reason = wide.bytes_reason(instance);
    assert_eq!(publisher.zero_copy_subscribers(), 0, "handshakes are held back");
    assert!(!live);
    assert_eq!(reason.as_deref(), Some("handshake in progress"));
    let (copies_out, _) = publish_to_both(&publisher, wide, exact);
    assert!(wide.publishers().contains(&(instance, true)));
    assert_eq!(wide.bytes_reason(instance), None, "on the zero-copy path");
    // The race was really run: some bytes came after their subscriber's link had
    // delivered a later message.
    let late = wide.stats().late_bytes + exact.stats().late_bytes;
    assert!(copies_out >= 1 && late >= 1, "no late bytes (copies out {copies_out}): the race was not forced");
    eprintln!("copies out {copies_out}, late bytes delivered {late}");
}

/// Bytes that lag behind a link's first delivery by less than its wait (500 ms) keep
/// their place: `Ready` names the last message put as bytes for the subscriber, and the
/// link delivers nothing before it. Each subscriber gets every message once, in
/// sequence order, none of them late.
#[test]
fn bytes_put_before_the_link_is_ready_come_first() {
    let _w = watchdog_guard("bytes_put_before_the_link_is_ready_come_first", Duration::from_secs(120));
    let _turn = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    let x = RouterLayout::new();
    let (port, wide, exact) = (x.port, &x.wide, &x.exact);
    // Three messages (20 Hz) go as bytes before the handshakes end; those bytes arrive
    // 300 ms late, long after the links could deliver the fourth.
    let _hooks = Hooks::set(Duration::from_millis(120), Duration::from_millis(300), Duration::ZERO);
    let (_publisher_session, publisher) = publisher_knowing_both(port);
    let (copies_out, got) = publish_to_both(&publisher, wide, exact);
    assert!(copies_out >= 1, "no message went as bytes: nothing was tested");
    for (name, order, sub) in [("camera/**", &got[0], wide), ("camera/front", &got[1], exact)] {
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{name}: out of order: {order:?}");
        assert_eq!(sub.stats().late_bytes, 0, "{name}: {:?}", sub.stats());
    }
}

/// A publisher that puts right after its declaration reaches the subscribers that were
/// there before it, every message, even when its token subscription learns of them late.
///
/// Found by the first-hour check (`docs/quickstart.md`, step 3): both subscribers of a
/// router got 99 of 100 messages and waited for the last forever, with `lost` 0. The
/// publisher's first put came before the history of its subscription to subscriber tokens
/// had arrived: it knew of nobody to send bytes to, while the subscribers had already
/// stopped listening on the plain key on seeing its token, and their handshakes were not
/// done. Here that history comes 500 ms late and the handshakes 300 ms late, every time.
#[test]
fn a_new_publisher_reaches_the_subscribers_already_there_from_its_first_put() {
    let _w = watchdog_guard(
        "a_new_publisher_reaches_the_subscribers_already_there_from_its_first_put",
        Duration::from_secs(120),
    );
    let _turn = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    let x = RouterLayout::new();
    let (port, wide, exact) = (x.port, &x.wide, &x.exact);
    // Until both subscriptions reach the router: a plain put comes back to each.
    let raw = zenoh::open(config("client", port)).wait().unwrap();
    let t = Instant::now();
    for sub in [wide, exact] {
        loop {
            raw.put("camera/front", vec![0u8; 8]).wait().unwrap();
            if sub.recv_timeout(Duration::from_millis(50)).is_ok() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "the subscriptions never reached the router");
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    while wide.try_recv().is_some() || exact.try_recv().is_some() {}
    let _hooks = Hooks::set(Duration::from_millis(300), Duration::ZERO, Duration::from_millis(500));
    let publisher_session = client(port);
    let publisher = publisher_session.declare_publisher("camera/front").wait().unwrap();
    assert_eq!(publisher.aware_subscribers(), 2, "known when the declaration returns");
    // The first put a little later (z_cuda_pub's first loan from a host provider takes a
    // round trip): the subscribers have seen this publisher and left the plain key, and
    // their handshakes (held back 300 ms) are not done.
    std::thread::sleep(Duration::from_millis(100));
    publish_to_both(&publisher, wide, exact);
}

/// A gap after a subscriber's first message is counted in `lost`, and a message that
/// fills it late takes it back.
#[test]
fn gaps_count_as_lost_until_filled() {
    let _w = watchdog_guard("gaps_count_as_lost_until_filled", Duration::from_secs(60));
    let _turn = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    let port = free_tcp_port();
    let _router = zenoh::open(config("router", port)).wait().expect("open the router");
    let session = client(port);
    let sub = session.declare_subscriber("camera/gaps").wait().unwrap();
    let raw = zenoh::open(config("client", port)).wait().unwrap();
    // A publisher of ours that this subscriber never handshakes with (no token): its
    // bytes are delivered as they come, each (publisher, seq) once.
    let put = |seq: u64| {
        let header = zcs_wire::protocol::BytesHeader {
            publisher: 0xabc,
            seq,
            timestamp_ns: 0,
            from_block: false,
            tag: 0,
            meta: None,
        };
        let mut data = vec![0u8; 16];
        fill_pattern(&mut data, 0, seq);
        raw.put(zcs_wire::protocol::bytes_key("camera/gaps"), data)
            .attachment(zcs_wire::protocol::encode_attachment(&header))
            .wait()
            .unwrap();
    };
    // Until the router routes the raw session's puts to the subscriber: another
    // publisher's messages, drained.
    let mut warm = zcs_wire::protocol::BytesHeader {
        publisher: 0xdef,
        seq: 0,
        timestamp_ns: 0,
        from_block: false,
        tag: 0,
        meta: None,
    };
    let t = Instant::now();
    loop {
        warm.seq += 1;
        raw.put(zcs_wire::protocol::bytes_key("camera/gaps"), vec![0u8; 16])
            .attachment(zcs_wire::protocol::encode_attachment(&warm))
            .wait()
            .unwrap();
        if sub.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the router never routed to the subscriber");
    }
    std::thread::sleep(Duration::from_millis(100));
    while sub.try_recv().is_some() {}
    let base = sub.stats().duplicates;
    for (seq, lost) in [(3, 0), (4, 0), (7, 2), (5, 1), (9, 2), (6, 1), (8, 0)] {
        put(seq);
        // (A warm-up message may still come late.)
        let s = std::iter::repeat_with(|| sub.recv_timeout(Duration::from_secs(10)).unwrap())
            .find(|s| s.info().publisher == 0xabc)
            .unwrap();
        assert_eq!(s.seq(), seq);
        assert_eq!(sub.stats().lost, lost, "after {seq}");
    }
    put(8);
    let t = Instant::now();
    while sub.stats().duplicates < base + 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "the second copy of 8 never came");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(std::iter::from_fn(|| sub.try_recv()).all(|s| s.info().publisher == 0xdef));
    assert_eq!(sub.stats().duplicates, base + 1);
}
