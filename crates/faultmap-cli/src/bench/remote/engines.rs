//! The engines of `faultmap bench --remote`, each reading one remote object
//! cold through the fault-injecting proxy (which counts every engine's
//! requests the same way, and adds the first-byte latency):
//!
//! - `raw-get`: the client library itself (`object_store`), ranged GETs
//!   of one size with a fixed number in flight, every byte summed: the
//!   limit of the link and the server;
//! - `faultmap`: a mapping of the object ([`faultmap::HttpStore`],
//!   [`faultmap::S3Store`], [`faultmap::GcsStore`] or
//!   [`faultmap::AzureStore`]) read by the workload, with full readahead
//!   or read-around only;
//! - `s3fs`, `rclone`: the FUSE mounts of `scripts/fuse-peers`, each file
//!   read through a kernel `mmap` (`MAP_SHARED`), its page cache dropped
//!   first (`posix_fadvise(DONTNEED)`). S3 and HTTP only: `gs` and `az`
//!   have no FUSE peer ([`StoreKind::has_fuse_peers`]).
//!
//! Every client is pointed at the proxy: the HTTP URL's host, S3's
//! endpoint, GCS's base URL (with the stub's service account, which turns
//! OAuth off), Azure's endpoint with Azurite's account in its path
//! (`http://proxy/devstoreaccount1`: with an endpoint given the client is
//! not in emulator mode, so the path carries the account, as the
//! emulator's URLs do, and the account's key signs).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use faultmap::{
    AzureOptions, AzureStore, Config, GcsOptions, GcsStore, HttpStore, MapOptions, Pager,
    RemoteTuning, S3Options, S3Store, Store, Trace,
};
use faultmap_proxy::Proxy;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::access::{sum_words, AccessPlan};
use crate::bench::grid::Sample;

/// Which server an object is on.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// nginx, plain HTTP ranges.
    Http,
    /// versitygw, S3.
    S3,
    /// scripts/gcs-stub.py, Google Cloud Storage's XML API (no FUSE peer).
    Gs,
    /// Azurite, Azure Blob Storage (no FUSE peer).
    Az,
}

impl StoreKind {
    /// Its name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Http => "http",
            StoreKind::S3 => "s3",
            StoreKind::Gs => "gs",
            StoreKind::Az => "az",
        }
    }

    /// Whether `scripts/fuse-peers` mounts a FUSE peer over it (s3fs and
    /// rclone over S3, rclone over HTTP; none over GCS or Azure).
    pub fn has_fuse_peers(self) -> bool {
        matches!(self, StoreKind::Http | StoreKind::S3)
    }
}

/// Azurite's development account and its key, which Microsoft publishes
/// (the same in every Azurite; `object_store` uses them in emulator mode,
/// which an explicit endpoint turns off).
pub const AZURITE_ACCOUNT: (&str, &str) = (
    "devstoreaccount1",
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
);

/// Where the benchmark's object is, as each engine reaches it.
pub struct Target<'a> {
    pub kind: StoreKind,
    /// The proxy in front of the store's server.
    pub proxy: &'a Proxy,
    /// Every store's proxy: all must be quiet before a run starts.
    pub proxies: Vec<&'a Proxy>,
    /// The largest first-byte latency any proxy adds in this run.
    pub latency: Duration,
    /// The object's name in the HTTP root, the bucket or the container.
    pub name: &'a str,
    /// The bucket (S3, GCS) or the container (Azure); empty for HTTP.
    pub bucket: &'a str,
    /// The GCS stub's service-account JSON (`gcs_base_url`,
    /// `disable_oauth`): the GCS clients' credentials; empty otherwise.
    pub gcs_account: &'a str,
    /// The object's length.
    pub len: u64,
}

impl Target<'_> {
    /// The URL faultmap names the object by.
    pub fn url(&self) -> String {
        match self.kind {
            StoreKind::Http => format!("{}/{}", self.proxy.url(), self.name),
            StoreKind::S3 => format!("s3://{}/{}", self.bucket, self.name),
            StoreKind::Gs => format!("gs://{}/{}", self.bucket, self.name),
            StoreKind::Az => format!("az://{}/{}", self.bucket, self.name),
        }
    }

    /// Azure's endpoint through the proxy: the account in its path.
    fn azure_endpoint(&self) -> String {
        format!("{}/{}", self.proxy.url(), AZURITE_ACCOUNT.0)
    }

    /// A faultmap store of the object, through the proxy.
    pub fn store(&self, tuning: RemoteTuning) -> Result<Box<dyn Store>> {
        Ok(match self.kind {
            StoreKind::Http => Box::new(HttpStore::open_with(&self.url(), tuning)?),
            StoreKind::S3 => {
                let options = S3Options {
                    endpoint: Some(self.proxy.url()),
                    allow_http: Some(true),
                    tuning,
                    ..S3Options::default()
                };
                Box::new(S3Store::open_with(&self.url(), &options)?)
            }
            StoreKind::Gs => {
                let options = GcsOptions {
                    endpoint: Some(self.proxy.url()),
                    service_account_key: Some(self.gcs_account.to_string()),
                    allow_http: Some(true),
                    tuning,
                };
                Box::new(GcsStore::open_with(&self.url(), &options)?)
            }
            StoreKind::Az => {
                let (account, key) = AZURITE_ACCOUNT;
                let options = AzureOptions {
                    endpoint: Some(self.azure_endpoint()),
                    credentials: Some((account.to_string(), key.to_string())),
                    allow_http: Some(true),
                    tuning,
                };
                Box::new(AzureStore::open_with(&self.url(), &options)?)
            }
        })
    }

    /// The client library's own client for the object, through the proxy.
    fn client(&self) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
        let options = object_store::ClientOptions::new()
            .with_allow_http(true)
            .with_timeout(std::time::Duration::from_secs(120));
        let path = ObjectPath::from(self.name);
        let client: Arc<dyn ObjectStore> = match self.kind {
            StoreKind::Http => Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(self.proxy.url())
                    .with_client_options(options)
                    .build()?,
            ),
            StoreKind::S3 => Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(self.bucket)
                    .with_endpoint(self.proxy.url())
                    .with_client_options(options)
                    .build()?,
            ),
            StoreKind::Gs => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::new()
                    .with_service_account_key(self.gcs_account)
                    .with_bucket_name(self.bucket)
                    .with_base_url(&self.proxy.url())
                    .with_client_options(options)
                    .build()?,
            ),
            StoreKind::Az => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::new()
                    .with_account(AZURITE_ACCOUNT.0)
                    .with_access_key(AZURITE_ACCOUNT.1)
                    .with_container_name(self.bucket)
                    .with_endpoint(self.azure_endpoint())
                    .with_client_options(options)
                    .build()?,
            ),
        };
        Ok((client, path))
    }
}

/// The proxy's counts over `f` (which returns the seconds, the peak
/// bytes and the checksum), as a sample: the requests (`io_count`), the
/// bytes that came back (`io_bytes`) and those asked for
/// (`request_bytes`).
fn counted(target: &Target<'_>, f: impl FnOnce() -> Result<(f64, u64, u64)>) -> Result<Sample> {
    quiesce(&target.proxies, target.latency);
    let proxy = target.proxy;
    let before = proxy.stats();
    let (seconds, peak_bytes, checksum) = f()?;
    let d = proxy.stats().since(&before);
    Ok(Sample {
        seconds,
        io_count: Some(d.requests),
        io_bytes: Some(d.body_bytes),
        request_bytes: Some(d.range_bytes),
        peak_bytes: Some(peak_bytes),
        checksum: Some(checksum),
        ..Sample::default()
    })
}

/// Waits until every proxy has been quiet for 100 ms plus twice the
/// largest first-byte `latency` (a request a proxy holds that long shows no
/// progress meanwhile): reads a previous run left in flight (a dropped
/// pager's, or a FUSE daemon's readahead, which goes on downloading
/// hundreds of MiB after its run ended, on either store) end before the
/// next run starts, so no run shares the link with another's leftovers.
/// After 60 s it says so and goes on.
fn quiesce(proxies: &[&Proxy], latency: Duration) {
    let quiet = Duration::from_millis(100).saturating_add(latency.saturating_mul(2));
    let stats = || proxies.iter().map(|p| p.stats()).collect::<Vec<_>>();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let before = stats();
        std::thread::sleep(quiet);
        if stats() == before {
            return;
        }
    }
    super::super::note("the proxies were still busy after 60 s: this run shares the link");
}

/// `raw-get`: the whole object in ranged GETs of `request` bytes,
/// `depth` in flight, each summed as it comes. Only `seq` (the link's
/// limit).
pub fn raw_get(target: &Target<'_>, request: u64, depth: usize) -> Result<Sample> {
    let (client, path) = target.client()?;
    let rt = runtime()?;
    let len = target.len;
    counted(target, || {
        let start = Instant::now();
        let ranges: Vec<_> = (0..len.div_ceil(request))
            .map(|i| i * request..((i + 1) * request).min(len))
            .collect();
        let sum = rt.block_on(async {
            let mut sums = futures::stream::iter(ranges)
                .map(|r| {
                    let (client, path) = (client.clone(), path.clone());
                    async move {
                        let bytes = client.get_range(&path, r.clone()).await?;
                        if bytes.len() as u64 != r.end - r.start {
                            bail!("a ranged GET of {r:?} returned {} bytes", bytes.len());
                        }
                        Ok(sum_words(&bytes))
                    }
                })
                .buffer_unordered(depth);
            let mut total = 0u64;
            while let Some(s) = sums.next().await {
                total = total.wrapping_add(s?);
            }
            Ok::<_, anyhow::Error>(total)
        })?;
        Ok((start.elapsed().as_secs_f64(), request * depth as u64, sum))
    })
}

/// The runtime of the raw-get engine: the same shape as faultmap's
/// network runtime (two workers).
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let _ = RT.set(rt);
    RT.get().context("no runtime")
}

/// `faultmap`: a fresh pager (a cold cache) with `config` and `budget`
/// maps the object; `plan` walks it on its threads.
pub fn faultmap(
    target: &Target<'_>,
    plan: &AccessPlan,
    mut opts: MapOptions,
    config: &Config,
    budget: Option<u64>,
    replay: Option<Arc<Trace>>,
) -> Result<Sample> {
    let mut config = config.clone();
    if let Some(b) = budget {
        config = config.memory_budget(b);
    }
    let pager = Pager::new(config)?;
    let object = pager.open(target.store(RemoteTuning::default())?)?;
    if let Some(trace) = replay {
        opts = opts.replay_trace(trace);
    }
    // SAFETY: the object is the benchmark's own, pinned by its ETag or
    // Last-Modified: it does not change under the mapping.
    let map = unsafe { pager.map(&object, opts)? };
    counted(target, || {
        let (seconds, sum) = timed_walk(plan, &map)?;
        drop(map);
        Ok((seconds, pager.memory().peak, sum))
    })
}

/// `plan` walked over `map` on its threads: the seconds and the wrapping
/// sum of what it read; a batch's failed prefetch is the error.
fn timed_walk(plan: &AccessPlan, map: &faultmap::Mapping) -> Result<(f64, u64)> {
    let failed = std::sync::Mutex::new(None);
    let timed = crate::timed::run(plan.threads(), |i| plan.walk_mapping(i, map, &failed))?;
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.context("a batch's prefetch failed"));
    }
    let sum = timed.sums.iter().fold(0u64, |a, s| a.wrapping_add(*s));
    Ok((timed.seconds, sum))
}

/// The access trace of `plan` on the object: one cold run of a recording
/// mapping, untimed, through the proxy without latency (the trace is the
/// same at any latency).
pub fn record(target: &Target<'_>, plan: &AccessPlan, config: &Config) -> Result<Trace> {
    let faults = target.proxy.faults();
    let latency = faults.latency();
    faults.set_latency(Duration::ZERO);
    let recorded = (|| {
        let pager = Pager::new(config.clone())?;
        let object = pager.open(target.store(RemoteTuning::default())?)?;
        // SAFETY: as in `faultmap`.
        let map = unsafe { pager.map(&object, MapOptions::new().record_trace())? };
        crate::timed::run(plan.threads(), |i| plan.walk(i, &map))?;
        map.trace().context("the recording mapping has no trace")
    })();
    faults.set_latency(latency);
    recorded
}

/// A FUSE peer: the mounted file, its page cache dropped, mapped
/// `MAP_SHARED` and walked by `plan`.
pub fn fuse(path: &Path, target: &Target<'_>, plan: &AccessPlan) -> Result<Sample> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: posix_fadvise on an open descriptor; no memory is passed.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    // SAFETY: the benchmark's own object on a read-only mount: nothing
    // writes it while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("mmap(MAP_SHARED) of {}", path.display()))?;
    counted(target, || {
        let timed = crate::timed::run(plan.threads(), |i| plan.walk(i, &map))?;
        let sum = timed.sums.iter().fold(0u64, |a, s| a.wrapping_add(*s));
        let resident = faultmap::sys::mincore_resident(map.as_ptr(), map.len()).unwrap_or(0) as u64
            * faultmap::PAGE_SIZE as u64;
        Ok((timed.seconds, resident, sum))
    })
}

/// Which run of a disk cache a cell measures (`bench --remote
/// --disk-cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskRun {
    /// The first run, on an empty cache.
    First,
    /// The second run, in another process, after a first one: the cache's
    /// files may be in the kernel's page cache (a restart on the same
    /// machine).
    Second,
    /// The second run with the kernel's page cache dropped before it: the
    /// cache's files are read from the disk.
    SecondCold,
}

impl DiskRun {
    /// The column's suffix.
    pub fn name(self) -> &'static str {
        match self {
            DiskRun::First => "first",
            DiskRun::Second => "second",
            DiskRun::SecondCold => "second-cold",
        }
    }
}

/// faultmap with its disk cache in `dir`: a forked process reads the
/// object through a fresh pager and the cache (`CachedStore`); for
/// `run`'s second runs another process read it first, untimed, into the
/// same emptied cache (and the kernel's page cache is dropped after it for
/// [`DiskRun::SecondCold`]: `None` if it cannot be). The sample's
/// `disk_bytes` is what the measured process read from the disk.
pub fn disk_cached(
    target: &Target<'_>,
    plan: &AccessPlan,
    config: &Config,
    dir: &Path,
    run: DiskRun,
) -> Result<Option<Sample>> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("emptying {}", dir.display())),
    }
    if run != DiskRun::First {
        disk_process(target, plan, config, dir)?;
        if run == DiskRun::SecondCold && !drop_page_cache()? {
            return Ok(None);
        }
    }
    let mut disk_bytes = 0;
    let mut sample = counted(target, || {
        let r = disk_process(target, plan, config, dir)?;
        disk_bytes = r.disk_bytes;
        Ok((r.seconds, r.peak, r.sum))
    })?;
    sample.disk_bytes = Some(disk_bytes);
    Ok(Some(sample))
}

/// Writes back dirty pages and drops the kernel's page cache: `false`
/// (after a note) if this process may not.
pub fn drop_page_cache() -> Result<bool> {
    // SAFETY: sync takes nothing and cannot fail.
    unsafe { libc::sync() };
    match crate::kernel::CacheDropper::probe(
        crate::kernel::DROP_CACHES,
        crate::kernel::Caches::PageCache,
    ) {
        Ok(_) => Ok(true),
        Err(e) => {
            super::super::note(&format!(
                "cannot drop the kernel's page cache ({e}): the cold second runs are left out"
            ));
            Ok(false)
        }
    }
}

/// What a disk cache's reading process reports.
struct DiskProcess {
    seconds: f64,
    sum: u64,
    peak: u64,
    disk_bytes: u64,
}

/// One process (a fork of this one) reads the object through the disk
/// cache in `dir` and a pager of its own.
fn disk_process(
    target: &Target<'_>,
    plan: &AccessPlan,
    config: &Config,
    dir: &Path,
) -> Result<DiskProcess> {
    // The child makes a pager, a disk cache and a network runtime of its
    // own (each made anew in a forked child).
    let child = Forked::spawn(|| match disk_walk(target, plan, config, dir) {
        Ok(r) => Some([r.seconds.to_bits(), r.sum, r.peak, r.disk_bytes]),
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "faultmap: a disk cache run failed: {e:#}"
            );
            None
        }
    })?;
    let Some([seconds, sum, peak, disk_bytes]) = child.reap::<4>()? else {
        bail!("a disk cache's reading process failed (its error is above)");
    };
    Ok(DiskProcess {
        seconds: f64::from_bits(seconds),
        sum,
        peak,
        disk_bytes,
    })
}

/// A disk cache process's walk, timed: a pager, the store through the
/// cache, the plan's walk; the pager's reads finish before it reports.
fn disk_walk(
    target: &Target<'_>,
    plan: &AccessPlan,
    config: &Config,
    dir: &Path,
) -> Result<DiskProcess> {
    let pager = Pager::new(config.clone())?;
    let cache_config = faultmap::DiskCacheConfig::new(dir);
    let cache = faultmap::DiskCache::open(&cache_config)?;
    // The tuning names the cache, so that the open leaves out its range
    // probe when the cache holds the object (as `open_url_with` does).
    let tuning = RemoteTuning {
        disk_cache: Some(cache_config),
        ..RemoteTuning::default()
    };
    let wait = tuning.request_timeout;
    let store = match faultmap::CachedStore::new(target.store(tuning)?, cache, wait)? {
        Ok(store) => Arc::new(store),
        Err(_) => bail!("the object has no version to key a disk cache by"),
    };
    let object = pager.open(store.clone())?;
    // SAFETY: as in `faultmap`.
    let map = unsafe { pager.map(&object, MapOptions::new())? };
    let (seconds, sum) = timed_walk(plan, &map)?;
    drop(map);
    let peak = pager.memory().peak;
    drop(object);
    drop(pager);
    // Pages are handed over first and written after: all on the disk
    // before the process reports (and exits).
    store.wait_written(Duration::from_secs(60));
    Ok(DiskProcess {
        seconds,
        sum,
        peak,
        disk_bytes: store.stats().disk_bytes,
    })
}

/// How `procs` processes read the object (`faultmap bench --procs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Procs<'a> {
    /// One pager maps the object; `n` forked children read it through the
    /// mapping they inherited: one cache, served by the parent.
    Shared,
    /// `n` forked children each make a pager and map the object: `n`
    /// caches.
    Private,
    /// As `Private`, with sharing on: one pager maps the object first and
    /// owns its cache; each child's mapping joins it over the owner's
    /// socket (`Config::shared`), as an unrelated process's would.
    Joined,
    /// `n` forked children each map the FUSE peer's file.
    Fuse(&'a Path),
}

/// `n` processes (forks of this one) each walk `plan`'s part 0 (seq: the
/// whole object; rand and clustered: the same sample), all at once, timed
/// from the first fork to the last exit. The peak is the cache's: the
/// parent pager's with [`Procs::Shared`], the sum of the children's with
/// [`Procs::Private`], the most any child found resident with
/// [`Procs::Fuse`] (the kernel's one page cache). Every child's checksum
/// must be the same.
pub fn procs(
    target: &Target<'_>,
    plan: &AccessPlan,
    n: usize,
    how: Procs<'_>,
    config: &Config,
) -> Result<Sample> {
    use std::os::fd::AsRawFd;
    // Sharing on, in the user's own rendezvous directory: the parent's
    // mapping owns the cache (a dead owner's socket of an earlier run is
    // replaced), the children's join it.
    let config = &match how {
        Procs::Joined => config.clone().shared(true),
        _ => config.clone(),
    };
    let shared = match how {
        Procs::Shared | Procs::Joined => {
            let pager = Pager::new(config.clone())?;
            let object = pager.open(target.store(RemoteTuning::default())?)?;
            // SAFETY: as in `faultmap`.
            let map = unsafe { pager.map(&object, MapOptions::new())? };
            if how == Procs::Joined && *map.sharing() != faultmap::Sharing::Owner {
                bail!(
                    "the first mapping does not own the cache: {:?} (sharing {}, page size {:?})",
                    map.sharing(),
                    config.shared,
                    object.page_size()
                );
            }
            Some((pager, map))
        }
        _ => {
            if let Procs::Fuse(path) = how {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                // SAFETY: posix_fadvise on an open descriptor.
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
            None
        }
    };
    counted(target, || {
        let start = Instant::now();
        let mut children = Vec::new();
        for _ in 0..n {
            // The child walks memory, or makes a pager of its own (a
            // forked child's network runtime is made anew).
            children.push(Forked::spawn(|| {
                let shared = shared.as_ref().map(|s| &s.1);
                let (sum, peak) = child_walk(target, plan, how, shared, config).ok()?;
                Some([sum, peak])
            })?);
        }
        let mut sums = Vec::new();
        let mut peak = 0u64;
        for child in children {
            let Some([sum, child_peak]) = child.reap::<2>()? else {
                bail!("a reading process could not map the object");
            };
            sums.push(sum);
            peak = match how {
                Procs::Private => peak + child_peak,
                _ => peak.max(child_peak),
            };
        }
        let seconds = start.elapsed().as_secs_f64();
        if sums.windows(2).any(|w| w[0] != w[1]) {
            bail!("the processes read different bytes: checksums {sums:x?}");
        }
        if let Some((pager, _)) = &shared {
            peak = pager.memory().peak;
        }
        Ok((seconds, peak, sums.first().copied().unwrap_or(0)))
    })
}

/// A forked copy of the benchmark that reports some words through a pipe.
struct Forked {
    pid: libc::pid_t,
    /// The pipe's read end.
    read_end: libc::c_int,
}

impl Forked {
    /// Forks a child that runs `body`, writes the words it returns (all
    /// `u64::MAX` for `None`) to a pipe and `_exit`s: it never returns
    /// into the benchmark.
    fn spawn<const N: usize>(body: impl FnOnce() -> Option<[u64; N]>) -> Result<Forked> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe2: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the child runs `body`, writes and `_exit`s below; it
        // never returns into the benchmark.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            let words = body().unwrap_or([u64::MAX; N]);
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            // SAFETY: writes the bytes of a live vector, then leaves.
            unsafe {
                libc::write(fds[1], bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
        }
        // SAFETY: the parent's copy of the write end.
        unsafe { libc::close(fds[1]) };
        Ok(Forked {
            pid,
            read_end: fds[0],
        })
    }

    /// Waits for the child and reads its `N` words: `None` if it reported
    /// none, an error if it died or wrote fewer.
    fn reap<const N: usize>(self) -> Result<Option<[u64; N]>> {
        let mut bytes = vec![0u8; N * 8];
        // SAFETY: reads at most the vector's length into it (blocking
        // until the child writes or exits).
        let got = unsafe { libc::read(self.read_end, bytes.as_mut_ptr().cast(), bytes.len()) };
        let mut status = 0;
        // SAFETY: reaps the child this forked; closes its pipe.
        unsafe {
            libc::waitpid(self.pid, &mut status, 0);
            libc::close(self.read_end);
        }
        if got != (N * 8) as isize || !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            bail!("a reading process failed (status {status:#x})");
        }
        let mut words = [0u64; N];
        for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap_or_default());
        }
        Ok((words != [u64::MAX; N]).then_some(words))
    }
}

/// A reading process's walk: its checksum and its cache's peak bytes.
fn child_walk(
    target: &Target<'_>,
    plan: &AccessPlan,
    how: Procs<'_>,
    inherited: Option<&faultmap::Mapping>,
    config: &Config,
) -> Result<(u64, u64)> {
    match how {
        Procs::Shared => {
            let map = inherited.context("no inherited mapping")?;
            Ok((plan.walk(0, map), 0))
        }
        Procs::Private | Procs::Joined => {
            let pager = Pager::new(config.clone())?;
            let object = pager.open(target.store(RemoteTuning::default())?)?;
            // SAFETY: as in `faultmap`.
            let map = unsafe { pager.map(&object, MapOptions::new())? };
            if how == Procs::Joined && *map.sharing() != faultmap::Sharing::Joined {
                bail!("a reading process did not join: {:?}", map.sharing());
            }
            let sum = plan.walk(0, &map);
            Ok((sum, pager.memory().peak))
        }
        Procs::Fuse(path) => {
            let file = std::fs::File::open(path)?;
            // SAFETY: as in `fuse`.
            let map = unsafe { memmap2::Mmap::map(&file) }?;
            let sum = plan.walk(0, &map);
            let resident = faultmap::sys::mincore_resident(map.as_ptr(), map.len()).unwrap_or(0)
                as u64
                * faultmap::PAGE_SIZE as u64;
            Ok((sum, resident))
        }
    }
}

/// The fault path's cost per fault, in microseconds, on a cached object
/// (16 MiB in memory, fault-around off): `(in-process, forked child,
/// pages a child's fault mapped)`. In-process is the fault path of a
/// process that resolves its own faults (what a design with the cache's
/// bookkeeping in shared memory would give each process), one page a
/// fault; a forked child's faults go to the parent that owns the cache
/// and back (`mm::guest`), and map a child region's larger fault-around
/// window each (the pager's fault count tells how many there were).
/// Medians of `reps`.
pub fn fault_path_costs(config: &Config, reps: usize) -> Result<(f64, f64, f64)> {
    const LEN: usize = 16 << 20;
    let pages = LEN / faultmap::PAGE_SIZE;
    let pager = Pager::new(config.clone())?;
    let object = pager.open(faultmap::MemStore::new("fault-path", vec![7u8; LEN]))?;
    let opts = MapOptions::new().fault_around_order(0);
    let touch = |base: usize| {
        let mut sum = 0u64;
        for p in 0..pages {
            // SAFETY: inside a live mapping of LEN bytes.
            sum += u64::from(unsafe {
                std::ptr::read_volatile((base + p * faultmap::PAGE_SIZE) as *const u8)
            });
        }
        sum
    };
    // Cached first.
    {
        // SAFETY: the benchmark's own bytes.
        let map = unsafe { pager.map(&object, opts.clone())? };
        touch(map.as_ptr() as usize);
    }
    let mut own = Vec::new();
    let mut guest = Vec::new();
    for _ in 0..reps {
        // SAFETY: as above.
        let map = unsafe { pager.map(&object, opts.clone())? };
        let base = map.as_ptr() as usize;
        let start = Instant::now();
        touch(base);
        own.push(start.elapsed().as_secs_f64() * 1e6 / pages as f64);
        drop(map);
        // SAFETY: as above.
        let map = unsafe { pager.map(&object, opts.clone())? };
        let base = map.as_ptr() as usize;
        let faults_before = pager.stats().pgfault;
        let start = Instant::now();
        // SAFETY: the child touches the inherited mapping and _exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            touch(base);
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: reaps the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            bail!("the faulting child failed (status {status:#x})");
        }
        let seconds = start.elapsed().as_secs_f64();
        let faults = pager.stats().pgfault.saturating_sub(faults_before).max(1);
        guest.push((seconds * 1e6 / faults as f64, pages as f64 / faults as f64));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let per_fault = median(guest.iter().map(|g| g.0).collect());
    let per_window = median(guest.iter().map(|g| g.1).collect());
    Ok((median(own), per_fault, per_window))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GCS stub's service account, as `scripts/remote-servers` writes
    /// it.
    const GCS_ACCOUNT: &str = r#"{"gcs_base_url": "http://127.0.0.1:9", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}"#;

    #[test]
    fn every_store_names_its_object_and_builds_its_client_through_the_proxy() {
        // Nothing listens upstream: building a client sends no request.
        let proxy = Proxy::start("127.0.0.1:9".parse().unwrap()).unwrap();
        let kinds = <StoreKind as clap::ValueEnum>::value_variants();
        for &kind in kinds {
            let target = Target {
                kind,
                proxy: &proxy,
                proxies: vec![&proxy],
                latency: Duration::ZERO,
                name: "bench-1",
                bucket: if kind == StoreKind::Http {
                    ""
                } else {
                    "faultmap"
                },
                gcs_account: GCS_ACCOUNT,
                len: 1,
            };
            let url = target.url();
            let want = match kind {
                StoreKind::Http => format!("{}/bench-1", proxy.url()),
                _ => format!("{}://faultmap/bench-1", kind.name()),
            };
            assert_eq!(url, want);
            let (client, path) = target.client().unwrap();
            assert_eq!(path.as_ref(), "bench-1");
            // Its configuration names where it sends its requests: the
            // proxy (a URL's port), and Azurite's account in the path.
            let shown = format!("{client:?}");
            let port = proxy.addr().port();
            let at_proxy = shown.contains(&format!("127.0.0.1:{port}"))
                || shown.contains(&format!("port: Some({port})"));
            assert!(at_proxy, "{kind:?} not through the proxy");
            if kind == StoreKind::Az {
                assert!(shown.contains("path: \"/devstoreaccount1\""), "{kind:?}");
            }
        }
        assert_eq!(
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            ["http", "s3", "gs", "az"],
            "the names on the command line are the JSON's"
        );
        assert!(kinds.iter().all(|k| {
            let clap_name = clap::ValueEnum::to_possible_value(k).unwrap();
            clap_name.get_name() == k.name()
        }));
    }
}
