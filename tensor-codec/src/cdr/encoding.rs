//! `sensor_msgs/msg/Image` pixels as a tensor: the element type and channel count of
//! each encoding of ROS's `sensor_msgs/image_encodings.hpp`, and the `[height, width,
//! channels]` view an Image's data makes with its `step`.

use super::Image;
use crate::{DType, Device, MetaError, TensorMeta};

/// Why an Image's data could not be described as a tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PixelLayoutError {
    /// An encoding this table does not know (compressed and planar formats among them).
    #[error(
        "encoding {0:?} has no tensor layout here (known: rgb8, rgba8, bgr8, bgra8, mono8, mono16, rgb16, rgba16, bgr16, bgra16, 8UC1…64FC4, bayer_*8/16, yuv422, uyvy, yuyv)"
    )]
    UnknownEncoding(String),
    /// `step` is not a whole number of elements, or shorter than a row of pixels.
    #[error("step {step} does not hold a row of {width} pixels of {row} bytes in whole elements of {itemsize} bytes")]
    Step {
        /// The Image's step.
        step: u32,
        /// The Image's width.
        width: u32,
        /// Bytes of a row of pixels.
        row: u64,
        /// Bytes per element.
        itemsize: u64,
    },
    /// `is_bigendian` set for elements wider than a byte on this little-endian reader.
    #[error("big-endian pixels of {itemsize} bytes cannot be viewed in place")]
    BigEndian {
        /// Bytes per element.
        itemsize: u64,
    },
    /// The view does not fit the data.
    #[error(transparent)]
    Meta(#[from] MetaError),
}

/// The element type and channel count of `encoding`, as `sensor_msgs/image_encodings.hpp`
/// defines them; `None` for encodings with no single-array layout.
pub fn pixel_layout(encoding: &str) -> Option<(DType, u32)> {
    let u8_ = DType::new(1, 8, 1).ok()?;
    let u16_ = DType::new(1, 16, 1).ok()?;
    let named = match encoding {
        "mono8" => Some((u8_, 1)),
        "mono16" => Some((u16_, 1)),
        "rgb8" | "bgr8" => Some((u8_, 3)),
        "rgba8" | "bgra8" => Some((u8_, 4)),
        "rgb16" | "bgr16" => Some((u16_, 3)),
        "rgba16" | "bgra16" => Some((u16_, 4)),
        "yuv422" | "uyvy" | "yuyv" | "yuv422_yuy2" => Some((u8_, 2)),
        e if e.starts_with("bayer_") && e.ends_with("16") => Some((u16_, 1)),
        e if e.starts_with("bayer_") && e.ends_with('8') => Some((u8_, 1)),
        _ => None,
    };
    named.or_else(|| cv_layout(encoding))
}

/// OpenCV-style `<bits><U|S|F>C<channels>` (`8UC3`, `32FC1`, `16SC4`).
fn cv_layout(encoding: &str) -> Option<(DType, u32)> {
    let (depth, channels) = encoding.split_once('C')?;
    let channels: u32 = channels.parse().ok().filter(|c| (1..=4).contains(c))?;
    let (bits, kind) = depth.split_at(depth.len().checked_sub(1)?);
    let code = match (kind, bits) {
        ("U", "8" | "16") => 1,
        ("S", "8" | "16" | "32") => 0,
        ("F", "32" | "64") => 2,
        _ => return None,
    };
    Some((DType::new(code, bits.parse().ok()?, 1).ok()?, channels))
}

impl<D> Image<D> {
    /// The data of `data_len` bytes as a `[height, width, channels]` tensor on `device`:
    /// rows `step` bytes apart, pixels and channels packed.
    ///
    /// # Errors
    /// [`PixelLayoutError`]: an unknown encoding, a step that is not whole elements or
    /// shorter than a row, big-endian multi-byte pixels, or a view past `data_len`.
    pub fn pixel_meta(&self, data_len: usize, device: Device) -> Result<TensorMeta, PixelLayoutError> {
        let (dtype, channels) =
            pixel_layout(&self.encoding).ok_or_else(|| PixelLayoutError::UnknownEncoding(self.encoding.clone()))?;
        let itemsize = dtype.itemsize().unwrap_or(1);
        if self.is_bigendian != 0 && itemsize > 1 {
            return Err(PixelLayoutError::BigEndian { itemsize });
        }
        let row = u64::from(self.width) * u64::from(channels) * itemsize;
        let step = u64::from(self.step);
        if !step.is_multiple_of(itemsize) || step < row {
            return Err(PixelLayoutError::Step { step: self.step, width: self.width, row, itemsize });
        }
        let shape = vec![i64::from(self.height), i64::from(self.width), i64::from(channels)];
        let meta = TensorMeta::contiguous(dtype, shape, device).with_strides(vec![
            (step / itemsize) as i64,
            i64::from(channels),
            1,
        ]);
        meta.validate(data_len as u64)?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(encoding: &str, width: u32, height: u32, step: u32) -> Image<()> {
        Image { encoding: encoding.into(), width, height, step, ..Image::default() }
    }

    #[test]
    fn encodings_name_their_elements() {
        let name = |e: &str| pixel_layout(e).map(|(d, c)| (d.to_string(), c));
        assert_eq!(name("rgba8"), Some(("uint8".into(), 4)));
        assert_eq!(name("bgr8"), Some(("uint8".into(), 3)));
        assert_eq!(name("mono16"), Some(("uint16".into(), 1)));
        assert_eq!(name("32FC1"), Some(("float32".into(), 1)));
        assert_eq!(name("64FC3"), Some(("float64".into(), 3)));
        assert_eq!(name("16SC2"), Some(("int16".into(), 2)));
        assert_eq!(name("8UC4"), Some(("uint8".into(), 4)));
        assert_eq!(name("bayer_rggb16"), Some(("uint16".into(), 1)));
        assert_eq!(name("bayer_grbg8"), Some(("uint8".into(), 1)));
        assert_eq!(name("yuv422"), Some(("uint8".into(), 2)));
        for unknown in ["", "jpeg", "8UC5", "8UC0", "32UC1", "16FC1", "C1", "nv12", "8XC1"] {
            assert_eq!(pixel_layout(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn rows_are_step_apart() {
        let m = image("rgb8", 4, 2, 16).pixel_meta(32, Device::CPU).unwrap();
        assert_eq!((m.shape.as_slice(), m.strides.as_slice()), (&[2, 4, 3][..], &[16, 3, 1][..]));
        let m = image("mono16", 3, 2, 8).pixel_meta(16, Device::cuda(1)).unwrap();
        assert_eq!(
            (m.shape.as_slice(), m.strides.as_slice(), m.device),
            (&[2, 3, 1][..], &[4, 1, 1][..], Device::cuda(1))
        );
        assert!(matches!(image("mono16", 3, 2, 7).pixel_meta(14, Device::CPU), Err(PixelLayoutError::Step { .. })));
        assert!(matches!(image("rgb8", 4, 2, 11).pixel_meta(22, Device::CPU), Err(PixelLayoutError::Step { .. })));
        assert!(matches!(image("rgb8", 4, 2, 12).pixel_meta(23, Device::CPU), Err(PixelLayoutError::Meta(_))));
        assert_eq!(
            image("jpeg", 4, 2, 12).pixel_meta(24, Device::CPU),
            Err(PixelLayoutError::UnknownEncoding("jpeg".into()))
        );
        let big = Image { is_bigendian: 1, ..image("mono16", 2, 1, 4) };
        assert_eq!(big.pixel_meta(4, Device::CPU), Err(PixelLayoutError::BigEndian { itemsize: 2 }));
        assert!(Image { is_bigendian: 1, ..image("mono8", 2, 1, 2) }.pixel_meta(2, Device::CPU).is_ok());
    }
}
