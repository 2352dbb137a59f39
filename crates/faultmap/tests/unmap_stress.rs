//! The application unmaps and moves parts of writable mappings while other
//! threads read, write and flush through them (and through other mappings
//! of the same object), under a memory budget that keeps the evictor
//! writing back and evicting. Nothing may die, nothing may hang, and after
//! a final flush the file must equal a model of every write (each write
//! lands in a page that is still mapped at that moment).
//!
//! The run lasts `FAULTMAP_STRESS_SECS` seconds per delivery (10 by
//! default); every loop is bounded in time and in count.

mod common;
use common::MapTrusted;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use common::{mremap_away, watchdog, TestFile, PAGE};
use faultmap::{Config, Delivery, FileStore, MapOptions, MappingMut, Object, Pager};

/// Pages of the file (2 MiB: twice the budget).
const PAGES: usize = 512;
const BUDGET: u64 = 1 << 20;
/// Leading pages of every mapping that stay mapped: threads touch them
/// without the mapping's lock, while other parts of the same region are
/// unmapped or moved (the split the faults must never miss).
const HEAD: usize = 16;
const VIEWS: usize = 3;
const WRITERS: usize = 2;
/// The most operations any one loop makes.
const MAX_OPS: u64 = 2_000_000;

fn seconds() -> u64 {
    std::env::var("FAULTMAP_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// A part of a mapping that is still mapped: object pages
/// `first..first + pages`, now at `addr`.
#[derive(Clone, Copy, Debug)]
struct Seg {
    first: usize,
    pages: usize,
    addr: usize,
}

/// One writable mapping of the object, and where its parts are now.
struct View {
    map: MappingMut,
    /// The parts beyond the head that are still mapped.
    segs: RwLock<Vec<Seg>>,
}

impl View {
    fn new(pager: &Pager, object: &Object) -> Arc<View> {
        let map = pager
            .map_mut_trusted(object, MapOptions::new().fault_around_order(2))
            .expect("map_mut");
        let base = map.as_ptr() as usize;
        Arc::new(View {
            segs: RwLock::new(vec![Seg {
                first: HEAD,
                pages: PAGES - HEAD,
                addr: base + HEAD * PAGE,
            }]),
            map,
        })
    }

    fn base(&self) -> usize {
        self.map.as_ptr() as usize
    }
}

/// A tiny deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Writes `value` at byte `offset` of page `page` through `view` if that
/// page is still mapped there, and returns whether it did. Reading it back
/// through `other` (if mapped there) must see it.
fn write_through(view: &View, other: &View, page: usize, offset: usize, value: u64) -> bool {
    let wrote = at(view, page, |addr| {
        // SAFETY: `addr` is a page of a writable mapping that stays mapped
        // while we hold its view's lock (or is in the never-unmapped head);
        // no reference to these bytes exists anywhere in the test (every
        // access is a raw volatile one), so the contract of `map_mut` holds.
        unsafe { ((addr + offset) as *mut u64).write_volatile(value) };
    });
    if wrote.is_some() {
        at(other, page, |addr| {
            // SAFETY: as above, a read.
            let seen = unsafe { ((addr + offset) as *const u64).read_volatile() };
            assert_eq!(seen, value, "another mapping of the object sees the write");
        });
    }
    wrote.is_some()
}

/// Runs `f` on the address of object page `page` in `view`, while it is
/// sure to stay mapped; `None` if it is not mapped there any more.
fn at<T>(view: &View, page: usize, f: impl FnOnce(usize) -> T) -> Option<T> {
    if page < HEAD {
        return Some(f(view.base() + page * PAGE));
    }
    let segs = view.segs.read().unwrap_or_else(|e| e.into_inner());
    let seg = segs
        .iter()
        .find(|s| s.first <= page && page < s.first + s.pages)?;
    Some(f(seg.addr + (page - seg.first) * PAGE))
}

/// Unmaps or moves a random part of a random segment of `view`; returns
/// (unmapped, moved) counts, or None when too little is left.
fn cut(view: &View, rng: &mut Rng) -> Option<(u64, u64)> {
    let mut segs = view.segs.write().unwrap_or_else(|e| e.into_inner());
    let i = segs.iter().position(|s| s.pages >= 2)?;
    let i = (i + rng.below(segs.len())) % segs.len();
    let seg = segs[i];
    if seg.pages < 2 {
        return Some((0, 0));
    }
    let start = rng.below(seg.pages - 1);
    let len = 1 + rng.below((seg.pages - start).min(16));
    let addr = seg.addr + start * PAGE;
    let mut parts = Vec::new();
    if start > 0 {
        parts.push(Seg {
            pages: start,
            ..seg
        });
    }
    let moved = rng.below(2) == 0;
    if moved {
        let to = mremap_away(addr, len * PAGE);
        parts.push(Seg {
            first: seg.first + start,
            pages: len,
            addr: to,
        });
    } else {
        // SAFETY: a part of the test's own mapping, which it never touches
        // again (its segment goes from the list under the lock).
        let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len * PAGE) };
        assert_eq!(rc, 0, "munmap: {}", std::io::Error::last_os_error());
    }
    if start + len < seg.pages {
        parts.push(Seg {
            first: seg.first + start + len,
            pages: seg.pages - start - len,
            addr: addr + len * PAGE,
        });
    }
    segs.splice(i..i + 1, parts);
    Some(if moved { (0, 1) } else { (1, 0) })
}

fn run(delivery: Delivery) {
    let file = TestFile::new(PAGES * PAGE, 1010);
    let model = Arc::new(Mutex::new(file.data.clone()));
    let duration = Duration::from_secs(seconds());
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[AtomicU64; 5]> = Arc::new(Default::default());
    const WRITES: usize = 0;
    const UNMAPS: usize = 1;
    const MOVES: usize = 2;
    const FLUSHES: usize = 3;
    const RENEWED: usize = 4;
    {
        let pager = Pager::new(
            Config::default()
                .delivery(delivery)
                .memory_budget(BUDGET)
                .dirty_expire(Duration::from_millis(20)),
        )
        .expect("pager");
        let object = pager
            .open(FileStore::open_rw(&file.path).expect("open_rw"))
            .expect("open");
        let views: Arc<Vec<RwLock<Arc<View>>>> = Arc::new(
            (0..VIEWS)
                .map(|_| RwLock::new(View::new(&pager, &object)))
                .collect(),
        );
        let view = |views: &Vec<RwLock<Arc<View>>>, i: usize| {
            views[i].read().unwrap_or_else(|e| e.into_inner()).clone()
        };
        let mut threads = Vec::new();
        for w in 0..WRITERS {
            let (views, model, stop, counts) =
                (views.clone(), model.clone(), stop.clone(), counts.clone());
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((w as u64 + 1) * 7919));
                let mut ops = 0;
                while !stop.load(Ordering::Relaxed) && ops < MAX_OPS {
                    ops += 1;
                    let (a, b) = (rng.below(VIEWS), rng.below(VIEWS));
                    let (va, vb) = (view(&views, a), view(&views, b));
                    // Half the writes go to the head, which stays mapped
                    // while the rest of the region is cut.
                    let page = if rng.below(2) == 0 {
                        rng.below(HEAD)
                    } else {
                        rng.below(PAGES)
                    };
                    // Each writer owns one u64 slot per page (and a second
                    // one at the page's end), so the model's order is its.
                    let offset = if rng.below(2) == 0 {
                        w * 8
                    } else {
                        PAGE - 8 * (w + 1)
                    };
                    let value = rng.next();
                    if write_through(&va, &vb, page, offset, value) {
                        let at = page * PAGE + offset;
                        let mut m = model.lock().unwrap_or_else(|e| e.into_inner());
                        m[at..at + 8].copy_from_slice(&value.to_ne_bytes());
                        counts[WRITES].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        {
            let (views, stop, counts, object) =
                (views.clone(), stop.clone(), counts.clone(), object.clone());
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng(0x2545_F491_4F6C_DD1D);
                let mut ops = 0;
                while !stop.load(Ordering::Relaxed) && ops < MAX_OPS {
                    ops += 1;
                    let v = view(&views, rng.below(VIEWS));
                    let r = if rng.below(2) == 0 {
                        object.flush()
                    } else {
                        let start = rng.below(v.map.len());
                        v.map.flush(start..v.map.len())
                    };
                    r.expect("flush");
                    counts[FLUSHES].fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            }));
        }
        // The cutter: unmaps and moves parts; renews a view that has
        // little left.
        let started = Instant::now();
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let mut ops = 0;
        while started.elapsed() < duration && ops < MAX_OPS {
            ops += 1;
            let i = rng.below(VIEWS);
            let v = view(&views, i);
            match cut(&v, &mut rng) {
                Some((u, m)) => {
                    counts[UNMAPS].fetch_add(u, Ordering::Relaxed);
                    counts[MOVES].fetch_add(m, Ordering::Relaxed);
                }
                None => {
                    *views[i].write().unwrap_or_else(|e| e.into_inner()) =
                        View::new(&pager, &object);
                    counts[RENEWED].fetch_add(1, Ordering::Relaxed);
                }
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().expect("a worker thread panicked");
        }
        object.flush().expect("the final flush");
        let memory = pager.memory();
        assert!(memory.peak <= BUDGET + 64 * PAGE as u64, "{memory:?}");
        drop(views);
    }
    let on_disk = std::fs::read(&file.path).expect("read back");
    let model = model.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(at) = on_disk.iter().zip(model.iter()).position(|(a, b)| a != b) {
        panic!(
            "{delivery:?}: the file differs from the model first at byte {at} (page {})",
            at / PAGE
        );
    }
    let c: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    eprintln!(
        "{delivery:?}: {} writes, {} unmaps, {} moves, {} flushes, {} views renewed",
        c[WRITES], c[UNMAPS], c[MOVES], c[FLUSHES], c[RENEWED]
    );
    assert!(
        c[WRITES] > 0 && c[UNMAPS] > 0 && c[MOVES] > 0 && c[FLUSHES] > 0,
        "{c:?}"
    );
}

#[test]
fn unmaps_and_moves_under_writes_and_flushes_signal() {
    watchdog(Duration::from_secs(seconds() + 120), || {
        run(Delivery::Signal)
    });
}

#[test]
fn unmaps_and_moves_under_writes_and_flushes_handler() {
    watchdog(Duration::from_secs(seconds() + 120), || {
        run(Delivery::Handler)
    });
}
