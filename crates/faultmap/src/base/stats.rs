//! Counters, named as the kernel names them.
//!
//! Each mapping and each object has its own [`Counters`], and the pager has
//! one set for all of its mappings; the fault path adds to all three
//! (relaxed atomics: counters order nothing). A [`Stats`] is a snapshot of
//! one set, taken once the faults that began before it have added their
//! counts ([`InFlight`]).
//!
//! | counter          | kernel counterpart | counts                                      |
//! |------------------|--------------------|---------------------------------------------|
//! | `pgfault`        | `pgfault`          | fault events handled                        |
//! | `pgmajfault`     | `pgmajfault`       | fault events that needed store I/O          |
//! | `pgfault_around` | (none: RSS only)   | neighbour pages mapped by fault-around      |
//! | `fault_wait`     | `FAULT_FLAG_TRIED` | faults that waited for another's read       |
//! | `io_count`       | block requests     | store read requests                         |
//! | `io_bytes`       | bytes read         | bytes read from the store                   |
//! | `io_errors`      | `-EIO` to a fault  | failed store reads                          |
//! | `io_retry_single`| `->read_folio`     | window reads that failed and were retried for the faulting page alone |
//! | `map_calls`      | (none)             | `UFFDIO_CONTINUE` calls                     |
//! | `map_eexist`     | (none)             | pages found already mapped by another fault |
//! | `lookup_retry`   | `xas_retry`        | page-state words that moved under a pin     |
//! | `spf_success`    | `SPF` / `VMA_LOCK_SUCCESS` | faults resolved on a speculatively found region |
//! | `spf_abort`      | `VMA_LOCK_ABORT`   | speculative attempts that found their region changing |
//! | `spf_fallback`   | (classic path)     | faults the speculative lookup did not find  |
//! | `forwarded`      | (none)             | SIGBUS-mode faults handed to a pager thread |
//! | `evicted`        | `pgsteal_file`     | pages evicted by the CLOCK hand             |
//! | `refault`        | `workingset_refault_file` (+`_activate`) | pages read again soon after eviction, activated |
//! | `clock_unmapped` | (PTE young clearing) | pages unmapped everywhere to sample their use |
//! | `clock_referenced` | `pgrefill`/referenced | pages the hand found used since its last visit |
//! | `clock_activated`| `pgactivate`       | pages moved into the active set            |
//! | `write_faults`   | `pgfault` on write-protected PTEs | first writes to clean pages  |
//! | `written_back`   | `nr_written`       | pages written back to the store             |
//! | `writeback_errors` | `AS_EIO`         | failed store writes                         |
//! | `io_retries`     | (none)             | failed store requests tried again           |
//! | `io_timeouts`    | (none)             | store calls that outlived the timeout       |
//! | `io_cancelled`   | (none)             | pages read ahead for an object whose last handle went: dropped unread, or read and not cached |
//! | `fault_around_auto` | (none)          | windows adaptive fault-around sized (one per attempt to map a fault's window) |
//! | `fault_around_auto_pages` | (none)    | the pages of those windows (their sum)      |
//! | `fault_around_auto_revisits` | (none) | faults in a page table it had mapped pages of: its density goes up on these, down on first faults in a table |
//! | `trace_recorded` | (none)             | first touches a recording mapping noted     |
//! | `trace_replayed` | (none)             | schedule pages a replay asked for (read, cached, or no room) |

#[cfg(not(loom))]
use std::sync::TryLockError;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::policy::readahead::{Pattern, Window};
use crate::sync::{backoff, fence, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

/// The longest a snapshot waits for the faults begun before it to add
/// their counts, its turn after other snapshots included. It waits only
/// for faults that began before it moved the epoch, so a steady stream of
/// faults does not hold it up; this bounds a fault whose handling is
/// itself held up (the region table's lock held through a grace period, a
/// kernel call held up by memory reclaim, a store read run by the fault's
/// thread at shutdown). A fault that never ends (a store that hangs in
/// that read) makes every later snapshot of its counters take this long.
#[cfg_attr(loom, allow(dead_code))]
const SETTLE_LIMIT: Duration = Duration::from_secs(1);

/// The faults being handled that will add to a set of counters, by the
/// epoch they began in, so that a snapshot waits for exactly those that
/// began before it.
///
/// A fault begins ([`InFlight::begin`]) before it lets its thread go and
/// ends after it added its counts. A settle ([`InFlight::settle`]) moves
/// the epoch on, then waits until no fault of the old epoch's parity is
/// left. The protocol:
///
/// - a fault loads the epoch `e`, adds one to slot `e & 1`, a full fence,
///   and loads the epoch again; if it moved, it takes the one back and
///   begins again, in the new epoch. A settle moves the epoch, a full
///   fence, then loads the slot. Of two such store→fence→load sequences at
///   least one sees the other's store (as in `crate::sync::srcu`): a fault
///   that began in `e` is seen by the settle that moved the epoch off `e`,
///   which waits for it;
/// - settles take turns (a mutex, never taken on the fault path), and each
///   first waits for the other parity, where only faults that an earlier
///   settle gave up on (its time ran out) stay counted (a fault that read
///   the epoch before that settle's move may count itself there a moment,
///   then takes it back), then moves the epoch and waits for the old
///   parity. So a settle never leaves a fault begun before it unwaited,
///   whatever earlier settles did.
///
/// Then a fault whose thread went on before a snapshot was asked for is in
/// that snapshot, unless the snapshot ran out of time ([`SETTLE_LIMIT`],
/// its turn included: the mutex is tried, never waited on). The fault path
/// stays lock-free and async-signal-safe: three atomic operations and a
/// fence to begin, one to end.
pub(crate) struct InFlight {
    /// Faults in flight, by the parity of the epoch they began in: written
    /// by every fault.
    slots: Line<[AtomicU64; 2]>,
    /// The epoch faults begin in now: read by every fault, written only by
    /// settles, so on a line of its own, which the faults share unwritten.
    epoch: Line<AtomicUsize>,
    /// One settle at a time.
    settling: Mutex<()>,
}

/// A value on cache lines of its own (two: the adjacent-line prefetcher
/// pairs them).
#[repr(align(128))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A fault begun on a set of counters ([`Counters::begin`]): its slot. The
/// fault ends when this is dropped, which [`Counters::end`] does after it
/// added the fault's counts (and an unwinding panic would, so no snapshot
/// waits for a fault that is gone). Async-signal-safe.
#[must_use = "a fault begun ends when this is dropped: end it with Counters::end"]
#[derive(Debug)]
pub(crate) struct Begun<'a> {
    slot: &'a AtomicU64,
}

impl Drop for Begun<'_> {
    fn drop(&mut self) {
        // Release: a settle that sees the fault ended sees its counts.
        self.slot.fetch_sub(1, Ordering::Release);
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            slots: Line([AtomicU64::new(0), AtomicU64::new(0)]),
            epoch: Line(AtomicUsize::new(0)),
            settling: Mutex::new(()),
        }
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .field(
                "slots",
                &self.slots.each_ref().map(|s| s.load(Ordering::Relaxed)),
            )
            .finish()
    }
}

/// When a settle gives up.
#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// At this instant ([`SETTLE_LIMIT`] after the settle began).
    #[cfg_attr(loom, allow(dead_code))]
    At(Instant),
    /// Never: the loom models' settles, which must see every wait end.
    #[cfg(loom)]
    Never,
    /// At the first look that finds a fault to wait for: a loom model's
    /// settle that runs out of time.
    #[cfg(all(loom, test))]
    Now,
}

impl Deadline {
    /// A settle's deadline: [`SETTLE_LIMIT`] from now (under loom, never).
    fn for_settle() -> Self {
        #[cfg(not(loom))]
        return Deadline::At(Instant::now() + SETTLE_LIMIT);
        #[cfg(loom)]
        return Deadline::Never;
    }

    fn passed(self) -> bool {
        match self {
            Deadline::At(at) => Instant::now() >= at,
            #[cfg(loom)]
            Deadline::Never => false,
            #[cfg(all(loom, test))]
            Deadline::Now => true,
        }
    }
}

impl InFlight {
    /// A fault begins. Async-signal-safe: atomics only.
    fn begin(&self) -> Begun<'_> {
        loop {
            let epoch = self.epoch.load(Ordering::Relaxed);
            let slot = &self.slots[epoch & 1];
            slot.fetch_add(1, Ordering::Relaxed);
            // The store-buffering pair with `settle`'s fence: either this
            // load sees the settle's move, or the settle's load of the
            // slot sees this increment.
            fence(Ordering::SeqCst);
            if self.epoch.load(Ordering::Relaxed) == epoch {
                return Begun { slot };
            }
            // A settle moved the epoch on and may have found this slot
            // empty already: begin in the new epoch.
            slot.fetch_sub(1, Ordering::Release);
        }
    }

    /// Waits until every fault that began before this call has ended, or
    /// [`SETTLE_LIMIT`] has passed.
    fn settle(&self) {
        self.settle_until(Deadline::for_settle());
    }

    /// [`InFlight::settle`], giving up at `deadline`.
    fn settle_until(&self, deadline: Deadline) {
        let Some(_turn) = self.turn(deadline) else {
            return;
        };
        let epoch = self.epoch.load(Ordering::Relaxed);
        // Faults an earlier settle gave up on: they began before this
        // call too. (The mutex orders that settle's loads of the slot
        // before these.)
        if !self.drained((epoch & 1) ^ 1, deadline) {
            return;
        }
        self.epoch.store(epoch.wrapping_add(1), Ordering::Relaxed);
        // See `begin`.
        fence(Ordering::SeqCst);
        self.drained(epoch & 1, deadline);
    }

    /// The settles' mutex, tried until `deadline` (`None` if it passed
    /// first): a settle that waits for its turn never waits longer.
    #[cfg(not(loom))]
    fn turn(&self, deadline: Deadline) -> Option<MutexGuard<'_, ()>> {
        let mut spins = 0u32;
        loop {
            match self.settling.try_lock() {
                Ok(turn) => return Some(turn),
                Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(TryLockError::WouldBlock) if deadline.passed() => return None,
                Err(TryLockError::WouldBlock) => {
                    spins = spins.saturating_add(1);
                    backoff(spins);
                }
            }
        }
    }

    /// Under loom there is no deadline, and a lock is what the tries come
    /// to (a spin on `try_lock` is more than the model can explore).
    #[cfg(loom)]
    fn turn(&self, _deadline: Deadline) -> Option<MutexGuard<'_, ()>> {
        Some(self.settling.lock().unwrap())
    }

    /// Waits until slot `parity` is empty: false if `deadline` passed
    /// first.
    fn drained(&self, parity: usize, deadline: Deadline) -> bool {
        let mut spins = 0u32;
        // Acquire: pairs with the release of the faults' ends, so their
        // counts are seen once they ended.
        while self.slots[parity].load(Ordering::Acquire) != 0 {
            if deadline.passed() {
                return false;
            }
            spins = spins.saturating_add(1);
            backoff(spins);
        }
        true
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters (see the module documentation for each).
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
            /// Faults being handled that will add to these counters.
            in_flight: InFlight,
        }

        /// A snapshot of a set of counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            /// The counters, once the faults that began before this call
            /// have added to them (waiting at most [`SETTLE_LIMIT`]): a
            /// thread whose access faulted and returned normally sees its
            /// fault counted. Not so a thread woken by another fault's
            /// mapping of its page, which may return before its own
            /// message is read.
            pub(crate) fn snapshot(&self) -> Stats {
                self.settle();
                Stats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }

            /// Waits (at most [`SETTLE_LIMIT`]) until every fault that
            /// began before this call, and adds to these counters or to
            /// the readahead counters beside them, has ended.
            pub(crate) fn settle(&self) {
                self.in_flight.settle();
            }

            /// A fault that will add to these counters begins. Called
            /// before the fault lets its thread go. Async-signal-safe.
            pub(crate) fn begin(&self) -> Begun<'_> {
                self.in_flight.begin()
            }

            /// Adds every non-zero counter of a tally.
            pub(crate) fn add(&self, tally: &Stats) {
                $(if tally.$name != 0 {
                    self.$name.fetch_add(tally.$name, Ordering::Relaxed);
                })*
            }

            /// Adds a fault's tally and ends the fault begun with
            /// [`Counters::begin`]. Async-signal-safe.
            pub(crate) fn end(&self, tally: &Stats, begun: Begun<'_>) {
                self.add(tally);
                drop(begun);
            }
        }

        impl Stats {
            /// Adds every counter of `other` to this one.
            pub(crate) fn merge(&mut self, other: &Stats) {
                $(self.$name += other.$name;)*
            }

            /// `(name, value)` for every counter, in a fixed order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

counters! {
    /// Fault events handled.
    pgfault,
    /// Fault events that needed store I/O.
    pgmajfault,
    /// Neighbour pages mapped by fault-around.
    pgfault_around,
    /// Faults that waited for a read another fault had in flight.
    fault_wait,
    /// Store read requests.
    io_count,
    /// Bytes read from the store.
    io_bytes,
    /// Failed store reads.
    io_errors,
    /// Window reads that failed and were retried for the faulting page alone.
    io_retry_single,
    /// `UFFDIO_CONTINUE` calls.
    map_calls,
    /// Pages found already mapped by another fault (`EEXIST`).
    map_eexist,
    /// Page-state words that moved between load and pin.
    lookup_retry,
    /// Faults resolved on a region found by the speculative lookup.
    spf_success,
    /// Speculative attempts that found their region being changed (or
    /// changed before mapping) and went to the classic path.
    spf_abort,
    /// Faults whose address the speculative lookup did not find, handled
    /// on the classic path.
    spf_fallback,
    /// Faults that a SIGBUS handler forwarded to a pager thread (a miss, a
    /// read in flight, a readahead marker, a failed page).
    forwarded,
    /// Pages evicted from the cache by the CLOCK hand.
    evicted,
    /// Pages read again soon after their eviction (`workingset_refault`):
    /// each goes straight into the active set (`workingset_activate`).
    refault,
    /// Pages the hand unmapped from every mapping to sample their next use.
    clock_unmapped,
    /// Pages the hand found used since its last visit (a fault mapped
    /// them: the accessed bit).
    clock_referenced,
    /// Pages the hand moved into the active set (used on two visits).
    clock_activated,
    /// First writes to a clean page (write-protect faults).
    write_faults,
    /// Pages written back to the store.
    written_back,
    /// Failed store writes (the pages stay dirty).
    writeback_errors,
    /// Store requests tried again after a failure.
    io_retries,
    /// Store calls that outlived the store timeout.
    io_timeouts,
    /// Pages of reads ahead whose object's last handle went first: dropped
    /// from the queue unread, or read and not cached (`crate::mm::io`).
    /// `io_count` counts requests when they are submitted, so it includes
    /// the cancelled ones; `io_bytes` counts only what the store sent.
    io_cancelled,
    /// Windows adaptive fault-around sized (`MapOptions::fault_around_auto`;
    /// one per attempt to map a fault's window, so a retried fault counts
    /// twice).
    fault_around_auto,
    /// The pages of those windows: over `fault_around_auto`, the mean
    /// window it chose.
    fault_around_auto_pages,
    /// Faults adaptive fault-around took as use of what it had mapped (a
    /// fault in a page table with pages mapped), which raise the
    /// mapping's density; a first fault in a page table lowers it, and a
    /// fault on a page mapped already, a race lost or a failure do neither
    /// (`crate::policy::fault_around::auto`).
    fault_around_auto_revisits,
    /// Pages a recording mapping noted at their first fault
    /// (`MapOptions::record_trace`): the trace's length.
    trace_recorded,
    /// Pages a trace replay asked to have read (`MapOptions::replay_trace`),
    /// of the parts of its schedule still mapped: read then, found cached,
    /// or left out because the budget had no room; its reads count in
    /// `io_count`.
    trace_replayed,
}

// ---------------------------------------------------------------------------
// Readahead statistics: the readahead table.
// ---------------------------------------------------------------------------

fn row_of(p: Pattern) -> usize {
    match p {
        Pattern::Initial => 0,
        Pattern::Subsequent => 1,
        Pattern::Marker => 2,
        Pattern::Around => 3,
        Pattern::Random => 4,
    }
}

/// One row of the readahead table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RaRow {
    /// Readahead decisions (windows).
    pub ra_count: u64,
    /// Store read requests issued for them.
    pub io_count: u64,
    /// Windows started by a miss (the fault waited for part of them).
    pub sync_count: u64,
    /// Windows clipped at the object's end.
    pub eof_count: u64,
    /// Mean window size, in pages.
    pub ra_size: f64,
    /// Mean async tail, in pages.
    pub async_size: f64,
    /// Mean pages per store request.
    pub io_size: f64,
}

/// The readahead table (one row per pattern), and the readahead miss ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RaStats {
    /// Sync windows of a sequential stream's start.
    pub initial: RaRow,
    /// Async windows at the marker the previous window set.
    pub subsequent: RaRow,
    /// Async windows at a marker found out of step (interleaved streams).
    pub marker: RaRow,
    /// mmap read-around windows.
    pub around: RaRow,
    /// Exactly the pages asked for (random, throttled, or readahead off).
    pub random: RaRow,
    /// All of the above.
    pub all: RaRow,
    /// Pages read that no fault asked for (read ahead).
    pub read_ahead_pages: u64,
    /// Of those, pages that a mapping has since mapped.
    pub read_ahead_used: u64,
    /// Pages read ahead and never mapped, over pages read ahead.
    pub miss_ratio: Option<f64>,
}

impl RaStats {
    /// The rows with their names, in the table's order (`all` last).
    pub fn rows(&self) -> [(&'static str, &RaRow); 6] {
        [
            ("initial", &self.initial),
            ("subsequent", &self.subsequent),
            ("marker", &self.marker),
            ("around", &self.around),
            ("random", &self.random),
            ("all", &self.all),
        ]
    }
}

/// Sums of one row, as counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RowSums {
    ra_count: u64,
    io_count: u64,
    sync_count: u64,
    eof_count: u64,
    ra_pages: u64,
    async_pages: u64,
    io_pages: u64,
}

impl RowSums {
    const FIELDS: usize = 7;

    fn to_array(self) -> [u64; Self::FIELDS] {
        [
            self.ra_count,
            self.io_count,
            self.sync_count,
            self.eof_count,
            self.ra_pages,
            self.async_pages,
            self.io_pages,
        ]
    }

    fn from_array(a: [u64; Self::FIELDS]) -> Self {
        let [ra_count, io_count, sync_count, eof_count, ra_pages, async_pages, io_pages] = a;
        Self {
            ra_count,
            io_count,
            sync_count,
            eof_count,
            ra_pages,
            async_pages,
            io_pages,
        }
    }

    fn row(self) -> RaRow {
        let mean = |sum: u64, n: u64| if n == 0 { 0.0 } else { sum as f64 / n as f64 };
        RaRow {
            ra_count: self.ra_count,
            io_count: self.io_count,
            sync_count: self.sync_count,
            eof_count: self.eof_count,
            ra_size: mean(self.ra_pages, self.ra_count),
            async_size: mean(self.async_pages, self.ra_count),
            io_size: mean(self.io_pages, self.io_count),
        }
    }
}

/// One fault's (or one advice's) readahead counts, before they are added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RaTally {
    rows: [RowSums; 5],
    read_ahead_pages: u64,
    read_ahead_used: u64,
}

impl RaTally {
    /// A window was decided; `io_count` requests read `io_pages` pages of it
    /// (the rest was cached already).
    pub(crate) fn window(&mut self, w: &Window, io_count: u64, io_pages: u64) {
        let r = &mut self.rows[row_of(w.pattern)];
        r.ra_count += 1;
        r.io_count += io_count;
        r.sync_count += u64::from(w.sync);
        r.eof_count += u64::from(w.eof);
        r.ra_pages += w.size;
        r.async_pages += w.async_size;
        r.io_pages += io_pages;
    }

    /// `pages` pages were read that no fault asked for.
    pub(crate) fn read_ahead(&mut self, pages: u64) {
        self.read_ahead_pages += pages;
    }

    /// `pages` pages read ahead were mapped for the first time.
    pub(crate) fn used(&mut self, pages: u64) {
        self.read_ahead_used += pages;
    }

    pub(crate) fn is_empty(&self) -> bool {
        *self == RaTally::default()
    }

    /// Adds `other` to this tally.
    pub(crate) fn merge(&mut self, other: &RaTally) {
        for (mine, theirs) in self.rows.iter_mut().zip(other.rows) {
            *mine = RowSums::from_array(std::array::from_fn(|i| {
                mine.to_array()[i] + theirs.to_array()[i]
            }));
        }
        self.read_ahead_pages += other.read_ahead_pages;
        self.read_ahead_used += other.read_ahead_used;
    }
}

/// Live readahead counters.
#[derive(Debug, Default)]
pub(crate) struct RaCounters {
    rows: [[AtomicU64; RowSums::FIELDS]; 5],
    read_ahead_pages: AtomicU64,
    read_ahead_used: AtomicU64,
}

impl RaCounters {
    pub(crate) fn add(&self, t: &RaTally) {
        if t.is_empty() {
            return;
        }
        for (live, sums) in self.rows.iter().zip(t.rows) {
            for (c, v) in live.iter().zip(sums.to_array()) {
                if v != 0 {
                    c.fetch_add(v, Ordering::Relaxed);
                }
            }
        }
        self.read_ahead_pages
            .fetch_add(t.read_ahead_pages, Ordering::Relaxed);
        self.read_ahead_used
            .fetch_add(t.read_ahead_used, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RaStats {
        let sums: Vec<RowSums> = self
            .rows
            .iter()
            .map(|r| RowSums::from_array(std::array::from_fn(|i| r[i].load(Ordering::Relaxed))))
            .collect();
        let all = RowSums::from_array(std::array::from_fn(|i| {
            sums.iter().map(|s| s.to_array()[i]).sum()
        }));
        let pages = self.read_ahead_pages.load(Ordering::Relaxed);
        let used = self.read_ahead_used.load(Ordering::Relaxed).min(pages);
        let row = |p: Pattern| sums[row_of(p)].row();
        RaStats {
            initial: row(Pattern::Initial),
            subsequent: row(Pattern::Subsequent),
            marker: row(Pattern::Marker),
            around: row(Pattern::Around),
            random: row(Pattern::Random),
            all: all.row(),
            read_ahead_pages: pages,
            read_ahead_used: used,
            miss_ratio: (pages > 0).then(|| (pages - used) as f64 / pages as f64),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_counts_the_faults_that_ended() {
        let c = Counters::default();
        let one = Stats {
            pgfault: 1,
            ..Stats::default()
        };
        for expected in 1..=3 {
            let begun = c.begin();
            c.end(&one, begun);
            assert_eq!(c.snapshot().pgfault, expected);
        }
        // Every settle moved the epoch on, and no slot was left counted.
        assert_eq!(c.in_flight.epoch.load(Ordering::Relaxed), 3);
        assert_eq!(
            c.in_flight
                .slots
                .each_ref()
                .map(|s| s.load(Ordering::Relaxed)),
            [0, 0]
        );
    }

    /// A fault that outlives one snapshot's wait (it gave up) is waited for
    /// by the next one, though the epoch moved past it: that one gives up
    /// too, without moving the epoch again, and once the fault ended the
    /// next counts it.
    #[test]
    fn a_fault_an_earlier_snapshot_gave_up_on_is_waited_for_by_the_next() {
        let c = Counters::default();
        let one = Stats {
            pgfault: 1,
            ..Stats::default()
        };
        let held = c.begin();
        assert_eq!(c.snapshot().pgfault, 0, "gave up, the fault in flight");
        assert_eq!(c.in_flight.epoch.load(Ordering::Relaxed), 1);
        assert_eq!(c.snapshot().pgfault, 0);
        assert_eq!(
            c.in_flight.epoch.load(Ordering::Relaxed),
            1,
            "a snapshot went past a fault begun before it"
        );
        c.end(&one, held);
        assert_eq!(c.snapshot().pgfault, 1);
        assert_eq!(c.in_flight.epoch.load(Ordering::Relaxed), 2);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::AtomicBool;
    use loom::sync::Arc;
    use loom::thread;

    /// The fault (if) released before it was asked for, seen by a snapshot.
    fn released_then_snapshot(c: &Counters, released: &AtomicBool) {
        let seen = u64::from(released.load(Ordering::Acquire));
        let counted = c.snapshot().pgfault;
        assert!(counted >= seen, "{seen} fault let go, {counted} counted");
    }

    /// A fault on `c` that lets its thread go (`released`: the wake-up the
    /// application sees) between its begin and its end.
    fn fault_letting_go(c: &Arc<Counters>, released: &Arc<AtomicBool>) -> thread::JoinHandle<()> {
        let (c, released) = (c.clone(), released.clone());
        thread::spawn(move || {
            let begun = c.begin();
            released.store(true, Ordering::Release);
            let one = Stats {
                pgfault: 1,
                ..Stats::default()
            };
            c.end(&one, begun);
        })
    }

    /// A settle that runs out of time (at its first look at a fault) while
    /// a fault is in flight, against a snapshot taken by a thread that saw
    /// the fault let go: the snapshot waits for the fault the other settle
    /// gave up on, in whatever order the settles run.
    #[test]
    fn loom_models_stats_a_fault_a_settle_gave_up_on_is_counted_next() {
        loom::model(|| {
            let c = Arc::new(Counters::default());
            let released = Arc::new(AtomicBool::new(false));
            let fault = fault_letting_go(&c, &released);
            let hasty = {
                let c = c.clone();
                thread::spawn(move || c.in_flight.settle_until(Deadline::Now))
            };
            released_then_snapshot(&c, &released);
            hasty.join().unwrap();
            fault.join().unwrap();
        });
    }

    /// A fault that lets its thread go between its begin and its end,
    /// against two snapshots taken by threads that look at the flag first: a snapshot
    /// whose thread saw the fault let go counts it, however the fault's
    /// begin (and its begin again after an epoch move) and the two
    /// settles' epoch moves interleave.
    #[test]
    fn loom_models_stats_snapshot_counts_every_fault_let_go() {
        loom::model(|| {
            let c = Arc::new(Counters::default());
            let released = Arc::new(AtomicBool::new(false));
            let fault = fault_letting_go(&c, &released);
            let snapshot = {
                let (c, released) = (c.clone(), released.clone());
                thread::spawn(move || released_then_snapshot(&c, &released))
            };
            released_then_snapshot(&c, &released);
            snapshot.join().unwrap();
            fault.join().unwrap();
            assert_eq!(c.snapshot().pgfault, 1);
        });
    }
}
