//! A block's shared bytes, as the CUDA buffer backend lays them out: the file
//! `/dev/shm/cuda_vmm_<pid>_<block id>` (POSIX shared memory `/cuda_vmm_<pid>_<block id>`),
//! 24 bytes (`cuda_buffer` 0.1.2, `cuda_memory_pool.hpp:39-44`, `cuda_memory_pool.cpp:257-281`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | `refcount`: subscribers holding the block, atomic `i32` |
//! | 8 | 8 | `uid`: the block's current reuse id, atomic `u64` |
//! | 16 | 8 | `publish_timestamp_us`: the publisher's monotonic clock at the first descriptor |
//!
//! Subscribers add 1 **before** comparing the descriptor's reuse id with `uid`, and take
//! it back when the ids differ or once their reads are done
//! (`cuda_buffer_ipc_manager.cpp:445-450`, `469-471`, `489-491`); the publisher reuses a
//! block only at a count ≤ 0 (`cuda_memory_pool.cpp:170-194`). Upstream uses
//! `std::atomic` with its default (sequentially consistent) ordering everywhere; so do we.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::SeqCst};

use super::holds::{BlockFile, Journaled, record_hold, record_release};
use super::sys;

/// Where the backend's shared memory lives.
const SHM_DIR: &str = "/dev/shm";

/// The 24 bytes, as `IPCMetadata` of `cuda_memory_pool.hpp` (x86-64: `refcount` at 0,
/// `uid` at 8, `publish_timestamp_us` at 16).
#[repr(C)]
struct Shared {
    refcount: AtomicI32,
    _pad: u32,
    uid: AtomicU64,
    publish_timestamp_us: AtomicU64,
}

const SIZE: usize = std::mem::size_of::<Shared>();
const _: () = assert!(SIZE == 24 && std::mem::align_of::<Shared>() == 8);

/// Why a block's shared bytes cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockMetaError {
    /// Opening, creating, sizing or mapping the file failed.
    #[error("cannot {what} {path}")]
    Io {
        /// What failed.
        what: &'static str,
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is not a regular file of our user, or too small.
    #[error("{path} is not a block's shared bytes of our user ({why})")]
    Untrusted {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The block was reused since the descriptor was made: its reuse id moved on.
    #[error("the block was reused: reuse id {found:#x}, the descriptor names {expected:#x}")]
    Stale {
        /// The descriptor's id.
        expected: u64,
        /// The block's id now.
        found: u64,
    },
}

/// A mapping of one block's shared bytes.
pub struct BlockMeta {
    shared: NonNull<Shared>,
    path: PathBuf,
    /// The block's identity, for the hold journal (files opened by pid and block).
    file: Option<BlockFile>,
    /// Kept open with the mapping (closing it would not unmap; kept for `fstat`-free
    /// identity in logs and so the file's lifetime is plain).
    _file: File,
}

// SAFETY: the mapping is owned by this value alone (unmapped in Drop) and only read or
// written through atomics, which are safe to use from any thread (and process).
unsafe impl Send for BlockMeta {}
// SAFETY: as above: every access to the shared bytes is atomic.
unsafe impl Sync for BlockMeta {}

impl BlockMeta {
    /// The file of block `block` of process `pid`.
    pub fn path_of(pid: i32, block: u32) -> PathBuf {
        Path::new(SHM_DIR).join(format!("cuda_vmm_{pid}_{block}"))
    }

    /// Opens the shared bytes of block `block` of process `pid` (an importer's side).
    ///
    /// # Errors
    /// As [`BlockMeta::open_at`].
    pub fn open(pid: i32, block: u32) -> Result<Self, BlockMetaError> {
        let mut meta = Self::open_at(&Self::path_of(pid, block))?;
        let stat = meta._file.metadata().map_err(|source| BlockMetaError::Io {
            what: "stat",
            path: meta.path.display().to_string(),
            source,
        })?;
        meta.file = Some(BlockFile { pid, block, dev: stat.dev(), ino: stat.ino() });
        Ok(meta)
    }

    /// The block file's identity when opened with [`BlockMeta::open`].
    pub fn file(&self) -> Option<BlockFile> {
        self.file
    }

    /// Opens the shared bytes at `path`: a regular file (no symbolic link followed) of
    /// our user, of at least 24 bytes.
    ///
    /// # Errors
    /// [`BlockMetaError::Io`] if it cannot be opened or mapped,
    /// [`BlockMetaError::Untrusted`] if it is not such a file.
    pub fn open_at(path: &Path) -> Result<Self, BlockMetaError> {
        let io = |what| move |source| BlockMetaError::Io { what, path: path.display().to_string(), source };
        let file = sys::open_rw(path, sys::Create::No).map_err(io("open"))?;
        let meta = file.metadata().map_err(io("stat"))?;
        let untrusted = |why: String| BlockMetaError::Untrusted { path: path.display().to_string(), why };
        if !meta.file_type().is_file() {
            return Err(untrusted("not a regular file".into()));
        }
        let ours = nix::unistd::geteuid().as_raw();
        if meta.uid() != ours {
            return Err(untrusted(format!("owned by uid {}, we are {ours}", meta.uid())));
        }
        if meta.len() < SIZE as u64 {
            return Err(untrusted(format!("{} bytes, {SIZE} expected", meta.len())));
        }
        Self::map(file, path).map_err(io("map"))
    }

    /// Creates the shared bytes at `path` for a block of ours (an exporter's side),
    /// zeroed, readable and writable by our user only; an existing file is an error.
    ///
    /// # Errors
    /// [`BlockMetaError::Io`] if the file cannot be created, sized or mapped.
    pub fn create_at(path: &Path) -> Result<Self, BlockMetaError> {
        let io = |what| move |source| BlockMetaError::Io { what, path: path.display().to_string(), source };
        let file = sys::open_rw(path, sys::Create::New).map_err(io("create"))?;
        file.set_len(SIZE as u64).map_err(io("size"))?;
        Self::map(file, path).map_err(io("map"))
    }

    fn map(file: File, path: &Path) -> io::Result<Self> {
        let p = sys::map_shared(file.as_fd(), SIZE)?;
        Ok(Self { shared: p.cast(), path: path.to_owned(), file: None, _file: file })
    }

    fn shared(&self) -> &Shared {
        // SAFETY: mapped read-write with SIZE bytes at a page-aligned address (so
        // aligned for `Shared`) until Drop; all fields are atomics or padding, valid for
        // any bytes another process writes.
        unsafe { self.shared.as_ref() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Subscribers' count now.
    pub fn count(&self) -> i32 {
        self.shared().refcount.load(SeqCst)
    }

    /// The block's reuse id now.
    pub fn uid(&self) -> u64 {
        self.shared().uid.load(SeqCst)
    }

    /// Counts us as holding the block if its reuse id is still `uid`, as the backend's
    /// own subscribers do: add first, then compare, and take it back on a mismatch. A
    /// block opened with [`BlockMeta::open`] has the count journaled, so that it goes
    /// back if this process dies holding it ([`super::holds`]).
    ///
    /// # Errors
    /// [`BlockMetaError::Stale`]: the block was reused since the descriptor was made.
    pub fn hold(self: &Arc<Self>, uid: u64) -> Result<CountHold, BlockMetaError> {
        let s = self.shared();
        s.refcount.fetch_add(1, SeqCst);
        let found = s.uid.load(SeqCst);
        if found != uid {
            s.refcount.fetch_sub(1, SeqCst);
            return Err(BlockMetaError::Stale { expected: uid, found });
        }
        let journaled = self.file.as_ref().and_then(record_hold);
        Ok(CountHold { meta: Arc::clone(self), journaled })
    }

    /// Gives back `n` counts a dead process held (its hold journal's).
    pub(crate) fn give_back(&self, n: i32) {
        self.shared().refcount.fetch_sub(n, SeqCst);
    }

    /// Sets the subscribers' count to zero: for an exporter whose every taker of the
    /// block has died holding counts (nothing else ever gives them back).
    pub fn clear_count(&self) {
        self.shared().refcount.store(0, SeqCst);
    }

    /// Marks the block published under reuse id `uid` at `timestamp_us` of the
    /// publisher's monotonic clock (an exporter's side).
    pub fn publish(&self, uid: u64, timestamp_us: u64) {
        let s = self.shared();
        s.uid.store(uid, SeqCst);
        s.publish_timestamp_us.store(timestamp_us, SeqCst);
    }
}

impl Drop for BlockMeta {
    fn drop(&mut self) {
        // SAFETY: the one mapping made in `map`, of SIZE bytes; no reference into it
        // outlives `self` (every `CountHold` holds an `Arc` of it).
        unsafe { sys::unmap(self.shared.cast(), SIZE) };
    }
}

impl std::fmt::Debug for BlockMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockMeta").field("path", &self.path).field("count", &self.count()).finish()
    }
}

/// One count of ours on a block: taken back when dropped (after our reads are done).
#[derive(Debug)]
pub struct CountHold {
    meta: Arc<BlockMeta>,
    journaled: Option<Journaled>,
}

impl Drop for CountHold {
    fn drop(&mut self) {
        // The journal first: it must never say less is held than really is.
        if let Some(j) = &self.journaled {
            record_release(j);
        }
        self.meta.shared().refcount.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("zcs-meta-{tag}-{}-{}", std::process::id(), rand::random::<u32>()))
    }

    #[test]
    fn hold_counts_while_the_reuse_id_matches() {
        let path = temp("hold");
        let ours = BlockMeta::create_at(&path).unwrap();
        assert_eq!((ours.count(), ours.uid()), (0, 0));
        ours.publish(0xfeed, 1);
        let theirs = Arc::new(BlockMeta::open_at(&path).unwrap());
        let a = theirs.hold(0xfeed).unwrap();
        let b = theirs.hold(0xfeed).unwrap();
        assert_eq!(ours.count(), 2, "seen through the other mapping");
        drop(a);
        assert_eq!(ours.count(), 1);
        // Reused meanwhile: refused, and the count is as before.
        ours.publish(0xbeef, 2);
        assert!(matches!(theirs.hold(0xfeed), Err(BlockMetaError::Stale { expected: 0xfeed, found: 0xbeef })));
        assert_eq!(ours.count(), 1);
        drop(b);
        assert_eq!(ours.count(), 0);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn layout_is_the_backends() {
        let path = temp("layout");
        let ours = BlockMeta::create_at(&path).unwrap();
        ours.publish(0x1122_3344_5566_7788, 0x99);
        let _held = Arc::new(BlockMeta::open_at(&path).unwrap()).hold(0x1122_3344_5566_7788).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 24);
        assert_eq!(bytes[0..4], 1i32.to_le_bytes());
        assert_eq!(bytes[8..16], 0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(bytes[16..24], 0x99u64.to_le_bytes());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn files_that_are_not_a_blocks_bytes_are_refused() {
        // Missing.
        assert!(matches!(BlockMeta::open_at(&temp("none")), Err(BlockMetaError::Io { what: "open", .. })));
        // Too small.
        let small = temp("small");
        std::fs::write(&small, [0u8; 8]).unwrap();
        assert!(matches!(BlockMeta::open_at(&small), Err(BlockMetaError::Untrusted { .. })));
        // A symbolic link to a good file is not followed.
        let good = temp("good");
        drop(BlockMeta::create_at(&good).unwrap());
        let link = temp("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(matches!(BlockMeta::open_at(&link), Err(BlockMetaError::Io { what: "open", .. })));
        // A directory (opening one read-write fails).
        assert!(matches!(BlockMeta::open_at(&std::env::temp_dir()), Err(BlockMetaError::Io { what: "open", .. })));
        // Creating over an existing file.
        assert!(matches!(BlockMeta::create_at(&good), Err(BlockMetaError::Io { what: "create", .. })));
        for p in [small, good, link] {
            std::fs::remove_file(p).unwrap();
        }
        assert_eq!(BlockMeta::path_of(12345, 3), Path::new("/dev/shm/cuda_vmm_12345_3"));
    }
}
