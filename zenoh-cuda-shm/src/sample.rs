//! Received samples: metadata, the path that delivered them, and access to the data —
//! a read on the caller's CUDA stream, host bytes, or an owned copy.

use std::borrow::Cow;

pub use zcs_transport::sample::{Path, SampleInfo};
use zcs_transport::subscriber::Delivery;
pub use zcs_transport::subscriber::{DeviceRead, ForeignBlock, ReadError};

use crate::cuda::Stream;

/// A received message. Cheap to clone; a zero-copy sample's lease is released once
/// the last clone is gone and every read made through [`GpuSample::read`] has
/// completed on its stream.
///
/// Received from a [`GpuSubscriber`](crate::GpuSubscriber). Its data is read in place
/// on a CUDA stream ([`read`](GpuSample::read)), as host bytes
/// ([`host_bytes`](GpuSample::host_bytes)), or copied ([`to_vec`](GpuSample::to_vec)).
///
/// ```
/// use zenoh_cuda_shm::config::DeviceChoice;
/// use zenoh_cuda_shm::{GpuSession, Path, ZcsConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let mut zenoh = zenoh::Config::default();
/// # zenoh.insert_json5("scouting/multicast/enabled", "false")?;
/// let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
/// let session = GpuSession::open(zenoh, cfg).wait()?;
/// let subscriber = session.declare_subscriber("doc/sample").wait()?;
/// let publisher = session.declare_publisher("doc/sample").wait()?;
/// publisher.put_bytes(&vec![3u8; 1 << 20])?; // above the inline threshold: a block
///
/// let sample = subscriber.recv()?;
/// assert_eq!(sample.len(), 1 << 20);
/// println!("seq {} by the {} path", sample.seq(), sample.path());
/// match session.gpu() {
///     Some(gpu) => {
///         let stream = gpu.new_stream()?;
///         let read = sample.read(&stream)?; // kernels on `stream` may read read.device_ptr()
///         read.end()?;
///     }
///     None => assert!(sample.host_bytes().is_some_and(|b| b.iter().all(|&x| x == 3))),
/// }
/// assert_eq!(sample.to_vec()?.len(), 1 << 20);
/// # let _ = Path::ZeroCopy;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct GpuSample(Delivery);

impl GpuSample {
    pub(crate) fn new(delivery: Delivery) -> Self {
        Self(delivery)
    }

    /// The transport's delivery, for the tensor, DLPack and ROS 2 layers.
    pub(crate) fn delivery(&self) -> &Delivery {
        &self.0
    }

    /// Metadata.
    pub fn info(&self) -> &SampleInfo {
        self.0.info()
    }

    /// The path that delivered this sample.
    pub fn path(&self) -> Path {
        self.0.path()
    }

    /// The publisher's sequence number.
    pub fn seq(&self) -> u64 {
        self.0.seq()
    }

    /// Payload length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The payload as host bytes, without a copy where possible: bytes paths and
    /// zero-copy host blocks borrow; device blocks return `None` (use
    /// [`GpuSample::read`] or [`GpuSample::to_vec`]).
    pub fn host_bytes(&self) -> Option<Cow<'_, [u8]>> {
        self.0.host_bytes()
    }

    /// An owned host copy of the payload (a device→host copy for device blocks,
    /// ordered after the publisher's ready signal).
    ///
    /// # Errors
    /// [`ReadError`]: a CUDA call or the ordering failed, or the publisher died before
    /// the block was ready.
    pub fn to_vec(&self) -> Result<Vec<u8>, ReadError> {
        self.0.to_vec()
    }

    /// The payload in device memory, readable by work enqueued on `stream` after this
    /// call. Zero-copy samples: `stream` waits for the publisher's ready signal (no
    /// host wait). Bytes samples: staged in pinned memory by this call (a CPU copy),
    /// then copied host→device on `stream` (no host wait for that copy); the device
    /// copy and the staging are recycled once `stream` has passed the reads. Works with
    /// any stream, the legacy default stream included.
    ///
    /// # Errors
    /// [`ReadError::NoGpu`] in a host-memory session; otherwise a CUDA call or the
    /// ordering failed, or the publisher died before the block was ready.
    ///
    /// # Panics
    /// Does not panic: the one `unreachable!` on this path (a CUDA session's sample in a
    /// host block) cannot be reached, as a CUDA subscriber imports device blocks only.
    pub fn read(&self, stream: &Stream) -> Result<DeviceRead<'_>, ReadError> {
        self.0.read(stream)
    }
}
