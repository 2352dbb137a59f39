//! The cold benchmark's engines, and one cold measurement of one.
//!
//! | column      | engine (JSON)  | variant            | what a run is                                      |
//! |-------------|----------------|--------------------|----------------------------------------------------|
//! | `device`    | `device`       | `cold`             | the whole file, O_DIRECT 1 MiB reads, many in flight |
//! | `kernel`    | `kernel-file`  | `cold`             | kernel `mmap` of the file, page cache dropped first |
//! | `around`    | `faultmap`     | `readahead=around` | a new object, read-around only  |
//! | `readahead` | `faultmap`     | `readahead=full`   | a new object, the kernel's full readahead  |
//! | `page=2M`   | `faultmap`     | `readahead=full,page=2M` | the same with 2 MiB pages (`--page-size 2M`) |
//!
//! # One measurement ([`Bench::measure`])
//!
//! 1. Set up, untimed: open the file and map it (`kernel`: a new `File`, so
//!    a new `file_ra_state`; faultmap: a new [`Pager`] and in it a new
//!    [`Object`](faultmap::Object) over a new [`FileStore`], whose cache is
//!    empty).
//! 2. Drop the kernel's page cache (`echo 3`), for faultmap too: its store
//!    reads the file with `pread`, through the kernel's page cache, which
//!    must not hold the file either.
//! 3. Read the block device's counters, run the plan's threads over the one
//!    mapping (timed), read the counters again.
//! 4. faultmap: drop the mapping and the pager, untimed. The pager's I/O
//!    threads finish the reads still queued (async readahead past the last
//!    page touched) before they stop, so the object's counters, read then,
//!    hold every read the run caused, and no read of one run lands in the
//!    next.
//! 5. Counts: `kernel`: `getrusage` faults, the block device's reads;
//!    faultmap: the object's counters and readahead table.
//!
//! `device` is [`faultmap::measure::direct_read_rate`]: the file read with
//! O_DIRECT in 1 MiB requests, about 32 MiB of them in flight through
//! io_uring (one at a time without io_uring). It needs no dropping:
//! O_DIRECT bypasses the page cache. Its request count is the number of
//! 1 MiB reads issued.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use faultmap::{Config, FileIo, FileStore, PageSize, Pager, RaStats, Stats, PAGE_SIZE};

use super::super::engine::kernel_map;
use super::super::grid::{Column, Sample};
use crate::access::AccessPlan;
use crate::kernel::{BlockDevice, BlockReads, CacheDropper};
use crate::timed::Timed;
use crate::Readahead;

/// The device column's request size: 1 MiB.
pub const DEVICE_CHUNK: usize = 1 << 20;

/// One column of the cold table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColdEngine {
    /// O_DIRECT sequential reads of the whole file: the disk's limit.
    Device,
    /// Kernel `mmap` of the file.
    Kernel,
    /// faultmap, read-around only.
    Around,
    /// faultmap, full readahead.
    Readahead,
    /// faultmap, full readahead, 2 MiB pages.
    Huge,
}

impl ColdEngine {
    /// The columns, in order; `kernel` only if the page cache can be
    /// dropped, `around` and `readahead` with 4 KiB pages (`base`),
    /// `page=2M` with 2 MiB pages (`huge`).
    pub fn columns(kernel: bool, base: bool, huge: bool) -> Vec<ColdEngine> {
        let mut v = vec![ColdEngine::Device];
        if kernel {
            v.push(ColdEngine::Kernel);
        }
        if base {
            v.extend([ColdEngine::Around, ColdEngine::Readahead]);
        }
        if huge {
            v.push(ColdEngine::Huge);
        }
        v
    }

    /// The `variant` field of a JSON row.
    pub fn variant(self) -> &'static str {
        match self {
            ColdEngine::Device | ColdEngine::Kernel => "cold",
            ColdEngine::Around => "readahead=around",
            ColdEngine::Readahead => "readahead=full",
            ColdEngine::Huge => "readahead=full,page=2M",
        }
    }

    /// faultmap's readahead, for the faultmap columns.
    pub fn readahead(self) -> Option<Readahead> {
        match self {
            ColdEngine::Around => Some(Readahead::Around),
            ColdEngine::Readahead | ColdEngine::Huge => Some(Readahead::Full),
            ColdEngine::Device | ColdEngine::Kernel => None,
        }
    }
}

impl Column for ColdEngine {
    fn heading(self) -> String {
        let heading = match self {
            ColdEngine::Device => "device",
            ColdEngine::Kernel => "kernel",
            ColdEngine::Around => "around",
            ColdEngine::Readahead => "readahead",
            ColdEngine::Huge => "page=2M",
        };
        heading.into()
    }

    fn engine(self) -> &'static str {
        match self {
            ColdEngine::Device => "device",
            ColdEngine::Kernel => "kernel-file",
            ColdEngine::Around | ColdEngine::Readahead | ColdEngine::Huge => "faultmap",
        }
    }

    fn variant(self) -> String {
        self.variant().into()
    }

    fn once(self) -> bool {
        self == ColdEngine::Device
    }
}

/// What every measurement needs.
#[derive(Debug)]
pub struct Bench<'a> {
    /// The data file.
    pub path: &'a Path,
    /// The configuration of the pager each faultmap run starts.
    pub config: &'a Config,
    /// Drops the kernel's page cache (`None`: not permitted; no kernel
    /// column, and faultmap's store may read from the page cache).
    pub dropper: Option<&'a CacheDropper>,
    /// The file's block device, if its counters are readable.
    pub device: Option<&'a BlockDevice>,
    /// faultmap's fault-around order.
    pub order: u8,
    /// faultmap's readahead window, if not the store's.
    pub ra_pages: Option<u64>,
    /// How faultmap's file store reads.
    pub file_io: FileIo,
}

impl Bench<'_> {
    /// One cold run of `engine` (`device` needs no plan).
    pub fn measure(&self, engine: ColdEngine, plan: Option<&AccessPlan>) -> Result<Sample> {
        let plan = || plan.context("a workload without a plan");
        match engine {
            ColdEngine::Device => self.device(),
            ColdEngine::Kernel => self.kernel(plan()?),
            ColdEngine::Around => self.faultmap(Readahead::Around, PageSize::Base, plan()?),
            ColdEngine::Readahead => self.faultmap(Readahead::Full, PageSize::Base, plan()?),
            ColdEngine::Huge => self.faultmap(Readahead::Full, PageSize::Huge, plan()?),
        }
    }

    /// The whole file with O_DIRECT.
    fn device(&self) -> Result<Sample> {
        let before = self.block_reads();
        let (bytes, seconds) = faultmap::measure::direct_read_rate(self.path, DEVICE_CHUNK)
            .with_context(|| format!("O_DIRECT reads of {}", self.path.display()))?;
        Ok(Sample {
            seconds,
            io_count: Some(bytes.div_ceil(DEVICE_CHUNK as u64)),
            io_bytes: Some(bytes),
            pages_touched: Some(bytes.div_ceil(PAGE_SIZE as u64)),
            block: since(self.block_reads(), before),
            ..Sample::default()
        })
    }

    /// Kernel `mmap` of the file, its page cache dropped.
    fn kernel(&self, plan: &AccessPlan) -> Result<Sample> {
        let file =
            File::open(self.path).with_context(|| format!("opening {}", self.path.display()))?;
        let view = kernel_map(&file)?;
        let (timed, block) = self.timed_walk(plan, &view)?;
        Ok(Sample {
            seconds: timed.seconds,
            faults: Some(timed.minor_faults + timed.major_faults),
            major_faults: Some(timed.major_faults),
            io_count: block.map(|b| b.reads),
            io_bytes: block.map(|b| b.bytes),
            block,
            pages_touched: Some(plan.pages_touched()),
            checksum: Some(checksum(&timed)),
            ..Sample::default()
        })
    }

    /// faultmap with `readahead` in pages of `page`, on a new pager and
    /// object.
    fn faultmap(&self, readahead: Readahead, page: PageSize, plan: &AccessPlan) -> Result<Sample> {
        let opts = crate::stats::map_options(self.order, self.ra_pages, readahead);
        let pager = Pager::new(self.config.clone()).context("cannot start the pager")?;
        let store = FileStore::open_with(self.path, self.file_io)?;
        let object = pager.open_with_page_size(store, page)?;
        let map = crate::map_readonly(&pager, &object, opts)
            .context("mapping the data through faultmap")?;
        let (timed, block) = self.timed_walk(plan, &map)?;
        // Step 4.
        drop(map);
        drop(pager);
        let stats = object.stats();
        let ra = object.ra_stats();
        Ok(Sample {
            seconds: timed.seconds,
            faults: Some(stats.pgfault),
            major_faults: Some(stats.pgmajfault),
            io_count: Some(faultmap_io_count(&stats, &ra)),
            io_bytes: Some(stats.io_bytes),
            block,
            stats: Some(stats),
            ra: Some(ra),
            pages_touched: Some(plan.pages_touched()),
            checksum: Some(checksum(&timed)),
            ..Sample::default()
        })
    }

    /// Steps 2 and 3: drop the page cache, run the plan over `view`, and
    /// count the block device's reads meanwhile.
    fn timed_walk(&self, plan: &AccessPlan, view: &[u8]) -> Result<(Timed, Option<BlockReads>)> {
        if let Some(dropper) = self.dropper {
            dropper
                .drop_caches()
                .context("dropping the kernel's page cache")?;
        }
        let before = self.block_reads();
        let timed = crate::timed::run(plan.threads(), |i| plan.walk(i, view))?;
        Ok((timed, since(self.block_reads(), before)))
    }

    fn block_reads(&self) -> Option<BlockReads> {
        self.device.and_then(BlockDevice::reads)
    }
}

/// faultmap's store reads. `Stats::io_count` counts only the requests of
/// windows that a miss submitted (the library at fd211b0), not those of the
/// async windows a marker starts, while the readahead table's `all` row
/// counts every window's requests; a request outside any window would be in
/// `Stats::io_count` only. The larger of the two is the complete count
/// under either accounting.
pub fn faultmap_io_count(stats: &Stats, ra: &RaStats) -> u64 {
    stats.io_count.max(ra.all.io_count)
}

/// The change of the block counters, if both readings exist.
fn since(after: Option<BlockReads>, before: Option<BlockReads>) -> Option<BlockReads> {
    Some(after?.since(before?))
}

/// The threads' sums together: the same for every engine and thread count.
fn checksum(timed: &Timed) -> u64 {
    timed.sums.iter().fold(0u64, |a, &s| a.wrapping_add(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_and_names() {
        let all = ColdEngine::columns(true, true, false);
        let names: Vec<_> = all.iter().map(|e| e.heading()).collect();
        assert_eq!(names, ["device", "kernel", "around", "readahead"]);
        assert_eq!(ColdEngine::columns(false, true, false).len(), 3);
        let huge = ColdEngine::columns(true, true, true);
        assert_eq!(huge[4].heading(), "page=2M");
        assert_eq!(huge[4].variant(), "readahead=full,page=2M");
        assert_eq!(ColdEngine::columns(true, false, true).len(), 3);
        assert_eq!(ColdEngine::Kernel.engine(), "kernel-file");
        assert_eq!(ColdEngine::Around.variant(), "readahead=around");
        assert_eq!(ColdEngine::Readahead.readahead(), Some(Readahead::Full));
        assert_eq!(ColdEngine::Device.readahead(), None);
    }

    #[test]
    fn faultmap_io_count_includes_async_windows() {
        let stats = Stats {
            io_count: 1,
            ..Stats::default()
        };
        let mut ra = RaStats::default();
        ra.all.io_count = 1027;
        assert_eq!(faultmap_io_count(&stats, &ra), 1027);
        ra.all.io_count = 0;
        assert_eq!(faultmap_io_count(&stats, &ra), 1);
    }

    #[test]
    fn block_deltas_need_both_readings() {
        let r = |reads| Some(BlockReads { reads, bytes: 0 });
        assert_eq!(since(r(5), r(2)).map(|b| b.reads), Some(3));
        assert_eq!(since(None, r(2)), None);
    }
}
