//! Our counts on the CUDA buffer backend's blocks, journaled so that they go back when
//! the process holding them dies.
//!
//! The backend has no leases: a subscriber adds 1 to a block's shared count while it
//! reads the block, and a subscriber killed while holding one leaves the count up for
//! good, so its publisher never reuses that block and grows its pool instead, then
//! hangs at exit waiting for it (`cuda_memory_pool.cpp:32-49` of `cuda_buffer` 0.1.2).
//! We cannot change their publishers, but we can make our own deaths harmless: each
//! process of ours that holds counts keeps them in a journal,
//! `/dev/shm/zcs_rosidl_holds_<pid>` (ours only, 0600), and any process of ours that
//! finds the journal of a dead one gives its counts back ([`reap_dead_holders`]).
//!
//! Ordering keeps the journal at or below the counts really held, so a reaper never
//! gives back more than was taken: a hold raises the block's count before the
//! journal's, a release lowers the journal's before the block's, and a reaper zeroes
//! a journal entry before it lowers the block's count. A crash between two steps
//! leaves one count behind (as without a journal), never one too few. A journal entry
//! names its block file by device and inode as well as by name, so that a block file
//! recreated under the same name (a new publisher with a reused pid) is never touched.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};

use super::block_meta::BlockMeta;
use super::sys;

const DIR: &str = "/dev/shm";
const PREFIX: &str = "zcs_rosidl_holds_";
/// Blocks one process can journal at once; holds beyond are not journaled (logged).
pub const SLOTS: usize = 1024;
const MAGIC: u64 = u64::from_le_bytes(*b"ZCSHOLD1");

/// One block's file and the counts we hold on it.
#[repr(C)]
struct Slot {
    held: AtomicI32,
    pid: AtomicI32,
    block: AtomicU32,
    _pad: u32,
    dev: AtomicU64,
    ino: AtomicU64,
}

#[repr(C)]
struct Table {
    magic: AtomicU64,
    _pad: u64,
    slots: [Slot; SLOTS],
}

const SIZE: usize = std::mem::size_of::<Table>();
const _: () = assert!(std::mem::size_of::<Slot>() == 32 && SIZE == 16 + 32 * SLOTS);

/// A block file as the journal names it: the publisher's pid and block number, and the
/// file's device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFile {
    /// The publisher's pid.
    pub pid: i32,
    /// Its block number.
    pub block: u32,
    /// The file's device.
    pub dev: u64,
    /// The file's inode.
    pub ino: u64,
}

/// A mapped journal.
struct Mapped {
    table: NonNull<Table>,
    _file: File,
}

// SAFETY: the mapping is owned by this value (unmapped in Drop) and only accessed
// through atomics.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

impl Mapped {
    fn map(file: File) -> io::Result<Self> {
        let p = sys::map_shared(file.as_fd(), SIZE)?;
        Ok(Self { table: p.cast(), _file: file })
    }

    fn table(&self) -> &Table {
        // SAFETY: SIZE bytes mapped read-write at a page-aligned address until Drop;
        // every field is an atomic or padding, valid for any bytes.
        unsafe { self.table.as_ref() }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the one mapping of `map`, SIZE bytes, not used after this.
        unsafe { sys::unmap(self.table.cast(), SIZE) };
    }
}

/// This process's journal.
pub struct HoldJournal {
    mapped: Mapped,
    /// Serialises the choice of a slot (counts themselves are atomics).
    alloc: Mutex<()>,
}

impl std::fmt::Debug for HoldJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldJournal").finish_non_exhaustive()
    }
}

fn journal_path(pid: u32) -> PathBuf {
    Path::new(DIR).join(format!("{PREFIX}{pid}"))
}

impl HoldJournal {
    fn create() -> io::Result<Self> {
        let path = journal_path(std::process::id());
        if path.exists() {
            // Left by a dead process that had our pid: give its counts back first.
            reap_file(&path)?;
        }
        let file = sys::open_rw(&path, sys::Create::New)?;
        file.set_len(SIZE as u64)?;
        let mapped = Mapped::map(file)?;
        mapped.table().magic.store(MAGIC, SeqCst);
        Ok(Self { mapped, alloc: Mutex::new(()) })
    }

    /// Counts one hold on `f` in its slot: its own, else a free one (or one whose counts
    /// are all back); the slot. Under the lock, so that a slot at 0 is never handed to
    /// another block between finding it and counting in it.
    fn hold(&self, f: &BlockFile) -> Option<usize> {
        let _g = self.alloc.lock().unwrap_or_else(|p| p.into_inner());
        let slots = &self.mapped.table().slots;
        let same = |s: &Slot| {
            s.pid.load(SeqCst) == f.pid
                && s.block.load(SeqCst) == f.block
                && s.dev.load(SeqCst) == f.dev
                && s.ino.load(SeqCst) == f.ino
        };
        if let Some(i) = slots.iter().position(same) {
            slots[i].held.fetch_add(1, SeqCst);
            return Some(i);
        }
        let i = slots
            .iter()
            .position(|s| s.pid.load(SeqCst) == 0)
            .or_else(|| slots.iter().position(|s| s.held.load(SeqCst) == 0))?;
        let s = &slots[i];
        // Named before it counts: a reaper sees either no counts or a named block.
        s.held.store(0, SeqCst);
        s.block.store(f.block, SeqCst);
        s.dev.store(f.dev, SeqCst);
        s.ino.store(f.ino, SeqCst);
        s.pid.store(f.pid, SeqCst);
        s.held.fetch_add(1, SeqCst);
        Some(i)
    }

    /// Takes one hold back from `slot` (which stays ours while it counts above 0).
    fn release(&self, slot: usize) {
        self.mapped.table().slots[slot].held.fetch_sub(1, SeqCst);
    }

    fn idle(&self) -> bool {
        self.mapped.table().slots.iter().all(|s| s.held.load(SeqCst) <= 0)
    }
}

static JOURNAL: OnceLock<Option<HoldJournal>> = OnceLock::new();

/// At a normal exit: the journal goes if nothing is held. Counts still held (buffers
/// never dropped) keep it, for a reaper to give them back.
extern "C" fn remove_if_idle() {
    if let Some(Some(j)) = JOURNAL.get()
        && j.idle()
    {
        let _ = std::fs::remove_file(journal_path(std::process::id()));
    }
}

/// This process's journal, made with the first hold; `None` (logged once) if it cannot
/// be made: holds then go uncounted here, as they are upstream.
fn journal() -> Option<&'static HoldJournal> {
    JOURNAL.get_or_init(|| match HoldJournal::create() {
        Ok(j) => {
            // SAFETY: registers a function that takes no arguments, touches only a
            // static and the file system, and cannot unwind (no panic path in it).
            if unsafe { libc::atexit(remove_if_idle) } != 0 {
                tracing::debug!("atexit refused: the hold journal stays after exit until reaped");
            }
            Some(j)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot journal our holds on CUDA buffer backend blocks: a crash of this process will leave them held");
            None
        }
    })
    .as_ref()
}

/// A journaled count: where it is recorded.
#[derive(Debug)]
pub(crate) struct Journaled(usize);

/// Records one more count of ours on `f`; call after raising the block's count.
pub(crate) fn record_hold(f: &BlockFile) -> Option<Journaled> {
    let j = journal()?;
    match j.hold(f) {
        Some(i) => Some(Journaled(i)),
        None => {
            tracing::warn!(slots = SLOTS, "hold journal full: this hold is not journaled");
            None
        }
    }
}

/// Forgets one count; call before lowering the block's count.
pub(crate) fn record_release(at: &Journaled) {
    if let Some(j) = journal() {
        j.release(at.0);
    }
}

/// What [`reap_dead_holders`] gave back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Journals of dead processes removed.
    pub journals: usize,
    /// Counts given back to blocks.
    pub counts: u64,
}

/// Gives back the counts that dead processes of ours held on the backend's blocks, and
/// removes their journals. Journals of live processes, of other users, or being reaped
/// by another process are left alone; so are counts on a block file that has been
/// replaced since.
pub fn reap_dead_holders() -> Reaped {
    let mut reaped = Reaped::default();
    let Ok(entries) = std::fs::read_dir(DIR) else { return reaped };
    let me = std::process::id();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || !zcs_memory::host::process_gone(pid as i32) {
            continue;
        }
        match reap_file(&e.path()) {
            Ok(Some(n)) => {
                reaped.journals += 1;
                reaped.counts += n;
            }
            Ok(None) => {}
            Err(err) => tracing::debug!(error = %err, journal = %e.path().display(), "cannot reap a hold journal"),
        }
    }
    if reaped.counts > 0 {
        tracing::info!(
            journals = reaped.journals,
            counts = reaped.counts,
            "gave back the CUDA buffer backend counts of dead processes"
        );
    }
    reaped
}

/// Reaps one journal: `Ok(None)` if another process is reaping it.
fn reap_file(path: &Path) -> io::Result<Option<u64>> {
    let file = sys::open_rw(path, sys::Create::No)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.len() != SIZE as u64 {
        return Err(io::Error::other("not a hold journal of our user"));
    }
    let _lock = match nix::fcntl::Flock::lock(file.try_clone()?, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
        Err((_, e)) => return Err(e.into()),
    };
    if std::fs::symlink_metadata(path).map(|m| m.ino()).ok() != Some(meta.ino()) {
        return Ok(None); // reaped (and removed) meanwhile by the process that held the lock
    }
    let mapped = Mapped::map(file)?;
    if mapped.table().magic.load(SeqCst) != MAGIC {
        return Err(io::Error::other("not a hold journal (magic)"));
    }
    let mut given = 0u64;
    for s in &mapped.table().slots {
        let held = s.held.swap(0, SeqCst);
        if held <= 0 {
            continue;
        }
        let f = BlockFile {
            pid: s.pid.load(SeqCst),
            block: s.block.load(SeqCst),
            dev: s.dev.load(SeqCst),
            ino: s.ino.load(SeqCst),
        };
        match BlockMeta::open(f.pid, f.block) {
            Ok(m) if m.file() == Some(f) => {
                m.give_back(held);
                given += held as u64;
            }
            // Gone, or another block's file under that name: nothing of ours to give back.
            _ => {}
        }
    }
    std::fs::remove_file(path)?;
    Ok(Some(given))
}
