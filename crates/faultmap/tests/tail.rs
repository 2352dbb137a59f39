//! The last page of an object that ends inside a page: the bytes between the
//! object's end and the page's end read as zero, as through a kernel mapping
//! of a file. They lie past the mapping's slice, so they are read through
//! `as_ptr()` (see `common::read_tail` for why that stays inside the mapping).

mod common;
use common::MapTrusted;

use common::*;
use faultmap::{Config, MapOptions, Pager};

const SIZES: [usize; 6] = [1, 100, PAGE - 1, PAGE + 1, 3 * PAGE + 5, TABLE + 17];

fn pager() -> Pager {
    Pager::new(Config::default()).expect("Pager::new")
}

#[test]
fn tail_read_first_is_zero() {
    watchdog(WATCHDOG, || {
        let pager = pager();
        for (i, size) in SIZES.into_iter().enumerate() {
            let file = TestFile::new(size, 200 + i as u64);
            for order in [0u8, 4, 9] {
                let map = pager
                    .map_trusted(file.store(), MapOptions::new().fault_around_order(order))
                    .unwrap();
                let what = format!("size {size}, order {order}");
                // The tail is the first thing touched: its fault reads the page.
                let tail = read_tail(&map);
                assert_eq!(tail.len(), size.next_multiple_of(PAGE) - size, "{what}");
                assert!(
                    tail.iter().all(|&b| b == 0),
                    "{what}: tail not zero: {tail:02x?}"
                );
                assert_eq!(
                    settle(&map, 1).pgfault,
                    1,
                    "{what}: the tail read was the one fault"
                );
                assert_bytes(&map, &file.data, &what);
            }
        }
    });
}

#[test]
fn tail_after_a_sequential_read_is_zero() {
    watchdog(WATCHDOG, || {
        let pager = pager();
        for (i, size) in SIZES.into_iter().enumerate() {
            let file = TestFile::new(size, 300 + i as u64);
            let object = pager.open(file.store()).unwrap();
            // Through an offset mapping too: its last page is the object's.
            for offset in [0, size / 2, size - 1] {
                let map = pager
                    .map_trusted(&object, MapOptions::new().offset(offset as u64))
                    .unwrap();
                let what = format!("size {size}, offset {offset}");
                assert_bytes(&map, &file.data[offset..], &what);
                let tail = read_tail(&map);
                assert_eq!(tail.len(), size.next_multiple_of(PAGE) - size, "{what}");
                assert!(
                    tail.iter().all(|&b| b == 0),
                    "{what}: tail not zero: {tail:02x?}"
                );
            }
        }
    });
}

#[test]
fn tail_after_a_failed_read_of_the_last_page_is_zero() {
    // The window read that covers the last page fails once (the store
    // scribbles over its buffer first), and the page is then read alone.
    watchdog(WATCHDOG, || {
        let pager = pager();
        let size = 5 * PAGE + 7;
        let file = TestFile::new(size, 400);
        let last = (size / PAGE) as u64;
        let store = Instrumented::new(file.store(), Faults::flaky([last]));
        let map = pager.map_trusted(store.clone(), MapOptions::new()).unwrap();
        let tail = read_tail(&map);
        assert!(tail.iter().all(|&b| b == 0), "tail not zero: {tail:02x?}");
        assert_bytes(&map, &file.data, "after a failed window read");
        let s = stats_when(|| map.stats(), |s| s.io_bytes >= size as u64);
        assert!(
            s.io_errors >= 1 && s.io_retry_single >= 1,
            "the flaky read was not exercised: {s:?}"
        );
        store.assert_contract_kept();
    });
}
