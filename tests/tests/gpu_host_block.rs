//! Host blocks: a publisher on a GPU, subscribers of its host without CUDA (CPU
//! consumers, in sessions with `device: host`) in other processes. Each message is
//! copied once, device→host, into a shared host block that every such subscriber reads
//! in place, beside CUDA subscribers that read the GPU block itself; every byte is
//! checked.
//!
//! Needs a GPU: otherwise each test prints `SKIPPED <name>: <reason>` (a failure under
//! `ZCS_REQUIRE_GPU=1`). The choice of path is unit-tested without a GPU
//! (`transport::locality`).

use std::process::Child;
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::{Kernels, check_pattern, fill_pattern};
use zcs_pool::PoolConfig;
use zcs_tests::{
    child_role, free_tcp_port, gpu_or_skip, loopback_zenoh_config, spawn_child, wait_child, wait_until, watchdog_guard,
};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::cuda::DeviceBlock;
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, Path, ZcsConfig};

const PREFIX: &str = "zcs-test/host-block";
const ENV_PORT: &str = "ZCS_TEST_PORT";
const ENV_KEY: &str = "ZCS_TEST_KEY";
const ENV_COUNT: &str = "ZCS_TEST_COUNT";
const ENV_MODE: &str = "ZCS_TEST_MODE";
/// The message sizes, cycled, when not [`SIZES`] (comma-separated bytes).
const ENV_SIZES: &str = "ZCS_TEST_SIZES";
/// A file the subscriber creates once it has checked every message (and holds them).
const ENV_DONE: &str = "ZCS_TEST_DONE";
const MIB: usize = 1 << 20;
/// Message sizes, cycled: above the inline threshold, one to several blocks' classes.
const SIZES: [usize; 4] = [MIB, 3 * MIB + 7, 32 * MIB, 64 * MIB];

fn gpu_config() -> ZcsConfig {
    ZcsConfig { device: DeviceChoice::Cuda, ..ZcsConfig::default() }
}

fn host_config() -> ZcsConfig {
    ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() }
}

/// A subscriber process (`cpu-sub`: host memory; `gpu-sub`: CUDA) that expects
/// `count` messages; `mode` is `check`, `hold` (keeps them) or `slow` (20 ms a message).
fn subscriber(role: &str, port: u16, key: &str, count: u64, mode: &str, extra: &[(&str, String)]) -> Child {
    let mut env = vec![
        (ENV_PORT, port.to_string()),
        (ENV_KEY, key.to_owned()),
        (ENV_COUNT, count.to_string()),
        (ENV_MODE, mode.to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    spawn_child("child_entry", role, &env)
}

/// The sizes a child's messages have: [`SIZES`] unless `ZCS_TEST_SIZES` names others.
fn sizes() -> Vec<usize> {
    match std::env::var(ENV_SIZES) {
        Ok(v) => v.split(',').map(|n| n.parse().expect("a size in bytes")).collect(),
        Err(_) => SIZES.to_vec(),
    }
}

/// The size of message `seq`.
fn size_of(sizes: &[usize], seq: u64) -> usize {
    sizes[(seq as usize - 1) % sizes.len()]
}

/// Publishes `count` messages of `sizes`, cycled, the pattern seeded by their sequence
/// number, each after `slow` of spinning on the producer's stream; returns the longest
/// put.
fn publish(
    p: &GpuPublisher,
    kernels: &Kernels,
    count: u64,
    sizes: &[usize],
    slow: Option<Duration>,
    gap: Duration,
) -> Duration {
    let mut longest = Duration::ZERO;
    for seq in 1..=count {
        let len = size_of(sizes, seq);
        let loan = p.loan(len).unwrap();
        let stream = loan.stream().unwrap().clone();
        if let Some(d) = slow {
            kernels.spin(&stream, d.as_nanos() as u64).unwrap();
        }
        // SAFETY: the loan owns ≥ len mapped bytes; `put` orders its signal after this.
        unsafe { kernels.fill(&stream, loan.device_ptr().unwrap(), len as u64, seq) }.unwrap();
        let t = Instant::now();
        assert_eq!(p.put(loan).unwrap().seq, seq);
        longest = longest.max(t.elapsed());
        std::thread::sleep(gap);
    }
    longest
}

/// The message's bytes as the pattern of its sequence number, read in place.
fn check_host(s: &GpuSample, sizes: &[usize]) {
    let bytes = s.host_bytes().expect("a host-memory subscriber reads host bytes");
    assert_eq!(bytes.len(), size_of(sizes, s.seq()), "message {}", s.seq());
    if let Some((at, n)) = check_pattern(&bytes, 0, s.seq()) {
        panic!("message {} ({} bytes, by {}): {n} bytes wrong, the first at {at}", s.seq(), bytes.len(), s.path());
    }
}

#[test]
fn gpu_host_block_cpu_and_cuda_consumers_read_every_byte() {
    const TEST: &str = "gpu_host_block_cpu_and_cuda_consumers_read_every_byte";
    let Some(gpu) = gpu_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/both"), 40);
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), gpu_config()).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu).unwrap();
    let cpu = [subscriber("cpu-sub", port, &key, n, "check", &[]), subscriber("cpu-sub", port, &key, n, "check", &[])];
    let cuda = subscriber("gpu-sub", port, &key, n, "check", &[]);
    wait_until("three zero-copy subscribers", Duration::from_secs(60), || p.zero_copy_subscribers() == 3);
    publish(&p, &kernels, n, &SIZES, None, Duration::from_millis(5));
    for (i, c) in cpu.into_iter().enumerate() {
        wait_child(c, &format!("CPU subscriber {i}"), Duration::from_secs(120));
    }
    wait_child(cuda, "the CUDA subscriber", Duration::from_secs(120));
    let s = p.stats();
    // One copy per message, shared by both CPU subscribers; no bytes for anyone.
    assert_eq!((s.host_blocks, s.host_leases, s.copies_out), (n, 2 * n, 0), "{s:?}");
    wait_until("every lease back", Duration::from_secs(10), || {
        p.pool_stats().blocks_in_use == 0 && p.host_pool_stats().is_some_and(|h| h.blocks_in_use == 0)
    });
}

/// The copy into host memory is ordered after the producer's kernels on the GPU, not
/// by the put waiting for them: each put returns while its producer still spins, and
/// the CPU subscriber still reads finished bytes.
#[test]
fn gpu_host_block_copy_waits_for_a_slow_producer_and_the_put_does_not() {
    const TEST: &str = "gpu_host_block_copy_waits_for_a_slow_producer_and_the_put_does_not";
    let Some(gpu) = gpu_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/slow-producer"), 6);
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), gpu_config()).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu).unwrap();
    let cpu = subscriber("cpu-sub", port, &key, n, "check", &[]);
    wait_until("the CPU subscriber", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
    let spin = Duration::from_millis(300);
    let longest = publish(&p, &kernels, n, &SIZES, Some(spin), Duration::ZERO);
    assert!(longest < spin / 2, "a put took {longest:?} while its producer spun {spin:?}: it waited for the GPU");
    wait_child(cpu, "the CPU subscriber", Duration::from_secs(120));
    assert_eq!(p.stats().host_blocks, n);
}

#[test]
fn gpu_host_block_cpu_consumer_killed_holding_blocks_returns_them() {
    const TEST: &str = "gpu_host_block_cpu_consumer_killed_holding_blocks_returns_them";
    let Some(gpu) = gpu_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/kill-sub"), 8);
    let done = std::env::temp_dir().join(format!("zcs-host-block-{}-{port}", std::process::id()));
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), gpu_config()).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu).unwrap();
    let mut victim = subscriber("cpu-sub", port, &key, n, "hold", &[(ENV_DONE, done.display().to_string())]);
    wait_until("the CPU subscriber", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
    publish(&p, &kernels, n, &SIZES, None, Duration::from_millis(5));
    wait_until("the subscriber holding every message, checked", Duration::from_secs(60), || done.exists());
    let held = p.host_pool_stats().unwrap().blocks_in_use;
    assert_eq!(held as u64, n, "every host block held");
    // The GPU blocks went back once their copies were done.
    wait_until("every GPU block back", Duration::from_secs(5), || p.pool_stats().blocks_in_use == 0);
    victim.kill().unwrap();
    let killed = Instant::now();
    let _ = victim.wait();
    wait_until("every host block back after the kill", Duration::from_secs(5), || {
        p.host_pool_stats().unwrap().blocks_in_use == 0
    });
    let whole = killed.elapsed();
    println!("{TEST}: host pool whole {:.1} ms after SIGKILL", whole.as_secs_f64() * 1e3);
    assert!(whole <= Duration::from_millis(100), "host pool whole only after {whole:?}");
    let _ = std::fs::remove_file(&done);
}

#[test]
fn gpu_host_block_publisher_killed_held_samples_stay_readable() {
    const TEST: &str = "gpu_host_block_publisher_killed_held_samples_stay_readable";
    let Some(_gpu) = gpu_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/kill-pub"), 4u64);
    let session =
        GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), host_config()).wait().unwrap();
    let sub = session.declare_subscriber(&key).wait().unwrap();
    let mut publisher = spawn_child(
        "child_entry",
        "gpu-pub",
        &[(ENV_PORT, port.to_string()), (ENV_KEY, key.clone()), (ENV_COUNT, n.to_string())],
    );
    let held: Vec<_> = (1..=n).map(|_| sub.recv_timeout(Duration::from_secs(60)).expect("a message")).collect();
    publisher.kill().unwrap();
    let _ = publisher.wait();
    for s in &held {
        assert_eq!(s.path(), Path::HostBlock);
        check_host(s, &SIZES);
    }
}

/// A CPU consumer that takes 20 ms a message, at a lease limit of 4: it gets each
/// message once, in order (bytes where it is at its limit), while a CUDA subscriber of
/// the same publisher reads every message in place and no put waits for the slow one.
/// Messages of 1 MiB, so that serving the slow one bytes costs the puts little.
#[test]
fn gpu_host_block_slow_cpu_consumer_does_not_slow_the_gpu_ones() {
    const TEST: &str = "gpu_host_block_slow_cpu_consumer_does_not_slow_the_gpu_ones";
    let Some(gpu) = gpu_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/slow-consumer"), 48);
    let cfg = ZcsConfig { pool: PoolConfig { max_holds_per_holder: 4, ..PoolConfig::default() }, ..gpu_config() };
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), cfg).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu).unwrap();
    let sizes = [MIB];
    let one_mib = [(ENV_SIZES, MIB.to_string())];
    let slow = subscriber("cpu-sub", port, &key, n, "slow", &one_mib);
    let cuda = subscriber("gpu-sub", port, &key, n, "check", &one_mib);
    wait_until("both subscribers", Duration::from_secs(60), || p.zero_copy_subscribers() == 2);
    let started = Instant::now();
    publish(&p, &kernels, n, &sizes, None, Duration::from_millis(2));
    let published = started.elapsed();
    wait_child(cuda, "the CUDA subscriber", Duration::from_secs(120));
    wait_child(slow, "the slow CPU subscriber", Duration::from_secs(120));
    let s = p.stats();
    println!("{TEST}: {n} messages published in {published:?}; {s:?}");
    assert!(s.lease_limited > 0, "the slow consumer never reached its limit: the test shows nothing; {s:?}");
    assert_eq!(s.lease_waits, 0, "a put waited for the slow consumer: {s:?}");
    // No copy into host memory was made for a consumer at its limit.
    assert_eq!(s.host_blocks, s.host_leases, "{s:?}");
    assert_eq!(s.host_blocks + s.lease_limited, n, "{s:?}");
    // The slow consumer alone takes 20 ms × n to read; the puts did not wait for it.
    assert!(published < Duration::from_millis(20) * n as u32 / 2, "publishing took {published:?}");
}

/// The other way round: a publisher without a GPU (`device: host`, a camera driver
/// say) and a CUDA subscriber of its host, which maps its blocks (host memory already)
/// and copies each message onto its GPU (`host-copy`) instead of taking bytes. Every
/// byte checked on the GPU; every lease back once the copies are done.
#[test]
fn gpu_host_block_cuda_subscriber_copies_a_host_publishers_blocks() {
    const TEST: &str = "gpu_host_block_cuda_subscriber_copies_a_host_publishers_blocks";
    let Some(_gpu) = gpu_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/host-pub"), 40);
    let session =
        GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), host_config()).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let cuda = subscriber("gpu-sub", port, &key, n, "host-copy", &[]);
    wait_until("the CUDA subscriber on the host blocks", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
    for seq in 1..=n {
        let len = size_of(&SIZES, seq);
        let mut loan = p.loan(len).unwrap();
        fill_pattern(loan.as_mut_slice().unwrap(), 0, seq);
        assert_eq!(p.put(loan).unwrap().seq, seq);
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_child(cuda, "the CUDA subscriber", Duration::from_secs(120));
    let s = p.stats();
    assert_eq!((s.leases, s.copies_out), (n, 0), "every message by its block, none as bytes: {s:?}");
    wait_until("every lease back", Duration::from_secs(10), || p.pool_stats().blocks_in_use == 0);
}

/// Entry point of the child processes; ignored in normal runs.
#[test]
#[ignore = "entry point of the child processes started by the tests above"]
fn child_entry() {
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let Some(role) = child_role() else { return };
    let _w = watchdog_guard("host-block child", Duration::from_secs(150));
    let port: u16 = env(ENV_PORT).parse().unwrap();
    let key = env(ENV_KEY);
    let count: u64 = env(ENV_COUNT).parse().unwrap();
    let z = loopback_zenoh_config(None, Some(port), Some(PREFIX));
    match role.as_str() {
        "cpu-sub" => {
            let (mode, sizes) = (env(ENV_MODE), sizes());
            let session = GpuSession::open(z, host_config()).wait().unwrap();
            let sub = session.declare_subscriber(&key).wait().unwrap();
            let mut held = Vec::new();
            let mut by_bytes = 0;
            for seq in 1..=count {
                let s = sub.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("message {seq}: {e}"));
                assert_eq!(s.seq(), seq, "in order, no gap");
                match (s.path(), mode.as_str()) {
                    (Path::HostBlock, _) => {}
                    (Path::CpuBytes, "slow") => by_bytes += 1,
                    (other, _) => panic!("message {seq} by {other}: {:?}", sub.path_reason(s.info())),
                }
                check_host(&s, &sizes);
                match mode.as_str() {
                    "hold" => held.push(s),
                    "slow" => std::thread::sleep(Duration::from_millis(20)),
                    _ => {}
                }
            }
            let st = sub.stats();
            assert_eq!((st.host_block + by_bytes, st.lost, st.zero_copy), (count, 0, 0), "{st:?}");
            println!("cpu-sub: {count} messages, {by_bytes} of them as bytes, every byte checked");
            if let Ok(done) = std::env::var(ENV_DONE) {
                std::fs::write(done, b"checked").unwrap();
            }
            if mode == "hold" {
                // Held until the parent kills this process.
                std::thread::sleep(Duration::from_secs(120));
            }
        }
        "gpu-sub" => {
            let sizes = sizes();
            // `host-copy`: a host-memory publisher's blocks copied onto this GPU.
            let path = if env(ENV_MODE) == "host-copy" { Path::HostCopy } else { Path::ZeroCopy };
            let session = GpuSession::open(z, gpu_config()).wait().unwrap();
            let gpu = session.gpu().unwrap().clone();
            let sub = session.declare_subscriber(&key).wait().unwrap();
            let (kernels, counter) = (Kernels::load(&gpu).unwrap(), DeviceBlock::allocate(&gpu, 4).unwrap());
            let stream = gpu.new_stream().unwrap();
            for seq in 1..=count {
                let s = sub.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("message {seq}: {e}"));
                assert_eq!((s.seq(), s.path()), (seq, path), "in order, by its block");
                let read = s.read(&stream).unwrap();
                // SAFETY: the read range is mapped and held by `s` until `end`.
                let bad =
                    unsafe { kernels.count_mismatches(&stream, read.device_ptr(), read.len() as u64, seq, &counter) }
                        .unwrap();
                read.end().unwrap();
                assert_eq!((bad, s.len()), (0, size_of(&sizes, seq)), "message {seq}");
            }
            println!("gpu-sub: {count} messages by {path}, every byte checked");
        }
        "gpu-pub" => {
            let session = GpuSession::open(z, gpu_config()).wait().unwrap();
            let gpu = session.gpu().unwrap().clone();
            let p = session.declare_publisher(&key).wait().unwrap();
            wait_until("the CPU subscriber", Duration::from_secs(60), || p.zero_copy_subscribers() == 1);
            publish(&p, &Kernels::load(&gpu).unwrap(), count, &SIZES, None, Duration::from_millis(5));
            // Killed by the parent while its subscriber holds every message.
            std::thread::sleep(Duration::from_secs(120));
        }
        other => panic!("unknown role {other}"),
    }
}
