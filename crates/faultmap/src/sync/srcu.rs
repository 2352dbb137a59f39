//! Read sections that a signal handler may enter: the lifetime rule of the
//! speculative region lookup.
//!
//! A fault looks a region up in the published table (`crate::mm::space`)
//! without a lock, and may do so inside a SIGBUS handler. The region and
//! the table it found must stay allocated (and the region's address range
//! mapped) until the fault is done with them, and the fault may take no
//! lock, allocate nothing and touch no thread-local storage. Early SPF
//! versions solved the same problem with SRCU (`vma_srcu`); this
//! is that scheme, reduced to what faultmap needs:
//!
//! - a reader enters with [`Srcu::read`]: it reads the current epoch's
//!   parity `i` and adds one to `locks[i]` of the counter slot of the CPU it
//!   runs on, then a full fence; it leaves by adding one to `unlocks[i]` (of
//!   whatever CPU it is on by then);
//! - a writer first unpublishes (stores a new table pointer), then calls
//!   [`Srcu::synchronize`]: it waits until every reader of the *other*
//!   parity has left, flips the epoch, and waits until every reader of the
//!   old parity has left. After that no reader can still hold anything it
//!   found before the unpublish, so the writer may free it (or `munmap` the
//!   range).
//!
//! Why a reader that the writer did not count is safe: the reader's counter
//! increment, a SeqCst fence, then its load of the table pointer; the
//! writer's store of the new pointer, a SeqCst fence, then its sums of the
//! counters. Of two such store→fence→load sequences at least one sees the
//! other's store: either the writer counts the reader (and waits for it), or
//! the reader loads the new pointer (and never sees what is being freed).
//! The sums read every `unlocks` before every `locks`: a reader whose
//! unlock is counted has its lock counted too, so `locks == unlocks` means
//! no counted reader is still inside. Readers that migrate between CPUs
//! inside a section (lock on one slot, unlock on another) are why only the
//! sums are compared, never one slot's pair.
//!
//! Readers on different CPUs touch different cache lines (per-CPU slots,
//! from `sched_getcpu`, which glibc answers from the rseq area): the fault
//! path of two threads on two CPUs shares no written line here. Writers
//! (map, unmap) serialise on a mutex and may wait: they never run in a
//! signal handler.
//!
//! A reader must never wait for a writer inside its section (the writer
//! would wait for it in turn): faultmap's sections cover one lookup and the
//! non-blocking part of a fault, and end before anything sleeps.

use crate::sync::{backoff, fence, AtomicU64, AtomicUsize, Mutex, Ordering};

/// Counter slots: CPUs share a slot modulo this.
#[cfg(not(loom))]
const SLOTS: usize = 64;
#[cfg(loom)]
const SLOTS: usize = 2;

/// One CPU's counters, on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    locks: [AtomicU64; 2],
    unlocks: [AtomicU64; 2],
}

/// A sleepable-RCU domain (see the module documentation).
pub(crate) struct Srcu {
    epoch: AtomicUsize,
    slots: [Slot; SLOTS],
    writer: Mutex<()>,
}

/// A read section: what was loaded inside it stays allocated until it is
/// dropped.
#[must_use = "the section ends when the guard is dropped"]
pub(crate) struct ReadGuard<'a> {
    srcu: &'a Srcu,
    parity: usize,
}

impl Srcu {
    pub(crate) fn new() -> Self {
        Self {
            epoch: AtomicUsize::new(0),
            slots: std::array::from_fn(|_| Slot::default()),
            writer: Mutex::new(()),
        }
    }

    /// Enters a read section. Async-signal-safe: two atomic operations and a
    /// fence, no lock, no allocation.
    pub(crate) fn read(&self) -> ReadGuard<'_> {
        self.read_on(cpu_slot())
    }

    fn read_on(&self, slot: usize) -> ReadGuard<'_> {
        let parity = self.epoch.load(Ordering::Relaxed) & 1;
        self.slots[slot % SLOTS].locks[parity].fetch_add(1, Ordering::Relaxed);
        // Orders the increment before every load inside the section (the
        // store-buffering pair with `synchronize`'s fence).
        fence(Ordering::SeqCst);
        ReadGuard { srcu: self, parity }
    }

    /// Waits until every read section that began before this call has ended.
    /// Call it after unpublishing something, before freeing it. Must not be
    /// called inside a read section.
    pub(crate) fn synchronize(&self) {
        #[cfg(not(loom))]
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(loom)]
        let _w = self.writer.lock().unwrap();
        // Orders the caller's unpublish before the counter reads.
        fence(Ordering::SeqCst);
        let epoch = self.epoch.load(Ordering::Relaxed);
        // Readers that read the parity before the last flip and are still
        // inside, then the flip, then the current parity's readers: new
        // readers go to the other parity, so the second wait ends.
        self.wait_idle((epoch + 1) & 1);
        self.epoch.store(epoch.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.wait_idle(epoch & 1);
    }

    /// Whether a read section is in progress now (a snapshot: it may end,
    /// or another begin, at once). Async-signal-safe.
    pub(crate) fn has_readers(&self) -> bool {
        (0..2).any(|parity| !self.idle(parity))
    }

    fn idle(&self, parity: usize) -> bool {
        let unlocks: u64 = self
            .slots
            .iter()
            .map(|s| s.unlocks[parity].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add);
        fence(Ordering::SeqCst);
        let locks: u64 = self
            .slots
            .iter()
            .map(|s| s.locks[parity].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add);
        locks == unlocks
    }

    fn wait_idle(&self, parity: usize) {
        let mut spins = 0u32;
        loop {
            if self.idle(parity) {
                // Orders the readers' last loads before whatever the
                // caller frees next.
                fence(Ordering::SeqCst);
                return;
            }
            spins = spins.saturating_add(1);
            backoff(spins);
        }
    }
}

impl ReadGuard<'_> {
    fn end_on(&self, slot: usize) {
        // Orders every load of the section before the decrement the writer
        // reads.
        fence(Ordering::SeqCst);
        self.srcu.slots[slot % SLOTS].unlocks[self.parity].fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.end_on(cpu_slot());
    }
}

#[cfg(not(loom))]
fn cpu_slot() -> usize {
    crate::sys::current_cpu()
}

#[cfg(loom)]
fn cpu_slot() -> usize {
    0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicPtr};
    use std::sync::Arc;

    /// Readers on several threads, a writer that swaps and frees: no reader
    /// ever sees a freed value (checked through a tombstone).
    #[test]
    fn readers_never_see_freed_values() {
        struct Val {
            live: AtomicBool,
        }
        let srcu = Arc::new(Srcu::new());
        let first = Box::into_raw(Box::new(Val {
            live: AtomicBool::new(true),
        }));
        let ptr = Arc::new(AtomicPtr::new(first));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (srcu, ptr, stop) = (srcu.clone(), ptr.clone(), stop.clone());
                let reads = reads.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _g = srcu.read();
                        let p = ptr.load(Ordering::Acquire);
                        // SAFETY: p was published and is freed only after a
                        // grace period that this section holds off.
                        assert!(unsafe { (*p).live.load(Ordering::Relaxed) });
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Retired values are kept (tombstoned, not freed) so that a bug is
        // an assertion, not a use-after-free.
        let mut retired = Vec::new();
        let mut swaps = 0;
        while swaps < 2000 || reads.load(Ordering::Relaxed) < 100_000 {
            swaps += 1;
            let next = Box::into_raw(Box::new(Val {
                live: AtomicBool::new(true),
            }));
            let old = ptr.swap(next, Ordering::AcqRel);
            srcu.synchronize();
            // SAFETY: old came from Box::into_raw and is unpublished.
            unsafe { (*old).live.store(false, Ordering::Relaxed) };
            retired.push(old);
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        for p in retired.into_iter().chain([ptr.load(Ordering::Relaxed)]) {
            // SAFETY: every reader is joined; each pointer is from
            // Box::into_raw and freed once.
            drop(unsafe { Box::from_raw(p) });
        }
    }

    #[test]
    fn synchronize_without_readers_returns() {
        let s = Srcu::new();
        for _ in 0..10 {
            s.synchronize();
        }
        drop(s.read());
        s.synchronize();
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::{AtomicBool, AtomicPtr};
    use loom::sync::Arc;
    use loom::thread;

    struct Val {
        live: AtomicBool,
    }

    /// Publish a new value, synchronize, then retire the old one, against a
    /// reader that may migrate between slots inside its section: a reader
    /// that loaded the old value finds it live.
    #[test]
    fn loom_models_srcu_publish_vs_reader() {
        loom::model(|| {
            let srcu = Arc::new(Srcu::new());
            let old = Arc::new(Val {
                live: AtomicBool::new(true),
            });
            let new = Arc::new(Val {
                live: AtomicBool::new(true),
            });
            let ptr = Arc::new(AtomicPtr::new(Arc::as_ptr(&old) as *mut Val));
            let reader = {
                let (srcu, ptr) = (srcu.clone(), ptr.clone());
                let keep = (old.clone(), new.clone());
                thread::spawn(move || {
                    let g = srcu.read_on(0);
                    let p = ptr.load(Ordering::Acquire);
                    // SAFETY: both values live in `keep` for the whole
                    // thread; the assertion checks the protocol, not memory.
                    let live = unsafe { (*p).live.load(Ordering::Relaxed) };
                    g.end_on(1);
                    std::mem::forget(g);
                    drop(keep);
                    assert!(live, "a reader saw a retired value");
                })
            };
            ptr.store(Arc::as_ptr(&new) as *mut Val, Ordering::Release);
            srcu.synchronize();
            old.live.store(false, Ordering::Relaxed);
            reader.join().unwrap();
        });
    }

    /// The speculative region lookup (`crate::mm::space`): a writer changes a
    /// region's option under its sequence count, then unmaps it (count odd
    /// for good, unpublished, a grace period, then gone), against a reader
    /// that finds it in a read section and validates the count before it
    /// would map. A validated read never mixes old and new options and
    /// never acts on a region that is gone; the region is live throughout
    /// the section.
    #[test]
    fn loom_models_publish_vs_speculative_lookup() {
        use crate::sync::seqcount::SeqCount;
        struct Region {
            seq: SeqCount,
            order: AtomicU64,
            window: AtomicU64,
            live: AtomicBool,
        }
        loom::model(|| {
            let srcu = Arc::new(Srcu::new());
            let region = Arc::new(Region {
                seq: SeqCount::default(),
                order: AtomicU64::new(4),
                window: AtomicU64::new(16),
                live: AtomicBool::new(true),
            });
            let table = Arc::new(AtomicPtr::new(Arc::as_ptr(&region) as *mut Region));
            let reader = {
                let (srcu, table, keep) = (srcu.clone(), table.clone(), region.clone());
                thread::spawn(move || {
                    let g = srcu.read_on(0);
                    let p = table.load(Ordering::Acquire);
                    if !p.is_null() {
                        // SAFETY: the region lives in `keep`; the assertions
                        // check the protocol, not memory safety.
                        let r = unsafe { &*p };
                        assert!(r.live.load(Ordering::Relaxed), "found a freed region");
                        if let Some(s) = r.seq.begin() {
                            let order = r.order.load(Ordering::Relaxed);
                            let window = r.window.load(Ordering::Relaxed);
                            if r.seq.still(s) {
                                assert_eq!(1u64 << order, window, "mixed options");
                                assert!(r.live.load(Ordering::Relaxed));
                            }
                        }
                    }
                    g.end_on(0);
                    std::mem::forget(g);
                    drop(keep);
                })
            };
            region.seq.write_begin();
            region.order.store(0, Ordering::Relaxed);
            region.window.store(1, Ordering::Relaxed);
            region.seq.write_end();
            region.seq.write_begin();
            table.store(std::ptr::null_mut(), Ordering::Release);
            srcu.synchronize();
            region.live.store(false, Ordering::Relaxed);
            reader.join().unwrap();
        });
    }
}
