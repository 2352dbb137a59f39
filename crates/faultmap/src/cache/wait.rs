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

use crate::base::index::HostAddr;
use crate::cache::page_state::PageState;
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
    use crate::cache::page_state::State;
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
/// kernel's first attempt does on a locked folio).
///
/// The waker records, per faulting thread (`UFFD_FEATURE_THREAD_ID`), the
/// address it woke. A thread has one fault at a time, so the thread's next
/// fault message takes the record out: it is the retry if the address is
/// the same, and otherwise (the page was mapped meanwhile by another
/// fault, so the thread never faulted again there) the record was stale and
/// goes. The map holds at most one entry per thread that faulted.
#[derive(Debug)]
pub(crate) struct Uffd {
    fd: std::os::fd::OwnedFd,
    /// How many threads have a record: the fault path's fast check.
    pending: std::sync::atomic::AtomicUsize,
    retries: std::sync::Mutex<std::collections::HashMap<u32, HostAddr>>,
    /// An event is waiting to be read: see [`Uffd::note_event_waiting`].
    event_waiting: std::sync::atomic::AtomicBool,
}

impl Uffd {
    pub(crate) fn new(fd: std::os::fd::OwnedFd) -> Self {
        Self {
            fd,
            pending: std::sync::atomic::AtomicUsize::new(0),
            retries: std::sync::Mutex::new(std::collections::HashMap::new()),
            event_waiting: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// An event may be waiting to be read: a `UFFDIO_CONTINUE`,
    /// `UFFDIO_WRITEPROTECT` or `UFFDIO_POISON` failed with `EAGAIN` (an
    /// UNMAP or REMAP is queued, and until it is read every such call on
    /// this userfaultfd fails), or a fault found no region (a REMAP not
    /// read yet). The kernel hands out every pending fault before any
    /// event, and each of those faults ends with its thread faulting
    /// again, so the next reader drains the userfaultfd
    /// (`api::pager::handler_loop`): it reads until a read comes back short
    /// or with an event, before it wakes any fault it read, so the faults
    /// cannot queue again ahead of the event. A hint: a stale one costs one
    /// larger read.
    pub(crate) fn note_event_waiting(&self) {
        self.event_waiting
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`Uffd::note_event_waiting`] if `result` is an `EAGAIN` failure.
    pub(crate) fn note_if_eagain(&self, result: &std::io::Result<()>) {
        if matches!(result, Err(e) if e.raw_os_error() == Some(libc::EAGAIN)) {
            self.note_event_waiting();
        }
    }

    /// Whether [`Uffd::note_event_waiting`] was called since the last
    /// call; clears it. A plain load first: no write to the shared line on
    /// the common path.
    pub(crate) fn take_event_waiting(&self) -> bool {
        self.event_waiting
            .load(std::sync::atomic::Ordering::Relaxed)
            && self
                .event_waiting
                .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Thread `tid`'s fault at `addr` was woken and will fault again.
    pub(crate) fn expect_retry(&self, tid: u32, addr: HostAddr) {
        let mut map = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(tid, addr);
        self.pending
            .store(map.len(), std::sync::atomic::Ordering::Release);
    }

    /// Whether thread `tid`'s fault at `addr` is the retry of its woken
    /// fault; the thread's record goes either way. Lock-free when no thread
    /// has a record.
    pub(crate) fn take_retry(&self, tid: u32, addr: HostAddr) -> bool {
        if self.pending.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return false;
        }
        let mut map = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        let found = map.remove(&tid) == Some(addr);
        self.pending
            .store(map.len(), std::sync::atomic::Ordering::Release);
        found
    }
}

impl std::ops::Deref for Uffd {
    type Target = std::os::fd::OwnedFd;

    fn deref(&self) -> &std::os::fd::OwnedFd {
        &self.fd
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_event_hint_is_taken_once() {
        let uffd = Uffd::new(crate::sys::eventfd().unwrap());
        assert!(!uffd.take_event_waiting(), "none noted");
        uffd.note_event_waiting();
        uffd.note_event_waiting();
        assert!(uffd.take_event_waiting(), "noted");
        assert!(!uffd.take_event_waiting(), "taken once");
        uffd.note_if_eagain(&Err(std::io::Error::from_raw_os_error(libc::ENOENT)));
        uffd.note_if_eagain(&Ok(()));
        assert!(!uffd.take_event_waiting(), "not an EAGAIN");
        uffd.note_if_eagain(&Err(std::io::Error::from_raw_os_error(libc::EAGAIN)));
        assert!(uffd.take_event_waiting(), "an EAGAIN");
    }

    #[test]
    fn a_threads_next_fault_takes_its_retry_record() {
        let uffd = Uffd::new(crate::sys::eventfd().unwrap());
        assert!(!uffd.take_retry(7, HostAddr(0x1000)), "no record");
        uffd.expect_retry(7, HostAddr(0x1000));
        assert!(
            !uffd.take_retry(8, HostAddr(0x1000)),
            "another thread's fault"
        );
        assert!(uffd.take_retry(7, HostAddr(0x1000)), "the retry");
        assert!(!uffd.take_retry(7, HostAddr(0x1000)), "taken once");
        // A thread that faults elsewhere first: the stale record goes.
        uffd.expect_retry(7, HostAddr(0x2000));
        assert!(!uffd.take_retry(7, HostAddr(0x3000)));
        assert!(
            !uffd.take_retry(7, HostAddr(0x2000)),
            "the stale record is gone"
        );
        // One record per thread: the newest wins.
        uffd.expect_retry(9, HostAddr(0x4000));
        uffd.expect_retry(9, HostAddr(0x5000));
        assert!(uffd.take_retry(9, HostAddr(0x5000)));
    }
}
