//! On-demand readahead and mmap read-around: which pages to read on a miss.
//!
//! # The problem
//!
//! A miss costs a store round trip, and the reader waits for it. Reading one
//! page per miss pays that latency once per page; reading a large window on
//! every miss wastes I/O and memory on random access. Like the kernel, faultmap
//! sizes each read from the access pattern it has seen: a window *around* a
//! random-looking miss (mmap read-around), a small window that doubles or
//! quadruples on a sequential stream (on-demand readahead), and, for a
//! stream, the next window started *before* the reader gets there (async
//! readahead at the marker). This module is the kernel's
//! `do_sync_mmap_readahead` / `do_async_mmap_readahead` (mm/filemap.c) and
//! `page_cache_sync_ra` / `page_cache_async_ra` (mm/readahead.c) as pure
//! functions: no syscalls, no locks, no clocks. The fault path
//! (`crate::mm::fault`) owns the state, asks, and reads what it is told.
//!
//! # State
//!
//! One [`RaState`] per object, the kernel's `struct file_ra_state` (one per
//! open file; every mmap fault on that file uses it):
//!
//! - `start`, `size`, `async_size`: the most recent readahead window. The
//!   last `async_size` pages are "ahead"; the first of them carries the
//!   marker (the kernel's `PG_readahead`).
//! - `mmap_miss`: misses minus hits, in `0..=MMAP_MISS_MAX`; read-around
//!   stops while it is above [`MMAP_LOTSAMISS`].
//! - `prev`: the last page the previous fault mapped. The kernel's
//!   `prev_pos` plays this part for `read()`; see "Sequential detection".
//!
//! `ra_pages` (the largest window) is a [`Params`] field rather than state:
//! it is a property of the mapping, per store and overridable per mapping.
//!
//! # The window and its marker
//!
//! ```text
//!                           |<-------- async_size ------->|
//!   |----------------------- size ----------------------->|
//!   |=======================#=============================|
//!   ^start                  ^marker = start + size - async_size
//!
//!   fault-around may map every page (U) but the marker (.):
//!    UUUUUUUUUUUUUUUUUUUUUUU.UUUUUUUUUUUUUUUUUUUUUUUUUUUUU
//!                           ^ left unmapped: the reader's touch faults
//! ```
//!
//! The kernel marks the page with `PG_readahead` and finds the bit on a later
//! page-cache hit. Userspace cannot see that bit, so faultmap keeps the marker
//! in its own page-state word ([`crate::cache::page_state`]) and fault-around never
//! maps a marked page: the reader's first touch of it faults (a MINOR fault,
//! the data is there), which is the "hit on a `PG_readahead` page". That fault
//! clears the marker and calls [`on_hit`] with `marker` set; if the marker is
//! the one the state predicts, the next window starts right after this one:
//!
//! ```text
//!   before:  [start ........ #marker ........ start+size)
//!   after:                                    [start' ................ start'+size')
//!                                             #marker' (async_size' = size')
//! ```
//!
//! As in the kernel, only pages the window newly reads are marked: if the
//! marker page was cached already the fault path does not mark it and the
//! stream falls back to sync readahead at its next miss. [`Window::marker`]
//! says which page to mark; the policy never asks whether it was.
//!
//! # Triggers
//!
//! A fault on a page that is **not cached** calls [`on_miss`]
//! (`do_sync_mmap_readahead`), which always returns a window containing the
//! page (the fault waits for part of it, `sync`):
//!
//! | case | window | pattern | state |
//! |---|---|---|---|
//! | `Mode::Off`, `ra_pages == 0`, `Hint::Random` | the page | `Random` | untouched |
//! | `Hint::Sequential` | `page_cache_sync_ra(index, ra_pages)` | `Initial` or `Random` | per branch |
//! | sequential miss (`Normal`, `Full`) | `page_cache_sync_ra(index, 1)`: `[index, +init_size(1))` | `Initial` | window |
//! | `mmap_miss > MMAP_LOTSAMISS` | the page | `Random` | `mmap_miss` |
//! | any other miss | `[index - ar/2, +ar)`, marker at `ar/4` from its end (`AroundOnly`: `ra_pages`, no marker) | `Around` | window, `mmap_miss` |
//!
//! `ar` is [`Params::around_pages`]: `ra_pages`, as in the kernel, for a
//! local file.
//!
//! `page_cache_sync_ra(index, req)` takes its initial-window branch
//! (`size = init_size(req, ra)`, `async_size = size - req`, or `size / 2`
//! when that is 0) at page 0 and when the miss is sequential; otherwise it
//! looks for cached history right before `index` (context readahead: the
//! pages a stream would have left behind, at most `ra_pages` of them, found
//! through [`CacheView`]). With more than `req` such pages it starts a window
//! of that many (twice as many if the cache holds everything from page 0),
//! capped at `ra_pages`, with a one-page async tail; otherwise it reads
//! exactly `req` pages and leaves the state alone. With the requests the
//! fault path makes, context readahead never fires: a sequential `Normal`
//! miss takes the initial branch, and a `Hint::Sequential` miss asks for
//! `ra_pages` while at most `ra_pages` pages of history are looked at. So a
//! `MADV_SEQUENTIAL` reader that starts in the middle of a cold file reads
//! exact `ra_pages` windows with no marker, as observed on 6.18, until a
//! miss right after its previous fault's pages takes the initial branch.
//!
//! A fault on a page that **is cached** calls [`on_hit`]
//! (`do_async_mmap_readahead`): `mmap_miss` is paid down by one, and if the
//! page carried the marker, `page_cache_async_ra` decides the next window
//! (never `sync`):
//!
//! - the marker is the state's own (`index == start + size - async_size`):
//!   the stream goes on, `start += size`, `size = next_size(size)`,
//!   `async_size = size` (pattern `Subsequent`);
//! - any other marker (interleaved streams sharing one state, or a state
//!   that moved on): the first page after `index` that is not cached, within
//!   `ra_pages`, is where the old window's read-ahead part ended; a window of
//!   `next_size(gap - index + ar)` starts there (pattern `Marker`; always
//!   `ra_pages` pages when `ar` is `ra_pages`, since the mmap path asks for
//!   `ra_pages`). No such gap: nothing.
//!
//! Fault-around calls [`on_fault_around`] with the number of pages it mapped:
//! they are hits the fault path never saw, and pay `mmap_miss` down. Every
//! fault that mapped something calls [`on_mapped`] with the last page it
//! mapped.
//!
//! Which fields each entry point may write, so a caller can run the hot ones
//! without the window's lock: [`on_hit`] without a marker, [`on_fault_around`]
//! and [`on_mapped`] touch only `mmap_miss` and `prev`; [`on_miss`] and
//! [`on_hit`] with a marker also read and write `start`, `size` and
//! `async_size`.
//!
//! # Sizes
//!
//! ```text
//!   init_size(req, max): n = roundup_pow_of_two(req)
//!                        4n if n <= max/32, 2n if n <= max/4, else max
//!   next_size(cur, max): 4cur if cur < max/16, 2cur if cur <= max/2, else max
//!
//!   max = 32:    sequential misses from page 0 read 4, 8, 16, 32, 32, ...
//!   max = 2048:  4, 16, 64, 256, 512, 1024, 2048, 2048, ...
//! ```
//!
//! # Sequential detection
//!
//! Since the sequential mmap readahead series (Wu Fengguang's "sequential mmap readahead", 2009) a miss
//! whose page follows the previous one is treated as a stream:
//! `offset - 1 == prev_pos >> PAGE_SHIFT` sends it to sync readahead instead
//! of read-around. In that kernel `filemap_fault` set `prev_pos` to the
//! faulting page, and there was no fault-around yet (3.15), so a sequential
//! reader faulted page by page. faultmap maps a fault-around window per
//! fault, so a sequential reader's next
//! miss is one past the *window*, not one past the faulting page: `prev` is
//! the last page the previous fault mapped, and a miss is sequential when
//! `prev == index - 1`, or when it is at page 0 before any fault (Wu's test is
//! also true there: `prev_pos` starts at -1). A sequential miss starts a
//! small window with `req = 1`, Wu's case B; his case C (`req = ra_pages`,
//! full windows from the start) cut I/O count further in his table, at the
//! price of reading a full window on every accidental `prev + 1` hit of a
//! random reader. The same `prev` feeds `page_cache_sync_ra`'s own
//! `index - prev <= 1` test for `Hint::Sequential`.
//!
//! A sequential reader mostly never misses after its first window: each
//! marker starts the next window while the reader is still in the current
//! one. Read-around windows carry a marker too (`async_size = around_pages/4`,
//! as in 6.12; the original read-around had none), so a stream that began with
//! a random-looking miss turns into `Subsequent` windows at its first marker.
//!
//! # `mmap_miss`
//!
//! Read-around is a bet that neighbours of a miss will be used. `mmap_miss`
//! rises by one per read-around miss (up to [`MMAP_MISS_MAX`]) and falls by
//! one per hit and by one per page fault-around maps; while it is above
//! [`MMAP_LOTSAMISS`] a miss reads only its page. Sequential misses and
//! `Hint::Sequential` skip the bookkeeping, as in the kernel (the readahead series'
//! test comes before it). The throttle is per object: a random reader
//! through one mapping turns read-around off for all of them, as one
//! `file_ra_state` does for every mapping of a file.
//!
//! # Read-around on a remote store
//!
//! The kernel reads `ra_pages` around a random miss: on a disk, a seek costs
//! far more than the extra pages. A remote store's readahead window is large
//! (tens of MiB: it must cover the link's bandwidth times its first-byte
//! latency), and reading that much around every random miss would fetch,
//! and hold in memory, megabytes per page used. So a store may ask for a
//! smaller read-around window ([`Params::around_pages`]; 1 MiB for the HTTP
//! and S3 stores, about a millisecond of transfer at 1 GB/s against a
//! round trip of 20 to 100 ms): a random miss reads that much, and a stream
//! that begins there grows out of it at its markers (4x, then 2x per
//! window) to full `ra_pages` windows. A marker that is not the state's own
//! (`Pattern::Marker`) starts a window of `next_size(gap - index + ar)`
//! where the kernel asks for `ra_pages`: a young stream found that way
//! grows from the small window too, and one in full swing, whose read-ahead
//! part reaches far past its marker, gets full windows as before. Only
//! [`Mode::Full`] uses the smaller window: read-around alone
//! ([`Mode::AroundOnly`]) has no marker to grow from, so it reads
//! `ra_pages` around every miss, as the kernel's read-around does.
//!
//! # Adaptive read-around
//!
//! `mmap_miss` switches read-around off when its pages go unused, but only
//! after a hundred net misses, and fault-around's credit keeps it from
//! ever getting there on a remote store (each miss maps 16 neighbours: 15
//! "hits"). Its other half is missing too: a window that is used does not
//! grow. Where the store asks for a smaller read-around window than
//! `ra_pages` (a remote store: [`adapts`]), the window adapts to use:
//!
//! - [`on_used`] counts the pages of read-around windows mapped by a fault
//!   whose own page a read-around window read and which is used for the
//!   first time: a hit on a window. The pages carry a bit from their claim
//!   to their first pin (AROUND, `crate::cache::page_state`), so the count
//!   has no time horizon and takes no lock. (The neighbours a *miss* maps
//!   prove nothing: they are mapped because they are near, not because
//!   they are used. Pages read by a stream's readahead, a prefetch or a
//!   trace replay prove nothing about read-around either. A hit's
//!   neighbours are counted with it: once mapped, they are never seen
//!   again, and in a dense random phase they are used soon; in a sparse
//!   one hits are rare anyway.)
//! - At a read-around miss, once the pages read around since the last
//!   decision add up to [`AROUND_EPOCH`] windows: if at least half of them
//!   were used the window doubles (up to `ra_pages`); if fewer than an
//!   eighth were, it halves (down to [`MIN_AROUND_PAGES`], the fault-around
//!   window); both counts are then halved, so that late uses still count.
//!
//! Sparse random reads of a large object then cost a round trip and 64 KiB
//! per miss instead of 1 MiB; dense random reads of a region grow to few
//! large requests. The window starts at the store's `around_pages`. The
//! counts are updated racily, as `mmap_miss` is: they are estimates.
//!
//! # Modes
//!
//! [`Mode::Full`] is the above. [`Mode::AroundOnly`] is read-around alone (case A of the readahead mails)
//! (2.6.30): read-around windows without a marker, the `mmap_miss` throttle,
//! no sequential detection and no async readahead; `Hint::Sequential` reads
//! `ra_pages` pages from the faulting page, `Hint::Random` one page.
//! [`Mode::Off`] reads the faulting page alone.
//!
//! # Invariants
//!
//! For an `index` inside the object (the precondition: `filemap_fault` raises
//! SIGBUS beyond EOF before asking, and so does the fault path):
//!
//! - a window lies inside `0..object_pages`; a miss's window contains
//!   `index` and has at least one page;
//! - `size <= max(ra_pages, 1)`, and under `Mode::Full` a read-around
//!   (`Around`) window has at most `around_pages.clamp(1, ra_pages)` pages
//!   where it does not adapt ([`adapts`]), and at least
//!   `min(MIN_AROUND_PAGES, around_pages)` where it does (clipped at the
//!   object's ends);
//! - `async_size <= size`, so the marker, if any, is a page of the window;
//! - in the state, `async_size <= size` and `mmap_miss <= MMAP_MISS_MAX`;
//! - no input panics or overflows: indices near `u64::MAX`, `ra_pages` up to
//!   `u64::MAX`, `object_pages == 0` (arithmetic saturates; a scan of the
//!   cache costs at most `ra_pages` queries, as the kernel's does).
//!
//! # Known inaccuracies and deviations
//!
//! - **Read-around window.** Under [`Mode::Full`] a random miss reads
//!   `around_pages` (the kernel: `ra_pages`), and a marker that is not the
//!   state's own asks for `around_pages` (the kernel: `ra_pages`). Both are
//!   the kernel's when a store does not ask for less; see "Read-around on a
//!   remote store".
//! - **`prev`** is the last page of the run of pages the previous fault
//!   mapped around the faulting page (its fault-around run's end), not the
//!   faulting page itself, and is set by every fault (6.12 no longer updates `prev_pos` from faults at
//!   all, so its sequential test is inert for mmap; faultmap keeps seed
//!   001's).
//! - **EOF.** Windows are clipped to the object (`eof` set when the clip
//!   cut something). A marker past the clipped end is dropped and
//!   `async_size` shrinks to keep it on the same page, as the kernel's
//!   large-folio path (`page_cache_ra_order`) does; its order-0 fallback
//!   (`do_page_cache_ra`) instead moves the marker back by the clipped
//!   amount. The state keeps the unclipped window, as the kernel's does, so
//!   an async window past EOF updates the state and reads nothing (`None`).
//! - **Subsequent size.** 6.12 takes `max(size, next_size(size))` so that a
//!   THP window (1024 pages, larger than `ra_pages`) keeps its size;
//!   faultmap has no THP windows and takes `next_size`, which is the same
//!   whenever `size <= ra_pages` and caps a window inherited from a mapping
//!   with a larger `ra_pages`.
//! - **Folios.** Every page is order 0: the kernel's rounding of the
//!   expected marker to the folio size, large-folio orders and the
//!   alignment of async windows do not apply.
//! - **`io_pages`, cgroup congestion, `FMODE_RANDOM`, writeback** (the
//!   `PG_reclaim` alias) do not exist here. The request is never larger
//!   than `ra_pages` on a fault, so `io_pages` would not change the window.
//! - **Gap scans.** `page_cache_prev_miss`/`next_miss` are modelled by their
//!   documented contract: a scan that finds no gap within `ra_pages` reports
//!   one just outside the range (older kernels returned the last index
//!   scanned, one page closer). Pages past the object count as gaps.
//! - **Retried faults** (`FAULT_FLAG_TRIED`) skip async readahead in the
//!   kernel; the fault path calls [`on_hit`] at most once per fault.
//! - **Fault-around's credit.** The kernel subtracts only the mapped pages
//!   that are not in the workingset; faultmap has no workingset and
//!   subtracts them all.
//! - **Throttled and random misses.** The kernel reads the page with
//!   `read_folio`, outside readahead; faultmap reports it as a one-page
//!   `Random` window so that the readahead table's `random` row counts it. Context
//!   readahead (Wu's `context` row) counts as `Initial`.
//! - **An empty state** (`size == 0`) predicts no marker: a stale marker
//!   hit then goes to the gap search (the kernel would "continue" a
//!   zero-sized window at `start`).
//!
//! # Sources
//!
//! Linux 6.12.117 mm/readahead.c (`page_cache_sync_ra`,
//! `page_cache_async_ra`, `get_init_ra_size`, `get_next_ra_size`,
//! `page_cache_ra_order`, `do_page_cache_ra`) and mm/filemap.c
//! (`do_sync_mmap_readahead`, `do_async_mmap_readahead`, `filemap_map_pages`),
//! 6.1's `ondemand_readahead`, as summarized in `kernel-mechanisms.md` §2;
//! the 6.18 observations of its §6.3 (read-around `[284..315]` for a fault at
//! 300; `MADV_SEQUENTIAL` windows `[300..331]`, `[340..371]`); Wu
//! Fengguang, "[PATCH 7/9] readahead: sequential mmap readahead" and its
//! A/B/C table (April 2009).

use std::ops::Range;

/// The kernel's default readahead window: 128 KiB (`VM_READAHEAD_PAGES`).
pub const DEFAULT_RA_PAGES: u64 = 32;

/// Read-around stops while `mmap_miss` is above this (`MMAP_LOTSAMISS`):
/// when a file's misses outnumber its hits by more than a hundred, the
/// pages read around each miss are mostly not used ("It will only hurt").
pub const MMAP_LOTSAMISS: u32 = 100;

/// `mmap_miss` never rises above this (`MMAP_LOTSAMISS * 10`), so that a
/// long random phase is paid back by a bounded number of hits.
pub const MMAP_MISS_MAX: u32 = MMAP_LOTSAMISS * 10;

/// The smallest adaptive read-around window: 16 pages (64 KiB), the
/// default fault-around window, which a miss maps anyway.
pub const MIN_AROUND_PAGES: u64 = 16;

/// How many windows' worth of read-around pages an adaptive decision
/// looks at (see "Adaptive read-around").
pub const AROUND_EPOCH: u64 = 4;

/// The access-pattern hint of a range of a mapping (the part of `madvise`
/// that is state: `VM_RAND_READ` / `VM_SEQ_READ`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hint {
    /// No hint: read-around, sequential detection, async readahead.
    #[default]
    Normal,
    /// `MADV_SEQUENTIAL`: full windows of `ra_pages` from the faulting page.
    Sequential,
    /// `MADV_RANDOM`: no readahead; one page per miss.
    Random,
}

/// Which readahead faultmap runs (for comparisons; `Full` is the kernel's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The kernel's: read-around, sequential detection and ramp-up, async
    /// readahead at the marker, the `mmap_miss` throttle.
    #[default]
    Full,
    /// Case A of the readahead mails: read-around on every miss, nothing else (no
    /// sequential detection, no marker, no async readahead).
    AroundOnly,
    /// No readahead: read only the faulting page.
    Off,
}

/// What the policy may ask about the cache (a query, not a syscall).
pub trait CacheView {
    /// Whether page `index` is in the cache (up to date or being read).
    fn is_cached(&self, index: u64) -> bool;
}

/// The readahead state of one object (`struct file_ra_state`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaState {
    /// First page of the most recent window.
    pub start: u64,
    /// Pages in that window.
    pub size: u64,
    /// Pages at the window's tail that are "ahead"; the marker is at
    /// `start + size - async_size`.
    pub async_size: u64,
    /// Misses minus hits, clamped to `0..=MMAP_MISS_MAX`.
    pub mmap_miss: u32,
    /// The last page of the run the previous fault mapped around its page,
    /// for sequential detection; `None` before the first fault.
    pub prev: Option<u64>,
    /// The adaptive read-around window, in pages (see "Adaptive
    /// read-around"); 0 before the first read-around miss.
    pub around: u64,
    /// Pages read by read-around windows since the window last changed
    /// (halved at each decision).
    pub around_read: u64,
    /// Read-ahead pages used since then ([`on_used`]; halved at each
    /// decision).
    pub around_used: u64,
}

/// The fixed inputs of a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// The largest window (`ra_pages`); 0 disables readahead.
    pub ra_pages: u64,
    /// The read-around window under [`Mode::Full`], and the request of a
    /// window at a marker that is not the state's own (the kernel's is
    /// `ra_pages`; a remote store's is smaller, see "Read-around on a remote
    /// store"). Taken as `1..=ra_pages`. [`Mode::AroundOnly`] reads
    /// `ra_pages`.
    pub around_pages: u64,
    /// The object's length in pages (windows are clipped to it).
    pub object_pages: u64,
    /// The hint of the range the fault is in.
    pub hint: Hint,
    /// Which readahead runs.
    pub mode: Mode,
    /// Whether the read-around window may adapt (see [`adapts`]); `false`
    /// keeps `around_pages` (`MapOptions::fixed_read_around`).
    pub adapt: bool,
}

/// Why a window was read: the rows of the readahead table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// A sync window started by a sequential miss (or at page 0), or by
    /// context readahead.
    Initial,
    /// An async window at the marker the previous window set.
    Subsequent,
    /// An async window at a marker that does not match the state
    /// (interleaved streams): found by the gap search.
    Marker,
    /// mmap read-around centred on a non-sequential miss.
    Around,
    /// Exactly the requested pages (random access, `MADV_RANDOM`, the
    /// `mmap_miss` throttle, readahead off).
    Random,
}

/// A readahead decision: the pages to read (those not cached yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// First page.
    pub start: u64,
    /// Pages, at least 1 for a miss, clipped to the object.
    pub size: u64,
    /// Pages at the tail that are ahead; 0: no marker.
    pub async_size: u64,
    /// Why.
    pub pattern: Pattern,
    /// Started by a miss (the faulting thread waits for part of it).
    pub sync: bool,
    /// Clipped at the object's end.
    pub eof: bool,
}

impl Window {
    /// The pages of the window.
    pub fn pages(&self) -> Range<u64> {
        self.start..self.start.saturating_add(self.size)
    }

    /// The page that gets the readahead marker, if any.
    pub fn marker(&self) -> Option<u64> {
        (self.async_size > 0 && self.async_size <= self.size)
            .then(|| self.start.saturating_add(self.size - self.async_size))
    }
}

/// The first window of a stream (`get_init_ra_size`): for a request of
/// `req` pages and a largest window of `max`, 4x the request rounded up to
/// a power of two when that is small against `max`, 2x when it is
/// moderate, else `max`. With `max = 32`: `req` 1-2 → 4, 3-4 → 8, 5-8 → 16,
/// more → 32. Never more than `max`.
pub fn init_size(req: u64, max: u64) -> u64 {
    // roundup_pow_of_two; past 2^63 it is larger than any max/4 anyway.
    let n = req.checked_next_power_of_two().unwrap_or(u64::MAX);
    if n <= max / 32 {
        4 * n
    } else if n <= max / 4 {
        2 * n
    } else {
        max
    }
}

/// The window after one of `cur` pages (`get_next_ra_size`): 4x while
/// small, 2x up to half of `max`, then `max`. With `max = 32`: 4 → 8 → 16 →
/// 32 → 32. Never more than `max`.
pub fn next_size(cur: u64, max: u64) -> u64 {
    if cur < max / 16 {
        4 * cur
    } else if cur <= max / 2 {
        2 * cur
    } else {
        max
    }
}

/// A fault on page `index`, which is not cached: the window to read
/// (`do_sync_mmap_readahead` and `page_cache_sync_ra`). Always contains
/// `index`.
///
/// Precondition: `index < p.object_pages` (beyond the object, the fault
/// path raises SIGBUS instead of asking). For an index beyond, the answer is
/// the page alone, with `eof` set, and the state is untouched.
pub fn on_miss(state: &mut RaState, p: &Params, index: u64, cache: &impl CacheView) -> Window {
    if index >= p.object_pages {
        return Window {
            start: index,
            size: 1,
            async_size: 0,
            pattern: Pattern::Random,
            sync: true,
            eof: true,
        };
    }
    let max = p.ra_pages;
    // 1. No readahead: the page alone.
    if p.mode == Mode::Off || max == 0 || p.hint == Hint::Random {
        return exact(p, index, 1);
    }
    // 2. MADV_SEQUENTIAL: a full window from the page, no mmap_miss.
    if p.hint == Hint::Sequential {
        return match p.mode {
            Mode::Full => sync_ra(state, p, index, max, cache),
            _ => exact(p, index, max),
        };
    }
    // 3. A sequential miss (sequential mmap readahead): sync readahead, no mmap_miss.
    if p.mode == Mode::Full && is_sequential_miss(state.prev, index) {
        return sync_ra(state, p, index, 1, cache);
    }
    // 4. Read-around, unless misses far outnumber hits.
    state.mmap_miss = state.mmap_miss.saturating_add(1).min(MMAP_MISS_MAX);
    if state.mmap_miss > MMAP_LOTSAMISS {
        return exact(p, index, 1);
    }
    // The smaller read-around window only where a stream can grow out of
    // it (at its marker); read-around alone reads `ra_pages`, the kernel's.
    let (around, async_size) = if p.mode == Mode::Full {
        let around = adapt_around(state, p);
        (around, around / 4)
    } else {
        (max, 0)
    };
    state.start = index.saturating_sub(around / 2);
    state.size = around;
    state.async_size = async_size;
    clip(p, state.start, around, async_size, Pattern::Around, true)
        .unwrap_or_else(|| exact(p, index, 1))
}

/// A fault on page `index`, which is cached (`do_async_mmap_readahead`);
/// `marker`: the page carried the readahead marker and this fault cleared
/// it. Returns the async window to read, if any (`page_cache_async_ra`).
///
/// Without `marker` only `mmap_miss` changes.
pub fn on_hit(
    state: &mut RaState,
    p: &Params,
    index: u64,
    marker: bool,
    cache: &impl CacheView,
) -> Option<Window> {
    if p.mode == Mode::Off || p.hint == Hint::Random || p.ra_pages == 0 {
        return None;
    }
    if index >= p.object_pages {
        return None;
    }
    state.mmap_miss = state.mmap_miss.saturating_sub(1).min(MMAP_MISS_MAX);
    if !marker || p.mode != Mode::Full {
        return None;
    }
    async_ra(state, p, index, cache)
}

/// Whether a fault under `p` consumes a readahead marker it finds: only
/// where async readahead runs. Elsewhere (`MADV_RANDOM`, readahead off or
/// read-around only) the marker is left for another mapping of the object,
/// as the kernel returns before testing PG_readahead.
pub fn consumes_marker(p: &Params) -> bool {
    p.mode == Mode::Full && p.hint != Hint::Random && p.ra_pages > 0
}

/// Fault-around mapped `pages` neighbour pages: they pay `mmap_miss` down.
pub fn on_fault_around(state: &mut RaState, pages: u64) {
    let pages = u32::try_from(pages).unwrap_or(u32::MAX);
    state.mmap_miss = state.mmap_miss.saturating_sub(pages).min(MMAP_MISS_MAX);
}

/// A fault on a page that an adaptive read-around window read, its first
/// use, mapped `pages` such pages (itself and the neighbours fault-around
/// mapped with it, which no later fault will see): evidence that
/// read-around windows are used. The fault path tells such pages by the
/// AROUND bit of their state word (`crate::cache::page_state`), set when
/// the window claimed them: a page read by a stream's readahead, a
/// prefetch or a trace replay is no such evidence. Lock-free, as
/// `mmap_miss`'s updates are.
pub fn on_used(state: &mut RaState, pages: u64) {
    state.around_used = state.around_used.saturating_add(pages);
}

/// Whether read-around adapts its window under `p`: under [`Mode::Full`],
/// for a store that asks for a smaller window than `ra_pages` (a remote
/// one), unless the mapping fixed it ([`Params::adapt`]). Elsewhere it is
/// the store's fixed window (the kernel's `ra_pages`).
pub fn adapts(p: &Params) -> bool {
    p.adapt && p.mode == Mode::Full && p.around_pages < p.ra_pages
}

/// The read-around window of this miss, in `1..=ra_pages` (see "Adaptive
/// read-around"): the store's `around_pages` where the window does not
/// adapt; else the state's window, doubled when at least half of the pages
/// read around lately were used, halved (down to [`MIN_AROUND_PAGES`])
/// when fewer than an eighth were, decided once the windows read since
/// the last decision add up to [`AROUND_EPOCH`] windows.
fn adapt_around(state: &mut RaState, p: &Params) -> u64 {
    let max = p.ra_pages.max(1);
    let base = p.around_pages.clamp(1, max);
    if !adapts(p) {
        return base;
    }
    let floor = MIN_AROUND_PAGES.min(base);
    let mut around = match state.around {
        0 => base,
        a => a.clamp(floor, max),
    };
    if state.around_read >= AROUND_EPOCH.saturating_mul(around) {
        let read = state.around_read;
        let used = state.around_used.min(read);
        if used.saturating_mul(2) >= read {
            around = around.saturating_mul(2).min(max);
        } else if used.saturating_mul(8) < read {
            around = (around / 2).max(floor);
        }
        // Halved, not cleared: a page used after its decision still counts
        // at the next.
        state.around_read /= 2;
        state.around_used /= 2;
    }
    state.around = around;
    state.around_read = state.around_read.saturating_add(around);
    around
}

/// A fault mapped pages up to `last`: remember it for sequential detection.
pub fn on_mapped(state: &mut RaState, last: u64) {
    state.prev = Some(last);
}

/// The sequential mmap readahead test, `offset - 1 == prev_pos >> PAGE_SHIFT`, with `prev` the
/// end of the previous fault's window; at page 0 before any fault it holds
/// too (`prev_pos` starts at -1).
fn is_sequential_miss(prev: Option<u64>, index: u64) -> bool {
    match prev {
        None => index == 0,
        Some(prev) => index.checked_sub(1) == Some(prev),
    }
}

/// `page_cache_sync_ra(index, req)`, with `ra_pages > 0` and `index` inside
/// the object.
fn sync_ra(
    state: &mut RaState,
    p: &Params,
    index: u64,
    req: u64,
    cache: &impl CacheView,
) -> Window {
    let max = p.ra_pages;
    // A start of file, an oversized read, or a sequential miss
    // (`index - prev <= 1`: the next page, or the same one again).
    let sequential = prev_is_close(state.prev, index);
    if index == 0 || req > max || sequential {
        let size = init_size(req, max);
        let async_size = if size > req { size - req } else { size / 2 };
        return set_window(state, p, index, size, async_size, Pattern::Initial, true)
            .unwrap_or_else(|| exact(p, index, 1));
    }
    // Context readahead: the cached history right before the miss.
    let (mut contig, from_zero) = cached_before(cache, index, max);
    if contig <= req {
        // A small random read: read it as is, state untouched.
        return exact(p, index, req);
    }
    if from_zero {
        // Cached from page 0: a long stream, or a whole-file read.
        contig = contig.saturating_mul(2);
    }
    let size = contig.saturating_add(req).min(max);
    set_window(state, p, index, size, 1, Pattern::Initial, true)
        .unwrap_or_else(|| exact(p, index, 1))
}

/// `page_cache_async_ra(index, folio, req = ra_pages)`: the mmap path always
/// asks for `ra_pages` (faultmap: the read-around window, which is
/// `ra_pages` unless the store asks for less; see "Read-around on a remote
/// store"). `ra_pages > 0`, `index` inside the object.
fn async_ra(state: &mut RaState, p: &Params, index: u64, cache: &impl CacheView) -> Option<Window> {
    let max = p.ra_pages;
    let req = p.around_pages.clamp(1, max);
    // The marker this state set: the stream goes on right after the window.
    let expected = state
        .start
        .saturating_add(state.size.saturating_sub(state.async_size));
    if state.size > 0 && index == expected {
        let start = state.start.saturating_add(state.size);
        let size = next_size(state.size, max);
        return set_window(state, p, start, size, size, Pattern::Subsequent, false);
    }
    // Someone else's marker: where does the read-ahead part end?
    let gap = next_gap(cache, p, index, max)?;
    let size = next_size((gap - index).saturating_add(req), max);
    set_window(state, p, gap, size, size, Pattern::Marker, false)
}

/// The kernel's `index - prev_index <= 1` of `page_cache_sync_ra`; with no
/// `prev` (the kernel's `prev_pos == -1`) it never holds.
fn prev_is_close(prev: Option<u64>, index: u64) -> bool {
    prev.is_some_and(|prev| index.wrapping_sub(prev) <= 1)
}

/// Records `[start, start + size)` with its async tail as the stream's
/// window (`ra->start/size/async_size`, unclipped as in the kernel) and
/// returns it clipped to the object; `None` if nothing of it is inside.
fn set_window(
    state: &mut RaState,
    p: &Params,
    start: u64,
    size: u64,
    async_size: u64,
    pattern: Pattern,
    sync: bool,
) -> Option<Window> {
    state.start = start;
    state.size = size;
    state.async_size = async_size.min(size);
    clip(p, start, size, state.async_size, pattern, sync)
}

/// `do_page_cache_ra(req, 0)` and the single-page reads: exactly `req`
/// pages from `index`, no marker, the state untouched. `index` must be
/// inside the object.
fn exact(p: &Params, index: u64, req: u64) -> Window {
    clip(p, index, req.max(1), 0, Pattern::Random, true).unwrap_or(Window {
        start: index,
        size: 1,
        async_size: 0,
        pattern: Pattern::Random,
        sync: true,
        eof: true,
    })
}

/// Clips a window to the object (EOF). The marker stays on its page or, if
/// the clip removed that page, goes. `None`: the window starts past the
/// object's end, or is empty.
fn clip(
    p: &Params,
    start: u64,
    size: u64,
    async_size: u64,
    pattern: Pattern,
    sync: bool,
) -> Option<Window> {
    if start >= p.object_pages || size == 0 {
        return None;
    }
    let room = p.object_pages - start;
    let async_size = async_size.min(size);
    let (size, async_size, eof) = if size <= room {
        (size, async_size, false)
    } else {
        // The marker's offset in the window; it survives if it is inside.
        let mark = size - async_size;
        let async_size = if async_size > 0 && mark < room {
            room - mark
        } else {
            0
        };
        (room, async_size, true)
    };
    Some(Window {
        start,
        size,
        async_size,
        pattern,
        sync,
        eof,
    })
}

/// `page_cache_prev_miss(index - 1, max)` as context readahead uses it:
/// how many pages right before `index` are cached (scanning at most `max`),
/// and whether the scan ran past page 0 (everything before `index` is
/// cached: the kernel's wrap to `ULONG_MAX`).
fn cached_before(cache: &impl CacheView, index: u64, max: u64) -> (u64, bool) {
    let mut k = 0;
    while k < max {
        // Looking at page index - (k + 1).
        let Some(page) = index.checked_sub(k + 1) else {
            return (index, true);
        };
        if !cache.is_cached(page) {
            return (k, false);
        }
        k += 1;
    }
    // No gap within max pages: the kernel reports one outside the range.
    (max, false)
}

/// `page_cache_next_miss(index + 1, max)`: the first page after `index`
/// that is not cached, within `max` pages; pages past the object are not
/// cached. `None`: no gap within `max` (the kernel's `start - index > max`),
/// or the index space ends.
fn next_gap(cache: &impl CacheView, p: &Params, index: u64, max: u64) -> Option<u64> {
    let mut page = index;
    for _ in 0..max {
        page = page.checked_add(1)?;
        if page >= p.object_pages || !cache.is_cached(page) {
            return Some(page);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    impl CacheView for BTreeSet<u64> {
        fn is_cached(&self, index: u64) -> bool {
            self.contains(&index)
        }
    }

    impl CacheView for Vec<bool> {
        fn is_cached(&self, index: u64) -> bool {
            usize::try_from(index).is_ok_and(|i| self.get(i).copied().unwrap_or(false))
        }
    }

    fn full(ra_pages: u64, object_pages: u64) -> Params {
        Params {
            ra_pages,
            around_pages: ra_pages,
            object_pages,
            hint: Hint::Normal,
            mode: Mode::Full,
            adapt: true,
        }
    }

    /// A remote store's parameters: 64 MiB readahead, 1 MiB read-around,
    /// a 16 GiB object.
    fn remote() -> Params {
        Params {
            ra_pages: 16384,
            around_pages: 256,
            object_pages: 4 << 20,
            hint: Hint::Normal,
            mode: Mode::Full,
            adapt: true,
        }
    }

    /// Read-around misses on pages `stride` apart (never cached, never
    /// sequential), each followed by what the fault path reports: the 15
    /// neighbours a miss maps, and `used(window)` read-ahead pages used
    /// before the next miss. Returns the windows' sizes.
    fn around_misses(p: &Params, n: u64, stride: u64, used: impl Fn(u64) -> u64) -> Vec<u64> {
        let mut st = RaState::default();
        let cache = BTreeSet::new();
        (0..n)
            .map(|i| {
                let w = on_miss(&mut st, p, 1000 + i * stride, &cache);
                assert_eq!(w.pattern, Pattern::Around, "{w:?}");
                on_fault_around(&mut st, 15);
                on_used(&mut st, used(w.size));
                w.size
            })
            .collect()
    }

    #[test]
    fn unused_read_around_windows_shrink_to_the_fault_around_window() {
        let sizes = around_misses(&remote(), 300, 9973, |_| 0);
        assert_eq!(sizes[0], 256, "it starts at the store's window");
        assert!(sizes.windows(2).all(|w| w[1] <= w[0]), "{sizes:?}");
        assert_eq!(*sizes.last().unwrap(), MIN_AROUND_PAGES, "{sizes:?}");
        // 300 sparse misses read about 21 MiB, not 300 MiB.
        let pages: u64 = sizes.iter().sum();
        assert!(pages < 6000, "{pages} pages read around");
    }

    #[test]
    fn used_read_around_windows_grow_to_ra_pages() {
        let p = remote();
        let sizes = around_misses(&p, 100, 40_000, |w| w);
        assert!(sizes.windows(2).all(|w| w[1] >= w[0]), "{sizes:?}");
        assert_eq!(*sizes.last().unwrap(), p.ra_pages, "{sizes:?}");
        // Partly used (between an eighth and a half): it stays.
        let sizes = around_misses(&p, 100, 40_000, |w| w / 4);
        assert!(sizes.iter().all(|&s| s == 256), "{sizes:?}");
    }

    #[test]
    fn read_around_adapts_only_for_a_store_that_asks_for_less_unless_fixed() {
        // A file's (around = ra_pages) and read-around alone: fixed.
        let fixed = Params {
            adapt: false,
            ..remote()
        };
        for p in [
            full(32, 1 << 30),
            with(remote(), Hint::Normal, Mode::AroundOnly),
            fixed,
        ] {
            assert!(!adapts(&p));
            let want = match p.mode {
                Mode::Full => p.around_pages,
                _ => p.ra_pages,
            };
            for used in [0, 1 << 20] {
                let sizes = around_misses(&p, 50, 50_000, |_| used);
                assert!(sizes.iter().all(|&s| s == want), "{p:?} {sizes:?}");
            }
        }
    }

    fn with(p: Params, hint: Hint, mode: Mode) -> Params {
        Params { hint, mode, ..p }
    }

    fn win(start: u64, size: u64, async_size: u64, pattern: Pattern, sync: bool) -> Window {
        Window {
            start,
            size,
            async_size,
            pattern,
            sync,
            eof: false,
        }
    }

    /// A window that was read: its pages are cached.
    fn read(cache: &mut BTreeSet<u64>, w: &Window) {
        cache.extend(w.pages());
    }

    /// A model of the fault path over one object: page cache, markers on
    /// newly read pages, mappings, and the kernel's VA-aligned fault-around
    /// (order 4, mapping at object offset 0) that skips marked pages.
    struct Sim {
        p: Params,
        st: RaState,
        cached: Vec<bool>,
        marked: Vec<bool>,
        mapped: Vec<bool>,
        windows: Vec<Window>,
        misses: u64,
    }

    impl Sim {
        fn new(p: Params) -> Self {
            let n = usize::try_from(p.object_pages).unwrap();
            Self {
                p,
                st: RaState::default(),
                cached: vec![false; n],
                marked: vec![false; n],
                mapped: vec![false; n],
                windows: Vec::new(),
                misses: 0,
            }
        }

        /// The reader touches page `i`.
        fn touch(&mut self, i: u64) {
            let u = usize::try_from(i).unwrap();
            if self.mapped[u] {
                return;
            }
            if self.cached[u] {
                let marker = std::mem::take(&mut self.marked[u]);
                if let Some(w) = on_hit(&mut self.st, &self.p, i, marker, &self.cached) {
                    self.read(w);
                }
            } else {
                self.misses += 1;
                let w = on_miss(&mut self.st, &self.p, i, &self.cached);
                assert!(w.pages().contains(&i), "{w:?} misses {i}");
                self.read(w);
            }
            self.fault_around(i);
        }

        fn read(&mut self, w: Window) {
            let marker = w.marker();
            for page in w.pages() {
                let u = usize::try_from(page).unwrap();
                if !self.cached[u] {
                    self.cached[u] = true;
                    self.marked[u] = marker == Some(page);
                }
            }
            self.windows.push(w);
        }

        fn fault_around(&mut self, i: u64) {
            let from = i & !15;
            let to = (from + 16).min(self.p.object_pages);
            let mut last = i;
            let mut around = 0;
            self.mapped[usize::try_from(i).unwrap()] = true;
            for page in from..to {
                let u = usize::try_from(page).unwrap();
                if page != i && self.cached[u] && !self.marked[u] && !self.mapped[u] {
                    self.mapped[u] = true;
                    around += 1;
                    last = last.max(page);
                }
            }
            on_fault_around(&mut self.st, around);
            on_mapped(&mut self.st, last);
        }
    }

    // ---- sizes --------------------------------------------------------

    #[test]
    fn init_size_tables() {
        // The reference's table for max = 32: 1-2 → 4, 3-4 → 8, 5-8 → 16.
        for (req, size) in [
            (1, 4),
            (2, 4),
            (3, 8),
            (4, 8),
            (5, 16),
            (8, 16),
            (9, 32),
            (32, 32),
        ] {
            assert_eq!(init_size(req, 32), size, "init_size({req}, 32)");
        }
        // read_ahead_kb = 8192 on this machine's disk: max = 2048.
        for (req, size) in [
            (1, 4),
            (2, 8),
            (3, 16),
            (16, 64),
            (64, 256),
            (65, 256),
            (128, 256),
            (256, 512),
            (512, 1024),
            (513, 2048),
            (2048, 2048),
            (5000, 2048),
        ] {
            assert_eq!(init_size(req, 2048), size, "init_size({req}, 2048)");
        }
    }

    #[test]
    fn next_size_tables() {
        for (cur, size) in [
            (1, 4),
            (2, 4),
            (4, 8),
            (8, 16),
            (16, 32),
            (17, 32),
            (32, 32),
            (64, 32),
        ] {
            assert_eq!(next_size(cur, 32), size, "next_size({cur}, 32)");
        }
        for (cur, size) in [
            (4, 16),
            (16, 64),
            (64, 256),
            (127, 508),
            (128, 256),
            (256, 512),
            (512, 1024),
            (1024, 2048),
            (1025, 2048),
            (2048, 2048),
        ] {
            assert_eq!(next_size(cur, 2048), size, "next_size({cur}, 2048)");
        }
    }

    #[test]
    fn sizes_at_the_extremes() {
        assert_eq!(init_size(0, 32), 4);
        assert_eq!(init_size(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(init_size(1, u64::MAX), 4);
        assert_eq!(init_size(1, 1), 1);
        assert_eq!(init_size(1, 0), 0);
        assert_eq!(next_size(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(next_size(u64::MAX / 2, u64::MAX), u64::MAX - 1);
        assert_eq!(next_size(1, 1), 1);
        assert_eq!(next_size(0, 32), 0);
    }

    // ---- the reference's worked examples -------------------------------

    #[test]
    fn read_around_at_page_300() {
        let p = full(32, 10_000);
        let mut st = RaState::default();
        let w = on_miss(&mut st, &p, 300, &BTreeSet::new());
        assert_eq!(w, win(284, 32, 8, Pattern::Around, true));
        assert_eq!(w.pages(), 284..316);
        assert_eq!(w.marker(), Some(308));
        assert_eq!(
            (st.start, st.size, st.async_size, st.mmap_miss),
            (284, 32, 8, 1)
        );
    }

    #[test]
    fn marker_of_read_around_starts_subsequent_window() {
        let p = full(32, 10_000);
        let mut cache = BTreeSet::new();
        let mut st = RaState::default();
        let w = on_miss(&mut st, &p, 300, &cache);
        read(&mut cache, &w);
        let next = on_hit(&mut st, &p, 308, true, &cache).unwrap();
        assert_eq!(next, win(316, 32, 32, Pattern::Subsequent, false));
        assert_eq!(next.pages(), 316..348);
        assert_eq!(next.marker(), Some(316));
        assert_eq!((st.start, st.size, st.async_size), (316, 32, 32));
        // The hit paid the miss back.
        assert_eq!(st.mmap_miss, 0);
    }

    #[test]
    fn observed_sequence_on_6_18() {
        // §6.3: ext4, read_ahead_kb = 128, touches 300, 316, 324, 364, 380,
        // 420. Each fault maps its 16-page aligned fault-around chunk.
        let p = full(32, 1024);
        let mut cache = BTreeSet::new();
        let mut st = RaState::default();
        let chunk_end = |i: u64| i | 15;

        let w = on_miss(&mut st, &p, 300, &cache);
        assert_eq!(w.pages(), 284..316);
        read(&mut cache, &w);
        on_mapped(&mut st, chunk_end(300));

        // 316 misses, is not sequential (the fault at 300 mapped up to 303):
        // a new read-around, with 300..315 already cached (the fault path
        // reads only 316..331).
        let w = on_miss(&mut st, &p, 316, &cache);
        assert_eq!(w, win(300, 32, 8, Pattern::Around, true));
        assert_eq!(w.marker(), Some(324));
        let new: Vec<u64> = w.pages().filter(|i| !cache.contains(i)).collect();
        assert_eq!(new, (316..332).collect::<Vec<_>>());
        read(&mut cache, &w);
        on_mapped(&mut st, chunk_end(316));

        // 324 is that window's marker: async readahead of [332..363].
        let w = on_hit(&mut st, &p, 324, true, &cache).unwrap();
        assert_eq!(w, win(332, 32, 32, Pattern::Subsequent, false));
        read(&mut cache, &w);
        on_mapped(&mut st, chunk_end(324));

        // 364, 380, 420: read-around each time; new pages [364..379],
        // [380..395], [404..435].
        for (i, window, new) in [
            (364, 348..380, 364..380),
            (380, 364..396, 380..396),
            (420, 404..436, 404..436),
        ] {
            let w = on_miss(&mut st, &p, i, &cache);
            assert_eq!(
                (w.pages(), w.pattern),
                (window, Pattern::Around),
                "miss at {i}"
            );
            let fresh: Vec<u64> = w.pages().filter(|i| !cache.contains(i)).collect();
            assert_eq!(fresh, new.collect::<Vec<_>>(), "miss at {i}");
            read(&mut cache, &w);
            on_mapped(&mut st, chunk_end(i));
        }
    }

    #[test]
    fn sequential_scan_ramps_4_8_16_32() {
        let mut sim = Sim::new(full(32, 400));
        for i in 0..400 {
            sim.touch(i);
        }
        let got: Vec<(u64, u64, Pattern)> = sim
            .windows
            .iter()
            .take(6)
            .map(|w| (w.start, w.size, w.pattern))
            .collect();
        assert_eq!(
            got,
            [
                (0, 4, Pattern::Initial),
                (4, 8, Pattern::Subsequent),
                (12, 16, Pattern::Subsequent),
                (28, 32, Pattern::Subsequent),
                (60, 32, Pattern::Subsequent),
                (92, 32, Pattern::Subsequent),
            ]
        );
        // The first window's marker is page 1, then each window's first page.
        assert_eq!(sim.windows[0].marker(), Some(1));
        assert_eq!(sim.windows[1].marker(), Some(4));
        // One major fault for the whole scan; the windows tile the object.
        assert_eq!(sim.misses, 1);
        assert_eq!(sim.windows.iter().map(|w| w.size).sum::<u64>(), 400);
        assert!(sim.windows.last().unwrap().eof);
    }

    #[test]
    fn sequential_scan_ramps_to_2048() {
        let mut sim = Sim::new(full(2048, 12_000));
        for i in 0..12_000 {
            sim.touch(i);
        }
        let sizes: Vec<u64> = sim.windows.iter().take(9).map(|w| w.size).collect();
        assert_eq!(sizes, [4, 16, 64, 256, 512, 1024, 2048, 2048, 2048]);
        assert_eq!(sim.misses, 1);
    }

    #[test]
    fn sequential_miss_starts_an_initial_window() {
        let p = full(32, 10_000);
        let mut st = RaState {
            mmap_miss: 7,
            ..RaState::default()
        };
        on_mapped(&mut st, 99);
        let w = on_miss(&mut st, &p, 100, &BTreeSet::new());
        assert_eq!(w, win(100, 4, 3, Pattern::Initial, true));
        assert_eq!(w.marker(), Some(101));
        assert_eq!((st.start, st.size, st.async_size), (100, 4, 3));
        // Sequential misses do not count against read-around.
        assert_eq!(st.mmap_miss, 7);
        // Page 0 before any fault is sequential too (prev_pos = -1).
        let mut st = RaState::default();
        let w = on_miss(&mut st, &p, 0, &BTreeSet::new());
        assert_eq!(w, win(0, 4, 3, Pattern::Initial, true));
        // After a fault elsewhere, page 0 is read around.
        on_mapped(&mut st, 500);
        let w = on_miss(&mut st, &p, 0, &BTreeSet::new());
        assert_eq!(w, win(0, 32, 8, Pattern::Around, true));
        // A miss two pages on is not sequential.
        on_mapped(&mut st, 200);
        let w = on_miss(&mut st, &p, 202, &BTreeSet::new());
        assert_eq!(w.pattern, Pattern::Around);
    }

    #[test]
    fn random_hint_reads_one_page() {
        let p = with(full(32, 10_000), Hint::Random, Mode::Full);
        let mut st = RaState {
            mmap_miss: 5,
            ..RaState::default()
        };
        let before = st;
        let mut cache = BTreeSet::new();
        for i in [300, 301, 5000, 0] {
            let w = on_miss(&mut st, &p, i, &cache);
            assert_eq!(w, win(i, 1, 0, Pattern::Random, true));
            read(&mut cache, &w);
            on_mapped(&mut st, i);
            assert_eq!(on_hit(&mut st, &p, i, true, &cache), None);
        }
        assert_eq!(RaState { prev: None, ..st }, before);
    }

    #[test]
    fn sequential_hint_reads_full_windows() {
        // §6.3: MADV_SEQUENTIAL, touches 300, 340, 380: ra_pages pages at
        // each fault, no marker (no cached history before them).
        let p = with(full(32, 10_000), Hint::Sequential, Mode::Full);
        let mut cache = BTreeSet::new();
        let mut st = RaState::default();
        for i in [300, 340, 380, 420] {
            let w = on_miss(&mut st, &p, i, &cache);
            assert_eq!(w, win(i, 32, 0, Pattern::Random, true), "miss at {i}");
            read(&mut cache, &w);
            on_mapped(&mut st, i | 15);
        }
        // Exact reads leave the state alone; no mmap_miss bookkeeping.
        assert_eq!(
            (st.start, st.size, st.async_size, st.mmap_miss),
            (0, 0, 0, 0)
        );
    }

    #[test]
    fn sequential_hint_initial_and_context_windows() {
        let p = with(full(32, 10_000), Hint::Sequential, Mode::Full);
        // At page 0: the initial window, ra_pages with half of it ahead.
        let mut st = RaState::default();
        let w = on_miss(&mut st, &p, 0, &BTreeSet::new());
        assert_eq!(w, win(0, 32, 16, Pattern::Initial, true));
        // Right after the previous fault's pages: initial window too.
        on_mapped(&mut st, 63);
        let w = on_miss(&mut st, &p, 64, &BTreeSet::new());
        assert_eq!(w, win(64, 32, 16, Pattern::Initial, true));
        // Cached history never makes a context window here: there are at
        // most ra_pages pages of it, and the request is ra_pages.
        let cache: BTreeSet<u64> = (0..20).chain(100..200).collect();
        let mut st = RaState::default();
        on_mapped(&mut st, 5);
        for i in [20, 200] {
            let w = on_miss(&mut st, &p, i, &cache);
            assert_eq!(w, win(i, 32, 0, Pattern::Random, true));
        }
        assert_eq!((st.start, st.size, st.async_size), (0, 0, 0));
    }

    #[test]
    fn context_readahead() {
        // page_cache_sync_ra with a small request and a prev that is not
        // close: the mmap path never asks this, read() does.
        let p = full(32, 10_000);
        let far = RaState {
            prev: Some(5),
            ..RaState::default()
        };
        // Pages 0..20 cached: 20 pages of history from page 0, doubled.
        let cache: BTreeSet<u64> = (0..20).collect();
        let mut st = far;
        let w = sync_ra(&mut st, &p, 20, 1, &cache);
        assert_eq!(w, win(20, 32, 1, Pattern::Initial, true));
        assert_eq!(w.marker(), Some(51));
        assert_eq!((st.start, st.size, st.async_size), (20, 32, 1));
        let mut st = far;
        let w = sync_ra(&mut st, &full(64, 10_000), 20, 1, &cache);
        assert_eq!(w, win(20, 41, 1, Pattern::Initial, true));
        // 8 pages of history not from page 0: 8 + 1 pages.
        let cache: BTreeSet<u64> = (92..100).collect();
        let mut st = far;
        let w = sync_ra(&mut st, &p, 100, 1, &cache);
        assert_eq!(w, win(100, 9, 1, Pattern::Initial, true));
        // More history than max: max.
        let cache: BTreeSet<u64> = (0..100).filter(|&i| i != 10).collect();
        let mut st = far;
        let w = sync_ra(&mut st, &p, 100, 1, &cache);
        assert_eq!(w, win(100, 32, 1, Pattern::Initial, true));
        // No more history than the request: exactly the request.
        let cache: BTreeSet<u64> = [99].into();
        let mut st = far;
        let w = sync_ra(&mut st, &p, 100, 1, &cache);
        assert_eq!(w, win(100, 1, 0, Pattern::Random, true));
        assert_eq!(st, far);
    }

    #[test]
    fn mmap_miss_throttles_read_around() {
        let p = full(32, 1 << 40);
        let cache = BTreeSet::new();
        let mut st = RaState::default();
        let miss = |st: &mut RaState, n: u64| {
            let i = 1000 * n + 500;
            let w = on_miss(st, &p, i, &cache);
            on_mapped(st, i);
            w
        };
        for n in 0..100 {
            assert_eq!(miss(&mut st, n).pattern, Pattern::Around, "miss {n}");
        }
        assert_eq!(st.mmap_miss, 100);
        // The 101st net miss reads only its page.
        let w = miss(&mut st, 100);
        assert_eq!(w, win(100_500, 1, 0, Pattern::Random, true));
        assert_eq!(st.mmap_miss, 101);
        // One hit is not enough (the next miss takes it to 101 again)...
        assert_eq!(on_hit(&mut st, &p, 7, false, &cache), None);
        assert_eq!(miss(&mut st, 101).pattern, Pattern::Random);
        // ...two are.
        on_hit(&mut st, &p, 7, false, &cache);
        on_hit(&mut st, &p, 7, false, &cache);
        assert_eq!(st.mmap_miss, 99);
        assert_eq!(miss(&mut st, 102).pattern, Pattern::Around);
        // Fault-around pays it down by the pages it maps.
        miss(&mut st, 103);
        assert_eq!(miss(&mut st, 104).pattern, Pattern::Random);
        on_fault_around(&mut st, 16);
        assert_eq!(st.mmap_miss, 86);
        assert_eq!(miss(&mut st, 105).pattern, Pattern::Around);
        // The balance is capped.
        for n in 0..2000 {
            miss(&mut st, 200 + n);
        }
        assert_eq!(st.mmap_miss, MMAP_MISS_MAX);
        on_fault_around(&mut st, u64::MAX);
        assert_eq!(st.mmap_miss, 0);
    }

    #[test]
    fn off_and_zero_ra_pages_read_one_page() {
        let cache: BTreeSet<u64> = (0..1000).collect();
        for p in [
            with(full(32, 10_000), Hint::Normal, Mode::Off),
            with(full(32, 10_000), Hint::Sequential, Mode::Off),
            full(0, 10_000),
            with(full(0, 10_000), Hint::Sequential, Mode::Full),
            with(full(0, 10_000), Hint::Normal, Mode::AroundOnly),
        ] {
            let mut st = RaState {
                mmap_miss: 3,
                ..RaState::default()
            };
            for i in [0, 300, 5000, 9_999] {
                let w = on_miss(&mut st, &p, i, &cache);
                assert_eq!((w.start, w.size, w.async_size), (i, 1, 0), "{p:?} at {i}");
                assert_eq!(w.pattern, Pattern::Random);
                assert_eq!(on_hit(&mut st, &p, i, true, &cache), None);
            }
            assert_eq!(st.mmap_miss, 3, "{p:?}");
        }
    }

    #[test]
    fn a_remote_store_reads_its_smaller_window_around_and_ramps_up_from_it() {
        // A remote store: 64 MiB windows, 1 MiB read-around.
        let p = Params {
            around_pages: 256,
            ..full(16_384, 1_000_000)
        };
        let cache: BTreeSet<u64> = BTreeSet::new();
        let mut st = RaState {
            prev: Some(5),
            ..RaState::default()
        };
        let w = on_miss(&mut st, &p, 100_000, &cache);
        assert_eq!(w, win(99_872, 256, 64, Pattern::Around, true));
        assert_eq!(st.mmap_miss, 1);
        // Its marker: a stream after all; the next window grows from 256
        // pages (4x while small), not from ra_pages.
        let cache: BTreeSet<u64> = w.pages().collect();
        let next = on_hit(&mut st, &p, w.marker().unwrap(), true, &cache).unwrap();
        assert_eq!(next, win(100_128, 1024, 1024, Pattern::Subsequent, false));
        // ... and reaches ra_pages.
        let mut cache = cache;
        let mut w = next;
        for _ in 0..8 {
            cache.extend(w.pages());
            w = on_hit(&mut st, &p, w.marker().unwrap(), true, &cache).unwrap();
        }
        assert_eq!(w.size, 16_384);
        // A sequential start is the kernel's: 4 pages at page 0.
        let mut st = RaState::default();
        let w = on_miss(&mut st, &p, 0, &BTreeSet::new());
        assert_eq!(w, win(0, 4, 3, Pattern::Initial, true));
        // Around-only has no marker to grow from: the kernel's ra_pages.
        let mut st = RaState::default();
        let q = with(p, Hint::Normal, Mode::AroundOnly);
        let w = on_miss(&mut st, &q, 100_000, &BTreeSet::new());
        assert_eq!(w, win(91_808, 16_384, 0, Pattern::Around, true));
    }

    #[test]
    fn someone_elses_marker_grows_from_the_read_around_window() {
        // A read-around at 100_000, then a miss elsewhere takes the state:
        // the first window's marker is no longer the state's. The window
        // its hit starts:
        let marker_window = |p: &Params| {
            let mut st = RaState {
                prev: Some(5),
                ..RaState::default()
            };
            let first = on_miss(&mut st, p, 100_000, &BTreeSet::new());
            let mut cache: BTreeSet<u64> = first.pages().collect();
            let other = on_miss(&mut st, p, 500_000, &cache);
            cache.extend(other.pages());
            on_hit(&mut st, p, first.marker().unwrap(), true, &cache).unwrap()
        };
        // A 1 MiB read-around (marker at 100_064): from the gap after it,
        // next_size(64 + 256) = 1280 pages, not ra_pages.
        let remote = Params {
            around_pages: 256,
            ..full(16_384, 1_000_000)
        };
        let w = marker_window(&remote);
        assert_eq!(w, win(100_128, 1280, 1280, Pattern::Marker, false));
        // With the kernel's read-around (ar = ra_pages) it is ra_pages.
        let w = marker_window(&full(16_384, 1_000_000));
        assert_eq!((w.size, w.pattern), (16_384, Pattern::Marker));
    }

    #[test]
    fn read_around_window_is_one_to_ra_pages() {
        let cache: BTreeSet<u64> = BTreeSet::new();
        for (around, size) in [(0, 1), (1, 1), (32, 32), (33, 32), (u64::MAX, 32)] {
            let p = Params {
                around_pages: around,
                ..full(32, 10_000)
            };
            let mut st = RaState {
                prev: Some(5),
                ..RaState::default()
            };
            let w = on_miss(&mut st, &p, 5_000, &cache);
            assert_eq!((w.size, w.pattern), (size, Pattern::Around), "{around}");
            assert!(w.pages().contains(&5_000));
        }
    }

    #[test]
    fn around_only_never_reads_ahead() {
        let p = with(full(32, 10_000), Hint::Normal, Mode::AroundOnly);
        let mut cache = BTreeSet::new();
        let mut st = RaState::default();
        // Read-around without a marker, even for a sequential miss.
        let w = on_miss(&mut st, &p, 300, &cache);
        assert_eq!(w, win(284, 32, 0, Pattern::Around, true));
        read(&mut cache, &w);
        on_mapped(&mut st, 315);
        let w = on_miss(&mut st, &p, 316, &cache);
        assert_eq!(w, win(300, 32, 0, Pattern::Around, true));
        assert_eq!(on_miss(&mut st, &p, 0, &cache).marker(), None);
        // Hits pay mmap_miss down but never start a window.
        assert_eq!(st.mmap_miss, 3);
        assert_eq!(on_hit(&mut st, &p, 308, true, &cache), None);
        assert_eq!(on_hit(&mut st, &p, 300, false, &cache), None);
        assert_eq!(st.mmap_miss, 1);
        // MADV_SEQUENTIAL: full windows from the page, no marker.
        let seq = with(p, Hint::Sequential, Mode::AroundOnly);
        let w = on_miss(&mut st, &seq, 0, &cache);
        assert_eq!(w, win(0, 32, 0, Pattern::Random, true));
        // The throttle still applies.
        let mut st = RaState {
            mmap_miss: MMAP_LOTSAMISS,
            ..RaState::default()
        };
        assert_eq!(on_miss(&mut st, &p, 5000, &cache).size, 1);
    }

    #[test]
    fn foreign_marker_searches_for_the_gap() {
        let p = full(32, 10_000);
        // Another stream moved the state on; pages 300..348 are cached.
        let cache: BTreeSet<u64> = (300..348).collect();
        let mut st = RaState {
            start: 5000,
            size: 32,
            async_size: 8,
            ..RaState::default()
        };
        let w = on_hit(&mut st, &p, 316, true, &cache).unwrap();
        // next_size(348 - 316 + ra_pages) = max.
        assert_eq!(w, win(348, 32, 32, Pattern::Marker, false));
        assert_eq!((st.start, st.size, st.async_size), (348, 32, 32));
        // No gap within ra_pages pages: nothing, state untouched.
        let cache: BTreeSet<u64> = (300..400).collect();
        let before = st;
        assert_eq!(on_hit(&mut st, &p, 316, true, &cache), None);
        assert_eq!(st, before);
        // A gap exactly ra_pages away is still found.
        let cache: BTreeSet<u64> = (300..348).collect();
        let w = on_hit(&mut st, &p, 316, true, &cache).unwrap();
        assert_eq!(w.start, 348);
    }

    #[test]
    fn stale_empty_state_does_not_continue() {
        // A marker hit with no window in the state: gap search, not a
        // zero-sized "subsequent" window at start.
        let p = full(32, 10_000);
        let cache: BTreeSet<u64> = (0..4).collect();
        let mut st = RaState::default();
        let w = on_hit(&mut st, &p, 0, true, &cache).unwrap();
        assert_eq!(w, win(4, 32, 32, Pattern::Marker, false));
    }

    #[test]
    fn windows_are_clipped_at_the_object_end() {
        let cache = BTreeSet::new();
        // The marker page survives the clip: async_size shrinks to keep it.
        let mut st = RaState::default();
        let w = on_miss(&mut st, &full(32, 310), 300, &cache);
        assert_eq!((w.start, w.size, w.async_size, w.eof), (284, 26, 2, true));
        assert_eq!(w.marker(), Some(308));
        // The state keeps the unclipped window, as the kernel's.
        assert_eq!((st.start, st.size, st.async_size), (284, 32, 8));
        // The clip removes the marker page: no marker.
        let w = on_miss(&mut RaState::default(), &full(32, 305), 300, &cache);
        assert_eq!((w.start, w.size, w.async_size, w.eof), (284, 21, 0, true));
        // A window that ends exactly at the end is not clipped.
        let w = on_miss(&mut RaState::default(), &full(32, 316), 300, &cache);
        assert_eq!((w.size, w.eof), (32, false));
        // The last page of a tiny object.
        let w = on_miss(&mut RaState::default(), &full(32, 1), 0, &cache);
        assert_eq!((w.start, w.size, w.async_size, w.eof), (0, 1, 0, true));
        // Async windows: clipped, or nothing past the end.
        let mut st = RaState {
            start: 284,
            size: 32,
            async_size: 8,
            ..RaState::default()
        };
        let mut copy = st;
        let w = on_hit(&mut copy, &full(32, 330), 308, true, &cache).unwrap();
        assert_eq!((w.start, w.size, w.async_size, w.eof), (316, 14, 14, true));
        assert_eq!(on_hit(&mut st, &full(32, 316), 308, true, &cache), None);
        assert_eq!((st.start, st.size), (316, 32));
        // Sequential hint: exactly the pages left.
        let p = with(full(32, 310), Hint::Sequential, Mode::Full);
        let w = on_miss(&mut RaState::default(), &p, 300, &cache);
        assert_eq!((w.start, w.size, w.async_size, w.eof), (300, 10, 0, true));
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let cache = BTreeSet::new();
        let mut st = RaState::default();
        // Beyond the object (the fault path would raise SIGBUS first).
        for (index, object) in [(0, 0), (5, 5), (u64::MAX, u64::MAX), (u64::MAX, 0)] {
            let w = on_miss(&mut st, &full(32, object), index, &cache);
            assert_eq!((w.start, w.size, w.eof), (index, 1, true));
            assert_eq!(
                on_hit(&mut st, &full(32, object), index, true, &cache),
                None
            );
        }
        assert_eq!(st, RaState::default());
        assert_eq!(
            Window {
                start: u64::MAX,
                ..win(0, 1, 0, Pattern::Random, true)
            }
            .pages(),
            u64::MAX..u64::MAX
        );
        // The top of the index space, huge windows.
        let top = u64::MAX - 1;
        for ra in [1, 32, u64::MAX / 2, u64::MAX] {
            for hint in [Hint::Normal, Hint::Sequential] {
                let p = with(full(ra, u64::MAX), hint, Mode::Full);
                let mut st = RaState::default();
                on_mapped(&mut st, top - 1);
                let w = on_miss(&mut st, &p, top, &cache);
                assert!(w.pages().contains(&top), "{w:?}");
                assert!(w.size <= ra);
                let w = on_miss(&mut st, &p, top / 3, &cache);
                assert!(w.pages().contains(&(top / 3)), "{w:?}");
                let mark = st.start.saturating_add(st.size - st.async_size);
                let _ = on_hit(&mut st, &p, mark.min(top), true, &cache);
                let _ = on_hit(&mut st, &p, top, true, &cache);
            }
        }
        // A corrupt state.
        let mut st = RaState {
            start: u64::MAX,
            size: u64::MAX,
            async_size: u64::MAX,
            mmap_miss: u32::MAX,
            prev: Some(u64::MAX),
            around: u64::MAX,
            around_read: u64::MAX,
            around_used: u64::MAX,
        };
        let p = full(u64::MAX, u64::MAX);
        let _ = on_miss(
            &mut st.clone(),
            &Params {
                around_pages: 8,
                ..p
            },
            7,
            &cache,
        );
        let _ = on_hit(&mut st, &p, u64::MAX - 1, true, &cache);
        assert!(st.mmap_miss <= MMAP_MISS_MAX);
        let _ = on_miss(&mut st, &p, 0, &cache);
        on_fault_around(&mut st, 0);
        assert!(st.mmap_miss <= MMAP_MISS_MAX);
    }

    // ---- properties ---------------------------------------------------

    #[derive(Clone, Debug)]
    enum Event {
        /// The reader touches a page (miss or hit, as the cache says).
        Touch(u64),
        /// A miss reported on a page whatever the cache says.
        Miss(u64),
        /// A hit reported on a page, with or without a marker.
        Hit(u64, bool),
        FaultAround(u64),
        Mapped(u64),
        /// A hit on a read-around page mapped this many such pages.
        Used(u64),
    }

    fn event(object: u64) -> impl Strategy<Value = Event> {
        let page = 0..object;
        prop_oneof![
            4 => page.clone().prop_map(Event::Touch),
            2 => page.clone().prop_map(Event::Miss),
            2 => (page.clone(), any::<bool>()).prop_map(|(i, m)| Event::Hit(i, m)),
            1 => (0..64u64).prop_map(Event::FaultAround),
            1 => page.prop_map(Event::Mapped),
            1 => (0..512u64).prop_map(Event::Used),
        ]
    }

    fn params() -> impl Strategy<Value = Params> {
        (
            prop_oneof![Just(0u64), 1..=64u64, 0..=4096u64],
            prop_oneof![Just(u64::MAX), 0..=64u64],
            1..100_000u64,
            prop_oneof![
                Just(Hint::Normal),
                Just(Hint::Sequential),
                Just(Hint::Random)
            ],
            prop_oneof![Just(Mode::Full), Just(Mode::AroundOnly), Just(Mode::Off)],
        )
            .prop_map(|(ra_pages, around, object_pages, hint, mode)| Params {
                ra_pages,
                // The kernel's (`ra_pages`) or a remote store's smaller one.
                around_pages: around.min(ra_pages),
                object_pages,
                hint,
                mode,
                adapt: true,
            })
    }

    /// A window that was read, in the bitmap model.
    fn fill(cache: &mut [bool], w: &Window) {
        for page in w.pages() {
            cache[usize::try_from(page).unwrap()] = true;
        }
    }

    fn check_window(p: &Params, w: &Window, miss: Option<u64>) {
        assert!(w.size >= 1, "{w:?}");
        assert!(
            w.start
                .checked_add(w.size)
                .is_some_and(|end| end <= p.object_pages),
            "{w:?} {p:?}"
        );
        assert!(w.size <= p.ra_pages.max(1), "{w:?} {p:?}");
        if w.pattern == Pattern::Around && p.mode == Mode::Full && !adapts(p) {
            assert!(
                w.size <= p.around_pages.min(p.ra_pages).max(1),
                "{w:?} {p:?}"
            );
        }
        if w.pattern == Pattern::Around && adapts(p) && !w.eof && w.start > 0 {
            assert!(
                w.size >= MIN_AROUND_PAGES.min(p.around_pages).max(1),
                "{w:?} {p:?}"
            );
        }
        assert!(w.async_size <= w.size, "{w:?}");
        if let Some(m) = w.marker() {
            assert!(w.pages().contains(&m), "{w:?}");
        }
        if let Some(i) = miss {
            assert!(w.pages().contains(&i), "{w:?} misses {i}");
            assert!(w.sync);
        } else {
            assert!(!w.sync);
        }
        let no_ra = p.mode == Mode::Off || p.ra_pages == 0 || p.hint == Hint::Random;
        if no_ra {
            assert_eq!(w.size, 1, "{w:?} {p:?}");
        }
        if p.mode != Mode::Full || no_ra {
            assert_eq!(w.async_size, 0, "{w:?} {p:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_events_keep_the_invariants(
            (p, events) in params().prop_flat_map(|p| {
                (Just(p), proptest::collection::vec(event(p.object_pages), 0..80))
            })
        ) {
            let mut cache = vec![false; usize::try_from(p.object_pages).unwrap()];
            let mut st = RaState::default();
            for ev in events {
                match ev {
                    Event::Touch(i) if !cache.is_cached(i) => {
                        let w = on_miss(&mut st, &p, i, &cache);
                        check_window(&p, &w, Some(i));
                        fill(&mut cache, &w);
                    }
                    Event::Touch(i) => {
                        if let Some(w) = on_hit(&mut st, &p, i, false, &cache) {
                            panic!("a hit without marker read {w:?}");
                        }
                    }
                    Event::Miss(i) => {
                        let w = on_miss(&mut st, &p, i, &cache);
                        check_window(&p, &w, Some(i));
                        fill(&mut cache, &w);
                    }
                    Event::Hit(i, marker) => {
                        let before = st;
                        let w = on_hit(&mut st, &p, i, marker, &cache);
                        if let Some(w) = w {
                            prop_assert!(marker && p.mode == Mode::Full);
                            check_window(&p, &w, None);
                            fill(&mut cache, &w);
                        }
                        if !marker {
                            prop_assert_eq!(
                                RaState { mmap_miss: 0, ..st },
                                RaState { mmap_miss: 0, ..before }
                            );
                        }
                    }
                    Event::FaultAround(n) => on_fault_around(&mut st, n),
                    Event::Mapped(i) => on_mapped(&mut st, i),
                    Event::Used(n) => on_used(&mut st, n),
                }
                prop_assert!(st.mmap_miss <= MMAP_MISS_MAX);
                prop_assert!(st.around <= p.ra_pages.max(1));
                prop_assert!(st.async_size <= st.size);
            }
        }

        #[test]
        fn the_adaptive_window_stays_between_its_floor_and_ra_pages(
            ra_pages in 1..=20_000u64,
            around in 1..=20_000u64,
            credits in proptest::collection::vec(0..40_000u64, 1..120),
        ) {
            let p = Params { ra_pages, around_pages: around.min(ra_pages), ..remote() };
            let floor = MIN_AROUND_PAGES.min(p.around_pages);
            let mut st = RaState::default();
            let cache = BTreeSet::new();
            for (i, used) in credits.into_iter().enumerate() {
                let w = on_miss(&mut st, &p, 1_000_000 + i as u64 * 20_000, &cache);
                on_fault_around(&mut st, 15);
                on_used(&mut st, used);
                prop_assert!(w.size <= ra_pages, "{w:?}");
                if adapts(&p) {
                    prop_assert!(w.size >= floor && st.around >= floor, "{w:?} {st:?}");
                } else {
                    prop_assert_eq!(w.size, p.around_pages);
                }
            }
        }

        #[test]
        fn arbitrary_numbers_never_panic(
            ra_pages in any::<u64>(),
            around_pages in any::<u64>(),
            object_pages in any::<u64>(),
            index in any::<u64>(),
            start in any::<u64>(),
            size in any::<u64>(),
            async_size in any::<u64>(),
            mmap_miss in prop_oneof![0..=MMAP_MISS_MAX, any::<u32>()],
            prev in any::<Option<u64>>(),
            marker in any::<bool>(),
        ) {
            let cache: BTreeSet<u64> = BTreeSet::new();
            for hint in [Hint::Normal, Hint::Sequential, Hint::Random] {
                for mode in [Mode::Full, Mode::AroundOnly, Mode::Off] {
                    let p = Params { ra_pages, around_pages, object_pages, hint, mode, adapt: true };
                    let mut st = RaState { start, size, async_size, mmap_miss, prev, ..RaState::default() };
                    let w = on_miss(&mut st, &p, index, &cache);
                    prop_assert!(w.pages().contains(&index) || index == u64::MAX);
                    if index < object_pages {
                        check_window(&p, &w, Some(index));
                    }
                    let _ = w.marker();
                    let mut st = RaState { start, size, async_size, mmap_miss, prev, ..RaState::default() };
                    if let Some(w) = on_hit(&mut st, &p, index, marker, &cache) {
                        prop_assert!(w.start.checked_add(w.size).is_some_and(|e| e <= object_pages));
                        prop_assert!(w.async_size <= w.size);
                    }
                    prop_assert!(st.mmap_miss <= MMAP_MISS_MAX.max(mmap_miss));
                    on_fault_around(&mut st, index);
                    on_mapped(&mut st, index);
                }
            }
        }

    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn a_sequential_scan_ramps_up_to_ra_pages(
            ra_pages in prop_oneof![1..=64u64, 1..=4096u64],
            object_pages in 1..20_000u64,
        ) {
            let mut sim = Sim::new(full(ra_pages, object_pages));
            for i in 0..object_pages {
                sim.touch(i);
            }
            let sizes: Vec<u64> = sim.windows.iter().filter(|w| !w.eof).map(|w| w.size).collect();
            prop_assert!(sizes.iter().all(|&s| s <= ra_pages), "{:?}", sizes);
            prop_assert!(sizes.windows(2).all(|s| s[0] <= s[1]), "{:?}", sizes);
            // The windows tile the object: no page read twice, none left.
            prop_assert_eq!(sim.windows.iter().map(|w| w.size).sum::<u64>(), object_pages);
            prop_assert_eq!(sim.windows[0].pattern, Pattern::Initial);
            if ra_pages >= 2 {
                // One major fault; every later window is async.
                prop_assert_eq!(sim.misses, 1);
                prop_assert!(sim.windows[1..].iter().all(|w| w.pattern == Pattern::Subsequent));
            }
        }
    }
}
