//! The fault-around benchmark's workloads, and the threaded, timed run of one of them.
//!
//! The kernel's fault-around series measured fault-around with three
//! synthetic tests, reproduced here over any byte slice (a kernel mapping or a faultmap mapping alike):
//!
//! ```text
//!   seq     |0123456789...........................................| every word, in order
//!   rand    |  [p7]  [p2]      [p9] [p0] ...                      | every word; pages in a
//!           |                                                     | random permutation,
//!           |                                                     | words of a page in order
//!   sparse  |w               |w               |w               |  | one word per 2 MiB
//!            <---- 2 MiB ---> (one page per page table)
//! ```
//!
//! One more warm workload, `scattered`, sits between rand and sparse, where adaptive
//! fault-around is weakest: [`SCATTERED_PER_TABLE`] random pages of every
//! 2 MiB (every word of each), all the chosen pages in one random order,
//! as random lookups into a large table make.
//!
//! `rand` differs from a fully random word order on purpose: what
//! fault-around sees is the order of *first touches of pages*, which a random
//! page permutation reproduces exactly, while a word-random walk of 1 GiB
//! would spend minutes in cache and TLB misses that say nothing about faults.
//!
//! Every word read is summed (wrapping) and the sum goes through
//! [`std::hint::black_box`], so the compiler cannot drop the reads.
//!
//! # The timed run
//!
//! [`run_timed`] gives each thread its own view (its own mapping, so faults
//! scale with threads) and starts them together
//! ([`crate::timed`]); the walks are all that is timed.
//!
//! `clustered` is a workload of the cold benchmark only (`--cold`, see
//! [`crate::access`]); a warm plan refuses it.

use anyhow::{anyhow, bail, Result};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::SeedableRng;
use serde::Serialize;

use faultmap::PAGE_SIZE;

use crate::access::{sum_words, WORD};

/// `sparse` touches one word per this many bytes: one page per PTE table.
pub const SPARSE_STRIDE: usize = 2 << 20;

/// `scattered` touches this many pages of every 2 MiB page table.
pub const SCATTERED_PER_TABLE: usize = 4;
// `Workload::describe` and the docs say 4.
const _: () = assert!(SCATTERED_PER_TABLE == 4);

/// The seed of the `rand` permutations (thread `i` uses `RAND_SEED + i`), so
/// every run and every engine walks the same pages in the same order.
pub const RAND_SEED: u64 = 0x000f_a017_a40d;

/// A workload of the fault-around benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Every 8-byte word of the file, in order.
    Seq,
    /// Every word; pages in a random permutation, the words of a page in
    /// order.
    Rand,
    /// One word per 2 MiB: only one page per page table.
    Sparse,
    /// 4 random pages of every 2 MiB, every word of each, all in one random
    /// order (the same for every thread): between rand and sparse.
    Scattered,
    /// Cold only: random 64 KiB clusters, the pages of a cluster in order.
    Clustered,
    /// One byte per 4 KiB page, in order: the fault path itself (how UMap
    /// and fault microbenchmarks measure it).
    Pages,
    /// Budget only (--budget): 90% of the touches on a hot set, 10% uniform.
    Hotcold,
    /// Remote only (--remote): rand's sampled pages as 4 KiB rows in
    /// batches of 64, each batch prefetched (faultmap's `prefetch_ranges`)
    /// and then read.
    Batch,
}

impl Workload {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Seq => "seq",
            Workload::Rand => "rand",
            Workload::Sparse => "sparse",
            Workload::Scattered => "scattered",
            Workload::Clustered => "clustered",
            Workload::Pages => "pages",
            Workload::Hotcold => "hotcold",
            Workload::Batch => "batch",
        }
    }

    /// A one-line description for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Workload::Seq => "sequential access: every 8-byte word in order",
            Workload::Rand => {
                "random access: every word, pages in a random permutation, \
                 words of a page in order"
            }
            Workload::Sparse => "touch only one page per page table (one word per 2 MiB)",
            Workload::Scattered => {
                "scattered access: 4 random pages of every page table (2 MiB), \
                 every word of each, all in one random order"
            }
            Workload::Clustered => {
                "clustered random access: random 64 KiB clusters, \
                 the pages of a cluster in order"
            }
            Workload::Pages => "the fault path: one byte per 4 KiB page, in order",
            Workload::Hotcold => "90% of the touches on a hot set, 10% uniform",
            Workload::Batch => "batches of 64 random 4 KiB rows, each prefetched and then read",
        }
    }

    /// The benchmark a workload the warm one does not run belongs to (its
    /// flag without `--`): `cold` for `clustered`, `budget` for `hotcold`,
    /// `remote` for `batch`; `None` for the warm workloads.
    pub fn only_in(self) -> Option<&'static str> {
        match self {
            Workload::Clustered => Some("cold"),
            Workload::Hotcold => Some("budget"),
            Workload::Batch => Some("remote"),
            Workload::Seq
            | Workload::Rand
            | Workload::Sparse
            | Workload::Scattered
            | Workload::Pages => None,
        }
    }
}

/// A workload bound to its inputs: the random permutations are made here,
/// once, outside every timed region.
#[derive(Debug)]
pub struct Plan {
    workload: Workload,
    /// For `rand`: one page permutation per thread; for `scattered`: its
    /// pages in their order, the same for every thread.
    perms: Vec<Vec<u32>>,
}

impl Plan {
    /// A plan for up to `threads` threads over `len` bytes.
    pub fn new(workload: Workload, len: usize, threads: usize) -> Result<Plan> {
        let perms = match workload {
            Workload::Rand => (0..threads)
                .map(|t| permutation(len.div_ceil(PAGE_SIZE), RAND_SEED + t as u64))
                .collect::<Result<_>>()?,
            // The same pages for every thread: the threads must read the
            // same bytes (the run checks their sums).
            Workload::Scattered => {
                let pages = scattered(len.div_ceil(PAGE_SIZE), RAND_SEED)?;
                vec![pages; threads]
            }
            Workload::Seq | Workload::Sparse | Workload::Pages => Vec::new(),
            Workload::Clustered | Workload::Hotcold | Workload::Batch => bail!(
                "{} is a workload of the {1} benchmark (--{1})",
                workload.name(),
                workload.only_in().unwrap_or("warm")
            ),
        };
        Ok(Plan { workload, perms })
    }

    /// The workload.
    pub fn workload(&self) -> Workload {
        self.workload
    }

    /// How many threads this plan has inputs for.
    pub fn max_threads(&self) -> usize {
        match self.workload {
            Workload::Rand | Workload::Scattered => self.perms.len(),
            Workload::Seq | Workload::Sparse | Workload::Pages => usize::MAX,
            Workload::Clustered | Workload::Hotcold | Workload::Batch => 0,
        }
    }

    /// What thread `thread` does over `data`; returns the sum of what it read.
    pub fn walk(&self, thread: usize, data: &[u8]) -> u64 {
        match self.workload {
            Workload::Seq => sum_words(data),
            Workload::Rand | Workload::Scattered => walk_pages(data, &self.perms[thread]),
            Workload::Sparse => walk_sparse(data),
            Workload::Pages => walk_page_bytes(data),
            Workload::Clustered | Workload::Hotcold | Workload::Batch => 0,
        }
    }
}

/// A permutation of `0..pages`, from `seed`.
fn permutation(pages: usize, seed: u64) -> Result<Vec<u32>> {
    let pages = u32::try_from(pages)
        .map_err(|_| anyhow!("the rand workload supports files of up to 2^32 pages (16 TiB)"))?;
    let mut perm: Vec<u32> = (0..pages).collect();
    perm.shuffle(&mut StdRng::seed_from_u64(seed));
    Ok(perm)
}

/// [`SCATTERED_PER_TABLE`] distinct pages of every 2 MiB of `0..pages`
/// (all of a shorter last one's, up to that many), all in one random
/// order, from `seed`.
fn scattered(pages: usize, seed: u64) -> Result<Vec<u32>> {
    let total = u32::try_from(pages).map_err(|_| {
        anyhow!("the scattered workload supports files of up to 2^32 pages (16 TiB)")
    })?;
    let per_table = (SPARSE_STRIDE / PAGE_SIZE) as u32;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut chosen = Vec::new();
    for table in (0..total).step_by(per_table as usize) {
        let in_table: Vec<u32> = (table..total.min(table + per_table)).collect();
        chosen.extend(
            in_table
                .choose_multiple(&mut rng, SCATTERED_PER_TABLE)
                .copied(),
        );
    }
    chosen.shuffle(&mut rng);
    Ok(chosen)
}

/// Every word of every page, pages in `perm`'s order.
fn walk_pages(data: &[u8], perm: &[u32]) -> u64 {
    let mut sum = 0u64;
    for &page in perm {
        let start = page as usize * PAGE_SIZE;
        let end = (start + PAGE_SIZE).min(data.len());
        if let Some(bytes) = data.get(start..end) {
            sum = sum.wrapping_add(sum_words(bytes));
        }
    }
    sum
}

/// One word per [`SPARSE_STRIDE`] bytes.
fn walk_sparse(data: &[u8]) -> u64 {
    let mut sum = 0u64;
    for start in (0..data.len()).step_by(SPARSE_STRIDE) {
        let end = (start + WORD).min(data.len());
        sum = sum.wrapping_add(sum_words(&data[start..end]));
    }
    sum
}

/// The first byte of every 4 KiB page, in order.
fn walk_page_bytes(data: &[u8]) -> u64 {
    let mut sum = 0u64;
    for start in (0..data.len()).step_by(PAGE_SIZE) {
        sum = sum.wrapping_add(u64::from(std::hint::black_box(data[start])));
    }
    sum
}

/// What a timed run measured.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    /// Wall time from the threads' common start to the last one's end.
    pub seconds: f64,
    /// Minor faults of the whole process over that time (`getrusage`).
    pub minor_faults: u64,
    /// Major faults of the whole process over that time.
    pub major_faults: u64,
    /// The wrapping sum of the words a thread read (all threads read the
    /// same words, so they agree).
    pub checksum: u64,
}

/// Runs `plan` with one thread per view (thread `i` walks `views[i]`), all
/// started together; see the module documentation for what is timed.
pub fn run_timed(plan: &Plan, views: &[&[u8]]) -> Result<Timed> {
    run_timed_on(plan, views, None)
}

/// [`run_timed`] with thread `i` pinned to CPU `cpus[i]` during its walk
/// ([`crate::timed::run_pinned`]); one CPU per view.
pub fn run_timed_pinned(plan: &Plan, views: &[&[u8]], cpus: &[usize]) -> Result<Timed> {
    if cpus.len() != views.len() {
        bail!(
            "{} views but {} CPUs to pin them to",
            views.len(),
            cpus.len()
        );
    }
    run_timed_on(plan, views, Some(cpus))
}

fn run_timed_on(plan: &Plan, views: &[&[u8]], cpus: Option<&[usize]>) -> Result<Timed> {
    let n = views.len();
    if n > plan.max_threads() {
        return Err(anyhow!(
            "plan made for {} threads, run with {n}",
            plan.max_threads()
        ));
    }
    let walk = |i| plan.walk(i, views[i]);
    let timed = match cpus {
        None => crate::timed::run(n, walk)?,
        Some(cpus) => crate::timed::run_pinned(cpus, walk)?,
    };
    let checksum = timed.sums.first().copied().unwrap_or(0);
    if timed.sums.iter().any(|&s| s != checksum) {
        return Err(anyhow!(
            "the threads read different bytes (sums {:x?})",
            timed.sums
        ));
    }
    Ok(Timed {
        seconds: timed.seconds,
        minor_faults: timed.minor_faults,
        major_faults: timed.major_faults,
        checksum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 + 1).collect()
    }

    #[test]
    fn seq_and_rand_read_every_byte_once() {
        for len in [0, 1, 7, 8, 4095, 4096, 3 * 4096 + 13] {
            let d = data(len);
            let seq = Plan::new(Workload::Seq, len, 1).unwrap();
            let rand = Plan::new(Workload::Rand, len, 2).unwrap();
            assert_eq!(seq.walk(0, &d), rand.walk(0, &d), "len {len}");
            assert_eq!(seq.walk(0, &d), rand.walk(1, &d), "len {len}");
        }
    }

    #[test]
    fn rand_visits_every_page_once() {
        let perm = permutation(1000, 7).unwrap();
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(perm, sorted);
    }

    #[test]
    fn scattered_takes_a_few_distinct_pages_of_every_table() {
        let per_table = SPARSE_STRIDE / PAGE_SIZE;
        // Two whole tables and a last one of 2 pages.
        let pages = 2 * per_table + 2;
        let perm = scattered(pages, 7).unwrap();
        let mut per = vec![std::collections::BTreeSet::new(); 3];
        for &p in &perm {
            per[p as usize / per_table].insert(p);
        }
        assert_eq!(per[0].len(), SCATTERED_PER_TABLE);
        assert_eq!(per[1].len(), SCATTERED_PER_TABLE);
        assert_eq!(per[2].len(), 2, "the short last table's every page");
        assert_eq!(perm.len(), 2 * SCATTERED_PER_TABLE + 2, "each page once");
        assert_eq!(scattered(pages, 7).unwrap(), perm, "fixed by the seed");
        // Not table after table: the order is random over all of them.
        let tables: Vec<usize> = perm.iter().map(|&p| p as usize / per_table).collect();
        let mut sorted = tables.clone();
        sorted.sort_unstable();
        assert_ne!(tables, sorted);
        let d = data(pages * PAGE_SIZE);
        let plan = Plan::new(Workload::Scattered, d.len(), 2).unwrap();
        assert_eq!(plan.max_threads(), 2);
        let first = scattered(pages, RAND_SEED).unwrap();
        assert_eq!(plan.walk(0, &d), walk_pages(&d, &first));
    }

    #[test]
    fn sparse_reads_one_word_per_stride() {
        let mut d = vec![0u8; 3 * SPARSE_STRIDE + 4];
        d[0] = 1;
        d[SPARSE_STRIDE] = 2;
        d[2 * SPARSE_STRIDE] = 3;
        d[3 * SPARSE_STRIDE] = 4;
        d[1] = 0;
        d[SPARSE_STRIDE + 4096] = 100;
        let plan = Plan::new(Workload::Sparse, d.len(), 1).unwrap();
        assert_eq!(plan.walk(0, &d), 10);
    }

    #[test]
    fn pages_reads_the_first_byte_of_each_page() {
        let mut d = vec![0u8; 3 * PAGE_SIZE + 1];
        d[0] = 1;
        d[PAGE_SIZE] = 2;
        d[3 * PAGE_SIZE] = 4;
        d[5] = 100;
        let plan = Plan::new(Workload::Pages, d.len(), 1).unwrap();
        assert_eq!(plan.walk(0, &d), 7);
        assert_eq!(Workload::Pages.only_in(), None);
    }

    #[test]
    fn timed_run_walks_every_view() {
        let d = data(1 << 16);
        let plan = Plan::new(Workload::Rand, d.len(), 2).unwrap();
        let timed = run_timed(&plan, &[&d, &d]).unwrap();
        assert!(timed.seconds >= 0.0);
        assert!(run_timed(&plan, &[&d, &d, &d]).is_err());
    }

    #[test]
    fn warm_plans_refuse_clustered() {
        assert!(Plan::new(Workload::Clustered, 4096, 1).is_err());
        assert_eq!(Workload::Clustered.only_in(), Some("cold"));
        assert_eq!(Workload::Sparse.only_in(), None);
        assert!(Plan::new(Workload::Hotcold, 4096, 1).is_err());
        assert_eq!(Workload::Hotcold.only_in(), Some("budget"));
    }
}
