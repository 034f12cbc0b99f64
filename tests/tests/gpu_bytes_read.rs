//! Bytes samples read on the GPU: a CUDA subscriber that takes a GPU publisher's
//! messages as bytes (here: one that says it runs on another host, `ZCS_HOST_ID`) and
//! reads them with `GpuSample::read`. Each read stages the payload in pinned memory and
//! copies it on the reader's stream, after the work already queued there; the staging
//! must outlive the sample when the stream is still busy. Every byte is checked on the
//! GPU.
//!
//! Needs a GPU: otherwise each test prints `SKIPPED <name>: <reason>` (a failure under
//! `ZCS_REQUIRE_GPU=1`).

use std::time::Duration;

use zcs_memory::cuda::kernels::Kernels;
use zcs_tests::{
    child_role, free_tcp_port, gpu_or_skip, loopback_zenoh_config, spawn_child, wait_child, wait_until, watchdog_guard,
};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::cuda::{DeviceBlock, copy};
use zenoh_cuda_shm::{GpuSession, Path, ZcsConfig};

const PREFIX: &str = "zcs-test/bytes-read";
const ENV_PORT: &str = "ZCS_TEST_PORT";
const ENV_KEY: &str = "ZCS_TEST_KEY";
const ENV_COUNT: &str = "ZCS_TEST_COUNT";
const MIB: usize = 1 << 20;
/// Message sizes, cycled: the inline threshold's edge, and one to several MiB.
const SIZES: [usize; 5] = [64 * 1024 + 1, MIB, 3 * MIB + 7, 32 * MIB, 64 * MIB];

fn gpu_config() -> ZcsConfig {
    ZcsConfig { device: DeviceChoice::Cuda, ..ZcsConfig::default() }
}

fn size_of(seq: u64) -> usize {
    SIZES[(seq as usize - 1) % SIZES.len()]
}

/// A publisher on the GPU; a CUDA subscriber process with a host id of its own. Each
/// message reaches it as bytes ("on another host"); it reads each on a stream still busy
/// with 20 ms of earlier work, so the copy to the GPU runs after the sample is dropped,
/// and the check kernel finds every byte right.
#[test]
fn gpu_bytes_read_on_another_host_checks_every_byte() {
    const TEST: &str = "gpu_bytes_read_on_another_host_checks_every_byte";
    let Some(gpu) = gpu_or_skip(TEST) else { return };
    let _w = watchdog_guard(TEST, Duration::from_secs(180));
    let (port, key, n) = (free_tcp_port(), format!("{PREFIX}/{}", std::process::id()), 40u64);
    let session = GpuSession::open(loopback_zenoh_config(Some(port), None, Some(PREFIX)), gpu_config()).wait().unwrap();
    let p = session.declare_publisher(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu).unwrap();
    let env = [
        (ENV_PORT, port.to_string()),
        (ENV_KEY, key.clone()),
        (ENV_COUNT, n.to_string()),
        ("ZCS_HOST_ID", "another-host".to_owned()),
    ];
    let child = spawn_child("child_entry", "gpu-sub", &env);
    wait_until("the subscriber on another host", Duration::from_secs(60), || {
        p.aware_subscribers() == 1 && p.zero_copy_subscribers() == 0 && !p.plain_subscribers()
    });
    for seq in 1..=n {
        let len = size_of(seq);
        let loan = p.loan(len).unwrap();
        // SAFETY: the loan owns ≥ len mapped bytes; `put` orders its signal after this.
        unsafe { kernels.fill(loan.stream().unwrap(), loan.device_ptr().unwrap(), len as u64, seq) }.unwrap();
        assert_eq!(p.put(loan).unwrap().seq, seq);
    }
    wait_child(child, "the subscriber", Duration::from_secs(120));
    assert_eq!(p.stats().copies_out, n, "one copy out per message, for the bytes");
}

/// Entry point of the child process; ignored in normal runs.
#[test]
#[ignore = "entry point of the child process started by the test above"]
fn child_entry() {
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let Some(role) = child_role() else { return };
    assert_eq!(role, "gpu-sub");
    let _w = watchdog_guard("bytes-read child", Duration::from_secs(150));
    let (port, key): (u16, String) = (env(ENV_PORT).parse().unwrap(), env(ENV_KEY));
    let count: u64 = env(ENV_COUNT).parse().unwrap();
    // ZCS_HOST_ID comes from the parent: this session is on "another host".
    let cfg = gpu_config().with_env_overrides().unwrap();
    assert_eq!(cfg.host_id.as_ref().map(|h| h.as_str()), Some("another-host"));
    let session = GpuSession::open(loopback_zenoh_config(None, Some(port), Some(PREFIX)), cfg).wait().unwrap();
    let gpu = session.gpu().unwrap().clone();
    let sub = session.declare_subscriber(&key).wait().unwrap();
    let kernels = Kernels::load(&gpu).unwrap();
    let counter = DeviceBlock::allocate(&gpu, 4).unwrap();
    let stream = gpu.new_stream().unwrap();
    // SAFETY: the counter holds 4 mapped bytes; zeroed before any check on this stream.
    unsafe { copy::host_to_device(&stream, counter.device_ptr(), &[0u8; 4]) }.unwrap();
    for seq in 1..=count {
        let s = sub.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("message {seq}: {e}"));
        assert_eq!((s.seq(), s.path()), (seq, Path::CpuBytes), "in order, as bytes");
        assert_eq!(sub.bytes_reason(s.info().publisher).as_deref(), Some("on another host"));
        // The stream is busy for 20 ms: the copy to the GPU and the check run after the
        // sample is gone, from the read's own staging.
        kernels.spin(&stream, 20_000_000).unwrap();
        let read = s.read(&stream).unwrap();
        assert_eq!(read.len(), size_of(seq), "message {seq}");
        // SAFETY: the read's range is mapped until the stream has passed its fence
        // (recorded by `end`, after this kernel); the counter is a mapped u32.
        unsafe { kernels.check(&stream, read.device_ptr(), read.len() as u64, seq, counter.device_ptr()) }.unwrap();
        read.end().unwrap();
        drop(s);
    }
    let mut bad = [0u8; 4];
    // SAFETY: `bad` has 4 bytes; the copy waits for the stream.
    unsafe { copy::device_to_host(&stream, counter.device_ptr(), &mut bad) }.unwrap();
    assert_eq!(u32::from_le_bytes(bad), 0, "bytes differing from the pattern, over {count} messages");
    let st = sub.stats();
    assert_eq!((st.cpu_bytes, st.zero_copy, st.lost), (count, 0, 0), "{st:?}");
    println!("gpu-sub: {count} messages as bytes, each read on the GPU behind 20 ms of work, every byte checked");
}
