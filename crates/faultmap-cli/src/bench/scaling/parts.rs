//! One `parts` sample (the lockless page cache benchmark): T threads, each touching one byte per
//! page of its own part of the data through its own mapping.
//!
//! 1. Map each thread's part: a kernel mmap of the memfd, or a faultmap
//!    mapping at fault-around order 0 through a new pager (whose counters
//!    are then this sample's). Untimed.
//! 2. The threads start together and touch their parts ([`crate::timed`]).
//!    Timed.
//! 3. The counts: the pager's counters (faultmap), or the process's minor
//!    faults over the timed run (kernel). The mappings are dropped.
//!
//! Every mapping is new, so every touch faults: faultmap takes exactly one
//! fault per page (order 0); the kernel maps its fault-around window (16
//! pages by default) per fault.

use std::fs::File;
use std::hint::black_box;
use std::ops::Range;

use anyhow::{Context, Result};
use faultmap::{MapOptions, Mapping, Object, Pager, PAGE_SIZE};
use memmap2::{Mmap, MmapOptions};

use super::super::grid::Sample;
use super::{Bench, Column};

/// Measures one sample of `column` with one thread per part.
pub fn measure(bench: &Bench<'_>, column: Column, parts: &[Range<u64>]) -> Result<Sample> {
    let pager = match column {
        Column::KernelMemfd => None,
        Column::Faultmap { .. } => Some(bench.pager(column)?),
    };
    let (kernel, faultmap);
    let slices: Vec<&[u8]> = match &pager {
        None => {
            kernel = kernel_parts(bench, parts)?;
            kernel.iter().map(|v| v.as_deref().unwrap_or(&[])).collect()
        }
        Some(pager) => {
            faultmap = faultmap_parts(bench, pager, parts)?;
            faultmap.iter().map(|v| &**v).collect()
        }
    };
    let timed = crate::timed::run(slices.len(), |i| touch_pages(slices[i]))?;
    let stats = pager.as_ref().map(Pager::stats);
    Ok(Sample {
        seconds: timed.seconds,
        faults: Some(stats.map_or(timed.minor_faults, |s| s.pgfault)),
        major_faults: Some(stats.map_or(timed.major_faults, |s| s.pgmajfault)),
        pages_touched: Some(pages_of(&slices)),
        stats,
        checksum: Some(wrapping_sum(&timed.sums)),
        ..Sample::default()
    })
}

/// One faultmap mapping per part, at order 0, through `pager`.
pub(super) fn faultmap_parts(
    bench: &Bench<'_>,
    pager: &Pager,
    parts: &[Range<u64>],
) -> Result<Vec<Mapping>> {
    parts
        .iter()
        .map(|p| {
            let (offset, len) = bench.bytes_of(p);
            map_faultmap(pager, bench.object, offset, len)
        })
        .collect()
}

/// A faultmap mapping of `len` bytes of `object` at `offset`, order 0.
pub(super) fn map_faultmap(
    pager: &Pager,
    object: &Object,
    offset: u64,
    len: u64,
) -> Result<Mapping> {
    let opts = MapOptions::new()
        .fault_around_order(0)
        .offset(offset)
        .len(len);
    crate::map_readonly(pager, object, opts).context("mapping a part of the data through faultmap")
}

/// One kernel mapping of the memfd per part (`None` for an empty part).
pub(super) fn kernel_parts(bench: &Bench<'_>, parts: &[Range<u64>]) -> Result<Vec<Option<Mmap>>> {
    parts
        .iter()
        .map(|p| {
            let (offset, len) = bench.bytes_of(p);
            map_kernel(bench.memfd, offset, len)
        })
        .collect()
}

/// A kernel mapping of `len` bytes of `memfd` at `offset` (page-aligned);
/// `None` for no bytes.
pub(super) fn map_kernel(memfd: &File, offset: u64, len: u64) -> Result<Option<Mmap>> {
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).context("a part does not fit the address space")?;
    // SAFETY: memmap2 requires that the file is not truncated or modified
    // while mapped: the memfd is the benchmark's own copy of the data, and
    // nothing writes to it once it is filled.
    let map = unsafe { MmapOptions::new().offset(offset).len(len).map(memfd) }
        .context("mmap of the memfd")?;
    Ok(Some(map))
}

/// Reads the first byte of every page of `data`; returns their wrapping
/// sum.
pub(super) fn touch_pages(data: &[u8]) -> u64 {
    let mut sum = 0u64;
    for i in (0..data.len()).step_by(PAGE_SIZE) {
        sum = sum.wrapping_add(u64::from(data[i]));
    }
    black_box(sum)
}

/// The pages of all the slices together.
fn pages_of(slices: &[&[u8]]) -> u64 {
    slices
        .iter()
        .map(|s| s.len().div_ceil(PAGE_SIZE) as u64)
        .sum()
}

/// The wrapping sum of the threads' sums.
fn wrapping_sum(sums: &[u64]) -> u64 {
    sums.iter().fold(0, |a, &b| a.wrapping_add(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touches_the_first_byte_of_every_page() {
        let mut d = vec![0u8; 3 * PAGE_SIZE + 5];
        d[0] = 1;
        d[1] = 100;
        d[PAGE_SIZE] = 2;
        d[2 * PAGE_SIZE] = 3;
        d[3 * PAGE_SIZE] = 4;
        assert_eq!(touch_pages(&d), 10);
        assert_eq!(touch_pages(&[]), 0);
        assert_eq!(pages_of(&[&d, &d[..1], &[]]), 5);
        assert_eq!(wrapping_sum(&[u64::MAX, 2]), 1);
    }
}
