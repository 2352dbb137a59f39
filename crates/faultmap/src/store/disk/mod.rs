//! The disk cache: a [`Store`] in front of a remote one
//! ([`CachedStore`]) that keeps the pages it reads in a directory on local
//! disk ([`DiskCache`]), for later runs and other processes.
//!
//! # What a read does
//!
//! A read asks the disk first: every page whose checksum entry is written
//! and matches its bytes is read from there. The runs of pages it lacks
//! are read from the store below and handed to the fault path at once; a
//! copy is written to the disk after, on a writer thread, with `O_DIRECT`
//! where the file system takes it (the device's DMA rather than a copy
//! into the page cache and its write-back: the CPU is the network's). Past
//! 128 MiB (or 256 writes) queued in a process, a fetch is handed over and
//! not kept: a disk slower than the network never delays a fault. A changed object is never served from a stale entry:
//! entries are keyed by the store's [`Store::disk_cache_key`] (its URL,
//! length and byte-exact version: a strong ETag, a version id), and
//! opening a version removes the URL's other versions. An object without
//! one (no ETag, a weak one, a Last-Modified alone) is not cached.
//!
//! # Crash safety: per-page checksums, checked on every read
//!
//! Chunk files are written in place, data first and then a checksum per
//! page (module `chunk`); a page is served only if its bytes match. So a
//! write torn by a kill, a full disk or a power cut leaves pages that are
//! read again from the network (a damaged page passes a CRC-32 with a
//! chance of one in 2³²). Whole-chunk
//! write-then-rename was the other choice; it would make a sequential
//! first run write each 4 MiB twice (once staged) or hold a chunk's pages
//! until all arrived, and could not keep the pages of a random reader's
//! 64 KiB windows.
//!
//! # Many processes
//!
//! Several processes may share one directory, and one may evict while
//! others read and write. Before fetching pages, a process takes a record
//! lock on their checksum entries (`F_OFD_SETLK`, module `sys`); a process
//! that finds them locked waits for the holder (polling with backoff, on
//! the I/O thread, at most [`MAX_WAIT`]), then reads what the holder wrote.
//! So a chunk in flight is downloaded once, unless its holder takes longer
//! than the wait (stopped, or a slow link): then it is downloaded again,
//! well before the pager's I/O timeout would fail the fault. A lock goes with its holder's file
//! description, so a killed process leaves none behind. Chunk files are
//! born whole (header and empty table, linked into place); eviction
//! unlinks whole chunk files, which their open readers keep reading, and
//! into which a late write is lost, never misplaced. The invariants, and
//! the tests that kill processes at random points against them, are in
//! `tests/disk_cache.rs`.
//!
//! # Bounds and failures
//!
//! The cache stays under its maximum and above its minimum of free space
//! by evicting cold chunks (module `dir`): least recently used, old
//! versions first. A disk error or a full disk never fails a read: the
//! bytes came from the network; the page is just not kept. The first such
//! failure is kept for [`DiskCacheStats::first_problem`], the others
//! counted.
//!
//! Writes are done by two threads of their own ("faultmap-disk"), not on
//! the network runtime's threads, whose time is the transfers'. A store's
//! drop, and [`CachedStore::wait_written`], wait for its queued writes.
//!
//! Written by hand: no crate keeps a shared, crash-safe, multi-process
//! page cache on disk (`cacache` and `foyer` are content-addressed or
//! single-process key-value caches).
//!
//! Layer rule: part of [`crate::store`]; uses [`crate::base`] and
//! [`crate::sys`].

mod chunk;
mod dir;

use std::ops::Range;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use dir::{BadPage, CachedObject, DiskCache, DiskCacheError, Verified};

use self::chunk::{page_sum, Chunk, Header, OpenError, CHUNK_BYTES, CHUNK_PAGES, PAGE};
use self::dir::{hash_name, Meta, Room, TOUCH_EVERY};
use super::{Link, ReadBuf, ReadDone, Store, StoreError};

/// What a [`CachedStore`] did, since it was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskCacheStats {
    /// Bytes read from the disk.
    pub disk_bytes: u64,
    /// Bytes read from the store below (the network).
    pub network_bytes: u64,
    /// Bytes written to the disk.
    pub written_bytes: u64,
    /// Bytes read from the network and not kept: the disk was behind
    /// (more than 128 MiB of writes queued in the process), the cache at
    /// its maximum with nothing to evict, or the file system full.
    pub skipped_bytes: u64,
    /// Times a read waited for another reader's fetch of the same pages.
    pub waits: u64,
    /// Disk failures (errors, a full disk) of the cache directory, over
    /// all its objects in this process: their reads came from the network.
    pub problems: u64,
    /// The first of them.
    pub first_problem: Option<String>,
}

/// The longest a read waits for another reader's fetch of the same pages
/// before it fetches them itself: well under the pager's I/O timeout,
/// whose clock runs meanwhile, so that a stopped or slow peer costs a
/// second download, never a failed fault.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// A store read through a [`DiskCache`]: see the module doc.
pub struct CachedStore<S: Store> {
    inner: S,
    object: Arc<CachedObjectState>,
}

/// What the reads of one cached object share with their callbacks.
struct CachedObjectState {
    cache: Arc<DiskCache>,
    /// The version's directory, and its meta.
    dir: PathBuf,
    meta: Meta,
    name: String,
    len: u64,
    /// How long a read waits for another's fetch before fetching itself.
    wait: Duration,
    /// Per chunk: when this process last set its modification time
    /// (seconds since `born`, 0: never).
    touched: Vec<AtomicU64>,
    born: Instant,
    disk_bytes: AtomicU64,
    network_bytes: AtomicU64,
    written_bytes: AtomicU64,
    skipped_bytes: AtomicU64,
    waits: AtomicU64,
    /// Its writes queued after their hand-over.
    queued: Queued,
}

impl<S: Store> CachedStore<S> {
    /// `inner` read through `cache`, waiting at most `wait` (capped at
    /// [`MAX_WAIT`]) for another reader's fetch of the same pages.
    /// `Ok(Err(inner))`, uncached, if `inner` has no version that names
    /// its bytes exactly ([`Store::disk_cache_key`] is `None`: no ETag,
    /// a weak one, only a Last-Modified), or if the object's directory
    /// cannot be written (a full or read-only disk: noted as the cache's
    /// problem, [`DiskCacheStats::first_problem`]).
    pub fn new(
        inner: S,
        cache: Arc<DiskCache>,
        wait: Duration,
    ) -> Result<Result<Self, S>, DiskCacheError> {
        let Some(key) = inner.disk_cache_key() else {
            return Ok(Err(inner));
        };
        let meta = Meta {
            url: inner.name().to_string(),
            version: inner.version().unwrap_or_default(),
            len: inner.len(),
            key,
        };
        let url_dir = cache.url_dir(&meta.url);
        let dir = url_dir.join(hash_name(&meta.key));
        let problem = |what: &str, e: std::io::Error| {
            cache.problems().note(|| {
                format!(
                    "disk cache {}: {what} for {}: {e}; it is read from the network",
                    cache.dir().display(),
                    meta.url
                )
            });
        };
        // Other versions of this URL can no longer be read: reclaimed
        // first.
        if let Ok(entries) = std::fs::read_dir(&url_dir) {
            for entry in entries.flatten() {
                if entry.path() != dir {
                    let _ = dir::remove_tree(&entry.path());
                }
            }
        }
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            problem("creating an object's directory", e);
            return Ok(Err(inner));
        }
        match Meta::read(&dir) {
            Some(found) if found == meta => {}
            Some(found) if found.key != meta.key => {
                // Two keys with one 128-bit hash: not cached rather than
                // mixed.
                return Ok(Err(inner));
            }
            _ => {
                if let Err(e) = meta.write(&dir, &cache.tmp()) {
                    problem("writing an object's meta file", e);
                    return Ok(Err(inner));
                }
            }
        }
        let chunks = meta.len.div_ceil(CHUNK_BYTES) as usize;
        Ok(Ok(CachedStore {
            object: Arc::new(CachedObjectState {
                name: meta.url.clone(),
                len: meta.len,
                cache,
                dir,
                meta,
                wait: wait.min(MAX_WAIT),
                touched: (0..chunks).map(|_| AtomicU64::new(0)).collect(),
                born: Instant::now(),
                disk_bytes: AtomicU64::new(0),
                network_bytes: AtomicU64::new(0),
                written_bytes: AtomicU64::new(0),
                skipped_bytes: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                queued: Queued::default(),
            }),
            inner,
        }))
    }

    /// What it did so far.
    pub fn stats(&self) -> DiskCacheStats {
        self.object.stats()
    }

    /// Waits (at most `limit`) until the pages it fetched are on the disk
    /// (or failed to be): a page is handed to the fault path first, and
    /// written after, from a copy. Its drop waits too (at most a minute).
    pub fn wait_written(&self, limit: Duration) {
        self.object.queued.wait_empty(limit);
    }

    /// The store below.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<DiskCache> {
        &self.object.cache
    }

    /// Whether a read of `len` bytes at `offset` goes through the disk:
    /// whole pages (the last one may end at the object's end), inside the
    /// object. Other reads go to the store below as they are.
    fn cacheable(&self, offset: u64, len: usize) -> bool {
        let Some(end) = offset.checked_add(len as u64) else {
            return false;
        };
        offset % PAGE == 0
            && len > 0
            && end <= self.object.len
            && (len as u64 % PAGE == 0 || end == self.object.len)
    }
}

impl<S: Store> Store for CachedStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn ra_pages(&self) -> u64 {
        self.inner.ra_pages()
    }
    fn around_pages(&self) -> Option<u64> {
        self.inner.around_pages()
    }
    fn io_pages(&self) -> u64 {
        self.inner.io_pages()
    }
    fn link(&self) -> Option<Link> {
        self.inner.link()
    }
    fn len_now(&self) -> Option<u64> {
        self.inner.len_now()
    }
    fn version(&self) -> Option<String> {
        self.inner.version()
    }
    fn share_key(&self) -> Option<String> {
        self.inner.share_key()
    }
    fn disk_cache_key(&self) -> Option<String> {
        self.inner.disk_cache_key()
    }
    /// After the pages handed over are on the disk ([`Self::wait_written`],
    /// at most a minute), so that `written_bytes` counts them.
    fn disk_cache_stats(&self) -> Option<DiskCacheStats> {
        self.wait_written(Duration::from_secs(60));
        Some(self.stats())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if !self.cacheable(offset, buf.len()) {
            return self.inner.read_at(offset, buf);
        }
        let object = &self.object;
        let fetches = object.claim(offset, buf);
        object.count(buf.len(), &fetches);
        for fetch in fetches {
            let (from, to) = object.byte_range(&fetch.pages);
            let at = (from - offset) as usize..(to - offset) as usize;
            self.inner.read_at(from, &mut buf[at.clone()])?;
            object.keep(from, &buf[at], fetch.claim);
        }
        Ok(())
    }

    fn start_read(&self, offset: u64, mut buf: ReadBuf, done: ReadDone) {
        if !self.cacheable(offset, buf.len()) {
            return self.inner.start_read(offset, buf, done);
        }
        let object = self.object.clone();
        let mut fetches = object.claim(offset, buf.as_mut_slice());
        object.count(buf.len(), &fetches);
        if fetches.is_empty() {
            return done(buf, Ok(()));
        }
        let whole = object.byte_range(&fetches[0].pages) == (offset, offset + buf.len() as u64);
        if whole {
            // The common case: all of it from the network, into the
            // caller's buffer.
            let Some(Fetch { claim, .. }) = fetches.pop() else {
                return done(buf, Ok(()));
            };
            let finish: ReadDone = Box::new(move |buf, result| {
                if result.is_err() {
                    drop(claim);
                    return done(buf, result);
                }
                object.hand_over_and_keep(offset, buf, done, claim);
            });
            return self.inner.start_read(offset, buf, finish);
        }
        // Parts of it: each through a buffer of its own, copied in; the
        // last to end hands the buffer back.
        let parts = Arc::new(Parts {
            state: std::sync::Mutex::new(PartsState {
                buf: Some(buf),
                done: Some(done),
                left: fetches.len(),
                error: None,
            }),
        });
        for Fetch { pages, claim } in fetches {
            let (from, to) = object.byte_range(&pages);
            let part = ReadBuf::from(vec![0u8; (to - from) as usize]);
            let at = (from - offset) as usize;
            let (object, parts) = (object.clone(), parts.clone());
            let finish: ReadDone = Box::new(move |mut part, result| {
                if let Err(e) = result {
                    drop(claim);
                    return parts.end(Some(e), |_| {});
                }
                // Into the caller's buffer (the last part hands it over),
                // then onto the disk from the part's own, within the
                // backlog (else not kept, as for a whole read).
                let bytes = part.as_mut_slice();
                let len = bytes.len();
                let reserved = writers::reserve(len);
                if reserved {
                    object.queued.add();
                }
                parts.end(None, |buf| {
                    buf.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes)
                });
                if !reserved {
                    object.skip(len);
                    return drop(claim);
                }
                writers::run(Box::new(move || {
                    object.keep(from, part.as_mut_slice(), claim);
                    writers::release(len);
                    object.queued.done();
                }));
            });
            self.inner.start_read(from, part, finish);
        }
    }
}

/// A read whose missing pages are fetched in several parts.
struct Parts {
    state: std::sync::Mutex<PartsState>,
}

struct PartsState {
    buf: Option<ReadBuf>,
    done: Option<ReadDone>,
    left: usize,
    error: Option<StoreError>,
}

impl Parts {
    /// Ends one part: `copy` puts its bytes in the buffer (unless a part
    /// failed); the last part calls back.
    fn end(&self, error: Option<StoreError>, copy: impl FnOnce(&mut ReadBuf)) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match (error, state.buf.as_mut()) {
            (Some(e), _) => {
                state.error.get_or_insert(e);
            }
            (None, Some(buf)) => copy(buf),
            (None, None) => {}
        }
        state.left -= 1;
        if state.left > 0 {
            return;
        }
        let (buf, done, error) = (state.buf.take(), state.done.take(), state.error.take());
        drop(state);
        if let (Some(buf), Some(done)) = (buf, done) {
            done(buf, error.map_or(Ok(()), Err));
        }
    }
}

/// Pages to fetch, and the right to.
struct Fetch {
    pages: Range<u64>,
    claim: Claim,
}

/// The right to fetch and write pages: record locks on their chunks'
/// table entries, given back when dropped. Empty when the wait for them
/// ran out (the pages are fetched anyway).
struct Claim {
    held: Vec<(Chunk, u64, u64)>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        for (chunk, first, n) in &self.held {
            chunk.unlock(*first, *n);
        }
    }
}

impl<S: Store> Drop for CachedStore<S> {
    /// Waits (at most a minute) for this object's pages still queued for
    /// the disk, so that a process that drops its stores before it exits
    /// leaves them all in the cache. Not on a writer thread, whose queue
    /// holds them.
    fn drop(&mut self) {
        if !writers::on_writer_thread() {
            self.object.queued.wait_empty(Duration::from_secs(60));
        }
    }
}

/// Writes of an object queued for the writer threads, which its store's
/// drop waits for: atomics only, counted per fork generation (a forked
/// child's copy of the count is its parent's writes, which it never sees
/// end; nothing here can be held across a fork).
#[derive(Default)]
struct Queued {
    /// The fork generation's low 24 bits, then the count (40 bits): one
    /// word, so that a child's first update resets the count atomically.
    word: AtomicU64,
}

impl Queued {
    const COUNT_BITS: u32 = 40;
    const COUNT_MASK: u64 = (1 << Self::COUNT_BITS) - 1;

    /// This generation's tag.
    fn tag() -> u64 {
        (crate::sys::fork_generation() & 0xff_ffff) << Self::COUNT_BITS
    }

    /// The count of this fork generation (0 for words of another).
    fn count(word: u64) -> u64 {
        if word & !Self::COUNT_MASK == Self::tag() {
            word & Self::COUNT_MASK
        } else {
            0
        }
    }

    fn update(&self, f: impl Fn(u64) -> u64) {
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(Self::tag() | (f(Self::count(w)) & Self::COUNT_MASK))
            });
    }

    fn add(&self) {
        self.update(|c| c + 1);
    }

    fn done(&self) {
        self.update(|c| c.saturating_sub(1));
    }

    /// Polls until no write is queued, at most `limit`.
    fn wait_empty(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Self::count(self.word.load(Ordering::Acquire)) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl CachedObjectState {
    /// Hands `buf`, all fetched from byte `from`, back to the fault path,
    /// and keeps its bytes on the disk: from a copy, written after the
    /// hand-over on a writer thread, while the copies queued in this
    /// process stay under [`writers::BACKLOG`]; past it (a disk slower
    /// than the network) the bytes are not kept, so that the disk never
    /// delays a fault. The claim is held until the bytes are on the disk.
    fn hand_over_and_keep(
        self: Arc<Self>,
        from: u64,
        mut buf: ReadBuf,
        done: ReadDone,
        claim: Claim,
    ) {
        let Some(mut copy) = writers::copy_buffer(buf.len()) else {
            // The disk is behind by the whole backlog: these pages are not
            // kept, rather than make the fault wait for the disk.
            self.skip(buf.len());
            drop(claim);
            return done(buf, Ok(()));
        };
        // The copy here, on the thread the read ended on, and the
        // hand-over at once: measured faster than a hop to a writer
        // thread first (the fault path waits for neither the queue nor
        // the disk).
        copy.fill(buf.as_mut_slice());
        self.queued.add();
        done(buf, Ok(()));
        writers::run(Box::new(move || {
            self.keep_padded(from, copy.bytes(), Some(copy.padded()), claim);
            writers::give_back(copy);
            self.queued.done();
        }));
    }

    /// Counts `len` bytes fetched and not kept.
    fn skip(&self, len: usize) {
        self.network_bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.skipped_bytes.fetch_add(len as u64, Ordering::Relaxed);
    }

    fn stats(&self) -> DiskCacheStats {
        DiskCacheStats {
            disk_bytes: self.disk_bytes.load(Ordering::Relaxed),
            network_bytes: self.network_bytes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
            skipped_bytes: self.skipped_bytes.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            problems: self.cache.problems().count(),
            first_problem: self.cache.problems().first(),
        }
    }

    /// Bytes `[from, to)` of the object that pages `pages` hold.
    fn byte_range(&self, pages: &Range<u64>) -> (u64, u64) {
        (pages.start * PAGE, (pages.end * PAGE).min(self.len))
    }

    fn chunk_path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("{index}.chunk"))
    }

    fn header(&self, index: u64) -> Header {
        self.meta.header(index)
    }

    fn problem(&self, what: &str, e: &std::io::Error) {
        self.cache.problems().note(|| {
            format!(
                "disk cache {}: {what} for {}: {e}; those reads come from the network",
                self.cache.dir().display(),
                self.name
            )
        });
    }

    /// Counts a read of `len` bytes that fetches `fetches`, the rest
    /// from the disk.
    fn count(&self, len: usize, fetches: &[Fetch]) {
        let fetched: u64 = fetches
            .iter()
            .map(|f| {
                let (from, to) = self.byte_range(&f.pages);
                to - from
            })
            .sum();
        self.disk_bytes
            .fetch_add((len as u64).saturating_sub(fetched), Ordering::Relaxed);
    }

    /// Fills `buf` (bytes from `offset`, page-aligned) with what the disk
    /// holds, and returns the runs of pages it lacks, in order.
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Vec<Range<u64>> {
        let first_page = offset / PAGE;
        let end_page = first_page + (buf.len() as u64).div_ceil(PAGE);
        let mut missing: Vec<Range<u64>> = Vec::new();
        let mut miss = |pages: Range<u64>| match missing.last_mut() {
            Some(last) if last.end == pages.start => last.end = pages.end,
            _ => missing.push(pages),
        };
        let mut page = first_page;
        while page < end_page {
            let index = page / CHUNK_PAGES;
            let chunk_end = ((index + 1) * CHUNK_PAGES).min(end_page);
            let at = ((page - first_page) * PAGE) as usize;
            let to = (((chunk_end - first_page) * PAGE) as usize).min(buf.len());
            if !self.fill_chunk(index, page % CHUNK_PAGES, &mut buf[at..to], &mut miss) {
                miss(page..chunk_end);
            }
            page = chunk_end;
        }
        missing
    }

    /// [`Self::fill`] within chunk `index`, pages from `first` on: calls
    /// `miss` with the absolute pages it lacks. `false` if the chunk file
    /// cannot be used at all.
    fn fill_chunk(
        &self,
        index: u64,
        first: u64,
        buf: &mut [u8],
        miss: &mut impl FnMut(Range<u64>),
    ) -> bool {
        let header = self.header(index);
        let chunk = match Chunk::open(&self.chunk_path(index), header) {
            Ok(chunk) => chunk,
            Err(OpenError::Missing | OpenError::Foreign) => return false,
            Err(OpenError::Io(e)) => {
                self.problem("opening a chunk", &e);
                return false;
            }
        };
        let pages = (buf.len() as u64).div_ceil(PAGE) as usize;
        let mut sums = vec![0u32; pages];
        if let Err(e) = chunk.sums(first, &mut sums) {
            self.problem("reading a chunk's checksums", &e);
            return false;
        }
        let base = index * CHUNK_PAGES;
        let mut served_any = false;
        let mut p = 0;
        while p < pages {
            if sums[p] == 0 {
                miss(base + first + p as u64..base + first + p as u64 + 1);
                p += 1;
                continue;
            }
            // A run of pages the table says are there: one read.
            let run_end = (p..pages).find(|&q| sums[q] == 0).unwrap_or(pages);
            let at = p * PAGE as usize;
            let to = (run_end * PAGE as usize).min(buf.len());
            let got = match chunk.read(first + p as u64, &mut buf[at..to]) {
                Ok(got) => at + got,
                Err(e) => {
                    self.problem("reading a chunk", &e);
                    at
                }
            };
            for q in p..run_end {
                let page = first + q as u64;
                let end = ((q + 1) * PAGE as usize).min(buf.len());
                let bytes = &buf[q * PAGE as usize..end];
                if end <= got && page_sum(&header, page, bytes) == sums[q] {
                    served_any = true;
                } else {
                    miss(base + page..base + page + 1);
                }
            }
            p = run_end;
        }
        if served_any {
            self.touch(index, &chunk);
        }
        true
    }

    /// Marks chunk `index` used (its modification time), at most once per
    /// [`TOUCH_EVERY`] per process.
    fn touch(&self, index: u64, chunk: &Chunk) {
        let Some(last) = self.touched.get(index as usize) else {
            return;
        };
        let now = self.born.elapsed().as_secs() + 1;
        let then = last.load(Ordering::Relaxed);
        if then != 0 && now.saturating_sub(then) < TOUCH_EVERY.as_secs() {
            return;
        }
        if last
            .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let _ = chunk.file().set_modified(std::time::SystemTime::now());
        }
    }

    /// Fills `buf` from the disk, then takes the right to fetch what it
    /// lacks: waits while another reader fetches any of it, then looks at
    /// the disk again. Returns the runs of pages to fetch (none if the
    /// disk had it all, after a wait perhaps), each with its claim: empty
    /// if the wait ran out.
    fn claim(&self, offset: u64, buf: &mut [u8]) -> Vec<Fetch> {
        let mut missing = self.fill(offset, buf);
        let deadline = Instant::now() + self.wait;
        let mut backoff = Duration::from_micros(500);
        let mut waited = false;
        let unclaimed = |missing: Vec<Range<u64>>| {
            missing
                .into_iter()
                .map(|pages| Fetch {
                    pages,
                    claim: Claim { held: Vec::new() },
                })
                .collect()
        };
        loop {
            let (Some(first), Some(last)) = (missing.first(), missing.last()) else {
                return Vec::new();
            };
            let span = first.start..last.end;
            match self.try_claim(&missing) {
                Ok(Some(claims)) => {
                    // Another reader may have written pages between the
                    // look and the lock (or an evictor removed some).
                    let (from, to) = self.byte_range(&span);
                    let at = (from - offset) as usize..(to - offset) as usize;
                    let now = self.fill(from, &mut buf[at]);
                    if now == missing {
                        return missing
                            .into_iter()
                            .zip(claims)
                            .map(|(pages, claim)| Fetch { pages, claim })
                            .collect();
                    }
                    drop(claims);
                    missing = now;
                    if Instant::now() >= deadline {
                        return unclaimed(missing);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    self.problem("creating a chunk", &e);
                    return unclaimed(missing);
                }
            }
            if !waited {
                waited = true;
                self.waits.fetch_add(1, Ordering::Relaxed);
            }
            // A writer thread must not wait: the holder's write may be
            // queued behind it.
            if writers::on_writer_thread() || Instant::now() >= deadline {
                return unclaimed(missing);
            }
            std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
            backoff = (backoff * 2).min(Duration::from_millis(20));
            let (from, to) = self.byte_range(&span);
            let at = (from - offset) as usize..(to - offset) as usize;
            missing = self.fill(from, &mut buf[at]);
        }
    }

    /// Locks the table entries of each run of `runs` in each chunk it
    /// spans: a claim per run, or none (`Ok(None)`) if another reader
    /// holds any of them.
    fn try_claim(&self, runs: &[Range<u64>]) -> std::io::Result<Option<Vec<Claim>>> {
        let mut claims = Vec::with_capacity(runs.len());
        for pages in runs {
            let mut claim = Claim { held: Vec::new() };
            let mut page = pages.start;
            while page < pages.end {
                let index = page / CHUNK_PAGES;
                let end = ((index + 1) * CHUNK_PAGES).min(pages.end);
                let chunk = self.open_or_create(index)?;
                let first = page % CHUNK_PAGES;
                let n = end - page;
                if !chunk.try_lock(first, n)? {
                    return Ok(None);
                }
                claim.held.push((chunk, first, n));
                page = end;
            }
            claims.push(claim);
        }
        Ok(Some(claims))
    }

    fn open_or_create(&self, index: u64) -> std::io::Result<Chunk> {
        let path = self.chunk_path(index);
        match Chunk::open_or_create(&path, &self.cache.tmp(), self.header(index)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The directory went (a clear, another version's open):
                // made again.
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&self.dir)?;
                self.meta.write(&self.dir, &self.cache.tmp())?;
                Chunk::open_or_create(&path, &self.cache.tmp(), self.header(index))
            }
            other => other,
        }
    }

    /// Writes `bytes`, fetched from byte `from` (page-aligned), to the
    /// disk, then gives the claim back. Failures are noted, never
    /// returned: the bytes are right either way.
    fn keep(&self, from: u64, bytes: &[u8], claim: Claim) {
        self.keep_padded(from, bytes, None, claim)
    }

    /// [`Self::keep`], with the bytes also `padded` (page-aligned, the
    /// last page filled up: see `Chunk::write`).
    fn keep_padded(&self, from: u64, bytes: &[u8], padded: Option<&[u8]>, claim: Claim) {
        self.network_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        match self.cache.make_room(bytes.len() as u64) {
            Room::Yes => {}
            Room::OverMax => {
                self.skipped_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                return;
            }
            Room::LowSpace => {
                self.skipped_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                self.problem(
                    "the file system is below the cache's minimum of free space",
                    &std::io::Error::from_raw_os_error(libc::ENOSPC),
                );
                return;
            }
        }
        let mut page = from / PAGE;
        let mut at = 0usize;
        let mut held = claim.held.iter();
        while at < bytes.len() {
            let index = page / CHUNK_PAGES;
            let first = page % CHUNK_PAGES;
            let n = (CHUNK_PAGES - first) as usize * PAGE as usize;
            let part = &bytes[at..(at + n).min(bytes.len())];
            let fresh;
            let chunk = match held.next() {
                Some((chunk, _, _)) if chunk.header().index == index => chunk,
                _ => match self.open_or_create(index) {
                    Ok(chunk) => {
                        fresh = chunk;
                        &fresh
                    }
                    Err(e) => {
                        self.problem("creating a chunk", &e);
                        return;
                    }
                },
            };
            let padded_part = padded.map(|p| {
                let end = (at + n).min(p.len());
                &p[at.min(end)..end]
            });
            if let Err(e) = chunk.write(first, part, padded_part) {
                self.problem("writing a chunk", &e);
                if e.raw_os_error() == Some(libc::ENOSPC) {
                    let _ = self.cache.evict(0);
                }
                return;
            }
            self.cache.wrote(part.len() as u64);
            self.written_bytes
                .fetch_add(part.len() as u64, Ordering::Relaxed);
            page += (part.len() as u64).div_ceil(PAGE);
            at += part.len();
        }
        drop(claim);
    }
}

/// The threads that write fetched pages to the disk (and hand them to the
/// fault path after).
mod writers {
    use std::sync::atomic::{AtomicU64, Ordering};

    use crate::sys;

    type Job = Box<dyn FnOnce() + Send>;

    static QUEUE: sys::ForkLocal<Option<crossbeam_channel::Sender<Job>>> = sys::ForkLocal::new();

    /// Writer threads per process.
    const THREADS: usize = 2;

    /// The most bytes queued for the disk after their hand-over in a
    /// process: past it, a fetch is handed over and not kept (a disk
    /// slower than the network never delays a fault).
    pub(super) const BACKLOG: u64 = 128 << 20;

    /// The most copies queued in a process: each holds its claim's chunk
    /// files open until written.
    const MAX_COPIES: u64 = 256;

    /// The copies of a process: made anew in a forked child, which must
    /// not count its parent's writes, nor take a lock a parent thread held
    /// at the fork.
    #[derive(Default)]
    struct Copies {
        /// Bytes taken and not given back.
        bytes: AtomicU64,
        /// Copies taken and not given back.
        count: AtomicU64,
        /// Buffers given back, for the next copies (at most [`BACKLOG`]
        /// bytes of them: a fresh buffer costs a page fault per page).
        free: std::sync::Mutex<Vec<Vec<u8>>>,
    }

    static COPIES: sys::ForkLocal<Copies> = sys::ForkLocal::new();

    fn copies() -> &'static Copies {
        COPIES.get_or_init(Copies::default)
    }

    const PAGE: usize = super::PAGE as usize;

    /// A copy of fetched bytes, at a page-aligned address inside its
    /// buffer, its last page filled up with zeros, for an `O_DIRECT`
    /// write.
    pub(super) struct Copy {
        buf: Vec<u8>,
        /// Where the aligned bytes start in `buf`.
        at: usize,
        /// How many bytes it holds.
        len: usize,
        /// Bytes reserved against [`BACKLOG`].
        reserved: u64,
    }

    impl Copy {
        /// Copies `bytes` in (at most the length asked of
        /// [`copy_buffer`]).
        pub(super) fn fill(&mut self, bytes: &[u8]) {
            let len = bytes.len().min(self.buf.len() - self.at);
            self.buf[self.at..self.at + len].copy_from_slice(&bytes[..len]);
            let padded = len.div_ceil(PAGE) * PAGE;
            self.buf[self.at + len..self.at + padded].fill(0);
            self.len = len;
        }

        /// The bytes copied in.
        pub(super) fn bytes(&self) -> &[u8] {
            &self.buf[self.at..self.at + self.len]
        }

        /// The bytes with the last page filled up, page-aligned.
        pub(super) fn padded(&self) -> &[u8] {
            &self.buf[self.at..self.at + self.len.div_ceil(PAGE) * PAGE]
        }
    }

    /// Reserves room for a write of `len` bytes queued after its
    /// hand-over: `false` if the writes queued would pass [`BACKLOG`] or
    /// [`MAX_COPIES`]. [`release`] gives it back.
    pub(super) fn reserve(len: usize) -> bool {
        let copies = copies();
        let taken = copies.bytes.fetch_add(len as u64, Ordering::Relaxed);
        let count = copies.count.fetch_add(1, Ordering::Relaxed);
        if taken + len as u64 > BACKLOG || count >= MAX_COPIES {
            release(len);
            return false;
        }
        true
    }

    /// Gives back what [`reserve`] took.
    pub(super) fn release(len: usize) {
        let copies = copies();
        copies.bytes.fetch_sub(len as u64, Ordering::Relaxed);
        copies.count.fetch_sub(1, Ordering::Relaxed);
    }

    /// A buffer for a copy of `len` bytes, if the copies queued stay under
    /// [`BACKLOG`] with it.
    pub(super) fn copy_buffer(len: usize) -> Option<Copy> {
        if !reserve(len) {
            return None;
        }
        let copies = copies();
        let reserved = len as u64;
        // Room for the bytes, filled up to a page, after up to a page of
        // alignment.
        let need = len.div_ceil(PAGE) * PAGE + PAGE;
        let pooled = copies.free.lock().ok().and_then(|mut free| {
            let i = free.iter().position(|b| b.len() >= need)?;
            Some(free.swap_remove(i))
        });
        let buf = pooled.unwrap_or_else(|| vec![0u8; need]);
        let at = buf.as_ptr().align_offset(PAGE).min(PAGE);
        Some(Copy {
            buf,
            at,
            len: 0,
            reserved,
        })
    }

    /// Gives back a buffer [`copy_buffer`] gave.
    pub(super) fn give_back(copy: Copy) {
        release(copy.reserved as usize);
        if let Ok(mut free) = copies().free.lock() {
            let kept: usize = free.iter().map(Vec::len).sum();
            if (kept + copy.buf.len()) as u64 <= BACKLOG {
                free.push(copy.buf);
            }
        }
    }

    std::thread_local! {
        static ON_WRITER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Whether the calling thread is a writer.
    pub(super) fn on_writer_thread() -> bool {
        ON_WRITER.with(|w| w.get())
    }

    /// Runs `job` on a writer thread (on this one if none could start).
    pub(super) fn run(job: Job) {
        let queue = QUEUE.get_or_init(|| {
            let (tx, rx) = crossbeam_channel::unbounded::<Job>();
            let mut started = 0;
            for _ in 0..THREADS {
                let rx = rx.clone();
                let spawned = std::thread::Builder::new()
                    .name("faultmap-disk".into())
                    .spawn(move || {
                        ON_WRITER.with(|w| w.set(true));
                        while let Ok(job) = rx.recv() {
                            job();
                        }
                    });
                started += usize::from(spawned.is_ok());
            }
            (started > 0).then_some(tx)
        });
        match queue {
            Some(tx) => {
                if let Err(back) = tx.send(job) {
                    (back.0)();
                }
            }
            None => job(),
        }
    }
}

/// Whether the disk cache `config` names holds version `version` (of
/// `len` bytes) of the object at `url`: a reader read it from its server by
/// ranges before, so the open's range probe can be left out (a second run
/// then sends the server its `HEAD` alone). Looks, creates nothing.
pub(crate) fn holds(
    config: &crate::base::config::DiskCacheConfig,
    url: &str,
    version: &str,
    len: u64,
) -> bool {
    let url_dir = config.dir.join("objects").join(hash_name(url));
    let Ok(entries) = std::fs::read_dir(url_dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        Meta::read(&e.path()).is_some_and(|m| m.url == url && m.version == version && m.len == len)
    })
}

/// Opens `store` through the disk cache `config` names, waiting at most
/// `wait` for another reader's fetch: the store itself if it names no
/// pinned version.
pub(crate) fn wrap(
    store: Box<dyn Store>,
    config: &crate::base::config::DiskCacheConfig,
    wait: Duration,
) -> Result<Box<dyn Store>, StoreError> {
    let cache = match DiskCache::open(config) {
        Ok(cache) => cache,
        // A directory that is not safe, or not one, is the user's to fix:
        // said. A disk that fails (full, read-only) reads uncached.
        Err(e @ (DiskCacheError::Unsafe { .. } | DiskCacheError::NotADirectory { .. })) => {
            return Err(e.into())
        }
        Err(DiskCacheError::Io { .. }) => return Ok(store),
    };
    // A quarter of the request's timeout at most: the pager's watchdog
    // runs meanwhile, and the fetch after a wait needs the rest.
    Ok(match CachedStore::new(store, cache, wait / 4)? {
        Ok(cached) => Box::new(cached),
        Err(store) => store,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_store_is_send_and_sync() {
        fn is<T: Send + Sync>() {}
        is::<CachedStore<Box<dyn Store>>>();
    }
}
