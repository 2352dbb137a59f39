//! A gate that readers pass on per-CPU counters and a writer closes: the
//! kernel's `percpu_rw_semaphore`, on [`Srcu`].
//!
//! Pager threads read the userfaultfd inside a [`Passage`]; whoever must
//! not act while an event is read but not yet handled (a zap or an unmap
//! of an application's range: `crate::mm::events`) closes the gate first.
//! Passing costs what an SRCU read section costs: an increment of the
//! counter slot of the reader's own CPU, a fence and one load of a flag
//! that only writers store. Readers on two CPUs share no written cache
//! line, so the fault path of per-CPU handler threads never meets on a
//! lock.
//!
//! ```text
//!   reader: section = srcu.read()  ─┐ counter++, SeqCst fence
//!           closed?  ─ yes: end the section, wait until open, again
//!           no: pass (read the userfaultfd, handle its events)
//!           end the section
//!   writer: writers.lock(); closed = CLOSED
//!           srcu.synchronize()     ─┐ SeqCst fence, wait for every
//!           ... alone ...           │ section that began before
//!           closed = OPEN, wake the readers that sleep on it
//! ```
//!
//! **Why a passage and a closed gate never overlap.** The reader's counter
//! increment, a SeqCst fence, then its load of the flag; the writer's store
//! of the flag, a SeqCst fence (in `synchronize`), then its sums of the
//! counters. Of two such store→fence→load sequences at least one sees the
//! other's store: either the reader sees the gate closed (and passes
//! nothing), or the writer counts it and waits until its section ends.
//!
//! A reader waits for the gate outside any section, so a writer never waits
//! for a reader that waits for it. A reader may take locks inside its
//! passage (the region table's, to handle events) as long as no writer
//! holds one of them while it closes the gate: close first, then lock.
//! Writers are rare (a mapping's drop, an eviction pass, an invalidation),
//! so readers that find the gate closed sleep on a futex.

use crate::sync::srcu::{ReadGuard, Srcu};
use crate::sync::{AtomicU32, Mutex, MutexGuard, Ordering};

/// The gate is open.
const OPEN: u32 = 0;
/// A writer holds the gate.
const CLOSED: u32 = 1;
/// A writer holds the gate and a reader sleeps on it (the writer wakes it).
/// Loom has no futex: its readers yield instead of sleeping.
#[cfg_attr(loom, allow(dead_code))]
const CLOSED_WAITED: u32 = 2;

/// A gate (see the module documentation).
pub(crate) struct Gate {
    state: AtomicU32,
    readers: Srcu,
    writers: Mutex<()>,
}

/// A reader's way through the open gate; the gate cannot close until it
/// drops.
#[must_use = "the passage ends when the guard is dropped"]
pub(crate) struct Passage<'a> {
    _section: ReadGuard<'a>,
}

/// The gate, closed by one writer until this drops: no [`Passage`] is in
/// progress.
#[must_use = "the gate opens when the guard is dropped"]
pub(crate) struct Closed<'a> {
    gate: &'a Gate,
    _writer: MutexGuard<'a, ()>,
}

impl Gate {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU32::new(OPEN),
            readers: Srcu::new(),
            writers: Mutex::new(()),
        }
    }

    /// Passes the gate: waits while a writer holds it closed.
    pub(crate) fn pass(&self) -> Passage<'_> {
        loop {
            let section = self.readers.read();
            // The fence in `read` orders it after the increment; Acquire
            // pairs with the last writer's opening.
            if self.state.load(Ordering::Acquire) == OPEN {
                return Passage { _section: section };
            }
            drop(section);
            self.wait_open();
        }
    }

    /// Closes the gate: waits until every passage in progress has ended,
    /// and keeps new readers out until the guard drops. Must not be called
    /// while holding a lock that a reader takes inside its passage.
    pub(crate) fn close(&self) -> Closed<'_> {
        #[cfg(not(loom))]
        let writer = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(loom)]
        let writer = self.writers.lock().unwrap();
        self.state.store(CLOSED, Ordering::Relaxed);
        // Its SeqCst fence orders the store before the counter sums.
        self.readers.synchronize();
        Closed {
            gate: self,
            _writer: writer,
        }
    }

    /// Whether a reader is in a passage now (or has just found the gate
    /// closed). Async-signal-safe.
    pub(crate) fn busy(&self) -> bool {
        self.readers.has_readers()
    }

    #[cfg(not(loom))]
    fn wait_open(&self) {
        let mut spins = 0u32;
        loop {
            let state = self.state.load(Ordering::Acquire);
            if state == OPEN {
                return;
            }
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if state == CLOSED
                && self
                    .state
                    .compare_exchange(CLOSED, CLOSED_WAITED, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            crate::sys::futex_wait(&self.state, CLOSED_WAITED, None);
        }
    }

    #[cfg(loom)]
    fn wait_open(&self) {
        while self.state.load(Ordering::Acquire) != OPEN {
            loom::thread::yield_now();
        }
    }
}

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        // Release: what the writer did is seen by the readers it lets in.
        let was = self.gate.state.swap(OPEN, Ordering::Release);
        #[cfg(not(loom))]
        if was == CLOSED_WAITED {
            crate::sys::futex_wake(&self.gate.state, i32::MAX);
        }
        #[cfg(loom)]
        let _ = was;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// Readers pass and writers close, on several threads: no reader is
    /// ever inside while a writer holds the gate, and a reader that found
    /// it closed gets through once it opens.
    #[test]
    fn writers_exclude_readers() {
        let gate = Arc::new(Gate::new());
        let writing = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (gate, writing, stop) = (gate.clone(), writing.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut passed = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let p = gate.pass();
                        assert!(!writing.load(std::sync::atomic::Ordering::SeqCst));
                        drop(p);
                        passed += 1;
                    }
                    passed
                })
            })
            .collect();
        for _ in 0..200 {
            let closed = gate.close();
            writing.store(true, std::sync::atomic::Ordering::SeqCst);
            std::thread::yield_now();
            writing.store(false, std::sync::atomic::Ordering::SeqCst);
            drop(closed);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0, "a reader never passed");
        }
        assert!(!gate.busy());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    /// A reader passes while a writer closes: the writer's critical section
    /// and the reader's passage never overlap (loom reports the two
    /// accesses to the cell as a race if they are not ordered), and the
    /// reader gets through, before or after the writer.
    #[test]
    fn loom_models_gate_excludes() {
        loom::model(|| {
            let gate = Arc::new(Gate::new());
            let cell = Arc::new(UnsafeCell::new(0u64));
            let reader = {
                let (gate, cell) = (gate.clone(), cell.clone());
                thread::spawn(move || {
                    let p = gate.pass();
                    // SAFETY: loom checks this read against the writer's
                    // write: the gate must order them.
                    let seen = cell.with(|v| unsafe { *v });
                    drop(p);
                    seen
                })
            };
            let closed = gate.close();
            // SAFETY: as above.
            cell.with_mut(|v| unsafe { *v = 1 });
            drop(closed);
            let seen = reader.join().unwrap();
            assert!(seen == 0 || seen == 1);
        });
    }
}
