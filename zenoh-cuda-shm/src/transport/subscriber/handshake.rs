//! The subscriber's side of the handshake with one publisher: connect and `Hello`,
//! the probe imported, `Ack`, then `Ready` naming the first message the link routes.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Link, Shared, SubMedium};
use crate::host::HostBlock;
use crate::ipc::{ConnectError, ControlConn, SocketName};
use crate::pool::CapabilityKey;
use crate::protocol::{self, Reply, Request};
use crate::signal::ReadySignals;

/// The start of a handshake: connects to a publisher's control socket (waiting up to
/// `timeout` for room in its backlog) and says Hello.
pub(super) fn hello(sh: &Shared, socket: &str, timeout: Duration) -> Result<ControlConn, String> {
    let name = SocketName::from_key_chunk(socket).map_err(|e| e.to_string())?;
    let conn = ControlConn::connect(&name, timeout).map_err(|e| match e {
        // Its liveliness token outlived it (a router keeps a token until it notices
        // the session is gone): say so, not just which socket was empty.
        ConnectError::NotListening { .. } => format!("the publisher is gone ({e}); its token has outlived it"),
        e => e.to_string(),
    })?;
    // Without a lifeline the publisher learns of our death when our end closes.
    let lifeline = crate::ipc::Lifeline::ours()
        .inspect_err(|e| tracing::warn!(error = %e, "no lifeline: a publisher learns of this process's death late"))
        .ok();
    let hello = Request::Hello { subscriber: sh.instance, group: sh.group.clone(), lifeline: lifeline.is_some() };
    let fds: Vec<_> = lifeline.iter().map(|l| l.fd()).collect();
    conn.send(&protocol::encode(&hello), &fds).map_err(|e| e.to_string())?;
    crate::transport::step!("subscriber: Hello sent");
    Ok(conn)
}

/// The rest of a handshake on a connection that said Hello: the probe, then `Ready`.
pub(super) fn handshake(sh: &Arc<Shared>, conn: ControlConn) -> Result<Arc<Link>, String> {
    let peer_pid = conn.peer_cred().pid;
    let mut frame = conn.recv(sh.handshake_timeout).map_err(|e| e.to_string())?;
    crate::transport::step!("subscriber: Welcome received");
    let (publisher, cap_key, probe_size, probe_token, provider) =
        match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(|e| e.to_string())? {
            Reply::Welcome { publisher, capability_key, probe_size, probe_token, provider, .. } => {
                (publisher, capability_key, probe_size, probe_token, provider)
            }
            Reply::Refused { reason } => return Err(format!("refused: {reason}")),
            other => return Err(format!("unexpected {other:?}")),
        };
    let probe = frame.fds.pop().ok_or("Welcome without a probe FD")?;
    let probe_size = usize::try_from(probe_size).map_err(|e| e.to_string())?;
    // The publisher's blocks may be lent by a provider: we must reach it to open them.
    let provider = match provider.map(|p| sh.providers.get(&p, sh.handshake_timeout)).transpose() {
        Ok(p) => p,
        Err(e) => {
            let error = format!("cannot reach the publisher's host provider: {e}");
            let _ = conn.send(&protocol::encode(&Request::Ack { token: None, error: Some(error.clone()) }), &[]);
            return Err(error);
        }
    };
    let imported = match &sh.medium {
        SubMedium::Cuda(gpu) => {
            ReadySignals::import(gpu, probe, probe_size).map(|s| (Some(Arc::new(s)), 0)).map_err(|e| e.to_string())
        }
        SubMedium::Host => HostBlock::import(probe, probe_size).map_err(|e| e.to_string()).and_then(|b| {
            if b.size() < 8 {
                return Err("probe too small".to_owned());
            }
            // SAFETY: the probe is mapped with ≥ 8 bytes (checked above), sealed
            // against shrinking (checked by import), and only read.
            Ok((None, unsafe { (b.as_ptr() as *const u64).read_unaligned() }))
        }),
    };
    let link_signals = match imported {
        Ok((signals, token)) => {
            if matches!(sh.medium, SubMedium::Host) && token != probe_token {
                return Err("probe token mismatch".into());
            }
            signals
        }
        Err(e) => {
            let _ = conn.send(&protocol::encode(&Request::Ack { token: None, error: Some(e.clone()) }), &[]);
            return Err(format!("probe import failed: {e}"));
        }
    };
    crate::transport::step!("subscriber: probe imported");
    conn.send(&protocol::encode(&Request::Ack { token: Some(probe_token), error: None }), &[])
        .map_err(|e| e.to_string())?;
    let frame = conn.recv(sh.handshake_timeout).map_err(|e| e.to_string())?;
    let first_seq = match protocol::decode::<Reply>("control reply", &frame.bytes).map_err(|e| e.to_string())? {
        Reply::Ready { first_seq } => first_seq,
        Reply::Refused { reason } => return Err(format!("refused: {reason}")),
        other => return Err(format!("unexpected {other:?}")),
    };
    // Lock order everywhere: an `Order` before the state, never the state first.
    let order = sh.state.lock().unwrap_or_else(|p| p.into_inner()).pubs.get(&publisher).map(|e| Arc::clone(&e.order));
    let order = order.ok_or("publisher vanished during the handshake")?;
    let link = Arc::new(Link {
        conn,
        publisher,
        first_seq,
        order: Arc::clone(&order),
        cap_key: CapabilityKey::from_bytes(cap_key),
        signals: link_signals,
        cache: Mutex::new(HashMap::new()),
        alive: AtomicBool::new(true),
        token_gone: AtomicBool::new(false),
        peer_pid,
        awaited: Mutex::new(HashMap::new()),
        unready: Mutex::new(std::collections::HashSet::new()),
        release_stream: sh.release_stream.clone(),
        provider,
    });
    let mut o = order.lock();
    o.restart(Some(first_seq));
    match sh.state.lock().unwrap_or_else(|p| p.into_inner()).pubs.get_mut(&publisher) {
        Some(e) => {
            e.why = None;
            if let Some(old) = e.link.replace(Arc::clone(&link)) {
                // A link that ended while its publisher stayed: its imports go.
                old.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
            }
        }
        None => return Err("publisher vanished during the handshake".into()),
    }
    drop(o);
    crate::transport::step!("subscriber: Ready received, linked");
    Ok(link)
}
