//! `zenoh-bridge-cuda-shm`: a Zenoh router with zenoh-cuda-shm's plugin and zenoh's REST
//! plugin linked in statically.
//!
//! For users whose zenohd was built differently (another rustc, zenoh version or
//! feature set), which refuses to load `libzenoh_plugin_cuda_shm.so`: this binary is a
//! router in its own right, so no plugin ABI has to match. It takes zenohd's main flags:
//!
//! ```text
//! zenoh-bridge-cuda-shm -l tcp/0.0.0.0:7447 --rest-http-port 8000
//! curl 'http://127.0.0.1:8000/@/*/router/status/plugins/cuda_shm/**'
//! ```
//!
//! The configuration file's `plugins/cuda_shm` section configures the plugin (defaults
//! without one) and `plugins/rest` the REST plugin, which runs only if that section exists
//! or `--rest-http-port` is given. Sections of other plugins are ignored, with a warning.

use std::process::ExitCode;

use clap::Parser;
use zenoh::config::WhatAmI;
use zenoh::internal::plugins::PluginsManager;
use zenoh::internal::runtime::RuntimeBuilder;
use zenoh::{Config, Wait};
use zenoh_plugin_cuda_shm::CudaShmPlugin;
use zenoh_plugin_cuda_shm::config::PluginConfig;
use zenoh_plugin_rest::RestPlugin;

/// The plugins this binary links, by the name of their configuration section.
const LINKED: [&str; 2] = ["cuda_shm", "rest"];

#[derive(Parser, Debug)]
#[command(version, about = "Zenoh router with the zenoh-cuda-shm and REST plugins linked in")]
struct Args {
    /// A Zenoh configuration file (JSON5 or YAML). Its `plugins/cuda_shm` section
    /// configures the plugin.
    #[arg(short, long, value_name = "PATH")]
    config: Option<String>,
    /// An endpoint to listen on, e.g. tcp/0.0.0.0:7447 (repeat for several).
    #[arg(short, long, value_name = "ENDPOINT")]
    listen: Vec<String>,
    /// An endpoint to connect to (repeat for several).
    #[arg(short = 'e', long, value_name = "ENDPOINT")]
    connect: Vec<String>,
    /// Serve zenoh's REST API on this port, or on IP:PORT.
    #[arg(long, value_name = "SOCKET")]
    rest_http_port: Option<String>,
    /// Neither answer nor send multicast scouting messages.
    #[arg(long)]
    no_multicast_scouting: bool,
}

fn json_list(items: &[String]) -> String {
    serde_json::Value::from(items.to_vec()).to_string()
}

/// The router's configuration: the file (or defaults), then the flags on top.
fn config_from(args: &Args) -> zenoh::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path).map_err(|e| format!("{path}: {e}"))?,
        None => Config::default(),
    };
    if config.mode().is_none() {
        config.set_mode(Some(WhatAmI::Router)).map_err(|_| "cannot set the mode to router")?;
    }
    if !args.listen.is_empty() {
        config.insert_json5("listen/endpoints", &json_list(&args.listen))?;
    }
    if !args.connect.is_empty() {
        config.insert_json5("connect/endpoints", &json_list(&args.connect))?;
    }
    if args.no_multicast_scouting {
        config.insert_json5("scouting/multicast/enabled", "false")?;
    }
    if let Some(port) = &args.rest_http_port {
        config.insert_json5("plugins/rest/http_port", &serde_json::Value::from(port.as_str()).to_string())?;
    }
    // The plugin answers in the admin space.
    config.insert_json5("adminspace/enabled", "true")?;
    Ok(config)
}

/// The names of the plugin sections in `config`.
fn plugin_sections(config: &Config) -> Vec<String> {
    config
        .get_json("plugins")
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&s).ok())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn run(args: &Args) -> zenoh::Result<()> {
    let config = config_from(args)?;
    let sections = plugin_sections(&config);
    for other in sections.iter().filter(|s| !LINKED.contains(&s.as_str())) {
        eprintln!("zenoh-bridge-cuda-shm: warning: plugins/{other} ignored: only {LINKED:?} are linked in");
    }
    // A bad section is refused here, with the plugin's own message, rather than by a
    // failed start (which zenoh reports only in the log).
    let section = config.get_json("plugins/cuda_shm").ok().and_then(|s| serde_json::from_str(&s).ok());
    if let Some(section) = section.filter(|v: &serde_json::Value| !v.is_null()) {
        PluginConfig::from_value(&section).map_err(|e| format!("plugins/cuda_shm: {e}"))?;
    }
    let rest = sections.iter().any(|s| s == "rest");
    // Declared as not required: zenoh panics when a required plugin fails to start; this
    // checks below that both started and fails with an error instead.
    let mut plugins = PluginsManager::static_plugins_only();
    plugins.declare_static_plugin::<CudaShmPlugin, _>("cuda_shm", false);
    if rest {
        plugins.declare_static_plugin::<RestPlugin, _>("rest", false);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bridge")
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(async {
        // Builds the router and starts the plugins, then opens its listeners.
        let mut runtime = RuntimeBuilder::new(config).plugins_manager(plugins).build().await?;
        for (id, wanted) in [("cuda_shm", true), ("rest", rest)] {
            if wanted && runtime.plugins_manager().started_plugin(id).is_none() {
                return Err(format!("the {id} plugin did not start (its error is logged above)").into());
            }
        }
        let _session = zenoh::session::init(runtime.clone().into()).wait()?;
        runtime.start().await?;
        tracing::info!(zid = %runtime.zid(), "zenoh-bridge-cuda-shm running");
        // Like zenohd: run until a signal ends the process.
        std::future::pending::<zenoh::Result<()>>().await
    })
}

fn main() -> ExitCode {
    zenoh::init_log_from_env_or("z=info");
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zenoh-bridge-cuda-shm: {e}");
            ExitCode::FAILURE
        }
    }
}
