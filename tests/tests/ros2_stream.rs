//! ROS 2 over rmw_zenoh, one body on host memory (CI) and on the GPU: 1080p and 4K
//! `sensor_msgs/msg/Image` streams from one process of ours to another on the zero-copy
//! path, first alone, then while the independent Python ROS peer
//! (`tests/python/ros2_peer.py`: eclipse-zenoh + rosbags) receives the same topic as CDR
//! on the base key.
//!
//! Publisher and subscriber are this test binary re-run as children (each with its own
//! Zenoh session and, on CUDA, its own context); the Python peer is a third process. The
//! publisher fills every frame with the pattern seeded by the ROS sequence number (the
//! fill kernel on the GPU); our subscriber checks every byte of every frame (on the GPU
//! with the check kernel), and that every frame came zero-copy, once, in order; the peer
//! checks every byte, the attachment and the CDR (byte-exact against rosbags) of every
//! frame. Frame rates of both paths are printed for the run's record (docs/runs/):
//! `ROS2 <w>x<h> ...` lines on the GPU, `ROS2-host <w>x<h> ...` on host memory (fewer
//! frames, checked on the CPU).
//!
//! Without a GPU the CUDA tests print `SKIPPED gpu_ros2_...`; without a Python that has
//! `zenoh`, `rosbags` and `numpy` every test prints `SKIPPED` (set `ZCS_ROS2_PYTHON` to
//! the interpreter to use; scripts/gpu-run.sh puts the carried wheels on PYTHONPATH).
//! With `ZCS_REQUIRE_GPU=1`, a missing GPU *or* such a Python fails.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use tensor_codec::cdr::{Header, Image, Time};
use zcs_tests::{CHILD_ROLE_ENV, Medium, MediumKind, Pattern, child_role, free_tcp_port, gpu_required, watchdog_guard};
use zenoh_cuda_shm::{GpuSession, Path, ZcsConfig, tensor_codec};
use zenoh_cuda_shm_ros2::attachment::now_ns;
use zenoh_cuda_shm_ros2::names::gid_hex;
use zenoh_cuda_shm_ros2::{NodeOptions, Qos, RosNode};

const PARAMS_ENV: &str = "ZCS_ROS2_PARAMS";
const MEDIUM_ENV: &str = "ZCS_ROS2_MEDIUM";
const ENTRY: &str = "ros2_child";
const TOPIC: &str = "/camera/image";
const SETUP: Duration = Duration::from_secs(60);

/// `port width height frames with_peer`, space-separated.
#[derive(Debug, Clone, Copy)]
struct Params {
    port: u16,
    width: u32,
    height: u32,
    frames: u64,
    with_peer: bool,
}

impl Params {
    fn encode(&self) -> String {
        let peer = u8::from(self.with_peer);
        format!("{} {} {} {} {peer}", self.port, self.width, self.height, self.frames)
    }

    fn decode(s: &str) -> Self {
        let v: Vec<u64> = s.split(' ').map(|x| x.parse().expect("param")).collect();
        let (port, width, height) = (v[0] as u16, v[1] as u32, v[2] as u32);
        Params { port, width, height, frames: v[3], with_peer: v[4] == 1 }
    }

    fn len(&self) -> usize {
        self.width as usize * self.height as usize * 4
    }
}

fn session(p: &Params, listen: bool) -> GpuSession {
    let mut c = zenoh::Config::default();
    let mut set = |k: &str, v: String| c.insert_json5(k, &v).unwrap_or_else(|e| panic!("{k}: {e}"));
    set("mode", "\"peer\"".into());
    set("scouting/multicast/enabled", "false".into());
    if listen {
        set("listen/endpoints", format!("[\"tcp/127.0.0.1:{}\"]", p.port));
    } else {
        set("listen/endpoints", "[\"tcp/127.0.0.1:0\"]".into());
        set("connect/endpoints", format!("[\"tcp/127.0.0.1:{}\"]", p.port));
    }
    // Fewer blocks than a subscriber's lease limit (64): a subscriber that falls behind
    // slows the publisher down instead of being sent bytes past its limit.
    let mut cfg = ZcsConfig { device: MediumKind::from_env(MEDIUM_ENV).device(), ..ZcsConfig::default() };
    cfg.pool.max_blocks = 32;
    GpuSession::open(c, cfg).wait().expect("open")
}

fn qos() -> Qos {
    // Keep-all: the publisher blocks instead of dropping, so every frame is checked.
    Qos::reliable(8).keep_all()
}

fn image(p: &Params) -> Image<()> {
    let now = now_ns();
    Image {
        header: Header {
            stamp: Time { sec: (now / 1_000_000_000) as i32, nanosec: (now % 1_000_000_000) as u32 },
            frame_id: "camera".into(),
        },
        height: p.height,
        width: p.width,
        encoding: "rgba8".into(),
        is_bigendian: 0,
        step: p.width * 4,
        data: (),
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < SETUP, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run_pub(p: Params) {
    let s = session(&p, false);
    let pattern = Pattern::new(&s);
    let on_gpu = s.gpu().is_some();
    let node = RosNode::new(&s, NodeOptions::new("gpu_camera").domain(0)).expect("node");
    let publisher = node.publisher::<Image<()>>(TOPIC, qos()).expect("publisher");
    wait_until("our subscriber on the zero-copy path", || publisher.channel().zero_copy_subscribers() >= 1);
    if p.with_peer {
        wait_until("the peer's subscription", || publisher.ordinary_subscriptions() >= 1);
    }
    let len = p.len();
    let t = Instant::now();
    for _ in 0..p.frames {
        let seq = publisher.next_seq();
        let mut loan = publisher.loan(len).expect("loan");
        pattern.fill(&mut loan, seq as u64);
        let r = publisher.publish(&image(&p), loan).expect("publish");
        assert_eq!(r.seq, seq);
        assert_eq!(r.base, p.with_peer, "base-key copy only while the peer subscribes");
    }
    let secs = t.elapsed().as_secs_f64();
    let st = publisher.stats();
    let expected = if p.with_peer { p.frames } else { 0 };
    // A GPU frame for the base key is copied device→host; a host frame is read in place.
    assert_eq!((st.base_puts, st.device_to_host), (expected, if on_gpu { expected } else { 0 }));
    println!(
        "{{\"role\":\"pub\",\"frames\":{},\"fps\":{:.1},\"gid\":\"{}\"}}",
        p.frames,
        p.frames as f64 / secs,
        gid_hex(&publisher.gid())
    );
    std::thread::sleep(Duration::from_secs(1));
}

fn run_sub(p: Params) {
    // Without the peer, our subscriber is the one that listens.
    let s = session(&p, !p.with_peer);
    let node = RosNode::new(&s, NodeOptions::new("gpu_consumer").domain(0)).expect("node");
    let sub = node.subscriber::<Image<()>>(TOPIC, qos()).expect("subscriber");
    println!("{{\"role\":\"sub_ready\"}}");
    let mut first = None;
    let mut last_seq = 0i64;
    let pattern = Pattern::new(&s);
    for _ in 0..p.frames {
        let sample = sub.recv_timeout(SETUP).expect("frame");
        first.get_or_insert_with(Instant::now);
        let a = *sample.attachment();
        assert_eq!(a.seq, last_seq + 1, "frames in order, each once");
        last_seq = a.seq;
        assert_eq!(sample.path(), Path::ZeroCopy, "frame {}", a.seq);
        assert_eq!(sample.msg(), &Image { header: sample.msg().header.clone(), ..image(&p) });
        assert_eq!(sample.data_len(), p.len());
        let g = sample.gpu_sample().expect("channel sample");
        assert_eq!(pattern.mismatches(g, a.seq as u64), 0, "frame {}: bytes differ", a.seq);
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_millis(500));
    assert!(sub.try_recv().is_none(), "a frame beyond the last");
    let st = sub.stats();
    assert_eq!((st.channel, st.base), (p.frames, 0));
    let expected_dups = if p.with_peer { p.frames } else { 0 };
    assert_eq!(st.duplicates, expected_dups, "every base-key copy dropped as a duplicate");
    assert_eq!((st.bad_attachment, st.bad_cdr, st.bad_envelope), (0, 0, 0));
    println!("{{\"role\":\"sub\",\"frames\":{},\"fps\":{:.1}}}", p.frames, (p.frames - 1) as f64 / secs);
}

/// Entry point of the child processes.
#[test]
#[ignore = "child process entry"]
fn ros2_child() {
    let p = Params::decode(&std::env::var(PARAMS_ENV).expect("params"));
    match child_role().as_deref() {
        Some("pub") => run_pub(p),
        Some("sub") => run_sub(p),
        r => panic!("unknown role {r:?}"),
    }
}

/// A child process and its buffered stdout.
struct Proc {
    child: Child,
    out: BufReader<ChildStdout>,
}

fn spawn(cmd: &mut Command) -> Proc {
    let mut child = cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn().expect("spawn");
    let out = BufReader::new(child.stdout.take().expect("piped"));
    Proc { child, out }
}

fn child(role: &str, medium: MediumKind, p: &Params) -> Proc {
    let exe = std::env::current_exe().expect("current_exe");
    spawn(
        Command::new(exe)
            .args(["--exact", ENTRY, "--include-ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ROLE_ENV, role)
            .env(MEDIUM_ENV, medium.name())
            .env(PARAMS_ENV, p.encode()),
    )
}

/// Reads lines until one holds a JSON object with `"role":"<role>"` (the test harness
/// may print its `test … ` prefix on the same line).
fn json_line(c: &mut Proc, role: &str) -> String {
    let needles = [format!("\"role\":\"{role}\""), format!("\"role\": \"{role}\"")];
    let mut line = String::new();
    loop {
        line.clear();
        let n = c.out.read_line(&mut line).expect("read child output");
        assert!(n > 0, "{role}: output ended without its result line");
        if let Some(at) = line.find('{')
            && needles.iter().any(|n| line[at..].contains(n.as_str()))
        {
            return line[at..].trim().to_owned();
        }
        eprint!("{line}");
    }
}

fn finish(c: Proc, what: &str, limit: Duration) {
    let Proc { child, out } = c;
    // Drain the rest of its output so it cannot block on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    zcs_tests::wait_child(child, what, limit);
}

fn field(json: &str, name: &str) -> f64 {
    let at = json.find(&format!("\"{name}\"")).unwrap_or_else(|| panic!("{name} in {json}"));
    let rest = json[at + name.len() + 2..].trim_start_matches([':', ' ']);
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().unwrap_or_else(|_| panic!("{name} in {json}"))
}

/// The Python interpreter and peer script, or why they cannot run.
fn python_peer() -> Result<(String, PathBuf), String> {
    let py = std::env::var("ZCS_ROS2_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = ["tests/python/ros2_peer.py", concat!(env!("CARGO_MANIFEST_DIR"), "/python/ros2_peer.py")]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or("tests/python/ros2_peer.py not found (run from the repository root)")?;
    let ok = Command::new(&py)
        .args(["-c", "import zenoh, rosbags, numpy"])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("{py}: {e}"))?;
    if !ok.success() {
        return Err(format!("{py} lacks zenoh, rosbags or numpy (set ZCS_ROS2_PYTHON)"));
    }
    Ok((py, script))
}

fn stream<M: Medium>(test: &str, width: u32, height: u32, alone: u64, with_peer: u64) {
    let _w = watchdog_guard("ros2 stream", Duration::from_secs(540));
    let Some(medium) = M::gate(test) else { return };
    let (py, script) = match python_peer() {
        Ok(v) => v,
        Err(why) if gpu_required() => panic!("{test}: ZCS_REQUIRE_GPU is set but the ROS peer cannot run: {why}"),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            return;
        }
    };
    // 1. Two processes of ours, zero-copy only (no ordinary subscriber: no copies).
    // The subscriber listens, the publisher connects.
    let port = free_tcp_port();
    let p = Params { port, width, height, frames: alone, with_peer: false };
    let mut sub = child("sub", medium, &p);
    json_line(&mut sub, "sub_ready");
    let mut publ = child("pub", medium, &p);
    let pub_alone = json_line(&mut publ, "pub");
    let sub_alone = json_line(&mut sub, "sub");
    finish(publ, "publisher", SETUP);
    finish(sub, "subscriber", SETUP);

    // 2. The same with the Python ROS peer subscribed: it gets CDR on the base key. The
    // peer listens; both of ours connect to it (and, by gossip, to each other).
    let port = free_tcp_port();
    let p = Params { port, width, height, frames: with_peer, with_peer: true };
    let mut peer = spawn(
        Command::new(&py)
            .arg(&script)
            .args(["receive", "-l", &format!("tcp/127.0.0.1:{port}"), "-n", &with_peer.to_string()])
            .args(["--width", &width.to_string(), "--height", &height.to_string(), "--timeout", "300"]),
    );
    let mut sub = child("sub", medium, &p);
    json_line(&mut sub, "sub_ready");
    let mut publ = child("pub", medium, &p);
    let pub_mixed = json_line(&mut publ, "pub");
    let sub_mixed = json_line(&mut sub, "sub");
    let peer_mixed = json_line(&mut peer, "peer_receive");
    finish(publ, "publisher", SETUP);
    finish(sub, "subscriber", SETUP);
    finish(peer, "ROS peer", SETUP);
    assert!(peer_mixed.contains("\"errors\": []"), "ROS peer: {peer_mixed}");
    assert_eq!(field(&peer_mixed, "frames") as u64, with_peer, "{peer_mixed}");
    assert_eq!(field(&peer_mixed, "cdr_exact") as u64, with_peer, "{peer_mixed}");
    let gid = pub_mixed.split("\"gid\":\"").nth(1).and_then(|s| s.get(..32)).expect("gid");
    assert!(peer_mixed.contains(&format!("\"gids\": [\"{gid}\"]")), "{peer_mixed} vs {pub_mixed}");
    // `ROS2 ` lines are the GPU's (scripts/gpu-run.sh collects them).
    let tag = if medium == MediumKind::Cuda { "ROS2" } else { "ROS2-host" };
    eprintln!(
        "{tag} {width}x{height}: zero-copy alone {alone} frames: publisher {:.1} fps, subscriber {:.1} fps",
        field(&pub_alone, "fps"),
        field(&sub_alone, "fps")
    );
    eprintln!(
        "{tag} {width}x{height}: with the ROS peer {with_peer} frames: publisher {:.1} fps, zero-copy subscriber {:.1} fps, ROS peer (CDR) {:.1} fps",
        field(&pub_mixed, "fps"),
        field(&sub_mixed, "fps"),
        field(&peer_mixed, "fps")
    );
}

/// Frames sent alone and with the peer: fewer on host memory, where every byte is
/// checked on the CPU.
fn frames<M: Medium>(cuda: (u64, u64), host: (u64, u64)) -> (u64, u64) {
    if M::KIND == MediumKind::Cuda { cuda } else { host }
}

fn image_1080p<M: Medium>(test: &str) {
    let (alone, with_peer) = frames::<M>((600, 120), (40, 12));
    stream::<M>(test, 1920, 1080, alone, with_peer);
}

fn image_4k<M: Medium>(test: &str) {
    let (alone, with_peer) = frames::<M>((300, 40), (20, 6));
    stream::<M>(test, 3840, 2160, alone, with_peer);
}

zcs_tests::medium_tests! {
    image_1080p => ros2_image_1080p_zero_copy_and_ros_peer, gpu_ros2_image_1080p_zero_copy_and_ros_peer;
    image_4k => ros2_image_4k_zero_copy_and_ros_peer, gpu_ros2_image_4k_zero_copy_and_ros_peer;
}
