//! The ROS graph as seen from the liveliness tokens: every rmw_zenoh entity of the
//! domain (`@ros2_lv/<domain>/**`), and the markers of our own endpoints
//! (`@zcs/ros2/v1/<domain>/<pub|sub>/<gid>`): a subscription with a `sub` marker
//! receives through our channel and so needs no CDR copy on the base key; a publisher
//! with a `pub` marker numbers its messages one by one, whatever its token lists.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use zenoh::Wait;
use zenoh::sample::SampleKind;

use super::names::{ADMIN_SPACE, Entity, EntityKind, gid_hex, strip_slashes};
use crate::sync::Unpoisoned;

/// Prefix of our marker tokens.
pub const MARKER_PREFIX: &str = "@zcs/ros2/v1";

/// The marker token of one of our GPU-capable subscriptions: declared before its `MS`
/// token, so that publishers counting ordinary subscribers never count it.
pub fn marker_token(domain: u32, gid: &[u8; 16]) -> String {
    format!("{MARKER_PREFIX}/{domain}/sub/{}", gid_hex(gid))
}

/// The marker token of one of our publishers: declared before its `MP` token, so that
/// subscriptions never take it for a buffer-aware rmw_zenoh publisher.
pub fn publisher_marker_token(domain: u32, gid: &[u8; 16]) -> String {
    format!("{MARKER_PREFIX}/{domain}/pub/{}", gid_hex(gid))
}

#[derive(Default)]
struct State {
    entities: HashMap<String, (Entity, Instant)>,
    /// `sub/<gid hex>` and `pub/<gid hex>`.
    markers: HashSet<String>,
    malformed: u64,
    malformed_backends: u64,
}

/// Watches the graph tokens of one domain.
pub(crate) struct Graph {
    state: Arc<Mutex<State>>,
    _entities: zenoh::pubsub::Subscriber<()>,
    _markers: zenoh::pubsub::Subscriber<()>,
}

fn lock(s: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    s.locked()
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
                            if let Some(err) = e.topic.as_ref().and_then(|t| t.backends_error.as_ref()) {
                                s.malformed_backends += 1;
                                tracing::debug!(token = key, error = %err, "a graph token's backends chunk is refused; the endpoint counts as legacy");
                            }
                            s.entities.entry(key.to_owned()).or_insert((e, Instant::now()));
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
        let prefix = format!("{MARKER_PREFIX}/{domain}/");
        let markers = session
            .liveliness()
            .declare_subscriber(format!("{prefix}*/*"))
            .history(true)
            .callback(move |sample| {
                let Some(marker) = sample.key_expr().as_str().strip_prefix(&prefix) else { return };
                let mut s = lock(&st);
                match sample.kind() {
                    SampleKind::Put => s.markers.insert(marker.to_owned()),
                    SampleKind::Delete => s.markers.remove(marker),
                };
            })
            .wait()?;
        Ok(Self { state, _entities: entities, _markers: markers })
    }

    /// Subscriptions on `key` that are not GPU-capable subscriptions of ours.
    pub(crate) fn ordinary_subscriptions(&self, key: &str) -> usize {
        self.ordinary_subscribers(key).len()
    }

    /// The subscriptions on the data key `key` that are not ours.
    pub(crate) fn ordinary_subscribers(&self, key: &str) -> Vec<Entity> {
        let s = lock(&self.state);
        s.entities
            .values()
            .map(|(e, _)| e)
            .filter(|e| e.kind == EntityKind::Subscription)
            .filter(|e| e.topic.as_ref().is_some_and(|t| t.key == key))
            .filter(|e| !s.markers.contains(&format!("sub/{}", gid_hex(&e.gid))))
            .cloned()
            .collect()
    }

    /// Publishers of the topic `topic` (without its outer slashes), any type: each with
    /// when it was first seen and whether it is one of ours.
    pub(crate) fn publishers_of(&self, topic: &str) -> Vec<(Entity, Instant, bool)> {
        let s = lock(&self.state);
        s.entities
            .values()
            .filter(|(e, _)| e.kind == EntityKind::Publisher)
            .filter(|(e, _)| e.topic.as_ref().is_some_and(|t| strip_slashes(&t.name) == topic))
            .map(|(e, t)| (e.clone(), *t, s.markers.contains(&format!("pub/{}", gid_hex(&e.gid)))))
            .collect()
    }

    /// Every entity known, how many tokens were malformed, and how many had a backends
    /// chunk that was refused.
    pub(crate) fn snapshot(&self) -> (Vec<Entity>, u64, u64) {
        let s = lock(&self.state);
        (s.entities.values().map(|(e, _)| e.clone()).collect(), s.malformed, s.malformed_backends)
    }
}
