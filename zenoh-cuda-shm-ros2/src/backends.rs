//! The `backends:` chunk of buffer-aware rmw_zenoh endpoints (rmw_zenoh 0.10.5 on
//! Lyrical and 0.12.0 on Rolling, PR #930).
//!
//! A volatile endpoint of a type with a top-level `uint8[]` field appends a 14th chunk
//! to its liveliness token: `backends:` followed by `name:metadata` entries joined by
//! `;`, sorted by name (byte order). In names and metadata `%`, `;`, `:` and `/` are
//! written `%25`, `%3B`, `%3A` and `%2F` (upper-case hex on output, either case on
//! input); nothing else is escaped.
//!
//! Reading follows rmw_zenoh: a 14th chunk that does not start with `backends:` is
//! ignored, empty entries and empty names are dropped, an entry is split at its first
//! `:`, and a chunk with no entry left means "no backends" (a legacy endpoint). Beyond
//! that this parser is stricter, because tokens come from anyone on the network: a bad
//! escape, text that is not UTF-8, a repeated name, more than [`MAX_ENTRIES`] entries or
//! a name or metadata over [`MAX_FIELD_LEN`] bytes refuses the chunk
//! ([`BackendsError`]); the graph counts such tokens and treats the endpoint as legacy.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The chunk's literal prefix.
pub const PREFIX: &str = "backends:";
/// The most entries a chunk may hold (rmw_zenoh knows two backends today).
pub const MAX_ENTRIES: usize = 64;
/// The longest name or metadata, in bytes after unescaping.
pub const MAX_FIELD_LEN: usize = 1024;
/// The name of the host-memory backend every buffer-aware endpoint lists.
pub const CPU: &str = "cpu";
/// The name of ROS 2's CUDA buffer backend (`cuda_buffer_backend`, its plugin class
/// `cuda`): its metadata is empty.
pub const CUDA: &str = "cuda";

/// Why a `backends:` chunk was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendsError {
    /// A `%` not followed by two hex digits.
    #[error("bad %-escape at byte {0} of the backends chunk")]
    BadEscape(usize),
    /// Unescaped text that is not UTF-8.
    #[error("a backend name or metadata is not UTF-8")]
    NotUtf8,
    /// More than [`MAX_ENTRIES`] entries.
    #[error("more than {MAX_ENTRIES} backends")]
    TooMany,
    /// A name or metadata longer than [`MAX_FIELD_LEN`].
    #[error("a backend name or metadata is longer than {MAX_FIELD_LEN} bytes")]
    TooLong,
    /// The same backend twice.
    #[error("backend {0:?} is listed twice")]
    Duplicate(String),
}

/// The backends an endpoint lists, by name, with their metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Backends(BTreeMap<String, String>);

impl Backends {
    /// `cpu` with empty metadata: what a CPU-only subscription and a publisher without
    /// backend plugins list, and all this crate lists.
    pub fn cpu_only() -> Self {
        Self(BTreeMap::from([(CPU.to_owned(), String::new())]))
    }

    /// Adds a backend (replacing the metadata of one of the same name).
    pub fn with(mut self, name: impl Into<String>, metadata: impl Into<String>) -> Self {
        self.0.insert(name.into(), metadata.into());
        self
    }

    /// Whether the list is exactly `{cpu}`: a publisher then serves this subscription
    /// plain CDR on `<base key>/_buf_cpu`.
    pub fn is_cpu_only(&self) -> bool {
        self.0.len() == 1 && self.0.contains_key(CPU)
    }

    /// Whether `name` is listed.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The chunk as rmw_zenoh writes it (`backends:cpu:;cuda:`), or `None` when the list
    /// is empty (an endpoint then has no 14th chunk).
    pub fn to_chunk(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let mut s = String::from(PREFIX);
        for (i, (name, meta)) in self.0.iter().enumerate() {
            if i > 0 {
                s.push(';');
            }
            escape(&mut s, name);
            s.push(':');
            escape(&mut s, meta);
        }
        Some(s)
    }

    /// Reads a token's 14th chunk: `Ok(None)` when it is not a backends chunk or lists
    /// nothing (a legacy endpoint), `Ok(Some(_))` for a list, `Err` for a chunk refused.
    ///
    /// # Errors
    /// [`BackendsError::BadEscape`] for a `%` not followed by two hex digits;
    /// [`BackendsError::NotUtf8`] for unescaped text that is not UTF-8;
    /// [`BackendsError::TooMany`] for more than [`MAX_ENTRIES`] entries;
    /// [`BackendsError::TooLong`] for a name or metadata longer than [`MAX_FIELD_LEN`];
    /// [`BackendsError::Duplicate`] for a backend listed twice.
    pub fn parse_chunk(chunk: &str) -> Result<Option<Self>, BackendsError> {
        let Some(body) = chunk.strip_prefix(PREFIX) else { return Ok(None) };
        let mut map = BTreeMap::new();
        let mut at = PREFIX.len();
        for entry in body.split(';') {
            let start = at;
            at += entry.len() + 1;
            if entry.is_empty() {
                continue;
            }
            let (raw_name, raw_meta) = entry.split_once(':').unwrap_or((entry, ""));
            let name = unescape(raw_name, start)?;
            if name.is_empty() {
                continue;
            }
            let meta = unescape(raw_meta, start + raw_name.len() + 1)?;
            if map.len() == MAX_ENTRIES {
                return Err(BackendsError::TooMany);
            }
            if map.contains_key(&name) {
                return Err(BackendsError::Duplicate(name));
            }
            map.insert(name, meta);
        }
        Ok(if map.is_empty() { None } else { Some(Self(map)) })
    }
}

fn escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '%' | ';' | ':' | '/' => {
                // Writing to a String cannot fail.
                let _ = write!(out, "%{:02X}", c as u32);
            }
            _ => out.push(c),
        }
    }
}

/// Decodes `%XX` escapes; `offset` places errors within the chunk.
fn unescape(s: &str, offset: usize) -> Result<String, BackendsError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let digit = |j: usize| b.get(j).and_then(|&c| char::from(c).to_digit(16));
            let (Some(hi), Some(lo)) = (digit(i + 1), digit(i + 2)) else {
                return Err(BackendsError::BadEscape(offset + i));
            };
            // Two hex digits are at most 0xFF.
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
        if out.len() > MAX_FIELD_LEN {
            return Err(BackendsError::TooLong);
        }
    }
    String::from_utf8(out).map_err(|_| BackendsError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_sorted_and_escaped() {
        assert_eq!(Backends::cpu_only().to_chunk().as_deref(), Some("backends:cpu:"));
        let b = Backends::default().with("cuda", "").with("cpu", "");
        assert_eq!(b.to_chunk().as_deref(), Some("backends:cpu:;cuda:"));
        let odd = Backends::default().with("a/b", "x:y;z%").with("B", "");
        assert_eq!(odd.to_chunk().as_deref(), Some("backends:B:;a%2Fb:x%3Ay%3Bz%25"));
        assert_eq!(Backends::default().to_chunk(), None);
    }

    #[test]
    fn round_trips_and_reads_either_case() {
        let odd = Backends::default().with("a/b", "x:y;z%/ü").with("cpu", "");
        let chunk = odd.to_chunk().unwrap();
        assert_eq!(Backends::parse_chunk(&chunk), Ok(Some(odd.clone())));
        assert_eq!(Backends::parse_chunk("backends:a%2fb:x%3ay%3bz%25%2F\u{fc};cpu:"), Ok(Some(odd)));
    }

    #[test]
    fn reads_as_rmw_zenoh_does() {
        // Not a backends chunk: ignored. Nothing listed: legacy.
        assert_eq!(Backends::parse_chunk("something:else"), Ok(None));
        assert_eq!(Backends::parse_chunk("backends:"), Ok(None));
        assert_eq!(Backends::parse_chunk("backends:;;:meta;"), Ok(None));
        // Order on input does not matter; an entry without ':' has empty metadata.
        let b = Backends::parse_chunk("backends:cuda:;cpu").unwrap().unwrap();
        assert_eq!(b.to_chunk().as_deref(), Some("backends:cpu:;cuda:"));
        assert!(!b.is_cpu_only() && b.contains("cuda"));
        assert!(Backends::parse_chunk("backends:cpu:").unwrap().unwrap().is_cpu_only());
        // Split at the first ':' only.
        let m = Backends::parse_chunk("backends:x:a:b").unwrap().unwrap();
        assert_eq!(m.0["x"], "a:b");
    }

    #[test]
    fn refuses_hostile_chunks() {
        for (chunk, err) in [
            ("backends:cp%u:", BackendsError::BadEscape(11)),
            ("backends:cpu:%", BackendsError::BadEscape(13)),
            ("backends:cpu:%4", BackendsError::BadEscape(13)),
            ("backends:cpu:%+1", BackendsError::BadEscape(13)),
            ("backends:%FF:", BackendsError::NotUtf8),
            ("backends:cpu:;cpu:x", BackendsError::Duplicate("cpu".into())),
            ("backends:c%70u:;cpu:", BackendsError::Duplicate("cpu".into())),
        ] {
            assert_eq!(Backends::parse_chunk(chunk), Err(err), "{chunk}");
        }
        let long = format!("backends:{}:", "n".repeat(MAX_FIELD_LEN + 1));
        assert_eq!(Backends::parse_chunk(&long), Err(BackendsError::TooLong));
        let escaped_long = format!("backends:x:{}", "%41".repeat(MAX_FIELD_LEN + 1));
        assert_eq!(Backends::parse_chunk(&escaped_long), Err(BackendsError::TooLong));
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("b{i}:")).collect();
        assert_eq!(Backends::parse_chunk(&format!("backends:{}", many.join(";"))), Err(BackendsError::TooMany));
        let enough: Vec<String> = (0..MAX_ENTRIES).map(|i| format!("b{i}:")).collect();
        assert!(Backends::parse_chunk(&format!("backends:{}", enough.join(";"))).unwrap().is_some());
    }
}
