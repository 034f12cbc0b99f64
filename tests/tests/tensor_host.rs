//! The tensor layer over host-memory sessions, with no GPU (runs in CI).
//!
//! Two real processes over loopback Zenoh TCP: this test is the subscriber and checker;
//! a child (this test binary re-run, see `child_entry`) is the publisher. Both build the
//! same cases from [`cases`], so the receiver checks every description field and every
//! value against what the publisher was given, computed independently of the crate's own
//! gather. Cases: float16 bit patterns (inf, NaN, subnormals), bfloat16, int64 extremes,
//! a non-contiguous strided view with a byte offset (in place and inline), a scalar,
//! descriptions refused at publish, corrupt descriptions on the wire, a sample without
//! one, and tensors from a C DLPack producer (versioned and legacy structs).
//!
//! DLPack exports are read field by field by a C consumer (`tests/c/consume_dlpack.c`),
//! which also calls the deleter; the publisher's pool (asked over a Zenoh queryable)
//! shows the lease held until then and released right after.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use zcs_tests::{child_role, spawn_child, wait_child, watchdog_guard};
use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::dlpack::{
    ConsumerStream, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY, DlpackTensor, ExportError,
    ImportError, ManagedTensorLegacy, ManagedTensorVersioned, live_exports,
};
use zenoh_cuda_shm::tensor_codec::{DType, DecodeError, Device, EncodeError, MetaError, TensorMeta};
use zenoh_cuda_shm::{BackendKind, GpuSample, GpuSession, Path, TensorPublishError, TensorReadError, ZcsConfig};

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
#[path = "support/tensor.rs"]
mod tensor_support;
use tensor_support::{gather, i64_values};

#[allow(dead_code, reason = "each test binary uses part of the shared FFI")]
#[path = "../c/dlpack_ffi.rs"]
mod dlpack_ffi;
use dlpack_ffi::{
    c_layout, delete_legacy_in_c, delete_versioned_in_c, inspect_legacy, inspect_versioned, rust_layout,
    zcs_dlpack_make_legacy, zcs_dlpack_make_versioned,
};

const PORT_ENV: &str = "ZCS_TENSOR_PORT";
const BASE_ENV: &str = "ZCS_TENSOR_BASE";
const IO: Duration = Duration::from_secs(30);

fn host_session(port: u16, listen: bool) -> GpuSession {
    let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
    GpuSession::open(zcs_tests::loopback_zenoh_config(listen.then_some(port), (!listen).then_some(port), None), cfg)
        .wait()
        .expect("host session")
}

// ------------------------------------------------------------------------------------
// The cases, built identically by both processes.
// ------------------------------------------------------------------------------------

/// How the publisher sends a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// `put_tensor_from_host`.
    Host,
    /// A loan filled on the CPU, then `put_tensor`.
    Loan,
}

struct Case {
    name: &'static str,
    meta: TensorMeta,
    payload: Vec<u8>,
    /// The elements in row-major order, computed without the crate.
    expected: Vec<u8>,
    how: How,
    path: Path,
}

fn ne16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// float16 bit patterns: ±0, ±1, ±inf, NaN, the smallest subnormal, the largest
/// subnormal, the smallest normal, ±max, 1/3, -2, 3.14.
const F16_BITS: [u16; 15] = [
    0x0000, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3555, 0xC000,
    0x4248,
];

fn bf16_bits(n: usize) -> Vec<u16> {
    // ±0, ±1, ±inf, NaN, the smallest subnormal, max, pi; then a hash of the index.
    let special = [0x0000u16, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x7F7F, 0x4049];
    (0..n).map(|i| special.get(i).copied().unwrap_or(((i as u32).wrapping_mul(2_654_435_761) >> 16) as u16)).collect()
}

/// A 4x8 float32 buffer, and the 3x4 view at element 9 (row 1, column 1) taking every
/// row and every other column: element (i, j) is buffer[9 + 8i + 2j].
fn strided() -> (TensorMeta, Vec<u8>, Vec<u8>) {
    let base: Vec<f32> = (0..32).map(|k| k as f32 * 1.5 - 7.0).collect();
    let meta =
        TensorMeta::contiguous(DType::F32, vec![3, 4], Device::CPU).with_strides(vec![8, 2]).with_byte_offset(36);
    let payload = base.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let mut expected = Vec::new();
    for i in 0..3 {
        for j in 0..4 {
            expected.extend_from_slice(&base[9 + 8 * i + 2 * j].to_ne_bytes());
        }
    }
    (meta, payload, expected)
}

fn cases() -> Vec<Case> {
    let f16 = ne16(&F16_BITS);
    let bf16 = ne16(&bf16_bits(64 * 520)); // 66,560 bytes: above the inline threshold
    let i64s: Vec<u8> = i64_values(24).iter().flat_map(|v| v.to_ne_bytes()).collect();
    let (sm, sp, se) = strided();
    let scalar = (-0.1f64).to_ne_bytes().to_vec();
    vec![
        Case {
            name: "float16 inline",
            meta: TensorMeta::contiguous(DType::F16, vec![3, 5], Device::CPU),
            payload: f16.clone(),
            expected: f16,
            how: How::Host,
            path: Path::Inline,
        },
        Case {
            name: "bfloat16 block",
            meta: TensorMeta::contiguous(DType::BF16, vec![64, 520], Device::CPU),
            payload: bf16.clone(),
            expected: bf16,
            how: How::Host,
            path: Path::ZeroCopy,
        },
        Case {
            name: "int64 loan",
            meta: TensorMeta::contiguous(DType::I64, vec![4, 6], Device::CPU).with_strides(vec![6, 1]),
            payload: i64s.clone(),
            expected: i64s,
            how: How::Loan,
            path: Path::ZeroCopy,
        },
        Case {
            name: "strided float32 loan",
            meta: sm.clone(),
            payload: sp.clone(),
            expected: se.clone(),
            how: How::Loan,
            path: Path::ZeroCopy,
        },
        Case {
            name: "strided float32 inline",
            meta: sm,
            payload: sp,
            expected: se,
            how: How::Host,
            path: Path::Inline,
        },
        Case {
            name: "float64 scalar",
            meta: TensorMeta::contiguous(DType::F64, Vec::<i64>::new(), Device::CPU),
            payload: scalar.clone(),
            expected: scalar,
            how: How::Host,
            path: Path::Inline,
        },
    ]
}

/// Index in `cases()` of the case whose exports are checked in place (zero-copy).
const STRIDED_BLOCK: usize = 3;

/// Payloads published raw, with metadata that is not a valid description of them, and
/// the error each must give on the receiver.
fn corrupt() -> Vec<(Vec<u8>, Option<Vec<u8>>, DecodeError)> {
    let f32x2 = TensorMeta::contiguous(DType::F32, vec![2], Device::CPU).encode(8).unwrap();
    let mut truncated = TensorMeta::contiguous(DType::F32, vec![2, 3], Device::CPU).encode(24).unwrap();
    truncated.truncate(5);
    let mut trailing = f32x2.clone();
    trailing.push(0);
    // version 1, dtype (3, 64, 1) = kDLOpaqueHandle, shape [1], no strides, offset 0, CPU:0.
    let opaque = vec![1u8, 3, 64, 1, 1, 2, 0, 0, 2, 0];
    vec![
        (vec![1, 2, 3, 4], Some(Vec::new()), DecodeError::Empty),
        (vec![1, 2, 3, 4], Some(vec![9, 2, 32, 1]), DecodeError::UnknownVersion { found: 9, supported: 1 }),
        (vec![0; 24], Some(truncated), DecodeError::Malformed(postcard::Error::DeserializeUnexpectedEnd)),
        (vec![0; 8], Some(trailing), DecodeError::TrailingBytes { count: 1 }),
        // A valid description that needs 8 bytes, on a 4-byte payload.
        (vec![0; 4], Some(f32x2), DecodeError::Invalid(MetaError::SpanOutOfBounds { needed: 8, available: 4 })),
        (vec![0; 8], Some(opaque), DecodeError::Invalid(MetaError::UnsupportedDType { code: 3, bits: 64, lanes: 1 })),
        // Garbage on a payload large enough to travel as a zero-copy block.
        (vec![7; 70_000], Some(vec![0xff; 3]), DecodeError::UnknownVersion { found: 255, supported: 1 }),
    ]
}

/// The tensors the publisher takes from a C DLPack producer, as the receiver must see
/// them: (description, elements in row-major order).
fn imported() -> Vec<(TensorMeta, Vec<u8>)> {
    // Versioned: int32, column-major 2x3, one element of padding before it.
    let v: Vec<u8> = [10i32, 20, 30, 11, 21, 31].iter().flat_map(|x| x.to_ne_bytes()).collect();
    // Legacy with NULL strides: uint8 5x7, compact.
    let l: Vec<u8> = (0..35u8).map(|x| x.wrapping_mul(37)).collect();
    vec![
        (TensorMeta::contiguous(DType::I32, vec![2, 3], Device::CPU).with_strides(vec![1, 2]), v),
        (TensorMeta::contiguous(DType::U8, vec![5, 7], Device::CPU), l),
    ]
}

fn total_messages() -> usize {
    cases().len() + corrupt().len() + 1 + imported().len()
}

// ------------------------------------------------------------------------------------
// The publisher (child process)
// ------------------------------------------------------------------------------------

fn publisher_child() {
    let _watchdog = watchdog_guard("tensor_host publisher child", Duration::from_secs(150));
    let port: u16 = std::env::var(PORT_ENV).unwrap().parse().unwrap();
    let base = std::env::var(BASE_ENV).unwrap();
    let session = host_session(port, false);
    let bye = session.zenoh().declare_subscriber(format!("{base}/bye")).wait().unwrap();
    let publisher = Arc::new(session.declare_publisher(format!("{base}/t")).wait().unwrap());
    assert_eq!(publisher.backend(), BackendKind::HostMemfd);
    let _pool = tensor_support::serve_pool(&session, &base, &publisher);
    tensor_support::wait_zero_copy_subscriber(&publisher, IO);
    refusals(&publisher);
    let mut seq = 0;
    let mut next = |report: zenoh_cuda_shm::PutReport| {
        seq += 1;
        assert_eq!(report.seq, seq, "one message per case, in order");
    };
    for case in cases() {
        let report = match case.how {
            How::Host => publisher.put_tensor_from_host(&case.payload, &case.meta).unwrap(),
            How::Loan => {
                let mut loan = publisher.loan(case.payload.len()).unwrap();
                loan.as_mut_slice().unwrap().copy_from_slice(&case.payload);
                publisher.put_tensor(loan, &case.meta).unwrap()
            }
        };
        next(report);
    }
    for (payload, meta, _) in corrupt() {
        next(publisher.put_bytes_meta(&payload, meta).unwrap());
    }
    next(publisher.put_bytes(&[5u8; 16]).unwrap());
    next(import_versioned(&publisher));
    next(import_legacy(&publisher));
    println!("publisher: {seq} messages sent; waiting for the subscriber's checks");
    bye.recv_timeout(Duration::from_secs(120)).unwrap().expect("bye from the subscriber");
}

/// Descriptions refused before anything is sent: typed errors naming the field.
fn refusals(publisher: &zenoh_cuda_shm::GpuPublisher) {
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
    // DLPack imports refused: the producer's deleter still runs, exactly once.
    let mut buf = [0i32; 4];
    type Expect = fn(&ImportError) -> bool;
    let refused: [(u32, i32, [i64; 2], Expect); 3] = [
        (2, 1, [1, 1], |e| matches!(e, ImportError::UnsupportedVersion { major: 2, minor: 0 })),
        (1, 2, [1, 1], |e| matches!(e, ImportError::Device { backend: BackendKind::HostMemfd, .. })),
        (1, 1, [1, -1], |e| matches!(e, ImportError::Meta(MetaError::NegativeStride { dim: 1, value: -1 }))),
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

fn import_versioned(publisher: &zenoh_cuda_shm::GpuPublisher) -> zenoh_cuda_shm::PutReport {
    // Column-major 2x3 int32 after one element of padding: (i, j) at 1 + i + 2j.
    let mut buf = [-99i32, 10, 11, 20, 21, 30, 31];
    let (shape, strides) = ([2i64, 3], [1i64, 2]);
    let deleted = Cell::new(0);
    // SAFETY: `buf` outlives the tensor (deleted inside `put_dlpack`); `deleted` outlives it.
    let raw = unsafe {
        zcs_dlpack_make_versioned(
            buf.as_mut_ptr().cast(),
            1,
            0,
            2,
            shape.as_ptr(),
            strides.as_ptr(),
            0,
            32,
            1,
            4,
            1,
            0,
            deleted.as_ptr(),
        )
    };
    // SAFETY: a fresh struct from the C producer, deleted once by its owner.
    let t = unsafe { ManagedTensorVersioned::from_raw(raw) }.expect("C producer");
    let report = publisher.put_dlpack(t, None).unwrap();
    assert_eq!(deleted.get(), 1, "the deleter runs once, after the copy");
    report
}

fn import_legacy(publisher: &zenoh_cuda_shm::GpuPublisher) -> zenoh_cuda_shm::PutReport {
    let mut buf: Vec<u8> = (0..35u8).map(|x| x.wrapping_mul(37)).collect();
    let shape = [5i64, 7];
    let deleted = Cell::new(0);
    // SAFETY: as in `import_versioned`; NULL strides (compact, as pre-1.2 producers mean).
    let raw = unsafe {
        zcs_dlpack_make_legacy(
            buf.as_mut_ptr().cast(),
            1,
            0,
            2,
            shape.as_ptr(),
            std::ptr::null(),
            1,
            8,
            1,
            0,
            deleted.as_ptr(),
        )
    };
    // SAFETY: a fresh struct from the C producer, deleted once by its owner.
    let t = unsafe { ManagedTensorLegacy::from_raw(raw) }.expect("C producer");
    let report = publisher.put_dlpack(DlpackTensor::from(t), None).unwrap();
    assert_eq!(deleted.get(), 1);
    report
}

// ------------------------------------------------------------------------------------
// The subscriber (this process)
// ------------------------------------------------------------------------------------

fn check_case(sample: &GpuSample, case: &Case) {
    let name = case.name;
    assert_eq!(sample.path(), case.path, "{name}: path");
    assert_eq!(sample.len(), case.payload.len(), "{name}: payload length");
    let meta = sample.tensor_meta().unwrap().expect("a description");
    assert_eq!(meta, case.meta, "{name}: description");
    let strides = meta.effective_strides().unwrap();
    let item = meta.dtype.itemsize().unwrap() as usize;
    // In place (host bytes): every value through the strides.
    let host = sample.host_tensor().unwrap();
    assert_eq!(host.payload(), case.payload.as_slice(), "{name}: payload bytes");
    assert_eq!(host.strides(), strides.as_slice());
    assert_eq!(gather(&meta.shape, &strides, item, host.data()), case.expected, "{name}: values in place");
    assert_eq!(host.contiguous_bytes(), case.expected, "{name}: crate gather");
    // Owned copy: offset 0, explicit strides, only the bytes the view touches.
    let owned = sample.to_owned_tensor().unwrap();
    let rebased = TensorMeta { strides: strides.clone(), byte_offset: 0, ..case.meta.clone() };
    assert_eq!(owned.meta(), &rebased, "{name}: owned description");
    let extent = case.meta.validate(case.payload.len() as u64).unwrap();
    assert_eq!(owned.data(), &case.payload[case.meta.byte_offset as usize..extent.end as usize]);
    assert_eq!(gather(&meta.shape, &strides, item, owned.data()), case.expected, "{name}: owned values");
    println!("{name}: description and {} values checked", meta.numel().unwrap());
}

/// Exports `sample` both ways, has the C consumer read every field and the data, and
/// deletes the legacy export in C. Returns the versioned export (still alive).
fn check_exports(sample: &GpuSample, case: &Case) -> ManagedTensorVersioned {
    let name = case.name;
    let meta = &case.meta;
    let strides = meta.effective_strides().unwrap();
    let extent = meta.validate(case.payload.len() as u64).unwrap();
    let item = meta.dtype.itemsize().unwrap() as usize;
    let payload = sample.host_bytes().unwrap();
    let first = payload.as_ptr() as u64 + meta.byte_offset;
    assert_eq!(sample.dlpack_device(), Device::CPU.into());

    let live = live_exports();
    let v = sample.to_dlpack_versioned(&ConsumerStream::no_sync()).unwrap();
    assert_eq!(live_exports(), live + 1);
    let (s, copy) = inspect_versioned(&v, extent.bytes as usize);
    assert_eq!((s.versioned, s.version_major, s.version_minor, s.has_deleter), (1, 1, 3, 1), "{name}: version");
    assert_eq!(s.manager_ctx, v.as_ptr() as u64, "{name}: manager_ctx is the export");
    assert_eq!((s.device_type, s.device_id), (1, 0), "{name}: kDLCPU");
    assert_eq!(s.ndim as usize, meta.rank(), "{name}: ndim");
    let dl = meta.dtype.to_dl();
    assert_eq!((s.code, s.bits, s.lanes), (dl.code, dl.bits, dl.lanes), "{name}: dtype");
    assert_eq!((s.shape_null, s.strides_null), (i32::from(meta.rank() == 0), i32::from(meta.rank() == 0)));
    assert_eq!(s.shape(), meta.shape.as_slice(), "{name}: shape");
    assert_eq!(s.strides(), strides.as_slice(), "{name}: strides always explicit");
    assert_eq!(s.byte_offset, 0, "{name}: byte_offset folded into data");
    if s.flags & DLPACK_FLAG_BITMASK_IS_COPIED == 0 {
        assert_eq!(s.flags, DLPACK_FLAG_BITMASK_READ_ONLY, "{name}: in place: read-only, not copied");
        assert_eq!(s.data, first, "{name}: data = payload + byte_offset");
    } else {
        assert_eq!(case.path, Path::Inline, "{name}: only fragmented bytes are copied");
        assert_eq!(s.flags, DLPACK_FLAG_BITMASK_IS_COPIED);
    }
    assert_eq!(s.host_copied, extent.bytes);
    assert_eq!(gather(&meta.shape, &strides, item, &copy), case.expected, "{name}: values read by C");

    let l = sample.to_dlpack_legacy(&ConsumerStream::no_sync()).unwrap();
    let (s, copy) = inspect_legacy(&l, extent.bytes as usize);
    assert_eq!((s.versioned, s.has_deleter, s.manager_ctx), (0, 1, l.as_ptr() as u64));
    assert_eq!((s.device_type, s.device_id, s.byte_offset), (1, 0, 0));
    assert_eq!((s.code, s.bits, s.lanes), (dl.code, dl.bits, dl.lanes));
    assert_eq!((s.shape(), s.strides()), (meta.shape.as_slice(), strides.as_slice()));
    if case.path == Path::ZeroCopy {
        assert_eq!(s.data, first, "{name}: legacy data = payload + byte_offset");
    }
    assert_eq!(gather(&meta.shape, &strides, item, &copy), case.expected, "{name}: legacy values read by C");
    delete_legacy_in_c(l);
    assert_eq!(live_exports(), live + 1, "{name}: the legacy deleter freed its export");
    println!("{name}: DLPack exports checked field by field through the C ABI");
    v
}

#[test]
fn c_and_rust_agree_on_the_dlpack_layout() {
    assert_eq!(c_layout(), rust_layout());
}

#[test]
fn host_tensors_across_processes() {
    let _watchdog = watchdog_guard("host_tensors_across_processes", Duration::from_secs(170));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("zcs/test/tensor_host/{}", std::process::id());
    let session = host_session(port, true);
    let subscriber = session.declare_subscriber(format!("{base}/t")).wait().unwrap();
    let child = spawn_child("child_entry", "publisher", &[(PORT_ENV, port.to_string()), (BASE_ENV, base.clone())]);

    let mut rest = tensor_support::recv_in_order(&subscriber, total_messages(), IO).into_iter();

    let cases = cases();
    let mut kept = None;
    let mut exports = Vec::new();
    for (i, (sample, case)) in rest.by_ref().take(cases.len()).zip(&cases).enumerate() {
        check_case(&sample, case);
        let export = check_exports(&sample, case);
        if i == STRIDED_BLOCK {
            kept = Some(export);
        } else {
            exports.push(export);
        }
    }
    for (sample, (payload, _, want)) in rest.by_ref().take(corrupt().len()).zip(corrupt()) {
        assert_eq!(sample.len(), payload.len());
        let got = sample.tensor_meta().unwrap_err();
        assert_eq!(got, want, "corrupt description");
        match sample.to_owned_tensor() {
            Err(TensorReadError::Meta(e)) => assert_eq!(e, want),
            other => panic!("to_owned_tensor on a corrupt description: {other:?}"),
        }
        assert!(matches!(sample.host_tensor(), Err(TensorReadError::Meta(_))));
        match sample.to_dlpack_versioned(&ConsumerStream::no_sync()) {
            Err(ExportError::Meta(e)) => assert_eq!(e, want),
            other => panic!("export of a corrupt description: {other:?}"),
        }
        println!("corrupt description on {} bytes ({}): {got}", payload.len(), sample.path());
    }
    let plain = rest.next().unwrap();
    assert_eq!(plain.tensor_meta(), Ok(None));
    assert!(matches!(plain.to_owned_tensor(), Err(TensorReadError::NoMeta)));
    assert!(matches!(plain.to_dlpack_legacy(&ConsumerStream::no_sync()), Err(ExportError::NoMeta)));
    for (sample, (meta, expected)) in rest.by_ref().zip(imported()) {
        assert_eq!(sample.tensor_meta().unwrap(), Some(meta.clone()), "imported description");
        let owned = sample.to_owned_tensor().unwrap();
        assert_eq!(owned.contiguous_bytes(), expected, "imported values");
        let strides = meta.effective_strides().unwrap();
        let item = meta.dtype.itemsize().unwrap() as usize;
        assert_eq!(gather(&meta.shape, &strides, item, owned.data()), expected);
        println!("imported {} {:?} strides {:?}: values checked", meta.dtype, meta.shape, meta.strides);
    }

    // The lease: every sample is gone; only the kept export holds the strided block.
    let kept = kept.expect("the strided block's export");
    tensor_support::assert_export_keeps_lease(&session, &base, exports, kept, delete_versioned_in_c, IO);

    session.zenoh().put(format!("{base}/bye"), "bye").wait().unwrap();
    wait_child(child, "publisher child", Duration::from_secs(60));
}

/// Entry point of the child process; ignored in normal runs.
#[test]
#[ignore = "entry point of the child process started by host_tensors_across_processes"]
fn child_entry() {
    match child_role().as_deref() {
        Some("publisher") => publisher_child(),
        other => panic!("unknown child role {other:?}"),
    }
}
