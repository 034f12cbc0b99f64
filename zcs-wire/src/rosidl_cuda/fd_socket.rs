//! A block's FD as the CUDA buffer backend hands it out: the publisher listens on one
//! stream socket per block; each connection gets one data byte (`X`) with the block's
//! FD in an `SCM_RIGHTS` message, then the publisher closes it. There is no request,
//! version or credential check on their side (`cuda_buffer_ipc_manager.cpp:159-371`
//! serves, `584-636` receives, in `cuda_buffer` 0.1.2).
//!
//! Ours, receiving, accepts the FD only from the process the descriptor names, running
//! as our user; serving, it gives the FD only to our user.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt};
use sendfd::{RecvWithFd, SendWithFd};

use super::sys;

/// The data byte that comes with the FD.
const FD_BYTE: u8 = b'X';

/// Why a block's FD was not received.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockFdError {
    /// Connecting to the block's socket failed (its publisher gone, say).
    #[error("cannot connect to the block socket {path}")]
    Connect {
        /// The socket's path.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading the peer's credentials, or setting a time-out, failed.
    #[error("cannot {what} on the block socket")]
    Socket {
        /// What failed.
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The socket belongs to another process than the descriptor's publisher, or to
    /// another user.
    #[error("the block socket is served by pid {pid} uid {uid}, not by pid {expected_pid} of our uid {our_uid}")]
    WrongPeer {
        /// The serving process.
        pid: i32,
        /// Its user.
        uid: u32,
        /// The descriptor's publisher.
        expected_pid: i32,
        /// Ours.
        our_uid: u32,
    },
    /// Receiving failed or timed out.
    #[error("no FD received from the block socket")]
    Recv(#[source] io::Error),
    /// The publisher sent something else than one byte `X` and one FD.
    #[error("the block socket sent {bytes} byte(s) ({first:?}) and {fds} FD(s), not b'X' and one FD")]
    Malformed {
        /// Data bytes received.
        bytes: usize,
        /// The first of them.
        first: Option<u8>,
        /// FDs received (closed).
        fds: usize,
    },
}

fn socket_err(what: &'static str) -> impl FnOnce(io::Error) -> BlockFdError {
    move |source| BlockFdError::Socket { what, source }
}

/// Receives the FD of a block from its socket at `path`, which must be served by
/// process `publisher_pid` (the descriptor's `vmm_pid`) running as our user; waits at
/// most `timeout` for it.
///
/// # Errors
/// [`BlockFdError`]: the socket unreachable, its peer not the publisher or not our
/// user, nothing or something else received.
pub fn receive_block_fd(path: &Path, publisher_pid: i32, timeout: Duration) -> Result<OwnedFd, BlockFdError> {
    let stream = UnixStream::connect(path)
        .map_err(|source| BlockFdError::Connect { path: path.display().to_string(), source })?;
    let cred = getsockopt(&stream, sockopt::PeerCredentials).map_err(|e| socket_err("read SO_PEERCRED")(e.into()))?;
    let our_uid = nix::unistd::geteuid().as_raw();
    if cred.pid() != publisher_pid || cred.uid() != our_uid {
        return Err(BlockFdError::WrongPeer { pid: cred.pid(), uid: cred.uid(), expected_pid: publisher_pid, our_uid });
    }
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))).map_err(socket_err("set a read time-out"))?;
    let mut byte = [0u8; 2];
    let mut fds = [-1; 2];
    let (n, nfds) = stream.recv_with_fd(&mut byte, &mut fds).map_err(BlockFdError::Recv)?;
    let mut owned: Vec<OwnedFd> = fds[..nfds].iter().map(|&fd| sys::owned(fd)).collect();
    if n != 1 || byte[0] != FD_BYTE || owned.len() != 1 {
        return Err(BlockFdError::Malformed { bytes: n, first: (n > 0).then_some(byte[0]), fds: owned.len() });
    }
    Ok(owned.pop().expect("one FD, checked above"))
}

/// What one connection to a block's socket got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The FD went to process `pid` of our user.
    To {
        /// The peer's process.
        pid: i32,
    },
    /// A peer of another user was turned away.
    Refused {
        /// The peer's process.
        pid: i32,
        /// Its user.
        uid: u32,
    },
}

/// Serves one connection of `listener` as the backend's block sockets do, giving `fd`
/// to a peer of our user only.
///
/// # Errors
/// Accepting (`WouldBlock` on a non-blocking listener with no connection waiting),
/// reading the peer's credentials or sending failed.
pub fn serve_block_fd(listener: &UnixListener, fd: BorrowedFd<'_>) -> io::Result<Served> {
    let (mut stream, _) = listener.accept()?;
    stream.set_nonblocking(false)?;
    let cred = getsockopt(&stream, sockopt::PeerCredentials).map_err(io::Error::from)?;
    if cred.uid() != nix::unistd::geteuid().as_raw() {
        tracing::warn!(pid = cred.pid(), uid = cred.uid(), "block socket: a peer of another user turned away");
        return Ok(Served::Refused { pid: cred.pid(), uid: cred.uid() });
    }
    // A peer that never reads cannot hold the server: one byte fits any socket buffer,
    // and the write time-out bounds the rest.
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let sent = stream.send_with_fd(&[FD_BYTE], &[fd.as_raw_fd()])?;
    if sent != 1 {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "the FD byte was not sent"));
    }
    stream.flush()?;
    Ok(Served::To { pid: cred.pid() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn memfd() -> OwnedFd {
        nix::sys::memfd::memfd_create(c"zcs-test-block", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap()
    }

    fn socket_path(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("zcs-block-{tag}-{}-{}.sock", std::process::id(), rand::random::<u32>()))
    }

    fn inode(fd: BorrowedFd<'_>) -> u64 {
        nix::sys::stat::fstat(fd).unwrap().st_ino
    }

    #[test]
    fn the_fd_comes_from_the_named_process_of_our_user() {
        let path = socket_path("ok");
        let listener = UnixListener::bind(&path).unwrap();
        let block = memfd();
        let want = inode(block.as_fd());
        let server = std::thread::spawn(move || serve_block_fd(&listener, block.as_fd()).unwrap());
        let got = receive_block_fd(&path, std::process::id() as i32, Duration::from_secs(5)).unwrap();
        assert_eq!(server.join().unwrap(), Served::To { pid: std::process::id() as i32 });
        assert_eq!(inode(got.as_fd()), want, "the same open file");
        assert_ne!(got.as_raw_fd(), -1);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn another_process_than_the_descriptor_names_is_refused() {
        let path = socket_path("pid");
        let listener = UnixListener::bind(&path).unwrap();
        let block = memfd();
        let server = std::thread::spawn(move || serve_block_fd(&listener, block.as_fd()));
        let err = receive_block_fd(&path, std::process::id() as i32 + 1, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(err, BlockFdError::WrongPeer { expected_pid, .. } if expected_pid == std::process::id() as i32 + 1)
        );
        // The server still sent (it cannot tell); what came is closed unread with the stream.
        let _ = server.join().unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn nothing_listening_and_bad_answers_are_errors() {
        let path = socket_path("none");
        let err = receive_block_fd(&path, 1, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, BlockFdError::Connect { .. }), "{err}");

        // A peer that answers without an FD, or with another byte, or not at all.
        for answer in [&b"X"[..], &b"Y"[..], &b""[..]] {
            let path = socket_path("bad");
            let listener = UnixListener::bind(&path).unwrap();
            let reply = answer.to_vec();
            let server = std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                if !reply.is_empty() {
                    s.write_all(&reply).unwrap();
                }
                // Keep it open past the client's time-out when sending nothing.
                std::thread::sleep(Duration::from_millis(300));
            });
            let err = receive_block_fd(&path, std::process::id() as i32, Duration::from_millis(100)).unwrap_err();
            match answer {
                b"" => assert!(matches!(err, BlockFdError::Recv(_)), "{err}"),
                _ => assert!(matches!(err, BlockFdError::Malformed { bytes: 1, fds: 0, .. }), "{err}"),
            }
            server.join().unwrap();
            std::fs::remove_file(&path).unwrap();
        }
    }
}
