//! One link per publisher: the thread that handshakes and then receives what the
//! publisher routes over the control connection (blocks, inline messages, `ViaBytes`
//! notices), reconnecting while the publisher stays; releases go back over it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::delivery::Body;
use super::discovery::{forget, forgotten};
use super::handshake::{handshake, hello};
use super::import::{ImportCache, on_block};
use super::order::{Order, deliver_routed, on_via_bytes};
use super::ready::PublisherSignals;
use super::spin::SpinWindow;
use super::{Shared, inc};
use crate::ipc::{ControlConn, Frame, RecvError};
use crate::pool::BlockKey;
use crate::pool::CapabilityKey;
use crate::protocol::{self, Reply, Request, Token};
use crate::sample::{Path, SampleInfo};
use crate::sync::Unpoisoned;

/// How long a closing subscriber's link thread waits for the publisher's `Left`.
pub(super) const LEAVE_WAIT: Duration = Duration::from_secs(1);

/// A handshaken connection to one publisher, and the blocks imported from it. Its
/// link thread alone receives on the connection; sends are atomic frames and may come
/// from any thread (releases, `Leave`).
pub(crate) struct Link {
    pub(super) conn: ControlConn,
    /// The publisher's instance id.
    pub(super) publisher: u64,
    /// The publisher's key (what its samples carry).
    pub(super) key: String,
    /// The publisher's blocks live on another GPU of this host, mapped here for ours.
    pub(super) peer: bool,
    /// The publisher's blocks live on a GPU and this subscriber maps host memory: it is
    /// served host-memory copies of them.
    pub(super) host_blocks: bool,
    /// The first message routed over this link (`Reply::Ready`).
    pub(super) first_seq: u64,
    /// The last earlier message the publisher put as bytes for this subscriber
    /// (`Reply::Ready`; below `first_seq`).
    pub(super) bytes_through: u64,
    /// Its publisher's delivery order (shared with the publisher's entry).
    pub(super) order: Arc<Order>,
    pub(super) cap_key: CapabilityKey,
    /// The publisher's ready signals as our reads wait on them.
    pub(crate) signals: PublisherSignals,
    /// The blocks imported from the publisher.
    pub(super) imports: ImportCache,
    pub(super) alive: AtomicBool,
    /// The publisher's liveliness token vanished while this link was open: the Zenoh
    /// route between us is down (a router between us died), not the publisher, which
    /// keeps serving us here. Cleared when the token comes back; if the link ends
    /// first, its end forgets the publisher (`link_thread`).
    pub(super) token_gone: AtomicBool,
    /// The host provider the publisher's lent blocks are opened at.
    pub(super) provider: Option<Arc<crate::provider::ProviderClient>>,
}

impl Link {
    /// Sends a release, also on a link that ended: a publisher that disconnected us as
    /// slow still reads them (it keeps our leases until we release them or close);
    /// one that died or closed does not, and the send fails harmlessly.
    pub(crate) fn release(&self, key: BlockKey) {
        let msg = protocol::encode(&Request::Release { blocks: vec![key] });
        if let Err(e) = self.conn.send(&msg, &[]) {
            tracing::debug!(error = %crate::error::Chain(&e), "release not sent (publisher gone?)");
        }
    }
}

/// Handshakes with a publisher (on `opened`, a connection that said Hello, if given)
/// and runs the link until it ends; handshakes again (with back-off) if the publisher
/// ended a link while it is still there.
pub(super) fn link_thread(sh: &Arc<Shared>, t: &Token, socket: &str, mut opened: Option<ControlConn>) {
    #[cfg(feature = "fault-injection")]
    crate::fault::delay_handshake();
    let mut backoff = Duration::from_millis(20);
    loop {
        let conn = match opened.take() {
            Some(c) => Ok(c),
            None => hello(sh, socket, &t.group, sh.handshake_timeout),
        };
        let link = match conn.and_then(|c| handshake(sh, c, t)) {
            Ok(link) => link,
            Err(e) => {
                let why = crate::error::chain(&e);
                tracing::info!(publisher = %crate::Id(t.instance), why, "no zero-copy path to this publisher; receiving bytes");
                // The reason is in place before the failure is counted: whoever sees the
                // count can read why.
                let mut st = sh.state.locked();
                if let Some(e) = st.pubs.get_mut(&t.instance) {
                    e.why = Some(format!("handshake failed: {why}"));
                }
                inc(&sh.counters.handshake_failures);
                return;
            }
        };
        inc(&sh.counters.handshakes);
        let end = run_link(sh, &link);
        // The ended link stays in the publisher's entry, marked dead, until a new
        // handshake replaces it or the publisher's token vanishes, which evicts its
        // imports and, if the process died, releases streams waiting on its signals.
        // If the token vanished while the link was open, the publisher goes now.
        link.alive.store(false, Ordering::Relaxed);
        let (still_there, gone) = {
            let mut o = link.order.lock();
            let mut st = sh.state.locked();
            let entry = st.pubs.get(&link.publisher);
            if entry.and_then(|e| e.link.as_ref()).is_some_and(|l| Arc::ptr_eq(l, &link)) {
                // From here on, bytes are delivered as they arrive.
                o.restart(None);
            }
            let still_there = entry.is_some();
            // Its token vanished while the link was open; with the link gone too,
            // nothing says the publisher is there any more.
            let gone =
                (still_there && link.token_gone.load(Ordering::Relaxed)).then(|| forget(&mut st, link.publisher));
            (still_there && gone.is_none(), gone)
        };
        if let Some((ended, none_left)) = gone {
            forgotten(sh, link.publisher, ended, none_left);
            return;
        }
        if sh.closed.load(Ordering::Relaxed) || !still_there || !matches!(end, LinkEnd::Dropped) {
            return;
        }
        tracing::info!(publisher = %crate::Id(t.instance), "zero-copy link ended by the publisher; receiving bytes, reconnecting");
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Why a link thread stopped.
enum LinkEnd {
    /// We are closing (the publisher said `Left`, or did not in time).
    Closed,
    /// The connection ended (the publisher died, closed, or dropped us as slow).
    Dropped,
    /// The publisher broke the protocol; no new handshake.
    Violation,
}

/// Waits up to 100 ms for the link's next frame, polling first for as long as `spin`
/// says, and adapts `spin` to the wait.
fn recv_adapting(sh: &Shared, link: &Link, spin: &SpinWindow) -> Result<Frame, RecvError> {
    let (window, t) = (spin.get(), Instant::now());
    let got = link.conn.recv_spinning(Duration::from_millis(100), window);
    sh.count_polled(spin.waited(window, t.elapsed(), got.is_ok()));
    got
}

/// Receives and delivers what the publisher routes over the link, in order.
fn run_link(sh: &Arc<Shared>, link: &Arc<Link>) -> LinkEnd {
    let mut backlog: VecDeque<Frame> = VecDeque::new();
    let mut leaving: Option<Instant> = None;
    let spin = SpinWindow::new(sh.spin_max);
    loop {
        if leaving.is_none() && sh.closed.load(Ordering::Relaxed) {
            leaving = Some(Instant::now());
        }
        if leaving.is_some_and(|t| t.elapsed() > LEAVE_WAIT) {
            return LinkEnd::Closed;
        }
        let mut frame = match backlog.pop_front() {
            Some(f) => f,
            None => match recv_adapting(sh, link, &spin) {
                Ok(f) => f,
                Err(RecvError::Timeout(_)) => continue,
                Err(e) => {
                    tracing::debug!(error = %crate::error::Chain(&e), publisher = %crate::Id(link.publisher), "link ended");
                    return if leaving.is_some() { LinkEnd::Closed } else { LinkEnd::Dropped };
                }
            },
        };
        let reply = match protocol::decode::<Reply>("control frame", &frame.bytes) {
            Ok(r) => r,
            Err(e) => {
                inc(&sh.counters.bad_descriptors);
                sh.bad_input.warn("malformed frame from a publisher; closing the link", &e);
                link.conn.shutdown();
                return LinkEnd::Violation;
            }
        };
        match reply {
            Reply::Block(d) if leaving.is_some() => link.release(d.block),
            // The publisher sends a block's FD with the first descriptor of it.
            Reply::Block(d) => on_block(sh, link, &mut backlog, d, frame.fds.pop()),
            Reply::Inline { .. } | Reply::ViaBytes { .. } if leaving.is_some() => {}
            Reply::Inline { seq, timestamp_ns, meta, data } => {
                let info = SampleInfo {
                    key: link.key.clone(),
                    publisher: link.publisher,
                    seq,
                    timestamp_ns,
                    path: Path::Inline,
                    meta,
                };
                let sample = sh.sample(info, Body::Bytes(data.into()));
                deliver_routed(sh, link, sample, &sh.counters.inline);
            }
            Reply::ViaBytes { seq } => on_via_bytes(sh, link, seq),
            Reply::Left => return LinkEnd::Closed,
            other => {
                inc(&sh.counters.bad_descriptors);
                sh.bad_input.warn("unexpected frame from a publisher; closing the link", &format!("{other:?}"));
                link.conn.shutdown();
                return LinkEnd::Violation;
            }
        }
    }
}
