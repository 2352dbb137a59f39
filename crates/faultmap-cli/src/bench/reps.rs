//! How many repetitions each cell gets.
//!
//! A *pass* measures every cell that still wants a sample, in the same
//! order each time, so the engines of one row are measured seconds apart
//! and the machine's noise hits them alike. With `--repetitions N`, every
//! cell gets exactly N samples.
//!
//! Plain `faultmap bench` gives every cell 3 samples, and a *short* cell
//! (its samples under [`SHORT_CELL`] on average: the sparse walks, a few
//! milliseconds each) up to [`SHORT_REPS`]: at that length a
//! millisecond of the machine's noise is tens of percent, and 21 walks
//! cost less than one of a slow cell. (Each sample also pays its untimed
//! set-up: the 20 ms pause, a fresh mapping, and for `kernel-file` a
//! re-read of the data file, about 0.3 s for 1 GiB here: the sparse
//! kernel-file cells cost about 7 s each. A small `--size` makes more
//! cells short.)
//!
//! With `--full`, every cell gets [`MIN_REPS`], short cells up to
//! [`SHORT_REPS`] as above, and then a cell gets another pass while both of
//! these hold:
//!
//! ```text
//!   its samples so far + one more average  <=  CELL_BUDGET   (cheap cells repeat)
//!   the measuring time so far              <   BUDGET        (the run ends in time)
//! ```
//!
//! up to [`MAX_REPS`]. The ratios that matter most (faultmap at the large
//! orders against the kernel) come from cells of 0.05 to 0.5 s, which so
//! get 5 to 11 samples; the slow cells (orders 0 and 1, seconds each) keep
//! 3. The default 1 GiB run measures for about 3 minutes here. With both
//! delivery modes (the default), the handler columns at orders 0 and 1 take
//! half of that, the first three passes use the whole budget, and every
//! cell has 3 samples (2 min 48 s in all here); `--delivery signal` leaves
//! the budget to the cheap cells again.

use std::time::Duration;

/// Samples every cell gets without `--repetitions`: enough for a median.
pub const MIN_REPS: u32 = 3;

/// The most samples a cell gets from the budget.
pub const MAX_REPS: u32 = 11;

/// The most measuring time one cell may take, over all its samples, to be
/// given more than [`MIN_REPS`].
pub const CELL_BUDGET: Duration = Duration::from_secs(2);

/// The measuring time after which no pass beyond [`MIN_REPS`] starts
/// (but for short cells).
pub const BUDGET: Duration = Duration::from_secs(150);

/// A cell whose samples take less than this on average is short.
pub const SHORT_CELL: Duration = Duration::from_millis(20);

/// The samples a short cell gets without `--repetitions` (at most 0.42 s
/// of timed walks per cell, besides each sample's set-up).
pub const SHORT_REPS: u32 = 21;

/// How the number of repetitions was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepsFrom {
    /// `--repetitions`.
    Argument,
    /// The default run's count, more for short cells.
    Short,
    /// To fit the time budget (`--full`).
    Budget,
}

/// The repetition policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repetitions {
    /// Exactly this many samples per cell (`--repetitions`).
    Fixed(u32),
    /// This many samples per cell, and up to [`SHORT_REPS`] for short
    /// cells.
    AtLeast(u32),
    /// Per cell, as the budgets allow (see the module documentation).
    Budget,
}

impl Repetitions {
    /// The most passes there can be.
    pub fn max_passes(self) -> u32 {
        match self {
            Repetitions::Fixed(n) => n,
            Repetitions::AtLeast(n) => n.max(SHORT_REPS),
            Repetitions::Budget => MAX_REPS.max(SHORT_REPS),
        }
    }

    /// The passes every cell is sure to get: the progress bar's total
    /// before the first sample.
    pub fn sure_passes(self) -> u32 {
        match self {
            Repetitions::Fixed(n) | Repetitions::AtLeast(n) => n,
            Repetitions::Budget => MIN_REPS,
        }
    }

    /// Whether a cell that has `samples` samples, which took `spent` in
    /// all, gets one more, `elapsed` into the measurements.
    pub fn wants(self, samples: u32, spent: Duration, elapsed: Duration) -> bool {
        let next = spent / samples.max(1);
        let short = samples < SHORT_REPS && next < SHORT_CELL;
        match self {
            Repetitions::Fixed(n) => samples < n,
            Repetitions::AtLeast(n) => samples < n || short,
            Repetitions::Budget if samples < MIN_REPS || short => true,
            Repetitions::Budget => {
                samples < MAX_REPS && spent + next <= CELL_BUDGET && elapsed < BUDGET
            }
        }
    }

    /// How the count was chosen, for the report.
    pub fn from(self) -> RepsFrom {
        match self {
            Repetitions::Fixed(_) => RepsFrom::Argument,
            Repetitions::AtLeast(_) => RepsFrom::Short,
            Repetitions::Budget => RepsFrom::Budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(f64) -> Duration = Duration::from_secs_f64;

    #[test]
    fn fixed_gives_exactly_n() {
        let r = Repetitions::Fixed(2);
        assert!(r.wants(1, S(100.0), S(1000.0)));
        assert!(!r.wants(2, S(0.0), S(0.0)));
        assert_eq!(r.max_passes(), 2);
    }

    #[test]
    fn budget_repeats_cheap_cells_within_both_budgets() {
        let r = Repetitions::Budget;
        // Everyone gets the minimum, however slow.
        assert!(r.wants(2, S(20.0), S(1000.0)));
        // A 0.1 s cell repeats up to the maximum...
        assert!(r.wants(3, S(0.3), S(10.0)));
        assert!(r.wants(10, S(1.0), S(10.0)));
        assert!(!r.wants(MAX_REPS, S(1.1), S(10.0)));
        // ... a 0.5 s cell until its 2 s are spent...
        assert!(r.wants(3, S(1.5), S(10.0)));
        assert!(!r.wants(4, S(2.0), S(10.0)));
        // ... a 1 s cell never, and no one once the run is over budget...
        assert!(!r.wants(3, S(3.0), S(10.0)));
        assert!(!r.wants(3, S(0.3), BUDGET));
        // ... but short cells, up to their own count.
        assert!(r.wants(3, S(0.015), BUDGET));
        assert!(r.wants(SHORT_REPS - 1, S(0.1), BUDGET));
        assert!(!r.wants(SHORT_REPS, S(0.1), BUDGET));
    }

    #[test]
    fn the_default_run_repeats_short_cells() {
        let r = Repetitions::AtLeast(3);
        assert!(r.wants(2, S(20.0), S(1000.0)));
        assert!(!r.wants(3, S(0.3), S(0.0)), "a 0.1 s cell has its 3");
        assert!(r.wants(3, S(0.015), S(1000.0)), "a 5 ms cell wants more");
        assert!(!r.wants(SHORT_REPS, S(0.1), S(0.0)));
        assert_eq!(r.max_passes(), SHORT_REPS);
        assert_eq!(r.sure_passes(), 3);
        // --repetitions is exact, short or not.
        assert!(!Repetitions::Fixed(3).wants(3, S(0.001), S(0.0)));
    }
}
