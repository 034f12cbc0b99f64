//! Our counts on the CUDA buffer backend's blocks go back when the process holding them
//! dies: a child holds counts and is killed, and a reaper gives exactly those back; a
//! block file replaced since is left alone; a live process's journal is never touched.
//! Host only: the counts live in `/dev/shm`, no GPU involved.

use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zcs_wire::rosidl_cuda::{BlockMeta, reap_dead_holders};

const CHILD_ENV: &str = "ZCS_HOLDS_CHILD";
/// One test at a time: each one's reaper would otherwise reap the others' children.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
const UID: u64 = 0x5eed;

/// A block number of this test process (its files are `/dev/shm/cuda_vmm_<our pid>_<n>`).
fn block_number(tag: u32) -> u32 {
    900_000 + (std::process::id() % 10_000) * 10 + tag
}

struct BlockFile(std::path::PathBuf);

impl BlockFile {
    fn create(block: u32) -> (Self, BlockMeta) {
        let path = BlockMeta::path_of(std::process::id() as i32, block);
        let _ = std::fs::remove_file(&path);
        let meta = BlockMeta::create_at(&path).unwrap();
        meta.publish(UID, 1);
        (Self(path), meta)
    }
}

impl Drop for BlockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A child that holds `n` counts on `block` of this process, then waits to be killed.
fn spawn_holder(block: u32, n: u32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "holder_entry", "--nocapture", "--include-ignored", "--test-threads=1"])
        .env(CHILD_ENV, format!("{}:{block}:{n}", std::process::id()))
        .spawn()
        .unwrap()
}

fn kill(mut child: Child) -> u32 {
    let pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    pid
}

fn journal_of(pid: u32) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/dev/shm/zcs_rosidl_holds_{pid}"))
}

#[test]
fn a_killed_holders_counts_go_back_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let block = block_number(1);
    let (_file, meta) = BlockFile::create(block);
    let child = spawn_holder(block, 3);
    wait_until("the child's three counts", || meta.count() == 3);
    let pid = kill(child);
    assert_eq!(meta.count(), 3, "upstream's protocol leaves a dead subscriber's counts up");
    assert!(journal_of(pid).exists());

    let reaped = reap_dead_holders();
    assert!(reaped.counts >= 3 && reaped.journals >= 1, "{reaped:?}");
    assert_eq!(meta.count(), 0, "exactly the dead child's counts went back");
    assert!(!journal_of(pid).exists());
    reap_dead_holders();
    assert_eq!(meta.count(), 0, "a second reaper gives nothing back twice");
}

#[test]
fn a_replaced_block_file_is_left_alone() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let block = block_number(2);
    let (file, meta) = BlockFile::create(block);
    let child = spawn_holder(block, 1);
    wait_until("the child's count", || meta.count() == 1);
    let pid = kill(child);
    // A new publisher with the same pid recreates the file: other readers hold it now.
    drop(meta);
    std::fs::remove_file(&file.0).unwrap();
    let fresh = BlockMeta::create_at(&file.0).unwrap();
    fresh.publish(UID, 2);
    let other = Arc::new(BlockMeta::open_at(&file.0).unwrap());
    let held: Vec<_> = (0..2).map(|_| other.hold(UID).unwrap()).collect();
    reap_dead_holders();
    assert!(!journal_of(pid).exists(), "the dead child's journal is removed");
    assert_eq!(fresh.count(), 2, "counts on the new file are not the dead child's");
    drop(held);
    assert_eq!(fresh.count(), 0);
}

#[test]
fn a_live_processs_holds_are_left_alone_and_journaled() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let block = block_number(3);
    let (_file, meta) = BlockFile::create(block);
    let ours = Arc::new(BlockMeta::open(std::process::id() as i32, block).unwrap());
    assert!(ours.file().is_some());
    let hold = ours.hold(UID).unwrap();
    assert!(journal_of(std::process::id()).exists(), "our journal exists while we hold");
    reap_dead_holders();
    assert_eq!(meta.count(), 1, "our own hold stays");
    drop(hold);
    assert_eq!(meta.count(), 0);
    // A stale id is refused and leaves no count, journaled or not.
    assert!(ours.hold(UID ^ 1).is_err());
    assert_eq!(meta.count(), 0);
}

/// The child: holds its counts and waits to be killed.
#[test]
#[ignore = "child-process entry, run by the tests above"]
fn holder_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let mut it = spec.split(':').map(|x| x.parse::<u64>().unwrap());
    let (pid, block, n) = (it.next().unwrap() as i32, it.next().unwrap() as u32, it.next().unwrap());
    let meta = Arc::new(BlockMeta::open(pid, block).unwrap());
    let holds: Vec<_> = (0..n).map(|_| meta.hold(UID).unwrap()).collect();
    std::thread::sleep(Duration::from_secs(30)); // killed long before
    drop(holds);
}
