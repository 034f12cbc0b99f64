//! Fuzzes the `sensor_msgs/msg/Image` CDR decoders: bytes only (borrowed and owned), and
//! either form of the data field (bytes or a CUDA buffer descriptor). Whatever decodes
//! must re-encode and decode to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_codec::cdr::{BufferData, Image};

fuzz_target!(|bytes: &[u8]| {
    let borrowed = Image::decode_cdr_borrowed(bytes);
    let owned = Image::decode_cdr(bytes);
    assert_eq!(borrowed.as_ref().map(Image::to_owned_data).ok(), owned.clone().ok());
    if let Ok(view) = &borrowed {
        let again = view.encode_cdr().expect("decoded image must re-encode");
        assert_eq!(Image::decode_cdr_borrowed(&again).as_ref(), Ok(view));
    }
    match Image::decode_cdr_buffer(bytes) {
        Ok(Image { data: BufferData::Bytes(b), .. }) => {
            assert_eq!(borrowed.map(|v| v.data), Ok(b), "the CPU form decodes alike either way");
        }
        Ok(msg @ Image { data: BufferData::Cuda(_), .. }) => {
            let BufferData::Cuda(d) = &msg.data else { unreachable!() };
            let again = msg.clone().map_data(|_| ()).encode_cdr_cuda(d).expect("decoded descriptor must re-encode");
            assert_eq!(Image::decode_cdr_buffer(&again).as_ref(), Ok(&msg));
        }
        Err(_) => {}
    }
});
