//! faultmap for Python: the extension module `faultmap._faultmap`, which
//! the package `faultmap` (`python/faultmap/`) re-exports.
//!
//! Two classes over the Rust library: `Pager` (a [`fm::Pager`]: its
//! userfaultfd, threads and memory budget, shared by its mappings) and
//! `Mapping` (a [`fm::Mapping`] or [`fm::MappingMut`]), which exports
//! the buffer protocol, so that `memoryview(m)` and `numpy.frombuffer(m)`
//! read the mapped bytes in place; and the function `open`, which maps
//! with a default pager made on first use.
//!
//! # The rules this module keeps
//!
//! - **Lifetime.** A buffer export holds a reference to its `Mapping`
//!   (Python's `Py_buffer.obj`), so the mapping outlives every memoryview
//!   and array over it; `close()` while exports live raises `BufferError`,
//!   as `mmap.mmap.close()` does. Exports are counted under the mapping's
//!   lock, in `__getbuffer__` and `__releasebuffer__`, which run with the
//!   GIL held, as does `close()`.
//! - **Waiting.** The GIL is released around every call that may wait on a
//!   store or a disk (opening an object, `prefetch`, `flush`,
//!   `invalidate`, copying a slice out). Such a call holds its own
//!   reference to the Rust mapping (an `Arc`), so a `close()` from another
//!   thread meanwhile only drops the `Mapping`'s reference: the range is
//!   unmapped when that call ends.
//! - **Errors.** A faultmap error becomes `OSError(errno, message)`, which
//!   Python turns into its subclass (`FileNotFoundError` for `ENOENT`,
//!   `PermissionError`, `IsADirectoryError`, ...); an `EINVAL` (a bad
//!   option) becomes `ValueError`. The message is faultmap's, with its
//!   causes: the library's errors hold no credential.
//! - **Writes.** `close()` writes a writable mapping's dirty pages back
//!   before it lets go (another thread's call may hold the mapping a while
//!   longer), and an `atexit` hook writes back the writable mappings never
//!   freed (`_flush_at_exit`): their pages live in faultmap's cache, not
//!   the kernel's, and would go with the process.
//! - **fork.** A mapping opened before `fork` works in the child: the
//!   library maps its range again there and the parent serves the
//!   child's faults from its cache (see "fork" in the library's
//!   `api/pager.rs`). In the child only the bytes can be used (`data()`:
//!   the buffer protocol, slices, `array`); everything else about a
//!   `Mapping` (`flush`, `advise`, `stats`), and a `Pager` made before the
//!   fork, raise `RuntimeError` there (each records
//!   `fm::fork_generation()`; dropping one there is harmless, the library
//!   leaves the parent's things be); the default pager of `open` is made
//!   anew in the child.
//!
//! Written with PyO3 (the buffer protocol through its `__getbuffer__`
//! slots and `PyBuffer_FillInfo`, in the stable ABI since Python 3.11).

use std::error::Error;
use std::ffi::c_int;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{
    PyBufferError, PyImportError, PyIndexError, PyOSError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PySlice, PyTuple};

use fm::{
    Advice, Config, Delivery, DiskCacheConfig, FileStore, MapOptions, PageSize, ReadaheadMode,
    Store,
};

/// The delivery of a pager made without one: handler threads, so that the
/// kernel's own reads of a mapping (`f.write(m)`, `sock.sendall(m)`,
/// `os.write(fd, m)`) wait for their pages instead of failing with
/// `EFAULT`. See "Fault delivery" in `python/README.md` for the
/// measurements behind this choice.
const DEFAULT_DELIVERY: Delivery = Delivery::Handler;

/// A faultmap error as the Python exception of its class.
fn py_err(e: &(dyn Error + 'static)) -> PyErr {
    let errno = fm::errno_of(e);
    let text = fm::error_text(e);
    if errno == libc::EINVAL {
        PyValueError::new_err(text)
    } else {
        // OSError(errno, text) is constructed as its errno's subclass.
        PyOSError::new_err((errno, text))
    }
}

/// Locks `m`, through a poisoned lock (the state stays consistent: every
/// update under it is a single assignment).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's fork generation, to tell a forked child from its parent
/// (the library's count of forks; a pid can be reused).
fn generation() -> u64 {
    fm::fork_generation()
}

/// A pager: a paging engine (userfaultfd, or mprotect where containers
/// refuse it), the threads that serve its faults and read its stores, and
/// a memory budget, shared by the mappings it makes.
///
/// memory_budget: the most bytes of cache its objects may hold together
///     (at least 1 MiB; None: no budget). Pages beyond it are evicted in
///     CLOCK order (recently used pages stay) and read again when touched.
/// io_threads: threads reading stores (None: faultmap's default).
/// engine: "auto" (the default: userfaultfd if this process may have one,
///     else "protect"), "userfaultfd", or "protect" (no userfaultfd: pages
///     are mapped with mprotect from a SIGSEGV handler; for containers
///     whose seccomp profile refuses userfaultfd, and gVisor). The
///     environment's FAULTMAP_ENGINE overrides it; Pager.engine and
///     Pager.engine_why say which runs and why.
/// delivery: "handler" (the default for Python: handler threads serve
///     every fault, including the kernel's own reads of a mapping in
///     f.write(m)) or "signal" (the faulting thread serves a cached page
///     itself, in a SIGBUS handler: faster for warm scans, but a system
///     call reading a page not yet mapped fails with EFAULT).
/// page_size: the page size of the objects its open() maps without a
///     page_size of their own: "4K" or 4096 (None: the default), "2M" or
///     2097152 (2 MiB pages from the kernel's pool, vm.nr_hugepages; see
///     faultmap.open).
/// io_timeout: seconds (a float above 0) a store request may take, and
///     the deadline of a whole open of a remote object, its retries
///     included (None: 30). A read that takes longer fails (SIGBUS at the
///     access, an entry in io_errors()); an open raises TimeoutError.
/// io_retries: times a failed store request is tried again, 0..=16
///     (None: 2). At open, a timeout is not tried again.
/// shared: share the caches of read-only mappings with the other
///     processes of this user that map the same object version (a file's
///     device, inode, size and mtime; a remote object's URL and ETag or
///     version): the first to map it owns the cache, the others' reads are
///     served from it, under its memory budget (None: on when the
///     environment has FAULTMAP_SHARED=1). Mapping.sharing says what a
///     mapping got.
/// disk_cache: a directory (str or os.PathLike) that keeps the pages of
///     the remote objects this pager opens (http(s)://, s3://, gs://,
///     az://; never local files) on disk, for later runs and other
///     processes to read from there instead of the network (None: the
///     environment's FAULTMAP_CACHE_DIR, else no disk cache). It is
///     created with mode 0700 if missing; opening a remote object raises
///     OSError, naming the directory and why, if it cannot be made or is
///     not safe (another user owns it, or others may write to it).
///     Mapping.disk_cache_stats() says what a mapping read from it.
/// disk_cache_max: the most bytes the disk cache keeps: an int, or a size
///     such as "50G" (a K, M, G or T suffix: powers of 1024); cold chunks
///     are evicted past it (None: the environment's FAULTMAP_CACHE_MAX,
///     else no maximum; the cache always leaves 5 % of its file system
///     free). With disk_cache=None it bounds the environment's cache.
#[pyclass(module = "faultmap", frozen)]
struct Pager {
    inner: Arc<fm::Pager>,
    delivery: Delivery,
    page_size: PageSize,
    /// The process that made it; its threads exist there alone.
    born: u64,
}

impl Pager {
    /// A pager with these settings (None: faultmap's default for each).
    #[allow(clippy::too_many_arguments)]
    fn make(
        memory_budget: Option<u64>,
        io_threads: Option<usize>,
        delivery: Option<&str>,
        page_size: Option<PageSize>,
        io: IoSettings,
        shared: Option<bool>,
        engine: Option<&str>,
        disk: DiskCacheSettings,
    ) -> PyResult<Pager> {
        let engine = match engine {
            None => fm::Engine::Auto,
            Some(name) => name
                .parse()
                .map_err(|e: fm::ConfigError| PyValueError::new_err(e.to_string()))?,
        };
        let delivery = match delivery {
            None => DEFAULT_DELIVERY,
            Some("handler") => Delivery::Handler,
            Some("signal") => Delivery::Signal,
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "delivery must be \"handler\" or \"signal\", not {other:?}"
                )))
            }
        };
        let page_size = page_size.unwrap_or_default();
        let mut config = Config::default()
            .delivery(delivery)
            .page_size(page_size)
            .engine(engine);
        if let Some(on) = shared {
            config = config.shared(on);
        }
        if let Some(bytes) = memory_budget {
            config = config.memory_budget(bytes);
        }
        if let Some(n) = io_threads {
            config = config.io_threads(n);
        }
        if let Some(timeout) = io.timeout {
            config = config.io_timeout(timeout);
        }
        if let Some(n) = io.retries {
            config = config.io_retries(n);
        }
        disk.apply(&mut config);
        let inner = fm::Pager::new(config).map_err(|e| py_err(&e))?;
        Ok(Pager {
            inner: Arc::new(inner),
            delivery,
            page_size,
            born: generation(),
        })
    }

    /// The pager, unless this is a forked child of the process that made
    /// it.
    fn live(&self) -> PyResult<&Arc<fm::Pager>> {
        if self.born != generation() {
            return Err(PyRuntimeError::new_err(
                "this Pager was made before fork(): its threads do not exist in \
                 the child; make a new Pager in the child",
            ));
        }
        Ok(&self.inner)
    }
}

#[pymethods]
impl Pager {
    #[new]
    #[pyo3(signature = (*, memory_budget=None, io_threads=None, delivery=None, page_size=None,
                        io_timeout=None, io_retries=None, shared=None, engine=None,
                        disk_cache=None, disk_cache_max=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        memory_budget: Option<u64>,
        io_threads: Option<usize>,
        delivery: Option<String>,
        page_size: Option<Bound<'_, PyAny>>,
        io_timeout: Option<f64>,
        io_retries: Option<u32>,
        shared: Option<bool>,
        engine: Option<String>,
        disk_cache: Option<Bound<'_, PyAny>>,
        disk_cache_max: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Pager> {
        let page_size = page_size.as_ref().map(page_size_of).transpose()?;
        let disk = DiskCacheSettings {
            dir: disk_cache.as_ref().map(cache_dir_of).transpose()?,
            max: disk_cache_max.as_ref().map(cache_max_of).transpose()?,
        };
        let io = IoSettings {
            timeout: io_timeout.map(seconds_of).transpose()?,
            retries: io_retries,
        };
        py.detach(|| {
            Pager::make(
                memory_budget,
                io_threads,
                delivery.as_deref(),
                page_size,
                io,
                shared,
                engine.as_deref(),
                disk,
            )
        })
    }

    /// Maps an object with this pager; the same as faultmap.open(...,
    /// pager=self).
    #[pyo3(signature = (path_or_url, *, offset=0, length=None, writable=false,
                        fault_around_order=None, readahead=None, memory_budget=None,
                        record_trace=false, replay_trace=None, page_size=None,
                        allow_unpinned=false))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        slf: Bound<'_, Self>,
        path_or_url: &Bound<'_, PyAny>,
        offset: u64,
        length: Option<u64>,
        writable: bool,
        fault_around_order: Option<Bound<'_, PyAny>>,
        readahead: Option<String>,
        memory_budget: Option<u64>,
        record_trace: bool,
        replay_trace: Option<Bound<'_, PyAny>>,
        page_size: Option<Bound<'_, PyAny>>,
        allow_unpinned: bool,
    ) -> PyResult<Mapping> {
        let page_size = match &page_size {
            Some(size) => page_size_of(size)?,
            None => slf.get().page_size,
        };
        if memory_budget.is_some() && page_size != slf.get().page_size {
            // The library opens an object with a budget of its own in its
            // pager's page size only (`fm::Pager::open_with_budget`).
            return Err(PyValueError::new_err(format!(
                "memory_budget= opens the object in its pager's page size ({}), not \
                 page_size={:?}: give the page size to the pager instead \
                 (faultmap.Pager(page_size={:?}))",
                slf.get().page_size,
                page_size.to_string(),
                page_size.to_string(),
            )));
        }
        let request = Request {
            target: target_of(path_or_url)?,
            offset,
            length,
            writable,
            fault_around_order: fault_around_order.as_ref().map(order_of).transpose()?,
            readahead: readahead_mode(readahead.as_deref())?,
            memory_budget,
            record_trace,
            replay_trace: replay_trace.as_ref().map(path_of).transpose()?,
            page_size,
            allow_unpinned,
        };
        let pager = slf.get().live()?.clone();
        let mapping = slf.py().detach(move || request.map(&pager))?;
        if mapping.writable {
            if let Some(map) = &lock(&mapping.state).map {
                remember_writable(map);
            }
        }
        Ok(mapping)
    }

    /// The pager's counters (all its mappings'), named as in the Rust
    /// library's `Stats`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.live()?.stats())
    }

    /// The pager's readahead table (`RaStats`): a row per kind of
    /// readahead, and how many read-ahead pages were used.
    fn ra_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.live()?.ra_stats())
    }

    /// The pager's memory: {"budget", "cached", "peak", "active"} in bytes.
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.live()?.memory())
    }

    /// The store failures of the pager's objects, newest last: dicts with
    /// "object", "offset", "len", "kind" and "message".
    fn io_errors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        reports(py, &self.live()?.io_errors())
    }

    /// Whether the kernel's own reads of a mapping (f.write(m),
    /// os.write(fd, m), sock.sendall(m)) wait for their pages: True with
    /// handler delivery when the process may serve kernel faults (root, or
    /// read-write access to /dev/userfaultfd).
    #[getter]
    fn serves_kernel_faults(&self) -> bool {
        self.delivery == Delivery::Handler && self.inner.serves_kernel_faults()
    }

    /// "handler" or "signal".
    #[getter]
    fn delivery(&self) -> &'static str {
        delivery_name(self.delivery)
    }

    /// The paging engine that runs: "userfaultfd" or "protect".
    #[getter]
    fn engine(&self) -> &'static str {
        self.inner.engine().engine.name()
    }

    /// Why that engine runs: who asked for it, or what engine="auto"
    /// found (a userfaultfd refused, as in a default container).
    #[getter]
    fn engine_why(&self) -> String {
        self.inner.engine().why.clone()
    }

    /// The protect engine's memory areas, for the process: {"areas",
    /// "peak", "mark", "resets", "guard_regions", "child_revokes",
    /// "child_revokes_failed"} (None under the userfaultfd engine).
    fn areas<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.inner.areas().map(|a| to_py(py, &a)).transpose()
    }

    /// The page size in bytes of the objects its open() maps without a
    /// page_size of their own: 4096 or 2097152.
    #[getter]
    fn page_size(&self) -> usize {
        self.page_size.bytes()
    }

    /// The directory of the disk cache its remote objects are read
    /// through (Pager(disk_cache=...), or the environment's
    /// FAULTMAP_CACHE_DIR), as a pathlib.Path, or None.
    #[getter]
    fn disk_cache(&self) -> Option<PathBuf> {
        let cache = self.inner.config().disk_cache.as_ref()?;
        Some(cache.dir.clone())
    }

    /// The most bytes that disk cache keeps, or None (no cache, or no
    /// maximum).
    #[getter]
    fn disk_cache_max(&self) -> Option<u64> {
        self.inner.config().disk_cache.as_ref()?.max_bytes
    }

    fn __repr__(&self) -> String {
        match self.live() {
            Ok(p) => format!(
                "<faultmap.Pager delivery={} mappings={} cached={}>",
                delivery_name(self.delivery),
                p.mappings(),
                p.memory().cached
            ),
            Err(_) => "<faultmap.Pager of the parent process>".to_string(),
        }
    }
}

fn delivery_name(d: Delivery) -> &'static str {
    match d {
        Delivery::Signal => "signal",
        Delivery::Handler => "handler",
    }
}

/// The pager of `faultmap.open` without `pager=`: made on first use, and
/// again in a forked child.
static DEFAULT_PAGER: Mutex<Option<Py<Pager>>> = Mutex::new(None);

fn default_pager(py: Python<'_>) -> PyResult<Py<Pager>> {
    let mut slot = lock(&DEFAULT_PAGER);
    if let Some(p) = slot.as_ref() {
        if p.get().born == generation() {
            return Ok(p.clone_ref(py));
        }
    }
    // Made with the GIL held: Pager::new does not wait on stores (it
    // creates a userfaultfd and starts threads), and holding the GIL keeps
    // two threads from making two default pagers.
    let made = Py::new(
        py,
        Pager::make(
            None,
            None,
            None,
            None,
            IoSettings::default(),
            None,
            None,
            DiskCacheSettings::default(),
        )?,
    )?;
    *slot = Some(made.clone_ref(py));
    Ok(made)
}

/// The writable mappings of this process, to write back at interpreter
/// exit: a `Mapping` that is never deallocated (held by a daemon thread, in
/// a reference cycle) would otherwise lose its dirty pages with the
/// process, where `mmap.mmap`'s stay in the kernel's page cache.
static WRITABLE: Mutex<Vec<(u64, std::sync::Weak<Map>)>> = Mutex::new(Vec::new());

/// Remembers writable `map` for [`_flush_at_exit`]. Called with the GIL
/// held, as every user of `WRITABLE` is: `os.fork` holds it too, so no
/// thread holds the lock at a fork.
fn remember_writable(map: &Arc<Map>) {
    let mut list = lock(&WRITABLE);
    list.retain(|(_, w)| w.strong_count() > 0);
    list.push((generation(), Arc::downgrade(map)));
}

/// Writes back the dirty pages of this process's writable mappings still
/// alive (registered with `atexit` when the module loads). Failures are
/// printed, not raised: the interpreter is exiting.
#[pyfunction]
fn _flush_at_exit(py: Python<'_>) {
    let maps: Vec<Arc<Map>> = lock(&WRITABLE)
        .iter()
        .filter(|(owner, _)| *owner == generation())
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    for map in maps {
        if let MapRef::Write(m) = map.mapping() {
            if let Err(e) = py.detach(|| m.flush(0..m.len())) {
                use std::io::Write;
                let text = fm::error_text(&e);
                let _ = writeln!(std::io::stderr(), "faultmap: writing back at exit: {text}");
            }
        }
    }
}

/// What `open` maps, taken from its Python arguments.
struct Request {
    target: String,
    offset: u64,
    length: Option<u64>,
    writable: bool,
    fault_around_order: Option<u8>,
    readahead: ReadaheadMode,
    memory_budget: Option<u64>,
    /// Record the access trace.
    record_trace: bool,
    /// The file of the access trace to replay.
    replay_trace: Option<String>,
    /// The page size of the object opened.
    page_size: PageSize,
    /// Map a remote object whose server sends no validator.
    allow_unpinned: bool,
}

/// A pager's I/O settings from Python (None: the library's defaults).
#[derive(Default)]
struct IoSettings {
    timeout: Option<std::time::Duration>,
    retries: Option<u32>,
}

/// A pager's disk cache from Python (None: the environment's).
#[derive(Default)]
struct DiskCacheSettings {
    /// `disk_cache`: the directory.
    dir: Option<PathBuf>,
    /// `disk_cache_max`: the most bytes it keeps.
    max: Option<u64>,
}

impl DiskCacheSettings {
    /// Sets `config`'s disk cache: the directory asked for (bounded by
    /// the environment's `FAULTMAP_CACHE_MAX` unless a maximum is asked
    /// for too), else the environment's (`Config::default()`'s), which a
    /// maximum asked for then bounds. A malformed `FAULTMAP_CACHE_MAX` is
    /// left to `Config::validate`, which refuses it.
    fn apply(self, config: &mut Config) {
        if let Some(dir) = self.dir {
            let env_max = std::env::var(fm::CACHE_MAX_ENV)
                .ok()
                .and_then(|v| fm::parse_size(&v).ok());
            config.disk_cache = Some(DiskCacheConfig {
                max_bytes: env_max,
                ..DiskCacheConfig::new(dir)
            });
        }
        if let (Some(max), Some(cache)) = (self.max, config.disk_cache.as_mut()) {
            cache.max_bytes = Some(max);
        }
    }
}

/// The disk cache's directory from Python: a str, bytes or os.PathLike
/// path (os.fspath's).
fn cache_dir_of(arg: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let bad = || -> PyResult<PyErr> {
        Ok(PyTypeError::new_err(format!(
            "disk_cache must be a directory: a str or os.PathLike, not {}",
            arg.get_type().name()?
        )))
    };
    let fspath = arg.py().import("os")?.getattr("fspath")?;
    let Ok(path) = fspath.call1((arg,)) else {
        return Err(bad()?);
    };
    if let Ok(text) = path.cast::<pyo3::types::PyString>() {
        return Ok(PathBuf::from(text.to_str()?));
    }
    if let Ok(bytes) = path.cast::<PyBytes>() {
        return Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes.as_bytes())));
    }
    Err(bad()?)
}

/// The disk cache's maximum from Python: an int of bytes (at least 1), or
/// a size string such as "50G" (`fm::parse_size`).
fn cache_max_of(arg: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(text) = arg.cast::<pyo3::types::PyString>() {
        let text = text.to_cow()?;
        return fm::parse_size(&text).map_err(|why| {
            PyValueError::new_err(format!(
                "disk_cache_max must be a size such as \"50G\" or a number of bytes: {why}"
            ))
        });
    }
    if arg.is_instance_of::<pyo3::types::PyInt>() && !arg.is_instance_of::<pyo3::types::PyBool>() {
        return arg.extract::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
            PyValueError::new_err(format!(
                "disk_cache_max must be at least 1 byte and below 2**64, got {arg}"
            ))
        });
    }
    Err(PyTypeError::new_err(format!(
        "disk_cache_max must be an int of bytes or a size str such as \"50G\", not {}",
        arg.get_type().name()?
    )))
}

/// A duration from Python seconds: finite and above zero.
fn seconds_of(seconds: f64) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "io_timeout must be a number of seconds above 0, not {seconds}"
            ))
        })
}

impl Request {
    /// Opens the store and maps it (may wait on a remote store: run
    /// without the GIL).
    fn map(self, pager: &fm::Pager) -> PyResult<Mapping> {
        let mut opts = MapOptions::new()
            .offset(self.offset)
            .readahead(self.readahead)
            .page_size(self.page_size);
        if let Some(len) = self.length {
            opts = opts.len(len);
        }
        match self.fault_around_order {
            Some(fm::policy::fault_around::AUTO) => opts = opts.fault_around_auto(),
            Some(order) => opts = opts.fault_around_order(order),
            None => {}
        }
        if self.record_trace {
            opts = opts.record_trace();
        }
        if let Some(path) = &self.replay_trace {
            opts = opts.replay_trace(fm::Trace::load(path).map_err(|e| py_err(&e))?);
        }
        let name = self.target.clone();
        // The store, kept for `Mapping.disk_cache_stats` when it reads
        // through a disk cache.
        let mut cached: Option<Arc<dyn Store>> = None;
        let map = if self.writable {
            if let Some((scheme, _)) = self.target.split_once("://") {
                let remote =
                    ["http", "https", "s3"].contains(&scheme.to_ascii_lowercase().as_str());
                return Err(if remote {
                    PyOSError::new_err((
                        libc::EROFS,
                        format!(
                            "{scheme}:// cannot be mapped writable: remote objects are read-only"
                        ),
                    ))
                } else {
                    PyValueError::new_err(format!(
                        "writable=True takes a local path, not a {scheme}:// URL"
                    ))
                });
            }
            let store = FileStore::open_rw(&self.target).map_err(|e| py_err(&e))?;
            let object = open_object(pager, store, self.memory_budget, self.page_size)?;
            // SAFETY: `Pager::map_mut`'s contract is the Python user's, as
            // with mmap.mmap: nothing else changes the file while it is
            // mapped, and no other mapping writes bytes this one exports.
            // Python code cannot hold a Rust reference into the mapping;
            // it reads and writes through raw pointers (the buffer
            // protocol), and this module copies out with
            // `fm::Mapping::read_at` (the kernel's copy, or volatile loads),
            // never through a `&[u8]`.
            Map::Write(unsafe { pager.map_mut(object, opts) }.map_err(|e| py_err(&e))?)
        } else {
            let tuning = fm::RemoteTuning {
                allow_unpinned: self.allow_unpinned,
                ..fm::RemoteTuning::for_config(pager.config())
            };
            let store: Arc<dyn Store> = fm::open_url_with(&self.target, &tuning)
                .map_err(|e| py_err(&e))?
                .into();
            if store.disk_cache_stats().is_some() {
                cached = Some(Arc::clone(&store));
            }
            let object = open_object(pager, store, self.memory_budget, self.page_size)?;
            // SAFETY: as for `map_mut` above: the store's bytes do not
            // change while mapped (a remote object's version is pinned at
            // open), which the user promises as for mmap.mmap.
            Map::Read(unsafe { pager.map(object, opts) }.map_err(|e| py_err(&e))?)
        };
        let len = map.len();
        let page_size = match &map {
            Map::Read(m) => m.object().page_size(),
            Map::Write(m) => m.object().page_size(),
        };
        Ok(Mapping {
            state: Mutex::new(State {
                map: Some(Arc::new(map)),
                cached,
                exports: 0,
            }),
            len,
            page_size,
            writable: self.writable,
            name,
            born: generation(),
        })
    }
}

/// `store` opened as an object of `pager` in pages of `page_size`, with a
/// budget of its own if `budget` is set (then `page_size` is the pager's:
/// `Pager.open` checks it).
fn open_object(
    pager: &fm::Pager,
    store: impl fm::Store,
    budget: Option<u64>,
    page_size: PageSize,
) -> PyResult<fm::Object> {
    match budget {
        Some(b) => pager.open_with_budget(store, b),
        None => pager.open_with_page_size(store, page_size),
    }
    .map_err(|e| py_err(&e))
}

/// A page size from Python: "4K" or 4096, "2M" or 2097152 (the library's
/// spellings: "4k", "4KiB", "2m", "2MiB" too).
fn page_size_of(value: &Bound<'_, PyAny>) -> PyResult<PageSize> {
    let bad = |got: String| {
        PyValueError::new_err(format!(
            "page_size must be \"4K\" or 4096, \"2M\" or 2097152, got {got}"
        ))
    };
    if let Ok(text) = value.cast::<pyo3::types::PyString>() {
        let text = text.to_cow()?;
        return text.parse().map_err(|_| bad(format!("{text:?}")));
    }
    if value.is_instance_of::<pyo3::types::PyInt>() {
        // An int of any size: one that is not a page size (negative, or
        // too large for u64) is a ValueError, as a wrong size is.
        return value
            .extract::<u64>()
            .ok()
            .and_then(PageSize::from_bytes)
            .ok_or_else(|| bad(value.to_string()));
    }
    Err(PyTypeError::new_err(format!(
        "page_size must be a str (\"4K\", \"2M\") or an int (4096, 2097152), not {}",
        value.get_type().name()?
    )))
}

/// A trace file's path (str or os.PathLike) as a string.
fn path_of(arg: &Bound<'_, PyAny>) -> PyResult<String> {
    target_of(arg).map_err(|_| {
        PyTypeError::new_err("a trace's path must be a str or os.PathLike (not bytes)")
    })
}

/// A path (str or os.PathLike) or URL as a string.
fn target_of(arg: &Bound<'_, PyAny>) -> PyResult<String> {
    let py = arg.py();
    let fspath = py.import("os")?.getattr("fspath")?.call1((arg,));
    let path = match fspath {
        Ok(p) => p,
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "path_or_url must be a str or os.PathLike, not {}",
                arg.get_type().name()?
            )))
        }
    };
    match path.extract::<String>() {
        Ok(s) => Ok(s),
        Err(_) => Err(PyTypeError::new_err(
            "path_or_url must be a str path or URL (bytes paths are not supported)",
        )),
    }
}

fn readahead_mode(arg: Option<&str>) -> PyResult<ReadaheadMode> {
    match arg {
        None | Some("full") => Ok(ReadaheadMode::Full),
        Some("around") => Ok(ReadaheadMode::AroundOnly),
        Some("off") => Ok(ReadaheadMode::Off),
        Some(other) => Err(PyValueError::new_err(format!(
            "readahead must be \"full\", \"around\" or \"off\", not {other:?}"
        ))),
    }
}

/// Maps an object and returns its Mapping.
///
/// path_or_url: a local path (str or os.PathLike), an http(s):// URL or an
///     s3:// URL (credentials, region and endpoint from the AWS_*
///     environment).
/// offset, length: the bytes to map (length None: to the end of the
///     object); any offset works, a multiple of 4096 wastes no memory.
/// writable: map a local file read-write; writes reach the file on
///     flush(), close() and in the background. Remote objects are
///     read-only (OSError EROFS).
/// fault_around_order: pages mapped around each fault, as a power of two
///     (0..=9; None: 4, the kernel's 64 KiB), or "auto": adaptive, each
///     fault's window follows the access pattern, from one page for
///     isolated reads to 512 for scans.
/// readahead: "full" (the default: read-around, then windows that grow on
///     sequential access), "around" (read-around only) or "off" (each miss
///     reads its page alone).
/// memory_budget: the most bytes this object's cache may hold (at least
///     1 MiB; None: the pager's budget).
/// record_trace: record the order in which pages are first touched (an
///     access trace; Mapping.save_trace writes it). The mapping then maps
///     one page per fault, so that every first touch is seen.
/// replay_trace: the path of a trace saved by Mapping.save_trace on this
///     same object, at this same version: its pages are read ahead of the
///     program, in the order they were first touched, each widened to the
///     block read-around would read, at most 16 to 32 MiB (a quarter of
///     memory_budget at most) past what a program that follows the trace
///     has used so far. A trace of an object of another length or version
///     (for a file: its modification time), or recorded in pages of
///     another size, raises ValueError.
/// page_size: the size of the pages the object is cached, read and mapped
///     in: "4K" or 4096, "2M" or 2097152 (None: the pager's, 4 KiB unless
///     Pager(page_size=...) says otherwise). 2 MiB pages (hugetlb) take
///     512 times fewer faults; they come from the kernel's pool of 2 MiB
///     pages, which must hold the whole object (or its memory_budget):
///     else OSError (errno ENOMEM) saying how far to raise
///     vm.nr_hugepages. Nothing falls back to 4 KiB pages. With
///     memory_budget, the page size must be the pager's.
/// allow_unpinned: map a remote object whose server sends neither an ETag
///     nor a Last-Modified (refused otherwise, OSError EOPNOTSUPP): a
///     change to it while mapped then goes unseen, and bytes of two
///     versions may be mixed.
/// pager: the Pager to map with (None: a default one, made on first use;
///     its io_timeout and io_retries apply to the open and the reads, and
///     a remote object is read through its disk_cache).
///
/// Raises FileNotFoundError, PermissionError, IsADirectoryError, ValueError
/// (a bad argument) or OSError (with errno) for the rest, each with
/// faultmap's message. The GIL is released while the object is opened.
#[pyfunction]
#[pyo3(signature = (path_or_url, *, offset=0, length=None, writable=false,
                    fault_around_order=None, readahead=None, memory_budget=None,
                    record_trace=false, replay_trace=None, page_size=None,
                    allow_unpinned=false, pager=None))]
#[allow(clippy::too_many_arguments)]
fn open(
    py: Python<'_>,
    path_or_url: &Bound<'_, PyAny>,
    offset: u64,
    length: Option<u64>,
    writable: bool,
    fault_around_order: Option<Bound<'_, PyAny>>,
    readahead: Option<String>,
    memory_budget: Option<u64>,
    record_trace: bool,
    replay_trace: Option<Bound<'_, PyAny>>,
    page_size: Option<Bound<'_, PyAny>>,
    allow_unpinned: bool,
    pager: Option<Bound<'_, Pager>>,
) -> PyResult<Mapping> {
    let pager = match pager {
        Some(p) => p,
        None => default_pager(py)?.into_bound(py),
    };
    Pager::open(
        pager,
        path_or_url,
        offset,
        length,
        writable,
        fault_around_order,
        readahead,
        memory_budget,
        record_trace,
        replay_trace,
        page_size,
        allow_unpinned,
    )
}

/// A fault-around order from Python: an int 0..=9, or "auto" (adaptive
/// fault-around, the library's `AUTO`).
fn order_of(value: &Bound<'_, PyAny>) -> PyResult<u8> {
    use fm::policy::fault_around::{AUTO, MAX_ORDER};
    if let Ok(text) = value.cast::<pyo3::types::PyString>() {
        let text = text.to_cow()?;
        return if text == "auto" {
            Ok(AUTO)
        } else {
            Err(pyo3::exceptions::PyValueError::new_err(format!(
                "fault_around_order must be 0..={MAX_ORDER} or \"auto\", got {text:?}"
            )))
        };
    }
    let order: u8 = value.extract()?;
    if order > MAX_ORDER {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "fault_around_order must be 0..={MAX_ORDER} or \"auto\", got {order}"
        )));
    }
    Ok(order)
}

enum Map {
    Read(fm::Mapping),
    Write(fm::MappingMut),
}

impl Map {
    fn ptr(&self) -> *mut u8 {
        match self {
            // Never written through: exported read-only.
            Map::Read(m) => m.as_ptr().cast_mut(),
            Map::Write(m) => m.as_mut_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Map::Read(m) => m.len(),
            Map::Write(m) => m.len(),
        }
    }

    fn mapping(&self) -> MapRef<'_> {
        match self {
            Map::Read(m) => MapRef::Read(m),
            Map::Write(m) => MapRef::Write(m),
        }
    }
}

/// The Rust mapping's methods common to both accesses.
enum MapRef<'a> {
    Read(&'a fm::Mapping),
    Write(&'a fm::MappingMut),
}

macro_rules! either {
    ($m:expr, $map:ident => $body:expr) => {
        match $m {
            MapRef::Read($map) => $body,
            MapRef::Write($map) => $body,
        }
    };
}

struct State {
    /// `None` once closed.
    map: Option<Arc<Map>>,
    /// The object's store if it reads through a disk cache (for its
    /// counters); `None` otherwise, and once closed.
    cached: Option<Arc<dyn Store>>,
    /// Live buffer exports (memoryviews, arrays).
    exports: usize,
}

/// A mapped object: reads (and, if writable, writes) like memory.
///
/// memoryview(m) is zero-copy (read-only unless opened writable=True);
/// m.array(dtype) is a zero-copy numpy array. len(m) is its length in
/// bytes; m[i] is a byte (int) and m[a:b] a copy (bytes), both like
/// bytes. A page comes in on its first touch, with faultmap's fault-around
/// and readahead.
///
/// Close it with close() or a with block; close() while memoryviews or
/// arrays of it live raises BufferError. A store read that fails after its
/// retries is an OSError from m[a:b] (with a pager that serves kernel
/// faults, the default) and SIGBUS at a direct access from numpy or a
/// memoryview, as for mmap of a file: see the package's README.
#[pyclass(module = "faultmap", frozen)]
struct Mapping {
    state: Mutex<State>,
    len: usize,
    /// The object's page size.
    page_size: PageSize,
    writable: bool,
    name: String,
    /// The process that mapped it: a forked child has no such range.
    born: u64,
}

impl Mapping {
    /// The Rust mapping; `ValueError` once closed, `RuntimeError` in a
    /// forked child.
    fn map(&self) -> PyResult<Arc<Map>> {
        if self.born != generation() {
            return Err(PyRuntimeError::new_err(
                "this faultmap.Mapping was opened before fork(): in a child process \
                 only its bytes can be used (slices, memoryview, array); flush, \
                 advise and statistics are the parent's",
            ));
        }
        lock(&self.state)
            .map
            .clone()
            .ok_or_else(|| PyValueError::new_err("I/O operation on a closed faultmap.Mapping"))
    }

    /// The Rust mapping, for its bytes only (reading, writing, exporting
    /// them): in a forked child too, when the parent serves the range the
    /// child inherited (`fm::Mapping::usable_here`). `ValueError` once
    /// closed, `RuntimeError` in a child the parent does not serve.
    fn data(&self) -> PyResult<Arc<Map>> {
        if self.born == generation() {
            return self.map();
        }
        let map = lock(&self.state)
            .map
            .clone()
            .ok_or_else(|| PyValueError::new_err("I/O operation on a closed faultmap.Mapping"))?;
        if !either!(map.mapping(), m => m.usable_here()) {
            return Err(PyRuntimeError::new_err(
                "this faultmap.Mapping was opened before fork() and its parent does not \
                 serve this process (a child of a child, or the parent is gone): \
                 open it again here",
            ));
        }
        Ok(map)
    }

    /// `[start, stop)` of the mapping (`stop` None: its end), or
    /// `ValueError`.
    fn range(&self, start: usize, stop: Option<usize>) -> PyResult<Range<usize>> {
        let stop = stop.unwrap_or(self.len);
        if start > stop || stop > self.len {
            return Err(PyValueError::new_err(format!(
                "range {start}..{stop} is outside the mapping's {} bytes",
                self.len
            )));
        }
        Ok(start..stop)
    }

    /// Copies bytes `start`, `start + step`, ... of the mapping (all
    /// inside it) into `out`, faulting them in, without the GIL; a page
    /// the store could not read is an `OSError` (EIO), not SIGBUS, with a
    /// pager that serves kernel faults (`fm::Mapping::read_at`).
    fn copy_out(
        py: Python<'_>,
        map: &Map,
        start: usize,
        step: usize,
        out: &mut [u8],
    ) -> PyResult<()> {
        py.detach(|| {
            if step == 1 {
                return either!(map.mapping(), m => m.read_at(start, out));
            }
            // Strided: read spans of at most a MiB and pick from them.
            let per_span = (STRIDE_SPAN / step).max(1);
            let mut span = Vec::new();
            for (k, chunk) in out.chunks_mut(per_span).enumerate() {
                let first = start + k * per_span * step;
                span.resize((chunk.len() - 1) * step + 1, 0);
                either!(map.mapping(), m => m.read_at(first, &mut span))?;
                for (i, b) in chunk.iter_mut().enumerate() {
                    *b = span[i * step];
                }
            }
            Ok(())
        })
        .map_err(|e| py_err(&e))
    }
}

/// The most bytes a strided slice reads at once.
const STRIDE_SPAN: usize = 1 << 20;

/// One int `Advice` or its name.
fn advice_of(arg: &Bound<'_, PyAny>) -> PyResult<Advice> {
    // The numbers of mmap.MADV_* on Linux.
    if let Ok(n) = arg.extract::<i64>() {
        return match n {
            0 => Ok(Advice::Normal),
            1 => Ok(Advice::Random),
            2 => Ok(Advice::Sequential),
            3 => Ok(Advice::WillNeed),
            4 => Ok(Advice::DontNeed),
            _ => Err(PyValueError::new_err(format!(
                "advice {n} is not one of mmap.MADV_NORMAL, _RANDOM, _SEQUENTIAL, _WILLNEED, _DONTNEED"
            ))),
        };
    }
    let name: String = arg.extract().map_err(|_| {
        PyTypeError::new_err("advice is an mmap.MADV_* number or one of \"normal\", \"random\", \"sequential\", \"willneed\", \"dontneed\"")
    })?;
    match name.as_str() {
        "normal" => Ok(Advice::Normal),
        "random" => Ok(Advice::Random),
        "sequential" => Ok(Advice::Sequential),
        "willneed" => Ok(Advice::WillNeed),
        "dontneed" => Ok(Advice::DontNeed),
        _ => Err(PyValueError::new_err(format!(
            "advice must be \"normal\", \"random\", \"sequential\", \"willneed\" or \"dontneed\", not {name:?}"
        ))),
    }
}

#[pymethods]
impl Mapping {
    fn __len__(&self) -> usize {
        self.len
    }

    /// m[i] is the byte at i (an int); m[a:b:c] the bytes (a copy).
    fn __getitem__<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let map = self.data()?;
        if let Ok(slice) = key.cast::<PySlice>() {
            let idx = slice.indices(self.len as isize)?;
            let n = idx.slicelength;
            if n == 0 {
                return Ok(PyBytes::new(py, b"").into_any().unbind());
            }
            if idx.step < 0 {
                // Reversed: gather forwards from the last, then reverse.
                let first = idx.start as usize - (n - 1) * (-idx.step) as usize;
                let bytes = PyBytes::new_with(py, n, |out| {
                    Mapping::copy_out(py, &map, first, (-idx.step) as usize, out)?;
                    out.reverse();
                    Ok(())
                })?;
                return Ok(bytes.into_any().unbind());
            }
            let start = idx.start as usize;
            let bytes = PyBytes::new_with(py, n, |out| {
                Mapping::copy_out(py, &map, start, idx.step as usize, out)
            })?;
            return Ok(bytes.into_any().unbind());
        }
        // operator.index, as bytes does: its TypeError (or the object's own
        // error) as it is; an int too large for isize is out of range.
        static INDEX: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let index = INDEX.import(py, "operator", "index")?.call1((key,))?;
        let i: isize = index.extract().map_err(|e: PyErr| {
            if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
                PyIndexError::new_err("faultmap.Mapping index out of range")
            } else {
                e
            }
        })?;
        let at = if i < 0 { i + self.len as isize } else { i };
        if at < 0 || at as usize >= self.len {
            return Err(PyIndexError::new_err("faultmap.Mapping index out of range"));
        }
        let mut byte = [0u8];
        Mapping::copy_out(py, &map, at as usize, 1, &mut byte)?;
        Ok(byte[0].into_pyobject(py)?.into_any().unbind())
    }

    /// Exports the mapped bytes in place: one-dimensional, unsigned bytes
    /// ("B"), read-only unless the mapping is writable.
    ///
    /// # Safety
    ///
    /// `view` is a `Py_buffer` for Python to fill (the buffer protocol's
    /// contract, kept by PyO3's slot wrapper).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: `view` is Python's to fill (this function's contract); on
        // failure `obj` must be NULL, and it is set only on success below.
        unsafe { (*view).obj = std::ptr::null_mut() };
        let this = slf.get();
        this.data()?;
        let mut state = lock(&this.state);
        let Some(map) = state.map.as_ref() else {
            return Err(PyValueError::new_err(
                "cannot export the buffer of a closed faultmap.Mapping",
            ));
        };
        let readonly = c_int::from(!this.writable);
        // SAFETY: `view` is Python's to fill (this function's contract);
        // the pointer and length are the mapping's, which stays mapped
        // while the export lives: `view.obj` holds a reference to this
        // Mapping (FillInfo takes it), and `close()` refuses while
        // `exports` > 0. FillInfo checks a writable request against
        // `readonly` and sets the exception itself.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                map.ptr().cast(),
                map.len() as ffi::Py_ssize_t,
                readonly,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        state.exports += 1;
        Ok(())
    }

    /// Ends an export.
    ///
    /// # Safety
    ///
    /// `_view` is a buffer this object exported (the buffer protocol's
    /// contract).
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut state = lock(&self.state);
        debug_assert!(state.exports > 0, "a buffer released twice");
        state.exports = state.exports.saturating_sub(1);
    }

    /// A zero-copy numpy array over the mapping: `dtype` elements from
    /// byte `offset`, in `shape` (None: as many as fit, one-dimensional;
    /// one side of the shape may be -1: as many as fit).
    /// It keeps the mapping alive and is read-only unless the mapping is
    /// writable. Needs numpy.
    #[pyo3(signature = (dtype, shape=None, offset=0))]
    fn array<'py>(
        slf: &Bound<'py, Self>,
        dtype: &Bound<'py, PyAny>,
        shape: Option<&Bound<'py, PyAny>>,
        offset: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        slf.get().data()?;
        let np = py
            .import("numpy")
            .map_err(|_| PyImportError::new_err("Mapping.array needs numpy: pip install numpy"))?;
        let dtype = np.getattr("dtype")?.call1((dtype,))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", &dtype)?;
        kwargs.set_item("offset", offset)?;
        let shape = match shape {
            None => None,
            Some(s) if s.is_none() => None,
            Some(s) => Some(match s.extract::<isize>() {
                Ok(n) => PyTuple::new(py, [n])?,
                Err(_) => PyTuple::new(py, s.try_iter()?.collect::<PyResult<Vec<_>>>()?)?,
            }),
        };
        let itemsize: usize = dtype.getattr("itemsize")?.extract()?;
        // Elements from `offset` to the end (numpy refuses an offset past
        // it, with its own message).
        let fit = match itemsize {
            0 => 0,
            n => slf.get().len.saturating_sub(offset) / n,
        };
        let count = match &shape {
            // As many elements as fit: a tail shorter than one is left out.
            None => fit,
            Some(shape) => {
                // The product of the given sides; one side may be -1 (as
                // many rows as fit, as for numpy's reshape).
                let (mut known, mut free) = (1usize, 0);
                for d in shape.iter() {
                    let d: isize = d.extract().map_err(|_| {
                        PyTypeError::new_err("shape must be an int or a sequence of ints")
                    })?;
                    match d {
                        -1 => free += 1,
                        d if d >= 0 => {
                            known = known
                                .checked_mul(d as usize)
                                .ok_or_else(|| PyValueError::new_err("shape is too large"))?
                        }
                        _ => {
                            return Err(PyValueError::new_err(format!(
                                "negative side {d} in shape"
                            )))
                        }
                    }
                }
                match free {
                    0 => known,
                    1 if known > 0 => fit / known * known,
                    1 => 0,
                    _ => return Err(PyValueError::new_err("shape can have one -1 side only")),
                }
            }
        };
        kwargs.set_item("count", count)?;
        let flat = np.getattr("frombuffer")?.call((slf,), Some(&kwargs))?;
        match shape {
            Some(shape) => flat.call_method1("reshape", (shape,)),
            None => Ok(flat),
        }
    }

    /// Tells faultmap how bytes [start, stop) will be used, like madvise:
    /// advice is an mmap.MADV_* number (NORMAL, RANDOM, SEQUENTIAL,
    /// WILLNEED, DONTNEED) or its name in lower case ("random", ...).
    #[pyo3(signature = (advice, start=0, stop=None))]
    fn advise(
        &self,
        py: Python<'_>,
        advice: &Bound<'_, PyAny>,
        start: usize,
        stop: Option<usize>,
    ) -> PyResult<()> {
        let advice = advice_of(advice)?;
        let range = self.range(start, stop)?;
        let map = self.map()?;
        py.detach(|| either!(map.mapping(), m => m.advise(advice, range)))
            .map_err(|e| py_err(&e))
    }

    /// Reads bytes [start, stop) into the cache, waits for them, and maps
    /// them here (writable too, on a writable mapping), so that a system
    /// call can use this memory: f.write(m[a:b]) through a memoryview,
    /// sock.sendall, f.readinto. The kernel's own accesses raise no fault
    /// faultmap can serve under the protect engine (or signal delivery,
    /// or a userfaultfd without kernel faults): they fail with EFAULT
    /// (OSError) on a page not mapped yet. A page the store cannot read
    /// is an OSError here. Pages stay mapped until the memory budget
    /// evicts them: populate right before the call.
    #[pyo3(signature = (start=0, stop=None))]
    fn populate(&self, py: Python<'_>, start: usize, stop: Option<usize>) -> PyResult<()> {
        let range = self.range(start, stop)?;
        let map = self.map()?;
        py.detach(|| either!(map.mapping(), m => m.populate(range)))
            .map_err(|e| py_err(&e))
    }

    /// Starts reading bytes [start, stop) now, in the store's largest
    /// requests, and returns; a later access waits for that read.
    #[pyo3(signature = (start=0, stop=None))]
    fn prefetch(&self, py: Python<'_>, start: usize, stop: Option<usize>) -> PyResult<()> {
        let range = self.range(start, stop)?;
        let map = self.map()?;
        py.detach(|| either!(map.mapping(), m => m.prefetch(range)))
            .map_err(|e| py_err(&e))
    }

    /// Starts reading many byte ranges at once, merged into few requests
    /// all in flight together (see the Rust `Mapping::prefetch_ranges`),
    /// and returns; with `wait=True`, returns once the reads it started
    /// have ended (a page that cannot be read is an `OSError`; a page the
    /// memory budget left out is read at its access). `ranges` is a
    /// sequence of `(start, length)` pairs (or an (N, 2) array), or, with
    /// `lengths`, the starts: two sequences of the same length (numpy
    /// arrays or lists). Returns `{"requests", "pages", "hole_pages"}`.
    #[pyo3(signature = (ranges, lengths=None, *, wait=false))]
    fn prefetch_ranges<'py>(
        &self,
        py: Python<'py>,
        ranges: &Bound<'py, PyAny>,
        lengths: Option<&Bound<'py, PyAny>>,
        wait: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ranges = byte_ranges(ranges, lengths)?;
        let map = self.map()?;
        let got = py
            .detach(|| {
                either!(map.mapping(), m => {
                    let got = m.prefetch_ranges(&ranges)?;
                    if wait {
                        m.wait_ranges(&ranges)?;
                    }
                    Ok::<_, fm::MapError>(got)
                })
            })
            .map_err(|e| py_err(&e))?;
        let d = PyDict::new(py);
        d.set_item("requests", got.requests)?;
        d.set_item("pages", got.pages)?;
        d.set_item("hole_pages", got.hole_pages)?;
        Ok(d)
    }

    /// Drops the cached pages that hold bytes [start, stop) (from every
    /// mapping of the object), so that the next access reads them again;
    /// returns how many pages were dropped.
    #[pyo3(signature = (start=0, stop=None))]
    fn invalidate(&self, py: Python<'_>, start: usize, stop: Option<usize>) -> PyResult<u64> {
        let range = self.range(start, stop)?;
        let map = self.map()?;
        py.detach(|| either!(map.mapping(), m => m.invalidate(range)))
            .map_err(|e| py_err(&e))
    }

    /// Writes the dirty pages that hold bytes [start, stop) back to the
    /// file, like mmap.flush (msync): when it returns, they are on disk.
    /// Returns the pages written (0 for a read-only mapping).
    #[pyo3(signature = (start=0, stop=None))]
    fn flush(&self, py: Python<'_>, start: usize, stop: Option<usize>) -> PyResult<u64> {
        let range = self.range(start, stop)?;
        let map = self.map()?;
        match map.mapping() {
            MapRef::Read(_) => Ok(0),
            MapRef::Write(m) => py.detach(|| m.flush(range)).map_err(|e| py_err(&e)),
        }
    }

    /// This mapping's counters, named as in the Rust library's `Stats`
    /// (pgfault, pgmajfault, pgfault_around, io_count, io_bytes, ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let map = self.map()?;
        to_py(py, &either!(map.mapping(), m => m.stats()))
    }

    /// This mapping's readahead table (`RaStats`).
    fn ra_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let map = self.map()?;
        to_py(py, &either!(map.mapping(), m => m.ra_stats()))
    }

    /// What the object's disk cache did since it was opened (see
    /// Pager(disk_cache=...)): {"disk_bytes" (read from the disk),
    /// "network_bytes" (read from the store below), "written_bytes"
    /// (written to the disk), "waits" (reads that waited for another
    /// reader's fetch of the same pages), "problems" (disk failures of the
    /// cache directory in this process: those reads came from the
    /// network), "first_problem" (the first one's message, or None)}.
    /// None when the object is not read through a disk cache (a local
    /// file, no cache, or an object without a version to pin).
    fn disk_cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.map()?;
        let store = lock(&self.state).cached.clone();
        store
            .and_then(|s| s.disk_cache_stats())
            .map(|stats| to_py(py, &stats))
            .transpose()
    }

    /// Writes the access trace recorded so far (open(...,
    /// record_trace=True)) to `path`, whole or not at all, and returns its
    /// size: {"pages", "runs", "bytes"}. Replay it with open(...,
    /// replay_trace=path). ValueError if the mapping does not record.
    fn save_trace<'py>(
        &self,
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let path = path_of(path)?;
        let map = self.map()?;
        // Reading the log and writing the file take time in the trace's
        // length: without the GIL.
        let saved = py.detach(|| {
            let trace = either!(map.mapping(), m => m.trace())?;
            Some(trace.save(&path).map(|bytes| {
                serde_json::json!({
                    "pages": trace.pages(),
                    "runs": trace.runs().len(),
                    "bytes": bytes,
                })
            }))
        });
        match saved {
            None => Err(PyValueError::new_err(
                "this mapping does not record its trace: open it with record_trace=True",
            )),
            Some(Err(e)) => Err(py_err(&e)),
            Some(Ok(size)) => json_to_py(py, &size),
        }
    }

    /// Where the replay of a trace stands (open(..., replay_trace=...)):
    /// {"pages", "replayed", "used", "waiting", "done"}, or None.
    fn replay_progress<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let map = self.map()?;
        let Some(p) = either!(map.mapping(), m => m.replay_progress()) else {
            return Ok(None);
        };
        let progress = serde_json::json!({
            "pages": p.pages,
            "replayed": p.replayed,
            "used": p.used,
            "waiting": p.waiting,
            "done": p.done,
        });
        json_to_py(py, &progress).map(Some)
    }

    /// The object's memory: {"budget", "cached", "peak", "active"} in
    /// bytes (its own budget's, or the pager's).
    fn memory<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let map = self.map()?;
        to_py(py, &either!(map.mapping(), m => m.object().memory()))
    }

    /// The object's store failures, newest last: dicts with "object",
    /// "offset", "len", "kind" and "message".
    fn io_errors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let map = self.map()?;
        reports(py, &either!(map.mapping(), m => m.object().io_errors()))
    }

    /// Unmaps it; a writable mapping writes its dirty pages back first (an
    /// OSError from that write-back is raised once the mapping is closed).
    /// Raises BufferError while memoryviews or arrays of it live; a second
    /// close() does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let forked = self.born != generation();
        let map = {
            let mut state = lock(&self.state);
            if state.exports > 0 {
                return Err(PyBufferError::new_err(format!(
                    "cannot close a faultmap.Mapping with {} exported buffer(s) \
                     (memoryviews or arrays) alive",
                    state.exports
                )));
            }
            state.cached = None;
            state.map.take()
        };
        let Some(map) = map else {
            return Ok(());
        };
        // Written back here, not only by the drop: another thread's call
        // (a prefetch) may hold the mapping past this close. Not in a
        // forked child: the parent writes its pages back.
        let written = match map.mapping() {
            MapRef::Write(m) if !forked => py.detach(|| m.flush(0..m.len())).map(drop),
            _ => Ok(()),
        };
        // Unmapped now, or by the call that holds it when that ends.
        py.detach(move || drop(map));
        written.map_err(|e| py_err(&e))
    }

    /// Whether close() has run.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.state).map.is_none()
    }

    /// Whose cache it reads: "private" (its own process's), "owner" (its
    /// own, shared with other processes of this user), or "joined"
    /// (another process's; see Pager(shared=...)).
    #[getter]
    fn sharing(&self) -> PyResult<&'static str> {
        let map = self.map()?;
        Ok(match either!(map.mapping(), m => m.sharing()) {
            fm::Sharing::Owner => "owner",
            fm::Sharing::Joined => "joined",
            _ => "private",
        })
    }

    /// Why a mapping is "private" although sharing is on, or None.
    #[getter]
    fn sharing_error(&self) -> PyResult<Option<String>> {
        let map = self.map()?;
        Ok(match either!(map.mapping(), m => m.sharing()) {
            fm::Sharing::Private { why } => why.clone(),
            _ => None,
        })
    }

    /// Whether the mapping was opened writable=True.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// The path or URL it maps.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The size in bytes of the pages its object is cached and mapped in:
    /// 4096, or 2097152 (page_size="2M").
    #[getter]
    fn page_size(&self) -> usize {
        self.page_size.bytes()
    }

    /// The pages mapped around each fault, as a power of two (0..=9), or
    /// "auto": adaptive fault-around.
    #[getter]
    fn get_fault_around_order<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let map = self.map()?;
        let order = either!(map.mapping(), m => m.fault_around_order());
        if order == fm::policy::fault_around::AUTO {
            Ok("auto".into_pyobject(py)?.into_any())
        } else {
            Ok(order.into_pyobject(py)?.into_any())
        }
    }

    #[setter]
    fn set_fault_around_order(&self, order: &Bound<'_, PyAny>) -> PyResult<()> {
        let order = order_of(order)?;
        let map = self.map()?;
        if order == fm::policy::fault_around::AUTO {
            either!(map.mapping(), m => m.set_fault_around_auto());
            return Ok(());
        }
        either!(map.mapping(), m => m.set_fault_around_order(order)).map_err(|e| py_err(&e))
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let closed = if self.closed() { " closed" } else { "" };
        let mode = if self.writable { "rw" } else { "r" };
        format!(
            "<faultmap.Mapping {:?} len={} {mode}{closed}>",
            self.name, self.len
        )
    }
}

/// Store failure reports as a list of dicts.
fn reports<'py>(py: Python<'py>, list: &[fm::IoErrorReport]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for r in list {
        let d = PyDict::new(py);
        d.set_item("object", &r.object)?;
        d.set_item("offset", r.offset)?;
        d.set_item("len", r.len)?;
        d.set_item("kind", format!("{:?}", r.kind))?;
        d.set_item("message", &r.message)?;
        out.append(d)?;
    }
    Ok(out)
}

/// A serializable value (faultmap's counters) as Python objects.
fn to_py<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(value)
        .map_err(|e| PyRuntimeError::new_err(format!("counters: {e}")))?;
    json_to_py(py, &value)
}

fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(json_to_py(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// faultmap's extension module.
#[pymodule]
fn _faultmap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Pager>()?;
    m.add_class::<Mapping>()?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    let flush = wrap_pyfunction!(_flush_at_exit, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (flush,))?;
    m.add("PAGE_SIZE", fm::PAGE_SIZE)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// The byte ranges of `prefetch_ranges`: `(start, length)` pairs, or
/// starts and `lengths` (numpy arrays are read through `tolist`, one call
/// each rather than an element at a time). A negative or non-integer
/// value, two sequences of different lengths, or a range whose end does
/// not fit 64 bits is a `ValueError` or `TypeError`.
fn byte_ranges(
    ranges: &Bound<'_, PyAny>,
    lengths: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<Range<u64>>> {
    fn list<'py>(seq: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if seq.hasattr("tolist")? {
            seq.call_method0("tolist")
        } else {
            Ok(seq.clone())
        }
    }
    let ints = |seq: &Bound<'_, PyAny>, what: &str| -> PyResult<Vec<u64>> {
        list(seq)?.extract::<Vec<u64>>().map_err(|_| {
            PyValueError::new_err(format!(
                "{what} must be a sequence of non-negative integers below 2**64"
            ))
        })
    };
    let pairs: Vec<(u64, u64)> = match lengths {
        Some(lengths) => {
            let (starts, lengths) = (ints(ranges, "starts")?, ints(lengths, "lengths")?);
            if starts.len() != lengths.len() {
                return Err(PyValueError::new_err(format!(
                    "{} starts but {} lengths",
                    starts.len(),
                    lengths.len()
                )));
            }
            starts.into_iter().zip(lengths).collect()
        }
        None => {
            let bad = || {
                PyValueError::new_err(
                    "ranges must be (start, length) pairs of non-negative integers, or \
                     starts with lengths=",
                )
            };
            // Tuples, or lists of two (a 2-D array's `tolist`).
            let rows = list(ranges)?
                .extract::<Vec<Vec<u64>>>()
                .map_err(|_| bad())?;
            rows.into_iter()
                .map(|row| match row[..] {
                    [start, len] => Ok((start, len)),
                    _ => Err(bad()),
                })
                .collect::<PyResult<_>>()?
        }
    };
    pairs
        .into_iter()
        .map(|(start, len)| {
            start
                .checked_add(len)
                .map(|end| start..end)
                .ok_or_else(|| PyValueError::new_err(format!("range {start}+{len} overflows")))
        })
        .collect()
}
