//! Where one message of a publisher on the buffer-aware wire goes, subscription by
//! subscription, when its data is in one of our device blocks.
//!
//! rmw_zenoh 0.12.0's publishers serve a subscription listing exactly `cpu` on
//! `<data key>/_buf_cpu` and every other one on `<data key>/_buf/<its GID>`, where a
//! CUDA publisher sends a descriptor or, when the backend's plugin says no, CDR
//! (`rmw_publisher_data.cpp:276-481`, `cuda_buffer_backend_plugin.cpp:82-214`). Their
//! subscriptions also listen on the data key. So:
//!
//! - a message no descriptor is sent for goes on the data key, once, for everyone (as
//!   before this wire existed);
//! - a message with descriptors must not also go on the data key (a subscription given
//!   a descriptor would take it twice): CDR then goes on `_buf_cpu` once if a CPU-only
//!   subscription exists, and on `_buf/<GID>` of each other subscription not given a
//!   descriptor;
//! - a subscription whose token lists no backends (an older rmw_zenoh, or a chunk we
//!   refused) hears only the data key, so while one exists no descriptor is sent.
//!
//! A subscription listing `cuda` is given a descriptor only if the host endpoint
//! registry has its entry with our device ordinal and our uid, able to map blocks, in
//! another process. The backend's plugin also sends one to a subscription the registry
//! does not list (one on another host, whose import then fails); we send CDR.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use zcs_wire::rosidl_cuda::registry::Endpoint as RegistryEntry;

use crate::backends::CUDA;
use crate::names::Entity;

/// How long a subscription the registry did not list waits before it is looked up again.
const RELOOK: Duration = Duration::from_secs(1);

/// One message's destinations.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// CDR on the data key, for everyone.
    pub(super) data_key: bool,
    /// CDR on `_buf_cpu`.
    pub(super) buf_cpu: bool,
    /// CDR on `_buf/<GID>` of these subscriptions.
    pub(super) cdr: Vec<[u8; 16]>,
    /// A descriptor on `_buf/<GID>` of these.
    pub(super) descriptors: Vec<[u8; 16]>,
    /// Why each subscription listing `cuda` and not given a descriptor gets CDR.
    pub(super) fallbacks: Vec<&'static str>,
}

impl Plan {
    /// Turns the descriptors into CDR (the block could not be lent), for `why`.
    pub(super) fn without_descriptors(&mut self, why: &'static str) {
        let n = self.descriptors.len();
        self.fallbacks.extend(std::iter::repeat_n(why, n));
        if self.cdr.is_empty() && !self.buf_cpu {
            // Nobody else was served on their own key: the data key reaches everyone.
            self.descriptors.clear();
            self.data_key = true;
        } else {
            self.cdr.append(&mut self.descriptors);
        }
    }

    /// Whether the message's bytes must be copied to host.
    pub(super) fn needs_cdr(&self) -> bool {
        self.data_key || self.buf_cpu || !self.cdr.is_empty()
    }
}

/// Plans one message for `subs` (the subscriptions of the topic that are not ours):
/// `lendable` says whether its block can be lent at all, `verdict` whether a
/// subscription listing `cuda` may be given a descriptor (else why not).
pub(super) fn plan(
    subs: &[Entity],
    lendable: bool,
    mut verdict: impl FnMut(&[u8; 16]) -> Result<(), &'static str>,
) -> Plan {
    let mut p = Plan::default();
    if subs.is_empty() {
        return p;
    }
    let legacy = subs.iter().any(|e| e.topic.as_ref().is_none_or(|t| t.backends.is_none()));
    let mut others = Vec::new();
    for e in subs {
        let Some(b) = e.topic.as_ref().and_then(|t| t.backends.as_ref()) else { continue };
        if b.is_cpu_only() {
            p.buf_cpu = true;
        } else if !b.contains(CUDA) {
            others.push(e.gid);
        } else if legacy {
            p.fallbacks.push("legacy-subscription");
        } else if !lendable {
            p.fallbacks.push("host-data");
            others.push(e.gid);
        } else {
            match verdict(&e.gid) {
                Ok(()) => p.descriptors.push(e.gid),
                Err(why) => {
                    p.fallbacks.push(why);
                    others.push(e.gid);
                }
            }
        }
    }
    if legacy || p.descriptors.is_empty() {
        return Plan {
            data_key: true,
            buf_cpu: false,
            cdr: Vec::new(),
            descriptors: Vec::new(),
            fallbacks: p.fallbacks,
        };
    }
    p.cdr = others;
    p
}

/// Whether a registry entry may be given a descriptor by a publisher of process `pid`
/// on device `ordinal` running as `uid`.
pub(super) fn registry_verdict(
    entry: Option<&RegistryEntry>,
    ordinal: i32,
    uid: u32,
    pid: i32,
) -> Result<(), &'static str> {
    let Some(e) = entry else { return Err("not-registered") };
    if e.device_id != ordinal {
        Err("other-device")
    } else if e.uid != uid {
        Err("other-user")
    } else if !e.ipc_capable {
        Err("not-capable")
    } else if e.pid() == pid {
        Err("same-process")
    } else {
        Ok(())
    }
}

/// Registry verdicts, cached: an entry found is final for its GID (as the plugin caches
/// them); one not found is looked up again after [`RELOOK`].
#[derive(Default)]
pub(super) struct Verdicts(HashMap<[u8; 16], (Result<(), &'static str>, Instant)>);

impl Verdicts {
    /// The verdict for `gid`, from the cache or from `lookup`.
    pub(super) fn get(
        &mut self,
        gid: &[u8; 16],
        lookup: impl FnOnce() -> Result<(), &'static str>,
    ) -> Result<(), &'static str> {
        if let Some((v, at)) = self.0.get(gid)
            && (*v != Err("not-registered") && *v != Err("registry") || at.elapsed() < RELOOK)
        {
            return *v;
        }
        let v = lookup();
        self.0.insert(*gid, (v, Instant::now()));
        v
    }

    /// Forgets the subscriptions not in `live`.
    pub(super) fn keep_only(&mut self, live: &[Entity]) {
        if self.0.len() > live.len() {
            self.0.retain(|g, _| live.iter().any(|e| e.gid == *g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::Backends;

    fn sub(n: u8, backends: Option<Backends>) -> Entity {
        let token = format!(
            "@ros2_lv/0/zid{n}/1/{n}/MS/%/%/node/%camera%image/sensor_msgs::msg::dds_::Image_/RIHS01_00/::,10:,:,:,,{}",
            backends.and_then(|b| b.to_chunk()).map(|c| format!("/{c}")).unwrap_or_default()
        );
        Entity::parse(&token).expect("a token")
    }

    fn cuda() -> Option<Backends> {
        Some(Backends::default().with(CUDA, ""))
    }

    #[test]
    fn descriptors_go_to_eligible_cuda_subscriptions_and_cdr_to_the_others_on_their_keys() {
        let subs = [
            sub(1, cuda()),
            sub(2, cuda()),
            sub(3, Some(Backends::cpu_only())),
            sub(4, Some(Backends::default().with("other", ""))),
        ];
        let refused = subs[1].gid;
        let p = plan(&subs, true, |g| if *g == refused { Err("other-device") } else { Ok(()) });
        assert_eq!(p.descriptors, vec![subs[0].gid]);
        assert_eq!(p.cdr, vec![subs[1].gid, subs[3].gid]);
        assert!(p.buf_cpu && !p.data_key);
        assert_eq!(p.fallbacks, vec!["other-device"]);
    }

    #[test]
    fn without_a_descriptor_the_data_key_serves_everyone_once() {
        let subs = [sub(1, cuda()), sub(2, Some(Backends::cpu_only()))];
        let p = plan(&subs, true, |_| Err("not-registered"));
        assert_eq!(p, Plan { data_key: true, fallbacks: vec!["not-registered"], ..Plan::default() });
        let p = plan(&subs, false, |_| unreachable!("host data is never lent"));
        assert_eq!(p, Plan { data_key: true, fallbacks: vec!["host-data"], ..Plan::default() });
        assert_eq!(plan(&[], true, |_| Ok(())), Plan::default(), "nobody: nothing");
    }

    #[test]
    fn a_subscription_without_backends_keeps_every_message_on_the_data_key() {
        let subs = [sub(1, cuda()), sub(2, None)];
        let p = plan(&subs, true, |_| Ok(()));
        assert_eq!(p, Plan { data_key: true, fallbacks: vec!["legacy-subscription"], ..Plan::default() });
    }

    #[test]
    fn a_block_that_cannot_be_lent_turns_descriptors_into_cdr() {
        let subs = [sub(1, cuda()), sub(2, Some(Backends::cpu_only()))];
        let mut p = plan(&subs, true, |_| Ok(()));
        p.without_descriptors("socket");
        assert_eq!((p.cdr.clone(), p.buf_cpu, p.data_key), (vec![subs[0].gid], true, false));
        let mut alone = plan(&subs[..1], true, |_| Ok(()));
        alone.without_descriptors("too-many-lent");
        assert_eq!(alone, Plan { data_key: true, fallbacks: vec!["too-many-lent"], ..Plan::default() });
    }

    #[test]
    fn registry_entries_are_judged_on_device_user_capability_and_process() {
        let e = RegistryEntry {
            instance_id: 42 << 32,
            gid: [1; 16],
            kind: 1,
            device_id: 0,
            uid: 1000,
            ipc_capable: true,
            name: "sensor_msgs/msg/Image".into(),
        };
        assert_eq!(registry_verdict(Some(&e), 0, 1000, 7), Ok(()));
        assert_eq!(registry_verdict(None, 0, 1000, 7), Err("not-registered"));
        assert_eq!(registry_verdict(Some(&e), 1, 1000, 7), Err("other-device"));
        assert_eq!(registry_verdict(Some(&e), 0, 1001, 7), Err("other-user"));
        assert_eq!(
            registry_verdict(Some(&RegistryEntry { ipc_capable: false, ..e.clone() }), 0, 1000, 7),
            Err("not-capable")
        );
        assert_eq!(registry_verdict(Some(&e), 0, 1000, 42), Err("same-process"));
    }

    #[test]
    fn verdicts_found_are_kept_and_misses_looked_up_again_later() {
        let mut v = Verdicts::default();
        assert_eq!(v.get(&[1; 16], || Ok(())), Ok(()));
        assert_eq!(v.get(&[1; 16], || unreachable!("cached")), Ok(()));
        assert_eq!(v.get(&[2; 16], || Err("not-registered")), Err("not-registered"));
        assert_eq!(v.get(&[2; 16], || unreachable!("within the re-look time")), Err("not-registered"));
        v.0.get_mut(&[2; 16]).unwrap().1 -= RELOOK;
        assert_eq!(v.get(&[2; 16], || Ok(())), Ok(()), "looked up again");
        v.keep_only(&[]);
        assert!(v.0.is_empty());
    }
}
