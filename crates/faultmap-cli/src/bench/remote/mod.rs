//! `faultmap bench --remote`: faultmap against raw ranged GETs and the
//! FUSE peers a user would pick, on the project's own servers, all in one
//! run, on the benchmark framework ([`super::grid`]).
//!
//! `--store` picks the stores, comma-separated (default `http,s3`):
//! `http` (nginx, plain HTTP ranges), `s3` (versitygw), `gs` (Google
//! Cloud Storage's XML API: `scripts/gcs-stub.py`) and `az` (Azure Blob
//! Storage: Azurite). Only the stores asked for get the object and a
//! proxy; the FUSE peers are S3's and HTTP's alone: a `gs` or `az`
//! column has none (the report says so).
//!
//! 1. [`setup::Setup`] starts the servers (`scripts/remote-servers`),
//!    writes the object (1 GiB by default) into each store asked for (a
//!    link into the folder nginx, versitygw or the GCS stub serves; an
//!    upload into Azurite, about 25 s a GiB), starts a proxy in front of
//!    each (`faultmap-proxy`: it counts every engine's requests the same
//!    way, and adds the column's first-byte latency), and mounts `s3fs`
//!    and `rclone` through the S3 and HTTP proxies (`scripts/fuse-peers`;
//!    a peer that cannot be mounted is skipped with one line saying why).
//! 2. The columns: per store and latency, `raw-get` (the client library's
//!    own ranged GETs at the best of a few request sizes and depths,
//!    probed first: the link's limit; `seq` only), `faultmap` with full
//!    readahead (every thread count) and with read-around only, and each
//!    FUSE peer through a kernel `mmap`; all but full readahead on one
//!    thread. The workloads: `seq` (every word, `--threads`), `rand` and
//!    `clustered` (a sample of `--sample-pages` pages, one thread), and
//!    `batch` (rand's pages as 4 KiB rows in batches of 64: faultmap
//!    prefetches each batch with `prefetch_ranges` and then reads it; a
//!    FUSE peer reads the rows one by one). `faultmap-fixed` (`rand` only)
//!    is full readahead with the store's read-around window fixed
//!    (`MapOptions::fixed_read_around`), against which adaptive
//!    read-around (the default) is judged.
//!    `faultmap-replay` is the second cold run of a snapshot loader: a
//!    cold mapping that replays the workload's access trace, recorded by
//!    one cold run (its proxy without latency) the first time the column
//!    is measured.
//! 3. [`grid::measure`] reads the object cold in every cell,
//!    `--repetitions` times, repetitions outermost, each run once every
//!    store's proxy has gone quiet. Every run's checksum must equal the
//!    first of its workload: an engine that read wrong bytes, on any
//!    store, fails the benchmark.
//! 4. The report: a table per workload and latency, the goals; or one JSON document.

pub mod engines;
pub mod setup;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use faultmap::{ReadaheadMode, Trace, PAGE_SIZE};
use serde_json::{json, Value};

use super::grid::{self, Cell, Checksums, Column, DataInfo, Goal, Report, Row};
use super::plot::{Figure, Panel, Series};
use super::reps::Repetitions;
use crate::access::{Access, AccessPlan, Coverage};
use crate::units;
use engines::{StoreKind, Target};

/// The run is `--procs`: its "threads" are processes, and every column
/// runs at every count.
static PROCS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The run is `--disk-cache`: first and second runs through disk caches.
static DISK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn disk_mode() -> bool {
    DISK.load(std::sync::atomic::Ordering::Relaxed)
}

/// What `faultmap bench --remote` was asked for.
#[derive(Debug)]
pub struct RemoteOptions {
    pub stores: Vec<StoreKind>,
    pub workloads: Vec<Access>,
    pub latencies_ms: Vec<u64>,
    pub threads: Vec<u16>,
    pub size: u64,
    pub repetitions: u32,
    pub budget: Option<u64>,
    /// faultmap's pager settings (handler and I/O threads), before the
    /// budget.
    pub config: faultmap::Config,
    pub sample_pages: u64,
    pub no_fuse: bool,
    pub state: std::path::PathBuf,
    /// `--procs`: process counts (empty: the remote benchmark proper).
    pub procs: Vec<u16>,
    /// `--engine protect`: a column of faultmap under the protect engine.
    pub protect: bool,
    /// `--disk-cache`: faultmap's disk cache and the FUSE peers' against
    /// faultmap without one, first and second runs.
    pub disk_cache: bool,
}

/// An engine of the remote benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The client library's ranged GETs.
    RawGet,
    /// A faultmap mapping, with this readahead.
    Faultmap(ReadaheadMode),
    /// A faultmap mapping with full readahead and the store's read-around
    /// window fixed (`MapOptions::fixed_read_around`): `rand` only, the
    /// comparison of adaptive read-around.
    Fixed,
    /// A faultmap mapping (full readahead) under the protect engine
    /// (`--engine protect`).
    Protect,
    /// A faultmap mapping (full readahead) replaying the workload's access
    /// trace, recorded once before the measurements: the second cold run.
    Replay,
    /// A FUSE peer (`s3fs`, `rclone`) and kernel `mmap`.
    Fuse(&'static str),
    /// `--procs`: forked processes reading one faultmap mapping made
    /// before the fork (one cache, served by the parent).
    Shared,
    /// `--procs`: processes each with a pager of their own.
    Private,
    /// `--procs`: processes each with a pager of their own, sharing on
    /// (`FAULTMAP_SHARED=1`): they join the cache of the process that
    /// mapped the object first, over its socket, as unrelated processes do.
    Joined,
    /// `--disk-cache`: a process reading through faultmap's disk cache
    /// (full readahead), this run of it.
    Disk(engines::DiskRun),
    /// `--disk-cache`: a FUSE peer mounted with its disk cache, this run
    /// of it (each run a mount of its own).
    FuseCached(&'static str, engines::DiskRun),
}

/// A column: an engine on a store at a latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteColumn {
    pub store: StoreKind,
    pub latency_ms: u64,
    pub engine: Engine,
}

impl Column for RemoteColumn {
    fn heading(self) -> String {
        let engine = match self.engine {
            Engine::RawGet => "raw-get".to_string(),
            Engine::Faultmap(_)
            | Engine::Fixed
            | Engine::Protect
            | Engine::Replay
            | Engine::Shared
            | Engine::Private
            | Engine::Joined
            | Engine::Disk(_) => {
                format!("faultmap-{}", self.variant())
            }
            Engine::Fuse(name) => name.to_string(),
            Engine::FuseCached(name, _) => format!("{name}-{}", self.variant()),
        };
        let latency = match self.latency_ms {
            0 => String::new(),
            ms => format!("@{ms}ms"),
        };
        format!("{}:{engine}{latency}", self.store.name())
    }

    fn engine(self) -> &'static str {
        match self.engine {
            Engine::RawGet => "raw-get",
            Engine::Faultmap(_)
            | Engine::Fixed
            | Engine::Protect
            | Engine::Replay
            | Engine::Shared
            | Engine::Private
            | Engine::Joined
            | Engine::Disk(_) => "faultmap",
            Engine::Fuse(name) | Engine::FuseCached(name, _) => name,
        }
    }

    fn variant(self) -> String {
        match self.engine {
            Engine::RawGet => "best".into(),
            Engine::Faultmap(ReadaheadMode::AroundOnly) => "around".into(),
            Engine::Faultmap(_) => "full".into(),
            Engine::Fixed => "fixed".into(),
            Engine::Protect => "protect".into(),
            Engine::Replay => "replay".into(),
            Engine::Fuse(_) => "mmap".into(),
            Engine::Shared => "shared".into(),
            Engine::Private => "private".into(),
            Engine::Joined => "joined".into(),
            Engine::Disk(run) => format!("disk-{}", run.name()),
            Engine::FuseCached(_, run) => format!("cache-{}", run.name()),
        }
    }

    /// Only faultmap with full readahead runs at every thread count (with
    /// `--procs`, every engine runs at every process count).
    fn once(self) -> bool {
        !matches!(
            self.engine,
            Engine::Faultmap(ReadaheadMode::Full)
                | Engine::Protect
                | Engine::Shared
                | Engine::Private
                | Engine::Joined
        ) && !PROCS.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The remote mode's settings, for its report.
pub struct Remote {
    repetitions: u32,
    sample_pages: u64,
    budget: Option<u64>,
    /// raw-get's request size and depth, per store and latency.
    raw: BTreeMap<(StoreKind, u64), (u64, usize)>,
    /// The FUSE peers that could not be used, and why.
    fuse_skipped: Option<String>,
    /// `--procs`: microseconds per fault on a cached object, in-process
    /// and in a forked child, and the pages a child's fault mapped
    /// (`engines::fault_path_costs`).
    fault_path: Option<(f64, f64, f64)>,
}

type Run = Report<Remote>;

/// Runs `faultmap bench --remote`.
pub fn run(o: &RemoteOptions, args: &crate::BenchArgs) -> Result<()> {
    let started = Instant::now();
    if o.stores.is_empty() || o.workloads.is_empty() || o.threads.is_empty() {
        anyhow::bail!("--remote needs at least one store, workload and thread count");
    }
    // 1. The servers, the object, the proxies, the mounts.
    DISK.store(o.disk_cache, std::sync::atomic::Ordering::Relaxed);
    // The disk cache benchmark mounts its peers with their caches, one
    // run at a time.
    let setup = setup::Setup::start(&o.state, o.size, &o.stores, o.no_fuse || o.disk_cache)?;
    let cached_peers = if o.disk_cache && !o.no_fuse {
        cached_peers(&setup)
    } else {
        Vec::new()
    };
    let len = usize::try_from(setup.len).context("the object does not fit the address space")?;
    // 2. The columns, the plans, the cells.
    let procs = !o.procs.is_empty();
    PROCS.store(procs, std::sync::atomic::Ordering::Relaxed);
    let fault_path = if procs {
        super::note("the fault path: in-process against a forked child's");
        Some(engines::fault_path_costs(&o.config, 5)?)
    } else {
        None
    };
    let columns = if o.disk_cache {
        disk_columns(o, &cached_peers)
    } else {
        columns(o, &setup)
    };
    let threads_of = |w: Access| {
        if procs {
            o.procs.clone()
        } else if w == Access::Seq {
            o.threads.clone()
        } else {
            vec![1]
        }
    };
    let mut plans = HashMap::new();
    for &w in &o.workloads {
        for t in threads_of(w) {
            let coverage = match w {
                Access::Seq => Coverage::All,
                _ => Coverage::Sample(o.sample_pages),
            };
            // With --procs every process walks the same one-thread plan:
            // seq the whole object, rand and clustered the same sample.
            let plan_threads = if procs { 1 } else { usize::from(t) };
            plans.insert((w, t), AccessPlan::new(w, len, plan_threads, coverage)?);
        }
    }
    let mut cells = grid::cells(&o.workloads, threads_of, &columns);
    // A run waits for every proxy to be quiet over this latency.
    let max_latency = Duration::from_millis(o.latencies_ms.iter().copied().max().unwrap_or(0));
    // raw-get's best request size and depth, per store and latency.
    let mut raw = BTreeMap::new();
    if o.workloads.contains(&Access::Seq) {
        for c in columns.iter().filter(|c| c.engine == Engine::RawGet) {
            let target = target(&setup, c, max_latency)?;
            raw.insert((c.store, c.latency_ms), best_raw_get(&target)?);
        }
    }
    // 3. The measurements. A replay column's trace is recorded by one
    //    cold run of its workload, the first time it is needed.
    let mut traces: HashMap<(StoreKind, Access), Arc<Trace>> = HashMap::new();
    let mut checksums = Checksums::new();
    grid::measure(&mut cells, Repetitions::Fixed(o.repetitions), |key, _| {
        let c = key.column;
        let target = target(&setup, &c, max_latency)?;
        let plan = &plans[&(key.workload, key.threads)];
        let mut sample = match c.engine {
            Engine::RawGet if key.workload != Access::Seq => return Ok(None),
            Engine::RawGet => {
                let (request, depth) = raw[&(c.store, c.latency_ms)];
                engines::raw_get(&target, request, depth)?
            }
            Engine::Faultmap(mode) => {
                let opts = faultmap::MapOptions::new().readahead(mode);
                engines::faultmap(&target, plan, opts, &o.config, o.budget, None)?
            }
            Engine::Fixed if key.workload != Access::Rand => return Ok(None),
            Engine::Fixed => {
                let opts = faultmap::MapOptions::new().fixed_read_around();
                engines::faultmap(&target, plan, opts, &o.config, o.budget, None)?
            }
            Engine::Protect => {
                let config = o.config.clone().engine(faultmap::Engine::Protect);
                let opts = faultmap::MapOptions::new();
                engines::faultmap(&target, plan, opts, &config, o.budget, None)?
            }
            // A batch is prefetched by the application: a trace replay
            // has nothing to add.
            Engine::Replay if key.workload == Access::Batch => return Ok(None),
            Engine::Replay => {
                let trace = match traces.get(&(c.store, key.workload)) {
                    Some(trace) => trace.clone(),
                    None => {
                        super::note(&format!(
                            "{} {}: recording the access trace",
                            c.store.name(),
                            key.workload.name()
                        ));
                        let trace = Arc::new(engines::record(&target, plan, &o.config)?);
                        traces.insert((c.store, key.workload), trace.clone());
                        trace
                    }
                };
                let opts = faultmap::MapOptions::new();
                engines::faultmap(&target, plan, opts, &o.config, o.budget, Some(trace))?
            }
            Engine::Fuse(name) => {
                let path = setup
                    .fuse
                    .iter()
                    .find(|(n, k, _)| *n == name && *k == c.store);
                let Some((_, _, path)) = path else {
                    return Ok(None);
                };
                if procs {
                    let n = usize::from(key.threads);
                    engines::procs(&target, plan, n, engines::Procs::Fuse(path), &o.config)?
                } else {
                    engines::fuse(path, &target, plan)?
                }
            }
            Engine::Disk(run) => {
                let dir = setup.scratch("disk-cache");
                match engines::disk_cached(&target, plan, &o.config, &dir, run)? {
                    Some(sample) => sample,
                    None => return Ok(None),
                }
            }
            Engine::FuseCached(name, run) => {
                match fuse_cached(&setup, (name, c.store), &target, plan, run)? {
                    Some(sample) => sample,
                    None => return Ok(None),
                }
            }
            Engine::Shared | Engine::Private | Engine::Joined => {
                let how = match c.engine {
                    Engine::Shared => engines::Procs::Shared,
                    Engine::Joined => engines::Procs::Joined,
                    _ => engines::Procs::Private,
                };
                engines::procs(&target, plan, usize::from(key.threads), how, &o.config)?
            }
        };
        sample.pages_touched = Some(plan.pages_touched());
        if let Some(sum) = sample.checksum {
            checksums.check((key.workload, key.threads), sum, || key.label())?;
        }
        Ok(Some(sample))
    })?;
    // 4. The report.
    let mounted = !setup.fuse.is_empty() || !cached_peers.is_empty();
    let fuse_skipped = fuse_note(&o.stores, o.no_fuse, mounted);
    let data = DataInfo {
        path: format!("{} on each store", setup.name),
        generated: true,
        bytes: setup.len,
        pages: setup.len.div_ceil(PAGE_SIZE as u64),
    };
    drop(setup);
    let mode = Remote {
        repetitions: o.repetitions,
        sample_pages: o.sample_pages,
        budget: o.budget,
        raw,
        fuse_skipped,
        fault_path,
    };
    let threads = if procs {
        o.procs.clone()
    } else {
        o.threads.clone()
    };
    Run::new(
        data,
        started,
        o.workloads.clone(),
        threads,
        columns,
        cells,
        mode,
    )
    .write(args)
}

/// The FUSE peers that come up with disk caches, of the stores asked for
/// (mounted once to learn which, then unmounted).
fn cached_peers(setup: &setup::Setup) -> Vec<(&'static str, StoreKind)> {
    super::note("mounting the FUSE peers with their disk caches, to see which come up");
    let probe = setup.scratch("fuse-cache");
    let peers = setup.mount_cached(None, &probe);
    if let Err(e) = setup.unmount_cached() {
        super::note(&format!("unmounting the FUSE peers: {e:#}"));
    }
    let _ = std::fs::remove_dir_all(&probe);
    match peers {
        Ok(peers) => peers
            .into_iter()
            .map(|(name, kind, _)| (name, kind))
            .collect(),
        Err(e) => {
            super::note(&format!("the FUSE peers are skipped: {e:#}"));
            Vec::new()
        }
    }
}

/// `--disk-cache`'s columns, per latency and store: faultmap without a
/// disk cache, faultmap's first, second and cold second runs through its
/// disk cache, and each FUSE peer's with its own.
fn disk_columns(o: &RemoteOptions, peers: &[(&'static str, StoreKind)]) -> Vec<RemoteColumn> {
    use engines::DiskRun::{First, Second, SecondCold};
    let mut columns = Vec::new();
    for &latency_ms in &o.latencies_ms {
        for &store in &o.stores {
            let mut engines = vec![Engine::Faultmap(ReadaheadMode::Full)];
            engines.extend([First, Second, SecondCold].map(Engine::Disk));
            for &(name, _) in peers.iter().filter(|(_, k)| *k == store) {
                engines.extend([First, Second, SecondCold].map(|r| Engine::FuseCached(name, r)));
            }
            columns.extend(engines.into_iter().map(|engine| RemoteColumn {
                store,
                latency_ms,
                engine,
            }));
        }
    }
    columns
}

/// A FUSE peer with its disk cache, emptied first: mounted for this run
/// alone (for a second run, mounted once before and read, then unmounted;
/// the kernel's page cache dropped after it for a cold one), the object
/// read through a kernel `mmap` ([`engines::fuse`]), unmounted. `None` if
/// the peer does not come up or the page cache cannot be dropped.
fn fuse_cached(
    setup: &setup::Setup,
    peer: (&'static str, StoreKind),
    target: &engines::Target<'_>,
    plan: &AccessPlan,
    run: engines::DiskRun,
) -> Result<Option<grid::Sample>> {
    let cache = setup.scratch("fuse-cache");
    match std::fs::remove_dir_all(&cache) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("emptying {}", cache.display())),
    }
    let mount = || -> Result<Option<std::path::PathBuf>> {
        let up = setup.mount_cached(Some(peer), &cache)?;
        Ok(up.into_iter().next().map(|(_, _, path)| path))
    };
    let measured = (|| {
        if run != engines::DiskRun::First {
            let Some(path) = mount()? else {
                return Ok(None);
            };
            engines::fuse(&path, target, plan)?;
            setup.unmount_cached()?;
            if run == engines::DiskRun::SecondCold && !engines::drop_page_cache()? {
                return Ok(None);
            }
        }
        let Some(path) = mount()? else {
            return Ok(None);
        };
        engines::fuse(&path, target, plan).map(Some)
    })();
    setup.unmount_cached()?;
    measured
}

/// The columns of the stores and latencies asked for, with the FUSE peers
/// that are up.
fn columns(o: &RemoteOptions, setup: &setup::Setup) -> Vec<RemoteColumn> {
    let mut columns = Vec::new();
    for &latency_ms in &o.latencies_ms {
        for &store in &o.stores {
            let mut engines = if o.procs.is_empty() {
                let mut engines = vec![
                    Engine::RawGet,
                    Engine::Faultmap(ReadaheadMode::Full),
                    Engine::Fixed,
                    Engine::Replay,
                    Engine::Faultmap(ReadaheadMode::AroundOnly),
                ];
                if o.protect {
                    engines.insert(2, Engine::Protect);
                }
                engines
            } else {
                vec![Engine::Shared, Engine::Joined, Engine::Private]
            };
            let peers = setup.fuse.iter().filter(|(_, k, _)| *k == store);
            engines.extend(peers.map(|(name, _, _)| Engine::Fuse(name)));
            columns.extend(engines.into_iter().map(|engine| RemoteColumn {
                store,
                latency_ms,
                engine,
            }));
        }
    }
    columns
}

/// The report's word on the FUSE peers of `stores`, if any is missing
/// (`mounted`: whether any peer is up): none could be mounted, or a store
/// has none (`gs`, `az`). Nothing with `--no-fuse`.
fn fuse_note(stores: &[StoreKind], no_fuse: bool, mounted: bool) -> Option<String> {
    if no_fuse {
        return None;
    }
    let mut notes = Vec::new();
    if stores.iter().any(|k| k.has_fuse_peers()) && !mounted {
        notes.push("no FUSE peer could be mounted (see the notes above)".to_string());
    }
    let without: Vec<&str> = stores
        .iter()
        .filter(|k| !k.has_fuse_peers())
        .map(|k| k.name())
        .collect();
    if !without.is_empty() {
        notes.push(format!(
            "none on {} (s3fs and rclone are mounted over S3 and HTTP only)",
            without.join(", ")
        ));
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// Column `c`'s object, its proxy set to the column's latency.
fn target<'a>(
    setup: &'a setup::Setup,
    c: &RemoteColumn,
    max_latency: Duration,
) -> Result<Target<'a>> {
    let proxy = setup
        .proxy(c.store)
        .with_context(|| format!("no proxy in front of {}", c.store.name()))?;
    proxy
        .faults()
        .set_latency(Duration::from_millis(c.latency_ms));
    Ok(Target {
        kind: c.store,
        proxy,
        proxies: setup.proxies.iter().map(|(_, p)| p).collect(),
        latency: max_latency,
        name: &setup.name,
        bucket: setup.bucket(c.store),
        gcs_account: &setup.gcs_account,
        len: setup.len,
    })
}

/// The best request size and depth for raw GETs of this store at this
/// latency: each candidate reads the whole object once, the fastest wins.
fn best_raw_get(target: &Target<'_>) -> Result<(u64, usize)> {
    let mut best = (8 << 20, 16, f64::INFINITY);
    for (request, depth) in [(1 << 20, 32), (8 << 20, 8), (8 << 20, 32), (16 << 20, 16)] {
        super::note(&format!(
            "{} raw-get probe: {} x{depth}",
            target.kind.name(),
            units::bytes(request)
        ));
        let s = engines::raw_get(target, request, depth)?;
        if s.seconds < best.2 {
            best = (request, depth, s.seconds);
        }
    }
    Ok((best.0, best.1))
}

/// The bytes a cell's workload touched.
fn touched(run: &Run, cell: &Cell<Access, RemoteColumn>) -> Option<u64> {
    let pages = cell.median_u64(|s| s.pages_touched)?;
    Some((pages * PAGE_SIZE as u64).min(run.data.bytes))
}

impl grid::Mode for Remote {
    type Workload = Access;
    type Column = RemoteColumn;

    /// With `--procs` a group is a count of processes.
    fn count_label(threads: u16) -> String {
        match (PROCS.load(std::sync::atomic::Ordering::Relaxed), threads) {
            (false, _) => grid::threads_label(threads),
            (true, 1) => "1 process".into(),
            (true, n) => format!("{n} processes"),
        }
    }

    fn render(run: &Run) -> String {
        let m = &run.mode;
        let mut lines = vec![
            ("remote", "every engine reads through a counting proxy in front of its server; cold caches (a new pager per faultmap run, the FUSE file's page cache dropped with posix_fadvise)".to_string()),
            ("repetitions", format!("{} per cell (medians)", m.repetitions)),
            ("rand, clustered, batch", format!("a sample of {} pages", m.sample_pages)),
        ];
        if let Some(b) = m.budget {
            lines.push((
                "budget",
                format!("faultmap's memory budget {}", units::bytes(b)),
            ));
        }
        if let Some(why) = &m.fuse_skipped {
            lines.push(("FUSE peers", why.clone()));
        }
        if let Some((own, guest, pages)) = m.fault_path {
            lines.push((
                "fault path",
                format!("{own:.2} µs a fault in the process that owns the cache (one page a fault), {guest:.2} µs in a forked child served by it ({:.1}x; {pages:.0} pages a fault, a child's fault-around); a cached 16 MiB object", guest / own),
            ));
        }
        if PROCS.load(std::sync::atomic::Ordering::Relaxed) {
            // Every process's pager is made with the default engine (auto):
            // the protect engine where userfaultfd is refused.
            let engine = faultmap::Pager::new(faultmap::Config::default()).map_or_else(
                |e| format!("none: {e}"),
                |p| format!("{} ({})", p.engine().engine.name(), p.engine().why),
            );
            lines.push(("paging engine", engine));
            lines.push((
                "processes",
                "N forked processes each read the object (seq: all of it; rand: the same sample); time until the last is done; transferred: what the server sent; peak memory: faultmap's caches summed (shared: the parent's one, through the mapping each inherited; joined: the parent's one, each process mapping the object itself with sharing on, as an unrelated process does; private: one per process), a FUSE peer's the kernel page cache (the most any process found resident)".to_string(),
            ));
        }
        if disk_mode() {
            lines.push((
                "disk cache",
                "each run a process of its own (faultmap: a fork with a new pager; a FUSE peer: a mount of its own), the cache emptied before the first; second: after a first run, its files possibly in the kernel's page cache (a restart on the same machine); second-cold: the kernel's page cache dropped before it (the cache read from the disk); transferred: object bytes from the network (the proxy's count of bodies); from disk cache: what faultmap read from its cache".to_string(),
            ));
        }
        let title = if disk_mode() {
            "faultmap bench --remote --disk-cache"
        } else if PROCS.load(std::sync::atomic::Ordering::Relaxed) {
            "faultmap bench --procs"
        } else {
            "faultmap bench --remote"
        };
        let mut out = run.header(title, lines);
        const LINES: &[grid::Line<Remote>] = &[
            ("time, seconds", |r, k| r.time(k, 3)),
            ("MiB/s", |r, k| {
                let cell = r.cell(k.workload, k.threads, k.column);
                cell.and_then(|c| Some(touched(r, c)? as f64 / c.seconds() / f64::from(1 << 20)))
                    .map_or(String::new(), |v| format!("{v:.0}"))
            }),
            ("requests", |r, k| r.count(k, |s| s.io_count)),
            ("mean request", |r, k| {
                let cell = r.cell(k.workload, k.threads, k.column);
                cell.and_then(mean_request)
                    .map_or(String::new(), |b| units::bytes(b as u64))
            }),
            ("transferred", |r, k| {
                let cell = r.cell(k.workload, k.threads, k.column);
                cell.and_then(|c| c.median_u64(|s| s.io_bytes))
                    .map_or(String::new(), units::bytes)
            }),
            ("peak memory", |r, k| {
                let cell = r.cell(k.workload, k.threads, k.column);
                cell.and_then(|c| c.median_u64(|s| s.peak_bytes))
                    .map_or(String::new(), units::bytes)
            }),
            ("from disk cache", |r, k| {
                let cell = r.cell(k.workload, k.threads, k.column);
                cell.and_then(|c| c.median_u64(|s| s.disk_bytes))
                    .map_or(String::new(), units::bytes)
            }),
        ];
        for &w in &run.workloads {
            let threads = if w == Access::Seq || PROCS.load(std::sync::atomic::Ordering::Relaxed) {
                run.threads.clone()
            } else {
                vec![1]
            };
            // A table per latency: a store's engines side by side.
            let mut latencies: Vec<u64> = run.columns.iter().map(|c| c.latency_ms).collect();
            latencies.dedup();
            for &latency in &latencies {
                let columns: Vec<RemoteColumn> = run
                    .columns
                    .iter()
                    .filter(|c| c.latency_ms == latency)
                    .copied()
                    .collect();
                let grid = run.grid_of(w, &threads, LINES, &columns);
                out.push_str(&format!("\n{} at {latency} ms\n{grid}", w.name()));
            }
        }
        for (&(store, latency), &(request, depth)) in &m.raw {
            out.push_str(&format!(
                "\nraw-get on {} at {latency} ms: {} requests, {depth} in flight (the fastest probed)",
                store.name(),
                units::bytes(request)
            ));
        }
        out.push('\n');
        out.push_str(&grid::goals(&goals(run)));
        out
    }

    fn settings(run: &Run) -> Value {
        let m = &run.mode;
        let goals: Vec<Value> = goals(run)
            .iter()
            .map(|g| {
                json!({
                    "place": g.place, "what": g.what, "value": g.value,
                    "bound": g.bound, "at_least": g.at_least, "met": g.met(),
                })
            })
            .collect();
        let procs = PROCS.load(std::sync::atomic::Ordering::Relaxed);
        json!({
            "benchmark": if disk_mode() { "disk-cache" } else if procs { "procs" } else { "remote" },
            "repetitions": m.repetitions,
            "sample_pages": m.sample_pages,
            "memory_budget": m.budget,
            "fuse_skipped": m.fuse_skipped,
            "fault_path_us": m.fault_path.map(|(own, guest, pages)| json!({"in_process": own, "forked_child": guest, "forked_child_pages_per_fault": pages})),
            "goals": goals,
        })
    }

    fn row(run: &Run, cell: &Cell<Access, RemoteColumn>) -> Row {
        let c = cell.key.column;
        let setting = match (c.engine, run.mode.raw.get(&(c.store, c.latency_ms))) {
            (Engine::RawGet, Some(&(request, depth))) => {
                format!("{} x{depth}", units::bytes(request))
            }
            _ => c.variant(),
        };
        let bytes = touched(run, cell);
        Row::new(run, cell)
            .with("store", c.store.name())
            .with("latency_ms", c.latency_ms)
            .with("setting", setting)
            .with("bytes", bytes)
            .with(
                "bytes_per_second",
                bytes.and_then(|b| grid::ratio(b as f64, cell.seconds())),
            )
            .with("requests", cell.median_u64(|s| s.io_count))
            .with("mean_request_bytes", mean_request(cell))
            .with("transferred", cell.median_u64(|s| s.io_bytes))
            .with("peak_bytes", cell.median_u64(|s| s.peak_bytes))
            .with("disk_bytes", cell.median_u64(|s| s.disk_bytes))
    }

    fn figure(run: &Run) -> Figure {
        let names: Vec<String> = run.columns.iter().map(|c| c.heading()).collect();
        let panels = run
            .workloads
            .iter()
            .map(|&w| {
                let points = run.columns.iter().enumerate().filter_map(|(i, &c)| {
                    let cell = run.cell(w, 1, c)?;
                    let mib = touched(run, cell)? as f64 / f64::from(1 << 20);
                    Some((i as f64, grid::ratio(mib, cell.seconds())?))
                });
                Panel {
                    title: format!("{}: throughput per engine, 1 thread", w.name()),
                    x_label: "engine".into(),
                    x_names: names.clone(),
                    y_label: "MiB/s".into(),
                    log_y: true,
                    series: vec![Series::line("1 thread".into(), points.collect())],
                }
            })
            .collect();
        Figure { panels, columns: 3 }
    }
}

/// The median bytes a request of the cell asked for.
fn mean_request(cell: &Cell<Access, RemoteColumn>) -> Option<f64> {
    let requests = cell.median_u64(|s| s.io_count)?;
    let bytes = cell.median_u64(|s| s.request_bytes)?;
    (requests > 0).then(|| bytes as f64 / requests as f64)
}

/// The stores and latencies of the run's columns, each once, in order.
fn store_latencies(run: &Run) -> Vec<(StoreKind, u64)> {
    let mut pairs: Vec<(StoreKind, u64)> = run
        .columns
        .iter()
        .map(|c| (c.store, c.latency_ms))
        .collect();
    pairs.dedup();
    pairs
}

/// `--procs`' goals at the largest process count, per store and latency:
/// the shared cache's transfer within 1.1 times the object, and its time
/// against private caches'.
/// The random-access goals at a cloud latency (issue "random access at
/// cloud latency"):
/// - `batch` (each batch of 64 rows prefetched at once) at least 5x faster
///   than `rand` on the same rows, faulted one by one;
/// - `rand` with adaptive read-around (the default) within 1.2x of the
///   time of the faster fixed mode (the store's fixed read-around window,
///   or read-around alone), and within 1.2x of the bytes of the thriftier.
fn random_goals(run: &Run, place: &str, store: StoreKind, latency: u64) -> Vec<Goal> {
    let cell = |w: Access, engine| {
        run.cell(
            w,
            1,
            RemoteColumn {
                store,
                latency_ms: latency,
                engine,
            },
        )
    };
    let full = Engine::Faultmap(ReadaheadMode::Full);
    let around = Engine::Faultmap(ReadaheadMode::AroundOnly);
    let mut out = Vec::new();
    let one_by_one = cell(Access::Rand, full).map(Cell::seconds);
    let batched = cell(Access::Batch, full).map(Cell::seconds);
    if let Some(value) = one_by_one.zip(batched).and_then(|(r, b)| grid::ratio(r, b)) {
        out.push(Goal {
            place: place.to_string(),
            what: "batch: rows faulted one by one (rand) over batched (prefetch_ranges), time"
                .into(),
            value,
            bound: 5.0,
            at_least: true,
        });
    }
    let bytes = |c: &Cell<Access, RemoteColumn>| c.median_u64(|s| s.io_bytes);
    let fixed = [Engine::Fixed, around]
        .into_iter()
        .filter_map(|e| cell(Access::Rand, e))
        .collect::<Vec<_>>();
    let Some(adaptive) = cell(Access::Rand, full) else {
        return out;
    };
    let fastest = fixed.iter().map(|c| c.seconds()).min_by(f64::total_cmp);
    if let Some(value) = fastest.and_then(|f| grid::ratio(adaptive.seconds(), f)) {
        out.push(Goal {
            place: place.to_string(),
            what: "rand: adaptive read-around's time over the faster fixed mode's".into(),
            value,
            bound: 1.2,
            at_least: false,
        });
    }
    let thriftiest = fixed.iter().filter_map(|c| bytes(c)).min();
    if let Some(value) = thriftiest
        .zip(bytes(adaptive))
        .and_then(|(t, a)| grid::ratio(a as f64, t as f64))
    {
        out.push(Goal {
            place: place.to_string(),
            what: "rand: adaptive read-around's bytes over the thriftier fixed mode's".into(),
            value,
            bound: 1.2,
            at_least: false,
        });
    }
    out
}

/// `--disk-cache`'s goals (issue "a persistent local cache"), per store
/// at a cloud latency (20 ms or more), on `seq`:
/// - the second run transfers no object bytes from the network;
/// - the second run at least 3x faster than the first;
/// - the second run at least as fast as each FUSE peer's second run;
/// - the first run within 1.1x of faultmap without a disk cache.
///
/// Each second-run goal for the warm second run and the cold one.
fn disk_goals(run: &Run) -> Vec<Goal> {
    use engines::DiskRun::{First, Second, SecondCold};
    let mut out = Vec::new();
    for (store, latency) in store_latencies(run) {
        if latency < 20 {
            continue;
        }
        let place = format!("{} at {latency} ms", store.name());
        let cell = |engine| {
            run.cell(
                Access::Seq,
                1,
                RemoteColumn {
                    store,
                    latency_ms: latency,
                    engine,
                },
            )
        };
        let seconds = |engine| cell(engine).map(Cell::seconds);
        let mut goal = |what: String, value: Option<f64>, bound: f64, at_least: bool| {
            if let Some(value) = value {
                out.push(Goal {
                    place: place.clone(),
                    what,
                    value,
                    bound,
                    at_least,
                });
            }
        };
        let first = seconds(Engine::Disk(First));
        for (second, name) in [(Second, "second run"), (SecondCold, "cold second run")] {
            let bytes = cell(Engine::Disk(second)).and_then(|c| c.median_u64(|s| s.io_bytes));
            goal(
                format!("seq, faultmap's {name}: object bytes from the network"),
                bytes.map(|b| b as f64),
                0.0,
                false,
            );
            let s = seconds(Engine::Disk(second));
            goal(
                format!("seq, faultmap's first run over its {name} (time)"),
                first.zip(s).and_then(|(f, s)| grid::ratio(f, s)),
                3.0,
                true,
            );
            let peers = run.columns.iter().filter(|c| {
                c.store == store
                    && c.latency_ms == latency
                    && matches!(c.engine, Engine::FuseCached(_, r) if r == second)
            });
            for peer in peers {
                let theirs = seconds(peer.engine);
                goal(
                    format!("seq, {}'s {name} over faultmap's (time)", peer.engine()),
                    theirs.zip(s).and_then(|(p, s)| grid::ratio(p, s)),
                    1.0,
                    true,
                );
            }
        }
        let none = seconds(Engine::Faultmap(ReadaheadMode::Full));
        goal(
            "seq, faultmap's first run through its disk cache over a run without one (time)".into(),
            first.zip(none).and_then(|(f, n)| grid::ratio(f, n)),
            1.1,
            false,
        );
    }
    out
}

fn procs_goals(run: &Run) -> Vec<Goal> {
    let Some(&n) = run.threads.iter().max() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (store, latency_ms) in store_latencies(run) {
        let col = |engine| RemoteColumn {
            store,
            latency_ms,
            engine,
        };
        let place = format!("{} at {latency_ms} ms, {n} processes", store.name());
        for (engine, name) in [(Engine::Shared, "shared"), (Engine::Joined, "joined")] {
            let cell = run.cell(Access::Seq, n, col(engine));
            let bytes = cell.and_then(|c| c.median_u64(|s| s.io_bytes));
            if let Some(bytes) = bytes.filter(|_| run.data.bytes > 0) {
                out.push(Goal {
                    place: place.clone(),
                    what: format!("seq, faultmap-{name}'s transfer over the object's size"),
                    value: bytes as f64 / run.data.bytes as f64,
                    bound: 1.1,
                    at_least: false,
                });
            }
        }
        let shared = run.seconds(Access::Seq, n, col(Engine::Shared));
        let private = run.seconds(Access::Seq, n, col(Engine::Private));
        if let Some(value) = private.zip(shared).and_then(|(p, s)| grid::ratio(p, s)) {
            out.push(Goal {
                place,
                what: "seq, faultmap-shared over faultmap-private (time ratio)".into(),
                value,
                bound: 1.0,
                at_least: true,
            });
        }
    }
    out
}

/// The goals, for every store and latency measured.
fn goals(run: &Run) -> Vec<Goal> {
    if PROCS.load(std::sync::atomic::Ordering::Relaxed) {
        return procs_goals(run);
    }
    if disk_mode() {
        return disk_goals(run);
    }
    let seconds = |w: Access, c: RemoteColumn| run.seconds(w, 1, c);
    let column = |store, latency_ms, engine| RemoteColumn {
        store,
        latency_ms,
        engine,
    };
    let full = Engine::Faultmap(ReadaheadMode::Full);
    let around = Engine::Faultmap(ReadaheadMode::AroundOnly);
    let mut out = Vec::new();
    for (store, latency) in store_latencies(run) {
        let place = format!("{} at {latency} ms", store.name());
        let fm = seconds(Access::Seq, column(store, latency, full));
        let raw = seconds(Access::Seq, column(store, latency, Engine::RawGet));
        if let Some(value) = raw.zip(fm).and_then(|(r, f)| grid::ratio(r, f)) {
            let what = "cold seq, faultmap over raw-get (time ratio)".into();
            out.push(Goal {
                place: place.clone(),
                what,
                value,
                bound: 0.8,
                at_least: true,
            });
        }
        let best_peer = run
            .columns
            .iter()
            .filter(|c| c.store == store && c.latency_ms == latency)
            .filter(|c| matches!(c.engine, Engine::Fuse(_)))
            .filter_map(|&c| Some((c, seconds(Access::Seq, c)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some(value) = best_peer.zip(fm).and_then(|((_, p), f)| grid::ratio(p, f)) {
            let peer = best_peer.map_or("", |(c, _)| c.engine());
            let what = format!("cold seq, faultmap over the best FUSE peer ({peer})");
            out.push(Goal {
                place: place.clone(),
                what,
                value,
                bound: 2.0,
                at_least: true,
            });
        }
        if latency >= 20 {
            out.extend(random_goals(run, &place, store, latency));
            for w in [Access::Rand, Access::Clustered] {
                let ra = seconds(w, column(store, latency, full));
                let ar = seconds(w, column(store, latency, around));
                if let Some(value) = ra.zip(ar).and_then(|(ra, ar)| grid::ratio(ra, ar)) {
                    let what = format!("{}: readahead's time over read-around's", w.name());
                    out.push(Goal {
                        place: place.clone(),
                        what,
                        value,
                        bound: 0.7,
                        at_least: false,
                    });
                }
                let replay = seconds(w, column(store, latency, Engine::Replay));
                if let Some(value) = ra.zip(replay).and_then(|(ra, re)| grid::ratio(ra, re)) {
                    let what = format!(
                        "{}: second cold run, the trace replayed (time without over with)",
                        w.name()
                    );
                    out.push(Goal {
                        place: place.clone(),
                        what,
                        value,
                        bound: 3.0,
                        at_least: true,
                    });
                }
            }
        }
    }
    if let Some(budget) = run.mode.budget {
        let peak = run
            .cells
            .iter()
            .filter(|c| c.key.column.engine() == "faultmap")
            .filter_map(|c| c.samples.iter().filter_map(|s| s.peak_bytes).max())
            .max();
        if let Some(peak) = peak {
            out.push(Goal {
                place: "all".into(),
                what: format!(
                    "faultmap's peak memory over the budget ({})",
                    units::bytes(budget)
                ),
                value: peak as f64 / budget as f64,
                bound: 1.01,
                at_least: false,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::grid::{Key, Sample};
    use crate::bench::probe::Machine;

    fn col(store: StoreKind, engine: Engine) -> RemoteColumn {
        RemoteColumn {
            store,
            latency_ms: 20,
            engine,
        }
    }

    fn cell(w: Access, c: RemoteColumn, seconds: f64) -> Cell<Access, RemoteColumn> {
        bytes_cell(w, c, seconds, None)
    }

    fn bytes_cell(
        w: Access,
        c: RemoteColumn,
        seconds: f64,
        io_bytes: Option<u64>,
    ) -> Cell<Access, RemoteColumn> {
        Cell {
            key: Key {
                workload: w,
                threads: 1,
                column: c,
            },
            samples: vec![Sample {
                seconds,
                peak_bytes: Some(100),
                io_bytes,
                ..Sample::default()
            }],
        }
    }

    /// A one-thread run of `workloads` over `columns` with `cells`.
    fn test_run(
        workloads: Vec<Access>,
        columns: Vec<RemoteColumn>,
        cells: Vec<Cell<Access, RemoteColumn>>,
        budget: Option<u64>,
    ) -> Run {
        Run {
            machine: Machine::read(),
            data: DataInfo::test(),
            workloads,
            threads: vec![1],
            deliveries: Vec::new(),
            columns,
            cells,
            wall_seconds: 1.0,
            mode: Remote {
                repetitions: 1,
                sample_pages: 16,
                budget,
                raw: BTreeMap::new(),
                fuse_skipped: None,
                fault_path: None,
            },
        }
    }

    #[test]
    fn goals_come_from_the_right_cells() {
        let full = Engine::Faultmap(ReadaheadMode::Full);
        let around = Engine::Faultmap(ReadaheadMode::AroundOnly);
        let http = StoreKind::Http;
        let cells = vec![
            cell(Access::Seq, col(http, Engine::RawGet), 1.0),
            cell(Access::Seq, col(http, full), 2.0),
            cell(Access::Seq, col(http, Engine::Fuse("rclone")), 8.0),
            cell(Access::Seq, col(http, Engine::Fuse("s3fs")), 5.0),
            cell(Access::Rand, col(http, full), 3.0),
            cell(Access::Rand, col(http, around), 6.0),
        ];
        let columns = vec![
            col(http, Engine::RawGet),
            col(http, full),
            col(http, around),
            col(http, Engine::Fuse("rclone")),
            col(http, Engine::Fuse("s3fs")),
        ];
        let run = test_run(vec![Access::Seq, Access::Rand], columns, cells, Some(100));
        let g: Vec<(String, f64, bool)> = goals(&run)
            .iter()
            .map(|g| (g.what.clone(), g.value, g.met()))
            .collect();
        assert_eq!(g[0].1, 0.5, "raw-get 1 s over faultmap 2 s");
        assert!(!g[0].2);
        assert!(
            g[1].0.contains("s3fs"),
            "the best peer is the fastest: {g:?}"
        );
        assert_eq!((g[1].1, g[1].2), (2.5, true));
        assert_eq!(
            (g[2].0.as_str(), g[2].1, g[2].2),
            (
                "rand: adaptive read-around's time over the faster fixed mode's",
                0.5,
                true
            ),
            "rand: 3 s over read-around's 6 s (no fixed column)"
        );
        assert_eq!((g[3].1, g[3].2), (0.5, true), "rand: 3 s over 6 s");
        assert_eq!(
            g.len(),
            5,
            "no clustered cells, so no clustered goal; the budget: {g:?}"
        );
        assert_eq!((g[4].1, g[4].2), (1.0, true));
    }

    #[test]
    fn the_disk_cache_goals_compare_each_run_with_the_right_one() {
        use engines::DiskRun::{First, Second, SecondCold};
        let http = StoreKind::Http;
        let full = Engine::Faultmap(ReadaheadMode::Full);
        let cells = vec![
            bytes_cell(Access::Seq, col(http, full), 1.5, Some(1 << 30)),
            bytes_cell(
                Access::Seq,
                col(http, Engine::Disk(First)),
                1.6,
                Some(1 << 30),
            ),
            bytes_cell(Access::Seq, col(http, Engine::Disk(Second)), 0.5, Some(0)),
            bytes_cell(
                Access::Seq,
                col(http, Engine::Disk(SecondCold)),
                0.8,
                Some(7),
            ),
            cell(
                Access::Seq,
                col(http, Engine::FuseCached("rclone", Second)),
                2.0,
            ),
            cell(
                Access::Seq,
                col(http, Engine::FuseCached("rclone", SecondCold)),
                0.4,
            ),
        ];
        let columns = cells.iter().map(|c| c.key.column).collect();
        let run = test_run(vec![Access::Seq], columns, cells, None);
        let g: Vec<(String, f64, bool)> = disk_goals(&run)
            .iter()
            .map(|g| (g.what.clone(), g.value, g.met()))
            .collect();
        let values: Vec<(f64, bool)> = g
            .iter()
            .map(|g| ((g.1 * 1000.0).round() / 1000.0, g.2))
            .collect();
        assert_eq!(
            values,
            vec![
                (0.0, true),   // the second run's object bytes
                (3.2, true),   // first over second
                (4.0, true),   // rclone's second over ours
                (7.0, false),  // the cold second run moved 7 bytes
                (2.0, false),  // first over cold second
                (0.5, false),  // rclone's cold second over ours
                (1.067, true), // first over no disk cache
            ],
            "{g:?}"
        );
        assert!(g[2].0.contains("rclone's second run"), "{g:?}");
        assert!(g[6].0.contains("without one"), "{g:?}");
    }

    #[test]
    fn the_random_goals_compare_batch_with_rand_and_adaptive_with_both_fixed_modes() {
        let full = Engine::Faultmap(ReadaheadMode::Full);
        let around = Engine::Faultmap(ReadaheadMode::AroundOnly);
        let http = StoreKind::Http;
        let mib = 1 << 20;
        let cells = vec![
            bytes_cell(Access::Rand, col(http, full), 6.0, Some(20 * mib)),
            bytes_cell(Access::Rand, col(http, Engine::Fixed), 5.5, Some(250 * mib)),
            bytes_cell(Access::Rand, col(http, around), 2.0, Some(1000 * mib)),
            cell(Access::Batch, col(http, full), 0.25),
        ];
        let columns = vec![col(http, full), col(http, Engine::Fixed), col(http, around)];
        let run = test_run(vec![Access::Rand, Access::Batch], columns, cells, None);
        let g: Vec<(String, f64, bool)> = random_goals(&run, "http", http, 20)
            .iter()
            .map(|g| (g.what.clone(), g.value, g.met()))
            .collect();
        assert_eq!(g.len(), 3, "{g:?}");
        assert!(
            g[0].0.starts_with("batch") && g[0].1 == 24.0 && g[0].2,
            "{g:?}"
        );
        // Against read-around's 2 s (the faster), 250 MiB (the thriftier).
        assert!(g[1].1 == 3.0 && !g[1].2, "{g:?}");
        assert!(g[2].1 == 0.08 && g[2].2, "{g:?}");
    }

    #[test]
    fn the_object_stores_have_columns_and_no_fuse_peer() {
        let full = Engine::Faultmap(ReadaheadMode::Full);
        assert_eq!(col(StoreKind::Gs, full).heading(), "gs:faultmap-full@20ms");
        assert_eq!(
            col(StoreKind::Az, Engine::RawGet).heading(),
            "az:raw-get@20ms"
        );
        let all = [StoreKind::Http, StoreKind::S3, StoreKind::Gs, StoreKind::Az];
        assert_eq!(
            fuse_note(&all, false, true).as_deref(),
            Some("none on gs, az (s3fs and rclone are mounted over S3 and HTTP only)")
        );
        assert_eq!(
            fuse_note(&all, true, false),
            None,
            "--no-fuse: no peers asked"
        );
        assert_eq!(fuse_note(&all[..2], false, true), None);
        let note = fuse_note(&all[..3], false, false).unwrap_or_default();
        assert!(
            note.starts_with("no FUSE peer could be mounted") && note.ends_with("HTTP only)"),
            "{note}"
        );
        assert_eq!(
            fuse_note(&all[2..], false, false).as_deref(),
            Some("none on gs, az (s3fs and rclone are mounted over S3 and HTTP only)"),
            "no peer was tried: none is missing"
        );
    }

    #[test]
    fn only_full_readahead_runs_at_every_thread_count() {
        assert!(!col(StoreKind::S3, Engine::Faultmap(ReadaheadMode::Full)).once());
        assert!(col(StoreKind::S3, Engine::Faultmap(ReadaheadMode::AroundOnly)).once());
        assert!(col(StoreKind::S3, Engine::RawGet).once());
        assert_eq!(
            col(StoreKind::S3, Engine::RawGet).heading(),
            "s3:raw-get@20ms"
        );
    }
}
