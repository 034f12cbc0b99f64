//! The subscriber's side of the handshake with one publisher: connect and `Hello`,
//! the probe imported, `Ack`, then `Ready` naming the first message the link routes.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::import::ImportCache;
use super::ready::PublisherSignals;
use super::{Link, Shared, SubMedium};
use crate::host::HostBlock;
use crate::ipc::{ConnectError, ControlConn, DecodeNameError, RecvError, SendError, SocketName};
use crate::pool::CapabilityKey;
use crate::protocol::{self, Group, Reply, Request, Token};
use crate::signal::ReadySignals;
use crate::sync::Unpoisoned;

/// Why a handshake with a publisher failed (the publisher then serves bytes); its text,
/// causes included, is the subscriber's `bytes_reason` for that publisher.
#[derive(Debug, thiserror::Error)]
pub(super) enum HandshakeError {
    /// The socket name in the publisher's token does not decode.
    #[error("the publisher's socket name is invalid")]
    Name(#[source] DecodeNameError),
    /// Nothing listens on the publisher's socket: its liveliness token outlived it (a
    /// router keeps a token until it notices the session is gone).
    #[error("the publisher is gone; its token has outlived it")]
    Gone(#[source] ConnectError),
    /// Connecting failed otherwise.
    #[error("cannot connect to the publisher")]
    Connect(#[source] ConnectError),
    /// Sending on the control connection failed.
    #[error("the control connection failed")]
    Send(#[source] SendError),
    /// Receiving on the control connection failed (or timed out).
    #[error("the control connection failed")]
    Recv(#[source] RecvError),
    /// The publisher's reply does not decode.
    #[error("the publisher's reply does not decode")]
    Decode(#[source] protocol::DecodeError),
    /// The publisher refused us.
    #[error("refused by the publisher: {0}")]
    Refused(String),
    /// The publisher broke the handshake's protocol.
    #[error("the publisher broke the handshake: {0}")]
    Protocol(String),
    /// The host provider that lends the publisher's blocks cannot be reached.
    #[error("cannot reach the publisher's host provider")]
    Provider(#[source] crate::provider::ClientError),
    /// The publisher's probe (its ready signals, or a host block) cannot be imported.
    #[error("cannot import the publisher's probe")]
    Probe(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The publisher's token vanished while we were handshaking.
    #[error("the publisher vanished during the handshake")]
    Vanished,
}

/// The start of a handshake: connects to a publisher's control socket (waiting up to
/// `timeout` for room in its backlog) and says Hello, from group `host` when the
/// publisher (of group `theirs`) is to serve host blocks.
pub(super) fn hello(
    sh: &Shared,
    socket: &str,
    theirs: &Group,
    timeout: Duration,
) -> Result<ControlConn, HandshakeError> {
    let name = SocketName::from_key_chunk(socket).map_err(HandshakeError::Name)?;
    let conn = ControlConn::connect(&name, timeout).map_err(|e| match e {
        ConnectError::NotListening { .. } => HandshakeError::Gone(e),
        e => HandshakeError::Connect(e),
    })?;
    // Without a lifeline the publisher learns of our death when our end closes.
    let lifeline = crate::ipc::Lifeline::ours()
        .inspect_err(|e| tracing::warn!(error = %crate::error::Chain(&e), "no lifeline: a publisher learns of this process's death late"))
        .ok();
    let group = match sh.via_host(theirs) {
        true => Group { boot_id: sh.group.boot_id.clone(), device: Group::HOST.to_owned() },
        false => sh.group.clone(),
    };
    let hello =
        Request::Hello { subscriber: sh.instance, group, lifeline: lifeline.is_some(), handles: protocol::HANDLES };
    let fds: Vec<_> = lifeline.iter().map(|l| l.fd()).collect();
    conn.send(&protocol::encode(&hello), &fds).map_err(HandshakeError::Send)?;
    crate::step!("subscriber: Hello sent");
    Ok(conn)
}

/// The rest of a handshake with the publisher of token `t`, on a connection that said
/// Hello: the probe, then `Ready`.
pub(super) fn handshake(sh: &Arc<Shared>, conn: ControlConn, t: &Token) -> Result<Arc<Link>, HandshakeError> {
    let peer_pid = conn.peer_cred().pid;
    let mut frame = conn.recv(sh.handshake_timeout).map_err(HandshakeError::Recv)?;
    crate::step!("subscriber: Welcome received");
    let (publisher, cap_key, probe_size, probe_token, provider) = match protocol::decode::<Reply>(
        "control reply",
        &frame.bytes,
    )
    .map_err(HandshakeError::Decode)?
    {
        Reply::Welcome { publisher, capability_key, probe_size, probe_token, provider, handles, .. } => {
            if handles & protocol::HANDLES == 0 {
                return Err(HandshakeError::Protocol(format!(
                    "no block handle type in common (the publisher exports {handles:#04x}, this build imports {:#04x})",
                    protocol::HANDLES
                )));
            }
            (publisher, capability_key, probe_size, probe_token, provider)
        }
        Reply::Refused { reason } => return Err(HandshakeError::Refused(reason)),
        other => return Err(HandshakeError::Protocol(format!("{other:?} instead of Welcome"))),
    };
    let probe = frame.fds.pop().ok_or_else(|| HandshakeError::Protocol("Welcome without a probe FD".into()))?;
    let probe_size = usize::try_from(probe_size)
        .map_err(|_| HandshakeError::Protocol(format!("a probe of {probe_size} bytes does not fit this process")))?;
    // The publisher's blocks may be lent by a provider: we must reach it to open them.
    let provider = match provider.map(|p| sh.providers.get(&p, sh.handshake_timeout)).transpose() {
        Ok(p) => p,
        Err(e) => {
            let e = HandshakeError::Provider(e);
            let error = Some(crate::error::chain(&e));
            let _ = conn.send(&protocol::encode(&Request::Ack { token: None, error }), &[]);
            return Err(e);
        }
    };
    // Host blocks come with a host probe, whatever our medium; a CUDA subscriber copies
    // them onto its GPU.
    let host_blocks = sh.via_host(&t.group);
    let imported: Result<_, Box<dyn std::error::Error + Send + Sync>> = match &sh.medium {
        SubMedium::Cuda(_) if host_blocks => {
            sh.releases.copier().map_err(Into::into).and_then(|_| host_probe(probe, probe_size))
        }
        SubMedium::Cuda(gpu) => {
            ReadySignals::import(gpu, probe, probe_size).map(|s| (Some(Arc::new(s)), 0)).map_err(Into::into)
        }
        SubMedium::Host => host_probe(probe, probe_size),
    };
    let link_signals = match imported {
        Ok((signals, token)) => {
            if (host_blocks || matches!(sh.medium, SubMedium::Host)) && token != probe_token {
                return Err(HandshakeError::Protocol("the probe does not hold the token the Welcome names".into()));
            }
            signals
        }
        Err(e) => {
            let e = HandshakeError::Probe(e);
            let error = Some(crate::error::chain(&e));
            let _ = conn.send(&protocol::encode(&Request::Ack { token: None, error }), &[]);
            return Err(e);
        }
    };
    crate::step!("subscriber: probe imported");
    conn.send(&protocol::encode(&Request::Ack { token: Some(probe_token), error: None }), &[])
        .map_err(HandshakeError::Send)?;
    let frame = conn.recv(sh.handshake_timeout).map_err(HandshakeError::Recv)?;
    let (first_seq, bytes_through) =
        match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(HandshakeError::Decode)? {
            Reply::Ready { first_seq, bytes_through } => (first_seq, bytes_through),
            Reply::Refused { reason } => return Err(HandshakeError::Refused(reason)),
            other => return Err(HandshakeError::Protocol(format!("{other:?} instead of Ready"))),
        };
    // Lock order everywhere: an `Order` before the state, never the state first.
    let order = sh.state.locked().pubs.get(&publisher).map(|e| Arc::clone(&e.order));
    let order = order.ok_or(HandshakeError::Vanished)?;
    let link = Arc::new(Link {
        conn,
        publisher,
        key: t.key.clone(),
        peer: t.group.device != sh.group.device && !host_blocks,
        host_blocks,
        first_seq,
        bytes_through: bytes_through.min(first_seq.saturating_sub(1)),
        order: Arc::clone(&order),
        cap_key: CapabilityKey::from_bytes(cap_key),
        signals: PublisherSignals::new(link_signals, peer_pid, sh.release_stream.clone()),
        imports: ImportCache::default(),
        alive: AtomicBool::new(true),
        token_gone: AtomicBool::new(false),
        provider,
    });
    let mut o = order.lock();
    o.restart(Some(first_seq));
    match sh.state.locked().pubs.get_mut(&publisher) {
        Some(e) => {
            e.why = None;
            if let Some(old) = e.link.replace(Arc::clone(&link)) {
                // A link that ended while its publisher stayed: its imports go.
                old.imports.clear();
            }
        }
        None => return Err(HandshakeError::Vanished),
    }
    drop(o);
    crate::step!("subscriber: Ready received, linked");
    Ok(link)
}

/// A host probe imported: no signals, and the token it holds.
type HostProbe = Result<(Option<Arc<ReadySignals>>, u64), Box<dyn std::error::Error + Send + Sync>>;

fn host_probe(probe: std::os::fd::OwnedFd, size: usize) -> HostProbe {
    let b = HostBlock::import(probe, size)?;
    if b.size() < 8 {
        return Err(format!("a probe of {} bytes (at least 8 expected)", b.size()).into());
    }
    // SAFETY: the probe is mapped with ≥ 8 bytes (checked above), sealed against
    // shrinking (checked by import), and only read.
    Ok((None, unsafe { (b.as_ptr() as *const u64).read_unaligned() }))
}
