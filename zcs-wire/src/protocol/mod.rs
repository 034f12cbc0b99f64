//! Wire formats: Zenoh key layout, liveliness tokens, descriptors and the control
//! protocol. Everything that crosses a process boundary is defined here, versioned,
//! and decoded as hostile input (see `docs/protocol.md`).
//!
//! Every encoded message starts with [`VERSION`]; a decoder refuses any other value
//! with [`DecodeError::Version`] before reading further. Bodies are postcard.

mod codec;
mod control;
mod provider;
mod report;
mod token;

pub use codec::*;
pub use control::*;
pub use provider::*;
pub use report::*;
pub use token::*;

/// Protocol version carried first in every descriptor, header and control frame.
pub const VERSION: u8 = 4;

/// Root of our liveliness tokens (verbatim chunk: `**` never matches it).
pub const TOKEN_ROOT: &str = "@zcs/v1";
/// Verbatim chunk under the user's key for our channels.
pub const CHANNEL_CHUNK: &str = "@zcs";

/// Key for bytes meant for GPU-aware subscribers that cannot take the zero-copy path
/// (other host, other GPU, handshake not finished): `<key>/@zcs/b`.
pub fn bytes_key(key: &str) -> String {
    format!("{key}{BYTES_SUFFIX}")
}

/// What [`bytes_key`] appends to the user's key.
const BYTES_SUFFIX: &str = "/@zcs/b";

/// The user's key of a [`bytes_key`] (`<key>/@zcs/b` → `<key>`); other keys as they are.
pub fn key_of_bytes_key(key: &str) -> &str {
    key.strip_suffix(BYTES_SUFFIX).unwrap_or(key)
}

#[cfg(test)]
mod tests;
