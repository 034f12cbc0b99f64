//! Helpers shared by the tensor tests (`tensor_host.rs`, `gpu_tensor.rs`), included
//! with `#[path]` so each test binary compiles its own copy.

use std::time::{Duration, Instant};

use zenoh::Wait;
use zenoh_cuda_shm::GpuSession;

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
