//! The raw calls of `rosidl_cuda`: the only `unsafe` in it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

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
