//! [`ControlConn`]: one framed `SOCK_SEQPACKET` connection that carries bytes and fds.

use std::fmt;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, Shutdown, SockFlag, SockType, connect, sendmsg, shutdown, socket,
    socketpair,
};

use super::cred::{AccessPolicy, PeerCred, PeerProcess};
use super::name::{InvalidNameError, SocketName};
use super::sys::{self, Deadline};
use super::{DEFAULT_SEND_TIMEOUT, MAX_FRAME_BYTES, MAX_FRAME_FDS};
use crate::sync::Unpoisoned;

/// One received message: its bytes and the descriptors that came with it.
///
/// The descriptors are owned and close-on-exec (`MSG_CMSG_CLOEXEC`): whatever the
/// caller does not keep is closed when the `Frame` is dropped.
#[derive(Debug)]
pub struct Frame {
    /// Payload, 1 to [`MAX_FRAME_BYTES`] bytes.
    pub bytes: Vec<u8>,
    /// Descriptors attached with `SCM_RIGHTS`, at most [`MAX_FRAME_FDS`].
    pub fds: Vec<OwnedFd>,
}

/// Failure of [`ControlConn::connect`], [`ControlConn::connect_with_policy`] or
/// [`ControlConn::pair`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The name cannot be a socket address.
    #[error("invalid socket name {name}")]
    InvalidName {
        /// The name.
        name: SocketName,
        /// Why.
        #[source]
        source: InvalidNameError,
    },
    /// Nobody listens on that name (`ENOENT` / `ECONNREFUSED`).
    #[error("nothing listens on {name}")]
    NotListening {
        /// The name.
        name: SocketName,
        /// The errno of `connect(2)`.
        #[source]
        source: Errno,
    },
    /// The listener's backlog stayed full until the timeout.
    #[error("connect to {name} timed out after {timeout:?}")]
    Timeout {
        /// The name.
        name: SocketName,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// The listening process is not allowed by our policy; the socket was closed.
    #[error("listener on {name} ({cred}) refused by our access policy")]
    Refused {
        /// The name.
        name: SocketName,
        /// The listener's credentials.
        cred: PeerCred,
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

/// Failure of [`ControlConn::send`] / [`ControlConn::send_timeout`]. Nothing was sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Empty frames are not allowed (on `SOCK_SEQPACKET` they are indistinguishable
    /// from end-of-stream at the receiver).
    #[error("empty frame")]
    Empty,
    /// The payload exceeds [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes exceeds the maximum {max}")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// [`MAX_FRAME_BYTES`].
        max: usize,
    },
    /// More descriptors than [`MAX_FRAME_FDS`].
    #[error("frame with {count} fds exceeds the maximum {max}")]
    TooManyFds {
        /// Descriptors given.
        count: usize,
        /// [`MAX_FRAME_FDS`].
        max: usize,
    },
    /// The peer has closed the connection (or we shut it down).
    #[error("connection closed by peer")]
    Closed,
    /// The socket stayed full until the timeout (the peer does not read).
    #[error("send timed out after {0:?}")]
    Timeout(Duration),
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

/// Failure of [`ControlConn::recv`] / [`ControlConn::try_recv`].
///
/// The protocol violations (`TooLarge`, `TooManyFds`, `Empty`, `UnexpectedControl`)
/// close every descriptor that arrived and shut the connection down, so the peer sees
/// [`RecvError::Closed`] / [`SendError::Closed`] and later calls here return `Closed`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// The peer closed the connection (or it was shut down) and no frame is left.
    #[error("connection closed by peer")]
    Closed,
    /// No frame arrived before the timeout.
    #[error("no frame within {0:?}")]
    Timeout(Duration),
    /// The peer sent a message longer than [`MAX_FRAME_BYTES`] (`MSG_TRUNC`).
    #[error("peer sent a frame longer than {max} bytes; connection dropped")]
    TooLarge {
        /// [`MAX_FRAME_BYTES`].
        max: usize,
    },
    /// The peer attached more than [`MAX_FRAME_FDS`] descriptors (`MSG_CTRUNC`).
    #[error("peer attached more than {max} fds ({received} arrived, all closed); connection dropped")]
    TooManyFds {
        /// [`MAX_FRAME_FDS`].
        max: usize,
        /// How many arrived before truncation (all closed).
        received: usize,
    },
    /// The peer sent an empty message.
    #[error("peer sent an empty frame ({fds} fds, closed); connection dropped")]
    Empty {
        /// Descriptors that came with it (closed).
        fds: usize,
    },
    /// A control message other than `SCM_RIGHTS`, or a malformed control area.
    #[error("unexpected control message from peer; connection dropped")]
    UnexpectedControl,
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

/// A connected, framed control channel (`SOCK_SEQPACKET`, nonblocking, close-on-exec).
///
/// Each [`send`](Self::send) is one message of 1..=[`MAX_FRAME_BYTES`] bytes with up to
/// [`MAX_FRAME_FDS`] descriptors; each [`recv`](Self::recv) returns exactly one such
/// message. `send` and `recv` take `&self` and may run on different threads at once.
/// The peer's credentials were read once, at connection time ([`peer_cred`](Self::peer_cred)).
/// [`AsFd`] gives the socket for polling many connections (readable = a frame or a
/// hang-up is waiting; then call [`try_recv`](Self::try_recv)).
///
/// Dropping it closes the socket; the peer then sees [`RecvError::Closed`].
pub struct ControlConn {
    /// The socket. Fields drop top to bottom: the socket closes before the listener's
    /// slot is given back, so the listener never has more sockets open than its limit.
    fd: OwnedFd,
    peer: PeerCred,
    send_timeout: Duration,
    /// Reused receive buffer of `MAX_FRAME_BYTES` (allocated on first receive); the
    /// mutex also serialises concurrent receivers.
    rx: Mutex<Vec<u8>>,
    /// For a connection accepted by a [`ControlListener`](super::ControlListener): its
    /// place in the listener's connection limit, given back on drop.
    _slot: Option<ConnSlot>,
}

/// One place in a listener's limit of live connections; dropping it gives it back.
#[derive(Debug)]
pub(super) struct ConnSlot(pub(super) std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        // Relaxed: the count only bounds how many connections exist; it orders no
        // other memory (the socket itself was closed by the field before this one).
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl fmt::Debug for ControlConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlConn")
            .field("fd", &self.fd.as_raw_fd())
            .field("peer", &self.peer)
            .field("send_timeout", &self.send_timeout)
            .finish_non_exhaustive()
    }
}

impl AsFd for ControlConn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Log at DEBUG an error about to be returned.
fn debug_err<E: fmt::Display>(op: &'static str, fd: RawFd) -> impl FnOnce(&E) {
    move |e| tracing::debug!(op, fd, error = %e, "control channel operation failed")
}

impl ControlConn {
    /// Wrap a connected socket whose peer credentials are known.
    pub(super) fn from_parts(fd: OwnedFd, peer: PeerCred) -> Self {
        Self { fd, peer, send_timeout: DEFAULT_SEND_TIMEOUT, rx: Mutex::new(Vec::new()), _slot: None }
    }

    /// Wrap a socket accepted by a listener that counts its live connections.
    pub(super) fn from_accepted(fd: OwnedFd, peer: PeerCred, slot: ConnSlot) -> Self {
        Self { _slot: Some(slot), ..Self::from_parts(fd, peer) }
    }

    /// Connect to the listener at `name` and require it to run under our own effective
    /// uid ([`AccessPolicy::same_uid`]).
    ///
    /// `timeout` bounds the wait while the listener's backlog is full (a Unix connect
    /// otherwise completes at once, before the listener calls `accept`).
    pub fn connect(name: &SocketName, timeout: Duration) -> Result<Self, ConnectError> {
        Self::connect_with_policy(name, timeout, &AccessPolicy::same_uid())
    }

    /// Connect to the listener at `name`; refuse it (close, [`ConnectError::Refused`])
    /// unless `policy` permits the listening process's credentials.
    pub fn connect_with_policy(
        name: &SocketName,
        timeout: Duration,
        policy: &AccessPolicy,
    ) -> Result<Self, ConnectError> {
        Self::connect_inner(name, timeout, policy).inspect_err(debug_err("connect", -1))
    }

    fn connect_inner(name: &SocketName, timeout: Duration, policy: &AccessPolicy) -> Result<Self, ConnectError> {
        let addr = name.to_unix_addr().map_err(|source| ConnectError::InvalidName { name: name.clone(), source })?;
        let deadline = Deadline::after(timeout);
        tracing::trace!("socket(AF_UNIX, SOCK_SEQPACKET|SOCK_CLOEXEC|SOCK_NONBLOCK)");
        let fd =
            socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None)
                .map_err(|source| ConnectError::Sys { call: "socket", source })?;
        let mut backoff = Duration::from_micros(200);
        loop {
            tracing::trace!(fd = fd.as_raw_fd(), %name, "connect");
            match connect(fd.as_raw_fd(), &addr) {
                Ok(()) => break,
                Err(Errno::EINTR) => {}
                // Nonblocking AF_UNIX connect: EAGAIN means the backlog is full. It
                // cannot be polled for, so retry with a bounded backoff.
                Err(Errno::EAGAIN) => {
                    let nap = match deadline.remaining() {
                        None => backoff,
                        Some(left) if left.is_zero() => {
                            return Err(ConnectError::Timeout { name: name.clone(), timeout });
                        }
                        Some(left) => left.min(backoff),
                    };
                    std::thread::sleep(nap);
                    backoff = (backoff * 2).min(Duration::from_millis(50));
                }
                Err(source @ (Errno::ENOENT | Errno::ECONNREFUSED)) => {
                    return Err(ConnectError::NotListening { name: name.clone(), source });
                }
                Err(source) => {
                    return Err(ConnectError::Sys { call: "connect", source });
                }
            }
        }
        let cred = PeerCred::of_socket(fd.as_fd())
            .map_err(|source| ConnectError::Sys { call: "getsockopt(SO_PEERCRED)", source })?;
        if !policy.permits(&cred) {
            tracing::warn!(pid = cred.pid, uid = cred.uid, %name, "listener refused by our access policy");
            return Err(ConnectError::Refused { name: name.clone(), cred });
        }
        Ok(Self::from_parts(fd, cred))
    }

    /// Two connected ends in this process (`socketpair`), e.g. for tests or an
    /// in-process peer. Both see our own credentials.
    pub fn pair() -> Result<(Self, Self), ConnectError> {
        tracing::trace!("socketpair(AF_UNIX, SOCK_SEQPACKET|SOCK_CLOEXEC|SOCK_NONBLOCK)");
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(|source| ConnectError::Sys { call: "socketpair", source })
        .inspect_err(debug_err("pair", -1))?;
        let cred = |fd: &OwnedFd| {
            PeerCred::of_socket(fd.as_fd())
                .map_err(|source| ConnectError::Sys { call: "getsockopt(SO_PEERCRED)", source })
        };
        let (ca, cb) = (cred(&a)?, cred(&b)?);
        Ok((Self::from_parts(a, ca), Self::from_parts(b, cb)))
    }

    /// The peer's credentials, read with `SO_PEERCRED` when the connection was made.
    pub fn peer_cred(&self) -> PeerCred {
        self.peer
    }

    /// A handle on the peer's process (a pidfd) that tells when it exits, or `None` if
    /// this kernel or namespace gives none, or the process is gone (see
    /// [`PeerProcess`]). On Linux 6.5+ it names the process that connected, whenever
    /// asked; the fallback opens the pid recorded at connect time, which names another
    /// process if the peer died and its pid was reused in between.
    pub fn peer_process(&self) -> Option<PeerProcess> {
        PeerProcess::of_socket(self.fd.as_fd(), self.peer)
    }

    /// The timeout [`send`](Self::send) uses ([`DEFAULT_SEND_TIMEOUT`] unless set).
    pub fn send_timeout_default(&self) -> Duration {
        self.send_timeout
    }

    /// Change the timeout [`send`](Self::send) uses.
    pub fn set_send_timeout(&mut self, timeout: Duration) {
        self.send_timeout = timeout;
    }

    /// Send one frame, waiting up to the connection's send timeout for socket space.
    pub fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), SendError> {
        self.send_timeout(bytes, fds, self.send_timeout)
    }

    /// Send one frame: `bytes` (1..=[`MAX_FRAME_BYTES`]) plus up to [`MAX_FRAME_FDS`]
    /// descriptors (duplicated into the peer by the kernel; ours stay open). Waits up
    /// to `timeout` while the socket is full. The frame is sent whole or not at all.
    pub fn send_timeout(&self, bytes: &[u8], fds: &[BorrowedFd<'_>], timeout: Duration) -> Result<(), SendError> {
        self.send_inner(bytes, fds, timeout).inspect_err(debug_err("send", self.fd.as_raw_fd()))
    }

    fn send_inner(&self, bytes: &[u8], fds: &[BorrowedFd<'_>], timeout: Duration) -> Result<(), SendError> {
        if bytes.is_empty() {
            return Err(SendError::Empty);
        }
        if bytes.len() > MAX_FRAME_BYTES {
            return Err(SendError::TooLarge { len: bytes.len(), max: MAX_FRAME_BYTES });
        }
        if fds.len() > MAX_FRAME_FDS {
            return Err(SendError::TooManyFds { count: fds.len(), max: MAX_FRAME_FDS });
        }
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
        let iov = [IoSlice::new(bytes)];
        let deadline = Deadline::after(timeout);
        let sock = self.fd.as_raw_fd();
        loop {
            tracing::trace!(fd = sock, len = bytes.len(), fds = ?raw, "sendmsg");
            match sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL, None) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => {
                    // SOCK_SEQPACKET sends atomically; a short count would be a kernel
                    // contract break. Report it rather than retrying half a frame.
                    tracing::error!(fd = sock, n, len = bytes.len(), "short sendmsg on SOCK_SEQPACKET");
                    return Err(SendError::Sys { call: "sendmsg", source: Errno::EIO });
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => match sys::poll_until(self.fd.as_fd(), libc::POLLOUT, deadline) {
                    Ok(None) => return Err(SendError::Timeout(timeout)),
                    Ok(Some(_)) => {}
                    Err(source) => {
                        return Err(SendError::Sys { call: "poll", source });
                    }
                },
                Err(Errno::EPIPE | Errno::ECONNRESET | Errno::ENOTCONN) => {
                    return Err(SendError::Closed);
                }
                Err(source) => {
                    return Err(SendError::Sys { call: "sendmsg", source });
                }
            }
        }
    }

    /// Receive one frame, waiting up to `timeout` (`Duration::MAX`: forever).
    ///
    /// Frames the peer sent before hanging up are still delivered; after the last one,
    /// [`RecvError::Closed`].
    pub fn recv(&self, timeout: Duration) -> Result<Frame, RecvError> {
        self.recv_spinning(timeout, Duration::ZERO)
    }

    /// [`ControlConn::recv`] that polls the socket without sleeping for up to `spin`
    /// (within `timeout`) before it waits in `poll`: no wake-up of a sleeping thread
    /// when a frame comes within `spin`, at the price of a busy core meanwhile.
    pub fn recv_spinning(&self, timeout: Duration, spin: Duration) -> Result<Frame, RecvError> {
        self.recv_inner(Deadline::after(timeout), timeout, spin).inspect_err(debug_err("recv", self.fd.as_raw_fd()))
    }

    /// Receive one frame if one is waiting; `Ok(None)` if not. Does not block.
    pub fn try_recv(&self) -> Result<Option<Frame>, RecvError> {
        match self.recv_inner(Deadline::after(Duration::ZERO), Duration::ZERO, Duration::ZERO) {
            Ok(f) => Ok(Some(f)),
            Err(RecvError::Timeout(_)) => Ok(None),
            Err(e) => {
                debug_err("try_recv", self.fd.as_raw_fd())(&e);
                Err(e)
            }
        }
    }

    fn recv_inner(&self, deadline: Deadline, timeout: Duration, spin: Duration) -> Result<Frame, RecvError> {
        let spin_until = (!spin.is_zero()).then(|| Instant::now() + spin.min(timeout));
        let mut buf = self.rx.locked();
        if buf.len() != MAX_FRAME_BYTES {
            buf.resize(MAX_FRAME_BYTES, 0);
        }
        let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
        let mut reset_seen = false;
        loop {
            let got = match sys::recvmsg(self.fd.as_fd(), &mut buf, flags) {
                Ok(got) => got,
                Err(Errno::EINTR) => continue,
                // Polling yields the core between tries: on a machine with fewer
                // cores than busy threads, the thread we wait for may need it.
                Err(Errno::EAGAIN) if spin_until.is_some_and(|t| Instant::now() < t) => {
                    std::thread::yield_now();
                    continue;
                }
                Err(Errno::EAGAIN) => match sys::poll_until(self.fd.as_fd(), libc::POLLIN, deadline) {
                    Ok(None) => return Err(RecvError::Timeout(timeout)),
                    Ok(Some(_)) => continue,
                    Err(source) => {
                        return Err(RecvError::Sys { call: "poll", source });
                    }
                },
                // The peer died with unread data. Linux reports ECONNRESET once,
                // *before* the frames it sent us; read those first (the next call
                // returns them, then end-of-stream), so a peer's last frames are never
                // lost to the order in which the kernel reports things.
                Err(Errno::ECONNRESET) if !reset_seen => {
                    reset_seen = true;
                    continue;
                }
                Err(Errno::ECONNRESET | Errno::ENOTCONN | Errno::EPIPE) => {
                    return Err(RecvError::Closed);
                }
                Err(source) => {
                    return Err(RecvError::Sys { call: "recvmsg", source });
                }
            };
            // From here on every path owns `got.fds`: returning an error drops them.
            let nfds = got.fds.len();
            let violation = if got.flags & libc::MSG_TRUNC != 0 {
                Some(RecvError::TooLarge { max: MAX_FRAME_BYTES })
            } else if got.flags & libc::MSG_CTRUNC != 0 || nfds > MAX_FRAME_FDS {
                Some(RecvError::TooManyFds { max: MAX_FRAME_FDS, received: nfds })
            } else if got.foreign_control {
                Some(RecvError::UnexpectedControl)
            } else if got.len == 0 {
                if nfds == 0 && self.hung_up()? {
                    return Err(RecvError::Closed);
                }
                Some(RecvError::Empty { fds: nfds })
            } else {
                None
            };
            if let Some(err) = violation {
                drop(got.fds);
                self.shutdown();
                return Err(err);
            }
            return Ok(Frame {
                // Without MSG_TRUNC the kernel never reports more than the buffer.
                bytes: buf[..got.len.min(buf.len())].to_vec(),
                fds: got.fds,
            });
        }
    }

    /// After a zero-length read: end-of-stream (peer gone or shut down) rather than an
    /// empty message? `SOCK_SEQPACKET` reports both as 0 bytes; only poll tells them apart.
    fn hung_up(&self) -> Result<bool, RecvError> {
        let revents = sys::poll1(self.fd.as_fd(), libc::POLLIN | libc::POLLRDHUP, 0)
            .map_err(|source| RecvError::Sys { call: "poll", source })?;
        Ok(revents & (libc::POLLRDHUP | libc::POLLHUP) != 0)
    }

    /// Shuts down the sending direction only (`SHUT_WR`): the peer reads the end of the
    /// stream, while what it still sends here can be read.
    pub fn shutdown_write(&self) {
        tracing::trace!(fd = self.fd.as_raw_fd(), "shutdown(SHUT_WR)");
        if let Err(e) = shutdown(self.fd.as_raw_fd(), Shutdown::Write)
            && e != Errno::ENOTCONN
        {
            tracing::debug!(fd = self.fd.as_raw_fd(), error = %crate::error::Chain(&e), "shutdown failed");
        }
    }

    /// Shut the connection down in both directions without closing the descriptor (so
    /// pollers holding it see a hang-up, not a reused fd number). The peer sees
    /// `Closed`; later calls here fail with `Closed`. Errors are logged, not returned.
    pub fn shutdown(&self) {
        tracing::trace!(fd = self.fd.as_raw_fd(), "shutdown(SHUT_RDWR)");
        if let Err(e) = shutdown(self.fd.as_raw_fd(), Shutdown::Both)
            && e != Errno::ENOTCONN
        {
            tracing::debug!(fd = self.fd.as_raw_fd(), error = %crate::error::Chain(&e), "shutdown failed");
        }
    }
}
