//! Blocks lent by a host provider on the GPU path (CUDA VMM blocks allocated in the
//! provider's process); the scenario is described in `support/provider.rs`. Without a
//! usable GPU the test prints `SKIPPED <name>: <reason>` (a failure under
//! `ZCS_REQUIRE_GPU=1`).

#[path = "support/provider.rs"]
mod provider;

/// A publisher that borrows device blocks from the provider is SIGKILLed mid-stream
/// while two subscribers hold its blocks; filled by the fill kernel, contents checked on the GPU's bytes.
#[test]
fn gpu_provider_publisher_killed_two_readers() {
    provider::publisher_killed::<zcs_tests::Cuda>("gpu_provider_publisher_killed_two_readers");
}

/// Entry point of the re-executed test binary (the publisher); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by gpu_provider_publisher_killed_two_readers"]
fn child_entry() {
    provider::child_entry();
}
