#![cfg(not(loom))]
// Lists of one range are lists of ranges here, not ranges made lists.
#![allow(clippy::single_range_in_vec_init)]
//! Batched prefetch (`Mapping::prefetch_ranges`, `Mapping::wait_ranges`):
//! the bytes, the coalescing across holes, pages already cached, the
//! memory budget, bad ranges, failures, and the cancellation when the
//! mapping closes, on instrumented stores that record every request.
//! The measured link of a real server and its holes: `tests/remote.rs`.

mod common;
use common::MapTrusted;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use faultmap::{Config, Link, MapError, MapOptions, Pager, ReadDone, Store, StoreError};

/// A store that reports a link (so that holes are merged) over an
/// instrumented one, whose requests it keeps.
struct Linked {
    inner: Arc<Instrumented>,
    link: Option<Link>,
    io_pages: u64,
}

impl Store for Linked {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn io_pages(&self) -> u64 {
        self.io_pages
    }
    fn link(&self) -> Option<Link> {
        self.link
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn start_read(&self, offset: u64, buf: faultmap::ReadBuf, done: ReadDone) {
        self.inner.start_read(offset, buf, done)
    }
}

/// A link whose hole limit is `pages` pages at the default depth (32):
/// a 32 ms latency at `pages` × 4 KiB per millisecond.
fn link_of(pages: u64) -> Link {
    Link {
        latency: Duration::from_millis(32),
        bytes_per_sec: pages * PAGE as u64 * 1000,
    }
}

/// The pages of byte `ranges`.
fn pages_of(ranges: &[Range<u64>]) -> Vec<u64> {
    let mut out: Vec<u64> = ranges
        .iter()
        .filter(|r| r.start < r.end)
        .flat_map(|r| r.start / PAGE as u64..r.end.div_ceil(PAGE as u64))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Rows: `n` ranges of `len` bytes, `stride` pages apart, from page 3,
/// each starting 100 bytes into its page (a row does not start on a page).
fn rows(n: u64, stride: u64, len: u64) -> Vec<Range<u64>> {
    (0..n)
        .map(|i| {
            let at = (3 + i * stride) * PAGE as u64 + 100;
            at..at + len
        })
        .collect()
}

#[test]
fn the_ranges_read_right_and_only_their_pages_are_read() {
    watchdog(WATCHDOG, || {
        let data = pattern(256 * PAGE + 77, 1);
        let store = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        // In no order, one overlapping another, one empty, one at the end.
        let ranges = vec![
            200 * PAGE as u64..200 * PAGE as u64 + 10,
            5 * PAGE as u64 + 4000..7 * PAGE as u64 + 1,
            6 * PAGE as u64..6 * PAGE as u64 + 5,
            9..9,
            data.len() as u64 - 3..data.len() as u64,
        ];
        let got = map.prefetch_ranges(&ranges).unwrap();
        map.wait_ranges(&ranges).unwrap();
        let want = pages_of(&ranges);
        assert_eq!(got.pages, want.len() as u64, "{got:?}");
        assert_eq!(got.hole_pages, 0, "a store without a link merges no hole");
        for &p in &want {
            assert!(object.is_cached(p), "page {p}");
        }
        // Nothing else was read: the readahead of an access did not run.
        let reads = store.page_reads();
        let read: Vec<u64> = (0..reads.len() as u64)
            .filter(|&p| reads[p as usize] > 0)
            .collect();
        assert_eq!(read, want);
        assert!(reads.iter().all(|&n| n <= 1), "a page read twice");
        for r in &ranges {
            let (a, b) = (r.start as usize, r.end as usize);
            assert_bytes(&map[a..b], &data[a..b], &format!("range {r:?}"));
        }
        // The touching pages 5..8 were one request; 200 and the last two more.
        assert_eq!(got.requests, 3, "{got:?}");
        store.assert_contract_kept();
    });
}

#[test]
fn holes_under_the_links_limit_are_read_in_one_request() {
    watchdog(WATCHDOG, || {
        let data = pattern(4096 * PAGE, 2);
        // 20 rows, 6 pages apart (a hole of 5 pages between them).
        let ranges = rows(20, 6, 200);
        for (hole, want_requests) in [(None, 20), (Some(4), 20), (Some(5), 1), (Some(64), 1)] {
            let inner = Instrumented::mem(&data, Faults::default());
            let store = Linked {
                inner: inner.clone(),
                link: hole.map(link_of),
                io_pages: 256,
            };
            let pager = Pager::new(Config::default()).unwrap();
            let object = pager.open(store).unwrap();
            let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
            let got = map.prefetch_ranges(&ranges).unwrap();
            map.wait_ranges(&ranges).unwrap();
            assert_eq!(got.hole_pages, hole.unwrap_or(0), "{got:?}");
            assert_eq!(got.requests, want_requests, "hole {hole:?}: {got:?}");
            let reads = inner.reads.lock().unwrap().clone();
            assert_eq!(
                reads.len() as u64,
                want_requests,
                "hole {hole:?}: {reads:?}"
            );
            if want_requests == 1 {
                // From the first row's page to the last's, holes and all.
                let last = 3 + 19 * 6;
                assert_eq!(
                    reads[0],
                    (3 * PAGE as u64, (last - 3 + 1) * PAGE),
                    "{reads:?}"
                );
            }
            for r in &ranges {
                let (a, b) = (r.start as usize, r.end as usize);
                assert_bytes(&map[a..b], &data[a..b], &format!("hole {hole:?}, {r:?}"));
            }
        }
    });
}

#[test]
fn a_merged_request_stops_at_the_stores_request_size() {
    watchdog(WATCHDOG, || {
        let data = pattern(1024 * PAGE, 3);
        let inner = Instrumented::mem(&data, Faults::default());
        // Every hole merges, but a request is at most 16 pages: rows 6
        // pages apart make requests of 3 rows (13 pages).
        let store = Linked {
            inner: inner.clone(),
            link: Some(link_of(1000)),
            io_pages: 16,
        };
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(store).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let ranges = rows(30, 6, 64);
        let got = map.prefetch_ranges(&ranges).unwrap();
        map.wait_ranges(&ranges).unwrap();
        assert_eq!(got.requests, 10, "{got:?}");
        let reads = inner.reads.lock().unwrap().clone();
        assert!(reads.iter().all(|&(_, len)| len <= 16 * PAGE), "{reads:?}");
        assert_eq!(reads.len(), 10, "{reads:?}");
    });
}

#[test]
fn pages_already_cached_are_not_read_again() {
    watchdog(WATCHDOG, || {
        let data = pattern(512 * PAGE, 4);
        let inner = Instrumented::mem(&data, Faults::default());
        let store = Linked {
            inner: inner.clone(),
            link: Some(link_of(64)),
            io_pages: 256,
        };
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(store).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let ranges = rows(16, 20, 300);
        map.prefetch_ranges(&ranges).unwrap();
        map.wait_ranges(&ranges).unwrap();
        let before = inner.reads.lock().unwrap().len();
        assert!(before > 0);
        let again = map.prefetch_ranges(&ranges).unwrap();
        map.wait_ranges(&ranges).unwrap();
        assert_eq!(again.requests, 0, "{again:?}");
        assert_eq!(inner.reads.lock().unwrap().len(), before);
        // A range half cached reads its other half only.
        let wide = [3 * PAGE as u64..400 * PAGE as u64];
        map.prefetch_ranges(&wide).unwrap();
        map.wait_ranges(&wide).unwrap();
        let counts = inner.page_reads();
        assert!(
            counts.iter().all(|&n| n <= 1),
            "a page read twice: {counts:?}"
        );
        assert_bytes(&map[..], &data, "the whole object");
    });
}

#[test]
fn a_batch_larger_than_the_budget_stays_within_it_and_reads_right() {
    const BUDGET: u64 = 256 * PAGE as u64;
    watchdog(WATCHDOG, || {
        let data = pattern(8192 * PAGE, 5);
        let inner = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default().memory_budget(BUDGET)).unwrap();
        let object = pager.open(inner.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        // 400 rows of 2 pages: 800 pages asked for, the budget 256.
        let ranges = rows(400, 10, 2 * PAGE as u64 - 200);
        map.prefetch_ranges(&ranges).unwrap();
        map.wait_ranges(&ranges).unwrap();
        let slack = 8 * PAGE as u64;
        assert!(
            pager.memory().peak <= BUDGET + slack,
            "{:?}",
            pager.memory()
        );
        for r in &ranges {
            let (a, b) = (r.start as usize, r.end as usize);
            assert_bytes(&map[a..b], &data[a..b], &format!("{r:?}"));
        }
        assert!(
            pager.memory().peak <= BUDGET + slack,
            "{:?}",
            pager.memory()
        );
    });
}

#[test]
fn a_range_outside_the_mapping_is_refused_and_nothing_is_read() {
    watchdog(WATCHDOG, || {
        let data = pattern(16 * PAGE, 6);
        let inner = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(inner.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let len = data.len() as u64;
        #[allow(clippy::reversed_empty_ranges)]
        for bad in [0..len + 1, 5..4, u64::MAX - 1..u64::MAX] {
            let e = map.prefetch_ranges(&[0..10, bad.clone()]).unwrap_err();
            assert!(matches!(e, MapError::Options(_)), "{bad:?}: {e}");
            let e = map.wait_ranges(std::slice::from_ref(&bad)).unwrap_err();
            assert!(matches!(e, MapError::Options(_)), "{bad:?}: {e}");
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(inner.reads.lock().unwrap().is_empty());
        // No range at all is nothing to do.
        assert_eq!(map.prefetch_ranges(&[]).unwrap().requests, 0);
        map.wait_ranges(&[]).unwrap();
    });
}

#[test]
fn a_page_that_cannot_be_read_is_an_error_from_the_wait() {
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 7);
        let inner = Instrumented::mem(&data, Faults::bad([20]));
        let config = Config::default().io_retries(1);
        let pager = Pager::new(config).unwrap();
        let object = pager.open(inner).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let ranges = [
            2 * PAGE as u64..3 * PAGE as u64,
            20 * PAGE as u64 + 9..20 * PAGE as u64 + 10,
        ];
        map.prefetch_ranges(&ranges).unwrap();
        match map.wait_ranges(&ranges) {
            Err(MapError::Read { .. }) => {}
            other => panic!("expected a read error, got {other:?}"),
        }
        // The good range is there.
        map.wait_ranges(&ranges[..1]).unwrap();
        assert_bytes(
            &map[2 * PAGE..3 * PAGE],
            &data[2 * PAGE..3 * PAGE],
            "page 2",
        );
    });
}

#[test]
fn closing_the_mapping_cancels_the_reads_not_yet_sent() {
    watchdog(WATCHDOG, || {
        let data = pattern(4096 * PAGE, 8);
        // Every read is held at the gate until the close has happened.
        let inner = Instrumented::mem(&data, Faults::gated(0..4096));
        // Each row its own request: no link, rows far apart.
        let config = Config::default().io_depth(2).io_threads(2);
        let bound = 2 + 2; // io_depth reads at the store, one per thread starting
        let pager = Pager::new(config).unwrap();
        let object = pager.open(inner.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let ranges = rows(400, 10, 100);
        let got = map.prefetch_ranges(&ranges).unwrap();
        assert_eq!(got.requests, 400, "{got:?}");
        assert!(inner.gate.wait_entered(1, Duration::from_secs(10)));
        drop(map);
        drop(object);
        inner.gate.open();
        // The queue empties at the close: the cache drains, and of the 400
        // requests only those begun by then reach the store.
        assert!(
            wait_until(Duration::from_secs(20), || pager.memory().cached == 0),
            "{:?}",
            pager.memory()
        );
        let sent = inner.reads.lock().unwrap().len();
        assert!(sent <= bound, "{sent} of 400 requests reached the store");
        assert!(
            pager.stats().io_cancelled >= 400 - bound as u64,
            "{:?}",
            pager.stats()
        );
    });
}

#[test]
fn under_a_budget_holes_never_take_the_room_of_the_rows() {
    const BUDGET: u64 = 256 * PAGE as u64;
    watchdog(WATCHDOG, || {
        let data = pattern(8192 * PAGE, 9);
        let inner = Instrumented::mem(&data, Faults::default());
        let store = Linked {
            inner: inner.clone(),
            link: Some(link_of(64)),
            io_pages: 256,
        };
        let pager = Pager::new(Config::default().memory_budget(BUDGET)).unwrap();
        let object = pager.open(store).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        // 400 one-page rows 10 pages apart: with their holes, 4000 pages.
        let ranges = rows(400, 10, 100);
        let got = map.prefetch_ranges(&ranges).unwrap();
        map.wait_ranges(&ranges).unwrap();
        assert_eq!(got.hole_pages, 0, "{got:?}");
        // Every page read is a row's (the evictor may take some of them
        // back since: the batch is larger than the budget).
        let rows_pages: std::collections::BTreeSet<u64> =
            ranges.iter().map(|r| r.start / PAGE as u64).collect();
        let read: Vec<u64> = inner
            .page_reads()
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(p, _)| p as u64)
            .collect();
        assert!(
            read.iter().all(|p| rows_pages.contains(p)),
            "a hole was read"
        );
        assert!(read.len() >= 100, "{} rows read", read.len());
        // Rows and holes that fit are still merged.
        let few = rows(8, 10, 100);
        let map2 = pager.map_trusted(&object, MapOptions::new()).unwrap();
        drop(map);
        object.invalidate(0..object.len()).unwrap();
        assert_eq!(map2.prefetch_ranges(&few).unwrap().hole_pages, 64);
    });
}

#[test]
fn a_failed_page_whose_retry_cannot_be_sent_is_not_waited_for() {
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 10);
        let inner = Instrumented::mem(&data, Faults::bad([20, 21, 22]));
        let pager = Pager::new(Config::default().io_retries(0)).unwrap();
        let object = pager.open(inner).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let rows = [16 * PAGE as u64..32 * PAGE as u64];
        map.prefetch_ranges(&rows).unwrap();
        assert!(matches!(map.wait_ranges(&rows), Err(MapError::Read { .. })));
        // The failed pages' part unmapped by the application: their retry
        // goes nowhere, and the wait says so at once (not after a timeout
        // per page).
        let at = map.as_ptr() as usize + 16 * PAGE;
        // SAFETY: pages 16..32 of the mapping, which nothing here uses
        // again (the mapping's drop unmaps only what is still its own).
        assert_eq!(unsafe { libc::munmap(at as *mut _, 16 * PAGE) }, 0);
        let started = std::time::Instant::now();
        // Left to the access (which would find the range unmapped), or, if
        // the pager has not handled the unmap yet, read once more and
        // failed again: either way at once.
        let again = map.wait_ranges(&rows);
        assert!(
            matches!(again, Ok(()) | Err(MapError::Read { .. })),
            "{again:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    });
}
