//! What a process reports to its host provider: its publishers and subscribers, and the
//! path to each peer.

use serde::{Deserialize, Serialize};

/// A process's publishers and subscribers, as it reports them to its provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Its publishers.
    pub publishers: Vec<PublisherReport>,
    /// Its GPU-aware subscribers.
    pub subscribers: Vec<SubscriberReport>,
}

/// One publisher: who it serves how, and what copies it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublisherReport {
    /// Its key.
    pub key: String,
    /// Its instance id.
    pub instance: u64,
    /// Its device chunk (`cuda-<uuid>` or `host`).
    pub device: String,
    /// Each GPU-aware subscriber it knows of, and the path it serves it.
    pub subscribers: Vec<PathReport>,
    /// Whether plain Zenoh subscribers match its key (each message is then copied out
    /// once and put on the key).
    pub plain_listeners: bool,
    /// Messages published.
    pub messages: u64,
    /// Device→host (or host) copies made for bytes receivers.
    pub copies_out: u64,
    /// Bytes so copied.
    pub copied_bytes: u64,
    /// Messages sent as bytes to a subscriber at its lease limit.
    pub lease_limited: u64,
}

/// One GPU-aware subscriber: the path it takes from each publisher it knows of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriberReport {
    /// Its key expression.
    pub key: String,
    /// Its instance id.
    pub instance: u64,
    /// Its device chunk.
    pub device: String,
    /// Each publisher of ours it knows of, and its path.
    pub publishers: Vec<PathReport>,
    /// Samples delivered over the zero-copy link: read in place, or copied onto the
    /// subscriber's GPU on arrival (`peer-copy`).
    pub zero_copy: u64,
    /// Samples delivered as bytes (copied).
    pub cpu_bytes: u64,
    /// Descriptors refused (stale, forged or out of bounds) and imports that failed.
    pub bad_descriptors: u64,
    /// Imports that failed.
    pub import_failures: u64,
    /// Messages missing: gaps in a publisher's sequence numbers after its first
    /// delivered message, less gaps filled late.
    pub lost: u64,
}

/// The path between one publisher and one subscriber, seen from one end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathReport {
    /// The other end's instance id.
    pub peer: u64,
    /// `zero-copy`, `zero-copy-peer` (another GPU's block read over the link),
    /// `peer-copy` (copied onto the subscriber's GPU on arrival; seen from the
    /// subscriber only) or `bytes`.
    pub path: String,
    /// Why not zero-copy (another host, another device, a failed handshake), if known.
    pub reason: Option<String>,
}
