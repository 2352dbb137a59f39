//! I/O threads: they read runs of pages from stores into caches, so that no
//! handler thread ever blocks on a store.
//!
//! A fault path that decided to read some pages first *claims* them (ABSENT
//! → READING, see [`crate::page_state`]) and then submits [`ReadJob`]s, each
//! one store request of at most the store's `io_pages`. A job owns the
//! reads of its pages: it fills them through the cache's alias, ends each
//! read (UPTODATE, or ABSENT again if the store failed), sets the readahead
//! marker on its marker page, and wakes the faults parked on the object
//! ([`crate::wait`]).
//!
//! Two queues: *sync* jobs hold pages that a faulting thread is waiting for
//! (the part of a miss's window that contains the faulting page), *async*
//! jobs hold pages read ahead. A free thread always takes a sync job first,
//! so a miss never waits behind a long async window (the kernel gets the
//! same effect from the faulting folio's lock being the first it waits on).
//! A fault that parks on a page whose async job is still queued *promotes*
//! that job: it goes on the sync queue too, and whichever thread takes it
//! first runs it (jobs are taken once).
//!
//! ```text
//!   handler: claim window → split into requests → submit (fault's first)
//!                                                    │
//!   I/O thread:  sync queue ─┬─► fill ─► end reads ─► wake parked faults
//!                async queue ┘
//! ```
//!
//! Shutdown: when the pager and its last mapping are gone, the handler
//! threads are joined first (nothing submits any more), then every I/O
//! thread is sent a stop message. A thread that gets one runs every job
//! still queued before it exits (a queued job's pages are READING; an
//! object can outlive its pager, and a page left READING would make a
//! later fault on it park forever), and puts back the other threads' stop
//! messages it met, so that each thread gets its own.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{select_biased, Receiver, Sender};

use crate::fault;
use crate::object::{ObjectCore, ObjectPage};
use crate::space::Region;
use crate::stats::{Counters, Stats};

/// One store request: pages that the submitter claimed (they are READING).
pub(crate) struct ReadJob {
    /// The object whose pages these are.
    pub(crate) object: Arc<ObjectCore>,
    /// The pages, claimed by the submitter; the job now owns their reads.
    pub(crate) pages: Range<ObjectPage>,
    /// The page a fault asked for, if it is in `pages` (every other page is
    /// read ahead, for the miss ratio).
    pub(crate) demand: Option<ObjectPage>,
    /// The mapping whose fault submitted it, for its counters.
    pub(crate) region: Option<Arc<Region>>,
    /// The demand page's last chance: its previous read failed, and if this
    /// one fails too, the faults waiting for it get SIGBUS.
    pub(crate) last_chance: bool,
}

/// A queued job, taken once: a job can be on both queues (promoted), and
/// whichever thread gets it first runs it.
pub(crate) struct Queued {
    job: Mutex<Option<ReadJob>>,
    pages: Range<ObjectPage>,
    promoted: AtomicBool,
}

impl Queued {
    /// Takes the job, if no thread took it yet.
    fn take(&self) -> Option<ReadJob> {
        self.job.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

enum Msg {
    Read(Arc<Queued>),
    Stop,
}

/// How urgently a job is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// A faulting thread waits for it.
    Sync,
    /// Read ahead.
    Async,
}

/// The submitting side, shared by the pager's handler threads.
pub(crate) struct IoQueue {
    sync: Sender<Msg>,
    async_: Sender<Msg>,
}

impl IoQueue {
    /// Queues `job`. An async job is also listed on its object, so that a
    /// fault that needs one of its pages can promote it. If the threads are
    /// gone (only while the pager shuts down), runs it on the caller's
    /// thread: a claimed page must be read.
    pub(crate) fn submit(&self, job: ReadJob, urgency: Urgency, counters: &Counters) {
        let object = job.object.clone();
        let queued = Arc::new(Queued {
            pages: job.pages.clone(),
            job: Mutex::new(Some(job)),
            promoted: AtomicBool::new(urgency == Urgency::Sync),
        });
        let tx = match urgency {
            Urgency::Sync => &self.sync,
            Urgency::Async => {
                lock(&object.queued).push(queued.clone());
                &self.async_
            }
        };
        if tx.send(Msg::Read(queued.clone())).is_err() {
            run_queued(&queued, counters);
        }
    }

    /// A fault waits for `page` of `object`, whose read is queued (async):
    /// moves that job to the sync queue, once. The kernel gets the same
    /// effect from the waiter sleeping on the folio's own lock.
    pub(crate) fn promote(&self, object: &ObjectCore, page: ObjectPage) {
        let list = lock(&object.queued);
        let Some(queued) = list.iter().find(|q| q.pages.contains(&page)) else {
            return;
        };
        if !queued.promoted.swap(true, Ordering::AcqRel) {
            let _ = self.sync.send(Msg::Read(queued.clone()));
        }
    }
}

/// The I/O threads of a pager.
pub(crate) struct IoThreads {
    sync: Sender<Msg>,
    threads: Vec<JoinHandle<()>>,
}

impl IoThreads {
    /// Starts `n` threads that add their counts to `counters` (the pager's).
    pub(crate) fn start(
        n: usize,
        counters: Arc<Counters>,
    ) -> std::io::Result<(IoThreads, IoQueue)> {
        let (sync_tx, sync_rx) = crossbeam_channel::unbounded();
        let (async_tx, async_rx) = crossbeam_channel::unbounded();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let (sync_rx, async_rx, counters) =
                (sync_rx.clone(), async_rx.clone(), counters.clone());
            let stops = sync_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("faultmap-io-{i}"))
                .spawn(move || io_loop(&sync_rx, &async_rx, &stops, &counters))?;
            threads.push(handle);
        }
        let queue = IoQueue {
            sync: sync_tx.clone(),
            async_: async_tx,
        };
        Ok((
            IoThreads {
                sync: sync_tx,
                threads,
            },
            queue,
        ))
    }
}

impl Drop for IoThreads {
    fn drop(&mut self) {
        for _ in &self.threads {
            let _ = self.sync.send(Msg::Stop);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn io_loop(sync: &Receiver<Msg>, async_: &Receiver<Msg>, stops: &Sender<Msg>, counters: &Counters) {
    loop {
        // Sync first: a try on the sync queue, then whichever is ready with
        // the sync queue preferred.
        let msg = match sync.try_recv() {
            Ok(msg) => msg,
            Err(_) => select_biased! {
                recv(sync) -> msg => msg,
                recv(async_) -> msg => msg,
            }
            .unwrap_or(Msg::Stop),
        };
        match msg {
            Msg::Read(queued) => run_queued(&queued, counters),
            Msg::Stop => {
                // Every queued job holds claimed pages: run them all. The
                // other threads' stop messages met on the way go back, so
                // that each thread gets its own.
                let mut others = 0;
                for msg in sync.try_iter().chain(async_.try_iter()) {
                    match msg {
                        Msg::Read(queued) => run_queued(&queued, counters),
                        Msg::Stop => others += 1,
                    }
                }
                for _ in 0..others {
                    let _ = stops.send(Msg::Stop);
                }
                return;
            }
        }
    }
}

/// Runs a queued job unless another thread took it first (it was on both
/// queues), unlisting it from its object.
fn run_queued(queued: &Arc<Queued>, counters: &Counters) {
    let Some(job) = queued.take() else {
        return;
    };
    lock(&job.object.queued).retain(|q| !Arc::ptr_eq(q, queued));
    run(job, counters);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs one job: fills its pages, ends their reads, wakes parked faults.
fn run(job: ReadJob, pager: &Counters) {
    let object = &*job.object;
    // Over the memory budget: wait for the evictor first (direct reclaim).
    object.budget.throttle();
    let result = object.cache.fill(&*object.store, job.pages.clone());
    let mut tally = Stats::default();
    let ok = match result {
        Ok(bytes) => {
            tally.io_bytes = bytes as u64;
            true
        }
        Err(_) => {
            tally.io_errors = 1;
            false
        }
    };
    // Counted before the reads end: a thread woken by them that reads the
    // counters sees this read.
    object.counters.add(&tally);
    pager.add(&tally);
    if let Some(region) = &job.region {
        region.counters.add(&tally);
    }
    let waiters = fault::end_reads(object, job.pages.clone(), ok, job.demand);
    if waiters {
        let poison = job.demand.filter(|_| !ok && job.last_chance);
        fault::settle_parked(object, poison);
    }
}
