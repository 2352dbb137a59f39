//! Errors: bad input gives the specific typed error and maps nothing; a page
//! the store cannot read gives the faulting access SIGBUS, never zeros and
//! never a hang.
//!
//! The SIGBUS tests re-execute this test binary to run one test as a child
//! process (`common::run_child`); the child touches the bad page, and the
//! parent asserts how it died.

mod common;
use common::MapTrusted;

use std::time::Duration;

use common::*;
use faultmap::{
    Config, ConfigError, FileStore, MapError, MapOptions, Pager, PagerError, StoreError,
};

fn pager() -> Pager {
    Pager::new(Config::default()).expect("Pager::new")
}

// ---------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------

#[test]
fn a_missing_file_is_an_open_error() {
    watchdog(WATCHDOG, || {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-file");
        match FileStore::open(&path) {
            Err(StoreError::Open { path: p, source }) => {
                assert_eq!(p, path);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected StoreError::Open, got {other:?}"),
        }
    });
}

#[test]
fn a_directory_is_not_a_file() {
    watchdog(WATCHDOG, || {
        let dir = tempfile::tempdir().unwrap();
        match FileStore::open(dir.path()) {
            Err(StoreError::NotAFile { kind, path }) => {
                assert_eq!(kind, "directory");
                assert_eq!(path, dir.path());
            }
            other => panic!("expected StoreError::NotAFile, got {other:?}"),
        }
    });
}

#[test]
fn a_fifo_is_not_a_file_and_opening_it_does_not_block() {
    // A FIFO opened for reading blocks until a writer comes: the watchdog
    // turns that into a failure.
    watchdog(Duration::from_secs(20), || {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(status.success(), "mkfifo failed");
        match FileStore::open(&fifo) {
            Err(StoreError::NotAFile { kind, .. }) => assert_eq!(kind, "FIFO"),
            other => panic!("expected StoreError::NotAFile, got {other:?}"),
        }
    });
}

#[test]
fn a_device_is_not_a_file() {
    watchdog(WATCHDOG, || match FileStore::open("/dev/null") {
        Err(StoreError::NotAFile { kind, .. }) => assert_eq!(kind, "device"),
        other => panic!("expected StoreError::NotAFile, got {other:?}"),
    });
}

#[test]
fn offsets_and_lengths_past_the_end_are_refused() {
    watchdog(WATCHDOG, || {
        let pager = pager();
        let size = 3 * PAGE as u64 + 10;
        let file = TestFile::new(size as usize, 800);
        let object = pager.open(file.store()).unwrap();
        // At the end is an empty mapping (like a zero length); past it is refused.
        let at_end = pager
            .map_trusted(&object, MapOptions::new().offset(size))
            .unwrap();
        assert!(at_end.is_empty());
        drop(at_end);
        for offset in [size + 1, 1 << 40, u64::MAX] {
            match pager.map_trusted(&object, MapOptions::new().offset(offset)) {
                Err(MapError::Options(ConfigError::OffsetPastEnd {
                    offset: o,
                    object_len,
                })) => {
                    assert_eq!((o, object_len), (offset, size));
                }
                other => panic!("offset {offset}: expected OffsetPastEnd, got {other:?}"),
            }
        }
        for (offset, len) in [
            (0, size + 1),
            (1, size),
            (size - 1, 2),
            (PAGE as u64, u64::MAX),
        ] {
            match pager.map_trusted(&object, MapOptions::new().offset(offset).len(len)) {
                Err(MapError::Options(ConfigError::LengthPastEnd {
                    offset: o,
                    len: l,
                    object_len,
                })) => {
                    assert_eq!((o, l, object_len), (offset, len, size));
                }
                other => panic!("{offset}+{len}: expected LengthPastEnd, got {other:?}"),
            }
        }
        // Through a store (a new object) too, and for an empty object.
        assert!(matches!(
            pager.map_trusted(file.store(), MapOptions::new().offset(size + 5)),
            Err(MapError::Options(ConfigError::OffsetPastEnd { .. }))
        ));
        let empty = TestFile::new(0, 801);
        assert!(matches!(
            pager.map_trusted(empty.store(), MapOptions::new().offset(1)),
            Err(MapError::Options(ConfigError::OffsetPastEnd { .. }))
        ));
        assert!(matches!(
            pager.map_trusted(empty.store(), MapOptions::new().len(1)),
            Err(MapError::Options(ConfigError::LengthPastEnd { .. }))
        ));
        assert_eq!(pager.mappings(), 0, "a refused mapping was left mapped");
        assert_eq!(object.stats().io_count, 0);
    });
}

#[test]
fn fault_around_order_above_9_is_refused() {
    watchdog(WATCHDOG, || {
        let pager = pager();
        let file = TestFile::new(PAGE, 802);
        for order in [10u8, 11, 64, u8::MAX] {
            match pager.map_trusted(file.store(), MapOptions::new().fault_around_order(order)) {
                Err(MapError::Options(ConfigError::FaultAroundOrder(o))) => assert_eq!(o, order),
                other => panic!("order {order}: expected FaultAroundOrder, got {other:?}"),
            }
        }
        // Even for an empty object, where nothing would be mapped anyway.
        let empty = TestFile::new(0, 803);
        assert!(matches!(
            pager.map_trusted(empty.store(), MapOptions::new().fault_around_order(10)),
            Err(MapError::Options(ConfigError::FaultAroundOrder(10)))
        ));
        assert_eq!(pager.mappings(), 0);
        // The largest valid order still maps.
        let ok = pager
            .map_trusted(file.store(), MapOptions::new().fault_around_order(9))
            .unwrap();
        assert_eq!(pager.mappings(), 1);
        assert_bytes(&ok, &file.data, "order 9");
    });
}

#[test]
fn handler_threads_out_of_bounds_are_refused() {
    watchdog(WATCHDOG, || {
        for n in [0usize, 65, usize::MAX] {
            match Pager::new(Config::default().handler_threads(n)) {
                Err(PagerError::Config(ConfigError::HandlerThreads(got))) => assert_eq!(got, n),
                other => panic!("handler_threads({n}): expected HandlerThreads, got {other:?}"),
            }
        }
        for n in [1usize, 64] {
            let pager = Pager::new(Config::default().handler_threads(n))
                .unwrap_or_else(|e| panic!("handler_threads({n}): {e}"));
            assert_eq!(pager.config().handler_threads, n);
        }
    });
}

// ---------------------------------------------------------------------------
// SIGBUS.
// ---------------------------------------------------------------------------

/// The marker a child prints once it has read its good pages, right before
/// it touches the bad one.
const BEFORE_BAD: &str = "CHILD: good pages read, touching the bad page";

/// Runs test `name` as a child and asserts it died of SIGBUS after reading
/// its good pages, within `limit` (a child still running then is killed).
#[track_caller]
fn assert_child_dies_of_sigbus(name: &str, limit: Duration) {
    let end = run_child(name, limit);
    let what = format!(
        "child {name}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        end.status, end.stdout, end.stderr
    );
    assert!(end.status.is_some(), "hung: killed after {limit:?}; {what}");
    assert!(
        end.stdout.contains(BEFORE_BAD) || end.stderr.contains(BEFORE_BAD),
        "the child did not reach the bad page; {what}"
    );
    assert_eq!(
        end.signal(),
        Some(SIGBUS),
        "expected death by SIGBUS; {what}"
    );
}

/// The child's part: map `store` at `order`, read `good` pages, then the bad
/// page. Only returns if the bad access did not fault, which the parent
/// reports as a failure.
fn child_reads_bad_page(store: impl faultmap::Store, order: u8, good: &[usize], bad: usize) {
    let pager = pager();
    let map = pager
        .map_trusted(store, MapOptions::new().fault_around_order(order))
        .unwrap();
    for &p in good {
        touch(&map, p);
    }
    println!("{BEFORE_BAD}");
    let v = touch(&map, bad);
    println!("CHILD: the bad page read as {v:#04x}: no SIGBUS");
}

#[test]
fn a_page_that_fails_to_read_raises_sigbus() {
    const NAME: &str = "a_page_that_fails_to_read_raises_sigbus";
    if is_child(NAME) {
        let data = pattern(16 * PAGE, 810);
        let store = Instrumented::mem(&data, Faults::bad([3]));
        return child_reads_bad_page(store, 0, &[0, 1, 2, 4], 3);
    }
    assert_child_dies_of_sigbus(NAME, Duration::from_secs(30));
}

#[test]
fn a_bad_page_inside_a_good_pages_window_still_raises_sigbus() {
    // The good page's window read fails because of the bad page; the good
    // page is read alone; the bad page must not be mapped (as zeros or as
    // the store's scribbles) and must fault with SIGBUS when touched.
    const NAME: &str = "a_bad_page_inside_a_good_pages_window_still_raises_sigbus";
    if is_child(NAME) {
        let data = pattern(64 * PAGE, 811);
        let store = Instrumented::mem(&data, Faults::bad([21]));
        return child_reads_bad_page(store, 9, &[20, 22, 0, 63], 21);
    }
    assert_child_dies_of_sigbus(NAME, Duration::from_secs(30));
}

#[test]
fn a_file_truncated_under_its_mapping_raises_sigbus_past_the_new_end() {
    // As with a kernel mapping of a file that shrank: the pages past the new
    // end cannot be read, and touching one is SIGBUS.
    const NAME: &str = "a_file_truncated_under_its_mapping_raises_sigbus_past_the_new_end";
    if is_child(NAME) {
        let file = TestFile::new(32 * PAGE, 812);
        let store = file.store();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file.path)
            .unwrap()
            .set_len(10 * PAGE as u64)
            .unwrap();
        return child_reads_bad_page(store, 4, &[0, 9], 20);
    }
    assert_child_dies_of_sigbus(NAME, Duration::from_secs(30));
}

#[test]
fn a_store_that_panics_raises_sigbus_not_a_hang() {
    // A store that panics is a broken store, but the application faulting on
    // it must not hang forever (the handler thread unwinding with the page
    // left in flight would do that): SIGBUS, as for a failed read.
    const NAME: &str = "a_store_that_panics_raises_sigbus_not_a_hang";
    if is_child(NAME) {
        let data = pattern(16 * PAGE, 813);
        let store = Instrumented::mem(&data, Faults::panic([7]));
        return child_reads_bad_page(store, 0, &[0, 6, 8], 7);
    }
    assert_child_dies_of_sigbus(NAME, Duration::from_secs(15));
}

#[test]
fn good_pages_of_a_failing_store_read_correctly_in_process() {
    // The in-process half of the SIGBUS tests: with the same store, every
    // good page reads right and the errors are counted.
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 811);
        let store = Instrumented::mem(&data, Faults::bad([21]));
        let pager = pager();
        let map = pager
            .map_trusted(store.clone(), MapOptions::new().fault_around_order(9))
            .unwrap();
        for p in (0..64).filter(|&p| p != 21) {
            let r = page_range(&map, p);
            assert_bytes(&map[r.clone()], &data[r], &format!("page {p}"));
        }
        let s = stats_when(|| map.stats(), |s| s.io_bytes >= 63 * PAGE as u64);
        assert!(s.io_errors > 0, "{s:?}");
        assert!(
            !present_set(&map, 64).contains(&21),
            "the bad page is mapped"
        );
    });
}

#[test]
fn read_at_gives_a_page_that_fails_to_read_as_an_error_with_handler_delivery() {
    // `Mapping::read_at` copies with the kernel's access, which the handler
    // threads serve: a page the store cannot read is `MapError::Read` (no
    // SIGBUS, no hang), and every other byte reads right, before and after.
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 812);
        let store = Instrumented::mem(&data, Faults::bad([21]));
        let pager = Pager::new(Config::default().delivery(faultmap::Delivery::Handler)).unwrap();
        // As root under the Userfaultfd engine the kernel's copy is served;
        // under Protect (a container) the pages are read in first: either
        // way a failed page is an error.
        assert_eq!(
            pager.serves_kernel_faults(),
            pager.engine().engine == faultmap::Engine::Userfaultfd && running_as_root(),
            "{}",
            pager.engine()
        );
        let map = pager
            .map_trusted(store, MapOptions::new().offset(PAGE as u64))
            .unwrap();
        let mut buf = vec![0u8; 20 * PAGE - 7];
        map.read_at(7, &mut buf).unwrap();
        assert_bytes(&buf, &data[PAGE + 7..21 * PAGE], "pages before the bad one");
        // Object page 21 is the mapping's page 20.
        let mut across = vec![0u8; 3 * PAGE];
        match map.read_at(19 * PAGE + 100, &mut across) {
            Err(MapError::Read { offset, why, .. }) => {
                assert_eq!(offset / PAGE as u64, 21, "{offset}");
                assert!(!why.is_empty());
            }
            other => panic!("expected MapError::Read, got {other:?}"),
        }
        let err = map.read_at(20 * PAGE, &mut [0u8; 1]).unwrap_err();
        assert_eq!(faultmap::errno_of(&err), libc::EIO, "{err}");
        let mut after = vec![0u8; 40 * PAGE];
        map.read_at(21 * PAGE, &mut after).unwrap();
        assert_bytes(
            &after,
            &data[22 * PAGE..62 * PAGE],
            "pages after the bad one",
        );
        // Bounds: past the end is a range error, an empty read at the end
        // is nothing.
        assert!(matches!(
            map.read_at(map.len() - 1, &mut [0u8; 2]),
            Err(MapError::Options(_))
        ));
        assert!(matches!(
            map.read_at(usize::MAX, &mut [0u8; 2]),
            Err(MapError::Options(_))
        ));
        map.read_at(map.len(), &mut []).unwrap();
    });
}

#[test]
fn read_at_copies_in_user_space_with_signal_delivery() {
    // Signal delivery: the kernel cannot wait for a page, so `read_at`
    // copies with loads, which the SIGBUS handler serves.
    watchdog(WATCHDOG, || {
        let data = pattern(40 * PAGE + 123, 813);
        let pager = Pager::new(Config::default().delivery(faultmap::Delivery::Signal)).unwrap();
        let map = pager
            .map_trusted(
                faultmap::MemStore::new("read-at", data.clone()),
                MapOptions::new(),
            )
            .unwrap();
        let mut buf = vec![0u8; data.len() - 5];
        map.read_at(5, &mut buf).unwrap();
        assert_bytes(&buf, &data[5..], "the whole mapping");
    });
}
