//! The access patterns of `faultmap stats` and of the cold benchmark
//! (`faultmap bench --cold`): which pages of a mapping each thread touches,
//! and in which order.
//!
//! The object's pages are cut into `T` contiguous parts, one per thread, on
//! cluster (64 KiB) boundaries; each thread applies the pattern to its own
//! part, so the threads together read the object once:
//!
//! ```text
//!   seq        |0123456789.........................| every 8-byte word of the part, in order
//!   rand       |  p7   p2        p9 p0 ...         | the first word of each page, pages in a
//!              |                                   | random order
//!   clustered  |[c3 ............][c0 ............] | 64 KiB clusters (16 pages, aligned) in a
//!              |  <-- 16 pages -->                 | random order; the first word of each
//!              |                                   | page of a cluster, in order
//! ```
//!
//! `seq` reads every word, like a real sequential reader, and its sum checks
//! every byte. `rand` and `clustered` read one word per page: a cold random
//! access is its fault and its read, not arithmetic.
//!
//! How much is touched ([`Coverage`]): `All` touches every page of every part
//! (`faultmap stats`); `Sample(n)` touches a fixed-seed random sample of
//! about `n` pages of the object (the cold benchmark, whose random reads
//! cost about 100 µs each): `rand` takes `n` distinct pages, `clustered`
//! `n / 16` distinct clusters, both spread over the parts in proportion to
//! their size; `seq` ignores the sample and reads all of its part.
//!
//! The orders come from [`ACCESS_SEED`] (plus the thread's index), so every
//! run and every engine touches the same pages in the same order.

use std::ops::Range;

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;

use faultmap::PAGE_SIZE;

/// Bytes per word: the unit the patterns read.
pub const WORD: usize = 8;

/// Pages per cluster of the `clustered` pattern: 64 KiB.
pub const CLUSTER_PAGES: u64 = 16;

/// Rows per batch of the `batch` pattern.
pub const BATCH_ROWS: usize = 64;

/// The seed of the random orders (thread `i` uses `ACCESS_SEED + i`).
pub const ACCESS_SEED: u64 = 0x5eed_0001;

/// An access pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Every word, in order.
    Seq,
    /// The first word of each page, pages in a random order.
    Rand,
    /// Random 64 KiB clusters, the pages of a cluster in order.
    Clustered,
    /// `rand`'s pages as 4 KiB rows in batches of [`BATCH_ROWS`]: each
    /// batch is prefetched (where the engine can) and then read.
    Batch,
}

impl Access {
    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Access::Seq => "seq",
            Access::Rand => "rand",
            Access::Clustered => "clustered",
            Access::Batch => "batch",
        }
    }
}

/// How many pages a plan touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Every page.
    All,
    /// A fixed-seed sample of about this many pages (not for `seq`).
    Sample(u64),
}

/// One thread's share of a plan.
#[derive(Debug)]
struct Part {
    /// The part's pages in the mapping.
    pages: Range<u64>,
    /// `rand`: pages, `clustered`: clusters, numbered from the part's
    /// start, in visiting order. Empty for `seq`.
    order: Vec<u32>,
}

/// A pattern bound to a mapping's length and a thread count: the random
/// orders are drawn here, once, outside every timed region.
#[derive(Debug)]
pub struct AccessPlan {
    access: Access,
    len: usize,
    parts: Vec<Part>,
}

impl AccessPlan {
    /// A plan of `access` over `len` bytes for `threads` threads.
    pub fn new(access: Access, len: usize, threads: usize, coverage: Coverage) -> Result<Self> {
        let pages = len.div_ceil(PAGE_SIZE) as u64;
        let parts = split(pages, threads.max(1))
            .into_iter()
            .enumerate()
            .map(|(i, range)| {
                let wanted = wanted_units(access, coverage, &range, pages);
                let order = draw(wanted, ACCESS_SEED + i as u64)?;
                Ok(Part {
                    pages: range,
                    order,
                })
            })
            .collect::<Result<_>>()?;
        Ok(AccessPlan { access, len, parts })
    }

    /// How many threads the plan is for.
    pub fn threads(&self) -> usize {
        self.parts.len()
    }

    /// Pages the threads touch, all together.
    pub fn pages_touched(&self) -> u64 {
        self.parts.iter().map(|p| self.part_pages(p)).sum()
    }

    /// What thread `thread` does over `data` (the mapping the plan was made
    /// for); returns the wrapping sum of the words it read. `batch` reads
    /// its rows one by one, as an engine without a batched prefetch does.
    pub fn walk(&self, thread: usize, data: &[u8]) -> u64 {
        self.walk_batched(thread, data, &mut |_| Ok(()))
            .unwrap_or_default()
    }

    /// [`AccessPlan::walk`], where `batch` calls `prefetch` with each
    /// batch's rows (byte ranges of `data`) before it reads them. A
    /// prefetch's error ends the walk.
    pub fn walk_batched(
        &self,
        thread: usize,
        data: &[u8],
        prefetch: &mut dyn FnMut(&[Range<u64>]) -> Result<()>,
    ) -> Result<u64> {
        let Some(part) = self.parts.get(thread) else {
            return Ok(0);
        };
        let data = &data[..self.len.min(data.len())];
        if self.access == Access::Batch {
            let pages: Vec<u64> = self.touched(part).collect();
            let mut sum = 0u64;
            for batch in pages.chunks(BATCH_ROWS) {
                let rows: Vec<Range<u64>> = batch
                    .iter()
                    .map(|&p| {
                        let start = byte(p, data.len()) as u64;
                        start..byte(p + 1, data.len()) as u64
                    })
                    .collect();
                prefetch(&rows)?;
                sum = batch
                    .iter()
                    .fold(sum, |s, &p| s.wrapping_add(first_word(data, p)));
            }
            return Ok(sum);
        }
        Ok(self.walk_part(part, data))
    }

    /// [`AccessPlan::walk_batched`] over a faultmap mapping: each batch
    /// prefetched at once (`Mapping::prefetch_ranges`) and waited for. The
    /// first failure is kept in `failed` (the walk returns 0 then).
    pub fn walk_mapping<A: faultmap::Access>(
        &self,
        thread: usize,
        map: &faultmap::Mapping<A>,
        failed: &std::sync::Mutex<Option<anyhow::Error>>,
    ) -> u64 {
        let mut prefetch = |rows: &[Range<u64>]| -> Result<()> {
            map.prefetch_ranges(rows)?;
            map.wait_ranges(rows)?;
            Ok(())
        };
        match self.walk_batched(thread, map, &mut prefetch) {
            Ok(sum) => sum,
            Err(e) => {
                let mut slot = failed.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(e);
                0
            }
        }
    }

    fn walk_part(&self, part: &Part, data: &[u8]) -> u64 {
        match self.access {
            Access::Seq => {
                let start = byte(part.pages.start, data.len());
                let end = byte(part.pages.end, data.len());
                sum_words(&data[start..end])
            }
            Access::Rand | Access::Clustered | Access::Batch => self
                .touched(part)
                .fold(0u64, |sum, page| sum.wrapping_add(first_word(data, page))),
        }
    }

    /// The pages a part touches, in order (`rand`, `clustered`).
    fn touched<'a>(&self, part: &'a Part) -> impl Iterator<Item = u64> + 'a {
        let unit = self.unit();
        part.order.iter().flat_map(move |&u| {
            let start = part.pages.start + u64::from(u) * unit;
            start..(start + unit).min(part.pages.end)
        })
    }

    /// Pages a part touches.
    fn part_pages(&self, part: &Part) -> u64 {
        match self.access {
            Access::Seq => part.pages.end - part.pages.start,
            Access::Rand | Access::Clustered | Access::Batch => self.touched(part).count() as u64,
        }
    }

    /// Pages per unit of the order.
    fn unit(&self) -> u64 {
        unit(self.access)
    }
}

/// Pages per unit of a pattern's order.
fn unit(access: Access) -> u64 {
    match access {
        Access::Seq | Access::Rand | Access::Batch => 1,
        Access::Clustered => CLUSTER_PAGES,
    }
}

/// How many units (pages or clusters) of `part` to visit, out of how many:
/// `(wanted, available)`.
fn wanted_units(access: Access, coverage: Coverage, part: &Range<u64>, pages: u64) -> (u64, u64) {
    if access == Access::Seq {
        return (0, 0);
    }
    let size = part.end - part.start;
    let available = size.div_ceil(unit(access));
    let wanted = match coverage {
        Coverage::All => available,
        // The part's share of the sample, in units, at least one.
        Coverage::Sample(n) => {
            let share = (u128::from(n) * u128::from(size)).div_ceil(u128::from(pages.max(1)));
            let share = u64::try_from(share).unwrap_or(u64::MAX);
            share.div_ceil(unit(access)).max(1)
        }
    };
    (wanted.min(available), available)
}

/// `wanted` distinct numbers of `0..available`, in a random order from
/// `seed`.
fn draw((wanted, available): (u64, u64), seed: u64) -> Result<Vec<u32>> {
    if u32::try_from(available).is_err() {
        bail!("the random patterns support parts of up to 2^32 pages (16 TiB)");
    }
    // Both fit in u32, hence in usize.
    let (wanted, available) = (wanted as usize, available as usize);
    let mut rng = StdRng::seed_from_u64(seed);
    let picked = rand::seq::index::sample(&mut rng, available, wanted);
    Ok(picked.into_iter().map(|i| i as u32).collect())
}

/// Cuts `0..pages` into `parts` contiguous ranges on cluster boundaries
/// (trailing ranges may be empty when there are few clusters).
pub fn split(pages: u64, parts: usize) -> Vec<Range<u64>> {
    let parts = parts.max(1) as u64;
    let per_part = pages.div_ceil(CLUSTER_PAGES).div_ceil(parts) * CLUSTER_PAGES;
    (0..parts)
        .map(|i| (i * per_part).min(pages)..((i + 1) * per_part).min(pages))
        .collect()
}

/// The byte offset of `page`, at most `len`.
fn byte(page: u64, len: usize) -> usize {
    usize::try_from(page)
        .ok()
        .and_then(|p| p.checked_mul(PAGE_SIZE))
        .map_or(len, |b| b.min(len))
}

/// The first word of `page` (or its bytes, at the end of the data).
fn first_word(data: &[u8], page: u64) -> u64 {
    let start = byte(page, data.len());
    sum_words(&data[start..(start + WORD).min(data.len())])
}

/// The wrapping sum of the native-endian words of `bytes` (and of the bytes
/// of a last partial word).
pub fn sum_words(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(WORD);
    let mut sum = 0u64;
    for w in &mut words {
        let mut word = [0u8; WORD];
        word.copy_from_slice(w);
        sum = sum.wrapping_add(u64::from_ne_bytes(word));
    }
    for &b in words.remainder() {
        sum = sum.wrapping_add(u64::from(b));
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page's first word is its page number + 1; other bytes are 0.
    fn numbered(pages: usize, tail: usize) -> Vec<u8> {
        let mut d = vec![0u8; pages * PAGE_SIZE + tail];
        for p in 0..pages + usize::from(tail > 0) {
            let at = p * PAGE_SIZE;
            let end = (at + WORD).min(d.len());
            let bytes = (p as u64 + 1).to_ne_bytes();
            d[at..end].copy_from_slice(&bytes[..end - at]);
        }
        d
    }

    fn all_pages(plan: &AccessPlan) -> Vec<u64> {
        let mut pages: Vec<u64> = plan.parts.iter().flat_map(|p| plan.touched(p)).collect();
        pages.sort_unstable();
        pages
    }

    #[test]
    fn split_covers_every_page_on_cluster_boundaries() {
        for (pages, parts) in [(0, 2), (1, 3), (100, 2), (4096, 3), (17, 8)] {
            let r = split(pages, parts);
            assert_eq!(r.len(), parts);
            assert_eq!(r[0].start, 0);
            assert_eq!(r[parts - 1].end, pages);
            for w in r.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].end % CLUSTER_PAGES == 0 || w[0].end == pages);
            }
        }
    }

    #[test]
    fn full_coverage_touches_every_page_once() {
        let len = 100 * PAGE_SIZE + 5;
        for access in [Access::Rand, Access::Clustered] {
            for threads in [1, 2, 3] {
                let plan = AccessPlan::new(access, len, threads, Coverage::All).unwrap();
                assert_eq!(all_pages(&plan), (0..101).collect::<Vec<_>>());
                assert_eq!(plan.pages_touched(), 101);
            }
        }
        let seq = AccessPlan::new(Access::Seq, len, 2, Coverage::Sample(3)).unwrap();
        assert_eq!(seq.pages_touched(), 101);
    }

    #[test]
    fn walks_read_what_they_touch() {
        let d = numbered(40, 3);
        let len = d.len();
        // Seq: every byte; the parts' sums add up to the whole.
        let whole = sum_words(&d);
        let seq = AccessPlan::new(Access::Seq, len, 3, Coverage::All).unwrap();
        let parts = (0..3).fold(0u64, |s, t| s.wrapping_add(seq.walk(t, &d)));
        assert_eq!(parts, whole);
        // Rand and clustered, every page: 1 + 2 + ... + 41.
        for access in [Access::Rand, Access::Clustered] {
            let plan = AccessPlan::new(access, len, 2, Coverage::All).unwrap();
            let sum = (0..2).fold(0u64, |s, t| s.wrapping_add(plan.walk(t, &d)));
            assert_eq!(sum, (1..=41).sum::<u64>(), "{access:?}");
        }
        assert_eq!(seq.walk(7, &d), 0);
    }

    #[test]
    fn clusters_are_read_in_order_and_randomly_placed() {
        let plan =
            AccessPlan::new(Access::Clustered, 64 * 16 * PAGE_SIZE, 1, Coverage::All).unwrap();
        let pages: Vec<u64> = plan.touched(&plan.parts[0]).collect();
        for cluster in pages.chunks(16) {
            assert_eq!(cluster[0] % 16, 0);
            assert!(cluster.windows(2).all(|w| w[1] == w[0] + 1));
        }
        let starts: Vec<u64> = pages.chunks(16).map(|c| c[0]).collect();
        assert!(starts.windows(2).any(|w| w[1] < w[0]), "not shuffled");
    }

    #[test]
    fn samples_are_distinct_fixed_and_sized() {
        let len = 4096 * PAGE_SIZE;
        let a = AccessPlan::new(Access::Rand, len, 1, Coverage::Sample(256)).unwrap();
        let b = AccessPlan::new(Access::Rand, len, 1, Coverage::Sample(256)).unwrap();
        assert_eq!(a.parts[0].order, b.parts[0].order);
        assert_eq!(a.pages_touched(), 256);
        let mut pages = all_pages(&a);
        pages.dedup();
        assert_eq!(pages.len(), 256);
        let c = AccessPlan::new(Access::Clustered, len, 2, Coverage::Sample(256)).unwrap();
        assert_eq!(c.pages_touched(), 256);
        assert_eq!(c.parts[0].order.len(), 8);
        // A sample larger than the object is the whole object.
        let d = AccessPlan::new(Access::Rand, 10 * PAGE_SIZE, 1, Coverage::Sample(99)).unwrap();
        assert_eq!(d.pages_touched(), 10);
    }

    #[test]
    fn batches_are_rands_pages_in_rows_of_64_each_prefetched_first() {
        let d = numbered(1000, 0);
        let coverage = Coverage::Sample(150);
        let rand = AccessPlan::new(Access::Rand, d.len(), 1, coverage).unwrap();
        let batch = AccessPlan::new(Access::Batch, d.len(), 1, coverage).unwrap();
        assert_eq!(all_pages(&rand), all_pages(&batch));
        let mut rows = Vec::new();
        let sum = batch
            .walk_batched(0, &d, &mut |b| {
                rows.push(b.to_vec());
                Ok(())
            })
            .unwrap();
        assert_eq!(sum, rand.walk(0, &d));
        let sizes: Vec<usize> = rows.iter().map(Vec::len).collect();
        assert_eq!(sizes, [64, 64, 22]);
        let mut pages: Vec<u64> = rows
            .iter()
            .flatten()
            .map(|r| r.start / PAGE_SIZE as u64)
            .collect();
        pages.sort_unstable();
        assert_eq!(pages, all_pages(&rand));
        assert!(rows
            .iter()
            .flatten()
            .all(|r| r.end - r.start == PAGE_SIZE as u64));
        // A failed prefetch ends the walk.
        let failed = batch.walk_batched(0, &d, &mut |_| anyhow::bail!("no"));
        assert!(failed.is_err());
    }

    #[test]
    fn an_empty_object_has_nothing_to_touch() {
        for access in [Access::Seq, Access::Rand, Access::Clustered] {
            let plan = AccessPlan::new(access, 0, 2, Coverage::All).unwrap();
            assert_eq!(plan.pages_touched(), 0);
            assert_eq!(plan.walk(0, &[]), 0);
            assert_eq!(plan.threads(), 2);
        }
    }
}
