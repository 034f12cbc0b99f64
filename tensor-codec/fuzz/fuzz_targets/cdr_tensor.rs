//! Fuzzes the `tensor_msgs/msg/ExperimentalTensor` CDR decoder (borrowed and owned) and
//! the conversion to `TensorMeta`. Whatever decodes must re-encode and decode to the same
//! message; whatever converts must validate and convert back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_codec::Device;
use tensor_codec::cdr::ExperimentalTensor;

fuzz_target!(|bytes: &[u8]| {
    let borrowed = ExperimentalTensor::decode_cdr_borrowed(bytes);
    let owned = ExperimentalTensor::decode_cdr(bytes);
    assert_eq!(borrowed.as_ref().map(ExperimentalTensor::to_owned_data).ok(), owned.clone().ok());
    if let Ok(view) = borrowed {
        let again = view.encode_cdr().expect("decoded tensor must re-encode");
        assert_eq!(ExperimentalTensor::decode_cdr_borrowed(&again).as_ref(), Ok(&view));
        if let Ok(meta) = view.meta(Device::cuda(0)) {
            let len = view.data.len() as u64;
            assert!(meta.validate(len).is_ok());
            let back = meta.to_experimental_tensor(view.data).expect("valid meta converts back");
            assert_eq!(back, view);
            let wire = meta.encode(len).expect("valid meta encodes");
            assert_eq!(tensor_codec::TensorMeta::decode(&wire, len).as_ref(), Ok(&meta));
        }
    }
});
