//! `faultmap bench`: the seeds' benchmarks, faultmap against kernel `mmap`
//! of the same data, in one process, one run.
//!
//! Seed 000 (the kernel's fault-around series) measured minor faults and time
//! per `FAULT_AROUND_ORDER` for three synthetic workloads and several thread
//! counts. This module reproduces that table with faultmap's fault-around
//! order as the variable and two kernel baselines as fixed columns:
//!
//! ```text
//!   seq          kernel-file  kernel-memfd  order=0  order=1  ...  order=9
//!   1 thread  minor-faults        ...
//!             time, seconds       ...
//!             vs kernel-file      ...   (kernel-file time / this column's)
//! ```
//!
//! The orchestrator, [`run`], reads top to bottom:
//!
//! 1. check the arguments (orders against the library's bound) before
//!    anything costly;
//! 2. start the pager: without userfaultfd nothing else is worth doing, and
//!    its error says what is missing;
//! 3. the data ([`data`]) and every engine over it ([`engine`]): the file,
//!    its memfd copy, faultmap's object with its cache filled;
//! 4. the workloads' inputs ([`workload::Plan`]), made once, untimed;
//! 5. the measurements: repetitions outermost ([`reps`] decides how many),
//!    then workload, threads and engine, so the engines of one row are
//!    measured seconds apart and machine noise hits them alike. Every
//!    walk's checksum must equal the first one of its workload: an engine
//!    that served wrong bytes fails the benchmark;
//! 6. the report: a table in the seed's shape ([`report`]) or one JSON
//!    document ([`json`]).
//!
//! Progress goes to stderr (an indicatif bar, hidden when stderr is not a
//! terminal); the report alone goes to stdout.
//!
//! faultmap's columns are one per fault-around order *and* fault delivery
//! mode (`--delivery`): `signal` (the faulting thread resolves its own hit
//! in a SIGBUS handler) and `handler` (a handler thread reads the
//! userfaultfd message and wakes the faulting thread), each with its own
//! pager over the one object, so the two modes map the same cached pages.
//!
//! `--cold` runs another benchmark, seed 001's readahead comparison on cold
//! caches, with its own orchestrator: see [`cold`]. `--parts` and
//! `--churn` run seed 003's and seed 004's concurrency benchmarks: see
//! [`scaling`]. `--budget` runs a memory budget against the kernel under a
//! cgroup memory limit: see [`budget`].

pub mod budget;
mod cold;
mod data;
mod engine;
mod json;
mod probe;
mod report;
mod reps;
mod results;
mod scaling;
pub mod workload;

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use faultmap::{Config, Delivery, MapOptions, Pager, PAGE_SIZE};
use indicatif::{ProgressBar, ProgressStyle};

use self::data::Data;
use self::engine::{Engine, Engines};
use self::reps::Repetitions;
use self::results::{Cell, DataInfo, Run};
use self::workload::{Plan, Workload};
use crate::units;
use crate::{BenchArgs, DeliveryArg};

/// The arguments, checked and de-duplicated.
#[derive(Debug)]
struct Settings {
    workloads: Vec<Workload>,
    threads: Vec<u16>,
    deliveries: Vec<Delivery>,
    engines: Vec<Engine>,
    reps: Repetitions,
}

/// The warm benchmark's workloads without `--workload`.
const WARM_WORKLOADS: [Workload; 3] = [Workload::Seq, Workload::Rand, Workload::Sparse];

/// The warm benchmark's orders without `--orders`.
const WARM_ORDERS: [u8; 7] = [0, 1, 3, 4, 5, 7, 9];

/// The warm benchmark's delivery modes without `--delivery`.
const WARM_DELIVERIES: [DeliveryArg; 2] = [DeliveryArg::Signal, DeliveryArg::Handler];

/// Thread counts without `--threads` (warm and cold).
const DEFAULT_THREADS: [u16; 2] = [1, 2];

/// The generated file's size without `--size` (warm and cold).
const DEFAULT_SIZE: u64 = 1 << 30;

impl Settings {
    fn from_args(args: &BenchArgs) -> Result<Settings> {
        let orders = dedup(or_default(&args.orders, &WARM_ORDERS));
        for &order in &orders {
            MapOptions::new().fault_around_order(order).validate()?;
        }
        let workloads = dedup(or_default(&args.workload, &WARM_WORKLOADS));
        if let Some(w) = workloads.iter().find(|w| !w.is_warm()) {
            bail!(
                "workload {} is a workload of the cold benchmark: add --cold",
                w.name()
            );
        }
        let deliveries = deliveries(&args.delivery, &WARM_DELIVERIES);
        Ok(Settings {
            workloads,
            threads: dedup(or_default(&args.threads, &DEFAULT_THREADS)),
            engines: Engine::all(&orders, &deliveries),
            deliveries,
            reps: Repetitions::from_arg(args.repetitions),
        })
    }

    /// Every cell, in measurement order.
    fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for &w in &self.workloads {
            for &t in &self.threads {
                for &e in &self.engines {
                    cells.push(Cell::new(w, t, e));
                }
            }
        }
        cells
    }
}

/// `list`, or `default` if it is empty (the option was not given).
fn or_default<'a, T>(list: &'a [T], default: &'a [T]) -> &'a [T] {
    if list.is_empty() {
        default
    } else {
        list
    }
}

/// The library's delivery modes of `--delivery`, or of `default` without
/// it, in order, without repeats.
fn deliveries(arg: &[DeliveryArg], default: &[DeliveryArg]) -> Vec<Delivery> {
    dedup(or_default(arg, default))
        .into_iter()
        .map(DeliveryArg::mode)
        .collect()
}

/// The items of `list` in order, without repeats.
fn dedup<T: PartialEq + Copy>(list: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity(list.len());
    for &x in list {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// Runs `faultmap bench` (or, with `--cold`, [`cold::run`]; with
/// `--parts` or `--churn`, [`scaling::run`]).
pub fn run(args: &BenchArgs) -> Result<()> {
    if args.cold {
        return cold::run(args);
    }
    if args.parts {
        return scaling::run(args, scaling::Kind::Parts);
    }
    if args.churn {
        return scaling::run(args, scaling::Kind::Churn);
    }
    if args.budget {
        return budget::run(args);
    }
    let started = Instant::now();
    // 1. The arguments.
    let settings = Settings::from_args(args)?;
    let config = crate::stats::pager_config(args.handler_threads, args.io_threads);
    config.validate()?;
    // 2. The pagers, one per delivery mode.
    let pagers = settings
        .deliveries
        .iter()
        .map(|&d| start_pager(config.clone().delivery(d)).map(|p| (d, p)))
        .collect::<Result<Vec<_>>>()?;
    // 3. The data and the engines.
    let data = open_data(args, DEFAULT_SIZE)?;
    note("copying it into a memfd and filling faultmap's cache");
    let mut engines = Engines::new(&data, pagers)?;
    // 4. The workloads' inputs.
    let len = usize::try_from(data.len()).context("the file does not fit the address space")?;
    let max_threads = settings
        .threads
        .iter()
        .copied()
        .max()
        .map_or(1, usize::from);
    let plans = settings
        .workloads
        .iter()
        .map(|&w| Plan::new(w, len, max_threads))
        .collect::<Result<Vec<_>>>()?;
    // 5. The measurements.
    let mut cells = settings.cells();
    let repetitions = measure_all(&mut engines, &plans, settings.reps, &mut cells)?;
    // 6. The report.
    let run = Run {
        machine: probe::Machine::read(),
        data: data_info(&data),
        workloads: settings.workloads,
        threads: settings.threads,
        deliveries: settings.deliveries,
        engines: settings.engines,
        repetitions,
        repetitions_from: settings.reps.from(),
        handler_threads: args.handler_threads,
        warm_up: engines.warm_up(),
        cells,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    crate::output::print(
        args.json,
        |out| json::write(&run, out),
        || report::render(&run),
    )
}

/// A pager with `config`; its error names the delivery mode.
fn start_pager(config: Config) -> Result<Pager> {
    let delivery = crate::delivery_name(config.delivery);
    Pager::new(config).with_context(|| format!("cannot start the pager ({delivery} delivery)"))
}

/// The `--file`, or a generated file of `--size` bytes (`default_size`
/// without it).
fn open_data(args: &BenchArgs, default_size: u64) -> Result<Data> {
    match &args.file {
        Some(path) => Data::existing(path),
        None => {
            let size = args.size.unwrap_or(default_size);
            note(&format!("writing a {} data file", units::bytes(size)));
            Data::generate(size)
        }
    }
}

/// What the report says about the data.
fn data_info(data: &Data) -> DataInfo {
    DataInfo {
        path: data.path().display().to_string(),
        generated: data.generated(),
        bytes: data.len(),
        pages: data.len().div_ceil(PAGE_SIZE as u64),
    }
}

/// Measures the cells in passes, each cell as often as `reps` wants (see
/// [`reps`]); returns the number of passes.
fn measure_all(
    engines: &mut Engines,
    plans: &[Plan],
    reps: Repetitions,
    cells: &mut [Cell],
) -> Result<u32> {
    let started = Instant::now();
    let bar = progress_bar();
    let mut checksums: Vec<Option<u64>> = vec![None; plans.len()];
    let mut passes = 0;
    for pass in 0..reps.max_passes() {
        let wanted: Vec<usize> = (0..cells.len())
            .filter(|&c| {
                let cell = &cells[c];
                let spent: f64 = cell.samples.iter().map(|s| s.seconds).sum();
                let samples = u32::try_from(cell.samples.len()).unwrap_or(u32::MAX);
                reps.wants(samples, Duration::from_secs_f64(spent), started.elapsed())
            })
            .collect();
        if wanted.is_empty() {
            break;
        }
        passes += 1;
        bar.inc_length(wanted.len() as u64);
        for c in wanted {
            let cell = &mut cells[c];
            bar.set_message(format!(
                "pass {}: {} × {} on {}",
                pass + 1,
                cell.workload.name(),
                cell.threads,
                cell.engine.column()
            ));
            let i = plans
                .iter()
                .position(|p| p.workload() == cell.workload)
                .context("a workload without a plan")?;
            let sample = engines.measure(cell.engine, &plans[i], usize::from(cell.threads))?;
            check_checksum(&mut checksums[i], sample.checksum, cell)?;
            cell.samples.push(sample);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(passes)
}

/// Fails if a walk read other bytes than the first walk of its workload.
fn check_checksum(expected: &mut Option<u64>, got: u64, cell: &Cell) -> Result<()> {
    match *expected {
        None => *expected = Some(got),
        Some(want) if want != got => bail!(
            "{} read different data than the first engine on {} (word sum {got:#x}, expected {want:#x})",
            cell.engine.column(),
            cell.workload.name()
        ),
        Some(_) => {}
    }
    Ok(())
}

/// The progress bar on stderr (indicatif hides it when stderr is not a
/// terminal).
fn progress_bar() -> ProgressBar {
    let style = ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(0).with_style(style)
}

/// A line of information on stderr (never on stdout, which holds the report).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "faultmap bench: {text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedups_in_order() {
        assert_eq!(dedup(&[4, 1, 4, 9, 1]), [4, 1, 9]);
        assert_eq!(or_default(&[], &[1, 2]), [1, 2]);
        assert_eq!(or_default(&[3], &[1, 2]), [3]);
    }

    #[test]
    fn a_different_checksum_fails() {
        let engine = Engine::Faultmap {
            order: 4,
            delivery: Delivery::Signal,
        };
        let cell = Cell::new(Workload::Seq, 1, engine);
        let mut expected = None;
        check_checksum(&mut expected, 7, &cell).unwrap();
        check_checksum(&mut expected, 7, &cell).unwrap();
        assert!(check_checksum(&mut expected, 8, &cell).is_err());
    }
}
