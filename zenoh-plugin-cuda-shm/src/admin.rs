//! The plugin's part of the router's admin space.
//!
//! zenohd serves a started plugin's status under
//! `@/<zid>/router/status/plugins/<name>` and asks the plugin for everything below it
//! that a query intersects. This plugin answers (all JSON):
//!
//! | Key below `…/status/plugins/cuda_shm` | Value |
//! |---|---|
//! | `version` | plugin version, zenoh version, `zenoh::FEATURES`, rustc |
//! | `config` | the section in effect |
//! | `stats` | token counters, entries listed, the cap |
//! | `topics/<key>` | a key expression's publishers and subscribers |
//! | `instances/<id>` | one publisher or subscriber, by its 16-hex-digit instance id |
//! | `provider` | the host provider: id, socket, devices, counters (absent when disabled) |
//! | `provider/devices/<device>` | one device's pool: bytes allocated and lent, live and orphaned loans, GPU |
//! | `processes/<client>` | one process connected to the provider: program, pid, uid, loans, blocks it maps, and its latest report |
//! | `paths/<key>` | from the reports: each publisher and subscriber on the key, the path to each peer (`zero-copy` or `bytes`, with the reason), copies and counters; `plain_subscribers`: the `bytes` path (with its reason and copies) of each publisher that plain Zenoh subscribers match |
//!
//! In `topics/<key>` the key expression is escaped so that the admin key names it
//! literally: `%` → `%25`, `*` → `%2A`, `$` → `%24`, and a chunk's leading `@` → `%40`
//! (a subscriber on `camera/**` is `topics/camera/%2A%2A`).
//!
//! ```
//! use zenoh::key_expr::KeyExpr;
//! use zenoh_plugin_cuda_shm::admin;
//!
//! assert_eq!(admin::escape_key("camera/**"), "camera/%2A%2A");
//! let entries = vec![("version".to_owned(), serde_json::json!("0.1.0"))];
//! let query = KeyExpr::try_from("@/*/router/status/plugins/cuda_shm/**")?;
//! let replies = admin::answer(&query, "@/0a1b/router/status/plugins/cuda_shm", entries);
//! assert_eq!(replies[0].0, "@/0a1b/router/status/plugins/cuda_shm/version");
//! # Ok::<(), zenoh::Error>(())
//! ```

use serde::Serialize;
use serde_json::{Value, json};
use zenoh::key_expr::{KeyExpr, keyexpr};

use zenoh_cuda_shm::provider::ProviderSnapshot;

use crate::config::PluginConfig;
use crate::registry::Snapshot;

/// What `version` shows: what zenohd compares when it loads the plugin, and the
/// plugin's own version.
#[derive(Debug, Clone, Serialize)]
pub struct VersionInfo {
    /// This crate's version.
    pub plugin: &'static str,
    /// The zenoh crate's version string (`v1.10.2-release` for crates.io builds).
    pub zenoh: &'static str,
    /// `zenoh::FEATURES`: must equal the router's.
    pub zenoh_features: &'static str,
    /// The rustc release the plugin was built with: must equal the router's.
    pub rustc: &'static str,
    /// That rustc's commit hash: must equal the router's too.
    pub rustc_commit: &'static str,
    /// The wire protocol version of the tokens it reads.
    pub protocol: u8,
}

/// The version record of this build.
pub fn version_info() -> VersionInfo {
    let (rustc, rustc_commit) = zenoh_macros::rustc_version_release!();
    VersionInfo {
        plugin: env!("CARGO_PKG_VERSION"),
        zenoh: zenoh::GIT_VERSION,
        zenoh_features: zenoh::FEATURES,
        rustc,
        rustc_commit,
        protocol: zcs_wire::protocol::VERSION,
    }
}

/// Escapes a key expression into chunks that match only themselves (module docs).
pub fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for (i, chunk) in key.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        for (j, c) in chunk.chars().enumerate() {
            match c {
                '%' => out.push_str("%25"),
                '*' => out.push_str("%2A"),
                '$' => out.push_str("%24"),
                '@' if j == 0 => out.push_str("%40"),
                c => out.push(c),
            }
        }
    }
    out
}

/// Why plain Zenoh subscribers of a key are served bytes.
pub const PLAIN_SUBSCRIBER_REASON: &str = "plain Zenoh subscriber (no GPU channel): the publisher copies each message \
     out of its block once and puts the bytes on the key";

/// Every entry of the plugin's admin space, keys relative to its status key.
pub fn entries(
    snapshot: &Snapshot,
    config: &PluginConfig,
    provider: Option<&ProviderSnapshot>,
) -> Vec<(String, Value)> {
    let mut out = Vec::with_capacity(3 + snapshot.topics.len() + snapshot.instances.len());
    out.push(("version".to_owned(), to_json(&version_info())));
    out.push(("config".to_owned(), to_json(config)));
    out.push((
        "stats".to_owned(),
        json!({
            "tokens": snapshot.stats,
            "entries": snapshot.entries,
            "max_entries": snapshot.max_entries,
        }),
    ));
    for (key, topic) in &snapshot.topics {
        out.push((format!("topics/{}", escape_key(key)), to_json(topic)));
    }
    for (id, entity) in &snapshot.instances {
        out.push((format!("instances/{id}"), to_json(entity)));
    }
    if let Some(p) = provider {
        out.push((
            "provider".to_owned(),
            json!({
                "id": format!("{:016x}", p.provider.id),
                "socket": zcs_wire::ipc::SocketName::from_key_chunk(&p.provider.socket)
                    .map_or_else(|_| p.provider.socket.clone(), |n| n.to_string()),
                "boot_id": p.boot_id,
                "devices": p.devices.iter().map(|d| &d.device).collect::<Vec<_>>(),
                "unusable_gpus": p.unusable_gpus,
                "clients": p.clients.len(),
                "counters": p.counters,
            }),
        ));
        for d in &p.devices {
            out.push((format!("provider/devices/{}", d.device), to_json(d)));
        }
        for c in &p.clients {
            let mut v = to_json(c);
            hex_ids(&mut v);
            out.push((format!("processes/{}", c.client), v));
        }
        // The reports again by key: each publisher and subscriber with its paths, and
        // the path plain Zenoh subscribers get (they send no reports: the publishers
        // that serve them say so).
        #[derive(Default)]
        struct ByKey {
            publishers: Vec<Value>,
            subscribers: Vec<Value>,
            plain: Vec<Value>,
        }
        let mut by_key: std::collections::BTreeMap<&str, ByKey> = Default::default();
        for (c, r) in p.clients.iter().filter_map(|c| Some((c, c.report.as_ref()?))) {
            for x in &r.publishers {
                let mut v = json!({ "process": c.client, "program": c.program, "pid": c.pid, "report": x });
                hex_ids(&mut v);
                let entry = by_key.entry(&x.key).or_default();
                entry.publishers.push(v);
                if x.plain_listeners {
                    entry.plain.push(json!({
                        "publisher": format!("{:016x}", x.instance),
                        "path": "bytes",
                        "reason": PLAIN_SUBSCRIBER_REASON,
                        "copies_out": x.copies_out,
                        "copied_bytes": x.copied_bytes,
                    }));
                }
            }
            for x in &r.subscribers {
                let mut v = json!({ "process": c.client, "program": c.program, "pid": c.pid, "report": x });
                hex_ids(&mut v);
                by_key.entry(&x.key).or_default().subscribers.push(v);
            }
        }
        for (key, k) in by_key {
            out.push((
                format!("paths/{}", escape_key(key)),
                json!({ "key": key, "publishers": k.publishers, "subscribers": k.subscribers,
                        "plain_subscribers": k.plain }),
            ));
        }
    }
    out
}

/// Instance ids in reports are numbers on the wire; the admin space names them in hex,
/// as in `instances/<id>`.
fn hex_ids(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match (k.as_str(), x.as_u64()) {
                    ("instance" | "peer", Some(n)) => *x = Value::from(format!("{n:016x}")),
                    _ => hex_ids(x),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(hex_ids),
        _ => {}
    }
}

fn to_json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| json!({ "error": e.to_string() }))
}

/// The entries a query asks for: those whose full key (`status_key/relative`)
/// intersects it. Entries whose key is not a valid key expression are skipped (none
/// are, given [`escape_key`]).
pub fn answer(query: &KeyExpr<'_>, status_key: &str, entries: Vec<(String, Value)>) -> Vec<(String, Value)> {
    entries
        .into_iter()
        .filter_map(|(rel, value)| {
            let full = format!("{status_key}/{rel}");
            let ke = keyexpr::new(full.as_str()).ok()?;
            ke.intersects(query).then_some((full, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use zcs_wire::protocol::{Group, Role, Token};

    use super::*;
    use crate::registry::Registry;

    const STATUS: &str = "@/0123456789abcdef/router/status/plugins/cuda_shm";

    fn sample_registry() -> Registry {
        let mut reg = Registry::new(8);
        for (role, key, instance) in
            [(Role::Pub, "cam/front", 1u64), (Role::Sub, "cam/**", 2), (Role::Sub, "@x/$*y", 3)]
        {
            let t = Token {
                role,
                key: key.to_owned(),
                instance,
                group: Group { boot_id: "b".into(), device: "host".into() },
                socket: (role == Role::Pub).then(|| "a7a6373".to_owned()),
            };
            reg.token_appeared(&t.to_key(), UNIX_EPOCH + Duration::from_secs(1));
        }
        reg
    }

    fn keys(query: &str) -> Vec<String> {
        let reg = sample_registry();
        let q = KeyExpr::try_from(query).unwrap();
        answer(&q, STATUS, entries(&reg.snapshot(), &PluginConfig::default(), None))
            .into_iter()
            .map(|(k, _)| k.strip_prefix(STATUS).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn escaped_keys_are_literal_key_expressions() {
        for (key, escaped) in [
            ("cam/front", "cam/front"),
            ("cam/**", "cam/%2A%2A"),
            ("a/*/b", "a/%2A/b"),
            ("@x/$*y", "%40x/%24%2Ay"),
            ("100%/a@b", "100%25/a@b"),
        ] {
            assert_eq!(escape_key(key), escaped);
            let ke = keyexpr::new(escaped).unwrap();
            assert!(!ke.is_wild(), "{escaped}");
        }
    }

    #[test]
    fn queries_get_what_they_intersect() {
        let all = keys(&format!("{STATUS}/**"));
        assert_eq!(
            all,
            [
                "/version",
                "/config",
                "/stats",
                "/topics/%40x/%24%2Ay",
                "/topics/cam/%2A%2A",
                "/topics/cam/front",
                "/instances/0000000000000001",
                "/instances/0000000000000002",
                "/instances/0000000000000003",
            ]
        );
        assert_eq!(keys("@/*/router/status/plugins/cuda_shm/version"), ["/version"]);
        assert_eq!(keys("@/*/router/status/plugins/*/topics/cam/front"), ["/topics/cam/front"]);
        // `*` matches any one chunk, the escaped `**` too.
        assert_eq!(keys("@/*/router/status/plugins/*/topics/cam/*"), ["/topics/cam/%2A%2A", "/topics/cam/front"]);
        assert_eq!(
            keys("@/*/router/status/plugins/cuda_shm/topics/cam/**"),
            ["/topics/cam/%2A%2A", "/topics/cam/front"]
        );
        assert_eq!(
            keys("@/*/router/status/plugins/cuda_shm/instances/0000000000000002"),
            ["/instances/0000000000000002"]
        );
        assert!(keys("@/*/router/status/plugins/rest/**").is_empty());
        assert!(keys("@/*/router/status/plugins/cuda_shm/nothing").is_empty());
    }

    #[test]
    fn values_are_json_objects() {
        let reg = sample_registry();
        let all = entries(&reg.snapshot(), &PluginConfig::default(), None);
        let get = |k: &str| all.iter().find(|(rel, _)| rel == k).map(|(_, v)| v.clone()).unwrap();
        let version = get("version");
        assert_eq!(version["zenoh_features"], zenoh::FEATURES);
        assert_eq!(version["plugin"], env!("CARGO_PKG_VERSION"));
        assert!(version["rustc"].as_str().unwrap().starts_with("1."), "{version}");
        assert_eq!(get("config")["max_entries"], 4096);
        assert_eq!(get("stats")["entries"], 3);
        assert_eq!(get("stats")["tokens"]["appeared"], 3);
        let topic = get("topics/cam/front");
        assert_eq!(topic["key"], "cam/front");
        assert_eq!(topic["publishers"][0]["instance"], "0000000000000001");
        assert_eq!(get("instances/0000000000000002")["key"], "cam/**");
    }
}
