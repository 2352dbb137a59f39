//! The region table: which address range maps which object.
//!
//! The table is a sorted, non-overlapping vector of regions, immutable once
//! published. A fault handler loads the current snapshot (`ArcSwap`: no lock,
//! no reference count on the table itself), binary-searches it, and clones the
//! region's `Arc`. Mapping and unmapping, which are rare next to faults,
//! copy the vector under a mutex and publish the copy (O(regions) per
//! change: fine for thousands of mappings; the speculative table of the
//! seed 004 issue is the place to make it cheaper).
//!
//! A region owns its registered mapping: the address range is unmapped when
//! the last `Arc<Region>` goes, so a handler that is still resolving a fault
//! on a region that the application just dropped keeps the range mapped (its
//! `UFFDIO_CONTINUE` lands in the old mapping, whose pages are the same
//! object's), and the address can never be reused by a new mapping while a
//! handler holds the old one.
//!
//! The speculative variant with per-region sequence counts (seed 004) is a
//! later issue; its seam is `RegionTable::lookup`.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::object::{ObjectCore, ObjectPage};
use crate::readahead::{Hint, Mode, Params};
use crate::stats::{Counters, RaCounters};
use crate::sys::{MappedRegion, PAGE_SIZE};

/// One registered mapping of (part of) an object.
pub(crate) struct Region {
    /// The registered mapping; unmapped when the region is dropped.
    pub(crate) map: MappedRegion,
    /// The object it maps.
    pub(crate) object: Arc<ObjectCore>,
    /// The object page that the region's first page maps.
    pub(crate) first_page: ObjectPage,
    /// The region's length in pages.
    pub(crate) pages: u64,
    /// Fault-around order.
    pub(crate) order: u8,
    /// This mapping's counters.
    pub(crate) counters: Counters,
    /// This mapping's readahead counters.
    pub(crate) ra: RaCounters,
    /// The largest readahead window, in pages.
    pub(crate) ra_pages: u64,
    /// Which readahead runs.
    pub(crate) ra_mode: Mode,
    /// Hints set with `Mapping::advise`, as sorted, disjoint ranges of
    /// region pages (pages not listed are `Normal`).
    pub(crate) hints: ArcSwap<Vec<(Range<u64>, Hint)>>,
    /// Pages this region has mapped: see [`MappedPages`].
    pub(crate) mapped: MappedPages,
}

/// One bit per region page: set once the page is known to be mapped here
/// (a `UFFDIO_CONTINUE` mapped it, or said `EEXIST`), cleared when faultmap
/// unmaps it (`MADV_DONTNEED`). Fault-around skips neighbours whose bit is
/// set, as the kernel's `filemap_map_pages` skips present PTEs: without it,
/// every fault would re-map its window's mapped pages one failed ioctl at a
/// time. It is a hint, never trusted for the faulting page: a bit that is
/// set for a page whose PTE went away only leaves that page to fault by
/// itself.
pub(crate) struct MappedPages(Box<[AtomicU64]>);

impl MappedPages {
    pub(crate) fn new(pages: u64) -> Self {
        Self((0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    /// Whether page `page` is known to be mapped.
    pub(crate) fn contains(&self, page: u64) -> bool {
        self.0
            .get((page / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (page % 64)) != 0)
    }

    /// Marks `pages` as mapped (`set`) or not.
    pub(crate) fn mark(&self, pages: Range<u64>, set: bool) {
        let mut p = pages.start;
        while p < pages.end {
            let word = (p / 64) as usize;
            let end = pages.end.min((p / 64 + 1) * 64);
            let bits = (end - p) as u32;
            let mask = if bits == 64 {
                u64::MAX
            } else {
                ((1u64 << bits) - 1) << (p % 64)
            };
            if let Some(w) = self.0.get(word) {
                if set {
                    w.fetch_or(mask, Ordering::Relaxed);
                } else {
                    w.fetch_and(!mask, Ordering::Relaxed);
                }
            }
            p = end;
        }
    }
}

impl Region {
    pub(crate) fn start(&self) -> usize {
        self.map.addr()
    }

    pub(crate) fn end(&self) -> usize {
        self.map.addr() + self.map.len()
    }

    /// The address of page `page` of the region.
    pub(crate) fn page_addr(&self, page: u64) -> usize {
        self.start() + page as usize * PAGE_SIZE
    }

    /// The object page that page `page` of the region maps.
    pub(crate) fn object_page(&self, page: u64) -> ObjectPage {
        self.first_page.add(page)
    }

    /// The readahead parameters of a fault on region page `page`.
    pub(crate) fn ra_params(&self, page: u64) -> Params {
        let hint = self
            .hints
            .load()
            .iter()
            .find(|(r, _)| r.contains(&page))
            .map_or(Hint::Normal, |&(_, h)| h);
        Params {
            ra_pages: self.ra_pages,
            object_pages: self.object.cache.states.pages(),
            hint,
            mode: self.ra_mode,
        }
    }

    /// Sets the hint of region pages `pages`.
    pub(crate) fn set_hint(&self, pages: Range<u64>, hint: Hint) {
        self.hints.rcu(|old| set_hint(old, pages.clone(), hint));
    }
}

/// `hints` with `range` set to `hint`: the ranges stay sorted and disjoint,
/// `Normal` is not stored, and neighbours with the same hint merge.
pub(crate) fn set_hint(
    hints: &[(Range<u64>, Hint)],
    range: Range<u64>,
    hint: Hint,
) -> Vec<(Range<u64>, Hint)> {
    let mut out: Vec<(Range<u64>, Hint)> = Vec::with_capacity(hints.len() + 2);
    let push = |r: Range<u64>, h: Hint, out: &mut Vec<(Range<u64>, Hint)>| {
        if r.is_empty() || h == Hint::Normal {
            return;
        }
        match out.last_mut() {
            Some((last, lh)) if *lh == h && last.end == r.start => last.end = r.end,
            _ => out.push((r, h)),
        }
    };
    let mut placed = false;
    for (r, h) in hints {
        // The parts of r before and after `range` keep their hint.
        if r.start < range.start {
            push(r.start..r.end.min(range.start), *h, &mut out);
        }
        if !placed && r.end > range.start {
            push(range.clone(), hint, &mut out);
            placed = true;
        }
        if r.end > range.end {
            push(r.start.max(range.end)..r.end, *h, &mut out);
        }
    }
    if !placed {
        push(range, hint, &mut out);
    }
    out
}

/// The sorted, published set of regions of one pager.
pub(crate) struct RegionTable {
    snapshot: ArcSwap<Vec<Arc<Region>>>,
    writer: Mutex<()>,
}

impl RegionTable {
    pub(crate) fn new() -> Self {
        Self {
            snapshot: ArcSwap::from_pointee(Vec::new()),
            writer: Mutex::new(()),
        }
    }

    /// The region that contains `addr`, if any. Lock-free.
    pub(crate) fn lookup(&self, addr: usize) -> Option<Arc<Region>> {
        let snap = self.snapshot.load();
        let i = snap.partition_point(|r| r.end() <= addr);
        snap.get(i).filter(|r| r.start() <= addr).cloned()
    }

    /// Publishes a table with `region` added.
    pub(crate) fn insert(&self, region: Arc<Region>) {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut next: Vec<Arc<Region>> = self.snapshot.load().as_ref().clone();
        let i = next.partition_point(|r| r.start() < region.start());
        next.insert(i, region);
        self.snapshot.store(Arc::new(next));
    }

    /// Publishes a table without the region that starts at `start`.
    pub(crate) fn remove(&self, start: usize) -> Option<Arc<Region>> {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut next: Vec<Arc<Region>> = self.snapshot.load().as_ref().clone();
        let i = next.iter().position(|r| r.start() == start)?;
        let gone = next.remove(i);
        self.snapshot.store(Arc::new(next));
        Some(gone)
    }

    /// How many regions are mapped.
    pub(crate) fn len(&self) -> usize {
        self.snapshot.load().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_split_merge_and_clear() {
        use Hint::{Normal, Random, Sequential};
        let h = set_hint(&[], 10..20, Random);
        assert_eq!(h, vec![(10..20, Random)]);
        let h = set_hint(&h, 15..30, Sequential);
        assert_eq!(h, vec![(10..15, Random), (15..30, Sequential)]);
        let h = set_hint(&h, 12..13, Normal);
        assert_eq!(
            h,
            vec![(10..12, Random), (13..15, Random), (15..30, Sequential)]
        );
        let h = set_hint(&h, 12..13, Random);
        assert_eq!(h, vec![(10..15, Random), (15..30, Sequential)]);
        let h = set_hint(&h, 0..100, Normal);
        assert!(h.is_empty());
        let h = set_hint(&[(50..60, Random)], 0..5, Sequential);
        assert_eq!(h, vec![(0..5, Sequential), (50..60, Random)]);
    }

    #[test]
    fn mapped_pages_mark_and_clear_across_words() {
        let m = MappedPages::new(200);
        m.mark(3..130, true);
        assert!(!m.contains(2) && m.contains(3) && m.contains(63) && m.contains(64));
        assert!(m.contains(129) && !m.contains(130));
        m.mark(60..70, false);
        assert!(m.contains(59) && !m.contains(60) && !m.contains(69) && m.contains(70));
        m.mark(0..200, true);
        assert!((0..200).all(|p| m.contains(p)));
        assert!(!m.contains(1000), "out of range reads as unmapped");
        m.mark(190..1000, false);
        assert!(!m.contains(199));
    }
}
