//! A refused peer is closed at once, counted, and logged with `warn!` once per uid;
//! syscalls are traced. Alone in its test binary: tracing caches per-callsite interest
//! process-wide, and a concurrent test hitting the same callsites without a subscriber
//! could make the scoped recorder below miss events.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber, span};
use zcs_wire::ipc::{AcceptError, AccessPolicy, ControlConn, ControlListener, RecvError, SendError, SocketName};

const STEP: Duration = Duration::from_secs(5);

/// Records WARN events (and the `uid` field) plus the levels seen.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(Level, String)>>>);

struct FieldsToString(String);

impl Visit for FieldsToString {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut v = FieldsToString(String::new());
        event.record(&mut v);
        if let Ok(mut log) = self.0.lock() {
            log.push((*event.metadata().level(), v.0));
        }
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

#[test]
fn ipc_refused_peer_is_closed_counted_and_logged_once() {
    let (_alive, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(30)) {
            eprintln!("WATCHDOG: ipc_refused_peer_is_closed_counted_and_logged_once hung; aborting");
            std::process::abort();
        }
    });
    let rec = Recorder::default();
    let events = Arc::clone(&rec.0);
    tracing::subscriber::with_default(rec, || {
        let me = nix::unistd::geteuid().as_raw();
        let other = me.wrapping_add(4242);
        let policy = AccessPolicy::uids([other]);
        let listener = ControlListener::bind_with_policy(&SocketName::random_abstract(), policy.clone()).expect("bind");
        assert_eq!(listener.policy(), &policy);
        for _ in 0..3 {
            let client = ControlConn::connect(listener.name(), STEP).expect("connect");
            assert!(matches!(listener.accept_timeout(Duration::from_millis(20)), Err(AcceptError::Timeout(_))));
            assert!(matches!(client.recv(STEP), Err(RecvError::Closed)));
            assert!(matches!(client.send(b"x", &[]), Err(SendError::Closed)));
        }
        let stats = listener.stats();
        assert_eq!((stats.accepted, stats.refused), (0, 3));
    });
    let events = events.lock().expect("events");
    let warns: Vec<&String> = events.iter().filter(|(l, _)| *l == Level::WARN).map(|(_, m)| m).collect();
    assert_eq!(warns.len(), 1, "one warning per uid, got {warns:?}");
    let me = nix::unistd::geteuid().as_raw();
    assert!(warns[0].contains(&format!("uid={me} ")), "{}", warns[0]);
    assert!(warns[0].contains(&format!("pid={} ", std::process::id())));
    assert!(events.iter().any(|(l, m)| *l == Level::TRACE && m.contains("accept4")));
    assert!(events.iter().any(|(l, m)| *l == Level::TRACE && m.contains("SO_PEERCRED")));
    assert!(events.iter().any(|(l, m)| *l == Level::DEBUG && m.contains("accept failed")));
}
