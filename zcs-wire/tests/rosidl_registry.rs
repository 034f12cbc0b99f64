//! The CUDA buffer backend's host endpoint registry, as this crate reads and writes it:
//! the byte layout of `host_endpoint_manager.cpp` (cuda_buffer 0.1.2), checked on the
//! raw file; entries of dead processes purged; refusals of files that are not a
//! registry; the last handle out removing both objects. Host only: no GPU involved.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use zcs_wire::rosidl_cuda::registry::{self, EndpointKind, HostRegistry, MAX_ENTRIES, RegistryError, SIZE};

static N: AtomicU32 = AtomicU32::new(0);

/// A registry name of this test process, removed (file and semaphore) when dropped.
struct Name(String);

impl Name {
    fn new() -> Self {
        Self(format!("zcs_test_hem_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
    }
    fn path(&self) -> PathBuf {
        PathBuf::from("/dev/shm").join(&self.0)
    }
    fn sem_path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/shm/sem.{}_mtx", self.0))
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path());
        let _ = std::fs::remove_file(self.sem_path());
    }
}

const GID: [u8; 16] = [7; 16];
const ENTRY0: usize = 272;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn registry_entries_are_written_in_the_backends_layout() {
    let name = Name::new();
    let reg = HostRegistry::open_named(&name.0).unwrap();
    let meta = std::fs::metadata(name.path()).unwrap();
    assert_eq!(meta.len(), SIZE as u64);
    assert_eq!(SIZE, 151_824);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "created for our user only");
    assert_eq!(std::fs::metadata(name.sem_path()).unwrap().permissions().mode() & 0o077, 0);

    reg.register(GID, EndpointKind::Subscription, 3, true, "sensor_msgs::msg::dds_::Image_").unwrap();
    let raw = std::fs::read(name.path()).unwrap();
    let uid = nix::unistd::getuid().as_raw();
    assert_eq!(le32(&raw, 0), 1, "version");
    assert_eq!((le32(&raw, 260), le32(&raw, 264)), (MAX_ENTRIES as u32, 1), "max_entries, num_entries");
    let host = nix::unistd::gethostname().unwrap().into_encoded_bytes();
    assert_eq!(&raw[4..4 + host.len()], &host[..]);
    let e = &raw[ENTRY0..ENTRY0 + 296];
    assert_eq!(u64::from_le_bytes(e[0..8].try_into().unwrap()), reg.instance_id());
    assert_eq!(reg.instance_id() >> 32, u64::from(std::process::id()));
    assert_eq!(&e[8..24], &GID);
    assert_eq!((e[24], le32(e, 28) as i32, le32(e, 32), e[36], e[37]), (1, 3, uid, 1, 1));
    assert_eq!(&e[40..40 + 30], b"sensor_msgs::msg::dds_::Image_");
    assert_eq!(e[70], 0);

    // Registering the same GID again overwrites its entry.
    reg.register(GID, EndpointKind::Subscription, 0, false, "x").unwrap();
    let found = reg.lookup(GID).unwrap().unwrap();
    assert_eq!(
        (found.device_id, found.ipc_capable, found.uid, found.pid()),
        (0, false, uid, std::process::id() as i32)
    );
    assert_eq!(reg.active().unwrap().len(), 1);
    assert!(reg.unregister(GID).unwrap());
    assert_eq!(reg.lookup(GID).unwrap(), None);
    assert!(!reg.unregister(GID).unwrap());
}

#[test]
fn registry_reads_entries_written_by_another_process_and_purges_the_dead() {
    let name = Name::new();
    let first = HostRegistry::open_named(&name.0).unwrap();
    first.register([1; 16], EndpointKind::Publisher, 0, true, "first").unwrap();

    // An entry as another live process writes it (this test's parent stands in for a
    // live pid) and one of a process that has exited.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let live_pid = std::os::unix::process::parent_id();
    let mut raw = std::fs::read(name.path()).unwrap();
    for (slot, pid, gid) in [(1usize, live_pid, [2u8; 16]), (2, dead_pid, [3; 16])] {
        let e = ENTRY0 + slot * 296;
        raw[e..e + 8].copy_from_slice(&((u64::from(pid) << 32) | 1).to_le_bytes());
        raw[e + 8..e + 24].copy_from_slice(&gid);
        raw[e + 24] = 1;
        raw[e + 28..e + 32].copy_from_slice(&1i32.to_le_bytes());
        raw[e + 32..e + 36].copy_from_slice(&4242u32.to_le_bytes());
        raw[e + 36] = 1;
        raw[e + 40..e + 44].copy_from_slice(b"peer");
    }
    raw[264..268].copy_from_slice(&3u32.to_le_bytes());
    // In place (no truncation: the file is mapped by `first`).
    let file = std::fs::OpenOptions::new().write(true).open(name.path()).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &raw, 0).unwrap();

    let reg = HostRegistry::open_named(&name.0).unwrap();
    let peer = reg.lookup([2; 16]).unwrap().expect("the live process's entry");
    assert_eq!(
        (peer.pid(), peer.kind, peer.device_id, peer.uid, peer.name.as_str()),
        (live_pid as i32, 1, 1, 4242, "peer")
    );
    assert_eq!(reg.lookup([3; 16]).unwrap(), None, "the dead process's entry was purged on attach");
    // A new entry reuses the purged slot rather than growing the table.
    reg.register([4; 16], EndpointKind::Subscription, 0, true, "").unwrap();
    assert_eq!(le32(&std::fs::read(name.path()).unwrap(), 264), 3);
    drop(first);
    assert_eq!(reg.lookup([1; 16]).unwrap(), None, "a handle's entries go inactive when it is dropped");
    assert!(reg.lookup([2; 16]).unwrap().is_some());
}

#[test]
fn registry_refuses_files_that_are_not_a_registry_and_a_full_table() {
    let name = Name::new();
    std::os::unix::fs::symlink("/dev/null", name.path()).unwrap();
    assert!(matches!(HostRegistry::open_named(&name.0), Err(RegistryError::Io { what: "open", .. })));
    std::fs::remove_file(name.path()).unwrap();

    std::fs::write(name.path(), vec![0u8; SIZE + 8]).unwrap();
    assert!(matches!(HostRegistry::open_named(&name.0), Err(RegistryError::Untrusted { .. })));
    let mut other_version = vec![0u8; SIZE];
    other_version[0] = 2;
    std::fs::write(name.path(), &other_version).unwrap();
    let err = HostRegistry::open_named(&name.0).unwrap_err();
    assert!(err.to_string().contains("not a host endpoint registry"), "{err}");
    assert_eq!(std::fs::read(name.path()).unwrap(), other_version, "a refused file is left as it was");
    std::fs::remove_file(name.path()).unwrap();

    let reg = HostRegistry::open_named(&name.0).unwrap();
    for i in 0..MAX_ENTRIES {
        let mut gid = [0u8; 16];
        gid[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        reg.register(gid, EndpointKind::Subscription, 0, true, "").unwrap();
    }
    assert!(matches!(reg.register(GID, EndpointKind::Subscription, 0, true, ""), Err(RegistryError::Full)));
    assert_eq!(reg.active().unwrap().len(), MAX_ENTRIES);
}

#[test]
fn registry_last_handle_out_removes_both_objects() {
    let name = Name::new();
    let a = HostRegistry::open_named(&name.0).unwrap();
    let b = HostRegistry::open_named(&name.0).unwrap();
    assert_ne!(a.instance_id(), b.instance_id());
    a.register(GID, EndpointKind::Subscription, 0, true, "").unwrap();
    drop(b);
    assert!(name.path().exists() && name.sem_path().exists(), "a's entry is active");
    drop(a);
    assert!(!name.path().exists() && !name.sem_path().exists(), "no active entry left: removed");
}

#[test]
fn registry_name_follows_the_host_name_hash() {
    // h = h * 31 + c, as a u32; bytes above 0x7f are signed C chars on x86-64.
    assert_eq!(registry::host_hash(b""), 0);
    assert_eq!(registry::host_hash(b"ab"), 97 * 31 + 98);
    // Computed apart from this code (Python: h = (h * 31 + c) & 0xffffffff).
    assert_eq!(registry::host_hash(b"localhost"), 3_090_360_211);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(registry::host_hash(&[0xff]), u32::MAX);
    let host = nix::unistd::gethostname().unwrap().into_encoded_bytes();
    assert_eq!(registry::name_for_domain(0).unwrap(), format!("ros2_hem_d0_h{}", registry::host_hash(&host)));
}
