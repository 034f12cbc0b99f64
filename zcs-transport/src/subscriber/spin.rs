//! Adaptive busy-polling: how long a subscriber's waiting thread polls before it sleeps
//! (`spin_us`, the most it ever polls).
//!
//! A thread that sleeps pays a wake-up when its message comes: tens of µs on a virtual
//! machine, and most of a round trip's p99. A thread that polls pays a busy core
//! instead. A [`SpinWindow`] polls only while that pays, that is while this thread's
//! waits have been ending within `spin_us`:
//! - it starts closed: a new receiver sleeps at once;
//! - a wait that a message ended within `spin_us` (while polling or after sleeping)
//!   widens it to twice that wait (at least `MIN`), never beyond `spin_us`;
//! - a wait longer than `spin_us` (a slow stream, a pause, a timeout) halves it; below
//!   `MIN` it closes;
//! - a shorter wait that timed out tells nothing and changes nothing.
//!
//! A stream whose messages are further apart than `spin_us` is thus never polled for,
//! whatever its rate, after its first gap; a request/reply loop or a fast stream polls
//! about as long as its gaps, and sleeps again once they grow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The narrowest open window.
pub(crate) const MIN: Duration = Duration::from_micros(5);

/// One waiting thread's polling window (shared by the threads that wait on one queue:
/// a FIFO subscriber's, a ROS 2 subscription's).
pub struct SpinWindow {
    max_ns: u64,
    cur_ns: AtomicU64,
}

impl SpinWindow {
    /// A closed window that may open up to `max` (zero: it never does).
    pub fn new(max: Duration) -> Self {
        Self { max_ns: nanos(max), cur_ns: AtomicU64::new(0) }
    }

    /// How long the next wait polls before it sleeps.
    pub(crate) fn get(&self) -> Duration {
        Duration::from_nanos(self.cur_ns.load(Ordering::Relaxed))
    }

    /// Adapts the window to a wait that polled for up to `window` (as [`SpinWindow::get`]
    /// gave it) and ended after `waited`, with a message (`got`) or not. Returns how
    /// long that wait polled.
    pub(crate) fn waited(&self, window: Duration, waited: Duration, got: bool) -> Duration {
        if self.max_ns == 0 {
            return Duration::ZERO;
        }
        let w = nanos(waited);
        let cur = self.cur_ns.load(Ordering::Relaxed);
        let next = if w <= self.max_ns && !got {
            cur
        } else if w <= self.max_ns {
            cur.max(w.saturating_mul(2).max(nanos(MIN))).min(self.max_ns)
        } else if cur / 2 < nanos(MIN) {
            0
        } else {
            cur / 2
        };
        // Threads sharing a window may race here; either's update is a fair one.
        self.cur_ns.store(next, Ordering::Relaxed);
        waited.min(window)
    }
}

/// How a wait on a queue ended without an item.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueEnd {
    /// Nothing came in time.
    Timeout,
    /// The queue's senders are gone.
    Closed,
}

/// Receives from `rx`: polls for `spin`'s window (at most `within`), yielding the core
/// between tries (a polling thread must not keep the thread it waits for from
/// running), then sleeps for the rest of `within` (`Duration::MAX`: for as long as it
/// takes); adapts `spin` to the whole wait. Returns what came and how long it polled.
pub fn recv_queue<T>(rx: &flume::Receiver<T>, spin: &SpinWindow, within: Duration) -> (Result<T, QueueEnd>, Duration) {
    let window = spin.get();
    let t = Instant::now();
    let polling = window.min(within);
    let got = loop {
        match rx.try_recv() {
            Ok(v) => break Ok(v),
            Err(flume::TryRecvError::Disconnected) => break Err(QueueEnd::Closed),
            Err(flume::TryRecvError::Empty) if t.elapsed() < polling => std::thread::yield_now(),
            Err(flume::TryRecvError::Empty) if within == Duration::MAX => {
                break rx.recv().map_err(|_| QueueEnd::Closed);
            }
            Err(flume::TryRecvError::Empty) => {
                break rx.recv_timeout(within.saturating_sub(t.elapsed())).map_err(|e| match e {
                    flume::RecvTimeoutError::Timeout => QueueEnd::Timeout,
                    flume::RecvTimeoutError::Disconnected => QueueEnd::Closed,
                });
            }
        }
    };
    let polled = spin.waited(window, t.elapsed(), got.is_ok());
    (got, polled)
}

/// Adds a wait's polling to a `polled_us` counter (kept in ns).
pub fn count_polled(counter: &AtomicU64, polled: Duration) {
    if !polled.is_zero() {
        counter.fetch_add(nanos(polled), Ordering::Relaxed);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn starts_closed_and_never_opens_with_max_zero() {
        let w = SpinWindow::new(Duration::ZERO);
        assert_eq!(w.get(), Duration::ZERO);
        assert_eq!(w.waited(Duration::ZERO, 3 * US, true), Duration::ZERO);
        assert_eq!(w.get(), Duration::ZERO);
    }

    #[test]
    fn quick_waits_open_it_to_twice_the_wait_up_to_max() {
        let w = SpinWindow::new(500 * US);
        assert_eq!(w.get(), Duration::ZERO, "a new receiver sleeps at once");
        // Slept, woken after 40 µs: polled for nothing, opens to 80 µs.
        assert_eq!(w.waited(Duration::ZERO, 40 * US, true), Duration::ZERO);
        assert_eq!(w.get(), 80 * US);
        // A wait already served (a backlog) opens it no less than MIN and shrinks nothing.
        w.waited(80 * US, Duration::ZERO, true);
        assert_eq!(w.get(), 80 * US);
        let fresh = SpinWindow::new(500 * US);
        fresh.waited(Duration::ZERO, Duration::ZERO, true);
        assert_eq!(fresh.get(), MIN);
        // A longer wait within max widens it, capped at max.
        assert_eq!(w.waited(80 * US, 300 * US, true), 80 * US, "polled the whole window, then slept");
        assert_eq!(w.get(), 500 * US);
        assert_eq!(w.waited(500 * US, 120 * US, true), 120 * US, "served while polling");
        assert_eq!(w.get(), 500 * US, "shorter waits do not narrow it");
    }

    #[test]
    fn waits_beyond_max_halve_it_then_close_it() {
        let w = SpinWindow::new(500 * US);
        w.waited(Duration::ZERO, 400 * US, true);
        assert_eq!(w.get(), 500 * US);
        // A frame every 33 ms: each wait polls, finds nothing, halves the window.
        let mut polled = Duration::ZERO;
        for _ in 0..10 {
            let win = w.get();
            polled += w.waited(win, Duration::from_millis(33), true);
        }
        assert_eq!(w.get(), Duration::ZERO, "closed after a few slow waits");
        assert!(polled < 1000 * US, "at most twice max polled in all: {polled:?}");
        // Closed, a slow stream costs no polling at all.
        assert_eq!(w.waited(Duration::ZERO, Duration::from_millis(33), true), Duration::ZERO);
        assert_eq!(w.get(), Duration::ZERO);
    }

    #[test]
    fn a_short_wait_without_a_message_changes_nothing() {
        let w = SpinWindow::new(500 * US);
        // `recv_timeout(0)` in a loop: no message, no reason to poll.
        assert_eq!(w.waited(Duration::ZERO, US, false), Duration::ZERO);
        assert_eq!(w.get(), Duration::ZERO);
        w.waited(Duration::ZERO, 100 * US, true);
        assert_eq!(w.waited(200 * US, 150 * US, false), 150 * US);
        assert_eq!(w.get(), 200 * US, "nor does it close an open one");
        // A timeout beyond max does count: nothing came for that long.
        w.waited(200 * US, Duration::from_millis(100), false);
        assert_eq!(w.get(), 100 * US);
    }

    #[test]
    fn recv_queue_polls_only_once_the_window_is_open_and_keeps_its_timeout() {
        let (tx, rx) = flume::unbounded();
        let w = SpinWindow::new(Duration::from_millis(50));
        // Closed: no polling; the wait times out at its timeout, not before.
        let t = Instant::now();
        assert_eq!(recv_queue(&rx, &w, Duration::from_millis(20)), (Err(QueueEnd::Timeout), Duration::ZERO));
        assert!(t.elapsed() >= Duration::from_millis(20));
        tx.send(1).unwrap();
        assert_eq!(recv_queue(&rx, &w, Duration::MAX), (Ok(1), Duration::ZERO));
        let opened = w.get();
        assert!(
            opened >= MIN && opened < Duration::from_millis(2),
            "an item already there opens it a little: {opened:?}"
        );
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            tx.send(2).unwrap();
            tx
        });
        let (got, polled) = recv_queue(&rx, &w, Duration::from_secs(5));
        assert_eq!((got, polled), (Ok(2), opened), "polled its whole window, then slept");
        assert!(w.get() >= Duration::from_millis(4), "opened to twice the wait: {:?}", w.get());
        drop(sender.join().unwrap());
        assert_eq!(recv_queue(&rx, &w, Duration::MAX).0, Err(QueueEnd::Closed));
    }

    #[test]
    fn huge_durations_saturate() {
        let w = SpinWindow::new(Duration::MAX);
        w.waited(Duration::ZERO, Duration::from_secs(1), true);
        assert_eq!(w.get(), Duration::from_secs(2));
        w.waited(Duration::ZERO, Duration::MAX, true);
        assert_eq!(w.get(), Duration::from_nanos(u64::MAX));
    }
}
