//! Wire formats: Zenoh key layout, liveliness tokens, descriptors and the control
//! protocol. Everything that crosses a process boundary is defined here, versioned,
//! and decoded as hostile input (see `docs/protocol.md`).
//!
//! Every encoded message starts with [`VERSION`]; a decoder refuses any other value
//! with [`DecodeError::Version`] before reading further. Bodies are postcard.

use serde::{Deserialize, Serialize};

use crate::pool::BlockKey;

/// Protocol version carried first in every descriptor, header and control frame.
pub const VERSION: u8 = 3;

/// Root of our liveliness tokens (verbatim chunk: `**` never matches it).
pub const TOKEN_ROOT: &str = "@zcs/v1";
/// Verbatim chunk under the user's key for our channels.
pub const CHANNEL_CHUNK: &str = "@zcs";

/// Key for bytes meant for GPU-aware subscribers that cannot take the zero-copy path
/// (other host, other GPU, handshake not finished): `<key>/@zcs/b`.
pub fn bytes_key(key: &str) -> String {
    format!("{key}/{CHANNEL_CHUNK}/b")
}

/// A locality group: processes that can map each other's blocks (same kernel, same
/// device). Only a subscriber of the publisher's group attempts the handshake.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Group {
    /// `/proc/sys/kernel/random/boot_id`, lower-case.
    pub boot_id: String,
    /// `cuda-<32 hex of the GPU UUID>` or `host` (memfd blocks).
    pub device: String,
}

impl Group {
    /// The group key chunk for a GPU UUID.
    pub fn cuda_device(uuid: &crate::cuda::GpuUuid) -> String {
        let mut s = String::from("cuda-");
        for b in uuid.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

fn valid_chunk(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Hex of a key expression, so any key fits in one token chunk.
pub fn hex_key(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex_key(s: &str) -> Option<String> {
    if s.is_empty() || !s.len().is_multiple_of(2) || s.len() > 2048 {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// Who a token describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A publisher (its token names its control socket).
    Pub,
    /// A GPU-aware subscriber.
    Sub,
}

/// A parsed liveliness token:
/// `@zcs/v1/<pub|sub>/<key-hex>/<instance-hex>/<boot_id>/<device>[/<socket-chunk>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Publisher or subscriber.
    pub role: Role,
    /// The user's key expression (a subscriber's may contain wildcards).
    pub key: String,
    /// The entity's random instance id.
    pub instance: u64,
    /// Its locality group.
    pub group: Group,
    /// A publisher's control socket, as [`crate::ipc::SocketName::to_key_chunk`].
    pub socket: Option<String>,
}

impl Token {
    /// Encodes the token's key expression.
    pub fn to_key(&self) -> String {
        let role = match self.role {
            Role::Pub => "pub",
            Role::Sub => "sub",
        };
        let mut k = format!(
            "{TOKEN_ROOT}/{role}/{}/{:016x}/{}/{}",
            hex_key(&self.key),
            self.instance,
            self.group.boot_id,
            self.group.device
        );
        if let Some(s) = &self.socket {
            k.push('/');
            k.push_str(s);
        }
        k
    }

    /// Parses a token key expression; `None` for anything malformed.
    pub fn parse(ke: &str) -> Option<Self> {
        let rest = ke.strip_prefix(TOKEN_ROOT)?.strip_prefix('/')?;
        let parts: Vec<&str> = rest.split('/').collect();
        let (role, n) = match *parts.first()? {
            "pub" => (Role::Pub, 6),
            "sub" => (Role::Sub, 5),
            _ => return None,
        };
        if parts.len() != n || !parts[1..].iter().all(|p| valid_chunk(p)) {
            return None;
        }
        let instance = u64::from_str_radix(parts[2], 16).ok()?;
        Some(Self {
            role,
            key: unhex_key(parts[1])?,
            instance,
            group: Group { boot_id: parts[3].to_owned(), device: parts[4].to_owned() },
            socket: (role == Role::Pub).then(|| parts[5].to_owned()),
        })
    }
}

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

/// Names a host provider: its random id and its socket (as
/// [`crate::ipc::SocketName::to_key_chunk`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProviderRef {
    /// The provider's random instance id.
    pub id: u64,
    /// Its socket.
    pub socket: String,
}

/// A provider's liveliness token: `@zcs/v1/provider/<boot_id>/<id-hex>/<socket-chunk>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderToken {
    /// The kernel it serves (`boot_id`).
    pub boot_id: String,
    /// Id and socket.
    pub provider: ProviderRef,
}

impl ProviderToken {
    /// Encodes the token's key expression.
    pub fn to_key(&self) -> String {
        format!("{TOKEN_ROOT}/provider/{}/{:016x}/{}", self.boot_id, self.provider.id, self.provider.socket)
    }

    /// Key expression matching every provider token of one kernel.
    pub fn selector(boot_id: &str) -> String {
        format!("{TOKEN_ROOT}/provider/{boot_id}/*/*")
    }

    /// Parses a provider token; `None` for anything malformed.
    pub fn parse(ke: &str) -> Option<Self> {
        let rest = ke.strip_prefix(TOKEN_ROOT)?.strip_prefix("/provider/")?;
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != 3 || !parts.iter().all(|p| valid_chunk(p)) || parts[1].len() > 16 {
            return None;
        }
        let id = u64::from_str_radix(parts[1], 16).ok()?;
        Some(Self { boot_id: parts[0].to_owned(), provider: ProviderRef { id, socket: parts[2].to_owned() } })
    }
}

/// Requests to the host provider (client → provider). `Borrow` and `Open` are answered
/// with the request's `tag`; `Return`, `Close` and `Report` are not answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderRequest {
    /// First message on a connection.
    Hello {
        /// The client's random id (its session).
        client: u64,
        /// The program name, for the registry.
        program: String,
    },
    /// Lend me a block of `size` bytes on `device` (a [`Group`] device chunk).
    Borrow {
        /// Echoed in the answer.
        tag: u64,
        /// `cuda-<uuid>` or `host`.
        device: String,
        /// Bytes; rounded up to the provider's size class.
        size: u64,
    },
    /// I no longer use this loan (the borrower only).
    Return {
        /// The loan id.
        loan: u64,
    },
    /// The FD of a lent block, named by its loan id in a descriptor.
    Open {
        /// Echoed in the answer.
        tag: u64,
        /// The loan id.
        loan: u64,
    },
    /// I no longer map these loans' blocks.
    Close {
        /// Loan ids.
        loans: Vec<u64>,
    },
    /// What my publishers and subscribers are doing (sent about once a second; the
    /// provider keeps the latest, for the registry).
    Report(ProcessReport),
}

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
    /// Samples delivered zero-copy.
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
    /// `zero-copy` or `bytes`.
    pub path: String,
    /// Why not zero-copy (another host, another device, a failed handshake), if known.
    pub reason: Option<String>,
}

/// Answers of the host provider (provider → client).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderReply {
    /// Answer to `Hello`.
    Welcome {
        /// The provider's id.
        provider: u64,
        /// The devices it lends blocks of.
        devices: Vec<String>,
    },
    /// Answer to `Borrow`: the block's FD follows.
    Lent {
        /// The request's tag.
        tag: u64,
        /// The loan id: names the block in descriptors; unguessable.
        loan: u64,
        /// The block's size.
        size: u64,
    },
    /// Answer to `Open`: the block's FD follows.
    Opened {
        /// The request's tag.
        tag: u64,
        /// The block's size.
        size: u64,
    },
    /// A `Borrow` or `Open` was refused.
    Refused {
        /// The request's tag.
        tag: u64,
        /// Why.
        reason: String,
        /// True when retrying cannot help (unknown device, unknown loan).
        permanent: bool,
    },
}

/// A message could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Empty input.
    #[error("empty message")]
    Empty,
    /// Another protocol version.
    #[error("protocol version {found} (this build speaks {VERSION})")]
    Version {
        /// The version byte found.
        found: u8,
    },
    /// The body is malformed or truncated.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// The decoder's message.
        detail: String,
    },
}

/// Encodes a value behind the version byte.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![VERSION];
    // Serialising plain structs of integers, strings and vectors into a Vec cannot fail.
    postcard::to_io(v, &mut out).expect("postcard encoding into a Vec");
    out
}

/// Decodes a value behind the version byte; trailing bytes are refused.
pub fn decode<'a, T: Deserialize<'a>>(what: &'static str, bytes: &'a [u8]) -> Result<T, DecodeError> {
    let (&v, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    if v != VERSION {
        return Err(DecodeError::Version { found: v });
    }
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| DecodeError::Malformed { what, detail: e.to_string() })?;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed { what, detail: format!("{} trailing bytes", rest.len()) });
    }
    Ok(value)
}

/// Encodes our attachment: magic + versioned header.
pub fn encode_attachment(h: &BytesHeader) -> Vec<u8> {
    let mut out = ATTACHMENT_MAGIC.to_vec();
    out.extend(encode(h));
    out
}

/// Decodes our attachment; `Ok(None)` if it is not ours (no magic).
pub fn decode_attachment(bytes: &[u8]) -> Result<Option<BytesHeader>, DecodeError> {
    match bytes.strip_prefix(ATTACHMENT_MAGIC.as_slice()) {
        Some(rest) => decode("attachment", rest).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> Group {
        Group {
            boot_id: "0b5c7e1e-3d7c-4a0e-9a43-1f1d2c3b4a59".into(),
            device: "cuda-00112233445566778899aabbccddeeff".into(),
        }
    }

    #[test]
    fn tokens_round_trip() {
        for t in [
            Token {
                role: Role::Pub,
                key: "camera/front".into(),
                instance: 42,
                group: group(),
                socket: Some("a7a63".into()),
            },
            Token { role: Role::Sub, key: "camera/**".into(), instance: u64::MAX, group: group(), socket: None },
        ] {
            let k = t.to_key();
            assert!(!k.contains("**") || k.starts_with(TOKEN_ROOT));
            assert_eq!(Token::parse(&k), Some(t));
        }
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for bad in [
            "",
            "@zcs/v1",
            "@zcs/v2/pub/61/1/b/d/s",
            "@zcs/v1/pub/61/1/b/d",
            "@zcs/v1/sub/61/1/b/d/extra",
            "@zcs/v1/pub/6/1/b/d/s",
            "@zcs/v1/pub/zz/1/b/d/s",
            "@zcs/v1/pub/61/xyz/b/d/s",
            "@zcs/v1/pub/61/1/b/d/s*",
            "@zcs/v1/pub/ff/1/b/d/s",
        ] {
            assert_eq!(Token::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn descriptors_round_trip_and_reject_bad_input() {
        let d = Descriptor {
            publisher: 1,
            seq: 2,
            block: BlockKey { id: 3, alloc: 8, generation: 4 },
            capability: 5,
            block_size: 6,
            offset: 0,
            len: 6,
            timestamp_ns: 7,
            meta: Some(vec![1, 2, 3]),
            lent: Some(9),
        };
        let bytes = encode(&d);
        assert_eq!(decode::<Descriptor>("descriptor", &bytes), Ok(d.clone()));
        for r in [
            Reply::Block(d),
            Reply::Inline { seq: 9, timestamp_ns: 1, meta: None, data: vec![7; 300] },
            Reply::ViaBytes { seq: 10 },
            Reply::Ready { first_seq: 11 },
            Reply::Left,
        ] {
            assert_eq!(decode::<Reply>("reply", &encode(&r)), Ok(r));
        }
        let mut future = bytes.clone();
        future[0] = VERSION + 1;
        assert_eq!(decode::<Descriptor>("descriptor", &future), Err(DecodeError::Version { found: VERSION + 1 }));
        assert_eq!(decode::<Descriptor>("descriptor", &[]), Err(DecodeError::Empty));
        for cut in 1..bytes.len() {
            assert!(decode::<Descriptor>("descriptor", &bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(decode::<Descriptor>("descriptor", &long), Err(DecodeError::Malformed { .. })));
    }

    #[test]
    fn provider_tokens_and_messages_round_trip() {
        let t = ProviderToken {
            boot_id: "0123abcd-ef".into(),
            provider: ProviderRef { id: 0xfeed, socket: "aabcdef".into() },
        };
        assert_eq!(t.to_key(), "@zcs/v1/provider/0123abcd-ef/000000000000feed/aabcdef");
        assert_eq!(ProviderToken::parse(&t.to_key()), Some(t));
        for bad in [
            "@zcs/v1/provider/b/00ff",
            "@zcs/v1/provider/b/00ff/s/x",
            "@zcs/v1/provider/b/zz/s",
            "@zcs/v1/provider/b/00000000000000001/s",
            "@zcs/v1/provider/b//s",
            "@zcs/v1/pub/b/00ff/s",
        ] {
            assert_eq!(ProviderToken::parse(bad), None, "{bad}");
        }
        let r = ProviderRequest::Borrow { tag: 1, device: "host".into(), size: 2 << 20 };
        assert_eq!(decode::<ProviderRequest>("provider request", &encode(&r)), Ok(r));
        let a = ProviderReply::Refused { tag: 1, reason: "no".into(), permanent: true };
        let mut bytes = encode(&a);
        assert_eq!(decode::<ProviderReply>("provider reply", &bytes), Ok(a));
        bytes.push(0);
        assert!(decode::<ProviderReply>("provider reply", &bytes).is_err());
    }

    #[test]
    fn attachments_are_recognised_only_with_magic() {
        let h = BytesHeader { publisher: 9, seq: 1, timestamp_ns: 0, from_block: true, tag: 3, meta: None };
        assert_eq!(decode_attachment(&encode_attachment(&h)), Ok(Some(h)));
        assert_eq!(decode_attachment(b"\x01\x02rmw"), Ok(None));
        assert!(decode_attachment(b"ZCS\x01\x09").is_err());
    }

    #[test]
    fn keys() {
        assert_eq!(bytes_key("a/b"), "a/b/@zcs/b");
        assert_eq!(Group::cuda_device(&crate::cuda::GpuUuid([0xab; 16])), format!("cuda-{}", "ab".repeat(16)));
    }
}
