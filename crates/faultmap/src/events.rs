//! The application unmaps or moves a mapping: userfaultfd UNMAP and REMAP
//! events.
//!
//! A [`crate::Mapping`] is an address range that faultmap serves, and the
//! region table (`crate::space`) says so until the mapping is dropped. An
//! application may still `munmap` or `mremap` (part of) that range itself.
//! Left alone, the table would go on claiming a range that is not
//! faultmap's: eviction and invalidation (`MADV_DONTNEED`) and the
//! mapping's drop (`munmap`) could hit memory the application mapped there
//! since, and a fault in an mremap destination (still registered with the
//! pager's userfaultfd) would reach the pager with no region and never be
//! resolved.
//!
//! So the pager asks for `UFFD_FEATURE_EVENT_UNMAP` and
//! `UFFD_FEATURE_EVENT_REMAP`. The kernel then queues an event on the
//! userfaultfd for every `munmap`/`mremap` that touches a registered range,
//! and blocks the caller until a pager thread has read it. Pager threads
//! read the userfaultfd in both deliveries (with signal delivery they poll
//! it beside the forwarding doorbell) and run [`handle`]:
//!
//! ```text
//!   region        [=========================)
//!   munmap                 [-------)
//!   afterwards    [PROT_NONE)       [PROT_NONE)      detached: no region
//!
//!   mremap        [=========================)  ──►  [=============)  to
//!   afterwards    [PROT_NONE  (rest, if any) )      [PROT_NONE    )
//! ```
//!
//! 1. Under the region table's lock (as `munmap` holds `mmap_lock`), every
//!    region of this pager that overlaps the unmapped (or moved) range is
//!    **detached** (`TableLock::detach`): unpublished like a dropped
//!    mapping, removed from its object's list of mappings, and its range
//!    disowned, so nothing of faultmap touches that range again and the
//!    [`crate::Mapping`]'s drop releases nothing (its object and counters
//!    stay readable).
//! 2. The parts of the region the application left mapped, and an mremap
//!    destination, are unregistered from the userfaultfd and replaced by an
//!    anonymous `PROT_NONE` mapping: an access there is SIGSEGV, never
//!    wrong data (an unregistered memfd mapping would fill the object's
//!    cache with zero pages) and never a hang. These placeholders are the
//!    application's: faultmap never unmaps them (it could not tell whether
//!    the application replaced them since); `munmap` them to give the
//!    address space back.
//!
//! faultmap's own unmaps raise no events: a mapping's drop unregisters its
//! range before it unmaps it, and `MADV_DONTNEED` raises only REMOVE events,
//! which faultmap does not request (it would then block on its own
//! eviction).
//!
//! # Known inaccuracies
//!
//! - The event is read after the application's `munmap` returned to the
//!   kernel but before the call returns to the application. Another
//!   application thread that maps new memory into the hole in that window
//!   may have it zapped by an eviction or invalidation of faultmap's (or
//!   replaced by the placeholder, for the rest of a partly unmapped
//!   region). A single-threaded `munmap`-then-`mmap` is safe.
//! - `mremap` with `MREMAP_DONTUNMAP` leaves the old range mapped and
//!   registered; the region is detached and that range then raises faults
//!   with no region. Growing a mapping in place raises no event at all:
//!   the grown part's faults find no region either.

use std::ops::Range;
use std::sync::Arc;

use crate::pager::Core;
use crate::space::{RegionTable, TableLock};
use crate::sys::{self, UffdMsg};

/// Handles one non-fault message of the pager's userfaultfd.
pub(crate) fn handle(core: &Arc<Core>, msg: &UffdMsg) {
    match msg.event {
        sys::UFFD_EVENT_UNMAP => {
            let gone = msg.unmapped();
            let table = RegionTable::get().lock();
            detach_overlapping(&table, core, gone);
        }
        sys::UFFD_EVENT_REMAP => {
            let (from, to, len) = msg.remapped();
            let table = RegionTable::get().lock();
            detach_overlapping(&table, core, from..from.saturating_add(len));
            // Only a registered range raises the event, and the kernel keeps
            // the destination registered with this userfaultfd.
            placeholder(core, to..to.saturating_add(len));
        }
        _ => {}
    }
}

/// Steps 1 and 2 for every region of `core` overlapping `gone`.
fn detach_overlapping(table: &TableLock<'_>, core: &Arc<Core>, gone: Range<usize>) {
    for region in table.overlapping(gone.clone()) {
        if !Arc::ptr_eq(&region.owner, core) {
            continue;
        }
        table.detach(&region);
        for rest in [
            region.start()..gone.start.min(region.end()),
            gone.end.max(region.start())..region.end(),
        ] {
            if !rest.is_empty() {
                placeholder(core, rest);
            }
        }
    }
}

/// Unregisters `range` and maps the `PROT_NONE` placeholder over it.
fn placeholder(core: &Core, range: Range<usize>) {
    let len = range.end - range.start;
    let _ = sys::uffd_unregister(core.env().uffd, range.start, len);
    let _ = sys::replace_with_prot_none(range.start, len);
}
