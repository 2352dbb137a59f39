//! The faults a test sets on a running proxy, and the counters it reads.
//!
//! State, one [`Shared`] per proxy, held by the proxy's tasks and by every
//! [`Faults`] handle:
//!
//! - `latency_ns`, `bandwidth`: plain atomics, read once per request (latency)
//!   or per body piece (bandwidth), so a change applies from the next
//!   request or piece on.
//! - `link_free`: when the shared link next falls idle under the bandwidth
//!   cap; each body piece reserves the next `len / rate` seconds of it
//!   ([`pace`]).
//! - `queue`: the one-shot faults, a FIFO of `(fault, count)` runs; each
//!   request takes at most one fault from its head.
//! - `hook`: called with each request's number, outside every lock.
//! - `counters`: relaxed atomics; they order nothing, a reader sums them.
//!
//! Locks are held for a few instructions and never across a call out, so a
//! panicking hook cannot poison them; a poisoned lock is used as is.

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use http::StatusCode;

/// A fault that one request takes from the queue ([`Faults::inject`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Close the client's TCP connection with a reset (RST), without an
    /// answer. The request is not forwarded.
    Reset,
    /// Forward the request, send the response head with the real
    /// `Content-Length` and the first half of the body, then reset the
    /// connection. The client may see less than half: a reset also discards
    /// what it had received but not yet read.
    ResetMidBody,
    /// Forward the request, send the response head with the real
    /// `Content-Length` and the first half of the body, then close the
    /// connection (FIN): the client sees the body end early.
    CutBody,
    /// Answer with an S3-style error and this status. The request is not
    /// forwarded.
    Status(ErrorStatus),
}

/// An error status the proxy answers with in place of the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorStatus {
    /// 500, S3 code `InternalError`.
    InternalError,
    /// 503, S3 code `SlowDown` (S3's answer to too high a request rate).
    SlowDown,
}

impl ErrorStatus {
    /// The HTTP status code.
    pub fn code(self) -> StatusCode {
        match self {
            ErrorStatus::InternalError => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorStatus::SlowDown => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The XML body, shaped like S3's error answers.
    pub(crate) fn xml(self, request: u64) -> String {
        let (code, message) = match self {
            ErrorStatus::InternalError => (
                "InternalError",
                "We encountered an internal error. Please try again.",
            ),
            ErrorStatus::SlowDown => ("SlowDown", "Please reduce your request rate."),
        };
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
             <Message>{message}</Message><RequestId>faultmap-proxy-{request}</RequestId></Error>"
        )
    }
}

/// A hook called with each request's number before the request is
/// forwarded (see [`Faults::set_hook`]).
pub type Hook = Box<dyn Fn(u64) + Send + Sync>;

/// A [`Hook`] as the proxy keeps it: cloned out of its lock to be called.
type SharedHook = Arc<dyn Fn(u64) + Send + Sync>;

/// A snapshot of a proxy's counters, totals since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests received (each numbered for the hook in this order).
    pub requests: u64,
    /// Response body bytes forwarded from the upstream to clients (injected
    /// error bodies not included).
    pub body_bytes: u64,
    /// Requests whose `Range` header has a computable length (`bytes=a-b`
    /// and suffix ranges `bytes=-n`; open-ended `bytes=a-` is not counted).
    pub ranged_requests: u64,
    /// The sum of those requests' range lengths, in bytes.
    pub range_bytes: u64,
    /// Connections reset by [`Fault::Reset`] or [`Fault::ResetMidBody`].
    pub resets: u64,
    /// Error statuses answered by [`Fault::Status`].
    pub error_statuses: u64,
    /// Bodies cut short by [`Fault::CutBody`].
    pub cut_bodies: u64,
    /// Requests the upstream did not answer (answered 502 by the proxy).
    pub upstream_errors: u64,
}

impl Stats {
    /// The mean range length of the ranged requests, if there were any.
    pub fn mean_range_bytes(&self) -> Option<f64> {
        (self.ranged_requests > 0).then(|| self.range_bytes as f64 / self.ranged_requests as f64)
    }

    /// The counts between an `earlier` snapshot and this one.
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            requests: self.requests.saturating_sub(earlier.requests),
            body_bytes: self.body_bytes.saturating_sub(earlier.body_bytes),
            ranged_requests: self.ranged_requests.saturating_sub(earlier.ranged_requests),
            range_bytes: self.range_bytes.saturating_sub(earlier.range_bytes),
            resets: self.resets.saturating_sub(earlier.resets),
            error_statuses: self.error_statuses.saturating_sub(earlier.error_statuses),
            cut_bodies: self.cut_bodies.saturating_sub(earlier.cut_bodies),
            upstream_errors: self.upstream_errors.saturating_sub(earlier.upstream_errors),
        }
    }
}

/// The live counters behind [`Stats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) body_bytes: AtomicU64,
    pub(crate) ranged_requests: AtomicU64,
    pub(crate) range_bytes: AtomicU64,
    pub(crate) resets: AtomicU64,
    pub(crate) error_statuses: AtomicU64,
    pub(crate) cut_bodies: AtomicU64,
    pub(crate) upstream_errors: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> Stats {
        Stats {
            requests: self.requests.load(Relaxed),
            body_bytes: self.body_bytes.load(Relaxed),
            ranged_requests: self.ranged_requests.load(Relaxed),
            range_bytes: self.range_bytes.load(Relaxed),
            resets: self.resets.load(Relaxed),
            error_statuses: self.error_statuses.load(Relaxed),
            cut_bodies: self.cut_bodies.load(Relaxed),
            upstream_errors: self.upstream_errors.load(Relaxed),
        }
    }
}

/// The state one proxy shares between its tasks and its [`Faults`] handles.
#[derive(Default)]
pub(crate) struct Shared {
    latency_ns: AtomicU64,
    /// Bytes per second; 0 means no cap.
    bandwidth: AtomicU64,
    link_free: Mutex<Option<Instant>>,
    queue: Mutex<VecDeque<(Fault, u64)>>,
    hook: RwLock<Option<SharedHook>>,
    /// Whether responses lose their `ETag` header.
    drop_etag: AtomicBool,
    /// Whether responses lose their `Last-Modified` header.
    drop_last_modified: AtomicBool,
    /// The first [`REQUEST_LOG_MAX`] requests' method and raw target.
    request_log: Mutex<Vec<String>>,
    pub(crate) counters: Counters,
}

/// How many requests the log keeps (the first ones): a test's few dozen,
/// with room to spare; a benchmark's thousands are not kept.
pub const REQUEST_LOG_MAX: usize = 4096;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn latency(&self) -> Duration {
        Duration::from_nanos(self.latency_ns.load(Relaxed))
    }

    pub(crate) fn bandwidth(&self) -> Option<NonZeroU64> {
        NonZeroU64::new(self.bandwidth.load(Relaxed))
    }

    /// Reserves the shared link for `bytes` at `rate`: returns when they
    /// may be released.
    pub(crate) fn pace(&self, bytes: u64, rate: NonZeroU64) -> Instant {
        let mut link_free = lock(&self.link_free);
        let release = pace(*link_free, Instant::now(), bytes, rate);
        *link_free = Some(release);
        release
    }

    /// Takes the fault at the head of the queue, if any.
    pub(crate) fn next_fault(&self) -> Option<Fault> {
        let mut queue = lock(&self.queue);
        let (fault, left) = queue.front_mut()?;
        let fault = *fault;
        *left -= 1;
        if *left == 0 {
            queue.pop_front();
        }
        Some(fault)
    }

    /// Calls the hook, if one is set, outside the lock.
    pub(crate) fn run_hook(&self, request: u64) {
        let hook = self
            .hook
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(hook) = hook {
            hook(request);
        }
    }

    /// Whether responses are to lose their `ETag` and their
    /// `Last-Modified`.
    pub(crate) fn drops_validators(&self) -> (bool, bool) {
        (
            self.drop_etag.load(Relaxed),
            self.drop_last_modified.load(Relaxed),
        )
    }

    /// Logs a request as it arrived: `METHOD target`, the target exactly
    /// as the client wrote it (path and query, escapes kept).
    pub(crate) fn log_request(&self, method: &str, target: &str) {
        let mut log = lock(&self.request_log);
        if log.len() < REQUEST_LOG_MAX {
            log.push(format!("{method} {target}"));
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

/// When a body piece of `bytes` may be released under a cap of `rate`
/// bytes/s, given when the link falls idle (`link_free`, `None` if never
/// used) and the time now: at the end of the piece's slot, which starts when
/// the link is free (or now, if it has been idle). The link is then busy
/// until that same instant.
pub(crate) fn pace(
    link_free: Option<Instant>,
    now: Instant,
    bytes: u64,
    rate: NonZeroU64,
) -> Instant {
    let start = link_free.map_or(now, |free| free.max(now));
    // 64 KiB pieces: bytes * 1e9 stays far below u64::MAX.
    start + Duration::from_nanos(bytes.saturating_mul(1_000_000_000) / rate.get())
}

/// The number of bytes a `Range` header value asks for: the sum of its
/// closed ranges (`a-b`, b inclusive) and suffix ranges (`-n`). `None` when
/// the value is not a `bytes=` range, is malformed, or has an open-ended
/// range (`a-`), whose length depends on the object's size.
pub(crate) fn range_len(value: &str) -> Option<u64> {
    let ranges = value.trim().strip_prefix("bytes=")?;
    ranges.split(',').try_fold(0u64, |sum, range| {
        let (first, last) = range.trim().split_once('-')?;
        let len = match (first.trim(), last.trim()) {
            ("", suffix) => suffix.parse::<u64>().ok()?,
            (_, "") => return None,
            (first, last) => {
                let (first, last) = (first.parse::<u64>().ok()?, last.parse::<u64>().ok()?);
                last.checked_sub(first)?.checked_add(1)?
            }
        };
        sum.checked_add(len)
    })
}

/// The handle to a running proxy's faults and counters: cheap to clone,
/// usable from any thread, valid (and harmless) after the proxy stopped.
#[derive(Clone)]
pub struct Faults {
    shared: Arc<Shared>,
}

impl Faults {
    pub(crate) fn new(shared: Arc<Shared>) -> Faults {
        Faults { shared }
    }

    /// Sets the first-byte latency: slept before every response head (and
    /// before an injected reset or error status). `Duration::ZERO` turns it
    /// off.
    pub fn set_latency(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.shared.latency_ns.store(nanos, Relaxed);
    }

    /// The first-byte latency now set.
    pub fn latency(&self) -> Duration {
        self.shared.latency()
    }

    /// Caps response bodies at `bytes_per_sec` for the whole proxy (all
    /// connections share it); `None` removes the cap.
    pub fn set_bandwidth(&self, bytes_per_sec: Option<NonZeroU64>) {
        self.shared
            .bandwidth
            .store(bytes_per_sec.map_or(0, NonZeroU64::get), Relaxed);
    }

    /// The bandwidth cap now set.
    pub fn bandwidth(&self) -> Option<NonZeroU64> {
        self.shared.bandwidth()
    }

    /// Queues `fault` for the next `count` requests (after any faults
    /// already queued). Each request takes at most one queued fault.
    pub fn inject(&self, fault: Fault, count: u64) {
        if count == 0 {
            return;
        }
        let mut queue = lock(&self.shared.queue);
        match queue.back_mut() {
            Some((last, left)) if *last == fault => *left = left.saturating_add(count),
            _ => queue.push_back((fault, count)),
        }
    }

    /// How many queued one-shot faults are still to be taken.
    pub fn pending(&self) -> u64 {
        lock(&self.shared.queue).iter().map(|(_, n)| n).sum()
    }

    /// Sets the hook called with each request's number (0, 1, 2, … in
    /// arrival order) before the request is forwarded or faulted. It runs
    /// on the proxy's thread, and every connection waits for it (the
    /// upstream sees no request meanwhile); keep it short.
    pub fn set_hook(&self, hook: Hook) {
        *self
            .shared
            .hook
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::from(hook));
    }

    /// Removes the hook.
    pub fn clear_hook(&self) {
        *self
            .shared
            .hook
            .write()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Makes every response from now on lose its `ETag` and
    /// `Last-Modified` headers (`false`: pass them through again), as a
    /// server that sends no validators would answer.
    pub fn set_drop_validators(&self, drop: bool) {
        self.shared.drop_etag.store(drop, Relaxed);
        self.shared.drop_last_modified.store(drop, Relaxed);
    }

    /// Makes every response from now on lose its `Last-Modified` header
    /// alone (`false`: pass it through again), as a server that sends an
    /// ETag and no modification time would answer.
    pub fn set_drop_last_modified(&self, drop: bool) {
        self.shared.drop_last_modified.store(drop, Relaxed);
    }

    /// The requests received so far (the first [`REQUEST_LOG_MAX`]), each
    /// as `METHOD target`, the target exactly as the client sent it: its
    /// percent-escapes are kept, so a test can tell `/a%2Fb` from `/a/b`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.shared.request_log).clone()
    }

    /// Empties the request log (it then keeps the next
    /// [`REQUEST_LOG_MAX`] requests).
    pub fn clear_requests(&self) {
        lock(&self.shared.request_log).clear();
    }

    /// Turns every fault off: no latency, no cap, an empty queue, no hook,
    /// validators passed through. The counters and the request log go on.
    pub fn clear(&self) {
        self.set_latency(Duration::ZERO);
        self.set_bandwidth(None);
        lock(&self.shared.queue).clear();
        self.clear_hook();
        self.set_drop_validators(false);
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("latency", &self.latency())
            .field("bandwidth", &self.bandwidth())
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_len_sums_closed_and_suffix_ranges() {
        assert_eq!(range_len("bytes=0-9"), Some(10));
        assert_eq!(range_len("bytes=5-5"), Some(1));
        assert_eq!(range_len("bytes=-100"), Some(100));
        assert_eq!(range_len("bytes=0-9, 20-29"), Some(20));
        assert_eq!(range_len(" bytes=0-4095 "), Some(4096));
    }

    #[test]
    fn range_len_refuses_what_it_cannot_size() {
        assert_eq!(range_len("bytes=10-"), None);
        assert_eq!(range_len("bytes=9-0"), None);
        assert_eq!(range_len("items=0-9"), None);
        assert_eq!(range_len("bytes=a-b"), None);
        assert_eq!(range_len("bytes=0-18446744073709551615"), None);
    }

    #[test]
    fn pace_spaces_pieces_by_their_length_over_the_rate() {
        let now = Instant::now();
        let rate = NonZeroU64::new(1000).unwrap();
        let first = pace(None, now, 500, rate);
        assert_eq!(first, now + Duration::from_millis(500));
        let second = pace(Some(first), now, 250, rate);
        assert_eq!(second, now + Duration::from_millis(750));
        // An idle link starts a piece's slot now, not in the past.
        let later = now + Duration::from_secs(10);
        assert_eq!(
            pace(Some(second), later, 1000, rate),
            later + Duration::from_secs(1)
        );
    }

    #[test]
    fn queue_hands_out_faults_in_order_one_per_request() {
        let faults = Faults::new(Arc::default());
        faults.inject(Fault::Status(ErrorStatus::SlowDown), 2);
        faults.inject(Fault::Reset, 1);
        faults.inject(Fault::Reset, 1);
        assert_eq!(faults.pending(), 4);
        let taken: Vec<_> = std::iter::from_fn(|| faults.shared.next_fault()).collect();
        assert_eq!(
            taken,
            [
                Fault::Status(ErrorStatus::SlowDown),
                Fault::Status(ErrorStatus::SlowDown),
                Fault::Reset,
                Fault::Reset
            ]
        );
        assert_eq!(faults.pending(), 0);
    }
}
