//! The object: a store, its page cache, and what the mechanisms keep on it.
//!
//! [`ObjectCore`] is what every mapping of an object shares: the cache (only
//! the first mapping to touch a page reads it from the store; the others'
//! faults are MINOR and map the cached page), the readahead state
//! (`file_ra_state`), the regions that map it (the rmap), its share of a
//! memory budget, its dirty state and its error log. The application holds
//! it through counted [`crate::Object`] handles (`crate::api::object`).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::base::report::{IoErrorKind, IoErrorReport, ObjectErrors};
use crate::base::stats::{Counters, RaCounters};
use crate::cache::shadow::Shadows;
use crate::cache::wait::WaitList;
use crate::cache::Cache;
use crate::mm::evict::Budget;

/// The smallest readahead window of an object of 2 MiB pages (unless
/// readahead is off): 4 pages, so that a window has an async part.
const HUGE_MIN_RA_PAGES: u64 = 4;
use crate::mm::fault::Waiter;
use crate::mm::rmap::Rmap;
use crate::mm::space::Region;
use crate::policy::readahead::RaState;
use crate::store::Store;
use crate::sync::{AtomicBool, AtomicUsize};

pub(crate) struct ObjectCore {
    /// The fork generation that opened it ([`crate::sys::fork_generation`]):
    /// a forked child's handles leave it be.
    pub(crate) born: u64,
    /// Dropped by `ObjectCore`'s drop, except in a forked child (a remote
    /// store's connections belong to the parent's network runtime; a
    /// store's own drop may join a thread the child does not have).
    pub(crate) store: std::mem::ManuallyDrop<Box<dyn Store>>,
    pub(crate) cache: Cache,
    /// The store's length when the object was opened.
    pub(crate) len: u64,
    /// Counters of all mappings of this object.
    pub(crate) counters: Counters,
    /// Readahead counters of all mappings of this object.
    pub(crate) ra: RaCounters,
    /// Faults parked until a read in flight ends.
    pub(crate) waiters: WaitList<Waiter>,
    /// The readahead state but its lock-free counts (`mmap_miss`, `prev`,
    /// `around_used`): the window (`file_ra_state`'s start, size,
    /// async_size) and the adaptive read-around window. Taken only on
    /// misses and marker hits, never in a signal handler (those are
    /// forwarded to a pager thread).
    pub(crate) ra_window: Mutex<RaState>,
    /// `file_ra_state.mmap_miss`: updated without the lock on every hit,
    /// racily, as the kernel does.
    pub(crate) mmap_miss: AtomicU32,
    /// The last page the previous fault mapped, `u64::MAX` before any.
    pub(crate) prev: AtomicU64,
    /// `RaState::around_used`: updated without the lock on hits, racily,
    /// as `mmap_miss` is.
    pub(crate) around_used: AtomicU64,
    /// Async read jobs queued and not yet taken, for promotion.
    pub(crate) queued: Mutex<Vec<Arc<crate::mm::io::Queued>>>,
    /// The regions that map this object, by the object pages they cover
    /// (`crate::mm::rmap`): for the hand's unmapping, eviction, invalidation.
    pub(crate) rmap: Rmap,
    /// The memory budget this object's pages are charged to.
    pub(crate) budget: Arc<Budget>,
    /// Pages of this object charged to the budget.
    pub(crate) charged: AtomicU64,
    /// Shadows of evicted pages, for refault detection.
    pub(crate) shadows: Shadows,
    /// Store failures: the error log, the pager logs it feeds, the end
    /// after a truncation (`crate::mm::errors`).
    pub(crate) errors: ObjectErrors,
    /// The store's `io_pages`, asked once (a panic there is the default).
    pub(crate) io_pages: u64,
    /// The store's `ra_pages`, asked once (a panic there is the default).
    pub(crate) ra_pages: u64,
    /// The store's `around_pages`, asked once (`None`: `ra_pages`).
    pub(crate) around_pages: Option<u64>,
    /// The evictor of the object's own budget (`Pager::open_with_budget`):
    /// it stops when the object goes.
    pub(crate) evictor: std::sync::Mutex<Option<crate::mm::evict::Evictor>>,
    /// Dirty count, error sequence, sync state (`crate::mm::writeback`).
    pub(crate) wb: crate::mm::writeback::ObjectWb,
    /// Live [`crate::Object`] handles (every [`crate::Mapping`] holds one),
    /// and whether the last went: then its reads are cancelled and the
    /// final write-back runs (see `Object`'s drop).
    handles: Handles,
    /// Hosted for unrelated processes (`crate::mm::guest::host`): unhosted
    /// when it closes.
    pub(crate) hosted: std::sync::atomic::AtomicBool,
    /// How long the last handle's drop waits for the final write-back:
    /// `Config::io_timeout` plus a second, of the pager that opened it.
    grace: Duration,
}

impl Drop for ObjectCore {
    /// The last handle went: dirty pages are written back, best effort
    /// (`crate::mm::writeback::on_drop`); the memfd goes with the object, so
    /// its pages leave the budget.
    fn drop(&mut self) {
        if self.born != crate::sys::fork_generation() {
            // A forked child's last handle: the parent writes the dirty
            // pages back, and the evictor thread and the store are the
            // parent's (a lock of theirs may be held by a thread that is
            // not here): both are leaked.
            std::mem::forget(
                self.evictor
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(),
            );
            return;
        }
        // The object's own evictor stops (not joined: this may be its own
        // thread, which held the last handle; it exits at its next look).
        if let Some(evictor) = self
            .evictor
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            drop(evictor.stop());
        }
        crate::mm::writeback::on_drop(self);
        let n = self.charged.load(Ordering::Relaxed);
        self.budget.uncharge_base(self, n);
        self.budget
            .deactivated(self, self.cache.states.count_active());
        // SAFETY: dropped once, here, the last use of the store (the
        // object goes with this drop).
        unsafe { std::mem::ManuallyDrop::drop(&mut self.store) };
    }
}

impl ObjectCore {
    /// A new object over `store` with its cache.
    /// `grace`: how long its last handle's drop waits for the final
    /// write-back; `evictor`: the thread of a budget of its own.
    pub(crate) fn new(
        store: Box<dyn Store>,
        cache: Cache,
        len: u64,
        budget: Arc<Budget>,
        grace: Duration,
        evictor: Option<crate::mm::evict::Evictor>,
    ) -> Self {
        // A store that panics must not take the caller down; its answers
        // are asked here once, each caught.
        let ask = |f: &dyn Fn() -> u64, default: u64| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(default)
        };
        let io_pages = ask(&|| store.io_pages(), 256).clamp(1, crate::base::config::MAX_RA_PAGES);
        let ra_pages = ask(
            &|| store.ra_pages(),
            crate::policy::readahead::DEFAULT_RA_PAGES,
        )
        .min(crate::base::config::MAX_RA_PAGES);
        let around_pages =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.around_pages()))
                .unwrap_or(None);
        // The store counts 4 KiB pages; the object counts its own (a
        // window of some 4 KiB pages is at least one 2 MiB page).
        // Readahead needs a window of a few pages to run ahead at all (one
        // page leaves no async part): 4 pages, 8 MiB, at least.
        let scale = cache.page_size().base_pages();
        let window = |p: u64| match (p, scale) {
            (0, _) | (_, 1) => p,
            _ => p.div_ceil(scale).max(HUGE_MIN_RA_PAGES),
        };
        let (io_pages, ra_pages, around_pages) = (
            io_pages.div_ceil(scale),
            window(ra_pages),
            around_pages.map(window),
        );
        Self {
            born: crate::sys::fork_generation(),
            handles: Handles::new(),
            hosted: std::sync::atomic::AtomicBool::new(false),
            grace,
            io_pages,
            ra_pages,
            around_pages,
            evictor: std::sync::Mutex::new(evictor),
            store: std::mem::ManuallyDrop::new(store),
            cache,
            len,
            counters: Counters::default(),
            ra: RaCounters::default(),
            waiters: WaitList::default(),
            ra_window: Mutex::new(RaState::default()),
            mmap_miss: AtomicU32::new(0),
            prev: AtomicU64::new(u64::MAX),
            around_used: AtomicU64::new(0),
            queued: Mutex::new(Vec::new()),
            rmap: Rmap::default(),
            budget,
            charged: AtomicU64::new(0),
            shadows: Shadows::default(),
            errors: ObjectErrors::new(len),
            wb: crate::mm::writeback::ObjectWb::default(),
        }
    }

    /// Counts one more [`crate::Object`] handle.
    pub(crate) fn acquire(&self) {
        self.handles.acquire();
    }

    /// Counts one handle more if one lives (a hosted object's joiner, or
    /// a second map of it in this process): false if it closed.
    pub(crate) fn try_acquire(&self) -> bool {
        self.handles.try_acquire()
    }

    /// Counts one handle fewer; returns whether it was the last (the
    /// object is then closed, and the caller cancels its reads and runs
    /// the final write-back, see `Object`'s drop).
    pub(crate) fn release(&self) -> bool {
        self.handles.release()
    }

    /// Whether the last handle went: nothing maps the object, and no one
    /// can open it again through a handle (`crate::mm::io` then caches
    /// nothing more of it).
    pub(crate) fn is_closed(&self) -> bool {
        self.handles.is_closed()
    }

    /// How long the last handle's drop waits for the final write-back.
    pub(crate) fn grace(&self) -> Duration {
        self.grace
    }

    /// Logs a store failure on `bytes` of this object, on the object and on
    /// every pager that opened or mapped it (see [`crate::mm::errors`]).
    pub(crate) fn report(&self, kind: IoErrorKind, bytes: Range<u64>, message: String) {
        self.errors.report(IoErrorReport {
            object: self.store.name().to_string(),
            offset: bytes.start,
            len: bytes.end.saturating_sub(bytes.start),
            kind,
            message,
        });
    }

    /// Records that `region` maps this object.
    pub(crate) fn add_mapping(&self, region: &Arc<Region>) {
        self.rmap.insert(region.object_pages(), region);
    }

    /// Forgets `region` (being unmapped).
    pub(crate) fn remove_mapping(&self, region: &Region) {
        self.rmap.remove(region.object_pages(), region);
    }

    /// Runs a readahead decision on the object's whole readahead state,
    /// under its lock (misses and marker hits).
    pub(crate) fn with_ra_state<T>(&self, f: impl FnOnce(&mut RaState) -> T) -> T {
        let mut window = self.ra_window.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.with_counts(*window);
        let out = f(&mut st);
        *window = st;
        self.store_ra_counts(&st);
        out
    }

    /// Runs a readahead update that touches only `mmap_miss`, `prev` and
    /// `around_used`, without a lock (hits, fault-around; a SIGBUS handler
    /// may run it).
    pub(crate) fn with_ra_counts<T>(&self, f: impl FnOnce(&mut RaState) -> T) -> T {
        let mut st = self.ra_counts();
        let out = f(&mut st);
        self.store_ra_counts(&st);
        out
    }

    /// The whole readahead state, read only.
    pub(crate) fn ra_snapshot(&self) -> RaState {
        let window = *self.ra_window.lock().unwrap_or_else(|e| e.into_inner());
        self.with_counts(window)
    }

    fn ra_counts(&self) -> RaState {
        self.with_counts(RaState::default())
    }

    /// `locked` with the lock-free counts as they are now.
    fn with_counts(&self, locked: RaState) -> RaState {
        let prev = self.prev.load(Ordering::Relaxed);
        RaState {
            mmap_miss: self.mmap_miss.load(Ordering::Relaxed),
            prev: (prev != u64::MAX).then_some(prev),
            around_used: self.around_used.load(Ordering::Relaxed),
            ..locked
        }
    }

    fn store_ra_counts(&self, st: &RaState) {
        self.mmap_miss.store(st.mmap_miss, Ordering::Relaxed);
        self.prev
            .store(st.prev.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.around_used.store(st.around_used, Ordering::Relaxed);
    }
}

/// What the release of an object's last handle runs (`crate::Object`'s
/// drop, and the end of a forked child that held one, `crate::mm::guest`):
/// its reads ahead are cancelled (queued ones dropped unread, those in
/// flight not cached, see `crate::mm::io`), and its dirty pages are
/// written back, best effort, on a thread of their own that this waits for
/// at most `Config::io_timeout` plus a second. A store write that never
/// returns leaves that thread behind, holding the object's parts (through
/// its `Arc`) until the store answers: this returns anyway.
pub(crate) fn close(core: &Arc<ObjectCore>) {
    crate::mm::guest::unhost(core);
    crate::mm::io::cancel_reads_ahead(core);
    if !crate::mm::writeback::has_work(core) {
        return;
    }
    let closing = core.clone();
    let spawned = std::thread::Builder::new()
        .name("faultmap-final".into())
        .spawn(move || crate::mm::writeback::on_drop(&closing));
    match spawned {
        Ok(thread) => {
            crate::mm::io::join_until(vec![thread], std::time::Instant::now() + core.grace());
        }
        // No thread to be had: here, unbounded, rather than not at all.
        Err(_) => crate::mm::writeback::on_drop(core),
    }
}

/// An object's count of [`crate::Object`] handles, and its *closed* flag.
///
/// Invariant: `closed` is set once, by the release that takes the count to
/// zero, and never cleared; while any handle lives it is clear. A handle is
/// made only from a live one (`Object::clone`, a mapping of an `Object`) or
/// with a new core, so the count never rises from zero again, and a thread
/// that sees `closed` knows that nothing maps the object nor ever will.
/// The flag publishes no data: it only tells the I/O threads to end the
/// object's reads unread (`crate::mm::io`), so a check that misses a
/// close by a moment costs one read, never a page. Modelled by
/// `loom_models_object_closes_once_after_its_last_handle`.
struct Handles {
    count: AtomicUsize,
    closed: AtomicBool,
}

impl Handles {
    fn new() -> Self {
        Self {
            count: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// One more handle, made from a live one (or the first, of a new
    /// core): Relaxed, as `Arc::clone`, since the caller's own handle keeps
    /// the count above zero meanwhile.
    fn acquire(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// One more handle unless none is left (the count is never raised
    /// from zero: a closed object stays closed). Acquire on success, as
    /// the holder reads what the others did.
    fn try_acquire(&self) -> bool {
        let mut count = self.count.load(Ordering::Relaxed);
        loop {
            if count == 0 {
                return false;
            }
            match self.count.compare_exchange_weak(
                count,
                count + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => count = now,
            }
        }
    }

    /// One handle fewer; returns whether it was the last, which closes the
    /// object. AcqRel, as `Arc`'s drop: the closer sees everything the
    /// other handles' holders did. The flag is stored after the count
    /// reached zero, with Release, so that [`Handles::is_closed`] (Acquire)
    /// implies no handle is left.
    fn release(&self) -> bool {
        let last = self.count.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            self.closed.store(true, Ordering::Release);
        }
        last
    }

    /// Whether the last handle went.
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    #[cfg(all(test, loom))]
    fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::Handles;
    use loom::sync::Arc;
    use loom::thread;

    /// Two handles, one of them cloned and both clones dropped on another
    /// thread while the first is dropped here, and a joiner that tries to
    /// take a handle meanwhile: exactly one drop is the last, the object
    /// is closed only then (never while the clone lives), a thread that
    /// sees it closed sees no handle left, and the joiner gets a handle
    /// exactly when the object is not closed.
    #[test]
    fn loom_models_object_closes_once_after_its_last_handle() {
        loom::model(|| {
            let h = Arc::new(Handles::new());
            h.acquire();
            h.acquire();
            let theirs = h.clone();
            let t = thread::spawn(move || {
                theirs.acquire(); // a clone of the handle this thread holds
                assert!(!theirs.is_closed(), "closed while a handle lives");
                let a = theirs.release();
                let b = theirs.release();
                u32::from(a) + u32::from(b)
            });
            // A joiner (`try_acquire`, never from zero): it gets a handle
            // only while one lives, and its release may be the last.
            let watcher = {
                let h = h.clone();
                thread::spawn(move || {
                    if h.is_closed() {
                        assert_eq!(h.count(), 0, "closed with a handle left");
                    }
                    if h.try_acquire() {
                        assert!(!h.is_closed(), "a handle taken on a closed object");
                        u32::from(h.release())
                    } else {
                        // Refused: the count was zero, and stays so.
                        assert_eq!(h.count(), 0, "refused while a handle lives");
                        0
                    }
                })
            };
            let mine = u32::from(h.release());
            let lasts = t.join().unwrap() + mine + watcher.join().unwrap();
            assert_eq!(lasts, 1, "one drop is the last");
            assert!(h.is_closed());
        });
    }
}
