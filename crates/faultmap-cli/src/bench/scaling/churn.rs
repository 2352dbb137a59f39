//! One `churn` sample (the speculative fault benchmark, like ebizzy): T threads fault on their own
//! mappings while one more thread maps and unmaps other regions.
//!
//! ```text
//!   faulting thread i   |touch touch ... touch|DONTNEED|touch touch ...|  until the deadline
//!                        one byte per page of its part, order 0
//!   churn thread        |map|unmap oldest|map|unmap oldest|...          |  until they are done
//!                        CHURN_PAGES-page regions, CHURN_LIVE kept mapped
//! ```
//!
//! 1. Map each faulting thread's part (a kernel mmap of the memfd, or a
//!    faultmap mapping at order 0 through a new pager, whose counters are
//!    then this sample's). Untimed.
//! 2. The T + 1 threads start together ([`crate::timed`]). Each faulting
//!    thread touches one byte per page of its part, checking the clock
//!    every [`CHECK_PAGES`] pages, and drops its page tables
//!    (`MADV_DONTNEED`; faultmap: `Advice::DontNeed`, which keeps the pages
//!    cached) after each whole pass; at the deadline it stops. The churn
//!    thread maps a region, unmaps the oldest once it holds more than
//!    [`CHURN_LIVE`], and goes on until the faulting threads are done.
//!    Timed: from the common start to the last thread's end.
//! 3. The counts: pages touched (every touch after a fresh mapping or a
//!    DONTNEED faults, so faultmap's `pgfault` equals them exactly), the
//!    churn thread's maps, and the pager's counters (faultmap) or the
//!    process's minor faults (kernel).

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use faultmap::{Advice, Mapping, Stats, PAGE_SIZE};
use memmap2::{Mmap, UncheckedAdvice};

use super::super::grid::Sample;
use super::parts::{faultmap_parts, kernel_parts, map_faultmap, map_kernel};
use super::{Bench, Column};

/// Pages of each region the churn thread maps (64 KiB).
pub const CHURN_PAGES: u64 = 16;

/// Regions the churn thread keeps mapped: each map is followed by the unmap
/// of the oldest, so the region table holds this many more regions.
pub const CHURN_LIVE: usize = 16;

/// A faulting thread reads the clock every this many pages.
const CHECK_PAGES: usize = 64;

/// Measures one sample of `column`: one faulting thread per part, and the
/// churn thread.
pub fn measure(
    bench: &Bench<'_>,
    column: Column,
    parts: &[std::ops::Range<u64>],
) -> Result<Sample> {
    let region = |i: u64| churn_region(bench.len, i);
    match column {
        Column::KernelMemfd => {
            let views: Vec<KernelView> = kernel_parts(bench, parts)?
                .into_iter()
                .map(KernelView)
                .collect();
            let map_one = |i| {
                let (offset, len) = region(i);
                map_kernel(bench.memfd, offset, len)
            };
            Ok(run(&views, map_one, bench.duration)?.sample(None))
        }
        Column::Faultmap { .. } => {
            let pager = bench.pager(column)?;
            let views = faultmap_parts(bench, &pager, parts)?;
            let map_one = |i| {
                let (offset, len) = region(i);
                map_faultmap(&pager, bench.object, offset, len)
            };
            let churned = run(&views, map_one, bench.duration)?;
            drop(views);
            Ok(churned.sample(Some(pager.stats())))
        }
    }
}

/// The churn thread's `i`th region: (offset, length) in bytes, cycling
/// over the data in [`CHURN_PAGES`]-page steps.
fn churn_region(len: u64, i: u64) -> (u64, u64) {
    let step = CHURN_PAGES * PAGE_SIZE as u64;
    let slots = (len / step).max(1);
    let offset = (i % slots) * step;
    (offset, step.min(len - offset))
}

/// What a faulting thread needs of its view.
trait View: Sync {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// Drops the view's page tables; the next touch of a page faults.
    fn dont_need(&self) -> Result<()>;
}

impl View for Mapping {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn dont_need(&self) -> Result<()> {
        self.advise(Advice::DontNeed, 0..self.len())
            .context("Advice::DontNeed")
    }
}

/// A kernel mapping of a part of the memfd (`None`: an empty part).
struct KernelView(Option<Mmap>);

impl View for KernelView {
    fn bytes(&self) -> &[u8] {
        self.0.as_deref().unwrap_or(&[])
    }

    fn dont_need(&self) -> Result<()> {
        let Some(map) = &self.0 else {
            return Ok(());
        };
        // SAFETY: MADV_DONTNEED on a shared mapping of a memfd drops only
        // the page-table entries: the bytes stay in the memfd, and the next
        // read of a page maps the same bytes again, so the slices that point
        // into the mapping stay valid and unchanged.
        unsafe { map.unchecked_advise(UncheckedAdvice::DontNeed) }.context("madvise(MADV_DONTNEED)")
    }
}

/// What a churn run counted.
struct Churned {
    seconds: f64,
    minor_faults: u64,
    major_faults: u64,
    pages_touched: u64,
    maps: u64,
}

impl Churned {
    /// The sample: the faults are the pager's (`stats`), or the process's.
    fn sample(self, stats: Option<Stats>) -> Sample {
        Sample {
            seconds: self.seconds,
            faults: Some(stats.map_or(self.minor_faults, |s| s.pgfault)),
            major_faults: Some(stats.map_or(self.major_faults, |s| s.pgmajfault)),
            pages_touched: Some(self.pages_touched),
            maps: Some(self.maps),
            stats,
            ..Sample::default()
        }
    }
}

/// Runs one faulting thread per view and the churn thread, which calls
/// `map_one(i)` for its `i`th region; see the module documentation.
fn run<V: View, R>(
    views: &[V],
    map_one: impl Fn(u64) -> Result<R> + Sync,
    duration: Duration,
) -> Result<Churned> {
    let t = views.len();
    let running = AtomicUsize::new(t);
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    let fail = |err: anyhow::Error| {
        let mut first = failure.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(err);
        0
    };
    let timed = crate::timed::run(t + 1, |i| match views.get(i) {
        Some(view) => {
            let touched = fault_for(view, duration);
            // Release: the churn thread stops once every faulting thread is.
            running.fetch_sub(1, Ordering::Release);
            touched.unwrap_or_else(fail)
        }
        None => churn_until_done(&map_one, &running).unwrap_or_else(fail),
    })?;
    if let Some(err) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(err);
    }
    let (faulting, churn) = timed.sums.split_at(t);
    Ok(Churned {
        seconds: timed.seconds,
        minor_faults: timed.minor_faults,
        major_faults: timed.major_faults,
        pages_touched: faulting.iter().sum(),
        maps: churn
            .first()
            .copied()
            .ok_or_else(|| anyhow!("the churn thread did not report"))?,
    })
}

/// A faulting thread: touches one byte per page of `view`, DONTNEED after
/// each whole pass, until `duration` has passed; returns the pages touched.
fn fault_for(view: &impl View, duration: Duration) -> Result<u64> {
    let deadline = Instant::now() + duration;
    let data = view.bytes();
    let pages = data.len().div_ceil(PAGE_SIZE);
    if pages == 0 {
        return Ok(0);
    }
    let mut touched = 0u64;
    let mut sum = 0u64;
    loop {
        for chunk in (0..pages).step_by(CHECK_PAGES) {
            let end = (chunk + CHECK_PAGES).min(pages);
            for page in chunk..end {
                sum = sum.wrapping_add(u64::from(data[page * PAGE_SIZE]));
            }
            touched += (end - chunk) as u64;
            if Instant::now() >= deadline {
                black_box(sum);
                return Ok(touched);
            }
        }
        view.dont_need()?;
    }
}

/// The churn thread: maps region after region (unmapping the oldest beyond
/// [`CHURN_LIVE`]), at least one, while a faulting thread runs; returns
/// the maps made.
fn churn_until_done<R>(map_one: &impl Fn(u64) -> Result<R>, running: &AtomicUsize) -> Result<u64> {
    let mut live = VecDeque::with_capacity(CHURN_LIVE + 1);
    let mut maps = 0u64;
    loop {
        live.push_back(map_one(maps)?);
        maps += 1;
        if live.len() > CHURN_LIVE {
            drop(live.pop_front());
        }
        // Acquire: pairs with the faulting threads' Release as they finish.
        if running.load(Ordering::Acquire) == 0 {
            return Ok(maps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churn_regions_cycle_inside_the_data() {
        let step = CHURN_PAGES * PAGE_SIZE as u64;
        assert_eq!(churn_region(3 * step, 0), (0, step));
        assert_eq!(churn_region(3 * step, 2), (2 * step, step));
        assert_eq!(churn_region(3 * step, 3), (0, step));
        // Smaller than a region: the whole data.
        assert_eq!(churn_region(5000, 7), (0, 5000));
    }

    /// A view over a plain buffer that counts its DONTNEEDs.
    struct Buffer(Vec<u8>, AtomicUsize);

    impl View for Buffer {
        fn bytes(&self) -> &[u8] {
            &self.0
        }

        fn dont_need(&self) -> Result<()> {
            self.1.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn runs_the_faulting_threads_and_the_churn_thread_together() {
        // No time: each faulting thread touches one clock check's worth of
        // pages (all 10 of its pages) and stops; the churn thread maps once
        // at least.
        let views: Vec<Buffer> = (0..2)
            .map(|_| Buffer(vec![1; 10 * PAGE_SIZE], AtomicUsize::new(0)))
            .collect();
        let churned = run(&views, Ok, Duration::ZERO).unwrap();
        assert_eq!(churned.pages_touched, 20);
        assert!(churned.maps >= 1);
        let failing = run(
            &views,
            |_| -> Result<()> { Err(anyhow!("no")) },
            Duration::ZERO,
        );
        assert!(failing.is_err());
        let empty: Vec<Buffer> = vec![Buffer(Vec::new(), AtomicUsize::new(0))];
        assert_eq!(run(&empty, Ok, Duration::ZERO).unwrap().pages_touched, 0);
    }

    #[test]
    fn a_faulting_thread_reads_the_clock_every_check_pages() {
        let view = Buffer(vec![1; 3 * CHECK_PAGES * PAGE_SIZE], AtomicUsize::new(0));
        let touched = fault_for(&view, Duration::ZERO).unwrap();
        assert_eq!(touched, CHECK_PAGES as u64);
        assert_eq!(view.1.load(Ordering::Relaxed), 0);
    }
}
