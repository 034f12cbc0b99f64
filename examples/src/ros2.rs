//! The ROS 2 examples' shared code: `ros2_image_pub`/`ros2_image_sub` and
//! `ros2_tensor_pub`/`ros2_tensor_sub` are thin `main`s over [`run_pub`] and [`run_sub`].
//!
//! Every message's data is the pattern of [`zcs_memory::cuda::kernels::pattern_byte`]
//! seeded with the message's ROS sequence number (the attachment's), written by a kernel
//! on the GPU (or on the CPU with host blocks); subscribers check every byte, the
//! sequence numbers (contiguous per publisher) and timestamps (non-decreasing), and
//! print one JSON summary line at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use clap::Args;
use zcs_memory::cuda::Kernels;
use zcs_memory::cuda::kernels::{check_pattern, fill_pattern};
use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Header, Image, Time};
use zenoh_cuda_shm::{GpuSession, RecvError};
use zenoh_cuda_shm_ros2::names::gid_hex;
use zenoh_cuda_shm_ros2::{EntityKind, NodeOptions, Qos, RosDataMessage, RosNode, RosSample, SilentPublisher};

use crate::{
    CommonArgs, DeviceChecker, WaitingNotice, catch_interrupt, ended_early, interrupted, next_or_interrupt, open,
    with_progress,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Flags naming the node and topic.
#[derive(Args, Debug, Clone)]
pub struct RosArgs {
    /// Topic name.
    #[arg(short, long)]
    pub topic: Option<String>,
    /// ROS domain id (default: ROS_DOMAIN_ID, else 0).
    #[arg(long)]
    pub domain: Option<u32>,
    /// Node namespace.
    #[arg(long, default_value = "/")]
    pub namespace: String,
    /// Node name.
    #[arg(long)]
    pub node: Option<String>,
    /// QoS: reliable, keep-all (reliable, keep all: publishers block instead of
    /// dropping), sensor (best effort, depth 5) or transient (reliable, transient local).
    #[arg(long, default_value = "keep-all")]
    pub qos: String,
    /// History depth (reliable and transient).
    #[arg(long, default_value_t = 10)]
    pub depth: u32,
    /// Report a publisher of a subscribed topic that sends nothing for this many
    /// seconds (0: never).
    #[arg(long, default_value_t = 5.0)]
    pub silence_after: f64,
}

impl RosArgs {
    /// The QoS `--qos` and `--depth` name.
    pub(crate) fn qos(&self) -> Result<Qos, BoxError> {
        Ok(match self.qos.as_str() {
            "reliable" => Qos::reliable(self.depth),
            "keep-all" => Qos::reliable(self.depth).keep_all(),
            "sensor" => Qos::sensor_data(),
            "transient" => Qos::transient_local(self.depth),
            q => return Err(format!("unknown --qos {q}").into()),
        })
    }

    /// The node the flags describe (`--node`, else `default_name`).
    pub(crate) fn node(&self, session: &GpuSession, default_name: &str) -> Result<RosNode, BoxError> {
        let window = (self.silence_after > 0.0).then(|| Duration::from_secs_f64(self.silence_after));
        let mut o = NodeOptions::new(self.node.clone().unwrap_or_else(|| default_name.to_owned()))
            .namespace(self.namespace.clone())
            .silence_window(window);
        o.domain = self.domain;
        Ok(RosNode::new(session, o)?)
    }
}

/// Flags of the publishers.
#[derive(Args, Debug, Clone)]
pub struct RosPubArgs {
    /// Image width (pixels) or tensor columns.
    #[arg(long, default_value_t = 1920)]
    pub width: u32,
    /// Image height (rows) or tensor rows.
    #[arg(long, default_value_t = 1080)]
    pub height: u32,
    /// Messages per second (0: as fast as possible).
    #[arg(short, long, default_value_t = 30.0)]
    pub rate: f64,
    /// Messages to publish (0: forever).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub count: u64,
    /// Before publishing, wait (up to 60 s) until this many subscriptions of the topic
    /// (ordinary ROS ones and ours) are in the graph.
    #[arg(long, default_value_t = 0)]
    pub wait_subscriptions: usize,
    /// Before publishing, wait (up to 60 s) until this many of our subscribers are on
    /// the zero-copy path.
    #[arg(long, default_value_t = 0)]
    pub wait_zero_copy: usize,
    /// Publish from host memory (`publish_host`) instead of a loaned block.
    #[arg(long)]
    pub host_data: bool,
    /// Seconds to stay alive after the last message (TRANSIENT_LOCAL late joiners).
    #[arg(long, default_value_t = 0.5)]
    pub linger: f64,
    /// No progress line each second (the summary still ends the run).
    #[arg(short, long)]
    pub quiet: bool,
}

/// Flags of the subscribers.
#[derive(Args, Debug, Clone)]
pub struct RosSubArgs {
    /// Messages to receive before exiting (0: forever).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub count: u64,
    /// Give up after this many seconds without a message (0: never).
    #[arg(long, default_value_t = 60)]
    pub idle_timeout: u64,
    /// Do not check the data.
    #[arg(long)]
    pub no_check: bool,
}

/// The message kinds of the examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `sensor_msgs/msg/Image`, `rgba8`.
    Image,
    /// `tensor_msgs/msg/ExperimentalTensor`, float32 `[height, width]`.
    Tensor,
}

/// The message fields for `seq` (the data is the pattern seeded with `seq`).
pub fn image_fields(width: u32, height: u32, stamp_ns: i64) -> Image<()> {
    Image {
        header: Header {
            stamp: Time { sec: (stamp_ns / 1_000_000_000) as i32, nanosec: (stamp_ns % 1_000_000_000) as u32 },
            frame_id: "camera".into(),
        },
        height,
        width,
        encoding: "rgba8".into(),
        is_bigendian: 0,
        step: width * 4,
        data: (),
    }
}

/// The tensor fields: float32 (DLPack code 2, 32 bits, 1 lane), contiguous `[height, width]`.
pub fn tensor_fields(width: u32, height: u32) -> ExperimentalTensor<()> {
    ExperimentalTensor {
        dtype_code: 2,
        dtype_bits: 32,
        dtype_lanes: 1,
        shape: vec![i64::from(height), i64::from(width)],
        strides: vec![],
        byte_offset: 0,
        data: (),
    }
}

fn now_ns() -> i64 {
    zenoh_cuda_shm_ros2::attachment::now_ns()
}

/// Waits (up to 60 s, or until a signal) until `n` subscriptions of `key` are in the
/// node's graph.
pub(crate) fn wait_subscriptions(node: &RosNode, key: &str, n: usize) {
    let t = Instant::now();
    while n > 0 && t.elapsed() < Duration::from_secs(60) && !interrupted() {
        let subs = node
            .graph()
            .entities
            .iter()
            .filter(|e| e.kind == EntityKind::Subscription && e.topic.as_ref().is_some_and(|t| t.key == key))
            .count();
        if subs >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Publishes `args.count` messages of `kind`.
pub fn run_pub(kind: Kind, common: &CommonArgs, ros: &RosArgs, args: &RosPubArgs) -> Result<(), BoxError> {
    catch_interrupt();
    let session = open(common)?;
    match kind {
        Kind::Image => {
            let node = ros.node(&session, "zcs_image_pub")?;
            let topic = ros.topic.clone().unwrap_or_else(|| "/camera/image".into());
            let p = node.publisher::<Image<()>>(&topic, ros.qos()?)?;
            let (w, h) = (args.width, args.height);
            pub_loop(&session, &node, &p, args, (w as usize) * (h as usize) * 4, |_| image_fields(w, h, now_ns()))
        }
        Kind::Tensor => {
            let node = ros.node(&session, "zcs_tensor_pub")?;
            let topic = ros.topic.clone().unwrap_or_else(|| "/tensor".into());
            let p = node.publisher::<ExperimentalTensor<()>>(&topic, ros.qos()?)?;
            let (w, h) = (args.width, args.height);
            pub_loop(&session, &node, &p, args, (w as usize) * (h as usize) * 4, |_| tensor_fields(w, h))
        }
    }
}

fn pub_loop<M: RosDataMessage>(
    session: &GpuSession,
    node: &RosNode,
    p: &zenoh_cuda_shm_ros2::RosPublisher<M>,
    args: &RosPubArgs,
    len: usize,
    fields: impl Fn(i64) -> M,
) -> Result<(), BoxError> {
    println!("[ros2] publishing on '{}' token {} gid {}", p.key(), p.token(), gid_hex(&p.gid()));
    let kernels = match session.gpu() {
        Some(g) => Some(with_progress("loading the CUDA kernels", || Kernels::load(g))?),
        None => None,
    };
    wait_subscriptions(node, p.key(), args.wait_subscriptions);
    let t = Instant::now();
    while p.channel().zero_copy_subscribers() < args.wait_zero_copy
        && t.elapsed() < Duration::from_secs(60)
        && !interrupted()
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let period = if args.rate > 0.0 { Duration::from_secs_f64(1.0 / args.rate) } else { Duration::ZERO };
    let mut host = vec![0u8; if args.host_data { len } else { 0 }];
    let start = Instant::now();
    let mut next = start;
    let mut n = 0u64;
    let (mut last_report, mut n_reported) = (start, 0u64);
    while (args.count == 0 || n < args.count) && !interrupted() {
        let seq = p.next_seq();
        let msg = fields(seq);
        if args.host_data {
            fill_pattern(&mut host, 0, seq as u64);
            p.publish_host(&msg, &host)?;
        } else {
            let mut loan = p.loan(len)?;
            match (&kernels, loan.device_ptr()) {
                (Some(k), Some(ptr)) => {
                    // SAFETY: the loan owns ≥ len mapped bytes until `publish`, which orders the
                    // ready signal after this launch on the loan's stream.
                    unsafe { k.fill(loan.stream().expect("CUDA loan"), ptr, len as u64, seq as u64) }?
                }
                _ => fill_pattern(loan.as_mut_slice().expect("host loan"), 0, seq as u64),
            }
            p.publish(&msg, loan)?;
        }
        n += 1;
        if !args.quiet && last_report.elapsed() >= Duration::from_secs(1) {
            println!(
                "[ros2] {n} frames  {:.1} fps  zero-copy subscribers: {}  ordinary subscriptions: {}",
                (n - n_reported) as f64 / last_report.elapsed().as_secs_f64(),
                p.channel().zero_copy_subscribers(),
                p.ordinary_subscriptions()
            );
            (last_report, n_reported) = (Instant::now(), n);
        }
        if !period.is_zero() {
            next += period;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let s = p.stats();
    let c = p.channel().stats();
    println!(
        "{{\"role\":\"ros2_pub\",\"frames\":{n},\"bytes\":{len},\"fps\":{:.2},\"base_puts\":{},\"device_to_host\":{},\"zero_copy_subscribers\":{},\"ordinary_subscriptions\":{},\"channel_copies_out\":{},\"interrupted\":{}}}",
        n as f64 / secs,
        s.base_puts,
        s.device_to_host,
        p.channel().zero_copy_subscribers(),
        p.ordinary_subscriptions(),
        c.copies_out,
        interrupted()
    );
    // Give subscribers a moment to finish reading before the publisher goes away.
    std::thread::sleep(Duration::from_secs_f64(args.linger.max(0.0)));
    Ok(())
}

/// Per-publisher sequence and timestamp checks.
#[derive(Debug, Default)]
pub struct SeqCheck {
    last: HashMap<[u8; 16], (i64, i64)>,
    /// Missing sequence numbers (gaps) seen.
    pub gaps: u64,
    /// Repeated or decreasing sequence numbers, or decreasing timestamps.
    pub disorder: u64,
}

impl SeqCheck {
    /// Records one message; `per_put`: its publisher numbers each put, so gaps are
    /// expected (a buffer-aware rmw_zenoh publisher).
    pub fn see(&mut self, gid: [u8; 16], seq: i64, ts: i64, per_put: bool) {
        if let Some(&(s, t)) = self.last.get(&gid) {
            if seq <= s || ts < t {
                self.disorder += 1;
            } else if seq > s + 1 && !per_put {
                self.gaps += (seq - s - 1) as u64;
            }
        }
        self.last.insert(gid, (seq, ts));
    }

    /// Whether `seq` of `gid` is at or below the last one seen of it (a repeat).
    pub fn is_repeat(&self, gid: [u8; 16], seq: i64) -> bool {
        self.last.get(&gid).is_some_and(|&(s, _)| seq <= s)
    }
}

/// Prints the publishers the subscription found silent, with their reasons.
fn report_silent<M: RosDataMessage>(s: &zenoh_cuda_shm_ros2::RosSubscriber<M>) {
    for p in s.silent_publishers() {
        let reasons: Vec<String> = p.reasons.iter().map(ToString::to_string).collect();
        eprintln!("[ros2] silent publisher {} ({}): {}", gid_hex(&p.gid), p.token, reasons.join("; "));
    }
}

/// The line a subscription of `topic` prints for a publisher it will not hear
/// ([`RosSubscriber::unheard_publishers`](zenoh_cuda_shm_ros2::RosSubscriber::unheard_publishers)).
pub fn unheard_line(topic: &str, p: &SilentPublisher) -> String {
    let reasons: Vec<String> = p.reasons.iter().map(ToString::to_string).collect();
    format!("publisher {} of {topic} (node {}) will not be heard: {}", gid_hex(&p.gid), p.node, reasons.join("; "))
}

/// What a subscription says while nothing comes ([`WaitingNotice`]): that it waits for a
/// publisher of its topic; and, before a first message, about once a second from then
/// on, each publisher of the topic in the graph that it will not hear
/// ([`unheard_line`]), once.
pub(crate) struct WaitingForPublisher<'a> {
    notice: WaitingNotice,
    said: bool,
    who: &'static str,
    topic: &'a str,
    unheard: Box<dyn Fn() -> Vec<SilentPublisher> + 'a>,
    told: HashSet<[u8; 16]>,
    looked: Option<Instant>,
}

impl<'a> WaitingForPublisher<'a> {
    /// For a subscription of `topic` (as resolved) whose unheard publishers `unheard`
    /// lists.
    pub(crate) fn new(who: &'static str, topic: &'a str, unheard: impl Fn() -> Vec<SilentPublisher> + 'a) -> Self {
        let notice = WaitingNotice::new();
        Self { notice, said: false, who, topic, unheard: Box::new(unheard), told: HashSet::new(), looked: None }
    }

    /// Called when a receive timed out, `received` messages having arrived so far.
    pub(crate) fn idle(&mut self, received: u64) {
        if self.notice.due(received) {
            self.said = true;
            println!("{}", self.notice.line(self.who, self.topic));
        }
        if !self.said || received > 0 || self.looked.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.looked = Some(Instant::now());
        for p in (self.unheard)() {
            if self.told.insert(p.gid) {
                println!("[{}] {}", self.who, unheard_line(self.topic, &p));
            }
        }
    }
}

/// Receives `args.count` messages of `kind` and checks each.
pub fn run_sub(kind: Kind, common: &CommonArgs, ros: &RosArgs, args: &RosSubArgs) -> Result<(), BoxError> {
    catch_interrupt();
    let session = open(common)?;
    match kind {
        Kind::Image => {
            let node = ros.node(&session, "zcs_image_sub")?;
            let topic = ros.topic.clone().unwrap_or_else(|| "/camera/image".into());
            let s = node.subscriber::<Image<()>>(&topic, ros.qos()?)?;
            sub_loop(&session, &s, args, |m: &Image<()>, len| {
                m.step == m.width * 4 && len == (m.step as usize) * (m.height as usize) && m.encoding == "rgba8"
            })
        }
        Kind::Tensor => {
            let node = ros.node(&session, "zcs_tensor_sub")?;
            let topic = ros.topic.clone().unwrap_or_else(|| "/tensor".into());
            let s = node.subscriber::<ExperimentalTensor<()>>(&topic, ros.qos()?)?;
            sub_loop(&session, &s, args, |m: &ExperimentalTensor<()>, len| {
                m.dtype().is_ok() && m.shape.len() == 2 && (m.shape[0] * m.shape[1] * 4) as usize == len
            })
        }
    }
}

fn sub_loop<M: RosDataMessage>(
    session: &GpuSession,
    s: &zenoh_cuda_shm_ros2::RosSubscriber<M>,
    args: &RosSubArgs,
    fields_ok: impl Fn(&M, usize) -> bool,
) -> Result<(), BoxError> {
    println!("[ros2] subscribed to '{}' token {} gid {}", s.key(), s.token(), gid_hex(&s.gid()));
    let mut checks = SeqCheck::default();
    let mut paths: BTreeMap<String, u64> = BTreeMap::new();
    // Why each path was taken, as first seen ("" for zero-copy).
    let mut reasons: BTreeMap<String, String> = BTreeMap::new();
    let (mut n, mut bad) = (0u64, 0u64);
    // Publish (the source timestamp) → received, µs, for the summary.
    let mut lat_us: Vec<f64> = Vec::new();
    // Made at the first device sample (the kernels load once, not per message).
    let mut checker: Option<DeviceChecker> = None;
    let mut first: Option<Instant> = None;
    let mut waiting = WaitingForPublisher::new("ros2", s.topic(), || s.unheard_publishers());
    // Why the loop ended before `-n` messages, reported after the summary.
    let mut failed: Option<String> = None;
    while args.count == 0 || n < args.count {
        let idle = (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout));
        let recv = |t| {
            let r = s.recv_timeout(t);
            if r.is_err() {
                waiting.idle(n);
            }
            r
        };
        let sample: RosSample<M> = match next_or_interrupt(idle, recv, |e| *e == RecvError::Timeout) {
            Ok(Some(v)) => v,
            Ok(None) => break,
            Err(e) => {
                failed = Some(ended_early(&e, n, args.idle_timeout));
                break;
            }
        };
        first.get_or_insert_with(Instant::now);
        let a = *sample.attachment();
        if a.timestamp_ns > 0 {
            lat_us.push(zenoh_cuda_shm_ros2::attachment::now_ns().saturating_sub(a.timestamp_ns) as f64 / 1e3);
        }
        checks.see(a.gid, a.seq, a.timestamp_ns, sample.seq_per_put());
        let path = sample.path().to_string();
        if !reasons.contains_key(&path) {
            let why = s.path_reason(&sample).unwrap_or_default();
            println!(
                "[ros2] first message by path {path}{}",
                if why.is_empty() { String::new() } else { format!(" ({why})") }
            );
            reasons.insert(path.clone(), why);
        }
        *paths.entry(path).or_default() += 1;
        let mut ok = fields_ok(sample.msg(), sample.data_len());
        if ok && !args.no_check {
            ok = match sample.host_data() {
                Some(h) => check_pattern(&h, 0, a.seq as u64).is_none(),
                None => {
                    let g = sample.gpu_sample().ok_or("device data without a GPU sample")?;
                    let checker = match &mut checker {
                        Some(c) => c,
                        None => checker.insert(DeviceChecker::new(session.gpu().ok_or("no GPU")?)?),
                    };
                    checker.mismatches(g, a.seq as u64)? == 0
                }
            };
        }
        if !ok {
            bad += 1;
            eprintln!("[ros2] message {} from {}: MISMATCH", a.seq, gid_hex(&a.gid));
        }
        n += 1;
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    // A repeat of a message already delivered within a grace period is a failure too;
    // later messages are a publisher still running.
    std::thread::sleep(Duration::from_millis(300));
    let extra = std::iter::from_fn(|| s.try_recv())
        .filter(|m| checks.is_repeat(m.attachment().gid, m.attachment().seq))
        .count();
    let st = s.stats();
    report_silent(s);
    if let Some(why) = s.backend_refusal() {
        eprintln!(
            "{} CUDA buffer descriptors refused, their messages lost; the last because: {why}",
            st.backend_refused
        );
    }
    let fps = if n > 1 && secs > 0.0 { (n - 1) as f64 / secs } else { 0.0 };
    // What came adds up: frames (read) + dropped_queue_full + unread.
    let received = st.channel + st.base + st.buf_cpu + st.cuda_buffers + st.buf_gid;
    let unread = received.saturating_sub(n).saturating_sub(st.dropped_queue_full);
    println!(
        "{{\"role\":\"ros2_sub\",\"frames\":{n},\"received\":{received},\"unread\":{unread},\"bad\":{bad},\"gaps\":{},\"disorder\":{},\"extra\":{extra},\"fps\":{fps:.2},\"latency_us\":{},\"paths\":{:?},\"path_reasons\":{:?},\"channel\":{},\"base\":{},\"buf_cpu\":{},\"cuda_buffers\":{},\"buf_gid\":{},\"backend_refused\":{},\"dropped_queue_full\":{},\"lost\":{},\"silent\":{},\"duplicates\":{},\"bad_attachment\":{},\"bad_cdr\":{},\"bad_envelope\":{},\"interrupted\":{}}}",
        checks.gaps,
        checks.disorder,
        crate::latency_json(&mut lat_us),
        paths,
        reasons,
        st.channel,
        st.base,
        st.buf_cpu,
        st.cuda_buffers,
        st.buf_gid,
        st.backend_refused,
        st.dropped_queue_full,
        st.lost,
        st.silent_publishers,
        st.duplicates,
        st.bad_attachment,
        st.bad_cdr,
        st.bad_envelope,
        interrupted()
    );
    if bad > 0 || checks.gaps > 0 || checks.disorder > 0 || extra > 0 {
        return Err(format!(
            "{bad} bad, {} gaps, {} out of order, {extra} extra of {n} messages",
            checks.gaps, checks.disorder
        )
        .into());
    }
    match failed {
        Some(why) => Err(why.into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use zenoh_cuda_shm_ros2::SilenceReason;

    use super::*;

    #[test]
    fn an_unheard_publisher_is_named_with_its_node_and_every_reason() {
        let p = SilentPublisher {
            token: String::new(),
            gid: [3; 16],
            node: "/ns/tensor_pub".into(),
            reasons: vec![
                SilenceReason::TypeMismatch { theirs: "tensor_msgs::msg::dds_::ExperimentalTensor_".into() },
                SilenceReason::QosIncompatible("a best-effort publisher and a reliable subscription"),
            ],
        };
        assert_eq!(
            unheard_line("/camera/image", &p),
            format!(
                "publisher {} of /camera/image (node /ns/tensor_pub) will not be heard: it publishes another type \
                 (tensor_msgs::msg::dds_::ExperimentalTensor_); incompatible QoS: a best-effort publisher and a \
                 reliable subscription",
                gid_hex(&[3; 16])
            )
        );
    }
}
