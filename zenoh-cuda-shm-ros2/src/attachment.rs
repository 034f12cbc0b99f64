//! The attachment rmw_zenoh puts on every sample (Jazzy ≥ 0.2.4, Kilted, Rolling):
//! exactly 33 bytes, as zenoh-ext's serializer writes `(i64, i64, [u8; 16])`.
//!
//! | bytes | content |
//! |---|---|
//! | 8 | sequence number, `i64` little-endian, from 1 per publisher |
//! | 8 | source timestamp, ns since the Unix epoch, `i64` little-endian |
//! | 1 | `0x10`: the LEB128 length of the GID array |
//! | 16 | the publisher's GID |

/// Attachment length.
pub const ATTACHMENT_LEN: usize = 33;

/// A sample's rmw_zenoh attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attachment {
    /// Sequence number (from 1, per publisher).
    pub seq: i64,
    /// Source timestamp, ns since the Unix epoch.
    pub timestamp_ns: i64,
    /// The publisher's GID.
    pub gid: [u8; 16],
}

/// Why an attachment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttachmentError {
    /// The sample has no attachment (rmw_zenoh drops such samples too).
    #[error("no attachment")]
    Missing,
    /// Not 33 bytes.
    #[error("attachment is {0} bytes, expected 33")]
    Length(usize),
    /// The GID length byte is not 16.
    #[error("attachment GID length is {0}, expected 16")]
    GidLength(u8),
}

impl Attachment {
    /// The 33 bytes.
    pub fn encode(&self) -> [u8; ATTACHMENT_LEN] {
        let mut out = [0u8; ATTACHMENT_LEN];
        out[..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..16].copy_from_slice(&self.timestamp_ns.to_le_bytes());
        out[16] = 16;
        out[17..].copy_from_slice(&self.gid);
        out
    }

    /// Parses the 33 bytes.
    ///
    /// # Errors
    /// [`AttachmentError::Length`] when `bytes` is not 33 bytes long;
    /// [`AttachmentError::GidLength`] when the GID length byte is not 16.
    pub fn decode(bytes: &[u8]) -> Result<Self, AttachmentError> {
        let Ok(b) = <&[u8; ATTACHMENT_LEN]>::try_from(bytes) else {
            return Err(AttachmentError::Length(bytes.len()));
        };
        if b[16] != 16 {
            return Err(AttachmentError::GidLength(b[16]));
        }
        // Fixed ranges of a 33-byte array: 8 + 8 + 1 (the length byte) + 16.
        let (mut seq, mut ts, mut gid) = ([0u8; 8], [0u8; 8], [0u8; 16]);
        seq.copy_from_slice(&b[..8]);
        ts.copy_from_slice(&b[8..16]);
        gid.copy_from_slice(&b[17..]);
        Ok(Self { seq: i64::from_le_bytes(seq), timestamp_ns: i64::from_le_bytes(ts), gid })
    }
}

/// Nanoseconds since the Unix epoch now (0 if the clock is before 1970).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let a = Attachment { seq: 7, timestamp_ns: -3, gid: *b"0123456789abcdef" };
        let bytes = a.encode();
        assert_eq!(Attachment::decode(&bytes), Ok(a));
        assert_eq!(Attachment::decode(&bytes[..32]), Err(AttachmentError::Length(32)));
        let mut long = bytes.to_vec();
        long.push(0);
        assert_eq!(Attachment::decode(&long), Err(AttachmentError::Length(34)));
        let mut bad = bytes;
        bad[16] = 15;
        assert_eq!(Attachment::decode(&bad), Err(AttachmentError::GidLength(15)));
    }
}
