//! Fuzzes the parsers of names that arrive in liveliness tokens: `Token::parse` (the
//! whole token key) and `SocketName::from_key_chunk` (the control socket a publisher
//! advertises, which a subscriber then connects to). Whatever parses must print back
//! to the same text and parse to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zenoh_cuda_shm::ipc::SocketName;
use zenoh_cuda_shm::protocol::Token;

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
});
