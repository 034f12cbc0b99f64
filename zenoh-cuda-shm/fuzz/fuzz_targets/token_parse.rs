//! Fuzzes the parsers of names that arrive in liveliness tokens: `Token::parse` (the
//! whole token key), `SocketName::from_key_chunk` (the control socket a publisher
//! advertises, which a subscriber then connects to), and the ROS graph's tokens:
//! `Entity::parse`, the `backends:` chunk of buffer-aware rmw_zenoh endpoints and the
//! canonical rebuild GIDs are hashed from. Whatever parses must print back to the same
//! text and parse to the same value; a canonical token is its own canonical form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zcs_wire::ipc::SocketName;
use zcs_wire::protocol::Token;
use zenoh_cuda_shm_ros2::Backends;
use zenoh_cuda_shm_ros2::Entity;
use zenoh_cuda_shm_ros2::names::{canonical_qos, canonical_token, gid_of};
use zenoh_cuda_shm_ros2::resolve::resolve_topic;

fuzz_target!(|input: &[u8]| {
    let Ok(s) = std::str::from_utf8(input) else { return };
    if let Some(t) = Token::parse(s) {
        let k = t.to_key();
        assert_eq!(Token::parse(&k).as_ref(), Some(&t));
        if let Some(chunk) = &t.socket {
            let _ = SocketName::from_key_chunk(chunk);
        }
    }
    if let Ok(name) = SocketName::from_key_chunk(s) {
        let chunk = name.to_key_chunk();
        assert_eq!(SocketName::from_key_chunk(&chunk).expect("printed name must parse"), name);
        assert!(!name.to_string().is_empty());
    }

    // ROS graph tokens, and their backends chunk on its own.
    if let Some(e) = Entity::parse(s) {
        assert_eq!(e.gid, gid_of(s));
    }
    if let Some(c) = canonical_token(s) {
        assert_eq!(canonical_token(&c).as_deref(), Some(c.as_str()), "canonical form is stable");
        assert_eq!(gid_of(&c), gid_of(s));
    }
    if let Some(q) = canonical_qos(s) {
        assert_eq!(canonical_qos(&q).as_deref(), Some(q.as_str()));
    }
    let chunk = if s.starts_with("backends:") { s.to_owned() } else { format!("backends:{s}") };
    if let Ok(Some(b)) = Backends::parse_chunk(&chunk) {
        let printed = b.to_chunk().expect("a parsed list is not empty");
        assert_eq!(Backends::parse_chunk(&printed), Ok(Some(b)));
    }
    if let Ok(topic) = resolve_topic(s, "/ns", "node") {
        assert_eq!(resolve_topic(&topic, "/other", "x").as_deref(), Ok(topic.as_str()), "a resolved name is absolute");
    }
});
