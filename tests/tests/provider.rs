//! Blocks lent by a host provider on the CPU path (host memfd blocks, real processes,
//! real Zenoh on loopback TCP); the scenario is described in `support/provider.rs`.
//! The GPU version is `gpu_provider.rs`.

#[path = "support/provider.rs"]
mod provider;

/// A publisher that borrows from the provider is SIGKILLed mid-stream while two
/// subscribers hold its blocks.
#[test]
fn provider_publisher_killed_two_readers() {
    provider::publisher_killed(provider::Mode::Host, None, "provider_publisher_killed_two_readers");
}

/// Entry point of the re-executed test binary (the publisher); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by provider_publisher_killed_two_readers"]
fn child_entry() {
    provider::child_entry();
}
