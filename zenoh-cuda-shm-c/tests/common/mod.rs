//! What the tests that build and run C programs share: the CMake build of the examples
//! and C tests against the library this build made, the sanitizers' settings, and the
//! host-memory sessions on loopback TCP the programs meet.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use zenoh_cuda_shm::{GpuSession, ZcsConfig};

/// The workspace's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf()
}

/// `target/<profile>/deps`, where cargo put the shared and static libraries it built
/// for this test (a `cargo build` copies them up to `target/<profile>`).
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs the library into a fresh prefix under `target/<profile>/<work>` and builds
/// the C programs with CMake there; their build folder, or `None` without cmake (the
/// test named `test` then prints `SKIPPED`, unless `ZCS_REQUIRE_CMAKE=1`).
pub fn build_c(test: &str, work: &str) -> Option<PathBuf> {
    if Command::new("cmake").arg("--version").stdout(Stdio::null()).status().is_err() {
        assert!(std::env::var_os("ZCS_REQUIRE_CMAKE").is_none(), "ZCS_REQUIRE_CMAKE is set and cmake is not found");
        println!("SKIPPED {test}: no cmake on this machine (pip install cmake)");
        return None;
    }
    let work = deps_dir().parent().expect("target/<profile>").join(work);
    let _ = std::fs::remove_dir_all(&work);
    let (prefix, build) = (work.join("prefix"), work.join("build"));
    run(
        Command::new(root().join("scripts/c-install.sh")).arg("--from").arg(deps_dir()).arg(&prefix),
        "scripts/c-install.sh",
    );
    run(
        Command::new("cmake")
            .arg("-S")
            .arg(root().join("examples/c"))
            .arg("-B")
            .arg(&build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
            .args(["-DZCS_ASAN=ON", "-DZCS_C_TESTS=ON"]),
        "cmake configure",
    );
    run(Command::new("cmake").arg("--build").arg(&build).args(["-j", "2"]), "cmake build");
    Some(build)
}

/// A C program of the build, under the sanitizers' settings for these tests: leak
/// reports off (Zenoh's runtime keeps threads and statics until exit), errors fatal.
/// Without cargo's `LD_LIBRARY_PATH`, which lists `target/<profile>` (where a `cargo
/// build` of another day may have left an older shared library) and would win over the
/// program's run path to the library this test installed.
pub fn c_program(build: &Path, name: &str) -> Command {
    let mut c = Command::new(build.join(name));
    c.env_remove("LD_LIBRARY_PATH")
        .env("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0:halt_on_error=1")
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1");
    c
}

/// A Zenoh peer configuration (JSON5) on loopback TCP, without scouting.
pub fn zenoh_json(listen: Option<u16>, connect: Option<u16>) -> String {
    let mut s = String::from(r#"{mode: "peer", scouting: {multicast: {enabled: false}}"#);
    if let Some(p) = listen {
        s += &format!(r#", listen: {{endpoints: ["tcp/127.0.0.1:{p}"]}}"#);
    }
    if let Some(p) = connect {
        s += &format!(r#", connect: {{endpoints: ["tcp/127.0.0.1:{p}"]}}"#);
    }
    s + "}"
}

/// A session on host memory with [`zenoh_json`]'s configuration.
pub fn host_session(listen: Option<u16>, connect: Option<u16>) -> GpuSession {
    let z = zenoh::Config::from_json5(&zenoh_json(listen, connect)).expect("zenoh config");
    let ours = ZcsConfig::from_json5(r#"{device: "host"}"#).expect("our config");
    GpuSession::open(z, ours).wait().expect("open a host session")
}
