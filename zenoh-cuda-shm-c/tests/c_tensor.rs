//! Tensors and latency from C++: the tensor example (`examples/c/z_tensor.cpp`) and the
//! latency benchmark (`bench/c/zcs_latency.cpp`) against Rust in other processes, built
//! as `c_abi.rs` builds the C programs (the library installed with
//! `scripts/c-install.sh`, CMake, AddressSanitizer and UBSan):
//!
//! - Rust publishes float32 tensors (loans with `put_tensor`, host bytes with
//!   `put_tensor_from_host`; in blocks and inline) to `z_tensor sub`, which checks each
//!   description and every element; a negative control (a wrong element, a wrong shape,
//!   a sample without a description) must make it fail, naming each;
//! - `z_tensor pub` publishes to a Rust subscriber (copies and loans, alternately), which
//!   checks the description, every byte, the order and the path of each;
//! - `zcs_latency_cpp` prints a setup line and a `zero-copy-cpp` row per size with the
//!   fields of `zcs_latency`'s rows;
//! - the Python examples (`examples/python/pub.py`, `sub.py`) and `z_tensor`, both ways,
//!   where a Python with the package and NumPy (or PyTorch) is found: `ZCS_PYTHON`, else
//!   the venv of `scripts/python-build.sh`; otherwise that test prints `SKIPPED`, unless
//!   `ZCS_REQUIRE_PYTHON=1`.
//!
//! Every tensor of message `seq` holds seq - 1 in each element: the convention of the
//! Python examples, which check it the same way.
//!
//! On a GPU machine (`scripts/gpu-run.sh`, part `c`), `ZCS_C_PROGRAMS=<folder>` runs
//! programs built already (the GPU pack's, which find the library through
//! `LD_LIBRARY_PATH`) instead of building them, and `ZCS_C_DEVICE=cuda` puts every
//! session on the GPU, the test's and the programs', with tensors of 4 × 1080 × 1920.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use zcs_memory::cuda::sys;
use zcs_tests::free_tcp_port;
use zenoh_cuda_shm::tensor_codec::{DType, Device, TensorMeta};
use zenoh_cuda_shm::{GpuLoan, GpuSession, ZcsConfig};

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;
use common::{build_c, root, zenoh_json};

/// How long any program of these tests may run.
const LIMIT: Duration = Duration::from_secs(120);

/// The sessions' memory and the tensors' sizes: small on host memory under the
/// sanitizers, an image batch on the GPU.
struct Plan {
    device: &'static str,
    /// A tensor large enough for a block.
    shape: Vec<i64>,
    tensors: u64,
    /// Messages for the Python examples (pub.py puts ten a second).
    python_tensors: u64,
}

fn plan() -> Plan {
    match std::env::var("ZCS_C_DEVICE").as_deref() {
        // Fewer than a subscriber may hold at once (`max_holds_per_holder`, 64): however
        // far a publisher runs ahead, every block goes in place.
        Ok("cuda") => Plan { device: "cuda", shape: vec![4, 1080, 1920], tensors: 50, python_tensors: 30 },
        Ok("host") | Err(_) => Plan { device: "host", shape: vec![3, 160, 200], tensors: 12, python_tensors: 8 },
        Ok(other) => panic!("ZCS_C_DEVICE={other}: host or cuda"),
    }
}

/// 16 × 16 float32: 1 KiB, below the inline threshold.
const SMALL: [i64; 2] = [16, 16];

/// Where the C programs are.
struct Build {
    dir: PathBuf,
    /// Built by this test against the library it installed (run as `common::c_program`
    /// runs them), or built elsewhere (`ZCS_C_PROGRAMS`: they find their library
    /// through the caller's `LD_LIBRARY_PATH`, left as it is).
    here: bool,
}

/// The C programs: built once for all the tests of this binary, or given.
fn programs() -> Option<&'static Build> {
    static BUILD: OnceLock<Option<Build>> = OnceLock::new();
    BUILD
        .get_or_init(|| match std::env::var_os("ZCS_C_PROGRAMS") {
            Some(dir) => Some(Build { dir: PathBuf::from(dir), here: false }),
            None => build_c("c_tensor", "c-tensor-test").map(|dir| Build { dir, here: true }),
        })
        .as_ref()
}

fn c_program(build: &Build, name: &str) -> Command {
    match build.here {
        true => common::c_program(&build.dir, name),
        false => Command::new(build.dir.join(name)),
    }
}

/// A session with its blocks on `device` ("host" or "cuda"), on loopback TCP.
fn session(device: &str, listen: Option<u16>, connect: Option<u16>) -> GpuSession {
    let z = zenoh::Config::from_json5(&zenoh_json(listen, connect)).expect("zenoh config");
    let ours = ZcsConfig::from_json5(&format!(r#"{{device: "{device}"}}"#)).expect("our config");
    GpuSession::open(z, ours).wait().unwrap_or_else(|e| panic!("open a {device} session: {e}"))
}

/// What every element of message `seq` holds, in memory order.
fn element(seq: u64) -> [u8; 4] {
    ((seq - 1) as f32).to_ne_bytes()
}

fn numel(shape: &[i64]) -> usize {
    shape.iter().map(|&d| d as usize).product()
}

fn shape_flag(shape: &[i64]) -> String {
    shape.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// The description `z_tensor pub` gives (and `z_tensor sub` expects): float32, compact,
/// on the publisher's memory.
fn description(shape: &[i64], device: &str) -> TensorMeta {
    let dev = if device == "cuda" { Device::cuda(0) } else { Device::CPU };
    TensorMeta::contiguous(DType::F32, shape.to_vec(), dev)
}

fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// A program running with its stdout and stderr in one log file.
struct Running {
    child: Child,
    log: PathBuf,
    name: String,
}

/// Where the programs' logs go: beside the build this test made (replaced with it at
/// each run), else in a folder of this process under the temp dir.
fn log_dir() -> PathBuf {
    let d = match programs() {
        Some(b) if b.here => b.dir.parent().expect("the build's work folder").join("logs"),
        _ => std::env::temp_dir().join(format!("zcs-c-tensor-{}", std::process::id())),
    };
    std::fs::create_dir_all(&d).expect("log folder");
    d
}

fn start(cmd: &mut Command, name: &str) -> Running {
    let log = log_dir().join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    Running { child, log, name: name.to_owned() }
}

/// Waits for the program's end (killing it after `LIMIT`); its status and output.
fn finish(mut r: Running) -> (ExitStatus, String) {
    let t = Instant::now();
    let status = loop {
        if let Some(s) = r.child.try_wait().expect("try_wait") {
            break s;
        }
        if t.elapsed() > LIMIT {
            let _ = r.child.kill();
            let _ = r.child.wait();
            let text = std::fs::read_to_string(&r.log).unwrap_or_default();
            panic!("{} did not finish within {LIMIT:?}:\n{text}", r.name);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, std::fs::read_to_string(&r.log).expect("log"))
}

/// Waits until the program has written `text` (its "ready" line).
fn wait_for(r: &Running, text: &str) {
    let t = Instant::now();
    while !std::fs::read_to_string(&r.log).unwrap_or_default().contains(text) {
        assert!(t.elapsed() < LIMIT, "{} never wrote {text:?}", r.name);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The output of a program that must have succeeded.
fn finish_ok(r: Running) -> String {
    let name = r.name.clone();
    let (status, text) = finish(r);
    assert!(status.success(), "{name} failed ({status}):\n{text}");
    text
}

/// The line of `text` that starts with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

/// Waits until `p` serves `n` subscribers in place.
fn wait_zero_copy(p: &zenoh_cuda_shm::GpuPublisher, n: usize) {
    let t = Instant::now();
    while p.zero_copy_subscribers() < n {
        assert!(t.elapsed() < Duration::from_secs(30), "{}: no subscriber on the zero-copy path", p.key());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes `bytes` into a loan: by the CPU for host memory, by a copy on the loan's
/// stream for device memory (waited for, so `bytes` may go).
fn fill_loan(session: &GpuSession, loan: &mut GpuLoan, bytes: &[u8]) {
    match loan.device_ptr() {
        None => loan.as_mut_slice().expect("a host loan").copy_from_slice(bytes),
        Some(ptr) => {
            session.gpu().expect("a CUDA session's loan").bind().expect("bind the GPU");
            let stream = loan.stream().expect("a CUDA loan's stream").cu_stream();
            // SAFETY: the loan owns `bytes.len()` mapped bytes at `ptr` until its put;
            // `bytes` lives until the synchronize below; `stream` is the loan's, of the
            // context just made current.
            unsafe { sys::memcpy_htod_async(ptr, bytes.as_ptr(), bytes.len(), stream) }.expect("copy onto the GPU");
            // SAFETY: as above.
            unsafe { sys::stream_synchronize(stream) }.expect("synchronize the loan's stream");
        }
    }
}

/// How Rust publishes a message to `z_tensor sub`.
#[derive(Clone, Copy, Debug)]
enum Put {
    /// A loan written in place, `put_tensor`.
    Loan,
    /// Host bytes, `put_tensor_from_host`.
    Host,
}

/// Rust publishes `count` tensors of `shape` to `z_tensor sub` (loans and host bytes,
/// alternately); `spoil(seq, bytes, meta)` may spoil one. The subscriber's status and
/// output.
fn rust_to_cpp(
    build: &Build,
    plan: &Plan,
    key: &str,
    shape: &[i64],
    count: u64,
    spoil: impl Fn(u64, &mut Vec<u8>, &mut TensorMeta) -> bool,
) -> (ExitStatus, String) {
    let port = free_tcp_port();
    let session = session(plan.device, Some(port), None);
    let publisher = session.declare_publisher(key).wait().expect("publisher");
    let sub = start(
        c_program(build, "z_tensor")
            .args(["sub", "-k", key, "-e", &format!("tcp/127.0.0.1:{port}"), "-n", &count.to_string()])
            .args(["--shape", &shape_flag(shape), "--device", plan.device]),
        &format!("z_tensor-sub-{}", key.replace('/', "-")),
    );
    wait_zero_copy(&publisher, 1);
    for seq in 1..=count {
        let mut bytes = element(seq).repeat(numel(shape));
        let mut meta = description(shape, plan.device);
        let plain_bytes = spoil(seq, &mut bytes, &mut meta);
        let how = if seq % 2 == 1 { Put::Loan } else { Put::Host };
        let report = match (how, plain_bytes) {
            (_, true) => publisher.put_bytes(&bytes).expect("put bytes"),
            (Put::Loan, false) => {
                let mut loan = publisher.loan(bytes.len()).expect("loan");
                fill_loan(&session, &mut loan, &bytes);
                publisher.put_tensor(loan, &meta).expect("put_tensor")
            }
            (Put::Host, false) => publisher.put_tensor_from_host(&bytes, &meta).expect("put_tensor_from_host"),
        };
        assert_eq!(report.seq, seq);
    }
    finish(sub)
}

#[test]
fn rust_tensors_reach_the_cpp_example() {
    let Some(build) = programs() else { return };
    let plan = plan();
    // Loans travel as blocks whatever their size; host bytes below the inline threshold
    // inline.
    for (key, shape, paths) in [
        ("c-tensor/rust-to-cpp", plan.shape.clone(), "paths zero-copy"),
        ("c-tensor/rust-to-cpp-small", SMALL.to_vec(), "paths inline,zero-copy"),
    ] {
        let (status, text) = rust_to_cpp(build, &plan, key, &shape, plan.tensors, |_, _, _| false);
        let n = plan.tensors;
        assert!(status.success(), "z_tensor sub ({key}):\n{text}");
        let summary = line(&text, &format!("[sub] {n} tensors"));
        assert_eq!(summary, format!("[sub] {n} tensors: {n} ok, 0 bad, 0 lost; {paths}"), "{text}");
        println!("rust → c++ ({} {:?}): {summary}", plan.device, shape);
    }
}

#[test]
fn the_cpp_example_refuses_wrong_tensors() {
    let Some(build) = programs() else { return };
    let plan = plan();
    // Message 2: one element off; 3: another shape (the same bytes); 4: no description.
    let spoil = |seq: u64, bytes: &mut Vec<u8>, meta: &mut TensorMeta| {
        match seq {
            2 => {
                let i = (bytes.len() / 2) & !3;
                bytes[i..i + 4].copy_from_slice(&7.5f32.to_ne_bytes());
            }
            3 => meta.shape = vec![meta.shape.iter().product()],
            _ => {}
        }
        seq == 4
    };
    let (status, text) = rust_to_cpp(build, &plan, "c-tensor/spoilt", &plan.shape, 5, spoil);
    assert!(!status.success(), "z_tensor sub took wrong tensors:\n{text}");
    let bad = format!("BAD: element {} is 7.500000, expected 1", numel(&plan.shape) / 2);
    assert!(line(&text, "#2 ").ends_with(&bad), "{text}");
    assert!(line(&text, "#3 ").contains("BAD: shape ("), "{text}");
    assert!(line(&text, "#4 ").ends_with("BAD: no tensor description (published as plain bytes)"), "{text}");
    assert!(line(&text, "#5 ").ends_with(" ok"), "{text}");
    assert_eq!(line(&text, "[sub] 5 tensors"), "[sub] 5 tensors: 2 ok, 3 bad, 0 lost; paths zero-copy", "{text}");
}

#[test]
fn cpp_example_tensors_reach_rust() {
    let Some(build) = programs() else { return };
    let plan = plan();
    for (key, shape) in [("c-tensor/cpp-to-rust", plan.shape.clone()), ("c-tensor/cpp-to-rust-small", SMALL.to_vec())] {
        // Odd messages are copies, even ones loans. Loans and device copies travel as
        // blocks whatever their size; host copies below the inline threshold inline.
        let inline = numel(&shape) * 4 <= 65536 && plan.device == "host";
        let path = |seq: u64| if inline && seq % 2 == 1 { "inline" } else { "zero-copy" };
        let port = free_tcp_port();
        let count = plan.tensors;
        let publisher = start(
            c_program(build, "z_tensor")
                .args(["pub", "-k", key, "-l", &format!("tcp/127.0.0.1:{port}"), "-n", &count.to_string()])
                .args(["--shape", &shape_flag(&shape), "--device", plan.device, "--wait-zero-copy", "1"]),
            &format!("z_tensor-pub-{}", key.replace('/', "-")),
        );
        wait_for(&publisher, "[pub] ready");
        let session = session(plan.device, None, Some(port));
        let sub = session.declare_subscriber(key).wait().expect("subscriber");
        let want = description(&shape, plan.device);
        for seq in 1..=count {
            let s = sub.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|e| panic!("tensor {seq} from C++: {e}"));
            assert_eq!((s.seq(), s.path().to_string().as_str()), (seq, path(seq)), "tensor {seq} from C++");
            let meta = s.tensor_meta().expect("a valid description").expect("a description");
            assert_eq!(
                (meta.dtype, &meta.shape, meta.byte_offset, meta.device),
                (want.dtype, &want.shape, 0, want.device)
            );
            assert_eq!(meta.effective_strides().expect("strides"), compact_strides(&shape));
            let bytes = s.to_vec().expect("the tensor's bytes");
            assert_eq!(bytes.len(), numel(&shape) * 4);
            let e = element(seq);
            let wrong = bytes.chunks_exact(4).position(|c| c != e);
            assert_eq!(wrong, None, "tensor {seq} from C++: element {wrong:?} is not {}", seq - 1);
        }
        let text = finish_ok(publisher);
        let half = (count / 2).to_string();
        let how = if plan.device == "cuda" { "put_tensor_device" } else { "put_tensor_host" };
        let summary = line(&text, &format!("[pub] {count} tensors"));
        assert!(
            summary.ends_with(&format!("{} by copy ({how}), {half} from loans (put_tensor)", count - count / 2)),
            "{text}"
        );
        let paths = if inline { "inline and zero-copy" } else { "zero-copy" };
        println!(
            "c++ → rust ({} {shape:?}): {count} tensors, every byte and description checked, {paths}; {summary}",
            plan.device
        );
    }
}

/// The fields of a `latency` row of `zcs_latency` (bench/src/lib.rs, latency::row).
const ROW_FIGURES: [&str; 7] = [
    "one_way_p50_us",
    "one_way_p99_us",
    "one_way_max_us",
    "rtt_p50_us",
    "measured_one_way_p50_us",
    "measured_one_way_p99_us",
    "measured_one_way_max_us",
];

#[test]
fn cpp_latency_benchmark_prints_rows() {
    let Some(build) = programs() else { return };
    let plan = plan();
    let iters = 30;
    let out = c_program(build, "zcs_latency_cpp")
        .args(["--backend", plan.device, "--sizes", "4KiB,1MiB", "--iters", &iters.to_string(), "--warmup", "5"])
        .output()
        .expect("run zcs_latency_cpp");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "zcs_latency_cpp:\n{text}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let backend = if plan.device == "cuda" { "cuda-vmm" } else { "host-memfd" };
    assert_eq!(rows.len(), 3, "{text}");
    assert_eq!(rows[0]["bench"], "latency-setup", "{text}");
    assert_eq!((rows[0]["backend"].as_str(), rows[0]["iters"].as_u64()), (Some(backend), Some(iters)), "{text}");
    for (r, size) in rows[1..].iter().zip([4096u64, 1 << 20]) {
        assert_eq!(
            (r["bench"].as_str(), r["path"].as_str(), r["backend"].as_str(), r["size"].as_u64(), r["n"].as_u64()),
            (Some("latency"), Some("zero-copy-cpp"), Some(backend), Some(size), Some(iters)),
            "{r}"
        );
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number: {r}"));
        for k in ROW_FIGURES {
            assert!(f(k) > 0.0 && f(k) < 1e7, "{k}: {r}");
        }
        assert!(f("one_way_p50_us") <= f("one_way_p99_us") && f("one_way_p99_us") <= f("one_way_max_us"), "{r}");
        assert!(f("measured_one_way_p50_us") <= f("measured_one_way_p99_us"), "{r}");
        assert!(f("measured_one_way_p99_us") <= f("measured_one_way_max_us"), "{r}");
        assert_eq!(f("rtt_p50_us"), 2.0 * f("one_way_p50_us"), "{r}");
        // The pong's one way (publication to ready) is part of the round trip.
        assert!(f("measured_one_way_p50_us") < f("rtt_p50_us"), "{r}");
    }
    println!("zcs_latency_cpp ({backend}): {}", rows[1]);
}

/// A Python that imports the package and NumPy (or PyTorch), from `ZCS_PYTHON` or the
/// venv of `scripts/python-build.sh`.
fn python() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("ZCS_PYTHON") {
        Some(p) => vec![p.into()],
        None => vec![root().join("target/py-venv/bin/python")],
    };
    let found = candidates.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import zenoh_cuda_shm\ntry:\n import torch\nexcept ImportError:\n import numpy"])
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("ZCS_REQUIRE_PYTHON").is_none(),
            "ZCS_REQUIRE_PYTHON is set and no Python imports zenoh_cuda_shm with NumPy or PyTorch"
        );
        // Past libtest's capture, as the GPU tests' SKIPPED lines: scripts/test.sh counts them.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED cpp_example_and_the_python_examples: no Python with zenoh_cuda_shm (scripts/python-build.sh)"
        );
    }
    found
}

/// `examples/python`, of this checkout or of the one the GPU pack was carried to.
fn python_examples() -> PathBuf {
    let here = root().join("examples/python");
    if here.join("pub.py").exists() {
        here
    } else {
        std::env::current_dir().expect("current dir").join("examples/python")
    }
}

#[test]
fn cpp_example_and_the_python_examples() {
    let Some(build) = programs() else { return };
    let Some(python) = python() else { return };
    let plan = plan();
    let n = plan.python_tensors;
    let shape = shape_flag(&plan.shape);
    let examples = python_examples();

    // C++ → sub.py, which prints each tensor's path, shape and value (its minimum, equal
    // to its maximum: `ok`).
    let port = free_tcp_port();
    let sub = start(
        Command::new(&python)
            .arg(examples.join("sub.py"))
            .args(["--key", "c-tensor/cpp-to-py", "-n", &n.to_string(), "--device", plan.device])
            .args(["-l", &format!("tcp/127.0.0.1:{port}")])
            .current_dir(&examples)
            .env("PYTHONUNBUFFERED", "1"),
        "sub.py",
    );
    wait_for(&sub, "[sub] subscribed to");
    let publisher = start(
        c_program(build, "z_tensor")
            .args(["pub", "-k", "c-tensor/cpp-to-py", "-e", &format!("tcp/127.0.0.1:{port}"), "-n", &n.to_string()])
            .args(["--shape", &shape, "--device", plan.device, "--wait-zero-copy", "1"]),
        "z_tensor-pub-py",
    );
    let pub_text = finish_ok(publisher);
    let text = finish_ok(sub);
    let want_shape = format!("({})", plan.shape.iter().map(i64::to_string).collect::<Vec<_>>().join(", "));
    let mut paths = BTreeSet::new();
    for seq in 1..=n {
        let l = line(&text, &format!("#{seq} "));
        let mut words = l.split_whitespace();
        paths.insert(words.nth(1).expect("a path").to_owned());
        assert!(l.contains(&format!(" {want_shape} float32 on ")), "{l}");
        assert!(l.ends_with(&format!(": value {} ok", seq - 1)), "{l}\n{text}\n{pub_text}");
    }
    assert!(!text.contains("MISMATCH"), "{text}");
    assert!(text.contains(&format!("done: {n} messages")), "{text}");
    println!("c++ → python ({}): {n} tensors ok, paths {paths:?}", plan.device);

    // pub.py → C++: the C++ subscriber checks every element.
    let port = free_tcp_port();
    let sub = start(
        c_program(build, "z_tensor")
            .args(["sub", "-k", "c-tensor/py-to-cpp", "-l", &format!("tcp/127.0.0.1:{port}"), "-n", &n.to_string()])
            .args(["--shape", &shape, "--device", plan.device]),
        "z_tensor-sub-py",
    );
    // The subscriber listens before the publisher starts: pub.py does not wait for one.
    wait_for(&sub, "[sub] ready");
    let publisher = start(
        Command::new(&python)
            .arg(examples.join("pub.py"))
            .args(["--key", "c-tensor/py-to-cpp", "-n", &n.to_string(), "--shape", &shape, "--device", plan.device])
            .args(["-e", &format!("tcp/127.0.0.1:{port}")])
            .current_dir(&examples)
            .env("PYTHONUNBUFFERED", "1"),
        "pub.py",
    );
    let pub_text = finish_ok(publisher);
    let text = finish_ok(sub);
    let summary = line(&text, &format!("[sub] {n} tensors"));
    assert!(summary.starts_with(&format!("[sub] {n} tensors: {n} ok, 0 bad, 0 lost; paths ")), "{text}\n{pub_text}");
    println!("python → c++ ({}): {summary}", plan.device);
}
