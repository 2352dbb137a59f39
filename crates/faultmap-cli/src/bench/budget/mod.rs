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
//! of 10% of the budget, 10% uniform), one byte per touch; `--workload`
//! picks some. Engines:
//!
//! - `faultmap`: a new pager per sample with the budget, the library's
//!   default delivery, fault-around order 4 and the full readahead, its file
//!   store reading with O_DIRECT, so that the kernel's page cache (which no
//!   budget bounds) does not hold a second copy of the data (`--file-io`
//!   picks another mode, and the report says which is in force);
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
//! `memory.max_usage_in_bytes`), the peak sampled RSS (RssFile + RssShmem + HugetlbPages
//! every 5 ms) and whether the peak stayed within the budget + 1%.

mod cgroup;
pub mod touch;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use faultmap::{FileIo, FileStore, MapOptions, MIN_BUDGET, PAGE_SIZE};
use serde_json::{json, Value};

use self::cgroup::KernelError;
use self::touch::{BudgetWorkload, RssSampler};
use super::grid::{self, rate as per_second, Checksums, Row, Sample};
use super::note;
use super::plot::{Figure, Panel, Series};
use super::reps::Repetitions;
use super::workload::Workload;
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

/// Huge pages beyond the budget that `--page-size 2M` reserves: reads in
/// flight while the evictor catches up (the library's check asks for 4).
const HUGE_HEADROOM: u64 = 8 * 2 * MIB;

/// An engine of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Faultmap,
    /// faultmap with 2 MiB pages (`--page-size 2M`).
    FaultmapHuge,
    KernelFile,
}

impl grid::Column for Engine {
    fn heading(self) -> String {
        match self {
            Engine::FaultmapHuge => "faultmap page=2M".into(),
            Engine::Faultmap | Engine::KernelFile => self.engine().into(),
        }
    }

    fn engine(self) -> &'static str {
        match self {
            Engine::Faultmap | Engine::FaultmapHuge => "faultmap",
            Engine::KernelFile => "kernel-file",
        }
    }

    /// The run's is [`variant`]: it names the budget.
    fn variant(self) -> String {
        "default".into()
    }
}

impl grid::Named for BudgetWorkload {
    fn name(self) -> &'static str {
        BudgetWorkload::name(self)
    }
}

/// The budget benchmark's settings, beside its cells.
struct Budget {
    budget: u64,
    /// Why the budget is not the one asked, if it is not.
    shrunk_from: Option<u64>,
    file_io: FileIo,
    /// Why kernel-file was skipped, if it was.
    kernel_skipped: Option<String>,
    repetitions: u32,
}

/// The budget benchmark's results; the outputs show each cell's median
/// sample by seconds (real counts of one run, not a mix of medians).
type Run = grid::Report<Budget>;

type Cell = grid::Cell<BudgetWorkload, Engine>;

impl Budget {
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
    let workloads = budget_workloads(&args.workload)?;
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
    let asked_io = args.file_io.map_or(FileIo::Direct, crate::FileIoArg::mode);
    let file_io = FileStore::open_with(data.path(), asked_io)?.io();
    // 4. The page lists, made once.
    let page = PAGE_SIZE as u64;
    let pages = data.len().div_ceil(page);
    let plans: Vec<(BudgetWorkload, Vec<u32>)> = workloads
        .iter()
        .map(|&w| (w, touch::plan(w, pages, budget / page)))
        .collect();
    // 2 MiB pages: their huge pages (the budget's, and reads in flight),
    // for the run.
    let pages = super::dedup(super::or_default(
        &args.page_size,
        &[faultmap::PageSize::Base],
    ));
    let mut huge = pages.contains(&faultmap::PageSize::Huge);
    let min_huge = faultmap::MIN_HUGE_BUDGET_PAGES * faultmap::HUGE_PAGE_SIZE as u64;
    if huge && budget < min_huge {
        note(&format!(
            "faultmap page=2M skipped: a budget over 2 MiB pages must hold {} of them, {}",
            faultmap::MIN_HUGE_BUDGET_PAGES,
            units::bytes(min_huge)
        ));
        huge = false;
    }
    let _reservation = if huge {
        match super::hugepages::Reservation::for_bytes(budget + HUGE_HEADROOM) {
            Ok(r) => Some(r),
            Err(why) => {
                note(&format!("faultmap page=2M skipped: {why}"));
                huge = false;
                None
            }
        }
    } else {
        None
    };
    let mut engines = Vec::new();
    if pages.contains(&faultmap::PageSize::Base) {
        engines.push(Engine::Faultmap);
    }
    if huge {
        engines.push(Engine::FaultmapHuge);
    }
    engines.push(Engine::KernelFile);
    let huge_config = config.clone().page_size(faultmap::PageSize::Huge);
    let mut cells = grid::cells(&workloads, |_| vec![1], &engines);
    // 5. The measurements: repetitions outermost.
    let mut kernel_skipped = kernel_skipped;
    let mut checksums = Checksums::new();
    let label = |k: &grid::Key<BudgetWorkload, Engine>| {
        format!(
            "{} on {}",
            k.workload.name(),
            grid::Column::heading(k.column)
        )
    };
    let reps = Repetitions::Fixed(repetitions);
    grid::measure(&mut cells, reps, |key, bar| {
        let plan = plans
            .iter()
            .find(|(w, _)| *w == key.workload)
            .map(|(_, plan)| plan.as_slice())
            .context("a workload without a plan")?;
        let sample = match key.column {
            Engine::Faultmap => Some(measure_faultmap(&config, data.path(), file_io, plan)?),
            Engine::FaultmapHuge => {
                Some(measure_faultmap(&huge_config, data.path(), file_io, plan)?)
            }
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
                    grid::count(sample.major_faults)
                ));
            });
            let sum = sample.checksum.unwrap_or(0);
            checksums.check(key.workload, sum, || label(key))?;
        }
        Ok(sample)
    })?;
    // 6. The report.
    let run = Run::new(
        (&data).into(),
        started,
        workloads,
        vec![1],
        engines.to_vec(),
        cells,
        Budget {
            budget,
            shrunk_from,
            file_io,
            kernel_skipped,
            repetitions,
        },
    );
    run.write(args)
}

/// The workloads `--workload` names (all three without it), in report
/// order.
fn budget_workloads(asked: &[Workload]) -> Result<Vec<BudgetWorkload>> {
    let mut out = Vec::new();
    for &w in asked {
        let budget = match w {
            Workload::Seq => BudgetWorkload::Seq,
            Workload::Rand => BudgetWorkload::Rand,
            Workload::Hotcold => BudgetWorkload::Hotcold,
            _ => bail!(
                "workload {} is not a workload of --budget (seq, rand, hotcold)",
                w.name()
            ),
        };
        out.push(budget);
    }
    if out.is_empty() {
        return Ok(BudgetWorkload::ALL.to_vec());
    }
    Ok(BudgetWorkload::ALL
        .into_iter()
        .filter(|w| out.contains(w))
        .collect())
}

/// The report's line on `workloads`, over an object of `pages` pages
/// under `budget` bytes.
fn describe_workloads(workloads: &[BudgetWorkload], pages: u64, budget: u64) -> String {
    let touches = units::count(u64::from(touch::RANDOM_TOUCHES));
    let mut parts = vec!["one byte per touch".to_string()];
    for w in workloads {
        parts.push(match w {
            BudgetWorkload::Seq => "seq: every page in order, twice".to_string(),
            BudgetWorkload::Rand => format!(
                "rand: uniformly random pages, once per page of the object, at most {touches} \
                 touches"
            ),
            BudgetWorkload::Hotcold => format!(
                "hotcold: 90% on a hot set of {} pages (10% of the budget), 10% uniform, once \
                 per page of the object, at most {touches} touches",
                units::count(touch::hot_pages(pages, budget / PAGE_SIZE as u64))
            ),
        });
    }
    parts.join("; ")
}

/// One faultmap sample: a new pager with the budget, a new object, cold.
fn measure_faultmap(
    config: &faultmap::Config,
    path: &Path,
    io: FileIo,
    plan: &[u32],
) -> Result<Sample> {
    if let Err(err) = cgroup::drop_file_cache(path) {
        note(&format!(
            "cannot drop the file's page cache ({err:#}); going on"
        ));
    }
    let pager = super::start_pager(config.clone())?;
    let object = pager.open(FileStore::open_with(path, io)?)?;
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
        touches: Some(plan.len() as u64),
        checksum: Some(checksum),
        faults: Some(stats.pgfault),
        major_faults: Some(stats.pgmajfault),
        io_count: Some(stats.io_count),
        io_bytes: Some(stats.io_bytes),
        evicted: Some(stats.evicted),
        refault: Some(stats.refault),
        peak_bytes: Some(memory.peak),
        peak_rss_bytes: Some(peak_rss_bytes),
        stats: Some(stats),
        ..Sample::default()
    })
}

fn kernel_sample(k: &cgroup::KernelSample) -> Sample {
    Sample {
        seconds: k.child.seconds,
        touches: Some(k.child.touches),
        checksum: Some(k.child.checksum),
        faults: Some(k.child.minor_faults + k.child.major_faults),
        major_faults: Some(k.child.major_faults),
        refault: k.refault,
        peak_bytes: Some(k.max_usage),
        peak_rss_bytes: Some(k.child.peak_rss_bytes),
        ..Sample::default()
    }
}

/// 1 − major faults / touches.
fn hit_ratio(s: &Sample) -> f64 {
    let touches = s.touches.unwrap_or(0);
    if touches == 0 {
        return 1.0;
    }
    let major = s.major_faults.unwrap_or(0);
    (1.0 - major as f64 / touches as f64).max(0.0)
}

/// A field of a cell's median sample: its table heading (none: JSON only),
/// its extra JSON field (none: a common one), its value, and how the table
/// shows that value.
type Field = (
    Option<&'static str>,
    Option<&'static str>,
    fn(&Run, &Sample) -> Value,
    Show,
);

/// How the table shows a value (`-` for null).
#[derive(Clone, Copy)]
enum Show {
    /// Seconds, three decimals.
    Seconds,
    /// A count (a rate rounded down).
    Count,
    /// A ratio, four decimals.
    Ratio,
    /// Bytes in binary units.
    Bytes,
    /// `yes` or `no`.
    YesNo,
}

impl Show {
    fn text(self, v: &Value) -> String {
        let text = match self {
            Show::Seconds => v.as_f64().map(|x| format!("{x:.3}")),
            Show::Count => v.as_f64().map(|x| units::count(x as u64)),
            Show::Ratio => v.as_f64().map(|x| format!("{x:.4}")),
            Show::Bytes => v.as_u64().map(units::bytes),
            Show::YesNo => v.as_bool().map(|b| if b { "yes" } else { "no" }.into()),
        };
        text.unwrap_or_else(|| "-".into())
    }
}

/// The fields, in the table's column order (then JSON's extra fields).
const FIELDS: [Field; 12] = [
    (
        Some("seconds"),
        None,
        |_, s| s.seconds.into(),
        Show::Seconds,
    ),
    (
        Some("touches/s"),
        Some("touches_per_second"),
        |_, s| per_second(s.touches.unwrap_or(0), s.seconds).into(),
        Show::Count,
    ),
    (
        Some("hit ratio"),
        Some("hit_ratio"),
        |_, s| hit_ratio(s).into(),
        Show::Ratio,
    ),
    (
        Some("evictions/s"),
        Some("evicted_per_second"),
        |_, s| s.evicted.map(|e| per_second(e, s.seconds)).into(),
        Show::Count,
    ),
    (
        Some("refaults"),
        Some("refault"),
        |_, s| s.refault.into(),
        Show::Count,
    ),
    (
        Some("peak cached"),
        Some("peak_bytes"),
        |_, s| s.peak_bytes.into(),
        Show::Bytes,
    ),
    (
        Some("peak RSS"),
        Some("peak_rss_bytes"),
        |_, s| s.peak_rss_bytes.into(),
        Show::Bytes,
    ),
    (
        Some("budget"),
        Some("budget_bytes"),
        |r, _| r.mode.budget.into(),
        Show::Bytes,
    ),
    (
        Some("≤ budget+1%"),
        Some("within_budget"),
        |r, s| r.mode.within(s.peak_bytes.unwrap_or(0)).into(),
        Show::YesNo,
    ),
    (None, Some("touches"), |_, s| s.touches.into(), Show::Count),
    (None, Some("evicted"), |_, s| s.evicted.into(), Show::Count),
    (None, Some("stats"), |_, s| json!(s.stats), Show::Count),
];

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

impl grid::Mode for Budget {
    type Workload = BudgetWorkload;
    type Column = Engine;

    fn render(run: &Run) -> String {
        let m = &run.mode;
        let title = format!(
        "faultmap bench --budget: a memory budget on an object {OBJECT_PER_BUDGET} × its size, \
         faultmap's CLOCK eviction against the kernel's reclaim under a cgroup memory limit"
    );
        let mut budget = format!(
            "{} ({} pages)",
            units::bytes(m.budget),
            units::count(m.budget / PAGE_SIZE as u64)
        );
        if let Some(asked) = m.shrunk_from {
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
                crate::delivery_name(crate::Fault::default()),
                m.file_io.as_str()
            ),
            ),
            (
                "kernel-file",
                match &m.kernel_skipped {
                    None => "kernel mmap of the file in a child process in a new cgroup v1 memory \
                         cgroup with memory.limit_in_bytes = budget"
                        .to_string(),
                    Some(why) => format!("skipped: cannot use a cgroup v1 memory limit ({why})"),
                },
            ),
            (
                "workloads",
                describe_workloads(&run.workloads, run.data.pages, m.budget),
            ),
            (
                "repetitions",
                format!(
                    "{} per cell (the median by seconds), each from cold caches; total wall time \
                 {:.1} s",
                    m.repetitions, run.wall_seconds
                ),
            ),
        ];
        let mut out = run.header(&title, lines);
        out.push_str("RSS bound: peak cached must stay within budget + 1%\n\n");
        let shown = FIELDS.iter().filter(|f| f.0.is_some());
        let mut t = Table::new(2).note_column(2 + shown.clone().count() - 1);
        t.row(
            ["workload", "engine"]
                .into_iter()
                .chain(shown.clone().filter_map(|f| f.0)),
        );
        for cell in &run.cells {
            let Some(s) = cell.median_sample() else {
                continue;
            };
            let key = [
                cell.key.workload.name().to_string(),
                grid::Column::heading(cell.key.column),
            ];
            let values = shown
                .clone()
                .map(|(_, _, value, show)| show.text(&value(run, s)));
            t.row(key.into_iter().chain(values));
        }
        out.push_str(&t.render());
        out.push_str(
        "\nhit ratio: 1 − major faults / touches (faultmap's pgmajfault; the child's getrusage \
         majflt). evictions/s: faultmap's evicted over the time (not counted per cgroup by the \
         kernel: -). refaults: faultmap's refault; the cgroup's workingset_refault_file. peak \
         cached: faultmap's Pager::memory().peak; the cgroup's memory.max_usage_in_bytes. peak \
         RSS: the largest RssFile + RssShmem + HugetlbPages sampled every 5 ms.\n",
    );
        out
    }

    /// The settings in the document's `machine` object.
    fn settings(run: &Run) -> Value {
        let m = &run.mode;
        json!({
            "benchmark": "budget",
            "budget_bytes": m.budget,
            "budget_asked_bytes": m.shrunk_from,
            "order": ORDER,
            "delivery": crate::delivery_name(crate::Fault::default()),
            "file_io": m.file_io.as_str(),
            "kernel_file_skipped": m.kernel_skipped.as_deref(),
            "repetitions": m.repetitions,
            "wall_seconds": run.wall_seconds,
        })
    }

    /// A cell's JSON row.
    fn row(run: &Run, cell: &Cell) -> Row {
        let s = cell.median_sample().copied().unwrap_or_default();
        let mut row = Row::new(run, cell);
        row.variant = variant(run.mode.budget);
        row.order = (cell.key.column == Engine::Faultmap).then_some(ORDER);
        if cell.key.column == Engine::FaultmapHuge {
            row.variant += ",page=2M";
        }
        (row.seconds, row.faults, row.major_faults) = (s.seconds, s.faults, s.major_faults);
        (row.io_count, row.io_bytes) = (s.io_count, s.io_bytes);
        let extra = FIELDS.iter().filter_map(|f| Some((f.1?, f.2)));
        let page_size = match cell.key.column {
            Engine::Faultmap => Some(PAGE_SIZE as u64),
            Engine::FaultmapHuge => Some(faultmap::HUGE_PAGE_SIZE as u64),
            Engine::KernelFile => None,
        };
        extra
            .fold(row, |row, (key, value)| row.with(key, value(run, &s)))
            .with("page_size", page_size)
    }

    /// The hit ratio and the time of each engine, per workload.
    fn figure(run: &Run) -> Figure {
        let names: Vec<String> = run.workloads.iter().map(|w| w.name().to_string()).collect();
        let panel = |title: &str, log_y, value: fn(&Sample) -> f64| {
            let series = run.columns.iter().map(|&engine| {
                let points = run.workloads.iter().enumerate().filter_map(|(i, &w)| {
                    let cell = run.cell(w, 1, engine)?;
                    Some((i as f64, value(cell.median_sample()?)))
                });
                Series::line(grid::Column::heading(engine), points.collect())
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
}

// ---------------------------------------------------------------------------
// JSON.
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// The plot.
// ---------------------------------------------------------------------------

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
    fn the_workloads_asked_for_run_in_report_order_and_are_described() {
        use BudgetWorkload::{Hotcold, Rand, Seq};
        assert_eq!(budget_workloads(&[]).unwrap(), [Seq, Rand, Hotcold]);
        let asked = [Workload::Hotcold, Workload::Seq, Workload::Hotcold];
        assert_eq!(budget_workloads(&asked).unwrap(), [Seq, Hotcold]);
        assert!(budget_workloads(&[Workload::Seq, Workload::Sparse]).is_err());
        let text = describe_workloads(&[Rand], 65_536, 64 * MIB);
        assert!(text.contains("rand: uniformly random pages"), "{text}");
        assert!(
            !text.contains("seq:") && !text.contains("hotcold:"),
            "{text}"
        );
        let text = describe_workloads(&[Seq, Hotcold], 65_536, 64 * MIB);
        assert!(text.contains("seq: every page in order, twice"), "{text}");
        assert!(text.contains("hot set of 1,638 pages"), "{text}");
        assert!(!text.contains("rand:"), "{text}");
    }

    #[test]
    fn hit_ratios_count_major_faults() {
        let s = Sample {
            seconds: 2.0,
            touches: Some(100),
            faults: Some(30),
            major_faults: Some(25),
            evicted: Some(10),
            ..Sample::default()
        };
        assert!((hit_ratio(&s) - 0.75).abs() < 1e-9);
        assert!((per_second(10, s.seconds) - 5.0).abs() < 1e-9);
    }
}
