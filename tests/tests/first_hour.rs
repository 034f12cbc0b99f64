//! What a new user sees when something is off, read from the library's log lines as the
//! examples' terminal shows them (`tracing_subscriber::fmt`, WARN and above).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zcs_tests::{free_tcp_port, loopback_zenoh_config, watchdog_guard};
use zenoh_cuda_shm::config::DeviceChoice;
use zenoh_cuda_shm::{GpuSession, ZcsConfig};

/// Everything logged in this process.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const UNREACHED: &str = "no Zenoh router or peer reached";

fn host() -> ZcsConfig {
    ZcsConfig { device: DeviceChoice::Host, ..ZcsConfig::default() }
}

/// A session told to connect where nothing listens says so within a few seconds (in
/// peer mode Zenoh keeps retrying without a word); one that reaches its peer does not.
#[test]
fn connect_endpoints_where_nothing_listens_are_reported() {
    let _w = watchdog_guard("connect_endpoints_where_nothing_listens_are_reported", Duration::from_secs(60));
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    // Reached: a listening peer, then a session connecting to it.
    let port = free_tcp_port();
    let listener = GpuSession::open(loopback_zenoh_config(Some(port), None, None), host()).wait().unwrap();
    let reached = GpuSession::open(loopback_zenoh_config(None, Some(port), None), host()).wait().unwrap();

    // Unreached: an endpoint nobody listens on.
    let nobody = free_tcp_port();
    let t = Instant::now();
    let lonely = GpuSession::open(loopback_zenoh_config(None, Some(nobody), None), host()).wait().unwrap();
    while !log.text().contains(UNREACHED) && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = log.text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(UNREACHED)).collect();
    assert_eq!(lines.len(), 1, "one warning, for the unreached session only:\n{text}");
    assert!(lines[0].contains(&format!("tcp/127.0.0.1:{nobody}")), "names the endpoint: {}", lines[0]);
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(t.elapsed() >= Duration::from_secs(2), "not before the grace period: {:?}", t.elapsed());
    drop((lonely, reached, listener));
}
