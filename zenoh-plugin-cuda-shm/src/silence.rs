//! Silent ROS 2 publishers, as the `ros2` module's subscriptions report them: while a
//! publisher of its topic sends a subscription nothing, the subscription holds the
//! liveliness token `@zcs/ros2/v1/<domain>/silent/<subscription GID>/<publisher GID>/<reason codes>`
//! (`docs/ros2.md`, "Silent publishers"). The plugin lists the tokens that stand in its
//! admin space (`ros2/silent/<subscription GID>/<publisher GID>`) and counts them.
//!
//! Like the registry, a plain type fed with token keys: each is decoded as hostile input
//! (exact shape, bounded), malformed ones are counted and ignored, the list is capped.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Value, json};

/// The key expression of the tokens, for the plugin's liveliness subscriber.
pub const SILENCE_TOKENS: &str = "@zcs/ros2/v1/*/silent/**";

/// The most reason codes a token may carry.
const MAX_CODES: usize = 8;

/// One publisher silent to one subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Silence {
    /// ROS domain id.
    pub domain: u32,
    /// The subscription's GID (32 hex).
    pub subscription: String,
    /// The publisher's GID (32 hex).
    pub publisher: String,
    /// Reason codes: `type`, `type-hash`, `humble`, `later-distro`, `qos`, `unheard-key`, `refused`, `unknown`.
    pub reasons: Vec<String>,
    /// When the router first saw the token, in milliseconds since the Unix epoch.
    pub first_seen_ms: u64,
}

/// The silences that stand, and counters.
#[derive(Debug)]
pub struct SilenceList {
    entries: BTreeMap<String, Silence>,
    max_entries: usize,
    reported: u64,
    malformed: u64,
    over_capacity: u64,
}

fn gid(s: &str) -> Option<String> {
    (s.len() == 32 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))).then(|| s.to_owned())
}

fn decode(key: &str, now: SystemTime) -> Option<Silence> {
    let p: Vec<&str> = key.split('/').collect();
    if p.len() != 8 || p[..3] != ["@zcs", "ros2", "v1"] || p[4] != "silent" {
        return None;
    }
    let domain = p[3].parse().ok().filter(|_| !p[3].starts_with('+'))?;
    let reasons: Vec<String> = p[7].split(',').map(str::to_owned).collect();
    let code_ok = |c: &String| !c.is_empty() && c.len() <= 16 && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
    if reasons.len() > MAX_CODES || !reasons.iter().all(code_ok) {
        return None;
    }
    let first_seen_ms = now.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Some(Silence { domain, subscription: gid(p[5])?, publisher: gid(p[6])?, reasons, first_seen_ms })
}

impl SilenceList {
    /// An empty list of at most `max_entries` silences.
    pub fn new(max_entries: usize) -> Self {
        Self { entries: BTreeMap::new(), max_entries, reported: 0, malformed: 0, over_capacity: 0 }
    }

    /// Changes the cap (entries listed stay).
    pub fn set_max_entries(&mut self, max_entries: usize) {
        self.max_entries = max_entries;
    }

    /// A silence token appeared; `false` if it was not listed (malformed, or the list
    /// is full; both counted).
    pub fn appeared(&mut self, key: &str, now: SystemTime) -> bool {
        if self.entries.contains_key(key) {
            return true;
        }
        let Some(s) = decode(key, now) else {
            self.malformed += 1;
            return false;
        };
        if self.entries.len() >= self.max_entries {
            self.over_capacity += 1;
            return false;
        }
        self.reported += 1;
        self.entries.insert(key.to_owned(), s);
        true
    }

    /// A silence token went away (the publisher was heard from, left, or the
    /// subscription ended); whether it was listed.
    pub fn vanished(&mut self, key: &str) -> bool {
        self.entries.remove(key).is_some()
    }

    /// Silences that stand.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none stands.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The admin-space entries: `ros2` (counters) and `ros2/silent/<sub>/<pub>` each.
    pub fn admin_entries(&self) -> Vec<(String, Value)> {
        let mut out = Vec::with_capacity(1 + self.entries.len());
        out.push((
            "ros2".to_owned(),
            json!({
                "silent_publishers": self.entries.len(),
                "silences_reported": self.reported,
                "malformed_tokens": self.malformed,
                "over_capacity": self.over_capacity,
            }),
        ));
        for s in self.entries.values() {
            out.push((format!("ros2/silent/{}/{}", s.subscription, s.publisher), json!(s)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUB: &str = "0123456789abcdef0123456789abcdef";
    const PUB: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn lists_what_stands_and_counts_the_rest() {
        let now = SystemTime::now();
        let mut l = SilenceList::new(2);
        let key = format!("@zcs/ros2/v1/7/silent/{SUB}/{PUB}/qos,unheard-key");
        assert!(l.appeared(&key, now));
        assert!(l.appeared(&key, now), "a repeat is known");
        let entries = l.admin_entries();
        assert_eq!(entries[0].1["silent_publishers"], 1);
        assert_eq!(entries[0].1["silences_reported"], 1);
        assert_eq!(entries[1].0, format!("ros2/silent/{SUB}/{PUB}"));
        assert_eq!(entries[1].1["reasons"], json!(["qos", "unheard-key"]));
        assert_eq!(entries[1].1["domain"], 7);
        for bad in [
            format!("@zcs/ros2/v1/7/silent/{SUB}/{PUB}"),
            format!("@zcs/ros2/v1/7/silent/{SUB}/{PUB}/qos/x"),
            format!("@zcs/ros2/v1/x/silent/{SUB}/{PUB}/qos"),
            format!("@zcs/ros2/v1/+7/silent/{SUB}/{PUB}/qos"),
            format!("@zcs/ros2/v1/7/silent/{}/{PUB}/qos", SUB.to_uppercase()),
            format!("@zcs/ros2/v1/7/silent/{SUB}/{PUB}/QOS"),
            format!("@zcs/ros2/v1/7/silent/{SUB}/{PUB}/"),
            format!("@zcs/ros2/v1/7/silent/{SUB}/{PUB}/{}", ["qos"; 9].join(",")),
            format!("@zcs/ros2/v1/7/other/{SUB}/{PUB}/qos"),
        ] {
            assert!(!l.appeared(&bad, now), "{bad}");
        }
        assert!(l.appeared(&format!("@zcs/ros2/v1/7/silent/{PUB}/{SUB}/unknown"), now));
        assert!(!l.appeared(&format!("@zcs/ros2/v1/8/silent/{PUB}/{SUB}/unknown"), now), "full");
        let stats = &l.admin_entries()[0].1;
        assert_eq!((stats["malformed_tokens"].as_u64(), stats["over_capacity"].as_u64()), (Some(9), Some(1)));
        assert!(l.vanished(&key) && !l.vanished(&key));
        assert_eq!(l.len(), 1);
    }
}
