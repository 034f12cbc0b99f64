//! The memory a test body runs on, so that one body serves both: [`Host`] (sealed memfd
//! blocks, CI) and [`Cuda`] (CUDA VMM blocks, the GPU machine).
//!
//! A body is written once as `fn body<M: Medium>(test: &str)` and instantiated twice,
//! `body::<Host>` and `body::<Cuda>`. [`Medium::available`] is its gate: always true on
//! host memory; on CUDA the GPU gate ([`crate::gpu_or_skip`]), which prints
//! `SKIPPED <test>: <reason>` without a GPU and fails under `ZCS_REQUIRE_GPU=1`.
//! [`Pattern`] fills payloads with a pattern seeded by a number and checks received
//! samples against it: on the CPU for host blocks, with the fill and check kernels on
//! the GPU for device blocks. A child process learns its medium from its environment as
//! a [`MediumKind`] ([`MediumKind::name`], [`MediumKind::from_env`]).

use std::cell::Cell;

use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_memory::cuda::{DeviceBlock, Gpu, Kernels, Stream, sys};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{BackendKind, GpuLoan, GpuPublisher, GpuSample, GpuSession, ZcsConfig};

/// Which memory a test runs on, as a value: what a parent writes into a child's
/// environment and the child reads back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediumKind {
    /// Sealed memfd blocks (CI).
    Host,
    /// CUDA VMM blocks (the GPU machine).
    Cuda,
}

impl MediumKind {
    /// `host` or `cuda`, as a child process reads it back with [`MediumKind::from_env`].
    pub fn name(self) -> &'static str {
        match self {
            MediumKind::Host => "host",
            MediumKind::Cuda => "cuda",
        }
    }

    /// The session's device choice.
    pub fn device(self) -> DeviceChoice {
        match self {
            MediumKind::Host => DeviceChoice::Host,
            MediumKind::Cuda => DeviceChoice::Cuda,
        }
    }

    /// The backend a publisher of such a session reports.
    pub fn backend(self) -> BackendKind {
        match self {
            MediumKind::Host => BackendKind::HostMemfd,
            MediumKind::Cuda => BackendKind::CudaVmm,
        }
    }

    /// The medium a parent named in environment variable `var` (host when unset).
    pub fn from_env(var: &str) -> Self {
        match std::env::var(var).as_deref() {
            Ok("cuda") => MediumKind::Cuda,
            _ => MediumKind::Host,
        }
    }
}

/// The memory a test body runs on; see the module documentation.
pub trait Medium: 'static {
    /// The medium as a value (for child processes and medium-specific limits).
    const KIND: MediumKind;

    /// Whether the test can run here; `false` after printing `SKIPPED <test>: <reason>`
    /// (the test then returns). Panics where the medium is required but missing.
    fn available(test: &str) -> bool;

    /// [`Medium::KIND`] where the test can run; `None` after [`Medium::available`]
    /// printed why not: `let Some(kind) = M::gate(test) else { return };`.
    fn gate(test: &str) -> Option<MediumKind> {
        Self::available(test).then_some(Self::KIND)
    }

    /// `host` or `cuda`.
    fn name() -> &'static str {
        Self::KIND.name()
    }

    /// The session configuration: the medium's device choice, the rest defaults.
    fn config() -> ZcsConfig {
        ZcsConfig { device: Self::KIND.device(), ..ZcsConfig::default() }
    }

    /// Opens a session on this medium over `zenoh`.
    fn open(zenoh: zenoh::Config) -> GpuSession {
        GpuSession::open(zenoh, Self::config()).wait().unwrap_or_else(|e| panic!("{} session: {e}", Self::name()))
    }
}

/// Declares, for each line `body => host_test, cuda_test;`, the test `host_test` running
/// `body::<Host>("host_test")` and the test `cuda_test` running
/// `body::<Cuda>("cuda_test")`: one body, instantiated once per medium. `body` is a
/// function generic over [`Medium`] that takes the test's name (and gates itself with
/// [`Medium::gate`]); attributes before a line (doc comments) go on both tests.
#[macro_export]
macro_rules! medium_tests {
    ($($(#[$attr:meta])* $($body:ident)::+ => $host:ident, $cuda:ident;)*) => {
        $(
            $(#[$attr])*
            #[test]
            fn $host() {
                $($body)::+::<$crate::Host>(stringify!($host));
            }

            $(#[$attr])*
            #[test]
            fn $cuda() {
                $($body)::+::<$crate::Cuda>(stringify!($cuda));
            }
        )*
    };
}

/// Sealed memfd blocks; no GPU needed.
#[derive(Debug, Clone, Copy)]
pub struct Host;

/// CUDA VMM blocks on GPU 0.
#[derive(Debug, Clone, Copy)]
pub struct Cuda;

impl Medium for Host {
    const KIND: MediumKind = MediumKind::Host;

    fn available(_test: &str) -> bool {
        true
    }
}

impl Medium for Cuda {
    const KIND: MediumKind = MediumKind::Cuda;

    fn available(test: &str) -> bool {
        crate::gpu_or_skip(test).is_some()
    }
}

/// Fills loans with the pattern of a seed and checks samples against it, where the
/// session's memory is: the kernels on one stream with a device error counter for a
/// CUDA session, the CPU for a host-memory one.
pub enum Pattern {
    /// A CUDA session: fills and checks are kernels on `stream`; mismatches are counted
    /// into `counter` (a device `u32`) and read by [`Pattern::take_errors`].
    Cuda {
        /// The session's GPU.
        gpu: Gpu,
        /// The fill and check kernels.
        kernels: Kernels,
        /// The stream every fill and check is enqueued on.
        stream: Stream,
        /// The device mismatch counter (4 bytes).
        counter: DeviceBlock,
    },
    /// A host-memory session: the CPU fills and checks; mismatches add up here.
    Host {
        /// Mismatches since the last [`Pattern::take_errors`].
        errors: Cell<u64>,
    },
}

impl Pattern {
    /// The pattern tools for `session`'s memory.
    pub fn new(session: &GpuSession) -> Self {
        match session.gpu() {
            Some(gpu) => {
                let kernels = Kernels::load(gpu).expect("load kernels");
                let stream = gpu.new_stream().expect("stream");
                let counter = DeviceBlock::allocate(gpu, 4).expect("counter block");
                gpu.bind().expect("bind");
                // SAFETY: the counter block is mapped with ≥ 4 bytes on this device.
                unsafe { sys::memset_d8_async(counter.device_ptr(), 0, 4, stream.cu_stream()) }.expect("memset");
                Self::Cuda { gpu: gpu.clone(), kernels, stream, counter }
            }
            None => Self::Host { errors: Cell::new(0) },
        }
    }

    /// A loan bound to this pattern's stream (so work on it orders after our reads).
    pub fn loan(&self, p: &GpuPublisher, len: usize) -> GpuLoan {
        match self {
            Self::Cuda { stream, .. } => p.loan_on(len, stream),
            Self::Host { .. } => p.loan(len),
        }
        .expect("loan")
    }

    /// Fills the whole loan with the pattern of `seed`.
    pub fn fill(&self, loan: &mut GpuLoan, seed: u64) {
        match self {
            Self::Cuda { kernels, .. } => {
                let (ptr, len) = (loan.device_ptr().expect("CUDA loan"), loan.len() as u64);
                let stream = loan.stream().expect("CUDA loan");
                // SAFETY: the loan owns ≥ len mapped bytes until `put`, which orders
                // the ready signal after this launch on the loan's stream.
                unsafe { kernels.fill(stream, ptr, len, seed) }.expect("fill");
            }
            Self::Host { .. } => fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seed),
        }
    }

    /// Checks every byte of `s` against `seed`: the check kernel on our stream, after
    /// the publisher's ready signal (errors go to the device counter), or the CPU on a
    /// host sample. [`Pattern::take_errors`] returns the count.
    pub fn check(&self, s: &GpuSample, seed: u64) {
        match self {
            Self::Cuda { kernels, stream, counter, .. } => {
                let read = s.read(stream).expect("read the sample on our stream");
                assert_eq!(read.len(), s.len());
                // SAFETY: the read range is mapped and held by `s` until the fence that
                // `end` records after this launch; the counter is a mapped u32 owned by
                // `self`, which outlives the launch (take_errors synchronises).
                unsafe { kernels.check(stream, read.device_ptr(), read.len() as u64, seed, counter.device_ptr()) }
                    .expect("check kernel");
                read.end().expect("end the read");
            }
            Self::Host { errors } => {
                let bytes = s.host_bytes().expect("host bytes of a host sample");
                errors.set(errors.get() + check_pattern(&bytes, 0, seed).map_or(0, |(_, bad)| bad));
            }
        }
    }

    /// A relay step: checks the input against `in_seed` and fills `out` with
    /// `out_seed`, both on our stream, the fill after the check.
    pub fn relay(&self, s: &GpuSample, in_seed: u64, out: &mut GpuLoan, out_seed: u64) {
        match self {
            Self::Cuda { kernels, stream, counter, .. } => {
                let read = s.read(stream).expect("read the input on our stream");
                // SAFETY: as in `check`.
                unsafe { kernels.check(stream, read.device_ptr(), read.len() as u64, in_seed, counter.device_ptr()) }
                    .expect("check kernel");
                let out_stream = out.stream().expect("CUDA loan");
                assert!(Stream::ptr_eq(out_stream, stream), "the output loan is bound to our stream");
                let (ptr, len) = (out.device_ptr().expect("CUDA loan"), out.len() as u64);
                // SAFETY: the loan owns ≥ len mapped bytes until `put`, which orders the
                // ready signal after this launch (same stream as the check above).
                unsafe { kernels.fill(out_stream, ptr, len, out_seed) }.expect("fill");
                read.end().expect("end the read");
            }
            Self::Host { .. } => {
                self.check(s, in_seed);
                self.fill(out, out_seed);
            }
        }
    }

    /// Waits for everything enqueued on our stream (fills and ready signals included).
    pub fn synchronize(&self) {
        if let Self::Cuda { gpu, stream, .. } = self {
            gpu.bind().expect("bind");
            // SAFETY: a stream of the current context, owned by `self`.
            unsafe { sys::stream_synchronize(stream.cu_stream()) }.expect("synchronize");
        }
    }

    /// Mismatches counted since the last call (waits for the checks enqueued so far).
    pub fn take_errors(&self) -> u64 {
        match self {
            Self::Cuda { gpu, stream, counter, .. } => {
                let mut v = [0u8; 4];
                gpu.bind().expect("bind");
                // SAFETY: the counter is mapped with ≥ 4 bytes; `v` lives until the
                // synchronize below returns.
                unsafe { sys::memcpy_dtoh_async(v.as_mut_ptr(), counter.device_ptr(), 4, stream.cu_stream()) }
                    .expect("read the counter");
                // SAFETY: the counter is mapped with ≥ 4 bytes; ordered after the copy.
                unsafe { sys::memset_d8_async(counter.device_ptr(), 0, 4, stream.cu_stream()) }.expect("reset");
                // SAFETY: a stream of the current context.
                unsafe { sys::stream_synchronize(stream.cu_stream()) }.expect("synchronize");
                u64::from(u32::from_le_bytes(v))
            }
            Self::Host { errors } => errors.replace(0),
        }
    }

    /// Checks `s` against `seed` and returns its mismatches (waits for the check).
    pub fn mismatches(&self, s: &GpuSample, seed: u64) -> u64 {
        self.check(s, seed);
        self.take_errors()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_the_environment() {
        for (kind, var) in [(MediumKind::Host, "ZCS_MEDIUM_TEST_HOST"), (MediumKind::Cuda, "ZCS_MEDIUM_TEST_CUDA")] {
            // SAFETY: this test's own variables, set before any thread reads them and
            // read by no other test.
            unsafe { std::env::set_var(var, kind.name()) };
            assert_eq!(MediumKind::from_env(var), kind);
        }
        assert_eq!(MediumKind::from_env("ZCS_MEDIUM_TEST_UNSET"), MediumKind::Host, "unset: host");
        assert_eq!((Host::KIND.device(), Cuda::KIND.device()), (DeviceChoice::Host, DeviceChoice::Cuda));
        assert_eq!((Host::KIND.backend(), Cuda::KIND.backend()), (BackendKind::HostMemfd, BackendKind::CudaVmm));
        assert_eq!(Host::gate("host needs no GPU"), Some(MediumKind::Host));
    }

    #[test]
    fn the_host_pattern_counts_every_wrong_byte() {
        let port = crate::free_tcp_port();
        let session = Host::open(crate::loopback_zenoh_config(Some(port), None, None));
        let other = Host::open(crate::loopback_zenoh_config(None, Some(port), None));
        let pattern = Pattern::new(&session);
        assert!(matches!(pattern, Pattern::Host { .. }));
        let key = format!("zcs-test/medium/pattern/{}", std::process::id());
        let subscriber = other.declare_subscriber(key.clone()).wait().expect("subscriber");
        let publisher = session.declare_publisher(key).wait().expect("publisher");
        crate::wait_until("the subscriber", std::time::Duration::from_secs(20), || {
            publisher.zero_copy_subscribers() >= 1
        });
        let mut loan = pattern.loan(&publisher, 100_000);
        pattern.fill(&mut loan, 7);
        loan.as_mut_slice().expect("host loan")[10..13].iter_mut().for_each(|b| *b = !*b);
        publisher.put(loan).expect("put");
        let sample = subscriber.recv_timeout(std::time::Duration::from_secs(10)).expect("sample");
        assert_eq!(pattern.mismatches(&sample, 7), 3, "three bytes flipped");
        assert_eq!(pattern.take_errors(), 0, "taken once");
        assert!(pattern.mismatches(&sample, 8) > 99_000, "another seed: nearly every byte differs");
    }
}
