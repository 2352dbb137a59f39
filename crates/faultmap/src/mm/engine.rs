//! The paging engines: how a fault reaches faultmap and how a window of
//! cached pages gets mapped.
//!
//! Everything else (the memfd cache, the page-state word, readahead, the
//! budget, write-back, the statistics) is the same under both engines. An
//! engine is the answer to five questions, each one method here:
//!
//! | operation | [`PagingEngine::Userfaultfd`] | [`PagingEngine::Protect`], guard markers | [`PagingEngine::Protect`], `mprotect` |
//! |---|---|---|---|
//! | arm a new mapping ([`PagingEngine::arm`]) | `mmap` readable, `UFFDIO_REGISTER` `MISSING\|MINOR(\|WP)` | `mmap` readable, `MADV_GUARD_INSTALL` | `mmap` `PROT_NONE` |
//! | map a window of pinned pages ([`PagingEngine::map`]) | `UFFDIO_CONTINUE` (WP in a writable region) | `MADV_GUARD_REMOVE` | `mprotect(PROT_READ)` |
//! | let a page be written ([`PagingEngine::allow_write`]) | `UFFDIO_WRITEPROTECT` off | (read-only only) | `mprotect(PROT_READ\|PROT_WRITE)` |
//! | stop writes before write-back ([`PagingEngine::protect_write`]) | `UFFDIO_WRITEPROTECT` on | (read-only only) | `mprotect(PROT_READ)` |
//! | unmap before the hole is punched ([`PagingEngine::zap`]) | `MADV_DONTNEED` | `MADV_GUARD_INSTALL` | `mprotect(PROT_NONE)` |
//!
//! A forked child's or joiner's regions under the Protect engine are
//! served with [`PagingEngine::Child`]: *map* and *allow write* add
//! entries to a grant the guest applies itself, *zap* and *stop writes*
//! post a record the guest must acknowledge before the owner goes on
//! (`sys::revoke`).
//!
//! The Protect engine uses guard markers for read-only mappings where the
//! kernel has them on shared memfd mappings (Linux 6.15 and later,
//! [`sys::guard_regions_work`]): a marker is a PTE that faults (SIGSEGV,
//! `SEGV_MAPERR`), installed and removed with `madvise` under the address
//! space's read lock, and it never splits a memory area. Measured here, a
//! random page's `mprotect` and first touch cost 5.8 µs at 16,384 areas and
//! 8.0 µs at 65,536 (splits, then merges), its `MADV_GUARD_REMOVE` 0.6 µs.
//! Writable mappings (whose first write must fault, as a read-only page)
//! and older kernels use `mprotect`.
//!
//! and a fault arrives as a userfaultfd message or SIGBUS
//! (`crate::mm::signal`, `api::pager`'s handler threads) under the first,
//! as a SIGSEGV in the faulting thread (`crate::mm::signal` too) under the
//! second. Waking, poisoning and the userfaultfd's events exist only under
//! the first ([`PagingEngine::uffd`]): a Protect fault always ends by its
//! handler returning (the access runs again) or chaining to SIGBUS.
//!
//! # The Protect engine's invariant
//!
//! A page of a Protect mapping is accessible (`PROT_READ` or more) only
//! while its memfd page holds the object's bytes. A hole in a `MAP_SHARED`
//! memfd mapping is not an error to the kernel: an access to it would
//! allocate a zero page in the cache, and the application would read zeros
//! as data. So:
//!
//! - [`PagingEngine::map`] is called on pinned UPTODATE pages only (the
//!   fault path's step 4, `crate::mm::fault`): a pinned page cannot be
//!   evicted, and the `mprotect` returns before the pin is let go;
//! - eviction and invalidation move a page to EVICTING (which needs no
//!   pins) *before* [`PagingEngine::zap`] protects it `PROT_NONE` in every
//!   region of the object's rmap, and punch the hole only after every zap
//!   succeeded (`crate::mm::invalidate::drop_frozen`);
//! - a zap that the kernel refuses (`ENOMEM`: `vm.max_map_count`) protects
//!   the whole region instead ([`Protect::reset`]), which only merges
//!   areas and so cannot fail for that reason.
//!
//! `mprotect` takes the address space's lock for writing, so each call is
//! atomic with respect to the application's accesses and to the others.
//!
//! # Memory areas
//!
//! Every `mprotect` of part of an area splits it, and the kernel refuses
//! a split past `vm.max_map_count` (65,530 by default) with `ENOMEM`: a
//! random 4 KiB access pattern leaves two areas per isolated page. The
//! engine keeps an estimate of the areas each region adds (from its
//! mapped-page bits, which say whether a window's neighbours are
//! accessible: mapping a window with no accessible neighbour adds two,
//! next to one adds none, between two removes two; a first write adds two,
//! and write-back gives none back, so it errs high), and their sum for the
//! process. When the sum would pass half the limit (the other half is the
//! application's), a fault in a region that holds an eighth of the mark or
//! more first protects that whole region again (one area), and its pages
//! fault back in on their next touch, from the cache, merging as they
//! come: the kernel's way of reclaiming page tables without dropping the
//! page cache. A region holding less is not reset (that would free little,
//! and the fault that pays for it would come back at once). A `mprotect`
//! that the kernel refuses with `ENOMEM` anyway (the application's own
//! areas) resets the region and tries once more; if it still fails, the
//! access gets SIGBUS rather than faulting for ever. Counted in
//! [`AreaStats`].

use std::ops::Range;
use std::sync::Arc;

use crate::base::index::RegionPage;
use crate::cache::wait::Uffd;
use crate::mm::guest::ChildLink;
use crate::mm::space::Region;
use crate::sys::revoke::Entry;
// std's atomics, not `crate::sync`'s: these are process-wide statics (an
// estimate and counters), no part of a loom model, and loom's are not const.
use crate::sys::{self, ContinueResult, Prot};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A pager's paging engine.
pub(crate) enum PagingEngine {
    /// Faults arrive through this userfaultfd.
    Userfaultfd(Arc<Uffd>),
    /// Faults arrive as SIGSEGV on `PROT_NONE` pages.
    Protect(Protect),
    /// A forked child's, under the Protect engine (the core that serves
    /// it, `crate::mm::guest`): its faults arrive on its channel; mapping
    /// is a grant the child applies, unmapping a record it must
    /// acknowledge first (`sys::revoke`).
    Child(Arc<ChildLink>),
}

/// The Protect engine's state: the process-wide area estimate is in
/// statics ([`AREAS`]), since the limit is the process's.
pub(crate) struct Protect {
    /// Areas above which a fault protects its whole region again.
    mark: usize,
    /// Read-only mappings use guard markers rather than `mprotect`.
    guards: bool,
}

/// Memory areas the Protect engine's mappings add to the process, as
/// estimated (see the module documentation).
static AREAS: AtomicUsize = AtomicUsize::new(0);
/// Times a region was protected whole to give areas back.
static RESETS: AtomicU64 = AtomicU64::new(0);
/// The most areas estimated at once.
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The longest mapping armed with guard markers: 16 GiB, whose page tables
/// take 32 MiB. Longer ones use `mprotect`.
pub(crate) const GUARD_MAX_BYTES: usize = 16 << 30;

/// The Protect engine's memory areas, for the process (every pager).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AreaStats {
    /// Areas the engine's mappings add now (an estimate: the neighbours of
    /// a window are read without a lock).
    pub areas: u64,
    /// The most at once.
    pub peak: u64,
    /// The estimate at which a region is protected whole again: half of
    /// `vm.max_map_count`.
    pub mark: u64,
    /// Times a region was protected whole to stay under the mark (or
    /// because the kernel refused a split).
    pub resets: u64,
    /// Read-only mappings use guard markers (`MADV_GUARD_INSTALL`, Linux
    /// 6.15+), which add no areas; writable ones use `mprotect`.
    pub guard_regions: bool,
    /// Ranges forked children were asked to take back (before an
    /// eviction, or write-protect before a write-back) and acknowledged.
    pub child_revokes: u64,
    /// Ranges a child did not take back in time (stopped, or SIGURG
    /// blocked): their pages stayed cached, or dirty.
    pub child_revokes_failed: u64,
}

/// Ranges forked children took back, and ranges they did not in time.
pub(crate) static CHILD_REVOKES: AtomicU64 = AtomicU64::new(0);
pub(crate) static CHILD_REVOKES_FAILED: AtomicU64 = AtomicU64::new(0);

impl Protect {
    /// The engine's state; `guards`: use guard markers for read-only
    /// mappings if the kernel has them.
    pub(crate) fn new(guards: bool) -> Self {
        Self {
            mark: sys::max_map_count() / 2,
            guards: guards && sys::guard_regions_work(),
        }
    }

    /// Whether a mapping is armed with guard markers (else `mprotect`):
    /// read-only, of 4 KiB pages (the kernel has no markers for hugetlb),
    /// and at most [`GUARD_MAX_BYTES`] long (markers are PTEs: arming
    /// allocates every page table of the range, 2 MiB of them per GiB).
    fn guarded(&self, writable: bool, page_shift: u32, len: usize) -> bool {
        self.guards
            && !writable
            && page_shift == sys::PAGE_SIZE.trailing_zeros()
            && len <= GUARD_MAX_BYTES
    }

    /// The process's area statistics.
    pub(crate) fn stats(&self) -> AreaStats {
        AreaStats {
            areas: AREAS.load(Ordering::Relaxed) as u64,
            peak: PEAK.load(Ordering::Relaxed) as u64,
            mark: self.mark as u64,
            resets: RESETS.load(Ordering::Relaxed),
            guard_regions: self.guards,
            child_revokes: CHILD_REVOKES.load(Ordering::Relaxed),
            child_revokes_failed: CHILD_REVOKES_FAILED.load(Ordering::Relaxed),
        }
    }

    /// Protects the whole of `region` `PROT_NONE` and forgets its mapped
    /// pages: every page faults again on its next touch (from the cache).
    /// A whole region is one area, so this never needs a split.
    /// Async-signal-safe.
    pub(crate) fn reset(region: &Region) -> std::io::Result<()> {
        let result = sys::protect(region.start().get(), region.map.len(), Prot::None);
        if result.is_ok() {
            region
                .mapped
                .mark(RegionPage(0)..RegionPage(region.pages), false);
            let held = region.mapped.areas().swap(0, Ordering::Relaxed);
            saturating_sub(&AREAS, held);
            RESETS.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Forgets a region that is going away (its range is unmapped).
    pub(crate) fn forget(region: &Region) {
        let held = region.mapped.areas().swap(0, Ordering::Relaxed);
        saturating_sub(&AREAS, held);
    }
}

/// Adds `n` areas to `region`'s estimate and the process's; returns the
/// process's.
fn add_areas(region: &Region, n: usize) -> usize {
    region.mapped.areas().fetch_add(n, Ordering::Relaxed);
    let now = AREAS.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
    now
}

/// Takes `n` areas off `region`'s estimate and the process's.
fn sub_areas(region: &Region, n: usize) {
    // Only what the region holds: the process's sum stays the sum.
    let mut taken = 0;
    let _ = region
        .mapped
        .areas()
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
            taken = a.min(n);
            Some(a - taken)
        });
    saturating_sub(&AREAS, taken);
}

/// `counter -= n`, stopping at 0 (the estimate's races must not wrap it).
fn saturating_sub(counter: &AtomicUsize, n: usize) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
        Some(a.saturating_sub(n))
    });
}

/// Whether region page `p` (which may be out of the region) is mapped.
fn mapped(region: &Region, p: Option<u64>) -> bool {
    p.is_some_and(|p| p < region.pages && region.mapped.contains(RegionPage(p)))
}

impl PagingEngine {
    /// The userfaultfd, under the Userfaultfd engine.
    pub(crate) fn uffd(&self) -> Option<&Arc<Uffd>> {
        match self {
            PagingEngine::Userfaultfd(uffd) => Some(uffd),
            PagingEngine::Protect(_) | PagingEngine::Child(_) => None,
        }
    }

    /// The Protect engine's state, under it.
    pub(crate) fn protect(&self) -> Option<&Protect> {
        match self {
            PagingEngine::Protect(p) => Some(p),
            PagingEngine::Userfaultfd(_) | PagingEngine::Child(_) => None,
        }
    }

    /// Whether this serves a Protect guest (a forked child, a joiner).
    pub(crate) fn is_child(&self) -> bool {
        matches!(self, PagingEngine::Child(_))
    }

    /// Whether a page is reachable by its protection (Protect, and a
    /// Protect child): a page is made accessible by `map` and must be
    /// taken back by `zap` before its hole is punched, and a written page
    /// must be made writable again after each write-back.
    pub(crate) fn by_protection(&self) -> bool {
        !matches!(self, PagingEngine::Userfaultfd(_))
    }

    /// The public name of this engine.
    pub(crate) fn kind(&self) -> crate::base::config::Engine {
        match self {
            PagingEngine::Userfaultfd(_) => crate::base::config::Engine::Userfaultfd,
            PagingEngine::Protect(_) | PagingEngine::Child(_) => {
                crate::base::config::Engine::Protect
            }
        }
    }

    /// The protection a new mapping starts with.
    pub(crate) fn initial_prot(&self, writable: bool, page_shift: u32, len: usize) -> Prot {
        match self {
            PagingEngine::Userfaultfd(_) if writable => Prot::ReadWrite,
            PagingEngine::Userfaultfd(_) => Prot::Read,
            // Guarded: every page carries a marker (`arm`).
            PagingEngine::Protect(p) if p.guarded(writable, page_shift, len) => Prot::Read,
            PagingEngine::Protect(_) | PagingEngine::Child(_) => Prot::None,
        }
    }

    /// Arms the new mapping `[addr, addr + len)` (mapped with
    /// [`PagingEngine::initial_prot`]): under the Userfaultfd engine,
    /// registers it `MISSING | MINOR` (`| WP` if `writable`) and checks that
    /// every ioctl the fault path needs is allowed there (`Err(Some(name))`
    /// names a missing one; the range is left unregistered). Under Protect,
    /// installs guard markers over a guarded mapping; `PROT_NONE` is armed
    /// already.
    pub(crate) fn arm(
        &self,
        addr: usize,
        len: usize,
        writable: bool,
        page_shift: u32,
        fail_after_register: bool,
    ) -> Result<(), ArmError> {
        let uffd = match self {
            PagingEngine::Userfaultfd(uffd) => uffd,
            PagingEngine::Protect(p) if p.guarded(writable, page_shift, len) => {
                return sys::guard_install(addr, len).map_err(ArmError::Guard);
            }
            PagingEngine::Protect(_) | PagingEngine::Child(_) => return Ok(()),
        };
        use sys::{mode, range_ioctl};
        let modes = if writable {
            mode::MISSING | mode::MINOR | mode::WP
        } else {
            mode::MISSING | mode::MINOR
        };
        let ioctls = sys::uffd_register(uffd, addr, len, modes).map_err(ArmError::Register)?;
        let missing = [
            (range_ioctl::CONTINUE, "UFFDIO_CONTINUE", true),
            (range_ioctl::WAKE, "UFFDIO_WAKE", true),
            (range_ioctl::POISON, "UFFDIO_POISON", true),
            (range_ioctl::WRITEPROTECT, "UFFDIO_WRITEPROTECT", writable),
        ]
        .into_iter()
        .find(|&(bit, _, needed)| needed && (ioctls & bit == 0 || fail_after_register));
        if let Some((_, ioctl, _)) = missing {
            let _ = sys::uffd_unregister(uffd, addr, len);
            return Err(ArmError::MissingIoctl(ioctl));
        }
        Ok(())
    }

    /// Undoes [`PagingEngine::arm`] before the range is unmapped (so that
    /// the munmap raises no UNMAP event), and forgets its areas.
    pub(crate) fn disarm(&self, region: &Region) {
        match self {
            PagingEngine::Userfaultfd(uffd) => {
                let _ = sys::uffd_unregister(uffd, region.start().get(), region.map.len());
            }
            PagingEngine::Protect(p)
                if p.guarded(region.writable, region.page_shift, region.map.len()) => {}
            PagingEngine::Protect(_) => Protect::forget(region),
            PagingEngine::Child(_) => {}
        }
    }

    /// Maps `pages` of `region` (all pinned UPTODATE by the caller), whose
    /// first byte is `addr` and length `len`: `UFFDIO_CONTINUE` (waking the
    /// faulting thread if `wake`; write-protected in a writable region), or
    /// `mprotect(PROT_READ)`. Async-signal-safe.
    pub(crate) fn map(
        &self,
        region: &Region,
        pages: Range<RegionPage>,
        wake: bool,
    ) -> ContinueResult {
        let addr = region.addr_of(pages.start).get();
        let len = (pages.end.since(pages.start) as usize) << region.page_shift;
        let protect = match self {
            PagingEngine::Userfaultfd(uffd) => {
                return sys::uffd_continue(uffd, addr, len, wake, region.writable)
            }
            PagingEngine::Protect(p)
                if p.guarded(region.writable, region.page_shift, region.map.len()) =>
            {
                return match sys::guard_remove(addr, len) {
                    Ok(()) => ContinueResult::Done,
                    Err(e) => ContinueResult::Failed {
                        errno: e.raw_os_error().unwrap_or(libc::EINVAL),
                    },
                };
            }
            PagingEngine::Protect(p) => p,
            // Granted: the child applies it after the answer (the pins
            // are held while the grant's number is read).
            PagingEngine::Child(link) => {
                return match link.grant(Entry {
                    addr,
                    len,
                    prot: Prot::Read,
                }) {
                    true => ContinueResult::Done,
                    false => ContinueResult::Failed { errno: libc::E2BIG },
                };
            }
        };
        // The areas this adds, from the neighbours' bits (read before the
        // caller marks the run mapped): none if the run is mapped already.
        let delta = |region: &Region| -> isize {
            let run = pages.start.0..pages.end.0;
            if u64::from(region.mapped.count(run.clone())) == run.end - run.start {
                return 0;
            }
            let left = mapped(region, pages.start.0.checked_sub(1));
            let right = mapped(region, Some(pages.end.0));
            match (left, right) {
                (false, false) => 2,
                (true, true) => -2,
                _ => 0,
            }
        };
        // Past the mark, a region that holds a good share of the areas is
        // protected whole first: its pages fault back in from the cache
        // as they are touched, merging as they come. (Before this run is
        // mapped, so that this fault is resolved.)
        if delta(region) > 0
            && AREAS.load(Ordering::Relaxed) + 2 > protect.mark
            && region.mapped.areas().load(Ordering::Relaxed) >= protect.mark / 8
        {
            let _ = Protect::reset(region);
        }
        let change = delta(region);
        let mut result = sys::protect(addr, len, Prot::Read);
        if matches!(&result, Err(e) if e.raw_os_error() == Some(libc::ENOMEM)) {
            // Out of areas (the application's, or the estimate's error):
            // give this region's back and try once more.
            if Protect::reset(region).is_ok() {
                result = sys::protect(addr, len, Prot::Read);
            }
        }
        match result {
            Ok(()) => {
                match change {
                    2 => {
                        add_areas(region, 2);
                    }
                    -2 => sub_areas(region, 2),
                    _ => {}
                }
                ContinueResult::Done
            }
            Err(e) => ContinueResult::Failed {
                errno: e.raw_os_error().unwrap_or(libc::EINVAL),
            },
        }
    }

    /// Lets the mapped page(s) `[addr, addr + len)` of writable region
    /// `region` be written: its first write after mapping or write-back
    /// (`crate::mm::writeback`). Async-signal-safe.
    pub(crate) fn allow_write(
        &self,
        region: &Region,
        addr: usize,
        len: usize,
    ) -> std::io::Result<()> {
        match self {
            PagingEngine::Userfaultfd(uffd) => {
                let result = sys::uffd_writeprotect(uffd, addr, len, false, true);
                uffd.note_if_eagain(&result);
                result
            }
            PagingEngine::Protect(_) => {
                let result = sys::protect(addr, len, Prot::ReadWrite);
                match result {
                    // A writable page between readable ones: two more.
                    Ok(()) => {
                        add_areas(region, 2);
                        Ok(())
                    }
                    // Out of areas: give this region's back (the region
                    // goes inaccessible) and try once more; still out,
                    // the caller fails the access (SIGBUS).
                    Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
                        Protect::reset(region)?;
                        sys::protect(addr, len, Prot::ReadWrite)?;
                        add_areas(region, 2);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            PagingEngine::Child(link) => {
                let p = region.page_of(crate::base::index::HostAddr(addr));
                region.mapped.mark(p..p.add(1), true);
                link.note_writable(addr, len);
                if link.grant(Entry {
                    addr,
                    len,
                    prot: Prot::ReadWrite,
                }) {
                    Ok(())
                } else {
                    Err(std::io::Error::from_raw_os_error(libc::E2BIG))
                }
            }
        }
    }

    /// Stops writes to `[addr, addr + len)` of a writable region before
    /// write-back copies it (`crate::mm::writeback`, step F2): every page
    /// in it is cached (dirty, or being written back). Under the
    /// Userfaultfd engine this is `UFFDIO_WRITEPROTECT`, whose errors the
    /// caller sorts out; under Protect `mprotect(PROT_READ)`, safe over
    /// pages that were not accessible since they are all cached.
    ///
    /// A Protect child is asked to make read-only the pages of the range
    /// it was granted writable, and must acknowledge first.
    pub(crate) fn protect_write(&self, addr: usize, len: usize) -> std::io::Result<()> {
        match self {
            PagingEngine::Userfaultfd(uffd) => sys::uffd_writeprotect(uffd, addr, len, true, false),
            // Areas are given back only by resets and zaps: the estimate
            // errs high, never low.
            PagingEngine::Protect(_) => sys::protect(addr, len, Prot::Read),
            PagingEngine::Child(link) => link.protect_write(addr, len),
        }
    }

    /// Unmaps `pages` of `region` before their memfd pages are punched
    /// (they are EVICTING or being invalidated: no fault maps them
    /// meanwhile), and clears their mapped bits (first: a set bit for an
    /// unmapped page would keep fault-around from mapping it later). Under
    /// Protect an error means the range may still be accessible, and the
    /// caller must not punch it.
    pub(crate) fn zap(&self, region: &Region, pages: Range<RegionPage>) -> std::io::Result<()> {
        let addr = region.addr_of(pages.start).get();
        let len = (pages.end.since(pages.start) as usize) << region.page_shift;
        if let PagingEngine::Child(link) = self {
            return link.zap(region, pages);
        }
        let was_mapped = region.mapped.count(pages.start.0..pages.end.0) > 0;
        region.mapped.mark(pages.clone(), false);
        match self {
            // A forked child's range cannot be advised from here: the hole
            // punched after this unmaps the page from every process (a
            // sample unmap only misses the child's references).
            PagingEngine::Userfaultfd(_) if region.map.is_foreign() => Ok(()),
            PagingEngine::Userfaultfd(_) => sys::madvise_dontneed(addr, len),
            PagingEngine::Protect(p)
                if p.guarded(region.writable, region.page_shift, region.map.len()) =>
            {
                sys::guard_install(addr, len)
            }
            PagingEngine::Child(_) => Ok(()),
            PagingEngine::Protect(_) => {
                let left = mapped(region, pages.start.0.checked_sub(1));
                let right = mapped(region, Some(pages.end.0));
                match sys::protect(addr, len, Prot::None) {
                    Ok(()) => {
                        match (was_mapped, left, right) {
                            (false, ..) => {}
                            (true, false, false) => sub_areas(region, 2),
                            (true, true, true) => {
                                add_areas(region, 2);
                            }
                            _ => {}
                        }
                        Ok(())
                    }
                    // A split past `vm.max_map_count`: protect it all.
                    Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => Protect::reset(region),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// Why [`PagingEngine::arm`] failed.
pub(crate) enum ArmError {
    /// `UFFDIO_REGISTER` failed.
    Register(std::io::Error),
    /// `MADV_GUARD_INSTALL` failed.
    Guard(std::io::Error),
    /// The kernel does not allow this ioctl on the range.
    MissingIoctl(&'static str),
}
