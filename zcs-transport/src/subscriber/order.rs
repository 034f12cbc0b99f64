//! Delivery order: bytes arriving through Zenoh merged with what a link routes, by
//! sequence number, each message delivered once (`dedup.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use zenoh::sample::{Sample, SampleKind};

use super::delivery::{Body, Delivery};
use super::{Link, Shared, inc};
use crate::protocol::{self, BytesHeader};
use crate::sample::{Path, SampleInfo};
use crate::sync::Unpoisoned;

/// How long the first message routed over a new link waits for the bytes sent through
/// Zenoh just before it (Zenoh keeps their order, so they are near).
const SWITCH_WAIT: Duration = Duration::from_millis(500);

/// How long a `ViaBytes` message waits for its bytes through Zenoh.
const VIA_BYTES_WAIT: Duration = Duration::from_secs(1);

/// Bytes kept for messages routed `ViaBytes` whose notice has not come yet.
const INBOX_LIMIT: usize = 256;

/// Keeps one publisher's messages in order across the two ways they arrive: bytes
/// through Zenoh, and the routed frames of its link (descriptors, inline messages,
/// `ViaBytes` notices), which are in sequence order on the connection.
///
/// Before a link is ready every message comes as bytes and is delivered as it
/// arrives. From `Reply::Ready { first_seq }` on, the link thread delivers everything:
/// its first delivery waits for the bytes sent just before `first_seq` (if this
/// subscriber was receiving bytes), and bytes of later messages wait in `inbox` until
/// their `ViaBytes` notice comes.
#[derive(Default)]
pub(super) struct Order {
    m: Mutex<OrderState>,
    pub(super) cv: Condvar,
}

#[derive(Default)]
pub(super) struct OrderState {
    /// The ready link's first routed message.
    pub(super) first_seq: Option<u64>,
    /// Bytes deliveries (before `first_seq`) under way.
    pub(super) direct_inflight: usize,
    /// Highest sequence number delivered from bytes before `first_seq`.
    pub(super) direct_max: u64,
    /// Whether the link has delivered: bytes from before `first_seq` are late now.
    pub(super) switched: bool,
    /// Bytes of messages the link routes, waiting for their turn.
    pub inbox: BTreeMap<u64, Delivery>,
    /// Highest sequence number whose bytes were dropped from a full inbox: a notice for
    /// it, or for anything before it that is not in the inbox, waits for nothing (the
    /// bytes of one publisher arrive in order).
    pub(super) inbox_dropped: u64,
}

impl OrderState {
    /// A new link's routing starts at `first_seq`, or (`None`) the link ended and bytes
    /// are delivered as they arrive: nothing waits for the old link's notices any more.
    pub(super) fn restart(&mut self, first_seq: Option<u64>) {
        self.first_seq = first_seq;
        self.switched = false;
        self.inbox.clear();
        self.inbox_dropped = 0;
    }
}

impl Order {
    pub(super) fn lock(&self) -> MutexGuard<'_, OrderState> {
        self.m.locked()
    }

    /// Waits on the condition variable until `deadline`; false once it has passed.
    pub fn wait<'a>(&self, g: MutexGuard<'a, OrderState>, deadline: Instant) -> (MutexGuard<'a, OrderState>, bool) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (g, false);
        }
        let (g, _) = self.cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner());
        (g, true)
    }

    /// Before the link's first delivery: let the bytes sent just before `first_seq`
    /// land first: those through `bytes_through`, which the publisher put for this
    /// subscriber, and, if bytes were arriving already, all up to `first_seq`.
    pub(super) fn switch_over<'a>(
        &'a self,
        mut g: MutexGuard<'a, OrderState>,
        first_seq: u64,
        bytes_through: u64,
    ) -> MutexGuard<'a, OrderState> {
        if g.switched {
            return g;
        }
        let deadline = Instant::now() + SWITCH_WAIT;
        while g.direct_inflight > 0
            || g.direct_max < bytes_through
            || (g.direct_max > 0 && g.direct_max + 1 < first_seq)
        {
            let (g2, more) = self.wait(g, deadline);
            g = g2;
            if !more {
                tracing::debug!(
                    first_seq,
                    direct_max = g.direct_max,
                    "bytes before the switch to zero-copy never came"
                );
                break;
            }
        }
        g.switched = true;
        g
    }
}

fn decode_meta(sample: &Sample) -> Option<BytesHeader> {
    let att = sample.attachment()?;
    protocol::decode_attachment(&att.to_bytes()).ok().flatten()
}

pub(super) fn on_bytes(sh: &Arc<Shared>, sample: &Sample, plain_key: bool) {
    if sample.kind() != SampleKind::Put && plain_key {
        return;
    }
    #[cfg(feature = "fault-injection")]
    if crate::fault::bytes_delayed() {
        let (sh, sample) = (Arc::clone(sh), sample.clone());
        return crate::fault::delay_bytes(Box::new(move || take_bytes(&sh, &sample, plain_key)));
    }
    take_bytes(sh, sample, plain_key);
}

fn take_bytes(sh: &Arc<Shared>, sample: &Sample, plain_key: bool) {
    if sample.kind() == SampleKind::Delete {
        return take_end(sh, sample);
    }
    let header = decode_meta(sample);
    // Ours on the plain key (while this subscriber listens there) is a second copy of
    // bytes that usually also come on our channel, but not always: a publisher that has
    // not yet seen this subscriber's token puts them on the plain key only. So it is
    // taken unless the link routes that message; a copy already delivered is dropped
    // without counting it as a duplicate.
    let h = match header {
        Some(h) => h,
        None if plain_key => {
            inc(&sh.counters.plain);
            let info = SampleInfo {
                key: sample.key_expr().as_str().to_owned(),
                publisher: 0,
                seq: 0,
                timestamp_ns: 0,
                path: Path::Plain,
                meta: None,
            };
            let body = Body::Bytes(sample.payload().clone());
            return sh.deliver(sh.sample(info, body));
        }
        None => {
            inc(&sh.counters.bad_bytes);
            sh.bad_input.warn("bytes without a valid header on our channel", &sample.key_expr());
            return;
        }
    };
    #[cfg(feature = "fault-injection")]
    if crate::fault::bytes_lost(h.seq) {
        return;
    }
    let (link, order) = {
        let st = sh.state.locked();
        match st.pubs.get(&h.publisher) {
            Some(e) => (e.link.clone(), Some(Arc::clone(&e.order))),
            None => (None, None),
        }
    };
    // Handshaken with this publisher: we hold its key and can tell a forgery.
    if let Some(link) = &link
        && link.cap_key.bytes_tag(h.publisher, h.seq, sample.payload().len() as u64) != h.tag
    {
        inc(&sh.counters.bad_bytes);
        sh.bad_input.warn("bytes with a forged header dropped", &sample.key_expr());
        return;
    }
    let path = if h.from_block { Path::CpuBytes } else { Path::Inline };
    let (publisher, seq) = (h.publisher, h.seq);
    let info = SampleInfo {
        key: protocol::key_of_bytes_key(sample.key_expr().as_str()).to_owned(),
        publisher,
        seq,
        timestamp_ns: h.timestamp_ns,
        path,
        meta: h.meta,
    };
    let sample = sh.sample(info, Body::Bytes(sample.payload().clone()));
    let counter = if path == Path::CpuBytes { &sh.counters.cpu_bytes } else { &sh.counters.inline };
    let Some(order) = order else {
        // A publisher whose token has not reached us yet: deliver as it comes.
        if sh.dedup.first_copy(publisher, seq, !plain_key) {
            inc(counter);
            sh.deliver(sample);
        }
        return;
    };
    let mut o = order.lock();
    match o.first_seq {
        // The link routes this message; its bytes, if any, come on our channel.
        Some(first) if seq >= first && plain_key => {}
        // The link routes this message: it waits for its turn.
        Some(first) if seq >= first => {
            if sh.dedup.seen(publisher, seq) {
                sh.dedup.count_duplicate();
                return;
            }
            o.inbox.insert(seq, sample);
            while o.inbox.len() > INBOX_LIMIT {
                if let Some((dropped, _)) = o.inbox.pop_first() {
                    o.inbox_dropped = o.inbox_dropped.max(dropped);
                }
            }
            order.cv.notify_all();
        }
        // Bytes of a message before the link's first, which the link has already passed:
        // this subscriber gets the message only this way, so it is delivered now, out of
        // order, rather than lost. (The switch-over waits for such bytes only when it has
        // seen bytes before; the first bytes of a subscriber can still be under way
        // through a router when its link delivers.)
        Some(_) if o.switched => {
            drop(o);
            if sh.dedup.first_copy(publisher, seq, !plain_key) {
                inc(&sh.counters.late_bytes);
                inc(counter);
                tracing::debug!(publisher = %crate::Id(publisher), seq, "bytes from before the switch to zero-copy delivered late");
                sh.deliver(sample);
            }
        }
        _ => {
            if !sh.dedup.first_copy(publisher, seq, !plain_key) {
                // Its other copy was delivered; the switch-over may wait for it.
                o.direct_max = o.direct_max.max(seq);
                order.cv.notify_all();
                return;
            }
            o.direct_inflight += 1;
            drop(o);
            inc(counter);
            sh.deliver(sample);
            let mut o = order.lock();
            o.direct_inflight -= 1;
            o.direct_max = o.direct_max.max(seq);
            order.cv.notify_all();
        }
    }
}

/// A publisher's end notice on our channel (a delete whose header carries its last
/// sequence number, after all its bytes there): what has not come since its first
/// message is lost. A publisher with a ready link is left to the link, whose routed
/// frames name every message it was to get.
fn take_end(sh: &Arc<Shared>, sample: &Sample) {
    let Some(h) = decode_meta(sample) else {
        inc(&sh.counters.bad_bytes);
        sh.bad_input.warn("a delete without a valid header on our channel", &sample.key_expr());
        return;
    };
    let link = sh.state.locked().pubs.get(&h.publisher).and_then(|e| e.link.clone());
    if let Some(link) = link {
        if link.cap_key.end_tag(h.publisher, h.seq) != h.tag {
            inc(&sh.counters.bad_bytes);
            sh.bad_input.warn("an end notice with a forged header dropped", &sample.key_expr());
            return;
        }
        if link.order.lock().first_seq.is_some() {
            return;
        }
    }
    sh.dedup.ended(h.publisher, h.seq);
}

/// Delivers a message routed over `link` (in its turn), unless it was delivered
/// already; counts it in `counter`.
pub(super) fn deliver_routed(sh: &Shared, link: &Link, sample: Delivery, counter: &AtomicU64) {
    let seq = sample.seq();
    {
        let mut o = link.order.switch_over(link.order.lock(), link.first_seq, link.bytes_through);
        // The same message may also have come as bytes (for another subscriber).
        o.inbox.remove(&seq);
    }
    if sh.dedup.first_delivery(link.publisher, seq) {
        inc(counter);
        sh.deliver(sample);
    }
}

/// Message `seq` comes as bytes through Zenoh: deliver it from the inbox, waiting up
/// to `VIA_BYTES_WAIT` for it.
pub(super) fn on_via_bytes(sh: &Shared, link: &Link, seq: u64) {
    let deadline = Instant::now() + VIA_BYTES_WAIT;
    let order = &link.order;
    let mut o = order.switch_over(order.lock(), link.first_seq, link.bytes_through);
    let sample = loop {
        if let Some(s) = o.inbox.remove(&seq) {
            break Some(s);
        }
        if sh.closed.load(Ordering::Relaxed) || sh.dedup.seen(link.publisher, seq) {
            break None;
        }
        let (o2, more) = if seq <= o.inbox_dropped { (o, false) } else { order.wait(o, deadline) };
        o = o2;
        if !more {
            tracing::warn!(publisher = %crate::Id(link.publisher), seq, "bytes routed through Zenoh never came; message lost");
            sh.dedup.give_up(link.publisher, seq);
            break None;
        }
    };
    drop(o);
    if let Some(s) = sample
        && sh.dedup.first_delivery(link.publisher, seq)
    {
        inc(if s.path() == Path::Inline { &sh.counters.inline } else { &sh.counters.cpu_bytes });
        sh.deliver(s);
    }
}
