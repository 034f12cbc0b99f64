//! The physics of the peer-GPU path on a host with two GPUs: how fast GPU 1 reads a
//! block that lives on GPU 0 in place (the block exported as an FD and mapped for GPU 1,
//! exactly as a `zero-copy-peer` subscriber maps it), against the raw peer copy of the
//! same bytes into GPU 1's memory (the physical reference) and GPU 1 reading its own
//! memory.
//!
//! Rows (JSON lines), each the median of `--iters` timed runs after `--warmup`:
//! - `local-read`: the check kernel on GPU 1 over a block of GPU 1;
//! - `zero-copy-peer-read`: the same kernel over GPU 0's block mapped for GPU 1;
//! - `peer-copy-raw`: `cuMemcpyDtoDAsync` from that mapping into a block of GPU 1.
//!
//! Every read is checked: the kernel counts the bytes that differ from the pattern GPU 0
//! wrote, and a row with any is an error. Host-timed (launch to synchronize), so small
//! sizes show the launch cost more than the link.
//!
//! ```text
//! zcs_peer_bench --sizes 1MiB,32MiB,256MiB,1GiB     # needs two GPUs with peer access
//! ```

use std::time::Instant;

use clap::Parser;
use serde_json::json;
use zcs_memory::cuda::kernels::Kernels;
use zcs_tests::{parse_size, percentile};
use zenoh_cuda_shm::cuda::{DeviceBlock, Gpu, ImportedBlock, Topology, copy};

#[derive(Parser, Debug)]
#[command(about = "zenoh-cuda-shm peer-GPU read and copy bandwidth (JSON lines)")]
struct Args {
    /// Sizes (e.g. `4KiB,1MiB,1GiB`).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4KiB,1MiB,8MiB,32MiB,256MiB,1GiB")]
    sizes: Vec<usize>,
    /// Timed runs per row.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed runs first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
}

/// Median and p99 of `f` run `iters` times after `warmup`, in µs.
fn time(args: &Args, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..args.warmup {
        f();
    }
    let mut us: Vec<f64> = (0..args.iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(f64::total_cmp);
    (percentile(&us, 50.0), percentile(&us, 99.0))
}

fn row(path: &str, size: usize, (p50, p99): (f64, f64), what: &str) {
    let gb_s = size as f64 / (p50 * 1e-6) / 1e9;
    println!(
        "{}",
        json!({"bench": "peer-bandwidth", "path": path, "size": size, "p50_us": p50, "p99_us": p99,
               "gb_per_s": gb_s, "what": what})
    );
}

fn main() {
    let args = Args::parse();
    let (gpu0, gpu1) = match (Gpu::open(0), Gpu::open(1)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => panic!("two GPUs needed: {e}"),
    };
    let topology = Topology::probe().expect("topology");
    assert!(topology.can_access(1, 0), "GPU 1 has no peer access to GPU 0");
    println!(
        "{}",
        json!({"bench": "peer-setup", "gpu0": gpu0.name(), "gpu1": gpu1.name(), "uuid0": gpu0.uuid().to_string(),
               "uuid1": gpu1.uuid().to_string(), "iters": args.iters, "warmup": args.warmup})
    );
    let (k0, k1) = (Kernels::load(&gpu0).expect("kernels on GPU 0"), Kernels::load(&gpu1).expect("kernels on GPU 1"));
    let (s0, s1) = (gpu0.new_stream().expect("stream 0"), gpu1.new_stream().expect("stream 1"));
    let counter = DeviceBlock::allocate(&gpu1, 4).expect("counter");
    for &size in &args.sizes {
        let seed = size as u64;
        let theirs = DeviceBlock::allocate(&gpu0, size).expect("block on GPU 0");
        // SAFETY: the block is mapped with ≥ size bytes and outlives the wait below.
        unsafe { k0.fill(&s0, theirs.device_ptr(), size as u64, seed) }.expect("fill on GPU 0");
        copy::wait(&s0).expect("wait for GPU 0");
        let fd = theirs.fd().try_clone_to_owned().expect("dup the block's FD");
        let mapped = ImportedBlock::import(&gpu1, fd, theirs.size()).expect("map GPU 0's block for GPU 1");
        let ours = DeviceBlock::allocate(&gpu1, size).expect("block on GPU 1");
        // SAFETY: as above, on GPU 1.
        unsafe { k1.fill(&s1, ours.device_ptr(), size as u64, seed) }.expect("fill on GPU 1");
        let len = size as u64;
        let read = |at: u64| {
            // SAFETY: `at..at+size` is a mapping of GPU 1 (its own block, or GPU 0's mapped
            // for it) alive for this loop iteration; the call returns after the check.
            let bad = unsafe { k1.count_mismatches(&s1, at, len, seed, &counter) }.expect("check on GPU 1");
            assert_eq!(bad, 0, "{size} bytes at {at:#x}: {bad} bytes differ from the pattern");
        };
        row("local-read", size, time(&args, || read(ours.device_ptr())), "GPU 1 reads its own memory");
        row(
            "zero-copy-peer-read",
            size,
            time(&args, || read(mapped.device_ptr())),
            "GPU 1 reads GPU 0's block in place, mapped as a zero-copy-peer subscriber maps it",
        );
        let raw = time(&args, || {
            // SAFETY: both ranges are mapped for GPU 1 with ≥ size bytes; nothing else
            // writes them meanwhile; the wait below ends the copy.
            unsafe { copy::device_to_device(&s1, ours.device_ptr(), mapped.device_ptr(), size) }.expect("peer copy");
            copy::wait(&s1).expect("wait for GPU 1");
        });
        row("peer-copy-raw", size, raw, "cuMemcpyDtoDAsync from GPU 0's block into GPU 1's memory");
        read(ours.device_ptr());
    }
}
