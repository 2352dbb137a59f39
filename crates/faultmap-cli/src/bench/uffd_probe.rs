//! The `uffd-probe` columns of the fault-around benchmark: the floor of a
//! userfaultfd round trip, measured in the same run as faultmap's handler
//! delivery and on the same bytes (kernel-memfd's memfd copy).
//!
//! A probe ([`UffdProbe`]) is the bare mechanism and nothing else: a fresh
//! mapping of the memfd registered MINOR, and one handler thread, pinned to
//! one CPU, that sleeps in `poll` and answers each fault with a one-page
//! `UFFDIO_CONTINUE`. No region lookup, no page state, no fault-around (the
//! kernel does none in a MINOR-registered range either), so the first touch
//! of every page is exactly one round trip. What faultmap's handler
//! delivery at order 0 costs per fault above it is faultmap's own work.
//!
//! Where the faulting thread runs against the handler decides the cost of
//! the two wake-ups (local, or an IPI each), hence two columns:
//!
//! ```text
//!   CPUs the process may use: c0 .. c(n-1); probe j's handler pinned to cj
//!
//!   walking thread i, pinned to c(i mod n) for its timed walk, maps
//!     same-cpu:   probe i mod n         the handler on its own CPU
//!     cross-cpu:  probe (i+1) mod n     the handler on the next CPU
//!
//!   2 CPUs, 2 threads:  same-cpu   w0 h0 on c0 | w1 h1 on c1
//!                       cross-cpu  w0 h1 -> c0 | c1 <- w1 h0
//! ```
//!
//! One probe per CPU, started once for the whole run, and only for the
//! CPUs some walk uses (`min(n, threads + 1)`). With more walking threads
//! than CPUs, threads share a CPU and its probe. With one CPU there is no
//! other CPU: `cross-cpu` is not measured, and the run says so in one line
//! ([`Probes::cross_cpu_skipped`]).
//!
//! A walking thread is pinned before the threads start and given back its
//! previous CPUs after they all end ([`crate::timed::run_pinned`]), both
//! outside the time. Every other column runs unpinned.
//!
//! # Faults
//!
//! `getrusage`'s minor and major faults, as for the kernel columns. Each
//! round trip is one minor fault here (Linux 6.18): the count is the pages
//! the walk touched, plus whatever the process's other threads took
//! meanwhile (in practice nothing). A kernel that accounted the retried
//! fault as major (`mm_account_fault` counts a `FAULT_FLAG_TRIED` fault as
//! major) would show them on the table's major-faults line instead.

use std::fs::File;

use anyhow::{bail, Context, Result};
use faultmap::measure::{ProbeView, UffdProbe};
use faultmap::PAGE_SIZE;

use super::grid::Sample;
use super::workload::{run_timed_pinned, Plan};

/// Where a walking thread runs against the handler of its probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeCpu {
    /// On the handler's CPU.
    Same,
    /// On another CPU than the handler's.
    Cross,
}

impl ProbeCpu {
    /// Both placements.
    pub const ALL: [ProbeCpu; 2] = [ProbeCpu::Same, ProbeCpu::Cross];

    /// The value in the JSON variant (`cpu=same`).
    pub fn name(self) -> &'static str {
        match self {
            ProbeCpu::Same => "same",
            ProbeCpu::Cross => "cross",
        }
    }

    /// The second heading line of its column.
    pub fn heading(self) -> &'static str {
        match self {
            ProbeCpu::Same => "same-cpu",
            ProbeCpu::Cross => "cross-cpu",
        }
    }
}

/// Walking thread `walker`'s CPU and its probe's, as indexes into `cpus`
/// CPUs (see the module documentation).
fn placement(cpu: ProbeCpu, walker: usize, cpus: usize) -> (usize, usize) {
    let own = walker % cpus.max(1);
    match cpu {
        ProbeCpu::Same => (own, own),
        ProbeCpu::Cross => (own, (own + 1) % cpus.max(1)),
    }
}

/// The probes a run needs: one per CPU that the walks of up to `threads`
/// threads use, the next CPU (cross-cpu) included.
fn probes_needed(threads: usize, cpus: usize) -> usize {
    cpus.min(threads + 1)
}

/// The run's probes.
pub struct Probes {
    /// The CPUs this process may use, in order.
    cpus: Vec<usize>,
    /// Probe `j`'s handler is pinned to `cpus[j]`.
    probes: Vec<UffdProbe>,
    /// The data's length: a view's bytes.
    len: usize,
}

impl Probes {
    /// Starts the probes over the first `len` bytes of `memfd`, for walks
    /// of up to `threads` threads.
    pub fn start(memfd: &File, len: usize, threads: usize) -> Result<Probes> {
        let cpus = faultmap::measure::allowed_cpus().context("reading this process's CPUs")?;
        // A userfaultfd range is whole pages: the views map the data
        // rounded up to a page (its bytes past the end read as zeros) and
        // the walks see only its first `len` bytes.
        let mapped = len.next_multiple_of(PAGE_SIZE);
        let probes = cpus[..probes_needed(threads, cpus.len())]
            .iter()
            .map(|&cpu| {
                // SAFETY: `memfd` is the bench's memfd copy of the data,
                // written whole before the run (`super::data`) and never
                // written or truncated after; `mapped` rounds its length up
                // to the page that holds its last byte.
                unsafe { UffdProbe::start(memfd, mapped, cpu) }
                    .with_context(|| format!("starting the uffd-probe's handler on CPU {cpu}"))
            })
            .collect::<Result<_>>()?;
        Ok(Probes { cpus, probes, len })
    }

    /// The placements measured: both, or `same-cpu` alone on one CPU.
    pub fn columns(&self) -> Vec<ProbeCpu> {
        let all = ProbeCpu::ALL.into_iter();
        all.filter(|&c| c == ProbeCpu::Same || self.cross_cpu_skipped().is_none())
            .collect()
    }

    /// Why `cross-cpu` is not measured, if it is not.
    pub fn cross_cpu_skipped(&self) -> Option<String> {
        match self.cpus.as_slice() {
            [only] => Some(format!(
                "uffd-probe cross-cpu skipped: this process may use CPU {only} only"
            )),
            _ => None,
        }
    }

    /// The CPUs of the handlers.
    pub fn handler_cpus(&self) -> &[usize] {
        &self.cpus[..self.probes.len()]
    }

    /// Measures `plan` on `threads` threads, placed as `cpu` says: fresh
    /// views, untimed; the timed walk of the pinned threads; the process's
    /// fault counts.
    pub fn measure(&self, cpu: ProbeCpu, plan: &Plan, threads: usize) -> Result<Sample> {
        if cpu == ProbeCpu::Cross && self.cpus.len() < 2 {
            bail!("uffd-probe cross-cpu needs two CPUs");
        }
        let n = self.cpus.len();
        let mut views: Vec<ProbeView<'_>> = Vec::with_capacity(threads);
        let mut walkers = Vec::with_capacity(threads);
        for walker in 0..threads {
            let (own, handler) = placement(cpu, walker, n);
            let probe = self.probes.get(handler).context("no probe for a walker")?;
            views.push(
                probe
                    .map()
                    .context("mapping the data through the uffd-probe")?,
            );
            walkers.push(self.cpus[own]);
        }
        let slices: Vec<&[u8]> = views.iter().map(|v| &v[..self.len]).collect();
        let timed = run_timed_pinned(plan, &slices, &walkers)?;
        Ok(Sample {
            seconds: timed.seconds,
            faults: Some(timed.minor_faults),
            major_faults: Some(timed.major_faults),
            checksum: Some(timed.checksum),
            ..Sample::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::workload::Workload;

    #[test]
    fn walkers_meet_their_handler_or_the_next_cpu() {
        let place = |cpu, cpus| (0..3).map(|w| placement(cpu, w, cpus)).collect::<Vec<_>>();
        assert_eq!(place(ProbeCpu::Same, 2), [(0, 0), (1, 1), (0, 0)]);
        assert_eq!(place(ProbeCpu::Cross, 2), [(0, 1), (1, 0), (0, 1)]);
        assert_eq!(place(ProbeCpu::Cross, 4), [(0, 1), (1, 2), (2, 3)]);
        assert_eq!(place(ProbeCpu::Same, 1), [(0, 0), (0, 0), (0, 0)]);
        // Every probe a walk of up to T threads uses is started.
        for cpus in 1..6 {
            for threads in 1..8 {
                let needed = probes_needed(threads, cpus);
                for walker in 0..threads {
                    for cpu in ProbeCpu::ALL {
                        let (own, handler) = placement(cpu, walker, cpus);
                        assert!(own < needed && handler < needed, "{cpus} {threads}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_probe_walk_reads_the_memfd_and_takes_a_fault_per_page() {
        let pages = 64;
        let bytes: Vec<u8> = (0..pages * PAGE_SIZE - 5)
            .map(|i| (i % 251) as u8 + 1)
            .collect();
        let mut memfd = faultmap::measure::memfd(c"probe-test", bytes.len() as u64).unwrap();
        std::io::Write::write_all(&mut memfd, &bytes).unwrap();
        let probes = Probes::start(&memfd, bytes.len(), 2).unwrap();
        let plan = Plan::new(Workload::Seq, bytes.len(), 2).unwrap();
        let want = plan.walk(0, &bytes);
        let columns = probes.columns();
        assert_eq!(columns.len() == 1, probes.cross_cpu_skipped().is_some());
        for cpu in columns {
            for threads in [1, 2] {
                let sample = probes.measure(cpu, &plan, threads).unwrap();
                assert_eq!(sample.checksum, Some(want), "{cpu:?} × {threads}");
                let faults = sample.faults.unwrap();
                assert!(faults >= (threads * pages) as u64, "{cpu:?} × {threads}");
            }
        }
    }
}
