//! The memory budget and its evictor: a CLOCK hand over the cached pages.
//!
//! A [`Budget`] is one accounting domain: the pages cached by the objects a
//! pager opened (or by one object that was given a budget of its own). A
//! page is *charged* when a fault or readahead claims it for a read (it is
//! about to take memory) and *uncharged* when it leaves the cache: a failed
//! read, an eviction, an invalidation, or the object's end.
//!
//! # Watermarks
//!
//! ```text
//!   0                                  limit - 2*gap   limit - gap   limit
//!   |----------------------------------------|-------------|-----------|
//!                                      hand stops here   evictor wakes   readahead
//!                                                        up here         never goes past
//! ```
//!
//! `gap` is 1/32 of the budget, within [64 pages, 2048 pages], and at least
//! two of the domain's largest pages (1024 4 KiB pages once an object of
//! 2 MiB pages joined), at most a quarter of the budget: room for a few
//! readahead windows. Pages here are 4 KiB pages: a domain counts its
//! objects' pages of 2 MiB as 512 each. A window is at most 1/8 of the
//! budget (the kernel's old `max_sane_readahead`), and a readahead page is
//! claimed only if it fits under the limit (the window shrinks, as the
//! kernel's readahead gives up pages its allocation could not get; with
//! objects of 2 MiB pages, readahead stops one such page short of the
//! limit, room for the next fault's); the page a fault waits for is always
//! claimed, so the cache may exceed the limit by at most one page per
//! fault in flight. While it is over the limit, an
//! I/O thread waits (at most 100 ms) for the hand before it fills pages
//! ([`Budget::throttle`], the kernel's direct reclaim). When the charge crosses `limit - gap` the evictor thread wakes
//! and runs the hand until the charge is back under `limit - 2*gap`.
//!
//! # The hand
//!
//! One hand sweeps every object of the domain in page order, a batch of one
//! page-state chunk (512 pages, one PTE table's worth) at a time, skipping
//! chunks that were never allocated. For each UPTODATE page it applies the
//! CLOCK policy ([`crate::policy::clock::visit`]) in one CAS on the page-state word,
//! and then, for the whole batch:
//!
//! 1. **Write back** the dirty pages that would otherwise be evicted
//!    (they are evicted on a later visit if still clean); first, and
//!    outside the region table's lock, since a store write may be slow.
//! 2. **Unmap** the pages to sample, as maximal runs, from every region
//!    that maps them: the object's reverse map ([`crate::mm::rmap`]) gives the
//!    regions that overlap each run (`MADV_DONTNEED` keeps the memfd page,
//!    so the next use is a MINOR fault that sets REFERENCED).
//! 3. **Evict** the rest: freeze (`begin_reclaim`: no pins, clean, and not
//!    used since the visit), unmap everywhere, punch the hole, release
//!    ABSENT ([`crate::mm::invalidate::drop_frozen`], the same steps as
//!    invalidation), leaving a shadow for refault detection
//!    ([`crate::policy::workingset`]).
//!
//! Pages that are pinned, being read, or evicted by someone else are left
//! for the next trip. If two whole trips free nothing (everything cached is
//! in flight or pinned), the evictor sleeps until woken again.
//!
//! # Invariants
//!
//! - A page is never evicted while pinned (a fault is mapping it), dirty,
//!   or being written back: `begin_reclaim` checks all three in its CAS.
//! - An evicted page is unmapped from every region before its hole is
//!   punched, by the same steps as invalidation, so no mapping ever reads a
//!   punched page's stale PTE.
//! - The hand unmaps only under the region table's settled lock, the way
//!   the kernel's rmap walk holds `i_mmap_rwsem`: every `munmap` event
//!   read is handled (its region detached) first, and none is read
//!   meanwhile (`crate::mm::events`), so the hand never zaps memory the
//!   application mapped there since.
//! - The hand never blocks a speculative fault, which takes no lock. It
//!   holds pager threads from reading the userfaultfd (handler delivery's
//!   faults) while it unmaps and evicts a batch, and not for a batch with
//!   nothing to unmap or evict.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::base::index::ObjectPage;
use crate::base::stats::{Counters, Stats};
use crate::cache::shadow::Age;
use crate::mm::object::ObjectCore;
use crate::mm::space::RegionTable;
use crate::policy::clock::{self, Action};
use crate::policy::workingset;
use crate::sys::PAGE_SIZE;

/// Pages the hand visits per batch: one page-state chunk.
const BATCH: u64 = 512;

/// The longest a read waits for the hand to make room (see
/// [`Budget::throttle`]).
const THROTTLE_LIMIT: Duration = Duration::from_millis(100);

/// How memory is doing, in bytes (see [`crate::Pager::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    /// The budget (`None`: unlimited).
    pub budget: Option<u64>,
    /// Bytes cached (including pages being read).
    pub cached: u64,
    /// The most bytes cached at any time so far.
    pub peak: u64,
    /// Bytes in the active set.
    pub active: u64,
}

/// One accounting domain: a limit, the charge against it, its objects, and
/// the evictor that keeps the charge under the limit.
///
/// A domain counts 4 KiB pages ("base pages") whatever its objects' page
/// sizes: an object of 2 MiB pages charges 512 for each
/// (`ObjectCore::charged` counts base pages too). The methods take and
/// return the object's own pages.
pub(crate) struct Budget {
    /// The limit in base pages (`u64::MAX`: none).
    limit: u64,
    /// Pages charged now.
    cached: AtomicU64,
    /// The largest page of the domain's objects, in base pages (1, or
    /// 512 once an object of 2 MiB pages joined).
    unit: AtomicU64,
    /// The highest charge seen.
    peak: AtomicU64,
    /// Pages in the active set (approximate: kept by the hand and the
    /// refault path, never below zero).
    active: AtomicU64,
    /// The nonresident age (evicted 4 KiB pages), for refault distances.
    pub(crate) age: Age,
    /// The objects of the domain.
    objects: Mutex<Vec<Weak<ObjectCore>>>,
    /// The domain's counters (the pager's).
    counters: Arc<Counters>,
    /// Set when the evictor was asked to run; its sleep.
    kick: Mutex<bool>,
    wake: Condvar,
    /// Signalled when the hand freed pages, for readers throttled at the
    /// limit.
    room: Condvar,
    stop: AtomicBool,
}

impl Budget {
    /// A domain of `limit` bytes (`None`: unlimited, no evictor).
    pub(crate) fn new(limit: Option<u64>, counters: Arc<Counters>) -> Arc<Budget> {
        Arc::new(Budget {
            limit: limit.map_or(u64::MAX, |b| (b / PAGE_SIZE as u64).max(1)),
            cached: AtomicU64::new(0),
            unit: AtomicU64::new(1),
            peak: AtomicU64::new(0),
            active: AtomicU64::new(0),
            age: Age::default(),
            objects: Mutex::new(Vec::new()),
            counters,
            kick: Mutex::new(false),
            wake: Condvar::new(),
            room: Condvar::new(),
            stop: AtomicBool::new(false),
        })
    }

    /// Whether the domain has a limit.
    pub(crate) fn is_limited(&self) -> bool {
        self.limit != u64::MAX
    }

    /// The limit in bytes, if any.
    pub(crate) fn limit_bytes(&self) -> Option<u64> {
        self.is_limited().then(|| self.limit * PAGE_SIZE as u64)
    }

    /// The free room between the evictor's wake-up mark and the limit:
    /// at least two of the domain's largest pages, so that the page a
    /// fault waits for (charged whatever the limit) finds room.
    fn gap(&self) -> u64 {
        let unit = self.unit.load(Ordering::Relaxed);
        (self.limit / 32)
            .clamp(64, 2048)
            .max(2 * unit)
            .min(self.limit / 4)
            .max(1)
    }

    /// Adds `object` to the domain.
    pub(crate) fn add_object(&self, object: &Arc<ObjectCore>) {
        self.unit.fetch_max(base_pages(object), Ordering::Relaxed);
        let mut list = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(object));
    }

    /// Charges one page a fault waits for: always succeeds, never waits
    /// (the fault path may hold the region table's lock or a read section;
    /// the read itself is throttled on its I/O thread, [`Budget::throttle`]).
    pub(crate) fn charge_demand(&self, object: &ObjectCore) {
        self.charge(object, base_pages(object));
    }

    /// Charges one readahead page if it fits under the limit, leaving
    /// room for one of the domain's largest pages: the page the next fault
    /// waits for is charged whatever the limit, and should find it.
    pub(crate) fn try_charge(&self, object: &ObjectCore) -> bool {
        let n = base_pages(object);
        // With 4 KiB pages only, none is kept (one page over the limit is
        // the documented slack).
        let unit = self.unit.load(Ordering::Relaxed);
        let reserve = if unit > 1 { unit } else { 0 };
        let mut cur = self.cached.load(Ordering::Relaxed);
        loop {
            // A budget whose evictor stopped (its pager is gone, another
            // pager still maps the object) is no longer enforced: nothing
            // would ever make room, and readahead would stop for good.
            if cur + n + reserve > self.limit && !self.stop.load(Ordering::Acquire) {
                self.kick_if_needed(cur);
                return false;
            }
            match self.cached.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    object.charged.fetch_add(n, Ordering::Relaxed);
                    self.after_charge(cur + n);
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    fn charge(&self, object: &ObjectCore, n: u64) {
        object.charged.fetch_add(n, Ordering::Relaxed);
        let now = self.cached.fetch_add(n, Ordering::Relaxed) + n;
        self.after_charge(now);
    }

    fn after_charge(&self, now: u64) {
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.kick_if_needed(now);
    }

    /// Throttles a read (an I/O thread, before it fills pages a fault waits
    /// for) while the cache is over its limit: the kernel's direct reclaim
    /// makes the allocating task wait the same way. Waits until the hand
    /// freed room, or [`THROTTLE_LIMIT`] at most (everything cached may be
    /// pinned or in flight: then the read goes ahead over the limit).
    pub(crate) fn throttle(&self) {
        if self.cached.load(Ordering::Relaxed) <= self.limit {
            return;
        }
        let deadline = std::time::Instant::now() + THROTTLE_LIMIT;
        let mut kicked = self.kick.lock().unwrap_or_else(|e| e.into_inner());
        while self.cached.load(Ordering::Relaxed) > self.limit && !self.stop.load(Ordering::Acquire)
        {
            let now = std::time::Instant::now();
            if now >= deadline {
                return;
            }
            if !*kicked {
                *kicked = true;
                self.wake.notify_one();
            }
            kicked = self
                .room
                .wait_timeout(kicked, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Asks the evictor to free pages now and waits until it has freed
    /// some, or [`THROTTLE_LIMIT`] at most: for a read whose huge pages
    /// the kernel's pool could not give (the pool holds about the budget,
    /// and the budget is full). Returns false at once, without waiting,
    /// when there is no limit or the charge is not near it (the evictor
    /// would free nothing: the pool was emptied by others).
    pub(crate) fn make_room(&self) -> bool {
        if !self.is_limited() || self.stop.load(Ordering::Acquire) {
            return false;
        }
        if self.cached.load(Ordering::Relaxed) + self.gap() < self.limit {
            return false;
        }
        let mut kicked = self.kick.lock().unwrap_or_else(|e| e.into_inner());
        *kicked = true;
        self.wake.notify_one();
        let _ = self
            .room
            .wait_timeout(kicked, THROTTLE_LIMIT)
            .unwrap_or_else(|e| e.into_inner());
        true
    }

    /// Uncharges `n` pages of `object` that left the cache.
    pub(crate) fn uncharge(&self, object: &ObjectCore, n: u64) {
        self.uncharge_base(object, n * base_pages(object));
    }

    /// Uncharges `n` base pages of `object` (its whole charge, as
    /// `ObjectCore::charged` counts it, when it goes).
    pub(crate) fn uncharge_base(&self, object: &ObjectCore, n: u64) {
        if n == 0 {
            return;
        }
        let _ = object
            .charged
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(n))
            });
        let _ = self
            .cached
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(n))
            });
    }

    /// `n` pages of `object` entered the active set.
    pub(crate) fn activated(&self, object: &ObjectCore, n: u64) {
        self.active
            .fetch_add(n * base_pages(object), Ordering::Relaxed);
    }

    /// `n` pages of `object` left the active set (deactivated, evicted or
    /// invalidated).
    pub(crate) fn deactivated(&self, object: &ObjectCore, n: u64) {
        let n = n * base_pages(object);
        if n == 0 {
            return;
        }
        let _ = self
            .active
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(n))
            });
    }

    /// The refault threshold (`crate::policy::workingset`), in evicted 4 KiB
    /// pages.
    pub(crate) fn refault_threshold(&self) -> u64 {
        if self.is_limited() {
            workingset::threshold(self.limit)
        } else {
            0
        }
    }

    /// The room left now, in `object`'s pages, for pages that should
    /// stay cached: up to the evictor's target (`limit - 2 * gap`, where
    /// the hand stops; pages claimed past it are evicted again, unused
    /// ones first), less the reserve `try_charge` keeps. `None` without a
    /// budget, or once its evictor stopped (the budget is not enforced).
    pub(crate) fn headroom_pages(&self, object: &ObjectCore) -> Option<u64> {
        if !self.is_limited() || self.stop.load(Ordering::Acquire) {
            return None;
        }
        let unit = self.unit.load(Ordering::Relaxed);
        let reserve = if unit > 1 { unit } else { 0 };
        let target = self.limit.saturating_sub(2 * self.gap() + reserve);
        let cached = self.cached.load(Ordering::Relaxed);
        Some(target.saturating_sub(cached) / base_pages(object))
    }

    /// The largest readahead window the budget allows, in `object`'s
    /// pages: an eighth of it (unlimited without a budget).
    pub(crate) fn max_ra_pages(&self, object: &ObjectCore) -> u64 {
        (self.limit / 8 / base_pages(object)).max(1)
    }

    /// The furthest a trace replay may read ahead, in `object`'s pages: a
    /// quarter of the budget (unlimited without a budget).
    pub(crate) fn max_replay_pages(&self, object: &ObjectCore) -> u64 {
        (self.limit / 4 / base_pages(object)).max(1)
    }

    /// A snapshot in bytes.
    pub(crate) fn memory(&self) -> Memory {
        let page = PAGE_SIZE as u64;
        Memory {
            budget: self.is_limited().then(|| self.limit * page),
            cached: self.cached.load(Ordering::Relaxed) * page,
            peak: self.peak.load(Ordering::Relaxed) * page,
            active: self.active.load(Ordering::Relaxed) * page,
        }
    }

    fn kick_if_needed(&self, cached: u64) {
        if !self.is_limited() || cached + self.gap() < self.limit {
            return;
        }
        let mut kicked = self.kick.lock().unwrap_or_else(|e| e.into_inner());
        if !*kicked {
            *kicked = true;
            self.wake.notify_one();
        }
    }

    /// Starts the evictor thread of a limited domain.
    pub(crate) fn start(self: &Arc<Self>, name: String) -> std::io::Result<Evictor> {
        let budget = self.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || budget.evictor_loop())?;
        Ok(Evictor {
            budget: self.clone(),
            thread: Some(thread),
        })
    }

    fn evictor_loop(&self) {
        let mut hand = Hand::default();
        // The charge when the hand last gave up (nothing evictable): it
        // does not start again on its own until the charge moved.
        let mut stuck_at = None;
        loop {
            {
                let mut kicked = self.kick.lock().unwrap_or_else(|e| e.into_inner());
                while !*kicked && !self.stop.load(Ordering::Acquire) {
                    // A timed wait also catches a kick that raced the sleep.
                    kicked = self
                        .wake
                        .wait_timeout(kicked, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    let cached = self.cached.load(Ordering::Relaxed);
                    if cached + self.gap() >= self.limit && stuck_at != Some(cached) {
                        *kicked = true;
                    }
                }
                *kicked = false;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let done = self.reclaim(&mut hand, self.limit.saturating_sub(2 * self.gap()));
            stuck_at = (!done).then(|| self.cached.load(Ordering::Relaxed));
        }
    }

    /// Runs the hand until at most `target` pages are charged (returns
    /// true), or two whole trips freed nothing (false: everything cached
    /// is pinned, in flight or dirty on a store that fails).
    fn reclaim(&self, hand: &mut Hand, target: u64) -> bool {
        let mut idle_trips = 0;
        let mut freed_this_trip = 0;
        while self.cached.load(Ordering::Relaxed) > target && !self.stop.load(Ordering::Acquire) {
            let objects: Vec<Arc<ObjectCore>> = {
                let list = self.objects.lock().unwrap_or_else(|e| e.into_inner());
                list.iter().filter_map(Weak::upgrade).collect()
            };
            if objects.is_empty() {
                return true;
            }
            if hand.object >= objects.len() {
                hand.object = 0;
                hand.page = 0;
            }
            let object = &objects[hand.object];
            let pages = object.cache.states.pages();
            if hand.page >= pages {
                hand.object += 1;
                hand.page = 0;
                if hand.object >= objects.len() {
                    // One trip over every object done.
                    hand.object = 0;
                    idle_trips = if freed_this_trip == 0 {
                        idle_trips + 1
                    } else {
                        0
                    };
                    freed_this_trip = 0;
                    if idle_trips >= 2 {
                        return false;
                    }
                }
                continue;
            }
            // BATCH 4 KiB pages' worth: one page of 2 MiB at a time, so
            // that the hand stops near its target rather than a batch of
            // 1 GiB past it.
            let step = (BATCH / base_pages(object)).max(1);
            let batch = hand.page..(hand.page + step).min(pages);
            hand.page = batch.end;
            let freed = self.visit_batch(object, batch);
            if freed > 0 {
                freed_this_trip += freed;
                let _kicked = self.kick.lock().unwrap_or_else(|e| e.into_inner());
                self.room.notify_all();
            }
        }
        true
    }

    /// The hand over one batch of `object`'s pages. Returns pages freed.
    fn visit_batch(&self, object: &ObjectCore, batch: Range<u64>) -> u64 {
        let states = &object.cache.states;
        if states.get(ObjectPage(batch.start)).is_none() {
            return 0; // a chunk never allocated: nothing cached here
        }
        let over = self.active.load(Ordering::Relaxed) > clock::active_target(self.limit);
        let mut tally = Stats::default();
        let (mut unmap, mut evict, mut write) = (Vec::new(), Vec::new(), Vec::new());
        let (mut activated, mut deactivated) = (0, 0);
        for p in batch {
            let Some(state) = states.get(ObjectPage(p)) else {
                continue;
            };
            let Some((action, seen)) = state.clock(|bits| {
                let (next, action, seen) = clock::visit(bits, over);
                (next, (action, seen))
            }) else {
                continue;
            };
            tally.clock_referenced += u64::from(seen.referenced);
            tally.clock_activated += u64::from(seen.activated);
            activated += u64::from(seen.activated);
            deactivated += u64::from(seen.deactivated);
            match action {
                Action::Keep => {}
                Action::Unmap => unmap.push(p),
                Action::WriteBack => write.push(p),
                Action::Evict => evict.push(p),
            }
        }
        self.activated(object, activated);
        self.deactivated(object, deactivated);
        // 1. Write back what is dirty (evicted on a later visit if still
        //    clean), before the table's lock: a store write may be slow. A
        //    failed write-back leaves the pages dirty; the next flush
        //    reports it (`crate::mm::writeback`).
        for run in crate::mm::invalidate::runs_of(&write) {
            if let Ok(n) = crate::mm::writeback::write_back(object, run) {
                self.counters.add(&Stats {
                    written_back: n,
                    ..Stats::default()
                });
            }
        }
        // Under the region table's settled lock, as the kernel's rmap walk
        // holds i_mmap_rwsem: a region the application unmapped is detached
        // (and disowned) before its range can be reused, and no unmap
        // returns meanwhile (`crate::mm::events`), so no MADV_DONTNEED here
        // hits the application's memory. Not taken for a batch with
        // nothing to unmap or evict: it stops handler threads from reading.
        // 3a. Freeze what is evicted (no lock needed), and take it back
        //     from Protect guests (forked children, joiners), whose answer
        //     may take a while: before the lock, which would hold up this
        //     process's faults and mappings meanwhile.
        let mut frozen: Vec<u64> = evict
            .into_iter()
            .filter(|&p| states.get(ObjectPage(p)).is_some_and(|s| s.begin_reclaim()))
            .collect();
        crate::mm::invalidate::revoke_from_guests(object, &mut frozen);
        let table = (!unmap.is_empty() || !frozen.is_empty()).then(|| RegionTable::get().settled());
        // 2. Unmap to sample: not a Protect guest's range (a signal round
        //    trip per sample; the kernel's sample of a forked child's
        //    references does not reach it under userfaultfd either).
        for run in crate::mm::invalidate::runs_of(&unmap) {
            let pages = ObjectPage::range(run);
            for region in object.rmap.overlapping(pages.clone()) {
                if region.owner.engine.is_child() {
                    continue;
                }
                // Best effort: a failed DONTNEED only delays the sampling.
                let _ = crate::mm::invalidate::zap(&region, pages.clone());
            }
        }
        tally.clock_unmapped += unmap.len() as u64;
        // 3b. Evict.
        if !frozen.is_empty() {
            // Counted as freed even if a syscall failed: the pages are
            // ABSENT and will be read again; but for those a Protect
            // mapping could still reach, which stay cached and leave
            // `frozen` (see `drop_frozen`).
            let _ = crate::mm::invalidate::drop_frozen(object, &mut frozen);
        }
        let freed = frozen.len() as u64;
        if freed > 0 {
            // The age counts 4 KiB pages, as the refault threshold does.
            let first_age = self.age.advance(freed * base_pages(object));
            object.shadows.record(
                &frozen,
                first_age,
                base_pages(object),
                self.refault_threshold(),
            );
            tally.evicted = freed;
        }
        drop(table);
        object.counters.add(&tally);
        self.counters.add(&tally);
        freed
    }

    /// Stops the evictor (its thread exits at its next look).
    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let mut kicked = self.kick.lock().unwrap_or_else(|e| e.into_inner());
        *kicked = true;
        self.wake.notify_all();
        self.room.notify_all();
    }
}

/// How many base pages one page of `object` is.
fn base_pages(object: &ObjectCore) -> u64 {
    object.cache.page_size().base_pages()
}

/// Where the hand is: an object of the domain and a page in it.
#[derive(Default)]
struct Hand {
    object: usize,
    page: u64,
}

/// A running evictor thread: stopped and joined on drop.
pub(crate) struct Evictor {
    budget: Arc<Budget>,
    thread: Option<JoinHandle<()>>,
}

impl Evictor {
    /// Tells the thread to stop and returns it, for the caller to join (or
    /// give up on: a write-back into a store that never returns keeps it).
    pub(crate) fn stop(mut self) -> Option<JoinHandle<()>> {
        self.budget.stop();
        self.thread.take()
    }
}

impl Drop for Evictor {
    fn drop(&mut self) {
        self.budget.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
