//! The cache directory: its checks, its layout, its bounds (eviction), and
//! what `faultmap cache` reads of it.
//!
//! ```text
//! DIR/                       mode 0700, this user's
//!   CACHEDIR.TAG             so that backup tools skip it
//!   lock                     flock: one evictor at a time
//!   tmp/                     files being born (chunk files, meta files)
//!   objects/<url>/           one directory per object URL (a hash of it)
//!     <version>/             one per pinned version (a hash of its key)
//!       meta                 the URL, the version, the length (text)
//!       <index>.chunk        4 MiB of the object (`chunk`)
//! ```
//!
//! Eviction is least-recently-used over chunk files, by modification
//! time: writing a page, and the first read of a chunk each
//! [`TOUCH_EVERY`], set it. Chunks of versions other than an URL's newest
//! go first. An evictor holds `lock` exclusively (another process that
//! finds it held leaves eviction to it); readers and writers take no
//! lock here: a chunk unlinked while open stays readable to its holders,
//! and a write into it is lost, never misplaced.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use super::chunk::{page_sum, Chunk, Header, OpenError, CHUNK_BYTES, CHUNK_PAGES, PAGE};
use crate::base::config::DiskCacheConfig;
use crate::sys;

/// How often at most a read of a chunk sets its modification time (its
/// place in the eviction order).
pub(crate) const TOUCH_EVERY: Duration = Duration::from_secs(30);

/// How old a file in `tmp/` must be to be an orphan (its creator died):
/// files there live for microseconds.
const ORPHAN_AGE: Duration = Duration::from_secs(60);

/// Why a cache directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskCacheError {
    /// The directory, or a file in it, could not be created or opened.
    #[error("disk cache {path}: cannot {what}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The path names something that is not a directory.
    #[error("disk cache {path} is not a directory")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory is not safe to serve bytes from: another user owns
    /// it, or others may write to it (they could plant bytes).
    #[error("disk cache {path} is refused: {reason}")]
    Unsafe {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A cache directory, open: one per directory per process (see
/// [`DiskCache::open`]).
#[derive(Debug)]
pub struct DiskCache {
    root: PathBuf,
    max_bytes: Option<u64>,
    /// The free space to keep; `None` until the file system's size is
    /// known (5 % of it).
    min_free_bytes: u64,
    /// Bytes on disk at the last scan, and written since by this process.
    used_at_scan: AtomicU64,
    written_since_scan: AtomicU64,
    scanned: AtomicBool,
    problems: Problems,
}

/// Failures of the disk, kept so that the first is reported once and the
/// others counted.
#[derive(Debug, Default)]
pub(crate) struct Problems {
    first: Mutex<Option<String>>,
    count: AtomicU64,
}

impl Problems {
    /// Notes a failure; `true` if it is the first.
    pub(crate) fn note(&self, what: impl FnOnce() -> String) -> bool {
        let n = self.count.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            // try_lock: a child forked while a parent thread held it must
            // not wait for ever (the message is then lost, the count kept).
            if let Ok(mut first) = self.first.try_lock() {
                *first = Some(what());
            }
        }
        n == 0
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub(crate) fn first(&self) -> Option<String> {
        self.first.try_lock().ok().and_then(|first| first.clone())
    }
}

/// The caches open in this process, by directory.
static OPEN: sys::ForkLocal<Mutex<Vec<OpenCache>>> = sys::ForkLocal::new();

/// A cache open in this process: its directory, and it while it lives.
type OpenCache = (PathBuf, Weak<DiskCache>);

impl DiskCache {
    /// Opens the cache `config` names, creating its directory (mode 0700)
    /// if it is missing. Refused if another user owns the directory or
    /// others may write to it. Stores of one process share one
    /// `DiskCache` per directory.
    pub fn open(config: &DiskCacheConfig) -> Result<Arc<DiskCache>, DiskCacheError> {
        let root = prepare(&config.dir)?;
        let open = OPEN.get_or_init(|| Mutex::new(Vec::new()));
        let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, cache)| cache.strong_count() > 0);
        if let Some(cache) = open
            .iter()
            .filter(|(path, _)| *path == root)
            .find_map(|(_, cache)| cache.upgrade())
            .filter(|c| c.max_bytes == config.max_bytes)
        {
            return Ok(cache);
        }
        let io_error = |what| {
            let root = root.clone();
            move |source| DiskCacheError::Io {
                path: root,
                what,
                source,
            }
        };
        open_lock(&root).map_err(io_error("create its lock file"))?;
        sweep_orphans(&root.join("tmp"));
        let (size, _) = sys::fs_space(&root).map_err(io_error("ask its file system's size"))?;
        let cache = Arc::new(DiskCache {
            max_bytes: config.max_bytes,
            min_free_bytes: config.min_free_bytes.unwrap_or(size / 20),
            used_at_scan: AtomicU64::new(0),
            written_since_scan: AtomicU64::new(0),
            scanned: AtomicBool::new(false),
            problems: Problems::default(),
            root: root.clone(),
        });
        open.push((root, Arc::downgrade(&cache)));
        Ok(cache)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The most bytes it keeps, if bounded.
    pub fn max_bytes(&self) -> Option<u64> {
        self.max_bytes
    }

    /// The free space it leaves on its file system.
    pub fn min_free_bytes(&self) -> u64 {
        self.min_free_bytes
    }

    pub(crate) fn problems(&self) -> &Problems {
        &self.problems
    }

    pub(crate) fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// The directory of all versions of the object at `url`.
    pub(crate) fn url_dir(&self, url: &str) -> PathBuf {
        self.root.join("objects").join(hash_name(url))
    }

    /// Whether `bytes` more may be written now: makes room by evicting
    /// cold chunks if the cache would pass its maximum or the file system
    /// its minimum of free space.
    pub(crate) fn make_room(&self, bytes: u64) -> Room {
        let rescan = self
            .max_bytes
            .map_or(256 << 20, |max| (max / 8).max(CHUNK_BYTES));
        let written = self.written_since_scan.load(Ordering::Relaxed);
        let over_max = self.max_bytes.is_some_and(|max| {
            !self.scanned.load(Ordering::Relaxed)
                || written > rescan
                || self.used_at_scan.load(Ordering::Relaxed) + written + bytes > max
        });
        // statvfs costs a microsecond, against a fetch's milliseconds.
        let low_space = |free: Option<u64>| too_little(free, self.min_free_bytes + bytes);
        if !over_max && !low_space(self.free_bytes()) {
            return Room::Yes;
        }
        // Another process evicting (`Ok(None)`), or a pass that failed,
        // leaves this process's count as it was: checked all the same.
        if let Err(e) = self.evict(bytes) {
            self.problems
                .note(|| format!("disk cache {}: evicting: {e}", self.root.display()));
        }
        if low_space(self.free_bytes()) {
            return Room::LowSpace;
        }
        if let Some(max) = self.max_bytes {
            let used = self.used_at_scan.load(Ordering::Relaxed)
                + self.written_since_scan.load(Ordering::Relaxed);
            if used + bytes > max {
                return Room::OverMax;
            }
        }
        Room::Yes
    }

    /// Counts `bytes` written by this process.
    pub(crate) fn wrote(&self, bytes: u64) {
        self.written_since_scan.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The free space of the cache's file system; `None` if it cannot be
    /// asked (then nothing is written, and nothing evicted for it).
    fn free_bytes(&self) -> Option<u64> {
        sys::fs_space(&self.root).ok().map(|(_, free)| free)
    }

    /// One eviction pass: if no other process is evicting, scans the cache
    /// and unlinks cold chunks until `incoming` more bytes fit under the
    /// maximum and above the free-space minimum (with an eighth of slack,
    /// so that a pass is not needed at every write). Returns the bytes
    /// freed, `None` if another process holds the evictor's lock.
    pub fn evict(&self, incoming: u64) -> io::Result<Option<u64>> {
        // A description of its own per pass: a flock excludes other
        // descriptions only, and this process's threads, and its forked
        // children, would share one opened once.
        let lock = open_lock(&self.root)?;
        if !sys::flock_try(&lock, true)? {
            return Ok(None);
        }
        let result = self.evict_locked(incoming);
        let _ = sys::flock_unlock(&lock);
        result.map(Some)
    }

    fn evict_locked(&self, incoming: u64) -> io::Result<u64> {
        sweep_orphans(&self.tmp());
        let mut chunks = self.scan_chunks(true)?;
        let used: u64 = chunks.iter().map(|c| c.bytes).sum();
        let mut to_free = 0;
        if let Some(max) = self.max_bytes {
            let target = max - max / 8;
            if used + incoming > max {
                to_free = (used + incoming).saturating_sub(target);
            }
        }
        let free = self.free_bytes().unwrap_or(u64::MAX);
        if free < self.min_free_bytes + incoming {
            let want = self.min_free_bytes + self.min_free_bytes / 8 + incoming;
            to_free = to_free.max(want - free);
        }
        // Old versions first, then the least recently used.
        chunks.sort_by_key(|c| (!c.stale, c.used));
        let mut freed = 0;
        for chunk in &chunks {
            if freed >= to_free {
                break;
            }
            if fs::remove_file(&chunk.path).is_ok() {
                freed += chunk.bytes;
            }
        }
        self.used_at_scan
            .store(used.saturating_sub(freed), Ordering::Relaxed);
        self.written_since_scan.store(0, Ordering::Relaxed);
        self.scanned.store(true, Ordering::Relaxed);
        Ok(freed)
    }

    /// Every chunk file, with its bytes on disk, its last use, and
    /// whether it belongs to a version older than its URL's newest.
    fn scan_chunks(&self, reclaim: bool) -> io::Result<Vec<ChunkEntry>> {
        let mut out = Vec::new();
        // A folder that cannot be read is passed over, not the pass failed.
        for url_dir in subdirs(&self.root.join("objects"))? {
            let versions = subdirs(&url_dir).unwrap_or_default();
            // A version whose meta is not written yet is being opened:
            // the newest.
            let born = |v: &PathBuf| {
                fs::metadata(v.join("meta"))
                    .and_then(|m| m.modified())
                    .unwrap_or_else(|_| SystemTime::now())
            };
            let newest = versions.iter().map(born).max();
            for version in &versions {
                let stale = Some(born(version)) != newest;
                let entries = read_dir(version).unwrap_or_default();
                let chunks = entries
                    .iter()
                    .any(|e| e.path().extension().is_some_and(|x| x == "chunk"));
                if reclaim && stale && !chunks {
                    // An old version with nothing left: its folder goes.
                    let _ = remove_tree(version);
                }
                for entry in entries {
                    let path = entry.path();
                    if !path.extension().is_some_and(|e| e == "chunk") {
                        continue;
                    }
                    let Ok(meta) = entry.metadata() else { continue };
                    out.push(ChunkEntry {
                        bytes: meta.blocks() * 512,
                        used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        stale,
                        path,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The objects in the cache, those at `url` only if it is given.
    pub fn objects(&self, url: Option<&str>) -> io::Result<Vec<CachedObject>> {
        let mut out = Vec::new();
        for url_dir in subdirs(&self.root.join("objects"))? {
            for version in subdirs(&url_dir)? {
                let Some(meta) = Meta::read(&version) else {
                    continue;
                };
                if url.is_some_and(|u| u != meta.url) {
                    continue;
                }
                let mut object = CachedObject {
                    url: meta.url.clone(),
                    version: meta.version.clone(),
                    len: meta.len,
                    disk_bytes: 0,
                    cached_bytes: 0,
                    chunks: 0,
                    last_used: None,
                    dir: version.clone(),
                };
                for entry in read_dir(&version)? {
                    let Ok(md) = entry.metadata() else { continue };
                    object.disk_bytes += md.blocks() * 512;
                    let name = entry.file_name();
                    let Some(index) = chunk_index(&name.to_string_lossy()) else {
                        continue;
                    };
                    object.chunks += 1;
                    object.last_used = object.last_used.max(md.modified().ok());
                    let header = meta.header(index);
                    if let Ok(chunk) = Chunk::open(&entry.path(), header) {
                        let mut sums = vec![0u32; CHUNK_PAGES as usize];
                        if chunk.sums(0, &mut sums).is_ok() {
                            object.cached_bytes += sums
                                .iter()
                                .enumerate()
                                .filter(|(_, s)| **s != 0)
                                .map(|(p, _)| header.page_len(p as u64) as u64)
                                .sum::<u64>();
                        }
                    }
                }
                out.push(object);
            }
        }
        out.sort_by(|a, b| a.url.cmp(&b.url).then(a.version.cmp(&b.version)));
        Ok(out)
    }

    /// Checks every page the cache holds (of `url` only, if given)
    /// against its checksum. Pages that fail are never served (they are
    /// read again from the network); this reports them.
    pub fn verify(&self, url: Option<&str>) -> io::Result<Verified> {
        let mut out = Verified::default();
        for object in self.objects(url)? {
            let Some(meta) = Meta::read(&object.dir) else {
                continue;
            };
            for entry in read_dir(&object.dir)? {
                let name = entry.file_name();
                let Some(index) = chunk_index(&name.to_string_lossy()) else {
                    continue;
                };
                let header = meta.header(index);
                let chunk = match Chunk::open(&entry.path(), header) {
                    Ok(chunk) => chunk,
                    Err(OpenError::Missing) => continue,
                    Err(OpenError::Foreign) => {
                        out.bad_chunks.push(entry.path());
                        continue;
                    }
                    Err(OpenError::Io(e)) => return Err(e),
                };
                let mut sums = vec![0u32; CHUNK_PAGES as usize];
                chunk.sums(0, &mut sums)?;
                let mut page = vec![0u8; PAGE as usize];
                for (p, &sum) in sums.iter().enumerate() {
                    if sum == 0 {
                        continue;
                    }
                    let len = header.page_len(p as u64);
                    let whole = len > 0 && chunk.read(p as u64, &mut page[..len])? == len;
                    if whole && page_sum(&header, p as u64, &page[..len]) == sum {
                        out.good_pages += 1;
                    } else {
                        out.bad_pages.push(BadPage {
                            url: meta.url.clone(),
                            version: meta.version.clone(),
                            offset: (index * CHUNK_PAGES + p as u64) * PAGE,
                        });
                    }
                }
            }
            out.objects += 1;
        }
        Ok(out)
    }

    /// Removes every cached version of the object at `url`, or everything
    /// if `url` is `None`. Returns the bytes freed. Processes reading
    /// those objects read them from the network again.
    pub fn clear(&self, url: Option<&str>) -> io::Result<u64> {
        let mut freed = 0;
        // A writer that makes a folder again meanwhile is no error: what
        // it writes is a new entry.
        for object in self.objects(url)? {
            freed += object.disk_bytes;
            let _ = remove_tree(&object.dir);
            if let Some(parent) = object.dir.parent() {
                let _ = fs::remove_dir(parent);
            }
        }
        if url.is_none() {
            // Directories without a readable meta file too.
            for url_dir in subdirs(&self.root.join("objects"))? {
                freed += tree_bytes(&url_dir);
                let _ = remove_tree(&url_dir);
            }
            sweep_orphans(&self.tmp());
        }
        self.scanned.store(false, Ordering::Relaxed);
        Ok(freed)
    }

    /// The bytes the cache holds on disk.
    pub fn disk_bytes(&self) -> io::Result<u64> {
        Ok(self.scan_chunks(false)?.iter().map(|c| c.bytes).sum())
    }
}

/// Whether a write may go ahead ([`DiskCache::make_room`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    Yes,
    /// It would pass the maximum, even after eviction: not kept (the
    /// cache's normal state under a maximum, not a failure).
    OverMax,
    /// The file system is below the free-space minimum, even after
    /// eviction, or its free space cannot be asked: a full disk.
    LowSpace,
}

/// Whether `free` is under `need`, an unknown free space counting as too
/// little.
fn too_little(free: Option<u64>, need: u64) -> bool {
    !matches!(free, Some(free) if free >= need)
}

/// Opens (creating) the evictors' lock file of the cache at `root`.
fn open_lock(root: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(root.join("lock"))
}

/// A chunk file, as eviction sees it.
struct ChunkEntry {
    path: PathBuf,
    bytes: u64,
    used: SystemTime,
    stale: bool,
}

/// One version of one object in the cache ([`DiskCache::objects`]).
#[derive(Clone, Debug)]
pub struct CachedObject {
    /// The object's URL.
    pub url: String,
    /// Its version as its store names it (ETag, version id).
    pub version: String,
    /// Its length.
    pub len: u64,
    /// The bytes its files take on disk.
    pub disk_bytes: u64,
    /// The bytes of the object the cache holds (pages whose checksum is
    /// written).
    pub cached_bytes: u64,
    /// Its chunk files.
    pub chunks: u64,
    /// When a chunk of it was last written or read.
    pub last_used: Option<SystemTime>,
    /// Its directory.
    pub dir: PathBuf,
}

/// What [`DiskCache::verify`] found.
#[derive(Clone, Debug, Default)]
pub struct Verified {
    /// Object versions checked.
    pub objects: u64,
    /// Pages whose bytes match their checksum.
    pub good_pages: u64,
    /// Pages whose bytes do not (a torn write, a damaged disk).
    pub bad_pages: Vec<BadPage>,
    /// Chunk files whose header is not theirs.
    pub bad_chunks: Vec<PathBuf>,
}

/// A page whose bytes do not match its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadPage {
    /// The object's URL.
    pub url: String,
    /// Its version.
    pub version: String,
    /// The page's offset in the object.
    pub offset: u64,
}

/// What a version directory's `meta` file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) url: String,
    pub(crate) key: String,
    pub(crate) version: String,
    pub(crate) len: u64,
}

const META_FIRST_LINE: &str = "faultmap disk cache 1";

impl Meta {
    pub(crate) fn key_hash(&self) -> [u8; 16] {
        hash(&self.key)
    }

    /// The header chunk `index` of this version carries.
    pub(crate) fn header(&self, index: u64) -> Header {
        Header {
            key: self.key_hash(),
            index,
            object_len: self.len,
        }
    }

    fn text(&self) -> String {
        let one_line = |s: &str| s.replace(['\n', '\r'], " ");
        format!(
            "{META_FIRST_LINE}\nurl {}\nkey {}\nversion {}\nlength {}\nend\n",
            one_line(&self.url),
            one_line(&self.key),
            one_line(&self.version),
            self.len
        )
    }

    /// The meta file of the version directory `dir`, if it is whole.
    pub(crate) fn read(dir: &Path) -> Option<Meta> {
        let text = fs::read_to_string(dir.join("meta")).ok()?;
        let mut lines = text.lines();
        if lines.next()? != META_FIRST_LINE {
            return None;
        }
        let mut field = |name: &str| {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .map(str::to_string)
        };
        let meta = Meta {
            url: field("url")?,
            key: field("key")?,
            version: field("version")?,
            len: field("length")?.parse().ok()?,
        };
        (lines.next()? == "end").then_some(meta)
    }

    /// Writes the meta file of `dir` whole (through a file in `tmp`).
    pub(crate) fn write(&self, dir: &Path, tmp: &Path) -> io::Result<()> {
        let staged = tmp.join(super::chunk::temp_name());
        let made =
            fs::write(&staged, self.text()).and_then(|()| fs::rename(&staged, dir.join("meta")));
        if made.is_err() {
            let _ = fs::remove_file(&staged);
        }
        made
    }
}

/// The number in a chunk file's name (`17.chunk`).
pub(crate) fn chunk_index(name: &str) -> Option<u64> {
    name.strip_suffix(".chunk")?.parse().ok()
}

/// A 128-bit hash of `text` (SipHash-1-3 with a fixed key): the names of
/// the directories, and the key hash chunk files carry. A collision of
/// URLs is caught by the meta file, which holds the whole key.
pub(crate) fn hash(text: &str) -> [u8; 16] {
    use std::hash::Hasher as _;
    let mut h = siphasher::sip128::SipHasher13::new_with_keys(0x6661_756c_746d_6170, 0x6469_736b);
    h.write(text.as_bytes());
    siphasher::sip128::Hasher128::finish128(&h).as_bytes()
}

/// [`hash`] in hex.
pub(crate) fn hash_name(text: &str) -> String {
    hash(text).iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates `dir` (mode 0700) if it is missing, checks that it is this
/// user's and that no one else may write to it, and makes its layout.
/// Returns it canonical.
fn prepare(dir: &Path) -> Result<PathBuf, DiskCacheError> {
    let io_error = |what: &'static str| {
        move |source| DiskCacheError::Io {
            path: dir.to_path_buf(),
            what,
            source,
        }
    };
    match fs::metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
            {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error("create it")(e)),
            }
        }
        Err(e) => return Err(io_error("look at it")(e)),
    }
    let root = fs::canonicalize(dir).map_err(io_error("resolve its path"))?;
    let meta = fs::metadata(&root).map_err(io_error("look at it"))?;
    if !meta.is_dir() {
        return Err(DiskCacheError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let me = sys::effective_uid();
    if meta.uid() != me {
        return Err(DiskCacheError::Unsafe {
            path: dir.to_path_buf(),
            reason: format!(
                "it is owned by uid {}, not by this user (uid {me}); a cache must be its \
                 user's alone",
                meta.uid()
            ),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(DiskCacheError::Unsafe {
            path: dir.to_path_buf(),
            reason: format!(
                "its mode is {:04o}: others may write to it and plant bytes; `chmod 700` it",
                meta.mode() & 0o7777
            ),
        });
    }
    // Its folders up to `/` too (as ssh's StrictModes does): one that
    // every user may write to, without the sticky bit, or that another
    // user owns, lets them put another directory in its place after this
    // check. (A folder its group may write to passes: a user's own group,
    // Kubernetes' fsGroup volumes. Root may show as the overflow uid
    // inside a user namespace.)
    const OVERFLOW_UID: u32 = 65534;
    for ancestor in root.ancestors().skip(1) {
        let Ok(m) = fs::metadata(ancestor) else {
            continue;
        };
        let owner_ok = [me, 0, OVERFLOW_UID].contains(&m.uid());
        let writable_by_others = m.mode() & 0o002 != 0 && m.mode() & 0o1000 == 0;
        if !owner_ok || writable_by_others {
            return Err(DiskCacheError::Unsafe {
                path: dir.to_path_buf(),
                reason: format!(
                    "its parent {} (mode {:04o}, uid {}) lets another user replace it",
                    ancestor.display(),
                    m.mode() & 0o7777,
                    m.uid()
                ),
            });
        }
    }
    for sub in ["objects", "tmp"] {
        match fs::DirBuilder::new().mode(0o700).create(root.join(sub)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_error("create its subdirectories")(e)),
        }
    }
    let tag = root.join("CACHEDIR.TAG");
    if !tag.exists() {
        let _ = fs::write(
            &tag,
            "Signature: 8a477f597d28d172789f06886806bc55\n\
             # This file is a cache directory tag created by faultmap.\n\
             # For information about cache directory tags see https://bford.info/cachedir/\n",
        );
    }
    Ok(root)
}

fn read_dir(dir: &Path) -> io::Result<Vec<fs::DirEntry>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(Result::ok).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn subdirs(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(read_dir(dir)?
        .into_iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect())
}

/// Removes `dir` and what is in it; one that is already gone is no error.
pub(crate) fn remove_tree(dir: &Path) -> io::Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        // A writer added a file while the tree was removed: once more.
        Err(_) => match fs::remove_dir_all(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
    }
}

fn tree_bytes(dir: &Path) -> u64 {
    read_dir(dir).map_or(0, |entries| {
        entries
            .iter()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => tree_bytes(&e.path()),
                _ => e.metadata().map_or(0, |m| m.blocks() * 512),
            })
            .sum()
    })
}

/// Removes files in `tmp` older than [`ORPHAN_AGE`]: their creators died
/// before linking them.
fn sweep_orphans(tmp: &Path) {
    let Ok(entries) = read_dir(tmp) else { return };
    let now = SystemTime::now();
    for entry in entries {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > ORPHAN_AGE);
        if old {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_new_directory_is_private_and_an_open_one_refuses_others() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("a/b");
        let cache = DiskCache::open(&DiskCacheConfig::new(&dir)).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert!(dir.join("CACHEDIR.TAG").exists());
        // One per directory per process.
        let again = DiskCache::open(&DiskCacheConfig::new(&dir)).unwrap();
        assert!(Arc::ptr_eq(&cache, &again));

        let open = top.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = DiskCache::open(&DiskCacheConfig::new(&open)).unwrap_err();
        assert!(matches!(e, DiskCacheError::Unsafe { .. }), "{e}");
        assert!(e.to_string().contains("0777"), "{e}");

        let file = top.path().join("file");
        fs::write(&file, b"x").unwrap();
        let e = DiskCache::open(&DiskCacheConfig::new(&file)).unwrap_err();
        assert!(matches!(e, DiskCacheError::NotADirectory { .. }), "{e}");
    }

    #[test]
    fn meta_reads_back_and_a_torn_one_does_not() {
        let top = tempfile::tempdir().unwrap();
        let meta = Meta {
            url: "s3://b/k".into(),
            key: "s3://b/k origin 10 bytes, etag \"x\"".into(),
            version: "etag \"x\"".into(),
            len: 10,
        };
        meta.write(top.path(), top.path()).unwrap();
        assert_eq!(Meta::read(top.path()), Some(meta.clone()));
        let text = meta.text();
        fs::write(top.path().join("meta"), &text[..text.len() - 4]).unwrap();
        assert_eq!(Meta::read(top.path()), None);
        assert_eq!(chunk_index("12.chunk"), Some(12));
        assert_eq!(chunk_index("12.tmp"), None);
        assert_ne!(hash_name("a"), hash_name("b"));
        assert_eq!(hash_name("a").len(), 32);
    }
}
