//! Helpers shared by the tensor tests (`tensor_host.rs`, `gpu_tensor.rs`), included
//! with `#[path]` so each test binary compiles its own copy: the parts of the two
//! tests that are the same on either backend (the publisher's pool queryable, the
//! messages in sequence order, the lease a DLPack export keeps) and the values both
//! build their cases from.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zenoh::Wait;
use zenoh_cuda_shm::dlpack::{ManagedTensorVersioned, live_exports};
use zenoh_cuda_shm::{GpuPublisher, GpuSample, GpuSession, GpuSubscriber};

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
