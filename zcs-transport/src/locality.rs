//! Which path a subscriber can take to a publisher, from their locality groups and what
//! the subscriber's process sees of the host's GPUs: the publisher's block itself (same
//! device), the block mapped over NVLink or PCIe (another GPU of the host, with peer
//! access), a host-memory copy of it (a subscriber without CUDA on the GPU's host, or
//! one whose GPU cannot map the publisher's), a host-memory publisher's block copied
//! onto a CUDA subscriber's GPU, or bytes. The subscriber decides; the publisher checks
//! that a `Hello` comes from its own host and serves it the blocks its group can map.

use crate::config::PeerGpus;
use crate::cuda::Topology;
use crate::protocol::Group;

/// What a CUDA subscriber knows for peer decisions: its GPU, what its process sees of
/// the host's GPUs, and its configuration.
#[derive(Debug, Clone)]
pub struct PeerView {
    /// The subscriber's device, as its process numbers it.
    pub ordinal: usize,
    /// The host's GPUs and which can map which.
    pub topology: Topology,
    /// How to read from publishers on another GPU of the host.
    pub mode: PeerGpus,
}

/// The path to one publisher. A CUDA subscriber that cannot map another GPU's memory (no
/// peer access, a GPU its process does not see, or `peer_gpus: host`) takes host blocks
/// and copies them onto its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Locality {
    /// Same device (or the same host's memory): the block itself.
    Same,
    /// Another GPU of this host whose memory ours can map: the block, read over the link.
    Peer,
    /// A GPU publisher of this host whose blocks this subscriber does not map: a copy
    /// of each in host memory, made once by the publisher for all such subscribers.
    HostBlock,
    /// Bytes, for the reason given.
    Bytes(String),
}

impl Locality {
    /// Whether a handshake is worth trying.
    pub(crate) fn maps(&self) -> bool {
        matches!(self, Self::Same | Self::Peer | Self::HostBlock)
    }
}

/// Why processes of groups `ours` and `theirs` cannot share a block as it is: another
/// host, or another device; `None` for the same group.
pub(crate) fn apart(ours: &Group, theirs: &Group) -> Option<String> {
    if ours.boot_id != theirs.boot_id {
        Some("on another host".to_owned())
    } else if ours.device != theirs.device {
        Some(format!("on another device ({} there, {} here)", theirs.device, ours.device))
    } else {
        None
    }
}

/// The subscriber's decision for a publisher of group `theirs`; `ours` is the
/// subscriber's group, `peer` its view of the host's GPUs (CUDA subscribers only) and
/// `host_blocks` its configuration's `host_blocks` (host-memory subscribers).
pub(crate) fn decide(ours: &Group, theirs: &Group, peer: Option<&PeerView>, host_blocks: bool) -> Locality {
    let Some(other_device) = apart(ours, theirs) else { return Locality::Same };
    if ours.boot_id != theirs.boot_id {
        return Locality::Bytes(other_device);
    }
    let gpu_publisher = Group::cuda_uuid(&theirs.device);
    // Where our GPU cannot map theirs, host blocks if this subscriber takes them.
    let host_blocks_or = |why: String| match host_blocks {
        true => Locality::HostBlock,
        false => {
            Locality::Bytes(format!("{other_device}; {why}; host blocks are off in this subscriber's configuration"))
        }
    };
    if ours.is_host() && gpu_publisher.is_some() {
        return host_blocks_or("this process has no GPU".to_owned());
    }
    // A host-memory publisher's blocks are host blocks already: a CUDA subscriber maps
    // them and copies each message onto its GPU.
    if theirs.is_host() && Group::cuda_uuid(&ours.device).is_some() {
        return host_blocks_or("the publisher's blocks are in host memory".to_owned());
    }
    let (Some(view), Some(uuid)) = (peer, gpu_publisher) else {
        // A host-memory publisher, or a GPU we do not model.
        return Locality::Bytes(other_device);
    };
    match view.mode {
        PeerGpus::Off => {
            return Locality::Bytes(format!("{other_device}; peer GPUs are off in this subscriber's configuration"));
        }
        PeerGpus::Host => return host_blocks_or("peer GPUs through host memory (peer_gpus: host)".to_owned()),
        PeerGpus::InPlace | PeerGpus::Copy => {}
    }
    let Some(theirs) = view.topology.ordinal_of(&uuid) else {
        return host_blocks_or(
            "this process does not see that GPU (CUDA_VISIBLE_DEVICES), so cannot map its memory".to_owned(),
        );
    };
    if !view.topology.can_access(view.ordinal, theirs) {
        return host_blocks_or(format!(
            "the driver reports no peer access from GPU {} to GPU {theirs} (no NVLink or PCIe P2P between them, or a \
             MIG instance)",
            view.ordinal
        ));
    }
    Locality::Peer
}

/// Which blocks a publisher serves a subscriber whose `Hello` names its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serve {
    /// The publisher's own blocks: a subscriber of its group, or, for a CUDA
    /// publisher, one on another GPU of the same host (which decided it can map ours).
    Blocks,
    /// Host-memory copies of a CUDA publisher's blocks, for a host-memory subscriber of
    /// its host.
    HostBlocks,
}

/// The publisher's check of a `Hello`: what it serves that subscriber, if anything.
pub(crate) fn serves(publisher: &Group, subscriber: &Group) -> Option<Serve> {
    let cuda = |g: &Group| Group::cuda_uuid(&g.device).is_some();
    if publisher == subscriber {
        Some(Serve::Blocks)
    } else if publisher.boot_id != subscriber.boot_id || !cuda(publisher) {
        None
    } else if cuda(subscriber) {
        Some(Serve::Blocks)
    } else if subscriber.is_host() {
        Some(Serve::HostBlocks)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::GpuUuid;

    const BOOT: &str = "0f5e9d3c-1111-2222-3333-444455556666";

    fn uuid(n: u8) -> GpuUuid {
        GpuUuid([n; 16])
    }

    fn group(device: &str) -> Group {
        Group { boot_id: BOOT.to_owned(), device: device.to_owned() }
    }

    fn gpu(n: u8) -> Group {
        group(&Group::cuda_device(&uuid(n)))
    }

    fn view(ordinal: usize, devices: &[u8], pairs: &[(usize, usize)]) -> PeerView {
        let topology = Topology::described(devices.iter().map(|&n| uuid(n)).collect(), pairs);
        PeerView { ordinal, topology, mode: PeerGpus::InPlace }
    }

    /// Two GPUs joined by NVLink, both ways (what `nvidia-smi topo -m` shows as NV18).
    fn nvlink_pair() -> PeerView {
        view(1, &[0xa0, 0xa1], &[(0, 1), (1, 0)])
    }

    #[test]
    fn same_device_maps_the_block_itself() {
        assert_eq!(decide(&gpu(0xa0), &gpu(0xa0), Some(&nvlink_pair()), true), Locality::Same);
        assert_eq!(decide(&group("host"), &group("host"), None, true), Locality::Same);
    }

    #[test]
    fn another_gpu_with_peer_access_is_read_over_the_link() {
        let l = decide(&gpu(0xa1), &gpu(0xa0), Some(&nvlink_pair()), true);
        assert_eq!(l, Locality::Peer);
        assert!(l.maps());
    }

    #[test]
    fn gpus_are_matched_by_uuid_whatever_the_numbering() {
        // CUDA_VISIBLE_DEVICES=1,0: the publisher's GPU is ordinal 1 here, ours 0; peer
        // access only from ordinal 0 to ordinal 1.
        let v = view(0, &[0xa1, 0xa0], &[(0, 1)]);
        assert_eq!(decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true), Locality::Peer);
        // The same pair seen from a process whose driver reports access the other way
        // only: through host memory (bytes if host blocks are off, saying why).
        let v = view(0, &[0xa1, 0xa0], &[(1, 0)]);
        assert_eq!(decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true), Locality::HostBlock);
        assert!(
            matches!(decide(&gpu(0xa1), &gpu(0xa0), Some(&v), false), Locality::Bytes(r) if r.contains("no peer access"))
        );
    }

    #[test]
    fn a_gpu_without_peer_access_takes_host_blocks() {
        // PCIe without P2P (or MIG): the driver reports no access either way.
        let v = view(1, &[0xa0, 0xa1], &[]);
        let l = decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true);
        assert_eq!(l, Locality::HostBlock);
        assert!(l.maps());
        let Locality::Bytes(why) = decide(&gpu(0xa1), &gpu(0xa0), Some(&v), false) else { panic!("expected bytes") };
        assert!(why.contains("no peer access from GPU 1 to GPU 0"), "{why}");
        assert!(why.starts_with("on another device ("), "{why}");
        assert!(why.ends_with("host blocks are off in this subscriber's configuration"), "{why}");
    }

    #[test]
    fn a_gpu_this_process_does_not_see_takes_host_blocks() {
        // CUDA_VISIBLE_DEVICES=1: the publisher's GPU 0 is invisible here.
        let v = view(0, &[0xa1], &[]);
        assert_eq!(decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true), Locality::HostBlock);
        let Locality::Bytes(why) = decide(&gpu(0xa1), &gpu(0xa0), Some(&v), false) else { panic!("expected bytes") };
        assert!(why.contains("does not see that GPU"), "{why}");
    }

    #[test]
    fn peer_gpus_copy_maps_the_block_like_in_place() {
        // The copy onto our GPU is made from the mapped block: it needs the same access.
        let mut v = nvlink_pair();
        v.mode = PeerGpus::Copy;
        assert_eq!(decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true), Locality::Peer);
        let mut v = view(1, &[0xa0, 0xa1], &[]);
        v.mode = PeerGpus::Copy;
        assert_eq!(decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true), Locality::HostBlock);
    }

    #[test]
    fn peer_gpus_host_goes_through_host_memory_even_over_nvlink() {
        let mut v = nvlink_pair();
        v.mode = PeerGpus::Host;
        assert_eq!(decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true), Locality::HostBlock);
        let Locality::Bytes(why) = decide(&gpu(0xa1), &gpu(0xa0), Some(&v), false) else { panic!("expected bytes") };
        assert!(why.contains("peer_gpus: host") && why.contains("host blocks are off"), "{why}");
        // The same GPU is always the block itself.
        assert_eq!(decide(&gpu(0xa0), &gpu(0xa0), Some(&v), true), Locality::Same);
    }

    #[test]
    fn peer_gpus_off_in_the_configuration_gets_bytes() {
        let mut v = nvlink_pair();
        v.mode = PeerGpus::Off;
        let Locality::Bytes(why) = decide(&gpu(0xa1), &gpu(0xa0), Some(&v), true) else { panic!("expected bytes") };
        assert!(why.contains("peer GPUs are off"), "{why}");
    }

    #[test]
    fn other_hosts_and_host_memory_get_bytes() {
        let elsewhere = Group { boot_id: "another-boot".into(), device: gpu(0xa0).device };
        assert_eq!(
            decide(&gpu(0xa0), &elsewhere, Some(&nvlink_pair()), true),
            Locality::Bytes("on another host".into())
        );
        // A CUDA subscriber without a view (no topology): bytes, never a guess.
        assert!(!decide(&gpu(0xa1), &gpu(0xa0), None, true).maps());
    }

    #[test]
    fn a_cuda_subscriber_of_a_host_memory_publisher_of_its_host_copies_its_blocks() {
        // With or without a view of the GPUs, whatever `peer_gpus` says: no GPU to reach.
        assert_eq!(decide(&gpu(0xa1), &group("host"), Some(&nvlink_pair()), true), Locality::HostBlock);
        assert_eq!(decide(&gpu(0xa1), &group("host"), None, true), Locality::HostBlock);
        let Locality::Bytes(why) = decide(&gpu(0xa1), &group("host"), None, false) else { panic!("expected bytes") };
        assert!(why.contains("in host memory") && why.contains("host blocks are off"), "{why}");
        let elsewhere = Group { boot_id: "another-boot".into(), device: "host".into() };
        assert_eq!(decide(&gpu(0xa1), &elsewhere, None, true), Locality::Bytes("on another host".into()));
        // The publisher serves such a Hello (from group `host`) its own blocks.
        assert_eq!(serves(&group("host"), &group("host")), Some(Serve::Blocks));
    }

    #[test]
    fn a_host_memory_subscriber_of_a_gpu_publisher_of_its_host_gets_host_blocks() {
        let l = decide(&group("host"), &gpu(0xa0), None, true);
        assert_eq!(l, Locality::HostBlock);
        assert!(l.maps());
        // Not from another host, and not from a device chunk that names no GPU.
        let elsewhere = Group { boot_id: "another-boot".into(), device: gpu(0xa0).device };
        assert_eq!(decide(&group("host"), &elsewhere, None, true), Locality::Bytes("on another host".into()));
        assert!(!decide(&group("host"), &group("cuda-zz"), None, true).maps());
        // Host blocks off in the subscriber's configuration: bytes, saying so.
        let Locality::Bytes(why) = decide(&group("host"), &gpu(0xa0), None, false) else { panic!("expected bytes") };
        assert!(why.contains("host blocks are off"), "{why}");
    }

    #[test]
    fn the_publisher_serves_its_group_other_gpus_and_host_memory_of_its_host_only() {
        assert_eq!(serves(&gpu(0xa0), &gpu(0xa0)), Some(Serve::Blocks));
        assert_eq!(serves(&gpu(0xa0), &gpu(0xa1)), Some(Serve::Blocks));
        assert_eq!(serves(&group("host"), &group("host")), Some(Serve::Blocks));
        assert_eq!(serves(&gpu(0xa0), &group("host")), Some(Serve::HostBlocks));
        // A host-memory publisher has no GPU blocks to offer a GPU subscriber.
        assert_eq!(serves(&group("host"), &gpu(0xa0)), None);
        assert_eq!(serves(&gpu(0xa0), &group("cuda-zz")), None);
        for device in [gpu(0xa1).device, "host".to_owned()] {
            assert_eq!(serves(&gpu(0xa0), &Group { boot_id: "another-boot".into(), device }), None);
        }
    }

    #[test]
    fn device_chunks_parse_to_uuids_or_nothing() {
        assert_eq!(Group::cuda_uuid(&Group::cuda_device(&uuid(0x5c))), Some(uuid(0x5c)));
        for bad in
            ["host", "cuda-", "cuda-00", &format!("cuda-{}", "g".repeat(32)), &format!("cuda-{}", "0".repeat(34))]
        {
            assert_eq!(Group::cuda_uuid(bad), None, "{bad}");
        }
    }
}
