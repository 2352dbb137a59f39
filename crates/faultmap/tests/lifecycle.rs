//! Dropping mappings, objects and the pager, in any order: live mappings keep
//! working, the handler threads live until the last mapping goes, and nothing
//! hangs or stays mapped.

mod common;
use common::MapTrusted;

use std::time::Duration;

use common::*;
use faultmap::{Config, MapOptions, MemStore, Pager};

fn pager(handler_threads: usize) -> Pager {
    Pager::new(Config::default().handler_threads(handler_threads)).expect("Pager::new")
}

#[test]
fn dropping_a_mapping_leaves_the_others_working() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(TABLE + 40 * PAGE + 3, 900);
        let pager = pager(2);
        let object = pager.open(file.store()).unwrap();
        let a = pager.map_trusted(&object, MapOptions::new()).unwrap();
        let b = pager
            .map_trusted(&object, MapOptions::new().offset(PAGE as u64 * 3))
            .unwrap();
        let c = pager
            .map_trusted(
                &object,
                MapOptions::new().offset(TABLE as u64).fault_around_order(0),
            )
            .unwrap();
        assert_eq!(pager.mappings(), 3);
        // A reads half; B is dropped having read a little; C and A carry on.
        assert_bytes(&a[..TABLE / 2], &file.data[..TABLE / 2], "a, first half");
        assert_eq!(read_byte(&b, 0), file.data[3 * PAGE]);
        drop(b);
        assert_eq!(pager.mappings(), 2);
        assert_bytes(&c, &file.data[TABLE..], "c after b's drop");
        assert_bytes(&a, &file.data, "a after b's drop");
        drop(a);
        assert_eq!(pager.mappings(), 1);
        // A new mapping, possibly at a reused address, is served correctly.
        let d = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(9))
            .unwrap();
        assert_bytes(&d, &file.data, "d");
        assert_bytes(&c, &file.data[TABLE..], "c again");
        drop((c, d));
        assert_eq!(pager.mappings(), 0);
    });
}

#[test]
fn mappings_outlive_the_pager() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(TABLE + 5 * PAGE + 1, 901);
        let pager = pager(3);
        let cold = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
        let object = pager.open(file.store()).unwrap();
        let shared = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(0))
            .unwrap();
        drop(pager);
        // Every page of `cold` is still unread: its faults need the threads.
        assert_eq!(cold.stats().pgfault, 0);
        assert_bytes(&cold, &file.data, "cold mapping after the pager's drop");
        assert!(stats_when(|| cold.stats(), |s| s.pgmajfault > 0).pgmajfault > 0);
        assert_bytes(&shared, &file.data, "second mapping after the pager's drop");
        drop(cold);
        // The threads stay while one mapping is left.
        assert_bytes(&shared, &file.data, "the last mapping");
        drop(shared);
        // The object survives its mappings and its pager: its cache and counters.
        let len = file.data.len() as u64;
        assert_eq!(
            stats_when(|| object.stats(), |s| s.io_bytes >= len).io_bytes,
            len
        );
    });
}

#[test]
fn a_pager_without_mappings_drops_cleanly() {
    watchdog(WATCHDOG, || {
        for threads in [1, 2, 8] {
            let pager = pager(threads);
            let file = TestFile::new(PAGE, 902);
            let object = pager.open(file.store()).unwrap();
            drop(pager);
            assert_eq!(object.len(), PAGE as u64);
        }
    });
}

#[test]
fn a_thousand_small_mappings_come_and_go() {
    watchdog(Duration::from_secs(120), || {
        let data = pattern(300 * PAGE + 5, 903);
        let pager = pager(2);
        let object = pager
            .open(MemStore::new("thousand-small", data.clone()))
            .unwrap();
        let mut held = Vec::new();
        for i in 0..1000usize {
            let offset = (i * 7919) % (data.len() - 1);
            let len = 1 + (i * 31) % (data.len() - offset).min(3 * PAGE);
            let map = pager
                .map_trusted(
                    &object,
                    MapOptions::new()
                        .offset(offset as u64)
                        .len(len as u64)
                        .fault_around_order((i % 10) as u8),
                )
                .unwrap();
            assert_eq!(read_byte(&map, 0), data[offset], "mapping {i}");
            assert_eq!(
                read_byte(&map, len - 1),
                data[offset + len - 1],
                "mapping {i}"
            );
            // Keep some alive for a while, so drops interleave with new maps.
            if i % 3 == 0 {
                held.push(map);
            }
            if held.len() > 20 {
                held.remove(i % held.len());
            }
        }
        assert!(pager.mappings() > 0);
        drop(held);
        assert_eq!(pager.mappings(), 0, "mappings left behind");
        let unmapped = wait_until(Duration::from_secs(10), || {
            vmas_named("thousand-small")
                .iter()
                .all(|v| v.perms != "r--s")
        });
        assert!(unmapped, "dropped mappings left in the address space");
        // The pager still serves new mappings.
        let last = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&last, &data, "after a thousand mappings");
        drop(last);
        assert_eq!(pager.mappings(), 0);
    });
}

/// Threads and open file descriptors of this process.
fn resources() -> (usize, usize) {
    let count = |dir| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    (count("/proc/self/task"), count("/proc/self/fd"))
}

/// Waits (bounded) until the process is back to `base` threads and file
/// descriptors, and says where it stands if it is not.
fn back_to(base: (usize, usize), what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while resources() != base && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        resources(),
        base,
        "{what}: (threads, fds) did not come back to where they were"
    );
}

const COUNTS_OK: &str = "CHILD: threads and fds came back after every drop order";

#[test]
fn many_pagers_come_and_go() {
    // Each pager has its own userfaultfd and threads; they must all stop,
    // and every descriptor close, whatever the drop order. Counted in a
    // child process: the other tests of this binary make threads too.
    let name = "many_pagers_come_and_go";
    if !is_child(name) {
        let end = run_child(name, Duration::from_secs(120));
        assert!(
            end.status.is_some_and(|s| s.success()) && end.stdout.contains(COUNTS_OK),
            "{end:?}"
        );
        return;
    }
    let data = pattern(20 * PAGE, 904);
    // The process-wide parts that live on (the chunk pool's thread, the
    // region table) start with the first mapping that reads.
    {
        let pager = pager(1);
        let map = pager
            .map_trusted(MemStore::new("warm", data.clone()), MapOptions::new())
            .unwrap();
        assert_eq!(read_byte(&map, 0), data[0]);
    }
    // Settled: the same counts twice, 100 ms apart.
    let mut base = resources();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = resources();
        if now == base {
            break;
        }
        base = now;
    }
    for i in 0..50usize {
        let pager = pager(1 + i % 3);
        let map = pager
            .map_trusted(MemStore::new("p", data.clone()), MapOptions::new())
            .unwrap();
        assert_eq!(read_byte(&map, i * PAGE / 3), data[i * PAGE / 3]);
        if i % 2 == 0 {
            drop(pager);
            drop(map);
        } else {
            drop(map);
            drop(pager);
        }
        back_to(base, &format!("pager {i}"));
    }
    // An object that outlives its pager and mappings.
    let pager = pager(2);
    let object = pager.open(MemStore::new("o", data.clone())).unwrap();
    let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
    assert_eq!(read_byte(&map, 5), data[5]);
    drop(map);
    drop(pager);
    // The object keeps its cache (one memfd), nothing else.
    back_to((base.0, base.1 + 1), "object outliving its pager");
    drop(object);
    back_to(base, "object dropped last");
    // A budget (the pager's evictor), an object's own budget (its
    // evictor), and a writable mapping (the flusher).
    let pager = Pager::new(Config::default().memory_budget(faultmap::MIN_BUDGET)).unwrap();
    let mut rw = pager
        .map_mut_trusted(MemStore::new("w", data.clone()), MapOptions::new())
        .unwrap();
    rw[3] = 1;
    std::thread::sleep(Duration::from_millis(100));
    let before_own = resources();
    let own = pager
        .open_with_budget(MemStore::new("b", data.clone()), faultmap::MIN_BUDGET)
        .unwrap();
    let map = pager.map_trusted(&own, MapOptions::new()).unwrap();
    assert_eq!(read_byte(&map, 7), data[7]);
    drop(map);
    drop(own);
    back_to(before_own, "an object's own budget and evictor end with it");
    drop(pager);
    drop(rw);
    back_to(base, "budgets and a writable mapping");
    println!("{COUNTS_OK}");
}

#[test]
fn mappings_are_read_only_shared_registered_and_not_inherited_by_fork() {
    watchdog(WATCHDOG, || {
        let name = "vma-flags-probe";
        let data = pattern(40 * PAGE + 3, 905);
        let pager = pager(1);
        let map = pager
            .map_trusted(
                MemStore::new(name, data.clone()),
                MapOptions::new().offset(PAGE as u64 + 1),
            )
            .unwrap();
        let base = map.as_ptr() as usize - lead(&map);
        let vmas = vmas_named(name);
        let vma = vmas
            .iter()
            .find(|v| v.start <= base && base < v.end)
            .unwrap_or_else(|| panic!("no VMA at the mapping's address: {vmas:?}"));
        assert_eq!(
            (vma.start, vma.end),
            (base, base + mapped_pages(&map) * PAGE),
            "the mapping's VMA is not exactly its pages"
        );
        assert_eq!(
            vma.perms, "r--s",
            "an application mapping is read-only and shared"
        );
        for flag in ["dc", "um", "ui"] {
            assert!(
                vma.flags.iter().any(|f| f == flag),
                "VmFlags lacks {flag} (dc: MADV_DONTFORK; um/ui: userfaultfd MISSING/MINOR): {vma:?}"
            );
        }
        assert_bytes(&map, &data[PAGE + 1..], "through the mapping");
    });
}

#[test]
fn dropped_mappings_are_unmapped() {
    watchdog(WATCHDOG, || {
        let name = "unmap-probe";
        let data = pattern(10 * PAGE, 906);
        let pager = pager(2);
        let object = pager.open(MemStore::new(name, data.clone())).unwrap();
        let shared_ro = |v: &Vma| v.perms == "r--s";
        let maps: Vec<_> = (0..30)
            .map(|i| {
                let map = pager
                    .map_trusted(&object, MapOptions::new().fault_around_order(i % 10))
                    .unwrap();
                assert_eq!(read_byte(&map, i as usize * 100), data[i as usize * 100]);
                map
            })
            .collect();
        assert_eq!(vmas_named(name).iter().filter(|v| shared_ro(v)).count(), 30);
        drop(maps);
        // A handler still finishing a fault may hold a region for a moment:
        // the range goes when it lets go.
        let mut left = Vec::new();
        let gone = wait_until(Duration::from_secs(10), || {
            left = vmas_named(name)
                .into_iter()
                .filter(|v| shared_ro(v))
                .collect();
            left.is_empty()
        });
        assert!(
            gone,
            "mappings still in the address space after drop: {left:?}"
        );
        assert_eq!(pager.mappings(), 0);
    });
}

/// Threads of this process named `faultmap-N` (handler threads) and
/// `faultmap-watchdog` (counted with them), and `faultmap-io-N` (I/O
/// threads); the process-wide chunk-pool refiller (`faultmap-pool`) and
/// the service thread of forked children (`faultmap-guests`, and its
/// short-lived `faultmap-guest-end`) belong to no pager and are not
/// counted.
fn pager_threads() -> (usize, usize) {
    let names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .collect();
    let io = names
        .iter()
        .filter(|n| n.starts_with("faultmap-io-"))
        .count();
    let all = names
        .iter()
        .filter(|n| {
            n.starts_with("faultmap-")
                && !n.starts_with("faultmap-pool")
                && !n.starts_with("faultmap-guest")
        })
        .count();
    (all - io, io)
}

#[test]
fn handler_threads_stop_with_the_last_mapping() {
    // Counting threads needs a process with no other test's pager in it.
    const NAME: &str = "handler_threads_stop_with_the_last_mapping";
    if is_child(NAME) {
        assert_eq!(pager_threads(), (0, 0));
        let data = pattern(8 * PAGE, 907);
        let pager = Pager::new(Config::default().handler_threads(3).io_threads(2)).unwrap();
        // 3 handler threads and the store-timeout watchdog; 2 I/O threads.
        let running = (3 + 1, 2);
        // A new thread names itself once it runs: wait for that.
        wait_until(Duration::from_secs(10), || pager_threads() == running);
        assert_eq!(pager_threads(), running);
        let a = pager
            .map_trusted(MemStore::new("a", data.clone()), MapOptions::new())
            .unwrap();
        let b = pager
            .map_trusted(MemStore::new("b", data.clone()), MapOptions::new())
            .unwrap();
        drop(pager);
        assert_eq!(
            pager_threads(),
            running,
            "the pager's drop stopped threads mappings need"
        );
        assert_bytes(&a, &data, "a");
        drop(a);
        assert_eq!(
            pager_threads(),
            running,
            "threads stopped while a mapping is left"
        );
        assert_bytes(&b, &data, "b");
        drop(b);
        // Joined, so exited; /proc may list an exiting thread a moment longer.
        wait_until(Duration::from_secs(10), || pager_threads() == (0, 0));
        assert_eq!(pager_threads(), (0, 0), "threads outlived the last mapping");
        println!("CHILD: done");
        return;
    }
    let end = run_child(NAME, Duration::from_secs(30));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains("CHILD: done"),
        "child failed: {end:?}"
    );
}

#[test]
fn faults_race_with_mapping_and_unmapping() {
    // Readers fault through their mappings while another thread maps and
    // drops other mappings of the same object (the region table changes
    // under every lookup).
    watchdog(WATCHDOG, || {
        let file = TestFile::new(TABLE + 100 * PAGE + 7, 908);
        let pager = pager(2);
        let object = pager.open(file.store()).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let churn = s.spawn(|| {
                let mut i = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let offset = (i * 37 * PAGE + i) % (file.data.len() - 1);
                    let map = pager
                        .map_trusted(
                            &object,
                            MapOptions::new()
                                .offset(offset as u64)
                                .len(1 + (i * 4099) as u64 % (file.data.len() - offset) as u64)
                                .fault_around_order((i % 10) as u8),
                        )
                        .unwrap();
                    assert_eq!(read_byte(&map, 0), file.data[offset], "churn {i}");
                    drop(map);
                    i += 1;
                }
                i
            });
            let readers: Vec<_> = (0..2u64)
                .map(|r| {
                    let (pager, object, data) = (&pager, &object, &file.data);
                    s.spawn(move || {
                        for round in 0..4u64 {
                            let map = pager
                                .map_trusted(
                                    object,
                                    MapOptions::new().fault_around_order((round * 3) as u8),
                                )
                                .unwrap();
                            let pages = mapped_pages(&map);
                            for k in 0..pages {
                                // A stride through the pages, different per reader.
                                let page = (k * 7 + r as usize * 13 + round as usize) % pages;
                                let range = page_range(&map, page);
                                assert_bytes(&map[range.clone()], &data[range], "reader");
                            }
                        }
                    })
                })
                .collect();
            for r in readers {
                r.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(churn.join().unwrap() > 0);
        });
        assert_eq!(pager.mappings(), 0);
    });
}
