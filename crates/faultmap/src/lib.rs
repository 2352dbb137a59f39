//! faultmap: a user-space pager with the Linux kernel's fault-path
//! algorithms.
//!
//! An application maps an object (a file, a buffer, later an HTTP URL or an
//! S3 object) and reads it as memory. Pages come in on demand through
//! faultmap's own fault path, built on `userfaultfd`:
//!
//! - each object's page cache is a memfd, filled through a private alias
//!   mapping straight from the store ([`cache`]);
//! - each mapping maps that memfd `MAP_SHARED` and is registered with
//!   userfaultfd in MISSING and MINOR modes, so every first touch of a page
//!   reaches faultmap ([`api`]);
//! - a fault maps the faulting page and its cached neighbours with
//!   `UFFDIO_CONTINUE`, in the kernel's VA-aligned fault-around window
//!   ([`policy::fault_around`], the fault path in [`mm`]);
//! - a miss reads what the kernel's on-demand readahead and read-around
//!   would ([`policy::readahead`]), on I/O threads, with an unmapped marker
//!   page that starts the next window asynchronously;
//! - page lookups take no lock: one atomic state word per page
//!   ([`cache::page_state`]); region lookups take none either (speculative,
//!   checked by a sequence count: the region table in [`mm`]);
//! - by default the faulting thread resolves a cache hit itself, in a
//!   SIGBUS handler ([`Delivery::Signal`]), and hands misses to a pager
//!   thread;
//! - under a memory budget ([`Config::memory_budget`]), an evictor runs a
//!   CLOCK hand ([`policy::clock`]) that unmaps pages from every mapping
//!   of their object (the object's interval tree of mappings, its rmap) to
//!   sample their use, evicts what was not used, and puts pages that
//!   refault soon after eviction in the active set
//!   ([`policy::workingset`]);
//! - writable mappings ([`Pager::map_mut`]) track dirty pages with
//!   write-protect faults and write them back on `flush`, from a
//!   background flusher, or before eviction;
//! - a store that fails, comes back short or hangs gives SIGBUS on the
//!   pages it could not read, after retries, and a report naming the
//!   object and offset ([`IoErrorReport`]); an application's
//!   `munmap`/`mremap` of a mapping is noticed through userfaultfd events;
//! - where userfaultfd is refused (a container's seccomp profile, gVisor),
//!   the Protect engine ([`Engine::Protect`], chosen by [`Engine::Auto`])
//!   keeps all of the above but the events: a page not mapped yet carries
//!   a guard marker (or the mapping is `PROT_NONE`), its access raises
//!   SIGSEGV in the faulting thread, and a window is mapped by removing
//!   the markers (or `mprotect`) ([`mm`]'s engine module).
//!
//! # Layers
//!
//! The library is cut into layers, one folder each; a layer uses only the
//! layers below it, and what a lower layer needs from above is passed in
//! (as the fault path gets its pager's userfaultfd, counters and I/O queue
//! in a `FaultEnv`). Bottom to top:
//!
//! | layer | what it is | uses |
//! |---|---|---|
//! | [`sys`] | every raw system call and ioctl, io_uring | nothing |
//! | [`sync`] | the loom shim, sequence counts, SRCU | `sys` |
//! | [`policy`] | fault-around, readahead, CLOCK, workingset: pure decisions | `sys`'s constants |
//! | [`base`] | index newtypes, configuration, counters, error reports | `policy`, `sync`, `sys` |
//! | [`store`] | where bytes come from: the `Store` trait, files, memory | `base`, `policy`, `sys` |
//! | [`cache`] | the page cache: page-state words, chunk pool, memfd, shadows, wait lists | all of the above |
//! | [`mm`] | objects, regions and the mechanisms over them: fault path, reclaim, events | all of the above |
//! | [`api`] | [`Pager`], [`Object`], [`Mapping`] | all of the above |
//!
//! `ARCHITECTURE.md` in the repository follows a fault, a read, an
//! eviction and a write-back through these layers, and lists the
//! invariants that hold them together.
//!
//! ```no_run
//! use faultmap::{Config, FileStore, MapOptions, Pager};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pager = Pager::new(Config::default())?;
//! let store = FileStore::open("data.bin")?;
//! // SAFETY: nobody changes data.bin while it is mapped (see `Pager::map`).
//! let map = unsafe { pager.map(store, MapOptions::new().fault_around_order(9))? };
//! let sum: u64 = map.iter().map(|&b| u64::from(b)).sum();
//! println!("{sum} {:?}", map.stats());
//! # Ok(())
//! # }
//! ```
//!
//! Creating a mapping is `unsafe`, as with memmap2: the caller promises
//! that the store's bytes do not change and that nobody writes a mapping's
//! bytes through another mapping while a slice of it lives; see
//! "Soundness" on [`Mapping`].
//!
//! Requirements: Linux 6.6 or later; [`Pager::new`] checks the kernel's
//! userfaultfd features and names any that is missing (or, with
//! [`Engine::Auto`], runs the Protect engine). Any user can create a
//! pager. Root, read-write access to `/dev/userfaultfd`, or
//! `vm.unprivileged_userfaultfd=1` also lets it serve the faults that the
//! kernel takes on the application's behalf (`write(2)` from a mapping):
//! see [`Pager::serves_kernel_faults`].

// The layers (alphabetical here; bottom to top in the crate doc's table,
// where each uses only the layers below it).
pub mod api;
pub mod base;
pub mod cache;
pub mod mm;
pub mod policy;
pub mod store;
pub mod sync;
pub mod sys;

pub mod measure;

pub use api::errno::errno_of;
pub use api::object::{IntoObject, InvalidateError, Object};
pub use api::pager::{
    Access, Advice, EngineInfo, MapError, Mapping, MappingMut, Pager, PagerError, Prefetched,
    ReadOnly, ReadWrite, ReplayProgress,
};
pub use api::shared::Sharing;
pub use base::config::{
    parse_size, Config, ConfigError, Delivery, DiskCacheConfig, Engine, HandlerPlacement,
    MapOptions, PageSize, RegionLookup, CACHE_DIR_ENV, CACHE_MAX_ENV, ENGINE_ENV, MAX_REPLAY_AHEAD,
    MIN_BUDGET, MIN_HUGE_BUDGET_PAGES, SHARED_ENV,
};
pub use base::report::{error_text, IoErrorKind, IoErrorReport, LOG_CAPACITY};
pub use base::stats::{RaRow, RaStats, Stats};
pub use base::trace::{Trace, TraceError};
pub use cache::CacheError;
pub use mm::engine::AreaStats;
pub use mm::evict::Memory;
pub use mm::writeback::WriteBackError;
pub use policy::readahead::Mode as ReadaheadMode;
#[cfg(not(loom))]
pub use store::{
    open_url, open_url_with, AzureOptions, AzureStore, CachedStore, DiskCache, DiskCacheError,
    DiskCacheStats, GcsOptions, GcsStore, HttpStore, RemoteErrorKind, RemoteTuning, S3Options,
    S3Store,
};
pub use store::{
    FileIo, FileStore, Link, MemStore, ParseFileIoError, ReadBuf, ReadDone, Store, StoreError,
};
pub use sys::rendezvous::DIR_ENV as SHARED_DIR_ENV;
pub use sys::{fork_generation, HUGE_PAGE_SIZE, PAGE_SIZE};
