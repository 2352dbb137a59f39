//! faultmap's C API: `libfaultmap.so` and `libfaultmap.a`, declared in
//! `include/faultmap.h` (generated from this file by cbindgen; a test fails
//! when the header in the repository is stale).
//!
//! A small, C-style surface over [`fm::Pager`] and [`fm::Mapping`]:
//! opaque handles (`fm_pager`, `fm_mapping`) created and freed by the
//! library, plain structs for the configuration and the statistics, and
//! errno-style results:
//!
//! - a function that returns a pointer returns NULL on failure; one that
//!   returns an `int` returns 0 or a negative `errno` (`-ENOENT`, ...),
//!   the number [`fm::errno_of`] gives for faultmap's error;
//! - every failure sets this thread's last error, read with
//!   [`fm_last_error`] (faultmap's message and its causes, never a
//!   credential: the library's errors hold none) and [`fm_last_errno`];
//! - a NULL argument is an error (`-EINVAL`, or NULL), never a crash; no
//!   Rust panic crosses the boundary (each entry point catches it and
//!   fails with `-EIO`/NULL and the panic's message).
//!
//! Freeing: [`fm_unmap`] a mapping, [`fm_pager_free`] a pager, each once.
//! A mapping keeps its pager's threads alive, so the pager may be freed
//! first. Handles may be used from any thread.
//!
//! What a C program must know about faults (as for kernel `mmap`): a page
//! the store fails to read raises SIGBUS at the access; with the default
//! delivery faultmap serves faults in a SIGBUS handler of its own, so a
//! program must not block SIGBUS in threads that touch mappings, and a
//! SIGBUS handler installed later must pass on the signals it does not
//! own.
//!
//! Linking: `-lfaultmap` against `libfaultmap.so`, which exports the
//! `fm_*` functions alone (`build.rs`); the static `libfaultmap.a` also
//! needs `-lpthread -ldl -lm -lrt -lutil -lgcc_s`.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::error::Error;
use std::ffi::{c_char, c_int, CStr};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};

use fm::{
    Advice, Config, Delivery, FileStore, MapOptions, Mapping, MappingMut, PageSize, Pager,
    ReadaheadMode, Stats,
};

/// `fm_map` flag: map read-write (a local file only); writes go back to
/// the file on `fm_flush` and in the background.
pub const FM_WRITABLE: c_int = 1;
/// `fm_map` flag: read-around only (no sequential readahead).
pub const FM_READAHEAD_AROUND: c_int = 2;
/// `fm_map` flag: no readahead: a miss reads its page alone.
pub const FM_READAHEAD_OFF: c_int = 4;
/// `fm_map` flag: record the order in which the mapping's pages are first
/// touched (an access trace), for `fm_save_trace`. The mapping then maps
/// one page per fault, so that every first touch is seen.
pub const FM_RECORD_TRACE: c_int = 8;
/// `fm_map` flag: cache, read and map the object in 2 MiB pages (hugetlb)
/// instead of 4 KiB ones: a fault maps a whole 2 MiB page, 512 times fewer
/// faults. The pages come from the kernel's pool of 2 MiB pages
/// (`vm.nr_hugepages`, which the administrator sizes): when it cannot hold
/// the object (or the pager's memory budget), `fm_map` fails with
/// `ENOMEM` and a message that says how far to raise it; nothing falls
/// back to 4 KiB pages. Readahead windows then count 2 MiB pages; a trace
/// replayed must have been recorded with 2 MiB pages too.
pub const FM_HUGE_PAGES: c_int = 16;
/// `fm_map` flag: map a remote object whose server sends neither an ETag
/// nor a `Last-Modified` (without it, `fm_map` fails with `EOPNOTSUPP`).
/// Such an object cannot be pinned: if it changes while mapped, pages of
/// two versions are mixed unseen.
pub const FM_ALLOW_UNPINNED: c_int = 32;

/// `fm_config.io_retries`: no retry at all (0 there is the default).
pub const FM_IO_RETRIES_NONE: u32 = u32::MAX;

/// The most `fm_config.size` may say (a larger value is taken for an
/// uninitialised field).
const FM_CONFIG_SIZE_MAX: u32 = 4096;

/// `fm_config.delivery`: faultmap's default (the faulting thread's own
/// SIGBUS handler serves its fault).
pub const FM_DELIVERY_DEFAULT: c_int = 0;
/// `fm_config.delivery`: the faulting thread's SIGBUS handler.
pub const FM_DELIVERY_SIGNAL: c_int = 1;
/// `fm_config.delivery`: handler threads read fault messages; the
/// kernel's own accesses (`write(fd, ptr, n)` from a mapping) then wait for
/// the page instead of failing with `EFAULT`.
pub const FM_DELIVERY_HANDLER: c_int = 2;

/// `fm_advise`: `MADV_NORMAL`.
pub const FM_ADVICE_NORMAL: c_int = 0;
/// `fm_advise`: `MADV_SEQUENTIAL`.
pub const FM_ADVICE_SEQUENTIAL: c_int = 1;
/// `fm_advise`: `MADV_RANDOM`.
pub const FM_ADVICE_RANDOM: c_int = 2;
/// `fm_advise`: `MADV_WILLNEED` (start reading the range now).
pub const FM_ADVICE_WILLNEED: c_int = 3;
/// `fm_advise`: `MADV_DONTNEED`.
pub const FM_ADVICE_DONTNEED: c_int = 4;

/// A pager's settings; zero (or NULL) in a field means faultmap's
/// default.
///
/// `size` must be `sizeof(fm_config)` as the caller was compiled: write
/// `fm_config c = { .size = sizeof c };`. Fields are only ever added at
/// the end, so a program built against an older header keeps working
/// with a newer library (the fields it does not know take their
/// defaults), and a newer program works with an older library as long as
/// the fields that library does not know are zero (else `E2BIG`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fm_config {
    /// `sizeof(fm_config)`, as the caller was compiled.
    pub size: u32,
    /// `FM_DELIVERY_*`.
    pub delivery: c_int,
    /// The most bytes of cache the pager's objects may hold; 0: no budget.
    pub memory_budget: u64,
    /// I/O threads; 0: the default.
    pub io_threads: u32,
    /// Times a failed store request is tried again, at most 16; 0: the
    /// default (2); `FM_IO_RETRIES_NONE`: none. At open, a timeout is not
    /// tried again.
    pub io_retries: u32,
    /// Milliseconds a store request may take, and the deadline of a whole
    /// open of a remote object; 0: the default (30000).
    pub io_timeout_ms: u64,
    /// `FM_SHARED_*`: whether read-only mappings share their object's
    /// cache with other processes of this user; 0 (`FM_SHARED_ENV`): as
    /// the environment says (`FAULTMAP_SHARED=1`). Added after the fields
    /// above: a program built with the `fm_config` that ends at
    /// `io_timeout_ms` (its `size` says so) gets 0.
    pub shared: c_int,
    /// `FM_ENGINE_*`: the paging engine; 0 (`FM_ENGINE_AUTO`): userfaultfd
    /// if this process can have one, else protect. `FAULTMAP_ENGINE` in the
    /// environment overrides it. A program built with an `fm_config` that
    /// ends at `shared` gets 0.
    pub engine: c_int,
    /// Must be 0.
    pub reserved: u64,
    /// The directory of a persistent disk cache of remote objects
    /// (`http(s)://`, `s3://`, `gs://`, `az://`; never local files): the
    /// pages read from the network are kept there, and later runs and
    /// other processes read them from the disk. A NUL-terminated UTF-8
    /// path (else `fm_pager_new` fails with `EINVAL`), read by
    /// `fm_pager_new` only; NULL: the environment's `FAULTMAP_CACHE_DIR`,
    /// else no disk cache. The directory is created with mode 0700 if
    /// missing; `fm_map` of a remote object fails (a negative errno, and
    /// `fm_last_error` naming the directory and why) if it cannot be made,
    /// or if another user owns it or others may write to it. A program
    /// built with an `fm_config` that ends at `reserved` gets NULL.
    pub disk_cache: *const c_char,
    /// The most bytes the disk cache keeps (cold chunks are evicted past
    /// it); 0: the environment's `FAULTMAP_CACHE_MAX`, else no maximum
    /// (the cache always leaves 5 % of its file system free). With
    /// `disk_cache` NULL it bounds the environment's cache. A program
    /// built with an `fm_config` that ends at `reserved` gets 0.
    pub disk_cache_max: u64,
}

impl Default for fm_config {
    /// Every field zero (NULL): faultmap's defaults, `size` unset.
    fn default() -> Self {
        Self {
            size: 0,
            delivery: 0,
            memory_budget: 0,
            io_threads: 0,
            io_retries: 0,
            io_timeout_ms: 0,
            shared: 0,
            engine: 0,
            reserved: 0,
            disk_cache: std::ptr::null(),
            disk_cache_max: 0,
        }
    }
}

/// `fm_config.engine`: userfaultfd if this process can have one (the
/// system call, then `/dev/userfaultfd`), else `FM_ENGINE_PROTECT`.
pub const FM_ENGINE_AUTO: c_int = 0;
/// `fm_config.engine`: faults through a userfaultfd; `fm_pager_new` fails
/// where it is refused.
pub const FM_ENGINE_USERFAULTFD: c_int = 1;
/// `fm_config.engine`: no userfaultfd: a mapping starts inaccessible
/// (`PROT_NONE`), a SIGSEGV handler in the faulting thread serves the
/// access and maps cached pages with `mprotect`. For containers whose
/// seccomp profile refuses userfaultfd (Docker's default), and gVisor.
/// System calls that read a page not mapped yet fail with `EFAULT`:
/// `fm_populate` first.
pub const FM_ENGINE_PROTECT: c_int = 2;

/// The size of the `fm_config` that ended at `shared` (its last 4 bytes
/// were padding, which a caller may not have zeroed).
const FM_CONFIG_SIZE_SHARED: usize = 40;

/// `fm_config.shared`: as the environment says (`FAULTMAP_SHARED=1` turns
/// sharing on).
pub const FM_SHARED_ENV: c_int = 0;
/// `fm_config.shared`: read-only mappings of an object version (a file's
/// device, inode, size and mtime; a URL's ETag or version) share one cache
/// with the other processes of this user that map it with sharing on: the
/// first owns it and serves the others (see `fm_mapping_sharing`).
pub const FM_SHARED_ON: c_int = 1;
/// `fm_config.shared`: never shared, whatever the environment says.
pub const FM_SHARED_OFF: c_int = 2;

/// `fm_mapping_sharing`: a cache of this process's own, shared with
/// nobody.
pub const FM_SHARING_PRIVATE: c_int = 0;
/// `fm_mapping_sharing`: this process owns the cache and serves the other
/// processes that map the same object version.
pub const FM_SHARING_OWNER: c_int = 1;
/// `fm_mapping_sharing`: another process owns the cache and serves this
/// mapping's faults (its statistics are the owner's).
pub const FM_SHARING_JOINED: c_int = 2;

/// The size of the first `fm_config` (it ended at `io_timeout_ms`): a
/// program built with it is served, its later fields taken as 0.
const FM_CONFIG_SIZE_FIRST: usize = 32;

/// The size of the `fm_config` that ended at `reserved` (before the disk
/// cache's fields): a program built with it gets no `disk_cache` of its
/// own (the environment's) and no `disk_cache_max`.
const FM_CONFIG_SIZE_RESERVED: usize = 48;

// The disk cache's fields come after every field of that `fm_config`.
const _: () = assert!(std::mem::offset_of!(fm_config, disk_cache) == FM_CONFIG_SIZE_RESERVED);

/// A mapping's fault and I/O counters (the names of faultmap's `Stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fm_stats {
    /// Faults served.
    pub pgfault: u64,
    /// Faults that waited for the store.
    pub pgmajfault: u64,
    /// Pages mapped by fault-around.
    pub pgfault_around: u64,
    /// Store requests.
    pub io_count: u64,
    /// Bytes read from the store.
    pub io_bytes: u64,
    /// Reads that failed after their retries.
    pub io_errors: u64,
    /// Reads tried again.
    pub io_retries: u64,
    /// Reads given up by the watchdog.
    pub io_timeouts: u64,
    /// Pages evicted under the memory budget.
    pub evicted: u64,
    /// Pages read again soon after their eviction.
    pub refault: u64,
    /// First writes to clean pages.
    pub write_faults: u64,
    /// Pages written back to the store.
    pub written_back: u64,
}

/// A pager: its userfaultfd and threads (opaque).
pub struct fm_pager {
    pager: Pager,
}

/// A mapping of an object (opaque).
pub struct fm_mapping {
    map: Map,
}

enum Map {
    Read(Mapping),
    Write(MappingMut),
}

impl fm_mapping {
    /// `[offset, offset + length)` of the mapping (`length` 0: to the
    /// end), or `-EINVAL` (the error set).
    fn range(&self, offset: u64, length: u64) -> Result<Range<usize>, c_int> {
        let len = match &self.map {
            Map::Read(map) => map.len(),
            Map::Write(map) => map.len(),
        };
        byte_range(offset, length, len)
    }
}

/// The longest last-error message kept, terminating NUL included.
const MESSAGE_BYTES: usize = 1024;

/// One thread's last failure: its errno and its message, NUL-terminated,
/// in place, so a pointer to it stays valid while the thread lives.
struct LastError {
    errno: c_int,
    message: [u8; MESSAGE_BYTES],
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = const {
        RefCell::new(LastError { errno: 0, message: [0; MESSAGE_BYTES] })
    };
}

/// Sets this thread's last error (nothing once the thread's storage is
/// gone: a call from a thread-exit destructor).
fn set_error(errno: c_int, message: &str) {
    // Cut at a character boundary, leaving room for the NUL.
    let mut end = message.len().min(MESSAGE_BYTES - 1);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            e.errno = errno;
            let bytes = &message.as_bytes()[..end];
            e.message[..end].copy_from_slice(bytes);
            e.message[end] = 0;
            // A NUL inside the message would end it early: none is.
            for b in &mut e.message[..end] {
                if *b == 0 {
                    *b = b'?';
                }
            }
        }
    });
}

/// Fails with `errno` and `message`: returns `-errno`.
fn fail(errno: c_int, message: &str) -> c_int {
    set_error(errno, message);
    -errno
}

/// Fails with faultmap's error `e`: its message and causes, its number.
fn fail_with(e: &(dyn Error + 'static)) -> c_int {
    fail(fm::errno_of(e), &fm::error_text(e))
}

/// Runs `f`, turning a panic into a failure (`on_panic`, with the
/// panic's message as the last error).
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_string());
        set_error(libc::EIO, &format!("faultmap failed inside: {what}"));
        on_panic
    })
}

/// `[offset, offset + length)` of a mapping of `len` bytes (`length` 0:
/// to the end), or `-EINVAL`.
fn byte_range(offset: u64, length: u64, len: usize) -> Result<Range<usize>, c_int> {
    let len64 = len as u64;
    let end = if length == 0 {
        Some(len64)
    } else {
        offset.checked_add(length)
    };
    match end {
        Some(end) if offset <= end && end <= len64 => Ok(offset as usize..end as usize),
        _ => Err(fail(
            libc::EINVAL,
            &format!("bytes {offset} + {length} are outside the mapping's {len}"),
        )),
    }
}

/// A new pager with `config` (NULL: every default); NULL on failure (see
/// `fm_last_error`): `EINVAL` for a `config.size` below the first
/// `fm_config`'s or a bad field (a `disk_cache` that is not UTF-8),
/// `E2BIG` for a larger `fm_config` whose fields unknown to this library
/// are not zero. Free it with `fm_pager_free`.
///
/// # Safety
///
/// `config` is NULL or points to an `fm_config` whose first `size` bytes
/// are readable; its `disk_cache`, if `size` covers it, is NULL or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fm_pager_new(config: *const fm_config) -> *mut fm_pager {
    guard(std::ptr::null_mut(), || {
        // SAFETY: NULL or a valid fm_config of `size` readable bytes (this
        // function's contract).
        let c = match unsafe { read_config(config) } {
            Ok(c) => c,
            Err((errno, message)) => {
                fail(errno, &message);
                return std::ptr::null_mut();
            }
        };
        let mut cfg = Config::default();
        if c.memory_budget > 0 {
            cfg = cfg.memory_budget(c.memory_budget);
        }
        if c.io_threads > 0 {
            cfg = cfg.io_threads(c.io_threads as usize);
        }
        match c.io_retries {
            0 => {}
            FM_IO_RETRIES_NONE => cfg = cfg.io_retries(0),
            n => cfg = cfg.io_retries(n),
        }
        if c.io_timeout_ms > 0 {
            cfg = cfg.io_timeout(std::time::Duration::from_millis(c.io_timeout_ms));
        }
        cfg = match c.shared {
            FM_SHARED_ENV => cfg,
            FM_SHARED_ON => cfg.shared(true),
            FM_SHARED_OFF => cfg.shared(false),
            other => {
                fail(libc::EINVAL, &format!("unknown fm_config.shared {other}"));
                return std::ptr::null_mut();
            }
        };
        cfg = match c.engine {
            FM_ENGINE_AUTO => cfg,
            FM_ENGINE_USERFAULTFD => cfg.engine(fm::Engine::Userfaultfd),
            FM_ENGINE_PROTECT => cfg.engine(fm::Engine::Protect),
            other => {
                fail(libc::EINVAL, &format!("unknown fm_config.engine {other}"));
                return std::ptr::null_mut();
            }
        };
        if c.reserved != 0 {
            fail(libc::EINVAL, "fm_config.reserved must be 0");
            return std::ptr::null_mut();
        }
        // SAFETY: NULL or a NUL-terminated string (this function's
        // contract: `fm_config.disk_cache`'s).
        if unsafe { set_disk_cache(&mut cfg, c.disk_cache, c.disk_cache_max) }.is_err() {
            return std::ptr::null_mut();
        }
        cfg = match c.delivery {
            FM_DELIVERY_DEFAULT => cfg,
            FM_DELIVERY_SIGNAL => cfg.delivery(Delivery::Signal),
            FM_DELIVERY_HANDLER => cfg.delivery(Delivery::Handler),
            other => {
                fail(libc::EINVAL, &format!("unknown delivery {other}"));
                return std::ptr::null_mut();
            }
        };
        match Pager::new(cfg) {
            Ok(pager) => Box::into_raw(Box::new(fm_pager { pager })),
            Err(e) => {
                fail_with(&e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Maps `length` bytes (0: to the end) of the object at `path_or_url` (a
/// local path, `http(s)://` or `s3://`) from byte `offset`, with `flags`
/// (`FM_WRITABLE`, `FM_READAHEAD_*`, `FM_RECORD_TRACE`, `FM_HUGE_PAGES`,
/// `FM_ALLOW_UNPINNED`); NULL on failure (see `fm_last_error`). A remote
/// object's whole open takes at most the pager's `io_timeout_ms` (then
/// `ETIMEDOUT`). A remote object is read through the pager's disk cache
/// (`fm_config.disk_cache`), if it has one; a cache directory that cannot
/// be made or is not safe fails the map, with a message that names it and
/// says why. Free it with `fm_unmap`.
///
/// # Safety
///
/// `pager` is NULL or a live pager from `fm_pager_new`; `path_or_url` is
/// NULL or a NUL-terminated string. And, as for kernel `mmap` of a file,
/// for as long as the mapping lives: the object's bytes do not change
/// (faultmap may drop a page and read it again; a remote object's version
/// is pinned at open, so it cannot), and no one writes the mapped bytes
/// through another mapping of the same object while this one's are read.
#[no_mangle]
pub unsafe extern "C" fn fm_map(
    pager: *mut fm_pager,
    path_or_url: *const c_char,
    offset: u64,
    length: u64,
    flags: c_int,
) -> *mut fm_mapping {
    // SAFETY: this function's contract, with no trace.
    unsafe {
        map_entry(
            "fm_map",
            pager,
            path_or_url,
            offset,
            length,
            flags,
            std::ptr::null(),
        )
    }
}

/// [`fm_map`], replaying the access trace in the file `replay_trace`
/// (written by `fm_save_trace` on this same object, at this same
/// version; NULL: none): a thread reads the trace's pages ahead of the
/// program, in the order they were first touched, each widened to the
/// block read-around would read (one page with `FM_READAHEAD_OFF`), at
/// most 16 to 32 MiB (a quarter of a memory budget at most) past what a
/// program that follows the trace has used so far. A trace of an object
/// of another length or version (for a file: its modification time), or
/// recorded in pages of another size (`FM_HUGE_PAGES`), fails: NULL, with
/// `fm_last_errno()` `EINVAL` and `fm_last_error()` saying why.
///
/// # Safety
///
/// As for [`fm_map`]; `replay_trace` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fm_map_replay(
    pager: *mut fm_pager,
    path_or_url: *const c_char,
    offset: u64,
    length: u64,
    flags: c_int,
    replay_trace: *const c_char,
) -> *mut fm_mapping {
    // SAFETY: this function's contract.
    unsafe {
        map_entry(
            "fm_map_replay",
            pager,
            path_or_url,
            offset,
            length,
            flags,
            replay_trace,
        )
    }
}

/// The body of [`fm_map`] and [`fm_map_replay`] (`func` names the one
/// called, in messages).
///
/// # Safety
///
/// As for [`fm_map_replay`].
unsafe fn map_entry(
    func: &str,
    pager: *mut fm_pager,
    path_or_url: *const c_char,
    offset: u64,
    length: u64,
    flags: c_int,
    replay_trace: *const c_char,
) -> *mut fm_mapping {
    guard(std::ptr::null_mut(), || {
        // SAFETY: NULL or a live pager (this function's contract).
        let Some(pager) = (unsafe { pager.as_ref() }) else {
            fail(libc::EINVAL, &format!("{func}: the pager is NULL"));
            return std::ptr::null_mut();
        };
        // SAFETY: NULL or NUL-terminated (this function's contract).
        let Some(target) = (unsafe { c_str(path_or_url, &format!("{func}: the path")) }) else {
            return std::ptr::null_mut();
        };
        let trace = if replay_trace.is_null() {
            None
        } else {
            let what = format!("{func}: the trace's path");
            // SAFETY: non-NULL and NUL-terminated (this function's
            // contract).
            let Some(path) = (unsafe { c_str(replay_trace, &what) }) else {
                return std::ptr::null_mut();
            };
            match fm::Trace::load(path) {
                Ok(trace) => Some(trace),
                Err(e) => {
                    fail_with(&e);
                    return std::ptr::null_mut();
                }
            }
        };
        match map(&pager.pager, target, offset, length, flags, trace) {
            Ok(map) => Box::into_raw(Box::new(fm_mapping { map })),
            Err(_) => std::ptr::null_mut(),
        }
    })
}

/// `ptr` as UTF-8, or `None` with the error set (`what` names it).
///
/// # Safety
///
/// `ptr` is NULL or a NUL-terminated string that lives for `'a`.
unsafe fn c_str<'a>(ptr: *const c_char, what: &str) -> Option<&'a str> {
    if ptr.is_null() {
        fail(libc::EINVAL, &format!("{what} is NULL"));
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated, living for 'a (the contract).
    let text = unsafe { CStr::from_ptr(ptr) }.to_str();
    if text.is_err() {
        fail(libc::EINVAL, &format!("{what} is not UTF-8"));
    }
    text.ok()
}

/// Writes the access trace of `m`, a mapping made with `FM_RECORD_TRACE`,
/// to the file `path` (whole or not at all: written beside it, then
/// renamed); 0 or a negative errno (`-EINVAL` if `m` does not record).
/// Replay it with `fm_map_replay`.
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map` or `fm_map_replay`; `path`
/// is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fm_save_trace(m: *const fm_mapping, path: *const c_char) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: NULL or a live mapping (this function's contract).
        let Some(m) = (unsafe { m.as_ref() }) else {
            return fail(libc::EINVAL, "fm_save_trace: the mapping is NULL");
        };
        // SAFETY: NULL or NUL-terminated (this function's contract).
        let Some(path) = (unsafe { c_str(path, "fm_save_trace: the path") }) else {
            return -libc::EINVAL;
        };
        let trace = match &m.map {
            Map::Read(map) => map.trace(),
            Map::Write(map) => map.trace(),
        };
        let Some(trace) = trace else {
            return fail(
                libc::EINVAL,
                "fm_save_trace: the mapping was made without FM_RECORD_TRACE",
            );
        };
        match trace.save(path) {
            Ok(_) => 0,
            Err(e) => fail_with(&e),
        }
    })
}

/// The caller's `fm_config`, as this library knows it: `size` bytes of
/// it, the fields past them zero (their defaults); fields past this
/// library's must be zero. `Err` holds the errno and the message.
///
/// # Safety
///
/// `config` is NULL or points to an `fm_config` whose first `size` bytes
/// are readable (`fm_pager_new`'s contract).
unsafe fn read_config(config: *const fm_config) -> Result<fm_config, (c_int, String)> {
    if config.is_null() {
        return Ok(fm_config::default());
    }
    let ours = std::mem::size_of::<fm_config>();
    // SAFETY: `config` points to at least the `size` field (the
    // contract: every fm_config starts with it).
    let size = unsafe { std::ptr::addr_of!((*config).size).read() };
    if size > FM_CONFIG_SIZE_MAX {
        return Err((
            libc::EINVAL,
            format!(
                "fm_config.size is {size}: set .size = sizeof(fm_config) (a program built \
                 against a header whose fm_config has no size field must be rebuilt)"
            ),
        ));
    }
    let theirs = size as usize;
    if theirs < FM_CONFIG_SIZE_FIRST {
        // The first fm_config with a size ended at io_timeout_ms: nothing
        // smaller was ever valid.
        return Err((
            libc::EINVAL,
            format!("fm_config.size is {size}, not sizeof(fm_config) = {ours}: set it first"),
        ));
    }
    // SAFETY: the caller's `size` bytes are readable (the contract), and
    // `theirs` is that size.
    let bytes = unsafe { std::slice::from_raw_parts(config.cast::<u8>(), theirs) };
    if theirs < ours {
        // An older fm_config: its fields, and zeros for the later ones.
        let mut c = fm_config::default();
        // SAFETY: copies `theirs` (< sizeof(fm_config)) bytes into a live
        // fm_config; every bit pattern is a valid fm_config (integers and
        // a raw pointer, which is only read through `c_str`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (&mut c as *mut fm_config).cast::<u8>(),
                theirs,
            )
        };
        if theirs <= FM_CONFIG_SIZE_SHARED {
            // Its padding, not an engine.
            c.engine = FM_ENGINE_AUTO;
            c.reserved = 0;
        }
        // A field the caller's size covers in part is not one (a pointer
        // made of half its bytes would be read through).
        if theirs < std::mem::offset_of!(fm_config, disk_cache) + std::mem::size_of::<usize>() {
            c.disk_cache = std::ptr::null();
        }
        if theirs < std::mem::offset_of!(fm_config, disk_cache_max) + 8 {
            c.disk_cache_max = 0;
        }
        return Ok(c);
    }
    if bytes[ours..].iter().any(|&b| b != 0) {
        return Err((
            libc::E2BIG,
            format!(
                "fm_config has fields this libfaultmap does not know (bytes {ours}..{theirs} \
                 are not zero): link a newer libfaultmap"
            ),
        ));
    }
    // SAFETY: at least `ours` bytes are readable and `config` is aligned
    // for an fm_config (it points to one); every bit pattern is a valid
    // fm_config (integers and a raw pointer).
    Ok(unsafe { config.read() })
}

/// Sets `cfg`'s disk cache from `fm_config.disk_cache` (`dir`) and
/// `fm_config.disk_cache_max` (`max`, 0: none): the directory given,
/// bounded by `max` or else by the environment's `FAULTMAP_CACHE_MAX`;
/// without one, the environment's (`Config::default()`'s), which `max`
/// then bounds. A malformed `FAULTMAP_CACHE_MAX` is left to
/// `Config::validate` (in `Pager::new`), which refuses it. `Err` with
/// the error set (`-EINVAL`) for a path that is not UTF-8.
///
/// # Safety
///
/// `dir` is NULL or a NUL-terminated string.
unsafe fn set_disk_cache(cfg: &mut Config, dir: *const c_char, max: u64) -> Result<(), c_int> {
    if !dir.is_null() {
        // SAFETY: non-NULL and NUL-terminated (this function's contract),
        // read here only.
        let Some(dir) = (unsafe { c_str(dir, "fm_config.disk_cache") }) else {
            return Err(-libc::EINVAL);
        };
        let env_max = std::env::var(fm::CACHE_MAX_ENV)
            .ok()
            .and_then(|v| fm::parse_size(&v).ok());
        cfg.disk_cache = Some(fm::DiskCacheConfig {
            max_bytes: env_max,
            ..fm::DiskCacheConfig::new(dir)
        });
    }
    if let (1.., Some(cache)) = (max, cfg.disk_cache.as_mut()) {
        cache.max_bytes = Some(max);
    }
    Ok(())
}

/// [`fm_map`] past its pointers; the error is set on `Err`.
fn map(
    pager: &Pager,
    target: &str,
    offset: u64,
    length: u64,
    flags: c_int,
    replay: Option<fm::Trace>,
) -> Result<Map, c_int> {
    let known = FM_WRITABLE
        | FM_READAHEAD_AROUND
        | FM_READAHEAD_OFF
        | FM_RECORD_TRACE
        | FM_HUGE_PAGES
        | FM_ALLOW_UNPINNED;
    if flags & !known != 0 {
        return Err(fail(
            libc::EINVAL,
            &format!("fm_map: unknown flags {flags:#x}"),
        ));
    }
    let mode = match (
        flags & FM_READAHEAD_AROUND != 0,
        flags & FM_READAHEAD_OFF != 0,
    ) {
        (false, false) => ReadaheadMode::Full,
        (true, false) => ReadaheadMode::AroundOnly,
        (false, true) => ReadaheadMode::Off,
        (true, true) => {
            return Err(fail(
                libc::EINVAL,
                "fm_map: FM_READAHEAD_AROUND and FM_READAHEAD_OFF together",
            ))
        }
    };
    let mut opts = MapOptions::new().offset(offset).readahead(mode);
    if length > 0 {
        opts = opts.len(length);
    }
    if flags & FM_RECORD_TRACE != 0 {
        opts = opts.record_trace();
    }
    if flags & FM_HUGE_PAGES != 0 {
        opts = opts.page_size(PageSize::Huge);
    }
    if let Some(trace) = replay {
        opts = opts.replay_trace(trace);
    }
    if flags & FM_WRITABLE != 0 {
        if let Some((scheme, _)) = target.split_once("://") {
            let remote = ["http", "https", "s3"].contains(&scheme.to_ascii_lowercase().as_str());
            let (errno, why) = if remote {
                (libc::EROFS, "a remote object cannot be mapped writable")
            } else {
                (libc::EINVAL, "FM_WRITABLE takes a local path, not a URL")
            };
            return Err(fail(errno, &format!("{scheme}:// with FM_WRITABLE: {why}")));
        }
        let store = FileStore::open_rw(target).map_err(|e| fail_with(&e))?;
        // SAFETY: the C caller keeps `fm_map`'s contract (its # Safety),
        // which is `map_mut`'s.
        let map = unsafe { pager.map_mut(store, opts) }.map_err(|e| fail_with(&e))?;
        return Ok(Map::Write(map));
    }
    let tuning = fm::RemoteTuning {
        allow_unpinned: flags & FM_ALLOW_UNPINNED != 0,
        ..fm::RemoteTuning::for_config(pager.config())
    };
    let store = fm::open_url_with(target, &tuning).map_err(|e| fail_with(&e))?;
    // SAFETY: the C caller keeps `fm_map`'s contract (its # Safety), which
    // is `map`'s.
    let map = unsafe { pager.map(store, opts) }.map_err(|e| fail_with(&e))?;
    Ok(Map::Read(map))
}

/// The mapping's first byte (NULL if `m` is NULL). Reading it is reading
/// the object; with `FM_WRITABLE` it may be written too.
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`.
#[no_mangle]
pub unsafe extern "C" fn fm_mapping_ptr(m: *const fm_mapping) -> *const u8 {
    // SAFETY: NULL or a live mapping (this function's contract).
    match unsafe { m.as_ref() } {
        Some(m) => match &m.map {
            Map::Read(map) => map.as_ptr(),
            Map::Write(map) => map.as_ptr(),
        },
        None => {
            fail(libc::EINVAL, "fm_mapping_ptr: the mapping is NULL");
            std::ptr::null()
        }
    }
}

/// The mapping's length in bytes (0 if `m` is NULL).
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`.
#[no_mangle]
pub unsafe extern "C" fn fm_mapping_len(m: *const fm_mapping) -> usize {
    // SAFETY: NULL or a live mapping (this function's contract).
    match unsafe { m.as_ref() } {
        Some(m) => match &m.map {
            Map::Read(map) => map.len(),
            Map::Write(map) => map.len(),
        },
        None => {
            fail(libc::EINVAL, "fm_mapping_len: the mapping is NULL");
            0
        }
    }
}

/// The size in bytes of the pages the mapping's object is cached and
/// mapped in: 4096, or 2097152 with `FM_HUGE_PAGES` (0 if `m` is NULL).
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`.
#[no_mangle]
pub unsafe extern "C" fn fm_mapping_page_size(m: *const fm_mapping) -> usize {
    // SAFETY: NULL or a live mapping (this function's contract).
    match unsafe { m.as_ref() } {
        Some(m) => match &m.map {
            Map::Read(map) => map.object().page_size().bytes(),
            Map::Write(map) => map.object().page_size().bytes(),
        },
        None => {
            fail(libc::EINVAL, "fm_mapping_page_size: the mapping is NULL");
            0
        }
    }
}

/// The paging engine `pager` runs: `FM_ENGINE_USERFAULTFD` or
/// `FM_ENGINE_PROTECT`; `-EINVAL` if `pager` is NULL. If `why` is not NULL,
/// up to `why_len` bytes (NUL-terminated, cut short if need be) say why:
/// who asked for it, or what `FM_ENGINE_AUTO` found.
///
/// # Safety
///
/// `pager` is NULL or a live pager from `fm_pager_new`; `why` is NULL or
/// points to `why_len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn fm_pager_engine(
    pager: *const fm_pager,
    why: *mut c_char,
    why_len: usize,
) -> c_int {
    // SAFETY: NULL or a live pager (this function's contract).
    let Some(pager) = (unsafe { pager.as_ref() }) else {
        return fail(libc::EINVAL, "fm_pager_engine: the pager is NULL");
    };
    let info = pager.pager.engine();
    if !why.is_null() && why_len > 0 {
        let text = info.why.as_bytes();
        let n = text.len().min(why_len - 1);
        // SAFETY: `why` has `why_len` writable bytes (the contract), and
        // n + 1 <= why_len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), why.cast::<u8>(), n);
            *why.add(n) = 0;
        }
    }
    match info.engine {
        fm::Engine::Protect => FM_ENGINE_PROTECT,
        _ => FM_ENGINE_USERFAULTFD,
    }
}

/// Reads bytes `[offset, offset + length)` of the mapping (0: to the end)
/// into the cache, waits for them, and maps them (writable too, for an
/// `FM_WRITABLE` mapping), so that a system call can use the memory
/// (`write(fd, ptr, n)`, `send`, `read` into a writable mapping): the
/// kernel's own accesses fail with `EFAULT` on a page not mapped yet
/// under `FM_ENGINE_PROTECT`, signal delivery, or a user-mode-only
/// userfaultfd. 0, or a negative errno (`-EIO`: a page the store cannot
/// read). The pages stay mapped until the memory budget evicts them.
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`.
#[no_mangle]
pub unsafe extern "C" fn fm_populate(m: *const fm_mapping, offset: u64, length: u64) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: NULL or a live mapping (this function's contract).
        let Some(m) = (unsafe { m.as_ref() }) else {
            return fail(libc::EINVAL, "fm_populate: the mapping is NULL");
        };
        let range = match m.range(offset, length) {
            Ok(r) => r,
            Err(code) => return code,
        };
        let done = match &m.map {
            Map::Read(map) => map.populate(range),
            Map::Write(map) => map.populate(range),
        };
        match done {
            Ok(()) => 0,
            Err(e) => fail_with(&e),
        }
    })
}

/// Whose cache the mapping reads: `FM_SHARING_PRIVATE`,
/// `FM_SHARING_OWNER` or `FM_SHARING_JOINED` (see `FM_SHARED_ON`);
/// `-EINVAL` if `m` is NULL.
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`.
#[no_mangle]
pub unsafe extern "C" fn fm_mapping_sharing(m: *const fm_mapping) -> c_int {
    // SAFETY: NULL or a live mapping (this function's contract).
    let Some(m) = (unsafe { m.as_ref() }) else {
        return fail(libc::EINVAL, "fm_mapping_sharing: the mapping is NULL");
    };
    let sharing = match &m.map {
        Map::Read(map) => map.sharing(),
        Map::Write(map) => map.sharing(),
    };
    match sharing {
        fm::Sharing::Owner => FM_SHARING_OWNER,
        fm::Sharing::Joined => FM_SHARING_JOINED,
        _ => FM_SHARING_PRIVATE,
    }
}

/// Fills `out` with the mapping's counters; 0, or `-EINVAL` for a NULL
/// argument.
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`; `out` is NULL or points to
/// writable memory for one `fm_stats`.
#[no_mangle]
pub unsafe extern "C" fn fm_mapping_stats(m: *const fm_mapping, out: *mut fm_stats) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: NULL or a live mapping (this function's contract).
        let Some(m) = (unsafe { m.as_ref() }) else {
            return fail(libc::EINVAL, "fm_mapping_stats: the mapping is NULL");
        };
        if out.is_null() {
            return fail(libc::EINVAL, "fm_mapping_stats: out is NULL");
        }
        let s: Stats = match &m.map {
            Map::Read(map) => map.stats(),
            Map::Write(map) => map.stats(),
        };
        let stats = fm_stats {
            pgfault: s.pgfault,
            pgmajfault: s.pgmajfault,
            pgfault_around: s.pgfault_around,
            io_count: s.io_count,
            io_bytes: s.io_bytes,
            io_errors: s.io_errors,
            io_retries: s.io_retries,
            io_timeouts: s.io_timeouts,
            evicted: s.evicted,
            refault: s.refault,
            write_faults: s.write_faults,
            written_back: s.written_back,
        };
        // SAFETY: non-NULL and writable for one fm_stats (this function's
        // contract); `write` needs no initialised value there.
        unsafe { out.write(stats) };
        0
    })
}

/// Writes the dirty pages of bytes `[offset, offset + length)` (`length`
/// 0: to the end) back to the file and waits (`msync(MS_SYNC)`); 0 or a
/// negative errno (`-EBADF` for a read-only mapping).
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`.
#[no_mangle]
pub unsafe extern "C" fn fm_flush(m: *mut fm_mapping, offset: u64, length: u64) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: NULL or a live mapping (this function's contract).
        let Some(m) = (unsafe { m.as_ref() }) else {
            return fail(libc::EINVAL, "fm_flush: the mapping is NULL");
        };
        let Map::Write(map) = &m.map else {
            return fail(libc::EBADF, "fm_flush: the mapping is read-only");
        };
        let range = match byte_range(offset, length, map.len()) {
            Ok(r) => r,
            Err(code) => return code,
        };
        match map.flush(range) {
            Ok(_) => 0,
            Err(e) => fail_with(&e),
        }
    })
}

/// Advises on bytes `[offset, offset + length)` (`length` 0: to the end),
/// as `madvise` does (`FM_ADVICE_*`); 0 or a negative errno.
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`.
#[no_mangle]
pub unsafe extern "C" fn fm_advise(
    m: *mut fm_mapping,
    advice: c_int,
    offset: u64,
    length: u64,
) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: NULL or a live mapping (this function's contract).
        let Some(m) = (unsafe { m.as_ref() }) else {
            return fail(libc::EINVAL, "fm_advise: the mapping is NULL");
        };
        let advice = match advice {
            FM_ADVICE_NORMAL => Advice::Normal,
            FM_ADVICE_SEQUENTIAL => Advice::Sequential,
            FM_ADVICE_RANDOM => Advice::Random,
            FM_ADVICE_WILLNEED => Advice::WillNeed,
            FM_ADVICE_DONTNEED => Advice::DontNeed,
            other => return fail(libc::EINVAL, &format!("fm_advise: unknown advice {other}")),
        };
        let range = match m.range(offset, length) {
            Ok(r) => r,
            Err(code) => return code,
        };
        let done = match &m.map {
            Map::Read(map) => map.advise(advice, range),
            Map::Write(map) => map.advise(advice, range),
        };
        match done {
            Ok(()) => 0,
            Err(e) => fail_with(&e),
        }
    })
}

/// Starts reading `n` byte ranges of the mapping at once, `[starts[i],
/// starts[i] + lengths[i])` (offsets into the mapping, in any order),
/// merged into few requests all in flight together: the batched prefetch
/// of a caller that knows its next accesses (see the Rust
/// `Mapping::prefetch_ranges`). With `wait` nonzero, returns once the
/// reads it started have ended (`Mapping::wait_ranges`: a page that cannot
/// be read is `-EIO`; a page the memory budget left out is read at its
/// access). Returns the number of store requests submitted (0 when every
/// page was cached or being read already, when the budget left every page
/// out, and in a forked child, whose parent reads each page at its
/// access), or a negative errno: `-EINVAL` for a NULL pointer with `n > 0`
/// or a range outside the mapping (then nothing is read).
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`; `starts` and `lengths`
/// are NULL or point to `n` readable `uint64_t` each.
#[no_mangle]
pub unsafe extern "C" fn fm_prefetch_ranges(
    m: *mut fm_mapping,
    starts: *const u64,
    lengths: *const u64,
    n: usize,
    wait: c_int,
) -> i64 {
    guard(-i64::from(libc::EIO), || {
        // SAFETY: NULL or a live mapping (this function's contract).
        let Some(m) = (unsafe { m.as_ref() }) else {
            return fail(libc::EINVAL, "fm_prefetch_ranges: the mapping is NULL").into();
        };
        if n > 0 && (starts.is_null() || lengths.is_null()) {
            let why = "fm_prefetch_ranges: starts or lengths is NULL";
            return fail(libc::EINVAL, why).into();
        }
        let (starts, lengths): (&[u64], &[u64]) = if n == 0 {
            (&[], &[])
        } else {
            // SAFETY: non-NULL (checked above), and `n` readable values
            // each (this function's contract).
            unsafe {
                (
                    std::slice::from_raw_parts(starts, n),
                    std::slice::from_raw_parts(lengths, n),
                )
            }
        };
        let mut ranges = Vec::with_capacity(n);
        for (&start, &len) in starts.iter().zip(lengths) {
            let Some(end) = start.checked_add(len) else {
                let why = format!("fm_prefetch_ranges: range {start}+{len} overflows");
                return fail(libc::EINVAL, &why).into();
            };
            ranges.push(start..end);
        }
        let done = match &m.map {
            Map::Read(map) => prefetch_ranges(map, &ranges, wait != 0),
            Map::Write(map) => prefetch_ranges(map, &ranges, wait != 0),
        };
        match done {
            Ok(got) => i64::try_from(got.requests).unwrap_or(i64::MAX),
            Err(e) => fail_with(&e).into(),
        }
    })
}

/// `Mapping::prefetch_ranges`, then `wait_ranges` if asked to.
fn prefetch_ranges<A: fm::Access>(
    map: &fm::Mapping<A>,
    ranges: &[std::ops::Range<u64>],
    wait: bool,
) -> Result<fm::Prefetched, fm::MapError> {
    let got = map.prefetch_ranges(ranges)?;
    if wait {
        map.wait_ranges(ranges)?;
    }
    Ok(got)
}

/// Unmaps and frees `m`. A writable mapping's dirty pages are written back
/// on the way, as well as they can be within the pager's I/O timeout, with
/// no result: call `fm_flush` first to know that they were. NULL is a
/// no-op.
///
/// # Safety
///
/// `m` is NULL or a live mapping from `fm_map`, not used again after this
/// call (nor any pointer into it).
#[no_mangle]
pub unsafe extern "C" fn fm_unmap(m: *mut fm_mapping) {
    if m.is_null() {
        return;
    }
    guard((), || {
        // SAFETY: a live mapping from `fm_map` (Box::into_raw), given up by
        // the caller (this function's contract).
        drop(unsafe { Box::from_raw(m) });
    });
}

/// Frees `pager`. Its mappings stay usable until they are unmapped. NULL is
/// a no-op.
///
/// # Safety
///
/// `pager` is NULL or a live pager from `fm_pager_new`, not used again
/// after this call.
#[no_mangle]
pub unsafe extern "C" fn fm_pager_free(pager: *mut fm_pager) {
    if pager.is_null() {
        return;
    }
    guard((), || {
        // SAFETY: a live pager from `fm_pager_new` (Box::into_raw), given up
        // by the caller (this function's contract).
        drop(unsafe { Box::from_raw(pager) });
    });
}

/// This thread's last error message ("" if none yet), at most 1023
/// bytes. The pointer stays valid while the thread lives; the text is
/// replaced by the next failing `fm_` call on this thread (copy it before
/// making another).
#[no_mangle]
pub extern "C" fn fm_last_error() -> *const c_char {
    static NONE: [u8; 1] = [0];
    LAST_ERROR
        .try_with(|e| e.as_ptr().cast_const())
        // SAFETY: the RefCell's value lives in this thread's storage, which
        // `try_with` just found alive; the pointer is to its message array
        // (no reference is kept), which stays where it is until the thread
        // ends. `set_error` writes it only through `borrow_mut`.
        .map(|cell| unsafe { std::ptr::addr_of!((*cell).message) }.cast::<c_char>())
        .unwrap_or(NONE.as_ptr().cast())
}

/// The (positive) errno of this thread's last failure, 0 if none yet: the
/// reason a function that returns NULL failed (`ENOENT`, `EISDIR`, ...).
#[no_mangle]
pub extern "C" fn fm_last_errno() -> c_int {
    LAST_ERROR
        .try_with(|e| e.try_borrow().map_or(0, |e| e.errno))
        .unwrap_or(0)
}
