//! The DLPack C ABI: export received tensors to frameworks, and publish tensors that
//! frameworks export.
//!
//! # Structs
//! [`DLDevice`], [`DLDataType`], [`DLTensor`], [`DLPackVersion`], [`DLManagedTensor`]
//! (legacy, deprecated since DLPack 0.8 but still the only one JAX imports) and
//! [`DLManagedTensorVersioned`] (v1.x), `#[repr(C)]` with their layout asserted at
//! compile time. Owned pointers to either managed struct are [`ManagedTensorVersioned`]
//! and [`ManagedTensorLegacy`]: they call the struct's deleter exactly once, on drop,
//! unless handed off with `into_raw`.
//!
//! # Export ([`GpuSample::to_dlpack_versioned`](crate::GpuSample::to_dlpack_versioned), [`GpuSample::to_dlpack_legacy`](crate::GpuSample::to_dlpack_legacy))
//! - One heap allocation per export holds the managed struct, the shape and strides
//!   arrays and the manager context; `manager_ctx` points at it and the deleter frees it.
//! - `data` is the payload's address plus the description's `byte_offset`, and the
//!   `byte_offset` field is 0: older PyTorch and cuda-python ignored the field (pytorch
//!   #168177), so the offset is folded, as IREE does.
//! - Strides are always explicit (DLPack v1.2+); `shape`/`strides` are NULL only for
//!   `ndim == 0`.
//! - The device is `kDLCUDA` with the subscriber's local ordinal for CUDA sessions
//!   (bytes samples are first copied host→device into a private block), `kDLCPU` for
//!   host-memory sessions.
//! - Flags (versioned only): `READ_ONLY` for in-place exports — the block is the
//!   publisher's and other subscribers read it too — and `IS_COPIED` (never with
//!   `READ_ONLY`) only when the export owns a private copy.
//! - DLPack's `copy` and `dl_device` requests ([`ExportOptions`], the `*_with` exports):
//!   `copy: true` always exports a private copy, `copy: false` refuses where in-place
//!   export is impossible, and a host export of a CUDA sample is a device→host copy.
//!
//! # Streams and the lease
//! The consumer names its stream as DLPack does ([`ConsumerStream::from_dlpack`]: `1` the
//! legacy default stream, `2` the per-thread default stream, `-1` no synchronisation,
//! `0` an error, anything else a `CUstream`). Before the export returns, a wait for the
//! publisher's ready signal is enqueued on that stream, so the consumer's work on it sees
//! the data; the host never waits. The manager context owns a clone of the sample, which
//! keeps its lease, and the consumer stream. The deleter (an `extern "C"` function that
//! never unwinds) records a fence on the consumer stream and hands it to the
//! subscriber's releaser: the lease goes back to the publisher only once the GPU has
//! passed every read the consumer enqueued before calling the deleter.
//!
//! With `-1` no stream is known: the export then waits on the host until the data is
//! ready, and the deleter waits for the whole context before it releases the lease. The
//! per-thread default stream belongs to the thread that exported; a deleter running on
//! another thread also falls back to a context-wide wait.
//!
//! # Import ([`GpuPublisher::put_dlpack`](crate::GpuPublisher::put_dlpack))
//! A framework's tensor (versioned or legacy) is validated — version major 1, known
//! flags, rank ≤ 64, non-null shape, a whitelisted dtype, the [`TensorMeta`](tensor_codec::TensorMeta) rules, an
//! aligned data pointer, a device this publisher can read — then the bytes its view
//! touches are copied into a loaned block (device→device on the caller's stream for
//! `kDLCUDA` on this publisher's GPU; host bytes for `kDLCPU`) and published with the
//! description. Its deleter is called once the copy has completed, never before.
//!
//! ```no_run
//! use zenoh_cuda_shm::dlpack::{ConsumerStream, DLPACK_FLAG_BITMASK_READ_ONLY};
//! use zenoh_cuda_shm::{GpuSession, ZcsConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let session = GpuSession::open(zenoh::Config::default(), ZcsConfig::default()).wait()?;
//! let subscriber = session.declare_subscriber("demo/tensor").wait()?;
//! let stream = session.gpu().expect("a CUDA session").new_stream()?;
//!
//! let sample = subscriber.recv()?;
//! // `stream` now waits for the publisher's ready signal; the host does not.
//! let managed = sample.to_dlpack_versioned(&ConsumerStream::stream(&stream))?;
//! let m = managed.get().expect("version 1.x");
//! assert_eq!(m.dl_tensor.byte_offset, 0); // folded into `data`
//! assert_ne!(m.flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
//! // Hand the pointer to a consumer; its deleter ends the read and releases the lease.
//! let raw = managed.into_raw();
//! # // SAFETY: `raw` came from `into_raw` and is deleted once.
//! # unsafe { ((*raw).deleter.unwrap())(raw) };
//! # Ok(()) }
//! ```

mod abi;
mod export;
mod import;
mod managed;
mod stream;
#[cfg(test)]
mod tests;

pub use abi::*;
pub use export::*;
pub use import::*;
pub use managed::*;
pub use stream::*;
pub use tensor_codec::DLDataType;

use abi::KNOWN_FLAGS;
use stream::{EndOn, StreamKind};
