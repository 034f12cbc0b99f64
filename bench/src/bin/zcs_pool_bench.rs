//! Pool and import costs: loan→publish→return from a warm pool, and (on a GPU) the
//! cost of a new block — allocate+export+map in the producer, import+map in another
//! process, cold (first import in that process) and warm, and the first import in a
//! process that ran `warm_import_path` (what opening a CUDA session does) first.
//!
//! Prints one JSON object per measurement, one per line.
//!
//! ```text
//! zcs_pool_bench --backend cuda --iters 200000
//! zcs_pool_bench --backend host --iters 1000      # CI smoke: no GPU needed
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use zcs_pool::{Backend, CudaBackend, HolderId, HostBackend, Pool, PoolConfig};
use zcs_tests::{child_role, percentile, recv_msg, send_msg, spawn_child_bin};
use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};
use zenoh_cuda_shm::cuda::{DeviceBlock, Gpu, ImportedBlock, warm_import_path};

#[derive(Parser, Debug)]
#[command(about = "zenoh-cuda-shm pool and import benchmarks (JSON lines)")]
struct Args {
    /// Backend: `cuda`, `host`, or `auto` (cuda if a GPU is usable).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Timed iterations of the loan/return loop.
    #[arg(long, default_value_t = 100_000)]
    iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 1_000)]
    warmup: usize,
    /// Blocks per size for the import benchmark (the first is the cold one).
    #[arg(long, default_value_t = 8)]
    imports: usize,
    /// Sizes in MiB for the import benchmark.
    #[arg(long, value_delimiter = ',', default_value = "2,64,1024")]
    import_mib: Vec<usize>,
}

const SOCK_ENV: &str = "ZCS_BENCH_SOCK";
/// Set for an importer that warms its import path before the first import.
const WARM_ENV: &str = "ZCS_BENCH_WARM";

fn stats_ns(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    json!({
        "n": v.len(),
        "p50_ns": percentile(&v, 50.0),
        "p99_ns": percentile(&v, 99.0),
        "max_ns": v.last().copied().unwrap_or(f64::NAN),
    })
}

fn loan_return<B: Backend>(backend: B, args: &Args) {
    let kind = backend.kind();
    let pool = Pool::new(backend, PoolConfig::default()).expect("pool");
    let size = 2 << 20;
    let holder = HolderId::new(1);
    let one = |timed: bool, samples: &mut Vec<f64>| {
        let t = Instant::now();
        let loan = pool.loan(size).expect("loan");
        let published = loan.publish();
        published.lease(holder).expect("lease");
        let key = published.key();
        drop(black_box(published));
        pool.release(key, holder).expect("release");
        if timed {
            samples.push(t.elapsed().as_nanos() as f64);
        }
    };
    let mut samples = Vec::with_capacity(args.iters);
    for _ in 0..args.warmup {
        one(false, &mut samples);
    }
    for _ in 0..args.iters {
        one(true, &mut samples);
    }
    let mut out = json!({"bench": "loan_publish_lease_release", "backend": kind.to_string(), "size": size});
    out.as_object_mut().unwrap().extend(stats_ns(samples).as_object().unwrap().clone());
    println!("{out}");
}

fn import_bench(gpu: &Gpu, args: &Args) {
    let name = SocketName::random_abstract();
    let listener = ControlListener::bind(&name).expect("bind");
    let child = spawn_child_bin("importer", &[(SOCK_ENV, name.to_key_chunk())]);
    let conn = listener.accept_timeout(Duration::from_secs(60)).expect("importer connects");
    for &mib in &args.import_mib {
        let size = mib << 20;
        let mut alloc = Vec::new();
        let mut blocks = Vec::new();
        for _ in 0..args.imports {
            let t = Instant::now();
            let b = DeviceBlock::allocate(gpu, size).expect("allocate");
            alloc.push(t.elapsed().as_nanos() as f64);
            blocks.push(b);
        }
        let mut out = json!({"bench": "allocate_export_map", "backend": "cuda-vmm", "size": size});
        out.as_object_mut().unwrap().extend(stats_ns(alloc).as_object().unwrap().clone());
        println!("{out}");
        for (i, b) in blocks.iter().enumerate() {
            send_msg(&conn, &(size as u64, i + 1 == blocks.len()), &[b.fd()]);
        }
        let (times, _) = recv_msg::<Vec<f64>>(&conn, Duration::from_secs(60));
        println!(
            "{}",
            json!({"bench": "import_map_cold", "backend": "cuda-vmm", "size": size, "ns": times[0],
            "note": if mib == args.import_mib[0] { "first import in the process" } else { "first import of this size" }})
        );
        let mut out = json!({"bench": "import_map_warm", "backend": "cuda-vmm", "size": size});
        out.as_object_mut().unwrap().extend(stats_ns(times[1..].to_vec()).as_object().unwrap().clone());
        println!("{out}");
    }
    send_msg(&conn, &(0u64, true), &[]);
    zcs_tests::wait_child(child, "importer", Duration::from_secs(60));

    // A fresh importer that warms its import path first: its first import of a block
    // from another process, against `import_map_cold` above.
    let size = args.import_mib[0] << 20;
    let child = spawn_child_bin("importer", &[(SOCK_ENV, name.to_key_chunk()), (WARM_ENV, "1".into())]);
    let conn = listener.accept_timeout(Duration::from_secs(60)).expect("importer connects");
    let b = DeviceBlock::allocate(gpu, size).expect("allocate");
    send_msg(&conn, &(size as u64, true), &[b.fd()]);
    let (times, _) = recv_msg::<Vec<f64>>(&conn, Duration::from_secs(60));
    println!(
        "{}",
        json!({"bench": "import_map_first_after_warm_up", "backend": "cuda-vmm", "size": size, "ns": times[0],
        "note": "first import from another process after warm_import_path (run when a CUDA session opens)"})
    );
    send_msg(&conn, &(0u64, true), &[]);
    zcs_tests::wait_child(child, "importer", Duration::from_secs(60));
}

fn importer() {
    let gpu = Gpu::probe().expect("GPU in the importer");
    let name = SocketName::from_key_chunk(&std::env::var(SOCK_ENV).unwrap()).unwrap();
    let conn = ControlConn::connect(&name, Duration::from_secs(60)).unwrap();
    if std::env::var_os(WARM_ENV).is_some() {
        warm_import_path(&gpu).expect("warm the import path");
    }
    let mut times = Vec::new();
    // Imports stay mapped until the size is done, so every warm import is a new block.
    let mut keep = Vec::new();
    loop {
        let ((size, last), mut frame) = recv_msg::<(u64, bool)>(&conn, Duration::from_secs(60));
        let Some(fd) = frame.fds.pop() else { return };
        let t = Instant::now();
        let b = ImportedBlock::import(&gpu, fd, size as usize).expect("import");
        times.push(t.elapsed().as_nanos() as f64);
        keep.push(b);
        if last {
            send_msg(&conn, &std::mem::take(&mut times), &[]);
            keep.clear();
        }
    }
}

fn main() {
    if child_role().as_deref() == Some("importer") {
        importer();
        return;
    }
    let args = Args::parse();
    let gpu = match args.backend.as_str() {
        "host" => None,
        "cuda" => Some(Gpu::probe().unwrap_or_else(|e| panic!("--backend cuda: {e}"))),
        "auto" => Gpu::probe().ok(),
        other => panic!("unknown backend {other:?}"),
    };
    match gpu {
        Some(gpu) => {
            println!(
                "{}",
                json!({"bench": "device", "gpu": gpu.name(), "uuid": gpu.uuid().to_string(), "granularity": gpu.granularity()})
            );
            loan_return(CudaBackend::new(gpu.clone()), &args);
            loan_return(HostBackend::default(), &args);
            import_bench(&gpu, &args);
        }
        None => loan_return(HostBackend::default(), &args),
    }
}
