use crate::pool::BlockKey;

use super::*;

fn group() -> Group {
    Group {
        boot_id: "0b5c7e1e-3d7c-4a0e-9a43-1f1d2c3b4a59".into(),
        device: "cuda-00112233445566778899aabbccddeeff".into(),
    }
}

#[test]
fn tokens_round_trip() {
    for t in [
        Token {
            role: Role::Pub,
            key: "camera/front".into(),
            instance: 42,
            group: group(),
            socket: Some("a7a63".into()),
        },
        Token { role: Role::Sub, key: "camera/**".into(), instance: u64::MAX, group: group(), socket: None },
    ] {
        let k = t.to_key();
        assert!(!k.contains("**") || k.starts_with(TOKEN_ROOT));
        assert_eq!(Token::parse(&k), Some(t));
    }
}

#[test]
fn malformed_tokens_are_refused() {
    for bad in [
        "",
        "@zcs/v1",
        "@zcs/v2/pub/61/1/b/d/s",
        "@zcs/v1/pub/61/1/b/d",
        "@zcs/v1/sub/61/1/b/d/extra",
        "@zcs/v1/pub/6/1/b/d/s",
        "@zcs/v1/pub/zz/1/b/d/s",
        "@zcs/v1/pub/61/xyz/b/d/s",
        "@zcs/v1/pub/61/1/b/d/s*",
        "@zcs/v1/pub/ff/1/b/d/s",
    ] {
        assert_eq!(Token::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn descriptors_round_trip_and_reject_bad_input() {
    let d = Descriptor {
        publisher: 1,
        seq: 2,
        block: BlockKey { id: 3, alloc: 8, generation: 4 },
        capability: 5,
        block_size: 6,
        offset: 0,
        len: 6,
        timestamp_ns: 7,
        meta: Some(vec![1, 2, 3]),
        lent: Some(9),
    };
    let bytes = encode(&d);
    assert_eq!(decode::<Descriptor>("descriptor", &bytes), Ok(d.clone()));
    for r in [
        Reply::Block(d),
        Reply::Inline { seq: 9, timestamp_ns: 1, meta: None, data: vec![7; 300] },
        Reply::ViaBytes { seq: 10 },
        Reply::Ready { first_seq: 11, bytes_through: 9 },
        Reply::Left,
    ] {
        assert_eq!(decode::<Reply>("reply", &encode(&r)), Ok(r));
    }
    let mut future = bytes.clone();
    future[0] = VERSION + 1;
    assert_eq!(decode::<Descriptor>("descriptor", &future), Err(DecodeError::Version { found: VERSION + 1 }));
    assert_eq!(decode::<Descriptor>("descriptor", &[]), Err(DecodeError::Empty));
    for cut in 1..bytes.len() {
        assert!(decode::<Descriptor>("descriptor", &bytes[..cut]).is_err(), "truncated at {cut}");
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(matches!(decode::<Descriptor>("descriptor", &long), Err(DecodeError::Malformed { .. })));
}

#[test]
fn provider_tokens_and_messages_round_trip() {
    let t =
        ProviderToken { boot_id: "0123abcd-ef".into(), provider: ProviderRef { id: 0xfeed, socket: "aabcdef".into() } };
    assert_eq!(t.to_key(), "@zcs/v1/provider/0123abcd-ef/000000000000feed/aabcdef");
    assert_eq!(ProviderToken::parse(&t.to_key()), Some(t));
    for bad in [
        "@zcs/v1/provider/b/00ff",
        "@zcs/v1/provider/b/00ff/s/x",
        "@zcs/v1/provider/b/zz/s",
        "@zcs/v1/provider/b/00000000000000001/s",
        "@zcs/v1/provider/b//s",
        "@zcs/v1/pub/b/00ff/s",
    ] {
        assert_eq!(ProviderToken::parse(bad), None, "{bad}");
    }
    let r = ProviderRequest::Borrow { tag: 1, device: "host".into(), size: 2 << 20 };
    assert_eq!(decode::<ProviderRequest>("provider request", &encode(&r)), Ok(r));
    let a = ProviderReply::Refused { tag: 1, reason: "no".into(), permanent: true };
    let mut bytes = encode(&a);
    assert_eq!(decode::<ProviderReply>("provider reply", &bytes), Ok(a));
    bytes.push(0);
    assert!(decode::<ProviderReply>("provider reply", &bytes).is_err());
}

#[test]
fn attachments_are_recognised_only_with_magic() {
    let h = BytesHeader { publisher: 9, seq: 1, timestamp_ns: 0, from_block: true, tag: 3, meta: None };
    assert_eq!(decode_attachment(&encode_attachment(&h)), Ok(Some(h)));
    assert_eq!(decode_attachment(b"\x01\x02rmw"), Ok(None));
    assert!(decode_attachment(b"ZCS\x01\x09").is_err());
}

#[test]
fn keys() {
    assert_eq!(bytes_key("a/b"), "a/b/@zcs/b");
    assert_eq!(Group::cuda_device(&crate::cuda::GpuUuid([0xab; 16])), format!("cuda-{}", "ab".repeat(16)));
}

#[test]
fn a_bytes_key_leads_back_to_its_key() {
    assert_eq!(bytes_key("a/b"), format!("a/b/{CHANNEL_CHUNK}/b"));
    assert_eq!(key_of_bytes_key(&bytes_key("a/b")), "a/b");
    assert_eq!(key_of_bytes_key("a/b"), "a/b");
}
