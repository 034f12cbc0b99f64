//! Resource accounting across a whole pool lifetime. Its own test binary with a single
//! test, so no other test opens descriptors or threads while it counts them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zcs_pool::{Fence, HolderId, HostBackend, Pool, PoolConfig};
use zcs_tests::{open_fd_count, thread_count};

struct Flag(Arc<AtomicBool>);
impl Fence for Flag {
    fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[test]
fn blocks_outlive_the_pool_handle_and_nothing_leaks() {
    let fds = open_fd_count().unwrap();
    let threads = thread_count().unwrap();
    {
        let p = Pool::new(HostBackend::default(), PoolConfig::default()).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let published = p.loan(1 << 20).unwrap().publish();
        published.add_fence(Flag(Arc::clone(&done)));
        published.lease(HolderId::new(3)).unwrap();
        let loan = p.loan(1 << 20).unwrap();
        let extra: Vec<_> = (0..5).map(|k| p.loan((k + 1) << 20).unwrap()).collect();
        drop(extra);
        assert_eq!(p.release_holder(HolderId::new(3)), 1);
        drop(p); // the recycler thread is joined here
        let d2 = Arc::clone(&done);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            d2.store(true, Ordering::Release);
        });
        drop(published); // completes on this thread once the fence is done
        assert!(done.load(Ordering::Acquire));
        drop(loan);
        t.join().unwrap();
    }
    let t = Instant::now();
    while thread_count().unwrap() > threads {
        assert!(t.elapsed() < Duration::from_secs(5), "a thread outlived the pool");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(open_fd_count().unwrap(), fds, "every memfd closed");
}
