//! `std_msgs/msg/String`: one `string data` field, the message of ROS 2's talker and
//! listener demos.

use super::{CdrDecodeError, CdrEncodeError, Reader, Writer};

/// `std_msgs/msg/String`, generic over its text: `String` when owned, `&str` when
/// borrowed from the input by [`StringMsg::decode_cdr_borrowed`], `()` for the message
/// without its text (whose CDR is then a prefix, see [`StringMsg::encode_cdr_prefix`]).
///
/// ```
/// use tensor_codec::cdr::StringMsg;
///
/// let msg = StringMsg { data: "Hello World: 1".to_owned() };
/// let bytes = msg.encode_cdr()?;
/// assert_eq!(bytes.len(), 4 + 4 + 14 + 1); // header, length, text, NUL
/// assert_eq!(StringMsg::decode_cdr_borrowed(&bytes)?.data, "Hello World: 1");
/// assert_eq!(StringMsg::decode_cdr(&bytes)?, msg);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct StringMsg<D = String> {
    /// `string data`: UTF-8 without NUL bytes.
    pub data: D,
}

impl<D> StringMsg<D> {
    /// Replaces the text through `f`.
    pub fn map_data<E>(self, f: impl FnOnce(D) -> E) -> StringMsg<E> {
        StringMsg { data: f(self.data) }
    }
}

impl StringMsg<()> {
    /// What follows the text in CDR: the string's terminating NUL.
    pub const SUFFIX: [u8; 1] = [0];

    /// The encapsulation header and the string's length field for a text of `text_len`
    /// bytes. The complete message is this prefix, the text, then [`StringMsg::SUFFIX`].
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] when `text_len + 1` exceeds `u32`.
    pub fn encode_cdr_prefix(&self, text_len: usize) -> Result<Vec<u8>, CdrEncodeError> {
        let len = u32::try_from(text_len)
            .ok()
            .and_then(|n| n.checked_add(1))
            .ok_or(CdrEncodeError::TooLong { field: "data", len: text_len })?;
        let mut w = Writer::with_capacity(4);
        w.u32(len);
        Ok(w.into_inner())
    }

    /// Checks text bytes that are to be published as this message's `data`: UTF-8 with
    /// no NUL (a NUL would end the string early for every C reader).
    ///
    /// # Errors
    /// [`CdrEncodeError::InvalidText`] naming the first offending byte.
    pub fn check_text(text: &[u8]) -> Result<(), CdrEncodeError> {
        let s = std::str::from_utf8(text)
            .map_err(|e| CdrEncodeError::InvalidText { field: "data", at: e.valid_up_to() })?;
        match s.bytes().position(|b| b == 0) {
            Some(at) => Err(CdrEncodeError::InvalidText { field: "data", at }),
            None => Ok(()),
        }
    }
}

impl<D: AsRef<str>> StringMsg<D> {
    /// Encodes the message: `00 01 00 00`, the length, the text and its NUL.
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] when the text exceeds `u32`;
    /// [`CdrEncodeError::InvalidText`] when it holds a NUL.
    pub fn encode_cdr(&self) -> Result<Vec<u8>, CdrEncodeError> {
        let text = self.data.as_ref();
        StringMsg::check_text(text.as_bytes())?;
        let mut w = Writer::with_capacity(4 + text.len() + 1);
        w.string(text, "data")?;
        Ok(w.into_inner())
    }
}

impl<'a> StringMsg<&'a str> {
    /// Decodes a message, its text borrowed from `bytes`.
    ///
    /// # Errors
    /// [`CdrDecodeError`] for a truncated input, an unknown encapsulation, a string that
    /// is not NUL-terminated or not UTF-8, or bytes after the message.
    pub fn decode_cdr_borrowed(bytes: &'a [u8]) -> Result<Self, CdrDecodeError> {
        let mut r = Reader::new(bytes)?;
        let data = r.str("data")?;
        r.finish()?;
        Ok(StringMsg { data })
    }
}

impl StringMsg<String> {
    /// Decodes a message into an owned one.
    ///
    /// # Errors
    /// As [`StringMsg::decode_cdr_borrowed`].
    pub fn decode_cdr(bytes: &[u8]) -> Result<Self, CdrDecodeError> {
        StringMsg::decode_cdr_borrowed(bytes).map(|m| m.map_data(str::to_owned))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_text_suffix_is_the_message() {
        let whole = StringMsg { data: "héllo" }.encode_cdr().unwrap();
        let mut parts = StringMsg { data: () }.encode_cdr_prefix("héllo".len()).unwrap();
        parts.extend_from_slice("héllo".as_bytes());
        parts.extend_from_slice(&StringMsg::SUFFIX);
        assert_eq!(whole, parts);
        assert_eq!(whole, [0, 1, 0, 0, 7, 0, 0, 0, b'h', 0xc3, 0xa9, b'l', b'l', b'o', 0]);
        assert_eq!(StringMsg::decode_cdr(&whole).unwrap().data, "héllo");
        // The empty string, as written (length 1) and as Fast-CDR also accepts (length 0).
        assert_eq!(StringMsg::decode_cdr_borrowed(&[0, 1, 0, 0, 1, 0, 0, 0, 0]).unwrap().data, "");
        assert_eq!(StringMsg::decode_cdr_borrowed(&[0, 1, 0, 0, 0, 0, 0, 0]).unwrap().data, "");
        // Big-endian input.
        assert_eq!(StringMsg::decode_cdr_borrowed(&[0, 0, 0, 0, 0, 0, 0, 2, b'x', 0]).unwrap().data, "x");
    }

    #[test]
    fn bad_text_is_refused() {
        assert_eq!(StringMsg::check_text(b"ok"), Ok(()));
        assert_eq!(StringMsg::check_text(b"a\0b"), Err(CdrEncodeError::InvalidText { field: "data", at: 1 }));
        assert_eq!(StringMsg::check_text(b"ab\xff"), Err(CdrEncodeError::InvalidText { field: "data", at: 2 }));
        assert!(StringMsg { data: "a\0" }.encode_cdr().is_err());
        let not_terminated = [0, 1, 0, 0, 2, 0, 0, 0, b'a', b'b'];
        assert_eq!(
            StringMsg::decode_cdr_borrowed(&not_terminated),
            Err(CdrDecodeError::UnterminatedString { field: "data" })
        );
        assert!(matches!(
            StringMsg::decode_cdr_borrowed(&[0, 1, 0, 0, 2, 0, 0, 0, 0xff, 0]),
            Err(CdrDecodeError::InvalidUtf8 { field: "data", .. })
        ));
        assert!(matches!(
            StringMsg::decode_cdr_borrowed(&[0, 1, 0, 0, 9, 0, 0, 0, b'a', 0]),
            Err(CdrDecodeError::Truncated { field: "data", .. })
        ));
        assert_eq!(
            StringMsg::decode_cdr_borrowed(&[0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 2, 3, 4]),
            Err(CdrDecodeError::TrailingBytes { count: 4 })
        );
    }
}
