//! Blocks lent by a host provider on the GPU path (CUDA VMM blocks allocated in the
//! provider's process); the scenario is described in `support/provider.rs`. Without a
//! usable GPU the test prints `SKIPPED <name>: <reason>` (a failure under
//! `ZCS_REQUIRE_GPU=1`).

#[path = "support/provider.rs"]
mod provider;

use zcs_memory::cuda::kernels::Kernels;

/// A publisher that borrows device blocks from the provider is SIGKILLed mid-stream
/// while two subscribers hold its blocks; contents checked on the GPU's bytes.
#[test]
fn gpu_provider_publisher_killed_two_readers() {
    const TEST: &str = "gpu_provider_publisher_killed_two_readers";
    if let Some(gpu) = zcs_tests::gpu_or_skip(TEST) {
        let kernels = Kernels::load(&gpu).expect("load kernels");
        provider::publisher_killed(provider::Mode::Cuda, Some(kernels), TEST);
    }
}

/// Entry point of the re-executed test binary (the publisher); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by gpu_provider_publisher_killed_two_readers"]
fn child_entry() {
    provider::child_entry();
}
