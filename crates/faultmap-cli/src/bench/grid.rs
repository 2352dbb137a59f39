//! The framework every `faultmap bench` mode is built on: engines ×
//! workloads × cells.
//!
//! A benchmark names its *key* (what varies: a workload, a thread count, an
//! engine, perhaps a setting) and its *sample* (what one measurement
//! found). Everything else is here, written once:
//!
//! ```text
//!   keys, in measurement order ──▶ Cell<K, S> { key, samples }
//!                                      │
//!   measure(cells, reps, ...)          │ passes over the cells, repetitions
//!     one progress bar, its total      │ outermost, so the engines of one
//!     known before the first sample    │ row are measured seconds apart
//!                                      ▼
//!   Cell::spread / median_*        medians: one slow repetition must not
//!                                  move a result on a shared machine
//!        │             │              │
//!        ▼             ▼              ▼
//!   Grid (text)   Row (JSON)    plot::Figure (SVG)
//! ```
//!
//! - [`Cell`]: a key and its samples, with the medians every report shows;
//! - [`measure`]: the passes over the cells under a [`Repetitions`] policy,
//!   with the one progress bar; [`Checksums`]: every engine must read the
//!   same bytes as the first one of its workload;
//! - [`Row`] and [`write_document`]: the one JSON row type (the project's benchmark JSON:
//!   fields, plus a benchmark's extras) and the one document,
//!   `{"machine": {...}, "results": [row, ...]}`;
//! - [`Grid`], [`header`], [`goals`]: the one text table shape: engines as
//!   columns, groups of rows per thread count (or workload), a label column
//!   and a what column on the left.
//!
//! A new benchmark (a remote store, huge pages) defines its key, its sample
//! (implementing [`Sample`]), a closure measuring one key, and the rows of
//! its grid, JSON and plot; it inherits the repetition policy, the progress
//! bar, the medians and the output formats.

use std::collections::HashMap;
use std::hash::Hash;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{Map, Value};

use super::probe::Machine;
use super::reps::Repetitions;
use crate::table::Table;
use crate::units;

/// What every benchmark's sample has: the time it measured.
pub trait Sample {
    /// The measured wall time, in seconds.
    fn seconds(&self) -> f64;
}

/// One key and its samples, one per repetition, in order.
#[derive(Debug)]
pub struct Cell<K, S> {
    /// What the cell measures.
    pub key: K,
    /// One sample per repetition that produced one.
    pub samples: Vec<S>,
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

impl<K, S: Sample> Cell<K, S> {
    /// A cell with no samples yet.
    pub fn new(key: K) -> Self {
        Cell {
            key,
            samples: Vec::new(),
        }
    }

    /// The spread of the samples' times.
    pub fn spread(&self) -> Spread {
        let all: Vec<f64> = self.samples.iter().map(Sample::seconds).collect();
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
    pub fn median_u64(&self, f: impl Fn(&S) -> Option<u64>) -> Option<u64> {
        let v: Vec<u64> = self.samples.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median_u64(&v))
    }

    /// The median of a value over the samples that have it; `None` if none
    /// has.
    pub fn median_f64(&self, f: impl Fn(&S) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.samples.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median_f64(&v))
    }

    /// The median sample by `f` (the lower middle one for an even count):
    /// the counters a report shows are that one run's, not a mix of medians.
    pub fn median_sample_by(&self, f: impl Fn(&S) -> f64) -> Option<&S> {
        let mut order: Vec<&S> = self.samples.iter().collect();
        order.sort_by(|a, b| f(a).total_cmp(&f(b)));
        order.get(order.len().checked_sub(1)? / 2).copied()
    }

    /// The median sample by time.
    pub fn median_sample(&self) -> Option<&S> {
        self.median_sample_by(S::seconds)
    }
}

/// The cell of `key` among `cells`, if it has samples.
pub fn find<K: PartialEq, S>(cells: &[Cell<K, S>], key: K) -> Option<&Cell<K, S>> {
    cells
        .iter()
        .find(|c| c.key == key)
        .filter(|c| !c.samples.is_empty())
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
/// to get, known before the first sample; only the budget policy's extra
/// passes for cheap cells (`--full` without `--repetitions`) add to it,
/// and their message says so.
pub fn measure<K, S: Sample>(
    cells: &mut [Cell<K, S>],
    reps: Repetitions,
    label: impl Fn(&K) -> String,
    mut measure: impl FnMut(&K, &ProgressBar) -> Result<Option<S>>,
) -> Result<u32> {
    let started = Instant::now();
    let bar = progress_bar();
    bar.set_length(u64::from(reps.sure_passes()) * cells.len() as u64);
    let mut passes = 0;
    for pass in 0..reps.max_passes() {
        let wanted: Vec<usize> = (0..cells.len())
            .filter(|&c| {
                let samples = &cells[c].samples;
                let spent: f64 = samples.iter().map(Sample::seconds).sum();
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
            bar.set_message(format!("{what} {}: {}", pass + 1, label(&cell.key)));
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
// JSON.
// ---------------------------------------------------------------------------

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
    /// A row of `cell`: its time spread and repetitions, the rest null or
    /// empty until set.
    pub fn new<K, S: Sample>(cell: &Cell<K, S>, engine: &'static str, variant: String) -> Row {
        let s = cell.spread();
        Row {
            workload: "",
            threads: 1,
            engine,
            variant,
            order: None,
            pages: 0,
            faults: None,
            major_faults: None,
            io_count: None,
            io_bytes: None,
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

/// The machine object: the machine, the data, then the benchmark's
/// settings (`extra`, an object).
pub fn machine_json(machine: &Machine, data: &DataInfo, extra: Value) -> Value {
    let mut object = match to_value(machine) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    object.insert("data".into(), data.path.clone().into());
    object.insert("data_generated".into(), data.generated.into());
    object.insert("file_bytes".into(), data.bytes.into());
    object.insert("pages".into(), data.pages.into());
    if let Value::Object(extra) = extra {
        object.extend(extra);
    }
    Value::Object(object)
}

/// Writes the document of every benchmark, `{"machine": {...}, "results":
/// [row, ...]}`, and a newline, to `out`.
pub fn write_document(out: &mut impl Write, machine: Value, results: Vec<Row>) -> Result<()> {
    #[derive(Serialize)]
    struct Document {
        machine: Value,
        results: Vec<Row>,
    }
    serde_json::to_writer_pretty(&mut *out, &Document { machine, results })?;
    writeln!(out)?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Text.
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

/// A report's title and header: `name  text` lines, the machine and the
/// data first.
pub fn header(
    title: &str,
    machine: &Machine,
    data: &DataInfo,
    lines: Vec<(&str, String)>,
) -> String {
    let mut t = Table::new(2);
    t.row(["machine".to_string(), machine.line()]);
    t.row(["data".to_string(), data.line()]);
    for (name, text) in lines {
        t.row([name.to_string(), text]);
    }
    format!("{title}\n\n{}", t.render())
}

/// A table with engines as columns and groups of rows (per thread count,
/// say) on the left:
///
/// ```text
///                            kernel-file  kernel-memfd  order=0  order=0
///                                                        signal  handler
///   1 thread   time, seconds    0.061234      0.093121   1.0212   1.3310
///              vs kernel-file                     0.66     0.06     0.05
/// ```
#[derive(Debug)]
pub struct Grid(Table);

impl Grid {
    /// A grid with these column headings, and a second heading line (the
    /// delivery modes) if given.
    pub fn new(headings: Vec<String>, second: Option<Vec<String>>) -> Grid {
        let mut t = Table::new(2);
        for line in std::iter::once(headings).chain(second) {
            let mut row = vec![String::new(), String::new()];
            row.extend(line);
            t.row(row);
        }
        Grid(t)
    }

    /// A group of rows: the label on its first row, then each `(what,
    /// cells)`; a row with every cell blank is left out.
    pub fn group(&mut self, label: String, rows: Vec<(String, Vec<String>)>) {
        let mut label = label;
        for (what, cells) in rows {
            if cells.iter().all(String::is_empty) {
                continue;
            }
            let mut row = vec![std::mem::take(&mut label), what];
            row.extend(cells);
            self.0.row(row);
        }
    }

    /// The table as text.
    pub fn render(&self) -> String {
        self.0.render()
    }
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
pub fn goals(goals: &[Goal]) -> String {
    if goals.is_empty() {
        return String::new();
    }
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
    format!("\ngoals\n{}", t.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Sample for f64 {
        fn seconds(&self) -> f64 {
            *self
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
        let mut cell = Cell::new(());
        cell.samples = vec![0.3, 0.1, 0.2];
        let s = cell.spread();
        assert_eq!((s.seconds, s.seconds_min, s.seconds_max), (0.2, 0.1, 0.3));
        assert_eq!(s.seconds_all, [0.3, 0.1, 0.2]);
        assert_eq!(cell.median_sample(), Some(&0.2));
        assert_eq!(cell.median_u64(|&x| (x > 0.15).then_some(7)), Some(7));
        assert_eq!(cell.median_u64(|_| None), None);
        assert!(Cell::<(), f64>::new(()).median_sample().is_none());
    }

    #[test]
    fn measure_gives_every_cell_its_repetitions() {
        let mut cells: Vec<Cell<u8, f64>> = (0..3).map(Cell::new).collect();
        let passes = measure(
            &mut cells,
            Repetitions::Fixed(2),
            |k| k.to_string(),
            |&k, _| Ok((k != 1).then_some(0.0)),
        )
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
        let mut g = Grid::new(vec!["a".into(), "b".into()], None);
        g.group(
            "1 thread".into(),
            vec![
                ("blank".into(), vec![String::new(), String::new()]),
                ("x".into(), vec!["1".into(), "22".into()]),
            ],
        );
        assert_eq!(g.render(), "             a   b\n1 thread  x  1  22\n");
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
    }
}
