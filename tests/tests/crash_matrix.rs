//! Crash matrix on the CPU path (host memfd blocks, real processes, real Zenoh on
//! loopback TCP): the machinery and what is checked after every kill are described in
//! `support/crash.rs`. `ZCS_CRASH_ITERS` sets the kills per cell (default 200),
//! `ZCS_CRASH_SEED` replays the kill moments of a run (each run prints its seed).
//! The GPU version is `gpu_crash_matrix.rs`.

#[path = "support/crash.rs"]
mod crash;

use zcs_tests::Host;

/// A subscriber process dies at random moments; this process publishes.
#[test]
fn crash_matrix_subscriber_killed() {
    crash::subscriber_killed::<Host>("crash_matrix_subscriber_killed");
}

/// A publisher process dies at random moments; this process subscribes.
#[test]
fn crash_matrix_publisher_killed() {
    crash::publisher_killed::<Host>("crash_matrix_publisher_killed");
}

/// The Zenoh router between this process's publisher and subscriber dies at random
/// moments.
#[test]
fn crash_matrix_relay_killed() {
    crash::relay_killed::<Host>("crash_matrix_relay_killed");
}

/// Entry point of the re-executed test binary (the victims); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by the crash_matrix_* tests"]
fn child_entry() {
    crash::child_entry();
}
