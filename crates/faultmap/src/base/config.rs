//! The tunables, each bounded and validated here and nowhere else.
//!
//! [`Config`] is per pager; [`MapOptions`] per mapping. The CLI and (later)
//! the bindings build these same types, so a bound is enforced once.

use crate::base::trace::Trace;
use crate::policy::fault_around::{AUTO, DEFAULT_ORDER, MAX_ORDER};
use crate::policy::readahead::Mode;
use std::sync::Arc;
use std::time::Duration;

use crate::sys::{HUGE_PAGE_SIZE, PAGE_SIZE};

/// The most handler threads a pager may have.
pub const MAX_HANDLER_THREADS: usize = 64;

/// The longest a handler may busy-poll for the next fault, in microseconds.
pub const MAX_HANDLER_SPIN_US: u32 = 10_000;

/// The default busy-poll: see [`Config::handler_spin_us`].
pub const DEFAULT_HANDLER_SPIN_US: u32 = 50;

/// The most I/O threads a pager may have.
pub const MAX_IO_THREADS: usize = 64;

/// The largest readahead window a mapping may ask for: 64 MiB.
pub const MAX_RA_PAGES: u64 = 16_384;

/// The smallest memory budget: 1 MiB (a budget must hold a few readahead
/// windows to make progress).
pub const MIN_BUDGET: u64 = 1 << 20;

/// The fewest 2 MiB pages a memory budget over objects of 2 MiB pages
/// holds (16 MiB): the evictor keeps two pages free below its limit and
/// frees down to four below, and a working set needs the rest.
pub const MIN_HUGE_BUDGET_PAGES: u64 = 8;

/// The most times a failed store request is tried again before its pages
/// fail.
pub const MAX_IO_RETRIES: u32 = 16;

/// The default number of store requests in flight ([`Config::io_depth`]).
pub const DEFAULT_IO_DEPTH: usize = 32;

/// The most requests [`Config::io_depth`] allows in flight.
pub const MAX_IO_DEPTH: usize = 4096;

/// The furthest a trace replay may read ahead of the application, in
/// pages: 4 GiB.
pub const MAX_REPLAY_AHEAD: u64 = 1 << 20;

/// The default store timeout: a store call that has not returned after this
/// long fails the faults that wait for it.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest `io_timeout`: a day. Longer is no bound at all, and
/// deadlines past it are computed without overflow.
pub const MAX_IO_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// How many times a failed store request is tried again by default.
pub const DEFAULT_IO_RETRIES: u32 = 2;

/// The default age at which the background flusher writes a dirty page
/// (the kernel's `dirty_expire_centisecs`, 30 s).
pub const DEFAULT_DIRTY_EXPIRE: Duration = Duration::from_secs(30);

/// A tunable out of its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `FAULTMAP_CACHE_MAX` or `DiskCacheConfig::max_bytes` is not a size
    /// above zero.
    #[error("the disk cache's maximum ({CACHE_MAX_ENV}) is not a size above zero: {0}")]
    CacheMax(String),
    /// `DiskCacheConfig::dir` is empty.
    #[error("the disk cache's directory is empty")]
    CacheDir,
    /// `handler_threads` is 0 or above the maximum.
    #[error("handler_threads must be 1..={MAX_HANDLER_THREADS}, got {0}")]
    HandlerThreads(usize),
    /// `memory_budget` is below [`MIN_BUDGET`].
    #[error("memory_budget must be at least {MIN_BUDGET} bytes, got {0}")]
    Budget(u64),
    /// `io_retries` is above `MAX_IO_RETRIES` (16).
    #[error("io_retries must be 0..={MAX_IO_RETRIES}, got {0}")]
    IoRetries(u32),
    /// `io_timeout` is zero or above a day.
    #[error("io_timeout must be above zero and at most {} s", MAX_IO_TIMEOUT.as_secs())]
    IoTimeout,
    /// `dirty_expire` is zero.
    #[error("dirty_expire must be above zero")]
    DirtyExpire,
    /// `io_depth` is 0 or above the maximum.
    #[error("io_depth must be 1..={MAX_IO_DEPTH}, got {0}")]
    IoDepth(usize),
    /// `io_threads` is 0 or above the maximum.
    #[error("io_threads must be 1..={MAX_IO_THREADS}, got {0}")]
    IoThreads(usize),
    /// `ra_pages` is above the maximum.
    #[error("ra_pages must be 0..={MAX_RA_PAGES}, got {0}")]
    RaPages(u64),
    /// `handler_spin_us` is above the maximum.
    #[error("handler_spin_us must be 0..={MAX_HANDLER_SPIN_US}, got {0}")]
    HandlerSpin(u32),
    /// The fault-around order is above 9 (a window larger than a PTE table).
    #[error("fault-around order must be 0..={MAX_ORDER} or auto, got {0}")]
    FaultAroundOrder(u8),
    /// The mapping starts past the object's end (at the end is an empty
    /// mapping).
    #[error("offset {offset} is past the end of the object ({object_len} bytes)")]
    OffsetPastEnd {
        /// The offset asked for.
        offset: u64,
        /// The object's length.
        object_len: u64,
    },
    /// The mapping would extend past the object's end.
    #[error("offset {offset} + length {len} is past the end of the object ({object_len} bytes)")]
    LengthPastEnd {
        /// The offset asked for.
        offset: u64,
        /// The length asked for.
        len: u64,
        /// The object's length.
        object_len: u64,
    },
    /// An advice range is not inside the mapping.
    #[error("advice range {start}..{end} is not inside the mapping ({len} bytes)")]
    AdviseRange {
        /// The range's start.
        start: usize,
        /// The range's end.
        end: usize,
        /// The mapping's length.
        len: usize,
    },
    /// The mapping's length does not fit this machine's address space.
    #[error("a mapping of {0} bytes does not fit the address space")]
    TooLarge(u64),
    /// `replay_ahead` is 0 or above the maximum.
    #[error("replay_ahead must be 1..={MAX_REPLAY_AHEAD} pages, got {0}")]
    ReplayAhead(u64),
    /// A memory budget too small for 2 MiB pages: it must hold
    /// [`MIN_HUGE_BUDGET_PAGES`] of them.
    #[error(
        "a memory budget for 2 MiB pages must hold at least {MIN_HUGE_BUDGET_PAGES} of them, \
         got {0} bytes"
    )]
    HugeBudget(u64),
    /// A page size other than 4 KiB and 2 MiB.
    #[error("page size must be 4K or 2M, got {0:?}")]
    PageSize(String),
    /// An engine name other than `auto`, `userfaultfd` and `protect`.
    #[error("engine must be auto, userfaultfd or protect, got {0:?}")]
    Engine(String),
    /// [`ENGINE_ENV`] names no engine.
    #[error("{ENGINE_ENV} must be auto, userfaultfd or protect, got {0:?}")]
    EngineEnv(String),
}

/// The paging engine a pager runs: how a fault reaches faultmap and how
/// cached pages get mapped. The cache, the I/O path, readahead, the
/// budget, write-back and the statistics are the same under both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    /// [`Engine::Userfaultfd`] if this process can open a userfaultfd with
    /// the features faultmap needs (the system call, then
    /// `/dev/userfaultfd`), else [`Engine::Protect`]. The default. The
    /// pager says which runs and why ([`crate::Pager::engine`]).
    #[default]
    Auto,
    /// Faults arrive through a userfaultfd (`MISSING | MINOR`, and `WP`
    /// for writable mappings); pages are mapped with `UFFDIO_CONTINUE`.
    /// Refused in Docker's, containerd's, CRI-O's and Podman's default
    /// seccomp profiles and absent under gVisor.
    Userfaultfd,
    /// No userfaultfd: a mapping starts `PROT_NONE`, an access raises
    /// SIGSEGV in the faulting thread, and a cached window is mapped with
    /// `mprotect`. Works wherever `mmap` does; see "In containers" in the
    /// README for what it costs.
    Protect,
}

impl Engine {
    /// The engine's name, as [`Engine::from_str`](std::str::FromStr) and
    /// [`ENGINE_ENV`] take it: `auto`, `userfaultfd` or `protect`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Auto => "auto",
            Engine::Userfaultfd => "userfaultfd",
            Engine::Protect => "protect",
        }
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Engine {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Engine::Auto),
            "userfaultfd" | "uffd" => Ok(Engine::Userfaultfd),
            "protect" => Ok(Engine::Protect),
            _ => Err(ConfigError::Engine(s.to_string())),
        }
    }
}

/// The environment variable that overrides [`Config::engine`] (`auto`,
/// `userfaultfd` or `protect`), for every pager of the process.
pub const ENGINE_ENV: &str = "FAULTMAP_ENGINE";

/// The engine the environment asks for ([`ENGINE_ENV`]), if it names one.
pub(crate) fn engine_from_env() -> Result<Option<Engine>, ConfigError> {
    match std::env::var(ENGINE_ENV) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v
            .parse()
            .map(Some)
            .map_err(|_| ConfigError::EngineEnv(v.chars().take(64).collect())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::EngineEnv("(not UTF-8)".into())),
    }
}

/// How faults reach the pager.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// The faulting thread resolves its own fault in a SIGBUS handler
    /// (`UFFD_FEATURE_SIGBUS`); misses are forwarded to a pager thread.
    /// The faster (measured by `faultmap bench`, delivery rows), and the
    /// default. A system call that reads a mapping's page that is not
    /// mapped yet gets `EFAULT`, and threads must not block SIGBUS: see
    /// the README.
    #[default]
    Signal,
    /// Handler threads read fault messages from the userfaultfd; the
    /// faulting thread sleeps in the kernel meanwhile. Serves the kernel's
    /// own accesses (`write(fd, &map[..])`) too.
    Handler,
}

/// Where handler delivery's threads run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HandlerPlacement {
    /// One handler thread per CPU the thread that creates the pager may run
    /// on (the first 64), each pinned to its CPU and sleeping in `poll`
    /// between faults. The one on the faulting thread's CPU runs as soon
    /// as that thread sleeps, and usually takes the fault first, so its
    /// `UFFDIO_CONTINUE` wakes the thread on the same CPU. On a virtual
    /// machine a wake-up across CPUs is an IPI through the hypervisor:
    /// measured here (`faultmap bench`, order 0, one thread), 5.3–5.8 µs
    /// per fault against 27 µs with one floating handler; the bare round
    /// trip costs 3.6 µs on one CPU and 70 µs across CPUs (its
    /// `uffd-probe` columns). Each reads one message at a time (and all
    /// that is pending when an event may be queued behind faults), so
    /// that a fault it did not take stays in the userfaultfd for the next
    /// handler that reads (usually the faulting CPU's, which runs first).
    /// The cost: a fault wakes *every* handler (the kernel wakes all the
    /// userfaultfd's pollers), an IPI to each idle CPU or a preemption on
    /// each busy one, which grows with the CPUs.
    /// `handler_threads` and `handler_spin_us` are not used. The default.
    #[default]
    PerCpu,
    /// `handler_threads` threads that run wherever the scheduler puts them
    /// and poll for `handler_spin_us` before they sleep.
    Floating,
}

/// How a fault finds its region (speculative or classic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RegionLookup {
    /// Lock-free lookup validated by the region's sequence count; the
    /// table's lock only when that fails (the default).
    #[default]
    Speculative,
    /// Always under the table's lock, which `map` and unmap hold for their
    /// whole operation (the kernel's `mmap_lock` before SPF), for
    /// comparison. With signal delivery the SIGBUS handler takes the lock
    /// itself (see `crate::mm::signal` for why that is safe there).
    Classic,
}

/// The size of the pages an object is cached, read and mapped in.
///
/// With [`PageSize::Huge`] the object's cache is a hugetlb memfd
/// (`MFD_HUGETLB`), and a fault maps a whole 2 MiB page with one
/// `UFFDIO_CONTINUE` (one PMD): 512 times fewer faults than 4 KiB pages,
/// and the TLB reach that random access over a large object needs. Every
/// page count of such an object (readahead windows, `ra_pages`, the
/// statistics' pages) counts 2 MiB pages; memory budgets stay in bytes.
/// The pages come from the kernel's pool of 2 MiB pages, which the
/// administrator sizes (`vm.nr_hugepages`): opening an object fails with
/// [`crate::CacheError::HugePages`] when the pool cannot hold it (or its
/// budget), and nothing falls back to 4 KiB pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PageSize {
    /// 4 KiB pages (shmem): the default.
    #[default]
    Base,
    /// 2 MiB pages (hugetlb).
    Huge,
}

impl PageSize {
    /// The page size in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            PageSize::Base => PAGE_SIZE,
            PageSize::Huge => HUGE_PAGE_SIZE,
        }
    }

    /// log2 of [`PageSize::bytes`].
    pub const fn shift(self) -> u32 {
        self.bytes().trailing_zeros()
    }

    /// How many 4 KiB pages one page holds (1 or 512).
    pub(crate) const fn base_pages(self) -> u64 {
        (self.bytes() / PAGE_SIZE) as u64
    }

    /// A page size from its bytes: 4096 or 2097152.
    pub fn from_bytes(bytes: u64) -> Option<PageSize> {
        [PageSize::Base, PageSize::Huge]
            .into_iter()
            .find(|p| p.bytes() as u64 == bytes)
    }
}

impl std::fmt::Display for PageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PageSize::Base => "4K",
            PageSize::Huge => "2M",
        })
    }
}

impl std::str::FromStr for PageSize {
    type Err = ConfigError;

    /// `4K`, `4k`, `4096`; `2M`, `2m`, `2097152`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "4K" | "4k" | "4KiB" | "4096" => Ok(PageSize::Base),
            "2M" | "2m" | "2MiB" | "2097152" => Ok(PageSize::Huge),
            other => Err(ConfigError::PageSize(other.to_string())),
        }
    }
}

/// The configuration of a [`crate::Pager`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Pager threads that resolve faults (default 1: a second one gains
    /// nothing in aggregate on this kernel: a fault is kernel-bound):
    /// with signal delivery they serve the faults that SIGBUS handlers
    /// forward (misses, reads in flight, readahead markers); with handler
    /// delivery and [`HandlerPlacement::Floating`] they read every fault
    /// from the userfaultfd (the default, [`HandlerPlacement::PerCpu`],
    /// runs one per CPU instead).
    pub handler_threads: usize,
    /// Where handler delivery's threads run (default
    /// [`HandlerPlacement::PerCpu`]). Signal delivery's pager threads
    /// (which serve only forwarded misses) are always `handler_threads`
    /// floating threads.
    pub handler_placement: HandlerPlacement,
    /// Floating handler threads only: how long, in microseconds, a
    /// handler thread keeps polling the userfaultfd without sleeping after
    /// it handled a fault (default 50; 0 sleeps in `poll` at once). On a virtual machine whose idle vCPUs
    /// halt at once (this one: `haltpoll.guest_halt_poll_ns=0`), waking a
    /// sleeping handler costs an IPI and a host reschedule, about 40 µs; a
    /// handler that is still polling when the next fault arrives sees it at
    /// once. Measured on a warm sequential scan at order 4: 54 µs per fault
    /// without, 16 µs with 50 µs of polling. The cost is at most this much
    /// CPU time per burst of faults.
    pub handler_spin_us: u32,
    /// Threads that read from the stores (readahead windows, and the part
    /// of a miss the faulting thread waits for), so that handler threads
    /// never block on I/O (default 4: requests in flight at once).
    pub io_threads: usize,
    /// How many store requests the pager keeps in flight at once, over all
    /// its objects (default 32). A store that reads asynchronously (HTTP,
    /// S3) keeps this many requests going on a small runtime of its own,
    /// without a thread each; a synchronous store (a file) has at most
    /// `io_threads` in flight. Reads that a fault waits for, and retries,
    /// are never held back by it.
    pub io_depth: usize,
    /// The paging engine (default [`Engine::Auto`]; [`ENGINE_ENV`] in the
    /// environment overrides it).
    pub engine: Engine,
    /// How faults reach the pager under [`Engine::Userfaultfd`] (default
    /// [`Delivery::Signal`]). Under [`Engine::Protect`] a fault is always
    /// the faulting thread's (a SIGSEGV), forwarded to a pager thread on a
    /// miss as with signal delivery.
    pub delivery: Delivery,
    /// How a fault finds its region (default
    /// [`RegionLookup::Speculative`]).
    pub region_lookup: RegionLookup,
    /// Benchmark and tests only: the Protect engine maps read-only
    /// mappings with `mprotect` too, as on kernels without guard markers
    /// on shared memory (before 6.15).
    #[doc(hidden)]
    pub protect_mprotect_only: bool,
    /// Benchmark only (`faultmap bench parts`): page lookups serialise on
    /// one global mutex, the cache that the lockless page cache replaced. Never faster.
    #[doc(hidden)]
    pub bench_global_cache_lock: bool,
    /// The most bytes of object data the pager keeps cached, over all the
    /// objects it opened (`None`, the default: no limit). Near the budget
    /// an evictor thread frees the pages a CLOCK hand finds unused
    /// (`crate::mm::evict`); readahead shrinks to what fits.
    pub memory_budget: Option<u64>,
    /// How many times a failed store request is tried again before its
    /// pages fail (default 2; the faults then get SIGBUS).
    pub io_retries: u32,
    /// How long a store call may take before the faults waiting for it
    /// fail (SIGBUS) and the error is reported (default 30 s).
    pub io_timeout: Duration,
    /// How long a page may stay dirty before the background flusher writes
    /// it back (default 30 s, the kernel's `dirty_expire_centisecs`).
    pub dirty_expire: Duration,
    /// The page size of the objects the pager opens (default
    /// [`PageSize::Base`], 4 KiB); [`MapOptions::page_size`] chooses per
    /// object mapped from a store.
    pub page_size: PageSize,
    /// Share object caches with other processes of this user (default:
    /// on when the environment has `FAULTMAP_SHARED=1`, [`SHARED_ENV`]).
    /// A read-only mapping of an object whose store names its version
    /// ([`crate::Store::share_key`]: files, HTTP and S3 objects) is then
    /// served from the cache of the first process that mapped that
    /// version, under that process's memory budget and policy; the first
    /// process listens for the others on a socket only this user can
    /// reach. See "Many processes" in the README.
    pub shared: bool,
    /// A persistent cache of remote objects' bytes on local disk (default:
    /// `FAULTMAP_CACHE_DIR` in the environment, [`CACHE_DIR_ENV`], sized
    /// by `FAULTMAP_CACHE_MAX`, [`CACHE_MAX_ENV`]). Objects opened by URL
    /// under this configuration (`open_url_with` with
    /// `RemoteTuning::for_config`) read through it: a page read from the
    /// network is kept there, and read from there by later runs and other
    /// processes. See `crate::store::disk` and "Disk cache" in the README.
    pub disk_cache: Option<DiskCacheConfig>,
}

/// Where and how large the disk cache of remote objects is
/// ([`Config::disk_cache`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCacheConfig {
    /// The cache's directory: created with mode 0700 if missing; refused
    /// if another user owns it or others may write to it.
    pub dir: std::path::PathBuf,
    /// The most bytes the cache keeps on disk (`None`, the default: only
    /// `min_free_bytes` bounds it). Cold chunks are evicted past it.
    pub max_bytes: Option<u64>,
    /// The free space the cache leaves on its file system (`None`, the
    /// default: 5 % of the file system, as mountpoint-s3 keeps). Cold
    /// chunks are evicted, and nothing more is written, below it.
    pub min_free_bytes: Option<u64>,
}

impl DiskCacheConfig {
    /// A cache in `dir`, with the default bounds.
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_bytes: None,
            min_free_bytes: None,
        }
    }

    /// At most `bytes` on disk.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// At least `bytes` left free on the file system.
    pub fn min_free_bytes(mut self, bytes: u64) -> Self {
        self.min_free_bytes = Some(bytes);
        self
    }
}

/// The environment variable that turns the disk cache on
/// ([`Config::disk_cache`]): its directory.
pub const CACHE_DIR_ENV: &str = "FAULTMAP_CACHE_DIR";

/// The environment variable that bounds the disk cache: a size, `50G`
/// ([`parse_size`]).
pub const CACHE_MAX_ENV: &str = "FAULTMAP_CACHE_MAX";

/// The disk cache the environment asks for: [`CACHE_DIR_ENV`], bounded by
/// [`CACHE_MAX_ENV`]. A malformed size is refused by [`Config::validate`].
fn disk_cache_from_env() -> Option<DiskCacheConfig> {
    let dir = std::env::var_os(CACHE_DIR_ENV).filter(|d| !d.is_empty())?;
    let max = std::env::var(CACHE_MAX_ENV)
        .ok()
        .and_then(|v| parse_size(&v).ok());
    Some(DiskCacheConfig {
        max_bytes: max,
        ..DiskCacheConfig::new(dir)
    })
}

/// Parses a size: a number of bytes, optionally with a K/M/G/T suffix
/// (powers of 1024, optionally followed by `iB` or `B`, any case). Zero is
/// refused.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 4096, 512K, 8M, 1G)"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("`{suffix}` is not a size suffix (K, M, G or T)")),
    };
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))?;
    if bytes == 0 {
        return Err("the size must be at least 1 byte".into());
    }
    Ok(bytes)
}

/// The environment variable that turns [`Config::shared`] on by default
/// (`1`).
pub const SHARED_ENV: &str = "FAULTMAP_SHARED";

/// Whether the environment asks for sharing ([`SHARED_ENV`] is `1`).
fn shared_from_env() -> bool {
    std::env::var_os(SHARED_ENV).is_some_and(|v| v == "1")
}

impl Default for Config {
    fn default() -> Self {
        Self {
            handler_threads: 1,
            handler_placement: HandlerPlacement::default(),
            handler_spin_us: DEFAULT_HANDLER_SPIN_US,
            io_threads: 4,
            io_depth: DEFAULT_IO_DEPTH,
            engine: Engine::default(),
            delivery: Delivery::default(),
            region_lookup: RegionLookup::default(),
            bench_global_cache_lock: false,
            protect_mprotect_only: false,
            memory_budget: None,
            io_retries: DEFAULT_IO_RETRIES,
            io_timeout: DEFAULT_IO_TIMEOUT,
            dirty_expire: DEFAULT_DIRTY_EXPIRE,
            page_size: PageSize::Base,
            shared: shared_from_env(),
            disk_cache: disk_cache_from_env(),
        }
    }
}

impl Config {
    /// Sets whether the pager shares object caches with other processes
    /// ([`Config::shared`]).
    pub fn shared(mut self, on: bool) -> Self {
        self.shared = on;
        self
    }

    /// Sets the paging engine ([`Config::engine`]).
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// Sets the page size of the objects the pager opens.
    pub fn page_size(mut self, size: PageSize) -> Self {
        self.page_size = size;
        self
    }

    /// Sets the number of handler threads.
    pub fn handler_threads(mut self, n: usize) -> Self {
        self.handler_threads = n;
        self
    }

    /// Sets the number of I/O threads.
    pub fn io_threads(mut self, n: usize) -> Self {
        self.io_threads = n;
        self
    }

    /// Sets how many store requests may be in flight at once.
    pub fn io_depth(mut self, n: usize) -> Self {
        self.io_depth = n;
        self
    }

    /// Sets how faults reach the pager.
    pub fn delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Sets how a fault finds its region.
    pub fn region_lookup(mut self, lookup: RegionLookup) -> Self {
        self.region_lookup = lookup;
        self
    }

    /// Sets where handler delivery's threads run.
    pub fn handler_placement(mut self, placement: HandlerPlacement) -> Self {
        self.handler_placement = placement;
        self
    }

    /// Sets the handler threads' busy-poll time in microseconds.
    pub fn handler_spin_us(mut self, us: u32) -> Self {
        self.handler_spin_us = us;
        self
    }

    /// Sets the memory budget in bytes (rounded down to whole pages).
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// Sets how many times a failed store request is retried.
    pub fn io_retries(mut self, n: u32) -> Self {
        self.io_retries = n;
        self
    }

    /// Sets the store timeout.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.io_timeout = timeout;
        self
    }

    /// Sets the age at which the background flusher writes dirty pages.
    pub fn dirty_expire(mut self, age: Duration) -> Self {
        self.dirty_expire = age;
        self
    }

    /// Checks every bound.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(b) = self.memory_budget {
            if b < MIN_BUDGET {
                return Err(ConfigError::Budget(b));
            }
            if self.page_size == PageSize::Huge && b < MIN_HUGE_BUDGET_PAGES * HUGE_PAGE_SIZE as u64
            {
                return Err(ConfigError::HugeBudget(b));
            }
        }
        if self.io_retries > MAX_IO_RETRIES {
            return Err(ConfigError::IoRetries(self.io_retries));
        }
        if self.io_timeout.is_zero() || self.io_timeout > MAX_IO_TIMEOUT {
            return Err(ConfigError::IoTimeout);
        }
        if self.dirty_expire.is_zero() {
            return Err(ConfigError::DirtyExpire);
        }
        if !(1..=MAX_HANDLER_THREADS).contains(&self.handler_threads) {
            return Err(ConfigError::HandlerThreads(self.handler_threads));
        }
        if !(1..=MAX_IO_THREADS).contains(&self.io_threads) {
            return Err(ConfigError::IoThreads(self.io_threads));
        }
        if !(1..=MAX_IO_DEPTH).contains(&self.io_depth) {
            return Err(ConfigError::IoDepth(self.io_depth));
        }
        if self.handler_spin_us > MAX_HANDLER_SPIN_US {
            return Err(ConfigError::HandlerSpin(self.handler_spin_us));
        }
        // The environment's maximum, when it is the one that counts: a
        // cache without a maximum of its own.
        let env_max = std::env::var(CACHE_MAX_ENV).ok();
        let uses_env = self
            .disk_cache
            .as_ref()
            .is_some_and(|c| c.max_bytes.is_none());
        if let Some(max) = env_max.filter(|_| uses_env) {
            if let Err(why) = parse_size(&max) {
                return Err(ConfigError::CacheMax(why));
            }
        }
        if let Some(cache) = &self.disk_cache {
            if cache.dir.as_os_str().is_empty() {
                return Err(ConfigError::CacheDir);
            }
            if cache.max_bytes == Some(0) {
                return Err(ConfigError::CacheMax("0 bytes".into()));
            }
        }
        Ok(())
    }
}

/// How to map an object: which part, and with which policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapOptions {
    offset: u64,
    len: Option<u64>,
    order: u8,
    /// Adaptive fault-around ([`MapOptions::fault_around_auto`]): `order`
    /// is then unused.
    auto: bool,
    ra_pages: Option<u64>,
    readahead: Mode,
    fixed_read_around: bool,
    /// Record the first-touch trace ([`MapOptions::record_trace`]).
    record: bool,
    /// The trace to replay ([`MapOptions::replay_trace`]).
    replay: Option<Arc<Trace>>,
    /// How far the replay reads ahead, in pages.
    replay_ahead: Option<u64>,
    /// The page size asked for ([`MapOptions::page_size`]).
    page_size: Option<PageSize>,
}

impl Default for MapOptions {
    fn default() -> Self {
        Self {
            offset: 0,
            len: None,
            order: DEFAULT_ORDER,
            auto: false,
            ra_pages: None,
            readahead: Mode::Full,
            fixed_read_around: false,
            record: false,
            replay: None,
            replay_ahead: None,
            page_size: None,
        }
    }
}

/// The part of an object a mapping covers, resolved against its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    /// The object page the mapping's first page maps.
    pub(crate) first_page: u64,
    /// Pages mapped (0 for an empty mapping).
    pub(crate) pages: u64,
    /// Where the caller's first byte is inside the first page.
    pub(crate) lead: usize,
    /// The caller's length in bytes.
    pub(crate) len: usize,
}

impl MapOptions {
    /// The whole object, fault-around order 4 (the kernel's 64 KiB).
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the mapping at byte `offset` of the object (any offset: the
    /// mapping's slice starts exactly there, as with memmap2).
    pub fn offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// Maps `len` bytes (default: to the end of the object).
    pub fn len(mut self, len: u64) -> Self {
        self.len = Some(len);
        self
    }

    /// Sets the fault-around order: windows of `2^order` pages, 0..=9
    /// (default 4, the kernel's `fault_around_bytes`, 64 KiB).
    pub fn fault_around_order(mut self, order: u8) -> Self {
        self.order = order;
        self.auto = false;
        self
    }

    /// Adaptive fault-around: each fault's window follows the access
    /// pattern, from one page for isolated accesses to a whole page table
    /// (512 pages) for walks and dense random access
    /// ([`crate::policy::fault_around::auto`], whose documentation says
    /// how, and where it overshoots: a few random pages per 2 MiB).
    pub fn fault_around_auto(mut self) -> Self {
        self.auto = true;
        self
    }

    /// The fault-around order ([`crate::policy::fault_around::AUTO`] for
    /// adaptive).
    pub fn order(&self) -> u8 {
        if self.auto {
            AUTO
        } else {
            self.order
        }
    }

    /// Sets the largest readahead window in pages, overriding the store's
    /// default ([`crate::Store::ra_pages`]); 0 disables readahead.
    pub fn ra_pages(mut self, pages: u64) -> Self {
        self.ra_pages = Some(pages);
        self
    }

    /// The readahead window asked for, if any.
    pub fn ra_pages_override(&self) -> Option<u64> {
        self.ra_pages
    }

    /// Selects the readahead algorithm (default: the kernel's, [`Mode::Full`]).
    pub fn readahead(mut self, mode: Mode) -> Self {
        self.readahead = mode;
        self
    }

    /// The readahead algorithm.
    pub fn readahead_mode(&self) -> Mode {
        self.readahead
    }

    /// Keeps the read-around window of a remote store at its fixed size
    /// (`Store::around_pages`) instead of adapting it to how much of it is
    /// used (the default; see `policy::readahead`, "Adaptive
    /// read-around"). For comparisons.
    pub fn fixed_read_around(mut self) -> Self {
        self.fixed_read_around = true;
        self
    }

    /// Whether the read-around window adapts (see
    /// [`MapOptions::fixed_read_around`]).
    pub fn adaptive_read_around(&self) -> bool {
        !self.fixed_read_around
    }

    /// Records the order in which the mapping's pages are first touched:
    /// `Mapping::trace` returns it as a [`Trace`] to save and replay on a
    /// later mapping of the same object ([`MapOptions::replay_trace`]).
    ///
    /// Only faults are seen, so a recording mapping maps one page per
    /// fault (fault-around order 0, whatever [`MapOptions::fault_around_order`]
    /// says): each page touched costs one fault, a few µs when cached.
    pub fn record_trace(mut self) -> Self {
        self.record = true;
        self
    }

    /// Whether the mapping records its trace.
    pub fn records_trace(&self) -> bool {
        self.record
    }

    /// Replays `trace` as prefetch: a thread reads the trace's pages in
    /// the order they were first touched, each widened to the aligned
    /// block the size of the window the mapping's read-around reads on a
    /// miss (one page with readahead off), each block once, consecutive
    /// blocks merged and cut into the store's largest requests, many in
    /// flight. It reads those not cached yet, at most
    /// [`MapOptions::replay_ahead`] pages past those the application has
    /// used (the requests of the read-around blocks its faults' windows
    /// lay in, in whatever order and from however many threads; a request
    /// it read and the application skipped counts as used once the
    /// faults have used `replay_ahead` pages more, spending as many, so
    /// that the replay never goes faster than the faults). The trace must have
    /// been recorded on an object of this length and version
    /// ([`crate::Store::version`]: for a file, its modification time):
    /// else mapping fails with [`crate::TraceError::Mismatch`]. Pages of
    /// the trace outside the mapping are left out.
    pub fn replay_trace(mut self, trace: impl Into<Arc<Trace>>) -> Self {
        self.replay = Some(trace.into());
        self
    }

    /// The trace the mapping replays.
    pub fn trace_to_replay(&self) -> Option<&Arc<Trace>> {
        self.replay.as_ref()
    }

    /// How far a replay reads ahead of the application, in pages
    /// (1..=[`MAX_REPLAY_AHEAD`]; default: [`Config::io_depth`] read-around
    /// windows, at least 4096 pages, 16 MiB, and at most 8192, 32 MiB: 16
    /// MiB with readahead off or a disk with 128 KiB read-ahead, 32 MiB on
    /// a remote store or a disk with 1 MiB or more). Under a memory
    /// budget, at most a quarter of the budget. The pages used are those
    /// of the schedule's pieces the faults' windows reached; a piece the
    /// application skips stops counting against this once it has used
    /// this many more (see [`MapOptions::replay_trace`]).
    pub fn replay_ahead(mut self, pages: u64) -> Self {
        self.replay_ahead = Some(pages);
        self
    }

    /// The page size of the object: a store mapped with these options is
    /// opened with pages of this size (default: the pager's,
    /// [`Config::page_size`]); an [`crate::Object`] of another page size
    /// is refused ([`crate::MapError::PageSize`]). With 2 MiB pages the
    /// fault-around order is moot (a fault maps its 2 MiB page), and
    /// `ra_pages` and `replay_ahead` count 2 MiB pages.
    pub fn page_size(mut self, size: PageSize) -> Self {
        self.page_size = Some(size);
        self
    }

    /// The page size asked for, if any.
    pub fn page_size_override(&self) -> Option<PageSize> {
        self.page_size
    }

    /// The replay's distance asked for, if any.
    pub fn replay_ahead_pages(&self) -> Option<u64> {
        self.replay_ahead
    }

    /// Checks the bounds that do not depend on the object (the order);
    /// [`crate::Pager::map`] checks the rest against the object's length.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.auto && self.order > MAX_ORDER {
            return Err(ConfigError::FaultAroundOrder(self.order));
        }
        if let Some(pages) = self
            .replay_ahead
            .filter(|&p| p == 0 || p > MAX_REPLAY_AHEAD)
        {
            return Err(ConfigError::ReplayAhead(pages));
        }
        if let Some(pages) = self.ra_pages.filter(|&p| p > MAX_RA_PAGES) {
            return Err(ConfigError::RaPages(pages));
        }
        Ok(())
    }

    /// Checks the options against an object of `object_len` bytes in
    /// pages of `page_size`.
    pub(crate) fn resolve(
        &self,
        object_len: u64,
        page_size: PageSize,
    ) -> Result<Extent, ConfigError> {
        self.validate()?;
        let page = page_size.bytes() as u64;
        if self.offset > object_len {
            return Err(ConfigError::OffsetPastEnd {
                offset: self.offset,
                object_len,
            });
        }
        let len = self.len.unwrap_or(object_len - self.offset);
        let end = self
            .offset
            .checked_add(len)
            .filter(|&end| end <= object_len)
            .ok_or(ConfigError::LengthPastEnd {
                offset: self.offset,
                len,
                object_len,
            })?;
        let first_page = self.offset / page;
        let pages = if len == 0 {
            0
        } else {
            end.div_ceil(page) - first_page
        };
        let too_large = || ConfigError::TooLarge(len);
        let len = usize::try_from(len).map_err(|_| too_large())?;
        pages
            .checked_mul(page)
            .and_then(|bytes| usize::try_from(bytes).ok())
            .ok_or_else(too_large)?;
        Ok(Extent {
            first_page,
            pages,
            lead: (self.offset % page) as usize,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_windows_and_refuses_bad_ones() {
        let o = MapOptions::new();
        let e = o.resolve(10_000, PageSize::Base).unwrap();
        assert_eq!((e.first_page, e.pages, e.lead, e.len), (0, 3, 0, 10_000));
        let e = o
            .clone()
            .offset(5000)
            .len(4000)
            .resolve(10_000, PageSize::Base)
            .unwrap();
        assert_eq!((e.first_page, e.pages, e.lead, e.len), (1, 2, 904, 4000));
        let e = o
            .clone()
            .offset(4096)
            .len(0)
            .resolve(10_000, PageSize::Base)
            .unwrap();
        assert_eq!((e.pages, e.len), (0, 0));
        assert_eq!(o.resolve(0, PageSize::Base).unwrap().pages, 0);
        assert_eq!(
            o.clone()
                .offset(10_000)
                .resolve(10_000, PageSize::Base)
                .unwrap()
                .pages,
            0
        );
        assert!(matches!(
            o.clone().offset(10_001).resolve(10_000, PageSize::Base),
            Err(ConfigError::OffsetPastEnd { .. })
        ));
        assert!(matches!(
            o.clone()
                .offset(1)
                .len(10_000)
                .resolve(10_000, PageSize::Base),
            Err(ConfigError::LengthPastEnd { .. })
        ));
        assert!(matches!(
            o.clone()
                .offset(1)
                .len(u64::MAX)
                .resolve(10_000, PageSize::Base),
            Err(ConfigError::LengthPastEnd { .. })
        ));
        assert_eq!(
            o.clone()
                .fault_around_order(10)
                .resolve(10_000, PageSize::Base),
            Err(ConfigError::FaultAroundOrder(10))
        );
        // 2 MiB pages: a mapping at an unaligned offset starts at its
        // page, and the tail page is whole.
        const M: u64 = HUGE_PAGE_SIZE as u64;
        let e = o
            .clone()
            .offset(M + 5)
            .len(M)
            .resolve(3 * M + 1, PageSize::Huge)
            .unwrap();
        assert_eq!(
            (e.first_page, e.pages, e.lead, e.len),
            (1, 2, 5, M as usize)
        );
        assert_eq!(o.resolve(3 * M + 1, PageSize::Huge).unwrap().pages, 4);
        assert_eq!("2M".parse(), Ok(PageSize::Huge));
        assert_eq!("4096".parse(), Ok(PageSize::Base));
        assert!(matches!(
            "1G".parse::<PageSize>(),
            Err(ConfigError::PageSize(_))
        ));
        assert_eq!(PageSize::from_bytes(2 << 20), Some(PageSize::Huge));
        assert_eq!(PageSize::Huge.shift(), 21);
        assert_eq!(
            Config::default().handler_threads(0).validate(),
            Err(ConfigError::HandlerThreads(0))
        );
    }
}
