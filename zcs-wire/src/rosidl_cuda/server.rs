//! Our blocks' FDs served to the CUDA buffer backend's subscribers, as its publishers
//! serve theirs: one listening socket per block, one byte and the FD per connection
//! (`cuda_buffer_ipc_manager.cpp:159-371` and `401-427` of `cuda_buffer` 0.1.2).
//!
//! Unlike theirs, which live at `/tmp/cuda_vmm_<pid>_<block>.sock` with whatever mode
//! the umask leaves, ours live in a directory of ours with mode 0700, and each
//! connection's peer must be our user (`SO_PEERCRED`). Every process that was given a
//! block's FD is remembered: the backend's shared count does not say who holds a block,
//! and these are the only processes that can (their importers connect once per block
//! and cache the mapping).
//!
//! One thread serves every socket of the process: it polls the listeners and a wake-up
//! socket, and owns the listeners, so that a socket is never closed under its poll.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::fd_socket::{Served, serve_block_fd};

/// The longest socket path the backend's importers can connect to: they copy the
/// descriptor's path into `sun_path` with room for 107 bytes and a NUL
/// (`cuda_buffer_ipc_manager.cpp:63`).
pub const MAX_SOCKET_PATH: usize = 107;

/// Where [`BlockServer::start`] puts our sockets by default: `zcs-cuda-vmm-<uid>` in the
/// temporary directory.
pub fn default_dir() -> PathBuf {
    std::env::temp_dir().join(format!("zcs-cuda-vmm-{}", nix::unistd::geteuid().as_raw()))
}

enum Command {
    Add { block: u32, listener: UnixListener, fd: OwnedFd, peers: Arc<Mutex<Vec<i32>>> },
    Remove { block: u32 },
}

struct Inner {
    dir: PathBuf,
    commands: Mutex<Sender<Command>>,
    wake: UnixStream,
}

impl Inner {
    fn send(&self, c: Command) {
        let sent = self.commands.lock().map(|tx| tx.send(c).is_ok()).unwrap_or(false);
        // A byte to wake the poll; a full buffer means a wake-up is pending anyway.
        if sent {
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// The process's server of block sockets. Cheap to clone; its thread ends when the last
/// clone and the last [`ServedSocket`] are gone.
#[derive(Clone)]
pub struct BlockServer(Arc<Inner>);

impl std::fmt::Debug for BlockServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockServer").field("dir", &self.0.dir).finish()
    }
}

impl BlockServer {
    /// Starts serving sockets in `dir`, creating it with mode 0700 if absent. An existing
    /// `dir` must be a directory (not a symbolic link) of our user that no one else may
    /// enter.
    ///
    /// # Errors
    /// The directory cannot be made or is not private to us, or the thread cannot start.
    pub fn start(dir: &Path) -> io::Result<Self> {
        private_dir(dir)?;
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        let (tx, rx) = channel();
        std::thread::Builder::new().name("zcs-rosidl-fds".into()).spawn(move || run(&rx, woken))?;
        Ok(Self(Arc::new(Inner { dir: dir.to_owned(), commands: Mutex::new(tx), wake })))
    }

    /// The directory of the sockets.
    pub fn dir(&self) -> &Path {
        &self.0.dir
    }

    /// Serves `fd` as block `block` of this process, at `<dir>/<pid>_<block>.sock`, until
    /// the returned socket is dropped. A socket left at that path (by a dead process of
    /// ours that had our pid) is replaced.
    ///
    /// # Errors
    /// The path is longer than [`MAX_SOCKET_PATH`], or the socket cannot be bound.
    pub fn serve(&self, block: u32, fd: OwnedFd) -> io::Result<ServedSocket> {
        let path = self.0.dir.join(format!("{}_{block}.sock", std::process::id()));
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("socket path {} is longer than the {MAX_SOCKET_PATH} bytes importers accept", path.display()),
            ));
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        let peers = Arc::new(Mutex::new(Vec::new()));
        self.0.send(Command::Add { block, listener, fd, peers: Arc::clone(&peers) });
        Ok(ServedSocket { server: Arc::clone(&self.0), block, path, peers })
    }
}

/// One block's socket; stops serving and removes its path when dropped.
pub struct ServedSocket {
    server: Arc<Inner>,
    block: u32,
    path: PathBuf,
    peers: Arc<Mutex<Vec<i32>>>,
}

impl std::fmt::Debug for ServedSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedSocket").field("path", &self.path).field("peers", &self.peers()).finish()
    }
}

impl ServedSocket {
    /// The socket's path (what descriptors name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The processes the block's FD was given to, in order.
    pub fn peers(&self) -> Vec<i32> {
        self.peers.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

impl Drop for ServedSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.server.send(Command::Remove { block: self.block });
    }
}

/// Creates `dir` with mode 0700, or checks that the existing one is ours and private.
fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            // The umask may have taken bits away, never added any; set it exactly anyway.
            return std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory of uid {me} closed to others (uid {}, mode {:o})",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

struct Listening {
    listener: UnixListener,
    fd: OwnedFd,
    peers: Arc<Mutex<Vec<i32>>>,
}

fn run(commands: &Receiver<Command>, mut woken: UnixStream) {
    let mut sockets: HashMap<u32, Listening> = HashMap::new();
    loop {
        loop {
            match commands.try_recv() {
                Ok(Command::Add { block, listener, fd, peers }) => {
                    sockets.insert(block, Listening { listener, fd, peers });
                }
                Ok(Command::Remove { block }) => {
                    sockets.remove(&block);
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
            }
        }
        let order: Vec<u32> = sockets.keys().copied().collect();
        let mut fds = Vec::with_capacity(order.len() + 1);
        fds.push(PollFd::new(woken.as_fd(), PollFlags::POLLIN));
        fds.extend(order.iter().map(|b| PollFd::new(sockets[b].listener.as_fd(), PollFlags::POLLIN)));
        if let Err(e) = poll(&mut fds, PollTimeout::NONE) {
            if e != nix::errno::Errno::EINTR {
                tracing::warn!(error = %e, "block sockets: poll failed; no more FDs are served");
                return;
            }
            continue;
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
        drop(fds);
        if ready[0] {
            let mut buf = [0u8; 64];
            match woken.read(&mut buf) {
                Ok(0) => return, // every handle gone
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "block sockets: the wake-up socket failed; no more FDs are served");
                    return;
                }
            }
        }
        for (block, _) in order.iter().zip(&ready[1..]).filter(|(_, r)| **r) {
            let Some(s) = sockets.get(block) else { continue };
            serve_waiting(*block, s);
        }
    }
}

/// Serves every connection waiting on one listener.
fn serve_waiting(block: u32, s: &Listening) {
    loop {
        match serve_block_fd(&s.listener, s.fd.as_fd()) {
            Ok(Served::To { pid }) => {
                if let Ok(mut peers) = s.peers.lock()
                    && !peers.contains(&pid)
                {
                    peers.push(pid);
                }
            }
            Ok(Served::Refused { .. }) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::debug!(block, error = %e, "block socket: a connection failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rosidl_cuda::receive_block_fd;
    use std::os::fd::BorrowedFd;
    use std::time::Duration;

    fn memfd() -> OwnedFd {
        nix::sys::memfd::memfd_create(c"zcs-test-block", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap()
    }

    fn inode(fd: BorrowedFd<'_>) -> u64 {
        nix::sys::stat::fstat(fd).unwrap().st_ino
    }

    fn fresh_dir(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("zcs-server-{tag}-{}-{}", std::process::id(), rand::random::<u32>()))
    }

    #[test]
    fn a_served_block_goes_to_our_user_and_its_takers_are_remembered() {
        let dir = fresh_dir("ok");
        let server = BlockServer::start(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "a private directory");
        let block = memfd();
        let want = inode(block.as_fd());
        let socket = server.serve(7, block).unwrap();
        assert_eq!(socket.path(), dir.join(format!("{}_7.sock", std::process::id())));
        assert!(socket.peers().is_empty());
        for _ in 0..3 {
            let got = receive_block_fd(socket.path(), std::process::id() as i32, Duration::from_secs(5)).unwrap();
            assert_eq!(inode(got.as_fd()), want, "the same open file");
        }
        assert_eq!(socket.peers(), vec![std::process::id() as i32], "one taker, once");

        // Two blocks at once, then one of them gone: the other is still served.
        let other = server.serve(8, memfd()).unwrap();
        let path = socket.path().to_owned();
        drop(socket);
        assert!(!path.exists(), "the path is removed with the socket");
        assert!(receive_block_fd(&path, std::process::id() as i32, Duration::from_millis(200)).is_err());
        receive_block_fd(other.path(), std::process::id() as i32, Duration::from_secs(5)).unwrap();
        drop((other, server));
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_can_enter_or_a_link_is_refused() {
        let open = fresh_dir("open");
        std::fs::DirBuilder::new().mode(0o755).create(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = BlockServer::start(&open).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");

        let link = fresh_dir("link");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&open, &link).unwrap();
        let err = BlockServer::start(&link).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir(&open).unwrap();
    }

    /// Another user cannot reach a socket: the directory does not let them in (and the
    /// server would turn them away by their credentials). Needs root, to run a client as
    /// another user; says so otherwise.
    #[test]
    fn another_user_gets_no_fd() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            println!("another_user_gets_no_fd: not root, so no other user to run a client as; checked in CI");
            return;
        }
        let dir = fresh_dir("user");
        let server = BlockServer::start(&dir).unwrap();
        let socket = server.serve(9, memfd()).unwrap();
        let client = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1])\nexcept PermissionError:\n sys.exit(3)\nsys.exit(0)";
        let status = std::process::Command::new("python3")
            .args(["-c", client, &socket.path().display().to_string()])
            .uid(65534)
            .gid(65534)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(3), "another user connected to our block socket");
        assert!(socket.peers().is_empty(), "nobody was given the FD");
        drop((socket, server));
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_path_importers_cannot_hold_is_refused() {
        let dir = std::env::temp_dir().join("z".repeat(MAX_SOCKET_PATH));
        let inner = Inner { dir, commands: Mutex::new(channel().0), wake: UnixStream::pair().unwrap().0 };
        let server = BlockServer(Arc::new(inner));
        let err = server.serve(1, memfd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }
}
