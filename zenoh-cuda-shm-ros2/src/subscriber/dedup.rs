//! Exactly-once delivery per publisher GID, and losses: a message is identified by
//! `(GID, sequence number)` on every path.

use std::collections::{BTreeSet, HashMap};

/// Sequence numbers remembered per publisher GID for deduplication.
const DEDUP_WINDOW: usize = 4096;
/// Publisher GIDs remembered; beyond this the oldest-seen are forgotten.
pub(super) const MAX_PUBLISHERS: usize = 1024;

/// Sequence numbers seen from one publisher: the last [`DEDUP_WINDOW`] of them.
#[derive(Default)]
struct Seen {
    seqs: BTreeSet<i64>,
    order: u64,
    /// The highest sequence number delivered.
    high: Option<i64>,
    /// Numbers skipped below `high`, less those delivered late.
    lost: u64,
    /// Numbers each put, not each message (a buffer-aware rmw_zenoh publisher).
    per_put: bool,
}

#[derive(Default)]
pub(super) struct Dedup {
    by_gid: HashMap<[u8; 16], Seen>,
    clock: u64,
    /// Losses of publishers forgotten to make room.
    forgotten_lost: u64,
}

impl Dedup {
    /// Records `(gid, seq)`: `None` if it was delivered already, else whether its
    /// publisher numbers per put. `per_put_key`: it came on a key only publishers that
    /// number per put serve (`_buf_cpu`, `_buf/<our GID>`).
    pub(super) fn first(&mut self, gid: [u8; 16], seq: i64, per_put_key: bool) -> Option<bool> {
        self.clock += 1;
        if !self.by_gid.contains_key(&gid) && self.by_gid.len() >= MAX_PUBLISHERS {
            let oldest = self.by_gid.iter().min_by_key(|(_, s)| s.order).map(|(g, _)| *g);
            if let Some(s) = oldest.and_then(|g| self.by_gid.remove(&g)) {
                self.forgotten_lost += if s.per_put { 0 } else { s.lost };
            }
        }
        let seen = self.by_gid.entry(gid).or_default();
        seen.order = self.clock;
        seen.per_put |= per_put_key;
        if seen.seqs.len() >= DEDUP_WINDOW && seen.seqs.first().is_some_and(|&lo| seq < lo) {
            return None; // older than the window: long since delivered or skipped
        }
        if !seen.seqs.insert(seq) {
            return None;
        }
        if seen.seqs.len() > DEDUP_WINDOW {
            seen.seqs.pop_first();
        }
        match seen.high {
            Some(high) if seq > high => {
                seen.lost += seq.abs_diff(high) - 1;
                seen.high = Some(seq);
            }
            Some(_) => seen.lost = seen.lost.saturating_sub(1),
            None => seen.high = Some(seq),
        }
        Some(seen.per_put)
    }

    /// `gid`'s end notice: its last message was numbered `last`. What it numbered after
    /// the highest delivered counts as lost (a message that still comes takes its share
    /// back, as for any gap). A publisher never heard from counts nothing: where its
    /// stream began for this subscription is unknown.
    pub(super) fn ended(&mut self, gid: &[u8; 16], last: i64) {
        let Some(seen) = self.by_gid.get_mut(gid) else { return };
        if let Some(high) = seen.high.filter(|&high| last > high && !seen.per_put) {
            seen.lost += last.abs_diff(high);
            seen.high = Some(last);
        }
    }

    pub(super) fn heard(&self, gid: &[u8; 16]) -> bool {
        self.by_gid.contains_key(gid)
    }

    pub(super) fn lost(&self) -> u64 {
        self.by_gid.values().filter(|s| !s.per_put).map(|s| s.lost).sum::<u64>() + self.forgotten_lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_notice_counts_the_missing_tail_once_and_late_arrivals_take_it_back() {
        let (a, b, per_put) = ([1; 16], [2; 16], [3; 16]);
        let mut d = Dedup::default();
        for seq in 1..=4 {
            d.first(a, seq, false);
        }
        d.ended(&a, 6);
        assert_eq!(d.lost(), 2, "5 and 6 never came");
        d.ended(&a, 6);
        assert_eq!(d.lost(), 2, "a repeated notice counts nothing more");
        assert_eq!(d.first(a, 6, false), Some(false), "6 comes after all");
        assert_eq!(d.lost(), 1);
        d.ended(&a, 3);
        assert_eq!(d.lost(), 1, "a notice below what was delivered changes nothing");
        d.ended(&b, 9);
        assert_eq!(d.lost(), 1, "a publisher never heard from counts nothing");
        d.first(per_put, 1, true);
        d.ended(&per_put, 9);
        assert_eq!(d.lost(), 1, "numbers of a per-put publisher are not messages");
    }
}
