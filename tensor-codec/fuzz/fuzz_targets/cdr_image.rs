//! Fuzzes the `sensor_msgs/msg/Image` CDR decoder (borrowed and owned). Whatever decodes
//! must re-encode and decode to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_codec::cdr::Image;

fuzz_target!(|bytes: &[u8]| {
    let borrowed = Image::decode_cdr_borrowed(bytes);
    let owned = Image::decode_cdr(bytes);
    assert_eq!(borrowed.as_ref().map(Image::to_owned_data).ok(), owned.clone().ok());
    if let Ok(view) = borrowed {
        let again = view.encode_cdr().expect("decoded image must re-encode");
        assert_eq!(Image::decode_cdr_borrowed(&again).as_ref(), Ok(&view));
    }
});
