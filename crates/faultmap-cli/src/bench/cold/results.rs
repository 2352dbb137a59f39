//! The cold measurements, and what the report makes of them.
//!
//! A [`ColdCell`] is one (workload, threads, engine) with a sample per
//! repetition; its [`ColdSummary`] holds the medians the table and the JSON
//! rows show. The readahead table shown for a cell is that of its median
//! repetition (by time): a table of real counts, not a mix of medians.
//!
//! The goals ([`Goal`]) are the ratios the issue and seed 001 set, computed
//! from the summaries.

use faultmap::{RaStats, Stats};

use super::engine::{ColdEngine, ColdSample};
use crate::access::Access;
use crate::bench::probe::Machine;
use crate::bench::results::{median_f64, median_u64, time_spread, DataInfo};
use crate::kernel::{BlockDevice, Caches};

/// One (workload, threads, engine) and its repetitions.
#[derive(Debug)]
pub struct ColdCell {
    /// The workload.
    pub workload: Access,
    /// Threads (`device`: 1).
    pub threads: u16,
    /// The engine.
    pub engine: ColdEngine,
    /// Pages a run touches (`device`: all of the file's).
    pub pages_touched: u64,
    /// One sample per repetition, in order.
    pub samples: Vec<ColdSample>,
}

/// What a cell's repetitions add up to; `None` where a count does not
/// apply (or no repetition had it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ColdSummary {
    /// Median seconds.
    pub seconds: f64,
    /// Fastest repetition.
    pub seconds_min: f64,
    /// Slowest repetition.
    pub seconds_max: f64,
    /// Every repetition's seconds, in order.
    pub seconds_all: Vec<f64>,
    /// Median faults.
    pub faults: Option<u64>,
    /// Median major faults.
    pub major_faults: Option<u64>,
    /// Median read requests.
    pub io_count: Option<u64>,
    /// Median bytes read.
    pub io_bytes: Option<u64>,
    /// Median mean request size, KiB.
    pub io_size_kib: Option<f64>,
    /// Median readahead miss ratio (faultmap).
    pub miss_ratio: Option<f64>,
    /// Median block-device reads.
    pub block_reads: Option<u64>,
    /// Median block-device bytes read.
    pub block_bytes: Option<u64>,
}

impl ColdCell {
    /// A cell with no samples yet.
    pub fn new(workload: Access, threads: u16, engine: ColdEngine, pages_touched: u64) -> ColdCell {
        ColdCell {
            workload,
            threads,
            engine,
            pages_touched,
            samples: Vec::new(),
        }
    }

    /// The medians of the samples so far.
    pub fn summary(&self) -> ColdSummary {
        let s = &self.samples;
        let seconds_all: Vec<f64> = s.iter().map(|x| x.seconds).collect();
        let med = |f: fn(&ColdSample) -> Option<u64>| {
            let v: Vec<u64> = s.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| median_u64(&v))
        };
        let med_f = |f: &dyn Fn(&ColdSample) -> Option<f64>| {
            let v: Vec<f64> = s.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| median_f64(&v))
        };
        let (seconds, seconds_min, seconds_max) = time_spread(&seconds_all);
        ColdSummary {
            seconds,
            seconds_min,
            seconds_max,
            faults: med(|x| x.faults),
            major_faults: med(|x| x.major_faults),
            io_count: med(|x| x.io_count),
            io_bytes: med(|x| x.io_bytes),
            io_size_kib: med_f(&|x| io_size_kib(x.io_bytes?, x.io_count?)),
            miss_ratio: med_f(&|x| x.ra.and_then(|r| r.miss_ratio)),
            block_reads: med(|x| x.block.map(|b| b.reads)),
            block_bytes: med(|x| x.block.map(|b| b.bytes)),
            seconds_all,
        }
    }

    /// The sample of the median repetition by time.
    pub fn median_sample(&self) -> Option<&ColdSample> {
        let mut order: Vec<&ColdSample> = self.samples.iter().collect();
        order.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        order.get(order.len().checked_sub(1)? / 2).copied()
    }

    /// The median repetition's counters and readahead table (faultmap).
    pub fn median_stats(&self) -> Option<(Stats, RaStats)> {
        let s = self.median_sample()?;
        Some((s.stats?, s.ra?))
    }
}

/// Mean request size in KiB, if there was a request.
pub fn io_size_kib(bytes: u64, count: u64) -> Option<f64> {
    (count > 0).then(|| bytes as f64 / count as f64 / 1024.0)
}

/// Everything the outputs need.
#[derive(Debug)]
pub struct ColdRun {
    /// The machine.
    pub machine: Machine,
    /// The data.
    pub data: DataInfo,
    /// Workloads, in the order asked.
    pub workloads: Vec<Access>,
    /// seq's thread counts.
    pub threads: Vec<u16>,
    /// Columns.
    pub engines: Vec<ColdEngine>,
    /// Repetitions.
    pub repetitions: u32,
    /// What is dropped before each kernel and faultmap run, if anything.
    pub dropped: Option<Caches>,
    /// The data's block device.
    pub device: Option<BlockDevice>,
    /// faultmap's fault-around order.
    pub order: u8,
    /// faultmap's readahead window in pages, and whether `--ra-pages` set it.
    pub ra_pages: (u64, bool),
    /// How faultmap's file store reads (the mode in force).
    pub file_io: faultmap::FileIo,
    /// faultmap handler threads.
    pub handler_threads: u16,
    /// faultmap I/O threads.
    pub io_threads: usize,
    /// Pages each rand/clustered run touches.
    pub sample_pages: u64,
    /// The cells, in measurement order.
    pub cells: Vec<ColdCell>,
    /// Wall time of the whole benchmark.
    pub wall_seconds: f64,
}

impl ColdRun {
    /// The cell of one combination.
    pub fn cell(&self, workload: Access, threads: u16, engine: ColdEngine) -> Option<&ColdCell> {
        let threads = if engine == ColdEngine::Device {
            1
        } else {
            threads
        };
        self.cells
            .iter()
            .find(|c| c.workload == workload && c.threads == threads && c.engine == engine)
            .filter(|c| !c.samples.is_empty())
    }

    /// The thread counts a workload runs with.
    pub fn threads_of(&self, workload: Access) -> Vec<u16> {
        threads_of(workload, &self.threads)
    }

    /// The goals, for every workload and thread count that has them.
    pub fn goals(&self) -> Vec<Goal> {
        let mut goals = Vec::new();
        for &w in &self.workloads {
            for t in self.threads_of(w) {
                goals.extend(GOALS.iter().filter_map(|g| g.measure(self, w, t)));
            }
        }
        goals
    }
}

/// The thread counts of `workload`: seq's list, one for the others.
pub fn threads_of(workload: Access, seq_threads: &[u16]) -> Vec<u16> {
    match workload {
        Access::Seq => seq_threads.to_vec(),
        Access::Rand | Access::Clustered => vec![1],
    }
}

/// A ratio the benchmark is judged by, with its bound.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Goal {
    /// The workload it is measured on.
    pub workload: Access,
    /// Its thread count.
    pub threads: u16,
    /// What it says.
    pub what: &'static str,
    /// The ratio measured.
    pub value: f64,
    /// The bound.
    pub bound: f64,
    /// Whether the value must be at least (true) or at most the bound.
    pub at_least: bool,
}

/// How a goal's ratio is computed: `(numerator, denominator)` of a cell.
type Ratio = fn(&ColdRun, Access, u16) -> Option<(f64, f64)>;

/// The goals: workload, description, bound, direction, ratio.
struct GoalSpec {
    workload: Access,
    what: &'static str,
    bound: f64,
    at_least: bool,
    ratio: Ratio,
}

/// The goals of seed 001's comparison on this machine.
const GOALS: [GoalSpec; 4] = [
    GoalSpec {
        workload: Access::Seq,
        what: "readahead's rate / the device's (O_DIRECT, same run)",
        bound: 0.9,
        at_least: true,
        ratio: |r, w, t| seconds_ratio(r, w, t, ColdEngine::Device, ColdEngine::Readahead),
    },
    GoalSpec {
        workload: Access::Seq,
        what: "readahead's rate / kernel mmap's",
        bound: 1.2,
        at_least: true,
        ratio: |r, w, t| seconds_ratio(r, w, t, ColdEngine::Kernel, ColdEngine::Readahead),
    },
    GoalSpec {
        workload: Access::Clustered,
        what: "major faults, readahead / around (cut by a third)",
        bound: 2.0 / 3.0,
        at_least: false,
        ratio: |r, w, t| count_ratio(r, w, t, major, ColdEngine::Readahead, ColdEngine::Around),
    },
    GoalSpec {
        workload: Access::Rand,
        what: "bytes read, readahead / kernel mmap",
        bound: 1.0,
        at_least: false,
        ratio: |r, w, t| count_ratio(r, w, t, bytes, ColdEngine::Readahead, ColdEngine::Kernel),
    },
];

impl Goal {
    /// Whether the value meets the bound.
    pub fn met(&self) -> bool {
        if self.at_least {
            self.value >= self.bound
        } else {
            self.value <= self.bound
        }
    }
}

impl GoalSpec {
    fn measure(&self, run: &ColdRun, workload: Access, threads: u16) -> Option<Goal> {
        if workload != self.workload {
            return None;
        }
        let (num, den) = (self.ratio)(run, workload, threads)?;
        (den > 0.0).then(|| Goal {
            workload,
            threads,
            what: self.what,
            value: num / den,
            bound: self.bound,
            at_least: self.at_least,
        })
    }
}

/// `a`'s median seconds over `b`'s: above 1, `b` was faster.
pub fn seconds_ratio(
    run: &ColdRun,
    w: Access,
    threads: u16,
    a: ColdEngine,
    b: ColdEngine,
) -> Option<(f64, f64)> {
    let s = |e| run.cell(w, threads, e).map(|c| c.summary().seconds);
    Some((s(a)?, s(b)?))
}

/// A count of `a` over the same count of `b`.
pub fn count_ratio(
    run: &ColdRun,
    w: Access,
    threads: u16,
    count: fn(&ColdSummary) -> Option<u64>,
    a: ColdEngine,
    b: ColdEngine,
) -> Option<(f64, f64)> {
    let c = |e| run.cell(w, threads, e).and_then(|c| count(&c.summary()));
    Some((c(a)? as f64, c(b)? as f64))
}

/// The major-fault count of a summary.
pub fn major(s: &ColdSummary) -> Option<u64> {
    s.major_faults
}

/// The bytes-read count of a summary.
pub fn bytes(s: &ColdSummary) -> Option<u64> {
    s.io_bytes
}

/// A run of `cells` over a 1 MiB file, every column, for tests.
#[cfg(test)]
pub(super) fn test_run(cells: Vec<ColdCell>) -> ColdRun {
    ColdRun {
        machine: Machine::read(),
        data: DataInfo {
            path: "x".into(),
            generated: true,
            bytes: 1 << 20,
            pages: 256,
        },
        workloads: vec![Access::Seq, Access::Rand, Access::Clustered],
        threads: vec![1],
        engines: ColdEngine::columns(true),
        repetitions: 1,
        dropped: Some(Caches::All),
        device: None,
        order: 4,
        ra_pages: (32, false),
        file_io: faultmap::FileIo::default(),
        handler_threads: 1,
        io_threads: 4,
        sample_pages: 16,
        cells,
        wall_seconds: 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seconds: f64, major: u64, bytes: u64) -> ColdSample {
        ColdSample {
            seconds,
            major_faults: Some(major),
            io_count: Some(2),
            io_bytes: Some(bytes),
            ..ColdSample::default()
        }
    }

    #[test]
    fn summarises_and_picks_the_median_repetition() {
        let mut c = ColdCell::new(Access::Rand, 1, ColdEngine::Kernel, 1);
        c.samples = vec![
            sample(0.3, 30, 4096),
            sample(0.1, 10, 2048),
            sample(0.2, 20, 8192),
        ];
        let s = c.summary();
        assert_eq!(s.seconds, 0.2);
        assert_eq!(s.major_faults, Some(20));
        assert_eq!(s.io_size_kib, Some(2.0));
        assert_eq!(s.faults, None);
        assert_eq!(s.miss_ratio, None);
        assert_eq!(c.median_sample().unwrap().seconds, 0.2);
        assert!(ColdCell::new(Access::Seq, 1, ColdEngine::Device, 1)
            .median_sample()
            .is_none());
        assert_eq!(io_size_kib(1, 0), None);
    }

    fn cell(w: Access, e: ColdEngine, s: ColdSample) -> ColdCell {
        let mut c = ColdCell::new(w, 1, e, 1);
        c.samples.push(s);
        c
    }

    #[test]
    fn goals_come_from_the_right_cells() {
        let run = test_run(vec![
            cell(Access::Seq, ColdEngine::Device, sample(0.9, 0, 0)),
            cell(Access::Seq, ColdEngine::Kernel, sample(2.0, 0, 0)),
            cell(Access::Seq, ColdEngine::Readahead, sample(1.0, 0, 0)),
            cell(Access::Clustered, ColdEngine::Around, sample(1.0, 90, 0)),
            cell(Access::Clustered, ColdEngine::Readahead, sample(1.0, 30, 0)),
            cell(Access::Rand, ColdEngine::Kernel, sample(1.0, 1, 100)),
            cell(Access::Rand, ColdEngine::Readahead, sample(1.0, 1, 150)),
        ]);
        let goals = run.goals();
        assert_eq!(goals.len(), 4);
        let v: Vec<(f64, bool)> = goals.iter().map(|g| (g.value, g.met())).collect();
        // In workload order: seq, rand, clustered.
        assert_eq!(
            v,
            [(0.9, true), (2.0, true), (1.5, false), (1.0 / 3.0, true)]
        );
        // A missing column leaves its goal out.
        let run = test_run(vec![cell(
            Access::Seq,
            ColdEngine::Readahead,
            sample(1.0, 0, 0),
        )]);
        assert!(run.goals().is_empty());
    }

    #[test]
    fn only_seq_has_several_thread_counts() {
        assert_eq!(threads_of(Access::Seq, &[1, 2]), [1, 2]);
        assert_eq!(threads_of(Access::Clustered, &[1, 2]), [1]);
    }
}
