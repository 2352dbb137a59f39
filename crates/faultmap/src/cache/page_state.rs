//! The page-state word: one `AtomicU64` per cached page.
//!
//! A page's whole cache state is one 64-bit word, and every change of state is
//! one named compare-and-swap. Readers (the fault path, fault-around) never
//! take a lock: they load the word, and to use a page they *pin* it with a CAS
//! from the exact value they loaded, so the pin fails if anything moved in
//! between. This is the lockless page cache's "speculative get_page, then
//! re-check" (the lockless page cache) on a flat array instead of a radix tree: the array is
//! never freed while the object lives, so there is nothing for a reader to
//! dereference after it is gone.
//!
//! # Layout
//!
//! ```text
//!   63                 32 31            16 15                 2 1   0
//!  +---------------------+----------------+--------------------+-----+
//!  |       version       |      pins      |       flags        |state|
//!  +---------------------+----------------+--------------------+-----+
//!   flags: bit  2 WAITERS    (a fault waits for the read in flight)
//!          bit  3 MARKER     (readahead marker: fault-around skips it)
//!          bit  4 READAHEAD  (read ahead, not mapped by anyone yet: the
//!                             first pin clears it, which is how the
//!                             readahead miss ratio is counted)
//!          bit  5 FAILED     (ABSENT because the last read failed: the next
//!                             fault reads this page alone, and SIGBUS if
//!                             that fails too)
//!          bit  6 REFERENCED (a fault mapped it since the CLOCK hand last
//!                             looked: the PTE's accessed bit)
//!          bit  7 SECOND     (the hand found it referenced once already:
//!                             PG_referenced)
//!          bit  8 ACTIVE     (in the active set: protected from the hand
//!                             while the active set is within its target)
//!          bit  9 MAPPED     (mapped somewhere since the hand last
//!                             unmapped it, or read ahead and not visited
//!                             yet: "maybe in use")
//!          bit 10 DIRTY      (written since its last write-back began)
//!          bit 11 WRITEBACK  (being written back to the store)
//!          bit 12 STALLED    (READING, and the read outlived the store
//!                             timeout: faults on it fail instead of waiting)
//!          bit 13 AROUND     (read around a miss by adaptive read-around,
//!                             not mapped by anyone yet: the first pin
//!                             clears it, which is how the window's use is
//!                             counted)
//! ```
//!
//! # States and transitions
//!
//! ```text
//!                begin_read              finish_read
//!    ABSENT  ------------------> READING -------------> UPTODATE <--+
//!      ^                            |                     |  ^      | try_pin /
//!      |         fail_read          |                     |  +------+ unpin
//!      +----------------------------+                     |
//!      |                                                  | begin_evict (no pins)
//!      +----------------- finish_evict ---- EVICTING <----+
//! ```
//!
//! | transition     | from      | to       | who                              |
//! |----------------|-----------|----------|----------------------------------|
//! | `begin_read`   | ABSENT    | READING  | the one fault/worker that reads  |
//! | `finish_read`  | READING   | UPTODATE | that reader, data in the memfd   |
//! | `fail_read`    | READING   | ABSENT   | that reader, the store failed    |
//! | `add_waiter`   | READING   | READING+W| a fault that must wait for it    |
//! | `mark`         | READING   | +MARKER  | the claimer of a readahead window|
//! | `clear_marker` | any       | -MARKER  | the fault that consumes it       |
//! | `try_pin`      | UPTODATE  | pins+1, MAPPED | fault-around, lock-free    |
//! | `try_pin_referenced` | UPTODATE | pins+1, MAPPED, REFERENCED | the faulting page |
//! | `try_pin_io`   | UPTODATE  | pins+1   | write-back                       |
//! | `unpin`        | pins      | pins-1   | the pin's holder                 |
//! | `set_dirty`    | pinned    | +DIRTY   | a write fault, after unprotecting |
//! | `begin_writeback` | DIRTY  | -DIRTY +WRITEBACK | the flusher   |
//! | `end_writeback`| WRITEBACK | -WRITEBACK (+DIRTY on error) | the flusher |
//! | `clock`        | UPTODATE  | CLOCK flags | the evictor's hand        |
//! | `mark_active`  | READING   | +ACTIVE  | a refault's reader (`fetch_or`)  |
//! | `stall`        | READING   | +STALLED | the store-timeout watchdog       |
//! | `discard_dirty`| DIRTY     | -DIRTY   | truncation (bytes past the end)  |
//! | `begin_evict`  | UPTODATE, 0 pins, clean | EVICTING | invalidation    |
//! | `begin_reclaim`| as `begin_evict`, not used since the visit | EVICTING | the hand |
//! | `finish_evict` | EVICTING  | ABSENT   | the evictor, hole punched        |
//!
//! Every state change (not a pin) bumps the version, so a reader that loaded
//! a word and later CASes from it cannot succeed across an evict-and-reread.
//!
//! # Invariants
//!
//! 1. Only the thread that won `begin_read` writes the page's bytes, and only
//!    while the page is READING: no mapping can map it then (fault-around maps
//!    only pinned UPTODATE pages), so nobody can observe a half-filled page.
//! 2. A pinned page stays UPTODATE: `begin_evict` requires zero pins and pins
//!    can only be taken on an UPTODATE word, so while a pin is held the page
//!    is in the memfd and its bytes are final.
//! 3. WAITERS is set only on a READING page, and the reader that ends the
//!    read (either way) sees it in the value its CAS replaced, so it knows
//!    that faults are parked and wakes them (`crate::cache::wait`).

use crate::sync::{AtomicU64, Ordering};

const STATE_MASK: u64 = 0b11;
const ABSENT: u64 = 0;
const READING: u64 = 1;
const UPTODATE: u64 = 2;
const EVICTING: u64 = 3;

const WAITERS: u64 = 1 << 2;
const MARKER: u64 = 1 << 3;
const READAHEAD: u64 = 1 << 4;
const FAILED: u64 = 1 << 5;
const REFERENCED: u64 = 1 << 6;
const SECOND: u64 = 1 << 7;
const ACTIVE: u64 = 1 << 8;
const MAPPED: u64 = 1 << 9;
const DIRTY: u64 = 1 << 10;
const WRITEBACK: u64 = 1 << 11;
const STALLED: u64 = 1 << 12;
const AROUND: u64 = 1 << 13;
/// The CLOCK's flags: what the hand reads and rewrites.
const CLOCK_FLAGS: u64 = REFERENCED | SECOND | ACTIVE | MAPPED;
/// Flags that live from the end of a read to the first pin.
const UNMAPPED_FLAGS: u64 = READAHEAD | AROUND;

const PIN_SHIFT: u32 = 16;
const PIN_ONE: u64 = 1 << PIN_SHIFT;
const PIN_MASK: u64 = 0xFFFF << PIN_SHIFT;
const VERSION_SHIFT: u32 = 32;
const VERSION_ONE: u64 = 1 << VERSION_SHIFT;

/// A decoded state, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not in the memfd.
    Absent,
    /// Being read from the store by one thread.
    Reading,
    /// In the memfd and valid.
    UpToDate,
    /// Being removed from the memfd.
    Evicting,
}

/// One loaded value of a page-state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Word(u64);

impl Word {
    /// The word of a page that was never touched.
    pub const ABSENT: Word = Word(0);

    /// The page's state.
    pub fn state(self) -> State {
        match self.0 & STATE_MASK {
            ABSENT => State::Absent,
            READING => State::Reading,
            UPTODATE => State::UpToDate,
            _ => State::Evicting,
        }
    }

    /// Whether a fault waits for this page's read.
    pub fn has_waiters(self) -> bool {
        self.0 & WAITERS != 0
    }

    /// Whether the page carries the readahead marker.
    pub fn is_marker(self) -> bool {
        self.0 & MARKER != 0
    }

    /// Whether the page was read ahead and has not been mapped since.
    pub fn is_read_ahead(self) -> bool {
        self.0 & READAHEAD != 0
    }

    /// Whether the page was read around a miss by adaptive read-around and
    /// no one has mapped it yet.
    pub fn is_around(self) -> bool {
        self.0 & AROUND != 0
    }

    /// Whether the page is ABSENT because its last read failed.
    pub fn has_failed(self) -> bool {
        self.0 & FAILED != 0
    }

    /// Whether a fault mapped the page since the CLOCK hand last looked.
    pub fn is_referenced(self) -> bool {
        self.0 & REFERENCED != 0
    }

    /// Whether the page is in the active set.
    pub fn is_active(self) -> bool {
        self.0 & ACTIVE != 0
    }

    /// Whether the page was written since its last write-back began.
    pub fn is_dirty(self) -> bool {
        self.0 & DIRTY != 0
    }

    /// Whether the page is being written back.
    pub fn is_writeback(self) -> bool {
        self.0 & WRITEBACK != 0
    }

    /// Whether the page's read outlived the store timeout.
    pub fn is_stalled(self) -> bool {
        self.0 & STALLED != 0
    }

    /// The CLOCK's view of the page.
    pub fn clock_bits(self) -> crate::policy::clock::Bits {
        crate::policy::clock::Bits {
            referenced: self.0 & REFERENCED != 0,
            second: self.0 & SECOND != 0,
            active: self.0 & ACTIVE != 0,
            mapped: self.0 & MAPPED != 0,
            dirty: self.0 & (DIRTY | WRITEBACK) != 0,
        }
    }

    /// How many pins are held.
    pub fn pins(self) -> u64 {
        (self.0 & PIN_MASK) >> PIN_SHIFT
    }

    /// The version: bumped by every state change.
    pub fn version(self) -> u64 {
        self.0 >> VERSION_SHIFT
    }

    fn with_state(self, state: u64) -> Word {
        Word(((self.0 & !STATE_MASK & !WAITERS) | state).wrapping_add(VERSION_ONE))
    }
}

/// The atomic page-state word of one page.
#[derive(Debug, Default)]
pub struct PageState(AtomicU64);

impl PageState {
    /// A new word, ABSENT.
    pub fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Loads the word. Acquire: a reader that sees UPTODATE also sees the
    /// bytes the reader wrote before `finish_read` (Release).
    pub fn load(&self) -> Word {
        Word(self.0.load(Ordering::Acquire))
    }

    fn cas(&self, old: Word, new: Word) -> Result<Word, Word> {
        self.0
            .compare_exchange(old.0, new.0, Ordering::AcqRel, Ordering::Acquire)
            .map(Word)
            .map_err(Word)
    }

    /// ABSENT → READING. Returns true if this caller now owns the read.
    pub fn begin_read(&self) -> bool {
        let mut cur = self.load();
        while cur.state() == State::Absent {
            match self.cas(cur, Word(cur.with_state(READING).0 & !FAILED)) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    /// READING → UPTODATE, by the reader that owns the read, after the bytes
    /// are in the memfd. `read_ahead` marks a page that no fault asked for
    /// (READAHEAD); a readahead marker set at claim time stays. Returns the
    /// replaced word, so the reader sees whether faults wait for it.
    pub fn finish_read(&self, read_ahead: bool) -> Word {
        // A page read ahead starts MAPPED ("maybe in use" to the CLOCK),
        // so the hand gives it one trip before it can evict it unused, as
        // the kernel adds it at the young end of the inactive list.
        self.end_read(UPTODATE | if read_ahead { READAHEAD | MAPPED } else { 0 })
    }

    /// Sets AROUND on a page this caller just claimed (READING) for a
    /// read-around window of adaptive read-around; it survives the read
    /// and the first pin clears it (a no-op in any other state).
    pub fn mark_around(&self) {
        let mut cur = self.load();
        while cur.state() == State::Reading && !cur.is_around() {
            match self.cas(cur, Word(cur.0 | AROUND)) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Sets the readahead marker on a page this caller just claimed
    /// (READING), as the kernel sets PG_readahead when it allocates the
    /// folio, before the I/O: a fault that finds the page still being read
    /// can already start the next window.
    pub fn mark(&self) {
        let mut cur = self.load();
        while cur.state() == State::Reading && !cur.is_marker() {
            match self.cas(cur, Word(cur.0 | MARKER)) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// READING → ABSENT with FAILED set, by the reader that owns the read,
    /// when the store failed. Returns the replaced word (see
    /// [`PageState::finish_read`]).
    pub fn fail_read(&self) -> Word {
        self.end_read(ABSENT | FAILED)
    }

    /// READING → ABSENT without FAILED, by the reader that owns the read,
    /// when the read is dropped unread (a read ahead still queued when its
    /// pager stops): the page is as if never claimed, and the next fault
    /// reads it. Returns the replaced word.
    pub fn drop_read(&self) -> Word {
        self.end_read(ABSENT)
    }

    fn end_read(&self, to: u64) -> Word {
        let mut cur = self.load();
        loop {
            debug_assert_eq!(cur.state(), State::Reading);
            // A successful read keeps the marker (if no fault consumed it
            // meanwhile); a failed one drops it with the page.
            let kept = if to & STATE_MASK == UPTODATE {
                cur.0 & (MARKER | ACTIVE | AROUND)
            } else {
                0
            };
            let flags = MARKER | UNMAPPED_FLAGS | FAILED | STALLED | CLOCK_FLAGS;
            let new = Word((cur.with_state(to).0 & !flags) | (to & flags) | kept);
            match self.cas(cur, new) {
                Ok(old) => return old,
                Err(now) => cur = now,
            }
        }
    }

    /// Registers a waiter on a page being read. Returns `Ok` if the flag is
    /// set (the reader will wake the range), or `Err(word)` with the current
    /// word if the page is no longer READING (the caller handles it as such).
    pub fn add_waiter(&self) -> Result<(), Word> {
        let mut cur = self.load();
        loop {
            if cur.state() != State::Reading {
                return Err(cur);
            }
            if cur.has_waiters() {
                return Ok(());
            }
            match self.cas(cur, Word(cur.0 | WAITERS)) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Pins an UPTODATE page, starting from a word the caller loaded, and
    /// clears READAHEAD in the same CAS (the caller pins to map). Fails,
    /// returning the current word, if the page is not UPTODATE or the word
    /// moved since `seen` (the caller reloads and retries, or skips it).
    /// On success, returns whether this pin cleared READAHEAD: the first
    /// use of a page read ahead.
    pub fn try_pin(&self, seen: Word) -> Result<bool, Word> {
        self.pin_with(seen, MAPPED)
    }

    /// [`PageState::try_pin`] for the faulting page itself: also sets
    /// REFERENCED, the accessed bit the CLOCK hand samples.
    pub fn try_pin_referenced(&self, seen: Word) -> Result<bool, Word> {
        self.pin_with(seen, MAPPED | REFERENCED)
    }

    /// Pins an UPTODATE page for I/O (write-back): no flag changes.
    pub fn try_pin_io(&self, seen: Word) -> Result<(), Word> {
        if seen.state() != State::UpToDate || seen.0 & PIN_MASK == PIN_MASK {
            return Err(seen);
        }
        self.cas(seen, Word(seen.0 + PIN_ONE)).map(|_| ())
    }

    fn pin_with(&self, seen: Word, set: u64) -> Result<bool, Word> {
        if seen.state() != State::UpToDate || seen.0 & PIN_MASK == PIN_MASK {
            return Err(seen);
        }
        let new = Word(((seen.0 + PIN_ONE) & !UNMAPPED_FLAGS) | set);
        self.cas(seen, new).map(|_| seen.is_read_ahead())
    }

    /// Marks a pinned page DIRTY (a write fault, after it unprotected the
    /// page: see `crate::mm::writeback` for why in that order). Returns whether
    /// the page was clean (not DIRTY) before: the first write since its
    /// last write-back began.
    pub fn set_dirty(&self) -> bool {
        let old = self.0.fetch_or(DIRTY, Ordering::AcqRel);
        debug_assert!(old & PIN_MASK != 0, "set_dirty without a pin");
        old & DIRTY == 0
    }

    /// DIRTY → WRITEBACK, by the one writer-back of the page (the caller
    /// holds an I/O pin). Returns false if the page is clean or already
    /// being written back.
    pub fn begin_writeback(&self) -> bool {
        let mut cur = self.load();
        while cur.0 & DIRTY != 0 && cur.0 & WRITEBACK == 0 {
            match self.cas(cur, Word((cur.0 & !DIRTY) | WRITEBACK)) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    /// Ends a write-back: clears WRITEBACK, and if it failed sets DIRTY
    /// again (the data must be written later, as the kernel redirties a
    /// page whose write-back failed). Returns whether this call set DIRTY
    /// (a failed write-back of a page no write dirtied meanwhile).
    pub fn end_writeback(&self, ok: bool) -> bool {
        let mut cur = self.load();
        loop {
            debug_assert!(cur.0 & WRITEBACK != 0);
            let new = Word((cur.0 & !WRITEBACK) | if ok { 0 } else { DIRTY });
            match self.cas(cur, new) {
                Ok(old) => return !ok && old.0 & DIRTY == 0,
                Err(now) => cur = now,
            }
        }
    }

    /// Drops a page's DIRTY flag without writing it back (truncation: the
    /// bytes are beyond the object's new end). Returns whether it was set.
    pub fn discard_dirty(&self) -> bool {
        self.0.fetch_and(!DIRTY, Ordering::AcqRel) & DIRTY != 0
    }

    /// The CLOCK hand's visit: `decide` maps the page's CLOCK bits to new
    /// ones (and the caller's action), applied in one CAS, retried on
    /// change. Returns `None` if the page is not UPTODATE (nothing to do).
    pub fn clock<A>(
        &self,
        mut decide: impl FnMut(crate::policy::clock::Bits) -> (crate::policy::clock::Bits, A),
    ) -> Option<A> {
        let mut cur = self.load();
        loop {
            if cur.state() != State::UpToDate {
                return None;
            }
            let (bits, action) = decide(cur.clock_bits());
            let mut new = cur.0 & !CLOCK_FLAGS;
            for (on, bit) in [
                (bits.referenced, REFERENCED),
                (bits.second, SECOND),
                (bits.active, ACTIVE),
                (bits.mapped, MAPPED),
            ] {
                if on {
                    new |= bit;
                }
            }
            if new == cur.0 {
                return Some(action);
            }
            match self.cas(cur, Word(new)) {
                Ok(_) => return Some(action),
                Err(now) => cur = now,
            }
        }
    }

    /// Puts a page being read (claimed by this caller) in the active set at
    /// once: a refault of a page evicted recently (`crate::policy::workingset`).
    pub fn mark_active(&self) {
        self.0.fetch_or(ACTIVE, Ordering::AcqRel);
    }

    /// READING → READING+STALLED: the read outlived the store timeout.
    /// Returns the replaced word (to see whether faults wait), or `None` if
    /// the page is no longer READING.
    pub fn stall(&self) -> Option<Word> {
        let mut cur = self.load();
        while cur.state() == State::Reading {
            match self.cas(cur, Word(cur.0 | STALLED)) {
                Ok(old) => return Some(old),
                Err(now) => cur = now,
            }
        }
        None
    }

    /// Drops a pin taken with [`PageState::try_pin`].
    pub fn unpin(&self) {
        // Release: our use of the page happens before an evictor that sees
        // zero pins.
        let old = self.0.fetch_sub(PIN_ONE, Ordering::Release);
        debug_assert!(old & PIN_MASK != 0, "unpin without a pin");
    }

    /// Clears the readahead marker of a page (UPTODATE, or READING: the
    /// marker is set at claim time). Returns true if this caller cleared it
    /// (and so owns triggering the next window).
    pub fn clear_marker(&self) -> bool {
        let mut cur = self.load();
        while cur.is_marker() {
            match self.cas(cur, Word(cur.0 & !MARKER)) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    /// UPTODATE with no pins, clean (not DIRTY nor WRITEBACK) → EVICTING,
    /// clearing the CLOCK flags. Returns true if this caller now owns the
    /// eviction.
    pub fn begin_evict(&self) -> bool {
        self.begin_evict_from(self.load())
    }

    /// [`PageState::begin_evict`] from a word the caller loaded: fails if
    /// the word moved since (so the caller knows the flags it replaced).
    pub fn begin_evict_seen(&self, seen: Word) -> bool {
        self.begin_evict_from(seen)
    }

    fn begin_evict_from(&self, cur: Word) -> bool {
        if cur.state() != State::UpToDate || cur.pins() != 0 || cur.0 & (DIRTY | WRITEBACK) != 0 {
            return false;
        }
        let new = Word(cur.with_state(EVICTING).0 & !(MARKER | UNMAPPED_FLAGS | CLOCK_FLAGS));
        self.cas(cur, new).is_ok()
    }

    /// [`PageState::begin_evict`] for the CLOCK hand: fails also if a fault
    /// used the page since the hand's visit (REFERENCED or MAPPED set
    /// again), so that a page is never evicted right after a use.
    pub fn begin_reclaim(&self) -> bool {
        let cur = self.load();
        if cur.0 & (REFERENCED | MAPPED | ACTIVE) != 0 {
            return false;
        }
        self.begin_evict_from(cur)
    }

    /// EVICTING → UPTODATE, by the evictor, when the page cannot leave
    /// after all (a mapping could not be made to stop reaching it: the
    /// Protect engine's zap failed): it stays cached, as it was but for
    /// the flags `begin_evict` cleared.
    pub fn cancel_evict(&self) {
        let cur = self.load();
        debug_assert_eq!(cur.state(), State::Evicting);
        // Nobody else changes an EVICTING word (see `finish_evict`).
        self.0.store(cur.with_state(UPTODATE).0, Ordering::Release);
    }

    /// EVICTING → ABSENT, by the evictor, after the page left the memfd.
    pub fn finish_evict(&self) {
        let cur = self.load();
        debug_assert_eq!(cur.state(), State::Evicting);
        // Nobody else changes an EVICTING word: pins need UPTODATE, reads
        // need ABSENT, waiters need READING.
        self.0.store(cur.with_state(ABSENT).0, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_read_then_pins() {
        let p = PageState::new();
        assert_eq!(p.load().state(), State::Absent);
        assert!(p.begin_read());
        assert!(!p.begin_read(), "a second reader must not win");
        assert!(
            p.try_pin(p.load()).is_err(),
            "a READING page cannot be pinned"
        );
        let old = p.finish_read(false);
        assert!(!old.has_waiters());
        let w = p.load();
        assert_eq!(w.state(), State::UpToDate);
        assert_eq!(p.try_pin(w), Ok(false));
        assert!(p.try_pin(w).is_err(), "the word moved: the stale pin fails");
        assert_eq!(p.try_pin(p.load()), Ok(false));
        assert_eq!(p.load().pins(), 2);
        assert!(!p.begin_evict(), "pinned pages are not evicted");
        p.unpin();
        p.unpin();
        assert!(p.begin_evict());
        p.finish_evict();
        assert_eq!(p.load().state(), State::Absent);
        assert_eq!(p.load().version(), 4, "four state changes");
    }

    #[test]
    fn waiters_are_reported_to_the_reader() {
        let p = PageState::new();
        assert_eq!(p.add_waiter(), Err(Word::ABSENT));
        assert!(p.begin_read());
        assert_eq!(p.add_waiter(), Ok(()));
        assert!(p.fail_read().has_waiters());
        assert_eq!(p.load().state(), State::Absent);
        assert!(p.load().has_failed());
        assert!(p.begin_read());
        assert!(!p.load().has_failed(), "a new read clears FAILED");
        assert!(!p.load().has_waiters(), "the flag goes with the read");
    }

    #[test]
    fn around_lives_from_the_claim_to_the_first_pin() {
        let p = PageState::default();
        assert!(p.begin_read());
        p.mark_around();
        assert!(p.load().is_around());
        p.finish_read(true);
        let seen = p.load();
        assert!(seen.is_around() && seen.is_read_ahead());
        assert_eq!(p.try_pin(seen), Ok(true));
        assert!(!p.load().is_around(), "the first pin clears it");
        // A failed read drops it; a page not READING is not marked.
        let q = PageState::default();
        q.mark_around();
        assert!(!q.load().is_around());
        assert!(q.begin_read());
        q.mark_around();
        q.fail_read();
        assert!(!q.load().is_around());
    }

    #[test]
    fn the_first_pin_of_a_page_read_ahead_reports_it() {
        let p = PageState::new();
        assert!(p.begin_read());
        p.finish_read(true);
        assert!(p.load().is_read_ahead());
        assert_eq!(p.try_pin(p.load()), Ok(true));
        p.unpin();
        assert_eq!(p.try_pin(p.load()), Ok(false), "only the first use counts");
        p.unpin();
    }

    #[test]
    fn marker_is_set_by_the_read_and_cleared_once() {
        let p = PageState::new();
        assert!(p.begin_read());
        p.mark();
        assert!(p.load().is_marker(), "marked while READING");
        p.finish_read(false);
        assert!(p.load().is_marker(), "the read keeps it");
        assert!(p.clear_marker());
        assert!(!p.clear_marker());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two faults race to read one page: exactly one wins the read; the other
    /// either sees it UPTODATE or registers as a waiter that the reader sees.
    #[test]
    fn read_vs_waiter() {
        loom::model(|| {
            let p = Arc::new(PageState::new());
            let q = p.clone();
            let other = thread::spawn(move || {
                if q.begin_read() {
                    q.finish_read(false);
                    return (true, false);
                }
                match q.add_waiter() {
                    Ok(()) => (false, true),
                    Err(w) => {
                        assert_eq!(w.state(), State::UpToDate);
                        (false, false)
                    }
                }
            });
            let mine = if p.begin_read() {
                let old = p.finish_read(false);
                Some(old.has_waiters())
            } else {
                None
            };
            let (they_read, they_wait) = other.join().unwrap();
            assert!(mine.is_some() != they_read, "exactly one reader");
            if they_wait {
                assert_eq!(mine, Some(true), "the reader saw the waiter");
            }
            assert_eq!(p.load().state(), State::UpToDate);
        });
    }

    /// A pin races an eviction: either the pin holds and the eviction fails,
    /// or the eviction wins and the pin fails. Never both.
    #[test]
    fn pin_vs_evict() {
        loom::model(|| {
            let p = Arc::new(PageState::new());
            assert!(p.begin_read());
            p.finish_read(false);
            let q = p.clone();
            let evictor = thread::spawn(move || {
                if q.begin_evict() {
                    q.finish_evict();
                    true
                } else {
                    false
                }
            });
            let seen = p.load();
            let pinned = p.try_pin(seen).is_ok();
            if pinned {
                assert_eq!(p.load().state(), State::UpToDate);
            }
            let evicted = evictor.join().unwrap();
            assert!(!(pinned && evicted), "a pinned page was evicted");
            if pinned {
                p.unpin();
            }
        });
    }

    /// The invalidation protocol (`crate::mm::invalidate`) against a fault that
    /// maps the page: the invalidator freezes the page (waiting out a pin),
    /// unmaps it, and releases it ABSENT; the fault pins, maps, unpins. A
    /// page never ends ABSENT (punched) while a mapping of it is left.
    #[test]
    fn pin_vs_invalidate() {
        use loom::sync::atomic::AtomicBool;
        loom::model(|| {
            let p = Arc::new(PageState::new());
            assert!(p.begin_read());
            p.finish_read(false);
            let mapped = Arc::new(AtomicBool::new(false));
            let (q, m) = (p.clone(), mapped.clone());
            let invalidator = thread::spawn(move || {
                loop {
                    if q.begin_evict() {
                        break;
                    }
                    if q.load().state() == State::Absent {
                        return;
                    }
                    thread::yield_now();
                }
                m.store(false, Ordering::Relaxed);
                q.finish_evict();
            });
            let seen = p.load();
            if p.try_pin(seen).is_ok() {
                mapped.store(true, Ordering::Relaxed);
                p.unpin();
            }
            invalidator.join().unwrap();
            assert_eq!(p.load().state(), State::Absent);
            assert!(
                !mapped.load(Ordering::Relaxed),
                "a page was mapped after its invalidation unmapped it"
            );
        });
    }

    /// Insertion (a read completing) against a lock-free lookup: a lookup
    /// that pins the page sees the bytes the reader wrote before
    /// `finish_read`; one that does not finds it READING.
    #[test]
    fn insert_vs_lookup() {
        loom::model(|| {
            let p = Arc::new(PageState::new());
            let data = Arc::new(AtomicU64::new(0));
            assert!(p.begin_read());
            let (q, d) = (p.clone(), data.clone());
            let reader = thread::spawn(move || {
                d.store(42, Ordering::Relaxed);
                q.finish_read(false);
            });
            let seen = p.load();
            match seen.state() {
                State::UpToDate => {
                    if p.try_pin(seen).is_ok() {
                        assert_eq!(
                            data.load(Ordering::Relaxed),
                            42,
                            "pinned a page before its bytes"
                        );
                        p.unpin();
                    }
                }
                state => assert_eq!(state, State::Reading),
            }
            reader.join().unwrap();
        });
    }

    /// The faulting page's marker clear against a neighbour's fault-around,
    /// which skips a page carrying the marker: the marker is cleared once,
    /// and fault-around pins the page only after it was cleared.
    #[test]
    fn marker_clear_vs_fault_around() {
        loom::model(|| {
            let p = Arc::new(PageState::new());
            assert!(p.begin_read());
            p.mark();
            p.finish_read(false);
            let q = p.clone();
            let around = thread::spawn(move || {
                let seen = q.load();
                if seen.is_marker() {
                    return false;
                }
                match q.try_pin(seen) {
                    Ok(_) => {
                        q.unpin();
                        true
                    }
                    Err(_) => false,
                }
            });
            let cleared = p.clear_marker();
            assert!(cleared, "the only clearer clears it");
            assert!(!p.clear_marker(), "cleared once");
            let _pinned_after_clear = around.join().unwrap();
            assert!(!p.load().is_marker());
        });
    }

    /// The CLOCK hand (visit, then reclaim) against a fault that pins the
    /// page to map it: a pinned page is never frozen, and a page the fault
    /// pinned after the hand's visit is not reclaimed by that visit's
    /// decision (the pin set REFERENCED again, which `begin_reclaim`
    /// refuses): a page is never evicted right after a use.
    #[test]
    fn clock_reclaim_vs_fault() {
        use loom::sync::atomic::AtomicBool;
        loom::model(|| {
            let p = Arc::new(PageState::new());
            assert!(p.begin_read());
            p.finish_read(false);
            let pinned_at_all = Arc::new(AtomicBool::new(false));
            let (q, seen_pin) = (p.clone(), pinned_at_all.clone());
            let fault = thread::spawn(move || {
                let seen = q.load();
                if q.try_pin_referenced(seen).is_ok() {
                    seen_pin.store(true, Ordering::Relaxed);
                    assert_eq!(q.load().state(), State::UpToDate, "pinned page frozen");
                    q.unpin();
                    true
                } else {
                    false
                }
            });
            // The hand: a page nobody used is evicted on this visit.
            let action = p.clock(|b| {
                let (next, action, _) = crate::policy::clock::visit(b, false);
                (next, action)
            });
            let evicted = action == Some(crate::policy::clock::Action::Evict) && p.begin_reclaim();
            if evicted {
                p.finish_evict();
            }
            let used = fault.join().unwrap();
            if used && evicted {
                // The fault's pin must have come before the hand's visit
                // (the visit then saw REFERENCED and did not say Evict), so
                // both cannot be true.
                panic!("a page was evicted after the hand saw it unused while a fault used it");
            }
        });
    }
}
