//! A publisher killed after sending a descriptor but before its stream wrote the ready
//! signal: the subscriber's stream, waiting on that signal, must not wait forever.
//!
//! The publisher (a child process) sends one normal frame, then loans a second block,
//! enqueues a 30 s spin kernel before the fill, puts it, and SIGKILLs itself: its context
//! is torn down and the signal write never runs. The subscriber (this process) starts a
//! read of the second frame on its stream at once. Without the dead-publisher handling
//! that stream would block for good (or 30 s, if a driver finished the dead context's
//! work); with it, the subscriber notices the publisher process is gone, writes the
//! awaited value into the signal slot it maps, and refuses further reads of that frame.

use std::time::{Duration, Instant};

use zcs_memory::cuda::kernels::check_pattern;
use zcs_memory::cuda::{Kernels, sys};
use zcs_tests::{child_role, free_tcp_port, gpu_or_skip, loopback_zenoh_config, spawn_child, watchdog_guard};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuSession, ReadError, ZcsConfig};

const NAME: &str = "gpu_reader_is_released_when_its_publisher_dies_before_signalling";
const KEY: &str = "zcs-test/dead/frame";
const PORT_ENV: &str = "ZCS_TEST_PORT";
const LEN: usize = 8 << 20;

fn cuda_config() -> ZcsConfig {
    ZcsConfig { device: DeviceChoice::Cuda, ..ZcsConfig::default() }
}

#[test]
fn gpu_reader_is_released_when_its_publisher_dies_before_signalling() {
    let Some(gpu) = gpu_or_skip(NAME) else { return };
    let _watchdog = watchdog_guard(NAME, Duration::from_secs(120));
    let port = free_tcp_port();
    let z = loopback_zenoh_config(Some(port), None, Some("zcs-test/dead"));
    let session = GpuSession::open(z, cuda_config()).wait().unwrap();
    let sub = session.declare_subscriber(KEY).wait().unwrap();
    let mut child = spawn_child("child_entry", "dead-publisher", &[(PORT_ENV, port.to_string())]);

    // Frame 1: signalled normally, read right.
    let first = sub.recv_timeout(Duration::from_secs(60)).expect("first frame");
    assert_eq!(first.seq(), 1);
    assert_eq!(check_pattern(&first.to_vec().unwrap(), 0, 1), None, "first frame content");

    // Frame 2: its publisher dies before signalling it. Start the read at once.
    let second = sub.recv_timeout(Duration::from_secs(60)).expect("second frame");
    assert_eq!(second.path(), zenoh_cuda_shm::Path::ZeroCopy);
    let stream = gpu.new_stream().unwrap();
    let t = Instant::now();
    match second.read(&stream) {
        Ok(read) => {
            read.end().unwrap();
            // The stream is now waiting on a signal nobody alive will write.
            let (tx, rx) = std::sync::mpsc::channel();
            let (g, s) = (gpu.clone(), stream.clone());
            std::thread::spawn(move || {
                g.bind().unwrap();
                // SAFETY: a stream of the current context.
                let r = unsafe { sys::stream_synchronize(s.cu_stream()) };
                let _ = tx.send(r.is_ok());
            });
            let status = child.wait().unwrap();
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "the publisher was SIGKILLed");
            let done =
                rx.recv_timeout(Duration::from_secs(15)).expect("the reader's stream still waits on a dead publisher");
            assert!(done, "the released stream completed with an error");
            println!("{NAME}: waiting stream released {:.0} ms after the read began", t.elapsed().as_secs_f64() * 1e3);
        }
        Err(ReadError::PublisherDied) => {
            let _ = child.wait();
            println!("{NAME}: the publisher's death was already known; the read was refused");
        }
        Err(e) => panic!("unexpected read error: {e}"),
    }
    // Once the death is known, reading that frame is refused rather than returning
    // incomplete data.
    let t = Instant::now();
    loop {
        match second.read(&gpu.new_stream().unwrap()) {
            Err(ReadError::PublisherDied) => break,
            Ok(r) => drop(r),
            Err(e) => panic!("unexpected read error: {e}"),
        }
        assert!(t.elapsed() < Duration::from_secs(10), "reads of the unready frame are still allowed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The frame signalled before the death still reads right.
    assert_eq!(check_pattern(&first.to_vec().unwrap(), 0, 1), None, "first frame after the death");
    assert!(sub.stats().evictions >= 1);
}

/// Entry point of the child process; ignored in normal runs.
#[test]
#[ignore = "entry point of the child process started by the test above"]
fn child_entry() {
    if child_role().as_deref() != Some("dead-publisher") {
        return;
    }
    let _watchdog = watchdog_guard("dead-publisher child", Duration::from_secs(100));
    let port: u16 = std::env::var(PORT_ENV).unwrap().parse().unwrap();
    let z = loopback_zenoh_config(None, Some(port), Some("zcs-test/dead"));
    let session = GpuSession::open(z, cuda_config()).wait().unwrap();
    let gpu = session.gpu().unwrap().clone();
    let kernels = Kernels::load(&gpu).unwrap();
    let publisher = session.declare_publisher(KEY).wait().unwrap();
    let t = Instant::now();
    while publisher.zero_copy_subscribers() < 1 {
        assert!(t.elapsed() < Duration::from_secs(30), "no zero-copy subscriber");
        std::thread::sleep(Duration::from_millis(10));
    }
    let loan = publisher.loan(LEN).unwrap();
    let stream = loan.stream().unwrap().clone();
    // SAFETY: the loan owns ≥ LEN mapped bytes until `put` orders the signal after this.
    unsafe { kernels.fill(&stream, loan.device_ptr().unwrap(), LEN as u64, 1) }.unwrap();
    publisher.put(loan).unwrap();
    stream.synchronize().unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let loan = publisher.loan(LEN).unwrap();
    kernels.spin(&stream, 30_000_000_000).unwrap();
    // SAFETY: as above.
    unsafe { kernels.fill(&stream, loan.device_ptr().unwrap(), LEN as u64, 2) }.unwrap();
    publisher.put(loan).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let me = std::process::id() as libc::pid_t;
    // SAFETY: signalling our own process; SIGKILL cannot be caught, nothing runs after.
    unsafe { libc::kill(me, libc::SIGKILL) };
}
