//! A pager's core: what its threads, its mappings and their regions share.
//!
//! Every region holds its pager's [`Core`] (`Region::owner`): a fault
//! resolved in a SIGBUS or SIGSEGV handler finds there the paging engine
//! to map with and the request slots to forward a miss to; reclaim finds
//! the engine to unmap and write-protect with. The public [`crate::Pager`] (`crate::api::pager`)
//! owns one, and its threads.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::base::stats::{Counters, RaCounters};
use crate::mm::engine::PagingEngine;
use crate::mm::evict::Budget;
use crate::mm::fault::FaultEnv;
use crate::mm::io::{IoQueue, IoShared};
use crate::mm::object::ObjectCore;
use crate::mm::signal::Requests;
use crate::mm::space::RegionTable;

/// What the handler threads share with the pager and its mappings (and a
/// SIGBUS handler reaches through a region's `owner`).
pub(crate) struct Core {
    /// How faults arrive and pages get mapped (`crate::mm::engine`).
    pub(crate) engine: PagingEngine,
    pub(crate) counters: Arc<Counters>,
    pub(crate) ra: RaCounters,
    pub(crate) io: IoQueue,
    pub(crate) speculative: bool,
    pub(crate) global_cache_lock: bool,
    /// Held by the pager thread that reads the userfaultfd and handles the
    /// events it read: events are handled in the order they were read,
    /// and a fault read after an event is handled after it
    /// (`crate::mm::events`).
    pub(crate) reading: std::sync::Mutex<()>,
    /// The holder of `reading` is handling events (under the table's
    /// lock): a thread that finds `reading` taken sleeps on it instead of
    /// polling again.
    pub(crate) handling_events: std::sync::atomic::AtomicBool,
    /// Forwarded faults (signal delivery, and the Protect engine); `None`
    /// with handler threads.
    pub(crate) requests: Option<Arc<Requests>>,
    /// Live non-empty mappings.
    pub(crate) mappings: AtomicUsize,
    /// The memory budget of the objects this pager opens.
    pub(crate) budget: Arc<Budget>,
    /// What the I/O threads and the watchdog share (the error log, the
    /// reads in flight, the objects whose length is polled).
    pub(crate) io_shared: Arc<IoShared>,
    /// The userfaultfd has `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`: mappings can
    /// be writable.
    pub(crate) write_protect: bool,
    /// The userfaultfd has `UFFD_FEATURE_MINOR_HUGETLBFS` and
    /// `UFFD_FEATURE_MISSING_HUGETLBFS`: objects can have 2 MiB pages.
    pub(crate) hugetlb: bool,
    /// A forked child's regions (`crate::mm::guest`); `None`: the
    /// process's table.
    pub(crate) table: Option<Arc<RegionTable>>,
}

impl Core {
    /// The live objects this pager opened or mapped.
    pub(crate) fn objects(&self) -> Vec<Arc<ObjectCore>> {
        self.io_shared.objects()
    }

    pub(crate) fn env(&self) -> FaultEnv<'_> {
        FaultEnv {
            engine: &self.engine,
            table: match &self.table {
                Some(table) => table,
                None => RegionTable::get(),
            },
            counters: &self.counters,
            ra: &self.ra,
            io: &self.io,
            speculative: self.speculative,
            global_cache_lock: self.global_cache_lock,
        }
    }

    /// The same pager serving a forked child's faults: `engine` maps in
    /// the child (its userfaultfd, or its link under Protect) and `table`
    /// holds its regions; the counters, I/O
    /// queue, memory budget and I/O state are this pager's own.
    pub(crate) fn for_guest(&self, engine: PagingEngine, table: Arc<RegionTable>) -> Core {
        Core {
            engine,
            counters: self.counters.clone(),
            ra: RaCounters::default(),
            io: self.io.clone(),
            speculative: self.speculative,
            global_cache_lock: self.global_cache_lock,
            reading: std::sync::Mutex::new(()),
            handling_events: std::sync::atomic::AtomicBool::new(false),
            requests: None,
            mappings: AtomicUsize::new(0),
            budget: self.budget.clone(),
            io_shared: self.io_shared.clone(),
            write_protect: self.write_protect,
            hugetlb: self.hugetlb,
            table: Some(table),
        }
    }

    /// The request slots of a signal-delivery pager.
    pub(crate) fn requests(&self) -> Option<&Arc<Requests>> {
        self.requests.as_ref()
    }
}
