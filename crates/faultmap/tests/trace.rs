//! Access traces through real mappings: recording the first-touch order
//! (both deliveries), replaying it as prefetch in order and a bounded
//! distance ahead, within a budget, and refusing a trace of another
//! object.

mod common;
use common::MapTrusted;

use std::sync::Arc;
use std::time::Duration;

use common::{touch, wait_until, watchdog, Faults, Instrumented, TestFile, PAGE, WATCHDOG};
use faultmap::{
    Config, Delivery, MapError, MapOptions, Mapping, Pager, ReadaheadMode, ReplayProgress, Trace,
    TraceError,
};

const SETTLE: Duration = Duration::from_secs(20);

/// Scattered pages in a fixed order, with two runs of neighbours.
const TOUCHES: &[u64] = &[50, 3, 4, 5, 200, 3, 50, 7, 120, 121, 6, 255];
/// `TOUCHES` as first touches: each page once, in order.
const FIRST: &[u64] = &[50, 3, 4, 5, 200, 7, 120, 121, 6, 255];

fn record(pager: &Pager, store: impl faultmap::IntoObject, order: u8) -> (Trace, Mapping) {
    let opts = MapOptions::new().fault_around_order(order).record_trace();
    let map = pager.map_trusted(store, opts).unwrap();
    for &p in TOUCHES {
        touch(&map, p as usize);
    }
    let trace = map.trace().expect("a recording mapping has a trace");
    (trace, map)
}

fn flat(trace: &Trace) -> Vec<u64> {
    trace.runs().iter().flat_map(|r| r.clone()).collect()
}

/// The progress once `cond` holds (or the limit passed).
fn progress_when(map: &Mapping, cond: impl Fn(&ReplayProgress) -> bool) -> ReplayProgress {
    let get = || map.replay_progress().expect("the mapping replays");
    wait_until(SETTLE, || cond(&get()));
    get()
}

#[test]
fn a_recording_mapping_logs_each_first_touch_in_order_in_both_deliveries() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(256 * PAGE, 91);
        for delivery in [Delivery::Signal, Delivery::Handler] {
            let pager = Pager::new(Config::default().delivery(delivery)).unwrap();
            // Order 9 asked: a recording mapping still maps one page per
            // fault, so the neighbours of 3 (4, 5) fault and are logged.
            let (trace, map) = record(&pager, file.store(), 9);
            assert_eq!(flat(&trace), FIRST, "{delivery:?}");
            assert_eq!(
                trace.runs(),
                &[50..51, 3..6, 200..201, 7..8, 120..122, 6..7, 255..256]
            );
            assert_eq!(trace.object_len(), file.data.len() as u64);
            assert!(trace.object_version().unwrap().starts_with("mtime "));
            let st = map.stats();
            assert_eq!(st.trace_recorded, FIRST.len() as u64, "{delivery:?}");
            assert_eq!(st.pgfault_around, 0, "order 0 while recording: {st:?}");
            for &p in FIRST {
                let at = p as usize * PAGE;
                assert_eq!(map[at..at + PAGE], file.data[at..at + PAGE], "page {p}");
            }
            // A mapping that does not record has no trace.
            let plain = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
            assert!(plain.trace().is_none());
        }
    });
}

#[test]
fn a_recording_at_an_offset_logs_object_pages() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(64 * PAGE, 92);
        let pager = Pager::new(Config::default()).unwrap();
        let opts = MapOptions::new()
            .offset(10 * PAGE as u64 + 100)
            .len(20 * PAGE as u64)
            .record_trace();
        let map = pager.map_trusted(file.store(), opts).unwrap();
        // Bytes 0 and PAGE * 3 of the mapping: object pages 10 and 13.
        assert_eq!(map[0], file.data[10 * PAGE + 100]);
        assert_eq!(map[3 * PAGE], file.data[13 * PAGE + 100]);
        assert_eq!(flat(&map.trace().unwrap()), [10, 13]);
    });
}

#[test]
fn a_replay_reads_the_trace_in_order_before_the_application_needs_it() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(256 * PAGE, 93);
        let recorder = Pager::new(Config::default()).unwrap();
        let (trace, map) = record(
            &recorder,
            Instrumented::mem(&file.data, Faults::default()),
            4,
        );
        drop(map);
        // Through a file, as a user would keep it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("touches.trace");
        trace.save(&path).unwrap();
        let trace = Trace::load(&path).unwrap();
        // The second run: a cold pager, one I/O thread (so that the store
        // sees the requests in the order they were submitted), no
        // readahead of its own.
        let store = Instrumented::mem(&file.data, Faults::default());
        let pager = Pager::new(Config::default().io_threads(1)).unwrap();
        let opts = MapOptions::new()
            .readahead(ReadaheadMode::Off)
            .replay_trace(trace.clone());
        let map = pager.map_trusted(store.clone(), opts).unwrap();
        let p = progress_when(&map, |p| p.done);
        assert_eq!((p.replayed, p.done), (FIRST.len() as u64, true), "{p:?}");
        // One request per run, in the trace's order.
        let reads: Vec<(u64, usize)> = wait_reads(&store, trace.runs().len());
        let want: Vec<(u64, usize)> = trace
            .runs()
            .iter()
            .map(|r| (r.start * PAGE as u64, (r.end - r.start) as usize * PAGE))
            .collect();
        assert_eq!(reads, want);
        // The application follows the trace: every page is a hit.
        for &p in TOUCHES {
            touch(&map, p as usize);
        }
        let st = map.stats();
        assert_eq!(st.pgmajfault, 0, "{st:?}");
        assert_eq!(st.trace_replayed, FIRST.len() as u64);
        for &p in FIRST {
            let at = p as usize * PAGE;
            assert_eq!(map[at..at + PAGE], file.data[at..at + PAGE], "page {p}");
        }
        store.assert_contract_kept();
    });
}

/// The store's reads once there are `n` of them (reads are asynchronous).
fn wait_reads(store: &Instrumented, n: usize) -> Vec<(u64, usize)> {
    wait_until(SETTLE, || store.reads.lock().unwrap().len() >= n);
    store.reads.lock().unwrap().clone()
}

#[test]
fn a_replay_stays_a_bounded_distance_ahead_of_the_application() {
    watchdog(WATCHDOG, || {
        // 64 single pages, scattered: one request each.
        let pages: Vec<u64> = (0..64u64).map(|i| (i * 37) % 512).collect();
        let opts = page_by_page(8);
        let Replaying { map, .. } = replaying(512, 94, &pages, Config::default(), opts);
        // Nothing touched: the replay goes 8 pages and waits.
        let p = progress_when(&map, |p| p.waiting);
        assert_eq!((p.replayed, p.used, p.waiting), (8, 0, true), "{p:?}");
        // The application uses the trace's first five pages: 8 more past
        // them.
        for &page in &pages[..5] {
            touch(&map, page as usize);
        }
        let p = progress_when(&map, |p| p.waiting && p.replayed == 13);
        assert_eq!((p.replayed, p.used), (13, 5), "{p:?}");
        // A page touched out of the trace's order gives the replay one
        // page of room and skips nothing.
        touch(&map, pages[40] as usize);
        let p = progress_when(&map, |p| p.waiting && p.replayed == 14);
        assert_eq!((p.replayed, p.used), (14, 6), "{p:?}");
        let read: Vec<u64> = pages[..14].iter().chain([&pages[40]]).copied().collect();
        let cached = || read.iter().all(|&p| map.object().is_cached(p));
        wait_until(SETTLE, cached);
        assert!(cached(), "the first 14 and the page touched are read");
        let all = (0..512).filter(|&p| map.object().is_cached(p)).count();
        assert_eq!(all, read.len(), "nothing else is read");
        // A mapping dropped while its replay waits lets it go.
        drop(map);
    });
}

/// A trace of `pages` (in this order) on `store`'s object, recorded by a
/// mapping of it.
fn trace_of(store: &Arc<Instrumented>, pages: &[u64]) -> Trace {
    let pager = Pager::new(Config::default()).unwrap();
    let opts = MapOptions::new().record_trace();
    let map = pager.map_trusted(store.clone(), opts).unwrap();
    for &p in pages {
        touch(&map, p as usize);
    }
    let trace = map.trace().unwrap();
    assert_eq!(flat(&trace), pages);
    // The recording's reads (its readahead included) end with its pager.
    drop(map);
    drop(pager);
    store.reads.lock().unwrap().clear();
    trace
}

/// A replay that reads page by page (readahead off), faults that map one
/// page each, and `ahead` pages of room: the pacing in plain numbers.
fn page_by_page(ahead: u64) -> MapOptions {
    MapOptions::new()
        .readahead(ReadaheadMode::Off)
        .fault_around_order(0)
        .replay_ahead(ahead)
}

/// A replay under test: a cold pager's mapping of an object of pattern
/// bytes that replays the trace of `pages`, recorded on it first.
struct Replaying {
    map: Mapping,
    pager: Pager,
    store: Arc<Instrumented>,
    data: Vec<u8>,
}

/// [`Replaying`] of an `object_pages`-page object (pattern `seed`) with
/// `config` and `opts` (the trace added).
fn replaying(
    object_pages: usize,
    seed: u64,
    pages: &[u64],
    config: Config,
    opts: MapOptions,
) -> Replaying {
    let data = common::pattern(object_pages * PAGE, seed);
    let store = Instrumented::mem(&data, Faults::default());
    let trace = trace_of(&store, pages);
    let pager = Pager::new(config).unwrap();
    let map = pager
        .map_trusted(store.clone(), opts.replay_trace(trace))
        .unwrap();
    Replaying {
        map,
        pager,
        store,
        data,
    }
}

#[test]
fn a_replay_under_a_budget_reads_at_most_a_quarter_of_it_ahead() {
    watchdog(WATCHDOG, || {
        // A 1 MiB budget (256 pages): the replay goes at most 64 pages
        // ahead, whatever it asked for.
        let pages: Vec<u64> = (0..400u64).map(|i| (i * 13) % 1024).collect();
        let config = Config::default().memory_budget(1 << 20);
        let opts = MapOptions::new()
            .readahead(ReadaheadMode::Off)
            .replay_ahead(100_000);
        let Replaying { map, pager, .. } = replaying(1024, 95, &pages, config, opts);
        let p = progress_when(&map, |p| p.waiting);
        assert_eq!((p.replayed, p.waiting), (64, true), "{p:?}");
        for &page in &pages {
            touch(&map, page as usize);
        }
        let p = progress_when(&map, |p| p.done);
        assert!(p.done, "{p:?}");
        // The budget's own contract (tests/budget.rs): a page a fault waits
        // for is charged even at the limit, one per fault in flight.
        let peak = pager.memory().peak;
        assert!(
            peak <= (1 << 20) + 8 * PAGE as u64,
            "peak {peak} over the budget"
        );
    });
}

#[test]
fn a_trace_of_another_object_or_version_is_refused() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(256 * PAGE, 96);
        let pager = Pager::new(Config::default()).unwrap();
        let (trace, map) = record(&pager, file.store(), 0);
        drop(map);
        // Another length.
        let other = TestFile::new(257 * PAGE, 96);
        let e = pager
            .map_trusted(other.store(), MapOptions::new().replay_trace(trace.clone()))
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, MapError::Trace(TraceError::Mismatch { .. })),
            "{e:?}"
        );
        assert!(
            msg.contains("1048576 bytes") && msg.contains("1052672 bytes"),
            "{msg}"
        );
        // The same file, modified since: another version.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&file.path)
            .unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))
            .unwrap();
        drop(f);
        let e = pager
            .map_trusted(file.store(), MapOptions::new().replay_trace(trace.clone()))
            .unwrap_err();
        assert!(e.to_string().contains("mtime 1000000.000000000"), "{e}");
        // A store without a version: refused too.
        let mem = faultmap::MemStore::new("mem", file.data.clone());
        let e = pager
            .map_trusted(mem, MapOptions::new().replay_trace(trace))
            .unwrap_err();
        assert!(e.to_string().contains("no version"), "{e}");
        // A bad distance.
        let e = MapOptions::new().replay_ahead(0).validate().unwrap_err();
        assert!(e.to_string().contains("replay_ahead"), "{e}");
    });
}

#[test]
fn a_replay_reads_only_the_mappings_pages_of_the_trace() {
    watchdog(WATCHDOG, || {
        // Pages 0..100 (outside the mapping below), then 300..310 (inside).
        let pages: Vec<u64> = (0..100).chain(300..310).collect();
        let opts = MapOptions::new()
            .offset(256 * PAGE as u64)
            .readahead(ReadaheadMode::Off)
            .replay_ahead(16);
        let Replaying {
            map, store, data, ..
        } = replaying(512, 97, &pages, Config::default(), opts);
        // The schedule is the mapping's ten pages alone, read before any
        // touch: what lies outside the mapping takes no room.
        let p = progress_when(&map, |p| p.done);
        assert_eq!((p.pages, p.replayed, p.done), (10, 10, true), "{p:?}");
        let reads = wait_reads(&store, 1);
        assert_eq!(reads, [(300 * PAGE as u64, 10 * PAGE)]);
        for page in 300..310 {
            let at = (page - 256) * PAGE;
            assert_eq!(map[at..at + PAGE], data[page * PAGE..(page + 1) * PAGE]);
        }
        assert_eq!(map.stats().pgmajfault, 0);
    });
}

#[test]
fn pieces_the_application_skips_do_not_hold_the_replay_back() {
    watchdog(WATCHDOG, || {
        // 64 single pages; the replay may go 8 past what was used.
        let pages: Vec<u64> = (0..64u64).map(|i| (i * 37) % 512).collect();
        let opts = page_by_page(8);
        let Replaying { map, .. } = replaying(512, 92, &pages, Config::default(), opts);
        progress_when(&map, |p| p.waiting);
        // The application skips the trace's pages 1 to 8, which the replay
        // read, and follows the rest: once it has used 8 pages more, the
        // skipped ones stop holding the room, and the replay goes on 8
        // past what it used.
        touch(&map, pages[0] as usize);
        for &page in &pages[9..32] {
            touch(&map, page as usize);
        }
        let next = || pages[32..40].iter().all(|&p| map.object().is_cached(p));
        wait_until(SETTLE, next);
        assert!(next(), "{:?}", map.replay_progress());
        let p = progress_when(&map, |p| p.waiting && p.replayed == 40);
        assert_eq!((p.replayed, p.used), (40, 32), "{p:?}");
    });
}

#[test]
fn an_application_that_reads_the_trace_out_of_order_is_still_served_by_it() {
    watchdog(WATCHDOG, || {
        // 800 single pages; the replay may go 8 past what was used.
        let pages: Vec<u64> = (0..800u64).map(|i| (i * 7) % 4096).collect();
        let opts = page_by_page(8);
        let Replaying { map, .. } = replaying(4096, 98, &pages, Config::default(), opts);
        progress_when(&map, |p| p.waiting);
        // The last 200 first (as a second thread of the recording run
        // would read its part, or a reader that starts at an index): each
        // page used gives the replay room for one more of the first 600,
        // and the pieces of those it read and nobody used yet are taken
        // as skipped at most as fast as the faults come, so it goes no
        // further than twice the faults' pages.
        for &page in &pages[600..] {
            touch(&map, page as usize);
        }
        let p = progress_when(&map, |p| p.waiting && p.replayed >= 208);
        assert!(p.waiting && p.replayed >= 208, "{p:?}");
        assert!(p.replayed <= 2 * 200, "read too far ahead: {p:?}");
        let read = p.replayed as usize;
        let ahead = || pages[..read].iter().all(|&p| map.object().is_cached(p));
        wait_until(SETTLE, ahead);
        assert!(ahead(), "the replay read the first {read}");
        // So those are all hits.
        let before = map.stats().pgmajfault;
        for &page in &pages[..read] {
            touch(&map, page as usize);
        }
        assert_eq!(map.stats().pgmajfault, before);
        for &page in &pages[read..600] {
            touch(&map, page as usize);
        }
        let p = progress_when(&map, |p| p.done);
        assert_eq!((p.replayed, p.used, p.done), (800, 800, true), "{p:?}");
    });
}

#[test]
fn a_replay_goes_on_through_what_the_application_leaves_mapped() {
    watchdog(WATCHDOG, || {
        let pages: Vec<u64> = (0..256u64).rev().collect();
        let opts = MapOptions::new()
            .readahead(ReadaheadMode::Off)
            .replay_ahead(16);
        let Replaying { map, data, .. } = replaying(256, 99, &pages, Config::default(), opts);
        progress_when(&map, |p| p.waiting);
        // The application unmaps the second half of the mapping: the
        // replay goes on through the first, and the pages it can no
        // longer map are left out.
        let base = map.as_ptr() as usize;
        // SAFETY: the test's own mapping; nothing reads the unmapped half
        // again (the test never touches it).
        let rc = unsafe { libc::munmap((base + 128 * PAGE) as *mut libc::c_void, 128 * PAGE) };
        assert_eq!(rc, 0);
        for page in (0..128).rev() {
            let at = page * PAGE;
            assert_eq!(map[at..at + PAGE], data[at..at + PAGE], "page {page}");
        }
        let p = progress_when(&map, |p| p.done);
        assert!(p.done, "{p:?}");
        drop(map);
    });
}
