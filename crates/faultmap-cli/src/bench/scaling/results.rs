//! The parts and churn measurements, and what the report makes of them.
//!
//! A [`Cell`] is one (thread count, column) with a [`Sample`] per
//! repetition; its [`Summary`] holds the medians the table and the JSON rows
//! show. Rates are the medians of the samples' rates. The counters shown
//! for a faultmap cell (`spf_success` and the others) are those of its
//! median sample by faults/s: real counts of one run, not a mix of medians.
//!
//! The goals ([`Goal`]) are the ratios the seeds set, computed from the
//! summaries: parts scales by at least 1.7 from 1 to 2 threads (seed 003's
//! lockless cache scales linearly); churn's speculative lookup serves at
//! least twice the faults/s of the classic one (seed 004's ebizzy gain on
//! 16 CPUs was 4x).

use std::time::Duration;

use faultmap::{Delivery, Stats};

use super::{Column, Kind, Setting};
use crate::bench::engine::WarmUp;
use crate::bench::probe::Machine;
use crate::bench::results::{median_f64, median_u64, time_spread, DataInfo};

/// What one sample found.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Wall time from the threads' common start to the last one's end.
    pub seconds: f64,
    /// faultmap: the pager's `pgfault`; kernel: `getrusage` minor faults.
    pub faults: u64,
    /// faultmap: `pgmajfault`; kernel: `getrusage` major faults.
    pub major_faults: u64,
    /// Pages the faulting threads touched, all together.
    pub pages_touched: u64,
    /// churn: regions the churn thread mapped (and unmapped, but for the
    /// last few).
    pub maps: Option<u64>,
    /// faultmap: the sample's pager's counters.
    pub stats: Option<Stats>,
    /// parts: the wrapping sum of the bytes read.
    pub checksum: u64,
}

/// `n` per second over `seconds` (0 for no time).
pub fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

impl Sample {
    /// Faults per second.
    pub fn faults_per_second(&self) -> f64 {
        rate(self.faults, self.seconds)
    }
}

/// One (thread count, column) and its repetitions.
#[derive(Debug)]
pub struct Cell {
    /// Faulting threads.
    pub threads: u16,
    /// The column.
    pub column: Column,
    /// One sample per repetition, in order.
    pub samples: Vec<Sample>,
}

/// What a cell's repetitions add up to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Median seconds.
    pub seconds: f64,
    /// Fastest repetition.
    pub seconds_min: f64,
    /// Slowest repetition.
    pub seconds_max: f64,
    /// Every repetition's seconds, in order.
    pub seconds_all: Vec<f64>,
    /// Median faults.
    pub faults: u64,
    /// Median major faults.
    pub major_faults: u64,
    /// Median pages touched.
    pub pages_touched: u64,
    /// Median faults per second.
    pub faults_per_second: f64,
    /// Median pages touched per second.
    pub pages_per_second: f64,
    /// churn: median regions mapped.
    pub maps: Option<u64>,
    /// churn: median regions mapped per second.
    pub maps_per_second: Option<f64>,
    /// faultmap: the counters of the median sample by faults/s.
    pub stats: Option<Stats>,
}

impl Cell {
    /// A cell with no samples yet.
    pub fn new(threads: u16, column: Column) -> Cell {
        Cell {
            threads,
            column,
            samples: Vec::new(),
        }
    }

    /// The medians of the samples so far (all zero with none).
    pub fn summary(&self) -> Summary {
        let s = &self.samples;
        let seconds_all: Vec<f64> = s.iter().map(|x| x.seconds).collect();
        let med = |f: fn(&Sample) -> u64| median_u64(&s.iter().map(f).collect::<Vec<_>>());
        let med_f = |f: &dyn Fn(&Sample) -> f64| median_f64(&s.iter().map(f).collect::<Vec<_>>());
        let maps: Vec<u64> = s.iter().filter_map(|x| x.maps).collect();
        let maps_per_second: Vec<f64> = s
            .iter()
            .filter_map(|x| Some(rate(x.maps?, x.seconds)))
            .collect();
        let (seconds, seconds_min, seconds_max) = time_spread(&seconds_all);
        Summary {
            seconds,
            seconds_min,
            seconds_max,
            faults: med(|x| x.faults),
            major_faults: med(|x| x.major_faults),
            pages_touched: med(|x| x.pages_touched),
            faults_per_second: med_f(&Sample::faults_per_second),
            pages_per_second: med_f(&|x| rate(x.pages_touched, x.seconds)),
            maps: (!maps.is_empty()).then(|| median_u64(&maps)),
            maps_per_second: (!maps_per_second.is_empty()).then(|| median_f64(&maps_per_second)),
            stats: self.median_sample().and_then(|x| x.stats),
            seconds_all,
        }
    }

    /// The median sample by faults per second.
    fn median_sample(&self) -> Option<&Sample> {
        let mut order: Vec<&Sample> = self.samples.iter().collect();
        order.sort_by(|a, b| a.faults_per_second().total_cmp(&b.faults_per_second()));
        order.get(order.len().checked_sub(1)? / 2).copied()
    }
}

/// Everything the outputs need.
#[derive(Debug)]
pub struct ScaleRun {
    /// The machine.
    pub machine: Machine,
    /// The data.
    pub data: DataInfo,
    /// Which benchmark.
    pub kind: Kind,
    /// Faulting-thread counts, in the order asked.
    pub threads: Vec<u16>,
    /// faultmap's delivery modes, in the order asked.
    pub deliveries: Vec<Delivery>,
    /// Columns, in order.
    pub columns: Vec<Column>,
    /// Repetitions per cell.
    pub repetitions: u32,
    /// faultmap handler threads.
    pub handler_threads: u16,
    /// churn: how long the threads faulted in each sample.
    pub duration: Option<Duration>,
    /// How faultmap's cache was filled.
    pub warm_up: WarmUp,
    /// The cells, thread count major.
    pub cells: Vec<Cell>,
    /// Wall time of the whole benchmark, setup included.
    pub wall_seconds: f64,
}

impl ScaleRun {
    /// The cell of one combination, if it has samples.
    pub fn cell(&self, threads: u16, column: Column) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.threads == threads && c.column == column)
            .filter(|c| !c.samples.is_empty())
    }

    /// A summary's value for a combination.
    pub fn value(&self, threads: u16, column: Column, f: fn(&Summary) -> f64) -> Option<f64> {
        self.cell(threads, column).map(|c| f(&c.summary()))
    }

    /// `column`'s faults/s at `threads` over its faults/s at 1 thread.
    pub fn scaling(&self, threads: u16, column: Column) -> Option<f64> {
        let fps = |t| self.value(t, column, |s| s.faults_per_second);
        ratio(fps(threads)?, fps(1)?)
    }

    /// `column`'s faults/s over those of the column of the same delivery
    /// with setting `other`, at `threads`.
    pub fn versus_setting(&self, threads: u16, column: Column, other: Setting) -> Option<f64> {
        let delivery = column.delivery()?;
        let other = Column::Faultmap {
            setting: other,
            delivery,
        };
        let fps = |c| self.value(threads, c, |s| s.faults_per_second);
        ratio(fps(column)?, fps(other)?)
    }

    /// The goals, for every delivery mode (and, for churn, thread count)
    /// that has the cells.
    pub fn goals(&self) -> Vec<Goal> {
        let mut goals = Vec::new();
        for &delivery in &self.deliveries {
            let column = |setting| Column::Faultmap { setting, delivery };
            match self.kind {
                Kind::Parts => {
                    let lock_free = column(Setting::LockFree);
                    if let Some(value) = self.scaling(2, lock_free) {
                        goals.push(Goal {
                            what: "lock-free faults/s, 2 threads over 1 thread".into(),
                            threads: 2,
                            delivery,
                            value,
                            bound: PARTS_SCALING,
                        });
                    }
                }
                Kind::Churn => {
                    for &t in &self.threads {
                        let spf = column(Setting::Speculative);
                        if let Some(value) = self.versus_setting(t, spf, Setting::Classic) {
                            goals.push(Goal {
                                what: format!(
                                    "faults/s with {t} thread(s), speculative over classic"
                                ),
                                threads: t,
                                delivery,
                                value,
                                bound: CHURN_GAIN,
                            });
                        }
                    }
                }
            }
        }
        goals
    }
}

/// `a / b`, if `b` is not 0.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// parts: the least faults/s gain from 1 to 2 threads.
pub const PARTS_SCALING: f64 = 1.7;

/// churn: the least faults/s gain of speculative over classic lookup.
pub const CHURN_GAIN: f64 = 2.0;

/// A ratio the benchmark is judged by: at least `bound`.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    /// What it says.
    pub what: String,
    /// Its thread count.
    pub threads: u16,
    /// The delivery mode of its columns.
    pub delivery: Delivery,
    /// The ratio measured.
    pub value: f64,
    /// The least it should be.
    pub bound: f64,
}

impl Goal {
    /// Whether the value meets the bound.
    pub fn met(&self) -> bool {
        self.value >= self.bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::DataInfo;

    fn sample(seconds: f64, faults: u64, success: u64) -> Sample {
        Sample {
            seconds,
            faults,
            pages_touched: faults,
            stats: Some(Stats {
                spf_success: success,
                ..Stats::default()
            }),
            ..Sample::default()
        }
    }

    #[test]
    fn summarises_rates_and_the_median_samples_counters() {
        let mut c = Cell::new(1, Column::KernelMemfd);
        c.samples = vec![
            sample(1.0, 300, 3),
            sample(1.0, 100, 1),
            sample(2.0, 400, 2),
        ];
        let s = c.summary();
        assert_eq!(s.faults, 300);
        assert_eq!(s.faults_per_second, 200.0);
        assert_eq!(s.pages_per_second, 200.0);
        assert_eq!(s.stats.unwrap().spf_success, 2);
        assert_eq!(s.maps, None);
        assert_eq!(rate(1, 0.0), 0.0);
        assert!(Cell::new(1, Column::KernelMemfd).summary().stats.is_none());
    }

    fn run(kind: Kind, cells: Vec<Cell>) -> ScaleRun {
        ScaleRun {
            machine: Machine::read(),
            data: DataInfo {
                path: "x".into(),
                generated: true,
                bytes: 1 << 20,
                pages: 256,
            },
            kind,
            threads: vec![1, 2],
            deliveries: vec![Delivery::Signal],
            columns: Column::all(kind, &[Delivery::Signal]),
            repetitions: 1,
            handler_threads: 1,
            duration: None,
            warm_up: WarmUp {
                seconds: 0.0,
                stats: Stats::default(),
                cached_pct: 100.0,
            },
            cells,
            wall_seconds: 1.0,
        }
    }

    fn cell(threads: u16, setting: Setting, seconds: f64, faults: u64) -> Cell {
        let column = Column::Faultmap {
            setting,
            delivery: Delivery::Signal,
        };
        let mut c = Cell::new(threads, column);
        c.samples.push(sample(seconds, faults, 0));
        c
    }

    #[test]
    fn goals_come_from_the_right_cells() {
        let parts = run(
            Kind::Parts,
            vec![
                cell(1, Setting::LockFree, 1.0, 100),
                cell(2, Setting::LockFree, 0.5, 100),
                cell(1, Setting::GlobalMutex, 1.0, 100),
                cell(2, Setting::GlobalMutex, 1.0, 100),
            ],
        );
        let goals = parts.goals();
        assert_eq!(goals.len(), 1);
        assert_eq!((goals[0].value, goals[0].met()), (2.0, true));
        let lock_free = Column::Faultmap {
            setting: Setting::LockFree,
            delivery: Delivery::Signal,
        };
        assert_eq!(
            parts.versus_setting(2, lock_free, Setting::GlobalMutex),
            Some(2.0)
        );
        let churn = run(
            Kind::Churn,
            vec![
                cell(1, Setting::Speculative, 1.0, 300),
                cell(1, Setting::Classic, 1.0, 200),
            ],
        );
        let goals = churn.goals();
        assert_eq!(goals.len(), 1);
        assert_eq!((goals[0].value, goals[0].met()), (1.5, false));
        assert!(run(Kind::Parts, Vec::new()).goals().is_empty());
    }
}
