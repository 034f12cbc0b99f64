//! Tensors on top of the GPU pub/sub: publish a buffer together with its DLPack
//! description ([`TensorMeta`]), and take what arrives as a tensor — read in place on a
//! CUDA stream ([`TensorView`]), borrowed as host bytes ([`HostTensor`]), or copied out
//! ([`OwnedTensor`], or a device→device copy into a block the caller owns).
//!
//! The description travels as the sample's typed metadata ([`crate::SampleInfo::meta`]):
//! the output of [`TensorMeta::encode`], a version byte then a postcard body. Publishers
//! validate it against the payload length before anything is sent; receivers decode and
//! validate it again against the length they actually received
//! ([`GpuSample::tensor_meta`]). A description that does not fit its payload, or bytes
//! that are not a description at all, are typed errors naming the field, never an
//! out-of-bounds view and never a panic.
//!
//! Where the payload lives must match the description's device: `kDLCUDA` with the
//! publisher's ordinal for CUDA publishers, `kDLCPU` for host-memory publishers. A
//! receiver on another device or host still gets the description unchanged (it says
//! where the publisher's copy lives); where *its* copy lives is what the views below and
//! [`GpuSample::dlpack_device`] report.
//!
//! ```no_run
//! use zenoh_cuda_shm::config::DeviceChoice;
//! use zenoh_cuda_shm::tensor_codec::{DType, Device, TensorMeta};
//! use zenoh_cuda_shm::{GpuSession, ZcsConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() };
//! let session = GpuSession::open(zenoh::Config::default(), cfg).wait()?;
//! let subscriber = session.declare_subscriber("demo/tensor").wait()?;
//! let publisher = session.declare_publisher("demo/tensor").wait()?;
//!
//! // A 2x3 float32 tensor from host memory (a CUDA session takes device memory with
//! // `put_tensor_from_device`, or a loan written by kernels with `put_tensor`).
//! let values: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
//! publisher.put_tensor_from_host(&values, &TensorMeta::contiguous(DType::F32, vec![2, 3], Device::CPU))?;
//!
//! let sample = subscriber.recv()?;
//! let meta = sample.tensor_meta()?.expect("a tensor description"); // decoded and validated
//! assert_eq!(meta.shape, [2, 3]);
//! let owned = sample.to_owned_tensor()?; // host bytes + description, offset 0
//! assert_eq!(owned.contiguous_bytes(), values);
//! # Ok(()) }
//! ```

use std::borrow::Cow;

use tensor_codec::{DType, DecodeError, Device, DeviceType, EncodeError, Extent, TensorMeta};

use crate::api::{GpuLoan, GpuPublisher, PublishError, WriteError};
use crate::cuda::{CudaError, DeviceBlock, Stream, copy};
use crate::pool::{BackendKind, LoanError};
use crate::sample::{DeviceRead, GpuSample, ReadError};
use crate::transport::publisher::{PutError, PutReport};

/// Publishing a tensor failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorPublishError {
    /// The description is invalid or does not fit the payload (nothing was sent). For
    /// [`GpuPublisher::put_tensor`] the loan comes back in `loan`.
    #[error("tensor description refused")]
    Invalid {
        /// What [`TensorMeta::encode`] found wrong, naming the field.
        #[source]
        source: EncodeError,
        /// The loan handed to [`GpuPublisher::put_tensor`], unpublished.
        loan: Option<Box<GpuLoan>>,
    },
    /// The description's device is not where this publisher's payload lives (nothing
    /// was sent). For [`GpuPublisher::put_tensor`] the loan comes back in `loan`.
    #[error("the description says the tensor is on {device}, but this publisher's payload lives in {backend} memory{}", of_gpu(.ordinal))]
    DeviceMismatch {
        /// The description's device.
        device: Device,
        /// Where this publisher's blocks live.
        backend: BackendKind,
        /// The local CUDA ordinal of the payload, when known.
        ordinal: Option<usize>,
        /// The loan handed to [`GpuPublisher::put_tensor`], unpublished.
        loan: Option<Box<GpuLoan>>,
    },
    /// A device-memory source needs a CUDA publisher.
    #[error(
        "this publisher has no GPU (host-memory blocks; its session's host_reason says why): publish a host tensor \
         instead, or open the session on a GPU"
    )]
    NoGpu,
    /// No block could be loaned.
    #[error(transparent)]
    Loan(#[from] LoanError),
    /// Copying into the block failed.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The put failed.
    #[error(transparent)]
    Put(#[from] PutError),
}

/// Publishing the payload as host bytes failed the way a plain publish does: the same
/// variants, one error type for every tensor publish.
impl From<PublishError> for TensorPublishError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::NoGpu => Self::NoGpu,
            PublishError::Loan(e) => Self::Loan(e),
            PublishError::Write(e) => Self::Write(e),
            PublishError::Put(e) => Self::Put(e),
        }
    }
}

impl TensorPublishError {
    /// The unpublished loan, for errors of [`GpuPublisher::put_tensor`] raised before the
    /// put.
    pub fn into_loan(self) -> Option<GpuLoan> {
        match self {
            Self::Invalid { loan, .. } | Self::DeviceMismatch { loan, .. } => loan.map(|l| *l),
            _ => None,
        }
    }
}

/// Reading a received sample as a tensor failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorReadError {
    /// The sample carries no metadata (it was not published as a tensor).
    #[error("the sample carries no tensor description")]
    NoMeta,
    /// The metadata is not a valid description of this payload (see [`DecodeError`]).
    #[error("invalid tensor description")]
    Meta(#[from] DecodeError),
    /// The payload is in device memory; use [`GpuSample::tensor_view`] or
    /// [`GpuSample::to_owned_tensor`].
    #[error("the payload is in device memory, not host memory")]
    NotHostMemory,
    /// The destination block is smaller than the bytes the view touches.
    #[error("the view touches {needed} bytes but the destination holds {available}")]
    DestinationTooSmall {
        /// Bytes the view touches, from its first element.
        needed: u64,
        /// Size of the destination block.
        available: u64,
    },
    /// Reading the payload failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

fn of_gpu(ordinal: &Option<usize>) -> String {
    ordinal.map(|o| format!(" of GPU {o}")).unwrap_or_default()
}

impl GpuPublisher {
    /// Whether `meta.device` is where this publisher's payload lives: `kDLCUDA` (with
    /// `ordinal`, when known) for CUDA publishers, `kDLCPU` for host-memory ones.
    fn device_matches(&self, meta: &TensorMeta, ordinal: Option<usize>) -> bool {
        match self.backend() {
            BackendKind::CudaVmm => {
                meta.device.device_type == DeviceType::Cuda
                    && ordinal.is_none_or(|o| i64::from(meta.device.device_id) == o as i64)
            }
            BackendKind::HostMemfd => meta.device.device_type == DeviceType::Cpu,
        }
    }

    /// Publishes a loan written by the caller as the tensor `meta` describes: the
    /// description is validated against the loaned length (the payload every subscriber
    /// receives) and travels as the sample's metadata.
    ///
    /// # Errors
    /// [`TensorPublishError::Invalid`] or [`TensorPublishError::DeviceMismatch`] before
    /// anything is sent (the loan comes back: [`TensorPublishError::into_loan`]);
    /// [`TensorPublishError::Put`] when the put fails.
    pub fn put_tensor(&self, mut loan: GpuLoan, meta: &TensorMeta) -> Result<PutReport, TensorPublishError> {
        let ordinal = loan.stream().map(|s| s.ordinal());
        if !self.device_matches(meta, ordinal) {
            let backend = self.backend();
            return Err(TensorPublishError::DeviceMismatch {
                device: meta.device,
                backend,
                ordinal,
                loan: Some(Box::new(loan)),
            });
        }
        match meta.encode(loan.len() as u64) {
            Ok(wire) => loan.set_meta(wire),
            Err(source) => return Err(TensorPublishError::Invalid { source, loan: Some(Box::new(loan)) }),
        }
        Ok(self.put(loan)?)
    }

    /// Publishes host bytes as the tensor `meta` describes (inline below the inline
    /// threshold, else through a block: a host→device copy for CUDA publishers).
    ///
    /// # Errors
    /// [`TensorPublishError::Invalid`] when `meta` does not fit `data.len()` bytes,
    /// [`TensorPublishError::DeviceMismatch`] when its device is not this publisher's
    /// kind of memory; nothing is sent then. Otherwise as
    /// [`GpuPublisher::put_bytes_meta`].
    pub fn put_tensor_from_host(&self, data: &[u8], meta: &TensorMeta) -> Result<PutReport, TensorPublishError> {
        if !self.device_matches(meta, None) {
            let backend = self.backend();
            return Err(TensorPublishError::DeviceMismatch { device: meta.device, backend, ordinal: None, loan: None });
        }
        let wire =
            meta.encode(data.len() as u64).map_err(|source| TensorPublishError::Invalid { source, loan: None })?;
        Ok(self.put_bytes_meta(data, Some(wire))?)
    }

    /// Publishes `payload_len` bytes of device memory at `src` as the tensor `meta`
    /// describes: a device→device copy on `stream` into a loaned block, with the ready
    /// signal after the copy. Returns once the copy is enqueued (the caller's stream is
    /// not waited for). An empty payload goes inline.
    ///
    /// # Safety
    /// `src..src + payload_len` is device memory of this publisher's GPU, readable by
    /// work on `stream` and left unchanged until `stream` has passed this copy.
    ///
    /// # Errors
    /// [`TensorPublishError::NoGpu`] for host-memory publishers;
    /// [`TensorPublishError::Invalid`] / [`TensorPublishError::DeviceMismatch`] before
    /// anything is enqueued; loan, copy and put failures otherwise.
    pub unsafe fn put_tensor_from_device(
        &self,
        src: u64,
        meta: &TensorMeta,
        payload_len: usize,
        stream: &Stream,
    ) -> Result<PutReport, TensorPublishError> {
        if self.backend() != BackendKind::CudaVmm {
            return Err(TensorPublishError::NoGpu);
        }
        let ordinal = Some(stream.ordinal());
        if !self.device_matches(meta, ordinal) {
            let backend = self.backend();
            return Err(TensorPublishError::DeviceMismatch { device: meta.device, backend, ordinal, loan: None });
        }
        let wire =
            meta.encode(payload_len as u64).map_err(|source| TensorPublishError::Invalid { source, loan: None })?;
        if payload_len == 0 {
            return Ok(self.put_bytes_meta(&[], Some(wire))?);
        }
        let mut loan = self.loan_on(payload_len, stream)?;
        let dst = loan.device_ptr().ok_or(TensorPublishError::NoGpu)?;
        // SAFETY: `dst` is the loaned block (≥ payload_len bytes, mapped on this device and
        // owned by the loan until the put); the source range is the caller's contract. A
        // failed put drops the loan, which returns the block only after this stream's work.
        unsafe { copy::device_to_device(stream, dst, src, payload_len) }?;
        loan.set_meta(wire);
        Ok(self.put(loan)?)
    }
}

/// A received tensor's view, resolved: the validated description, its explicit strides
/// and the bytes it touches.
#[derive(Debug, Clone)]
struct Resolved {
    meta: TensorMeta,
    strides: Vec<i64>,
    extent: Extent,
}

impl Resolved {
    fn of(sample: &GpuSample) -> Result<Self, TensorReadError> {
        let meta = sample.tensor_meta()?.ok_or(TensorReadError::NoMeta)?;
        // `decode` ran the validator against this length already; this only recovers
        // the extent and cannot fail differently.
        let extent = meta.validate(sample.len() as u64).map_err(DecodeError::from)?;
        let strides = meta.effective_strides().map_err(DecodeError::from)?;
        Ok(Self { meta, strides, extent })
    }

    /// Byte range of the payload the view touches: `byte_offset..end`.
    fn range(&self) -> std::ops::Range<usize> {
        // Both fit: they were checked against the payload length, a `usize`.
        self.extent.end as usize - self.extent.bytes as usize..self.extent.end as usize
    }

    /// The description of the same view copied to offset 0, with explicit strides.
    fn rebased(&self) -> TensorMeta {
        TensorMeta { strides: self.strides.clone(), byte_offset: 0, ..self.meta.clone() }
    }
}

impl GpuSample {
    /// The tensor description sent with this sample, decoded and validated against the
    /// payload length received ([`TensorMeta::decode`]). `Ok(None)` when the sample
    /// carries no metadata.
    ///
    /// # Errors
    /// The [`DecodeError`] naming what is wrong: empty or unknown-version metadata, a
    /// malformed body, an unsupported dtype or device, or a view that does not fit the
    /// payload. Never panics, whatever the metadata holds.
    pub fn tensor_meta(&self) -> Result<Option<TensorMeta>, DecodeError> {
        match &self.info().meta {
            None => Ok(None),
            Some(bytes) => TensorMeta::decode(bytes, self.len() as u64).map(Some),
        }
    }

    /// The tensor in device memory, readable by work enqueued on `stream` after this
    /// call: in place for zero-copy samples (`stream` waits for the publisher's ready
    /// signal; no host wait, no copy), staged host→device on `stream` for bytes samples.
    /// End the view (or drop it) after enqueueing the reads.
    ///
    /// # Errors
    /// [`TensorReadError::NoMeta`] / [`TensorReadError::Meta`] for a missing or invalid
    /// description; [`TensorReadError::Read`] as [`GpuSample::read`] (e.g. a host-memory
    /// session).
    pub fn tensor_view(&self, stream: &Stream) -> Result<TensorView<'_>, TensorReadError> {
        let r = Resolved::of(self)?;
        let read = self.read(stream)?;
        Ok(TensorView { meta: r.meta, strides: r.strides, extent: r.extent, read })
    }

    /// The tensor as host memory, without a copy where the payload already is in host
    /// memory (bytes paths, zero-copy host blocks).
    ///
    /// # Errors
    /// [`TensorReadError::NotHostMemory`] for device blocks (use
    /// [`GpuSample::tensor_view`] or [`GpuSample::to_owned_tensor`]); description errors
    /// as [`GpuSample::tensor_view`].
    pub fn host_tensor(&self) -> Result<HostTensor<'_>, TensorReadError> {
        let r = Resolved::of(self)?;
        let bytes = self.host_bytes().ok_or(TensorReadError::NotHostMemory)?;
        Ok(HostTensor { range: r.range(), meta: r.meta, strides: r.strides, bytes })
    }

    /// An owned host copy of the bytes the view touches, with its description rebased to
    /// offset 0 (explicit strides, same shape and dtype): what ROS `torch_conversions`
    /// gives with `clone = true`. Device blocks are copied device→host on a stream of
    /// their own, ordered after the publisher's ready signal, and waited for.
    ///
    /// # Errors
    /// Description errors as [`GpuSample::tensor_view`]; read and CUDA failures.
    pub fn to_owned_tensor(&self) -> Result<OwnedTensor, TensorReadError> {
        let r = Resolved::of(self)?;
        let range = r.range();
        let data = match self.host_bytes() {
            Some(bytes) => bytes[range].to_vec(),
            None => {
                let gpu = self.delivery().subscriber_gpu().ok_or(ReadError::NoGpu)?;
                let stream = gpu.new_stream()?;
                let read = self.read(&stream)?;
                let mut out = vec![0u8; range.len()];
                // SAFETY: `range` lies inside the payload (validated), which `read` keeps
                // mapped, ordered after the ready signal on `stream`, until it ends after
                // the copy has completed.
                unsafe { copy::device_to_host(&stream, read.device_ptr() + range.start as u64, &mut out) }?;
                read.end()?;
                out
            }
        };
        Ok(OwnedTensor { meta: r.rebased(), data })
    }

    /// Copies the bytes the view touches into `dst` (from its first byte), device→device
    /// on `stream` after the publisher's ready signal (or host→device for bytes samples),
    /// and returns the description of the copy (offset 0, explicit strides). Returns
    /// once the copy is enqueued: work on `stream` afterwards sees it. Like
    /// `torch_conversions`' `from_input_tensor_msg(msg, clone = true)`, on the GPU.
    ///
    /// # Errors
    /// [`TensorReadError::DestinationTooSmall`] when `dst` cannot hold the view;
    /// description, read and CUDA errors otherwise.
    pub fn copy_tensor_to_device(&self, dst: &DeviceBlock, stream: &Stream) -> Result<TensorMeta, TensorReadError> {
        let r = Resolved::of(self)?;
        if r.extent.bytes > dst.size() as u64 {
            return Err(TensorReadError::DestinationTooSmall { needed: r.extent.bytes, available: dst.size() as u64 });
        }
        let range = r.range();
        let read = self.read(stream)?;
        // SAFETY: the source lies inside the payload (validated), mapped and ordered on
        // `stream` by `read`; `dst` is a mapped block of this device with ≥ range.len()
        // bytes (checked above) that the caller owns.
        unsafe {
            copy::device_to_device(stream, dst.device_ptr(), read.device_ptr() + range.start as u64, range.len())
        }?;
        read.end()?;
        Ok(r.rebased())
    }
}

/// A received tensor in device memory, ordered on a stream ([`GpuSample::tensor_view`]).
///
/// [`TensorView::data_ptr`] is the address of the first element (the payload's address
/// plus `byte_offset`). End the view after enqueueing the reads: the sample's lease is
/// released only once the GPU has passed them.
#[derive(Debug)]
pub struct TensorView<'a> {
    meta: TensorMeta,
    strides: Vec<i64>,
    extent: Extent,
    read: DeviceRead<'a>,
}

impl TensorView<'_> {
    /// The validated description (as sent: its `byte_offset` is relative to the payload).
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// Device address of the first element: the payload's address plus `byte_offset`.
    pub fn data_ptr(&self) -> u64 {
        self.read.device_ptr() + self.meta.byte_offset
    }

    /// Device address of the payload's first byte.
    pub fn payload_ptr(&self) -> u64 {
        self.read.device_ptr()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }

    /// Dimensions.
    pub fn shape(&self) -> &[i64] {
        &self.meta.shape
    }

    /// Strides in elements, always explicit (compact row-major when the description
    /// left them empty).
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// Bytes the view touches from [`TensorView::data_ptr`].
    pub fn nbytes(&self) -> u64 {
        self.extent.bytes
    }

    /// The stream the view is ordered on.
    pub fn stream(&self) -> &Stream {
        self.read.stream()
    }

    /// Ends the view: records the fence after the reads enqueued so far.
    ///
    /// # Errors
    /// When the fence cannot be recorded (the view's `Drop` then waits for the stream).
    pub fn end(self) -> Result<(), CudaError> {
        self.read.end()
    }
}

/// A received tensor in host memory ([`GpuSample::host_tensor`]).
#[derive(Debug)]
pub struct HostTensor<'a> {
    meta: TensorMeta,
    strides: Vec<i64>,
    bytes: Cow<'a, [u8]>,
    range: std::ops::Range<usize>,
}

impl HostTensor<'_> {
    /// The validated description (as sent: its `byte_offset` is relative to the payload).
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The bytes the view touches, from its first element.
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.range.clone()]
    }

    /// The whole payload.
    pub fn payload(&self) -> &[u8] {
        &self.bytes
    }

    /// Strides in elements, always explicit.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// The elements in row-major order, packed (a gather through the strides).
    pub fn contiguous_bytes(&self) -> Vec<u8> {
        gather(&self.meta, &self.strides, self.data())
    }
}

/// An owned host copy of a received tensor ([`GpuSample::to_owned_tensor`]): the bytes
/// the view touches and its description at offset 0 with explicit strides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedTensor {
    meta: TensorMeta,
    data: Vec<u8>,
}

impl OwnedTensor {
    /// The description of `data` (offset 0, explicit strides).
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The bytes, from the first element.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The description and the bytes.
    pub fn into_parts(self) -> (TensorMeta, Vec<u8>) {
        (self.meta, self.data)
    }

    /// The elements in row-major order, packed (a gather through the strides).
    pub fn contiguous_bytes(&self) -> Vec<u8> {
        gather(&self.meta, &self.meta.strides, &self.data)
    }
}

/// Gathers the elements of a validated view in row-major order. `data` starts at the
/// first element; `strides` are explicit. Sub-byte types are compact (the validator
/// requires it), so their packed bytes are already in order.
fn gather(meta: &TensorMeta, strides: &[i64], data: &[u8]) -> Vec<u8> {
    let numel = meta.numel().unwrap_or(0);
    let Some(itemsize) = meta.dtype.itemsize() else {
        let n = meta.dtype.storage_bytes(numel).unwrap_or(0).min(data.len() as u64) as usize;
        return data[..n].to_vec();
    };
    let itemsize = itemsize as usize;
    let mut out = Vec::with_capacity(numel as usize * itemsize);
    if numel == 0 {
        return out;
    }
    let rank = meta.shape.len();
    let mut index = vec![0i64; rank];
    loop {
        // In bounds: the validator checked the span of every index against the payload.
        let elem: i64 = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        let at = elem as usize * itemsize;
        out.extend_from_slice(&data[at..at + itemsize]);
        // Odometer, last dimension fastest.
        let mut d = rank;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < meta.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_walks_strides_row_major() {
        // A 4x8 int32 buffer holding its own linear index; view rows 1..3 (every other
        // row), columns 1, 3, 5, 7.
        let buf: Vec<u8> = (0..32i32).flat_map(|v| v.to_le_bytes()).collect();
        let meta = TensorMeta::contiguous(DType::I32, vec![2, 4], Device::CPU)
            .with_strides(vec![16, 2])
            .with_byte_offset(4 * 9);
        let extent = meta.validate(buf.len() as u64).unwrap();
        let data = &buf[meta.byte_offset as usize..extent.end as usize];
        let got: Vec<i32> =
            gather(&meta, &meta.strides, data).chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, [9, 11, 13, 15, 25, 27, 29, 31]);
    }

    #[test]
    fn gather_scalar_zero_size_and_sub_byte() {
        let scalar = TensorMeta::contiguous(DType::I16, Vec::<i64>::new(), Device::CPU);
        assert_eq!(gather(&scalar, &[], &[7, 1]), [7, 1]);
        let empty = TensorMeta::contiguous(DType::F32, vec![3, 0], Device::CPU);
        assert!(gather(&empty, &[1, 1], &[]).is_empty());
        let fp4 = TensorMeta::contiguous(DType::F4_E2M1FN, vec![3], Device::CPU);
        assert_eq!(gather(&fp4, &[1], &[0x21, 0x03]), [0x21, 0x03]);
    }
}
