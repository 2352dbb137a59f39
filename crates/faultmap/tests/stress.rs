//! A bounded, randomized stress test of the whole fault path: readers on
//! several threads and mappings (different fault-around orders, readahead
//! modes and hints), a store with random delays and transient failures of
//! multi-page reads, advice (WillNeed, DontNeed, hints) and mappings
//! created and dropped while faults are in flight. Every byte read is
//! checked against the source; a watchdog turns a hang into a failure.
//!
//! Transient failures only ever hit reads of several pages, so the fault
//! path's single-page retry always succeeds: no access may see SIGBUS.

mod common;
use common::MapTrusted;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pattern, read_byte, watchdog, PAGE};
use faultmap::{
    Advice, Config, MapOptions, MemStore, Object, Pager, ReadaheadMode, Store, StoreError,
};
use rand::{Rng, SeedableRng};

/// How long the readers run.
const RUN: Duration = Duration::from_secs(4);

/// A store that sleeps a little at random and fails a multi-page read now
/// and then (a single-page read always succeeds).
struct Jittery {
    inner: MemStore,
    calls: AtomicU64,
}

impl Store for Jittery {
    fn name(&self) -> &str {
        "jittery"
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn ra_pages(&self) -> u64 {
        64
    }
    fn io_pages(&self) -> u64 {
        16
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        // A cheap deterministic mix of the call number.
        let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        if h % 7 == 0 {
            std::thread::sleep(Duration::from_micros(200 + h % 800));
        }
        if buf.len() > PAGE && h % 11 == 0 {
            buf.fill(0xEE);
            return Err(StoreError::Read {
                name: "jittery".into(),
                offset,
                len: buf.len(),
                source: std::io::Error::other("transient"),
            });
        }
        self.inner.read_at(offset, buf)
    }
}

fn options(rng: &mut impl Rng) -> MapOptions {
    let modes = [
        ReadaheadMode::Full,
        ReadaheadMode::AroundOnly,
        ReadaheadMode::Off,
    ];
    MapOptions::new()
        .fault_around_order(rng.random_range(0..=9))
        .readahead(modes[rng.random_range(0..modes.len())])
}

fn jittery(data: &[u8]) -> Jittery {
    Jittery {
        inner: MemStore::new("m", data.to_vec()),
        calls: AtomicU64::new(0),
    }
}

fn reader(
    shared: Object,
    pager: Arc<Pager>,
    data: Arc<Vec<u8>>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> (u64, u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pages = data.len() / PAGE;
    let mut checked = 0u64;
    let mut io_errors = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // Mostly the shared object; now and then a fresh one (an empty
        // cache), so that cold reads and readahead go on all the time.
        let fresh = rng.random_range(0..4) == 0;
        let object = if fresh {
            pager.open(jittery(&data)).expect("open")
        } else {
            shared.clone()
        };
        // A fresh mapping of a random window of the object.
        let first = rng.random_range(0..pages);
        let len = rng.random_range(1..=(pages - first).min(300)) * PAGE;
        let offset = first * PAGE + rng.random_range(0..PAGE.min(len));
        let len = len - (offset - first * PAGE);
        let opts = options(&mut rng).offset(offset as u64).len(len as u64);
        let map = pager.map_trusted(&object, opts).expect("map");
        for _ in 0..rng.random_range(1..200) {
            match rng.random_range(0..100) {
                // Mostly reads: a random byte, or a sequential stretch.
                0..=59 => {
                    let i = rng.random_range(0..len);
                    assert_eq!(read_byte(&map, i), data[offset + i], "byte {}", offset + i);
                    checked += 1;
                }
                60..=89 => {
                    let i = rng.random_range(0..len);
                    let n = rng.random_range(1..64 * PAGE).min(len - i);
                    assert!(
                        map[i..i + n] == data[offset + i..offset + i + n],
                        "run at {}",
                        offset + i
                    );
                    checked += n as u64;
                }
                // Advice on a random range.
                _ => {
                    let a = rng.random_range(0..len);
                    let b = rng.random_range(a..=len);
                    let advice = [
                        Advice::Normal,
                        Advice::Sequential,
                        Advice::Random,
                        Advice::WillNeed,
                        Advice::DontNeed,
                    ][rng.random_range(0..5)];
                    map.advise(advice, a..b).expect("advise");
                }
            }
        }
        if fresh {
            drop(map);
            io_errors += object.stats().io_errors;
        }
    }
    (checked, io_errors)
}

#[test]
fn everything_at_once_reads_the_right_bytes() {
    watchdog(Duration::from_secs(120), || {
        let data = Arc::new(pattern(4096 * PAGE + 1234, 99));
        let pager =
            // No retries: the store's transient failures must reach the
            // fault path (retries would hide them, see tests/inject.rs).
            Arc::new(
                Pager::new(
                    Config::default()
                        .handler_threads(2)
                        .io_threads(3)
                        .io_retries(0),
                )
                .unwrap(),
            );
        let object = pager.open(jittery(&data)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|i| {
                let (object, pager, data, stop) =
                    (object.clone(), pager.clone(), data.clone(), stop.clone());
                std::thread::spawn(move || reader(object, pager, data, 1000 + i, stop))
            })
            .collect();
        let start = Instant::now();
        while start.elapsed() < RUN {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        let (checked, fresh_errors) = readers
            .into_iter()
            .map(|r| r.join().expect("a reader failed"))
            .fold((0, 0), |(c, e), (rc, re)| (c + rc, e + re));
        assert!(checked > 0);
        let s = object.stats();
        assert!(
            s.io_errors + fresh_errors > 0,
            "the store never failed: the test tested less than it says: {s:?}"
        );
        assert_eq!(pager.mappings(), 0, "mappings left behind");
        eprintln!(
            "checked {checked} bytes; {s:?}; {:?}",
            object.ra_stats().all
        );
    });
}
