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

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::object::{ObjectCore, ObjectPage};
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
