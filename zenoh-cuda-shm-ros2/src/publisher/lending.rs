//! A publisher's side of ROS 2's CUDA buffer backend: its registry entry, the verdicts
//! on the subscriptions it may send descriptors to, its lent blocks, and why a
//! subscription listing `cuda` got CDR instead.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use tensor_codec::cdr::CudaBufferDescriptor;
use zcs_memory::cuda::Gpu;
use zcs_wire::rosidl_cuda::EndpointKind;
use zcs_wire::rosidl_cuda::registry::our_uid;
use zenoh_cuda_shm::api::{GpuLoan, SharedBlock};

use super::route::{Plan, Verdicts, plan, registry_verdict};
use crate::cuda_backend::{Exports, Prepared, Registration};
use crate::names::Entity;
use crate::sync::Unpoisoned;

pub(super) struct Lending {
    exports: Exports,
    /// `None` when the registry could not be used (`registry_error` says why): nobody is
    /// then sent a descriptor, as nobody can be checked.
    registration: Option<Registration>,
    registry_error: Option<String>,
    verdicts: Mutex<Verdicts>,
    ordinal: i32,
    fallbacks: Mutex<BTreeMap<&'static str, u64>>,
}

impl Lending {
    /// The lending of publisher `gid` of type `type_name` on `gpu`.
    ///
    /// # Errors
    /// The lending thread could not be started.
    pub(super) fn new(gid: [u8; 16], gpu: &Gpu, type_name: &str) -> std::io::Result<Self> {
        let (registration, registry_error) = match Registration::new(gid, EndpointKind::Publisher, gpu, type_name) {
            Ok(r) => (Some(r), None),
            Err(e) => {
                let e = zenoh_cuda_shm::error::Chain(&e).to_string();
                tracing::warn!(error = %e, "cannot use the CUDA buffer backend's registry: no descriptors are sent");
                (None, Some(e))
            }
        };
        Ok(Self {
            exports: Exports::new(gpu)?,
            registration,
            registry_error,
            verdicts: Mutex::default(),
            ordinal: i32::try_from(gpu.ordinal()).unwrap_or(i32::MAX),
            fallbacks: Mutex::default(),
        })
    }

    /// One message's destinations among `subs`.
    pub(super) fn plan(&self, subs: &[Entity], lendable: bool) -> Plan {
        let mut verdicts = self.verdicts.locked();
        verdicts.keep_only(subs);
        let (uid, pid) = (our_uid(), std::process::id() as i32);
        let p = plan(subs, lendable, |gid| {
            verdicts.get(gid, || match &self.registration {
                None => Err("registry"),
                Some(r) => match r.registry().lookup(*gid) {
                    Ok(e) => registry_verdict(e.as_ref(), self.ordinal, uid, pid),
                    Err(e) => {
                        tracing::debug!(error = %zenoh_cuda_shm::error::Chain(&e), "registry lookup failed");
                        Err("registry")
                    }
                },
            })
        });
        self.count(&p.fallbacks);
        p
    }

    /// Counts subscriptions that got CDR, by reason.
    fn count(&self, why: &[&'static str]) {
        if why.is_empty() {
            return;
        }
        let mut f = self.fallbacks.locked();
        for w in why {
            *f.entry(w).or_default() += 1;
        }
    }

    /// Readies `loan`'s block for the descriptors of `plan` (its writer's event recorded
    /// on its stream); when it cannot be lent, they become CDR, counted by reason.
    pub(super) fn prepare(&self, loan: &GpuLoan, plan: &mut Plan) -> Option<Prepared> {
        if plan.descriptors.is_empty() {
            return None;
        }
        match self.exports.prepare(loan) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::debug!(error = %zenoh_cuda_shm::error::Chain(&e), "a block cannot be lent: CDR instead");
                self.count(&vec![e.kind(); plan.descriptors.len()]);
                plan.without_descriptors(e.kind());
                None
            }
        }
    }

    /// Lends the block, published as `block`: its descriptor.
    pub(super) fn lend(&self, prepared: Prepared, block: SharedBlock) -> CudaBufferDescriptor {
        self.exports.lend(prepared, block)
    }

    pub(super) fn fallbacks(&self) -> BTreeMap<&'static str, u64> {
        self.fallbacks.locked().clone()
    }

    pub(super) fn registry_error(&self) -> Option<&str> {
        self.registry_error.as_deref()
    }

    pub(super) fn lent_now(&self) -> u64 {
        self.exports.counters().out.load(Ordering::Relaxed)
    }

    pub(super) fn reclaimed(&self) -> u64 {
        self.exports.counters().reclaimed.load(Ordering::Relaxed)
    }
}
