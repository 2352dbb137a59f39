//! The memory manager: objects, the regions that map them, and the
//! mechanisms over both.
//!
//! Three groups of modules, bottom to top as a reader should take them:
//!
//! - **Objects and the address space.** `object`: an object's core (its
//!   cache, readahead state, dirty and error state, budget share);
//!   `space`: the process's region table, published as immutable snapshots
//!   and read without a lock (speculative lookup, checked by each region's
//!   sequence count); `rmap`: an object's interval tree of the regions that
//!   map it; `pager_core`: what a pager's threads and regions share.
//! - **The fault path.** `engine`: the two paging engines (userfaultfd,
//!   and `mprotect` with SIGSEGV when userfaultfd is refused), each the
//!   same five operations (arm, map, allow and stop writes, zap);
//!   `fault`: resolving one fault (lookup, readahead
//!   decision, fault-around mapping); `signal`: SIGBUS and SIGSEGV
//!   delivery, where the faulting thread maps a hit itself and forwards a
//!   miss; `io`: the I/O
//!   threads that run read jobs; `errors`: retries, the store-timeout
//!   watchdog and truncation; `events`: the application's `munmap` and
//!   `mremap`, seen through userfaultfd events; `trace`: recording the
//!   first-touch order of a mapping's pages, and replaying a trace as
//!   prefetch; `guest`: serving the faults of other processes (a forked
//!   child's on the mappings it inherited, an unrelated process's that
//!   joined an object this process hosts) from this process's cache;
//!   `links`: the ranges this process joined of other processes' caches,
//!   for its SIGBUS handler.
//! - **Reclaim.** `evict`: the memory budget and its evictor (the CLOCK
//!   hand); `writeback`: dirty tracking by write-protect faults, flush,
//!   the background flusher; `invalidate`: dropping pages from the cache
//!   and from every mapping.
//!
//! # Why these are one layer
//!
//! Objects, regions and pagers refer to each other, as the kernel's
//! `address_space`, `vm_area_struct` and `mm_struct` do: a region maps an
//! object and is served by a pager (a SIGBUS handler finds both through the
//! region); an object knows the regions that map it (reclaim unmaps
//! through them), the faults parked on its reads, and its queued read
//! jobs (a fault promotes them). The mechanisms call each other the same
//! way: a write fault starts dirty tracking, eviction writes back, the
//! watchdog truncates. Cutting this folder further would mean rewriting
//! those references (type-erasing a region's pager, moving the read queue
//! off the object), which is a change of mechanism, not of layout.
//!
//! Layer rule: uses every layer below ([`crate::cache`], [`crate::store`],
//! [`crate::base`], [`crate::policy`], [`crate::sync`], [`crate::sys`]);
//! never [`crate::api`]. What it needs from a pager comes in a `Core`
//! (`pager_core`) built by the API layer.

pub(crate) mod engine;
pub(crate) mod errors;
pub(crate) mod events;
pub(crate) mod evict;
pub(crate) mod fault;
pub(crate) mod guest;
pub(crate) mod invalidate;
pub(crate) mod io;
pub(crate) mod links;
pub(crate) mod object;
pub(crate) mod pager_core;
pub(crate) mod rmap;
pub(crate) mod signal;
pub(crate) mod space;
pub(crate) mod trace;
pub(crate) mod writeback;
