//! Fuzzes the control protocol's message decoders: `Request` (what a publisher reads
//! from any same-uid process that connects), `Reply` (what a subscriber reads from a
//! publisher), and the host provider's `ProviderRequest` / `ProviderReply`. The first
//! input byte picks the decoder. Whatever decodes must
//! re-encode and decode to the same value and fit in one control frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zcs_wire::ipc::MAX_FRAME_BYTES;
use zcs_wire::protocol::{self, ProviderReply, ProviderRequest, Reply, Request};

fn roundtrip<T>(what: &'static str, bytes: &[u8])
where
    T: serde::Serialize + for<'a> serde::Deserialize<'a> + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = protocol::decode::<T>(what, bytes) {
        let again = protocol::encode(&v);
        assert!(again.len() <= bytes.len().max(MAX_FRAME_BYTES), "re-encoding grew past a frame");
        assert_eq!(protocol::decode::<T>(what, &again).expect("re-encoded value must decode"), v);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&pick, bytes)) = input.split_first() else { return };
    match pick & 3 {
        0 => roundtrip::<Request>("control request", bytes),
        1 => roundtrip::<Reply>("control reply", bytes),
        2 => roundtrip::<ProviderRequest>("provider request", bytes),
        _ => roundtrip::<ProviderReply>("provider reply", bytes),
    }
});
