//! Invalidation: dropping a range of an object's pages from its cache while
//! other threads may be faulting on them (`invalidate_inode_pages2_range`).
//!
//! The removal side of the lock-free cache (`crate::cache::page_state`). For each
//! page of the range, in batches of at most one PTE table:
//!
//! 1. **Freeze.** `begin_evict`: UPTODATE with no pins, clean → EVICTING,
//!    one CAS from the loaded word. A dirty page is written back first
//!    (`crate::mm::writeback`) and frozen in a later pass. A pinned page (a fault is mapping it), or one
//!    being read, is left for a later pass of the batch, after the pages
//!    frozen now are dropped (so no frozen page waits on another page's
//!    read, as the kernel handles one folio at a time); an ABSENT page has
//!    nothing to drop. From here no fault can pin the page (pins need
//!    UPTODATE), so none can map it again.
//! 2. **Unmap everywhere.** Every region that maps the object and overlaps
//!    the batch (the object's reverse map, `crate::mm::rmap`: only the regions
//!    that overlap each run) drops its PTEs there (`MADV_DONTNEED`) after
//!    clearing its mapped bits.
//! 3. **Punch.** The pages leave the memfd (`FALLOC_FL_PUNCH_HOLE`).
//! 4. **Release.** `finish_evict`: EVICTING → ABSENT, uncharged from the
//!    budget. The next touch of a page is a miss that reads it from the
//!    store again (a new read, not a refault: the page's shadow is
//!    forgotten).
//!
//! The CLOCK hand (`crate::mm::evict`) evicts with steps 2 to 4 too.
//!
//! A fault that meets an EVICTING page counts a `lookup_retry` and looks
//! again; it never maps a page between steps 2 and 4, because it cannot
//! pin one. Invariant 2 of `crate::cache::page_state` (a pinned page stays
//! UPTODATE and in the memfd) holds throughout: step 1 needs zero pins.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::base::index::ObjectPage;
use crate::cache::page_state::State;
use crate::mm::object::ObjectCore;
use crate::mm::space::Region;
use crate::sys::{self, PTRS_PER_PTE};

/// Pages frozen, unmapped and punched together.
const BATCH: u64 = PTRS_PER_PTE as u64;

/// The longest an invalidation waits for the busy pages of one batch
/// (pinned by a fault, being read) before it gives up on them. Reads that
/// outlive the store timeout are given up at once, once the watchdog has
/// marked them STALLED; this bound is for a read no watchdog watches.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Drops object pages `pages` from `object`'s cache and from every mapping
/// of it. Returns how many cached pages were dropped.
pub(crate) fn invalidate(object: &ObjectCore, pages: Range<ObjectPage>) -> std::io::Result<u64> {
    drop_range(object, pages, false)
}

/// [`invalidate`] for pages beyond an object's new end (truncation): dirty
/// pages are dropped, not written back (the kernel's `truncate_pagecache`
/// discards them; writing them would extend the file again).
pub(crate) fn truncate(object: &ObjectCore, pages: Range<ObjectPage>) -> std::io::Result<u64> {
    drop_range(object, pages, true)
}

fn drop_range(
    object: &ObjectCore,
    pages: Range<ObjectPage>,
    discard: bool,
) -> std::io::Result<u64> {
    let end = pages.end.0.min(object.cache.states.pages());
    object.shadows.forget(pages.start.0..end);
    let mut dropped = 0;
    let mut stalled = None;
    let mut start = pages.start.0;
    while start < end {
        let batch = start..end.min(start + BATCH);
        match invalidate_batch(object, batch.clone(), discard) {
            Ok(n) => dropped += n,
            // Pages of a hung read: the other batches are still dropped.
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                stalled.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
        start = batch.end;
    }
    stalled.map_or(Ok(dropped), Err)
}

/// Invalidates a batch: freezes what can be frozen at once and drops it,
/// then comes back for the pages that were pinned or being read. A page is
/// never kept frozen while the batch waits for another page.
fn invalidate_batch(object: &ObjectCore, pages: Range<u64>, discard: bool) -> std::io::Result<u64> {
    let mut pending: Vec<u64> = pages.collect();
    let mut dropped = 0;
    let mut waits = 0u32;
    let mut stalled = 0u64;
    let started = std::time::Instant::now();
    while !pending.is_empty() {
        let mut frozen = Vec::new();
        pending.retain(|&p| match freeze(object, ObjectPage(p)) {
            Freeze::Frozen => {
                frozen.push(p);
                false
            }
            Freeze::Gone => false,
            Freeze::Busy => {
                // A read that outlived the store timeout (the watchdog
                // marked it STALLED) may never end: not waited for.
                let w = object.cache.states.load(ObjectPage(p));
                if w.state() == State::Reading && w.is_stalled() {
                    stalled += 1;
                    false
                } else {
                    true
                }
            }
        });
        dropped += drop_frozen(object, &mut frozen)?;
        // Dirty pages are written back first, as `invalidate_inode_pages2`
        // launders them: their data must not be lost. A store that cannot
        // take them ends the invalidation (the pages stay cached, dirty).
        let dirty = dirty_of(object, &pending);
        if discard {
            let mut n = 0;
            for &p in &dirty {
                if let Some(state) = object.cache.states.get(ObjectPage(p)) {
                    n += u64::from(state.discard_dirty());
                }
            }
            let _ = object.wb.dirty_pages.fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |c| Some(c.saturating_sub(n)),
            );
        } else {
            for run in runs_of(&dirty) {
                crate::mm::writeback::write_back(object, run)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
            }
        }
        if !pending.is_empty() {
            // Pinned (a fault is mapping it), being read, or another
            // invalidation's: wait, briefly at first; but not for ever: a
            // read that no watchdog marks STALLED (its pagers are gone)
            // may hang too.
            if started.elapsed() > MAX_WAIT {
                stalled += pending.len() as u64;
                break;
            }
            waits += 1;
            if waits < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    if stalled > 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "{stalled} pages are being read by a store call that has not returned; \
                 they were not dropped"
            ),
        ));
    }
    Ok(dropped)
}

/// The pages of `pending` that are dirty or being written back.
fn dirty_of(object: &ObjectCore, pending: &[u64]) -> Vec<u64> {
    pending
        .iter()
        .copied()
        .filter(|&p| {
            let w = object.cache.states.load(ObjectPage(p));
            w.state() == State::UpToDate && (w.is_dirty() || w.is_writeback())
        })
        .collect()
}

/// Steps 2 to 4 for frozen pages (sorted): unmapped from every region that
/// maps them, punched, released ABSENT and uncharged. A run that a Protect
/// mapping could not be made to stop reaching (its zap failed: the kernel
/// refused the `madvise` or `mprotect`) is not punched and not released:
/// its pages go back to UPTODATE, still charged, and leave `frozen`, which
/// keeps the pages that left. Returns how many did.
pub(crate) fn drop_frozen(object: &ObjectCore, frozen: &mut Vec<u64>) -> std::io::Result<u64> {
    // Protect guests first (nothing left to do if the caller did it).
    revoke_from_guests(object, frozen);
    if frozen.is_empty() {
        return Ok(0);
    }
    let runs = runs_of(frozen);
    // 2. Unmap from every mapping of the object over the run; 3. punch.
    let mut result = Ok(());
    let mut kept: Vec<std::ops::Range<u64>> = Vec::new();
    for run in &runs {
        let pages = ObjectPage::range(run.clone());
        let mut reachable = false;
        for region in &object.rmap.overlapping(pages.clone()) {
            if let Err(e) = zap(region, pages.clone()) {
                reachable |= region.owner.engine.by_protection();
                result = Err(e);
            }
        }
        if reachable {
            // A Protect mapping may still reach these pages: a hole there
            // would read as zeros, and a later read would write the page
            // under it. They stay cached.
            kept.push(run.clone());
            continue;
        }
        let offset = object.cache.offset(ObjectPage(run.start));
        let len = object.cache.bytes(run.end - run.start);
        if let Err(e) = sys::punch_hole(object.cache.memfd(), offset, len) {
            result = Err(e);
        }
    }
    // 4. Release, whatever failed but a zap: a page left EVICTING would
    //    block every fault on it for good. (A failed punch leaves stale
    //    bytes in the memfd that the next read overwrites before anyone
    //    maps them.)
    let is_kept = |p: u64| kept.iter().any(|r| r.contains(&p));
    for &p in frozen.iter() {
        if let Some(state) = object.cache.states.get(ObjectPage(p)) {
            if is_kept(p) {
                state.cancel_evict();
            } else {
                state.finish_evict();
            }
        }
    }
    frozen.retain(|&p| !is_kept(p));
    object.budget.uncharge(object, frozen.len() as u64);
    result.map(|()| frozen.len() as u64)
}

/// Takes frozen pages (sorted) back from the Protect guests (forked
/// children, joiners) that may reach them (`crate::sys::revoke`). A page a
/// guest did not give back in time goes back to UPTODATE, still charged,
/// and leaves `frozen`; the rest of its run is dropped as usual. Needs no
/// lock (a guest's regions are foreign: nothing here changes this
/// process's address space), so the evictor calls it before it takes the
/// region table's settled lock, and a guest's slow answer holds up no
/// mapping, unmapping or fault of this process's.
pub(crate) fn revoke_from_guests(object: &ObjectCore, frozen: &mut Vec<u64>) {
    if frozen.is_empty() {
        return;
    }
    let mut kept: Vec<u64> = Vec::new();
    for run in runs_of(frozen) {
        let pages = ObjectPage::range(run.clone());
        for region in &object.rmap.overlapping(pages.clone()) {
            if !region.owner.engine.is_child() || zap(region, pages.clone()).is_ok() {
                continue;
            }
            // The pages whose bits the failed zap set again.
            kept.extend(run.clone().filter(|&p| {
                region
                    .region_pages(ObjectPage::range(p..p + 1))
                    .is_some_and(|rp| region.mapped.contains(rp.start))
            }));
        }
    }
    if kept.is_empty() {
        return;
    }
    kept.sort_unstable();
    kept.dedup();
    for &p in &kept {
        if let Some(state) = object.cache.states.get(ObjectPage(p)) {
            state.cancel_evict();
        }
    }
    frozen.retain(|p| kept.binary_search(p).is_err());
}

enum Freeze {
    /// This call moved the page to EVICTING.
    Frozen,
    /// Not cached: nothing to drop.
    Gone,
    /// Pinned, being read, or being evicted by someone else: try later.
    Busy,
}

/// Moves one page to EVICTING if it is cached and nobody uses it.
fn freeze(object: &ObjectCore, page: ObjectPage) -> Freeze {
    let Some(state) = object.cache.states.get(page) else {
        return Freeze::Gone;
    };
    let seen = state.load();
    match seen.state() {
        State::Absent => Freeze::Gone,
        State::UpToDate if state.begin_evict_seen(seen) => {
            if seen.is_active() {
                object.budget.deactivated(object, 1);
            }
            Freeze::Frozen
        }
        State::UpToDate | State::Reading | State::Evicting => Freeze::Busy,
    }
}

/// Unmaps object pages `pages` from `region`, if it maps any of them
/// (`PagingEngine::zap`). An error under the Protect engine means the
/// pages may still be accessible there: the caller must not punch them.
pub(crate) fn zap(region: &Arc<Region>, pages: Range<ObjectPage>) -> std::io::Result<()> {
    // A range the application unmapped is not faultmap's any more
    // (`crate::mm::events`).
    if region.map.is_disowned() {
        return Ok(());
    }
    let Some(pages) = region.region_pages(pages) else {
        return Ok(());
    };
    region.owner.engine.zap(region, pages)
}

/// Sorted pages as maximal runs.
pub(crate) fn runs_of(pages: &[u64]) -> Vec<Range<u64>> {
    let mut runs: Vec<Range<u64>> = Vec::new();
    for &p in pages {
        match runs.last_mut() {
            Some(r) if r.end == p => r.end = p + 1,
            _ => runs.push(p..p + 1),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::runs_of;

    #[test]
    fn runs_are_maximal() {
        assert_eq!(runs_of(&[]), vec![]);
        assert_eq!(runs_of(&[3, 4, 5, 9, 11, 12]), vec![3..6, 9..10, 11..13]);
    }
}
