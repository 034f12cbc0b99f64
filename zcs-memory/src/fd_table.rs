//! The process's file-descriptor table, grown once, up front.
//!
//! Every block is a descriptor (its memfd or exported handle, and one per import of it),
//! so a process that publishes or reads blocks opens descriptors by the dozen. Linux
//! grows a process's descriptor table by doubling (64, 128, 256, … slots), and in a
//! process with more than one thread each growth waits for an RCU grace period
//! (`expand_fdtable` in `fs/file.c`): the thread that opens the descriptor (a loan that
//! allocates a block, an import) stands still for it. Measured on an H200 host: a loan
//! of 29–34 ms each time the table passed 64 and 128 slots, against 5 µs otherwise.
//! [`reserve`] grows the table once, when a session opens, where that wait costs
//! nothing; the table never shrinks.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The size reserved so far (0: none).
static RESERVED: AtomicUsize = AtomicUsize::new(0);

/// Grows this process's descriptor table to at least `slots` slots, or to the soft
/// `RLIMIT_NOFILE` if that is lower (descriptors beyond it cannot be opened anyway), by
/// duplicating a descriptor to the last slot and closing the copy. Returns the size
/// reserved; a later call asking no more does nothing.
///
/// # Errors
/// The OS error of `getrlimit`, `memfd_create` or `fcntl(F_DUPFD_CLOEXEC)`; the table is
/// then as it was.
pub fn reserve(slots: usize) -> io::Result<usize> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid out-pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let cap = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX).min(libc::c_int::MAX as usize);
    let want = slots.min(cap);
    if want <= 1 || RESERVED.load(Ordering::Acquire) >= want {
        return Ok(want);
    }
    // SAFETY: the name is NUL-terminated; the flags are valid for memfd_create.
    let raw = unsafe { libc::memfd_create(c"zcs-fd-table".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor that we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let last = (want - 1) as libc::c_int; // at most c_int::MAX - 1 (capped above)
    // SAFETY: `fd` is open; F_DUPFD_CLOEXEC takes an integer, the lowest slot to use.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, last) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl returned a fresh descriptor that we now own; dropping it closes it.
    drop(unsafe { OwnedFd::from_raw_fd(copy) });
    RESERVED.fetch_max(want, Ordering::AcqRel);
    Ok(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's size as the kernel reports it (`FDSize` of `/proc/self/status`).
    fn table_size() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let line = status.lines().find(|l| l.starts_with("FDSize:")).expect("an FDSize line");
        line["FDSize:".len()..].trim().parse().expect("a number")
    }

    /// Descriptors of this process open on the memfd `reserve` makes (other tests open
    /// and close descriptors meanwhile: only these are ours).
    fn ours_open() -> usize {
        let fds = std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd");
        let targets = fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok());
        targets.filter(|t| t.to_string_lossy().contains("memfd:zcs-fd-table")).count()
    }

    #[test]
    fn the_table_grows_once_and_no_descriptor_stays_open() {
        let got = reserve(1000).expect("reserve");
        assert!(got <= 1000 && got > 64, "{got}");
        assert!(table_size() >= got, "FDSize {} after reserving {got}", table_size());
        assert_eq!(ours_open(), 0, "the duplicate and the memfd are closed");
        assert_eq!(reserve(500).expect("a smaller reservation"), 500, "already reserved: nothing to do");
        assert_eq!(ours_open(), 0);
    }
}
