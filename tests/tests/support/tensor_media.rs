//! What the tensor test (`tensor.rs`) does differently on host memory and on the GPU:
//! [`TensorMedium`], implemented for [`Host`] and [`Cuda`]. Host memory: the payload is
//! read in place through `host_tensor`, the C consumer reads the exported data itself,
//! and descriptions a host publisher must refuse are tried first. CUDA: cases published
//! from device memory, views on a stream and device→device copies, exports for several
//! consumer streams read back on those streams, and the slow producer that checks the
//! consumer-stream synchronisation.

use std::any::Any;
use std::cell::Cell;
use std::time::{Duration, Instant};

use zcs_memory::cuda::{DeviceBlock, Gpu, Kernels, Stream, sys};
use zcs_tests::{Cuda, Host, Medium};
use zenoh_cuda_shm::dlpack::{ConsumerStream, ImportError, ManagedTensorVersioned};
use zenoh_cuda_shm::tensor_codec::{DType, Device, EncodeError, MetaError, TensorMeta};
use zenoh_cuda_shm::{BackendKind, GpuPublisher, GpuSample, GpuSession, Path, PutReport, TensorPublishError};

use super::dlpack_ffi::{delete_versioned_in_c, inspect_versioned, zcs_dlpack_make_versioned};
use super::tensor_support::{Case, Consumer, check_summary, gather};

/// DLPack's `kDLCPU` and `kDLCUDA`.
pub const K_DL_CPU: i32 = 1;
/// DLPack's `kDLCUDA`.
pub const K_DL_CUDA: i32 = 2;
/// How long the slow producer's stream spins before it writes the data.
const SPIN_NS: u64 = 300_000_000;

/// A buffer placed where the medium's producer keeps its tensors.
pub struct Staged {
    /// Keeps the memory alive.
    pub _owner: Box<dyn Any>,
    /// Its address (host or device).
    pub ptr: *mut std::ffi::c_void,
}

/// The medium-specific half of the tensor test; see the module documentation.
pub trait TensorMedium: Medium {
    /// Whether cases can be published from device memory (`How::Device`).
    const DEVICE_COPIES: bool;
    /// The path a DLPack import below the inline threshold arrives on.
    const SMALL_IMPORT_PATH: Path;
    /// Whether the C consumer reads an export's data itself (host memory).
    const C_READS_DATA: bool;
    /// DLPack's device type for this medium.
    const DL_DEVICE_TYPE: i32;
    /// The publisher's and subscriber's tools: the GPU and a stream on CUDA. The
    /// subscriber's stream outlives every export (a raw-stream export fences it in its
    /// deleter).
    type Tools;

    /// The tools for `session`.
    fn tools(session: &GpuSession) -> Self::Tools;
    /// The device descriptions name.
    fn device(tools: &Self::Tools) -> Device;
    /// Descriptions the publisher refuses before anything is sent.
    fn refusals(publisher: &GpuPublisher);
    /// Publishes `case` from device memory (`How::Device`).
    fn put_from_device(tools: &Self::Tools, publisher: &GpuPublisher, case: &Case) -> PutReport;
    /// Places a DLPack producer's buffer in the medium's memory.
    fn stage(tools: &Self::Tools, bytes: &[u8]) -> Staged;
    /// The stream a DLPack import is published on.
    fn import_stream(tools: &Self::Tools) -> Option<&Stream>;
    /// Sends what comes after the shared messages, once `go` arrives.
    fn publisher_tail(tools: &Self::Tools, publisher: &GpuPublisher, go: &dyn Fn(), next: &mut dyn FnMut(PutReport));
    /// Checks the reads of `case` in place and the copies that only this medium has.
    fn check_reads(tools: &Self::Tools, sample: &GpuSample, case: &Case);
    /// The payload's first byte in this process.
    fn payload_address(tools: &Self::Tools, sample: &GpuSample) -> u64;
    /// The consumer stream of a case's versioned export, and the stream to read it on.
    fn consumer(tools: &Self::Tools, c: Consumer) -> (ConsumerStream, Option<Stream>);
    /// The consumer stream of a legacy export, and the stream to read it on.
    fn legacy_consumer(tools: &Self::Tools) -> (ConsumerStream, Option<Stream>);
    /// `len` bytes of an export at `ptr`: what the C consumer copied on host memory, a
    /// device→host copy on `on` on the GPU.
    fn read(tools: &Self::Tools, on: Option<&Stream>, ptr: u64, len: usize, c_copy: Vec<u8>) -> Vec<u8>;
    /// What the subscriber checks after the shared messages (the `n`th was the last).
    fn subscriber_tail(tools: &Self::Tools, go: &dyn Fn(), recv: &dyn Fn() -> GpuSample, n: u64);
}

impl TensorMedium for Host {
    const DEVICE_COPIES: bool = false;
    const SMALL_IMPORT_PATH: Path = Path::Inline;
    const C_READS_DATA: bool = true;
    const DL_DEVICE_TYPE: i32 = K_DL_CPU;
    type Tools = ();

    fn tools(_session: &GpuSession) {}

    fn device(_tools: &()) -> Device {
        Device::CPU
    }

    fn refusals(publisher: &GpuPublisher) {
        host_refusals(publisher);
    }

    fn put_from_device(_tools: &(), _publisher: &GpuPublisher, case: &Case) -> PutReport {
        panic!("{}: no device memory on host", case.name)
    }

    fn stage(_tools: &(), bytes: &[u8]) -> Staged {
        let mut owned = bytes.to_vec().into_boxed_slice();
        let ptr = owned.as_mut_ptr().cast();
        Staged { _owner: Box::new(owned), ptr }
    }

    fn import_stream(_tools: &()) -> Option<&Stream> {
        None
    }

    fn publisher_tail(_tools: &(), _publisher: &GpuPublisher, _go: &dyn Fn(), _next: &mut dyn FnMut(PutReport)) {}

    fn check_reads(_tools: &(), sample: &GpuSample, case: &Case) {
        let name = case.name;
        let meta = &case.meta;
        let strides = meta.effective_strides().unwrap();
        let item = meta.dtype.itemsize().unwrap() as usize;
        // In place (host bytes): every value through the strides.
        let host = sample.host_tensor().unwrap();
        assert_eq!(host.payload(), case.payload.as_slice(), "{name}: payload bytes");
        assert_eq!(host.strides(), strides.as_slice());
        assert_eq!(gather(&meta.shape, &strides, item, host.data()), case.expected, "{name}: values in place");
        assert_eq!(host.contiguous_bytes(), case.expected, "{name}: crate gather");
    }

    fn payload_address(_tools: &(), sample: &GpuSample) -> u64 {
        sample.host_bytes().unwrap().as_ptr() as u64
    }

    fn consumer(_tools: &(), _c: Consumer) -> (ConsumerStream, Option<Stream>) {
        (ConsumerStream::no_sync(), None)
    }

    fn legacy_consumer(_tools: &()) -> (ConsumerStream, Option<Stream>) {
        (ConsumerStream::no_sync(), None)
    }

    fn read(_tools: &(), _on: Option<&Stream>, _ptr: u64, len: usize, c_copy: Vec<u8>) -> Vec<u8> {
        assert_eq!(c_copy.len(), len);
        c_copy
    }

    fn subscriber_tail(_tools: &(), _go: &dyn Fn(), _recv: &dyn Fn() -> GpuSample, _n: u64) {}
}

/// Descriptions a host publisher refuses before anything is sent: typed errors naming
/// the field; DLPack imports it refuses still run the producer's deleter, once.
fn host_refusals(publisher: &GpuPublisher) {
    let too_big = TensorMeta::contiguous(DType::F32, vec![4, 4], Device::CPU);
    match publisher.put_tensor_from_host(&[0u8; 32], &too_big) {
        Err(TensorPublishError::Invalid {
            source: EncodeError::Invalid(MetaError::SpanOutOfBounds { needed: 64, available: 32 }),
            loan: None,
        }) => {}
        other => panic!("a 64-byte tensor on 32 bytes: {other:?}"),
    }
    let loan = publisher.loan(16).unwrap();
    let err = publisher.put_tensor(loan, &TensorMeta::contiguous(DType::I32, vec![5], Device::CPU)).unwrap_err();
    assert!(
        matches!(
            err,
            TensorPublishError::Invalid {
                source: EncodeError::Invalid(MetaError::SpanOutOfBounds { needed: 20, available: 16 }),
                loan: Some(_)
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.into_loan().expect("the loan comes back").len(), 16);
    let negative = TensorMeta::contiguous(DType::F32, vec![2, 2], Device::CPU).with_strides(vec![2, -1]);
    assert!(matches!(
        publisher.put_tensor_from_host(&[0u8; 16], &negative),
        Err(TensorPublishError::Invalid {
            source: EncodeError::Invalid(MetaError::NegativeStride { dim: 1, value: -1 }),
            ..
        })
    ));
    let on_gpu = TensorMeta::contiguous(DType::F32, vec![2], Device::cuda(0));
    assert!(matches!(
        publisher.put_tensor_from_host(&[0u8; 8], &on_gpu),
        Err(TensorPublishError::DeviceMismatch { backend: BackendKind::HostMemfd, ordinal: None, .. })
    ));
    let mut buf = [0i32; 4];
    type Expect = fn(&ImportError) -> bool;
    let refused: [(u32, i32, [i64; 2], Expect); 3] = [
        (2, K_DL_CPU, [1, 1], |e| matches!(e, ImportError::UnsupportedVersion { major: 2, minor: 0 })),
        (1, K_DL_CUDA, [1, 1], |e| matches!(e, ImportError::Device { backend: BackendKind::HostMemfd, .. })),
        (1, K_DL_CPU, [1, -1], |e| matches!(e, ImportError::Meta(MetaError::NegativeStride { dim: 1, value: -1 }))),
    ];
    for (major, device_type, strides, ok) in refused {
        let deleted = Cell::new(0);
        let shape = [2i64, 2];
        // SAFETY: `buf` outlives the tensor (dropped inside `put_dlpack`); shape and
        // strides are copied by the C side; `deleted` outlives the deleter call.
        let raw = unsafe {
            zcs_dlpack_make_versioned(
                buf.as_mut_ptr().cast(),
                device_type,
                0,
                2,
                shape.as_ptr(),
                strides.as_ptr(),
                0,
                32,
                1,
                0,
                major,
                0,
                deleted.as_ptr(),
            )
        };
        // SAFETY: a fresh struct from the C producer, deleted once by its owner.
        let t = unsafe { ManagedTensorVersioned::from_raw(raw) }.expect("C producer");
        let err = publisher.put_dlpack(t, None).unwrap_err();
        assert!(ok(&err), "unexpected {err:?}");
        assert_eq!(deleted.get(), 1, "the refused tensor's deleter runs once ({err})");
    }
}

/// The GPU and a stream (the publisher's, or the subscriber's consumer stream).
pub struct GpuTools {
    gpu: Gpu,
    stream: Stream,
}

impl TensorMedium for Cuda {
    const DEVICE_COPIES: bool = true;
    const SMALL_IMPORT_PATH: Path = Path::ZeroCopy;
    const C_READS_DATA: bool = false;
    const DL_DEVICE_TYPE: i32 = K_DL_CUDA;
    type Tools = GpuTools;

    fn tools(session: &GpuSession) -> GpuTools {
        let gpu = session.gpu().expect("a CUDA session").clone();
        let stream = gpu.new_stream().unwrap();
        GpuTools { gpu, stream }
    }

    fn device(t: &GpuTools) -> Device {
        Device::cuda(t.gpu.ordinal() as i32)
    }

    fn refusals(_publisher: &GpuPublisher) {}

    fn put_from_device(t: &GpuTools, publisher: &GpuPublisher, case: &Case) -> PutReport {
        let scratch = DeviceBlock::allocate(&t.gpu, case.payload.len()).unwrap();
        h2d(&t.gpu, &t.stream, scratch.device_ptr(), &case.payload);
        // SAFETY: `scratch` holds the payload (written and synchronised above) and
        // outlives the copy: it drops after the synchronize below.
        let r = unsafe {
            publisher.put_tensor_from_device(scratch.device_ptr(), &case.meta, case.payload.len(), &t.stream)
        }
        .unwrap();
        d2h(&t.gpu, &t.stream, scratch.device_ptr(), 0); // waits for the copy
        r
    }

    fn stage(t: &GpuTools, bytes: &[u8]) -> Staged {
        let block = DeviceBlock::allocate(&t.gpu, bytes.len()).unwrap();
        h2d(&t.gpu, &t.stream, block.device_ptr(), bytes);
        let ptr = block.device_ptr() as usize as *mut std::ffi::c_void;
        Staged { _owner: Box::new(block), ptr }
    }

    fn import_stream(t: &GpuTools) -> Option<&Stream> {
        Some(&t.stream)
    }

    fn publisher_tail(t: &GpuTools, publisher: &GpuPublisher, go: &dyn Fn(), next: &mut dyn FnMut(PutReport)) {
        // The slow producer, once the subscriber is ready to watch it: the producer's
        // stream zeroes the block, spins, then copies the data in.
        go();
        let (gpu, stream) = (&t.gpu, &t.stream);
        let kernels = Kernels::load(gpu).unwrap();
        let (meta, payload) = slow_case(gpu.ordinal() as i32);
        let scratch = DeviceBlock::allocate(gpu, payload.len()).unwrap();
        h2d(gpu, stream, scratch.device_ptr(), &payload);
        let loan = publisher.loan_on(payload.len(), stream).unwrap();
        let dst = loan.device_ptr().unwrap();
        gpu.bind().unwrap();
        // SAFETY: the loan owns ≥ payload.len() mapped bytes until the put, which orders
        // the ready signal after this work on `stream`.
        unsafe { sys::memset_d8_async(dst, 0, payload.len(), stream.cu_stream()) }.unwrap();
        kernels.spin(stream, SPIN_NS).unwrap();
        // SAFETY: both blocks are mapped with ≥ payload.len() bytes; `scratch` lives
        // until the synchronize below.
        unsafe { sys::memcpy_dtod_async(dst, scratch.device_ptr(), payload.len(), stream.cu_stream()) }.unwrap();
        let put_at = Instant::now();
        next(publisher.put_tensor(loan, &meta).unwrap());
        assert!(put_at.elapsed() < Duration::from_millis(100), "the put waited for the producer's stream");
        d2h(gpu, stream, scratch.device_ptr(), 0);
    }

    fn check_reads(t: &GpuTools, sample: &GpuSample, case: &Case) {
        let (gpu, s) = (&t.gpu, &t.stream);
        let name = case.name;
        let meta = &case.meta;
        let strides = meta.effective_strides().unwrap();
        let item = meta.dtype.itemsize().unwrap() as usize;
        let extent = meta.validate(case.payload.len() as u64).unwrap();
        let values = |bytes: &[u8]| gather(&meta.shape, &strides, item, bytes);
        assert_eq!(sample.host_tensor().is_ok(), case.path == Path::Inline, "{name}: host view only for bytes");
        // A view on a stream: data_ptr = payload + byte_offset; every value through it.
        let view = sample.tensor_view(s).unwrap();
        assert_eq!(view.data_ptr(), view.payload_ptr() + meta.byte_offset, "{name}: view pointer");
        assert_eq!(
            (view.shape(), view.strides(), view.dtype()),
            (meta.shape.as_slice(), strides.as_slice(), meta.dtype)
        );
        assert_eq!(view.nbytes(), extent.bytes);
        assert_eq!(values(&d2h(gpu, s, view.data_ptr(), extent.bytes as usize)), case.expected, "{name}: view values");
        view.end().unwrap();
        // Device→device into a block of ours.
        let dst = DeviceBlock::allocate(gpu, extent.bytes as usize).unwrap();
        let copied = sample.copy_tensor_to_device(&dst, s).unwrap();
        assert_eq!(copied, TensorMeta { strides: strides.clone(), byte_offset: 0, ..meta.clone() });
        assert_eq!(values(&d2h(gpu, s, dst.device_ptr(), extent.bytes as usize)), case.expected, "{name}: D2D copy");
    }

    fn payload_address(t: &GpuTools, sample: &GpuSample) -> u64 {
        let read = sample.read(&t.stream).unwrap();
        let p = read.device_ptr();
        read.end().unwrap();
        p
    }

    fn consumer(t: &GpuTools, c: Consumer) -> (ConsumerStream, Option<Stream>) {
        let s = &t.stream;
        let (consumer, on) = match c {
            Consumer::Owned => (ConsumerStream::stream(s), s.clone()),
            Consumer::Raw => {
                let raw = s.cu_stream() as usize as i64;
                // SAFETY: `s` is a stream of this device's primary context and outlives
                // every export (the tools outlive the checks' exports).
                (unsafe { ConsumerStream::from_dlpack(raw) }.unwrap(), s.clone())
            }
            Consumer::PerThread => (ConsumerStream::per_thread_default(), t.gpu.per_thread_stream()),
            // `-1`: complete at hand-off, readable on any stream.
            Consumer::NoSync => (ConsumerStream::no_sync(), t.gpu.new_stream().unwrap()),
        };
        (consumer, Some(on))
    }

    fn legacy_consumer(t: &GpuTools) -> (ConsumerStream, Option<Stream>) {
        (ConsumerStream::legacy_default(), Some(t.gpu.legacy_default_stream()))
    }

    fn read(t: &GpuTools, on: Option<&Stream>, ptr: u64, len: usize, c_copy: Vec<u8>) -> Vec<u8> {
        assert!(c_copy.is_empty(), "the C side does not touch device memory");
        d2h(&t.gpu, on.expect("a stream to read on"), ptr, len)
    }

    fn subscriber_tail(t: &GpuTools, go: &dyn Fn(), recv: &dyn Fn() -> GpuSample, n: u64) {
        go();
        let slow = recv();
        assert_eq!(slow.seq(), n + 1);
        check_slow(&t.gpu, &slow);
    }
}

/// Copies device memory to a new host vector on `stream` and waits for it.
fn d2h(gpu: &Gpu, stream: &Stream, src: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    gpu.bind().unwrap();
    if len > 0 {
        // SAFETY: callers pass ranges inside mapped blocks they hold (a view, an export or
        // a block of theirs); `v` has `len` bytes and lives until the synchronize below.
        unsafe { sys::memcpy_dtoh_async(v.as_mut_ptr(), src, len, stream.cu_stream()) }.unwrap();
    }
    // SAFETY: a stream of the current context (the handle may be a special one: null or
    // per-thread, both valid driver handles).
    unsafe { sys::stream_synchronize(stream.cu_stream()) }.unwrap();
    v
}

/// Copies host bytes into device memory and waits.
fn h2d(gpu: &Gpu, stream: &Stream, dst: u64, data: &[u8]) {
    gpu.bind().unwrap();
    // SAFETY: `dst` is a mapped block of ≥ data.len() bytes the caller owns.
    unsafe { sys::memcpy_htod_async(dst, data.as_ptr(), data.len(), stream.cu_stream()) }.unwrap();
    // SAFETY: a stream of the current context.
    unsafe { sys::stream_synchronize(stream.cu_stream()) }.unwrap();
}

/// The slow producer's tensor: 512x512 float32.
fn slow_case(ordinal: i32) -> (TensorMeta, Vec<u8>) {
    let v: Vec<u8> = (0..512 * 512).flat_map(|k| (k as f32 * 0.5 + 1.0).to_ne_bytes()).collect();
    (TensorMeta::contiguous(DType::F32, vec![512, 512], Device::cuda(ordinal)), v)
}

/// The export of the slow producer's tensor returns at once; a read enqueued on the
/// export's stream sees complete data, a read on another stream (negative control) does
/// not.
fn check_slow(gpu: &Gpu, sample: &GpuSample) {
    let (meta, payload) = slow_case(gpu.ordinal() as i32);
    let received = Instant::now();
    assert_eq!(sample.tensor_meta().unwrap(), Some(meta.clone()));
    let consumer = gpu.new_stream().unwrap();
    let t = Instant::now();
    let v = sample.to_dlpack_versioned(&ConsumerStream::stream(&consumer)).unwrap();
    let export_took = t.elapsed();
    let (s, _) = inspect_versioned(&v, 0);
    check_summary("slow producer", &s, &meta, (K_DL_CUDA, gpu.ordinal() as i32), 0);
    // Negative control: a read on another stream, not ordered after the ready signal,
    // runs while the producer still spins.
    let side = gpu.new_stream().unwrap();
    let early = d2h(gpu, &side, s.data, payload.len());
    let early_ms = received.elapsed().as_secs_f64() * 1e3;
    // The read on the consumer stream waits for the producer's data.
    let got = d2h(gpu, &consumer, s.data, payload.len());
    let waited_ms = received.elapsed().as_secs_f64() * 1e3;
    delete_versioned_in_c(v);
    println!(
        "slow producer: export returned in {:.2} ms; unordered read at {early_ms:.1} ms matched: {}; \
         ordered read complete at {waited_ms:.1} ms",
        export_took.as_secs_f64() * 1e3,
        early == payload
    );
    assert!(got == payload, "the read on the export's stream saw incomplete data");
    assert!(export_took < Duration::from_millis(100), "the export waited on the host ({export_took:?})");
    assert!(early != payload, "negative control: a read not ordered after the signal saw complete data");
    assert!(waited_ms >= 150.0, "the consumer stream did not wait for the producer ({waited_ms:.1} ms)");
}
