//! `faultmap bench --parts` and `--churn`: the concurrency benchmarks, faultmap
//! against kernel `mmap` of a memfd holding the same data, in one process,
//! one run.
//!
//! # parts: the lockless page cache benchmark
//!
//! The kernel's lockless page cache was shown with 64 processes each read-fault their own 512 MB part of a
//! file preloaded in the page cache. With every page-cache lookup taking
//! `mapping->tree_lock`, 64 processes took 2.5 times as long as one; with
//! lockless lookups they ran in parallel. Here, on one cached object:
//!
//! ```text
//!   object (cached)   |--- part 0 ---|--- part 1 ---| ... |-- part T-1 --|
//!   thread i          maps part i alone at order 0 and touches one byte per
//!                     page: one fault = one page lookup + one UFFDIO_CONTINUE
//! ```
//!
//! Columns: `kernel-memfd` (the threads' parts mapped with kernel mmap),
//! `lock-free` (faultmap's cache) and `global-mutex`
//! (`Config::bench_global_cache_lock`: every page lookup serialises on one
//! mutex, the cache before lockless lookups). The delivery is signal by
//! default, so each thread resolves its own faults, as each process did:
//! with handler delivery, one handler thread takes every fault, and the
//! benchmark measures that thread, not the cache.
//!
//! # churn: the speculative fault benchmark (ebizzy)
//!
//! Speculative page faults were shown on ebizzy, whose threads fault while others mmap and munmap.
//! When every fault takes mmap_sem, the faults wait for those changes;
//! speculative faults do not. Here:
//!
//! ```text
//!   thread i < T   its own mapping of part i (order 0): touch one byte per
//!                  page, MADV_DONTNEED the mapping, again, for --duration
//!   thread T       map a 64 KiB region of the data, unmap the oldest of the
//!                  CHURN_LIVE it keeps, again, until the others are done
//! ```
//!
//! Columns: `kernel-memfd` (kernel mmap; the churn thread calls mmap and
//! munmap), then `speculative` and `classic` (`Config::region_lookup`) per
//! delivery mode, both by default. With signal delivery a classic fault's
//! SIGBUS handler takes the table's lock itself and resolves a hit under
//! it; with handler delivery both lookups run on the handler thread. Either
//! way `classic` against `speculative` compares the lookups on one path.
//!
//! # The orchestrator
//!
//! [`run`] reads top to bottom:
//!
//! 1. the settings, checked before anything costly;
//! 2. a pager: without userfaultfd nothing else is worth doing;
//! 3. the data: the file, its memfd copy, and faultmap's object with its
//!    cache filled once through that pager;
//! 4. the cells: per thread count, every column, each thread count with its
//!    parts (cut on 64 KiB boundaries);
//! 5. the measurements: repetitions outermost, then thread count and
//!    column, so that the columns of a row are measured seconds apart and
//!    the machine's noise hits them alike. Every faultmap sample starts a
//!    new pager over the one object, so that pager's counters are the
//!    sample's ([`parts`], [`churn`]). Every parts sample must read the same
//!    bytes: an engine that served wrong ones fails the benchmark;
//! 6. the report: the table, or the JSON document; and the plot.
//!
//! # The report
//!
//! ```text
//!   parts: each thread touches one byte per page of its own 1/T of the data
//!                                        kernel-memfd   lock-free  global-mutex
//!   1 thread   faults                           4,096      65,536        65,536
//!              time, seconds                 0.025000    0.580000      0.600000
//!              faults/s                       163,840     112,993       109,226
//!              vs kernel-memfd, time                         0.04          0.04
//!              vs global-mutex, faults/s                     1.03
//!   2 threads  ...
//!              vs 1 thread, faults/s             1.80        1.93          1.10
//! ```
//!
//! churn's table has, per thread count: faults, pages touched, time,
//! faults/s, pages/s, the ratio to kernel-memfd's pages/s, speculative over
//! classic, the churn thread's maps/s, and the pager's `spf_success`,
//! `spf_abort`, `spf_fallback` and `forwarded`. A row that applies to no
//! column of a thread count is left out. Every number is the median over
//! the repetitions (rates are the medians of the samples' rates); the
//! counters are those of the median sample by faults/s.
//!
//! The goals: parts scales by at least 1.7 from 1 to 2 threads (a lockless
//! cache scales linearly); churn's speculative lookup serves at least twice
//! the faults/s of the classic one (speculative faults gained 4x on ebizzy
//! on 16 CPUs).
//!
//! JSON rows: `workload` `parts` or `churn`; `engine` `kernel-memfd` or
//! `faultmap`; `variant` `default` (the kernel), `cache=lock-free` or
//! `cache=global-mutex` (parts), `lookup=speculative` or `lookup=classic`
//! (churn), followed by `,delivery=handler` for handler delivery. Extra
//! fields: `delivery`, `cache` and `region_lookup` (faultmap),
//! `pages_touched`, `faults_per_second`, `pages_per_second`, for churn
//! `maps` and `maps_per_second`, and for faultmap `spf_success`,
//! `spf_abort`, `spf_fallback`, `forwarded` and the whole `stats` of the
//! median sample. The machine object adds the settings and `goals`.

mod churn;
mod parts;

use std::fs::File;
use std::ops::Range;
use std::time::{Duration, Instant};

use crate::Fault;
use anyhow::{bail, Context, Result};
use faultmap::{Config, FileStore, Object, Pager, RegionLookup, Stats, PAGE_SIZE};
use serde_json::{json, Value};

use self::churn::{CHURN_LIVE, CHURN_PAGES};
use super::engine::{warm_object, WarmUp};
use super::grid::{self, rate, ratio, Checksums, Goal, Line, Row, Sample};
use super::plot::{Figure, Panel, Series};
use super::reps::Repetitions;
use super::{dedup, deliveries, note, or_default};
use crate::access::split;
use crate::{units, BenchArgs, DeliveryArg};
/// Which of the two benchmarks: the `workload` of its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The lockless page cache: threads fault on their own parts of one cached object.
    Parts,
    /// Speculative faults: threads fault while another maps and unmaps.
    Churn,
}

/// `--size` without the option: parts' 65,536 pages take about 0.6 s per
/// lock-free sample on one thread here.
const PARTS_SIZE: u64 = 256 << 20;

/// `--size` without the option: a churn thread's pass over its part is
/// short enough that the deadline ends few passes half-way.
const CHURN_SIZE: u64 = 64 << 20;

/// `--repetitions` without the option.
const PARTS_REPETITIONS: u32 = 5;

/// `--repetitions` without the option.
const CHURN_REPETITIONS: u32 = 3;

/// `--duration` without the option.
const CHURN_DURATION: Duration = Duration::from_secs(1);

/// parts: the least faults/s gain from 1 to 2 threads.
pub const PARTS_SCALING: f64 = 1.7;

/// churn: the least faults/s gain of speculative over classic lookup.
pub const CHURN_GAIN: f64 = 2.0;

impl grid::Named for Kind {
    /// The `workload` field of a JSON row.
    fn name(self) -> &'static str {
        match self {
            Kind::Parts => "parts",
            Kind::Churn => "churn",
        }
    }
}

impl Kind {
    /// The faultmap settings the columns compare.
    fn settings(self) -> [Setting; 2] {
        match self {
            Kind::Parts => [Setting::LockFree, Setting::GlobalMutex],
            Kind::Churn => [Setting::Speculative, Setting::Classic],
        }
    }

    /// The delivery modes without `--delivery`.
    fn deliveries(self) -> &'static [DeliveryArg] {
        match self {
            Kind::Parts => &[DeliveryArg::Signal],
            Kind::Churn => &[DeliveryArg::Signal, DeliveryArg::Handler],
        }
    }
}

/// The faultmap setting a column varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// parts: the cache as it is, lookups without a lock.
    LockFree,
    /// parts: every page lookup under one global mutex.
    GlobalMutex,
    /// churn: `RegionLookup::Speculative`.
    Speculative,
    /// churn: `RegionLookup::Classic`.
    Classic,
}

impl Setting {
    /// The column heading, and the value in the variant.
    pub fn name(self) -> &'static str {
        match self {
            Setting::LockFree => "lock-free",
            Setting::GlobalMutex => "global-mutex",
            Setting::Speculative => "speculative",
            Setting::Classic => "classic",
        }
    }

    /// The variant's key: what the setting is of.
    pub fn key(self) -> &'static str {
        match self {
            Setting::LockFree | Setting::GlobalMutex => "cache",
            Setting::Speculative | Setting::Classic => "lookup",
        }
    }

    /// `base` with this setting.
    fn apply(self, base: Config) -> Config {
        match self {
            Setting::LockFree => base,
            Setting::GlobalMutex => {
                let mut config = base;
                config.bench_global_cache_lock = true;
                config
            }
            Setting::Speculative => base.region_lookup(RegionLookup::Speculative),
            Setting::Classic => base.region_lookup(RegionLookup::Classic),
        }
    }
}

/// A column of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    /// Kernel mmap of a memfd holding the same data.
    KernelMemfd,
    /// faultmap with a setting and a delivery mode.
    Faultmap {
        /// What the column varies.
        setting: Setting,
        /// How faults reach the pager.
        delivery: Fault,
    },
}

impl Column {
    /// The columns of a run: the kernel, then per delivery mode each
    /// setting of `kind`.
    pub fn all(kind: Kind, deliveries: &[Fault]) -> Vec<Column> {
        let mut columns = vec![Column::KernelMemfd];
        for &delivery in deliveries {
            for setting in kind.settings() {
                columns.push(Column::Faultmap { setting, delivery });
            }
        }
        columns
    }

    /// The setting, for faultmap.
    pub fn setting(self) -> Option<Setting> {
        match self {
            Column::Faultmap { setting, .. } => Some(setting),
            Column::KernelMemfd => None,
        }
    }
}

impl grid::Column for Column {
    fn heading(self) -> String {
        match self {
            Column::KernelMemfd => "kernel-memfd".into(),
            Column::Faultmap { setting, .. } => setting.name().into(),
        }
    }

    fn engine(self) -> &'static str {
        match self {
            Column::KernelMemfd => "kernel-memfd",
            Column::Faultmap { .. } => "faultmap",
        }
    }

    /// `cache=lock-free`, `lookup=classic,delivery=handler` (the delivery
    /// only when it is not the library's default).
    fn variant(self) -> String {
        match self {
            Column::KernelMemfd => "default".into(),
            Column::Faultmap { setting, delivery } if delivery == Fault::default() => {
                format!("{}={}", setting.key(), setting.name())
            }
            Column::Faultmap { setting, delivery } => format!(
                "{}={},delivery={}",
                setting.key(),
                setting.name(),
                crate::delivery_name(delivery)
            ),
        }
    }

    fn delivery(self) -> Option<Fault> {
        match self {
            Column::Faultmap { delivery, .. } => Some(delivery),
            Column::KernelMemfd => None,
        }
    }
}

/// The parts or churn benchmark's settings, beside its cells.
#[derive(Debug)]
pub struct Scaling {
    /// Which benchmark.
    kind: Kind,
    /// Repetitions per cell.
    repetitions: u32,
    /// faultmap handler threads.
    handler_threads: u16,
    /// churn: how long the threads faulted in each sample.
    duration: Option<Duration>,
    /// How faultmap's cache was filled.
    warm_up: WarmUp,
}

/// The parts or churn results.
type Run = grid::Report<Scaling>;

type Key = grid::Key<Kind, Column>;

type Cell = grid::Cell<Kind, Column>;

/// The thread counts without `--threads`: 1, 2, the powers of two up to
/// `cpus`, and `cpus`.
fn default_threads(cpus: usize) -> Vec<u16> {
    let cpus = u16::try_from(cpus).unwrap_or(u16::MAX).min(256);
    let mut threads = vec![1, 2];
    let mut t = 4;
    while t <= cpus {
        threads.push(t);
        t *= 2;
    }
    if cpus > 2 && !threads.contains(&cpus) {
        threads.push(cpus);
    }
    threads
}

/// What every sample measures: the one object, its kernel twin, and the
/// pagers' configuration.
pub(super) struct Bench<'a> {
    /// faultmap's object, its cache filled.
    pub object: &'a Object,
    /// A memfd holding the same bytes.
    pub memfd: &'a File,
    /// The data's length in bytes.
    pub len: u64,
    /// The configuration every column starts from.
    pub config: &'a Config,
    /// churn: how long the threads fault.
    pub duration: Duration,
}

impl Bench<'_> {
    /// A new pager for a sample of a faultmap column.
    fn pager(&self, column: Column) -> Result<Pager> {
        let Column::Faultmap { setting, delivery } = column else {
            bail!("the kernel column has no pager");
        };
        let config = setting.apply(delivery.configure(self.config.clone()));
        super::start_pager(config)
    }

    /// The bytes of `pages` inside the data, as an (offset, length) pair.
    fn bytes_of(&self, pages: &Range<u64>) -> (u64, u64) {
        let page = PAGE_SIZE as u64;
        let start = (pages.start * page).min(self.len);
        let end = (pages.end * page).min(self.len);
        (start, end - start)
    }
}

/// Runs `faultmap bench --parts` or `--churn`.
pub fn run(args: &BenchArgs, kind: Kind) -> Result<()> {
    let started = Instant::now();
    // 1. The arguments.
    let config = crate::stats::pager_config(args.handler_threads, args.io_threads);
    config.validate()?;
    let deliveries = deliveries(&args.delivery, kind.deliveries());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = dedup(or_default(&args.threads, &default_threads(cpus)));
    let columns = Column::all(kind, &deliveries);
    let (size, repetitions) = match kind {
        Kind::Parts => (PARTS_SIZE, PARTS_REPETITIONS),
        Kind::Churn => (CHURN_SIZE, CHURN_REPETITIONS),
    };
    let repetitions = args.repetitions.unwrap_or(repetitions);
    let duration = args.duration.unwrap_or(CHURN_DURATION);
    // 2. A pager.
    let pager = super::start_pager(config.clone())?;
    // 3. The data, its memfd copy, the object with its cache filled.
    let data = super::open_data(args, size)?;
    note("copying it into a memfd and filling faultmap's cache");
    let memfd = data.memfd_copy()?;
    let object = pager.open(FileStore::open(data.path())?)?;
    let warm_up = warm_object(&pager, &object)?;
    drop(pager);
    // 4. The cells, and each thread count's parts.
    let pages = data.len().div_ceil(PAGE_SIZE as u64);
    let plans: Vec<(u16, Vec<Range<u64>>)> = threads
        .iter()
        .map(|&t| (t, split(pages, usize::from(t))))
        .collect();
    let mut cells = grid::cells(&[kind], |_| threads.clone(), &columns);
    // 5. The measurements. Every parts sample reads every page once,
    //    however many threads: its byte sum must be the first one's.
    let bench = Bench {
        object: &object,
        memfd: &memfd,
        len: data.len(),
        config: &config,
        duration,
    };
    let mut checksums = Checksums::new();
    grid::measure(&mut cells, Repetitions::Fixed(repetitions), |key, _| {
        let parts = plans
            .iter()
            .find(|(t, _)| *t == key.threads)
            .map(|(_, parts)| parts.as_slice())
            .context("a thread count without parts")?;
        let sample = match kind {
            Kind::Parts => parts::measure(&bench, key.column, parts)?,
            Kind::Churn => churn::measure(&bench, key.column, parts)?,
        };
        if let Some(sum) = sample.checksum {
            checksums.check((), sum, || key.label())?;
        }
        Ok(Some(sample))
    })?;
    // 6. The report.
    let run = Run::new(
        (&data).into(),
        started,
        vec![kind],
        threads,
        columns,
        cells,
        Scaling {
            kind,
            repetitions,
            handler_threads: args.handler_threads,
            duration: (kind == Kind::Churn).then_some(duration),
            warm_up,
        },
    );
    run.write(args)
}

/// Faults per second of a sample.
fn faults_per_second(s: &Sample) -> f64 {
    rate(s.faults.unwrap_or(0), s.seconds)
}

/// Pages touched per second of a sample.
fn pages_per_second(s: &Sample) -> f64 {
    rate(s.pages_touched.unwrap_or(0), s.seconds)
}

/// The churn thread's maps per second of a sample.
fn maps_per_second(s: &Sample) -> Option<f64> {
    Some(rate(s.maps?, s.seconds))
}

/// The median of a count of a cell (0 if no sample has it).
fn med(c: &Cell, f: fn(&Sample) -> Option<u64>) -> u64 {
    c.median_u64(f).unwrap_or(0)
}

/// The counters of the median sample by faults/s.
fn median_stats(c: &Cell) -> Option<Stats> {
    c.median_sample_by(faults_per_second)?.stats
}

/// The median of a rate at a (thread count, column).
fn rate_of(run: &Run, threads: u16, column: Column, f: fn(&Sample) -> f64) -> Option<f64> {
    let cell = run.cell(run.mode.kind, threads, column)?;
    cell.median_f64(|s| Some(f(s)))
}

/// A combination's median faults/s.
fn fps(run: &Run, threads: u16, column: Column) -> Option<f64> {
    rate_of(run, threads, column, faults_per_second)
}

/// `column`'s faults/s at `threads` over its faults/s at 1 thread.
fn scaling(run: &Run, threads: u16, column: Column) -> Option<f64> {
    ratio(fps(run, threads, column)?, fps(run, 1, column)?)
}

/// `column`'s faults/s over those of the column of the same delivery with
/// setting `other`, at `threads`.
fn versus_setting(run: &Run, threads: u16, column: Column, other: Setting) -> Option<f64> {
    let delivery = grid::Column::delivery(column)?;
    let other = Column::Faultmap {
        setting: other,
        delivery,
    };
    ratio(fps(run, threads, column)?, fps(run, threads, other)?)
}

/// The goals, for every delivery mode (and, for churn, thread count) that
/// has the cells: (threads, delivery, goal).
fn goals(run: &Run) -> Vec<(u16, Fault, Goal)> {
    let mut goals = Vec::new();
    for &delivery in &run.deliveries {
        let column = |setting| Column::Faultmap { setting, delivery };
        let goal = |what: String, value, bound| Goal {
            place: String::new(),
            what: format!("{what}, {} delivery", crate::delivery_name(delivery)),
            value,
            bound,
            at_least: true,
        };
        match run.mode.kind {
            Kind::Parts => {
                if let Some(v) = scaling(run, 2, column(Setting::LockFree)) {
                    let what = "lock-free faults/s, 2 threads over 1 thread".to_string();
                    goals.push((2, delivery, goal(what, v, PARTS_SCALING)));
                }
            }
            Kind::Churn => {
                for &t in &run.threads {
                    let spf = column(Setting::Speculative);
                    if let Some(v) = versus_setting(run, t, spf, Setting::Classic) {
                        let what = format!("faults/s with {t} thread(s), speculative over classic");
                        goals.push((t, delivery, goal(what, v, CHURN_GAIN)));
                    }
                }
            }
        }
    }
    goals
}

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

impl grid::Mode for Scaling {
    type Workload = Kind;
    type Column = Column;

    /// The whole report.
    fn render(run: &Run) -> String {
        let kind = run.mode.kind;
        let title = match kind {
            Kind::Parts => {
                "faultmap bench --parts: the lockless page cache benchmark, threads faulting on \
             their own parts of one cached object"
            }
            Kind::Churn => {
                "faultmap bench --churn: the speculative fault benchmark, threads faulting \
             while another maps and unmaps (like ebizzy)"
            }
        };
        let mut out = run.header(title, header_lines(run));
        let what = match kind {
            Kind::Parts => {
                "parts: each thread touches one byte per page of its own contiguous 1/T of the \
             data, through its own mapping"
            }
            Kind::Churn => {
                "churn: each thread touches one byte per page of its own 1/T of the data"
            }
        };
        let how = match run.mode.duration {
            Some(d) => format!(
            "\n  through its own mapping, MADV_DONTNEED after each pass, for {:.2} s, while one \
             more thread maps a {} KiB region\n  and unmaps the oldest of the {CHURN_LIVE} it \
             keeps, in a loop",
            d.as_secs_f64(),
            CHURN_PAGES * PAGE_SIZE as u64 / 1024
        ),
            None => String::new(),
        };
        let lines = match kind {
            Kind::Parts => PARTS_LINES.as_slice(),
            Kind::Churn => CHURN_LINES.as_slice(),
        };
        let grid = run.grid(kind, &run.threads, lines);
        out.push_str(&format!("\n{what}{how}\n{grid}"));
        out.push_str(&grid::goals(goals(run).iter().map(|g| &g.2)));
        out.push_str(&notes(run));
        out.push_str(legend(kind));
        out
    }

    /// The settings in the document's `machine` object.
    fn settings(run: &Run) -> Value {
        let m = &run.mode;
        let churn = m.kind == Kind::Churn;
        let goals: Vec<_> = goals(run)
            .into_iter()
            .map(|(threads, delivery, g)| {
                let what = g.what.rsplit_once(", ").map_or(g.what.as_str(), |x| x.0);
                json!({"what": what, "threads": threads, "delivery": crate::delivery_name(delivery),
                   "value": g.value, "at_least": g.bound, "met": g.met()})
            })
            .collect();
        json!({
            "benchmark": grid::Named::name(m.kind),
            "repetitions": m.repetitions,
            "handler_threads": m.handler_threads,
            "order": 0,
            "deliveries": run.deliveries.iter().map(|&d| crate::delivery_name(d)).collect::<Vec<_>>(),
            "duration_seconds": m.duration.map(|d| d.as_secs_f64()),
            "churn_region_pages": churn.then_some(CHURN_PAGES),
            "churn_live_regions": churn.then_some(CHURN_LIVE),
            "faultmap_warm_seconds": m.warm_up.seconds,
            "faultmap_warm_io_count": m.warm_up.stats.io_count,
            "faultmap_warm_io_bytes": m.warm_up.stats.io_bytes,
            "faultmap_cached_pct": m.warm_up.cached_pct,
            "wall_seconds": run.wall_seconds,
            "goals": goals,
        })
    }

    /// A cell's JSON row.
    fn row(run: &Run, cell: &Cell) -> Row {
        let column = cell.key.column;
        let of = |key| {
            column
                .setting()
                .filter(|s| s.key() == key)
                .map(|s| s.name())
        };
        let stats = median_stats(cell);
        let counter = |f: fn(&Stats) -> u64| stats.as_ref().map(f);
        let mut row = Row::new(run, cell);
        row.order = column.setting().map(|_| 0);
        row.faults = Some(med(cell, |s| s.faults));
        row.major_faults = Some(med(cell, |s| s.major_faults));
        row.io_count = counter(|x| x.io_count);
        row.io_bytes = counter(|x| x.io_bytes);
        let rate = |f: fn(&Sample) -> f64| cell.median_f64(|s| Some(f(s))).unwrap_or(0.0);
        row.with(
            "delivery",
            grid::Column::delivery(column).map(crate::delivery_name),
        )
        .with("cache", of("cache"))
        .with("region_lookup", of("lookup"))
        .with("pages_touched", med(cell, |s| s.pages_touched))
        .with("faults_per_second", rate(faults_per_second))
        .with("pages_per_second", rate(pages_per_second))
        .with("maps", cell.median_u64(|s| s.maps))
        .with("maps_per_second", cell.median_f64(maps_per_second))
        .with("spf_success", counter(|x| x.spf_success))
        .with("spf_abort", counter(|x| x.spf_abort))
        .with("spf_fallback", counter(|x| x.spf_fallback))
        .with("forwarded", counter(|x| x.forwarded))
        .with("stats", stats)
    }

    /// Faults/s against the thread count, a line per column (and delivery).
    fn figure(run: &Run) -> Figure {
        use grid::Column as _;
        let series = run
            .columns
            .iter()
            .map(|&c| {
                let label = match c.delivery() {
                    Some(d) => format!("{}, {}", c.heading(), crate::delivery_name(d)),
                    None => c.heading(),
                };
                let points = run
                    .threads
                    .iter()
                    .filter_map(|&t| Some((f64::from(t), fps(run, t, c)?)));
                Series::line(label, points.collect())
            })
            .collect();
        let panel = Panel {
            title: format!("{}: faults/s per column", grid::Named::name(run.mode.kind)),
            x_label: "faulting threads".into(),
            y_label: "faults/s".into(),
            log_y: true,
            series,
            ..Panel::default()
        };
        Figure {
            panels: vec![panel],
            columns: 1,
        }
    }
}

fn header_lines(run: &Run) -> Vec<(&'static str, String)> {
    let w = &run.mode.warm_up;
    let faultmap = format!(
        "fault-around order 0 (one page lookup and one UFFDIO_CONTINUE per fault); \
         {} handler thread(s); a new pager per sample over one object, whose cache was \
         filled once before the runs in {:.2} s ({} store reads, {}), {:.1}% cached",
        run.mode.handler_threads,
        w.seconds,
        units::count(w.stats.io_count),
        units::bytes(w.stats.io_bytes),
        w.cached_pct
    );
    let (setting, kernel) = match run.mode.kind {
        Kind::Parts => (
            "lock-free: page lookups pin the page's state word with a CAS, no lock; \
             global-mutex: every page lookup under one process-wide mutex \
             (Config::bench_global_cache_lock), the cache before lockless lookups",
            "the same threads on kernel mmaps of a memfd holding the same data (4 KiB \
             shmem pages; the kernel maps its fault-around window, 16 pages, per fault)",
        ),
        Kind::Churn => (
            "speculative: a fault finds its region without a lock, validated by the \
             region's sequence count; classic: under the region table's lock, which map \
             and unmap hold throughout (like mmap_lock before SPF)",
            "the same on kernel mmaps of a memfd holding the same data (16 pages mapped \
             per fault), the churn thread calling mmap and munmap (mmap_lock for writing)",
        ),
    };
    let why = match run.mode.kind {
        Kind::Parts if run.deliveries.contains(&Fault::Handler) => {
            "; with handler delivery one handler thread takes every fault, so those columns \
             measure that thread, not the cache"
        }
        Kind::Parts => {
            ", so each thread resolves its own faults (with handler delivery one handler \
             thread would take every fault, and the benchmark would measure that thread, not \
             the cache)"
        }
        Kind::Churn if run.deliveries.contains(&Fault::Signal) => {
            "; with signal delivery a classic fault's SIGBUS handler takes the table's lock \
             itself, so each delivery's two columns compare the lookups on one path"
        }
        Kind::Churn => "",
    };
    vec![
        ("faultmap", faultmap),
        ("", setting.to_string()),
        (
            "delivery",
            format!("{}{why}", grid::deliveries_text(&run.deliveries)),
        ),
        ("kernel-memfd", kernel.to_string()),
        (
            "repetitions",
            format!(
                "{} per cell; each cell is the median of its samples; total wall time {:.1} s",
                run.mode.repetitions, run.wall_seconds
            ),
        ),
    ]
}

const PARTS_LINES: [Line<Scaling>; 6] = [
    ("faults", |r, k| r.count(k, |s| s.faults)),
    ("time, seconds", |r, k| r.time(k, 6)),
    ("faults/s", |r, k| show_rate(fps(r, k.threads, k.column))),
    ("vs kernel-memfd, time", |r, k| {
        let s = |c| r.seconds(k.workload, k.threads, c);
        versus_kernel(k.column, || ratio(s(Column::KernelMemfd)?, s(k.column)?))
    }),
    ("vs global-mutex, faults/s", |r, k| {
        only(k.column, Setting::LockFree, || {
            versus_setting(r, k.threads, k.column, Setting::GlobalMutex)
        })
    }),
    ("vs 1 thread, faults/s", |r, k| {
        if k.threads == 1 {
            return String::new();
        }
        grid::two(scaling(r, k.threads, k.column))
    }),
];

const CHURN_LINES: [Line<Scaling>; 12] = [
    ("faults", |r, k| r.count(k, |s| s.faults)),
    ("pages touched", |r, k| r.count(k, |s| s.pages_touched)),
    ("time, seconds", |r, k| r.time(k, 3)),
    ("faults/s", |r, k| show_rate(fps(r, k.threads, k.column))),
    ("pages/s", |r, k| {
        show_rate(rate_of(r, k.threads, k.column, pages_per_second))
    }),
    ("vs kernel-memfd, pages/s", |r, k| {
        let pps = |c| rate_of(r, k.threads, c, pages_per_second);
        versus_kernel(k.column, || {
            ratio(pps(k.column)?, pps(Column::KernelMemfd)?)
        })
    }),
    ("vs classic, faults/s", |r, k| {
        only(k.column, Setting::Speculative, || {
            versus_setting(r, k.threads, k.column, Setting::Classic)
        })
    }),
    ("churn maps/s", |r, k| {
        let cell = r.cell(k.workload, k.threads, k.column);
        show_rate(cell.map(|c| c.median_f64(maps_per_second).unwrap_or(0.0)))
    }),
    ("spf_success", |r, k| counter(r, k, |s| s.spf_success)),
    ("spf_abort", |r, k| counter(r, k, |s| s.spf_abort)),
    ("spf_fallback", |r, k| counter(r, k, |s| s.spf_fallback)),
    ("forwarded", |r, k| counter(r, k, |s| s.forwarded)),
];

fn show_rate(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| units::count(v.round() as u64))
}

/// A counter of the median sample (faultmap columns).
fn counter(run: &Run, k: Key, f: fn(&Stats) -> u64) -> String {
    let stats = run
        .cell(k.workload, k.threads, k.column)
        .and_then(median_stats);
    grid::count(stats.as_ref().map(f))
}

/// A ratio against the kernel column: blank in the kernel's own.
fn versus_kernel(column: Column, value: impl FnOnce() -> Option<f64>) -> String {
    if column == Column::KernelMemfd {
        return String::new();
    }
    grid::two(value())
}

/// A ratio shown only in the columns of `setting`.
fn only(column: Column, setting: Setting, value: impl FnOnce() -> Option<f64>) -> String {
    if column.setting() != Some(setting) {
        return String::new();
    }
    grid::two(value())
}
/// What the counters showed that the reader should know: a classic column
/// whose faults were resolved speculatively is not the comparison it claims
/// to be.
fn notes(run: &Run) -> String {
    let mut out = String::new();
    for cell in &run.cells {
        let Column::Faultmap {
            setting: Setting::Classic,
            delivery,
        } = cell.key.column
        else {
            continue;
        };
        let Some(stats) = median_stats(cell).filter(|s| s.spf_success > 0) else {
            continue;
        };
        out.push_str(&format!(
            "\nnote: classic, {} delivery, {} thread(s): the library resolved {} of {} faults \
             on a speculatively found region (spf_success), so this column does not measure \
             the classic lookup.\n",
            crate::delivery_name(delivery),
            cell.key.threads,
            units::count(stats.spf_success),
            units::count(stats.pgfault)
        ));
    }
    out
}

fn legend(kind: Kind) -> &'static str {
    match kind {
        Kind::Parts => {
            "\nfaults: faultmap's pgfault (one per page at order 0), or the process's getrusage \
             minor faults (kernel-memfd); all threads together.\n\
             vs kernel-memfd, time: kernel-memfd's median time over the column's (above 1, the \
             column was faster).\n\
             vs global-mutex: lock-free's faults/s over global-mutex's; vs 1 thread: the \
             column's faults/s over its own at 1 thread (linear scaling: the thread count).\n"
        }
        Kind::Churn => {
            "\nfaults: faultmap's pgfault (one per page touched at order 0), or the process's \
             getrusage minor faults (kernel-memfd); all faulting threads together.\n\
             vs kernel-memfd, pages/s: the column's pages touched per second over \
             kernel-memfd's; vs classic: speculative's faults/s over classic's, same delivery.\n\
             churn maps/s: regions the churn thread mapped (and unmapped) per second.\n\
             spf_success, spf_abort, spf_fallback, forwarded: the pager's counters of the \
             median sample (faults resolved on a speculatively found region; speculative \
             attempts that found their region changing; faults the speculative lookup did not \
             find; faults a SIGBUS handler forwarded to a pager thread).\n"
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
    use crate::bench::grid::{Column as _, DataInfo};
    use crate::bench::probe::Machine;

    #[test]
    fn default_threads_follow_the_cpus() {
        assert_eq!(default_threads(1), [1, 2]);
        assert_eq!(default_threads(2), [1, 2]);
        assert_eq!(default_threads(4), [1, 2, 4]);
        assert_eq!(default_threads(6), [1, 2, 4, 6]);
        assert_eq!(default_threads(16), [1, 2, 4, 8, 16]);
    }

    #[test]
    fn columns_and_variants() {
        let parts = Column::all(Kind::Parts, &[Fault::Signal]);
        let v: Vec<String> = parts.iter().map(|c| c.variant()).collect();
        assert_eq!(v, ["default", "cache=lock-free", "cache=global-mutex"]);
        let churn = Column::all(Kind::Churn, &[Fault::Signal, Fault::Handler]);
        let v: Vec<String> = churn.iter().map(|c| c.variant()).collect();
        assert_eq!(
            v,
            [
                "default",
                "lookup=speculative",
                "lookup=classic",
                "lookup=speculative,delivery=handler",
                "lookup=classic,delivery=handler"
            ]
        );
        assert_eq!(churn[4].heading(), "classic");
        assert_eq!(churn[0].engine(), "kernel-memfd");
        assert_eq!(churn[1].engine(), "faultmap");
    }

    #[test]
    fn settings_configure_the_pager() {
        let base = Config::default();
        assert!(
            Setting::GlobalMutex
                .apply(base.clone())
                .bench_global_cache_lock
        );
        assert!(
            !Setting::LockFree
                .apply(base.clone())
                .bench_global_cache_lock
        );
        assert_eq!(
            Setting::Classic.apply(base.clone()).region_lookup,
            RegionLookup::Classic
        );
        assert_eq!(
            Setting::Speculative.apply(base).region_lookup,
            RegionLookup::Speculative
        );
    }

    fn sample(seconds: f64, faults: u64, success: u64) -> Sample {
        Sample {
            seconds,
            faults: Some(faults),
            pages_touched: Some(faults),
            stats: Some(Stats {
                spf_success: success,
                ..Stats::default()
            }),
            ..Sample::default()
        }
    }

    fn cell(kind: Kind, threads: u16, setting: Setting, seconds: f64, faults: u64) -> Cell {
        let column = Column::Faultmap {
            setting,
            delivery: Fault::Signal,
        };
        let mut c = Cell::new(kind, threads, column);
        c.samples.push(sample(seconds, faults, 0));
        c
    }

    fn run(kind: Kind, cells: Vec<Cell>) -> Run {
        Run {
            machine: Machine::read(),
            data: DataInfo::test(),
            workloads: vec![kind],
            threads: vec![1, 2],
            deliveries: vec![Fault::Signal],
            columns: Column::all(kind, &[Fault::Signal]),
            cells,
            wall_seconds: 1.0,
            mode: Scaling {
                kind,
                repetitions: 1,
                handler_threads: 1,
                duration: None,
                warm_up: WarmUp {
                    seconds: 0.0,
                    stats: Stats::default(),
                    cached_pct: 100.0,
                },
            },
        }
    }

    #[test]
    fn the_median_samples_counters_are_shown() {
        let mut c = Cell::new(Kind::Parts, 1, Column::KernelMemfd);
        c.samples = vec![
            sample(1.0, 300, 3),
            sample(1.0, 100, 1),
            sample(2.0, 400, 2),
        ];
        assert_eq!(med(&c, |s| s.faults), 300);
        assert_eq!(c.median_f64(|s| Some(faults_per_second(s))), Some(200.0));
        assert_eq!(median_stats(&c).unwrap().spf_success, 2);
        assert_eq!(c.median_f64(maps_per_second), None);
    }

    #[test]
    fn goals_come_from_the_right_cells() {
        let parts = run(
            Kind::Parts,
            vec![
                cell(Kind::Parts, 1, Setting::LockFree, 1.0, 100),
                cell(Kind::Parts, 2, Setting::LockFree, 0.5, 100),
                cell(Kind::Parts, 1, Setting::GlobalMutex, 1.0, 100),
                cell(Kind::Parts, 2, Setting::GlobalMutex, 1.0, 100),
            ],
        );
        let g = goals(&parts);
        assert_eq!(g.len(), 1);
        assert_eq!((g[0].2.value, g[0].2.met()), (2.0, true));
        let churn = run(
            Kind::Churn,
            vec![
                cell(Kind::Churn, 1, Setting::Speculative, 1.0, 300),
                cell(Kind::Churn, 1, Setting::Classic, 1.0, 200),
            ],
        );
        let g = goals(&churn);
        assert_eq!(g.len(), 1);
        assert_eq!((g[0].2.value, g[0].2.met()), (1.5, false));
        assert!(goals(&run(Kind::Parts, Vec::new())).is_empty());
    }
}
