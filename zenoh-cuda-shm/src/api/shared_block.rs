//! A published device block kept out of its pool for readers the pool cannot see: the
//! subscribers of another transport that maps the block (ROS 2's CUDA buffer backend,
//! through `zenoh-cuda-shm-ros2`). The pool reuses the block only once every handle is
//! gone, as for any other hold.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Weak};

use crate::pool::{BlockMemory, CudaBackend, Published};

/// A device block of a [`GpuPublisher`](super::GpuPublisher), published and held: its
/// pool does not reuse it while this handle (or a clone) lives. From
/// [`GpuPublisher::put_shared`](super::GpuPublisher::put_shared).
#[derive(Clone)]
pub struct SharedBlock(pub(super) Published<CudaBackend>);

impl std::fmt::Debug for SharedBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBlock").field("len", &self.len()).field("capacity", &self.capacity()).finish()
    }
}

impl SharedBlock {
    /// The FD of the whole allocation (a CUDA VMM shareable handle); the data starts at
    /// its first byte.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.memory().fd()
    }

    /// The allocation's size in bytes (what an importer maps).
    pub fn capacity(&self) -> usize {
        self.0.memory().size()
    }

    /// The published length.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the published length is zero (never: loans refuse zero).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The block's address in this process.
    pub fn device_ptr(&self) -> u64 {
        self.0.addr()
    }

    /// Which allocation this is: equal for every publish of the same allocation, never
    /// equal to an allocation made after this one was freed.
    pub fn allocation(&self) -> Allocation {
        Allocation::of(self.0.memory())
    }
}

/// A loan's device allocation as another transport needs it before the publish
/// ([`GpuLoan::device_allocation`](super::GpuLoan::device_allocation)).
#[derive(Debug)]
pub struct DeviceAllocation<'a> {
    /// Which allocation (the same as the published block's
    /// [`SharedBlock::allocation`]).
    pub allocation: Allocation,
    /// The FD of the whole allocation; the data starts at its first byte.
    pub fd: BorrowedFd<'a>,
    /// Its size in bytes.
    pub capacity: usize,
}

/// The identity of an allocation (see [`SharedBlock::allocation`]). Holding it does not
/// keep the memory allocated; it keeps its identity from being reused.
#[derive(Clone)]
pub struct Allocation(Weak<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation").field("id", &self.id()).field("live", &self.is_live()).finish()
    }
}

impl Allocation {
    pub(super) fn of<M: Send + Sync + 'static>(memory: &Arc<M>) -> Self {
        let weak: Weak<dyn std::any::Any + Send + Sync> = Arc::downgrade(memory) as _;
        Self(weak)
    }

    /// A number unique among the allocations whose [`Allocation`] is still held.
    pub fn id(&self) -> usize {
        self.0.as_ptr().cast::<()>() as usize
    }

    /// Whether the memory is still allocated.
    pub fn is_live(&self) -> bool {
        self.0.strong_count() > 0
    }
}

impl PartialEq for Allocation {
    fn eq(&self, other: &Self) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Allocation {}
