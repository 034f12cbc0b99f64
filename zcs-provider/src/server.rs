//! The provider itself: pools per device, the host socket, loans, importers, reclaim.

// Re-exported whole by `zenoh-cuda-shm` (`provider`): errors and panics documented as
// there.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cuda::{Gpu, ProbeError};
use crate::ipc::{AcceptError, AccessPolicy, ControlConn, ControlListener, RecvError, SocketName};
use crate::pool::{BlockMemory, CudaBackend, HostBackend, Loan, Pool, PoolStats};
use crate::protocol::{self, Group, ProcessReport, ProviderRef, ProviderReply, ProviderRequest, ProviderToken};
use crate::sync::Unpoisoned;

use super::config::{GpuSelection, ProviderConfig, ProviderError};
use super::snapshot::{ClientSnapshot, DeviceSnapshot, ProviderCounters, ProviderSnapshot};

enum DevicePool {
    Cuda { gpu: Gpu, pool: Pool<CudaBackend> },
    Host(Pool<HostBackend>),
}

impl DevicePool {
    fn stats(&self) -> PoolStats {
        match self {
            Self::Cuda { pool, .. } => pool.stats(),
            Self::Host(pool) => pool.stats(),
        }
    }

    fn lend(&self, size: usize) -> Result<AnyLoan, LendError> {
        let class = match self {
            Self::Cuda { pool, .. } => pool.size_class(size),
            Self::Host(pool) => pool.size_class(size),
        };
        if class != Some(size) {
            return Err(LendError::NotABlockSize(size));
        }
        Ok(match self {
            Self::Cuda { pool, .. } => pool.loan(size).map(AnyLoan::Cuda)?,
            Self::Host(pool) => pool.loan(size).map(AnyLoan::Host)?,
        })
    }
}

/// Why a borrow was refused (its text goes back to the borrower).
#[derive(Debug, thiserror::Error)]
enum LendError {
    #[error("{0} bytes is not a block size here (granularity differs?)")]
    NotABlockSize(usize),
    #[error("no block to lend")]
    Loan(#[from] crate::pool::LoanError),
}

/// Holding the pool's loan keeps the block out of the provider's free lists.
enum AnyLoan {
    Cuda(Loan<CudaBackend>),
    Host(Loan<HostBackend>),
}

impl AnyLoan {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Cuda(l) => l.memory().fd(),
            Self::Host(l) => l.memory().fd(),
        }
    }
    fn size(&self) -> usize {
        match self {
            Self::Cuda(l) => l.capacity(),
            Self::Host(l) => l.capacity(),
        }
    }
}

struct LoanEntry {
    device: String,
    borrower: u64,
    /// Connections that opened the block under this loan and have not closed it.
    importers: HashSet<u64>,
    /// The borrower died; the block goes back once `importers` is empty.
    orphaned: bool,
    block: AnyLoan,
}

struct Client {
    client: u64,
    program: String,
    pid: i32,
    uid: u32,
    since_ms: u64,
    borrowed: u64,
    opened: u64,
    report: Option<(u64, ProcessReport)>,
}

struct State {
    clients: HashMap<u64, Client>,
    loans: HashMap<u64, LoanEntry>,
    counters: ProviderCounters,
}

struct Shared {
    provider: ProviderRef,
    boot_id: String,
    pools: BTreeMap<String, DevicePool>,
    unusable_gpus: Vec<String>,
    state: Mutex<State>,
    stop: AtomicBool,
    next_conn: AtomicU64,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }
}

/// A running provider: its socket, its liveliness token, its threads. Dropping it stops
/// them; blocks still lent or mapped stay valid in their borrowers and importers (the
/// memory lives while anyone maps it), only the accounting ends.
pub struct Provider {
    shared: Arc<Shared>,
    listener_thread: Option<JoinHandle<()>>,
    _token: zenoh::liveliness::LivelinessToken,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider").field("provider", &self.shared.provider).finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn open_pools(cfg: &ProviderConfig) -> Result<(BTreeMap<String, DevicePool>, Vec<String>), ProviderError> {
    let mut pools = BTreeMap::new();
    let mut unusable = Vec::new();
    let add_gpu = |gpu: Gpu, pools: &mut BTreeMap<String, DevicePool>| -> Result<(), ProviderError> {
        let device = Group::cuda_device(&gpu.uuid());
        let pool = Pool::new(CudaBackend::new(gpu.clone()), cfg.pool.clone())?;
        tracing::info!(gpu = gpu.name(), ordinal = gpu.ordinal(), %device, "provider: lending blocks of this GPU");
        pools.insert(device, DevicePool::Cuda { gpu, pool });
        Ok(())
    };
    match &cfg.gpus {
        GpuSelection::None => {}
        GpuSelection::Ordinals(list) => {
            for &ordinal in list {
                let gpu = Gpu::open(ordinal).map_err(|source| ProviderError::Gpu { ordinal, source })?;
                add_gpu(gpu, &mut pools)?;
            }
        }
        GpuSelection::All => {
            for ordinal in 0.. {
                match Gpu::open(ordinal) {
                    Ok(gpu) => add_gpu(gpu, &mut pools)?,
                    Err(ProbeError::NoDevice { .. }) => break,
                    Err(e @ ProbeError::Unsupported { .. }) => unusable.push(format!("GPU {ordinal}: {e}")),
                    Err(e) => {
                        unusable.push(e.to_string());
                        break;
                    }
                }
            }
        }
    }
    if cfg.host {
        pools.insert("host".to_owned(), DevicePool::Host(Pool::new(HostBackend::default(), cfg.pool.clone())?));
    }
    if pools.is_empty() {
        return Err(ProviderError::Empty);
    }
    Ok((pools, unusable))
}

impl Provider {
    /// Opens the pools, binds the host socket and announces it on `session` (a
    /// liveliness token that processes of the same kernel look for).
    ///
    /// # Errors
    /// [`ProviderError::BootId`] when the boot id cannot be read; [`ProviderError::Gpu`]
    /// for a GPU asked for by ordinal that cannot be used; [`ProviderError::Pool`] for
    /// pool caps a pool refuses; [`ProviderError::Empty`] when nothing is left to lend;
    /// [`ProviderError::SocketDir`] or [`ProviderError::Bind`] when the host socket
    /// cannot be made; [`ProviderError::Thread`] when its thread cannot start;
    /// [`ProviderError::Zenoh`] when the token cannot be declared.
    pub fn start(cfg: &ProviderConfig, session: &zenoh::Session) -> Result<Self, ProviderError> {
        use zenoh::Wait;
        let boot_id = crate::host::boot_id().map_err(ProviderError::BootId)?;
        let (pools, unusable_gpus) = open_pools(cfg)?;
        let name = match &cfg.socket_dir {
            Some(dir) => {
                crate::ipc::ensure_runtime_dir(dir)?;
                SocketName::random_path_in(dir)?
            }
            None => SocketName::random_abstract(),
        };
        let mut policy = AccessPolicy::same_uid();
        for uid in &cfg.allowed_uids {
            policy = policy.with_uid(*uid);
        }
        let listener = ControlListener::bind_with_policy(&name, policy)?;
        let provider = ProviderRef { id: rand::random::<u64>() | 1, socket: name.to_key_chunk() };
        let token = ProviderToken { boot_id: boot_id.clone(), provider: provider.clone() };
        let token = session.liveliness().declare_token(token.to_key()).wait().map_err(ProviderError::Zenoh)?;
        let shared = Arc::new(Shared {
            provider,
            boot_id,
            pools,
            unusable_gpus,
            state: Mutex::new(State {
                clients: HashMap::new(),
                loans: HashMap::new(),
                counters: ProviderCounters::default(),
            }),
            stop: AtomicBool::new(false),
            next_conn: AtomicU64::new(1),
        });
        let sh = Arc::clone(&shared);
        let listener_thread = std::thread::Builder::new()
            .name("zcs-provider".into())
            .spawn(move || accept_loop(&sh, &listener))
            .map_err(ProviderError::Thread)?;
        tracing::info!(provider = ?shared.provider, devices = ?shared.pools.keys().collect::<Vec<_>>(), "host provider started");
        Ok(Self { shared, listener_thread: Some(listener_thread), _token: token })
    }

    /// Id and socket.
    pub fn provider(&self) -> &ProviderRef {
        &self.shared.provider
    }

    /// The devices it lends blocks of.
    pub fn devices(&self) -> Vec<String> {
        self.shared.pools.keys().cloned().collect()
    }

    /// Pools, clients, loans and counters, now.
    pub fn snapshot(&self) -> ProviderSnapshot {
        let sh = &self.shared;
        let st = sh.state();
        let devices = sh
            .pools
            .iter()
            .map(|(device, pool)| {
                let of_device = st.loans.values().filter(|l| &l.device == device);
                let orphaned = of_device.clone().filter(|l| l.orphaned).count();
                DeviceSnapshot {
                    device: device.clone(),
                    gpu: match pool {
                        DevicePool::Cuda { gpu, .. } => Some((gpu.name().to_owned(), gpu.ordinal())),
                        DevicePool::Host(_) => None,
                    },
                    pool: pool.stats(),
                    loans: of_device.count() - orphaned,
                    orphaned,
                }
            })
            .collect();
        let mut clients: Vec<ClientSnapshot> = st
            .clients
            .iter()
            .map(|(conn, c)| ClientSnapshot {
                client: format!("{:016x}", c.client),
                program: c.program.clone(),
                pid: c.pid,
                uid: c.uid,
                since_ms: c.since_ms,
                loans: st.loans.values().filter(|l| l.borrower == *conn && !l.orphaned).count(),
                mapped: st.loans.values().filter(|l| l.importers.contains(conn)).count(),
                borrowed_total: c.borrowed,
                opened_total: c.opened,
                report: c.report.as_ref().map(|(_, r)| r.clone()),
                reported_ms: c.report.as_ref().map(|(t, _)| *t),
            })
            .collect();
        clients.sort_by_key(|c| c.since_ms);
        ProviderSnapshot {
            provider: sh.provider.clone(),
            boot_id: sh.boot_id.clone(),
            devices,
            unusable_gpus: sh.unusable_gpus.clone(),
            clients,
            counters: st.counters.clone(),
        }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.listener_thread.take() {
            let _ = t.join();
        }
    }
}

const POLL: Duration = Duration::from_millis(100);

fn accept_loop(sh: &Arc<Shared>, listener: &ControlListener) {
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !sh.stop.load(Ordering::Relaxed) {
        match listener.accept_timeout(POLL) {
            Ok(conn) => {
                let id = sh.next_conn.fetch_add(1, Ordering::Relaxed);
                let sh2 = Arc::clone(sh);
                match std::thread::Builder::new().name("zcs-provider-conn".into()).spawn(move || serve(&sh2, id, conn))
                {
                    Ok(t) => conns.push(t),
                    Err(e) => {
                        tracing::error!(error = %crate::error::Chain(&e), "provider: cannot start a connection thread")
                    }
                }
            }
            Err(AcceptError::Timeout(_)) => {}
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "provider: accept failed; backing off");
                std::thread::sleep(POLL);
            }
        }
        sh.state().counters.refused_connections = listener.stats().refused;
        conns.retain(|t| !t.is_finished());
    }
    for t in conns {
        let _ = t.join();
    }
}

fn send(conn: &ControlConn, reply: &ProviderReply, fds: &[BorrowedFd<'_>]) -> bool {
    conn.send(&protocol::encode(reply), fds).is_ok()
}

/// Serves one connection until it ends, then settles what it held.
fn serve(sh: &Arc<Shared>, id: u64, conn: ControlConn) {
    let cred = conn.peer_cred();
    let hello = loop {
        if sh.stop.load(Ordering::Relaxed) {
            return;
        }
        match conn.recv(POLL) {
            Ok(f) => break protocol::decode::<ProviderRequest>("provider request", &f.bytes),
            Err(RecvError::Timeout(_)) => continue,
            Err(_) => return,
        }
    };
    let Ok(ProviderRequest::Hello { client, program }) = hello else {
        sh.state().counters.bad_requests += 1;
        return tracing::debug!(pid = cred.pid, "provider: connection without Hello dropped");
    };
    let devices = sh.pools.keys().cloned().collect();
    if !send(&conn, &ProviderReply::Welcome { provider: sh.provider.id, devices }, &[]) {
        return;
    }
    sh.state().clients.insert(
        id,
        Client {
            client,
            program,
            pid: cred.pid,
            uid: cred.uid,
            since_ms: now_ms(),
            borrowed: 0,
            opened: 0,
            report: None,
        },
    );
    tracing::debug!(pid = cred.pid, client = format_args!("{client:016x}"), "provider: client connected");
    while !sh.stop.load(Ordering::Relaxed) {
        let frame = match conn.recv(POLL) {
            Ok(f) => f,
            Err(RecvError::Timeout(_)) => continue,
            Err(_) => break,
        };
        match protocol::decode::<ProviderRequest>("provider request", &frame.bytes) {
            Ok(ProviderRequest::Borrow { tag, device, size }) => {
                if !borrow(sh, id, &conn, tag, &device, size) {
                    break;
                }
            }
            Ok(ProviderRequest::Open { tag, loan }) => {
                if !open(sh, id, &conn, tag, loan) {
                    break;
                }
            }
            Ok(ProviderRequest::Return { loan }) => give_back(sh, id, loan),
            Ok(ProviderRequest::Close { loans }) => {
                let mut st = sh.state();
                for loan in loans {
                    close(&mut st, id, loan);
                }
            }
            Ok(ProviderRequest::Report(report)) => {
                if let Some(c) = sh.state().clients.get_mut(&id) {
                    c.report = Some((now_ms(), report));
                }
            }
            Ok(ProviderRequest::Hello { .. }) | Err(_) => {
                sh.state().counters.bad_requests += 1;
                tracing::debug!(pid = cred.pid, "provider: malformed request; connection dropped");
                break;
            }
        }
    }
    disconnect(sh, id);
}

fn borrow(sh: &Shared, id: u64, conn: &ControlConn, tag: u64, device: &str, size: u64) -> bool {
    let refuse = |reason: String, permanent: bool| {
        sh.state().counters.borrow_refused += 1;
        send(conn, &ProviderReply::Refused { tag, reason, permanent }, &[])
    };
    let Some(pool) = sh.pools.get(device) else {
        return refuse(format!("this provider does not lend {device} blocks"), true);
    };
    let Ok(size) = usize::try_from(size) else { return refuse("size out of range".into(), true) };
    // May wait for a block to come back: outside the state lock.
    let block = match pool.lend(size) {
        Ok(b) => b,
        Err(e) => return refuse(crate::error::chain(&e), false),
    };
    let loan = loop {
        let l = rand::random::<u64>();
        if l != 0 && !sh.state().loans.contains_key(&l) {
            break l;
        }
    };
    // Recorded before the FD leaves: the borrower may name the loan in a descriptor at
    // once, and its subscriber open it here on another connection. The FD is sent from a
    // duplicate, without the state lock.
    let fd = block.fd().try_clone_to_owned();
    let size = block.size() as u64;
    {
        let mut st = sh.state();
        st.loans.insert(
            loan,
            LoanEntry { device: device.to_owned(), borrower: id, importers: HashSet::new(), orphaned: false, block },
        );
        st.counters.lent += 1;
        if let Some(c) = st.clients.get_mut(&id) {
            c.borrowed += 1;
        }
    }
    match fd {
        Ok(fd) => {
            use std::os::fd::AsFd;
            send(conn, &ProviderReply::Lent { tag, loan, size }, &[fd.as_fd()])
        }
        Err(e) => {
            sh.state().loans.remove(&loan);
            send(conn, &ProviderReply::Refused { tag, reason: format!("dup: {e}"), permanent: false }, &[])
        }
    }
}

fn open(sh: &Shared, id: u64, conn: &ControlConn, tag: u64, loan: u64) -> bool {
    let opened = {
        let mut st = sh.state();
        let opened = st.loans.get_mut(&loan).map(|e| {
            // Counted as mapping it from here on, so the block cannot be reclaimed while
            // its FD is on the way (this connection's end closes it).
            e.importers.insert(id);
            (e.block.size() as u64, e.block.fd().try_clone_to_owned())
        });
        match opened {
            Some(_) => {
                st.counters.opened += 1;
                if let Some(c) = st.clients.get_mut(&id) {
                    c.opened += 1;
                }
            }
            None => st.counters.open_refused += 1,
        }
        opened
    };
    // Sent without the state lock: a client that does not read cannot stall the others.
    match opened {
        Some((size, Ok(fd))) => {
            use std::os::fd::AsFd;
            send(conn, &ProviderReply::Opened { tag, size }, &[fd.as_fd()])
        }
        Some((_, Err(e))) => {
            close(&mut sh.state(), id, loan);
            send(conn, &ProviderReply::Refused { tag, reason: format!("dup: {e}"), permanent: false }, &[])
        }
        None => {
            let reason = "no such loan (given back or reclaimed)".into();
            send(conn, &ProviderReply::Refused { tag, reason, permanent: true }, &[])
        }
    }
}

fn give_back(sh: &Shared, id: u64, loan: u64) {
    let mut st = sh.state();
    match st.loans.get(&loan) {
        Some(e) if e.borrower == id && !e.orphaned => {
            // The borrower's pool holds no lease on it: whoever still maps it from an
            // earlier message reads nothing through it any more.
            st.loans.remove(&loan);
            st.counters.returned += 1;
        }
        _ => {
            st.counters.bad_requests += 1;
            tracing::debug!(loan, "provider: Return of a loan this client does not hold ignored");
        }
    }
}

fn close(st: &mut State, id: u64, loan: u64) {
    let Some(e) = st.loans.get_mut(&loan) else { return };
    e.importers.remove(&id);
    if e.orphaned && e.importers.is_empty() {
        st.loans.remove(&loan);
        st.counters.reclaimed += 1;
    }
}

/// A connection ended: what it borrowed is orphaned (reclaimed at once if nobody maps
/// it), what it mapped is closed.
fn disconnect(sh: &Shared, id: u64) {
    let mut st = sh.state();
    st.clients.remove(&id);
    let mut orphaned = 0;
    let mut reclaimed = 0;
    st.loans.retain(|_, e| {
        e.importers.remove(&id);
        if e.borrower == id && !e.orphaned {
            e.orphaned = true;
            orphaned += 1;
        }
        let keep = !(e.orphaned && e.importers.is_empty());
        reclaimed += u64::from(!keep);
        keep
    });
    st.counters.orphaned += orphaned;
    st.counters.reclaimed += reclaimed;
    if orphaned > 0 {
        tracing::info!(orphaned, reclaimed, "provider: a borrower left; its blocks return once nobody maps them");
    }
}
