//! Fuzzes the descriptor and bytes-header decoders: a `Descriptor` alone, the routed
//! frames that carry descriptors and small messages (`Reply`), and the attachment of
//! bytes samples (`ZCS\x01` + `BytesHeader`). The first input byte picks the decoder. Whatever decodes
//! must re-encode to the same bytes and decode to the same value (the decoder accepts
//! exactly one encoding per value: no trailing bytes, canonical varints).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zcs_wire::protocol::{self, BytesHeader, Descriptor, Reply};

fn roundtrip<T>(what: &'static str, bytes: &[u8])
where
    T: serde::Serialize + for<'a> serde::Deserialize<'a> + PartialEq + std::fmt::Debug,
{
    match protocol::decode::<T>(what, bytes) {
        Ok(v) => {
            let again = protocol::encode(&v);
            let back = protocol::decode::<T>(what, &again).expect("re-encoded value must decode");
            assert_eq!(back, v);
        }
        Err(e) => {
            // Every refusal has a message; formatting it must not panic either.
            assert!(!e.to_string().is_empty());
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&pick, bytes)) = input.split_first() else { return };
    match pick % 4 {
        0 => roundtrip::<Reply>("routed frame", bytes),
        1 => roundtrip::<Descriptor>("descriptor", bytes),
        2 => roundtrip::<BytesHeader>("bytes header", bytes),
        _ => match protocol::decode_attachment(bytes) {
            Ok(Some(h)) => {
                assert_eq!(protocol::decode_attachment(&protocol::encode_attachment(&h)), Ok(Some(h)));
            }
            Ok(None) => assert!(!bytes.starts_with(protocol::ATTACHMENT_MAGIC)),
            Err(e) => assert!(!e.to_string().is_empty()),
        },
    }
});
