//! Policy: the kernel's decisions as pure code.
//!
//! Each module is a function from state and an event to a new state and a
//! decision, with no system calls, no atomics and no threads, so that it can
//! be unit- and property-tested against the kernel's formulas:
//!
//! - [`fault_around`]: the VA-aligned window that a fault maps
//!   (`do_fault_around`);
//! - [`readahead`]: on-demand readahead and mmap read-around
//!   (`page_cache_sync_ra`, `page_cache_async_ra`, `do_sync_mmap_readahead`);
//! - [`clock`]: the CLOCK hand's verdict on a page (second chance, active
//!   set);
//! - [`workingset`]: refault distances (`workingset_refault`);
//! - [`coalesce`]: the requests of a batched prefetch (ranges merged across
//!   small holes, as Arrow's `ReadRangeCache` merges them).
//!
//! Layer rule: uses nothing of the crate but the page geometry constants of
//! [`crate::sys`]. The mechanisms in [`crate::mm`] execute the decisions.

pub mod clock;
pub mod coalesce;
pub mod fault_around;
pub mod readahead;
pub mod workingset;
