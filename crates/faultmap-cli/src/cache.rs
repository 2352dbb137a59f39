//! `faultmap cache`: what a disk cache of remote objects holds, its size,
//! its checksums, and clearing it. The library does the work
//! ([`faultmap::DiskCache`]); this prints it.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::table::Table;
use crate::units;

/// `faultmap cache`'s arguments.
#[derive(Args, Debug)]
pub struct CacheCommandArgs {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    cache: crate::CacheArgs,
    /// Print JSON instead of the human-readable report.
    #[arg(long, global = true)]
    json: bool,
}

/// What to do with the cache.
#[derive(Subcommand, Debug)]
enum Action {
    /// The objects it holds: URL, version, length, and the bytes it holds
    /// of each.
    Ls {
        /// Only this object.
        #[arg(value_name = "URL")]
        url: Option<String>,
    },
    /// The bytes it takes on disk, against its bounds.
    Du,
    /// Checks every page it holds against its checksum. Pages that fail
    /// are never served (they are read from the network again); they are
    /// listed, and the command fails.
    Verify {
        /// Only this object.
        #[arg(value_name = "URL")]
        url: Option<String>,
    },
    /// Removes an object's every version, or everything.
    Clear {
        /// Only this object.
        #[arg(value_name = "URL")]
        url: Option<String>,
    },
}

/// Runs `faultmap cache`.
pub fn run(args: &CacheCommandArgs) -> Result<()> {
    let config = args.cache.config()?;
    let cache = faultmap::DiskCache::open(&config)?;
    let dir = cache.dir().display().to_string();
    match &args.action {
        Action::Ls { url } => {
            let objects = cache
                .objects(url.as_deref())
                .with_context(|| format!("cannot list {dir}"))?;
            let rows: Vec<ObjectRow> = objects.iter().map(ObjectRow::from).collect();
            crate::output::print(
                args.json,
                |out| crate::output::json_line(out, &rows),
                || ls_human(&rows),
            )
        }
        Action::Du => {
            let used = cache
                .disk_bytes()
                .with_context(|| format!("cannot measure {dir}"))?;
            let objects = cache.objects(None)?.len();
            let (size, free) = faultmap::sys::fs_space(cache.dir())?;
            let report = Du {
                dir,
                bytes: used,
                objects,
                max_bytes: cache.max_bytes(),
                min_free_bytes: cache.min_free_bytes(),
                fs_bytes: size,
                fs_free_bytes: free,
            };
            crate::output::print(
                args.json,
                |out| crate::output::json_line(out, &report),
                || du_human(&report),
            )
        }
        Action::Verify { url } => {
            let found = cache
                .verify(url.as_deref())
                .with_context(|| format!("cannot verify {dir}"))?;
            let report = VerifyReport {
                objects: found.objects,
                good_pages: found.good_pages,
                bad_pages: found
                    .bad_pages
                    .iter()
                    .map(|p| BadRow {
                        url: p.url.clone(),
                        version: p.version.clone(),
                        offset: p.offset,
                    })
                    .collect(),
                bad_chunks: found
                    .bad_chunks
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            };
            crate::output::print(
                args.json,
                |out| crate::output::json_line(out, &report),
                || verify_human(&report),
            )?;
            if report.bad_pages.is_empty() && report.bad_chunks.is_empty() {
                Ok(())
            } else {
                anyhow::bail!(
                    "{} page(s) and {} chunk file(s) do not match their checksums; they are \
                     never served, and are read from the network again",
                    report.bad_pages.len(),
                    report.bad_chunks.len()
                )
            }
        }
        Action::Clear { url } => {
            let freed = cache
                .clear(url.as_deref())
                .with_context(|| format!("cannot clear {dir}"))?;
            let report = Cleared {
                dir,
                freed_bytes: freed,
            };
            crate::output::print(
                args.json,
                |out| crate::output::json_line(out, &report),
                || format!("cleared {}: freed {}\n", report.dir, units::bytes(freed)),
            )
        }
    }
}

/// One line of a [`faultmap::DiskCacheStats`].
pub fn stats_line(d: &faultmap::DiskCacheStats) -> String {
    let mut line = format!(
        "{} from disk, {} from the network, {} written, {} wait(s) for another reader's fetch",
        units::bytes(d.disk_bytes),
        units::bytes(d.network_bytes),
        units::bytes(d.written_bytes),
        d.waits
    );
    if let Some(first) = &d.first_problem {
        line.push_str(&format!(
            "; {} disk problem(s), the first: {first}",
            d.problems
        ));
    }
    line
}

#[derive(Serialize)]
struct ObjectRow {
    url: String,
    version: String,
    len: u64,
    cached_bytes: u64,
    disk_bytes: u64,
    chunks: u64,
    /// Seconds since the Unix epoch.
    last_used: Option<u64>,
}

impl From<&faultmap::store::disk::CachedObject> for ObjectRow {
    fn from(o: &faultmap::store::disk::CachedObject) -> Self {
        ObjectRow {
            url: o.url.clone(),
            version: o.version.clone(),
            len: o.len,
            cached_bytes: o.cached_bytes,
            disk_bytes: o.disk_bytes,
            chunks: o.chunks,
            last_used: o
                .last_used
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
        }
    }
}

fn ls_human(rows: &[ObjectRow]) -> String {
    if rows.is_empty() {
        return "the cache holds no objects\n".to_string();
    }
    let mut t = Table::new(2);
    t.row(["url", "version", "length", "cached", "on disk", "chunks"]);
    for r in rows {
        t.row([
            r.url.clone(),
            r.version.clone(),
            units::bytes(r.len),
            format!(
                "{} ({:.0} %)",
                units::bytes(r.cached_bytes),
                100.0 * r.cached_bytes as f64 / r.len.max(1) as f64
            ),
            units::bytes(r.disk_bytes),
            units::count(r.chunks),
        ]);
    }
    t.render()
}

#[derive(Serialize)]
struct Du {
    dir: String,
    bytes: u64,
    objects: usize,
    max_bytes: Option<u64>,
    min_free_bytes: u64,
    fs_bytes: u64,
    fs_free_bytes: u64,
}

fn du_human(d: &Du) -> String {
    let max = d.max_bytes.map_or("no maximum".to_string(), |m| {
        format!("maximum {}", units::bytes(m))
    });
    format!(
        "{}\t{} in {} object(s); {max}, leaves {} free; file system {} free of {}\n",
        d.dir,
        units::bytes(d.bytes),
        d.objects,
        units::bytes(d.min_free_bytes),
        units::bytes(d.fs_free_bytes),
        units::bytes(d.fs_bytes)
    )
}

#[derive(Serialize)]
struct BadRow {
    url: String,
    version: String,
    offset: u64,
}

#[derive(Serialize)]
struct VerifyReport {
    objects: u64,
    good_pages: u64,
    bad_pages: Vec<BadRow>,
    bad_chunks: Vec<String>,
}

fn verify_human(r: &VerifyReport) -> String {
    let mut out = format!(
        "{} object(s), {} page(s) match their checksums, {} do not, {} chunk file(s) are not \
         their chunk's",
        r.objects,
        units::count(r.good_pages),
        r.bad_pages.len(),
        r.bad_chunks.len()
    );
    for p in r.bad_pages.iter().take(20) {
        out.push_str(&format!(
            "\nbad page: {} ({}) at offset {}",
            p.url, p.version, p.offset
        ));
    }
    if r.bad_pages.len() > 20 {
        out.push_str(&format!("\n... and {} more", r.bad_pages.len() - 20));
    }
    for c in &r.bad_chunks {
        out.push_str(&format!("\nbad chunk file: {c}"));
    }
    out.push('\n');
    out
}

#[derive(Serialize)]
struct Cleared {
    dir: String,
    freed_bytes: u64,
}
