//! Our publisher's device blocks lent to subscriptions of ROS 2's CUDA buffer backend,
//! read in place by them after our writer's IPC event, and back in our pool once they
//! are done; and what happens when either side dies.
//!
//! Their subscription is `zcs_tests::rosidl::TheirSubscription`, an rmw_zenoh 0.12.0
//! subscription accepting `cuda`, written from its sources (its C++ library does not
//! run here). It imports a descriptor as `cuda_buffer` 0.1.2's importer does, with our
//! importer (`BackendImports`, the same steps in the same order: count, compare the
//! reuse id, FD from the socket, import and map, event per message), and checks every
//! byte on the GPU after waiting on the event.
//!
//! Without a GPU: `SKIPPED gpu_rosidl_cuda_export_...`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zcs_memory::cuda::{DeviceBlock, Gpu, Kernels};
use zcs_tests::rosidl::{Registered, TheirSubscription, cuda_session, rgba_frame};
use zcs_tests::{child_role, gpu_or_skip, spawn_child, wait_child, wait_until, watchdog_guard};
use zenoh::Wait;
use zenoh_cuda_shm::tensor_codec::cdr::{BufferData, Image};
use zenoh_cuda_shm_ros2::cuda_backend::{BackendBuffer, BackendImports};
use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RmwWire, RosNode, RosPublisher};

const TO_THEM: &str = "gpu_rosidl_cuda_export_our_publisher_to_their_subscriptions";
const THEY_DIE: &str = "gpu_rosidl_cuda_export_their_subscriber_killed_holding_our_blocks";
const WE_DIE: &str = "gpu_rosidl_cuda_export_our_publisher_killed_under_their_reader";
const DIR_ENV: &str = "ZCS_ROSIDL_EXPORT_DIR";
const PORT_ENV: &str = "ZCS_ROSIDL_EXPORT_PORT";
const DOMAIN_ENV: &str = "ZCS_ROSIDL_EXPORT_DOMAIN";
/// `cuda`, `other-device` or `hold`: what their subscription child does.
const MODE_ENV: &str = "ZCS_ROSIDL_EXPORT_MODE";
/// How many messages it expects.
const COUNT_ENV: &str = "ZCS_ROSIDL_EXPORT_COUNT";
const TOPIC: &str = "/camera/image";
/// 1080p and 4K rgba8.
const FRAMES: [(u32, u32); 2] = [(1920, 1080), (3840, 2160)];

fn seed_of(i: usize) -> u64 {
    2000 + i as u64
}

fn our_publisher(session: &zenoh_cuda_shm::GpuSession, domain: u32) -> RosPublisher<Image<()>> {
    let node =
        RosNode::new(session, NodeOptions::new("our_pub").domain(domain).rmw_wire(RmwWire::BufferAware)).unwrap();
    let publisher = node.publisher::<Image<()>>(TOPIC, Qos::reliable(10)).unwrap();
    assert!(publisher.lends_cuda_buffers());
    assert!(publisher.token().ends_with("/backends:cpu:;cuda:"), "{}", publisher.token());
    assert_eq!(publisher.registry_error(), None);
    publisher
}

/// Publishes frame `i` of [`FRAMES`], written on the loan's stream by a kernel that
/// first spins for `spin`: a reader not ordered after our event sees it unwritten.
fn publish_frame(p: &RosPublisher<Image<()>>, kernels: &Kernels, i: usize, spin: Duration) {
    let (w, h) = FRAMES[i % FRAMES.len()];
    let len = (w * h * 4) as usize;
    let loan = p.loan(len).unwrap();
    let stream = loan.stream().unwrap();
    kernels.spin(stream, spin.as_nanos() as u64).unwrap();
    // SAFETY: the loan's `len` bytes are mapped until its stream has passed the kernel
    // (a loan returns its block only after its stream's work).
    unsafe { kernels.fill(stream, loan.device_ptr().unwrap(), len as u64, seed_of(i)) }.unwrap();
    p.publish(&rgba_frame(w, h), loan).unwrap();
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zcs-rosidl-export-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spawn_theirs(dir: &Path, port: u16, domain: u32, mode: &str, count: usize) -> std::process::Child {
    let env = [
        (DIR_ENV, dir.display().to_string()),
        (PORT_ENV, port.to_string()),
        (DOMAIN_ENV, domain.to_string()),
        (MODE_ENV, mode.to_owned()),
        (COUNT_ENV, count.to_string()),
    ];
    spawn_child("their_subscription_entry", "rosidl-export-their-sub", &env)
}

fn wait_file(path: &Path, limit: Duration) {
    wait_until(&format!("{}", path.display()), limit, || path.exists());
}

/// Our publisher on a GPU session → two subscriptions of the backend: one registered
/// on our GPU gets a descriptor per frame and reads our block in place (every byte
/// checked on its GPU after our event; a read not ordered after it sees the block
/// unwritten: the negative control), with no device→host copy on our side; one
/// registered on another device gets CDR on its own key, with the reason counted. Each
/// gets each frame exactly once, and every lent block is back in our pool afterwards.
#[test]
fn gpu_rosidl_cuda_export_our_publisher_to_their_subscriptions() {
    let Some(gpu) = gpu_or_skip(TO_THEM) else { return };
    let _watchdog = watchdog_guard(TO_THEM, Duration::from_secs(240));
    let port = zcs_tests::free_tcp_port();
    let domain = 160 + std::process::id() % 100;
    let session = cuda_session(Some(port), None);
    let publisher = our_publisher(&session, domain);
    let kernels = Kernels::load(&gpu).unwrap();
    let dir = temp_dir("to-them");

    // Only a CUDA subscription on our GPU: descriptors, and nothing copied to host.
    let cuda = spawn_theirs(&dir, port, domain, "cuda", 2 * FRAMES.len());
    wait_until("their subscription in our graph", Duration::from_secs(30), || publisher.ordinary_subscriptions() == 1);
    // One at a time: their subscriber takes a message when it is done with the last one
    // (the first waits out our slow writer), and a take more than the 100 ms grace
    // window after the publish is refused, by their protocol.
    for i in 0..FRAMES.len() {
        publish_frame(&publisher, &kernels, i, Duration::from_millis(if i == 0 { 500 } else { 0 }));
        wait_file(&dir.join(format!("read-{}", i + 1)), Duration::from_secs(60));
    }
    let s = publisher.stats();
    assert_eq!((s.descriptors, s.device_to_host, s.base_puts, s.buf_puts), (2, 0, 0, 0), "{s:?}");
    assert!(publisher.cuda_fallbacks().is_empty(), "{:?}", publisher.cuda_fallbacks());

    // A second subscription, on another device: CDR on its own key, reason counted; the
    // first still gets descriptors and neither gets anything twice.
    let other = spawn_theirs(&dir, port, domain, "other-device", FRAMES.len());
    wait_until("both in our graph", Duration::from_secs(30), || publisher.ordinary_subscriptions() == 2);
    for i in 0..FRAMES.len() {
        publish_frame(&publisher, &kernels, i, Duration::ZERO);
    }
    wait_child(cuda, "their CUDA subscription", Duration::from_secs(60));
    wait_child(other, "their other-device subscription", Duration::from_secs(60));
    let s = publisher.stats();
    assert_eq!((s.descriptors, s.buf_puts, s.device_to_host, s.base_puts), (4, 2, 2, 0), "{s:?}");
    assert_eq!(publisher.cuda_fallbacks(), vec![("other-device", 2)]);
    wait_until("every lent block back in our pool", Duration::from_secs(10), || publisher.stats().lent_blocks == 0);
    assert_eq!(publisher.stats().lent_reclaimed, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Their subscriber killed (SIGKILL) while it holds two of our blocks: while it lives
/// they stay lent past the grace window (the negative control); once it is dead our
/// publisher clears the counts it left, takes the blocks back, and goes on publishing.
#[test]
fn gpu_rosidl_cuda_export_their_subscriber_killed_holding_our_blocks() {
    let Some(gpu) = gpu_or_skip(THEY_DIE) else { return };
    let _watchdog = watchdog_guard(THEY_DIE, Duration::from_secs(180));
    let port = zcs_tests::free_tcp_port();
    let domain = 160 + (std::process::id() + 1) % 100;
    let session = cuda_session(Some(port), None);
    let publisher = our_publisher(&session, domain);
    let kernels = Kernels::load(&gpu).unwrap();
    let dir = temp_dir("they-die");
    let mut theirs = spawn_theirs(&dir, port, domain, "hold", FRAMES.len());
    wait_until("their subscription in our graph", Duration::from_secs(30), || publisher.ordinary_subscriptions() == 1);
    for i in 0..FRAMES.len() {
        publish_frame(&publisher, &kernels, i, Duration::ZERO);
    }
    wait_file(&dir.join("holding"), Duration::from_secs(60));
    std::thread::sleep(zenoh_cuda_shm_ros2::cuda_backend::GRACE * 3);
    assert_eq!(publisher.stats().lent_blocks, 2, "held by a living subscriber: still lent");
    theirs.kill().unwrap();
    theirs.wait().unwrap();
    wait_until("the dead subscriber's blocks taken back", Duration::from_secs(10), || {
        let s = publisher.stats();
        s.lent_blocks == 0 && s.lent_reclaimed == 2
    });
    publish_frame(&publisher, &kernels, 0, Duration::ZERO);
    assert_eq!(publisher.stats().published, 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Our publisher killed (SIGKILL) while their subscriber holds two of its blocks: the
/// frames stay readable, every byte as published (their mapping holds the memory), and
/// letting go of them afterwards is quiet.
#[test]
fn gpu_rosidl_cuda_export_our_publisher_killed_under_their_reader() {
    let Some(gpu) = gpu_or_skip(WE_DIE) else { return };
    let _watchdog = watchdog_guard(WE_DIE, Duration::from_secs(180));
    let port = zcs_tests::free_tcp_port();
    let domain = 160 + (std::process::id() + 2) % 100;
    let z = zenoh::open(zcs_tests::loopback_zenoh_config(Some(port), None, None)).wait().unwrap();
    let theirs = TheirSubscription::declare(&z, domain, TOPIC, &gpu, Registered::SameDevice);
    let dir = temp_dir("we-die");
    let env = [(DIR_ENV, dir.display().to_string()), (PORT_ENV, port.to_string()), (DOMAIN_ENV, domain.to_string())];
    let mut ours = spawn_child("our_publisher_entry", "rosidl-export-our-pub", &env);
    let imports = BackendImports::new(&gpu).unwrap();
    let reader = Reader::new(&gpu);
    let mut held = Vec::new();
    for i in 0..FRAMES.len() {
        let (on_buf, bytes) = theirs.rx.recv_timeout(Duration::from_secs(60)).expect("a frame of ours");
        assert!(on_buf, "on _buf/<GID>");
        held.push(take(&imports, &bytes, i));
    }
    ours.kill().unwrap();
    ours.wait().unwrap();
    for (i, buffer) in held.iter().enumerate() {
        assert_eq!(reader.mismatches(buffer, seed_of(i)), 0, "frame {i} after our publisher died");
    }
    drop(held);
    assert_eq!(imports.evict_dead(), 2, "the dead publisher's blocks are forgotten");
    // What the killed publisher left: its blocks' shared files.
    let prefix = format!("cuda_vmm_{}_", ours.id());
    for e in std::fs::read_dir("/dev/shm").unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Checks buffers on the GPU.
struct Reader {
    kernels: Kernels,
    stream: zcs_memory::cuda::Stream,
    counter: DeviceBlock,
}

impl Reader {
    fn new(gpu: &Gpu) -> Self {
        Self {
            kernels: Kernels::load(gpu).unwrap(),
            stream: gpu.new_stream().unwrap(),
            counter: DeviceBlock::allocate(gpu, 4).unwrap(),
        }
    }

    /// Bytes of `b` that differ from pattern `seed`, read after the writer's event.
    fn mismatches(&self, b: &BackendBuffer, seed: u64) -> u32 {
        let read = b.read(&self.stream).unwrap();
        // SAFETY: the buffer's bytes are mapped while `b` lives, past this call.
        let n = unsafe {
            self.kernels.count_mismatches(&self.stream, read.device_ptr(), b.len() as u64, seed, &self.counter)
        }
        .unwrap();
        read.end().unwrap();
        n
    }

    /// The same, on a stream that does not wait for the writer.
    fn unordered_mismatches(&self, b: &BackendBuffer, seed: u64, gpu: &Gpu) -> u32 {
        let unordered = gpu.new_stream().unwrap();
        let read = b.read(&self.stream).unwrap();
        // SAFETY: as above.
        let n = unsafe {
            self.kernels.count_mismatches(&unordered, read.device_ptr(), b.len() as u64, seed, &self.counter)
        }
        .unwrap();
        read.end().unwrap();
        n
    }
}

/// Their take of message `i`: a descriptor, imported.
fn take(imports: &BackendImports, bytes: &[u8], i: usize) -> BackendBuffer {
    let (w, h) = FRAMES[i % FRAMES.len()];
    let msg = Image::decode_cdr_buffer(bytes).expect("an Image");
    assert_eq!((msg.width, msg.height, msg.header.frame_id.as_str()), (w, h, "camera"));
    let BufferData::Cuda(d) = msg.data else { panic!("CDR bytes, not a descriptor") };
    assert_eq!(d.size, u64::from(w * h * 4));
    imports.import(&d).expect("our descriptor imports")
}

/// Their subscription, as a child: `cuda` checks every frame in place and lets go of
/// it; `other-device` checks CDR frames; `hold` keeps its frames until killed.
#[test]
#[ignore = "entry point of the child process started by the tests above"]
fn their_subscription_entry() {
    if child_role().as_deref() != Some("rosidl-export-their-sub") {
        return;
    }
    let _watchdog = watchdog_guard("their rosidl subscription", Duration::from_secs(200));
    let env = |k: &str| std::env::var(k).unwrap();
    let dir = PathBuf::from(env(DIR_ENV));
    let (mode, count): (String, usize) = (env(MODE_ENV), env(COUNT_ENV).parse().unwrap());
    let gpu = Gpu::probe().unwrap();
    let z =
        zenoh::open(zcs_tests::loopback_zenoh_config(None, Some(env(PORT_ENV).parse().unwrap()), None)).wait().unwrap();
    let registered = if mode == "other-device" { Registered::OtherDevice } else { Registered::SameDevice };
    let theirs = TheirSubscription::declare(&z, env(DOMAIN_ENV).parse().unwrap(), TOPIC, &gpu, registered);
    let imports = BackendImports::new(&gpu).unwrap();
    let reader = Reader::new(&gpu);
    let mut held = Vec::new();
    for i in 0..count {
        let (on_buf, bytes) = theirs.rx.recv_timeout(Duration::from_secs(90)).expect("a frame");
        assert!(on_buf, "frame {i} on _buf/<GID>, not on the data key");
        let seed = seed_of(i % FRAMES.len());
        if mode == "other-device" {
            let (w, h) = FRAMES[i % FRAMES.len()];
            let msg = Image::decode_cdr_buffer(&bytes).unwrap();
            let BufferData::Bytes(data) = msg.data else { panic!("a descriptor for another device") };
            assert_eq!(data.len(), (w * h * 4) as usize);
            assert_eq!(zcs_memory::cuda::kernels::check_pattern(data, 0, seed), None, "frame {i}");
        } else {
            let buffer = take(&imports, &bytes, i);
            if i == 0 && mode == "cuda" {
                let t = Instant::now();
                let early = reader.unordered_mismatches(&buffer, seed, &gpu);
                assert!(early > 0, "a read not ordered after the writer saw its data: no negative control");
                assert!(t.elapsed() < Duration::from_millis(400), "the unordered read waited for the writer");
            }
            assert_eq!(reader.mismatches(&buffer, seed), 0, "every byte of frame {i}, after the writer's event");
            if mode == "hold" {
                held.push(buffer);
            }
        }
        std::fs::write(dir.join(format!("read-{}", i + 1)), b"").unwrap();
    }
    if mode == "hold" {
        std::fs::write(dir.join("holding"), b"").unwrap();
        std::thread::sleep(Duration::from_secs(180)); // killed long before
    }
    // Nothing more: no frame twice, none on the data key.
    std::thread::sleep(Duration::from_millis(300));
    assert!(theirs.rx.try_recv().is_err(), "a frame arrived twice");
    drop(held);
}

/// Our publisher, as a child: publishes the frames to their subscription, then waits
/// to be killed.
#[test]
#[ignore = "entry point of the child process started by the tests above"]
fn our_publisher_entry() {
    if child_role().as_deref() != Some("rosidl-export-our-pub") {
        return;
    }
    let _watchdog = watchdog_guard("our rosidl publisher", Duration::from_secs(170));
    let env = |k: &str| std::env::var(k).unwrap();
    let session = cuda_session(None, Some(env(PORT_ENV).parse().unwrap()));
    let publisher = our_publisher(&session, env(DOMAIN_ENV).parse().unwrap());
    let gpu = session.gpu().unwrap().clone();
    let kernels = Kernels::load(&gpu).unwrap();
    wait_until("their subscription in our graph", Duration::from_secs(30), || publisher.ordinary_subscriptions() == 1);
    for i in 0..FRAMES.len() {
        publish_frame(&publisher, &kernels, i, Duration::ZERO);
    }
    std::thread::sleep(Duration::from_secs(160)); // killed long before
}
