//! The publisher's control server: accepting subscribers on its Unix socket, the
//! publisher's side of the handshake, and each connection's requests (FDs, releases,
//! `Leave`) until it ends.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::watch::{Watcher, hold_until_exit};
use super::{Ready, Shared, inc};
use crate::ipc::{ControlConn, ControlListener, RecvError, Watch};
use crate::locality::{Serve, serves};
use crate::medium::PubMedium;
use crate::pool::HolderId;
use crate::protocol::{self, Reply, Request};
use crate::sync::Unpoisoned;

/// Serves control connections until stopped; one thread per connection (and one
/// [`Watcher`] of the subscriber's lifeline).
///
/// The thread that accepts a connection serves it: one acceptor waits in `accept` at a
/// time, and once it has a connection this thread starts the next acceptor while it
/// handshakes. A joining subscriber's handshake therefore waits neither for a thread to
/// be created nor for a handover between threads (each costs about 100 µs of the first
/// message's latency on a busy or virtualised host).
pub(super) fn serve(sh: Arc<Shared>, listener: ControlListener) {
    let listener = Arc::new(listener);
    let (accepted_tx, accepted) = mpsc::channel::<()>();
    let mut workers: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while !sh.stop.load(Ordering::Relaxed) {
        let (s2, l2, tx) = (Arc::clone(&sh), Arc::clone(&listener), accepted_tx.clone());
        match std::thread::Builder::new().name("zcs-pub-conn".into()).spawn(move || accept_and_serve(&s2, &l2, &tx)) {
            Ok(t) => workers.push(t),
            Err(e) => {
                tracing::error!(error = %crate::error::Chain(&e), "cannot spawn a control connection thread");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        // Until that acceptor has its connection (or we stop).
        while !sh.stop.load(Ordering::Relaxed) {
            match accepted.recv_timeout(Duration::from_millis(50)) {
                Err(mpsc::RecvTimeoutError::Timeout) => workers.retain(|t| !t.is_finished()),
                // Disconnected cannot happen: we hold a sender.
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        workers.retain(|t| !t.is_finished());
    }
    for t in workers {
        let _ = t.join();
    }
}

/// Accepts one connection (or gives up once stopped), says so, and serves it.
fn accept_and_serve(sh: &Arc<Shared>, listener: &ControlListener, accepted: &mpsc::Sender<()>) {
    while !sh.stop.load(Ordering::Relaxed) {
        match listener.accept_timeout(Duration::from_millis(50)) {
            Ok(conn) => {
                crate::step!("publisher: connection accepted");
                let _ = accepted.send(());
                return connection(Arc::clone(sh), conn);
            }
            Err(crate::ipc::AcceptError::Timeout(_)) => {}
            Err(e) => {
                tracing::debug!(error = %crate::error::Chain(&e), "accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

pub(super) fn send_reply(conn: &ControlConn, r: &Reply, fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
    match conn.send(&protocol::encode(r), fds) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %crate::error::Chain(&e), "control send failed");
            false
        }
    }
}

/// Why no request came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoRequest {
    Timeout,
    /// The connection ended (closed, shut down or failed).
    Ended,
    /// The peer broke the frame rules or sent something undecodable.
    Violation,
}

fn recv_request(sh: &Shared, conn: &ControlConn, timeout: Duration) -> Result<Request, NoRequest> {
    recv_request_with_fds(sh, conn, timeout).map(|(r, _)| r)
}

/// A request and the descriptors that came with it.
fn recv_request_with_fds(
    sh: &Shared,
    conn: &ControlConn,
    timeout: Duration,
) -> Result<(Request, Vec<std::os::fd::OwnedFd>), NoRequest> {
    match conn.recv(timeout) {
        Ok(frame) => match protocol::decode::<Request>("control request", &frame.bytes) {
            Ok(r) => Ok((r, frame.fds)),
            Err(e) => {
                sh.bad_input.warn("malformed control request; closing the connection", &e);
                Err(NoRequest::Violation)
            }
        },
        Err(RecvError::Timeout(_)) => Err(NoRequest::Timeout),
        Err(e @ (RecvError::Closed | RecvError::Sys { .. })) => {
            tracing::debug!(error = %crate::error::Chain(&e), "control connection ended");
            Err(NoRequest::Ended)
        }
        Err(e) => {
            sh.bad_input.warn("control frame against the rules; closing the connection", &e);
            Err(NoRequest::Violation)
        }
    }
}

/// One subscriber connection: handshake, then FD requests and releases until it ends.
pub(super) fn connection(sh: Arc<Shared>, conn: ControlConn) {
    let conn = Arc::new(conn);
    let c = &sh.counters;
    let peer = conn.peer_cred();
    let holder = sh.next_holder.fetch_add(1, Ordering::Relaxed);
    let fail = |why: &str| {
        inc(&c.handshake_failures);
        tracing::debug!(pid = peer.pid, uid = peer.uid, why, "handshake failed");
        let _ = send_reply(&conn, &Reply::Refused { reason: why.into() }, &[]);
    };
    let (subscriber, lifeline, serve) = match recv_request_with_fds(&sh, &conn, sh.handshake_timeout) {
        Ok((Request::Hello { subscriber, group, lifeline, handles }, mut fds))
            if serves(&sh.group, &group).is_some() =>
        {
            if fds.len() != usize::from(lifeline) {
                return fail("a Hello carries its lifeline's descriptor and nothing else");
            }
            if handles & protocol::HANDLES == 0 {
                return fail(&format!(
                    "no block handle type in common (the subscriber imports {handles:#04x}, this publisher exports {:#04x})",
                    protocol::HANDLES
                ));
            }
            (subscriber, fds.pop(), serves(&sh.group, &group))
        }
        Ok((Request::Hello { .. }, _)) => return fail("different locality group"),
        Ok(_) => return fail("expected Hello"),
        Err(_) => return fail("no Hello"),
    };
    crate::step!("publisher: Hello received");
    // Checked here, so that a bad lifeline is refused at the Hello; watched only once
    // leases can exist (after Ready), keeping a thread start off the join's path.
    let lifeline = match lifeline.map(Watch::new).transpose() {
        Ok(w) => w,
        Err(e) => return fail(&format!("lifeline refused: {e}")),
    };
    // A host-memory subscriber of ours imports a host probe and is served host blocks
    // (never lent: no provider); the others, our probe and our blocks.
    let host = serve == Some(Serve::HostBlocks);
    let lane = match host.then(|| sh.host_lane()).transpose() {
        Ok(lane) => lane,
        Err(why) => return fail(&why),
    };
    let (probe_fd, probe_size, probe_token) = match (&sh.medium, &sh.probe, lane) {
        (_, _, Some(lane)) => (lane.probe().fd(), lane.probe().size(), lane.probe_token),
        (PubMedium::Cuda { signals, .. }, _, None) => (signals.fd().expect("our own signal block"), signals.size(), 0),
        (PubMedium::Host { .. }, Some(p), None) => (p.fd(), p.size(), sh.probe_token),
        (PubMedium::Host { .. }, None, None) => unreachable!("host publishers always have a probe"),
    };
    let welcome = Reply::Welcome {
        publisher: sh.instance,
        holder,
        capability_key: sh.medium.pool().capability_key().to_bytes(),
        probe_size: probe_size as u64,
        probe_token,
        provider: if host { None } else { sh.provider.clone() },
        handles: protocol::HANDLES,
    };
    if !send_reply(&conn, &welcome, &[probe_fd.as_fd()]) {
        return fail("send Welcome");
    }
    match recv_request(&sh, &conn, sh.handshake_timeout) {
        Ok(Request::Ack { token: Some(t), .. })
            if (matches!(sh.medium, PubMedium::Cuda { .. }) && !host) || t == probe_token => {}
        Ok(Request::Ack { error, .. }) => return fail(&format!("probe import failed: {}", error.unwrap_or_default())),
        _ => return fail("expected Ack"),
    }
    crate::step!("publisher: Ack received");
    // Routing starts here: `Ready` names the first message routed over this connection
    // and goes out with the state locked, so no put can slip in between.
    {
        let mut st = sh.state.locked();
        let ready = Reply::Ready { first_seq: st.seq + 1, bytes_through: st.bytes_through(subscriber) };
        if !send_reply(&conn, &ready, &[]) {
            drop(st);
            return fail("send Ready");
        }
        let r = Ready { subscriber, conn: Arc::clone(&conn), lease_stalled: false, fds_sent: HashMap::new(), host };
        st.ready.insert(holder, r);
    }
    crate::step!("publisher: Ready sent, routing");
    // From here on the subscriber's death ends this connection at once, not when the
    // kernel closes its end (a word already released is seen at the first look).
    let watcher = lifeline.and_then(|w| Watcher::spawn(w, &conn, &sh));
    inc(&c.handshakes);
    tracing::debug!(pid = peer.pid, subscriber = %crate::Id(subscriber), holder, host, "subscriber is GPU-ready");
    // The peer broke the protocol: it is cut off and its leases go at once.
    let mut violation = false;
    loop {
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        match recv_request(&sh, &conn, Duration::from_millis(100)) {
            Ok(Request::Fd { block, capability }) => {
                if !super::fd::answer_request(&sh, &conn, holder, host, block, capability) {
                    break;
                }
            }
            Ok(Request::Release { blocks }) => {
                for b in blocks {
                    if let Err(e) = sh.release(host, b, HolderId::new(holder)) {
                        inc(&c.bad_releases);
                        sh.bad_input.warn("release of a block not leased to this subscriber", &e);
                    }
                }
            }
            Ok(Request::Leave) => {
                // Routing ends here: `Left` is the last routed frame. Leases still held
                // stay until released or until the connection ends.
                let mut st = sh.state.locked();
                st.ready.remove(&holder);
                // A host-memory subscriber's frames may still wait in the lane: its
                // `Left` goes after them.
                if let Some(lane) = lane {
                    lane.send_left(Arc::clone(&conn));
                } else if !send_reply(&conn, &Reply::Left, &[]) {
                    break;
                }
            }
            Ok(other) => {
                sh.bad_input.warn("unexpected control request; closing", &format!("{other:?}"));
                violation = true;
                break;
            }
            Err(NoRequest::Timeout) => {}
            Err(NoRequest::Ended) => break,
            Err(NoRequest::Violation) => {
                violation = true;
                break;
            }
        }
    }
    sh.state.locked().ready.remove(&holder);
    let died = watcher.as_ref().is_some_and(Watcher::died);
    if !violation && !died {
        hold_until_exit(&sh, holder, &conn);
    }
    let dropped = sh.release_holder(HolderId::new(holder));
    drop(watcher);
    inc(&c.disconnects);
    tracing::debug!(subscriber = %crate::Id(subscriber), dropped, died, "subscriber connection closed; its leases are released");
}
