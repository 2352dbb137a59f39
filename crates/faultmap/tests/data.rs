//! The bytes read through a mapping are the object's bytes: whatever the
//! fault-around order, the access order, the number of reader and handler
//! threads, the mapping's offset and length, and the object's size.

mod common;
use common::MapTrusted;

use std::io::Write;

use common::*;
use faultmap::{Config, Delivery, MapOptions, MemStore, Pager, Store};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// 3 MiB + 1234 bytes: crosses a PTE table and ends inside a page.
const BIG: usize = 3 * 1024 * 1024 + 1234;

fn pager(handler_threads: usize) -> Pager {
    Pager::new(Config::default().handler_threads(handler_threads)).expect("Pager::new")
}

fn shuffled_pages(pages: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pages).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order
}

#[test]
fn sequential_read_matches_the_file_at_every_order() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(BIG, 1);
        for threads in [1, 3] {
            let pager = pager(threads);
            for order in 0..=9u8 {
                let store = Instrumented::new(file.store(), Faults::default());
                let map = pager
                    .map_trusted(store.clone(), MapOptions::new().fault_around_order(order))
                    .unwrap();
                assert_eq!(map.len(), BIG);
                assert_eq!(map.fault_around_order(), order);
                let what = format!("order {order}, {threads} handler threads");
                assert_bytes(&map, &file.data, &what);
                let s = stats_when(|| map.stats(), |s| s.io_bytes >= BIG as u64);
                assert!(
                    s.pgmajfault > 0 && s.io_count > 0,
                    "{what}: a cold read did no I/O: {s:?}"
                );
                assert_eq!(
                    s.io_bytes, BIG as u64,
                    "{what}: every byte read once: {s:?}"
                );
                assert_eq!(s.io_errors, 0, "{what}");
                store.assert_contract_kept();
            }
        }
    });
}

#[test]
fn random_page_order_matches_the_file() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(BIG, 2);
        let pages = BIG.div_ceil(PAGE);
        for threads in [1, 3] {
            let pager = pager(threads);
            for order in [0u8, 3, 4, 9] {
                let map = pager
                    .map_trusted(file.store(), MapOptions::new().fault_around_order(order))
                    .unwrap();
                for page in shuffled_pages(pages, u64::from(order)) {
                    let r = page_range(&map, page);
                    let what = format!("page {page}, order {order}, {threads} handler threads");
                    assert_bytes(&map[r.clone()], &file.data[r], &what);
                }
                // And the whole, once every page is in.
                assert_bytes(&map, &file.data, &format!("order {order}, whole"));
            }
        }
    });
}

/// Each reader reads every page of `map` in its own random order.
fn read_all_randomly(map: &faultmap::Mapping, data: &[u8], seed: u64) {
    for page in shuffled_pages(mapped_pages(map), seed) {
        let r = page_range(map, page);
        assert_bytes(
            &map[r.clone()],
            &data[r],
            &format!("reader {seed}, page {page}"),
        );
    }
}

#[test]
fn reader_threads_share_one_mapping() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(BIG, 3);
        for handler_threads in [1, 3] {
            let pager = pager(handler_threads);
            for readers in [1u64, 4] {
                for order in [0u8, 4, 9] {
                    let store = Instrumented::new(file.store(), Faults::default());
                    let map = pager
                        .map_trusted(store.clone(), MapOptions::new().fault_around_order(order))
                        .unwrap();
                    std::thread::scope(|s| {
                        for r in 0..readers {
                            let map = &map;
                            let data = &file.data;
                            s.spawn(move || read_all_randomly(map, data, r));
                        }
                    });
                    assert_bytes(&map, &file.data, "after the readers");
                    let reread: Vec<usize> = (store.page_reads().iter().enumerate())
                        .filter_map(|(p, &n)| (n != 1).then_some(p))
                        .collect();
                    assert!(
                        reread.is_empty(),
                        "{readers} readers, {handler_threads} handlers, order {order}: \
                         pages not read exactly once: {reread:?}"
                    );
                    store.assert_contract_kept();
                }
            }
        }
    });
}

#[test]
fn reader_threads_on_separate_mappings_of_one_object() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(BIG, 4);
        for handler_threads in [1, 3] {
            let pager = pager(handler_threads);
            for readers in [1u64, 4] {
                let object = pager.open(file.store()).unwrap();
                let maps: Vec<_> = (0..readers)
                    .map(|r| {
                        let order = [0u8, 4, 9, 2][r as usize];
                        pager
                            .map_trusted(&object, MapOptions::new().fault_around_order(order))
                            .unwrap()
                    })
                    .collect();
                std::thread::scope(|s| {
                    for (r, map) in maps.iter().enumerate() {
                        let data = &file.data;
                        s.spawn(move || read_all_randomly(map, data, r as u64 + 10));
                    }
                });
                assert_eq!(
                    stats_when(|| object.stats(), |s| s.io_bytes >= BIG as u64).io_bytes,
                    BIG as u64,
                    "{readers} readers: the shared cache reads each byte once"
                );
            }
        }
    });
}

#[test]
fn reader_threads_on_separate_objects() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(BIG, 5);
        for handler_threads in [1, 3] {
            let pager = pager(handler_threads);
            for readers in [1u64, 4] {
                let maps: Vec<_> = (0..readers)
                    .map(|r| {
                        let order = [9u8, 0, 4, 6][r as usize];
                        pager
                            .map_trusted(file.store(), MapOptions::new().fault_around_order(order))
                            .unwrap()
                    })
                    .collect();
                std::thread::scope(|s| {
                    for (r, map) in maps.iter().enumerate() {
                        let data = &file.data;
                        s.spawn(move || read_all_randomly(map, data, r as u64 + 20));
                    }
                });
                for map in &maps {
                    assert_eq!(
                        stats_when(|| map.stats(), |s| s.io_bytes >= BIG as u64).io_bytes,
                        BIG as u64,
                        "each object reads its own copy"
                    );
                }
            }
        }
    });
}

#[test]
fn unaligned_offsets_start_exactly_there() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(BIG, 6);
        let pager = pager(1);
        let offsets = [
            1,
            100,
            PAGE - 1,
            PAGE,
            PAGE + 1,
            3 * PAGE + 5,
            TABLE - 1,
            TABLE,
            TABLE + 1,
            TABLE + 7 * PAGE + 3,
            BIG - 1,
        ];
        for offset in offsets {
            for order in [0u8, 4, 9] {
                let what = format!("offset {offset}, order {order}");
                let store = Instrumented::new(file.store(), Faults::default());
                let map = pager
                    .map_trusted(
                        store.clone(),
                        MapOptions::new()
                            .offset(offset as u64)
                            .fault_around_order(order),
                    )
                    .unwrap();
                assert_eq!(map.len(), BIG - offset, "{what}");
                assert_eq!(map.as_ptr() as usize % PAGE, offset % PAGE, "{what}: lead");
                assert_eq!(read_byte(&map, 0), file.data[offset], "{what}: first byte");
                assert_bytes(&map, &file.data[offset..], &what);
                store.assert_contract_kept();
                // Readahead is per object, as the kernel's is per file: its
                // read-around may start up to half a window before the
                // mapping, but never further than readahead reaches.
                let first = (offset / PAGE * PAGE) as u64;
                let reach = 2 * store.ra_pages() * PAGE as u64;
                let reads = store.reads.lock().unwrap().clone();
                assert!(
                    reads.iter().all(|&(o, _)| o + reach >= first),
                    "{what}: read far before the mapping: {reads:?}"
                );
            }
        }
    });
}

#[test]
fn sizes_not_a_multiple_of_the_page() {
    watchdog(WATCHDOG, || {
        let pager = pager(1);
        let sizes = [
            1,
            2,
            100,
            PAGE - 1,
            PAGE + 1,
            2 * PAGE - 1,
            2 * PAGE + 1,
            5 * PAGE + 7,
            TABLE - 1,
            TABLE + 1,
        ];
        for (i, size) in sizes.into_iter().enumerate() {
            let file = TestFile::new(size, 100 + i as u64);
            for order in [0u8, 4, 9] {
                let store = Instrumented::new(file.store(), Faults::default());
                let map = pager
                    .map_trusted(store.clone(), MapOptions::new().fault_around_order(order))
                    .unwrap();
                let what = format!("size {size}, order {order}");
                assert_eq!(map.len(), size, "{what}");
                assert_bytes(&map, &file.data, &what);
                let s = stats_when(|| map.stats(), |s| s.io_bytes >= size as u64);
                assert_eq!(s.io_bytes, size as u64, "{what}");
                store.assert_contract_kept();
            }
        }
    });
}

#[test]
fn empty_file_gives_an_empty_mapping() {
    watchdog(WATCHDOG, || {
        let pager = pager(1);
        let file = TestFile::new(0, 7);
        for order in [0u8, 4, 9] {
            let map = pager
                .map_trusted(file.store(), MapOptions::new().fault_around_order(order))
                .expect("a 0-byte file maps as an empty mapping");
            assert_eq!(map.len(), 0);
            assert!(map.is_empty());
            assert_eq!(&map[..], &[] as &[u8]);
            assert_eq!(map.iter().count(), 0);
            assert_eq!(map.stats(), faultmap::Stats::default());
            assert_eq!(map.object().len(), 0);
            assert_eq!(map.object().cached_bytes(), 0);
        }
        // The same through an Object, with an explicit offset 0 and len 0.
        let object = pager.open(file.store()).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().offset(0).len(0))
            .unwrap();
        assert!(map.is_empty());
        let mem = pager
            .map_trusted(MemStore::new("empty", Vec::new()), MapOptions::new())
            .unwrap();
        assert!(mem.is_empty());
        assert_eq!(pager.stats().pgfault, 0);
    });
}

#[test]
fn zero_length_windows_of_a_file_are_empty() {
    watchdog(WATCHDOG, || {
        let pager = pager(1);
        let file = TestFile::new(5 * PAGE + 17, 8);
        let object = pager.open(file.store()).unwrap();
        for offset in [0u64, 1, 123, PAGE as u64, 5 * PAGE as u64 + 16] {
            let map = pager
                .map_trusted(&object, MapOptions::new().offset(offset).len(0))
                .unwrap_or_else(|e| panic!("offset {offset}, len 0: {e}"));
            assert!(map.is_empty(), "offset {offset}");
            assert_eq!(&map[..], &[] as &[u8]);
        }
        assert_eq!(object.stats().io_count, 0, "an empty mapping reads nothing");
        assert_eq!(object.cached_bytes(), 0);
    });
}

#[test]
fn windows_inside_a_file_larger_than_a_page_table() {
    watchdog(WATCHDOG, || {
        let size = 5 * 1024 * 1024 + 321;
        let file = TestFile::new(size, 9);
        let pager = pager(2);
        let mut windows: Vec<(usize, usize)> = vec![
            (0, PAGE),
            (0, 1),
            (TABLE - 3 * PAGE, 8 * PAGE), // across the first table boundary
            (TABLE - 1, 2),               // two bytes, two tables
            (TABLE - 100, TABLE + 200),   // three tables
            (2 * TABLE - 5 * PAGE + 7, 40 * PAGE), // unaligned, across a boundary
            (size - PAGE - 10, PAGE + 10), // to the end
            (size - 1, 1),
            (17, size - 17),
        ];
        let mut rng = StdRng::seed_from_u64(0xF00D);
        for _ in 0..60 {
            let offset = rng.random_range(0..size);
            let len = rng.random_range(1..=(size - offset).min(3 * TABLE));
            windows.push((offset, len));
        }
        for (i, &(offset, len)) in windows.iter().enumerate() {
            let order = [0u8, 4, 9, 1, 7][i % 5];
            let what = format!("window {offset}+{len}, order {order}");
            let store = Instrumented::new(file.store(), Faults::default());
            let map = pager
                .map_trusted(
                    store.clone(),
                    MapOptions::new()
                        .offset(offset as u64)
                        .len(len as u64)
                        .fault_around_order(order),
                )
                .unwrap();
            assert_eq!(map.len(), len, "{what}");
            let expected = &file.data[offset..offset + len];
            if i % 2 == 0 {
                assert_bytes(&map, expected, &what);
            } else {
                for page in shuffled_pages(mapped_pages(&map), i as u64) {
                    let r = page_range(&map, page);
                    assert_bytes(&map[r.clone()], &expected[r], &what);
                }
            }
            store.assert_contract_kept();
            // Reads stay inside the object, and within readahead's reach of
            // the mapping's pages (readahead is per object, as the kernel's
            // is per file: it may read around and ahead of a mapping's
            // edges, by a window or two, never further).
            let first = (offset / PAGE * PAGE) as u64;
            let end = (offset + len).next_multiple_of(PAGE).min(size) as u64;
            let reach = 2 * store.ra_pages() * PAGE as u64;
            let reads = store.reads.lock().unwrap().clone();
            for (o, l) in reads {
                let last = o + l as u64;
                assert!(
                    last <= size as u64 && o + reach >= first && last <= end + reach,
                    "{what}: read {o}+{l} beyond readahead's reach of [{first}, {end})"
                );
            }
        }
    });
}

#[test]
fn bytes_past_a_window_end_in_its_last_page_are_the_objects_own() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(4 * PAGE, 10);
        let pager = pager(1);
        // A window ending inside page 2: the rest of page 2 is mapped too (a
        // mapping maps whole pages, as mmap does), and holds the object's bytes.
        let (offset, len) = (PAGE + 5, PAGE + 100);
        let map = pager
            .map_trusted(
                file.store(),
                MapOptions::new().offset(offset as u64).len(len as u64),
            )
            .unwrap();
        let tail = read_tail(&map);
        let end = offset + len;
        assert_eq!(tail.len(), 3 * PAGE - end);
        assert_bytes(&tail, &file.data[end..3 * PAGE], "past the window's end");
    });
}

#[test]
fn a_mem_store_reads_back() {
    watchdog(WATCHDOG, || {
        let data = pattern(TABLE + 3 * PAGE + 11, 11);
        let pager = pager(2);
        for order in [0u8, 4, 9] {
            let map = pager
                .map_trusted(
                    MemStore::new("mem", data.clone()),
                    MapOptions::new().fault_around_order(order),
                )
                .unwrap();
            assert_bytes(&map, &data, &format!("MemStore, order {order}"));
        }
    });
}

/// The kernel reading through a mapping (here `write(2)` from it, as an
/// application that writes out or sends mapped data does) sees the object's
/// bytes too, as it does through a kernel file mapping, with handler-thread
/// delivery. The faults this raises are taken in kernel mode
/// (`copy_from_user`), not user mode. A pager that cannot serve them (the
/// Protect engine, or a user-mode-only userfaultfd) gets `EFAULT` from the
/// cold mapping, and the same bytes once the range is populated.
#[test]
fn write_syscall_from_a_cold_mapping_copies_the_file() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(64 * PAGE + 9, 12);
        let pager = Pager::new(Config::default().delivery(Delivery::Handler)).unwrap();
        let map = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
        let out_path = file.dir.path().join("copy.bin");
        let mut out = std::fs::File::create(&out_path).unwrap();
        if !pager.serves_kernel_faults() {
            let err = out.write(&map).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
            map.populate(0..map.len()).unwrap();
        }
        out.write_all(&map)
            .expect("write(2) from a cold (or populated) faultmap mapping failed");
        drop(out);
        let copy = std::fs::read(&out_path).unwrap();
        assert_bytes(&copy, &file.data, "written from the mapping");
    });
}

/// With signal delivery the kernel's own accesses raise no signal: a
/// `write(2)` from a page not yet mapped fails with `EFAULT` (documented),
/// and once the range has been touched it succeeds with the object's bytes.
#[test]
fn write_syscall_from_a_signal_mapping_needs_touched_pages() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(64 * PAGE + 9, 13);
        let pager = Pager::new(Config::default().delivery(Delivery::Signal)).unwrap();
        let map = pager
            .map_trusted(file.store(), MapOptions::new().fault_around_order(0))
            .unwrap();
        let out_path = file.dir.path().join("copy.bin");
        let mut out = std::fs::File::create(&out_path).unwrap();
        let err = out.write(&map[..PAGE]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
        let sum: u64 = map.iter().map(|&b| u64::from(b)).sum();
        std::hint::black_box(sum);
        out.write_all(&map).unwrap();
        drop(out);
        assert_bytes(
            &std::fs::read(&out_path).unwrap(),
            &file.data,
            "written after touching",
        );
    });
}
