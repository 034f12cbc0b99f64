//! `sensor_msgs/msg/Image` with its `std_msgs/msg/Header` and `builtin_interfaces/msg/Time`.

use super::{BufferData, CdrDecodeError, CdrEncodeError, CudaBufferDescriptor, Reader, Writer};

/// `builtin_interfaces/msg/Time`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Time {
    /// Seconds (`int32 sec`).
    pub sec: i32,
    /// Nanoseconds within the second (`uint32 nanosec`). Not range-checked: CDR carries
    /// whatever the sender wrote.
    pub nanosec: u32,
}

/// `std_msgs/msg/Header`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Header {
    /// `builtin_interfaces/Time stamp`.
    pub stamp: Time,
    /// `string frame_id`.
    pub frame_id: String,
}

/// `sensor_msgs/msg/Image`, generic over the `data` field: `Vec<u8>` when owned,
/// `&[u8]` when borrowed from the input by [`Image::decode_cdr_borrowed`].
///
/// The CDR codec carries the fields as they are; it does not check that
/// `step * height <= data.len()` or that `encoding` is a known name.
///
/// ```
/// use tensor_codec::cdr::{Header, Image, Time};
///
/// let image = Image {
///     header: Header { stamp: Time { sec: 1_700_000_000, nanosec: 123 }, frame_id: "camera".into() },
///     height: 2,
///     width: 2,
///     encoding: "rgb8".into(),
///     is_bigendian: 0,
///     step: 6,
///     data: vec![0u8; 12],
/// };
/// let bytes = image.encode_cdr()?;
/// assert_eq!(bytes.len(), 64);
/// let view = Image::decode_cdr_borrowed(&bytes)?; // `data` points into `bytes`
/// assert_eq!(view.data.len(), 12);
/// assert_eq!(view.into_owned(), image);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Image<D = Vec<u8>> {
    /// `std_msgs/Header header`.
    pub header: Header,
    /// `uint32 height`: number of rows.
    pub height: u32,
    /// `uint32 width`: number of columns.
    pub width: u32,
    /// `string encoding`: pixel encoding (`"rgb8"`, `"mono16"`, ...).
    pub encoding: String,
    /// `uint8 is_bigendian`.
    pub is_bigendian: u8,
    /// `uint32 step`: row length in bytes.
    pub step: u32,
    /// `uint8[] data`: `step * height` bytes.
    pub data: D,
}

impl<D> Image<D> {
    /// Replaces the `data` field through `f`, keeping every other field.
    pub fn map_data<E>(self, f: impl FnOnce(D) -> E) -> Image<E> {
        Image {
            header: self.header,
            height: self.height,
            width: self.width,
            encoding: self.encoding,
            is_bigendian: self.is_bigendian,
            step: self.step,
            data: f(self.data),
        }
    }

    /// Encodes the header and every field before the data bytes, ending with the `data`
    /// length field set to `data_len`. The complete message is this prefix followed by
    /// exactly `data_len` data bytes (`uint8` needs no alignment, and nothing follows).
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] if a string or `data_len` exceeds `u32`.
    pub fn encode_cdr_prefix(&self, data_len: usize) -> Result<Vec<u8>, CdrEncodeError> {
        let mut w = Writer::with_capacity(40 + self.header.frame_id.len() + self.encoding.len());
        self.write_prefix(&mut w, data_len)?;
        Ok(w.into_inner())
    }

    /// Encodes the message with a CUDA buffer descriptor in place of the data bytes
    /// (the descriptor form of a `rosidl::Buffer` field, layout as `d.layout` says).
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] if a string exceeds `u32` in length.
    pub fn encode_cdr_cuda(&self, d: &CudaBufferDescriptor) -> Result<Vec<u8>, CdrEncodeError> {
        let mut w = Writer::with_capacity(
            (200 + self.header.frame_id.len() + self.encoding.len()).saturating_add(d.vmm_socket_path.len()),
        );
        self.write_fields(&mut w)?;
        w.cuda_descriptor(d)?;
        Ok(w.into_inner())
    }

    fn write_prefix(&self, w: &mut Writer, data_len: usize) -> Result<(), CdrEncodeError> {
        self.write_fields(w)?;
        w.seq_len(data_len, "data")
    }

    /// Every field before `data`.
    fn write_fields(&self, w: &mut Writer) -> Result<(), CdrEncodeError> {
        w.i32(self.header.stamp.sec);
        w.u32(self.header.stamp.nanosec);
        w.string(&self.header.frame_id, "header.frame_id")?;
        w.u32(self.height);
        w.u32(self.width);
        w.string(&self.encoding, "encoding")?;
        w.u8(self.is_bigendian);
        w.u32(self.step);
        Ok(())
    }
}

impl<D: AsRef<[u8]>> Image<D> {
    /// Encodes the message: `00 01 00 00` followed by the little-endian CDR body.
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] if a string or `data` exceeds `u32` in length.
    pub fn encode_cdr(&self) -> Result<Vec<u8>, CdrEncodeError> {
        let data = self.data.as_ref();
        let mut w =
            Writer::with_capacity((40 + self.header.frame_id.len() + self.encoding.len()).saturating_add(data.len()));
        self.write_prefix(&mut w, data.len())?;
        w.extend(data);
        Ok(w.into_inner())
    }

    /// A copy with owned `data`.
    pub fn to_owned_data(&self) -> Image<Vec<u8>> {
        Image {
            header: self.header.clone(),
            height: self.height,
            width: self.width,
            encoding: self.encoding.clone(),
            is_bigendian: self.is_bigendian,
            step: self.step,
            data: self.data.as_ref().to_vec(),
        }
    }
}

impl<'a> Image<&'a [u8]> {
    /// Decodes a CDR message (little- or big-endian) without copying `data`, which
    /// borrows from `bytes`. The strings are copied (they are small).
    ///
    /// # Errors
    /// A [`CdrDecodeError`] naming the field that could not be read.
    /// A buffer descriptor in place of the data is refused with
    /// [`CdrDecodeError::BufferDescriptor`]: see [`Image::decode_cdr_buffer`].
    pub fn decode_cdr_borrowed(bytes: &'a [u8]) -> Result<Self, CdrDecodeError> {
        let mut r = Reader::new(bytes)?;
        let fields = Image::read_fields(&mut r)?;
        r.descriptor_ahead("data")?;
        let data = r.bytes("data")?;
        r.finish()?;
        Ok(fields.map_data(|()| data))
    }

    /// Copies `data` into an owned message.
    pub fn into_owned(self) -> Image<Vec<u8>> {
        self.map_data(<[u8]>::to_vec)
    }
}

impl<'a> Image<BufferData<'a>> {
    /// Decodes a CDR message whose data is in either form of a `rosidl::Buffer` field:
    /// the bytes (borrowed from `bytes`) or the CUDA backend's descriptor.
    ///
    /// # Errors
    /// A [`CdrDecodeError`] naming the field that could not be read;
    /// [`CdrDecodeError::UnknownBufferBackend`] for another backend's descriptor.
    pub fn decode_cdr_buffer(bytes: &'a [u8]) -> Result<Self, CdrDecodeError> {
        let mut r = Reader::new(bytes)?;
        let fields = Image::read_fields(&mut r)?;
        let data = r.last_buffer("data")?;
        r.finish()?;
        Ok(fields.map_data(|()| data))
    }
}

impl Image<()> {
    /// Every field before `data`.
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, CdrDecodeError> {
        let sec = r.i32("header.stamp.sec")?;
        let nanosec = r.u32("header.stamp.nanosec")?;
        let frame_id = r.string("header.frame_id")?;
        let height = r.u32("height")?;
        let width = r.u32("width")?;
        let encoding = r.string("encoding")?;
        let is_bigendian = r.u8("is_bigendian")?;
        let step = r.u32("step")?;
        Ok(Image {
            header: Header { stamp: Time { sec, nanosec }, frame_id },
            height,
            width,
            encoding,
            is_bigendian,
            step,
            data: (),
        })
    }
}

impl Image<Vec<u8>> {
    /// Decodes a CDR message (little- or big-endian), copying `data`.
    ///
    /// # Errors
    /// As [`Image::decode_cdr_borrowed`].
    pub fn decode_cdr(bytes: &[u8]) -> Result<Self, CdrDecodeError> {
        Image::decode_cdr_borrowed(bytes).map(Image::into_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn camera() -> Image<Vec<u8>> {
        Image {
            header: Header { stamp: Time { sec: 0x6553_f100, nanosec: 123 }, frame_id: "camera".into() },
            height: 2,
            width: 2,
            encoding: "rgb8".into(),
            is_bigendian: 0,
            step: 6,
            data: (1..=12).collect(),
        }
    }

    /// The 2x2 rgb8 layout from research/rmw_zenoh.md §3.
    #[test]
    fn documented_layout() {
        let bytes = camera().encode_cdr().unwrap();
        let mut expected = vec![0x00, 0x01, 0x00, 0x00];
        expected.extend_from_slice(&[0x00, 0xf1, 0x53, 0x65]); // sec
        expected.extend_from_slice(&[0x7b, 0, 0, 0]); // nanosec
        expected.extend_from_slice(&[7, 0, 0, 0]);
        expected.extend_from_slice(b"camera\0");
        expected.push(0); // pad
        expected.extend_from_slice(&[2, 0, 0, 0, 2, 0, 0, 0]);
        expected.extend_from_slice(&[5, 0, 0, 0]);
        expected.extend_from_slice(b"rgb8\0");
        expected.extend_from_slice(&[0, 0, 0]); // is_bigendian + pad
        expected.extend_from_slice(&[6, 0, 0, 0, 12, 0, 0, 0]);
        expected.extend(1..=12u8);
        assert_eq!(bytes, expected);
        assert_eq!(bytes.len(), 64);
        let prefix = camera().encode_cdr_prefix(12).unwrap();
        assert_eq!(prefix, bytes[..52]);
    }

    #[test]
    fn round_trips() {
        let image = camera();
        let bytes = image.encode_cdr().unwrap();
        let view = Image::decode_cdr_borrowed(&bytes).unwrap();
        // Zero copy: the data slice points into the input.
        assert_eq!(view.data.as_ptr(), bytes[52..].as_ptr());
        assert_eq!(view.to_owned_data(), image);
        assert_eq!(Image::decode_cdr(&bytes).unwrap(), image);
        // Every frame_id length exercises a different padding.
        for n in 0..9 {
            let mut m = camera();
            m.header.frame_id = "x".repeat(n);
            m.encoding = "é".repeat(n);
            let bytes = m.encode_cdr().unwrap();
            assert_eq!(Image::decode_cdr(&bytes).unwrap(), m);
        }
    }

    #[test]
    fn big_endian_input() {
        let mut be = vec![0x00, 0x00, 0x00, 0x00];
        be.extend_from_slice(&[0xff, 0xff, 0xff, 0xfe]); // sec -2
        be.extend_from_slice(&[0, 0, 0, 5]); // nanosec
        be.extend_from_slice(&[0, 0, 0, 2, b'f', 0]); // frame_id "f"
        be.extend_from_slice(&[0, 0]); // pad
        be.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 3]); // height, width
        be.extend_from_slice(&[0, 0, 0, 1, 0]); // encoding ""
        be.push(1); // is_bigendian
        be.extend_from_slice(&[0, 0]); // pad
        be.extend_from_slice(&[0, 0, 0, 3, 0, 0, 0, 3, 7, 8, 9]);
        let m = Image::decode_cdr(&be).unwrap();
        assert_eq!(m.header.stamp, Time { sec: -2, nanosec: 5 });
        assert_eq!(m.header.frame_id, "f");
        assert_eq!((m.height, m.width, m.step, m.is_bigendian), (1, 3, 3, 1));
        assert_eq!(m.encoding, "");
        assert_eq!(m.data, vec![7, 8, 9]);
    }

    #[test]
    fn every_truncation_names_a_field() {
        let bytes = camera().encode_cdr().unwrap();
        let fields = [
            "encapsulation",
            "header.stamp.sec",
            "header.stamp.nanosec",
            "header.frame_id",
            "height",
            "width",
            "encoding",
            "is_bigendian",
            "step",
            "data",
        ];
        for cut in 0..bytes.len() {
            match Image::decode_cdr_borrowed(&bytes[..cut]) {
                Err(CdrDecodeError::Truncated { field, .. }) => {
                    assert!(fields.contains(&field), "cut {cut}: {field}")
                }
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        // The data length field claims more than the input holds.
        let mut lying = bytes.clone();
        lying[48] = 0xff;
        assert_eq!(
            Image::decode_cdr_borrowed(&lying).unwrap_err(),
            CdrDecodeError::Truncated { field: "data", needed: 255, available: 12 }
        );
    }

    #[test]
    fn trailing_and_bad_strings() {
        let mut bytes = camera().encode_cdr().unwrap();
        bytes.extend_from_slice(&[0, 0, 0]);
        assert!(Image::decode_cdr(&bytes).is_ok());
        bytes.push(0);
        assert_eq!(Image::decode_cdr(&bytes), Err(CdrDecodeError::TrailingBytes { count: 4 }));

        let mut bytes = camera().encode_cdr().unwrap();
        bytes[22] = b'!'; // NUL of "camera"
        assert_eq!(Image::decode_cdr(&bytes), Err(CdrDecodeError::UnterminatedString { field: "header.frame_id" }));
        let mut bytes = camera().encode_cdr().unwrap();
        bytes[36] = 0xc3; // "rgb8" -> invalid UTF-8
        assert!(matches!(Image::decode_cdr(&bytes), Err(CdrDecodeError::InvalidUtf8 { field: "encoding", .. })));
    }
}
