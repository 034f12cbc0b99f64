//! Configuration: a JSON5 file (like Zenoh's), strict about unknown fields, with every
//! default documented. Environment variables only override what the file says.
//!
//! ```
//! # use zcs_transport::config::ZcsConfig;
//! let cfg = ZcsConfig::from_json5(r#"{
//!     inline_threshold: 4096,
//!     pool: { max_bytes: 1073741824 },
//! }"#).unwrap();
//! assert_eq!(cfg.inline_threshold, 4096);
//! assert!(ZcsConfig::from_json5("{ inline_treshold: 1 }").is_err()); // typo: refused
//! ```

// Re-exported by `zenoh-cuda-shm`: errors and panics documented as there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::pool::PoolConfig;

/// Which device memory a session uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChoice {
    /// The GPU if one is usable, else host memory (default).
    Auto,
    /// Host memory only (memfd blocks): zero-copy between processes on one host, no GPU.
    Host,
    /// The GPU; opening the session fails without one.
    Cuda,
}

/// Whether a GPU subscriber also listens on the plain key for publishers that are
/// not ours (plain Zenoh or ROS publishers).
///
/// Zenoh's matching status is a yes/no, so a publisher cannot tell a plain subscriber
/// from a GPU subscriber that merely listens on the plain key. Listening there makes
/// every one of our publishers pay a device→host copy per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlainListen {
    /// Listen on the plain key only while no publisher of ours exists for the key
    /// (default): a topic fed by plain publishers works, and a topic fed by ours keeps
    /// its zero-copy path free of device→host copies.
    Auto,
    /// Always listen (mixed topics with plain and GPU publishers at once).
    Always,
    /// Never listen: only our publishers are received.
    Never,
}

/// How a CUDA subscriber reads from a publisher on another GPU of the same host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerGpus {
    /// Map the publisher's blocks for this GPU and read them in place over NVLink or
    /// PCIe, where the driver reports peer access (default). Without peer access (or
    /// for a GPU this process does not see): through host memory, as with `host`.
    #[default]
    InPlace,
    /// Map the publisher's blocks as for `in_place`, and copy each message into a block
    /// on this GPU on arrival, on the subscriber's own stream (ordered after the
    /// publisher's ready signal, no host wait); the publisher's lease is released as
    /// soon as that copy completes. For data read many times, or held long: reads are
    /// local, and the publisher's pool is not held by this subscriber.
    Copy,
    /// Through host memory, even with peer access: the publisher copies each message
    /// once into a shared host block (as for its subscribers without a GPU), and this
    /// subscriber copies it onto its GPU on arrival, on its own stream. What happens
    /// without peer access anyway; chosen where the link between the GPUs is slower
    /// than two copies through host memory.
    Host,
    /// Never read another GPU's messages in place or through host memory: bytes from
    /// publishers on other GPUs.
    Off,
}

/// What a put does when Zenoh's queue towards a peer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Congestion {
    /// Wait for room (default): nothing is lost, a slow link slows the publisher.
    Block,
    /// Drop the message for that peer (real-time streams that prefer fresh data).
    Drop,
}

/// Whether a session borrows blocks from the host provider (`crate::provider`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderMode {
    /// Use the host's provider if one answers within `provider_discovery_ms`; otherwise
    /// this process's own pools (default).
    #[default]
    Auto,
    /// Always this process's own pools.
    Off,
    /// Fail to open without a provider.
    Required,
}

/// Session configuration. Every field is optional in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZcsConfig {
    /// Device memory to use (default `auto`).
    pub device: DeviceChoice,
    /// CUDA device ordinal when `device` is `auto` or `cuda` (default 0).
    pub gpu_ordinal: usize,
    /// Payloads up to this many bytes travel inline as bytes, with no block
    /// (default 65536).
    pub inline_threshold: usize,
    /// Block pool limits of each publisher.
    pub pool: PoolConfig,
    /// How long a subscriber's handshake with a publisher may take (default 2000 ms).
    pub handshake_timeout_ms: u64,
    /// Directory (created 0700) for path control sockets, for peers in separate
    /// network namespaces. Unset (default): abstract sockets.
    pub socket_dir: Option<PathBuf>,
    /// Peer uids allowed on control sockets in addition to our own (default none).
    pub allowed_uids: Vec<u32>,
    /// Whether GPU subscribers listen on the plain key (default `auto`).
    pub plain_listen: PlainListen,
    /// Congestion control of the bytes channels (default `block`). Descriptors always
    /// block: a dropped descriptor would keep its leases until the connection ends.
    pub congestion: Congestion,
    /// With `congestion` `block`: how long a put waits for a subscriber holding
    /// `pool.max_holds_per_holder` blocks to release one, before sending it that message
    /// as bytes (default 1000 ms; 0: at once). With `drop` it never waits.
    pub lease_wait_ms: u64,
    /// Whether publishers borrow blocks from the host provider (default `auto`).
    pub provider: ProviderMode,
    /// How long opening a session looks for a provider (default 300 ms; only with
    /// `provider` `auto` or `required`). With `auto`, a session opened from a
    /// configuration that names connect endpoints spends this time waiting for the first
    /// of its links, if Zenoh returned before any was up, and then asking over it.
    pub provider_discovery_ms: u64,
    /// How CUDA subscribers read from publishers on another GPU of this host (default
    /// `in_place`).
    pub peer_gpus: PeerGpus,
    /// Whether this session's subscribers may take host blocks from GPU publishers of
    /// this host: each message copied once, device→host, by the publisher into shared
    /// host memory, for all such subscribers (default true). A session without a GPU
    /// (`device` `host`, or `auto` without one) reads them in place; a CUDA one takes
    /// them from a GPU it cannot map (see `peer_gpus`) and copies them onto its own, as
    /// it does with the blocks of a publisher of this host without a GPU.
    /// False: bytes through Zenoh, as from another host.
    pub host_blocks: bool,
    /// The most a subscriber's waiting thread busy-polls before it sleeps, in µs
    /// (default 500; 0: never). Its link threads poll their control sockets, and
    /// `recv`/`recv_timeout` of a FIFO subscriber or a ROS 2 subscription its queue, so
    /// that a message arriving meanwhile does not wait for a sleeping thread to wake
    /// (tens of µs on a virtual machine). Each thread polls only while its waits have been ending within
    /// `spin_us`, and about as long as they last: a stream slower than one message per
    /// `spin_us` is not polled for at all, a faster one or a request/reply loop keeps a
    /// core busy while it waits. `polled_us` in the subscriber's stats shows the cost.
    pub spin_us: u64,
    /// With the `zenoh-shm` feature: the size of a Zenoh shared-memory pool (POSIX,
    /// registered with CUDA) that this session's publishers copy out into, so that Zenoh
    /// peers of this host with shared memory on (plain Zenoh subscribers, our subscribers
    /// that take bytes) receive those copies by reference instead of through a socket.
    /// 0 (default): off. A message that does not fit takes the usual staging copy (and
    /// the socket): size the pool for what subscribers hold plus three of the largest
    /// message: a publisher's bytes lane has up to two copies out in flight, and a
    /// buffer Zenoh has sent may not be reclaimed yet. A ROS 2
    /// publisher writes the CDR messages it puts for ordinary ROS subscribers there too.
    /// Opening a session with a non-zero size fails in a build without the feature.
    pub zenoh_shm_out_bytes: u64,
    /// The host this session says it runs on, in its locality group (default: the
    /// kernel's boot id). Our publishers and subscribers attempt the same-host paths
    /// (blocks, host blocks, the host provider) only with peers of the same host id.
    /// Every container and network namespace of one kernel shares its boot id; give
    /// processes that must act as separate hosts (network namespaces standing in for
    /// hosts, a container that cannot reach its neighbours' control sockets) an id of
    /// their own, and they exchange bytes through Zenoh as hosts do.
    pub host_id: Option<HostId>,
}

/// A host identity (`host_id`): 1 to 64 ASCII letters, digits and `-`, compared
/// exactly. It is a chunk of our key expressions, so nothing else is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostId(String);

impl HostId {
    /// What a valid id looks like, for error messages.
    pub const EXPECTED: &'static str = "expected 1 to 64 ASCII letters, digits or '-'";

    /// The id, if `id` is valid.
    ///
    /// # Errors
    /// A message naming `id` and what a valid one looks like ([`HostId::EXPECTED`]) when
    /// it is empty, longer than 64 bytes, or holds anything but ASCII letters, digits
    /// and `-`.
    pub fn new(id: impl Into<String>) -> Result<Self, String> {
        let id = id.into();
        let ok = (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if ok { Ok(Self(id)) } else { Err(format!("host id {id:?}: {}", Self::EXPECTED)) }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for HostId {
    type Error = String;
    fn try_from(id: String) -> Result<Self, String> {
        Self::new(id)
    }
}

impl From<HostId> for String {
    fn from(id: HostId) -> String {
        id.0
    }
}

impl Default for ZcsConfig {
    fn default() -> Self {
        Self {
            device: DeviceChoice::Auto,
            gpu_ordinal: 0,
            inline_threshold: 64 * 1024,
            pool: PoolConfig::default(),
            handshake_timeout_ms: 2000,
            socket_dir: None,
            allowed_uids: Vec::new(),
            plain_listen: PlainListen::Auto,
            congestion: Congestion::Block,
            lease_wait_ms: 1000,
            provider: ProviderMode::Auto,
            provider_discovery_ms: 300,
            peer_gpus: PeerGpus::InPlace,
            host_blocks: true,
            spin_us: 500,
            zenoh_shm_out_bytes: 0,
            host_id: None,
        }
    }
}

/// A configuration could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid JSON5, names an unknown field or has a value of the wrong
    /// kind. The text says where: file (when read from one), line (where known) and
    /// the full key, e.g. `config.json5 line 7: pool.max_blocks: invalid value: …`.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// An environment override has a bad value.
    #[error("environment variable {var}={value:?}: {why}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
}

impl ZcsConfig {
    /// Parses JSON5 text.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] when the text is not JSON5, names an unknown field or has a
    /// value of the wrong kind (the message gives the line and the key).
    pub fn from_json5(text: &str) -> Result<Self, ConfigError> {
        Self::parse(text, None)
    }

    /// Reads a JSON5 file.
    ///
    /// # Errors
    /// [`ConfigError::Io`] when the file cannot be read; [`ConfigError::Parse`] as for
    /// [`ZcsConfig::from_json5`], the file named in the message.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Self, ConfigError> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io { path: path.clone(), source })?;
        Self::parse(&text, Some(&path))
    }

    fn parse(text: &str, file: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        let place = |line: Option<usize>| {
            let file = file.map(|f| f.display().to_string());
            match (file, line) {
                (Some(f), Some(l)) => format!("{f} line {l}: "),
                (Some(f), None) => format!("{f}: "),
                (None, Some(l)) => format!("line {l}: "),
                (None, None) => String::new(),
            }
        };
        // Through a JSON value: the json5 crate wraps negative numbers into unsigned
        // fields, serde_json's value checks every integer's range.
        let value: serde_json::Value = json5::from_str(text).map_err(|e| {
            let json5::Error::Message { msg, location } = e;
            ConfigError::Parse(format!("{}{msg}", place(location.map(|l| l.line))))
        })?;
        serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner().to_string();
            // The line of the key, or of the unknown field the message names.
            let name = inner.split('`').nth(1).filter(|_| inner.starts_with("unknown field"));
            let name = name.or_else(|| key.rsplit('.').next()).unwrap_or("");
            let key = if key == "." { String::new() } else { format!("{key}: ") };
            ConfigError::Parse(format!("{}{key}{inner}", place(line_of(text, name))))
        })
    }

    /// Applies environment overrides: `ZCS_DEVICE` (`auto|host|cuda`),
    /// `ZCS_INLINE_THRESHOLD` (bytes), `ZCS_PROVIDER` (`auto|off|required`),
    /// `ZCS_PEER_GPUS` (`in_place|copy|host|off`), `ZCS_HOST_BLOCKS` (`true|false`),
    /// `ZCS_SOCKET_DIR` (path), `ZCS_HOST_ID` (see `host_id`).
    ///
    /// # Errors
    /// [`ConfigError::Env`] naming the first variable with a value it does not take.
    pub fn with_env_overrides(mut self) -> Result<Self, ConfigError> {
        if let Ok(v) = std::env::var("ZCS_DEVICE") {
            self.device = match v.as_str() {
                "auto" => DeviceChoice::Auto,
                "host" => DeviceChoice::Host,
                "cuda" => DeviceChoice::Cuda,
                _ => return Err(ConfigError::Env { var: "ZCS_DEVICE", value: v, why: "expected auto, host or cuda" }),
            };
        }
        if let Ok(v) = std::env::var("ZCS_INLINE_THRESHOLD") {
            self.inline_threshold = v.parse().map_err(|_| ConfigError::Env {
                var: "ZCS_INLINE_THRESHOLD",
                value: v.clone(),
                why: "expected a byte count",
            })?;
        }
        if let Ok(v) = std::env::var("ZCS_PROVIDER") {
            self.provider = match v.as_str() {
                "auto" => ProviderMode::Auto,
                "off" => ProviderMode::Off,
                "required" => ProviderMode::Required,
                _ => {
                    return Err(ConfigError::Env {
                        var: "ZCS_PROVIDER",
                        value: v,
                        why: "expected auto, off or required",
                    });
                }
            };
        }
        if let Ok(v) = std::env::var("ZCS_PEER_GPUS") {
            self.peer_gpus = match v.as_str() {
                "in_place" => PeerGpus::InPlace,
                "copy" => PeerGpus::Copy,
                "host" => PeerGpus::Host,
                "off" => PeerGpus::Off,
                _ => {
                    return Err(ConfigError::Env {
                        var: "ZCS_PEER_GPUS",
                        value: v,
                        why: "expected in_place, copy, host or off",
                    });
                }
            };
        }
        if let Ok(v) = std::env::var("ZCS_HOST_BLOCKS") {
            self.host_blocks = match v.as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(ConfigError::Env { var: "ZCS_HOST_BLOCKS", value: v, why: "expected true or false" }),
            };
        }
        if let Ok(v) = std::env::var("ZCS_SOCKET_DIR") {
            self.socket_dir = Some(v.into());
        }
        if let Ok(v) = std::env::var("ZCS_HOST_ID") {
            self.host_id = Some(HostId::new(v.clone()).map_err(|_| ConfigError::Env {
                var: "ZCS_HOST_ID",
                value: v,
                why: HostId::EXPECTED,
            })?);
        }
        Ok(self)
    }
}

/// The line (from 1) where `name` appears as a key, if it does exactly once.
fn line_of(text: &str, name: &str) -> Option<usize> {
    if name.is_empty() {
        return None;
    }
    let mut found = None;
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices(name) {
            let before = code[..at].chars().next_back();
            let after = code[at + name.len()..].trim_start_matches(['"', '\'', ' ']);
            let starts = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            if starts && after.starts_with(':') {
                if found.is_some() {
                    return None;
                }
                found = Some(i + 1);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_partial_files() {
        let c = ZcsConfig::from_json5("{}").unwrap();
        assert_eq!(c, ZcsConfig::default());
        let c = ZcsConfig::from_json5("{ device: 'host', plain_listen: 'never', pool: { max_blocks: 3 } }").unwrap();
        assert_eq!((c.device, c.plain_listen, c.pool.max_blocks), (DeviceChoice::Host, PlainListen::Never, 3));
        assert!(c.host_blocks);
        assert!(!ZcsConfig::from_json5("{ host_blocks: false }").unwrap().host_blocks);
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused() {
        for bad in [
            "{ devise: 'host' }",
            "{ device: 'tpu' }",
            "{ provider: 'maybe' }",
            "{ pool: { max_bites: 1 } }",
            "{ inline_threshold: -1 }",
            "{ host_blocks: 'no' }",
            "[1]",
        ] {
            assert!(ZcsConfig::from_json5(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_name_the_file_line_and_full_key() {
        let text = "{\n  device: 'host',\n  pool: {\n    max_blocks: -5,\n  },\n}\n";
        let err = ZcsConfig::from_json5(text).unwrap_err().to_string();
        assert!(err.contains("line 4: pool.max_blocks: invalid value: integer `-5`, expected usize"), "{err}");
        let err = ZcsConfig::from_json5("{\n  pool: { max_bites: 1 },\n}").unwrap_err().to_string();
        assert!(err.contains("line 2: pool.max_bites: unknown field `max_bites`"), "{err}");
        let err = ZcsConfig::from_json5("{\n  device: 'host'\n  spin_us: 1,\n}").unwrap_err().to_string();
        assert!(err.starts_with("invalid configuration: line 2:"), "{err}");
        let dir = std::env::temp_dir().join(format!("zcs-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.json5");
        std::fs::write(&file, "{ spin_us: 'fast' }").unwrap();
        let err = ZcsConfig::from_file(&file).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains(&format!("{} line 1: spin_us: invalid type", file.display())), "{err}");
    }

    #[test]
    fn host_ids_are_checked_where_they_are_read() {
        let c = ZcsConfig::from_json5("{ host_id: 'remote-1' }").unwrap();
        assert_eq!(c.host_id.as_ref().map(HostId::as_str), Some("remote-1"));
        assert_eq!(ZcsConfig::from_json5("{}").unwrap().host_id, None);
        // A key-expression separator, a wildcard, an empty or an over-long id.
        let long = "a".repeat(65);
        for bad in ["a/b", "*", "", long.as_str(), "héte"] {
            let err = ZcsConfig::from_json5(&format!("{{\n  host_id: {bad:?},\n}}")).unwrap_err().to_string();
            assert!(err.contains("line 2: host_id:") && err.contains(HostId::EXPECTED), "{bad}: {err}");
        }
        assert_eq!(HostId::new("a".repeat(64)).map(String::from), Ok("a".repeat(64)));
    }

    #[test]
    fn shipped_sample_parses() {
        let text = include_str!("../../examples/config.json5");
        ZcsConfig::from_json5(text).unwrap();
    }
}
