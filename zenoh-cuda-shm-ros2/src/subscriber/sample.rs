//! A received ROS message: its fields, its attachment, and its data where it arrived.

use std::borrow::Cow;
use std::ops::Range;

use zenoh::bytes::ZBytes;

use super::super::attachment::Attachment;
use super::super::message::RosDataMessage;
use crate::sample::{GpuSample, Path, ReadError};

pub(super) enum Body {
    Channel(GpuSample),
    Base { payload: ZBytes, range: Range<usize> },
}

/// A received ROS message: its fields, its attachment, and its data where it arrived
/// (a GPU sample from our channel or of a CUDA buffer backend's block, or CDR bytes).
pub struct RosSample<M> {
    pub(super) msg: M,
    pub(super) attachment: Attachment,
    pub(super) seq_per_put: bool,
    pub(super) body: Body,
}

impl<M: RosDataMessage + std::fmt::Debug> std::fmt::Debug for RosSample<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RosSample")
            .field("msg", &self.msg)
            .field("attachment", &self.attachment)
            .field("path", &self.path())
            .field("data_len", &self.data_len())
            .finish()
    }
}

impl<M: RosDataMessage> RosSample<M> {
    /// The message fields (no data).
    pub fn msg(&self) -> &M {
        &self.msg
    }

    /// The rmw_zenoh attachment (sequence number, source timestamp, publisher GID).
    pub fn attachment(&self) -> &Attachment {
        &self.attachment
    }

    /// Whether its publisher numbers each put rather than each message (a buffer-aware
    /// rmw_zenoh publisher, as far as known when it arrived): gaps in its sequence
    /// numbers are then not losses.
    pub fn seq_per_put(&self) -> bool {
        self.seq_per_put
    }

    /// How the data arrived: our channel's paths, or [`Path::Plain`] for the CDR
    /// message on the base key or `_buf_cpu`.
    pub fn path(&self) -> Path {
        match &self.body {
            Body::Channel(s) => s.path(),
            Body::Base { .. } => Path::Plain,
        }
    }

    /// Length of the data field.
    pub fn data_len(&self) -> usize {
        match &self.body {
            Body::Channel(s) => s.len(),
            Body::Base { range, .. } => range.len(),
        }
    }

    /// The message's data as a sample read in place on a CUDA stream: from our channel,
    /// or a buffer of ROS 2's CUDA buffer backend mapped here. `None` for CDR bytes.
    pub fn gpu_sample(&self) -> Option<&GpuSample> {
        match &self.body {
            Body::Channel(s) => Some(s),
            Body::Base { .. } => None,
        }
    }

    /// The data as host bytes without a copy where possible (`None` for device blocks:
    /// use [`RosSample::gpu_sample`] or [`RosSample::data_to_vec`]).
    pub fn host_data(&self) -> Option<Cow<'_, [u8]>> {
        match &self.body {
            Body::Channel(s) => s.host_bytes(),
            Body::Base { payload, range } => Some(match payload.to_bytes() {
                Cow::Borrowed(b) => Cow::Borrowed(&b[range.clone()]),
                Cow::Owned(b) => Cow::Owned(b[range.clone()].to_vec()),
            }),
        }
    }

    /// An owned host copy of the data (device→host for device blocks).
    ///
    /// # Errors
    /// [`ReadError`] when the device→host copy of a message from our channel fails (a
    /// CUDA error, the ready signal, or a publisher that died before its writes were
    /// done). A message from the base key is host memory and never fails.
    pub fn data_to_vec(&self) -> Result<Vec<u8>, ReadError> {
        match &self.body {
            Body::Channel(s) => s.to_vec(),
            Body::Base { .. } => Ok(self.host_data().map(Cow::into_owned).unwrap_or_default()),
        }
    }

    /// The whole message with its data copied to host memory.
    ///
    /// # Errors
    /// As [`RosSample::data_to_vec`].
    pub fn to_message(&self) -> Result<M::Owned, ReadError> {
        Ok(self.msg.with_data(self.data_to_vec()?))
    }
}
