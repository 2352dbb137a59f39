//! The application unmaps or moves a mapping: userfaultfd UNMAP and REMAP
//! events.
//!
//! A [`crate::Mapping`] is an address range that faultmap serves, and the
//! region table (`crate::mm::space`) says so until the mapping is dropped. An
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
//!                          (the application's)
//!
//!   mremap        [=========================)
//!   afterwards    [========)       [========)   and   [-------)  at the new
//!                                                      address: a third
//! ```
//!
//! Under the region table's lock (as `munmap` holds `mmap_lock`), for every
//! region of this pager that overlaps the unmapped (or moved) range:
//!
//! 1. **Successors.** The parts of the region the application left in
//!    place are still registered mappings of the object, and so is a part
//!    it moved (the kernel moves the VMA, its PTEs and its registration).
//!    Each keeps working as the kernel's mapping would: a successor region
//!    (same object, options, hints and mapped bits; fresh counters) takes
//!    it over, at its address, old or new.
//! 2. **The rmap first.** The successors join the object's list of
//!    mappings *before* the region leaves it, so a write-back running
//!    meanwhile always finds a region that write-protects every
//!    still-mapped page (else a write through it after that write-back
//!    would never fault, and never be written back).
//! 3. **One snapshot.** `TableLock::replace` unpublishes the region and
//!    publishes its successors in one snapshot, and marks the region dead
//!    (its sequence count odd for good). A fault on a part that stays
//!    mapped finds either the old region, aborts and retries under the
//!    lock (which this handler holds, so it then finds the successor), or
//!    the successor; never nothing, which with signal delivery would chain
//!    the SIGBUS to the previous handler and, by default, kill the
//!    process. A fault at an `mremap` destination may come before the
//!    successor there is published (the application's `mremap` returned
//!    when the event was read): finding nothing, the fault waits for the
//!    passages in progress (this handler's among them, which lasts until
//!    the successor is published) and looks again (`crate::mm::signal`,
//!    `crate::mm::fault::handle`). The region is disowned (its drop neither unregisters nor
//!    unmaps what is at its old range now) and forgotten by its object (no
//!    eviction or invalidation `MADV_DONTNEED` touches that range again).
//! 4. **A moved writable part** had its PTEs moved by the kernel before
//!    faultmap heard of the move, and a write-back that write-protected the
//!    old range in between missed them: the new range is write-protected
//!    again and its cached pages are taken as dirty
//!    (`writeback::adopt_moved`).
//!
//! A [`crate::Mapping`]'s drop releases its successors (and theirs, after
//! further unmaps): the moved parts are unregistered and unmapped at their
//! new address too, as the mapping's memory. Its settings (`advise`,
//! `set_fault_around_order`) reach the successors (`Region::live`).
//! faultmap never maps anything over an address the application may own:
//! there is no placeholder at an `mremap` destination, which keeps being
//! served.
//!
//! # Reading events: the passage and the settled lock
//!
//! The kernel lets the application's `munmap` return as soon as the event
//! is *read*, not when it is handled. Pager threads read the userfaultfd
//! for every fault (handler delivery), so reading must not take a lock
//! that map, unmap or another pager's threads hold; yet whoever zaps or
//! unmaps a region's range must never act between the read of an event
//! and its handling (the application may already have mapped new memory
//! into the hole). So:
//!
//! - a pager thread reads in a *passage* through the region table's events
//!   gate (`crate::sync::gate`: a per-CPU counter, no shared lock), holding
//!   its pager's `reading` mutex (one reader per userfaultfd, so events
//!   are handled in the order they were read, and a fault read after an
//!   event is handled after it); it handles the events it read under the
//!   table's lock, then ends the passage, then handles the faults it read;
//! - a mapping's drop, `Advice::DontNeed`, an eviction pass and
//!   `Object::invalidate` take the *settled* lock
//!   (`RegionTable::settled`): they close the gate (every passage in
//!   progress ends first, with its events handled, and no new one begins),
//!   then take the table's lock. Whatever the application does after its
//!   `munmap` returns sees the region detached, and no `munmap` of a
//!   registered range returns while they hold it;
//! - a fault that finds no region (an `mremap` destination whose REMAP
//!   event another thread is handling) waits for the passages in progress
//!   (the settled lock) and looks again.
//!
//! `Pager::map` takes the table's lock alone, and lets it go only to wait
//! while a region is still published over the range the kernel gave it
//! (its unmap event not handled yet: see "Known inaccuracies"); a change
//! of a region's options and the classic fault path take the lock alone
//! too: none of them stops faults from being read.
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
//!   `Pager::map` (of any pager) that gets the hole waits until the event
//!   is handled and the stale region is gone (at most 10 s, then
//!   `EBUSY`), so a fault on the new mapping never finds the stale region.
//!   But if that stale region's [`crate::Mapping`] is dropped meanwhile,
//!   before its event is read, the drop unmaps its range, which is the
//!   waiting map's by then. A `munmap`-then-`mmap` (or `Pager::map`) in
//!   one thread, or a `MAP_FIXED` replacement, is safe.
//! - A successor waiting to be published (an `mremap` destination still
//!   covered by another pager's stale region) is not seen by the UNMAP
//!   event of its own range: unmapped before it is published, it is
//!   published later anyway and stays until its mapping is dropped; a
//!   `Pager::map` that gets that range fails with `EBUSY` after its wait.
//! - A [`crate::Mapping`]'s counters (`Mapping::stats`) are its first
//!   region's: faults served by its successors count on the pager and the
//!   object, not on the mapping.
//! - The moved [`crate::Mapping`]'s slice still names the old range, which
//!   is no longer mapped: the application reaches the moved pages through
//!   the address `mremap` returned.
//! - `mremap` with `MREMAP_DONTUNMAP` leaves the old range mapped and
//!   registered; the region is replaced by the moved part's successor and
//!   the old range then raises faults with no region. Growing a mapping
//!   (in place or moved) raises no event for the grown part, whose faults
//!   find no region either: with signal delivery the SIGBUS goes to the
//!   previous handler (by default the process dies of SIGBUS); with
//!   handler delivery the faulting thread is woken to retry, and retries
//!   until the range goes.

use std::ops::Range;
use std::sync::Arc;

use crate::base::index::HostAddr;
use crate::mm::pager_core::Core;
use crate::mm::space::{Region, TableLock};
use crate::mm::writeback;
use crate::sys::{self, UffdMsg};

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Handles one non-fault message of the pager's userfaultfd. The caller
/// holds the region table's lock, and read the message in a passage that
/// lasts until it is handled (see the module documentation).
pub(crate) fn handle(table: &TableLock<'_>, core: &Arc<Core>, msg: &UffdMsg) {
    match msg.event {
        sys::UFFD_EVENT_UNMAP => {
            let gone = msg.unmapped();
            let gone = HostAddr(gone.start)..HostAddr(gone.end);
            for region in ours_overlapping(table, core, gone.clone()) {
                split(table, &region, gone.clone(), None);
            }
        }
        sys::UFFD_EVENT_REMAP => {
            let (from, to, len) = msg.remapped();
            let moved = HostAddr(from)..HostAddr(from.saturating_add(len));
            for region in ours_overlapping(table, core, moved.clone()) {
                split(table, &region, moved.clone(), Some(HostAddr(to)));
            }
        }
        _ => {}
    }
}

/// The regions of `core` that overlap `range`.
fn ours_overlapping(
    table: &TableLock<'_>,
    core: &Arc<Core>,
    range: Range<HostAddr>,
) -> Vec<Arc<Region>> {
    let mut regions = table.overlapping(range);
    regions.retain(|r| Arc::ptr_eq(&r.owner, core));
    regions
}

/// Steps 1 to 3 for `region`, whose part `gone` the application unmapped
/// (`moved_to: None`) or moved to `moved_to` (the new address of
/// `gone.start`).
fn split(
    table: &TableLock<'_>,
    region: &Arc<Region>,
    gone: Range<HostAddr>,
    moved_to: Option<HostAddr>,
) {
    let cut = gone.start.max(region.start())..gone.end.min(region.end());
    // 1. The successors: the parts left in place, and the moved part at
    //    its new address.
    let mut parts = vec![
        (region.start()..cut.start, region.start()),
        (cut.end..region.end(), cut.end),
    ];
    let moved = moved_to.map(|to| to.add(cut.start.since(gone.start)));
    if let Some(at) = moved {
        parts.push((cut.clone(), at));
    }
    let mut successors = Vec::new();
    let mut moved_successor = None;
    for (part, at) in parts {
        let Some(s) = region.successor(part, at) else {
            continue;
        };
        // 2. Each joins the object's rmap *before* the region leaves it:
        //    a write-back running meanwhile always finds a region that
        //    write-protects a still-mapped page (else a write through it
        //    after the write-back would never fault, never be marked
        //    dirty).
        s.object.add_mapping(&s);
        if Some(at) == moved {
            moved_successor = Some(s.clone());
        }
        successors.push(s);
    }
    // 3. One snapshot replaces the region with its successors.
    table.replace(region, &successors);
    // 4. A moved writable part: the kernel moved its PTEs before we heard
    //    of it, and a write-back that write-protected the old range in
    //    between missed them. Protect the new range, then take every
    //    cached page of it as dirty (see `writeback::adopt_moved`).
    if let Some(s) = moved_successor.filter(|s| s.writable) {
        writeback::adopt_moved(&s);
    }
    lock(&region.successors).extend(successors);
}
