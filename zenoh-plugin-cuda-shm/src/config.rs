//! The plugin's section of the router configuration, `plugins/cuda_shm`.
//!
//! Strict: an unknown key, a wrong type or a value out of range is refused with a
//! message naming it, and the plugin does not start. The JSON schema of the section is
//! generated from [`PluginConfig`] and committed as `config.schema.json`; a sample
//! router configuration is `config.json5` (both next to this crate's `Cargo.toml`).
//!
//! ```
//! use zenoh_plugin_cuda_shm::config::PluginConfig;
//!
//! let cfg = PluginConfig::from_value(&serde_json::json!({ "max_entries": 100 }))?;
//! assert_eq!(cfg.max_entries, 100);
//! let err = PluginConfig::from_value(&serde_json::json!({ "max_entrys": 100 })).unwrap_err();
//! assert!(err.to_string().contains("unknown field `max_entrys`"));
//! # Ok::<(), zenoh_plugin_cuda_shm::config::ConfigError>(())
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default for [`PluginConfig::max_entries`].
pub const DEFAULT_MAX_ENTRIES: usize = 4096;
/// Largest accepted [`PluginConfig::max_entries`].
pub const MAX_MAX_ENTRIES: usize = 1 << 20;

/// `plugins/cuda_shm`: every key is optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "zenoh-plugin-cuda-shm configuration (plugins/cuda_shm)")]
pub struct PluginConfig {
    /// Most publishers and subscribers the registry lists (1 to 1048576, default 4096).
    /// Tokens beyond it are counted in `stats.over_capacity` and not listed, so a flood
    /// of liveliness tokens cannot grow the router's memory without bound. The only key
    /// that can be changed while the router runs.
    #[serde(default = "default_max_entries")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_entries: usize,
    /// The host provider: pools of the host's GPUs (and of host memory) whose blocks
    /// the router lends to the publishers of its host.
    #[serde(default)]
    pub provider: ProviderSection,
    /// Read by zenohd's plugin loader, not by the plugin: the library file(s) to load,
    /// instead of searching the plugin directories.
    #[serde(rename = "__path__", default, skip_serializing_if = "Option::is_none")]
    pub loader_path: Option<OneOrMany>,
    /// Read by zenohd's plugin loader: the router fails to start if the plugin does
    /// not load or start (zenohd's `-P cuda_shm` sets it).
    #[serde(rename = "__required__", default, skip_serializing_if = "Option::is_none")]
    pub loader_required: Option<bool>,
    /// Read by zenohd: a file whose content is merged into this section.
    #[serde(rename = "__config__", default, skip_serializing_if = "Option::is_none")]
    pub loader_config: Option<String>,
    /// Read by zenohd's plugin loader: the library name to search for, when it differs
    /// from the section's name.
    #[serde(rename = "__plugin__", default, skip_serializing_if = "Option::is_none")]
    pub loader_plugin: Option<String>,
}

/// `provider`: the host provider run by the router (every key optional). Changing it
/// needs a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderSection {
    /// Run the provider (default true). Processes of the host then borrow their blocks
    /// from the router; without it (or without a router) they use their own pools.
    pub enabled: bool,
    /// Which GPUs to lend blocks of: "all" (default: every GPU that supports the
    /// zero-copy path), "none", or a list of ordinals. The router holds a CUDA context
    /// on each.
    pub gpus: GpuChoice,
    /// Lend host-memory blocks (sealed memfds) too, for processes without a GPU
    /// (default true).
    pub host: bool,
    /// Most bytes lent per device (default 8 GiB).
    #[schemars(range(min = 1))]
    pub max_bytes: u64,
    /// Most blocks per device (default 4096).
    #[schemars(range(min = 1))]
    pub max_blocks: usize,
    /// How long a borrow waits for a block at the caps before it is refused (default
    /// 1000 ms).
    pub loan_timeout_ms: u64,
    /// A free block idle longer than this is released (default 10000 ms).
    pub idle_trim_ms: u64,
    /// Free bytes kept per device despite `idle_trim_ms` (default 256 MiB).
    pub keep_idle_bytes: u64,
    /// Directory (created 0700) for a path socket, for processes in other network
    /// namespaces; unset (default): an abstract socket.
    pub socket_dir: Option<String>,
    /// Users besides the router's own that may connect (default none).
    pub allowed_uids: Vec<u32>,
}

impl Default for ProviderSection {
    fn default() -> Self {
        Self {
            enabled: true,
            gpus: GpuChoice::default(),
            host: true,
            max_bytes: 8 << 30,
            max_blocks: 4096,
            loan_timeout_ms: 1000,
            idle_trim_ms: 10_000,
            keep_idle_bytes: 256 << 20,
            socket_dir: None,
            allowed_uids: Vec::new(),
        }
    }
}

impl ProviderSection {
    /// The library's provider configuration for this section.
    pub fn to_provider_config(&self) -> zenoh_cuda_shm::provider::ProviderConfig {
        use zenoh_cuda_shm::provider::GpuSelection;
        zenoh_cuda_shm::provider::ProviderConfig {
            gpus: match &self.gpus {
                GpuChoice::Named(GpuKeyword::All) => GpuSelection::All,
                GpuChoice::Named(GpuKeyword::None) => GpuSelection::None,
                GpuChoice::Ordinals(v) => GpuSelection::Ordinals(v.clone()),
            },
            host: self.host,
            pool: zcs_pool::PoolConfig {
                max_bytes: self.max_bytes,
                max_blocks: self.max_blocks,
                loan_timeout_ms: self.loan_timeout_ms,
                idle_trim_ms: self.idle_trim_ms,
                keep_idle_bytes: self.keep_idle_bytes,
                ..Default::default()
            },
            socket_dir: self.socket_dir.as_ref().map(Into::into),
            allowed_uids: self.allowed_uids.clone(),
        }
    }
}

/// `provider.gpus`: a keyword or a list of ordinals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum GpuChoice {
    /// "all" or "none".
    Named(GpuKeyword),
    /// These ordinals.
    Ordinals(Vec<usize>),
}

impl Default for GpuChoice {
    fn default() -> Self {
        Self::Named(GpuKeyword::All)
    }
}

/// "all" or "none".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuKeyword {
    /// Every usable GPU.
    All,
    /// No GPU.
    None,
}

/// A path or a list of paths (zenohd accepts both for `__path__`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One path.
    One(String),
    /// Several paths, tried in order.
    Many(Vec<String>),
}

fn default_max_entries() -> usize {
    DEFAULT_MAX_ENTRIES
}

impl Default for PluginConfig {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            provider: ProviderSection::default(),
            loader_path: None,
            loader_required: None,
            loader_config: None,
            loader_plugin: None,
        }
    }
}

/// Why a `plugins/cuda_shm` section was refused. Messages name keys relative to the
/// section; the plugin prefixes the section (`plugins/<name>: …`) when it reports them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not a map of keys (serde would read an array as the fields in order).
    #[error("expected a map of keys, found {found}")]
    NotAnObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// A value of the wrong type, or one its type cannot hold (a negative count, a
    /// keyword that does not exist): the key, what it takes and what was found, in
    /// words (`max_entries: expected a whole number from 1 to 1048576, found the
    /// string "lots"`).
    #[error("{key}: expected {expected}, found {found}")]
    WrongValue {
        /// The key, from the section (`provider.max_blocks`).
        key: String,
        /// What the key takes.
        expected: &'static str,
        /// The value given, as JSON (strings introduced as such).
        found: String,
        /// serde's message, in Rust's terms (`expected usize`).
        #[source]
        source: serde_json::Error,
    },
    /// Not the right shape: an unknown key (serde's message names it and lists the
    /// known ones), prefixed with the map it is in when that is not the section.
    #[error("{}{source}", in_map.as_deref().map(|m| format!("{m}: ")).unwrap_or_default())]
    Invalid {
        /// The key of the map holding the refused key (`provider`), if not the section.
        in_map: Option<String>,
        /// serde's message, which names the key.
        #[source]
        source: serde_json::Error,
    },
    /// A value outside its range.
    #[error("{key}: {value} is out of range ({range})")]
    OutOfRange {
        /// The key.
        key: &'static str,
        /// The refused value.
        value: String,
        /// What is accepted.
        range: &'static str,
    },
    /// A change the running plugin cannot apply.
    #[error("{key} cannot be changed while the router runs; edit the configuration and restart it")]
    NotLive {
        /// The key whose change was refused.
        key: &'static str,
    },
}

/// What each key takes, in words, by its key from the section (list elements as `[]`).
/// A test checks that every key of the JSON schema is here.
const EXPECTED: &[(&str, &str)] = &[
    ("max_entries", "a whole number from 1 to 1048576"),
    ("provider", "a map of keys"),
    ("provider.enabled", "true or false"),
    ("provider.gpus", "\"all\", \"none\" or a list of GPU ordinals (whole numbers from 0)"),
    ("provider.gpus[]", "a GPU ordinal (a whole number from 0)"),
    ("provider.host", "true or false"),
    ("provider.max_bytes", "a whole number of bytes"),
    ("provider.max_blocks", "a whole number of blocks"),
    ("provider.loan_timeout_ms", "a whole number of milliseconds"),
    ("provider.idle_trim_ms", "a whole number of milliseconds"),
    ("provider.keep_idle_bytes", "a whole number of bytes"),
    ("provider.socket_dir", "a directory path (a string)"),
    ("provider.allowed_uids", "a list of user ids (whole numbers from 0 to 4294967295)"),
    ("provider.allowed_uids[]", "a user id (a whole number from 0 to 4294967295)"),
    ("__path__", "a library path or a list of them (strings)"),
    ("__path__[]", "a library path (a string)"),
    ("__required__", "true or false"),
    ("__config__", "a file path (a string)"),
    ("__plugin__", "a library name (a string)"),
];

/// serde's refusal of `value` as the section, turned into one that names the key.
fn refused(value: &serde_json::Value, e: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    use serde_path_to_error::Segment;
    let path = e.path().clone();
    let source = e.into_inner();
    // The key as written (`provider.allowed_uids[1]`), the key of the table
    // (`provider.allowed_uids[]`), and the value found there.
    let (mut key, mut generic, mut found) = (String::new(), String::new(), Some(value));
    for segment in path.iter() {
        match segment {
            Segment::Map { key: k } => {
                let dot = if key.is_empty() { "" } else { "." };
                key = format!("{key}{dot}{k}");
                generic = format!("{generic}{dot}{k}");
                found = found.and_then(|v| v.get(k.as_str()));
            }
            Segment::Seq { index } => {
                key = format!("{key}[{index}]");
                generic.push_str("[]");
                found = found.and_then(|v| v.get(*index));
            }
            Segment::Enum { .. } | Segment::Unknown => found = None,
        }
    }
    let expected = EXPECTED.iter().find(|(k, _)| *k == generic).map(|(_, e)| *e);
    match (expected, found) {
        (Some(expected), Some(found)) if !source.to_string().starts_with("unknown field") => {
            let found = match found {
                serde_json::Value::String(s) => format!("the string {}", serde_json::Value::from(s.as_str())),
                other => other.to_string(),
            };
            ConfigError::WrongValue { key, expected, found, source }
        }
        // An unknown key, which serde's path ends with: name the map holding it.
        _ => {
            let name = unknown_name(&source);
            let in_map = match key.strip_suffix(&name) {
                Some(map) if !name.is_empty() => map.strip_suffix('.').unwrap_or(map).to_owned(),
                _ => key,
            };
            ConfigError::Invalid { in_map: Some(in_map).filter(|m| !m.is_empty()), source }
        }
    }
}

/// The key an "unknown field `x`, expected …" message names ("" for other messages).
fn unknown_name(source: &serde_json::Error) -> String {
    let text = source.to_string();
    text.strip_prefix("unknown field `").and_then(|r| r.split('`').next()).unwrap_or("").to_owned()
}

impl PluginConfig {
    /// Parses and checks a section as the router hands it over (JSON).
    pub fn from_value(value: &serde_json::Value) -> Result<Self, ConfigError> {
        let found = match value {
            serde_json::Value::Object(_) => None,
            serde_json::Value::Null => Some("null"),
            serde_json::Value::Bool(_) => Some("a boolean"),
            serde_json::Value::Number(_) => Some("a number"),
            serde_json::Value::String(_) => Some("a string"),
            serde_json::Value::Array(_) => Some("an array"),
        };
        if let Some(found) = found {
            return Err(ConfigError::NotAnObject { found });
        }
        let cfg: Self = serde_path_to_error::deserialize(value).map_err(|e| refused(value, e))?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Checks the ranges serde cannot express.
    pub fn check(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_MAX_ENTRIES).contains(&self.max_entries) {
            return Err(ConfigError::OutOfRange {
                key: "max_entries",
                value: self.max_entries.to_string(),
                range: "1 to 1048576",
            });
        }
        Ok(())
    }

    /// Decides whether a running plugin configured with `self` can take `new`: the
    /// parsed `new` when only keys that can change live differ (`max_entries`, and
    /// `__required__`, which matters only when the plugin starts), else the reason.
    pub fn live_change(&self, new: &serde_json::Value) -> Result<Self, ConfigError> {
        let new = Self::from_value(new)?;
        if new.loader_path != self.loader_path {
            return Err(ConfigError::NotLive { key: "__path__" });
        }
        if new.loader_plugin != self.loader_plugin {
            return Err(ConfigError::NotLive { key: "__plugin__" });
        }
        if new.loader_config != self.loader_config {
            return Err(ConfigError::NotLive { key: "__config__" });
        }
        if new.provider != self.provider {
            return Err(ConfigError::NotLive { key: "provider" });
        }
        Ok(new)
    }

    /// The JSON schema of the section (what `config.schema.json` holds).
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(PluginConfig)).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CRATE_DIR: &str = env!("CARGO_MANIFEST_DIR");

    #[test]
    fn empty_section_gives_the_documented_defaults() {
        let cfg = PluginConfig::from_value(&json!({})).unwrap();
        assert_eq!(cfg, PluginConfig::default());
        assert_eq!(cfg.max_entries, 4096);
    }

    #[test]
    fn loader_keys_are_accepted_in_both_forms() {
        let cfg = PluginConfig::from_value(&json!({
            "__required__": true,
            "__path__": "/opt/zcs/libzenoh_plugin_cuda_shm.so",
            "__plugin__": "cuda_shm",
        }))
        .unwrap();
        assert_eq!(cfg.loader_required, Some(true));
        assert_eq!(cfg.loader_path, Some(OneOrMany::One("/opt/zcs/libzenoh_plugin_cuda_shm.so".into())));
        let cfg = PluginConfig::from_value(&json!({ "__path__": ["/a.so", "/b.so"] })).unwrap();
        assert_eq!(cfg.loader_path, Some(OneOrMany::Many(vec!["/a.so".into(), "/b.so".into()])));
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = PluginConfig::from_value(&json!({ "max_entries": 10, "max_entry": 3 })).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("unknown field `max_entry`"), "{msg}");
        assert!(msg.contains("expected one of"), "{msg}");
        let err = PluginConfig::from_value(&json!({ "provider": { "gpu": "all" } })).unwrap_err();
        assert!(err.to_string().starts_with("provider: unknown field `gpu`, expected one of `enabled`"), "{err}");
    }

    #[test]
    fn provider_section() {
        use zenoh_cuda_shm::provider::GpuSelection;
        let cfg = PluginConfig::from_value(&json!({})).unwrap();
        assert!(cfg.provider.enabled && cfg.provider.host);
        assert_eq!(cfg.provider.to_provider_config().gpus, GpuSelection::All);
        let cfg =
            PluginConfig::from_value(&json!({ "provider": { "gpus": [0, 2], "host": false, "max_bytes": 1024 } }))
                .unwrap();
        let p = cfg.provider.to_provider_config();
        assert_eq!((p.gpus, p.host, p.pool.max_bytes), (GpuSelection::Ordinals(vec![0, 2]), false, 1024));
        let cfg = PluginConfig::from_value(&json!({ "provider": { "gpus": "none" } })).unwrap();
        assert_eq!(cfg.provider.to_provider_config().gpus, GpuSelection::None);
        for bad in [json!({ "gpus": "some" }), json!({ "gpus": [-1] }), json!({ "max_blocks": "x" })] {
            assert!(PluginConfig::from_value(&json!({ "provider": bad })).is_err(), "{bad}");
        }
        let err = cfg.live_change(&json!({ "provider": { "gpus": "all" } })).unwrap_err();
        assert!(err.to_string().starts_with("provider cannot be changed while the router runs"), "{err}");
    }

    #[test]
    fn wrong_values_name_the_key_and_what_it_takes_in_words() {
        let refused = |section: serde_json::Value| PluginConfig::from_value(&section).unwrap_err().to_string();
        for (section, expected) in [
            (
                json!({ "max_entries": "lots" }),
                "max_entries: expected a whole number from 1 to 1048576, found the string \"lots\"",
            ),
            (json!({ "max_entries": -1 }), "max_entries: expected a whole number from 1 to 1048576, found -1"),
            (json!({ "max_entries": 2.5 }), "max_entries: expected a whole number from 1 to 1048576, found 2.5"),
            (json!({ "max_entries": null }), "max_entries: expected a whole number from 1 to 1048576, found null"),
            (json!({ "__required__": "yes" }), "__required__: expected true or false, found the string \"yes\""),
            (json!({ "provider": 3 }), "provider: expected a map of keys, found 3"),
            (
                json!({ "provider": { "max_blocks": "x" } }),
                "provider.max_blocks: expected a whole number of blocks, found the string \"x\"",
            ),
            (
                json!({ "provider": { "allowed_uids": [1000, -2] } }),
                "provider.allowed_uids[1]: expected a user id (a whole number from 0 to 4294967295), found -2",
            ),
            (
                json!({ "provider": { "gpus": "some" } }),
                "provider.gpus: expected \"all\", \"none\" or a list of GPU ordinals (whole numbers from 0), \
                 found the string \"some\"",
            ),
            (
                json!({ "provider": { "gpus": [-1] } }),
                "provider.gpus: expected \"all\", \"none\" or a list of GPU ordinals (whole numbers from 0), found [-1]",
            ),
        ] {
            let msg = refused(section.clone());
            assert_eq!(msg, expected, "{section}");
            // Words, not Rust: no type names, no Debug form.
            for rust in ["usize", "u64", "u32", "untagged", "Error(", "Value::"] {
                assert!(!msg.contains(rust), "{section}: {msg}");
            }
        }
        // serde's own message stays reachable as the source.
        let err = PluginConfig::from_value(&json!({ "max_entries": "lots" })).unwrap_err();
        let source = std::error::Error::source(&err).expect("a source").to_string();
        assert!(source.contains("invalid type: string \"lots\""), "{source}");
        // serde would take an array as the fields in order; a section is a map.
        assert_eq!(refused(json!([4096])), "expected a map of keys, found an array");
    }

    /// Every key of the schema has its words in `EXPECTED`, so that a new key cannot
    /// be refused with serde's Rust terms.
    #[test]
    fn every_key_has_its_expected_value_in_words() {
        let schema = PluginConfig::json_schema();
        let mut keys = Vec::new();
        for (k, v) in schema["properties"].as_object().unwrap() {
            keys.push(k.clone());
            if k == "provider" {
                let r = v["$ref"].as_str().or_else(|| v["allOf"][0]["$ref"].as_str()).unwrap_or_else(|| panic!("{v}"));
                let name = r.rsplit('/').next().unwrap();
                let defs = schema.get("$defs").or_else(|| schema.get("definitions")).unwrap();
                keys.extend(defs[name]["properties"].as_object().unwrap().keys().map(|p| format!("provider.{p}")));
            }
        }
        assert!(keys.len() > 10, "{keys:?}");
        for k in keys {
            assert!(EXPECTED.iter().any(|(e, _)| *e == k), "no words for {k} in EXPECTED");
        }
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for bad in [0usize, MAX_MAX_ENTRIES + 1] {
            let msg = PluginConfig::from_value(&json!({ "max_entries": bad })).unwrap_err().to_string();
            assert_eq!(msg, format!("max_entries: {bad} is out of range (1 to 1048576)"));
        }
        assert_eq!(PluginConfig::from_value(&json!({ "max_entries": MAX_MAX_ENTRIES })).unwrap().max_entries, 1 << 20);
    }

    #[test]
    fn live_changes_are_limited_to_what_the_plugin_can_apply() {
        let cur = PluginConfig::from_value(&json!({ "__required__": true, "max_entries": 10 })).unwrap();
        let new = cur.live_change(&json!({ "__required__": false, "max_entries": 20 })).unwrap();
        assert_eq!(new.max_entries, 20);
        let err = cur.live_change(&json!({ "__path__": "/elsewhere.so", "max_entries": 10 })).unwrap_err();
        assert_eq!(
            err.to_string(),
            "__path__ cannot be changed while the router runs; edit the configuration and restart it"
        );
        assert!(cur.live_change(&json!({ "max_entries": 0 })).is_err());
        assert!(cur.live_change(&json!({ "bogus": 1 })).is_err());
    }

    /// The committed schema is the generated one. `ZCS_BLESS=1` rewrites the file.
    #[test]
    fn committed_schema_is_current() {
        let path = format!("{CRATE_DIR}/config.schema.json");
        let generated = PluginConfig::json_schema();
        assert!(generated.is_object());
        let text = serde_json::to_string_pretty(&generated).unwrap() + "\n";
        if std::env::var_os("ZCS_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap();
        assert!(
            committed == text,
            "{path} differs from the schema generated from PluginConfig; \
             regenerate it with `ZCS_BLESS=1 cargo test -p zenoh-plugin-cuda-shm committed_schema`"
        );
        // The schema is strict too.
        assert_eq!(generated["additionalProperties"], json!(false), "{text}");
    }

    /// The shipped sample router configuration is valid for zenoh and for this plugin.
    #[test]
    fn sample_router_config_parses() {
        let path = format!("{CRATE_DIR}/config.json5");
        let text = std::fs::read_to_string(&path).unwrap();
        let whole: serde_json::Value = json5::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        let section = &whole["plugins"]["cuda_shm"];
        assert!(section.is_object(), "{path} has no plugins.cuda_shm section");
        let cfg = PluginConfig::from_value(section).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(cfg.max_entries, DEFAULT_MAX_ENTRIES);
        assert!(whole["plugins"]["rest"].is_object(), "{path} should load the REST plugin too");
        // zenoh reads the same file.
        zenoh::Config::from_file(&path).unwrap_or_else(|e| panic!("zenoh refuses {path}: {e}"));
    }
}
