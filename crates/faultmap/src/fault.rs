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
//!    - READING: another fault is reading it; park on the object's wait
//!      list and return: that reader wakes us (`fault_wait`, [`crate::wait`]);
//!    - ABSENT: a miss; go to 4.
//! 4. **Miss: read the window.** Claim every ABSENT page of the window
//!    (ABSENT → READING), the faulting page first, and read each contiguous
//!    run of claimed pages from the store in one request straight into the
//!    memfd's alias (`pgmajfault`, `io_count`, `io_bytes`). If a run fails,
//!    its pages go back to ABSENT and the faulting page alone is retried once
//!    (the kernel likewise ignores readahead errors and reads the faulting
//!    folio synchronously); if that fails too, the faulting page is poisoned
//!    so the access gets SIGBUS, never zeros (`io_errors`). If any page read
//!    had waiters, the object's parked faults are woken. The real readahead
//!    (seed 001) replaces this step in the next issue; it is the only place
//!    that decides what to read.
//! 5. **Map the window.** Pin every UPTODATE page of the window (lock-free:
//!    load, then CAS from the loaded value, see [`crate::page_state`]), and
//!    map the pinned pages as maximal runs with `UFFDIO_CONTINUE`: the run
//!    that contains the faulting page first, waking the thread, the others
//!    with `DONTWAKE`. Unpin. If the faulting page was not woken by a
//!    successful call, it is woken explicitly: a fault never ends with its
//!    thread asleep unless a reader is known to wake it.
//!
//! ```text
//!     window (order 4)   [ 16 pages, VA-aligned                ]
//!     page states         U U U . . U U R U U U U U U U U        U uptodate
//!                                   ^ fault                      . absent
//!     pinned runs         [---]     [-] [-----------------]      R reading
//!     CONTINUE order          2      1          3  (1 wakes the faulting thread)
//! ```
//!
//! # What `UFFDIO_CONTINUE` can say
//!
//! - `EEXIST`: the page is already mapped (another fault's window, or a
//!   duplicate message). On the faulting page it means the fault is already
//!   resolved: wake it and stop; on a neighbour, skip that page.
//! - `ENOENT`: the range is not inside one registered VMA. Either the mapping
//!   is gone, or the application split it (`madvise`, `mprotect`, `mlock` on
//!   part of it): the run is retried one page at a time.
//! - `EAGAIN`: the address space is changing (fork, mremap events). faultmap
//!   requests no event features yet, so the kernel never says it; it is
//!   retried a few times, then the page is left to a later fault.
//! - `EFAULT`: the page is not in the memfd. Only the cache punches holes,
//!   and only in pages it moved out of UPTODATE first, so a pinned page
//!   never says it; it is skipped.
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
//! run's CONTINUE (0.2 µs per page on this machine, ~100 µs at order 9).
//!
//! # Context
//!
//! Runs on a handler thread. Takes no lock on a hit; on a miss, only the
//! object's wait list, and only when a page had waiters. Never panics on
//! anything a store, the application or the kernel can do.

use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::fault_around;
use crate::object::{ObjectCore, ObjectPage};
use crate::page_state::State;
use crate::space::Region;
use crate::stats::{Counters, Stats};
use crate::sys::{self, ContinueResult, PAGE_SIZE, PTRS_PER_PTE};

/// What the fault path needs from its pager.
pub(crate) struct FaultEnv<'a> {
    pub(crate) uffd: &'a Arc<OwnedFd>,
    pub(crate) regions: &'a crate::space::RegionTable,
    pub(crate) counters: &'a Counters,
}

/// A fault parked until a read in flight ends (see [`crate::wait`]).
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The faulting address, page-aligned.
    addr: usize,
    /// The userfaultfd the fault came from: an object may be mapped by
    /// several pagers.
    uffd: Arc<OwnedFd>,
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
        let opage = region.object_page(page);
        match object.cache.states.load(opage).state() {
            State::UpToDate => {}
            State::Absent => {
                // 4. A miss: read the window's absent pages.
                let (outcome, had_waiters) = read_window(&region, &window, page, &mut tally);
                if had_waiters {
                    wake_parked(object);
                }
                match outcome {
                    ReadOutcome::Read => {}
                    ReadOutcome::Lost => continue,
                    ReadOutcome::Failed => {
                        // SIGBUS for the access. If another fault mapped the
                        // page meanwhile (EEXIST), the thread needs a wake.
                        woken = sys::uffd_poison(env.uffd, page_addr, PAGE_SIZE).is_ok();
                        break;
                    }
                }
            }
            State::Reading => {
                let waiter = Waiter {
                    addr: page_addr,
                    uffd: env.uffd.clone(),
                };
                let parked = object
                    .cache
                    .states
                    .get(opage)
                    .is_some_and(|state| object.waiters.park(state, waiter));
                if parked {
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

/// Step 4: claims and reads the absent pages of `window`. Also returns
/// whether any page it read or failed had parked waiters.
fn read_window(
    region: &Region,
    window: &Range<u64>,
    page: u64,
    tally: &mut Stats,
) -> (ReadOutcome, bool) {
    let object = &*region.object;
    let states = &object.cache.states;
    // The faulting page first: if another thread won it, it is theirs to read.
    let Some(fault_state) = states.get_or_alloc(region.object_page(page)) else {
        return (ReadOutcome::Failed, false);
    };
    if !fault_state.begin_read() {
        return (ReadOutcome::Lost, false);
    }
    let n = (window.end - window.start) as usize;
    let mut claimed = PageSet::new();
    for (i, p) in window.clone().enumerate() {
        let won = p == page
            || states
                .get_or_alloc(region.object_page(p))
                .is_some_and(|s| s.begin_read());
        if won {
            claimed.insert(i);
        }
    }
    tally.pgmajfault += 1;
    let mut fault_read = false;
    let mut waiters = false;
    for run in claimed.runs(n) {
        let first = region.object_page(window.start + run.start as u64);
        let pages = first..first.add(run.len() as u64);
        let has_fault =
            (window.start + run.start as u64..window.start + run.end as u64).contains(&page);
        let ok = read_run(object, pages.clone(), tally);
        waiters |= end_reads(object, pages, ok);
        fault_read |= ok && has_fault;
    }
    if fault_read {
        return (ReadOutcome::Read, waiters);
    }
    // The window's read failed: retry the faulting page alone, once.
    tally.io_retry_single += 1;
    if !fault_state.begin_read() {
        return (ReadOutcome::Lost, waiters);
    }
    let opage = region.object_page(page);
    let ok = read_run(object, opage..opage.add(1), tally);
    waiters |= end_reads(object, opage..opage.add(1), ok);
    let outcome = if ok {
        ReadOutcome::Read
    } else {
        ReadOutcome::Failed
    };
    (outcome, waiters)
}

/// One store request for object pages `pages`, which this thread claimed.
fn read_run(object: &ObjectCore, pages: Range<ObjectPage>, tally: &mut Stats) -> bool {
    tally.io_count += 1;
    match object.cache.fill(&*object.store, pages) {
        Ok(bytes) => {
            tally.io_bytes += bytes as u64;
            true
        }
        Err(_) => {
            tally.io_errors += 1;
            false
        }
    }
}

/// Ends the reads of `pages` (object pages this thread claimed). Returns
/// whether any of them had parked waiters.
fn end_reads(object: &ObjectCore, pages: Range<ObjectPage>, ok: bool) -> bool {
    let mut waiters = false;
    for p in pages.start.0..pages.end.0 {
        if let Some(state) = object.cache.states.get(ObjectPage(p)) {
            let old = if ok {
                state.finish_read(false)
            } else {
                state.fail_read()
            };
            waiters |= old.has_waiters();
        }
    }
    waiters
}

/// Wakes every fault parked on the object: each faults again and finds its
/// page cached, absent (and reads it), or still being read (and parks again).
fn wake_parked(object: &ObjectCore) {
    for w in object.waiters.take_all() {
        let _ = sys::uffd_wake(&w.uffd, w.addr, PAGE_SIZE);
    }
}

enum MapOutcome {
    /// The faulting page is mapped and its thread woken.
    Woken,
    /// The faulting page is mapped (or was already) but not woken by us.
    NotWoken,
    /// The faulting page left UPTODATE before it could be pinned.
    PageGone,
}

/// Step 5: pins the window's ready pages and maps them as runs.
fn map_window(
    env: &FaultEnv<'_>,
    region: &Region,
    window: &Range<u64>,
    page: u64,
    tally: &mut Stats,
) -> MapOutcome {
    let n = (window.end - window.start) as usize;
    let fault_i = (page - window.start) as usize;
    let pinned = pin_ready(region, window, fault_i, tally);
    if !pinned.contains(fault_i) {
        unpin_all(region, window, &pinned);
        return MapOutcome::PageGone;
    }

    // The faulting page's run first, waking its thread; then the rest.
    let fault_run = pinned
        .runs(n)
        .find(|r| r.contains(&fault_i))
        .unwrap_or(fault_i..fault_i + 1);
    let first = continue_run(
        env,
        region,
        window.start,
        fault_run.clone(),
        Some(fault_i),
        tally,
    );
    let mut around = first.pages - u64::from(first.fault == FaultPage::Woken);
    if first.fault != FaultPage::AlreadyMapped {
        for run in pinned.runs(n).filter(|r| *r != fault_run) {
            around += continue_run(env, region, window.start, run, None, tally).pages;
        }
    }
    tally.pgfault_around += around;
    unpin_all(region, window, &pinned);
    if first.fault == FaultPage::Woken {
        MapOutcome::Woken
    } else {
        MapOutcome::NotWoken
    }
}

/// Pins the UPTODATE pages of `window` (window-relative index `fault_i` is
/// the faulting page). A pinned page stays UPTODATE until unpinned.
fn pin_ready(region: &Region, window: &Range<u64>, fault_i: usize, tally: &mut Stats) -> PageSet {
    let states = &region.object.cache.states;
    let mut pinned = PageSet::new();
    for (i, p) in window.clone().enumerate() {
        let Some(state) = states.get(region.object_page(p)) else {
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
    pinned
}

fn unpin_all(region: &Region, window: &Range<u64>, pinned: &PageSet) {
    let n = (window.end - window.start) as usize;
    for run in pinned.runs(n) {
        for i in run {
            let opage = region.object_page(window.start + i as u64);
            if let Some(state) = region.object.cache.states.get(opage) {
                state.unpin();
            }
        }
    }
}

/// What became of the faulting page in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultPage {
    /// Not in this run, or not mapped by it.
    NotMapped,
    /// Mapped by a call that woke its thread.
    Woken,
    /// Already mapped by someone else (`EEXIST`): the fault is resolved.
    AlreadyMapped,
}

struct RunResult {
    /// Pages this run mapped.
    pages: u64,
    fault: FaultPage,
}

/// `UFFDIO_CONTINUE` over one run of window-relative pages. With `fault`
/// (the faulting page's index, inside the run), the calls wake; otherwise
/// they are DONTWAKE.
fn continue_run(
    env: &FaultEnv<'_>,
    region: &Region,
    base: u64,
    run: Range<usize>,
    fault: Option<usize>,
    tally: &mut Stats,
) -> RunResult {
    let wake = fault.is_some();
    let mut out = RunResult {
        pages: 0,
        fault: FaultPage::NotMapped,
    };
    let mut cur = run.start;
    // After an ENOENT the run crosses a VMA boundary: go page by page.
    let mut one_by_one = false;
    let mut eagain = 0;
    while cur < run.end {
        let len = if one_by_one { 1 } else { run.end - cur };
        tally.map_calls += 1;
        let result = sys::uffd_continue(
            env.uffd,
            region.page_addr(base + cur as u64),
            len * PAGE_SIZE,
            wake,
        );
        let done = match result {
            ContinueResult::Done => len,
            ContinueResult::Partial { bytes } => bytes / PAGE_SIZE,
            ContinueResult::Failed { errno } => {
                match errno {
                    libc::EAGAIN if eagain < MAX_EAGAIN => {
                        eagain += 1;
                        continue;
                    }
                    libc::ENOENT if len > 1 => {
                        one_by_one = true;
                        continue;
                    }
                    libc::EEXIST => {
                        tally.map_eexist += 1;
                        if fault == Some(cur) {
                            out.fault = FaultPage::AlreadyMapped;
                            return out;
                        }
                    }
                    // ENOENT on one page (its VMA is gone), EFAULT, EAGAIN
                    // again: leave this page to a later fault.
                    _ => {}
                }
                cur += 1;
                continue;
            }
        };
        if fault.is_some_and(|f| (cur..cur + done).contains(&f)) {
            out.fault = FaultPage::Woken;
        }
        out.pages += done as u64;
        cur += done;
    }
    out
}
