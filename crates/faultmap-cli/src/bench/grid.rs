//! The framework every `faultmap bench` mode is built on: engines ×
//! workloads × cells.
//!
//! A mode ([`Mode`]) names its workloads (`Workload`, [`Named`]) and its
//! columns (`Column`: an engine and its settings, [`Column`]), and writes
//! its outputs of a [`Report`]: the text, the JSON settings and rows, the
//! figure. A cell is a [`Key`] (workload, thread count, column) and its
//! [`Sample`]s, one per repetition; a sample is one type for every mode,
//! each filling what it measures. Everything else is here, written once:
//!
//! ```text
//!   keys, in measurement order ──▶ Cell { key, samples }
//!                                      │
//!   measure(cells, reps, ...)          │ passes over the cells, repetitions
//!     one progress bar, its total      │ outermost, so the engines of one
//!     known before the first sample    │ row are measured seconds apart
//!                                      ▼
//!   Report { machine, data, workloads, threads, columns, cells, mode }
//!        │ write(args)             │                          │
//!        ▼                         ▼                          ▼
//!   header + grid(&[Line])    document: settings, Row    Mode::figure (SVG)
//! ```
//!
//! - [`Cell`]: a key and its samples, with the medians every report shows
//!   (a median, not a mean: one slow repetition must not move a result on
//!   a shared machine);
//! - [`measure`]: the passes over the cells under a [`Repetitions`] policy,
//!   with the one progress bar; [`Checksums`]: every engine must read the
//!   same bytes as the first one of its group;
//! - [`Report`]: a mode's results, written by [`Report::write`] (the text
//!   or the JSON on stdout, the figure with `--plot`). [`Report::grid`]
//!   renders a table described as data, a list of [`Line`]s (a label and
//!   what a line shows in one column), with engines as columns and a group
//!   of lines per thread count; [`Report::document`] writes the one JSON
//!   document, `{"machine": {...}, "results": [row, ...]}`, of [`Row`]s
//!   (the fields every benchmark has, filled from the cell's medians, plus
//!   a mode's extras); [`goals`]: the goal lines.
//!
//! A new benchmark (a remote store, huge pages) defines its workloads, its
//! columns, a closure measuring one key, and its [`Mode`]: its lines, extra
//! JSON fields and plot; it inherits the repetition policy, the progress
//! bar, the medians and the output formats.

use std::collections::HashMap;
use std::hash::Hash;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::Fault;
use anyhow::{bail, Result};
use faultmap::{RaStats, Stats, PAGE_SIZE};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{Map, Value};

use super::data::Data;
use super::plot::Figure;
use super::probe::{FolioSample, Machine};
use super::reps::Repetitions;
use crate::kernel::BlockReads;
use crate::table::Table;
use crate::{units, BenchArgs};

/// What one measurement found, in every mode: the time, and each count the
/// mode measures (`None` where it does not apply).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Wall time from the threads' common start to the last one's end.
    pub seconds: f64,
    /// faultmap: `pgfault`; the kernel: `getrusage` minor faults (cold,
    /// budget: minor + major).
    pub faults: Option<u64>,
    /// faultmap: `pgmajfault`; the kernel: `getrusage` major faults.
    pub major_faults: Option<u64>,
    /// Read requests: faultmap's store reads, the device's 1 MiB reads, the
    /// disk's completed reads during a cold kernel run.
    pub io_count: Option<u64>,
    /// Bytes read by those requests.
    pub io_bytes: Option<u64>,
    /// Pages the run touched, all threads together.
    pub pages_touched: Option<u64>,
    /// The wrapping sum of what the run read: the same for every engine.
    pub checksum: Option<u64>,
    /// faultmap: the counters of the run's mappings, object or pager.
    pub stats: Option<Stats>,
    /// faultmap: the readahead table (cold).
    pub ra: Option<RaStats>,
    /// warm faultmap: neighbour pages mapped by fault-around.
    pub fault_around_pages: Option<u64>,
    /// warm kernel-file: percent of the file's pages resident before the
    /// walk.
    pub resident_pct: Option<f64>,
    /// warm kernel engines: the folios of sampled pages.
    pub folios: Option<FolioSample>,
    /// cold: the block device's reads during the run (every process's).
    pub block: Option<BlockReads>,
    /// churn: regions the churn thread mapped.
    pub maps: Option<u64>,
    /// budget: touches (one byte each).
    pub touches: Option<u64>,
    /// budget, faultmap: pages evicted.
    pub evicted: Option<u64>,
    /// budget: faultmap's `refault`; the cgroup's `workingset_refault_file`.
    pub refault: Option<u64>,
    /// budget: the peak cached bytes (faultmap's pager, the cgroup);
    /// remote: faultmap's cache, raw-get's buffers, a FUSE mapping's
    /// resident pages.
    pub peak_bytes: Option<u64>,
    /// budget: the largest sampled RssFile + RssShmem.
    pub peak_rss_bytes: Option<u64>,
    /// remote: the bytes the requests asked for (their ranges), for the
    /// mean request size (`io_count` is the requests, `io_bytes` what came
    /// back).
    pub request_bytes: Option<u64>,
    /// remote, `--disk-cache`: the bytes faultmap read from its disk
    /// cache.
    pub disk_bytes: Option<u64>,
}

/// A workload, or what stands in for one: it has a name.
pub trait Named: Copy + PartialEq {
    /// The name on the command line, in the table and in JSON.
    fn name(self) -> &'static str;
}

/// A column of a mode's table: an engine with its settings.
pub trait Column: Copy + PartialEq {
    /// The table's heading.
    fn heading(self) -> String;
    /// The `engine` field of a JSON row.
    fn engine(self) -> &'static str;
    /// The `variant` field of a JSON row.
    fn variant(self) -> String;
    /// faultmap's delivery mode, for the second heading line.
    fn delivery(self) -> Option<Fault> {
        None
    }
    /// The second heading line of a column that has no delivery mode (the
    /// warm table's `uffd-probe`: `same-cpu`), blank for most.
    fn subheading(self) -> &'static str {
        ""
    }
    /// Whether the column runs once per workload, on one thread (cold's
    /// `device`): every thread count's group shows that one cell.
    fn once(self) -> bool {
        false
    }
}

/// What a cell measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key<W, C> {
    /// The workload.
    pub workload: W,
    /// Threads.
    pub threads: u16,
    /// The column.
    pub column: C,
}

impl<W: Named, C: Column> Key<W, C> {
    /// `seq × 2 on order=4 handler`, for the progress bar and errors.
    pub fn label(&self) -> String {
        let c = self.column;
        let second = c.delivery().map_or(c.subheading(), crate::delivery_name);
        let on = format!("{} {second}", c.heading());
        let (w, t) = (self.workload.name(), self.threads);
        format!("{w} × {t} on {}", on.trim_end())
    }
}

/// One key and its samples, one per repetition, in order.
#[derive(Debug)]
pub struct Cell<W, C> {
    /// What the cell measures.
    pub key: Key<W, C>,
    /// One sample per repetition that produced one.
    pub samples: Vec<Sample>,
}

/// The median, fastest and slowest of a cell's times (all 0 for none), and
/// every one in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spread {
    /// The median (the mean of the middle two for an even count).
    pub seconds: f64,
    /// The fastest.
    pub seconds_min: f64,
    /// The slowest.
    pub seconds_max: f64,
    /// Every repetition's, in order.
    pub seconds_all: Vec<f64>,
}

impl<W, C> Cell<W, C> {
    /// A cell with no samples yet.
    pub fn new(workload: W, threads: u16, column: C) -> Self {
        let key = Key {
            workload,
            threads,
            column,
        };
        Cell {
            key,
            samples: Vec::new(),
        }
    }

    /// The spread of the samples' times.
    pub fn spread(&self) -> Spread {
        let all: Vec<f64> = self.samples.iter().map(|s| s.seconds).collect();
        Spread {
            seconds: median_f64(&all),
            seconds_min: all.iter().copied().reduce(f64::min).unwrap_or(0.0),
            seconds_max: all.iter().copied().reduce(f64::max).unwrap_or(0.0),
            seconds_all: all,
        }
    }

    /// The median seconds.
    pub fn seconds(&self) -> f64 {
        self.spread().seconds
    }

    /// The median of a count over the samples that have it; `None` if none
    /// has.
    pub fn median_u64(&self, f: impl Fn(&Sample) -> Option<u64>) -> Option<u64> {
        let v: Vec<u64> = self.samples.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median_u64(&v))
    }

    /// The median of a value over the samples that have it; `None` if none
    /// has.
    pub fn median_f64(&self, f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.samples.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median_f64(&v))
    }

    /// The median sample by `f` (the lower middle one for an even count):
    /// the counters a report shows are that one run's, not a mix of medians.
    pub fn median_sample_by(&self, f: impl Fn(&Sample) -> f64) -> Option<&Sample> {
        let mut order: Vec<&Sample> = self.samples.iter().collect();
        order.sort_by(|a, b| f(a).total_cmp(&f(b)));
        order.get(order.len().checked_sub(1)? / 2).copied()
    }

    /// The median sample by time.
    pub fn median_sample(&self) -> Option<&Sample> {
        self.median_sample_by(|s| s.seconds)
    }
}

/// The cells of `workloads` × their thread counts × `columns`, in
/// measurement order: per workload, the [`Column::once`] columns on one
/// thread, then per thread count every other column.
pub fn cells<W: Copy, C: Column>(
    workloads: &[W],
    threads_of: impl Fn(W) -> Vec<u16>,
    columns: &[C],
) -> Vec<Cell<W, C>> {
    let mut cells = Vec::new();
    for &w in workloads {
        let once = columns.iter().filter(|c| c.once());
        cells.extend(once.map(|&c| Cell::new(w, 1, c)));
        for t in threads_of(w) {
            let each = columns.iter().filter(|c| !c.once());
            cells.extend(each.map(|&c| Cell::new(w, t, c)));
        }
    }
    cells
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

/// `a / b`, if `b` is not 0.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// `n` per second over `seconds` (0 for no time).
pub fn rate(n: u64, seconds: f64) -> f64 {
    ratio(n as f64, seconds).unwrap_or(0.0)
}

// ---------------------------------------------------------------------------
// Measuring.
// ---------------------------------------------------------------------------

/// Measures the cells in passes, each as often as `reps` wants, with one
/// progress bar; returns the number of passes.
///
/// `measure` measures one key (it may note things through the bar's
/// `suspend`), and returns `None` when that key has no sample this time
/// (a skipped engine). The bar's total is every pass every cell is sure
/// to get, known before the first sample; only the extra passes for
/// short and cheap cells (without `--repetitions`) add to it, and their
/// message says so.
pub fn measure<W: Named, C: Column>(
    cells: &mut [Cell<W, C>],
    reps: Repetitions,
    mut measure: impl FnMut(&Key<W, C>, &ProgressBar) -> Result<Option<Sample>>,
) -> Result<u32> {
    let started = Instant::now();
    let bar = progress_bar();
    bar.set_length(u64::from(reps.sure_passes()) * cells.len() as u64);
    let mut passes = 0;
    for pass in 0..reps.max_passes() {
        let wanted: Vec<usize> = (0..cells.len())
            .filter(|&c| {
                let samples = &cells[c].samples;
                let spent: f64 = samples.iter().map(|s| s.seconds).sum();
                let n = u32::try_from(samples.len()).unwrap_or(u32::MAX);
                reps.wants(n, Duration::from_secs_f64(spent), started.elapsed())
            })
            .collect();
        if wanted.is_empty() {
            break;
        }
        passes += 1;
        let extra = pass >= reps.sure_passes();
        if extra {
            bar.inc_length(wanted.len() as u64);
        }
        for c in wanted {
            let cell = &mut cells[c];
            let what = if extra { "extra pass" } else { "pass" };
            bar.set_message(format!("{what} {}: {}", pass + 1, cell.key.label()));
            if let Some(sample) = measure(&cell.key, &bar)? {
                cell.samples.push(sample);
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(passes)
}

/// The progress bar on stderr (indicatif hides it when stderr is not a
/// terminal).
fn progress_bar() -> ProgressBar {
    let style = ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(0).with_style(style)
}

/// The first checksum of each group of cells that must read the same bytes
/// (a workload, say): an engine that served other bytes fails the run.
#[derive(Debug)]
pub struct Checksums<G>(HashMap<G, u64>);

impl<G: Eq + Hash> Checksums<G> {
    /// No checksums yet.
    pub fn new() -> Self {
        Checksums(HashMap::new())
    }

    /// Fails if `got` differs from the group's first checksum; `who` names
    /// the cell in the error.
    pub fn check(&mut self, group: G, got: u64, who: impl FnOnce() -> String) -> Result<()> {
        let want = *self.0.entry(group).or_insert(got);
        if want != got {
            bail!(
                "{} read different data than the first engine (sum {got:#x}, expected {want:#x})",
                who()
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The report.
// ---------------------------------------------------------------------------

/// The data a benchmark ran on.
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

impl From<&Data> for DataInfo {
    fn from(data: &Data) -> Self {
        Self {
            path: data.path().display().to_string(),
            generated: data.generated(),
            bytes: data.len(),
            pages: data.len().div_ceil(PAGE_SIZE as u64),
        }
    }
}

impl DataInfo {
    /// The report's `data` line: size, pages, where it came from, path.
    pub fn line(&self) -> String {
        let origin = if self.generated {
            "generated (pseudo-random, non-zero), removed after"
        } else {
            "given with --file"
        };
        format!(
            "{} ({} pages), {origin}: {}",
            units::bytes(self.bytes),
            units::count(self.pages),
            self.path
        )
    }
}

#[cfg(test)]
impl DataInfo {
    /// A generated 1 MiB file, for the reports' tests.
    pub fn test() -> DataInfo {
        DataInfo {
            path: "x".into(),
            generated: true,
            bytes: 1 << 20,
            pages: 256,
        }
    }
}

/// A benchmark mode: what stands for its workloads and its columns, and its
/// outputs of a [`Report`], which [`Report::write`] writes.
pub trait Mode: Sized {
    /// What stands for a workload.
    type Workload: Named;
    /// A column: an engine with its settings.
    type Column: Column;
    /// The text report.
    fn render(run: &Report<Self>) -> String;
    /// The mode's settings, in the document's `machine` object.
    fn settings(run: &Report<Self>) -> Value;
    /// The JSON row of a cell with samples ([`Row::new`] and the extras).
    fn row(run: &Report<Self>, cell: &Cell<Self::Workload, Self::Column>) -> Row;
    /// The `--plot` figure.
    fn figure(run: &Report<Self>) -> Figure;
    /// A group's label in the tables: its thread count (`1 thread`).
    fn count_label(threads: u16) -> String {
        threads_label(threads)
    }
}

/// A mode's results: the cells of its workloads × thread counts × columns,
/// and the mode's own settings (`mode`).
pub struct Report<M: Mode> {
    /// The machine.
    pub machine: Machine,
    /// The data.
    pub data: DataInfo,
    /// Workloads, in the order asked.
    pub workloads: Vec<M::Workload>,
    /// Thread counts, in the order asked.
    pub threads: Vec<u16>,
    /// faultmap's delivery modes (a second heading line when more than one).
    pub deliveries: Vec<Fault>,
    /// Columns, in order.
    pub columns: Vec<M::Column>,
    /// The cells, in measurement order.
    pub cells: Vec<Cell<M::Workload, M::Column>>,
    /// Wall time of the whole benchmark, setup included.
    pub wall_seconds: f64,
    /// The mode's settings.
    pub mode: M,
}

/// The key of a mode's cells.
pub type KeyOf<M> = Key<<M as Mode>::Workload, <M as Mode>::Column>;

/// A line of a mode's table: its label, and what it shows in the column of
/// a key (blank lines are left out).
pub type Line<M> = (&'static str, fn(&Report<M>, KeyOf<M>) -> String);

impl<M: Mode> Report<M> {
    /// The report of `cells` over `data` (a local file's, `(&Data).into()`,
    /// or a remote object's), measured since `started`: the machine read
    /// now, faultmap's delivery modes those of the columns.
    pub fn new(
        data: DataInfo,
        started: Instant,
        workloads: Vec<M::Workload>,
        threads: Vec<u16>,
        columns: Vec<M::Column>,
        cells: Vec<Cell<M::Workload, M::Column>>,
        mode: M,
    ) -> Self {
        let mut deliveries = Vec::new();
        for d in columns.iter().filter_map(|c| c.delivery()) {
            if !deliveries.contains(&d) {
                deliveries.push(d);
            }
        }
        Report {
            machine: Machine::read(),
            data,
            workloads,
            threads,
            deliveries,
            columns,
            cells,
            wall_seconds: started.elapsed().as_secs_f64(),
            mode,
        }
    }

    /// The cell of one combination (a [`Column::once`] column's: its one
    /// thread's), if it has samples.
    pub fn cell(
        &self,
        workload: M::Workload,
        threads: u16,
        column: M::Column,
    ) -> Option<&Cell<M::Workload, M::Column>> {
        let threads = if column.once() { 1 } else { threads };
        let key = Key {
            workload,
            threads,
            column,
        };
        let cell = self.cells.iter().find(|c| c.key == key);
        cell.filter(|c| !c.samples.is_empty())
    }

    /// The median seconds of one combination.
    pub fn seconds(&self, workload: M::Workload, threads: u16, column: M::Column) -> Option<f64> {
        self.cell(workload, threads, column).map(Cell::seconds)
    }

    /// The median of a count of the key's cell (0 if no sample has it),
    /// blank without the cell.
    pub fn count(&self, k: KeyOf<M>, f: impl Fn(&Sample) -> Option<u64>) -> String {
        let cell = self.cell(k.workload, k.threads, k.column);
        cell.map_or_else(String::new, |c| units::count(c.median_u64(f).unwrap_or(0)))
    }

    /// The median seconds of the key's cell with `decimals` decimals, blank
    /// without the cell.
    pub fn time(&self, k: KeyOf<M>, decimals: usize) -> String {
        let s = self.seconds(k.workload, k.threads, k.column);
        s.map_or_else(String::new, |s| format!("{s:.decimals$}"))
    }

    /// The report's title and header: `name  text` lines, the machine and
    /// the data first.
    pub fn header(&self, title: &str, lines: Vec<(&str, String)>) -> String {
        let mut t = Table::new(2);
        t.row(["machine".to_string(), self.machine.line()]);
        t.row(["data".to_string(), self.data.line()]);
        for (name, text) in lines {
            t.row([name.to_string(), text]);
        }
        format!("{title}\n\n{}", t.render())
    }

    /// A table of `workload`: the columns' headings (and a second line: the
    /// delivery modes when there are several, [`Column::subheading`]s),
    /// then per thread count a group of `lines`; a line with every cell
    /// blank is left out.
    ///
    /// ```text
    ///                            kernel-file  kernel-memfd  order=0  order=0
    ///                                                        signal  handler
    ///   1 thread   time, seconds    0.061234      0.093121   1.0212   1.3310
    ///              vs kernel-file                     0.66     0.06     0.05
    /// ```
    pub fn grid(&self, workload: M::Workload, threads: &[u16], lines: &[Line<M>]) -> String {
        self.grid_of(workload, threads, lines, &self.columns)
    }

    /// [`Report::grid`] of some of the columns only.
    pub fn grid_of(
        &self,
        workload: M::Workload,
        threads: &[u16],
        lines: &[Line<M>],
        columns: &[M::Column],
    ) -> String {
        let mut t = Table::new(2);
        let headings = columns.iter().map(|c| c.heading());
        t.row(["", ""].into_iter().map(String::from).chain(headings));
        let deliveries = self.deliveries.len() > 1;
        let second: Vec<&str> = columns
            .iter()
            .map(|c| match c.delivery() {
                Some(d) if deliveries => crate::delivery_name(d),
                Some(_) => "",
                None => c.subheading(),
            })
            .collect();
        if second.iter().any(|s| !s.is_empty()) {
            t.row(["", ""].into_iter().chain(second));
        }
        for &threads in threads {
            let mut label = M::count_label(threads);
            for (what, show) in lines {
                let cells: Vec<String> = columns
                    .iter()
                    .map(|&column| {
                        let key = Key {
                            workload,
                            threads,
                            column,
                        };
                        show(self, key)
                    })
                    .collect();
                if cells.iter().all(String::is_empty) {
                    continue;
                }
                let head = [std::mem::take(&mut label), what.to_string()];
                t.row(head.into_iter().chain(cells));
            }
        }
        t.render()
    }

    /// Writes the report on stdout (its JSON document with `--json`, else
    /// its text), and with `--plot` its figure.
    pub fn write(&self, args: &BenchArgs) -> Result<()> {
        if let Some(path) = &args.plot {
            super::plot::write(&M::figure(self), path)?;
            super::note(&format!("plot written to {}", path.display()));
        }
        crate::output::print(args.json, |out| self.document(out), || M::render(self))
    }

    /// Writes the document, `{"machine": {...}, "results": [row, ...]}`,
    /// and a newline, to `out`: the machine, the data and the mode's
    /// settings, then a row per cell with samples.
    pub fn document(&self, out: &mut impl Write) -> Result<()> {
        #[derive(Serialize)]
        struct Document {
            machine: Value,
            results: Vec<Row>,
        }
        let mut machine = match to_value(&self.machine) {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        machine.insert("data".into(), self.data.path.clone().into());
        machine.insert("data_generated".into(), self.data.generated.into());
        machine.insert("file_bytes".into(), self.data.bytes.into());
        machine.insert("pages".into(), self.data.pages.into());
        if let Value::Object(settings) = M::settings(self) {
            machine.extend(settings);
        }
        let cells = self.cells.iter().filter(|c| !c.samples.is_empty());
        let document = Document {
            machine: Value::Object(machine),
            results: cells.map(|c| M::row(self, c)).collect(),
        };
        serde_json::to_writer_pretty(&mut *out, &document)?;
        writeln!(out)?;
        Ok(())
    }
}

/// One measured cell in the project's benchmark JSON format: the fields
/// every benchmark has (null where one does not apply), then the
/// benchmark's own `extra` fields. `seconds` and the counts are medians.
#[derive(Debug, Serialize)]
pub struct Row {
    pub workload: &'static str,
    pub threads: u16,
    pub engine: &'static str,
    pub variant: String,
    pub order: Option<u8>,
    pub pages: u64,
    pub faults: Option<u64>,
    pub major_faults: Option<u64>,
    pub io_count: Option<u64>,
    pub io_bytes: Option<u64>,
    pub seconds: f64,
    pub repetitions: usize,
    pub seconds_min: f64,
    pub seconds_max: f64,
    pub seconds_all: Vec<f64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Row {
    /// The row of `cell` of `report`: its key, its time spread, and the
    /// medians of its counts; `order` null until set.
    pub fn new<M: Mode>(report: &Report<M>, cell: &Cell<M::Workload, M::Column>) -> Row {
        let s = cell.spread();
        let Key {
            workload,
            threads,
            column,
        } = cell.key;
        Row {
            workload: workload.name(),
            threads,
            engine: column.engine(),
            variant: column.variant(),
            order: None,
            pages: report.data.pages,
            faults: cell.median_u64(|s| s.faults),
            major_faults: cell.median_u64(|s| s.major_faults),
            io_count: cell.median_u64(|s| s.io_count),
            io_bytes: cell.median_u64(|s| s.io_bytes),
            seconds: s.seconds,
            repetitions: cell.samples.len(),
            seconds_min: s.seconds_min,
            seconds_max: s.seconds_max,
            seconds_all: s.seconds_all,
            extra: Map::new(),
        }
    }

    /// Adds an extra field.
    pub fn with(mut self, key: &str, value: impl Serialize) -> Row {
        self.extra.insert(key.into(), to_value(value));
        self
    }
}

/// `value` as JSON (null if it cannot be: a non-finite float).
fn to_value(value: impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// `1 thread`, `2 threads`.
pub fn threads_label(threads: u16) -> String {
    if threads == 1 {
        "1 thread".into()
    } else {
        format!("{threads} threads")
    }
}

/// A ratio with two decimals, `-` if there is none.
pub fn two(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// A count with thousands separators, blank if there is none.
pub fn count(v: Option<u64>) -> String {
    v.map_or_else(String::new, units::count)
}

/// What the delivery modes of a run are.
pub fn deliveries_text(deliveries: &[Fault]) -> String {
    let text: Vec<&str> = deliveries
        .iter()
        .map(|&d| match d {
            Fault::Signal => {
                "signal delivery (the faulting thread resolves its own hit in a SIGBUS handler)"
            }
            Fault::Handler => {
                "handler delivery (a handler thread reads the userfaultfd message and \
                 wakes the faulting thread)"
            }
            Fault::Protect => {
                "the protect engine (no userfaultfd: the faulting thread's SIGSEGV handler \
                 maps its hit with mprotect)"
            }
        })
        .collect();
    text.join(" and ")
}

/// A goal: a ratio a benchmark is judged by, with its bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    /// Where it is measured (`seq, 1 thread`), if the `what` does not say.
    pub place: String,
    /// What it says.
    pub what: String,
    /// The ratio measured.
    pub value: f64,
    /// The bound.
    pub bound: f64,
    /// Whether the value must be at least (true) or at most the bound.
    pub at_least: bool,
}

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

/// The goals, one line each: where, what, value, bound, met or not.
pub fn goals<'a>(goals: impl IntoIterator<Item = &'a Goal>) -> String {
    let mut t = Table::new(2).note_column(4);
    for g in goals {
        let op = if g.at_least { ">=" } else { "<=" };
        t.row([
            g.place.clone(),
            g.what.clone(),
            format!("{:.2}", g.value),
            format!("{op} {:.2}", g.bound),
            if g.met() { "met" } else { "NOT met" }.to_string(),
        ]);
    }
    let text = t.render();
    if text.is_empty() {
        return text;
    }
    format!("\ngoals\n{text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct W;

    impl Named for W {
        fn name(self) -> &'static str {
            "w"
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct C(u8);

    impl Column for C {
        fn heading(self) -> String {
            ["a", "b", "c"][usize::from(self.0)].into()
        }
        fn engine(self) -> &'static str {
            "e"
        }
        fn variant(self) -> String {
            "v".into()
        }
        fn subheading(self) -> &'static str {
            ["", "", "z"][usize::from(self.0)]
        }
    }

    /// A mode with one workload and columns `a`, `b`, `c`.
    struct T;

    impl Mode for T {
        type Workload = W;
        type Column = C;
        fn render(_: &Report<T>) -> String {
            String::new()
        }
        fn settings(_: &Report<T>) -> Value {
            Value::Null
        }
        fn row(run: &Report<T>, cell: &Cell<W, C>) -> Row {
            Row::new(run, cell)
        }
        fn figure(_: &Report<T>) -> Figure {
            Figure {
                panels: Vec::new(),
                columns: 1,
            }
        }
    }

    fn secs(seconds: f64) -> Sample {
        Sample {
            seconds,
            faults: (seconds > 0.15).then_some(7),
            ..Sample::default()
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median_f64(&[]), 0.0);
        assert_eq!(median_f64(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_f64(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median_u64(&[]), 0);
        assert_eq!(median_u64(&[5, 1, 9]), 5);
        assert_eq!(median_u64(&[4, 1, 2, 3]), 2);
    }

    #[test]
    fn a_cell_summarises_its_samples() {
        let mut cell = Cell::new(W, 1, C(0));
        cell.samples = vec![secs(0.3), secs(0.1), secs(0.2)];
        let s = cell.spread();
        assert_eq!((s.seconds, s.seconds_min, s.seconds_max), (0.2, 0.1, 0.3));
        assert_eq!(s.seconds_all, [0.3, 0.1, 0.2]);
        assert_eq!(cell.median_sample(), Some(&secs(0.2)));
        assert_eq!(cell.median_u64(|s| s.faults), Some(7));
        assert_eq!(cell.median_u64(|_| None), None);
        assert!(Cell::new(W, 1, C(0)).median_sample().is_none());
    }

    #[test]
    fn measure_gives_every_cell_its_repetitions() {
        let mut cells: Vec<Cell<W, C>> = (0..3).map(|c| Cell::new(W, 1, C(c))).collect();
        let passes = measure(&mut cells, Repetitions::Fixed(2), |k, _| {
            Ok((k.column != C(1)).then(|| secs(0.0)))
        })
        .unwrap();
        assert_eq!(passes, 2);
        let counts: Vec<usize> = cells.iter().map(|c| c.samples.len()).collect();
        assert_eq!(counts, [2, 0, 2]);
    }

    #[test]
    fn a_different_checksum_fails() {
        let mut sums = Checksums::new();
        sums.check("seq", 7, String::new).unwrap();
        sums.check("seq", 7, String::new).unwrap();
        sums.check("rand", 8, String::new).unwrap();
        assert!(sums.check("seq", 8, || "order=4".into()).is_err());
    }

    #[test]
    fn a_grid_leaves_out_blank_rows_and_labels_the_first() {
        let report = Report {
            machine: Machine::read(),
            data: DataInfo::test(),
            workloads: vec![W],
            threads: vec![1],
            deliveries: Vec::new(),
            columns: vec![C(0), C(1)],
            cells: Vec::new(),
            wall_seconds: 0.0,
            mode: T,
        };
        let lines: [Line<T>; 2] = [
            ("blank", |_, _| String::new()),
            ("x", |_, k| ["1", "22"][usize::from(k.column.0)].into()),
        ];
        let text = report.grid(W, &[1], &lines);
        assert_eq!(text, "             a   b\n1 thread  x  1  22\n");
        // A column's subheading makes a second heading line.
        let lines: [Line<T>; 1] = [("x", |_, _| "1".into())];
        let text = report.grid_of(W, &[1], &lines, &[C(0), C(2)]);
        assert_eq!(
            text,
            "             a  c\n                z\n1 thread  x  1  1\n"
        );
        let key = Key {
            workload: W,
            threads: 2,
            column: C(2),
        };
        assert_eq!(key.label(), "w × 2 on c z");
    }

    #[test]
    fn goals_say_met_or_not() {
        let g = Goal {
            place: "seq".into(),
            what: "rate".into(),
            value: 0.5,
            bound: 0.9,
            at_least: true,
        };
        assert!(!g.met());
        assert!(goals(&[g]).contains("NOT met"));
        assert!(goals(&[]).is_empty());
    }
}
