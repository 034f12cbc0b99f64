//! The raw calls of `rosidl_cuda`: the only `unsafe` in it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

/// How [`open_rw`] treats a missing file.
#[derive(Clone, Copy)]
pub(super) enum Create {
    /// Open an existing file only.
    No,
    /// Create it (for our user only) if absent.
    IfAbsent,
    /// Create it (for our user only); an existing file is an error.
    New,
}

/// Opens `path` read-write without following a symbolic link, closed on exec.
pub(super) fn open_rw(path: &std::path::Path, create: Create) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    match create {
        Create::No => {}
        Create::IfAbsent => {
            o.create(true);
        }
        Create::New => {
            o.create_new(true);
        }
    }
    o.open(path)
}

/// Takes ownership of an FD the kernel just gave us (`SCM_RIGHTS`).
pub(super) fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was installed in this process by the `recvmsg` that returned it and
    // nothing else refers to it: this is its only owner, and it is closed once.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Maps `len` bytes of `fd` shared and read-write.
pub(super) fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a new mapping chosen by the kernel (no address hint, no MAP_FIXED), so it
    // overlaps nothing of ours; `fd` is open for the call; failure is checked below.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Unmaps a mapping of [`map_shared`].
///
/// # Safety
/// `p` and `len` are exactly one mapping of [`map_shared`], not used after this.
pub(super) unsafe fn unmap(p: NonNull<u8>, len: usize) {
    // SAFETY: the caller's contract: the whole mapping, unused from here on.
    if unsafe { libc::munmap(p.as_ptr().cast(), len) } != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "munmap of a block's shared bytes failed");
    }
}

/// A POSIX named semaphore, opened (and created at 1, for our user only, if absent).
pub(super) struct NamedSemaphore(NonNull<libc::sem_t>);

impl NamedSemaphore {
    /// Opens `name` (`/…`), creating it with value 1 and mode 0600 if it does not exist.
    pub(super) fn open(name: &str) -> io::Result<Self> {
        let c = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: `c` is a NUL-terminated name; the variadic mode and value are passed as
        // the C types sem_open reads (mode_t promoted to c_uint, unsigned int).
        let p = unsafe { libc::sem_open(c.as_ptr(), libc::O_CREAT, 0o600 as libc::c_uint, 1 as libc::c_uint) };
        if p == libc::SEM_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p).map(Self).ok_or_else(|| io::Error::other("sem_open returned null"))
    }

    /// Takes the semaphore, waiting at most `limit`; whether it was taken.
    pub(super) fn wait(&self, limit: std::time::Duration) -> bool {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        let nanos = ts.tv_nsec as u64 + u64::from(limit.subsec_nanos());
        ts.tv_sec += limit.as_secs() as libc::time_t + (nanos / 1_000_000_000) as libc::time_t;
        ts.tv_nsec = (nanos % 1_000_000_000) as _;
        loop {
            // SAFETY: the semaphore is open while `self` lives; `ts` is valid.
            if unsafe { libc::sem_timedwait(self.0.as_ptr(), &ts) } == 0 {
                return true;
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return false;
            }
        }
    }

    /// Gives the semaphore back.
    pub(super) fn post(&self) {
        // SAFETY: the semaphore is open while `self` lives.
        if unsafe { libc::sem_post(self.0.as_ptr()) } != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "sem_post failed");
        }
    }

    /// Removes the name `name` (its users keep their handles).
    pub(super) fn unlink(name: &str) {
        if let Ok(c) = std::ffi::CString::new(name) {
            // SAFETY: a NUL-terminated name.
            unsafe { libc::sem_unlink(c.as_ptr()) };
        }
    }
}

impl Drop for NamedSemaphore {
    fn drop(&mut self) {
        // SAFETY: opened by `open`, closed once, not used after this.
        unsafe { libc::sem_close(self.0.as_ptr()) };
    }
}
