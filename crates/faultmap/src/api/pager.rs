//! The pager: one userfaultfd, its pager threads, its I/O threads, and
//! the mappings it serves.
//!
//! [`Pager::new`] opens the userfaultfd and checks, before anything is
//! mapped, every kernel feature the fault path needs; a missing one is an
//! error that names it, never a hang at the first fault. Pager threads
//! ("handler threads") take faults (pinned ones one at a time, the
//! others in batches) and run
//! `crate::mm::fault::handle` on each: userfaultfd messages with
//! `Delivery::Handler`, faults forwarded by SIGBUS handlers with
//! `Delivery::Signal` (`crate::mm::signal`). In both deliveries they also read
//! the userfaultfd's UNMAP and REMAP events (`crate::mm::events`), whose
//! senders wait until they are read. Between bursts floating ones
//! busy-poll briefly; then they sleep in `poll` on the userfaultfd, the
//! forwarding doorbell (signal delivery) and a stop eventfd. They never read a store
//! themselves: the reads go to the I/O threads (`crate::mm::io`). A watchdog
//! thread gives up store reads that outlive `Config::io_timeout` and
//! notices a truncated store (`crate::mm::errors`).
//!
//! `map` and a mapping's drop hold the process's region-table lock for
//! their whole operation, as `mmap` and `munmap` hold `mmap_lock`; faults
//! look regions up without it (`crate::mm::space`).
//!
//! # Lifetimes
//!
//! The handler and I/O threads live as long as the [`Pager`] *or any
//! [`Mapping`]* it made: each holds the `Workers` guard, whose drop (the
//! last one) stops the flusher and the evictor, then the handler threads,
//! then the I/O threads (which first run every read still queued), and
//! waits for them, but never longer than `Config::io_timeout` plus a
//! second: a thread inside a store call that never returns is left
//! behind, detached, and owns (through `Arc`s) everything its late
//! completion touches. A mapping therefore never outlives the threads that
//! serve its faults, and dropping a mapping never waits for a handler: it
//! unpublishes its region, and the address range is unmapped when the last
//! handler that looked the region up lets go of it (see [`crate::mm::space`]).
//!
//! An object opened with a budget of its own (`Pager::open_with_budget`)
//! owns its evictor, which stops when the object goes. A pager's budget
//! whose evictor stopped (the pager is gone, another pager still maps one
//! of its objects) is no longer enforced, rather than block reads.
//!
//! The background flusher (`crate::mm::writeback`) is started by the first
//! writable mapping and told to stop first when the last holder of
//! `Workers` goes: it writes back what is dirty as it stops.
//!
//! # fork
//!
//! A mapping made before `fork` works in the child, with the same bytes,
//! from the same cache. Mappings are `MADV_DONTFORK` (a child's inherited
//! copy would lose its userfaultfd registration and read holes as zeros,
//! into the shared memfd); instead, an at-fork child handler maps each
//! mapping's range again at the same address, from the memfd the child
//! inherited, before the child runs any other code, registers it with a
//! userfaultfd of the child's own (SIGBUS delivery), and hands that to
//! this process, which serves the child's faults from its own cache
//! (`crate::mm::guest`, `crate::sys::share`). So a pointer taken in the
//! parent (a slice of a `Mapping`, a Python `memoryview` or numpy array)
//! reads and writes the object in the child too: a page any process read
//! is not read again, a write is seen by every process and written back
//! once (by the parent), and the memory budget is one. The parent's death
//! gives the child SIGBUS on its next fault (never zeros, never a wait);
//! the child's death costs the parent nothing (a read it started is kept).
//! In the child, [`Mapping::read_at`] asks the parent for each page the
//! kernel's copy stops at, so that a page that cannot be read is an error,
//! and [`Mapping::usable_here`] says whether the bytes can be used.
//!
//! What is not served: a child of a child (it gets an inaccessible
//! placeholder over each range: a stale pointer is SIGSEGV there, never the
//! child's own memory, since nothing mapped without `MAP_FIXED` can land
//! there); a range the parent unmapped in the moment after the fork, before
//! its service thread heard from the child (the child's faults there get
//! SIGBUS); kernel-mode faults in the child (a `write(2)` from a page the
//! child has not touched fails with `EFAULT`, as with signal delivery).
//! (If the at-fork handlers could not be registered when the library was
//! loaded, [`crate::sys::children_reserved`] is false and the range is
//! free address space in the child, as the kernel leaves it.)
//!
//! A child that drops a `Mapping`, `Object` or `Pager` it inherited leaves
//! the parent's things be (each records the fork generation that made it,
//! [`crate::sys::fork_generation`]): its regions stay in the parent's
//! region table, which the child leaks, so their ranges are neither
//! unregistered nor unmapped; the object's dirty pages are not written
//! back (the parent writes them; a child's copy could land after the
//! parent's newer one); no lock a parent thread may have held at the fork
//! is taken; and the pager's threads, which the child does not have, are
//! not waited for. In the child use the bytes of an inherited mapping
//! only; for anything else (flush, advice, statistics, new mappings) make
//! a pager there.
//!
//! # munmap and mremap by the application
//!
//! A mapping's drop unregisters its range before it unmaps it, so
//! faultmap's own unmaps raise no event. An application's `munmap` or
//! `mremap` of a mapping does: see `crate::mm::events`.

use std::io;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut, Range};
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::api::object::{IntoObject, InvalidateError, Object};
use crate::api::shared::{self, JoinedMap, Plan, Sharing};
use crate::base::config::{
    engine_from_env, Config, ConfigError, Delivery, Engine, HandlerPlacement, MapOptions, PageSize,
    RegionLookup, MAX_HANDLER_THREADS,
};
use crate::base::index::{HostAddr, ObjectPage, RegionPage};
use crate::base::report::{IoErrorKind, IoErrorReport};
use crate::base::stats::{Counters, RaCounters, RaStats, RaTally, Stats};
use crate::base::trace::{Trace, TraceError};
use crate::cache::wait::Uffd;
use crate::cache::{Cache, CacheError};
use crate::mm::engine::{AreaStats, ArmError, PagingEngine, Protect};
use crate::mm::errors;
use crate::mm::events;
use crate::mm::evict::{Budget, Evictor, Memory};
use crate::mm::fault;
use crate::mm::io::{IoShared, IoThreads};
use crate::mm::object::ObjectCore;
use crate::mm::pager_core::Core;
use crate::mm::signal::{self, Requests};
use crate::mm::space::{MappedPages, Region, RegionTable};
use crate::mm::trace::{self, Recorder, RegionTrace, Replay, ReplayThread};
use crate::mm::writeback::{self, Flusher, FlusherEnv, WriteBackError};
use crate::policy::readahead::{Hint, Mode as ReadaheadMode};
use crate::store::{Store, StoreError};
use crate::sync::seqcount::SeqCount;
use crate::sys::{self, feature, UffdMsg, UffdSource, PAGE_SIZE, PTRS_PER_PTE};

/// The kernel features faultmap cannot work without, and why.
const REQUIRED_FEATURES: [(u64, &str); 6] = [
    (
        feature::MISSING_SHMEM,
        "to see the first touch of a page not in the cache",
    ),
    (
        feature::MINOR_SHMEM,
        "to map cached pages with UFFDIO_CONTINUE",
    ),
    (feature::POISON, "to turn a failed store read into SIGBUS"),
    (
        feature::THREAD_ID,
        "to tell a woken fault's retry from a new fault",
    ),
    (
        feature::EVENT_UNMAP,
        "to learn that the application unmapped (part of) a mapping",
    ),
    (
        feature::EVENT_REMAP,
        "to learn that the application moved (part of) a mapping",
    ),
];

/// The most messages read from the userfaultfd per `read` (pinned handlers
/// read one at a time: [`Reading::ONE`]).
const MSG_BATCH: usize = 64;

/// A handler that reads one message at a time drains the userfaultfd at
/// least once in this many of its reads ([`next_take`]), so that an event
/// queued behind faults is read within a bounded number of reads even if
/// nothing pointed at it ([`crate::cache::wait::Uffd::note_event_waiting`]).
const FULL_READ_EVERY: u32 = 64;

/// How much a pager thread's next read of the userfaultfd takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Take {
    /// Up to this many messages, one `read`.
    Read(usize),
    /// Batches of [`MSG_BATCH`] until one comes back short or holds an
    /// event: every pending fault, and the event queued behind them.
    Drain,
}

/// A reader's next [`Take`]: it reads `per_read` messages at a time, has
/// made `small_reads` one-message reads since its last drain, and
/// `event_hinted` says an event may be waiting. Returns the take and the
/// new count. Batch readers drain only on a hint (a batch reaches an event
/// unless `MSG_BATCH` faults or more are pending).
fn next_take(per_read: usize, small_reads: u32, event_hinted: bool) -> (Take, u32) {
    if event_hinted {
        (Take::Drain, 0)
    } else if per_read >= MSG_BATCH {
        (Take::Read(MSG_BATCH), 0)
    } else if small_reads + 1 >= FULL_READ_EVERY {
        (Take::Drain, 0)
    } else {
        (Take::Read(per_read), small_reads + 1)
    }
}

/// Why a pager could not be created.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// No userfaultfd could be opened.
    #[error("cannot open a userfaultfd ({hint})")]
    Unavailable {
        /// The system call's error.
        source: io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// The kernel lacks a feature faultmap needs.
    #[error("the kernel does not support {feature}, needed {why} (Linux 6.6 or later has it)")]
    MissingFeature {
        /// The kernel's name of the feature.
        feature: &'static str,
        /// What faultmap needs it for.
        why: &'static str,
    },
    /// The system page size is not 4 KiB.
    #[error("faultmap needs 4 KiB pages")]
    PageSize,
    /// A configuration value is out of bounds.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A system call failed.
    #[error("{op} failed")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
}

/// Why an object could not be opened or mapped.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The map options do not fit the object.
    #[error(transparent)]
    Options(#[from] ConfigError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The object's cache could not be created.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The mapping could not be created or registered.
    #[error("cannot map {name}: {op} failed")]
    Map {
        /// The object's name.
        name: String,
        /// What was being done.
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The kernel does not allow an ioctl the fault path needs on the range.
    #[error("the kernel refuses {ioctl} on a mapping of {name}")]
    MissingIoctl {
        /// The object's name.
        name: String,
        /// The ioctl.
        ioctl: &'static str,
    },
    /// A writable mapping of an object whose store does not take writes.
    #[error("cannot map {name} writable: its store is read-only")]
    ReadOnlyStore {
        /// The object's name.
        name: String,
    },
    /// The trace to replay does not fit the object, or could not be
    /// recorded.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The map options ask for another page size than the object has.
    #[error("{name} has {object} pages; cannot map it with {asked} pages")]
    PageSize {
        /// The object's name.
        name: String,
        /// The object's page size.
        object: PageSize,
        /// The page size asked for.
        asked: PageSize,
    },
    /// [`Mapping::read_at`] met a page that cannot be read.
    #[error("cannot read byte {offset} of {name}: {why}")]
    Read {
        /// The object's name.
        name: String,
        /// The first byte not read, from the object's start.
        offset: u64,
        /// The store's failure, as its log reports it.
        why: String,
    },
}

/// Where a trace replay stands ([`Mapping::replay_progress`]).
///
/// Counted in pages of the replay's schedule: the trace's pages, each
/// widened to the aligned block the size of the window the mapping's
/// read-around reads on a miss (one page with readahead off; see
/// [`MapOptions::replay_trace`]), each block once, in the order the trace
/// first reaches it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayProgress {
    /// The pages the schedule reads in all.
    pub pages: u64,
    /// Pages the replay has gone past: read, being read, found cached,
    /// or left out (a part the application unmapped; pages the budget had
    /// no room for).
    pub replayed: u64,
    /// Pages of the schedule taken as used: those of its pieces (reads of
    /// at most the store's largest request) in the read-around units a
    /// fault's window lay in, wherever they are in the schedule; pieces
    /// the replay read and the application skipped, once its faults used
    /// [`MapOptions::replay_ahead`] pages more; and pieces no region maps
    /// any more. The replay goes at most `replay_ahead` pages past this.
    pub used: u64,
    /// The replay is waiting for the application: it is as far ahead as
    /// it may go.
    pub waiting: bool,
    /// The replay has gone through the whole trace.
    pub done: bool,
}

/// The handler threads; stopped and joined when the last holder drops it.
struct Workers {
    stop: OwnedFd,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The I/O threads: stopped after the handler threads, which submit to
    /// them (dropping them runs every job still queued).
    io: Mutex<Option<IoThreads>>,
    /// The evictor threads (the pager's budget, objects' own budgets).
    evictors: Mutex<Vec<Evictor>>,
    /// The background flusher, started with the first writable mapping;
    /// stopped first (it writes back what is dirty as it stops).
    flusher: Mutex<Option<Flusher>>,
    /// How long the drop waits for the threads: `Config::io_timeout` plus
    /// a second.
    grace: Duration,
    /// The fork generation that started the threads (see "fork" above).
    born: u64,
}

impl Workers {
    /// Starts the flusher if it is not running.
    fn start_flusher(&self, core: &Arc<Core>, expire: Duration) -> io::Result<()> {
        let mut flusher = self.flusher.lock().unwrap_or_else(|e| e.into_inner());
        if flusher.is_none() {
            *flusher = Some(Flusher::start(FlusherEnv {
                core: core.clone(),
                expire,
            })?);
        }
        Ok(())
    }
}

impl Drop for Workers {
    /// Stops every thread of the pager and waits for them, but never longer
    /// than `grace` (`Config::io_timeout` plus a second): a thread still
    /// inside a store call that never returns (a hung read, write or sync)
    /// is left to finish on its own, detached. Such a thread owns what it
    /// touches through `Arc`s (see `IoThreads::stop`), so its late
    /// completion is harmless; the pages it was reading stay READING until
    /// then, and faults on them are given up by the watchdog's timeout
    /// only while a pager lives.
    fn drop(&mut self) {
        if self.born != sys::fork_generation() {
            // A forked child: the threads are the parent's and do not exist
            // here; stopping or joining them would wait out `grace` for
            // nothing. Their handles and queues are left as they are. (No
            // lock: one may have been held by a thread that is not here.)
            std::mem::forget(std::mem::take(
                self.threads.get_mut().unwrap_or_else(|e| e.into_inner()),
            ));
            std::mem::forget(self.io.get_mut().unwrap_or_else(|e| e.into_inner()).take());
            std::mem::forget(std::mem::take(
                self.evictors.get_mut().unwrap_or_else(|e| e.into_inner()),
            ));
            std::mem::forget(
                self.flusher
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(),
            );
            return;
        }
        let deadline = Instant::now() + self.grace;
        let mut later = Vec::new();
        // 1. The flusher and the evictors: told to stop (the flusher writes
        //    back what is dirty first).
        if let Some(f) = self
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            later.extend(f.stop());
        }
        for e in std::mem::take(&mut *self.evictors.lock().unwrap_or_else(|e| e.into_inner())) {
            later.extend(e.stop());
        }
        // 2. The handler threads, before the I/O threads: they submit jobs.
        //    The eventfd stays readable once signalled: every thread sees
        //    it.
        let _ = sys::eventfd_signal(&self.stop);
        let handlers = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        crate::mm::io::join_until(handlers, deadline);
        // 3. The I/O threads (each runs the jobs still queued first).
        if let Some(io) = self.io.lock().unwrap_or_else(|e| e.into_inner()).take() {
            later.extend(io.stop());
        }
        crate::mm::io::join_until(later, deadline);
    }
}

// Tests make `map` fail right after `UFFDIO_REGISTER` (as a kernel
// without one of the ioctls would) to check its failure path.
#[cfg(all(test, not(loom)))]
thread_local! {
    static FAIL_AFTER_REGISTER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(all(test, not(loom)))]
fn fail_after_register() -> bool {
    FAIL_AFTER_REGISTER.with(|f| f.get())
}

#[cfg(not(all(test, not(loom))))]
fn fail_after_register() -> bool {
    false
}

/// How long the drop of a pager's last handle, or of an object's, waits
/// for threads that may be inside a store call: `Config::io_timeout` plus
/// a second.
fn shutdown_grace(config: &Config) -> Duration {
    config.io_timeout.saturating_add(Duration::from_secs(1))
}

/// A user-space pager: maps objects and serves their page faults.
pub struct Pager {
    core: Arc<Core>,
    workers: Arc<Workers>,
    config: Config,
    /// How the userfaultfd was opened; `None` under the Protect engine.
    source: Option<UffdSource>,
    engine: EngineInfo,
}

/// Which paging engine a pager runs ([`Pager::engine`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    /// [`Engine::Userfaultfd`] or [`Engine::Protect`] (never
    /// [`Engine::Auto`]).
    pub engine: Engine,
    /// Why: who asked for it, or what [`Engine::Auto`] found.
    pub why: String,
}

impl std::fmt::Display for EngineInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.engine, self.why)
    }
}

/// A userfaultfd opened for a pager, with what its kernel supports.
struct OpenedUffd {
    uffd: OwnedFd,
    source: UffdSource,
    /// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`: writable mappings.
    write_protect: bool,
    /// `MINOR_HUGETLBFS | MISSING_HUGETLBFS`: 2 MiB pages.
    hugetlb: bool,
}

/// Opens the userfaultfd of a pager: learns the kernel's features on a
/// throw-away fd (the handshake can be made once per fd) and names any
/// that is missing, then opens the real one with exactly those features
/// (and WP on shmem and hugetlb minor faults if the kernel has them).
fn open_uffd_engine(signal: bool) -> Result<OpenedUffd, PagerError> {
    let (probe, _) = open_uffd()?;
    let have = sys::uffd_api(&probe, 0).map_err(|source| PagerError::Sys {
        op: "UFFDIO_API",
        source,
    })?;
    drop(probe);
    for (bit, why) in REQUIRED_FEATURES {
        if have & bit == 0 {
            return Err(PagerError::MissingFeature {
                feature: feature::name(bit),
                why,
            });
        }
    }
    if signal && have & feature::SIGBUS == 0 {
        return Err(PagerError::MissingFeature {
            feature: feature::name(feature::SIGBUS),
            why: "for signal delivery (use Delivery::Handler)",
        });
    }
    let (uffd, source) = open_uffd()?;
    let mut wanted = REQUIRED_FEATURES.iter().fold(0, |acc, (bit, _)| acc | bit);
    if signal {
        wanted |= feature::SIGBUS;
    }
    let write_protect = have & feature::WP_HUGETLBFS_SHMEM != 0;
    if write_protect {
        wanted |= feature::WP_HUGETLBFS_SHMEM;
    }
    let hugetlb_bits = feature::MINOR_HUGETLBFS | feature::MISSING_HUGETLBFS;
    let hugetlb = have & hugetlb_bits == hugetlb_bits;
    if hugetlb {
        wanted |= hugetlb_bits;
    }
    sys::uffd_api(&uffd, wanted).map_err(|source| PagerError::Sys {
        op: "UFFDIO_API",
        source,
    })?;
    Ok(OpenedUffd {
        uffd,
        source,
        write_protect,
        hugetlb,
    })
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("config", &self.config)
            .finish()
    }
}

impl Pager {
    /// Creates a pager: picks its engine ([`Config::engine`], or
    /// [`ENGINE_ENV`](crate::ENGINE_ENV) in the environment), opens the
    /// userfaultfd and checks the kernel's features (under the Userfaultfd
    /// engine), and starts the pager threads.
    pub fn new(config: Config) -> Result<Pager, PagerError> {
        config.validate()?;
        if !sys::page_size_matches() {
            return Err(PagerError::PageSize);
        }
        let signal = config.delivery == Delivery::Signal;
        // 1-2. The engine.
        let (wanted, asked_by) = match engine_from_env()? {
            Some(engine) => (engine, crate::base::config::ENGINE_ENV),
            None => (config.engine, "the configuration"),
        };
        let opened = match wanted {
            Engine::Userfaultfd => Some(open_uffd_engine(signal)?),
            Engine::Protect => None,
            Engine::Auto => match open_uffd_engine(signal) {
                Ok(opened) => Some(opened),
                Err(e) => {
                    let found = match &e {
                        PagerError::Unavailable { source, .. } => {
                            format!("userfaultfd refused: {source}")
                        }
                        other => other.to_string(),
                    };
                    let why = format!("auto: {found}; mprotect instead");
                    return Pager::start(config, None, why);
                }
            },
        };
        let why = match (&opened, wanted) {
            (Some(opened), Engine::Auto) => format!("auto: {}", opened.source.describe()),
            (Some(opened), _) => format!("asked for by {asked_by}: {}", opened.source.describe()),
            (None, _) => format!("asked for by {asked_by}"),
        };
        Pager::start(config, opened, why)
    }

    /// [`Pager::new`] once the engine is chosen: `opened` is the
    /// userfaultfd (`None`: the Protect engine).
    fn start(config: Config, opened: Option<OpenedUffd>, why: String) -> Result<Pager, PagerError> {
        let signal = opened.is_none() || config.delivery == Delivery::Signal;
        let (engine, source, write_protect, hugetlb) = match opened {
            Some(o) => (
                PagingEngine::Userfaultfd(Arc::new(Uffd::new(o.uffd))),
                Some(o.source),
                o.write_protect,
                o.hugetlb,
            ),
            // mprotect needs no kernel feature: writable mappings and 2
            // MiB pages work wherever the memfd does.
            None => (
                PagingEngine::Protect(Protect::new(!config.protect_mprotect_only)),
                None,
                true,
                true,
            ),
        };
        let engine_info = EngineInfo {
            engine: engine.kind(),
            why,
        };
        // 3. The I/O threads, then the handler threads.
        let counters = Arc::new(Counters::default());
        let io_shared = Arc::new(IoShared::new(
            counters.clone(),
            config.io_retries,
            config.io_depth,
        ));
        let (io_threads, io) =
            IoThreads::start(config.io_threads, io_shared.clone()).map_err(|source| {
                PagerError::Sys {
                    op: "spawning an I/O thread",
                    source,
                }
            })?;
        let requests = if signal {
            let installed = match engine {
                PagingEngine::Userfaultfd(_) => signal::install(),
                // A pager's own engine is never a child's.
                PagingEngine::Protect(_) | PagingEngine::Child(_) => signal::install_protect(),
            };
            installed.map_err(|source| PagerError::Sys {
                op: "sigaction(SIGBUS, SIGSEGV)",
                source,
            })?;
            Some(Arc::new(Requests::new().map_err(|source| {
                PagerError::Sys {
                    op: "eventfd",
                    source,
                }
            })?))
        } else {
            None
        };
        let core = Arc::new(Core {
            engine,
            counters: counters.clone(),
            ra: RaCounters::default(),
            io,
            speculative: config.region_lookup == RegionLookup::Speculative,
            global_cache_lock: config.bench_global_cache_lock,
            reading: Mutex::new(()),
            handling_events: std::sync::atomic::AtomicBool::new(false),
            requests,
            mappings: AtomicUsize::new(0),
            budget: Budget::new(config.memory_budget, counters.clone()),
            io_shared,
            write_protect,
            hugetlb,
            table: None,
        });
        let stop = sys::eventfd().map_err(|source| PagerError::Sys {
            op: "eventfd",
            source,
        })?;
        let mut evictors = Vec::new();
        if core.budget.is_limited() {
            evictors.push(
                core.budget
                    .start("faultmap-evict".into())
                    .map_err(|source| PagerError::Sys {
                        op: "spawning the evictor thread",
                        source,
                    })?,
            );
        }
        let workers = Arc::new(Workers {
            stop,
            threads: Mutex::new(Vec::new()),
            io: Mutex::new(Some(io_threads)),
            evictors: Mutex::new(evictors),
            flusher: Mutex::new(None),
            grace: shutdown_grace(&config),
            born: sys::fork_generation(),
        });
        // 4. The watchdog (`crate::mm::errors`): store timeouts, truncation.
        {
            let shared = core.io_shared.clone();
            let stop = workers
                .stop
                .try_clone()
                .map_err(|source| PagerError::Sys { op: "dup", source })?;
            let timeout = config.io_timeout;
            let handle = std::thread::Builder::new()
                .name("faultmap-watchdog".into())
                .spawn(move || errors::watchdog_loop(&shared, &stop, timeout))
                .map_err(|source| PagerError::Sys {
                    op: "spawning the watchdog thread",
                    source,
                })?;
            workers
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(handle);
        }
        for (i, place) in handler_places(&config, signal).into_iter().enumerate() {
            let core = core.clone();
            let stop = workers
                .stop
                .try_clone()
                .map_err(|source| PagerError::Sys { op: "dup", source })?;
            let (name, reading) = match place {
                Place::Cpu(cpu) => (format!("faultmap-cpu{cpu}"), Reading::ONE),
                Place::Floating => (
                    format!("faultmap-{i}"),
                    Reading::batches(config.handler_spin_us),
                ),
            };
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    if let Place::Cpu(cpu) = place {
                        // A CPU taken away since (a cpuset change): the
                        // thread serves faults from wherever it runs.
                        let _ = sys::pin_current_thread(&[cpu]);
                    }
                    match (&core.engine, core.requests()) {
                        (PagingEngine::Userfaultfd(uffd), _) => {
                            handler_loop(&core, uffd, &stop, reading)
                        }
                        (PagingEngine::Protect(_), Some(requests)) => {
                            request_loop(&core, requests, &stop, reading.spin)
                        }
                        (PagingEngine::Protect(_), None) | (PagingEngine::Child(_), _) => {}
                    }
                })
                .map_err(|source| PagerError::Sys {
                    op: "spawning a handler thread",
                    source,
                })?;
            workers
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(handle);
        }
        Ok(Pager {
            core,
            workers,
            config,
            source,
            engine: engine_info,
        })
    }

    /// Which paging engine this pager runs, and why: [`Engine::Auto`]
    /// resolved, and what it found.
    pub fn engine(&self) -> &EngineInfo {
        &self.engine
    }

    /// The Protect engine's memory areas (`None` under the Userfaultfd
    /// engine): see "In containers" in the README.
    pub fn areas(&self) -> Option<AreaStats> {
        self.core.engine.protect().map(Protect::stats)
    }

    /// The pager's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether faults that the kernel takes on the application's behalf are
    /// served: a system call that reads from a mapping (`write(fd, &map[..],
    /// ..)`, `send`, an O_DIRECT write) waits for the pages like a plain
    /// load. True for root, for users with read-write access to
    /// `/dev/userfaultfd`, or with `vm.unprivileged_userfaultfd=1`. Otherwise
    /// the pager falls back to a user-mode-only userfaultfd, and such a
    /// system call fails with `EFAULT` on a page not yet mapped: touch the
    /// range first, or copy it out in user space.
    pub fn serves_kernel_faults(&self) -> bool {
        self.source.is_some_and(UffdSource::serves_kernel_faults)
    }

    /// Opens `store` as an object with a cache of its own, to map once or
    /// many times ([`Pager::map`] with the [`Object`]).
    pub fn open(&self, store: impl Store) -> Result<Object, MapError> {
        self.open_with_page_size(store, self.config.page_size)
    }

    /// Opens `store` as an object with pages of `size` ([`PageSize`]; the
    /// pager's [`Config::page_size`] is the default of [`Pager::open`]).
    /// With 2 MiB pages the kernel's pool of huge pages must hold the
    /// whole object, or as much of it as the pager's memory budget: else
    /// [`CacheError::HugePages`], which says how to grow the pool.
    pub fn open_with_page_size(
        &self,
        store: impl Store,
        size: PageSize,
    ) -> Result<Object, MapError> {
        self.new_object(Box::new(store), self.core.budget.clone(), None, size)
    }

    /// Opens `store` as an object with a memory budget of its own (at
    /// least [`crate::MIN_BUDGET`] bytes): its pages are charged to
    /// that budget, not the pager's, and a thread of its own evicts them.
    pub fn open_with_budget(&self, store: impl Store, budget: u64) -> Result<Object, MapError> {
        if budget < crate::base::config::MIN_BUDGET {
            return Err(MapError::Options(ConfigError::Budget(budget)));
        }
        let domain = Budget::new(Some(budget), self.core.counters.clone());
        let evictor = domain
            .start(format!(
                "faultmap-evict-{}",
                store.name().chars().take(4).collect::<String>()
            ))
            .map_err(|source| MapError::Map {
                name: store.name().to_string(),
                op: "spawning an evictor thread",
                source,
            })?;
        // The evictor ends with the object (not with the pager's workers).
        self.new_object(
            Box::new(store),
            domain,
            Some(evictor),
            self.config.page_size,
        )
    }

    /// An object over `store`, charged to `budget`, watched by this pager.
    fn new_object(
        &self,
        store: Box<dyn Store>,
        budget: Arc<Budget>,
        evictor: Option<Evictor>,
        size: PageSize,
    ) -> Result<Object, MapError> {
        let len = store.len();
        if size == PageSize::Huge && !self.core.hugetlb {
            return Err(MapError::MissingIoctl {
                name: store.name().to_string(),
                ioctl: "UFFDIO_CONTINUE on hugetlb (UFFD_FEATURE_MINOR_HUGETLBFS)",
            });
        }
        if let Some(limit) = budget.limit_bytes().filter(|&b| {
            size == PageSize::Huge
                && b < crate::base::config::MIN_HUGE_BUDGET_PAGES * size.bytes() as u64
        }) {
            return Err(MapError::Options(ConfigError::HugeBudget(limit)));
        }
        let cache = Cache::new(store.name(), len, size, budget.limit_bytes())?;
        let grace = shutdown_grace(&self.config);
        let object = Arc::new(ObjectCore::new(
            store,
            cache,
            len,
            budget.clone(),
            grace,
            evictor,
        ));
        budget.add_object(&object);
        self.core.io_shared.watch(&object);
        Ok(Object::new(object))
    }

    /// The pager's memory: its budget, bytes cached (pages being read
    /// included), the peak so far, and the active set. Objects opened with
    /// a budget of their own are not counted here (see
    /// [`Object::memory`]).
    pub fn memory(&self) -> Memory {
        self.core.budget.memory()
    }

    /// Maps `source` (an [`Object`], whose cache the mapping shares, or a
    /// [`Store`], opened as a new object) read-only, as `opts` says. The
    /// mapping reads like a `&[u8]`.
    ///
    /// An empty object, or a zero length, gives an empty mapping (a zero-length
    /// slice), not an error.
    ///
    /// # Safety
    ///
    /// The mapping hands out `&[u8]` over memory that faultmap fills from
    /// the store, and Rust lets no byte behind a `&[u8]` change while it
    /// lives. faultmap itself never changes a mapped byte, but it cannot
    /// see what others do, so the caller promises, for as long as the
    /// mapping lives (the contract of memmap2's `Mmap::map`, for the same
    /// reason; see "Soundness" on [`Mapping`]):
    ///
    /// 1. **The store's bytes do not change.** faultmap may drop a page
    ///    (memory budget, [`Mapping::invalidate`], a timed-out read) and
    ///    read it again; the store must return the same bytes. A
    ///    [`crate::FileStore`] over a file that another process writes
    ///    breaks this, as it breaks `mmap` of that file. (A store that
    ///    shrinks is fine: pages past the new end give SIGBUS, never other
    ///    bytes.)
    /// 2. **Nobody writes these bytes through another mapping while a
    ///    reference into this one lives**: no [`MappingMut`] of the same
    ///    object, no raw pointer, no other process. Writes that happen
    ///    while no `&[u8]` of this mapping is held are fine, and are seen
    ///    by the next one.
    /// 3. **A forked child does not map over the mapping's range**
    ///    (`MAP_FIXED` over the range faultmap maps again there, or the
    ///    placeholder it leaves in a child it does not serve, see "fork"
    ///    above) while it can still reach a reference into it.
    pub unsafe fn map(
        &self,
        source: impl IntoObject,
        opts: MapOptions,
    ) -> Result<Mapping, MapError> {
        self.map_with(source, opts)
    }

    /// Maps `source` read-write (`MAP_SHARED`), as `opts` says: the mapping
    /// reads like a `&[u8]` and writes like a `&mut [u8]`. Writes land in
    /// the object's cache, are seen at once by every mapping of the object,
    /// and go back to the store on [`MappingMut::flush`], [`Object::flush`]
    /// or from the background flusher (`crate::mm::writeback`). The store must
    /// take writes ([`Store::writable`]); else [`MapError::ReadOnlyStore`].
    ///
    /// # Safety
    ///
    /// As for [`Pager::map`], and in both directions: while a `&[u8]` or
    /// `&mut [u8]` of this mapping lives, no other mapping of the object
    /// (read-only or writable), raw pointer or process writes its bytes,
    /// and while a `&mut [u8]` of it lives, nothing else reads them
    /// through a reference either. Two writable mappings of one object are
    /// allowed; their slices must not be live at once over the same bytes.
    pub unsafe fn map_mut(
        &self,
        source: impl IntoObject,
        opts: MapOptions,
    ) -> Result<MappingMut, MapError> {
        self.map_with(source, opts)
    }

    /// [`Pager::map`] and [`Pager::map_mut`]: the access comes from `A`.
    fn map_with<A: Access>(
        &self,
        source: impl IntoObject,
        opts: MapOptions,
    ) -> Result<Mapping<A>, MapError> {
        let size = opts.page_size_override().unwrap_or(self.config.page_size);
        let object = source.into_object(self, size)?;
        if opts
            .page_size_override()
            .is_some_and(|s| s != object.page_size())
        {
            return Err(MapError::PageSize {
                name: object.name().to_string(),
                object: object.page_size(),
                asked: size,
            });
        }
        let size = object.page_size();
        // An object opened by another pager: its errors reach this pager's
        // log too, this pager's watchdog polls its length, and its flusher
        // writes it back.
        self.core.io_shared.watch(&object.0);
        let extent = opts.resolve(object.len(), size)?;
        if let Some(trace) = opts.trace_to_replay() {
            let version = object.0.store.version();
            trace.check(object.name(), object.len(), version.as_deref(), size)?;
        }
        // With sharing on, a read-only mapping owns its object version's
        // cache or joins another process's (`crate::api::shared`).
        let mut object = object;
        let mut sharing = Sharing::Private { why: None };
        let mut joined = None;
        // Not 2 MiB pages: a joiner opens the object before it decides,
        // and that open checks the pool for a whole cache of its own.
        // Under the Protect engine a joiner's range starts inaccessible
        // and its owner grants pages and takes them back
        // (`crate::sys::revoke`), as for a forked child.
        let shareable = self.config.shared
            && !A::WRITABLE
            && size == PageSize::Base
            && extent.pages > 0
            && opts.trace_to_replay().is_none()
            && !opts.records_trace();
        let key = object.0.store.share_key().filter(|_| shareable);
        if let Some(key) = key {
            let source = self.source;
            let key = format!("{key}, pages of {} bytes", size.bytes());
            let timeout = self.config.io_timeout;
            let threads = self.workers.clone();
            match shared::plan(&self.core, threads, source, &object, &key, &extent, timeout) {
                Plan::Own(hosted) => {
                    object = hosted;
                    self.core.io_shared.watch(&object.0);
                    sharing = Sharing::Owner;
                }
                Plan::Join(map) => {
                    joined = Some(map);
                    sharing = Sharing::Joined;
                }
                Plan::Private(why) => sharing = Sharing::Private { why: Some(why) },
            }
        }
        let mut mapping = Mapping {
            region: None,
            joined: None,
            sharing,
            ptr: NonNull::dangling(),
            len: 0,
            object: object.clone(),
            core: self.core.clone(),
            workers: self.workers.clone(),
            kernel_faults: self.core.requests().is_none() && self.serves_kernel_faults(),
            born: sys::fork_generation(),
            records: opts.records_trace(),
            replay: None,
            access: PhantomData,
        };
        if extent.pages == 0 {
            return Ok(mapping);
        }
        if let Some(joined) = joined {
            // SAFETY: lead < the page size <= the mapping's length, so the
            // pointer is inside the range, which `joined` keeps mapped.
            mapping.ptr =
                unsafe { NonNull::new_unchecked((joined.addr() as *mut u8).add(extent.lead)) };
            mapping.len = extent.len;
            let mut joined = joined;
            joined.base = object.0.cache.offset(ObjectPage(extent.first_page)) + extent.lead as u64;
            mapping.joined = Some(joined);
            return Ok(mapping);
        }
        let name = object.name().to_string();
        let writable = A::WRITABLE;
        // 0. A writable mapping needs a store that takes writes, a kernel
        //    with WP on shmem (under the Userfaultfd engine), and the
        //    flusher.
        if writable {
            if !object.0.store.writable() {
                return Err(MapError::ReadOnlyStore { name });
            }
            if !self.core.write_protect {
                return Err(MapError::MissingIoctl {
                    name,
                    ioctl: "UFFDIO_WRITEPROTECT (UFFD_FEATURE_WP_HUGETLBFS_SHMEM)",
                });
            }
            crate::mm::writeback::init();
            self.workers
                .start_flusher(&self.core, self.config.dirty_expire)
                .map_err(|source| MapError::Map {
                    name: name.clone(),
                    op: "spawning the flusher thread",
                    source,
                })?;
        }
        let map_err = |op, source| MapError::Map {
            name: name.clone(),
            op,
            source,
        };
        // The access trace it records or replays (`crate::mm::trace`).
        let first_page = ObjectPage(extent.first_page);
        let record = match opts.records_trace() {
            false => None,
            true => {
                let pages = first_page..first_page.add(extent.pages);
                let recorder = Recorder::new(pages).ok_or_else(|| {
                    map_err(
                        "allocating the access trace's log (4 bytes a page; at most 16 TiB)",
                        std::io::Error::from_raw_os_error(libc::ENOMEM),
                    )
                })?;
                Some(Arc::new(recorder))
            }
        };
        let replay = opts.trace_to_replay().map(|trace| {
            let budget = &object.0.budget;
            // The read-around window of a miss in this mapping: the unit
            // the replay reads each first touch in.
            let ra_pages = opts
                .ra_pages_override()
                .unwrap_or(object.0.ra_pages)
                .min(budget.max_ra_pages(&object.0));
            let unit = match opts.readahead_mode() {
                ReadaheadMode::Off => 1,
                ReadaheadMode::AroundOnly => ra_pages,
                ReadaheadMode::Full => object.0.around_pages.unwrap_or(ra_pages).min(ra_pages),
            };
            let ahead = opts.replay_ahead_pages().unwrap_or_else(|| {
                trace::default_ahead(unit, self.config.io_depth, size.base_pages())
            });
            let ahead = if budget.is_limited() {
                ahead.min(budget.max_replay_pages(&object.0))
            } else {
                ahead
            };
            let pages = first_page.0..first_page.0 + extent.pages;
            Replay::new(trace, pages, unit, object.0.io_pages, ahead)
                .map(Arc::new)
                .ok_or_else(|| {
                    map_err(
                        "allocating the trace replay's bitmap (a bit per read)",
                        std::io::Error::from_raw_os_error(libc::ENOMEM),
                    )
                })
        });
        let replay = replay.transpose()?;
        // The table's lock for the whole operation, as mmap holds
        // mmap_lock (let go only while it waits for a stale region, below).
        let mut table = RegionTable::get().lock();
        // 1. Map the memfd (read-only unless writable; inaccessible under
        //    the Protect engine), congruent to its offset modulo 2 MiB.
        let bytes = extent.pages as usize * size.bytes();
        let map = sys::mmap_shared_aligned(
            object.0.cache.memfd(),
            bytes,
            object.0.cache.offset(first_page),
            PTRS_PER_PTE * PAGE_SIZE,
            self.core.engine.initial_prot(writable, size.shift(), bytes),
        )
        .map_err(|e| map_err("mmap", e))?;
        // A region still published over the range the kernel just gave us
        // was unmapped or moved by the application (this thread, before
        // this call, or another), and its pager has not handled that event
        // yet: wait until it has, so that a fault here never finds the
        // stale region and the event, handled later, never detaches the
        // new one (`crate::mm::events`). A pager thread handles a read
        // event under the table's lock, so the lock alone shows it handled.
        let range = HostAddr(map.addr())..HostAddr(map.addr() + map.len());
        let deadline = Instant::now() + STALE_REGION_WAIT;
        while table.overlaps(range.clone()) {
            drop(table);
            if Instant::now() >= deadline {
                return Err(map_err(
                    "waiting for a pager to read the unmap event of a mapping at this address",
                    std::io::Error::from_raw_os_error(libc::EBUSY),
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
            table = RegionTable::get().lock();
        }
        // 2. A forked child does not inherit it (its copy would lose the
        //    registration and read holes as zeros): it maps the range
        //    again from the memfd and this process serves its faults from
        //    the same cache (`crate::mm::guest`), or, if that cannot be
        //    had, gets an inaccessible placeholder there (`sys::fork`).
        //    Under the Protect engine the child maps it inaccessible, and
        //    this process grants it pages and has it take them back before
        //    they are evicted (`crate::sys::revoke`).
        crate::mm::guest::serve(&self.core, self.source)
            .map_err(|e| map_err("starting the service for forked children", e))?;
        let shared = Some((
            object.0.cache.memfd(),
            object.0.cache.offset(first_page),
            writable,
            self.core.engine.protect().is_some(),
        ));
        sys::dont_fork(&map, shared).map_err(|e| map_err("madvise(MADV_DONTFORK)", e))?;
        // Faultmap's SIGSEGV handler, put back if something replaced it.
        if self.core.engine.protect().is_some() {
            signal::keep_protect_handler().map_err(|e| map_err("sigaction(SIGSEGV)", e))?;
        }
        // 3. Arm it (`PagingEngine::arm`): under the Userfaultfd engine,
        //    register MISSING|MINOR (|WP); CONTINUE, WAKE and POISON (and
        //    WRITEPROTECT) must be allowed. From here on a failure
        //    unregisters the range before `map` unmaps it: a registered
        //    range's munmap raises an UNMAP event and waits until a pager
        //    thread reads it; its handling would then detach nothing, and
        //    the wait is needless.
        match self.core.engine.arm(
            map.addr(),
            map.len(),
            writable,
            size.shift(),
            fail_after_register(),
        ) {
            Ok(()) => {}
            Err(ArmError::Register(e)) => return Err(map_err("UFFDIO_REGISTER", e)),
            Err(ArmError::Guard(e)) => return Err(map_err("madvise(MADV_GUARD_INSTALL)", e)),
            Err(ArmError::MissingIoctl(ioctl)) => {
                return Err(MapError::MissingIoctl { name, ioctl })
            }
        }
        // 4. Publish the region: from here on its faults are served.
        let region = Arc::new(Region {
            map,
            object: object.0.clone(),
            first_page: ObjectPage(extent.first_page),
            pages: extent.pages,
            page_shift: size.shift(),
            order: AtomicU8::new(opts.order()),
            density: AtomicU32::new(crate::policy::fault_around::DENSITY_START),
            seq: SeqCount::default(),
            owner: self.core.clone(),
            counters: Counters::default(),
            ra: RaCounters::default(),
            ra_pages: opts.ra_pages_override().unwrap_or(object.0.ra_pages),
            ra_mode: opts.readahead_mode(),
            ra_adapt: opts.adaptive_read_around(),
            hints: AtomicPtr::new(Box::into_raw(Box::default())),
            mapped: MappedPages::new(extent.pages),
            successors: Mutex::new(Vec::new()),
            writable,
            trace: RegionTrace {
                record,
                replay: replay.clone(),
            },
        });
        // Listed in the object before it is published: write-back finds
        // (and write-protects) every region that a fault can make writable.
        object.0.add_mapping(&region);
        table.insert(region.clone());
        drop(table);
        self.core.mappings.fetch_add(1, Ordering::Relaxed);
        // SAFETY: lead < the page size <= the mapping's length, so the pointer is
        // inside the mapping.
        mapping.ptr = unsafe { NonNull::new_unchecked(region.map.as_ptr().add(extent.lead)) };
        mapping.len = extent.len;
        mapping.region = Some(region.clone());
        if let Some(replay) = replay {
            // On failure the mapping is dropped, and unmapped, on the way
            // out.
            let thread = ReplayThread::start(region, replay)
                .map_err(|e| map_err("spawning the trace replay thread", e))?;
            mapping.replay = Some(thread);
        }
        Ok(mapping)
    }

    /// Counters summed over every mapping this pager has served. A fault
    /// that let its thread go before this call is counted: the snapshot
    /// waits (at most a second) for the faults begun before it, not for
    /// later ones; a fault that never ends (its store read hangs while the
    /// pager stops) makes every such wait take the second. (A thread may
    /// also be let go by another fault's mapping of its page before its own
    /// fault is read; that one counts when read.)
    pub fn stats(&self) -> Stats {
        self.core.counters.snapshot()
    }

    /// The readahead table of every mapping this pager served.
    pub fn ra_stats(&self) -> RaStats {
        self.core.counters.settle();
        self.core.ra.snapshot()
    }

    /// The last store failures of every object this pager opened or
    /// mapped (at most [`crate::LOG_CAPACITY`], oldest first): failed
    /// reads (after their retries), timeouts, failed write-backs. The log
    /// is kept; see [`Pager::take_io_errors`] to drain it.
    pub fn io_errors(&self) -> Vec<IoErrorReport> {
        self.core.io_shared.log.snapshot()
    }

    /// Like [`Pager::io_errors`], and empties the pager's log (the objects'
    /// own logs are kept).
    pub fn take_io_errors(&self) -> Vec<IoErrorReport> {
        self.core.io_shared.log.take()
    }

    /// How many non-empty mappings are live (an empty mapping registers
    /// nothing and is not counted).
    pub fn mappings(&self) -> usize {
        self.core.mappings.load(Ordering::Relaxed)
    }
}

fn open_uffd() -> Result<(OwnedFd, UffdSource), PagerError> {
    sys::open_userfaultfd().map_err(|source| {
        let hint = match source.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                "run as root, give this user read-write access to /dev/userfaultfd, \
                 or set the sysctl vm.unprivileged_userfaultfd=1; in a container, \
                 pass --device /dev/userfaultfd or a seccomp profile that allows the call, \
                 or use the protect engine (FAULTMAP_ENGINE=protect; engine auto falls back \
                 to it): see \"In containers\" in the README"
            }
            Some(libc::ENOSYS) => {
                "this kernel was built without CONFIG_USERFAULTFD, or a sandbox such as \
                 gVisor has none: use the protect engine (FAULTMAP_ENGINE=protect; engine \
                 auto falls back to it)"
            }
            _ => "see the README's troubleshooting section",
        };
        PagerError::Unavailable { source, hint }
    })
}

/// How long a handler thread waits after a userfaultfd read failed with
/// an error other than `EAGAIN` or `EINTR` (none is expected).
const READ_ERROR_BACKOFF: Duration = Duration::from_millis(1);

/// A handler thread: read fault messages ([`Reading`] says how many at a
/// time) and handle them; when none is pending, keep polling for
/// `reading.spin`, then sleep in `poll` on the userfaultfd and the stop
/// eventfd.
fn handler_loop(core: &Arc<Core>, uffd: &Uffd, stop: &OwnedFd, reading: Reading) {
    let env = core.env();
    let mut msgs: Vec<UffdMsg> = Vec::with_capacity(MSG_BATCH);
    let per_read = reading.per_read.clamp(1, MSG_BATCH);
    let spin = reading.spin;
    // One-message reads since the last drain: see `next_take`.
    let small_reads = std::cell::Cell::new(0u32);
    // A read failed (see `read_more`).
    let read_failed = std::cell::Cell::new(false);
    // Appends up to `k` messages to `msgs`; how many came.
    let read_more = |msgs: &mut Vec<UffdMsg>, k: usize| {
        let start = msgs.len();
        msgs.resize(start + k, UffdMsg::default());
        let got = match sys::uffd_read(uffd, &mut msgs[start..]) {
            Ok(got) => got,
            // No error a valid read of a live userfaultfd meets (EAGAIN
            // and EINTR are `Ok(0)`). Should one come, the thread backs off
            // (once it let go of the reading lock and the passage) instead
            // of spinning on `poll`, which would say readable at once
            // again; the faults stay pending and are read on the next try.
            Err(_) => {
                read_failed.set(true);
                0
            }
        };
        msgs.truncate(start + got);
        got
    };
    let mut idle_since = Instant::now();
    // Signal delivery: faults come as forwarded requests, announced on the
    // doorbell; handler threads: as userfaultfd messages. Either way the
    // userfaultfd carries the UNMAP and REMAP events (`crate::mm::events`),
    // whose senders wait until they are read.
    let source: &OwnedFd = core.requests.as_ref().map_or(&**uffd, |r| r.doorbell());
    let read_uffd = |msgs: &mut Vec<UffdMsg>| {
        msgs.clear();
        if msgs.capacity() > 4 * MSG_BATCH {
            // A drain's growth given back.
            msgs.shrink_to(MSG_BATCH);
        }
        // With signal delivery the userfaultfd carries only events, which
        // are rare: look before taking the lock (the SIGBUS handler's
        // classic path waits on it). Handler threads read it for every
        // fault: the read itself says whether there is anything.
        if core.requests.is_some() && !matches!(sys::poll_readable(&[uffd], 0), Ok(r) if r != 0) {
            return 0;
        }
        // Read in a passage, by one thread of this pager at a time, and
        // events handled before either ends: see `crate::mm::events`. No
        // lock shared with other pagers or with map and unmap is taken
        // unless there are events.
        let table = RegionTable::get();
        let passage = table.read_events();
        let reading = match core.reading.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            // Another thread of this pager is reading: it takes what is
            // pending, or its one message (and `poll` returns at once, or
            // wakes this one again, if more is). Do not sleep on it for a
            // read, whose wake-up would cross CPUs; do while it handles
            // events, which may take a grace period.
            Err(std::sync::TryLockError::WouldBlock) => {
                if core.handling_events.load(Ordering::Acquire) {
                    drop(core.reading.lock().unwrap_or_else(|e| e.into_inner()));
                }
                return 0;
            }
        };
        // The kernel hands out every pending fault before any event, and
        // while an UNMAP or REMAP waits every fault ends with its thread
        // faulting again: reading less than all the pending faults could
        // read faults forever and never the event. So, when an event may
        // be waiting (`Uffd::note_event_waiting`) and every
        // `FULL_READ_EVERY` one-message reads, drain: read until a read
        // comes back short or with an event. This thread wakes none of the
        // faults it read until after, so they do not queue again ahead of
        // it; a thread has one fault pending at a time, so the drain ends
        // after about (threads / MSG_BATCH) + 1 reads, plus whatever other
        // wakers (another handler's wake of a range, a finished read, a
        // signal) let fault again meanwhile. Such a thread's fault may
        // then be read twice; the second is handled as a new fault of a
        // page mapped already (`EEXIST`), harmless.
        let (take, count) = next_take(per_read, small_reads.get(), uffd.take_event_waiting());
        small_reads.set(count);
        match take {
            Take::Read(k) => {
                read_more(msgs, k);
            }
            Take::Drain => loop {
                let got = read_more(msgs, MSG_BATCH);
                let tail = &msgs[msgs.len() - got..];
                if got < MSG_BATCH || tail.iter().any(|m| m.event != sys::UFFD_EVENT_PAGEFAULT) {
                    break;
                }
            },
        }
        let n = msgs.len();
        let mut events = msgs
            .iter()
            .filter(|m| m.event != sys::UFFD_EVENT_PAGEFAULT)
            .peekable();
        if events.peek().is_some() {
            core.handling_events.store(true, Ordering::Release);
            let lock = table.lock();
            for msg in events {
                events::handle(&lock, core, msg);
            }
            drop(lock);
            core.handling_events.store(false, Ordering::Release);
        }
        drop(reading);
        drop(passage);
        for msg in msgs.iter().filter(|m| m.event == sys::UFFD_EVENT_PAGEFAULT) {
            let tid = msg.thread_id();
            if msg.flags & sys::UFFD_PAGEFAULT_FLAG_WP != 0 {
                fault::handle_wp(&env, HostAddr(msg.address as usize), tid);
            } else {
                let addr = HostAddr(msg.address as usize);
                fault::handle(&env, addr, fault::Origin::Uffd { tid, wp: false });
            }
        }
        if read_failed.replace(false) {
            std::thread::sleep(READ_ERROR_BACKOFF);
        }
        n
    };
    let serve = |msgs: &mut Vec<UffdMsg>| match &core.requests {
        Some(requests) => {
            requests.serve(|addr, r| {
                fault::handle(&env, addr, fault::Origin::Request(r));
            }) + read_uffd(msgs)
        }
        None => read_uffd(msgs),
    };
    // A handler thread that does not spin goes to `poll` as soon as it
    // has drained the userfaultfd (it read less than it asked for), or
    // after every message when it reads one at a time: `poll` returns at
    // once if more is pending, so either way that is one system call
    // fewer per fault than a read that finds nothing.
    // (With signal delivery `n` counts forwarded requests too, so it
    // says nothing about the userfaultfd: such threads never take this
    // shortcut.)
    let sleep_when_drained = spin.is_zero() && core.requests.is_none();
    loop {
        let n = serve(&mut msgs);
        if n > 0 {
            idle_since = Instant::now();
            if !(sleep_when_drained && (n < per_read || per_read == 1)) {
                continue;
            }
        } else if idle_since.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        if core.requests.is_some() {
            // Drained, then looked at once more: a request posted after
            // the look rings the doorbell again, so poll sees it.
            sys::eventfd_drain(source);
            if serve(&mut msgs) > 0 {
                idle_since = Instant::now();
                continue;
            }
        }
        // The userfaultfd once: each entry is one more wake-up call per
        // fault.
        let polled = if core.requests.is_some() {
            sys::poll_readable(&[source, stop, uffd], -1)
        } else {
            sys::poll_readable(&[source, stop], -1)
        };
        let ready = match polled {
            Ok(ready) => ready,
            // poll has no other failure we could cause; back off and go on.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        if ready & 0b10 != 0 {
            return;
        }
        idle_since = Instant::now();
    }
}

/// A pager thread of the Protect engine: every fault comes forwarded
/// from a SIGSEGV handler ([`Requests`]), announced on the doorbell. Serve
/// what is posted; when nothing is, keep looking for `spin`, then sleep in
/// `poll` on the doorbell and the stop eventfd.
fn request_loop(core: &Arc<Core>, requests: &Arc<Requests>, stop: &OwnedFd, spin: Duration) {
    let env = core.env();
    let doorbell = requests.doorbell();
    let serve = || {
        requests.serve(|addr, r| {
            fault::handle(&env, addr, fault::Origin::Request(r));
        })
    };
    let mut idle_since = Instant::now();
    loop {
        if serve() > 0 {
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        // Drained, then looked at once more: a request posted after the
        // look rings the doorbell again, so poll sees it.
        sys::eventfd_drain(doorbell);
        if serve() > 0 {
            idle_since = Instant::now();
            continue;
        }
        match sys::poll_readable(&[doorbell, stop], -1) {
            Ok(ready) if ready & 0b10 != 0 => return,
            Ok(_) => idle_since = Instant::now(),
            // poll has no other failure we could cause; back off and go on.
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// How long `Mapping::read_at` and `populate` wait for the single-page
/// read of a page whose window failed to begin.
const SINGLE_RETRY_WAIT: Duration = Duration::from_secs(10);

/// How many times `Mapping::populate` maps a writable page again when it
/// is evicted between its read and its write permission.
const POPULATE_TRIES: u32 = 8;

/// How long `Pager::map` waits for a stale region over the range it got
/// to be detached before it gives up (`EBUSY`). A pager thread reads an
/// unmap event within microseconds unless its pager is stuck.
const STALE_REGION_WAIT: Duration = Duration::from_secs(10);

/// How long a guest's [`Mapping::read_at`] keeps asking for a page that
/// is taken back again before it is copied.
const GUEST_RETRY_FOR: Duration = Duration::from_secs(10);

/// Where one pager thread runs.
#[derive(Clone, Copy)]
enum Place {
    /// Pinned to this CPU, sleeping between faults.
    Cpu(usize),
    /// Wherever the scheduler puts it, polling `handler_spin_us`.
    Floating,
}

/// How a pager thread reads the userfaultfd.
#[derive(Clone, Copy)]
struct Reading {
    /// Messages per `read` (1..=[`MSG_BATCH`]).
    per_read: usize,
    /// How long it keeps reading after the last message before it sleeps.
    spin: Duration,
}

impl Reading {
    /// A pinned handler's: one message at a time, then `poll`. The fault
    /// it handles is usually its own CPU's, and the thread that its
    /// `UFFDIO_CONTINUE` wakes usually takes the CPU at once (in a
    /// `sched_switch` trace of 2 threads, 81 % of such wake-ups switched
    /// straight to the woken thread, the handler still runnable). A
    /// second message read with the first (another CPU's fault, queued in
    /// the microsecond before that CPU's handler got to it) would wait
    /// there until this CPU's thread faults again, while the other
    /// handler found nothing to read; read one at a time, it stays in
    /// the userfaultfd for the next handler that reads. Measured in
    /// interleaved runs (`faultmap bench --orders 0 --delivery
    /// handler,signal --repetitions 5`, 2 threads, seq/rand/sparse):
    /// batches of 64 took 6.2–6.9/7.0–7.6/7.9–8.0 µs per fault,
    /// 1.8–2.5× signal delivery; one at a time 5.0/6.0–6.1/6.9–7.1 µs,
    /// 1.6–1.8× (`measurements/handler-reading-ab-2026-11-27.txt`, with
    /// the trace; two runs each. With one thread both make the same
    /// system calls, and their 1-thread rows differ by noise alone, as
    /// much as 30 %). Events queue behind faults: see [`next_take`]. A
    /// handler whose pinning failed keeps this too: it costs a floating
    /// thread that does not spin nothing.
    const ONE: Reading = Reading {
        per_read: 1,
        spin: Duration::ZERO,
    };

    /// A floating handler's (and signal delivery's pager threads'):
    /// batches of [`MSG_BATCH`], polling for `spin_us` microseconds
    /// ([`Config::handler_spin_us`]).
    fn batches(spin_us: u32) -> Reading {
        Reading {
            per_read: MSG_BATCH,
            spin: Duration::from_micros(spin_us.into()),
        }
    }
}

/// The pager threads a configuration asks for (`signal`: faults come
/// forwarded from signal handlers, signal delivery or the Protect engine):
/// with handler delivery and
/// [`HandlerPlacement::PerCpu`], one per CPU the creating thread may run
/// on, the first [`MAX_HANDLER_THREADS`] (see there for why); else
/// `handler_threads` floating ones.
fn handler_places(config: &Config, signal: bool) -> Vec<Place> {
    let floating = vec![Place::Floating; config.handler_threads];
    if signal || config.handler_placement != HandlerPlacement::PerCpu {
        return floating;
    }
    match sys::allowed_cpus() {
        Ok(cpus) if !cpus.is_empty() => cpus
            .into_iter()
            .take(MAX_HANDLER_THREADS)
            .map(Place::Cpu)
            .collect(),
        // sched_getaffinity fails only on a machine with more CPUs than a
        // cpu_set_t holds (1024): floating threads serve it.
        _ => floating,
    }
}

/// What an application says about a range of a mapping; see
/// [`Mapping::advise`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// `MADV_NORMAL`.
    Normal,
    /// `MADV_SEQUENTIAL`.
    Sequential,
    /// `MADV_RANDOM`.
    Random,
    /// `MADV_WILLNEED`.
    WillNeed,
    /// `MADV_DONTNEED`.
    DontNeed,
}

/// How a mapping may be accessed: [`ReadOnly`] or [`ReadWrite`]. Sealed.
pub trait Access: sealed::Sealed + Send + Sync + 'static {
    /// Whether the mapping is `PROT_WRITE` and tracks dirty pages.
    const WRITABLE: bool;
}

/// The access of a [`Mapping`]: reads only. No `&mut [u8]` can be had.
#[derive(Debug)]
pub enum ReadOnly {}

/// The access of a [`MappingMut`]: reads and writes.
#[derive(Debug)]
pub enum ReadWrite {}

impl Access for ReadOnly {
    const WRITABLE: bool = false;
}

impl Access for ReadWrite {
    const WRITABLE: bool = true;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::ReadOnly {}
    impl Sealed for super::ReadWrite {}
}

/// A writable mapping ([`Pager::map_mut`]): reads like a `&[u8]`, writes
/// like a `&mut [u8]`.
pub type MappingMut = Mapping<ReadWrite>;

/// A mapping of (part of) an object ([`Pager::map`]): reads like a
/// `&[u8]`. A [`MappingMut`] ([`Pager::map_mut`]) also writes like a
/// `&mut [u8]`; a read-only one has no mutable access at all.
///
/// Dropping it unmaps it; the threads that serve it stop when the last
/// mapping and the pager are gone.
///
/// # Soundness
///
/// A mapping's bytes are shared memory: the object's cache, which every
/// mapping of the object maps, filled from a store that faultmap does not
/// control. Rust's references promise more than shared memory can keep by
/// itself (no byte behind a `&[u8]` changes while it lives; nothing else
/// touches the bytes behind a `&mut [u8]`). The Rust ecosystem answers
/// this in one of two ways: memmap2 makes *creating* a mapping `unsafe`,
/// with a contract on what others may do, and then hands out plain
/// slices; vm-memory, for guest memory that a VM changes at will, hands
/// out no references at all, only volatile accessors. faultmap's users
/// want slices (`&map[..]`, `bytemuck`, zero-copy numpy arrays), and the
/// hazards all come from outside the library, so faultmap takes memmap2's
/// way:
///
/// - [`Pager::map`] and [`Pager::map_mut`] are `unsafe`: the caller
///   promises that the store's bytes do not change (a dropped page is read
///   again and must come back the same) and that nobody writes a mapping's
///   bytes through another mapping while a reference into it lives. Their
///   `# Safety` sections say exactly what.
/// - Given that, safe code cannot break the rules: a read-only [`Mapping`]
///   implements only `Deref<Target = [u8]>`; a [`MappingMut`] hands out
///   `&mut [u8]` through `DerefMut`, which borrows it mutably, so no other
///   slice of *it* lives meanwhile.
/// - faultmap never changes a mapped byte: pages are filled through the
///   object's private alias mapping before any mapping maps them (the
///   page-state word's invariant 1), so that fill writes through a `&mut
///   [u8]` nobody else can reach. Write-back reads pages that the
///   application may be writing at that moment, so it copies them out with
///   volatile loads through raw pointers, never through a reference
///   (`Cache::copy_out`), and a copy torn by such a write is written again
///   (the page is dirty again).
///
/// So a read-only mapping cannot be written, not even by mistake: these do
/// not compile,
///
/// ```compile_fail,E0594
/// fn zero(map: &mut faultmap::Mapping) {
///     map[0] = 0;
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn flush(map: &faultmap::Mapping) {
///     let _ = map.flush(0..1);
/// }
/// ```
///
/// and neither does a mapping made without `unsafe`:
///
/// ```compile_fail,E0133
/// fn map(pager: &faultmap::Pager, store: faultmap::MemStore) {
///     let _ = pager.map(store, faultmap::MapOptions::new());
/// }
/// ```
///
/// while a [`MappingMut`] writes like a slice:
///
/// ```
/// fn zero(map: &mut faultmap::MappingMut) -> Result<(), faultmap::WriteBackError> {
///     map[0] = 0;
///     map.flush(0..1)?;
///     Ok(())
/// }
/// ```
pub struct Mapping<A: Access = ReadOnly> {
    region: Option<Arc<Region>>,
    /// Another process's cache, mapped here ([`Sharing::Joined`]): then
    /// `region` is `None`.
    joined: Option<Box<JoinedMap>>,
    sharing: Sharing,
    ptr: NonNull<u8>,
    len: usize,
    object: Object,
    core: Arc<Core>,
    workers: Arc<Workers>,
    /// Whether the kernel's own accesses to the mapping wait for their
    /// pages (handler delivery on a userfaultfd that serves kernel faults):
    /// [`Mapping::read_at`] then copies with the kernel's access.
    kernel_faults: bool,
    /// The fork generation that made it (see "fork" above).
    born: u64,
    /// Made with [`MapOptions::record_trace`].
    records: bool,
    /// The thread replaying a trace ([`MapOptions::replay_trace`]).
    replay: Option<ReplayThread>,
    access: PhantomData<A>,
}

// SAFETY: a Mapping is a view of shared memory whose pages are served by
// the pager's threads, whichever thread touches them; it has no
// thread-affine state.
unsafe impl<A: Access> Send for Mapping<A> {}
// SAFETY: `&Mapping` gives out `&[u8]` and raw pointers only. The bytes
// change only through `&mut [u8]` of a MappingMut (DerefMut needs `&mut
// Mapping`, so no `&[u8]` of the same Mapping is live meanwhile) or through
// other mappings, which the `unsafe` contract of `Pager::map`/`map_mut`
// rules out while a reference lives. faultmap itself never writes a
// mapped page (see "Soundness"), so shared access from several threads
// adds no race of its own.
unsafe impl<A: Access> Sync for Mapping<A> {}

impl<A: Access> std::fmt::Debug for Mapping<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("object", &self.object)
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("writable", &A::WRITABLE)
            .finish()
    }
}

impl<A: Access> Mapping<A> {
    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Whether the mapping is writable (a [`MappingMut`]).
    pub fn is_writable(&self) -> bool {
        A::WRITABLE
    }

    /// The address of the first byte.
    fn addr(&self) -> HostAddr {
        HostAddr(self.ptr.as_ptr() as usize)
    }

    /// The object pages that hold bytes `range` (not empty) of the mapping,
    /// whose region is `region`.
    fn pages_holding(&self, region: &Region, range: &Range<usize>) -> Range<ObjectPage> {
        let pages = region.pages_holding(self.addr().add(range.start)..self.addr().add(range.end));
        region.object_page(pages.start)..region.object_page(pages.end)
    }

    /// The object pages that hold bytes `range` of the mapping; `None`
    /// for an empty range or mapping.
    fn object_pages(
        &self,
        range: &std::ops::Range<usize>,
    ) -> Result<Option<std::ops::Range<u64>>, WriteBackError> {
        if range.start > range.end || range.end > self.len {
            return Err(WriteBackError::Range {
                start: range.start as u64,
                end: range.end as u64,
                len: self.len as u64,
            });
        }
        let Some(region) = &self.region else {
            return Ok(None);
        };
        if range.is_empty() {
            return Ok(None);
        }
        let pages = self.pages_holding(region, range);
        Ok(Some(pages.start.0..pages.end.0))
    }

    /// The object it maps.
    pub fn object(&self) -> &Object {
        &self.object
    }

    /// The fault-around order of this mapping
    /// ([`crate::policy::fault_around::AUTO`] when adaptive).
    pub fn fault_around_order(&self) -> u8 {
        self.region.as_ref().map_or(0, |r| r.order())
    }

    /// This mapping's counters, with every fault that let its thread go
    /// before this call (see [`Pager::stats`]).
    pub fn stats(&self) -> Stats {
        self.region
            .as_ref()
            .map_or_else(Stats::default, |r| r.counters.snapshot())
    }

    /// The order in which this mapping's pages were first touched so far,
    /// if it records ([`MapOptions::record_trace`]; `None` otherwise; an
    /// empty mapping's is empty). Save it ([`Trace::save`]) and replay it on a
    /// later mapping of the same object ([`MapOptions::replay_trace`]). A
    /// first touch that races this call may be left out of this copy
    /// (a later call has it).
    pub fn trace(&self) -> Option<Trace> {
        if !self.records {
            return None;
        }
        let pages = self.region.as_ref().and_then(|r| r.trace.record.as_ref());
        Some(Trace::from_pages(
            self.object.len(),
            self.object.page_size(),
            self.object.name(),
            self.object.0.store.version(),
            pages.into_iter().flat_map(|r| r.pages()),
        ))
    }

    /// Where the replay of a trace stands ([`MapOptions::replay_trace`]),
    /// or `None` if this mapping replays none.
    pub fn replay_progress(&self) -> Option<ReplayProgress> {
        let thread = self.replay.as_ref()?;
        let (replayed, used, waiting) = thread.progress();
        Some(ReplayProgress {
            pages: thread.pages(),
            replayed,
            used,
            waiting,
            done: thread.is_done(),
        })
    }

    /// This mapping's readahead table.
    pub fn ra_stats(&self) -> RaStats {
        self.region.as_ref().map_or_else(RaStats::default, |r| {
            r.counters.settle();
            r.ra.snapshot()
        })
    }

    /// Tells faultmap how the application will use the bytes `range` of the
    /// mapping (offsets into the slice), like `madvise`:
    ///
    /// - [`Advice::Normal`]: read-around, sequential detection, async
    ///   readahead (the default);
    /// - [`Advice::Sequential`]: full windows of `ra_pages` on each miss;
    /// - [`Advice::Random`]: no readahead, one page per miss;
    /// - [`Advice::WillNeed`]: start reading the range now, all of it (see
    ///   [`Mapping::prefetch`]); returns at once;
    /// - [`Advice::DontNeed`]: unmap the range from this mapping; its pages
    ///   stay cached, and the next touch maps them again without I/O.
    pub fn advise(&self, advice: Advice, range: std::ops::Range<usize>) -> Result<(), MapError> {
        if range.start > range.end || range.end > self.len {
            return Err(MapError::Options(ConfigError::AdviseRange {
                start: range.start,
                end: range.end,
                len: self.len,
            }));
        }
        let Some(region) = &self.region else {
            return Ok(());
        };
        if range.is_empty() {
            return Ok(());
        }
        // Object pages touched by the range.
        let touched = self.pages_holding(region, &range);
        // The regions that serve the range now: the mapping's own, or, after
        // the application unmapped or moved part of it, the successors that
        // serve what is left (`crate::mm::events`); each with the region pages
        // of the range it holds. Under the table's lock, so that no event
        // changes them meanwhile; settled for DONTNEED, so that a part the
        // application unmapped is never zapped.
        let table = if advice == Advice::DontNeed {
            RegionTable::get().settled()
        } else {
            RegionTable::get().lock()
        };
        let lives = region.live(&table);
        if advice == Advice::WillNeed {
            // Reads are only submitted: no need to hold up faults and
            // events meanwhile.
            drop(table);
            self.will_need_lives(&lives, touched);
            return Ok(());
        }
        for live in lives {
            let Some(pages) = live.region_pages(touched.clone()) else {
                continue;
            };
            let set_hint =
                |hint| table.change(&live, || live.set_hint(&table, pages.clone(), hint));
            match advice {
                Advice::Normal => set_hint(Hint::Normal),
                Advice::Sequential => set_hint(Hint::Sequential),
                Advice::Random => set_hint(Hint::Random),
                Advice::WillNeed => {}
                // The mapping's pages are unmapped (`MADV_DONTNEED`, or
                // `PROT_NONE` under the Protect engine); the cache keeps
                // them.
                Advice::DontNeed => {
                    live.owner
                        .engine
                        .zap(&live, pages.clone())
                        .map_err(|source| MapError::Map {
                            name: self.object.name().to_string(),
                            op: "madvise(MADV_DONTNEED)",
                            source,
                        })?;
                }
            }
        }
        Ok(())
    }

    /// Reads the pages that hold bytes `range` of the mapping (offsets
    /// into the slice) into the cache, waits for them, and maps them here,
    /// readable (and writable, on a writable mapping: each page is
    /// marked dirty, as the kernel's own writes would), so that a system
    /// call can use the memory: `write(fd, &map[a..b])`, `send`, a
    /// `readinto` of a writable mapping. Those are the kernel's accesses,
    /// which raise no signal: under the Protect engine, or a userfaultfd
    /// that serves only user-mode faults, they fail with `EFAULT` on a
    /// page that is not mapped yet. Works under both engines.
    ///
    /// A page that cannot be read is [`MapError::Read`], not SIGBUS. The
    /// pages stay mapped until the memory budget's evictor takes them
    /// (they were just used: it takes colder pages first), or the
    /// application advises `DontNeed`; populate right before the system
    /// call, in pieces no larger than the budget.
    pub fn populate(&self, range: std::ops::Range<usize>) -> Result<(), MapError> {
        if range.start > range.end || range.end > self.len {
            return Err(MapError::Options(ConfigError::AdviseRange {
                start: range.start,
                end: range.end,
                len: self.len,
            }));
        }
        if range.is_empty() {
            return Ok(());
        }
        self.prefetch(range.clone())?;
        let page = self.object.page_size().bytes();
        let base = self.ptr.as_ptr() as usize;
        let first = (base + range.start) & !(page - 1);
        let end = base + range.end;
        for at in (first..end).step_by(page) {
            // The byte at `at`, or the mapping's first if the page starts
            // before it (its lead).
            let byte = at.max(base);
            self.wait_cached(byte - base)?;
            for _ in 0..POPULATE_TRIES {
                // SAFETY: `byte` is inside the mapping (base <= byte < end
                // <= base + len), which `self` keeps mapped; the access
                // faults and is served like any other. A volatile read
                // through a raw pointer, as `read_at`'s: another mapping's
                // writer may change the byte.
                unsafe { std::ptr::read_volatile(byte as *const u8) };
                // A writable mapping's page is made writable too, by the
                // write fault's own path (never by a write of ours, which
                // could race the application's).
                if !A::WRITABLE || self.allow_writes_at(byte)? {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Makes the mapped page that holds address `byte` writable and marks
    /// it dirty, as its first write would (`fault::write_fault`). False if
    /// the page left the cache meanwhile (the caller maps it again).
    fn allow_writes_at(&self, byte: usize) -> Result<bool, MapError> {
        let Some(region) = self.region.as_ref() else {
            return Ok(true);
        };
        if self.born != sys::fork_generation() {
            // A forked child's: its own writes fault as usual.
            return Ok(true);
        }
        let env = region.owner.env();
        let mut tally = Stats::default();
        let page = region.page_of(HostAddr(byte));
        let done = fault::write_fault(&env, region, page, &mut tally, None);
        for counters in [env.counters, &region.counters, &region.object.counters] {
            counters.add(&tally);
        }
        match done {
            fault::WriteFault::Done => Ok(true),
            fault::WriteFault::NotPinned => Ok(false),
            fault::WriteFault::Refused => Err(MapError::Map {
                name: self.object.name().to_string(),
                op: "mprotect (the process is at vm.max_map_count)",
                source: io::Error::from_raw_os_error(libc::ENOMEM),
            }),
        }
    }

    /// Brings the pages that hold bytes `range` (inside the mapping, not
    /// empty) into the cache and waits for them, so that a page the store
    /// cannot read is an error: at once if every page is cached already
    /// (one load of its state each).
    fn read_in(&self, range: std::ops::Range<usize>) -> Result<(), MapError> {
        let Some(region) = self.region.as_ref() else {
            return Ok(());
        };
        if self.born != sys::fork_generation() {
            return Ok(());
        }
        let page = self.object.page_size().bytes();
        let base = self.ptr.as_ptr() as usize;
        let states = &region.object.cache.states;
        let cached = |at: usize| {
            let opage = region.object_page(region.page_of(HostAddr(base + at)));
            states.load(opage).state() == crate::cache::page_state::State::UpToDate
        };
        let first = (base + range.start) & !(page - 1);
        let (start, end) = (base + range.start, base + range.end);
        // Each page's first byte in the range (the range's own first byte
        // for the first page): what an error names.
        let offsets = || (first..end).step_by(page).map(|a| a.max(start) - base);
        if offsets().all(cached) {
            return Ok(());
        }
        // At least a readahead window from the first byte (unless the
        // mapping's readahead is off), so that small reads in order are not
        // each a store request of their own.
        let window = match region.ra_mode {
            ReadaheadMode::Off => 0,
            _ => (region.ra_pages as usize).saturating_mul(page),
        };
        let ahead = range
            .end
            .max(range.start.saturating_add(window))
            .min(self.len);
        self.prefetch(range.start..ahead)?;
        offsets().try_for_each(|at| self.wait_cached(at))
    }

    /// Waits until the page that holds byte `at` of the mapping is cached,
    /// or says why it cannot be: a failed read, or one the watchdog gave
    /// up on. A page that is not cached and not being read (the budget
    /// left it out of the prefetch, or evicted it since) is left to the
    /// access, which reads it.
    fn wait_cached(&self, at: usize) -> Result<(), MapError> {
        let Some(region) = self.region.as_ref() else {
            // Another process serves it: asked directly, so that a page it
            // cannot read is an error here.
            return self.read_at(at, &mut [0u8]);
        };
        if self.born != sys::fork_generation() {
            return self.read_at(at, &mut [0u8]);
        }
        let addr = self.addr().add(at);
        let opage = region.object_page(region.page_of(addr));
        let Some(state) = region.object.cache.states.get(opage) else {
            return Ok(());
        };
        let mut waited = 0u32;
        // A failed read of a window may have failed for another page of
        // it: as the fault path does, this page is read once more alone
        // before its failure counts (`retry`: the word when that read was
        // asked for, until it changes).
        let mut retry: Option<(crate::cache::page_state::Word, Instant)> = None;
        loop {
            let word = state.load();
            match word.state() {
                crate::cache::page_state::State::UpToDate => return Ok(()),
                crate::cache::page_state::State::Absent if word.has_failed() => match retry {
                    None => {
                        retry = Some((word, Instant::now()));
                        // A read is claimed (the word leaves ABSENT) before
                        // its submission returns: none claimed now, none
                        // will be; the page is left to the access (its
                        // range unmapped, the budget full).
                        if self.read_alone(region, at) == 0 && state.load() == word {
                            return Ok(());
                        }
                        continue;
                    }
                    // Not begun yet (bounded: a read that was never
                    // submitted is left to the access).
                    Some((asked, since)) if asked == word => {
                        if since.elapsed() > SINGLE_RETRY_WAIT {
                            return Ok(());
                        }
                        std::thread::sleep(Duration::from_micros(100));
                        continue;
                    }
                    Some(_) => return Err(self.read_failed(at)),
                },
                crate::cache::page_state::State::Absent => return Ok(()),
                crate::cache::page_state::State::Reading if word.is_stalled() => {
                    return Err(self.read_failed(at))
                }
                crate::cache::page_state::State::Reading
                | crate::cache::page_state::State::Evicting => {
                    // A read ends by itself, or the watchdog stalls it at
                    // the store timeout: the loop ends.
                    waited += 1;
                    if waited < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
            }
        }
    }

    /// Starts reading bytes `range` of the mapping (offsets into the
    /// slice) now, and returns at once: the pages not cached yet are read
    /// in the store's largest requests (`Store::io_pages`: 8 MiB for a
    /// remote store), up to [`Config::io_depth`](crate::Config::io_depth)
    /// of them in flight. Under a memory budget the pages that do not fit
    /// when the prefetch is made are left out, as readahead leaves them: a
    /// later access reads them. The same as
    /// [`Advice::WillNeed`]. A later access to a page still being read
    /// waits for that read, not for a new one. When the object's last
    /// handle goes (this mapping and every other, and every [`Object`]),
    /// the prefetch is cancelled: reads still queued are never sent, and
    /// what the reads in flight bring is not cached.
    pub fn prefetch(&self, range: std::ops::Range<usize>) -> Result<(), MapError> {
        self.advise(Advice::WillNeed, range)
    }

    /// Starts reading the byte ranges `ranges` of the mapping (offsets into
    /// the slice, in any order, overlapping or not) now, as few requests
    /// all in flight at once, and returns: the batched prefetch of a
    /// caller that knows its next accesses (a batch of sample rows, the
    /// tensors a layer needs). [`Mapping::wait_ranges`] then waits for
    /// them.
    ///
    /// The ranges' pages are merged into one request across a hole when
    /// reading the hole costs less than a share of a round trip: the hole
    /// limit is the store's measured first-byte latency × bandwidth
    /// ([`Store::link`](crate::Store::link)) over
    /// [`Config::io_depth`](crate::Config::io_depth), the requests in
    /// flight (see [`crate::policy::coalesce`]); a store that reports no
    /// link (a file) merges only ranges that touch. A request is at most
    /// the store's request size (`Store::io_pages`: 8 MiB for a remote
    /// store). Up to `io_depth` requests are in flight at once.
    ///
    /// As [`Mapping::prefetch`]: a page already cached or being read is
    /// not read again; under a memory budget the pages that do not fit
    /// are left out (a later access reads them), and no hole is read
    /// when the ranges and their holes would not fit; when the object's last
    /// handle goes the reads still queued are never sent. A range outside
    /// the mapping is an error, and nothing is read. In a forked child, or
    /// a process that joined another's cache (`Config::shared`), it reads
    /// nothing: the serving process reads each page at its first access.
    pub fn prefetch_ranges(&self, ranges: &[Range<u64>]) -> Result<Prefetched, MapError> {
        self.check_ranges(ranges)?;
        let Some(region) = &self.region else {
            return Ok(Prefetched::default());
        };
        if self.born != sys::fork_generation() {
            // A forked child's: its parent's I/O threads are not here.
            return Ok(Prefetched::default());
        }
        let object = &region.object;
        let page_bytes = self.object.page_size().bytes() as u64;
        let pages: Vec<Range<u64>> = ranges
            .iter()
            .filter(|r| r.start < r.end)
            .map(|r| {
                let p = self.pages_holding(region, &(r.start as usize..r.end as usize));
                p.start.0..p.end.0
            })
            .collect();
        // A panic in the store's answer is no link (as `io_pages` at open).
        let link = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| object.store.link()))
            .ok()
            .flatten();
        let mut hole = link.map_or(0, |l| {
            let depth = self.core.io_shared.depth();
            crate::policy::coalesce::hole_pages(l.latency, l.bytes_per_sec, depth, page_bytes)
        });
        let pages = crate::policy::coalesce::union(&pages);
        let count = |rs: &[Range<u64>]| rs.iter().map(|r| r.end - r.start).sum::<u64>();
        let mut requests = crate::policy::coalesce::coalesce(&pages, hole, object.io_pages);
        // Under a budget, holes must not take the room of the pages asked
        // for (they are claimed in order, up to the budget): where both do
        // not fit, no hole is read.
        let room = object.budget.headroom_pages(object);
        if room.is_some_and(|room| count(&requests) > room) && hole > 0 {
            hole = 0;
            requests = crate::policy::coalesce::coalesce(&pages, hole, object.io_pages);
        }
        let lives = region.live(&RegionTable::get().lock());
        let mut runs = Vec::new();
        for req in &requests {
            for live in &lives {
                let opages = ObjectPage(req.start)..ObjectPage(req.end);
                if let Some(pages) = live.region_pages(opages) {
                    runs.push((live.clone(), pages));
                }
            }
        }
        let requests = self.read_ahead_runs(&runs);
        Ok(Prefetched {
            requests,
            pages: count(&pages),
            hole_pages: hole,
        })
    }

    /// Waits until the pages that hold the byte ranges `ranges` of the
    /// mapping are cached, or says why one cannot be: a read that failed
    /// (after its retries, and once more alone) is [`MapError::Read`]. A
    /// page that is neither cached nor being read (the memory budget left
    /// it out, or evicted it since) is not waited for: the access reads
    /// it. It reads nothing itself but a failed page alone, once more;
    /// pair it with [`Mapping::prefetch_ranges`]. In a forked child, or a
    /// process that joined another's cache, each page is read through the
    /// process that serves it, as [`Mapping::read_at`] reads it (with its
    /// limits: where that copy is made in user space, a page that cannot
    /// be read is SIGBUS).
    pub fn wait_ranges(&self, ranges: &[Range<u64>]) -> Result<(), MapError> {
        self.check_ranges(ranges)?;
        let page = self.object.page_size().bytes();
        let base = self.ptr.as_ptr() as usize;
        // Each page once, however many ranges hold it.
        for r in crate::policy::coalesce::union(ranges) {
            let (start, end) = (base + r.start as usize, base + r.end as usize);
            let first = start & !(page - 1);
            for at in (first..end).step_by(page) {
                self.wait_cached(at.max(start) - base)?;
            }
        }
        Ok(())
    }

    /// Refuses a range that is not inside the mapping.
    fn check_ranges(&self, ranges: &[Range<u64>]) -> Result<(), MapError> {
        let len = self.len as u64;
        match ranges.iter().find(|r| r.start > r.end || r.end > len) {
            None => Ok(()),
            Some(bad) => Err(MapError::Options(ConfigError::AdviseRange {
                start: usize::try_from(bad.start).unwrap_or(usize::MAX),
                end: usize::try_from(bad.end).unwrap_or(usize::MAX),
                len: self.len,
            })),
        }
    }

    /// Drops the pages that hold bytes `range` of the mapping (offsets into
    /// the slice) from the object's cache and from every mapping of the
    /// object, while other threads may be faulting on them: see
    /// [`Object::invalidate`]. Returns how many cached pages were dropped.
    pub fn invalidate(&self, range: std::ops::Range<usize>) -> Result<u64, InvalidateError> {
        if range.start > range.end || range.end > self.len {
            return Err(InvalidateError::Range {
                start: range.start as u64,
                end: range.end as u64,
                len: self.len as u64,
            });
        }
        let Some(region) = &self.region else {
            return Ok(0);
        };
        if range.is_empty() {
            return Ok(0);
        }
        // The object offset of the slice's first byte.
        let base = region.object_offset(self.addr());
        self.object
            .invalidate(base + range.start as u64..base + range.end as u64)
    }

    /// Copies bytes `offset..offset + buf.len()` of the mapping into `buf`,
    /// faulting them in as an access would, but with a failure as an
    /// error, not a signal: a page that the store could not read (after
    /// its retries or at `Config::io_timeout`) is [`MapError::Read`]
    /// here, where an access would get SIGBUS. For bindings whose callers
    /// cannot catch a signal (Python's `m[a:b]`).
    ///
    /// The copy is the kernel's (`process_vm_readv`), whose faults the
    /// handler threads serve when the pager [serves kernel
    /// faults](Pager::serves_kernel_faults) with [`Delivery::Handler`].
    /// Otherwise (signal delivery, a user-mode-only userfaultfd, or a
    /// `process_vm_readv` that the system refuses) the kernel cannot wait
    /// for a page, so the bytes are copied in user space, and a failed page
    /// is SIGBUS as for any access.
    ///
    /// A page that failed is read again by the next access (from the
    /// store, which may have recovered).
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<(), MapError> {
        let end = offset.checked_add(buf.len()).filter(|&end| end <= self.len);
        if end.is_none() {
            return Err(MapError::Options(ConfigError::AdviseRange {
                start: offset,
                end: offset.saturating_add(buf.len()),
                len: self.len,
            }));
        }
        if buf.is_empty() {
            return Ok(());
        }
        // SAFETY: offset + buf.len() <= len (checked above), so the range
        // is inside the mapping, which `self` keeps mapped.
        let src = unsafe { self.ptr.as_ptr().add(offset) };
        if self.joined.is_some() {
            // Another process serves it: asked page by page, as a forked
            // child asks its parent.
            return self.read_as_guest(offset, src, buf);
        }
        if !self.kernel_faults {
            // The pages are read first, so that one the store cannot read
            // is an error here rather than SIGBUS on the copy below.
            self.read_in(offset..offset + buf.len())?;
            // SAFETY: `src..src + buf.len()` is inside the mapping (above),
            // which `self` keeps mapped, so it stays readable (a page not
            // mapped yet faults and is served). Volatile loads through raw
            // pointers, not a reference: another mapping's writer may
            // change the bytes meanwhile (the `Pager::map_mut` contract
            // allows it while no reference lives).
            unsafe { crate::cache::memfd::volatile_copy(src, buf) };
            return Ok(());
        }
        if self.born != sys::fork_generation() {
            // A forked child's: nothing of the parent's (its error log, its
            // locks) is touched here.
            return self.read_as_guest(offset, src, buf);
        }
        let mut done = 0;
        while done < buf.len() {
            // SAFETY: as above: inside the mapping.
            let at = unsafe { src.add(done) };
            match sys::read_own_memory(at, &mut buf[done..]) {
                Ok(n) if n > 0 => done += n,
                // A page the kernel could not fault in: the store failed.
                Ok(_) => return Err(self.read_failed(offset + done)),
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    return Err(self.read_failed(offset + done))
                }
                Err(_) => {
                    // The call itself is refused (a seccomp filter, ENOMEM):
                    // copy in user space, as without kernel faults.
                    // SAFETY: as for the user-space copy above.
                    unsafe { crate::cache::memfd::volatile_copy(at, &mut buf[done..]) };
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Whether this mapping's bytes can be used here: in the process that
    /// mapped it, or in a forked child of it, which maps the range again
    /// and is served by the parent while the parent lives (see "fork" in
    /// this module). Only the
    /// bytes: reading and writing them, [`Mapping::read_at`]; anything
    /// else about the mapping (its options, flush, statistics) is the
    /// parent's.
    pub fn usable_here(&self) -> bool {
        if self.joined.is_some() {
            return self.born == sys::fork_generation();
        }
        if self.born == sys::fork_generation() {
            return true;
        }
        sys::is_guest()
            && (self.len == 0 || sys::fork::served(self.ptr.as_ptr() as usize, self.len))
    }

    /// Whose cache this mapping reads: its own process's, or one shared
    /// with other processes of this user ([`crate::Config::shared`]).
    /// With [`Sharing::Joined`] only the bytes are here: the mapping's
    /// statistics, advice and options are the owner's, and the calls for
    /// them do nothing here.
    pub fn sharing(&self) -> &Sharing {
        &self.sharing
    }

    /// [`Mapping::read_at`] in a forked child, of a mapping it inherited
    /// (served by the parent, `crate::mm::guest`): the kernel copies what
    /// is mapped, and each page it stops at is asked of the parent
    /// directly, so that a page that cannot be read is an error here, not
    /// SIGBUS.
    fn read_as_guest(&self, offset: usize, src: *mut u8, buf: &mut [u8]) -> Result<(), MapError> {
        let mut done = 0;
        let mut asked = 0u32;
        let mut first_ask = None;
        while done < buf.len() {
            // SAFETY: inside the mapping, as in `read_at`.
            let at = unsafe { src.add(done) };
            match sys::read_own_memory(at, &mut buf[done..]) {
                Ok(n) if n > 0 => {
                    done += n;
                    asked = 0;
                    first_ask = None;
                    continue;
                }
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {}
                Err(_) => {
                    // SAFETY: as for the user-space copy in `read_at`.
                    unsafe { crate::cache::memfd::volatile_copy(at, &mut buf[done..]) };
                    return Ok(());
                }
            }
            // The page at `at` is not mapped here: have it mapped (a page
            // evicted again before the copy is asked for again, a few
            // times).
            let page = (at as usize) & !(PAGE_SIZE - 1);
            let mut retry = false;
            // A range joined under the Protect engine: granted (and the
            // grant applied) rather than mapped by the owner.
            let protect = self.joined.as_ref().is_some_and(|j| j.by_protection());
            let mapped = loop {
                if protect {
                    break crate::mm::links::protect_fault(page, false, false) == Some(true);
                }
                match crate::mm::links::request(page, false, retry) {
                    Some(sys::share::Answer::Retry) => retry = true,
                    Some(sys::share::Answer::Mapped) => break true,
                    Some(sys::share::Answer::Grant(grant)) => {
                        use sys::revoke::Granted;
                        break matches!(
                            sys::share::apply_grant(&grant, page),
                            Granted::Applied | Granted::Stale
                        );
                    }
                    _ => break false,
                }
            };
            asked += 1;
            // A page taken back again before the copy (the owner evicts
            // steadily, or the page was being evicted and the fault ended
            // before its eviction did): asked again, a few times at once,
            // then with a breath between, for at most GUEST_RETRY_FOR.
            let since = *first_ask.get_or_insert_with(Instant::now);
            if !mapped || since.elapsed() > GUEST_RETRY_FOR {
                return Err(self.guest_read_failed(offset + done));
            }
            if asked > 8 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// The error of a guest's [`Mapping::read_at`] that stopped at byte
    /// `at` (nothing to zap: the parent serves the page).
    fn guest_read_failed(&self, at: usize) -> MapError {
        let base = match (&self.region, &self.joined) {
            (Some(r), _) => r.object_offset(self.addr()),
            (None, Some(j)) => j.base,
            (None, None) => 0,
        };
        let who = if self.joined.is_some() {
            "the process that owns this shared cache"
        } else {
            "the process that serves this inherited mapping"
        };
        MapError::Read {
            name: self.object.name().to_string(),
            offset: base + at as u64,
            why: format!("{who} could not read it, or is gone"),
        }
    }

    /// The error of a [`Mapping::read_at`] that stopped at byte `at` of
    /// the mapping. The failed page's poison marker, which the fault path
    /// left in this mapping so that the access gets SIGBUS, is zapped: the
    /// next access to the page reads it again.
    fn read_failed(&self, at: usize) -> MapError {
        let base = self
            .region
            .as_ref()
            .map_or(0, |r| r.object_offset(self.addr()));
        let offset = base + at as u64;
        // `advise` rounds out to the page that holds byte `at`.
        let _ = self.advise(Advice::DontNeed, at..(at + 1).min(self.len));
        MapError::Read {
            name: self.object.name().to_string(),
            offset,
            why: self.failure_at(offset),
        }
    }

    /// What the object's error log says of the byte at `offset` (its
    /// latest report of a request that held it).
    fn failure_at(&self, offset: u64) -> String {
        let page = self.object.page_size().bytes() as u64;
        let page = offset / page * page;
        let name = self.object.name();
        let reports = self.object.io_errors();
        let Some(r) = reports.iter().rev().find(|r| {
            r.kind != IoErrorKind::WriteBack
                && r.offset <= page
                && page < r.offset.saturating_add(r.len.max(1))
        }) else {
            return "the store failed or timed out".to_string();
        };
        // The store's message names the object already, as this error does.
        let message = r
            .message
            .strip_prefix(name)
            .and_then(|m| m.strip_prefix(": "))
            .unwrap_or(&r.message);
        match r.kind {
            IoErrorKind::Timeout => format!("the store did not answer in time: {message}"),
            _ => message.to_string(),
        }
    }

    /// Changes the fault-around order of this mapping (0..=9). A fault
    /// being resolved meanwhile either finishes with the old order or
    /// starts again with the new one (the region's sequence count).
    pub fn set_fault_around_order(&self, order: u8) -> Result<(), ConfigError> {
        if order > crate::policy::fault_around::MAX_ORDER {
            return Err(ConfigError::FaultAroundOrder(order));
        }
        self.set_order(order);
        Ok(())
    }

    /// Switches this mapping to adaptive fault-around
    /// ([`MapOptions::fault_around_auto`]). Its density estimate is the one
    /// it had when it last ran adaptive (or the start's, 16 pages): a fixed
    /// order in between neither uses nor changes it.
    pub fn set_fault_around_auto(&self) {
        self.set_order(crate::policy::fault_around::AUTO);
    }

    fn set_order(&self, order: u8) {
        if let Some(region) = &self.region {
            // The mapping's region, or the successors that serve what the
            // application left of it (`crate::mm::events`).
            let table = RegionTable::get().lock();
            for live in region.live(&table) {
                table.change(&live, || live.order.store(order, Ordering::Relaxed));
            }
        }
    }

    /// Submits a read of the page that holds byte `at` of the mapping,
    /// alone, if it is absent; returns the store requests submitted.
    fn read_alone(&self, region: &Arc<Region>, at: usize) -> u64 {
        let touched = self.pages_holding(region, &(at..at + 1));
        let lives = region.live(&RegionTable::get().lock());
        self.will_need_lives(&lives, touched)
    }

    /// `WillNeed` on object pages `touched`, through the regions that serve
    /// them now: submits their absent pages to the I/O threads. Returns
    /// the store requests submitted.
    fn will_need_lives(&self, lives: &[Arc<Region>], touched: Range<ObjectPage>) -> u64 {
        lives
            .iter()
            .filter_map(|live| Some(self.will_need(live, live.region_pages(touched.clone())?)))
            .sum()
    }

    /// `WillNeed`: submits the absent pages of region pages `pages` to the
    /// I/O threads and returns the store requests submitted.
    fn will_need(&self, region: &Arc<Region>, pages: Range<RegionPage>) -> u64 {
        // The whole range, in pieces of the kernel's per-call bound
        // (`force_page_cache_ra` reads at most `max(io_pages, ra_pages)`
        // from the start of what it is given; `madvise` would stop there).
        let piece = region.object.io_pages.max(region.ra_pages).max(1);
        let mut runs = Vec::new();
        let mut start = pages.start;
        while start < pages.end {
            let end = RegionPage(start.0.saturating_add(piece).min(pages.end.0));
            runs.push((region.clone(), start..end));
            start = end;
        }
        self.read_ahead_runs(&runs)
    }

    /// Submits the absent pages of each run (a region and its pages, at
    /// most `max(io_pages, ra_pages)` of them) to the I/O threads, and
    /// counts them. Returns the store requests submitted.
    fn read_ahead_runs(&self, runs: &[(Arc<Region>, Range<RegionPage>)]) -> u64 {
        let env = self.core.env();
        let mut ra = RaTally::default();
        let (mut io_count, mut refault) = (0, 0);
        for (region, pages) in runs {
            let (io, re) = fault::read_ahead(&env, region, pages.clone(), &mut ra);
            io_count += io;
            refault += re;
        }
        let Some(region) = runs.first().map(|(r, _)| r) else {
            return 0;
        };
        let tally = Stats {
            io_count,
            refault,
            ..Stats::default()
        };
        region.ra.add(&ra);
        region.object.ra.add(&ra);
        self.core.ra.add(&ra);
        region.counters.add(&tally);
        region.object.counters.add(&tally);
        self.core.counters.add(&tally);
        io_count
    }
}

/// What a batched prefetch ([`Mapping::prefetch_ranges`]) asked of the
/// store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prefetched {
    /// Store requests submitted (the pages already cached or being read,
    /// and those the budget left out, take none).
    pub requests: u64,
    /// Pages the ranges touch (a page two ranges touch counts once).
    pub pages: u64,
    /// The hole limit used: two ranges at most this many pages apart were
    /// read as one request.
    pub hole_pages: u64,
}

impl Mapping<ReadWrite> {
    /// The first byte, for writing through raw pointers (from several
    /// threads, say). Such writes are `unsafe` and must keep the contract of
    /// [`Pager::map_mut`]: no `&[u8]` or `&mut [u8]` of any mapping of the
    /// object may be live over the bytes written.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Writes the pages that hold bytes `range` of the mapping (offsets
    /// into the slice) back to the store, like `msync(MS_SYNC)`: when it
    /// returns `Ok`, every byte of the range written before the call
    /// (through any mapping of the object) is in the store and
    /// [`Store::sync`] has run. Waits for write-backs of those pages
    /// already in flight. An earlier failed write-back of the object (the
    /// background flusher's) is reported here once: see
    /// [`WriteBackError`]. Returns the pages this call wrote.
    pub fn flush(&self, range: std::ops::Range<usize>) -> Result<u64, WriteBackError> {
        let Some(pages) = self.object_pages(&range)? else {
            return Ok(0);
        };
        let region = self.region.as_ref().map(|r| &r.counters);
        let extra: Vec<&Counters> = region.into_iter().chain([&*self.core.counters]).collect();
        writeback::flush(&self.object.0, pages, &extra)
    }

    /// Queues the pages that hold bytes `range` of the mapping for the
    /// background flusher and returns (`msync(MS_ASYNC)`, which Linux
    /// turned into a no-op; faultmap starts the write-back). No sync.
    pub fn flush_async(&self, range: std::ops::Range<usize>) -> Result<(), WriteBackError> {
        let Some(pages) = self.object_pages(&range)? else {
            return Ok(());
        };
        let flusher = self
            .workers
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(f) = flusher.as_ref() {
            f.queue(&self.object.0, pages);
        }
        Ok(())
    }
}

impl<A: Access> Deref for Mapping<A> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is `len` readable bytes inside the region's mapping
        // (or dangling with len 0), which lives as long as `self` holds the
        // region. Every access to a page not yet mapped faults and is served
        // by the handler threads, which `self` keeps alive. faultmap never
        // changes a mapped page's bytes (pages are filled before they are
        // mapped); the application changes them through this mapping only
        // with `&mut self` (DerefMut), and through others not while this
        // slice lives: the contract of `Pager::map`/`Pager::map_mut`. (In
        // a forked child the range is mapped again from the same memfd and
        // served by the parent, `crate::mm::guest`; where it cannot be, it
        // holds an inaccessible placeholder, `sys::fork`: an access is
        // SIGBUS or SIGSEGV, never other bytes. A child that maps over the
        // range itself (`MAP_FIXED`), or a process whose at-fork handlers
        // could not be registered (`sys::children_reserved`), reaches
        // whatever is mapped there, as with any stale pointer into an
        // unmapped range: item 3 of `Pager::map`'s contract.)
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Mapping<ReadWrite> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and the mapping is PROT_READ|PROT_WRITE
        // (`Pager::map_mut`). `&mut self` excludes every other slice of this
        // Mapping for the borrow's life; other mappings keep off these
        // bytes meanwhile by `Pager::map_mut`'s contract. Writes are served
        // by the fault path: the first store to a page raises a
        // write-protect fault that marks it dirty (`crate::mm::writeback`) and
        // lets the store proceed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<A: Access> AsRef<[u8]> for Mapping<A> {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl<A: Access> Drop for Mapping<A> {
    fn drop(&mut self) {
        if self.born != sys::fork_generation() {
            // A forked child: the region is the parent's, in the parent's
            // table (leaked in the child), its object's rmap lock may be
            // held by a parent thread that is not here. Leave it all be,
            // what this child has at its range too (the range mapped again
            // and served by the parent, or a placeholder; see "fork"
            // above).
            std::mem::forget(self.region.take());
            // A joined range's link, channel and userfaultfd were the
            // parent's: the at-fork handler closed this child's copies
            // (`sys::share`), and the numbers may be reused since.
            std::mem::forget(self.joined.take());
            // The replay thread is the parent's too: not here to join.
            std::mem::forget(self.replay.take());
            return;
        }
        // The replay first (its drop stops and joins it): it reads
        // through the region's table entry.
        drop(self.replay.take());
        if let Some(region) = self.region.take() {
            // Under the table's settled lock, as munmap holds mmap_lock:
            // unpublish, wait out the speculative faults that may have
            // found it, and unmap (unless a read job still holds the
            // region). Settled: an unmap event already read detaches what
            // the application unmapped first (`crate::mm::events`).
            let table = RegionTable::get().settled();
            // A region the application unmapped or moved was detached
            // already (`crate::mm::events`): its range is not ours, and another
            // region may now start at its address.
            let published = table.release(&region);
            drop(region);
            drop(published);
            drop(table);
            self.core.mappings.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::MemStore;
    use std::sync::mpsc;

    #[test]
    fn a_one_message_reader_drains_on_a_hint_and_every_full_read_every_reads() {
        // On a hint at once, whatever the count, and the count restarts.
        assert_eq!(next_take(1, 5, true), (Take::Drain, 0));
        // Without: one message, counted, until the FULL_READ_EVERY-th read.
        let mut count = 0;
        for read in 1..FULL_READ_EVERY {
            let (take, next) = next_take(1, count, false);
            assert_eq!(take, Take::Read(1), "read {read}");
            assert_eq!(next, read);
            count = next;
        }
        assert_eq!(next_take(1, count, false), (Take::Drain, 0));
    }

    #[test]
    fn a_batch_reader_drains_only_on_a_hint() {
        for count in [0, FULL_READ_EVERY, 1000] {
            assert_eq!(
                next_take(MSG_BATCH, count, false),
                (Take::Read(MSG_BATCH), 0)
            );
        }
        assert_eq!(next_take(MSG_BATCH, 0, true), (Take::Drain, 0));
    }

    /// Runs `f` on a thread and waits for it at most `limit`: `None` if it
    /// did not return by then (the thread is left behind).
    fn within<T: Send + 'static>(
        limit: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit).ok()
    }

    /// A gate that store calls wait at until the test opens it.
    #[derive(Clone)]
    struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);

    impl Gate {
        fn new(open: bool) -> Gate {
            Gate(Arc::new((Mutex::new(open), std::sync::Condvar::new())))
        }
        fn pass(&self) {
            let (lock, cv) = &*self.0;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
        }
        fn open(&self) {
            *self.0 .0.lock().unwrap() = true;
            self.0 .1.notify_all();
        }
    }

    /// A writable memory store whose reads and writes wait at gates (shut
    /// unless the test opens them), and whose `io_pages` may panic.
    struct Gated {
        inner: MemStore,
        reads: Gate,
        writes: Gate,
        panic_io_pages: bool,
    }

    /// Which of a [`Gated`] store's calls hang.
    enum Hang {
        Reads,
        Writes,
        Nothing,
    }

    impl Gated {
        /// The store, and the gate that its hanging calls wait at.
        fn new(len: usize, hang: Hang, panic_io_pages: bool) -> (Gated, Gate) {
            let shut = Gate::new(false);
            let open = Gate::new(true);
            let (reads, writes) = match hang {
                Hang::Reads => (shut.clone(), open),
                Hang::Writes => (open, shut.clone()),
                Hang::Nothing => (open.clone(), open),
            };
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let store = Gated {
                inner: MemStore::new("gated", data),
                reads,
                writes,
                panic_io_pages,
            };
            (store, shut)
        }
    }

    impl Store for Gated {
        fn name(&self) -> &str {
            "gated"
        }
        fn len(&self) -> u64 {
            self.inner.len()
        }
        fn io_pages(&self) -> u64 {
            assert!(!self.panic_io_pages, "io_pages panics");
            16
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
            self.reads.pass();
            self.inner.read_at(offset, buf)
        }
        fn writable(&self) -> bool {
            true
        }
        fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
            self.writes.pass();
            self.inner.write_at(offset, buf)
        }
    }

    fn config() -> Config {
        Config::default().delivery(Delivery::Handler)
    }

    /// For a store that hangs: a short timeout. Not for reads that must
    /// succeed: the timeout applies to every read, and a loaded machine can
    /// hold up a read of memory for 200 ms.
    fn hang_config() -> Config {
        config().io_timeout(Duration::from_millis(200))
    }

    #[test]
    fn a_map_that_fails_after_register_returns_and_leaves_nothing_registered() {
        let done = within(Duration::from_secs(30), || {
            let pager = Pager::new(config()).unwrap();
            let store = MemStore::new("m", vec![7u8; 64 * PAGE_SIZE]);
            let object = pager.open(store).unwrap();
            FAIL_AFTER_REGISTER.with(|f| f.set(true));
            // SAFETY: a private buffer that nothing writes.
            let err = unsafe { pager.map(&object, MapOptions::new()) }.unwrap_err();
            FAIL_AFTER_REGISTER.with(|f| f.set(false));
            assert!(matches!(err, MapError::MissingIoctl { .. }), "{err}");
            // SAFETY: as above.
            let map = unsafe { pager.map(&object, MapOptions::new()) }.unwrap();
            assert!(map.iter().all(|&b| b == 7));
            drop(map);
            drop(pager);
        });
        assert!(
            done.is_some(),
            "map or the pager's drop hung after a failed map"
        );
    }

    #[test]
    fn dropping_the_pager_returns_while_a_store_read_hangs() {
        let (store, gate) = Gated::new(64 * PAGE_SIZE, Hang::Reads, false);
        let done = within(Duration::from_secs(30), move || {
            let pager = Pager::new(hang_config()).unwrap();
            // SAFETY: the store's bytes never change.
            let map = unsafe { pager.map(store, MapOptions::new()) }.unwrap();
            // A read that never returns, with nobody faulting on it.
            map.advise(Advice::WillNeed, 0..map.len()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            let started = Instant::now();
            drop(map);
            drop(pager);
            started.elapsed()
        });
        gate.open();
        let took = done.expect("dropping the pager hung on a store read");
        // io_timeout (200 ms) plus a second, with room for a slow machine.
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn invalidation_gives_up_on_a_read_that_outlived_the_timeout() {
        let (store, gate) = Gated::new(64 * PAGE_SIZE, Hang::Reads, false);
        let done = within(Duration::from_secs(30), move || {
            let pager = Pager::new(hang_config()).unwrap();
            let object = pager.open(store).unwrap();
            // SAFETY: the store's bytes never change.
            let map = unsafe { pager.map(&object, MapOptions::new()) }.unwrap();
            map.advise(Advice::WillNeed, 0..map.len()).unwrap();
            // The watchdog marks the read STALLED after io_timeout.
            std::thread::sleep(Duration::from_millis(1500));
            let r = object.invalidate(0..object.len());
            drop(map);
            r
        });
        let r = done.expect("invalidation spun on a hung read");
        gate.open();
        let err = r.unwrap_err();
        assert!(err.to_string().contains("invalidating"), "{err}");
    }

    #[test]
    fn a_store_whose_io_pages_panics_is_read_with_the_default() {
        let (store, _gate) = Gated::new(64 * PAGE_SIZE, Hang::Nothing, true);
        let data: Vec<u8> = (0..64 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        let done = within(Duration::from_secs(30), move || {
            let pager = Pager::new(config()).unwrap();
            // SAFETY: the store's bytes never change.
            let map = unsafe { pager.map(store, MapOptions::new()) }.unwrap();
            map.to_vec()
        });
        assert_eq!(done.expect("reading hung after io_pages panicked"), data);
    }

    #[test]
    fn an_objects_own_evictor_ends_with_the_object() {
        let pager = Pager::new(config()).unwrap();
        let object = pager
            .open_with_budget(
                MemStore::new("m", vec![1u8; 16 * PAGE_SIZE]),
                crate::MIN_BUDGET,
            )
            .unwrap();
        let budget = Arc::downgrade(&object.0.budget);
        drop(object);
        // The evictor thread held the budget: it lets go when it exits.
        let deadline = Instant::now() + Duration::from_secs(10);
        while budget.upgrade().is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            budget.upgrade().is_none(),
            "the evictor outlived its object"
        );
        drop(pager);
    }

    #[test]
    fn a_budget_whose_evictor_stopped_keeps_readahead_on() {
        let pages = 4 * (crate::MIN_BUDGET as usize / PAGE_SIZE);
        let first = Pager::new(config().memory_budget(crate::MIN_BUDGET)).unwrap();
        let object = first
            .open(MemStore::new("m", vec![3u8; pages * PAGE_SIZE]))
            .unwrap();
        drop(first);
        let second = Pager::new(config()).unwrap();
        let done = within(Duration::from_secs(60), move || {
            // SAFETY: a private buffer that nothing writes.
            let map =
                unsafe { second.map(&object, MapOptions::new().fault_around_order(0)) }.unwrap();
            let sum: u64 = map.iter().step_by(PAGE_SIZE).map(|&b| u64::from(b)).sum();
            (sum, map.stats())
        });
        let (sum, stats) = done.expect("reads blocked under a budget with no evictor");
        assert_eq!(sum, 3 * pages as u64);
        // Readahead windows, not one request per page.
        assert!(stats.io_count * 4 < pages as u64, "{stats:?}");
    }

    #[test]
    fn dropping_the_last_handle_returns_while_a_store_write_hangs() {
        let (store, gate) = Gated::new(16 * PAGE_SIZE, Hang::Writes, false);
        let done = within(Duration::from_secs(30), move || {
            // The page written is read first: a timeout that a loaded
            // machine's read of memory does not reach.
            let pager = Pager::new(config().io_timeout(Duration::from_secs(2))).unwrap();
            // SAFETY: the store's bytes change only through this mapping.
            let mut map = unsafe { pager.map_mut(store, MapOptions::new()) }.unwrap();
            map[5] = 1;
            let started = Instant::now();
            // The flusher's and the object's final write-backs both hang.
            drop(pager);
            drop(map);
            started.elapsed()
        });
        gate.open();
        let took = done.expect("dropping the last handle hung on a store write");
        // Twice io_timeout (2 s) plus a second, not the gate's 30 s: with
        // room for a slow machine.
        assert!(took < Duration::from_secs(15), "{took:?}");
    }
}
