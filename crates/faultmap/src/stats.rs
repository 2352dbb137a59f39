//! Counters, named as the kernel names them.
//!
//! Each mapping has its own [`Counters`], and the pager has one set for all
//! of its mappings; the fault path adds to both (relaxed atomics: counters
//! order nothing). A [`Stats`] is a plain snapshot of one set.
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

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::sync::{AtomicU64, Ordering};

/// The longest a snapshot waits for faults in flight to add their counts.
const SETTLE_LIMIT: Duration = Duration::from_millis(20);

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters (see the module documentation for each).
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
            /// Faults being handled that will add to these counters.
            in_flight: AtomicU64,
        }

        /// A snapshot of a set of counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            /// The counters, once the faults being handled have added to
            /// them, waiting at most [`SETTLE_LIMIT`]. Best effort: a thread
            /// whose access faulted and returned normally sees its fault
            /// counted, but a thread woken by another fault's mapping of
            /// its page may return before its own message is read.
            pub(crate) fn snapshot(&self) -> Stats {
                let deadline = Instant::now() + SETTLE_LIMIT;
                while self.in_flight.load(Ordering::Acquire) != 0 && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                Stats { $($name: self.$name.load(Ordering::Relaxed),)* }
            }

            /// A fault that will add to these counters has begun. Called
            /// before the fault wakes its thread.
            pub(crate) fn begin(&self) {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
            }

            /// Adds every non-zero counter of a fault's tally and ends the
            /// fault begun with [`Counters::begin`].
            pub(crate) fn end(&self, tally: &Stats) {
                $(if tally.$name != 0 {
                    self.$name.fetch_add(tally.$name, Ordering::Relaxed);
                })*
                // Release: a snapshot that sees the fault ended sees its tally.
                self.in_flight.fetch_sub(1, Ordering::Release);
            }
        }

        impl Stats {
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
}
