//! The memory manager: objects, the regions that map them, and the
//! mechanisms over both (the fault path, reclaim, unmap events).
//!
//! PLACEHOLDER

pub(crate) mod errors;
pub(crate) mod events;
pub(crate) mod evict;
pub(crate) mod fault;
pub(crate) mod invalidate;
pub(crate) mod io;
pub(crate) mod object;
pub(crate) mod pager_core;
pub(crate) mod rmap;
pub(crate) mod signal;
pub(crate) mod space;
pub(crate) mod writeback;
