//! A subscriber's death noticed: its lifeline watched while its connection is served,
//! and, after the connection ends, its leases held until its process has exited.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Shared, inc};
use crate::ipc::{ControlConn, Watch};
use crate::pool::HolderId;

/// Watches a subscriber's lifeline for as long as its connection is served: the
/// process's death shuts the connection down (the connection thread then ends it and
/// releases its leases). Dropping it stops and joins the thread (woken at once).
pub(super) struct Watcher {
    watch: Arc<Watch>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// `None` if no thread can be started: the connection's end then tells the death.
    pub(super) fn spawn(watch: Watch, conn: &Arc<ControlConn>, sh: &Arc<Shared>) -> Option<Self> {
        let (watch, stop) = (Arc::new(watch), Arc::new(AtomicBool::new(false)));
        let (w, s, conn, sh) = (Arc::clone(&watch), Arc::clone(&stop), Arc::clone(conn), Arc::clone(sh));
        let thread = std::thread::Builder::new().name("zcs-pub-life".into()).spawn(move || match w.wait(&s) {
            Ok(true) => {
                inc(&sh.counters.lifeline_deaths);
                tracing::debug!(pid = conn.peer_cred().pid, "a subscriber's process died; ending its connection");
                conn.shutdown();
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "cannot wait on a subscriber's lifeline; its connection's end will tell")
            }
        });
        match thread {
            Ok(t) => Some(Self { watch, stop, thread: Some(t) }),
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "cannot start a lifeline watcher; the connection's end will tell");
                None
            }
        }
    }

    pub(super) fn died(&self) -> bool {
        self.watch.died()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.watch.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long a connection that ended with leases waits for its process's exit before it
/// counts the process as running on: a dying process closes its descriptors a moment
/// before the kernel reports its exit.
const EXIT_GRACE: Duration = Duration::from_millis(50);

/// A connection ended with leases outstanding. Normally its process died (its
/// descriptors close as it exits). If that process still runs, it may still map those
/// blocks and read samples of them (it shut its end of the connection by mistake, or
/// our answer to its `Fd` request could not be sent): releasing them would let the pool
/// hand them out under its reads. They stay leased until it exits or this publisher
/// closes (G14). Not called for a peer that broke the protocol (cut off, its leases
/// released at once) or whose lifeline told its death, nor where the peer's process
/// cannot be watched (another PID namespace, or already gone: released at once).
pub(super) fn hold_until_exit(sh: &Shared, holder: u64, conn: &ControlConn) {
    let holds = sh.holds(HolderId::new(holder));
    if holds == 0 || sh.stop.load(Ordering::Relaxed) {
        return;
    }
    // Opened only now (no descriptor per connection). The kernel's pidfd names the
    // process that connected even after its death; the fallback opens its pid, which a
    // process that just died cannot have passed on yet (it fails: gone).
    let Some(p) = conn.peer_process() else { return };
    if p.wait_exit(EXIT_GRACE) != Ok(false) {
        return;
    }
    let peer = conn.peer_cred();
    inc(&sh.counters.held_until_exit);
    sh.bad_input.warn(
        "a subscriber process closed its control connection while holding leases and runs on; \
         its blocks stay leased until it exits",
        &format_args!("pid {} uid {}, {holds} blocks", peer.pid, peer.uid),
    );
    // Each turn blocks in poll(2) on the pidfd for up to 100 ms; a pidfd that cannot be
    // polled ends the wait (the leases go, as without a pidfd).
    while !sh.stop.load(Ordering::Relaxed) {
        match p.wait_exit(Duration::from_millis(100)) {
            Ok(false) => {}
            Ok(true) => break,
            Err(e) => {
                tracing::warn!(pid = peer.pid, error = %crate::error::Chain(&e), "cannot watch a subscriber's process; releasing its leases");
                break;
            }
        }
    }
}
