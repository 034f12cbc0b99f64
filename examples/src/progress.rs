//! What the publisher and subscriber examples say of their progress beyond counts: a
//! subscriber's messages adding up ([`Received`]), and a publisher held back below its
//! rate, with the subscriber that holds its blocks ([`held_back`]).

use std::time::Duration;

use zenoh_cuda_shm::{BlockHolder, SubscriberStats};

/// A subscriber's messages as its counters and its application see them: those its
/// paths delivered, and of those the ones its application read, the ones its full
/// queue dropped, and the ones still queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Delivered by every path (`zero-copy` + `peer-copy` + `host-block` + `inline` +
    /// `cpu-bytes` + `plain`).
    pub received: u64,
    /// Dropped, oldest first, by the subscriber's full queue.
    pub dropped: u64,
    /// Neither read nor dropped: waiting in the queue.
    pub unread: u64,
}

impl Received {
    /// The counters `s` of a subscriber whose application has read `read` messages.
    pub fn of(s: &SubscriberStats, read: u64) -> Self {
        let received = s.zero_copy + s.peer_copy + s.host_block + s.inline + s.cpu_bytes + s.plain;
        let dropped = s.dropped_queue_full;
        Self { received, dropped, unread: received.saturating_sub(read).saturating_sub(dropped) }
    }

    /// For a progress line: how far the application is behind what came, if it is.
    pub fn behind(&self) -> String {
        match (self.unread, self.dropped) {
            (0, 0) => String::new(),
            (u, 0) => format!(" ({} received, {u} queued)", self.received),
            (u, d) => format!(" ({} received, {u} queued, {d} dropped: queue full)", self.received),
        }
    }

    /// For a summary: what was received and not read, and why.
    pub fn unread_text(&self) -> String {
        let mut out = String::new();
        if self.unread > 0 {
            out += &format!(": {} unread at the end", self.unread);
        }
        if self.dropped > 0 {
            out += &format!(
                "{} {} dropped as the queue was full (the application read slower than they came)",
                if out.is_empty() { ":" } else { "," },
                self.dropped
            );
        }
        out
    }
}

/// A progress line for a publisher that sent `sent` messages in `interval` against a
/// `rate` of messages per second (0: as fast as it can), `waited` of it in `loan` and
/// `put`; `None` while it keeps at least 90 % of its rate. It names the subscriber that
/// holds the most blocks (`holders`, most first), the likely brake.
pub fn held_back(
    rate: f64,
    sent: u64,
    interval: Duration,
    waited: Duration,
    holders: &[BlockHolder],
) -> Option<String> {
    let secs = interval.as_secs_f64();
    let achieved = sent as f64 / secs;
    if rate <= 0.0 || secs <= 0.0 || achieved >= 0.9 * rate {
        return None;
    }
    let brake = match holders.first() {
        Some(h) if h.holds > 0 => format!(
            "subscriber {:016x} (pid {}) holds {} blocks{}",
            h.subscriber,
            h.pid,
            h.holds,
            if h.at_limit { ", at its lease limit (it is sent bytes there)" } else { "" }
        ),
        _ => "no subscriber holds blocks: the writes or the copies out are the limit".to_owned(),
    };
    Some(format!(
        "[pub] held back: {achieved:.1} msg/s of {rate} asked; {} ms of {} in loan and put; {brake}",
        waited.as_millis(),
        interval.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_messages_add_up_to_read_dropped_and_unread() {
        let s = SubscriberStats { zero_copy: 130, cpu_bytes: 5, plain: 3, dropped_queue_full: 3, ..Default::default() };
        let r = Received::of(&s, 85);
        assert_eq!(r, Received { received: 138, dropped: 3, unread: 50 });
        assert_eq!(r.behind(), " (138 received, 50 queued, 3 dropped: queue full)");
        assert!(r.unread_text().starts_with(": 50 unread at the end, 3 dropped as the queue was full"));
        let whole = Received::of(&SubscriberStats { zero_copy: 9, ..Default::default() }, 9);
        assert_eq!((whole.behind(), whole.unread_text()), (String::new(), String::new()));
    }

    #[test]
    fn a_publisher_below_its_rate_names_the_subscriber_that_holds_the_most() {
        let second = Duration::from_secs(1);
        let h = |subscriber, holds, at_limit| BlockHolder { subscriber, pid: 42, holds, at_limit };
        assert_eq!(held_back(30.0, 28, second, Duration::ZERO, &[]), None, "within 10 %");
        assert_eq!(held_back(0.0, 3, second, second, &[]), None, "no rate asked");
        let line = held_back(30.0, 14, second, Duration::from_millis(530), &[h(0xab, 8, true), h(1, 2, false)]);
        assert_eq!(
            line.as_deref(),
            Some(
                "[pub] held back: 14.0 msg/s of 30 asked; 530 ms of 1000 in loan and put; subscriber 00000000000000ab \
                 (pid 42) holds 8 blocks, at its lease limit (it is sent bytes there)"
            )
        );
        let line = held_back(30.0, 14, second, Duration::from_millis(10), &[h(1, 0, false)]).unwrap();
        assert!(line.ends_with("no subscriber holds blocks: the writes or the copies out are the limit"), "{line}");
    }
}
