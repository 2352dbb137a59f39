//! Store failures as the application sees them: [`IoErrorReport`]s, the
//! bounded logs that keep them (per object and per pager), and an object's
//! error state (its log, the pager logs it feeds, its end after a
//! truncation). What produces them (retries, the watchdog, truncation) is
//! `crate::mm::errors`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Reports kept per log (object or pager).
pub const LOG_CAPACITY: usize = 64;

/// What failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoErrorKind {
    /// A store read failed (after its retries), or came back short.
    Read,
    /// A store read outlived [`crate::Config::io_timeout`].
    Timeout,
    /// Writing dirty pages back to the store failed.
    WriteBack,
}

/// One store failure, as the logs keep it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoErrorReport {
    /// The object's name (the store's).
    pub object: String,
    /// The first byte of the failed request.
    pub offset: u64,
    /// The request's length in bytes.
    pub len: u64,
    /// What failed.
    pub kind: IoErrorKind,
    /// The store's error, as text.
    pub message: String,
}

/// A bounded log of the last [`LOG_CAPACITY`] reports.
#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    entries: Mutex<VecDeque<IoErrorReport>>,
    /// Reports dropped because the log was full.
    dropped: AtomicU64,
}

impl ErrorLog {
    /// Appends `report`, dropping the oldest if the log is full.
    pub(crate) fn push(&self, report: IoErrorReport) {
        let mut entries = lock(&self.entries);
        if entries.len() >= LOG_CAPACITY {
            entries.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        entries.push_back(report);
    }

    /// The reports, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<IoErrorReport> {
        lock(&self.entries).iter().cloned().collect()
    }

    /// Takes the reports, oldest first, leaving the log empty.
    pub(crate) fn take(&self) -> Vec<IoErrorReport> {
        lock(&self.entries).drain(..).collect()
    }
}

/// An object's error state: its log, the pager logs its reports also go
/// to, and its current end (it shrinks when the store is truncated).
#[derive(Debug)]
pub(crate) struct ObjectErrors {
    log: ErrorLog,
    sinks: Mutex<Vec<Weak<ErrorLog>>>,
    /// The object's end as last known, in bytes.
    end: AtomicU64,
}

impl ObjectErrors {
    pub(crate) fn new(len: u64) -> Self {
        Self {
            log: ErrorLog::default(),
            sinks: Mutex::new(Vec::new()),
            end: AtomicU64::new(len),
        }
    }

    /// Logs `report` on the object and on every live pager log attached.
    pub(crate) fn report(&self, report: IoErrorReport) {
        let sinks: Vec<Arc<ErrorLog>> = {
            let mut sinks = lock(&self.sinks);
            sinks.retain(|s| s.strong_count() > 0);
            sinks.iter().filter_map(Weak::upgrade).collect()
        };
        for s in sinks {
            s.push(report.clone());
        }
        self.log.push(report);
    }

    /// Sends this object's later reports to `log` too (once per log).
    pub(crate) fn attach(&self, log: &Arc<ErrorLog>) {
        let mut sinks = lock(&self.sinks);
        if !sinks
            .iter()
            .any(|s| std::ptr::eq(s.as_ptr(), Arc::as_ptr(log)))
        {
            sinks.push(Arc::downgrade(log));
        }
    }

    pub(crate) fn log(&self) -> &ErrorLog {
        &self.log
    }

    /// The object's end as last known.
    pub(crate) fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    /// Records that the object now ends at `len`, if that is below the end
    /// known so far. Returns the previous end if it shrank.
    pub(crate) fn shrink_to(&self, len: u64) -> Option<u64> {
        let old = self.end.fetch_min(len, Ordering::AcqRel);
        (len < old).then_some(old)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An error and its causes as one line, `": "`-joined; a cause whose text
/// its parent's message already holds is left out. For messages that
/// leave the library whole: the C API's last error, a remote store's
/// detail.
pub fn error_text(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(offset: u64) -> IoErrorReport {
        IoErrorReport {
            object: "o".into(),
            offset,
            len: 4096,
            kind: IoErrorKind::Read,
            message: String::new(),
        }
    }

    #[test]
    fn the_log_keeps_the_newest_and_counts_the_dropped() {
        let log = ErrorLog::default();
        for i in 0..(LOG_CAPACITY as u64 + 5) {
            log.push(report(i));
        }
        let all = log.snapshot();
        assert_eq!(all.len(), LOG_CAPACITY);
        assert_eq!(all[0].offset, 5);
        assert_eq!(log.dropped.load(Ordering::Relaxed), 5);
        assert_eq!(log.take().len(), LOG_CAPACITY);
        assert!(log.snapshot().is_empty());
    }

    #[test]
    fn reports_reach_live_sinks_once() {
        let o = ObjectErrors::new(100);
        let pager = Arc::new(ErrorLog::default());
        o.attach(&pager);
        o.attach(&pager);
        o.report(report(1));
        assert_eq!(pager.snapshot().len(), 1);
        assert_eq!(o.log().snapshot().len(), 1);
        drop(pager);
        o.report(report(2));
        assert_eq!(o.log().snapshot().len(), 2);
    }

    #[test]
    fn the_end_only_shrinks() {
        let o = ObjectErrors::new(100);
        assert_eq!(o.shrink_to(200), None);
        assert_eq!(o.shrink_to(50), Some(100));
        assert_eq!(o.shrink_to(60), None);
        assert_eq!(o.end(), 50);
    }
}
