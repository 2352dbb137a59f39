//! The region table: which address range maps which object, looked up
//! speculatively (the speculative page fault series).
//!
//! One table serves the whole process (every pager's mappings), because a
//! SIGBUS handler must find the region of any faulting address with nothing
//! but the address. It is a sorted, non-overlapping set of regions in
//! leaves of at most `LEAF_MAX`, immutable once published. See
//! [`RegionTable`] for the protocol: speculative lookups in [`Srcu`] read
//! sections validated by per-region sequence counts, a classic path under
//! the table's mutex, and writers that unpublish, wait for a grace period,
//! and only then free or unmap.
//!
//! A region owns its registered mapping: the address range is unmapped when
//! the last `Arc<Region>` goes (the table's, the application's `Mapping`,
//! and any read job's). An unmap waits for a grace period before it drops
//! the table's reference, so a fault that found the region speculatively
//! has finished with its address range before the range can go.
//!
//! Deviation from kernel-mechanisms.md §4(d), which suggests arc-swap or
//! crossbeam-epoch: both keep per-thread state that is created on a
//! thread's first use (an allocation), and crossbeam-epoch may free garbage
//! when a guard is dropped; neither may run in a SIGBUS handler. The SRCU
//! scheme here keeps per-CPU counters instead, and all freeing happens on
//! the writer's side.

use std::ops::Range;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::index::{HostAddr, ObjectPage, RegionPage};
use crate::base::stats::{Counters, RaCounters};
use crate::mm::object::ObjectCore;
use crate::mm::pager_core::Core;
use crate::mm::trace::RegionTrace;
use crate::policy::readahead::{Hint, Mode, Params};
use crate::sync;
use crate::sync::gate::{Closed, Gate, Passage};
use crate::sync::seqcount::SeqCount;
use crate::sync::srcu::{ReadGuard, Srcu};
use crate::sys::{self, MappedRegion};

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
    /// log2 of its object's page size (`crate::PageSize`): 12 or 21.
    pub(crate) page_shift: u32,
    /// Fault-around order (changed under the table's lock, see
    /// [`TableLock::change`]).
    pub(crate) order: AtomicU8,
    /// Adaptive fault-around's density estimate
    /// ([`crate::policy::fault_around::auto`]), used while `order` is
    /// `AUTO`. A fault reads it to size its window, and applies its step
    /// when it ends with a CAS loop (`crate::mm::fault::learn`), so that
    /// the steps of concurrent faults add up.
    pub(crate) density: AtomicU32,
    /// The sequence count: odd while a writer changes the region, and for
    /// good once it is unmapped (the speculative page fault series' `vm_sequence`).
    pub(crate) seq: SeqCount,
    /// The pager that serves it.
    pub(crate) owner: Arc<Core>,
    /// This mapping's counters.
    pub(crate) counters: Counters,
    /// This mapping's readahead counters.
    pub(crate) ra: RaCounters,
    /// The largest readahead window, in pages.
    pub(crate) ra_pages: u64,
    /// Which readahead runs.
    pub(crate) ra_mode: Mode,
    /// Whether a remote store's read-around window adapts
    /// (`MapOptions::fixed_read_around`).
    pub(crate) ra_adapt: bool,
    /// Hints set with `Mapping::advise`, as sorted, disjoint ranges of
    /// region pages (pages not listed are `Normal`).
    /// Published like the table (read in read sections, replaced under the
    /// table's lock, the old list freed after a grace period): a SIGBUS
    /// handler reads it.
    pub(crate) hints: AtomicPtr<Vec<(Range<RegionPage>, Hint)>>,
    /// Pages this region has mapped: see [`MappedPages`].
    pub(crate) mapped: MappedPages,
    /// The regions that took over the parts of this one that the
    /// application left mapped when it unmapped the rest (`crate::mm::events`);
    /// released with the [`crate::Mapping`].
    pub(crate) successors: Mutex<Vec<Arc<Region>>>,
    /// Mapped read-write, registered WP: pages are mapped write-protected
    /// and writes tracked (`crate::mm::writeback`).
    pub(crate) writable: bool,
    /// The access trace it records or replays (`crate::mm::trace`); a
    /// successor shares its predecessor's.
    pub(crate) trace: RegionTrace,
}

/// The least fault-around order of a forked child's region
/// (`crate::mm::guest`): 2 MiB windows. A child's fault is a round trip to
/// the parent, about ten times an in-process fault (`faultmap bench
/// --procs`, its "fault path" line), while mapping more cached pages with
/// the same `UFFDIO_CONTINUE` costs little and reads nothing: four
/// processes scanning a cached object took about a second at order 4,
/// most of it in round trips. Adaptive fault-around is kept as it is.
pub(crate) const GUEST_ORDER: u8 = 9;

/// A forked child's fault-around order for a region at `order`.
fn guest_order(order: u8) -> u8 {
    if order == crate::policy::fault_around::AUTO {
        order
    } else {
        order.max(GUEST_ORDER)
    }
}

/// One bit per region page: set once the page is known to be mapped here
/// (a `UFFDIO_CONTINUE` mapped it, or said `EEXIST`), cleared when faultmap
/// unmaps it (`MADV_DONTNEED`). Fault-around skips neighbours whose bit is
/// set, as the kernel's `filemap_map_pages` skips present PTEs: without it,
/// every fault would re-map its window's mapped pages one failed ioctl at a
/// time. It is a hint, never trusted for the faulting page: a bit that is
/// set for a page whose PTE went away only leaves that page to fault by
/// itself.
pub(crate) struct MappedPages {
    bits: Box<[AtomicU64]>,
    /// The memory areas this region adds to the process, as the Protect
    /// engine estimates them (`crate::mm::engine`; 0 otherwise).
    areas: std::sync::atomic::AtomicUsize,
}

impl MappedPages {
    pub(crate) fn new(pages: u64) -> Self {
        Self {
            bits: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            areas: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The Protect engine's estimate of the areas the region adds.
    pub(crate) fn areas(&self) -> &std::sync::atomic::AtomicUsize {
        &self.areas
    }

    /// Whether page `page` is known to be mapped.
    pub(crate) fn contains(&self, page: RegionPage) -> bool {
        let page = page.0;
        self.bits
            .get((page / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (page % 64)) != 0)
    }

    /// How many of `pages` are known to be mapped. Async-signal-safe.
    pub(crate) fn count(&self, pages: Range<u64>) -> u32 {
        self.words(pages)
            .map(|(w, mask)| (w.load(Ordering::Relaxed) & mask).count_ones())
            .sum()
    }

    /// Marks `pages` as mapped (`set`) or not.
    pub(crate) fn mark(&self, pages: Range<RegionPage>, set: bool) {
        for (w, mask) in self.words(pages.start.0..pages.end.0) {
            if set {
                w.fetch_or(mask, Ordering::Relaxed);
            } else {
                w.fetch_and(!mask, Ordering::Relaxed);
            }
        }
    }

    /// Clears `pages`' bits and returns the runs of those that were set,
    /// each word's in one atomic step: a bit set meanwhile (a grant to a
    /// Protect child) is either in the runs or still set, never lost.
    pub(crate) fn take(&self, pages: Range<u64>) -> Vec<Range<u64>> {
        let mut runs: Vec<Range<u64>> = Vec::new();
        let mut p = pages.start;
        for (w, mask) in self.words(pages.clone()) {
            let old = w.fetch_and(!mask, Ordering::Relaxed) & mask;
            let base = p - p % 64;
            let mut bits = old;
            while bits != 0 {
                let page = base + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                match runs.last_mut() {
                    Some(r) if r.end == page => r.end += 1,
                    _ => runs.push(page..page + 1),
                }
            }
            p = (base + 64).min(pages.end);
        }
        runs
    }

    /// The words that hold `pages`, each with the mask of its bits among
    /// them (pages past the bitmap are left out).
    fn words(&self, pages: Range<u64>) -> impl Iterator<Item = (&AtomicU64, u64)> {
        let mut p = pages.start;
        std::iter::from_fn(move || {
            while p < pages.end {
                let end = pages.end.min((p / 64 + 1) * 64);
                let bits = (end - p) as u32;
                let mask = if bits == 64 {
                    u64::MAX
                } else {
                    ((1u64 << bits) - 1) << (p % 64)
                };
                let word = self.bits.get((p / 64) as usize);
                p = end;
                if let Some(w) = word {
                    return Some((w, mask));
                }
            }
            None
        })
    }
}

impl Region {
    /// The address of the region's first byte.
    pub(crate) fn start(&self) -> HostAddr {
        HostAddr(self.map.addr())
    }

    /// The address after the region's last byte.
    pub(crate) fn end(&self) -> HostAddr {
        self.start().add(self.map.len())
    }

    /// The size of the region's pages, in bytes.
    pub(crate) fn page_bytes(&self) -> usize {
        1 << self.page_shift
    }

    /// The page that holds address `addr` (inside the region): its first
    /// byte and its length, what `UFFDIO_WAKE` and `UFFDIO_POISON` cover.
    pub(crate) fn span_of(&self, addr: HostAddr) -> (HostAddr, usize) {
        (self.addr_of(self.page_of(addr)), self.page_bytes())
    }

    /// The address of page `page` of the region.
    pub(crate) fn addr_of(&self, page: RegionPage) -> HostAddr {
        self.start().add((page.0 as usize) << self.page_shift)
    }

    /// The region page that holds address `addr` (inside the region).
    pub(crate) fn page_of(&self, addr: HostAddr) -> RegionPage {
        RegionPage((addr.since(self.start()) >> self.page_shift) as u64)
    }

    /// The region pages that hold bytes `bytes` (inside the region, not
    /// empty): from the page of the first byte to the page after the
    /// last.
    pub(crate) fn pages_holding(&self, bytes: Range<HostAddr>) -> Range<RegionPage> {
        let (lead, end) = (
            bytes.start.since(self.start()),
            bytes.end.since(self.start()),
        );
        let page = self.page_bytes();
        RegionPage((lead / page) as u64)..RegionPage(end.div_ceil(page) as u64)
    }

    /// The object offset of the byte mapped at `addr` (inside the region).
    pub(crate) fn object_offset(&self, addr: HostAddr) -> u64 {
        (self.first_page.0 << self.page_shift) + addr.since(self.start()) as u64
    }

    /// The object pages this region maps.
    pub(crate) fn object_pages(&self) -> Range<ObjectPage> {
        self.first_page..self.first_page.add(self.pages)
    }

    /// The object page that page `page` of the region maps.
    pub(crate) fn object_page(&self, page: RegionPage) -> ObjectPage {
        self.first_page.add(page.0)
    }

    /// The region pages that map object pages `pages`; `None` if the
    /// region maps none of them.
    pub(crate) fn region_pages(&self, pages: Range<ObjectPage>) -> Option<Range<RegionPage>> {
        let ours = self.object_pages();
        let (start, stop) = (pages.start.max(ours.start), pages.end.min(ours.end));
        (start < stop)
            .then(|| RegionPage(start.0 - ours.start.0)..RegionPage(stop.0 - ours.start.0))
    }

    /// The readahead parameters of a fault on region page `page`.
    pub(crate) fn ra_params(&self, page: RegionPage) -> Params {
        // SAFETY: the list is live: it is replaced only under the table's
        // lock and freed after a grace period (or with the region), and
        // every caller is in a read section or holds the lock.
        let hints = unsafe { &*self.hints.load(Ordering::Acquire) };
        let hint = hints
            .iter()
            .find(|(r, _)| r.contains(&page))
            .map_or(Hint::Normal, |&(_, h)| h);
        // Under a budget, a window never takes more than a fraction of
        // it (the kernel's old `max_sane_readahead`): a read-around
        // larger than the budget evicts itself before it is used.
        let ra_pages = self
            .ra_pages
            .min(self.object.budget.max_ra_pages(&self.object));
        Params {
            ra_pages,
            around_pages: self.object.around_pages.unwrap_or(ra_pages).min(ra_pages),
            object_pages: self.object.cache.states.pages(),
            hint,
            mode: self.ra_mode,
            adapt: self.ra_adapt,
        }
    }

    /// Sets the hint of region pages `pages`; the caller holds the table's
    /// lock, and brackets the change with the region's count.
    pub(crate) fn set_hint(&self, lock: &TableLock<'_>, pages: Range<RegionPage>, hint: Hint) {
        // SAFETY: as in `ra_params`; the lock keeps other writers out.
        let old = unsafe { &*self.hints.load(Ordering::Acquire) };
        let next = Box::into_raw(Box::new(set_hint(old, pages, hint)));
        let old = self.hints.swap(next, Ordering::AcqRel);
        lock.table.srcu.synchronize();
        // SAFETY: `old` came from Box::into_raw, is unpublished, and no read
        // section that loaded it is left.
        drop(unsafe { Box::from_raw(old) });
    }

    /// A copy of this region for a forked child that mapped it again at the
    /// same address (`crate::mm::guest`), served by `owner` (the pager's
    /// core for that child): the same object, pages and options; its own
    /// counters, mapped bits and sequence count; no trace; a fault-around
    /// order of at least [`GUEST_ORDER`]. `None` for a null address.
    pub(crate) fn for_guest(&self, owner: Arc<Core>) -> Option<Arc<Region>> {
        let map = sys::MappedRegion::foreign(self.start().get(), self.map.len())?;
        // SAFETY: as in `ra_params`.
        let hints = unsafe { &*self.hints.load(Ordering::Acquire) }.clone();
        Some(Arc::new(Region {
            map,
            object: self.object.clone(),
            first_page: self.first_page,
            pages: self.pages,
            page_shift: self.page_shift,
            order: AtomicU8::new(guest_order(self.order())),
            density: AtomicU32::new(crate::policy::fault_around::DENSITY_START),
            seq: SeqCount::default(),
            owner,
            counters: Counters::default(),
            ra: RaCounters::default(),
            ra_pages: self.ra_pages,
            ra_mode: self.ra_mode,
            ra_adapt: self.ra_adapt,
            hints: AtomicPtr::new(Box::into_raw(Box::new(hints))),
            mapped: MappedPages::new(self.pages),
            successors: Mutex::new(Vec::new()),
            writable: self.writable,
            trace: RegionTrace::default(),
        }))
    }

    /// A region an unrelated process mapped at `addr` (served here, with
    /// `owner`, the core for that process): pages `first..first + pages`
    /// of `object`, with the options of a default mapping (fault-around
    /// of at least [`GUEST_ORDER`], the object's readahead), fresh
    /// counters, no trace. `None` for a null address or an empty range.
    pub(crate) fn for_joiner(
        object: &Arc<ObjectCore>,
        owner: Arc<Core>,
        addr: usize,
        first: u64,
        pages: u64,
    ) -> Option<Arc<Region>> {
        let len = usize::try_from(object.cache.bytes(pages)).ok()?;
        if pages == 0 {
            return None;
        }
        let map = sys::MappedRegion::foreign(addr, len)?;
        let opts = crate::base::config::MapOptions::default();
        Some(Arc::new(Region {
            map,
            object: object.clone(),
            first_page: ObjectPage(first),
            pages,
            page_shift: object.cache.bytes(1).trailing_zeros(),
            order: AtomicU8::new(guest_order(opts.order())),
            density: AtomicU32::new(crate::policy::fault_around::DENSITY_START),
            seq: SeqCount::default(),
            owner,
            counters: Counters::default(),
            ra: RaCounters::default(),
            ra_pages: object.ra_pages,
            ra_mode: opts.readahead_mode(),
            ra_adapt: opts.adaptive_read_around(),
            hints: AtomicPtr::new(Box::into_raw(Box::default())),
            mapped: MappedPages::new(pages),
            successors: Mutex::new(Vec::new()),
            writable: false,
            trace: RegionTrace::default(),
        }))
    }

    /// A region that takes over the pages at `part` (page-aligned, inside
    /// this one), which now live at address `at`: `at == part.start` for a
    /// part the application left in place (a partial `munmap`), another
    /// address for a part it moved (`mremap`). The same object, options,
    /// hints and mapped bits; fresh counters. `None` if `part` is not
    /// inside this region or `at` is null.
    ///
    /// The caller (`crate::mm::events`, under the table's lock) disowns this
    /// region before the lock is let go, so each part has one owner: the
    /// successor, whose drop unregisters and unmaps it.
    pub(crate) fn successor(&self, part: Range<HostAddr>, at: HostAddr) -> Option<Arc<Region>> {
        if part.start < self.start() || part.end > self.end() || part.is_empty() {
            return None;
        }
        let skip = self.page_of(part.start);
        let pages = (part.end.since(part.start) >> self.page_shift) as u64;
        // SAFETY: `part` is mapped at `at` (the application left it there or
        // moved it there, and the kernel told us so), and only this
        // successor will own it: this region is disowned before the table's
        // lock is let go (see above), and a disowned region is never split
        // again. (It takes over `self.map`'s listing for forked children,
        // at its address and offset: the part is DONTFORK too.)
        let map = unsafe {
            sys::MappedRegion::adopt(
                &self.map,
                part.start.since(self.start()),
                at.get(),
                part.end.since(part.start),
            )
        }?;
        // SAFETY: as in `ra_params`.
        let hints = unsafe { &*self.hints.load(Ordering::Acquire) };
        // This region's pages `skip..skip + pages` are the successor's
        // pages `0..pages`.
        let rebase = |p: RegionPage| RegionPage(p.since(skip));
        let hints: Vec<(Range<RegionPage>, Hint)> = hints
            .iter()
            .filter(|(r, _)| r.end > skip && r.start < skip.add(pages))
            .map(|(r, h)| {
                (
                    rebase(r.start.max(skip))..rebase(r.end.min(skip.add(pages))),
                    *h,
                )
            })
            .collect();
        let mapped = MappedPages::new(pages);
        for p in (0..pages).map(RegionPage) {
            if self.mapped.contains(skip.add(p.0)) {
                mapped.mark(p..p.add(1), true);
            }
        }
        Some(Arc::new(Region {
            map,
            object: self.object.clone(),
            first_page: self.object_page(skip),
            pages,
            page_shift: self.page_shift,
            order: AtomicU8::new(self.order()),
            density: AtomicU32::new(self.density.load(Ordering::Relaxed)),
            seq: SeqCount::default(),
            owner: self.owner.clone(),
            counters: Counters::default(),
            ra: RaCounters::default(),
            ra_pages: self.ra_pages,
            ra_mode: self.ra_mode,
            ra_adapt: self.ra_adapt,
            hints: AtomicPtr::new(Box::into_raw(Box::new(hints))),
            mapped,
            successors: Mutex::new(Vec::new()),
            writable: self.writable,
            trace: self.trace.clone(),
        }))
    }

    /// The regions that serve what is left of this one: itself if it is
    /// still attached, else its successors' (recursively). For settings
    /// made through a [`crate::Mapping`] after the application unmapped or
    /// moved part of it. The caller holds the table's lock (successors
    /// change only under it).
    pub(crate) fn live(self: &Arc<Self>, _lock: &TableLock<'_>) -> Vec<Arc<Region>> {
        let mut out = Vec::new();
        let mut todo = vec![self.clone()];
        while let Some(r) = todo.pop() {
            if r.map.is_disowned() {
                todo.extend(lock(&r.successors).iter().cloned());
            } else {
                out.push(r);
            }
        }
        out
    }

    /// The fault-around order.
    pub(crate) fn order(&self) -> u8 {
        self.order.load(Ordering::Relaxed)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Unregistered before `map` unmaps it, so that the munmap sends no
        // UNMAP event (and does not wait for a pager thread to read one:
        // there may be none left). A detached range is not ours any more:
        // neither unregistered nor unmapped here.
        if !self.map.is_disowned() && !self.map.is_foreign() {
            self.owner.engine.disarm(self);
        }
        // SAFETY: the last owner; the list came from Box::into_raw.
        drop(unsafe { Box::from_raw(*self.hints.get_mut()) });
    }
}

/// `hints` with `range` set to `hint`: the ranges stay sorted and disjoint,
/// `Normal` is not stored, and neighbours with the same hint merge. `P` is
/// a region page ([`RegionPage`]; the tests use plain numbers).
pub(crate) fn set_hint<P: Ord + Copy>(
    hints: &[(Range<P>, Hint)],
    range: Range<P>,
    hint: Hint,
) -> Vec<(Range<P>, Hint)> {
    let mut out: Vec<(Range<P>, Hint)> = Vec::with_capacity(hints.len() + 2);
    let push = |r: Range<P>, h: Hint, out: &mut Vec<(Range<P>, Hint)>| {
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

/// Regions per leaf of the table: a change copies one leaf and the list of
/// leaves, so with `n` regions it copies about `LEAF_MAX + n / LEAF_MAX`
/// pointers, not `n` (100 000 mappings: about 1 000 per change).
#[cfg(not(test))]
const LEAF_MAX: usize = 256;
#[cfg(test)]
const LEAF_MAX: usize = 4;

/// What the table keeps: an address range and its sequence count. A
/// [`Region`] in production; a stand-in in the loom model, which runs the
/// table's own code.
pub(crate) trait Entry {
    /// The first address.
    fn start(&self) -> HostAddr;
    /// The address after the last.
    fn end(&self) -> HostAddr;
    /// The count that brackets changes.
    fn seq(&self) -> &SeqCount;
}

impl Entry for Region {
    fn start(&self) -> HostAddr {
        Region::start(self)
    }
    fn end(&self) -> HostAddr {
        Region::end(self)
    }
    fn seq(&self) -> &SeqCount {
        &self.seq
    }
}

/// A run of regions, sorted by start address; never empty when published.
struct Leaf<R>(Vec<Arc<R>>);

/// One published version of the table: leaves sorted by their first
/// region's start, and the successors waiting for a stale region to go
/// (`TableLock::replace`). Immutable once published.
struct Snapshot<R> {
    leaves: Vec<Arc<Leaf<R>>>,
    /// Successors not published yet: their range is still covered by a
    /// region of another pager whose UNMAP or REMAP event that pager has
    /// not handled yet. A fault there is told to retry (`Busy`).
    pending: Vec<Arc<R>>,
}

impl<R> Default for Snapshot<R> {
    fn default() -> Self {
        Self {
            leaves: Vec::new(),
            pending: Vec::new(),
        }
    }
}

impl<R: Entry> Snapshot<R> {
    fn find(&self, addr: HostAddr) -> Option<&Arc<R>> {
        // The last leaf whose first region starts at or below addr.
        let i = self.leaves.partition_point(|l| l.0[0].start() <= addr);
        let leaf = self.leaves.get(i.checked_sub(1)?)?;
        let j = leaf.0.partition_point(|r| r.start() <= addr);
        leaf.0.get(j.checked_sub(1)?).filter(|r| addr < r.end())
    }

    /// Whether a region overlaps `range` (not empty).
    fn overlaps(&self, range: Range<HostAddr>) -> bool {
        if self.find(range.start).is_some() {
            return true;
        }
        // Else the first region that starts after range.start must start
        // at or after its end.
        let i = self
            .leaves
            .partition_point(|l| l.0[0].start() <= range.start);
        let in_leaf = i.checked_sub(1).and_then(|i| {
            let leaf = &self.leaves[i].0;
            leaf.get(leaf.partition_point(|r| r.start() <= range.start))
        });
        let next = in_leaf.or_else(|| self.leaves.get(i).map(|l| &l.0[0]));
        next.is_some_and(|r| r.start() < range.end)
    }

    /// A copy of the snapshot (its leaves shared).
    fn clone_shallow(&self) -> Snapshot<R> {
        Snapshot {
            leaves: self.leaves.clone(),
            pending: self.pending.clone(),
        }
    }

    /// This snapshot with every pending successor that overlaps no region
    /// moved into the leaves.
    fn promoted(mut self) -> Snapshot<R> {
        for s in std::mem::take(&mut self.pending) {
            if self.overlaps(s.start()..s.end()) {
                self.pending.push(s);
            } else {
                self = self.with(s);
            }
        }
        self
    }

    /// A pending successor that contains `addr`.
    fn find_pending(&self, addr: HostAddr) -> Option<&Arc<R>> {
        self.pending
            .iter()
            .find(|r| r.start() <= addr && addr < r.end())
    }

    fn with(&self, region: Arc<R>) -> Snapshot<R> {
        let mut leaves = self.leaves.clone();
        let i = leaves
            .partition_point(|l| l.0[0].start() <= region.start())
            .saturating_sub(1);
        let mut regions = leaves.get(i).map_or_else(Vec::new, |l| l.0.clone());
        let j = regions.partition_point(|r| r.start() < region.start());
        regions.insert(j, region);
        let replaced: Vec<Arc<Leaf<R>>> = if regions.len() > LEAF_MAX {
            let tail = regions.split_off(regions.len() / 2);
            vec![Arc::new(Leaf(regions)), Arc::new(Leaf(tail))]
        } else {
            vec![Arc::new(Leaf(regions))]
        };
        let end = (i + 1).min(leaves.len());
        leaves.splice(i..end, replaced);
        Snapshot {
            leaves,
            pending: self.pending.clone(),
        }
    }

    fn without(&self, start: HostAddr) -> Option<(Snapshot<R>, Arc<R>)> {
        let mut leaves = self.leaves.clone();
        let i = leaves
            .partition_point(|l| l.0[0].start() <= start)
            .checked_sub(1)?;
        let mut regions = leaves[i].0.clone();
        let j = regions.iter().position(|r| r.start() == start)?;
        let gone = regions.remove(j);
        if regions.is_empty() {
            leaves.remove(i);
        } else {
            leaves[i] = Arc::new(Leaf(regions));
        }
        let pending = self.pending.clone();
        Some((Snapshot { leaves, pending }, gone))
    }
}

/// Every registered mapping of the process: the one table that a fault, on
/// a handler thread or in a SIGBUS handler, finds its region in.
///
/// # Protocol (the speculative page fault series)
///
/// - **Speculative lookup** ([`RegionTable::speculate`]): inside an
///   [`Srcu`] read section, load the published snapshot, find the region,
///   read its sequence count (odd: being changed, abort). The fault is
///   resolved with no lock, and [`Speculation::still_valid`] re-reads the
///   count before anything is mapped: a change in between aborts the
///   attempt. No lock, no allocation, no reference count: a SIGBUS handler
///   may do it.
/// - **Classic lookup** ([`RegionTable::lock`]): the table's mutex (the
///   `mmap_lock` of this table), held for the whole fault.
/// - **Writers** (map, unmap, a change of a region's options) take the
///   mutex for their whole operation, as `mmap`/`munmap` hold `mmap_lock`
///   for writing, and bracket a region's change with its count (odd while
///   changing). Unmapping unpublishes the region, marks it dead (its count
///   stays odd), waits for a grace period (every speculative fault that
///   may have found it has ended), and only then lets the range go; so a
///   speculative `UFFDIO_CONTINUE` can never land in a range that was
///   unmapped and reused.
///
/// A speculative fault never waits inside its read section and never takes
/// the mutex inside it (a writer holding the mutex may be waiting for the
/// section to end).
pub(crate) struct RegionTable<R = Region> {
    snapshot: sync::AtomicPtr<Snapshot<R>>,
    srcu: Srcu,
    lock: sync::Mutex<()>,
    /// Pager threads read userfaultfd messages, and handle their events,
    /// in a passage through this gate; [`RegionTable::settled`] closes it
    /// (`crate::mm::events`).
    events: Gate,
}

/// A region found speculatively, valid while the read section lasts.
pub(crate) struct Speculation<'a, R = Region> {
    pub(crate) region: &'a Arc<R>,
    seq: u64,
    _section: ReadGuard<'a>,
}

impl<R: Entry> Speculation<'_, R> {
    /// Whether the region is unchanged since it was found: no writer began
    /// or ended a change of it (map, unmap, options) in between.
    pub(crate) fn still_valid(&self) -> bool {
        self.region.seq().still(self.seq)
    }
}

/// What a speculative lookup found.
pub(crate) enum Speculated<'a, R = Region> {
    /// The region, unchanging when looked up.
    Found(Speculation<'a, R>),
    /// A region that a writer is changing (or has unmapped); valid while
    /// the read section (held here) lasts.
    Busy(&'a Arc<R>, ReadGuard<'a>),
    /// No region contains the address.
    None,
}

impl<R> Speculated<'_, R> {
    /// Whether a region was found, unchanging.
    #[cfg(all(test, loom))]
    fn is_found(&self) -> bool {
        matches!(self, Speculated::Found(_))
    }
}

/// The table's mutex: faults on the classic path and writers hold it.
/// Taken by [`RegionTable::settled`], it also keeps the events gate
/// closed.
pub(crate) struct TableLock<'a, R = Region> {
    table: &'a RegionTable<R>,
    _guard: sync::MutexGuard<'a, ()>,
    /// Dropped after the mutex: a pager thread let through then finds it
    /// free.
    _settled: Option<Closed<'a>>,
}

impl<R: Entry> RegionTable<R> {
    pub(crate) fn new() -> Self {
        Self {
            snapshot: sync::AtomicPtr::new(Box::into_raw(Box::default())),
            srcu: Srcu::new(),
            lock: sync::Mutex::new(()),
            events: Gate::new(),
        }
    }
}

impl RegionTable {
    /// The process's table (a forked child's own: see [`TABLE`]).
    pub(crate) fn get() -> &'static RegionTable {
        TABLE.get_or_init(RegionTable::new)
    }

    /// The process's table if any mapping was ever made (for the SIGBUS
    /// handler: no initialisation there).
    pub(crate) fn get_if_ready() -> Option<&'static RegionTable> {
        TABLE.get()
    }
}

impl<R: Entry> RegionTable<R> {
    /// Looks `addr` up without a lock (see the type's documentation).
    /// Async-signal-safe.
    pub(crate) fn speculate(&self, addr: HostAddr) -> Speculated<'_, R> {
        let section = self.srcu.read();
        // SAFETY: the pointer is always a live published snapshot: writers
        // free a snapshot only after unpublishing it and waiting for every
        // read section that could have loaded it (this one included).
        let snap = unsafe { &*self.snapshot.load(Ordering::Acquire) };
        let Some(region) = snap.find(addr) else {
            // A successor waiting to be published: the fault retries.
            return match snap.find_pending(addr) {
                Some(region) => Speculated::Busy(region, section),
                None => Speculated::None,
            };
        };
        let Some(seq) = region.seq().begin() else {
            return Speculated::Busy(region, section);
        };
        Speculated::Found(Speculation {
            region,
            seq,
            _section: section,
        })
    }

    /// Takes the table's mutex (the classic path, and writers). Events a
    /// pager thread has read may not be handled yet: see
    /// [`RegionTable::settled`].
    pub(crate) fn lock(&self) -> TableLock<'_, R> {
        TableLock {
            table: self,
            _guard: self.lock.lock().unwrap_or_else(|e| e.into_inner()),
            _settled: None,
        }
    }

    /// Takes the table's mutex once every userfaultfd event that a pager
    /// thread has read is handled, and keeps pager threads from reading
    /// more until it drops: an application's `munmap` that returned
    /// before this call has its region detached, and none returns while
    /// the lock is held (`crate::mm::events`). For whoever zaps or unmaps
    /// a region's range. Must not be called by a pager thread inside its
    /// passage ([`RegionTable::read_events`]).
    pub(crate) fn settled(&self) -> TableLock<'_, R> {
        let closed = self.events.close();
        TableLock {
            _settled: Some(closed),
            ..self.lock()
        }
    }

    /// A pager thread's passage to read userfaultfd messages and handle
    /// their events (under [`RegionTable::lock`]); it waits while a
    /// [`RegionTable::settled`] lock is held.
    pub(crate) fn read_events(&self) -> Passage<'_> {
        self.events.pass()
    }

    /// Whether a pager thread is reading or handling userfaultfd events
    /// now. Async-signal-safe.
    pub(crate) fn events_in_flight(&self) -> bool {
        self.events.busy()
    }

    fn publish(&self, next: Snapshot<R>) {
        let old = self
            .snapshot
            .swap(Box::into_raw(Box::new(next)), Ordering::AcqRel);
        self.srcu.synchronize();
        // SAFETY: `old` came from Box::into_raw, is unpublished, and every
        // read section that could have loaded it has ended.
        drop(unsafe { Box::from_raw(old) });
    }
}

impl<R: Entry> TableLock<'_, R> {
    fn current(&self) -> &Snapshot<R> {
        // SAFETY: the published snapshot changes only under the mutex, which
        // this guard holds, so it stays live for the guard's lifetime.
        unsafe { &*self.table.snapshot.load(Ordering::Acquire) }
    }

    /// Whether a published region, or a successor waiting to be
    /// published, overlaps `range`.
    pub(crate) fn overlaps(&self, range: Range<HostAddr>) -> bool {
        let snap = self.current();
        snap.overlaps(range.clone())
            || snap
                .pending
                .iter()
                .any(|r| r.start() < range.end && range.start < r.end())
    }

    /// The region that contains `addr`, if any.
    pub(crate) fn lookup(&self, addr: HostAddr) -> Option<&Arc<R>> {
        self.current().find(addr)
    }

    /// Publishes `region`. Its range must not overlap a published region's.
    pub(crate) fn insert(&self, region: Arc<R>) {
        let next = self.current().with(region);
        self.table.publish(next);
    }

    /// Unpublishes the region that starts at `start` and waits until no
    /// speculative fault can still be using it; returns it, for the caller
    /// to drop (which unmaps it once no I/O job holds it).
    pub(crate) fn remove(&self, start: HostAddr) -> Option<Arc<R>> {
        let (next, gone) = self.current().without(start)?;
        // Odd for good: a speculative fault that found it aborts.
        gone.seq().write_begin();
        self.publish_promoted(next);
        Some(gone)
    }

    /// The published regions that overlap `range`, in address order.
    pub(crate) fn overlapping(&self, range: Range<HostAddr>) -> Vec<Arc<R>> {
        self.current()
            .leaves
            .iter()
            .flat_map(|leaf| leaf.0.iter())
            .filter(|r| r.start() < range.end && range.start < r.end())
            .cloned()
            .collect()
    }

    /// Unpublishes `region`, whose address range the application unmapped
    /// or moved (in part or whole), and publishes `successors` (which serve
    /// what is left of it, `Region::successor`) in its place, in one
    /// snapshot: a fault on a part that stays mapped finds either `region`
    /// (and aborts: its count is odd for good, so it retries under this
    /// lock, and then finds the successor) or a successor, never nothing.
    /// Idempotent for `region`. (`TableLock::replace` is this for a
    /// [`Region`], which it also disowns first.)
    ///
    /// A successor whose range a published region still covers (a moved
    /// part that landed where another pager's region was, whose own UNMAP
    /// or REMAP event that pager has not handled yet: pagers read their
    /// events in no common order) waits in the snapshot's pending list,
    /// where a fault finds it busy and retries, until that region goes.
    pub(crate) fn swap_in(&self, region: &Arc<R>, successors: &[Arc<R>]) {
        let current = self.current();
        let mut next = match current.find(region.start()) {
            Some(r) if Arc::ptr_eq(r, region) => {
                // Odd for good: a speculative fault that found it aborts.
                region.seq().write_begin();
                current.without(region.start()).map(|(s, _)| s)
            }
            _ => None,
        }
        .unwrap_or_else(|| current.clone_shallow());
        next.pending.extend(successors.iter().cloned());
        self.table.publish(next.promoted());
    }

    /// Publishes `next` with every pending successor that no region covers
    /// any more moved into the table.
    fn publish_promoted(&self, next: Snapshot<R>) {
        self.table.publish(next.promoted());
    }

    /// Changes a region's options (`f`), bracketed by its sequence count so
    /// that a speculative fault that read the old options aborts.
    pub(crate) fn change(&self, region: &R, f: impl FnOnce()) {
        region.seq().write_begin();
        f();
        region.seq().write_end();
    }
}

impl TableLock<'_, Region> {
    /// [`TableLock::swap_in`] for a region of the process: `region` is
    /// disowned (the [`Region`]'s drop neither unregisters nor unmaps its
    /// range: what is there now is not ours) and forgotten by its object
    /// (no invalidation or eviction touches its range again) first. The
    /// successors must already be listed in the object's rmap (so that a
    /// write-back running meanwhile always finds a region to write-protect
    /// a still-mapped page in). Idempotent for `region`.
    pub(crate) fn replace(&self, region: &Arc<Region>, successors: &[Arc<Region>]) {
        region.map.disown();
        region.object.remove_mapping(region);
        self.swap_in(region, successors);
    }

    /// Unpublishes `region` as a mapping's drop does, or, if it was
    /// detached, the regions that took over its remaining parts. Returns
    /// them, for the caller to drop (after the lock, or under it).
    pub(crate) fn release(&self, region: &Arc<Region>) -> Vec<Arc<Region>> {
        let mut out = Vec::new();
        if region.map.is_disowned() {
            let successors = std::mem::take(&mut *lock(&region.successors));
            for s in &successors {
                out.extend(self.release(s));
            }
            out.extend(successors);
        } else {
            region.object.remove_mapping(region);
            if self
                .lookup(region.start())
                .is_some_and(|r| Arc::ptr_eq(r, region))
            {
                out.extend(self.remove(region.start()));
            } else if self
                .current()
                .pending
                .iter()
                .any(|r| Arc::ptr_eq(r, region))
            {
                let mut next = self.current().clone_shallow();
                next.pending.retain(|r| !Arc::ptr_eq(r, region));
                region.seq().write_begin();
                self.publish_promoted(next);
                out.push(region.clone());
            }
        }
        out
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's table: created on first use, never freed. A forked child
/// starts from a table of its own: the parent's regions are not the
/// child's (mappings are `MADV_DONTFORK`; the child maps their ranges again
/// and the parent serves them, `crate::mm::guest`, or a placeholder holds
/// them, `crate::sys::fork`), its pager threads do not exist
/// there, and its locks and read-section counters may have been held by
/// threads that are gone; the parent's table is leaked there, never
/// touched again.
static TABLE: sys::ForkLocal<RegionTable> = sys::ForkLocal::new();

#[cfg(test)]
mod tests {
    #[test]
    fn take_clears_and_returns_the_runs_that_were_set() {
        let m = super::MappedPages::new(200);
        for r in [3..5u64, 62..70, 130..131, 190..200] {
            m.mark(RegionPage(r.start)..RegionPage(r.end), true);
        }
        assert_eq!(m.take(0..200), vec![3..5, 62..70, 130..131, 190..200]);
        assert_eq!(m.count(0..200), 0);
        m.mark(RegionPage(10)..RegionPage(140), true);
        assert_eq!(m.take(63..129), vec![63..129]);
        assert_eq!(m.count(0..200), 130 - 66);
        assert_eq!(m.take(150..150), Vec::<std::ops::Range<u64>>::new());
    }

    use super::*;

    /// Marking and counting agree with a plain set, across word edges, up
    /// to the mapping's last page.
    #[test]
    fn mapped_pages_mark_and_count() {
        let pages = 200u64;
        let bits = MappedPages::new(pages);
        let mut plain = vec![false; pages as usize];
        for (range, set) in [
            (3..70, true),
            (60..130, true),
            (64..65, false),
            (128..200, true),
        ] {
            bits.mark(RegionPage(range.start)..RegionPage(range.end), set);
            for p in range {
                plain[p as usize] = set;
            }
        }
        for (a, b) in [(0, 200), (0, 64), (63, 129), (64, 65), (199, 200), (5, 5)] {
            let want = (a..b).filter(|&p| plain[p as usize]).count() as u32;
            assert_eq!(bits.count(a..b), want, "{a}..{b}");
        }
        for p in 0..pages {
            assert_eq!(bits.contains(RegionPage(p)), plain[p as usize], "page {p}");
        }
    }

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
        let pages = |r: Range<u64>| RegionPage(r.start)..RegionPage(r.end);
        let m = MappedPages::new(200);
        let has = |p| m.contains(RegionPage(p));
        m.mark(pages(3..130), true);
        assert!(!has(2) && has(3) && has(63) && has(64));
        assert!(has(129) && !has(130));
        m.mark(pages(60..70), false);
        assert!(has(59) && !has(60) && !has(69) && has(70));
        m.mark(pages(0..200), true);
        assert!((0..200).all(has));
        assert!(!has(1000), "out of range reads as unmapped");
        m.mark(pages(190..1000), false);
        assert!(!has(199));
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::{Entry, RegionTable, Speculated};
    use crate::base::index::HostAddr;
    use crate::sync::seqcount::SeqCount;
    use loom::thread;
    use std::sync::Arc;

    /// A region as the table sees it: a range and its count.
    struct Stub {
        start: usize,
        end: usize,
        seq: SeqCount,
    }

    impl Entry for Stub {
        fn start(&self) -> HostAddr {
            HostAddr(self.start)
        }
        fn end(&self) -> HostAddr {
            HostAddr(self.end)
        }
        fn seq(&self) -> &SeqCount {
            &self.seq
        }
    }

    fn stub(start: usize, end: usize) -> Arc<Stub> {
        Arc::new(Stub {
            start,
            end,
            seq: SeqCount::default(),
        })
    }

    /// A partial unmap (the table's own `swap_in`, as the UNMAP event
    /// handler runs it) against a speculative fault (the table's own
    /// `speculate`) on addresses that stay mapped: the fault finds the old
    /// region or a successor that contains the address, never nothing.
    #[test]
    fn loom_models_region_table_swap_vs_speculative_lookup() {
        loom::model(|| {
            let table = Arc::new(RegionTable::<Stub>::new());
            let old = stub(0, 40);
            table.lock().insert(old.clone());
            let writer = {
                let (table, old) = (table.clone(), old.clone());
                thread::spawn(move || {
                    // munmap of [20, 30): two successors in one snapshot.
                    let lock = table.lock();
                    lock.swap_in(&old, &[stub(0, 20), stub(30, 40)]);
                })
            };
            for addr in [10, 35] {
                match table.speculate(HostAddr(addr)) {
                    Speculated::Found(spec) => {
                        let r = spec.region;
                        assert!(r.start <= addr && addr < r.end, "{addr} outside its region");
                    }
                    Speculated::Busy(r, _) => assert!(Arc::ptr_eq(r, &old)),
                    Speculated::None => {
                        panic!("a fault on {addr}, which stays mapped, found nothing")
                    }
                }
            }
            writer.join().unwrap();
            assert!(!table.speculate(HostAddr(25)).is_found());
            assert!(table.speculate(HostAddr(5)).is_found());
        });
    }

    /// A successor that lands where a stale region still is waits in the
    /// pending list (faults there are busy) and is published when the
    /// stale region goes.
    #[test]
    fn loom_models_region_table_pending_successor() {
        loom::model(|| {
            let table = Arc::new(RegionTable::<Stub>::new());
            let stale = stub(100, 200);
            let moving = stub(0, 10);
            {
                let lock = table.lock();
                lock.insert(stale.clone());
                lock.insert(moving.clone());
            }
            let moved = stub(150, 160);
            let writer = {
                let (table, moving, moved, stale) =
                    (table.clone(), moving.clone(), moved.clone(), stale.clone());
                thread::spawn(move || {
                    table.lock().swap_in(&moving, &[moved]);
                    // The other pager's event, later: the stale region goes.
                    table.lock().swap_in(&stale, &[]);
                })
            };
            match table.speculate(HostAddr(155)) {
                Speculated::Found(spec) => {
                    assert!(Arc::ptr_eq(spec.region, &stale) || Arc::ptr_eq(spec.region, &moved));
                }
                Speculated::Busy(r, _) => {
                    assert!(Arc::ptr_eq(r, &stale) || Arc::ptr_eq(r, &moved));
                }
                Speculated::None => panic!("155 is mapped throughout"),
            }
            writer.join().unwrap();
            let published = match table.speculate(HostAddr(155)) {
                Speculated::Found(spec) => Arc::ptr_eq(spec.region, &moved),
                _ => false,
            };
            assert!(published, "the pending successor was not published");
        });
    }
}
