//! ROS messages whose last field is a `uint8[] data` buffer, split into the small
//! fields (the message with no data) and the data bytes: the split that lets the data
//! travel in a GPU block while everything else travels as CDR beside it. A
//! `std_msgs/msg/String` is split the same way, its text as the data
//! ([`RosDataMessage::DATA_IS_TEXT`]).
//!
//! The **envelope** is the typed metadata of every sample on our channel:
//!
//! | bytes | content |
//! |---|---|
//! | 1 | version ([`ENVELOPE_VERSION`]) |
//! | 33 | the rmw_zenoh [`Attachment`] of the message (same sequence number, timestamp, GID as on the base key) |
//! | rest | the message in CDR with an empty `data` field (`00 01 00 00` header included) |

use std::ops::Range;

use tensor_codec::cdr::{
    BufferData, CdrDecodeError, CdrEncodeError, CudaBufferDescriptor, ExperimentalTensor, Image, StringMsg,
};
use tensor_codec::type_hash::{RosMessage, TypeHash};

use super::attachment::{ATTACHMENT_LEN, Attachment, AttachmentError};

/// Version byte of the envelope.
pub const ENVELOPE_VERSION: u8 = 1;

/// A ROS message type ending in `uint8[] data`, represented without its data (`Self`
/// is e.g. `Image<()>`).
pub trait RosDataMessage: Clone + Send + Sync + 'static {
    /// The message with owned data (e.g. `Image<Vec<u8>>`).
    type Owned;
    /// `pkg/msg/Name`.
    const TYPE_NAME: &'static str;
    /// `pkg::msg::dds_::Name_`, as in rmw_zenoh keys.
    const DDS_TYPE_NAME: &'static str;
    /// Whether the type has a top-level `uint8[]` field, which makes its volatile
    /// endpoints buffer-aware in rmw_zenoh 0.10.5 / 0.12.0 and later.
    const HAS_BUFFER_FIELDS: bool;
    /// Whether `data` is a `string` (`std_msgs/msg/String`): UTF-8 without NUL bytes,
    /// followed in CDR by its terminating NUL. Such data is checked before it is
    /// published ([`check_data`]) and when it arrives on our channel.
    const DATA_IS_TEXT: bool = false;
    /// The RIHS01 type hash.
    fn type_hash() -> TypeHash;
    /// The CDR message up to and including the `data` length field (`data_len`).
    ///
    /// # Errors
    /// [`CdrEncodeError`] when a field does not fit CDR (a string or sequence longer
    /// than a `u32` length, a string with a NUL byte).
    fn encode_cdr_prefix(&self, data_len: usize) -> Result<Vec<u8>, CdrEncodeError>;
    /// Decodes a whole CDR message: the fields, and where the data bytes lie in `bytes`.
    ///
    /// # Errors
    /// [`CdrDecodeError`] when `bytes` is not a CDR message of this type (truncated, an
    /// unknown encapsulation, a length past the end, a string that is not UTF-8).
    fn decode_cdr(bytes: &[u8]) -> Result<(Self, Range<usize>), CdrDecodeError>;
    /// Decodes a whole CDR message whose `data` is a `rosidl::Buffer` field: where the
    /// bytes lie in `bytes`, or the CUDA buffer backend's descriptor in their place.
    ///
    /// # Errors
    /// As [`RosDataMessage::decode_cdr`], and [`CdrDecodeError`]'s buffer variants for a
    /// descriptor that does not decode or names another backend.
    fn decode_cdr_buffer(bytes: &[u8]) -> Result<(Self, DataField), CdrDecodeError>;
    /// The CDR message with the CUDA buffer backend's descriptor `d` in place of the
    /// `data` bytes (what a CUDA publisher sends a CUDA subscription).
    ///
    /// # Errors
    /// As [`RosDataMessage::encode_cdr_prefix`].
    fn encode_cdr_cuda(&self, d: &CudaBufferDescriptor) -> Result<Vec<u8>, CdrEncodeError>;
    /// The message with `data` filled in.
    fn with_data(&self, data: Vec<u8>) -> Self::Owned;
}

/// What follows the data bytes in `M`'s CDR: the NUL of a `string`, nothing after a
/// `uint8[]`.
pub(crate) fn data_suffix<M: RosDataMessage>() -> &'static [u8] {
    if M::DATA_IS_TEXT { &StringMsg::SUFFIX } else { &[] }
}

/// Checks data bytes of `M` before they are published: text must be UTF-8 without NUL
/// bytes; `uint8[]` data may be anything.
///
/// # Errors
/// [`CdrEncodeError::InvalidText`] for text that is not.
pub fn check_data<M: RosDataMessage>(data: &[u8]) -> Result<(), CdrEncodeError> {
    if M::DATA_IS_TEXT { StringMsg::check_text(data) } else { Ok(()) }
}

/// Where a message's `data` is, as [`RosDataMessage::decode_cdr_buffer`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataField {
    /// The bytes, at this range of the message.
    Bytes(Range<usize>),
    /// A descriptor of a buffer of ROS 2's CUDA buffer backend.
    Cuda(Box<CudaBufferDescriptor>),
}

fn data_field(outer: &[u8], data: BufferData<'_>) -> DataField {
    match data {
        BufferData::Bytes(b) => DataField::Bytes(range_in(outer, b)),
        BufferData::Cuda(d) => DataField::Cuda(Box::new(d)),
    }
}

fn range_in(outer: &[u8], inner: &[u8]) -> Range<usize> {
    // Both slices come from the same allocation: `inner` was borrowed out of `outer`.
    let start = inner.as_ptr() as usize - outer.as_ptr() as usize;
    start..start + inner.len()
}

impl RosDataMessage for Image<()> {
    type Owned = Image<Vec<u8>>;
    const TYPE_NAME: &'static str = <Image<()> as RosMessage>::TYPE_NAME;
    const DDS_TYPE_NAME: &'static str = <Image<()> as RosMessage>::DDS_TYPE_NAME;
    const HAS_BUFFER_FIELDS: bool = <Image<()> as RosMessage>::HAS_BUFFER_FIELDS;

    fn type_hash() -> TypeHash {
        <Image<()> as RosMessage>::type_hash()
    }

    fn encode_cdr_prefix(&self, data_len: usize) -> Result<Vec<u8>, CdrEncodeError> {
        Image::encode_cdr_prefix(self, data_len)
    }

    fn decode_cdr(bytes: &[u8]) -> Result<(Self, Range<usize>), CdrDecodeError> {
        let m = Image::decode_cdr_borrowed(bytes)?;
        let range = range_in(bytes, m.data);
        Ok((m.map_data(|_| ()), range))
    }

    fn decode_cdr_buffer(bytes: &[u8]) -> Result<(Self, DataField), CdrDecodeError> {
        let m = Image::decode_cdr_buffer(bytes)?;
        let field = data_field(bytes, m.data.clone());
        Ok((m.map_data(|_| ()), field))
    }

    fn encode_cdr_cuda(&self, d: &CudaBufferDescriptor) -> Result<Vec<u8>, CdrEncodeError> {
        Image::encode_cdr_cuda(self, d)
    }

    fn with_data(&self, data: Vec<u8>) -> Image<Vec<u8>> {
        self.clone().map_data(|()| data)
    }
}

impl RosDataMessage for ExperimentalTensor<()> {
    type Owned = ExperimentalTensor<Vec<u8>>;
    const TYPE_NAME: &'static str = <ExperimentalTensor<()> as RosMessage>::TYPE_NAME;
    const DDS_TYPE_NAME: &'static str = <ExperimentalTensor<()> as RosMessage>::DDS_TYPE_NAME;
    const HAS_BUFFER_FIELDS: bool = <ExperimentalTensor<()> as RosMessage>::HAS_BUFFER_FIELDS;

    fn type_hash() -> TypeHash {
        <ExperimentalTensor<()> as RosMessage>::type_hash()
    }

    fn encode_cdr_prefix(&self, data_len: usize) -> Result<Vec<u8>, CdrEncodeError> {
        ExperimentalTensor::encode_cdr_prefix(self, data_len)
    }

    fn decode_cdr(bytes: &[u8]) -> Result<(Self, Range<usize>), CdrDecodeError> {
        let m = ExperimentalTensor::decode_cdr_borrowed(bytes)?;
        let range = range_in(bytes, m.data);
        Ok((m.map_data(|_| ()), range))
    }

    fn decode_cdr_buffer(bytes: &[u8]) -> Result<(Self, DataField), CdrDecodeError> {
        let m = ExperimentalTensor::decode_cdr_buffer(bytes)?;
        let field = data_field(bytes, m.data.clone());
        Ok((m.map_data(|_| ()), field))
    }

    fn encode_cdr_cuda(&self, d: &CudaBufferDescriptor) -> Result<Vec<u8>, CdrEncodeError> {
        ExperimentalTensor::encode_cdr_cuda(self, d)
    }

    fn with_data(&self, data: Vec<u8>) -> ExperimentalTensor<Vec<u8>> {
        self.clone().map_data(|()| data)
    }
}

/// `std_msgs/msg/String`, its text as the data.
impl RosDataMessage for StringMsg<()> {
    type Owned = StringMsg<String>;
    const TYPE_NAME: &'static str = <StringMsg<()> as RosMessage>::TYPE_NAME;
    const DDS_TYPE_NAME: &'static str = <StringMsg<()> as RosMessage>::DDS_TYPE_NAME;
    const HAS_BUFFER_FIELDS: bool = <StringMsg<()> as RosMessage>::HAS_BUFFER_FIELDS;
    const DATA_IS_TEXT: bool = true;

    fn type_hash() -> TypeHash {
        <StringMsg<()> as RosMessage>::type_hash()
    }

    fn encode_cdr_prefix(&self, data_len: usize) -> Result<Vec<u8>, CdrEncodeError> {
        StringMsg::encode_cdr_prefix(self, data_len)
    }

    fn decode_cdr(bytes: &[u8]) -> Result<(Self, Range<usize>), CdrDecodeError> {
        let m = StringMsg::decode_cdr_borrowed(bytes)?;
        Ok((StringMsg { data: () }, range_in(bytes, m.data.as_bytes())))
    }

    fn decode_cdr_buffer(bytes: &[u8]) -> Result<(Self, DataField), CdrDecodeError> {
        let (m, range) = <Self as RosDataMessage>::decode_cdr(bytes)?;
        Ok((m, DataField::Bytes(range)))
    }

    /// A String has no buffer field: never asked of it (its endpoints are not
    /// buffer-aware), and refused if it were.
    fn encode_cdr_cuda(&self, _d: &CudaBufferDescriptor) -> Result<Vec<u8>, CdrEncodeError> {
        Err(CdrEncodeError::NoBufferField { type_name: <Self as RosDataMessage>::TYPE_NAME })
    }

    fn with_data(&self, data: Vec<u8>) -> StringMsg<String> {
        // Text is checked before it is published and when it arrives, so this is UTF-8;
        // were it not, the bytes are kept readable rather than lost.
        let text = String::from_utf8(data).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        StringMsg { data: text }
    }
}

/// Why an envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The sample carries no metadata.
    #[error("no envelope")]
    Missing,
    /// Unknown version byte.
    #[error("envelope version {0}, expected {ENVELOPE_VERSION}")]
    Version(u8),
    /// Shorter than version + attachment.
    #[error("envelope truncated ({0} bytes)")]
    Truncated(usize),
    /// The attachment inside is malformed.
    #[error(transparent)]
    Attachment(#[from] AttachmentError),
    /// The message inside does not decode.
    #[error(transparent)]
    Cdr(#[from] CdrDecodeError),
    /// The message inside carries data bytes (they belong in the payload).
    #[error("envelope message carries {0} data bytes")]
    DataInside(usize),
}

/// Encodes the envelope of one message.
///
/// # Errors
/// [`CdrEncodeError`] when the message fields do not encode
/// ([`RosDataMessage::encode_cdr_prefix`]).
pub fn encode_envelope<M: RosDataMessage>(att: &Attachment, msg: &M) -> Result<Vec<u8>, CdrEncodeError> {
    let cdr = msg.encode_cdr_prefix(0)?;
    let suffix = data_suffix::<M>();
    let mut out = Vec::with_capacity(1 + ATTACHMENT_LEN + cdr.len() + suffix.len());
    out.push(ENVELOPE_VERSION);
    out.extend_from_slice(&att.encode());
    out.extend_from_slice(&cdr);
    out.extend_from_slice(suffix);
    Ok(out)
}

/// Decodes an envelope.
///
/// # Errors
/// [`EnvelopeError::Truncated`] when `bytes` is shorter than the version byte and the
/// attachment; [`EnvelopeError::Version`] for an unknown version byte;
/// [`EnvelopeError::Attachment`] for a malformed attachment; [`EnvelopeError::Cdr`]
/// when the message does not decode; [`EnvelopeError::DataInside`] when it carries
/// data bytes.
pub fn decode_envelope<M: RosDataMessage>(bytes: &[u8]) -> Result<(Attachment, M), EnvelopeError> {
    let (&version, rest) = bytes.split_first().ok_or(EnvelopeError::Truncated(0))?;
    if version != ENVELOPE_VERSION {
        return Err(EnvelopeError::Version(version));
    }
    if rest.len() < ATTACHMENT_LEN {
        return Err(EnvelopeError::Truncated(bytes.len()));
    }
    let att = Attachment::decode(&rest[..ATTACHMENT_LEN])?;
    let (msg, data) = M::decode_cdr(&rest[ATTACHMENT_LEN..])?;
    if !data.is_empty() {
        return Err(EnvelopeError::DataInside(data.len()));
    }
    Ok((att, msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensor_codec::cdr::{Header, Time};

    fn image() -> Image<()> {
        Image {
            header: Header { stamp: Time { sec: 3, nanosec: 4 }, frame_id: "cam".into() },
            height: 2,
            width: 3,
            encoding: "mono8".into(),
            is_bigendian: 0,
            step: 3,
            data: (),
        }
    }

    #[test]
    fn data_range_and_envelope() {
        let full = image().with_data((0..6).collect()).encode_cdr().unwrap();
        let (m, r) = <Image<()> as RosDataMessage>::decode_cdr(&full).unwrap();
        assert_eq!(m, image());
        assert_eq!(&full[r], &[0, 1, 2, 3, 4, 5]);

        let att = Attachment { seq: 9, timestamp_ns: 10, gid: [7; 16] };
        let env = encode_envelope(&att, &image()).unwrap();
        assert_eq!(decode_envelope::<Image<()>>(&env), Ok((att, image())));
        assert_eq!(decode_envelope::<Image<()>>(&[]), Err(EnvelopeError::Truncated(0)));
        assert_eq!(decode_envelope::<Image<()>>(&[2; 40]), Err(EnvelopeError::Version(2)));
        assert_eq!(decode_envelope::<Image<()>>(&env[..20]), Err(EnvelopeError::Truncated(20)));
        assert!(matches!(decode_envelope::<Image<()>>(&env[..env.len() - 5]), Err(EnvelopeError::Cdr(_))));
        // A tensor envelope is not an image envelope.
        assert!(decode_envelope::<ExperimentalTensor<()>>(&env).is_err());
        let mut with_data = env[..1 + ATTACHMENT_LEN].to_vec();
        with_data.extend(&full);
        assert_eq!(decode_envelope::<Image<()>>(&with_data), Err(EnvelopeError::DataInside(6)));
    }

    #[test]
    fn string_text_is_the_data() {
        let full = StringMsg { data: "Hello World: 3" }.encode_cdr().unwrap();
        let (m, r) = <StringMsg<()> as RosDataMessage>::decode_cdr(&full).unwrap();
        assert_eq!(&full[r.clone()], b"Hello World: 3");
        assert_eq!(m.with_data(full[r].to_vec()).data, "Hello World: 3");
        // Prefix, text and suffix make the message, as the publisher assembles it.
        let mut parts = StringMsg { data: () }.encode_cdr_prefix(14).unwrap();
        parts.extend_from_slice(b"Hello World: 3");
        parts.extend_from_slice(data_suffix::<StringMsg<()>>());
        assert_eq!(parts, full);
        // The envelope holds the empty string, whole.
        let att = Attachment { seq: 1, timestamp_ns: 2, gid: [3; 16] };
        let env = encode_envelope(&att, &StringMsg { data: () }).unwrap();
        assert_eq!(decode_envelope::<StringMsg<()>>(&env), Ok((att, StringMsg { data: () })));
        // Text is checked; bytes are not.
        assert!(check_data::<StringMsg<()>>(b"ok").is_ok());
        assert_eq!(check_data::<StringMsg<()>>(b"n\0"), Err(CdrEncodeError::InvalidText { field: "data", at: 1 }));
        assert!(check_data::<Image<()>>(b"\0\xff").is_ok());
    }
}
