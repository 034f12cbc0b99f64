//! `ros2_talker` and `ros2_listener`: ROS 2's talker and listener demos
//! (`std_msgs/msg/String` on `chatter`, "Hello World: N"), as our nodes. They talk to
//! `ros2 run demo_nodes_cpp listener` / `talker` (and the Python ones) on rmw_zenoh.
//!
//! The talker's N is the message's ROS sequence number (1, 2, …). The listener checks
//! that, per publisher, the number that ends each text keeps a fixed distance from the
//! sequence number (ROS's own talkers count from another start, but count one per
//! message), and reports gaps and disorder as the image examples do.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use clap::Args;
use zenoh_cuda_shm::RecvError;
use zenoh_cuda_shm::tensor_codec::cdr::StringMsg;
use zenoh_cuda_shm_ros2::names::gid_hex;

use crate::ros2::{RosArgs, SeqCheck, WaitingForPublisher, wait_subscriptions};
use crate::{CommonArgs, catch_interrupt, ended_early, interrupted, next_or_interrupt, open};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Flags of the talker.
#[derive(Args, Debug, Clone)]
pub struct TalkerArgs {
    /// Messages per second.
    #[arg(short, long, default_value_t = 1.0)]
    pub rate: f64,
    /// Messages to publish (0: until Ctrl-C).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub count: u64,
    /// Before publishing, wait (up to 60 s) until this many subscriptions of the topic
    /// are in the graph.
    #[arg(long, default_value_t = 0)]
    pub wait_subscriptions: usize,
    /// Do not print each message.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Flags of the listener.
#[derive(Args, Debug, Clone)]
pub struct ListenerArgs {
    /// Messages to receive before exiting (0: until Ctrl-C).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub count: u64,
    /// Give up after this many seconds without a message (0: never).
    #[arg(long, default_value_t = 0)]
    pub idle_timeout: u64,
    /// Do not print each message.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Publishes "Hello World: N" on `chatter` (or `--topic`).
pub fn run_talker(common: &CommonArgs, ros: &RosArgs, args: &TalkerArgs) -> Result<(), BoxError> {
    catch_interrupt();
    let session = open(common)?;
    let node = ros.node(&session, "talker")?;
    let p = node.publisher::<StringMsg<()>>(ros.topic.as_deref().unwrap_or("chatter"), ros.qos()?)?;
    println!("[talker] publishing on '{}' gid {}", p.key(), gid_hex(&p.gid()));
    wait_subscriptions(&node, p.key(), args.wait_subscriptions);
    let period = if args.rate > 0.0 { Duration::from_secs_f64(1.0 / args.rate) } else { Duration::ZERO };
    let mut next = Instant::now();
    let mut n = 0u64;
    while (args.count == 0 || n < args.count) && !interrupted() {
        let text = format!("Hello World: {}", p.next_seq());
        p.publish_str(&text)?;
        if !args.quiet {
            println!("[talker] Publishing: '{text}'");
        }
        n += 1;
        next += period;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    let s = p.stats();
    println!(
        "{{\"role\":\"talker\",\"messages\":{n},\"base_puts\":{},\"ordinary_subscriptions\":{},\"our_subscriptions\":{},\"interrupted\":{}}}",
        s.base_puts,
        p.ordinary_subscriptions(),
        p.channel().aware_subscribers(),
        interrupted()
    );
    Ok(())
}

/// The number a text ends with ("Hello World: 12" → 12).
fn trailing_number(text: &str) -> Option<i64> {
    let digits = text.len() - text.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    text[text.len() - digits..].parse().ok()
}

/// Prints what arrives on `chatter` (or `--topic`), checking each text.
pub fn run_listener(common: &CommonArgs, ros: &RosArgs, args: &ListenerArgs) -> Result<(), BoxError> {
    catch_interrupt();
    let session = open(common)?;
    let node = ros.node(&session, "listener")?;
    let topic = ros.topic.as_deref().unwrap_or("chatter");
    let s = node.subscriber::<StringMsg<()>>(topic, ros.qos()?)?;
    println!("[listener] subscribed to '{}' gid {}", s.key(), gid_hex(&s.gid()));
    let mut checks = SeqCheck::default();
    // Per publisher: the text's number minus the sequence number, from its first message.
    let mut offsets: HashMap<[u8; 16], i64> = HashMap::new();
    let mut paths: BTreeMap<String, u64> = BTreeMap::new();
    let (mut n, mut bad) = (0u64, 0u64);
    let mut waiting = WaitingForPublisher::new("listener", s.topic(), || s.unheard_publishers());
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
        let sample = match next_or_interrupt(idle, recv, |e| *e == RecvError::Timeout) {
            Ok(Some(v)) => v,
            Ok(None) => break,
            Err(e) => {
                failed = Some(ended_early(&e, n, args.idle_timeout));
                break;
            }
        };
        let a = *sample.attachment();
        checks.see(a.gid, a.seq, a.timestamp_ns, sample.seq_per_put());
        *paths.entry(sample.path().to_string()).or_default() += 1;
        let text = sample.to_message()?.data;
        let ok = trailing_number(&text).is_some_and(|k| *offsets.entry(a.gid).or_insert(k - a.seq) == k - a.seq);
        if !ok {
            bad += 1;
            eprintln!("[listener] message {} from {}: unexpected text {text:?}", a.seq, gid_hex(&a.gid));
        } else if !args.quiet {
            println!("[listener] I heard: [{text}]");
        }
        n += 1;
    }
    let st = s.stats();
    println!(
        "{{\"role\":\"listener\",\"messages\":{n},\"bad\":{bad},\"gaps\":{},\"disorder\":{},\"paths\":{paths:?},\"channel\":{},\"base\":{},\"lost\":{},\"dropped_queue_full\":{},\"bad_cdr\":{},\"bad_envelope\":{},\"interrupted\":{}}}",
        checks.gaps,
        checks.disorder,
        st.channel,
        st.base,
        st.lost,
        st.dropped_queue_full,
        st.bad_cdr,
        st.bad_envelope,
        interrupted()
    );
    if bad > 0 || checks.gaps > 0 || checks.disorder > 0 {
        return Err(format!("{bad} bad, {} gaps, {} out of order of {n} messages", checks.gaps, checks.disorder).into());
    }
    match failed {
        Some(why) => Err(why.into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::trailing_number;

    #[test]
    fn numbers_at_the_end() {
        assert_eq!(trailing_number("Hello World: 12"), Some(12));
        assert_eq!(trailing_number("message 0"), Some(0));
        assert_eq!(trailing_number("7"), Some(7));
        assert_eq!(trailing_number("no number"), None);
        assert_eq!(trailing_number(""), None);
        assert_eq!(trailing_number("x99999999999999999999999"), None, "too long for i64");
    }
}
