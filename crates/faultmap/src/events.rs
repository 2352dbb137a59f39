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
//!   region        [=========================)          one Region
//!   munmap                 [-------)
//!   afterwards    [========)       [========)          two successor Regions
//!                          (the application's)         (still served)
//!
//!   mremap        [=========================)  ──►  [=============)  to
//!   afterwards    (successors for any rest)          [PROT_NONE    )
//! ```
//!
//! 1. Under the region table's lock (as `munmap` holds `mmap_lock`), every
//!    region of this pager that overlaps the unmapped (or moved) range is
//!    **detached** (`TableLock::detach`): unpublished like a dropped
//!    mapping, removed from its object's list of mappings, and its range
//!    disowned, so nothing of faultmap touches that range again (no
//!    eviction or invalidation `MADV_DONTNEED`, no `munmap` at the
//!    [`crate::Mapping`]'s drop).
//! 2. The parts of the region the application left mapped are still
//!    registered mappings of the object, and they keep working as the
//!    kernel's would after a partial `munmap`: each is taken over by a
//!    **successor** region (same object, options and hints; fresh
//!    counters), published and listed on the object like any mapping. The
//!    [`crate::Mapping`]'s drop releases its successors (and theirs, after
//!    further unmaps), and nothing else.
//! 3. An **mremap destination** (which the kernel keeps registered with the
//!    userfaultfd) is unregistered and replaced by an anonymous `PROT_NONE`
//!    mapping: an access there is SIGSEGV, never wrong data (an
//!    unregistered memfd mapping would fill the object's cache with zero
//!    pages) and never a hang (a fault with no region). The placeholder is
//!    the application's: faultmap never unmaps it; `munmap` it to give the
//!    address space back. The moved [`crate::Mapping`] is not followed: its
//!    slice still names the old range, which is no longer mapped.
//!
//! # Reading events under the table's lock
//!
//! The kernel lets the application's `munmap` return as soon as the event
//! is *read*, not when it is handled. So a pager thread takes the region
//! table's lock *before* it reads the userfaultfd, handles the events of
//! the batch under it, and only then lets it go (and handles the batch's
//! faults). Whatever the application does after its `munmap` returns and
//! that goes through the table's lock (a mapping's drop, `Advice::DontNeed`,
//! and `Object::invalidate`, which takes the lock once as a barrier) sees
//! the region detached.
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
//!   may have it zapped by an eviction or invalidation of faultmap's. A
//!   `munmap`-then-`mmap` in one thread, or a `MAP_FIXED` replacement, is
//!   safe.
//! - A [`crate::Mapping`]'s counters (`Mapping::stats`) are its first
//!   region's: faults served by its successors count on the pager and the
//!   object, not on the mapping.
//! - `mremap` with `MREMAP_DONTUNMAP` leaves the old range mapped and
//!   registered; the region is detached and that range then raises faults
//!   with no region (a hang of the accessing thread). Growing a mapping in place raises no event at all:
//!   the grown part's faults find no region either.

use std::ops::Range;
use std::sync::Arc;

use crate::pager::Core;
use crate::space::TableLock;
use crate::sys::{self, UffdMsg};

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handles one non-fault message of the pager's userfaultfd. The caller
/// holds the region table's lock, and took it before it read the message
/// (see the module documentation).
pub(crate) fn handle(table: &TableLock<'_>, core: &Arc<Core>, msg: &UffdMsg) {
    match msg.event {
        sys::UFFD_EVENT_UNMAP => {
            detach_overlapping(table, core, msg.unmapped());
        }
        sys::UFFD_EVENT_REMAP => {
            let (from, to, len) = msg.remapped();
            detach_overlapping(table, core, from..from.saturating_add(len));
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
        // The parts the application left mapped are still registered
        // mappings of the object: a region of its own serves each. They
        // join the object's list of mappings *before* the region leaves
        // it, so that a write-back running meanwhile always finds a region
        // to write-protect a still-mapped page in (else a write through it
        // after the write-back would never fault, never be marked dirty).
        region.map.disown();
        let mut successors = Vec::new();
        for rest in [
            region.start()..gone.start.min(region.end()),
            gone.end.max(region.start())..region.end(),
        ] {
            if rest.is_empty() {
                continue;
            }
            match region.successor(rest.clone()) {
                Some(s) => {
                    s.object.add_mapping(&s);
                    successors.push(s);
                }
                None => placeholder(core, rest),
            }
        }
        table.detach(&region);
        for s in successors {
            table.insert(s.clone());
            lock(&region.successors).push(s);
        }
    }
}

/// Step 3: unregisters `range` and maps the `PROT_NONE` placeholder over
/// it (also the fallback for a remaining part that cannot be adopted).
fn placeholder(core: &Core, range: Range<usize>) {
    let len = range.end - range.start;
    let _ = sys::uffd_unregister(core.env().uffd, range.start, len);
    let _ = sys::replace_with_prot_none(range.start, len);
}
