//! Helpers shared by the integration tests: data patterns, test files,
//! instrumented stores, byte comparison, watchdogs, `/proc/self/pagemap`,
//! and child processes for tests whose expected outcome is a signal.
//!
//! Every test binary includes this module, and none uses all of it.
#![allow(dead_code)]

pub mod remote;

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use faultmap::{
    IntoObject, MapError, MapOptions, Mapping, MappingMut, MemStore, Pager, Store, StoreError,
};

/// The page size faultmap works in.
pub const PAGE: usize = 4096;
/// One PTE table: 512 pages, 2 MiB.
pub const TABLE: usize = 512 * PAGE;
/// SIGBUS, as the tests name it.
pub const SIGBUS: i32 = libc::SIGBUS;

/// How long any single test body may run before the watchdog calls it hung.
/// Generous: the slowest body takes well under a second in release builds.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// A test that cannot run because this machine lacks `what`: on CI
/// (`CI=true`) that is a failure, since CI must run every test; elsewhere
/// the test is skipped, saying so on stderr. Call it and return.
pub fn missing_feature(what: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what}: CI must run every test, and this one cannot run here");
    }
    eprintln!("skipped: {what}");
}

/// Moves `len` bytes at `addr` to a fresh address; returns it.
pub fn mremap_away(addr: usize, len: usize) -> usize {
    // SAFETY: reserves a new range, then moves the test's own mapping over
    // it (MREMAP_FIXED replaces the reservation only).
    unsafe {
        let dest = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(dest, libc::MAP_FAILED);
        let moved = libc::mremap(
            addr as *mut libc::c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dest,
        );
        assert_eq!(moved, dest, "mremap: {}", std::io::Error::last_os_error());
        moved as usize
    }
}

// ---------------------------------------------------------------------------
// Mapping test data.
// ---------------------------------------------------------------------------

/// `Pager::map` and `Pager::map_mut` for the tests' own data.
///
/// Their contract (`Pager::map`'s `# Safety`) holds for every test that uses
/// these: each test's store is a file in its own temporary folder or a
/// buffer that only it holds, which nothing else writes while mapped (tests
/// that change a file under a mapping do it to check SIGBUS or
/// invalidation, and hold no slice across the change); and tests that
/// write through one mapping and read through another do it one after the
/// other, never with a slice of the other mapping live across the write.
pub trait MapTrusted {
    /// `Pager::map` of test-private data.
    fn map_trusted(&self, source: impl IntoObject, opts: MapOptions) -> Result<Mapping, MapError>;
    /// `Pager::map_mut` of test-private data.
    fn map_mut_trusted(
        &self,
        source: impl IntoObject,
        opts: MapOptions,
    ) -> Result<MappingMut, MapError>;
}

impl MapTrusted for Pager {
    fn map_trusted(&self, source: impl IntoObject, opts: MapOptions) -> Result<Mapping, MapError> {
        // SAFETY: test-private data; see the trait's documentation.
        unsafe { self.map(source, opts) }
    }

    fn map_mut_trusted(
        &self,
        source: impl IntoObject,
        opts: MapOptions,
    ) -> Result<MappingMut, MapError> {
        // SAFETY: test-private data; see the trait's documentation.
        unsafe { self.map_mut(source, opts) }
    }
}

// ---------------------------------------------------------------------------
// Data.
// ---------------------------------------------------------------------------

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `len` pseudo-random bytes in which every 8-byte word is distinct (it
/// hashes its own index), so a page mapped at the wrong place, a stale page
/// or a zero page never compares equal by accident.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut word = 0u64;
    while out.len() < len {
        out.extend_from_slice(&splitmix64(seed.rotate_left(32) ^ word).to_le_bytes());
        word += 1;
    }
    out.truncate(len);
    out
}

/// The bytes of [`pattern`]`(_, seed)` at `[offset, offset + buf.len())`.
pub fn pattern_at(seed: u64, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let at = offset + i as u64;
        *b = splitmix64(seed.rotate_left(32) ^ (at / 8)).to_le_bytes()[(at % 8) as usize];
    }
}

/// A file with known contents in a temporary directory (removed on drop).
pub struct TestFile {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub data: Vec<u8>,
}

impl TestFile {
    /// A file of `len` bytes of [`pattern`]`(len, seed)`.
    pub fn new(len: usize, seed: u64) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(format!("object-{len}-{seed}.bin"));
        let data = pattern(len, seed);
        std::fs::write(&path, &data).expect("write test file");
        Self { dir, path, data }
    }

    /// A [`faultmap::FileStore`] over the file.
    pub fn store(&self) -> faultmap::FileStore {
        faultmap::FileStore::open(&self.path).expect("open test file")
    }
}

/// Asserts `actual == expected` without printing megabytes: names the first
/// differing byte, its page, and how many bytes differ.
#[track_caller]
pub fn assert_bytes(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length differs");
    if actual == expected {
        return;
    }
    let first = actual
        .iter()
        .zip(expected)
        .position(|(a, e)| a != e)
        .expect("slices differ somewhere");
    let differing = actual.iter().zip(expected).filter(|(a, e)| a != e).count();
    let end = (first + 16).min(actual.len());
    panic!(
        "{what}: {differing} of {} bytes differ; first at byte {first} (page {} of the slice): \
         got {:02x?}, expected {:02x?}",
        actual.len(),
        first / PAGE,
        &actual[first..end],
        &expected[first..end],
    );
}

/// How many `2^order`-page windows cover `pages` pages.
pub fn windows(pages: u64, order: u8) -> u64 {
    pages.div_ceil(1 << order)
}

// ---------------------------------------------------------------------------
// Reading through a mapping.
// ---------------------------------------------------------------------------

/// Where the mapping's first byte sits in its first page.
pub fn lead(map: &Mapping) -> usize {
    map.as_ptr() as usize % PAGE
}

/// How many pages the mapping's address range spans.
pub fn mapped_pages(map: &Mapping) -> usize {
    if map.is_empty() {
        0
    } else {
        (lead(map) + map.len()).div_ceil(PAGE)
    }
}

/// Reads one byte at `offset` of the mapping's slice with a volatile load, so
/// the access happens, once, in program order (fault counts depend on it).
pub fn read_byte(map: &Mapping, offset: usize) -> u8 {
    assert!(
        offset < map.len(),
        "read_byte({offset}) past len {}",
        map.len()
    );
    // SAFETY: offset < len, so the pointer is inside the mapping's slice,
    // which is readable for as long as `map` is borrowed.
    unsafe { std::ptr::read_volatile(map.as_ptr().add(offset)) }
}

/// Touches page `page` of the mapping's address range (page 0 is the page
/// holding the first byte) by reading its first byte inside the slice.
pub fn touch(map: &Mapping, page: usize) -> u8 {
    let offset = (page * PAGE).saturating_sub(lead(map));
    read_byte(map, offset)
}

/// The slice offset range of page `page` of the mapping's address range,
/// clipped to the slice.
pub fn page_range(map: &Mapping, page: usize) -> std::ops::Range<usize> {
    let start = (page * PAGE).saturating_sub(lead(map));
    let end = ((page + 1) * PAGE - lead(map)).min(map.len());
    start..end
}

/// The bytes from the mapping's end to the end of its last page: past the
/// slice, but inside the mapping's address range.
pub fn read_tail(map: &Mapping) -> Vec<u8> {
    if map.is_empty() {
        return Vec::new();
    }
    let end = map.as_ptr() as usize + map.len();
    let page_end = end.next_multiple_of(PAGE);
    (end..page_end)
        .map(|addr| {
            // SAFETY: faultmap maps whole pages of the object's memfd: the
            // mapping's address range runs from the page holding `as_ptr()`
            // to the end of the page holding its last byte (the memfd is the
            // object rounded up to a page, and the mapping covers
            // `ceil((lead + len) / PAGE)` pages of it). `addr` lies in
            // [as_ptr() + len, the end of that last page), so it is inside
            // the mapping, which `map` keeps mapped while borrowed.
            unsafe { std::ptr::read_volatile(addr as *const u8) }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// /proc/self/pagemap.
// ---------------------------------------------------------------------------

/// For each of `pages` virtual pages from `addr` (page-aligned): whether a
/// present PTE maps it (bit 63 of its `/proc/self/pagemap` entry). Reading
/// pagemap walks the page tables only; it does not fault anything in.
pub fn present_pages(addr: usize, pages: usize) -> Vec<bool> {
    assert_eq!(addr % PAGE, 0, "pagemap address must be page-aligned");
    let file = std::fs::File::open("/proc/self/pagemap").expect("open /proc/self/pagemap");
    let mut buf = vec![0u8; pages * 8];
    file.read_exact_at(&mut buf, (addr / PAGE * 8) as u64)
        .expect("read /proc/self/pagemap");
    buf.chunks_exact(8)
        .map(|e| u64::from_le_bytes(e.try_into().expect("8 bytes")) >> 63 == 1)
        .collect()
}

/// The pages (of the mapping's address range, first `pages` of them) that are
/// present, as a set of page indices.
pub fn present_set(map: &Mapping, pages: usize) -> BTreeSet<usize> {
    let base = map.as_ptr() as usize - lead(map);
    present_pages(base, pages)
        .into_iter()
        .enumerate()
        .filter_map(|(i, p)| p.then_some(i))
        .collect()
}

/// Counters, read once they satisfy `until` (or after 20 s, for the
/// caller's assertion to report). A fault adds to its counters when its
/// handling ends, after everything it maps is mapped; the faulting thread is
/// woken earlier (as soon as the run holding its page is mapped), so
/// counters and page tables read right after an access can still be
/// changing. Waiting for the expected count, then asserting it exactly, is
/// deterministic: a count that overshoots fails at once, one that never
/// arrives fails after the limit.
pub fn stats_when(
    get: impl Fn() -> faultmap::Stats,
    until: impl Fn(&faultmap::Stats) -> bool,
) -> faultmap::Stats {
    wait_until(Duration::from_secs(20), || until(&get()));
    get()
}

/// `map`'s counters once it has counted at least `faults` faults: its page
/// tables are then stable (see [`stats_when`]).
pub fn settle(map: &Mapping, faults: u64) -> faultmap::Stats {
    stats_when(|| map.stats(), |s| s.pgfault >= faults)
}

/// The present pages of `map` (the first `pages`), once they equal
/// `expected` or 5 s have passed: for checks whose fault count is not known.
pub fn present_eventually(
    map: &Mapping,
    pages: usize,
    expected: &BTreeSet<usize>,
) -> BTreeSet<usize> {
    let mut last = present_set(map, pages);
    wait_until(Duration::from_secs(5), || {
        last = present_set(map, pages);
        &last == expected
    });
    last
}

/// One VMA of this process, from `/proc/self/smaps`.
#[derive(Debug, Clone)]
pub struct Vma {
    pub start: usize,
    pub end: usize,
    /// `r--s` and the like.
    pub perms: String,
    pub path: String,
    /// The two-letter `VmFlags` (`dc`: not copied on fork; `um`, `ui`:
    /// userfaultfd MISSING and MINOR).
    pub flags: Vec<String>,
}

/// The VMAs of this process whose path contains `name`.
pub fn vmas_named(name: &str) -> Vec<Vma> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let mut out: Vec<Vma> = Vec::new();
    let mut current: Option<Vma> = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(mut vma) = current.take() {
                vma.flags = flags.split_whitespace().map(str::to_string).collect();
                if vma.path.contains(name) {
                    out.push(vma);
                }
            }
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        // offset, dev, inode, then the path (which may contain spaces).
        let path = fields.skip(3).collect::<Vec<_>>().join(" ");
        current = Some(Vma {
            start,
            end,
            perms: perms.to_string(),
            path,
            flags: Vec::new(),
        });
    }
    out
}

// ---------------------------------------------------------------------------
// Watchdog.
// ---------------------------------------------------------------------------

/// Runs `body` on its own thread and returns its result; a panic in it is
/// re-raised here. If it does not finish within `limit`, the test fails
/// instead of hanging the suite (the stuck thread is abandoned).
#[track_caller]
pub fn watchdog<T: Send + 'static>(
    limit: Duration,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("test-body".into())
        .spawn(move || {
            let out = body();
            let _ = tx.send(());
            out
        })
        .expect("spawn test body");
    match rx.recv_timeout(limit) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("watchdog: the test body did not finish within {limit:?} (a fault hangs?)")
        }
    }
}

/// Polls `cond` until it holds or `limit` passes. Returns whether it held.
/// For waiting on a state another thread reaches (not for timing anything).
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

// ---------------------------------------------------------------------------
// An instrumented store.
// ---------------------------------------------------------------------------

/// A gate that holds store reads of chosen pages until opened.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    entered: AtomicU64,
}

impl Gate {
    /// Lets every held read (and every later one) through.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Waits until `n` reads are held at the gate. Returns whether they are.
    pub fn wait_entered(&self, n: u64, limit: Duration) -> bool {
        wait_until(limit, || self.entered.load(Ordering::SeqCst) >= n)
    }

    /// Holds the caller until the gate opens (at most 30 s), counted in
    /// [`Gate::wait_entered`].
    pub fn pass(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let open = self.open.lock().unwrap();
        // Bounded, so that a failing test cannot leave a handler thread
        // blocked forever (the pager joins its threads on drop).
        let _ = self
            .cv
            .wait_timeout_while(open, Duration::from_secs(30), |open| !*open)
            .unwrap();
    }
}

/// What an [`Instrumented`] store does with reads that touch chosen pages.
#[derive(Default)]
pub struct Faults {
    /// Reads including any of these pages fail (`StoreError::Read`).
    pub bad: BTreeSet<u64>,
    /// Reads of more than one page including any of these fail; a read of
    /// the page alone succeeds.
    pub flaky: BTreeSet<u64>,
    /// Reads including any of these panic.
    pub panic: BTreeSet<u64>,
    /// Reads including any of these scribble over their buffer, then wait at
    /// the gate, then read.
    pub gated: BTreeSet<u64>,
    /// Every read takes at least this long (a slow store).
    pub slow: Option<Duration>,
}

impl Faults {
    /// Reads touching any of `pages` fail.
    pub fn bad(pages: impl IntoIterator<Item = u64>) -> Self {
        Self {
            bad: pages.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Multi-page reads touching any of `pages` fail.
    pub fn flaky(pages: impl IntoIterator<Item = u64>) -> Self {
        Self {
            flaky: pages.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Reads touching any of `pages` panic.
    pub fn panic(pages: impl IntoIterator<Item = u64>) -> Self {
        Self {
            panic: pages.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Reads touching any of `pages` wait at the store's gate.
    pub fn gated(pages: impl IntoIterator<Item = u64>) -> Self {
        Self {
            gated: pages.into_iter().collect(),
            ..Self::default()
        }
    }
}

/// A store wrapper that checks the `Store` contract on every read, records
/// every read, and injects failures, panics and delays on chosen pages.
pub struct Instrumented {
    inner: Box<dyn Store>,
    pub faults: Faults,
    pub gate: Gate,
    /// Every `(offset, len)` asked for, in order.
    pub reads: Mutex<Vec<(u64, usize)>>,
    /// Every contract violation seen (unaligned offset, out of range, a
    /// read that stops inside a page before the object's end).
    pub violations: Mutex<Vec<String>>,
}

impl Instrumented {
    pub fn new(inner: impl Store, faults: Faults) -> Arc<Self> {
        Arc::new(Self {
            inner: Box::new(inner),
            faults,
            gate: Gate::default(),
            reads: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
        })
    }

    /// An instrumented [`MemStore`] over `data`.
    pub fn mem(data: &[u8], faults: Faults) -> Arc<Self> {
        Self::new(MemStore::new("instrumented", data.to_vec()), faults)
    }

    /// How many times each page was asked for.
    pub fn page_reads(&self) -> Vec<u32> {
        let pages = self.inner.len().div_ceil(PAGE as u64) as usize;
        let mut counts = vec![0u32; pages];
        for &(offset, len) in self.reads.lock().unwrap().iter() {
            let first = offset as usize / PAGE;
            let last = (offset as usize + len).div_ceil(PAGE);
            for c in &mut counts[first..last.min(pages)] {
                *c += 1;
            }
        }
        counts
    }

    #[track_caller]
    pub fn assert_contract_kept(&self) {
        let v = self.violations.lock().unwrap();
        assert!(v.is_empty(), "Store contract violated: {v:?}");
    }
}

impl Store for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let len = buf.len();
        let end = offset + len as u64;
        self.reads.lock().unwrap().push((offset, len));
        if offset % PAGE as u64 != 0 || end > self.len() || len == 0 {
            self.violations.lock().unwrap().push(format!(
                "read_at({offset}, {len}) of a {}-byte object",
                self.len()
            ));
        } else if end % PAGE as u64 != 0 && end != self.len() {
            self.violations
                .lock()
                .unwrap()
                .push(format!("read_at({offset}, {len}) stops inside a page"));
        }
        let first = offset / PAGE as u64;
        let pages: Vec<u64> = (first..end.div_ceil(PAGE as u64)).collect();
        let hits = |set: &BTreeSet<u64>| pages.iter().any(|p| set.contains(p));
        if let Some(d) = self.faults.slow {
            std::thread::sleep(d);
        }
        if hits(&self.faults.gated) {
            // Half-way through: a store that streams into the buffer has
            // written some of it (allocating the cache's pages) and waits for
            // the rest. Nothing may map these bytes yet.
            buf.fill(0xA5);
            self.gate.pass();
        }
        if hits(&self.faults.panic) {
            panic!("Instrumented store: injected panic reading at {offset}");
        }
        let failed = hits(&self.faults.bad) || (pages.len() > 1 && hits(&self.faults.flaky));
        if failed {
            // Scribble first, as a store that fails half-way would.
            buf.fill(0xA5);
            return Err(StoreError::Read {
                name: self.name().to_string(),
                offset,
                len,
                source: std::io::Error::other("injected read failure"),
            });
        }
        self.inner.read_at(offset, buf)
    }
}

// ---------------------------------------------------------------------------
// Child processes, for outcomes that are signals.
// ---------------------------------------------------------------------------

/// The environment variable that tells a re-executed test binary which test
/// should play the child's part.
pub const CHILD_ENV: &str = "FAULTMAP_TEST_CHILD";

/// Whether this process is the child of test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(name)
}

/// How a child process ended.
#[derive(Debug)]
pub struct ChildEnd {
    /// `None` if it hung and was killed.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl ChildEnd {
    pub fn signal(&self) -> Option<i32> {
        self.status.and_then(|s| s.signal())
    }
}

/// Re-executes this test binary to run only test `name` with [`CHILD_ENV`]
/// set to `name` (the test then plays the child), with core dumps off.
/// Kills it if it has not ended within `limit`.
pub fn run_child(name: &str, limit: Duration) -> ChildEnd {
    run_child_under(name, limit, None)
}

/// [`run_child`], the child run by `launcher` (a program that takes the
/// command to run as its arguments: `scripts/nouffd`'s binary).
pub fn run_child_under(name: &str, limit: Duration, launcher: Option<&Path>) -> ChildEnd {
    let exe = std::env::current_exe().expect("current_exe");
    let mut command = Command::new("sh");
    command.arg("-c").arg("ulimit -c 0; exec \"$0\" \"$@\"");
    if let Some(launcher) = launcher {
        command.arg(launcher);
    }
    let mut child = command
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child test process");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    ChildEnd {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Whether the tests run as root (whose userfaultfd serves the kernel's
/// own accesses; another user's serves user-mode faults only).
#[allow(dead_code)]
pub fn running_as_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this process's pagers run the Protect engine by default: the
/// environment asks for it, or no userfaultfd can be had (a container's
/// seccomp profile, `scripts/nouffd`).
#[allow(dead_code)]
pub fn protect_engine() -> bool {
    faultmap::Pager::new(faultmap::Config::default())
        .map(|p| p.engine().engine == faultmap::Engine::Protect)
        .unwrap_or(false)
}
