//! Which rmw_zenoh wire a node's endpoints speak, from the ROS distribution it runs in.
//!
//! rmw_zenoh gives each endpoint the GID of its liveliness token, hashed after it
//! rebuilds the token from its parts. Releases before buffer backends (Jazzy, Kilted,
//! Lyrical up to 0.10.4) rebuild it without a 14th chunk: a token of ours that lists
//! backends then hashes there to another GID than the one our attachments carry, and
//! `message_info.publisher_gid` names a publisher that graph does not have. A node
//! therefore lists backends only where the release it runs beside does (Lyrical from
//! 0.10.5, Rolling from 0.12.0): [`RmwWire::from_env`] reads `ROS_DISTRO` as ROS
//! sets it, and [`NodeOptions::rmw_wire`](crate::NodeOptions::rmw_wire) overrides it.
//!
//! Humble's rmw_zenoh (0.1.2 and later) is the classic wire with one difference: its
//! data keys and endpoint tokens carry the fixed text [`HUMBLE_TYPE_HASH`] where the
//! others carry the type's RIHS01 hash ([`RmwWire::type_hash_text`]), so Humble nodes
//! and those of later distributions never share a data key.

use tensor_codec::type_hash::TypeHash;

use super::names::HUMBLE_TYPE_HASH;

/// The rmw_zenoh wire of a node's endpoint tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RmwWire {
    /// Before buffer backends (Jazzy, Kilted, Lyrical up to 0.10.4): no token carries
    /// a `backends:` chunk.
    Classic,
    /// With buffer backends (Lyrical 0.10.5 and later, Rolling 0.12.0 and later): a
    /// volatile endpoint of a type with a top-level `uint8[]` lists the `cpu` backend.
    BufferAware,
    /// Humble's (rmw_zenoh 0.1.2 and later): the classic wire with
    /// [`HUMBLE_TYPE_HASH`] instead of the type hash in data keys and endpoint tokens.
    /// No token carries a `backends:` chunk.
    Humble,
}

/// `ROS_DISTRO` names a distribution whose rmw_zenoh this crate does not speak.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "ROS_DISTRO={0:?} is not a distribution this crate speaks rmw_zenoh with (humble, jazzy, kilted, lyrical, rolling); \
     unset it or choose the wire with NodeOptions::rmw_wire"
)]
pub struct UnknownDistro(pub String);

impl RmwWire {
    /// The wire of the rmw_zenoh that `distro` (a `ROS_DISTRO` value, any case) ships
    /// now: `None` for a distribution this crate does not speak.
    pub fn for_distro(distro: &str) -> Option<Self> {
        match distro.trim().to_ascii_lowercase().as_str() {
            "humble" => Some(Self::Humble),
            "jazzy" | "kilted" => Some(Self::Classic),
            "lyrical" | "rolling" => Some(Self::BufferAware),
            _ => None,
        }
    }

    /// The wire of the distribution in `ROS_DISTRO`; with it unset or empty,
    /// [`RmwWire::BufferAware`], the newest.
    ///
    /// # Errors
    /// [`UnknownDistro`] when `ROS_DISTRO` names another distribution.
    pub fn from_env() -> Result<Self, UnknownDistro> {
        match std::env::var("ROS_DISTRO") {
            Ok(v) if !v.trim().is_empty() => Self::for_distro(&v).ok_or(UnknownDistro(v)),
            _ => Ok(Self::BufferAware),
        }
    }

    /// Whether endpoint tokens may carry a `backends:` chunk.
    pub fn lists_backends(self) -> bool {
        self == Self::BufferAware
    }

    /// The type hash text of data keys and endpoint tokens for a type whose RIHS01
    /// hash is `hash`: [`HUMBLE_TYPE_HASH`] on Humble's wire, `hash` itself elsewhere.
    pub fn type_hash_text(self, hash: &TypeHash) -> String {
        match self {
            Self::Humble => HUMBLE_TYPE_HASH.to_owned(),
            Self::Classic | Self::BufferAware => hash.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use tensor_codec::type_hash::TypeHash;

    use super::{HUMBLE_TYPE_HASH, RmwWire, UnknownDistro};

    #[test]
    fn each_distribution_gets_the_wire_of_its_rmw_zenoh() {
        assert_eq!(RmwWire::for_distro("jazzy"), Some(RmwWire::Classic));
        assert_eq!(RmwWire::for_distro("Kilted"), Some(RmwWire::Classic));
        assert_eq!(RmwWire::for_distro("lyrical"), Some(RmwWire::BufferAware));
        assert_eq!(RmwWire::for_distro(" rolling\n"), Some(RmwWire::BufferAware));
        assert_eq!(RmwWire::for_distro("Humble "), Some(RmwWire::Humble));
        assert_eq!(RmwWire::for_distro("iron"), None);
        assert_eq!(RmwWire::for_distro(""), None);
        assert!(!RmwWire::Classic.lists_backends());
        assert!(RmwWire::BufferAware.lists_backends());
        assert!(!RmwWire::Humble.lists_backends());
        assert!(UnknownDistro("iron".into()).to_string().contains("(humble, jazzy, kilted, lyrical, rolling)"));
    }

    /// Humble's rmw_zenoh puts the same text in place of every type's hash.
    #[test]
    fn the_hash_text_follows_the_wire() {
        let hash = TypeHash::from_bytes([0xd3; 32]);
        let rihs = format!("RIHS01_{}", "d3".repeat(32));
        assert_eq!(HUMBLE_TYPE_HASH, "TypeHashNotSupported");
        assert_eq!(RmwWire::Humble.type_hash_text(&hash), HUMBLE_TYPE_HASH);
        assert_eq!(RmwWire::Classic.type_hash_text(&hash), rihs);
        assert_eq!(RmwWire::BufferAware.type_hash_text(&hash), rihs);
    }
}
