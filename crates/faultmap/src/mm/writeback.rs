//! Write-back: dirty tracking of writable mappings, `flush`, and the
//! background flusher.
//!
//! A writable mapping ([`crate::Pager::map_mut`]) maps the object's memfd
//! read-write, registered MISSING|MINOR|WP. Writes land in the cache (the
//! memfd), so every mapping of the object sees them at once; this module
//! gets them back to the store.
//!
//! # State
//!
//! Per page, two flags of the page-state word (`crate::cache::page_state`): DIRTY
//! (written since its last write-back began) and WRITEBACK (being copied to
//! the store). Per object ([`ObjectWb`]): the number of DIRTY pages, whether
//! a store write succeeded since the last `Store::sync`, and the write-back
//! error sequence (below). The flusher keeps, per dirty page, when it first
//! saw it dirty: the fault path records no time.
//!
//! # Dirty tracking: synchronous write-protect faults
//!
//! Every `UFFDIO_CONTINUE` in a writable region uses
//! `UFFDIO_CONTINUE_MODE_WP`, so every page starts mapped write-protected.
//! The first write to it raises a WP fault (a uffd message with
//! `UFFD_PAGEFAULT_FLAG_WP`, or, with signal delivery, a SIGBUS of a write
//! access on a page that `UFFDIO_CONTINUE` finds already mapped: `EEXIST`).
//! The fault path
//! (`crate::mm::fault::write_fault`), in an SRCU read section of
//! [`write_faults`]:
//!
//! ```text
//!   W0 pin the page (try_pin_io: it must be UPTODATE, else the fault retries)
//!   W1 unprotect it (UFFDIO_WRITEPROTECT mode 0, DONTWAKE)
//!   W2 set_dirty()                       (write_faults, dirty count)
//!   W3 unpin; the thread is let go and its write proceeds
//! ```
//!
//! and write-back of a page, by [`write_back`]:
//!
//! ```text
//!   F0 try_pin_io
//!   F1 begin_writeback: DIRTY -> WRITEBACK
//!   F2 write-protect it in every writable region that maps it
//!   F3 copy its bytes out of the cache (the alias, volatile loads) into a
//!      bounce buffer, and hand that to Store::write_at
//!   F4 end_writeback(ok)  (a failure sets DIRTY again)
//!   F5 unpin
//! ```
//!
//! **Why W1 before W2, and F1 before F2: no write is lost.** A write needs
//! a writable PTE, and a PTE becomes writable only at some W1 (CONTINUE
//! maps write-protected). Take a write, the W1 that made its PTE writable,
//! and any write-back F of the page that starts (F1) before the write:
//! - W1 before F2: F2 protects the PTE again, so the write happened before
//!   F2 returned (the kernel flushes the TLB under the PTE lock), hence
//!   before F3's copy, which includes it; or
//! - W1 after F2: then W2 (after W1) comes after F1 (before F2): it sets
//!   DIRTY after F1 cleared it, so the page stays DIRTY for the next
//!   write-back, which copies the write.
//!
//! With W2 before W1 instead, W2, F1, W1, F2 would be possible only if W1
//! were skipped... worse: W2, F1, F2, W1 leaves the PTE writable with DIRTY
//! clear, and every later write is lost. The loom model in this module
//! checks the protocol with the PTE's writability as an atomic.
//!
//! **Why not WP_ASYNC + PAGEMAP_SCAN**, which is cheaper (platform.md: first
//! write 0.8 µs, a scan 0.3-1 ms): the evictor must unmap pages
//! (`MADV_DONTNEED`) to sample references and to evict. A write landing
//! between a PAGEMAP_SCAN that re-protects and that DONTNEED is resolved by
//! the kernel without telling us, and DONTNEED then drops the PTE with its
//! written bit: that write would never be written back. With synchronous WP
//! faults DIRTY lives in the page-state word, set before the write can
//! proceed, and `begin_evict` refuses a DIRTY or WRITEBACK page.
//!
//! # `flush` (msync(MS_SYNC))
//!
//! When [`flush`] returns `Ok`, every byte of its range written before the
//! call is in the store and `Store::sync` has run:
//!
//! 1. sample the error sequence;
//! 2. `synchronize` the write-fault SRCU: a write fault that made a page
//!    writable before the call has set DIRTY (W2) by now. (Without it a
//!    second thread could write through a PTE that W1 just unprotected and
//!    flush before W2.)
//! 3. write back the range's DIRTY pages, in batches of [`BATCH`] pages,
//!    copied in maximal runs;
//! 4. wait for the range's pages under someone else's write-back (the
//!    flusher's, another flush's), and write back those found DIRTY again;
//!    repeat until none;
//! 5. `Store::sync` if any store write succeeded since the last sync (under
//!    a lock, so a concurrent flush cannot return before the sync that
//!    covers its pages has ended);
//! 6. report an error if the sequence moved since step 1.
//!
//! # Errors (fsync's errseq)
//!
//! A failed store write leaves its pages DIRTY (`end_writeback(false)`),
//! counts `writeback_errors`, and is recorded in the object's error
//! sequence: every flush that starts after the failure (or runs during it)
//! reports it once, as [`WriteBackError::Write`] naming the object and the
//! offset; a flush that starts after one of them reported it does not.
//! A failure of the background flusher is thus reported by the next flush.
//!
//! # The background flusher
//!
//! One thread per pager, started with its first writable mapping, stopped
//! and joined with the pager's other threads. It ticks every
//! `min(dirty_expire / 6, 5 s)`; at each tick it scans the pager's objects
//! for DIRTY pages, records when it first saw each, and writes back those it
//! has seen dirty for at least `Config::dirty_expire`. It also runs the
//! ranges queued by `flush_async` (no sync: MS_ASYNC). Stopping it writes
//! back every dirty page of the pager's live objects (best effort). When the
//! last handle of an object goes (its `ObjectCore` is dropped), its dirty
//! pages are written back and synced, best effort: errors there have nobody
//! to be reported to and are only counted.
//!
//! # Crash semantics
//!
//! As with `mmap`: bytes written and not flushed may be lost in a crash (or
//! may be in the file: the flusher writes pages at any time, in no
//! particular order, and a page may be written while a store to it is half
//! done, with the page DIRTY again). Bytes for which a `flush` returned `Ok`
//! are in the file.
//!
//! # Known inaccuracies
//!
//! - A page re-dirtied between two ticks keeps its first-seen time, so it
//!   may be written back earlier than `dirty_expire` after its new first
//!   write; a page's age is known to a tick's precision.
//! - The dirty scan is O(installed chunks' pages) per dirty object per tick.
//! - A spurious WP fault (an `EEXIST` from a race, not a write) marks a page
//!   DIRTY: an extra write-back, never a lost write.
//! - Writes are protected per region over the whole run, mapped or not
//!   (the kernel leaves uffd-wp markers on unmapped PTEs): the region's
//!   mapped bits are hints, not safe to skip on.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::base::index::{HostAddr, ObjectPage, RegionPage};
use crate::base::stats::{Counters, Stats};
use crate::cache::page_state::{PageState, State};
use crate::mm::engine::PagingEngine;
use crate::mm::invalidate::runs_of;
use crate::mm::object::ObjectCore;
use crate::mm::pager_core::Core;
use crate::mm::space::Region;
use crate::sync::srcu::{ReadGuard, Srcu};
use crate::sys;

/// Pages claimed, protected and copied together: 8 MiB.
pub(crate) const BATCH: u64 = 2048;

/// How many `EAGAIN`s a write-protect tolerates (the address space is
/// changing) before it gives up on the batch.
const MAX_EAGAIN: u32 = 16;

/// How long write-back waits for pending UNMAP/REMAP events to be read
/// (`EAGAIN`: see `protect_range`) before it gives up and leaves the pages
/// dirty.
const EAGAIN_PATIENCE: Duration = Duration::from_secs(10);

/// The longest flusher tick.
const MAX_TICK: Duration = Duration::from_secs(5);

/// Why a write-back or flush failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteBackError {
    /// The range is not inside the mapping or object.
    #[error("flush range {start}..{end} is not inside the mapping ({len} bytes)")]
    Range {
        /// The range's start.
        start: u64,
        /// The range's end.
        end: u64,
        /// The mapping's (or object's) length.
        len: u64,
    },
    /// A store write failed; its pages stay dirty.
    #[error("writing back {len} bytes at offset {offset} of {name} failed")]
    Write {
        /// The object's name.
        name: String,
        /// The object offset of the first byte that could not be written.
        offset: u64,
        /// The length of the failed write.
        len: usize,
        /// The store's error.
        source: io::Error,
    },
    /// `Store::sync` failed.
    #[error("syncing {name} failed")]
    Sync {
        /// The object's name.
        name: String,
        /// The store's error.
        source: io::Error,
    },
    /// Write-protecting pages before copying them failed; they stay dirty.
    #[error("write-protecting pages of {name} at offset {offset} failed")]
    Protect {
        /// The object's name.
        name: String,
        /// The object offset of the first page.
        offset: u64,
        /// The operating system's error.
        source: io::Error,
    },
}

/// A recorded failure, replayable to every flush that must report it.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    Write {
        offset: u64,
        len: usize,
        kind: io::ErrorKind,
        message: String,
    },
    Sync {
        kind: io::ErrorKind,
        message: String,
    },
    Protect {
        offset: u64,
        kind: io::ErrorKind,
        message: String,
    },
}

impl Failure {
    fn to_error(&self, name: &str) -> WriteBackError {
        let name = name.to_string();
        match self {
            Failure::Write {
                offset,
                len,
                kind,
                message,
            } => WriteBackError::Write {
                name,
                offset: *offset,
                len: *len,
                source: io::Error::new(*kind, message.clone()),
            },
            Failure::Sync { kind, message } => WriteBackError::Sync {
                name,
                source: io::Error::new(*kind, message.clone()),
            },
            Failure::Protect {
                offset,
                kind,
                message,
            } => WriteBackError::Protect {
                name,
                offset: *offset,
                source: io::Error::new(*kind, message.clone()),
            },
        }
    }
}

/// The error sequence (fsync's errseq): `seq` counts failures, `reported`
/// is `seq` as of the last report.
#[derive(Default)]
struct ErrSeq {
    seq: u64,
    reported: u64,
    last: Option<Failure>,
}

/// An object's write-back state.
#[derive(Default)]
pub(crate) struct ObjectWb {
    /// DIRTY pages (up on a clean → dirty `set_dirty` or a failed
    /// write-back, down on `begin_writeback`).
    pub(crate) dirty_pages: AtomicU64,
    /// A store write succeeded since the last `Store::sync` began.
    unsynced: AtomicBool,
    /// Held across a sync, so that no flush returns before the sync that
    /// covers its writes has ended.
    sync_lock: Mutex<()>,
    errors: Mutex<ErrSeq>,
}

impl ObjectWb {
    fn record(&self, failure: Failure) {
        let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        e.seq += 1;
        e.last = Some(failure);
    }

    /// Where a flush starts in the sequence.
    fn sample(&self) -> u64 {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reported
    }

    /// The failure to report to a flush that sampled `since`, if any;
    /// marks it reported.
    fn check(&self, since: u64) -> Option<Failure> {
        let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if e.seq == since {
            return None;
        }
        e.reported = e.reported.max(e.seq);
        e.last.clone()
    }
}

/// The SRCU domain of write faults: a write fault is a read section from
/// before it unprotects its page until after it set DIRTY, so a flush that
/// synchronizes it knows every write it must write back is visible as
/// DIRTY. `None` until the first writable mapping of this fork generation
/// (initialized there, never in a signal handler).
/// A forked child starts a domain of its own: a parent thread may have been
/// inside a read section or a synchronize at the fork.
pub(crate) fn write_faults() -> Option<&'static Srcu> {
    WRITE_FAULTS.get()
}

static WRITE_FAULTS: sys::ForkLocal<Srcu> = sys::ForkLocal::new();

/// Initializes [`write_faults`] for this fork generation (at the first
/// writable mapping of the process, or of a forked child).
pub(crate) fn init() {
    WRITE_FAULTS.get_or_init(Srcu::new);
}

/// Enters a write fault's read section (async-signal-safe once
/// initialized).
pub(crate) fn write_section() -> Option<ReadGuard<'static>> {
    write_faults().map(Srcu::read)
}

/// The regions that may map object pages `pages` writably: the object's
/// interval tree of mappings (`crate::mm::rmap`), O(log n + hits).
pub(crate) fn regions_over(object: &ObjectCore, pages: Range<ObjectPage>) -> Vec<Arc<Region>> {
    let mut regions = object.rmap.overlapping(pages);
    regions.retain(|r| r.writable && !r.map.is_disowned());
    regions
}

/// Writes back the DIRTY pages of object pages `pages` (not under
/// write-back already): the eviction hook and the flusher's step. Returns
/// the pages written. Does not sync.
pub(crate) fn write_back(object: &ObjectCore, pages: Range<u64>) -> Result<u64, WriteBackError> {
    let mut tally = Stats::default();
    let r = write_back_tally(object, pages, &mut tally);
    object.counters.add(&tally);
    r
}

/// [`write_back`], counting into `tally` (the caller adds it where it
/// belongs).
fn write_back_tally(
    object: &ObjectCore,
    pages: Range<u64>,
    tally: &mut Stats,
) -> Result<u64, WriteBackError> {
    let end = pages.end.min(object.cache.states.pages());
    let mut first_err = None;
    let mut start = pages.start;
    // 8 MiB a batch whatever the page size (4 pages of 2 MiB).
    let batch_pages = (BATCH / object.cache.page_size().base_pages()).max(1);
    while start < end {
        let batch = start..end.min(start.saturating_add(batch_pages));
        if let Err(e) = write_back_batch(object, batch.clone(), tally) {
            first_err.get_or_insert(e);
        }
        start = batch.end;
    }
    first_err.map_or(Ok(tally.written_back), Err)
}

/// W1 and W2 for a page the caller pinned (W0), inside a write section
/// ([`write_section`]): make its PTE writable (`unprotect`), then mark it
/// DIRTY, in that order (the module documentation says why; the loom
/// model runs this function). Returns whether the page was clean before.
pub(crate) fn dirty_after_unprotect(state: &PageState, unprotect: impl FnOnce()) -> bool {
    unprotect();
    state.set_dirty()
}

/// F0 and F1 for one page: pins it and moves it DIRTY → WRITEBACK. Returns
/// false (and holds no pin) if it is clean or under write-back already.
fn claim(state: &PageState) -> bool {
    // Lock-free: every failed CAS means the word moved (a pin, a CLOCK
    // visit), so retrying until the page is claimed or no longer claimable
    // always ends; giving up instead would let a flush return Ok with the
    // page still dirty.
    let mut seen = state.load();
    loop {
        if !seen.is_dirty() || seen.is_writeback() || seen.state() != State::UpToDate {
            return false;
        }
        match state.try_pin_io(seen) {
            Ok(()) => {
                if state.begin_writeback() {
                    return true;
                }
                state.unpin();
                return false;
            }
            Err(now) => seen = now,
        }
    }
}

/// What write-back does outside the page-state words: find a page's word,
/// write-protect runs of pages in every mapping (F2), copy a run to the
/// store (F3). The object's (`ObjectIo`) in production; the loom model
/// (`loom_models`) gives a PTE and a word of memory, and runs the same
/// [`write_back_pages`].
pub(crate) trait WbIo {
    /// The word of page `page`, if it has one.
    fn state(&self, page: u64) -> Option<&PageState>;
    /// F2 for `runs`.
    fn protect(&self, runs: &[Range<u64>]) -> Result<(), Failure>;
    /// F3 for `run`.
    fn copy(&self, run: Range<u64>) -> Result<(), Failure>;
    /// `n` pages were claimed (DIRTY → WRITEBACK): they are not dirty now.
    fn claimed(&self, _n: u64) {}
    /// `n` pages of a failed run are DIRTY again.
    fn redirtied(&self, _n: u64) {}
}

/// What [`write_back_pages`] did.
#[derive(Default)]
pub(crate) struct Pass {
    /// Pages written to the store.
    pub(crate) written: u64,
    /// Runs that failed.
    pub(crate) failed_runs: u64,
    /// The first failure.
    pub(crate) failure: Option<Failure>,
}

/// Steps F0 to F5 for `pages`: claim every dirty page (F0, F1), protect
/// them all (F2) before any copy, copy each run (F3; not if the protection
/// failed: the pages stay dirty), end each page's write-back (F4, a
/// failure sets DIRTY again) and unpin it (F5).
pub(crate) fn write_back_pages(io: &impl WbIo, pages: Range<u64>) -> Pass {
    let mut pass = Pass::default();
    // F0, F1. Claim.
    let claimed: Vec<u64> = pages.filter(|&p| io.state(p).is_some_and(claim)).collect();
    if claimed.is_empty() {
        return pass;
    }
    io.claimed(claimed.len() as u64);
    let runs = runs_of(&claimed);
    // F2. Protect everywhere, before any copy.
    let protected = io.protect(&runs);
    for run in &runs {
        // F3. Copy.
        let copied = match &protected {
            Ok(()) => io.copy(run.clone()),
            Err(f) => Err(f.clone()),
        };
        let ok = match copied {
            Ok(()) => {
                pass.written += run.end - run.start;
                true
            }
            Err(f) => {
                pass.failed_runs += 1;
                pass.failure.get_or_insert(f);
                false
            }
        };
        // F4, F5.
        let mut redirtied = 0;
        for p in run.clone() {
            if let Some(state) = io.state(p) {
                redirtied += u64::from(state.end_writeback(ok));
                state.unpin();
            }
        }
        io.redirtied(redirtied);
    }
    pass
}

/// The object's side of write-back: its page words, its writable
/// mappings (found through its rmap), its store.
struct ObjectIo<'a>(&'a ObjectCore);

impl WbIo for ObjectIo<'_> {
    fn state(&self, page: u64) -> Option<&PageState> {
        self.0.cache.states.get(ObjectPage(page))
    }

    fn protect(&self, runs: &[Range<u64>]) -> Result<(), Failure> {
        protect(self.0, runs)
    }

    fn claimed(&self, n: u64) {
        self.0.wb.dirty_pages.fetch_sub(n, Ordering::Relaxed);
    }

    fn redirtied(&self, n: u64) {
        self.0.wb.dirty_pages.fetch_add(n, Ordering::Relaxed);
    }

    fn copy(&self, run: Range<u64>) -> Result<(), Failure> {
        let object = self.0;
        copy_run(object, run.clone()).map_err(|e| {
            let failure = Failure::Write {
                offset: object.cache.offset(ObjectPage(run.start)),
                len: {
                    let bytes = object
                        .cache
                        .data_range(ObjectPage(run.start)..ObjectPage(run.end));
                    (bytes.end - bytes.start) as usize
                },
                kind: store_error_kind(&e),
                message: error_chain(&e),
            };
            // Recorded per run: every failed run is reported.
            object.wb.record(failure.clone());
            failure
        })
    }
}

/// Steps F0 to F5 for one batch of pages of `object`, with its counts.
fn write_back_batch(
    object: &ObjectCore,
    pages: Range<u64>,
    tally: &mut Stats,
) -> Result<(), WriteBackError> {
    let pass = write_back_pages(&ObjectIo(object), pages);
    let wb = &object.wb;
    tally.written_back += pass.written;
    tally.writeback_errors += pass.failed_runs;
    match pass.failure {
        None => Ok(()),
        Some(failure) => {
            if matches!(failure, Failure::Protect { .. }) {
                wb.record(failure.clone());
            }
            Err(failure.to_error(object.store.name()))
        }
    }
}

/// F2: write-protects object page runs `runs` in every writable region
/// over them.
fn protect(object: &ObjectCore, runs: &[Range<u64>]) -> Result<(), Failure> {
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
        return Ok(());
    };
    for region in regions_over(object, ObjectPage::range(first.start..last.end)) {
        let env = region.owner.env();
        for run in runs {
            let Some(pages) = region.region_pages(ObjectPage::range(run.clone())) else {
                continue;
            };
            let addr = region.addr_of(pages.start);
            let len = (pages.end.since(pages.start) as usize) << region.page_shift;
            let page = region.page_bytes();
            protect_range(env.engine, addr, len, page, true).map_err(|e| Failure::Protect {
                offset: object.cache.offset(region.object_page(pages.start)),
                kind: e.kind(),
                message: e.to_string(),
            })?;
        }
    }
    Ok(())
}

/// Write-protects every page of `[addr, addr + len)` that is registered
/// with `uffd` (`UFFDIO_WRITEPROTECT`), retrying `EAGAIN` (the address
/// space is changing).
///
/// The kernel stops at the first VMA in the range that is not registered
/// for WP with this userfaultfd and answers `ENOENT` (also for a range with
/// no VMA at all), leaving the VMAs after it unprotected: a range that the
/// application partly unmapped, or that another mapping now partly
/// covers. So on `ENOENT` the range is split in halves and each is
/// protected on its own, down to single pages of `page` bytes (the
/// region's page size): a page that still answers
/// `ENOENT` is not ours (nobody writes it through a faultmap mapping), and
/// every page that is gets protected.
///
/// `EAGAIN` means an UNMAP or REMAP event is waiting to be read (the
/// kernel refuses userfaultfd ioctls while the address space changes).
/// A pager thread reads it (in a passage: `crate::mm::events`), so a
/// caller outside any passage and with the events gate open (`patient`:
/// write-back) waits for it, up to `EAGAIN_PATIENCE`; the event handler
/// itself tries a few times only: waiting would wait for itself.
fn protect_range(
    engine: &PagingEngine,
    addr: HostAddr,
    len: usize,
    page: usize,
    patient: bool,
) -> io::Result<()> {
    // Under Protect an `mprotect`: no events, no registration to miss.
    let Some(uffd) = engine.uffd() else {
        return engine.protect_write(addr.get(), len);
    };
    let mut eagain = 0;
    let mut since = None;
    loop {
        match sys::uffd_writeprotect(uffd, addr.get(), len, true, false) {
            Ok(()) => return Ok(()),
            // A forked child's userfaultfd whose process has exited (or
            // exec'd): no PTE is left to write through.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                if len <= page {
                    return Ok(());
                }
                let half = (len / page).div_ceil(2) * page;
                protect_range(engine, addr, half, page, patient)?;
                return protect_range(engine, addr.add(half), len - half, page, patient);
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && eagain < MAX_EAGAIN => {
                uffd.note_event_waiting();
                eagain += 1;
                std::thread::yield_now();
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && patient => {
                uffd.note_event_waiting();
                let since = *since.get_or_insert_with(Instant::now);
                if since.elapsed() > EAGAIN_PATIENCE {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A writable region that took over a part of a mapping the application
/// moved (`mremap`, `crate::mm::events`): the kernel moved the part's PTEs,
/// writable ones included, before faultmap heard of the move, and a
/// write-back that write-protected the old range meanwhile (F2) missed
/// them, so a write through the new range may have landed after that
/// write-back cleared DIRTY, with no fault to mark it. So: protect the
/// whole new range (later writes fault as usual), then mark every cached
/// page of it DIRTY, as a write fault would (the next write-back copies
/// whatever was written, at worst a page that was clean).
pub(crate) fn adopt_moved(region: &Region) {
    let env = region.owner.env();
    if protect_range(
        env.engine,
        region.start(),
        region.map.len(),
        region.page_bytes(),
        false,
    )
    .is_err()
    {
        // The protection failed (the range is going away again): the
        // pages are still marked dirty below, and any later write-back
        // protects them again.
    }
    let _section = write_section();
    let object = &*region.object;
    for page in (0..region.pages).map(RegionPage) {
        let Some(state) = object.cache.states.get(region.object_page(page)) else {
            continue;
        };
        // Pin it while it is UPTODATE, however long the CAS takes: a page
        // left out here could lose a write. A page that is not UPTODATE
        // (absent, being read or evicted) has no PTE to write through.
        let mut seen = state.load();
        let pinned = loop {
            if seen.state() != State::UpToDate {
                break false;
            }
            match state.try_pin_io(seen) {
                Ok(()) => break true,
                Err(_) => {
                    std::hint::spin_loop();
                    seen = state.load();
                }
            }
        };
        if !pinned {
            continue;
        }
        if state.set_dirty() {
            object.wb.dirty_pages.fetch_add(1, Ordering::Relaxed);
        }
        state.unpin();
    }
}

/// The most bytes write-back copies out of the cache, and hands the store,
/// at once: the bounce buffer's size (see `copy_run`).
const COPY_CHUNK_PAGES: u64 = 512;

/// F3 for one run of pinned pages under write-back: copied out of the
/// cache into a bounce buffer (`Cache::copy_out`: the application may be
/// writing these pages meanwhile, so no `&[u8]` over them may exist), then
/// handed to `Store::write_at`, at most `COPY_CHUNK_PAGES` at a time.
fn copy_run(object: &ObjectCore, run: Range<u64>) -> Result<(), crate::StoreError> {
    let mut buf = Vec::new();
    let mut first = run.start;
    // 2 MiB at a time whatever the page size (one page of 2 MiB).
    let chunk = (COPY_CHUNK_PAGES / object.cache.page_size().base_pages()).max(1);
    while first < run.end {
        let end = run.end.min(first + chunk);
        let pages = ObjectPage(first)..ObjectPage(end);
        object.cache.copy_out(pages.clone(), &mut buf);
        // The copy mapped the alias's PTEs: drop them (see `Cache::fill`).
        object.cache.unmap_alias(pages);
        if buf.is_empty() {
            break;
        }
        let offset = object.cache.offset(ObjectPage(first));
        // A store that panics must not take the flusher (or the
        // application's flush) down: the panic is a failed write, and the
        // pages stay dirty.
        let store = &object.store;
        let written = panic::catch_unwind(AssertUnwindSafe(|| store.write_at(offset, &buf)));
        written.unwrap_or_else(|_| {
            Err(crate::StoreError::Write {
                name: store.name().to_string(),
                offset,
                len: buf.len(),
                source: io::Error::other("the store panicked"),
            })
        })?;
        first = end;
    }
    // Release: a flush that sees the page's write-back ended (its word,
    // Acquire) sees this too, and syncs.
    object.wb.unsynced.store(true, Ordering::Release);
    Ok(())
}

fn store_error_kind(e: &crate::StoreError) -> io::ErrorKind {
    match e {
        crate::StoreError::Write { source, .. } | crate::StoreError::Sync { source, .. } => {
            source.kind()
        }
        _ => io::ErrorKind::Other,
    }
}

/// An error and its sources, as one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Sleeps a little more each time (a write-back being waited for takes a
/// store write: tens of µs at least).
fn backoff(round: u32) {
    if round < 16 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Step 4 of `flush`: waits until no page of `pages` is under write-back;
/// returns those found DIRTY once their write-back ended.
fn wait_writeback(object: &ObjectCore, pages: Range<u64>) -> Vec<u64> {
    let states = &object.cache.states;
    let mut dirty = Vec::new();
    for p in pages.start..pages.end.min(states.pages()) {
        let Some(state) = states.get(ObjectPage(p)) else {
            continue;
        };
        let mut round = 0;
        let mut word = state.load();
        if !word.is_writeback() {
            continue;
        }
        while word.is_writeback() {
            round += 1;
            backoff(round);
            word = state.load();
        }
        if word.is_dirty() {
            dirty.push(p);
        }
    }
    dirty
}

/// msync(MS_SYNC) of object pages `pages`: see the module documentation.
/// `extra` counters (a mapping's, a pager's) get the tally too.
pub(crate) fn flush(
    object: &ObjectCore,
    pages: Range<u64>,
    extra: &[&Counters],
) -> Result<u64, WriteBackError> {
    // 1. Where this flush starts in the error sequence.
    let since = object.wb.sample();
    // 2. Write faults begun before the call have set DIRTY.
    if let Some(srcu) = write_faults() {
        srcu.synchronize();
    }
    let mut tally = Stats::default();
    // 3. Write back.
    let _ = write_back_tally(object, pages.clone(), &mut tally);
    // 4. Wait for other write-backs in the range; redo what they left dirty.
    loop {
        let dirty = wait_writeback(object, pages.clone());
        if dirty.is_empty() {
            break;
        }
        for run in runs_of(&dirty) {
            let _ = write_back_tally(object, run, &mut tally);
        }
    }
    object.counters.add(&tally);
    for c in extra {
        c.add(&tally);
    }
    // 5. Sync what was written (by anyone) since the last sync.
    sync(object);
    // 6. Report.
    match object.wb.check(since) {
        Some(failure) => Err(failure.to_error(object.store.name())),
        None => Ok(tally.written_back),
    }
}

/// Step 5 of `flush`: `Store::sync` if a write succeeded since the last
/// one; a failure is recorded in the error sequence.
fn sync(object: &ObjectCore) {
    let _serial = object
        .wb
        .sync_lock
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if !object.wb.unsynced.swap(false, Ordering::AcqRel) {
        return;
    }
    let store = &object.store;
    let synced = panic::catch_unwind(AssertUnwindSafe(|| store.sync())).unwrap_or_else(|_| {
        Err(crate::StoreError::Sync {
            name: store.name().to_string(),
            source: io::Error::other("the store panicked"),
        })
    });
    if let Err(e) = synced {
        object.wb.unsynced.store(true, Ordering::Release);
        object.wb.record(Failure::Sync {
            kind: store_error_kind(&e),
            message: error_chain(&e),
        });
    }
}

/// Whether `object` has pages to write back or a sync owed.
pub(crate) fn has_work(object: &ObjectCore) -> bool {
    object.wb.dirty_pages.load(Ordering::Acquire) != 0 || object.wb.unsynced.load(Ordering::Acquire)
}

/// The last handle of an object went: write its dirty pages back and sync,
/// best effort (errors are counted, nobody is left to report them to).
pub(crate) fn on_drop(object: &ObjectCore) {
    if !has_work(object) {
        return;
    }
    let _ = write_back(object, 0..object.cache.states.pages());
    sync(object);
}

// ---------------------------------------------------------------------------
// The background flusher.
// ---------------------------------------------------------------------------

enum Msg {
    /// Write back these object pages (`flush_async`).
    Range(Weak<ObjectCore>, Range<u64>),
    /// Write everything back and stop.
    Stop,
}

/// What the flusher needs from its pager.
pub(crate) struct FlusherEnv {
    /// The pager (its objects and counters).
    pub(crate) core: Arc<Core>,
    /// `Config::dirty_expire`.
    pub(crate) expire: Duration,
}

/// A pager's flusher thread.
pub(crate) struct Flusher {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread.
    pub(crate) fn start(env: FlusherEnv) -> io::Result<Flusher> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("faultmap-flush".into())
            .spawn(move || run(&env, &rx))?;
        Ok(Flusher {
            tx,
            thread: Some(thread),
        })
    }

    /// Queues object pages `pages` for write-back.
    pub(crate) fn queue(&self, object: &Arc<ObjectCore>, pages: Range<u64>) {
        let _ = self.tx.send(Msg::Range(Arc::downgrade(object), pages));
    }
}

impl Flusher {
    /// Tells the thread to stop (it writes back what is dirty first) and
    /// returns it, for the caller to join (or give up on: a store write
    /// that never returns keeps it).
    pub(crate) fn stop(mut self) -> Option<JoinHandle<()>> {
        let _ = self.tx.send(Msg::Stop);
        self.thread.take()
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The tick: `min(expire / 6, 5 s)`, at least 1 ms.
pub(crate) fn tick_of(expire: Duration) -> Duration {
    (expire / 6).min(MAX_TICK).max(Duration::from_millis(1))
}

/// When the flusher first saw each dirty page of one object.
struct Seen {
    object: Weak<ObjectCore>,
    pages: HashMap<u64, Instant>,
}

fn run(env: &FlusherEnv, rx: &Receiver<Msg>) {
    let tick = tick_of(env.expire);
    let mut seen: HashMap<usize, Seen> = HashMap::new();
    let mut next = Instant::now() + tick;
    loop {
        match rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(Msg::Range(object, pages)) => {
                if let Some(object) = object.upgrade() {
                    let mut tally = Stats::default();
                    let _ = write_back_tally(&object, pages, &mut tally);
                    object.counters.add(&tally);
                    env.core.counters.add(&tally);
                }
            }
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => {
                for object in live_objects(env) {
                    let mut tally = Stats::default();
                    let _ = write_back_tally(&object, 0..object.cache.states.pages(), &mut tally);
                    object.counters.add(&tally);
                    env.core.counters.add(&tally);
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                expire_pass(env, &mut seen);
                next = Instant::now() + tick;
            }
        }
    }
}

/// The pager's live objects (dropping the dead from its list).
fn live_objects(env: &FlusherEnv) -> Vec<Arc<ObjectCore>> {
    env.core.objects()
}

/// One tick: record newly dirty pages, write back the expired ones.
fn expire_pass(env: &FlusherEnv, seen: &mut HashMap<usize, Seen>) {
    let now = Instant::now();
    seen.retain(|_, s| s.object.strong_count() > 0);
    for object in live_objects(env) {
        let key = Arc::as_ptr(&object) as usize;
        if object.wb.dirty_pages.load(Ordering::Relaxed) == 0 && !seen.contains_key(&key) {
            continue;
        }
        let entry = seen.entry(key).or_insert_with(|| Seen {
            object: Arc::downgrade(&object),
            pages: HashMap::new(),
        });
        let mut still = HashMap::new();
        let mut expired = Vec::new();
        object.cache.states.for_each_dirty(|p, _| {
            let first = entry.pages.get(&p.0).copied().unwrap_or(now);
            if now.duration_since(first) >= env.expire {
                expired.push(p.0);
            } else {
                still.insert(p.0, first);
            }
        });
        entry.pages = still;
        let mut tally = Stats::default();
        for run in runs_of(&expired) {
            let _ = write_back_tally(&object, run, &mut tally);
        }
        object.counters.add(&tally);
        env.core.counters.add(&tally);
        if entry.pages.is_empty() && expired.is_empty() {
            seen.remove(&key);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_fork_child_gets_a_write_fault_domain_of_its_own() {
        // A parent thread may be inside a write fault's read section, or a
        // flush inside synchronize, at the fork: the child must not wait
        // on that domain's state. It has none until its own first writable
        // mapping, and then a new one.
        init();
        let parent = write_faults().expect("initialized") as *const Srcu as usize;
        assert!(sys::true_in_fork_child(|| {
            let none_yet = write_faults().is_none();
            init();
            none_yet && write_faults().is_some_and(|d| d as *const Srcu as usize != parent)
        }));
        assert_eq!(
            write_faults().map(|d| d as *const Srcu as usize),
            Some(parent)
        );
    }

    #[test]
    fn ticks_are_a_sixth_of_expire_at_most_5_s() {
        assert_eq!(tick_of(Duration::from_secs(30)), Duration::from_secs(5));
        assert_eq!(tick_of(Duration::from_secs(60)), Duration::from_secs(5));
        assert_eq!(
            tick_of(Duration::from_millis(600)),
            Duration::from_millis(100)
        );
        assert_eq!(tick_of(Duration::from_nanos(1)), Duration::from_millis(1));
    }

    #[test]
    fn errors_are_reported_once_to_each_flush_that_started_after_them() {
        let wb = ObjectWb::default();
        let before = wb.sample();
        assert!(wb.check(before).is_none());
        wb.record(Failure::Sync {
            kind: io::ErrorKind::Other,
            message: "x".into(),
        });
        let a = wb.sample();
        let b = wb.sample();
        assert!(wb.check(a).is_some(), "the next flush reports it");
        assert!(wb.check(b).is_some(), "a concurrent one too");
        let c = wb.sample();
        assert!(wb.check(c).is_none(), "then it is cleared");
    }

    #[test]
    fn runs_are_maximal() {
        assert_eq!(runs_of(&[]), vec![]);
        assert_eq!(runs_of(&[1, 2, 3, 7, 9, 10]), vec![1..4, 7..8, 9..11]);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::{claim, dirty_after_unprotect, write_back_pages, Failure, WbIo};
    use crate::cache::page_state::PageState;
    use loom::sync::atomic::{AtomicU64, Ordering};
    use loom::sync::{Arc, Mutex};
    use loom::thread;
    use std::ops::Range;

    /// The PTE and the page's bytes: the kernel checks writability and
    /// stores under the PTE lock (and a protect flushes the TLB), so a
    /// write and a protect are atomic with respect to each other.
    struct Pte {
        writable: bool,
        data: u64,
    }

    /// One page, its PTE, and the store: what the production write-back
    /// ([`write_back_pages`]) protects and copies in this model.
    struct Model {
        page: PageState,
        pte: Mutex<Pte>,
        stored: AtomicU64,
    }

    impl WbIo for Model {
        fn state(&self, page: u64) -> Option<&PageState> {
            (page == 0).then_some(&self.page)
        }
        fn protect(&self, _runs: &[Range<u64>]) -> Result<(), Failure> {
            self.pte.lock().unwrap().writable = false;
            Ok(())
        }
        fn copy(&self, _run: Range<u64>) -> Result<(), Failure> {
            let copy = self.pte.lock().unwrap().data;
            self.stored.store(copy, Ordering::Relaxed);
            Ok(())
        }
    }

    /// The writer (a write that faults while its PTE is protected: W0
    /// pin, then the production `dirty_after_unprotect`, W3 unpin) against
    /// one production write-back pass: every write ends up copied to the
    /// store or the page DIRTY.
    #[test]
    fn no_write_is_lost() {
        loom::model(|| writer_vs_write_back(false));
    }

    /// The same with the writer's steps swapped (set_dirty, then
    /// unprotect): loom finds the lost write, which is why
    /// `dirty_after_unprotect` does what it does in that order.
    #[test]
    #[should_panic(expected = "neither written back nor left dirty")]
    fn dirty_before_unprotect_loses_a_write() {
        loom::model(|| writer_vs_write_back(true));
    }

    fn writer_vs_write_back(dirty_first: bool) {
        let model = Arc::new(Model {
            page: PageState::new(),
            pte: Mutex::new(Pte {
                writable: false,
                data: 0,
            }),
            stored: AtomicU64::new(0),
        });
        assert!(model.page.begin_read());
        model.page.finish_read(false);
        let m = model.clone();
        // One write-back pass, the production one.
        let flusher = thread::spawn(move || {
            write_back_pages(&*m, 0..1);
        });
        for value in 1..=2u64 {
            loop {
                {
                    let mut pte = model.pte.lock().unwrap();
                    if pte.writable {
                        pte.data = value;
                        break;
                    }
                }
                // The WP fault. W0: pin.
                while model.page.try_pin_io(model.page.load()).is_err() {
                    thread::yield_now();
                }
                let unprotect = || model.pte.lock().unwrap().writable = true;
                if dirty_first {
                    model.page.set_dirty();
                    unprotect();
                } else {
                    dirty_after_unprotect(&model.page, unprotect);
                }
                model.page.unpin();
            }
        }
        flusher.join().unwrap();
        let w = model.page.load();
        assert!(
            model.stored.load(Ordering::Relaxed) == 2 || w.is_dirty(),
            "the last write was neither written back nor left dirty"
        );
        // A second pass (claim is the production F0+F1) must find it.
        if w.is_dirty() {
            assert!(claim(&model.page));
        }
    }
}
