//! `faultmap bench --budget`: a memory budget on an object four times its
//! size, faultmap's CLOCK eviction against the kernel's page-cache
//! reclaim under a cgroup v1 memory limit of the same size.
//!
//! ```text
//!   object  |<------------------- 4 × budget (default 1 GiB) ------------------->|
//!   cache   |<-- budget (256 MiB) -->|   faultmap: Config::memory_budget
//!                                        kernel-file: memory.limit_in_bytes
//! ```
//!
//! Workloads ([`touch`]): `seq` (every page in order, twice), `rand`
//! (uniformly random pages) and `hotcold` (90% of the touches on a hot set
//! of 10% of the budget, 10% uniform), one byte per touch. Engines:
//!
//! - `faultmap`: a new pager per sample with the budget, the library's
//!   default delivery, fault-around order 4 and the full readahead, its file
//!   store reading with O_DIRECT, so that the kernel's page cache (which no
//!   budget bounds) does not hold a second copy of the data;
//! - `kernel-file`: the kernel's mmap of the file in a child process held to
//!   the budget by a cgroup ([`cgroup`]). Without a usable cgroup v1 memory
//!   controller (not root, no controller, a write refused) one line says so
//!   and the engine is skipped.
//!
//! Both start cold: the kernel's page cache of the file is dropped before
//! every sample (`posix_fadvise(DONTNEED)`), and faultmap's cache is new.
//!
//! Per cell: seconds, touches/s, the hit ratio (1 − major faults / touches:
//! faultmap's `pgmajfault`, the child's `getrusage` majflt), evictions/s
//! (faultmap's `evicted`; the kernel's are not counted per cgroup), refaults
//! (faultmap's `refault`; the cgroup's `workingset_refault_file`), the peak
//! memory (faultmap's `Pager::memory().peak`; the cgroup's
//! `memory.max_usage_in_bytes`), the peak sampled RSS (RssFile + RssShmem
//! every 5 ms) and whether the peak stayed within the budget + 1%.

mod cgroup;
pub mod touch;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use faultmap::{FileIo, FileStore, MapOptions, Stats, MIN_BUDGET, PAGE_SIZE};
use serde_json::json;

use self::cgroup::KernelError;
use self::touch::{BudgetWorkload, RssSampler};
use super::grid::{self, Checksums, DataInfo, Row};
use super::note;
use super::plot::{Figure, Panel, Series};
use super::probe::Machine;
use super::reps::Repetitions;
use crate::table::Table;
use crate::units;
use crate::BenchArgs;

pub use self::cgroup::child;

/// The budget without `--budget-mib`.
const DEFAULT_BUDGET_MIB: u64 = 256;

/// The object is this many times the budget.
const OBJECT_PER_BUDGET: u64 = 4;

/// faultmap's fault-around order.
const ORDER: u8 = 4;

/// `--repetitions` without the option.
const REPETITIONS: u32 = 1;

const MIB: u64 = 1 << 20;

/// An engine of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Faultmap,
    KernelFile,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Faultmap => "faultmap",
            Engine::KernelFile => "kernel-file",
        }
    }
}

/// One sample of one cell.
#[derive(Clone, Copy, Debug)]
struct Sample {
    seconds: f64,
    touches: u64,
    checksum: u64,
    /// faultmap: `pgfault`; kernel: minor + major faults.
    faults: u64,
    /// faultmap: `pgmajfault`; kernel: majflt.
    major_faults: u64,
    /// faultmap only.
    evicted: Option<u64>,
    /// faultmap: `refault`; kernel: the cgroup's `workingset_refault_file`.
    refault: Option<u64>,
    /// faultmap: the pager's peak cached bytes; kernel: the cgroup's
    /// `memory.max_usage_in_bytes`.
    peak_bytes: u64,
    /// The largest sampled RssFile + RssShmem.
    peak_rss_bytes: u64,
    /// faultmap only: bytes read from the store.
    io_bytes: Option<u64>,
    /// faultmap only: all the counters.
    stats: Option<Stats>,
}

impl grid::Sample for Sample {
    fn seconds(&self) -> f64 {
        self.seconds
    }
}

/// What a cell measures: a workload on an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    workload: BudgetWorkload,
    engine: Engine,
}

/// A cell of the budget benchmark; the outputs show its median sample by
/// seconds (real counts of one run, not a mix of medians).
type Cell = grid::Cell<Key, Sample>;

/// The whole run, for the outputs.
struct BudgetRun {
    machine: Machine,
    data: DataInfo,
    budget: u64,
    /// Why the budget is not the one asked, if it is not.
    shrunk_from: Option<u64>,
    file_io: FileIo,
    /// Why kernel-file was skipped, if it was.
    kernel_skipped: Option<String>,
    repetitions: u32,
    cells: Vec<Cell>,
    wall_seconds: f64,
}

impl BudgetRun {
    /// Whether `peak` is within the budget + 1%.
    fn within(&self, peak: u64) -> bool {
        peak <= self.budget + self.budget / 100
    }
}

/// `budget=256MiB` (or in KiB when not a whole number of MiB).
fn variant(budget: u64) -> String {
    if budget % MIB == 0 {
        format!("budget={}MiB", budget / MIB)
    } else {
        format!("budget={}KiB", budget / 1024)
    }
}

/// The budget for an object of `len` bytes when `asked` was asked: at most a
/// quarter of the object, in whole pages.
fn fit_budget(asked: u64, len: u64) -> Result<u64> {
    if len >= asked.saturating_mul(OBJECT_PER_BUDGET) {
        return Ok(asked);
    }
    let page = PAGE_SIZE as u64;
    let budget = len / OBJECT_PER_BUDGET / page * page;
    if budget < MIN_BUDGET {
        bail!(
            "the file ({}) is too small for a budget benchmark: it needs at least {} \
             (4 × the smallest budget, {})",
            units::bytes(len),
            units::bytes(MIN_BUDGET * OBJECT_PER_BUDGET),
            units::bytes(MIN_BUDGET)
        );
    }
    Ok(budget)
}

/// Runs `faultmap bench --budget`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    // 1. The settings and a first pager (without userfaultfd nothing else is
    //    worth doing).
    let asked = args
        .budget_mib
        .unwrap_or(DEFAULT_BUDGET_MIB)
        .checked_mul(MIB)
        .context("--budget-mib is too large")?;
    let config = crate::stats::pager_config(args.handler_threads, args.io_threads);
    config
        .clone()
        .memory_budget(asked.max(MIN_BUDGET))
        .validate()?;
    drop(super::start_pager(config.clone())?);
    let repetitions = args.repetitions.unwrap_or(REPETITIONS);
    // 2. The data, and the budget that fits it.
    let data = super::open_data(args, asked.saturating_mul(OBJECT_PER_BUDGET))?;
    let budget = fit_budget(asked, data.len())?;
    let shrunk_from = (budget != asked).then_some(asked);
    if shrunk_from.is_some() {
        note(&format!(
            "the file ({}) is smaller than 4 × the budget ({}): the budget is a quarter of it, {}",
            units::bytes(data.len()),
            units::bytes(asked),
            units::bytes(budget)
        ));
    }
    let config = config.memory_budget(budget);
    // 3. The engines: kernel-file if cgroups can be used.
    let kernel_skipped = cgroup::probe(budget).err().map(|err| format!("{err:#}"));
    if let Some(why) = &kernel_skipped {
        note(&format!(
            "kernel-file skipped: cannot use a cgroup v1 memory limit ({why})"
        ));
    }
    let file_io = FileStore::open_with(data.path(), FileIo::Direct)?.io();
    // 4. The page lists, made once.
    let page = PAGE_SIZE as u64;
    let pages = data.len().div_ceil(page);
    let plans: Vec<(BudgetWorkload, Vec<u32>)> = BudgetWorkload::ALL
        .iter()
        .map(|&w| (w, touch::plan(w, pages, budget / page)))
        .collect();
    let mut cells: Vec<Cell> = BudgetWorkload::ALL
        .iter()
        .flat_map(|&workload| {
            let engines = [Engine::Faultmap, Engine::KernelFile].into_iter();
            engines.map(move |engine| Cell::new(Key { workload, engine }))
        })
        .collect();
    // 5. The measurements: repetitions outermost.
    let mut kernel_skipped = kernel_skipped;
    let mut checksums = Checksums::new();
    let label = |k: &Key| format!("{} on {}", k.workload.name(), k.engine.name());
    let reps = Repetitions::Fixed(repetitions);
    grid::measure(&mut cells, reps, label, |key, bar| {
        let plan = plans
            .iter()
            .find(|(w, _)| *w == key.workload)
            .map(|(_, plan)| plan.as_slice())
            .context("a workload without a plan")?;
        let sample = match key.engine {
            Engine::Faultmap => Some(measure_faultmap(&config, data.path(), plan)?),
            Engine::KernelFile if kernel_skipped.is_none() => {
                match cgroup::measure(data.path(), key.workload, budget) {
                    Ok(k) => Some(kernel_sample(&k)),
                    Err(KernelError::Cgroup(err)) => {
                        let why = format!("{err:#}");
                        note(&format!(
                            "kernel-file skipped: cannot use a cgroup v1 memory limit ({why})"
                        ));
                        kernel_skipped = Some(why);
                        None
                    }
                    Err(KernelError::Run(err)) => {
                        let w = key.workload.name();
                        note(&format!("kernel-file on {w}: no sample ({err:#})"));
                        None
                    }
                }
            }
            Engine::KernelFile => None,
        };
        if let Some(sample) = &sample {
            bar.suspend(|| {
                note(&format!(
                    "{}: {:.3} s, {} major faults",
                    label(key),
                    sample.seconds,
                    units::count(sample.major_faults)
                ));
            });
            checksums.check(key.workload, sample.checksum, || label(key))?;
        }
        Ok(sample)
    })?;
    cells.retain(|c| !c.samples.is_empty());
    // 6. The report.
    let run = BudgetRun {
        machine: Machine::read(),
        data: super::data_info(&data),
        budget,
        shrunk_from,
        file_io,
        kernel_skipped,
        repetitions,
        cells,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    super::report(
        args,
        |out| write_json(&run, out),
        || render(&run),
        || figure(&run),
    )
}

/// One faultmap sample: a new pager with the budget, a new object, cold.
fn measure_faultmap(config: &faultmap::Config, path: &Path, plan: &[u32]) -> Result<Sample> {
    if let Err(err) = cgroup::drop_file_cache(path) {
        note(&format!(
            "cannot drop the file's page cache ({err:#}); going on"
        ));
    }
    let pager = super::start_pager(config.clone())?;
    let object = pager.open(FileStore::open_with(path, FileIo::Direct)?)?;
    let map = crate::map_readonly(&pager, &object, MapOptions::new().fault_around_order(ORDER))
        .context("mapping the data through faultmap")?;
    let sampler = RssSampler::start();
    let started = Instant::now();
    let checksum = touch::walk(&map, plan);
    let seconds = started.elapsed().as_secs_f64();
    let peak_rss_bytes = sampler.finish();
    let memory = pager.memory();
    let stats = pager.stats();
    drop(map);
    drop(object);
    drop(pager);
    Ok(Sample {
        seconds,
        touches: plan.len() as u64,
        checksum,
        faults: stats.pgfault,
        major_faults: stats.pgmajfault,
        evicted: Some(stats.evicted),
        refault: Some(stats.refault),
        peak_bytes: memory.peak,
        peak_rss_bytes,
        io_bytes: Some(stats.io_bytes),
        stats: Some(stats),
    })
}

fn kernel_sample(k: &cgroup::KernelSample) -> Sample {
    Sample {
        seconds: k.child.seconds,
        touches: k.child.touches,
        checksum: k.child.checksum,
        faults: k.child.minor_faults + k.child.major_faults,
        major_faults: k.child.major_faults,
        evicted: None,
        refault: k.refault,
        peak_bytes: k.max_usage,
        peak_rss_bytes: k.child.peak_rss_bytes,
        io_bytes: None,
        stats: None,
    }
}

/// 1 − major faults / touches.
fn hit_ratio(s: &Sample) -> f64 {
    if s.touches == 0 {
        return 1.0;
    }
    (1.0 - s.major_faults as f64 / s.touches as f64).max(0.0)
}

use self::grid::rate as per_second;

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

fn render(run: &BudgetRun) -> String {
    let title = format!(
        "faultmap bench --budget: a memory budget on an object {OBJECT_PER_BUDGET} × its size, \
         faultmap's CLOCK eviction against the kernel's reclaim under a cgroup memory limit"
    );
    let mut budget = format!(
        "{} ({} pages)",
        units::bytes(run.budget),
        units::count(run.budget / PAGE_SIZE as u64)
    );
    if let Some(asked) = run.shrunk_from {
        let _ = write!(
            budget,
            "; the file is smaller than 4 × the {} asked, so the budget is a quarter of it",
            units::bytes(asked)
        );
    }
    let lines = vec![
        ("budget", budget),
        (
            "faultmap",
            format!(
                "a new pager per sample with memory_budget = budget, {} delivery, fault-around \
                 order {ORDER}, full readahead, file store {}",
                crate::delivery_name(faultmap::Delivery::default()),
                run.file_io.as_str()
            ),
        ),
        (
            "kernel-file",
            match &run.kernel_skipped {
                None => "kernel mmap of the file in a child process in a new cgroup v1 memory \
                         cgroup with memory.limit_in_bytes = budget"
                    .to_string(),
                Some(why) => format!("skipped: cannot use a cgroup v1 memory limit ({why})"),
            },
        ),
        (
            "workloads",
            format!(
                "one byte per touch; seq: every page in order, twice; rand: uniformly random \
                 pages; hotcold: 90% on a hot set of {} pages (10% of the budget), 10% uniform; \
                 rand and hotcold touch once per page of the object, at most {} times",
                units::count(touch::hot_pages(
                    run.data.pages,
                    run.budget / PAGE_SIZE as u64
                )),
                units::count(u64::from(touch::RANDOM_TOUCHES))
            ),
        ),
        (
            "repetitions",
            format!(
                "{} per cell (the median by seconds), each from cold caches; total wall time \
                 {:.1} s",
                run.repetitions, run.wall_seconds
            ),
        ),
    ];
    let mut out = grid::header(&title, &run.machine, &run.data, lines);
    out.push_str("RSS bound: peak cached must stay within budget + 1%\n\n");

    let mut t = Table::new(2).note_column(10);
    t.row([
        "workload",
        "engine",
        "seconds",
        "touches/s",
        "hit ratio",
        "evictions/s",
        "refaults",
        "peak cached",
        "peak RSS",
        "budget",
        "≤ budget+1%",
    ]);
    for cell in &run.cells {
        let Some(s) = cell.median_sample() else {
            continue;
        };
        t.row([
            cell.key.workload.name().to_string(),
            cell.key.engine.name().to_string(),
            format!("{:.3}", s.seconds),
            units::count(per_second(s.touches, s.seconds) as u64),
            format!("{:.4}", hit_ratio(s)),
            s.evicted.map_or(
                "-".into(),
                |e| units::count(per_second(e, s.seconds) as u64),
            ),
            s.refault.map_or("-".into(), units::count),
            units::bytes(s.peak_bytes),
            units::bytes(s.peak_rss_bytes),
            units::bytes(run.budget),
            if run.within(s.peak_bytes) {
                "yes"
            } else {
                "no"
            }
            .to_string(),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(
        "\nhit ratio: 1 − major faults / touches (faultmap's pgmajfault; the child's getrusage \
         majflt). evictions/s: faultmap's evicted over the time (not counted per cgroup by the \
         kernel: -). refaults: faultmap's refault; the cgroup's workingset_refault_file. peak \
         cached: faultmap's Pager::memory().peak; the cgroup's memory.max_usage_in_bytes. peak \
         RSS: the largest RssFile + RssShmem sampled every 5 ms.\n",
    );
    out
}

// ---------------------------------------------------------------------------
// JSON.
// ---------------------------------------------------------------------------

/// Writes the document: one row per cell, its median sample's.
fn write_json(run: &BudgetRun, out: &mut impl std::io::Write) -> Result<()> {
    let machine = json!({
        "benchmark": "budget",
        "budget_bytes": run.budget,
        "budget_asked_bytes": run.shrunk_from,
        "order": ORDER,
        "delivery": crate::delivery_name(faultmap::Delivery::default()),
        "file_io": run.file_io.as_str(),
        "kernel_file_skipped": run.kernel_skipped.as_deref(),
        "repetitions": run.repetitions,
        "wall_seconds": run.wall_seconds,
    });
    let rows = run.cells.iter().filter_map(|cell| {
        let s = cell.median_sample()?;
        let mut row = Row::new(cell, cell.key.engine.name(), variant(run.budget));
        row.workload = cell.key.workload.name();
        row.order = (cell.key.engine == Engine::Faultmap).then_some(ORDER);
        row.pages = run.data.pages;
        row.seconds = s.seconds;
        row.faults = Some(s.faults);
        row.major_faults = Some(s.major_faults);
        row.io_bytes = s.io_bytes;
        row.io_count = s.stats.map(|s| s.io_count);
        Some(
            row.with("touches", s.touches)
                .with("hit_ratio", hit_ratio(s))
                .with("evicted", s.evicted)
                .with("refault", s.refault)
                .with("peak_bytes", s.peak_bytes)
                .with("budget_bytes", run.budget)
                .with("within_budget", run.within(s.peak_bytes))
                .with("touches_per_second", per_second(s.touches, s.seconds))
                .with(
                    "evicted_per_second",
                    s.evicted.map(|e| per_second(e, s.seconds)),
                )
                .with("peak_rss_bytes", s.peak_rss_bytes)
                .with("stats", s.stats),
        )
    });
    let machine = grid::machine_json(&run.machine, &run.data, machine);
    grid::write_document(out, machine, rows.collect())
}

// ---------------------------------------------------------------------------
// The plot.
// ---------------------------------------------------------------------------

/// The hit ratio and the time of each engine, per workload.
fn figure(run: &BudgetRun) -> Figure {
    let names: Vec<String> = BudgetWorkload::ALL
        .iter()
        .map(|w| w.name().to_string())
        .collect();
    let panel = |title: &str, log_y, value: fn(&Sample) -> f64| {
        let series = [Engine::Faultmap, Engine::KernelFile]
            .into_iter()
            .map(|engine| {
                let points = BudgetWorkload::ALL
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &workload)| {
                        let cell = grid::find(&run.cells, Key { workload, engine })?;
                        Some((i as f64, value(cell.median_sample()?)))
                    });
                Series::line(engine.name().to_string(), points.collect())
            });
        Panel {
            title: title.to_string(),
            x_label: "workload".into(),
            x_names: names.clone(),
            y_label: title.to_string(),
            log_y,
            series: series.filter(|s| !s.points.is_empty()).collect(),
        }
    };
    Figure {
        panels: vec![
            panel("hit ratio", false, hit_ratio),
            panel("time, seconds", true, |s| s.seconds),
        ],
        columns: 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_fits_a_quarter_of_the_file() {
        assert_eq!(fit_budget(256 * MIB, 1 << 30).unwrap(), 256 * MIB);
        assert_eq!(fit_budget(256 * MIB, 2 << 30).unwrap(), 256 * MIB);
        assert_eq!(fit_budget(256 * MIB, 16 * MIB).unwrap(), 4 * MIB);
        assert_eq!(fit_budget(4 * MIB, 16 * MIB + 100).unwrap(), 4 * MIB);
        assert!(fit_budget(4 * MIB, 3 * MIB).is_err());
        assert_eq!(variant(256 * MIB), "budget=256MiB");
        assert_eq!(variant(MIB + 4096), "budget=1028KiB");
    }

    #[test]
    fn hit_ratios_count_major_faults() {
        let s = Sample {
            seconds: 2.0,
            touches: 100,
            checksum: 0,
            faults: 30,
            major_faults: 25,
            evicted: Some(10),
            refault: None,
            peak_bytes: 0,
            peak_rss_bytes: 0,
            io_bytes: None,
            stats: None,
        };
        assert!((hit_ratio(&s) - 0.75).abs() < 1e-9);
        assert!((per_second(10, s.seconds) - 5.0).abs() < 1e-9);
    }
}
