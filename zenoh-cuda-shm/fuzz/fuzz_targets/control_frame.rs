//! Fuzzes a publisher's receive path end to end below the handshake logic: whatever a
//! peer process can put on the control socket with one `sendmsg` — any bytes, up to
//! 20 descriptors attached (the limit is 16), a frame longer than the 64 KiB maximum —
//! goes through a real `SOCK_SEQPACKET` pair into `ControlConn::recv` and, when it is a
//! frame, into the `Request` decoder.
//!
//! Input layout: byte 0 = number of descriptors to attach (mod 21); byte 1 bit 0 =
//! make the frame oversized (the rest repeated past `MAX_FRAME_BYTES`); the rest is
//! the payload. Checked after every run: a valid frame arrived whole with its fds and
//! nothing else is queued (the connection is then reused by the next run); a protocol
//! violation shut the connection down (the sender sees `Closed`), and once the pair is
//! closed no descriptor is left open (the lowest free fd number is what it was before
//! the pair was made).
#![no_main]

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use zcs_wire::ipc::{ControlConn, MAX_FRAME_BYTES, MAX_FRAME_FDS, RecvError, SendError};
use zcs_wire::protocol::{self, Request};

/// One descriptor, attached as many times as the input asks (the kernel installs a new
/// descriptor per slot at the receiver).
fn attachable() -> &'static OwnedFd {
    static FD: OnceLock<OwnedFd> = OnceLock::new();
    FD.get_or_init(|| std::fs::File::open("/dev/null").expect("/dev/null").into())
}

/// The connected pair of the previous run, reused while no violation shut it down
/// (a new pair per run would cost more than the code under test).
static PAIR: Mutex<Option<(ControlConn, ControlConn)>> = Mutex::new(None);

/// The lowest descriptor number not in use (above stdio): a duplicate takes it.
fn lowest_free_fd() -> RawFd {
    let probe = attachable().try_clone().expect("F_DUPFD_CLOEXEC");
    probe.as_raw_fd()
}

fuzz_target!(|input: &[u8]| {
    let mut pair = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    // Measured with no pair open, so a leak cannot hide behind a socket kept for reuse.
    let fd_before = pair.is_none().then(lowest_free_fd);
    {
        let (nfds, flags, payload) = match input {
            [n, f, rest @ ..] => (usize::from(*n) % 21, *f, rest),
            _ => return,
        };
        let mut bytes = payload.to_vec();
        if flags & 1 == 1 {
            let unit = if payload.is_empty() { vec![0u8] } else { payload.to_vec() };
            while bytes.len() <= MAX_FRAME_BYTES {
                bytes.extend_from_slice(&unit);
            }
        }
        let (peer, us) = match pair.take() {
            Some(p) => p,
            None => ControlConn::pair().expect("socketpair"),
        };
        let raw: Vec<RawFd> = vec![attachable().as_raw_fd(); nfds];
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
        let sent =
            sendmsg::<()>(peer.as_fd().as_raw_fd(), &[IoSlice::new(&bytes)], cmsgs, MsgFlags::MSG_NOSIGNAL, None);
        let Ok(sent) = sent else {
            // Only a frame larger than the socket's buffer can be refused here.
            assert!(bytes.len() > MAX_FRAME_BYTES, "sendmsg of {} bytes failed", bytes.len());
            return;
        };
        assert_eq!(sent, bytes.len());
        let violation = match us.recv(Duration::from_secs(5)) {
            Ok(frame) => {
                assert!(!bytes.is_empty() && bytes.len() <= MAX_FRAME_BYTES && nfds <= MAX_FRAME_FDS);
                assert_eq!(frame.bytes, bytes);
                assert_eq!(frame.fds.len(), nfds);
                if let Ok(r) = protocol::decode::<Request>("control request", &frame.bytes) {
                    assert_eq!(protocol::decode::<Request>("control request", &protocol::encode(&r)), Ok(r));
                }
                false
            }
            Err(RecvError::TooLarge { max }) => {
                assert!(bytes.len() > MAX_FRAME_BYTES && max == MAX_FRAME_BYTES);
                true
            }
            Err(RecvError::TooManyFds { max, received }) => {
                assert!(nfds > MAX_FRAME_FDS && received <= max);
                true
            }
            Err(RecvError::Empty { fds }) => {
                assert!(bytes.is_empty() && fds == nfds);
                true
            }
            Err(e) => panic!("unexpected receive error {e:?} for {} bytes, {nfds} fds", bytes.len()),
        };
        if violation {
            // The offending peer is cut off, on both ends.
            assert!(matches!(peer.send(b"x", &[]), Err(SendError::Closed)));
            assert!(matches!(us.try_recv(), Err(RecvError::Closed)));
        } else {
            // Nothing is left queued: the frame was consumed whole.
            assert!(matches!(us.try_recv(), Ok(None)));
            *pair = Some((peer, us));
            return;
        }
    }
    // The pair is closed: every descriptor this run received must be closed too.
    let after = lowest_free_fd();
    if let Some(before) = fd_before {
        assert_eq!(after, before, "descriptor leaked: {:?}", std::fs::read_link(format!("/proc/self/fd/{before}")));
    }
});
