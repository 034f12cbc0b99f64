//! Silent publishers: a publisher of a subscription's topic that has been in the graph
//! for a while without a single message reaching the subscription. Nothing on the wire
//! reports such a failure (a type-hash mismatch, incompatible QoS, or a buffer-aware
//! rmw_zenoh publisher routing to a key we do not hear all look like an idle topic), so
//! each subscription is checked against the graph and says so once per publisher: a
//! WARN log with the likely reason, a counter (`RosSubscriberStats::silent_publishers`),
//! [`RosSubscriber::silent_publishers`](super::RosSubscriber::silent_publishers), and,
//! while the publisher stays silent, a liveliness token
//! `@zcs/ros2/v1/<domain>/silent/<subscription GID>/<publisher GID>/<reason codes>`
//! that the zenohd plugin lists in its admin space.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::graph::{Graph, MARKER_PREFIX};
use super::names::{Durability, Entity, HUMBLE_TYPE_HASH, Qos, Reliability, gid_hex, strip_slashes};
use crate::sync::Unpoisoned;

/// Why a publisher may be silent, as far as the graph tells.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SilenceReason {
    /// It publishes another type on the topic.
    TypeMismatch {
        /// Its DDS type name.
        theirs: String,
    },
    /// The same type with another type hash: another message definition (another
    /// distro's, or a changed `.msg`). Its data goes to another key.
    TypeHashMismatch {
        /// Its type hash.
        theirs: String,
    },
    /// A Humble publisher (no type hashes in its keys) and a subscription of a later
    /// distribution's wire: their data keys never meet. Declaring the node with
    /// `ROS_DISTRO=humble` ([`RmwWire::Humble`](crate::RmwWire::Humble)) speaks its wire.
    Humble,
    /// A publisher of a later distribution (a type hash in its keys) and a subscription
    /// on Humble's wire (`TypeHashNotSupported` in its keys): their data keys never meet.
    LaterDistro {
        /// Its type hash.
        theirs: String,
    },
    /// The QoS do not match (rmw_zenoh drops nothing for it, but a buffer-aware
    /// publisher leaves incompatible subscriptions out of its count).
    QosIncompatible(&'static str),
    /// A buffer-aware rmw_zenoh publisher (0.10.5 / 0.12.0 or later) and a subscription
    /// without a `backends:` chunk (transient local, or a type without `uint8[]`): it
    /// routes this subscription's data to `key`, which rmw_zenoh's own legacy
    /// subscriptions do not hear either.
    UnheardKey {
        /// `<base key>/_buf/<this subscription's GID>`.
        key: String,
    },
    /// Every CUDA buffer descriptor it sent this subscription was refused (another
    /// device, a reused block, a socket of another user…): its messages are lost.
    DescriptorsRefused {
        /// The last refusal's kind (`BackendImportError::kind`).
        kind: &'static str,
    },
    /// Nothing in the graph explains it: the publisher may be idle, or its data does
    /// not reach this session (routers, access control, another network).
    Unknown,
}

impl SilenceReason {
    /// A short code for the reason, as the silence token carries it.
    pub fn code(&self) -> &'static str {
        match self {
            Self::TypeMismatch { .. } => "type",
            Self::TypeHashMismatch { .. } => "type-hash",
            Self::Humble => "humble",
            Self::LaterDistro { .. } => "later-distro",
            Self::QosIncompatible(_) => "qos",
            Self::UnheardKey { .. } => "unheard-key",
            Self::DescriptorsRefused { .. } => "refused",
            Self::Unknown => "unknown",
        }
    }
}

/// The liveliness token saying that `publisher` is silent to `subscription`.
pub fn silence_token(domain: u32, subscription: &[u8; 16], publisher: &[u8; 16], reasons: &[SilenceReason]) -> String {
    let codes: Vec<&str> = reasons.iter().map(SilenceReason::code).collect();
    format!("{MARKER_PREFIX}/{domain}/silent/{}/{}/{}", gid_hex(subscription), gid_hex(publisher), codes.join(","))
}

impl std::fmt::Display for SilenceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TypeMismatch { theirs } => write!(f, "it publishes another type ({theirs})"),
            Self::TypeHashMismatch { theirs } => {
                write!(f, "type hash mismatch: it has {theirs} (another message definition or ROS distro)")
            }
            Self::Humble => write!(
                f,
                "it is a Humble node (no type hashes in its keys); declare this node with ROS_DISTRO=humble to hear it"
            ),
            Self::LaterDistro { theirs } => write!(
                f,
                "it is a node of a distribution after Humble (type hash {theirs}), and this node speaks Humble's \
                 wire (ROS_DISTRO=humble)"
            ),
            Self::QosIncompatible(what) => write!(f, "incompatible QoS: {what}"),
            Self::UnheardKey { key } => write!(
                f,
                "it is a buffer-aware rmw_zenoh publisher (0.10.5 / 0.12.0 or later) and sends this \
                 subscription's data to {key}, a key no subscription without a backends chunk hears"
            ),
            Self::DescriptorsRefused { kind } => write!(
                f,
                "every CUDA buffer descriptor it sent was refused here ({kind}; see RosSubscriber::backend_refusals)"
            ),
            Self::Unknown => {
                write!(f, "nothing in the graph explains it: it may be idle, or its data does not reach this session")
            }
        }
    }
}

/// A publisher reported as silent to one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilentPublisher {
    /// Its liveliness token.
    pub token: String,
    /// Its GID.
    pub gid: [u8; 16],
    /// Its node's fully qualified name (`/namespace/name`).
    pub node: String,
    /// Every reason found (at least one).
    pub reasons: Vec<SilenceReason>,
}

impl SilentPublisher {
    fn of(e: &Entity, reasons: Vec<SilenceReason>) -> Self {
        let node = format!("{}/{}", e.namespace.trim_end_matches('/'), e.node);
        Self { token: e.token.clone(), gid: e.gid, node, reasons }
    }
}

/// What one subscription is, for the check.
pub(crate) struct Subject {
    pub(crate) topic: String,
    pub(crate) dds_type: &'static str,
    pub(crate) hash: String,
    pub(crate) qos: Qos,
    pub(crate) has_backends: bool,
    pub(crate) key: String,
    pub(crate) gid: [u8; 16],
    pub(crate) domain: u32,
    pub(crate) since: Instant,
    /// Where the silence tokens are declared.
    pub(crate) session: zenoh::Session,
}

/// A report, with the token that announces it while it stands.
pub(crate) struct Report {
    pub(crate) publisher: SilentPublisher,
    _token: Option<zenoh::liveliness::LivelinessToken>,
}

/// Whether a message from a publisher GID was delivered.
pub(crate) type Heard = Box<dyn Fn(&[u8; 16]) -> bool + Send + Sync>;
/// The refusal kind when every descriptor a publisher GID sent was refused.
pub(crate) type Refused = Box<dyn Fn(&[u8; 16]) -> Option<&'static str> + Send + Sync>;

/// The check's state for one subscription: what it is, whom it heard from, whom it
/// reported.
pub(crate) struct Watch {
    pub(crate) subject: Subject,
    pub(crate) heard: Heard,
    pub(crate) refused: Refused,
    pub(crate) silent: Mutex<HashMap<[u8; 16], Report>>,
    pub(crate) reports: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.locked()
}

/// The likely reasons `publisher` does not reach `sub` (`refused`: the kind of refusal
/// of every descriptor it sent).
pub(crate) fn diagnose(
    sub: &Subject,
    publisher: &Entity,
    ours: bool,
    refused: Option<&'static str>,
) -> Vec<SilenceReason> {
    let mut reasons: Vec<SilenceReason> =
        refused.map(|kind| SilenceReason::DescriptorsRefused { kind }).into_iter().collect();
    let Some(t) = &publisher.topic else {
        if reasons.is_empty() {
            reasons.push(SilenceReason::Unknown);
        }
        return reasons;
    };
    if t.dds_type != sub.dds_type {
        reasons.push(SilenceReason::TypeMismatch { theirs: t.dds_type.clone() });
    } else if t.hash != sub.hash {
        reasons.push(if t.hash == HUMBLE_TYPE_HASH {
            SilenceReason::Humble
        } else if sub.hash == HUMBLE_TYPE_HASH {
            SilenceReason::LaterDistro { theirs: t.hash.clone() }
        } else {
            SilenceReason::TypeHashMismatch { theirs: t.hash.clone() }
        });
    }
    if let Some(q) = t.qos {
        if q.reliability == Reliability::BestEffort && sub.qos.reliability == Reliability::Reliable {
            reasons.push(SilenceReason::QosIncompatible("a best-effort publisher and a reliable subscription"));
        }
        if q.durability == Durability::Volatile && sub.qos.durability == Durability::TransientLocal {
            reasons.push(SilenceReason::QosIncompatible("a volatile publisher and a transient-local subscription"));
        }
    }
    if !ours && t.backends.is_some() && !sub.has_backends && t.key == sub.key {
        reasons.push(SilenceReason::UnheardKey { key: format!("{}/_buf/{}", sub.key, gid_hex(&sub.gid)) });
    }
    if reasons.is_empty() {
        reasons.push(SilenceReason::Unknown);
    }
    reasons
}

/// The publishers of `watch`'s topic in `graph` that it has not heard from and that the
/// graph alone shows will not reach it (each with a reason other than
/// [`SilenceReason::Unknown`]), at once: no window, as for a subscription that waits for
/// its first message.
pub(crate) fn unheard(watch: &Watch, graph: &Graph) -> Vec<SilentPublisher> {
    let s = &watch.subject;
    let mut found = Vec::new();
    for (e, _, ours) in graph.publishers_of(strip_slashes(&s.topic)) {
        let refused = (watch.refused)(&e.gid);
        if (watch.heard)(&e.gid) && refused.is_none() {
            continue;
        }
        let reasons = diagnose(s, &e, ours, refused);
        if reasons != [SilenceReason::Unknown] {
            found.push(SilentPublisher::of(&e, reasons));
        }
    }
    found
}

/// Runs one check of `watch` against the graph: reports each publisher of its topic
/// that has been known for `window` without being heard, once; forgets publishers that
/// were heard since or left.
pub(crate) fn check(watch: &Watch, graph: &Graph, window: Duration, now: Instant) {
    let s = &watch.subject;
    if now.saturating_duration_since(s.since) < window {
        return;
    }
    let publishers = graph.publishers_of(strip_slashes(&s.topic));
    let mut silent = lock(&watch.silent);
    // Heard: a message of its was delivered (refused descriptors are no delivery).
    let heard = |gid: &[u8; 16]| (watch.heard)(gid) && (watch.refused)(gid).is_none();
    silent.retain(|gid, _| publishers.iter().any(|(e, _, _)| e.gid == *gid) && !heard(gid));
    for (e, first_seen, ours) in publishers {
        if now.saturating_duration_since(first_seen) < window || silent.contains_key(&e.gid) || heard(&e.gid) {
            continue;
        }
        let reasons = diagnose(s, &e, ours, (watch.refused)(&e.gid));
        let text: Vec<String> = reasons.iter().map(ToString::to_string).collect();
        tracing::warn!(
            topic = %s.topic,
            publisher = %e.token,
            gid = %gid_hex(&e.gid),
            "a publisher of this topic has sent nothing to this subscription for {:.1} s: {}",
            window.as_secs_f64(),
            text.join("; ")
        );
        watch.reports.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = silence_token(s.domain, &s.gid, &e.gid, &reasons);
        let token = match zenoh::Wait::wait(s.session.liveliness().declare_token(key)) {
            Ok(t) => Some(t),
            Err(err) => {
                tracing::debug!(error = %err, "the silence token could not be declared");
                None
            }
        };
        let publisher = SilentPublisher::of(&e, reasons);
        silent.insert(e.gid, Report { publisher, _token: token });
    }
}

/// The thread that checks a node's subscriptions every `tick` until the node is gone.
pub(crate) fn spawn_checker<N: Send + Sync + 'static>(
    node: Weak<N>,
    graph_of: fn(&N) -> &Graph,
    watches_of: fn(&N) -> &Mutex<Vec<Weak<Watch>>>,
    window: Duration,
) -> std::io::Result<()> {
    let tick = (window / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    std::thread::Builder::new().name("zcs-ros2-silence".into()).spawn(move || {
        loop {
            std::thread::sleep(tick);
            let Some(node) = node.upgrade() else { return };
            let live: Vec<Arc<Watch>> = {
                let mut w = lock(watches_of(&node));
                w.retain(|w| w.strong_count() > 0);
                w.iter().filter_map(Weak::upgrade).collect()
            };
            let now = Instant::now();
            for w in live {
                check(&w, graph_of(&node), window, now);
            }
        }
    })?;
    Ok(())
}
