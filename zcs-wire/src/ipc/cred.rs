//! Peer credentials (`SO_PEERCRED`) and the uid-based [`AccessPolicy`].

use std::collections::HashMap;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{getsockopt, sockopt};

/// Credentials of the process at the other end of a control connection, as the kernel
/// recorded them (`SO_PEERCRED`): for the accepting side, the connecting process at
/// `connect(2)` time; for the connecting side, the listening process at `listen(2)`
/// time. They cannot be forged by the peer.
///
/// `pid` is translated into our PID namespace; it is 0 when the peer's process is not
/// visible from here (another PID namespace). `uid`/`gid` are the peer's *effective* ids,
/// translated into our user namespace (65534 when unmapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerCred {
    /// Process id of the peer (0 if not visible from our PID namespace).
    pub pid: i32,
    /// Effective user id of the peer.
    pub uid: u32,
    /// Effective group id of the peer.
    pub gid: u32,
}

impl PeerCred {
    /// Read `SO_PEERCRED` from a connected Unix socket.
    pub(super) fn of_socket(fd: BorrowedFd<'_>) -> Result<Self, Errno> {
        tracing::trace!(fd = fd.as_raw_fd(), "getsockopt(SO_PEERCRED)");
        let c = getsockopt(&fd.as_fd(), sockopt::PeerCredentials)?;
        let cred = Self { pid: c.pid(), uid: c.uid(), gid: c.gid() };
        tracing::trace!(fd = fd.as_raw_fd(), %cred, "SO_PEERCRED");
        Ok(cred)
    }
}

impl fmt::Display for PeerCred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} uid {} gid {}", self.pid, self.uid, self.gid)
    }
}

/// The process at the other end of a control connection, held by a pidfd: whether it
/// has exited can be asked, and waited for, with no race against pid reuse.
#[derive(Debug)]
pub struct PeerProcess {
    pidfd: OwnedFd,
    pid: i32,
}

impl PeerProcess {
    /// The peer of a connected socket whose credentials are `cred`: the kernel's own
    /// pidfd of it (`SO_PEERPIDFD`, Linux 6.5+), else one opened on `cred.pid` (Linux
    /// 5.3+). `None` when neither works: a peer in another PID namespace (pid 0), or
    /// one already gone and reaped (`ESRCH`).
    pub(super) fn of_socket(fd: BorrowedFd<'_>, cred: PeerCred) -> Option<Self> {
        let pidfd = match super::sys::peer_pidfd(fd) {
            Ok(p) => p,
            Err(e) if cred.pid > 0 => super::sys::pidfd_open(cred.pid)
                .inspect_err(|e2| tracing::debug!(%cred, so_peerpidfd = %e, pidfd_open = %e2, "no pidfd of the peer"))
                .ok()?,
            Err(e) => {
                tracing::debug!(%cred, error = %crate::error::Chain(&e), "no pidfd of the peer (not in our PID namespace)");
                return None;
            }
        };
        Some(Self { pidfd, pid: cred.pid })
    }

    /// The peer's pid in our namespace (0 if not visible from here).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits up to `timeout` for the process to exit; `Ok(true)` once it has (a zombie
    /// counts: it maps nothing), `Ok(false)` if it still runs. An error means the pidfd
    /// cannot be polled (and nothing was waited for).
    pub fn wait_exit(&self, timeout: Duration) -> Result<bool, Errno> {
        super::sys::poll_until(self.pidfd.as_fd(), libc::POLLIN, super::sys::Deadline::after(timeout))
            .map(|r| r.is_some())
    }

    /// Whether the process has exited, without waiting.
    pub fn exited(&self) -> Result<bool, Errno> {
        self.wait_exit(Duration::ZERO)
    }
}

/// Which peers may use a control connection, decided on the peer's effective uid.
///
/// The default allows only our own effective uid. A listener applies its policy on
/// every accepted connection (a refused peer is closed at once, counted and logged);
/// [`ControlConn::connect_with_policy`](super::ControlConn::connect_with_policy) applies
/// one to the listener it reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessPolicy {
    rule: Rule,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    /// Exactly these effective uids.
    Uids(Vec<u32>),
    /// Anyone who can reach the socket.
    Any,
}

impl Default for AccessPolicy {
    /// [`AccessPolicy::same_uid`].
    fn default() -> Self {
        Self::same_uid()
    }
}

impl AccessPolicy {
    /// Only peers whose effective uid equals ours (read now, with `geteuid`).
    pub fn same_uid() -> Self {
        Self::uids([nix::unistd::geteuid().as_raw()])
    }

    /// Exactly the listed uids (ours is *not* added implicitly; use
    /// [`with_uid`](Self::with_uid) on [`same_uid`](Self::same_uid) for that).
    pub fn uids(uids: impl IntoIterator<Item = u32>) -> Self {
        let mut v: Vec<u32> = uids.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Self { rule: Rule::Uids(v) }
    }

    /// This policy plus `uid`. No effect on [`allow_any`](Self::allow_any).
    #[must_use]
    pub fn with_uid(self, uid: u32) -> Self {
        match self.rule {
            Rule::Uids(mut v) => {
                v.push(uid);
                Self::uids(v)
            }
            Rule::Any => self,
        }
    }

    /// Anyone able to reach the socket. Abstract sockets have no file permissions, so
    /// this means every process in the network namespace: use only for tests or where
    /// another layer authenticates.
    pub fn allow_any() -> Self {
        Self { rule: Rule::Any }
    }

    /// The allowed uids, or `None` if every uid is allowed.
    pub fn allowed_uids(&self) -> Option<&[u32]> {
        match &self.rule {
            Rule::Uids(v) => Some(v),
            Rule::Any => None,
        }
    }

    /// Whether a peer with these credentials is allowed.
    pub fn permits(&self, cred: &PeerCred) -> bool {
        match &self.rule {
            Rule::Uids(v) => v.binary_search(&cred.uid).is_ok(),
            Rule::Any => true,
        }
    }
}

/// How long repeated refusals of one uid stay quiet after a warning.
const WARN_INTERVAL: Duration = Duration::from_secs(60);
/// Most uids remembered for rate limiting; beyond it the table is reset (worst case:
/// a few extra warnings, never unbounded memory).
const MAX_TRACKED_UIDS: usize = 1024;

/// Counters and the per-uid warning rate limiter of one listener.
#[derive(Debug, Default)]
pub(super) struct RefusalLog {
    pub accepted: u64,
    pub refused: u64,
    pub over_limit: u64,
    per_uid: HashMap<u32, UidLog>,
    /// Last warning about the connection limit, and refusals since then not logged.
    limit_warn: Option<(Instant, u64)>,
}

#[derive(Debug)]
struct UidLog {
    last_warn: Instant,
    suppressed: u64,
}

impl RefusalLog {
    /// Count a permitted peer turned away because the listener already has its maximum
    /// of live connections; warn the first time and then at most once per
    /// [`WARN_INTERVAL`].
    pub(super) fn over_limit(&mut self, cred: &PeerCred, limit: usize, listener: &dyn fmt::Display) {
        self.over_limit += 1;
        let now = Instant::now();
        match &mut self.limit_warn {
            Some((last, suppressed)) if now.duration_since(*last) < WARN_INTERVAL => {
                *suppressed += 1;
                tracing::debug!(pid = cred.pid, uid = cred.uid, %listener, "connection over the limit closed");
            }
            slot => {
                let suppressed = slot.map_or(0, |(_, n)| n);
                *slot = Some((now, 0));
                tracing::warn!(
                    pid = cred.pid,
                    uid = cred.uid,
                    limit,
                    suppressed,
                    %listener,
                    "control connection closed: the listener has its maximum of live connections"
                );
            }
        }
    }

    /// Count a refusal; warn the first time a uid is refused and then at most once per
    /// [`WARN_INTERVAL`], with the number of refusals not logged in between.
    pub(super) fn refuse(&mut self, cred: &PeerCred, listener: &dyn fmt::Display) {
        self.refused += 1;
        let now = Instant::now();
        if self.per_uid.len() >= MAX_TRACKED_UIDS && !self.per_uid.contains_key(&cred.uid) {
            self.per_uid.clear();
        }
        match self.per_uid.get_mut(&cred.uid) {
            None => {
                self.per_uid.insert(cred.uid, UidLog { last_warn: now, suppressed: 0 });
                tracing::warn!(
                    pid = cred.pid,
                    uid = cred.uid,
                    gid = cred.gid,
                    %listener,
                    "control connection refused by access policy; further refusals of this uid are rate-limited"
                );
            }
            Some(log) if now.duration_since(log.last_warn) >= WARN_INTERVAL => {
                tracing::warn!(
                    pid = cred.pid,
                    uid = cred.uid,
                    gid = cred.gid,
                    %listener,
                    suppressed = log.suppressed,
                    "control connection refused by access policy"
                );
                log.last_warn = now;
                log.suppressed = 0;
            }
            Some(log) => {
                log.suppressed += 1;
                tracing::debug!(pid = cred.pid, uid = cred.uid, %listener, "control connection refused (rate-limited)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(uid: u32) -> PeerCred {
        PeerCred { pid: 1, uid, gid: uid }
    }

    #[test]
    fn ipc_policy_default_is_own_euid_only() {
        let me = nix::unistd::geteuid().as_raw();
        let p = AccessPolicy::default();
        assert_eq!(p.allowed_uids(), Some(&[me][..]));
        assert!(p.permits(&cred(me)));
        assert!(!p.permits(&cred(me.wrapping_add(1))));
    }

    #[test]
    fn ipc_policy_lists_and_any() {
        let p = AccessPolicy::uids([7, 3, 7]).with_uid(5);
        assert_eq!(p.allowed_uids(), Some(&[3, 5, 7][..]));
        assert!(p.permits(&cred(5)) && !p.permits(&cred(4)));
        assert!(!AccessPolicy::uids([]).permits(&cred(0)));
        let any = AccessPolicy::allow_any().with_uid(3);
        assert!(any.allowed_uids().is_none() && any.permits(&cred(12345)));
    }

    #[test]
    fn ipc_refusal_log_counts_and_rate_limits() {
        let mut log = RefusalLog::default();
        for _ in 0..5 {
            log.refuse(&cred(9), &"test");
        }
        log.refuse(&cred(10), &"test");
        assert_eq!(log.refused, 6);
        assert_eq!(log.per_uid[&9].suppressed, 4);
        assert_eq!(log.per_uid[&10].suppressed, 0);
        for uid in 0..(MAX_TRACKED_UIDS as u32 + 10) {
            log.refuse(&cred(1000 + uid), &"test");
        }
        assert!(log.per_uid.len() <= MAX_TRACKED_UIDS);
    }
}
