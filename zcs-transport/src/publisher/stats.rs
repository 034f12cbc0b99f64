//! A publisher's counters: live atomics its threads bump, read as [`PublisherStats`];
//! and who holds its blocks ([`BlockHolder`]), to name a subscriber that holds it back.

use std::sync::atomic::{AtomicU64, Ordering};

use super::PublisherCore;
use crate::pool::HolderId;

/// A subscriber on the zero-copy path, as its publisher sees it now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockHolder {
    /// The subscriber's instance id (its token's).
    pub subscriber: u64,
    /// Its process id (0 where its process is not visible from this PID namespace).
    pub pid: i32,
    /// Blocks it holds: samples it has not released yet, queued or held by its
    /// application. A publisher whose pool runs dry waits for these.
    pub holds: usize,
    /// It kept its lease limit through a whole wait: it is served bytes at its limit,
    /// without waiting, until it has released half of what it holds.
    pub at_limit: bool,
}

impl PublisherCore {
    /// The subscribers on the zero-copy path and what each holds, most first.
    pub fn holders(&self) -> Vec<BlockHolder> {
        let sh = &self.shared;
        let mut out: Vec<BlockHolder> = (self.state().ready.iter())
            .map(|(&h, r)| BlockHolder {
                subscriber: r.subscriber,
                pid: r.conn.peer_cred().pid,
                holds: sh.pool(r.host).map_or(0, |p| p.holds(HolderId::new(h))),
                at_limit: r.lease_stalled,
            })
            .collect();
        out.sort_by_key(|b| std::cmp::Reverse(b.holds));
        out
    }
}

/// Counters of one publisher. All monotonic.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PublisherStats {
    /// Messages published.
    pub messages: u64,
    /// Messages sent inline (below the threshold, no block).
    pub inline: u64,
    /// Messages announced by descriptor (sent to every subscriber charged a lease).
    pub descriptors: u64,
    /// Leases charged to GPU-ready subscribers.
    pub leases: u64,
    /// Device→host (or block→bytes) copies made for subscribers that needed bytes.
    pub copies_out: u64,
    /// Bytes copied out.
    pub copied_bytes: u64,
    /// Of `copies_out`, those that went into a Zenoh shared-memory buffer
    /// (`zenoh_shm_out_bytes`); the others went through pinned staging.
    pub shm_out: u64,
    /// Messages copied device→host into a host block, shared by this host's
    /// subscribers that do not map this GPU's memory (processes without CUDA, and GPUs
    /// without peer access to this one).
    pub host_blocks: u64,
    /// Leases on host blocks charged to those subscribers.
    pub host_leases: u64,
    /// Puts of bytes on the plain key, counted when `put` decides them (a failure is
    /// returned by `put` or, once it has returned, counted in `late_failures`).
    pub plain_puts: u64,
    /// Puts of bytes on `<key>/@zcs/b` for GPU-aware subscribers off the zero-copy path,
    /// counted likewise.
    pub aware_bytes_puts: u64,
    /// Leases refused by a subscriber's lease limit (it got bytes instead): at once
    /// with congestion `drop`, after waiting `lease_wait_ms` with `block`.
    pub lease_limited: u64,
    /// Puts that waited for a subscriber at its lease limit to release a block
    /// (congestion `block`).
    pub lease_waits: u64,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes refused or failed.
    pub handshake_failures: u64,
    /// FDs handed out on request.
    pub fd_handouts: u64,
    /// FDs sent along with a block's first descriptor on a connection (no request
    /// needed: the subscriber imports on the first frame it sees).
    pub fds_pushed: u64,
    /// FD requests denied (stale or wrong capability).
    pub fd_denied: u64,
    /// Releases that named nothing we lease (stale, duplicate or forged).
    pub bad_releases: u64,
    /// Control connections that ended (each releases every lease it held, at once or,
    /// see `held_until_exit`, when its process exits).
    pub disconnects: u64,
    /// Subscribers disconnected because their control socket stayed full for
    /// `PUSH_TIMEOUT` (1 s) or failed.
    pub slow_disconnects: u64,
    /// Connections that ended, not for breaking the protocol, while their subscriber's
    /// process, still running, held leases: those blocks stay leased until that process
    /// exits, since it may still read them.
    pub held_until_exit: u64,
    /// Subscriber processes whose death their lifeline reported: each connection of
    /// theirs was ended (and its leases released) at once, before the kernel closed it.
    pub lifeline_deaths: u64,
    /// Messages whose bytes were lost after `put` had returned: a CUDA publisher's copy
    /// out, or Zenoh's put of it, failed in its bytes lane (each failure is logged).
    /// Their subscribers that needed bytes never get them.
    pub late_failures: u64,
    /// Messages put as bytes although larger than Zenoh's largest message
    /// (`transport/link/rx/max_message_size` of this session's configuration, 1 GiB by
    /// default): a receiver with that limit drops such a message without a word, so it
    /// is counted and logged here.
    pub oversized_bytes: u64,
}

/// The live counters, shared by the publisher's threads.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) messages: AtomicU64,
    pub(super) inline: AtomicU64,
    pub(super) descriptors: AtomicU64,
    pub(super) leases: AtomicU64,
    pub(super) copies_out: AtomicU64,
    pub(super) copied_bytes: AtomicU64,
    pub(super) shm_out: AtomicU64,
    pub(super) host_blocks: AtomicU64,
    pub(super) host_leases: AtomicU64,
    pub(super) plain_puts: AtomicU64,
    pub(super) aware_bytes_puts: AtomicU64,
    pub(super) lease_limited: AtomicU64,
    pub(super) lease_waits: AtomicU64,
    pub(super) handshakes: AtomicU64,
    pub(super) handshake_failures: AtomicU64,
    pub(super) fd_handouts: AtomicU64,
    pub(super) fds_pushed: AtomicU64,
    pub(super) fd_denied: AtomicU64,
    pub(super) bad_releases: AtomicU64,
    pub(super) disconnects: AtomicU64,
    pub(super) slow_disconnects: AtomicU64,
    pub(super) held_until_exit: AtomicU64,
    pub(super) lifeline_deaths: AtomicU64,
    pub(super) oversized_bytes: AtomicU64,
    pub(super) late_failures: AtomicU64,
}

/// One more.
pub(super) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// What the counters read now.
    pub(super) fn snapshot(&self) -> PublisherStats {
        let c = self;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PublisherStats {
            messages: l(&c.messages),
            inline: l(&c.inline),
            descriptors: l(&c.descriptors),
            leases: l(&c.leases),
            copies_out: l(&c.copies_out),
            copied_bytes: l(&c.copied_bytes),
            shm_out: l(&c.shm_out),
            host_blocks: l(&c.host_blocks),
            host_leases: l(&c.host_leases),
            plain_puts: l(&c.plain_puts),
            aware_bytes_puts: l(&c.aware_bytes_puts),
            lease_limited: l(&c.lease_limited),
            lease_waits: l(&c.lease_waits),
            handshakes: l(&c.handshakes),
            handshake_failures: l(&c.handshake_failures),
            fd_handouts: l(&c.fd_handouts),
            fds_pushed: l(&c.fds_pushed),
            fd_denied: l(&c.fd_denied),
            bad_releases: l(&c.bad_releases),
            disconnects: l(&c.disconnects),
            slow_disconnects: l(&c.slow_disconnects),
            held_until_exit: l(&c.held_until_exit),
            lifeline_deaths: l(&c.lifeline_deaths),
            oversized_bytes: l(&c.oversized_bytes),
            late_failures: l(&c.late_failures),
        }
    }
}
