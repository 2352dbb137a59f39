//! The page cache: where an object's pages live and what state each is in.
//!
//! - [`page_state`]: one atomic word per page (state, flags, pins,
//!   version); every transition is a named compare-and-swap, and lookups
//!   take no lock (the lockless page cache);
//! - `pool`: pre-zeroed chunks of page-state words, taken without a lock
//!   and refilled by a thread, so that no fault allocates;
//! - `memfd`: the object's memfd and its private alias, through which
//!   pages are filled straight from the store;
//! - `shadow`: what an evicted page leaves behind (its shadow, the
//!   nonresident age), for workingset detection;
//! - `wait`: the lists on which faults park until a read in flight ends,
//!   and the userfaultfd handle that wakes them.
//!
//! Layer rule: uses [`crate::store`], [`crate::base`], [`crate::policy`],
//! [`crate::sync`] and [`crate::sys`]. It knows nothing of objects,
//! regions or faults: those are [`crate::mm`]'s.

pub(crate) mod memfd;
pub mod page_state;
pub(crate) mod pool;
pub(crate) mod shadow;
pub(crate) mod wait;

pub use memfd::CacheError;
pub(crate) use memfd::{Cache, Chunk, FillTarget};
