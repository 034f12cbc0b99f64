//! Lifelines: how a publisher learns, within microseconds, that a subscriber's process
//! has died, before that process's descriptors are closed.
//!
//! A killed process closes its descriptors late in its exit: after every thread has
//! stopped and its memory is torn down. For a CUDA process that teardown is the
//! driver's (measured 36–44 ms at the median and past 100 ms at times on H100/H200),
//! and a descriptor that another process inherited (a `fork` without `exec`) keeps the
//! connection open for as long as that process lives. A publisher that waited for the
//! control connection to end would keep the dead subscriber's leases that long.
//!
//! The kernel offers one notice that comes at the *start* of a thread's exit: its
//! robust-futex list (`set_robust_list(2)`). For every word the list names that holds
//! the thread's id, the kernel sets `FUTEX_OWNER_DIED` and wakes a waiter, before the
//! thread's memory or descriptors are released. So:
//!
//! - **Ours** ([`Lifeline::ours`]): once per process, on first use, a sealed 4-byte
//!   memfd whose word holds the id of a thread that does nothing but park, and that
//!   thread's robust list names the word. The thread lives as long as the process; a
//!   subscriber attaches the memfd to its `Hello`.
//! - **Theirs** ([`Watch`]): the publisher maps the received memfd (refusing one that
//!   is not sealed against shrinking, as for any memfd from a peer), marks the word as
//!   waited on and sleeps on it (`FUTEX_WAIT`, shared). The process's death wakes it;
//!   it then wakes every other watcher of the same word (the kernel wakes one) and ends
//!   the connection, which releases its leases at once.
//!
//! The parked thread replaces the robust list that the C library registered for it;
//! it never locks a robust `pthread` mutex, the only user of that list. A word that a
//! peer clears, or sets to anything but a live thread's id, reads as the death of
//! that peer: it can only end its own connection early. A publisher can write the
//! words of the subscribers it serves too; marking one dead ends that subscriber's
//! connections to other publishers, which it opens again, restoring its word before
//! every `Hello` ([`Lifeline::restore`]). A process forked from a subscriber without
//! `exec` has no lifeline thread: blocks it inherited mappings of are not held for it
//! once its parent dies.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;

use super::sys::{self, RobustList, RobustListHead};
use crate::host::HostBlock;
use crate::sync::Unpoisoned;

/// Bytes of a lifeline memfd: one futex word.
const WORD_BYTES: usize = 4;
/// How long one `FUTEX_WAIT` lasts before the watcher looks at its stop flag again
/// (it is also woken at once by [`Watch::wake`]).
const WAIT_TURN: Duration = Duration::from_millis(100);

/// This process's lifeline (one per process, for its whole life).
#[derive(Debug)]
pub struct Lifeline {
    block: Arc<HostBlock>,
    /// The id of the thread that holds the word.
    tid: u32,
}

/// The lifeline and the process id it was made in: a forked child makes its own.
static OURS: Mutex<Option<(u32, Arc<Lifeline>)>> = Mutex::new(None);

/// The address of every robust list handed to the kernel. Only the kernel reads a
/// list, at its thread's exit; kept here so that leak checkers, which cannot see the
/// kernel's copy of the pointer, see the list as live.
static LISTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

impl Lifeline {
    /// This process's lifeline, created on first use: one memfd, one mapping and one
    /// parked thread (`zcs-lifeline`), kept until the process ends. Its word is
    /// restored if a peer changed it ([`Lifeline::restore`]).
    pub fn ours() -> io::Result<Arc<Lifeline>> {
        let pid = std::process::id();
        let mut ours = OURS.locked();
        if let Some((made_in, l)) = &*ours
            && *made_in == pid
        {
            l.restore();
            return Ok(Arc::clone(l));
        }
        let l = Arc::new(Self::create()?);
        *ours = Some((pid, Arc::clone(&l)));
        Ok(l)
    }

    fn create() -> io::Result<Self> {
        let block = Arc::new(HostBlock::create(c"zcs-lifeline", WORD_BYTES)?);
        let (ready_tx, ready) = std::sync::mpsc::sync_channel(1);
        let held = Arc::clone(&block);
        std::thread::Builder::new().name("zcs-lifeline".into()).spawn(move || hold(&held, &ready_tx))?;
        match ready.recv() {
            Ok(Ok(tid)) => Ok(Self { block, tid }),
            Ok(Err(e)) => Err(io::Error::other(format!("set_robust_list: {e}"))),
            Err(_) => Err(io::Error::other("the lifeline thread ended before it held its word")),
        }
    }

    /// The memfd to send to a publisher.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.block.fd()
    }

    /// Every publisher we connect to maps the word and may write it: a hostile one could
    /// clear it, or mark it dead, and our next handshakes with any publisher would be
    /// refused for it. The holding thread is alive and its robust list still names the
    /// word, so putting its id back is all it takes (with `FUTEX_WAITERS`, so that
    /// watchers that went to sleep meanwhile are woken at the death). Returns whether
    /// the word had to be restored.
    pub fn restore(&self) -> bool {
        let word = sys::futex_word(&self.block);
        let v = word.load(Ordering::Acquire);
        if v & libc::FUTEX_TID_MASK == self.tid && v & libc::FUTEX_OWNER_DIED == 0 {
            return false;
        }
        word.store(self.tid | libc::FUTEX_WAITERS, Ordering::Release);
        tracing::warn!(word = v, "this process's lifeline was changed by a peer; restored");
        true
    }
}

/// The lifeline thread: holds the word, reports, and parks for the rest of the
/// process's life.
fn hold(block: &Arc<HostBlock>, ready: &std::sync::mpsc::SyncSender<Result<u32, Errno>>) {
    let set = hold_word(block);
    let failed = set.is_err();
    let _ = ready.send(set);
    if failed {
        return;
    }
    loop {
        std::thread::park();
    }
}

/// Puts the calling thread's id in `block`'s word and names the word in the thread's
/// robust list, so the kernel releases the word when this thread exits. The list is
/// one entry that points back to the head; the kernel finds the word at
/// `entry + futex_offset`. Both are leaked (the kernel may read them until the thread
/// exits; a lifeline thread lives as long as the process) and named in [`LISTS`], as
/// is the block's mapping (the thread holds an `Arc` of it until then).
fn hold_word(block: &Arc<HostBlock>) -> Result<u32, Errno> {
    let word = sys::futex_word(block);
    let tid = sys::gettid();
    word.store(tid, Ordering::Release);
    let head: &'static mut RobustListHead = Box::leak(Box::new(RobustListHead {
        list: RobustList { next: std::ptr::null() },
        futex_offset: 0,
        list_op_pending: std::ptr::null(),
    }));
    let entry: &'static RobustList = Box::leak(Box::new(RobustList { next: &raw const head.list }));
    head.futex_offset = (word.as_ptr() as isize).wrapping_sub(std::ptr::from_ref(entry) as isize) as libc::c_long;
    head.list.next = entry;
    LISTS.locked().push(std::ptr::from_ref(head) as usize);
    sys::set_robust_list(head).map(|()| tid)
}

/// Why a received lifeline is refused.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The descriptor cannot be mapped safely (not a memfd sealed against shrinking,
    /// or too small).
    #[error("cannot map the lifeline: {0}")]
    Map(#[from] io::Error),
    /// The word names no live thread (the process is already gone, or the peer sent
    /// a word it does not hold).
    #[error("the lifeline is not held (word {0:#x})")]
    NotHeld(u32),
}

/// A peer process's lifeline, mapped here.
#[derive(Debug)]
pub struct Watch {
    block: HostBlock,
}

/// A word whose owner is gone, or that names no thread.
fn released(v: u32) -> bool {
    v & libc::FUTEX_OWNER_DIED != 0 || v & libc::FUTEX_TID_MASK == 0
}

impl Watch {
    /// Maps a lifeline received from a peer and checks that it is held.
    pub fn new(fd: OwnedFd) -> Result<Self, WatchError> {
        let block = HostBlock::import(fd, WORD_BYTES)?;
        let v = sys::futex_word(&block).load(Ordering::Acquire);
        if released(v) {
            return Err(WatchError::NotHeld(v));
        }
        Ok(Self { block })
    }

    /// Whether the peer's process has died (or let go of its word).
    pub fn died(&self) -> bool {
        released(sys::futex_word(&self.block).load(Ordering::Acquire))
    }

    /// Blocks until the peer's process dies (`Ok(true)`) or `stop` is seen set
    /// (`Ok(false)`: at the latest 100 ms after it was set, at once after a
    /// [`Watch::wake`]). An error means the word cannot be waited on here (the caller
    /// falls back to the connection's end).
    pub fn wait(&self, stop: &AtomicBool) -> Result<bool, Errno> {
        let word = sys::futex_word(&self.block);
        loop {
            if stop.load(Ordering::Acquire) {
                return Ok(false);
            }
            let v = word.load(Ordering::Acquire);
            if released(v) {
                // The kernel woke one waiter: pass it on to the others of this word.
                sys::futex_wake_shared(word, i32::MAX);
                return Ok(true);
            }
            let waited = v | libc::FUTEX_WAITERS;
            // Without FUTEX_WAITERS in the word the kernel wakes nobody at the death.
            if v != waited && word.compare_exchange(v, waited, Ordering::AcqRel, Ordering::Acquire).is_err() {
                continue;
            }
            match sys::futex_wait_shared(word, waited, WAIT_TURN) {
                Ok(()) | Err(Errno::EAGAIN | Errno::ETIMEDOUT | Errno::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Wakes every thread in [`Watch::wait`] on this word (here, or in another process
    /// watching the same peer: they look at their stop flag and sleep again).
    pub fn wake(&self) {
        sys::futex_wake_shared(sys::futex_word(&self.block), i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Instant;

    fn watch_ours() -> Watch {
        let ours = Lifeline::ours().expect("lifeline");
        Watch::new(ours.fd().try_clone_to_owned().expect("dup")).expect("watch")
    }

    #[test]
    fn ours_is_made_once_and_held() {
        let a = Lifeline::ours().expect("lifeline");
        let b = Lifeline::ours().expect("lifeline");
        assert!(Arc::ptr_eq(&a, &b));
        let w = watch_ours();
        assert!(!w.died());
    }

    #[test]
    fn a_word_changed_by_a_peer_is_restored() {
        // A lifeline of its own (its thread parks for the rest of the test process), so
        // that no publisher watching this process's lifeline sees the tampering.
        let l = Lifeline::create().expect("lifeline");
        let peer = Watch::new(l.fd().try_clone_to_owned().unwrap()).expect("held");
        assert!(!l.restore(), "untouched");
        for forged in [0, libc::FUTEX_OWNER_DIED | l.tid, l.tid + 1] {
            sys::futex_word(&peer.block).store(forged, Ordering::Release);
            assert!(peer.died() || forged == l.tid + 1);
            assert!(l.restore(), "{forged:#x}");
            assert!(!peer.died());
            assert_eq!(sys::futex_word(&peer.block).load(Ordering::Acquire), l.tid | libc::FUTEX_WAITERS);
        }
    }

    #[test]
    fn a_stopped_wait_returns_when_woken() {
        let w = Arc::new(watch_ours());
        let stop = Arc::new(AtomicBool::new(false));
        let (w2, s2) = (Arc::clone(&w), Arc::clone(&stop));
        let t = std::thread::spawn(move || w2.wait(&s2));
        std::thread::sleep(Duration::from_millis(20));
        let woken = Instant::now();
        stop.store(true, Ordering::Release);
        w.wake();
        assert_eq!(t.join().unwrap(), Ok(false));
        assert!(woken.elapsed() < WAIT_TURN, "a wake ends the wait at once: {:?}", woken.elapsed());
    }

    #[test]
    fn the_kernel_releases_the_word_when_its_thread_exits() {
        let block = Arc::new(HostBlock::create(c"zcs-lifeline-test", WORD_BYTES).expect("memfd"));
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let (held_tx, held) = std::sync::mpsc::channel();
        let b2 = Arc::clone(&block);
        let holder = std::thread::spawn(move || {
            held_tx.send(hold_word(&b2)).unwrap();
            let _ = go.recv();
        });
        assert!(held.recv().unwrap().is_ok());
        let w = Arc::new(Watch::new(block.fd().try_clone_to_owned().unwrap()).expect("held"));
        let stop = Arc::new(AtomicBool::new(false));
        let (w2, s2) = (Arc::clone(&w), Arc::clone(&stop));
        let watcher = std::thread::spawn(move || w2.wait(&s2));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!watcher.is_finished(), "the holder lives");
        let exited = Instant::now();
        drop(go_tx);
        holder.join().unwrap();
        assert_eq!(watcher.join().unwrap(), Ok(true));
        assert!(exited.elapsed() < WAIT_TURN, "woken by the exit, not a timeout: {:?}", exited.elapsed());
        let v = sys::futex_word(&block).load(Ordering::Acquire);
        assert_ne!(v & libc::FUTEX_OWNER_DIED, 0, "{v:#x}");
    }

    #[test]
    fn a_word_let_go_reads_as_a_death_and_wakes_the_waiter() {
        // A peer's memfd whose word we control: held by a thread id, then cleared.
        let block = HostBlock::create(c"zcs-lifeline-test", WORD_BYTES).expect("memfd");
        sys::futex_word(&block).store(sys::gettid(), Ordering::Release);
        let w = Arc::new(Watch::new(block.fd().try_clone_to_owned().unwrap()).expect("held"));
        let stop = Arc::new(AtomicBool::new(false));
        let (w2, s2) = (Arc::clone(&w), Arc::clone(&stop));
        let t = std::thread::spawn(move || w2.wait(&s2));
        std::thread::sleep(Duration::from_millis(20));
        let let_go = Instant::now();
        sys::futex_word(&block).store(libc::FUTEX_OWNER_DIED | libc::FUTEX_WAITERS, Ordering::Release);
        sys::futex_wake_shared(sys::futex_word(&block), 1);
        assert_eq!(t.join().unwrap(), Ok(true));
        assert!(let_go.elapsed() < WAIT_TURN, "{:?}", let_go.elapsed());
        assert!(w.died());
    }

    #[test]
    fn unheld_and_unsealed_lifelines_are_refused() {
        let block = HostBlock::create(c"zcs-lifeline-test", WORD_BYTES).expect("memfd");
        let e = Watch::new(block.fd().try_clone_to_owned().unwrap()).unwrap_err();
        assert!(matches!(e, WatchError::NotHeld(0)), "{e}");
        let file = std::fs::File::open("/dev/null").unwrap();
        let e = Watch::new(file.as_fd().try_clone_to_owned().unwrap()).unwrap_err();
        assert!(matches!(e, WatchError::Map(_)), "{e}");
    }
}
