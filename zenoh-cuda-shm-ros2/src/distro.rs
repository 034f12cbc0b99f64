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

/// The rmw_zenoh wire of a node's endpoint tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RmwWire {
    /// Before buffer backends (Jazzy, Kilted, Lyrical up to 0.10.4): no token carries
    /// a `backends:` chunk.
    Classic,
    /// With buffer backends (Lyrical 0.10.5 and later, Rolling 0.12.0 and later): a
    /// volatile endpoint of a type with a top-level `uint8[]` lists the `cpu` backend.
    BufferAware,
}

/// `ROS_DISTRO` names a distribution whose rmw_zenoh this crate does not speak.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "ROS_DISTRO={0:?} is not a distribution this crate speaks rmw_zenoh with (jazzy, kilted, lyrical, rolling); \
     unset it or choose the wire with NodeOptions::rmw_wire"
)]
pub struct UnknownDistro(pub String);

impl RmwWire {
    /// The wire of the rmw_zenoh that `distro` (a `ROS_DISTRO` value, any case) ships
    /// now: `None` for a distribution this crate does not speak (Humble's rmw_zenoh
    /// keys carry no type hash, for one).
    pub fn for_distro(distro: &str) -> Option<Self> {
        match distro.trim().to_ascii_lowercase().as_str() {
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
}

#[cfg(test)]
mod tests {
    use super::RmwWire;

    #[test]
    fn each_distribution_gets_the_wire_of_its_rmw_zenoh() {
        assert_eq!(RmwWire::for_distro("jazzy"), Some(RmwWire::Classic));
        assert_eq!(RmwWire::for_distro("Kilted"), Some(RmwWire::Classic));
        assert_eq!(RmwWire::for_distro("lyrical"), Some(RmwWire::BufferAware));
        assert_eq!(RmwWire::for_distro(" rolling\n"), Some(RmwWire::BufferAware));
        assert_eq!(RmwWire::for_distro("humble"), None);
        assert_eq!(RmwWire::for_distro(""), None);
        assert!(!RmwWire::Classic.lists_backends());
        assert!(RmwWire::BufferAware.lists_backends());
    }
}
