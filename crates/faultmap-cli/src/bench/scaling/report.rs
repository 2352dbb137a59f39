//! The parts and churn results: a header, one table (faults/s by thread
//! count), the goals, notes on what the counters showed, the JSON rows and
//! the plot, all from one [`ScaleRun`] of [`grid::Cell`]s keyed by (thread
//! count, column).
//!
//! ```text
//!   parts: each thread touches one byte per page of its own 1/T of the data
//!                                        kernel-memfd   lock-free  global-mutex
//!   1 thread   faults                           4,096      65,536        65,536
//!              time, seconds                 0.025000    0.580000      0.600000
//!              faults/s                       163,840     112,993       109,226
//!              vs kernel-memfd, time                         0.04          0.04
//!              vs global-mutex, faults/s                     1.03
//!   2 threads  ...
//!              vs 1 thread, faults/s             1.80        1.93          1.10
//! ```
//!
//! churn's table has, per thread count: faults, pages touched, time,
//! faults/s, pages/s, the ratio to kernel-memfd's pages/s, speculative over
//! classic, the churn thread's maps/s, and the pager's `spf_success`,
//! `spf_abort`, `spf_fallback` and `forwarded`. A row that applies to no
//! column of a thread count is left out. Every number is the median over
//! the repetitions (rates are the medians of the samples' rates); the
//! counters are those of the median sample by faults/s.
//!
//! The goals: parts scales by at least 1.7 from 1 to 2 threads (a lockless
//! cache scales linearly); churn's speculative lookup serves at least twice
//! the faults/s of the classic one (speculative faults gained 4x on ebizzy
//! on 16 CPUs).
//!
//! JSON rows: `workload` `parts` or `churn`; `engine` `kernel-memfd` or
//! `faultmap`; `variant` `default` (the kernel), `cache=lock-free` or
//! `cache=global-mutex` (parts), `lookup=speculative` or `lookup=classic`
//! (churn), followed by `,delivery=handler` for handler delivery. Extra
//! fields: `delivery`, `cache` and `region_lookup` (faultmap),
//! `pages_touched`, `faults_per_second`, `pages_per_second`, for churn
//! `maps` and `maps_per_second`, and for faultmap `spf_success`,
//! `spf_abort`, `spf_fallback`, `forwarded` and the whole `stats` of the
//! median sample. The machine object adds the settings and `goals`.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use faultmap::{Delivery, Stats, PAGE_SIZE};
use serde_json::json;

use super::churn::{CHURN_LIVE, CHURN_PAGES};
use super::{Column, Kind, Setting};
use crate::bench::engine::WarmUp;
use crate::bench::grid::{self, rate, ratio, threads_label, DataInfo, Goal, Grid, Row};
use crate::bench::plot::{Figure, Panel, Series};
use crate::bench::probe::Machine;
use crate::bench::warm::{deliveries_text, delivery_heading};
use crate::units;

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

impl grid::Sample for Sample {
    fn seconds(&self) -> f64 {
        self.seconds
    }
}

impl Sample {
    /// Faults per second.
    pub fn faults_per_second(&self) -> f64 {
        rate(self.faults, self.seconds)
    }
}

/// What a cell measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// Faulting threads.
    pub threads: u16,
    /// The column.
    pub column: Column,
}

/// A cell of the parts or churn benchmark.
pub type Cell = grid::Cell<Key, Sample>;

/// The medians of a cell.
fn med(c: &Cell, f: fn(&Sample) -> u64) -> u64 {
    c.median_u64(|s| Some(f(s))).unwrap_or(0)
}

/// The median of a rate of a cell.
fn med_rate(c: &Cell, f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    c.median_f64(f)
}

/// The counters of the median sample by faults/s.
fn median_stats(c: &Cell) -> Option<Stats> {
    c.median_sample_by(Sample::faults_per_second)?.stats
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
        grid::find(&self.cells, Key { threads, column })
    }

    /// A cell's value for a combination.
    pub fn value(&self, threads: u16, column: Column, f: impl Fn(&Cell) -> f64) -> Option<f64> {
        self.cell(threads, column).map(f)
    }

    /// A combination's median faults/s.
    fn fps(&self, threads: u16, column: Column) -> Option<f64> {
        self.cell(threads, column)
            .and_then(|c| med_rate(c, |s| Some(s.faults_per_second())))
    }

    /// `column`'s faults/s at `threads` over its faults/s at 1 thread.
    pub fn scaling(&self, threads: u16, column: Column) -> Option<f64> {
        ratio(self.fps(threads, column)?, self.fps(1, column)?)
    }

    /// `column`'s faults/s over those of the column of the same delivery
    /// with setting `other`, at `threads`.
    pub fn versus_setting(&self, threads: u16, column: Column, other: Setting) -> Option<f64> {
        let delivery = column.delivery()?;
        let other = Column::Faultmap {
            setting: other,
            delivery,
        };
        ratio(self.fps(threads, column)?, self.fps(threads, other)?)
    }

    /// The goals, for every delivery mode (and, for churn, thread count)
    /// that has the cells: (threads, delivery, goal).
    pub fn goals(&self) -> Vec<(u16, Delivery, Goal)> {
        let mut goals = Vec::new();
        for &delivery in &self.deliveries {
            let column = |setting| Column::Faultmap { setting, delivery };
            let goal = |what: String, value, bound| Goal {
                place: String::new(),
                what: format!("{what}, {} delivery", crate::delivery_name(delivery)),
                value,
                bound,
                at_least: true,
            };
            match self.kind {
                Kind::Parts => {
                    if let Some(v) = self.scaling(2, column(Setting::LockFree)) {
                        let what = "lock-free faults/s, 2 threads over 1 thread".to_string();
                        goals.push((2, delivery, goal(what, v, PARTS_SCALING)));
                    }
                }
                Kind::Churn => {
                    for &t in &self.threads {
                        let spf = column(Setting::Speculative);
                        if let Some(v) = self.versus_setting(t, spf, Setting::Classic) {
                            let what =
                                format!("faults/s with {t} thread(s), speculative over classic");
                            goals.push((t, delivery, goal(what, v, CHURN_GAIN)));
                        }
                    }
                }
            }
        }
        goals
    }
}

/// parts: the least faults/s gain from 1 to 2 threads.
pub const PARTS_SCALING: f64 = 1.7;

/// churn: the least faults/s gain of speculative over classic lookup.
pub const CHURN_GAIN: f64 = 2.0;

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

/// The whole report.
pub fn render(run: &ScaleRun) -> String {
    let title = match run.kind {
        Kind::Parts => {
            "faultmap bench --parts: the lockless page cache benchmark, threads faulting on \
             their own parts of one cached object"
        }
        Kind::Churn => {
            "faultmap bench --churn: the speculative fault benchmark, threads faulting \
             while another maps and unmaps (like ebizzy)"
        }
    };
    let mut out = grid::header(title, &run.machine, &run.data, header_lines(run));
    out.push('\n');
    out.push_str(&table(run));
    let goals: Vec<Goal> = run.goals().into_iter().map(|g| g.2).collect();
    out.push_str(&grid::goals(&goals));
    out.push_str(&notes(run));
    out.push_str(legend(run.kind));
    out
}

fn header_lines(run: &ScaleRun) -> Vec<(&'static str, String)> {
    let w = &run.warm_up;
    let faultmap = format!(
        "fault-around order 0 (one page lookup and one UFFDIO_CONTINUE per fault); \
         {} handler thread(s); a new pager per sample over one object, whose cache was \
         filled once before the runs in {:.2} s ({} store reads, {}), {:.1}% cached",
        run.handler_threads,
        w.seconds,
        units::count(w.stats.io_count),
        units::bytes(w.stats.io_bytes),
        w.cached_pct
    );
    let (setting, kernel) = match run.kind {
        Kind::Parts => (
            "lock-free: page lookups pin the page's state word with a CAS, no lock; \
             global-mutex: every page lookup under one process-wide mutex \
             (Config::bench_global_cache_lock), the cache before lockless lookups",
            "the same threads on kernel mmaps of a memfd holding the same data (4 KiB \
             shmem pages; the kernel maps its fault-around window, 16 pages, per fault)",
        ),
        Kind::Churn => (
            "speculative: a fault finds its region without a lock, validated by the \
             region's sequence count; classic: under the region table's lock, which map \
             and unmap hold throughout (like mmap_lock before SPF)",
            "the same on kernel mmaps of a memfd holding the same data (16 pages mapped \
             per fault), the churn thread calling mmap and munmap (mmap_lock for writing)",
        ),
    };
    let why = match run.kind {
        Kind::Parts if run.deliveries.contains(&Delivery::Handler) => {
            "; with handler delivery one handler thread takes every fault, so those columns \
             measure that thread, not the cache"
        }
        Kind::Parts => {
            ", so each thread resolves its own faults (with handler delivery one handler \
             thread would take every fault, and the benchmark would measure that thread, not \
             the cache)"
        }
        Kind::Churn if run.deliveries.contains(&Delivery::Signal) => {
            "; with signal delivery a classic fault's SIGBUS handler takes the table's lock \
             itself, so each delivery's two columns compare the lookups on one path"
        }
        Kind::Churn => "",
    };
    vec![
        ("faultmap", faultmap),
        ("", setting.to_string()),
        (
            "delivery",
            format!("{}{why}", deliveries_text(&run.deliveries)),
        ),
        ("kernel-memfd", kernel.to_string()),
        (
            "repetitions",
            format!(
                "{} per cell; each cell is the median of its samples; total wall time {:.1} s",
                run.repetitions, run.wall_seconds
            ),
        ),
    ]
}

/// The table: per thread count, the rows of the benchmark.
fn table(run: &ScaleRun) -> String {
    let headings = run
        .columns
        .iter()
        .map(|c| c.heading().to_string())
        .collect();
    let second = delivery_heading(&run.deliveries, run.columns.iter().map(|c| c.delivery()));
    let mut grid = Grid::new(headings, second);
    let rows = match run.kind {
        Kind::Parts => PARTS_ROWS.as_slice(),
        Kind::Churn => CHURN_ROWS.as_slice(),
    };
    for &threads in &run.threads {
        let rows = rows.iter().map(|(what, f)| {
            let cells = run.columns.iter().map(|&c| f(run, threads, c)).collect();
            (what.to_string(), cells)
        });
        grid.group(threads_label(threads), rows.collect());
    }
    let what = match run.kind {
        Kind::Parts => {
            "parts: each thread touches one byte per page of its own contiguous 1/T of the \
             data, through its own mapping"
        }
        Kind::Churn => "churn: each thread touches one byte per page of its own 1/T of the data",
    };
    let how = match (run.kind, run.duration) {
        (Kind::Churn, Some(d)) => format!(
            "\n  through its own mapping, MADV_DONTNEED after each pass, for {:.2} s, while one \
             more thread maps a {} KiB region\n  and unmaps the oldest of the {CHURN_LIVE} it \
             keeps, in a loop",
            d.as_secs_f64(),
            CHURN_PAGES * PAGE_SIZE as u64 / 1024
        ),
        _ => String::new(),
    };
    format!("{what}{how}\n{}", grid.render())
}

/// A row: its label and the cell of a (thread count, column).
type RowSpec = (&'static str, fn(&ScaleRun, u16, Column) -> String);

const PARTS_ROWS: [RowSpec; 6] = [
    ("faults", |r, t, c| count(r, t, c, |s| s.faults)),
    ("time, seconds", |r, t, c| {
        r.value(t, c, Cell::seconds)
            .map_or_else(String::new, |v| format!("{v:.6}"))
    }),
    ("faults/s", |r, t, c| show_rate(r.fps(t, c))),
    ("vs kernel-memfd, time", |r, t, c| {
        let s = |c| r.value(t, c, Cell::seconds);
        versus_kernel(c, || ratio(s(Column::KernelMemfd)?, s(c)?))
    }),
    ("vs global-mutex, faults/s", |r, t, c| {
        only(c, Setting::LockFree, || {
            r.versus_setting(t, c, Setting::GlobalMutex)
        })
    }),
    ("vs 1 thread, faults/s", |r, t, c| {
        if t == 1 {
            return String::new();
        }
        grid::two(r.scaling(t, c))
    }),
];

const CHURN_ROWS: [RowSpec; 12] = [
    ("faults", |r, t, c| count(r, t, c, |s| s.faults)),
    ("pages touched", |r, t, c| {
        count(r, t, c, |s| s.pages_touched)
    }),
    ("time, seconds", |r, t, c| {
        r.value(t, c, Cell::seconds)
            .map_or_else(String::new, |v| format!("{v:.3}"))
    }),
    ("faults/s", |r, t, c| show_rate(r.fps(t, c))),
    ("pages/s", |r, t, c| show_rate(pages_per_second(r, t, c))),
    ("vs kernel-memfd, pages/s", |r, t, c| {
        let pps = |c| pages_per_second(r, t, c);
        versus_kernel(c, || ratio(pps(c)?, pps(Column::KernelMemfd)?))
    }),
    ("vs classic, faults/s", |r, t, c| {
        only(c, Setting::Speculative, || {
            r.versus_setting(t, c, Setting::Classic)
        })
    }),
    ("churn maps/s", |r, t, c| {
        let cell = r.cell(t, c);
        show_rate(cell.map(|c| maps_per_second(c).unwrap_or(0.0)))
    }),
    ("spf_success", |r, t, c| counter(r, t, c, |s| s.spf_success)),
    ("spf_abort", |r, t, c| counter(r, t, c, |s| s.spf_abort)),
    ("spf_fallback", |r, t, c| {
        counter(r, t, c, |s| s.spf_fallback)
    }),
    ("forwarded", |r, t, c| counter(r, t, c, |s| s.forwarded)),
];

fn pages_per_second(run: &ScaleRun, threads: u16, column: Column) -> Option<f64> {
    let c = run.cell(threads, column)?;
    med_rate(c, |s| Some(rate(s.pages_touched, s.seconds)))
}

fn maps_per_second(c: &Cell) -> Option<f64> {
    med_rate(c, |s| Some(rate(s.maps?, s.seconds)))
}

fn count(run: &ScaleRun, threads: u16, column: Column, f: fn(&Sample) -> u64) -> String {
    run.cell(threads, column)
        .map_or_else(String::new, |c| units::count(med(c, f)))
}

fn show_rate(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| units::count(v.round() as u64))
}

/// A counter of the median sample (faultmap columns).
fn counter(run: &ScaleRun, threads: u16, column: Column, f: fn(&Stats) -> u64) -> String {
    run.cell(threads, column)
        .and_then(median_stats)
        .map_or_else(String::new, |s| units::count(f(&s)))
}

/// A ratio against the kernel column: blank in the kernel's own.
fn versus_kernel(column: Column, value: impl FnOnce() -> Option<f64>) -> String {
    if column == Column::KernelMemfd {
        return String::new();
    }
    grid::two(value())
}

/// A ratio shown only in the columns of `setting`.
fn only(column: Column, setting: Setting, value: impl FnOnce() -> Option<f64>) -> String {
    if column.setting() != Some(setting) {
        return String::new();
    }
    grid::two(value())
}

/// What the counters showed that the reader should know: a classic column
/// whose faults were resolved speculatively is not the comparison it claims
/// to be.
fn notes(run: &ScaleRun) -> String {
    let mut out = String::new();
    for cell in &run.cells {
        let Column::Faultmap {
            setting: Setting::Classic,
            delivery,
        } = cell.key.column
        else {
            continue;
        };
        let Some(stats) = median_stats(cell).filter(|s| s.spf_success > 0) else {
            continue;
        };
        out.push_str(&format!(
            "\nnote: classic, {} delivery, {} thread(s): the library resolved {} of {} faults \
             on a speculatively found region (spf_success), so this column does not measure \
             the classic lookup.\n",
            crate::delivery_name(delivery),
            cell.key.threads,
            units::count(stats.spf_success),
            units::count(stats.pgfault)
        ));
    }
    out
}

fn legend(kind: Kind) -> &'static str {
    match kind {
        Kind::Parts => {
            "\nfaults: faultmap's pgfault (one per page at order 0), or the process's getrusage \
             minor faults (kernel-memfd); all threads together.\n\
             vs kernel-memfd, time: kernel-memfd's median time over the column's (above 1, the \
             column was faster).\n\
             vs global-mutex: lock-free's faults/s over global-mutex's; vs 1 thread: the \
             column's faults/s over its own at 1 thread (linear scaling: the thread count).\n"
        }
        Kind::Churn => {
            "\nfaults: faultmap's pgfault (one per page touched at order 0), or the process's \
             getrusage minor faults (kernel-memfd); all faulting threads together.\n\
             vs kernel-memfd, pages/s: the column's pages touched per second over \
             kernel-memfd's; vs classic: speculative's faults/s over classic's, same delivery.\n\
             churn maps/s: regions the churn thread mapped (and unmapped) per second.\n\
             spf_success, spf_abort, spf_fallback, forwarded: the pager's counters of the \
             median sample (faults resolved on a speculatively found region; speculative \
             attempts that found their region changing; faults the speculative lookup did not \
             find; faults a SIGBUS handler forwarded to a pager thread).\n"
        }
    }
}

// ---------------------------------------------------------------------------
// JSON.
// ---------------------------------------------------------------------------

/// Writes the document, and a newline, to `out`.
pub fn write_json(run: &ScaleRun, out: &mut impl Write) -> Result<()> {
    let churn = run.kind == Kind::Churn;
    let w = &run.warm_up;
    let goals: Vec<_> = run
        .goals()
        .into_iter()
        .map(|(threads, delivery, g)| {
            let what = g.what.rsplit_once(", ").map_or(g.what.as_str(), |x| x.0);
            json!({"what": what, "threads": threads, "delivery": crate::delivery_name(delivery),
                   "value": g.value, "at_least": g.bound, "met": g.met()})
        })
        .collect();
    let machine = json!({
        "benchmark": run.kind.name(),
        "repetitions": run.repetitions,
        "handler_threads": run.handler_threads,
        "order": 0,
        "deliveries": run.deliveries.iter().map(|&d| crate::delivery_name(d)).collect::<Vec<_>>(),
        "duration_seconds": run.duration.map(|d| d.as_secs_f64()),
        "churn_region_pages": churn.then_some(CHURN_PAGES),
        "churn_live_regions": churn.then_some(CHURN_LIVE),
        "faultmap_warm_seconds": w.seconds,
        "faultmap_warm_io_count": w.stats.io_count,
        "faultmap_warm_io_bytes": w.stats.io_bytes,
        "faultmap_cached_pct": w.cached_pct,
        "wall_seconds": run.wall_seconds,
        "goals": goals,
    });
    let rows = run.cells.iter().map(|c| row(run, c)).collect();
    grid::write_document(
        out,
        grid::machine_json(&run.machine, &run.data, machine),
        rows,
    )
}

fn row(run: &ScaleRun, cell: &Cell) -> Row {
    let column = cell.key.column;
    let faultmap = matches!(column, Column::Faultmap { .. });
    let setting = column.setting();
    let of = |key| setting.filter(|s| s.key() == key).map(|s| s.name());
    let stats = median_stats(cell);
    let counter = |f: fn(&Stats) -> u64| stats.as_ref().map(f);
    let mut row = Row::new(cell, column.engine(), column.variant());
    row.workload = run.kind.name();
    row.threads = cell.key.threads;
    row.order = faultmap.then_some(0);
    row.pages = run.data.pages;
    row.faults = Some(med(cell, |s| s.faults));
    row.major_faults = Some(med(cell, |s| s.major_faults));
    row.io_count = counter(|x| x.io_count);
    row.io_bytes = counter(|x| x.io_bytes);
    row.with("delivery", column.delivery().map(crate::delivery_name))
        .with("cache", of("cache"))
        .with("region_lookup", of("lookup"))
        .with("pages_touched", med(cell, |s| s.pages_touched))
        .with(
            "faults_per_second",
            med_rate(cell, |s| Some(s.faults_per_second())).unwrap_or(0.0),
        )
        .with(
            "pages_per_second",
            med_rate(cell, |s| Some(rate(s.pages_touched, s.seconds))).unwrap_or(0.0),
        )
        .with("maps", cell.median_u64(|s| s.maps))
        .with("maps_per_second", maps_per_second(cell))
        .with("spf_success", counter(|x| x.spf_success))
        .with("spf_abort", counter(|x| x.spf_abort))
        .with("spf_fallback", counter(|x| x.spf_fallback))
        .with("forwarded", counter(|x| x.forwarded))
        .with("stats", stats)
}

// ---------------------------------------------------------------------------
// The plot.
// ---------------------------------------------------------------------------

/// Faults/s against the thread count, a line per column (and delivery).
pub fn figure(run: &ScaleRun) -> Figure {
    let series = run
        .columns
        .iter()
        .map(|&c| {
            let label = match c.delivery() {
                Some(d) => format!("{}, {}", c.heading(), crate::delivery_name(d)),
                None => c.heading().to_string(),
            };
            let points = run
                .threads
                .iter()
                .filter_map(|&t| Some((f64::from(t), run.fps(t, c)?)));
            Series::line(label, points.collect())
        })
        .collect();
    let panel = Panel {
        title: format!("{}: faults/s per column", run.kind.name()),
        x_label: "faulting threads".into(),
        y_label: "faults/s".into(),
        log_y: true,
        series,
        ..Panel::default()
    };
    Figure {
        panels: vec![panel],
        columns: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn cell(threads: u16, setting: Setting, seconds: f64, faults: u64) -> Cell {
        let column = Column::Faultmap {
            setting,
            delivery: Delivery::Signal,
        };
        let mut c = Cell::new(Key { threads, column });
        c.samples.push(sample(seconds, faults, 0));
        c
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

    #[test]
    fn the_median_samples_counters_are_shown() {
        let mut c = Cell::new(Key {
            threads: 1,
            column: Column::KernelMemfd,
        });
        c.samples = vec![
            sample(1.0, 300, 3),
            sample(1.0, 100, 1),
            sample(2.0, 400, 2),
        ];
        assert_eq!(med(&c, |s| s.faults), 300);
        assert_eq!(med_rate(&c, |s| Some(s.faults_per_second())), Some(200.0));
        assert_eq!(median_stats(&c).unwrap().spf_success, 2);
        assert_eq!(maps_per_second(&c), None);
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
        assert_eq!((goals[0].2.value, goals[0].2.met()), (2.0, true));
        let churn = run(
            Kind::Churn,
            vec![
                cell(1, Setting::Speculative, 1.0, 300),
                cell(1, Setting::Classic, 1.0, 200),
            ],
        );
        let goals = churn.goals();
        assert_eq!(goals.len(), 1);
        assert_eq!((goals[0].2.value, goals[0].2.met()), (1.5, false));
        assert!(run(Kind::Parts, Vec::new()).goals().is_empty());
    }
}
