//! Grants and revokes: how an owner under the Protect engine lets a forked
//! child reach cached pages, and takes them back before it punches them.
//!
//! ## Why the child must take part
//!
//! Under the Userfaultfd engine the owner maps a page into a child itself
//! (`UFFDIO_CONTINUE` on the child's userfaultfd), and punching the hole
//! unmaps it from every process. Under Protect a child's page is reachable
//! because the *child* changed its range's protection, and no system call
//! lets one process change another's (`process_madvise` takes no guard
//! markers, and there is no remote `mprotect`). A punched hole under a
//! reachable page of a `MAP_SHARED` memfd mapping reads as zeros, and a
//! read fault there would allocate a zero page in the shared cache. So the
//! child changes its own protections, at the owner's word:
//!
//! ```text
//!   child: SIGSEGV -> FAULT(addr) --------> owner (service thread):
//!                                              pin the window's UPTODATE pages,
//!                                              set their mapped bits (guest region),
//!                                              g := newest record number,
//!                                              unpin
//!   child <------------------ [GRANT, g, n, (addr, len, prot) x n]
//!   child: lock; unless a record newer than g over these ranges was
//!          applied { mprotect each }; unlock; return
//!
//!   owner (evictor, invalidation, write-back), for pages with mapped bits:
//!      lock the link; post record r = newest + 1 in the mailbox
//!      (seqlock); pidfd_send_signal(SIGURG); wait (futex, bounded) for ack >= r;
//!      only then punch (or, for write-back, copy)
//!   child: SIGURG handler: lock; read the newest record (seqlock);
//!      if newer than applied { mprotect each; applied := r }; ack := r; wake; unlock
//! ```
//!
//! The mailbox ([`Mailbox`]) is one page of a memfd the child makes at the
//! fork and sends with its greeting; both processes map it shared.
//!
//! ## Invariants
//!
//! - **R1.** A guest makes a page reachable only by applying a grant, and
//!   a grant numbered `g` covers only pages that were pinned UPTODATE when
//!   `g` was read. The owner reads `g` at the grant's first entry (the
//!   faulting run, inside the fault path's pin); a later entry (a write
//!   fault's writable page, under a pin of its own) carries the same,
//!   older number, which can only make the guest refuse more.
//! - **R2.** A page is punched only after every guest region with the
//!   page's mapped bit set has acknowledged a record covering it (`NONE`),
//!   posted after the bit was taken; a page is copied out by write-back
//!   only after every guest granted it writable since its last write-back
//!   has acknowledged a record making it read-only. The bits are taken in
//!   one atomic step per word (`MappedPages::take`): a bit a concurrent
//!   grant sets is either in the record or still set, never lost. A guest
//!   that does not acknowledge in time fails the revoke: the page stays
//!   cached (`PageState::cancel_evict`) or dirty, and its bit (or its
//!   writable mark) is set again.
//! - **R3.** The guest applies grants and records under one lock, and
//!   applies a grant numbered `g` only if no record newer than `g` that
//!   it applied covers part of the grant's ranges (it remembers the last
//!   32 records' bounds; with more newer records than that, it refuses);
//!   it applies only the newest record, and only if it is newer than the
//!   one applied. Every holder of the lock blocks the asynchronous signals
//!   while it holds it (the SIGSEGV and SIGURG handlers' masks, and
//!   [`crate::sys::with_async_signals_blocked`] elsewhere), so no handler
//!   that takes it runs on a thread that holds it.
//!
//! Why they suffice. *Eviction*: a page is frozen (EVICTING) only once
//! every pin is let go, so a record `r` posted for it comes after every
//! grant number `g` read under a pin of it: `r > g`. In the guest, the
//! grant's `mprotect` runs either before the record is applied (the
//! record's protection then wins) or after (then the record, newer than
//! `g` and over the page, is remembered, and the grant is refused: the
//! access faults again and asks anew). *Write-back*: a writable grant's
//! `g` is read before the write fault sets DIRTY; write-back clears DIRTY
//! (claims the page) before it posts its record. If the claim comes after
//! the DIRTY, `r > g`, and the argument above holds (a write after the
//! record faults and sets DIRTY again); if before, the page is DIRTY again
//! once written back, and the guest's write is copied by the next
//! write-back. A record applied late (after the owner gave up on it) only
//! takes more away; a record skipped for a newer one was given up on by
//! the owner already, and took nothing away. The loom model below runs
//! the guest's side and the mailbox through this code, with the owner's
//! pin, freeze and punch simulated; the owner's `ChildLink` (its waits,
//! timeouts and bit restores) is exercised by `tests/fork.rs` and
//! `tests/unrelated.rs`.
//!
//! ## What a guest must not do
//!
//! A guest that does not answer in time keeps the pages it reaches cached
//! (beyond the owner's budget, counted in `AreaStats::child_revokes_failed`)
//! until it answers; nothing reads wrong. That happens if it:
//!
//! - blocks SIGURG in every thread, ignores it, replaces faultmap's handler
//!   without chaining, or takes it with `sigwait` or a signalfd (a lost
//!   signal is sent again at each later revoke);
//! - is stopped (SIGSTOP, a debugger, a cgroup freezer).
//!
//! And a guest must not `munmap` an inherited range and map something
//! else there: a stale grant would change the new mapping's protection.
//!
//! A guest whose channel closed and that does not answer is taken to have
//! exec'd only if its *alive* page (a memfd page it maps writable for its
//! life, `sys::share`) has no writable mapping left: the owner's
//! `F_SEAL_WRITE` on it succeeds then, and fails (`EBUSY`) while the
//! guest's program still maps it. That needs no `/proc` (which a program
//! that is not dumpable hides), and a guest that merely closed its
//! descriptors is never taken for gone. A joiner says when it unmapped its
//! range (`UNLINKED`); one whose channel closes without it is served until
//! it exits.
//!
//! SIGURG interrupts a guest's system calls as any handled signal does:
//! `SA_RESTART` restarts most of them, but `nanosleep`, `poll`, `select`,
//! `epoll_wait` and their kind return `EINTR`.
//!
//! Everything the child does here is atomics, `mprotect` and `futex`:
//! async-signal-safe.

use crate::sync::seqcount::SeqCount;
use crate::sync::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::Prot;

/// Entries per record or grant.
pub(crate) const ENTRIES: usize = 160;

/// How long an owner waits for a child's acknowledgement.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) const REVOKE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// One range whose protection a grant or record sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) prot: Prot,
}

impl Entry {
    pub(crate) const EMPTY: Entry = Entry {
        addr: 0,
        len: 0,
        prot: Prot::None,
    };
}

/// The shared page between an owner and one child (`#[repr(C)]`: both
/// processes are the same program, and it must fit in a page).
#[repr(C)]
pub(crate) struct Mailbox {
    /// Twice the newest record's number; odd while the owner writes one.
    seq: SeqCount,
    /// The newest record the child applied (its number's low 32 bits): a
    /// shared futex word.
    ack: AtomicU32,
    count: AtomicU32,
    /// `(addr, len, prot)` each.
    entries: [[AtomicU64; 3]; ENTRIES],
}

/// The bytes a mailbox takes (one page).
pub(crate) const MAILBOX_BYTES: usize = 4096;

const _: () = assert!(std::mem::size_of::<Mailbox>() <= MAILBOX_BYTES);

fn prot_word(p: Prot) -> u64 {
    match p {
        Prot::None => 0,
        Prot::Read => 1,
        Prot::ReadWrite => 2,
    }
}

fn word_prot(w: u64) -> Prot {
    match w {
        1 => Prot::Read,
        2 => Prot::ReadWrite,
        _ => Prot::None,
    }
}

impl Mailbox {
    /// A zeroed mailbox (for models and tests; a real one is a zeroed
    /// memfd page).
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self {
            seq: SeqCount::default(),
            ack: AtomicU32::new(0),
            count: AtomicU32::new(0),
            entries: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// The newest record's number (a record being written is not counted):
    /// a grant's number. Owner side.
    pub(crate) fn newest(&self) -> u64 {
        // An odd count is a record half-written: the one before it is
        // the newest whole one.
        self.seq.raw() / 2
    }

    /// Writes `entries` (at most [`ENTRIES`]) as the next record and
    /// returns its number. The caller serialises the owner's writers.
    pub(crate) fn post(&self, entries: &[Entry]) -> u64 {
        let n = entries.len().min(ENTRIES);
        self.seq.write_begin();
        self.count.store(n as u32, Ordering::Relaxed);
        for (slot, e) in self.entries.iter().zip(&entries[..n]) {
            slot[0].store(e.addr as u64, Ordering::Relaxed);
            slot[1].store(e.len as u64, Ordering::Relaxed);
            slot[2].store(prot_word(e.prot), Ordering::Relaxed);
        }
        self.seq.write_end();
        self.newest()
    }

    /// Whether the child acknowledged record `r` or a newer one.
    pub(crate) fn acked(&self, r: u64) -> bool {
        let ack = self.ack.load(Ordering::Acquire);
        (ack.wrapping_sub(r as u32) as i32) >= 0
    }

    /// The futex word the child wakes after an acknowledgement.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn ack_word(&self) -> &AtomicU32 {
        &self.ack
    }

    /// The newest record, read whole (`None`: the owner is writing one;
    /// a signal follows its end).
    fn read(&self, out: &mut [Entry; ENTRIES]) -> Option<(u64, usize)> {
        let seen = self.seq.begin()?;
        let n = (self.count.load(Ordering::Relaxed) as usize).min(ENTRIES);
        for (o, slot) in out.iter_mut().zip(&self.entries[..n]) {
            *o = Entry {
                addr: slot[0].load(Ordering::Relaxed) as usize,
                len: slot[1].load(Ordering::Relaxed) as usize,
                prot: word_prot(slot[2].load(Ordering::Relaxed)),
            };
        }
        self.seq.still(seen).then_some((seen / 2, n))
    }
}

/// A child's side of one mailbox (a forked child has one; a joiner one
/// per joined range): the mailbox's address while it is attached, the
/// newest record applied from it, and the lock over the protection
/// changes of its ranges.
pub(crate) struct ChildState {
    lock: AtomicU32,
    applied: AtomicU64,
    /// The attached mailbox's address (0: none). Read only under the
    /// lock, and cleared only under it: a mailbox is never read after
    /// [`ChildState::detach`] returns, so its page may be unmapped then.
    mailbox: AtomicUsize,
    /// The last records applied: `(number, lowest address, highest end)`
    /// at `number % HISTORY` (under the lock). A grant is refused only
    /// for a newer record over its ranges, not for any newer record: an
    /// owner that evicts steadily would otherwise refuse every grant.
    history: [[AtomicU64; 3]; HISTORY],
}

/// Records a child remembers the ranges of.
const HISTORY: usize = 32;

/// What became of a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Granted {
    /// Applied: the access runs again and finds its page.
    Applied,
    /// A newer record was applied since the grant was made, or the
    /// mailbox is gone: refused (the access faults again and asks anew).
    Stale,
    /// An `mprotect` failed with this errno (what came before it stays).
    Failed(i32),
}

impl Default for ChildState {
    fn default() -> Self {
        Self::new()
    }
}

impl ChildState {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        Self {
            lock: AtomicU32::new(0),
            applied: AtomicU64::new(0),
            mailbox: AtomicUsize::new(0),
            history: [const { [const { AtomicU64::new(0) }; 3] }; HISTORY],
        }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        Self {
            lock: AtomicU32::new(0),
            applied: AtomicU64::new(0),
            mailbox: AtomicUsize::new(0),
            history: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// Forgets everything, lock included: in a forked child's at-fork
    /// handler (one thread, which holds nothing), where what the parent
    /// had is not this process's.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn reset(&self) {
        self.mailbox.store(0, Ordering::Relaxed);
        self.applied.store(0, Ordering::Relaxed);
        self.history
            .iter()
            .flatten()
            .for_each(|w| w.store(0, Ordering::Relaxed));
        self.lock.store(0, Ordering::Release);
    }

    /// Attaches the mailbox at `mailbox` (a fresh one: no record applied
    /// yet). The caller keeps it mapped until [`ChildState::detach`], and
    /// blocks SIGURG (a revoke on this thread would wait for itself).
    pub(crate) fn attach(&self, mailbox: *const Mailbox) {
        self.lock();
        self.applied.store(0, Ordering::Relaxed);
        self.history
            .iter()
            .flatten()
            .for_each(|w| w.store(0, Ordering::Relaxed));
        self.mailbox.store(mailbox as usize, Ordering::Relaxed);
        self.unlock();
    }

    /// Detaches the mailbox: once this returns, nothing reads it. The
    /// caller blocks SIGURG.
    pub(crate) fn detach(&self) {
        self.lock();
        self.mailbox.store(0, Ordering::Relaxed);
        self.unlock();
    }

    /// The attached mailbox's address (0: none; a hint).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn address(&self) -> usize {
        self.mailbox.load(Ordering::Relaxed)
    }

    /// Whether a mailbox is attached (a hint: it may change at once).
    pub(crate) fn attached(&self) -> bool {
        self.mailbox.load(Ordering::Relaxed) != 0
    }

    /// Takes the lock. Its holder is another thread of this process inside
    /// one grant or record (a few `mprotect`s): every holder blocks the
    /// asynchronous signals meanwhile (R3), so no handler that takes it
    /// runs on a thread that holds it.
    fn lock(&self) {
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            relax(spins);
            spins = spins.saturating_add(1);
        }
    }

    fn unlock(&self) {
        self.lock.store(0, Ordering::Release);
    }

    /// Applies grant `g` (its entries, through `apply`) unless a newer
    /// record was applied since (R3) or the mailbox is gone. The caller
    /// blocks SIGURG.
    pub(crate) fn grant(
        &self,
        g: u64,
        entries: &[Entry],
        mut apply: impl FnMut(&Entry) -> Result<(), i32>,
    ) -> Granted {
        self.lock();
        let out = if self.mailbox.load(Ordering::Relaxed) == 0 || self.taken_since(g, entries) {
            Granted::Stale
        } else {
            entries
                .iter()
                .try_for_each(&mut apply)
                .map_or_else(Granted::Failed, |()| Granted::Applied)
        };
        self.unlock();
        out
    }

    /// Whether a record newer than `g` that was applied may have taken
    /// away part of `entries` (under the lock): one over them, or more
    /// newer records than are remembered. A record not applied (skipped
    /// for a newer one) took nothing away.
    fn taken_since(&self, g: u64, entries: &[Entry]) -> bool {
        let applied = self.applied.load(Ordering::Relaxed);
        if applied <= g {
            return false;
        }
        if applied - g > HISTORY as u64 {
            return true;
        }
        let lo = entries.iter().map(|e| e.addr as u64).min().unwrap_or(0);
        let hi = entries
            .iter()
            .map(|e| e.addr.saturating_add(e.len) as u64)
            .max()
            .unwrap_or(0);
        (g + 1..=applied).any(|r| {
            let [n, start, end] = &self.history[(r % HISTORY as u64) as usize];
            n.load(Ordering::Relaxed) == r
                && start.load(Ordering::Relaxed) < hi
                && lo < end.load(Ordering::Relaxed)
        })
    }

    /// The revoke handler's work: applies the attached mailbox's newest
    /// record if it is newer than the one applied (through `apply`), then
    /// acknowledges it and wakes the owner. Returns the record
    /// acknowledged (`None`: no mailbox, or the owner was writing a
    /// record, whose signal is still to come).
    pub(crate) fn revoke(&self, mut apply: impl FnMut(&Entry)) -> Option<u64> {
        let mut record = [Entry::EMPTY; ENTRIES];
        self.lock();
        let at = self.mailbox.load(Ordering::Relaxed);
        let acked = (at != 0)
            .then(|| {
                // SAFETY: an attached mailbox stays mapped until `detach`,
                // which takes the lock this thread holds (`attach`'s
                // contract).
                let mailbox = unsafe { &*(at as *const Mailbox) };
                let (r, n) = mailbox.read(&mut record)?;
                if r > self.applied.load(Ordering::Relaxed) {
                    let record = &record[..n];
                    record.iter().for_each(&mut apply);
                    let lo = record.iter().map(|e| e.addr as u64).min().unwrap_or(0);
                    let hi = record
                        .iter()
                        .map(|e| e.addr.saturating_add(e.len) as u64)
                        .max()
                        .unwrap_or(0);
                    let slot = &self.history[(r % HISTORY as u64) as usize];
                    for (word, v) in slot.iter().zip([r, lo, hi]) {
                        word.store(v, Ordering::Relaxed);
                    }
                    self.applied.store(r, Ordering::Relaxed);
                }
                // Release: the owner that sees the acknowledgement sees the
                // protections changed (system calls, done already).
                mailbox.ack.store(r as u32, Ordering::Release);
                #[cfg(not(loom))]
                super::futex_wake_shared(mailbox.ack_word(), i32::MAX);
                Some(r)
            })
            .flatten();
        self.unlock();
        acked
    }
}

#[cfg(not(loom))]
fn relax(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else {
        // SAFETY: sched_yield takes no argument; async-signal-safe.
        unsafe { libc::sched_yield() };
    }
}

#[cfg(loom)]
fn relax(_spins: u32) {
    loom::thread::yield_now();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn entry(addr: usize, prot: Prot) -> Entry {
        Entry {
            addr,
            len: 0x1000,
            prot,
        }
    }

    #[test]
    fn a_record_is_read_whole_applied_once_and_acknowledged() {
        let mailbox = Mailbox::new();
        let child = ChildState::new();
        child.attach(&mailbox);
        assert_eq!(mailbox.newest(), 0);
        let r = mailbox.post(&[entry(0x1000, Prot::None), entry(0x3000, Prot::Read)]);
        assert_eq!((r, mailbox.newest()), (1, 1));
        assert!(!mailbox.acked(r));
        let mut seen = Vec::new();
        assert_eq!(child.revoke(|e| seen.push(*e)), Some(1));
        assert_eq!(seen, [entry(0x1000, Prot::None), entry(0x3000, Prot::Read)]);
        assert!(mailbox.acked(r));
        // A second signal for the same record applies nothing again.
        assert_eq!(child.revoke(|e| seen.push(*e)), Some(1));
        assert_eq!(seen.len(), 2);
        // Detached: nothing is read, and a grant is refused.
        child.detach();
        mailbox.post(&[entry(0x5000, Prot::None)]);
        assert_eq!(child.revoke(|e| seen.push(*e)), None);
        assert_eq!(seen.len(), 2);
        assert_eq!(
            child.grant(u64::MAX, &[entry(0x1000, Prot::Read)], |_| Ok(())),
            Granted::Stale
        );
    }

    #[test]
    fn a_grant_older_than_the_newest_record_applied_is_refused() {
        let mailbox = Mailbox::new();
        let child = ChildState::new();
        child.attach(&mailbox);
        let g = mailbox.newest();
        let r = mailbox.post(&[entry(0x1000, Prot::None)]);
        child.revoke(|_| {});
        let mut applied = 0;
        let granted = child.grant(g, &[entry(0x1000, Prot::Read)], |_| {
            applied += 1;
            Ok(())
        });
        assert_eq!((granted, applied), (Granted::Stale, 0));
        // A grant older than a record elsewhere is applied.
        assert_eq!(
            child.grant(g, &[entry(0x2000, Prot::Read)], |_| Ok(())),
            Granted::Applied
        );
        // A grant made after it is applied.
        assert_eq!(
            child.grant(r, &[entry(0x1000, Prot::Read)], |_| Ok(())),
            Granted::Applied
        );
        assert_eq!(
            child.grant(r, &[entry(0x1000, Prot::Read)], |_| Err(libc::ENOMEM)),
            Granted::Failed(libc::ENOMEM)
        );
    }

    #[test]
    fn acknowledgements_compare_across_the_32_bit_wrap() {
        let mailbox = Mailbox::new();
        mailbox.ack.store(u32::MAX, Ordering::Relaxed);
        assert!(mailbox.acked(u64::from(u32::MAX)));
        assert!(mailbox.acked(u64::from(u32::MAX) - 5));
        assert!(!mailbox.acked(u64::from(u32::MAX) + 1));
        mailbox.ack.store(3, Ordering::Relaxed);
        assert!(mailbox.acked((1u64 << 32) + 2));
        assert!(!mailbox.acked((1u64 << 32) + 4));
    }

    #[test]
    fn a_record_of_more_entries_than_fit_keeps_the_first() {
        let mailbox = Mailbox::new();
        let child = ChildState::new();
        child.attach(&mailbox);
        let many: Vec<Entry> = (0..ENTRIES + 5)
            .map(|i| entry(i * 0x1000, Prot::None))
            .collect();
        mailbox.post(&many);
        let mut n = 0;
        child.revoke(|_| n += 1);
        assert_eq!(n, ENTRIES);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::AtomicBool;
    use loom::sync::{Arc, Notify};
    use loom::thread;

    // The simulated page's state word: what the page-state word says of
    // pins and freezing.
    const UPTODATE: u32 = 0;
    const PINNED: u32 = 1;
    const EVICTING: u32 = 2;

    struct World {
        mailbox: Mailbox,
        child: ChildState,
        page: AtomicU32,
        /// The guest region's mapped bit.
        mapped: AtomicBool,
        /// The child's protection of the page (0 none, 1 read).
        prot: AtomicU32,
        punched: AtomicBool,
        /// The grant sent to the child: g + 1, or u64::MAX for none.
        sent: AtomicU64,
        sent_ready: Notify,
        /// The signal: 1 sent, 2 none will come.
        signal: AtomicU32,
        signal_ready: Notify,
        /// The handler acknowledged (the owner's futex wake).
        acked: Notify,
    }

    /// The owner grants a page to the child while its evictor takes it
    /// back, and the child's fault and revoke handler run on two threads:
    /// the page is never reachable in the child once punched, whatever the
    /// interleaving (R1 to R3 through `post`, `newest`, `acked`, `grant`
    /// and `revoke`).
    #[test]
    fn loom_models_a_punched_page_is_never_reachable_in_a_child() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(|| {
            let w = Arc::new(World {
                mailbox: Mailbox::new(),
                child: ChildState::new(),
                page: AtomicU32::new(UPTODATE),
                mapped: AtomicBool::new(false),
                prot: AtomicU32::new(0),
                punched: AtomicBool::new(false),
                sent: AtomicU64::new(0),
                sent_ready: Notify::new(),
                signal: AtomicU32::new(0),
                signal_ready: Notify::new(),
                acked: Notify::new(),
            });
            // The mailbox lives in the Arc, which outlives every thread.
            w.child.attach(&w.mailbox);
            let entry = Entry {
                addr: 0x1000,
                len: 0x1000,
                prot: Prot::Read,
            };
            // The owner's service thread: the fault path's pin, map, unpin.
            let service = {
                let w = w.clone();
                thread::spawn(move || {
                    let pinned = w
                        .page
                        .compare_exchange(UPTODATE, PINNED, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok();
                    let sent = if pinned {
                        w.mapped.store(true, Ordering::Relaxed);
                        let g = w.mailbox.newest();
                        w.page.store(UPTODATE, Ordering::Release);
                        g + 1
                    } else {
                        u64::MAX
                    };
                    w.sent.store(sent, Ordering::Release);
                    w.sent_ready.notify();
                })
            };
            // The owner's evictor: freeze, revoke if mapped, punch.
            let evictor = {
                let w = w.clone();
                thread::spawn(move || {
                    let frozen = w
                        .page
                        .compare_exchange(UPTODATE, EVICTING, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok();
                    if !frozen || !w.mapped.load(Ordering::Relaxed) {
                        w.signal.store(2, Ordering::Release);
                        w.signal_ready.notify();
                        if !frozen {
                            return;
                        }
                    } else {
                        let r = w.mailbox.post(&[Entry {
                            prot: Prot::None,
                            ..entry
                        }]);
                        w.signal.store(1, Ordering::Release);
                        w.signal_ready.notify();
                        // Notify wakes spuriously: the owner's futex loop.
                        while !w.mailbox.acked(r) {
                            w.acked.wait();
                        }
                    }
                    w.punched.store(true, Ordering::SeqCst);
                    assert_eq!(
                        w.prot.load(Ordering::SeqCst),
                        0,
                        "punched under a reachable page"
                    );
                })
            };
            // The child's faulting thread: applies the grant it got.
            let fault = {
                let w = w.clone();
                thread::spawn(move || {
                    let sent = loop {
                        match w.sent.load(Ordering::Acquire) {
                            0 => w.sent_ready.wait(),
                            sent => break sent,
                        }
                    };
                    if sent == u64::MAX {
                        return;
                    }
                    w.child.grant(sent - 1, &[entry], |_| {
                        w.prot.store(1, Ordering::SeqCst);
                        assert!(
                            !w.punched.load(Ordering::SeqCst),
                            "a punched page made reachable"
                        );
                        Ok(())
                    });
                })
            };
            // The child's revoke handler, once signalled.
            let handler = {
                let w = w.clone();
                thread::spawn(move || {
                    let signal = loop {
                        match w.signal.load(Ordering::Acquire) {
                            0 => w.signal_ready.wait(),
                            signal => break signal,
                        }
                    };
                    if signal != 1 {
                        return;
                    }
                    let acked = w.child.revoke(|e| {
                        assert_eq!(e.prot, Prot::None);
                        w.prot.store(0, Ordering::SeqCst);
                    });
                    assert!(acked.is_some(), "the record is whole once signalled");
                    w.acked.notify();
                })
            };
            for t in [service, evictor, fault, handler] {
                t.join().unwrap();
            }
        });
    }
}
