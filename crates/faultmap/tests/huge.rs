//! 2 MiB pages through real mappings: a hugetlb memfd cache, one
//! `UFFDIO_CONTINUE` per 2 MiB page in both deliveries, unaligned offsets
//! and a tail page, a memory budget, write-back, invalidation, traces, and
//! the refusals (an empty pool of huge pages, a page size that does not
//! match the object).
//!
//! The tests grow the kernel's pool of huge pages by what they need
//! (`/proc/sys/vm/nr_hugepages`, as root, which CI is) and shrink it by as
//! much when they end, holding the lock file that every suite of this
//! project and `faultmap bench` take to change the pool, so that tests in
//! other processes never change it under them. A machine where the pool
//! cannot be grown fails these tests, loudly: they are not skipped.

mod common;
use common::MapTrusted;

use std::fs::File;
use std::os::fd::AsRawFd;

use common::{assert_bytes, watchdog, TestFile, PAGE, WATCHDOG};
use faultmap::measure::HugePagePool;
use faultmap::{
    CacheError, Config, ConfigError, Delivery, MapError, MapOptions, PageSize, Pager,
    HUGE_PAGE_SIZE,
};

const HUGE: usize = HUGE_PAGE_SIZE;

/// Holds the pool of huge pages for one test, grown by `extra` pages
/// (taken out again, and the pool's lock file let go, on drop). A machine
/// where the pool cannot be grown fails the test.
fn pool(extra: u64) -> HugePagePool {
    let mut pool = HugePagePool::lock().expect("the pool's lock file");
    pool.grow(extra).unwrap_or_else(|e| {
        panic!("cannot grow the pool of huge pages by {extra} ({e}); these tests need root")
    });
    pool
}

fn free_pages() -> u64 {
    HugePagePool::free().expect("free_hugepages")
}

/// A hugetlb memfd holding `pages` huge pages of the pool (allocated with
/// `fallocate`), given back when it is dropped: another process's pages.
fn hold_huge_pages(pages: u64) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name; the flags ask for a hugetlb memfd.
    let fd = unsafe {
        libc::memfd_create(
            c"hog".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
        )
    };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: the kernel just returned this descriptor; nobody else owns it.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let len = (pages * HUGE as u64) as libc::off_t;
    // SAFETY: fallocate on a descriptor this function owns.
    let rc = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, len) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    fd
}

fn huge() -> MapOptions {
    MapOptions::new().page_size(PageSize::Huge)
}

#[test]
fn every_byte_reads_right_with_one_fault_per_2_mib_page_in_both_deliveries() {
    watchdog(WATCHDOG, || {
        let _pool = pool(4);
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
        let _pool = pool(3);
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
        // The pool as it is, held: no other test changes it meanwhile.
        let _pool = pool(0);
        let pages = free_pages() + 3;
        // A sparse file: nothing is read before the refusal.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        File::create(&path)
            .unwrap()
            .set_len(pages * HUGE as u64)
            .unwrap();
        let pager = Pager::new(Config::default()).unwrap();
        let store = || faultmap::FileStore::open(&path).unwrap();
        let err = pager.map_trusted(store(), huge()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, MapError::Cache(CacheError::HugePages { needed, .. }) if needed == pages),
            "{err:?}"
        );
        assert!(
            text.contains("vm.nr_hugepages") && text.contains(&format!("needs {pages} huge pages")),
            "{text}"
        );
        assert_eq!(faultmap::errno_of(&err), libc::ENOMEM);
        // Nothing fell back to 4 KiB pages: the same map with 4 KiB works.
        let map = pager.map_trusted(store(), MapOptions::new()).unwrap();
        assert_eq!(map.object().page_size(), PageSize::Base);
        // A budget of fewer than 8 huge pages is refused before anything:
        // by the pager's configuration, and when a map opens an object of
        // 2 MiB pages under a pager's smaller budget.
        let small = 7 * HUGE as u64;
        let config = Config::default().memory_budget(small);
        assert_eq!(
            config.clone().page_size(PageSize::Huge).validate(),
            Err(ConfigError::HugeBudget(small))
        );
        let err = Pager::new(config.clone().page_size(PageSize::Huge)).unwrap_err();
        assert!(err.to_string().contains("at least 8"), "{err}");
        let err = Pager::new(config)
            .unwrap()
            .map_trusted(store(), huge())
            .unwrap_err();
        assert!(
            matches!(err, MapError::Options(ConfigError::HugeBudget(b)) if b == small),
            "{err:?}"
        );
    });
}

#[test]
fn an_object_is_mapped_with_its_own_page_size_only() {
    watchdog(WATCHDOG, || {
        let _pool = pool(1);
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

#[test]
fn a_budget_evicts_whole_2_mib_pages_and_what_comes_back_reads_right() {
    watchdog(WATCHDOG, || {
        // A budget of 8 huge pages over an object of 32: the pool needs
        // only the budget's pages (and a few in flight).
        const BUDGET: u64 = 8 * HUGE as u64;
        let _pool = pool(12);
        let len = 32 * HUGE;
        let file = TestFile::new(len, 15);
        for delivery in [Delivery::Signal, Delivery::Handler] {
            let config = Config::default()
                .delivery(delivery)
                .memory_budget(BUDGET)
                .page_size(PageSize::Huge);
            let pager = Pager::new(config).unwrap();
            let map = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
            for round in 0..2 {
                for page in 0..32 {
                    let r = page * HUGE..(page + 1) * HUGE;
                    assert_bytes(&map[r.clone()], &file.data[r], &format!("round {round}"));
                }
            }
            let mem = pager.memory();
            // A page a fault waits for is charged over the limit until the
            // evictor catches up: one per fault in flight.
            assert!(
                mem.peak <= BUDGET + 2 * HUGE as u64,
                "{delivery:?}: {mem:?}"
            );
            assert_eq!(mem.budget, Some(BUDGET));
            let stats = pager.stats();
            assert!(stats.evicted >= 48, "{delivery:?}: {stats:?}");
            // Charges count bytes: a huge page is 2 MiB of the budget.
            assert_eq!(mem.cached % HUGE as u64, 0, "{mem:?}");
        }
    });
}

#[test]
fn writes_to_2_mib_pages_reach_the_file_on_flush() {
    watchdog(WATCHDOG, || {
        let _pool = pool(3);
        let len = 2 * HUGE + 777;
        let file = TestFile::new(len, 16);
        let pager = Pager::new(Config::default().delivery(Delivery::Handler)).unwrap();
        let store = faultmap::FileStore::open_rw(&file.path).unwrap();
        let mut map = pager.map_mut_trusted(store, huge()).unwrap();
        let mut expected = file.data.clone();
        // Read the first page (mapped write-protected), then write to it
        // and to the tail page, never read.
        assert_bytes(&map[..HUGE], &expected[..HUGE], "before writing");
        for at in [5, HUGE - 1, 2 * HUGE + 776] {
            map[at] ^= 0xFF;
            expected[at] ^= 0xFF;
        }
        assert_bytes(&map, &expected, "the mapping reads its writes");
        // Two pages are dirty, each whole.
        assert_eq!(map.object().dirty_bytes(), 2 * HUGE as u64);
        let written = map.flush(0..map.len()).unwrap();
        assert_eq!(written, 2);
        assert_eq!(map.object().dirty_bytes(), 0);
        // The file keeps its length: the tail page is cut at the end.
        assert_bytes(
            &std::fs::read(&file.path).unwrap(),
            &expected,
            "the file after flush",
        );
        // Protected again by the flush: a second write is seen again.
        map[HUGE + 3] ^= 0x0F;
        expected[HUGE + 3] ^= 0x0F;
        assert_eq!(map.object().dirty_bytes(), HUGE as u64);
        map.object().flush().unwrap();
        assert_bytes(&std::fs::read(&file.path).unwrap(), &expected, "round 2");
    });
}

#[test]
fn invalidation_drops_whole_2_mib_pages_and_the_next_touch_reads_them_again() {
    watchdog(WATCHDOG, || {
        let _pool = pool(4);
        let len = 4 * HUGE;
        let file = TestFile::new(len, 17);
        let pager = Pager::new(Config::default()).unwrap();
        let map = pager.map_trusted(file.store(), huge()).unwrap();
        assert_bytes(&map, &file.data, "first read");
        let object = map.object();
        assert_eq!(object.cached_bytes(), len as u64);
        // One byte of page 1 drops all of page 1.
        assert_eq!(
            object
                .invalidate(HUGE as u64 + 10..HUGE as u64 + 11)
                .unwrap(),
            1
        );
        assert_eq!(object.cached_bytes(), 3 * HUGE as u64);
        assert!(!object.is_cached(1) && object.is_cached(0) && object.is_cached(2));
        let before = map.stats();
        assert_bytes(&map, &file.data, "after invalidating");
        let after = map.stats();
        assert_eq!(after.pgmajfault - before.pgmajfault, 1, "{after:?}");
        assert_eq!(object.cached_bytes(), len as u64);
    });
}

#[test]
fn a_trace_of_2_mib_pages_replays_and_refuses_4_kib_objects() {
    watchdog(WATCHDOG, || {
        // Two objects of 8 pages: the recording one's pages go back to
        // the pool only once its last mapping is gone.
        let _pool = pool(16);
        let len = 8 * HUGE;
        let file = TestFile::new(len, 18);
        let pager = Pager::new(Config::default()).unwrap();
        let map = pager
            .map_trusted(file.store(), huge().record_trace())
            .unwrap();
        for page in [5usize, 1, 6] {
            assert_eq!(map[page * HUGE + 9], file.data[page * HUGE + 9]);
        }
        let trace = map.trace().unwrap();
        drop(map);
        assert_eq!(trace.page_size(), PageSize::Huge);
        assert_eq!(trace.runs(), &[5..6, 1..2, 6..7]);
        // Saved and loaded: the file keeps the page size.
        let path = file.dir.path().join("trace");
        trace.save(&path).unwrap();
        let trace = faultmap::Trace::load(&path).unwrap();
        assert_eq!(trace.page_size(), PageSize::Huge);
        // Replayed on a fresh object of 2 MiB pages: its pages are read
        // before they are touched.
        let map = pager
            .map_trusted(file.store(), huge().replay_trace(trace.clone()))
            .unwrap();
        assert!(common::wait_until(
            std::time::Duration::from_secs(20),
            || map.replay_progress().is_some_and(|p| p.done)
        ));
        // Its reads end in their own time.
        let cached = |p| map.object().is_cached(p);
        assert!(common::wait_until(
            std::time::Duration::from_secs(20),
            || [5, 1, 6].into_iter().all(cached)
        ));
        assert!(
            map.object().io_errors().is_empty(),
            "{:?}",
            map.object().io_errors()
        );
        assert_eq!(map.stats().pgfault, 0, "nothing touched yet");
        assert_bytes(&map, &file.data, "after the replay");
        // On 4 KiB pages the runs would name other bytes: refused.
        let err = pager
            .map_trusted(file.store(), MapOptions::new().replay_trace(trace))
            .unwrap_err();
        assert!(matches!(err, MapError::Trace(_)), "{err:?}");
        assert!(err.to_string().contains("2 MiB pages"), "{err}");
    });
}

#[test]
fn a_2_mib_page_that_fails_to_read_is_an_error_and_the_others_read_right() {
    // With handler delivery `Mapping::read_at` copies with the kernel's
    // access: the failed page is poisoned whole (2 MiB), which `read_at`
    // reports as `MapError::Read`; no byte of it is ever served, and the
    // pages around it read right.
    watchdog(WATCHDOG, || {
        let _pool = pool(4);
        let data = common::pattern(4 * HUGE, 19);
        // One bad 4 KiB page inside huge page 2.
        let bad = (2 * HUGE / PAGE + 77) as u64;
        let store = common::Instrumented::mem(&data, common::Faults::bad([bad]));
        let pager = Pager::new(Config::default().delivery(Delivery::Handler)).unwrap();
        let map = pager.map_trusted(store, huge()).unwrap();
        let mut buf = vec![0u8; 2 * HUGE];
        map.read_at(0, &mut buf).unwrap();
        assert_bytes(&buf, &data[..2 * HUGE], "the pages before the bad one");
        match map.read_at(2 * HUGE + 5, &mut [0u8; 10]) {
            Err(MapError::Read { offset, .. }) => assert_eq!(offset, 2 * HUGE as u64 + 5),
            other => panic!("expected MapError::Read, got {other:?}"),
        }
        map.read_at(3 * HUGE, &mut buf[..HUGE]).unwrap();
        assert_bytes(
            &buf[..HUGE],
            &data[3 * HUGE..],
            "the page after the bad one",
        );
        assert!(!map.object().is_cached(2));
    });
}

#[test]
fn threads_reading_one_2_mib_page_of_a_writable_mapping_do_not_dirty_it() {
    // Several threads fault on different 4 KiB offsets of one huge page
    // at once: one fault maps it, the others find it mapped. Reads they
    // are, so nothing is dirty; a write after them is, in both deliveries.
    watchdog(WATCHDOG, || {
        let _pool = pool(4);
        let len = 4 * HUGE;
        let file = TestFile::new(len, 20);
        for delivery in [Delivery::Handler, Delivery::Signal] {
            let pager = Pager::new(Config::default().delivery(delivery)).unwrap();
            let store = faultmap::FileStore::open_rw(&file.path).unwrap();
            let mut map = pager.map_mut_trusted(store, huge()).unwrap();
            for page in 0..4 {
                let barrier = std::sync::Barrier::new(4);
                let base = map.as_ptr() as usize + page * HUGE;
                std::thread::scope(|s| {
                    for t in 0..4usize {
                        let barrier = &barrier;
                        s.spawn(move || {
                            barrier.wait();
                            let at = base + t * 97 * PAGE + 13;
                            // SAFETY: inside the mapping, which outlives the
                            // scope; nothing writes it meanwhile.
                            unsafe { std::ptr::read_volatile(at as *const u8) }
                        });
                    }
                });
            }
            assert_bytes(&map, &file.data, "read by threads");
            assert_eq!(
                map.object().dirty_bytes(),
                0,
                "{delivery:?}: reads dirtied pages"
            );
            map[HUGE + 1] ^= 1;
            assert_eq!(map.object().dirty_bytes(), HUGE as u64, "{delivery:?}");
            map.flush(0..map.len()).unwrap();
            let mut expected = file.data.clone();
            expected[HUGE + 1] ^= 1;
            assert_bytes(
                &std::fs::read(&file.path).unwrap(),
                &expected,
                "{delivery:?}",
            );
            // Put the byte back for the next delivery mode.
            map[HUGE + 1] ^= 1;
            map.flush(0..map.len()).unwrap();
        }
    });
}

#[test]
fn a_pool_that_holds_only_the_budget_waits_for_the_evictor_instead_of_failing() {
    // The pool holds less than the budget (another process took pages
    // after the check): the evictor keeps the cache under what the pool
    // holds, and when the pool runs dry near the budget's limit a read
    // waits for it (`Budget::make_room`) rather than fail; no byte fails.
    // (Which of the two saves a read depends on the evictor's timing.)
    watchdog(WATCHDOG, || {
        const BUDGET: u64 = 8 * HUGE as u64;
        let _pool = pool(12);
        let len = 32 * HUGE;
        let file = TestFile::new(len, 21);
        let config = Config::default()
            .delivery(Delivery::Handler)
            .memory_budget(BUDGET)
            .page_size(PageSize::Huge);
        let pager = Pager::new(config).unwrap();
        // Opened while the pool has room for the check (budget + 4).
        let object = pager.open(file.store()).unwrap();
        // Then pages leave the pool until it has 6 free, less than the
        // budget (no surplus pages to fall back on).
        assert_eq!(
            std::fs::read_to_string("/proc/sys/vm/nr_overcommit_hugepages")
                .unwrap()
                .trim(),
            "0",
            "surplus huge pages would hide an empty pool"
        );
        // Another holder of huge pages takes all but 6 (whatever the pool
        // had free before the test).
        let _hog = hold_huge_pages(free_pages() - 6);
        assert_eq!(free_pages(), 6);
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let mut buf = vec![0u8; HUGE];
        for round in 0..2 {
            for page in 0..32 {
                map.read_at(page * HUGE, &mut buf)
                    .unwrap_or_else(|e| panic!("round {round}, page {page}: {e}"));
                assert_bytes(&buf, &file.data[page * HUGE..(page + 1) * HUGE], "a page");
            }
        }
        assert!(object.io_errors().is_empty(), "{:?}", object.io_errors());
        assert!(pager.stats().evicted >= 48);
    });
}
