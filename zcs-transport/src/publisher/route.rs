//! Each put routed to every subscriber by the cheapest path it can take: a descriptor
//! (its lease charged first), the whole message inline, or a `ViaBytes` notice over
//! each ready connection, and bytes through Zenoh only where someone needs them; the
//! device→host copy made once.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use zenoh::bytes::ZBytes;

use super::bytes_lane::{Job, Payload};
use super::host_lane::HostLane;
use super::{Counters, PublisherCore, PutError, PutReport, State, inc};
use crate::medium::{CopyOut, PubMedium, PublishedAny};
use crate::now_ns;
use crate::pool::{HolderId, LeaseError};
use crate::protocol::{self, BytesHeader, Descriptor, Reply};

/// What a message of bytes carries besides its payload on the wire, at most: our
/// attachment, the key and Zenoh's headers (a margin, not an exact count).
const MESSAGE_OVERHEAD: usize = 4096;

/// From this size on, bytes a host publisher copied out are put by its bytes lane: a
/// thread hop (microseconds) buys the overlap of the next message's copy with this
/// one's put. Smaller ones are put at once while the lane is idle. A CUDA publisher's
/// copies out always go through the lane, which waits for them off the put's path.
const LANE_MIN_BYTES: usize = 256 * 1024;

/// How long a put waits for room in a subscriber's control socket. A subscriber that
/// has not read for this long (its handler is full) is disconnected: nothing more is
/// routed to it (it receives bytes, and it handshakes again on a new connection), but
/// the leases of that connection stay until the subscriber releases them or closes it,
/// so no block is reused under samples it holds or has queued (gap G14). One slow
/// reader never stalls the publisher for longer than this.
pub(super) const PUSH_TIMEOUT: Duration = Duration::from_secs(1);

impl State {
    /// Sends `frame` to ready holder `h`; on failure stops routing to it, ends the
    /// stream it reads (it then reconnects) and returns false. Its connection thread
    /// keeps taking its releases, and releases the rest when the subscriber closes.
    pub(super) fn push(&mut self, h: u64, frame: &[u8], c: &Counters) -> bool {
        self.push_with(h, frame, &[], c)
    }

    pub(super) fn push_with(&mut self, h: u64, frame: &[u8], fds: &[BorrowedFd<'_>], c: &Counters) -> bool {
        let Some(r) = self.ready.get(&h) else { return false };
        match r.conn.send_timeout(frame, fds, PUSH_TIMEOUT) {
            Ok(()) => true,
            Err(e) => {
                let subscriber = crate::Id(r.subscriber);
                tracing::warn!(%subscriber, error = %crate::error::Chain(&e), "subscriber not reading its control socket; disconnecting it");
                r.conn.shutdown_write();
                self.ready.remove(&h);
                inc(&c.slow_disconnects);
                false
            }
        }
    }

    /// The ready holders: those sent frames directly, and the host-memory subscribers
    /// whose frames go through the host lane.
    fn holders(&self) -> (Vec<u64>, Vec<u64>) {
        let (mut direct, mut host) = (Vec::with_capacity(self.ready.len()), Vec::new());
        for (&h, r) in &self.ready {
            if r.host { host.push(h) } else { direct.push(h) }
        }
        (direct, host)
    }

    /// Whether a GPU-aware subscriber is off the zero-copy path (needs bytes).
    fn aware_needs_bytes(&self) -> bool {
        self.aware.keys().any(|i| !self.ready.values().any(|r| r.subscriber == *i))
    }
}

impl PublisherCore {
    /// Puts bytes that need no copy: through the bytes lane when `lane` says so or while
    /// it holds messages (they keep their order behind those), else at once.
    fn put_bytes(
        &self,
        bytes: ZBytes,
        header: BytesHeader,
        (to_aware, to_plain): (bool, bool),
        lane: bool,
    ) -> Result<(), PutError> {
        if !(to_aware || to_plain) {
            return Ok(());
        }
        self.count_puts(to_aware, to_plain);
        if lane || self.lane.busy() {
            self.lane.send(Job { payload: Payload::Ready(bytes), header, to_aware, to_plain });
            return Ok(());
        }
        self.out.put(bytes, &header, to_aware, to_plain)
    }

    /// Counts a message's puts of bytes when they are decided (the lane may make them
    /// after `put` has returned).
    fn count_puts(&self, to_aware: bool, to_plain: bool) {
        let c = &self.shared.counters;
        if to_aware {
            inc(&c.aware_bytes_puts);
        }
        if to_plain {
            inc(&c.plain_puts);
        }
    }

    /// Publishes small host bytes inline: carried whole over the control connection of
    /// every GPU-ready subscriber (when the frame fits), as bytes through Zenoh to
    /// everyone else.
    pub fn put_inline(&self, data: Vec<u8>, meta: protocol::Meta) -> Result<PutReport, PutError> {
        let sh = &self.shared;
        let c = &sh.counters;
        let ts = now_ns();
        let (seq, to_aware, data, meta) = {
            let mut st = self.state();
            st.seq += 1;
            let seq = st.seq;
            let mut to_aware = st.aware_needs_bytes();
            let (data, meta) = if st.ready.is_empty() {
                (data, meta)
            } else {
                // Encoded from the message itself, which is taken back for the bytes path.
                let inline = Reply::Inline { seq, timestamp_ns: ts, meta, data };
                let mut frame = protocol::encode(&inline);
                let Reply::Inline { data, meta, .. } = inline else { unreachable!("built just above") };
                if frame.len() > crate::ipc::MAX_FRAME_BYTES {
                    to_aware = true;
                    frame = protocol::encode(&Reply::ViaBytes { seq });
                }
                let (direct, host) = st.holders();
                for h in direct {
                    st.push(h, &frame, c);
                }
                if let (false, Some(lane)) = (host.is_empty(), sh.host_lane.get()) {
                    lane.send_frame(frame, host);
                }
                (data, meta)
            };
            if to_aware {
                st.aware_bytes_seq = seq;
            }
            (seq, to_aware, data, meta)
        };
        inc(&c.messages);
        inc(&c.inline);
        let to_plain = self.plain_matching();
        let tag = sh.medium.pool().capability_key().bytes_tag(sh.instance, seq, data.len() as u64);
        let header = BytesHeader { publisher: sh.instance, seq, timestamp_ns: ts, from_block: false, tag, meta };
        self.put_bytes(data.into(), header, (to_aware, to_plain), false)?;
        Ok(PutReport { seq, zero_copy: 0, copied_out: false, plain: to_plain, aware_bytes: to_aware })
    }

    /// Publishes a written block: a descriptor to every GPU-ready subscriber over its
    /// control connection (its lease charged first), bytes to everyone else, copied out
    /// once and only if someone needs them.
    pub fn put_block(&self, published: PublishedAny, meta: protocol::Meta) -> Result<PutReport, PutError> {
        let sh = &self.shared;
        let c = &sh.counters;
        if !sh.lease_wait.is_zero() {
            self.wait_for_lease_room(&published);
        }
        let ts = now_ns();
        let len = published.len();
        let (seq, zero_copy, aware_need_bytes) = {
            let mut st = self.state();
            st.seq += 1;
            let seq = st.seq;
            let mut aware_need_bytes = st.aware_needs_bytes();
            let mut zero_copy = 0;
            if !st.ready.is_empty() {
                let block = published.key();
                let d = Descriptor {
                    publisher: sh.instance,
                    seq,
                    block,
                    capability: published.capability(),
                    block_size: published.block_size() as u64,
                    offset: 0,
                    len: len as u64,
                    timestamp_ns: ts,
                    meta: meta.clone(),
                    lent: published.lent(),
                };
                let via_bytes = || protocol::encode(&Reply::ViaBytes { seq });
                let (direct, host) = st.holders();
                if !host.is_empty() && !self.route_host_block(&published, &d, host, c) {
                    aware_need_bytes = true;
                }
                let descriptor = protocol::encode(&Reply::Block(d));
                // A block's FD goes with a connection's first descriptor of it (`fd.rs`).
                let own_fd = published.own_fd();
                for h in direct {
                    match published.lease(HolderId::new(h)) {
                        Ok(()) => {
                            let fd =
                                own_fd.filter(|_| st.ready.get_mut(&h).is_some_and(|r| r.first_descriptor_of(block)));
                            if st.push_with(h, &descriptor, fd.as_slice(), c) {
                                zero_copy += 1;
                                if fd.is_some() {
                                    inc(&c.fds_pushed);
                                }
                            } else {
                                // Never sent: nobody will release it.
                                let _ = sh.medium.pool().release(block, HolderId::new(h));
                            }
                        }
                        Err(LeaseError::HolderLimit { .. }) => {
                            inc(&c.lease_limited);
                            aware_need_bytes = true;
                            st.push(h, &via_bytes(), c);
                        }
                        // Its connection is ending: nobody to serve or charge.
                        Err(LeaseError::Departed { .. }) => {}
                    }
                }
            }
            if aware_need_bytes {
                st.aware_bytes_seq = seq;
            }
            (seq, zero_copy, aware_need_bytes)
        };
        inc(&c.messages);
        c.leases.fetch_add(zero_copy as u64, Ordering::Relaxed);
        if zero_copy > 0 {
            inc(&c.descriptors);
        }
        let to_plain = self.plain_matching();
        let copied_out = to_plain || aware_need_bytes;
        if copied_out {
            let copy = sh.medium.copy_out(&published, 0, len, sh.shm_out.as_deref())?;
            let in_shm = match &copy {
                CopyOut::Done(_, in_shm) | CopyOut::Copying(_, in_shm) => *in_shm,
            };
            inc(&c.copies_out);
            if in_shm {
                inc(&c.shm_out);
            }
            c.copied_bytes.fetch_add(len as u64, Ordering::Relaxed);
            let tag = sh.medium.pool().capability_key().bytes_tag(sh.instance, seq, len as u64);
            let header = BytesHeader { publisher: sh.instance, seq, timestamp_ns: ts, from_block: true, tag, meta };
            // A receiver drops a message over its max_message_size and says nothing
            // (Zenoh 1.10.2 logs it at trace level): make it visible here.
            if len.saturating_add(MESSAGE_OVERHEAD) > sh.max_message {
                inc(&c.oversized_bytes);
                sh.bad_input.warn(
                    "a message larger than Zenoh's transport/link/rx/max_message_size goes out as bytes; receivers \
                     with that limit drop it (raise the limit on every peer, or keep its subscribers on a block path)",
                    &format!("{} ({len} bytes, limit {})", sh.key, sh.max_message),
                );
            }
            let to = (aware_need_bytes, to_plain);
            match copy {
                // Copied on the CPU: a large one goes through the lane, so that the copy
                // of the next message overlaps this one's put.
                CopyOut::Done(bytes, _) => self.put_bytes(bytes, header, to, len >= LANE_MIN_BYTES)?,
                CopyOut::Copying(filling, _) => {
                    self.count_puts(to.0, to.1);
                    let payload = Payload::Copying(filling);
                    self.lane.send(Job { payload, header, to_aware: to.0, to_plain: to.1 });
                }
            }
        }
        drop(published);
        Ok(PutReport { seq, zero_copy, copied_out, plain: to_plain, aware_bytes: aware_need_bytes })
    }

    /// Routes a message to the host-memory subscribers `host` (a CUDA publisher's): a
    /// host block loaned, the copy into it enqueued, a lease charged to each, and the
    /// descriptor (`d`, retargeted) queued on the lane for when the copy is done. Those
    /// at their lease limit, or all of them when no host block can be had, are sent
    /// `ViaBytes` in its place: false then (bytes are needed).
    fn route_host_block(&self, published: &PublishedAny, d: &Descriptor, host: Vec<u64>, c: &Counters) -> bool {
        let sh = &self.shared;
        // Host-memory holders are routed to only once the lane is made.
        let (Some(lane), PubMedium::Cuda { signals, .. }) = (sh.host_lane.get(), &sh.medium) else { return false };
        let via_bytes = || protocol::encode(&Reply::ViaBytes { seq: d.seq });
        // Those at their lease limit get bytes without a copy being made for them.
        let limit = lane.pool().config().max_holds_per_holder;
        let (host, limited): (Vec<u64>, Vec<u64>) =
            host.into_iter().partition(|&h| lane.pool().holds(HolderId::new(h)) < limit);
        let mut all_leased = limited.is_empty();
        if !all_leased {
            c.lease_limited.fetch_add(limited.len() as u64, Ordering::Relaxed);
            lane.send_frame(via_bytes(), limited);
        }
        if host.is_empty() {
            return false;
        }
        let (block, done) = match lane.copy(signals, published, published.len()) {
            Ok(x) => x,
            Err(e) => {
                let why = crate::error::chain(&e);
                sh.bad_input.warn("no host block for host-memory subscribers; they get this message as bytes", &why);
                lane.send_frame(via_bytes(), host);
                return false;
            }
        };
        let mut leased = Vec::with_capacity(host.len());
        for h in host {
            // Not expected at the limit: holds only go down outside the state lock.
            match block.lease(HolderId::new(h)) {
                Ok(()) => leased.push(h),
                Err(LeaseError::HolderLimit { .. }) => {
                    inc(&c.lease_limited);
                    all_leased = false;
                    lane.send_frame(via_bytes(), vec![h]);
                }
                Err(LeaseError::Departed { .. }) => {}
            }
        }
        inc(&c.host_blocks);
        c.host_leases.fetch_add(leased.len() as u64, Ordering::Relaxed);
        let descriptor = protocol::encode(&Reply::Block(HostLane::descriptor(&block, d.clone())));
        lane.send_copied(done, block, descriptor, leased);
        all_leased
    }

    /// With congestion `block`, a subscriber at its lease limit slows the publisher as a
    /// full queue does: wait (at most `lease_wait_ms`) for it to release a block rather
    /// than copy this message out for it (a 33 MB frame costs ~10 ms to copy out, the
    /// time of hundreds of zero-copy frames). The wait is outside the state lock, so
    /// releases, handshakes and departures go on meanwhile; a holder still at its limit
    /// afterwards is served bytes by `put_block`.
    ///
    /// Only while that subscriber is the message's one receiver: a wait holds back every
    /// receiver of the put, so beside others (another zero-copy subscriber, bytes
    /// receivers) a subscriber at its limit is served bytes at once and nobody waits
    /// for it (`zcs_stall_bench`).
    fn wait_for_lease_room(&self, published: &PublishedAny) {
        let holders: Vec<(u64, bool)> = {
            let st = self.state();
            if st.ready.len() != 1 || st.aware_needs_bytes() {
                return;
            }
            st.ready.iter().map(|(h, r)| (*h, r.lease_stalled)).collect()
        };
        if self.plain_matching() {
            return;
        }
        let deadline = Instant::now() + self.shared.lease_wait;
        let mut waited = false;
        let set_stalled = |h: u64, on: bool| {
            if let Some(r) = self.state().ready.get_mut(&h) {
                r.lease_stalled = on;
            }
        };
        for (h, stalled) in holders {
            let holder = HolderId::new(h);
            if stalled {
                let (held, limit) = published.holds_of(holder);
                if held <= limit / 2 {
                    set_stalled(h, false);
                }
                continue;
            }
            match published.wait_lease_room(holder, deadline) {
                Ok(w) => waited |= w,
                Err(_) => {
                    waited = true;
                    tracing::debug!(holder = h, "subscriber kept its lease limit for the whole wait; bytes for now");
                    set_stalled(h, true);
                }
            }
        }
        if waited {
            inc(&self.shared.counters.lease_waits);
        }
    }
}
