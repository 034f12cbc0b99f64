//! Bytes out through Zenoh, in sequence order: our two Zenoh publishers of bytes, and
//! (for a CUDA publisher) the lane that puts its copies out.
//!
//! A put only enqueues its device→host copy and hands it to the lane; the lane's thread
//! waits for each copy and puts it, so the copy of the next message runs while Zenoh
//! sends this one. The lane takes one message while it puts another: a put that finds
//! it occupied waits there, so backpressure stays at `put` and at most two copies out
//! are in flight. Bytes that need no copy go through the lane while it holds anything,
//! so every subscriber sees one publisher's bytes in sequence order. A failure after
//! `put` has returned (the copy, or Zenoh's put) is counted (`late_failures`) and
//! logged. Dropping the lane puts what it holds first.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use zenoh::Wait;
use zenoh::bytes::ZBytes;

use super::{PutError, Shared, inc};
use crate::RateLimitedWarn;
use crate::cuda::Filling;
use crate::medium::OutBuf;
use crate::protocol::{self, BytesHeader};

/// Our Zenoh publishers of bytes: on the plain key (plain Zenoh and ROS subscribers),
/// and on our channel (GPU-aware subscribers off the zero-copy path).
pub(super) struct BytesOut {
    pub(super) plain: zenoh::pubsub::Publisher<'static>,
    pub(super) aware: zenoh::pubsub::Publisher<'static>,
    /// Failures after `put` returned, logged at most every few seconds.
    pub(super) late: RateLimitedWarn,
}

impl BytesOut {
    /// Puts `bytes` with `header` where asked (the publisher counted them when it
    /// decided).
    pub(super) fn put(
        &self,
        bytes: ZBytes,
        header: &BytesHeader,
        to_aware: bool,
        to_plain: bool,
    ) -> Result<(), PutError> {
        let att = protocol::encode_attachment(header);
        if to_aware {
            let key = || self.aware.key_expr().as_str().to_owned();
            let put = self.aware.put(bytes.clone()).attachment(att.clone());
            put.wait().map_err(|source| PutError::Zenoh { key: key(), source })?;
        }
        if to_plain {
            let key = || self.plain.key_expr().as_str().to_owned();
            self.plain.put(bytes).attachment(att).wait().map_err(|source| PutError::Zenoh { key: key(), source })?;
        }
        Ok(())
    }

    /// The end notice on our channel: a delete carrying `header` (the publisher's last
    /// sequence number), after every bytes message of the publisher, so that subscribers
    /// off the zero-copy path can count messages lost at the end of its stream.
    /// Subscribers that do not know it ignore deletes there.
    pub(super) fn end(&self, header: &BytesHeader) -> Result<(), PutError> {
        let key = || self.aware.key_expr().as_str().to_owned();
        let att = protocol::encode_attachment(header);
        self.aware.delete().attachment(att).wait().map_err(|source| PutError::Zenoh { key: key(), source })
    }
}

/// A message for the lane to put.
pub(super) struct Job {
    pub(super) payload: Payload,
    pub(super) header: BytesHeader,
    pub(super) to_aware: bool,
    pub(super) to_plain: bool,
}

/// A message's bytes: being copied out, or ready.
pub(super) enum Payload {
    Copying(Filling<OutBuf>),
    Ready(ZBytes),
}

/// The lane: its thread, and how many messages it holds.
pub(super) struct BytesLane {
    jobs: Option<flume::Sender<Job>>,
    /// Messages handed to the lane and not yet put (or failed).
    held: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
    out: Arc<BytesOut>,
    sh: Arc<Shared>,
}

impl BytesLane {
    /// A lane putting through `out`, counting in `sh`.
    pub(super) fn new(out: Arc<BytesOut>, sh: Arc<Shared>) -> std::io::Result<Self> {
        // Rendezvous: a put hands its message over only when the thread takes it.
        let (jobs, rx) = flume::bounded::<Job>(0);
        let held = Arc::new(AtomicUsize::new(0));
        let (o, s, h) = (Arc::clone(&out), Arc::clone(&sh), Arc::clone(&held));
        let thread = std::thread::Builder::new().name("zcs-pub-bytes".into()).spawn(move || {
            for job in rx {
                put_job(&o, &s, job);
                h.fetch_sub(1, Ordering::Release);
            }
        })?;
        Ok(Self { jobs: Some(jobs), held, thread: Some(thread), out, sh })
    }

    /// Whether the lane holds a message not yet put: bytes put now must go through it.
    pub(super) fn busy(&self) -> bool {
        self.held.load(Ordering::Acquire) > 0
    }

    /// Hands `job` to the lane, waiting while it holds a message besides the one it puts.
    pub(super) fn send(&self, job: Job) {
        self.held.fetch_add(1, Ordering::AcqRel);
        let back = match &self.jobs {
            Some(jobs) => jobs.send(job).err().map(|e| e.into_inner()),
            None => Some(job),
        };
        // The thread is gone (it cannot be while the publisher lives): put it here.
        if let Some(job) = back {
            put_job(&self.out, &self.sh, job);
            self.held.fetch_sub(1, Ordering::Release);
        }
    }
}

impl BytesLane {
    /// Puts what the lane holds and stops its thread; later messages are put by the
    /// caller. Idempotent.
    pub(super) fn close(&mut self) {
        // The thread puts what it holds, then sees the channel closed.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BytesLane {
    fn drop(&mut self) {
        self.close();
    }
}

/// Waits for a job's copy and puts it; a failure is counted and logged (`put` returned
/// long ago).
fn put_job(out: &BytesOut, sh: &Shared, job: Job) {
    let c = &sh.counters;
    let bytes = match job.payload {
        Payload::Ready(b) => b,
        Payload::Copying(f) => match f.wait() {
            Ok(buf) => buf.into_payload().0,
            Err(e) => {
                inc(&c.late_failures);
                let detail = format!("{} seq {}: {}", sh.key, job.header.seq, crate::error::Chain(&e));
                out.late.warn("a device→host copy out failed: message lost for bytes subscribers", &detail);
                return;
            }
        },
    };
    if let Err(e) = out.put(bytes, &job.header, job.to_aware, job.to_plain) {
        inc(&c.late_failures);
        let detail = format!("seq {}: {}", job.header.seq, crate::error::Chain(&e));
        out.late.warn("Zenoh refused a put of bytes: message lost for bytes subscribers", &detail);
    }
}
