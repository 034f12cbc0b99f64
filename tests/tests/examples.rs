//! The example programs as a user runs them, on host memory (no GPU, no router): what
//! they print while nothing is happening and when they are ended.
//!
//! - `kill` (SIGTERM) ends each example as Ctrl-C does: with its summary line and status
//!   0, not silently (`z_cuda_sub`, `z_cuda_pub`, `ros2_image_pub`, `ros2_image_sub`,
//!   `ros2_listener`).
//! - A subscriber that has received nothing for 2 s says once that it waits for a
//!   publisher, and names what it cannot hear: a plain one, our publishers on other
//!   keys; a ROS one, the publishers of its topic of another type.
//! - `ros2_image_sub` ended by `--idle-timeout` before `-n` messages prints its summary,
//!   then the error, and exits non-zero.
//!
//! The example binaries must have been built (`cargo test --workspace` builds them, or
//! `cargo build -p zcs-examples --examples`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use zcs_tests::{free_tcp_port, watchdog_guard};

/// Bound on waiting for a line or an exit (debug binaries on a loaded 2-core machine).
const IO: Duration = Duration::from_secs(30);
const TEST_LIMIT: Duration = Duration::from_secs(180);

fn example(name: &str) -> PathBuf {
    zcs_tests::example_binary(name)
}

/// A scratch directory for one test's logs, removed when the test passes.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let d = std::env::temp_dir().join(format!("zcs-examples-{test}-{}", std::process::id()));
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

/// An example whose stdout and stderr go to one log file, in the order it writes them.
/// Dropping it kills and reaps the process if it still runs.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, dir: &Path, args: &[&str]) -> Self {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("create log");
        let err = out.try_clone().expect("clone log handle");
        let child = Command::new(example(name))
            .args(["--device", "host", "--no-multicast-scouting"])
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Self { name: name.into(), child, log }
    }

    /// Spawns `name` listening on a port found free a moment before, which another
    /// process may take meanwhile (a listen that fails ends the example): then on
    /// another, up to three times. Returns it once it printed a line starting with
    /// `ready`, with its endpoint.
    fn spawn_listening(name: &str, dir: &Path, args: &[&str], ready: &str) -> (Self, String) {
        (1..=3)
            .find_map(|attempt| {
                let listen = format!("tcp/127.0.0.1:{}", free_tcp_port());
                let mut p = Self::spawn(name, dir, &[&["-l", listen.as_str()][..], args].concat());
                match p.try_wait_line(ready, |l| l.starts_with(ready)) {
                    Ok(_) => Some((p, listen)),
                    Err(status) if attempt < 3 => {
                        eprintln!("attempt {attempt}: {name} exited ({status}); another port\n{}", p.dump());
                        None
                    }
                    Err(status) => panic!("{name} exited ({status})\n{}", p.dump()),
                }
            })
            .expect("a process listening")
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn dump(&self) -> String {
        format!("----- {} ({}) -----\n{}", self.name, self.log.display(), self.output())
    }

    /// Waits until a line of the output satisfies `pred`; panics if the process exits
    /// first or `IO` passes.
    fn wait_line(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.try_wait_line(what, pred)
            .unwrap_or_else(|status| panic!("{} exited ({status}) before printing {what}\n{}", self.name, self.dump()))
    }

    /// As [`Proc::wait_line`], but the exit status if the process exits first.
    fn try_wait_line(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> Result<String, ExitStatus> {
        let t = Instant::now();
        loop {
            if let Some(line) = self.output().lines().find(|l| pred(l)) {
                return Ok(line.to_owned());
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return self.output().lines().find(|l| pred(l)).map(str::to_owned).ok_or(status);
            }
            assert!(t.elapsed() < IO, "{}: no {what} within {IO:?}\n{}", self.name, self.dump());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).expect("kill");
    }

    fn wait(&mut self) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(t.elapsed() < IO, "{} still running after {IO:?}\n{}", self.name, self.dump());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Ends `p` with SIGTERM once `ready` shows in its output; returns its output after
/// checking that it exited 0 and that its last lines hold `summary`.
fn terminate(mut p: Proc, ready: &str, summary: &str) -> String {
    p.wait_line(ready, |l| l.contains(ready));
    p.signal(Signal::SIGTERM);
    let status = p.wait();
    let out = p.output();
    assert!(status.success(), "{} ended by SIGTERM with {status}\n{}", p.name, p.dump());
    assert!(out.lines().any(|l| l.contains(summary)), "{}: no {summary:?} after SIGTERM\n{}", p.name, p.dump());
    out
}

#[test]
fn sigterm_ends_each_example_with_its_summary() {
    let _watchdog = watchdog_guard("sigterm_ends_each_example_with_its_summary", TEST_LIMIT);
    let scratch = Scratch::new("sigterm");
    let dir = &scratch.0;
    let alone = ["-l", "tcp/127.0.0.1:0"];
    let key = format!("zcs/examples-test/{}", std::process::id());
    let topic = format!("/zcs_examples_test_{}", std::process::id());

    // Subscribers with nothing to receive: the waiting line after 2 s, then the summary.
    let sub = Proc::spawn("z_cuda_sub", dir, &[&alone[..], &["-k", &key]].concat());
    let out = terminate(sub, &format!("[sub] waiting for a publisher on '{key}'…"), "[sub] interrupted: 0 messages");
    assert!(!out.contains("every byte checked"), "nothing was checked\n{out}");

    let sub = Proc::spawn("ros2_image_sub", dir, &[&alone[..], &["-t", &topic, "-n", "5"]].concat());
    let out =
        terminate(sub, &format!("[ros2] waiting for a publisher on {topic}…"), "{\"role\":\"ros2_sub\",\"frames\":0,");
    assert!(out.contains("\"interrupted\":true}"), "{out}");

    let listener = Proc::spawn("ros2_listener", dir, &[&alone[..], &["-t", &topic]].concat());
    terminate(listener, "[listener] waiting for a publisher on", "{\"role\":\"listener\",\"messages\":0,");

    // Publishers: a progress line each second, then the summary.
    let publisher = Proc::spawn("z_cuda_pub", dir, &[&alone[..], &["-k", &key, "-s", "4096", "-r", "20"]].concat());
    let out = terminate(publisher, "[pub] ", "[pub] interrupted: ");
    // Host memory: its copies out are block->bytes, not device->host.
    assert!(out.contains("; block->bytes copies out: ") && !out.contains("device->host"), "{out}");

    let args = ["-t", &topic, "--width", "16", "--height", "8", "-r", "20"];
    let publisher = Proc::spawn("ros2_image_pub", dir, &[&alone[..], &args].concat());
    let out = terminate(publisher, " fps  zero-copy subscribers: ", "{\"role\":\"ros2_pub\",\"frames\":");
    let progress = out.lines().find(|l| l.starts_with("[ros2] ") && l.contains(" frames  ")).unwrap();
    assert!(progress.contains(" fps "), "{progress}");
    assert!(out.contains("\"interrupted\":true}"), "{out}");
}

#[test]
fn ros2_image_sub_prints_its_summary_before_an_idle_timeout_error() {
    let _watchdog = watchdog_guard("ros2_image_sub_prints_its_summary_before_an_idle_timeout_error", TEST_LIMIT);
    let scratch = Scratch::new("idle");
    let topic = format!("/zcs_examples_idle_{}", std::process::id());
    let args = ["-l", "tcp/127.0.0.1:0", "-t", &topic, "-n", "5", "--idle-timeout", "3"];
    let mut sub = Proc::spawn("ros2_image_sub", &scratch.0, &args);
    let status = sub.wait();
    assert_eq!(status.code(), Some(1), "fewer than -n messages must fail\n{}", sub.dump());
    let out = sub.output();
    let summary = out.lines().position(|l| l.starts_with("{\"role\":\"ros2_sub\",\"frames\":0,"));
    let error = out.lines().position(|l| l == "error: no message for 3 s (--idle-timeout), after 0 messages");
    assert!(summary.is_some() && error.is_some() && summary < error, "summary, then the error\n{}", sub.dump());
}

#[test]
fn a_waiting_ros2_subscriber_names_a_publisher_of_another_type() {
    let _watchdog = watchdog_guard("a_waiting_ros2_subscriber_names_a_publisher_of_another_type", TEST_LIMIT);
    let scratch = Scratch::new("hints");
    let topic = format!("/zcs_examples_hints_{}", std::process::id());
    let (mut sub, listen) =
        Proc::spawn_listening("ros2_image_sub", &scratch.0, &["-t", &topic], "[ros2] subscribed to");
    let args = ["-e", &listen, "-t", &topic, "--width", "8", "--height", "4", "-r", "10", "-q"];
    let publisher = Proc::spawn("ros2_tensor_pub", &scratch.0, &args);
    let hint = sub.wait_line("the hint", |l| l.contains("will not be heard"));
    assert!(
        hint.starts_with("[ros2] publisher ")
            && hint.contains(&format!(" of {topic} (node /zcs_tensor_pub) will not be heard: "))
            && hint.ends_with("it publishes another type (tensor_msgs::msg::dds_::ExperimentalTensor_)"),
        "{hint}\n{}",
        sub.dump()
    );
    let out = sub.output();
    let waiting = out.lines().position(|l| l == format!("[ros2] waiting for a publisher on {topic}…"));
    let hinted = out.lines().position(|l| l == hint);
    assert!(waiting.is_some() && waiting < hinted, "the waiting line first\n{}", sub.dump());
    sub.signal(Signal::SIGTERM);
    assert!(sub.wait().success(), "{}", sub.dump());
    // The quiet publisher printed no progress line.
    drop(publisher);
}

#[test]
fn a_waiting_subscriber_names_publishers_on_other_keys() {
    let _watchdog = watchdog_guard("a_waiting_subscriber_names_publishers_on_other_keys", TEST_LIMIT);
    let scratch = Scratch::new("other-keys");
    let (ours, theirs) =
        (format!("zcs/examples-keys/{}/a", std::process::id()), format!("zcs/examples-keys/{}/b", std::process::id()));
    let (mut publisher, listen) =
        Proc::spawn_listening("z_cuda_pub", &scratch.0, &["-k", &theirs, "-s", "4096", "-r", "5"], "[pub] ");
    let sub = Proc::spawn("z_cuda_sub", &scratch.0, &["-e", &listen, "-k", &ours]);
    let out = terminate(sub, "[sub] publishers seen on other keys:", "[sub] interrupted: 0 messages");
    let hint = out.lines().find(|l| l.starts_with("[sub] publishers seen")).unwrap();
    assert_eq!(
        hint,
        format!("[sub] publishers seen on other keys: '{theirs}' (plain Zenoh publishers are not listed)")
    );
    let waiting = out.lines().position(|l| l == format!("[sub] waiting for a publisher on '{ours}'…"));
    let hinted = out.lines().position(|l| l == hint);
    assert!(waiting.is_some() && waiting < hinted, "the waiting line first\n{out}");
    publisher.signal(Signal::SIGTERM);
    assert!(publisher.wait().success(), "{}", publisher.dump());
}
