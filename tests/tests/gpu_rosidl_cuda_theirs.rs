//! Blocks of ROS 2's CUDA buffer backend, made by **its own code**, imported into our
//! process: `core_peer` runs the backend's core library (`cuda_buffer`, built from its
//! released sources by `scripts/cuda-buffer-core.sh`) as a publisher, with the steps of
//! its rmw plugin that fill a descriptor. Its pool allocates and exports the block, its
//! IPC manager serves the FD, its write event orders the write, its shared count and
//! reuse rule decide when the block may be written again. We import with
//! `BackendImports`, read in place on our stream after its event, and give the count
//! back; its pool must then hand the same block out again, and not before, also when our
//! importer was killed holding it (once a process of ours reaps its count). The other
//! way, its importer takes a descriptor of our publisher's block, reads it after our
//! event and gives its count back. (`gpu_rosidl_cuda.rs` and `gpu_rosidl_cuda_export.rs`
//! run the same steps against peers written from the backend's sources.)
//!
//! Without a GPU: `SKIPPED gpu_rosidl_cuda_theirs_...`; without `ZCS_CUDA_BUFFER_CORE`
//! (the script's output, with `core_peer` built): likewise, with that reason.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::check_pattern;
use zcs_memory::cuda::{Gpu, Kernels, copy};
use zcs_tests::line_peer::LinePeer;
use zcs_tests::rosidl::{Registered, TheirSubscription, cuda_session, rgba_frame};
use zcs_tests::{child_role, gpu_or_skip, spawn_child, wait_child, wait_until, watchdog_guard};
use zcs_wire::rosidl_cuda::BlockMeta;
use zenoh::Wait;
use zenoh_cuda_shm::tensor_codec::cdr::{BufferData, CudaBufferDescriptor, CudaDescriptorLayout, Image};
use zenoh_cuda_shm_ros2::cuda_backend::{BackendImportError, BackendImports};

const CORE_ENV: &str = "ZCS_CUDA_BUFFER_CORE";
const LEN: usize = 6 << 20;
const SEED: u64 = 91;
/// How long their stream sleeps before the write: a read not ordered after their event
/// runs inside it.
const DELAY_MS: u64 = 2000;

/// `core_peer`, or why there is none (then the test prints SKIPPED and returns).
fn core_peer(test: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(CORE_ENV) else {
        println!(
            "SKIPPED {test}: {CORE_ENV} is not set (scripts/cuda-buffer-core.sh --src <rosidl_buffer_backends> \
             --rosidl <rosidl> builds the backend's core library and prints it)"
        );
        return None;
    };
    let bin = PathBuf::from(dir).join("bin/core_peer");
    if !bin.is_file() {
        println!("SKIPPED {test}: {} is missing (the script needs --rosidl to build it)", bin.display());
        return None;
    }
    Some(bin)
}

/// Their publisher and subscriber, in a process of its own.
struct Theirs(LinePeer);

impl Theirs {
    fn start(bin: &Path, gpu: &Gpu) -> Self {
        let mut peer = LinePeer::start(bin, &[gpu.ordinal().to_string()], &[]);
        let ready = peer.line();
        assert_eq!(ready, format!("ready pid={} ipc=1", peer.pid()), "their pool must be able to export");
        Self(peer)
    }

    fn ask(&mut self, cmd: &str) -> String {
        let line = self.0.ask(cmd);
        assert!(!line.starts_with("error"), "core_peer: {line}");
        line
    }

    fn count(&mut self, block: u32) -> i32 {
        let reply = self.ask(&format!("count {block}"));
        reply.strip_prefix("count=").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{reply}"))
    }

    fn alloc(&mut self, len: usize) -> u32 {
        let reply = self.ask(&format!("alloc {len}"));
        reply.strip_prefix("block=").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{reply}"))
    }

    /// Publishes a buffer of `len` bytes of the pattern for `seed`; its descriptor.
    fn publish(&mut self, len: usize, seed: u64) -> CudaBufferDescriptor {
        descriptor(&self.ask(&format!("publish {len} {seed} {DELAY_MS}")))
    }
}

/// The descriptor in `core_peer`'s `descriptor k=v ...` line.
fn descriptor(line: &str) -> CudaBufferDescriptor {
    let fields: std::collections::HashMap<&str, &str> = line
        .strip_prefix("descriptor ")
        .unwrap_or_else(|| panic!("not a descriptor: {line}"))
        .split(' ')
        .map(|kv| kv.split_once('=').unwrap_or_else(|| panic!("{kv} in {line}")))
        .collect();
    let num = |k: &str| fields[k].parse::<u64>().unwrap_or_else(|e| panic!("{k} in {line}: {e}"));
    let hex = fields["event"];
    let mut event = [0u8; 64];
    for (i, b) in event.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    CudaBufferDescriptor {
        size: num("size"),
        element_type_name: fields["type"].into(),
        device_id: num("device") as i32,
        use_ipc: true,
        vmm_pid: num("pid") as i32,
        vmm_block_id: num("block") as u32,
        vmm_block_size: num("block_size"),
        vmm_socket_path: fields["socket"].into(),
        ipc_uid: num("uid"),
        ipc_event_handle: event,
        layout: CudaDescriptorLayout::V0_1_2,
    }
}

/// Copies the buffer's LEN bytes out on `stream` and waits (the stream may first wait
/// on their event).
fn read_out(buffer: &zenoh_cuda_shm_ros2::cuda_backend::BackendBuffer, gpu: &Gpu, ordered: bool) -> Vec<u8> {
    let mut out = vec![0u8; LEN];
    let (stream, other) = (gpu.new_stream().unwrap(), gpu.new_stream().unwrap());
    let read = buffer.read(&stream).unwrap();
    let copy_on = if ordered { &stream } else { &other };
    // SAFETY: the buffer's LEN bytes are mapped while `buffer` lives; `out` has LEN bytes.
    unsafe { copy::device_to_host(copy_on, read.device_ptr(), &mut out) }.unwrap();
    read.end().unwrap();
    out
}

#[test]
fn gpu_rosidl_cuda_theirs_block_is_read_after_their_write_and_their_pool_gets_it_back() {
    const NAME: &str = "gpu_rosidl_cuda_theirs_block_is_read_after_their_write_and_their_pool_gets_it_back";
    let Some(gpu) = gpu_or_skip(NAME) else { return };
    let Some(bin) = core_peer(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(120));
    let mut theirs = Theirs::start(&bin, &gpu);
    let d = theirs.publish(LEN, SEED);
    let block = d.vmm_block_id;
    assert_eq!((d.size, d.element_type_name.as_str(), d.device_id), (LEN as u64, "h", gpu.ordinal() as i32));
    assert!(d.has_event() && d.vmm_block_size >= LEN as u64, "{d:?}");
    let meta = BlockMeta::open(d.vmm_pid, block).unwrap();
    assert_eq!((meta.count(), theirs.count(block)), (0, 0));

    // Refused before anything is counted or mapped: another device, a reused block.
    let imports = BackendImports::new(&gpu).unwrap();
    let mut other = d.clone();
    other.device_id += 1;
    assert!(matches!(imports.import(&other), Err(BackendImportError::OtherDevice { .. })));
    let mut stale = d.clone();
    stale.ipc_uid ^= 1;
    assert!(matches!(imports.import(&stale), Err(BackendImportError::Meta(_))));
    assert_eq!((theirs.count(block), imports.cached()), (0, 0));

    let t = Instant::now();
    let buffer = imports.import(&d).unwrap();
    let imported = t.elapsed();
    assert_eq!((meta.count(), theirs.count(block), imports.cached()), (1, 1, 1), "our count, as their pool reads it");

    // Negative control: a copy not ordered after their event runs while their stream
    // still sleeps, and does not see the pattern.
    let early = read_out(&buffer, &gpu, false);
    assert!(check_pattern(&early, 0, SEED).is_some(), "an unordered read saw their data: no negative control");
    // Ours: every byte after their write.
    let out = read_out(&buffer, &gpu, true);
    assert_eq!(check_pattern(&out, 0, SEED), None, "every byte after their event");
    println!("{NAME}: import of their block {:.1} ms", imported.as_secs_f64() * 1e3);

    // Their message is gone but we hold the block: their pool must not hand it out.
    assert_eq!(theirs.ask("drop"), "ok");
    std::thread::sleep(Duration::from_millis(200));
    assert_ne!(theirs.alloc(LEN), block, "their pool reused a block we still read");
    assert_eq!(theirs.ask("drop"), "ok");

    // Our count back: after their grace window (100 ms) the block is theirs again.
    drop(buffer);
    wait_until("our count given back, as their pool reads it", Duration::from_secs(10), || theirs.count(block) == 0);
    std::thread::sleep(Duration::from_millis(200));
    let again = theirs.alloc(LEN);
    assert!(again == block || theirs.alloc(LEN) == block, "their pool never handed our returned block out again");
    assert_eq!(theirs.ask("drop"), "ok");

    let status = theirs.0.exit();
    assert!(status.success(), "core_peer: {status}");
    assert_eq!(imports.evict_dead(), 1, "the exited publisher's block is forgotten");
}

#[test]
fn gpu_rosidl_cuda_theirs_killed_publisher_leaves_our_import_readable() {
    const NAME: &str = "gpu_rosidl_cuda_theirs_killed_publisher_leaves_our_import_readable";
    let Some(gpu) = gpu_or_skip(NAME) else { return };
    let Some(bin) = core_peer(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(120));
    let mut theirs = Theirs::start(&bin, &gpu);
    let d = theirs.publish(LEN, SEED + 1);
    let imports = BackendImports::new(&gpu).unwrap();
    let buffer = imports.import(&d).unwrap();
    // Their write is done before they die (a killed writer's unfinished stream work is
    // undefined); then the process is killed with our import in hand.
    let out = read_out(&buffer, &gpu, true);
    assert_eq!(check_pattern(&out, 0, SEED + 1), None);
    let pid = d.vmm_pid;
    theirs.0.kill();

    // The memory stays mapped and whole for us; giving the count back to a dead
    // publisher's file is harmless; the cache forgets the dead publisher.
    assert_eq!(check_pattern(&read_out(&buffer, &gpu, true), 0, SEED + 1), None, "still readable after their death");
    drop(buffer);
    assert_eq!(imports.evict_dead(), 1);
    // What a killed publisher of theirs leaves behind (its pool never ran its
    // destructor): the count file and the socket.
    let leftovers = [BlockMeta::path_of(pid, d.vmm_block_id), PathBuf::from(&d.vmm_socket_path)];
    for path in &leftovers {
        println!("{NAME}: left by the killed publisher: {} (exists: {})", path.display(), path.exists());
        let _ = std::fs::remove_file(path);
    }
}

const HELD_ENV: &str = "ZCS_ROSIDL_THEIRS_HELD";

/// Our importer killed (SIGKILL) holding a block of their pool: the count it took stays
/// up while nothing of ours reaps it, so their pool keeps the block out (the negative
/// control); once a process of ours reaps the dead importer's hold journal, the count is
/// back at 0 and their pool hands the block out again.
#[test]
fn gpu_rosidl_cuda_theirs_pool_whole_after_our_importer_is_killed() {
    const NAME: &str = "gpu_rosidl_cuda_theirs_pool_whole_after_our_importer_is_killed";
    let Some(gpu) = gpu_or_skip(NAME) else { return };
    let Some(bin) = core_peer(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(120));
    let mut theirs = Theirs::start(&bin, &gpu);
    let d = theirs.publish(LEN, SEED + 2);
    let block = d.vmm_block_id;
    let dir = std::env::temp_dir().join(format!("zcs-rosidl-theirs-held-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env = [(DIR_ENV, dir.display().to_string()), (HELD_ENV, format!("descriptor {}", fields(&d)))];
    let mut ours = spawn_child("our_importer_entry", "rosidl-theirs-importer", &env);
    wait_until("our importer holding their block", Duration::from_secs(60), || dir.join("holding").exists());
    assert_eq!(theirs.count(block), 1, "our importer's count, as their pool reads it");
    ours.kill().unwrap();
    ours.wait().unwrap();

    // Their message is gone and our importer is dead, its count still up: their pool
    // must not hand the block out yet.
    assert_eq!(theirs.ask("drop"), "ok");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(theirs.count(block), 1, "the dead importer's count stays up without a reaper");
    assert_ne!(theirs.alloc(LEN), block, "their pool handed out a block a dead importer still counted");
    assert_eq!(theirs.ask("drop"), "ok");

    // What a subscription of ours does when it starts and every 10 s after.
    let reaped = zcs_wire::rosidl_cuda::reap_dead_holders();
    assert!(reaped.counts >= 1, "{reaped:?}");
    wait_until("the dead importer's count given back", Duration::from_secs(10), || theirs.count(block) == 0);
    std::thread::sleep(Duration::from_millis(200));
    let again = theirs.alloc(LEN);
    assert!(again == block || theirs.alloc(LEN) == block, "their pool never handed the reaped block out again");
    assert_eq!(theirs.ask("drop"), "ok");
    let status = theirs.0.exit();
    assert!(status.success(), "core_peer: {status}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The importer of the test above: imports their block, reads every byte after their
/// event, says so, and waits to be killed.
#[test]
#[ignore = "entry point of the child process started by the test above"]
fn our_importer_entry() {
    if child_role().as_deref() != Some("rosidl-theirs-importer") {
        return;
    }
    let _watchdog = watchdog_guard("our importer", Duration::from_secs(100));
    let gpu = Gpu::probe().unwrap();
    let d = descriptor(&std::env::var(HELD_ENV).unwrap());
    let imports = BackendImports::new(&gpu).unwrap();
    let buffer = imports.import(&d).unwrap();
    assert_eq!(check_pattern(&read_out(&buffer, &gpu, true), 0, SEED + 2), None, "every byte after their event");
    std::fs::write(PathBuf::from(std::env::var(DIR_ENV).unwrap()).join("holding"), b"").unwrap();
    std::thread::sleep(Duration::from_secs(90));
    drop(buffer);
}

const DIR_ENV: &str = "ZCS_ROSIDL_THEIRS_DIR";
const PORT_ENV: &str = "ZCS_ROSIDL_THEIRS_PORT";
const DOMAIN_ENV: &str = "ZCS_ROSIDL_THEIRS_DOMAIN";
const TOPIC: &str = "/camera/image";
/// A 4K rgba8 frame.
const FRAME: (u32, u32) = (3840, 2160);
const FRAME_SEED: u64 = 3001;
/// How long our writer's kernel spins before it writes the frame.
const SPIN: Duration = Duration::from_millis(500);

/// Our publisher (a process of its own: our publishers send a subscription of their own
/// process CDR) → a subscription of the backend's, whose descriptor `core_peer` takes
/// with the backend's own importer: it reads our block after our event (every byte; its
/// read not ordered after the event sees the frame unwritten, the negative control), and
/// its count comes back to our publisher, which sent no byte through the host.
#[test]
fn gpu_rosidl_cuda_theirs_importer_reads_our_block_after_our_write() {
    const NAME: &str = "gpu_rosidl_cuda_theirs_importer_reads_our_block_after_our_write";
    let Some(gpu) = gpu_or_skip(NAME) else { return };
    let Some(bin) = core_peer(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(150));
    let port = zcs_tests::free_tcp_port();
    let domain = 60 + (std::process::id() + 7) % 100;
    let z = zenoh::open(zcs_tests::loopback_zenoh_config(Some(port), None, None)).wait().unwrap();
    // Its registry entry and token say: the cuda backend, our device, our uid.
    let sub = TheirSubscription::declare(&z, domain, TOPIC, &gpu, Registered::SameDevice);
    let mut theirs = Theirs::start(&bin, &gpu);
    let dir = std::env::temp_dir().join(format!("zcs-rosidl-theirs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env = [(DIR_ENV, dir.display().to_string()), (PORT_ENV, port.to_string()), (DOMAIN_ENV, domain.to_string())];
    let ours = spawn_child("our_publisher_entry", "rosidl-theirs-our-pub", &env);

    let (on_buf, bytes) = sub.rx.recv_timeout(Duration::from_secs(60)).expect("our frame");
    assert!(on_buf, "a descriptor on _buf/<its GID>, not CDR on the data key");
    let Image { data: BufferData::Cuda(d), .. } = Image::decode_cdr_buffer(&bytes).expect("our message") else {
        panic!("our publisher sent bytes, not a descriptor");
    };
    let reply = theirs.ask(&format!("consume {} seed={FRAME_SEED}", fields(&d)));
    let counts: Vec<u64> = reply
        .strip_prefix("consumed ")
        .unwrap_or_else(|| panic!("{reply}"))
        .split(' ')
        .map(|kv| kv.split_once('=').and_then(|(_, v)| v.parse().ok()).unwrap_or_else(|| panic!("{reply}")))
        .collect();
    assert_eq!(counts[0], 0, "their read after our event: every byte ({reply})");
    assert!(counts[1] > 0, "their read not ordered after our event saw our frame written: no negative control");
    std::fs::write(dir.join("done"), b"").unwrap();
    wait_child(ours, "our publisher", Duration::from_secs(60));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `d` as `core_peer`'s `consume` takes it.
fn fields(d: &CudaBufferDescriptor) -> String {
    let event: String = d.ipc_event_handle.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "size={} device={} pid={} block={} block_size={} socket={} uid={} type={} event={event}",
        d.size,
        d.device_id,
        d.vmm_pid,
        d.vmm_block_id,
        d.vmm_block_size,
        d.vmm_socket_path,
        d.ipc_uid,
        d.element_type_name
    )
}

/// The publisher of the test above: one frame, written by a kernel after a spin; then,
/// once the test is done, its counters: one descriptor, no device→host copy, and the
/// block back in the pool (their count given back).
#[test]
#[ignore = "entry point of the child process started by the test above"]
fn our_publisher_entry() {
    use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RmwWire, RosNode};
    if child_role().as_deref() != Some("rosidl-theirs-our-pub") {
        return;
    }
    let _watchdog = watchdog_guard("our publisher", Duration::from_secs(140));
    let env = |k: &str| std::env::var(k).unwrap();
    let session = cuda_session(None, Some(env(PORT_ENV).parse().unwrap()));
    let node = RosNode::new(
        &session,
        NodeOptions::new("our_pub").domain(env(DOMAIN_ENV).parse().unwrap()).rmw_wire(RmwWire::BufferAware),
    )
    .unwrap();
    let publisher = node.publisher::<Image<()>>(TOPIC, Qos::reliable(10)).unwrap();
    assert!(publisher.lends_cuda_buffers());
    let gpu = session.gpu().unwrap().clone();
    let kernels = Kernels::load(&gpu).unwrap();
    wait_until("their subscription in our graph", Duration::from_secs(30), || publisher.ordinary_subscriptions() == 1);
    let (w, h) = FRAME;
    let len = (w * h * 4) as usize;
    let loan = publisher.loan(len).unwrap();
    let stream = loan.stream().unwrap();
    kernels.spin(stream, SPIN.as_nanos() as u64).unwrap();
    // SAFETY: the loan's `len` bytes are mapped until its stream has passed the kernel.
    unsafe { kernels.fill(stream, loan.device_ptr().unwrap(), len as u64, FRAME_SEED) }.unwrap();
    publisher.publish(&rgba_frame(w, h), loan).unwrap();

    let done = PathBuf::from(env(DIR_ENV)).join("done");
    wait_until("the test's end", Duration::from_secs(100), || done.exists());
    let s = publisher.stats();
    assert_eq!((s.descriptors, s.device_to_host, s.base_puts, s.buf_puts), (1, 0, 0, 0), "{s:?}");
    wait_until("our block back from their importer", Duration::from_secs(10), || publisher.stats().lent_blocks == 0);
    assert_eq!(publisher.stats().lent_reclaimed, 0, "their count came back; nothing was reclaimed from the dead");
}
