//! The CUDA layer: RAII owners over the driver API, and nothing about Zenoh.
//!
//! - `sys` (internal): every raw driver call, each returning [`CudaError`] that names
//!   the call.
//! - [`Gpu`]: probing, UUID identity, primary context; [`Stream`]s on it.
//! - [`vmm`]: physical allocations, VA ranges, mappings; [`DeviceBlock`] (allocated
//!   here, FD exported once) and [`ImportedBlock`] (from a peer's FD).
//! - [`copy`]: copies and fills on a stream, each binding the stream's context.
//! - [`topology`]: the visible GPUs by UUID, and which can map which (peer access).
//! - [`event`]: [`Fence`]s, [`Filling`] (a copy's destination until its fence),
//!   [`IpcEvent`]s and the 64-bit stream memory operations.
//! - `kernels` (feature `test-kernels`): small PTX kernels (fill/check a pattern, spin)
//!   used by the examples, tests and benchmarks.
//!
//! Nothing here panics when no driver is installed: [`Gpu::probe`] checks for the
//! library before any other call and reports [`ProbeError::NoDriver`].
//!
//! ```no_run
//! use zcs_memory::cuda::{DeviceBlock, Gpu, ImportedBlock};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = Gpu::probe()?;
//! let block = DeviceBlock::allocate(&gpu, 3 << 20)?;        // rounded to 4 MiB
//! let fd = block.fd().try_clone_to_owned()?;                 // what a peer receives
//! let imported = ImportedBlock::import(&gpu, fd, block.size())?;
//! assert_eq!(imported.size(), block.size());
//! # Ok(()) }
//! ```

pub mod copy;
pub mod device;
pub mod event;
#[cfg(feature = "test-kernels")]
pub mod kernels;
pub mod pinned;
pub mod stream;
pub mod sys;
pub mod topology;
pub mod vmm;

pub use device::{Gpu, GpuUuid, ProbeError};
pub use event::{Fence, Filling, IpcEvent};
#[cfg(feature = "test-kernels")]
pub use kernels::Kernels;
pub use stream::Stream;
pub use sys::CudaError;
pub use topology::Topology;
pub use vmm::{DeviceBlock, ImportedBlock, VmmMapping, warm_import_path};
