//! Names on an rmw_zenoh graph: topic key expressions, liveliness tokens with their
//! `%`-mangled parts and QoS component, endpoint GIDs, and the parser for tokens other
//! participants declare.

use std::fmt::Write as _;

use super::backends::{Backends, BackendsError};
pub use super::qos::{DEFAULT_DEPTH, Durability, History, Liveliness, Qos, Reliability, canonical_qos};

/// The admin space every rmw_zenoh graph token lives under.
pub const ADMIN_SPACE: &str = "@ros2_lv";

/// What Humble's rmw_zenoh (0.1.x) writes in place of the type hash, for every type, in
/// data keys and endpoint tokens.
pub const HUMBLE_TYPE_HASH: &str = "TypeHashNotSupported";

/// Why a ROS name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("{what} is empty")]
    Empty {
        /// Which name.
        what: &'static str,
    },
    /// The name breaks a rule of ROS names (see [`super::resolve`]).
    #[error("{what} {name:?} is not a valid ROS name: it {reason}")]
    Invalid {
        /// Which name.
        what: &'static str,
        /// The name.
        name: String,
        /// The rule it breaks, e.g. "has a token that starts with a digit".
        reason: &'static str,
    },
}

/// Removes one leading and one trailing `/`, as rmw_zenoh does for topic keys.
pub fn strip_slashes(name: &str) -> &str {
    let s = name.strip_prefix('/').unwrap_or(name);
    s.strip_suffix('/').unwrap_or(s)
}

/// rmw_zenoh's token mangling: every `/` becomes `%` (no other escaping).
pub fn mangle(name: &str) -> String {
    name.replace('/', "%")
}

/// The inverse of [`mangle`].
pub fn demangle(name: &str) -> String {
    name.replace('%', "/")
}

/// A topic's data key: `<domain>/<topic without outer slashes>/<dds type>/<hash text>`,
/// the hash text being the type's RIHS01 hash, or [`HUMBLE_TYPE_HASH`] on Humble's wire
/// ([`RmwWire::type_hash_text`](crate::RmwWire::type_hash_text)).
pub fn topic_key(domain: u32, topic: &str, dds_type: &str, hash: &str) -> String {
    format!("{domain}/{}/{dds_type}/{hash}", strip_slashes(topic))
}

/// The kind of a graph entity (the token's fifth part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntityKind {
    /// `NN`: a node.
    Node,
    /// `MP`: a message publisher.
    Publisher,
    /// `MS`: a message subscription.
    Subscription,
    /// `SS`: a service server.
    Service,
    /// `SC`: a service client.
    Client,
}

impl EntityKind {
    /// The token abbreviation.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "NN",
            Self::Publisher => "MP",
            Self::Subscription => "MS",
            Self::Service => "SS",
            Self::Client => "SC",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "NN" => Self::Node,
            "MP" => Self::Publisher,
            "MS" => Self::Subscription,
            "SS" => Self::Service,
            "SC" => Self::Client,
            _ => return None,
        })
    }
}

/// The node part of every token a node declares.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeName {
    /// ROS domain id.
    pub domain: u32,
    /// The Zenoh session id (lower-case hex, as `ZenohId`'s `Display`).
    pub zid: String,
    /// The node id, unique within the session.
    pub nid: u64,
    /// Security enclave (`/` by default).
    pub enclave: String,
    /// Namespace (`/` for the root).
    pub namespace: String,
    /// Node name.
    pub name: String,
}

impl NodeName {
    /// The node's token: `@ros2_lv/<domain>/<zid>/<nid>/<nid>/NN/<enclave>/<ns>/<name>`.
    pub fn node_token(&self) -> String {
        format!(
            "{ADMIN_SPACE}/{}/{}/{}/{}/NN/{}/{}/{}",
            self.domain,
            self.zid,
            self.nid,
            self.nid,
            mangle(&self.enclave),
            mangle(&self.namespace),
            mangle(&self.name)
        )
    }

    /// An endpoint's token:
    /// `@ros2_lv/<domain>/<zid>/<nid>/<eid>/<MP|MS>/<enclave>/<ns>/<node>/<topic>/<type>/<hash>/<qos>`,
    /// followed by `/backends:…` for a buffer-aware endpoint ([`Backends::to_chunk`]).
    /// `hash` is the hash text, as for [`topic_key`].
    #[allow(clippy::too_many_arguments)]
    pub fn endpoint_token(
        &self,
        eid: u64,
        kind: EntityKind,
        topic: &str,
        dds_type: &str,
        hash: &str,
        qos: &str,
        backends: Option<&Backends>,
    ) -> String {
        let mut token = format!(
            "{ADMIN_SPACE}/{}/{}/{}/{eid}/{}/{}/{}/{}/{}/{}/{}/{qos}",
            self.domain,
            self.zid,
            self.nid,
            kind.as_str(),
            mangle(&self.enclave),
            mangle(&self.namespace),
            mangle(&self.name),
            mangle(topic),
            mangle(dds_type),
            mangle(hash),
        );
        if let Some(chunk) = backends.and_then(Backends::to_chunk) {
            token.push('/');
            token.push_str(&chunk);
        }
        token
    }
}

/// XXH3-128 (seed 0) of a token's text, low 64 bits then high 64 bits, each
/// little-endian. rmw_zenoh's GID of an entity is this hash of its token *as rmw_zenoh
/// rebuilds it*: use [`gid_of`] for any token that may not be canonical.
pub fn hash_token(token: &str) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(token.as_bytes()).to_le_bytes()
}

/// An entity's GID as rmw_zenoh computes it: [`hash_token`] of [`canonical_token`], or
/// of the token itself where it does not parse (such a GID only has to be stable).
pub fn gid_of(token: &str) -> [u8; 16] {
    match canonical_token(token) {
        Some(c) => hash_token(&c),
        None => hash_token(token),
    }
}

/// A graph token's parts and kind, as far as rmw_zenoh checks every token: no empty
/// part, at least the 9 parts of a node, our admin space, a known kind.
fn split_token(token: &str) -> Option<(Vec<&str>, EntityKind)> {
    let parts: Vec<&str> = token.split('/').collect();
    if parts.len() < 9 || parts[0] != ADMIN_SPACE || parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    let kind = EntityKind::parse(parts[5])?;
    Some((parts, kind))
}

/// A token as rmw_zenoh rebuilds it from the fields it parsed: the domain as a plain
/// number, the QoS in compact form ([`canonical_qos`]), the backends re-sorted and
/// re-escaped, a 14th chunk that lists no backend dropped, further chunks dropped.
/// `None` for a token rmw_zenoh refuses, or whose backends chunk this crate refuses.
pub fn canonical_token(token: &str) -> Option<String> {
    let (parts, kind) = split_token(token)?;
    let domain: u64 = parts[1].parse().ok()?;
    let mut out = format!("{ADMIN_SPACE}/{domain}/{}", parts[2..9].join("/"));
    if kind == EntityKind::Node {
        return Some(out);
    }
    if parts.len() < 13 {
        return None;
    }
    out.push('/');
    out.push_str(&parts[9..12].join("/"));
    out.push('/');
    out.push_str(&canonical_qos(parts[12])?);
    let backends = match parts.get(13) {
        Some(chunk) => Backends::parse_chunk(chunk).ok()?,
        None => None,
    };
    if let Some(b) = backends {
        out.push('/');
        out.push_str(&b.to_chunk()?);
    }
    Some(out)
}

/// Lower-case hex of a GID (32 characters).
pub fn gid_hex(gid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32);
    for b in gid {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A graph entity parsed from another participant's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    /// What it is.
    pub kind: EntityKind,
    /// Domain id.
    pub domain: u32,
    /// Zenoh session id.
    pub zid: String,
    /// Node id.
    pub nid: u64,
    /// Entity id (`nid` for nodes).
    pub eid: u64,
    /// Namespace, demangled.
    pub namespace: String,
    /// Node name, demangled.
    pub node: String,
    /// For endpoints: the topic, its DDS type name, type hash text and QoS.
    pub topic: Option<TopicInfo>,
    /// The GID rmw_zenoh computes for it ([`gid_of`]).
    pub gid: [u8; 16],
    /// The token as received.
    pub token: String,
}

/// The topic half of an endpoint token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Topic name, demangled (`/camera/image`).
    pub name: String,
    /// DDS type name (`sensor_msgs::msg::dds_::Image_`).
    pub dds_type: String,
    /// Type hash text (`RIHS01_…`, or `TypeHashNotSupported` from Humble).
    pub hash: String,
    /// QoS (`None` if the component does not parse).
    pub qos: Option<Qos>,
    /// The data key this endpoint publishes or subscribes on.
    pub key: String,
    /// The backends a buffer-aware endpoint lists (rmw_zenoh ≥ 0.10.5 / 0.12.0); `None`
    /// for a legacy endpoint (no chunk, or a chunk refused: see `backends_error`).
    pub backends: Option<Backends>,
    /// Why the token's backends chunk was refused, if it was.
    pub backends_error: Option<BackendsError>,
}

impl Entity {
    /// Parses a token as rmw_zenoh does: no empty part, at least 9 parts for a node, 13
    /// for an endpoint, an optional 14th (backends), further parts ignored. `None` for
    /// anything else.
    pub fn parse(token: &str) -> Option<Self> {
        let (parts, kind) = split_token(token)?;
        let domain: u32 = parts[1].parse().ok()?;
        let topic = if kind == EntityKind::Node {
            None
        } else {
            if parts.len() < 13 || parts[9..13].iter().any(|p| p.is_empty()) {
                return None;
            }
            let name = demangle(parts[9]);
            let dds_type = demangle(parts[10]);
            let hash = demangle(parts[11]);
            let key = format!("{domain}/{}/{dds_type}/{hash}", strip_slashes(&name));
            let (backends, backends_error) = match parts.get(13).map(|c| Backends::parse_chunk(c)) {
                None => (None, None),
                Some(Ok(b)) => (b, None),
                Some(Err(e)) => (None, Some(e)),
            };
            Some(TopicInfo { name, dds_type, hash, qos: Qos::from_keyexpr(parts[12]), key, backends, backends_error })
        };
        Some(Self {
            kind,
            domain,
            zid: parts[2].to_owned(),
            nid: parts[3].parse().ok()?,
            eid: parts[4].parse().ok()?,
            namespace: demangle(parts[7]),
            node: demangle(parts[8]),
            topic,
            gid: gid_of(token),
            token: token.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entity_parse_refuses_short_or_empty_tokens() {
        let ok = "@ros2_lv/0/aa/1/2/MS/%/%/n/%t/p::msg::dds_::T_/RIHS01_00/::,:,:,:,,";
        let e = Entity::parse(ok).unwrap();
        assert_eq!(e.topic.as_ref().unwrap().key, "0/t/p::msg::dds_::T_/RIHS01_00");
        assert_eq!(Entity::parse(&format!("{ok}/extra/parts")).unwrap().topic, e.topic);
        for bad in [
            "@ros2_lv/0/aa/1/2/MS/%/%/n/%t/p::msg::dds_::T_/RIHS01_00",
            "@ros2_lv/0/aa/1/2/XX/%/%/n/%t/T/H/Q",
            "@ros2_lv/x/aa/1/2/NN/%/%/n",
            "@ros2_lv/0/aa/1/2/NN/%//n",
            "@other/0/aa/1/1/NN/%/%/n",
            "@ros2_lv/0/aa/1/2/MS/%/%/n//T/H/Q",
        ] {
            assert_eq!(Entity::parse(bad), None, "{bad}");
        }
    }
}
