//! Exactly-once and loss accounting: each message of a publisher delivered once,
//! whichever way it came; gaps after its first message counted as lost, less those
//! filled late; messages given up and those missing at a publisher's end counted too.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::Unpoisoned;

/// The messages delivered per publisher, and the counters they feed.
#[derive(Default)]
pub(super) struct Dedup {
    seen: Mutex<HashMap<u64, Seen>>,
    /// The highest sequence number delivered of the last [`GONE`] publishers forgotten:
    /// their end notice can come after their token has gone.
    gone: Mutex<VecDeque<(u64, Option<u64>)>>,
    /// `SubscriberStats::duplicates`.
    duplicates: AtomicU64,
    /// `SubscriberStats::lost`.
    lost: AtomicU64,
}

impl Dedup {
    /// Whether `seq` of `publisher` was delivered.
    pub(super) fn seen(&self, publisher: u64, seq: u64) -> bool {
        self.seen.locked().get(&publisher).is_some_and(|s| s.set.contains(&seq))
    }

    /// Records `seq` of `publisher` as delivered unless it was already (then counted
    /// as a duplicate); counts gaps. Whether to deliver it.
    pub(super) fn first_delivery(&self, publisher: u64, seq: u64) -> bool {
        self.first_copy(publisher, seq, true)
    }

    /// [`Dedup::first_delivery`]; `count_duplicate`: count a copy already delivered in
    /// `duplicates` (not for the plain key's copies, which are expected).
    pub(super) fn first_copy(&self, publisher: u64, seq: u64, count_duplicate: bool) -> bool {
        let mut seen = self.seen.locked();
        match seen.entry(publisher).or_default().insert(seq) {
            None => {
                if count_duplicate {
                    self.count_duplicate();
                }
                false
            }
            Some(gap) => {
                match gap {
                    Gap::None => {}
                    Gap::Skipped(n) => {
                        self.lost.fetch_add(n, Ordering::Relaxed);
                    }
                    // Relaxed: a counter; updates happen under the `seen` lock anyway.
                    Gap::Filled => {
                        let _ = self.lost.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
                    }
                }
                true
            }
        }
    }

    /// A message dropped because it was delivered already.
    pub(super) fn count_duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    /// Message `seq` of `publisher`, which this subscriber was to get, will not come
    /// (its bytes never came, its block could not be imported): counted in `lost` now,
    /// with any gap before it, rather than once a later message comes, which at the end
    /// of a stream never happens.
    pub(super) fn give_up(&self, publisher: u64, seq: u64) {
        let mut seen = self.seen.locked();
        let s = seen.entry(publisher).or_default();
        let n = match s.high {
            None => 1,
            Some(h) if seq > h => seq - h,
            // Below the highest delivered: counted as a gap when that one came.
            Some(_) => return,
        };
        s.high = Some(seq);
        self.lost.fetch_add(n.min(Seen::WINDOW as u64), Ordering::Relaxed);
    }

    /// `publisher`'s end notice: `last` was its last message. Whatever this subscriber
    /// has not received since its first message from it is lost.
    pub(super) fn ended(&self, publisher: u64, last: u64) {
        let mut seen = self.seen.locked();
        let mut gone = self.gone.locked();
        let high = match seen.get_mut(&publisher) {
            Some(s) => &mut s.high,
            None => match gone.iter_mut().find(|(p, _)| *p == publisher) {
                Some((_, h)) => h,
                None => return,
            },
        };
        if let Some(h) = *high
            && last > h
        {
            *high = Some(last);
            self.lost.fetch_add((last - h).min(Seen::WINDOW as u64), Ordering::Relaxed);
        }
    }

    /// Forgets a publisher that is gone (its end notice may still come).
    pub(super) fn forget(&self, publisher: u64) {
        let high = self.seen.locked().remove(&publisher).and_then(|s| s.high);
        let mut gone = self.gone.locked();
        if gone.len() == GONE {
            gone.pop_front();
        }
        gone.push_back((publisher, high));
    }

    /// Duplicates dropped so far.
    pub(super) fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }

    /// Messages lost so far.
    pub(super) fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

/// How many forgotten publishers [`Dedup`] keeps the highest delivered message of.
const GONE: usize = 64;

/// The last [`Seen::WINDOW`] sequence numbers delivered from one publisher, and the
/// highest, for loss accounting.
///
/// Deduplication only has to catch the same message arriving by two paths (a
/// descriptor and bytes, while a handshake completes), which arrive close together. A
/// set rather than a high-water mark: bytes headers are not authenticated, and a forged
/// huge sequence number must not make every later real message look like a duplicate.
#[derive(Default)]
struct Seen {
    order: VecDeque<u64>,
    set: HashSet<u64>,
    high: Option<u64>,
}

/// What recording one delivery did to the loss count.
#[derive(Debug, PartialEq, Eq)]
enum Gap {
    /// In sequence, or the first message.
    None,
    /// This many messages were skipped.
    Skipped(u64),
    /// A message below the highest delivered: it fills a gap (if one was counted).
    Filled,
}

impl Seen {
    const WINDOW: usize = 4096;

    /// Records `seq`: `None` if it was delivered already.
    fn insert(&mut self, seq: u64) -> Option<Gap> {
        if !self.set.insert(seq) {
            return None;
        }
        self.order.push_back(seq);
        if self.order.len() > Self::WINDOW
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        Some(match self.high {
            Some(h) if seq > h => {
                self.high = Some(seq);
                match seq - h - 1 {
                    0 => Gap::None,
                    n => Gap::Skipped(n.min(Self::WINDOW as u64)),
                }
            }
            Some(_) => Gap::Filled,
            None => {
                self.high = Some(seq);
                Gap::None
            }
        })
    }
}
