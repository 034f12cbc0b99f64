//! Where a block's file descriptor leaves the publisher: with a connection's first
//! descriptor of the block (our own blocks; a lent one is opened at the provider), which
//! spares the subscriber a round trip before its first read of it, or when a subscriber
//! asks with `Fd` (an import that failed, a cache it cleared). Either way only to a
//! connection that holds a lease on the block, checked by the pool's handout.

use std::sync::Arc;

use super::server::send_reply;
use super::{Ready, Shared, inc};
use crate::ipc::ControlConn;
use crate::pool::BlockKey;
use crate::protocol::Reply;
use crate::sync::Unpoisoned;

impl Ready {
    /// Whether this connection gets `block`'s FD with the descriptor about to go out:
    /// the first descriptor of this allocation of the block. Marked before the send (a
    /// failed send drops the whole connection's entry).
    pub(super) fn first_descriptor_of(&mut self, block: BlockKey) -> bool {
        self.fds_sent.insert(block.id, block.alloc) != Some(block.alloc)
    }
}

/// Answers a subscriber's `Fd` request on `conn` (holder `holder`, served host blocks
/// if `host`): the FD if the pool of its blocks hands it out, `FdDenied` with the reason
/// otherwise. False when the connection must end (the answer could not be sent while
/// the subscriber is still routed to).
pub(super) fn answer_request(
    sh: &Arc<Shared>,
    conn: &ControlConn,
    holder: u64,
    host: bool,
    block: BlockKey,
    capability: u64,
) -> bool {
    let c = &sh.counters;
    let mut replied = false;
    let mut send = |fd: std::os::fd::BorrowedFd<'_>, size: usize| {
        replied = send_reply(conn, &Reply::Fd { block, size: size as u64 }, &[fd]);
    };
    let sent = match sh.pool(host) {
        Some(pool) => pool.with_handout(block, capability, &mut send).map(|()| replied),
        None => Err(crate::pool::StaleError::NotHeld { id: block.id, holder }),
    };
    // After a slow disconnect our side no longer sends (SHUT_WR): a request it still
    // makes cannot be answered, and must not end the connection, whose leases stay until
    // the subscriber releases them or closes.
    let disconnected = || !sh.state.locked().ready.contains_key(&holder);
    match sent {
        Ok(true) => {
            inc(&c.fd_handouts);
            true
        }
        Ok(false) => disconnected(),
        Err(e) => {
            inc(&c.fd_denied);
            sh.bad_input.warn("FD request denied", &e);
            send_reply(conn, &Reply::FdDenied { block, reason: crate::error::chain(&e) }, &[]) || disconnected()
        }
    }
}
