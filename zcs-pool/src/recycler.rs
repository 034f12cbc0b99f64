//! The recycler: a named thread that completes releases whose fences were still
//! pending, and trims idle blocks.
//!
//! Every pending release is polled each pass (`cuEventQuery` does not block), so one
//! slow reader never delays another's release — the reference design's recycler
//! synchronised one event at a time. Passes back off from 20 µs to 1 ms while work is
//! pending; with nothing pending the thread sleeps until a job arrives or the trim
//! interval passes. Dropping the [`Recycler`] stops the thread and joins it; releases
//! still pending then run once their fences complete, on the dropping thread, so every
//! CUDA free happens before the pool's context can go away.

use std::time::{Duration, Instant};

use super::Fence;
use crate::sync::Unpoisoned;
use crate::sync::channel::{self, RecvTimeoutError};
use crate::sync::{JoinHandle, Mutex};

/// A release to run once all its fences are complete.
pub struct Job {
    /// What must complete first.
    pub fences: Vec<Box<dyn Fence>>,
    /// The release.
    pub done: Box<dyn FnOnce() + Send>,
}

enum Msg {
    Job(Job),
    Stop,
}

type TrimFn = Box<dyn Fn() + Send>;

type SharedTx = std::sync::Arc<Mutex<Option<channel::Sender<Msg>>>>;

/// Sends jobs to the recycler thread; used by the pool's shared state.
pub struct RecyclerHandle {
    tx: SharedTx,
}

impl RecyclerHandle {
    /// Runs `job` on the recycler thread once its fences complete (at once when the
    /// recycler has stopped and they have).
    pub fn submit(&self, job: Job) {
        let tx = self.tx.locked();
        match tx.as_ref() {
            // The lock is held across the send, so once `Recycler::drop` has taken the
            // sender no job can slip into the channel after its final drain.
            Some(tx) => {
                if let Err(Msg::Job(job)) = tx.send(Msg::Job(job)) {
                    finish_blocking(job);
                }
            }
            // The pool was dropped while a block was still in use: finish the release
            // here, waiting for its fences, so nothing leaks.
            None => {
                drop(tx);
                finish_blocking(job);
            }
        }
    }
}

fn finish_blocking(job: Job) {
    let mut backoff = Duration::from_micros(20);
    while !job.fences.iter().all(|f| f.is_complete()) {
        crate::sync::pause(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(1));
    }
    (job.done)();
}

/// Owns the recycler thread; joins it on drop.
pub struct Recycler {
    tx: SharedTx,
    trim: std::sync::Arc<Mutex<Option<TrimFn>>>,
    thread: Option<JoinHandle<Vec<Job>>>,
    /// The queue: the thread takes it while it runs and puts it back when it stops;
    /// untouched if the thread never started. Drop finishes what is left in it.
    queue: Queue,
    trim_every: Duration,
}

type Queue = std::sync::Arc<std::sync::Mutex<Option<channel::Receiver<Msg>>>>;

impl Recycler {
    pub(crate) fn start(trim_every: Duration) -> std::io::Result<(Self, RecyclerHandle)> {
        let (mut recycler, handle) = Self::prepare(trim_every);
        recycler.start_thread()?;
        Ok((recycler, handle))
    }

    /// A recycler whose thread is not started yet ([`Recycler::start_thread`]): jobs
    /// submitted meanwhile queue, and are finished on drop if it never starts.
    pub fn prepare(trim_every: Duration) -> (Self, RecyclerHandle) {
        let (tx, rx) = channel::unbounded::<Msg>();
        let tx: SharedTx = std::sync::Arc::new(Mutex::new(Some(tx)));
        let recycler = Self {
            tx: std::sync::Arc::clone(&tx),
            trim: std::sync::Arc::new(Mutex::new(None)),
            thread: None,
            queue: std::sync::Arc::new(std::sync::Mutex::new(Some(rx))),
            trim_every,
        };
        (recycler, RecyclerHandle { tx })
    }

    /// Starts the thread of a [`Recycler::prepare`]d recycler; does nothing once it
    /// runs.
    pub fn start_thread(&mut self) -> std::io::Result<()> {
        if self.thread.is_some() {
            return Ok(());
        }
        let (queue, trim, trim_every) =
            (std::sync::Arc::clone(&self.queue), std::sync::Arc::clone(&self.trim), self.trim_every);
        self.thread = Some(crate::sync::spawn("zcs-recycler", move || {
            let Some(rx) = queue.locked().take() else { return Vec::new() };
            let pending = run(&rx, &trim, trim_every);
            *queue.locked() = Some(rx);
            pending
        })?);
        Ok(())
    }

    pub(crate) fn set_trim(&self, f: TrimFn) {
        *self.trim.locked() = Some(f);
    }
}

/// Until stopped; returns the jobs still pending then.
fn run(rx: &channel::Receiver<Msg>, trim: &Mutex<Option<TrimFn>>, trim_every: Duration) -> Vec<Job> {
    let mut pending: Vec<Job> = Vec::new();
    let mut backoff = Duration::from_micros(20);
    let mut next_trim = Instant::now() + trim_every;
    loop {
        let timeout = if pending.is_empty() { next_trim.saturating_duration_since(Instant::now()) } else { backoff };
        let first = match rx.recv_timeout(timeout) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Msg::Stop),
        };
        let mut stop = false;
        for msg in first.into_iter().chain(rx.drain()) {
            match msg {
                Msg::Job(j) => pending.push(j),
                Msg::Stop => stop = true,
            }
        }
        if stop {
            return pending;
        }
        if !pending.is_empty() {
            let _span = tracing::trace_span!("recycle", pending = pending.len()).entered();
            let before = pending.len();
            let mut i = 0;
            while i < pending.len() {
                if pending[i].fences.iter().all(|f| f.is_complete()) {
                    let job = pending.swap_remove(i);
                    (job.done)();
                } else {
                    i += 1;
                }
            }
            backoff = if pending.len() < before {
                Duration::from_micros(20)
            } else {
                (backoff * 2).min(Duration::from_millis(1))
            };
        }
        if Instant::now() >= next_trim {
            if let Some(f) = trim.locked().as_ref() {
                f();
            }
            next_trim = Instant::now() + trim_every;
        }
    }
}

fn job(m: Msg) -> Option<Job> {
    match m {
        Msg::Job(j) => Some(j),
        Msg::Stop => None,
    }
}

impl Drop for Recycler {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.locked().take() {
            let _ = tx.send(Msg::Stop);
        }
        self.trim.locked().take();
        let mut left = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(pending)) => pending,
            Some(Err(_)) => {
                tracing::error!("the recycler thread panicked");
                Vec::new()
            }
            None => Vec::new(),
        };
        // What was queued after the thread's last pass, or everything if it never started.
        if let Some(rx) = self.queue.locked().take() {
            left.extend(rx.drain().into_iter().filter_map(job));
        }
        left.into_iter().for_each(finish_blocking);
    }
}
