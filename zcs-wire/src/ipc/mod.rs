//! Unix-socket control channel: framing, descriptor passing and peer credentials.
//!
//! This is the layer below the control protocol. It moves *frames* — a byte payload
//! plus up to [`MAX_FRAME_FDS`] file descriptors — between two processes on one host,
//! and tells each side who the other is. What the bytes mean (handshake, FD handout,
//! lease release, versioning) belongs to the transport layer above.
//!
//! ```
//! use std::os::fd::AsFd;
//! use std::time::Duration;
//! use zcs_wire::ipc::{ControlConn, ControlListener, SocketName};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let name = SocketName::random_abstract();
//! let listener = ControlListener::bind(&name)?; // same-uid peers only
//! // `name.to_key_chunk()` is what goes into the liveliness token.
//! let token_chunk = name.to_key_chunk();
//!
//! let client = ControlConn::connect(&SocketName::from_key_chunk(&token_chunk)?,
//!                                   Duration::from_secs(1))?;
//! let server = listener.accept_timeout(Duration::from_secs(1))?;
//! assert_eq!(server.peer_cred().pid, std::process::id() as i32);
//!
//! let file = std::fs::File::open("/dev/null")?;
//! client.send(b"hello", &[file.as_fd()])?;
//! let frame = server.recv(Duration::from_secs(1))?;
//! assert_eq!(frame.bytes, b"hello");
//! assert_eq!(frame.fds.len(), 1); // an OwnedFd: closed when `frame` drops
//!
//! drop(client);
//! assert!(matches!(server.recv(Duration::from_secs(1)),
//!                  Err(zcs_wire::ipc::RecvError::Closed)));
//! # Ok(()) }
//! ```
//!
//! # Design choices
//!
//! **Abstract names by default, paths when needed.** A [`SocketName::Abstract`] lives
//! in the Linux abstract namespace: no file, no permissions to get wrong, and it
//! disappears with the last descriptor, so a crash (even `SIGKILL`) leaves nothing
//! behind — the reference design's `/tmp/*.sock` files survived crashes. Abstract
//! names are scoped to a *network* namespace, so peers in different network namespaces
//! (containers that share only a volume) use [`SocketName::Path`] instead: a file in a
//! runtime directory that we create with mode 0700 and refuse to use if it is anyone
//! else's or has been loosened ([`ensure_runtime_dir`]); the listener removes its file
//! on drop (only if the inode is still the one it bound). Either kind is named
//! `zcs-<32 hex>` with 128 bits from a CSPRNG, never a PID, so names cannot be guessed
//! or pre-empted and PID namespaces cannot collide. For liveliness tokens a name is
//! encoded as one key-expression chunk: `a` or `p` followed by lowercase hex
//! ([`SocketName::to_key_chunk`]); decoding treats the chunk as hostile input.
//!
//! **`SOCK_SEQPACKET`, not `SOCK_STREAM`.** A seqpacket socket is connection-oriented
//! (we get `SO_PEERCRED`, a hang-up notification, and a connection whose life a lease
//! can follow) *and* preserves message boundaries: one `sendmsg` is one `recvmsg`, the
//! descriptors of an `SCM_RIGHTS` message are attached to exactly that message, and a
//! message is delivered whole or not at all. With a stream we would need a length
//! prefix, reassembly across partial reads, rules for which byte range owns which fds
//! (Linux attaches them to the first byte read and may merge or split), and handling
//! of a peer that dies mid-frame; none of that exists here. Oversized messages show up
//! as `MSG_TRUNC`, too many descriptors as `MSG_CTRUNC`. One quirk: an empty message
//! reads as 0 bytes, like end-of-stream, so empty frames are forbidden on send and a
//! 0-byte read is classified with `poll(POLLRDHUP)`.
//!
//! **Limits.** A frame carries 1..=[`MAX_FRAME_BYTES`] (64 KiB) and at most
//! [`MAX_FRAME_FDS`] (16) descriptors. Sending more is a typed error and sends
//! nothing; *receiving* more is a protocol violation: every descriptor that arrived is
//! closed, the connection is shut down and the error returned. Received descriptors
//! are [`OwnedFd`](std::os::fd::OwnedFd)s created close-on-exec (`MSG_CMSG_CLOEXEC`),
//! so none leaks into a child process or outlives its owner. Sockets are nonblocking;
//! every wait is a `poll` with a deadline (sends wait for space up to a send timeout,
//! [`DEFAULT_SEND_TIMEOUT`]), `MSG_NOSIGNAL` keeps `SIGPIPE` away, and a peer that hung
//! up is the distinct error `Closed` on both send and receive, because leases are tied
//! to the connection's life. Frames a peer sent before dying are still delivered first
//! (Linux reports `ECONNRESET` ahead of them; we read past it). Back-pressure is the
//! sender's `SO_SNDBUF` (about 200 KiB of kernel buffer by default, i.e. a few hundred
//! small frames or four maximal ones in flight): past that `send` waits, then times
//! out. The raw socket is exposed with [`AsFd`](std::os::fd::AsFd) for callers that
//! poll many connections.
//!
//! **Credentials.** On accept *and* on connect we read `SO_PEERCRED` (pid, euid, egid,
//! recorded by the kernel at `connect`/`listen` time; the peer cannot forge them) and
//! expose it as [`PeerCred`]. An [`AccessPolicy`] decides on the uid: by default only
//! our own effective uid (the reference design's sockets were unauthenticated). The
//! listener applies its policy before `accept` returns: a refused peer is closed at
//! once (it sees `Closed`), counted ([`ControlListener::stats`]) and logged with
//! `warn!` once per uid, then at most once a minute with the number suppressed. The
//! connecting side checks the listener's uid too ([`ControlConn::connect`] uses the
//! same-uid policy), so a process of another user that advertises a socket cannot hand
//! us descriptors. The uid check is the *first* gate; capabilities inside the protocol
//! are the second.
//!
//! **Floods.** A listener keeps at most [`DEFAULT_MAX_CONNECTIONS`] accepted
//! connections alive (configurable); permitted peers beyond that are closed on accept,
//! counted and logged at most once a minute. The kernel's backlog (128) bounds pending
//! connections; refused peers cost one `accept` and one `close`.
//!
//! **Tracing.** TRACE for every syscall with its arguments, DEBUG for every error
//! returned, WARN for refused peers and for socket files that could not be removed.
//! All `unsafe` (`recvmsg` with its zeroed `msghdr`, `poll`, and the two adoptions of
//! kernel-issued descriptors as `OwnedFd`) is in the private `sys` module; control
//! messages are parsed from bytes with safe code.

mod conn;
mod cred;
mod lifeline;
mod listener;
mod name;
mod sys;

use std::time::Duration;

pub use conn::{ConnectError, ControlConn, Frame, RecvError, SendError};
pub use cred::{AccessPolicy, PeerCred, PeerProcess};
pub use lifeline::{Lifeline, Watch, WatchError};
pub use listener::{AcceptError, BindError, ControlListener, ListenerStats};
pub use name::{
    DecodeNameError, InvalidNameError, MAX_SOCKET_NAME_BYTES, RuntimeDirError, SocketName, default_runtime_dir,
    ensure_runtime_dir,
};

/// Largest payload of one frame, in bytes (64 KiB).
pub const MAX_FRAME_BYTES: usize = 64 * 1024;

/// Most descriptors attached to one frame.
pub const MAX_FRAME_FDS: usize = 16;

/// Default limit of live connections accepted by one [`ControlListener`] (see
/// [`ControlListener::with_max_connections`]). A publisher keeps one connection per
/// subscriber process, served by one thread, plus one that watches its lifeline.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Default time [`ControlConn::send`] waits for socket space before
/// [`SendError::Timeout`].
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ControlConn>();
        check::<ControlListener>();
        check::<Frame>();
        check::<SocketName>();
        check::<AccessPolicy>();
        check::<SendError>();
        check::<RecvError>();
        check::<ConnectError>();
        check::<BindError>();
        check::<AcceptError>();
    }
}
