//! The fault-around benchmark's results: the table, the headline, the JSON
//! rows and the plot, all from one [`Run`] of [`grid::Cell`]s keyed by
//! (workload, threads, engine).
//!
//! ```text
//!   seq: sequential access: every 8-byte word in order
//!                             kernel-file  kernel-memfd   order=0   order=0  ...
//!                                                          signal   handler  ...
//!   1 thread   minor-faults         4,096        16,384   262,144   262,144  ...
//!              time, seconds     0.061234      0.093121  1.021234  ...
//!              vs kernel-file                      0.66      0.06  ...
//!              vs kernel-memfd       1.52                    0.09  ...
//! ```
//!
//! Every number is the median over the repetitions. A `vs X` line divides
//! X's time by each column's: above 1, that column was faster than X. The
//! second heading line (the delivery mode) is there when the run measured
//! more than one. After the tables, the headline: per workload, delivery
//! mode and thread count, faultmap's fastest order, and its time over
//! kernel-file's and kernel-memfd's.
//!
//! JSON rows (the project's benchmark JSON: fields; `order`, `io_count`, `io_bytes` null for
//! the kernel engines, `folios` and `resident_pct` for faultmap) add
//! `delivery` (faultmap: `signal` or `handler`; the variant names it when
//! it is not the library's default: `order=4,delivery=handler`),
//! `seconds_min`, `seconds_max`, `seconds_all`, `fault_around_pages`
//! (faultmap's `pgfault_around`), `folios` and `folio_sample` (kernel
//! engines: `large`, `4k`, `mixed` or `unknown`, and the sampled counts) and
//! `resident_pct` (kernel-file: the lowest residency before a repetition).

use std::io::Write;

use anyhow::Result;
use faultmap::Delivery;
use serde_json::json;

use super::engine::{Engine, Sample, WarmUp};
use super::grid::{self, threads_label, DataInfo, Grid, Row};
use super::plot::{Figure, Panel, Series};
use super::probe::{FolioSample, Machine};
use super::reps::{RepsFrom, BUDGET, CELL_BUDGET, MIN_REPS};
use super::workload::Workload;
use crate::units;

/// What a cell measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The workload.
    pub workload: Workload,
    /// Threads, each with its own view of the whole data.
    pub threads: u16,
    /// The engine.
    pub engine: Engine,
}

/// A cell of the fault-around benchmark.
pub type Cell = grid::Cell<Key, Sample>;

impl grid::Sample for Sample {
    fn seconds(&self) -> f64 {
        self.seconds
    }
}

/// Everything the outputs need.
#[derive(Debug)]
pub struct Run {
    /// The machine.
    pub machine: Machine,
    /// The data.
    pub data: DataInfo,
    /// The whole table (`--full`) or the default subset.
    pub full: bool,
    /// Workloads, in the order asked.
    pub workloads: Vec<Workload>,
    /// Thread counts, in the order asked.
    pub threads: Vec<u16>,
    /// faultmap's delivery modes, in the order asked.
    pub deliveries: Vec<Delivery>,
    /// Engines, in column order.
    pub engines: Vec<Engine>,
    /// Repetitions run (passes).
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
    /// The cell of one combination, if it has samples.
    fn cell(&self, workload: Workload, threads: u16, engine: Engine) -> Option<&Cell> {
        let key = Key {
            workload,
            threads,
            engine,
        };
        grid::find(&self.cells, key)
    }

    /// The median seconds of one combination.
    fn seconds(&self, workload: Workload, threads: u16, engine: Engine) -> Option<f64> {
        self.cell(workload, threads, engine).map(Cell::seconds)
    }

    /// All folio samples of one engine's cells together.
    fn folios(&self, engine: Engine) -> Option<FolioSample> {
        let cells = self.cells.iter().filter(|c| c.key.engine == engine);
        cells
            .flat_map(|c| c.samples.iter().filter_map(|s| s.folios))
            .reduce(FolioSample::merge)
    }

    /// The lowest residency of kernel-file's page cache before a walk.
    fn min_resident_pct(&self) -> Option<f64> {
        let samples = self.cells.iter().flat_map(|c| &c.samples);
        samples.filter_map(|s| s.resident_pct).reduce(f64::min)
    }

    /// faultmap's fastest order for a workload, delivery and thread count:
    /// the engine and its median seconds.
    fn best(&self, w: Workload, threads: u16, delivery: Delivery) -> Option<(Engine, f64)> {
        let faultmap = self
            .engines
            .iter()
            .filter(|e| e.delivery() == Some(delivery));
        faultmap
            .filter_map(|&e| Some((e, self.seconds(w, threads, e)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }
}

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

/// The whole report: header, one table per workload, headline, legend.
pub fn render(run: &Run) -> String {
    let title = if run.full {
        "faultmap bench --full: the fault-around benchmark, faultmap against kernel mmap"
    } else {
        "faultmap bench: the fault-around benchmark (a representative subset; --full for the \
         whole table), faultmap against kernel mmap"
    };
    let mut out = grid::header(title, &run.machine, &run.data, header_lines(run));
    for &w in &run.workloads {
        out.push('\n');
        out.push_str(&block(run, w));
    }
    out.push_str(&headline(run));
    out.push_str(LEGEND);
    out
}

fn header_lines(run: &Run) -> Vec<(&'static str, String)> {
    let how = match run.repetitions_from {
        RepsFrom::Argument => format!("{} per cell", run.repetitions),
        RepsFrom::Budget => format!(
            "{MIN_REPS} per cell, up to {} for cells that fit {} s in all",
            run.repetitions,
            CELL_BUDGET.as_secs()
        ),
    };
    let resident = run
        .min_resident_pct()
        .map_or("not measured".to_string(), |p| {
            format!("at least {p:.1}% resident")
        });
    let w = &run.warm_up;
    vec![
        (
            "repetitions",
            format!(
                "{how}; each cell is the median of its samples; total wall time {:.1} s",
                run.wall_seconds
            ),
        ),
        (
            "kernel-file",
            format!(
                "page cache re-read before every repetition, then {resident}; folios: {}",
                folio_text(run.folios(Engine::KernelFile))
            ),
        ),
        (
            "kernel-memfd",
            format!(
                "a memfd copy of the data; folios: {}",
                folio_text(run.folios(Engine::KernelMemfd))
            ),
        ),
        (
            "faultmap",
            format!(
                "{}; {} handler thread(s); cache filled once before the runs in {:.2} s \
                 ({} store reads, {}), {:.1}% cached",
                deliveries_text(&run.deliveries),
                run.handler_threads,
                w.seconds,
                units::count(w.stats.io_count),
                units::bytes(w.stats.io_bytes),
                w.cached_pct
            ),
        ),
    ]
}

/// What the delivery modes of a run are.
pub fn deliveries_text(deliveries: &[Delivery]) -> String {
    let text: Vec<&str> = deliveries
        .iter()
        .map(|&d| match d {
            Delivery::Signal => {
                "signal delivery (the faulting thread resolves its own hit in a SIGBUS handler)"
            }
            Delivery::Handler => {
                "handler delivery (a handler thread reads the userfaultfd message and \
                 wakes the faulting thread)"
            }
        })
        .collect();
    text.join(" and ")
}

/// The second heading line of a grid: the delivery mode of each column,
/// when there is more than one mode.
pub fn delivery_heading(
    deliveries: &[Delivery],
    columns: impl Iterator<Item = Option<Delivery>>,
) -> Option<Vec<String>> {
    (deliveries.len() > 1).then(|| {
        columns
            .map(|d| d.map_or("", crate::delivery_name).to_string())
            .collect()
    })
}

fn folio_text(sample: Option<FolioSample>) -> String {
    match sample {
        Some(s) if s.sampled > 0 => format!(
            "{} ({} of {} sampled pages in large folios)",
            s.kind().name(),
            units::count(u64::from(s.large)),
            units::count(u64::from(s.sampled))
        ),
        _ => "unknown (page frames unreadable: /proc/self/pagemap and /proc/kpageflags need root)"
            .into(),
    }
}

/// One workload's table.
fn block(run: &Run, w: Workload) -> String {
    let headings = run.engines.iter().map(|e| e.column()).collect();
    let second = delivery_heading(&run.deliveries, run.engines.iter().map(|e| e.delivery()));
    let mut grid = Grid::new(headings, second);
    let any_major = run
        .cells
        .iter()
        .filter(|c| c.key.workload == w)
        .any(|c| c.median_u64(|s| Some(s.major_faults)).unwrap_or(0) > 0);
    for &threads in &run.threads {
        let per_engine = |f: &dyn Fn(&Cell) -> String| -> Vec<String> {
            let cell = |&e| run.cell(w, threads, e);
            run.engines
                .iter()
                .map(|e| cell(e).map_or_else(String::new, f))
                .collect()
        };
        let count = |f: fn(&Sample) -> u64| {
            move |c: &Cell| units::count(c.median_u64(|s| Some(f(s))).unwrap_or(0))
        };
        let mut rows = vec![("minor-faults".to_string(), per_engine(&count(|s| s.faults)))];
        if any_major {
            rows.push((
                "major-faults".into(),
                per_engine(&count(|s| s.major_faults)),
            ));
        }
        rows.push((
            "time, seconds".into(),
            per_engine(&|c| format!("{:.6}", c.seconds())),
        ));
        for reference in [Engine::KernelFile, Engine::KernelMemfd] {
            let r = run.seconds(w, threads, reference);
            let cells = run.engines.iter().map(|&e| {
                if e == reference {
                    return String::new();
                }
                let s = run.seconds(w, threads, e);
                grid::two(r.zip(s).and_then(|(r, s)| grid::ratio(r, s)))
            });
            rows.push((format!("vs {}", reference.name()), cells.collect()));
        }
        grid.group(threads_label(threads), rows);
    }
    format!("{}: {}\n{}", w.name(), w.describe(), grid.render())
}

/// Per workload, delivery and thread count: faultmap's fastest order, and
/// its time over the kernel columns'.
fn headline(run: &Run) -> String {
    let mut t = crate::table::Table::new(4);
    for &w in &run.workloads {
        for &d in &run.deliveries {
            for &threads in &run.threads {
                let Some((best, seconds)) = run.best(w, threads, d) else {
                    continue;
                };
                let versus = |k: Engine| {
                    let r = run
                        .seconds(w, threads, k)
                        .and_then(|k| grid::ratio(seconds, k));
                    format!("{} × {}", grid::two(r), k.name())
                };
                t.row([
                    w.name().to_string(),
                    crate::delivery_name(d).to_string(),
                    threads_label(threads),
                    best.column(),
                    format!("{seconds:.6} s"),
                    versus(Engine::KernelFile),
                    versus(Engine::KernelMemfd),
                ]);
            }
        }
    }
    format!(
        "\nheadline: faultmap's fastest order, its time over kernel mmap's (below 1: faultmap \
         was faster)\n{}",
        t.render()
    )
}

const LEGEND: &str = "
minor-faults: getrusage minor faults of the process during the walk (kernel columns), faults \
handled by faultmap (pgfault, order=N columns); all threads together, each thread walking its \
own mapping of the whole file.
signal / handler: faultmap's fault delivery (a SIGBUS handler in the faulting thread, or a \
handler thread reading userfaultfd messages).
vs X: X's median time divided by the column's; above 1, the column was faster than X.
";

// ---------------------------------------------------------------------------
// JSON.
// ---------------------------------------------------------------------------

/// Writes the document, and a newline, to `out`.
pub fn write_json(run: &Run, out: &mut impl Write) -> Result<()> {
    let kind = |e| run.folios(e).unwrap_or_default().kind().name();
    let w = &run.warm_up;
    let machine = json!({
        "full": run.full,
        "repetitions": run.repetitions,
        "repetitions_from": match run.repetitions_from {
            RepsFrom::Argument => "argument",
            RepsFrom::Budget => "budget",
        },
        "repetitions_budget_seconds":
            (run.repetitions_from == RepsFrom::Budget).then(|| BUDGET.as_secs()),
        "handler_threads": run.handler_threads,
        "deliveries": run.deliveries.iter().map(|&d| crate::delivery_name(d)).collect::<Vec<_>>(),
        "kernel_file_folios": kind(Engine::KernelFile),
        "kernel_file_resident_pct_min": run.min_resident_pct(),
        "kernel_memfd_folios": kind(Engine::KernelMemfd),
        "faultmap_warm_seconds": w.seconds,
        "faultmap_warm_io_count": w.stats.io_count,
        "faultmap_warm_io_bytes": w.stats.io_bytes,
        "faultmap_cached_pct": w.cached_pct,
        "wall_seconds": run.wall_seconds,
    });
    let rows = run.cells.iter().map(|c| row(run, c)).collect();
    grid::write_document(
        out,
        grid::machine_json(&run.machine, &run.data, machine),
        rows,
    )
}

fn row(run: &Run, cell: &Cell) -> Row {
    let Key {
        workload,
        threads,
        engine,
    } = cell.key;
    let folios = cell
        .samples
        .iter()
        .filter_map(|s| s.folios)
        .reduce(FolioSample::merge);
    let mut row = Row::new(cell, engine.name(), engine.variant());
    row.workload = workload.name();
    row.threads = threads;
    row.order = engine.order();
    row.pages = run.data.pages;
    row.faults = Some(cell.median_u64(|s| Some(s.faults)).unwrap_or(0));
    row.major_faults = Some(cell.median_u64(|s| Some(s.major_faults)).unwrap_or(0));
    row.io_count = cell.median_u64(|s| s.io_count);
    row.io_bytes = cell.median_u64(|s| s.io_bytes);
    row.with("delivery", engine.delivery().map(crate::delivery_name))
        .with(
            "fault_around_pages",
            cell.median_u64(|s| s.fault_around_pages),
        )
        .with("folios", folios.map(|f| f.kind().name()))
        .with("folio_sample", folios)
        .with(
            "resident_pct",
            cell.samples
                .iter()
                .filter_map(|s| s.resident_pct)
                .reduce(f64::min),
        )
}

// ---------------------------------------------------------------------------
// The plot.
// ---------------------------------------------------------------------------

/// Per workload, time and faults against the fault-around order: a line
/// per delivery mode and thread count, the kernel columns as horizontal
/// reference lines.
pub fn figure(run: &Run) -> Figure {
    let mut panels = Vec::new();
    for &w in &run.workloads {
        for (what, value) in [
            (
                "time, seconds",
                (|c: &Cell| c.seconds()) as fn(&Cell) -> f64,
            ),
            ("minor faults", |c: &Cell| {
                c.median_u64(|s| Some(s.faults)).unwrap_or(0) as f64
            }),
        ] {
            let mut series = Vec::new();
            for &threads in &run.threads {
                let cell = |e| run.cell(w, threads, e);
                for &d in &run.deliveries {
                    let points = run
                        .engines
                        .iter()
                        .filter(|e| e.delivery() == Some(d))
                        .filter_map(|&e| Some((f64::from(e.order()?), value(cell(e)?))))
                        .collect();
                    let label = format!(
                        "faultmap {}, {}",
                        crate::delivery_name(d),
                        threads_label(threads)
                    );
                    series.push(Series::line(label, points));
                }
                for k in [Engine::KernelFile, Engine::KernelMemfd] {
                    if let Some(c) = cell(k) {
                        let label = format!("{}, {}", k.name(), threads_label(threads));
                        series.push(Series::reference(label, value(c)));
                    }
                }
            }
            panels.push(Panel {
                title: format!("{}: {what}", w.name()),
                x_label: "fault-around order".into(),
                y_label: what.into(),
                log_y: true,
                series,
                ..Panel::default()
            });
        }
    }
    Figure { panels, columns: 2 }
}
