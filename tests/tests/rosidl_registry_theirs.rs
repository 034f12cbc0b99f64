//! Our side of the CUDA buffer backend's host endpoint registry (`zcs_wire::rosidl_cuda::
//! registry`) against the backend's own code: `hem_peer`, a process that runs
//! `host_endpoint_manager.cpp` of `cuda_buffer` as built from its released sources by
//! `scripts/cuda-buffer-core.sh`, and decides as the backend's rmw plugin decides. Host
//! only: the registry needs no GPU (the peer is given device 0 through the backend's
//! own `CUDA_BUFFER_DEVICE_ID_OVERRIDE`).
//!
//! Without `ZCS_CUDA_BUFFER_CORE` (the script's output folder):
//! `SKIPPED rosidl_registry_theirs_...: ...`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use zcs_tests::line_peer::LinePeer;
use zcs_tests::{to_hex, watchdog_guard};
use zcs_wire::rosidl_cuda::registry::{self, EndpointKind, HostRegistry};

const CORE_ENV: &str = "ZCS_CUDA_BUFFER_CORE";

/// `hem_peer`, or why there is none (then the test prints SKIPPED and returns).
fn peer_binary(test: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(CORE_ENV) else {
        println!(
            "SKIPPED {test}: {CORE_ENV} is not set (scripts/cuda-buffer-core.sh --src <rosidl_buffer_backends sources> \
             builds the backend's registry and prints it)"
        );
        return None;
    };
    let bin = PathBuf::from(dir).join("bin/hem_peer");
    assert!(bin.is_file(), "{CORE_ENV} is set but {} is missing: run scripts/cuda-buffer-core.sh", bin.display());
    Some(bin)
}

/// A registry domain of this test process and test, away from real ROS domains.
fn domain(test: u32) -> u32 {
    1_000_000 + (std::process::id() % 100_000) * 10 + test
}

/// The `/dev/shm` file of `domain`'s registry.
fn registry_file(domain: u32) -> PathBuf {
    PathBuf::from("/dev/shm").join(registry::name_for_domain(domain).unwrap())
}

/// Their registry in a process of its own, on `domain`.
fn start_theirs(bin: &Path, domain: u32) -> LinePeer {
    let mut theirs = LinePeer::start(bin, &[domain.to_string()], &[("CUDA_BUFFER_DEVICE_ID_OVERRIDE", "0")]);
    assert_eq!(theirs.line(), "ready");
    theirs
}

/// Ends their process as a ROS process ends: its registry handle is destroyed.
fn exit(theirs: LinePeer) {
    let status = theirs.exit();
    assert!(status.success(), "hem_peer: {status}");
}

fn gid(n: u8) -> [u8; 16] {
    let mut g = [0xa5; 16];
    g[15] = n;
    g
}

#[test]
fn rosidl_registry_theirs_and_ours_read_each_others_entries() {
    const NAME: &str = "rosidl_registry_theirs_and_ours_read_each_others_entries";
    let Some(bin) = peer_binary(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(60));
    let d = domain(1);
    let ours = HostRegistry::open(d).unwrap();
    let mut theirs = start_theirs(&bin, d);
    let uid = registry::our_uid();
    assert_eq!(theirs.ask("self"), format!("device=0 uid={uid}"));

    // Our subscriptions as their publisher's plugin sees them: another process of the
    // host; a descriptor only for the one on its device that can import.
    ours.register(gid(1), EndpointKind::Subscription, 0, true, "sensor_msgs/msg/Image").unwrap();
    ours.register(gid(2), EndpointKind::Subscription, 1, true, "sensor_msgs/msg/Image").unwrap();
    ours.register(gid(3), EndpointKind::Subscription, 0, false, "sensor_msgs/msg/Image").unwrap();
    let inst = ours.instance_id();
    let seen = |device: i32, ipc: u8, cuda: u8| {
        format!("found=1 locality=2 kind=1 instance={inst} device={device} uid={uid} ipc={ipc} cuda={cuda}")
    };
    assert_eq!(theirs.ask(&format!("query {}", to_hex(&gid(1)))), seen(0, 1, 1));
    assert_eq!(theirs.ask(&format!("query {}", to_hex(&gid(2)))), seen(1, 1, 0));
    assert_eq!(theirs.ask(&format!("query {}", to_hex(&gid(3)))), seen(0, 0, 0));
    assert_eq!(theirs.ask(&format!("query {}", to_hex(&gid(9)))), "found=0");

    // Their publisher as our subscriptions read it.
    assert_eq!(theirs.ask("ipc 1"), "ok");
    assert_eq!(theirs.ask(&format!("register pub {} sensor_msgs/msg/Image", to_hex(&gid(4)))), "ok");
    let entry = ours.lookup(gid(4)).unwrap().expect("their publisher's entry");
    assert_eq!(
        (entry.kind, entry.device_id, entry.uid, entry.ipc_capable, entry.pid(), entry.name.as_str()),
        (EndpointKind::Publisher as u8, 0, uid, true, theirs.pid() as i32, "sensor_msgs/msg/Image")
    );

    // One of ours unregistered is still there for them: their refresh adds and updates
    // what it caches, and never removes an entry (recorded in docs/cuda-buffer-backend.md).
    assert!(ours.unregister(gid(1)).unwrap());
    assert_eq!(theirs.ask(&format!("query {}", to_hex(&gid(1)))), seen(0, 1, 1));

    // Their process ends: its entries go inactive; ours stay, and so does the file.
    exit(theirs);
    assert_eq!(ours.lookup(gid(4)).unwrap(), None);
    assert!(ours.lookup(gid(2)).unwrap().is_some());
    assert!(registry_file(d).exists());
    drop(ours);
    assert!(!registry_file(d).exists(), "the last handle out removes the registry");
}

#[test]
fn rosidl_registry_theirs_dead_entries_are_purged_and_the_last_out_removes_it() {
    const NAME: &str = "rosidl_registry_theirs_dead_entries_are_purged_and_the_last_out_removes_it";
    let Some(bin) = peer_binary(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(60));
    let d = domain(2);

    let ours = HostRegistry::open(d).unwrap();
    ours.register(gid(3), EndpointKind::Publisher, 0, true, "t").unwrap();

    // Killed: nothing marks its entry inactive until a handle attaches and purges it.
    let mut killed = start_theirs(&bin, d);
    assert_eq!(killed.ask(&format!("register pub {} t", to_hex(&gid(1)))), "ok");
    killed.kill();
    assert!(ours.lookup(gid(1)).unwrap().is_some(), "active until purged");
    drop(HostRegistry::open(d).unwrap());
    assert_eq!(ours.lookup(gid(1)).unwrap(), None, "a dead process's entry is purged on attach");

    // Ours out first: theirs, still active, keeps the file; theirs out last removes it.
    let mut theirs = start_theirs(&bin, d);
    assert_eq!(theirs.ask(&format!("register sub {} t", to_hex(&gid(2)))), "ok");
    drop(ours);
    assert!(registry_file(d).exists());
    exit(theirs);
    assert!(!registry_file(d).exists(), "their last handle out removes the registry");
}

#[test]
fn rosidl_registry_theirs_concurrent_registrations_lose_none() {
    const NAME: &str = "rosidl_registry_theirs_concurrent_registrations_lose_none";
    let Some(bin) = peer_binary(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(60));
    let d = domain(3);
    let ours = HostRegistry::open(d).unwrap();
    let mut theirs = start_theirs(&bin, d);
    const N: u32 = 200;
    // Both sides write 200 entries at once, each under the registry's semaphore.
    let writer = std::thread::spawn(move || {
        let reply = theirs.ask(&format!("many pub {} {N}", to_hex(&[0x7e; 16])));
        (theirs, reply)
    });
    for i in 0..N {
        let mut g = [0x3c; 16];
        g[12..].copy_from_slice(&i.to_be_bytes());
        ours.register(g, EndpointKind::Subscription, 0, true, "many").unwrap();
    }
    let (mut theirs, reply) = writer.join().unwrap();
    assert_eq!(reply, format!("ok {N}"));
    let active = ours.active().unwrap();
    let count = |kind: EndpointKind| active.iter().filter(|e| e.kind == kind as u8).count();
    assert_eq!((count(EndpointKind::Publisher), count(EndpointKind::Subscription)), (N as usize, N as usize));
    let mut last = [0x3c; 16];
    last[12..].copy_from_slice(&(N - 1).to_be_bytes());
    assert!(theirs.ask(&format!("query {}", to_hex(&last))).starts_with("found=1 locality=2 kind=1"));
    exit(theirs);
}
