//! A process's connection to the host provider: borrow and give back blocks (as a
//! publisher's [`Lender`]), open and close lent blocks (as a subscriber).

// Re-exported whole by `zenoh-cuda-shm` (`provider`): errors and panics documented as
// there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ipc::{ControlConn, DecodeNameError, SocketName};
use crate::pool::{BorrowError, Borrowed, Lender};
use crate::protocol::{self, ProviderRef, ProviderReply, ProviderRequest, ProviderToken};
use crate::sync::Unpoisoned;

/// Talking to the provider failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The socket name in the provider's token is not one.
    #[error("the provider's socket name is invalid")]
    Name(#[source] DecodeNameError),
    /// Connecting, sending or receiving failed: the provider is gone.
    #[error("provider unreachable")]
    Unreachable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The provider's answer does not decode.
    #[error("the provider's answer does not decode")]
    Decode(#[source] protocol::DecodeError),
    /// The provider answered something we did not ask for.
    #[error("provider protocol: {0}")]
    Protocol(String),
    /// The provider refused the request.
    #[error("provider refused: {reason}")]
    Refused {
        /// Why, in the provider's words.
        reason: String,
        /// True when retrying cannot help.
        permanent: bool,
    },
}

/// Why a session has no host provider to borrow blocks from (its publishers then
/// allocate their blocks in their own process).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NoProvider {
    /// The session's configuration says `provider: off`.
    #[error("the host provider is turned off in this session's configuration (provider: off)")]
    Off,
    /// No provider has announced itself on this host (no router with the plugin).
    #[error("no host provider announced on this host")]
    NotAnnounced,
    /// The provider does not lend blocks of this session's device.
    #[error("the host provider does not lend {device} blocks")]
    NoSuchDevice {
        /// The session's device (`cuda-<uuid>` or `host`).
        device: String,
    },
    /// A provider is announced but cannot be used.
    #[error("the host provider announced on this host cannot be used")]
    Unusable(#[source] ClientError),
}

/// One connection to a provider, shared by a session's publishers and subscribers.
/// Requests that are answered (`Borrow`, `Open`) take turns receiving (`receiving`);
/// `Return`, `Close` and `Report` are single frames sent from any thread, never behind
/// a round trip.
pub struct ProviderClient {
    provider: ProviderRef,
    devices: Vec<String>,
    conn: ControlConn,
    receiving: Mutex<()>,
    next_tag: AtomicU64,
    dead: AtomicBool,
}

impl std::fmt::Debug for ProviderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderClient")
            .field("provider", &self.provider)
            .field("devices", &self.devices)
            .field("dead", &self.is_dead())
            .finish()
    }
}

/// How long a round trip may take beyond the provider's own loan timeout.
const REPLY_MARGIN: Duration = Duration::from_secs(2);

impl ProviderClient {
    /// Looks for a provider of this kernel (`boot_id`) among the liveliness tokens, for
    /// at most `timeout`. The first one found wins.
    pub fn discover(session: &zenoh::Session, boot_id: &str, timeout: Duration) -> Option<ProviderRef> {
        use zenoh::Wait;
        let replies = session.liveliness().get(ProviderToken::selector(boot_id)).timeout(timeout).wait().ok()?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = replies.recv_timeout(left).ok()??;
            let Ok(sample) = reply.result() else { continue };
            match ProviderToken::parse(sample.key_expr().as_str()) {
                Some(t) if t.boot_id == boot_id => return Some(t.provider),
                _ => tracing::debug!(key = %sample.key_expr(), "malformed provider token ignored"),
            }
        }
    }

    /// Connects to `provider` and says hello.
    ///
    /// # Errors
    /// [`ClientError::Name`] when the token's socket name is not one;
    /// [`ClientError::Unreachable`] when connecting, sending or receiving fails (the
    /// provider is gone, or no answer within the timeout); [`ClientError::Decode`] for
    /// an answer that does not decode; [`ClientError::Protocol`] for any answer but a
    /// welcome from that provider (a refusal included).
    pub fn connect(provider: &ProviderRef, client: u64, timeout: Duration) -> Result<Arc<Self>, ClientError> {
        let name = SocketName::from_key_chunk(&provider.socket).map_err(ClientError::Name)?;
        let conn = ControlConn::connect(&name, timeout).map_err(|e| ClientError::Unreachable(e.into()))?;
        let program = std::env::args().next().unwrap_or_default();
        let program = program.rsplit('/').next().unwrap_or_default().chars().take(64).collect();
        let hello = ProviderRequest::Hello { client, program };
        conn.send(&protocol::encode(&hello), &[]).map_err(|e| ClientError::Unreachable(e.into()))?;
        let frame = conn.recv(timeout).map_err(|e| ClientError::Unreachable(e.into()))?;
        match protocol::decode::<ProviderReply>("provider reply", &frame.bytes) {
            Ok(ProviderReply::Welcome { provider: id, devices }) if id == provider.id => Ok(Arc::new(Self {
                provider: provider.clone(),
                devices,
                conn,
                receiving: Mutex::new(()),
                next_tag: AtomicU64::new(1),
                dead: AtomicBool::new(false),
            })),
            Ok(ProviderReply::Welcome { provider: id, .. }) => {
                Err(ClientError::Protocol(format!("expected provider {:016x}, reached {id:016x}", provider.id)))
            }
            Ok(other) => Err(ClientError::Protocol(format!("expected Welcome, got {other:?}"))),
            Err(e) => Err(ClientError::Decode(e)),
        }
    }

    /// Which provider this is.
    pub fn provider(&self) -> &ProviderRef {
        &self.provider
    }

    /// The devices it lends blocks of (`cuda-<uuid>`, `host`).
    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    /// Whether the connection has failed (the provider exited).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    fn unreachable(&self, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ClientError {
        self.dead.store(true, Ordering::Relaxed);
        ClientError::Unreachable(e.into())
    }

    /// One answered request: frames left over from an earlier request that timed out
    /// (other tags) are skipped.
    fn round_trip(
        &self,
        tag: u64,
        req: &ProviderRequest,
        timeout: Duration,
    ) -> Result<(ProviderReply, Vec<OwnedFd>), ClientError> {
        if self.is_dead() {
            return Err(ClientError::Unreachable("the connection was lost earlier".into()));
        }
        let _turn = self.receiving.locked();
        let conn = &self.conn;
        conn.send(&protocol::encode(req), &[]).map_err(|e| self.unreachable(e))?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = match conn.recv(left) {
                Ok(f) => f,
                Err(crate::ipc::RecvError::Timeout(t)) => {
                    return Err(ClientError::Protocol(format!("no answer within {t:?}")));
                }
                Err(e) => return Err(self.unreachable(e)),
            };
            let reply =
                protocol::decode::<ProviderReply>("provider reply", &frame.bytes).map_err(ClientError::Decode)?;
            let for_us = match &reply {
                ProviderReply::Lent { tag: t, .. }
                | ProviderReply::Opened { tag: t, .. }
                | ProviderReply::Refused { tag: t, .. } => *t == tag,
                ProviderReply::Welcome { .. } => false,
            };
            if for_us {
                return Ok((reply, frame.fds));
            }
            // A loan granted after its request timed out: nobody will use it.
            if let ProviderReply::Lent { loan, .. } = reply {
                let _ = conn.send(&protocol::encode(&ProviderRequest::Return { loan }), &[]);
            }
        }
    }

    /// Borrows a block of `size` bytes on `device`, waiting at most `timeout` for the
    /// provider's pool.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when connecting, sending or receiving fails (the
    /// provider is gone, or no answer within the timeout);
    /// [`ClientError::Refused`] when the provider cannot lend (no block within
    /// `timeout`, no pool of `device`); [`ClientError::Decode`] or
    /// [`ClientError::Protocol`] for an answer that does not decode, was not asked for,
    /// or names a block too large for this process.
    pub fn borrow(&self, device: &str, size: usize, timeout: Duration) -> Result<Borrowed, ClientError> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let req = ProviderRequest::Borrow { tag, device: device.to_owned(), size: size as u64 };
        match self.round_trip(tag, &req, timeout + REPLY_MARGIN)? {
            (ProviderReply::Lent { loan, size: got, .. }, mut fds) if fds.len() == 1 => {
                let Some(fd) = fds.pop() else { return Err(ClientError::Protocol("a block without its fd".into())) };
                let size = usize::try_from(got)
                    .map_err(|_| ClientError::Protocol(format!("a block of {got} bytes does not fit this process")))?;
                Ok(Borrowed { loan, fd, size })
            }
            (ProviderReply::Refused { reason, permanent, .. }, _) => Err(ClientError::Refused { reason, permanent }),
            (other, fds) => {
                Err(ClientError::Protocol(format!("unexpected answer to Borrow: {other:?} ({} fds)", fds.len())))
            }
        }
    }

    /// Gives a loan back. Never blocks for long, never panics.
    pub fn give_back(&self, loan: u64) {
        self.send_quietly(&ProviderRequest::Return { loan });
    }

    /// Opens a lent block named by a descriptor: its FD and size.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when connecting, sending or receiving fails (the
    /// provider is gone, or no answer within the timeout);
    /// [`ClientError::Refused`] for a loan the provider no longer holds (or one not
    /// this process may open); [`ClientError::Decode`] or [`ClientError::Protocol`] for
    /// an answer that does not decode, was not asked for, or names a block too large
    /// for this process.
    pub fn open(&self, loan: u64) -> Result<(OwnedFd, usize), ClientError> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        match self.round_trip(tag, &ProviderRequest::Open { tag, loan }, REPLY_MARGIN)? {
            (ProviderReply::Opened { size, .. }, mut fds) if fds.len() == 1 => {
                let size = usize::try_from(size)
                    .map_err(|_| ClientError::Protocol(format!("a block of {size} bytes does not fit this process")))?;
                let Some(fd) = fds.pop() else { return Err(ClientError::Protocol("a block without its fd".into())) };
                Ok((fd, size))
            }
            (ProviderReply::Refused { reason, permanent, .. }, _) => Err(ClientError::Refused { reason, permanent }),
            (other, fds) => {
                Err(ClientError::Protocol(format!("unexpected answer to Open: {other:?} ({} fds)", fds.len())))
            }
        }
    }

    /// Sends this process's report, trimmed to one frame. Never blocks for long.
    pub fn report(&self, mut report: crate::protocol::ProcessReport) {
        loop {
            let req = ProviderRequest::Report(report);
            if protocol::encode(&req).len() <= crate::ipc::MAX_FRAME_BYTES {
                return self.send_quietly(&req);
            }
            let ProviderRequest::Report(r) = req else { return };
            report = r;
            // Too many entities for one frame: the registry shows the first ones.
            if report.subscribers.len() >= report.publishers.len() {
                report.subscribers.pop();
            } else {
                report.publishers.pop();
            }
        }
    }

    /// Says that this process no longer maps `loan`'s block. Never panics.
    pub fn close(&self, loan: u64) {
        self.send_quietly(&ProviderRequest::Close { loans: vec![loan] });
    }

    fn send_quietly(&self, req: &ProviderRequest) {
        if self.is_dead() {
            return;
        }
        if let Err(e) = self.conn.send_timeout(&protocol::encode(req), &[], Duration::from_millis(100)) {
            // The provider counts a dead connection as closing everything it held.
            tracing::debug!(error = %crate::error::Chain(&e), "provider unreachable; its end of the loan is settled on disconnect");
            self.dead.store(true, Ordering::Relaxed);
        }
    }
}

/// The lender of one device of a provider: what a publisher's backend borrows from.
#[derive(Debug)]
pub struct DeviceLender {
    client: Arc<ProviderClient>,
    device: String,
    timeout: Duration,
}

impl DeviceLender {
    /// Lends blocks of `device` from `client`'s provider, waiting at most `timeout` for
    /// one (the publisher's loan timeout).
    pub fn new(client: Arc<ProviderClient>, device: String, timeout: Duration) -> Self {
        Self { client, device, timeout }
    }
}

impl Lender for DeviceLender {
    fn borrow(&self, size: usize) -> Result<Borrowed, BorrowError> {
        self.client.borrow(&self.device, size, self.timeout).map_err(|e| BorrowError {
            unavailable: matches!(e, ClientError::Unreachable(_) | ClientError::Refused { permanent: true, .. }),
            reason: crate::error::chain(&e),
        })
    }

    fn give_back(&self, loan: u64) {
        self.client.give_back(loan);
    }
}

/// The providers a session has reached, by id: its own (found at open) and any that a
/// publisher names in its `Welcome`. One connection per provider per session.
#[derive(Debug)]
pub struct Providers {
    client: u64,
    known: Mutex<std::collections::HashMap<u64, Arc<ProviderClient>>>,
}

impl Providers {
    /// An empty directory for a session with random id `client`.
    pub fn new(client: u64) -> Self {
        Self { client, known: Mutex::new(std::collections::HashMap::new()) }
    }

    /// The connection to `provider`, made now if there is none or it failed.
    ///
    /// # Errors
    /// As [`ProviderClient::connect`].
    pub fn get(&self, provider: &ProviderRef, timeout: Duration) -> Result<Arc<ProviderClient>, ClientError> {
        let mut known = self.known.locked();
        if let Some(c) = known.get(&provider.id).filter(|c| !c.is_dead() && c.provider() == provider) {
            return Ok(Arc::clone(c));
        }
        let c = ProviderClient::connect(provider, self.client, timeout)?;
        known.insert(provider.id, Arc::clone(&c));
        Ok(c)
    }
}

/// A session's view of the host provider: a liveliness subscriber (with history) on
/// the provider tokens of this kernel keeps the latest announced one, so a provider that
/// appears after the session opened (peers still connecting, a router restarted) is used
/// by the publishers declared from then on.
pub struct ProviderWatch {
    device: String,
    providers: Arc<Providers>,
    seen: Arc<Mutex<Option<ProviderRef>>>,
    connect_timeout: Duration,
    _sub: zenoh::pubsub::Subscriber<()>,
}

impl std::fmt::Debug for ProviderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderWatch").field("device", &self.device).field("seen", &self.seen).finish_non_exhaustive()
    }
}

impl ProviderWatch {
    /// Watches for providers of `boot_id` that lend `device` blocks.
    ///
    /// # Errors
    /// The [`zenoh::Error`] of a liveliness subscriber that cannot be declared.
    pub fn start(
        session: &zenoh::Session,
        boot_id: &str,
        device: &str,
        providers: Arc<Providers>,
        connect_timeout: Duration,
    ) -> Result<Self, zenoh::Error> {
        use zenoh::Wait;
        let seen: Arc<Mutex<Option<ProviderRef>>> = Arc::default();
        let (s, boot) = (Arc::clone(&seen), boot_id.to_owned());
        let sub = session
            .liveliness()
            .declare_subscriber(ProviderToken::selector(boot_id))
            .history(true)
            .callback(move |sample| {
                let Some(t) = ProviderToken::parse(sample.key_expr().as_str()).filter(|t| t.boot_id == boot) else {
                    return;
                };
                let mut seen = s.locked();
                match sample.kind() {
                    zenoh::sample::SampleKind::Put => *seen = Some(t.provider),
                    zenoh::sample::SampleKind::Delete if seen.as_ref() == Some(&t.provider) => *seen = None,
                    zenoh::sample::SampleKind::Delete => {}
                }
            })
            .wait()?;
        Ok(Self { device: device.to_owned(), providers, seen, connect_timeout, _sub: sub })
    }

    /// Records a provider found another way (a liveliness query at open).
    pub fn offer(&self, provider: ProviderRef) {
        let mut seen = self.seen.locked();
        if seen.is_none() {
            *seen = Some(provider);
        }
    }

    /// The provider to borrow from now (connected on first use), or why there is none.
    ///
    /// # Errors
    /// [`NoProvider::NotAnnounced`] while no provider has been seen;
    /// [`NoProvider::Unusable`] when connecting to it fails; [`NoProvider::NoSuchDevice`]
    /// when it lends no blocks of this watch's device.
    pub fn current(&self) -> Result<Arc<ProviderClient>, NoProvider> {
        let seen = self.seen.locked().clone();
        let provider = seen.ok_or(NoProvider::NotAnnounced)?;
        let client = self.providers.get(&provider, self.connect_timeout).map_err(NoProvider::Unusable)?;
        if !client.devices().contains(&self.device) {
            return Err(NoProvider::NoSuchDevice { device: self.device.clone() });
        }
        Ok(client)
    }

    /// [`current`](Self::current), waiting up to `timeout` for a provider to be announced.
    ///
    /// # Errors
    /// The last error of [`current`](Self::current) once `timeout` has passed.
    pub fn wait(&self, timeout: Duration) -> Result<Arc<ProviderClient>, NoProvider> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.current() {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}
