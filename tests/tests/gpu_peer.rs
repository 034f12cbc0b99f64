//! Peer GPUs on one host: a publisher on GPU 0, subscribers in other processes on GPU 1
//! (its blocks mapped over NVLink or PCIe, read in place or copied onto GPU 1 on
//! arrival, or each message taken through a host block and copied onto GPU 1, as
//! without peer access) and on GPU 0 (the block itself), every byte checked on the
//! subscriber's GPU.
//!
//! Needs two GPUs with peer access: otherwise each test prints `SKIPPED <name>: <reason>`
//! (a failure under `ZCS_REQUIRE_PEER_GPUS=1`, which the GPU run sets on machines with
//! two GPUs or more). The choice itself is unit-tested without a GPU
//! (`transport::locality`).

use std::process::Child;
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::Kernels;
use zcs_tests::{
    child_role, free_tcp_port, loopback_zenoh_config, spawn_child, two_gpus_or_skip, wait_child, wait_until,
    watchdog_guard,
};
use zenoh_cuda_shm::config::{DeviceChoice, PeerGpus};
use zenoh_cuda_shm::cuda::DeviceBlock;
use zenoh_cuda_shm::{GpuPublisher, GpuSession, Path, ZcsConfig};

const PREFIX: &str = "zcs-test/peer";
const ENV_PORT: &str = "ZCS_TEST_PORT";
const ENV_ORDINAL: &str = "ZCS_TEST_ORDINAL";
const ENV_KEY: &str = "ZCS_TEST_KEY";
const ENV_COUNT: &str = "ZCS_TEST_COUNT";
const ENV_PATH: &str = "ZCS_TEST_PATH";
const ENV_MODE: &str = "ZCS_TEST_MODE";
/// A file the subscriber creates once it has checked every message (and holds them).
const ENV_DONE: &str = "ZCS_TEST_DONE";
const MIB: usize = 1 << 20;
/// Message sizes, cycled: above the inline threshold, one to several blocks' classes.
const SIZES: [usize; 4] = [MIB, 3 * MIB + 7, 32 * MIB, 64 * MIB];

fn config(ordinal: usize) -> ZcsConfig {
    ZcsConfig { device: DeviceChoice::Cuda, gpu_ordinal: ordinal, ..ZcsConfig::default() }
}

/// A subscriber process on `ordinal` that expects `count` messages by `path`.
fn subscriber(
    port: u16,
    key: &str,
    ordinal: usize,
    count: u64,
    path: Path,
    mode: &str,
    extra: &[(&str, String)],
) -> Child {
    let mut env = vec![
        (ENV_PORT, port.to_string()),
        (ENV_KEY, key.to_owned()),
        (ENV_ORDINAL, ordinal.to_string()),
        (ENV_COUNT, count.to_string()),
        (ENV_PATH, path.to_string()),
        (ENV_MODE, mode.to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    spawn_child("child_entry", "peer-sub", &env)
}

/// Publishes `count` messages, the pattern seeded by their sequence number, each after
/// `slow` of spinning on the producer's stream (the put returns at once).
fn publish(p: &GpuPublisher, kernels: &Kernels, count: u64, slow: Option<Duration>) {
    for seq in 1..=count {
        let len = SIZES[(seq as usize - 1) % SIZES.len()];
        let loan = p.loan(len).unwrap();
        let stream = loan.stream().unwrap().clone();
        if let Some(d) = slow {
            kernels.spin(&stream, d.as_nanos() as u64).unwrap();
        }
        // SAFETY: the loan owns ≥ len mapped bytes; `put` orders its signal after this.
        unsafe { kernels.fill(&stream, loan.device_ptr().unwrap(), len as u64, seq) }.unwrap();
        assert_eq!(p.put(loan).unwrap().seq, seq);
        if slow.is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A subscriber's environment for `peer_gpus: copy`.
fn copy_mode() -> (&'static str, String) {
    ("ZCS_PEER_GPUS", "copy".to_owned())
}

/// A subscriber's environment for `peer_gpus: host` (what it does without peer access).
fn host_mode() -> (&'static str, String) {
    ("ZCS_PEER_GPUS", "host".to_owned())
}

#[test]
fn gpu_peer_subscribers_on_both_gpus_read_every_byte() {
    const TEST: &str = "gpu_peer_subscribers_on_both_gpus_read_every_byte";
    let Some((gpu0, _gpu1)) = two_gpus_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/both"), 40);
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), config(0)).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu0).unwrap();
    let peer = subscriber(port, &key, 1, n, Path::ZeroCopyPeer, "check", &[]);
    let copy = subscriber(port, &key, 1, n, Path::PeerCopy, "check", &[copy_mode()]);
    let host = subscriber(port, &key, 1, n, Path::HostCopy, "check", &[host_mode()]);
    let same = subscriber(port, &key, 0, n, Path::ZeroCopy, "check", &[]);
    wait_until("four zero-copy subscribers", Duration::from_secs(60), || p.zero_copy_subscribers() == 4);
    publish(&p, &kernels, n, None);
    wait_child(peer, "the subscriber on GPU 1", Duration::from_secs(120));
    wait_child(copy, "the copying subscriber on GPU 1", Duration::from_secs(120));
    wait_child(host, "the subscriber on GPU 1 through host memory", Duration::from_secs(120));
    wait_child(same, "the subscriber on GPU 0", Duration::from_secs(120));
    let s = p.stats();
    assert_eq!((s.copies_out, s.host_blocks, s.host_leases), (0, n, n), "nobody needed bytes: {s:?}");
    wait_until("every lease back", Duration::from_secs(10), || {
        p.pool_stats().blocks_in_use == 0 && p.host_pool_stats().is_some_and(|h| h.blocks_in_use == 0)
    });
}

#[test]
fn gpu_peer_reads_wait_for_a_slow_producer_on_the_other_gpu() {
    const TEST: &str = "gpu_peer_reads_wait_for_a_slow_producer_on_the_other_gpu";
    let Some((gpu0, _gpu1)) = two_gpus_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/slow"), 6);
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), config(0)).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu0).unwrap();
    // The subscriber also reads each message unordered, on a stream without the wait:
    // that read must see unfinished data, or the ordered one proves nothing.
    // The copying subscriber's copy must wait as well: its unordered read sees the
    // copy's target before the copy.
    let peer = subscriber(port, &key, 1, n, Path::ZeroCopyPeer, "ordered", &[]);
    let copy = subscriber(port, &key, 1, n, Path::PeerCopy, "ordered", &[copy_mode()]);
    wait_until("the zero-copy subscribers", Duration::from_secs(60), || p.zero_copy_subscribers() == 2);
    publish(&p, &kernels, n, Some(Duration::from_millis(300)));
    wait_child(peer, "the subscriber on GPU 1", Duration::from_secs(120));
    wait_child(copy, "the copying subscriber on GPU 1", Duration::from_secs(120));
}

/// `peer_gpus: copy`: every message is copied onto GPU 1 as it arrives and the
/// publisher's lease goes back then: with the subscriber holding every sample, the
/// publisher's pool is whole, and the samples still read right.
#[test]
fn gpu_peer_copy_releases_the_publishers_blocks_while_samples_are_held() {
    const TEST: &str = "gpu_peer_copy_releases_the_publishers_blocks_while_samples_are_held";
    let Some((gpu0, gpu1)) = two_gpus_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/copy-held"), 12);
    let free1 = gpu1.mem_info().unwrap().0;
    let done = std::env::temp_dir().join(format!("zcs-peer-copy-{}-{port}", std::process::id()));
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), config(0)).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu0).unwrap();
    let done_env = (ENV_DONE, done.display().to_string());
    let mut holder = subscriber(port, &key, 1, n, Path::PeerCopy, "hold", &[copy_mode(), done_env]);
    wait_until("the zero-copy subscriber", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
    publish(&p, &kernels, n, None);
    wait_until("the subscriber holding every message, checked", Duration::from_secs(60), || done.exists());
    assert!(holder.try_wait().unwrap().is_none(), "the holder exited early");
    // Each lease went back once its copy completed, though every sample is still held.
    wait_until("every lease back", Duration::from_secs(5), || p.pool_stats().blocks_in_use == 0);
    assert_eq!(p.stats().copies_out, 0, "{:?}", p.stats());
    holder.kill().unwrap();
    let _ = holder.wait();
    let _ = std::fs::remove_file(&done);
    // Its copies on GPU 1 went with it.
    wait_until("GPU 1's memory back", Duration::from_secs(10), || gpu1.mem_info().unwrap().0 + (64 << 20) >= free1);
}

/// Through host memory: each message's host block goes back once it is copied onto
/// GPU 1, with every sample still held there.
#[test]
fn gpu_peer_host_copy_releases_the_host_blocks_while_samples_are_held() {
    const TEST: &str = "gpu_peer_host_copy_releases_the_host_blocks_while_samples_are_held";
    let Some((gpu0, _gpu1)) = two_gpus_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/host-held"), 12);
    let done = std::env::temp_dir().join(format!("zcs-peer-host-{}-{port}", std::process::id()));
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), config(0)).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu0).unwrap();
    let done_env = (ENV_DONE, done.display().to_string());
    let mut holder = subscriber(port, &key, 1, n, Path::HostCopy, "hold", &[host_mode(), done_env]);
    wait_until("the subscriber through host memory", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
    publish(&p, &kernels, n, None);
    wait_until("the subscriber holding every message, checked", Duration::from_secs(60), || done.exists());
    assert!(holder.try_wait().unwrap().is_none(), "the holder exited early");
    wait_until("every block back", Duration::from_secs(5), || {
        p.pool_stats().blocks_in_use == 0 && p.host_pool_stats().is_some_and(|h| h.blocks_in_use == 0)
    });
    assert_eq!((p.stats().copies_out, p.stats().host_blocks), (0, n), "{:?}", p.stats());
    holder.kill().unwrap();
    let _ = holder.wait();
    let _ = std::fs::remove_file(&done);
}

#[test]
fn gpu_peer_off_by_configuration_falls_back_to_bytes_with_its_reason() {
    const TEST: &str = "gpu_peer_off_by_configuration_falls_back_to_bytes_with_its_reason";
    let Some((gpu0, _gpu1)) = two_gpus_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/off"), 8);
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), config(0)).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu0).unwrap();
    let off = subscriber(port, &key, 1, n, Path::CpuBytes, "check", &[("ZCS_PEER_GPUS", "off".to_owned())]);
    wait_until("the GPU-aware subscriber", Duration::from_secs(60), || p.aware_subscribers() == 1);
    // Its token is known: give a handshake (which must not happen) time to start.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(p.zero_copy_subscribers(), 0, "peer GPUs off, yet a zero-copy link");
    publish(&p, &kernels, n, None);
    wait_child(off, "the subscriber on GPU 1 with peer GPUs off", Duration::from_secs(120));
    assert!(p.stats().copies_out >= n, "{:?}", p.stats());
}

#[test]
fn gpu_peer_subscriber_killed_holding_blocks_returns_them() {
    const TEST: &str = "gpu_peer_subscriber_killed_holding_blocks_returns_them";
    let Some((gpu0, gpu1)) = two_gpus_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/kill-sub"), 4);
    let free1 = gpu1.mem_info().unwrap().0;
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), config(0)).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu0).unwrap();
    let mut victim = subscriber(port, &key, 1, n, Path::ZeroCopyPeer, "hold", &[]);
    wait_until("the zero-copy subscriber", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
    publish(&p, &kernels, n, None);
    wait_until("the subscriber holding every message", Duration::from_secs(30), || {
        p.pool_stats().blocks_in_use as u64 >= n
    });
    victim.kill().unwrap();
    let killed = Instant::now();
    let _ = victim.wait();
    wait_until("every block back after the kill", Duration::from_secs(5), || p.pool_stats().blocks_in_use == 0);
    let whole = killed.elapsed();
    println!("{TEST}: pool whole {:.1} ms after SIGKILL", whole.as_secs_f64() * 1e3);
    assert!(whole <= Duration::from_millis(100), "pool whole only after {whole:?}");
    // The dead subscriber's context on GPU 1 (and its mappings of GPU 0's blocks) are gone.
    wait_until("GPU 1's memory back", Duration::from_secs(10), || gpu1.mem_info().unwrap().0 + (64 << 20) >= free1);
}

#[test]
fn gpu_peer_publisher_killed_held_samples_stay_readable() {
    const TEST: &str = "gpu_peer_publisher_killed_held_samples_stay_readable";
    let Some((gpu0, gpu1)) = two_gpus_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/kill-pub"), 4u64);
    let free0 = gpu0.mem_info().unwrap().0;
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), config(1)).wait().unwrap();
    let sub = session.declare_subscriber(&key).wait().unwrap();
    let mut publisher = spawn_child(
        "child_entry",
        "peer-pub",
        &[(ENV_PORT, port.to_string()), (ENV_KEY, key.clone()), (ENV_COUNT, n.to_string())],
    );
    let held: Vec<_> = (1..=n).map(|_| sub.recv_timeout(Duration::from_secs(60)).expect("a message")).collect();
    publisher.kill().unwrap();
    let _ = publisher.wait();
    let kernels = Kernels::load(&gpu1).unwrap();
    let counter = DeviceBlock::allocate(&gpu1, 4).unwrap();
    let stream = gpu1.new_stream().unwrap();
    for s in &held {
        assert_eq!(s.path(), Path::ZeroCopyPeer);
        let read = s.read(&stream).unwrap();
        // SAFETY: the read range is mapped and held by `s` until `end`.
        let bad = unsafe { kernels.count_mismatches(&stream, read.device_ptr(), read.len() as u64, s.seq(), &counter) };
        read.end().unwrap();
        assert_eq!(bad.unwrap(), 0, "message {} after its publisher's death", s.seq());
    }
    drop(held);
    // With the last mapping gone, GPU 0's memory (the dead publisher's blocks) is back.
    wait_until("GPU 0's memory back", Duration::from_secs(10), || gpu0.mem_info().unwrap().0 + (64 << 20) >= free0);
}

/// Entry point of the child processes; ignored in normal runs.
#[test]
#[ignore = "entry point of the child processes started by the tests above"]
fn child_entry() {
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let Some(role) = child_role() else { return };
    let _w = watchdog_guard("peer child", Duration::from_secs(150));
    let port: u16 = env(ENV_PORT).parse().unwrap();
    let key = env(ENV_KEY);
    let count: u64 = env(ENV_COUNT).parse().unwrap();
    let z = loopback_zenoh_config(None, Some(port), Some(PREFIX));
    match role.as_str() {
        "peer-sub" => {
            let ordinal: usize = env(ENV_ORDINAL).parse().unwrap();
            let cfg = config(ordinal).with_env_overrides().unwrap();
            let session = GpuSession::open(z, cfg).wait().unwrap();
            let gpu = session.gpu().unwrap().clone();
            let sub = session.declare_subscriber(&key).wait().unwrap();
            let (kernels, counter) = (Kernels::load(&gpu).unwrap(), DeviceBlock::allocate(&gpu, 4).unwrap());
            let (stream, unordered) = (gpu.new_stream().unwrap(), gpu.new_stream().unwrap());
            let (want_path, mode) = (env(ENV_PATH), env(ENV_MODE));
            let mut held = Vec::new();
            for seq in 1..=count {
                let s = sub.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("message {seq}: {e}"));
                assert_eq!(s.seq(), seq, "in order, no gap");
                assert_eq!(s.path().to_string(), want_path, "message {seq}: {:?}", sub.path_reason(s.info()));
                let read = s.read(&stream).unwrap();
                if mode == "ordered" {
                    // Negative control: the same bytes on a stream that did not wait.
                    // SAFETY: the read range is mapped and held by `s` until `end`.
                    let early = unsafe {
                        kernels.count_mismatches(&unordered, read.device_ptr(), read.len() as u64, seq, &counter)
                    }
                    .unwrap();
                    assert!(early as usize > read.len() / 2, "message {seq}: an unordered read saw finished data");
                }
                // SAFETY: as above.
                let bad =
                    unsafe { kernels.count_mismatches(&stream, read.device_ptr(), read.len() as u64, seq, &counter) }
                        .unwrap();
                read.end().unwrap();
                assert_eq!(bad, 0, "message {seq} ({} bytes) on GPU {ordinal}", s.len());
                if mode == "hold" {
                    held.push(s);
                }
            }
            if want_path == Path::CpuBytes.to_string() {
                let (publisher, _) = sub.publishers()[0];
                let why = sub.bytes_reason(publisher).unwrap_or_default();
                assert!(why.contains("peer GPUs are off"), "{why}");
            }
            if want_path == Path::PeerCopy.to_string() {
                let st = sub.stats();
                assert_eq!((st.peer_copy, st.zero_copy), (count, 0), "{st:?}");
            }
            if want_path == Path::HostCopy.to_string() {
                let st = sub.stats();
                assert_eq!((st.host_block, st.zero_copy, st.import_failures), (count, 0, 0), "{st:?}");
            }
            println!("peer-sub on GPU {ordinal}: {count} messages by {want_path}, every byte checked");
            if let Ok(done) = std::env::var(ENV_DONE) {
                std::fs::write(done, b"checked").unwrap();
            }
            if mode == "hold" {
                // Held until the parent kills this process.
                std::thread::sleep(Duration::from_secs(120));
            }
        }
        "peer-pub" => {
            let session = GpuSession::open(z, config(0)).wait().unwrap();
            let gpu = session.gpu().unwrap().clone();
            let p = session.declare_publisher(&key).wait().unwrap();
            wait_until("the zero-copy subscriber", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
            publish(&p, &Kernels::load(&gpu).unwrap(), count, None);
            // Killed by the parent while its subscriber holds every message.
            std::thread::sleep(Duration::from_secs(120));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn peer_gpus_configuration_parses() {
    let cfg = ZcsConfig::from_json5("{ peer_gpus: 'off' }").unwrap();
    assert_eq!(cfg.peer_gpus, PeerGpus::Off);
    assert_eq!(ZcsConfig::from_json5("{ peer_gpus: 'copy' }").unwrap().peer_gpus, PeerGpus::Copy);
    assert_eq!(ZcsConfig::from_json5("{ peer_gpus: 'host' }").unwrap().peer_gpus, PeerGpus::Host);
    assert_eq!(ZcsConfig::default().peer_gpus, PeerGpus::InPlace);
    assert!(ZcsConfig::from_json5("{ peer_gpus: 'copy_always' }").is_err());
}
