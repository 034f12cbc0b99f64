//! The C ABI's ROS 2 functions from C and C++, built with CMake under AddressSanitizer
//! and UBSan against the library this build made (as `c_abi.rs` builds the examples):
//!
//! - `tests/c/ros_hostile.c`: null, stale and made-up handles, double drops, use after
//!   drop, bad names and QoS values, image fields and tensor descriptions that do not
//!   fit, one message type's handle used for the other, each answered with its
//!   documented code and losing nothing; one image and one tensor through a publisher
//!   and a subscription of that process;
//! - `tests/c/ros_peer.cpp` (`zcs::ros`) publishes Images and ExperimentalTensors, from
//!   loans and from host bytes, to `RosSubscriber`s of this process, which check every
//!   field, sequence number and byte;
//! - this process's `RosPublisher`s, and an ordinary ROS publisher played by a raw
//!   Zenoh put, publish to the C++ program's subscriptions, which check the same.
//!
//! Host memory, loopback TCP. Message `k` (its ROS sequence number) is
//! [`image_fields`] / [`tensor_fields`] with the test pattern seeded with `k` as data,
//! on both sides. Needs `cmake`, as `c_abi.rs` does.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{build_c, c_program, host_session, zenoh_json};
use zcs_memory::cuda::kernels::fill_pattern;
use zcs_tests::{free_tcp_port, watchdog_guard};
use zenoh::Wait;
use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Header, Image, Time};
use zenoh_cuda_shm::{GpuSession, Path};
use zenoh_cuda_shm_ros2::attachment::now_ns;
use zenoh_cuda_shm_ros2::{Attachment, EntityKind, NodeOptions, Qos, RosDataMessage, RosNode, RosSubscriber};

/// Messages of each type each way.
const COUNT: i64 = 8;
/// Images of the ordinary publisher (Rust → C++).
const PLAIN: i64 = 3;
const IO: Duration = Duration::from_secs(20);

/// Image `k`'s fields: every fourth a VGA frame (a block), the others small (inline),
/// with a padding byte per row when `k` is odd.
fn image_fields(k: i64) -> Image<()> {
    let big = k % 4 == 0;
    let width = if big { 640 } else { 3 + k as u32 };
    Image {
        header: Header {
            stamp: Time { sec: 1000 + k as i32, nanosec: k as u32 * 1000 + 7 },
            frame_id: format!("camera_{k}"),
        },
        height: if big { 480 } else { 2 + (k % 3) as u32 },
        width,
        encoding: if k % 2 == 1 { "rgb8" } else { "bgr8" }.into(),
        is_bigendian: (k % 2) as u8,
        step: width * 3 + (k % 2) as u32,
        data: (),
    }
}

/// Tensor `k`'s fields and data length: float32 `[256, 256]` every fourth, float32
/// `[k, 3]` for odd `k`, else uint16 `[2, k]` in column-major order 8 bytes in.
fn tensor_fields(k: i64) -> (ExperimentalTensor<()>, usize) {
    let t = |code, bits, shape: Vec<i64>, strides, byte_offset| ExperimentalTensor {
        dtype_code: code,
        dtype_bits: bits,
        dtype_lanes: 1,
        shape,
        strides,
        byte_offset,
        data: (),
    };
    match k {
        k if k % 4 == 0 => (t(2, 32, vec![256, 256], vec![], 0), 256 * 256 * 4),
        k if k % 2 == 1 => (t(2, 32, vec![k, 3], vec![], 0), 12 * k as usize),
        k => (t(1, 16, vec![2, k], vec![1, 2], 8), 8 + 4 * k as usize),
    }
}

fn image_len(k: i64) -> usize {
    let f = image_fields(k);
    f.step as usize * f.height as usize
}

fn pattern(len: usize, k: i64) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_pattern(&mut v, 0, k as u64);
    v
}

/// The C++ peer, killed if the test ends before it does.
struct Peer(Option<Child>);

impl Peer {
    fn start(cmd: &mut Command) -> Self {
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start zcs_cpp_ros_peer");
        Self(Some(child))
    }

    /// Closes its standard input and waits for it: its exit status and output.
    fn finish(&mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.0.take().expect("running");
        drop(child.stdin.take());
        let t = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait for the peer") {
                break s;
            }
            if t.elapsed() > IO * 2 {
                let _ = child.kill();
                break child.wait().expect("wait for the killed peer");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut text = String::new();
        let _ = child.stdout.take().expect("stdout").read_to_string(&mut text);
        let _ = child.stderr.take().expect("stderr").read_to_string(&mut text);
        (status, text)
    }

    /// Whether it exited already (then with its output, for the failure message).
    fn exited(&mut self) -> Option<String> {
        let done = self.0.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        done.then(|| {
            let (status, text) = self.finish();
            format!("{status}:\n{text}")
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Receives `COUNT` messages from `sub`, each once; by sequence number.
fn receive<M: RosDataMessage>(
    sub: &RosSubscriber<M>,
    peer: &mut Peer,
    what: &str,
) -> BTreeMap<i64, zenoh_cuda_shm_ros2::RosSample<M>> {
    let mut got = BTreeMap::new();
    while got.len() < COUNT as usize {
        let s = match sub.recv_timeout(IO) {
            Ok(s) => s,
            Err(e) => panic!("{what} {} from C++: {e}; the peer: {:?}", got.len() + 1, peer.exited()),
        };
        let seq = s.attachment().seq;
        assert!(got.insert(seq, s).is_none(), "{what} {seq} delivered twice");
    }
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), (1..=COUNT).collect::<Vec<_>>(), "{what}s' numbers");
    got
}

/// C++ publishes through the ABI; this process's `RosSubscriber`s check everything.
fn cpp_to_rust(build: &std::path::Path) {
    const DOMAIN: u32 = 61;
    let port = free_tcp_port();
    let session = host_session(Some(port), None);
    let node = RosNode::new(&session, NodeOptions::new("rust_sub").domain(DOMAIN)).expect("node");
    let qos = Qos::reliable(10).keep_all();
    let images = node.subscriber::<Image<()>>("/zcs_test/c_abi/image", qos).expect("image subscription");
    let tensors =
        node.subscriber::<ExperimentalTensor<()>>("/zcs_test/c_abi/tensor", qos).expect("tensor subscription");
    let mut peer = Peer::start(c_program(build, "zcs_cpp_ros_peer").args([
        "pub",
        &zenoh_json(None, Some(port)),
        &DOMAIN.to_string(),
        &COUNT.to_string(),
    ]));

    for (k, s) in receive(&images, &mut peer, "image") {
        assert_eq!(s.msg(), &image_fields(k), "image {k}'s fields");
        assert_eq!(s.data_to_vec().expect("image data"), pattern(image_len(k), k), "image {k}'s data");
        assert!(s.gpu_sample().is_some() && s.path() != Path::Plain, "image {k} came by {}", s.path());
        assert!(s.attachment().timestamp_ns > 0);
    }
    for (k, s) in receive(&tensors, &mut peer, "tensor") {
        let (fields, len) = tensor_fields(k);
        assert_eq!(s.msg(), &fields, "tensor {k}'s fields");
        assert_eq!(s.data_to_vec().expect("tensor data"), pattern(len, k), "tensor {k}'s data");
        assert!(s.gpu_sample().is_some(), "tensor {k} came by {}", s.path());
    }
    let (status, text) = peer.finish();
    assert!(status.success(), "the C++ publisher ({status}):\n{text}");
    assert!(text.contains(&format!("[ros pub] {COUNT} images, {COUNT} tensors")), "{text}");
    println!("c++ → rust: {COUNT} images and {COUNT} tensors, every field and byte checked");
}

/// Waits until `f` holds, or fails with the peer's output if it exited.
fn wait_for(what: &str, peer: &mut Peer, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        if let Some(out) = peer.exited() {
            panic!("waiting for {what}, the peer exited {out}");
        }
        assert!(t.elapsed() < IO, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's `RosPublisher`s and an ordinary ROS publisher publish; the C++
/// subscriptions check everything.
fn rust_to_cpp(build: &std::path::Path) {
    const DOMAIN: u32 = 62;
    let port = free_tcp_port();
    let session: GpuSession = host_session(Some(port), None);
    let node = RosNode::new(&session, NodeOptions::new("rust_pub").domain(DOMAIN)).expect("node");
    let qos = Qos::reliable(10).keep_all();
    let images = node.publisher::<Image<()>>("/r2c/image", qos).expect("image publisher");
    let tensors = node.publisher::<ExperimentalTensor<()>>("/r2c/tensor", qos).expect("tensor publisher");
    let mut peer = Peer::start(c_program(build, "zcs_cpp_ros_peer").args([
        "sub",
        &zenoh_json(None, Some(port)),
        &DOMAIN.to_string(),
        &COUNT.to_string(),
        &PLAIN.to_string(),
    ]));
    wait_for("the C++ subscriptions on our channel", &mut peer, || {
        images.channel().aware_subscribers() == 1 && tensors.channel().aware_subscribers() == 1
    });
    // Its subscription token is declared after its base-key subscriber: once seen, an
    // ordinary publisher's put reaches it.
    wait_for("the C++ image subscription in the graph", &mut peer, || {
        node.graph()
            .entities
            .iter()
            .any(|e| e.kind == EntityKind::Subscription && e.topic.as_ref().is_some_and(|t| t.key == images.key()))
    });

    for k in 1..=COUNT {
        let (fields, len) = (image_fields(k), image_len(k));
        let report = match k % 2 {
            1 => {
                let mut loan = images.loan(len).expect("loan");
                fill_pattern(loan.as_mut_slice().expect("a host loan"), 0, k as u64);
                images.publish(&fields, loan)
            }
            _ => images.publish_host(&fields, &pattern(len, k)),
        };
        assert_eq!(report.expect("publish an image").seq, k);
        let (fields, len) = tensor_fields(k);
        let report = match k % 2 {
            1 => {
                let mut loan = tensors.loan(len).expect("loan");
                fill_pattern(loan.as_mut_slice().expect("a host loan"), 0, k as u64);
                tensors.publish(&fields, loan)
            }
            _ => tensors.publish_host(&fields, &pattern(len, k)),
        };
        assert_eq!(report.expect("publish a tensor").seq, k);
    }
    // An ordinary ROS publisher: the CDR message with its attachment on the topic's key.
    for k in 1..=PLAIN {
        let cdr = image_fields(k).with_data(pattern(image_len(k), k)).encode_cdr().expect("CDR");
        let att = Attachment { seq: k, timestamp_ns: now_ns(), gid: [0x0d; 16] };
        session.zenoh().put(images.key(), cdr).attachment(att.encode().to_vec()).wait().expect("put");
    }

    let (status, text) = peer.finish();
    assert!(status.success(), "the C++ subscriber ({status}):\n{text}");
    let summary = format!("[ros sub] images {} (plain {PLAIN}), tensors {COUNT}, bad 0", COUNT + PLAIN);
    assert!(text.contains(&summary), "{text}");
    println!("rust → c++: {summary}");
}

#[test]
fn ros_through_the_c_abi() {
    let Some(build) = build_c("ros_abi", "ros-abi-test") else { return };
    let _w = watchdog_guard("ros_through_the_c_abi", Duration::from_secs(300));

    let out = c_program(&build, "zcs_c_ros_hostile").arg(zenoh_json(Some(free_tcp_port()), None)).output();
    let out = out.expect("run zcs_c_ros_hostile");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "hostile use of the ROS functions:\n{text}");
    assert!(text.contains("ros hostile: every call answered as documented"), "{text}");

    cpp_to_rust(&build);
    rust_to_cpp(&build);
}
