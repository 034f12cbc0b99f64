//! Pool logic on the host backend: the same code paths the CUDA backend takes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::*;

const MIB: usize = 1 << 20;

fn pool(cfg: PoolConfig) -> Pool<HostBackend> {
    Pool::new(HostBackend::default(), cfg).unwrap()
}

fn small_cfg() -> PoolConfig {
    PoolConfig { max_bytes: 8 * MIB as u64, max_blocks: 4, loan_timeout_ms: 0, ..PoolConfig::default() }
}

/// Completes when its flag is set: lets a test decide when "GPU work" finishes, to
/// check the recycler's handling of pending fences (the CUDA fence is tested on GPU).
struct Flag(Arc<AtomicBool>);
impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn size_classes_waste_at_most_a_quarter() {
    let g = 2 * MIB;
    assert_eq!(size_class(1, g), Some(g));
    assert_eq!(size_class(g, g), Some(g));
    assert_eq!(size_class(g + 1, g), Some(2 * g));
    assert_eq!(size_class(5 * g, g), Some(5 * g));
    assert_eq!(size_class(9 * g, g), Some(10 * g));
    assert_eq!(size_class(17 * g, g), Some(20 * g));
    for len in (1..2000).map(|k| k * 997 * 1024) {
        let c = size_class(len, g).unwrap();
        assert!(c >= len && c.is_multiple_of(g));
        assert!(c <= len.next_multiple_of(g) * 5 / 4 + g, "{len} -> {c}");
    }
    assert_eq!(size_class(usize::MAX, g), None);
}

#[test]
fn loan_write_publish_release_recycles_with_new_generation() {
    let p = pool(PoolConfig::default());
    let mut loan = p.loan(100).unwrap();
    assert_eq!(loan.capacity(), 2 * MIB);
    let key1 = loan.key();
    let cap1 = loan.capability();
    // The block is real shared memory: write through its address.
    // SAFETY: the loan owns the block exclusively and it has 2 MiB mapped.
    unsafe { std::ptr::write_bytes(loan.addr() as *mut u8, 0xab, 100) };
    loan.add_fence(Flag(Arc::new(AtomicBool::new(true))));
    let published = loan.publish();
    assert_eq!(p.handout(key1, cap1).unwrap().size(), 2 * MIB);
    drop(published);
    assert_eq!(p.stats().blocks_in_use, 0);
    let loan2 = p.loan(100).unwrap();
    assert_eq!(loan2.key().id, key1.id, "the warm block is reused");
    assert_eq!(loan2.key().generation, key1.generation + 1);
    assert_ne!(loan2.capability(), cap1);
    // The capability is the keyed PRF of the key: verifiable with the pool's key only.
    assert_eq!(p.capability_key().capability(loan2.key()), loan2.capability());
    assert_ne!(CapabilityKey::random().capability(loan2.key()), loan2.capability());
    // The old generation and capability are refused everywhere.
    let published2 = loan2.publish();
    assert!(matches!(p.handout(key1, cap1), Err(StaleError::Generation { .. })));
    assert_eq!(p.handout(published2.key(), cap1).unwrap_err(), StaleError::Capability(key1.id));
    let s = p.stats();
    assert_eq!((s.loans, s.allocations), (2, 1));
}

#[test]
fn handout_refuses_unpublished_and_unknown_blocks() {
    let p = pool(PoolConfig::default());
    let loan = p.loan(1).unwrap();
    assert_eq!(p.handout(loan.key(), loan.capability()).unwrap_err(), StaleError::NotPublished(loan.key().id));
    let bogus = BlockKey { id: 999, alloc: 1, generation: 1 };
    assert_eq!(p.handout(bogus, 1).unwrap_err(), StaleError::NoBlock(999));
    assert_eq!(p.release(bogus, HolderId::new(1)).unwrap_err(), StaleError::NoBlock(999));
}

#[test]
fn leases_keep_blocks_until_every_holder_releases() {
    let p = pool(PoolConfig::default());
    let published = p.loan(MIB).unwrap().publish();
    let key = published.key();
    let (a, b) = (HolderId::new(1), HolderId::new(2));
    published.lease(a).unwrap();
    published.lease(b).unwrap();
    published.lease(b).unwrap();
    drop(published);
    assert_eq!(p.stats().blocks_in_use, 1);
    p.release(key, a).unwrap();
    // A second release by the same holder is refused and changes nothing.
    assert_eq!(p.release(key, a).unwrap_err(), StaleError::NotHeld { id: key.id, holder: 1 });
    p.release(key, b).unwrap();
    assert_eq!(p.stats().blocks_in_use, 1, "b still holds one");
    p.release(key, b).unwrap();
    assert_eq!(p.stats().blocks_in_use, 0);
    // LOCAL cannot be released from outside.
    assert!(p.release(key, HolderId::LOCAL).is_err());
}

#[test]
fn departed_holder_releases_everything_at_once() {
    let p = pool(PoolConfig::default());
    let dead = HolderId::new(9);
    let alive = HolderId::new(10);
    let mut keys = Vec::new();
    for _ in 0..3 {
        let pb = p.loan(MIB).unwrap().publish();
        pb.lease(dead).unwrap();
        keys.push(pb.key());
    }
    let shared = p.loan(MIB).unwrap().publish();
    shared.lease(dead).unwrap();
    shared.lease(alive).unwrap();
    let shared_key = shared.key();
    drop(shared);
    assert_eq!(p.stats().blocks_in_use, 4);
    assert_eq!(p.release_holder(dead), 4);
    assert_eq!(p.stats().blocks_in_use, 1, "the block `alive` holds stays");
    assert_eq!(p.stats().holder_releases, 4);
    p.release(shared_key, alive).unwrap();
    assert_eq!(p.stats().blocks_in_use, 0);
    assert_eq!(p.release_holder(dead), 0);
}

/// A put picks its holders, then charges each; a holder whose connection ended in
/// between is refused, so no lease is charged that nobody would release.
#[test]
fn a_departed_holder_cannot_be_charged_a_lease() {
    let p = pool(PoolConfig::default());
    let (gone, other) = (HolderId::new(21), HolderId::new(22));
    let first = p.loan(MIB).unwrap().publish();
    first.lease(gone).unwrap();
    assert_eq!(p.release_holder(gone), 1);
    // The put that listed `gone` before it departed charges it now: refused.
    let next = p.loan(MIB).unwrap().publish();
    assert_eq!(next.lease(gone).unwrap_err(), LeaseError::Departed { holder: 21 });
    next.lease(other).unwrap();
    let key = next.key();
    drop((first, next));
    assert_eq!(p.stats().blocks_in_use, 1, "only `other` holds a block");
    p.release(key, other).unwrap();
    assert_eq!(p.stats().blocks_in_use, 0, "the pool is whole: nothing charged to the departed holder");
    // The memory is bounded: the oldest departures are forgotten first.
    for h in 1000..1000 + DEPARTED_MEMORY as u64 {
        p.release_holder(HolderId::new(h));
    }
    let late = p.loan(MIB).unwrap().publish();
    late.lease(gone).unwrap();
    assert_eq!(
        late.lease(HolderId::new(1000 + DEPARTED_MEMORY as u64 - 1)).unwrap_err().to_string(),
        format!("holder {} has departed", 1000 + DEPARTED_MEMORY as u64 - 1)
    );
    drop(late);
    assert_eq!(p.release_holder(gone), 1);
}

#[test]
fn per_holder_limit_refuses_further_leases() {
    let p = pool(PoolConfig { max_holds_per_holder: 2, ..PoolConfig::default() });
    let slow = HolderId::new(5);
    let blocks: Vec<_> = (0..3).map(|_| p.loan(MIB).unwrap().publish()).collect();
    blocks[0].lease(slow).unwrap();
    blocks[1].lease(slow).unwrap();
    assert_eq!(blocks[2].lease(slow).unwrap_err(), LeaseError::HolderLimit { holder: 5, held: 2 });
    // Another lease on a block it already holds is not a new block.
    blocks[0].lease(slow).unwrap();
    // Others are unaffected.
    blocks[2].lease(HolderId::new(6)).unwrap();
    assert_eq!(p.stats().holder_limit_refusals, 1);
    p.release(blocks[1].key(), slow).unwrap();
    blocks[2].lease(slow).unwrap();
}

#[test]
fn caps_are_never_exceeded_and_exhaustion_is_typed() {
    let p = pool(small_cfg());
    let loans: Vec<_> = (0..4).map(|_| p.loan(2 * MIB).unwrap()).collect();
    let err = p.loan(1).unwrap_err();
    assert!(
        matches!(err, LoanError::Exhausted { class, in_use_bytes, .. } if class == 2 * MIB && in_use_bytes == 8 * MIB as u64)
    );
    assert!(matches!(p.loan(16 * MIB), Err(LoanError::TooLarge { .. })));
    assert!(matches!(p.loan(0), Err(LoanError::ZeroLength)));
    let s = p.stats();
    assert_eq!((s.blocks, s.bytes, s.exhausted), (4, 8 * MIB as u64, 1));
    drop(loans);
}

#[test]
fn loan_waits_for_a_returned_block_within_the_timeout() {
    let p = pool(PoolConfig { loan_timeout_ms: 5_000, ..small_cfg() });
    let mut loans: Vec<_> = (0..4).map(|_| p.loan(2 * MIB).unwrap()).collect();
    let held = loans.pop().unwrap();
    let t = Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
    });
    let got = p.loan(2 * MIB).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(90));
    assert_eq!(p.stats().waits, 1);
    releaser.join().unwrap();
    drop(got);
}

#[test]
fn loan_timeout_is_bounded() {
    let p = pool(PoolConfig { loan_timeout_ms: 150, ..small_cfg() });
    let _all: Vec<_> = (0..4).map(|_| p.loan(2 * MIB).unwrap()).collect();
    let t = Instant::now();
    assert!(matches!(p.loan(2 * MIB), Err(LoanError::Exhausted { .. })));
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(140), "{waited:?}");
}

#[test]
fn at_the_cap_a_near_fit_is_reused_and_idle_blocks_are_evicted_for_room() {
    let p = pool(small_cfg());
    // A free 4 MiB block serves a 2 MiB request at the cap (at most 2x the class)…
    let big = p.loan(4 * MIB).unwrap();
    let rest = p.loan(4 * MIB).unwrap();
    drop(big);
    let near = p.loan(2 * MIB).unwrap();
    assert_eq!(near.capacity(), 4 * MIB);
    assert_eq!(p.stats().allocations, 2);
    drop((near, rest));
    // …but a free 8 MiB block is evicted to make room rather than wasting 6 MiB.
    p.trim();
    drop(p.loan(8 * MIB).unwrap());
    let v: Vec<_> = (0..4).map(|_| p.loan(2 * MIB).unwrap()).collect();
    assert!(v.iter().all(|l| l.capacity() == 2 * MIB));
    let s = p.stats();
    assert_eq!((s.blocks, s.bytes), (4, 8 * MIB as u64));
    assert_eq!(s.frees, 3, "two trimmed, one evicted");
}

#[test]
fn generations_only_grow_even_when_a_trimmed_id_is_reused() {
    let p = pool(PoolConfig::default());
    let first = p.loan(MIB).unwrap().key();
    let other = p.loan(MIB).unwrap().key();
    assert!(other.generation > first.generation);
    p.trim();
    let again = p.loan(MIB).unwrap().key();
    assert_eq!(again.id, first.id, "the trimmed id is reused");
    assert_ne!(again.alloc, first.alloc, "but it is another allocation");
    assert!(again.generation > other.generation);
    // Keys of the old allocation are refused.
    assert!(matches!(p.handout(first, 0), Err(StaleError::Generation { .. })));
}

#[test]
fn fenced_release_waits_for_the_fence() {
    let p = pool(PoolConfig { max_blocks: 1, loan_timeout_ms: 5_000, ..PoolConfig::default() });
    let done = Arc::new(AtomicBool::new(false));
    let published = p.loan(MIB).unwrap().publish();
    published.add_fence(Flag(Arc::clone(&done)));
    let key = published.key();
    drop(published);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(p.stats().blocks_in_use, 1, "not reused before the fence completes");
    assert_eq!(p.stats().pending_fences, 1);
    let d2 = Arc::clone(&done);
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        d2.store(true, Ordering::Release);
    });
    let next = p.loan(MIB).unwrap();
    assert!(done.load(Ordering::Acquire));
    assert_eq!(next.key().id, key.id);
    assert_eq!(next.key().generation, key.generation + 1);
    setter.join().unwrap();
    wait_until("pending count", || p.stats().pending_fences == 0);
}

#[test]
fn one_slow_fence_does_not_delay_others() {
    let p = pool(PoolConfig::default());
    let slow = Arc::new(AtomicBool::new(false));
    let a = p.loan(MIB).unwrap().publish();
    a.add_fence(Flag(Arc::clone(&slow)));
    let b = p.loan(MIB).unwrap().publish();
    let fast = Arc::new(AtomicBool::new(false));
    b.add_fence(Flag(Arc::clone(&fast)));
    drop(a);
    drop(b);
    fast.store(true, Ordering::Release);
    wait_until("fast release", || p.stats().blocks_in_use == 1);
    slow.store(true, Ordering::Release);
    wait_until("slow release", || p.stats().blocks_in_use == 0);
}

#[test]
fn idle_blocks_are_trimmed_beyond_the_kept_bytes() {
    let p = pool(PoolConfig { idle_trim_ms: 20, keep_idle_bytes: 2 * MIB as u64, ..PoolConfig::default() });
    let v: Vec<_> = (0..3).map(|_| p.loan(2 * MIB).unwrap()).collect();
    drop(v);
    wait_until("trim", || p.stats().blocks == 1);
    assert_eq!(p.stats().bytes, 2 * MIB as u64);
    assert_eq!(p.trim(), 1);
    assert_eq!(p.stats().blocks, 0);
}

#[test]
fn invalid_configs_are_refused() {
    assert!(matches!(
        Pool::new(HostBackend::default(), PoolConfig { max_blocks: 0, ..PoolConfig::default() }),
        Err(PoolError::Config(_))
    ));
    assert!(matches!(
        Pool::new(HostBackend::default(), PoolConfig { max_bytes: 1, ..PoolConfig::default() }),
        Err(PoolError::Config(_))
    ));
}

#[test]
fn config_rejects_unknown_fields() {
    let err = serde_json::from_str::<PoolConfig>(r#"{"max_bytes": 1, "max_bytez": 2}"#).unwrap_err();
    assert!(err.to_string().contains("max_bytez"), "{err}");
    let cfg: PoolConfig = serde_json::from_str(r#"{"max_blocks": 3}"#).unwrap();
    assert_eq!(cfg.max_blocks, 3);
    assert_eq!(cfg.max_bytes, PoolConfig::default().max_bytes);
}

/// A job that counts its run once its flag is set.
fn counted_job(flag: &Arc<AtomicBool>, runs: &Arc<std::sync::atomic::AtomicUsize>) -> recycler::Job {
    let r = Arc::clone(runs);
    recycler::Job {
        fences: vec![Box::new(Flag(Arc::clone(flag)))],
        done: Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }),
    }
}

#[test]
fn a_recycler_started_late_runs_what_was_queued_before() {
    let (mut r, handle) = recycler::Recycler::prepare(Duration::from_secs(3600));
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(true));
    let pending = Arc::new(AtomicBool::new(false));
    handle.submit(counted_job(&done, &runs));
    handle.submit(counted_job(&pending, &runs));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing runs before the thread starts");
    r.start_thread().unwrap();
    r.start_thread().unwrap(); // a second start does nothing
    wait_until("the completed job", || runs.load(Ordering::SeqCst) == 1);
    pending.store(true, Ordering::Release);
    wait_until("the job whose fence completed later", || runs.load(Ordering::SeqCst) == 2);
}

#[test]
fn a_recycler_never_started_finishes_its_queue_on_drop() {
    let (r, handle) = recycler::Recycler::prepare(Duration::from_secs(3600));
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flag = Arc::new(AtomicBool::new(false));
    handle.submit(counted_job(&flag, &runs));
    let f = Arc::clone(&flag);
    let completer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        f.store(true, Ordering::Release);
    });
    drop(r); // waits for the fence, then runs the job
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    completer.join().unwrap();
    // Jobs submitted after the drop run on the submitting thread.
    handle.submit(counted_job(&flag, &runs));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
