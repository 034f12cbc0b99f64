//! The host endpoint registry of the CUDA buffer backend: one POSIX shared-memory file
//! per host and domain in which every buffer-aware endpoint of every process writes its
//! GID, CUDA device ordinal, Unix uid and whether its pool can export memory, guarded by
//! a named semaphore (`cuda_buffer` 0.1.2, `host_endpoint_manager.cpp`).
//!
//! A publisher of the backend reads it before it decides, per subscription, between a
//! descriptor and the CPU form (`cuda_buffer_backend_plugin.cpp:82-129`): a subscription
//! found there with another ordinal or uid gets the CPU form. One missing from it gets
//! descriptors, whatever it can import. A subscription of ours that imports descriptors
//! therefore registers here, so that a publisher on another GPU falls back to CPU CDR
//! instead of sending descriptors we must refuse.
//!
//! Names (`host_endpoint_manager.cpp:197-235`, `486-493`): shared memory
//! `/ros2_hem_d<domain>_h<hash>` and semaphore `/ros2_hem_d<domain>_h<hash>_mtx`, where
//! `<hash>` is `h = h * 31 + c` over the bytes of the host name, each taken as a C
//! `char` (signed on x86-64), in decimal. Their plugin always uses domain 0
//! (`cuda_buffer_backend_plugin.cpp:58`).
//!
//! Layout (`host_endpoint_manager.cpp:76-98`, x86-64 and aarch64): a 272-byte header
//! (`version` u32 at 0, the host name in 256 bytes at 4, `max_entries` u32 at 260,
//! `num_entries` u32 at 264) and 512 entries of 296 bytes: `instance_id` u64 at 0
//! (`pid << 32 | counter`), the GID at 8, the kind u8 at 24, `device_id` i32 at 28,
//! `uid` u32 at 32, `active` at 36, `ipc_capable` at 37, a name of 256 bytes at 40.
//!
//! Every read and write happens under the semaphore, taken with a 2-second limit as
//! upstream does (`host_endpoint_manager.cpp:62-74`). Unlike upstream, we create both
//! objects readable and writable by our user only (upstream: 0666 less the umask), and
//! open an existing file only if it is a regular file of the expected size or smaller.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::sys;

/// Entries the registry holds (`MAX_ENDPOINTS`).
pub const MAX_ENTRIES: usize = 512;
/// How long a registry operation waits for the semaphore.
pub const LOCK_WAIT: Duration = Duration::from_secs(2);
const HEADER: usize = 272;
const ENTRY: usize = 296;
/// The file's size: 151 824 bytes.
pub const SIZE: usize = HEADER + MAX_ENTRIES * ENTRY;
const NAME_LEN: usize = 256;

/// Entry field offsets.
mod at {
    pub const INSTANCE: usize = 0;
    pub const GID: usize = 8;
    pub const KIND: usize = 24;
    pub const DEVICE: usize = 28;
    pub const UID: usize = 32;
    pub const ACTIVE: usize = 36;
    pub const IPC: usize = 37;
    pub const NAME: usize = 40;
    pub const VERSION: usize = 0;
    pub const HOSTNAME: usize = 4;
    pub const MAX: usize = 260;
    pub const COUNT: usize = 264;
}

/// What an entry is (`EntityType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EndpointKind {
    /// A publisher.
    Publisher = 0,
    /// A subscription.
    Subscription = 1,
    /// A service client.
    Client = 2,
    /// A service server.
    Server = 3,
}

/// One endpoint as the registry records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `pid << 32 | counter` of the process handle that wrote it.
    pub instance_id: u64,
    /// The endpoint's rmw_zenoh GID.
    pub gid: [u8; 16],
    /// Its kind (the raw byte: other values are kept as read).
    pub kind: u8,
    /// The CUDA device ordinal of its process (−1: none).
    pub device_id: i32,
    /// Its process's Unix uid.
    pub uid: u32,
    /// Whether its process's pool can export memory.
    pub ipc_capable: bool,
    /// A name (upstream writes the endpoint's type name).
    pub name: String,
}

impl Endpoint {
    /// The pid in its instance id.
    pub fn pid(&self) -> i32 {
        (self.instance_id >> 32) as i32
    }
}

/// Why the registry could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Opening, sizing or mapping the shared memory, or opening the semaphore, failed.
    #[error("cannot {what} {name}")]
    Io {
        /// What failed.
        what: &'static str,
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is not one this layout describes.
    #[error("{name} is not a host endpoint registry ({why})")]
    Untrusted {
        /// The object's name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// Another process held the semaphore past [`LOCK_WAIT`] (possibly a process that
    /// died holding it: every process of the host then times out).
    #[error("the registry's semaphore was not free within {LOCK_WAIT:?}")]
    LockTimeout,
    /// All [`MAX_ENTRIES`] entries are in use.
    #[error("the registry is full ({MAX_ENTRIES} active entries)")]
    Full,
}

/// The registry's name for `domain` on this host (without the leading `/`).
///
/// # Errors
/// The host name cannot be read.
pub fn name_for_domain(domain: u32) -> io::Result<String> {
    let host = nix::unistd::gethostname().map_err(io::Error::from)?;
    Ok(format!("ros2_hem_d{domain}_h{}", host_hash(host.as_encoded_bytes())))
}

/// The uid endpoints of this process register (`getuid()`, as upstream).
pub fn our_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// `h = h * 31 + c` over `host`, each byte taken as a C `char`.
pub fn host_hash(host: &[u8]) -> u32 {
    host.iter().fold(0u32, |h, &b| h.wrapping_mul(31).wrapping_add(b as libc::c_char as i32 as u32))
}

/// Instance ids of this process: `pid << 32 | n`, n from 1.
static NEXT_INSTANCE: AtomicU32 = AtomicU32::new(1);

/// This process's handle on one registry: entries it writes carry its instance id, and
/// are marked inactive when it is dropped (then, as upstream, the last handle of the
/// host to leave with no active entry removes both objects).
pub struct HostRegistry {
    base: NonNull<u8>,
    sem: sys::NamedSemaphore,
    name: String,
    instance_id: u64,
    /// Set once the layout was checked: only then does Drop touch entries or names.
    attached: bool,
    _file: File,
}

// SAFETY: the mapping is owned by this value (unmapped in Drop); every access to it is
// made under the named semaphore, which serialises threads as well as processes.
unsafe impl Send for HostRegistry {}
// SAFETY: as above.
unsafe impl Sync for HostRegistry {}

impl std::fmt::Debug for HostRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegistry").field("name", &self.name).field("instance_id", &self.instance_id).finish()
    }
}

/// The held semaphore.
struct Locked<'a>(&'a HostRegistry);

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.0.sem.post();
    }
}

impl Locked<'_> {
    fn ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset < SIZE);
        // SAFETY: `offset` < SIZE, the length of the mapping.
        unsafe { self.0.base.as_ptr().add(offset) }
    }

    fn u32_at(&self, offset: usize) -> u32 {
        // SAFETY: in the mapping, 4-aligned (every u32 field is), and read under the
        // semaphore; volatile because other processes write the same memory.
        unsafe { self.ptr(offset).cast::<u32>().read_volatile() }
    }

    fn set_u32(&self, offset: usize, v: u32) {
        // SAFETY: as `u32_at`.
        unsafe { self.ptr(offset).cast::<u32>().write_volatile(v) }
    }

    fn u8_at(&self, offset: usize) -> u8 {
        // SAFETY: in the mapping, read under the semaphore.
        unsafe { self.ptr(offset).read_volatile() }
    }

    fn set_u8(&self, offset: usize, v: u8) {
        // SAFETY: as `u8_at`.
        unsafe { self.ptr(offset).write_volatile(v) }
    }

    fn bytes(&self, offset: usize, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = self.u8_at(offset + i);
        }
    }

    fn set_bytes(&self, offset: usize, v: &[u8]) {
        for (i, &b) in v.iter().enumerate() {
            self.set_u8(offset + i, b);
        }
    }

    /// Entries in use (the high-water mark), bounded by the layout.
    fn count(&self) -> usize {
        (self.u32_at(at::COUNT) as usize).min(MAX_ENTRIES)
    }

    fn entry(&self, i: usize) -> usize {
        HEADER + i * ENTRY
    }

    fn active(&self, i: usize) -> bool {
        self.u8_at(self.entry(i) + at::ACTIVE) != 0
    }

    fn instance(&self, i: usize) -> u64 {
        let e = self.entry(i);
        u64::from(self.u32_at(e)) | (u64::from(self.u32_at(e + 4)) << 32)
    }

    fn gid(&self, i: usize) -> [u8; 16] {
        let mut g = [0; 16];
        self.bytes(self.entry(i) + at::GID, &mut g);
        g
    }

    fn read(&self, i: usize) -> Endpoint {
        let e = self.entry(i);
        let mut name = [0u8; NAME_LEN];
        self.bytes(e + at::NAME, &mut name);
        let end = name.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        Endpoint {
            instance_id: self.instance(i),
            gid: self.gid(i),
            kind: self.u8_at(e + at::KIND),
            device_id: self.u32_at(e + at::DEVICE) as i32,
            uid: self.u32_at(e + at::UID),
            ipc_capable: self.u8_at(e + at::IPC) != 0,
            name: String::from_utf8_lossy(&name[..end]).into_owned(),
        }
    }

    fn write(&self, i: usize, ep: &Endpoint) {
        let e = self.entry(i);
        self.set_u32(e + at::INSTANCE, ep.instance_id as u32);
        self.set_u32(e + at::INSTANCE + 4, (ep.instance_id >> 32) as u32);
        self.set_bytes(e + at::GID, &ep.gid);
        self.set_u8(e + at::KIND, ep.kind);
        self.set_u32(e + at::DEVICE, ep.device_id as u32);
        self.set_u32(e + at::UID, ep.uid);
        self.set_u8(e + at::IPC, u8::from(ep.ipc_capable));
        let mut name = [0u8; NAME_LEN];
        let n = ep.name.len().min(NAME_LEN - 1);
        name[..n].copy_from_slice(&ep.name.as_bytes()[..n]);
        self.set_bytes(e + at::NAME, &name);
        self.set_u8(e + at::ACTIVE, 1);
    }

    /// Marks the entries of processes that no longer exist inactive; how many.
    fn purge_dead(&self) -> usize {
        let mut purged = 0;
        for i in 0..self.count() {
            let pid = (self.instance(i) >> 32) as i32;
            if self.active(i) && pid > 0 && zcs_memory::host::process_gone(pid) {
                self.set_u8(self.entry(i) + at::ACTIVE, 0);
                purged += 1;
            }
        }
        purged
    }
}

impl HostRegistry {
    /// Attaches to the registry of `domain` on this host, creating it if absent.
    ///
    /// # Errors
    /// [`RegistryError`]: the objects cannot be opened or created, the file is not a
    /// registry, or its semaphore stays taken.
    pub fn open(domain: u32) -> Result<Self, RegistryError> {
        let name = name_for_domain(domain).map_err(|source| RegistryError::Io {
            what: "read the host name for",
            name: "the host endpoint registry".into(),
            source,
        })?;
        Self::open_named(&name)
    }

    /// Attaches to the registry called `name` (`/dev/shm/<name>` and the semaphore
    /// `<name>_mtx`), creating it if absent.
    ///
    /// # Errors
    /// As [`HostRegistry::open`].
    pub fn open_named(name: &str) -> Result<Self, RegistryError> {
        let io = |what| move |source| RegistryError::Io { what, name: name.to_owned(), source };
        let untrusted = |why: String| RegistryError::Untrusted { name: name.to_owned(), why };
        let path = PathBuf::from("/dev/shm").join(name);
        let file = sys::open_rw(&path, sys::Create::IfAbsent).map_err(io("open"))?;
        let meta = file.metadata().map_err(io("stat"))?;
        if !meta.file_type().is_file() {
            return Err(untrusted("not a regular file".into()));
        }
        if meta.len() > SIZE as u64 {
            return Err(untrusted(format!("{} bytes, the layout has {SIZE}", meta.len())));
        }
        if meta.len() < SIZE as u64 {
            // A new file, or one whose creator has not sized it yet: upstream sizes it
            // unconditionally, to the same length.
            file.set_len(SIZE as u64).map_err(io("size"))?;
        }
        if meta.uid() != nix::unistd::getuid().as_raw() {
            tracing::info!(registry = name, owner = meta.uid(), "the host endpoint registry belongs to another user");
        }
        let sem = sys::NamedSemaphore::open(&format!("/{name}_mtx")).map_err(io("open the semaphore of"))?;
        let base = sys::map_shared(file.as_fd(), SIZE).map_err(io("map"))?;
        let pid = std::process::id() as u64;
        let instance_id = (pid << 32) | u64::from(NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed));
        let mut reg = Self { base, sem, name: name.to_owned(), instance_id, attached: false, _file: file };
        {
            let l = reg.lock()?;
            match l.u32_at(at::VERSION) {
                0 => {
                    let host = nix::unistd::gethostname().map(|h| h.into_encoded_bytes()).unwrap_or_default();
                    let mut field = [0u8; NAME_LEN];
                    let n = host.len().min(NAME_LEN - 1);
                    field[..n].copy_from_slice(&host[..n]);
                    l.set_bytes(at::HOSTNAME, &field);
                    l.set_u32(at::MAX, MAX_ENTRIES as u32);
                    l.set_u32(at::COUNT, 0);
                    for i in 0..MAX_ENTRIES {
                        l.set_u8(l.entry(i) + at::ACTIVE, 0);
                    }
                    l.set_u32(at::VERSION, 1);
                }
                1 => {
                    l.purge_dead();
                }
                v => return Err(untrusted(format!("layout version {v}, this reads 1"))),
            }
        }
        reg.attached = true;
        Ok(reg)
    }

    /// The registry's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This handle's instance id (`pid << 32 | n`).
    pub fn instance_id(&self) -> u64 {
        self.instance_id
    }

    fn lock(&self) -> Result<Locked<'_>, RegistryError> {
        if self.sem.wait(LOCK_WAIT) { Ok(Locked(self)) } else { Err(RegistryError::LockTimeout) }
    }

    /// Writes an active entry for `gid` under this handle's instance id: over an entry
    /// of the same GID, else into the first inactive one, else a new one.
    ///
    /// # Errors
    /// [`RegistryError::LockTimeout`], [`RegistryError::Full`].
    pub fn register(
        &self,
        gid: [u8; 16],
        kind: EndpointKind,
        device_id: i32,
        ipc_capable: bool,
        name: &str,
    ) -> Result<(), RegistryError> {
        let l = self.lock()?;
        let n = l.count();
        let slot = (0..n)
            .find(|&i| l.gid(i) == gid)
            .or_else(|| (0..n).find(|&i| !l.active(i)))
            .or_else(|| (n < MAX_ENTRIES).then_some(n))
            .ok_or(RegistryError::Full)?;
        let uid = our_uid();
        let ep = Endpoint {
            instance_id: self.instance_id,
            gid,
            kind: kind as u8,
            device_id,
            uid,
            ipc_capable,
            name: name.into(),
        };
        l.write(slot, &ep);
        if slot == n {
            l.set_u32(at::COUNT, (n + 1) as u32);
        }
        Ok(())
    }

    /// Marks this handle's entry for `gid` inactive; whether there was one.
    ///
    /// # Errors
    /// [`RegistryError::LockTimeout`].
    pub fn unregister(&self, gid: [u8; 16]) -> Result<bool, RegistryError> {
        let l = self.lock()?;
        let found = (0..l.count()).find(|&i| l.active(i) && l.gid(i) == gid && l.instance(i) == self.instance_id);
        if let Some(i) = found {
            l.set_u8(l.entry(i) + at::ACTIVE, 0);
        }
        Ok(found.is_some())
    }

    /// The active entry for `gid`, if any.
    ///
    /// # Errors
    /// [`RegistryError::LockTimeout`].
    pub fn lookup(&self, gid: [u8; 16]) -> Result<Option<Endpoint>, RegistryError> {
        let l = self.lock()?;
        Ok((0..l.count()).find(|&i| l.active(i) && l.gid(i) == gid).map(|i| l.read(i)))
    }

    /// Every active entry.
    ///
    /// # Errors
    /// [`RegistryError::LockTimeout`].
    pub fn active(&self) -> Result<Vec<Endpoint>, RegistryError> {
        let l = self.lock()?;
        Ok((0..l.count()).filter(|&i| l.active(i)).map(|i| l.read(i)).collect())
    }
}

impl Drop for HostRegistry {
    fn drop(&mut self) {
        if !self.attached {
            // SAFETY: the whole mapping of `open_named`, not used after this.
            unsafe { sys::unmap(self.base, SIZE) };
            return;
        }
        let Ok(l) = self.lock() else {
            tracing::warn!(registry = %self.name, "registry semaphore not free: our entries stay until purged");
            // SAFETY: the whole mapping of `open_named`, not used after this.
            unsafe { sys::unmap(self.base, SIZE) };
            return;
        };
        for i in 0..l.count() {
            if l.active(i) && l.instance(i) == self.instance_id {
                l.set_u8(l.entry(i) + at::ACTIVE, 0);
            }
        }
        l.purge_dead();
        let empty = (0..l.count()).all(|i| !l.active(i));
        drop(l);
        // SAFETY: as above.
        unsafe { sys::unmap(self.base, SIZE) };
        if empty {
            let _ = std::fs::remove_file(PathBuf::from("/dev/shm").join(&self.name));
            sys::NamedSemaphore::unlink(&format!("/{}_mtx", self.name));
        }
    }
}
