//! Pub/sub between processes, one body on host memory (CI) and on CUDA VMM blocks (the
//! GPU machine): the public API (`GpuSession`, publishers, subscribers) over Zenoh on
//! loopback TCP, where every publisher and subscriber is its own process (on CUDA with
//! its own context) and this process only orchestrates. Every byte of every message is
//! checked (on the GPU by the check kernel). The bodies, and what they check, are in
//! `support/fanout.rs`; host runs use fewer and smaller messages.
//!
//! Without a usable GPU each CUDA test prints `SKIPPED <name>: <reason>` and passes; with
//! `ZCS_REQUIRE_GPU=1` it fails instead.

#[path = "support/fanout.rs"]
mod fanout;

use zcs_tests::loopback_zenoh_config;
use zenoh::Wait;

zcs_tests::medium_tests! {
    fanout::one_to_one => pubsub_1_to_1_zero_copy, gpu_pubsub_1_to_1_zero_copy;
    fanout::one_to_three => pubsub_1_to_3, gpu_pubsub_1_to_3;
    fanout::three_to_one => pubsub_3_to_1, gpu_pubsub_3_to_1;
    fanout::mixed_aware_and_plain_subscribers => pubsub_mixed_gpu_and_plain_subscribers_one_copy_per_message,
        gpu_pubsub_mixed_gpu_and_plain_subscribers_one_copy_per_message;
    fanout::relay_chain_of_three => pubsub_relay_chain_of_three, gpu_pubsub_relay_chain_of_three;
    fanout::subscriber_killed_holding_blocks_returns_them => pubsub_subscriber_killed_holding_blocks_returns_them,
        gpu_pubsub_subscriber_killed_holding_blocks_returns_them;
    fanout::publisher_killed_subscriber_reads_held_samples => pubsub_publisher_killed_subscriber_reads_held_samples,
        gpu_pubsub_publisher_killed_subscriber_reads_held_samples;
}

/// GPU only: on host memory, 10,000 messages of 1–64 MiB checked on the CPU would take
/// minutes of CI's two cores.
#[test]
fn gpu_pubsub_volume_10k_messages_1_to_64_mib() {
    fanout::volume_10k_messages_1_to_64_mib("gpu_pubsub_volume_10k_messages_1_to_64_mib");
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
#[ignore = "child-process entry, run by the pubsub_* and gpu_pubsub_* tests"]
fn fanout_child() {
    fanout::child_entry();
}
