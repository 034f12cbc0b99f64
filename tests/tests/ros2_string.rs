//! `std_msgs/msg/String` through our ROS 2 layer: text as the data, checked on the way
//! out and on the way in, the same CDR as every ROS release on the base key. A raw
//! Zenoh session plays the other participants; host memory, loopback TCP. The real
//! rclpy talkers and listeners are in tests/ros2_real/test_strings.py.

use std::time::Duration;

use tensor_codec::cdr::{CdrDecodeError, CdrEncodeError, StringMsg};
use zcs_tests::watchdog_guard;
use zenoh::Wait;
use zenoh_cuda_shm::{Path, tensor_codec};
use zenoh_cuda_shm_ros2::names::gid_of;
use zenoh_cuda_shm_ros2::{Attachment, NodeOptions, Qos, RmwWire, RosDataMessage, RosNode, RosPublishError};

const IO: Duration = Duration::from_secs(10);
type Text = StringMsg<()>;

fn sessions(domain: u32) -> (RosNode, zenoh::Session) {
    zcs_tests::ros::host_node(NodeOptions::new("talker").domain(domain).rmw_wire(RmwWire::BufferAware))
}

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    zcs_tests::wait_until(what, IO, f);
}

/// Our String publisher reaches our subscriber (on our channel) and an ordinary ROS
/// subscription (CDR on the base key) with the same text; text that no ROS node could
/// read is refused before anything is sent.
#[test]
fn our_strings_reach_ours_and_ordinary_subscriptions() {
    let _w = watchdog_guard("our_strings_reach_ours_and_ordinary_subscriptions", Duration::from_secs(60));
    let (node, raw) = sessions(21);
    let publisher = node.publisher::<Text>("chatter", Qos::reliable(10).keep_all()).unwrap();
    assert!(publisher.key().contains("/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c74"), "{}", publisher.key());
    assert!(!publisher.token().contains("backends"), "a String has no buffer field: {}", publisher.token());
    let sub = node.subscriber::<Text>("/chatter", Qos::reliable(10).keep_all()).unwrap();

    let (tx, rx) = flume::unbounded();
    let _plain = raw
        .declare_subscriber(publisher.key())
        .callback(move |s| {
            let _ = tx.send((s.payload().to_bytes().into_owned(), s.attachment().map(|a| a.to_bytes().into_owned())));
        })
        .wait()
        .unwrap();
    let hash = <Text as RosDataMessage>::type_hash().to_string();
    let ms = format!(
        "@ros2_lv/21/{}/0/9/MS/%/%/listener/%chatter/{}/{hash}/1:2:1,10:,:,:,,",
        raw.zid(),
        <Text as RosDataMessage>::DDS_TYPE_NAME
    );
    let _ms = raw.liveliness().declare_token(ms).wait().unwrap();
    wait_for("the ordinary subscription and ours", || {
        publisher.ordinary_subscriptions() == 1 && publisher.channel().aware_subscribers() == 1
    });

    for (i, text) in ["Hello World: 1", "", "héllo wörld ✓"].into_iter().enumerate() {
        let r = publisher.publish_str(text).unwrap();
        assert!(r.base && r.channel.is_some(), "{r:?}");
        let s = sub.recv_timeout(IO).unwrap();
        // Both keys bring it; the first to arrive is kept (inline on our channel, or CDR).
        assert!(matches!(s.path(), Path::Inline | Path::Plain), "{:?}", s.path());
        assert_eq!(s.to_message().unwrap().data, text);
        assert_eq!(s.attachment().seq, i as i64 + 1);
        let (payload, att) = rx.recv_timeout(IO).unwrap();
        assert_eq!(payload, StringMsg { data: text }.encode_cdr().unwrap(), "byte-exact CDR on the base key");
        let att = Attachment::decode(&att.expect("attachment")).unwrap();
        assert_eq!((att.seq, att.gid), (i as i64 + 1, gid_of(publisher.token())));
    }

    // A NUL or bytes that are not UTF-8: refused, nothing sent, no number used.
    let published = publisher.stats().published;
    assert!(matches!(
        publisher.publish_str("a\0b"),
        Err(RosPublishError::Encode(CdrEncodeError::InvalidText { at: 1, .. }))
    ));
    assert!(publisher.publish_host(&StringMsg { data: () }, b"ok\xff").is_err());
    assert_eq!(publisher.stats().published, published);
    assert_eq!(publisher.next_seq(), 4);
    std::thread::sleep(Duration::from_millis(200));
    assert!(sub.try_recv().is_none() && rx.try_recv().is_err());
    let st = sub.stats();
    assert_eq!((st.channel + st.base, st.duplicates, st.bad_envelope), (3, 3, 0), "{st:?}");
}

/// An ordinary ROS publisher's Strings (CDR on the base key) arrive as text; CDR whose
/// text is not UTF-8 or not terminated is dropped and counted, and loses nothing else.
#[test]
fn ordinary_strings_arrive_and_bad_text_is_counted() {
    let _w = watchdog_guard("ordinary_strings_arrive_and_bad_text_is_counted", Duration::from_secs(60));
    let (node, raw) = sessions(22);
    let sub = node.subscriber::<Text>("/chatter", Qos::reliable(10).keep_all()).unwrap();
    wait_for("our subscription's token", || {
        raw.liveliness()
            .get(sub.token())
            .wait()
            .unwrap()
            .recv_timeout(Duration::from_millis(200))
            .ok()
            .flatten()
            .is_some()
    });
    let gid = [7u8; 16];
    let put = |seq: i64, cdr: Vec<u8>| {
        let att = Attachment { seq, timestamp_ns: seq, gid }.encode().to_vec();
        raw.put(sub.key(), cdr).attachment(att).wait().unwrap();
    };
    put(1, StringMsg { data: "Hello World: 0" }.encode_cdr().unwrap());
    put(2, vec![0, 1, 0, 0, 3, 0, 0, 0, b'a', 0xff, 0]);
    put(3, vec![0, 1, 0, 0, 2, 0, 0, 0, b'a', b'b']);
    put(4, StringMsg { data: "Hello World: 3" }.encode_cdr().unwrap());
    for want in ["Hello World: 0", "Hello World: 3"] {
        let s = sub.recv_timeout(IO).unwrap();
        assert_eq!((s.path(), s.to_message().unwrap().data.as_str()), (Path::Plain, want));
        assert_eq!(s.host_data().unwrap().as_ref(), want.as_bytes());
    }
    wait_for("both bad messages counted", || sub.stats().bad_cdr == 2);
    // Why they were dropped, as the decoder says it.
    assert!(matches!(
        StringMsg::decode_cdr(&[0, 1, 0, 0, 3, 0, 0, 0, b'a', 0xff, 0]),
        Err(CdrDecodeError::InvalidUtf8 { field: "data", .. })
    ));
    assert!(sub.try_recv().is_none());
}
