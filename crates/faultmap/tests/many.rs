//! Many regions: 100 000 small mappings (one or two pages each, of a few
//! shared objects) are created, each faulted and checked, and dropped, with
//! the default configuration (signal delivery, speculative region lookup).
//!
//! For comparison: LLNL UMap fails at about 900 regions (its fixed-size
//! region table and a userfaultfd registration per region); the kernel's
//! own limit here is `vm.max_map_count`.
//!
//! Each mapping is one VMA, so the process needs more than the default
//! `vm.max_map_count` (65530). The test raises the sysctl (as root) for its
//! run and puts the old value back afterwards; if it cannot, it fails and
//! says why. The mappings are made in a child process (`common::run_child`),
//! so the 100 000 VMAs and the process-wide region table they fill never
//! meet another test. Timings are printed, never asserted.

mod common;
use common::MapTrusted;

use std::time::{Duration, Instant};

use common::*;
use faultmap::{Config, Delivery, MapOptions, Mapping, MemStore, Pager, RegionLookup};

/// How many mappings.
const MAPPINGS: usize = 100_000;

/// Shared objects, and pages of each (the last one ends inside a page).
const OBJECTS: usize = 4;
const OBJECT_PAGES: usize = 64;

/// VMAs the child needs besides the mappings (its binary, libraries,
/// stacks, the pager's threads), with a wide margin.
const OTHER_VMAS: usize = 20_000;

const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

/// Puts `vm.max_map_count` back as it was when dropped.
struct MapCountGuard {
    old: Option<u64>,
}

impl MapCountGuard {
    /// Makes sure `vm.max_map_count` is at least `needed`, raising it if it
    /// must; panics with the reason if it cannot.
    fn at_least(needed: u64) -> Self {
        let read = || -> u64 {
            std::fs::read_to_string(MAX_MAP_COUNT)
                .unwrap_or_else(|e| panic!("cannot read {MAX_MAP_COUNT}: {e}"))
                .trim()
                .parse()
                .expect("vm.max_map_count is a number")
        };
        let old = read();
        if old >= needed {
            return Self { old: None };
        }
        if let Err(e) = std::fs::write(MAX_MAP_COUNT, needed.to_string()) {
            panic!(
                "vm.max_map_count is {old}, and {MAPPINGS} mappings need at least {needed}; \
                 raising it failed ({e}): run as root, or set it beforehand \
                 (sysctl -w vm.max_map_count={needed})"
            );
        }
        let now = read();
        assert!(
            now >= needed,
            "wrote {needed} to {MAX_MAP_COUNT}, but it reads {now}"
        );
        Self { old: Some(old) }
    }
}

impl Drop for MapCountGuard {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            if let Err(e) = std::fs::write(MAX_MAP_COUNT, old.to_string()) {
                eprintln!("could not restore vm.max_map_count to {old}: {e}");
            }
        }
    }
}

/// Where mapping `i` starts in its object, and how long it is: one or two
/// pages, every third one starting inside a page.
fn extent(i: usize, object_len: usize) -> (usize, usize) {
    let first = (i * 7) % (OBJECT_PAGES - 2);
    let lead = if i % 3 == 0 { 17 * (i % 200) + 1 } else { 0 };
    let pages = 1 + i % 2;
    let offset = first * PAGE + lead;
    let len = (pages * PAGE - lead).min(object_len - offset);
    (offset, len)
}

/// The child's part: prints the timings, then that every check held.
fn hundred_thousand_mappings() {
    let config = Config::default();
    assert_eq!(config.delivery, Delivery::Signal);
    assert_eq!(config.region_lookup, RegionLookup::Speculative);
    let pager = Pager::new(config).expect("Pager::new");
    let data: Vec<Vec<u8>> = (0..OBJECTS)
        .map(|o| pattern(OBJECT_PAGES * PAGE - 33, 5000 + o as u64))
        .collect();
    let objects: Vec<_> = data
        .iter()
        .map(|d| pager.open(MemStore::new("many", d.clone())).unwrap())
        .collect();

    // 1. Create.
    let t = Instant::now();
    let mut maps: Vec<Mapping> = Vec::with_capacity(MAPPINGS);
    // Time per tenth, to show how the cost grows with the table.
    let mut tenths = Vec::new();
    let mut tenth = Instant::now();
    for i in 0..MAPPINGS {
        if i % (MAPPINGS / 10) == 0 && i > 0 {
            tenths.push(tenth.elapsed());
            tenth = Instant::now();
        }
        let o = i % OBJECTS;
        let (offset, len) = extent(i, data[o].len());
        let opts = MapOptions::new()
            .offset(offset as u64)
            .len(len as u64)
            .fault_around_order((i % 5) as u8);
        match pager.map_trusted(&objects[o], opts) {
            Ok(m) => maps.push(m),
            Err(e) => panic!(
                "mapping {i} of {MAPPINGS} failed: {e} ({:?}); vm.max_map_count is {}",
                std::error::Error::source(&e),
                std::fs::read_to_string(MAX_MAP_COUNT)
                    .unwrap_or_default()
                    .trim()
            ),
        }
    }
    tenths.push(tenth.elapsed());
    let created = t.elapsed();
    assert_eq!(pager.mappings(), MAPPINGS);

    // 2. Fault every page of every mapping, checking a byte of each and
    //    the first and last bytes.
    let t = Instant::now();
    for (i, m) in maps.iter().enumerate() {
        let o = i % OBJECTS;
        let (offset, len) = extent(i, data[o].len());
        assert_eq!(m.len(), len, "mapping {i}");
        for at in [0, len - 1, (PAGE - lead(m)).min(len - 1), len / 2] {
            assert_eq!(
                read_byte(m, at),
                data[o][offset + at],
                "mapping {i} (object {o}, offset {offset}), byte {at}"
            );
        }
    }
    let faulted = t.elapsed();
    let s = pager.stats();
    // At least one fault per mapping (its pages were never mapped).
    assert!(s.pgfault >= MAPPINGS as u64, "{s:?}");
    assert!(s.spf_success > 0, "{s:?}");
    assert_eq!(s.io_errors, 0, "{s:?}");
    // The objects were read from the store about once (readahead windows
    // may overlap a little), not once per mapping.
    let object_bytes = (OBJECTS * OBJECT_PAGES * PAGE) as u64;
    assert!(s.io_bytes <= 2 * object_bytes, "{s:?}");

    // 3. Drop.
    let t = Instant::now();
    let mut drop_tenths = Vec::new();
    while !maps.is_empty() {
        let tenth = Instant::now();
        maps.truncate(maps.len() - MAPPINGS / 10);
        drop_tenths.push(tenth.elapsed());
    }
    let dropped = t.elapsed();
    assert_eq!(pager.mappings(), 0);

    // Still works afterwards.
    let m = pager.map_trusted(&objects[1], MapOptions::new()).unwrap();
    assert_bytes(&m, &data[1], "a mapping after the 100 000");

    println!(
        "CHILD: {MAPPINGS} mappings: created in {created:.2?}, faulted in {faulted:.2?}, \
         dropped in {dropped:.2?}; {s:?}"
    );
    println!("CHILD: creation per tenth: {tenths:.2?}");
    println!("CHILD: drop per tenth (last made first): {drop_tenths:.2?}");
    println!("CHILD: all checks held");
}

#[test]
fn a_hundred_thousand_small_mappings_are_created_faulted_and_dropped() {
    const NAME: &str = "a_hundred_thousand_small_mappings_are_created_faulted_and_dropped";
    if is_child(NAME) {
        return hundred_thousand_mappings();
    }
    watchdog(Duration::from_secs(60), || {
        let _guard = MapCountGuard::at_least((MAPPINGS + OTHER_VMAS) as u64);
        let end = run_child(NAME, Duration::from_secs(50));
        let what = format!(
            "child: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            end.status, end.stdout, end.stderr
        );
        assert!(end.status.is_some(), "hung, killed; {what}");
        assert!(
            end.stdout.contains("CHILD: all checks held"),
            "the child's checks did not all hold; {what}"
        );
        assert!(end.status.unwrap().success(), "{what}");
        for line in end
            .stdout
            .lines()
            .filter(|l| l.contains(" in ") || l.contains("tenth"))
        {
            eprintln!("{line}");
        }
    });
}
