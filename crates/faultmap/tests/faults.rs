//! Fault counts of sequential reads of cached pages.
//!
//! A mapping is placed at a virtual address congruent to its object offset
//! modulo 2 MiB, and its fault-around window is aligned in virtual-address
//! space (the kernel's `do_fault_around`). So a sequential read, one byte per
//! page, of `P` cached pages of a mapping at object offset 0 takes exactly
//! `ceil(P / 2^k)` faults at order `k`, and every page that is not the
//! faulting one is mapped by fault-around. From an unaligned start, the first
//! window slides right to the mapping's start and the later ones are aligned
//! again: at most one fault more.
//!
//! "Cached": the object is warmed through a first mapping, which is dropped;
//! the counts are those of a second mapping.

mod common;
use common::MapTrusted;

use common::*;
use faultmap::{Config, MapOptions, Object, Pager};

/// 1100 pages and 1000 bytes: more than two PTE tables, ends inside a page.
const SIZE: usize = 1100 * PAGE + 1000;
const PAGES: usize = SIZE.div_ceil(PAGE);

/// A pager and a fully cached object of `SIZE` bytes.
fn warmed() -> (TestFile, Pager, Object) {
    let file = TestFile::new(SIZE, 500);
    let pager = Pager::new(Config::default()).expect("Pager::new");
    let object = pager.open(file.store()).unwrap();
    {
        let warm = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(9))
            .unwrap();
        assert_bytes(&warm, &file.data, "warming read");
    }
    assert_eq!(
        object.cached_bytes(),
        (PAGES * PAGE) as u64,
        "warming cached everything"
    );
    assert_eq!(pager.mappings(), 0);
    (file, pager, object)
}

/// The kernel's fault-around window (kernel-mechanisms.md §1(b)), written
/// independently of faultmap: the faults a sequential read of `pages` cached
/// pages takes when the first page sits in PTE slot `first_slot`.
fn model_faults(first_slot: usize, pages: usize, order: u8) -> u64 {
    let n = 1usize << order;
    let (mut next, mut faults) = (0usize, 0u64);
    while next < pages {
        let slot = (first_slot + next) % 512;
        let from = (slot - slot % n).max(slot - slot.min(next));
        let to = (from + n).min(512).min(slot + (pages - next));
        // Everything before `next` is mapped already; the window maps up to `to`.
        next += to - slot;
        faults += 1;
    }
    faults
}

/// Reads one byte of every page of `map`, in order, and returns the
/// mapping's counters once it has counted `expected` faults (the last fault
/// may still be ending when its thread resumes: see `common::stats_when`).
fn sequential_touch(map: &faultmap::Mapping, data: &[u8], expected: u64) -> faultmap::Stats {
    for page in 0..mapped_pages(map) {
        let offset = (page * PAGE).saturating_sub(lead(map));
        assert_eq!(touch(map, page), data[offset], "page {page}");
    }
    settle(map, expected)
}

#[test]
fn mappings_are_placed_congruent_to_their_offset_modulo_2mib() {
    watchdog(WATCHDOG, || {
        let (_file, pager, object) = warmed();
        for offset in [
            0,
            1,
            PAGE,
            5 * PAGE + 3,
            TABLE - PAGE,
            TABLE,
            TABLE + 77 * PAGE,
        ] {
            let map = pager
                .map_trusted(&object, MapOptions::new().offset(offset as u64))
                .unwrap();
            assert_eq!(
                map.as_ptr() as usize % TABLE,
                offset % TABLE,
                "offset {offset}: the mapping's VA is not congruent to it mod 2 MiB"
            );
        }
    });
}

#[test]
fn aligned_sequential_read_takes_ceil_p_over_n_faults() {
    watchdog(WATCHDOG, || {
        let (file, pager, object) = warmed();
        let counts = [1, 2, 7, 15, 16, 17, 100, 511, 512, 513, 1000, PAGES];
        for pages in counts {
            for order in 0..=9u8 {
                let len = (pages * PAGE).min(SIZE);
                let map = pager
                    .map_trusted(
                        &object,
                        MapOptions::new().len(len as u64).fault_around_order(order),
                    )
                    .unwrap();
                assert_eq!(mapped_pages(&map), pages);
                let s = sequential_touch(&map, &file.data[..len], windows(pages as u64, order));
                let what = format!("{pages} pages at order {order}: {s:?}");
                assert_eq!(s.pgfault, windows(pages as u64, order), "{what}");
                if order == 0 {
                    assert_eq!(
                        s.pgfault, pages as u64,
                        "{what}: order 0 maps one page per fault"
                    );
                }
                assert_eq!(s.pgmajfault, 0, "{what}: cached pages need no I/O");
                assert_eq!((s.io_count, s.io_bytes), (0, 0), "{what}");
                assert_eq!(
                    s.pgfault_around,
                    pages as u64 - s.pgfault,
                    "{what}: every page not faulted on was mapped around"
                );
                assert_eq!(
                    present_set(&map, pages).len(),
                    pages,
                    "{what}: every page is mapped after the walk"
                );
            }
        }
    });
}

#[test]
fn unaligned_sequential_read_takes_at_most_one_fault_more() {
    watchdog(WATCHDOG, || {
        let (file, pager, object) = warmed();
        // (start page, extra bytes into it, pages to map)
        let cases = [
            (1, 0, 100),
            (3, 0, 16),
            (5, 123, 40),
            (13, 0, 500),
            (100, 7, 513),
            (509, 0, 30),
            (511, 4095, 300),
            (517, 1, 583),
        ];
        for (start, extra, pages) in cases {
            for order in 0..=9u8 {
                let offset = start * PAGE + extra;
                let end = ((start + pages) * PAGE).min(SIZE);
                let map = pager
                    .map_trusted(
                        &object,
                        MapOptions::new()
                            .offset(offset as u64)
                            .len((end - offset) as u64)
                            .fault_around_order(order),
                    )
                    .unwrap();
                assert_eq!(mapped_pages(&map), pages);
                let expected = model_faults(start % 512, pages, order);
                let s = sequential_touch(&map, &file.data[offset..end], expected);
                let what =
                    format!("start page {start}+{extra}, {pages} pages, order {order}: {s:?}");
                assert!(
                    s.pgfault <= windows(pages as u64, order) + 1,
                    "{what}: more than ceil(P/N)+1 faults"
                );
                assert_eq!(
                    s.pgfault, expected,
                    "{what}: differs from the kernel's window"
                );
                assert_eq!(s.pgmajfault, 0, "{what}");
                assert_eq!(s.pgfault_around, pages as u64 - s.pgfault, "{what}");
            }
        }
    });
}

#[test]
fn faults_are_counted_per_mapping_object_and_pager() {
    watchdog(WATCHDOG, || {
        let (file, pager, object) = warmed();
        let before_object = object.stats();
        let before_pager = pager.stats();
        let a = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(2))
            .unwrap();
        let b = pager
            .map_trusted(
                &object,
                MapOptions::new().offset(TABLE as u64).fault_around_order(5),
            )
            .unwrap();
        let (fa, fb) = (windows(PAGES as u64, 2), windows((PAGES - 512) as u64, 5));
        let sa = sequential_touch(&a, &file.data, fa);
        let sb = sequential_touch(&b, &file.data[TABLE..], fb);
        assert_eq!((sa.pgfault, sb.pgfault), (fa, fb));
        let total = fa + fb;
        let so = stats_when(
            || object.stats(),
            |s| s.pgfault - before_object.pgfault >= total,
        );
        let sp = stats_when(
            || pager.stats(),
            |s| s.pgfault - before_pager.pgfault >= total,
        );
        assert_eq!(so.pgfault - before_object.pgfault, sa.pgfault + sb.pgfault);
        assert_eq!(sp.pgfault - before_pager.pgfault, sa.pgfault + sb.pgfault);
        assert_eq!(
            so.pgfault_around - before_object.pgfault_around,
            sa.pgfault_around + sb.pgfault_around
        );
    });
}
