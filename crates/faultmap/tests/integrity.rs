//! Data integrity under a memory budget: random reads and writes from
//! several threads on a writable mapping of a file six times the budget,
//! with the evictor writing dirty pages back and evicting them all along,
//! checked against an in-memory model; then flush, drop everything, and
//! compare the file byte for byte.

mod common;
use common::MapTrusted;

use std::sync::{Arc, Mutex};

use common::{watchdog, TestFile, PAGE, WATCHDOG};
use faultmap::{Config, Delivery, FileStore, MapOptions, Pager};

const BUDGET: u64 = 4 << 20;
const THREADS: usize = 3;
const OPS: usize = 12_000;

fn run(delivery: Delivery) {
    let len = 6 * BUDGET as usize;
    let file = TestFile::new(len, 17);
    let model = Arc::new(Mutex::new(file.data.clone()));
    {
        let pager =
            Pager::new(Config::default().delivery(delivery).memory_budget(BUDGET)).expect("pager");
        let store = FileStore::open_rw(&file.path).expect("open rw");
        let map = Arc::new(
            pager
                .map_mut_trusted(store, MapOptions::new().fault_around_order(2))
                .expect("map"),
        );
        let pages = len / PAGE;
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (map, model) = (map.clone(), model.clone());
                std::thread::spawn(move || {
                    // Each thread owns the pages p with p % THREADS == t: it
                    // alone writes them, so its reads are checked without a
                    // lock on the mapping.
                    let mut x = 0x2545_f491_4f6c_dd1du64.wrapping_mul(t as u64 + 1);
                    let base = map.as_mut_ptr();
                    for i in 0..OPS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let page = ((x % (pages / THREADS) as u64) as usize) * THREADS + t;
                        let off = page * PAGE + ((x >> 32) as usize % (PAGE - 8));
                        if i % 3 == 0 {
                            let bytes = (x ^ i as u64).to_le_bytes();
                            // SAFETY: `off..off+8` is inside the mapping,
                            // and only this thread touches this page.
                            unsafe {
                                std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(off), 8)
                            };
                            model.lock().unwrap()[off..off + 8].copy_from_slice(&bytes);
                        } else {
                            let want: [u8; 8] =
                                model.lock().unwrap()[off..off + 8].try_into().unwrap();
                            assert_eq!(map[off..off + 8], want, "page {page} offset {off}");
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        map.flush(0..len).expect("flush");
        let stats = pager.stats();
        assert!(
            stats.evicted > 0,
            "{delivery:?}: the budget must evict: {stats:?}"
        );
        assert!(stats.written_back > 0, "{delivery:?}: {stats:?}");
        let peak = pager.memory().peak;
        assert!(
            peak <= BUDGET + 8 * PAGE as u64,
            "{delivery:?}: peak {peak}"
        );
    }
    let on_disk = std::fs::read(&file.path).expect("reopen");
    let model = model.lock().unwrap();
    assert_eq!(on_disk.len(), model.len());
    if let Some(i) = on_disk.iter().zip(model.iter()).position(|(a, b)| a != b) {
        panic!(
            "{delivery:?}: the file differs from the model at byte {i} (page {})",
            i / PAGE
        );
    }
}

#[test]
fn random_writes_under_a_budget_reach_the_file() {
    watchdog(WATCHDOG, || {
        run(Delivery::Signal);
        run(Delivery::Handler);
    });
}
