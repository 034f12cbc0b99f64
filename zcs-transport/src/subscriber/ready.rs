//! A publisher's ready signals as this subscriber waits on them (CUDA links): which
//! generations our streams may be waiting for, and, once the publisher's process has
//! died, the signals it never wrote written by us so that no stream of ours waits
//! forever; reads of blocks that were never ready are refused.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::delivery::ReadError;
use crate::cuda::Stream;
use crate::pool::BlockKey;
use crate::signal::{ReadySignals, SignalError};
use crate::sync::Unpoisoned;

/// Set once, by the subscriber's declaration after its first handshakes have started
/// (or by a link that needs it before that).
pub(super) type ReleaseStream = Arc<std::sync::OnceLock<Stream>>;

/// One link's view of its publisher's ready signals.
pub(crate) struct PublisherSignals {
    /// The publisher's signal block, mapped here (`None`: host blocks, no signals).
    signals: Option<Arc<ReadySignals>>,
    /// The publisher process (0 when in another PID namespace: unknown).
    pid: i32,
    /// Highest generation handed to samples, per ready-signal slot: what our streams
    /// may be waiting for.
    awaited: Mutex<HashMap<u32, u64>>,
    /// Block generations whose ready signal never came because the publisher died
    /// first: reads of them are refused (`ReadError::PublisherDied`).
    unready: Mutex<HashSet<(u32, u64)>>,
    /// The subscriber's stream for writing a dead publisher's signals.
    release_stream: ReleaseStream,
}

impl PublisherSignals {
    pub(super) fn new(signals: Option<Arc<ReadySignals>>, pid: i32, release_stream: ReleaseStream) -> Self {
        Self { signals, pid, awaited: Mutex::default(), unready: Mutex::default(), release_stream }
    }

    /// The publisher's signal block (`None` for host blocks).
    pub(super) fn block(&self) -> Option<&Arc<ReadySignals>> {
        self.signals.as_ref()
    }

    /// The publisher's process, if it has signals to watch for: a dead one's are
    /// written by us.
    pub(super) fn watched_pid(&self) -> Option<i32> {
        (self.signals.is_some() && self.pid > 0).then_some(self.pid)
    }

    /// A sample of block `key` is handed out: a stream of ours may wait for it.
    pub(super) fn awaiting(&self, key: BlockKey) {
        if self.signals.is_none() {
            return;
        }
        let mut awaited = self.awaited.locked();
        let g = awaited.entry(key.id).or_insert(0);
        *g = (*g).max(key.generation);
    }

    /// Whether the publisher died before signalling this block generation ready.
    pub(crate) fn died_unready(&self, key: BlockKey) -> bool {
        self.unready.locked().contains(&(key.id, key.generation))
    }

    /// Makes work enqueued on `stream` after this call wait for block `key` to be ready
    /// (no host wait); refused for a generation its dead publisher never signalled.
    pub(super) fn wait(&self, stream: &Stream, key: BlockKey) -> Result<(), ReadError> {
        if self.died_unready(key) {
            return Err(ReadError::PublisherDied);
        }
        let signals = self.signals.as_ref().ok_or(ReadError::Signal(SignalError::Unsupported))?;
        signals.wait(stream, key.id, key.generation)?;
        Ok(())
    }

    /// The publisher process has exited: any ready signal it had not yet written never
    /// will be, and a stream of ours waiting on one would wait forever. Write the awaited
    /// values ourselves (the signal block is mapped here read-write; nobody else writes
    /// it any more) and remember which generations were not ready.
    pub(super) fn release_waiters_of_dead_publisher(&self) {
        let Some(signals) = &self.signals else { return };
        let awaited: Vec<(u32, u64)> = self.awaited.locked().iter().map(|(s, g)| (*s, *g)).collect();
        // Created by the subscriber's declaration, unless this comes first.
        let stream = match self.release_stream.get() {
            Some(s) => s.clone(),
            None => match signals.gpu().new_stream() {
                Ok(s) => self.release_stream.get_or_init(|| s).clone(),
                Err(e) => {
                    return tracing::error!(error = %crate::error::Chain(&e), "no stream to release waits on a dead publisher's signals");
                }
            },
        };
        let mut unready = 0;
        for (slot, generation) in awaited {
            match signals.read_slot_on(slot, &stream) {
                Ok(v) if v >= generation => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %crate::error::Chain(&e), slot, "cannot read a dead publisher's signal slot")
                }
            }
            unready += 1;
            self.unready.locked().insert((slot, generation));
            if let Err(e) = signals.signal(&stream, slot, generation) {
                tracing::error!(error = %crate::error::Chain(&e), slot, "cannot release a wait on a dead publisher's signal");
            }
        }
        if unready > 0 {
            tracing::warn!(
                unready,
                "publisher died before signalling blocks ready; their readers were released and reads of them are refused"
            );
        }
    }
}
