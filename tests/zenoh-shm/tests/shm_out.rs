//! Copies out into Zenoh's shared memory (`zenoh_shm_out_bytes`, feature `zenoh-shm`): a
//! plain Zenoh subscriber in another process, shared memory on, receives our publisher's
//! messages as SHM buffers (by reference, not through the socket), every byte checked;
//! a message larger than the pool still arrives, copied out the usual way. The same for
//! a ROS 2 publisher's CDR messages to an ordinary ROS subscription. On host memory
//! blocks (CI) and, with a GPU, on CUDA blocks (`SKIPPED` without one).
//!
//! Built with `--features zenoh-shm` only, in a cargo invocation of its own
//! (`scripts/test.sh`): the feature changes `zenoh::FEATURES` for everything built with it.

use std::time::Duration;

use zcs_memory::cuda::kernels::{Kernels, check_pattern, fill_pattern};
use zcs_tests::{
    MediumKind, child_role, free_tcp_port, gpu_or_skip, loopback_shm_zenoh_config, spawn_child, wait_child, wait_until,
    watchdog_guard,
};
use zenoh::Wait;
use zenoh_cuda_shm::tensor_codec::cdr::{Header, Image, Time};
use zenoh_cuda_shm::{GpuLoan, GpuPublisher, GpuSession, ShmOutError, ZcsConfig};
use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RosDataMessage, RosNode};

const PREFIX: &str = "zcs-test/shm-out";
const ENV_PORT: &str = "ZCS_TEST_PORT";
const ENV_KEY: &str = "ZCS_TEST_KEY";
/// The ROS topic (`ros-sub`).
const ENV_TOPIC: &str = "ZCS_TEST_TOPIC";
const ROS_DOMAIN: u32 = 23;
/// Image rows of the ROS test: 512 × 512 mono8 (256 KiB), 1024 × 1024 (1 MiB), and one
/// larger than the pool, 5120 × 4096 (20 MiB).
const ROS_IMAGES: [(u32, u32); 3] = [(512, 512), (1024, 1024), (5120, 4096)];
const MIB: usize = 1 << 20;
const POOL: u64 = 16 << 20;
/// Above the inline threshold (64 KiB); the last one is larger than the pool.
const SIZES: [usize; 5] = [256 << 10, MIB, 3 * MIB + 7, 5 * MIB, 24 * MIB];

fn zenoh_config(listen: Option<u16>, connect: Option<u16>) -> zenoh::Config {
    loopback_shm_zenoh_config(listen, connect, Some(PREFIX))
}

/// `loan` filled with the pattern of `seq`.
fn filled(mut loan: GpuLoan, kernels: Option<&Kernels>, seq: u64) -> GpuLoan {
    let len = loan.len();
    match kernels {
        Some(k) => {
            let stream = loan.stream().unwrap().clone();
            // SAFETY: the loan owns ≥ len mapped bytes; `put` orders its signal after this.
            unsafe { k.fill(&stream, loan.device_ptr().unwrap(), len as u64, seq) }.unwrap();
        }
        None => fill_pattern(loan.as_mut_slice().unwrap(), 0, seq),
    }
    loan
}

/// Puts message `seq` (1-based) of `SIZES`, filled with the pattern of `seq`.
fn publish(p: &GpuPublisher, kernels: Option<&Kernels>, seq: u64) {
    let r = p.put(filled(p.loan(SIZES[seq as usize - 1]).unwrap(), kernels, seq)).unwrap();
    assert_eq!(r.seq, seq);
    assert!(r.plain, "message {seq}: no plain subscriber matched");
}

fn run(mode: MediumKind, test: &'static str) {
    let _w = watchdog_guard(test, Duration::from_secs(120));
    let (port, key) = (free_tcp_port(), format!("{PREFIX}/{}/{}", mode.name(), std::process::id()));
    let cfg = ZcsConfig { device: mode.device(), zenoh_shm_out_bytes: POOL, ..ZcsConfig::default() };
    let session = GpuSession::open(zenoh_config(Some(port), None), cfg).wait().unwrap();
    let kernels = session.gpu().map(|g| Kernels::load(g).unwrap());
    let p = session.declare_publisher(&key).wait().unwrap();
    let child = spawn_child("child_entry", "plain-sub", &[(ENV_PORT, port.to_string()), (ENV_KEY, key.clone())]);
    wait_until("the plain subscriber", Duration::from_secs(30), || p.plain_subscribers());
    for seq in 1..=SIZES.len() as u64 {
        publish(&p, kernels.as_ref(), seq);
    }
    wait_child(child, "the plain subscriber", Duration::from_secs(60));
    let s = p.stats();
    // Every message copied out once; all but the one larger than the pool into SHM.
    assert_eq!((s.copies_out, s.shm_out), (SIZES.len() as u64, SIZES.len() as u64 - 1), "{s:?}");
}

#[test]
fn zenoh_shm_out_host_blocks_reach_a_plain_subscriber_by_reference() {
    run(MediumKind::Host, "zenoh_shm_out_host_blocks_reach_a_plain_subscriber_by_reference");
}

#[test]
fn gpu_zenoh_shm_out_reaches_a_plain_subscriber_by_reference() {
    const TEST: &str = "gpu_zenoh_shm_out_reaches_a_plain_subscriber_by_reference";
    if gpu_or_skip(TEST).is_some() {
        run(MediumKind::Cuda, TEST);
    }
}

fn image(width: u32, height: u32) -> Image<()> {
    Image {
        header: Header { stamp: Time { sec: 1, nanosec: 2 }, frame_id: "camera".into() },
        height,
        width,
        encoding: "mono8".into(),
        is_bigendian: 0,
        step: width,
        data: (),
    }
}

/// A ROS 2 publisher's CDR copy for an ordinary ROS subscription (another process, raw
/// Zenoh, shared memory on) lands in the pool: received by reference, every byte checked.
fn run_ros2(mode: MediumKind, test: &'static str) {
    let _w = watchdog_guard(test, Duration::from_secs(120));
    let port = free_tcp_port();
    let cfg = ZcsConfig { device: mode.device(), zenoh_shm_out_bytes: POOL, ..ZcsConfig::default() };
    let session = GpuSession::open(zenoh_config(Some(port), None), cfg).wait().unwrap();
    let kernels = session.gpu().map(|g| Kernels::load(g).unwrap());
    let node = RosNode::new(&session, NodeOptions::new("shm_out_test").domain(ROS_DOMAIN)).unwrap();
    let topic = format!("/shm_out_{}_{}", mode.name(), std::process::id());
    // Keep-all: a reliable keep-last publisher drops under congestion, as rmw_zenoh's
    // does, and three images put back to back (the last of 21 MB, through the socket)
    // can meet a full queue on a busy machine. This test is about where they land.
    let publisher = node.publisher::<Image<()>>(&topic, Qos::reliable(10).keep_all()).unwrap();
    let env = [(ENV_PORT, port.to_string()), (ENV_KEY, publisher.key().to_owned()), (ENV_TOPIC, topic.clone())];
    let child = spawn_child("child_entry", "ros-sub", &env);
    wait_until("the ordinary ROS subscription", Duration::from_secs(30), || publisher.ordinary_subscriptions() == 1);
    for (i, &(w, h)) in ROS_IMAGES.iter().enumerate() {
        let seq = i as u64 + 1;
        let loan = filled(publisher.loan((w * h) as usize).unwrap(), kernels.as_ref(), seq);
        assert!(publisher.publish(&image(w, h), loan).unwrap().base, "message {seq} not put on the base key");
    }
    wait_child(child, "the ROS subscriber", Duration::from_secs(60));
    let s = publisher.stats();
    // All but the image larger than the pool written into SHM.
    assert_eq!((s.base_puts, s.base_shm), (3, 2), "{s:?}");
}

#[test]
fn zenoh_shm_out_ros2_cdr_reaches_an_ordinary_subscription_by_reference() {
    run_ros2(MediumKind::Host, "zenoh_shm_out_ros2_cdr_reaches_an_ordinary_subscription_by_reference");
}

#[test]
fn gpu_zenoh_shm_out_ros2_cdr_reaches_an_ordinary_subscription_by_reference() {
    const TEST: &str = "gpu_zenoh_shm_out_ros2_cdr_reaches_an_ordinary_subscription_by_reference";
    if gpu_or_skip(TEST).is_some() {
        run_ros2(MediumKind::Cuda, TEST);
    }
}

#[test]
fn a_pool_that_cannot_be_made_fails_the_open_with_its_reason() {
    let cfg = ZcsConfig { device: MediumKind::Host.device(), zenoh_shm_out_bytes: u64::MAX, ..ZcsConfig::default() };
    let err = GpuSession::open(zenoh_config(None, None), cfg).wait().expect_err("an impossible pool");
    let source = std::error::Error::source(&err).and_then(|e| e.downcast_ref::<ShmOutError>());
    assert!(matches!(source, Some(ShmOutError::Segment { .. })), "{err:?}");
}

/// Entry point of the child process; ignored in normal runs.
#[test]
#[ignore = "entry point of the child process started by the tests above"]
fn child_entry() {
    let Some(role) = child_role() else { return };
    let _w = watchdog_guard("shm-out child", Duration::from_secs(90));
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let port: u16 = env(ENV_PORT).parse().unwrap();
    let z = zenoh::open(zenoh_config(None, Some(port))).wait().unwrap();
    let sub = z.declare_subscriber(env(ENV_KEY)).wait().unwrap();
    if role == "ros-sub" {
        // An ordinary subscription of the topic, as rmw_zenoh's graph token announces it.
        let (dds, hash) = (<Image<()> as RosDataMessage>::DDS_TYPE_NAME, <Image<()> as RosDataMessage>::type_hash());
        let topic = env(ENV_TOPIC).replace('/', "%");
        let token = format!("@ros2_lv/{ROS_DOMAIN}/{}/0/9/MS/%/%/listener/{topic}/{dds}/{hash}/2::,10:,:,:,,", z.zid());
        let _token = z.liveliness().declare_token(token).wait().unwrap();
        for (i, &(w, h)) in ROS_IMAGES.iter().enumerate() {
            let seq = i as u64 + 1;
            let s = sub.recv_timeout(Duration::from_secs(30)).unwrap().unwrap_or_else(|| panic!("message {seq}"));
            let by_reference = s.payload().as_shm().is_some();
            let bytes = s.payload().to_bytes();
            assert_eq!(
                by_reference,
                bytes.len() as u64 <= POOL,
                "message {seq} ({} bytes): SHM {by_reference}",
                bytes.len()
            );
            let (msg, range) = <Image<()> as RosDataMessage>::decode_cdr(&bytes).unwrap();
            assert_eq!(msg, image(w, h), "message {seq}");
            assert_eq!(check_pattern(&bytes[range], 0, seq), None, "message {seq}: wrong pixels");
        }
        println!("ros-sub: {} images, every byte checked, all but the largest by reference", ROS_IMAGES.len());
        return;
    }
    assert_eq!(role, "plain-sub");
    for (i, &len) in SIZES.iter().enumerate() {
        let seq = i as u64 + 1;
        let s = sub.recv_timeout(Duration::from_secs(30)).unwrap().unwrap_or_else(|| panic!("message {seq}"));
        let payload = s.payload();
        let by_reference = payload.as_shm().is_some();
        assert_eq!(by_reference, len as u64 <= POOL, "message {seq} ({len} bytes): SHM {by_reference}");
        let bytes = payload.to_bytes();
        assert_eq!(bytes.len(), len, "message {seq}");
        assert_eq!(check_pattern(&bytes, 0, seq), None, "message {seq}: wrong bytes");
    }
    println!("plain-sub: {} messages, every byte checked, all but the largest by reference", SIZES.len());
}
