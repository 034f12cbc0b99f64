//! Identities: block keys (id and generation), capabilities (the keyed MAC that
//! authorises an FD handout), and holders (who holds leases).

use std::fmt;

/// Identifies a block generation: which block, which allocation behind its id, and
/// which use of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BlockKey {
    /// Block id (a slot index; reused after a block is trimmed).
    pub id: u32,
    /// Serial number of the allocation behind the id, unique in this pool: an importer
    /// caches mappings by `(id, alloc)`, so a reused id is never mistaken for the old
    /// block.
    pub alloc: u64,
    /// Generation: taken from one pool-wide counter at every loan, so it only grows,
    /// also across blocks that reuse an id (ready signals rely on this).
    pub generation: u64,
}

/// The keyed PRF behind capabilities. Its key is given to subscribers over the
/// authenticated control socket, so they can check a descriptor's capability without
/// a round trip; without the key a capability cannot be forged.
#[derive(Clone)]
pub struct CapabilityKey([u8; 16]);

impl fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CapabilityKey(..)")
    }
}

impl CapabilityKey {
    /// A fresh random key.
    pub fn random() -> Self {
        Self(rand::random())
    }
    /// The raw key, to hand to a subscriber.
    pub fn to_bytes(&self) -> [u8; 16] {
        self.0
    }
    /// A key received from a publisher.
    pub fn from_bytes(b: [u8; 16]) -> Self {
        Self(b)
    }
    /// A tag authenticating a bytes message `(publisher, seq, len)`, checked by the
    /// subscribers that hold this key (those handshaken with the publisher).
    pub fn bytes_tag(&self, publisher: u64, seq: u64, len: u64) -> u64 {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher24::new_with_key(&self.0);
        h.write_u8(0xb7); // domain separation from capabilities
        h.write_u64(publisher);
        h.write_u64(seq);
        h.write_u64(len);
        h.finish()
    }

    /// A tag authenticating a publisher's end notice: its last sequence number `seq`
    /// (told to subscribers off the zero-copy path when it is dropped). Distinct from
    /// every [`CapabilityKey::bytes_tag`], so a message's header cannot pass for one.
    pub fn end_tag(&self, publisher: u64, seq: u64) -> u64 {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher24::new_with_key(&self.0);
        h.write_u8(0xe4); // domain separation from bytes tags and capabilities
        h.write_u64(publisher);
        h.write_u64(seq);
        h.finish()
    }

    /// The capability of a block generation.
    pub fn capability(&self, key: BlockKey) -> u64 {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher24::new_with_key(&self.0);
        h.write_u32(key.id);
        h.write_u64(key.alloc);
        h.write_u64(key.generation);
        h.finish()
    }
}

/// Who holds a block: [`HolderId::LOCAL`] for the pool owner's own handles, another
/// value per peer connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(pub(super) u64);

impl HolderId {
    /// The pool owner's own handles ([`Published`](super::Published)).
    pub const LOCAL: Self = Self(0);

    /// A holder id for a peer. `0` is reserved for [`HolderId::LOCAL`].
    pub fn new(id: u64) -> Self {
        assert!(id != 0, "holder id 0 is reserved for LOCAL");
        Self(id)
    }

    /// The raw value.
    pub fn get(self) -> u64 {
        self.0
    }
}
