//! Byte-exact checks of what the `ros2` module puts on the wire, against the worked
//! example of rmw_zenoh's protocol (`/camera/image`, `sensor_msgs/msg/Image`, domain 0;
//! written down in docs/ros2.md): data key, node and endpoint tokens, QoS component,
//! GID (XXH3-128 of the token) and the 33-byte attachment, on the Jazzy and later wires
//! and on Humble's (docs/ros2-humble.md). The CDR bodies are checked against `rosbags` by
//! `tests/python/test_ros2_peer.py`.

use tensor_codec::cdr::{ExperimentalTensor, Header, Image, Time};
use zenoh_cuda_shm::tensor_codec;
use zenoh_cuda_shm_ros2::message::{RosDataMessage, decode_envelope, encode_envelope};
use zenoh_cuda_shm_ros2::names::{HUMBLE_TYPE_HASH, NodeName, canonical_token, gid_hex, gid_of, hash_token, topic_key};
use zenoh_cuda_shm_ros2::{Attachment, AttachmentError, Backends, Entity, EntityKind, Qos, RmwWire, channel_key};

const ZID: &str = "aac3178e146ba6f1fc6e6a4085e77f21";
const IMAGE_HASH: &str = "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47";
const DATA_KEY: &str = "0/camera/image/sensor_msgs::msg::dds_::Image_/RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47";
const NODE_TOKEN: &str = "@ros2_lv/0/aac3178e146ba6f1fc6e6a4085e77f21/0/0/NN/%/%/camera_driver";
const PUB_TOKEN: &str = "@ros2_lv/0/aac3178e146ba6f1fc6e6a4085e77f21/0/5/MP/%/%/camera_driver/%camera%image/sensor_msgs::msg::dds_::Image_/RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47/::,10:,:,:,,";

/// The worked example on Humble's wire (rmw_zenoh 0.1.2 – 0.1.9): `TypeHashNotSupported`
/// in place of the type hash, nothing else changed.
const HUMBLE_DATA_KEY: &str = "0/camera/image/sensor_msgs::msg::dds_::Image_/TypeHashNotSupported";
const HUMBLE_PUB_TOKEN: &str = "@ros2_lv/0/aac3178e146ba6f1fc6e6a4085e77f21/0/5/MP/%/%/camera_driver/%camera%image/sensor_msgs::msg::dds_::Image_/TypeHashNotSupported/::,10:,:,:,,";

fn node() -> NodeName {
    NodeName {
        domain: 0,
        zid: ZID.into(),
        nid: 0,
        enclave: "/".into(),
        namespace: "/".into(),
        name: "camera_driver".into(),
    }
}

#[test]
fn worked_example_key_and_tokens() {
    let hash = RmwWire::Classic.type_hash_text(&<Image<()> as RosDataMessage>::type_hash());
    assert_eq!(hash, IMAGE_HASH);
    assert_eq!(RmwWire::BufferAware.type_hash_text(&<Image<()> as RosDataMessage>::type_hash()), IMAGE_HASH);
    assert_eq!(<Image<()> as RosDataMessage>::DDS_TYPE_NAME, "sensor_msgs::msg::dds_::Image_");
    assert_eq!(topic_key(0, "/camera/image", <Image<()> as RosDataMessage>::DDS_TYPE_NAME, &hash), DATA_KEY);
    // One leading and one trailing slash are stripped, inner ones kept.
    assert_eq!(topic_key(0, "camera/image/", "sensor_msgs::msg::dds_::Image_", &hash), DATA_KEY);
    assert_eq!(node().node_token(), NODE_TOKEN);
    let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
    let qos = Qos::reliable(10).to_keyexpr_compact();
    assert_eq!(node().endpoint_token(5, EntityKind::Publisher, "/camera/image", dds, &hash, &qos, None), PUB_TOKEN);
    let sensor = Qos::sensor_data().to_keyexpr_compact();
    let sub = node().endpoint_token(5, EntityKind::Subscription, "/camera/image", dds, &hash, &sensor, None);
    assert_eq!(sub, PUB_TOKEN.replace("/MP/", "/MS/").replace("::,10:,:,:,,", "2::,5:,:,:,,"));
    // What this crate declares: explicit reliability, durability, history and liveliness.
    assert_eq!(Qos::reliable(10).to_keyexpr(), "1:2:1,10:,:,:1,,");

    // And the parser reads the tokens back, to the same data key.
    let e = Entity::parse(PUB_TOKEN).unwrap();
    assert_eq!((e.kind, e.domain, e.zid.as_str(), e.nid, e.eid), (EntityKind::Publisher, 0, ZID, 0, 5));
    assert_eq!((e.namespace.as_str(), e.node.as_str()), ("/", "camera_driver"));
    let t = e.topic.unwrap();
    assert_eq!((t.name.as_str(), t.key.as_str(), t.qos), ("/camera/image", DATA_KEY, Some(Qos::reliable(10))));
    assert_eq!(Entity::parse(NODE_TOKEN).unwrap().kind, EntityKind::Node);

    // Our channel sits beside the base key under a verbatim chunk.
    assert_eq!(channel_key(DATA_KEY), format!("{DATA_KEY}/@zcs_ros2"));
}

#[test]
fn namespaces_and_domains_are_mangled() {
    let n = NodeName { domain: 42, namespace: "/robot1/front".into(), ..node() };
    assert_eq!(n.node_token(), format!("@ros2_lv/42/{ZID}/0/0/NN/%/%robot1%front/camera_driver"));
    let hash = <ExperimentalTensor<()> as RosDataMessage>::type_hash().to_string();
    let dds = <ExperimentalTensor<()> as RosDataMessage>::DDS_TYPE_NAME;
    assert_eq!(dds, "tensor_msgs::msg::dds_::ExperimentalTensor_");
    assert_eq!(topic_key(42, "/robot1/front/tensor", dds, &hash), format!("42/robot1/front/tensor/{dds}/{hash}"));
    let tok =
        n.endpoint_token(3, EntityKind::Subscription, "/robot1/front/tensor", dds, &hash, "1:1:1,1:,:,:1,,", None);
    assert!(
        tok.ends_with(&format!("/MS/%/%robot1%front/camera_driver/%robot1%front%tensor/{dds}/{hash}/1:1:1,1:,:,:1,,"))
    );
}

#[test]
fn worked_example_gid_and_attachment() {
    let gid = gid_of(PUB_TOKEN);
    assert_eq!(gid_hex(&gid), "e9975392dbe9f91f7b4d3e837baae760");
    let att = Attachment { seq: 1, timestamp_ns: 1_700_000_000_000_000_123, gid };
    let expected: [u8; 33] = [
        0x01, 0, 0, 0, 0, 0, 0, 0, // seq
        0x7b, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97, 0x17, // timestamp
        0x10, // GID length
        0xe9, 0x97, 0x53, 0x92, 0xdb, 0xe9, 0xf9, 0x1f, 0x7b, 0x4d, 0x3e, 0x83, 0x7b, 0xaa, 0xe7, 0x60,
    ];
    assert_eq!(att.encode(), expected);
    assert_eq!(Attachment::decode(&expected), Ok(att));
    // Malformed attachments are typed errors.
    assert_eq!(Attachment::decode(&expected[..32]), Err(AttachmentError::Length(32)));
    let mut wrong = expected;
    wrong[16] = 0x08;
    assert_eq!(Attachment::decode(&wrong), Err(AttachmentError::GidLength(8)));
    // A different token is a different GID.
    assert_ne!(gid_of(NODE_TOKEN), gid);
}

/// The worked example on Humble's wire, byte for byte: the data key and the publisher
/// token with `TypeHashNotSupported` where Jazzy has the RIHS01 hash, the GID rmw_zenoh
/// 0.1.9 computes for that token (XXH3-128 of it, low half then high half; computed
/// independently with Python's `xxhash`), and the 33-byte attachment carrying it.
#[test]
fn worked_example_on_humbles_wire() {
    let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
    let hash = RmwWire::Humble.type_hash_text(&<Image<()> as RosDataMessage>::type_hash());
    assert_eq!((hash.as_str(), HUMBLE_TYPE_HASH), ("TypeHashNotSupported", "TypeHashNotSupported"));
    assert_eq!(topic_key(0, "/camera/image", dds, &hash), HUMBLE_DATA_KEY);
    let compact = Qos::reliable(10).to_keyexpr_compact();
    let token = node().endpoint_token(5, EntityKind::Publisher, "/camera/image", dds, &hash, &compact, None);
    assert_eq!(token, HUMBLE_PUB_TOKEN);
    // Nothing but the hash chunk differs from Jazzy's token; the node token is shared.
    assert_eq!(HUMBLE_PUB_TOKEN, PUB_TOKEN.replace(IMAGE_HASH, "TypeHashNotSupported"));
    assert_eq!(HUMBLE_DATA_KEY, DATA_KEY.replace(IMAGE_HASH, "TypeHashNotSupported"));

    // Humble's rmw_zenoh writes compact QoS and hashes the token as written; ours, with
    // explicit QoS, hashes to the same GID through the rebuild.
    let gid = gid_of(HUMBLE_PUB_TOKEN);
    assert_eq!(gid_hex(&gid), "2e31dda785253c05d87f8406c5186be4");
    assert_eq!(hash_token(HUMBLE_PUB_TOKEN), gid);
    assert_eq!(canonical_token(HUMBLE_PUB_TOKEN).as_deref(), Some(HUMBLE_PUB_TOKEN));
    let explicit = node().endpoint_token(
        5,
        EntityKind::Publisher,
        "/camera/image",
        dds,
        &hash,
        &Qos::reliable(10).to_keyexpr(),
        None,
    );
    assert!(explicit.ends_with("/TypeHashNotSupported/1:2:1,10:,:,:1,,"), "{explicit}");
    assert_eq!(gid_of(&explicit), gid);
    assert_ne!(gid, gid_of(PUB_TOKEN), "another GID than Jazzy's");

    // The parser reads it back to the Humble data key.
    let e = Entity::parse(HUMBLE_PUB_TOKEN).unwrap();
    let t = e.topic.unwrap();
    assert_eq!((t.hash.as_str(), t.key.as_str(), t.backends), ("TypeHashNotSupported", HUMBLE_DATA_KEY, None));
    assert_eq!(e.gid, gid);
    assert_eq!(channel_key(HUMBLE_DATA_KEY), format!("{HUMBLE_DATA_KEY}/@zcs_ros2"));

    // The attachment: the same 33-byte layout, carrying the Humble GID.
    let att = Attachment { seq: 1, timestamp_ns: 1_700_000_000_000_000_123, gid };
    let expected: [u8; 33] = [
        0x01, 0, 0, 0, 0, 0, 0, 0, // seq
        0x7b, 0x00, 0x2a, 0x36, 0xfe, 0x9c, 0x97, 0x17, // timestamp
        0x10, // GID length
        0x2e, 0x31, 0xdd, 0xa7, 0x85, 0x25, 0x3c, 0x05, 0xd8, 0x7f, 0x84, 0x06, 0xc5, 0x18, 0x6b, 0xe4,
    ];
    assert_eq!(att.encode(), expected);
    assert_eq!(Attachment::decode(&expected), Ok(att));
}

/// The seven GIDs of the worked example of rmw_zenoh 0.12.0's buffer-aware wire: the
/// same endpoints before and after PR #930, with and without backends, and a token
/// with explicit QoS, which rmw_zenoh hashes in its compact rebuild.
#[test]
fn worked_example_gids_before_and_after_buffer_backends() {
    let hash = <Image<()> as RosDataMessage>::type_hash().to_string();
    let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
    let reliable = Qos::reliable(10).to_keyexpr_compact();
    let sensor = Qos::sensor_data().to_keyexpr_compact();
    let viewer = NodeName { name: "viewer".into(), ..node() };
    let cpu = Backends::cpu_only();
    let cpu_cuda = Backends::cpu_only().with("cuda", "");
    let cuda = Backends::default().with("cuda", "");
    let mp = |b: Option<&Backends>| {
        node().endpoint_token(5, EntityKind::Publisher, "/camera/image", dds, &hash, &reliable, b)
    };
    let ms = |q: &str, b: Option<&Backends>| {
        viewer.endpoint_token(7, EntityKind::Subscription, "/camera/image", dds, &hash, q, b)
    };
    assert_eq!(mp(Some(&cpu_cuda)), format!("{PUB_TOKEN}/backends:cpu:;cuda:"));
    let cases = [
        (mp(None), "e9975392dbe9f91f7b4d3e837baae760"),
        (mp(Some(&cpu_cuda)), "08be57d0cd6dd8ba72537dbbe96ebe4c"),
        (mp(Some(&cpu)), "ddced2a886bf5d0fdb670f7d4cbced9e"),
        (ms(&sensor, None), "f2eeca687e7b86a00735368f2fc22bd3"),
        (ms(&sensor, Some(&cpu)), "6dfd10e4cc60941304adbc26e928d5e9"),
        (ms(&sensor, Some(&cuda)), "1b123fed7b70ed905028346b9ef66e25"),
    ];
    for (token, gid) in &cases {
        // rmw_zenoh's own tokens are canonical: the plain hash and the rebuild agree.
        assert_eq!(canonical_token(token).as_deref(), Some(token.as_str()));
        assert_eq!(
            (gid_hex(&hash_token(token)), gid_hex(&gid_of(token))),
            (gid.to_string(), gid.to_string()),
            "{token}"
        );
        assert_eq!(Entity::parse(token).unwrap().gid, gid_of(token));
    }
    // Explicit QoS (as this crate declares) hashes to its compact rebuild's GID, not
    // to the hash of its own text.
    let explicit = ms(&Qos::sensor_data().to_keyexpr(), None);
    assert!(explicit.ends_with("/2:2:1,5:,:,:1,,"));
    assert_eq!(gid_hex(&hash_token(&explicit)), "96e9b7e6d3c3a45625e5036855a7874c");
    assert_eq!(gid_hex(&gid_of(&explicit)), "f2eeca687e7b86a00735368f2fc22bd3");
    assert_eq!(gid_hex(&gid_of(&format!("{explicit}/backends:cpu:"))), "6dfd10e4cc60941304adbc26e928d5e9");
    // Backends are re-sorted and re-escaped, lower-case escapes read, empty entries and
    // a chunk listing nothing dropped, further chunks ignored.
    let messy = format!("{explicit}/backends:;cuda:;cpu:/extra");
    assert_eq!(canonical_token(&messy), canonical_token(&format!("{}/backends:cpu:;cuda:", ms(&sensor, None))));
    assert_eq!(canonical_token(&format!("{explicit}/backends:")).as_deref(), Some(ms(&sensor, None).as_str()));
    assert_eq!(canonical_token(&format!("{explicit}/other")).as_deref(), Some(ms(&sensor, None).as_str()));
    let odd = format!("{explicit}/backends:x:a%2fb");
    assert!(canonical_token(&odd).unwrap().ends_with("/backends:x:a%2Fb"));
    // A refused backends chunk: no canonical form; the endpoint parses as legacy and
    // names the error.
    let bad = format!("{explicit}/backends:cpu:%zz");
    assert_eq!(canonical_token(&bad), None);
    let t = Entity::parse(&bad).unwrap().topic.unwrap();
    assert!(t.backends.is_none() && t.backends_error.is_some());
    let t = Entity::parse(&cases[1].0).unwrap().topic.unwrap();
    assert_eq!(t.backends, Some(cpu_cuda));
    assert!(t.backends_error.is_none());
}

#[test]
fn image_cdr_is_prefix_then_data_and_envelope_round_trips() {
    let fields = Image {
        header: Header { stamp: Time { sec: 0x6553_f100, nanosec: 123 }, frame_id: "camera".into() },
        height: 2,
        width: 2,
        encoding: "rgb8".into(),
        is_bigendian: 0,
        step: 6,
        data: (),
    };
    let data: Vec<u8> = (1..=12).collect();
    // The 64-byte layout of the worked example.
    let mut expected = vec![0x00, 0x01, 0x00, 0x00, 0x00, 0xf1, 0x53, 0x65, 0x7b, 0, 0, 0, 7, 0, 0, 0];
    expected.extend(b"camera\0\0");
    expected.extend([2, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0]);
    expected.extend(b"rgb8\0");
    expected.extend([0, 0, 0, 6, 0, 0, 0, 12, 0, 0, 0]);
    expected.extend(&data);
    let mut cdr = fields.encode_cdr_prefix(data.len()).unwrap();
    cdr.extend(&data);
    assert_eq!(cdr, expected);
    let (back, range) = <Image<()> as RosDataMessage>::decode_cdr(&cdr).unwrap();
    assert_eq!((back, &cdr[range]), (fields.clone(), &data[..]));
    // Truncated CDR is a typed error, never a panic, at every length.
    for n in 0..cdr.len() - 1 {
        assert!(<Image<()> as RosDataMessage>::decode_cdr(&cdr[..n]).is_err(), "{n} bytes");
    }

    let att = Attachment { seq: 3, timestamp_ns: 4, gid: [9; 16] };
    let env = encode_envelope(&att, &fields).unwrap();
    assert_eq!(env[0], 1);
    assert_eq!(&env[1..34], &att.encode());
    assert_eq!(decode_envelope::<Image<()>>(&env).unwrap(), (att, fields));
}
