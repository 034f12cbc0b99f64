//! Host-side operating-system calls: sealed memfd blocks, the kernel boot id, and which
//! mapping of this process holds an address.
//!
//! Like [`crate::cuda::sys`] for the driver, this is the one place with raw `libc`
//! calls for memory; the safe owner above them is [`HostBlock`].

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// An anonymous, sealed shared-memory file (`memfd_create`) mapped read-write here.
///
/// Nothing is named on a filesystem, so nothing survives a crash. The size is sealed
/// (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) so a peer that maps it cannot be made
/// to fault by the creator truncating it later; [`HostBlock::import`] checks the seal
/// and the size before mapping a received descriptor.
#[derive(Debug)]
pub struct HostBlock {
    ptr: NonNull<u8>,
    size: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory, valid from any thread until `Drop`
// unmaps it; `HostBlock` hands out raw addresses only, and whoever writes through them
// synchronises (the pool gives a block to one writer at a time).
unsafe impl Send for HostBlock {}
// SAFETY: as for Send; `&self` methods read only immutable fields.
unsafe impl Sync for HostBlock {}

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

impl HostBlock {
    /// Creates a sealed memfd of `size` bytes (zero-filled) and maps it.
    pub fn create(name: &CStr, size: usize) -> io::Result<Self> {
        if size == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero-sized block"));
        }
        // SAFETY: `name` is NUL-terminated; the flags are valid for memfd_create.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = libc::off_t::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `fd` is an open memfd; ftruncate takes no pointers.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is an open memfd created with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        tracing::trace!(fd = fd.as_raw_fd(), size, "memfd_create + ftruncate + seal");
        Self::map(fd, size)
    }

    /// Maps a received memfd of at least `size` bytes. Refuses a descriptor that is
    /// not sealed against shrinking or is smaller than `size` (mapping it could fault).
    pub fn import(fd: OwnedFd, size: usize) -> io::Result<Self> {
        // SAFETY: `fd` is an open descriptor; F_GET_SEALS takes no pointer.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "received memfd is not sealed against shrinking"));
        }
        // SAFETY: an all-zero `stat` is a valid value to be overwritten by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer and `fd` is open.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if size == 0 || (st.st_size as u64) < size as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("received memfd holds {} bytes, descriptor claims {size}", st.st_size),
            ));
        }
        Self::map(fd, size)
    }

    fn map(fd: OwnedFd, size: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of `size` bytes of `fd`, whose size is at least
        // `size` (checked or set by both callers); no address hint.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, size, fd })
    }

    /// Address of the first byte in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The descriptor, to send to a peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`size` is exactly the mapping made in `map`, unmapped once.
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.size) } != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "munmap failed in drop");
        }
    }
}

/// This kernel's boot id (`/proc/sys/kernel/random/boot_id`): equal for every process
/// and container on one running kernel, different after a reboot or on another host.
pub fn boot_id() -> io::Result<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let id = s.trim();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unexpected boot_id {id:?}")));
    }
    Ok(id.to_ascii_lowercase())
}

/// A mapping of this process, from `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// The mapped file's path (empty for anonymous memory).
    pub path: String,
}

/// The mapping of this process that holds address `p`, if any.
pub fn mapping_of(p: *const u8) -> io::Result<Option<Mapping>> {
    let p = p as usize;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    Ok(maps.lines().find_map(|line| {
        // start-end perms offset dev inode path
        let mut fields = line.split_whitespace();
        let (a, b) = fields.next()?.split_once('-')?;
        let (start, end) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
        (start <= p && p < end).then(|| Mapping {
            start,
            len: end - start,
            path: fields.nth(4).unwrap_or("").to_owned(),
        })
    }))
}

/// Whether process `pid` has exited (no `/proc/<pid>`, or a zombie waiting to be
/// reaped). `false` when it cannot tell (`pid <= 0`: a peer in another PID namespace).
pub fn process_gone(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => {
            stat.rsplit_once(')').is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
        }
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_roundtrip_and_seals() {
        let a = HostBlock::create(c"zcs-test", 1 << 16).unwrap();
        // SAFETY: the block is 64 KiB, mapped read-write, and used by this thread only.
        let a_bytes = unsafe { std::slice::from_raw_parts_mut(a.as_ptr(), a.size()) };
        a_bytes[100] = 42;
        let dup = a.fd().try_clone_to_owned().unwrap();
        let b = HostBlock::import(dup, 1 << 16).unwrap();
        // SAFETY: `b` maps the same 64 KiB; nothing writes it while this slice lives.
        let b_bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.size()) };
        assert_eq!(b_bytes[100], 42);
        // A descriptor that claims more than the file holds is refused.
        let dup = a.fd().try_clone_to_owned().unwrap();
        assert!(HostBlock::import(dup, 1 << 20).is_err());
    }

    #[test]
    fn unsealed_fd_is_refused() {
        // SAFETY: plain memfd_create with a static name.
        let raw = unsafe { libc::memfd_create(c"zcs-unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: valid descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        let err = HostBlock::import(fd, 4096).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn process_gone_tells_live_from_exited() {
        assert!(!process_gone(std::process::id() as i32));
        assert!(!process_gone(0), "unknown pid: cannot tell");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let t = std::time::Instant::now();
        while !process_gone(pid) {
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "exited child (zombie) not seen as gone");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(process_gone(pid));
    }

    #[test]
    fn boot_id_is_stable() {
        assert_eq!(boot_id().unwrap(), boot_id().unwrap());
    }
}
