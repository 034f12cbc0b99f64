//! The synchronisation the pool and its recycler use: std's (and a flume channel) in
//! every normal build, loom's models with the internal `loom-model` feature, so that
//! `pool::loom_tests` can check the real pool and recycler code under every thread
//! interleaving loom explores (see `docs/reliability.md` for the command).
//!
//! Only what decides the pool's behaviour goes through here: the state lock, the
//! condition variable that loans wait on, the recycler's thread, its channel and the
//! mutexes around them, and the recycler's polling pause. `Arc`s of memory and the
//! statistics counters stay std types.
//!
//! Under loom, time is not modelled: a timed wait is an untimed one (loom wakes it only
//! by a notification), a channel receive with a timeout waits for a message or the
//! last sender, and [`pause`] yields to the model's scheduler instead of sleeping.

#[cfg(not(feature = "loom-model"))]
pub use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(feature = "loom-model")]
pub use loom::sync::{Condvar, Mutex, MutexGuard};

use std::time::Duration;

/// How every lock of the crate is taken: a lock poisoned by a panic in another thread is
/// taken as that thread left it, rather than making this thread panic too (in a `Drop`,
/// a Zenoh callback or across the C and Python boundaries that would abort the process or
/// lose the callback).
pub trait Unpoisoned {
    /// The guard.
    type Guard<'a>
    where
        Self: 'a;
    /// Locks, ignoring poisoning.
    fn locked(&self) -> Self::Guard<'_>;
}

impl<T: ?Sized> Unpoisoned for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        Self: 'a;
    fn locked(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(feature = "loom-model")]
impl<T> Unpoisoned for loom::sync::Mutex<T> {
    type Guard<'a>
        = loom::sync::MutexGuard<'a, T>
    where
        Self: 'a;
    fn locked(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A thread's handle.
#[cfg(not(feature = "loom-model"))]
pub type JoinHandle<T> = std::thread::JoinHandle<T>;
/// A thread's handle.
#[cfg(feature = "loom-model")]
pub type JoinHandle<T> = loom::thread::JoinHandle<T>;

/// Starts a named thread.
#[cfg(not(feature = "loom-model"))]
pub fn spawn<F, T>(name: &str, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new().name(name.into()).spawn(f)
}

/// Starts a thread of the model (names are not modelled).
#[cfg(feature = "loom-model")]
pub fn spawn<F, T>(_name: &str, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Ok(loom::thread::spawn(f))
}

/// Waits a little before polling again.
pub fn pause(d: Duration) {
    #[cfg(not(feature = "loom-model"))]
    std::thread::sleep(d);
    #[cfg(feature = "loom-model")]
    {
        let _ = d;
        loom::thread::yield_now();
    }
}

/// An unbounded multi-producer channel with the operations the recycler needs.
pub mod channel {
    use std::time::Duration;

    /// Why a receive returned nothing.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[cfg_attr(feature = "loom-model", allow(dead_code))] // no timeouts in the model
    pub enum RecvTimeoutError {
        /// Nothing arrived in time.
        Timeout,
        /// Every sender is gone and nothing is left.
        Disconnected,
    }

    #[cfg(not(feature = "loom-model"))]
    mod imp {
        use super::*;

        /// The sending side.
        pub struct Sender<T>(flume::Sender<T>);
        /// The receiving side.
        pub struct Receiver<T>(flume::Receiver<T>);

        /// A channel without a bound.
        pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
            let (tx, rx) = flume::unbounded();
            (Sender(tx), Receiver(rx))
        }

        impl<T> Sender<T> {
            /// Sends `v`; gives it back if the receiver is gone.
            pub fn send(&self, v: T) -> Result<(), T> {
                self.0.send(v).map_err(|flume::SendError(v)| v)
            }
        }

        impl<T> Receiver<T> {
            /// The next value, waiting at most `d`.
            pub fn recv_timeout(&self, d: Duration) -> Result<T, RecvTimeoutError> {
                self.0.recv_timeout(d).map_err(|e| match e {
                    flume::RecvTimeoutError::Timeout => RecvTimeoutError::Timeout,
                    flume::RecvTimeoutError::Disconnected => RecvTimeoutError::Disconnected,
                })
            }
            /// Everything queued now, without waiting.
            pub fn drain(&self) -> Vec<T> {
                self.0.drain().collect()
            }
        }
    }

    #[cfg(feature = "loom-model")]
    mod imp {
        use std::collections::VecDeque;
        use std::sync::Arc;

        use super::*;
        use crate::sync::{Condvar, Mutex};

        struct Chan<T> {
            /// Queued values and the number of live senders.
            q: Mutex<(VecDeque<T>, usize)>,
            cv: Condvar,
            /// The receiver is gone (a std flag: loom may drop a thread's closure, and
            /// with it the receiver, outside a model execution, where its primitives
            /// cannot be touched).
            closed: std::sync::atomic::AtomicBool,
        }

        /// The sending side.
        pub struct Sender<T>(Arc<Chan<T>>);
        /// The receiving side.
        pub struct Receiver<T>(Arc<Chan<T>>);

        /// A channel without a bound.
        pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
            let c = Arc::new(Chan {
                q: Mutex::new((VecDeque::new(), 1)),
                cv: Condvar::new(),
                closed: std::sync::atomic::AtomicBool::new(false),
            });
            (Sender(Arc::clone(&c)), Receiver(c))
        }

        impl<T> Sender<T> {
            /// Sends `v`; gives it back if the receiver is gone.
            pub fn send(&self, v: T) -> Result<(), T> {
                if self.0.closed.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(v);
                }
                let mut q = self.0.q.lock().unwrap_or_else(|p| p.into_inner());
                q.0.push_back(v);
                drop(q);
                self.0.cv.notify_all();
                Ok(())
            }
        }

        impl<T> Drop for Sender<T> {
            fn drop(&mut self) {
                let mut q = self.0.q.lock().unwrap_or_else(|p| p.into_inner());
                q.1 -= 1;
                drop(q);
                self.0.cv.notify_all();
            }
        }

        impl<T> Drop for Receiver<T> {
            fn drop(&mut self) {
                self.0.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }

        impl<T> Receiver<T> {
            /// Time is not modelled: waits for a value or for the last sender to go.
            pub fn recv_timeout(&self, _d: Duration) -> Result<T, RecvTimeoutError> {
                let mut q = self.0.q.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(v) = q.0.pop_front() {
                        return Ok(v);
                    }
                    if q.1 == 0 {
                        return Err(RecvTimeoutError::Disconnected);
                    }
                    q = self.0.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            }
            /// Everything queued, without waiting.
            pub fn drain(&self) -> Vec<T> {
                let mut q = self.0.q.lock().unwrap_or_else(|p| p.into_inner());
                q.0.drain(..).collect()
            }
        }
    }

    pub use imp::{Receiver, Sender, unbounded};
}
