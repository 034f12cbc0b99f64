//! What a subscription does with each sample of each key: our channel, the base key,
//! `_buf_cpu`, and `_buf/<our GID>` (CDR, or a CUDA buffer backend's descriptor,
//! imported off Zenoh's threads); its counters and exactly-once state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::super::attachment::{Attachment, AttachmentError};
use super::super::cuda_backend::{BackendBuffer, BackendImportError, ImportQueue};
use super::super::message::{DataField, EnvelopeError, RosDataMessage, check_data, decode_envelope};
use super::dedup::{Dedup, MAX_PUBLISHERS};
use super::sample::{Body, RosSample};
use crate::api::GpuSubscriber;
use crate::sample::{GpuSample, Path, SampleInfo};
use crate::sync::Unpoisoned;

#[derive(Default)]
pub(super) struct Counters {
    pub(super) channel: AtomicU64,
    pub(super) base: AtomicU64,
    pub(super) buf_cpu: AtomicU64,
    pub(super) cuda_buffers: AtomicU64,
    pub(super) buf_gid: AtomicU64,
    pub(super) backend_refused: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) bad_attachment: AtomicU64,
    pub(super) bad_cdr: AtomicU64,
    pub(super) bad_envelope: AtomicU64,
    pub(super) dropped_queue_full: AtomicU64,
    pub(super) polled_ns: AtomicU64,
}

/// Unread messages of a KEEP_ALL subscription past which it warns (again once it has
/// drained to half of it).
pub const KEEP_ALL_WARN: usize = 1024;

/// The state of a subscription that does not depend on its message type.
#[derive(Default)]
pub(super) struct Core {
    pub(super) dedup: Mutex<Dedup>,
    pub(super) counters: Counters,
    /// Why the last descriptor was not imported.
    pub(super) last_refusal: Mutex<Option<String>>,
    /// Refusals by kind ([`BackendImportError::kind`]).
    pub(super) refusals: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Publishers whose every descriptor so far was refused, with the last kind (the
    /// silent-publisher check reports them), and those delivered from on
    /// `_buf/<our GID>` (at most [`MAX_PUBLISHERS`] of each).
    pub(super) refused_only: Mutex<HashMap<[u8; 16], &'static str>>,
    pub(super) delivered_from: Mutex<std::collections::HashSet<[u8; 16]>>,
    /// Whether the KEEP_ALL queue's warning was given since it last drained.
    pub(super) warned_queue: std::sync::atomic::AtomicBool,
}

impl Core {
    pub(super) fn dedup(&self) -> std::sync::MutexGuard<'_, Dedup> {
        self.dedup.locked()
    }

    /// A message of `publisher` was delivered from `_buf/<our GID>`.
    fn delivered_from(&self, publisher: [u8; 16]) {
        self.refused_only.locked().remove(&publisher);
        let mut d = self.delivered_from.locked();
        if d.len() >= MAX_PUBLISHERS {
            d.clear();
        }
        d.insert(publisher);
    }

    /// A descriptor of `publisher` was refused.
    fn refused_from(&self, publisher: [u8; 16], kind: &'static str) {
        if !self.delivered_from.locked().contains(&publisher) {
            let mut r = self.refused_only.locked();
            if r.len() >= MAX_PUBLISHERS {
                r.clear();
            }
            r.insert(publisher, kind);
        }
    }
}

pub(super) struct Shared<M> {
    pub(super) tx: flume::Sender<RosSample<M>>,
    /// KEEP_LAST: the queue's own receiving end, to drop its oldest message when full
    /// (`None`: KEEP_ALL, whose queue has no limit).
    pub(super) oldest: Option<flume::Receiver<RosSample<M>>>,
    pub(super) core: Arc<Core>,
}

impl<M: RosDataMessage> Shared<M> {
    /// Queues a message for the application, never waiting, so that an application that
    /// stops reading holds up no Zenoh thread (and so no other topic). KEEP_LAST, as ROS
    /// does: a full queue drops its oldest message (counted in `dropped_queue_full`).
    /// KEEP_ALL: the queue has no limit; it warns as it grows past [`KEEP_ALL_WARN`].
    fn queue(&self, msg: RosSample<M>) {
        let Some(oldest) = &self.oldest else {
            let _ = self.tx.send(msg);
            let queued = self.tx.len();
            if queued < KEEP_ALL_WARN / 2 {
                self.core.warned_queue.store(false, Ordering::Relaxed);
            } else if queued >= KEEP_ALL_WARN && !self.core.warned_queue.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    queued,
                    "a KEEP_ALL subscription has this many messages not read yet: the application reads slower than \
                     they come (memory grows; publishers of GPU blocks are held back as their pools empty)"
                );
            }
            return;
        };
        let dropped = zcs_transport::subscriber::queue::push_dropping_oldest(&self.tx, oldest, msg);
        self.core.counters.dropped_queue_full.fetch_add(dropped, Ordering::Relaxed);
    }

    /// `Some(per_put)` for a message not delivered yet.
    fn first(&self, att: &Attachment, per_put_key: bool) -> Option<bool> {
        let new = self.core.dedup().first(att.gid, att.seq, per_put_key);
        if new.is_none() {
            self.core.counters.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        new
    }

    pub(super) fn on_channel(&self, sample: GpuSample) {
        let env = sample.info().meta.as_deref().ok_or(EnvelopeError::Missing).and_then(decode_envelope::<M>);
        let (attachment, msg) = match env {
            Ok(v) => v,
            Err(e) => {
                self.core.counters.bad_envelope.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %crate::error::Chain(&e), key = %sample.info().key, "dropping a channel sample");
                return;
            }
        };
        if M::DATA_IS_TEXT && sample.host_bytes().is_none_or(|t| check_data::<M>(&t).is_err()) {
            // Our publishers check text before sending it: this one did not.
            self.core.counters.bad_envelope.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(key = %sample.info().key, "dropping a channel sample whose text is not UTF-8 host bytes");
            return;
        }
        if let Some(seq_per_put) = self.first(&attachment, false) {
            self.core.counters.channel.fetch_add(1, Ordering::Relaxed);
            self.queue(RosSample { msg, attachment, seq_per_put, body: Body::Channel(sample) });
        }
    }

    /// The sample's rmw_zenoh attachment; `None` (counted) when it has no valid one.
    fn attachment(&self, sample: &zenoh::sample::Sample) -> Option<Attachment> {
        let attachment = match sample.attachment().map(|a| a.to_bytes()) {
            None => Err(AttachmentError::Missing),
            Some(a) => Attachment::decode(&a),
        };
        match attachment {
            Ok(a) => Some(a),
            Err(e) => {
                self.core.counters.bad_attachment.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %crate::error::Chain(&e), key = %sample.key_expr(), "dropping a sample without a valid attachment");
                None
            }
        }
    }

    fn bad_cdr(&self, e: &tensor_codec::cdr::CdrDecodeError, sample: &zenoh::sample::Sample) {
        self.core.counters.bad_cdr.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(error = %crate::error::Chain(e), key = %sample.key_expr(), "dropping a sample whose CDR does not decode");
    }

    /// A sample of `<base key>/_buf/<our GID>`: CDR in either form of a buffer field.
    /// Descriptors go to `queue` to be imported; CDR bytes are delivered as from the
    /// base key.
    pub(super) fn on_buf_gid(&self, sample: zenoh::sample::Sample, queue: &ImportQueue<(M, Attachment, bool)>) {
        let Some(attachment) = self.attachment(&sample) else { return };
        let payload = sample.payload().clone();
        let (msg, field) = match M::decode_cdr_buffer(&payload.to_bytes()) {
            Ok(v) => v,
            Err(e) => return self.bad_cdr(&e, &sample),
        };
        // The publisher numbers each put (one per subscription key): gaps are not losses.
        let Some(seq_per_put) = self.first(&attachment, true) else { return };
        match field {
            DataField::Bytes(range) => {
                self.core.counters.buf_gid.fetch_add(1, Ordering::Relaxed);
                self.core.delivered_from(attachment.gid);
                self.queue(RosSample { msg, attachment, seq_per_put, body: Body::Base { payload, range } });
            }
            DataField::Cuda(d) => {
                let gid = attachment.gid;
                if !queue.push(d, (msg, attachment, seq_per_put)) {
                    self.refused(gid, "import-thread", "the import thread has ended".into());
                }
            }
        }
    }

    /// The end of an import: the buffer delivered as a sample of `channel`, or the
    /// refusal counted.
    pub(super) fn on_imported(
        &self,
        channel: &std::sync::Weak<GpuSubscriber<()>>,
        key: &str,
        (msg, attachment, seq_per_put): (M, Attachment, bool),
        imported: Result<BackendBuffer, BackendImportError>,
    ) {
        let buffer = match imported {
            Ok(b) => b,
            Err(e) => return self.refused(attachment.gid, e.kind(), crate::error::Chain(&e).to_string()),
        };
        self.core.delivered_from(attachment.gid);
        let info = SampleInfo {
            key: key.to_owned(),
            publisher: 0,
            seq: attachment.seq as u64,
            timestamp_ns: attachment.timestamp_ns.max(0) as u64,
            path: Path::ZeroCopy,
            meta: None,
        };
        let Some(sample) = channel.upgrade().and_then(|c| c.foreign_sample(info, Box::new(buffer))) else { return };
        self.core.counters.cuda_buffers.fetch_add(1, Ordering::Relaxed);
        self.queue(RosSample { msg, attachment, seq_per_put, body: Body::Channel(sample) });
    }

    fn refused(&self, publisher: [u8; 16], kind: &'static str, why: String) {
        *self.core.refusals.locked().entry(kind).or_default() += 1;
        self.core.refused_from(publisher, kind);
        if self.core.counters.backend_refused.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(reason = %why, "a CUDA buffer descriptor was refused; its message is lost (RosSubscriber::backend_refusal)");
        } else {
            tracing::debug!(reason = %why, "a CUDA buffer descriptor was refused");
        }
        *self.core.last_refusal.locked() = Some(why);
    }

    /// A sample of the base key, or of `_buf_cpu` when `via_buf_cpu`: the same CDR.
    /// A publisher's end notice (`<base key>/@zcs_ros2_end`): what it published after
    /// the last message delivered from it counts as lost.
    pub(super) fn on_end(&self, sample: &zenoh::sample::Sample) {
        if let Some(notice) = self.attachment(sample) {
            self.core.dedup().ended(&notice.gid, notice.seq);
        }
    }

    pub(super) fn on_base(&self, sample: zenoh::sample::Sample, via_buf_cpu: bool) {
        let Some(attachment) = self.attachment(&sample) else { return };
        let payload = sample.payload().clone();
        let decoded = M::decode_cdr(&payload.to_bytes());
        let (msg, range) = match decoded {
            Ok(v) => v,
            Err(e) => return self.bad_cdr(&e, &sample),
        };
        if let Some(seq_per_put) = self.first(&attachment, via_buf_cpu) {
            let c = &self.core.counters;
            if via_buf_cpu { &c.buf_cpu } else { &c.base }.fetch_add(1, Ordering::Relaxed);
            self.queue(RosSample { msg, attachment, seq_per_put, body: Body::Base { payload, range } });
        }
    }
}
