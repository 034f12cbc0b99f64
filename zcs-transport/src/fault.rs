//! Fault injection for the transport's race tests (feature `fault-injection`, which only
//! the test crates turn on): inert until a test sets it, and applying to the whole
//! process.

use crate::sync::Unpoisoned;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static BYTES_DELAY_US: AtomicU64 = AtomicU64::new(0);
static HANDSHAKE_DELAY_US: AtomicU64 = AtomicU64::new(0);
static TOKEN_DELAY_US: AtomicU64 = AtomicU64::new(0);
static BYTES_LOST_FROM: AtomicU64 = AtomicU64::new(0);

type Job = Box<dyn FnOnce() + Send>;

fn store(cell: &AtomicU64, d: Duration) {
    // Relaxed: a setting read on its own, with no other memory to order.
    cell.store(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

fn load(cell: &AtomicU64) -> Duration {
    Duration::from_micros(cell.load(Ordering::Relaxed))
}

/// Makes every sample of our channels' bytes path reach the subscribers of this process
/// `delay` after Zenoh hands it over, in order, without slowing the ones behind it (zero:
/// no delay): a router whose forwarding of bytes lags behind a zero-copy link.
pub fn set_bytes_delay(delay: Duration) {
    store(&BYTES_DELAY_US, delay);
}

/// Delays each subscriber's handshake with a publisher by `delay` before its `Hello`, in
/// its link thread (zero: no delay): a publisher then sends its first messages to it as
/// bytes.
pub fn set_handshake_delay(delay: Duration) {
    store(&HANDSHAKE_DELAY_US, delay);
}

/// Makes every publisher of this process learn of GPU-aware subscribers' liveliness
/// tokens `delay` after Zenoh hands them over, in order (zero: no delay): a router slow
/// to answer the history of a new publisher's token subscription.
pub fn set_token_delay(delay: Duration) {
    store(&TOKEN_DELAY_US, delay);
}

/// Makes every message of our channels' bytes path numbered `seq` or higher vanish on
/// its way to the subscribers of this process, as on a lossy link (0: none lost). A
/// publisher's end notice still arrives.
pub fn set_bytes_lost_from(seq: u64) {
    // Relaxed: a setting read on its own.
    BYTES_LOST_FROM.store(seq, Ordering::Relaxed);
}

pub(crate) fn bytes_lost(seq: u64) -> bool {
    let from = BYTES_LOST_FROM.load(Ordering::Relaxed);
    from != 0 && seq >= from
}

pub(crate) fn bytes_delayed() -> bool {
    !load(&BYTES_DELAY_US).is_zero()
}

/// Runs `job` once the bytes delay has passed, on the delay line.
pub(crate) fn delay_bytes(job: Job) {
    delay_line(Instant::now() + load(&BYTES_DELAY_US), job);
}

pub(crate) fn tokens_delayed() -> bool {
    !load(&TOKEN_DELAY_US).is_zero()
}

/// Runs `job` once the token delay has passed, on the delay line.
pub(crate) fn delay_token(job: Job) {
    delay_line(Instant::now() + load(&TOKEN_DELAY_US), job);
}

/// Runs `job` at `due`, on a thread of its own that runs the delayed jobs in the order
/// they came (a delay line).
fn delay_line(due: Instant, job: Job) {
    static LINE: OnceLock<Mutex<flume::Sender<(Instant, Job)>>> = OnceLock::new();
    let line = LINE.get_or_init(|| {
        let (tx, rx) = flume::unbounded::<(Instant, Job)>();
        let spawned = std::thread::Builder::new().name("zcs-test-delay".into()).spawn(move || {
            for (due, job) in rx.iter() {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                job();
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %crate::error::Chain(&e), "no delay line: delayed jobs run at once");
        }
        Mutex::new(tx)
    });
    let sent = line.locked().send((due, job));
    if let Err(flume::SendError((_, job))) = sent {
        job();
    }
}

pub(crate) fn delay_handshake() {
    std::thread::sleep(load(&HANDSHAKE_DELAY_US));
}

pub(crate) fn handshake_delayed() -> bool {
    !load(&HANDSHAKE_DELAY_US).is_zero()
}
