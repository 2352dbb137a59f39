//! The fault path: from a userfaultfd message to mapped pages.
//!
//! A handler thread reads a page-fault message (MISSING: the page is not in
//! the object's memfd; MINOR: it is, but this mapping has no PTE for it) and
//! calls [`handle`], which runs these steps top to bottom:
//!
//! 1. **Find the region** that contains the address (lock-free snapshot,
//!    [`crate::space`]). None: the mapping is being dropped; wake the thread
//!    and let the kernel sort it out.
//! 2. **Compute the fault-around window** ([`crate::fault_around::window`]).
//! 3. **Look up the faulting page** in the page-state array, lock-free:
//!    - UPTODATE: a hit (`pgfault` only);
//!    - READING: another fault is reading it; register as a waiter and
//!      return: that reader wakes us (`fault_wait`);
//!    - ABSENT: a miss; go to 4.
//! 4. **Miss: read the window.** Claim every ABSENT page of the window
//!    (ABSENT → READING), the faulting page first, and read each contiguous
//!    run of claimed pages from the store in one request straight into the
//!    memfd's alias (`pgmajfault`, `io_count`, `io_bytes`). If a run fails,
//!    its pages go back to ABSENT and the faulting page alone is retried once
//!    (the kernel likewise ignores readahead errors and reads the faulting
//!    folio synchronously); if that fails too, the faulting page is poisoned
//!    so the access gets SIGBUS, never zeros (`io_errors`). Faults that waited
//!    for the pages are woken. The real readahead (seed 001) replaces this
//!    step in the next issue; it is the only place that decides what to read.
//! 5. **Map the window.** Pin every UPTODATE page of the window (lock-free:
//!    load, then CAS from the loaded value, see [`crate::page_state`]), and
//!    map the pinned pages as maximal runs with `UFFDIO_CONTINUE`: the run
//!    that contains the faulting page first, waking the thread, the others
//!    with `DONTWAKE`. Unpin. `EEXIST` (another fault mapped it), `EAGAIN`
//!    (the address space is changing) and `ENOENT` (the mapping is gone) are
//!    outcomes, not errors; if the faulting page was not woken by a
//!    successful call, it is woken explicitly.
//!
//! ```text
//!     window (order 4)   [ 16 pages, VA-aligned                ]
//!     page states         U U U . . U U R U U U U U U U U        U uptodate
//!                                   ^ fault                      . absent
//!     pinned runs         [---]     [-] [-----------------]      R reading
//!     CONTINUE order          2      1          3  (1 wakes the faulting thread)
//! ```
//!
//! # Deviation from the reference
//!
//! kernel-mechanisms.md §1(d) maps the faulting *page* first and every
//! neighbour with DONTWAKE. faultmap maps the faulting page's whole *run*
//! first, waking the thread when the call returns. On a fully cached window
//! that is one ioctl instead of three, and the kernel also returns from a
//! fault only after `filemap_map_pages` mapped the whole window: a thread
//! woken after its single page races the handler's mapping of its neighbours
//! and faults again on a page about to be mapped, which costs a second round
//! trip and inflates the fault count. Latency to the first byte grows by the
//! run's CONTINUE (0.07 µs per page, 36 µs at order 9).
//!
//! # Context
//!
//! Runs on a handler thread. Takes no lock on a hit; on a miss, only the
//! object's waiter list (taken only when a fault must wait for another's
//! read). Never panics on anything a store, the application or the kernel
//! can do.

use std::ops::Range;
use std::os::fd::OwnedFd;

use crate::fault_around;
use crate::object::ObjectCore;
use crate::page_state::State;
use crate::space::Region;
use crate::stats::{Counters, Stats};
use crate::sys::{self, ContinueResult, PAGE_SIZE, PTRS_PER_PTE};

/// What the fault path needs from its pager.
pub(crate) struct FaultEnv<'a> {
    pub(crate) uffd: &'a OwnedFd,
    pub(crate) regions: &'a crate::space::RegionTable,
    pub(crate) counters: &'a Counters,
}

/// A fault waiting for a read in flight: woken by the reader.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiter {
    /// The object page it waits for.
    pub(crate) page: u64,
    /// The faulting address, page-aligned.
    pub(crate) addr: usize,
}

/// Pages of a window: at most one PTE table.
struct PageSet([u64; PTRS_PER_PTE / 64]);

impl PageSet {
    fn new() -> Self {
        Self([0; PTRS_PER_PTE / 64])
    }
    fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    /// Maximal runs of members in `0..n`, as ranges of window-relative pages.
    fn runs(&self, n: usize) -> impl Iterator<Item = Range<usize>> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            while i < n && !self.contains(i) {
                i += 1;
            }
            if i >= n {
                return None;
            }
            let start = i;
            while i < n && self.contains(i) {
                i += 1;
            }
            Some(start..i)
        })
    }
}

/// How many times a fault re-examines its page before giving up and letting
/// the thread fault again (a page that keeps changing state under us).
const MAX_LOOKUPS: u32 = 8;

/// How many `EAGAIN`s a run tolerates before leaving its pages to a later
/// fault.
const MAX_EAGAIN: u32 = 3;

/// Handles one page-fault message.
pub(crate) fn handle(env: &FaultEnv<'_>, addr: usize) {
    let page_addr = addr & !(PAGE_SIZE - 1);
    let mut tally = Stats {
        pgfault: 1,
        ..Stats::default()
    };

    // 1. Find the region.
    env.counters.begin();
    let Some(region) = env.regions.lookup(page_addr) else {
        let _ = sys::uffd_wake(env.uffd, page_addr, PAGE_SIZE);
        env.counters.end(&tally);
        return;
    };
    let object = &*region.object;
    region.counters.begin();
    object.counters.begin();

    // 2. The fault-around window, in region pages.
    let page = ((page_addr - region.start()) / PAGE_SIZE) as u64;
    let slot = (page_addr / PAGE_SIZE) % PTRS_PER_PTE;
    let window = fault_around::window(slot, page, region.pages, region.order);

    let mut woken = false;
    for _ in 0..MAX_LOOKUPS {
        // 3. Look up the faulting page.
        let opage = region.first_page + page;
        match object.cache.states.load(opage).state() {
            State::UpToDate => {}
            State::Absent => {
                // 4. A miss: read the window's absent pages.
                let outcome = read_window(&region, &window, page, &mut tally);
                wake_waiters(env, object);
                match outcome {
                    ReadOutcome::Read => {}
                    ReadOutcome::Lost => continue,
                    ReadOutcome::Failed => {
                        let _ = sys::uffd_poison(env.uffd, page_addr, PAGE_SIZE);
                        woken = true;
                        break;
                    }
                }
            }
            State::Reading => {
                if wait_for_read(object, opage, page_addr) {
                    tally.fault_wait += 1;
                    woken = true;
                    break;
                }
                continue;
            }
            State::Evicting => {
                tally.lookup_retry += 1;
                std::thread::yield_now();
                continue;
            }
        }
        // 5. Map the window's ready pages.
        match map_window(env, &region, &window, page, &mut tally) {
            MapOutcome::Woken => woken = true,
            MapOutcome::NotWoken => {}
            MapOutcome::PageGone => continue,
            MapOutcome::RegionGone => woken = true,
        }
        break;
    }
    if !woken {
        let _ = sys::uffd_wake(env.uffd, page_addr, PAGE_SIZE);
    }
    region.counters.end(&tally);
    object.counters.end(&tally);
    env.counters.end(&tally);
}

enum ReadOutcome {
    /// The faulting page is UPTODATE now.
    Read,
    /// Another thread claimed the faulting page first: look again.
    Lost,
    /// The store failed for the faulting page.
    Failed,
}

/// Step 4: claims and reads the absent pages of `window`.
fn read_window(region: &Region, window: &Range<u64>, page: u64, tally: &mut Stats) -> ReadOutcome {
    let object = &*region.object;
    let states = &object.cache.states;
    let opage = |p: u64| region.first_page + p;
    // The faulting page first: if another thread won it, it is theirs to read.
    let Some(fault_state) = states.get_or_alloc(opage(page)) else {
        return ReadOutcome::Failed;
    };
    if !fault_state.begin_read() {
        return ReadOutcome::Lost;
    }
    let n = (window.end - window.start) as usize;
    let mut claimed = PageSet::new();
    for (i, p) in window.clone().enumerate() {
        let won = p == page
            || states
                .get_or_alloc(opage(p))
                .is_some_and(|s| s.begin_read());
        if won {
            claimed.insert(i);
        }
    }
    tally.pgmajfault += 1;
    let mut fault_read = false;
    for run in claimed.runs(n) {
        let first = opage(window.start + run.start as u64);
        let count = run.len() as u64;
        let has_fault = (first..first + count).contains(&opage(page));
        tally.io_count += 1;
        match object.cache.fill(&*object.store, first, count) {
            Ok(bytes) => {
                tally.io_bytes += bytes as u64;
                end_reads(object, first..first + count, true);
                fault_read |= has_fault;
            }
            Err(_) => {
                tally.io_errors += 1;
                end_reads(object, first..first + count, false);
            }
        }
    }
    if fault_read {
        return ReadOutcome::Read;
    }
    // The window's read failed: retry the faulting page alone, once.
    tally.io_retry_single += 1;
    if !fault_state.begin_read() {
        return ReadOutcome::Lost;
    }
    tally.io_count += 1;
    match object.cache.fill(&*object.store, opage(page), 1) {
        Ok(bytes) => {
            tally.io_bytes += bytes as u64;
            end_reads(object, opage(page)..opage(page) + 1, true);
            ReadOutcome::Read
        }
        Err(_) => {
            tally.io_errors += 1;
            end_reads(object, opage(page)..opage(page) + 1, false);
            ReadOutcome::Failed
        }
    }
}

/// Ends the reads of `pages` (object pages this thread claimed).
fn end_reads(object: &ObjectCore, pages: Range<u64>, ok: bool) {
    let mut waiters = false;
    for p in pages {
        if let Some(state) = object.cache.states.get(p) {
            let old = if ok {
                state.finish_read(false)
            } else {
                state.fail_read()
            };
            waiters |= old.has_waiters();
        }
    }
    if waiters {
        object
            .waiters_pending
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Registers the fault at `addr` as waiting for the read of object page
/// `opage`. Returns false if the read ended meanwhile (look again).
fn wait_for_read(object: &ObjectCore, opage: u64, addr: usize) -> bool {
    let Some(state) = object.cache.states.get(opage) else {
        return false;
    };
    // Listed before flagged: a reader that sees the flag finds the entry.
    let mut list = object.waiters.lock().unwrap_or_else(|e| e.into_inner());
    list.push(Waiter { page: opage, addr });
    match state.add_waiter() {
        Ok(()) => true,
        Err(_) => {
            list.pop();
            false
        }
    }
}

/// Wakes the faults that waited for pages this fault just read.
fn wake_waiters(env: &FaultEnv<'_>, object: &ObjectCore) {
    if !object
        .waiters_pending
        .swap(false, std::sync::atomic::Ordering::AcqRel)
    {
        return;
    }
    let woken: Vec<Waiter> = {
        let mut list = object.waiters.lock().unwrap_or_else(|e| e.into_inner());
        let (done, still): (Vec<Waiter>, Vec<Waiter>) = list
            .drain(..)
            .partition(|w| object.cache.states.load(w.page).state() != State::Reading);
        *list = still;
        done
    };
    for w in woken {
        // The woken thread faults again and finds the page cached (or absent
        // after a failed read, and reads it itself).
        let _ = sys::uffd_wake(env.uffd, w.addr, PAGE_SIZE);
    }
}

enum MapOutcome {
    /// The faulting page is mapped and its thread woken.
    Woken,
    /// The faulting page is mapped (or was already) but not woken by us.
    NotWoken,
    /// The faulting page left UPTODATE before it could be pinned.
    PageGone,
    /// The mapping is gone (`ENOENT`): nothing left to wake.
    RegionGone,
}

/// Step 5: pins the window's ready pages and maps them as runs.
fn map_window(
    env: &FaultEnv<'_>,
    region: &Region,
    window: &Range<u64>,
    page: u64,
    tally: &mut Stats,
) -> MapOutcome {
    let states = &region.object.cache.states;
    let n = (window.end - window.start) as usize;
    let fault_i = (page - window.start) as usize;

    // Pin: the lock-free lookup. A pinned page stays UPTODATE until unpinned.
    let mut pinned = PageSet::new();
    for (i, p) in window.clone().enumerate() {
        let Some(state) = states.get(region.first_page + p) else {
            continue;
        };
        let mut seen = state.load();
        for _ in 0..2 {
            // Fault-around skips the readahead marker; the faulting page is
            // mapped whatever it carries.
            if seen.state() != State::UpToDate || (seen.is_marker() && i != fault_i) {
                break;
            }
            match state.try_pin(seen) {
                Ok(()) => {
                    pinned.insert(i);
                    break;
                }
                Err(now) => {
                    tally.lookup_retry += 1;
                    seen = now;
                }
            }
        }
    }
    if !pinned.contains(fault_i) {
        unpin_all(region, window, &pinned);
        return MapOutcome::PageGone;
    }

    // Map: the faulting page's run first, waking its thread; then the rest.
    let fault_run = pinned
        .runs(n)
        .find(|r| r.contains(&fault_i))
        .unwrap_or(fault_i..fault_i + 1);
    let mut outcome = MapOutcome::NotWoken;
    let mut mapped = continue_run(
        env,
        region,
        window.start,
        fault_run.clone(),
        Some(fault_i),
        tally,
    );
    match mapped {
        RunResult::Mapped {
            woke_fault: true, ..
        } => outcome = MapOutcome::Woken,
        RunResult::RegionGone => {
            unpin_all(region, window, &pinned);
            return MapOutcome::RegionGone;
        }
        RunResult::Mapped { .. } => {}
    }
    let mut around = match mapped {
        RunResult::Mapped { pages, woke_fault } => pages - u64::from(woke_fault),
        RunResult::RegionGone => 0,
    };
    for run in pinned.runs(n).filter(|r| *r != fault_run) {
        mapped = continue_run(env, region, window.start, run, None, tally);
        match mapped {
            RunResult::Mapped { pages, .. } => around += pages,
            RunResult::RegionGone => break,
        }
    }
    tally.pgfault_around += around;
    unpin_all(region, window, &pinned);
    outcome
}

fn unpin_all(region: &Region, window: &Range<u64>, pinned: &PageSet) {
    let n = (window.end - window.start) as usize;
    for run in pinned.runs(n) {
        for i in run {
            if let Some(state) = region
                .object
                .cache
                .states
                .get(region.first_page + window.start + i as u64)
            {
                state.unpin();
            }
        }
    }
}

enum RunResult {
    /// `pages` pages were mapped; `woke_fault` if the faulting page was among
    /// them in a call that woke it.
    Mapped { pages: u64, woke_fault: bool },
    /// `ENOENT`: the mapping is gone.
    RegionGone,
}

/// `UFFDIO_CONTINUE` over one run of window-relative pages. With `fault`
/// (the faulting page's index), the calls wake; otherwise they are DONTWAKE.
fn continue_run(
    env: &FaultEnv<'_>,
    region: &Region,
    base: u64,
    run: Range<usize>,
    fault: Option<usize>,
    tally: &mut Stats,
) -> RunResult {
    let wake = fault.is_some();
    let mut cur = run.start;
    let mut pages = 0u64;
    let mut woke_fault = false;
    let mut eagain = 0;
    while cur < run.end {
        let addr = region.page_addr(base + cur as u64);
        let len = (run.end - cur) * PAGE_SIZE;
        tally.map_calls += 1;
        let done = match sys::uffd_continue(env.uffd, addr, len, wake) {
            ContinueResult::Done => run.end - cur,
            ContinueResult::Partial { bytes } => bytes / PAGE_SIZE,
            ContinueResult::Failed { errno } => {
                match errno {
                    libc::ENOENT => return RunResult::RegionGone,
                    libc::EAGAIN if eagain < MAX_EAGAIN => {
                        eagain += 1;
                        continue;
                    }
                    libc::EEXIST => tally.map_eexist += 1,
                    // EFAULT (not in the memfd), EAGAIN again, others: leave
                    // this page to a later fault.
                    _ => {}
                }
                cur += 1;
                continue;
            }
        };
        if fault.is_some_and(|f| (cur..cur + done).contains(&f)) {
            woke_fault = true;
        }
        pages += done as u64;
        cur += done;
    }
    RunResult::Mapped { pages, woke_fault }
}
