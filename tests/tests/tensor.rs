//! The tensor layer across processes, one body run on host memory (CI) and on CUDA (the
//! GPU machine): two real processes over loopback Zenoh TCP. The test is the subscriber
//! and checker; a child (this test binary re-run, see `child_entry`) is the publisher.
//! Both build the same cases (`support/tensor.rs`) on the medium's device, so the
//! receiver checks every description field and every value against what the publisher
//! was given, computed independently of the crate's own gather.
//!
//! Cases, published by every path the medium has (`put_tensor_from_host`, a loan then
//! `put_tensor`, on CUDA `put_tensor_from_device`): float16 bit patterns (inf, NaN,
//! subnormals), bfloat16, int64 extremes, non-contiguous strided views with a byte
//! offset (a block and inline), small inline tensors and a scalar; then corrupt
//! descriptions on the wire, a sample without one, and tensors from a C DLPack producer
//! (versioned and legacy structs) through `put_dlpack`. On host memory the publisher
//! first tries descriptions it must refuse (typed errors naming the field).
//!
//! Every value is checked on the receiver: in place (host bytes; on CUDA a
//! `TensorView` on a stream and a device→device copy into a block the test owns), as
//! an owned host copy, and through both DLPack exports, consumed by a C function
//! (`tests/c/consume_dlpack.c`) that reads the struct field by field and calls the
//! deleter. On CUDA the data is read back through the pointer the C side returned, on
//! the consumer stream the export was made for (an owned stream, the legacy and
//! per-thread default streams, a raw `CUstream` value, and `-1`), and a slow producer
//! checks the consumer-stream synchronisation: the producer's stream zeroes the block,
//! spins 300 ms, then copies the data in; the export returns at once, and a read
//! enqueued on the export's stream sees complete data while a read on another stream
//! (negative control) does not. The publisher's pool (asked over a Zenoh queryable)
//! shows the lease held by a DLPack export until the C consumer calls its deleter and
//! released right after.
//!
//! The CUDA test prints `SKIPPED <name>: <reason>` without a usable GPU; with
//! `ZCS_REQUIRE_GPU=1` it fails instead.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use zcs_tests::{Cuda, Host, Medium, MediumKind, child_role, spawn_child, wait_child, watchdog_guard};
use zenoh::Wait;
use zenoh_cuda_shm::dlpack::{
    ConsumerStream, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY, DlpackTensor, ExportError,
    ManagedTensorLegacy, ManagedTensorVersioned, live_exports,
};
use zenoh_cuda_shm::tensor_codec::TensorMeta;
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, Path, PutReport, TensorReadError};

#[allow(dead_code, reason = "the FFI is shared with other consumers of the C producer")]
#[path = "../c/dlpack_ffi.rs"]
mod dlpack_ffi;
#[path = "support/tensor_media.rs"]
mod tensor_media;
#[path = "support/tensor.rs"]
mod tensor_support;

use dlpack_ffi::{
    c_layout, delete_legacy_in_c, delete_versioned_in_c, inspect_legacy, inspect_versioned, rust_layout,
    zcs_dlpack_make_legacy, zcs_dlpack_make_versioned,
};
use tensor_media::TensorMedium;
use tensor_support::{Case, How, Import, KEPT, cases, check_summary, corrupt, gather, imports};

const PORT_ENV: &str = "ZCS_TENSOR_PORT";
const BASE_ENV: &str = "ZCS_TENSOR_BASE";
const MEDIUM_ENV: &str = "ZCS_TENSOR_MEDIUM";
const IO: Duration = Duration::from_secs(60);

fn session<M: Medium>(port: u16, listen: bool) -> GpuSession {
    M::open(zcs_tests::loopback_zenoh_config(listen.then_some(port), (!listen).then_some(port), None))
}

// ------------------------------------------------------------------------------------
// The publisher (child process)
// ------------------------------------------------------------------------------------

fn publisher_child<M: TensorMedium>() {
    let _watchdog = watchdog_guard("tensor publisher child", Duration::from_secs(280));
    let port: u16 = std::env::var(PORT_ENV).unwrap().parse().unwrap();
    let base = std::env::var(BASE_ENV).unwrap();
    let session = session::<M>(port, false);
    let tools = M::tools(&session);
    let bye = session.zenoh().declare_subscriber(format!("{base}/bye")).wait().unwrap();
    let go = session.zenoh().declare_subscriber(format!("{base}/go")).wait().unwrap();
    let publisher = Arc::new(session.declare_publisher(format!("{base}/t")).wait().unwrap());
    assert_eq!(publisher.backend(), M::KIND.backend());
    let _pool = tensor_support::serve_pool(&session, &base, &publisher);
    tensor_support::wait_zero_copy_subscriber(&publisher, IO);
    M::refusals(&publisher);
    let mut seq = 0;
    let mut next = |report: PutReport| {
        seq += 1;
        assert_eq!(report.seq, seq, "one message per case, in order");
    };
    for case in cases(M::device(&tools), M::DEVICE_COPIES) {
        next(match case.how {
            How::Host => publisher.put_tensor_from_host(&case.payload, &case.meta).unwrap(),
            How::Device => M::put_from_device(&tools, &publisher, &case),
            How::Loan => {
                let mut loan = publisher.loan(case.payload.len()).unwrap();
                loan.write_bytes(0, &case.payload).unwrap();
                publisher.put_tensor(loan, &case.meta).unwrap()
            }
        });
    }
    for (payload, meta, _) in corrupt() {
        next(publisher.put_bytes_meta(&payload, meta).unwrap());
    }
    next(publisher.put_bytes(&[5u8; 16]).unwrap());
    for import in imports(M::device(&tools)) {
        next(put_import::<M>(&tools, &publisher, &import));
    }
    let wait_go = || drop(go.recv_timeout(IO).unwrap().expect("go from the subscriber"));
    M::publisher_tail(&tools, &publisher, &wait_go, &mut next);
    println!("publisher: {seq} messages sent; waiting for the subscriber's checks");
    bye.recv_timeout(Duration::from_secs(200)).unwrap().expect("bye from the subscriber");
}

/// Publishes `import` as a C DLPack producer hands it over, its buffer in the medium's
/// memory: the versioned struct with explicit strides, or the legacy one with NULL
/// strides (compact, as pre-1.2 producers mean). The producer's deleter runs once,
/// after the copy.
fn put_import<M: TensorMedium>(tools: &M::Tools, publisher: &GpuPublisher, import: &Import) -> PutReport {
    let staged = M::stage(tools, &import.buffer);
    let meta = &import.meta;
    let dl = meta.dtype.to_dl();
    let ordinal = meta.device.device_id;
    let deleted = Cell::new(0);
    let stream = M::import_stream(tools);
    let report = match &import.strides {
        Some(strides) => {
            // SAFETY: the C side only stores the pointers; `staged` (the data), `meta`
            // and `strides` outlive the tensor, which is deleted inside `put_dlpack`
            // after the copy completed; `deleted` outlives it too.
            let raw = unsafe {
                zcs_dlpack_make_versioned(
                    staged.ptr,
                    M::DL_DEVICE_TYPE,
                    ordinal,
                    meta.rank() as i32,
                    meta.shape.as_ptr(),
                    strides.as_ptr(),
                    dl.code,
                    dl.bits,
                    dl.lanes,
                    import.byte_offset,
                    1,
                    0,
                    deleted.as_ptr(),
                )
            };
            // SAFETY: a fresh struct from the C producer, deleted once by its owner; its
            // data is the medium's memory covering the view.
            let t = unsafe { ManagedTensorVersioned::from_raw(raw) }.expect("C producer");
            publisher.put_dlpack(t, stream).unwrap()
        }
        None => {
            // SAFETY: as above; NULL strides.
            let raw = unsafe {
                zcs_dlpack_make_legacy(
                    staged.ptr,
                    M::DL_DEVICE_TYPE,
                    ordinal,
                    meta.rank() as i32,
                    meta.shape.as_ptr(),
                    std::ptr::null(),
                    dl.code,
                    dl.bits,
                    dl.lanes,
                    import.byte_offset,
                    deleted.as_ptr(),
                )
            };
            // SAFETY: as above.
            let t = unsafe { ManagedTensorLegacy::from_raw(raw) }.expect("C producer");
            publisher.put_dlpack(DlpackTensor::from(t), stream).unwrap()
        }
    };
    assert_eq!(deleted.get(), 1, "the deleter runs once, after the copy");
    report
}

// ------------------------------------------------------------------------------------
// The subscriber (this process)
// ------------------------------------------------------------------------------------

fn check_case<M: TensorMedium>(tools: &M::Tools, sample: &GpuSample, case: &Case) {
    let name = case.name;
    assert_eq!(sample.path(), case.path, "{name}: path");
    assert_eq!(sample.len(), case.payload.len(), "{name}: payload length");
    let meta = sample.tensor_meta().unwrap().expect("a description");
    assert_eq!(meta, case.meta, "{name}: description");
    let strides = meta.effective_strides().unwrap();
    let item = meta.dtype.itemsize().unwrap() as usize;
    M::check_reads(tools, sample, case);
    // Owned copy: offset 0, explicit strides, only the bytes the view touches.
    let owned = sample.to_owned_tensor().unwrap();
    let rebased = TensorMeta { strides: strides.clone(), byte_offset: 0, ..case.meta.clone() };
    assert_eq!(owned.meta(), &rebased, "{name}: owned description");
    let extent = case.meta.validate(case.payload.len() as u64).unwrap();
    assert_eq!(owned.data(), &case.payload[case.meta.byte_offset as usize..extent.end as usize]);
    assert_eq!(gather(&meta.shape, &strides, item, owned.data()), case.expected, "{name}: owned values");
    assert_eq!(owned.contiguous_bytes(), case.expected, "{name}: owned contiguous values");
    println!("{name}: description and {} values checked in place and copied", meta.numel().unwrap());
}

/// Exports `sample` both ways, has the C consumer read every field, reads the data
/// through the pointer it returned, and deletes the legacy export in C. Returns the
/// versioned export (still alive).
fn check_exports<M: TensorMedium>(tools: &M::Tools, sample: &GpuSample, case: &Case) -> ManagedTensorVersioned {
    let name = case.name;
    let meta = &case.meta;
    let strides = meta.effective_strides().unwrap();
    let extent = meta.validate(case.payload.len() as u64).unwrap();
    let len = extent.bytes as usize;
    let item = meta.dtype.itemsize().unwrap() as usize;
    let values = |bytes: &[u8]| gather(&meta.shape, &strides, item, bytes);
    let dl_device = (M::DL_DEVICE_TYPE, meta.device.device_id);
    let c_len = if M::C_READS_DATA { len } else { 0 };
    assert_eq!(sample.dlpack_device(), meta.device.into());
    let first = M::payload_address(tools, sample) + meta.byte_offset;

    let (consumer, read_on) = M::consumer(tools, case.consumer);
    let live = live_exports();
    let v = sample.to_dlpack_versioned(&consumer).unwrap();
    assert_eq!(live_exports(), live + 1);
    let (s, copy) = inspect_versioned(&v, c_len);
    assert_eq!((s.versioned, s.version_major, s.version_minor, s.has_deleter), (1, 1, 3, 1), "{name}: version");
    assert_eq!(s.manager_ctx, v.as_ptr() as u64, "{name}: manager_ctx is the export");
    check_summary(name, &s, meta, dl_device, c_len as u64);
    if s.flags & DLPACK_FLAG_BITMASK_IS_COPIED == 0 {
        assert_eq!(s.flags, DLPACK_FLAG_BITMASK_READ_ONLY, "{name}: in place: read-only, not copied");
        assert_eq!(s.data, first, "{name}: data = payload + byte_offset");
        assert!(M::C_READS_DATA || case.path == Path::ZeroCopy, "{name}: device bytes are copied for the export");
    } else {
        assert_eq!(case.path, Path::Inline, "{name}: only bytes samples are copied");
        assert_eq!(s.flags, DLPACK_FLAG_BITMASK_IS_COPIED);
    }
    let got = M::read(tools, read_on.as_ref(), s.data, len, copy);
    assert_eq!(values(&got), case.expected, "{name}: values through the versioned export ({:?})", case.consumer);

    let (legacy_consumer, legacy_on) = M::legacy_consumer(tools);
    let l = sample.to_dlpack_legacy(&legacy_consumer).unwrap();
    let (s, copy) = inspect_legacy(&l, c_len);
    assert_eq!((s.versioned, s.has_deleter, s.manager_ctx), (0, 1, l.as_ptr() as u64));
    check_summary(name, &s, meta, dl_device, c_len as u64);
    if case.path == Path::ZeroCopy {
        assert_eq!(s.data, first, "{name}: legacy data = payload + byte_offset");
    }
    let got = M::read(tools, legacy_on.as_ref(), s.data, len, copy);
    assert_eq!(values(&got), case.expected, "{name}: values through the legacy export");
    delete_legacy_in_c(l);
    assert_eq!(live_exports(), live + 1, "{name}: the legacy deleter freed its export");
    println!("{name}: DLPack exports checked field by field through the C ABI");
    v
}

/// The test body: see the module documentation.
fn tensors_across_processes<M: TensorMedium>(test: &'static str) {
    if !M::available(test) {
        return;
    }
    let _watchdog = watchdog_guard(test, Duration::from_secs(300));
    let port = zcs_tests::free_tcp_port();
    let base = format!("zcs/test/tensor/{}/{}", M::name(), std::process::id());
    let session = session::<M>(port, true);
    // Outlives every export (a raw-stream export fences its stream in its deleter).
    let tools = M::tools(&session);
    let subscriber = session.declare_subscriber(format!("{base}/t")).wait().unwrap();
    let env = [(PORT_ENV, port.to_string()), (BASE_ENV, base.clone()), (MEDIUM_ENV, M::name().to_owned())];
    let child = spawn_child("child_entry", "publisher", &env);

    let cases = cases(M::device(&tools), M::DEVICE_COPIES);
    let imports = imports(M::device(&tools));
    let n = cases.len() + corrupt().len() + 1 + imports.len();
    let mut rest = tensor_support::recv_in_order(&subscriber, n, IO).into_iter();

    let mut kept = None;
    let mut exports = Vec::new();
    for (sample, case) in rest.by_ref().take(cases.len()).zip(&cases) {
        check_case::<M>(&tools, &sample, case);
        let export = check_exports::<M>(&tools, &sample, case);
        if case.name == KEPT { kept = Some(export) } else { exports.push(export) }
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
    for (sample, import) in rest.by_ref().zip(&imports) {
        let meta = &import.meta;
        assert_eq!(sample.path(), M::SMALL_IMPORT_PATH, "imported {:?}", meta.shape);
        assert_eq!(sample.tensor_meta().unwrap().as_ref(), Some(meta), "imported description");
        let owned = sample.to_owned_tensor().unwrap();
        assert_eq!(owned.contiguous_bytes(), import.expected, "imported values");
        let strides = meta.effective_strides().unwrap();
        let item = meta.dtype.itemsize().unwrap() as usize;
        assert_eq!(gather(&meta.shape, &strides, item, owned.data()), import.expected);
        println!("imported {} {:?} strides {:?}: values checked", meta.dtype, meta.shape, meta.strides);
    }
    let go = || session.zenoh().put(format!("{base}/go"), "go").wait().unwrap();
    let recv = || subscriber.recv_timeout(IO).unwrap();
    M::subscriber_tail(&tools, &go, &recv, n as u64);

    // The lease: every sample is gone; only the kept export holds its block.
    let kept = kept.expect("the strided block's export");
    tensor_support::assert_export_keeps_lease(&session, &base, exports, kept, delete_versioned_in_c, IO);

    session.zenoh().put(format!("{base}/bye"), "bye").wait().unwrap();
    wait_child(child, "publisher child", IO);
}

#[test]
fn c_and_rust_agree_on_the_dlpack_layout() {
    assert_eq!(c_layout(), rust_layout());
}

zcs_tests::medium_tests! {
    tensors_across_processes => host_tensors_across_processes, gpu_tensors_and_dlpack_across_processes;
}

/// Entry point of the child process; ignored in normal runs.
#[test]
#[ignore = "entry point of the child process started by the *_across_processes tests"]
fn child_entry() {
    match (child_role().as_deref(), MediumKind::from_env(MEDIUM_ENV)) {
        (Some("publisher"), MediumKind::Host) => publisher_child::<Host>(),
        (Some("publisher"), MediumKind::Cuda) => publisher_child::<Cuda>(),
        (other, _) => panic!("unknown child role {other:?}"),
    }
}
