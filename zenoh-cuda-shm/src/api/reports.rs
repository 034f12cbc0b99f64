//! What a session reports to its host provider, once a second, while it lives.

use std::sync::Mutex;
use std::time::Duration;

use crate::provider::ProviderWatch;
use crate::sync::Unpoisoned;

/// One publisher or subscriber: adds its entry to the process's report while it
/// exists, and returns whether it still does.
pub(super) type Reporter = Box<dyn Fn(&mut crate::protocol::ProcessReport) -> bool + Send + Sync>;

/// The session's publishers and subscribers, and whether the thread that sends their
/// reports (and forgets those that are gone) runs.
#[derive(Default)]
pub(super) struct Reports {
    pub(super) reporters: Vec<Reporter>,
    pub(super) sending: bool,
}

pub(super) fn lock_reports(r: &Mutex<Reports>) -> std::sync::MutexGuard<'_, Reports> {
    r.locked()
}

/// How often a session reports to its provider.
const REPORT_PERIOD: Duration = Duration::from_secs(1);

/// Sends the session's report to its provider now and every [`REPORT_PERIOD`], until the
/// session or its watch is gone.
pub(super) fn send_reports(reports: std::sync::Weak<Mutex<Reports>>, watch: std::sync::Weak<ProviderWatch>) {
    loop {
        let (Some(reports), Some(watch)) = (reports.upgrade(), watch.upgrade()) else { return };
        let report = {
            let mut r = lock_reports(&reports);
            let mut out = crate::protocol::ProcessReport::default();
            r.reporters.retain(|f| f(&mut out));
            out
        };
        drop(reports);
        if let Ok(client) = watch.current() {
            client.report(report);
        }
        drop(watch);
        std::thread::sleep(REPORT_PERIOD);
    }
}
