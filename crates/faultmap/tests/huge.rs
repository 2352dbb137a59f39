//! 2 MiB pages through real mappings: a hugetlb memfd cache, one
//! `UFFDIO_CONTINUE` per 2 MiB page in both deliveries, unaligned offsets
//! and a tail page, a memory budget, write-back, invalidation, traces, and
//! the refusals (an empty pool of huge pages, a page size that does not
//! match the object).
//!
//! The tests reserve the huge pages they need through
//! `/proc/sys/vm/nr_hugepages` (as root, which CI is) and give them back
//! when they end; one test at a time holds the pool. A machine where the
//! pool cannot be grown fails these tests, loudly: they are not skipped.

mod common;
use common::MapTrusted;

use std::sync::{Mutex, MutexGuard};

use common::{assert_bytes, watchdog, TestFile, PAGE, WATCHDOG};
use faultmap::{
    CacheError, Config, Delivery, MapError, MapOptions, PageSize, Pager, HUGE_PAGE_SIZE,
};

const HUGE: usize = HUGE_PAGE_SIZE;
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// The pool of huge pages, grown by `extra` pages for one test and given
/// back on drop. Tests take it one at a time.
struct Pool {
    old: u64,
    _one_at_a_time: MutexGuard<'static, ()>,
}

static POOL: Mutex<()> = Mutex::new(());

fn read_pool() -> u64 {
    std::fs::read_to_string(NR_HUGEPAGES)
        .expect("read /proc/sys/vm/nr_hugepages")
        .trim()
        .parse()
        .expect("a number of huge pages")
}

impl Pool {
    fn grow(extra: u64) -> Pool {
        let guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let old = read_pool();
        std::fs::write(NR_HUGEPAGES, (old + extra).to_string()).unwrap_or_else(|e| {
            panic!(
                "cannot grow the pool of huge pages ({NR_HUGEPAGES}: {e}); \
                 these tests need root"
            )
        });
        let now = read_pool();
        let pool = Pool {
            old,
            _one_at_a_time: guard,
        };
        assert!(
            now >= old + extra,
            "the kernel gave {now} huge pages of {} asked",
            old + extra
        );
        pool
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.old.to_string());
    }
}

fn huge() -> MapOptions {
    MapOptions::new().page_size(PageSize::Huge)
}

#[test]
fn every_byte_reads_right_with_one_fault_per_2_mib_page_in_both_deliveries() {
    watchdog(WATCHDOG, || {
        let _pool = Pool::grow(4);
        // 3 pages and a tail of 100 bytes: 4 huge pages.
        let len = 3 * HUGE + 100;
        let file = TestFile::new(len, 11);
        for delivery in [Delivery::Signal, Delivery::Handler] {
            let pager = Pager::new(Config::default().delivery(delivery)).unwrap();
            let map = pager.map_trusted(file.store(), huge()).unwrap();
            assert_eq!(map.object().page_size(), PageSize::Huge);
            // One byte of every 4 KiB page first: 4 faults map it all.
            let mut sum = 0u64;
            for p in (0..len).step_by(PAGE) {
                sum += u64::from(map[p]);
            }
            let stats = map.stats();
            assert_eq!(stats.pgfault, 4, "{delivery:?}: {stats:?}");
            // The first reads its page; readahead may have read the rest.
            assert!(
                (1..=4).contains(&stats.pgmajfault),
                "{delivery:?}: {stats:?}"
            );
            assert_eq!(
                sum,
                file.data
                    .iter()
                    .step_by(PAGE)
                    .map(|&b| u64::from(b))
                    .sum::<u64>()
            );
            assert_bytes(&map, &file.data, "a mapping of 2 MiB pages");
            assert_eq!(map.object().cached_bytes(), 4 * HUGE as u64);
            // The process's page tables hold it as huge pages (PMDs).
            assert_eq!(map.stats().pgfault, 4, "{delivery:?}: no 4 KiB faults");
        }
    });
}

#[test]
fn an_unaligned_offset_maps_from_its_page_and_the_tail_reads_as_the_file() {
    watchdog(WATCHDOG, || {
        let _pool = Pool::grow(3);
        let len = 2 * HUGE + 12_345;
        let file = TestFile::new(len, 12);
        let pager = Pager::new(Config::default()).unwrap();
        let start = HUGE + 4097;
        let map = pager
            .map_trusted(file.store(), huge().offset(start as u64))
            .unwrap();
        assert_eq!(map.len(), len - start);
        assert_bytes(&map, &file.data[start..], "an unaligned mapping");
        // Two pages: the one that holds `start`, and the tail.
        assert_eq!(map.stats().pgfault, 2);
    });
}

#[test]
fn without_enough_huge_pages_mapping_fails_and_says_how_many() {
    watchdog(WATCHDOG, || {
        // Nothing added: the pool has what it had (none on a fresh
        // machine), and the test holds it, so no other test adds any.
        let _pool = Pool::grow(0);
        let free =
            std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap();
        let pages = free + 3;
        let file = TestFile::new(pages as usize * HUGE, 13);
        let pager = Pager::new(Config::default()).unwrap();
        let err = pager.map_trusted(file.store(), huge()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, MapError::Cache(CacheError::HugePages { needed, .. }) if needed == pages),
            "{err:?}"
        );
        assert!(
            text.contains("vm.nr_hugepages") && text.contains(&format!("needs {pages} huge pages")),
            "{text}"
        );
        // Nothing fell back to 4 KiB pages: the same map with 4 KiB works.
        let map = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
        assert_eq!(map.object().page_size(), PageSize::Base);
    });
}

#[test]
fn an_object_is_mapped_with_its_own_page_size_only() {
    watchdog(WATCHDOG, || {
        let _pool = Pool::grow(1);
        let file = TestFile::new(HUGE, 14);
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(file.store()).unwrap();
        let err = pager.map_trusted(&object, huge()).unwrap_err();
        assert!(matches!(err, MapError::PageSize { .. }), "{err:?}");
        assert!(err.to_string().contains("4K pages"), "{err}");
        // The pager's default page size opens huge objects.
        let pager = Pager::new(Config::default().page_size(PageSize::Huge)).unwrap();
        let object = pager.open(file.store()).unwrap();
        assert_eq!(object.page_size(), PageSize::Huge);
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&map, &file.data, "the pager's page size");
    });
}
