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
use zenoh_cuda_shm::{GpuSession, Path, ZcsConfig, tensor_codec};
use zenoh_cuda_shm_ros2::names::{gid_hex, gid_of};
use zenoh_cuda_shm_ros2::{
    Attachment, NameError, NodeOptions, Qos, RmwWire, RosDataMessage, RosDeclareError, RosNode, SilenceReason,
    buf_cpu_key, channel_key, marker_token, silence_token,
};

const IO: Duration = Duration::from_secs(10);

/// A node on the buffer-aware wire (whatever `ROS_DISTRO` says), and a raw session.
fn sessions(domain: u32) -> (RosNode, zenoh::Session) {
    sessions_with(NodeOptions::new("test_node").domain(domain).rmw_wire(RmwWire::BufferAware))
}

fn sessions_with(options: NodeOptions) -> (RosNode, zenoh::Session) {
    zcs_tests::ros::host_node(options)
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
    wait_for("the malformed token", || node.graph().malformed >= 1);
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
        node.graph().entities.iter().any(|e| e.gid == sub.gid() && e.topic.as_ref().is_some_and(|t| t.key == sub.key()))
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
    let mut truncated = zenoh_cuda_shm_ros2::message::encode_envelope(&att, &fields()).unwrap();
    truncated.truncate(truncated.len() - 3);
    forger.put_bytes_meta(&[1; 16], Some(truncated)).unwrap();
    let good = zenoh_cuda_shm_ros2::message::encode_envelope(&att, &fields()).unwrap();
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

/// A token of another participant's endpoint on `/t` (Image, the given hash, QoS and
/// optional 14th chunk).
fn endpoint(raw: &zenoh::Session, domain: u32, eid: u32, kind: &str, hash: &str, qos: &str, chunk: &str) -> String {
    let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
    format!("@ros2_lv/{domain}/{}/0/{eid}/{kind}/%/%/other/%t/{dds}/{hash}/{qos}{chunk}", raw.zid())
}

/// Waits until the raw session sees `token`: our subscribers, declared before their
/// tokens, are then known to it as well.
fn raw_sees(raw: &zenoh::Session, token: &str) {
    wait_for("the raw session to see our token", || {
        raw.liveliness().get(token).wait().unwrap().recv_timeout(Duration::from_millis(200)).ok().flatten().is_some()
    });
}

fn cdr(data: &[u8]) -> Vec<u8> {
    let mut c = fields().encode_cdr_prefix(data.len()).unwrap();
    c.extend_from_slice(data);
    c
}

fn attachment(seq: i64, gid: [u8; 16]) -> Vec<u8> {
    Attachment { seq, timestamp_ns: seq, gid }.encode().to_vec()
}

/// A buffer-aware rmw_zenoh publisher (0.12.0) serves our CPU-only subscription on
/// `_buf_cpu`, numbering each put: every message arrives once, its gaps are no losses.
#[test]
fn buffer_aware_publishers_reach_us_on_buf_cpu_once() {
    let _w = watchdog_guard("buffer_aware_publishers_reach_us_on_buf_cpu_once", Duration::from_secs(60));
    let (node, raw) = sessions(13);
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    assert!(sub.token().ends_with("/1:2:1,10:,:,:1,,/backends:cpu:"), "{}", sub.token());
    assert_eq!(sub.gid(), gid_of(sub.token()));
    let latched = node.subscriber::<Image<()>>("/t", Qos::transient_local(3)).unwrap();
    assert!(latched.token().ends_with("/1:1:1,3:,:,:1,,"), "transient local: no chunk: {}", latched.token());
    drop(latched);

    let hash = <Image<()> as RosDataMessage>::type_hash().to_string();
    let mp = endpoint(&raw, 13, 1, "MP", &hash, "::,10:,:,:,,", "/backends:cpu:;cuda:");
    let gid = gid_of(&mp);
    let _mp = raw.liveliness().declare_token(mp).wait().unwrap();
    let base = sub.key().to_owned();
    raw_sees(&raw, sub.token());
    assert!(
        node.graph()
            .entities
            .iter()
            .any(|e| e.gid == sub.gid() && e.topic.as_ref().is_some_and(|t| t.backends.is_some()))
    );
    // Publish 1 went to the base key (the publisher had not discovered us yet), then
    // each message went to _buf_cpu and to one cuda subscription's key: two numbers each.
    let put =
        |key: &str, seq: i64, byte: u8| raw.put(key, cdr(&[byte; 16])).attachment(attachment(seq, gid)).wait().unwrap();
    put(&base, 1, 1);
    for (i, seq) in [2, 4, 6, 8].into_iter().enumerate() {
        put(&buf_cpu_key(&base), seq, i as u8 + 2);
    }
    // A stray second copy of one message on the base key is dropped as a duplicate.
    put(&base, 6, 4);
    for byte in 1..=5u8 {
        let s = sub.recv_timeout(IO).unwrap();
        assert_eq!(s.host_data().unwrap().as_ref(), &[byte; 16][..]);
        assert_eq!(s.attachment().gid, gid);
        assert_eq!(s.seq_per_put(), byte > 1, "known as numbering per put from its first _buf_cpu message on");
    }
    wait_for("the duplicate", || sub.stats().duplicates == 1);
    let st = sub.stats();
    assert_eq!((st.base, st.buf_cpu, st.lost, st.duplicates), (1, 4, 0, 1));
    assert!(sub.try_recv().is_none());
}

/// On the classic wire (Jazzy, Kilted), our tokens list no backends, so that those
/// releases, which rebuild a token from its first 13 chunks before hashing it, find the
/// GID our attachments carry; our subscription hears only the base key, where the
/// publishers of those releases put.
#[test]
fn classic_wire_tokens_list_no_backends_and_hash_as_classic_releases_do() {
    let _w =
        watchdog_guard("classic_wire_tokens_list_no_backends_and_hash_as_classic_releases_do", Duration::from_secs(60));
    let (node, raw) = sessions_with(NodeOptions::new("test_node").domain(14).rmw_wire(RmwWire::Classic));
    assert_eq!(node.rmw_wire(), RmwWire::Classic);
    let publisher = node.publisher::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    for (token, gid) in [(publisher.token(), publisher.gid()), (sub.token(), sub.gid())] {
        assert!(token.ends_with("/1:2:1,10:,:,:1,,"), "no backends chunk: {token}");
        let classic: Vec<&str> = token.split('/').take(13).collect();
        assert_eq!(gid, gid_of(&classic.join("/")), "the GID a classic rmw_zenoh computes");
    }
    // A message of ours carries that GID.
    let (tx, rx) = flume::unbounded();
    let _raw_sub = raw
        .declare_subscriber(publisher.key())
        .callback(move |s| {
            let _ = tx.send(s.attachment().map(|a| a.to_bytes().to_vec()));
        })
        .wait()
        .unwrap();
    let ms = endpoint(&raw, 14, 1, "MS", &<Image<()> as RosDataMessage>::type_hash().to_string(), "::,10:,:,:,,", "");
    let _ms = raw.liveliness().declare_token(ms).wait().unwrap();
    wait_for("the ordinary subscription", || publisher.ordinary_subscriptions() == 1);
    publisher.publish_host(&fields(), &[9; 16]).unwrap();
    let att = rx.recv_timeout(IO).unwrap().expect("an attachment");
    assert_eq!(Attachment::decode(&att).unwrap().gid, publisher.gid());

    // Nothing of ours listens on _buf_cpu: a put there is not received.
    raw_sees(&raw, sub.token());
    let gid = [5; 16];
    raw.put(buf_cpu_key(sub.key()), cdr(&[1; 16])).attachment(attachment(1, gid)).wait().unwrap();
    raw.put(sub.key(), cdr(&[2; 16])).attachment(attachment(2, gid)).wait().unwrap();
    let mut got = Vec::new();
    while let Ok(s) = sub.recv_timeout(Duration::from_secs(2)) {
        if s.attachment().gid == gid {
            got.push(s.host_data().unwrap()[0]);
        }
    }
    assert_eq!(got, vec![2], "the base key only");
    assert_eq!(sub.stats().buf_cpu, 0);
}

/// Gaps from a publisher that numbers each message are losses; a late message fills
/// its gap again.
#[test]
fn gaps_in_per_message_numbering_count_as_lost() {
    let _w = watchdog_guard("gaps_in_per_message_numbering_count_as_lost", Duration::from_secs(60));
    let (node, raw) = sessions(14);
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    raw_sees(&raw, sub.token());
    let key = sub.key().to_owned();
    let gid = [7; 16];
    for seq in [5, 6, 8, 7, 11] {
        raw.put(&key, cdr(&[1; 4])).attachment(attachment(seq, gid)).wait().unwrap();
        let s = sub.recv_timeout(IO).unwrap();
        assert_eq!((s.attachment().seq, s.seq_per_put()), (seq, false));
        let lost = match seq {
            8 => 1,  // 7 missing
            7 => 0,  // filled late
            11 => 2, // 9 and 10 missing; nothing before the first message (5) counts
            _ => 0,
        };
        assert_eq!(sub.stats().lost, lost, "after {seq}");
    }
}

/// KEEP_LAST, as ROS: a subscription whose application stops reading keeps the newest
/// `depth` messages and counts the others dropped, without holding up the Zenoh thread
/// that delivers it: a subscription on another topic of the same session still
/// receives. KEEP_ALL keeps everything that fits (the negative control: no drop).
#[test]
fn keep_last_drops_the_oldest_keep_all_keeps_all_and_both_stall_nobody() {
    let _w =
        watchdog_guard("keep_last_drops_the_oldest_keep_all_keeps_all_and_both_stall_nobody", Duration::from_secs(60));
    let (node, raw) = sessions(16);
    let stalled = node.subscriber::<Image<()>>("/t", Qos::reliable(2)).unwrap();
    let other = node.subscriber::<Image<()>>("/u", Qos::reliable(10)).unwrap();
    let all = node.subscriber::<Image<()>>("/v", Qos::reliable(10).keep_all()).unwrap();
    for t in [&stalled, &other, &all] {
        raw_sees(&raw, t.token());
    }
    let gid = [9; 16];
    for seq in 1..=20 {
        raw.put(stalled.key(), cdr(&[seq as u8; 4])).attachment(attachment(seq, gid)).wait().unwrap();
    }
    // KEEP_ALL, depth 10, not read: it keeps all 50 and holds up nobody either.
    for seq in 1..=50 {
        raw.put(all.key(), cdr(&[seq as u8; 4])).attachment(attachment(seq, gid)).wait().unwrap();
    }
    raw.put(other.key(), cdr(&[42; 4])).attachment(attachment(1, gid)).wait().unwrap();
    let s = other.recv_timeout(IO).expect("another topic is delivered while /t and /v are not read");
    assert_eq!(s.host_data().unwrap().as_ref(), &[42; 4]);
    wait_for("18 of 20 dropped", || stalled.stats().dropped_queue_full == 18);
    let kept: Vec<i64> = (0..2).map(|_| stalled.recv_timeout(IO).unwrap().attachment().seq).collect();
    assert_eq!(kept, vec![19, 20], "the newest two, in order");
    assert!(stalled.try_recv().is_none());
    wait_for("50 queued", || all.stats().queued == 50);
    assert_eq!(stalled.stats().queued, 0);
    let got: Vec<i64> = (0..50).map(|_| all.recv_timeout(IO).unwrap().attachment().seq).collect();
    assert_eq!((got, all.stats().dropped_queue_full, all.stats().queued), ((1..=50).collect::<Vec<_>>(), 0, 0));
}

/// Publishers that never reach a subscription are reported once each, with the reason;
/// publishers that do reach it are not.
#[test]
fn silent_publishers_are_reported_once_with_a_reason() {
    let _w = watchdog_guard("silent_publishers_are_reported_once_with_a_reason", Duration::from_secs(60));
    let window = Duration::from_millis(400);
    let (node, raw) = sessions_with(NodeOptions::new("watcher").domain(15).silence_window(Some(window)));
    let hash = <Image<()> as RosDataMessage>::type_hash().to_string();
    // A transient-local subscription: no backends chunk.
    let latched = node.subscriber::<Image<()>>("/t", Qos::transient_local(5)).unwrap();
    let volatile = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();

    // Silent: a buffer-aware rmw_zenoh publisher (it routes the latched subscription to
    // _buf/<its gid>, and serves _buf_cpu, which this test never puts on), another
    // definition of the type, and a Humble publisher.
    let new_wire = endpoint(&raw, 15, 1, "MP", &hash, "::,10:,:,:,,", "/backends:cpu:");
    let other_hash = endpoint(&raw, 15, 2, "MP", &format!("RIHS01_{}", "ab".repeat(32)), ":1:,5:,:,:,,", "");
    let humble = endpoint(&raw, 15, 3, "MP", "TypeHashNotSupported", ":1:,5:,:,:,,", "");
    // Heard: an old-wire publisher on the base key and one of ours.
    let old_wire = endpoint(&raw, 15, 4, "MP", &hash, "1:1:1,5:,:,:,,", "");
    let old_gid = gid_of(&old_wire);
    let tokens: Vec<_> = [&new_wire, &other_hash, &humble, &old_wire]
        .into_iter()
        .map(|t| raw.liveliness().declare_token(t.clone()).wait().unwrap())
        .collect();
    let ours = node.publisher::<Image<()>>("/t", Qos::transient_local(5)).unwrap();
    let t0 = Instant::now();
    let mut seq = 0;
    while t0.elapsed() < window * 4 {
        seq += 1;
        raw.put(latched.key(), cdr(&[1; 4])).attachment(attachment(seq, old_gid)).wait().unwrap();
        ours.publish_host(&fields(), &[2; 4]).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        // Drain: the queues hold what this round sent only.
        while latched.try_recv().or_else(|| volatile.try_recv()).is_some() {}
    }
    wait_for("three reports each", || {
        latched.stats().silent_publishers == 3 && volatile.stats().silent_publishers == 3
    });
    std::thread::sleep(window);
    while latched.try_recv().or_else(|| volatile.try_recv()).is_some() {}
    assert_eq!(latched.stats().silent_publishers, 3, "each reported once");

    let reasons = |s: &zenoh_cuda_shm_ros2::RosSubscriber<Image<()>>, gid: [u8; 16]| {
        s.silent_publishers().into_iter().find(|p| p.gid == gid).map(|p| p.reasons).unwrap_or_default()
    };
    let unheard = SilenceReason::UnheardKey { key: format!("{}/_buf/{}", latched.key(), gid_hex(&latched.gid())) };
    let r = reasons(&latched, gid_of(&new_wire));
    assert!(r.contains(&unheard), "{r:?}");
    assert!(r.iter().any(|r| matches!(r, SilenceReason::QosIncompatible(_))), "{r:?}");
    // The volatile subscription hears _buf_cpu: the same publisher is merely idle to it.
    assert_eq!(reasons(&volatile, gid_of(&new_wire)), vec![SilenceReason::Unknown]);
    for s in [&latched, &volatile] {
        assert_eq!(
            reasons(s, gid_of(&other_hash)),
            vec![SilenceReason::TypeHashMismatch { theirs: format!("RIHS01_{}", "ab".repeat(32)) }]
        );
        assert_eq!(reasons(s, gid_of(&humble)), vec![SilenceReason::Humble]);
        assert!(reasons(s, old_gid).is_empty() && reasons(s, ours.gid()).is_empty());
    }
    let text = reasons(&latched, gid_of(&new_wire)).iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    assert!(text.contains("_buf/") && text.contains("transient-local"), "{text}");
    // Each report stands as a liveliness token (the zenohd plugin lists them).
    let silences = || -> Vec<String> {
        let replies = raw.liveliness().get("@zcs/ros2/v1/15/silent/**").wait().unwrap();
        std::iter::from_fn(|| replies.recv_timeout(Duration::from_millis(300)).ok().flatten())
            .filter_map(|r| r.result().ok().map(|s| s.key_expr().as_str().to_owned()))
            .collect()
    };
    let expected = silence_token(15, &latched.gid(), &gid_of(&new_wire), &reasons(&latched, gid_of(&new_wire)));
    assert!(expected.ends_with("/qos,unheard-key"), "{expected}");
    wait_for("six silence tokens", || {
        let s = silences();
        s.len() == 6 && s.contains(&expected)
    });
    // A publisher that leaves drops off the list, and its tokens go.
    drop(tokens);
    wait_for("the silent list to empty", || latched.silent_publishers().is_empty());
    wait_for("the silence tokens to go", || silences().is_empty());
}

/// A subscription names the publishers of its topic that the graph shows will not reach
/// it as soon as they are in the graph, with the silence check off; an idle publisher
/// that would be heard, and one heard from, are not named.
#[test]
fn unheard_publishers_are_named_at_once() {
    let _w = watchdog_guard("unheard_publishers_are_named_at_once", Duration::from_secs(60));
    let (node, raw) = sessions_with(NodeOptions::new("waiter").domain(16).silence_window(None));
    let hash = <Image<()> as RosDataMessage>::type_hash().to_string();
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    let other_hash = endpoint(&raw, 16, 1, "MP", &format!("RIHS01_{}", "cd".repeat(32)), ":1:,5:,:,:,,", "");
    let best_effort = endpoint(&raw, 16, 2, "MP", &hash, "2:1:,5:,:,:,,", "");
    let idle = endpoint(&raw, 16, 3, "MP", &hash, ":1:,5:,:,:,,", "");
    let _tokens: Vec<_> = [&other_hash, &best_effort, &idle]
        .into_iter()
        .map(|t| raw.liveliness().declare_token(t.clone()).wait().unwrap())
        .collect();
    let _ours = node.publisher::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    wait_for("two unheard publishers", || sub.unheard_publishers().len() == 2);
    let mut named = sub.unheard_publishers();
    named.sort_by_key(|p| p.token.clone());
    assert_eq!(
        named.iter().map(|p| (p.gid, p.node.as_str(), p.reasons.clone())).collect::<Vec<_>>(),
        vec![
            (
                gid_of(&other_hash),
                "/other",
                vec![SilenceReason::TypeHashMismatch { theirs: format!("RIHS01_{}", "cd".repeat(32)) }]
            ),
            (
                gid_of(&best_effort),
                "/other",
                vec![SilenceReason::QosIncompatible("a best-effort publisher and a reliable subscription")]
            ),
        ]
    );
    assert_eq!(sub.stats().silent_publishers, 0, "the silence check is off");
}

/// On Humble's wire (rmw_zenoh 0.1.2 and later), our endpoints use the data key and
/// tokens with `TypeHashNotSupported`: a Humble subscription of the topic is ordinary
/// (it gets CDR on that key, with our GID), a Jazzy one is another key and is not
/// counted; our subscription hears the Humble key only.
#[test]
fn humble_wire_counts_humble_subscriptions_and_ignores_later_ones() {
    let _w = watchdog_guard("humble_wire_counts_humble_subscriptions_and_ignores_later_ones", Duration::from_secs(60));
    let (node, raw) = sessions_with(NodeOptions::new("test_node").domain(18).rmw_wire(RmwWire::Humble));
    assert_eq!(node.rmw_wire(), RmwWire::Humble);
    let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
    let rihs = <Image<()> as RosDataMessage>::type_hash().to_string();
    let publisher = node.publisher::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    assert_eq!(publisher.key(), format!("18/t/{dds}/TypeHashNotSupported"));
    assert_eq!(sub.key(), publisher.key());
    for (token, gid) in [(publisher.token(), publisher.gid()), (sub.token(), sub.gid())] {
        assert!(token.ends_with(&format!("/%t/{dds}/TypeHashNotSupported/1:2:1,10:,:,:1,,")), "{token}");
        assert_eq!(gid, gid_of(token));
    }
    let (tx, rx) = flume::unbounded();
    let _raw_sub = raw
        .declare_subscriber(publisher.key())
        .callback(move |s| {
            let _ = tx.send((s.payload().to_bytes().into_owned(), s.attachment().map(|a| a.to_bytes().into_owned())));
        })
        .wait()
        .unwrap();

    // A Jazzy subscription of the topic: in the graph, but on another key.
    let jazzy = endpoint(&raw, 18, 1, "MS", &rihs, "::,10:,:,:,,", "");
    let _jazzy = raw.liveliness().declare_token(jazzy.clone()).wait().unwrap();
    wait_for("the Jazzy MS token", || node.graph().entities.iter().any(|e| e.token == jazzy));
    assert_eq!(publisher.ordinary_subscriptions(), 0);
    assert!(!publisher.publish_host(&fields(), &[1; 16]).unwrap().base);

    // A Humble subscription: ordinary, served CDR on the Humble key with our GID.
    let humble = endpoint(&raw, 18, 2, "MS", "TypeHashNotSupported", "::,10:,:,:,,", "");
    let _humble = raw.liveliness().declare_token(humble).wait().unwrap();
    wait_for("the Humble MS token", || publisher.ordinary_subscriptions() == 1);
    let r = publisher.publish_host(&fields(), &[2; 16]).unwrap();
    assert!(r.base && r.seq == 2);
    let (payload, att) = rx.recv_timeout(IO).unwrap();
    let att = Attachment::decode(&att.expect("attachment")).unwrap();
    assert_eq!((att.seq, att.gid), (2, publisher.gid()));
    let (msg, range) = <Image<()> as RosDataMessage>::decode_cdr(&payload).unwrap();
    assert_eq!((msg, &payload[range]), (fields(), &[2u8; 16][..]));

    // Our subscription hears a Humble publisher's key, not a Jazzy one's.
    raw_sees(&raw, sub.token());
    let gid = [6; 16];
    raw.put(format!("18/t/{dds}/{rihs}"), cdr(&[3; 16])).attachment(attachment(1, gid)).wait().unwrap();
    raw.put(sub.key(), cdr(&[4; 16])).attachment(attachment(2, gid)).wait().unwrap();
    let mut got = Vec::new();
    while let Ok(s) = sub.recv_timeout(Duration::from_secs(2)) {
        if s.attachment().gid == gid {
            got.push(s.host_data().unwrap()[0]);
        }
    }
    assert_eq!(got, vec![4], "the Humble key only");
}

/// A subscription on Humble's wire reports a publisher of a later distribution as
/// silent with its own reason (`later-distro`); one on the classic wire still reports a
/// Humble publisher as `humble`. Each hears the publisher of its own wire.
#[test]
fn humble_and_later_publishers_are_reported_across_wires() {
    let _w = watchdog_guard("humble_and_later_publishers_are_reported_across_wires", Duration::from_secs(60));
    let window = Duration::from_millis(400);
    let (humble_node, raw) = sessions_with(
        NodeOptions::new("humble_node").domain(19).rmw_wire(RmwWire::Humble).silence_window(Some(window)),
    );
    let classic_node = RosNode::new(
        humble_node.session(),
        NodeOptions::new("classic_node").domain(19).rmw_wire(RmwWire::Classic).silence_window(Some(window)),
    )
    .unwrap();
    let on_humble = humble_node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    let on_classic = classic_node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    assert_ne!(on_humble.key(), on_classic.key());
    let rihs = <Image<()> as RosDataMessage>::type_hash().to_string();
    let jazzy_mp = endpoint(&raw, 19, 1, "MP", &rihs, "::,10:,:,:,,", "");
    let humble_mp = endpoint(&raw, 19, 2, "MP", "TypeHashNotSupported", "::,10:,:,:,,", "");
    let (jazzy_gid, humble_gid) = (gid_of(&jazzy_mp), gid_of(&humble_mp));
    let tokens: Vec<_> = [&jazzy_mp, &humble_mp]
        .into_iter()
        .map(|t| raw.liveliness().declare_token(t.clone()).wait().unwrap())
        .collect();
    raw_sees(&raw, on_humble.token());
    raw_sees(&raw, on_classic.token());
    let t0 = Instant::now();
    let mut seq = 0;
    while t0.elapsed() < window * 4 {
        seq += 1;
        raw.put(on_classic.key(), cdr(&[1; 4])).attachment(attachment(seq, jazzy_gid)).wait().unwrap();
        raw.put(on_humble.key(), cdr(&[2; 4])).attachment(attachment(seq, humble_gid)).wait().unwrap();
        std::thread::sleep(Duration::from_millis(40));
        while let Some(s) = on_humble.try_recv() {
            assert_eq!(s.attachment().gid, humble_gid, "only the Humble publisher reaches the Humble wire");
        }
        while let Some(s) = on_classic.try_recv() {
            assert_eq!(s.attachment().gid, jazzy_gid, "only the Jazzy publisher reaches the classic wire");
        }
    }
    wait_for("one report each", || {
        on_humble.stats().silent_publishers == 1 && on_classic.stats().silent_publishers == 1
    });
    let only = |s: &zenoh_cuda_shm_ros2::RosSubscriber<Image<()>>| {
        let silent = s.silent_publishers();
        assert_eq!(silent.len(), 1, "{silent:?}");
        silent.into_iter().next().unwrap()
    };
    let later = only(&on_humble);
    assert_eq!((later.gid, later.reasons.clone()), (jazzy_gid, vec![SilenceReason::LaterDistro { theirs: rihs }]));
    assert!(later.reasons[0].to_string().contains("ROS_DISTRO=humble"), "{}", later.reasons[0]);
    let earlier = only(&on_classic);
    assert_eq!((earlier.gid, earlier.reasons.clone()), (humble_gid, vec![SilenceReason::Humble]));
    assert!(earlier.reasons[0].to_string().contains("ROS_DISTRO=humble"), "{}", earlier.reasons[0]);
    assert!(
        silence_token(19, &on_humble.gid(), &jazzy_gid, &later.reasons).ends_with("/later-distro"),
        "the silence token's code"
    );
    assert!(silence_token(19, &on_classic.gid(), &humble_gid, &earlier.reasons).ends_with("/humble"));
    drop(tokens);
}

/// Topic names resolve as rcl resolves them; invalid names are refused at declaration.
#[test]
fn topic_names_resolve_as_rcl_does() {
    let _w = watchdog_guard("topic_names_resolve_as_rcl_does", Duration::from_secs(60));
    let (node, _raw) = sessions_with(NodeOptions::new("cam").namespace("/robot1").domain(16));
    let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
    for (name, want) in
        [("camera/image", "/robot1/camera/image"), ("/camera/image", "/camera/image"), ("~/image", "/robot1/cam/image")]
    {
        let p = node.publisher::<Image<()>>(name, Qos::reliable(1)).unwrap();
        assert_eq!(p.topic(), want);
        assert!(p.key().starts_with(&format!("16{want}/{dds}/")), "{}", p.key());
        assert!(p.token().contains(&format!("/MP/%/%robot1/cam/{}/", want.replace('/', "%"))), "{}", p.token());
        let s = node.subscriber::<Image<()>>(name, Qos::reliable(1)).unwrap();
        assert_eq!((s.topic(), s.key()), (want, p.key()));
    }
    for bad in ["camera/", "1camera", "/a//b", "~x", "{unknown}", "a b"] {
        match node.subscriber::<Image<()>>(bad, Qos::reliable(1)) {
            Err(RosDeclareError::Name(NameError::Invalid { name, .. })) => assert_eq!(name, bad),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(matches!(
        RosNode::new(node.session(), NodeOptions::new("cam").namespace("robot1")),
        Err(RosDeclareError::Name(NameError::Invalid { .. }))
    ));
}

/// A subscription's `recv` polls while messages come within `spin_us` of each other,
/// and stops once they come further apart: a fixed poll would cost 300 µs per slow
/// message here.
#[test]
fn recv_polls_only_while_messages_come_close_together() {
    const TEST: &str = "recv_polls_only_while_messages_come_close_together";
    let _w = watchdog_guard(TEST, Duration::from_secs(60));
    let port = free_tcp_port();
    let ours = GpuSession::open(
        loopback_zenoh_config(Some(port), None, Some("15")),
        ZcsConfig { device: DeviceChoice::Host, spin_us: 300, ..ZcsConfig::default() },
    )
    .wait()
    .unwrap();
    let raw = zenoh::open(loopback_zenoh_config(None, Some(port), None)).wait().unwrap();
    let node = RosNode::new(&ours, NodeOptions::new("test_node").domain(15)).unwrap();
    let sub = node.subscriber::<Image<()>>("/t", Qos::reliable(10)).unwrap();
    raw_sees(&raw, sub.token());
    let key = sub.key().to_owned();
    let gid = [8; 16];
    for seq in 1..=200 {
        raw.put(&key, cdr(&[1; 4])).attachment(attachment(seq, gid)).wait().unwrap();
        assert_eq!(sub.recv_timeout(IO).unwrap().attachment().seq, seq);
    }
    let fast = sub.stats();
    assert!(fast.polled_us > 0, "back-to-back messages: recv polled for them: {fast:?}");
    let slow = 20;
    std::thread::scope(|s| {
        s.spawn(|| {
            for seq in 201..=200 + slow {
                std::thread::sleep(Duration::from_millis(20));
                raw.put(&key, cdr(&[1; 4])).attachment(attachment(seq, gid)).wait().unwrap();
            }
        });
        for seq in 201..=200 + slow {
            assert_eq!(sub.recv().unwrap().attachment().seq, seq);
        }
    });
    let st = sub.stats();
    assert_eq!((st.base, st.lost), (200 + slow as u64, 0));
    let polled = st.polled_us - fast.polled_us;
    assert!(polled < 2000, "slow messages: polling should stop after the first gaps, polled {polled} µs");
    println!("{TEST}: {} µs polled for 200 fast messages, {polled} µs for {slow} slow ones", fast.polled_us);
}
