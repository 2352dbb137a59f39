//! A timed run of several threads that start together.
//!
//! ```text
//!   main:    spawn ─ ready ─ rusage₀, t₀ ─ go ──────────── done ─ t₁, rusage₁ ─ join
//!   worker:  spawn ─ ready ───────────────  go ─ work ──── done ─ exit
//! ```
//!
//! Thread creation and exit are outside `[t₀, t₁]` and outside the fault
//! counts; the work is all that is inside. Each worker returns a number (a
//! sum of what it read), which goes through [`std::hint::black_box`] so the
//! compiler cannot drop the reads.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};

/// What a timed run measured.
#[derive(Clone, Debug)]
pub struct Timed {
    /// Wall time from the threads' common start to the last one's end.
    pub seconds: f64,
    /// Minor faults of the whole process over that time (`getrusage`).
    pub minor_faults: u64,
    /// Major faults of the whole process over that time.
    pub major_faults: u64,
    /// What each thread returned, in thread order.
    pub sums: Vec<u64>,
}

/// Runs `work(i)` on `threads` threads (`i` in `0..threads`), all started
/// together; see the module documentation for what is timed.
pub fn run<F>(threads: usize, work: F) -> Result<Timed>
where
    F: Fn(usize) -> u64 + Sync,
{
    let n = threads.max(1);
    let ready = Barrier::new(n + 1);
    let go = Barrier::new(n + 1);
    let done = Barrier::new(n + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..n)
            .map(|i| {
                let (ready, go, done, work) = (&ready, &go, &done, &work);
                s.spawn(move || {
                    ready.wait();
                    go.wait();
                    let sum = black_box(work(black_box(i)));
                    done.wait();
                    sum
                })
            })
            .collect();
        ready.wait();
        let before = faultmap::measure::rusage_faults();
        let t0 = Instant::now();
        go.wait();
        done.wait();
        let seconds = t0.elapsed().as_secs_f64();
        let after = faultmap::measure::rusage_faults();
        let sums = workers
            .into_iter()
            .map(|w| w.join().map_err(|_| anyhow!("a benchmark thread died")))
            .collect::<Result<Vec<u64>>>()?;
        let (before, after) = (before.context("getrusage")?, after.context("getrusage")?);
        Ok(Timed {
            seconds,
            minor_faults: after.0.saturating_sub(before.0),
            major_faults: after.1.saturating_sub(before.1),
            sums,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_once_with_its_index() {
        let timed = run(3, |i| 10 + i as u64).unwrap();
        assert_eq!(timed.sums, [10, 11, 12]);
        assert!(timed.seconds >= 0.0);
        assert_eq!(run(0, |_| 7).unwrap().sums, [7]);
    }
}
