//! [`ControlListener`]: the accepting end, with the access policy applied on accept.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, bind, listen, socket};

use super::DEFAULT_MAX_CONNECTIONS;
use super::conn::{ConnSlot, ControlConn};
use super::cred::{AccessPolicy, PeerCred, RefusalLog};
use super::name::{InvalidNameError, RuntimeDirError, SocketName, ensure_runtime_dir};
use super::sys::{self, Deadline};
use crate::sync::Unpoisoned;

/// Pending connections the kernel queues before `connect` has to wait.
const BACKLOG: i32 = 128;

/// Failure of [`ControlListener::bind`] / [`ControlListener::bind_with_policy`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// The name cannot be a socket address.
    #[error("invalid socket name {name}")]
    InvalidName {
        /// The name.
        name: SocketName,
        /// Why.
        #[source]
        source: InvalidNameError,
    },
    /// The runtime directory of a path name is missing and cannot be created, or is
    /// not private to us.
    #[error("runtime directory for {name} is unusable")]
    RuntimeDir {
        /// The name.
        name: SocketName,
        /// Why.
        #[source]
        source: RuntimeDirError,
    },
    /// Another socket already has this name (`EADDRINUSE`).
    #[error("socket name {name} is already in use")]
    AddrInUse {
        /// The name.
        name: SocketName,
    },
    /// A syscall failed.
    #[error("{call} failed")]
    Sys {
        /// The failing call.
        call: &'static str,
        /// Its errno.
        #[source]
        source: Errno,
    },
}

/// Failure of [`ControlListener::accept`], [`accept_timeout`](ControlListener::accept_timeout)
/// or [`try_accept`](ControlListener::try_accept). Refused peers are not errors: they
/// are closed, counted and skipped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcceptError {
    /// No permitted peer connected before the timeout.
    #[error("no connection accepted within {0:?}")]
    Timeout(Duration),
    /// A syscall failed (`EMFILE`/`ENFILE`: out of descriptors; back off and retry).
    #[error("{call} failed")]
    Sys {
        /// The failing call.
        call: &'static str,
        /// Its errno.
        #[source]
        source: Errno,
    },
}

/// Counters of one listener.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerStats {
    /// Connections accepted and returned to the caller.
    pub accepted: u64,
    /// Connections refused by the access policy (closed at once).
    pub refused: u64,
    /// Permitted connections closed at once because the listener already had its
    /// maximum of live connections ([`ControlListener::with_max_connections`]).
    pub over_limit: u64,
    /// Accepted connections still alive (their [`ControlConn`] not yet dropped).
    pub live: usize,
}

/// The socket file of a path listener; removing it is this type's only job.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    /// Device and inode right after `bind`, so that `Drop` never removes a file that
    /// someone else put at the same path later.
    dev: u64,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        tracing::trace!(path = ?self.path, "lstat + unlink socket file");
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => {
                if let Err(e) = std::fs::remove_file(&self.path)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(path = ?self.path, error = %crate::error::Chain(&e), "could not remove control socket file");
                }
            }
            Ok(_) => {
                tracing::warn!(path = ?self.path, "control socket file was replaced; left in place")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = ?self.path, error = %crate::error::Chain(&e), "could not stat control socket file");
            }
        }
    }
}

/// A listening control socket (`SOCK_SEQPACKET`, nonblocking, close-on-exec).
///
/// Every accepted connection's `SO_PEERCRED` is checked against the listener's
/// [`AccessPolicy`]; refused peers are closed before `accept*` returns, counted in
/// [`stats`](Self::stats) and logged once per uid (then at most once a minute).
/// [`AsFd`] gives the socket for polling (readable = a connection is pending).
///
/// At most [`max_connections`](Self::with_max_connections) accepted connections are
/// alive at once (default [`DEFAULT_MAX_CONNECTIONS`]): a permitted peer that connects
/// beyond that is closed at once (it sees `Closed`), counted and logged at most once a
/// minute, so a flood of connections costs a bounded number of descriptors and of
/// whatever the caller keeps per connection (a publisher: one thread).
///
/// Dropping it removes the socket file of a path name; an abstract name disappears
/// with the descriptor.
pub struct ControlListener {
    /// Held only for its `Drop`, which runs first: unlink the path (if any) while the
    /// socket is still bound.
    _socket_file: Option<SocketFile>,
    /// The listening socket; closed after the file is gone.
    fd: OwnedFd,
    name: SocketName,
    policy: AccessPolicy,
    log: Mutex<RefusalLog>,
    /// Accepted connections alive now; each [`ControlConn`] we return holds one.
    live: Arc<AtomicUsize>,
    max_connections: usize,
}

impl fmt::Debug for ControlListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlListener")
            .field("fd", &self.fd.as_raw_fd())
            .field("name", &self.name)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl AsFd for ControlListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl ControlListener {
    /// Listen on `name`, accepting only peers with our own effective uid.
    ///
    /// For a [`SocketName::Path`], the parent directory is created with mode 0700 if
    /// missing, and must otherwise be ours and 0700 (see
    /// [`ensure_runtime_dir`](super::ensure_runtime_dir)).
    pub fn bind(name: &SocketName) -> Result<Self, BindError> {
        Self::bind_with_policy(name, AccessPolicy::default())
    }

    /// Listen on `name` and apply `policy` to every accepted peer.
    pub fn bind_with_policy(name: &SocketName, policy: AccessPolicy) -> Result<Self, BindError> {
        Self::bind_inner(name, policy).inspect_err(|e| {
            tracing::debug!(%name, error = %crate::error::Chain(&e), "bind failed");
        })
    }

    fn bind_inner(name: &SocketName, policy: AccessPolicy) -> Result<Self, BindError> {
        let addr = name.to_unix_addr().map_err(|source| BindError::InvalidName { name: name.clone(), source })?;
        if let SocketName::Path(path) = name {
            let Some(dir) = path.parent() else {
                return Err(BindError::RuntimeDir {
                    name: name.clone(),
                    source: RuntimeDirError::NoParent(name.to_string()),
                });
            };
            ensure_runtime_dir(dir).map_err(|source| BindError::RuntimeDir { name: name.clone(), source })?;
        }
        tracing::trace!("socket(AF_UNIX, SOCK_SEQPACKET|SOCK_CLOEXEC|SOCK_NONBLOCK)");
        let fd =
            socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)
                .map_err(|source| BindError::Sys { call: "socket", source })?;
        tracing::trace!(fd = fd.as_raw_fd(), %name, "bind");
        bind(fd.as_raw_fd(), &addr).map_err(|source| match source {
            Errno::EADDRINUSE => BindError::AddrInUse { name: name.clone() },
            source => BindError::Sys { call: "bind", source },
        })?;
        // Own the file from here on, so an error below removes it again.
        let file = match name {
            SocketName::Path(path) => {
                tracing::trace!(?path, "lstat");
                let m = std::fs::symlink_metadata(path).map_err(|e| BindError::Sys {
                    call: "lstat",
                    source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                })?;
                Some(SocketFile { path: path.clone(), dev: m.dev(), ino: m.ino() })
            }
            _ => None,
        };
        tracing::trace!(fd = fd.as_raw_fd(), backlog = BACKLOG, "listen");
        let backlog = Backlog::new(BACKLOG).unwrap_or(Backlog::MAXCONN);
        listen(&fd, backlog).map_err(|source| BindError::Sys { call: "listen", source })?;
        tracing::debug!(%name, fd = fd.as_raw_fd(), ?policy, "control listener bound");
        Ok(Self {
            _socket_file: file,
            fd,
            name: name.clone(),
            policy,
            log: Mutex::new(RefusalLog::default()),
            live: Arc::new(AtomicUsize::new(0)),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        })
    }

    /// Sets the most accepted connections alive at once (at least 1); permitted peers
    /// beyond it are closed on accept and counted in [`ListenerStats::over_limit`].
    #[must_use]
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// The most accepted connections alive at once.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The name this listener is bound to.
    pub fn name(&self) -> &SocketName {
        &self.name
    }

    /// The policy applied on accept.
    pub fn policy(&self) -> &AccessPolicy {
        &self.policy
    }

    /// Accepted and refused counts so far.
    pub fn stats(&self) -> ListenerStats {
        let log = self.log.locked();
        ListenerStats {
            accepted: log.accepted,
            refused: log.refused,
            over_limit: log.over_limit,
            live: self.live.load(Ordering::Relaxed),
        }
    }

    /// Wait (without limit) for a permitted peer.
    pub fn accept(&self) -> Result<ControlConn, AcceptError> {
        self.accept_timeout(Duration::MAX)
    }

    /// Wait up to `timeout` for a permitted peer. Refused peers are closed and skipped
    /// within the same wait.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<ControlConn, AcceptError> {
        self.accept_inner(Deadline::after(timeout), timeout)
            .inspect_err(|e| tracing::debug!(name = %self.name, error = %crate::error::Chain(&e), "accept failed"))
    }

    /// Accept a pending permitted peer if there is one; `Ok(None)` otherwise.
    pub fn try_accept(&self) -> Result<Option<ControlConn>, AcceptError> {
        match self.accept_inner(Deadline::after(Duration::ZERO), Duration::ZERO) {
            Ok(c) => Ok(Some(c)),
            Err(AcceptError::Timeout(_)) => Ok(None),
            Err(e) => {
                tracing::debug!(name = %self.name, error = %crate::error::Chain(&e), "try_accept failed");
                Err(e)
            }
        }
    }

    fn accept_inner(&self, deadline: Deadline, timeout: Duration) -> Result<ControlConn, AcceptError> {
        loop {
            match sys::accept4(self.fd.as_fd(), SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK) {
                Ok(conn) => {
                    let cred = PeerCred::of_socket(conn.as_fd())
                        .map_err(|source| AcceptError::Sys { call: "getsockopt(SO_PEERCRED)", source })?;
                    let mut log = self.log.locked();
                    if !self.policy.permits(&cred) {
                        // Close before anything else: the peer must not get a chance
                        // to send fds or wait on us.
                        drop(conn);
                        log.refuse(&cred, &self.name);
                        continue;
                    }
                    // Only this thread (holding `log`) increments, so the check and the
                    // increment cannot race with another accept; drops only decrement.
                    if self.live.load(Ordering::Relaxed) >= self.max_connections {
                        drop(conn);
                        log.over_limit(&cred, self.max_connections, &self.name);
                        continue;
                    }
                    self.live.fetch_add(1, Ordering::Relaxed);
                    let slot = ConnSlot(Arc::clone(&self.live));
                    log.accepted += 1;
                    tracing::debug!(name = %self.name, %cred, "control connection accepted");
                    return Ok(ControlConn::from_accepted(conn, cred, slot));
                }
                Err(Errno::EINTR | Errno::ECONNABORTED) => {}
                Err(Errno::EAGAIN) => match sys::poll_until(self.fd.as_fd(), libc::POLLIN, deadline) {
                    Ok(None) => return Err(AcceptError::Timeout(timeout)),
                    Ok(Some(_)) => {}
                    Err(source) => {
                        return Err(AcceptError::Sys { call: "poll", source });
                    }
                },
                Err(source) => {
                    return Err(AcceptError::Sys { call: "accept4", source });
                }
            }
        }
    }
}
