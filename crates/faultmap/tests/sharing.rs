//! Mappings of one object share its cache: a page is read from the store
//! once, by the first fault that needs it; later mappings map it without I/O,
//! and a fault on a page whose read is in flight waits for that read instead
//! of reading it again.

mod common;
use common::MapTrusted;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use faultmap::{Config, MapOptions, Pager};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Two PTE tables and a bit, ending inside a page.
const SIZE: usize = 2 * TABLE + 37 * PAGE + 99;
const PAGES: usize = SIZE.div_ceil(PAGE);

fn pager(handler_threads: usize) -> Pager {
    Pager::new(Config::default().handler_threads(handler_threads)).expect("Pager::new")
}

#[test]
fn a_second_mapping_of_an_object_does_no_io() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(SIZE, 600);
        let pager = pager(1);
        let object = pager.open(file.store()).unwrap();
        {
            let first = pager.map_trusted(&object, MapOptions::new()).unwrap();
            assert_bytes(&first, &file.data, "first mapping");
            let s = stats_when(|| first.stats(), |s| s.io_bytes >= SIZE as u64);
            assert!(s.pgmajfault > 0, "the first mapping read the store: {s:?}");
            assert_eq!(s.io_bytes, SIZE as u64);
        }
        for order in [0u8, 4, 9] {
            let second = pager
                .map_trusted(&object, MapOptions::new().fault_around_order(order))
                .unwrap();
            assert_bytes(
                &second,
                &file.data,
                &format!("second mapping, order {order}"),
            );
            // Each fault of the sequential read ends before the next one
            // starts, except the last: wait for it.
            let s = stats_when(
                || second.stats(),
                |s| s.pgfault >= windows(PAGES as u64, order),
            );
            assert_eq!(s.io_count, 0, "order {order}: {s:?}");
            assert_eq!(s.io_bytes, 0, "order {order}: {s:?}");
            assert_eq!(s.pgmajfault, 0, "order {order}: {s:?}");
            assert!(
                s.pgfault > 0,
                "order {order}: the second mapping did fault (MINOR): {s:?}"
            );
        }
        assert_eq!(
            stats_when(|| object.stats(), |s| s.io_bytes >= SIZE as u64).io_bytes,
            SIZE as u64,
            "the object was read once in all"
        );
    });
}

#[test]
fn concurrently_held_mappings_share_the_cache() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(SIZE, 601);
        let pager = pager(2);
        let object = pager.open(file.store()).unwrap();
        // Readahead off: what each mapping reads is what it touches.
        let a = pager
            .map_trusted(&object, MapOptions::new().ra_pages(0))
            .unwrap();
        let b = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(9).ra_pages(0))
            .unwrap();
        let c = pager
            .map_trusted(
                &object,
                MapOptions::new()
                    .offset(TABLE as u64 + 3)
                    .fault_around_order(0)
                    .ra_pages(0),
            )
            .unwrap();
        assert_eq!(pager.mappings(), 3);
        // A reads its first PTE table (its order-4 windows end exactly
        // there); B reads everything, which reads only the rest.
        let half = TABLE;
        assert_bytes(&a[..half], &file.data[..half], "a, first table");
        let a_io = stats_when(|| a.stats(), |s| s.io_bytes >= half as u64).io_bytes;
        assert_eq!(a_io, half as u64, "a read exactly the pages it touched");
        assert_bytes(&b, &file.data, "b");
        let rest = (SIZE - half) as u64;
        let b_io = stats_when(|| b.stats(), |s| s.io_bytes >= rest).io_bytes;
        assert_eq!(b_io, rest, "b read only what a had not");
        // C and the rest of A map cached pages only.
        assert_bytes(&c, &file.data[TABLE + 3..], "c");
        assert_bytes(&a, &file.data, "a, whole");
        assert_eq!(c.stats().io_count, 0);
        assert_eq!(a.stats().io_bytes, a_io, "a's second half was cached by b");
        let s = stats_when(|| object.stats(), |s| s.io_bytes >= SIZE as u64);
        assert_eq!(s.io_bytes, SIZE as u64);
        assert_eq!(object.cached_bytes(), (PAGES * PAGE) as u64);
    });
}

/// Four threads read random pages of one cold object, each through its own
/// mapping, served by two handler threads: every byte is right, and every
/// page is read from the store exactly once.
#[test]
fn four_threads_on_one_cold_object_read_each_page_once() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(SIZE, 602);
        let pager = pager(2);
        for (round, orders) in [[4u8, 4, 4, 4], [0, 3, 4, 9], [0, 0, 0, 0], [9, 9, 1, 5]]
            .into_iter()
            .enumerate()
        {
            let store = Instrumented::new(file.store(), Faults::default());
            let object = pager.open(store.clone()).unwrap();
            let maps: Vec<_> = orders
                .iter()
                .map(|&o| {
                    pager
                        .map_trusted(&object, MapOptions::new().fault_around_order(o))
                        .unwrap()
                })
                .collect();
            std::thread::scope(|s| {
                for (t, map) in maps.iter().enumerate() {
                    let data = &file.data;
                    s.spawn(move || {
                        let mut pages: Vec<usize> = (0..PAGES).collect();
                        pages.shuffle(&mut StdRng::seed_from_u64((round * 4 + t) as u64));
                        for page in pages {
                            let r = page_range(map, page);
                            assert_bytes(
                                &map[r.clone()],
                                &data[r],
                                &format!("thread {t}, page {page}"),
                            );
                        }
                    });
                }
            });
            let s = stats_when(|| object.stats(), |s| s.io_bytes >= SIZE as u64);
            let what = format!("round {round}, orders {orders:?}: {s:?}");
            assert!(
                s.io_bytes <= (PAGES * PAGE) as u64,
                "{what}: pages read twice"
            );
            assert_eq!(
                s.io_bytes, SIZE as u64,
                "{what}: every byte read exactly once"
            );
            let reread: Vec<(usize, u32)> = store
                .page_reads()
                .into_iter()
                .enumerate()
                .filter(|&(_, n)| n != 1)
                .collect();
            assert!(
                reread.is_empty(),
                "{what}: (page, reads) not read once: {reread:?}"
            );
            store.assert_contract_kept();
            // The object's counters end after the mappings': settled above.
            let sum: u64 = maps.iter().map(|m| m.stats().io_bytes).sum();
            assert_eq!(
                sum, s.io_bytes,
                "{what}: mapping counters add up to the object's"
            );
        }
    });
}

/// A fault on a page whose store read is in flight (held at a gate) waits for
/// that read, and is woken by it; the page is read once.
#[test]
fn a_page_in_flight_is_waited_for_not_reread() {
    watchdog(WATCHDOG, || {
        let data = pattern(32 * PAGE, 603);
        let store = Instrumented::mem(&data, Faults::gated([5]));
        // Two handler threads: one is held in the store, the other serves the
        // second fault.
        let pager = pager(2);
        let object = pager.open(store.clone()).unwrap();
        let a = Arc::new(
            pager
                .map_trusted(&object, MapOptions::new().fault_around_order(0).ra_pages(0))
                .unwrap(),
        );
        let b = Arc::new(
            pager
                .map_trusted(&object, MapOptions::new().fault_around_order(0).ra_pages(0))
                .unwrap(),
        );
        let reader = {
            let a = a.clone();
            std::thread::spawn(move || read_byte(&a, 5 * PAGE + 1))
        };
        assert!(
            store.gate.wait_entered(1, Duration::from_secs(20)),
            "the first fault never reached the store"
        );
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || read_byte(&b, 5 * PAGE + 2))
        };
        assert!(
            wait_until(Duration::from_secs(20), || object.stats().fault_wait >= 1),
            "the second fault did not wait for the read in flight: {:?}",
            object.stats()
        );
        store.gate.open();
        assert_eq!(reader.join().unwrap(), data[5 * PAGE + 1]);
        assert_eq!(waiter.join().unwrap(), data[5 * PAGE + 2]);
        assert_eq!(store.page_reads()[5], 1, "page 5 was read again");
        // B's fault waited, then its retry mapped the page: one fault, as
        // the kernel counts a fault retried after waiting on a locked page.
        let s = settle(&b, 1);
        assert_eq!(s.pgfault, 1, "{s:?}");
        assert_eq!(s.io_count, 0, "the waiting mapping did no I/O: {s:?}");
        assert_eq!(s.fault_wait, 1, "{s:?}");
        let s = stats_when(|| object.stats(), |s| s.io_bytes >= PAGE as u64);
        assert_eq!(s.io_bytes, PAGE as u64, "{s:?}");
    });
}

#[test]
fn an_object_is_shared_across_pagers() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(3 * PAGE * 16 + 5, 604);
        let first = pager(1);
        let second = pager(2);
        let object = first.open(file.store()).unwrap();
        {
            let warm = first.map_trusted(&object, MapOptions::new()).unwrap();
            assert_bytes(&warm, &file.data, "through the first pager");
        }
        let other = second.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&other, &file.data, "through the second pager");
        // 49 pages at order 4: four faults.
        let s = stats_when(|| other.stats(), |s| s.pgfault >= 4);
        assert_eq!((s.pgfault, s.io_count, s.pgmajfault), (4, 0, 0), "{s:?}");
        let p = stats_when(|| second.stats(), |p| p.pgfault >= 4);
        assert_eq!(
            p.pgfault, 4,
            "the second pager counts the faults it served: {p:?}"
        );
    });
}
