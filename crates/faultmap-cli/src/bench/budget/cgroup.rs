//! The `kernel-file` engine of `faultmap bench --budget`: the kernel's mmap
//! of the file in a child process held to the budget by a cgroup v1 memory
//! limit.
//!
//! ```text
//!   parent                                   child (faultmap __budget-kernel)
//!   mkdir /sys/fs/cgroup/memory/faultmap-bench-<pid>
//!   memory.limit_in_bytes = budget
//!   spawn ─────────────────────────────────▶ make the page list; wait for "go"
//!   cgroup.procs = child's pid
//!   posix_fadvise(file, DONTNEED)
//!   "go" ──────────────────────────────────▶ mmap the file; getrusage, t₀;
//!                                            walk; t₁, getrusage; one JSON line
//!   wait; read memory.max_usage_in_bytes
//!   and memory.stat; rmdir the cgroup
//! ```
//!
//! The child's page list is made before it joins the cgroup, so its pages
//! stay charged where they were; what the cgroup sees is the file's page
//! cache, the child's page tables and its few other pages. Page-cache pages
//! are charged to the cgroup of the process that reads them in, so the
//! file's cache is dropped after the child joins and before it maps.

use std::fs::File;
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use faultmap::PAGE_SIZE;
use serde::{Deserialize, Serialize};

use super::touch::{self, BudgetWorkload, RssSampler};
use crate::BudgetChildArgs;

/// The cgroup v1 memory controller's root.
const MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

/// The hidden subcommand the child runs.
pub const CHILD_COMMAND: &str = "__budget-kernel";

/// A cgroup of its own, removed on drop.
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// Creates `faultmap-bench-<pid>` under the memory controller with a
    /// limit of `limit` bytes.
    pub fn create(limit: u64) -> Result<Cgroup> {
        let root = Path::new(MEMORY_ROOT);
        if !root.join("memory.limit_in_bytes").exists() {
            bail!("no cgroup v1 memory controller at {MEMORY_ROOT}");
        }
        let dir = root.join(format!("faultmap-bench-{}", std::process::id()));
        if dir.exists() {
            // An earlier sample's, not yet removed.
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let cgroup = Cgroup { dir };
        cgroup.write("memory.limit_in_bytes", &limit.to_string())?;
        Ok(cgroup)
    }

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) -> Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The cgroup's `memory.max_usage_in_bytes`.
    pub fn max_usage(&self) -> Result<u64> {
        let path = self.dir.join("memory.max_usage_in_bytes");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: not a number: {text:?}", path.display()))
    }

    /// A counter of the cgroup's `memory.stat`.
    pub fn stat(&self, key: &str) -> Option<u64> {
        self.counter("memory.stat", key)
    }

    /// How many of the cgroup's processes its OOM killer killed
    /// (`oom_kill` of `memory.oom_control`).
    pub fn oom_kills(&self) -> Option<u64> {
        self.counter("memory.oom_control", "oom_kill")
    }

    /// Counter `key` of a "key value" per line file of the cgroup.
    fn counter(&self, file: &str, key: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        text.lines().find_map(|line| {
            let (k, v) = line.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .with_context(|| format!("writing {value} to {}", path.display()))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The child has been reaped; the cgroup may take a moment to see it.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = writeln!(
            std::io::stderr(),
            "faultmap bench: could not remove {}",
            self.dir.display()
        );
    }
}

/// Whether cgroups can be used here: a trial cgroup with the limit,
/// created and removed.
pub fn probe(limit: u64) -> Result<()> {
    Cgroup::create(limit).map(drop)
}

/// Drops the kernel's page cache of the file at `path`
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`; pages mapped elsewhere stay).
pub fn drop_file_cache(path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: posix_fadvise only reads its arguments; the fd is open.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        bail!(
            "posix_fadvise(DONTNEED) on {}: {}",
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        );
    }
    Ok(())
}

/// What the child measured, printed as one JSON line.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct ChildSample {
    /// Wall time of the walk.
    pub seconds: f64,
    /// Pages touched.
    pub touches: u64,
    /// The walk's checksum.
    pub checksum: u64,
    /// `getrusage` minor faults during the walk.
    pub minor_faults: u64,
    /// `getrusage` major faults during the walk.
    pub major_faults: u64,
    /// The child's largest sampled RssFile + RssShmem.
    pub peak_rss_bytes: u64,
}

/// One kernel-file measurement.
#[derive(Clone, Copy, Debug)]
pub struct KernelSample {
    /// The child's own measurements.
    pub child: ChildSample,
    /// The cgroup's `memory.max_usage_in_bytes`.
    pub max_usage: u64,
    /// The cgroup's `workingset_refault_file`.
    pub refault: Option<u64>,
}

/// Why a kernel-file measurement did not happen.
pub enum KernelError {
    /// The cgroup could not be made or joined: skip the engine.
    Cgroup(anyhow::Error),
    /// The child failed: skip the cell.
    Run(anyhow::Error),
}

/// Runs `workload` on the kernel's mmap of `path` in a child held to
/// `budget` bytes by a new cgroup, removed afterwards.
pub fn measure(
    path: &Path,
    workload: BudgetWorkload,
    budget: u64,
) -> Result<KernelSample, KernelError> {
    let cgroup = Cgroup::create(budget).map_err(KernelError::Cgroup)?;
    let exe = std::env::current_exe()
        .context("finding the faultmap binary")
        .map_err(KernelError::Run)?;
    let mut child = Command::new(exe)
        .arg(CHILD_COMMAND)
        .args(["--workload", workload.name(), "--budget-bytes"])
        .arg(budget.to_string())
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the kernel-file child")
        .map_err(KernelError::Run)?;
    let stdin = child.stdin.take();
    let ready = cgroup
        .add(child.id())
        .map_err(KernelError::Cgroup)
        .and_then(|()| drop_file_cache(path).map_err(KernelError::Run))
        .and_then(|()| {
            stdin
                .context("the child's stdin")
                .and_then(|mut stdin| stdin.write_all(b"go\n").context("starting the child"))
                .map_err(KernelError::Run)
        });
    if let Err(err) = ready {
        // Our own child, by its handle.
        let _ = child.kill();
        let _ = child.wait();
        return Err(err);
    }
    let output = child
        .wait_with_output()
        .context("waiting for the kernel-file child")
        .map_err(KernelError::Run)?;
    if !output.status.success() {
        if cgroup.oom_kills().is_some_and(|n| n > 0) {
            return Err(KernelError::Run(anyhow::anyhow!(
                "the kernel-file child was killed by its cgroup's OOM killer: a budget of \
                 {} KiB does not hold its own pages besides the file's (a larger budget \
                 needs --budget-mib and, with --file, a file 4 times as large)",
                budget / 1024
            )));
        }
        return Err(KernelError::Run(anyhow::anyhow!(
            "the kernel-file child failed ({})",
            output.status
        )));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let child: ChildSample = serde_json::from_str(text.lines().last().unwrap_or(""))
        .with_context(|| format!("the kernel-file child's report: {text:?}"))
        .map_err(KernelError::Run)?;
    let max_usage = cgroup.max_usage().map_err(KernelError::Run)?;
    let refault = cgroup.stat("workingset_refault_file");
    drop(cgroup);
    Ok(KernelSample {
        child,
        max_usage,
        refault,
    })
}

/// The child (`faultmap __budget-kernel`): make the page list, wait for
/// "go" on stdin, map the file, walk, print one JSON line.
pub fn child(args: &BudgetChildArgs) -> Result<()> {
    let file =
        File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
    let len = file.metadata()?.len();
    let page = PAGE_SIZE as u64;
    let plan = touch::plan(args.workload, len.div_ceil(page), args.budget_bytes / page);
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("waiting for the parent")?;
    if line.trim() != "go" {
        bail!("the parent did not say go");
    }
    // SAFETY: the benchmark's data file is not changed while mapped (the
    // same contract as `--file`).
    let map = unsafe { memmap2::Mmap::map(&file) }.context("mapping the file")?;
    let sampler = RssSampler::start();
    let before = faultmap::measure::rusage_faults().context("getrusage")?;
    let started = Instant::now();
    let checksum = touch::walk(&map, &plan);
    let seconds = started.elapsed().as_secs_f64();
    let after = faultmap::measure::rusage_faults().context("getrusage")?;
    let peak_rss_bytes = sampler.finish();
    let sample = ChildSample {
        seconds,
        touches: plan.len() as u64,
        checksum,
        minor_faults: after.0.saturating_sub(before.0),
        major_faults: after.1.saturating_sub(before.1),
        peak_rss_bytes,
    };
    let mut out = std::io::stdout().lock();
    crate::output::json_line(&mut out, &sample)?;
    out.flush().context("writing the child's report")
}
