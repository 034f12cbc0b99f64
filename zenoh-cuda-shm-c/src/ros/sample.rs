//! Received ROS messages: their fields, their attachment, and their data where it
//! arrived (our channel's sample, or the CDR bytes of an ordinary publisher).

use std::borrow::Cow;
use std::ffi::{CString, c_char};
use std::sync::OnceLock;

use zenoh_cuda_shm::cuda::Gpu;
use zenoh_cuda_shm::tensor_codec::Device;
use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Image};
use zenoh_cuda_shm::{GpuSample, Path, ReadError};
use zenoh_cuda_shm_ros2::{Attachment, RosDataMessage, RosSample};

use super::message::{ImageStrings, tensor_fields, zcs_ros_image_t};
use super::{IMAGE, TENSOR, wrong_type};
use crate::description::{TensorOut, zcs_tensor_t};
use crate::error::{Error, ZCS_ERR_INVALID, ZCS_ERR_MEMORY, guard, non_null, set_out, zcs_result_t};
use crate::handle::{Registry, end};
use crate::sample::zcs_sample_t;

/// A received ROS message.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_ros_sample_t {
    /// The handle (0: null).
    pub id: u64,
}

/// A message of either type.
pub(crate) enum Received {
    Image(RosSample<Image<()>>),
    Tensor(RosSample<ExperimentalTensor<()>>),
}

/// What is read of a message whatever its type.
trait Data {
    fn attachment(&self) -> &Attachment;
    fn path(&self) -> Path;
    fn data_len(&self) -> usize;
    fn host_data(&self) -> Option<Cow<'_, [u8]>>;
    fn data_to_vec(&self) -> Result<Vec<u8>, ReadError>;
    fn gpu_sample(&self) -> Option<&GpuSample>;
}

impl<M: RosDataMessage> Data for RosSample<M> {
    fn attachment(&self) -> &Attachment {
        RosSample::attachment(self)
    }
    fn path(&self) -> Path {
        RosSample::path(self)
    }
    fn data_len(&self) -> usize {
        RosSample::data_len(self)
    }
    fn host_data(&self) -> Option<Cow<'_, [u8]>> {
        RosSample::host_data(self)
    }
    fn data_to_vec(&self) -> Result<Vec<u8>, ReadError> {
        RosSample::data_to_vec(self)
    }
    fn gpu_sample(&self) -> Option<&GpuSample> {
        RosSample::gpu_sample(self)
    }
}

impl Received {
    fn data(&self) -> &dyn Data {
        match self {
            Self::Image(s) => s,
            Self::Tensor(s) => s,
        }
    }
}

/// A message and what was derived from it for C, each once.
struct SampleEntry {
    received: Received,
    /// The subscriber's GPU (its session's), for `zcs_sample_t`s of the data.
    gpu: Option<Gpu>,
    host: OnceLock<Vec<u8>>,
    path: OnceLock<CString>,
    image: OnceLock<ImageStrings>,
    tensor: OnceLock<TensorOut>,
}

static SAMPLES: Registry<SampleEntry> = Registry::new("ROS sample");

/// Registers a message received by a subscriber of a session on `gpu`; its handle.
pub(crate) fn register(received: Received, gpu: Option<Gpu>) -> zcs_ros_sample_t {
    let entry = SampleEntry {
        received,
        gpu,
        host: OnceLock::new(),
        path: OnceLock::new(),
        image: OnceLock::new(),
        tensor: OnceLock::new(),
    };
    zcs_ros_sample_t { id: SAMPLES.insert(entry) }
}

/// The value `f` derives, kept in `cell` from the first call that succeeds on.
fn derived<T>(cell: &OnceLock<T>, f: impl FnOnce() -> Result<T, Error>) -> Result<&T, Error> {
    match cell.get() {
        Some(v) => Ok(v),
        None => {
            let v = f()?;
            Ok(cell.get_or_init(|| v))
        }
    }
}

/// The image's fields (no data). `ZCS_ERR_INVALID` for a sample of a tensor
/// subscription. The strings stay valid while the sample does.
///
/// # Safety
/// `out` is NULL or points to a `zcs_ros_image_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_image(sample: zcs_ros_sample_t, out: *mut zcs_ros_image_t) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        let Received::Image(r) = &s.received else { return Err(wrong_type("sample", TENSOR, IMAGE)) };
        let strings = derived(&s.image, || ImageStrings::new(r.msg()))?;
        // SAFETY: not null (checked above); writable. The strings live in the entry,
        // which lives until the sample is dropped.
        unsafe { set_out(out, strings.image(r.msg())) };
        Ok(())
    })
}

/// The tensor's description: the message's dtype, shape, strides (always given, in
/// elements) and byte offset, and where its data is now (`kDLCUDA` and the session's
/// device when the data is in device memory, else `kDLCPU`). `ZCS_ERR_INVALID` for a
/// sample of an image subscription, or a description that does not fit the data. The
/// arrays stay valid while the sample does.
///
/// # Safety
/// `out` is NULL or points to a `zcs_tensor_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_tensor(sample: zcs_ros_sample_t, out: *mut zcs_tensor_t) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        let Received::Tensor(r) = &s.received else { return Err(wrong_type("sample", IMAGE, TENSOR)) };
        let fields = derived(&s.tensor, || {
            let device = match (r.host_data().is_some(), &s.gpu) {
                (false, Some(g)) => Device::cuda(g.ordinal() as i32),
                _ => Device::CPU,
            };
            tensor_fields(r.msg(), device, r.data_len())
        })?;
        // SAFETY: not null (checked above); writable. The arrays live in the entry,
        // which lives until the sample is dropped.
        unsafe { set_out(out, fields.desc()) };
        Ok(())
    })
}

/// The message's rmw_zenoh attachment: its ROS sequence number (from 1, per
/// publisher), its source timestamp (ns since the Unix epoch) and its publisher's GID
/// (16 bytes, as `ros2 topic info -v` shows it). Each pointer may be NULL.
///
/// # Safety
/// `seq` and `timestamp_ns` are NULL or point to an `int64_t`; `gid` is NULL or
/// points to 16 writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_attachment(
    sample: zcs_ros_sample_t,
    seq: *mut i64,
    timestamp_ns: *mut i64,
    gid: *mut u8,
) -> zcs_result_t {
    guard(|| {
        let s = SAMPLES.get(sample.id)?;
        let a = s.received.data().attachment();
        if !seq.is_null() {
            // SAFETY: not null (checked); the caller passes a writable value.
            unsafe { set_out(seq, a.seq) };
        }
        if !timestamp_ns.is_null() {
            // SAFETY: as above.
            unsafe { set_out(timestamp_ns, a.timestamp_ns) };
        }
        if !gid.is_null() {
            // SAFETY: not null (checked); 16 writable bytes (the caller's contract).
            unsafe { set_out(gid.cast::<[u8; 16]>(), a.gid) };
        }
        Ok(())
    })
}

/// How the data came: our channel's paths ("zero-copy", "cpu-bytes", "inline",
/// "host-block", …) or "plain" for the CDR message of an ordinary ROS publisher.
/// Valid while the sample is.
///
/// # Safety
/// `out` is NULL or points to a `const char*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_path(sample: zcs_ros_sample_t, out: *mut *const c_char) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        let name = s.path.get_or_init(|| CString::new(s.received.data().path().to_string()).unwrap_or_default());
        // SAFETY: not null (checked above); writable. The string lives in the entry.
        unsafe { set_out(out, name.as_ptr()) };
        Ok(())
    })
}

/// The length of the message's `data` field in bytes.
///
/// # Safety
/// `out` is NULL or points to a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_data_len(sample: zcs_ros_sample_t, out: *mut usize) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        // SAFETY: not null (checked above); the caller passes a writable value.
        unsafe { set_out(out, s.received.data().data_len()) };
        Ok(())
    })
}

/// The message's data in host memory, read in place where it is there (bytes, CDR,
/// blocks in shared host memory), valid until the sample is dropped.
/// `ZCS_ERR_MEMORY` for data in device memory (`zcs_ros_sample_gpu_sample` and
/// `zcs_sample_read`, or `zcs_ros_sample_copy_to_host`).
///
/// # Safety
/// `data` and `len` are NULL or point to a `const uint8_t*` and a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_host_data(
    sample: zcs_ros_sample_t,
    data: *mut *const u8,
    len: *mut usize,
) -> zcs_result_t {
    guard(|| {
        non_null(data, "data")?;
        non_null(len, "len")?;
        let s = SAMPLES.get(sample.id)?;
        let slice: &[u8] = match s.received.data().host_data() {
            Some(Cow::Borrowed(b)) => b,
            // Not contiguous: one copy, kept with the sample.
            Some(Cow::Owned(v)) => s.host.get_or_init(|| v),
            None => {
                return Err(Error::new(
                    ZCS_ERR_MEMORY,
                    "this message's data is in device memory: use zcs_ros_sample_gpu_sample or zcs_ros_sample_copy_to_host",
                ));
            }
        };
        // The borrowed bytes live in the message (its Zenoh payload or mapped block),
        // which the entry keeps until the sample is dropped.
        let (p, n) = (slice.as_ptr(), slice.len());
        // SAFETY: not null (checked above); the caller passes writable values.
        unsafe { set_out(data, p) };
        // SAFETY: as above.
        unsafe { set_out(len, n) };
        Ok(())
    })
}

/// Copies the message's data into `dst` (`dst_len` ≥ its length, else
/// `ZCS_ERR_INVALID`): from host memory, or device→host for a block on the GPU.
///
/// # Safety
/// `dst` points to `dst_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_copy_to_host(
    sample: zcs_ros_sample_t,
    dst: *mut u8,
    dst_len: usize,
) -> zcs_result_t {
    guard(|| {
        let s = SAMPLES.get(sample.id)?;
        let d = s.received.data();
        let len = d.data_len();
        if dst_len < len {
            return Err(Error::new(ZCS_ERR_INVALID, format!("dst holds {dst_len} bytes, the data {len}")));
        }
        if len == 0 {
            return Ok(());
        }
        non_null(dst, "dst")?;
        let v = d.data_to_vec().map_err(|e| Error::failed("copy the data to host memory", &e))?;
        // SAFETY: `dst` is not null (checked) and holds ≥ len writable bytes (checked
        // against the caller's `dst_len`); `v` is our own buffer of `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst, v.len()) };
        Ok(())
    })
}

/// The message's data as a sample of our channel, when it came that way: a new
/// `zcs_sample_t` (the caller drops it) that the sample functions read where the data
/// lies (`zcs_sample_read` on a stream, in place for a block; `zcs_sample_host_data`;
/// `zcs_sample_copy_to_host`). A block goes back to its publisher once both samples
/// are dropped and every read has ended. `ZCS_ERR_MEMORY` for a message of an
/// ordinary ROS publisher ("plain": its data is CDR bytes in host memory, read by
/// `zcs_ros_sample_host_data`).
///
/// # Safety
/// `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_gpu_sample(sample: zcs_ros_sample_t, out: *mut zcs_sample_t) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SAMPLES.get(sample.id)?;
        let Some(g) = s.received.data().gpu_sample() else {
            return Err(Error::new(
                ZCS_ERR_MEMORY,
                "this message came as CDR from an ordinary ROS publisher: its data is host bytes \
                 (zcs_ros_sample_host_data)",
            ));
        };
        let h = crate::sample::register(g.clone(), s.gpu.clone());
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, h) };
        Ok(())
    })
}

/// Drops a message and zeroes its handle: a block it held goes back to its publisher
/// (once no `zcs_sample_t` of it is left).
///
/// # Safety
/// `sample` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_ros_sample_drop(sample: *mut zcs_ros_sample_t) -> zcs_result_t {
    // SAFETY: `sample` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&SAMPLES, sample, "ROS sample") })
}
