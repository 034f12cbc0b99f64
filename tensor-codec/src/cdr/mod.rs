//! ROS 2 messages in CDR, byte-exact with rmw_zenoh / rmw_fastrtps (Fast-CDR, XCDR1).
//!
//! # Wire rules
//!
//! - A 4-byte encapsulation header comes first. The encoders always write `00 01 00 00`
//!   (`CDR_LE`, options 0), which is what rmw_zenoh writes on little-endian hosts.
//! - The decoders accept `00 01` (little-endian) **and** `00 00` (`CDR_BE`, big-endian),
//!   as Fast-CDR's `read_encapsulation` does, so a message from a big-endian host still
//!   decodes. The two option bytes are ignored. Any other representation identifier
//!   (parameter lists, XCDR2) is rejected with [`CdrDecodeError::UnsupportedEncapsulation`].
//! - Alignment is relative to the first byte after the header. A primitive of size *n* is
//!   aligned to *n* (8-byte types to 8) by zero padding.
//! - A string is a `u32` length that counts the terminating NUL, the bytes, then the NUL;
//!   it is not padded. Decoders also accept length 0 as the empty string (Fast-CDR does).
//!   Strings must be UTF-8 ([`CdrDecodeError::InvalidUtf8`]).
//! - A sequence is a `u32` element count, then the elements; the elements are aligned
//!   only when the count is non-zero.
//! - Nested structures are inlined in `.msg` field order; there is no trailing padding.
//!   Decoders tolerate up to 3 bytes after the message (padding some writers add, and
//!   what `rosbags` tolerates) and reject more ([`CdrDecodeError::TrailingBytes`]).
//!
//! # Hostile input
//!
//! Every length field is checked against the bytes that remain *before* anything is
//! allocated, so the decoders never allocate more than a small multiple of the input
//! size, and never panic. Errors name the field (`"header.frame_id"`, `"shape"`, ...).
//!
//! # Zero copy
//!
//! The messages are generic over their `data` field. `decode_cdr_borrowed` returns
//! `data` as a `&[u8]` into the input; `decode_cdr` copies it into a `Vec<u8>`. Since
//! `data` is the last field of both messages, `encode_cdr_prefix` writes everything before
//! the data bytes, so a producer can place the data right after it (for example in a
//! shared-memory buffer) without assembling the message in between.

mod buffer;
mod encoding;
mod image;
mod string;
mod tensor;

pub use buffer::{
    BufferData, CUDA_BACKEND, CUDA_ELEMENT_TYPE_U8, CudaBufferDescriptor, CudaDescriptorError, CudaDescriptorLayout,
    DESCRIPTOR_MARKER_1, DESCRIPTOR_MARKER_2,
};
pub use encoding::{PixelLayoutError, pixel_layout};
pub use image::{Header, Image, Time};
pub use string::StringMsg;
pub use tensor::ExperimentalTensor;

/// The encapsulation header the encoders write: `CDR_LE`, options 0.
pub const CDR_LE_HEADER: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

/// Bytes after the message that decoders tolerate (alignment padding).
const MAX_TRAILING: usize = 3;

/// Why a CDR decoder rejected its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CdrDecodeError {
    /// The representation identifier is neither `CDR_BE` (`00 00`) nor `CDR_LE` (`00 01`).
    #[error("unsupported CDR encapsulation {:02x} {:02x} (expected 00 01 or 00 00)", .id[0], .id[1])]
    UnsupportedEncapsulation {
        /// The first two bytes of the input.
        id: [u8; 2],
    },
    /// The input ends inside a field, or a length field claims more than what is left.
    #[error("{field}: needs {needed} bytes but only {available} remain")]
    Truncated {
        /// The field being read (`"encapsulation"` for the 4-byte header).
        field: &'static str,
        /// Bytes the field needs (padding included). Saturates at `usize::MAX`.
        needed: usize,
        /// Bytes left in the input.
        available: usize,
    },
    /// A string's last byte (inside its declared length) is not NUL.
    #[error("{field}: string is not NUL-terminated")]
    UnterminatedString {
        /// The string field.
        field: &'static str,
    },
    /// A string is not UTF-8.
    #[error("{field}: string is not valid UTF-8")]
    InvalidUtf8 {
        /// The string field.
        field: &'static str,
        /// Where decoding failed.
        #[source]
        source: std::str::Utf8Error,
    },
    /// A `bool` is neither 0 nor 1.
    #[error("{field}: {value} is not a bool (0 or 1)")]
    InvalidBool {
        /// The field.
        field: &'static str,
        /// The byte read.
        value: u8,
    },
    /// A buffer field holds a backend's descriptor where this decoder takes only bytes
    /// (see [`BufferData`] for the decoders that take both).
    #[error("{field}: a rosidl::Buffer descriptor of backend {backend:?}, not bytes")]
    BufferDescriptor {
        /// The buffer field.
        field: &'static str,
        /// The backend the descriptor names.
        backend: String,
    },
    /// A buffer field holds the descriptor of a backend this crate does not know (only
    /// `cuda`'s is defined here); the message cannot be read past it.
    #[error("{field}: a descriptor of the unknown buffer backend {backend:?}")]
    UnknownBufferBackend {
        /// The buffer field.
        field: &'static str,
        /// The backend the descriptor names.
        backend: String,
    },
    /// More than 3 bytes follow the message.
    #[error("{count} unexpected bytes after the message")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
}

/// Why a CDR encoder refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CdrEncodeError {
    /// A string or sequence is longer than the `u32` length field can express.
    #[error("{field}: length {len} does not fit the 32-bit CDR length field")]
    TooLong {
        /// The string or sequence field.
        field: &'static str,
        /// Its length (bytes for strings, elements for sequences).
        len: usize,
    },
    /// Text for a `string` field that is not UTF-8 or holds a NUL byte.
    #[error("{field}: not UTF-8 without NUL bytes (at byte {at})")]
    InvalidText {
        /// The string field.
        field: &'static str,
        /// The offset of the first byte that is not allowed.
        at: usize,
    },
    /// A buffer backend's descriptor was to be encoded into a message type that has no
    /// buffer field.
    #[error("{type_name} has no buffer field to carry a descriptor")]
    NoBufferField {
        /// The message type.
        type_name: &'static str,
    },
}

/// Reads XCDR1 values from the bytes after the encapsulation header.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl<'a> Reader<'a> {
    /// Checks the encapsulation header and returns a reader over the body.
    pub(crate) fn new(input: &'a [u8]) -> Result<Self, CdrDecodeError> {
        let Some((header, body)) = input.split_first_chunk::<4>() else {
            return Err(CdrDecodeError::Truncated { field: "encapsulation", needed: 4, available: input.len() });
        };
        let big_endian = match [header[0], header[1]] {
            [0x00, 0x01] => false,
            [0x00, 0x00] => true,
            id => return Err(CdrDecodeError::UnsupportedEncapsulation { id }),
        };
        Ok(Reader { buf: body, pos: 0, big_endian })
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Takes `n` bytes after `pad` bytes of padding, checking both against what is left.
    fn take_padded(&mut self, pad: usize, n: usize, field: &'static str) -> Result<&'a [u8], CdrDecodeError> {
        let needed = pad.saturating_add(n);
        let available = self.remaining();
        if needed > available {
            return Err(CdrDecodeError::Truncated { field, needed, available });
        }
        let start = self.pos + pad;
        self.pos = start + n;
        Ok(&self.buf[start..start + n])
    }

    fn padding(&self, align: usize) -> usize {
        (align - self.pos % align) % align
    }

    /// Reads an aligned primitive of `N` bytes.
    fn prim<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], CdrDecodeError> {
        let pad = self.padding(N);
        let bytes = self.take_padded(pad, N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        if self.big_endian {
            out.reverse();
        }
        // `out` is now little-endian.
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, CdrDecodeError> {
        Ok(self.prim::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, CdrDecodeError> {
        self.prim::<2>(field).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, CdrDecodeError> {
        self.prim::<4>(field).map(u32::from_le_bytes)
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, CdrDecodeError> {
        self.prim::<4>(field).map(i32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, CdrDecodeError> {
        self.prim::<8>(field).map(u64::from_le_bytes)
    }

    /// A sequence length followed by the check that `count * elem_size` bytes (after the
    /// element alignment, when `count > 0`) remain. Returns the count and the raw element
    /// bytes.
    fn seq_bytes(&mut self, elem_size: usize, field: &'static str) -> Result<(usize, &'a [u8]), CdrDecodeError> {
        let count = self.u32(field)? as usize;
        if count == 0 {
            // An empty slice at the current position, so that even empty `data` points
            // into the input.
            return Ok((0, &self.buf[self.pos..self.pos]));
        }
        let pad = self.padding(elem_size);
        let n = count.saturating_mul(elem_size);
        Ok((count, self.take_padded(pad, n, field)?))
    }

    /// `uint8[]`, borrowed.
    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], CdrDecodeError> {
        self.seq_bytes(1, field).map(|(_, bytes)| bytes)
    }

    /// `int64[]`.
    pub(crate) fn i64_seq(&mut self, field: &'static str) -> Result<Vec<i64>, CdrDecodeError> {
        let (count, bytes) = self.seq_bytes(8, field)?;
        // The length was checked against the input: this allocates at most input-sized.
        let mut out = Vec::with_capacity(count);
        for chunk in bytes.chunks_exact(8) {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(chunk);
            out.push(if self.big_endian { i64::from_be_bytes(raw) } else { i64::from_le_bytes(raw) });
        }
        Ok(out)
    }

    /// `string` (unbounded), as UTF-8.
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, CdrDecodeError> {
        self.str(field).map(str::to_owned)
    }

    /// `string` (unbounded), borrowed.
    pub(crate) fn str(&mut self, field: &'static str) -> Result<&'a str, CdrDecodeError> {
        let len = self.u32(field)? as usize;
        if len == 0 {
            return Ok("");
        }
        let bytes = self.take_padded(0, len, field)?;
        let (&nul, text) = bytes.split_last().ok_or(CdrDecodeError::UnterminatedString { field })?;
        if nul != 0 {
            return Err(CdrDecodeError::UnterminatedString { field });
        }
        std::str::from_utf8(text).map_err(|source| CdrDecodeError::InvalidUtf8 { field, source })
    }

    /// Ends decoding: at most [`MAX_TRAILING`] bytes may be left.
    pub(crate) fn finish(self) -> Result<(), CdrDecodeError> {
        match self.remaining() {
            n if n <= MAX_TRAILING => Ok(()),
            count => Err(CdrDecodeError::TrailingBytes { count }),
        }
    }
}

/// Writes little-endian XCDR1 after the `CDR_LE` header.
pub(crate) struct Writer {
    out: Vec<u8>,
}

impl Writer {
    pub(crate) fn with_capacity(body_capacity: usize) -> Self {
        let mut out = Vec::with_capacity(CDR_LE_HEADER.len().saturating_add(body_capacity));
        out.extend_from_slice(&CDR_LE_HEADER);
        Writer { out }
    }

    fn align(&mut self, align: usize) {
        let pos = self.out.len() - CDR_LE_HEADER.len();
        let pad = (align - pos % align) % align;
        self.out.resize(self.out.len() + pad, 0);
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.align(2);
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.align(4);
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn i32(&mut self, v: i32) {
        self.align(4);
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.align(8);
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    fn len32(len: usize, field: &'static str) -> Result<u32, CdrEncodeError> {
        u32::try_from(len).map_err(|_| CdrEncodeError::TooLong { field, len })
    }

    /// A sequence count; elements follow (aligned by the caller's element writes).
    pub(crate) fn seq_len(&mut self, len: usize, field: &'static str) -> Result<(), CdrEncodeError> {
        self.u32(Self::len32(len, field)?);
        Ok(())
    }

    pub(crate) fn i64_seq(&mut self, values: &[i64], field: &'static str) -> Result<(), CdrEncodeError> {
        self.seq_len(values.len(), field)?;
        if !values.is_empty() {
            self.align(8);
        }
        for v in values {
            self.out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    pub(crate) fn string(&mut self, s: &str, field: &'static str) -> Result<(), CdrEncodeError> {
        // The length counts the terminating NUL.
        let len = u32::try_from(s.len())
            .ok()
            .and_then(|n| n.checked_add(1))
            .ok_or(CdrEncodeError::TooLong { field, len: s.len() })?;
        self.u32(len);
        self.out.extend_from_slice(s.as_bytes());
        self.out.push(0);
        Ok(())
    }

    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    pub(crate) fn into_inner(self) -> Vec<u8> {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checks() {
        assert_eq!(
            Reader::new(&[0, 1, 0]).err(),
            Some(CdrDecodeError::Truncated { field: "encapsulation", needed: 4, available: 3 })
        );
        for id in [[0u8, 2], [0, 3], [0, 6], [1, 1], [0xff, 0]] {
            assert_eq!(Reader::new(&[id[0], id[1], 0, 0]).err(), Some(CdrDecodeError::UnsupportedEncapsulation { id }));
        }
        assert!(Reader::new(&[0, 0, 0xaa, 0xbb]).is_ok());
        assert!(Reader::new(&[0, 1, 0, 0]).is_ok());
    }

    #[test]
    fn alignment_is_relative_to_body() {
        let mut w = Writer::with_capacity(0);
        w.u8(7);
        w.u64(0x0102_0304_0506_0708);
        w.u8(1);
        w.u16(2);
        w.u8(3);
        w.i32(-1);
        let bytes = w.into_inner();
        assert_eq!(
            bytes,
            [
                0, 1, 0, 0, // header
                7, 0, 0, 0, 0, 0, 0, 0, // u8 + pad to 8
                8, 7, 6, 5, 4, 3, 2, 1, // u64
                1, 0, 2, 0, // u8, pad, u16
                3, 0, 0, 0, // u8, pad to 4
                0xff, 0xff, 0xff, 0xff,
            ]
        );
        let mut r = Reader::new(&bytes).unwrap();
        assert_eq!(r.u8("a"), Ok(7));
        assert_eq!(r.u64("b"), Ok(0x0102_0304_0506_0708));
        assert_eq!(r.u8("c"), Ok(1));
        assert_eq!(r.u16("d"), Ok(2));
        assert_eq!(r.u8("e"), Ok(3));
        assert_eq!(r.i32("f"), Ok(-1));
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn big_endian_reads() {
        let bytes = [0, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0];
        let mut r = Reader::new(&bytes).unwrap();
        assert_eq!(r.u16("a"), Ok(0x1234));
        assert_eq!(r.u32("n"), Ok(2));
        // Re-read a sequence from a fresh position: count 2 at offset 4.
        let mut r = Reader::new(&bytes).unwrap();
        r.u32("skip").unwrap();
        let seq = r.i64_seq("s").unwrap();
        assert_eq!(seq, vec![1, 256]);
    }

    #[test]
    fn strings() {
        let mut w = Writer::with_capacity(0);
        w.string("ab", "s").unwrap();
        w.string("", "t").unwrap();
        let bytes = w.into_inner();
        assert_eq!(bytes[4..], [3, 0, 0, 0, b'a', b'b', 0, 0, 1, 0, 0, 0, 0]);
        let mut r = Reader::new(&bytes).unwrap();
        assert_eq!(r.string("s").as_deref(), Ok("ab"));
        assert_eq!(r.string("t").as_deref(), Ok(""));

        // Length 0 is accepted as "".
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(r.string("s").as_deref(), Ok(""));
        // Missing NUL.
        let mut r = Reader::new(&[0, 1, 0, 0, 2, 0, 0, 0, b'a', b'b']).unwrap();
        assert_eq!(r.string("s"), Err(CdrDecodeError::UnterminatedString { field: "s" }));
        // Not UTF-8.
        let mut r = Reader::new(&[0, 1, 0, 0, 2, 0, 0, 0, 0xff, 0]).unwrap();
        assert!(matches!(r.string("s"), Err(CdrDecodeError::InvalidUtf8 { field: "s", .. })));
        // Length beyond the input.
        let mut r = Reader::new(&[0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0]).unwrap();
        assert_eq!(
            r.string("s"),
            Err(CdrDecodeError::Truncated { field: "s", needed: u32::MAX as usize, available: 1 })
        );
    }

    #[test]
    fn sequence_lengths_checked_before_allocation() {
        // count = u32::MAX int64s with 8 bytes left.
        let mut bytes = vec![0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff];
        bytes.extend_from_slice(&[0; 8]);
        let mut r = Reader::new(&bytes).unwrap();
        assert_eq!(
            r.i64_seq("shape"),
            Err(CdrDecodeError::Truncated {
                field: "shape",
                needed: 4 + u32::MAX as usize * 8, // padding to 8, then the elements
                available: 8
            })
        );
        // An empty sequence needs no alignment.
        let mut r = Reader::new(&[0, 1, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(r.i64_seq("shape"), Ok(vec![]));
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn trailing_bytes() {
        let r = Reader::new(&[0, 1, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(r.finish(), Ok(()));
        let r = Reader::new(&[0, 1, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(r.finish(), Err(CdrDecodeError::TrailingBytes { count: 4 }));
    }
}
