//! How many repetitions to run.
//!
//! A repetition is one pass over every cell (workload × threads × engine).
//! With `--repetitions N` exactly N run. Otherwise the benchmark runs
//! [`MIN_REPS`], then adds two at a time (so the median is one of the
//! samples) while the average repetition so far says two more still end
//! within [`BUDGET`], up to [`MAX_REPS`]:
//!
//! ```text
//!   elapsed after k reps: E        average: E / k
//!   add 2 more  if  k + 2 <= MAX_REPS  and  E + 2 E / k <= BUDGET
//! ```
//!
//! With the default 1 GiB file a repetition takes about 37 s here (most of
//! it faultmap at orders 0 and 1), so the default runs 5 repetitions and
//! the whole benchmark, setup included, takes about 3.5 minutes. A much
//! larger `--file` or `--size` can make even the first three exceed it.

use std::time::Duration;

use super::results::RepsFrom;

/// Repetitions always run without `--repetitions`: enough for a median.
pub const MIN_REPS: u32 = 3;

/// The most repetitions the budget may choose.
pub const MAX_REPS: u32 = 11;

/// The measuring time the budget aims to stay within.
pub const BUDGET: Duration = Duration::from_secs(200);

/// The repetition policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repetitions {
    /// Exactly this many.
    Fixed(u32),
    /// As many as fit [`BUDGET`], between [`MIN_REPS`] and [`MAX_REPS`].
    Budget,
}

impl Repetitions {
    /// The policy for `--repetitions`, if given.
    pub fn from_arg(arg: Option<u32>) -> Repetitions {
        arg.map_or(Repetitions::Budget, Repetitions::Fixed)
    }

    /// How many repetitions to plan before any has run.
    pub fn initial(self) -> u32 {
        match self {
            Repetitions::Fixed(n) => n,
            Repetitions::Budget => MIN_REPS,
        }
    }

    /// How many to add after `done` repetitions took `elapsed` (0: stop).
    pub fn more(self, done: u32, elapsed: Duration) -> u32 {
        match self {
            Repetitions::Fixed(_) => 0,
            Repetitions::Budget => {
                let per_rep = elapsed / done.max(1);
                let fits = elapsed + 2 * per_rep <= BUDGET;
                if done + 2 <= MAX_REPS && fits {
                    2
                } else {
                    0
                }
            }
        }
    }

    /// How the count was chosen, for the report.
    pub fn from(self) -> RepsFrom {
        match self {
            Repetitions::Fixed(_) => RepsFrom::Argument,
            Repetitions::Budget => RepsFrom::Budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_runs_exactly_n() {
        let r = Repetitions::from_arg(Some(1));
        assert_eq!(r.initial(), 1);
        assert_eq!(r.more(1, Duration::ZERO), 0);
    }

    #[test]
    fn budget_adds_pairs_while_they_fit() {
        let r = Repetitions::from_arg(None);
        assert_eq!(r.initial(), MIN_REPS);
        assert_eq!(r.more(3, Duration::from_secs(90)), 2); // 90 + 60 <= 200
        assert_eq!(r.more(5, Duration::from_secs(125)), 2); // 125 + 50 <= 200
        assert_eq!(r.more(7, Duration::from_secs(175)), 0); // 175 + 50 > 200
        assert_eq!(r.more(MAX_REPS, Duration::from_secs(1)), 0);
        assert_eq!(r.more(3, Duration::from_secs(130)), 0); // 130 + 87 > 200
    }
}
