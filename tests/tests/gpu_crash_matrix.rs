//! Crash matrix on the GPU path (CUDA VMM blocks): the same cells as
//! `crash_matrix.rs`, described in `support/crash.rs`, plus device memory
//! (`cuMemGetInfo`) back to the baseline after every kill. Without a usable GPU each
//! test prints `SKIPPED <name>: <reason>` (a failure under `ZCS_REQUIRE_GPU=1`).
//! `ZCS_CRASH_ITERS` sets the kills per cell (default 200).

#[path = "support/crash.rs"]
mod crash;

use zcs_tests::{Cuda, MediumKind};

#[test]
fn gpu_crash_matrix_subscriber_killed() {
    crash::subscriber_killed::<Cuda>("gpu_crash_matrix_subscriber_killed");
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

#[test]
fn gpu_crash_matrix_publisher_killed() {
    crash::publisher_killed::<Cuda>("gpu_crash_matrix_publisher_killed");
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

#[test]
fn gpu_crash_matrix_relay_killed() {
    crash::relay_killed::<Cuda>("gpu_crash_matrix_relay_killed");
}

/// Entry point of the re-executed test binary (the victims); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by the gpu_crash_matrix_* tests"]
fn child_entry() {
    crash::child_entry();
}
