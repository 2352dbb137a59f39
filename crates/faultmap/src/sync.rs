//! The atomics and locks the concurrent structures use: `std`'s in
//! production, loom's under `--cfg loom`, so the loom models run the same
//! code.

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
