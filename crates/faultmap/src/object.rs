//! Objects: a store together with its page cache.
//!
//! An [`Object`] is what mappings map. Every mapping of one `Object` shares
//! its cache, so only the first mapping to touch a page reads it from the
//! store; the others' faults are MINOR and map the cached page.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cache::Cache;
use crate::errors::{IoErrorKind, IoErrorReport, ObjectErrors};
use crate::evict::Budget;
use crate::fault::Waiter;
use crate::readahead::RaState;
use crate::rmap::Rmap;
use crate::space::Region;
use crate::stats::{Counters, RaCounters, RaStats, Stats};
use crate::store::Store;
use crate::sys::PAGE_SIZE;
use crate::wait::WaitList;
use crate::workingset::Shadows;
use crate::writeback::WriteBackError;

pub(crate) struct ObjectCore {
    pub(crate) store: Box<dyn Store>,
    pub(crate) cache: Cache,
    /// The store's length when the object was opened.
    pub(crate) len: u64,
    /// Counters of all mappings of this object.
    pub(crate) counters: Counters,
    /// Readahead counters of all mappings of this object.
    pub(crate) ra: RaCounters,
    /// Faults parked until a read in flight ends.
    pub(crate) waiters: WaitList<Waiter>,
    /// The readahead window (`file_ra_state`'s start, size, async_size),
    /// taken only on misses and marker hits.
    pub(crate) ra_window: Mutex<(u64, u64, u64)>,
    /// `file_ra_state.mmap_miss`: updated without the lock on every hit,
    /// racily, as the kernel does.
    pub(crate) mmap_miss: AtomicU32,
    /// The last page the previous fault mapped, `u64::MAX` before any.
    pub(crate) prev: AtomicU64,
    /// Async read jobs queued and not yet taken, for promotion.
    pub(crate) queued: Mutex<Vec<Arc<crate::io::Queued>>>,
    /// The regions that map this object, by the object pages they cover
    /// (`crate::rmap`): for the hand's unmapping, eviction, invalidation.
    pub(crate) rmap: Rmap,
    /// The memory budget this object's pages are charged to.
    pub(crate) budget: Arc<Budget>,
    /// Pages of this object charged to the budget.
    pub(crate) charged: AtomicU64,
    /// Shadows of evicted pages, for refault detection.
    pub(crate) shadows: Shadows,
    /// Store failures: the error log, the pager logs it feeds, the end
    /// after a truncation (`crate::errors`).
    pub(crate) errors: ObjectErrors,
    /// The store's `io_pages`, asked once (a panic there is the default).
    pub(crate) io_pages: u64,
    /// The store's `ra_pages`, asked once (a panic there is the default).
    pub(crate) ra_pages: u64,
    /// The evictor of the object's own budget (`Pager::open_with_budget`):
    /// it stops when the object goes.
    pub(crate) evictor: std::sync::Mutex<Option<crate::evict::Evictor>>,
    /// Dirty count, error sequence, sync state (`crate::writeback`).
    pub(crate) wb: crate::writeback::ObjectWb,
    /// Live [`Object`] handles (every [`crate::Mapping`] holds one): when
    /// the last goes, the final write-back runs (see `Object`'s drop).
    handles: std::sync::atomic::AtomicUsize,
    /// How long the last handle's drop waits for the final write-back:
    /// `Config::io_timeout` plus a second, of the pager that opened it.
    grace: Duration,
}

impl Drop for ObjectCore {
    /// The last handle went: dirty pages are written back, best effort
    /// (`crate::writeback::on_drop`); the memfd goes with the object, so
    /// its pages leave the budget.
    fn drop(&mut self) {
        // The object's own evictor stops (not joined: this may be its own
        // thread, which held the last handle; it exits at its next look).
        if let Some(evictor) = self
            .evictor
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            drop(evictor.stop());
        }
        crate::writeback::on_drop(self);
        let n = self.charged.load(Ordering::Relaxed);
        self.budget.uncharge(self, n);
        self.budget.deactivated(self.cache.states.count_active());
    }
}

impl ObjectCore {
    /// A new object over `store` with its cache.
    /// `grace`: how long its last handle's drop waits for the final
    /// write-back; `evictor`: the thread of a budget of its own.
    pub(crate) fn new(
        store: Box<dyn Store>,
        cache: Cache,
        len: u64,
        budget: Arc<Budget>,
        grace: Duration,
        evictor: Option<crate::evict::Evictor>,
    ) -> Self {
        // A store that panics must not take the caller down; its answers
        // are asked here once, each caught.
        let ask = |f: &dyn Fn() -> u64, default: u64| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(default)
        };
        let io_pages = ask(&|| store.io_pages(), 256).clamp(1, crate::config::MAX_RA_PAGES);
        let ra_pages = ask(&|| store.ra_pages(), crate::readahead::DEFAULT_RA_PAGES)
            .min(crate::config::MAX_RA_PAGES);
        Self {
            handles: std::sync::atomic::AtomicUsize::new(0),
            grace,
            io_pages,
            ra_pages,
            evictor: std::sync::Mutex::new(evictor),
            store,
            cache,
            len,
            counters: Counters::default(),
            ra: RaCounters::default(),
            waiters: WaitList::default(),
            ra_window: Mutex::new((0, 0, 0)),
            mmap_miss: AtomicU32::new(0),
            prev: AtomicU64::new(u64::MAX),
            queued: Mutex::new(Vec::new()),
            rmap: Rmap::default(),
            budget,
            charged: AtomicU64::new(0),
            shadows: Shadows::default(),
            errors: ObjectErrors::new(len),
            wb: crate::writeback::ObjectWb::default(),
        }
    }

    /// Logs a store failure on `bytes` of this object, on the object and on
    /// every pager that opened or mapped it (see [`crate::errors`]).
    pub(crate) fn report(&self, kind: IoErrorKind, bytes: Range<u64>, message: String) {
        self.errors.report(IoErrorReport {
            object: self.store.name().to_string(),
            offset: bytes.start,
            len: bytes.end.saturating_sub(bytes.start),
            kind,
            message,
        });
    }

    /// Records that `region` maps this object.
    pub(crate) fn add_mapping(&self, region: &Arc<Region>) {
        self.rmap
            .insert(region.object_pages(), region.start(), region);
    }

    /// Forgets `region` (being unmapped).
    pub(crate) fn remove_mapping(&self, region: &Region) {
        self.rmap.remove(region.object_pages(), region.start());
    }

    /// Runs a readahead decision on the object's whole readahead state,
    /// under its lock (misses and marker hits).
    pub(crate) fn with_ra_state<T>(&self, f: impl FnOnce(&mut RaState) -> T) -> T {
        let mut window = self.ra_window.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.ra_counts();
        (st.start, st.size, st.async_size) = *window;
        let out = f(&mut st);
        *window = (st.start, st.size, st.async_size);
        self.store_ra_counts(&st);
        out
    }

    /// Runs a readahead update that touches only `mmap_miss` and `prev`,
    /// without a lock (hits, fault-around).
    pub(crate) fn with_ra_counts<T>(&self, f: impl FnOnce(&mut RaState) -> T) -> T {
        let mut st = self.ra_counts();
        let out = f(&mut st);
        self.store_ra_counts(&st);
        out
    }

    /// The whole readahead state, read only.
    pub(crate) fn ra_snapshot(&self) -> RaState {
        let window = *self.ra_window.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.ra_counts();
        (st.start, st.size, st.async_size) = window;
        st
    }

    fn ra_counts(&self) -> RaState {
        let prev = self.prev.load(Ordering::Relaxed);
        RaState {
            mmap_miss: self.mmap_miss.load(Ordering::Relaxed),
            prev: (prev != u64::MAX).then_some(prev),
            ..RaState::default()
        }
    }

    fn store_ra_counts(&self, st: &RaState) {
        self.mmap_miss.store(st.mmap_miss, Ordering::Relaxed);
        self.prev
            .store(st.prev.unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// A page index in an object, and so in its memfd: page `i` covers bytes
/// `[i * PAGE_SIZE, (i + 1) * PAGE_SIZE)`. Kept apart from region-relative
/// page indices (plain `u64`s in the fault path) and from addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectPage(pub(crate) u64);

impl ObjectPage {
    /// The page `n` pages after this one.
    pub(crate) fn add(self, n: u64) -> ObjectPage {
        ObjectPage(self.0 + n)
    }

    /// The object offset of the page's first byte.
    pub(crate) fn offset(self) -> u64 {
        self.0 * PAGE_SIZE as u64
    }
}

/// Why an invalidation failed.
#[derive(Debug, thiserror::Error)]
pub enum InvalidateError {
    /// The range is not inside the object (or the mapping).
    #[error("invalidate range {start}..{end} is not inside the object ({len} bytes)")]
    Range {
        /// The range's start.
        start: u64,
        /// The range's end.
        end: u64,
        /// The object's (or mapping's) length.
        len: u64,
    },
    /// Unmapping the pages or punching them out of the cache failed; the
    /// pages are ABSENT anyway and will be read again.
    #[error("invalidating pages of {name} failed")]
    Sys {
        /// The object's name.
        name: String,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// A store and its page cache. Cheap to clone: clones share the cache.
pub struct Object(pub(crate) Arc<ObjectCore>);

impl Object {
    /// A handle to `core`, counted (see the drop).
    pub(crate) fn new(core: Arc<ObjectCore>) -> Object {
        core.handles.fetch_add(1, Ordering::Relaxed);
        Object(core)
    }
}

impl Clone for Object {
    fn clone(&self) -> Object {
        Object::new(self.0.clone())
    }
}

impl Drop for Object {
    /// The last handle (of the application's, and of its mappings') goes:
    /// the object's dirty pages are written back, best effort, on a thread
    /// of their own that this drop waits for at most `Config::io_timeout`
    /// plus a second. A store write that never returns leaves that thread
    /// behind, holding the object's parts (through its `Arc`) until the
    /// store answers: the drop returns anyway.
    fn drop(&mut self) {
        if self.0.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if !crate::writeback::has_work(&self.0) {
            return;
        }
        let core = self.0.clone();
        let spawned = std::thread::Builder::new()
            .name("faultmap-final".into())
            .spawn(move || crate::writeback::on_drop(&core));
        match spawned {
            Ok(thread) => {
                crate::io::join_until(vec![thread], std::time::Instant::now() + self.0.grace);
            }
            // No thread to be had: here, unbounded, rather than not at all.
            Err(_) => crate::writeback::on_drop(&self.0),
        }
    }
}

impl fmt::Debug for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Object")
            .field("name", &self.name())
            .field("len", &self.len())
            .finish()
    }
}

impl Object {
    /// The store's name.
    pub fn name(&self) -> &str {
        self.0.store.name()
    }

    /// The object's length in bytes.
    pub fn len(&self) -> u64 {
        self.0.len
    }

    /// Whether the object has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Bytes of the object that are in its cache and up to date (a multiple
    /// of the page size). O(pages): for reporting, not for hot paths.
    pub fn cached_bytes(&self) -> u64 {
        self.0.cache.states.count_uptodate() * PAGE_SIZE as u64
    }

    /// Whether page `page` (`page * PAGE_SIZE` bytes into the object) is in
    /// the cache and up to date. Lock-free; for tests, tools and policies.
    pub fn is_cached(&self, page: u64) -> bool {
        self.0.cache.states.load(ObjectPage(page)).state() == crate::page_state::State::UpToDate
    }

    /// Drops the pages that hold bytes `range` of the object (every page
    /// the range touches) from the cache and from every mapping of the
    /// object, safely while other threads fault on them: the next touch of
    /// one reads it from the store again. Waits for pages being read or
    /// mapped at the moment. Returns how many cached pages were dropped.
    ///
    /// Dirty pages are written back first (as the kernel launders them);
    /// if the store refuses the write, the invalidation fails and the
    /// pages stay cached and dirty.
    ///
    /// The store must return the same bytes when the pages are read again:
    /// a read-only `Mapping` hands out `&[u8]`, which must not change under
    /// its holder. Invalidation is for giving memory back, not for picking
    /// up data changed behind faultmap's back.
    pub fn invalidate(&self, range: Range<u64>) -> Result<u64, InvalidateError> {
        if range.start > range.end || range.end > self.0.len {
            return Err(InvalidateError::Range {
                start: range.start,
                end: range.end,
                len: self.0.len,
            });
        }
        if range.is_empty() {
            return Ok(0);
        }
        let first = range.start / PAGE_SIZE as u64;
        let end = range.end.div_ceil(PAGE_SIZE as u64);
        // A barrier: an unmap event already read is handled first (its
        // region leaves the list of mappings), see `crate::events`.
        drop(crate::space::RegionTable::get().lock());
        crate::invalidate::invalidate(&self.0, ObjectPage(first)..ObjectPage(end)).map_err(
            |source| InvalidateError::Sys {
                name: self.name().to_string(),
                source,
            },
        )
    }

    /// The memory of the budget this object is charged to (the pager's, or
    /// its own: [`crate::Pager::open_with_budget`]), and `cached` is this
    /// object's own share.
    pub fn memory(&self) -> crate::Memory {
        crate::Memory {
            cached: self.0.charged.load(Ordering::Relaxed) * PAGE_SIZE as u64,
            ..self.0.budget.memory()
        }
    }

    /// The last store failures on this object (at most
    /// [`crate::errors::LOG_CAPACITY`], oldest first): failed reads (after
    /// their retries), timeouts, failed write-backs. The log is kept.
    pub fn io_errors(&self) -> Vec<IoErrorReport> {
        self.0.errors.log().snapshot()
    }

    /// Like [`Object::io_errors`], and empties the log.
    pub fn take_io_errors(&self) -> Vec<IoErrorReport> {
        self.0.errors.log().take()
    }

    /// Writes every dirty page of the object back to its store, waits for
    /// write-backs in flight, and syncs the store: when it returns `Ok`,
    /// every byte written through any mapping of the object before the call
    /// is in the store (`msync(MS_SYNC)` over the whole object). An error
    /// of an earlier write-back of the object (the background flusher's)
    /// is reported by the next flush: see [`WriteBackError`]. Returns the
    /// pages this call wrote.
    pub fn flush(&self) -> Result<u64, WriteBackError> {
        crate::writeback::flush(&self.0, 0..self.0.cache.states.pages(), &[])
    }

    /// Bytes of the object written and not yet written back (a multiple of
    /// the page size; pages being written back are not counted).
    pub fn dirty_bytes(&self) -> u64 {
        self.0.wb.dirty_pages.load(Ordering::Relaxed) * PAGE_SIZE as u64
    }

    /// Counters summed over every mapping of this object.
    pub fn stats(&self) -> Stats {
        self.0.counters.snapshot()
    }

    /// The object's readahead state (`file_ra_state`): the last window and
    /// `mmap_miss`.
    pub fn ra_state(&self) -> RaState {
        self.0.ra_snapshot()
    }

    /// The readahead table (seed 001) of every mapping of this object.
    pub fn ra_stats(&self) -> RaStats {
        self.0.counters.settle();
        self.0.ra.snapshot()
    }
}

/// What [`crate::Pager::map`] accepts: an [`Object`] (shares its cache), or
/// any [`Store`] (a new object with a cache of its own).
pub trait IntoObject {
    /// Turns `self` into an object of `pager`.
    fn into_object(self, pager: &crate::Pager) -> Result<Object, crate::MapError>;
}

impl IntoObject for Object {
    fn into_object(self, _pager: &crate::Pager) -> Result<Object, crate::MapError> {
        Ok(self)
    }
}

impl IntoObject for &Object {
    fn into_object(self, _pager: &crate::Pager) -> Result<Object, crate::MapError> {
        Ok(self.clone())
    }
}

impl<S: Store> IntoObject for S {
    fn into_object(self, pager: &crate::Pager) -> Result<Object, crate::MapError> {
        pager.open(self)
    }
}
