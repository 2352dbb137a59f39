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
//! 6. the report ([`report`]): the table, or the JSON document; and the
//!    plot.

mod churn;
mod parts;
mod report;

use std::fs::File;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use faultmap::{Config, Delivery, FileStore, Object, Pager, RegionLookup, PAGE_SIZE};

use self::report::{Cell, Key, ScaleRun};
use super::engine::warm_object;
use super::grid::{self, Checksums};
use super::reps::Repetitions;
use super::{dedup, deliveries, note, or_default};
use crate::access::split;
use crate::{BenchArgs, DeliveryArg};

/// Which of the two benchmarks.
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

impl Kind {
    /// The `workload` field of a JSON row.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Parts => "parts",
            Kind::Churn => "churn",
        }
    }

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

    fn default_size(self) -> u64 {
        match self {
            Kind::Parts => PARTS_SIZE,
            Kind::Churn => CHURN_SIZE,
        }
    }

    fn default_repetitions(self) -> u32 {
        match self {
            Kind::Parts => PARTS_REPETITIONS,
            Kind::Churn => CHURN_REPETITIONS,
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
        delivery: Delivery,
    },
}

impl Column {
    /// The columns of a run: the kernel, then per delivery mode each
    /// setting of `kind`.
    pub fn all(kind: Kind, deliveries: &[Delivery]) -> Vec<Column> {
        let mut columns = vec![Column::KernelMemfd];
        for &delivery in deliveries {
            for setting in kind.settings() {
                columns.push(Column::Faultmap { setting, delivery });
            }
        }
        columns
    }

    /// The `engine` field of a JSON row.
    pub fn engine(self) -> &'static str {
        match self {
            Column::KernelMemfd => "kernel-memfd",
            Column::Faultmap { .. } => "faultmap",
        }
    }

    /// The `variant` field of a JSON row: `cache=lock-free`,
    /// `lookup=classic,delivery=handler` (the delivery only when it is not
    /// the library's default).
    pub fn variant(self) -> String {
        match self {
            Column::KernelMemfd => "default".into(),
            Column::Faultmap { setting, delivery } if delivery == Delivery::default() => {
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

    /// The column heading.
    pub fn heading(self) -> &'static str {
        match self {
            Column::KernelMemfd => "kernel-memfd",
            Column::Faultmap { setting, .. } => setting.name(),
        }
    }

    /// The setting, for faultmap.
    pub fn setting(self) -> Option<Setting> {
        match self {
            Column::Faultmap { setting, .. } => Some(setting),
            Column::KernelMemfd => None,
        }
    }

    /// The delivery mode, for faultmap.
    pub fn delivery(self) -> Option<Delivery> {
        match self {
            Column::Faultmap { delivery, .. } => Some(delivery),
            Column::KernelMemfd => None,
        }
    }
}

/// The arguments, checked.
#[derive(Debug)]
struct Settings {
    threads: Vec<u16>,
    deliveries: Vec<Delivery>,
    columns: Vec<Column>,
    repetitions: u32,
    duration: Duration,
    config: Config,
}

impl Settings {
    fn from_args(args: &BenchArgs, kind: Kind) -> Result<Settings> {
        let config = crate::stats::pager_config(args.handler_threads, args.io_threads);
        config.validate()?;
        let deliveries = deliveries(&args.delivery, kind.deliveries());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Settings {
            threads: dedup(or_default(&args.threads, &default_threads(cpus))),
            columns: Column::all(kind, &deliveries),
            deliveries,
            repetitions: args.repetitions.unwrap_or(kind.default_repetitions()),
            duration: args.duration.unwrap_or(CHURN_DURATION),
            config,
        })
    }
}

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
        let config = setting.apply(self.config.clone().delivery(delivery));
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
    let settings = Settings::from_args(args, kind)?;
    // 2. A pager.
    let pager = super::start_pager(settings.config.clone())?;
    // 3. The data, its memfd copy, the object with its cache filled.
    let data = super::open_data(args, kind.default_size())?;
    note("copying it into a memfd and filling faultmap's cache");
    let memfd = data.memfd_copy()?;
    let object = pager.open(FileStore::open(data.path())?)?;
    let warm_up = warm_object(&pager, &object)?;
    drop(pager);
    // 4. The cells, and each thread count's parts.
    let pages = data.len().div_ceil(PAGE_SIZE as u64);
    let plans: Vec<(u16, Vec<Range<u64>>)> = settings
        .threads
        .iter()
        .map(|&t| (t, split(pages, usize::from(t))))
        .collect();
    let mut cells: Vec<Cell> = settings
        .threads
        .iter()
        .flat_map(|&threads| {
            let keys = settings
                .columns
                .iter()
                .map(move |&column| Key { threads, column });
            keys.map(Cell::new)
        })
        .collect();
    // 5. The measurements.
    let bench = Bench {
        object: &object,
        memfd: &memfd,
        len: data.len(),
        config: &settings.config,
        duration: settings.duration,
    };
    measure_all(&bench, kind, &plans, settings.repetitions, &mut cells)?;
    // 6. The report.
    let run = ScaleRun {
        machine: super::probe::Machine::read(),
        data: super::data_info(&data),
        kind,
        threads: settings.threads,
        deliveries: settings.deliveries,
        columns: settings.columns,
        repetitions: settings.repetitions,
        handler_threads: args.handler_threads,
        duration: (kind == Kind::Churn).then_some(settings.duration),
        warm_up,
        cells,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    super::report(
        args,
        |out| report::write_json(&run, out),
        || report::render(&run),
        || report::figure(&run),
    )
}

/// Measures every cell `reps` times, a repetition at a time. Every parts
/// sample reads every page once, however many threads: its byte sum must
/// be the first one's.
fn measure_all(
    bench: &Bench<'_>,
    kind: Kind,
    plans: &[(u16, Vec<Range<u64>>)],
    reps: u32,
    cells: &mut [Cell],
) -> Result<()> {
    let mut checksums = Checksums::new();
    let label = |k: &Key| format!("{} × {} on {}", kind.name(), k.threads, k.column.variant());
    grid::measure(cells, Repetitions::Fixed(reps), label, |key, _| {
        let parts = plans
            .iter()
            .find(|(t, _)| *t == key.threads)
            .map(|(_, parts)| parts.as_slice())
            .context("a thread count without parts")?;
        let sample = match kind {
            Kind::Parts => parts::measure(bench, key.column, parts)?,
            Kind::Churn => churn::measure(bench, key.column, parts)?,
        };
        if kind == Kind::Parts {
            checksums.check((), sample.checksum, || {
                format!("{} with {} threads", key.column.variant(), key.threads)
            })?;
        }
        Ok(Some(sample))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let parts = Column::all(Kind::Parts, &[Delivery::Signal]);
        let v: Vec<String> = parts.iter().map(|c| c.variant()).collect();
        assert_eq!(v, ["default", "cache=lock-free", "cache=global-mutex"]);
        let churn = Column::all(Kind::Churn, &[Delivery::Signal, Delivery::Handler]);
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
}
