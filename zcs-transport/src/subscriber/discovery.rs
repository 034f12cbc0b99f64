//! Which publishers a subscriber knows: their liveliness tokens appearing and
//! vanishing, the plain key listened on while none is known, and a vanished
//! publisher's process watched until it exits (its unwritten ready signals are then
//! written by us, so no stream of ours waits forever).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use zenoh::Wait;

use super::handshake::hello;
use super::link::link_thread;
use super::order::on_bytes;
use super::{Link, PubEntry, Shared, State, inc};
use crate::config::PlainListen;
use crate::locality::{Locality, decide};
use crate::protocol::Token;
use crate::sync::Unpoisoned;

pub(super) fn publisher_appeared(sh: &Arc<Shared>, t: Token) {
    let locality = decide(&sh.group, &t.group, sh.peer.as_ref(), sh.host_blocks);
    {
        let mut st = sh.state.locked();
        if let Some(e) = st.pubs.get(&t.instance) {
            // Back after a Zenoh outage that its link outlived.
            if let Some(link) = &e.link {
                link.token_gone.store(false, Ordering::Relaxed);
            }
            return;
        }
        let why = match &locality {
            Locality::Bytes(why) => Some(why.clone()),
            Locality::Same | Locality::Peer | Locality::HostBlock => None,
        };
        st.pubs.insert(t.instance, PubEntry { link: None, order: Arc::default(), why });
    }
    let socket = match &t.socket {
        Some(s) if locality.maps() => s.clone(),
        // Another host, or a device whose memory ours cannot map: bytes only.
        _ => return sh.refresh_plain(),
    };
    if locality == Locality::Peer {
        tracing::debug!(publisher = %crate::Id(t.instance), device = %t.group.device, "publisher on a peer GPU; mapping its blocks for ours");
    }
    let s = Arc::clone(sh);
    crate::step!("subscriber: publisher seen");
    // Connect and say Hello here, without waiting: the publisher's side of the
    // handshake then runs while the link thread starts. A connection that cannot be
    // made at once (a full backlog) is retried by the thread, with the full timeout.
    let opened = hello(sh, &socket, &t.group, Duration::ZERO).ok();
    // A handshake held back for a test starts in the link thread.
    #[cfg(feature = "fault-injection")]
    let opened = opened.filter(|_| !crate::fault::handshake_delayed());
    let spawned =
        std::thread::Builder::new().name("zcs-sub-link".into()).spawn(move || link_thread(&s, &t, &socket, opened));
    if let Err(e) = spawned {
        tracing::warn!(error = %crate::error::Chain(&e), "cannot start a link thread");
    }
    sh.refresh_plain();
}

/// How long a subscriber watches a vanished publisher's process for its exit.
const DEAD_PUBLISHER_WATCH: Duration = Duration::from_secs(600);

pub(super) fn publisher_vanished(sh: &Arc<Shared>, instance: u64) {
    let (link, none_left) = {
        let mut st = sh.state.locked();
        // The token came through Zenoh; the link does not. While the link is open its
        // publisher is alive and routing to us (descriptors, leases and releases all
        // go over it), so the token vanishing means the Zenoh route between us is down
        // — a router died — and the link stays. If the link ends before the token is
        // back, its end forgets the publisher (`link_thread`). `alive` is stored false
        // by the link thread before it takes this lock, so under the lock exactly one
        // of the two sees the other's mark.
        let open = st.pubs.get(&instance).and_then(|e| e.link.clone()).filter(|l| l.alive.load(Ordering::Relaxed));
        match open {
            Some(link) => {
                link.token_gone.store(true, Ordering::Relaxed);
                drop(st);
                tracing::debug!(
                    publisher = %crate::Id(instance),
                    "publisher's token gone while its link is open; keeping the link"
                );
                // The token also goes first when the publisher's process dies with a
                // kernel running (its Zenoh sockets close before its control socket):
                // watch it, so that none of our streams waits on a signal never written.
                return watch_publisher_process(&link);
            }
            None => forget(&mut st, instance),
        }
    };
    forgotten(sh, instance, link, none_left);
}

/// Removes a publisher's entry; [`forgotten`] finishes the job outside the lock.
pub(super) fn forget(st: &mut State, instance: u64) -> (Option<Arc<Link>>, bool) {
    let e = st.pubs.remove(&instance);
    (e.and_then(|e| e.link), st.pubs.is_empty())
}

/// A forgotten publisher's link goes: its imports are evicted and, on CUDA, its process
/// is watched; with no publisher left, the plain key is listened on again (`auto`).
pub(super) fn forgotten(sh: &Arc<Shared>, instance: u64, link: Option<Arc<Link>>, none_left: bool) {
    sh.dedup.forget(instance);
    if let Some(link) = link {
        link.alive.store(false, Ordering::Relaxed);
        link.imports.clear();
        inc(&sh.counters.evictions);
        tracing::debug!(publisher = %crate::Id(instance), "publisher gone; its imports evicted");
        // A link whose token vanished while it was open is watched since then.
        if !link.token_gone.load(Ordering::Relaxed) {
            watch_publisher_process(&link);
        }
    }
    if none_left {
        sh.refresh_plain();
    }
}

/// Watches the process behind a CUDA link whose publisher's token vanished, and once
/// it has exited releases our streams' waits on the ready signals it never wrote.
///
/// A token vanishes as soon as the process's Zenoh sockets close, which can be long
/// before it has exited: a killed process with a kernel still running stays in the
/// driver's context teardown for seconds. It also vanishes when the publisher is merely
/// dropped (then its signals still come), or while a router between us is down. So
/// watch off Zenoh's callback thread, for up to `DEAD_PUBLISHER_WATCH`, or until the
/// token is back on a link that is still open.
fn watch_publisher_process(link: &Arc<Link>) {
    let Some(pid) = link.signals.watched_pid() else { return };
    let link = Arc::clone(link);
    let spawned = std::thread::Builder::new().name("zcs-dead-publisher".into()).spawn(move || {
        let t = std::time::Instant::now();
        let mut nap = Duration::from_millis(5);
        while t.elapsed() < DEAD_PUBLISHER_WATCH {
            if crate::host::process_gone(pid) {
                link.signals.release_waiters_of_dead_publisher();
                return;
            }
            if link.alive.load(Ordering::Relaxed) && !link.token_gone.load(Ordering::Relaxed) {
                // Seen again; a later vanishing starts a new watch.
                return;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(100));
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %crate::error::Chain(&e), "cannot watch a vanished publisher's process");
    }
}

impl Shared {
    /// Listens on the plain key, or stops, as `plain_listen` and the publishers known
    /// now say (`auto`: while none is known). Decided under the plain-key lock, so
    /// calls racing each other leave the state the last one saw.
    pub(super) fn refresh_plain(self: &Arc<Self>) {
        let mut sub = self.plain_sub.locked();
        let on = match self.plain_listen {
            PlainListen::Always => true,
            PlainListen::Never => false,
            PlainListen::Auto => self.state.locked().pubs.is_empty(),
        };
        if on == sub.is_some() || self.closed.load(Ordering::Relaxed) {
            return;
        }
        if on {
            let s = Arc::clone(self);
            match self
                .session
                .declare_subscriber(self.key.clone())
                .callback(move |sample| on_bytes(&s, &sample, true))
                .wait()
            {
                Ok(x) => *sub = Some(x),
                Err(e) => {
                    tracing::warn!(error = %crate::error::Chain(&*e), key = %self.key, "cannot listen on the plain key")
                }
            }
        } else {
            *sub = None;
        }
        tracing::debug!(key = %self.key, on, "plain-key listening changed");
    }
}
