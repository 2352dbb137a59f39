//! The fault-around benchmark (plain `faultmap bench` and `--full`): minor
//! faults and time per fault-around order for three synthetic workloads
//! and several thread counts, with faultmap's fault-around order as the
//! variable and, as fixed columns, two kernel baselines and the bare
//! userfaultfd round trip:
//!
//! ```text
//!   seq: sequential access: every 8-byte word in order
//!                             kernel-file  kernel-memfd  uffd-probe  uffd-probe   order=0   order=0  ...
//!                                                          same-cpu   cross-cpu    signal   handler  ...
//!   1 thread   minor-faults         4,096        16,384     262,144     262,144   262,144   262,144  ...
//!              time, seconds     0.061234      0.093121    0.810000    1.210000  1.021234  ...
//!              vs kernel-file                      0.66        0.08        0.05      0.06  ...
//!              vs kernel-memfd       1.52                      0.11        0.08      0.09  ...
//! ```
//!
//! Plain `faultmap bench` measures orders 0, 4 and 9 (one page, the
//! kernel's default 64 KiB, a whole page table), [`MAIN_REPETITIONS`]
//! samples per cell, and the `uffd-probe` same-cpu column, so that it
//! answers in about three minutes here (`cross-cpu`, at about 70 µs per
//! fault, only with `--full`);
//! `--full` measures the seven orders of the kernel's fault-around series
//! with the [`reps`](super::reps) budget policy (about 5 minutes). Every
//! number is the median over the repetitions. A `vs X` line divides X's
//! time by each column's: above 1, that column was faster than X. After the
//! tables, the headline: per workload, delivery mode and thread count,
//! faultmap's fastest order, and its time over kernel-file's and
//! kernel-memfd's; then, per workload and thread count, the handler
//! delivery's time per fault at order 0 (time / faults) over signal
//! delivery's and over the `uffd-probe same-cpu`'s.
//!
//! faultmap's columns are one per fault-around order *and* fault delivery
//! mode (`--delivery`): `signal` (the faulting thread resolves its own hit
//! in a SIGBUS handler) and `handler` (a handler thread reads the
//! userfaultfd message and wakes the faulting thread), each with its own
//! pager over the one object, so the two modes map the same cached pages.
//!
//! The `uffd-probe` columns ([`super::uffd_probe`]) are the floor under
//! handler delivery: kernel-memfd's memfd through a bare userfaultfd
//! handler (one handler thread per CPU, one `UFFDIO_CONTINUE` per page,
//! nothing else), each walking thread pinned for its walk to its handler's
//! CPU (`same-cpu`) or to another (`cross-cpu`; not measured, with one line
//! saying so, when the process may use one CPU only). Their faults are
//! `getrusage` minor faults, as the kernel columns': one per page touched.
//!
//! [`run`] reads top to bottom:
//!
//! 1. check the arguments (orders against the library's bound) before
//!    anything costly;
//! 2. start the pagers, one per delivery mode: without userfaultfd nothing
//!    else is worth doing, and the error says what is missing;
//! 3. the data ([`super::data`]) and every engine over it
//!    ([`super::engine`]): the file, its memfd copy, the uffd-probes over
//!    it, faultmap's object with its cache filled; then the columns (the
//!    probes say whether `cross-cpu` can be measured);
//! 4. the workloads' inputs ([`Plan`]), made once, untimed;
//! 5. the measurements ([`grid::measure`]): repetitions outermost, then
//!    workload, threads and engine, so the engines of one row are measured
//!    seconds apart and machine noise hits them alike. Every walk's
//!    checksum must equal the first one of its workload: an engine that
//!    served wrong bytes fails the benchmark;
//! 6. the report: the tables and the headline, or one JSON document; and
//!    the plot.
//!
//! JSON rows (`order`, `io_count`, `io_bytes` null for the kernel engines
//! and the `uffd-probe`, whose variant is `cpu=same` or `cpu=cross`)
//! add `delivery` (faultmap: `signal` or `handler`; the variant names it
//! when it is not the library's default: `order=4,delivery=handler`),
//! `fault_around_pages` (faultmap's `pgfault_around`), `folios` and
//! `folio_sample` (kernel engines: `large`, `4k`, `mixed` or `unknown`, and
//! the sampled counts) and `resident_pct` (kernel-file: the lowest
//! residency before a repetition). The `machine` object adds
//! `uffd_probe_cpus` (the CPUs of the probes' handlers) and
//! `uffd_probe_skipped` (why `cross-cpu` was not measured, or null).

use std::time::Instant;

use crate::Fault;
use anyhow::{bail, Context, Result};
use faultmap::policy::fault_around::AUTO;
use faultmap::PageSize;
use serde_json::{json, Value};

use super::engine::{Engine, Engines, WarmUp};
use super::grid::{self, threads_label, Checksums, Column, Line, Row};
use super::plot::{Figure, Panel, Series};
use super::probe::FolioSample;
use super::reps::{
    Repetitions, RepsFrom, BUDGET, CELL_BUDGET, MAX_REPS, MIN_REPS, SHORT_CELL, SHORT_REPS,
};
use super::uffd_probe::ProbeCpu;
use super::workload::{Plan, Workload};
use super::{dedup, faults, or_default};
use crate::{units, BenchArgs, DeliveryArg};

/// The workloads without `--workload`.
const WORKLOADS: [Workload; 3] = [Workload::Seq, Workload::Rand, Workload::Sparse];

/// The orders of `--full` without `--orders`: the kernel's fault-around
/// series, and adaptive fault-around.
const FULL_ORDERS: [u8; 8] = [0, 1, 3, 4, 5, 7, 9, AUTO];

/// The orders of plain `faultmap bench` without `--orders`: one page, the
/// kernel's default (64 KiB), a whole page table (2 MiB), and adaptive
/// fault-around.
const MAIN_ORDERS: [u8; 4] = [0, 4, 9, AUTO];

/// Samples per cell of plain `faultmap bench` without `--repetitions`: the
/// median of 3, and the whole run (1 GiB) in about 90 s here.
const MAIN_REPETITIONS: u32 = 3;

/// The delivery modes without `--delivery`.
const DELIVERIES: [DeliveryArg; 2] = [DeliveryArg::Signal, DeliveryArg::Handler];

/// The fault-around benchmark's settings, beside its cells.
#[derive(Debug)]
pub struct Warm {
    /// The whole table (`--full`) or the default subset.
    full: bool,
    /// Repetitions run (passes), and how that number was chosen.
    repetitions: (u32, RepsFrom),
    /// faultmap handler threads.
    handler_threads: u16,
    /// How faultmap's cache was filled.
    warm_up: WarmUp,
    /// How the cache of 2 MiB pages was filled (`--page-size 2M`).
    huge_warm_up: Option<WarmUp>,
    /// Why the 2 MiB columns were not measured, if asked and not.
    huge_skipped: Option<String>,
    /// The CPUs of the uffd-probe's handlers.
    probe_cpus: Vec<usize>,
    /// Why `uffd-probe cross-cpu` was not measured, if it was not.
    probe_skipped: Option<String>,
}

/// The fault-around benchmark's results.
pub type Run = grid::Report<Warm>;

type Key = grid::Key<Workload, Engine>;

type Cell = grid::Cell<Workload, Engine>;

impl grid::Named for Workload {
    fn name(self) -> &'static str {
        Workload::name(self)
    }
}

/// Runs the fault-around benchmark.
pub fn run(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    // 1. The arguments.
    let orders = dedup(or_default(
        &args.orders,
        if args.full {
            &FULL_ORDERS
        } else {
            &MAIN_ORDERS
        },
    ));
    for &order in &orders {
        crate::order_options(order).validate()?;
    }
    let workloads = dedup(or_default(&args.workload, &WORKLOADS));
    if let Some((w, mode)) = workloads.iter().find_map(|w| Some((w, w.only_in()?))) {
        // --full conflicts with the other benchmarks' flags.
        let how = if args.full {
            format!("run it with --{mode} instead of --full")
        } else {
            format!("add --{mode}")
        };
        bail!(
            "workload {} is a workload of the {mode} benchmark: {how}",
            w.name()
        );
    }
    let deliveries = faults(args, &DELIVERIES);
    let mut pages = dedup(or_default(&args.page_size, &[PageSize::Base]));
    let reps = match (args.repetitions, args.full) {
        (Some(n), _) => Repetitions::Fixed(n),
        (None, true) => Repetitions::Budget,
        (None, false) => Repetitions::AtLeast(MAIN_REPETITIONS),
    };
    let threads = dedup(or_default(&args.threads, &super::DEFAULT_THREADS));
    let max_threads = threads.iter().copied().max().map_or(1, usize::from);
    let config = crate::stats::pager_config(args.handler_threads, args.io_threads);
    config.validate()?;
    // 2. The pagers, one per delivery mode.
    let pagers = deliveries
        .iter()
        .map(|&d| super::start_pager_for(d, config.clone()).map(|p| (d, p)))
        .collect::<Result<Vec<_>>>()?;
    // 3. The data and the engines; with 2 MiB pages, their huge pages
    //    (given back when the run ends).
    let data = super::open_data(args, super::DEFAULT_SIZE)?;
    let mut huge_skipped = None;
    let _reservation = if pages.contains(&PageSize::Huge) {
        match super::hugepages::Reservation::for_bytes(data.len()) {
            Ok(r) => Some(r),
            Err(why) => {
                let why = format!("page=2M skipped: {why}");
                super::note(&why);
                huge_skipped = Some(why);
                pages.retain(|&p| p != PageSize::Huge);
                None
            }
        }
    } else {
        None
    };
    if pages.is_empty() {
        bail!("no page size left to measure");
    }
    super::note("copying it into a memfd and filling faultmap's cache");
    let huge = pages.contains(&PageSize::Huge);
    let mut engines = Engines::new(&data, pagers, max_threads, huge)?;
    // cross-cpu costs about 70 µs per fault here: minutes per run at
    // 1 GiB, so only `--full` measures it.
    let probe_skipped = engines.probes().cross_cpu_skipped().or_else(|| {
        (!args.full).then(|| {
            "uffd-probe cross-cpu skipped: measured with --full (a wake-up across CPUs \
             per fault takes minutes at this size)"
                .to_string()
        })
    });
    if let Some(why) = &probe_skipped {
        super::note(why);
    }
    let mut probe_columns = engines.probes().columns();
    if probe_skipped.is_some() {
        probe_columns.retain(|&c| c != ProbeCpu::Cross);
    }
    let columns = Engine::all(&orders, &deliveries, &probe_columns, &pages);
    // 4. The workloads' inputs.
    let len = usize::try_from(data.len()).context("the file does not fit the address space")?;
    let plans = workloads
        .iter()
        .map(|&w| Plan::new(w, len, max_threads))
        .collect::<Result<Vec<_>>>()?;
    // 5. The measurements.
    let mut cells = grid::cells(&workloads, |_| threads.clone(), &columns);
    let mut checksums = Checksums::new();
    let passes = grid::measure(&mut cells, reps, |key, _| {
        let plan = plans
            .iter()
            .find(|p| p.workload() == key.workload)
            .context("a workload without a plan")?;
        let sample = engines.measure(key.column, plan, usize::from(key.threads))?;
        let sum = sample.checksum.unwrap_or(0);
        checksums.check(key.workload, sum, || key.label())?;
        Ok(Some(sample))
    })?;
    // 6. The report.
    let run = Run::new(
        (&data).into(),
        started,
        workloads,
        threads,
        columns,
        cells,
        Warm {
            full: args.full,
            repetitions: (passes, reps.from()),
            handler_threads: args.handler_threads,
            warm_up: engines.warm_up(),
            huge_warm_up: engines.huge_warm_up(),
            huge_skipped,
            probe_cpus: engines.probes().handler_cpus().to_vec(),
            probe_skipped,
        },
    );
    run.write(args)
}

/// All folio samples of one engine's cells together.
fn folios(run: &Run, engine: Engine) -> Option<FolioSample> {
    let cells = run.cells.iter().filter(|c| c.key.column == engine);
    cells
        .flat_map(|c| c.samples.iter().filter_map(|s| s.folios))
        .reduce(FolioSample::merge)
}

/// The lowest residency of kernel-file's page cache before a walk.
fn min_resident_pct<'a>(samples: impl Iterator<Item = &'a grid::Sample>) -> Option<f64> {
    samples.filter_map(|s| s.resident_pct).reduce(f64::min)
}

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

impl grid::Mode for Warm {
    type Workload = Workload;
    type Column = Engine;

    /// The whole report: header, one table per workload, headline, legend.
    fn render(run: &Run) -> String {
        let title = if run.mode.full {
            "faultmap bench --full: the fault-around benchmark, faultmap against kernel mmap"
        } else {
            "faultmap bench: the fault-around benchmark (a representative subset; --full for the \
         whole table), faultmap against kernel mmap"
        };
        let mut out = run.header(title, header_lines(run));
        for &w in &run.workloads {
            let grid = run.grid(w, &run.threads, &LINES);
            out.push_str(&format!("\n{}: {}\n{grid}", w.name(), w.describe()));
        }
        out.push_str(&headline(run));
        out.push_str(LEGEND);
        out
    }

    /// The settings in the document's `machine` object.
    fn settings(run: &Run) -> Value {
        let kind = |e| folios(run, e).unwrap_or_default().kind().name();
        let w = &run.mode.warm_up;
        let (passes, from) = run.mode.repetitions;
        json!({
            "full": run.mode.full,
            "repetitions": passes,
            "repetitions_from": match from {
                RepsFrom::Argument => "argument",
                RepsFrom::Short => "short",
                RepsFrom::Budget => "budget",
            },
            "repetitions_budget_seconds": (from == RepsFrom::Budget).then(|| BUDGET.as_secs()),
            "handler_threads": run.mode.handler_threads,
            "deliveries": run.deliveries.iter().map(|&d| crate::delivery_name(d)).collect::<Vec<_>>(),
            "kernel_file_folios": kind(Engine::KernelFile),
            "kernel_file_resident_pct_min": min_resident_pct(run.cells.iter().flat_map(|c| &c.samples)),
            "kernel_memfd_folios": kind(Engine::KernelMemfd),
            "uffd_probe_cpus": run.mode.probe_cpus,
            "uffd_probe_skipped": run.mode.probe_skipped,
            "faultmap_warm_seconds": w.seconds,
            "faultmap_warm_io_count": w.stats.io_count,
            "faultmap_warm_io_bytes": w.stats.io_bytes,
            "faultmap_cached_pct": w.cached_pct,
            "faultmap_2m_warm_seconds": run.mode.huge_warm_up.map(|w| w.seconds),
            "faultmap_2m_cached_pct": run.mode.huge_warm_up.map(|w| w.cached_pct),
            "page_size_skipped": run.mode.huge_skipped,
            "wall_seconds": run.wall_seconds,
        })
    }

    /// A cell's JSON row.
    fn row(run: &Run, cell: &Cell) -> Row {
        let engine = cell.key.column;
        let folios = cell.samples.iter().filter_map(|s| s.folios);
        let folios = folios.reduce(FolioSample::merge);
        let mut row = Row::new(run, cell);
        row.order = engine.order();
        row.with("delivery", engine.delivery().map(crate::delivery_name))
            .with("page_size", engine.page_size().map(|p| p.bytes() as u64))
            .with(
                "fault_around_pages",
                cell.median_u64(|s| s.fault_around_pages),
            )
            .with("folios", folios.map(|f| f.kind().name()))
            .with("folio_sample", folios)
            .with("resident_pct", min_resident_pct(cell.samples.iter()))
    }

    /// Per workload, time and faults against the fault-around order: a line
    /// per delivery mode and thread count, the kernel and uffd-probe columns
    /// as horizontal reference lines.
    fn figure(run: &Run) -> Figure {
        type Value = fn(&grid::Cell<Workload, Engine>) -> f64;
        let values: [(&str, Value); 2] = [
            ("time, seconds", |c| c.seconds()),
            ("minor faults", |c| {
                c.median_u64(|s| s.faults).unwrap_or(0) as f64
            }),
        ];
        let mut panels = Vec::new();
        for &w in &run.workloads {
            for (what, value) in values {
                let mut series = Vec::new();
                for &threads in &run.threads {
                    let cell = |e| run.cell(w, threads, e);
                    for &d in &run.deliveries {
                        let points = run
                            .columns
                            .iter()
                            .filter(|e| e.delivery() == Some(d))
                            .filter_map(|&e| Some((f64::from(e.order()?), value(cell(e)?))))
                            .collect();
                        let label = format!(
                            "faultmap {}, {}",
                            crate::delivery_name(d),
                            threads_label(threads)
                        );
                        series.push(Series::line(label, points));
                    }
                    for &k in run.columns.iter().filter(|e| e.order().is_none()) {
                        if let Some(c) = cell(k) {
                            let label =
                                format!("{}, {}", reference_name(k), threads_label(threads));
                            series.push(Series::reference(label, value(c)));
                        }
                    }
                }
                panels.push(Panel {
                    title: format!("{}: {what}", w.name()),
                    x_label: "fault-around order".into(),
                    y_label: what.into(),
                    log_y: true,
                    series,
                    ..Panel::default()
                });
            }
        }
        Figure { panels, columns: 2 }
    }
}

/// A reference column's name in the plot: `kernel-memfd`,
/// `uffd-probe same-cpu`, `faultmap order=auto,delivery=handler`.
fn reference_name(engine: Engine) -> String {
    match engine {
        Engine::UffdProbe(cpu) => format!("{} {}", engine.name(), cpu.heading()),
        Engine::Faultmap { .. } => format!("{} {}", engine.name(), engine.variant()),
        _ => engine.name().into(),
    }
}

fn header_lines(run: &Run) -> Vec<(&'static str, String)> {
    let (passes, from) = run.mode.repetitions;
    let how = match from {
        RepsFrom::Argument => format!("{passes} per cell"),
        RepsFrom::Short => format!(
            "{MAIN_REPETITIONS} per cell, up to {SHORT_REPS} for cells under {} ms a sample",
            SHORT_CELL.as_millis()
        ),
        RepsFrom::Budget => format!(
            "{MIN_REPS} per cell, up to {SHORT_REPS} for cells under {} ms a sample and up to \
             {MAX_REPS} for cells that fit {} s in all",
            SHORT_CELL.as_millis(),
            CELL_BUDGET.as_secs()
        ),
    };
    let resident = min_resident_pct(run.cells.iter().flat_map(|c| &c.samples))
        .map_or("not measured".to_string(), |p| {
            format!("at least {p:.1}% resident")
        });
    let w = &run.mode.warm_up;
    vec![
        (
            "repetitions",
            format!(
                "{how}; each cell is the median of its samples; total wall time {:.1} s",
                run.wall_seconds
            ),
        ),
        (
            "kernel-file",
            format!(
                "page cache re-read before every repetition, then {resident}; folios: {}",
                folio_text(folios(run, Engine::KernelFile))
            ),
        ),
        (
            "kernel-memfd",
            format!(
                "a memfd copy of the data; folios: {}",
                folio_text(folios(run, Engine::KernelMemfd))
            ),
        ),
        ("uffd-probe", probe_text(run)),
        ("page=2M", huge_text(run)),
        (
            "faultmap",
            format!(
                "{}; {} pager thread(s) with signal delivery, one pinned handler thread per CPU with handler delivery; cache filled once before the runs in {:.2} s \
                 ({} store reads, {}), {:.1}% cached",
                grid::deliveries_text(&run.deliveries),
                run.mode.handler_threads,
                w.seconds,
                units::count(w.stats.io_count),
                units::bytes(w.stats.io_bytes),
                w.cached_pct
            ),
        ),
    ]
}

/// The header line of the 2 MiB columns: how their cache was filled, or
/// why they were not measured.
fn huge_text(run: &Run) -> String {
    match (&run.mode.huge_warm_up, &run.mode.huge_skipped) {
        (Some(w), _) => format!(
            "faultmap with 2 MiB pages: a hugetlb cache (huge pages reserved through \
             /proc/sys/vm/nr_hugepages for the run, then given back), one UFFDIO_CONTINUE per \
             2 MiB page; cache filled once in {:.2} s ({} store reads), {:.1}% cached",
            w.seconds,
            units::count(w.stats.io_count),
            w.cached_pct
        ),
        (None, Some(why)) => why.clone(),
        (None, None) => "not measured (--page-size 2M)".into(),
    }
}

/// The uffd-probe's header line: what it is, where its threads ran.
fn probe_text(run: &Run) -> String {
    let cpus: Vec<String> = run.mode.probe_cpus.iter().map(usize::to_string).collect();
    let skipped = run.mode.probe_skipped.as_ref();
    format!(
        "kernel-memfd's memfd registered MINOR, a bare handler thread per CPU ({}) answering \
         each fault with one UFFDIO_CONTINUE; walking thread i pinned to CPU number i mod N of \
         the N this process may use, its handler on that CPU (same-cpu) or the next \
         (cross-cpu){}",
        cpus.join(", "),
        skipped.map_or(String::new(), |why| format!("; {why}"))
    )
}

fn folio_text(sample: Option<FolioSample>) -> String {
    match sample {
        Some(s) if s.sampled > 0 => format!(
            "{} ({} of {} sampled pages in large folios)",
            s.kind().name(),
            units::count(u64::from(s.large)),
            units::count(u64::from(s.sampled))
        ),
        _ => "unknown (page frames unreadable: /proc/self/pagemap and /proc/kpageflags need root)"
            .into(),
    }
}

/// The lines of a workload's table.
const LINES: [Line<Warm>; 5] = [
    ("minor-faults", |r, k| r.count(k, |s| s.faults)),
    ("major-faults", |r, k| {
        // Only where some cell of the workload had major faults.
        let mut cells = r.cells.iter().filter(|c| c.key.workload == k.workload);
        let any = cells.any(|c| c.median_u64(|s| s.major_faults).unwrap_or(0) > 0);
        if any {
            r.count(k, |s| s.major_faults)
        } else {
            String::new()
        }
    }),
    ("time, seconds", |r, k| r.time(k, 6)),
    ("vs kernel-file", |r, k| versus(r, k, Engine::KernelFile)),
    ("vs kernel-memfd", |r, k| versus(r, k, Engine::KernelMemfd)),
];

/// `reference`'s time over the column's (blank in the reference's own).
fn versus(run: &Run, k: Key, reference: Engine) -> String {
    if k.column == reference {
        return String::new();
    }
    let s = |e| run.seconds(k.workload, k.threads, e);
    grid::two(
        s(reference)
            .zip(s(k.column))
            .and_then(|(r, s)| grid::ratio(r, s)),
    )
}

/// Per workload, delivery and thread count: faultmap's fastest order, and
/// its time over the kernel columns'.
fn headline(run: &Run) -> String {
    let mut t = crate::table::Table::new(4);
    for &w in &run.workloads {
        for &d in &run.deliveries {
            for &threads in &run.threads {
                // Fault-around orders only: the 2 MiB pages have their own
                // headline.
                let faultmap = run
                    .columns
                    .iter()
                    .filter(|e| e.delivery() == Some(d) && e.page_size() == Some(PageSize::Base));
                let best = faultmap
                    .filter_map(|&e| Some((e, run.seconds(w, threads, e)?)))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                let Some((best, seconds)) = best else {
                    continue;
                };
                let versus = |k: Engine| {
                    let r = run
                        .seconds(w, threads, k)
                        .and_then(|k| grid::ratio(seconds, k));
                    format!("{} × {}", grid::two(r), k.name())
                };
                t.row([
                    w.name().to_string(),
                    crate::delivery_name(d).to_string(),
                    threads_label(threads),
                    best.heading(),
                    format!("{seconds:.6} s"),
                    versus(Engine::KernelFile),
                    versus(Engine::KernelMemfd),
                ]);
            }
        }
    }
    format!(
        "\nheadline: faultmap's fastest order, its time over kernel mmap's (below 1: faultmap \
         was faster)\n{}{}{}{}{}",
        t.render(),
        per_fault(run),
        protect_lines(run),
        auto_headline(run),
        huge_headline(run)
    )
}

/// Adaptive fault-around's target: its time at most this many times the
/// fastest fixed order's.
const AUTO_WITHIN: f64 = 1.10;

/// Per workload, delivery and thread count: adaptive fault-around's time
/// over the best fixed order's, and whether it is within [`AUTO_WITHIN`]
/// (empty without an `order=auto` column and a fixed one).
fn auto_headline(run: &Run) -> String {
    let mut t = crate::table::Table::new(3);
    for &w in &run.workloads {
        for &d in &run.deliveries {
            for &threads in &run.threads {
                let auto = Engine::Faultmap {
                    order: AUTO,
                    delivery: d,
                    page: PageSize::Base,
                };
                let Some(auto_s) = run.seconds(w, threads, auto) else {
                    continue;
                };
                let best = run
                    .columns
                    .iter()
                    .filter(|e| {
                        e.delivery() == Some(d)
                            && e.page_size() == Some(PageSize::Base)
                            && e.order().is_some()
                    })
                    .filter_map(|&e| Some((e, run.seconds(w, threads, e)?)))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                let Some((best, best_s)) = best else {
                    continue;
                };
                let ratio = grid::ratio(auto_s, best_s);
                // Judged as printed, to two decimals.
                let within = match ratio {
                    Some(r) if (r * 100.0).round() <= AUTO_WITHIN * 100.0 => "within 10 %",
                    Some(_) => "not within 10 %",
                    None => "",
                };
                t.row([
                    w.name().to_string(),
                    crate::delivery_name(d).to_string(),
                    threads_label(threads),
                    format!("order=auto {auto_s:.6} s"),
                    format!("best fixed {} {best_s:.6} s", best.heading()),
                    format!("auto ÷ best {}x", grid::two(ratio)),
                    within.to_string(),
                ]);
            }
        }
    }
    let text = t.render();
    if text.is_empty() {
        return text;
    }
    format!(
        "\nadaptive fault-around: order=auto's time over the fastest fixed order's in the same \
         run (medians; the fastest of several noisy columns is biased low)\n{text}"
    )
}

/// Per workload, delivery and thread count: the 2 MiB pages' time, and
/// kernel-file's time over it (above 1: faultmap was faster); empty
/// without 2 MiB columns.
fn huge_headline(run: &Run) -> String {
    let mut t = crate::table::Table::new(3);
    let mut rows = 0;
    for &w in &run.workloads {
        for &d in &run.deliveries {
            for &threads in &run.threads {
                let huge = Engine::Faultmap {
                    order: 0,
                    delivery: d,
                    page: PageSize::Huge,
                };
                let Some(seconds) = run.seconds(w, threads, huge) else {
                    continue;
                };
                let over = |k: Engine| {
                    let r = run
                        .seconds(w, threads, k)
                        .and_then(|k| grid::ratio(k, seconds));
                    format!("{} ÷ page=2M {}x", k.name(), grid::two(r))
                };
                rows += 1;
                t.row([
                    w.name().to_string(),
                    crate::delivery_name(d).to_string(),
                    threads_label(threads),
                    format!("page=2M {seconds:.6} s"),
                    over(Engine::KernelFile),
                    over(Engine::KernelMemfd),
                ]);
            }
        }
    }
    if rows == 0 {
        return String::new();
    }
    format!(
        "\n2 MiB pages: kernel mmap's time over faultmap's with 2 MiB pages (above 1: faultmap \
         was faster)\n{}",
        t.render()
    )
}

/// Per workload and thread count: handler delivery's time per fault at
/// order 0, and its ratios to signal delivery's and the uffd-probe
/// same-cpu's (blank without handler delivery at order 0).
fn per_fault(run: &Run) -> String {
    let handler = Engine::Faultmap {
        order: 0,
        delivery: Fault::Handler,
        page: PageSize::Base,
    };
    let signal = Engine::Faultmap {
        order: 0,
        delivery: Fault::Signal,
        page: PageSize::Base,
    };
    let mut t = crate::table::Table::new(2);
    for &w in &run.workloads {
        for &threads in &run.threads {
            let per = |e| per_fault_seconds(run, w, threads, e);
            let Some(h) = per(handler) else {
                continue;
            };
            let over = |e| grid::two(per(e).and_then(|x| grid::ratio(h, x)));
            t.row([
                w.name().to_string(),
                threads_label(threads),
                format!("{:.2} µs/fault", h * 1e6),
                format!("handler/signal {}x", over(signal)),
                format!(
                    "handler/probe-same {}x",
                    over(Engine::UffdProbe(ProbeCpu::Same))
                ),
            ]);
        }
    }
    let text = t.render();
    if text.is_empty() {
        return text;
    }
    format!("\nhandler delivery per fault at order 0 (time / faults), over signal's and the bare round trip's\n{text}")
}

/// Per workload and thread count, with `--engine protect`: the protect
/// engine's time against userfaultfd signal delivery's, at each order
/// both ran (above 1: protect was slower), and each one's time per fault
/// at order 0.
fn protect_lines(run: &Run) -> String {
    let at = |order, delivery| Engine::Faultmap {
        order,
        delivery,
        page: PageSize::Base,
    };
    let orders: Vec<u8> = run
        .columns
        .iter()
        .filter_map(|e| match *e {
            Engine::Faultmap {
                order,
                delivery: Fault::Protect,
                page: PageSize::Base,
            } => Some(order),
            _ => None,
        })
        .collect();
    let mut t = crate::table::Table::new(2);
    for &w in &run.workloads {
        for &threads in &run.threads {
            let mut row = vec![w.name().to_string(), threads_label(threads)];
            for &order in &orders {
                let ratio = run
                    .seconds(w, threads, at(order, Fault::Protect))
                    .zip(run.seconds(w, threads, at(order, Fault::Signal)))
                    .and_then(|(p, s)| grid::ratio(p, s));
                row.push(format!(
                    "order={} {}x",
                    crate::order_name(order),
                    grid::two(ratio)
                ));
            }
            let per = |d| per_fault_seconds(run, w, threads, at(0, d));
            if let (Some(p), Some(s)) = (per(Fault::Protect), per(Fault::Signal)) {
                row.push(format!(
                    "order=0 per fault: protect {:.2} µs, signal {:.2} µs",
                    p * 1e6,
                    s * 1e6
                ));
            }
            if row.len() > 2 {
                t.row(row);
            }
        }
    }
    let text = t.render();
    if text.is_empty() {
        return text;
    }
    format!(
        "
the protect engine: its time over userfaultfd signal delivery's per order (above 1: \
         protect was slower), and both per fault at order 0\n{text}"
    )
}

/// A cell's median time over its median faults.
fn per_fault_seconds(run: &Run, workload: Workload, threads: u16, engine: Engine) -> Option<f64> {
    let cell = run.cell(workload, threads, engine)?;
    let faults = cell.median_u64(|s| s.faults)?;
    grid::ratio(cell.seconds(), faults as f64)
}

const LEGEND: &str = "
minor-faults: getrusage minor faults of the process during the walk (kernel and uffd-probe \
columns), faults handled by faultmap (pgfault, order=N columns); all threads together, each \
thread walking its own mapping of the whole file.
signal / handler / protect: faultmap's fault delivery (a SIGBUS handler in the faulting thread, or a \
handler thread reading userfaultfd messages), or the protect engine (--engine protect: no \
userfaultfd; a SIGSEGV handler in the faulting thread maps with mprotect).
uffd-probe same-cpu / cross-cpu: the bare userfaultfd round trip (a handler thread, one \
UFFDIO_CONTINUE per page), the walking thread pinned to the handler's CPU or to another.
vs X: X's median time divided by the column's; above 1, the column was faster than X.
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
    use crate::bench::grid::{Cell, DataInfo, Sample};

    /// A run of seq on 1 thread with `(engine, seconds, faults)` cells.
    fn report_of(cells: &[(Engine, f64, u64)], probe_skipped: Option<String>) -> Run {
        let cells = cells
            .iter()
            .map(|&(engine, seconds, faults)| {
                let mut cell = Cell::new(Workload::Seq, 1, engine);
                cell.samples.push(Sample {
                    seconds,
                    faults: Some(faults),
                    ..Sample::default()
                });
                cell
            })
            .collect::<Vec<_>>();
        let columns = cells.iter().map(|c| c.key.column).collect();
        Run::new(
            DataInfo::test(),
            Instant::now(),
            vec![Workload::Seq],
            vec![1],
            columns,
            cells,
            Warm {
                full: false,
                repetitions: (1, RepsFrom::Argument),
                handler_threads: 1,
                warm_up: WarmUp {
                    seconds: 0.0,
                    stats: faultmap::Stats::default(),
                    cached_pct: 100.0,
                },
                huge_warm_up: None,
                huge_skipped: None,
                probe_cpus: vec![0],
                probe_skipped,
            },
        )
    }

    fn order0(delivery: Fault) -> Engine {
        Engine::Faultmap {
            order: 0,
            delivery,
            page: PageSize::Base,
        }
    }

    #[test]
    fn the_headline_compares_handler_delivery_per_fault() {
        // Per fault: handler 4 µs, signal 2 µs, probe 1 µs (half the faults).
        let run = report_of(
            &[
                (Engine::UffdProbe(ProbeCpu::Same), 0.001, 1000),
                (order0(Fault::Signal), 0.004, 2000),
                (order0(Fault::Handler), 0.008, 2000),
            ],
            Some("uffd-probe cross-cpu skipped: this process may use CPU 0 only".into()),
        );
        let text = per_fault(&run);
        for needle in [
            "seq  1 thread",
            "4.00 µs/fault",
            "handler/signal 2.00x",
            "handler/probe-same 4.00x",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        let report = grid::Mode::render(&run);
        assert!(report.contains("same-cpu"), "{report}");
        assert!(report.contains("cross-cpu skipped"), "{report}");
        // Without handler delivery at order 0 there is nothing to compare.
        let run = report_of(&[(order0(Fault::Signal), 0.004, 2000)], None);
        assert_eq!(per_fault(&run), "");
    }

    #[test]
    fn the_headline_compares_auto_with_the_fastest_fixed_order() {
        let order = |order| Engine::Faultmap {
            order,
            delivery: Fault::Signal,
            page: PageSize::Base,
        };
        let run = report_of(
            &[
                (order(0), 0.9, 1000),
                (order(9), 0.2, 10),
                (order(AUTO), 0.21, 20),
                (order0(Fault::Handler), 0.1, 1000),
            ],
            None,
        );
        let text = auto_headline(&run);
        for needle in [
            "seq  signal  1 thread",
            "order=auto 0.210000 s",
            "best fixed order=9 0.200000 s",
            "auto ÷ best 1.05x",
            "within 10 %",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        assert!(!text.contains("not within"), "{text}");
        // Handler delivery has no auto column: no row.
        assert!(!text.contains("handler"), "{text}");
        assert!(grid::Mode::render(&run).contains("adaptive fault-around"));
        let slow = report_of(&[(order(9), 0.2, 10), (order(AUTO), 0.25, 20)], None);
        let text = auto_headline(&slow);
        assert!(
            text.contains("auto ÷ best 1.25x  not within 10 %"),
            "{text}"
        );
        // Nothing to compare without an auto column.
        assert_eq!(auto_headline(&report_of(&[(order(9), 0.2, 10)], None)), "");
    }

    #[test]
    fn probe_rows_have_no_order_nor_delivery() {
        let probe = Engine::UffdProbe(ProbeCpu::Cross);
        let run = report_of(&[(probe, 0.5, 256)], None);
        let row = serde_json::to_value(grid::Mode::row(&run, &run.cells[0])).unwrap();
        assert_eq!(row["engine"], "uffd-probe");
        assert_eq!(row["variant"], "cpu=cross");
        assert!(row["order"].is_null() && row["delivery"].is_null(), "{row}");
        assert_eq!(row["faults"], 256);
    }
}
