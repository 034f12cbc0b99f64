//! Which zenoh-cuda-shm publishers and subscribers the router sees, built from their
//! liveliness tokens (`@zcs/v1/pub/…`, `@zcs/v1/sub/…`, `docs/protocol.md`).
//!
//! A plain type with no Zenoh in it: the plugin feeds it the key expression of each token
//! that appears or vanishes, and serves [`Registry::snapshot`] in the admin space.
//! Tokens come from any participant of the network, so each is decoded as hostile input:
//! malformed ones are counted and ignored, the number listed is capped, and an instance id
//! already listed under another token is refused (first token wins).
//!
//! ```
//! use std::time::SystemTime;
//! use zenoh_plugin_cuda_shm::registry::{Outcome, Registry};
//!
//! let mut reg = Registry::new(16);
//! let token = "@zcs/v1/sub/64656d6f2f2a2a/00000000000000aa/0b3e-11/host";
//! assert_eq!(reg.token_appeared(token, SystemTime::now()), Outcome::Added);
//! assert_eq!(reg.token_appeared("@zcs/v1/sub/zz", SystemTime::now()), Outcome::Malformed);
//! let snap = reg.snapshot();
//! assert_eq!(snap.topics["demo/**"].subscribers[0].device.kind, "host");
//! assert_eq!(snap.stats.malformed, 1);
//! assert!(reg.token_vanished(token));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use zcs_wire::ipc::SocketName;
use zcs_wire::protocol::{Role, Token};
use zenoh::key_expr::keyexpr;

/// One publisher or GPU-aware subscriber, as its token describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entity {
    /// `publisher` or `subscriber`.
    pub role: &'static str,
    /// The key expression it publishes on or subscribes to.
    pub key: String,
    /// Its random instance id (one per publisher or subscriber, not per process), hex.
    pub instance: String,
    /// The kernel boot id of its host (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// The memory its blocks live in.
    pub device: Device,
    /// A publisher's control socket: `@name` (abstract) or a path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// When the router first saw the token, in milliseconds since the Unix epoch.
    pub first_seen_ms: u64,
}

/// The device chunk of a token, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Device {
    /// The chunk as the token carries it (`host` or `cuda-<32 hex>`).
    pub id: String,
    /// `cuda` (VMM blocks on that GPU), `host` (sealed memfd blocks), or `other` (a
    /// kind this plugin does not know, from a newer library).
    pub kind: &'static str,
    /// For `cuda`, the GPU's UUID as `nvidia-smi -L` prints it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
}

impl Device {
    fn from_chunk(id: &str) -> Self {
        if id == "host" {
            return Self { id: id.to_owned(), kind: "host", gpu_uuid: None };
        }
        let uuid = id.strip_prefix("cuda-").filter(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        match uuid {
            Some(h) => Self {
                id: id.to_owned(),
                kind: "cuda",
                gpu_uuid: Some(format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])),
            },
            None => Self { id: id.to_owned(), kind: "other", gpu_uuid: None },
        }
    }
}

/// What [`Registry::token_appeared`] did with a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Listed.
    Added,
    /// Already listed (a repeated announcement): nothing changed.
    Known,
    /// Not a token of ours, or one that does not decode: counted, ignored.
    Malformed,
    /// The registry holds `max_entries`: counted, not listed.
    OverCapacity,
    /// Its instance id is listed under another token: counted, not listed.
    Conflict,
}

/// Counters since the plugin started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Tokens listed.
    pub appeared: u64,
    /// Listed tokens that went away.
    pub vanished: u64,
    /// Tokens under `@zcs/v1/{pub,sub}` that do not decode.
    pub malformed: u64,
    /// Tokens not listed because the registry was full.
    pub over_capacity: u64,
    /// Tokens not listed because their instance id was taken.
    pub conflicting: u64,
}

/// The listed tokens, by topic and by instance (what the admin space shows).
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// By key expression.
    pub topics: BTreeMap<String, Topic>,
    /// By instance id (hex).
    pub instances: BTreeMap<String, Entity>,
    /// Counters.
    pub stats: Stats,
    /// Entities listed.
    pub entries: usize,
    /// The cap on `entries`.
    pub max_entries: usize,
}

/// The publishers and subscribers of one key expression. A subscriber on `demo/**` is
/// listed under `demo/**`, not under each key it matches.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Topic {
    /// The key expression.
    pub key: String,
    /// Publishers, by instance id.
    pub publishers: Vec<Entity>,
    /// GPU-aware subscribers, by instance id.
    pub subscribers: Vec<Entity>,
}

/// The registry. Not synchronised: the plugin keeps it behind a mutex.
#[derive(Debug)]
pub struct Registry {
    /// By token key expression.
    entries: BTreeMap<String, Entity>,
    /// Instance id → token key expression, so an id is listed once.
    by_instance: HashMap<u64, String>,
    max_entries: usize,
    stats: Stats,
}

impl Registry {
    /// An empty registry listing at most `max_entries` entities.
    pub fn new(max_entries: usize) -> Self {
        Self { entries: BTreeMap::new(), by_instance: HashMap::new(), max_entries, stats: Stats::default() }
    }

    /// Changes the cap. Entities already listed stay; new tokens are refused until the
    /// count is below the new cap.
    pub fn set_max_entries(&mut self, max_entries: usize) {
        self.max_entries = max_entries;
    }

    /// Entities listed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is listed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Counters since creation.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// A liveliness token (its key expression) appeared at `now`.
    pub fn token_appeared(&mut self, token_key: &str, now: SystemTime) -> Outcome {
        if self.entries.contains_key(token_key) {
            return Outcome::Known;
        }
        let Some(entity) = decode(token_key, now) else {
            self.stats.malformed += 1;
            return Outcome::Malformed;
        };
        let Some(instance) = u64::from_str_radix(&entity.instance, 16).ok() else {
            self.stats.malformed += 1;
            return Outcome::Malformed;
        };
        if self.by_instance.contains_key(&instance) {
            self.stats.conflicting += 1;
            return Outcome::Conflict;
        }
        if self.entries.len() >= self.max_entries {
            self.stats.over_capacity += 1;
            return Outcome::OverCapacity;
        }
        self.by_instance.insert(instance, token_key.to_owned());
        self.entries.insert(token_key.to_owned(), entity);
        self.stats.appeared += 1;
        Outcome::Added
    }

    /// A liveliness token went away. Returns whether it was listed.
    pub fn token_vanished(&mut self, token_key: &str) -> bool {
        let Some(entity) = self.entries.remove(token_key) else {
            return false;
        };
        if let Ok(instance) = u64::from_str_radix(&entity.instance, 16) {
            self.by_instance.remove(&instance);
        }
        self.stats.vanished += 1;
        true
    }

    /// Everything listed, by topic and by instance.
    pub fn snapshot(&self) -> Snapshot {
        let mut topics: BTreeMap<String, Topic> = BTreeMap::new();
        let mut instances = BTreeMap::new();
        for e in self.entries.values() {
            let topic = topics.entry(e.key.clone()).or_insert_with(|| Topic { key: e.key.clone(), ..Topic::default() });
            match e.role {
                ROLE_PUB => topic.publishers.push(e.clone()),
                _ => topic.subscribers.push(e.clone()),
            }
            instances.insert(e.instance.clone(), e.clone());
        }
        for t in topics.values_mut() {
            t.publishers.sort_by(|a, b| a.instance.cmp(&b.instance));
            t.subscribers.sort_by(|a, b| a.instance.cmp(&b.instance));
        }
        Snapshot { topics, instances, stats: self.stats, entries: self.entries.len(), max_entries: self.max_entries }
    }
}

const ROLE_PUB: &str = "publisher";
const ROLE_SUB: &str = "subscriber";

/// Decodes a token into an entity; `None` for anything that is not a well-formed token
/// of ours (including a key that is not a key expression and a socket that does not
/// decode).
fn decode(token_key: &str, now: SystemTime) -> Option<Entity> {
    let token = Token::parse(token_key)?;
    keyexpr::new(token.key.as_str()).ok()?;
    let socket = match (&token.role, &token.socket) {
        (Role::Pub, Some(chunk)) => Some(SocketName::from_key_chunk(chunk).ok()?.to_string()),
        (Role::Pub, None) => return None,
        (Role::Sub, _) => None,
    };
    let first_seen_ms = now.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    Some(Entity {
        role: match token.role {
            Role::Pub => ROLE_PUB,
            Role::Sub => ROLE_SUB,
        },
        instance: format!("{:016x}", token.instance),
        boot_id: token.group.boot_id.clone(),
        device: Device::from_chunk(&token.group.device),
        socket,
        key: token.key,
        first_seen_ms,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use zcs_wire::protocol::Group;

    use super::*;

    const BOOT: &str = "0b3e7a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
    const GPU: &str = "cuda-0123456789abcdef0123456789abcdef";

    fn token(role: Role, key: &str, instance: u64, device: &str) -> String {
        Token {
            role,
            key: key.to_owned(),
            instance,
            group: Group { boot_id: BOOT.to_owned(), device: device.to_owned() },
            socket: (role == Role::Pub).then(|| SocketName::Abstract(b"zcs-test".to_vec()).to_key_chunk()),
        }
        .to_key()
    }

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn tokens_are_listed_by_topic_and_instance() {
        let mut reg = Registry::new(16);
        let p = token(Role::Pub, "camera/front", 0xa1, GPU);
        let s1 = token(Role::Sub, "camera/front", 0xb2, GPU);
        let s2 = token(Role::Sub, "camera/**", 0xc3, "host");
        assert_eq!(reg.token_appeared(&p, at(1000)), Outcome::Added);
        assert_eq!(reg.token_appeared(&s1, at(2000)), Outcome::Added);
        assert_eq!(reg.token_appeared(&s2, at(3000)), Outcome::Added);
        assert_eq!(reg.token_appeared(&p, at(9000)), Outcome::Known);
        assert_eq!(reg.len(), 3);

        let snap = reg.snapshot();
        assert_eq!(snap.topics.len(), 2);
        let front = &snap.topics["camera/front"];
        assert_eq!(front.publishers.len(), 1);
        assert_eq!(front.subscribers.len(), 1);
        let pubr = &front.publishers[0];
        assert_eq!(pubr.role, "publisher");
        assert_eq!(pubr.instance, "00000000000000a1");
        assert_eq!(pubr.boot_id, BOOT);
        assert_eq!(pubr.device.kind, "cuda");
        assert_eq!(pubr.device.gpu_uuid.as_deref(), Some("GPU-01234567-89ab-cdef-0123-456789abcdef"));
        assert_eq!(pubr.socket.as_deref(), Some("@zcs-test"));
        assert_eq!(pubr.first_seen_ms, 1000, "a repeated announcement keeps the first time");
        assert_eq!(front.subscribers[0].socket, None);
        assert_eq!(snap.topics["camera/**"].subscribers[0].device.kind, "host");
        assert_eq!(snap.instances["00000000000000c3"].key, "camera/**");
        assert_eq!(snap.stats, Stats { appeared: 3, ..Stats::default() });

        assert!(reg.token_vanished(&s1));
        assert!(!reg.token_vanished(&s1), "a second removal finds nothing");
        let snap = reg.snapshot();
        assert!(snap.topics["camera/front"].subscribers.is_empty());
        assert_eq!(snap.stats.vanished, 1);
        assert!(!snap.instances.contains_key("00000000000000b2"));
    }

    #[test]
    fn snapshot_serialises_to_the_documented_json() {
        let mut reg = Registry::new(4);
        reg.token_appeared(&token(Role::Pub, "k", 1, "host"), at(5));
        let json = serde_json::to_value(reg.snapshot()).unwrap();
        assert_eq!(
            json["topics"]["k"]["publishers"][0],
            serde_json::json!({
                "role": "publisher", "key": "k", "instance": "0000000000000001", "boot_id": BOOT,
                "device": { "id": "host", "kind": "host" }, "socket": "@zcs-test", "first_seen_ms": 5,
            })
        );
        assert_eq!(json["entries"], 1);
        assert_eq!(json["max_entries"], 4);
        assert_eq!(json["stats"]["appeared"], 1);
    }

    #[test]
    fn malformed_tokens_are_counted_and_ignored() {
        let mut reg = Registry::new(16);
        let good = token(Role::Pub, "k", 7, "host");
        let mut bad = vec![
            "@zcs/v1/pub".to_owned(),
            "@zcs/v1/xyz/6b/0000000000000007/b/host".to_owned(),
            "@zcs/v2/sub/6b/0000000000000007/b/host".to_owned(),
            "@zcs/v1/sub/6/0000000000000007/b/host".to_owned(), // odd hex
            "@zcs/v1/sub/6b/notahexnumber/b/host".to_owned(),
            "@zcs/v1/sub/6b/0000000000000007/b/host/extra".to_owned(),
            // a key that is not a key expression: "a//b"
            format!("@zcs/v1/sub/{}/0000000000000007/b/host", zcs_wire::protocol::hex_key("a//b")),
            // a publisher whose socket chunk does not decode
            good.rsplit_once('/').map(|(head, _)| format!("{head}/zzz")).unwrap(),
        ];
        bad.push(good.rsplit_once('/').map(|(head, _)| head.to_owned()).unwrap()); // no socket
        for b in &bad {
            assert_eq!(reg.token_appeared(b, at(1)), Outcome::Malformed, "{b}");
            assert!(!reg.token_vanished(b));
        }
        assert_eq!(reg.stats().malformed, bad.len() as u64);
        assert!(reg.is_empty());
        assert_eq!(reg.token_appeared(&good, at(1)), Outcome::Added);
    }

    #[test]
    fn capacity_and_instance_conflicts_are_enforced() {
        let mut reg = Registry::new(2);
        assert_eq!(reg.token_appeared(&token(Role::Sub, "a", 1, "host"), at(1)), Outcome::Added);
        // Same instance id under another token: refused, first wins.
        assert_eq!(reg.token_appeared(&token(Role::Pub, "b", 1, "host"), at(1)), Outcome::Conflict);
        assert_eq!(reg.token_appeared(&token(Role::Sub, "b", 2, "host"), at(1)), Outcome::Added);
        let third = token(Role::Sub, "c", 3, "host");
        assert_eq!(reg.token_appeared(&third, at(1)), Outcome::OverCapacity);
        assert!(!reg.token_vanished(&third), "never listed");
        assert!(reg.token_vanished(&token(Role::Sub, "a", 1, "host")));
        assert_eq!(reg.token_appeared(&token(Role::Pub, "b", 1, "host"), at(1)), Outcome::Added, "id free again");
        reg.set_max_entries(1);
        assert_eq!(reg.len(), 2, "lowering the cap evicts nothing");
        assert_eq!(reg.token_appeared(&third, at(1)), Outcome::OverCapacity);
        assert_eq!(reg.stats(), Stats { appeared: 3, vanished: 1, malformed: 0, over_capacity: 2, conflicting: 1 });
    }

    #[test]
    fn device_chunks_decode() {
        assert_eq!(Device::from_chunk("host").kind, "host");
        assert_eq!(Device::from_chunk(GPU).kind, "cuda");
        let other = Device::from_chunk("rocm-1");
        assert_eq!((other.kind, other.gpu_uuid), ("other", None));
        assert_eq!(Device::from_chunk("cuda-0123").kind, "other", "short uuid");
    }
}
