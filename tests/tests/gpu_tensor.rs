//! The tensor layer on the GPU: CUDA sessions in two real processes over loopback Zenoh.
//!
//! This test is the subscriber and checker; a child (this test binary re-run, see
//! `child_entry`) is the publisher. Both build the same cases from [`cases`]. The child
//! fills device memory from CPU-generated buffers (host→device copies), by every
//! publishing path: `put_tensor_from_host`, `put_tensor_from_device`, a loan written
//! then `put_tensor`, and a framework-style DLPack tensor (from a C producer) through
//! `put_dlpack`. Cases: float16 bit patterns, bfloat16, int64 extremes, a non-contiguous
//! strided view with a byte offset, a small inline tensor, a slow producer, and DLPack
//! imports (versioned and legacy).
//!
//! Every value is checked on the receiver: through a `TensorView` on a stream, an owned
//! host copy, a device→device copy into a block the test owns, and through both DLPack
//! exports, consumed by a C function (`tests/c/consume_dlpack.c`) that reads the struct
//! field by field and calls the deleter; the data is read back through the pointer the
//! C side returned, on the consumer stream the export was made for (an owned stream, the
//! legacy and per-thread default streams, a raw `CUstream` value, and `-1`).
//!
//! The slow-producer case checks the consumer-stream synchronisation: the producer's
//! stream zeroes the block, spins 300 ms, then copies the data in; the export returns at
//! once, and a read enqueued on the export's stream sees complete data while a read on
//! another stream (negative control) does not.
//!
//! Without a usable GPU each test prints `SKIPPED <name>: <reason>` and passes; with
//! `ZCS_REQUIRE_GPU=1` it fails instead.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zcs_memory::cuda::{DeviceBlock, Gpu, Kernels, Stream, sys};
use zcs_tests::{child_role, gpu_or_skip, spawn_child, wait_child, watchdog_guard};
use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::dlpack::{
    ConsumerStream, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY, ManagedTensorLegacy,
    ManagedTensorVersioned, live_exports,
};
use zenoh_cuda_shm::tensor_codec::{DType, Device, TensorMeta};
use zenoh_cuda_shm::{BackendKind, GpuPublisher, GpuSample, GpuSession, Path, PutReport, ZcsConfig};

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
#[path = "support/tensor.rs"]
mod tensor_support;
use tensor_support::{gather, i64_values};

#[allow(dead_code, reason = "each test binary uses part of the shared FFI")]
#[path = "../c/dlpack_ffi.rs"]
mod dlpack_ffi;
use dlpack_ffi::{
    Summary, delete_legacy_in_c, delete_versioned_in_c, inspect_legacy, inspect_versioned, zcs_dlpack_make_legacy,
    zcs_dlpack_make_versioned,
};

const PORT_ENV: &str = "ZCS_TENSOR_PORT";
const BASE_ENV: &str = "ZCS_TENSOR_BASE";
const IO: Duration = Duration::from_secs(60);
const SPIN_NS: u64 = 300_000_000;
const K_DL_CUDA: i32 = 2;

fn cuda_session(port: u16, listen: bool) -> GpuSession {
    let cfg = ZcsConfig { device: DeviceChoice::Cuda, ..ZcsConfig::default() };
    GpuSession::open(zcs_tests::loopback_zenoh_config(listen.then_some(port), (!listen).then_some(port), None), cfg)
        .wait()
        .expect("CUDA session")
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

// ------------------------------------------------------------------------------------
// The cases, built identically by both processes.
// ------------------------------------------------------------------------------------

/// How the publisher sends a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// `put_tensor_from_host` (the crate copies host→device).
    Host,
    /// Host→device into a scratch block of the test, then `put_tensor_from_device`.
    Device,
    /// A loan written with `write_bytes`, then `put_tensor`.
    Loan,
}

/// Which DLPack stream the versioned export of a case is made for.
#[derive(Debug, Clone, Copy)]
enum Consumer {
    Owned,
    Raw,
    PerThread,
    NoSync,
}

struct Case {
    name: &'static str,
    meta: TensorMeta,
    payload: Vec<u8>,
    /// The elements in row-major order, computed without the crate.
    expected: Vec<u8>,
    how: How,
    path: Path,
    consumer: Consumer,
}

fn ne<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// float16 bit patterns (±0, ±1, ±inf, NaN, subnormals, smallest normal, ±max, …) first,
/// then a hash of the index.
fn f16_bits(n: usize) -> Vec<u16> {
    let special =
        [0x0000u16, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3555];
    (0..n).map(|i| special.get(i).copied().unwrap_or(((i as u32).wrapping_mul(2_246_822_519) >> 16) as u16)).collect()
}

/// bfloat16 bit patterns (±0, ±1, ±inf, NaN, subnormal, max, pi) first, then a hash.
fn bf16_bits(n: usize) -> Vec<u16> {
    let special = [0x0000u16, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x7F7F, 0x4049];
    (0..n).map(|i| special.get(i).copied().unwrap_or(((i as u32).wrapping_mul(2_654_435_761) >> 16) as u16)).collect()
}

/// A 300x128 float32 buffer and the 149x40 view at (1, 3) taking every other row and
/// every third column: element (i, j) is buffer[131 + 256i + 3j].
fn strided() -> (TensorMeta, Vec<u8>, Vec<u8>) {
    let base: Vec<f32> = (0..300 * 128).map(|k| k as f32 * 0.25 - 1000.0).collect();
    let meta = TensorMeta::contiguous(DType::F32, vec![149, 40], Device::cuda(0))
        .with_strides(vec![256, 3])
        .with_byte_offset(131 * 4);
    let mut expected = Vec::new();
    for i in 0..149 {
        for j in 0..40 {
            expected.extend_from_slice(&base[131 + 256 * i + 3 * j].to_ne_bytes());
        }
    }
    (meta, ne(&base, f32::to_ne_bytes), expected)
}

fn cases(ordinal: i32) -> Vec<Case> {
    let dev = Device::cuda(ordinal);
    let f16 = ne(&f16_bits(256 * 300), u16::to_ne_bytes);
    let bf16 = ne(&bf16_bits(128 * 257), u16::to_ne_bytes);
    let i64s = ne(&i64_values(1000 * 17), i64::to_ne_bytes);
    let small = ne(&(0..16).map(|i: i32| i * i - 7).collect::<Vec<_>>(), i32::to_ne_bytes);
    let (sm, sp, se) = strided();
    let sm = TensorMeta { device: dev, ..sm };
    vec![
        Case {
            name: "float16 from host",
            meta: TensorMeta::contiguous(DType::F16, vec![256, 300], dev),
            payload: f16.clone(),
            expected: f16,
            how: How::Host,
            path: Path::ZeroCopy,
            consumer: Consumer::Owned,
        },
        Case {
            name: "bfloat16 from device",
            meta: TensorMeta::contiguous(DType::BF16, vec![128, 257], dev),
            payload: bf16.clone(),
            expected: bf16,
            how: How::Device,
            path: Path::ZeroCopy,
            consumer: Consumer::NoSync,
        },
        Case {
            name: "int64 loan",
            meta: TensorMeta::contiguous(DType::I64, vec![1000, 17], dev),
            payload: i64s.clone(),
            expected: i64s,
            how: How::Loan,
            path: Path::ZeroCopy,
            consumer: Consumer::PerThread,
        },
        Case {
            name: "strided float32 loan",
            meta: sm,
            payload: sp,
            expected: se,
            how: How::Loan,
            path: Path::ZeroCopy,
            consumer: Consumer::Raw,
        },
        Case {
            name: "int32 inline",
            meta: TensorMeta::contiguous(DType::I32, vec![4, 4], dev),
            payload: small.clone(),
            expected: small,
            how: How::Host,
            path: Path::Inline,
            consumer: Consumer::Owned,
        },
    ]
}

/// Index in `cases()` of the case whose export is kept to check the lease.
const STRIDED: usize = 3;

/// The slow producer's tensor: 512x512 float32.
fn slow_case(ordinal: i32) -> (TensorMeta, Vec<u8>) {
    let v: Vec<f32> = (0..512 * 512).map(|k| k as f32 * 0.5 + 1.0).collect();
    (TensorMeta::contiguous(DType::F32, vec![512, 512], Device::cuda(ordinal)), ne(&v, f32::to_ne_bytes))
}

/// DLPack imports from the C producer, as the receiver must see them:
/// (description, elements in row-major order).
fn imported(ordinal: i32) -> Vec<(TensorMeta, Vec<u8>)> {
    let (_, _, v) = import_source();
    let l: Vec<i16> = (0..330).map(|k| (k * 97 % 65_521 - 32_000) as i16).collect();
    vec![
        (TensorMeta::contiguous(DType::F32, vec![64, 48], Device::cuda(ordinal)).with_strides(vec![1, 64]), v),
        (TensorMeta::contiguous(DType::I16, vec![33, 10], Device::cuda(ordinal)), ne(&l, i16::to_ne_bytes)),
    ]
}

/// The versioned import's buffer: 64 floats of padding, then a column-major 64x48
/// float32 tensor. Returns (buffer bytes, byte_offset, elements in row-major order).
fn import_source() -> (Vec<u8>, u64, Vec<u8>) {
    let val = |i: usize, j: usize| (i * 1000 + j) as f32 - 0.5;
    let mut buf = vec![f32::NAN; 64 + 64 * 48];
    for i in 0..64 {
        for j in 0..48 {
            buf[64 + i + 64 * j] = val(i, j);
        }
    }
    let mut expected = Vec::new();
    for i in 0..64 {
        for j in 0..48 {
            expected.extend_from_slice(&val(i, j).to_ne_bytes());
        }
    }
    (ne(&buf, f32::to_ne_bytes), 256, expected)
}

// ------------------------------------------------------------------------------------
// The publisher (child process)
// ------------------------------------------------------------------------------------

fn publisher_child() {
    let _watchdog = watchdog_guard("gpu_tensor publisher child", Duration::from_secs(280));
    let port: u16 = std::env::var(PORT_ENV).unwrap().parse().unwrap();
    let base = std::env::var(BASE_ENV).unwrap();
    let session = cuda_session(port, false);
    let gpu = session.gpu().expect("GPU in the publisher child").clone();
    let ordinal = gpu.ordinal() as i32;
    let bye = session.zenoh().declare_subscriber(format!("{base}/bye")).wait().unwrap();
    let go = session.zenoh().declare_subscriber(format!("{base}/go")).wait().unwrap();
    let publisher = Arc::new(session.declare_publisher(format!("{base}/t")).wait().unwrap());
    assert_eq!(publisher.backend(), BackendKind::CudaVmm);
    let _pool = tensor_support::serve_pool(&session, &base, &publisher);
    let kernels = Kernels::load(&gpu).unwrap();
    let stream = gpu.new_stream().unwrap();
    tensor_support::wait_zero_copy_subscriber(&publisher, IO);
    let mut seq = 0;
    let mut next = |report: PutReport| {
        seq += 1;
        assert_eq!(report.seq, seq, "one message per case, in order");
    };
    for case in cases(ordinal) {
        let report = match case.how {
            How::Host => publisher.put_tensor_from_host(&case.payload, &case.meta).unwrap(),
            How::Device => {
                let scratch = DeviceBlock::allocate(&gpu, case.payload.len()).unwrap();
                h2d(&gpu, &stream, scratch.device_ptr(), &case.payload);
                // SAFETY: `scratch` holds the payload (written and synchronised above) and
                // outlives the copy: it drops after the synchronize below.
                let r = unsafe {
                    publisher.put_tensor_from_device(scratch.device_ptr(), &case.meta, case.payload.len(), &stream)
                }
                .unwrap();
                d2h(&gpu, &stream, scratch.device_ptr(), 0); // waits for the copy
                r
            }
            How::Loan => {
                let mut loan = publisher.loan(case.payload.len()).unwrap();
                loan.write_bytes(0, &case.payload).unwrap();
                publisher.put_tensor(loan, &case.meta).unwrap()
            }
        };
        next(report);
    }
    next(import_versioned(&gpu, &publisher, &stream));
    next(import_legacy(&gpu, &publisher, &stream));
    // The slow producer, once the subscriber is ready to watch it.
    go.recv_timeout(IO).unwrap().expect("go from the subscriber");
    let (meta, payload) = slow_case(ordinal);
    let scratch = DeviceBlock::allocate(&gpu, payload.len()).unwrap();
    h2d(&gpu, &stream, scratch.device_ptr(), &payload);
    let loan = publisher.loan_on(payload.len(), &stream).unwrap();
    let dst = loan.device_ptr().unwrap();
    gpu.bind().unwrap();
    // SAFETY: the loan owns ≥ payload.len() mapped bytes until the put, which orders the
    // ready signal after this work on `stream`.
    unsafe { sys::memset_d8_async(dst, 0, payload.len(), stream.cu_stream()) }.unwrap();
    kernels.spin(&stream, SPIN_NS).unwrap();
    // SAFETY: both blocks are mapped with ≥ payload.len() bytes; `scratch` lives until the
    // synchronize below.
    unsafe { sys::memcpy_dtod_async(dst, scratch.device_ptr(), payload.len(), stream.cu_stream()) }.unwrap();
    let put_at = Instant::now();
    next(publisher.put_tensor(loan, &meta).unwrap());
    assert!(put_at.elapsed() < Duration::from_millis(100), "the put waited for the producer's stream");
    d2h(&gpu, &stream, scratch.device_ptr(), 0);
    println!("publisher: {seq} messages sent; waiting for the subscriber's checks");
    bye.recv_timeout(Duration::from_secs(200)).unwrap().expect("bye from the subscriber");
}

fn import_versioned(gpu: &Gpu, publisher: &GpuPublisher, stream: &Stream) -> PutReport {
    let (bytes, offset, _) = import_source();
    let block = DeviceBlock::allocate(gpu, bytes.len()).unwrap();
    h2d(gpu, stream, block.device_ptr(), &bytes);
    let (shape, strides) = ([64i64, 48], [1i64, 64]);
    let deleted = Cell::new(0);
    // SAFETY: the C side only stores the device pointer; `block` outlives the tensor
    // (deleted inside `put_dlpack`, after the copy completed); `deleted` outlives it too.
    let raw = unsafe {
        zcs_dlpack_make_versioned(
            block.device_ptr() as usize as *mut std::ffi::c_void,
            K_DL_CUDA,
            gpu.ordinal() as i32,
            2,
            shape.as_ptr(),
            strides.as_ptr(),
            2,
            32,
            1,
            offset,
            1,
            0,
            deleted.as_ptr(),
        )
    };
    // SAFETY: a fresh struct from the C producer, deleted once by its owner; its data is
    // device memory of this GPU covering the view.
    let t = unsafe { ManagedTensorVersioned::from_raw(raw) }.expect("C producer");
    let report = publisher.put_dlpack(t, Some(stream)).unwrap();
    assert_eq!(deleted.get(), 1, "the deleter runs once, after the copy");
    report
}

fn import_legacy(gpu: &Gpu, publisher: &GpuPublisher, stream: &Stream) -> PutReport {
    let (meta, expected) = imported(gpu.ordinal() as i32).pop().unwrap();
    let block = DeviceBlock::allocate(gpu, expected.len()).unwrap();
    h2d(gpu, stream, block.device_ptr(), &expected);
    let deleted = Cell::new(0);
    // SAFETY: as in `import_versioned`; NULL strides (compact, as pre-1.2 producers mean).
    let raw = unsafe {
        zcs_dlpack_make_legacy(
            block.device_ptr() as usize as *mut std::ffi::c_void,
            K_DL_CUDA,
            gpu.ordinal() as i32,
            2,
            meta.shape.as_ptr(),
            std::ptr::null(),
            0,
            16,
            1,
            0,
            deleted.as_ptr(),
        )
    };
    // SAFETY: as in `import_versioned`.
    let t = unsafe { ManagedTensorLegacy::from_raw(raw) }.expect("C producer");
    let report = publisher.put_dlpack(t, Some(stream)).unwrap();
    assert_eq!(deleted.get(), 1);
    report
}

// ------------------------------------------------------------------------------------
// The subscriber (this process)
// ------------------------------------------------------------------------------------

/// Checks the fields the C consumer read against the description.
fn check_summary(name: &str, s: &Summary, meta: &TensorMeta, ordinal: i32) {
    let strides = meta.effective_strides().unwrap();
    let dl = meta.dtype.to_dl();
    assert_eq!((s.device_type, s.device_id), (K_DL_CUDA, ordinal), "{name}: kDLCUDA and the local ordinal");
    assert_eq!(s.ndim as usize, meta.rank(), "{name}: ndim");
    assert_eq!((s.code, s.bits, s.lanes), (dl.code, dl.bits, dl.lanes), "{name}: dtype");
    assert_eq!((s.shape_null, s.strides_null), (0, 0), "{name}: explicit arrays");
    assert_eq!(s.shape(), meta.shape.as_slice(), "{name}: shape");
    assert_eq!(s.strides(), strides.as_slice(), "{name}: strides always explicit");
    assert_eq!(s.byte_offset, 0, "{name}: byte_offset folded into data");
    assert_eq!(s.host_copied, 0, "{name}: the C side does not touch device memory");
}

/// Checks one case. `s` must outlive the returned export (a raw-stream export fences it
/// in its deleter).
fn check_case(gpu: &Gpu, s: &Stream, sample: &GpuSample, case: &Case) -> ManagedTensorVersioned {
    let name = case.name;
    let ordinal = gpu.ordinal() as i32;
    let meta = &case.meta;
    let strides = meta.effective_strides().unwrap();
    let item = meta.dtype.itemsize().unwrap() as usize;
    let extent = meta.validate(case.payload.len() as u64).unwrap();
    let values = |bytes: &[u8]| gather(&meta.shape, &strides, item, bytes);
    assert_eq!(sample.path(), case.path, "{name}: path");
    assert_eq!(sample.len(), case.payload.len(), "{name}: payload length");
    assert_eq!(sample.tensor_meta().unwrap().as_ref(), Some(meta), "{name}: description");
    assert_eq!(sample.host_tensor().is_ok(), case.path == Path::Inline, "{name}: host view only for bytes");
    assert_eq!(sample.dlpack_device(), Device::cuda(ordinal).into());

    // A view on a stream: data_ptr = payload + byte_offset; every value through it.
    let view = sample.tensor_view(s).unwrap();
    assert_eq!(view.data_ptr(), view.payload_ptr() + meta.byte_offset, "{name}: view pointer");
    assert_eq!((view.shape(), view.strides(), view.dtype()), (meta.shape.as_slice(), strides.as_slice(), meta.dtype));
    assert_eq!(view.nbytes(), extent.bytes);
    assert_eq!(values(&d2h(gpu, s, view.data_ptr(), extent.bytes as usize)), case.expected, "{name}: view values");
    view.end().unwrap();
    // Owned copies: host, and device→device into a block of ours.
    let owned = sample.to_owned_tensor().unwrap();
    assert_eq!(owned.contiguous_bytes(), case.expected, "{name}: owned values");
    assert_eq!(values(owned.data()), case.expected);
    let dst = DeviceBlock::allocate(gpu, extent.bytes as usize).unwrap();
    let copied = sample.copy_tensor_to_device(&dst, s).unwrap();
    assert_eq!(copied, TensorMeta { strides: strides.clone(), byte_offset: 0, ..meta.clone() });
    assert_eq!(values(&d2h(gpu, s, dst.device_ptr(), extent.bytes as usize)), case.expected, "{name}: D2D copy");

    // The payload's address in this process, to check the exports' data pointers.
    let mapping = {
        let read = sample.read(s).unwrap();
        let p = read.device_ptr();
        read.end().unwrap();
        p
    };
    let in_place = case.path == Path::ZeroCopy;
    let flags = if in_place { DLPACK_FLAG_BITMASK_READ_ONLY } else { DLPACK_FLAG_BITMASK_IS_COPIED };

    // Versioned, for the case's consumer stream.
    let (consumer, read_on): (ConsumerStream, Stream) = match case.consumer {
        Consumer::Owned => (ConsumerStream::stream(s), s.clone()),
        Consumer::Raw => {
            let raw = s.cu_stream() as usize as i64;
            // SAFETY: `s` is a stream of this device's primary context and outlives the
            // returned export's deleter (this function's contract).
            (unsafe { ConsumerStream::from_dlpack(raw) }.unwrap(), s.clone())
        }
        Consumer::PerThread => (ConsumerStream::per_thread_default(), gpu.per_thread_stream()),
        // `-1`: complete at hand-off, readable on any stream.
        Consumer::NoSync => (ConsumerStream::no_sync(), gpu.new_stream().unwrap()),
    };
    let live = live_exports();
    let v = sample.to_dlpack_versioned(&consumer).unwrap();
    assert_eq!(live_exports(), live + 1);
    let (sv, _) = inspect_versioned(&v, 0);
    assert_eq!((sv.versioned, sv.version_major, sv.version_minor, sv.has_deleter), (1, 1, 3, 1), "{name}: version");
    assert_eq!(sv.manager_ctx, v.as_ptr() as u64);
    assert_eq!(sv.flags, flags, "{name}: flags");
    check_summary(name, &sv, meta, ordinal);
    if in_place {
        assert_eq!(sv.data, mapping + meta.byte_offset, "{name}: data = mapping + byte_offset");
    }
    let got = d2h(gpu, &read_on, sv.data, extent.bytes as usize);
    assert_eq!(values(&got), case.expected, "{name}: values through the versioned export ({:?})", case.consumer);

    // Legacy, on the legacy default stream (DLPack 1).
    let l = sample.to_dlpack_legacy(&ConsumerStream::legacy_default()).unwrap();
    let (sl, _) = inspect_legacy(&l, 0);
    assert_eq!((sl.versioned, sl.has_deleter, sl.manager_ctx), (0, 1, l.as_ptr() as u64));
    check_summary(name, &sl, meta, ordinal);
    if in_place {
        assert_eq!(sl.data, mapping + meta.byte_offset, "{name}: legacy data = mapping + byte_offset");
    }
    let got = d2h(gpu, &gpu.legacy_default_stream(), sl.data, extent.bytes as usize);
    assert_eq!(values(&got), case.expected, "{name}: values through the legacy export");
    delete_legacy_in_c(l);
    assert_eq!(live_exports(), live + 1);
    println!("{name}: {} values checked in place, copied, and through both DLPack exports", meta.numel().unwrap());
    v
}

fn check_slow(gpu: &Gpu, sample: &GpuSample) {
    let (meta, payload) = slow_case(gpu.ordinal() as i32);
    let received = Instant::now();
    assert_eq!(sample.tensor_meta().unwrap(), Some(meta.clone()));
    let consumer = gpu.new_stream().unwrap();
    let t = Instant::now();
    let v = sample.to_dlpack_versioned(&ConsumerStream::stream(&consumer)).unwrap();
    let export_took = t.elapsed();
    let (s, _) = inspect_versioned(&v, 0);
    check_summary("slow producer", &s, &meta, gpu.ordinal() as i32);
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

#[test]
fn gpu_tensors_and_dlpack_across_processes() {
    let Some(gpu) = gpu_or_skip("gpu_tensors_and_dlpack_across_processes") else { return };
    let _watchdog = watchdog_guard("gpu_tensors_and_dlpack_across_processes", Duration::from_secs(300));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("zcs/test/gpu_tensor/{}", std::process::id());
    let session = cuda_session(port, true);
    let gpu_ordinal = gpu.ordinal() as i32;
    drop(gpu);
    let gpu = session.gpu().expect("a CUDA session").clone();
    let subscriber = session.declare_subscriber(format!("{base}/t")).wait().unwrap();
    let child = spawn_child("child_entry", "publisher", &[(PORT_ENV, port.to_string()), (BASE_ENV, base.clone())]);

    let cases = cases(gpu_ordinal);
    let imported = imported(gpu_ordinal);
    let n = cases.len() + imported.len();
    let mut rest = tensor_support::recv_in_order(&subscriber, n, IO).into_iter();

    // Outlives every export (the raw-stream export fences it in its deleter).
    let consumer_stream = gpu.new_stream().unwrap();
    let mut kept = None;
    let mut exports = Vec::new();
    for (i, (sample, case)) in rest.by_ref().take(cases.len()).zip(&cases).enumerate() {
        let export = check_case(&gpu, &consumer_stream, &sample, case);
        if i == STRIDED { kept = Some(export) } else { exports.push(export) }
    }
    for (sample, (meta, expected)) in rest.by_ref().zip(&imported) {
        assert_eq!(sample.path(), Path::ZeroCopy);
        assert_eq!(sample.tensor_meta().unwrap().as_ref(), Some(meta), "imported description");
        assert_eq!(&sample.to_owned_tensor().unwrap().contiguous_bytes(), expected, "imported values");
        println!("imported {} {:?} strides {:?}: values checked", meta.dtype, meta.shape, meta.strides);
    }

    session.zenoh().put(format!("{base}/go"), "go").wait().unwrap();
    let slow = subscriber.recv_timeout(IO).unwrap();
    assert_eq!(slow.seq(), n as u64 + 1);
    check_slow(&gpu, &slow);
    drop(slow);

    // The lease: only the kept export holds the strided block once the rest is gone.
    let kept = kept.expect("the strided case's export");
    tensor_support::assert_export_keeps_lease(&session, &base, exports, kept, delete_versioned_in_c, IO);

    session.zenoh().put(format!("{base}/bye"), "bye").wait().unwrap();
    wait_child(child, "publisher child", IO);
}

/// Entry point of the child process; ignored in normal runs.
#[test]
#[ignore = "entry point of the child process started by gpu_tensors_and_dlpack_across_processes"]
fn child_entry() {
    match child_role().as_deref() {
        Some("publisher") => publisher_child(),
        other => panic!("unknown child role {other:?}"),
    }
}
