//! Faults waiting for a read in flight.
//!
//! When a fault finds its page READING (another fault is reading it from the
//! store), it must not read the page a second time, and the handler thread
//! must not block either: other faults are queued behind it. So the fault is
//! *parked*: its address goes on the object's wait list, the page's WAITERS
//! flag is set, and the handler moves on. The faulting thread stays asleep in
//! the kernel until someone wakes it. This is the kernel's `PG_waiters` and
//! `folio_wait_bit` with the sleeping done by userfaultfd.
//!
//! # Protocol
//!
//! ```text
//!   waiter (fault on a READING page)         reader (owns the read)
//!   --------------------------------         ----------------------
//!   lock list
//!   push (addr, uffd)                        end_read: CAS READING -> UPTODATE
//!   add_waiter: CAS sets WAITERS               | (or ABSENT on failure)
//!     ok  -> parked: unlock, return            | the replaced word says WAITERS?
//!     err -> pop, unlock, look again           v
//!                                            take_all: lock, drain, unlock
//!                                            UFFDIO_WAKE each, on its own uffd
//! ```
//!
//! Invariant: a parked waiter is woken. The entry is listed before the flag
//! is set, and both happen under the lock. If the reader's CAS comes first,
//! `add_waiter` fails and the waiter looks again. If the flag comes first,
//! the reader sees it in the word its CAS replaced, and its `take_all` (which
//! needs the lock) finds the entry.
//!
//! A reader that saw WAITERS wakes *every* listed waiter of the object, not
//! only those of its own pages. A waiter whose page is still being read by
//! someone else just faults again and parks again. Waking by page state
//! instead would lose a waiter whose page failed and was claimed again before
//! the wake pass: the new read does not carry the old WAITERS flag. Waking
//! too many is cheap (a spurious fault); waking too few is a hang.
//!
//! A waiter remembers the userfaultfd its fault came from: an object can be
//! mapped by several pagers, and a wake on the wrong userfaultfd wakes no one.

use crate::page_state::PageState;
use crate::sync::Mutex;

/// The parked faults of one object. `W` is what a reader needs to wake one
/// (the address and its userfaultfd).
#[derive(Debug)]
pub(crate) struct WaitList<W> {
    list: Mutex<Vec<W>>,
}

impl<W> Default for WaitList<W> {
    fn default() -> Self {
        Self {
            list: Mutex::new(Vec::new()),
        }
    }
}

impl<W> WaitList<W> {
    /// Parks `waiter` on `state`, a page being read. Returns false, parking
    /// nothing, if the read ended meanwhile (the caller looks at the page
    /// again).
    pub(crate) fn park(&self, state: &PageState, waiter: W) -> bool {
        let mut list = lock(&self.list);
        list.push(waiter);
        if state.add_waiter().is_ok() {
            return true;
        }
        list.pop();
        false
    }

    /// Takes every parked waiter, for a reader that ended a read whose page
    /// had WAITERS set.
    pub(crate) fn take_all(&self) -> Vec<W> {
        std::mem::take(&mut *lock(&self.list))
    }
}

#[cfg(not(loom))]
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock leaves a valid Vec: go on.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(loom)]
fn lock<T>(m: &Mutex<T>) -> loom::sync::MutexGuard<'_, T> {
    m.lock().unwrap()
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::page_state::State;
    use loom::sync::Arc;
    use loom::thread;

    /// A fault parks on a page while its reader ends the read, successfully
    /// or not: a parked waiter is always among those the reader wakes.
    fn park_vs_end_read(read_fails: bool) {
        loom::model(move || {
            let page = Arc::new(PageState::new());
            let waits: Arc<WaitList<u32>> = Arc::new(WaitList::default());
            assert!(page.begin_read());
            let (p, w) = (page.clone(), waits.clone());
            let waiter = thread::spawn(move || w.park(&p, 7));
            let old = if read_fails {
                page.fail_read()
            } else {
                page.finish_read(false)
            };
            let woken = if old.has_waiters() {
                waits.take_all()
            } else {
                Vec::new()
            };
            let parked = waiter.join().unwrap();
            if parked {
                assert_eq!(woken, vec![7], "a parked waiter was not woken");
            } else {
                assert!(woken.is_empty());
                assert_ne!(page.load().state(), State::Reading);
            }
        });
    }

    #[test]
    fn park_vs_finish_read() {
        park_vs_end_read(false);
    }

    #[test]
    fn park_vs_fail_read() {
        park_vs_end_read(true);
    }

    /// The lost-waiter race of a failed read that is claimed again before
    /// the wake pass: the waiter parked on the first read must still be
    /// woken by the first reader.
    #[test]
    fn failed_read_reclaimed_before_the_wake_pass() {
        loom::model(|| {
            let page = Arc::new(PageState::new());
            let waits: Arc<WaitList<u32>> = Arc::new(WaitList::default());
            assert!(page.begin_read());
            let (p, w) = (page.clone(), waits.clone());
            let waiter = thread::spawn(move || w.park(&p, 7));
            let (p, w) = (page.clone(), waits.clone());
            let reader = thread::spawn(move || {
                let old = p.fail_read();
                // Another reader claims the page before this one wakes.
                let _second = p.begin_read();
                if old.has_waiters() {
                    w.take_all()
                } else {
                    Vec::new()
                }
            });
            let parked = waiter.join().unwrap();
            let woken = reader.join().unwrap();
            let later = waits.take_all();
            if parked {
                // Parked on the first read: woken by its reader. Parked on
                // the second: still listed for the second reader.
                assert!(woken == vec![7] || later == vec![7]);
            }
        });
    }
}

/// A pager's userfaultfd, and the faults it woke that will fault again.
///
/// A parked fault is woken by the reader of its page; its thread then
/// faults again, as a new message at the same address. That second message
/// is the *retry* of the first fault (the kernel's `FAULT_FLAG_TRIED`): it is
/// not counted as a new fault and does no readahead bookkeeping, which its
/// first attempt already did (a fault that missed raised `mmap_miss`; a
/// fault that found its page being read did the hit bookkeeping and took
/// the readahead marker, set at claim time, before it parked, as the
/// kernel's first attempt does on a locked folio). The waker records the
/// address here; the fault path takes it back out. Only the waker knows
/// which address it woke: the page itself may be touched by other mappings
/// first.
///
/// Known inaccuracy: entries are keyed by address alone. A woken thread
/// whose page was mapped meanwhile by another fault's fault-around never
/// faults again, so its entry stays until a later fault at that address
/// (uncounted, and without readahead bookkeeping) takes it; the set is
/// cleared when it reaches [`MAX_RETRIES`] entries. Keying on the thread
/// (`UFFD_FEATURE_THREAD_ID`) would make this exact.
#[derive(Debug)]
pub(crate) struct Uffd {
    fd: std::os::fd::OwnedFd,
    /// How many addresses are in `retries`: the fault path's fast check.
    pending: std::sync::atomic::AtomicUsize,
    retries: std::sync::Mutex<std::collections::HashSet<usize>>,
}

/// The most woken-fault addresses a pager remembers.
const MAX_RETRIES: usize = 4096;

impl Uffd {
    pub(crate) fn new(fd: std::os::fd::OwnedFd) -> Self {
        Self {
            fd,
            pending: std::sync::atomic::AtomicUsize::new(0),
            retries: std::sync::Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// The fault at `addr` was woken and will fault again.
    pub(crate) fn expect_retry(&self, addr: usize) {
        let mut set = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        if set.len() >= MAX_RETRIES {
            set.clear();
        }
        set.insert(addr);
        self.pending
            .store(set.len(), std::sync::atomic::Ordering::Release);
    }

    /// Whether the fault at `addr` is the retry of a woken fault (and
    /// forgets it). Lock-free when no retry is pending.
    pub(crate) fn take_retry(&self, addr: usize) -> bool {
        if self.pending.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return false;
        }
        let mut set = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        let found = set.remove(&addr);
        self.pending
            .store(set.len(), std::sync::atomic::Ordering::Release);
        found
    }
}

impl std::ops::Deref for Uffd {
    type Target = std::os::fd::OwnedFd;

    fn deref(&self) -> &std::os::fd::OwnedFd {
        &self.fd
    }
}
