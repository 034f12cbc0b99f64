//! The fields of the two message types, from C and back: `sensor_msgs/msg/Image` as
//! `zcs_ros_image_t`, `tensor_msgs/msg/ExperimentalTensor` as `zcs_tensor_t` (the
//! description the tensor functions use). A message's `data` is never in these
//! structs: it is a loan, host bytes, or a received sample's data.

use std::ffi::{CString, c_char};

use zenoh_cuda_shm::tensor_codec::cdr::{ExperimentalTensor, Header, Image, Time};
use zenoh_cuda_shm::tensor_codec::{Device, TensorMeta};

use crate::description::{TensorOut, meta_in, zcs_tensor_t};
use crate::error::{Error, ZCS_ERR_INVALID, non_null, str_arg};

/// A `sensor_msgs/msg/Image` without its data.
///
/// Publishing: both strings are read during the call; the data's length must be
/// `step * height`. Received: the strings stay valid while the sample does.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcs_ros_image_t {
    /// `header.stamp.sec`.
    pub stamp_sec: i32,
    /// `header.stamp.nanosec`.
    pub stamp_nanosec: u32,
    /// `header.frame_id` (UTF-8, NUL-terminated).
    pub frame_id: *const c_char,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// Pixel encoding, e.g. "rgb8", "bgra8", "mono16" (UTF-8, NUL-terminated).
    pub encoding: *const c_char,
    /// 1 if the data is big-endian, else 0.
    pub is_bigendian: u8,
    /// Bytes per row.
    pub step: u32,
}

/// The image fields C passed for `len` bytes of data, checked.
///
/// # Safety
/// `m` is NULL or points to a `zcs_ros_image_t` whose strings are NULL or
/// NUL-terminated.
pub(crate) unsafe fn image_in(m: *const zcs_ros_image_t, len: usize) -> Result<Image<()>, Error> {
    non_null(m, "image")?;
    // SAFETY: not null (checked); readable (the caller's contract).
    let m = unsafe { &*m };
    // SAFETY: NULL or NUL-terminated (the caller's contract).
    let frame_id = unsafe { str_arg(m.frame_id, "image.frame_id") }?;
    // SAFETY: as above.
    let encoding = unsafe { str_arg(m.encoding, "image.encoding") }?;
    let rows = u64::from(m.step) * u64::from(m.height);
    if rows != len as u64 {
        return Err(Error::new(
            ZCS_ERR_INVALID,
            format!("an image of step {} and height {} has {rows} bytes of data, not {len}", m.step, m.height),
        ));
    }
    Ok(Image {
        header: Header { stamp: Time { sec: m.stamp_sec, nanosec: m.stamp_nanosec }, frame_id: frame_id.to_owned() },
        height: m.height,
        width: m.width,
        encoding: encoding.to_owned(),
        is_bigendian: m.is_bigendian,
        step: m.step,
        data: (),
    })
}

/// A received image's strings as C reads them, kept with the sample.
pub(crate) struct ImageStrings {
    frame_id: CString,
    encoding: CString,
}

impl ImageStrings {
    /// The strings of `m`; `ZCS_ERR_INVALID` for one with a NUL inside, which a C
    /// string cannot carry.
    pub(crate) fn new(m: &Image<()>) -> Result<Self, Error> {
        let c = |s: &str, name: &str| {
            CString::new(s).map_err(|_| Error::new(ZCS_ERR_INVALID, format!("the image's {name} holds a NUL byte")))
        };
        Ok(Self { frame_id: c(&m.header.frame_id, "frame_id")?, encoding: c(&m.encoding, "encoding")? })
    }

    /// The fields of `m` with these strings.
    pub(crate) fn image(&self, m: &Image<()>) -> zcs_ros_image_t {
        zcs_ros_image_t {
            stamp_sec: m.header.stamp.sec,
            stamp_nanosec: m.header.stamp.nanosec,
            frame_id: self.frame_id.as_ptr(),
            height: m.height,
            width: m.width,
            encoding: self.encoding.as_ptr(),
            is_bigendian: m.is_bigendian,
            step: m.step,
        }
    }
}

/// The tensor message for `len` bytes of data on `data`, from the description C
/// passed: checked against that length, and its device (if named) against `data`.
///
/// # Safety
/// As `zcs_tensor_t` says for publishing.
pub(crate) unsafe fn tensor_in(
    t: *const zcs_tensor_t,
    data: Device,
    len: usize,
) -> Result<ExperimentalTensor<()>, Error> {
    // SAFETY: the caller's contract.
    let meta = unsafe { meta_in(t, data) }?;
    if meta.device != data {
        return Err(Error::new(
            ZCS_ERR_INVALID,
            format!(
                "the tensor names device {} but its data is on {data} (device_type 0: where the data is)",
                meta.device
            ),
        ));
    }
    meta.validate(len as u64).map_err(|e| {
        Error::new(ZCS_ERR_INVALID, format!("the tensor description does not fit its {len} bytes of data: {e}"))
    })?;
    let dt = meta.dtype.to_dl();
    Ok(ExperimentalTensor {
        dtype_code: dt.code,
        dtype_bits: dt.bits,
        dtype_lanes: dt.lanes,
        shape: meta.shape,
        strides: meta.strides,
        byte_offset: meta.byte_offset,
        data: (),
    })
}

/// A received tensor's description as C reads it (kept with the sample): the message's
/// fields, checked against its data, whose `len` bytes are on `device`;
/// `ZCS_ERR_INVALID` for one that does not fit them.
pub(crate) fn tensor_fields(m: &ExperimentalTensor<()>, device: Device, len: usize) -> Result<TensorOut, Error> {
    let invalid = |e: &dyn std::fmt::Display| {
        Error::new(
            ZCS_ERR_INVALID,
            format!("the message's tensor description does not fit its {len} bytes of data: {e}"),
        )
    };
    let dtype = m.dtype().map_err(|e| invalid(&e))?;
    let meta =
        TensorMeta { dtype, shape: m.shape.clone(), strides: m.strides.clone(), byte_offset: m.byte_offset, device };
    meta.validate(len as u64).map_err(|e| invalid(&e))?;
    TensorOut::new(meta)
}
