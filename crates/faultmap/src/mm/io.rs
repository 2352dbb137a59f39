//! I/O threads: they read runs of pages from stores into caches, so that no
//! handler thread ever blocks on a store.
//!
//! A fault path that decided to read some pages first *claims* them (ABSENT
//! → READING, see [`crate::cache::page_state`]) and then submits [`ReadJob`]s, each
//! one store request of at most the store's `io_pages`. A job owns the
//! reads of its pages: it fills them through the cache's alias, ends each
//! read (UPTODATE, or ABSENT again if the store failed; a readahead marker
//! set when the window was claimed, `mm::fault::submit_window`, is kept),
//! and wakes the faults parked on the object
//! ([`crate::cache::wait`]).
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
//! Failures: a job whose store call fails is tried again, after a short
//! backoff, up to `Config::io_retries` times before its pages fail; every
//! job is tracked from submission to its end ([`Inflight`]) so that the
//! pager's watchdog can find the ones that outlive `Config::io_timeout`
//! (see [`crate::mm::errors`]).
//!
//! Cancellation: when an object's last handle goes (the application's
//! `Object`s and its mappings', see `crate::Object`'s drop), the object is
//! *closed* (a flag set once, `crate::mm::object::Handles`) and nothing
//! can wait for its pages any more. Its reads then end with it, wherever
//! they are:
//!
//! ```text
//!   queued (async list) ──► cancel_reads_ahead at the close: dropped unread
//!   taken by a thread   ──► run / start: ended unread before the store call
//!                           (checked before the budget's throttle, in the
//!                           wait for a depth slot, and after taking one)
//!   at the store        ──► Pending's drop: whatever the answer, punched
//!                           out, neither cached, retried nor reported
//! ```
//!
//! so a `prefetch` of a large object stops at the close instead of
//! downloading the rest, and its jobs stop holding I/O threads and depth
//! slots (a read at the store holds its slot until the store answers).
//! Each of these ends the job's pages ABSENT, their budget charge given
//! back (`fault::end_reads` with `Dropped` or `Discarded`), and wakes any
//! fault parked on them. Counted in `io_cancelled` (pages).
//!
//! Invariant: every job of a closed object ends (no page is left READING),
//! and every one that sees the close, at any of the checks above, caches
//! nothing. A job is a value that moves from its submitter to the queues,
//! to one thread (`Queued::take`, once, under its lock), to its `Pending`
//! read, and every one of those owners ends it ([`drop_queued`], `run`,
//! `start`, `Pending`'s drop): the flag only chooses *how* it ends, never
//! *whether*. It publishes no data, so a check that misses the close by a
//! moment is benign: that job ends as it would have (one more request,
//! bounded by the I/O threads), and what it cached goes with the object:
//! its memfd and charge are freed when the last of its jobs (and of its
//! unmapped regions, which jobs may hold) lets go of it. Sync jobs: once no
//! mapping exists no fault can wait for one; a fault that raced the unmap
//! is woken, finds its page ABSENT and faults again, on a range its
//! mapping's drop no longer serves. Every submitter holds a handle, so none
//! submits after the close: a mapping's faults and `prefetch` (its
//! `Object`; its region leaves the table before the handle goes), the trace
//! replay (joined by its mapping's drop first). An `Object` without a
//! mapping submits nothing.
//!
//! Shutdown: when the pager and its last mapping are gone, the handler
//! threads are joined first (nothing submits any more), then every I/O
//! thread is sent a stop message. A thread that gets one ends every job
//! still queued before it exits (a queued job's pages are READING; an
//! object can outlive its pager, and a page left READING would make a
//! later fault on it park forever): it runs the ones a fault waits for,
//! and drops the reads ahead unread (their pages ABSENT again, as if never
//! claimed), so that a stopping pager does not first download the rest of
//! a large prefetch. It puts back the other threads' stop messages it
//! met, so that each thread gets its own.

use std::cell::Cell;
use std::collections::HashMap;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select_biased, Receiver, Sender};

use crate::base::index::ObjectPage;
use crate::base::report::{ErrorLog, IoErrorKind};
use crate::base::stats::{Counters, Stats};
use crate::cache::FillTarget;
use crate::mm::errors;
use crate::mm::fault::{self, ReadEnd};
use crate::mm::object::ObjectCore;
use crate::mm::space::Region;
use crate::store::{ReadDone, StoreError};

/// What a pager's I/O threads, its submitters and its watchdog share.
pub(crate) struct IoShared {
    /// The pager's counters.
    pub(crate) counters: Arc<Counters>,
    /// How many times a failed request is tried again.
    pub(crate) retries: u32,
    /// Jobs submitted and not yet ended.
    pub(crate) inflight: Inflight,
    /// The pager's error log.
    pub(crate) log: Arc<ErrorLog>,
    /// The bound on reads in flight.
    depth: Depth,
    /// The objects the pager opened or mapped, for the watchdog's length
    /// poll.
    objects: Mutex<Vec<std::sync::Weak<ObjectCore>>>,
}

impl IoShared {
    pub(crate) fn new(counters: Arc<Counters>, retries: u32, depth: usize) -> Self {
        Self {
            counters,
            retries,
            depth: Depth::new(depth),
            inflight: Inflight::default(),
            log: Arc::new(ErrorLog::default()),
            objects: Mutex::new(Vec::new()),
        }
    }

    /// How many reads may be in flight ([`crate::Config::io_depth`]).
    pub(crate) fn depth(&self) -> usize {
        self.depth.limit()
    }

    /// The live objects the pager opened or mapped (the watchdog's and the
    /// flusher's list).
    pub(crate) fn objects(&self) -> Vec<Arc<ObjectCore>> {
        let mut list = lock(&self.objects);
        list.retain(|o| o.strong_count() > 0);
        list.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// Lists `object` among the pager's objects (the watchdog polls its
    /// length, the flusher writes it back), and sends its error reports to
    /// the pager's log too.
    pub(crate) fn watch(&self, object: &Arc<ObjectCore>) {
        object.errors.attach(&self.log);
        let mut objects = lock(&self.objects);
        objects.retain(|o| o.strong_count() > 0);
        if !objects
            .iter()
            .any(|o| std::ptr::eq(o.as_ptr(), Arc::as_ptr(object)))
        {
            objects.push(Arc::downgrade(object));
        }
    }
}

/// A job being tracked: submitted, queued or running, not yet ended.
struct Tracked {
    object: Arc<ObjectCore>,
    pages: Range<ObjectPage>,
    /// When its clock started: at submission for a read a fault waits
    /// for; for a read ahead, when a fault starts waiting for it
    /// (promotion) or its store call starts, whichever comes first. A
    /// prefetch queued behind others is not late: only a store that does
    /// not answer is.
    since: Option<Instant>,
    /// The watchdog already stalled its pages.
    stalled: bool,
}

/// Every job submitted and not yet ended, with its submission time, for
/// the watchdog.
#[derive(Default)]
pub(crate) struct Inflight {
    next: AtomicU64,
    jobs: Mutex<HashMap<u64, Tracked>>,
}

/// A job that outlived the timeout, as the watchdog gets it.
pub(crate) struct Overdue {
    pub(crate) object: Arc<ObjectCore>,
    pub(crate) pages: Range<ObjectPage>,
    pub(crate) age: Duration,
}

impl Inflight {
    fn add(&self, object: &Arc<ObjectCore>, pages: Range<ObjectPage>, clock: bool) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let tracked = Tracked {
            object: object.clone(),
            pages,
            since: clock.then(Instant::now),
            stalled: false,
        };
        lock(&self.jobs).insert(id, tracked);
        id
    }

    fn remove(&self, id: u64) {
        lock(&self.jobs).remove(&id);
    }

    /// Starts job `id`'s clock, unless it runs already.
    fn start_clock(&self, id: u64) {
        if let Some(t) = lock(&self.jobs).get_mut(&id) {
            t.since.get_or_insert_with(Instant::now);
        }
    }

    /// The jobs older than `timeout` that were not stalled yet, their pages
    /// stalled now (each job is returned once). Under the list's lock: a
    /// job leaves the list before it ends its reads, so the pages stalled
    /// here are still that job's reads.
    pub(crate) fn stall_overdue(&self, timeout: Duration) -> Vec<Overdue> {
        let now = Instant::now();
        let mut jobs = lock(&self.jobs);
        jobs.values_mut()
            .filter(|t| !t.stalled && t.since.is_some_and(|s| now.duration_since(s) >= timeout))
            .map(|t| {
                t.stalled = true;
                for p in t.pages.start.0..t.pages.end.0 {
                    if let Some(state) = t.object.cache.states.get(ObjectPage(p)) {
                        state.stall();
                    }
                }
                Overdue {
                    object: t.object.clone(),
                    pages: t.pages.clone(),
                    age: t.since.map_or(Duration::ZERO, |s| now.duration_since(s)),
                }
            })
            .collect()
    }
}

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
    /// Its entry in [`Inflight`].
    id: u64,
    /// The pager's I/O state it is tracked in, for a cancellation.
    shared: Arc<IoShared>,
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
#[derive(Clone)]
pub(crate) struct IoQueue {
    sync: Sender<Msg>,
    async_: Sender<Msg>,
    shared: Arc<IoShared>,
}

impl IoQueue {
    /// Queues `job`. An async job is also listed on its object, so that a
    /// fault that needs one of its pages can promote it. If the threads are
    /// gone (only while the pager shuts down), runs it on the caller's
    /// thread: a claimed page must be read.
    pub(crate) fn submit(&self, job: ReadJob, urgency: Urgency, _counters: &Counters) {
        let object = job.object.clone();
        let id = self
            .shared
            .inflight
            .add(&object, job.pages.clone(), urgency == Urgency::Sync);
        let queued = Arc::new(Queued {
            id,
            shared: self.shared.clone(),
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
            run_queued(&queued, &self.shared, &mut || false);
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
            self.shared.inflight.start_clock(queued.id);
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
    /// Starts `n` threads that add their counts to `shared.counters` (the
    /// pager's).
    pub(crate) fn start(n: usize, shared: Arc<IoShared>) -> std::io::Result<(IoThreads, IoQueue)> {
        let (sync_tx, sync_rx) = crossbeam_channel::unbounded();
        let (async_tx, async_rx) = crossbeam_channel::unbounded();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let (sync_rx, async_rx, shared) = (sync_rx.clone(), async_rx.clone(), shared.clone());
            let stops = sync_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("faultmap-io-{i}"))
                .spawn(move || io_loop(&sync_rx, &async_rx, &stops, &shared))?;
            threads.push(handle);
        }
        let queue = IoQueue {
            sync: sync_tx.clone(),
            async_: async_tx,
            shared,
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

impl IoThreads {
    /// Tells every thread to stop (each runs the jobs still queued first)
    /// and returns them, for the caller to join, or to give up on: a
    /// thread inside a store call that never returns is left to finish on
    /// its own. It owns (through `Arc`s) everything its job touches (the
    /// object, its cache and alias, the region and its pager's
    /// userfaultfd), so a late completion touches nothing that is gone.
    pub(crate) fn stop(mut self) -> Vec<JoinHandle<()>> {
        for _ in &self.threads {
            let _ = self.sync.send(Msg::Stop);
        }
        std::mem::take(&mut self.threads)
    }
}

/// Joins `threads`, waiting until `deadline` at the latest; the ones still
/// running then (inside a store call that has not returned) are detached,
/// their handles dropped. Returns how many.
pub(crate) fn join_until(threads: Vec<JoinHandle<()>>, deadline: Instant) -> usize {
    let mut running = threads;
    let mut pause = Duration::from_micros(50);
    loop {
        let (done, rest): (Vec<_>, Vec<_>) = running.into_iter().partition(|t| t.is_finished());
        for t in done {
            let _ = t.join();
        }
        running = rest;
        if running.is_empty() || Instant::now() >= deadline {
            return running.len();
        }
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(Duration::from_millis(10));
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

thread_local! {
    /// Whether this thread is one of the pagers' I/O threads.
    static IO_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn io_loop(
    sync: &Receiver<Msg>,
    async_: &Receiver<Msg>,
    stops: &Sender<Msg>,
    shared: &Arc<IoShared>,
) {
    IO_THREAD.with(|t| t.set(true));
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
            Msg::Read(queued) => {
                // While this thread waits for a depth slot, it runs the
                // reads that faults wait for (they take none), so that a
                // full depth of reads ahead never holds up a miss.
                let mut stops_met = 0;
                run_queued(&queued, shared, &mut || match sync.try_recv() {
                    Ok(Msg::Read(urgent)) => {
                        run_queued(&urgent, shared, &mut || false);
                        true
                    }
                    Ok(Msg::Stop) => {
                        stops_met += 1;
                        true
                    }
                    Err(_) => false,
                });
                for _ in 0..stops_met {
                    let _ = stops.send(Msg::Stop);
                }
            }
            Msg::Stop => {
                // Every queued job holds claimed pages: the ones faults
                // wait for (sync, or promoted) run; reads ahead are dropped
                // unread, their pages ABSENT again, so that a stopping
                // pager does not first download the rest of a large
                // prefetch. The other threads' stop messages met on the way
                // go back, so that each thread gets its own.
                let mut others = 0;
                for msg in sync.try_iter() {
                    match msg {
                        Msg::Read(queued) => run_queued(&queued, shared, &mut || false),
                        Msg::Stop => others += 1,
                    }
                }
                for msg in async_.try_iter() {
                    match msg {
                        Msg::Read(queued) if queued.promoted.load(Ordering::Acquire) => {
                            run_queued(&queued, shared, &mut || false)
                        }
                        Msg::Read(queued) => drop_queued(&queued, shared),
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
fn run_queued(queued: &Arc<Queued>, shared: &Arc<IoShared>, service: &mut dyn FnMut() -> bool) {
    let Some(job) = queued.take() else {
        return;
    };
    lock(&job.object.queued).retain(|q| !Arc::ptr_eq(q, queued));
    let urgent = queued.promoted.load(Ordering::Acquire);
    run(job, shared, queued.id, urgent, service);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An error and its sources, as one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Runs one job: waits for room in the memory budget, then starts its
/// read.
fn run(
    job: ReadJob,
    shared: &Arc<IoShared>,
    id: u64,
    urgent: bool,
    service: &mut dyn FnMut() -> bool,
) {
    if job.object.is_closed() {
        return end_unread(job, shared, id, ReadEnd::Dropped);
    }
    // Over the memory budget: wait for the evictor first (direct reclaim).
    job.object.budget.throttle();
    start(job, shared.clone(), id, 0, urgent, service);
}

/// How many times a read whose huge pages the pool could not give waits
/// for the budget's evictor before it fails (each wait at most the
/// throttle's limit, 100 ms).
const ALLOCATE_RETRIES: usize = 5;

/// Starts attempt `attempt` of `job`'s read: takes a slot of the pager's
/// depth (not for an urgent read: a fault waits for it, or it is a retry;
/// `service` runs other work while it waits, see [`Depth::acquire`]),
/// hands the store a buffer over the job's pages, and leaves the rest to
/// the [`Pending`] read, which ends the job when both the store's answer
/// and the buffer are gone.
fn start(
    job: ReadJob,
    shared: Arc<IoShared>,
    id: u64,
    attempt: u32,
    urgent: bool,
    service: &mut dyn FnMut() -> bool,
) {
    let object = job.object.clone();
    if object.is_closed() {
        // Taken off its queue just before the object closed, or a retry
        // (whose failed attempt may have written some pages: punched).
        let end = if attempt == 0 {
            ReadEnd::Dropped
        } else {
            ReadEnd::Discarded
        };
        return end_unread(job, &shared, id, end);
    }
    let Some(target) = object.cache.fill_target(job.pages.clone()) else {
        return finish(job, &shared, id, Ok(0), attempt);
    };
    // 2 MiB pages are allocated before the store writes them (see
    // `Cache::allocate`); an empty pool fails the read, unless the budget's
    // evictor can give some back.
    let mut allocated = object.cache.allocate(&target);
    for _ in 0..ALLOCATE_RETRIES {
        let full = matches!(&allocated, Err(e) if crate::cache::memfd::PoolEmpty::is(e));
        if !full || !object.budget.make_room() {
            break;
        }
        allocated = object.cache.allocate(&target);
    }
    if let Err(source) = allocated {
        let error = StoreError::Read {
            name: object.store.name().to_string(),
            offset: target.start as u64,
            len: target.data_len,
            source,
        };
        return finish(job, &shared, id, Err(error), attempt);
    }
    // Closed while this waited for the budget, the pool or a slot (the
    // wait for a slot gives up when it closes; a close just after the slot
    // was taken is seen here): nothing is asked of the store.
    // `Discarded`, since pages may have been allocated.
    let slot = shared
        .depth
        .acquire(urgent, service, &|| object.is_closed());
    if !slot || object.is_closed() {
        if slot {
            shared.depth.release();
        }
        return end_unread(job, &shared, id, ReadEnd::Discarded);
    }
    // The store call starts now: the watchdog's clock runs.
    shared.inflight.start_clock(id);
    let pending = Arc::new(Pending {
        job: Mutex::new(Some(job)),
        result: Mutex::new(None),
        shared,
        id,
        attempt,
        target,
    });
    // SAFETY: the job owns the reads of its pages (its submitter claimed
    // them, ABSENT -> READING), and they end only when the `Pending` read
    // drops, which is after this buffer is gone (the buffer holds a
    // reference to it). The `Pending` holds the job, whose object owns the
    // cache.
    let buf = unsafe { object.cache.fill_buf(&target, pending.clone()) };
    let answer = pending.clone();
    let done: ReadDone = Box::new(move |buf, result| {
        drop(buf);
        answer.answer(result);
    });
    let offset = target.start as u64;
    let len = target.data_len;
    let call = panic::catch_unwind(AssertUnwindSafe(|| {
        object.store.start_read(offset, buf, done)
    }));
    if let Err(payload) = call {
        // The store's answer is lost with the panic: this is it.
        pending.answer(Err(StoreError::Read {
            name: object.store.name().to_string(),
            offset,
            len,
            source: std::io::Error::other(format!("the store panicked: {}", panic_text(&payload))),
        }));
    }
}

/// A read in flight: the job, and the store's answer when it comes. Its
/// buffer and the store's callback each hold a reference; when the last
/// goes, the read is over and [`Drop`] ends it (a store that drops the
/// callback without calling it fails the read).
struct Pending {
    job: Mutex<Option<ReadJob>>,
    result: Mutex<Option<Result<(), StoreError>>>,
    shared: Arc<IoShared>,
    id: u64,
    attempt: u32,
    target: FillTarget,
}

impl Pending {
    /// Records the store's answer (the first one counts).
    fn answer(&self, result: Result<(), StoreError>) {
        let mut slot = lock(&self.result);
        if slot.is_none() {
            *slot = Some(result);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(job) = self.job.get_mut().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        self.shared.depth.release();
        let result = self
            .result
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_else(|| {
                Err(StoreError::Read {
                    name: job.object.store.name().to_string(),
                    offset: self.target.start as u64,
                    len: self.target.data_len,
                    source: std::io::Error::other("the store dropped the read without an answer"),
                })
            });
        if job.object.is_closed() {
            // The object closed while its read was at the store: whatever
            // the answer, nothing is kept, retried or reported. What was
            // transferred is counted.
            let tally = Stats {
                io_bytes: if result.is_ok() {
                    self.target.data_len as u64
                } else {
                    0
                },
                io_retries: u64::from(self.attempt),
                ..Stats::default()
            };
            job.object.counters.add(&tally);
            self.shared.counters.add(&tally);
            return end_unread(job, &self.shared, self.id, ReadEnd::Discarded);
        }
        match result {
            // Tried again after a backoff, urgent: a retry never waits
            // for a depth slot (this may be a thread that the reads in
            // flight need to end). On an I/O thread it sleeps there, as a
            // synchronous store's retry always did; on another thread (an
            // asynchronous store's runtime, which every remote read of the
            // process shares) a thread of its own sleeps instead.
            Err(e) if self.attempt < self.shared.retries && e.is_transient() => {
                let (shared, id, attempt) = (self.shared.clone(), self.id, self.attempt);
                let retry = move || {
                    std::thread::sleep(errors::backoff(attempt));
                    start(job, shared, id, attempt + 1, true, &mut || false);
                };
                if IO_THREAD.with(Cell::get) {
                    retry();
                } else {
                    let slot = Arc::new(Mutex::new(Some(retry)));
                    let theirs = slot.clone();
                    let spawned = std::thread::Builder::new()
                        .name("faultmap-retry".into())
                        .spawn(move || {
                            if let Some(retry) = lock(&theirs).take() {
                                retry();
                            }
                        });
                    if spawned.is_err() {
                        // No thread to be had: the retry runs here.
                        if let Some(retry) = lock(&slot).take() {
                            retry();
                        }
                    }
                }
            }
            Ok(()) => {
                job.object.cache.fill_finish(&self.target);
                finish(
                    job,
                    &self.shared,
                    self.id,
                    Ok(self.target.data_len),
                    self.attempt,
                );
            }
            Err(e) => finish(job, &self.shared, self.id, Err(e), self.attempt),
        }
    }
}

/// The text of a panic's payload.
fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Ends a job after its last attempt: counts it, ends its pages' reads
/// (UPTODATE, or ABSENT again on failure, with a report), wakes the
/// faults parked on them.
fn finish(
    job: ReadJob,
    shared: &IoShared,
    id: u64,
    result: Result<usize, StoreError>,
    retries: u32,
) {
    let object = &*job.object;
    let mut tally = Stats {
        io_retries: u64::from(retries),
        ..Stats::default()
    };
    // Untracked before its reads end: see `Inflight::stall_overdue`.
    shared.inflight.remove(id);
    let end = match result {
        Ok(bytes) => {
            tally.io_bytes = bytes as u64;
            ReadEnd::Read
        }
        Err(e) => {
            tally.io_errors = 1;
            let start = object.cache.offset(job.pages.start).min(object.len);
            let end = object.cache.offset(job.pages.end).min(object.len);
            object.report(IoErrorKind::Read, start..end, error_chain(&e));
            ReadEnd::Failed
        }
    };
    // Counted before the reads end: a thread woken by them that reads the
    // counters sees this read.
    object.counters.add(&tally);
    shared.counters.add(&tally);
    if let Some(region) = &job.region {
        region.counters.add(&tally);
    }
    let waiters = fault::end_reads(object, job.pages.clone(), end, job.demand);
    if waiters {
        let poison = job
            .demand
            .filter(|_| end == ReadEnd::Failed && job.last_chance);
        fault::settle_parked(object, poison);
    }
}

/// Drops a queued read-ahead job unread (its pager stops, and no fault
/// waits for it): its pages go back to ABSENT, as if never claimed, and
/// the next fault on one reads it. A fault that parked on one meanwhile
/// promoted the job, which is then run instead (see the stop in
/// [`io_loop`]).
fn drop_queued(queued: &Arc<Queued>, shared: &IoShared) {
    let Some(job) = queued.take() else {
        return;
    };
    lock(&job.object.queued).retain(|q| !Arc::ptr_eq(q, queued));
    end_unread(job, shared, queued.id, ReadEnd::Dropped);
}

/// The last handle of `object` went (it is closed): drops its jobs still
/// queued, unread (nothing can wait for them once nothing maps the object;
/// a fault that raced the unmap is woken and finds its page ABSENT). A job
/// an I/O thread took already is ended before its store call, or when
/// that call returns (see the module documentation).
pub(crate) fn cancel_reads_ahead(object: &ObjectCore) {
    let listed = std::mem::take(&mut *lock(&object.queued));
    for queued in listed {
        drop_queued(&queued, &queued.shared.clone());
    }
}

/// Ends a job without caching its pages: ABSENT again and uncharged, the
/// faults parked on them woken. `Dropped`: never asked of the store
/// (shutdown, or its object closed); `Discarded`: read, but its object
/// closed meanwhile (the bytes are punched out). Counts the pages in
/// `io_cancelled` when the object is closed.
fn end_unread(job: ReadJob, shared: &IoShared, id: u64, end: ReadEnd) {
    shared.inflight.remove(id);
    let object = &*job.object;
    if object.is_closed() {
        let tally = Stats {
            io_cancelled: job.pages.end.0 - job.pages.start.0,
            ..Stats::default()
        };
        object.counters.add(&tally);
        shared.counters.add(&tally);
    }
    if fault::end_reads(object, job.pages.clone(), end, None) {
        fault::settle_parked(object, None);
    }
}

/// The pager's bound on reads in flight ([`crate::Config::io_depth`]).
pub(crate) struct Depth {
    limit: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Depth {
    /// How many reads may be in flight.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Takes a slot: waits for one unless `urgent` (then it may go over).
    /// While it waits it calls `service`, which runs other work (an I/O
    /// thread's urgent reads) and says whether it found any; when it found
    /// none, it sleeps until a slot is freed, a millisecond at most.
    /// Returns false, without a slot, once `cancelled` says so (the read's
    /// object closed: it must not hold its thread until a slot is free).
    fn acquire(
        &self,
        urgent: bool,
        service: &mut dyn FnMut() -> bool,
        cancelled: &dyn Fn() -> bool,
    ) -> bool {
        loop {
            {
                let mut used = lock(&self.used);
                if urgent || *used < self.limit {
                    *used += 1;
                    return true;
                }
            }
            if cancelled() {
                return false;
            }
            if !service() {
                let used = lock(&self.used);
                if *used >= self.limit {
                    let _ = self.freed.wait_timeout(used, Duration::from_millis(1));
                }
            }
        }
    }

    fn release(&self) {
        let mut used = lock(&self.used);
        *used = used.saturating_sub(1);
        drop(used);
        self.freed.notify_one();
    }
}
