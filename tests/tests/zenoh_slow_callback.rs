//! What Zenoh 1.10.2 itself does with a subscriber whose callback is slow, the question
//! under our rule that no queue of ours makes a Zenoh thread wait (docs/reliability.md,
//! "Slow consumers"): with congestion control *block* and reliability, does a slow
//! callback lose samples, and does it hold up another key of the same session?
//!
//! Raw Zenoh sessions on loopback TCP; none of our code is involved.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use zcs_tests::{free_tcp_port, loopback_zenoh_config, watchdog_guard};
use zenoh::Wait;
use zenoh::qos::{CongestionControl, Reliability};

const N: u64 = 200;
const LEN: usize = 64 * 1024;
const SLOW: Duration = Duration::from_millis(5);

/// Seq numbers are the first 8 bytes of each payload.
fn payload(seq: u64) -> Vec<u8> {
    let mut v = vec![seq as u8; LEN];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v
}

/// A reliable, blocking publisher outruns a callback that takes 5 ms per sample (200
/// samples of 64 KiB, as fast as `put` returns): every sample arrives, in order, and the
/// publisher is held back instead (its puts take about as long as the callback). A
/// second key of the same session, whose callback is fast, gets its samples only as
/// fast as the slow one is served: the callback runs on the thread that reads the link.
#[test]
fn a_slow_callback_with_block_loses_nothing_and_holds_back_the_link() {
    let _w =
        watchdog_guard("a_slow_callback_with_block_loses_nothing_and_holds_back_the_link", Duration::from_secs(120));
    let port = free_tcp_port();
    let subs = zenoh::open(loopback_zenoh_config(Some(port), None, None)).wait().unwrap();
    let pubs = zenoh::open(loopback_zenoh_config(None, Some(port), None)).wait().unwrap();

    let (slow_seen, slow_in_order) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, o) = (Arc::clone(&slow_seen), Arc::clone(&slow_in_order));
    let _slow = subs
        .declare_subscriber("zcs-test/slowcb/slow")
        .callback(move |sample| {
            let b = sample.payload().to_bytes();
            let seq = u64::from_le_bytes(b[..8].try_into().unwrap());
            if seq == s.fetch_add(1, Ordering::SeqCst) {
                o.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(SLOW);
        })
        .wait()
        .unwrap();
    let fast_seen = Arc::new(AtomicU64::new(0));
    let f = Arc::clone(&fast_seen);
    let _fast = subs
        .declare_subscriber("zcs-test/slowcb/fast")
        .callback(move |_| {
            f.fetch_add(1, Ordering::SeqCst);
        })
        .wait()
        .unwrap();
    let slow_pub = pubs
        .declare_publisher("zcs-test/slowcb/slow")
        .congestion_control(CongestionControl::Block)
        .reliability(Reliability::Reliable)
        .wait()
        .unwrap();
    let fast_pub = pubs.declare_publisher("zcs-test/slowcb/fast").reliability(Reliability::Reliable).wait().unwrap();
    // Discovery: a first sample of each key arrives.
    let t = Instant::now();
    while fast_seen.load(Ordering::SeqCst) == 0 {
        fast_pub.put(vec![0u8; 8]).wait().unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "no route to the subscriber");
        std::thread::sleep(Duration::from_millis(10));
    }
    let fast_before = fast_seen.load(Ordering::SeqCst);

    let t = Instant::now();
    for seq in 0..N {
        slow_pub.put(payload(seq)).wait().unwrap();
    }
    let put_time = t.elapsed();
    // The fast key's sample queues behind the slow key's on the same link.
    let t_fast = Instant::now();
    fast_pub.put(vec![1u8; 8]).wait().unwrap();
    while fast_seen.load(Ordering::SeqCst) == fast_before {
        assert!(t_fast.elapsed() < Duration::from_secs(30), "the fast key's sample never came");
        std::thread::sleep(Duration::from_millis(1));
    }
    let fast_wait = t_fast.elapsed();
    let slow_at_fast = slow_seen.load(Ordering::SeqCst);
    let t = Instant::now();
    while slow_seen.load(Ordering::SeqCst) < N {
        assert!(t.elapsed() < Duration::from_secs(30), "only {} of {N} arrived", slow_seen.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(slow_seen.load(Ordering::SeqCst), N, "every sample, none twice");
    assert_eq!(slow_in_order.load(Ordering::SeqCst), N, "in order");
    // Held back: 200 puts could not have returned before most of the 200 × 5 ms of
    // callbacks ran (Zenoh's queues hold a few batches, not 12.5 MiB).
    assert!(put_time > SLOW * (N as u32) / 2, "the publisher was not held back: {put_time:?}");
    // One link, one reading thread: the other key's sample came after every slow one.
    assert_eq!(slow_at_fast, N, "the fast key's sample overtook the slow key's backlog");
    eprintln!(
        "slow callback: {N} of {N} in order; puts took {put_time:?} (callbacks {:?}); a fast key's sample sent after them waited {fast_wait:?}",
        SLOW * N as u32
    );
}
