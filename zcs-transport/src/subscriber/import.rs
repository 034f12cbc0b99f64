//! Blocks routed to a subscriber: descriptors verified, each block imported on first
//! sight (its FD sent with the descriptor, asked of the publisher, or opened at the
//! host provider) and cached, the sample delivered in its turn.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::delivery::{Body, Copied, ZeroCopy};
use super::order::deliver_routed;
use super::{Link, PeerCopy, Shared, SubMedium, inc};
use crate::cuda::{CudaError, ImportedBlock};
use crate::host::HostBlock;
use crate::ipc::{Frame, RecvError, SendError};
use crate::medium::{Imported, Mapped, Opened};
use crate::pool::BlockKey;
use crate::protocol::{self, Descriptor, Reply, Request};
use crate::sample::{Path, SampleInfo};
use crate::sync::Unpoisoned;

/// Why a routed block could not be imported (the message is lost for this subscriber,
/// and counted in `import_failures`).
#[derive(Debug, thiserror::Error)]
enum ImportError {
    /// Asking the publisher for the block's FD failed.
    #[error("cannot ask the publisher for the block's FD")]
    Send(#[source] SendError),
    /// The publisher's answer did not come.
    #[error("no FD from the publisher")]
    Recv(#[source] RecvError),
    /// The publisher refused the FD.
    #[error("the publisher denied the block's FD: {0}")]
    Denied(String),
    /// The publisher or the descriptor broke the protocol.
    #[error("{0}")]
    Protocol(String),
    /// The host provider that lends the block would not open it.
    #[error("the host provider cannot open the block")]
    Provider(#[source] crate::provider::ClientError),
    /// Mapping the block on the GPU failed.
    #[error("cannot map the block on the GPU")]
    Cuda(#[source] CudaError),
    /// Mapping the host block failed.
    #[error("cannot map the host block")]
    Host(#[source] std::io::Error),
}

/// How long an FD request waits for its answer.
const FD_REPLY_WAIT: Duration = Duration::from_secs(5);

/// The blocks imported from one publisher, by id, with the allocation serial each was
/// imported for. A new serial for an id means the publisher trimmed the old block: the
/// entry is replaced, which unmaps the old import once no sample reads it any more.
#[derive(Default)]
pub(super) struct ImportCache(Mutex<HashMap<u32, (u64, Imported)>>);

impl ImportCache {
    /// The import of `key`'s allocation, if cached and of `size` bytes.
    fn get(&self, key: BlockKey, size: u64) -> Option<Imported> {
        match self.0.locked().get(&key.id) {
            Some((alloc, i)) if *alloc == key.alloc && i.size() as u64 == size => Some(i.clone()),
            _ => None,
        }
    }

    fn insert(&self, key: BlockKey, imported: Imported) {
        self.0.locked().insert(key.id, (key.alloc, imported));
    }

    /// Evicts every import; mappings still read by samples stay alive through them.
    pub(super) fn clear(&self) {
        self.0.locked().clear();
    }
}

impl Link {
    /// Asks for a block's FD. Routed frames that arrive before the answer are kept in
    /// `backlog`, in order, for the link thread.
    fn request_fd(
        &self,
        backlog: &mut VecDeque<Frame>,
        key: BlockKey,
        capability: u64,
    ) -> Result<(OwnedFd, usize), ImportError> {
        let conn = &self.conn;
        conn.send(&protocol::encode(&Request::Fd { block: key, capability }), &[]).map_err(ImportError::Send)?;
        let deadline = Instant::now() + FD_REPLY_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut frame = conn.recv(left).map_err(ImportError::Recv)?;
            match protocol::decode::<Reply>("control reply", &frame.bytes) {
                Ok(Reply::Fd { block, size }) if block == key && frame.fds.len() == 1 => {
                    let size = usize::try_from(size).map_err(|_| too_big(size))?;
                    return Ok((frame.fds.pop().expect("one fd"), size));
                }
                Ok(Reply::FdDenied { reason, .. }) => return Err(ImportError::Denied(reason)),
                Ok(Reply::Fd { .. }) => {
                    return Err(ImportError::Protocol("an FD reply for another block, or without its FD".into()));
                }
                // Routed frames (and anything malformed, reported in turn) wait.
                _ => backlog.push_back(frame),
            }
        }
    }
}

/// A block routed to us: verify, import on first sight, deliver in its turn.
pub fn on_block(sh: &Arc<Shared>, link: &Arc<Link>, backlog: &mut VecDeque<Frame>, d: Descriptor, fd: Option<OwnedFd>) {
    let bad = |what: &str, detail: &dyn std::fmt::Display| {
        inc(&sh.counters.bad_descriptors);
        sh.bad_input.warn(what, detail);
    };
    if d.publisher != link.publisher || link.cap_key.capability(d.block) != d.capability {
        link.release(d.block);
        return bad("descriptor with a wrong publisher or capability dropped", &format_args!("block {:?}", d.block));
    }
    let end = d.offset.checked_add(d.len);
    if end.is_none_or(|e| e > d.block_size) {
        link.release(d.block);
        return bad("descriptor out of its block's bounds", &format_args!("{}+{} > {}", d.offset, d.len, d.block_size));
    }
    let imported = match link.imports.get(d.block, d.block_size) {
        Some(i) => i,
        None => match import(sh, link, backlog, &d, fd) {
            Ok(i) => {
                crate::step!(seq = d.seq, block = d.block.id, "subscriber: block imported");
                link.imports.insert(d.block, i.clone());
                inc(&sh.counters.imports);
                i
            }
            Err(e) => {
                inc(&sh.counters.import_failures);
                sh.dedup.give_up(link.publisher, d.seq);
                link.release(d.block);
                let error = crate::error::chain(&e);
                tracing::error!(error, block = ?d.block, "cannot import a block: message lost for this subscriber");
                return;
            }
        },
    };
    link.signals.awaiting(d.block);
    let mut info = SampleInfo {
        key: link.key.clone(),
        publisher: d.publisher,
        seq: d.seq,
        timestamp_ns: d.timestamp_ns,
        path: match (link.peer, link.host_blocks) {
            (true, _) => Path::ZeroCopyPeer,
            (_, true) => Path::HostBlock,
            _ => Path::ZeroCopy,
        },
        meta: d.meta,
    };
    let (offset, len) = (d.offset as usize, d.len as usize);
    if link.peer
        && let Some(copied) = copy_on_arrival(sh, link, &imported, d.block, offset, len)
    {
        info.path = Path::PeerCopy;
        let sample = sh.sample(info, Body::Copied(copied));
        return deliver_routed(sh, link, sample, &sh.counters.peer_copy);
    }
    if link.host_blocks && matches!(sh.medium, SubMedium::Cuda(_)) {
        let Some(copied) = copy_from_host(sh, link, &imported, d.block, offset, len) else {
            // Counted and logged: the message is lost for this subscriber.
            inc(&sh.counters.import_failures);
            sh.dedup.give_up(link.publisher, d.seq);
            return;
        };
        info.path = Path::HostCopy;
        let sample = sh.sample(info, Body::Copied(copied));
        return deliver_routed(sh, link, sample, &sh.counters.host_block);
    }
    // A duplicate is dropped at once, which releases its lease.
    let counter = if link.host_blocks { &sh.counters.host_block } else { &sh.counters.zero_copy };
    let zc = ZeroCopy::new(imported, d.block, offset, len, Arc::clone(link), Arc::clone(&sh.releases));
    let sample = sh.sample(info, Body::ZeroCopy(zc));
    deliver_routed(sh, link, sample, counter);
}

/// `peer_gpus: copy`: enqueues the copy of a peer GPU's block onto ours and the release
/// of its lease once the copy completes. `None` where this subscriber reads in place, or
/// where the copy could not be made (the sample is then read in place, and says so).
fn copy_on_arrival(
    sh: &Arc<Shared>,
    link: &Arc<Link>,
    imported: &Imported,
    key: BlockKey,
    offset: usize,
    len: usize,
) -> Option<Copied> {
    let copier = sh.copies_from_peers().then(|| sh.releases.copier_if_made()).flatten();
    let (Some(copier), Imported::Cuda(block), Some(signals)) = (copier, imported, link.signals.block()) else {
        return None;
    };
    // SAFETY: `offset + len` lies within the block (checked above), mapped for this GPU
    // by `imported`, which the lease's release below keeps until the copy is done.
    match unsafe { copier.copy(signals, key, block.device_ptr() + offset as u64, len) } {
        Ok(copy) => Some(copied(sh, link, imported, key, len, copy)),
        Err(e) => {
            sh.bad_input.warn("cannot copy a message onto this GPU; reading it in place", &crate::error::chain(&e));
            None
        }
    }
}

/// A host block's message copied onto this GPU (a CUDA subscriber served host blocks):
/// the copy enqueued on the copier's stream, and the lease released once it completes.
/// `None` if it could not be made (the lease is released at once).
fn copy_from_host(
    sh: &Arc<Shared>,
    link: &Arc<Link>,
    imported: &Imported,
    key: BlockKey,
    offset: usize,
    len: usize,
) -> Option<Copied> {
    let (Some(copier), Imported::Host(block)) = (sh.releases.copier_if_made(), imported) else {
        link.release(key);
        tracing::error!("a host block for a subscriber without a copier: message lost");
        return None;
    };
    // SAFETY: `offset + len` lies within the block (checked above); the block was
    // filled before its descriptor was sent and nobody writes it while we hold the lease.
    let whole = unsafe { std::slice::from_raw_parts(block.as_ptr(), block.size()) };
    let src = &whole[offset..offset + len];
    // SAFETY: `imported`, held by the lease's release below until the copy completes,
    // keeps `src` mapped.
    match unsafe { copier.copy_from_host(src) } {
        Ok(copy) => Some(copied(sh, link, imported, key, len, copy)),
        Err(e) => {
            link.release(key);
            let error = crate::error::chain(&e);
            tracing::error!(error, "cannot copy a host block onto this GPU: message lost for this subscriber");
            None
        }
    }
}

/// A copy enqueued from `imported` (block `key`): the sample's body, and the lease's
/// release once the copy completes (the mapping kept until then).
fn copied(
    sh: &Arc<Shared>,
    link: &Arc<Link>,
    imported: &Imported,
    key: BlockKey,
    len: usize,
    copy: PeerCopy,
) -> Copied {
    let done: Box<dyn crate::pool::Fence> = Box::new(Arc::clone(&copy.done));
    sh.releases.release_after(Arc::clone(link), key, imported.clone(), vec![done]);
    Copied::new(copy, len, Arc::clone(link), key, Arc::clone(&sh.releases))
}

fn import(
    sh: &Shared,
    link: &Link,
    backlog: &mut VecDeque<Frame>,
    d: &Descriptor,
    sent: Option<OwnedFd>,
) -> Result<Imported, ImportError> {
    // A lent block is opened at the provider, which from then on counts us as mapping
    // it (until `Opened` drops with the mapping); an owned one came with the descriptor
    // (sized by it: the import maps exactly that many bytes and fails on a smaller
    // allocation) or is asked of the publisher.
    let (fd, size, opened) = match (d.lent, &link.provider) {
        (Some(loan), Some(client)) => {
            let (fd, size) = client.open(loan).map_err(ImportError::Provider)?;
            (fd, size, Some(Opened { client: Arc::clone(client), loan }))
        }
        (Some(_), None) => {
            return Err(ImportError::Protocol("a lent block from a publisher that named no provider".into()));
        }
        (None, _) => match sent {
            Some(fd) => (fd, usize::try_from(d.block_size).map_err(|_| too_big(d.block_size))?, None),
            None => {
                let (fd, size) = link.request_fd(backlog, d.block, d.capability)?;
                (fd, size, None)
            }
        },
    };
    if size as u64 != d.block_size {
        return Err(ImportError::Protocol(format!("an FD of {size} bytes for a {}-byte block", d.block_size)));
    }
    match &sh.medium {
        // Host blocks for a CUDA subscriber: page-locked, to copy onto its GPU.
        SubMedium::Cuda(gpu) if link.host_blocks => HostBlock::import(fd, size)
            .map(|b| Imported::Host(Arc::new(Mapped::pinned(b, gpu))))
            .map_err(ImportError::Host),
        SubMedium::Cuda(gpu) => ImportedBlock::import(gpu, fd, size)
            .map(|b| Imported::Cuda(Arc::new(Mapped::new(b, opened))))
            .map_err(ImportError::Cuda),
        SubMedium::Host => HostBlock::import(fd, size)
            .map(|b| Imported::Host(Arc::new(Mapped::new(b, opened))))
            .map_err(ImportError::Host),
    }
}

fn too_big(size: u64) -> ImportError {
    ImportError::Protocol(format!("a block of {size} bytes does not fit this process"))
}
