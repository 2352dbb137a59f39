//! The pool of pre-zeroed page-state chunks.
//!
//! The page-state array (`cache`) is allocated in 4 KiB chunks, one per
//! 2 MiB of object, on the first state change in the chunk: on the fault
//! path. This module keeps that path free of the allocator. It is our
//! counterpart of the kernel's pre-zeroed page-table pages (Morton
//! finds one second of a fork-heavy workload in `pte_alloc_one` and asks for
//! "the page table cache back", a list of known-zeroed pages; the reference's
//! section 5 tells the story from quicklists to `vmf->prealloc_pte`). A chunk,
//! like a PTE page, covers 512 pages, is all zero when it is handed out, and
//! is needed at the first touch of its 2 MiB.
//!
//! # State
//!
//! ```text
//!   slots: [AtomicPtr<Chunk>; CAPACITY]      null = empty, else an owned,
//!   +----+----+----+----+-- ... --+----+     all-zero chunk
//!   | C  | C  | 0  | C  |          | 0  |
//!   +----+----+----+----+-- ... --+----+
//!     ^ take: scan, swap(null)       ^ put: scan, CAS null -> chunk
//!
//!   filled      chunks in the slots, plus puts in flight (an upper bound)
//!   misses      takes that found the pool empty and allocated
//!   wanted      futex word: 1 = the refill thread has been asked to run
//! ```
//!
//! A slot changes hands only as a whole: `take` swaps the pointer out, `put`
//! installs one only where the slot is null. There is no list and no head to
//! compare, so there is no ABA problem: a chunk is in at most one slot, and a
//! successful swap makes its caller the chunk's only owner.
//!
//! # Triggers
//!
//! - `take` (`alloc`), on a handler or service thread that touches a chunk
//!   for the first time. Lock-free and allocation-free: a scan of relaxed
//!   loads and one swap. If that leaves fewer than [`LOW_WATERMARK`] chunks,
//!   it asks for a refill: a flip of `wanted` and, only for the flip from 0,
//!   one `FUTEX_WAKE`.
//! - The refill thread, "faultmap-pool", started once per process when the
//!   first page-state array is created (never from the fault path). It
//!   allocates zeroed chunks until the pool holds [`CAPACITY`], then sleeps
//!   on `wanted`. It starts with a full refill, so the first object's first
//!   faults already find chunks.
//! - `give_back`, when an object's page-state array is dropped (off the fault
//!   path; no reader can hold a word of it then). The chunk is zeroed *here*,
//!   then put back if there is room, else freed.
//!
//! # Invariants
//!
//! 1. Every chunk in a slot is all zero (every word ABSENT). The pool zeroes
//!    what it is given instead of trusting the giver: Morton's pre-zeroed
//!    page lists failed because "something in the pagetable freeing path
//!    seems to be putting back pages which are not fully zeroed".
//! 2. A chunk is owned by exactly one of: a slot, a `Box` on some thread, a
//!    page-state array's directory. The swap and the CAS move it between
//!    them; nothing copies a pointer out without swapping it out.
//! 3. `filled` never underflows: a put counts its chunk before publishing it
//!    (Release) and a take uncounts it after taking it (Acquire), so the
//!    increment precedes the decrement in the counter's modification order.
//!
//! # The signal handler never allocates
//!
//! The signal-delivery fault path only *looks up* words whose chunk already
//! exists (`PageStates::get`, an Acquire load); it never creates one. Chunks
//! are created by `PageStates::get_or_alloc`, on handler and service
//! threads, which take them from here. When the pool is empty (a burst of
//! first touches faster than the refill thread, or a refill thread that
//! could not be spawned) `alloc` falls back to the allocator on that thread
//! and counts a miss: slower, never wrong. If the thread cannot be spawned,
//! the pool stays empty and every chunk is a miss; nothing panics.
//!
//! # Known inaccuracies
//!
//! - `filled` is an upper bound, so the refill may stop a chunk or two short
//!   of capacity while puts are in flight, and a take may not ask for a
//!   refill exactly at the watermark.
//! - The pool is process-wide, not per-CPU like quicklists: one array of
//!   cache lines shared by every handler thread. Takes are rare (one per
//!   2 MiB first touched), so this has not mattered.
//! - After `fork`, the child has the pool's chunks but not its thread: it
//!   takes what is left, then falls back.
//! - The pool holds up to [`CAPACITY`] chunks (1 MiB) for the life of the
//!   process once the first object is created. It is never trimmed.
//!
//! Under loom the capacity shrinks to two slots, no thread is spawned, and
//! the models call [`Pool::refill`] themselves.

use std::sync::atomic::AtomicU32;

use crate::cache::Chunk;
use crate::sync::{AtomicPtr, AtomicU64, Ordering};

/// Chunks the pool holds when full: 256 chunks of 4 KiB, 1 MiB, enough for
/// the first touch of 512 MiB of objects between two refills.
#[cfg(not(loom))]
pub(crate) const CAPACITY: usize = 256;
/// Under loom, two slots: enough for a take to race a put into the other.
#[cfg(loom)]
pub(crate) const CAPACITY: usize = 2;

/// Below this many chunks, a take asks the refill thread to run: a quarter
/// of the pool, so a burst of 64 first touches still finds chunks while the
/// thread wakes up.
#[cfg(not(loom))]
pub(crate) const LOW_WATERMARK: usize = CAPACITY / 4;
/// Under loom, one chunk.
#[cfg(loom)]
pub(crate) const LOW_WATERMARK: usize = 1;

/// The name of the refill thread, as `/proc/PID/task/*/comm` shows it.
#[cfg(not(loom))]
const THREAD_NAME: &str = "faultmap-pool";

/// A pool of pre-zeroed chunks. The process has one ([`alloc`],
/// [`give_back`]); tests and loom models make their own.
pub(crate) struct Pool {
    slots: [AtomicPtr<Chunk>; CAPACITY],
    /// Chunks in the slots plus puts in flight (invariant 3).
    filled: AtomicU64,
    /// Takes that found the pool empty.
    misses: AtomicU64,
    /// The refill thread's futex word: 1 once a refill was asked for, 0 once
    /// the thread took the request. A std atomic under loom too: loom does
    /// not model the thread, and nothing a model checks depends on it.
    wanted: AtomicU32,
}

impl Pool {
    /// An empty pool.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        Self {
            slots: [const { AtomicPtr::new(std::ptr::null_mut()) }; CAPACITY],
            filled: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            wanted: AtomicU32::new(0),
        }
    }

    /// An empty pool (loom's atomics have no `const fn new`).
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            filled: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            wanted: AtomicU32::new(0),
        }
    }

    /// How many chunks the pool holds, give or take the puts in flight.
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.filled.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    /// How many takes found the pool empty.
    pub(crate) fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// Takes a zeroed chunk, if the pool has one. Lock-free, allocation-free,
    /// async-signal-safe: loads, one swap, one counter, maybe one futex wake.
    pub(crate) fn take(&self) -> Option<Box<Chunk>> {
        for slot in &self.slots {
            if looks_empty(slot) {
                continue;
            }
            // Acquire: pairs with the Release of the put, so the chunk's
            // zeroed words are visible.
            let chunk = slot.swap(std::ptr::null_mut(), Ordering::Acquire);
            if chunk.is_null() {
                continue;
            }
            let left = self
                .filled
                .fetch_sub(1, Ordering::Relaxed)
                .saturating_sub(1);
            if left < LOW_WATERMARK as u64 {
                self.want_refill();
            }
            // SAFETY: a non-null slot holds a pointer from Box::into_raw in
            // `put`; the swap took it out of the slot, so this thread is its
            // only owner (invariant 2).
            return Some(unsafe { Box::from_raw(chunk) });
        }
        None
    }

    /// A zeroed chunk: taken from the pool, or, if it is empty, allocated
    /// here and counted as a miss. Never call it from the signal handler.
    pub(crate) fn alloc(&self) -> Box<Chunk> {
        self.take().unwrap_or_else(|| {
            self.misses.fetch_add(1, Ordering::Relaxed);
            self.want_refill();
            Chunk::new_boxed()
        })
    }

    /// Gives back a chunk that left a page-state array: zeroed and kept if
    /// the pool has room, else freed. Returns whether it was kept.
    pub(crate) fn give_back(&self, mut chunk: Box<Chunk>) -> bool {
        if self.len() >= CAPACITY {
            return false;
        }
        chunk.clear();
        self.put(chunk).is_ok()
    }

    /// Allocates zeroed chunks until the pool is full. Returns how many it
    /// added. Runs on the refill thread (loom models call it directly).
    // Under loom, outside the models, nothing calls it: no thread is built.
    #[cfg_attr(all(loom, not(test)), allow(dead_code))]
    pub(crate) fn refill(&self) -> usize {
        let mut added = 0;
        while self.len() < CAPACITY {
            // Err: puts in flight filled the last slots; the spare is freed.
            if self.put(Chunk::new_boxed()).is_err() {
                break;
            }
            added += 1;
        }
        added
    }

    /// Puts a zeroed chunk in an empty slot, or hands it back if none is.
    fn put(&self, chunk: Box<Chunk>) -> Result<(), Box<Chunk>> {
        debug_assert!(chunk.is_clear(), "a chunk with live words in the pool");
        let chunk = Box::into_raw(chunk);
        // Counted before it is published (invariant 3).
        self.filled.fetch_add(1, Ordering::Relaxed);
        for slot in &self.slots {
            if looks_full(slot) {
                continue;
            }
            // Release: the zeroed words are visible to the taker (Acquire).
            if slot
                .compare_exchange(
                    std::ptr::null_mut(),
                    chunk,
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return Ok(());
            }
        }
        self.filled.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: `chunk` came from Box::into_raw above and no CAS published
        // it: we still own it.
        Err(unsafe { Box::from_raw(chunk) })
    }

    /// Asks the refill thread to run. Only the flip from 0 to 1 wakes it, so
    /// a run of takes below the watermark costs one system call.
    fn want_refill(&self) {
        // Release: pairs with the refill thread's Acquire swap, so the take
        // that emptied a slot happens before the refill's scan.
        if self.wanted.load(Ordering::Relaxed) == 0 && self.wanted.swap(1, Ordering::Release) == 0 {
            crate::sys::futex_wake(&self.wanted, 1);
        }
    }

    /// The refill thread: refill, then sleep until a take asks again.
    #[cfg(not(loom))]
    fn refill_forever(&self) {
        loop {
            // Take the request before refilling: a take that asks after
            // this swap finds 0 and wakes us (or leaves 1, and futex_wait
            // returns at once); one that asked before it is seen by the
            // Acquire, with the slot it emptied.
            self.wanted.swap(0, Ordering::Acquire);
            self.refill();
            crate::sys::futex_wait(&self.wanted, 0, None);
        }
    }
}

/// Whether a take should skip `slot`: a relaxed peek that spares the swap (a
/// write to a shared cache line) on an empty slot. Only a hint: the swap
/// decides, and a stale peek makes a take skip a slot, never take one twice.
///
/// Under loom there is no peek and every slot is tried: loom's DPOR remembers
/// only the last access to an atomic, so a thread's own load just before its
/// swap or CAS would hide the race of that RMW with another thread's, and the
/// interleavings behind it would go unexplored.
fn looks_empty(slot: &AtomicPtr<Chunk>) -> bool {
    cfg!(not(loom)) && slot.load(Ordering::Relaxed).is_null()
}

/// Whether a put should skip `slot`: the same peek as [`looks_empty`], for
/// the CAS.
fn looks_full(slot: &AtomicPtr<Chunk>) -> bool {
    cfg!(not(loom)) && !slot.load(Ordering::Relaxed).is_null()
}

impl Drop for Pool {
    fn drop(&mut self) {
        for slot in &self.slots {
            let chunk = slot.swap(std::ptr::null_mut(), Ordering::Acquire);
            if !chunk.is_null() {
                // SAFETY: as in `take`: the swap made us the only owner of a
                // pointer from Box::into_raw.
                drop(unsafe { Box::from_raw(chunk) });
            }
        }
    }
}

/// The process's pool.
#[cfg(not(loom))]
fn global() -> &'static Pool {
    static POOL: Pool = Pool::new();
    &POOL
}

/// The process's pool: under loom, one per execution.
#[cfg(loom)]
fn global() -> &'static Pool {
    loom::lazy_static! {
        static ref POOL: Pool = Pool::new();
    }
    &POOL
}

/// Starts the refill thread, once per process. Call it where objects are
/// created, never on the fault path. If the thread cannot be spawned, the
/// pool stays empty and every chunk is allocated where it is needed.
pub(crate) fn start() {
    #[cfg(not(loom))]
    {
        static STARTED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        STARTED.get_or_init(|| {
            let pool = global();
            // Err: no thread, an empty pool, the fallback path (see above).
            let _ = std::thread::Builder::new()
                .name(THREAD_NAME.to_string())
                .spawn(move || pool.refill_forever());
        });
    }
}

/// A zeroed chunk from the process's pool, or allocated on a miss
/// ([`Pool::alloc`]). Not for the signal handler.
pub(crate) fn alloc() -> Box<Chunk> {
    global().alloc()
}

/// Returns a chunk to the process's pool ([`Pool::give_back`]).
pub(crate) fn give_back(chunk: Box<Chunk>) {
    global().give_back(chunk);
}

/// How many chunks were allocated because the process's pool was empty.
#[allow(dead_code)] // Read by tests; a counter for the statistics.
pub(crate) fn pool_misses() -> u64 {
    global().misses()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn full_pool() -> Pool {
        let pool = Pool::new();
        assert_eq!(pool.refill(), CAPACITY);
        assert_eq!(pool.len(), CAPACITY);
        pool
    }

    #[test]
    fn taking_past_empty_falls_back_and_counts_misses() {
        let pool = full_pool();
        let taken: Vec<_> = (0..CAPACITY).map(|_| pool.take().unwrap()).collect();
        assert!(taken.iter().all(|c| c.is_clear()));
        assert!(pool.take().is_none());
        assert_eq!(pool.len(), 0);
        assert_eq!(pool.misses(), 0, "a bare take is not a miss");
        let fallback = pool.alloc();
        assert!(fallback.is_clear());
        assert_eq!(pool.misses(), 1);
        pool.alloc();
        assert_eq!(pool.misses(), 2);
    }

    #[test]
    fn refill_restores_the_pool_above_the_low_watermark() {
        let pool = full_pool();
        assert_eq!(pool.wanted.load(Ordering::Relaxed), 0);
        while pool.len() >= LOW_WATERMARK {
            pool.take().unwrap();
        }
        assert_eq!(
            pool.wanted.load(Ordering::Relaxed),
            1,
            "falling below the watermark asks for a refill"
        );
        assert_eq!(pool.refill(), CAPACITY - LOW_WATERMARK + 1);
        assert_eq!(pool.len(), CAPACITY);
        assert!(pool.len() >= LOW_WATERMARK);
        assert_eq!(pool.refill(), 0, "a full pool allocates nothing");
    }

    #[test]
    fn reused_chunks_are_handed_out_zeroed() {
        let pool = full_pool();
        let chunk = pool.take().unwrap();
        let addr: *const Chunk = &*chunk;
        assert!(chunk.0[0].begin_read());
        chunk.0[0].finish_read(true);
        assert!(chunk.0[1].begin_read());
        assert!(!chunk.is_clear());
        assert!(pool.give_back(chunk), "the pool had room");
        // The freed chunk went back into the slot it came from (the first).
        let again = pool.take().unwrap();
        assert!(std::ptr::eq(addr, &*again));
        assert!(again.is_clear(), "a reused chunk is zeroed");
    }

    #[test]
    fn a_full_pool_frees_what_it_is_given() {
        let pool = full_pool();
        assert!(!pool.give_back(Chunk::new_boxed()));
        assert_eq!(pool.len(), CAPACITY);
    }

    #[test]
    fn the_refill_thread_fills_the_process_pool() {
        start();
        // A liveness bound, not a measurement: the thread fills 1 MiB in
        // microseconds; other tests take chunks meanwhile.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while global().len() < LOW_WATERMARK {
            assert!(std::time::Instant::now() < deadline, "the pool stays empty");
            std::thread::yield_now();
        }
        assert!(alloc().is_clear());
    }
}

#[cfg(all(test, loom))]
// The models own chunks as `Box`es: a chunk's address is its identity.
#[allow(clippy::vec_box)]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn addr(chunk: &Chunk) -> usize {
        chunk as *const Chunk as usize
    }

    /// Takes what is left in the pool after the model's threads joined,
    /// checking `filled` against it.
    fn drain(pool: &Pool) -> Vec<Box<Chunk>> {
        let left: Vec<_> = std::iter::from_fn(|| pool.take()).collect();
        assert_eq!(pool.len(), 0, "filled agrees with the slots");
        left
    }

    /// The sorted addresses of `chunks`, each checked to be zero. A chunk
    /// owned twice fails the model (leaking the chunks rather than freeing
    /// one twice, so the failure is this message and not an abort).
    fn distinct(chunks: Vec<Box<Chunk>>) -> Vec<usize> {
        let mut addrs: Vec<usize> = chunks.iter().map(|c| addr(c)).collect();
        addrs.sort_unstable();
        if addrs.windows(2).any(|w| w[0] == w[1]) {
            std::mem::forget(chunks);
            panic!("a chunk was handed out twice");
        }
        assert!(
            chunks.iter().all(|c| c.is_clear()),
            "a chunk left the pool with live words"
        );
        addrs
    }

    /// Two threads take while a third puts a chunk back: every chunk is
    /// taken exactly once or left in the pool, none is lost or handed out
    /// twice, and every chunk handed out is zero.
    #[test]
    fn two_takers_and_a_putter() {
        loom::model(|| {
            let pool = Arc::new(Pool::new());
            let first = Chunk::new_boxed();
            let second = Chunk::new_boxed();
            let mut all = vec![addr(&first), addr(&second)];
            all.sort_unstable();
            assert!(pool.give_back(first));
            let takers: Vec<_> = (0..2)
                .map(|_| {
                    let pool = pool.clone();
                    thread::spawn(move || pool.take())
                })
                .collect();
            assert!(pool.give_back(second), "two chunks fit in two slots");
            let mut chunks: Vec<_> = takers
                .into_iter()
                .filter_map(|t| t.join().unwrap())
                .collect();
            chunks.extend(drain(&pool));
            assert_eq!(distinct(chunks), all, "each chunk exactly once");
        });
    }

    /// A chunk freed with live words is given back while another thread
    /// takes: the taker gets either nothing or the chunk zeroed, and the
    /// chunk is never both taken and left in the pool.
    #[test]
    fn take_vs_give_back_of_a_dirty_chunk() {
        loom::model(|| {
            let pool = Arc::new(Pool::new());
            let dirty = Chunk::new_boxed();
            assert!(dirty.0[1].begin_read());
            let dirty_addr = addr(&dirty);
            let p = pool.clone();
            let giver = thread::spawn(move || assert!(p.give_back(dirty)));
            let taken = pool.take();
            giver.join().unwrap();
            let mut chunks: Vec<_> = taken.into_iter().collect();
            chunks.extend(drain(&pool));
            assert_eq!(distinct(chunks), vec![dirty_addr]);
        });
    }

    /// The refill races a take and a give-back: the pool never holds more
    /// than it can, and every chunk is accounted for (taken, left in the
    /// pool, or freed by a put that found no room).
    #[test]
    fn refill_vs_take_and_give_back() {
        loom::model(|| {
            let pool = Arc::new(Pool::new());
            assert!(pool.give_back(Chunk::new_boxed()));
            let p = pool.clone();
            let refiller = thread::spawn(move || p.refill());
            let p = pool.clone();
            let taker = thread::spawn(move || p.take());
            let kept = pool.give_back(Chunk::new_boxed());
            let added = refiller.join().unwrap();
            let mut chunks: Vec<_> = taker.join().unwrap().into_iter().collect();
            assert!(pool.len() <= CAPACITY);
            chunks.extend(drain(&pool));
            assert_eq!(
                distinct(chunks).len(),
                1 + added + usize::from(kept),
                "a chunk was lost or duplicated"
            );
        });
    }
}
