//! `faultmap scan`: read a whole file through a faultmap mapping.
//!
//! 1. Open the file or URL ([`faultmap::open_url`]: a local file as a
//!    [`faultmap::FileStore`], which refuses directories, FIFOs, sockets and
//!    devices with a typed error; `http(s)://` and `s3://` as remote
//!    stores) and map it at the asked
//!    fault-around order and readahead. An empty file is an empty mapping:
//!    CRC 0.
//! 2. Cut the mapping into `T` contiguous parts on page boundaries; thread
//!    `i` computes the CRC-32 of part `i`. Every byte is read through the
//!    mapping, so every page comes in through faultmap's fault path.
//! 3. Combine the parts' CRCs in order (`crc32fast::Hasher::combine`): the
//!    result is the CRC-32 of the whole file, equal to zlib's.
//! 4. Drop the mapping and the pager: its I/O threads finish the reads
//!    still queued (readahead past the end of what was read) before they
//!    stop, so the object's counters, read then, are the scan's whole
//!    story.
//! 5. Print the CRC (decimal and hex), size, time, throughput and the
//!    object's counters, or one JSON object.
//!
//! The time covers step 2 only: the reading, not opening or mapping.

use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use faultmap::{
    open_url_with, Config, DiskCacheStats, Pager, RemoteTuning, Stats, Store, PAGE_SIZE,
};
use serde::Serialize;
use std::sync::Arc;

use crate::table::Table;
use crate::units;
use crate::{Readahead, ScanArgs};

/// What a scan found.
#[derive(Debug, Serialize)]
struct ScanReport<'a> {
    file: &'a str,
    /// The paging engine that ran (userfaultfd or protect).
    #[serde(serialize_with = "crate::serialize_engine")]
    engine: faultmap::Engine,
    /// Why that engine: who asked for it, or what auto found.
    engine_why: String,
    crc32: u32,
    crc32_hex: String,
    bytes: u64,
    /// In pages of `page_size` bytes.
    pages: u64,
    /// faultmap's page size in bytes (--page-size).
    page_size: u64,
    seconds: f64,
    bytes_per_second: Option<f64>,
    #[serde(serialize_with = "crate::serialize_order")]
    order: u8,
    readahead: Readahead,
    threads: u16,
    handler_threads: u16,
    /// What --record-trace wrote.
    trace: Option<crate::TraceWritten>,
    stats: Stats,
    /// What the disk cache did, if the object was read through one.
    disk_cache: Option<DiskCacheStats>,
}

/// Runs `faultmap scan`.
pub fn run(args: &ScanArgs) -> Result<()> {
    let opts = crate::stats::map_options(args.map.order, args.map.ra_pages, args.map.readahead);
    let opts = args.map.with_trace(opts)?;
    opts.validate()?;
    let config = Config::default()
        .handler_threads(usize::from(args.map.handler_threads))
        .engine(args.map.engine);
    let config = args.map.cache.configure(config);
    config.validate()?;
    let pager = Pager::new(config).context("cannot start the pager")?;
    let engine = pager.engine().clone();
    let store: Arc<dyn Store> = Arc::from(open_url_with(
        &args.map.file,
        &RemoteTuning::for_config(pager.config()),
    )?);
    let object = pager.open_with_page_size(store.clone(), args.map.page_size())?;
    let map = crate::map_readonly(&pager, &object, opts)
        .with_context(|| format!("cannot map {}", args.map.file))?;
    let start = Instant::now();
    let crc = parallel_crc(&map, usize::from(args.map.threads))?;
    let elapsed = start.elapsed();
    let bytes = map.len() as u64;
    let trace = args.map.save_trace(&map)?;
    // Settle: the pager's I/O threads finish their queued reads as it goes,
    // so the object's counters then hold every read of the scan.
    drop(map);
    drop(pager);
    let report = ScanReport {
        file: &args.map.file,
        crc32: crc,
        crc32_hex: format!("{crc:08x}"),
        bytes,
        pages: bytes.div_ceil(object.page_size().bytes() as u64),
        page_size: object.page_size().bytes() as u64,
        seconds: elapsed.as_secs_f64(),
        bytes_per_second: rate(bytes, elapsed),
        order: args.map.order,
        readahead: args.map.readahead,
        threads: args.map.threads,
        handler_threads: args.map.handler_threads,
        engine: engine.engine,
        engine_why: engine.why,
        trace,
        stats: object.stats(),
        disk_cache: store.disk_cache_stats(),
    };
    crate::output::print(
        args.json,
        |out| crate::output::json_line(out, &report),
        || human(&report),
    )
}

/// The CRC-32 of `data`, computed by `threads` threads over contiguous parts.
fn parallel_crc(data: &[u8], threads: usize) -> Result<u32> {
    let parts: Vec<Range<usize>> = split(data.len(), threads);
    let hashers = std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .map(|range| {
                let part = &data[range.clone()];
                s.spawn(move || {
                    let mut h = crc32fast::Hasher::new();
                    h.update(part);
                    h
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .collect::<Result<Vec<_>, _>>()
    })
    .map_err(|_| anyhow::anyhow!("a reading thread died"))?;
    let mut whole = crc32fast::Hasher::new();
    for h in &hashers {
        whole.combine(h);
    }
    Ok(whole.finalize())
}

/// Cuts `[0, len)` into `parts` contiguous ranges whose boundaries are
/// page-aligned (trailing ranges may be empty when there are few pages).
fn split(len: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let pages = len.div_ceil(PAGE_SIZE);
    let per_part = pages.div_ceil(parts) * PAGE_SIZE;
    (0..parts)
        .map(|i| {
            let start = (i * per_part).min(len);
            let end = ((i + 1) * per_part).min(len);
            start..end
        })
        .collect()
}

fn rate(bytes: u64, elapsed: Duration) -> Option<f64> {
    let secs = elapsed.as_secs_f64();
    (secs > 0.0).then(|| bytes as f64 / secs)
}

fn human(r: &ScanReport<'_>) -> String {
    let elapsed = Duration::from_secs_f64(r.seconds);
    let mut head = Table::new(2);
    head.row(["file".to_string(), r.file.to_string()]);
    head.row([
        "crc32".to_string(),
        format!("{} (0x{})", r.crc32, r.crc32_hex),
    ]);
    head.row([
        "bytes".to_string(),
        format!(
            "{} ({}, {} pages)",
            units::count(r.bytes),
            units::bytes(r.bytes),
            units::count(r.pages)
        ),
    ]);
    head.row(["time".to_string(), format!("{:.6} s", r.seconds)]);
    head.row([
        "throughput".to_string(),
        units::throughput(r.bytes, elapsed),
    ]);
    head.row([
        "settings".to_string(),
        format!(
            "fault-around order {}, readahead {}, {} reading thread(s), {} handler thread(s)",
            crate::order_name(r.order),
            r.readahead.name(),
            r.threads,
            r.handler_threads
        ),
    ]);
    head.row([
        "engine".to_string(),
        format!("{} ({})", r.engine, r.engine_why),
    ]);
    if let Some(t) = &r.trace {
        head.row(["trace".to_string(), t.line()]);
    }
    if let Some(d) = &r.disk_cache {
        head.row(["disk cache".to_string(), crate::cache::stats_line(d)]);
    }
    let mut stats = Table::new(1);
    stats.row(["stat", "value"]);
    for (name, value) in r.stats.fields() {
        stats.row([name.to_string(), units::count(value)]);
    }
    format!("{}\n{}", head.render(), stats.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_page_boundaries_and_covers_everything() {
        for (len, parts) in [(0, 3), (1, 2), (4097, 2), (10 * 4096 + 5, 3), (4096, 8)] {
            let ranges = split(len, parts);
            assert_eq!(ranges.len(), parts);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[parts - 1].end, len);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(pair[0].end % PAGE_SIZE == 0 || pair[0].end == len);
            }
        }
    }

    #[test]
    fn combined_crc_equals_the_whole() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for threads in [1, 2, 3, 16] {
            assert_eq!(
                parallel_crc(&data, threads).unwrap(),
                crc32fast::hash(&data)
            );
        }
    }
}
