//! zenoh-cuda-shm's router plugin, end to end, in real routers:
//!
//! - stock zenohd 1.10.2 (built by `scripts/zenohd.sh`, found through `ZCS_ZENOHD_DIR`)
//!   loading `libzenoh_plugin_cuda_shm.so` and zenoh's REST plugin;
//! - `zenoh-bridge-cuda-shm`, which links both plugins statically.
//!
//! In each, the example publisher and subscriber (`z_cuda_pub`, `z_cuda_sub`) run as
//! Zenoh clients of the router; the subscriber must receive every message, every byte
//! checked, over the zero-copy path (host memfd blocks without a GPU), and the router's
//! admin space, read over plain HTTP from the REST plugin, must list that publisher and
//! subscriber on that topic with their device, then drop them when they exit. In zenohd,
//! a live change of `max_entries` through the admin space is applied and one of
//! `__path__` refused.
//!
//! With zenohd's plugin as the host's provider, a publisher that borrows its blocks
//! there is SIGKILLed mid-stream while two subscribers hold its blocks: the scenario of
//! `support/provider.rs`, read through the admin space (host memfd blocks here, CUDA
//! VMM blocks in `gpu_zenohd_provider_publisher_killed_two_readers` on a GPU machine).
//!
//! zenohd must also refuse, with zenoh's message and an exit status rather than a crash,
//! a plugin built with another zenoh feature set (`ZCS_MISMATCH_PLUGIN`, built by
//! `scripts/plugin-mismatch.sh`) and a bad `plugins/cuda_shm` section.
//!
//! Without `ZCS_ZENOHD_DIR` (or `ZCS_MISMATCH_PLUGIN`) the zenohd tests print
//! `SKIPPED <name>: <reason>`; `scripts/test.sh` always sets both. The example binaries
//! and the bridge must have been built (`cargo test --workspace` builds them).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use zcs_tests::{Medium, MediumKind, free_tcp_port, watchdog_guard};

#[path = "support/provider.rs"]
mod provider;

const ZENOHD_DIR_ENV: &str = "ZCS_ZENOHD_DIR";
const MISMATCH_ENV: &str = "ZCS_MISMATCH_PLUGIN";
/// What zenoh logs (info) once a router's runtime has started, after its plugins.
const ROUTER_STARTED: &str = "Zenoh can be reached at";
/// Bound on waiting for a router, a message or an admin-space state.
const IO: Duration = Duration::from_secs(30);
const TEST_LIMIT: Duration = Duration::from_secs(240);
/// Messages the publisher sends, paced so that both clients are alive for a few seconds.
const MESSAGES: u64 = 160;
const RATE: &str = "20";
const SIZE: &str = "1048576";

fn skip(test: &str, why: &str) {
    // The real stderr: the harness hides captured output of passing tests.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// `target/<profile>`, from this test binary's path (`target/<profile>/deps/plugin-…`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("test binary under target/<profile>/deps").to_path_buf()
}

fn built(path: PathBuf) -> PathBuf {
    assert!(
        path.is_file(),
        "{} is missing: build it first (`cargo build -p zcs-examples --examples -p zenoh-bridge-cuda-shm`; \
         `cargo test --workspace` builds it)",
        path.display()
    );
    path
}

fn example(name: &str) -> PathBuf {
    built(profile_dir().join("examples").join(name))
}

/// The plugin's cdylib, as the dev-dependency build left it (no hash in its name).
fn plugin_so() -> PathBuf {
    built(profile_dir().join("deps").join("libzenoh_plugin_cuda_shm.so"))
}

fn zenohd_dir(test: &str) -> Option<PathBuf> {
    match std::env::var_os(ZENOHD_DIR_ENV) {
        Some(d) => {
            let d = PathBuf::from(d);
            let features = std::fs::read_to_string(d.join("FEATURES"))
                .unwrap_or_else(|e| panic!("{}/FEATURES: {e} (run scripts/zenohd.sh)", d.display()));
            assert_eq!(
                features.trim_end_matches('\n'),
                zenoh_plugin_cuda_shm::EXPECTED_ZENOH_FEATURES,
                "{} was built with other zenoh features than the plugin",
                d.display()
            );
            Some(d)
        }
        None => {
            skip(test, &format!("{ZENOHD_DIR_ENV} is not set (scripts/test.sh sets it after scripts/zenohd.sh)"));
            None
        }
    }
}

/// A scratch directory for one test's logs, removed when the test passes.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let d = std::env::temp_dir().join(format!("zcs-plugin-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create scratch dir");
        Self(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A child process whose stdout and stderr go to one log file. Dropping it kills and
/// reaps the process if it is still running, so nothing outlives a failed test.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, dir: &Path, program: &Path, args: &[String]) -> Self {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("create log");
        let err = out.try_clone().expect("clone log handle");
        let child = Command::new(program)
            .args(args)
            // The assertions read zenohd's info-level lines (plugin loading).
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Self { name: name.to_owned(), child, log }
    }

    /// Spawns a router (zenohd or the bridge) and waits until its runtime has started.
    /// zenohd 1.10.2's REST plugin serves HTTP before that: an admin query answered in
    /// that window can wedge its admin space for good (every later query times out).
    fn spawn_router(name: &str, dir: &Path, program: &Path, args: &[String]) -> Self {
        let mut router = Self::spawn(name, dir, program, args);
        router.wait_for_output(ROUTER_STARTED);
        router
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The output, for assertion messages.
    fn dump(&self) -> String {
        format!("----- {} ({}) -----\n{}", self.name, self.log.display(), self.output())
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits for the process to exit on its own.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(t.elapsed() < limit, "{} still running after {limit:?}\n{}", self.name, self.dump());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the output contains `text`; panics if the process exits first.
    fn wait_for_output(&mut self, text: &str) {
        let t = Instant::now();
        while !self.output().contains(text) {
            if let Some(status) = self.exited() {
                assert!(
                    self.output().contains(text),
                    "{} exited ({status}) before printing {text:?}\n{}",
                    self.name,
                    self.dump()
                );
            }
            assert!(t.elapsed() < IO, "{} did not print {text:?} within {IO:?}\n{}", self.name, self.dump());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `GET path` over HTTP/1.0 (so the body ends with the connection, never chunked):
/// the status code and the body.
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\n\r\n")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((resp.as_str(), ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_owned()))
}

/// `PUT path` with a JSON body over HTTP/1.0: the status code.
fn http_put(port: u16, path: &str, json: &str) -> std::io::Result<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "PUT {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
        json.len()
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    Ok(resp.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0))
}

/// The plugin's admin space through the REST plugin, as `relative key → value`, and the
/// router's zid; `None` while the router or the plugin does not answer yet.
fn admin_space(http_port: u16) -> Option<(String, Vec<(String, Value)>)> {
    let (code, body) = http_get(http_port, "/@/*/router/status/plugins/cuda_shm/**").ok()?;
    if code != 200 {
        return None;
    }
    let replies: Vec<Value> = serde_json::from_str(&body).ok()?;
    let mut zid = None;
    let mut out = Vec::new();
    for r in replies {
        let key = r["key"].as_str()?;
        let (head, rel) = key.split_once("/router/status/plugins/cuda_shm/")?;
        zid = head.strip_prefix("@/").map(str::to_owned);
        out.push((rel.to_owned(), r["value"].clone()));
    }
    let zid = zid?;
    out.iter().any(|(k, _)| k == "version").then_some((zid, out))
}

fn get<'a>(admin: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    admin.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Polls the admin space until `pred` holds; returns what satisfied it.
fn wait_admin(
    router: &mut Proc,
    http_port: u16,
    what: &str,
    pred: impl Fn(&[(String, Value)]) -> bool,
) -> Vec<(String, Value)> {
    let t = Instant::now();
    let mut last = None;
    loop {
        if let Some(status) = router.exited() {
            panic!("{} exited ({status}) while waiting for {what}\n{}", router.name, router.dump());
        }
        if let Some((_, admin)) = admin_space(http_port) {
            if pred(&admin) {
                return admin;
            }
            last = Some(admin);
        }
        assert!(t.elapsed() < IO, "admin space: no {what} within {IO:?}; last answer: {last:#?}\n{}", router.dump());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn client_args(zenoh_port: u16, key: &str) -> Vec<String> {
    ["--mode", "client", "-e", &format!("tcp/127.0.0.1:{zenoh_port}"), "--no-multicast-scouting", "-k", key]
        .map(String::from)
        .to_vec()
}

/// Runs the example subscriber and publisher as clients of the router, checks what
/// they report and what the admin space lists while they run and after they exit.
fn pubsub_through(router: &mut Proc, dir: &Path, zenoh_port: u16, http_port: u16, key: &str) {
    // The router answers, and the plugin is running in it, with an empty registry.
    let admin = wait_admin(router, http_port, "plugin version", |a| get(a, "version").is_some());
    let version = get(&admin, "version").unwrap();
    assert_eq!(version["zenoh_features"], zenoh_plugin_cuda_shm::EXPECTED_ZENOH_FEATURES, "{version}");
    assert_eq!(version["zenoh"], "v1.10.2-release", "{version}");

    let mut sub_args = client_args(zenoh_port, key);
    sub_args.extend(["-n", &MESSAGES.to_string(), "--idle-timeout", "30"].map(String::from));
    let mut sub = Proc::spawn("z_cuda_sub", dir, &example("z_cuda_sub"), &sub_args);
    sub.wait_for_output("[zcs] subscribed to");
    let mut pub_args = client_args(zenoh_port, key);
    pub_args.extend(["-n", &MESSAGES.to_string(), "-r", RATE, "-s", SIZE, "--wait-zero-copy", "1"].map(String::from));
    let mut publ = Proc::spawn("z_cuda_pub", dir, &example("z_cuda_pub"), &pub_args);
    sub.wait_for_output("path zero-copy");
    // Both printed which memory their blocks use; the registry must show the same.
    let device = if publ.output().contains("blocks: cuda-vmm") { "cuda" } else { "host" };
    if zcs_tests::gpu_required() {
        assert_eq!(
            device,
            "cuda",
            "{} is set: the examples must use the GPU\n{}",
            zcs_tests::REQUIRE_GPU_ENV,
            publ.dump()
        );
    }

    // While both run: the topic lists exactly this publisher and this subscriber.
    let admin = wait_admin(router, http_port, "the publisher and subscriber", |a| {
        get(a, &format!("topics/{key}")).is_some_and(|t| {
            t["publishers"].as_array().is_some_and(|p| p.len() == 1)
                && t["subscribers"].as_array().is_some_and(|s| s.len() == 1)
        })
    });
    let topic = get(&admin, &format!("topics/{key}")).unwrap();
    assert_eq!(topic["key"], key);
    let (p, s) = (&topic["publishers"][0], &topic["subscribers"][0]);
    assert_eq!(p["role"], "publisher", "{topic}");
    assert_eq!(s["role"], "subscriber", "{topic}");
    assert_eq!(p["device"]["kind"], device, "{topic}");
    assert_eq!(s["device"]["kind"], device, "{topic}");
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(p["boot_id"], boot_id.trim(), "{topic}");
    assert!(p["socket"].as_str().is_some_and(|s| !s.is_empty()), "a publisher names its socket: {topic}");
    assert!(s.get("socket").is_none(), "{topic}");
    assert!(p["first_seen_ms"].as_u64().is_some_and(|t| t > 0), "{topic}");
    // The same entities by instance id.
    let instance = p["instance"].as_str().unwrap();
    assert_eq!(get(&admin, &format!("instances/{instance}")), Some(p));
    let stats = get(&admin, "stats").unwrap();
    assert_eq!(stats["tokens"]["malformed"], 0, "{stats}");

    // The router is the host's provider: the publisher borrowed its blocks there (it
    // said so), and the subscriber opened them there.
    assert!(publ.output().contains("[zcs] blocks lent by the host provider"), "{}", publ.dump());
    let device_key = p["device"]["id"].as_str().unwrap_or_default().to_owned();
    let admin = wait_admin(router, http_port, "the provider's loans and opens", |a| {
        let procs: Vec<&Value> = a.iter().filter(|(k, _)| k.starts_with("processes/")).map(|(_, v)| v).collect();
        procs.iter().any(|c| c["loans"].as_u64() > Some(0)) && procs.iter().any(|c| c["mapped"].as_u64() > Some(0))
    });
    let provider = get(&admin, "provider").unwrap();
    assert!(provider["devices"].as_array().is_some_and(|d| d.contains(&Value::from(device_key.clone()))), "{provider}");
    let pool = get(&admin, &format!("provider/devices/{device_key}")).unwrap_or_else(|| panic!("{admin:#?}"));
    assert!(pool["loans"].as_u64() > Some(0) && pool["pool"]["bytes_in_use"].as_u64() > Some(0), "{pool}");
    let programs: Vec<&str> =
        admin.iter().filter(|(k, _)| k.starts_with("processes/")).filter_map(|(_, v)| v["program"].as_str()).collect();
    assert!(programs.contains(&"z_cuda_pub") && programs.contains(&"z_cuda_sub"), "{programs:?}");

    // The paths, from the processes' reports: zero-copy between the two, seen from both
    // ends; then a plain Zenoh subscriber on the key makes the publisher copy each
    // message out once, and the report says so.
    let zero_copy_both_ways = |a: &[(String, Value)]| {
        get(a, &format!("paths/{key}")).is_some_and(|t| {
            let (p, s) = (&t["publishers"][0]["report"], &t["subscribers"][0]["report"]);
            p["subscribers"][0]["path"] == "zero-copy"
                && p["subscribers"][0]["peer"] == s["instance"]
                && s["publishers"][0]["path"] == "zero-copy"
                && s["publishers"][0]["peer"] == p["instance"]
        })
    };
    wait_admin(router, http_port, "zero-copy paths in the reports", zero_copy_both_ways);
    let plain = {
        use zenoh::Wait;
        let mut c = zenoh::Config::default();
        c.insert_json5("mode", "\"client\"").unwrap();
        c.insert_json5("connect/endpoints", &format!("[\"tcp/127.0.0.1:{zenoh_port}\"]")).unwrap();
        c.insert_json5("scouting/multicast/enabled", "false").unwrap();
        let z = zenoh::open(c).wait().expect("plain zenoh session");
        let sub = z.declare_subscriber(key).wait().expect("plain subscriber");
        (z, sub)
    };
    let admin = wait_admin(router, http_port, "the plain listener in the publisher's report", |a| {
        get(a, &format!("paths/{key}")).is_some_and(|t| {
            let p = &t["publishers"][0]["report"];
            p["plain_listeners"] == true
                && p["copies_out"].as_u64() > Some(0)
                && t["plain_subscribers"][0]["copies_out"].as_u64() > Some(0)
        })
    });
    assert!(zero_copy_both_ways(&admin), "the GPU subscriber stays zero-copy: {admin:#?}");
    let paths = get(&admin, &format!("paths/{key}")).unwrap();
    let plain_path = &paths["plain_subscribers"][0];
    assert_eq!(plain_path["path"], "bytes", "{paths}");
    assert_eq!(plain_path["reason"], zenoh_plugin_cuda_shm::admin::PLAIN_SUBSCRIBER_REASON, "{paths}");
    assert_eq!(plain_path["publisher"], paths["publishers"][0]["report"]["instance"], "{paths}");
    println!("{key}: admin space paths/{key} with a plain subscriber: {paths:#}");
    drop(plain);

    // Every message arrives, every byte checked, all over the zero-copy path.
    let sub_status = sub.wait(IO);
    let pub_status = publ.wait(IO);
    assert!(sub_status.success(), "subscriber: {sub_status}\n{}\n{}", sub.dump(), publ.dump());
    assert!(pub_status.success(), "publisher: {pub_status}\n{}\n{}", publ.dump(), sub.dump());
    let out = sub.output();
    assert!(
        out.contains(&format!("[sub] done: {MESSAGES} messages checked of {MESSAGES} received (zero-copy {MESSAGES},")),
        "{}",
        sub.dump()
    );
    assert!(out.contains("[sub] every byte checked"), "{}", sub.dump());
    let last = out.lines().rev().find(|l| l.starts_with("[sub] ") && l.contains(" msgs ")).unwrap_or("");
    assert!(last.contains(&format!("zero-copy {MESSAGES} ")), "not all zero-copy: {last}\n{}", sub.dump());
    assert!(out.contains(if device == "cuda" { "blocks: cuda-vmm" } else { "falling back to host-memory blocks" }));

    // Both gone: their tokens vanish from the registry.
    let admin = wait_admin(router, http_port, "the topic to go away", |a| get(a, &format!("topics/{key}")).is_none());
    let stats = get(&admin, "stats").unwrap();
    assert_eq!(stats["tokens"]["vanished"], stats["tokens"]["appeared"], "{stats}");
    assert_eq!(stats["entries"], 0, "{stats}");
    // And the provider has every block back, with nobody connected.
    let admin = wait_admin(router, http_port, "the provider's blocks back", |a| {
        get(a, &format!("provider/devices/{device_key}")).is_some_and(|d| d["pool"]["bytes_in_use"] == 0)
            && get(a, "provider").is_some_and(|p| p["clients"] == 0)
    });
    let counters = &get(&admin, "provider").unwrap()["counters"];
    assert!(counters["lent"].as_u64() > Some(0) && counters["opened"].as_u64() > Some(0), "{counters}");
    assert_eq!(counters["bad_requests"], 0, "{counters}");
}

fn zenohd_args(zenoh_port: u16, http_port: u16, zenohd: &Path) -> Vec<String> {
    vec![
        "--no-multicast-scouting".into(),
        "-l".into(),
        format!("tcp/127.0.0.1:{zenoh_port}"),
        // The REST plugin is found by search (the directory replaces the default ones)…
        "--plugin-search-dir".into(),
        zenohd.join("lib").display().to_string(),
        "--rest-http-port".into(),
        format!("127.0.0.1:{http_port}"),
    ]
}

#[test]
fn zenohd_loads_the_plugin_and_lists_pubsub() {
    let Some(zenohd) = zenohd_dir("zenohd_loads_the_plugin_and_lists_pubsub") else { return };
    let _watchdog = watchdog_guard("zenohd_loads_the_plugin_and_lists_pubsub", TEST_LIMIT);
    let scratch = Scratch::new("zenohd");
    let (zenoh_port, http_port) = (free_tcp_port(), free_tcp_port());
    let mut args = zenohd_args(zenoh_port, http_port, &zenohd);
    // …and ours by path (`-P name:path` sets __required__ and __path__). Admin-space
    // writes are allowed, for the live configuration change below.
    let so = plugin_so();
    args.extend(["-P".into(), format!("cuda_shm:{}", so.display()), "--adminspace-permissions".into(), "rw".into()]);
    let mut router = Proc::spawn_router("zenohd", &scratch.0, &zenohd.join("bin/zenohd"), &args);
    pubsub_through(&mut router, &scratch.0, zenoh_port, http_port, "zcs/plugin-test/zenohd");

    // A live change of max_entries is applied; one of __path__ is refused (zenohd logs
    // the plugin's reason) and the plugin's configuration stays as it was.
    let config = "/@/local/router/config/plugins/cuda_shm";
    assert_eq!(http_put(http_port, &format!("{config}/max_entries"), "100").unwrap(), 200);
    wait_admin(&mut router, http_port, "max_entries 100", |a| {
        get(a, "config").is_some_and(|c| c["max_entries"] == 100)
    });
    assert_eq!(http_put(http_port, &format!("{config}/__path__"), "\"/elsewhere.so\"").unwrap(), 200);
    router.wait_for_output("plugins/cuda_shm: __path__ cannot be changed while the router runs");
    let (_, admin) = admin_space(http_port).expect("admin space");
    let cfg = get(&admin, "config").unwrap();
    assert_eq!(cfg["__path__"], so.display().to_string(), "{cfg}");
    assert_eq!(cfg["max_entries"], 100, "{cfg}");
    assert!(router.exited().is_none(), "zenohd exited\n{}", router.dump());
    let out = router.output();
    assert!(out.contains("Successfully started plugin cuda_shm"), "{}", router.dump());
}

#[test]
fn bridge_links_the_plugin_and_lists_pubsub() {
    let _watchdog = watchdog_guard("bridge_links_the_plugin_and_lists_pubsub", TEST_LIMIT);
    let scratch = Scratch::new("bridge");
    let (zenoh_port, http_port) = (free_tcp_port(), free_tcp_port());
    let args = [
        "--no-multicast-scouting".into(),
        "-l".into(),
        format!("tcp/127.0.0.1:{zenoh_port}"),
        "--rest-http-port".into(),
        format!("127.0.0.1:{http_port}"),
    ];
    let bridge = built(profile_dir().join("zenoh-bridge-cuda-shm"));
    let mut router = Proc::spawn_router("zenoh-bridge-cuda-shm", &scratch.0, &bridge, &args);
    pubsub_through(&mut router, &scratch.0, zenoh_port, http_port, "zcs/plugin-test/bridge");
    assert!(router.exited().is_none(), "the bridge exited\n{}", router.dump());
}

/// The provider's state for `mode`'s device, from the admin space; waits while the
/// router does not answer.
fn provider_view(router: &mut Proc, http_port: u16, mode: MediumKind) -> provider::View {
    let admin = wait_admin(router, http_port, "the provider's entries", |a| {
        get(a, "provider").is_some() && a.iter().any(|(k, _)| k.starts_with("provider/devices/"))
    });
    let dev = admin
        .iter()
        .find(|(k, _)| {
            k.strip_prefix("provider/devices/")
                .is_some_and(|d| if mode == MediumKind::Host { d == "host" } else { d.starts_with("cuda-") })
        })
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("the provider lends no {mode:?} blocks: {admin:#?}"));
    let counters = &get(&admin, "provider").unwrap()["counters"];
    let procs = || admin.iter().filter(|(k, _)| k.starts_with("processes/")).map(|(_, v)| v);
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v} in {admin:#?}"));
    provider::View {
        loans: n(&dev["loans"]),
        orphaned: n(&dev["orphaned"]),
        bytes_in_use: n(&dev["pool"]["bytes_in_use"]),
        orphaned_total: n(&counters["orphaned"]),
        reclaimed_total: n(&counters["reclaimed"]),
        borrowers: procs().filter(|c| c["loans"].as_u64() > Some(0)).count(),
        importers: procs().filter(|c| c["mapped"].as_u64() > Some(0)).count(),
    }
}

/// zenohd with the plugin as the host's provider: a borrowing publisher SIGKILLed while
/// two subscribers hold its blocks (`support/provider.rs`), every state read from the
/// admin space over REST.
fn zenohd_provider_scenario<M: Medium>(test: &str) {
    if !M::available(test) {
        return;
    }
    let Some(zenohd) = zenohd_dir(test) else { return };
    let _watchdog = watchdog_guard("zenohd provider scenario", TEST_LIMIT);
    let scratch = Scratch::new(test);
    let (zenoh_port, http_port) = (free_tcp_port(), free_tcp_port());
    let mut args = zenohd_args(zenoh_port, http_port, &zenohd);
    args.extend(["-P".into(), format!("cuda_shm:{}", plugin_so().display())]);
    let router = std::cell::RefCell::new(Proc::spawn_router("zenohd", &scratch.0, &zenohd.join("bin/zenohd"), &args));
    let id = {
        let admin = wait_admin(&mut router.borrow_mut(), http_port, "the provider", |a| get(a, "provider").is_some());
        let id = get(&admin, "provider").unwrap()["id"].as_str().unwrap_or_default().to_owned();
        u64::from_str_radix(&id, 16).unwrap_or_else(|e| panic!("provider id {id:?}: {e}"))
    };
    let view = || provider_view(&mut router.borrow_mut(), http_port, M::KIND);
    provider::publisher_killed_at::<M>(test, &provider::ProviderHost { port: zenoh_port, id, view: &view });
    let mut router = router.into_inner();
    assert!(router.exited().is_none(), "zenohd exited\n{}", router.dump());
}

zcs_tests::medium_tests! {
    /// On host memfd blocks of the router's provider, and on its CUDA VMM blocks (filled
    /// by the fill kernel).
    zenohd_provider_scenario => zenohd_provider_publisher_killed_two_readers,
        gpu_zenohd_provider_publisher_killed_two_readers;
}

/// Entry point of the re-executed test binary (the provider scenario's publisher); a
/// no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by the zenohd provider scenarios"]
fn child_entry() {
    provider::child_entry();
}

/// Runs zenohd until it exits by itself (within `IO`) and returns its status.
fn zenohd_until_exit(scratch: &Scratch, name: &str, zenohd: &Path, extra: &[String]) -> (ExitStatus, Proc) {
    let mut args = zenohd_args(free_tcp_port(), free_tcp_port(), zenohd);
    args.extend_from_slice(extra);
    let mut router = Proc::spawn(name, &scratch.0, &zenohd.join("bin/zenohd"), &args);
    let status = router.wait(IO);
    (status, router)
}

/// A plugin built with one zenoh feature more (`auth_usrpwd`) than zenohd: the loader
/// compares `zenoh::FEATURES` and refuses it. Required (`-P`), zenohd stops with an error
/// status and zenoh's message; not required, zenohd logs the refusal and keeps running.
/// Either way nothing crashes.
#[test]
fn zenohd_refuses_a_plugin_built_with_other_zenoh_features() {
    let test = "zenohd_refuses_a_plugin_built_with_other_zenoh_features";
    let Some(zenohd) = zenohd_dir(test) else { return };
    let Some(mismatched) = std::env::var_os(MISMATCH_ENV).map(PathBuf::from) else {
        skip(test, &format!("{MISMATCH_ENV} is not set (scripts/test.sh sets it after scripts/plugin-mismatch.sh)"));
        return;
    };
    assert!(mismatched.is_file(), "{MISMATCH_ENV}={} is not a file", mismatched.display());
    let _watchdog = watchdog_guard("zenohd_refuses_a_plugin_built_with_other_zenoh_features", TEST_LIMIT);
    let scratch = Scratch::new("mismatch");

    let (status, router) = zenohd_until_exit(
        &scratch,
        "zenohd-required",
        &zenohd,
        &["-P".into(), format!("cuda_shm:{}", mismatched.display())],
    );
    let out = router.output();
    assert_eq!(status.signal(), None, "zenohd crashed on a mismatched plugin: {status}\n{}", router.dump());
    assert!(!status.success(), "zenohd accepted a mismatched required plugin\n{}", router.dump());
    for expected in [
        "Incompatible Zenoh feature sets",
        &format!("host:  {}", zenoh_plugin_cuda_shm::EXPECTED_ZENOH_FEATURES.trim_start()),
        "zenoh/auth_usrpwd",
    ] {
        assert!(out.contains(expected), "no {expected:?} in zenohd's output\n{}", router.dump());
    }

    // Not required: refused, logged, and the router keeps serving (its REST plugin too).
    let (zenoh_port, http_port) = (free_tcp_port(), free_tcp_port());
    let mut args = zenohd_args(zenoh_port, http_port, &zenohd);
    args.extend(["--cfg".into(), format!("plugins/cuda_shm:{{__path__:{:?}}}", mismatched.display().to_string())]);
    let mut router = Proc::spawn_router("zenohd-optional", &scratch.0, &zenohd.join("bin/zenohd"), &args);
    assert!(router.output().contains("Incompatible Zenoh feature sets"), "{}", router.dump());
    let t = Instant::now();
    while !http_get(http_port, "/@/*/router/plugins/**").is_ok_and(|(code, _)| code == 200) {
        assert!(router.exited().is_none(), "zenohd exited\n{}", router.dump());
        assert!(t.elapsed() < IO, "REST plugin did not answer\n{}", router.dump());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, body) = http_get(http_port, "/@/*/router/plugins/**").unwrap();
    let plugins: Vec<Value> = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let state = |id: &str| {
        plugins
            .iter()
            .find(|p| p["key"].as_str().is_some_and(|k| k.ends_with(&format!("/router/plugins/{id}"))))
            .map(|p| p["value"]["state"].clone())
    };
    assert_eq!(state("rest"), Some(Value::from("Started")), "{body}");
    assert_ne!(state("cuda_shm"), Some(Value::from("Started")), "{body}");
    assert!(router.exited().is_none(), "zenohd exited\n{}", router.dump());
}

/// A bad `plugins/cuda_shm` section: the plugin's start fails with a message naming the
/// key and, for a wrong value, what it takes in words; zenohd reports it and exits with
/// status 1 (the plugin is required). No panic (zenoh's own way out, status 101 with a
/// backtrace), no Rust type names or source paths, no partial start.
#[test]
fn zenohd_reports_a_bad_plugin_section() {
    let Some(zenohd) = zenohd_dir("zenohd_reports_a_bad_plugin_section") else { return };
    let _watchdog = watchdog_guard("zenohd_reports_a_bad_plugin_section", TEST_LIMIT);
    let scratch = Scratch::new("badconfig");
    let so = plugin_so();
    let whole = "expected a whole number from 1 to 1048576";
    for (i, (cfg, expected)) in [
        ("plugins/cuda_shm/max_entries:0", "plugins/cuda_shm: max_entries: 0 is out of range (1 to 1048576)".into()),
        ("plugins/cuda_shm/max_entires:64", "plugins/cuda_shm: unknown field `max_entires`, expected one of".into()),
        (
            "plugins/cuda_shm/max_entries:\"lots\"",
            format!("plugins/cuda_shm: max_entries: {whole}, found the string \"lots\""),
        ),
        ("plugins/cuda_shm/max_entries:-1", format!("plugins/cuda_shm: max_entries: {whole}, found -1")),
        (
            "plugins/cuda_shm/provider:{max_blocks:1.5}",
            "plugins/cuda_shm: provider.max_blocks: expected a whole number of blocks, found 1.5".into(),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let extra = ["-P".into(), format!("cuda_shm:{}", so.display()), "--cfg".into(), cfg.into()];
        let (status, router) = zenohd_until_exit(&scratch, &format!("zenohd-{i}"), &zenohd, &extra);
        assert_eq!(status.signal(), None, "{cfg}: {status}\n{}", router.dump());
        assert_eq!(status.code(), Some(1), "{cfg}: zenohd did not stop with status 1\n{}", router.dump());
        let out = router.output();
        assert!(!out.contains("panicked"), "{cfg}: zenohd panicked\n{}", router.dump());
        assert!(out.contains("Plugin \"cuda_shm\" failed to start"), "{cfg}\n{}", router.dump());
        assert!(out.contains(&expected), "{cfg}: expected {expected:?}\n{}", router.dump());
        let reason = out.lines().find(|l| l.starts_with("Plugin \"cuda_shm\" failed to start")).unwrap_or_default();
        for rust in ["usize", ".rs:", "Error(", "Json5Err"] {
            assert!(!reason.contains(rust), "{cfg}: {rust:?} in {reason:?}");
        }
        assert!(!out.contains(ROUTER_STARTED), "{cfg}: the router started\n{}", router.dump());
    }
}
