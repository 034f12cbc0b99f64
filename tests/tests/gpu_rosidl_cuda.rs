//! Blocks of ROS 2's CUDA buffer backend imported into our process, read in place on our
//! stream after the writer's IPC event, and given back to the writer's pool.
//!
//! The writer is this test binary re-run as a child, doing on the host what
//! `cuda_buffer` 0.1.2's publisher does (docs/cuda-buffer-backend.md, written from its
//! sources; its C++ library does not run here): a VMM block exported as a POSIX FD and
//! served on `/tmp/cuda_vmm_<pid>_<block>.sock`, its 24 shared bytes at
//! `/dev/shm/cuda_vmm_<pid>_<block>`, an interprocess event recorded after the write,
//! and the descriptor in an `Image` message's data field. It spins for 2 s before it
//! writes, so a read not ordered after its event sees the block unwritten (the negative
//! control) and ours, ordered, sees every byte of the pattern.
//!
//! Without a GPU: `SKIPPED gpu_rosidl_cuda_...`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::check_pattern;
use zcs_memory::cuda::{Gpu, IpcEvent, Kernels, copy};
use zcs_tests::rosidl::{ServedBlock, cuda_session, rgba_frame};
use zcs_tests::{child_role, gpu_or_skip, spawn_child, wait_child, wait_until, watchdog_guard};
use zcs_wire::rosidl_cuda::BlockMeta;
use zenoh_cuda_shm::tensor_codec::cdr::{BufferData, CudaBufferDescriptor, Image};
use zenoh_cuda_shm_ros2::cuda_backend::{BackendImportError, BackendImports};

const NAME: &str = "gpu_rosidl_cuda_block_is_read_in_place_after_its_writer_and_given_back";
const DIR_ENV: &str = "ZCS_ROSIDL_CUDA_DIR";
const LEN: usize = 6 << 20;
const SEED: u64 = 77;
const BLOCK_ID: u32 = 3;

fn frame() -> Image<()> {
    rgba_frame(1536, 1024)
}

/// Writes its file when dropped.
struct Done(PathBuf);

impl Drop for Done {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"");
    }
}

fn wait_file(path: &Path, limit: Duration) -> Vec<u8> {
    wait_until(&format!("{}", path.display()), limit, || path.exists());
    std::fs::read(path).unwrap()
}

#[test]
fn gpu_rosidl_cuda_block_is_read_in_place_after_its_writer_and_given_back() {
    let Some(gpu) = gpu_or_skip(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(120));
    let dir = std::env::temp_dir().join(format!("zcs-rosidl-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = spawn_child("writer_entry", "rosidl-cuda-writer", &[(DIR_ENV, dir.display().to_string())]);
    // The writer waits for this file; written also when an assertion below fails, so
    // that it does not linger.
    let _release_writer = Done(dir.join("done"));

    let message = wait_file(&dir.join("descriptor"), Duration::from_secs(60));
    let Image { data: BufferData::Cuda(d), .. } = Image::decode_cdr_buffer(&message).expect("the writer's message")
    else {
        panic!("the writer sent bytes, not a descriptor");
    };
    assert_eq!(d.size, LEN as u64);
    assert!(d.has_event());
    let meta = Arc::new(BlockMeta::open(d.vmm_pid, d.vmm_block_id).unwrap());

    let imports = BackendImports::new(&gpu).unwrap();
    // Refused before anything is counted or mapped: another device, a reused block.
    let mut other = d.clone();
    other.device_id = gpu.ordinal() as i32 + 1;
    assert!(matches!(imports.import(&other), Err(BackendImportError::OtherDevice { .. })));
    let mut stale = d.clone();
    stale.ipc_uid ^= 1;
    assert!(matches!(imports.import(&stale), Err(BackendImportError::Meta(_))));
    assert_eq!((meta.count(), imports.cached()), (0, 0));

    let t = Instant::now();
    let buffer = imports.import(&d).unwrap();
    let imported = t.elapsed();
    assert_eq!((meta.count(), imports.cached(), buffer.len()), (1, 1, LEN));

    // Negative control: a copy not ordered after the writer's event runs at once, while
    // the writer still spins, and does not see the pattern.
    let early_stream = gpu.new_stream().unwrap();
    let mut early = vec![0u8; LEN];
    let t = Instant::now();
    {
        let read = buffer.read(&early_stream).unwrap();
        let unordered = gpu.new_stream().unwrap();
        // SAFETY: the buffer's LEN bytes are mapped while `buffer` lives; `early` has LEN bytes.
        unsafe { copy::device_to_host(&unordered, read.device_ptr(), &mut early) }.unwrap();
        read.end().unwrap();
    }
    let unordered_copy = t.elapsed();
    assert!(check_pattern(&early, 0, SEED).is_some(), "an unordered read saw the writer's data: no negative control");

    // Ours: ordered on the GPU, no host wait.
    let stream = gpu.new_stream().unwrap();
    let t = Instant::now();
    let mut out = vec![0u8; LEN];
    let read = buffer.read(&stream).unwrap();
    // The read is ordered on the stream, not waited for: the writer still spins.
    let enqueued = t.elapsed();
    // SAFETY: as above. (A copy into pageable memory: this call returns once the
    // stream has passed the writer's event and the copy is done.)
    unsafe { copy::device_to_host(&stream, read.device_ptr(), &mut out) }.unwrap();
    read.end().unwrap();
    let copied = t.elapsed();
    assert_eq!(check_pattern(&out, 0, SEED), None, "every byte after the writer's event");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{NAME}: import {:.1} ms, unordered copy {:.1} ms, ordered read begun in {:.2} ms, its copy done after {:.0} ms",
        ms(imported),
        ms(unordered_copy),
        ms(enqueued),
        ms(copied)
    );
    assert!(imported < Duration::from_millis(1500), "the import took {imported:?}: a host wait on the writer?");
    assert!(enqueued < Duration::from_millis(100), "beginning the read took {enqueued:?}: a host wait?");

    // A second message in the same block: no new import, one more count.
    let again = imports.import(&d).unwrap();
    assert_eq!((meta.count(), imports.cached()), (2, 1));
    drop(again);
    drop(buffer);
    wait_until("our counts given back", Duration::from_secs(10), || meta.count() == 0);

    drop(_release_writer);
    wait_child(child, "the writer", Duration::from_secs(60));
    assert_eq!(imports.evict_dead(), 1, "the exited writer's block is forgotten");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The writer: a publisher of the CUDA buffer backend, as its sources describe it.
#[test]
#[ignore = "entry point of the child process started by the test above"]
fn writer_entry() {
    if child_role().as_deref() != Some("rosidl-cuda-writer") {
        return;
    }
    let _watchdog = watchdog_guard("rosidl-cuda writer", Duration::from_secs(100));
    let dir = PathBuf::from(std::env::var(DIR_ENV).unwrap());
    let gpu = Gpu::probe().unwrap();
    let served = ServedBlock::new(&gpu, BLOCK_ID, LEN);

    let kernels = Kernels::load(&gpu).unwrap();
    let stream = gpu.new_stream().unwrap();
    kernels.spin(&stream, 2_000_000_000).unwrap();
    // SAFETY: the block has ≥ LEN mapped bytes and lives until this process exits, after
    // the stream is done.
    unsafe { kernels.fill(&stream, served.block.device_ptr(), LEN as u64, SEED) }.unwrap();
    let event = IpcEvent::create(&gpu).unwrap();
    event.record(&stream).unwrap();
    let uid = rand::random::<u64>() | 1;
    served.meta.publish(uid, 1);
    let d = served.descriptor(&gpu, LEN, uid, event.handle().unwrap());
    let tmp = dir.join("descriptor.tmp");
    std::fs::write(&tmp, frame().encode_cdr_cuda(&d).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.join("descriptor")).unwrap();

    wait_file(&dir.join("done"), Duration::from_secs(90));
    assert_eq!(served.meta.count(), 0, "the reader gave its counts back");
    copy::wait(&stream).unwrap();
}

const SUB_NAME: &str = "gpu_rosidl_cuda_publisher_to_our_subscription_in_place";
const PUB_KILLED: &str = "gpu_rosidl_cuda_publisher_killed_while_we_hold_its_blocks";
const SUB_KILLED: &str = "gpu_rosidl_cuda_our_subscriber_killed_holding_their_blocks";
const PORT_ENV: &str = "ZCS_ROSIDL_CUDA_PORT";
const KEY_ENV: &str = "ZCS_ROSIDL_CUDA_KEY";
const DOMAIN_ENV: &str = "ZCS_ROSIDL_CUDA_DOMAIN";
/// `refused`: the publisher sends only descriptors its subscriber must refuse.
const MODE_ENV: &str = "ZCS_ROSIDL_CUDA_MODE";
const REFUSED: &str = "gpu_rosidl_cuda_publisher_of_refused_descriptors_is_reported_silent";
/// Frames the publisher sends, in order: 1080p and 4K rgba8, each in a block of its own.
const FRAMES: [(u32, u32); 2] = [(1920, 1080), (3840, 2160)];
const TOPIC: &str = "/camera/image";

fn seed_of(i: usize) -> u64 {
    1000 + i as u64
}

/// Our subscription of the topic on the buffer-aware wire: it takes CUDA buffers.
fn cuda_subscription(
    session: &zenoh_cuda_shm::GpuSession,
    domain: u32,
) -> zenoh_cuda_shm_ros2::RosSubscriber<Image<()>> {
    use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RmwWire, RosNode};
    let node =
        RosNode::new(session, NodeOptions::new("cuda_sub").domain(domain).rmw_wire(RmwWire::BufferAware)).unwrap();
    let sub = node.subscriber::<Image<()>>(TOPIC, Qos::reliable(10)).unwrap();
    assert!(sub.takes_cuda_buffers());
    assert!(sub.token().ends_with("/backends:cuda:"), "{}", sub.token());
    assert_eq!(sub.registry_error(), None);
    sub
}

/// The publisher child, connecting to `port`; `key`: the data key it must derive.
fn spawn_publisher(dir: &Path, port: u16, domain: u32, key: Option<&str>) -> std::process::Child {
    let mut env =
        vec![(DIR_ENV, dir.display().to_string()), (PORT_ENV, port.to_string()), (DOMAIN_ENV, domain.to_string())];
    env.extend(key.map(|k| (KEY_ENV, k.to_owned())));
    spawn_child("cuda_publisher_entry", "rosidl-cuda-publisher", &env)
}

/// Receives the publisher's frames: each in place on the GPU, every byte checked there.
fn receive_frames(
    sub: &zenoh_cuda_shm_ros2::RosSubscriber<Image<()>>,
    pattern: &zcs_tests::medium::Pattern,
) -> Vec<zenoh_cuda_shm_ros2::RosSample<Image<()>>> {
    let mut held = Vec::new();
    for (i, (w, h)) in FRAMES.iter().enumerate() {
        let msg = sub.recv_timeout(Duration::from_secs(60)).expect("a frame from the CUDA publisher");
        assert_eq!((msg.msg().width, msg.msg().height), (*w, *h));
        assert_eq!(msg.path(), zenoh_cuda_shm::Path::ZeroCopy);
        assert_eq!(sub.path_reason(&msg), None);
        let sample = msg.gpu_sample().expect("in place on the GPU");
        assert!(sample.host_bytes().is_none(), "device memory, never copied to the host");
        assert_eq!(sample.len(), (*w * *h * 4) as usize);
        assert_eq!(pattern.mismatches(sample, seed_of(i)), 0, "every byte of frame {i}, read after the writer's event");
        held.push(msg);
    }
    held
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zcs-rosidl-cuda-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes what a killed publisher leaves in /dev/shm and /tmp.
fn remove_leftovers(pid: u32) {
    for block in 1..=FRAMES.len() as u32 {
        let _ = std::fs::remove_file(BlockMeta::path_of(pid as i32, block));
        let _ = std::fs::remove_file(format!("/tmp/cuda_vmm_{pid}_{block}.sock"));
    }
}

/// An rmw_zenoh 0.12.0 CUDA publisher (written from its sources) → our subscription on
/// a GPU session: the subscription lists `cuda`, is in the host registry with our
/// device and uid (so the publisher chooses descriptors), and delivers each frame as a
/// sample read in place on our stream after the publisher's event, every byte checked
/// on the GPU; a descriptor of a reused block is refused and counted; the publisher's
/// pool is whole again once our samples are gone.
#[test]
fn gpu_rosidl_cuda_publisher_to_our_subscription_in_place() {
    let Some(_gpu) = gpu_or_skip(SUB_NAME) else { return };
    let _watchdog = watchdog_guard(SUB_NAME, Duration::from_secs(150));
    let port = zcs_tests::free_tcp_port();
    let domain = 60 + std::process::id() % 100;
    let session = cuda_session(Some(port), None);
    let sub = cuda_subscription(&session, domain);
    let dir = temp_dir("pub");
    let child = spawn_publisher(&dir, port, domain, Some(sub.key()));
    // Written when our samples are gone (also when an assertion fails first).
    let released = Done(dir.join("released"));

    let held = receive_frames(&sub, &zcs_tests::medium::Pattern::new(&session));
    wait_until("the stale descriptor refused", Duration::from_secs(30), || sub.stats().backend_refused == 1);
    let refusal = sub.backend_refusal().expect("a reason");
    assert!(refusal.contains("reused"), "{refusal}");
    let stats = sub.stats();
    assert_eq!((stats.cuda_buffers, stats.buf_gid, stats.buf_cpu, stats.base), (2, 0, 0, 0), "{stats:?}");

    // Forged descriptors (another element type, a buffer past its block, another
    // device, a socket not served by the named process) and a truncated message: each
    // refused and counted by reason, nothing delivered, no FD kept.
    let fds = zcs_tests::open_fd_count().unwrap();
    std::fs::write(dir.join("forge"), b"").unwrap();
    wait_until("the forged input counted", Duration::from_secs(30), || {
        let s = sub.stats();
        s.backend_refused == 5 && s.bad_cdr == 1
    });
    let by_kind: Vec<_> = sub.backend_refusals().into_iter().collect();
    assert_eq!(by_kind, vec![("descriptor", 2), ("other-device", 1), ("reused", 1), ("wrong-peer", 1)]);
    assert!(sub.try_recv().is_none(), "nothing forged was delivered");
    assert_eq!(zcs_tests::open_fd_count().unwrap(), fds, "no FD kept from a refused import");
    // The publisher checks that its pool is whole again once we let go.
    drop(held);
    drop(released);
    wait_child(child, "the CUDA publisher", Duration::from_secs(60));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Their publisher killed (SIGKILL) while we hold two of its blocks: our samples stay
/// readable, every byte as it was (the mapping holds the memory), and letting go of
/// them afterwards is quiet.
#[test]
fn gpu_rosidl_cuda_publisher_killed_while_we_hold_its_blocks() {
    let Some(_gpu) = gpu_or_skip(PUB_KILLED) else { return };
    let _watchdog = watchdog_guard(PUB_KILLED, Duration::from_secs(150));
    let port = zcs_tests::free_tcp_port();
    let domain = 60 + (std::process::id() + 1) % 100;
    let session = cuda_session(Some(port), None);
    let sub = cuda_subscription(&session, domain);
    let dir = temp_dir("pub-killed");
    let mut child = spawn_publisher(&dir, port, domain, None);
    let pattern = zcs_tests::medium::Pattern::new(&session);
    let held = receive_frames(&sub, &pattern);

    child.kill().unwrap();
    child.wait().unwrap();
    for (i, msg) in held.iter().enumerate() {
        let sample = msg.gpu_sample().unwrap();
        assert_eq!(pattern.mismatches(sample, seed_of(i)), 0, "frame {i} after its publisher died");
    }
    drop(held);
    drop(sub);
    remove_leftovers(child.id());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Our subscriber killed (SIGKILL) while it holds two of their blocks: the backend's
/// protocol leaves its counts up for good (checked: the negative control), and the
/// next subscription of ours on the host gives them back from the dead process's hold
/// journal, so their pool is whole again.
#[test]
fn gpu_rosidl_cuda_our_subscriber_killed_holding_their_blocks() {
    let Some(_gpu) = gpu_or_skip(SUB_KILLED) else { return };
    let _watchdog = watchdog_guard(SUB_KILLED, Duration::from_secs(150));
    let port = zcs_tests::free_tcp_port();
    let domain = 60 + (std::process::id() + 2) % 100;
    let session = cuda_session(Some(port), None);
    let dir = temp_dir("sub-killed");
    let env = [(DIR_ENV, dir.display().to_string()), (PORT_ENV, port.to_string()), (DOMAIN_ENV, domain.to_string())];
    let mut ours = spawn_child("our_subscriber_entry", "rosidl-cuda-our-subscriber", &env);
    wait_file(&dir.join("subscribed"), Duration::from_secs(60));
    let publisher = spawn_publisher(&dir, port, domain, None);
    let released = Done(dir.join("released"));
    wait_file(&dir.join("holding"), Duration::from_secs(90));
    ours.kill().unwrap();
    ours.wait().unwrap();

    let counts = |pid: u32| {
        (1..=FRAMES.len() as u32).map(|b| BlockMeta::open(pid as i32, b).unwrap().count()).collect::<Vec<_>>()
    };
    assert_eq!(counts(publisher.id()), vec![1, 1], "the dead subscriber's counts stay up without a reaper");
    let _reaper = cuda_subscription(&session, domain + 100);
    wait_until("the dead subscriber's counts given back", Duration::from_secs(20), || {
        counts(publisher.id()) == vec![0, 0]
    });
    drop(released);
    wait_child(publisher, "the CUDA publisher", Duration::from_secs(60));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A publisher whose every descriptor is refused (another device) is reported as
/// silent, with that reason: its messages are lost, and nothing else would say so.
#[test]
fn gpu_rosidl_cuda_publisher_of_refused_descriptors_is_reported_silent() {
    use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RmwWire, RosNode, SilenceReason};
    let Some(_gpu) = gpu_or_skip(REFUSED) else { return };
    let _watchdog = watchdog_guard(REFUSED, Duration::from_secs(150));
    let port = zcs_tests::free_tcp_port();
    let domain = 60 + (std::process::id() + 3) % 100;
    let session = cuda_session(Some(port), None);
    let options = NodeOptions::new("cuda_sub")
        .domain(domain)
        .rmw_wire(RmwWire::BufferAware)
        .silence_window(Some(Duration::from_secs(1)));
    let node = RosNode::new(&session, options).unwrap();
    let sub = node.subscriber::<Image<()>>(TOPIC, Qos::reliable(10)).unwrap();
    let dir = temp_dir("refused");
    let env = [
        (DIR_ENV, dir.display().to_string()),
        (PORT_ENV, port.to_string()),
        (DOMAIN_ENV, domain.to_string()),
        (MODE_ENV, "refused".to_owned()),
    ];
    let publisher = spawn_child("cuda_publisher_entry", "rosidl-cuda-publisher", &env);
    let released = Done(dir.join("released"));
    let refused = SilenceReason::DescriptorsRefused { kind: "other-device" };
    wait_until("the publisher reported silent", Duration::from_secs(60), || {
        sub.silent_publishers().iter().any(|p| p.reasons.contains(&refused))
    });
    let stats = sub.stats();
    assert!(stats.backend_refused > 0 && stats.cuda_buffers == 0, "{stats:?}");
    assert!(sub.try_recv().is_none(), "nothing delivered");
    drop(released);
    wait_child(publisher, "the CUDA publisher", Duration::from_secs(60));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Our subscriber for `gpu_rosidl_cuda_our_subscriber_killed_holding_their_blocks`:
/// takes both frames, checks them, holds them.
#[test]
#[ignore = "entry point of the child process started by the test above"]
fn our_subscriber_entry() {
    if child_role().as_deref() != Some("rosidl-cuda-our-subscriber") {
        return;
    }
    let _watchdog = watchdog_guard("our rosidl-cuda subscriber", Duration::from_secs(140));
    let env = |k: &str| std::env::var(k).unwrap();
    let dir = PathBuf::from(env(DIR_ENV));
    let session = cuda_session(None, Some(env(PORT_ENV).parse().unwrap()));
    let sub = cuda_subscription(&session, env(DOMAIN_ENV).parse().unwrap());
    std::fs::write(dir.join("subscribed"), b"").unwrap();
    let held = receive_frames(&sub, &zcs_tests::medium::Pattern::new(&session));
    // The stale descriptor, too, is done with: no count is in flight when we are killed.
    wait_until("the stale descriptor refused", Duration::from_secs(30), || sub.stats().backend_refused == 1);
    std::fs::write(dir.join("holding"), b"").unwrap();
    std::thread::sleep(Duration::from_secs(120)); // killed long before
    drop(held);
}

/// The publisher: what rmw_zenoh 0.12.0 with `cuda_buffer_backend` 0.1.2 does for one
/// CUDA-capable subscription (docs/cuda-buffer-backend.md): discover its `MS` token
/// (`rmw_publisher_data.cpp:766-896`), take its GID as XXH3-128 of the token as
/// rebuilt (`liveliness_utils.cpp:536-585`, `628`), look it up in the host registry and send a descriptor
/// only for the same device and uid (`cuda_buffer_backend_plugin.cpp:82-129`), put the
/// message on `<data key>/_buf/<GID>` with the usual attachment, sequence numbers per
/// put (`rmw_publisher_data.cpp:373-477`).
#[test]
#[ignore = "entry point of the child process started by the test above"]
fn cuda_publisher_entry() {
    use zcs_wire::rosidl_cuda::HostRegistry;
    use zenoh::Wait;
    use zenoh_cuda_shm_ros2::Attachment;

    if child_role().as_deref() != Some("rosidl-cuda-publisher") {
        return;
    }
    let _watchdog = watchdog_guard("rosidl-cuda publisher", Duration::from_secs(145));
    let env = |k: &str| std::env::var(k).unwrap();
    let dir = PathBuf::from(env(DIR_ENV));
    let port: u16 = env(PORT_ENV).parse().unwrap();
    let gpu = Gpu::probe().unwrap();
    let z = zenoh::open(zcs_tests::loopback_zenoh_config(None, Some(port), None)).wait().unwrap();

    // Discovery: the subscription's token, its backends chunk, its GID.
    let mut token = None;
    let t0 = Instant::now();
    while token.is_none() && t0.elapsed() < Duration::from_secs(30) {
        let replies = z.liveliness().get(format!("@ros2_lv/{}/**", env(DOMAIN_ENV))).wait().unwrap();
        while let Ok(reply) = replies.recv() {
            let Ok(s) = reply.result() else { continue };
            let k = s.key_expr().as_str();
            if k.split('/').nth(5) == Some("MS") && k.rsplit('/').next().is_some_and(|c| c.starts_with("backends:")) {
                token = Some(k.to_owned());
            }
        }
        if token.is_none() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let token = token.expect("the subscription's MS token");
    assert!(token.ends_with("/backends:cuda:"), "a subscription accepting CUDA: {token}");
    // XXH3-128 of the token as rmw_zenoh rebuilds it (QoS in compact form): our
    // `gid_of`, whose results are checked against real rmw_zenoh GIDs in ros2_wire.rs.
    let gid = zenoh_cuda_shm_ros2::names::gid_of(&token);
    let gid_hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();

    // The plugin's choice: descriptors only for an entry with our ordinal and uid.
    let registry = HostRegistry::open(0).unwrap();
    let entry = registry.lookup(gid).unwrap().expect("the subscription registered itself before its token");
    assert_eq!(entry.kind, 1);
    assert_eq!((entry.device_id, entry.uid), (gpu.ordinal() as i32, nix::unistd::getuid().as_raw()));

    // The data key from the token's chunks (`<domain>/<topic>/<type>/<hash>`, the
    // topic's `/` mangled as `%` in the token): rmw_zenoh's `liveliness_utils.cpp`.
    let parts: Vec<&str> = token.split('/').collect();
    let data_key =
        format!("{}/{}/{}/{}", parts[1], parts[9].trim_start_matches('%').replace('%', "/"), parts[10], parts[11]);
    if let Ok(expected) = std::env::var(KEY_ENV) {
        assert_eq!(data_key, expected, "the data key rmw_zenoh derives is our subscription's");
    }
    let key = format!("{data_key}/_buf/{gid_hex}");
    // Its own MP token, as a buffer-aware publisher with the CUDA plugin lists it; the
    // attachments carry the GID of that token.
    let mp = format!(
        "@ros2_lv/{}/{}/0/1/MP/%/%/cuda_pub/{}/{}/{}/{}/backends:cpu:;cuda:",
        parts[1],
        z.zid(),
        parts[9],
        parts[10],
        parts[11],
        parts[12]
    );
    let publisher_gid = zenoh_cuda_shm_ros2::names::gid_of(&mp);
    let _mp = z.liveliness().declare_token(mp).wait().unwrap();
    let kernels = Kernels::load(&gpu).unwrap();
    let stream = gpu.new_stream().unwrap();
    let put = |seq: i64, bytes: Vec<u8>| {
        let att = Attachment { seq, timestamp_ns: 1, gid: publisher_gid };
        z.put(&key, bytes).attachment(att.encode().to_vec()).wait().unwrap();
    };
    if std::env::var(MODE_ENV).as_deref() == Ok("refused") {
        // Only descriptors of another device, until the subscriber has seen enough.
        let served = ServedBlock::new(&gpu, 1, 4096);
        let other = served.descriptor(&gpu, 4096, 1, [0; 64]);
        let d = CudaBufferDescriptor { device_id: gpu.ordinal() as i32 + 1, ..other };
        let image = Image { width: 32, height: 32, step: 128, ..frame() };
        let released = dir.join("released");
        let mut seq = 0;
        while !released.exists() {
            seq += 1;
            put(seq, image.encode_cdr_cuda(&d).unwrap());
            std::thread::sleep(Duration::from_millis(100));
        }
        return;
    }
    let mut kept = Vec::new();
    let mut last = None;
    for (i, (w, h)) in FRAMES.iter().enumerate() {
        let len = (*w * *h * 4) as usize;
        let served = ServedBlock::new(&gpu, i as u32 + 1, len);
        // The write is still running when the descriptor goes out: the reader must order
        // itself after the event.
        kernels.spin(&stream, 500_000_000).unwrap();
        // SAFETY: the block has ≥ len mapped bytes and is kept until this process exits,
        // after the stream is done.
        unsafe { kernels.fill(&stream, served.block.device_ptr(), len as u64, seed_of(i)) }.unwrap();
        let event = IpcEvent::create(&gpu).unwrap();
        event.record(&stream).unwrap();
        let uid = rand::random::<u64>() | 1;
        served.meta.publish(uid, 1);
        let d = served.descriptor(&gpu, len, uid, event.handle().unwrap());
        let image = Image { width: *w, height: *h, step: w * 4, ..frame() };
        put(i as i64 + 1, image.encode_cdr_cuda(&d).unwrap());
        last = Some((image, d.clone()));
        kept.push((served, event));
    }
    // A descriptor of the last block with another reuse id: refused by the subscriber.
    let (image, good) = last.unwrap();
    let mut stale = good.clone();
    stale.ipc_uid ^= 2;
    let mut seq = FRAMES.len() as i64 + 1;
    put(seq, image.encode_cdr_cuda(&stale).unwrap());

    // Hostile input, when the subscriber asks for it (it counts its FDs first).
    let (forge, released) = (dir.join("forge"), dir.join("released"));
    wait_until("forge or released", Duration::from_secs(120), || forge.exists() || released.exists());
    let mut forged_meta = None;
    if forge.exists() {
        let ours = gpu.ordinal() as i32;
        let mut forged = Vec::new();
        forged.push(CudaBufferDescriptor { element_type_name: "f".into(), ..good.clone() });
        forged.push(CudaBufferDescriptor { size: good.vmm_block_size + 1, ..good.clone() });
        forged.push(CudaBufferDescriptor { device_id: ours + 1, ..good.clone() });
        // Names a process that does not serve the socket: a block file of the
        // subscriber's pid exists and matches, but the socket is ours.
        let victim = std::os::unix::process::parent_id() as i32;
        let meta = BlockMeta::create_at(&BlockMeta::path_of(victim, 77)).unwrap();
        meta.publish(good.ipc_uid, 1);
        forged.push(CudaBufferDescriptor { vmm_pid: victim, vmm_block_id: 77, ..good.clone() });
        forged_meta = Some((meta, BlockMeta::path_of(victim, 77)));
        for d in &forged {
            seq += 1;
            put(seq, image.encode_cdr_cuda(d).unwrap());
        }
        let whole = image.encode_cdr_cuda(&good).unwrap();
        seq += 1;
        put(seq, whole[..whole.len() / 2].to_vec());
    }

    wait_file(&released, Duration::from_secs(120));
    if let Some((meta, path)) = forged_meta {
        assert_eq!(meta.count(), 0, "the refused import gave its count back");
        drop(meta);
        let _ = std::fs::remove_file(path);
    }
    for (served, _) in &kept {
        wait_until("the subscriber's count given back", Duration::from_secs(10), || served.meta.count() == 0);
    }
    copy::wait(&stream).unwrap();
}
