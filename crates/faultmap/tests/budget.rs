//! The memory budget: the cache stays within it while the data stays
//! right, the CLOCK hand evicts what is not used, and a hot set survives
//! one-pass scans (refault detection).

mod common;
use common::MapTrusted;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_bytes, pattern, wait_until, watchdog, PAGE, WATCHDOG};
use faultmap::{Config, Delivery, MapOptions, MemStore, Pager, MIN_BUDGET};

const BUDGET: u64 = 4 << 20;
const BUDGET_PAGES: u64 = BUDGET / PAGE as u64;

fn pager(delivery: Delivery) -> Pager {
    Pager::new(Config::default().delivery(delivery).memory_budget(BUDGET)).expect("pager")
}

/// The cache's peak may exceed the budget by the pages faults wait for
/// while the evictor catches up: at most one per fault in flight.
fn assert_within_budget(peak: u64, what: &str) {
    let slack = 8 * PAGE as u64;
    assert!(
        peak <= BUDGET + slack,
        "{what}: peak {peak} bytes cached, budget {BUDGET}"
    );
}

#[test]
fn a_scan_four_times_the_budget_stays_within_it_and_reads_right() {
    watchdog(WATCHDOG, || {
        for delivery in [Delivery::Signal, Delivery::Handler] {
            let len = 4 * BUDGET as usize;
            let data: Arc<[u8]> = pattern(len, 5).into();
            let pager = pager(delivery);
            let map = pager
                .map_trusted(MemStore::new("scan", data.clone()), MapOptions::new())
                .expect("map");
            for chunk in (0..len).step_by(1 << 20) {
                let end = (chunk + (1 << 20)).min(len);
                assert_bytes(&map[chunk..end], &data[chunk..end], "scan");
            }
            let mem = pager.memory();
            let stats = pager.stats();
            assert_within_budget(mem.peak, &format!("{delivery:?}"));
            assert!(mem.cached <= BUDGET + 8 * PAGE as u64);
            assert!(
                stats.evicted >= (len as u64 - BUDGET) / PAGE as u64 / 2,
                "{delivery:?}: {stats:?}"
            );
            assert_eq!(mem.budget, Some(BUDGET));
            // Read again: what was evicted comes back right.
            for chunk in (0..len).step_by(1 << 20).rev() {
                let end = (chunk + (1 << 20)).min(len);
                assert_bytes(&map[chunk..end], &data[chunk..end], "second scan");
            }
            assert_within_budget(pager.memory().peak, "second scan");
        }
    });
}

#[test]
fn random_reads_from_two_threads_under_a_budget_are_right() {
    watchdog(WATCHDOG, || {
        let len = 6 * BUDGET as usize;
        let data: Arc<[u8]> = pattern(len, 9).into();
        let pager = pager(Delivery::Signal);
        let map = Arc::new(
            pager
                .map_trusted(
                    MemStore::new("rand", data.clone()),
                    MapOptions::new().fault_around_order(2),
                )
                .expect("map"),
        );
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (map, data) = (map.clone(), data.clone());
                std::thread::spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let page = (x % (len / PAGE) as u64) as usize;
                        let off = page * PAGE + (x >> 40) as usize % PAGE;
                        assert_eq!(map[off], data[off], "page {page}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("reader");
        }
        assert_within_budget(pager.memory().peak, "random");
        assert!(pager.stats().evicted > 0);
    });
}

/// A small hot set, used between one-pass scans of objects twice the
/// budget each: the first scan may evict it (nothing has shown it is hot
/// yet), but its refault puts it in the active set, and from then on no
/// scan evicts it.
#[test]
fn the_hot_set_survives_one_pass_scans() {
    watchdog(WATCHDOG, || {
        for delivery in [Delivery::Signal, Delivery::Handler] {
            let pager = pager(delivery);
            let hot_pages = 64;
            let hot_data: Arc<[u8]> = pattern(hot_pages * PAGE, 1).into();
            let hot = pager
                .map_trusted(MemStore::new("hot", hot_data.clone()), MapOptions::new())
                .expect("map hot");
            let rounds = 6;
            let scan_len = 2 * BUDGET as usize;
            let scan_data: Arc<[u8]> = pattern(rounds * scan_len, 2).into();
            let scan = pager
                .map_trusted(MemStore::new("scan", scan_data.clone()), MapOptions::new())
                .expect("map scan");
            let use_hot = || {
                for p in 0..hot_pages {
                    assert_eq!(hot[p * PAGE + 7], hot_data[p * PAGE + 7]);
                }
            };
            use_hot();
            let mut lost = Vec::new();
            for r in 0..rounds {
                let before = pager.stats().evicted;
                let part = r * scan_len..(r + 1) * scan_len;
                let mut sum = 0u64;
                for off in part.clone().step_by(PAGE) {
                    sum += u64::from(scan[off]);
                }
                std::hint::black_box(sum);
                assert!(
                    pager.stats().evicted - before >= BUDGET_PAGES / 2,
                    "round {r}: the scan must push pages out"
                );
                let gone = (0..hot_pages as u64)
                    .filter(|&p| !hot.object().is_cached(p))
                    .count();
                lost.push(gone);
                use_hot();
            }
            let stats = pager.stats();
            assert!(
                lost[2..].iter().all(|&n| n == 0),
                "{delivery:?}: hot pages evicted per round {lost:?} ({stats:?})"
            );
            assert_within_budget(pager.memory().peak, "hot set");
        }
    });
}

#[test]
fn an_object_can_have_a_budget_of_its_own() {
    watchdog(WATCHDOG, || {
        let pager = Pager::new(Config::default()).expect("pager");
        let len = 4 * MIN_BUDGET as usize;
        let data: Arc<[u8]> = pattern(len, 3).into();
        let object = pager
            .open_with_budget(MemStore::new("own", data.clone()), MIN_BUDGET)
            .expect("open");
        let map = pager.map_trusted(&object, MapOptions::new()).expect("map");
        assert_bytes(&map[..], &data[..], "own budget");
        let mem = object.memory();
        assert_eq!(mem.budget, Some(MIN_BUDGET));
        assert!(mem.peak <= MIN_BUDGET + 8 * PAGE as u64, "{mem:?}");
        assert_eq!(pager.memory().cached, 0, "not charged to the pager");
        assert!(object.stats().evicted > 0);
        assert!(matches!(
            pager.open_with_budget(MemStore::new("tiny", vec![0u8; 10]), 4096),
            Err(faultmap::MapError::Options(faultmap::ConfigError::Budget(
                4096
            )))
        ));
        assert!(matches!(
            Pager::new(Config::default().memory_budget(100)),
            Err(faultmap::PagerError::Config(faultmap::ConfigError::Budget(
                100
            )))
        ));
    });
}

/// Dropping mappings and objects gives their pages back to the budget.
#[test]
fn dropped_objects_leave_the_budget() {
    watchdog(WATCHDOG, || {
        let pager = pager(Delivery::Signal);
        let data: Arc<[u8]> = pattern(BUDGET as usize / 2, 4).into();
        let map = pager
            .map_trusted(MemStore::new("drop", data.clone()), MapOptions::new())
            .expect("map");
        assert_bytes(&map[..], &data[..], "read");
        assert!(pager.memory().cached >= data.len() as u64 / 2);
        drop(map);
        // An I/O thread may still hold the object for a moment after its
        // last read woke the fault (it drops the job after).
        assert!(
            wait_until(Duration::from_secs(10), || pager.memory().cached == 0),
            "{:?}",
            pager.memory()
        );
    });
}
