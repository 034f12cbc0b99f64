//! A publisher dropped after the application's session handle (and, for ROS, its node)
//! must not leak the Zenoh session.
//!
//! When a publisher holds the last handle on a Zenoh session, dropping that handle
//! closes the session. Zenoh 1.10.2 does not clear a closed session's table of
//! publishers, and a Zenoh publisher undeclared after the close leaves its entry there;
//! the entry's declared key expression holds the session, so the session's memory is
//! never freed (about 12 KiB each time). Our publishers therefore drop their session
//! handle after their Zenoh publishers (`PublisherCore`, `RosPublisher`). LeakSanitizer
//! found this (`scripts/sanitize.sh asan`, in `control_hostile`); this test checks it in
//! an ordinary build by counting the bytes the process holds across repeated cycles.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use zcs_tests::{free_tcp_port, loopback_zenoh_config, watchdog_guard};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::tensor_codec::cdr::Image;
use zenoh_cuda_shm::{GpuSession, ZcsConfig};
use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RosNode};

/// The system allocator, counting the bytes currently allocated.
struct Counting;

/// Bytes allocated and not yet freed. Relaxed: a statistic read after the work it
/// counts has been joined or waited for.
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout`; the
        // caller's contract on `new_size` is passed on unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The tests measure the whole process's allocations: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const WARMUP: usize = 3;
const CYCLES: usize = 10;
/// A leaked session is about 12 KiB, so `CYCLES` leaks would be about 120 KiB; a run
/// without them grows by a few KiB (Zenoh's lazily filled global state).
const LIMIT: isize = 32 << 10;

fn host_session() -> GpuSession {
    let cfg = ZcsConfig { device: DeviceChoice::Host, ..Default::default() };
    GpuSession::open(loopback_zenoh_config(Some(free_tcp_port()), None, None), cfg).wait().expect("open host session")
}

/// Runs `cycle` `WARMUP` times, then `CYCLES` times, and returns the growth in bytes
/// held over the measured cycles.
fn growth(cycle: impl Fn()) -> isize {
    let settle = || std::thread::sleep(Duration::from_millis(300));
    for _ in 0..WARMUP {
        cycle();
    }
    settle();
    let before = LIVE.load(Ordering::Relaxed);
    for _ in 0..CYCLES {
        cycle();
    }
    settle();
    LIVE.load(Ordering::Relaxed) - before
}

#[test]
fn a_publisher_outliving_its_session_leaks_nothing() {
    const TEST: &str = "a_publisher_outliving_its_session_leaks_nothing";
    let _l = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _w = watchdog_guard(TEST, Duration::from_secs(60));
    let grew = growth(|| {
        let session = host_session();
        let publisher = session.declare_publisher("zcs-test/drop-order/pub").wait().expect("declare publisher");
        drop(session);
        drop(publisher);
    });
    println!("{TEST}: {grew} bytes more held after {CYCLES} cycles");
    assert!(grew < LIMIT, "{grew} bytes held after {CYCLES} sessions closed by their publisher's drop");
}

#[test]
fn a_ros_publisher_outliving_its_node_and_session_leaks_nothing() {
    const TEST: &str = "a_ros_publisher_outliving_its_node_and_session_leaks_nothing";
    let _l = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _w = watchdog_guard(TEST, Duration::from_secs(60));
    let grew = growth(|| {
        let session = host_session();
        let node = RosNode::new(&session, NodeOptions::new("drop_order").domain(7)).expect("node");
        let publisher = node.publisher::<Image<()>>("/drop_order", Qos::reliable(10)).expect("ROS publisher");
        drop(session);
        drop(node);
        drop(publisher);
    });
    println!("{TEST}: {grew} bytes more held after {CYCLES} cycles");
    assert!(grew < LIMIT, "{grew} bytes held after {CYCLES} sessions closed by their ROS publisher's drop");
}
