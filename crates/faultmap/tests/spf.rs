//! The speculative region lookup and invalidation (seed 004), on the real
//! kernel.
//!
//! - A bounded stress: readers on three threads fault random pages of
//!   several mappings (some sharing one object, mapped by pagers of both
//!   delivery modes and both region lookups, at different fault-around
//!   orders) while another thread maps, unmaps, invalidates (whole-object
//!   and per-mapping ranges), changes fault-around orders and gives advice.
//!   Every byte read is checked against the source; at the end the counters
//!   must be consistent with each pager's configuration, and every page the
//!   churn dropped must be read again, correctly, from the store.
//! - Deterministic invalidation: the pages go (from the cache and from every
//!   mapping), the count is right, the next touch reads the store again and
//!   gets the right bytes; a bad range is a typed error; a page whose read is
//!   in flight is waited for, then dropped.
//! - The counters of a `Classic` pager show no speculation.
//!
//! Every test runs under a watchdog: a hang is a failure.

mod common;
use common::MapTrusted;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use faultmap::{
    Advice, Config, Delivery, InvalidateError, MapOptions, Mapping, Object, Pager, ReadaheadMode,
    RegionLookup, Stats,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How long the stress's churn runs.
const RUN: Duration = Duration::from_secs(4);

/// Pages of each object of the stress (the last one ends inside a page).
const OBJECT_PAGES: usize = 768;

/// Mappings the readers choose from; the churn replaces them.
const SLOTS: usize = 12;

/// Reader threads.
const READERS: u64 = 3;

const DELIVERIES: [Delivery; 2] = [Delivery::Signal, Delivery::Handler];

fn pager(delivery: Delivery, lookup: RegionLookup) -> Pager {
    Pager::new(
        Config::default()
            .delivery(delivery)
            .region_lookup(lookup)
            .io_threads(2),
    )
    .unwrap_or_else(|e| panic!("Pager::new({delivery:?}, {lookup:?}): {e}"))
}

// ---------------------------------------------------------------------------
// The stress.
// ---------------------------------------------------------------------------

/// One pager of the stress and what its counters must show.
struct StressPager {
    name: &'static str,
    pager: Pager,
    delivery: Delivery,
    lookup: RegionLookup,
}

/// One object of the stress: its bytes and its instrumented store.
struct StressObject {
    object: Object,
    data: Arc<Vec<u8>>,
    store: Arc<Instrumented>,
}

/// A mapping the readers may use, with what it maps.
struct Entry {
    map: Mapping,
    /// Index into the objects.
    obj: usize,
    /// Index into the pagers.
    pager: usize,
    /// The object offset of the mapping's first byte.
    offset: usize,
}

struct World {
    pagers: Vec<StressPager>,
    objects: Vec<StressObject>,
    slots: Mutex<Vec<Arc<Entry>>>,
}

impl World {
    fn new() -> Self {
        let pagers = vec![
            StressPager {
                name: "signal+speculative",
                pager: pager(Delivery::Signal, RegionLookup::Speculative),
                delivery: Delivery::Signal,
                lookup: RegionLookup::Speculative,
            },
            StressPager {
                name: "handler+speculative",
                pager: pager(Delivery::Handler, RegionLookup::Speculative),
                delivery: Delivery::Handler,
                lookup: RegionLookup::Speculative,
            },
            StressPager {
                name: "handler+classic",
                pager: pager(Delivery::Handler, RegionLookup::Classic),
                delivery: Delivery::Handler,
                lookup: RegionLookup::Classic,
            },
            StressPager {
                name: "signal+classic",
                pager: pager(Delivery::Signal, RegionLookup::Classic),
                delivery: Delivery::Signal,
                lookup: RegionLookup::Classic,
            },
        ];
        // Objects are opened by one pager and mapped by all of them: the
        // object shared by every mapping of every pager is the point.
        let objects = (0..3u64)
            .map(|i| {
                let data = Arc::new(pattern(OBJECT_PAGES * PAGE - 321, 4000 + i));
                let store = Instrumented::mem(&data, Faults::default());
                let object = pagers[0].pager.open(store.clone()).expect("open");
                StressObject {
                    object,
                    data,
                    store,
                }
            })
            .collect();
        Self {
            pagers,
            objects,
            slots: Mutex::new(Vec::new()),
        }
    }

    /// A fresh mapping of a random window of a random object (object 0,
    /// the one everybody shares, half the time) by a random pager.
    fn random_entry(&self, rng: &mut StdRng) -> Entry {
        let obj = if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(0..self.objects.len())
        };
        let pager = rng.random_range(0..self.pagers.len());
        let len_total = self.objects[obj].data.len();
        let first = rng.random_range(0..OBJECT_PAGES);
        let pages = rng.random_range(1..=(OBJECT_PAGES - first).min(256));
        let offset = (first * PAGE + rng.random_range(0..PAGE)).min(len_total - 1);
        let len = (pages * PAGE).min(len_total - offset);
        let modes = [
            ReadaheadMode::Full,
            ReadaheadMode::AroundOnly,
            ReadaheadMode::Off,
        ];
        let opts = MapOptions::new()
            .offset(offset as u64)
            .len(len as u64)
            .fault_around_order(rng.random_range(0..=9))
            .readahead(modes[rng.random_range(0..modes.len())]);
        let map = self.pagers[pager]
            .pager
            .map_trusted(&self.objects[obj].object, opts)
            .expect("map");
        Entry {
            map,
            obj,
            pager,
            offset,
        }
    }

    fn slot(&self, i: usize) -> Arc<Entry> {
        self.slots.lock().unwrap()[i].clone()
    }

    /// Checks bytes `range` of `entry`'s mapping against the source.
    #[track_caller]
    fn check(&self, entry: &Entry, range: std::ops::Range<usize>, who: &str) -> u64 {
        let data = &self.objects[entry.obj].data;
        let at = entry.offset + range.start;
        let want = &data[at..entry.offset + range.end];
        let what = || {
            format!(
                "{who}: object {} bytes {at}..{} through a mapping of pager {} (order {})",
                entry.obj,
                entry.offset + range.end,
                self.pagers[entry.pager].name,
                entry.map.fault_around_order(),
            )
        };
        if range.len() == 1 {
            assert_eq!(read_byte(&entry.map, range.start), want[0], "{}", what());
        } else {
            assert_bytes(&entry.map[range.clone()], want, &what());
        }
        range.len() as u64
    }
}

/// A reader: random bytes and runs of random mappings, every byte checked.
fn reader(world: Arc<World>, seed: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let who = format!("reader {seed}");
    let mut checked = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let entry = world.slot(rng.random_range(0..SLOTS));
        let len = entry.map.len();
        for _ in 0..rng.random_range(1..64) {
            let i = rng.random_range(0..len);
            let n = if rng.random_range(0..100) < 70 {
                1
            } else {
                rng.random_range(1..=16 * PAGE).min(len - i)
            };
            checked += world.check(&entry, i..i + n, &who);
        }
    }
    checked
}

/// What the churn did, to check that the stress exercised what it claims.
#[derive(Debug, Default)]
struct ChurnCounts {
    remaps: u64,
    map_unmap: u64,
    object_invalidates: u64,
    mapping_invalidates: u64,
    pages_dropped: u64,
    order_changes: u64,
    advice: u64,
}

fn churn(world: &World, seed: u64) -> ChurnCounts {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = ChurnCounts::default();
    let start = Instant::now();
    while start.elapsed() < RUN {
        match rng.random_range(0..100) {
            // Replace a mapping the readers use (the old one is unmapped
            // when the last reader lets go of it).
            0..=19 => {
                let entry = Arc::new(world.random_entry(&mut rng));
                let i = rng.random_range(0..SLOTS);
                drop(std::mem::replace(
                    &mut world.slots.lock().unwrap()[i],
                    entry,
                ));
                n.remaps += 1;
            }
            // Map, touch, unmap: the table changes under the readers.
            20..=29 => {
                let entry = world.random_entry(&mut rng);
                let i = rng.random_range(0..entry.map.len());
                world.check(&entry, i..i + 1, "churn");
                n.map_unmap += 1;
            }
            // Drop a random range of an object from its cache and every
            // mapping of it.
            30..=49 => {
                let o = &world.objects[rng.random_range(0..world.objects.len())];
                let len = o.data.len() as u64;
                // Never empty: `invalidate_of_an_empty_range_drops_nothing`.
                let a = rng.random_range(0..len);
                let b = rng.random_range(a + 1..=len.min(a + 64 * PAGE as u64));
                let dropped = o.object.invalidate(a..b).expect("Object::invalidate");
                let touched = b.div_ceil(PAGE as u64) - a / PAGE as u64;
                assert!(
                    dropped <= touched,
                    "invalidate({a}..{b}) dropped {dropped} pages of {touched}"
                );
                n.object_invalidates += 1;
                n.pages_dropped += dropped;
            }
            // The same through a mapping (its slice offsets).
            50..=64 => {
                let entry = world.slot(rng.random_range(0..SLOTS));
                let len = entry.map.len();
                let a = rng.random_range(0..len);
                let b = rng.random_range(a + 1..=len);
                let dropped = entry.map.invalidate(a..b).expect("Mapping::invalidate");
                let touched = (entry.offset + b).div_ceil(PAGE) - (entry.offset + a) / PAGE;
                assert!(
                    dropped <= touched as u64,
                    "Mapping::invalidate({a}..{b}) dropped {dropped} pages of {touched}"
                );
                n.mapping_invalidates += 1;
                n.pages_dropped += dropped;
            }
            65..=79 => {
                let entry = world.slot(rng.random_range(0..SLOTS));
                let order = rng.random_range(0..=9);
                entry
                    .map
                    .set_fault_around_order(order)
                    .expect("set_fault_around_order");
                assert_eq!(entry.map.fault_around_order(), order);
                n.order_changes += 1;
            }
            _ => {
                let entry = world.slot(rng.random_range(0..SLOTS));
                let len = entry.map.len();
                let a = rng.random_range(0..len);
                let b = rng.random_range(a..=len);
                let advice = [
                    Advice::Normal,
                    Advice::Sequential,
                    Advice::Random,
                    Advice::WillNeed,
                    Advice::DontNeed,
                ][rng.random_range(0..5)];
                entry.map.advise(advice, a..b).expect("advise");
                n.advice += 1;
            }
        }
        // Leave the readers (and the pagers' threads) some of the CPUs.
        std::thread::sleep(Duration::from_micros(200));
    }
    n
}

/// What every pager's counters must show, whatever the interleaving.
#[track_caller]
fn assert_consistent(p: &StressPager, s: &Stats) {
    let name = p.name;
    assert!(s.pgfault > 0, "{name}: no fault counted: {s:?}");
    assert!(
        s.pgmajfault <= s.pgfault,
        "{name}: more major faults than faults: {s:?}"
    );
    assert_eq!(s.io_errors, 0, "{name}: the store never fails: {s:?}");
    match p.lookup {
        RegionLookup::Speculative => {
            assert!(s.spf_success > 0, "{name}: no speculative fault: {s:?}");
            // Every fault event tries the speculative lookup once (a retry
            // of a parked fault too, which is not counted in pgfault).
            assert!(
                s.spf_success + s.spf_abort + s.spf_fallback >= s.pgfault,
                "{name}: fewer speculative attempts than faults: {s:?}"
            );
        }
        RegionLookup::Classic => {
            assert_eq!(
                (s.spf_abort, s.spf_fallback),
                (0, 0),
                "{name}: a classic pager never speculates: {s:?}"
            );
            // spf_success of a signal-delivery Classic pager: see
            // `classic_lookup_never_speculates`, which checks it alone.
            if p.delivery == Delivery::Handler {
                assert_eq!(s.spf_success, 0, "{name}: {s:?}");
            }
        }
    }
    match p.delivery {
        Delivery::Signal => assert!(
            s.forwarded > 0,
            "{name}: misses must be forwarded to a pager thread: {s:?}"
        ),
        Delivery::Handler => assert_eq!(s.forwarded, 0, "{name}: {s:?}"),
    }
}

#[test]
fn readers_see_the_right_bytes_while_mappings_churn_and_pages_are_invalidated() {
    watchdog(Duration::from_secs(20), || {
        let world = Arc::new(World::new());
        let mut rng = StdRng::seed_from_u64(4242);
        {
            let mut slots = world.slots.lock().unwrap();
            // Every pager maps objects 0 and 1 whole, at different orders;
            // the other slots start random.
            let n = world.pagers.len();
            for i in 0..SLOTS {
                let e = if i < 2 * n {
                    let (p, o) = (i % n, i / n);
                    let opts = MapOptions::new().fault_around_order((3 * i % 10) as u8);
                    Entry {
                        map: world.pagers[p]
                            .pager
                            .map_trusted(&world.objects[o].object, opts)
                            .expect("map"),
                        obj: o,
                        pager: p,
                        offset: 0,
                    }
                } else {
                    world.random_entry(&mut rng)
                };
                slots.push(Arc::new(e));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..READERS)
            .map(|i| {
                let (world, stop) = (world.clone(), stop.clone());
                std::thread::Builder::new()
                    .name(format!("reader-{i}"))
                    .spawn(move || reader(world, 7000 + i, stop))
                    .expect("spawn reader")
            })
            .collect();
        let churned = churn(&world, 99);
        stop.store(true, Ordering::Relaxed);
        let checked: Vec<u64> = readers
            .into_iter()
            .map(|r| r.join().expect("a reader failed"))
            .collect();
        eprintln!("checked bytes per reader: {checked:?}; churn: {churned:?}");
        assert!(checked.iter().all(|&c| c > 0), "a reader read nothing");
        assert!(
            churned.remaps > 0
                && churned.map_unmap > 0
                && churned.object_invalidates > 0
                && churned.mapping_invalidates > 0
                && churned.order_changes > 0
                && churned.advice > 0,
            "the churn skipped something: {churned:?}"
        );
        assert!(
            churned.pages_dropped > 0,
            "no invalidation dropped a page: the test tested less than it says: {churned:?}"
        );

        // The churned regions are re-served correctly: drop every object
        // whole, then every page of every mapping must come back from the
        // store, right.
        let before: Vec<Vec<u32>> = world.objects.iter().map(|o| o.store.page_reads()).collect();
        for o in &world.objects {
            o.object
                .invalidate(0..o.data.len() as u64)
                .expect("invalidate all");
            for p in 0..OBJECT_PAGES as u64 {
                assert!(!o.object.is_cached(p), "page {p} cached after invalidate");
            }
        }
        let entries: Vec<Arc<Entry>> = world.slots.lock().unwrap().clone();
        let mut reread = vec![std::collections::BTreeSet::new(); world.objects.len()];
        for e in &entries {
            world.check(e, 0..e.map.len(), "after the churn");
            let first = e.offset / PAGE;
            let end = (e.offset + e.map.len()).div_ceil(PAGE);
            reread[e.obj].extend(first..end);
        }
        for (i, o) in world.objects.iter().enumerate() {
            let after = o.store.page_reads();
            for &p in &reread[i] {
                assert!(
                    after[p] > before[i][p],
                    "object {i} page {p} read back without a store read ({} reads before, {} after)",
                    before[i][p],
                    after[p]
                );
            }
            o.store.assert_contract_kept();
        }

        for p in &world.pagers {
            let s = stats_when(|| p.pager.stats(), |s| s.pgfault > 0);
            eprintln!("{}: {s:?}", p.name);
            assert_consistent(p, &s);
        }
        drop(entries);
        world.slots.lock().unwrap().clear();
        for p in &world.pagers {
            assert_eq!(p.pager.mappings(), 0, "{}: mappings left behind", p.name);
        }
    });
}

// ---------------------------------------------------------------------------
// The counters of the region lookups.
// ---------------------------------------------------------------------------

/// Faults `object` in through two mappings (the second's faults are all
/// hits, which a signal-delivery pager resolves in the SIGBUS handler), and
/// returns the pager's counters.
fn fault_twice(pager: &Pager, object: &Object, data: &[u8]) -> Stats {
    for order in [0u8, 2] {
        let map = pager
            .map_trusted(object, MapOptions::new().fault_around_order(order))
            .unwrap();
        assert_bytes(&map, data, &format!("order {order}"));
    }
    stats_when(|| pager.stats(), |s| s.pgfault > 0)
}

#[test]
fn classic_lookup_never_speculates() {
    // Config::region_lookup's Classic: "always under the table's lock". Its
    // speculative counters stay zero, whichever the delivery.
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 4100);
        let mut bad = Vec::new();
        for delivery in DELIVERIES {
            let pager = pager(delivery, RegionLookup::Classic);
            let object = pager
                .open(faultmap::MemStore::new("c", data.clone()))
                .unwrap();
            let s = fault_twice(&pager, &object, &data);
            eprintln!("{delivery:?}+Classic: {s:?}");
            if (s.spf_success, s.spf_abort, s.spf_fallback) != (0, 0, 0) {
                bad.push(format!("{delivery:?}: {s:?}"));
            }
        }
        assert!(
            bad.is_empty(),
            "a Classic pager counted speculative lookups: {bad:#?}"
        );
    });
}

#[test]
fn speculative_lookup_resolves_faults_in_both_deliveries() {
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 4101);
        for delivery in DELIVERIES {
            let pager = pager(delivery, RegionLookup::Speculative);
            let object = pager
                .open(faultmap::MemStore::new("s", data.clone()))
                .unwrap();
            let s = fault_twice(&pager, &object, &data);
            assert!(s.spf_success > 0, "{delivery:?}: {s:?}");
            assert_eq!(
                s.spf_fallback, 0,
                "{delivery:?}: nothing was unmapped: {s:?}"
            );
            match delivery {
                Delivery::Signal => assert!(s.forwarded > 0, "misses are forwarded: {s:?}"),
                Delivery::Handler => assert_eq!(s.forwarded, 0, "{s:?}"),
            }
        }
    });
}

// ---------------------------------------------------------------------------
// Invalidation, deterministic.
// ---------------------------------------------------------------------------

const INV_PAGES: usize = 16;

/// The object's cached pages, as a list.
fn cached(object: &Object, pages: usize) -> Vec<u64> {
    (0..pages as u64).filter(|&p| object.is_cached(p)).collect()
}

#[test]
fn invalidate_drops_the_pages_everywhere_and_the_next_touch_reads_them_again() {
    watchdog(WATCHDOG, || {
        for delivery in DELIVERIES {
            let what = |s: &str| format!("{delivery:?}: {s}");
            let data = pattern(INV_PAGES * PAGE - 100, 4200);
            let store = Instrumented::mem(&data, Faults::default());
            let pager = pager(delivery, RegionLookup::Speculative);
            // A second pager of the other delivery maps the same object.
            let other = self::pager(
                match delivery {
                    Delivery::Signal => Delivery::Handler,
                    Delivery::Handler => Delivery::Signal,
                },
                RegionLookup::Speculative,
            );
            let object = pager.open(store.clone()).unwrap();
            // Readahead off: what is read is what is touched.
            let whole = pager
                .map_trusted(&object, MapOptions::new().ra_pages(0).fault_around_order(4))
                .unwrap();
            // Bytes PAGE + 100 .. 5 * PAGE + 100 of the object: pages 1..=5.
            let part = other
                .map_trusted(
                    &object,
                    MapOptions::new()
                        .offset(PAGE as u64 + 100)
                        .len(4 * PAGE as u64)
                        .ra_pages(0)
                        .fault_around_order(0),
                )
                .unwrap();
            assert_bytes(&whole, &data, &what("first read"));
            assert_bytes(
                &part,
                &data[PAGE + 100..5 * PAGE + 100],
                &what("first read, part"),
            );
            let all: Vec<u64> = (0..INV_PAGES as u64).collect();
            assert_eq!(cached(&object, INV_PAGES), all, "{}", what("all cached"));
            assert_eq!(
                store.page_reads(),
                vec![1; INV_PAGES],
                "{}",
                what("one read each")
            );
            let whole_present: std::collections::BTreeSet<usize> = (0..INV_PAGES).collect();
            assert_eq!(
                present_eventually(&whole, INV_PAGES, &whole_present),
                whole_present,
                "{}",
                what("whole mapping present")
            );
            let part_present: std::collections::BTreeSet<usize> = (0..5).collect();
            assert_eq!(
                present_eventually(&part, 5, &part_present),
                part_present,
                "{}",
                what("part present")
            );

            // Object bytes 2*PAGE+1 .. 4*PAGE+1 touch pages 2, 3 and 4.
            let n = object
                .invalidate(2 * PAGE as u64 + 1..4 * PAGE as u64 + 1)
                .expect("Object::invalidate");
            assert_eq!(n, 3, "{}", what("pages dropped"));
            assert_eq!(
                cached(&object, INV_PAGES),
                [0, 1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                "{}",
                what("cached after invalidate")
            );
            // Gone from both mappings' page tables (part's page 0 is object
            // page 1).
            let whole_left: std::collections::BTreeSet<usize> =
                (0..INV_PAGES).filter(|p| !(2..=4).contains(p)).collect();
            assert_eq!(
                present_set(&whole, INV_PAGES),
                whole_left,
                "{}",
                what("whole")
            );
            assert_eq!(
                present_set(&part, 5),
                [0usize, 4].into_iter().collect(),
                "{}",
                what("part")
            );
            // Nothing cached there now: a second invalidate drops nothing.
            assert_eq!(
                object.invalidate(2 * PAGE as u64..5 * PAGE as u64).unwrap(),
                0
            );

            // The next touch reads the store again and gets the right bytes,
            // through either mapping.
            assert_bytes(
                &part,
                &data[PAGE + 100..5 * PAGE + 100],
                &what("part, again"),
            );
            assert_bytes(&whole, &data, &what("whole, again"));
            let mut reads = vec![1u32; INV_PAGES];
            reads[2..=4].fill(2);
            assert_eq!(store.page_reads(), reads, "{}", what("re-read once each"));
            assert_eq!(cached(&object, INV_PAGES), all, "{}", what("cached again"));

            // Through a mapping: slice offsets, shifted by its offset. Byte 0
            // of `part` is object byte PAGE + 100: page 1; its last byte is
            // in page 5.
            assert_eq!(part.invalidate(0..1).expect("Mapping::invalidate"), 1);
            assert!(!object.is_cached(1) && object.is_cached(0) && object.is_cached(2));
            assert_eq!(part.invalidate(part.len() - 1..part.len()).unwrap(), 1);
            assert!(!object.is_cached(5) && object.is_cached(4) && object.is_cached(6));
            assert_eq!(read_byte(&part, 0), data[PAGE + 100]);
            assert_eq!(read_byte(&whole, 5 * PAGE), data[5 * PAGE]);
            reads[1] = 2;
            reads[5] = 2;
            assert_eq!(
                store.page_reads(),
                reads,
                "{}",
                what("re-read after Mapping::invalidate")
            );

            // All of it, through the whole mapping.
            assert_eq!(whole.invalidate(0..whole.len()).unwrap(), INV_PAGES as u64);
            assert_eq!(object.cached_bytes(), 0);
            assert_eq!(present_set(&whole, INV_PAGES), Default::default());
            assert_eq!(present_set(&part, 5), Default::default());
            assert_bytes(&whole, &data, &what("whole, third time"));
            store.assert_contract_kept();
            let s = object.stats();
            assert_eq!(s.io_errors, 0, "{}", what(&format!("{s:?}")));
        }
    });
}

#[test]
fn invalidate_refuses_a_range_outside_the_object_or_the_mapping() {
    watchdog(WATCHDOG, || {
        let data = pattern(8 * PAGE + 5, 4300);
        let pager = pager(Delivery::Signal, RegionLookup::Speculative);
        let object = pager
            .open(faultmap::MemStore::new("r", data.clone()))
            .unwrap();
        let len = data.len() as u64;
        let map = pager
            .map_trusted(&object, MapOptions::new().offset(3000).len(2 * PAGE as u64))
            .unwrap();
        assert_bytes(&map, &data[3000..3000 + 2 * PAGE], "read");
        let cached_before = object.cached_bytes();
        for (start, end) in [(0, len + 1), (len, len + 1), (5, 4), (len + 7, len + 9)] {
            match object.invalidate(start..end) {
                Err(InvalidateError::Range {
                    start: s,
                    end: e,
                    len: l,
                }) => assert_eq!((s, e, l), (start, end, len)),
                other => {
                    panic!("Object::invalidate({start}..{end}): expected Range, got {other:?}")
                }
            }
        }
        let mlen = map.len();
        for (start, end) in [
            (0, mlen + 1),
            (mlen, mlen + 1),
            (9, 8),
            (mlen + 1, mlen + 1),
        ] {
            match map.invalidate(start..end) {
                Err(InvalidateError::Range {
                    start: s,
                    end: e,
                    len: l,
                }) => assert_eq!((s, e, l), (start as u64, end as u64, mlen as u64)),
                other => {
                    panic!("Mapping::invalidate({start}..{end}): expected Range, got {other:?}")
                }
            }
        }
        assert_eq!(
            object.cached_bytes(),
            cached_before,
            "a refused invalidate dropped pages"
        );
        // At the end is empty, not an error (what it drops:
        // `invalidate_of_an_empty_range_drops_nothing`).
        assert!(object.invalidate(len..len).is_ok());
        assert!(map.invalidate(mlen..mlen).is_ok());
        // An empty mapping has nothing to drop.
        let empty = pager
            .map_trusted(&object, MapOptions::new().offset(len))
            .unwrap();
        assert_eq!(empty.invalidate(0..0).unwrap(), 0);
        assert!(matches!(
            empty.invalidate(0..1),
            Err(InvalidateError::Range { len: 0, .. })
        ));
    });
}

#[test]
fn invalidate_of_an_empty_range_drops_nothing() {
    // An empty range holds no bytes, so no page holds any of its bytes:
    // like `truncate_inode_pages_range` with start == end, nothing goes.
    watchdog(WATCHDOG, || {
        let data = pattern(8 * PAGE + 5, 4310);
        let pager = pager(Delivery::Signal, RegionLookup::Speculative);
        let object = pager
            .open(faultmap::MemStore::new("e", data.clone()))
            .unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().offset(100).ra_pages(0))
            .unwrap();
        assert_bytes(&map, &data[100..], "read");
        let all: Vec<u64> = (0..9).collect();
        assert_eq!(cached(&object, 9), all);
        let len = data.len() as u64;
        let mut dropped = Vec::new();
        for at in [0, 1, PAGE as u64, 3 * PAGE as u64 + 17, len - 1, len] {
            let n = object.invalidate(at..at).expect("Object::invalidate");
            if n != 0 {
                dropped.push(format!("Object::invalidate({at}..{at}) dropped {n}"));
            }
        }
        for at in [0, 1, PAGE - 100, 2 * PAGE, map.len()] {
            let n = map.invalidate(at..at).expect("Mapping::invalidate");
            if n != 0 {
                dropped.push(format!("Mapping::invalidate({at}..{at}) dropped {n}"));
            }
        }
        assert!(
            dropped.is_empty(),
            "empty ranges dropped pages: {dropped:#?}; still cached: {:?}",
            cached(&object, 9)
        );
        assert_eq!(cached(&object, 9), all);
    });
}

#[test]
fn invalidate_waits_for_a_read_in_flight_then_drops_the_page() {
    watchdog(WATCHDOG, || {
        for delivery in DELIVERIES {
            let data = pattern(INV_PAGES * PAGE, 4400);
            let store = Instrumented::mem(&data, Faults::gated([5]));
            let pager = Arc::new(pager(delivery, RegionLookup::Speculative));
            let object = pager.open(store.clone()).unwrap();
            let map = Arc::new(
                pager
                    .map_trusted(&object, MapOptions::new().ra_pages(0).fault_around_order(0))
                    .unwrap(),
            );
            // Page 4 is cached; page 5's read is held at the gate.
            assert_eq!(touch(&map, 4), data[4 * PAGE]);
            let toucher = {
                let map = map.clone();
                std::thread::spawn(move || map[5 * PAGE..6 * PAGE].to_vec())
            };
            assert!(
                store.gate.wait_entered(1, Duration::from_secs(10)),
                "{delivery:?}: page 5's read never started"
            );
            let done = Arc::new(AtomicU64::new(u64::MAX));
            let invalidator = {
                let (object, done) = (object.clone(), done.clone());
                std::thread::spawn(move || {
                    let n = object
                        .invalidate(4 * PAGE as u64..6 * PAGE as u64)
                        .expect("invalidate");
                    done.store(n, Ordering::SeqCst);
                    n
                })
            };
            // While the read is held, the invalidation cannot be over: it
            // must wait for the page, not skip it (nor drop it half-read).
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(
                done.load(Ordering::SeqCst),
                u64::MAX,
                "{delivery:?}: invalidate returned while page 5's read was in flight"
            );
            assert!(
                !toucher.is_finished(),
                "{delivery:?}: the gated touch returned"
            );
            // A touch of page 4 through another mapping meanwhile (the
            // invalidation may hold it frozen while it waits for page 5)
            // must end, right, at the latest once the read ends. Whether it
            // ended before is only reported.
            let toucher4 = {
                // Another mapping, where page 4 is not mapped yet.
                let map = pager
                    .map_trusted(&object, MapOptions::new().ra_pages(0).fault_around_order(0))
                    .unwrap();
                std::thread::spawn(move || map[4 * PAGE..5 * PAGE].to_vec())
            };
            let early = wait_until(Duration::from_millis(200), || toucher4.is_finished());
            eprintln!(
                "{delivery:?}: a touch of page 4 while page 5's read is held {}",
                if early {
                    "ended"
                } else {
                    "waited for the read"
                }
            );
            store.gate.open();
            let got4 = toucher4.join().expect("toucher of page 4");
            assert_bytes(
                &got4,
                &data[4 * PAGE..5 * PAGE],
                &format!("{delivery:?}: page 4"),
            );
            let got = toucher.join().expect("toucher");
            assert_bytes(
                &got,
                &data[5 * PAGE..6 * PAGE],
                &format!("{delivery:?}: page 5"),
            );
            let n = invalidator.join().expect("invalidator");
            assert_eq!(n, 2, "{delivery:?}: pages 4 and 5 both dropped");
            // A toucher's fault may have found its page frozen and read it
            // again after the drop: then it is cached, from a second read.
            let reads = store.page_reads();
            for p in [4, 5] {
                assert!(
                    !object.is_cached(p as u64) || reads[p] == 2,
                    "{delivery:?}: page {p} cached after the invalidation without a new read: \
                     {reads:?}"
                );
            }
            // The next touches read the store again and are right.
            assert_eq!(touch(&map, 4), data[4 * PAGE]);
            assert_bytes(
                &map[4 * PAGE..6 * PAGE],
                &data[4 * PAGE..6 * PAGE],
                &format!("{delivery:?}: pages 4, 5 again"),
            );
            let reads = store.page_reads();
            assert_eq!(&reads[4..6], [2, 2], "{delivery:?}: {reads:?}");
            store.assert_contract_kept();
        }
    });
}
