//! Recording an access trace, and replaying one as prefetch.
//!
//! **Recording** (`MapOptions::record_trace`). A mapping that records
//! notes the object page of every fault it serves in a [`Recorder`]: one
//! bit per page says whether the page was seen, and the first fault on a
//! page appends it to a log, so the log is the pages in first-touch order.
//! Both are written from the fault path, which may run in a SIGBUS
//! handler: an atomic `fetch_or` on the bitmap, a `fetch_add` that claims
//! a log slot, a store into it, nothing else. `Mapping::trace` reads the
//! log into a [`Trace`] (`crate::base::trace`), skipping a slot claimed
//! and not yet written (a first touch racing the read, which a later read
//! sees).
//!
//! Only a fault is seen, never an access to a page already mapped, so a
//! recording mapping maps one page per fault (fault-around order 0,
//! whatever its options say): every first touch faults and is noted. A
//! recording run costs one minor fault per page touched (a few µs each)
//! on top of its reads.
//!
//! **Replay** (`MapOptions::replay_trace`). A mapping that replays a trace
//! has a thread, `faultmap-replay`, that walks the trace's *schedule*
//! ([`Replay`]: each trace page widened to its read-around unit, each unit
//! once, in first-touch order, cut into pieces of the store's largest
//! request, and never more than `ahead`) and reads each piece's pages that are not cached yet
//! ([`crate::mm::fault::read_ahead`], as `Advice::WillNeed` does), on the
//! pager's I/O threads, never more than `ahead` pages of the schedule past
//! what the application has used ([`Pacer`]):
//!
//! ```text
//!   schedule  [p0][p1][p2][p3][p4][p5][p6][p7]...[pN]
//!   used       ##  ##      ##                 ##        (a fault's window reached them)
//!   issued    ---------------------->|  issued <= used + ahead
//! ```
//!
//! The application *uses* a piece when a fault's fault-around window,
//! widened to whole read-around units, first overlaps it
//! ([`Replay::touch`], from the fault path: a binary search over the steps
//! sorted by page, a `fetch_or` per piece on a bitmap, then one add to the
//! pacer's word); the piece's pages then count as used, wherever the piece
//! is in the schedule. Every unit of the schedule holds a trace page, so
//! an application that follows the trace uses every piece, however units
//! and pieces are cut. A page touched early (an index, a footer) gives the
//! replay room and never skips it ahead; a piece already used is read all
//! the same (what is cached costs a look).
//!
//! A piece the replay read that the application never uses (it skipped
//! that part of the trace, or unmapped it) would hold its room for good.
//! So when the replay has no room it *forgives* the oldest piece it read
//! and nobody used, once the application's faults have used `ahead` pages
//! since it was read ([`Replay::forgive`], on the replay thread): the piece
//! counts as used, and spends as many of the faults' pages, so forgiving
//! never feeds itself: the replay never goes faster than the faults. An
//! application whose threads read the trace's parts in another order (one
//! far ahead, one behind) so lets the replay read the slow one's part at
//! most at the pace of the fast one: more than `ahead` in hand, but no
//! more than the faults have used. A piece no region maps any more is taken as used
//! when the replay reaches it. An application that leaves the trace stops
//! the replay `ahead` pages later. Under a memory budget `ahead` is at
//! most a quarter of the budget, and pages that do not fit when their
//! piece is read are left out, as readahead leaves them (a later fault
//! reads them).
//!
//! Layer rule: `crate::mm`; uses the base, cache and policy layers below
//! and the fault path's `read_ahead`.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::base::index::{ObjectPage, RegionPage};
use crate::base::stats::{RaTally, Stats};
use crate::base::trace::Trace;
use crate::mm::fault;
use crate::mm::space::{Region, RegionTable};
use crate::sync::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// A region's trace hooks: what its faults note.
#[derive(Clone, Default)]
pub(crate) struct RegionTrace {
    /// Recording: every first touch is logged.
    pub(crate) record: Option<Arc<Recorder>>,
    /// Replaying: faults move the replay's pacer.
    pub(crate) replay: Option<Arc<Replay>>,
}

impl RegionTrace {
    /// Notes a fault on object page `page`, about to be mapped in this
    /// region with its fault-around window `window` (the region is known
    /// to be the address's): logs the page if this is its first fault,
    /// and tells the replay the window is used. Returns whether the page
    /// was logged (a first touch). Async-signal-safe: atomics and a futex
    /// wake.
    pub(crate) fn touch(&self, page: ObjectPage, window: Range<ObjectPage>) -> bool {
        self.reached(window);
        self.record.as_ref().is_some_and(|r| r.touch(page))
    }

    /// Tells the replay that a fault with fault-around window `window`
    /// came, before the fault knows it will map anything (a miss parks
    /// first). Async-signal-safe.
    pub(crate) fn reached(&self, window: Range<ObjectPage>) {
        if let Some(replay) = &self.replay {
            replay.touch(window);
        }
    }

    /// Whether the region records (and so maps one page per fault).
    pub(crate) fn records(&self) -> bool {
        self.record.is_some()
    }
}

/// The first-touch log of a recording mapping (see the module
/// documentation).
pub(crate) struct Recorder {
    /// The object page the bitmap and the log count from.
    base: u64,
    /// One bit per page from `base`: set by the page's first fault.
    seen: Box<[AtomicU32]>,
    /// Pages (from `base`) plus one, in first-touch order; 0 in a slot
    /// claimed and not yet written. One slot per page: each is logged at
    /// most once.
    log: Box<[AtomicU32]>,
    /// The next free slot of `log`.
    next: AtomicUsize,
}

impl Recorder {
    /// A recorder for object pages `pages`, or `None` if it cannot be
    /// had: more than 2^32 - 1 pages (16 TiB), or no memory for its log.
    /// The log takes 4 bytes per page of the mapping, in address space:
    /// a zeroed allocation that large is fresh anonymous memory, backed
    /// only as pages are touched (under `vm.overcommit_memory=2` it counts
    /// in full).
    pub(crate) fn new(pages: Range<ObjectPage>) -> Option<Recorder> {
        let n = pages.end.0.checked_sub(pages.start.0)?;
        if n >= u64::from(u32::MAX) {
            return None;
        }
        let n = usize::try_from(n).ok()?;
        Some(Recorder {
            base: pages.start.0,
            seen: zeroed_atomics(n.div_ceil(32))?,
            log: zeroed_atomics(n)?,
            next: AtomicUsize::new(0),
        })
    }

    /// Notes a fault on object page `page`; returns whether it was the
    /// page's first (and so logged). Async-signal-safe.
    pub(crate) fn touch(&self, page: ObjectPage) -> bool {
        // Only the pages it was made for (the bitmap's last word may have
        // bits past them); fewer than 2^32 - 1 of them (`new`).
        let Some(i) = page
            .0
            .checked_sub(self.base)
            .filter(|&i| i < self.log.len() as u64)
        else {
            return false;
        };
        let i = i as u32;
        let Some(word) = self.seen.get((i / 32) as usize) else {
            return false;
        };
        let bit = 1u32 << (i % 32);
        if word.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
            return false;
        }
        // One slot per page, and each page claims one at most once: the
        // log never runs out.
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        if let Some(entry) = self.log.get(slot) {
            entry.store(i + 1, Ordering::Release);
        }
        true
    }

    /// The object pages logged so far, in first-touch order.
    pub(crate) fn pages(&self) -> impl Iterator<Item = u64> + '_ {
        let n = self.next.load(Ordering::Acquire).min(self.log.len());
        self.log[..n]
            .iter()
            .map(|e| e.load(Ordering::Acquire))
            .filter(|&e| e != 0)
            .map(|e| self.base + u64::from(e) - 1)
    }
}

/// `n` atomics, all zero, from a zeroed allocation (so that a large one
/// is backed only where written); `None` if it cannot be had.
#[cfg(not(loom))]
fn zeroed_atomics(n: usize) -> Option<Box<[AtomicU32]>> {
    if n == 0 {
        return Some(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<AtomicU32>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0, and an AtomicU32 is 4
    // bytes).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<AtomicU32>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is a live allocation of `layout`, the layout of an
    // `[AtomicU32; n]`, which is how a `Box<[AtomicU32]>` of `n` frees it;
    // all-zero bytes are a valid `AtomicU32` (it has the in-memory
    // representation of a `u32`), 0.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)) })
}

/// Loom's atomics are not plain memory: made one by one.
#[cfg(loom)]
fn zeroed_atomics(n: usize) -> Option<Box<[AtomicU32]>> {
    Some((0..n).map(|_| AtomicU32::new(0)).collect())
}

/// How far a replay reads ahead of the application by default, at least,
/// in pages (16 MiB).
pub(crate) const DEFAULT_AHEAD: u64 = 4096;

/// How far a replay reads ahead of the application by default, at most,
/// in pages (32 MiB): few enough that an application that leaves the
/// trace wastes little.
pub(crate) const DEFAULT_AHEAD_MAX: u64 = 8192;

/// How far a replay in units of `unit` pages reads ahead by default:
/// `io_depth` units, so that a trace of scattered touches keeps every
/// request slot busy (a remote store's 1 MiB units and 32 requests: 32
/// MiB), within [`DEFAULT_AHEAD`]..=[`DEFAULT_AHEAD_MAX`] 4 KiB pages;
/// in the object's pages, each `base` 4 KiB pages (512 for 2 MiB pages: 8
/// to 16 of them).
pub(crate) fn default_ahead(unit: u64, io_depth: usize, base: u64) -> u64 {
    let base = base.max(1);
    (unit
        .saturating_mul(io_depth as u64)
        .saturating_mul(base)
        .clamp(DEFAULT_AHEAD, DEFAULT_AHEAD_MAX)
        / base)
        .max(1)
}

/// How much of the schedule the application has used and how far the
/// replay has gone, and the replay's sleep while it is `ahead` pages past
/// what was used. The faulting side is async-signal-safe (one
/// compare-and-swap loop, and a futex wake when the replay sleeps); the
/// replay side sleeps on a futex.
///
/// The pages used, the replay's "asleep" flag and the stop flag share one
/// word, so that a fault that adds to the pages used sees whether the
/// replay sleeps in the same atomic step, and a replay that goes to sleep
/// does so only if nothing was added since it looked (no lost wake-up,
/// and no store-then-load ordering across two words to get right).
pub(crate) struct Pacer {
    /// The schedule's pages used (in pieces a fault reached), with
    /// [`SLEEPING`] and [`STOPPED`].
    state: AtomicU64,
    /// The schedule's pages the replay has gone past.
    issued: AtomicU64,
    /// The pages the application's faults used (those of `state` but
    /// what the replay took as used itself: [`Pacer::credit`]).
    by_faults: AtomicU64,
    /// Bumped to wake the replay (its futex word).
    bell: AtomicU32,
    /// The most pages the replay goes past beyond those used.
    pub(crate) ahead: u64,
}

/// The replay is asleep, or about to be: a fault that adds to the pages
/// used rings the bell.
const SLEEPING: u64 = 1 << 63;
/// The mapping is going away: the replay stops.
const STOPPED: u64 = 1 << 62;
/// The bits that count the pages used.
const USED: u64 = STOPPED - 1;

/// The longest the replay sleeps before it looks again by itself (a
/// safety net: every page used rings while it waits, and so does a
/// stop).
const PACER_NAP: Duration = Duration::from_secs(1);

impl Pacer {
    pub(crate) fn new(ahead: u64) -> Pacer {
        Pacer {
            state: AtomicU64::new(0),
            issued: AtomicU64::new(0),
            by_faults: AtomicU64::new(0),
            bell: AtomicU32::new(0),
            ahead: ahead.max(1),
        }
    }

    /// A fault used `pages` more pages of the schedule. Async-signal-safe.
    pub(crate) fn consume(&self, pages: u64) {
        if pages == 0 {
            return;
        }
        // Before the state word's update, which is a release: a replay
        // that sees the new word (acquire) sees this too, and one that
        // goes to sleep on the old word fails its compare-and-swap and
        // looks again (`wait_for_room`; loom model
        // `loom_models_trace_pacer_forgives_on_the_faults_pages`).
        self.by_faults.fetch_add(pages, Ordering::Relaxed);
        self.credit(pages);
    }

    /// The pages the application's faults used so far.
    pub(crate) fn used_by_faults(&self) -> u64 {
        self.by_faults.load(Ordering::Relaxed)
    }

    /// Takes `pages` more pages as used, for the replay itself: pieces
    /// nobody maps any more, or that the application left behind
    /// ([`Replay::run`]).
    pub(crate) fn credit(&self, pages: u64) {
        if pages == 0 {
            return;
        }
        let moved = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                // Adding clears SLEEPING: this call rings.
                let used = (s & USED).saturating_add(pages).min(USED);
                Some((s & STOPPED) | used)
            });
        if matches!(moved, Ok(prev) if prev & SLEEPING != 0) {
            self.ring();
        }
    }

    fn ring(&self) {
        self.bell.fetch_add(1, Ordering::AcqRel);
        #[cfg(not(loom))]
        crate::sys::futex_wake(&self.bell, 1);
    }

    /// Waits until the schedule's pages `[pos, pos + len)` are at most
    /// `ahead` past the pages used (`len <= ahead`, or it may never be).
    /// Each time it finds no room it first asks `forgive`, which may take
    /// pages as used itself ([`Pacer::credit`]) and returns whether it
    /// did. Returns false if the replay must stop.
    pub(crate) fn wait_for_room(
        &self,
        pos: u64,
        len: u64,
        mut forgive: impl FnMut() -> bool,
    ) -> bool {
        let room = |used: u64| pos + len <= used.saturating_add(self.ahead);
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & STOPPED != 0 {
                return false;
            }
            if room(s & USED) {
                return true;
            }
            if forgive() {
                continue;
            }
            // The bell before the flag: a ring after the flag is set
            // changes it, and the sleep below then returns at once.
            let bell = self.bell.load(Ordering::Acquire);
            let asleep =
                self.state
                    .compare_exchange(s, s | SLEEPING, Ordering::AcqRel, Ordering::Acquire);
            if asleep.is_ok() {
                self.nap(bell);
            }
        }
    }

    #[cfg(not(loom))]
    fn nap(&self, bell: u32) {
        crate::sys::futex_wait(&self.bell, bell, Some(PACER_NAP));
    }

    /// Loom has no futex: the replay yields until the bell rings, as a
    /// futex wait without its timeout would sleep (a lost ring leaves it
    /// yielding for ever, which the model reports).
    #[cfg(loom)]
    fn nap(&self, bell: u32) {
        let _ = PACER_NAP;
        while self.bell.load(Ordering::Acquire) == bell {
            loom::thread::yield_now();
        }
    }

    /// The replay has gone past the schedule's pages `[0, pos)`.
    pub(crate) fn issued(&self, pos: u64) {
        self.issued.store(pos, Ordering::Release);
    }

    /// Stops the replay (it wakes if asleep).
    pub(crate) fn stop(&self) {
        self.state.fetch_or(STOPPED, Ordering::AcqRel);
        self.ring();
    }

    /// Whether [`Pacer::stop`] was called.
    pub(crate) fn stopped(&self) -> bool {
        self.state.load(Ordering::Acquire) & STOPPED != 0
    }

    /// Where the replay and the application are: the schedule's pages
    /// gone past and used, and whether the replay sleeps.
    pub(crate) fn progress(&self) -> (u64, u64, bool) {
        let s = self.state.load(Ordering::Acquire);
        (
            self.issued.load(Ordering::Acquire),
            s & USED,
            s & SLEEPING != 0,
        )
    }
}

/// A trace being replayed on a mapping: its schedule of reads, which of
/// its pieces the application has used, and the pacer.
///
/// The schedule: each trace page of the mapping widened to its *unit*,
/// the aligned block of `unit` pages that holds it (the size of the window
/// the mapping's read-around reads on a miss; one page with readahead
/// off), each unit once, in the order the trace first reaches it; units
/// that follow each other merged into one step. So the replay reads about
/// what the recording run's misses read around each first touch, but
/// ahead of time and many requests at once. Each step is cut into pieces
/// of at most `piece` pages (the store's largest request, and never more
/// than `ahead`): the unit of reading and of use. A fault whose
/// fault-around window overlaps a piece uses it: the piece's pages count
/// as used (once), wherever it is in the schedule (see the module
/// documentation).
///
/// Building it costs time and memory in the trace's runs, not in its
/// pages: a run's units other than its first and last lie wholly inside
/// it, and runs are disjoint, so only those two can be another run's. The
/// bitmap of used pieces costs a bit per piece.
pub(crate) struct Replay {
    /// Object pages to read, in order; disjoint, non-empty.
    steps: Box<[Range<u64>]>,
    /// The pages of all steps.
    pages: u64,
    /// `first_piece[i]`: the pieces of steps `0..i`.
    first_piece: Box<[u64]>,
    /// Step indices sorted by first page: a fault's window to its steps.
    by_page: Box<[usize]>,
    /// One bit per piece, set when a fault's window first overlaps it.
    used: Box<[AtomicU32]>,
    /// The read-around unit, in pages: a fault uses the pieces of the
    /// units its window lies in.
    unit: u64,
    /// The largest read, in pages.
    piece: u64,
    pub(crate) pacer: Pacer,
}

impl Replay {
    /// The replay of `trace` on a mapping of object pages `pages`, in
    /// units of `unit` pages, reads of at most `piece` pages, at most
    /// `ahead` pages of the schedule past those the application used;
    /// `None` if there is no memory for its bitmap.
    pub(crate) fn new(
        trace: &Trace,
        pages: Range<u64>,
        unit: u64,
        piece: u64,
        ahead: u64,
    ) -> Option<Replay> {
        let unit = unit.max(1);
        let ahead = ahead.max(1);
        let piece = piece.clamp(1, ahead);
        let unit_pages = |u: u64| {
            let start = u.saturating_mul(unit).max(pages.start);
            start..u.saturating_add(1).saturating_mul(unit).min(pages.end)
        };
        let mut boundary_units = std::collections::HashSet::new();
        let mut steps: Vec<Range<u64>> = Vec::new();
        for run in trace.runs() {
            let run = run.start.max(pages.start)..run.end.min(pages.end);
            if run.is_empty() {
                continue;
            }
            let (first, last) = (run.start / unit, (run.end - 1) / unit);
            let first_new = boundary_units.insert(first);
            let read = if first == last {
                if first_new {
                    unit_pages(first)
                } else {
                    continue;
                }
            } else {
                let last_new = boundary_units.insert(last);
                let start = if first_new {
                    unit_pages(first).start
                } else {
                    unit_pages(first).end
                };
                let end = if last_new {
                    unit_pages(last).end
                } else {
                    unit_pages(last).start
                };
                start..end
            };
            if read.is_empty() {
                continue;
            }
            match steps.last_mut() {
                Some(last) if last.end == read.start => last.end = read.end,
                _ => steps.push(read),
            }
        }
        let total = steps.iter().map(|s| s.end - s.start).sum();
        let mut pieces = 0u64;
        let first_piece = steps
            .iter()
            .map(|s| {
                let at = pieces;
                pieces += (s.end - s.start).div_ceil(piece);
                at
            })
            .collect();
        let used = zeroed_atomics(usize::try_from(pieces.div_ceil(32)).ok()?)?;
        let mut by_page: Vec<usize> = (0..steps.len()).collect();
        by_page.sort_by_key(|&i| steps[i].start);
        Some(Replay {
            steps: steps.into_boxed_slice(),
            pages: total,
            first_piece,
            by_page: by_page.into_boxed_slice(),
            used,
            unit,
            piece,
            pacer: Pacer::new(ahead),
        })
    }

    /// How many pages the schedule reads.
    pub(crate) fn pages(&self) -> u64 {
        self.pages
    }

    /// The step that reads object page `page`, if any.
    #[cfg(all(test, not(loom)))]
    fn step_of(&self, page: u64) -> Option<usize> {
        let i = self
            .by_page
            .partition_point(|&s| self.steps[s].start <= page);
        let step = *self.by_page.get(i.checked_sub(1)?)?;
        self.steps[step].contains(&page).then_some(step)
    }

    /// Piece `k` of step `i`: its object pages.
    fn piece_pages(&self, i: usize, k: u64) -> Range<u64> {
        let step = &self.steps[i];
        let start = step.start + k * self.piece;
        start..step.end.min(start.saturating_add(self.piece))
    }

    /// The replay has no room: the oldest piece it read that the
    /// application has not used, if the application's faults have used
    /// `ahead` pages since (it skipped that piece, or another thread will
    /// come to it late), is taken as used, so that pieces never used do
    /// not hold the room for good. A piece taken so spends as many of the
    /// faults' pages (`hand.spent`), so that what it frees is never freed
    /// again: the replay goes at most as fast as the faults, `ahead`
    /// behind them, whatever it forgives. Returns whether one was.
    fn forgive(&self, hand: &mut InHand) -> bool {
        hand.drop_used(self);
        let left = self.pacer.used_by_faults().saturating_sub(hand.spent);
        match hand.pieces.front() {
            Some(&(n, len, at)) if left >= at.saturating_add(self.pacer.ahead) => {
                hand.pieces.pop_front();
                if self.mark_used(n) {
                    hand.spent += len;
                    self.pacer.credit(len);
                }
                true
            }
            _ => false,
        }
    }

    /// Marks the pieces that object pages `window` overlap used; returns
    /// how many pages they hold, those marked by this call only.
    /// Async-signal-safe: atomics only; at most one bitmap word per piece
    /// of the window.
    fn use_window(&self, window: Range<u64>) -> u64 {
        let mut pages = 0;
        // The first step that ends past the window's start (steps are
        // disjoint, so sorted by start they are sorted by end too).
        let from = self
            .by_page
            .partition_point(|&s| self.steps[s].end <= window.start);
        for &i in self.by_page[from..].iter() {
            let step = &self.steps[i];
            if step.start >= window.end {
                break;
            }
            let lo = window.start.max(step.start) - step.start;
            let hi = window.end.min(step.end) - step.start;
            for k in lo / self.piece..hi.div_ceil(self.piece) {
                let n = self.first_piece[i] + k;
                let bit = 1u32 << (n % 32);
                let Some(word) = self.used.get((n / 32) as usize) else {
                    break;
                };
                // A look first: the pieces of a unit in use are set already,
                // and a write would bounce the word between CPUs.
                if word.load(Ordering::Relaxed) & bit == 0
                    && word.fetch_or(bit, Ordering::Relaxed) & bit == 0
                {
                    let p = self.piece_pages(i, k);
                    pages += p.end - p.start;
                }
            }
        }
        pages
    }

    /// A fault whose fault-around window is object pages `window`: the
    /// pieces of the units it lies in are used (each unit of the schedule
    /// holds a trace page, so a faithful application uses every piece,
    /// however the units are cut). Async-signal-safe.
    pub(crate) fn touch(&self, window: Range<ObjectPage>) {
        let start = window.start.0 / self.unit * self.unit;
        let end = window.end.0.div_ceil(self.unit).saturating_mul(self.unit);
        self.pacer.consume(self.use_window(start..end));
    }

    /// Marks piece `n` (of all the schedule's) used, if no fault did;
    /// returns whether this call did.
    fn mark_used(&self, n: u64) -> bool {
        let bit = 1u32 << (n % 32);
        self.used
            .get((n / 32) as usize)
            .is_some_and(|w| w.fetch_or(bit, Ordering::Relaxed) & bit == 0)
    }

    /// Whether piece `n` (of all the schedule's) was used.
    fn is_used(&self, n: u64) -> bool {
        let bit = 1u32 << (n % 32);
        self.used
            .get((n / 32) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & bit != 0)
    }

    /// The replay thread: reads the schedule ahead of the application
    /// into the cache of `region`'s object (through the regions that took
    /// over parts of it), until it ends or the mapping stops it.
    pub(crate) fn run(&self, region: &Arc<Region>) {
        let mut pos = 0u64;
        let mut hand = InHand::default();
        for (i, step) in self.steps.iter().enumerate() {
            for k in 0..(step.end - step.start).div_ceil(self.piece) {
                let pages = self.piece_pages(i, k);
                let len = pages.end - pages.start;
                let n = self.first_piece[i] + k;
                // A piece the application used is read all the same: its
                // faults read their windows, which may be less than the
                // piece (what is cached already costs a look).
                let room = self
                    .pacer
                    .wait_for_room(pos, len, || self.forgive(&mut hand));
                if !room {
                    return;
                }
                hand.drop_used(self);
                if !self.is_used(n) {
                    let at = self.pacer.used_by_faults().saturating_sub(hand.spent);
                    hand.pieces.push_back((n, len, at));
                }
                // A piece no region maps any more (the application
                // unmapped it) will never be used: it is, now, so that it
                // holds no room.
                if prefetch(region, pages.clone()) == 0 {
                    self.pacer.credit(self.use_window(pages));
                }
                pos += len;
                self.pacer.issued(pos);
            }
        }
    }
}

/// The replay thread's pieces read and not used yet, oldest first, for
/// [`Replay::forgive`]. At most one entry (24 bytes) per piece read, and a
/// piece holds at least a page of cache: well under 1 % of what the
/// replay read.
#[derive(Default)]
struct InHand {
    /// (piece, its pages, the faults' pages less `spent` when it was read).
    pieces: std::collections::VecDeque<(u64, u64, u64)>,
    /// The faults' pages that forgiven pieces spent.
    spent: u64,
}

impl InHand {
    /// Lets go of the oldest pieces that were used since.
    fn drop_used(&mut self, replay: &Replay) {
        while self
            .pieces
            .front()
            .is_some_and(|&(n, _, _)| replay.is_used(n))
        {
            self.pieces.pop_front();
        }
    }
}

/// Reads object pages `pages` that are not cached into the cache, through
/// whichever regions serve them now, and counts them as replayed; returns
/// how many of them those regions map.
fn prefetch(region: &Arc<Region>, pages: Range<u64>) -> u64 {
    let core = &region.owner;
    let env = core.env();
    let lives = region.live(&RegionTable::get().lock());
    let mut ra = RaTally::default();
    let mut tally = Stats::default();
    for live in &lives {
        let Some(part) = live.region_pages(ObjectPage::range(pages.clone())) else {
            continue;
        };
        let part: Range<RegionPage> = part;
        tally.trace_replayed += part.end.since(part.start);
        let (io, refault) = fault::read_ahead(&env, live, part, &mut ra);
        tally.io_count += io;
        tally.refault += refault;
    }
    region.ra.add(&ra);
    region.counters.add(&tally);
    region.object.ra.add(&ra);
    region.object.counters.add(&tally);
    core.ra.add(&ra);
    core.counters.add(&tally);
    tally.trace_replayed
}

/// A replay's thread, stopped and joined when this is dropped (its
/// mapping's drop; a forked child forgets the parent's instead: the thread
/// is not in the child).
pub(crate) struct ReplayThread {
    replay: Arc<Replay>,
    /// Taken only by the drop.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReplayThread {
    /// Starts `faultmap-replay` on `region`, which replays `replay`.
    pub(crate) fn start(region: Arc<Region>, replay: Arc<Replay>) -> std::io::Result<Self> {
        let r = replay.clone();
        let thread = std::thread::Builder::new()
            .name("faultmap-replay".into())
            .spawn(move || r.run(&region))?;
        Ok(Self {
            replay,
            thread: Some(thread),
        })
    }

    fn finished(&self) -> bool {
        self.thread.as_ref().map_or(true, |t| t.is_finished())
    }

    /// Where the replay and the application are, in pages of the schedule:
    /// gone past, used by the application; and whether the replay waits
    /// for the application.
    pub(crate) fn progress(&self) -> (u64, u64, bool) {
        let (issued, used, sleeping) = self.replay.pacer.progress();
        (issued, used, sleeping && !self.finished())
    }

    /// The pages the replay reads in all.
    pub(crate) fn pages(&self) -> u64 {
        self.replay.pages()
    }

    /// Whether the replay went through the whole trace.
    pub(crate) fn is_done(&self) -> bool {
        self.finished() && !self.replay.pacer.stopped()
    }
}

impl Drop for ReplayThread {
    /// Stops the thread and waits for it (it only submits reads, so this
    /// is quick).
    fn drop(&mut self) {
        self.replay.pacer.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::base::config::PageSize;
    use proptest::prelude::Strategy;

    #[test]
    fn the_log_holds_each_page_once_in_first_touch_order() {
        let r = Recorder::new(ObjectPage(10)..ObjectPage(200)).unwrap();
        for p in [50, 11, 50, 12, 199, 11, 9, 200, 10] {
            r.touch(ObjectPage(p));
        }
        assert_eq!(r.pages().collect::<Vec<_>>(), vec![50, 11, 12, 199, 10]);
    }

    #[test]
    fn page_by_page_the_schedule_is_the_trace() {
        let trace = Trace::from_pages(1 << 30, PageSize::Base, "o", None, [7, 8, 9, 2, 100, 3]);
        let replay = Replay::new(&trace, 0..1 << 18, 1, 256, 16).unwrap();
        assert_eq!(&*replay.steps, &[7..10, 2..3, 100..101, 3..4]);
        assert_eq!(&*replay.first_piece, &[0, 1, 2, 3]);
        assert_eq!(replay.pages(), 6);
        assert_eq!(replay.piece, 16, "never more than ahead");
        let steps: Vec<Option<usize>> = [7, 9, 2, 100, 3, 0, 4, 10, 99, 101]
            .iter()
            .map(|&p| replay.step_of(p))
            .collect();
        assert_eq!(
            steps,
            [
                Some(0),
                Some(0),
                Some(1),
                Some(2),
                Some(3),
                None,
                None,
                None,
                None,
                None
            ]
        );
        // A fault's window uses the pieces it overlaps, each once.
        assert_eq!(replay.use_window(8..9), 3, "the piece 7..10");
        assert_eq!(replay.use_window(0..16), 2, "2..3 and 3..4 (7..10 is used)");
        assert_eq!(replay.use_window(7..10), 0, "used already");
        assert_eq!(replay.use_window(100..101), 1);
        assert_eq!(replay.use_window(101..512), 0, "no piece there");
    }

    #[test]
    fn units_are_read_once_in_first_touch_order() {
        // Units of 32 pages on a 200-page object: 5 is unit 0, 100 unit 3,
        // 7 unit 0 again, 33 unit 1, 64 unit 2, 199 unit 6 (cut at 200).
        let trace = Trace::from_pages(
            200 * 4096,
            PageSize::Base,
            "o",
            None,
            [5, 100, 7, 33, 64, 199],
        );
        let replay = Replay::new(&trace, 0..200, 32, 64, 1000).unwrap();
        assert_eq!(&*replay.steps, &[0..32, 96..128, 32..96, 192..200]);
        assert_eq!(replay.pages(), 32 + 32 + 64 + 8);
        assert_eq!(
            replay.step_of(40),
            Some(2),
            "a page of a unit the trace reached"
        );
        assert_eq!(replay.step_of(150), None);
        assert_eq!(replay.use_window(40..41), 64, "one piece of 64");
        let replay = Replay::new(&trace, 0..200, 32, 32, 1000).unwrap();
        assert_eq!(replay.use_window(40..41), 32, "pieces of 32");
        assert_eq!(replay.use_window(60..70), 32, "the next piece");
        assert_eq!(replay.use_window(0..200), 32 + 32 + 8);
        // A mapping of pages 40..120: pages 5, 7, 33 and 199 are outside
        // it, and unit 3 is cut at its end.
        let replay = Replay::new(&trace, 40..120, 32, 64, 1000).unwrap();
        assert_eq!(&*replay.steps, &[96..120, 64..96]);
    }

    #[test]
    fn a_long_run_costs_one_step_not_one_per_page() {
        // One run over 2^36 pages (256 TiB), page by page and in units.
        let whole = 0..1 << 36;
        let trace = Trace::with_runs(1 << 48, vec![whole.clone()]);
        for unit in [1, 32, 256] {
            let replay = Replay::new(&trace, 0..1 << 36, unit, 2048, 4096).unwrap();
            assert_eq!(replay.steps.to_vec(), vec![whole.clone()]);
            assert_eq!(replay.use_window(5000..5001), 2048, "its piece");
            assert_eq!(replay.use_window((1 << 36) - 1..1 << 36), 2048, "the last");
        }
        // Runs that share their boundary units read each unit once: units
        // 0 to 3, then unit 4 (120..130's unit 3 is read already; 0..5 and
        // 100..110 are in units read already).
        let trace = Trace::with_runs(1 << 20, vec![10..100, 0..5, 120..130, 100..110]);
        let replay = Replay::new(&trace, 0..1 << 20, 32, 2048, 4096).unwrap();
        assert_eq!((replay.steps.len(), replay.steps[0].clone()), (1, 0..160));
        assert_eq!(replay.pages(), 160);
    }

    #[test]
    fn a_fault_uses_the_pieces_of_its_units() {
        // Units of 64 pages cut into pieces of 16: a fault on one page
        // uses its unit's four pieces.
        let pages: Vec<u64> = (0..16).map(|i| i * 64 + 5).collect();
        let trace = Trace::from_pages(1024 * 4096, PageSize::Base, "o", None, pages);
        let replay = Replay::new(&trace, 0..1024, 64, 256, 16).unwrap();
        assert_eq!(replay.piece, 16);
        replay.touch(ObjectPage(5)..ObjectPage(6));
        assert_eq!(replay.pacer.progress().1, 64);
        replay.touch(ObjectPage(70)..ObjectPage(71));
        assert_eq!(replay.pacer.progress().1, 128);
        // A mapping that starts inside a unit: its first step starts
        // there, and its pieces straddle units; the units' faults still
        // use them all.
        let trace = Trace::from_pages(1024 * 4096, PageSize::Base, "o", None, [130, 300, 301]);
        let replay = Replay::new(&trace, 100..1024, 256, 256, 1000).unwrap();
        assert_eq!(replay.steps.to_vec(), vec![100..512]);
        replay.touch(ObjectPage(130)..ObjectPage(131));
        replay.touch(ObjectPage(300)..ObjectPage(301));
        assert_eq!(replay.pacer.progress().1, replay.pages());
    }

    proptest::proptest! {
        /// Every trace page of the mapping is read by exactly one step,
        /// steps never overlap and stay inside the mapping, and windows
        /// use every page of the schedule exactly once, whatever their
        /// order.
        #[test]
        fn every_trace_page_has_one_step(
            pages in proptest::sample::subsequence((0u64..600).collect::<Vec<_>>(), 0..120)
                .prop_shuffle(),
            unit in 1u64..70,
            piece in 1u64..200,
            ahead in 1u64..300,
            map in (0u64..300, 300u64..=600),
            windows in proptest::collection::vec((0u64..600, 1u64..40), 0..60),
        ) {
            let trace = Trace::from_pages(600 * 4096, PageSize::Base, "o", None, pages.clone());
            let mapped = map.0..map.1;
            let replay = Replay::new(&trace, mapped.clone(), unit, piece, ahead).unwrap();
            proptest::prop_assert!(replay.piece <= ahead);
            let mut covered = std::collections::HashSet::new();
            for s in replay.steps.iter() {
                proptest::prop_assert!(!s.is_empty());
                proptest::prop_assert!(s.start >= mapped.start && s.end <= mapped.end);
                for p in s.clone() {
                    proptest::prop_assert!(covered.insert(p), "page {} read twice", p);
                }
            }
            for &p in &pages {
                let step = replay.step_of(p);
                if mapped.contains(&p) {
                    proptest::prop_assert!(step.is_some_and(|i| replay.steps[i].contains(&p)));
                } else {
                    proptest::prop_assert!(step.is_none());
                }
            }
            // The model: a window uses each piece it overlaps, once.
            let pieces: Vec<Range<u64>> = replay
                .steps
                .iter()
                .flat_map(|s| {
                    (s.start..s.end)
                        .step_by(replay.piece as usize)
                        .map(move |a| a..s.end.min(a + replay.piece))
                })
                .collect();
            let mut used = vec![false; pieces.len()];
            let mut total = 0;
            for (start, len) in windows.into_iter().chain([(0, 600)]) {
                let w = start..start + len;
                let mut want = 0;
                for (i, p) in pieces.iter().enumerate() {
                    if p.start < w.end && w.start < p.end && !used[i] {
                        used[i] = true;
                        want += p.end - p.start;
                    }
                }
                let got = replay.use_window(w);
                proptest::prop_assert_eq!(got, want);
                total += got;
            }
            proptest::prop_assert_eq!(total, replay.pages(), "the last window uses them all");
        }
    }

    #[test]
    fn the_pacer_waits_for_the_application_and_stops() {
        let pacer = Arc::new(Pacer::new(4));
        assert!(
            pacer.wait_for_room(0, 4, || false),
            "the first window is free"
        );
        let p = pacer.clone();
        let waiter = std::thread::spawn(move || p.wait_for_room(4, 2, || false));
        // Not past 6 - 4 = 2 pages used yet: the waiter sleeps until
        // faults have used 2.
        pacer.consume(1);
        pacer.consume(0);
        pacer.consume(1);
        assert!(waiter.join().unwrap());
        let p = pacer.clone();
        let stopped = std::thread::spawn(move || p.wait_for_room(100, 1, || false));
        pacer.stop();
        assert!(!stopped.join().unwrap());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two threads fault on the same page and on one page each, at once:
    /// every page is logged exactly once, and a read after both sees all.
    #[test]
    fn loom_models_trace_recorder_logs_each_page_once() {
        loom::model(|| {
            let r = Arc::new(Recorder::new(ObjectPage(0)..ObjectPage(4)).unwrap());
            let r2 = r.clone();
            let t = thread::spawn(move || {
                let a = r2.touch(ObjectPage(1));
                let b = r2.touch(ObjectPage(2));
                u32::from(a) + u32::from(b)
            });
            let a = r.touch(ObjectPage(1));
            let b = r.touch(ObjectPage(3));
            let logged = t.join().unwrap() + u32::from(a) + u32::from(b);
            assert_eq!(logged, 3, "page 1 is logged by one thread only");
            let mut pages: Vec<u64> = r.pages().collect();
            pages.sort_unstable();
            assert_eq!(pages, vec![1, 2, 3]);
        });
    }

    /// The replay waits for room while a fault moves the application on:
    /// it always gets its room (no lost wake-up), whatever the order.
    #[test]
    fn loom_models_trace_pacer_never_misses_the_application() {
        loom::model(|| {
            let pacer = Arc::new(Pacer::new(1));
            let p = pacer.clone();
            let fault = thread::spawn(move || p.consume(1));
            assert!(pacer.wait_for_room(1, 1, || false));
            fault.join().unwrap();
        });
    }

    /// A replay that waits while its mapping stops it always stops.
    #[test]
    fn loom_models_trace_pacer_always_stops() {
        loom::model(|| {
            let pacer = Arc::new(Pacer::new(1));
            let p = pacer.clone();
            let stop = thread::spawn(move || p.stop());
            assert!(!pacer.wait_for_room(5, 1, || false));
            stop.join().unwrap();
        });
    }

    /// The replay waits for room that only forgiveness can give: it
    /// must see the faults' pages (a separate word from the one it sleeps
    /// on) whatever the order, and never sleep through them.
    #[test]
    fn loom_models_trace_pacer_forgives_on_the_faults_pages() {
        loom::model(|| {
            let pacer = Arc::new(Pacer::new(1));
            let p = pacer.clone();
            let fault = thread::spawn(move || p.consume(1));
            // Room at 2 used: the fault's page, and one forgiven on it.
            let mut forgiven = false;
            let room = pacer.wait_for_room(2, 1, || {
                if !forgiven && pacer.used_by_faults() >= 1 {
                    forgiven = true;
                    pacer.credit(1);
                    return true;
                }
                false
            });
            assert!(room);
            fault.join().unwrap();
        });
    }
}
