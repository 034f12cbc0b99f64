//! The `ros2` module's routing decisions, seen from a raw Zenoh session playing other
//! ROS participants: which subscriptions count as ordinary (and so cost the base-key
//! copy), what goes on the base key, and what our subscriber does with bad input on
//! our channel. Host-memory blocks; loopback TCP; the Python peer covers the rest
//! (tests/python/test_ros2_peer.py).

use std::time::{Duration, Instant};

use tensor_codec::cdr::{Header, Image, Time};
use zcs_tests::{free_tcp_port, loopback_zenoh_config, watchdog_guard};
use zenoh::Wait;
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::ros2::names::{gid_hex, gid_of};
use zenoh_cuda_shm::ros2::{Attachment, NodeOptions, Qos, RosDataMessage, RosNode, channel_key, marker_token};
use zenoh_cuda_shm::{GpuSession, Path, ZcsConfig, tensor_codec};

const IO: Duration = Duration::from_secs(10);

fn sessions(domain: u32) -> (RosNode, zenoh::Session) {
    let port = free_tcp_port();
    let ours = GpuSession::open(
        loopback_zenoh_config(Some(port), None, Some(&domain.to_string())),
        ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() },
    )
    .wait()
    .unwrap();
    let raw = zenoh::open(loopback_zenoh_config(None, Some(port), None)).wait().unwrap();
    let node = RosNode::new(&ours, NodeOptions::new("test_node").domain(domain)).unwrap();
    (node, raw)
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < IO, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn fields() -> Image<()> {
    Image {
        header: Header { stamp: Time { sec: 1, nanosec: 2 }, frame_id: "f".into() },
        height: 4,
        width: 4,
        encoding: "mono8".into(),
        is_bigendian: 0,
        step: 4,
        data: (),
    }
}

/// An `MS` token of another participant for the image topic `/t` (hash given).
fn ms_token(raw: &zenoh::Session, domain: u32, eid: u32, hash: &str) -> String {
    let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
    format!("@ros2_lv/{domain}/{}/0/{eid}/MS/%/%/other/%t/{dds}/{hash}/2::,5:,:,:,,", raw.zid())
}

#[test]
fn ordinary_subscriptions_are_counted_from_graph_tokens() {
    let _w = watchdog_guard("ordinary_subscriptions_are_counted_from_graph_tokens", Duration::from_secs(60));
    let (node, raw) = sessions(7);
    let publisher = node.publisher::<Image<()>>("/t", Qos::reliable(10).keep_all()).unwrap();
    let key = publisher.key().to_owned();
    let hash = <Image<()> as RosDataMessage>::type_hash().to_string();
    let (tx, rx) = flume::unbounded();
    let _plain = raw
        .declare_subscriber(key.clone())
        .callback(move |s| {
            let _ = tx.send((s.payload().to_bytes().into_owned(), s.attachment().map(|a| a.to_bytes().into_owned())));
        })
        .wait()
        .unwrap();
    let data = [5u8; 16];

    // No ordinary subscription: nothing on the base key.
    assert_eq!(publisher.ordinary_subscriptions(), 0);
    let r = publisher.publish_host(&fields(), &data).unwrap();
    assert!(!r.base && r.seq == 1);

    // Tokens that are not subscriptions of this key are not counted.
    let wrong_hash = raw.liveliness().declare_token(ms_token(&raw, 7, 1, &format!("RIHS01_{}", "0".repeat(64)))).wait();
    let other_domain = raw.liveliness().declare_token(ms_token(&raw, 8, 2, &hash)).wait();
    let malformed = raw.liveliness().declare_token("@ros2_lv/7/zz/0/3/MS/%/%/other/%t").wait();
    wait_for("the malformed token", || node.graph().1 >= 1);
    assert_eq!(publisher.ordinary_subscriptions(), 0);

    // An ordinary subscription appears: the next message goes on the base key as CDR
    // with the attachment.
    let token = ms_token(&raw, 7, 4, &hash);
    let ms = raw.liveliness().declare_token(token.clone()).wait().unwrap();
    wait_for("the MS token", || publisher.ordinary_subscriptions() == 1);
    let r = publisher.publish_host(&fields(), &data).unwrap();
    assert!(r.base && r.seq == 2);
    let (payload, att) = rx.recv_timeout(IO).unwrap();
    let att = Attachment::decode(&att.expect("attachment")).unwrap();
    assert_eq!((att.seq, att.gid), (2, publisher.gid()));
    assert_eq!(publisher.gid(), gid_of(publisher.token()));
    let (msg, range) = <Image<()> as RosDataMessage>::decode_cdr(&payload).unwrap();
    assert_eq!((msg, &payload[range]), (fields(), &data[..]));

    // The same token with our marker is one of our GPU-capable subscriptions: not ordinary.
    let marker = raw.liveliness().declare_token(marker_token(7, &gid_of(&token))).wait().unwrap();
    wait_for("the marker", || publisher.ordinary_subscriptions() == 0);
    assert!(!publisher.publish_host(&fields(), &data).unwrap().base);
    drop(marker);
    wait_for("the marker to go", || publisher.ordinary_subscriptions() == 1);
    drop(ms);
    wait_for("the MS token to go", || publisher.ordinary_subscriptions() == 0);
    assert!(!publisher.publish_host(&fields(), &data).unwrap().base);
    assert_eq!(publisher.stats().base_puts, 1);
    assert!(rx.try_recv().is_err(), "only one message went on the base key");
    drop((wrong_hash, other_domain, malformed));
}

#[test]
fn our_subscriptions_declare_a_marker_and_are_not_ordinary() {
    let _w = watchdog_guard("our_subscriptions_declare_a_marker_and_are_not_ordinary", Duration::from_secs(60));
    let (node, raw) = sessions(9);
    let publisher = node.publisher::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    let (tx, rx) = flume::unbounded();
    let _markers = raw
        .liveliness()
        .declare_subscriber("@zcs/ros2/v1/9/sub/*")
        .history(true)
        .callback(move |s| {
            let _ = tx.send(s.key_expr().as_str().to_owned());
        })
        .wait()
        .unwrap();
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    assert_eq!(rx.recv_timeout(IO).unwrap(), format!("@zcs/ros2/v1/9/sub/{}", gid_hex(&sub.gid())));
    wait_for("our subscription in the graph", || {
        node.graph().0.iter().any(|e| e.gid == sub.gid() && e.topic.as_ref().is_some_and(|t| t.key == sub.key()))
    });
    assert_eq!(publisher.ordinary_subscriptions(), 0);
    wait_for("the channel subscriber", || publisher.channel().aware_subscribers() == 1);
    for i in 0..5u8 {
        publisher.publish_host(&fields(), &[i; 16]).unwrap();
    }
    for i in 0..5u8 {
        let s = sub.recv_timeout(IO).unwrap();
        assert_eq!(
            (s.attachment().seq, s.msg(), s.host_data().unwrap().as_ref()),
            (i64::from(i) + 1, &fields(), &[i; 16][..])
        );
        assert_eq!(s.path(), Path::Inline);
    }
    assert_eq!(publisher.stats().base_puts, 0);
}

#[test]
fn bad_envelopes_on_our_channel_are_dropped_and_counted() {
    let _w = watchdog_guard("bad_envelopes_on_our_channel_are_dropped_and_counted", Duration::from_secs(60));
    let (node, _raw) = sessions(11);
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    // A publisher of ours on the channel key, but not a ROS one: its metadata is wrong.
    let forger = node.session().declare_publisher(channel_key(sub.key())).wait().unwrap();
    wait_for("the channel subscriber", || forger.aware_subscribers() == 1);
    forger.put_bytes_meta(&[1; 16], None).unwrap();
    forger.put_bytes_meta(&[1; 16], Some(vec![9; 40])).unwrap();
    let att = Attachment { seq: 1, timestamp_ns: 1, gid: [3; 16] };
    let mut truncated = zenoh_cuda_shm::ros2::message::encode_envelope(&att, &fields()).unwrap();
    truncated.truncate(truncated.len() - 3);
    forger.put_bytes_meta(&[1; 16], Some(truncated)).unwrap();
    let good = zenoh_cuda_shm::ros2::message::encode_envelope(&att, &fields()).unwrap();
    forger.put_bytes_meta(&[2; 16], Some(good.clone())).unwrap();
    // The same (GID, seq) again: a duplicate.
    forger.put_bytes_meta(&[2; 16], Some(good)).unwrap();
    let s = sub.recv_timeout(IO).unwrap();
    assert_eq!((s.attachment(), s.host_data().unwrap().as_ref()), (&att, &[2u8; 16][..]));
    wait_for("the duplicate", || sub.stats().duplicates == 1);
    let st = sub.stats();
    assert_eq!((st.bad_envelope, st.channel, st.base, st.duplicates), (3, 1, 0, 1));
    assert!(sub.try_recv().is_none());
}
