//! GPU suite: real CUDA VMM blocks moved between real processes.
//!
//! Every test runs a producer (this process) and a consumer (this test binary re-run
//! as a child, see `child_entry`), each with its own CUDA context; block and signal
//! FDs travel over the crate's control socket with `SCM_RIGHTS`. Contents are checked
//! byte for byte twice: by a GPU kernel in the consumer and by the CPU after a
//! device→host copy, against [`pattern_byte`] (an independent CPU implementation of
//! the pattern the fill kernel writes).
//!
//! Without a usable GPU each test prints `SKIPPED <name>: <reason>` and passes; with
//! `ZCS_REQUIRE_GPU=1` it fails instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zcs_memory::cuda::kernels::check_pattern;
use zcs_memory::cuda::{DeviceBlock, Fence, Gpu, ImportedBlock, Kernels, Stream, sys};
use zcs_pool::signal::{ReadGuard, ReadySignals, WriteGuard};
use zcs_pool::{BlockKey, BlockMemory, CudaBackend, HolderId, Pool, PoolConfig};
use zcs_tests::{child_role, gpu_or_skip, recv_msg, send_msg, spawn_child, wait_child, watchdog_guard};
use zcs_tests::{open_fd_count, thread_count};
use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};

const MIB: usize = 1 << 20;
const SOCK_ENV: &str = "ZCS_TEST_SOCK";
const IO: Duration = Duration::from_secs(60);
const SPIN_NS: u64 = 300_000_000;

/// The consumer's holder id in the producer's pool.
fn consumer_holder() -> HolderId {
    HolderId::new(1)
}

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    /// A published block; fds: [block, signal block].
    Block { key: BlockKey, size: u64, len: u64, signal_size: u64, seed: u64, mode: Mode },
    /// What the consumer found.
    Checked { gpu_errors: u64, cpu_bad: u64, unordered_errors: u64, waited_ms: f64 },
    /// The consumer is done with a block (its fence has completed).
    Release { key: BlockKey },
    /// Go on.
    Go,
    /// No more blocks.
    Done,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum Mode {
    /// Check, write a reply pattern back (seed + 1000), release.
    RoundTrip,
    /// Read without waiting first (negative control), then wait on the signal on a new
    /// stream and check.
    OrderedOnStream,
    /// The same, waiting on the legacy default stream.
    OrderedOnLegacyDefault,
    /// Read slowly (spin, then copy aside), release as soon as the read's fence
    /// completes, then check the private copy after the producer has reused the block.
    SlowReader,
}

/// A `u32` counter in device memory for the check kernel.
struct Counter {
    block: DeviceBlock,
}

impl Counter {
    fn new(gpu: &Gpu) -> Self {
        Self { block: DeviceBlock::allocate(gpu, 4).expect("counter block") }
    }
    fn reset(&self, gpu: &Gpu, stream: &Stream) {
        gpu.bind().unwrap();
        // SAFETY: the counter block is mapped with at least 4 bytes on this device.
        unsafe { sys::memset_d8_async(self.block.device_ptr(), 0, 4, stream.cu_stream()) }.unwrap();
    }
    fn read(&self, gpu: &Gpu, stream: &Stream) -> u64 {
        let v = d2h(gpu, stream, self.block.device_ptr(), 4);
        u32::from_le_bytes(v.try_into().unwrap()) as u64
    }
}

/// Copies device memory to a new host vector and waits for it.
fn d2h(gpu: &Gpu, stream: &Stream, src: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    gpu.bind().unwrap();
    // SAFETY: `src..src+len` is mapped device memory (callers pass block ranges) and `v`
    // has `len` writable bytes that stay alive until the synchronize below returns.
    unsafe { sys::memcpy_dtoh_async(v.as_mut_ptr(), src, len, stream.cu_stream()) }.unwrap();
    // SAFETY: a stream of the current context.
    unsafe { sys::stream_synchronize(stream.cu_stream()) }.unwrap();
    v
}

fn sync(gpu: &Gpu, stream: &Stream) {
    gpu.bind().unwrap();
    // SAFETY: a stream of the current context.
    unsafe { sys::stream_synchronize(stream.cu_stream()) }.unwrap();
}

/// GPU check (kernel) and CPU check (after a D2H copy) of `len` bytes at `ptr`.
fn check_both(gpu: &Gpu, k: &Kernels, c: &Counter, stream: &Stream, ptr: u64, len: usize, seed: u64) -> (u64, u64) {
    c.reset(gpu, stream);
    // SAFETY: `ptr..ptr+len` is inside a mapped block the caller holds; the counter is
    // a mapped u32; both outlive the synchronising reads below.
    unsafe { k.check(stream, ptr, len as u64, seed, c.block.device_ptr()) }.unwrap();
    let gpu_errors = c.read(gpu, stream);
    let host = d2h(gpu, stream, ptr, len);
    let cpu_bad = check_pattern(&host, 0, seed).map_or(0, |(_, bad)| bad);
    (gpu_errors, cpu_bad)
}

struct Producer {
    gpu: Gpu,
    pool: Pool<CudaBackend>,
    signals: Arc<ReadySignals>,
    stream: Stream,
    kernels: Kernels,
}

impl Producer {
    fn new(gpu: Gpu, cfg: PoolConfig) -> Self {
        let pool = Pool::new(CudaBackend::new(gpu.clone()), cfg).unwrap();
        let signals = Arc::new(ReadySignals::create(&gpu).unwrap());
        let stream = gpu.new_stream().unwrap();
        let kernels = Kernels::load(&gpu).unwrap();
        Self { gpu, pool, signals, stream, kernels }
    }

    /// Loans `len` bytes, runs `before` on the stream, fills with `seed`, publishes.
    fn publish(&self, len: usize, seed: u64, before: impl FnOnce(&Self, u64)) -> zcs_pool::Published<CudaBackend> {
        let guard = WriteGuard::new(self.pool.loan(len).unwrap(), self.stream.clone(), Arc::clone(&self.signals));
        before(self, guard.device_ptr());
        // SAFETY: the guard owns the loaned block (≥ len bytes, mapped) until `finish`,
        // which orders the signal and the block's release after this launch.
        unsafe { self.kernels.fill(&self.stream, guard.device_ptr(), len as u64, seed) }.unwrap();
        guard.finish().unwrap()
    }

    fn send(&self, conn: &ControlConn, p: &zcs_pool::Published<CudaBackend>, seed: u64, mode: Mode) {
        p.lease(consumer_holder()).unwrap();
        let msg = Msg::Block {
            key: p.key(),
            size: p.memory().size() as u64,
            len: p.len() as u64,
            signal_size: self.signals.size() as u64,
            seed,
            mode,
        };
        send_msg(conn, &msg, &[p.memory().fd(), self.signals.fd().unwrap()]);
    }
}

fn start_consumer(test: &str) -> (ControlListener, std::process::Child, ControlConn) {
    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).unwrap();
    let child = spawn_child("child_entry", test, &[(SOCK_ENV, name.to_key_chunk())]);
    let conn = listener.accept_timeout(IO).expect("consumer connects");
    (listener, child, conn)
}

/// The fill and check kernels split a range into 16-byte vectors (aligned start) and a
/// byte-wise tail: at every alignment and length the fill writes exactly the CPU's
/// pattern and nothing outside its range, and the check counts exactly the bytes that
/// were changed, in the vector body and in the tail.
#[test]
fn gpu_kernels_match_the_cpu_pattern_at_every_alignment() {
    let Some(gpu) = gpu_or_skip("gpu_kernels_match_the_cpu_pattern_at_every_alignment") else { return };
    let _watchdog = watchdog_guard("gpu_kernels", Duration::from_secs(120));
    let k = Kernels::load(&gpu).unwrap();
    let stream = gpu.new_stream().unwrap();
    let c = Counter::new(&gpu);
    let block = DeviceBlock::allocate(&gpu, 4 * MIB).unwrap();
    let base = block.device_ptr();
    let mut cases = 0;
    for off in [0usize, 1, 3, 8, 15, 16, 17, 4096] {
        for len in [0usize, 1, 15, 16, 17, 31, 33, 1000, 65536 + 5, MIB + 7] {
            let seed = (off * 31 + len) as u64;
            gpu.bind().unwrap();
            // SAFETY: the block is mapped with 4 MiB; the stream is synchronised by d2h.
            unsafe { sys::memset_d8_async(base, 0xaa, 4 * MIB, stream.cu_stream()) }.unwrap();
            // SAFETY: off + len < 4 MiB, inside the mapped block, which outlives the syncs.
            unsafe { k.fill(&stream, base + off as u64, len as u64, seed) }.unwrap();
            let host = d2h(&gpu, &stream, base, 4 * MIB);
            assert_eq!(check_pattern(&host[off..off + len], 0, seed), None, "fill off {off} len {len}");
            assert!(host[..off].iter().all(|&b| b == 0xaa), "fill off {off} len {len} wrote before its range");
            assert!(host[off + len..].iter().all(|&b| b == 0xaa), "fill off {off} len {len} wrote past its range");
            let (gpu_errors, _) = check_both(&gpu, &k, &c, &stream, base + off as u64, len, seed);
            assert_eq!(gpu_errors, 0, "check off {off} len {len}");
            // Change a byte at the start, in the middle and at the very end (the tail).
            let mut changed: Vec<usize> =
                [0, len / 2, len.saturating_sub(1)].into_iter().filter(|&i| i < len).collect();
            changed.dedup();
            for &i in &changed {
                // SAFETY: one byte inside the filled range.
                unsafe { sys::memset_d8_async(base + (off + i) as u64, !host[off + i], 1, stream.cu_stream()) }
                    .unwrap();
            }
            let (gpu_errors, cpu_bad) = check_both(&gpu, &k, &c, &stream, base + off as u64, len, seed);
            assert_eq!((gpu_errors, cpu_bad), (changed.len() as u64, changed.len() as u64), "off {off} len {len}");
            cases += 1;
        }
    }
    println!("{cases} alignment/length cases: fill exact and in range, check counts every changed byte");
}

#[test]
fn gpu_export_import_2mib_64mib_1gib_across_processes() {
    let Some(gpu) = gpu_or_skip("gpu_export_import_2mib_64mib_1gib_across_processes") else { return };
    let _watchdog = watchdog_guard("gpu_export_import", Duration::from_secs(300));
    let p = Producer::new(gpu, PoolConfig { max_bytes: 4 << 30, ..PoolConfig::default() });
    let (_l, child, conn) = start_consumer("consumer");
    for (i, len) in [2 * MIB, 64 * MIB, 1024 * MIB].into_iter().enumerate() {
        let seed = 100 + i as u64;
        let published = p.publish(len, seed, |_, _| {});
        p.send(&conn, &published, seed, Mode::RoundTrip);
        let (checked, _) = recv_msg::<Msg>(&conn, IO);
        let Msg::Checked { gpu_errors, cpu_bad, .. } = checked else { panic!("unexpected {checked:?}") };
        assert_eq!((gpu_errors, cpu_bad), (0, 0), "{len} bytes: consumer saw wrong bytes");
        let (release, _) = recv_msg::<Msg>(&conn, IO);
        let Msg::Release { key } = release else { panic!("unexpected {release:?}") };
        p.pool.release(key, consumer_holder()).unwrap();
        // The consumer wrote seed+1000 into the block: check it here, byte by byte.
        let host = d2h(&p.gpu, &p.stream, published.addr(), len);
        assert_eq!(check_pattern(&host, 0, seed + 1000), None, "{len} bytes: producer saw wrong reply bytes");
        println!("export/import {} MiB: consumer read all bytes right, producer read the reply right", len / MIB);
    }
    send_msg(&conn, &Msg::Done, &[]);
    wait_child(child, "consumer", IO);
}

#[test]
fn gpu_stream_ordering_slow_producer_and_negative_control() {
    let Some(gpu) = gpu_or_skip("gpu_stream_ordering_slow_producer_and_negative_control") else { return };
    let _watchdog = watchdog_guard("gpu_stream_ordering", Duration::from_secs(120));
    let p = Producer::new(gpu, PoolConfig::default());
    let (_l, child, conn) = start_consumer("consumer");
    for (i, mode) in [Mode::OrderedOnStream, Mode::OrderedOnLegacyDefault].into_iter().enumerate() {
        let seed = 7 + i as u64;
        let len = 8 * MIB;
        let published = p.publish(len, seed, |p, ptr| {
            // Zero the block, then keep the producer's stream busy for 300 ms before
            // the fill: a consumer that does not wait reads zeros.
            // SAFETY: the guard's block is mapped with ≥ len bytes.
            unsafe { sys::memset_d8_async(ptr, 0, len, p.stream.cu_stream()) }.unwrap();
            p.kernels.spin(&p.stream, SPIN_NS).unwrap();
        });
        let sent = Instant::now();
        p.send(&conn, &published, seed, mode);
        let (checked, _) = recv_msg::<Msg>(&conn, IO);
        let Msg::Checked { gpu_errors, cpu_bad, unordered_errors, waited_ms } = checked else { panic!("{checked:?}") };
        println!(
            "{mode:?}: ordered read errors gpu={gpu_errors} cpu={cpu_bad}; unordered read errors={unordered_errors}; consumer waited {waited_ms:.1} ms"
        );
        assert_eq!((gpu_errors, cpu_bad), (0, 0), "{mode:?}: the ordered read saw unfinished data");
        assert!(unordered_errors > (len as u64) / 2, "{mode:?}: negative control did not see unfinished data");
        assert!(waited_ms >= 150.0, "{mode:?}: the consumer did not wait for the producer ({waited_ms} ms)");
        assert!(sent.elapsed() >= Duration::from_millis(150));
        let (release, _) = recv_msg::<Msg>(&conn, IO);
        let Msg::Release { key } = release else { panic!("{release:?}") };
        p.pool.release(key, consumer_holder()).unwrap();
    }
    send_msg(&conn, &Msg::Done, &[]);
    wait_child(child, "consumer", IO);
}

#[test]
fn gpu_block_not_reused_while_consumer_kernel_reads_it() {
    let Some(gpu) = gpu_or_skip("gpu_block_not_reused_while_consumer_kernel_reads_it") else { return };
    let _watchdog = watchdog_guard("gpu_reuse", Duration::from_secs(120));
    let cfg = PoolConfig { max_blocks: 1, loan_timeout_ms: 20_000, ..PoolConfig::default() };
    let p = Arc::new(Producer::new(gpu, cfg));
    let (_l, child, conn) = start_consumer("consumer");
    let conn = Arc::new(conn);
    let len = 8 * MIB;
    let published = p.publish(len, 11, |_, _| {});
    let first = published.key();
    p.send(&conn, &published, 11, Mode::SlowReader);
    drop(published);
    // Releases arrive on the control connection while the main thread is blocked in
    // loan(): serve them on another thread, as the transport does.
    let (p2, c2) = (Arc::clone(&p), Arc::clone(&conn));
    let releaser = std::thread::spawn(move || {
        let (release, _) = recv_msg::<Msg>(&c2, IO);
        let Msg::Release { key } = release else { panic!("{release:?}") };
        p2.pool.release(key, consumer_holder()).unwrap();
        Instant::now()
    });
    let t = Instant::now();
    // The only block is held by the consumer: this loan must wait for its release,
    // which the consumer sends only after its slow kernel has finished reading.
    let again = p.publish(len, 22, |_, _| {});
    let waited = t.elapsed();
    let released_at = releaser.join().unwrap();
    sync(&p.gpu, &p.stream);
    println!("reuse: loan waited {:.1} ms for the consumer's release", waited.as_secs_f64() * 1e3);
    assert_eq!(again.key().id, first.id);
    assert_eq!(again.key().generation, first.generation + 1);
    assert!(waited >= Duration::from_millis(150), "block reused after only {waited:?}");
    assert!(released_at <= Instant::now());
    send_msg(&conn, &Msg::Go, &[]);
    let (checked, _) = recv_msg::<Msg>(&conn, IO);
    let Msg::Checked { cpu_bad, gpu_errors, .. } = checked else { panic!("{checked:?}") };
    assert_eq!((gpu_errors, cpu_bad), (0, 0), "the consumer's copy was overwritten by the reuse");
    send_msg(&conn, &Msg::Done, &[]);
    wait_child(child, "consumer", IO);
}

#[test]
fn gpu_publisher_hold_waits_for_its_own_pending_writes() {
    let Some(gpu) = gpu_or_skip("gpu_publisher_hold_waits_for_its_own_pending_writes") else { return };
    let _watchdog = watchdog_guard("gpu_own_fence", Duration::from_secs(60));
    let p = Producer::new(gpu, PoolConfig { max_blocks: 1, loan_timeout_ms: 20_000, ..PoolConfig::default() });
    let published = p.publish(2 * MIB, 1, |p, _| p.kernels.spin(&p.stream, SPIN_NS).unwrap());
    let key = published.key();
    drop(published);
    let t = Instant::now();
    let loan = p.pool.loan(2 * MIB).unwrap();
    let waited = t.elapsed();
    assert_eq!(loan.key().generation, key.generation + 1);
    assert!(waited >= Duration::from_millis(150), "reused under pending writes after {waited:?}");
    assert_eq!(p.pool.stats().pending_fences, 0);
}

#[test]
fn gpu_fence_events_are_reused_and_wait_for_their_latest_record_only() {
    let Some(gpu) = gpu_or_skip("gpu_fence_events_are_reused_and_wait_for_their_latest_record_only") else { return };
    let _watchdog = watchdog_guard("gpu_fence_reuse", Duration::from_secs(60));
    let k = Kernels::load(&gpu).unwrap();
    let (busy, idle) = (gpu.new_stream().unwrap(), gpu.new_stream().unwrap());
    // A fence behind 300 ms of work, dropped before the work is done: its event is kept.
    k.spin(&busy, SPIN_NS).unwrap();
    let behind = Fence::record(&gpu, &busy).unwrap();
    assert!(!behind.is_complete().unwrap());
    let spares = gpu.spare_events();
    drop(behind);
    assert_eq!(gpu.spare_events(), spares + 1, "a dropped fence's event is kept");
    // Recorded again on an idle stream, the same event completes at once: it does not
    // wait for the work of its earlier record.
    let t = Instant::now();
    let reused = Fence::record(&gpu, &idle).unwrap();
    assert_eq!(gpu.spare_events(), spares, "a new fence takes a kept event");
    reused.wait().unwrap();
    assert!(t.elapsed() < Duration::from_millis(150), "a reused event waited {:?} for its earlier record", t.elapsed());
    assert!(!Fence::record(&gpu, &busy).unwrap().is_complete().unwrap(), "the spin is still running");
    // Ordering one stream after another through kept events: the idle stream's new work
    // waits for the spin (negative control: without the order it would not).
    k.spin(&busy, SPIN_NS).unwrap();
    let t = Instant::now();
    Fence::record(&gpu, &idle).unwrap().wait().unwrap();
    assert!(t.elapsed() < Duration::from_millis(150), "unordered work waited {:?}", t.elapsed());
    Fence::order_after(&gpu, &idle, &busy).unwrap();
    let after = Fence::record(&gpu, &idle).unwrap();
    assert!(!after.is_complete().unwrap(), "ordered work completed before the spin");
    after.wait().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150), "ordered work completed after {:?}", t.elapsed());
}

#[test]
fn gpu_nothing_left_behind() {
    let Some(_gpu) = gpu_or_skip("gpu_nothing_left_behind") else { return };
    let _watchdog = watchdog_guard("gpu_leaks", Duration::from_secs(120));
    // Counted in a fresh process, so no other test's threads or descriptors interfere.
    let child = spawn_child("child_entry", "leaks", &[]);
    wait_child(child, "leak-check child", Duration::from_secs(100));
}

fn leak_check() {
    let gpu = Gpu::probe().expect("GPU in the leak-check child");
    let fds = open_fd_count().unwrap();
    let threads = thread_count().unwrap();
    let (free0, _) = gpu.mem_info().unwrap();
    {
        let pool = Pool::new(CudaBackend::new(gpu.clone()), PoolConfig::default()).unwrap();
        let signals = Arc::new(ReadySignals::create(&gpu).unwrap());
        let stream = gpu.new_stream().unwrap();
        let mut imports = Vec::new();
        for len in [2 * MIB, 64 * MIB, 256 * MIB] {
            let guard = WriteGuard::new(pool.loan(len).unwrap(), stream.clone(), Arc::clone(&signals));
            let published = guard.finish().unwrap();
            let fd = published.memory().fd().try_clone_to_owned().unwrap();
            imports.push((ImportedBlock::import(&gpu, fd, published.memory().size()).unwrap(), published));
        }
        let (free_mid, _) = gpu.mem_info().unwrap();
        assert!(free_mid + (320 * MIB) <= free0, "allocations did not show in cuMemGetInfo");
        drop(imports);
        drop(signals);
        sync(&gpu, &stream);
        assert_eq!(pool.trim(), 3);
    }
    let t = Instant::now();
    while thread_count().unwrap() > threads {
        assert!(t.elapsed() < Duration::from_secs(5), "a thread outlived the pool");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (free1, _) = gpu.mem_info().unwrap();
    println!(
        "leaks: fds {fds} -> {}, threads {threads} -> {}, free {free0} -> {free1}",
        open_fd_count().unwrap(),
        thread_count().unwrap()
    );
    assert_eq!(open_fd_count().unwrap(), fds, "descriptors leaked");
    assert!(free1 + 2 * MIB >= free0, "device memory leaked: {free0} -> {free1}");
}

/// Entry point of child processes; ignored in normal runs.
#[test]
#[ignore = "entry point of child processes started by the tests above"]
fn child_entry() {
    match child_role().as_deref() {
        Some("consumer") => consumer(),
        Some("leaks") => leak_check(),
        other => panic!("unknown child role {other:?}"),
    }
}

fn consumer() {
    let _watchdog = watchdog_guard("consumer child", Duration::from_secs(280));
    let gpu = Gpu::probe().expect("GPU in the consumer child");
    let name = SocketName::from_key_chunk(&std::env::var(SOCK_ENV).unwrap()).unwrap();
    let conn = Arc::new(ControlConn::connect(&name, IO).unwrap());
    let kernels = Kernels::load(&gpu).unwrap();
    let counter = Counter::new(&gpu);
    let mut signals: Option<ReadySignals> = None;
    loop {
        let (msg, mut frame) = recv_msg::<Msg>(&conn, IO);
        let received = Instant::now();
        let Msg::Block { key, size, len, signal_size, seed, mode } = msg else {
            assert!(matches!(msg, Msg::Done), "unexpected {msg:?}");
            return;
        };
        assert_eq!(frame.fds.len(), 2, "block and signal descriptors");
        let signal_fd = frame.fds.pop().unwrap();
        let block_fd = frame.fds.pop().unwrap();
        // Import the signal block once per publisher, the data block once per block.
        let sig = signals.get_or_insert_with(|| ReadySignals::import(&gpu, signal_fd, signal_size as usize).unwrap());
        let block = Arc::new(ImportedBlock::import(&gpu, block_fd, size as usize).unwrap());
        let len = len as usize;
        let stream = match mode {
            Mode::OrderedOnLegacyDefault => gpu.legacy_default_stream(),
            _ => gpu.new_stream().unwrap(),
        };
        let mut unordered_errors = 0;
        if matches!(mode, Mode::OrderedOnStream | Mode::OrderedOnLegacyDefault) {
            // Negative control: read on a separate non-blocking stream without waiting.
            let side = gpu.new_stream().unwrap();
            unordered_errors = check_both(&gpu, &kernels, &counter, &side, block.device_ptr(), len, seed).0;
        }
        let guard = ReadGuard::begin(sig, Arc::clone(&block), key.id, key.generation, 0, len, stream.clone()).unwrap();
        match mode {
            Mode::RoundTrip | Mode::OrderedOnStream | Mode::OrderedOnLegacyDefault => {
                let (gpu_errors, cpu_bad) =
                    check_both(&gpu, &kernels, &counter, &stream, guard.device_ptr(), len, seed);
                let waited_ms = received.elapsed().as_secs_f64() * 1e3;
                if matches!(mode, Mode::RoundTrip) {
                    // Write a reply pattern: the producer checks it after the release.
                    // SAFETY: the block is mapped read-write here with ≥ len bytes and
                    // stays mapped (Arc) until after the fence wait below.
                    unsafe { kernels.fill(&stream, guard.device_ptr(), len as u64, seed + 1000) }.unwrap();
                }
                let fence = guard.end().unwrap();
                fence.wait().unwrap();
                send_msg(&conn, &Msg::Checked { gpu_errors, cpu_bad, unordered_errors, waited_ms }, &[]);
                send_msg(&conn, &Msg::Release { key }, &[]);
            }
            Mode::SlowReader => {
                let private = DeviceBlock::allocate(&gpu, len).unwrap();
                kernels.spin(&stream, SPIN_NS).unwrap();
                gpu.bind().unwrap();
                // SAFETY: both ranges are mapped with ≥ len bytes and stay alive until
                // the fence below has completed.
                unsafe { sys::memcpy_dtod_async(private.device_ptr(), guard.device_ptr(), len, stream.cu_stream()) }
                    .unwrap();
                let fence = guard.end().unwrap();
                // Release only once the GPU has passed the read, from another thread,
                // as the subscriber's releaser does.
                let c2 = Arc::clone(&conn);
                let releaser = std::thread::spawn(move || {
                    fence.wait().unwrap();
                    send_msg(&c2, &Msg::Release { key }, &[]);
                });
                let (go, _) = recv_msg::<Msg>(&conn, IO);
                assert!(matches!(go, Msg::Go), "unexpected {go:?}");
                releaser.join().unwrap();
                let (gpu_errors, cpu_bad) =
                    check_both(&gpu, &kernels, &counter, &stream, private.device_ptr(), len, seed);
                send_msg(&conn, &Msg::Checked { gpu_errors, cpu_bad, unordered_errors: 0, waited_ms: 0.0 }, &[]);
            }
        }
        drop(block);
    }
}
