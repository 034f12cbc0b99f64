//! The tensor test's parts that are the same on either medium (`tensor.rs`): the
//! publisher's pool queryable, the messages in sequence order, the lease a DLPack export
//! keeps, and the cases both processes build, the same on host memory and on the GPU
//! but for the device in their descriptions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::dlpack_ffi::Summary;
use zenoh::Wait;
use zenoh_cuda_shm::dlpack::{ManagedTensorVersioned, live_exports};
use zenoh_cuda_shm::tensor_codec::{DType, DecodeError, Device, MetaError, TensorMeta};
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, GpuSubscriber, Path};

/// Answers `<base>/pool` with the number of `publisher`'s blocks in use (read by
/// [`blocks_in_use`] in the subscriber's process), while the returned queryable lives.
pub fn serve_pool(session: &GpuSession, base: &str, publisher: &Arc<GpuPublisher>) -> zenoh::query::Queryable<()> {
    let p = Arc::clone(publisher);
    session
        .zenoh()
        .declare_queryable(format!("{base}/pool"))
        .callback(move |q| {
            let _ = q.reply(q.key_expr().clone(), p.pool_stats().blocks_in_use.to_string()).wait();
        })
        .wait()
        .unwrap()
}

/// Waits (at most `io`) until the subscriber of the test reads in place.
pub fn wait_zero_copy_subscriber(publisher: &GpuPublisher, io: Duration) {
    let t = Instant::now();
    while publisher.zero_copy_subscribers() < 1 {
        assert!(t.elapsed() < io, "the subscriber never reached the zero-copy path");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The next `n` samples, ordered by sequence number, which must be `1..=n`: inline
/// bytes and block descriptors travel on different keys, so they may arrive out of
/// order.
pub fn recv_in_order(subscriber: &GpuSubscriber<flume::Receiver<GpuSample>>, n: usize, io: Duration) -> Vec<GpuSample> {
    let mut samples: Vec<GpuSample> = (0..n)
        .map(|i| subscriber.recv_timeout(io).unwrap_or_else(|e| panic!("message {i}: {e}; {:?}", subscriber.stats())))
        .collect();
    samples.sort_by_key(GpuSample::seq);
    assert_eq!(samples.iter().map(GpuSample::seq).collect::<Vec<_>>(), (1..=n as u64).collect::<Vec<_>>());
    samples
}

/// With every sample gone: dropping `exports` runs their deleters, `kept` alone still
/// holds its block's lease (the publisher's pool, asked through [`serve_pool`], has one
/// block in use), and the lease is released once the C consumer (`delete_in_c`) calls
/// the kept export's deleter.
pub fn assert_export_keeps_lease(
    session: &GpuSession,
    base: &str,
    exports: Vec<ManagedTensorVersioned>,
    kept: ManagedTensorVersioned,
    delete_in_c: fn(ManagedTensorVersioned),
    io: Duration,
) {
    let alive = live_exports();
    let dropped = exports.len();
    drop(exports);
    assert_eq!(live_exports(), alive - dropped, "dropping an owner runs its deleter");
    wait_blocks_in_use(session, base, 1, "while the export is alive", io);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(blocks_in_use(session, base, io), 1, "the export keeps its lease");
    delete_in_c(kept);
    assert_eq!(live_exports(), 0, "the C consumer's deleter call freed the export");
    wait_blocks_in_use(session, base, 0, "after the deleter", io);
    println!("lease held by the DLPack export until the C consumer called its deleter, then released");
}

/// The publisher's pool occupancy, asked through its `<base>/pool` queryable.
pub fn blocks_in_use(session: &GpuSession, base: &str, io: Duration) -> usize {
    let replies = session.zenoh().get(format!("{base}/pool")).wait().unwrap();
    let reply = replies.recv_timeout(io).unwrap().expect("the publisher answers");
    let sample = reply.into_result().expect("a reply sample");
    String::from_utf8(sample.payload().to_bytes().into_owned()).unwrap().parse().unwrap()
}

/// Polls the publisher's pool until `want` blocks are in use (at most `io`).
pub fn wait_blocks_in_use(session: &GpuSession, base: &str, want: usize, what: &str, io: Duration) {
    let t = Instant::now();
    loop {
        let n = blocks_in_use(session, base, io);
        if n == want {
            return;
        }
        assert!(t.elapsed() < io, "{what}: the publisher still has {n} blocks in use, expected {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// int64 extremes first, then a hash of the index.
pub fn i64_values(n: usize) -> Vec<i64> {
    let special = [i64::MIN, i64::MAX, -1, 0, 1, i64::MIN + 1];
    (0..n)
        .map(|i| special.get(i).copied().unwrap_or((i as i64).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64)))
        .collect()
}

/// Row-major gather through explicit strides (independent of the crate's).
pub fn gather(shape: &[i64], strides: &[i64], itemsize: usize, data: &[u8]) -> Vec<u8> {
    let numel: i64 = shape.iter().product();
    let mut out = Vec::with_capacity(numel.max(0) as usize * itemsize);
    for flat in 0..numel {
        let (mut rest, mut elem) = (flat, 0i64);
        for d in (0..shape.len()).rev() {
            elem += (rest % shape[d]) * strides[d];
            rest /= shape[d];
        }
        let at = elem as usize * itemsize;
        out.extend_from_slice(&data[at..at + itemsize]);
    }
    out
}

/// How the publisher sends a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// `put_tensor_from_host` (on CUDA the crate copies host→device).
    Host,
    /// Host→device into a scratch block of the test, then `put_tensor_from_device`
    /// (CUDA only).
    Device,
    /// A loan written with `write_bytes`, then `put_tensor`.
    Loan,
}

/// Which DLPack stream the versioned export of a case is made for on CUDA (host
/// exports are complete at hand-off: always `-1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumer {
    /// A stream the subscriber owns.
    Owned,
    /// The same stream, passed as a raw `CUstream` value.
    Raw,
    /// The per-thread default stream.
    PerThread,
    /// `-1`: no synchronisation, readable on any stream.
    NoSync,
}

/// One tensor the publisher sends and the subscriber checks.
pub struct Case {
    /// Named in every assertion about it.
    pub name: &'static str,
    /// Its description, on the medium's device.
    pub meta: TensorMeta,
    /// The bytes published.
    pub payload: Vec<u8>,
    /// The elements in row-major order, computed without the crate.
    pub expected: Vec<u8>,
    /// How it is published.
    pub how: How,
    /// The path it must arrive on.
    pub path: Path,
    /// The stream its versioned export is made for (CUDA).
    pub consumer: Consumer,
}

/// The case whose export is kept to check the lease.
pub const KEPT: &str = "strided float32 loan";

fn ne<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// float16 bit patterns: ±0, ±1, ±inf, NaN, the smallest subnormal, the largest
/// subnormal, the smallest normal, ±max, 1/3, -2, 3.14; then a hash of the index.
fn f16_bits(n: usize) -> Vec<u16> {
    let special = [
        0x0000u16, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3555,
        0xC000, 0x4248,
    ];
    (0..n).map(|i| special.get(i).copied().unwrap_or(((i as u32).wrapping_mul(2_246_822_519) >> 16) as u16)).collect()
}

/// bfloat16 bit patterns (±0, ±1, ±inf, NaN, the smallest subnormal, max, pi), then a
/// hash of the index.
fn bf16_bits(n: usize) -> Vec<u16> {
    let special = [0x0000u16, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x7F7F, 0x4049];
    (0..n).map(|i| special.get(i).copied().unwrap_or(((i as u32).wrapping_mul(2_654_435_761) >> 16) as u16)).collect()
}

/// A `rows`x`cols` float32 buffer and the view at element `first` taking every
/// `row_step`-th row and every `col_step`-th column, `n`x`m` elements: element (i, j)
/// is buffer[first + row_step·cols·i + col_step·j]. Returns (description, buffer bytes,
/// elements in row-major order).
fn strided(
    dev: Device,
    (rows, cols): (usize, usize),
    first: usize,
    (row_step, col_step): (usize, usize),
    (n, m): (usize, usize),
) -> (TensorMeta, Vec<u8>, Vec<u8>) {
    let base: Vec<f32> = (0..rows * cols).map(|k| k as f32 * 0.25 - 1000.0).collect();
    let meta = TensorMeta::contiguous(DType::F32, vec![n as i64, m as i64], dev)
        .with_strides(vec![(row_step * cols) as i64, col_step as i64])
        .with_byte_offset(first as u64 * 4);
    let mut expected = Vec::new();
    for i in 0..n {
        for j in 0..m {
            expected.extend_from_slice(&base[first + row_step * cols * i + col_step * j].to_ne_bytes());
        }
    }
    (meta, ne(&base, f32::to_ne_bytes), expected)
}

/// The cases, on device `dev`; `device_copies`: whether the medium publishes from device
/// memory (CUDA), else that case is published from the host.
pub fn cases(dev: Device, device_copies: bool) -> Vec<Case> {
    let case = |name, meta, payload: Vec<u8>, expected: Option<Vec<u8>>, how, path, consumer| Case {
        name,
        meta,
        expected: expected.unwrap_or_else(|| payload.clone()),
        payload,
        how,
        path,
        consumer,
    };
    let contiguous = |dtype, shape: &[i64]| TensorMeta::contiguous(dtype, shape.to_vec(), dev);
    let small = ne(&(0..16).map(|i: i32| i * i - 7).collect::<Vec<_>>(), i32::to_ne_bytes);
    // 300x128, the 149x40 view at (1, 3), every other row, every third column.
    let (big, big_payload, big_expected) = strided(dev, (300, 128), 131, (2, 3), (149, 40));
    // 4x8, the 3x4 view at (1, 1), every row, every other column.
    let (little, little_payload, little_expected) = strided(dev, (4, 8), 9, (1, 2), (3, 4));
    let (bf16_name, bf16_how) =
        if device_copies { ("bfloat16 from device", How::Device) } else { ("bfloat16 from host", How::Host) };
    use Consumer::*;
    vec![
        case(
            "float16 inline",
            contiguous(DType::F16, &[3, 5]),
            ne(&f16_bits(15), u16::to_ne_bytes),
            None,
            How::Host,
            Path::Inline,
            Owned,
        ),
        case(
            "float16 from host",
            contiguous(DType::F16, &[256, 300]),
            ne(&f16_bits(256 * 300), u16::to_ne_bytes),
            None,
            How::Host,
            Path::ZeroCopy,
            Owned,
        ),
        // 65,792 bytes: just above the inline threshold (64 KiB).
        case(
            bf16_name,
            contiguous(DType::BF16, &[128, 257]),
            ne(&bf16_bits(128 * 257), u16::to_ne_bytes),
            None,
            bf16_how,
            Path::ZeroCopy,
            NoSync,
        ),
        case(
            "int64 loan",
            contiguous(DType::I64, &[1000, 17]).with_strides(vec![17, 1]),
            ne(&i64_values(1000 * 17), i64::to_ne_bytes),
            None,
            How::Loan,
            Path::ZeroCopy,
            PerThread,
        ),
        case(KEPT, big, big_payload, Some(big_expected), How::Loan, Path::ZeroCopy, Raw),
        case("strided float32 inline", little, little_payload, Some(little_expected), How::Host, Path::Inline, Owned),
        case("int32 inline", contiguous(DType::I32, &[4, 4]), small, None, How::Host, Path::Inline, Owned),
        case(
            "float64 scalar",
            contiguous(DType::F64, &[]),
            (-0.1f64).to_ne_bytes().to_vec(),
            None,
            How::Host,
            Path::Inline,
            NoSync,
        ),
    ]
}

/// Payloads published raw, with metadata that is not a valid description of them, and
/// the error each must give on the receiver.
pub fn corrupt() -> Vec<(Vec<u8>, Option<Vec<u8>>, DecodeError)> {
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

/// A tensor the publisher takes from a C DLPack producer.
pub struct Import {
    /// The producer's buffer.
    pub buffer: Vec<u8>,
    /// Where the tensor starts in it.
    pub byte_offset: u64,
    /// `None`: compact (the legacy struct, NULL strides, as pre-1.2 producers mean).
    pub strides: Option<Vec<i64>>,
    /// The description the receiver must see (offset 0, on the medium's device).
    pub meta: TensorMeta,
    /// The elements in row-major order.
    pub expected: Vec<u8>,
}

/// The DLPack imports: a versioned column-major 64x48 float32 after 64 floats of
/// padding, a legacy compact 33x10 int16 with NULL strides, and two small ones: a
/// versioned column-major 2x3 int32 after one element of padding, and a legacy compact
/// 5x7 uint8.
pub fn imports(dev: Device) -> Vec<Import> {
    let val = |i: usize, j: usize| (i * 1000 + j) as f32 - 0.5;
    let mut buf = vec![f32::NAN; 64 + 64 * 48];
    let mut expected = Vec::new();
    for i in 0..64 {
        for j in 0..48 {
            buf[64 + i + 64 * j] = val(i, j);
            expected.extend_from_slice(&val(i, j).to_ne_bytes());
        }
    }
    let l = ne(&(0..330).map(|k| (k * 97 % 65_521 - 32_000) as i16).collect::<Vec<_>>(), i16::to_ne_bytes);
    vec![
        Import {
            buffer: ne(&buf, f32::to_ne_bytes),
            byte_offset: 256,
            strides: Some(vec![1, 64]),
            meta: TensorMeta::contiguous(DType::F32, vec![64, 48], dev).with_strides(vec![1, 64]),
            expected,
        },
        Import {
            buffer: l.clone(),
            byte_offset: 0,
            strides: None,
            meta: TensorMeta::contiguous(DType::I16, vec![33, 10], dev),
            expected: l,
        },
        Import {
            // (i, j) at 1 + i + 2j.
            buffer: ne(&[-99i32, 10, 11, 20, 21, 30, 31], i32::to_ne_bytes),
            byte_offset: 4,
            strides: Some(vec![1, 2]),
            meta: TensorMeta::contiguous(DType::I32, vec![2, 3], dev).with_strides(vec![1, 2]),
            expected: ne(&[10i32, 20, 30, 11, 21, 31], i32::to_ne_bytes),
        },
        Import {
            buffer: (0..35u8).map(|x| x.wrapping_mul(37)).collect(),
            byte_offset: 0,
            strides: None,
            meta: TensorMeta::contiguous(DType::U8, vec![5, 7], dev),
            expected: (0..35u8).map(|x| x.wrapping_mul(37)).collect(),
        },
    ]
}

/// Checks the fields the C consumer read against the description: the device
/// (`dl_device`: DLPack's type and id), dtype, shape, strides (always explicit but for a
/// scalar, whose arrays are NULL), the offset folded into the data pointer, and how many
/// bytes the C side read (`host_copied`).
pub fn check_summary(name: &str, s: &Summary, meta: &TensorMeta, dl_device: (i32, i32), host_copied: u64) {
    let strides = meta.effective_strides().unwrap();
    let dl = meta.dtype.to_dl();
    let scalar = i32::from(meta.rank() == 0);
    assert_eq!((s.device_type, s.device_id), dl_device, "{name}: device");
    assert_eq!(s.ndim as usize, meta.rank(), "{name}: ndim");
    assert_eq!((s.code, s.bits, s.lanes), (dl.code, dl.bits, dl.lanes), "{name}: dtype");
    assert_eq!((s.shape_null, s.strides_null), (scalar, scalar), "{name}: explicit arrays");
    assert_eq!(s.shape(), meta.shape.as_slice(), "{name}: shape");
    assert_eq!(s.strides(), strides.as_slice(), "{name}: strides always explicit");
    assert_eq!(s.byte_offset, 0, "{name}: byte_offset folded into data");
    assert_eq!(s.host_copied, host_copied, "{name}: bytes the C side read");
}
