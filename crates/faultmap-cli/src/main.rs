//! `faultmap`: the command-line face of the faultmap pager.
//!
//! This file holds only the command line (clap definitions, with the help
//! text of every command and option) and the dispatch to the modules that do
//! the work:
//!
//! - [`scan`]: map a file through faultmap, read every byte, print its CRC-32;
//! - [`stats`]: run an access pattern over a file, print the
//!   readahead table and the counters;
//! - [`bench`](mod@bench): the benchmarks, faultmap against kernel `mmap` in one
//!   run (the fault-around benchmark, per fault delivery mode; with
//!   `--cold`, the readahead comparison against kernel `mmap` and the
//!   device; with `--parts`, the lockless page cache benchmark; with
//!   `--churn`, the speculative fault benchmark; with `--budget`, a memory budget
//!   against the kernel under a cgroup memory limit);
//! - [`proxy`]: the benchmarks' counting proxy with an added first-byte
//!   latency, as a process of its own (for the Python benchmarks);
//! - [`access`] (the access patterns), [`timed`] (threads started together,
//!   timed), [`kernel`] (drop_caches, block-device counters), [`ra_table`],
//!   [`output`], [`units`] and [`table`]: helpers shared by the commands.
//!
//! Errors are `anyhow` chains printed as one line on stderr, with exit code
//! 1; clap's own usage errors exit with 2. Nothing on a bad input panics:
//! even a closed stdout (`faultmap scan f | head -c1`) is an error, not a
//! panic, because every command writes through a `Write` whose errors it
//! returns.

mod access;
mod bench;
mod cache;
mod kernel;
mod output;
mod proxy;
mod ra_table;
mod scan;
mod stats;
mod table;
mod timed;
mod units;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::access::Access;
use crate::bench::workload::Workload;

/// A user-space pager on userfaultfd with the Linux kernel's fault-path
/// algorithms.
///
/// faultmap maps an object (a file, a buffer) and serves its page faults in
/// user space with the kernel's fault-around and readahead algorithms.
/// Linux 6.6 or later.
/// As root (or with read-write access to /dev/userfaultfd) it also serves
/// the faults the kernel takes on the program's behalf; see the README.
#[derive(Debug, Parser)]
#[command(name = "faultmap", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Map a file or a remote object (http://, https://, s3://, gs://, az://) through
    /// faultmap, read every byte, print its CRC-32 and the fault counters.
    ///
    /// The CRC-32 is the IEEE one (zlib's, Python's `zlib.crc32`), so the
    /// output can be checked against any other tool. With several threads
    /// the mapping is cut into contiguous parts, each thread checksums its
    /// part, and the parts' CRCs are combined in order.
    Scan(ScanArgs),
    /// Run an access pattern over a file through faultmap and print what the
    /// fault path did: the readahead table and the counters.
    ///
    /// The table has one row per readahead pattern (initial: the sync window
    /// that starts a sequential stream; subsequent: async windows at the
    /// marker of the previous one; marker: async windows at a marker found
    /// out of step; around: mmap read-around windows; random: only the
    /// pages asked for; all) and the columns ra_count (windows), io_count
    /// (store reads), sync_count (windows a fault waited for), eof_count
    /// (windows cut at the end of the file), and the means ra_size,
    /// async_size and io_size, in pages. Then pgmajfault, fault_wait,
    /// io_count, io_bytes, the readahead miss ratio (pages read ahead and
    /// never mapped, over pages read ahead) and the other counters.
    ///
    /// The file is a new faultmap object, so faultmap's cache is always
    /// empty at the start; --cold also drops the kernel's page cache, so
    /// that the store's reads come from the disk.
    Stats(StatsArgs),
    /// Run a benchmark, faultmap against the kernel's mmap of the same
    /// data in one process: the fault-around benchmark (default: a
    /// representative subset; --full: the whole table), --cold (the
    /// readahead comparison), --parts (the lockless page cache), --churn
    /// (speculative faults), --budget (a memory budget) or --remote
    /// (HTTP and S3 objects against raw ranged GETs and FUSE mounts).
    ///
    /// The fault-around benchmark (default): faultmap at each fault-around
    /// order against the kernel's mmap of the same data, one after
    /// another. Plain `faultmap bench` measures seq, rand and sparse at
    /// orders 0, 4, 9 and auto, both delivery modes, 1 and 2 threads, 3
    /// samples per cell (up to 21 for cells under 20 ms), and the bare
    /// uffd-probe on the handler's CPU (about three minutes on 2 cores);
    /// --full measures orders 0,1,3,4,5,7,9,auto with up to 11 samples for
    /// cheap cells (21 for cells under 20 ms), and the uffd-probe across
    /// CPUs too (about 5 minutes, plus about 18 s per cross-cpu walk of 1
    /// GiB). --orders, --workload, --threads, --delivery and
    /// --repetitions narrow or widen either. After the tables, the
    /// headline: per workload, delivery and thread count, faultmap's
    /// fastest order and its time over kernel-file's and kernel-memfd's;
    /// then per workload and thread count, handler delivery's time per
    /// fault (time / faults) at order 0 over signal delivery's and over
    /// uffd-probe same-cpu's (handler/signal, handler/probe-same); then
    /// per workload, delivery and thread count, order=auto's time over the
    /// fastest fixed order's.
    /// --plot FILE.svg draws the results (every mode).
    ///
    /// The fault-around table: for each workload, the
    /// faults and the time (median of the repetitions) per thread count and
    /// per engine, plus the time ratios of the kernel baselines to faultmap.
    ///
    /// Engines: `kernel-file` is the kernel's mmap of the file, its page
    /// cache re-read and checked resident (mincore) before every repetition;
    /// the header says whether its folios were large or 4 KiB. `kernel-memfd`
    /// is the kernel's mmap of a memfd holding the same bytes (4 KiB shmem
    /// pages): the like-for-like baseline, since faultmap's cache is a memfd
    /// too. `uffd-probe` is the bare userfaultfd round trip, the floor under
    /// handler delivery: that memfd registered MINOR, one handler thread per
    /// CPU answering each fault with a one-page UFFDIO_CONTINUE and nothing
    /// else; its second heading says where each walking thread is pinned
    /// during its walk: `same-cpu` (on its handler's CPU) or `cross-cpu`
    /// (on another; skipped, with one line saying so, when the process may
    /// use one CPU only); its faults are getrusage minor faults, one per
    /// page. `order=N` is faultmap with fault-around windows of 2^N pages
    /// (`order=auto`: adaptive fault-around); its cache is filled once before the runs, so like the kernel's they
    /// measure warm minor faults.
    ///
    /// Each thread has its own mapping of the same data and walks the whole
    /// of it (so faults scale with threads); the threads start
    /// together, and the time is from their start to the last one's end.
    ///
    /// --delivery picks faultmap's fault delivery modes, one column per order
    /// and mode: `signal` (the faulting thread resolves its own fault in a
    /// SIGBUS handler; the library's default) and `handler` (handler threads
    /// read userfaultfd messages while the faulting thread sleeps).
    ///
    /// With --parts: the lockless page cache benchmark. T threads each touch
    /// one byte per page of their own contiguous 1/T of one cached object,
    /// each through its own mapping at fault-around order 0, so that every
    /// fault is one page-cache lookup and one UFFDIO_CONTINUE. Columns:
    /// `kernel-memfd` (the same on kernel mmaps of a memfd holding the same
    /// data), `lock-free` (faultmap's cache) and `global-mutex` (faultmap with
    /// every page lookup serialised on one mutex: the cache before lockless lookups).
    /// Signal delivery by default, so that each thread resolves its own
    /// faults (with handler delivery one handler thread takes every fault,
    /// which measures the handler, not the cache). Rows per thread count:
    /// faults, time, faults/s, the ratio to kernel-memfd, the scaling over 1
    /// thread (goal at 2 threads: at least 1.7) and lock-free over
    /// global-mutex.
    ///
    /// With --churn: the speculative fault benchmark (like ebizzy). T
    /// threads fault on their own mappings (order 0, one byte per page,
    /// MADV_DONTNEED after each pass) for --duration while one more thread
    /// maps and unmaps other 64 KiB regions in a loop. Columns:
    /// `kernel-memfd` (kernel mmaps of a memfd, the churn thread calling
    /// mmap and munmap), `speculative` and `classic` (faultmap's region
    /// lookup; classic takes the region table's lock on every fault, which
    /// map and unmap hold throughout, like mmap_lock), for each delivery mode
    /// (default: both). Rows: faults/s, pages/s, speculative over classic
    /// (goal: at least 2), the churn thread's maps/s, and the spf counters
    /// (spf_success, spf_abort, spf_fallback) and forwarded faults.
    ///
    /// With --cold: the readahead comparison (read-around only against
    /// full readahead) on cold caches. Columns: `device` (the file read with O_DIRECT in 1 MiB
    /// requests, many in flight, measured in the same run: the disk's
    /// limit), `kernel`
    /// (kernel mmap of the file), `around` (faultmap with read-around only,
    /// readahead disabled) and `readahead` (faultmap's full readahead).
    /// Every kernel and faultmap run starts from cold caches: the kernel's
    /// page cache is dropped right before it (echo 3 >
    /// /proc/sys/vm/drop_caches, as root; without that permission the
    /// kernel column is skipped, with a message) and each faultmap run has
    /// a new pager and object, whose cache is empty. Workloads: seq (T
    /// threads each read every word of their own contiguous 1/T of the file
    /// through one shared mapping, so the file is read once), rand (the
    /// first word of each page of a fixed-seed random sample of pages: 1/16
    /// of the file's pages, at most 16,384, in a random order) and clustered (random
    /// 64 KiB clusters of 16 pages, each read page by page in order, from a
    /// fixed-seed sample of the same number of pages: clustered random
    /// reads). Rows: seconds, MB/s, major faults, I/O count, mean
    /// I/O size and the readahead miss ratio (medians of 3 repetitions by
    /// default), with the ratios of the goals; then the readahead table
    /// of the readahead runs.
    ///
    /// With --budget: a memory budget (--budget-mib, default 256) on an
    /// object 4 times its size (the generated file is 4 × the budget; a
    /// --file or --size smaller than that shrinks the budget to a quarter of
    /// it, and the report says so). Workloads, one byte per touch: seq
    /// (every page in order, twice), rand (uniformly random pages, as many
    /// touches as pages, at most 8192) and hotcold (90% of the touches on a
    /// hot set of 10% of the budget, 10% uniformly over the object, as many
    /// touches as rand); --workload picks some. Engines: faultmap (a new pager per sample with
    /// Config::memory_budget, the default delivery, fault-around order 4,
    /// its store reading with O_DIRECT, or --file-io's mode) and
    /// kernel-file (the kernel's mmap of the file in a child process inside
    /// a new cgroup v1 memory cgroup, /sys/fs/cgroup/memory/faultmap-bench-PID,
    /// with memory.limit_in_bytes = the budget; skipped, with one line
    /// saying why, when cgroups cannot be used). The kernel's page cache of
    /// the file is dropped before every sample. Columns: seconds, touches/s,
    /// hit ratio (1 - major faults / touches), evictions/s, refaults, peak
    /// cached (faultmap's Pager::memory().peak; the cgroup's
    /// memory.max_usage_in_bytes), peak RSS (RssFile + RssShmem sampled
    /// every 5 ms), the budget, and whether the peak stayed within the
    /// budget + 1%. One sample per cell by default (--repetitions).
    Bench(Box<BenchArgs>),
    /// Run the benchmarks' counting proxy in front of an HTTP or S3 server,
    /// with an added first-byte latency, until stdin ends or SIGTERM or
    /// SIGINT.
    ///
    /// It listens on a free port of 127.0.0.1 and prints one line,
    /// `http://127.0.0.1:PORT`, on stdout as soon as it does: give that URL
    /// to the clients as their endpoint (an S3 client signs for the host it
    /// talks to, so it must use the proxy as *the* endpoint, path-style).
    /// Requests and responses pass through unchanged; each response head
    /// waits --latency-ms first (a cloud object store's first-byte
    /// latency; `faultmap bench --remote --latency-ms` adds the same). At
    /// exit it prints its counters on stderr, one line:
    /// `faultmap proxy: requests=N body_bytes=N ranged_requests=N
    /// range_bytes=N upstream_errors=N (ended by ...)`.
    ///
    /// Stdin is its lease: it runs until stdin reaches EOF, so a program
    /// that starts it with a pipe on stdin stops it by closing the pipe, or
    /// by exiting. With stdin at EOF from the start (`< /dev/null`, or `&`
    /// in a script) it stops at once.
    Proxy(ProxyArgs),
    /// Look after a disk cache of remote objects (--cache-dir, or
    /// FAULTMAP_CACHE_DIR): list what it holds, its size, check its
    /// checksums, or clear it. Safe while other processes use it.
    Cache(cache::CacheCommandArgs),
    /// Internal: the kernel-file child of `bench --budget`.
    #[command(name = "__budget-kernel", hide = true)]
    BudgetKernel(BudgetChildArgs),
}

/// Options of the hidden `faultmap __budget-kernel` (the kernel-file child
/// of `bench --budget`): it makes the page list, waits for `go` on stdin,
/// maps FILE, walks, and prints one JSON line.
#[derive(Debug, Args)]
pub struct BudgetChildArgs {
    /// The workload.
    #[arg(long, value_enum)]
    pub workload: bench::budget::touch::BudgetWorkload,
    /// The budget in bytes (sizes hotcold's hot set).
    #[arg(long)]
    pub budget_bytes: u64,
    /// The data file.
    pub file: PathBuf,
}

/// Options of `faultmap proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The server to forward to: HOST:PORT, or http://HOST:PORT (as
    /// AWS_ENDPOINT_URL and FAULTMAP_HTTP_URL spell it). Plain HTTP only.
    #[arg(long, value_name = "HOST:PORT")]
    pub upstream: String,
    /// Milliseconds to wait before each response head (0..=10000; default 0).
    #[arg(long, default_value_t = 0, value_name = "N",
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub latency_ms: u64,
}

/// Options `scan` and `stats` share: the file, and how faultmap maps and
/// reads it.
#[derive(Debug, Args)]
struct MapArgs {
    /// What to read: a local file (directories, FIFOs and devices are
    /// refused), `http(s)://host/path` (a server that answers range
    /// requests), `s3://bucket/key` (credentials, region and endpoint
    /// from the AWS environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP), `gs://bucket/key`
    /// (GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY,
    /// GOOGLE_APPLICATION_CREDENTIALS) or `az://container/key` and
    /// `abfs[s]://container@account.dfs.core.windows.net/key`
    /// (AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY,
    /// AZURE_STORAGE_SAS_KEY, AZURE_STORAGE_USE_EMULATOR). It is read as memory,
    /// like `mmap`: a local file must not be written while the command
    /// runs; a remote object that changes fails the reads after the change.
    #[arg(value_name = "FILE|URL")]
    file: String,
    /// Fault-around order: each fault maps a window of 2^N pages (0..=9),
    /// or auto: adaptive fault-around, whose windows follow the access
    /// pattern, from one page for isolated touches to whole page tables
    /// (512 pages) for walks and dense random access.
    #[arg(long, short, default_value = "4", value_name = "N|auto",
          value_parser = parse_order)]
    order: u8,
    /// The largest readahead window, in pages (0 disables readahead; at
    /// most 16384, 64 MiB). Default: the store's, for a file the device's
    /// read_ahead_kb, as in the kernel.
    #[arg(long, value_name = "N")]
    ra_pages: Option<u64>,
    /// Which readahead faultmap runs.
    #[arg(long, value_enum, default_value = "full", value_name = "MODE")]
    readahead: Readahead,
    /// Threads, each reading (scan) or running the pattern over (stats) its
    /// own contiguous part of the one mapping.
    #[arg(long, short, default_value_t = 1, value_name = "T",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// faultmap's pager threads with signal delivery (they serve the
    /// forwarded misses). Handler delivery runs one handler thread per
    /// CPU, pinned (Config::handler_placement).
    #[arg(long, default_value_t = 1, value_name = "H",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    handler_threads: u16,
    /// The paging engine: userfaultfd, protect (mprotect and SIGSEGV, for
    /// containers that refuse userfaultfd), or auto (userfaultfd if it can
    /// be had, else protect). FAULTMAP_ENGINE in the environment overrides
    /// it. The output's `engine` line says which ran and why.
    #[arg(long, default_value = "auto", value_name = "ENGINE", value_parser = parse_engine)]
    engine: faultmap::Engine,
    /// Record the order in which pages are first touched, and write it to
    /// FILE at the end: an access trace, as runs of pages (a few bytes per
    /// run). While it records, the mapping maps one page per fault
    /// (fault-around order 0), so that every first touch is seen.
    #[arg(long, value_name = "FILE")]
    record_trace: Option<PathBuf>,
    /// Replay the access trace in FILE (written by --record-trace on this
    /// same object, at this same version): its pages are read ahead of
    /// the reading, in the order they were first touched, at most 16 to 32
    /// MiB past what the reading has used. A trace of an object of another
    /// length or version (a file's modification time) is refused.
    #[arg(long, value_name = "FILE")]
    replay_trace: Option<PathBuf>,
    /// The page size of faultmap's cache: 4K (default) or 2M. 2M caches
    /// the object in 2 MiB huge pages (hugetlb) and maps each with one
    /// fault; the kernel's pool must hold the object
    /// (/proc/sys/vm/nr_hugepages: the error says how many pages are
    /// needed). The statistics then count 2 MiB pages (pgfault: one per
    /// 2 MiB page); --ra-pages counts 2 MiB pages too.
    #[arg(long, value_name = "SIZE", value_parser = parse_page_size)]
    page_size: Option<faultmap::PageSize>,
    #[command(flatten)]
    cache: CacheArgs,
}

/// Where a remote object's disk cache is (`--cache-dir`, `--cache-max`).
#[derive(Args, Clone, Debug, Default)]
struct CacheArgs {
    /// Read a remote object through a persistent disk cache in DIR
    /// (created with mode 0700; refused if another user owns it or others
    /// may write to it): pages read from the network are kept there, and
    /// later runs and other processes read them from the disk. Default:
    /// FAULTMAP_CACHE_DIR in the environment; none without it. Local files
    /// are never cached.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// The most bytes the disk cache keeps (e.g. 50G); cold 4 MiB chunks
    /// are evicted past it. Default: FAULTMAP_CACHE_MAX, else no maximum
    /// (the cache still leaves 5 % of its file system free).
    #[arg(long, value_name = "SIZE", value_parser = units::parse_size)]
    cache_max: Option<u64>,
}

impl CacheArgs {
    /// `config` with the disk cache these arguments name (the
    /// environment's when they name none).
    fn configure(&self, mut config: faultmap::Config) -> faultmap::Config {
        if let Some(dir) = &self.cache_dir {
            // The environment's maximum stands unless --cache-max says.
            let max = config.disk_cache.as_ref().and_then(|c| c.max_bytes);
            config.disk_cache = Some(faultmap::DiskCacheConfig {
                max_bytes: max,
                ..faultmap::DiskCacheConfig::new(dir)
            });
        }
        if let (Some(max), Some(cache)) = (self.cache_max, config.disk_cache.as_mut()) {
            cache.max_bytes = Some(max);
        }
        config
    }

    /// The disk cache these arguments, or the environment, name.
    fn config(&self) -> anyhow::Result<faultmap::DiskCacheConfig> {
        let config = self.configure(faultmap::Config::default());
        config.validate()?;
        config.disk_cache.context(
            "no disk cache: give --cache-dir DIR, or set FAULTMAP_CACHE_DIR in the environment",
        )
    }
}

impl MapArgs {
    /// The page size asked for (4 KiB by default).
    fn page_size(&self) -> faultmap::PageSize {
        self.page_size.unwrap_or_default()
    }

    /// `opts` with the page size and the trace options asked for (the
    /// replayed trace read).
    fn with_trace(&self, mut opts: faultmap::MapOptions) -> anyhow::Result<faultmap::MapOptions> {
        if let Some(size) = self.page_size {
            opts = opts.page_size(size);
        }
        if self.record_trace.is_some() {
            opts = opts.record_trace();
        }
        if let Some(path) = &self.replay_trace {
            opts = opts.replay_trace(faultmap::Trace::load(path)?);
        }
        Ok(opts)
    }

    /// Writes `map`'s trace to the --record-trace file, if one was asked
    /// for: what was written.
    fn save_trace(&self, map: &faultmap::Mapping) -> anyhow::Result<Option<TraceWritten>> {
        let Some(path) = &self.record_trace else {
            return Ok(None);
        };
        let trace = map
            .trace()
            .context("the mapping was made without recording its trace")?;
        save(path, &trace).map(Some)
    }
}

/// What `--record-trace` wrote.
#[derive(Debug, Serialize)]
pub struct TraceWritten {
    file: String,
    pages: u64,
    runs: usize,
    bytes: u64,
}

impl TraceWritten {
    /// One line for the human-readable reports.
    pub fn line(&self) -> String {
        format!(
            "{} pages in {} runs, {} bytes, written to {}",
            self.pages, self.runs, self.bytes, self.file
        )
    }
}

fn save(path: &std::path::Path, trace: &faultmap::Trace) -> anyhow::Result<TraceWritten> {
    let bytes = trace.save(path)?;
    Ok(TraceWritten {
        file: path.display().to_string(),
        pages: trace.pages(),
        runs: trace.runs().len(),
        bytes,
    })
}

/// Options of `faultmap scan`.
#[derive(Debug, Args)]
struct ScanArgs {
    #[command(flatten)]
    map: MapArgs,
    /// Print one JSON object instead of the human-readable report.
    #[arg(long)]
    json: bool,
}

/// Which readahead faultmap runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Readahead {
    /// The kernel's: read-around on a random miss, sequential detection and
    /// ramp-up, async readahead at the marker, the mmap_miss throttle.
    Full,
    /// Read-around only (the readahead comparison's `around`): every miss reads a window of
    /// ra_pages around the faulting page; no sequential detection, no
    /// async readahead.
    Around,
    /// None: a miss reads only the faulting page.
    Off,
}

impl Readahead {
    /// The library's mode.
    pub fn mode(self) -> faultmap::ReadaheadMode {
        match self {
            Readahead::Full => faultmap::ReadaheadMode::Full,
            Readahead::Around => faultmap::ReadaheadMode::AroundOnly,
            Readahead::Off => faultmap::ReadaheadMode::Off,
        }
    }

    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Readahead::Full => "full",
            Readahead::Around => "around",
            Readahead::Off => "off",
        }
    }
}

/// How faultmap's file store reads the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FileIoArg {
    /// pread through the kernel's page cache (large requests thanks to the
    /// kernel's own readahead; the pages are cached twice).
    Buffered,
    /// pread with O_DIRECT, one request per read.
    Direct,
    /// O_DIRECT through io_uring, each read cut into pieces all in flight.
    Uring,
}

impl FileIoArg {
    /// The library's mode.
    pub fn mode(self) -> faultmap::FileIo {
        match self {
            FileIoArg::Buffered => faultmap::FileIo::Buffered,
            FileIoArg::Direct => faultmap::FileIo::Direct,
            FileIoArg::Uring => faultmap::FileIo::Uring,
        }
    }
}

/// The library's file I/O mode for an optional `--file-io`.
pub fn file_io(arg: Option<FileIoArg>) -> faultmap::FileIo {
    arg.map_or_else(faultmap::FileIo::default, FileIoArg::mode)
}

/// How faults reach faultmap (`--delivery`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeliveryArg {
    /// The faulting thread resolves its own fault in a SIGBUS handler
    /// (misses are forwarded to a pager thread); the library's default.
    Signal,
    /// Handler threads read userfaultfd messages; the faulting thread
    /// sleeps in the kernel meanwhile.
    Handler,
}

impl DeliveryArg {
    /// The benchmark's way of faulting.
    pub fn mode(self) -> Fault {
        match self {
            DeliveryArg::Signal => Fault::Signal,
            DeliveryArg::Handler => Fault::Handler,
        }
    }
}

/// A paging engine on the command line (`bench --engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    /// userfaultfd, in each delivery mode of `--delivery`.
    Userfaultfd,
    /// The protect engine (`PROT_NONE`, SIGSEGV, `mprotect`): what runs
    /// where userfaultfd is refused (a default container).
    Protect,
}

/// How a fault reaches faultmap in a benchmark column: the userfaultfd
/// engine in one of its delivery modes, or the protect engine (whose
/// faults are always the faulting thread's, a SIGSEGV, forwarded on a
/// miss).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// userfaultfd, signal delivery (the library's default).
    #[default]
    Signal,
    /// userfaultfd, handler delivery.
    Handler,
    /// The protect engine.
    Protect,
}

impl Fault {
    /// `config` set up for this way of faulting.
    pub fn configure(self, config: faultmap::Config) -> faultmap::Config {
        match self {
            Fault::Signal => config
                .engine(faultmap::Engine::Userfaultfd)
                .delivery(faultmap::Delivery::Signal),
            Fault::Handler => config
                .engine(faultmap::Engine::Userfaultfd)
                .delivery(faultmap::Delivery::Handler),
            Fault::Protect => config.engine(faultmap::Engine::Protect),
        }
    }
}

/// Maps `source` read-only through `pager`: the one place the CLI makes a
/// faultmap mapping.
///
/// `Pager::map` is `unsafe` because the bytes behind a `&[u8]` must not
/// change: the store must return the same bytes every time and nothing may
/// write the object meanwhile. The CLI maps only read-only, and only files
/// it generated itself (the benchmarks) or that the user named (`scan`,
/// `stats`, `bench --file`); like every tool that reads files through
/// `mmap` (ripgrep, memmap2's users), it relies on the user not to write
/// such a file while the command runs, and its `--help` says so.
pub fn map_readonly(
    pager: &faultmap::Pager,
    source: impl faultmap::IntoObject,
    opts: faultmap::MapOptions,
) -> Result<faultmap::Mapping, faultmap::MapError> {
    // SAFETY: see above: the file is not written while the command runs,
    // and the CLI never maps anything writable.
    unsafe { pager.map(source, opts) }
}

/// The name of a delivery mode on the command line and in JSON.
pub fn delivery_name(delivery: Fault) -> &'static str {
    match delivery {
        Fault::Signal => "signal",
        Fault::Handler => "handler",
        Fault::Protect => "protect",
    }
}

/// Options of `faultmap stats`.
#[derive(Debug, Args)]
struct StatsArgs {
    #[command(flatten)]
    map: MapArgs,
    /// The access pattern. The file's pages are cut into T contiguous
    /// parts (on 64 KiB boundaries), one per thread, and each thread runs
    /// the pattern over its part. seq: every 8-byte word in order. rand:
    /// the first word of every page, the pages in a random order (a
    /// fixed-seed permutation). clustered: the part cut into 64 KiB
    /// clusters (16 pages, aligned), the clusters in a random order (a
    /// fixed-seed permutation), the first word of each page of a cluster,
    /// in order.
    #[arg(long, short, value_enum, default_value = "seq", value_name = "PATTERN")]
    access: Access,
    /// How faultmap's file store reads (default: the library's, buffered;
    /// a filesystem without O_DIRECT falls back to buffered, and the report
    /// says which mode was in force).
    #[arg(long, value_enum, value_name = "MODE")]
    file_io: Option<FileIoArg>,
    /// Drop the kernel's page cache first (echo 1 >
    /// /proc/sys/vm/drop_caches; needs root; if not permitted, a message
    /// and the run goes on), so faultmap's store reads come from the disk.
    /// faultmap's own cache is always empty at the start.
    #[arg(long)]
    cold: bool,
    /// faultmap I/O threads reading from the store (default: the library's,
    /// 4).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    io_threads: Option<u16>,
    /// Print one JSON object, {file, access, order, ra_pages, readahead,
    /// seconds, stats: {...}, readahead_stats: {...}, ...}, instead of the
    /// tables.
    #[arg(long)]
    json: bool,
}

/// Options of `faultmap bench`.
#[derive(Debug, Args)]
struct BenchArgs {
    /// Workloads, comma-separated. Default: seq,rand,sparse (the
    /// fault-around benchmark's three synthetic tests); with --cold:
    /// seq,rand,clustered; with --budget: seq,rand,hotcold; with --remote:
    /// seq,rand,clustered (sparse, scattered and pages are warm only,
    /// clustered cold and remote only, hotcold budget only).
    ///
    /// Warm: each thread walks the whole file, in its own mapping.
    ///
    /// rand differs from a fully random word order on purpose: the
    /// pages are visited in a random permutation (fixed seed, one per
    /// thread) and the words of each page in order. Fault-around only sees
    /// the order of the pages' first touches, which is fully random either
    /// way, so the faults are those of a random word order, while a run
    /// takes seconds instead of minutes of cache and TLB misses.
    #[arg(long, short, value_enum, value_delimiter = ',', value_name = "LIST")]
    workload: Vec<Workload>,
    /// faultmap fault-around orders to measure (windows of 2^N pages, 0..=9,
    /// or auto: adaptive fault-around, column order=auto; warm table
    /// only), comma-separated. Default: 0,4,9,auto (--full 0,1,3,4,5,7,9,auto); with
    /// --cold one order, default 4. (--parts and --churn run at order 0.)
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = parse_order)]
    orders: Vec<u8>,
    /// faultmap's page sizes, comma-separated: 4K (default) and 2M (the
    /// data in 2 MiB pages: a hugetlb cache, one fault per 2 MiB, the
    /// fault-around order moot). 2M adds a column page=2M per delivery
    /// mode to the warm table, a column page=2M (full readahead) with
    /// --cold, a row "faultmap page=2M" with --budget. As root the
    /// benchmark grows /proc/sys/vm/nr_hugepages by the huge pages it needs
    /// and takes them out again at the end; without root those columns are
    /// left out, with a line saying why. The `pages` workload measures the
    /// fault path itself.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = parse_page_size,
          conflicts_with_all = ["parts", "churn", "remote"])]
    page_size: Vec<faultmap::PageSize>,
    /// Thread counts, comma-separated. Default: 1,2. Warm: each thread maps
    /// and walks the whole file. With --cold: they apply to seq, whose
    /// threads share one mapping and each read a contiguous 1/T of it (rand
    /// and clustered run on one thread). With --parts and
    /// --churn: the faulting threads (default 1, 2, and the powers of two
    /// up to the CPUs this process may use, and that count).
    #[arg(long, short, value_delimiter = ',', value_name = "LIST",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Vec<u16>,
    /// Size of the generated data file: bytes, or with a K, M or G suffix
    /// (powers of 1024), e.g. 512M. Default: 1G; with --parts 256M; with
    /// --churn 64M; with --budget 4 times the budget.
    #[arg(long, short, value_parser = units::parse_size,
          conflicts_with = "file", value_name = "SIZE")]
    size: Option<u64>,
    /// Benchmark this existing file instead of a generated one (it must not
    /// change during the run).
    #[arg(long, short, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Samples of every cell; the report gives the median (and the min in
    /// JSON). Default: 3 per cell, and up to 11 for the cells that are cheap
    /// enough (2 s per cell in all, within a 150 s run); each JSON row says
    /// how many it has. With --cold, --churn and --remote: 3 per cell;
    /// with --parts: 5; with --budget: 1.
    #[arg(long, short, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    repetitions: Option<u32>,
    /// faultmap's pager threads with signal delivery (they serve the
    /// forwarded misses). Handler delivery runs one handler thread per
    /// CPU, pinned (Config::handler_placement).
    #[arg(long, default_value_t = 1, value_name = "H",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    handler_threads: u16,
    /// Cold I/O: the readahead comparison (see above) instead of the
    /// warm fault-around benchmark.
    #[arg(long)]
    cold: bool,
    /// The lockless page cache benchmark (see above): T threads fault on their
    /// own parts of one cached object, faultmap's lock-free cache against a
    /// global mutex and kernel mmap of a memfd.
    #[arg(long, conflicts_with_all = ["cold", "churn", "orders", "workload"])]
    parts: bool,
    /// The speculative fault benchmark (see above): T threads fault
    /// while another maps and unmaps, speculative region lookup against
    /// classic and kernel mmap of a memfd.
    #[arg(long, conflicts_with_all = ["cold", "orders", "workload"])]
    churn: bool,
    /// A memory budget on an object 4 times its size (see above): faultmap
    /// with Config::memory_budget against kernel mmap under a cgroup v1
    /// memory limit of the same size, on seq, rand and hotcold.
    #[arg(long, conflicts_with_all = [
        "cold", "parts", "churn", "orders", "threads", "delivery"
    ])]
    budget: bool,
    /// With --budget: the budget in MiB (default 256; at least 1). The
    /// generated file is 4 times as large.
    #[arg(long, requires = "budget", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    budget_mib: Option<u64>,
    /// With --churn: how long the threads fault in each sample, in seconds
    /// (default 1; at most 3600).
    #[arg(long, requires = "churn", value_parser = parse_seconds, value_name = "SECONDS")]
    duration: Option<std::time::Duration>,
    /// faultmap's fault delivery modes, comma-separated: signal, handler.
    /// Default: signal,handler for the warm table and --churn, signal for
    /// --parts. Not with --cold (which uses the library's default, signal).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        conflicts_with = "cold",
        value_name = "LIST"
    )]
    delivery: Vec<DeliveryArg>,
    /// faultmap's paging engines, comma-separated: userfaultfd (in each
    /// mode of --delivery), protect (mprotect and SIGSEGV: what runs where
    /// userfaultfd is refused). Default userfaultfd. The warm benchmark
    /// gets a `protect` column per order beside the delivery modes; the
    /// remote benchmark a `faultmap-protect` column (full readahead).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "E,...")]
    engine: Vec<EngineArg>,
    /// With --cold: faultmap's largest readahead window, in pages (0..=16384).
    /// Default: the store's, from the device's read_ahead_kb, like the
    /// kernel's, which this does not change.
    #[arg(long, value_name = "N", requires = "cold")]
    ra_pages: Option<u64>,
    /// With --cold or --budget: how faultmap's file store reads (default
    /// with --cold the library's, buffered; with --budget direct).
    #[arg(long, value_enum, value_name = "MODE")]
    file_io: Option<FileIoArg>,
    /// faultmap I/O threads reading from the store (default: the library's,
    /// 4).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    io_threads: Option<u16>,
    /// Remote objects: faultmap against raw ranged GETs and the FUSE
    /// peers (s3fs, rclone mount, each with kernel mmap) on the project's
    /// own HTTP (nginx) and S3 (versitygw) servers, which it starts and
    /// stops itself (scripts/remote-servers, scripts/fuse-peers), on a
    /// generated object (--size, default 1G), cold caches. Workloads
    /// seq (with --threads), rand and clustered (one thread, a sample of
    /// --sample-pages pages), and batch (rand's pages as 4 KiB rows in
    /// batches of 64, each batch prefetched with prefetch_ranges and then
    /// read; --workload batch). rand also runs faultmap-fixed: the store's
    /// read-around window fixed instead of adaptive.
    #[arg(long, conflicts_with_all = ["cold", "parts", "churn", "budget", "full", "orders", "file"])]
    remote: bool,
    /// With --remote: the stores, comma-separated (default http,s3): http
    /// (nginx), s3 (versitygw), gs (GCS's XML API, scripts/gcs-stub.py), az
    /// (Azure Blob, Azurite; the object is uploaded, about 25 s a GiB). Only
    /// the stores named get the object and a proxy; the FUSE peers (s3fs,
    /// rclone) are S3's and HTTP's only.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "LIST")]
    store: Vec<bench::RemoteStore>,
    /// With --remote: first-byte latencies to add through the proxy, in
    /// milliseconds, comma-separated (default 0; 20 is a cloud object
    /// store's).
    #[arg(long, value_delimiter = ',', value_name = "LIST",
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    latency_ms: Vec<u64>,
    /// With --remote: the pages rand touches (clustered: this many pages
    /// in 64 KiB clusters). Default 300.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    sample_pages: Option<u64>,
    /// With --remote: faultmap's memory budget (bytes, or with a K, M or G
    /// suffix); its goal is a peak within 1 % of it.
    #[arg(long, value_parser = units::parse_size, value_name = "SIZE")]
    memory_budget: Option<u64>,
    /// With --remote: leave out the FUSE peers.
    #[arg(long)]
    no_fuse: bool,
    /// With --remote: the disk cache benchmark. Each workload (default
    /// seq) is read by faultmap without a disk cache, then through
    /// faultmap's disk cache (--cache-dir's mechanism) and through each
    /// FUSE peer's (rclone --vfs-cache-mode full, s3fs use_cache): a first
    /// run on an empty cache, a second run after a first, and a cold
    /// second run (the kernel's page cache dropped first), each run a
    /// process (a mount) of its own. Reports the bytes each run took from
    /// the network and from the disk, and the goals: the second run moves
    /// no object bytes, is 3x faster than the first and at least as fast
    /// as each peer's second run; the first is within 10 % of a run
    /// without the cache.
    #[arg(long)]
    disk_cache: bool,
    /// Many processes, one object: for each count N, N forked processes
    /// read the same remote object (seq: each the whole object; rand: each
    /// the same sample of --sample-pages pages) through the counting proxy,
    /// as faultmap-shared (one mapping made before the fork: the parent's
    /// cache serves every process), faultmap-joined (each process maps the
    /// object itself with sharing on, FAULTMAP_SHARED=1, and joins the cache
    /// of the parent, which mapped it first, over its socket: what unrelated
    /// processes do), faultmap-private (a pager per process) and each FUSE
    /// peer (each process maps the mounted file). Reports the
    /// time until the last process is done, the bytes the server sent, and
    /// the peak of the caches (faultmap's, summed over the processes'
    /// caches; a FUSE peer's, the most any process found resident in the
    /// kernel's one page cache). Implies --remote (its --store,
    /// --latency-ms, --sample-pages, --memory-budget and --no-fuse apply);
    /// the object is 256M unless --size says otherwise.
    #[arg(long, value_delimiter = ',', value_name = "LIST",
          value_parser = clap::value_parser!(u16).range(1..=64),
          conflicts_with_all = ["cold", "parts", "churn", "budget", "full", "orders", "file", "threads"])]
    procs: Vec<u16>,
    /// Print only one JSON document, {"machine": {...}, "results": [...]},
    /// on stdout (progress and notes still go to stderr).
    #[arg(long)]
    json: bool,
    /// The fault-around benchmark's whole table: orders 0,1,3,4,5,7,9,auto
    /// and the budget repetition policy (3 samples per cell, up to 21 for
    /// cells under 20 ms and up to 11 for cheap cells within a 150 s run),
    /// and the uffd-probe's cross-cpu column, about 5 minutes here plus
    /// about 18 s per cross-cpu walk of 1 GiB. Without it, plain `faultmap
    /// bench` measures orders 0,4,9,auto, 3 samples per cell (up to 21 for
    /// cells under 20 ms), and only the same-cpu probe, in about three
    /// minutes.
    #[arg(long, conflicts_with_all = ["cold", "parts", "churn", "budget"])]
    full: bool,
    /// Also draw the results into this SVG file: time and faults against
    /// the fault-around order (kernel columns as reference lines); with
    /// --cold the throughput per engine; with --parts and --churn faults/s
    /// against threads; with --budget the hit ratio and time per engine.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

/// Mapping options at fault-around order `order`, or adaptive for
/// [`faultmap::policy::fault_around::AUTO`] (what [`parse_order`] gives
/// for `auto`).
pub fn order_options(order: u8) -> faultmap::MapOptions {
    if order == faultmap::policy::fault_around::AUTO {
        faultmap::MapOptions::new().fault_around_auto()
    } else {
        faultmap::MapOptions::new().fault_around_order(order)
    }
}

/// An order as reports name it: `0`..`9`, or `auto`.
pub fn order_name(order: u8) -> String {
    if order == faultmap::policy::fault_around::AUTO {
        "auto".into()
    } else {
        order.to_string()
    }
}

/// Serialises an order as JSON: its number, or `"auto"`.
pub fn serialize_order<S: serde::Serializer>(order: &u8, s: S) -> Result<S::Ok, S::Error> {
    if *order == faultmap::policy::fault_around::AUTO {
        s.serialize_str("auto")
    } else {
        s.serialize_u8(*order)
    }
}

/// A paging engine as its name in JSON.
pub fn serialize_engine<S: serde::Serializer>(
    engine: &faultmap::Engine,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(engine.name())
}

/// `--engine`: auto, userfaultfd or protect.
fn parse_engine(s: &str) -> Result<faultmap::Engine, String> {
    s.parse().map_err(|e: faultmap::ConfigError| e.to_string())
}

/// A page size: `4K` or `2M` (or their bytes).
fn parse_page_size(text: &str) -> Result<faultmap::PageSize, String> {
    text.parse()
        .map_err(|e: faultmap::ConfigError| e.to_string())
}

/// A fault-around order: 0..=9, or `auto` (the library's
/// [`faultmap::policy::fault_around::AUTO`]).
fn parse_order(text: &str) -> Result<u8, String> {
    if text.eq_ignore_ascii_case("auto") {
        return Ok(faultmap::policy::fault_around::AUTO);
    }
    match text.parse::<u8>() {
        Ok(order) if order <= faultmap::policy::fault_around::MAX_ORDER => Ok(order),
        _ => Err(format!(
            "not a fault-around order (0..={} or auto): {text}",
            faultmap::policy::fault_around::MAX_ORDER
        )),
    }
}

/// Parses `--duration`: seconds, more than 0 and at most an hour.
fn parse_seconds(text: &str) -> Result<std::time::Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds (e.g. 1 or 0.5)"))?;
    if !(seconds > 0.0 && seconds <= 3600.0) {
        return Err(format!(
            "the duration must be more than 0 and at most 3600 seconds, got {text}"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Scan(args) => scan::run(&args),
        Command::Stats(args) => stats::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Proxy(args) => proxy::run(&args),
        Command::Cache(args) => cache::run(&args),
        Command::BudgetKernel(args) => bench::budget::child(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Not eprintln!: it panics when stderr is closed.
            // `{:#}`: the error and its causes on one line, `: `-separated.
            let _ = writeln!(std::io::stderr(), "faultmap: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
