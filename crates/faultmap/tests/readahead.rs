//! Readahead through real mappings: the reference's worked examples
//! observed through the cache and the statistics, on real files and on
//! stores that count their reads.
//!
//! Every test uses `ra_pages(32)` (the kernel's default window), so the
//! numbers are those of kernel-mechanisms.md §2 whatever this machine's
//! disk says, and fault-around order 0 where a test counts faults, so that
//! each touch is one fault.

mod common;
use common::MapTrusted;

use std::sync::Arc;
use std::time::Duration;

use common::{
    pattern, read_byte, touch, wait_until, watchdog, Faults, Gate, Instrumented, PAGE, WATCHDOG,
};
use faultmap::{
    Advice, Config, MapOptions, Mapping, Object, Pager, ReadaheadMode, Store, StoreError,
};

const SETTLE: Duration = Duration::from_secs(20);

fn opts(order: u8) -> MapOptions {
    MapOptions::new().fault_around_order(order).ra_pages(32)
}

/// The cached pages of `object` in `range`, once the reads in flight have
/// ended (up to a limit).
fn cached(object: &Object, range: std::ops::Range<u64>) -> Vec<u64> {
    range.filter(|&p| object.is_cached(p)).collect()
}

/// Waits until exactly `want` is cached in `range` (reads are asynchronous).
#[track_caller]
fn expect_cached(object: &Object, range: std::ops::Range<u64>, want: &[u64]) {
    wait_until(SETTLE, || cached(object, range.clone()) == want);
    assert_eq!(cached(object, range), want);
}

fn span(r: std::ops::Range<u64>) -> Vec<u64> {
    r.collect()
}

#[test]
fn read_around_then_async_readahead_at_the_marker() {
    watchdog(WATCHDOG, || {
        let file = common::TestFile::new(1024 * PAGE, 31);
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(file.store()).unwrap();
        let map = pager.map_trusted(&object, opts(0)).unwrap();
        // A miss at page 300, no history: read-around [284..315], marker 308.
        assert_eq!(touch(&map, 300), file.data[300 * PAGE]);
        expect_cached(&object, 200..400, &span(284..316));
        let st = object.ra_state();
        assert_eq!((st.start, st.size, st.async_size), (284, 32, 8));
        let ra = object.ra_stats();
        assert_eq!((ra.around.ra_count, ra.around.sync_count), (1, 1));
        // Touching the marker starts the next window, [316..347], async.
        touch(&map, 308);
        expect_cached(&object, 200..400, &span(284..348));
        let ra = object.ra_stats();
        assert_eq!(ra.subsequent.ra_count, 1);
        assert_eq!(ra.subsequent.sync_count, 0, "the marker's window is async");
        let st = object.ra_state();
        assert_eq!((st.start, st.size, st.async_size), (316, 32, 32));
        // Only the demand page was asked for: 63 pages were read ahead.
        assert_eq!(ra.read_ahead_pages, 63);
    });
}

#[test]
fn a_sequential_scan_ramps_the_window_up() {
    watchdog(WATCHDOG, || {
        let file = common::TestFile::new(512 * PAGE, 32);
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(file.store()).unwrap();
        let map = pager.map_trusted(&object, opts(0)).unwrap();
        let mut sizes = Vec::new();
        for p in 0..200 {
            assert_eq!(touch(&map, p), file.data[p * PAGE], "page {p}");
            // Let the async window land before the next touch, so that the
            // ramp is the policy's, not the disk's.
            wait_until(SETTLE, || object.is_cached(p as u64 + 1));
            let size = object.ra_state().size;
            if sizes.last() != Some(&size) {
                sizes.push(size);
            }
        }
        assert_eq!(
            sizes[..4],
            [4, 8, 16, 32],
            "init_size/next_size ramp: {sizes:?}"
        );
        assert!(sizes[4..].iter().all(|&s| s == 32), "{sizes:?}");
        let ra = object.ra_stats();
        assert_eq!(ra.initial.ra_count, 1);
        assert!(ra.subsequent.ra_count >= 6, "{ra:?}");
        // A sequential reader uses every page read ahead.
        assert_eq!(
            ra.read_ahead_used,
            ra.read_ahead_pages.min(ra.read_ahead_used)
        );
        common::assert_bytes(&map[..200 * PAGE], &file.data[..200 * PAGE], "the scan");
    });
}

#[test]
fn random_advice_reads_one_page_per_miss() {
    watchdog(WATCHDOG, || {
        let data = pattern(256 * PAGE, 33);
        let store = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default()).unwrap();
        let map = pager.map_trusted(store.clone(), opts(4)).unwrap();
        map.advise(Advice::Random, 0..map.len()).unwrap();
        for p in [200, 3, 77, 150] {
            assert_eq!(read_byte(&map, p * PAGE + 1), data[p * PAGE + 1]);
        }
        let reads = store.reads.lock().unwrap().clone();
        assert_eq!(reads.len(), 4, "{reads:?}");
        assert!(reads.iter().all(|&(_, len)| len == PAGE), "{reads:?}");
        assert_eq!(map.object().ra_stats().random.ra_count, 4);
    });
}

#[test]
fn sequential_advice_reads_full_windows_without_a_marker() {
    watchdog(WATCHDOG, || {
        let data = pattern(1024 * PAGE, 34);
        let store = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager.map_trusted(&object, opts(0)).unwrap();
        map.advise(Advice::Sequential, 0..map.len()).unwrap();
        for (p, window) in [(300, 300..332), (340, 340..372), (380, 380..412)] {
            touch(&map, p);
            wait_until(SETTLE, || window.clone().all(|q| object.is_cached(q)));
            assert!(window.clone().all(|q| object.is_cached(q)), "page {p}");
        }
        assert_eq!(cached(&object, 0..1024).len(), 3 * 32);
        assert_eq!(object.ra_state().async_size, 0, "no marker");
    });
}

#[test]
fn the_mmap_miss_throttle_stops_read_around() {
    watchdog(WATCHDOG, || {
        let data = pattern(16384 * PAGE, 35);
        let store = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager.map_trusted(&object, opts(0)).unwrap();
        // Misses 64 pages apart: every read-around window is new, no hits.
        for i in 1..150u64 {
            let p = (i * 97 % 250 + 1) * 64;
            touch(&map, p as usize);
        }
        let ra = object.ra_stats();
        // About 100 read-arounds, then single pages.
        assert!((99..=102).contains(&ra.around.ra_count), "{ra:?}");
        assert!(ra.random.ra_count >= 40, "{ra:?}");
        assert!(object.ra_state().mmap_miss > 100);
    });
}

#[test]
fn around_only_mode_never_reads_ahead_asynchronously() {
    watchdog(WATCHDOG, || {
        let data = pattern(2048 * PAGE, 36);
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager
            .open(faultmap::MemStore::new("m", data.clone()))
            .unwrap();
        let map = pager
            .map_trusted(&object, opts(4).readahead(ReadaheadMode::AroundOnly))
            .unwrap();
        common::assert_bytes(&map[..], &data, "the whole object");
        let ra = object.ra_stats();
        assert_eq!(
            ra.subsequent.ra_count + ra.marker.ra_count + ra.initial.ra_count,
            0,
            "{ra:?}"
        );
        assert!(ra.around.ra_count > 0);
        assert_eq!(
            ra.all.sync_count, ra.all.ra_count,
            "every window is a miss's"
        );
    });
}

/// Two faults on pages of one window whose read is in flight: the window
/// is read once, the second fault waits for it.
#[test]
fn faults_on_a_window_in_flight_issue_one_read() {
    watchdog(WATCHDOG, || {
        let data = pattern(256 * PAGE, 37);
        let store = Instrumented::mem(&data, Faults::gated([100]));
        let pager = Pager::new(Config::default().handler_threads(2)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let a = Arc::new(pager.map_trusted(&object, opts(0)).unwrap());
        let b = Arc::new(pager.map_trusted(&object, opts(0)).unwrap());
        let ta = spawn_touch(&a, 100);
        assert!(store.gate.wait_entered(1, SETTLE));
        let tb = spawn_touch(&b, 101);
        assert!(wait_until(SETTLE, || object.stats().fault_wait >= 1));
        store.gate.open();
        assert_eq!(ta.join().unwrap(), data[100 * PAGE]);
        assert_eq!(tb.join().unwrap(), data[101 * PAGE]);
        let counts = store.page_reads();
        assert!(
            counts.iter().all(|&c| c <= 1),
            "a page was read twice: {counts:?}"
        );
        store.assert_contract_kept();
    });
}

fn spawn_touch(map: &Arc<Mapping>, page: usize) -> std::thread::JoinHandle<u8> {
    let map = map.clone();
    std::thread::spawn(move || touch(&map, page))
}

/// A store whose every request takes `delay`.
struct Slow {
    inner: faultmap::MemStore,
    delay: Duration,
}

impl Store for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn io_pages(&self) -> u64 {
        32
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        self.inner.read_at(offset, buf)
    }
}

/// With a slow store, async readahead keeps a sequential reader ahead of
/// the store: far fewer of its faults wait for I/O than with read-around
/// alone. Asserted on the counts of waits, not on time.
#[test]
fn async_readahead_hides_a_slow_stores_latency() {
    watchdog(WATCHDOG, || {
        let data = pattern(2048 * PAGE, 38);
        let waits = |mode: ReadaheadMode| {
            let pager = Pager::new(Config::default()).unwrap();
            let store = Slow {
                inner: faultmap::MemStore::new("m", data.clone()),
                delay: Duration::from_millis(2),
            };
            let map = pager.map_trusted(store, opts(4).readahead(mode)).unwrap();
            for p in 0..2048 {
                assert_eq!(touch(&map, p), data[p * PAGE]);
                // The reader does some work per page, as readers do.
                std::thread::sleep(Duration::from_micros(100));
            }
            let s = map.stats();
            s.pgmajfault + s.fault_wait
        };
        let full = waits(ReadaheadMode::Full);
        let around = waits(ReadaheadMode::AroundOnly);
        assert!(
            full * 3 < around,
            "blocking waits: full readahead {full}, read-around only {around}"
        );
    });
}

#[test]
fn will_need_reads_the_range_in_the_background() {
    watchdog(WATCHDOG, || {
        let data = pattern(512 * PAGE, 39);
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager
            .open(faultmap::MemStore::new("m", data.clone()))
            .unwrap();
        let map = pager.map_trusted(&object, opts(4)).unwrap();
        map.advise(Advice::WillNeed, 100 * PAGE..200 * PAGE)
            .unwrap();
        expect_cached(&object, 0..512, &span(100..200));
        assert_eq!(map.stats().pgfault, 0, "nothing faulted");
        common::assert_bytes(
            &map[100 * PAGE..200 * PAGE],
            &data[100 * PAGE..200 * PAGE],
            "range",
        );
        assert_eq!(map.stats().pgmajfault, 0, "the range was cached");
    });
}

#[test]
fn dont_need_unmaps_but_keeps_the_cache() {
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 40);
        let store = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default()).unwrap();
        let map = pager.map_trusted(store.clone(), opts(4)).unwrap();
        common::assert_bytes(&map[..], &data, "first read");
        let reads = store.reads.lock().unwrap().len();
        map.advise(Advice::DontNeed, 0..map.len()).unwrap();
        assert!(common::present_set(&map, 64).is_empty(), "still mapped");
        common::assert_bytes(&map[..], &data, "second read");
        assert_eq!(
            store.reads.lock().unwrap().len(),
            reads,
            "the second read did I/O"
        );
        let s = map.stats();
        assert!(s.pgfault > 0);
    });
}

#[test]
fn advice_outside_the_mapping_is_refused() {
    let pager = Pager::new(Config::default()).unwrap();
    let map = pager
        .map_trusted(faultmap::MemStore::new("m", vec![1u8; 3 * PAGE]), opts(4))
        .unwrap();
    assert!(map.advise(Advice::Random, 0..3 * PAGE + 1).is_err());
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = 10..5;
    assert!(map.advise(Advice::Random, backwards).is_err());
    assert!(map.advise(Advice::WillNeed, 0..0).is_ok());
}

// ---------------------------------------------------------------------------
// Regressions found in review.
// ---------------------------------------------------------------------------

/// A store that says "no limit" for its request size (`u64::MAX`) must not
/// make the request split overflow (a panicking handler, or an endless loop).
#[test]
fn a_store_with_no_request_limit_is_served() {
    struct Unlimited(faultmap::MemStore);
    impl Store for Unlimited {
        fn name(&self) -> &str {
            "unlimited"
        }
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn io_pages(&self) -> u64 {
            u64::MAX
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
            self.0.read_at(offset, buf)
        }
    }
    watchdog(WATCHDOG, || {
        let data = pattern(1024 * PAGE, 41);
        let pager = Pager::new(Config::default()).unwrap();
        let store = Unlimited(faultmap::MemStore::new("m", data.clone()));
        let map = pager.map_trusted(store, opts(4)).unwrap();
        assert_eq!(touch(&map, 300), data[300 * PAGE]);
        common::assert_bytes(&map[..], &data, "everything");
    });
}

/// A mapping that does not run async readahead (here `MADV_RANDOM`) must
/// leave the readahead marker it touches to the mappings that do.
#[test]
fn a_random_mapping_leaves_the_marker_to_the_stream() {
    watchdog(WATCHDOG, || {
        let data = pattern(1024 * PAGE, 42);
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager
            .open(faultmap::MemStore::new("m", data.clone()))
            .unwrap();
        let a = pager.map_trusted(&object, opts(0)).unwrap();
        let b = pager.map_trusted(&object, opts(0)).unwrap();
        b.advise(Advice::Random, 0..b.len()).unwrap();
        touch(&a, 300);
        expect_cached(&object, 200..400, &span(284..316));
        touch(&b, 308); // the marker, through the random mapping: left alone
        touch(&a, 308); // the stream reaches its marker: the next window
        expect_cached(&object, 200..400, &span(284..348));
        assert_eq!(object.ra_stats().subsequent.ra_count, 1);
    });
}

/// A store whose every request takes time, counting how many are in
/// flight at once.
struct Gauge {
    inner: faultmap::MemStore,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Store for Gauge {
    fn name(&self) -> &str {
        "gauge"
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn io_pages(&self) -> u64 {
        32
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        let r = self.inner.read_at(offset, buf);
        self.now.fetch_sub(1, SeqCst);
        r
    }
}

/// A sequential reader that catches up with its readahead parks on the
/// next window's marker while that page is still being read; as in the
/// kernel (PG_readahead is set when the folio is allocated, before the
/// I/O), that fault must already start the window after, so that two
/// windows are in flight and the store's latency overlaps.
#[test]
fn a_reader_waiting_on_the_marker_starts_the_next_window() {
    watchdog(WATCHDOG, || {
        let data = pattern(1024 * PAGE, 43);
        let store = Arc::new(Gauge {
            inner: faultmap::MemStore::new("m", data.clone()),
            now: 0.into(),
            most: 0.into(),
        });
        let pager = Pager::new(Config::default()).unwrap();
        let map = pager.map_trusted(store.clone(), opts(4)).unwrap();
        for p in 0..1024 {
            assert_eq!(touch(&map, p), data[p * PAGE]);
        }
        let most = store.most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            most >= 2,
            "at most {most} store request(s) in flight: windows were serialised"
        );
    });
}

/// A store that records the order of its requests, and holds them at a
/// gate until it opens.
struct Ordered {
    inner: faultmap::MemStore,
    order: std::sync::Mutex<Vec<u64>>,
    gate: Gate,
}

impl Store for Ordered {
    fn name(&self) -> &str {
        "ordered"
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn io_pages(&self) -> u64 {
        8
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.order.lock().unwrap().push(offset / PAGE as u64);
        self.gate.pass();
        self.inner.read_at(offset, buf)
    }
}

/// A fault that waits for a page whose read is still queued behind a long
/// readahead backlog gets that read moved up, instead of waiting for the
/// whole queue (the kernel's waiter sleeps on that folio's own lock).
#[test]
fn a_fault_promotes_its_queued_read() {
    watchdog(WATCHDOG, || {
        let data = pattern(1024 * PAGE, 44);
        let store = Arc::new(Ordered {
            inner: faultmap::MemStore::new("m", data.clone()),
            order: std::sync::Mutex::new(Vec::new()),
            gate: Gate::default(),
        });
        let io_threads = 4;
        let pager = Pager::new(Config::default().io_threads(io_threads)).unwrap();
        let opts = MapOptions::new().fault_around_order(0).ra_pages(1024);
        let map = pager.map_trusted(store.clone(), opts).unwrap();
        let object = map.object().clone();
        // 128 requests of 8 pages queued at once; the I/O threads hold the
        // first ones at the gate.
        map.advise(Advice::WillNeed, 0..map.len()).unwrap();
        assert!(store
            .gate
            .wait_entered(io_threads as u64, Duration::from_secs(20)));
        std::thread::scope(|s| {
            let toucher = s.spawn(|| touch(&map, 1020));
            // The fault parked on page 1020's queued read, after moving it
            // up (`fault_wait` is counted after the promotion).
            assert!(
                wait_until(Duration::from_secs(20), || object.stats().fault_wait >= 1),
                "the fault did not wait for the queued read"
            );
            store.gate.open();
            assert_eq!(toucher.join().unwrap(), data[1020 * PAGE]);
        });
        let order = store.order.lock().unwrap().clone();
        let at = order
            .iter()
            .position(|&first| (first..first + 8).contains(&1020))
            .expect("page 1020 was read");
        // The gated reads, then the I/O threads take the next ones at
        // once: the promoted read among them.
        assert!(
            at < 2 * io_threads,
            "the faulting page's read ran {at}th of {}",
            order.len()
        );
    });
}

/// A store that asks for a smaller read-around window than its readahead
/// window, as a remote one does: `around` of `ra` pages.
struct Narrow {
    inner: Arc<Instrumented>,
    ra: u64,
    around: u64,
}

impl Store for Narrow {
    fn name(&self) -> &str {
        "narrow"
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn ra_pages(&self) -> u64 {
        self.ra
    }
    fn around_pages(&self) -> Option<u64> {
        Some(self.around)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
}

/// The pages of each read-around request, in order (one request per miss
/// here: the windows are below `io_pages`).
fn request_pages(store: &Instrumented) -> Vec<usize> {
    store
        .reads
        .lock()
        .unwrap()
        .iter()
        .map(|&(_, len)| len.div_ceil(PAGE))
        .collect()
}

#[test]
fn sparse_random_misses_shrink_the_read_around_window_and_dense_ones_grow_it() {
    watchdog(WATCHDOG, || {
        // Sparse: 60 misses 257 pages apart in a 64 MiB object, one page
        // used of each: the window falls from 128 pages to 16.
        let data = pattern(16384 * PAGE, 41);
        let inner = Instrumented::mem(&data, Faults::default());
        let pager = Pager::new(Config::default()).unwrap();
        let store = Narrow {
            inner: inner.clone(),
            ra: 1024,
            around: 128,
        };
        let object = pager.open(store).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().ra_pages(1024))
            .unwrap();
        for i in 0..60usize {
            let page = 600 + i * 257;
            assert_eq!(read_byte(&map, page * PAGE + 5), data[page * PAGE + 5]);
        }
        let sizes = request_pages(&inner);
        assert_eq!(sizes[0], 128, "{sizes:?}");
        assert_eq!(*sizes.last().unwrap(), 16, "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[1] <= w[0]), "{sizes:?}");
        assert_eq!(object.ra_state().around, 16);
        drop((map, object));

        // Dense: at 8 places far apart, a miss, then the 128 pages around
        // it touched (rows near each other): the window's pages are used,
        // and it grows past the store's 128 pages (to 256, where the
        // 128 pages touched are half of it).
        let inner = Instrumented::mem(&data, Faults::default());
        let store = Narrow {
            inner: inner.clone(),
            ra: 1024,
            around: 128,
        };
        let object = pager.open(store).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().ra_pages(1024))
            .unwrap();
        for k in 0..8usize {
            let center = 1000 + k * 1900;
            assert_eq!(read_byte(&map, center * PAGE), data[center * PAGE]);
            for page in center - 64..center + 64 {
                assert_eq!(read_byte(&map, page * PAGE + 1), data[page * PAGE + 1]);
            }
        }
        let around = object.ra_state().around;
        assert!(around > 128, "{around} {:?}", request_pages(&inner));
        inner.assert_contract_kept();
    });
}
