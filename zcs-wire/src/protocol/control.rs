//! The control connection's messages (subscriber ↔ publisher), the descriptor of a
//! block and the header of bytes sent through Zenoh.

use serde::{Deserialize, Serialize};

use crate::pool::BlockKey;

use super::*;

/// Tensor or other typed metadata that travels with a message (opaque here; the
/// `tensor-codec` crate defines the format).
pub type Meta = Option<Vec<u8>>;

/// A descriptor: what a GPU-ready subscriber needs to read a block in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    /// The publisher's instance id.
    pub publisher: u64,
    /// Per-publisher sequence number, from 1.
    pub seq: u64,
    /// Which block generation.
    pub block: BlockKey,
    /// Capability that must be presented to get the block's FD.
    pub capability: u64,
    /// Size of the whole block (what an importer maps).
    pub block_size: u64,
    /// Offset of the payload in the block.
    pub offset: u64,
    /// Payload length.
    pub len: u64,
    /// Publication time, ns since the Unix epoch (publisher clock).
    pub timestamp_ns: u64,
    /// Typed metadata.
    pub meta: Meta,
    /// The provider's loan id when the block is lent by the host's provider: its FD is
    /// then opened there ([`ProviderRequest::Open`]), not asked of the publisher.
    pub lent: Option<u64>,
}

/// Header attached to bytes we publish (on the plain key and on `<key>/@zcs/b`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BytesHeader {
    /// The publisher's instance id.
    pub publisher: u64,
    /// Per-publisher sequence number (same numbering as descriptors).
    pub seq: u64,
    /// Publication time, ns since the Unix epoch (publisher clock).
    pub timestamp_ns: u64,
    /// Whether the payload came from a block (copied out) or was inline.
    pub from_block: bool,
    /// `CapabilityKey::bytes_tag(publisher, seq, payload length)`: subscribers
    /// handshaken with the publisher hold the key and drop a header that fails it.
    pub tag: u64,
    /// Typed metadata.
    pub meta: Meta,
}

/// Magic prefix of our attachment, so a plain publisher's attachment is not misread.
pub const ATTACHMENT_MAGIC: &[u8; 4] = b"ZCS\x01";

/// Handle type bit: a block travels as a POSIX file descriptor over the control
/// connection (CUDA's `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`; memfds alike).
pub const HANDLE_POSIX_FD: u8 = 1;
/// Handle type bit reserved for CUDA fabric handles (`CU_MEM_HANDLE_TYPE_FABRIC`),
/// which cross nodes of one NVLink domain; no release sets it yet.
pub const HANDLE_FABRIC: u8 = 8;
/// The handle types this build imports and exports.
pub const HANDLES: u8 = HANDLE_POSIX_FD;

/// Control messages, subscriber → publisher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message on a connection.
    Hello {
        /// The subscriber's instance id.
        subscriber: u64,
        /// Its locality group (must equal the publisher's).
        group: Group,
        /// The frame carries the subscriber process's lifeline, a memfd (see
        /// [`crate::ipc::Lifeline`]): the publisher learns of the process's death from
        /// it, before the connection ends.
        lifeline: bool,
        /// The block handle types the subscriber can import ([`HANDLE_POSIX_FD`], …).
        handles: u8,
    },
    /// The probe was imported (`token` read back from it), or failed.
    Ack {
        /// The probe token read back, or `None` if the import failed.
        token: Option<u64>,
        /// Why, when the import failed.
        error: Option<String>,
    },
    /// The FD of a block named in a descriptor.
    Fd {
        /// Block generation.
        block: BlockKey,
        /// Capability from the descriptor.
        capability: u64,
    },
    /// Done with these block generations (their reads have completed on the GPU).
    Release {
        /// Block generations released.
        blocks: Vec<BlockKey>,
    },
    /// The subscriber is closing: route nothing more over this connection. Leases it
    /// holds stay until released or until the connection ends.
    Leave,
}

/// Control messages, publisher → subscriber.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Answer to `Hello`: the probe (and, for CUDA, the signal block) follows as FDs.
    Welcome {
        /// The publisher's instance id.
        publisher: u64,
        /// The holder id the publisher charges this connection's leases to.
        holder: u64,
        /// Key of the capability PRF (see [`crate::pool::CapabilityKey`]), so the
        /// subscriber can verify descriptors locally.
        capability_key: [u8; 16],
        /// Size of the signal block (CUDA) or probe memfd (host).
        probe_size: u64,
        /// Token written into the probe memfd (host backend).
        probe_token: u64,
        /// The host provider this publisher borrows blocks from, if any: a subscriber
        /// opens lent blocks there, so it must reach it to be GPU-ready.
        provider: Option<ProviderRef>,
        /// The handle types the publisher's blocks are exported as; it serves one that
        /// the subscriber's `Hello` names.
        handles: u8,
    },
    /// The handshake failed.
    Refused {
        /// Why.
        reason: String,
    },
    /// The subscriber is GPU-ready: from message `first_seq` on, every message of the
    /// publisher is routed to it over this connection, in order, as [`Reply::Block`],
    /// [`Reply::Inline`] or [`Reply::ViaBytes`]; earlier ones went to it (if at all)
    /// as bytes through Zenoh.
    Ready {
        /// The first sequence number routed over this connection.
        first_seq: u64,
        /// The last earlier message put as bytes on the publisher's channel after it
        /// learned of this subscriber (0 if none): the link's first delivery waits
        /// for it, so a late joiner's first messages keep their order.
        bytes_through: u64,
    },
    /// A block to read in place, leased to this subscriber.
    Block(Descriptor),
    /// A small message, carried whole.
    Inline {
        /// Per-publisher sequence number.
        seq: u64,
        /// Publication time, ns since the Unix epoch (publisher clock).
        timestamp_ns: u64,
        /// Typed metadata.
        meta: Meta,
        /// The payload (at most [`crate::ipc::MAX_FRAME_BYTES`] with the rest of the
        /// frame).
        data: Vec<u8>,
    },
    /// Message `seq` goes to this subscriber as bytes through Zenoh (the subscriber
    /// is at its lease limit, or the message is too large to carry inline): deliver it
    /// from there before anything routed after it.
    ViaBytes {
        /// Per-publisher sequence number.
        seq: u64,
    },
    /// Answer to [`Request::Leave`]: nothing more is routed over this connection.
    Left,
    /// Answer to `Fd`: the block's FD follows.
    Fd {
        /// Block generation.
        block: BlockKey,
        /// Its size.
        size: u64,
    },
    /// Answer to `Fd` when the block generation or capability does not match.
    FdDenied {
        /// Block generation asked for.
        block: BlockKey,
        /// Why.
        reason: String,
    },
}
