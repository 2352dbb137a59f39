//! `faultmap bench`: faultmap against kernel `mmap` of the same data, in one
//! process, one run. Six benchmarks, one framework ([`grid`]: engines ×
//! workloads × cells, one sample and row type, one JSON writer, one table
//! renderer, one progress bar; [`plot`]: the same numbers as an SVG with
//! `--plot`):
//!
//! | mode              | benchmark                                           | module      |
//! |-------------------|-----------------------------------------------------|-------------|
//! | (default)         | the fault-around benchmark, a representative subset | [`warm`]    |
//! | `--full`          | the fault-around benchmark, the whole table         | [`warm`]    |
//! | `--cold`          | the readahead comparison, on cold caches            | [`cold`]    |
//! | `--parts`         | the lockless page cache benchmark                   | [`scaling`] |
//! | `--churn`         | the speculative fault benchmark                     | [`scaling`] |
//! | `--budget`        | a memory budget against a cgroup memory limit       | [`budget`]  |
//! | `--remote`        | HTTP and S3 objects against ranged GETs and FUSE    | `remote`    |
//! | `--procs N,..`    | N processes on one remote object: shared, private, FUSE | `remote`    |
//! | `--remote --disk-cache` | first and second runs through disk caches: faultmap's, the FUSE peers' | `remote` |
//!
//! An option of one mode given to another is refused
//! (`check_mode_options`), never ignored.
//!
//! Each mode's orchestrator reads top to bottom in numbered steps: the
//! arguments, checked before anything costly (here, the plot's directory
//! first); a pager, so that a missing userfaultfd fails at once; the data;
//! the cells; the measurements ([`grid::measure`]); the report. Progress
//! goes to stderr (an indicatif bar, hidden when stderr is not a
//! terminal); the report alone goes to stdout.

pub mod budget;
mod cold;
mod data;
mod engine;
mod grid;
mod hugepages;
mod plot;
mod probe;
mod remote;
mod reps;
mod scaling;
mod uffd_probe;
mod warm;
pub mod workload;

use std::io::Write;

use crate::Fault;
use anyhow::{Context, Result};
use faultmap::{Config, Pager};

use self::data::Data;
use crate::units;
use crate::{BenchArgs, DeliveryArg, EngineArg};

/// Thread counts without `--threads` (warm and cold).
const DEFAULT_THREADS: [u16; 2] = [1, 2];

/// The generated file's size without `--size` (warm and cold).
const DEFAULT_SIZE: u64 = 1 << 30;
/// The object of `--procs` (each process may read all of it).
const PROCS_SIZE: u64 = 256 << 20;

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
fn deliveries(arg: &[DeliveryArg], default: &[DeliveryArg]) -> Vec<Fault> {
    dedup(or_default(arg, default))
        .into_iter()
        .map(DeliveryArg::mode)
        .collect()
}

/// How faultmap's columns fault: for `--engine userfaultfd` (the default)
/// the delivery modes of `--delivery` (or `default`), then `protect` for
/// `--engine protect`.
fn faults(args: &BenchArgs, default: &[DeliveryArg]) -> Vec<Fault> {
    let mut out = Vec::new();
    for engine in dedup(or_default(&args.engine, &[EngineArg::Userfaultfd])) {
        match engine {
            EngineArg::Userfaultfd => out.extend(deliveries(&args.delivery, default)),
            EngineArg::Protect => out.push(Fault::Protect),
        }
    }
    out
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

pub use remote::engines::StoreKind as RemoteStore;

/// The options of `--remote`, from the command line.
fn remote_options(args: &BenchArgs) -> Result<remote::RemoteOptions> {
    use crate::access::Access;
    let workloads = if args.workload.is_empty() && !args.procs.is_empty() {
        vec![Access::Seq, Access::Rand]
    } else if args.workload.is_empty() && args.disk_cache {
        vec![Access::Seq]
    } else if args.workload.is_empty() {
        vec![Access::Seq, Access::Rand, Access::Clustered]
    } else {
        args.workload
            .iter()
            .map(|w| match w {
                workload::Workload::Seq => Ok(Access::Seq),
                workload::Workload::Rand => Ok(Access::Rand),
                workload::Workload::Clustered => Ok(Access::Clustered),
                workload::Workload::Batch => Ok(Access::Batch),
                workload::Workload::Sparse
                | workload::Workload::Scattered
                | workload::Workload::Pages
                | workload::Workload::Hotcold => {
                    anyhow::bail!(
                        "--remote runs seq, rand, clustered and batch, not {}",
                        w.name()
                    )
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
        threads: if args.threads.is_empty() && args.disk_cache {
            vec![1]
        } else if args.threads.is_empty() {
            vec![1, 2]
        } else {
            args.threads.clone()
        },
        size: args.size.unwrap_or(if args.procs.is_empty() {
            DEFAULT_SIZE
        } else {
            PROCS_SIZE
        }),
        repetitions: args.repetitions.unwrap_or(3),
        budget: args.memory_budget,
        config: crate::stats::pager_config(args.handler_threads, args.io_threads),
        sample_pages: args.sample_pages.unwrap_or(300),
        no_fuse: args.no_fuse,
        // Beside the scripts, in the source tree's target folder: the
        // generated object is kept there for the next run.
        state: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-remote"),
        procs: args.procs.clone(),
        protect: args.engine.contains(&EngineArg::Protect),
        disk_cache: args.disk_cache,
    })
}

/// Runs `faultmap bench`: the fault-around benchmark ([`warm::run`]), or
/// with `--cold` [`cold::run`], with `--parts` or `--churn`
/// [`scaling::run`], with `--budget` [`budget::run`], with `--remote`
/// [`remote::run`].
pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
    check_mode_options(args)?;
    if args.cold {
        cold::run(args)
    } else if args.parts {
        scaling::run(args, scaling::Kind::Parts)
    } else if args.churn {
        scaling::run(args, scaling::Kind::Churn)
    } else if args.budget {
        budget::run(args)
    } else if args.remote || !args.procs.is_empty() {
        remote::run(&remote_options(args)?, args)
    } else {
        warm::run(args)
    }
}

/// Refuses an option of one benchmark given to another. clap's `requires`
/// is not enough: it is not checked when an option that conflicts with the
/// required one is given (`--budget --ra-pages 3` would pass it, `--budget`
/// conflicting with `--cold`), and the option would be silently ignored.
fn check_mode_options(args: &BenchArgs) -> Result<()> {
    let remote = args.remote || !args.procs.is_empty();
    let given: [(&str, bool, bool, &str); 11] = [
        (
            "--disk-cache",
            args.disk_cache,
            args.remote && args.procs.is_empty(),
            "--remote (not --procs)",
        ),
        ("--ra-pages", args.ra_pages.is_some(), args.cold, "--cold"),
        (
            "--file-io",
            args.file_io.is_some(),
            args.cold || args.budget,
            "--cold or --budget (the other benchmarks time cached data)",
        ),
        (
            "--budget-mib",
            args.budget_mib.is_some(),
            args.budget,
            "--budget",
        ),
        ("--duration", args.duration.is_some(), args.churn, "--churn"),
        (
            "--store",
            !args.store.is_empty(),
            remote,
            "--remote or --procs",
        ),
        (
            "--latency-ms",
            !args.latency_ms.is_empty(),
            remote,
            "--remote or --procs",
        ),
        (
            "--sample-pages",
            args.sample_pages.is_some(),
            remote,
            "--remote or --procs",
        ),
        (
            "--memory-budget",
            args.memory_budget.is_some(),
            remote,
            "--remote or --procs",
        ),
        ("--no-fuse", args.no_fuse, remote, "--remote or --procs"),
        (
            "--delivery",
            !args.delivery.is_empty(),
            !remote,
            "the warm benchmark, --parts or --churn (--remote's pager has the library's \
             default delivery)",
        ),
    ];
    for (option, present, allowed, with) in given {
        if present && !allowed {
            anyhow::bail!("{option} goes with {with}");
        }
    }
    Ok(())
}

/// A pager with `config`; its error names the delivery mode.
fn start_pager(config: Config) -> Result<Pager> {
    let how = match (config.engine, config.delivery) {
        (faultmap::Engine::Protect, _) => "the protect engine",
        (_, faultmap::Delivery::Signal) => "signal delivery",
        (_, faultmap::Delivery::Handler) => "handler delivery",
    };
    Pager::new(config).with_context(|| format!("cannot start the pager ({how})"))
}

/// A pager faulting as `fault` says, with `config`; its error names how.
fn start_pager_for(fault: Fault, config: Config) -> Result<Pager> {
    let pager = Pager::new(fault.configure(config))
        .with_context(|| format!("cannot start the pager ({})", crate::delivery_name(fault)))?;
    // FAULTMAP_ENGINE overrides the configuration: a column must measure
    // what its heading says.
    let want = match fault {
        Fault::Protect => faultmap::Engine::Protect,
        Fault::Signal | Fault::Handler => faultmap::Engine::Userfaultfd,
    };
    if pager.engine().engine != want {
        anyhow::bail!(
            "the {} column got the {} engine ({}): unset FAULTMAP_ENGINE to measure it",
            crate::delivery_name(fault),
            pager.engine().engine,
            pager.engine().why
        );
    }
    Ok(pager)
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
