//! The ROS graph as seen from the liveliness tokens: every rmw_zenoh entity of the
//! domain (`@ros2_lv/<domain>/**`), and the GIDs of subscriptions that are ours and
//! GPU-capable (`@zcs/ros2/v1/<domain>/sub/<gid>`), which receive through our channel
//! and so do not need the CDR copy on the base key.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use zenoh::Wait;
use zenoh::sample::SampleKind;

use super::names::{ADMIN_SPACE, Entity, EntityKind, gid_hex};

/// Prefix of our marker tokens.
pub const MARKER_PREFIX: &str = "@zcs/ros2/v1";

/// The marker token of one of our GPU-capable subscriptions: declared before its `MS`
/// token, so that publishers counting ordinary subscribers never count it.
pub fn marker_token(domain: u32, gid: &[u8; 16]) -> String {
    format!("{MARKER_PREFIX}/{domain}/sub/{}", gid_hex(gid))
}

#[derive(Default)]
struct State {
    entities: HashMap<String, Entity>,
    markers: HashSet<String>,
    malformed: u64,
}

/// Watches the graph tokens of one domain.
pub(crate) struct Graph {
    state: Arc<Mutex<State>>,
    _entities: zenoh::pubsub::Subscriber<()>,
    _markers: zenoh::pubsub::Subscriber<()>,
}

fn lock(s: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl Graph {
    pub(crate) fn new(session: &zenoh::Session, domain: u32) -> zenoh::Result<Self> {
        let state = Arc::new(Mutex::new(State::default()));
        let st = Arc::clone(&state);
        let entities = session
            .liveliness()
            .declare_subscriber(format!("{ADMIN_SPACE}/{domain}/**"))
            .history(true)
            .callback(move |sample| {
                let key = sample.key_expr().as_str();
                let mut s = lock(&st);
                match sample.kind() {
                    SampleKind::Put => match Entity::parse(key) {
                        Some(e) => {
                            s.entities.insert(key.to_owned(), e);
                        }
                        None => {
                            s.malformed += 1;
                            tracing::debug!(token = key, "ignoring a malformed ROS graph token");
                        }
                    },
                    SampleKind::Delete => {
                        s.entities.remove(key);
                    }
                }
            })
            .wait()?;
        let st = Arc::clone(&state);
        let prefix = format!("{MARKER_PREFIX}/{domain}/sub/");
        let markers = session
            .liveliness()
            .declare_subscriber(format!("{prefix}*"))
            .history(true)
            .callback(move |sample| {
                let Some(gid) = sample.key_expr().as_str().strip_prefix(&prefix) else { return };
                let mut s = lock(&st);
                match sample.kind() {
                    SampleKind::Put => s.markers.insert(gid.to_owned()),
                    SampleKind::Delete => s.markers.remove(gid),
                };
            })
            .wait()?;
        Ok(Self { state, _entities: entities, _markers: markers })
    }

    /// Subscriptions on `key` that are not GPU-capable subscriptions of ours.
    pub(crate) fn ordinary_subscriptions(&self, key: &str) -> usize {
        let s = lock(&self.state);
        s.entities
            .values()
            .filter(|e| e.kind == EntityKind::Subscription)
            .filter(|e| e.topic.as_ref().is_some_and(|t| t.key == key))
            .filter(|e| !s.markers.contains(&gid_hex(&e.gid)))
            .count()
    }

    /// Every entity known, and how many tokens were malformed.
    pub(crate) fn snapshot(&self) -> (Vec<Entity>, u64) {
        let s = lock(&self.state);
        (s.entities.values().cloned().collect(), s.malformed)
    }
}
