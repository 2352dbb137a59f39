//! The measurements, and what the report makes of them.
//!
//! A [`Cell`] is one (workload, threads, engine) combination with one
//! [`Sample`] per repetition; its [`Summary`] is what the table and the JSON
//! rows show: the median time (the min and max too, in JSON) and the median
//! fault counts. Medians, because the machine is shared and noisy: one slow
//! repetition must not move the result.
//!
//! A [`Run`] is everything the two outputs need: the machine, the data, the
//! settings, and the cells in measurement order.

use super::engine::{Engine, Sample, WarmUp};
use super::probe::{FolioSample, Machine};
use super::workload::Workload;

/// One (workload, threads, engine) combination and its repetitions.
#[derive(Debug)]
pub struct Cell {
    /// The workload.
    pub workload: Workload,
    /// Threads, each with its own view.
    pub threads: u16,
    /// The engine.
    pub engine: Engine,
    /// One sample per repetition, in order.
    pub samples: Vec<Sample>,
}

/// What a cell's repetitions add up to.
#[derive(Clone, Debug, PartialEq)]
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
    /// Median store reads (faultmap).
    pub io_count: Option<u64>,
    /// Median bytes read from the store (faultmap).
    pub io_bytes: Option<u64>,
    /// Median neighbour pages mapped by fault-around (faultmap).
    pub fault_around_pages: Option<u64>,
    /// Lowest residency before a repetition (kernel-file).
    pub resident_pct: Option<f64>,
    /// All repetitions' folio samples together (kernel engines).
    pub folios: Option<FolioSample>,
}

impl Cell {
    /// A cell with no samples yet.
    pub fn new(workload: Workload, threads: u16, engine: Engine) -> Cell {
        Cell {
            workload,
            threads,
            engine,
            samples: Vec::new(),
        }
    }

    /// The summary of the samples so far (all zero with none).
    pub fn summary(&self) -> Summary {
        let s = &self.samples;
        let seconds_all: Vec<f64> = s.iter().map(|x| x.seconds).collect();
        let opt = |f: fn(&Sample) -> Option<u64>| {
            let v: Option<Vec<u64>> = s.iter().map(f).collect();
            v.filter(|v| !v.is_empty()).map(|v| median_u64(&v))
        };
        let (seconds, seconds_min, seconds_max) = time_spread(&seconds_all);
        Summary {
            seconds,
            seconds_min,
            seconds_max,
            faults: median_u64(&s.iter().map(|x| x.faults).collect::<Vec<_>>()),
            major_faults: median_u64(&s.iter().map(|x| x.major_faults).collect::<Vec<_>>()),
            io_count: opt(|x| x.io_count),
            io_bytes: opt(|x| x.io_bytes),
            fault_around_pages: opt(|x| x.fault_around_pages),
            resident_pct: s.iter().filter_map(|x| x.resident_pct).reduce(f64::min),
            folios: s.iter().filter_map(|x| x.folios).reduce(FolioSample::merge),
            seconds_all,
        }
    }
}

/// The median, the fastest and the slowest of the repetitions' seconds (all
/// 0 for none).
pub fn time_spread(seconds: &[f64]) -> (f64, f64, f64) {
    (
        median_f64(seconds),
        seconds.iter().copied().reduce(f64::min).unwrap_or(0.0),
        seconds.iter().copied().reduce(f64::max).unwrap_or(0.0),
    )
}

/// The median; the mean of the two middle values for an even count; 0 for
/// none.
pub fn median_f64(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median; the lower of the two middle values for an even count (a
/// count stays a count); 0 for none.
pub fn median_u64(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n => v[(n - 1) / 2],
    }
}

/// How the number of repetitions was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepsFrom {
    /// `--repetitions`.
    Argument,
    /// To fit the time budget.
    Budget,
}

/// The data the benchmark ran on.
#[derive(Clone, Debug)]
pub struct DataInfo {
    /// The file's path.
    pub path: String,
    /// Whether it was generated for this run (and is removed).
    pub generated: bool,
    /// Its length.
    pub bytes: u64,
    /// Its length in pages.
    pub pages: u64,
}

impl DataInfo {
    /// The report's `data` line of the cold and scaling benchmarks: size,
    /// pages, where it came from, path.
    pub fn line(&self) -> String {
        let origin = if self.generated {
            "generated, removed after"
        } else {
            "given with --file"
        };
        format!(
            "{} ({} pages), {origin}: {}",
            crate::units::bytes(self.bytes),
            crate::units::count(self.pages),
            self.path
        )
    }
}

/// Everything the outputs need.
#[derive(Debug)]
pub struct Run {
    /// The machine.
    pub machine: Machine,
    /// The data.
    pub data: DataInfo,
    /// Workloads, in the order asked.
    pub workloads: Vec<Workload>,
    /// Thread counts, in the order asked.
    pub threads: Vec<u16>,
    /// faultmap's delivery modes, in the order asked.
    pub deliveries: Vec<faultmap::Delivery>,
    /// Engines, in column order.
    pub engines: Vec<Engine>,
    /// Repetitions run.
    pub repetitions: u32,
    /// How that number was chosen.
    pub repetitions_from: RepsFrom,
    /// faultmap handler threads.
    pub handler_threads: u16,
    /// How faultmap's cache was filled.
    pub warm_up: WarmUp,
    /// The cells, workload-major, then threads, then engines.
    pub cells: Vec<Cell>,
    /// Wall time of the whole benchmark, setup included.
    pub wall_seconds: f64,
}

impl Run {
    /// The cell of one combination.
    pub fn cell(&self, workload: Workload, threads: u16, engine: Engine) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.workload == workload && c.threads == threads && c.engine == engine)
    }

    /// All folio samples of one engine's cells together.
    pub fn folios(&self, engine: Engine) -> Option<FolioSample> {
        self.cells
            .iter()
            .filter(|c| c.engine == engine)
            .filter_map(|c| c.summary().folios)
            .reduce(FolioSample::merge)
    }

    /// The lowest residency of kernel-file's page cache before a walk.
    pub fn min_resident_pct(&self) -> Option<f64> {
        self.cells
            .iter()
            .filter_map(|c| c.summary().resident_pct)
            .reduce(f64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median_f64(&[]), 0.0);
        assert_eq!(median_f64(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_f64(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median_u64(&[]), 0);
        assert_eq!(median_u64(&[5, 1, 9]), 5);
        assert_eq!(median_u64(&[4, 1, 2, 3]), 2);
    }

    fn sample(seconds: f64, faults: u64) -> Sample {
        Sample {
            seconds,
            faults,
            major_faults: 0,
            io_count: Some(faults),
            io_bytes: None,
            fault_around_pages: None,
            resident_pct: Some(seconds * 100.0),
            folios: None,
            checksum: 0,
        }
    }

    #[test]
    fn summarises_repetitions() {
        let mut cell = Cell::new(Workload::Seq, 1, Engine::KernelFile);
        cell.samples = vec![sample(0.3, 30), sample(0.1, 10), sample(0.2, 20)];
        let s = cell.summary();
        assert_eq!((s.seconds, s.seconds_min, s.seconds_max), (0.2, 0.1, 0.3));
        assert_eq!(s.faults, 20);
        assert_eq!(s.io_count, Some(20));
        assert_eq!(s.io_bytes, None);
        assert_eq!(s.resident_pct, Some(10.0));
        assert_eq!(s.seconds_all, [0.3, 0.1, 0.2]);
    }
}
