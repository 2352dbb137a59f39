//! The fault path: from a fault to mapped pages.
//!
//! A fault arrives as a userfaultfd message read by a handler thread
//! (`Delivery::Handler`; MISSING: the page is not in the object's memfd;
//! MINOR: it is, but this mapping has no PTE for it), or as a SIGBUS in the
//! faulting thread (`Delivery::Signal`, [`crate::mm::signal`]), whose handler
//! runs [`fast`] (a plain hit: steps 2 and 4 only) and forwards anything
//! else to a pager thread. [`handle`] runs these steps top to bottom:
//!
//! 1. **Find the region** that contains the address ([`crate::mm::space`]):
//!    speculatively, in an SRCU read section, with the region's sequence
//!    count read now and checked again right before step 4 maps anything;
//!    if the region was changing, or changed meanwhile (`spf_abort`), or
//!    was not found (`spf_fallback`), the steps run again under the
//!    table's lock (the classic path), carrying over what the first
//!    attempt did (its read, its hit bookkeeping). No region: the mapping
//!    is being dropped; let the thread go and the kernel sort it out.
//! 2. **Compute the fault-around window** ([`crate::policy::fault_around::window`]).
//! 3. **Look up the faulting page** in the page-state array, lock-free:
//!    - UPTODATE: a hit. The readahead bookkeeping of a hit
//!      (`do_async_mmap_readahead`): `mmap_miss` is paid down, and if the
//!      page carries the readahead marker and this fault clears it, the
//!      next window is submitted to the I/O threads (async readahead).
//!    - ABSENT: a miss (`pgmajfault`). The readahead policy
//!      ([`crate::policy::readahead::on_miss`]) picks the window; its absent pages
//!      are claimed (ABSENT → READING) and split into store requests of at
//!      most the store's `io_pages`; the request holding the faulting page
//!      goes to the I/O threads' sync queue, the rest to the async queue
//!      ([`crate::mm::io`]). The fault then parks like any other.
//!    - READING: park on the object's wait list ([`crate::cache::wait`]) and
//!      return; the I/O thread that ends the read wakes the thread, which
//!      faults again and finds the page cached (`fault_wait` when the read
//!      was someone else's). A handler thread never blocks on a store.
//!    - ABSENT after a failed read (FAILED): the kernel ignores readahead
//!      errors and reads the faulting page alone; so does this path
//!      (`io_retry_single`), and if that read fails too, the I/O thread
//!      poisons the waiting faults (SIGBUS, never zeros).
//!    - READING and STALLED: the read outlived the store timeout
//!      (`crate::mm::errors`): SIGBUS at once, without parking.
//!    - ABSENT wholly beyond the end of an object whose store shrank
//!      (`crate::mm::errors`): SIGBUS at once, as beyond a kernel file's EOF.
//! 4. **Map the window.** Pin every UPTODATE page of the window (lock-free:
//!    load, then CAS from the loaded value, see [`crate::cache::page_state`]), and
//!    map the pinned pages as maximal runs with `UFFDIO_CONTINUE`: the run
//!    that contains the faulting page first, waking the thread, the others
//!    with `DONTWAKE`. A page carrying the readahead marker is skipped
//!    unless it is the faulting page, so that touching it faults. Unpin.
//!    If the faulting page was not woken by a successful call, it is woken
//!    explicitly: a fault never ends with its thread asleep unless it is
//!    parked.
//!
//! ```text
//!     window (order 4)   [ 16 pages, VA-aligned                ]
//!     page states         U U U . . U U R U M U U U U U U        U uptodate
//!                                   ^ fault                      . absent
//!     pinned runs         [---]     [-] [-]   [-----------]      R reading
//!     CONTINUE order          2      1   3          4            M marker
//!                                    (1 wakes the faulting thread)
//! ```
//!
//! # Writable regions
//!
//! In a writable region every `UFFDIO_CONTINUE` maps write-protected
//! (`UFFDIO_CONTINUE_MODE_WP`), so the first write to a page after it was
//! mapped (or written back) raises a write-protect fault. With handler
//! delivery the message says so (`UFFD_PAGEFAULT_FLAG_WP`: [`handle_wp`]);
//! with signal delivery a fault whose page is already mapped (`EEXIST` on
//! the faulting page) is taken as one if the access may be a write (the
//! page-fault error code in the signal frame says so on x86-64:
//! `sys::sigbus_may_write`; elsewhere every access may be). Either
//! way [`write_fault`] pins the page, unprotects it, *then* sets DIRTY
//! (the order `crate::mm::writeback` proves correct), and lets the thread go.
//!
//! # What `UFFDIO_CONTINUE` can say
//!
//! - `EEXIST`: the page is already mapped (another fault's window, or a
//!   duplicate message). On the faulting page it means the fault is already
//!   resolved: wake it and stop; on a neighbour, skip that page.
//! - `ENOENT`: the range is not inside one registered VMA. Either the mapping
//!   is gone, or the application split it (`madvise`, `mprotect`, `mlock` on
//!   part of it): the run is retried one page at a time.
//! - `EAGAIN`: the address space is changing: an UNMAP or REMAP event
//!   (`crate::mm::events`) is queued and not yet read. It is retried a few
//!   times, then the page is left to a later fault (the pager thread reads
//!   the event meanwhile). That later fault is the same fault's retry and
//!   is not counted again (`Ending::Again`; the kernel's `VM_FAULT_RETRY`).
//! - `EFAULT`: the page is not in the memfd. Only the cache punches holes,
//!   and only in pages it moved out of UPTODATE first, so a pinned page
//!   never says it; it is skipped.
//!
//! # Deviations from the reference
//!
//! - kernel-mechanisms.md §1(d) maps the faulting *page* first and every
//!   neighbour with DONTWAKE. faultmap maps the faulting page's whole *run*
//!   first, waking the thread when the call returns. On a fully cached
//!   window that is one ioctl instead of three, and the kernel also returns
//!   from a fault only after `filemap_map_pages` mapped the whole window: a
//!   thread woken after its single page races the handler's mapping of its
//!   neighbours and faults again on a page about to be mapped, which costs a
//!   second round trip and inflates the fault count. Latency to the first
//!   byte grows by the run's CONTINUE (0.2 µs per page on this machine).
//! - A major fault costs two events: the miss, which submits the read and
//!   parks, and the fault of the woken thread, which maps the window. The
//!   waker records the addresses it woke ([`crate::cache::wait::Uffd`]), so the
//!   second event is known as the first's retry (the kernel's
//!   FAULT_FLAG_TRIED): it is not counted again in `pgfault` and does no
//!   readahead bookkeeping, so a major fault leaves `mmap_miss` raised.
//!
//! # Context
//!
//! [`handle`] runs on a pager thread. Takes no lock on a hit without a
//! marker; a miss or a marker hit takes the object's readahead-state mutex
//! for the policy decision; parking takes the object's wait list; the
//! classic path holds the region table's lock. Never blocks on a store and
//! never panics on anything a store, the application or the kernel can do.
//! [`fast`] runs in a SIGBUS handler: atomics, `UFFDIO_CONTINUE` and (for
//! a write fault) `UFFDIO_WRITEPROTECT` only.
//!
//! A fault ends in one of four ways ([`Ending`]): mapped by a call that
//! woke its thread, parked on a read in flight, resolved (the thread is let
//! go: `UFFDIO_WAKE`, or the forwarded request completed), or failed
//! (`UFFDIO_POISON`, or the request completed as failed, which sends the
//! SIGBUS on to the application).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::base::index::{HostAddr, ObjectPage, RegionPage};
use crate::base::stats::{Counters, RaCounters, RaTally, Stats};
use crate::cache::page_state::{State, Word};
use crate::cache::wait::Uffd;
use crate::mm::engine::PagingEngine;
use crate::mm::guest::GuestFault;
use crate::mm::io::{IoQueue, ReadJob, Urgency};
use crate::mm::object::ObjectCore;
use crate::mm::signal::{Reply, RequestRef};
use crate::mm::space::{Region, RegionTable, Speculated, Speculation};
use crate::policy::fault_around;
use crate::policy::readahead::{self, Window};
use crate::sys::share::Answer;
use crate::sys::{self, ContinueResult, PAGE_SIZE, PTRS_PER_PTE};

/// What the fault path needs from its pager.
pub(crate) struct FaultEnv<'a> {
    /// How pages get mapped; under the Userfaultfd engine, the userfaultfd
    /// that woken and poisoned threads sleep in.
    pub(crate) engine: &'a PagingEngine,
    /// The regions the engine serves: the process's table, or a forked
    /// child's (`crate::mm::guest`).
    pub(crate) table: &'a RegionTable,
    pub(crate) counters: &'a Counters,
    pub(crate) ra: &'a RaCounters,
    pub(crate) io: &'a IoQueue,
    /// Try the speculative region lookup first (else classic only).
    pub(crate) speculative: bool,
    /// Benchmark only: serialise page lookups on one global mutex.
    pub(crate) global_cache_lock: bool,
}

/// Where a fault came from, and so how it ends.
#[derive(Clone, Copy)]
pub(crate) enum Origin<'a> {
    /// A userfaultfd message from thread `tid` (handler-thread delivery):
    /// the thread sleeps in the kernel until woken (`UFFDIO_WAKE`, or a
    /// `UFFDIO_CONTINUE` that maps its page). `wp`: a write-protect fault
    /// (`UFFD_PAGEFAULT_FLAG_WP`) that [`handle_wp`] could not finish.
    Uffd { tid: u32, wp: bool },
    /// A fault forwarded from a SIGBUS handler (signal delivery): the
    /// thread waits on the request until it is completed.
    Request(&'a RequestRef),
    /// A forked child's fault (`crate::mm::guest`): its thread waits for
    /// the answer on the fault's socket.
    Guest(&'a Arc<GuestFault>),
}

impl Origin<'_> {
    /// Whether the fault may be a write to a write-protected page: a
    /// write-protect message, or a forwarded SIGBUS whose error code does
    /// not say it was a read.
    fn may_write(&self) -> bool {
        match self {
            Origin::Uffd { wp, .. } => *wp,
            Origin::Request(r) => r.may_write(),
            Origin::Guest(g) => g.write,
        }
    }
}

/// A fault parked until a read in flight ends (see [`crate::cache::wait`]).
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The page it waits for.
    page: ObjectPage,
    /// How to let it go.
    target: WakeTarget,
}

#[derive(Debug)]
enum WakeTarget {
    /// A thread asleep in the userfaultfd at `addr`: woken with
    /// `UFFDIO_WAKE` (or `UFFDIO_POISON`). The userfaultfd it came from is
    /// kept: an object may be mapped by several pagers.
    Uffd {
        uffd: Arc<Uffd>,
        addr: HostAddr,
        tid: u32,
    },
    /// A SIGBUS handler waiting on its request.
    Request(RequestRef),
    /// A forked child's thread waiting for its answer.
    Guest(Arc<GuestFault>),
}

/// Pages of a window: at most one PTE table.
struct PageSet {
    bits: [u64; PTRS_PER_PTE / 64],
    /// Neighbours pinned that are in the active set (the working set).
    workingset: u64,
    /// Pages pinned for the first time since an adaptive read-around
    /// window read them (AROUND).
    around_uses: u64,
    /// The faulting page is one of them: a hit on such a window.
    fault_around_use: bool,
}

impl PageSet {
    fn new() -> Self {
        Self {
            bits: [0; PTRS_PER_PTE / 64],
            workingset: 0,
            around_uses: 0,
            fault_around_use: false,
        }
    }
    fn insert(&mut self, i: usize) {
        self.bits[i / 64] |= 1 << (i % 64);
    }
    fn contains(&self, i: usize) -> bool {
        self.bits[i / 64] & (1 << (i % 64)) != 0
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

/// How a fault's resolution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// A `UFFDIO_CONTINUE` that mapped the faulting page woke its thread.
    Woken,
    /// Parked: whoever ends the read lets the thread go.
    Parked,
    /// Resolved (or nothing left to do): the thread must be let go.
    Resolved,
    /// Not mapped this time (the address space is changing, `EAGAIN`):
    /// the thread is let go to fault again, and that fault is this one's
    /// retry, not a new one (the kernel's `VM_FAULT_RETRY`, which
    /// `mm_account_fault` counts once).
    Again,
    /// The page cannot be read: the access gets SIGBUS.
    Failed,
}

/// What a fault carries from one attempt to the next (a speculative
/// attempt that aborts, then the classic one).
struct Progress {
    /// The retry of a parked fault: already counted, bookkeeping done.
    retry: bool,
    /// This fault read the page itself (no hit bookkeeping).
    own_read: bool,
    /// The hit bookkeeping is done.
    bookkept: bool,
    /// The faulting page's read failed once: the next failure is SIGBUS.
    last_chance: bool,
    /// This fault owns a read, so it counts as major.
    major: bool,
}

/// Handles one fault: a userfaultfd message, or a fault that a SIGBUS
/// handler forwarded.
pub(crate) fn handle(env: &FaultEnv<'_>, addr: HostAddr, origin: Origin<'_>) {
    let page_addr = addr.page_down();
    let mut tally = Stats::default();
    let mut ra = RaTally::default();
    let begun = env.counters.begin();
    // The retry of a fault that was parked and woken: counted with it, and
    // no readahead bookkeeping (FAULT_FLAG_TRIED).
    let retry = match origin {
        Origin::Uffd { tid, .. } => env
            .engine
            .uffd()
            .is_some_and(|uffd| uffd.take_retry(tid, page_addr)),
        Origin::Request(r) => r.is_retry(),
        Origin::Guest(g) => g.retry,
    };
    let mut progress = Progress {
        retry,
        own_read: false,
        bookkept: retry,
        last_chance: false,
        major: false,
    };
    let table = env.table;
    let mut ending = None;
    // The page the faulting thread waits on: 4 KiB until the region says
    // otherwise (a region of 2 MiB pages; `UFFDIO_WAKE` and `POISON` then
    // cover the whole page).
    let mut span = (page_addr, PAGE_SIZE);
    // 1. Find the region: speculatively, then (on abort) under the lock.
    if env.speculative {
        match table.speculate(page_addr) {
            Speculated::Found(spec) => {
                span = spec.region.span_of(page_addr);
                ending = resolve(
                    env,
                    spec.region,
                    page_addr,
                    origin,
                    &mut progress,
                    &mut tally,
                    &mut ra,
                    Some(&spec),
                );
                if ending.is_some() {
                    tally.spf_success += 1;
                } else {
                    tally.spf_abort += 1;
                }
            }
            Speculated::Busy(..) => tally.spf_abort += 1,
            Speculated::None => tally.spf_fallback += 1,
        }
    }
    let ending = ending.unwrap_or_else(|| {
        let mut lock = table.lock();
        if lock.lookup(page_addr).is_none() {
            // An mremap destination whose REMAP event another pager
            // thread has read and is handling: wait for it (a settled
            // lock, at once let go), then look again (`crate::mm::events`).
            drop(lock);
            drop(table.settled());
            lock = table.lock();
        }
        match lock.lookup(page_addr) {
            Some(region) => {
                span = region.span_of(page_addr);
                resolve(
                    env,
                    region,
                    page_addr,
                    origin,
                    &mut progress,
                    &mut tally,
                    &mut ra,
                    None,
                )
                .unwrap_or(Ending::Resolved)
            }
            // The mapping is being dropped, or the application moved a
            // range here and its REMAP event waits to be read: let the
            // kernel sort it out (the thread faults again), and have the
            // next read reach the event.
            None => {
                if let Some(uffd) = env.engine.uffd() {
                    uffd.note_event_waiting();
                }
                Ending::Resolved
            }
        }
    });
    finish(env, origin, page_addr, span, ending);
    // The readahead counts first: a snapshot that sees this fault ended
    // (its in-flight count) sees them too.
    env.ra.add(&ra);
    env.counters.end(&tally, begun);
}

/// A write-protect fault read from the userfaultfd
/// (`UFFD_PAGEFAULT_FLAG_WP`, handler delivery): the page is mapped, so
/// there is no cache lookup and no window, only [`write_fault`], then the
/// thread is woken. A region that is not found at once (or a page that
/// cannot be pinned) takes the full path, [`handle`].
pub(crate) fn handle_wp(env: &FaultEnv<'_>, addr: HostAddr, tid: u32) {
    let page_addr = addr.page_down();
    if let Speculated::Found(spec) = RegionTable::get().speculate(page_addr) {
        let region = spec.region;
        if region.writable {
            let page = region.page_of(page_addr);
            let mut tally = Stats::default();
            let object = &region.object;
            let sets = [env.counters, &region.counters, &object.counters];
            let begun = sets.map(|c| c.begin());
            let done = write_fault(env, region, page, &mut tally, Some(&spec)) == WriteFault::Done;
            if done {
                tally.pgfault = 1;
                tally.spf_success = 1;
                let (at, len) = region.span_of(page_addr);
                if let Some(uffd) = env.engine.uffd() {
                    let _ = sys::uffd_wake(uffd, at.get(), len);
                }
            }
            for (c, b) in sets.into_iter().zip(begun) {
                c.end(&tally, b);
            }
            if done {
                return;
            }
        }
    }
    handle(env, addr, Origin::Uffd { tid, wp: true });
}

/// Lets the faulting thread go as `ending` says: `page_addr` is its 4 KiB
/// page (the key of its retry), `span` the page it waits on (address and
/// length: 2 MiB in a region of 2 MiB pages).
fn finish(
    env: &FaultEnv<'_>,
    origin: Origin<'_>,
    page_addr: HostAddr,
    span: (HostAddr, usize),
    ending: Ending,
) {
    let (at, len) = (span.0.get(), span.1);
    match (origin, ending) {
        (_, Ending::Parked) | (Origin::Uffd { .. }, Ending::Woken) => {}
        // A userfaultfd message comes only under the Userfaultfd engine.
        (Origin::Uffd { tid, .. }, ending) => {
            let Some(uffd) = env.engine.uffd() else {
                return;
            };
            match ending {
                Ending::Again => {
                    // Recorded before the wake: the retry may arrive at once.
                    uffd.expect_retry(tid, page_addr);
                    let _ = sys::uffd_wake(uffd, at, len);
                }
                Ending::Failed => {
                    let poisoned = sys::uffd_poison(uffd, at, len);
                    uffd.note_if_eagain(&poisoned);
                    if poisoned.is_err() {
                        let _ = sys::uffd_wake(uffd, at, len);
                    }
                }
                _ => {
                    let _ = sys::uffd_wake(uffd, at, len);
                }
            }
        }
        // Again: the handler returns and the access faults anew, which
        // finds the address space as it is then (a range being unmapped
        // gets its SIGSEGV from the kernel).
        (Origin::Request(r), Ending::Woken | Ending::Resolved | Ending::Again) => {
            r.complete(Reply::Mapped)
        }
        (Origin::Request(r), Ending::Failed) => r.complete(Reply::Failed),
        (Origin::Guest(g), Ending::Woken | Ending::Resolved | Ending::Again) => {
            g.complete(Answer::Mapped)
        }
        (Origin::Guest(g), Ending::Failed) => g.complete(Answer::Failed),
    }
}

/// Steps 2 to 4 on `region`. With `spec` (a speculative attempt), returns
/// `None` if the region changed before anything was mapped: the caller
/// retries on the classic path with the same `progress`.
#[allow(clippy::too_many_arguments)]
fn resolve(
    env: &FaultEnv<'_>,
    region: &Arc<Region>,
    page_addr: HostAddr,
    origin: Origin<'_>,
    progress: &mut Progress,
    pager_tally: &mut Stats,
    pager_ra: &mut RaTally,
    spec: Option<&Speculation<'_>>,
) -> Option<Ending> {
    let object = &*region.object;
    let mut tally = Stats::default();
    let mut ra = RaTally::default();
    let begun = (region.counters.begin(), object.counters.begin());

    // 2. The fault-around window, in region pages. A replay learns at
    //    once what the application uses (a miss parks before it maps
    //    anything; `crate::mm::trace`).
    let page = region.page_of(page_addr);
    let (window, decision) = fault_window(region, page_addr, page);
    region
        .trace
        .reached(region.object_page(window.start)..region.object_page(window.end));

    let mut ending = Some(Ending::Resolved);
    for _ in 0..MAX_LOOKUPS {
        // 3. Look up the faulting page.
        let opage = region.object_page(page);
        let word = object.cache.states.load(opage);
        match word.state() {
            // A fault that read its page (in this event, or in the first
            // attempt of this retry) does no hit bookkeeping: a major fault
            // must leave mmap_miss raised.
            State::UpToDate if progress.own_read || progress.bookkept => {}
            State::UpToDate => {
                hit(env, region, page, word, &mut tally, &mut ra);
                progress.bookkept = true;
            }
            State::Absent if progress.last_chance && word.has_failed() => {
                // Our own last-chance read failed before we parked: SIGBUS.
                ending = Some(Ending::Failed);
                break;
            }
            State::Absent if object.cache.offset(opage) >= object.errors.end() => {
                // Wholly beyond the end of a truncated object: SIGBUS, as
                // the kernel's shmem/filemap fault beyond EOF.
                ending = Some(Ending::Failed);
                break;
            }
            State::Absent => {
                progress.last_chance = word.has_failed();
                if miss(env, region, page, word, &mut tally, &mut ra) {
                    // One major fault, however many reads: a retry's read
                    // (after a failure) is its first attempt's.
                    progress.major |= !progress.retry;
                    progress.own_read = true;
                }
                continue;
            }
            State::Reading if word.is_stalled() => {
                // Its read outlived the store timeout (`crate::mm::errors`):
                // fail now rather than wait for a store that may never
                // answer.
                ending = Some(Ending::Failed);
                break;
            }
            State::Reading => {
                // Someone else's read: the kernel's first attempt finds the
                // folio in the cache, locked, and does the hit bookkeeping
                // (the marker, set at claim time, included) before it waits.
                if !progress.own_read && !progress.bookkept {
                    hit(env, region, page, word, &mut tally, &mut ra);
                    progress.bookkept = true;
                }
                if park(env, object, opage, page_addr, origin) {
                    // The watchdog may have stalled the page between the
                    // look and the parking, and settled the parked faults
                    // before this one was listed: settle again.
                    if object.cache.states.load(opage).is_stalled() {
                        settle_parked(object, None);
                    }
                    // Its read may still be queued behind readahead: move
                    // it up (a sync job is never listed, so this is cheap).
                    env.io.promote(object, opage);
                    tally.fault_wait += u64::from(!progress.own_read && !progress.retry);
                    ending = Some(Ending::Parked);
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
        // 4. Map the window's ready pages.
        let mapped = map_window(env, region, &window, page, &mut tally, &mut ra, spec);
        match write_next(env, region, mapped, origin.may_write()) {
            MapOutcome::Woken => ending = Some(Ending::Woken),
            // The page was mapped already: in a writable region, a write
            // to a write-protected page, if the fault may be a write
            // (`Origin::may_write`: a read, or a write to a page not mapped
            // yet, that lost the race to map it is woken and faults again,
            // as a write-protect fault if it writes). Let go after it
            // (`Resolved`).
            MapOutcome::NotWoken if region.writable && origin.may_write() => {
                match write_fault(env, region, page, &mut tally, spec) {
                    WriteFault::Done => {}
                    // A failed speculative attempt goes to the classic path.
                    WriteFault::NotPinned if spec.is_some() => ending = None,
                    WriteFault::NotPinned => {}
                    WriteFault::Refused => ending = Some(Ending::Failed),
                }
            }
            MapOutcome::NotWoken => {}
            MapOutcome::NotMapped => ending = Some(Ending::Again),
            MapOutcome::Unmappable => ending = Some(Ending::Failed),
            MapOutcome::PageGone => continue,
            MapOutcome::Aborted => ending = None,
        }
        break;
    }
    if ending.is_some() {
        tally.pgfault = u64::from(!progress.retry);
        // Not from a race lost (Resolved), a retry (Again) or a failure.
        if !progress.retry && matches!(ending, Some(Ending::Woken | Ending::Parked)) {
            learn(region, decision, &mut tally);
        }
        tally.pgmajfault = u64::from(progress.major);
    }
    region.ra.add(&ra);
    object.ra.add(&ra);
    pager_ra.merge(&ra);
    region.counters.end(&tally, begun.0);
    object.counters.end(&tally, begun.1);
    pager_tally.merge(&tally);
    ending
}

/// Step 2: the fault-around window of a fault at `page_addr` (region page
/// `page`), in region pages. The policy counts in plain numbers. With
/// adaptive fault-around, also its decision, which the caller hands to
/// [`learn`] where the fault is counted, if it mapped its page or parked
/// on its read (so that a parked fault's retry, or a speculative attempt
/// redone on the classic path, teaches it once, and a race lost teaches
/// nothing); `None` for a fixed order, and for a faulting page already
/// mapped here (a write to a write-protected page), which gets no window.
///
/// Known limit: with signal delivery, a hit whose own page could not be
/// mapped (`EAGAIN` while the address space changes) still maps the rest
/// of its window and is forwarded; the pager thread then sees those
/// neighbours mapped and learns a revisit that the fault made itself. It
/// is rare (an unmap or remap in flight) and costs one step of the
/// density.
fn fault_window(
    region: &Region,
    page_addr: HostAddr,
    page: RegionPage,
) -> (Range<RegionPage>, Option<fault_around::Auto>) {
    // A 2 MiB page is a whole PTE table's worth: the fault maps it alone
    // (one PMD), as the kernel maps a huge page.
    if region.page_shift != PAGE_SIZE.trailing_zeros() {
        return (page..page.add(1), None);
    }
    let slot = page_addr.pte_index();
    // A recording region maps one page per fault, so that every first
    // touch faults (`crate::mm::trace`).
    let mut order = if region.trace.records() {
        0
    } else {
        region.order()
    };
    let mut decision = None;
    if order == fault_around::AUTO && region.mapped.contains(page) {
        // A write-protect fault: nothing to learn, and nothing to map
        // around, as for the kernel's.
        order = 0;
    } else if order == fault_around::AUTO {
        let (table, below) = fault_around::auto_neighbourhood(slot, page.0, region.pages);
        let block = region.mapped.count(table.start..table.end);
        let before = match below {
            Some(below) if region.mapped.contains(RegionPage(page.0 - 1)) => {
                region.mapped.count(below)
            }
            _ => 0,
        };
        let d = fault_around::auto(region.density.load(Ordering::Relaxed), block, before);
        order = d.order;
        decision = Some(d);
    }
    let w = fault_around::window(slot, page.0, region.pages, order);
    (RegionPage(w.start)..RegionPage(w.end), decision)
}

/// Adaptive fault-around learns from a fault that counts (`pgfault`) and
/// either mapped its page (woke its thread) or parked on its read: the
/// decision's step is applied to the region's density as it is now (a CAS
/// loop: concurrent faults' steps add up). Lock-free and async-signal-safe.
fn learn(region: &Region, decision: Option<fault_around::Auto>, tally: &mut Stats) {
    if let Some(d) = decision {
        let _ = region
            .density
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(fault_around::density_step(now, d.touch))
            });
        tally.fault_around_auto_revisits += u64::from(d.touch == fault_around::Touch::Revisit);
    }
}

/// What [`fast`] did.
pub(crate) enum Fast {
    /// The faulting page is mapped.
    Mapped,
    /// Not a plain hit (a miss, a read in flight, a marker, a failed page,
    /// a region that changed): forward it to a pager thread.
    Forward,
}

/// The fault path of a SIGBUS handler: the plain hit only (the faulting
/// page UPTODATE and not a readahead marker), mapped with its window, in the
/// speculative lookup's read section (`spec`; `None`: under the table's
/// lock, `RegionLookup::Classic`). Async-signal-safe: atomics,
/// `UFFDIO_CONTINUE`, no lock (but the benchmark-only global cache lock),
/// no allocation, no panic. With `retry`, the fault was forwarded and
/// parked before: it is not counted again.
pub(crate) fn fast(
    env: &FaultEnv<'_>,
    region: &Arc<Region>,
    spec: Option<&Speculation<'_>>,
    page_addr: HostAddr,
    retry: bool,
    write: bool,
) -> Fast {
    let object = &*region.object;
    let page = region.page_of(page_addr);
    let word = object.cache.states.load(region.object_page(page));
    if word.state() != State::UpToDate || word.is_marker() {
        return Fast::Forward;
    }
    let (window, decision) = fault_window(region, page_addr, page);
    let mut tally = Stats::default();
    let mut ra = RaTally::default();
    let begun = (
        env.counters.begin(),
        region.counters.begin(),
        object.counters.begin(),
    );
    let mapped = map_window(env, region, &window, page, &mut tally, &mut ra, spec);
    let mut outcome = write_next(env, region, mapped, write);
    // Mapped already, in a writable region: a write to a write-protected
    // page, if the access may be a write (`write`: the SIGBUS's error
    // code; a spurious one only costs a write-back). A page that cannot be
    // pinned goes to a pager thread.
    if matches!(outcome, MapOutcome::NotWoken)
        && region.writable
        && write
        && write_fault(env, region, page, &mut tally, spec) != WriteFault::Done
    {
        // A pager thread sorts it out (and fails it if it must).
        outcome = MapOutcome::PageGone;
    }
    let woken = matches!(outcome, MapOutcome::Woken);
    let out = match outcome {
        MapOutcome::Woken | MapOutcome::NotWoken => {
            if !retry {
                // No marker here, so this hit submits nothing.
                hit(env, region, page, word, &mut tally, &mut ra);
                tally.pgfault = 1;
                // Not from a race lost (`NotWoken`).
                if woken {
                    learn(region, decision, &mut tally);
                }
            }
            tally.spf_success = u64::from(spec.is_some());
            Fast::Mapped
        }
        MapOutcome::NotMapped
        | MapOutcome::Unmappable
        | MapOutcome::PageGone
        | MapOutcome::Aborted => Fast::Forward,
    };
    region.ra.add(&ra);
    object.ra.add(&ra);
    env.ra.add(&ra);
    region.counters.end(&tally, begun.1);
    object.counters.end(&tally, begun.2);
    env.counters.end(&tally, begun.0);
    out
}

/// A write-protect fault on region page `page` of a writable region,
/// already mapped (write-protected): the protocol of `crate::mm::writeback`.
/// In the write-fault SRCU section: pin (the page must be UPTODATE),
/// **first** unprotect (`DONTWAKE`: the caller lets the thread go after),
/// **then** `set_dirty`, unpin. Says whether the page could not be pinned
/// (being evicted, or not cached: the caller lets the access fault again)
/// or could not be made writable at all (the Protect engine out of memory
/// areas even after giving its own back: the access gets SIGBUS).
/// Async-signal-safe: atomics and one ioctl (or `mprotect`).
///
/// Why this order: the flusher clears DIRTY (`begin_writeback`) before it
/// write-protects. If our unprotect comes after the flusher's protect, our
/// `set_dirty` comes after its clear and the page stays DIRTY; if before,
/// the flusher's protect ends the writes it can miss before it copies.
pub(crate) fn write_fault(
    env: &FaultEnv<'_>,
    region: &Region,
    page: RegionPage,
    tally: &mut Stats,
    spec: Option<&Speculation<'_>>,
) -> WriteFault {
    let object = &*region.object;
    let Some(state) = object.cache.states.get(region.object_page(page)) else {
        return WriteFault::NotPinned;
    };
    let _section = crate::mm::writeback::write_section();
    let mut seen = state.load();
    let mut pinned = false;
    for _ in 0..MAX_LOOKUPS {
        if seen.state() != State::UpToDate {
            break;
        }
        match state.try_pin_io(seen) {
            Ok(()) => {
                pinned = true;
                break;
            }
            Err(now) => {
                tally.lookup_retry += 1;
                seen = now;
            }
        }
    }
    if !pinned {
        return WriteFault::NotPinned;
    }
    // A region found speculatively may have been detached (the
    // application unmapped it) and its range reused by another mapping
    // since: never unprotect a page there on this region's behalf.
    if spec.is_some_and(|s| !s.still_valid()) {
        state.unpin();
        return WriteFault::NotPinned;
    }
    // An error (the mapping is going, the address space is changing)
    // leaves the page protected: the write faults again. DIRTY is set
    // anyway: at worst an extra write-back.
    let mut refused = false;
    let clean = crate::mm::writeback::dirty_after_unprotect(state, || {
        let addr = region.addr_of(page).get();
        let allowed = env.engine.allow_write(region, addr, region.page_bytes());
        refused = env.engine.protect().is_some()
            && matches!(allowed, Err(e) if e.raw_os_error() == Some(libc::ENOMEM));
    });
    if clean {
        tally.write_faults += 1;
        object
            .wb
            .dirty_pages
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    state.unpin();
    if refused {
        WriteFault::Refused
    } else {
        WriteFault::Done
    }
}

/// How [`write_fault`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteFault {
    /// The page is writable (or the call failed in a way the next fault
    /// sorts out) and marked dirty.
    Done,
    /// The page could not be pinned: let the access fault again.
    NotPinned,
    /// The page cannot be made writable (the Protect engine is out of
    /// memory areas even after giving its own back): SIGBUS.
    Refused,
}

/// Step 3, a hit on region page `page` (word `word`): the readahead
/// bookkeeping of `do_async_mmap_readahead`.
fn hit(
    env: &FaultEnv<'_>,
    region: &Arc<Region>,
    page: RegionPage,
    word: Word,
    tally: &mut Stats,
    ra: &mut RaTally,
) {
    let object = &*region.object;
    let opage = region.object_page(page);
    let params = region.ra_params(page);
    // Only a mapping that runs async readahead takes the marker; another
    // leaves it for the mappings that do.
    let marker = word.is_marker()
        && readahead::consumes_marker(&params)
        && object
            .cache
            .states
            .get(opage)
            .is_some_and(|s| s.clear_marker());
    if !marker {
        // Lock-free: only mmap_miss changes.
        object.with_ra_counts(|st| {
            readahead::on_hit(st, &params, opage.0, false, &object.cache.states);
        });
        return;
    }
    let next = object
        .with_ra_state(|st| readahead::on_hit(st, &params, opage.0, true, &object.cache.states));
    if let Some(w) = next {
        let submitted = submit_window(env, region, &w, None, false, false, ra);
        ra.window(&w, submitted.requests, submitted.pages);
        tally.io_count += submitted.requests;
        tally.refault += submitted.refaults;
    }
}

/// Step 3, a miss on region page `page`: submits the readahead window (or,
/// after a failed read, the page alone). Returns whether this fault now
/// owns a read of the page (it then parks on it).
fn miss(
    env: &FaultEnv<'_>,
    region: &Arc<Region>,
    page: RegionPage,
    word: Word,
    tally: &mut Stats,
    ra: &mut RaTally,
) -> bool {
    let object = &*region.object;
    let opage = region.object_page(page);
    let (window, adapts) = if word.has_failed() {
        // The last read of this page failed: read it alone, once more.
        let alone = Window {
            start: opage.0,
            size: 1,
            async_size: 0,
            pattern: readahead::Pattern::Random,
            sync: true,
            eof: false,
        };
        (alone, false)
    } else {
        let params = region.ra_params(page);
        let w = object
            .with_ra_state(|st| readahead::on_miss(st, &params, opage.0, &object.cache.states));
        (w, readahead::adapts(&params))
    };
    let around = adapts && window.pattern == readahead::Pattern::Around;
    let last_chance = word.has_failed();
    let submitted = submit_window(env, region, &window, Some(opage), last_chance, around, ra);
    if submitted.demand {
        ra.window(&window, submitted.requests, submitted.pages);
        tally.io_retry_single += u64::from(word.has_failed());
    }
    tally.io_count += submitted.requests;
    tally.refault += submitted.refaults;
    submitted.demand
}

/// What [`submit_window`] did.
struct Submitted {
    /// Whether the demand page was claimed (and its read submitted).
    demand: bool,
    /// Store requests submitted.
    requests: u64,
    /// Pages claimed and submitted.
    pages: u64,
    /// Of those, pages read again soon after their eviction.
    refaults: u64,
}

/// Claims the absent pages of `w` and submits them to the I/O threads in
/// requests of at most the store's `io_pages`. With `demand`, that page must
/// be claimed first (else nothing is read: another fault reads it), and its
/// request goes to the sync queue, ahead of the rest; `last_chance`: the
/// demand page's previous read failed (see [`ReadJob::last_chance`]);
/// `around`: the window is an adaptive read-around window, whose pages are
/// tagged AROUND (read-ahead ones, not the demand page) so that their
/// first uses count for it ([`readahead::on_used`]).
fn submit_window(
    env: &FaultEnv<'_>,
    region: &Arc<Region>,
    w: &Window,
    demand: Option<ObjectPage>,
    last_chance: bool,
    around: bool,
    ra: &mut RaTally,
) -> Submitted {
    let object = &region.object;
    let states = &object.cache.states;
    let budget = &object.budget;
    if let Some(d) = demand {
        if !states.get_or_alloc(d).is_some_and(|s| s.begin_read()) {
            return Submitted {
                demand: false,
                requests: 0,
                pages: 0,
                refaults: 0,
            };
        }
        // The page a fault waits for is always read, budget or not.
        budget.charge_demand(object);
    }
    // 1. Claim the window's absent pages that fit in the budget, as runs
    //    (the window shrinks, as readahead does when allocations fail).
    let mut runs: Vec<Range<ObjectPage>> = Vec::new();
    let mut full = false;
    for p in w.pages().map(ObjectPage) {
        let won = Some(p) == demand
            || (!full
                && states.get_or_alloc(p).is_some_and(|s| {
                    if !budget.try_charge(object) {
                        full = true;
                        return false;
                    }
                    if s.begin_read() {
                        return true;
                    }
                    budget.uncharge(object, 1);
                    false
                }));
        if !won {
            continue;
        }
        match runs.last_mut() {
            Some(run) if run.end == p => run.end = p.add(1),
            _ => runs.push(p..p.add(1)),
        }
    }
    // Pages evicted recently are the working set: straight to the active
    // set (`crate::policy::workingset`).
    let refaults = object.shadows.take_refaults(
        runs.iter().flat_map(|r| r.start.0..r.end.0),
        budget.age.now(),
        budget.refault_threshold(),
    );
    for &p in &refaults {
        if let Some(state) = states.get(ObjectPage(p)) {
            state.mark_active();
        }
    }
    budget.activated(object, refaults.len() as u64);
    // 2. Cut them into requests; the demand page's first.
    // Whatever the store says, a request is 1..=MAX_RA_PAGES pages.
    let io_pages = object.io_pages;
    let mut requests: Vec<Range<ObjectPage>> = Vec::new();
    for run in runs {
        let mut start = run.start;
        while start < run.end {
            let end = ObjectPage(start.0.saturating_add(io_pages).min(run.end.0));
            requests.push(start..end);
            start = end;
        }
    }
    let first = demand
        .and_then(|d| requests.iter().position(|r| r.contains(&d)))
        .unwrap_or(0);
    requests.rotate_left(first);
    // 3. The marker, on a page this window newly reads, set now (the
    //    kernel marks the folio when it allocates it, before the I/O).
    let claimed: u64 = requests.iter().map(|r| r.end.0 - r.start.0).sum();
    if let Some(m) = w.marker().map(ObjectPage) {
        if requests.iter().any(|r| r.contains(&m)) {
            if let Some(state) = states.get(m) {
                state.mark();
            }
        }
    }
    if around {
        let ahead = requests.iter().flat_map(|r| r.start.0..r.end.0);
        for p in ahead.map(ObjectPage).filter(|&p| Some(p) != demand) {
            if let Some(state) = states.get(p) {
                state.mark_around();
            }
        }
    }
    // 4. Submit.
    for (i, pages) in requests.iter().enumerate() {
        let urgency = if i == 0 && demand.is_some() {
            Urgency::Sync
        } else {
            Urgency::Async
        };
        let job = ReadJob {
            object: object.clone(),
            pages: pages.clone(),
            demand: demand.filter(|d| pages.contains(d)),
            region: Some(region.clone()),
            last_chance,
        };
        env.io.submit(job, urgency, env.counters);
    }
    ra.read_ahead(claimed - u64::from(demand.is_some()));
    Submitted {
        demand: demand.is_some(),
        requests: requests.len() as u64,
        pages: claimed,
        refaults: refaults.len() as u64,
    }
}

/// `WillNeed` on region pages `pages`: reads their absent pages in the
/// background, in store-sized requests, and returns at once. No marker: the
/// application said what it needs. Like the kernel's `force_page_cache_ra`,
/// it reads at most `max(io_pages, ra_pages)` pages from the range's start.
/// It is not a readahead window of the policy's: it is left out of the
/// pattern rows. Returns the store requests submitted and the refaults
/// among the pages.
pub(crate) fn read_ahead(
    env: &FaultEnv<'_>,
    region: &Arc<Region>,
    pages: Range<RegionPage>,
    ra: &mut RaTally,
) -> (u64, u64) {
    let most = region.object.io_pages.max(region.ra_pages).max(1);
    let end = pages
        .end
        .0
        .min(region.pages)
        .min(pages.start.0.saturating_add(most));
    if pages.start.0 >= end {
        return (0, 0);
    }
    let first = region.object_page(pages.start);
    let w = Window {
        start: first.0,
        size: end - pages.start.0,
        async_size: 0,
        pattern: readahead::Pattern::Random,
        sync: false,
        eof: false,
    };
    let submitted = submit_window(env, region, &w, None, false, false, ra);
    (submitted.requests, submitted.refaults)
}

/// Parks the fault at `addr` on object page `opage`, which is READING.
/// Returns false if the read ended meanwhile (look again).
fn park(
    env: &FaultEnv<'_>,
    object: &ObjectCore,
    opage: ObjectPage,
    addr: HostAddr,
    origin: Origin<'_>,
) -> bool {
    let Some(state) = object.cache.states.get(opage) else {
        return false;
    };
    let target = match origin {
        Origin::Uffd { tid, .. } => match env.engine.uffd() {
            Some(uffd) => WakeTarget::Uffd {
                uffd: uffd.clone(),
                addr,
                tid,
            },
            // A userfaultfd message comes only under the Userfaultfd engine.
            None => return false,
        },
        Origin::Request(r) => WakeTarget::Request(r.clone()),
        Origin::Guest(g) => WakeTarget::Guest((*g).clone()),
    };
    object.waiters.park(
        state,
        Waiter {
            page: opage,
            target,
        },
    )
}

/// How a read ended, for [`end_reads`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadEnd {
    /// The store filled the pages: UPTODATE.
    Read,
    /// The store failed: ABSENT and FAILED (the next fault's read is the
    /// page's last chance).
    Failed,
    /// Never asked of the store (dropped unread at shutdown, or its object
    /// closed): ABSENT, as if never claimed.
    Dropped,
    /// Read, but its object closed meanwhile: what the store wrote is
    /// punched out, and the pages are ABSENT, as if never claimed.
    Discarded,
}

/// Ends the reads of `pages` (object pages the caller owns the reads of):
/// UPTODATE after a [`ReadEnd::Read`] (every page but `demand` marked as
/// read ahead; a readahead marker set at claim time stays), else ABSENT
/// (and FAILED after a failure), their charge given back. Returns whether
/// any of them had parked waiters.
pub(crate) fn end_reads(
    object: &ObjectCore,
    pages: Range<ObjectPage>,
    end: ReadEnd,
    demand: Option<ObjectPage>,
) -> bool {
    let mut waiters = false;
    if matches!(end, ReadEnd::Failed | ReadEnd::Discarded) {
        // Whatever the store wrote is dropped while the pages are still
        // ours (READING), so a failed or discarded read holds no memory.
        let _ = sys::punch_hole(
            object.cache.memfd(),
            object.cache.offset(pages.start),
            object.cache.bytes(pages.end.0 - pages.start.0),
        );
    }
    for p in pages.start.0..pages.end.0 {
        let p = ObjectPage(p);
        if let Some(state) = object.cache.states.get(p) {
            let old = match end {
                ReadEnd::Read => state.finish_read(Some(p) != demand),
                ReadEnd::Failed => state.fail_read(),
                ReadEnd::Dropped | ReadEnd::Discarded => state.drop_read(),
            };
            if end != ReadEnd::Read && old.is_active() {
                object.budget.deactivated(object, 1);
            }
            waiters |= old.has_waiters();
        }
    }
    if end != ReadEnd::Read {
        object.budget.uncharge(object, pages.end.0 - pages.start.0);
    }
    waiters
}

/// Settles every fault parked on the object after a read ended: each is
/// woken, faults again, and finds its page cached, absent (and reads it),
/// or still being read (and parks again). With `poison`, the faults parked
/// on that page get SIGBUS instead: its last-chance read failed. So do the
/// faults parked on a page whose read the watchdog stalled (READING and
/// STALLED: the store did not answer in time, see `crate::mm::errors`).
pub(crate) fn settle_parked(object: &ObjectCore, poison: Option<ObjectPage>) {
    for w in object.waiters.take_all() {
        let stalled = || {
            let word = object.cache.states.load(w.page);
            word.state() == State::Reading && word.is_stalled()
        };
        let failed = Some(w.page) == poison || stalled();
        match w.target {
            WakeTarget::Uffd { uffd, addr, tid } => {
                // The whole page it waits on (`addr` is its 4 KiB page,
                // the key of its retry; mappings of the object are aligned
                // to its page size).
                let len = object.cache.page_size().bytes();
                let at = addr.get() & !(len - 1);
                let poisoned = failed && sys::uffd_poison(&uffd, at, len).is_ok();
                if !poisoned {
                    // Recorded before the wake: the retry may arrive at once.
                    uffd.expect_retry(tid, addr);
                    let _ = sys::uffd_wake(&uffd, at, len);
                }
            }
            WakeTarget::Request(r) => r.complete(if failed { Reply::Failed } else { Reply::Retry }),
            WakeTarget::Guest(g) => g.complete(if failed {
                Answer::Failed
            } else {
                Answer::Retry
            }),
        }
    }
}

enum MapOutcome {
    /// The faulting page is mapped and its thread woken.
    Woken,
    /// The faulting page was already mapped (not woken by us).
    NotWoken,
    /// The faulting page could not be mapped this time (its VMA is going,
    /// the address space is changing): let the access fault again.
    NotMapped,
    /// The faulting page cannot be mapped at all: SIGBUS.
    Unmappable,
    /// The faulting page left UPTODATE before it could be pinned.
    PageGone,
    /// The speculation failed: the region changed; nothing was mapped.
    Aborted,
}

/// Step 4: pins the window's ready pages and maps them as runs.
#[allow(clippy::too_many_arguments)]
fn map_window(
    env: &FaultEnv<'_>,
    region: &Region,
    window: &Range<RegionPage>,
    page: RegionPage,
    tally: &mut Stats,
    ra: &mut RaTally,
    spec: Option<&Speculation<'_>>,
) -> MapOutcome {
    let n = window.end.since(window.start) as usize;
    let fault_i = page.since(window.start) as usize;
    let pinned = {
        let _serial = env.global_cache_lock.then(global_cache_lock);
        pin_ready(region, window, fault_i, tally, ra)
    };
    if !pinned.contains(fault_i) {
        unpin_all(region, window, &pinned);
        return MapOutcome::PageGone;
    }
    // The speculation's check, before anything is mapped.
    if spec.is_some_and(|s| !s.still_valid()) {
        unpin_all(region, window, &pinned);
        return MapOutcome::Aborted;
    }
    // The region is this address's: the access trace notes the fault
    // before its thread is let go (`crate::mm::trace`).
    let pages = region.object_page(window.start)..region.object_page(window.end);
    if region.trace.touch(region.object_page(page), pages) {
        tally.trace_recorded += 1;
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
    // A recording region's windows are one page, whatever its order.
    if region.order() == crate::policy::fault_around::AUTO
        && !region.trace.records()
        && region.page_shift == PAGE_SIZE.trailing_zeros()
    {
        tally.fault_around_auto += 1;
        tally.fault_around_auto_pages += n as u64;
    }
    unpin_all(region, window, &pinned);
    // Neighbours in the working set (refaulted, active) do not pay
    // mmap_miss down: under memory pressure they would keep read-around
    // going while it thrashes (the kernel's `filemap_map_pages` skips
    // workingset folios the same way).
    let around_paying = around.saturating_sub(pinned.workingset);
    // Fault-around hits pay mmap_miss down; the window's end is where a
    // sequential reader's next miss will be.
    let object = &region.object;
    let last = region.object_page(window.start.add(fault_run.end as u64 - 1));
    object.with_ra_counts(|st| {
        readahead::on_fault_around(st, around_paying);
        readahead::on_mapped(st, last.0);
        // A hit on a page an adaptive read-around window read, its first
        // use: evidence that the windows are used.
        if pinned.fault_around_use {
            readahead::on_used(st, pinned.around_uses);
        }
    });
    match first.fault {
        FaultPage::Woken => MapOutcome::Woken,
        FaultPage::AlreadyMapped => MapOutcome::NotWoken,
        FaultPage::NotMapped => MapOutcome::NotMapped,
        FaultPage::Unmappable => MapOutcome::Unmappable,
    }
}

/// Under the Protect engine, a fault that may be a write on a writable
/// region goes on to [`write_fault`] once its window is mapped (readable),
/// as a fault on a page mapped already does: `mprotect` does not say
/// whether the page was accessible before (the userfaultfd's `EEXIST`),
/// and a write would fault again on the readable page for ever.
fn write_next(env: &FaultEnv<'_>, region: &Region, outcome: MapOutcome, write: bool) -> MapOutcome {
    match outcome {
        MapOutcome::Woken if write && region.writable && env.engine.by_protection() => {
            MapOutcome::NotWoken
        }
        outcome => outcome,
    }
}

/// The benchmark-only global cache lock (`parts`: the lock-free page
/// lookup against a cache behind one mutex, the lockless page cache's comparison). In a
/// SIGBUS handler a mutex is unsafe in general; the interrupted code never
/// holds this one (only `pin_ready` takes it, and it touches no mapping),
/// which is why the benchmark may use it there.
fn global_cache_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pins the UPTODATE pages of `window` (window-relative index `fault_i` is
/// the faulting page). A pinned page stays UPTODATE until unpinned.
fn pin_ready(
    region: &Region,
    window: &Range<RegionPage>,
    fault_i: usize,
    tally: &mut Stats,
    ra: &mut RaTally,
) -> PageSet {
    let states = &region.object.cache.states;
    let mut pinned = PageSet::new();
    for (i, p) in (window.start.0..window.end.0).map(RegionPage).enumerate() {
        let Some(state) = states.get(region.object_page(p)) else {
            continue;
        };
        // Fault-around skips pages this region already mapped (the kernel
        // skips present PTEs); the faulting page is mapped whatever the bit.
        if i != fault_i && region.mapped.contains(p) {
            continue;
        }
        let mut seen = state.load();
        for _ in 0..2 {
            // Fault-around skips the readahead marker; the faulting page is
            // mapped whatever it carries.
            if seen.state() != State::UpToDate || (seen.is_marker() && i != fault_i) {
                break;
            }
            // The faulting page is the one used: REFERENCED (its accessed
            // bit, for the CLOCK); neighbours are only MAPPED ("old").
            let pin = if i == fault_i {
                state.try_pin_referenced(seen)
            } else {
                state.try_pin(seen)
            };
            match pin {
                Ok(first_use) => {
                    pinned.insert(i);
                    if i != fault_i && seen.is_active() {
                        pinned.workingset += 1;
                    }
                    if first_use {
                        ra.used(1);
                    }
                    if seen.is_around() {
                        pinned.around_uses += 1;
                        pinned.fault_around_use |= i == fault_i;
                    }
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

fn unpin_all(region: &Region, window: &Range<RegionPage>, pinned: &PageSet) {
    let n = window.end.since(window.start) as usize;
    for run in pinned.runs(n) {
        for i in run {
            let opage = region.object_page(window.start.add(i as u64));
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
    /// The kernel cannot map it (`EIO`: hardware-poisoned).
    Unmappable,
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
    base: RegionPage,
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
        // A writable region maps every page write-protected: its first
        // write faults (`crate::mm::writeback`).
        let first = base.add(cur as u64);
        let result = env.engine.map(region, first..first.add(len as u64), wake);
        let done = match result {
            ContinueResult::Done => len,
            ContinueResult::Partial { bytes } => bytes >> region.page_shift,
            ContinueResult::Failed { errno } => {
                match errno {
                    libc::EAGAIN if eagain < MAX_EAGAIN => {
                        if let Some(uffd) = env.engine.uffd() {
                            uffd.note_event_waiting();
                        }
                        eagain += 1;
                        continue;
                    }
                    libc::ENOENT if len > 1 => {
                        one_by_one = true;
                        continue;
                    }
                    libc::EEXIST => {
                        tally.map_eexist += 1;
                        let p = base.add(cur as u64);
                        region.mapped.mark(p..p.add(1), true);
                        if fault == Some(cur) {
                            out.fault = FaultPage::AlreadyMapped;
                            return out;
                        }
                    }
                    // The memfd's page is hardware-poisoned, or the Protect
                    // engine is out of memory areas even after giving its
                    // own back: the access must get SIGBUS, not fault
                    // again for ever.
                    libc::EIO if fault == Some(cur) => {
                        out.fault = FaultPage::Unmappable;
                        return out;
                    }
                    libc::ENOMEM if fault == Some(cur) && env.engine.protect().is_some() => {
                        out.fault = FaultPage::Unmappable;
                        return out;
                    }
                    // A forked child's range that is no longer the one it
                    // registered (it unmapped it, or mapped something else
                    // there): no event will tell, and the fault would come
                    // back for ever. The access is the child's to fail.
                    libc::ENOENT if fault == Some(cur) && region.map.is_foreign() => {
                        out.fault = FaultPage::Unmappable;
                        return out;
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
        region
            .mapped
            .mark(base.add(cur as u64)..base.add((cur + done) as u64), true);
        out.pages += done as u64;
        cur += done;
    }
    out
}
