//! Store errors the way the kernel reports them: retries, the error log,
//! the store-timeout watchdog, and truncation of the backing object.
//!
//! # What a failed read becomes
//!
//! ```text
//!   I/O thread: read ──err──► retry after 1, 2, 4 .. 64 ms (io_retries times)
//!                 │                    │ all failed
//!                 ok                   ▼
//!                 ▼             pages ABSENT+FAILED, report Read
//!             UPTODATE          the faulting page is read alone once more
//!                               (fault.rs), and if that fails: SIGBUS
//! ```
//!
//! - **Retries.** A store request that fails is tried again up to
//!   [`crate::Config::io_retries`] times by the I/O thread that runs it,
//!   after a short exponential backoff ([`backoff`]), counting
//!   `io_retries`. Its pages stay READING meanwhile, so the faults waiting
//!   for them keep waiting: a transient error is invisible. Only when every
//!   try failed do its pages fail (`io_errors`, a [`IoErrorKind::Read`]
//!   report). The kernel itself does not retry a failed `->read_folio` but
//!   the block layer below it does; a remote store has no block layer, so
//!   faultmap retries for it.
//! - **Short reads.** The [`crate::Store`] contract is all-or-error: a store
//!   that cannot fill the whole buffer returns an error
//!   ([`crate::StoreError::Short`] from [`crate::FileStore`] when the file
//!   shrank), never zeros or stale bytes. Such a failure ends like any other
//!   read error: SIGBUS on the faulting pages that could not be read.
//! - **Reports.** Every failure is logged on the object and on every pager
//!   that opened or mapped it: a bounded log of the last [`crate::LOG_CAPACITY`]
//!   [`crate::IoErrorReport`]s ([`crate::Object::io_errors`],
//!   [`crate::Pager::io_errors`]; `take_io_errors` drains). Older reports
//!   are dropped and counted (`dropped`).
//!
//! # The watchdog
//!
//! One thread per pager (joined with its other threads) wakes every
//! [`tick`] and looks at every read job submitted and not yet ended, queued
//! or running (`crate::mm::io::Inflight`):
//!
//! 1. A job older than [`crate::Config::io_timeout`] is *stalled*: its pages
//!    get the STALLED flag (they stay READING: the hung store call may still
//!    write into the cache's alias of them, so nobody else may read them),
//!    `io_timeouts` counts it, a [`IoErrorKind::Timeout`] report names it,
//!    and the faults parked on its pages fail (SIGBUS). A later fault on a
//!    READING+STALLED page fails at once instead of parking. When the hung
//!    call returns, the job ends its reads as usual (UPTODATE, or ABSENT and
//!    FAILED), which clears STALLED: the next access works again.
//! 2. About once a second, every object this pager maps is asked for its
//!    current length ([`crate::Store::len_now`]). If it shrank, the object
//!    remembers the new end (a fault on a page wholly beyond it fails at
//!    once) and its cached pages beyond the end are dropped from the cache
//!    and from every mapping (`Object::invalidate`, on a helper thread,
//!    because invalidation waits for reads in flight, which may be hung).
//!
//! # Known deviations
//!
//! - The kernel truncates its page cache synchronously in `truncate(2)`;
//!   faultmap notices a shrink within one length poll (about a second) or
//!   at the first read that comes back short, whichever comes first. Until
//!   then cached pages beyond the new end are still served.
//! - The page that holds the new end keeps its cached bytes beyond the end
//!   (the kernel zeroes them); only pages wholly beyond the end are dropped.
//! - A timeout does not cancel the store call (a `Store` has no way to be
//!   cancelled): the I/O thread running it stays busy until it returns.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use crate::base::index::ObjectPage;
use crate::base::report::IoErrorKind;
use crate::base::stats::Stats;
use crate::mm::fault;
use crate::mm::io::IoShared;
use crate::sys;

/// The first retry's delay.
const BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// The longest delay between two tries.
const BACKOFF_MAX: Duration = Duration::from_millis(64);

/// How often the watchdog polls the objects' lengths.
pub(crate) const LENGTH_POLL: Duration = Duration::from_secs(1);

/// The delay before try `attempt + 1` (`attempt` 0 is the first retry):
/// 1 ms, doubling, at most 64 ms.
pub(crate) fn backoff(attempt: u32) -> Duration {
    BACKOFF_FIRST
        .checked_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
        .unwrap_or(BACKOFF_MAX)
        .min(BACKOFF_MAX)
}

/// The watchdog's period for a store timeout of `timeout`: a quarter of it,
/// between 10 ms and the length poll's period.
pub(crate) fn tick(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), LENGTH_POLL)
}

/// The watchdog thread of a pager: every [`tick`], stalls the read jobs
/// older than `timeout` and fails the faults parked on them; every
/// [`LENGTH_POLL`], polls the lengths of the objects the pager maps. Returns
/// when `stop` becomes readable.
pub(crate) fn watchdog_loop(shared: &IoShared, stop: &OwnedFd, timeout: Duration) {
    let period = tick(timeout);
    let period_ms = i32::try_from(period.as_millis()).unwrap_or(i32::MAX);
    let mut polled = Instant::now();
    loop {
        match sys::poll_readable(&[stop], period_ms) {
            Ok(ready) if ready & 1 != 0 => return,
            Ok(_) => {}
            // poll has no failure we could cause: sleep instead.
            Err(_) => std::thread::sleep(period),
        }
        stall_overdue(shared, timeout);
        if polled.elapsed() >= LENGTH_POLL {
            polled = Instant::now();
            poll_lengths(shared);
        }
    }
}

/// Step 1 of the watchdog (module documentation).
fn stall_overdue(shared: &IoShared, timeout: Duration) {
    for job in shared.inflight.stall_overdue(timeout) {
        let object = &*job.object;
        let start = object.cache.offset(job.pages.start).min(object.len);
        let end = object.cache.offset(job.pages.end).min(object.len);
        // The report before the count: whoever sees the count finds the
        // report.
        object.report(
            IoErrorKind::Timeout,
            start..end,
            format!(
                "the store has not answered after {} ms (io_timeout {} ms)",
                job.age.as_millis(),
                timeout.as_millis()
            ),
        );
        let tally = Stats {
            io_timeouts: 1,
            ..Stats::default()
        };
        object.counters.add(&tally);
        shared.counters.add(&tally);
        // The faults parked on stalled pages fail; the others look again.
        fault::settle_parked(object, None);
    }
}

/// Step 2 of the watchdog (module documentation).
fn poll_lengths(shared: &IoShared) {
    for object in shared.objects() {
        // A store that panics here must not take the watchdog (and every
        // store timeout) down with it.
        let len_now =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| object.store.len_now()));
        let Ok(Some(now)) = len_now else {
            continue;
        };
        if object.errors.shrink_to(now).is_none() {
            continue;
        }
        // Pages wholly beyond the new end leave the cache and every
        // mapping. Invalidation waits for reads in flight, which may be
        // hung: a helper thread does it, so the watchdog keeps watching.
        let first = ObjectPage(now.div_ceil(object.cache.page_size().bytes() as u64));
        let end = ObjectPage(object.cache.states.pages());
        if first >= end {
            continue;
        }
        let drop_pages = {
            let object = object.clone();
            move || {
                let _ = crate::mm::invalidate::truncate(&object, first..end);
            }
        };
        let spawned = std::thread::Builder::new()
            .name("faultmap-truncate".into())
            .spawn(drop_pages.clone());
        if spawned.is_err() {
            drop_pages();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(1));
        assert_eq!(backoff(1), Duration::from_millis(2));
        assert_eq!(backoff(6), Duration::from_millis(64));
        assert_eq!(backoff(7), Duration::from_millis(64));
        assert_eq!(backoff(40), Duration::from_millis(64));
        assert_eq!(backoff(u32::MAX), Duration::from_millis(64));
    }

    #[test]
    fn tick_is_bounded() {
        assert_eq!(tick(Duration::from_millis(1)), Duration::from_millis(10));
        assert_eq!(tick(Duration::from_millis(200)), Duration::from_millis(50));
        assert_eq!(tick(Duration::from_secs(30)), LENGTH_POLL);
    }
}
