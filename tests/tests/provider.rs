//! Blocks lent by a host provider, one body on host memfd blocks (CI) and on CUDA VMM
//! blocks allocated in the provider's process (the GPU machine; filled by the fill
//! kernel), with real processes and real Zenoh on loopback TCP; the scenario is
//! described in `support/provider.rs`. Without a usable GPU the CUDA test prints
//! `SKIPPED <name>: <reason>` (a failure under `ZCS_REQUIRE_GPU=1`).

#[path = "support/provider.rs"]
mod provider;

zcs_tests::medium_tests! {
    /// A publisher that borrows from the provider is SIGKILLed mid-stream while two
    /// subscribers hold its blocks.
    provider::publisher_killed => provider_publisher_killed_two_readers, gpu_provider_publisher_killed_two_readers;
}

/// Entry point of the re-executed test binary (the publisher); a no-op in a normal run.
#[test]
#[ignore = "child-process entry, run by the *provider_publisher_killed_two_readers tests"]
fn child_entry() {
    provider::child_entry();
}

/// A session in `auto` whose router is not up yet when it opens (Zenoh returns from a
/// peer's open without its connections once `scouting/delay` has passed): it waits,
/// within `provider_discovery_ms`, for the link, then finds the provider over it. With
/// no router ever, it gives up at that bound and uses its own pools.
#[test]
fn an_auto_session_finds_a_provider_whose_router_comes_up_late() {
    use zcs_tests::{free_tcp_port, loopback_zenoh_config};
    use zenoh::Wait;
    use zenoh_cuda_shm::config::{DeviceChoice, ProviderMode};
    use zenoh_cuda_shm::provider::{GpuSelection, Provider, ProviderConfig};
    use zenoh_cuda_shm::{GpuSession, ZcsConfig};

    let _w = zcs_tests::watchdog_guard("late router", std::time::Duration::from_secs(60));
    let auto = |port: u16, ms: u64| {
        let cfg = ZcsConfig {
            device: DeviceChoice::Host,
            provider: ProviderMode::Auto,
            provider_discovery_ms: ms,
            ..Default::default()
        };
        GpuSession::open(loopback_zenoh_config(None, Some(port), None), cfg).wait().expect("open session")
    };

    let port = free_tcp_port();
    let router = std::thread::spawn(move || {
        // Later than Zenoh's scouting delay (500 ms): the session's open has returned.
        std::thread::sleep(std::time::Duration::from_millis(900));
        let z = zenoh::open(loopback_zenoh_config(Some(port), None, None)).wait().expect("router session");
        let cfg = ProviderConfig { gpus: GpuSelection::None, host: true, ..ProviderConfig::default() };
        let provider = Provider::start(&cfg, &z).expect("start the provider");
        (z, provider)
    });
    let opening = std::time::Instant::now();
    let s = auto(port, 10_000);
    let opened = opening.elapsed();
    let (_z, provider) = router.join().expect("router thread");
    // The open waited for its link (without the wait it returns after the 500 ms
    // scouting delay, and its one query goes nowhere).
    assert!(opened >= std::time::Duration::from_millis(850), "the open returned before its link: {opened:?}");
    // The link may come up before the provider's token is declared (the router thread
    // opens its session, then starts the provider): then the query finds nothing and
    // the session's watch learns of the provider a moment later.
    let waiting = std::time::Instant::now();
    while s.provider().is_err() {
        assert!(waiting.elapsed().as_secs() < 10, "the session never learned of the provider: {:?}", s.provider());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(s.provider().ok().map(|p| p.id), Some(provider.provider().id), "the session found the late provider");
    let p = s.declare_publisher("zcs-test/late-router").wait().expect("publisher");
    let loan = p.loan(1 << 20).expect("loan");
    let lent = provider.snapshot().devices[0].loans;
    assert!(lent > 0, "the publisher borrows from the provider: {lent} loans");
    drop(loan);

    // Nobody listens on this port: the open gives up after the discovery bound.
    let t = std::time::Instant::now();
    let alone = auto(free_tcp_port(), 700);
    assert!(t.elapsed() >= std::time::Duration::from_millis(700), "waited {:?}", t.elapsed());
    let why = alone.provider().expect_err("no provider without a router");
    assert!(matches!(why, zenoh_cuda_shm::provider::NoProvider::NotAnnounced), "{why}");
}
