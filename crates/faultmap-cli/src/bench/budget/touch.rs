//! The budget benchmark's workloads, the walk that runs them, and the RSS
//! sampler: shared by both engines (faultmap in this process, kernel-file
//! in the child under a cgroup), so that both touch the same pages in the
//! same order.
//!
//! A workload is a list of page indices, made before the walk from a fixed
//! seed (untimed); the walk reads one byte of each listed page.
//!
//! | workload  | touches                 | pages                                   |
//! |-----------|-------------------------|-----------------------------------------|
//! | `seq`     | 2 × the object's pages  | every page in order, twice              |
//! | `rand`    | the object's pages      | uniformly random                        |
//! | `hotcold` | the object's pages      | 90%: a hot set of 10% of the budget (a  |
//! |           |                         | contiguous run at a random offset); 10%: uniformly random |

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use faultmap::PAGE_SIZE;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The seed of the workloads' page lists.
const PLAN_SEED: u64 = 0xb0d9_e700;

/// How often the RSS sampler reads `/proc/self/status`.
const RSS_PERIOD: Duration = Duration::from_millis(5);

/// A workload of `faultmap bench --budget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetWorkload {
    /// Every page in order, twice.
    Seq,
    /// Uniformly random pages.
    Rand,
    /// 90% of the touches on a hot set of 10% of the budget, 10% uniform.
    Hotcold,
}

impl BudgetWorkload {
    /// Every workload, in report order.
    pub const ALL: [BudgetWorkload; 3] = [
        BudgetWorkload::Seq,
        BudgetWorkload::Rand,
        BudgetWorkload::Hotcold,
    ];

    /// The name on the command line, in the table and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            BudgetWorkload::Seq => "seq",
            BudgetWorkload::Rand => "rand",
            BudgetWorkload::Hotcold => "hotcold",
        }
    }
}

/// The hot set of `hotcold`: 10% of the budget's pages, at least one, at
/// most the object.
pub fn hot_pages(pages: u64, budget_pages: u64) -> u64 {
    (budget_pages / 10).clamp(1, pages.max(1))
}

/// Touches of the random workloads: at most this many (a miss under a
/// budget costs a read-around window, milliseconds on a disk; the kernel's
/// the same), so that a run on a 1 GiB object ends in minutes.
pub const RANDOM_TOUCHES: u32 = 8192;

/// The pages `workload` touches, in order, on an object of `pages` pages
/// under a budget of `budget_pages`: `seq` every page twice; `rand` and
/// `hotcold` one touch per page, at most [`RANDOM_TOUCHES`].
pub fn plan(workload: BudgetWorkload, pages: u64, budget_pages: u64) -> Vec<u32> {
    let pages = u32::try_from(pages).unwrap_or(u32::MAX);
    if pages == 0 {
        return Vec::new();
    }
    let touches = pages.min(RANDOM_TOUCHES);
    let mut rng = StdRng::seed_from_u64(PLAN_SEED);
    match workload {
        BudgetWorkload::Seq => (0..pages).chain(0..pages).collect(),
        BudgetWorkload::Rand => (0..touches).map(|_| rng.random_range(0..pages)).collect(),
        BudgetWorkload::Hotcold => {
            let hot = u32::try_from(hot_pages(u64::from(pages), budget_pages)).unwrap_or(pages);
            let start = rng.random_range(0..=pages - hot);
            (0..touches)
                .map(|_| {
                    if rng.random_range(0..10) < 9 {
                        start + rng.random_range(0..hot)
                    } else {
                        rng.random_range(0..pages)
                    }
                })
                .collect()
        }
    }
}

/// Reads the first byte of every page of `plan` in `view` (which must cover
/// them); returns the bytes' sum, the walk's checksum.
pub fn walk(view: &[u8], plan: &[u32]) -> u64 {
    let mut sum = 0u64;
    for &page in plan {
        let byte = view[page as usize * PAGE_SIZE];
        sum = sum.wrapping_add(u64::from(black_box(byte)));
    }
    sum
}

/// The process's file-backed, shmem and hugetlb resident bytes (`RssFile`
/// + `RssShmem` + `HugetlbPages` of `/proc/self/status`).
pub fn rss_file_shmem() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let mut total = 0;
    let mut found = false;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if key == "RssFile" || key == "RssShmem" || key == "HugetlbPages" {
            let kib: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
            total += kib * 1024;
            found = true;
        }
    }
    found.then_some(total)
}

/// A thread sampling [`rss_file_shmem`] every 5 ms, keeping the maximum.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl RssSampler {
    /// Starts sampling (if the thread cannot start, the peak is 0).
    pub fn start() -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("faultmap-rss".into())
            .spawn(move || {
                let mut peak = 0;
                loop {
                    peak = peak.max(rss_file_shmem().unwrap_or(0));
                    if flag.load(Ordering::Relaxed) {
                        return peak;
                    }
                    std::thread::sleep(RSS_PERIOD);
                }
            })
            .ok();
        RssSampler { stop, thread }
    }

    /// Stops sampling; the largest sample, in bytes (one last sample
    /// included).
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_have_the_touches_and_pages_asked() {
        let seq = plan(BudgetWorkload::Seq, 100, 40);
        assert_eq!(seq.len(), 200);
        assert_eq!(&seq[..3], &[0, 1, 2]);
        assert_eq!(seq[100], 0);
        let rand = plan(BudgetWorkload::Rand, 100, 40);
        assert_eq!(rand.len(), 100);
        assert!(rand.iter().all(|&p| p < 100));
        assert_eq!(rand, plan(BudgetWorkload::Rand, 100, 40), "fixed seed");
        let hc = plan(BudgetWorkload::Hotcold, 10_000, 1_000);
        assert_eq!(hc.len(), RANDOM_TOUCHES as usize, "capped");
        assert!(hc.iter().all(|&p| p < 10_000));
        // 90% of the touches (and a few cold ones) fall in a run of 100 pages.
        let lo = *hc.iter().min().unwrap();
        let mut counts = std::collections::HashMap::new();
        for &p in &hc {
            *counts.entry(p / 100).or_insert(0u32) += 1;
        }
        let top: u32 = {
            let mut c: Vec<u32> = counts.values().copied().collect();
            c.sort_unstable_by(|a, b| b.cmp(a));
            c.iter().take(2).sum()
        };
        assert!(
            top >= 8_900 * RANDOM_TOUCHES / 10_000,
            "hot touches: {top} (lowest page {lo})"
        );
        assert_eq!(hot_pages(10, 1_000), 10);
        assert_eq!(hot_pages(10, 5), 1);
    }

    #[test]
    fn walks_sum_the_first_bytes() {
        let mut view = vec![0u8; 3 * PAGE_SIZE];
        view[0] = 1;
        view[PAGE_SIZE] = 2;
        view[2 * PAGE_SIZE] = 3;
        assert_eq!(walk(&view, &[0, 2, 2, 1]), 9);
    }

    #[test]
    fn reads_its_own_rss() {
        assert!(rss_file_shmem().is_some());
        assert!(RssSampler::start().finish() > 0);
    }
}
