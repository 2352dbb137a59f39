//! `faultmap bench --cold`: the readahead comparison, on cold caches.
//!
//! On-demand mmap readahead, measured against mmap read-around only on a
//! freshly booted desktop, cut major faults by a third on clustered random
//! reads, with the same miss ratio. This benchmark runs that comparison on one file, with the
//! kernel and the disk as references:
//!
//! ```text
//!                       device    kernel    around   readahead
//!   seconds, MB/s, major faults, I/O count, I/O size, miss ratio
//!   ratios: vs device, vs kernel, major faults / around, bytes / kernel
//! ```
//!
//! Workloads ([`crate::access`]): `seq` on each `--threads` count (the
//! threads share one mapping, each reads its own 1/T: the file is read
//! once), `rand` and `clustered` on one thread, over a fixed-seed sample of
//! [`sample_pages`] pages (random reads cost about 100 µs each here, so a
//! sample keeps a run within seconds).
//!
//! The orchestrator, [`run`], reads top to bottom:
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
//!    count: an engine that served wrong bytes fails the benchmark;
//! 7. the report ([`report`]): the tables, or the JSON document; and the
//!    plot.

mod engine;
mod report;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use faultmap::{Config, FileIo, FileStore, Pager, Store, PAGE_SIZE};

use self::engine::ColdSample;
use self::engine::{Bench, ColdEngine};
use self::report::{threads_of, Cell, ColdRun, Key};
use super::grid::{self, Checksums};
use super::reps::Repetitions;
use super::workload::Workload;
use super::{dedup, note, or_default};
use crate::access::{Access, AccessPlan, Coverage};
use crate::kernel::{BlockDevice, CacheDropper, Caches, DROP_CACHES};
use crate::{BenchArgs, Readahead};

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

/// The arguments, checked.
#[derive(Debug)]
struct ColdSettings {
    workloads: Vec<Access>,
    threads: Vec<u16>,
    order: u8,
    ra_pages: Option<u64>,
    file_io: FileIo,
    repetitions: u32,
    config: Config,
}

impl ColdSettings {
    fn from_args(args: &BenchArgs) -> Result<ColdSettings> {
        let workloads = dedup(or_default(&args.workload, &COLD_WORKLOADS))
            .into_iter()
            .map(|w| {
                cold_access(w).with_context(|| {
                    format!(
                        "workload {} is not a cold workload (seq, rand, clustered)",
                        w.name()
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let orders = dedup(or_default(&args.orders, &[COLD_ORDER]));
        let [order] = orders[..] else {
            bail!("--cold measures one fault-around order: give one with --orders");
        };
        crate::stats::map_options(order, args.ra_pages, Readahead::Full).validate()?;
        let config = crate::stats::pager_config(args.handler_threads, args.io_threads);
        config.validate()?;
        Ok(ColdSettings {
            workloads,
            threads: dedup(or_default(&args.threads, &super::DEFAULT_THREADS)),
            order,
            ra_pages: args.ra_pages,
            file_io: crate::file_io(args.file_io),
            repetitions: args.repetitions.unwrap_or(COLD_REPETITIONS),
            config,
        })
    }
}

/// The access pattern of a cold workload.
fn cold_access(w: Workload) -> Option<Access> {
    match w {
        Workload::Seq => Some(Access::Seq),
        Workload::Rand => Some(Access::Rand),
        Workload::Clustered => Some(Access::Clustered),
        Workload::Sparse => None,
    }
}

/// Runs `faultmap bench --cold`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    // 1. The arguments.
    let settings = ColdSettings::from_args(args)?;
    // 2. The pager, as a check.
    let io_threads = settings.config.io_threads;
    drop(Pager::new(settings.config.clone()).context("cannot start the pager")?);
    // 3. The data.
    let data = super::open_data(args, super::DEFAULT_SIZE)?;
    let store = FileStore::open_with(data.path(), settings.file_io)?;
    let ra_pages = settings.ra_pages.unwrap_or_else(|| store.ra_pages());
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
    let pages = data.len().div_ceil(PAGE_SIZE as u64);
    let sample = sample_pages(pages);
    let engines = ColdEngine::columns(dropper.is_some());
    let (plans, mut cells) = plan_cells(&settings, &engines, len, sample)?;
    // 6. The measurements.
    let bench = Bench {
        path: data.path(),
        config: &settings.config,
        dropper: dropper.as_ref(),
        device: device.as_ref(),
        order: settings.order,
        ra_pages: settings.ra_pages,
        file_io,
    };
    measure_all(&bench, &plans, settings.repetitions, &mut cells)?;
    // 7. The report.
    let run = ColdRun {
        machine: super::probe::Machine::read(),
        data: super::data_info(&data),
        workloads: settings.workloads,
        threads: settings.threads,
        engines,
        repetitions: settings.repetitions,
        dropped: dropper.as_ref().map(CacheDropper::what),
        device,
        order: settings.order,
        ra_pages: (ra_pages, settings.ra_pages.is_some()),
        file_io,
        handler_threads: args.handler_threads,
        io_threads,
        sample_pages: sample,
        cells: cells.into_iter().map(|p| (p.cell, p.touched)).collect(),
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    super::report(
        args,
        |out| report::write_json(&run, out),
        || report::render(&run),
        || report::figure(&run),
    )
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

/// A cell, the plan its runs follow and the pages a run touches.
struct Planned {
    cell: Cell,
    plan: usize,
    touched: u64,
}

/// One plan per (workload, thread count), and the cells in measurement
/// order: per workload the device, then per thread count every other
/// engine.
fn plan_cells(
    settings: &ColdSettings,
    engines: &[ColdEngine],
    len: usize,
    sample: u64,
) -> Result<(Vec<AccessPlan>, Vec<Planned>)> {
    let pages = (len as u64).div_ceil(PAGE_SIZE as u64);
    let mut plans = Vec::new();
    let mut cells = Vec::new();
    let planned = |workload, threads, engine, plan, touched| Planned {
        cell: Cell::new(Key {
            workload,
            threads,
            engine,
        }),
        plan,
        touched,
    };
    for &w in &settings.workloads {
        if engines.contains(&ColdEngine::Device) {
            // The device reads the whole file; its plan (the next) is unused.
            cells.push(planned(w, 1, ColdEngine::Device, plans.len(), pages));
        }
        for threads in threads_of(w, &settings.threads) {
            let plan = AccessPlan::new(w, len, usize::from(threads), Coverage::Sample(sample))?;
            let touched = plan.pages_touched();
            plans.push(plan);
            for &e in engines.iter().filter(|&&e| e != ColdEngine::Device) {
                cells.push(planned(w, threads, e, plans.len() - 1, touched));
            }
        }
    }
    Ok((plans, cells))
}

/// Measures every cell `reps` times, a repetition at a time. A device
/// that fails leaves its column out, with a note; every run's word sum
/// must equal the first one of its workload and thread count.
fn measure_all(
    bench: &Bench<'_>,
    plans: &[AccessPlan],
    reps: u32,
    planned: &mut [Planned],
) -> Result<()> {
    let plan_of: Vec<(Key, usize)> = planned.iter().map(|p| (p.cell.key, p.plan)).collect();
    let mut cells: Vec<Cell> = planned.iter().map(|p| Cell::new(p.cell.key)).collect();
    let mut checksums = Checksums::new();
    let mut device_failed = false;
    let label = |k: &Key| {
        format!(
            "{} × {} on {}",
            k.workload.name(),
            k.threads,
            k.engine.column()
        )
    };
    grid::measure(&mut cells, Repetitions::Fixed(reps), label, |key, _| {
        if key.engine == ColdEngine::Device && device_failed {
            return Ok(None);
        }
        let plan = plan_of.iter().find(|(k, _)| k == key).map_or(0, |p| p.1);
        match bench.measure(key.engine, &plans[plan]) {
            Ok(sample) => {
                if let Some(sum) = sample.checksum {
                    checksums.check((key.workload, key.threads), sum, || {
                        format!(
                            "{} on {} × {}",
                            key.engine.column(),
                            key.workload.name(),
                            key.threads
                        )
                    })?;
                }
                Ok(Some(sample))
            }
            Err(err) if key.engine == ColdEngine::Device => {
                note(&format!("no device column: {err:#}"));
                device_failed = true;
                Ok(None::<ColdSample>)
            }
            Err(err) => Err(err),
        }
    })?;
    for (p, cell) in planned.iter_mut().zip(cells) {
        p.cell = cell;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_a_sixteenth_within_bounds() {
        assert_eq!(sample_pages(0), 1);
        assert_eq!(sample_pages(4096), 256);
        assert_eq!(sample_pages(262_144), 16_384);
        assert_eq!(sample_pages(1 << 30), 16_384);
    }

    #[test]
    fn cells_come_per_workload_device_first() {
        let settings = ColdSettings {
            workloads: vec![Access::Seq, Access::Rand],
            threads: vec![1, 2],
            order: 4,
            ra_pages: None,
            file_io: FileIo::default(),
            repetitions: 1,
            config: Config::default(),
        };
        let engines = ColdEngine::columns(true);
        let (plans, cells) = plan_cells(&settings, &engines, 64 * PAGE_SIZE, 8).unwrap();
        assert_eq!(plans.len(), 3);
        let shape: Vec<(Access, u16, &str)> = cells
            .iter()
            .map(|p| {
                (
                    p.cell.key.workload,
                    p.cell.key.threads,
                    p.cell.key.engine.column(),
                )
            })
            .collect();
        use Access::*;
        assert_eq!(
            shape,
            [
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
            ]
        );
        assert_eq!(cells[0].touched, 64);
        assert_eq!(cells[8].touched, 8);
    }
}
