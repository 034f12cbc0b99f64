//! What a received sample says of itself: its metadata and the path that delivered it.

/// How a sample reached this subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Path {
    /// In place: the publisher's block mapped here (device memory, or host memory
    /// where there is no GPU). No copy was made.
    ZeroCopy,
    /// Small payload sent inline as bytes (below the inline threshold).
    Inline,
    /// Bytes copied out of a block, because this subscriber could not map it (other
    /// host or device, handshake not finished, at its lease limit).
    CpuBytes,
    /// From a publisher that is not ours (plain Zenoh or ROS).
    Plain,
    /// In place over NVLink or PCIe: the publisher's block lives on another GPU of this
    /// host and is mapped for this subscriber's GPU, which reads it across the link.
    /// Device pointers and DLPack exports are this subscriber's GPU's, the device that
    /// can read them. No copy was made.
    ZeroCopyPeer,
    /// Copied once, on arrival, from the publisher's block on another GPU of this host
    /// into a block of this subscriber's GPU, on the subscriber's stream
    /// (`peer_gpus: copy`). The publisher's lease went back when the copy completed;
    /// reads are local.
    PeerCopy,
    /// Read in place from host memory: the publisher's block lives on a GPU of this host
    /// and this subscriber maps host memory only (no CUDA), so the publisher copied it
    /// once, device→host, into a shared host block that every such subscriber reads.
    HostBlock,
    /// Copied once, on arrival, from a host block (as for `HostBlock`) into a block of
    /// this subscriber's GPU, on the subscriber's stream: the publisher is on a GPU of
    /// this host that this one cannot map (no peer access, a GPU this process does not
    /// see), or `peer_gpus: host`; or it has no GPU, and its own blocks are the host
    /// blocks. The publisher's lease went back when the copy completed; reads are local.
    HostCopy,
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ZeroCopy => "zero-copy",
            Self::ZeroCopyPeer => "zero-copy-peer",
            Self::PeerCopy => "peer-copy",
            Self::HostBlock => "host-block",
            Self::HostCopy => "host-copy",
            Self::Inline => "inline",
            Self::CpuBytes => "cpu-bytes",
            Self::Plain => "plain",
        })
    }
}

impl Path {
    /// Why a sample came by this path, in words to print beside it: `None` for
    /// [`Path::ZeroCopy`] (the fastest path needs no excuse). For [`Path::CpuBytes`] the
    /// general reason; the subscriber knows the one of each publisher.
    pub fn reason(&self) -> Option<&'static str> {
        Some(match self {
            Self::ZeroCopy => return None,
            Self::ZeroCopyPeer => {
                "the publisher's block, on another GPU of this host, read in place over NVLink or PCIe"
            }
            Self::PeerCopy => {
                "the publisher's block, on another GPU of this host, copied onto this GPU on arrival (peer_gpus: copy)"
            }
            Self::HostBlock => {
                "the publisher's block, on a GPU of this host, copied once into shared host memory for this \
                 process, which has no GPU of its own"
            }
            Self::HostCopy => {
                "the publisher's block, on a GPU of this host that this one does not map (no peer access, or \
                 peer_gpus: host), copied once into shared host memory by the publisher and onto this GPU on arrival"
            }
            Self::Plain => "a plain Zenoh publisher, not one of ours",
            Self::Inline => "a small message, carried whole (the publisher's inline_threshold)",
            Self::CpuBytes => {
                "copied out by the publisher: sent while the link came up, or this subscriber is at its lease limit"
            }
        })
    }
}

/// A sample's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleInfo {
    /// The key it was published on.
    pub key: String,
    /// The publisher's instance id (0 for plain publishers).
    pub publisher: u64,
    /// The publisher's sequence number (0 for plain publishers).
    pub seq: u64,
    /// Publication time, ns since the Unix epoch (publisher clock; 0 if unknown).
    pub timestamp_ns: u64,
    /// The path that delivered it.
    pub path: Path,
    /// Typed metadata sent with it (e.g. a tensor description).
    pub meta: Option<Vec<u8>>,
}
