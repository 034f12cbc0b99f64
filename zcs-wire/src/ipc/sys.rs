//! Thin syscall wrappers for the control channel and the lifeline: the only `unsafe`
//! in `ipc`.
//!
//! Each function does one syscall, returns `Errno` on failure and hands back owned
//! resources (`OwnedFd`) as soon as the kernel gives them to us, so nothing above this
//! module ever holds a raw fd number that it must remember to close.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::SockFlag;

use super::MAX_FRAME_FDS;

/// Size of the kernel's `struct cmsghdr` rounded up to `CMSG_ALIGN`
/// (`cmsg_len: size_t, cmsg_level: int, cmsg_type: int`).
const CMSG_HDR_LEN: usize = cmsg_align(size_of::<libc::cmsghdr>());

/// Control buffer for one received frame: room for exactly one `SCM_RIGHTS` message
/// carrying [`MAX_FRAME_FDS`] descriptors (`CMSG_SPACE(MAX_FRAME_FDS * sizeof(int))`).
/// A sender that attaches more makes the kernel set `MSG_CTRUNC`; the surplus is never
/// installed in our fd table.
const CONTROL_LEN: usize = CMSG_HDR_LEN + cmsg_align(MAX_FRAME_FDS * size_of::<RawFd>());

/// The control area, aligned like a `cmsghdr`.
#[repr(C, align(8))]
struct ControlBuf([u8; CONTROL_LEN]);

/// `CMSG_ALIGN` of Linux: round up to the size of `size_t`.
const fn cmsg_align(len: usize) -> usize {
    (len + size_of::<usize>() - 1) & !(size_of::<usize>() - 1)
}

/// What one `recvmsg` returned.
#[derive(Debug)]
pub(super) struct Received {
    /// Bytes of payload written into the caller's buffer.
    pub len: usize,
    /// `msg_flags` as set by the kernel (`MSG_TRUNC`, `MSG_CTRUNC`, ...).
    pub flags: libc::c_int,
    /// Every descriptor that arrived, already owned: dropping them closes them.
    pub fds: Vec<OwnedFd>,
    /// A control message other than `SCM_RIGHTS` arrived, or the control area was
    /// malformed.
    pub foreign_control: bool,
}

/// Take ownership of a descriptor that the kernel installed for us during `recvmsg`.
fn adopt_received_fd(raw: RawFd) -> OwnedFd {
    // SAFETY: `raw` was read from an SCM_RIGHTS control message that the kernel wrote
    // for this very recvmsg call, so it is an open descriptor newly installed in our fd
    // table. No other code in the process has seen the number, and `parse_control`
    // visits each slot once, so this `OwnedFd` is its only owner.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// Walk the control area that the kernel filled in. Pure byte parsing (kernel layout:
/// `size_t cmsg_len; int cmsg_level; int cmsg_type; data...`), no pointer arithmetic.
fn parse_control(control: &[u8]) -> (Vec<OwnedFd>, bool) {
    const LEN_SZ: usize = size_of::<usize>();
    const INT_SZ: usize = size_of::<libc::c_int>();
    let mut fds = Vec::new();
    let mut foreign = false;
    let mut off = 0usize;
    while control.len().saturating_sub(off) >= CMSG_HDR_LEN {
        let hdr = &control[off..off + CMSG_HDR_LEN];
        let mut len_bytes = [0u8; LEN_SZ];
        len_bytes.copy_from_slice(&hdr[..LEN_SZ]);
        let cmsg_len = usize::from_ne_bytes(len_bytes);
        let mut int_bytes = [0u8; INT_SZ];
        int_bytes.copy_from_slice(&hdr[LEN_SZ..LEN_SZ + INT_SZ]);
        let level = libc::c_int::from_ne_bytes(int_bytes);
        int_bytes.copy_from_slice(&hdr[LEN_SZ + INT_SZ..LEN_SZ + 2 * INT_SZ]);
        let kind = libc::c_int::from_ne_bytes(int_bytes);
        if cmsg_len < CMSG_HDR_LEN || cmsg_len > control.len() - off {
            // Malformed: stop here; nothing beyond can be trusted.
            foreign = true;
            break;
        }
        let data = &control[off + CMSG_HDR_LEN..off + cmsg_len];
        if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
            for chunk in data.chunks_exact(size_of::<RawFd>()) {
                let mut b = [0u8; size_of::<RawFd>()];
                b.copy_from_slice(chunk);
                let raw = RawFd::from_ne_bytes(b);
                if raw >= 0 {
                    fds.push(adopt_received_fd(raw));
                }
            }
        } else {
            foreign = true;
        }
        off += cmsg_align(cmsg_len);
    }
    (fds, foreign)
}

/// `recvmsg(2)` of one message into `buf`, collecting any `SCM_RIGHTS` descriptors.
///
/// Pass `MSG_CMSG_CLOEXEC` in `flags` so received descriptors are close-on-exec from
/// the moment they exist.
pub(super) fn recvmsg(fd: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> Result<Received, Errno> {
    let mut control = ControlBuf([0u8; CONTROL_LEN]);
    let control_bytes = CONTROL_LEN;
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: `msghdr` is a plain C struct of integers and raw pointers (plus private
    // padding on some libcs); the all-zero bit pattern is a valid value of it.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control_bytes as _;
    tracing::trace!(fd = fd.as_raw_fd(), cap = buf.len(), flags, "recvmsg");
    // SAFETY: `msg` points at one iovec describing `buf` (valid and writable for
    // `buf.len()` bytes) and at `control` (writable for `control_bytes` <= its size);
    // both outlive the call. `fd` is an open descriptor for the duration (BorrowedFd).
    let rc = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
    if rc < 0 {
        return Err(Errno::last());
    }
    let written = (msg.msg_controllen as usize).min(control_bytes);
    let (fds, foreign_control) = parse_control(&control.0[..written]);
    let len = usize::try_from(rc).unwrap_or(0);
    tracing::trace!(fd = fd.as_raw_fd(), len, nfds = fds.len(), msg_flags = msg.msg_flags, "recvmsg ok");
    Ok(Received { len, flags: msg.msg_flags, fds, foreign_control })
}

/// `accept4(2)`; the new descriptor is returned owned.
pub(super) fn accept4(fd: BorrowedFd<'_>, flags: SockFlag) -> Result<OwnedFd, Errno> {
    tracing::trace!(fd = fd.as_raw_fd(), ?flags, "accept4");
    let raw = nix::sys::socket::accept4(fd.as_raw_fd(), flags)?;
    // SAFETY: accept4 succeeded, so `raw` is a new descriptor created by this call and
    // known to nobody else; the returned `OwnedFd` becomes its single owner.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `getsockopt(SO_PEERPIDFD)` (Linux 6.5+): a pidfd of the process that was at the
/// other end of a connected Unix socket when it connected. `ENOPROTOOPT` on older
/// kernels.
pub(super) fn peer_pidfd(fd: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let mut raw: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    tracing::trace!(fd = fd.as_raw_fd(), "getsockopt(SO_PEERPIDFD)");
    // SAFETY: `raw` and `len` are live locals; the kernel writes at most `len` bytes
    // (one int) into `raw` and the actual size into `len`. `fd` stays open (BorrowedFd).
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&raw mut raw).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(Errno::last());
    }
    if raw < 0 || len as usize != size_of::<libc::c_int>() {
        return Err(Errno::EINVAL);
    }
    // SAFETY: the call succeeded, so the kernel installed `raw` as a new descriptor for
    // us (close-on-exec) and nobody else knows the number: the OwnedFd is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `pidfd_open(2)` (Linux 5.3+): a pidfd of process `pid`, close-on-exec.
pub(super) fn pidfd_open(pid: libc::pid_t) -> Result<OwnedFd, Errno> {
    tracing::trace!(pid, "pidfd_open");
    // SAFETY: pidfd_open takes two integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if rc < 0 {
        return Err(Errno::last());
    }
    let raw = RawFd::try_from(rc).map_err(|_| Errno::EBADF)?;
    // SAFETY: the syscall succeeded and returned a new descriptor (pidfds are always
    // close-on-exec) that nobody else knows: the OwnedFd is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `poll(2)` on one descriptor. Returns `revents` (0 on timeout).
pub(super) fn poll1(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout_ms: libc::c_int,
) -> Result<libc::c_short, Errno> {
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 };
    tracing::trace!(fd = pfd.fd, events, timeout_ms, "poll");
    // SAFETY: `pfd` is one initialised pollfd on our stack and nfds is 1; the kernel
    // writes only `revents`. `fd` stays open for the call (BorrowedFd).
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if rc < 0 {
        return Err(Errno::last());
    }
    Ok(if rc == 0 { 0 } else { pfd.revents })
}

/// One entry of the kernel's robust-futex list (`struct robust_list`).
#[repr(C)]
pub(super) struct RobustList {
    pub next: *const RobustList,
}

/// The head of a thread's robust-futex list (`struct robust_list_head`; the ABI is
/// the kernel's `Documentation/locking/robust-futex-ABI.rst`). At the thread's exit,
/// for every entry, the kernel looks at the 32-bit word at `entry + futex_offset`:
/// if it holds the thread's id it sets `FUTEX_OWNER_DIED` there and, when
/// `FUTEX_WAITERS` is set, wakes a waiter on that word.
#[repr(C)]
pub(super) struct RobustListHead {
    pub list: RobustList,
    pub futex_offset: libc::c_long,
    pub list_op_pending: *const RobustList,
}

/// `set_robust_list(2)` for the calling thread. The list and every word it names must
/// stay valid for as long as the thread lives, hence `'static`.
pub(super) fn set_robust_list(head: &'static RobustListHead) -> Result<(), Errno> {
    tracing::trace!(head = ?std::ptr::from_ref(head), "set_robust_list");
    // SAFETY: `head` points to a live, never-freed `robust_list_head` of the size
    // passed; the kernel only stores the address and reads it when this thread exits.
    let rc = unsafe { libc::syscall(libc::SYS_set_robust_list, std::ptr::from_ref(head), size_of::<RobustListHead>()) };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// `gettid(2)`: the calling thread's id in its own PID namespace (what the kernel
/// compares a robust futex word with).
pub(super) fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    tid as u32
}

/// The first four bytes of a shared mapping as a futex word. The peer that shares the
/// mapping may change the word at any time; everything we do with it is atomic.
pub(super) fn futex_word(block: &crate::host::HostBlock) -> &std::sync::atomic::AtomicU32 {
    assert!(block.size() >= 4, "a futex word needs four bytes");
    // SAFETY: the mapping is page-aligned, at least four bytes long (checked above)
    // and stays mapped as long as `block`, which the returned reference borrows.
    // `AtomicU32` has the size and alignment of `u32`; concurrent writes by another
    // process through its own mapping are atomic accesses to the same memory.
    unsafe { &*block.as_ptr().cast::<std::sync::atomic::AtomicU32>() }
}

/// `FUTEX_WAIT` on a word of shared memory (not `FUTEX_PRIVATE_FLAG`: the waker may be
/// another process, or the kernel on a robust-list owner's death): sleeps while
/// `*word == expected`, up to `timeout`. `EAGAIN` (the word changed), `ETIMEDOUT` and
/// `EINTR` are the normal ways out and are returned as such.
pub(super) fn futex_wait_shared(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: Duration,
) -> Result<(), Errno> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, 4-byte aligned u32; `ts` is a valid relative timeout on
    // our stack; uaddr2 and val3 are unused by FUTEX_WAIT.
    let rc = unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &raw const ts, 0usize, 0u32)
    };
    if rc < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// `FUTEX_WAKE` (shared) of up to `n` waiters on `word`, in any process.
pub(super) fn futex_wake_shared(word: &std::sync::atomic::AtomicU32, n: i32) {
    // SAFETY: `word` is a live, 4-byte aligned u32; the other arguments are unused by
    // FUTEX_WAKE.
    let rc = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n, 0usize, 0usize, 0u32) };
    if rc < 0 {
        tracing::debug!(error = %Errno::last(), "FUTEX_WAKE failed");
    }
}

/// A point in time after which an operation gives up. `None` inside means "never"
/// (a timeout too large to represent, e.g. `Duration::MAX`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now.
    pub(super) fn after(timeout: Duration) -> Self {
        Self(Instant::now().checked_add(timeout))
    }

    /// Whether the deadline has passed.
    pub(super) fn expired(&self) -> bool {
        self.0.is_some_and(|t| Instant::now() >= t)
    }

    /// Time left, `None` if unbounded.
    pub(super) fn remaining(&self) -> Option<Duration> {
        self.0.map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// A `poll(2)` timeout: -1 for "forever", otherwise milliseconds rounded up so that
    /// a poll that returns 0 really means the deadline passed.
    fn poll_ms(&self) -> libc::c_int {
        match self.remaining() {
            None => -1,
            Some(left) => {
                let ms = left.as_nanos().div_ceil(1_000_000);
                libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
            }
        }
    }
}

/// Poll `fd` for `events` until ready or `deadline`. `Ok(None)` means timed out;
/// `EINTR` is retried with the remaining time.
pub(super) fn poll_until(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    deadline: Deadline,
) -> Result<Option<libc::c_short>, Errno> {
    loop {
        let ms = deadline.poll_ms();
        match poll1(fd, events, ms) {
            Ok(0) => {
                if ms == 0 || deadline.expired() {
                    return Ok(None);
                }
            }
            Ok(revents) => return Ok(Some(revents)),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn ipc_control_len_fits_max_fds_exactly() {
        // SAFETY: CMSG_SPACE is pure arithmetic on its argument; no memory is touched.
        let expect = unsafe { libc::CMSG_SPACE((MAX_FRAME_FDS * size_of::<RawFd>()) as u32) };
        assert_eq!(CONTROL_LEN, expect as usize);
    }

    #[test]
    fn ipc_parse_control_rejects_garbage_without_panicking() {
        // Lengths that point past the end, below the header, zero: all stop parsing.
        for bad_len in [0usize, 1, CMSG_HDR_LEN - 1, 10_000, usize::MAX] {
            let mut buf = vec![0u8; CMSG_HDR_LEN + 8];
            buf[..size_of::<usize>()].copy_from_slice(&bad_len.to_ne_bytes());
            let (fds, foreign) = parse_control(&buf);
            assert!(fds.is_empty());
            assert!(foreign, "len {bad_len}");
        }
        // Too short for a header: nothing parsed, nothing flagged.
        let (fds, foreign) = parse_control(&[1, 2, 3]);
        assert!(fds.is_empty() && !foreign);
    }

    #[test]
    fn ipc_deadline_max_is_unbounded() {
        let d = Deadline::after(Duration::MAX);
        assert!(!d.expired());
        assert_eq!(d.poll_ms(), -1);
        let z = Deadline::after(Duration::ZERO);
        assert!(z.expired());
        assert_eq!(z.poll_ms(), 0);
    }

    #[test]
    fn ipc_pidfd_open_sees_a_child_exit_and_refuses_bad_pids() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pidfd = pidfd_open(child.id() as libc::pid_t).expect("pidfd_open");
        let running = poll_until(pidfd.as_fd(), libc::POLLIN, Deadline::after(Duration::from_millis(20)));
        assert_eq!(running, Ok(None), "sleep runs");
        child.kill().expect("kill");
        let exited = poll_until(pidfd.as_fd(), libc::POLLIN, Deadline::after(Duration::from_secs(10)));
        assert!(exited.expect("poll").is_some_and(|r| r & libc::POLLIN != 0), "exit seen");
        child.wait().expect("reap");
        assert_eq!(pidfd_open(0).map(drop), Err(Errno::EINVAL));
        assert_eq!(pidfd_open(-1).map(drop), Err(Errno::EINVAL));
    }
}
