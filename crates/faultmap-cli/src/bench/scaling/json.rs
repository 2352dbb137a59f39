//! The parts and churn JSON document, `{"machine": {...}, "results":
//! [row, ...]}`, one row per measured cell in the format of DESIGN.md:
//!
//! ```text
//!   {"workload": "parts", "threads": 2, "engine": "faultmap",
//!    "variant": "cache=lock-free", "order": 0, "pages": 65536,
//!    "faults": 65536, "major_faults": 0, "io_count": 0, "io_bytes": 0,
//!    "seconds": 0.31, "repetitions": 5, "delivery": "signal",
//!    "faults_per_second": 211406.5, ...}
//! ```
//!
//! `workload` is `parts` or `churn`; `engine` is `kernel-memfd` or
//! `faultmap`; `variant` is `default` (the kernel), `cache=lock-free` or
//! `cache=global-mutex` (parts), `lookup=speculative` or `lookup=classic`
//! (churn), followed by `,delivery=handler` for handler delivery. Counts
//! and rates are medians. Extra fields: `delivery`, `cache` and
//! `region_lookup` (faultmap), `pages_touched`, `faults_per_second`,
//! `pages_per_second`, `seconds_min`, `seconds_max`, `seconds_all`, for
//! churn `maps` and `maps_per_second` (the churn thread's), and for
//! faultmap `spf_success`, `spf_abort`, `spf_fallback`, `forwarded` and the
//! whole `stats` of the median sample by faults/s. Fields that do not apply
//! are null. The machine object adds the run's settings and `goals`.

use std::io::Write;

use anyhow::Result;
use faultmap::Stats;
use serde::Serialize;

use super::churn::{CHURN_LIVE, CHURN_PAGES};
use super::results::{Cell, Goal, ScaleRun};
use super::{Column, Kind};
use crate::bench::json::{write_document, MachineData};

/// The machine, the data, the run's settings and the goals.
#[derive(Serialize)]
struct MachineJson<'a> {
    #[serde(flatten)]
    head: MachineData<'a>,
    benchmark: &'static str,
    repetitions: u32,
    handler_threads: u16,
    order: u8,
    deliveries: Vec<&'static str>,
    duration_seconds: Option<f64>,
    churn_region_pages: Option<u64>,
    churn_live_regions: Option<usize>,
    faultmap_warm_seconds: f64,
    faultmap_warm_io_count: u64,
    faultmap_warm_io_bytes: u64,
    faultmap_cached_pct: f64,
    wall_seconds: f64,
    goals: Vec<GoalJson>,
}

/// A goal and whether it was met.
#[derive(Serialize)]
struct GoalJson {
    what: String,
    threads: u16,
    delivery: &'static str,
    value: f64,
    at_least: f64,
    met: bool,
}

/// One measured cell.
#[derive(Serialize)]
struct Row {
    workload: &'static str,
    threads: u16,
    engine: &'static str,
    variant: String,
    order: Option<u8>,
    pages: u64,
    faults: u64,
    major_faults: u64,
    io_count: Option<u64>,
    io_bytes: Option<u64>,
    seconds: f64,
    repetitions: usize,
    delivery: Option<&'static str>,
    cache: Option<&'static str>,
    region_lookup: Option<&'static str>,
    pages_touched: u64,
    faults_per_second: f64,
    pages_per_second: f64,
    seconds_min: f64,
    seconds_max: f64,
    seconds_all: Vec<f64>,
    maps: Option<u64>,
    maps_per_second: Option<f64>,
    spf_success: Option<u64>,
    spf_abort: Option<u64>,
    spf_fallback: Option<u64>,
    forwarded: Option<u64>,
    stats: Option<Stats>,
}

/// Writes the document, and a newline, to `out`.
pub fn write(run: &ScaleRun, out: &mut impl Write) -> Result<()> {
    let results: Vec<Row> = run.cells.iter().map(|c| row(run, c)).collect();
    write_document(out, machine(run), results)
}

fn machine(run: &ScaleRun) -> MachineJson<'_> {
    let churn = run.kind == Kind::Churn;
    MachineJson {
        head: MachineData::new(&run.machine, &run.data),
        benchmark: run.kind.name(),
        repetitions: run.repetitions,
        handler_threads: run.handler_threads,
        order: 0,
        deliveries: run
            .deliveries
            .iter()
            .map(|&d| crate::delivery_name(d))
            .collect(),
        duration_seconds: run.duration.map(|d| d.as_secs_f64()),
        churn_region_pages: churn.then_some(CHURN_PAGES),
        churn_live_regions: churn.then_some(CHURN_LIVE),
        faultmap_warm_seconds: run.warm_up.seconds,
        faultmap_warm_io_count: run.warm_up.stats.io_count,
        faultmap_warm_io_bytes: run.warm_up.stats.io_bytes,
        faultmap_cached_pct: run.warm_up.cached_pct,
        wall_seconds: run.wall_seconds,
        goals: run.goals().iter().map(goal).collect(),
    }
}

fn goal(g: &Goal) -> GoalJson {
    GoalJson {
        what: g.what.clone(),
        threads: g.threads,
        delivery: crate::delivery_name(g.delivery),
        value: g.value,
        at_least: g.bound,
        met: g.met(),
    }
}

fn row(run: &ScaleRun, cell: &Cell) -> Row {
    let s = cell.summary();
    let faultmap = matches!(cell.column, Column::Faultmap { .. });
    let setting = cell.column.setting();
    let of = |key| setting.filter(|s| s.key() == key).map(|s| s.name());
    let counter = |f: fn(&Stats) -> u64| s.stats.as_ref().map(f);
    Row {
        workload: run.kind.name(),
        threads: cell.threads,
        engine: cell.column.engine(),
        variant: cell.column.variant(),
        order: faultmap.then_some(0),
        pages: run.data.pages,
        faults: s.faults,
        major_faults: s.major_faults,
        io_count: counter(|x| x.io_count),
        io_bytes: counter(|x| x.io_bytes),
        seconds: s.seconds,
        repetitions: cell.samples.len(),
        delivery: cell.column.delivery().map(crate::delivery_name),
        cache: of("cache"),
        region_lookup: of("lookup"),
        pages_touched: s.pages_touched,
        faults_per_second: s.faults_per_second,
        pages_per_second: s.pages_per_second,
        seconds_min: s.seconds_min,
        seconds_max: s.seconds_max,
        seconds_all: s.seconds_all,
        maps: s.maps,
        maps_per_second: s.maps_per_second,
        spf_success: counter(|x| x.spf_success),
        spf_abort: counter(|x| x.spf_abort),
        spf_fallback: counter(|x| x.spf_fallback),
        forwarded: counter(|x| x.forwarded),
        stats: s.stats,
    }
}
