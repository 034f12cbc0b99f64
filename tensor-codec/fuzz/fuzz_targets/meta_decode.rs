//! Fuzzes the postcard `TensorMeta` decoder: the first 8 bytes (if any) are the payload
//! length, the rest is the encoded metadata. Whatever decodes must validate, re-encode
//! and decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_codec::TensorMeta;

fuzz_target!(|input: &[u8]| {
    let (len, bytes) = match input.split_first_chunk::<8>() {
        Some((len, rest)) => (u64::from_le_bytes(*len), rest),
        None => (0, input),
    };
    if let Ok(meta) = TensorMeta::decode(bytes, len) {
        let extent = meta.validate(len).expect("decoded metadata must validate");
        assert!(extent.end <= len);
        let again = meta.encode(len).expect("decoded metadata must re-encode");
        assert_eq!(TensorMeta::decode(&again, len).as_ref(), Ok(&meta));
        let _ = meta.effective_strides();
        let _ = meta.is_contiguous();
    }
});
