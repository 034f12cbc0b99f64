//! GPU pub/sub suite: the public API (`GpuSession`, publishers, subscribers) between
//! real processes over Zenoh on loopback TCP, on CUDA VMM blocks. Every publisher and
//! subscriber is its own process with its own CUDA context; every byte of every message
//! is checked by the check kernel. The bodies, and what they check, are in
//! `support/fanout.rs`; `pubsub.rs` runs the same bodies on host memory in CI.
//!
//! Without a usable GPU each test prints `SKIPPED <name>: <reason>` and passes; with
//! `ZCS_REQUIRE_GPU=1` it fails instead.

#[path = "support/fanout.rs"]
mod fanout;

use zcs_tests::{Cuda, loopback_zenoh_config};
use zenoh::Wait;

#[test]
fn gpu_pubsub_1_to_1_zero_copy() {
    fanout::one_to_one::<Cuda>("gpu_pubsub_1_to_1_zero_copy");
}

#[test]
fn gpu_pubsub_1_to_3() {
    fanout::one_to_three::<Cuda>("gpu_pubsub_1_to_3");
}

#[test]
fn gpu_pubsub_3_to_1() {
    fanout::three_to_one::<Cuda>("gpu_pubsub_3_to_1");
}

#[test]
fn gpu_pubsub_mixed_gpu_and_plain_subscribers_one_copy_per_message() {
    fanout::mixed_aware_and_plain_subscribers::<Cuda>(
        "gpu_pubsub_mixed_gpu_and_plain_subscribers_one_copy_per_message",
    );
}

#[test]
fn gpu_pubsub_relay_chain_of_three() {
    fanout::relay_chain_of_three::<Cuda>("gpu_pubsub_relay_chain_of_three");
}

/// GPU only: on host memory, 10,000 messages of 1–64 MiB checked on the CPU would take
/// minutes of CI's two cores; `pubsub.rs` runs the other bodies on host memory.
#[test]
fn gpu_pubsub_volume_10k_messages_1_to_64_mib() {
    fanout::volume_10k_messages_1_to_64_mib("gpu_pubsub_volume_10k_messages_1_to_64_mib");
}

#[test]
fn gpu_pubsub_subscriber_killed_holding_blocks_returns_them() {
    fanout::subscriber_killed_holding_blocks_returns_them::<Cuda>(
        "gpu_pubsub_subscriber_killed_holding_blocks_returns_them",
    );
}

#[test]
fn gpu_pubsub_publisher_killed_subscriber_reads_held_samples() {
    fanout::publisher_killed_subscriber_reads_held_samples::<Cuda>(
        "gpu_pubsub_publisher_killed_subscriber_reads_held_samples",
    );
}

/// The suite relies on congestion control `Block` for the test keys and the library's
/// `@zcs` channels below them (see `loopback_zenoh_config`); no GPU needed.
#[test]
fn loopback_config_blocks_test_keys_and_zcs_channels() {
    let prefix = fanout::PREFIX;
    let z = zenoh::open(loopback_zenoh_config(None, None, Some(prefix))).wait().expect("open zenoh");
    for key in [format!("{prefix}/a"), format!("{prefix}/a/b/@zcs/b")] {
        let p = z.declare_publisher(key.clone()).wait().expect("declare");
        assert_eq!(p.congestion_control(), zenoh::qos::CongestionControl::Block, "{key}");
    }
    let p = z.declare_publisher("elsewhere/a").wait().expect("declare");
    assert_eq!(p.congestion_control(), zenoh::qos::CongestionControl::Drop, "Zenoh's default elsewhere");
}

/// Entry point of the child processes (publishers, subscribers, relays); a no-op in a
/// normal run.
#[test]
#[ignore = "child-process entry, run by the gpu_pubsub_* tests"]
fn fanout_child() {
    fanout::child_entry();
}
