//! Synchronisation: the primitives the lock-free protocols are built from.
//!
//! - this module itself is the *shim*: the atomics and locks the concurrent
//!   structures use, `std`'s in production and loom's under `--cfg loom`,
//!   so the loom models run the same code, and `backoff`, one turn of a
//!   wait for another thread (a yield under loom);
//! - `seqcount`: a sequence count (odd while a writer changes what it
//!   guards), the region's `vm_sequence` of the speculative fault series;
//! - `srcu`: sleepable read-copy-update with signal-safe readers, which
//!   frees the region table's old snapshots after a grace period;
//! - `gate`: a reader-writer gate on `srcu` (the kernel's
//!   `percpu_rw_semaphore`): pager threads pass it to read userfaultfd
//!   events, writers that must not meet an event half-handled close it.
//!
//! Layer rule: uses only [`crate::sys`]. Every layer above may use it.

pub(crate) mod gate;
pub(crate) mod seqcount;
pub(crate) mod srcu;

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// One more turn of a wait for another thread: spin a little, then yield,
/// then sleep 50 µs a turn (`spins` counts the turns so far). Under loom, a
/// yield, which lets the model run the other threads.
#[cfg(not(loom))]
pub(crate) fn backoff(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else if spins < 1024 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// See the non-loom `backoff`.
#[cfg(loom)]
pub(crate) fn backoff(_spins: u32) {
    loom::thread::yield_now();
}
