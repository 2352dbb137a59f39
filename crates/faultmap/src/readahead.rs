//! On-demand readahead and mmap read-around: which pages to read on a miss.
//!
//! (SKELETON: the essay, the bodies and the tests are being written; the
//! API below is fixed and the fault path codes against it.)
//!
//! Pure policy: no syscalls, no locks, no clocks. The fault path keeps one
//! [`RaState`] per object (the kernel's `file_ra_state`), calls
//! [`on_miss`] when a faulting page is not cached and [`on_hit`] when it is
//! (with `marker` set when the page carried the readahead marker and this
//! fault cleared it), reads the returned [`Window`]'s pages that are not
//! cached yet, and sets the marker on the page at [`Window::marker`] if that
//! page is among the pages it reads.

use std::ops::Range;

/// The kernel's default readahead window: 128 KiB (`VM_READAHEAD_PAGES`).
pub const DEFAULT_RA_PAGES: u64 = 32;

/// Read-around stops while `mmap_miss` is above this (`MMAP_LOTSAMISS`).
pub const MMAP_LOTSAMISS: u32 = 100;

/// `mmap_miss` never rises above this (`MMAP_LOTSAMISS * 10`).
pub const MMAP_MISS_MAX: u32 = MMAP_LOTSAMISS * 10;

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
    /// Seed 001's case A: read-around on every miss, nothing else (no
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
    /// The last page the previous fault mapped (its fault-around window's
    /// end), for sequential detection; `None` before the first fault.
    pub prev: Option<u64>,
}

/// The fixed inputs of a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// The largest window (`ra_pages`); 0 disables readahead.
    pub ra_pages: u64,
    /// The object's length in pages (windows are clipped to it).
    pub object_pages: u64,
    /// The hint of the range the fault is in.
    pub hint: Hint,
    /// Which readahead runs.
    pub mode: Mode,
}

/// Why a window was read: the rows of seed 001's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// A sync window started by a sequential miss (or at page 0).
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
        self.start..self.start + self.size
    }

    /// The page that gets the readahead marker, if any.
    pub fn marker(&self) -> Option<u64> {
        (self.async_size > 0).then(|| self.start + self.size - self.async_size)
    }
}

/// A fault on page `index`, which is not cached: the window to read
/// (`do_sync_mmap_readahead` and `page_cache_sync_ra`). Always contains
/// `index`.
pub fn on_miss(state: &mut RaState, p: &Params, index: u64, cache: &impl CacheView) -> Window {
    let _ = (state, cache);
    Window {
        start: index,
        size: 1,
        async_size: 0,
        pattern: Pattern::Random,
        sync: true,
        eof: index + 1 >= p.object_pages,
    }
}

/// A fault on page `index`, which is cached (`do_async_mmap_readahead`);
/// `marker`: the page carried the readahead marker and this fault cleared
/// it. Returns the async window to read, if any (`page_cache_async_ra`).
pub fn on_hit(
    state: &mut RaState,
    p: &Params,
    index: u64,
    marker: bool,
    cache: &impl CacheView,
) -> Option<Window> {
    let _ = (state, p, index, marker, cache);
    None
}

/// Fault-around mapped `pages` neighbour pages: they pay `mmap_miss` down.
pub fn on_fault_around(state: &mut RaState, pages: u64) {
    let _ = (state, pages);
}

/// A fault mapped pages up to `last`: remember it for sequential detection.
pub fn on_mapped(state: &mut RaState, last: u64) {
    state.prev = Some(last);
}
