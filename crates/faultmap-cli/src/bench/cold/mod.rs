//! `faultmap bench --cold`: the readahead comparison, on cold caches.
//!
//! On-demand mmap readahead, measured against mmap read-around only on a
//! freshly booted desktop, cut major faults by a third on clustered random
//! reads, with the same miss ratio. This benchmark runs that comparison on
//! one file, with the kernel and the disk as references:
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
//! divide the column's count by X's. Then the goals, and the readahead
//! tables of the faultmap runs that matter, each its median repetition's
//! (by time): real counts, not a mix of medians.
//!
//! Workloads ([`crate::access`]): `seq` on each `--threads` count (the
//! threads share one mapping, each reads its own 1/T: the file is read
//! once), `rand` and `clustered` on one thread, over a fixed-seed sample of
//! [`sample_pages`] pages (random reads cost about 100 µs each here, so a
//! sample keeps a run within seconds).
//!
//! [`run`] reads top to bottom:
//!
//! 1. the settings, checked before anything costly (one fault-around
//!    order, `ra_pages` within the library's bound);
//! 2. a pager, started once so that a missing userfaultfd fails at once
//!    (every faultmap run then starts its own: see [`engine`]);
//! 3. the data (generated or `--file`);
//! 4. the kernel: drop its page cache once as a probe (without permission
//!    there is no kernel column, and a note says so), and find the disk
//!    whose counters give the kernel's I/O;
//! 5. the plans: seq's parts and the random samples, drawn once, untimed;
//! 6. the measurements ([`engine`]): repetitions outermost, then workload;
//!    in each, the device, then per thread count kernel, around and
//!    readahead, so the columns of a row are measured seconds apart. Every
//!    run's word sum must equal the first one of its workload and thread
//!    count: an engine that served wrong bytes fails the benchmark (a
//!    device that fails leaves its column out, with a note);
//! 7. the report: the tables, or the JSON document; and the plot.
//!
//! JSON rows: `engine` `device`, `kernel-file` or `faultmap`; `variant`
//! `cold` (device, kernel) or `readahead=around` / `readahead=full`;
//! `io_count` the device's 1 MiB reads, the disk's completed reads during a
//! kernel run, or faultmap's store reads of every readahead window
//! ([`engine::faultmap_io_count`]); null where a field does not apply.
//! Extra fields: `pages_touched`, `io_size_kib`, `miss_ratio`,
//! `mb_per_second` (the file's bytes over the time: device, and seq),
//! `block_reads` and `block_read_bytes` (the disk's reads during the run,
//! every process's), `ra_pages`, and for faultmap `stats` and
//! `readahead_stats` (the median repetition's). The machine object adds the
//! run's settings and `goals`.

mod engine;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use faultmap::{FileIo, FileStore, PageSize, Pager, RaStats, Stats, Store, PAGE_SIZE};
use serde_json::{json, Value};

use self::engine::{Bench, ColdEngine};
use super::grid::{self, threads_label, Checksums, Column, Goal, Line, Row};
use super::plot::{Figure, Panel, Series};
use super::reps::Repetitions;
use super::workload::Workload;
use super::{dedup, note, or_default};
use crate::access::{Access, AccessPlan, Coverage};
use crate::kernel::{BlockDevice, CacheDropper, Caches, DROP_CACHES};
use crate::{ra_table, units, BenchArgs, Readahead};

/// The workloads without `--workload`.
const COLD_WORKLOADS: [Workload; 3] = [Workload::Seq, Workload::Rand, Workload::Clustered];

/// The fault-around order without `--orders`: the kernel's 64 KiB.
const COLD_ORDER: u8 = 4;

/// Repetitions without `--repetitions`.
const COLD_REPETITIONS: u32 = 3;

/// rand and clustered touch 1/this of the file's pages...
const SAMPLE_FRACTION: u64 = 16;

/// ... and at most this many (about 1.6 s of 4 KiB random reads here).
const SAMPLE_MAX: u64 = 16_384;

/// Pages the random workloads touch in a file of `pages` pages.
pub fn sample_pages(pages: u64) -> u64 {
    (pages / SAMPLE_FRACTION).clamp(1, SAMPLE_MAX)
}

/// The readahead comparison's settings, beside its cells.
#[derive(Debug)]
pub struct Cold {
    /// Repetitions.
    repetitions: u32,
    /// What is dropped before each kernel and faultmap run, if anything.
    dropped: Option<Caches>,
    /// The data's block device.
    device: Option<BlockDevice>,
    /// faultmap's fault-around order.
    order: u8,
    /// faultmap's readahead window in pages, and whether `--ra-pages` set it.
    ra_pages: (u64, bool),
    /// How faultmap's file store reads (the mode in force).
    file_io: FileIo,
    /// faultmap handler threads.
    handler_threads: u16,
    /// faultmap I/O threads.
    io_threads: usize,
    /// Pages each rand/clustered run touches.
    sample_pages: u64,
}

/// The readahead comparison's results.
type Run = grid::Report<Cold>;

type Key = grid::Key<Access, ColdEngine>;

type Cell = grid::Cell<Access, ColdEngine>;

impl grid::Named for Access {
    fn name(self) -> &'static str {
        Access::name(self)
    }
}

/// The access pattern of a cold workload.
fn cold_access(w: Workload) -> Option<Access> {
    match w {
        Workload::Seq => Some(Access::Seq),
        Workload::Rand => Some(Access::Rand),
        Workload::Clustered => Some(Access::Clustered),
        Workload::Sparse
        | Workload::Scattered
        | Workload::Pages
        | Workload::Hotcold
        | Workload::Batch => None,
    }
}

/// The thread counts of `workload`: seq's list, one for the others.
fn threads_of(workload: Access, seq_threads: &[u16]) -> Vec<u16> {
    match workload {
        Access::Seq => seq_threads.to_vec(),
        Access::Rand | Access::Clustered | Access::Batch => vec![1],
    }
}

/// Runs `faultmap bench --cold`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    // 1. The arguments.
    let workloads = dedup(or_default(&args.workload, &COLD_WORKLOADS))
        .into_iter()
        .map(|w| {
            cold_access(w).with_context(|| {
                let w = w.name();
                format!("workload {w} is not a cold workload (seq, rand, clustered)")
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let [order] = dedup(or_default(&args.orders, &[COLD_ORDER]))[..] else {
        bail!("--cold measures one fault-around order: give one with --orders");
    };
    if order == faultmap::policy::fault_around::AUTO {
        bail!("--cold measures a fixed fault-around order (0..=9), not auto");
    };
    crate::stats::map_options(order, args.ra_pages, Readahead::Full).validate()?;
    let config = crate::stats::pager_config(args.handler_threads, args.io_threads);
    config.validate()?;
    let threads = dedup(or_default(&args.threads, &super::DEFAULT_THREADS));
    let repetitions = args.repetitions.unwrap_or(COLD_REPETITIONS);
    // 2. The pager, as a check.
    drop(Pager::new(config.clone()).context("cannot start the pager")?);
    // 3. The data.
    let data = super::open_data(args, super::DEFAULT_SIZE)?;
    let store = FileStore::open_with(data.path(), crate::file_io(args.file_io))?;
    let ra_pages = args.ra_pages.unwrap_or_else(|| store.ra_pages());
    let file_io = store.io();
    drop(store);
    // 4. The kernel's caches and disk.
    let dropper = probe_dropper();
    let device = BlockDevice::of_file(data.path());
    if device.is_none() {
        note("the data file's disk has no readable /sys/dev/block counters: the kernel's I/O counts are unknown");
    }
    // 5. The plans and the cells.
    let len = usize::try_from(data.len()).context("the file does not fit the address space")?;
    let sample = sample_pages(data.len().div_ceil(PAGE_SIZE as u64));
    let plans = plans(&workloads, &threads, len, sample)?;
    let pages = dedup(or_default(&args.page_size, &[PageSize::Base]));
    // 2 MiB pages: their huge pages, for the run.
    let mut huge = pages.contains(&PageSize::Huge);
    let _reservation = if huge {
        match super::hugepages::Reservation::for_bytes(data.len()) {
            Ok(r) => Some(r),
            Err(why) => {
                note(&format!("page=2M skipped: {why}"));
                huge = false;
                None
            }
        }
    } else {
        None
    };
    let base = pages.contains(&PageSize::Base);
    if !base && !huge {
        bail!("no page size left to measure");
    }
    let columns = ColdEngine::columns(dropper.is_some(), base, huge);
    let mut cells = grid::cells(&workloads, |w| threads_of(w, &threads), &columns);
    // 6. The measurements.
    let bench = Bench {
        path: data.path(),
        config: &config,
        dropper: dropper.as_ref(),
        device: device.as_ref(),
        order,
        ra_pages: args.ra_pages,
        file_io,
    };
    let mut checksums = Checksums::new();
    let mut device_failed = false;
    grid::measure(&mut cells, Repetitions::Fixed(repetitions), |key, _| {
        if key.column == ColdEngine::Device && device_failed {
            return Ok(None);
        }
        let plan = plans.iter().find(|p| p.0 == (key.workload, key.threads));
        match bench.measure(key.column, plan.map(|p| &p.1)) {
            Ok(sample) => {
                if let Some(sum) = sample.checksum {
                    checksums.check((key.workload, key.threads), sum, || key.label())?;
                }
                Ok(Some(sample))
            }
            Err(err) if key.column == ColdEngine::Device => {
                note(&format!("no device column: {err:#}"));
                device_failed = true;
                Ok(None)
            }
            Err(err) => Err(err),
        }
    })?;
    // 7. The report.
    let run = Run::new(
        (&data).into(),
        started,
        workloads,
        threads,
        columns,
        cells,
        Cold {
            repetitions,
            dropped: dropper.as_ref().map(CacheDropper::what),
            device,
            order,
            ra_pages: (ra_pages, args.ra_pages.is_some()),
            file_io,
            handler_threads: args.handler_threads,
            io_threads: config.io_threads,
            sample_pages: sample,
        },
    );
    run.write(args)
}

/// Drops the kernel's caches once; `None`, with a note, if not permitted.
fn probe_dropper() -> Option<CacheDropper> {
    match CacheDropper::probe(DROP_CACHES, Caches::All) {
        Ok(dropper) => Some(dropper),
        Err(err) => {
            note(&format!(
                "cannot drop the kernel's page cache ({err}): skipping the kernel column; \
                 faultmap's store reads may come from the page cache"
            ));
            None
        }
    }
}

/// One plan per (workload, thread count); the device needs none.
fn plans(
    workloads: &[Access],
    threads: &[u16],
    len: usize,
    sample: u64,
) -> Result<Vec<((Access, u16), AccessPlan)>> {
    let mut plans = Vec::new();
    for &w in workloads {
        for t in threads_of(w, threads) {
            let plan = AccessPlan::new(w, len, usize::from(t), Coverage::Sample(sample))?;
            plans.push(((w, t), plan));
        }
    }
    Ok(plans)
}

/// Mean request size in KiB, if there was a request.
fn io_size_kib(bytes: u64, count: u64) -> Option<f64> {
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

/// MB/s (10^6 bytes) of the whole file: the device always, the others on
/// seq only (the random workloads read a sample).
fn mb_per_s(run: &Run, c: &Cell) -> Option<f64> {
    let whole_file = c.key.workload == Access::Seq || c.key.column == ColdEngine::Device;
    let seconds = c.seconds();
    (whole_file && seconds > 0.0).then(|| run.data.bytes as f64 / seconds / 1e6)
}

/// `a`'s median seconds over `b`'s at `k`: above 1, `b` was faster.
fn seconds_ratio(run: &Run, k: Key, a: ColdEngine, b: ColdEngine) -> Option<f64> {
    let s = |e| run.seconds(k.workload, k.threads, e);
    grid::ratio(s(a)?, s(b)?)
}

/// A count of `a` over the same count of `b`, at `k`.
fn count_ratio(run: &Run, k: Key, count: Count, a: ColdEngine, b: ColdEngine) -> Option<f64> {
    let c = |e| run.cell(k.workload, k.threads, e)?.median_u64(count);
    grid::ratio(c(a)? as f64, c(b)? as f64)
}

/// A count of a sample.
type Count = fn(&grid::Sample) -> Option<u64>;

/// A goal: workload, what it says, bound, at least (or at most), ratio.
type GoalSpec = (
    Access,
    &'static str,
    f64,
    bool,
    fn(&Run, Key) -> Option<f64>,
);

/// The goals of the readahead comparison on this machine.
const GOALS: [GoalSpec; 4] = [
    (
        Access::Seq,
        "readahead's rate / the device's (O_DIRECT, same run)",
        0.9,
        true,
        |r, k| seconds_ratio(r, k, ColdEngine::Device, ColdEngine::Readahead),
    ),
    (
        Access::Seq,
        "readahead's rate / kernel mmap's",
        1.2,
        true,
        |r, k| seconds_ratio(r, k, ColdEngine::Kernel, ColdEngine::Readahead),
    ),
    (
        Access::Clustered,
        "major faults, readahead / around (cut by a third)",
        2.0 / 3.0,
        false,
        |r, k| {
            let major: Count = |s| s.major_faults;
            count_ratio(r, k, major, ColdEngine::Readahead, ColdEngine::Around)
        },
    ),
    (
        Access::Rand,
        "bytes read, readahead / kernel mmap",
        1.0,
        false,
        |r, k| {
            let bytes: Count = |s| s.io_bytes;
            count_ratio(r, k, bytes, ColdEngine::Readahead, ColdEngine::Kernel)
        },
    ),
];

/// The goals, for every workload and thread count that has them.
fn goals(run: &Run) -> Vec<(Access, u16, Goal)> {
    let mut goals = Vec::new();
    for &w in &run.workloads {
        for t in threads_of(w, &run.threads) {
            for &(_, what, bound, at_least, ratio) in GOALS.iter().filter(|g| g.0 == w) {
                let key = Key {
                    workload: w,
                    threads: t,
                    column: ColdEngine::Readahead,
                };
                if let Some(value) = ratio(run, key) {
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
            // 2 MiB pages: seq at the kernel's rate at least.
            let key = Key {
                workload: w,
                threads: t,
                column: ColdEngine::Huge,
            };
            let huge = seconds_ratio(run, key, ColdEngine::Kernel, ColdEngine::Huge);
            if let Some(value) = huge.filter(|_| w == Access::Seq) {
                let goal = Goal {
                    place: format!("{}, {}", w.name(), threads_label(t)),
                    what: "page=2M's rate / kernel mmap's".to_string(),
                    value,
                    bound: 1.0,
                    at_least: true,
                };
                goals.push((w, t, goal));
            }
        }
    }
    goals
}

// ---------------------------------------------------------------------------
// The tables.
// ---------------------------------------------------------------------------

impl grid::Mode for Cold {
    type Workload = Access;
    type Column = ColdEngine;

    /// The whole report.
    fn render(run: &Run) -> String {
        let title = "faultmap bench --cold: the readahead comparison on cold caches (read-around \
                 only against full readahead),\nfaultmap against kernel mmap and the device";
        let mut out = run.header(title, header_lines(run));
        for &w in &run.workloads {
            let grid = run.grid(w, &threads_of(w, &run.threads), &LINES);
            out.push_str(&format!("\n{}: {}\n{grid}", w.name(), describe(w)));
        }
        out.push_str(&grid::goals(goals(run).iter().map(|g| &g.2)));
        out.push_str(&ra_tables(run));
        out.push_str(LEGEND);
        out
    }

    /// The settings in the document's `machine` object.
    fn settings(run: &Run) -> Value {
        let goals: Vec<_> = goals(run)
            .into_iter()
            .map(|(w, t, g)| {
                json!({"workload": w.name(), "threads": t, "what": g.what, "value": g.value,
                   "bound": g.bound, "at_least": g.at_least, "met": g.met()})
            })
            .collect();
        let m = &run.mode;
        json!({
            "cold": true,
            "repetitions": m.repetitions,
            "caches_dropped": m.dropped.map(|d| d.command()),
            "block_device": m.device.as_ref().map(|d| d.name.as_str()),
            "read_ahead_kb": m.device.as_ref().and_then(|d| d.read_ahead_kb()),
            "order": m.order,
            "ra_pages": m.ra_pages.0,
            "ra_pages_from": if m.ra_pages.1 { "argument" } else { "store" },
            "file_io": m.file_io.as_str(),
            "handler_threads": m.handler_threads,
            "io_threads": m.io_threads,
            "sample_pages": m.sample_pages,
            "wall_seconds": run.wall_seconds,
            "goals": goals,
        })
    }

    /// A cell's JSON row.
    fn row(run: &Run, cell: &Cell) -> Row {
        let faultmap = cell.key.column.readahead().is_some();
        let median = median_stats(cell);
        let mut row = Row::new(run, cell);
        row.order = faultmap.then_some(run.mode.order);
        let miss = |s: &grid::Sample| s.ra.and_then(|r| r.miss_ratio);
        row.with("pages_touched", cell.median_u64(|s| s.pages_touched))
            .with("io_size_kib", cell_io_size(cell))
            .with("miss_ratio", cell.median_f64(miss))
            .with("mb_per_second", mb_per_s(run, cell))
            .with("block_reads", cell.median_u64(|x| x.block.map(|b| b.reads)))
            .with(
                "block_read_bytes",
                cell.median_u64(|x| x.block.map(|b| b.bytes)),
            )
            .with("ra_pages", faultmap.then_some(run.mode.ra_pages.0))
            .with(
                "page_size",
                match cell.key.column {
                    ColdEngine::Huge => Some(faultmap::HUGE_PAGE_SIZE as u64),
                    ColdEngine::Around | ColdEngine::Readahead => Some(PAGE_SIZE as u64),
                    ColdEngine::Device | ColdEngine::Kernel => None,
                },
            )
            .with("stats", median.map(|m| m.0))
            .with("readahead_stats", median.map(|m| m.1))
    }

    /// Per workload, the throughput of each engine (the bytes a run read
    /// through its mapping, or the device's whole file, per second): a line
    /// per thread count over the engines.
    fn figure(run: &Run) -> Figure {
        let names: Vec<String> = run.columns.iter().map(|e| e.heading()).collect();
        let panels = run
            .workloads
            .iter()
            .map(|&w| {
                let series = threads_of(w, &run.threads)
                    .into_iter()
                    .map(|t| {
                        let points = run.columns.iter().enumerate().filter_map(|(i, &e)| {
                            let cell = run.cell(w, t, e)?;
                            let touched = cell.median_u64(|s| s.pages_touched)?;
                            let mb = (touched * PAGE_SIZE as u64) as f64 / 1e6;
                            Some((i as f64, grid::ratio(mb, cell.seconds())?))
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
}

fn header_lines(run: &Run) -> Vec<(&'static str, String)> {
    let m = &run.mode;
    let caches = match m.dropped {
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
    let disk = match &m.device {
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
    let (ra_pages, given) = m.ra_pages;
    let faultmap = format!(
        "fault-around order {}, ra_pages {} ({}, {}), file reads {}, {} handler thread(s), \
         {} I/O thread(s); a new pager per run",
        m.order,
        units::count(ra_pages),
        units::bytes(ra_pages * PAGE_SIZE as u64),
        if given {
            "--ra-pages"
        } else {
            "the store's default"
        },
        m.file_io,
        m.handler_threads,
        m.io_threads
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
                units::count(m.sample_pages)
            ),
        ),
        (
            "repetitions",
            format!(
                "{} per cell, medians shown; {:.1} s in all",
                m.repetitions, run.wall_seconds
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
        Access::Batch => "rand's sampled pages as rows in batches of 64, each read page by page",
    }
}

/// The lines of a workload's table: the measured ones (`-` where a cell has
/// no value), then the ratios (blank where a column has none; a ratio no
/// column has, without a kernel column say, is left out).
const LINES: [Line<Cold>; 10] = [
    ("seconds", |r, k| {
        measured(r, k, |_, c| Some(format!("{:.3}", c.seconds())))
    }),
    ("MB/s", |r, k| {
        measured(r, k, |r, c| Some(units::count(mb_per_s(r, c)? as u64)))
    }),
    ("major faults", |r, k| {
        measured(r, k, |_, c| {
            c.median_u64(|s| s.major_faults).map(units::count)
        })
    }),
    ("I/O count", |r, k| {
        measured(r, k, |_, c| c.median_u64(|s| s.io_count).map(units::count))
    }),
    ("I/O size, KiB", |r, k| {
        measured(r, k, |_, c| cell_io_size(c).map(|x| format!("{x:.1}")))
    }),
    ("miss ratio", |r, k| {
        let miss = |s: &grid::Sample| s.ra.and_then(|r| r.miss_ratio);
        measured(r, k, |_, c| c.median_f64(miss).map(ra_table::percent))
    }),
    ("vs device, time", |r, k| {
        // The device is seq's bound; for the random workloads a reference.
        let applies = k.workload == Access::Seq && k.column != ColdEngine::Device;
        shown(applies, || {
            seconds_ratio(r, k, ColdEngine::Device, k.column)
        })
    }),
    ("vs kernel, time", |r, k| {
        let applies = k.column.readahead().is_some();
        shown(applies, || {
            seconds_ratio(r, k, ColdEngine::Kernel, k.column)
        })
    }),
    ("major faults / around", |r, k| {
        let applies = matches!(
            k.column,
            ColdEngine::Kernel | ColdEngine::Readahead | ColdEngine::Huge
        );
        let major: Count = |s| s.major_faults;
        shown(applies, || {
            count_ratio(r, k, major, k.column, ColdEngine::Around)
        })
    }),
    ("bytes read / kernel", |r, k| {
        let applies = k.column.readahead().is_some();
        let bytes: Count = |s| s.io_bytes;
        shown(applies, || {
            count_ratio(r, k, bytes, k.column, ColdEngine::Kernel)
        })
    }),
];

/// What a measured line shows of the key's cell, `-` without one.
fn measured(run: &Run, k: Key, show: impl Fn(&Run, &Cell) -> Option<String>) -> String {
    let cell = run.cell(k.workload, k.threads, k.column);
    cell.and_then(|c| show(run, c))
        .unwrap_or_else(|| "-".into())
}

/// A ratio line's cell: the ratio with two decimals where it applies and
/// exists, blank otherwise.
fn shown(applies: bool, ratio: impl FnOnce() -> Option<f64>) -> String {
    let ratio = applies.then(ratio).flatten();
    ratio.map_or_else(String::new, |v| format!("{v:.2}"))
}

/// The readahead table of the faultmap runs that matter: seq (the first
/// thread count) and rand with full readahead, clustered with both.
fn ra_tables(run: &Run) -> String {
    let seq_threads = run.threads.first().copied().unwrap_or(1);
    let wanted = [
        (Access::Seq, seq_threads, ColdEngine::Readahead),
        (Access::Rand, 1, ColdEngine::Readahead),
        (Access::Clustered, 1, ColdEngine::Around),
        (Access::Clustered, 1, ColdEngine::Readahead),
        (Access::Seq, seq_threads, ColdEngine::Huge),
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

// ---------------------------------------------------------------------------
// The plot.
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::grid::{DataInfo, Sample};
    use crate::bench::probe::Machine;

    #[test]
    fn samples_are_a_sixteenth_within_bounds() {
        assert_eq!(sample_pages(0), 1);
        assert_eq!(sample_pages(4096), 256);
        assert_eq!(sample_pages(262_144), 16_384);
        assert_eq!(sample_pages(1 << 30), 16_384);
    }

    #[test]
    fn cells_come_per_workload_device_first() {
        use Access::*;
        let workloads = [Seq, Rand];
        let plans = plans(&workloads, &[1, 2], 64 * PAGE_SIZE, 8).unwrap();
        assert_eq!(plans.len(), 3);
        let columns = ColdEngine::columns(true, true, false);
        let cells = grid::cells(&workloads, |w| threads_of(w, &[1, 2]), &columns);
        let shape: Vec<(Access, u16, String)> = cells
            .iter()
            .map(|c| (c.key.workload, c.key.threads, c.key.column.heading()))
            .collect();
        let want = [
            (Seq, 1, "device"),
            (Seq, 1, "kernel"),
            (Seq, 1, "around"),
            (Seq, 1, "readahead"),
            (Seq, 2, "kernel"),
            (Seq, 2, "around"),
            (Seq, 2, "readahead"),
            (Rand, 1, "device"),
            (Rand, 1, "kernel"),
            (Rand, 1, "around"),
            (Rand, 1, "readahead"),
        ];
        let want: Vec<(Access, u16, String)> =
            want.iter().map(|&(w, t, c)| (w, t, c.into())).collect();
        assert_eq!(shape, want);
        // seq reads every page; rand its sample.
        assert_eq!(plans[0].1.pages_touched(), 64);
        assert_eq!(plans[2].1.pages_touched(), 8);
    }

    fn sample(seconds: f64, major: u64, bytes: u64) -> Sample {
        Sample {
            seconds,
            major_faults: Some(major),
            io_count: Some(2),
            io_bytes: Some(bytes),
            pages_touched: Some(16),
            ..Sample::default()
        }
    }

    fn cell(workload: Access, engine: ColdEngine, s: Sample) -> Cell {
        let mut c = Cell::new(workload, 1, engine);
        c.samples.push(s);
        c
    }

    fn run(cells: Vec<Cell>) -> Run {
        Run {
            machine: Machine::read(),
            data: DataInfo::test(),
            workloads: vec![Access::Seq, Access::Rand, Access::Clustered],
            threads: vec![1],
            deliveries: Vec::new(),
            columns: ColdEngine::columns(true, true, false),
            cells,
            wall_seconds: 1.0,
            mode: Cold {
                repetitions: 1,
                dropped: Some(Caches::All),
                device: None,
                order: 4,
                ra_pages: (32, false),
                file_io: FileIo::default(),
                handler_threads: 1,
                io_threads: 4,
                sample_pages: 16,
            },
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
        let v: Vec<(f64, bool)> = goals(&r).iter().map(|g| (g.2.value, g.2.met())).collect();
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
        assert!(goals(&r).is_empty());
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
        let text = <Cold as grid::Mode>::render(&r);
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
        r.cells.retain(|c| c.key.column != ColdEngine::Kernel);
        r.columns = ColdEngine::columns(false, true, false);
        let text = <Cold as grid::Mode>::render(&r);
        assert!(!text.contains("vs kernel"), "{text}");
    }
}
