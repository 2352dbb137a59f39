//! `faultmap stats`: run one access pattern over a file through faultmap and
//! print what the fault path did: the readahead table and the
//! counters.
//!
//! 1. Check the options (fault-around order, `ra_pages`, thread counts)
//!    against the library's bounds, before anything costly.
//! 2. Start the pager, open the file as a [`FileStore`] and map it. The
//!    object is new, so faultmap's cache is empty: every run of this
//!    command is cold for faultmap.
//! 3. Draw the access plan ([`AccessPlan`], every page of the file).
//! 4. With `--cold`, drop the kernel's page cache too (`echo 1 >
//!    /proc/sys/vm/drop_caches`), so that the store's reads come from the
//!    disk; if that is not permitted, say so on stderr and go on.
//! 5. Run the pattern on `T` threads over the one mapping, timed
//!    ([`crate::timed`]).
//! 6. Settle: drop the mapping and the pager. The pager's I/O threads
//!    finish the reads still queued (async readahead past the last page
//!    touched) before they stop, so the object's counters, read then, hold
//!    every read the run caused.
//! 7. Print the object's readahead table and counters, or one JSON object.
//!
//! The time covers step 5 only.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use faultmap::{
    open_url_with, Config, FileStore, MapOptions, Pager, RaStats, RemoteTuning, Stats, Store,
};
use serde::Serialize;

use crate::access::{Access, AccessPlan, Coverage};
use crate::kernel::{CacheDropper, Caches, DROP_CACHES};
use crate::ra_table;
use crate::table::Table;
use crate::units;
use crate::{Readahead, StatsArgs};

/// What a run found.
#[derive(Debug, Serialize)]
struct StatsReport<'a> {
    file: &'a str,
    /// The paging engine that ran (userfaultfd or protect).
    #[serde(serialize_with = "crate::serialize_engine")]
    engine: faultmap::Engine,
    /// Why that engine: who asked for it, or what auto found.
    engine_why: String,
    access: Access,
    #[serde(serialize_with = "crate::serialize_order")]
    order: u8,
    /// In pages of `page_size` bytes.
    ra_pages: u64,
    ra_pages_from: &'static str,
    /// faultmap's page size in bytes (--page-size): what `pages` and
    /// `ra_pages` count.
    page_size: u64,
    readahead: Readahead,
    file_io: &'static str,
    seconds: f64,
    threads: u16,
    handler_threads: u16,
    io_threads: usize,
    bytes: u64,
    pages: u64,
    pages_touched: u64,
    cold: bool,
    kernel_cache_dropped: bool,
    /// What --record-trace wrote.
    trace: Option<crate::TraceWritten>,
    stats: Stats,
    readahead_stats: RaStats,
    /// What the disk cache did, if the object was read through one.
    disk_cache: Option<faultmap::DiskCacheStats>,
}

/// Whether `target` is a URL of a remote object (not a local path, nor a
/// `file://` URL, which `FileStore` opens with the chosen `--file-io`).
fn is_url(target: &str) -> bool {
    target.contains("://") && !target.starts_with("file://")
}

/// Runs `faultmap stats`.
pub fn run(args: &StatsArgs) -> Result<()> {
    // 1. The options.
    let opts = map_options(args.map.order, args.map.ra_pages, args.map.readahead);
    let opts = args.map.with_trace(opts)?;
    opts.validate()?;
    let config = pager_config(args.map.handler_threads, args.io_threads).engine(args.map.engine);
    let config = args.map.cache.configure(config);
    config.validate()?;
    // 2. The pager, the file, the mapping.
    let io_threads = config.io_threads;
    let pager = Pager::new(config).context("cannot start the pager")?;
    let engine = pager.engine().clone();
    let (store, file_io): (std::sync::Arc<dyn Store>, &str) = if is_url(&args.map.file) {
        let tuning = RemoteTuning::for_config(pager.config());
        (open_url_with(&args.map.file, &tuning)?.into(), "remote")
    } else {
        let store = FileStore::open_with(&args.map.file, crate::file_io(args.file_io))?;
        let io = store.io().as_str();
        (std::sync::Arc::new(store), io)
    };
    let object = pager.open_with_page_size(store.clone(), args.map.page_size())?;
    let ra_pages = args.map.ra_pages.unwrap_or_else(|| object.ra_pages());
    let page_size = object.page_size().bytes() as u64;
    let map = crate::map_readonly(&pager, &object, opts)
        .with_context(|| format!("cannot map {}", args.map.file))?;
    // 3. The plan.
    let threads = usize::from(args.map.threads);
    let plan = AccessPlan::new(args.access, map.len(), threads, Coverage::All)?;
    // 4. The kernel's page cache.
    let kernel_cache_dropped = args.cold && drop_kernel_cache();
    // 5. The walk.
    let failed = std::sync::Mutex::new(None);
    let timed = crate::timed::run(threads, |i| plan.walk_mapping(i, &map, &failed))?;
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.context("a batch's prefetch failed"));
    }
    // 6. Settle.
    let bytes = map.len() as u64;
    let trace = args.map.save_trace(&map)?;
    drop(map);
    drop(pager);
    // 7. The report.
    let report = StatsReport {
        file: &args.map.file,
        access: args.access,
        order: args.map.order,
        ra_pages,
        ra_pages_from: if args.map.ra_pages.is_some() {
            "argument"
        } else {
            "store"
        },
        readahead: args.map.readahead,
        file_io,
        seconds: timed.seconds,
        threads: args.map.threads,
        handler_threads: args.map.handler_threads,
        io_threads,
        bytes,
        page_size,
        pages: bytes.div_ceil(page_size),
        pages_touched: plan.pages_touched(),
        cold: args.cold,
        kernel_cache_dropped,
        engine: engine.engine,
        engine_why: engine.why,
        trace,
        stats: object.stats(),
        readahead_stats: object.ra_stats(),
        disk_cache: store.disk_cache_stats(),
    };
    crate::output::print(
        args.json,
        |out| crate::output::json_line(out, &report),
        || human(&report),
    )
}

/// The mapping options of the command line (validated by the caller).
pub fn map_options(order: u8, ra_pages: Option<u64>, readahead: Readahead) -> MapOptions {
    let opts = crate::order_options(order).readahead(readahead.mode());
    match ra_pages {
        Some(pages) => opts.ra_pages(pages),
        None => opts,
    }
}

/// The pager configuration of the command line (validated by the caller).
pub fn pager_config(handler_threads: u16, io_threads: Option<u16>) -> Config {
    let config = Config::default().handler_threads(usize::from(handler_threads));
    match io_threads {
        Some(n) => config.io_threads(usize::from(n)),
        None => config,
    }
}

/// Drops the kernel's page cache; on failure says so on stderr and returns
/// false.
fn drop_kernel_cache() -> bool {
    match CacheDropper::probe(DROP_CACHES, Caches::PageCache) {
        Ok(_) => true,
        Err(err) => {
            let _ = writeln!(
                std::io::stderr(),
                "faultmap stats: cannot drop the kernel's page cache ({err}); going on: \
                 faultmap's cache is cold, but its store may read from the kernel's"
            );
            false
        }
    }
}

fn human(r: &StatsReport<'_>) -> String {
    let mut head = Table::new(2);
    head.row(["file".to_string(), r.file.to_string()]);
    head.row(["access".to_string(), access_line(r)]);
    head.row(["settings".to_string(), settings_line(r)]);
    head.row([
        "engine".to_string(),
        format!("{} ({})", r.engine, r.engine_why),
    ]);
    head.row(["caches".to_string(), cache_line(r)]);
    head.row(["time".to_string(), time_line(r)]);
    if let Some(t) = &r.trace {
        head.row(["trace".to_string(), t.line()]);
    }
    if let Some(d) = &r.disk_cache {
        head.row(["disk cache".to_string(), crate::cache::stats_line(d)]);
    }
    format!(
        "{}\nreadahead, per pattern (sizes are mean pages)\n{}\n{}",
        head.render(),
        ra_table::ra_table(&r.readahead_stats),
        ra_table::counters(&r.stats, &r.readahead_stats)
    )
}

fn access_line(r: &StatsReport<'_>) -> String {
    let what = match r.access {
        Access::Seq => "every 8-byte word in order",
        Access::Rand => "the first word of every page, pages in a random order",
        Access::Clustered => {
            "64 KiB clusters in a random order, the first word of each page of a cluster in order"
        }
        Access::Batch => {
            "the pages of rand as 4 KiB rows in batches of 64, each batch prefetched \
             (prefetch_ranges) and then read"
        }
    };
    format!(
        "{}: {what}; {} thread(s), each a contiguous part; {} of {} pages ({})",
        r.access.name(),
        r.threads,
        units::count(r.pages_touched),
        units::count(r.pages),
        units::bytes(r.bytes)
    )
}

fn settings_line(r: &StatsReport<'_>) -> String {
    let from = if r.ra_pages_from == "store" {
        "the store's default"
    } else {
        "--ra-pages"
    };
    format!(
        "fault-around order {}, readahead {}, ra_pages {} ({from}, {}), \
         file reads {}, {} handler thread(s), {} I/O thread(s)",
        crate::order_name(r.order),
        r.readahead.name(),
        units::count(r.ra_pages),
        units::bytes(r.ra_pages * r.page_size),
        r.file_io,
        r.handler_threads,
        r.io_threads
    )
}

fn cache_line(r: &StatsReport<'_>) -> String {
    let kernel = match (r.cold, r.kernel_cache_dropped) {
        (true, true) => format!("dropped first ({})", Caches::PageCache.command()),
        (true, false) => "could not be dropped".into(),
        (false, _) => "as found (--cold drops it)".into(),
    };
    format!("faultmap's: empty at the start (a new object); the kernel's: {kernel}")
}

fn time_line(r: &StatsReport<'_>) -> String {
    let elapsed = Duration::from_secs_f64(r.seconds);
    let mut line = format!("{:.6} s", r.seconds);
    if r.access == Access::Seq {
        line.push_str(&format!(", {}", units::throughput(r.bytes, elapsed)));
    }
    line
}
