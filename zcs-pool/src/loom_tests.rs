//! Loom models of the pool's lease state machine and of the recycler, run on the real
//! code: with the `loom-model` feature the state lock, the loan condition variable, the
//! recycler's thread, channel and mutexes are loom's (see `crate::sync`), and loom runs
//! each model under every interleaving of those within its preemption bound.
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 cargo test -p zenoh-cuda-shm --features loom-model --lib --release pool::loom_tests
//! ```
//!
//! Blocks come from the host backend (real memfds); fences are flags that another model
//! thread sets, as a GPU would complete them.

use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, Ordering};

use super::*;

const MIB: usize = 1 << 20;

fn pool(max_blocks: usize) -> Pool<HostBackend> {
    let cfg = PoolConfig { max_blocks, max_bytes: 64 * MIB as u64, loan_timeout_ms: 60_000, ..PoolConfig::default() };
    Pool::new(HostBackend::default(), cfg).expect("pool")
}

/// Completes when another model thread sets the flag.
struct Flag(Arc<AtomicBool>);

impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A put charges a lease to a holder it listed while that holder's connection ends
/// (`release_holder`): in no order may a hold be left that nobody releases.
#[test]
fn loom_a_lease_racing_its_holders_departure_never_pins_a_block() {
    loom::model(|| {
        let p = pool(2);
        let published = p.loan(MIB).expect("loan").publish();
        let h = HolderId::new(7);
        let (p2, pb2) = (p.clone(), published.clone());
        let charge = loom::thread::spawn(move || pb2.lease(h).is_ok());
        let depart = loom::thread::spawn(move || p2.release_holder(h));
        let charged = charge.join().expect("charge");
        let released = depart.join().expect("depart");
        // Charged before the departure: the departure took it back.
        assert_eq!(released, usize::from(charged));
        drop(published);
        assert_eq!(p.stats().blocks_in_use, 0, "a departed holder pins a block");
    });
}

/// A subscriber's release of a block races its connection's end: the hold goes
/// exactly once, and the block is freed exactly once.
#[test]
fn loom_a_release_racing_the_holders_departure_frees_once() {
    loom::model(|| {
        let p = pool(2);
        let published = p.loan(MIB).expect("loan").publish();
        let key = published.key();
        let h = HolderId::new(3);
        published.lease(h).expect("lease");
        drop(published);
        let (p1, p2) = (p.clone(), p.clone());
        let release = loom::thread::spawn(move || p1.release(key, h).is_ok());
        let depart = loom::thread::spawn(move || p2.release_holder(h));
        let released = release.join().expect("release");
        let dropped = depart.join().expect("depart");
        assert_eq!(usize::from(released) + dropped, 1, "the one hold went exactly once");
        let st = p.stats();
        assert_eq!((st.blocks_in_use, st.blocks), (0, 1));
        // And the block is usable again, with a new generation.
        let again = p.loan(MIB).expect("loan again");
        assert!(again.key().generation > key.generation);
    });
}

/// A loan that waits for the only block races the release that returns it: the waiter
/// is woken (a lost wakeup is a deadlock loom reports), and gets the block.
#[test]
fn loom_a_waiting_loan_is_woken_by_the_release() {
    loom::model(|| {
        let p = pool(1);
        let published = p.loan(MIB).expect("loan").publish();
        let key = published.key();
        let h = HolderId::new(9);
        published.lease(h).expect("lease");
        drop(published);
        let p1 = p.clone();
        let waiter = loom::thread::spawn(move || p1.loan(MIB).map(|l| l.key()));
        p.release(key, h).expect("release");
        let got = waiter.join().expect("waiter").expect("the waiting loan gets the returned block");
        assert_eq!(got.id, key.id);
        assert!(got.generation > key.generation);
    });
}

/// A release whose fence is still pending is handed to the recycler while the last
/// pool handle drops (the recycler stops, drains its channel and finishes what is
/// left) and while the fence completes: the release runs in every order, once.
#[test]
fn loom_a_deferred_release_racing_the_pools_drop_is_never_lost() {
    loom::model(|| {
        let p = pool(2);
        let shared = Arc::clone(&p.shared);
        let done = Arc::new(AtomicBool::new(false));
        let mut loan = p.loan(MIB).expect("loan");
        loan.add_fence(Flag(Arc::clone(&done)));
        let complete = loom::thread::spawn(move || done.store(true, Ordering::Release));
        let give_back = loom::thread::spawn(move || drop(loan));
        drop(p);
        complete.join().expect("fence");
        give_back.join().expect("drop loan");
        let st = shared.lock();
        assert_eq!(st.blocks_in_use, 0, "the deferred release was lost");
        assert_eq!(st.free.values().map(Vec::len).sum::<usize>(), 1, "freed exactly once");
    });
}
