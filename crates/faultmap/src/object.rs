//! Objects: a store together with its page cache.
//!
//! An [`Object`] is what mappings map. Every mapping of one `Object` shares
//! its cache, so only the first mapping to touch a page reads it from the
//! store; the others' faults are MINOR and map the cached page.

use std::fmt;
use std::sync::Arc;

use crate::cache::Cache;
use crate::fault::Waiter;
use crate::stats::{Counters, RaCounters, RaStats, Stats};
use crate::store::Store;
use crate::sys::PAGE_SIZE;
use crate::wait::WaitList;

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

/// A store and its page cache. Cheap to clone: clones share the cache.
#[derive(Clone)]
pub struct Object(pub(crate) Arc<ObjectCore>);

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

    /// Counters summed over every mapping of this object.
    pub fn stats(&self) -> Stats {
        self.0.counters.snapshot()
    }

    /// The readahead table (seed 001) of every mapping of this object.
    pub fn ra_stats(&self) -> RaStats {
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
