//! Copies out into Zenoh's shared memory (feature `zenoh-shm`, config
//! `zenoh_shm_out_bytes`). A publisher copies a message out once for the subscribers that
//! need bytes; with a pool here that copy lands in a Zenoh SHM buffer, which Zenoh hands
//! to peers of this host with shared memory on by reference, where it would otherwise
//! push the bytes through a socket. The pool's segment is registered with CUDA once, so
//! the device→host copy into it runs at pinned speed.
//!
//! Without the feature the type has no value: no session can hold one, and opening a
//! session that asks for a pool fails with [`ShmOutError::NotBuilt`].

/// Setting up the pool failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmOutError {
    /// `zenoh_shm_out_bytes` is set, and this build has no `zenoh-shm` feature.
    #[error("zenoh_shm_out_bytes is set, but this build lacks the zenoh-shm feature (Zenoh's shared memory)")]
    NotBuilt,
    /// Zenoh could not create the segment.
    #[error("Zenoh could not create a {bytes}-byte shared-memory segment: {why}")]
    Segment {
        /// The size asked for.
        bytes: usize,
        /// Zenoh's reason.
        why: String,
    },
    /// The segment could not be found among this process's mappings.
    #[error("cannot find the Zenoh segment among this process's mappings")]
    Mapping(#[source] std::io::Error),
    /// Registering the segment with CUDA failed.
    #[error("cannot register the Zenoh segment with CUDA")]
    Register(#[source] crate::cuda::CudaError),
}

#[cfg(feature = "zenoh-shm")]
pub use imp::ShmOut;

#[cfg(feature = "zenoh-shm")]
mod imp {
    use zenoh::Wait;
    use zenoh::shm::{
        AllocAlignment, GarbageCollect, PosixShmProviderBackend, ShmProvider, ShmProviderBuilder, ZShmMut,
    };

    use super::ShmOutError;
    use crate::cuda::Gpu;
    use crate::cuda::pinned::HostRegistration;

    /// Buffers start on 64-byte boundaries (`2^6`), a cache line.
    const ALIGN_POW: u8 = 6;

    /// A Zenoh SHM pool for copies out, its segment registered with CUDA where the
    /// session has a GPU. Fields drop in order: the registration before the provider
    /// (which unmaps the segment once the last buffer from it is gone too).
    pub struct ShmOut {
        registration: Option<HostRegistration>,
        provider: ShmProvider<PosixShmProviderBackend>,
    }

    impl ShmOut {
        /// A pool of `bytes`, its segment registered with `gpu`'s context where given.
        pub fn new(bytes: usize, gpu: Option<&Gpu>) -> Result<Self, ShmOutError> {
            let segment = |why: String| ShmOutError::Segment { bytes, why };
            let align = AllocAlignment::new(ALIGN_POW).map_err(|e| segment(format!("{e:?}")))?;
            let backend =
                PosixShmProviderBackend::builder((bytes, align)).wait().map_err(|e| segment(e.to_string()))?;
            let provider = ShmProviderBuilder::backend(backend).wait();
            let mut out = Self { registration: None, provider };
            let Some(gpu) = gpu else { return Ok(out) };
            // The segment is one mapping of this process: find it from a buffer in it.
            let probe = out.buffer(1).ok_or_else(|| segment("no room for a 1-byte buffer".into()))?;
            let m = crate::host::mapping_of(probe.as_ptr())
                .map_err(ShmOutError::Mapping)?
                .ok_or_else(|| ShmOutError::Mapping(std::io::Error::other("no mapping holds the probe")))?;
            // SAFETY: `m` is one whole mapping (the segment), registered once; the
            // provider keeps it mapped while it lives, and the registration is dropped
            // first (field order). Every copy into it is waited for before the buffer
            // is handed to Zenoh (a `Filling` that the bytes lane waits for).
            let reg =
                unsafe { HostRegistration::new(gpu, m.start as *mut u8, m.len) }.map_err(ShmOutError::Register)?;
            out.registration = Some(reg);
            Ok(out)
        }

        /// A buffer of `len` bytes, or `None` while the pool has no room for it (after
        /// collecting the buffers every receiver has dropped).
        pub fn buffer(&self, len: usize) -> Option<ZShmMut> {
            match self.provider.alloc(len).with_policy::<GarbageCollect>().wait() {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::debug!(len, error = ?e, "no room in the Zenoh SHM pool; copying out through staging");
                    None
                }
            }
        }
    }
}

/// Without the `zenoh-shm` feature: never constructed.
#[cfg(not(feature = "zenoh-shm"))]
pub enum ShmOut {}

#[cfg(not(feature = "zenoh-shm"))]
impl ShmOut {
    /// Always [`ShmOutError::NotBuilt`]: the library was built without `zenoh-shm`.
    pub fn new(_bytes: usize, _gpu: Option<&crate::cuda::Gpu>) -> Result<Self, ShmOutError> {
        Err(ShmOutError::NotBuilt)
    }
}
