//! `faultmap bench`: faultmap against kernel `mmap` of the same data, in one
//! process, one run. Five benchmarks, one framework ([`grid`]: engines ×
//! workloads × cells, one row type, one JSON writer, one table shape, one
//! progress bar; [`plot`]: the same numbers as an SVG with `--plot`):
//!
//! | mode              | benchmark                                        | module      |
//! |-------------------|--------------------------------------------------|-------------|
//! | (default)         | the fault-around benchmark, a representative subset | [`warm`] (here) |
//! | `--full`          | the fault-around benchmark, the whole table      | [`warm`] (here) |
//! | `--cold`          | the readahead comparison, on cold caches         | [`cold`]    |
//! | `--parts`         | the lockless page cache benchmark                | [`scaling`] |
//! | `--churn`         | the speculative fault benchmark                  | [`scaling`] |
//! | `--budget`        | a memory budget against a cgroup memory limit    | [`budget`]  |
//!
//! The fault-around benchmark measures minor faults and time per
//! fault-around order for three synthetic workloads and several thread
//! counts, with faultmap's fault-around order as the variable and two
//! kernel baselines as fixed columns:
//!
//! ```text
//!   seq          kernel-file  kernel-memfd  order=0  order=4  order=9
//!   1 thread  minor-faults        ...
//!             time, seconds       ...
//!             vs kernel-file      ...   (kernel-file time / this column's)
//! ```
//!
//! Plain `faultmap bench` measures orders 0, 4 and 9 (one page, the
//! kernel's default 64 KiB, a whole page table), [`MAIN_REPETITIONS`]
//! samples per cell, so that it answers in under two minutes here;
//! `--full` measures the seven orders of the kernel's fault-around series
//! with the [`reps`] budget policy (about 4.5 minutes). Either way the
//! headline after the tables gives faultmap's fastest order against each
//! kernel column.
//!
//! The orchestrator, [`run`], reads top to bottom:
//!
//! 1. check the arguments (orders against the library's bound, the plot's
//!    directory) before anything costly;
//! 2. start the pagers, one per delivery mode: without userfaultfd nothing
//!    else is worth doing, and the error says what is missing;
//! 3. the data ([`data`]) and every engine over it ([`engine`]): the file,
//!    its memfd copy, faultmap's object with its cache filled;
//! 4. the workloads' inputs ([`workload::Plan`]), made once, untimed;
//! 5. the measurements ([`grid::measure`]): repetitions outermost, then
//!    workload, threads and engine, so the engines of one row are measured
//!    seconds apart and machine noise hits them alike. Every walk's
//!    checksum must equal the first one of its workload: an engine that
//!    served wrong bytes fails the benchmark;
//! 6. the report ([`warm`]): the tables and the headline, or one JSON
//!    document; and the plot.
//!
//! Progress goes to stderr (an indicatif bar, hidden when stderr is not a
//! terminal); the report alone goes to stdout.
//!
//! faultmap's columns are one per fault-around order *and* fault delivery
//! mode (`--delivery`): `signal` (the faulting thread resolves its own hit
//! in a SIGBUS handler) and `handler` (a handler thread reads the
//! userfaultfd message and wakes the faulting thread), each with its own
//! pager over the one object, so the two modes map the same cached pages.

pub mod budget;
mod cold;
mod data;
mod engine;
mod grid;
mod plot;
mod probe;
mod remote;
mod reps;
mod scaling;
mod warm;
pub mod workload;

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use faultmap::{Config, Delivery, MapOptions, Pager, PAGE_SIZE};

use self::data::Data;
use self::engine::{Engine, Engines};
use self::grid::{Cell, Checksums, DataInfo};
use self::reps::Repetitions;
use self::warm::Key;
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

/// The fault-around benchmark's workloads without `--workload`.
const WARM_WORKLOADS: [Workload; 3] = [Workload::Seq, Workload::Rand, Workload::Sparse];

/// The orders of `--full` without `--orders`: the kernel's fault-around
/// series.
const FULL_ORDERS: [u8; 7] = [0, 1, 3, 4, 5, 7, 9];

/// The orders of plain `faultmap bench` without `--orders`: one page, the
/// kernel's default (64 KiB) and a whole page table (2 MiB).
const MAIN_ORDERS: [u8; 3] = [0, 4, 9];

/// Samples per cell of plain `faultmap bench` without `--repetitions`: the
/// median of 3, and the whole run (1 GiB) in about 90 s here.
const MAIN_REPETITIONS: u32 = 3;

/// The delivery modes without `--delivery`.
const WARM_DELIVERIES: [DeliveryArg; 2] = [DeliveryArg::Signal, DeliveryArg::Handler];

/// Thread counts without `--threads` (warm and cold).
const DEFAULT_THREADS: [u16; 2] = [1, 2];

/// The generated file's size without `--size` (warm and cold).
const DEFAULT_SIZE: u64 = 1 << 30;

impl Settings {
    fn from_args(args: &BenchArgs) -> Result<Settings> {
        let default_orders: &[u8] = if args.full {
            &FULL_ORDERS
        } else {
            &MAIN_ORDERS
        };
        let orders = dedup(or_default(&args.orders, default_orders));
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
        let reps = match (args.repetitions, args.full) {
            (Some(n), _) => Repetitions::Fixed(n),
            (None, true) => Repetitions::Budget,
            (None, false) => Repetitions::Fixed(MAIN_REPETITIONS),
        };
        Ok(Settings {
            workloads,
            threads: dedup(or_default(&args.threads, &DEFAULT_THREADS)),
            engines: Engine::all(&orders, &deliveries),
            deliveries,
            reps,
        })
    }

    /// Every cell, in measurement order.
    fn cells(&self) -> Vec<warm::Cell> {
        let mut cells = Vec::new();
        for &workload in &self.workloads {
            for &threads in &self.threads {
                for &engine in &self.engines {
                    cells.push(Cell::new(Key {
                        workload,
                        threads,
                        engine,
                    }));
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
/// `--parts` or `--churn`, [`scaling::run`]; with `--budget`,
/// [`budget::run`]).
pub use remote::engines::StoreKind as RemoteStore;

/// The options of `--remote`, from the command line.
fn remote_options(args: &BenchArgs) -> Result<remote::RemoteOptions> {
    use crate::access::Access;
    let workloads = if args.workload.is_empty() {
        vec![Access::Seq, Access::Rand, Access::Clustered]
    } else {
        args.workload
            .iter()
            .map(|w| match w {
                Workload::Seq => Ok(Access::Seq),
                Workload::Rand => Ok(Access::Rand),
                Workload::Clustered => Ok(Access::Clustered),
                Workload::Sparse => {
                    anyhow::bail!("--remote runs seq, rand and clustered, not sparse")
                }
            })
            .collect::<Result<_>>()?
    };
    Ok(remote::RemoteOptions {
        stores: if args.store.is_empty() {
            vec![RemoteStore::Http, RemoteStore::S3]
        } else {
            args.store.clone()
        },
        workloads,
        latencies_ms: if args.latency_ms.is_empty() {
            vec![0]
        } else {
            args.latency_ms.clone()
        },
        threads: if args.threads.is_empty() {
            vec![1, 2]
        } else {
            args.threads.clone()
        },
        size: args.size.unwrap_or(DEFAULT_SIZE),
        repetitions: args.repetitions.unwrap_or(3),
        budget: args.memory_budget,
        sample_pages: args.sample_pages.unwrap_or(300),
        no_fuse: args.no_fuse,
        json: args.json,
        state: std::path::PathBuf::from("target/bench-remote"),
    })
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
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
    if args.remote {
        return remote::run(&remote_options(args)?);
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
    let mut checksums = Checksums::new();
    let label = |k: &Key| {
        let delivery = k.engine.delivery().map_or("", crate::delivery_name);
        let engine = format!("{} {delivery}", k.engine.column());
        format!(
            "{} × {} on {}",
            k.workload.name(),
            k.threads,
            engine.trim_end()
        )
    };
    let repetitions = grid::measure(&mut cells, settings.reps, label, |key, _| {
        let plan = plans
            .iter()
            .find(|p| p.workload() == key.workload)
            .context("a workload without a plan")?;
        let sample = engines.measure(key.engine, plan, usize::from(key.threads))?;
        checksums.check(key.workload, sample.checksum, || {
            format!("{} on {}", key.engine.column(), key.workload.name())
        })?;
        Ok(Some(sample))
    })?;
    // 6. The report.
    let run = warm::Run {
        machine: probe::Machine::read(),
        data: data_info(&data),
        full: args.full,
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
    report(
        args,
        |out| warm::write_json(&run, out),
        || warm::render(&run),
        || warm::figure(&run),
    )
}

/// Writes a benchmark's report on stdout (its JSON document with
/// `--json`, else its text), and with `--plot` its figure.
fn report<W: FnOnce(&mut std::io::StdoutLock<'static>) -> Result<()>>(
    args: &BenchArgs,
    json: W,
    text: impl FnOnce() -> String,
    figure: impl FnOnce() -> plot::Figure,
) -> Result<()> {
    if let Some(path) = &args.plot {
        plot::write(&figure(), path)?;
        note(&format!("plot written to {}", path.display()));
    }
    crate::output::print(args.json, json, text)
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
}
