//! A publisher that sees a subscriber's token may put bytes for it at once, and that
//! first message must arrive: the subscriber declares its bytes subscription before its
//! token, so the publisher's session knows the subscription by then. (With the token
//! first, about one first message in a hundred was lost, on this machine.) Host memory;
//! the subscriber takes bytes, as a subscriber on another host does.

use std::time::Duration;

use zcs_memory::cuda::kernels::fill_pattern;
use zcs_tests::{free_tcp_port, loopback_zenoh_config, wait_until, watchdog_guard};
use zenoh_cuda_shm::config::{DeviceChoice, HostId};
use zenoh_cuda_shm::{GpuSession, Path, ZcsConfig};

const JOINS: usize = 300;
const LEN: usize = 256 << 10;

fn session(listen: Option<u16>, connect: Option<u16>, host: &str) -> GpuSession {
    let cfg =
        ZcsConfig { device: DeviceChoice::Host, host_id: Some(HostId::new(host).unwrap()), ..ZcsConfig::default() };
    GpuSession::open(loopback_zenoh_config(listen, connect, None), cfg).wait().expect("a host-memory session")
}

#[test]
fn the_first_message_put_for_a_new_subscriber_arrives() {
    const TEST: &str = "the_first_message_put_for_a_new_subscriber_arrives";
    let _w = watchdog_guard(TEST, Duration::from_secs(240));
    let port = free_tcp_port();
    let ours = session(Some(port), None, "host-a");
    let theirs = session(None, Some(port), "host-b");
    let mut missed = Vec::new();
    for i in 0..JOINS {
        let key = format!("zcs-test/first/{}/{i}", std::process::id());
        let sub = theirs.declare_subscriber(key.clone()).wait().unwrap();
        let p = ours.declare_publisher(key).wait().unwrap();
        wait_until("the subscriber's token", Duration::from_secs(20), || p.aware_subscribers() == 1);
        let mut loan = p.loan(LEN).unwrap();
        fill_pattern(loan.as_mut_slice().unwrap(), 0, 1);
        let put = p.put(loan).unwrap();
        match sub.recv_timeout(Duration::from_secs(5)) {
            // (The bytes themselves are checked elsewhere; a check here would slow each
            // join enough to hide the race.)
            Ok(s) => assert_eq!((s.info().seq, s.path(), s.len()), (1, Path::CpuBytes, LEN)),
            Err(_) => missed.push((i, put)),
        }
    }
    assert!(missed.is_empty(), "{} of {JOINS} first messages lost: {missed:?}", missed.len());
}
