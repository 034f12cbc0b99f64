//! Names on an rmw_zenoh graph: topic key expressions, liveliness tokens with their
//! `%`-mangled parts and QoS component, endpoint GIDs, and the parser for tokens other
//! participants declare.

use std::fmt::Write as _;
use std::time::Duration;

use tensor_codec::type_hash::TypeHash;

use super::backends::{Backends, BackendsError};

/// The admin space every rmw_zenoh graph token lives under.
pub const ADMIN_SPACE: &str = "@ros2_lv";

/// rmw_zenoh's default history depth (an empty depth in a QoS component means this).
pub const DEFAULT_DEPTH: u32 = 42;

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

/// A topic's data key: `<domain>/<topic without outer slashes>/<dds type>/<RIHS01 hash>`.
pub fn topic_key(domain: u32, topic: &str, dds_type: &str, hash: &TypeHash) -> String {
    format!("{domain}/{}/{dds_type}/{hash}", strip_slashes(topic))
}

/// QoS reliability (values of `rmw/types.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reliability {
    /// `1`: every sample is delivered (Zenoh reliable channel).
    Reliable = 1,
    /// `2`: samples may be dropped.
    BestEffort = 2,
}

/// QoS durability (values of `rmw/types.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    /// `1`: late joiners receive up to `depth` past samples (zenoh-ext Advanced pub/sub).
    TransientLocal = 1,
    /// `2`: only samples published after the subscriber joined.
    Volatile = 2,
}

/// QoS history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum History {
    /// `1`: keep the last `depth` samples.
    KeepLast(u32),
    /// `2`: keep everything (reliable publishers then block instead of dropping).
    KeepAll,
}

/// QoS liveliness kind (values of `rmw/types.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Liveliness {
    /// `1`.
    Automatic = 1,
    /// `3`.
    ManualByTopic = 3,
}

/// An endpoint's QoS, as carried in its liveliness token. `Default` is rmw_zenoh's
/// default profile (reliable, volatile, keep last 42, everything infinite, automatic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Qos {
    /// Reliability.
    pub reliability: Reliability,
    /// Durability.
    pub durability: Durability,
    /// History kind and depth.
    pub history: History,
    /// Deadline (`None`: infinite).
    pub deadline: Option<Duration>,
    /// Lifespan (`None`: infinite).
    pub lifespan: Option<Duration>,
    /// Liveliness kind.
    pub liveliness: Liveliness,
    /// Liveliness lease duration (`None`: infinite).
    pub lease: Option<Duration>,
}

impl Default for Qos {
    fn default() -> Self {
        Self {
            reliability: Reliability::Reliable,
            durability: Durability::Volatile,
            history: History::KeepLast(DEFAULT_DEPTH),
            deadline: None,
            lifespan: None,
            liveliness: Liveliness::Automatic,
            lease: None,
        }
    }
}

impl Qos {
    /// Reliable, volatile, keep last `depth` (rclcpp's `QoS(depth)`).
    pub fn reliable(depth: u32) -> Self {
        Self { history: History::KeepLast(depth), ..Self::default() }
    }

    /// ROS's `SensorDataQoS`: best effort, volatile, keep last 5.
    pub fn sensor_data() -> Self {
        Self { reliability: Reliability::BestEffort, history: History::KeepLast(5), ..Self::default() }
    }

    /// Reliable, transient local, keep last `depth` (latched topics).
    pub fn transient_local(depth: u32) -> Self {
        Self { durability: Durability::TransientLocal, history: History::KeepLast(depth), ..Self::default() }
    }

    /// Keep all samples.
    pub fn keep_all(mut self) -> Self {
        self.history = History::KeepAll;
        self
    }

    /// The depth (`KEEP_ALL` reports rmw_zenoh's default depth, as rmw does).
    pub fn depth(&self) -> u32 {
        match self.history {
            History::KeepLast(d) => d,
            History::KeepAll => DEFAULT_DEPTH,
        }
    }

    /// The QoS component as this crate declares it: reliability, durability, history
    /// kind and depth, and liveliness kind always written out; deadline, lifespan and
    /// lease empty when infinite. Explicit values cannot be misread by rmw_zenoh
    /// releases whose defaults differ (Jazzy ≤ 0.2.2 read an empty durability as
    /// transient local), e.g. `1:2:1,10:,:,:1,,`.
    pub fn to_keyexpr(&self) -> String {
        self.encode(false)
    }

    /// The QoS component exactly as rmw_zenoh writes it: every field equal to its
    /// default profile left empty, e.g. `::,10:,:,:,,` for reliable, volatile, keep last 10.
    pub fn to_keyexpr_compact(&self) -> String {
        self.encode(true)
    }

    fn encode(&self, compact: bool) -> String {
        let d = Self::default();
        let mut s = String::with_capacity(24);
        let num = |s: &mut String, v: u64, default: bool| {
            if !(compact && default) {
                let _ = write!(s, "{v}");
            }
        };
        num(&mut s, self.reliability as u64, self.reliability == d.reliability);
        s.push(':');
        num(&mut s, self.durability as u64, self.durability == d.durability);
        s.push(':');
        let (kind, depth) = match self.history {
            History::KeepLast(n) => (1, n),
            History::KeepAll => (2, DEFAULT_DEPTH),
        };
        num(&mut s, kind, kind == 1);
        s.push(',');
        num(&mut s, u64::from(depth), depth == DEFAULT_DEPTH);
        for dur in [self.deadline, self.lifespan] {
            s.push(':');
            duration(&mut s, dur);
        }
        s.push(':');
        num(&mut s, self.liveliness as u64, self.liveliness == d.liveliness);
        s.push(',');
        duration(&mut s, self.lease);
        s
    }

    /// Parses a QoS component (empty fields take rmw_zenoh's defaults).
    pub fn from_keyexpr(s: &str) -> Option<Self> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() < 6 {
            return None;
        }
        let field =
            |v: &str| -> Option<Option<u64>> { if v.is_empty() { Some(None) } else { v.parse().ok().map(Some) } };
        let pair = |v: &str, n: usize| -> Option<Vec<Option<u64>>> {
            let f: Vec<&str> = v.split(',').collect();
            if f.len() < n {
                return None;
            }
            f.into_iter().take(n).map(field).collect()
        };
        let reliability = match field(parts[0])? {
            None | Some(1) => Reliability::Reliable,
            Some(2) => Reliability::BestEffort,
            _ => return None,
        };
        let durability = match field(parts[1])? {
            None | Some(2) => Durability::Volatile,
            Some(1) => Durability::TransientLocal,
            _ => return None,
        };
        let h = pair(parts[2], 2)?;
        let depth = u32::try_from(h[1].unwrap_or(u64::from(DEFAULT_DEPTH))).ok()?;
        let history = match h[0] {
            None | Some(0) | Some(1) => History::KeepLast(depth),
            Some(2) => History::KeepAll,
            _ => return None,
        };
        let dur = |v: &str| -> Option<Option<Duration>> {
            let p = pair(v, 2)?;
            Some(match (p[0], p[1]) {
                (None, None) => None,
                (s, n) => Some(Duration::new(s.unwrap_or(0), u32::try_from(n.unwrap_or(0)).ok()?)),
            })
        };
        let deadline = dur(parts[3])?;
        let lifespan = dur(parts[4])?;
        let l = pair(parts[5], 3)?;
        let liveliness = match l[0] {
            None | Some(1) => Liveliness::Automatic,
            Some(3) => Liveliness::ManualByTopic,
            _ => return None,
        };
        let lease = match (l[1], l[2]) {
            (None, None) => None,
            (s, n) => Some(Duration::new(s.unwrap_or(0), u32::try_from(n.unwrap_or(0)).ok()?)),
        };
        Some(Self { reliability, durability, history, deadline, lifespan, liveliness, lease })
    }
}

fn duration(s: &mut String, d: Option<Duration>) {
    if let Some(d) = d {
        let _ = write!(s, "{},{}", d.as_secs(), d.subsec_nanos());
    } else {
        s.push(',');
    }
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
    #[allow(clippy::too_many_arguments)]
    pub fn endpoint_token(
        &self,
        eid: u64,
        kind: EntityKind,
        topic: &str,
        dds_type: &str,
        hash: &TypeHash,
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
            mangle(&hash.to_string()),
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

/// rmw_zenoh's defaults, field by field in token order: reliability, durability,
/// history, depth, deadline s/ns, lifespan s/ns, liveliness, lease s/ns. Durations
/// default to `RMW_DURATION_INFINITE` (9223372036 s 854775807 ns).
const QOS_DEFAULTS: [u64; 11] =
    [1, 2, 1, 42, 9_223_372_036, 854_775_807, 9_223_372_036, 854_775_807, 1, 9_223_372_036, 854_775_807];
/// The values rmw_zenoh's parser accepts for reliability, durability, history and
/// liveliness (`rmw/types.h`: 0 is "system default"; liveliness also takes 4, "unknown",
/// and 5, "best available"), by field.
const QOS_ENUMS: [(usize, &[u64]); 4] =
    [(0, &[0, 1, 2, 3]), (1, &[0, 1, 2, 3]), (2, &[0, 1, 2, 3]), (8, &[0, 1, 3, 4, 5])];

/// A QoS component as rmw_zenoh rebuilds it after parsing: every field equal to its
/// default written empty, every other one as a plain decimal number. `None` where
/// rmw_zenoh's parser refuses the component.
pub fn canonical_qos(qos: &str) -> Option<String> {
    let parts: Vec<&str> = qos.split(':').collect();
    if parts.len() < 6 {
        return None;
    }
    let mut fields = vec![parts[0], parts[1]];
    for (i, n) in [(2, 2), (3, 2), (4, 2), (5, 3)] {
        let sub: Vec<&str> = parts[i].split(',').collect();
        fields.extend(sub.get(..n)?);
    }
    let mut values = [0u64; 11];
    for (i, f) in fields.iter().enumerate() {
        values[i] = match f {
            &"" => QOS_DEFAULTS[i],
            f if f.bytes().all(|b| b.is_ascii_digit()) => f.parse().ok()?,
            _ => return None,
        };
    }
    for (i, allowed) in QOS_ENUMS {
        // rmw_zenoh looks an enumeration up by its exact text, so "01" is refused.
        if !fields[i].is_empty() && (!allowed.contains(&values[i]) || fields[i] != values[i].to_string()) {
            return None;
        }
    }
    let f: Vec<String> =
        (0..11).map(|i| if values[i] == QOS_DEFAULTS[i] { String::new() } else { values[i].to_string() }).collect();
    Some(format!("{}:{}:{},{}:{},{}:{},{}:{},{},{}", f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10]))
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
    fn qos_compact_matches_rmw_zenoh_examples() {
        assert_eq!(Qos::reliable(7).to_keyexpr_compact(), "::,7:,:,:,,");
        assert_eq!(Qos::reliable(10).to_keyexpr_compact(), "::,10:,:,:,,");
        assert_eq!(Qos::sensor_data().to_keyexpr_compact(), "2::,5:,:,:,,");
        assert_eq!(Qos::default().to_keyexpr_compact(), "::,:,:,:,,");
    }

    #[test]
    fn qos_explicit_and_round_trip() {
        assert_eq!(Qos::reliable(10).to_keyexpr(), "1:2:1,10:,:,:1,,");
        assert_eq!(Qos::transient_local(1).to_keyexpr(), "1:1:1,1:,:,:1,,");
        let odd = Qos {
            reliability: Reliability::BestEffort,
            durability: Durability::TransientLocal,
            history: History::KeepAll,
            deadline: Some(Duration::new(5, 0)),
            lifespan: Some(Duration::new(60, 3000)),
            liveliness: Liveliness::ManualByTopic,
            lease: Some(Duration::new(1, 2)),
        };
        assert_eq!(odd.to_keyexpr(), "2:1:2,42:5,0:60,3000:3,1,2");
        for q in [Qos::default(), Qos::reliable(3), Qos::sensor_data(), Qos::transient_local(9), odd] {
            assert_eq!(Qos::from_keyexpr(&q.to_keyexpr()), Some(q), "{}", q.to_keyexpr());
            assert_eq!(Qos::from_keyexpr(&q.to_keyexpr_compact()), Some(q), "{}", q.to_keyexpr_compact());
        }
        for bad in ["", "1:2", "x:2:1,10:,:,:,,", "1:7:1,10:,:,:,,", "1:2:1:,:,:,,", "1:2:1,10:,:,:9,,"] {
            assert_eq!(Qos::from_keyexpr(bad), None, "{bad}");
        }
    }

    #[test]
    fn canonical_qos_is_rmw_zenohs_rebuild() {
        for (given, want) in [
            ("1:2:1,10:,:,:1,,", Some("::,10:,:,:,,")),
            ("::,10:,:,:,,", Some("::,10:,:,:,,")),
            ("2:2:1,5:,:,:1,,", Some("2::,5:,:,:,,")),
            ("1:2:2,10:,:,:1,,", Some("::2,10:,:,:,,")),
            ("1:1:1,042:,:,:1,,", Some(":1:,:,:,:,,")),
            ("0:0:0,0:5,0:9223372036,854775807:3,1,2", Some("0:0:0,0:5,0:,:3,1,2")),
            ("::,:,:,:,,:extra", Some("::,:,:,:,,")),
            ("01:2:1,10:,:,:,,", None),
            ("4:2:1,10:,:,:,,", None),
            ("1:2:1,10:,:,:2,,", None),
            ("1:2:1,x:,:,:,,", None),
            ("1:2:1,-1:,:,:,,", None),
            ("1:2:1,10:,:,:1,", None),
            ("1:2:1:,:,:,,", None),
            ("", None),
        ] {
            assert_eq!(canonical_qos(given).as_deref(), want, "{given}");
        }
    }

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
