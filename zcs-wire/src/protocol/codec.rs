//! Encoding and decoding: the version byte first, then postcard; hostile input
//! refused with a `DecodeError`.

use serde::{Deserialize, Serialize};

use super::*;

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
