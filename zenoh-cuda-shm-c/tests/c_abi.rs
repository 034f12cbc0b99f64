//! The C ABI from C: the library this build made, installed with
//! `scripts/c-install.sh`, found by CMake (`find_package(zenoh_cuda_shm)`); the C
//! examples and the hostile-use test built against it with AddressSanitizer and UBSan.
//!
//! - hostile use (null, stale and made-up handles, double drops, use after close, bad
//!   configurations and lengths) returns the documented errors;
//! - a C subscriber (linked statically) receives frames from this Rust process, and a
//!   C publisher (linked to the shared library) sends frames to it, in other processes,
//!   every byte checked on both sides.
//!
//! Needs `cmake` (CI installs it); without it the test prints `SKIPPED`, unless
//! `ZCS_REQUIRE_CMAKE=1` makes that a failure.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{build_c, c_program, host_session, zenoh_json};
use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zcs_tests::free_tcp_port;

const FRAMES: u64 = 20;
const SIZE: usize = 300 * 1024 + 5;

#[test]
fn c_programs_use_the_abi_as_documented() {
    let Some(build) = build_c("c_abi", "c-abi-test") else { return };

    // The examples' flags, before anything runs.
    c_examples_name_a_bad_flag_and_print_their_usage(&build);

    // Hostile use, under the sanitizers.
    let out =
        c_program(&build, "zcs_c_hostile").arg(zenoh_json(Some(free_tcp_port()), None)).output().expect("hostile");
    assert!(
        out.status.success(),
        "hostile use of the C ABI:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Rust publishes, C subscribes.
    let port = free_tcp_port();
    let session = host_session(Some(port), None);
    let publisher = session.declare_publisher("c-abi/rust-to-c").wait().expect("publisher");
    let sub = c_program(&build, "z_cuda_sub")
        .args(["-k", "c-abi/rust-to-c", "-e", &format!("tcp/127.0.0.1:{port}"), "-n", &FRAMES.to_string()])
        .args(["--device", "host", "-m", "peer"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the C subscriber");
    let t = Instant::now();
    while publisher.aware_subscribers() == 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "the C subscriber never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    for seq in 1..=FRAMES {
        let mut loan = publisher.loan(SIZE).expect("loan");
        fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq);
        assert_eq!(publisher.put(loan).expect("put").seq, seq);
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = sub.wait_with_output().expect("the C subscriber");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the C subscriber:\n{text}");
    assert!(text.contains(&format!("[sub] {FRAMES} frames, 0 bad")), "{text}");
    let summary = format!("[sub] done: {FRAMES} messages checked of {FRAMES} received (zero-copy ");
    assert!(text.lines().any(|l| l.starts_with(&summary) && l.ends_with("; lost 0, duplicates dropped 0")), "{text}");
    println!("rust → c: {}", text.lines().find(|l| l.contains("frames")).unwrap_or(""));
    drop(publisher);
    drop(session);

    // C publishes, Rust subscribes; the publisher's Zenoh configuration from a file (-c).
    let port = free_tcp_port();
    let config = build.join("c-to-rust.json5");
    std::fs::write(&config, zenoh_json(Some(port), None)).expect("write the Zenoh configuration");
    let publisher = c_program(&build, "z_cuda_pub")
        .args(["-k", "c-abi/c-to-rust", "-c", config.to_str().expect("a UTF-8 path"), "-n", &FRAMES.to_string()])
        .args(["-s", &SIZE.to_string(), "--device", "host"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the C publisher");
    std::thread::sleep(Duration::from_millis(300));
    let session = host_session(None, Some(port));
    let sub = session.declare_subscriber("c-abi/c-to-rust").wait().expect("subscriber");
    for want in 1..=FRAMES {
        let s = sub.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|e| panic!("frame {want} from C: {e}"));
        assert_eq!((s.seq(), s.len()), (want, SIZE), "frame from C");
        let data = s.host_bytes().expect("host data");
        assert_eq!(check_pattern(&data, 0, want), None, "frame {want} from C has wrong bytes");
    }
    let out = publisher.wait_with_output().expect("the C publisher");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the C publisher:\n{text}");
    println!("c → rust: {FRAMES} frames of {SIZE} bytes, every byte checked; {}", text.trim());

    c_examples_wait_aloud_and_end_on_sigterm_with_a_summary(&build);
}

/// As the Rust examples: a C subscriber with nothing to receive says so after 2 s, and
/// SIGTERM ends it and the publisher with their summaries, status 0.
fn c_examples_wait_aloud_and_end_on_sigterm_with_a_summary(build: &std::path::Path) {
    use std::io::{BufRead, BufReader};
    let terminate = |name: &str, args: &[&str], ready: &str| {
        let mut child = c_program(build, name)
            .args(args)
            .args(["--device", "host", "-n", "0", "-l", &format!("tcp/127.0.0.1:{}", free_tcp_port())])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut seen = String::new();
        while !seen.lines().any(|l| l.starts_with(ready)) {
            assert!(out.read_line(&mut seen).expect("read") > 0, "{name} ended before {ready:?}:\n{seen}");
        }
        let killed = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        assert!(killed.is_ok_and(|s| s.success()), "kill -TERM {name}");
        let status = child.wait().expect("wait");
        std::io::Read::read_to_string(&mut out, &mut seen).expect("read");
        assert!(status.success(), "{name} ended by SIGTERM with {status}:\n{seen}");
        seen
    };
    let text = terminate("z_cuda_sub", &["-k", "c-abi/nobody"], "[sub] waiting for a publisher on 'c-abi/nobody'");
    assert!(text.lines().any(|l| l.starts_with("[sub] interrupted: 0 messages checked of 0 received")), "{text}");
    let text = terminate("z_cuda_pub", &["-k", "c-abi/nobody", "-s", "4096"], "[pub] publishing on 'c-abi/nobody'");
    assert!(text.lines().any(|l| l.starts_with("[pub] interrupted: ")), "{text}");

    // A publisher of ours on a key the subscriber's does not match is named after the
    // waiting line.
    let port = free_tcp_port();
    let session = host_session(Some(port), None);
    let _elsewhere = session.declare_publisher("c-abi/camra").wait().expect("publisher");
    let mut child = c_program(build, "z_cuda_sub")
        .args(["-k", "c-abi/camera", "-e", &format!("tcp/127.0.0.1:{port}"), "--device", "host", "-n", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the C subscriber");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut lines: Vec<String> = Vec::new();
    let waiting = "[sub] waiting for a publisher on 'c-abi/camera'…";
    while lines.iter().rev().nth(1).is_none_or(|l| l.trim_end() != waiting) {
        let mut line = String::new();
        assert!(out.read_line(&mut line).expect("read") > 0, "z_cuda_sub ended early:\n{}", lines.concat());
        lines.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        lines.last().map(|l| l.trim_end()),
        Some("[sub] publishers seen on other keys: 'c-abi/camra' (plain Zenoh publishers are not listed)"),
        "{}",
        lines.concat()
    );
}

/// The C examples' flags are the Rust examples' (`-k -m -e -l -c -n`, `--device`, and `-s`
/// for the publisher); a flag they do not take, or a value they refuse, is named, then
/// the whole usage text follows (status 2); `-h` prints it alone (status 0).
fn c_examples_name_a_bad_flag_and_print_their_usage(build: &std::path::Path) {
    let run = |name: &str, args: &[&str]| {
        let out = c_program(build, name).args(args).output().unwrap_or_else(|e| panic!("{name}: {e}"));
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), stdout.into_owned(), stderr.into_owned())
    };
    let usage = ["-k, --key KEY", "-m, --mode MODE", "-e, --connect ENDPOINT", "-l, --listen ENDPOINT"];
    let usage = [&usage[..], &["-c, --config FILE", "--device DEVICE", "-n, --count N", "-h, --help"]].concat();
    for (name, args, error) in [
        ("z_cuda_pub", &["--bogus", "1"][..], "error: unknown flag '--bogus'"),
        ("z_cuda_pub", &["-m", "clinet"][..], "error: -m/--mode takes peer, client or router, not 'clinet'"),
        ("z_cuda_pub", &["-n", "-3"][..], "error: -n/--count takes a whole number, not '-3'"),
        ("z_cuda_pub", &["-s", "lots"][..], "error: -s/--size takes a byte count, not 'lots'"),
        ("z_cuda_sub", &["--device", "gpu"][..], "error: --device takes auto, host or cuda, not 'gpu'"),
        ("z_cuda_sub", &["-s", "10"][..], "error: unknown flag '-s'"),
        ("z_cuda_sub", &["-k"][..], "error: a value is missing after '-k'"),
        (
            "z_cuda_sub",
            &["-c", "z.json5", "-e", "tcp/127.0.0.1:7447"][..],
            "error: -c/--config takes mode and endpoints from the file: drop -m, -e and -l, or -c",
        ),
        ("z_tensor", &["sub", "--how", "copy"][..], "error: unknown flag '--how'"),
        ("z_tensor", &["pub", "-m", "routr"][..], "error: -m/--mode takes peer, client or router, not 'routr'"),
        (
            "z_tensor",
            &["pub", "--shape", "4,x"][..],
            "error: --shape takes sizes above 0 separated by commas, not '4,x'",
        ),
    ] {
        let (code, stdout, stderr) = run(name, args);
        assert_eq!(code, Some(2), "{name} {args:?}: {stdout}{stderr}");
        let mut lines = stderr.lines();
        assert_eq!(lines.next(), Some(error), "{name} {args:?}:\n{stderr}");
        assert!(
            lines.next().is_some_and(|l| l.starts_with(&format!("usage: {}", build.join(name).display()))),
            "{stderr}"
        );
        for flag in &usage {
            assert!(stderr.lines().any(|l| l.trim_start().starts_with(flag)), "{name}: no {flag:?} in\n{stderr}");
        }
        assert_eq!(stderr.contains("-s, --size BYTES"), name == "z_cuda_pub", "{name}:\n{stderr}");
    }
    let (code, stdout, stderr) = run("z_tensor", &["--help"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("--shape D,D,...") && stdout.contains("-m, --mode MODE") && stderr.is_empty(), "{stdout}");
    let (code, _, stderr) = run("z_cuda_pub", &["-c", "/nonexistent/zenoh.json5"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("error: -c/--config /nonexistent/zenoh.json5: cannot read it"), "{stderr}");
}
