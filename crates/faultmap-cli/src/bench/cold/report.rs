//! The cold benchmark's human-readable report: a header, one table per
//! workload in the shape of seed 001's A/B/C comparison, the goals, and
//! seed 001's readahead table of the faultmap runs.
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
//! divide the column's count by X's.

use super::engine::ColdEngine;
use super::results::{
    bytes, count_ratio, major, seconds_ratio, ColdCell, ColdRun, ColdSummary, Goal,
};
use crate::access::Access;
use crate::ra_table;
use crate::table::Table;
use crate::units;

/// The whole report.
pub fn render(run: &ColdRun) -> String {
    let mut out = header(run);
    for &w in &run.workloads {
        out.push('\n');
        out.push_str(&block(run, w));
    }
    out.push_str(&goals(run));
    out.push_str(&ra_tables(run));
    out.push_str(LEGEND);
    out
}

fn header(run: &ColdRun) -> String {
    let mut t = Table::new(2);
    t.row(["machine".to_string(), run.machine.line()]);
    t.row(["data".to_string(), run.data.line()]);
    t.row(["caches".to_string(), caches_line(run)]);
    t.row(["disk".to_string(), disk_line(run)]);
    t.row(["faultmap".to_string(), faultmap_line(run)]);
    t.row([
        "samples".to_string(),
        format!(
            "rand and clustered touch {} pages each run (a fixed-seed sample: 1/16 of the \
             file's pages, at most 16,384)",
            units::count(run.sample_pages)
        ),
    ]);
    t.row([
        "repetitions".to_string(),
        format!(
            "{} per cell, medians shown; {:.1} s in all",
            run.repetitions, run.wall_seconds
        ),
    ]);
    format!(
        "faultmap bench --cold: seed 001's readahead comparison on cold caches \
         (case A: around, case C: readahead),\nfaultmap against kernel mmap and the device\n\n{}",
        t.render()
    )
}

fn caches_line(run: &ColdRun) -> String {
    match run.dropped {
        Some(what) => format!(
            "the kernel's page cache dropped before every kernel and faultmap run ({}); \
             every faultmap run maps a new object (empty cache)",
            what.command()
        ),
        None => "the kernel's page cache could NOT be dropped (needs root): no kernel column, \
                 and faultmap's store reads may come from the page cache; every faultmap run \
                 maps a new object (empty cache)"
            .into(),
    }
}

fn disk_line(run: &ColdRun) -> String {
    match &run.device {
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
    }
}

fn faultmap_line(run: &ColdRun) -> String {
    let (ra_pages, given) = run.ra_pages;
    format!(
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
    )
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
type Show = fn(&ColdRun, Access, ColdEngine, &ColdSummary) -> String;

/// The measured rows, in order.
const MEASURED: [(&str, Show); 6] = [
    ("seconds", |_, _, _, s| format!("{:.3}", s.seconds)),
    ("MB/s", mb_per_s),
    ("major faults", |_, _, _, s| opt_count(s.major_faults)),
    ("I/O count", |_, _, _, s| opt_count(s.io_count)),
    ("I/O size, KiB", |_, _, _, s| opt_f1(s.io_size_kib)),
    ("miss ratio", |_, _, _, s| miss(s.miss_ratio)),
];

/// A ratio row: `(numerator, denominator)` for a column, `None` where the
/// row has no value.
type RatioOf = fn(&ColdRun, Access, u16, ColdEngine) -> Option<(f64, f64)>;

/// The ratio rows, in order.
const RATIOS: [(&str, RatioOf); 4] = [
    ("vs device, time", |run, w, t, e| {
        // The device is seq's bound; for the random workloads a reference.
        let applies = w == Access::Seq && e != ColdEngine::Device;
        applies.then(|| seconds_ratio(run, w, t, ColdEngine::Device, e))?
    }),
    ("vs kernel, time", |run, w, t, e| {
        let applies = e.readahead().is_some();
        applies.then(|| seconds_ratio(run, w, t, ColdEngine::Kernel, e))?
    }),
    ("major faults / around", |run, w, t, e| {
        let applies = matches!(e, ColdEngine::Kernel | ColdEngine::Readahead);
        applies.then(|| count_ratio(run, w, t, major, e, ColdEngine::Around))?
    }),
    ("bytes read / kernel", |run, w, t, e| {
        let applies = e.readahead().is_some();
        applies.then(|| count_ratio(run, w, t, bytes, e, ColdEngine::Kernel))?
    }),
];

/// One workload's table.
fn block(run: &ColdRun, w: Access) -> String {
    let mut t = Table::new(2);
    let mut heading = vec![String::new(), String::new()];
    heading.extend(run.engines.iter().map(|e| e.column().to_string()));
    t.row(heading);
    for threads in run.threads_of(w) {
        let summaries: Vec<Option<ColdSummary>> = run
            .engines
            .iter()
            .map(|&e| run.cell(w, threads, e).map(|c| c.summary()))
            .collect();
        for (i, (what, show)) in MEASURED.iter().enumerate() {
            let label = if i == 0 {
                threads_label(threads)
            } else {
                String::new()
            };
            let cells = run
                .engines
                .iter()
                .zip(&summaries)
                .map(|(&e, s)| {
                    s.as_ref()
                        .map_or_else(|| "-".into(), |s| show(run, w, e, s))
                })
                .collect();
            row(&mut t, &label, what, cells);
        }
        for (what, ratio) in RATIOS {
            let cells: Vec<String> = run
                .engines
                .iter()
                .map(|&e| {
                    ratio(run, w, threads, e)
                        .filter(|&(_, d)| d > 0.0)
                        .map_or_else(String::new, |(n, d)| format!("{:.2}", n / d))
                })
                .collect();
            // A ratio no column has (no kernel column, say) is left out.
            if cells.iter().any(|c| !c.is_empty()) {
                row(&mut t, "", what, cells);
            }
        }
    }
    format!("{}: {}\n{}", w.name(), describe(w), t.render())
}

/// `1 thread`, `2 threads`.
fn threads_label(threads: u16) -> String {
    if threads == 1 {
        "1 thread".into()
    } else {
        format!("{threads} threads")
    }
}

fn row(t: &mut Table, label: &str, what: &str, cells: Vec<String>) {
    let mut r = vec![label.to_string(), what.to_string()];
    r.extend(cells);
    t.row(r);
}

/// MB/s (10^6 bytes) of the whole file: the device always, the others on
/// seq only (the random workloads read a sample).
fn mb_per_s(run: &ColdRun, w: Access, e: ColdEngine, s: &ColdSummary) -> String {
    if (w == Access::Seq || e == ColdEngine::Device) && s.seconds > 0.0 {
        units::count((run.data.bytes as f64 / s.seconds / 1e6) as u64)
    } else {
        "-".into()
    }
}

fn opt_count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), units::count)
}

fn opt_f1(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.1}"))
}

fn miss(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), ra_table::percent)
}

/// The goals, one line each.
fn goals(run: &ColdRun) -> String {
    let goals = run.goals();
    if goals.is_empty() {
        return String::new();
    }
    let mut t = Table::new(2).note_column(4);
    for g in &goals {
        t.row([
            format!("{}, {}", g.workload.name(), threads_label(g.threads)),
            g.what.to_string(),
            format!("{:.2}", g.value),
            bound(g),
            if g.met() { "met" } else { "NOT met" }.to_string(),
        ]);
    }
    format!("\ngoals\n{}", t.render())
}

fn bound(g: &Goal) -> String {
    let op = if g.at_least { ">=" } else { "<=" };
    format!("{op} {:.2}", g.bound)
}

/// Seed 001's readahead table of the faultmap runs that matter: seq (the
/// first thread count) and rand with full readahead, clustered with both.
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
        if let Some(cell) = run.cell(w, threads, e) {
            out.push_str(&ra_block(cell));
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("\nreadahead per pattern, faultmap (seed 001's table, the median repetition; sizes are mean pages)\n{out}")
}

fn ra_block(cell: &ColdCell) -> String {
    let Some((stats, ra)) = cell.median_stats() else {
        return String::new();
    };
    format!(
        "\n{}, {}, {}:\n{}\n{}",
        cell.workload.name(),
        threads_label(cell.threads),
        cell.engine.variant(),
        ra_table::ra_table(&ra),
        ra_table::counters(&stats, &ra)
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

#[cfg(test)]
mod tests {
    use super::super::engine::ColdSample;
    use super::super::results::test_run;
    use super::*;
    use faultmap::{RaStats, Stats};

    fn cell(w: Access, e: ColdEngine, seconds: f64, major: u64) -> ColdCell {
        let faultmap = e.readahead().is_some();
        let mut c = ColdCell::new(w, 1, e, 16);
        c.samples.push(ColdSample {
            seconds,
            major_faults: (e != ColdEngine::Device).then_some(major),
            io_count: Some(4),
            io_bytes: Some(4 << 12),
            stats: faultmap.then(Stats::default),
            ra: faultmap.then(RaStats::default),
            ..ColdSample::default()
        });
        c
    }

    fn all_columns(w: Access) -> Vec<ColdCell> {
        [
            (ColdEngine::Device, 1.0, 0),
            (ColdEngine::Kernel, 2.0, 30),
            (ColdEngine::Around, 1.5, 90),
            (ColdEngine::Readahead, 1.0, 60),
        ]
        .into_iter()
        .map(|(e, s, m)| cell(w, e, s, m))
        .collect()
    }

    #[test]
    fn a_block_has_every_row_and_the_ratios() {
        let mut cells = all_columns(Access::Seq);
        cells.extend(all_columns(Access::Clustered));
        let mut run = test_run(cells);
        run.workloads = vec![Access::Seq, Access::Clustered];
        let text = render(&run);
        for needle in [
            "seq: every 8-byte word",
            "clustered: sampled 64 KiB clusters",
            "1 thread  seconds",
            "MB/s",
            "I/O size, KiB",
            "vs device, time",
            "vs kernel, time",
            "major faults / around",
            "bytes read / kernel",
            "goals",
            "seq, 1 thread, readahead=full:",
            "clustered, 1 thread, readahead=around:",
        ] {
            assert!(text.contains(needle), "no {needle:?} in\n{text}");
        }
        // seq: readahead at the device's rate, 2x the kernel's; major faults
        // 60 / 90 of around's.
        let numbers = |start: &str| -> Vec<String> {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(start))
                .unwrap_or_else(|| panic!("no {start}:\n{text}"));
            let words = line[line.find(start).unwrap() + start.len()..].split_whitespace();
            words.map(String::from).collect()
        };
        assert_eq!(numbers("vs device, time"), ["0.50", "0.67", "1.00"]);
        assert_eq!(numbers("vs kernel, time"), ["1.33", "2.00"]);
        assert_eq!(numbers("major faults / around"), ["0.33", "0.67"]);
        // The device is seq's bound only.
        let clustered = &text[text.find("clustered:").unwrap()..];
        let clustered = &clustered[..clustered.find("goals").unwrap()];
        assert!(!clustered.contains("vs device"), "{clustered}");
    }

    #[test]
    fn without_a_kernel_column_its_ratios_are_left_out() {
        let cells = all_columns(Access::Rand)
            .into_iter()
            .filter(|c| c.engine != ColdEngine::Kernel)
            .collect();
        let mut run = test_run(cells);
        run.workloads = vec![Access::Rand];
        run.engines = ColdEngine::columns(false);
        run.dropped = None;
        let text = render(&run);
        assert!(text.contains("could NOT be dropped"), "{text}");
        assert!(!text.contains("kernel  "), "{text}");
        assert!(!text.contains("vs kernel"), "{text}");
        assert!(!text.contains("bytes read / kernel"), "{text}");
        assert!(text.contains("rand, 1 thread, readahead=full:"), "{text}");
    }
}
