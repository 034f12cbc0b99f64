//! zenohd plugin for zenoh-cuda-shm.
//!
//! Loaded into a Zenoh router (`zenohd -P cuda_shm`, or linked statically by
//! `zenoh-bridge-cuda-shm`), it watches the liveliness tokens every zenoh-cuda-shm
//! publisher and GPU-aware subscriber declares, keeps a [`registry::Registry`] of them,
//! and serves it as JSON in the router's admin space (see [`admin`]), where the REST
//! plugin makes it reachable over HTTP:
//!
//! ```text
//! curl 'http://127.0.0.1:8000/@/*/router/status/plugins/cuda_shm/**'
//! ```
//!
//! Its configuration is the `plugins/cuda_shm` section ([`config::PluginConfig`]).
//! zenohd loads the plugin only if it was built by the same rustc, against the same
//! zenoh version, with the same `zenoh::FEATURES` (`docs/plugin.md`); the feature
//! string this crate is built with is [`EXPECTED_ZENOH_FEATURES`].
//!
//! The plugin's work runs in Zenoh's callbacks (a token appearing or vanishing) and in
//! admin-space queries, each a map update or a snapshot under one mutex: nothing blocks
//! the router's threads.
//!
//! ```
//! use zenoh::internal::plugins::ZenohPlugin;
//! use zenoh_plugin_cuda_shm::CudaShmPlugin;
//! use zenoh_plugin_trait::Plugin;
//!
//! fn name<P: ZenohPlugin>() -> &'static str {
//!     P::DEFAULT_NAME
//! }
//! assert_eq!(name::<CudaShmPlugin>(), "cuda_shm");
//! ```

pub mod admin;
pub mod config;
pub mod registry;
pub mod silence;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use zcs_wire::protocol::TOKEN_ROOT;
use zenoh::Wait;
use zenoh::internal::plugins::{Response, RunningPlugin, RunningPluginTrait, ZenohPlugin};
use zenoh::internal::runtime::DynamicRuntime;
use zenoh::key_expr::KeyExpr;
use zenoh::sample::{Sample, SampleKind};
use zenoh_cuda_shm::provider::Provider;
use zenoh_plugin_trait::{Plugin, PluginControl, PluginReport};
use zenoh_util::ffi::JsonKeyValueMap;

use crate::config::PluginConfig;
use crate::registry::{Outcome, Registry};
use crate::silence::{SILENCE_TOKENS, SilenceList};

/// `zenoh::FEATURES` of the zenoh this crate must be built with, which is the one
/// `scripts/zenohd.sh` builds zenohd with: the workspace's transports, and `unstable`,
/// which plugins need (`plugins`, `internal` and `runtime_plugins` are not listed).
pub const EXPECTED_ZENOH_FEATURES: &str = " zenoh/transport_tcp zenoh/transport_unixsock-stream zenoh/unstable";

/// The plugin type zenohd loads (`load_plugin`, with the `dynamic_plugin` feature) or a
/// bridge declares statically.
#[derive(Debug)]
pub struct CudaShmPlugin;

#[cfg(feature = "dynamic_plugin")]
zenoh_plugin_trait::declare_plugin!(CudaShmPlugin);

impl ZenohPlugin for CudaShmPlugin {}

impl Plugin for CudaShmPlugin {
    type StartArgs = DynamicRuntime;
    type Instance = RunningPlugin;
    const DEFAULT_NAME: &'static str = "cuda_shm";
    const PLUGIN_VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const PLUGIN_LONG_VERSION: &'static str = concat!("v", env!("CARGO_PKG_VERSION"));

    fn start(name: &str, runtime: &Self::StartArgs) -> zenoh::Result<RunningPlugin> {
        // Loaded dynamically, the plugin has its own copy of `tracing`: set it up from
        // RUST_LOG (a no-op when linked into a binary that already did).
        zenoh::try_init_log_from_env();
        let section = match runtime.get_config().get_plugin_config(name) {
            Ok(v) if !v.is_null() => v,
            // A bridge may declare the plugin without a section: defaults.
            _ => serde_json::Value::Object(Default::default()),
        };
        let started = PluginConfig::from_value(&section)
            .map_err(|e| format!("plugins/{name}: {e}"))
            .and_then(|config| Running::start(name, runtime, config).map_err(|e| format!("plugin {name}: {e}")));
        match started {
            Ok(running) => Ok(Box::new(running)),
            Err(why) if stops_the_router(&section, runtime) => exit_router(name, &why),
            Err(why) => Err(why.into()),
        }
    }
}

/// Whether zenoh would panic on this failed start: the plugin is required
/// (`__required__: true`, which `zenohd -P` sets) and the router is being built. zenoh
/// 1.10.2 starts plugins while it builds the router (`start_plugins` in its
/// `api/loader.rs`), before it opens any listener, and panics on the thread building it
/// when a required one fails: zenohd exits with 101 and a backtrace. A start requested
/// later, through the admin space, only returns its error, and the router runs on.
fn stops_the_router(section: &serde_json::Value, runtime: &DynamicRuntime) -> bool {
    section.get("__required__") == Some(&serde_json::Value::Bool(true)) && runtime.get_locators().is_empty()
}

/// Ends the router that a required plugin failed to start in: what zenoh would do, but
/// with the reason alone and status 1 instead of a panic. Printed on stderr, as the
/// plugin's own logging may not be set up (it is only with `RUST_LOG`).
fn exit_router(name: &str, why: &str) -> ! {
    tracing::error!(plugin = name, "failed to start: {why}");
    eprintln!("Plugin \"{name}\" failed to start: {why}");
    eprintln!("zenohd stops: the plugin is required (__required__, which -P sets); status 1");
    std::process::exit(1)
}

/// State shared with Zenoh's callbacks.
struct Shared {
    registry: Registry,
    silences: SilenceList,
    config: PluginConfig,
}

/// The running plugin: its session on the router's runtime and two liveliness
/// subscribers feeding the registry. Dropping it undeclares them, then closes the
/// session (which leaves the router's runtime running).
struct Running {
    name: String,
    shared: Arc<Mutex<Shared>>,
    /// Publisher, subscriber and silence tokens; emptied by `Drop`.
    token_subscribers: Vec<zenoh::pubsub::Subscriber<()>>,
    /// The host provider (`provider.enabled`); dropped before the session closes.
    provider: Option<Provider>,
    session: zenoh::Session,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // The critical sections cannot leave the registry half-updated, so a poisoned lock
    // (a panic elsewhere while it was held) still guards consistent data.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

fn on_token(shared: &Mutex<Shared>, sample: &Sample) {
    let key = sample.key_expr().as_str();
    let mut s = lock(shared);
    match sample.kind() {
        SampleKind::Put => match s.registry.token_appeared(key, SystemTime::now()) {
            Outcome::Added | Outcome::Known => {}
            Outcome::Malformed => tracing::debug!(token = key, "malformed zenoh-cuda-shm token ignored"),
            Outcome::OverCapacity => tracing::debug!(token = key, "registry full: token not listed"),
            Outcome::Conflict => tracing::debug!(token = key, "instance id already listed: token not listed"),
        },
        SampleKind::Delete => {
            s.registry.token_vanished(key);
        }
    }
}

/// A silence token of a ROS 2 subscription (`silence` module).
fn on_silence(shared: &Mutex<Shared>, sample: &Sample) {
    let key = sample.key_expr().as_str();
    let mut s = lock(shared);
    match sample.kind() {
        SampleKind::Put => {
            if !s.silences.appeared(key, SystemTime::now()) {
                tracing::debug!(token = key, "silence token not listed (malformed, or the list is full)");
            }
        }
        SampleKind::Delete => {
            s.silences.vanished(key);
        }
    }
}

impl Running {
    fn start(name: &str, runtime: &DynamicRuntime, config: PluginConfig) -> zenoh::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared {
            registry: Registry::new(config.max_entries),
            silences: SilenceList::new(config.max_entries),
            config,
        }));
        let session = zenoh::session::init(runtime.clone()).wait()?;
        let declare = |role: &str| {
            let shared = shared.clone();
            session
                .liveliness()
                .declare_subscriber(format!("{TOKEN_ROOT}/{role}/**"))
                .history(true)
                .callback(move |sample| on_token(&shared, &sample))
                .wait()
        };
        let silences = {
            let shared = shared.clone();
            session
                .liveliness()
                .declare_subscriber(SILENCE_TOKENS)
                .history(true)
                .callback(move |sample| on_silence(&shared, &sample))
                .wait()?
        };
        let token_subscribers = vec![declare("pub")?, declare("sub")?, silences];
        let section = lock(&shared).config.provider.clone();
        let provider = match section.enabled {
            true => {
                let p = Provider::start(&section.to_provider_config(), &session)
                    .map_err(|e| format!("provider: {}", zenoh_cuda_shm::error::chain(&e)))?;
                tracing::info!(plugin = name, devices = ?p.devices(), "zenoh-cuda-shm host provider started");
                Some(p)
            }
            false => None,
        };
        tracing::info!(plugin = name, zid = %session.zid(), "zenoh-cuda-shm registry started");
        Ok(Self { name: name.to_owned(), shared, token_subscribers, provider, session })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        tracing::info!(plugin = %self.name, "zenoh-cuda-shm registry stopping");
        drop(self.provider.take());
        for subscriber in self.token_subscribers.drain(..) {
            if let Err(e) = subscriber.undeclare().wait() {
                tracing::warn!(plugin = %self.name, error = %e, "undeclaring a token subscriber failed");
            }
        }
        if let Err(e) = self.session.close().wait() {
            tracing::warn!(plugin = %self.name, error = %e, "closing the plugin's session failed");
        }
    }
}

impl PluginControl for Running {
    fn report(&self) -> PluginReport {
        let stats = lock(&self.shared).registry.stats();
        let mut report = PluginReport::new();
        if stats.malformed > 0 {
            report.add_warning(format!("{} malformed zenoh-cuda-shm tokens ignored", stats.malformed));
        }
        if stats.over_capacity > 0 {
            report.add_warning(format!("{} tokens not listed: registry full (max_entries)", stats.over_capacity));
        }
        if stats.conflicting > 0 {
            report.add_warning(format!("{} tokens not listed: instance id already listed", stats.conflicting));
        }
        report
    }
}

impl RunningPluginTrait for Running {
    fn config_checker(
        &self,
        _path: &str,
        _current: &JsonKeyValueMap,
        new: &JsonKeyValueMap,
    ) -> zenoh::Result<Option<JsonKeyValueMap>> {
        let new = serde_json::Value::Object(new.into());
        let mut s = lock(&self.shared);
        let accepted = s.config.live_change(&new).map_err(|e| format!("plugins/{}: {e}", self.name))?;
        if accepted.max_entries != s.config.max_entries {
            tracing::info!(plugin = %self.name, max_entries = accepted.max_entries, "registry cap changed");
            s.registry.set_max_entries(accepted.max_entries);
            s.silences.set_max_entries(accepted.max_entries);
        }
        s.config = accepted;
        Ok(None)
    }

    fn adminspace_getter<'a>(
        &'a self,
        key_expr: &'a KeyExpr<'a>,
        plugin_status_key: &str,
    ) -> zenoh::Result<Vec<Response>> {
        let provider = self.provider.as_ref().map(Provider::snapshot);
        let entries = {
            let s = lock(&self.shared);
            let mut e = admin::entries(&s.registry.snapshot(), &s.config, provider.as_ref());
            e.extend(s.silences.admin_entries());
            e
        };
        Ok(admin::answer(key_expr, plugin_status_key, entries)
            .into_iter()
            .map(|(key, value)| Response::new(key, value))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::json;
    use zcs_wire::protocol::{Group, Role, Token};
    use zenoh::internal::runtime::RuntimeBuilder;

    use super::*;

    /// The plugin's `zenoh::FEATURES` is the string scripts/zenohd.sh builds zenohd
    /// with; any other and zenohd refuses to load it ("Incompatible Zenoh feature sets").
    /// This holds whether the crate is built alone or with the whole workspace.
    #[test]
    fn zenoh_features() {
        assert_eq!(zenoh::FEATURES, EXPECTED_ZENOH_FEATURES);
        assert_eq!(admin::version_info().zenoh, "v1.10.2-release");
    }

    const STATUS: &str = "@/0a/router/status/plugins/cuda_shm";

    fn admin(running: &RunningPlugin) -> Vec<(String, serde_json::Value)> {
        let query = KeyExpr::try_from(format!("{STATUS}/**")).unwrap();
        running
            .adminspace_getter(&query, STATUS)
            .unwrap()
            .into_iter()
            .map(|r| (r.key.strip_prefix(STATUS).unwrap().to_owned(), r.value.into_serde_value()))
            .collect()
    }

    fn wait_until(what: &str, running: &RunningPlugin, pred: impl Fn(&[(String, serde_json::Value)]) -> bool) {
        let t = Instant::now();
        while !pred(&admin(running)) {
            assert!(t.elapsed() < Duration::from_secs(10), "no {what}: {:#?}", admin(running));
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn map(v: serde_json::Value) -> JsonKeyValueMap {
        match v {
            serde_json::Value::Object(m) => m.into(),
            other => panic!("not a map: {other}"),
        }
    }

    /// A router runtime of this process (no network) with `section` as
    /// `plugins/cuda_shm`, and the tokio runtime it runs on.
    fn router_runtime(section: &str) -> (tokio::runtime::Runtime, DynamicRuntime) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut config = zenoh::Config::default();
        for (k, v) in [
            ("mode", "\"router\""),
            ("listen/endpoints", "[]"),
            ("scouting/multicast/enabled", "false"),
            ("plugins/cuda_shm", section),
        ] {
            config.insert_json5(k, v).unwrap();
        }
        let runtime: DynamicRuntime = rt.block_on(RuntimeBuilder::new(config).build()).unwrap().into();
        (rt, runtime)
    }

    /// The glue, in a router runtime of this process (no network): the plugin starts
    /// from its section, lists a token another session on the router declares, counts a
    /// malformed one, applies or refuses live changes, and stops cleanly.
    #[test]
    fn plugin_follows_the_tokens_of_its_router() {
        let (_rt, runtime) = router_runtime("{ max_entries: 8 }");
        let running = CudaShmPlugin::start("cuda_shm", &runtime).unwrap();
        let session = zenoh::session::init(runtime.clone()).wait().unwrap();

        let token = Token {
            role: Role::Sub,
            key: "camera/front".into(),
            instance: 0x5eed,
            group: Group { boot_id: "b007".into(), device: "host".into() },
            socket: None,
        };
        let live = session.liveliness().declare_token(token.to_key()).wait().unwrap();
        let bad = session.liveliness().declare_token("@zcs/v1/pub/not-hex/1/b/host").wait().unwrap();
        wait_until("token listed", &running, |a| a.iter().any(|(k, _)| k == "/topics/camera/front"));
        wait_until("malformed token counted", &running, |a| {
            a.iter().any(|(k, v)| k == "/stats" && v["tokens"]["malformed"] == 1)
        });
        let entries = admin(&running);
        let topic = &entries.iter().find(|(k, _)| k == "/topics/camera/front").unwrap().1;
        assert_eq!(topic["subscribers"][0]["instance"], "0000000000005eed", "{topic}");
        let report = serde_json::to_value(running.report()).unwrap();
        assert_eq!(report["level"], "Warning", "{report}");
        assert_eq!(report["messages"][0], "1 malformed zenoh-cuda-shm tokens ignored", "{report}");

        // Live changes: max_entries yes, __path__ no; a bad value is refused by key.
        let current = map(json!({ "max_entries": 8 }));
        assert!(running.config_checker("max_entries", &current, &map(json!({ "max_entries": 2 }))).unwrap().is_none());
        wait_until("new cap", &running, |a| a.iter().any(|(k, v)| k == "/stats" && v["max_entries"] == 2));
        let err = running.config_checker("__path__", &current, &map(json!({ "__path__": "/x.so" }))).unwrap_err();
        assert!(err.to_string().contains("plugins/cuda_shm: __path__ cannot be changed"), "{err}");
        let err = running.config_checker("max_entries", &current, &map(json!({ "max_entries": -3 }))).unwrap_err();
        assert!(
            err.to_string()
                .contains("plugins/cuda_shm: max_entries: expected a whole number from 1 to 1048576, found -3"),
            "{err}"
        );

        drop(live);
        wait_until("token gone", &running, |a| !a.iter().any(|(k, _)| k.starts_with("/topics/")));
        drop(bad);

        // A ROS 2 subscription's silence token is listed while it stands.
        let (sub, publisher) = ("0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210");
        let silence = format!("@zcs/ros2/v1/0/silent/{sub}/{publisher}/qos,unheard-key");
        let silent = session.liveliness().declare_token(silence).wait().unwrap();
        let entry = format!("/ros2/silent/{sub}/{publisher}");
        wait_until("silence listed", &running, |a| a.iter().any(|(k, _)| *k == entry));
        let entries = admin(&running);
        let ros2 = &entries.iter().find(|(k, _)| k == "/ros2").unwrap().1;
        assert_eq!((ros2["silent_publishers"].as_u64(), ros2["silences_reported"].as_u64()), (Some(1), Some(1)));
        drop(silent);
        wait_until("silence gone", &running, |a| !a.iter().any(|(k, _)| k.starts_with("/ros2/silent/")));
        // Stopping undeclares the subscribers and closes the plugin's session only.
        drop(running);
        assert!(!session.is_closed());
        session.close().wait().unwrap();
    }

    /// Only a required plugin ends the router, and only while zenoh builds it (no
    /// listener yet): a failed start otherwise returns its error.
    #[test]
    fn only_a_required_plugin_stops_a_router_being_built() {
        let (_rt, runtime) = router_runtime("{}");
        assert!(runtime.get_locators().is_empty(), "built, not started: no listener");
        assert!(stops_the_router(&json!({ "__required__": true }), &runtime));
        assert!(!stops_the_router(&json!({ "__required__": false }), &runtime));
        assert!(!stops_the_router(&json!({ "__required__": "true" }), &runtime));
        assert!(!stops_the_router(&json!({}), &runtime));
    }

    #[test]
    fn a_bad_section_fails_the_start_by_key() {
        let (_rt, runtime) = router_runtime("{ max_entries: 8, colour: \"blue\" }");
        let err = CudaShmPlugin::start("cuda_shm", &runtime).err().expect("a bad section must fail the start");
        assert!(err.to_string().starts_with("plugins/cuda_shm: unknown field `colour`"), "{err}");
    }
}
