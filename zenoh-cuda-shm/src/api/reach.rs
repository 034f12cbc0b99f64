//! Whether a session's connect endpoints reached a router or a peer, and the warning
//! when they did not.

use std::time::{Duration, Instant};

use super::*;

/// Whether `config` names endpoints to connect to, as one list or per mode.
pub(super) fn names_connect_endpoints(config: &zenoh::Config) -> bool {
    fn any(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Array(a) => !a.is_empty(),
            serde_json::Value::Object(m) => m.values().any(any),
            _ => false,
        }
    }
    let json = config.get_json("connect/endpoints").unwrap_or_default();
    serde_json::from_str(&json).is_ok_and(|v| any(&v))
}

/// Whether `zenoh` is connected to a router or a peer.
fn linked(zenoh: &zenoh::Session) -> bool {
    use zenoh::Wait;
    let info = zenoh.info();
    info.routers_zid().wait().next().is_some() || info.peers_zid().wait().next().is_some()
}

/// Waits until `zenoh` has a router or a peer, or until `deadline`.
pub(super) fn wait_for_a_link(zenoh: &zenoh::Session, deadline: Instant) {
    while !linked(zenoh) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How long a session that names connect endpoints may reach no router or peer before
/// it says so.
const UNREACHED_WARNING_AFTER: Duration = Duration::from_secs(3);

/// Warns (once) if the session has reached no router or peer [`UNREACHED_WARNING_AFTER`]
/// after opening, although it names endpoints to connect to: in peer mode Zenoh keeps
/// retrying them without a word, and a publisher runs on with nobody to hear it.
pub(super) fn warn_if_unreached(session: std::sync::Weak<SessionInner>, endpoints: String) {
    let opened = Instant::now();
    let check = move || {
        loop {
            let Some(s) = session.upgrade() else { return };
            if linked(&s.zenoh) || s.zenoh.is_closed() {
                return;
            }
            if opened.elapsed() >= UNREACHED_WARNING_AFTER {
                return tracing::warn!(
                    endpoints = %endpoints,
                    "zenoh-cuda-shm: no Zenoh router or peer reached after {UNREACHED_WARNING_AFTER:?}; Zenoh keeps \
                     trying quietly. Is zenohd (or the other process) running and listening there?"
                );
            }
            drop(s);
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    if let Err(e) = std::thread::Builder::new().name("zcs-link-check".into()).spawn(check) {
        tracing::debug!(error = %crate::error::Chain(&e), "cannot start the check for unreached endpoints");
    }
}
