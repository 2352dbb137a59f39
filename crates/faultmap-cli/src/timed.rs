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
//!
//! [`run_pinned`] also pins worker `i` to one CPU: after `spawn`, before
//! `ready` (so the migration is outside the time), and gives it back the
//! CPUs it had after `done`.

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
    run_on(threads, None, work)
}

/// [`run`] on `cpus.len()` threads, thread `i` pinned to CPU `cpus[i]` for
/// its work.
pub fn run_pinned<F>(cpus: &[usize], work: F) -> Result<Timed>
where
    F: Fn(usize) -> u64 + Sync,
{
    run_on(cpus.len(), Some(cpus), work)
}

fn run_on<F>(threads: usize, cpus: Option<&[usize]>, work: F) -> Result<Timed>
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
                    let pinned = cpus.and_then(|c| c.get(i)).map(|&c| Pinned::to(c));
                    let pinned = pinned.transpose();
                    ready.wait();
                    go.wait();
                    // A thread that could not be pinned still meets the
                    // others at every barrier, so that none waits for good.
                    let sum = if pinned.is_ok() {
                        black_box(work(black_box(i)))
                    } else {
                        0
                    };
                    done.wait();
                    pinned.map(|pinned| {
                        drop(pinned);
                        sum
                    })
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
            .map(|w| match w.join() {
                Ok(sum) => sum.context("pinning a benchmark thread to its CPU"),
                Err(_) => Err(anyhow!("a benchmark thread died")),
            })
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

/// The calling thread pinned to one CPU until dropped; the drop gives it
/// back the CPUs it could use before.
struct Pinned {
    before: Vec<usize>,
}

impl Pinned {
    fn to(cpu: usize) -> std::io::Result<Pinned> {
        let before = faultmap::measure::allowed_cpus()?;
        faultmap::measure::pin_current_thread(&[cpu])?;
        Ok(Pinned { before })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Cannot fail: these are the CPUs the thread had a moment ago.
        let _ = faultmap::measure::pin_current_thread(&self.before);
    }
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

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_only() {
        let allowed = faultmap::measure::allowed_cpus().unwrap();
        let cpus = [allowed[0], allowed[allowed.len() - 1]];
        let timed = run_pinned(&cpus, |i| {
            let now = faultmap::measure::allowed_cpus().unwrap();
            u64::from(now == [cpus[i]])
        })
        .unwrap();
        assert_eq!(timed.sums, [1, 1]);
        // A CPU beyond any set fails the run; the other thread is not left
        // waiting.
        assert!(run_pinned(&[allowed[0], 1 << 20], |_| 1).is_err());
    }
}
