//! Pieces the benchmark binaries share, so that rows measured by different programs
//! are measured and printed the same way:
//!
//! - [`latency`]: the ping-pong loop (warm-up, time budget) and the `latency` JSON row;
//! - [`check`]: the consumer that makes each received frame ready on the GPU and runs
//!   the check kernel on it (or the CPU check without a GPU);
//! - clocks ([`now_ns`], [`cpu_secs`]) and the 16-byte stamp plain Zenoh puts carry
//!   ([`stamp`], [`parse_stamp`]);
//! - the throughput rows' frames, queues and bounds ([`frames`]), so that every
//!   program's throughput rows move the same frames the same way.
//!
//! ```text
//! zcs_latency / zcs_zenoh_shm   → latency::Plan (flags, rounds) + latency::row
//! zcs_throughput / zcs_zenoh_shm → check::Checker on every received frame
//! ```

pub mod frames {
    //! What every throughput row uses (`zcs_throughput`, `zcs_zenoh_shm`, `zcs_report`).
    use std::time::Duration;

    /// A 1080p RGB frame, in bytes.
    pub const FRAME_1080P_RGB: usize = 1920 * 1080 * 3;
    /// A 4K RGBA frame, in bytes.
    pub const FRAME_4K_RGBA: usize = 3840 * 2160 * 4;
    /// Channel capacity of every throughput subscriber (ours and plain): bounds the
    /// frames queued in a subscriber process.
    pub const SUB_FIFO: usize = 32;
    /// A subscriber that saw nothing for this long after the publisher finished gives up.
    pub const DRAIN_IDLE: Duration = Duration::from_secs(10);
    /// Longest life of a subscriber child process.
    pub const CHILD_LIMIT: Duration = Duration::from_secs(180);
    /// Bound on waiting for subscribers to be on a row's path.
    pub const ROUTE_TIMEOUT: Duration = Duration::from_secs(30);
}

/// Nanoseconds since the Unix epoch (the clock publication timestamps use; every
/// process on the host reads the same one).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// User + system CPU time of this process, in seconds.
pub fn cpu_secs() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage");
    // SAFETY: getrusage succeeded, so it initialised the struct (zeroed before anyway).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The 16-byte attachment of plain puts: sequence number (the pattern's seed) and the
/// time the frame's production started (ns since the epoch).
pub fn stamp(seq: u64, ts_ns: u64) -> Vec<u8> {
    [seq.to_le_bytes(), ts_ns.to_le_bytes()].concat()
}

/// The `(seq, ts_ns)` of a [`stamp`]; `None` if `b` is shorter than 16 bytes.
pub fn parse_stamp(b: &[u8]) -> Option<(u64, u64)> {
    Some((u64::from_le_bytes(b.get(..8)?.try_into().ok()?), u64::from_le_bytes(b.get(8..16)?.try_into().ok()?)))
}

/// The `(seq, ts_ns)` of what a plain subscriber receives: from our publishers' attachment
/// (sequence number and publication time of its `BytesHeader`), else from a [`stamp`].
pub fn parse_any_stamp(b: &[u8]) -> Option<(u64, u64)> {
    match zcs_wire::protocol::decode_attachment(b) {
        Ok(Some(h)) => Some((h.seq, h.timestamp_ns)),
        Ok(None) => parse_stamp(b),
        Err(_) => None,
    }
}

/// Writes `seq`'s pattern into the whole of `loan`: the fill kernel on the loan's stream
/// for a device block (with `kernels`), the CPU for a host block.
pub fn fill_loan(loan: &mut zenoh_cuda_shm::GpuLoan, kernels: Option<&zcs_memory::cuda::Kernels>, seq: u64) {
    match (kernels, loan.device_ptr()) {
        (Some(k), Some(ptr)) => {
            // SAFETY: the loan owns `len()` mapped bytes until its `put`, which orders the
            // ready signal after this launch on the loan's stream.
            unsafe { k.fill(loan.stream().expect("CUDA loan"), ptr, loan.len() as u64, seq) }.expect("fill")
        }
        _ => zcs_memory::cuda::kernels::fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq),
    }
}

/// Loans a block of `size` bytes, trying again past the pool's loan timeout while
/// subscribers hold every block, for up to `limit`.
pub fn loan_waiting(
    p: &zenoh_cuda_shm::GpuPublisher,
    size: usize,
    limit: std::time::Duration,
) -> zenoh_cuda_shm::GpuLoan {
    let t = std::time::Instant::now();
    loop {
        match p.loan(size) {
            Ok(l) => return l,
            Err(zcs_pool::LoanError::Exhausted { .. }) if t.elapsed() < limit => {}
            Err(e) => panic!("{}: loan of {size} bytes: {e}", p.key()),
        }
    }
}

pub mod latency {
    //! The ping side of a ping-pong latency row: rounds under a time budget, and the
    //! `latency` JSON line `zcs_report` reads.

    use std::time::{Duration, Instant};

    use serde_json::json;
    use zcs_tests::percentile;

    /// Round trips and pong-measured one-way latencies of a row, sorted, in µs.
    #[derive(Debug, Clone, Default)]
    pub struct Samples {
        /// Round trips.
        pub rtt: Vec<f64>,
        /// One-way latencies the pong measured from the publication timestamp.
        pub one_way: Vec<f64>,
    }

    /// The latency rows' sizes and rounds: the same flags in every ping-pong program.
    #[derive(clap::Args, Debug, Clone)]
    pub struct Plan {
        /// Payload sizes of the latency rows (bytes, or with a KiB/MiB/GiB suffix).
        #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,8MiB,32MiB,256MiB,1GiB", value_parser = zcs_tests::parse_size)]
        pub sizes: Vec<usize>,
        /// Timed round trips per row (fewer if a row reaches --max-secs).
        #[arg(long, default_value_t = 1000)]
        pub iters: usize,
        /// Untimed round trips first (fewer if they take a quarter of --max-secs).
        #[arg(long, default_value_t = 50)]
        pub warmup: usize,
        /// Time budget per row, in seconds (at least 5 timed round trips are made).
        #[arg(long, default_value_t = 8.0)]
        pub max_secs: f64,
    }

    impl Plan {
        /// [`rounds`] with this plan's warm-up, rounds and budget.
        pub fn rounds(&self, one: impl FnMut() -> (Duration, f64)) -> Samples {
            rounds(self.warmup, self.iters, self.max_secs, one)
        }
    }

    /// Runs `one` `warmup` times (stopping early after a quarter of `max_secs`), then
    /// `iters` timed rounds (stopping early after `max_secs`, with at least 5). `one`
    /// returns the round trip and the one-way latency the pong measured, in µs.
    pub fn rounds(warmup: usize, iters: usize, max_secs: f64, mut one: impl FnMut() -> (Duration, f64)) -> Samples {
        let budget = Duration::from_secs_f64(max_secs);
        let t = Instant::now();
        for _ in 0..warmup {
            one();
            if t.elapsed() > budget / 4 {
                break;
            }
        }
        let t = Instant::now();
        let mut out = Samples { rtt: Vec::with_capacity(iters), one_way: Vec::with_capacity(iters) };
        for i in 0..iters {
            let (rtt, one_way) = one();
            out.rtt.push(rtt.as_secs_f64() * 1e6);
            out.one_way.push(one_way);
            if i + 1 >= 5 && t.elapsed() > budget {
                break;
            }
        }
        out.rtt.sort_by(f64::total_cmp);
        out.one_way.sort_by(f64::total_cmp);
        out
    }

    /// Prints one `latency` row: RTT/2 and measured one-way p50/p99/max, plus `extra`'s
    /// fields.
    pub fn row(path: &str, backend: &str, size: usize, s: &Samples, extra: serde_json::Value) {
        let (rtt, ow) = (&s.rtt, &s.one_way);
        let mut out = json!({
            "bench": "latency",
            "path": path,
            "backend": backend,
            "size": size,
            "n": rtt.len(),
            "one_way_p50_us": percentile(rtt, 50.0) / 2.0,
            "one_way_p99_us": percentile(rtt, 99.0) / 2.0,
            "one_way_max_us": rtt.last().copied().unwrap_or(f64::NAN) / 2.0,
            "rtt_p50_us": percentile(rtt, 50.0),
            "measured_one_way_p50_us": percentile(ow, 50.0),
            "measured_one_way_p99_us": percentile(ow, 99.0),
            "measured_one_way_max_us": ow.last().copied().unwrap_or(f64::NAN),
        });
        if let (Some(o), Some(e)) = (out.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        println!("{out}");
    }
}

pub mod check {
    //! The subscriber's work on every frame: make it ready on the GPU and run
    //! `Kernels::check` against the publisher's pattern, then synchronise; without a GPU
    //! (`--backend host`), the same pattern check on the CPU.

    use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
    use zcs_memory::cuda::{DeviceBlock, Gpu, Kernels, Stream, sys};
    use zenoh_cuda_shm::{GpuSample, ReadError};

    /// Mean host time per frame in each step (µs): where a frame's time goes.
    #[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
    pub struct Stages(pub std::collections::BTreeMap<String, f64>);

    /// Accumulates the host time of named steps over frames.
    #[derive(Debug)]
    pub struct StageClock {
        ns: std::collections::BTreeMap<&'static str, u64>,
        /// Frames timed.
        pub frames: u64,
        mark: std::time::Instant,
    }

    impl Default for StageClock {
        fn default() -> Self {
            Self { ns: Default::default(), frames: 0, mark: std::time::Instant::now() }
        }
    }

    impl StageClock {
        /// Starts timing a frame's first step.
        pub fn start(&mut self) {
            self.mark = std::time::Instant::now();
        }

        /// Adds the time since the last mark to `step` and moves the mark to now.
        pub fn lap(&mut self, step: &'static str) {
            let now = std::time::Instant::now();
            *self.ns.entry(step).or_default() += now.duration_since(self.mark).as_nanos() as u64;
            self.mark = now;
        }

        /// The mean time per frame of each step.
        pub fn means(&self) -> Stages {
            let n = self.frames.max(1) as f64;
            Stages(self.ns.iter().map(|(k, v)| ((*k).to_owned(), *v as f64 / n / 1e3)).collect())
        }
    }

    /// The GPU half of a [`Checker`].
    struct DevCheck {
        gpu: Gpu,
        kernels: Kernels,
        stream: Stream,
        /// One `u32` error counter, accumulated over every frame.
        counter: DeviceBlock,
        /// Reused destination of host→device copies (bytes paths).
        staging: Option<DeviceBlock>,
    }

    /// Runs the check on every frame: `Kernels::check` on the GPU, or the CPU pattern
    /// check without one (`--backend host`).
    pub struct Checker {
        dev: Option<DevCheck>,
        cpu_errors: u64,
        /// Host time per frame of the steps of [`Checker::sample`] (`read`,
        /// `check_launch`, `end`, `synchronize`), and of whatever steps the caller laps.
        pub clock: StageClock,
    }

    impl Checker {
        /// A checker on `gpu`'s own stream, or on the CPU when `gpu` is `None`.
        pub fn new(gpu: Option<Gpu>) -> Self {
            let dev = gpu.map(|gpu| {
                let kernels = Kernels::load(&gpu).expect("load kernels");
                let stream = gpu.new_stream().expect("stream");
                let counter = DeviceBlock::allocate(&gpu, 4).expect("counter");
                gpu.bind().expect("bind");
                // SAFETY: the counter block is mapped with ≥ 4 bytes; a stream of the context.
                unsafe { sys::memset_d8_async(counter.device_ptr(), 0, 4, stream.cu_stream()) }.expect("memset");
                DevCheck { gpu, kernels, stream, counter, staging: None }
            });
            Self { dev, cpu_errors: 0, clock: StageClock::default() }
        }

        /// Checks one frame of its own (on the GPU: the first launch of the check kernel
        /// and the staging block), so that a timed first sample does not pay for them,
        /// as it would not in an application that has been running.
        pub fn warm_up(&mut self) {
            let mut frame = vec![0u8; 64 << 10];
            fill_pattern(&mut frame, 0, 1);
            self.host(&frame, 1);
            self.clock = StageClock::default();
        }

        /// A frame in host memory: host→device into the staging buffer, then the kernel
        /// and a synchronize (GPU); or the CPU check. `bytes` may be pageable or pinned
        /// (registered) memory.
        pub fn host(&mut self, bytes: &[u8], seed: u64) {
            let Some(d) = &mut self.dev else {
                self.cpu_errors += check_pattern(bytes, 0, seed).map_or(0, |(_, bad)| bad);
                return;
            };
            if d.staging.as_ref().is_none_or(|s| s.size() < bytes.len()) {
                d.staging = Some(DeviceBlock::allocate(&d.gpu, bytes.len().max(1)).expect("staging block"));
            }
            let dst = d.staging.as_ref().expect("staging").device_ptr();
            d.gpu.bind().expect("bind");
            // SAFETY: `dst` has ≥ len bytes (allocated above); `bytes` is borrowed for
            // this whole call, which synchronises the stream before returning, so the
            // source stays valid until the copy completes (pageable memory is staged by
            // the driver before the call returns anyway).
            unsafe { sys::memcpy_htod_async(dst, bytes.as_ptr(), bytes.len(), d.stream.cu_stream()) }.expect("H2D");
            d.check(dst, bytes.len(), seed);
            d.sync();
        }

        /// A sample of ours in host memory, checked on the CPU a page at a time: the first
        /// 8 bytes of every 4 KiB page (every page touched, 1/512 of the bytes compared).
        /// For consumers without a GPU at frame rates no full CPU check keeps up with.
        pub fn host_pages(&mut self, s: &GpuSample) {
            self.pages(&s.host_bytes().expect("a host-memory sample"), s.seq());
        }

        /// Host bytes checked as by [`Checker::host_pages`], against `seed`'s pattern.
        pub fn pages(&mut self, b: &[u8], seed: u64) {
            for start in (0..b.len()).step_by(4096) {
                let page = &b[start..b.len().min(start + 8)];
                self.cpu_errors += check_pattern(page, start as u64, seed).map_or(0, |(_, bad)| bad);
            }
        }

        /// A sample of ours. A CUDA session's samples are read on the GPU whatever their
        /// path (`GpuSample::read`: in place, or copied there for bytes samples); a host
        /// session's as host bytes, copied to the checker's GPU if it has one.
        pub fn sample(&mut self, s: &GpuSample) {
            let read = match &self.dev {
                Some(d) => match s.read(&d.stream) {
                    Ok(read) => Some(read),
                    Err(ReadError::NoGpu) => None,
                    Err(e) => panic!("read: {e}"),
                },
                None => None,
            };
            let Some(read) = read else {
                return self.host(&s.host_bytes().expect("a host-memory sample"), s.seq());
            };
            let d = self.dev.as_ref().expect("a read needs the checker's GPU");
            self.clock.lap("read");
            d.check(read.device_ptr(), read.len(), s.seq());
            self.clock.lap("check_launch");
            read.end().expect("end");
            self.clock.lap("end");
            d.sync();
            self.clock.lap("synchronize");
        }

        /// Bytes that differed from the pattern, over every frame checked.
        pub fn errors(&self) -> u64 {
            let Some(d) = &self.dev else { return self.cpu_errors };
            let mut errs = [0u8; 4];
            d.gpu.bind().expect("bind");
            // SAFETY: `errs` has 4 bytes and lives until the synchronize; the counter is mapped.
            unsafe { sys::memcpy_dtoh_async(errs.as_mut_ptr(), d.counter.device_ptr(), 4, d.stream.cu_stream()) }
                .expect("D2H");
            d.sync();
            u64::from(u32::from_le_bytes(errs))
        }
    }

    impl DevCheck {
        fn check(&self, ptr: u64, len: usize, seed: u64) {
            // SAFETY: `ptr..ptr+len` is mapped (a read in progress or the staging block)
            // and stays so until the synchronize that follows; the counter is a mapped u32.
            unsafe { self.kernels.check(&self.stream, ptr, len as u64, seed, self.counter.device_ptr()) }
                .expect("check");
        }

        fn sync(&self) {
            self.gpu.bind().expect("bind");
            // SAFETY: a stream of the current context.
            unsafe { sys::stream_synchronize(self.stream.cu_stream()) }.expect("synchronize");
        }
    }
}
