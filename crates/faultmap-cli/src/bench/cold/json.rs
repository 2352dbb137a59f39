//! The cold benchmark's JSON document, `{"machine": {...}, "results":
//! [row, ...]}`, one row per measured cell in the format of DESIGN.md:
//!
//! ```text
//!   {"workload": "clustered", "threads": 1, "engine": "faultmap",
//!    "variant": "readahead=full", "order": 4, "pages": 262144,
//!    "faults": 1200, "major_faults": 225, "io_count": 953,
//!    "io_bytes": 44957696, "seconds": 0.41, "repetitions": 3,
//!    "io_size_kib": 46.1, "miss_ratio": 0.32, ...}
//! ```
//!
//! `engine` is `device`, `kernel-file` or `faultmap`; `variant` is `cold`
//! (device, kernel) or `readahead=around` / `readahead=full`. `io_count` is
//! the device's 1 MiB reads, the disk's completed reads during a kernel
//! run, or faultmap's store reads of every readahead window
//! ([`super::engine::faultmap_io_count`]). Counts are
//! medians; fields that do not apply are null (`faults` and `major_faults`
//! for the device, `miss_ratio` for all but faultmap, the kernel's I/O
//! counts without block-device counters). Extra fields: `pages_touched`,
//! `seconds_min`, `seconds_max`, `seconds_all`, `mb_per_second` (the
//! file's bytes over the time: device, and seq), `block_reads` and
//! `block_read_bytes` (the disk's reads during the run, every process's),
//! `ra_pages`, and for faultmap `stats` and `readahead_stats` (the median
//! repetition's counters and seed 001 table). The machine object adds the
//! run's settings and `goals`.

use std::io::Write;

use anyhow::Result;
use faultmap::{RaStats, Stats};
use serde::Serialize;

use super::engine::ColdEngine;
use super::results::{ColdCell, ColdRun, Goal};
use crate::access::Access;
use crate::bench::json::{write_document, MachineData};

/// The machine, the data, the run's settings and the goals.
#[derive(Serialize)]
struct MachineJson<'a> {
    #[serde(flatten)]
    head: MachineData<'a>,
    cold: bool,
    repetitions: u32,
    caches_dropped: Option<String>,
    block_device: Option<&'a str>,
    read_ahead_kb: Option<u64>,
    order: u8,
    ra_pages: u64,
    ra_pages_from: &'static str,
    file_io: &'static str,
    handler_threads: u16,
    io_threads: usize,
    sample_pages: u64,
    wall_seconds: f64,
    goals: Vec<GoalJson>,
}

/// A goal and whether it was met.
#[derive(Serialize)]
struct GoalJson {
    #[serde(flatten)]
    goal: Goal,
    met: bool,
}

/// One measured cell.
#[derive(Serialize)]
struct Row {
    workload: &'static str,
    threads: u16,
    engine: &'static str,
    variant: &'static str,
    order: Option<u8>,
    pages: u64,
    pages_touched: u64,
    faults: Option<u64>,
    major_faults: Option<u64>,
    io_count: Option<u64>,
    io_bytes: Option<u64>,
    io_size_kib: Option<f64>,
    miss_ratio: Option<f64>,
    seconds: f64,
    repetitions: usize,
    seconds_min: f64,
    seconds_max: f64,
    seconds_all: Vec<f64>,
    mb_per_second: Option<f64>,
    block_reads: Option<u64>,
    block_read_bytes: Option<u64>,
    ra_pages: Option<u64>,
    stats: Option<Stats>,
    readahead_stats: Option<RaStats>,
}

/// Writes the document, and a newline, to `out`.
pub fn write(run: &ColdRun, out: &mut impl Write) -> Result<()> {
    let results: Vec<Row> = run
        .cells
        .iter()
        .filter(|c| !c.samples.is_empty())
        .map(|c| row(run, c))
        .collect();
    write_document(out, machine(run), results)
}

fn machine(run: &ColdRun) -> MachineJson<'_> {
    MachineJson {
        head: MachineData::new(&run.machine, &run.data),
        cold: true,
        repetitions: run.repetitions,
        caches_dropped: run.dropped.map(|d| d.command()),
        block_device: run.device.as_ref().map(|d| d.name.as_str()),
        read_ahead_kb: run.device.as_ref().and_then(|d| d.read_ahead_kb()),
        order: run.order,
        ra_pages: run.ra_pages.0,
        ra_pages_from: if run.ra_pages.1 { "argument" } else { "store" },
        file_io: run.file_io.as_str(),
        handler_threads: run.handler_threads,
        io_threads: run.io_threads,
        sample_pages: run.sample_pages,
        wall_seconds: run.wall_seconds,
        goals: run
            .goals()
            .into_iter()
            .map(|goal| GoalJson {
                met: goal.met(),
                goal,
            })
            .collect(),
    }
}

fn row(run: &ColdRun, cell: &ColdCell) -> Row {
    let s = cell.summary();
    let faultmap = cell.engine.readahead().is_some();
    let whole_file = cell.workload == Access::Seq || cell.engine == ColdEngine::Device;
    let median = cell.median_stats();
    Row {
        workload: cell.workload.name(),
        threads: cell.threads,
        engine: cell.engine.name(),
        variant: cell.engine.variant(),
        order: faultmap.then_some(run.order),
        pages: run.data.pages,
        pages_touched: cell.pages_touched,
        faults: s.faults,
        major_faults: s.major_faults,
        io_count: s.io_count,
        io_bytes: s.io_bytes,
        io_size_kib: s.io_size_kib,
        miss_ratio: s.miss_ratio,
        seconds: s.seconds,
        repetitions: cell.samples.len(),
        seconds_min: s.seconds_min,
        seconds_max: s.seconds_max,
        mb_per_second: (whole_file && s.seconds > 0.0)
            .then(|| run.data.bytes as f64 / s.seconds / 1e6),
        block_reads: s.block_reads,
        block_read_bytes: s.block_bytes,
        ra_pages: faultmap.then_some(run.ra_pages.0),
        stats: median.map(|m| m.0),
        readahead_stats: median.map(|m| m.1),
        seconds_all: s.seconds_all,
    }
}
