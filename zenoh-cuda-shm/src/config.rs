//! Configuration: a JSON5 file (like Zenoh's), strict about unknown fields, with every
//! default documented. Environment variables only override what the file says.
//!
//! ```
//! # use zenoh_cuda_shm::config::ZcsConfig;
//! let cfg = ZcsConfig::from_json5(r#"{
//!     inline_threshold: 4096,
//!     pool: { max_bytes: 1073741824 },
//! }"#).unwrap();
//! assert_eq!(cfg.inline_threshold, 4096);
//! assert!(ZcsConfig::from_json5("{ inline_treshold: 1 }").is_err()); // typo: refused
//! ```

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
    /// Busy-polling by subscribers, in µs (default 0: none). Before sleeping, a
    /// subscriber's link thread polls its control socket, and `recv`/`recv_timeout` of
    /// a FIFO subscriber poll its queue, for up to this long: a message arriving
    /// meanwhile does not wait for a sleeping thread to wake. Costs a busy core for
    /// that long after each message; for latency-critical consumers with cores to spare.
    pub spin_us: u64,
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
            spin_us: 0,
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
    /// The text is not valid JSON5 or names unknown fields.
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
    pub fn from_json5(text: &str) -> Result<Self, ConfigError> {
        // Through a JSON value: the json5 crate wraps negative numbers into unsigned
        // fields, serde_json's value checks every integer's range.
        let value: serde_json::Value = json5::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        serde_json::from_value(value).map_err(|e| ConfigError::Parse(e.to_string()))
    }

    /// Reads a JSON5 file.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Self, ConfigError> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io { path: path.clone(), source })?;
        Self::from_json5(&text)
    }

    /// Applies environment overrides: `ZCS_DEVICE` (`auto|host|cuda`),
    /// `ZCS_INLINE_THRESHOLD` (bytes), `ZCS_SOCKET_DIR` (path).
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
        if let Ok(v) = std::env::var("ZCS_SOCKET_DIR") {
            self.socket_dir = Some(v.into());
        }
        Ok(self)
    }
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
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused() {
        for bad in [
            "{ devise: 'host' }",
            "{ device: 'tpu' }",
            "{ provider: 'maybe' }",
            "{ pool: { max_bites: 1 } }",
            "{ inline_threshold: -1 }",
            "[1]",
        ] {
            assert!(ZcsConfig::from_json5(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shipped_sample_parses() {
        let text = include_str!("../../examples/config.json5");
        ZcsConfig::from_json5(text).unwrap();
    }
}
