//! The descriptor form of a `rosidl::Buffer` field with the CUDA backend's descriptor:
//! byte layout (the worked example of docs/cuda-buffer-backend.md, computed from the
//! released sources' field order and Fast-CDR's alignment rules), both release layouts,
//! and every malformed input refused with an error naming the field.

use tensor_codec::cdr::{
    BufferData, CdrDecodeError, CudaBufferDescriptor, CudaDescriptorLayout, ExperimentalTensor, Header, Image, Time,
};

fn frame() -> Image<()> {
    Image {
        header: Header { stamp: Time { sec: 1, nanosec: 2 }, frame_id: "camera".into() },
        height: 2160,
        width: 3840,
        encoding: "bgra8".into(),
        is_bigendian: 0,
        step: 3840 * 4,
        data: (),
    }
}

fn descriptor(layout: CudaDescriptorLayout) -> CudaBufferDescriptor {
    let mut ipc_event_handle = [0u8; 64];
    for (i, b) in ipc_event_handle.iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    CudaBufferDescriptor {
        size: 33_177_600,
        element_type_name: "h".into(),
        device_id: 1,
        use_ipc: true,
        vmm_pid: 12345,
        vmm_block_id: 3,
        vmm_block_size: 33_554_432,
        vmm_socket_path: "/tmp/cuda_vmm_12345_3.sock".into(),
        ipc_uid: 0x1122_3344_5566_7788,
        ipc_event_handle,
        layout,
    }
}

fn u32_at(body: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(body[at..at + 4].try_into().unwrap())
}

fn u64_at(body: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(body[at..at + 8].try_into().unwrap())
}

#[test]
fn image_with_a_cuda_descriptor_has_the_documented_layout() {
    let bytes = frame().encode_cdr_cuda(&descriptor(CudaDescriptorLayout::V0_1_2)).unwrap();
    assert_eq!(bytes[..4], [0, 1, 0, 0]);
    assert_eq!(bytes.len(), 212);
    let body = &bytes[4..];
    assert_eq!(body[44..52], [0xff, 0xff, 0xff, 0xff, 0x32, 0x53, 0x4f, 0x52]);
    assert_eq!(body[52..61], [5, 0, 0, 0, b'c', b'u', b'd', b'a', 0]);
    assert_eq!(body[61..64], [0, 0, 0], "padding before the u64 size");
    assert_eq!(u64_at(body, 64), 33_177_600);
    assert_eq!(body[72..78], [2, 0, 0, 0, b'h', 0]);
    assert_eq!(u32_at(body, 80), 1, "device_id");
    assert_eq!(body[84], 1, "use_ipc");
    assert_eq!(u32_at(body, 88), 12345);
    assert_eq!(u32_at(body, 92), 3);
    assert_eq!(u64_at(body, 96), 33_554_432);
    assert_eq!(u32_at(body, 104), 27);
    assert_eq!(&body[108..135], b"/tmp/cuda_vmm_12345_3.sock\0");
    assert_eq!(u64_at(body, 136), 0x1122_3344_5566_7788);
    assert_eq!(body[144], 1);
    assert_eq!(body[207], 64);

    let old = frame().encode_cdr_cuda(&descriptor(CudaDescriptorLayout::V0_1_1)).unwrap();
    assert_eq!(old.len(), 216, "0.1.1 adds an empty serialized_data");
    assert_eq!(old[..212], bytes[..]);
    assert_eq!(old[212..], [0, 0, 0, 0]);
}

#[test]
fn both_layouts_and_the_cpu_form_decode() {
    for layout in [CudaDescriptorLayout::V0_1_1, CudaDescriptorLayout::V0_1_2] {
        let d = descriptor(layout);
        let bytes = frame().encode_cdr_cuda(&d).unwrap();
        let got = Image::decode_cdr_buffer(&bytes).unwrap();
        assert_eq!(got.data, BufferData::Cuda(d.clone()));
        assert_eq!(got.map_data(|_| ()), frame());

        let t = ExperimentalTensor {
            dtype_code: 1,
            dtype_bits: 8,
            dtype_lanes: 1,
            shape: vec![2160, 3840, 4],
            strides: vec![],
            byte_offset: 0,
            data: (),
        };
        let bytes = t.encode_cdr_cuda(&d).unwrap();
        let got = ExperimentalTensor::decode_cdr_buffer(&bytes).unwrap();
        assert_eq!(got.data, BufferData::Cuda(d));
    }
    // The CPU form: the same bytes as the bytes-only decoder gives, borrowed.
    let cpu = frame().map_data(|()| vec![9u8; 12]).encode_cdr().unwrap();
    let got = Image::decode_cdr_buffer(&cpu).unwrap();
    assert_eq!(got.data, BufferData::Bytes(&[9u8; 12][..]));
    assert_eq!(Image::decode_cdr_borrowed(&cpu).unwrap().data, &[9u8; 12][..]);
    // An empty CPU buffer at the very end (fewer than 8 bytes after its length word).
    let empty = frame().map_data(|()| Vec::new()).encode_cdr().unwrap();
    assert_eq!(Image::decode_cdr_buffer(&empty).unwrap().data, BufferData::Bytes(&[]));
}

#[test]
fn bytes_only_decoders_name_the_descriptor_instead_of_a_bogus_length() {
    let bytes = frame().encode_cdr_cuda(&descriptor(CudaDescriptorLayout::V0_1_2)).unwrap();
    assert_eq!(
        Image::decode_cdr_borrowed(&bytes),
        Err(CdrDecodeError::BufferDescriptor { field: "data", backend: "cuda".into() })
    );
    assert_eq!(
        Image::decode_cdr(&bytes).unwrap_err().to_string(),
        "data: a rosidl::Buffer descriptor of backend \"cuda\", not bytes"
    );
}

#[test]
fn malformed_descriptors_are_refused() {
    let good = frame().encode_cdr_cuda(&descriptor(CudaDescriptorLayout::V0_1_2)).unwrap();
    // Every truncation is an error, never a panic.
    for n in 0..good.len() - 3 {
        assert!(Image::decode_cdr_buffer(&good[..n]).is_err(), "{n} bytes decoded");
    }
    // Another backend: its descriptor cannot be read past.
    let mut other = good[..4 + 52].to_vec();
    other.extend_from_slice(&[4, 0, 0, 0, b'r', b'o', b'c', 0]);
    assert_eq!(
        Image::decode_cdr_buffer(&other),
        Err(CdrDecodeError::UnknownBufferBackend { field: "data", backend: "roc".into() })
    );
    // use_ipc neither 0 nor 1.
    let mut bad_bool = good.clone();
    bad_bool[4 + 84] = 2;
    assert_eq!(
        Image::decode_cdr_buffer(&bad_bool),
        Err(CdrDecodeError::InvalidBool { field: "cuda descriptor use_ipc", value: 2 })
    );
    // Only the first marker word: a CPU sequence of u32::MAX bytes, which does not fit.
    let mut one_marker = good.clone();
    one_marker[4 + 48..4 + 52].copy_from_slice(&[0, 0, 0, 0]);
    assert!(matches!(
        Image::decode_cdr_buffer(&one_marker),
        Err(CdrDecodeError::Truncated { field: "data", needed, .. }) if needed == u32::MAX as usize
    ));
    // A 0.1.1 serialized_data claiming more than is there.
    let mut long = frame().encode_cdr_cuda(&descriptor(CudaDescriptorLayout::V0_1_1)).unwrap();
    long[212] = 9;
    assert!(matches!(
        Image::decode_cdr_buffer(&long),
        Err(CdrDecodeError::Truncated { field: "cuda descriptor serialized_data", .. })
    ));
    // Bytes after the descriptor beyond the tolerated padding.
    let mut trailing = frame().encode_cdr_cuda(&descriptor(CudaDescriptorLayout::V0_1_1)).unwrap();
    trailing.extend_from_slice(&[0; 4]);
    assert_eq!(Image::decode_cdr_buffer(&trailing), Err(CdrDecodeError::TrailingBytes { count: 4 }));
}
