//! The crash matrix, one body per cell on host memfd blocks (CI) and on CUDA VMM blocks
//! (the GPU machine, where device memory is also checked back at the baseline after
//! every kill): real processes, real Zenoh on loopback TCP; the machinery and what is
//! checked after every kill are described in `support/crash.rs`. `ZCS_CRASH_ITERS` sets
//! the kills per cell (default 200), `ZCS_CRASH_SEED` replays the kill moments of a run
//! (each run prints its seed). Without a usable GPU each CUDA test prints
//! `SKIPPED <name>: <reason>` (a failure under `ZCS_REQUIRE_GPU=1`).

#[path = "support/crash.rs"]
mod crash;

use zcs_tests::MediumKind;

zcs_tests::medium_tests! {
    /// A subscriber process dies at random moments; this process publishes.
    crash::subscriber_killed => crash_matrix_subscriber_killed, gpu_crash_matrix_subscriber_killed;
    /// A publisher process dies at random moments; this process subscribes.
    crash::publisher_killed => crash_matrix_publisher_killed, gpu_crash_matrix_publisher_killed;
    /// The Zenoh router between this process's publisher and subscriber dies at random
    /// moments.
    crash::relay_killed => crash_matrix_relay_killed, gpu_crash_matrix_relay_killed;
}

/// The subscriber cell on two GPUs: the victims run on GPU 1 and map the publisher's
/// blocks on GPU 0 (`zero-copy-peer`); device memory is checked on both GPUs after every
/// kill. Needs two GPUs with peer access.
#[test]
fn gpu_crash_matrix_peer_subscriber_killed() {
    const TEST: &str = "gpu_crash_matrix_peer_subscriber_killed";
    if zcs_tests::two_gpus_or_skip(TEST).is_some() {
        crash::subscriber_killed_on(MediumKind::Cuda, TEST, 1);
    }
}

/// The publisher cell on two GPUs: the victims publish from GPU 1 and this process's
/// subscriber on GPU 0 maps their blocks (`zero-copy-peer`); device memory is checked on
/// both GPUs after every kill. Needs two GPUs with peer access.
#[test]
fn gpu_crash_matrix_peer_publisher_killed() {
    const TEST: &str = "gpu_crash_matrix_peer_publisher_killed";
    if zcs_tests::two_gpus_or_skip(TEST).is_some() {
        crash::publisher_killed_on(MediumKind::Cuda, TEST, 1);
    }
}

/// Entry point of the re-executed test binary (the victims); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by the crash_matrix_* and gpu_crash_matrix_* tests"]
fn child_entry() {
    crash::child_entry();
}
