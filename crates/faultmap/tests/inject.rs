//! Injected store failures: the kernel's error semantics for store reads.
//!
//! A `Faulty` store wraps a real one and misbehaves on chosen pages: EIO
//! always, EIO a few times then fine (retries hide it), a short read, a
//! delay, or a hang until released. A fault on a page that cannot be read
//! gets SIGBUS (asserted in a child process, `common::run_child`); every
//! other page reads right; retried pages read right with `io_retries`
//! counted; every failure is in the error logs of the object and the pager;
//! a store that hangs past `io_timeout` gives SIGBUS, not a hang, and the
//! page reads fine once the store answers; a file truncated under its
//! mapping gives SIGBUS beyond the new end. Each test runs with both
//! deliveries.

mod common;
use common::MapTrusted;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use faultmap::{
    Advice, Config, Delivery, IoErrorKind, MapOptions, MemStore, Pager, Store, StoreError,
};

/// What a `Faulty` store does with a request touching a page.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Fails with EIO, always.
    Eio,
    /// Fails with EIO this many times, then reads fine.
    EioTimes(u32),
    /// Comes back short (`StoreError::Short`).
    Short,
    /// Reads fine after this long.
    Delay(Duration),
    /// Blocks until `Faulty::release`, then reads fine.
    Hang,
}

/// A store that misbehaves on chosen pages.
struct Faulty {
    inner: Box<dyn Store>,
    pages: BTreeMap<u64, Behaviour>,
    /// Failures injected so far, per page (for `EioTimes`).
    failed: Mutex<BTreeMap<u64, u32>>,
    released: Mutex<bool>,
    cv: Condvar,
    /// Requests that reached a hanging page.
    hung: AtomicU32,
}

impl Faulty {
    fn new(inner: impl Store, pages: impl IntoIterator<Item = (u64, Behaviour)>) -> Arc<Self> {
        Arc::new(Self {
            inner: Box::new(inner),
            pages: pages.into_iter().collect(),
            failed: Mutex::new(BTreeMap::new()),
            released: Mutex::new(false),
            cv: Condvar::new(),
            hung: AtomicU32::new(0),
        })
    }

    fn mem(data: &[u8], pages: impl IntoIterator<Item = (u64, Behaviour)>) -> (Arc<Self>, Vec<u8>) {
        (
            Self::new(MemStore::new("faulty", data.to_vec()), pages),
            data.to_vec(),
        )
    }

    /// Lets every hanging request (and every later one) through.
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.cv.notify_all();
    }

    fn eio(&self, offset: u64, len: usize) -> StoreError {
        StoreError::Read {
            name: self.name().to_string(),
            offset,
            len,
            source: std::io::Error::from_raw_os_error(libc::EIO),
        }
    }
}

impl Store for Faulty {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn len_now(&self) -> Option<u64> {
        self.inner.len_now()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let first = offset / PAGE as u64;
        let end = (offset + buf.len() as u64).div_ceil(PAGE as u64);
        for (&page, &b) in self.pages.range(first..end) {
            match b {
                Behaviour::Eio => {
                    buf.fill(0xA5);
                    return Err(self.eio(offset, buf.len()));
                }
                Behaviour::EioTimes(n) => {
                    let mut failed = self.failed.lock().unwrap();
                    let count = failed.entry(page).or_insert(0);
                    if *count < n {
                        *count += 1;
                        buf.fill(0xA5);
                        return Err(self.eio(offset, buf.len()));
                    }
                }
                Behaviour::Short => {
                    // Half of the buffer, then nothing: the trait is
                    // all-or-error, so a short read is an error.
                    let got = (page * PAGE as u64).saturating_sub(offset);
                    let _ = self.inner.read_at(offset, &mut buf[..got as usize]);
                    return Err(StoreError::Short {
                        name: self.name().to_string(),
                        offset,
                        expected: buf.len() as u64,
                        got,
                    });
                }
                Behaviour::Delay(d) => std::thread::sleep(d),
                Behaviour::Hang => {
                    self.hung.fetch_add(1, Ordering::SeqCst);
                    buf.fill(0x5A);
                    let released = self.released.lock().unwrap();
                    // Bounded so that a failing test cannot keep an I/O
                    // thread (and the pager's drop) forever.
                    let _ = self
                        .cv
                        .wait_timeout_while(released, Duration::from_secs(60), |r| !*r)
                        .unwrap();
                }
            }
        }
        self.inner.read_at(offset, buf)
    }
}

fn pager(delivery: Delivery) -> Pager {
    Pager::new(Config::default().delivery(delivery)).expect("Pager::new")
}

/// What a child prints right before the access that must fail.
const BEFORE_BAD: &str = "CHILD: good pages read, touching the bad page";

/// Runs test `name` as a child and asserts it died by SIGBUS after reading
/// its good pages, and did not hang.
#[track_caller]
fn assert_child_dies_of_sigbus(name: &str) {
    let limit = Duration::from_secs(40);
    let end = run_child(name, limit);
    let what = format!(
        "child {name}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        end.status, end.stdout, end.stderr
    );
    assert!(end.status.is_some(), "hung: killed after {limit:?}; {what}");
    assert!(
        end.stdout.contains(BEFORE_BAD),
        "the child did not reach the bad page; {what}"
    );
    assert_eq!(end.signal(), Some(SIGBUS), "expected SIGBUS; {what}");
}

/// The child's part: read `good` pages of `map` (checking them), then the
/// bad page, which must not return.
fn child_touches(map: &faultmap::Mapping, data: &[u8], good: &[usize], bad: usize) {
    for &p in good {
        let r = page_range(map, p);
        assert_bytes(&map[r.clone()], &data[r], &format!("good page {p}"));
    }
    println!("{BEFORE_BAD}");
    let v = touch(map, bad);
    println!("CHILD: the bad page read as {v:#04x}: no SIGBUS");
}

/// Two tests per scenario: signal delivery and handler threads.
macro_rules! both_deliveries {
    ($scenario:ident: $signal:ident, $handler:ident) => {
        #[test]
        fn $signal() {
            $scenario(Delivery::Signal, stringify!($signal));
        }
        #[test]
        fn $handler() {
            $scenario(Delivery::Handler, stringify!($handler));
        }
    };
}

// ---------------------------------------------------------------------------
// EIO.
// ---------------------------------------------------------------------------

fn eio_page(delivery: Delivery, name: &str) {
    let data = pattern(64 * PAGE, 900);
    let (store, data) = Faulty::mem(&data, [(21, Behaviour::Eio)]);
    if is_child(name) {
        let pager = pager(delivery);
        let map = pager
            .map_trusted(store, MapOptions::new().fault_around_order(4))
            .unwrap();
        return child_touches(&map, &data, &[0, 20, 22, 63], 21);
    }
    assert_child_dies_of_sigbus(name);
    watchdog(WATCHDOG, move || {
        let pager = pager(delivery);
        let object = pager.open(store).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(4))
            .unwrap();
        for p in (0..64).filter(|&p| p != 21) {
            let r = page_range(&map, p);
            assert_bytes(&map[r.clone()], &data[r], &format!("page {p}"));
        }
        let s = stats_when(|| map.stats(), |s| s.io_errors > 0);
        assert!(s.io_errors > 0, "{s:?}");
        // Every try of every failed request is counted: 2 retries each.
        assert_eq!(s.io_retries, 2 * s.io_errors, "{s:?}");
        let reports = object.io_errors();
        assert!(!reports.is_empty(), "no report");
        for r in &reports {
            assert_eq!(r.object, "faulty");
            assert_eq!(r.kind, IoErrorKind::Read);
            let page21 = 21 * PAGE as u64;
            assert!(
                r.offset <= page21 && page21 < r.offset + r.len,
                "the report does not cover the bad page: {r:?}"
            );
            assert!(r.message.contains("faulty"), "{r:?}");
        }
        assert_eq!(pager.io_errors(), reports, "the pager's log");
        assert_eq!(object.take_io_errors(), reports);
        assert!(object.io_errors().is_empty(), "take drains");
        assert!(
            !present_set(&map, 64).contains(&21),
            "the bad page is mapped"
        );
    });
}

both_deliveries!(eio_page: an_eio_page_raises_sigbus_signal, an_eio_page_raises_sigbus_handler);

// ---------------------------------------------------------------------------
// Retries.
// ---------------------------------------------------------------------------

fn retried(delivery: Delivery, _name: &str) {
    watchdog(WATCHDOG, move || {
        let data = pattern(32 * PAGE, 901);
        let (store, data) = Faulty::mem(
            &data,
            [(3, Behaviour::EioTimes(2)), (17, Behaviour::EioTimes(1))],
        );
        // Enough retries for both pages even if one request holds both
        // (it then fails three times: page 3 twice, page 17 once).
        let pager = Pager::new(Config::default().delivery(delivery).io_retries(3)).unwrap();
        let object = pager.open(store).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(0))
            .unwrap();
        assert_bytes(&map, &data, "every page, two of them retried");
        let s = map.stats();
        assert_eq!(s.io_errors, 0, "retries hide transient errors: {s:?}");
        assert_eq!(s.io_retries, 3, "{s:?}");
        assert_eq!(pager.stats().io_retries, 3);
        assert!(object.io_errors().is_empty(), "{:?}", object.io_errors());
    });
}

both_deliveries!(retried: transient_errors_are_retried_signal, transient_errors_are_retried_handler);

fn no_retries(delivery: Delivery, name: &str) {
    // With io_retries 0, a page that fails once is read alone once more
    // (the kernel's single-page retry), so failing twice is SIGBUS.
    let data = pattern(16 * PAGE, 902);
    let (store, data) = Faulty::mem(&data, [(5, Behaviour::EioTimes(2))]);
    if is_child(name) {
        let pager = Pager::new(Config::default().delivery(delivery).io_retries(0)).unwrap();
        let map = pager
            .map_trusted(store, MapOptions::new().fault_around_order(0))
            .unwrap();
        return child_touches(&map, &data, &[0, 4, 6], 5);
    }
    assert_child_dies_of_sigbus(name);
}

both_deliveries!(no_retries: without_retries_two_failures_raise_sigbus_signal, without_retries_two_failures_raise_sigbus_handler);

// ---------------------------------------------------------------------------
// Short reads.
// ---------------------------------------------------------------------------

fn short(delivery: Delivery, name: &str) {
    let data = pattern(32 * PAGE, 903);
    let (store, data) = Faulty::mem(&data, [(10, Behaviour::Short)]);
    if is_child(name) {
        let pager = pager(delivery);
        let map = pager
            .map_trusted(store, MapOptions::new().fault_around_order(3))
            .unwrap();
        return child_touches(&map, &data, &[0, 9, 11, 31], 10);
    }
    assert_child_dies_of_sigbus(name);
    watchdog(WATCHDOG, move || {
        let pager = pager(delivery);
        let object = pager.open(store).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(3))
            .unwrap();
        for p in (0..32).filter(|&p| p != 10) {
            let r = page_range(&map, p);
            assert_bytes(&map[r.clone()], &data[r], &format!("page {p}"));
        }
        let s = stats_when(|| map.stats(), |s| s.io_errors > 0);
        assert_eq!(s.io_retries, 0, "a short read is not retried: {s:?}");
        let reports = object.io_errors();
        assert!(
            reports.iter().any(|r| r.message.contains("short read")),
            "{reports:?}"
        );
        assert!(
            !present_set(&map, 32).contains(&10),
            "the short page is mapped"
        );
    });
}

both_deliveries!(short: a_short_read_raises_sigbus_signal, a_short_read_raises_sigbus_handler);

// ---------------------------------------------------------------------------
// Slow and hung stores.
// ---------------------------------------------------------------------------

fn slow(delivery: Delivery, _name: &str) {
    // A store slower than usual but within the timeout: no error at all.
    watchdog(WATCHDOG, move || {
        let data = pattern(8 * PAGE, 904);
        let (store, data) = Faulty::mem(&data, [(2, Behaviour::Delay(Duration::from_millis(50)))]);
        let pager = pager(delivery);
        let object = pager.open(store).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&map, &data, "a slow store");
        let s = pager.stats();
        assert_eq!((s.io_errors, s.io_timeouts), (0, 0), "{s:?}");
        assert!(object.io_errors().is_empty());
    });
}

both_deliveries!(slow: a_slow_store_is_no_error_signal, a_slow_store_is_no_error_handler);

/// The timeout applies to every read, the good pages' too: long enough
/// that a loaded machine does not time out a read of memory, short enough
/// for the test.
fn hung_config(delivery: Delivery) -> Config {
    Config::default()
        .delivery(delivery)
        .io_timeout(Duration::from_secs(2))
}

fn hung(delivery: Delivery, name: &str) {
    let data = pattern(16 * PAGE, 905);
    let (store, data) = Faulty::mem(&data, [(7, Behaviour::Hang)]);
    if is_child(name) {
        let pager = Pager::new(hung_config(delivery)).unwrap();
        let map = pager
            .map_trusted(store, MapOptions::new().fault_around_order(0))
            .unwrap();
        // One page per miss: no readahead window of a good page holds the
        // hanging one.
        map.advise(Advice::Random, 0..map.len()).unwrap();
        // The store never answers in the child: the fault must still end.
        return child_touches(&map, &data, &[0, 6, 8], 7);
    }
    assert_child_dies_of_sigbus(name);
    // In process: start the read without faulting on it, see it time out,
    // release the store, and the page reads fine.
    watchdog(WATCHDOG, move || {
        let pager = Pager::new(hung_config(delivery)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(0))
            .unwrap();
        map.advise(Advice::Random, 0..map.len()).unwrap();
        let r = page_range(&map, 7);
        map.advise(Advice::WillNeed, r.clone()).unwrap();
        assert!(
            wait_until(Duration::from_secs(30), || pager.stats().io_timeouts >= 1),
            "no timeout counted: {:?}",
            pager.stats()
        );
        let reports = pager.io_errors();
        let timeout = reports
            .iter()
            .find(|r| r.kind == IoErrorKind::Timeout)
            .unwrap_or_else(|| panic!("no Timeout report: {reports:?}"));
        assert_eq!(timeout.object, "faulty");
        assert_eq!(timeout.offset, 7 * PAGE as u64);
        assert!(!object.is_cached(7));
        // Other pages are served while the store hangs on page 7.
        let r6 = page_range(&map, 6);
        assert_bytes(&map[r6.clone()], &data[r6], "page 6 meanwhile");
        store.release();
        assert!(
            wait_until(Duration::from_secs(30), || object.is_cached(7)),
            "the released read did not end"
        );
        assert_bytes(&map[r.clone()], &data[r], "page 7 after the release");
        assert_bytes(&map, &data, "everything");
    });
}

both_deliveries!(hung: a_hung_store_times_out_with_sigbus_signal, a_hung_store_times_out_with_sigbus_handler);

// ---------------------------------------------------------------------------
// Truncation.
// ---------------------------------------------------------------------------

const TRUNC_PAGES: usize = 32;

fn truncated(delivery: Delivery, name: &str) {
    let file = TestFile::new(TRUNC_PAGES * PAGE, 906);
    let half = (TRUNC_PAGES / 2 * PAGE) as u64;
    let shrink = move |file: &TestFile| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file.path)
            .unwrap()
            .set_len(half)
            .unwrap();
    };
    if is_child(name) {
        let pager = pager(delivery);
        let object = pager.open(file.store()).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(4))
            .unwrap();
        // Everything cached and mapped first, then the file shrinks.
        assert_bytes(&map, &file.data, "before the truncation");
        shrink(&file);
        // The cached pages beyond the end go within a watchdog tick: not
        // cached (the drop froze them), then out of the memfd (it punched
        // them, which unmaps them everywhere).
        let beyond = TRUNC_PAGES / 2 + 3;
        let gone = wait_until(Duration::from_secs(20), || {
            let page = map[page_range(&map, beyond)].as_ptr();
            !object.is_cached(beyond as u64)
                && faultmap::measure::mincore_resident(page, PAGE).is_ok_and(|n| n == 0)
        });
        assert!(gone, "the pages beyond the new end were not dropped");
        return child_touches(&map, &file.data, &[0, TRUNC_PAGES / 2 - 1], beyond);
    }
    assert_child_dies_of_sigbus(name);
    watchdog(WATCHDOG, move || {
        let pager = pager(delivery);
        let object = pager.open(file.store()).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(4))
            .unwrap();
        assert_bytes(&map, &file.data, "before the truncation");
        shrink(&file);
        assert!(
            wait_until(Duration::from_secs(20), || {
                (TRUNC_PAGES / 2..TRUNC_PAGES).all(|p| !object.is_cached(p as u64))
            }),
            "cached pages beyond the new end are still cached"
        );
        let keep = half as usize;
        assert_bytes(&map[..keep], &file.data[..keep], "pages before the new end");
        assert_eq!(pager.stats().io_errors, 0);
    });
}

both_deliveries!(truncated: a_truncated_file_raises_sigbus_beyond_the_new_end_signal, a_truncated_file_raises_sigbus_beyond_the_new_end_handler);

fn truncated_uncached(delivery: Delivery, name: &str) {
    // Nothing cached yet: the read beyond the end comes back short.
    let file = TestFile::new(TRUNC_PAGES * PAGE, 907);
    if is_child(name) {
        let store = file.store();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file.path)
            .unwrap()
            .set_len((TRUNC_PAGES / 4 * PAGE) as u64)
            .unwrap();
        let pager = pager(delivery);
        let map = pager
            .map_trusted(store, MapOptions::new().fault_around_order(4))
            .unwrap();
        return child_touches(&map, &file.data, &[0, TRUNC_PAGES / 4 - 1], TRUNC_PAGES - 2);
    }
    assert_child_dies_of_sigbus(name);
}

both_deliveries!(truncated_uncached: a_file_truncated_before_its_reads_raises_sigbus_signal, a_file_truncated_before_its_reads_raises_sigbus_handler);
