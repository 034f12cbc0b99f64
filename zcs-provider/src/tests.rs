//! The provider on host memory, in one process: lending, opening, giving back, orphans
//! and reclaim, refusals and hostile input. Multi-process and GPU behaviour is tested in
//! `tests/tests/provider.rs` and `tests/tests/gpu_provider.rs`.

use std::time::{Duration, Instant};

use zenoh::Wait;

use super::*;
use crate::host::HostBlock;
use crate::ipc::{ControlConn, SocketName};
use crate::pool::PoolConfig;
use crate::protocol::{self, ProviderReply, ProviderRequest};

const IO: Duration = Duration::from_secs(5);
const MIB2: usize = 2 << 20;

fn session() -> zenoh::Session {
    let mut c = zenoh::Config::default();
    c.insert_json5("mode", "\"peer\"").unwrap();
    c.insert_json5("scouting/multicast/enabled", "false").unwrap();
    c.insert_json5("listen/endpoints", "[]").unwrap();
    zenoh::open(c).wait().unwrap()
}

fn host_provider(session: &zenoh::Session, max_blocks: usize) -> Provider {
    let cfg = ProviderConfig {
        gpus: GpuSelection::None,
        host: true,
        pool: PoolConfig { max_blocks, loan_timeout_ms: 50, ..PoolConfig::default() },
        ..ProviderConfig::default()
    };
    Provider::start(&cfg, session).unwrap()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < IO, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn lends_opens_and_takes_back() {
    let s = session();
    let p = host_provider(&s, 8);
    assert_eq!(p.devices(), vec!["host".to_owned()]);
    let found = ProviderClient::discover(&s, &crate::host::boot_id().unwrap(), Duration::from_secs(2));
    assert_eq!(found.as_ref(), Some(p.provider()), "the provider is found through its token");

    let a = ProviderClient::connect(p.provider(), 1, IO).unwrap();
    let b = ProviderClient::connect(p.provider(), 2, IO).unwrap();
    assert_eq!(a.devices(), ["host"]);
    let lent = a.borrow("host", MIB2, IO).unwrap();
    assert_eq!(lent.size, MIB2);
    let writer = HostBlock::import(lent.fd, lent.size).unwrap();
    // SAFETY: the block is mapped with MIB2 bytes and only this test touches it.
    unsafe { std::ptr::write_bytes(writer.as_ptr(), 0x5a, MIB2) };

    let (fd, size) = b.open(lent.loan).unwrap();
    let reader = HostBlock::import(fd, size).unwrap();
    // SAFETY: mapped with `size` bytes; written above, before the open.
    let seen = unsafe { std::slice::from_raw_parts(reader.as_ptr(), size) };
    assert!(seen.iter().all(|&x| x == 0x5a), "the importer sees the borrower's bytes");

    // A report is kept as the client's latest.
    let report = protocol::ProcessReport {
        publishers: vec![protocol::PublisherReport {
            key: "k".into(),
            instance: 7,
            device: "host".into(),
            subscribers: vec![protocol::PathReport { peer: 8, path: "zero-copy".into(), reason: None }],
            plain_listeners: true,
            messages: 3,
            copies_out: 3,
            copied_bytes: 30,
            lease_limited: 0,
        }],
        subscribers: Vec::new(),
    };
    a.report(report.clone());
    wait_for("the report", || p.snapshot().clients.iter().any(|c| c.report.as_ref() == Some(&report)));

    let snap = p.snapshot();
    assert_eq!((snap.devices[0].loans, snap.devices[0].orphaned), (1, 0));
    assert_eq!(snap.devices[0].pool.bytes_in_use, MIB2 as u64);
    assert_eq!(snap.clients.len(), 2);
    assert_eq!((snap.counters.lent, snap.counters.opened), (1, 1));

    // A living borrower gives the block back: it is free again at once (the borrower's
    // pool held no lease on it any more), whoever still maps it.
    drop(writer);
    a.give_back(lent.loan);
    wait_for("the loan to come back", || p.snapshot().counters.returned == 1);
    assert_eq!(p.snapshot().devices[0].pool.bytes_in_use, 0);
    // The loan is over: opening it again is refused for good.
    match b.open(lent.loan) {
        Err(ClientError::Refused { permanent: true, .. }) => {}
        other => panic!("open of an ended loan: {other:?}"),
    }
    drop(reader);
}

#[test]
fn a_dead_borrowers_blocks_return_only_when_nobody_maps_them() {
    let s = session();
    let p = host_provider(&s, 8);
    let a = ProviderClient::connect(p.provider(), 1, IO).unwrap();
    let b = ProviderClient::connect(p.provider(), 2, IO).unwrap();
    let mapped = a.borrow("host", MIB2, IO).unwrap();
    let unmapped = a.borrow("host", MIB2, IO).unwrap();
    let w = HostBlock::import(mapped.fd, mapped.size).unwrap();
    // SAFETY: mapped with MIB2 bytes; only this test touches it.
    unsafe { std::ptr::write_bytes(w.as_ptr(), 7, MIB2) };
    let (fd, size) = b.open(mapped.loan).unwrap();
    let r = HostBlock::import(fd, size).unwrap();

    // The borrower dies (its connection closes; its mapping too).
    drop((a, w, unmapped));
    wait_for("the borrower's loans to be orphaned", || p.snapshot().counters.orphaned == 2);
    let snap = p.snapshot();
    assert_eq!(snap.counters.reclaimed, 1, "the block nobody mapped is back at once");
    assert_eq!((snap.devices[0].loans, snap.devices[0].orphaned), (0, 1));
    assert_eq!(snap.devices[0].pool.bytes_in_use, MIB2 as u64, "the mapped block is kept");
    // A third process cannot be lent the kept block: the pool has room only for others.
    let c = ProviderClient::connect(p.provider(), 3, IO).unwrap();
    let other = c.borrow("host", MIB2, IO).unwrap();
    assert_ne!(other.loan, mapped.loan);
    // SAFETY: mapped with `size` bytes; its writer is gone, nobody writes it.
    let seen = unsafe { std::slice::from_raw_parts(r.as_ptr(), size) };
    assert!(seen.iter().all(|&x| x == 7), "the reader still reads the dead borrower's bytes");

    drop(r);
    b.close(mapped.loan);
    wait_for("the orphan to be reclaimed", || p.snapshot().counters.reclaimed == 2);
    let snap = p.snapshot();
    assert_eq!(snap.devices[0].orphaned, 0);
    assert_eq!(snap.devices[0].pool.bytes_in_use, MIB2 as u64, "only c's loan is out");
    // An importer that dies counts as closing, too.
    let (fd, size) = b.open(other.loan).unwrap();
    drop((HostBlock::import(fd, size).unwrap(), c, other.fd));
    wait_for("c's loan to be orphaned", || p.snapshot().counters.orphaned == 3);
    assert_eq!(p.snapshot().devices[0].orphaned, 1, "b maps it");
    drop(b);
    wait_for("b's death to release the orphan", || p.snapshot().counters.reclaimed == 3);
    assert_eq!(p.snapshot().devices[0].pool.bytes_in_use, 0);
}

#[test]
fn refusals_are_clear_and_hostile_input_costs_the_connection() {
    let s = session();
    let p = host_provider(&s, 1);
    let a = ProviderClient::connect(p.provider(), 1, IO).unwrap();
    match a.borrow("cuda-00000000000000000000000000000000", MIB2, IO) {
        Err(ClientError::Refused { permanent: true, reason }) => assert!(reason.contains("does not lend"), "{reason}"),
        other => panic!("unknown device: {other:?}"),
    }
    match a.borrow("host", MIB2 + 1, IO) {
        Err(ClientError::Refused { permanent: false, reason }) => {
            assert!(reason.contains("not a block size"), "{reason}")
        }
        other => panic!("odd size: {other:?}"),
    }
    let held = a.borrow("host", MIB2, IO).unwrap();
    match a.borrow("host", MIB2, IO) {
        Err(ClientError::Refused { permanent: false, .. }) => {}
        other => panic!("over the provider's cap: {other:?}"),
    }
    match a.open(0xdead) {
        Err(ClientError::Refused { permanent: true, .. }) => {}
        other => panic!("unknown loan: {other:?}"),
    }
    // Another client cannot give back a loan it does not hold.
    let b = ProviderClient::connect(p.provider(), 2, IO).unwrap();
    b.give_back(held.loan);
    wait_for("the bogus Return to be counted", || p.snapshot().counters.bad_requests == 1);
    assert_eq!(p.snapshot().devices[0].loans, 1);
    assert_eq!(p.snapshot().counters.borrow_refused, 3);

    // Garbage instead of a request: the connection is dropped; no Hello: likewise.
    let name = SocketName::from_key_chunk(&p.provider().socket).unwrap();
    let raw = ControlConn::connect(&name, IO).unwrap();
    raw.send(&protocol::encode(&ProviderRequest::Hello { client: 9, program: "t".into() }), &[]).unwrap();
    let f = raw.recv(IO).unwrap();
    assert!(matches!(protocol::decode::<ProviderReply>("r", &f.bytes), Ok(ProviderReply::Welcome { .. })));
    raw.send(&[protocol::VERSION, 0xff, 0xff], &[]).unwrap();
    assert!(matches!(raw.recv(IO), Err(crate::ipc::RecvError::Closed)));
    let raw = ControlConn::connect(&name, IO).unwrap();
    raw.send(&protocol::encode(&ProviderRequest::Close { loans: vec![held.loan] }), &[]).unwrap();
    assert!(matches!(raw.recv(IO), Err(crate::ipc::RecvError::Closed)));
    wait_for("both to be counted", || p.snapshot().counters.bad_requests == 3);
    // The honest client is unaffected.
    assert_eq!(p.snapshot().devices[0].loans, 1);
    a.give_back(held.loan);
    wait_for("the loan to come back", || p.snapshot().devices[0].pool.bytes_in_use == 0);
}

#[test]
fn nothing_to_lend_is_an_error() {
    let s = session();
    let cfg = ProviderConfig { gpus: GpuSelection::None, host: false, ..ProviderConfig::default() };
    assert!(matches!(Provider::start(&cfg, &s), Err(ProviderError::Empty)));
}

#[test]
fn a_pool_borrows_recycles_and_gives_back_and_never_hands_a_lent_fd_out() {
    use crate::pool::{BlockMemory, HolderId, HostBackend, Lender, Pool, StaleError};
    let s = session();
    let p = host_provider(&s, 8);
    let client = ProviderClient::connect(p.provider(), 1, IO).unwrap();
    let lender: std::sync::Arc<dyn Lender> = std::sync::Arc::new(DeviceLender::new(client, "host".into(), IO));
    let pool = Pool::new(HostBackend::default().with_lender(Some(lender)), PoolConfig::default()).unwrap();
    let loan = pool.loan(MIB2).unwrap();
    let lent = loan.memory().lent().expect("the block is lent by the provider");
    let published = loan.publish();
    published.lease(HolderId::new(5)).unwrap();
    let key = published.key();
    // Its FD is opened at the provider, never handed out by the publisher's pool.
    assert!(matches!(pool.handout(key, published.capability()), Err(StaleError::Lent)));
    drop(published);
    pool.release(key, HolderId::new(5)).unwrap();
    // Recycled locally: the next loan reuses the same lent block, no new borrow.
    let again = pool.loan(MIB2).unwrap();
    assert_eq!(again.memory().lent(), Some(lent));
    assert_eq!(p.snapshot().counters.lent, 1);
    drop(again);
    wait_for("the loan to come back to the pool", || pool.stats().blocks_in_use == 0);
    // Freeing the idle block gives it back to the provider.
    assert_eq!(pool.trim(), 1);
    wait_for("the block to be given back", || p.snapshot().counters.returned == 1);
    assert_eq!(p.snapshot().devices[0].pool.bytes_in_use, 0);
}
