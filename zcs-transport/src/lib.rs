//! The transport: routing each message to every subscriber by the cheapest path it
//! can take, and the control connections behind the zero-copy path.
//!
//! For one `put` a publisher sends, at most:
//! 1. to every GPU-ready subscriber, over its control connection, one routed frame:
//!    a **descriptor** (its lease charged first), the whole message if small
//!    (`Inline`), or a `ViaBytes` notice (at its lease limit);
//! 2. **bytes** on `<key>/@zcs/b` when a GPU-aware subscriber cannot take the
//!    zero-copy path (another host or GPU, handshake not finished, at its lease limit);
//! 3. **bytes** on the plain `<key>` when Zenoh reports a subscriber there (plain Zenoh
//!    or ROS nodes).
//!
//! The device→host copy for 2 and 3 happens once, and only when 2 or 3 is needed; with
//! `zenoh_shm_out_bytes` (feature `zenoh-shm`) it lands in Zenoh's shared memory
//! (`shm_out.rs`). The put only enqueues it: the publisher's bytes lane waits for it and
//! puts the bytes, in sequence order, while the next message is copied
//! (`publisher/bytes_lane.rs`).
//! Routed frames go out in sequence order with the routing decision; a subscriber's
//! link thread merges them with bytes from Zenoh by sequence number and delivers every
//! sequence number of a publisher at most once (`docs/protocol.md`).

/// A step of a subscriber joining (its declaration, the handshake on both sides, a
/// block's first import), as a trace event of target `zcs_join`: with
/// `RUST_LOG=zcs_join=trace` the timestamps show where a first message's time goes,
/// across the processes. Free when that target is off.
macro_rules! step {
    ($($arg:tt)+) => {
        tracing::trace!(target: "zcs_join", $($arg)+)
    };
}
pub(crate) use step;

pub mod config;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod locality;
pub mod medium;
pub mod publisher;
pub mod sample;
pub mod shm_out;
pub mod subscriber;

// The layers below, under the names the modules of this crate use.
pub(crate) use zcs_memory::{cuda, error, host, sync};
pub(crate) use zcs_pool::{self as pool, signal};
pub(crate) use zcs_provider as provider;
pub(crate) use zcs_wire::{ipc, protocol};

use crate::sync::Unpoisoned;
use std::time::{SystemTime, UNIX_EPOCH};

/// The key expression of every liveliness token of `role`.
fn token_selector(role: crate::protocol::Role) -> String {
    let which = match role {
        crate::protocol::Role::Pub => "pub",
        crate::protocol::Role::Sub => "sub",
    };
    format!("{}/{which}/**", crate::protocol::TOKEN_ROOT)
}

/// The token `key` names, if it is well-formed, of `role`, and its key meets `ours`.
fn ours_of_role(
    key: &str,
    role: crate::protocol::Role,
    ours: &zenoh::key_expr::KeyExpr<'static>,
) -> Option<crate::protocol::Token> {
    let t = crate::protocol::Token::parse(key)?;
    let meets = zenoh::key_expr::KeyExpr::try_from(t.key.as_str()).is_ok_and(|k| k.intersects(ours));
    (t.role == role && meets).then_some(t)
}

/// Subscribes (with history) to the liveliness tokens of `role` and calls `f` with
/// each put or delete of a well-formed token whose key intersects `ours`.
pub(crate) fn watch_tokens(
    session: &zenoh::Session,
    role: crate::protocol::Role,
    ours: zenoh::key_expr::KeyExpr<'static>,
    f: impl Fn(zenoh::sample::SampleKind, crate::protocol::Token) + Send + Sync + 'static,
) -> zenoh::Result<zenoh::pubsub::Subscriber<()>> {
    use zenoh::Wait;
    session
        .liveliness()
        .declare_subscriber(token_selector(role))
        .history(true)
        .callback(move |sample| {
            if let Some(t) = ours_of_role(sample.key_expr().as_str(), role, &ours) {
                f(sample.kind(), t);
            }
        })
        .wait()
}

/// The well-formed liveliness tokens of `role` whose key intersects `ours` that exist
/// now, as one liveliness query answers them (waiting at most `timeout`).
///
/// A token subscriber's history arrives in its callback some time after its
/// declaration returns; this says what it will bring. Made after such a subscriber on the
/// same keys is declared, the query finds nothing (Zenoh 1.10.2, client of a router).
pub(crate) fn current_tokens(
    session: &zenoh::Session,
    role: crate::protocol::Role,
    ours: &zenoh::key_expr::KeyExpr<'static>,
    timeout: std::time::Duration,
) -> zenoh::Result<Vec<crate::protocol::Token>> {
    use zenoh::Wait;
    let replies = session.liveliness().get(token_selector(role)).timeout(timeout).wait()?;
    // The channel ends when the query does: every reply is in, or the timeout passed.
    Ok(replies
        .iter()
        .filter_map(|r| r.into_result().ok())
        .filter_map(|s| ours_of_role(s.key_expr().as_str(), role, ours))
        .collect())
}

/// A publisher's or subscriber's instance id as every log line, token, admin answer
/// and example prints it: 16 hex digits.
#[derive(Clone, Copy)]
pub(crate) struct Id(pub(crate) u64);

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Nanoseconds since the Unix epoch.
pub(crate) fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Logs at most one warning per `every` for a class of bad input, counting the rest.
pub(crate) struct RateLimitedWarn {
    last: std::sync::Mutex<Option<std::time::Instant>>,
    every: std::time::Duration,
    suppressed: std::sync::atomic::AtomicU64,
}

impl RateLimitedWarn {
    /// At most one warning per `every`.
    pub(crate) fn new(every: std::time::Duration) -> Self {
        Self { last: std::sync::Mutex::new(None), every, suppressed: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Logs `what: detail` unless a warning went out less than `every` ago; counts it then.
    pub(crate) fn warn(&self, what: &str, detail: &dyn std::fmt::Display) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut last = self.last.locked();
        let now = std::time::Instant::now();
        if last.is_none_or(|t| now.duration_since(t) >= self.every) {
            *last = Some(now);
            let skipped = self.suppressed.swap(0, Relaxed);
            tracing::warn!(skipped, "{what}: {detail}");
        } else {
            self.suppressed.fetch_add(1, Relaxed);
        }
    }
}
