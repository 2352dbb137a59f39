//! Objects: a store together with its page cache, as the application
//! holds it.
//!
//! An [`Object`] is what mappings map. Every mapping of one `Object` shares
//! its cache, so only the first mapping to touch a page reads it from the
//! store; the others' faults are MINOR and map the cached page. The object
//! itself (its cache, readahead state, rmap, budget share, error log) is
//! `crate::mm::object::ObjectCore`; this is its counted handle.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::base::config::PageSize;
use crate::base::index::ObjectPage;
use crate::base::report::IoErrorReport;
use crate::base::stats::{RaStats, Stats};
use crate::mm::object::ObjectCore;
use crate::mm::writeback::WriteBackError;
use crate::policy::readahead::RaState;
use crate::store::Store;
use crate::sys::PAGE_SIZE;

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
        core.acquire();
        Object(core)
    }
}

impl Object {
    /// A handle whose count was taken already (`ObjectCore::try_acquire`).
    pub(crate) fn adopt(core: Arc<ObjectCore>) -> Object {
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
    /// its reads ahead are cancelled (queued ones dropped unread, those in
    /// flight not cached, see `crate::mm::io`), and the object's dirty
    /// pages are written back, best effort, on a thread
    /// of their own that this drop waits for at most `Config::io_timeout`
    /// plus a second. A store write that never returns leaves that thread
    /// behind, holding the object's parts (through its `Arc`) until the
    /// store answers: the drop returns anyway.
    fn drop(&mut self) {
        if self.0.born != crate::sys::fork_generation() {
            // A forked child's handle: the parent writes the dirty pages
            // back (see "fork" in `crate::api::pager`).
            return;
        }
        if self.0.release() {
            crate::mm::object::close(&self.0);
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
        self.0.cache.bytes(self.0.cache.states.count_uptodate())
    }

    /// The size of the object's pages: every page count of the object
    /// (its statistics, [`Object::is_cached`]) counts pages of this size.
    pub fn page_size(&self) -> PageSize {
        self.0.cache.page_size()
    }

    /// The object's largest readahead window in its pages: the store's
    /// ([`crate::Store::ra_pages`]; for an object of 2 MiB pages, in those
    /// pages and at least 4 unless the store's is 0). A mapping may ask
    /// for another ([`crate::MapOptions::ra_pages`]); a memory budget caps
    /// the window at an eighth of it.
    pub fn ra_pages(&self) -> u64 {
        self.0.ra_pages
    }

    /// Whether page `page` (`page` times [`Object::page_size`] bytes into
    /// the object) is in
    /// the cache and up to date. Lock-free; for tests, tools and policies.
    pub fn is_cached(&self, page: u64) -> bool {
        self.0.cache.states.load(ObjectPage(page)).state()
            == crate::cache::page_state::State::UpToDate
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
        let page = self.page_size().bytes() as u64;
        let (first, end) = (range.start / page, range.end.div_ceil(page));
        // A barrier: an unmap event already read is handled first (its
        // region leaves the list of mappings), see `crate::mm::events`.
        drop(crate::mm::space::RegionTable::get().settled());
        crate::mm::invalidate::invalidate(&self.0, ObjectPage(first)..ObjectPage(end)).map_err(
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
    /// [`crate::LOG_CAPACITY`], oldest first): failed reads (after
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
        crate::mm::writeback::flush(&self.0, 0..self.0.cache.states.pages(), &[])
    }

    /// Bytes of the object written and not yet written back (a multiple of
    /// the page size; pages being written back are not counted).
    pub fn dirty_bytes(&self) -> u64 {
        self.0
            .cache
            .bytes(self.0.wb.dirty_pages.load(Ordering::Relaxed))
    }

    /// Counters summed over every mapping of this object, with every fault
    /// that let its thread go before this call (see
    /// [`crate::Pager::stats`]).
    pub fn stats(&self) -> Stats {
        self.0.counters.snapshot()
    }

    /// The object's readahead state (`file_ra_state`): the last window and
    /// `mmap_miss`.
    pub fn ra_state(&self) -> RaState {
        self.0.ra_snapshot()
    }

    /// The readahead table of every mapping of this object.
    pub fn ra_stats(&self) -> RaStats {
        self.0.counters.settle();
        self.0.ra.snapshot()
    }
}

/// What [`crate::Pager::map`] accepts: an [`Object`] (shares its cache), or
/// any [`Store`] (a new object with a cache of its own).
pub trait IntoObject {
    /// Turns `self` into an object of `pager`, with pages of `page_size`
    /// if it opens one (an object has its page size already).
    fn into_object(
        self,
        pager: &crate::Pager,
        page_size: PageSize,
    ) -> Result<Object, crate::MapError>;
}

impl IntoObject for Object {
    fn into_object(self, _: &crate::Pager, _: PageSize) -> Result<Object, crate::MapError> {
        Ok(self)
    }
}

impl IntoObject for &Object {
    fn into_object(self, _: &crate::Pager, _: PageSize) -> Result<Object, crate::MapError> {
        Ok(self.clone())
    }
}

impl<S: Store> IntoObject for S {
    fn into_object(
        self,
        pager: &crate::Pager,
        page_size: PageSize,
    ) -> Result<Object, crate::MapError> {
        pager.open_with_page_size(self, page_size)
    }
}
