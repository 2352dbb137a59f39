//! Fault-around maps only pages that are ready: cached and up to date. A
//! fault that hits the cache does no I/O and maps the window's ready pages,
//! skipping absent pages, pages whose read is in flight, and pages whose read
//! failed. What is mapped is checked in the page tables themselves, through
//! `/proc/self/pagemap`.
//!
//! The set-up steps that read chosen pages run with readahead off
//! (`ra_pages(0)`), so that each fault reads its page alone: the pages
//! ready when the fault-around under test runs are exactly those chosen.

mod common;
use common::MapTrusted;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use faultmap::{Config, MapOptions, Pager};

fn pager(handler_threads: usize) -> Pager {
    Pager::new(Config::default().handler_threads(handler_threads)).expect("Pager::new")
}

fn set(pages: &[usize]) -> BTreeSet<usize> {
    pages.iter().copied().collect()
}

#[test]
fn a_hit_maps_only_the_ready_pages_of_its_window() {
    watchdog(WATCHDOG, || {
        let data = pattern(40 * PAGE, 700);
        let store = Instrumented::mem(&data, Faults::default());
        let pager = pager(1);
        let object = pager.open(store.clone()).unwrap();
        let warmed = [0usize, 2, 5, 9];
        // Warm some pages through mapping A at order 0: one page per fault.
        let a = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(0).ra_pages(0))
            .unwrap();
        for &p in &warmed {
            assert_eq!(touch(&a, p), data[p * PAGE]);
        }
        assert_eq!(
            present_set(&a, 40),
            set(&warmed),
            "order 0 mapped more than the faulting pages"
        );
        assert_eq!(
            object.cached_bytes(),
            (warmed.len() * PAGE) as u64,
            "order 0 read more than the faulting pages"
        );
        // Mapping B at order 4 touches a warmed page: a hit.
        let b = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(4))
            .unwrap();
        assert!(
            present_set(&b, 40).is_empty(),
            "a new mapping has nothing mapped"
        );
        assert_eq!(touch(&b, 2), data[2 * PAGE]);
        let s = settle(&b, 1);
        assert_eq!(
            present_set(&b, 40),
            set(&warmed),
            "the hit did not map exactly the window's ready pages"
        );
        assert_eq!((s.pgfault, s.pgmajfault, s.io_count), (1, 0, 0), "{s:?}");
        assert_eq!(s.pgfault_around, 3, "{s:?}");
        for &p in &warmed {
            let r = page_range(&b, p);
            assert_bytes(&b[r.clone()], &data[r], &format!("warmed page {p}"));
        }
        assert_eq!(b.stats().pgfault, 1, "reading the mapped pages faulted");
        // A miss in the same window (page 1, not sequential) reads around:
        // the readahead window [0..32) less the 4 cached pages, one request
        // per run of absent pages. The request holding page 1 is the one
        // its fault waits for; the others are read in the background, so
        // what the fault maps is page 1, the warmed pages, and whatever
        // else of the window was ready by then: never a page not read yet.
        assert_eq!(touch(&b, 1), data[PAGE]);
        let s = settle(&b, 2);
        let mapped = present_set(&b, 40);
        assert!(mapped.is_superset(&set(&[0, 1, 2, 5, 9])), "{mapped:?}");
        assert!(mapped.iter().all(|&p| p < 16), "{mapped:?}");
        assert_eq!(s.pgmajfault, 1, "{s:?}");
        let object = b.object();
        assert!(
            wait_until(Duration::from_secs(20), || (0..32)
                .all(|p| object.is_cached(p))),
            "the readahead window never landed"
        );
        let s = stats_when(|| b.stats(), |s| s.io_bytes >= 28 * PAGE as u64);
        assert_eq!(
            s.io_bytes,
            28 * PAGE as u64,
            "the miss read exactly the 28 absent pages of [0..32): {s:?}"
        );
        assert_eq!(s.io_count, 4, "runs 1, 3-4, 6-8, 10-31: {s:?}");
        // Now a hit anywhere in the window maps all of it (in a fresh
        // mapping, where nothing is mapped yet).
        let c = pager
            .map_trusted(object, MapOptions::new().fault_around_order(4))
            .unwrap();
        assert_eq!(touch(&c, 3), data[3 * PAGE]);
        let s = settle(&c, 1);
        assert_eq!(
            present_set(&c, 40),
            (0..16).collect(),
            "the hit did not map its whole window"
        );
        assert_eq!((s.pgfault, s.io_count), (1, 0), "{s:?}");
        assert_bytes(&b[..16 * PAGE], &data[..16 * PAGE], "window 0..16");
        assert_eq!(
            present_set(&a, 40),
            set(&warmed),
            "B's faults mapped pages in A"
        );
        store.assert_contract_kept();
    });
}

#[test]
fn a_page_being_read_is_not_mapped_around() {
    watchdog(WATCHDOG, || {
        let data = pattern(32 * PAGE, 701);
        let store = Instrumented::mem(&data, Faults::gated([5]));
        let pager = pager(2);
        let object = pager.open(store.clone()).unwrap();
        let a = Arc::new(
            pager
                .map_trusted(&object, MapOptions::new().fault_around_order(0).ra_pages(0))
                .unwrap(),
        );
        for p in [0, 2, 9] {
            touch(&a, p);
        }
        // Page 5's read is held in the store: it is READING.
        let reader = {
            let a = a.clone();
            std::thread::spawn(move || touch(&a, 5))
        };
        assert!(
            store.gate.wait_entered(1, Duration::from_secs(20)),
            "page 5's read never started"
        );
        let b = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(4))
            .unwrap();
        assert_eq!(touch(&b, 2), data[2 * PAGE]);
        let s = settle(&b, 1);
        let mapped = present_set(&b, 32);
        store.gate.open();
        assert_eq!(reader.join().unwrap(), data[5 * PAGE]);
        assert_eq!(
            mapped,
            set(&[0, 2, 9]),
            "the hit did not map exactly the ready pages (page 5 was being read)"
        );
        assert_eq!((s.pgfault, s.io_count), (1, 0), "{s:?}");
        // Once read, the page is mapped by B's next fault on it, correctly.
        let r = page_range(&b, 5);
        assert_bytes(&b[r.clone()], &data[r], "page 5 after its read");
        assert_eq!(store.page_reads()[5], 1);
    });
}

#[test]
fn pages_that_fail_to_read_are_never_mapped() {
    watchdog(WATCHDOG, || {
        let pages = 48;
        let bad = [3usize, 10, 17, 31, 32];
        let data = pattern(pages * PAGE, 702);
        for (order, ra_pages) in [0u8, 2, 4, 9]
            .into_iter()
            .flat_map(|o| [(o, 0u64), (o, 32)])
        {
            let store = Instrumented::mem(&data, Faults::bad(bad.iter().map(|&p| p as u64)));
            let pager = pager(1);
            let map = pager
                .map_trusted(
                    store.clone(),
                    MapOptions::new()
                        .fault_around_order(order)
                        .ra_pages(ra_pages),
                )
                .unwrap();
            let good: Vec<usize> = (0..pages).filter(|p| !bad.contains(p)).collect();
            for &p in &good {
                let r = page_range(&map, p);
                assert_bytes(
                    &map[r.clone()],
                    &data[r],
                    &format!("order {order}, ra_pages {ra_pages}, good page {p}"),
                );
            }
            // How many faults the reads took is not known here: wait for
            // the page tables to show every good page, then check them.
            let good_set: BTreeSet<usize> = good.iter().copied().collect();
            let present = present_eventually(&map, pages, &good_set);
            let s = map.stats();
            let what = format!("order {order}, ra_pages {ra_pages}: {s:?}");
            assert_eq!(
                present, good_set,
                "{what}: bad pages mapped, or good ones not"
            );
            if ra_pages > 0 {
                assert!(
                    s.io_errors > 0,
                    "{what}: readahead windows over bad pages must have failed"
                );
                assert!(s.io_retry_single > 0, "{what}");
            } else {
                assert_eq!(
                    s.io_errors, 0,
                    "{what}: without readahead a bad page is never read for a good one"
                );
            }
            assert_eq!(
                map.object().cached_bytes(),
                (good.len() * PAGE) as u64,
                "{what}: exactly the good pages are cached"
            );
            // A second mapping of the object maps the good pages around, never the bad.
            let again = pager
                .map_trusted(map.object(), MapOptions::new().fault_around_order(9))
                .unwrap();
            touch(&again, 0);
            let s = settle(&again, 1);
            assert_eq!(
                present_set(&again, pages),
                good_set,
                "{what}: second mapping"
            );
            assert_eq!((s.pgfault, s.io_count), (1, 0), "{s:?}");
            store.assert_contract_kept();
        }
    });
}

#[test]
fn a_failed_window_read_is_retried_for_the_faulting_page() {
    watchdog(WATCHDOG, || {
        let data = pattern(32 * PAGE, 703);
        // Reads of more than one page that include page 6 fail.
        let store = Instrumented::mem(&data, Faults::flaky([6]));
        let pager = pager(1);
        let map = pager
            .map_trusted(store.clone(), MapOptions::new().fault_around_order(4))
            .unwrap();
        let r = page_range(&map, 6);
        assert_bytes(&map[r.clone()], &data[r], "page 6 after the retry");
        let s = settle(&map, 1);
        assert_eq!((s.pgfault, s.pgmajfault), (1, 1), "{s:?}");
        assert_eq!((s.io_errors, s.io_retry_single), (1, 1), "{s:?}");
        assert_eq!(s.io_count, 2, "the window, then the page alone: {s:?}");
        assert_eq!(
            present_set(&map, 32),
            set(&[6]),
            "only the retried page is ready"
        );
        assert_bytes(&map, &data, "everything");
        store.assert_contract_kept();
    });
}

/// An object of `data` opened on `pager`, its cache filled (through a
/// mapping at order 9, then unmapped), so that every fault of a later
/// mapping is a hit that maps its window.
fn cached_object(pager: &Pager, name: &str, data: &[u8]) -> faultmap::Object {
    let object = pager
        .open(faultmap::MemStore::new(name, data.to_vec()))
        .unwrap();
    let warm = pager
        .map_trusted(&object, MapOptions::new().fault_around_order(9))
        .unwrap();
    assert_bytes(&warm, data, "warm-up");
    object
}

/// Adaptive fault-around (`MapOptions::fault_around_auto`) on a cached
/// object: isolated touches (one page per 2 MiB) get ever smaller windows,
/// down to one page; a sequential walk soon gets whole page tables; a
/// random walk over every page takes about two faults per table; every
/// fault's window is counted.
#[test]
fn adaptive_windows_follow_the_access_pattern() {
    watchdog(WATCHDOG, || {
        let tables = 48;
        let pages = tables * 512;
        let data = pattern(pages * PAGE, 710);
        let pager = pager(1);
        let object = cached_object(&pager, "auto", &data);

        // Sparse: the first page of every page table.
        let sparse = pager
            .map_trusted(&object, MapOptions::new().fault_around_auto())
            .unwrap();
        assert_eq!(
            sparse.fault_around_order(),
            faultmap::policy::fault_around::AUTO
        );
        let mut windows = Vec::new();
        for t in 0..tables {
            let before = sparse.stats().fault_around_auto_pages;
            assert_eq!(touch(&sparse, t * 512), data[t * 512 * PAGE]);
            windows.push(sparse.stats().fault_around_auto_pages - before);
        }
        let s = sparse.stats();
        assert_eq!(s.pgfault, tables as u64, "one fault per touch");
        assert_eq!(s.fault_around_auto, s.pgfault, "every window sized by auto");
        assert_eq!(s.fault_around_auto_revisits, 0, "no table touched twice");
        assert_eq!(windows[0], 16, "the kernel's window first");
        assert!(
            windows.windows(2).all(|w| w[1] <= w[0]),
            "windows only shrink: {windows:?}"
        );
        assert!(
            windows[tables - 8..].iter().all(|&w| w == 1),
            "one page a touch once decayed: {windows:?}"
        );
        assert_eq!(
            present_set(&sparse, pages).len() as u64,
            s.fault_around_auto_pages
        );

        // Sequential: every page, in order.
        let walk = pager
            .map_trusted(&object, MapOptions::new().fault_around_auto())
            .unwrap();
        assert_bytes(&walk, &data, "sequential walk");
        let w = walk.stats();
        // The first tables grow their windows from 16 pages; later ones
        // are mapped whole, or in halves once the density has decayed.
        let tables_u = tables as u64;
        assert!(w.pgfault <= tables_u + tables_u / 2, "{} faults", w.pgfault);
        assert_eq!(w.fault_around_auto, w.pgfault);
        // Every table's first fault is fresh, every other one a revisit.
        assert_eq!(w.fault_around_auto_revisits, w.pgfault - tables_u, "{w:?}");
        assert_eq!(present_set(&walk, pages).len(), pages);

        // Random: every page once, in a random order. Once a few tables
        // were touched again, fresh tables are mapped whole (or in halves,
        // which fault once more, when the density has decayed).
        let random = pager
            .map_trusted(&object, MapOptions::new().fault_around_auto())
            .unwrap();
        let mut order: Vec<usize> = (0..pages).collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..pages).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for &p in &order {
            assert_eq!(touch(&random, p), data[p * PAGE], "page {p}");
        }
        let r = random.stats();
        assert!(r.pgfault <= 2 * tables as u64, "{} faults", r.pgfault);
        assert_eq!(
            r.fault_around_auto_revisits,
            r.pgfault - tables as u64,
            "{r:?}"
        );
        assert_eq!(present_set(&random, pages).len(), pages);

        // Fixed orders are unchanged by it.
        let fixed = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(0))
            .unwrap();
        assert_eq!(touch(&fixed, 7), data[7 * PAGE]);
        assert_eq!(fixed.stats().fault_around_auto, 0);
        // The sentinel is no order: only fault_around_auto asks for it.
        let auto = faultmap::policy::fault_around::AUTO;
        assert!(fixed.set_fault_around_order(auto).is_err());
        assert!(pager
            .map_trusted(&object, MapOptions::new().fault_around_order(auto))
            .is_err());
        fixed.set_fault_around_auto();
        assert_eq!(fixed.fault_around_order(), auto);
        assert_eq!(touch(&fixed, 300), data[300 * PAGE]);
        assert_eq!(fixed.stats().fault_around_auto, 1);
    });
}

/// A write to a page a read mapped already (a write-protect fault) tells
/// adaptive fault-around nothing about its windows: one read and one write
/// per 2 MiB leave the windows shrinking as for reads alone, in both
/// delivery modes.
#[test]
fn write_faults_teach_adaptive_fault_around_nothing() {
    watchdog(WATCHDOG, || {
        let tables = 48;
        let pages = tables * 512;
        let data = pattern(pages * PAGE, 711);
        for delivery in [faultmap::Delivery::Signal, faultmap::Delivery::Handler] {
            let pager = Pager::new(Config::default().delivery(delivery)).unwrap();
            let object = cached_object(&pager, "auto-wp", &data);
            let mut map = pager
                .map_mut_trusted(&object, MapOptions::new().fault_around_auto())
                .unwrap();
            for t in 0..tables {
                let at = t * 512 * PAGE;
                assert_eq!(map[at], data[at], "{delivery:?}: table {t}");
                map[at] = !data[at];
            }
            let s = map.stats();
            assert_eq!(s.fault_around_auto_revisits, 0, "{delivery:?}: {s:?}");
            assert_eq!(s.write_faults, tables as u64, "{delivery:?}: {s:?}");
            // The mapping starts at object offset 0: its slice starts on
            // its first page.
            let present = present_pages(map.as_ptr() as usize, pages)
                .into_iter()
                .filter(|&p| p)
                .count();
            assert!(
                present <= 16 * tables,
                "{delivery:?}: {present} pages mapped for {tables} touched"
            );
            drop(map);
        }
    });
}
