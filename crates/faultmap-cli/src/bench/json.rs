//! The JSON report: `{"machine": {...}, "results": [row, ...]}`, one row per
//! measured cell, in the format of DESIGN.md ("Benchmarks reproduce the
//! seeds"):
//!
//! ```text
//!   {"workload": "seq", "threads": 1, "engine": "faultmap",
//!    "variant": "order=4", "order": 4, "pages": 262144, "faults": 16384,
//!    "major_faults": 0, "io_count": 0, "io_bytes": 0, "seconds": 0.071,
//!    "repetitions": 5, ...}
//! ```
//!
//! `seconds` and the counts are medians over the repetitions. Fields that do
//! not apply to an engine are null (`order`, `io_count`, `io_bytes` for the
//! kernel engines; `folios`, `resident_pct` for faultmap). Extra fields:
//! `delivery` (faultmap: `signal` or `handler`; the variant names it when it
//! is not the library's default, signal: `order=4,delivery=handler`),
//! `seconds_min`, `seconds_max`, `seconds_all` (every repetition, in order),
//! `fault_around_pages` (faultmap's `pgfault_around`), `folios` and
//! `folio_sample` (kernel engines: `large`, `4k`, `mixed` or `unknown`, and
//! the sampled counts), `resident_pct` (kernel-file: the lowest residency
//! before a repetition).

use std::io::Write;

use anyhow::Result;
use serde::Serialize;

use super::engine::Engine;
use super::probe::{FolioSample, Machine};
use super::reps::BUDGET;
use super::results::{Cell, DataInfo, RepsFrom, Run};

/// The whole document of every benchmark: `{"machine": {...}, "results":
/// [row, ...]}`.
#[derive(Serialize)]
struct Document<M, R> {
    machine: M,
    results: Vec<R>,
}

/// Writes one benchmark's document, and a newline, to `out`.
pub fn write_document(
    out: &mut impl Write,
    machine: impl Serialize,
    results: Vec<impl Serialize>,
) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, &Document { machine, results })?;
    writeln!(out)?;
    Ok(())
}

/// The machine and the data: the first fields of the machine object, also
/// of the cold benchmark's.
#[derive(Serialize)]
pub(super) struct MachineData<'a> {
    #[serde(flatten)]
    machine: &'a Machine,
    data: &'a str,
    data_generated: bool,
    file_bytes: u64,
    pages: u64,
}

impl<'a> MachineData<'a> {
    pub(super) fn new(machine: &'a Machine, data: &'a DataInfo) -> MachineData<'a> {
        MachineData {
            machine,
            data: &data.path,
            data_generated: data.generated,
            file_bytes: data.bytes,
            pages: data.pages,
        }
    }
}

/// The machine, the data and the run's settings.
#[derive(Serialize)]
struct MachineJson<'a> {
    #[serde(flatten)]
    head: MachineData<'a>,
    repetitions: u32,
    repetitions_from: &'static str,
    repetitions_budget_seconds: Option<u64>,
    handler_threads: u16,
    deliveries: Vec<&'static str>,
    kernel_file_folios: &'static str,
    kernel_file_resident_pct_min: Option<f64>,
    kernel_memfd_folios: &'static str,
    faultmap_warm_seconds: f64,
    faultmap_warm_io_count: u64,
    faultmap_warm_io_bytes: u64,
    faultmap_cached_pct: f64,
    wall_seconds: f64,
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
    seconds_min: f64,
    seconds_max: f64,
    seconds_all: Vec<f64>,
    fault_around_pages: Option<u64>,
    folios: Option<&'static str>,
    folio_sample: Option<FolioSample>,
    resident_pct: Option<f64>,
}

/// Writes the document, and a newline, to `out`.
pub fn write(run: &Run, out: &mut impl Write) -> Result<()> {
    let results: Vec<Row> = run.cells.iter().map(|c| row(run, c)).collect();
    write_document(out, machine(run), results)
}

fn machine(run: &Run) -> MachineJson<'_> {
    let kind = |e| run.folios(e).unwrap_or_default().kind().name();
    MachineJson {
        head: MachineData::new(&run.machine, &run.data),
        repetitions: run.repetitions,
        repetitions_from: match run.repetitions_from {
            RepsFrom::Argument => "argument",
            RepsFrom::Budget => "budget",
        },
        repetitions_budget_seconds: (run.repetitions_from == RepsFrom::Budget)
            .then(|| BUDGET.as_secs()),
        handler_threads: run.handler_threads,
        deliveries: run
            .deliveries
            .iter()
            .map(|&d| crate::delivery_name(d))
            .collect(),
        kernel_file_folios: kind(Engine::KernelFile),
        kernel_file_resident_pct_min: run.min_resident_pct(),
        kernel_memfd_folios: kind(Engine::KernelMemfd),
        faultmap_warm_seconds: run.warm_up.seconds,
        faultmap_warm_io_count: run.warm_up.stats.io_count,
        faultmap_warm_io_bytes: run.warm_up.stats.io_bytes,
        faultmap_cached_pct: run.warm_up.cached_pct,
        wall_seconds: run.wall_seconds,
    }
}

fn row(run: &Run, cell: &Cell) -> Row {
    let s = cell.summary();
    Row {
        workload: cell.workload.name(),
        threads: cell.threads,
        engine: cell.engine.name(),
        variant: cell.engine.variant(),
        order: cell.engine.order(),
        pages: run.data.pages,
        faults: s.faults,
        major_faults: s.major_faults,
        io_count: s.io_count,
        io_bytes: s.io_bytes,
        seconds: s.seconds,
        repetitions: cell.samples.len(),
        delivery: cell.engine.delivery().map(crate::delivery_name),
        seconds_min: s.seconds_min,
        seconds_max: s.seconds_max,
        seconds_all: s.seconds_all,
        fault_around_pages: s.fault_around_pages,
        folios: s.folios.map(|f| f.kind().name()),
        folio_sample: s.folios,
        resident_pct: s.resident_pct,
    }
}
