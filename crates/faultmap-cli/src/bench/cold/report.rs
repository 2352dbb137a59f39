//! The readahead comparison's results: one table per workload comparing
//! read-around with full readahead against kernel mmap and the device, the
//! goals, the readahead table of the faultmap runs, the JSON rows and the
//! plot, all from one [`ColdRun`] of [`grid::Cell`]s.
//!
//! ```text
//!   seq: every word, in order; T threads each read a contiguous 1/T of one mapping
//!                               device   kernel   around  readahead
//!   1 thread  seconds            0.531    1.020    1.321      0.570
//!             MB/s               2,022    1,053      813      1,884
//!             major faults           -    3,120      512        260
//!             I/O count          1,024    2,061    1,024      1,030
//!             I/O size, KiB    1,024.0    509.5  1,024.0    1,018.0
//!             miss ratio             -        -     0.0%       0.0%
//!             vs device, time              0.52     0.40       0.93
//!             vs kernel, time                       0.77       1.79
//!             major faults / around        6.09                0.51
//!             bytes read / kernel                   1.00       1.00
//! ```
//!
//! Every number is the median over the repetitions. `vs X, time` divides X's
//! time by the column's (above 1: the column was faster); the count ratios
//! divide the column's count by X's. The readahead table shown for a cell
//! is that of its median repetition (by time): real counts, not a mix of
//! medians.
//!
//! JSON rows: `engine` `device`, `kernel-file` or `faultmap`; `variant`
//! `cold` (device, kernel) or `readahead=around` / `readahead=full`;
//! `io_count` the device's 1 MiB reads, the disk's completed reads during a
//! kernel run, or faultmap's store reads of every readahead window
//! ([`super::engine::faultmap_io_count`]); null where a field does not
//! apply. Extra fields: `pages_touched`, `io_size_kib`, `miss_ratio`,
//! `mb_per_second` (the file's bytes over the time: device, and seq),
//! `block_reads` and `block_read_bytes` (the disk's reads during the run,
//! every process's), `ra_pages`, and for faultmap `stats` and
//! `readahead_stats` (the median repetition's). The machine object adds the
//! run's settings and `goals`.

use std::io::Write;

use anyhow::Result;
use faultmap::{RaStats, Stats};
use serde_json::json;

use super::engine::{ColdEngine, ColdSample};
use crate::access::Access;
use crate::bench::grid::{self, threads_label, DataInfo, Goal, Grid, Row};
use crate::bench::plot::{Figure, Panel, Series};
use crate::bench::probe::Machine;
use crate::kernel::{BlockDevice, Caches};
use crate::ra_table;
use crate::units;

/// What a cell measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The workload.
    pub workload: Access,
    /// Threads (`device`: 1).
    pub threads: u16,
    /// The engine.
    pub engine: ColdEngine,
}

/// A cell of the readahead comparison.
pub type Cell = grid::Cell<Key, ColdSample>;

impl grid::Sample for ColdSample {
    fn seconds(&self) -> f64 {
        self.seconds
    }
}

/// Mean request size in KiB, if there was a request.
pub fn io_size_kib(bytes: u64, count: u64) -> Option<f64> {
    (count > 0).then(|| bytes as f64 / count as f64 / 1024.0)
}

/// The median mean request size of a cell, in KiB.
fn cell_io_size(c: &Cell) -> Option<f64> {
    c.median_f64(|x| io_size_kib(x.io_bytes?, x.io_count?))
}

/// The median repetition's counters and readahead table (faultmap).
fn median_stats(c: &Cell) -> Option<(Stats, RaStats)> {
    let s = c.median_sample()?;
    Some((s.stats?, s.ra?))
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
    /// The cells, in measurement order, and the pages each run touches.
    pub cells: Vec<(Cell, u64)>,
    /// Wall time of the whole benchmark.
    pub wall_seconds: f64,
}

impl ColdRun {
    /// The cell of one combination (`device`: its one-thread cell), if it
    /// has samples.
    pub fn cell(&self, workload: Access, threads: u16, engine: ColdEngine) -> Option<&Cell> {
        let threads = if engine == ColdEngine::Device {
            1
        } else {
            threads
        };
        let key = Key {
            workload,
            threads,
            engine,
        };
        let cell = self.cells.iter().map(|(c, _)| c).find(|c| c.key == key);
        cell.filter(|c| !c.samples.is_empty())
    }

    /// The thread counts a workload runs with.
    pub fn threads_of(&self, workload: Access) -> Vec<u16> {
        threads_of(workload, &self.threads)
    }

    /// `a`'s median seconds over `b`'s: above 1, `b` was faster.
    fn seconds_ratio(&self, w: Access, t: u16, a: ColdEngine, b: ColdEngine) -> Option<f64> {
        let s = |e| self.cell(w, t, e).map(Cell::seconds);
        grid::ratio(s(a)?, s(b)?)
    }

    /// A count of `a` over the same count of `b`.
    fn count_ratio(
        &self,
        w: Access,
        t: u16,
        count: Count,
        a: ColdEngine,
        b: ColdEngine,
    ) -> Option<f64> {
        let c = |e| self.cell(w, t, e).and_then(|c| c.median_u64(count));
        grid::ratio(c(a)? as f64, c(b)? as f64)
    }

    /// The goals, for every workload and thread count that has them.
    pub fn goals(&self) -> Vec<(Access, u16, Goal)> {
        let mut goals = Vec::new();
        for &w in &self.workloads {
            for t in self.threads_of(w) {
                for spec in GOALS.iter().filter(|g| g.0 == w) {
                    let (_, what, bound, at_least, ratio) = *spec;
                    if let Some(value) = ratio(self, w, t) {
                        let place = format!("{}, {}", w.name(), threads_label(t));
                        let what = what.to_string();
                        let goal = Goal {
                            place,
                            what,
                            value,
                            bound,
                            at_least,
                        };
                        goals.push((w, t, goal));
                    }
                }
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

/// A count of a sample.
type Count = fn(&ColdSample) -> Option<u64>;

/// A goal: workload, what it says, bound, at least (or at most), ratio.
type GoalSpec = (
    Access,
    &'static str,
    f64,
    bool,
    fn(&ColdRun, Access, u16) -> Option<f64>,
);

/// The goals of the readahead comparison on this machine.
const GOALS: [GoalSpec; 4] = [
    (
        Access::Seq,
        "readahead's rate / the device's (O_DIRECT, same run)",
        0.9,
        true,
        |r, w, t| r.seconds_ratio(w, t, ColdEngine::Device, ColdEngine::Readahead),
    ),
    (
        Access::Seq,
        "readahead's rate / kernel mmap's",
        1.2,
        true,
        |r, w, t| r.seconds_ratio(w, t, ColdEngine::Kernel, ColdEngine::Readahead),
    ),
    (
        Access::Clustered,
        "major faults, readahead / around (cut by a third)",
        2.0 / 3.0,
        false,
        |r, w, t| {
            r.count_ratio(
                w,
                t,
                |s| s.major_faults,
                ColdEngine::Readahead,
                ColdEngine::Around,
            )
        },
    ),
    (
        Access::Rand,
        "bytes read, readahead / kernel mmap",
        1.0,
        false,
        |r, w, t| {
            r.count_ratio(
                w,
                t,
                |s| s.io_bytes,
                ColdEngine::Readahead,
                ColdEngine::Kernel,
            )
        },
    ),
];

// ---------------------------------------------------------------------------
// The tables.
// ---------------------------------------------------------------------------

/// The whole report.
pub fn render(run: &ColdRun) -> String {
    let title = "faultmap bench --cold: the readahead comparison on cold caches (read-around \
                 only against full readahead),\nfaultmap against kernel mmap and the device";
    let mut out = grid::header(title, &run.machine, &run.data, header_lines(run));
    for &w in &run.workloads {
        out.push('\n');
        out.push_str(&block(run, w));
    }
    let goals: Vec<Goal> = run.goals().into_iter().map(|g| g.2).collect();
    out.push_str(&grid::goals(&goals));
    out.push_str(&ra_tables(run));
    out.push_str(LEGEND);
    out
}

fn header_lines(run: &ColdRun) -> Vec<(&'static str, String)> {
    let caches = match run.dropped {
        Some(what) => format!(
            "the kernel's page cache dropped before every kernel and faultmap run ({}); \
             every faultmap run maps a new object (empty cache)",
            what.command()
        ),
        None => "the kernel's page cache could NOT be dropped (needs root): no kernel column, \
                 and faultmap's store reads may come from the page cache; every faultmap run \
                 maps a new object (empty cache)"
            .into(),
    };
    let disk = match &run.device {
        Some(d) => {
            let ra = d
                .read_ahead_kb()
                .map_or_else(String::new, |kb| format!(", read_ahead_kb {kb}"));
            format!(
                "{} ({}){ra}; the kernel's I/O counts are this disk's completed reads \
                 ({}), every process's",
                d.name,
                d.number,
                d.stat_path().display()
            )
        }
        None => "no block-device counters for the file (tmpfs?): the kernel's I/O counts are \
                 unknown"
            .into(),
    };
    let (ra_pages, given) = run.ra_pages;
    let faultmap = format!(
        "fault-around order {}, ra_pages {} ({}, {}), file reads {}, {} handler thread(s), \
         {} I/O thread(s); a new pager per run",
        run.order,
        units::count(ra_pages),
        units::bytes(ra_pages * faultmap::PAGE_SIZE as u64),
        if given {
            "--ra-pages"
        } else {
            "the store's default"
        },
        run.file_io,
        run.handler_threads,
        run.io_threads
    );
    vec![
        ("caches", caches),
        ("disk", disk),
        ("faultmap", faultmap),
        (
            "samples",
            format!(
                "rand and clustered touch {} pages each run (a fixed-seed sample: 1/16 of the \
                 file's pages, at most 16,384)",
                units::count(run.sample_pages)
            ),
        ),
        (
            "repetitions",
            format!(
                "{} per cell, medians shown; {:.1} s in all",
                run.repetitions, run.wall_seconds
            ),
        ),
    ]
}

/// What a workload does, for its table's title.
fn describe(w: Access) -> &'static str {
    match w {
        Access::Seq => {
            "every 8-byte word in order; T threads each read their own contiguous 1/T \
             of one shared mapping (the file is read once)"
        }
        Access::Rand => {
            "the first word of each sampled page, in a random order (device: the whole \
             file, for reference)"
        }
        Access::Clustered => {
            "sampled 64 KiB clusters in a random order, each read page by page \
             (device: the whole file, for reference)"
        }
    }
}

/// How a measured row shows a cell.
type Show = fn(&ColdRun, Access, ColdEngine, &Cell) -> String;

/// The measured rows, in order.
const MEASURED: [(&str, Show); 6] = [
    ("seconds", |_, _, _, c| format!("{:.3}", c.seconds())),
    ("MB/s", |run, w, e, c| {
        mb_per_s(run, w, e, c).map_or_else(|| "-".into(), |v| units::count(v as u64))
    }),
    ("major faults", |_, _, _, c| {
        opt_count(c.median_u64(|s| s.major_faults))
    }),
    ("I/O count", |_, _, _, c| {
        opt_count(c.median_u64(|s| s.io_count))
    }),
    ("I/O size, KiB", |_, _, _, c| {
        cell_io_size(c).map_or_else(|| "-".into(), |x| format!("{x:.1}"))
    }),
    ("miss ratio", |_, _, _, c| {
        let miss = c.median_f64(|x| x.ra.and_then(|r| r.miss_ratio));
        miss.map_or_else(|| "-".into(), ra_table::percent)
    }),
];

/// A ratio row: the value for a column, `None` where the row has none.
type RatioOf = fn(&ColdRun, Access, u16, ColdEngine) -> Option<f64>;

/// The ratio rows, in order.
const RATIOS: [(&str, RatioOf); 4] = [
    ("vs device, time", |run, w, t, e| {
        // The device is seq's bound; for the random workloads a reference.
        let applies = w == Access::Seq && e != ColdEngine::Device;
        applies.then(|| run.seconds_ratio(w, t, ColdEngine::Device, e))?
    }),
    ("vs kernel, time", |run, w, t, e| {
        let applies = e.readahead().is_some();
        applies.then(|| run.seconds_ratio(w, t, ColdEngine::Kernel, e))?
    }),
    ("major faults / around", |run, w, t, e| {
        let applies = matches!(e, ColdEngine::Kernel | ColdEngine::Readahead);
        applies.then(|| run.count_ratio(w, t, |s| s.major_faults, e, ColdEngine::Around))?
    }),
    ("bytes read / kernel", |run, w, t, e| {
        let applies = e.readahead().is_some();
        applies.then(|| run.count_ratio(w, t, |s| s.io_bytes, e, ColdEngine::Kernel))?
    }),
];

/// One workload's table.
fn block(run: &ColdRun, w: Access) -> String {
    let headings = run.engines.iter().map(|e| e.column().to_string()).collect();
    let mut grid = Grid::new(headings, None);
    for threads in run.threads_of(w) {
        let mut rows = Vec::new();
        for (what, show) in MEASURED {
            let cells = run.engines.iter().map(|&e| {
                run.cell(w, threads, e)
                    .map_or_else(|| "-".into(), |c| show(run, w, e, c))
            });
            rows.push((what.to_string(), cells.collect()));
        }
        for (what, ratio) in RATIOS {
            // A ratio no column has (no kernel column, say) is left out.
            let cells = run.engines.iter().map(|&e| {
                ratio(run, w, threads, e).map_or_else(String::new, |v| format!("{v:.2}"))
            });
            rows.push((what.to_string(), cells.collect()));
        }
        grid.group(threads_label(threads), rows);
    }
    format!("{}: {}\n{}", w.name(), describe(w), grid.render())
}

/// MB/s (10^6 bytes) of the whole file: the device always, the others on
/// seq only (the random workloads read a sample).
fn mb_per_s(run: &ColdRun, w: Access, e: ColdEngine, c: &Cell) -> Option<f64> {
    let whole_file = w == Access::Seq || e == ColdEngine::Device;
    let seconds = c.seconds();
    (whole_file && seconds > 0.0).then(|| run.data.bytes as f64 / seconds / 1e6)
}

fn opt_count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), units::count)
}

/// The readahead table of the faultmap runs that matter: seq (the first
/// thread count) and rand with full readahead, clustered with both.
fn ra_tables(run: &ColdRun) -> String {
    let seq_threads = run.threads.first().copied().unwrap_or(1);
    let wanted = [
        (Access::Seq, seq_threads, ColdEngine::Readahead),
        (Access::Rand, 1, ColdEngine::Readahead),
        (Access::Clustered, 1, ColdEngine::Around),
        (Access::Clustered, 1, ColdEngine::Readahead),
    ];
    let mut out = String::new();
    for (w, threads, e) in wanted {
        let Some((stats, ra)) = run.cell(w, threads, e).and_then(median_stats) else {
            continue;
        };
        out.push_str(&format!(
            "\n{}, {}, {}:\n{}\n{}",
            w.name(),
            threads_label(threads),
            e.variant(),
            ra_table::ra_table(&ra),
            ra_table::counters(&stats, &ra)
        ));
    }
    if out.is_empty() {
        return out;
    }
    format!(
        "\nreadahead per pattern, faultmap (the median repetition; sizes are mean pages)\n{out}"
    )
}

const LEGEND: &str = "
seconds: the run's wall time (device: the whole file, O_DIRECT 1 MiB reads, about 32 MiB in
flight through io_uring). MB/s: the file's bytes (10^6) per second. major faults: getrusage
(kernel), pgmajfault (faultmap). I/O count and size: 1 MiB reads issued (device), the disk's
completed reads (kernel: every process's), store reads of every readahead window, sync and async
(faultmap). miss ratio: pages read ahead and never mapped, over pages read ahead. vs X, time:
X's seconds over the column's (above 1: the column was faster). The count ratios divide the
column's count by X's.
";

// ---------------------------------------------------------------------------
// JSON.
// ---------------------------------------------------------------------------

/// Writes the document, and a newline, to `out`.
pub fn write_json(run: &ColdRun, out: &mut impl Write) -> Result<()> {
    let goals: Vec<_> = run
        .goals()
        .into_iter()
        .map(|(w, t, g)| {
            json!({"workload": w.name(), "threads": t, "what": g.what, "value": g.value,
                   "bound": g.bound, "at_least": g.at_least, "met": g.met()})
        })
        .collect();
    let machine = json!({
        "cold": true,
        "repetitions": run.repetitions,
        "caches_dropped": run.dropped.map(|d| d.command()),
        "block_device": run.device.as_ref().map(|d| d.name.as_str()),
        "read_ahead_kb": run.device.as_ref().and_then(|d| d.read_ahead_kb()),
        "order": run.order,
        "ra_pages": run.ra_pages.0,
        "ra_pages_from": if run.ra_pages.1 { "argument" } else { "store" },
        "file_io": run.file_io.as_str(),
        "handler_threads": run.handler_threads,
        "io_threads": run.io_threads,
        "sample_pages": run.sample_pages,
        "wall_seconds": run.wall_seconds,
        "goals": goals,
    });
    let rows = run
        .cells
        .iter()
        .filter(|(c, _)| !c.samples.is_empty())
        .map(|(c, touched)| row(run, c, *touched))
        .collect();
    grid::write_document(
        out,
        grid::machine_json(&run.machine, &run.data, machine),
        rows,
    )
}

fn row(run: &ColdRun, cell: &Cell, pages_touched: u64) -> Row {
    let Key {
        workload,
        threads,
        engine,
    } = cell.key;
    let faultmap = engine.readahead().is_some();
    let median = median_stats(cell);
    let mut row = Row::new(cell, engine.name(), engine.variant().to_string());
    row.workload = workload.name();
    row.threads = threads;
    row.order = faultmap.then_some(run.order);
    row.pages = run.data.pages;
    row.faults = cell.median_u64(|s| s.faults);
    row.major_faults = cell.median_u64(|s| s.major_faults);
    row.io_count = cell.median_u64(|s| s.io_count);
    row.io_bytes = cell.median_u64(|s| s.io_bytes);
    row.with("pages_touched", pages_touched)
        .with("io_size_kib", cell_io_size(cell))
        .with(
            "miss_ratio",
            cell.median_f64(|x| x.ra.and_then(|r| r.miss_ratio)),
        )
        .with("mb_per_second", mb_per_s(run, workload, engine, cell))
        .with("block_reads", cell.median_u64(|x| x.block.map(|b| b.reads)))
        .with(
            "block_read_bytes",
            cell.median_u64(|x| x.block.map(|b| b.bytes)),
        )
        .with("ra_pages", faultmap.then_some(run.ra_pages.0))
        .with("stats", median.map(|m| m.0))
        .with("readahead_stats", median.map(|m| m.1))
}

// ---------------------------------------------------------------------------
// The plot.
// ---------------------------------------------------------------------------

/// Per workload, the throughput of each engine (the bytes a run read
/// through its mapping, or the device's whole file, per second): a line
/// per thread count over the engines.
pub fn figure(run: &ColdRun) -> Figure {
    let names: Vec<String> = run.engines.iter().map(|e| e.column().to_string()).collect();
    let panels = run
        .workloads
        .iter()
        .map(|&w| {
            let series = run
                .threads_of(w)
                .into_iter()
                .map(|t| {
                    let points = run.engines.iter().enumerate().filter_map(|(i, &e)| {
                        let threads = if e == ColdEngine::Device { 1 } else { t };
                        let (cell, touched) = run.cells.iter().find(|(c, _)| {
                            c.key
                                == Key {
                                    workload: w,
                                    threads,
                                    engine: e,
                                }
                                && !c.samples.is_empty()
                        })?;
                        let bytes = touched * faultmap::PAGE_SIZE as u64;
                        Some((i as f64, grid::ratio(bytes as f64 / 1e6, cell.seconds())?))
                    });
                    Series::line(threads_label(t), points.collect())
                })
                .collect();
            Panel {
                title: format!("{}: throughput per engine", w.name()),
                x_label: "engine".into(),
                x_names: names.clone(),
                y_label: "MB/s read".into(),
                log_y: true,
                series,
            }
        })
        .collect();
    Figure { panels, columns: 3 }
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

    fn cell(workload: Access, engine: ColdEngine, s: ColdSample) -> (Cell, u64) {
        let key = Key {
            workload,
            threads: 1,
            engine,
        };
        let mut c = Cell::new(key);
        c.samples.push(s);
        (c, 16)
    }

    fn run(cells: Vec<(Cell, u64)>) -> ColdRun {
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

    #[test]
    fn goals_come_from_the_right_cells() {
        let r = run(vec![
            cell(Access::Seq, ColdEngine::Device, sample(0.9, 0, 0)),
            cell(Access::Seq, ColdEngine::Kernel, sample(2.0, 0, 0)),
            cell(Access::Seq, ColdEngine::Readahead, sample(1.0, 0, 0)),
            cell(Access::Clustered, ColdEngine::Around, sample(1.0, 90, 0)),
            cell(Access::Clustered, ColdEngine::Readahead, sample(1.0, 30, 0)),
            cell(Access::Rand, ColdEngine::Kernel, sample(1.0, 1, 100)),
            cell(Access::Rand, ColdEngine::Readahead, sample(1.0, 1, 150)),
        ]);
        let v: Vec<(f64, bool)> = r.goals().iter().map(|g| (g.2.value, g.2.met())).collect();
        // In workload order: seq, rand, clustered.
        assert_eq!(
            v,
            [(0.9, true), (2.0, true), (1.5, false), (1.0 / 3.0, true)]
        );
        // A missing column leaves its goal out.
        let r = run(vec![cell(
            Access::Seq,
            ColdEngine::Readahead,
            sample(1.0, 0, 0),
        )]);
        assert!(r.goals().is_empty());
        assert_eq!(threads_of(Access::Seq, &[1, 2]), [1, 2]);
        assert_eq!(threads_of(Access::Clustered, &[1, 2]), [1]);
    }

    #[test]
    fn a_block_has_every_row_and_the_ratios() {
        let engines = [
            (ColdEngine::Device, 1.0, 0),
            (ColdEngine::Kernel, 2.0, 30),
            (ColdEngine::Around, 1.5, 90),
            (ColdEngine::Readahead, 1.0, 60),
        ];
        let cells = engines
            .iter()
            .map(|&(e, s, m)| cell(Access::Seq, e, sample(s, m, 4 << 12)))
            .collect();
        let mut r = run(cells);
        r.workloads = vec![Access::Seq];
        let text = render(&r);
        let numbers = |start: &str| -> Vec<String> {
            let line = text.lines().find(|l| l.contains(start)).unwrap();
            let rest = &line[line.find(start).unwrap() + start.len()..];
            rest.split_whitespace().map(String::from).collect()
        };
        assert_eq!(numbers("vs device, time"), ["0.50", "0.67", "1.00"]);
        assert_eq!(numbers("vs kernel, time"), ["1.33", "2.00"]);
        assert_eq!(numbers("major faults / around"), ["0.33", "0.67"]);
        for needle in ["MB/s", "I/O size, KiB", "bytes read / kernel", "goals"] {
            assert!(text.contains(needle), "no {needle:?} in\n{text}");
        }
        // Without a kernel column, its ratios are left out.
        r.cells.retain(|(c, _)| c.key.engine != ColdEngine::Kernel);
        r.engines = ColdEngine::columns(false);
        let text = render(&r);
        assert!(!text.contains("vs kernel"), "{text}");
    }
}
