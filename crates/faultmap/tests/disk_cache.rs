#![cfg(not(loom))]
//! The disk cache (`CachedStore` over a `DiskCache` directory), against
//! its invariants:
//!
//! 1. **Right bytes.** A read returns the object's bytes, whatever the
//!    cache holds: a page is served from the disk only if its checksum
//!    entry is written and matches its bytes, at its place, for its
//!    version. Torn pages (a kill, a full disk) and foreign chunk files
//!    are read from the network again.
//! 2. **Keys.** Entries belong to one pinned version (the store's
//!    `share_key`); a new version is fetched, and opening it removes the
//!    URL's other versions. An unpinned object is not cached.
//! 3. **Persistence.** A page read from the network is on disk when the
//!    read returns; another store, in this process or another, reads it
//!    from there.
//! 4. **Once in flight.** A page is fetched by one process at a time: a
//!    reader that finds another's claim on it waits, then reads the disk.
//!    Processes reading one object at once download it once in all.
//! 5. **Bounds.** The cache stays near its maximum (within a chunk per
//!    writer between scans) and above its free-space minimum, evicting
//!    the least recently used chunks; a full disk makes reads fall back
//!    to the network, with one report.
//! 6. **Kills.** Processes killed at random points, while others read and
//!    evict, leave no page that fails its checksum and no lock behind.
//! 7. **Security.** The directory is made 0700; one owned by another user
//!    or writable by others is refused.
//!
//! Real files, real processes (this binary re-executed), a real tmpfs
//! that fills up (as root).

mod common;
use common::*;

use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faultmap::{
    CachedStore, Config, DiskCache, DiskCacheConfig, DiskCacheError, MapOptions, Pager, Store,
    StoreError,
};

const MIB: u64 = 1 << 20;
/// Bytes per chunk file (the cache's unit of eviction).
const CHUNK: u64 = 4 * MIB;
/// Where a chunk file's page data starts (after its header and table).
const DATA: u64 = 8192;

/// An object whose bytes are [`pattern`]`(_, seed)`, pinned as `version`:
/// counts what it serves, and takes `delay` per request (a slow link).
struct Gen {
    name: String,
    len: u64,
    seed: u64,
    version: Option<String>,
    delay: Duration,
    served: Arc<AtomicU64>,
}

impl Gen {
    fn new(len: u64, seed: u64, version: &str) -> Gen {
        Gen {
            name: "https://example.invalid/object".into(),
            len,
            seed,
            version: Some(version.into()),
            delay: Duration::ZERO,
            served: Arc::default(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len as usize];
        pattern_at(self.seed, 0, &mut out);
        out
    }
}

impl Store for Gen {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn version(&self) -> Option<String> {
        self.version.clone()
    }
    fn share_key(&self) -> Option<String> {
        let v = self.version.as_ref()?;
        Some(format!("{} {} bytes, {v}", self.name, self.len))
    }
    /// As a remote store's: only a byte-exact version (here, not `W/`).
    fn disk_cache_key(&self) -> Option<String> {
        self.share_key()
            .filter(|_| !self.version.as_ref().is_some_and(|v| v.starts_with("W/")))
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        std::thread::sleep(self.delay);
        pattern_at(self.seed, offset, buf);
        self.served.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

fn cached(gen: Gen, config: &DiskCacheConfig) -> Arc<CachedStore<Gen>> {
    let cache = DiskCache::open(config).expect("open the cache");
    match CachedStore::new(gen, cache, Duration::from_secs(30)).expect("cache the object") {
        Ok(store) => Arc::new(store),
        Err(_) => panic!("a pinned object must be cached"),
    }
}

/// Reads all of `store` with `read_at`, `step` bytes at a time.
fn read_all(store: &impl Store, step: u64) -> Vec<u8> {
    let mut out = vec![0u8; store.len() as usize];
    let mut at = 0;
    while at < store.len() {
        let end = (at + step).min(store.len());
        store
            .read_at(at, &mut out[at as usize..end as usize])
            .expect("read");
        at = end;
    }
    out
}

/// Reads all of `store` through a pager's mapping (the fault path, its
/// readahead and asynchronous reads).
fn fault_all(store: Arc<CachedStore<Gen>>) -> Vec<u8> {
    let pager = Pager::new(Config::default()).expect("pager");
    let map = pager
        .map_trusted(store.clone(), MapOptions::new())
        .expect("map the object");
    let bytes = map.to_vec();
    drop(map);
    drop(pager);
    // Pages are handed over first and written after.
    store.wait_written(Duration::from_secs(60));
    bytes
}

#[test]
fn a_second_reader_reads_from_the_disk_not_the_network() {
    let dir = tempfile::tempdir().unwrap();
    let config = DiskCacheConfig::new(dir.path().join("cache"));
    let len = 10 * MIB + 1234;
    let gen = Gen::new(len, 1, "v1");
    let expected = gen.bytes();
    let first_served = gen.served.clone();
    let first = cached(gen, &config);
    assert_bytes(
        &fault_all(first.clone()),
        &expected,
        "first read, through a mapping",
    );
    let stats = first.stats();
    assert_eq!(first_served.load(Ordering::Relaxed), len);
    assert_eq!((stats.network_bytes, stats.written_bytes), (len, len));
    assert_eq!(stats.disk_bytes, 0);
    drop(first);

    // Another store of the same version: nothing from the network, by
    // the fault path or by read_at of odd sizes.
    for (i, step) in [0, 3 * 4096, MIB + 4096 * 5].into_iter().enumerate() {
        let gen = Gen::new(len, 1, "v1");
        let served = gen.served.clone();
        let again = cached(gen, &config);
        let bytes = if step == 0 {
            fault_all(again.clone())
        } else {
            read_all(&again, step)
        };
        assert_bytes(&bytes, &expected, &format!("read {i} from the disk"));
        assert_eq!(served.load(Ordering::Relaxed), 0, "read {i}: no network");
        let stats = again.stats();
        assert_eq!(
            (stats.disk_bytes, stats.network_bytes),
            (len, 0),
            "read {i}"
        );
    }
    let objects = DiskCache::open(&config).unwrap().objects(None).unwrap();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].cached_bytes, len);
    assert_eq!(objects[0].len, len);
    assert_eq!(objects[0].version, "v1");
    assert_eq!(objects[0].chunks, 3);
}

#[test]
fn a_new_version_is_fetched_and_the_old_one_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let config = DiskCacheConfig::new(dir.path().join("cache"));
    let len = 6 * MIB;
    let old = cached(Gen::new(len, 1, "v1"), &config);
    read_all(&old, MIB);
    let old_dir = DiskCache::open(&config).unwrap().objects(None).unwrap()[0]
        .dir
        .clone();
    assert!(old_dir.exists());

    let gen = Gen::new(len, 2, "v2");
    let expected = gen.bytes();
    let served = gen.served.clone();
    let new = cached(gen, &config);
    assert!(!old_dir.exists(), "the old version's entries are reclaimed");
    assert_bytes(&read_all(&new, MIB), &expected, "the new version");
    assert_eq!(served.load(Ordering::Relaxed), len, "all from the network");
    let objects = DiskCache::open(&config).unwrap().objects(None).unwrap();
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].version, "v2");
    // The old store, still open, reads right (from the network).
    assert_bytes(
        &read_all(&old, MIB),
        &Gen::new(len, 1, "v1").bytes(),
        "the old version",
    );
}

#[test]
fn an_object_without_a_byte_exact_version_is_not_cached() {
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(&DiskCacheConfig::new(dir.path())).unwrap();
    let unpinned = Gen {
        version: None,
        ..Gen::new(MIB, 1, "")
    };
    let result = CachedStore::new(unpinned, cache.clone(), Duration::from_secs(1)).unwrap();
    assert!(result.is_err(), "given back uncached");
    let weak = Gen::new(MIB, 1, "W/\"abc\"");
    let result = CachedStore::new(weak, cache, Duration::from_secs(1)).unwrap();
    assert!(
        result.is_err(),
        "a weak ETag names equivalent bytes, not these"
    );
}

/// Reads that are not whole pages (but for the object's last) go to the
/// store below as they are, and read right.
#[test]
fn reads_of_part_of_a_page_go_around_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let config = DiskCacheConfig::new(dir.path().join("cache"));
    let len = 3 * 4096 + 100;
    let gen = Gen::new(len, 9, "v1");
    let expected = gen.bytes();
    let served = gen.served.clone();
    let store = cached(gen, &config);
    for (at, n) in [
        (0u64, 100usize),
        (0, 5000),
        (4096, 4097),
        (4096, 1),
        (3 * 4096, 100),
    ] {
        let mut buf = vec![0u8; n];
        store.read_at(at, &mut buf).unwrap();
        assert_eq!(buf, expected[at as usize..at as usize + n], "{at}+{n}");
    }
    // The last read ends at the object's end: cached.
    assert_eq!(store.stats().written_bytes, 100);
    assert_eq!(served.load(Ordering::Relaxed), 100 + 5000 + 4097 + 1 + 100);
}

/// The chunk file of `index` of the only object in `config`'s cache.
fn chunk_file(config: &DiskCacheConfig, index: u64) -> PathBuf {
    let objects = DiskCache::open(config).unwrap().objects(None).unwrap();
    objects[0].dir.join(format!("{index}.chunk"))
}

#[test]
fn torn_pages_and_foreign_chunks_are_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = DiskCacheConfig::new(dir.path().join("cache"));
    let len = 3 * CHUNK + 5 * 4096;
    let gen = Gen::new(len, 7, "v1");
    let expected = gen.bytes();
    read_all(&cached(gen, &config), MIB);

    // Chunk 0: one byte of page 5 flipped (a torn write under a power
    // cut). Chunk 1: cut in page 100 (a kill mid-write). Chunk 2: a
    // damaged header.
    let c0 = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(chunk_file(&config, 0))
        .unwrap();
    let mut byte = [0u8];
    c0.read_exact_at(&mut byte, DATA + 5 * 4096 + 17).unwrap();
    c0.write_all_at(&[byte[0] ^ 1], DATA + 5 * 4096 + 17)
        .unwrap();
    let c1 = std::fs::OpenOptions::new()
        .write(true)
        .open(chunk_file(&config, 1))
        .unwrap();
    c1.set_len(DATA + 100 * 4096 + 10).unwrap();
    let c2 = std::fs::OpenOptions::new()
        .write(true)
        .open(chunk_file(&config, 2))
        .unwrap();
    c2.write_all_at(b"XX", 0).unwrap();

    let cache = DiskCache::open(&config).unwrap();
    let found = cache.verify(None).unwrap();
    let bad: Vec<u64> = found.bad_pages.iter().map(|p| p.offset).collect();
    let mut want = vec![5 * 4096];
    want.extend((100..1024).map(|p| CHUNK + p * 4096));
    assert_eq!(bad, want, "the flipped page and the cut pages");
    assert_eq!(found.bad_chunks, vec![chunk_file(&config, 2)]);

    let gen = Gen::new(len, 7, "v1");
    let served = gen.served.clone();
    let store = cached(gen, &config);
    assert_bytes(&read_all(&store, MIB), &expected, "read over torn pages");
    let refetched = 4096 + 924 * 4096 + CHUNK;
    assert_eq!(
        served.load(Ordering::Relaxed),
        refetched,
        "exactly the torn pages and the foreign chunk from the network"
    );
    let found = cache.verify(None).unwrap();
    assert!(found.bad_pages.is_empty() && found.bad_chunks.is_empty());
    assert_eq!(found.good_pages, len / 4096);
}

#[test]
fn an_unsafe_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o757)).unwrap();
    let e = DiskCache::open(&DiskCacheConfig::new(&open)).unwrap_err();
    assert!(matches!(e, DiskCacheError::Unsafe { .. }), "{e}");
    assert!(e.to_string().contains("others may write"), "{e}");

    // Another user's directory: as root, one given to nobody; as another
    // user, root's /usr.
    let theirs = if running_as_root() {
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        theirs
    } else {
        PathBuf::from("/usr")
    };
    let e = DiskCache::open(&DiskCacheConfig::new(&theirs)).unwrap_err();
    assert!(matches!(e, DiskCacheError::Unsafe { .. }), "{e}");
    assert!(e.to_string().contains("owned by uid"), "{e}");

    // A new one is this user's alone.
    let new = dir.path().join("a/new/cache");
    DiskCache::open(&DiskCacheConfig::new(&new)).unwrap();
    let meta = std::fs::metadata(&new).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o700);
    let me = std::fs::metadata(dir.path()).unwrap().uid();
    assert_eq!(meta.uid(), me, "this user's, as the temporary directory is");
}

#[test]
fn the_cache_stays_under_its_maximum_and_keeps_the_recent_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let max = 12 * MIB;
    let config = DiskCacheConfig::new(dir.path().join("cache")).max_bytes(max);
    let len = 48 * MIB;
    let gen = Gen::new(len, 3, "v1");
    let expected = gen.bytes();
    let store = cached(gen, &config);
    let cache = store.cache().clone();
    let mut peak = 0;
    let mut out = vec![0u8; len as usize];
    for at in (0..len).step_by(MIB as usize) {
        store
            .read_at(at, &mut out[at as usize..(at + MIB) as usize])
            .unwrap();
        peak = peak.max(cache.disk_bytes().unwrap());
    }
    assert_bytes(&out, &expected, "read under the maximum");
    // Data under the maximum, plus each chunk file's 8 KiB of header and
    // table.
    assert!(peak <= max + 4 * 8192, "peak {peak} over {max}");
    assert!(peak >= max / 2, "peak {peak}: the cache was used");

    // The last chunks read are the ones kept.
    let gen = Gen::new(len, 3, "v1");
    let served = gen.served.clone();
    let again = cached(gen, &config);
    let mut tail = vec![0u8; (4 * MIB) as usize];
    again.read_at(len - 4 * MIB, &mut tail).unwrap();
    assert_bytes(&tail, &expected[(len - 4 * MIB) as usize..], "the tail");
    assert_eq!(served.load(Ordering::Relaxed), 0, "the tail was kept");
    let mut head = vec![0u8; MIB as usize];
    again.read_at(0, &mut head).unwrap();
    assert_eq!(served.load(Ordering::Relaxed), MIB, "the head was evicted");
}

/// A tmpfs of `bytes` mounted on a new directory, unmounted on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(bytes: u64) -> Option<SmallFs> {
        if !running_as_root() {
            missing_feature("root, to mount a small tmpfs that fills up");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={bytes},mode=0700"))
            .arg("faultmap-test")
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs");
        Some(SmallFs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_disk_falls_back_to_the_network_with_one_report() {
    let Some(fs) = SmallFs::mount(8 * MIB) else {
        return;
    };
    // Ballast leaves about 1.5 MiB: chunk files fill it up.
    std::fs::write(
        fs.path().join("ballast"),
        vec![1u8; (6 * MIB + MIB / 2) as usize],
    )
    .unwrap();
    let config = DiskCacheConfig::new(fs.path().join("cache")).min_free_bytes(0);
    let len = 16 * MIB;
    let gen = Gen::new(len, 4, "v1");
    let expected = gen.bytes();
    let served = gen.served.clone();
    let store = cached(gen, &config);
    assert_bytes(&fault_all(store.clone()), &expected, "through a full disk");
    assert_eq!(served.load(Ordering::Relaxed), len);
    let stats = store.stats();
    assert!(stats.problems >= 1, "{stats:?}");
    let first = stats.first_problem.expect("one report");
    assert!(first.contains("disk cache"), "{first}");
    assert!(first.contains(&fs.path().display().to_string()), "{first}");
    // What was kept reads right.
    let gen = Gen::new(len, 4, "v1");
    assert_bytes(&read_all(&cached(gen, &config), MIB), &expected, "again");
    let found = store.cache().verify(None).unwrap();
    assert!(found.bad_pages.is_empty(), "{:?}", found.bad_pages);
}

#[test]
fn the_cache_leaves_its_free_space_minimum_on_a_small_disk() {
    let Some(fs) = SmallFs::mount(16 * MIB) else {
        return;
    };
    let min_free = 6 * MIB;
    let config = DiskCacheConfig::new(fs.path().join("cache")).min_free_bytes(min_free);
    let len = 40 * MIB;
    let gen = Gen::new(len, 5, "v1");
    let expected = gen.bytes();
    let store = cached(gen, &config);
    let mut out = vec![0u8; len as usize];
    let mut low = u64::MAX;
    for at in (0..len).step_by(MIB as usize) {
        store
            .read_at(at, &mut out[at as usize..(at + MIB) as usize])
            .unwrap();
        low = low.min(faultmap::sys::free_bytes(fs.path()).unwrap());
    }
    assert_bytes(&out, &expected, "read on a small disk");
    // Free space stays above the minimum, but for what one write and a
    // chunk file's header and table take between two checks.
    assert!(low + MIB + 8192 >= min_free, "free space fell to {low}");
    assert!(store.stats().written_bytes > 4 * MIB, "the cache was used");
}

// ---------------------------------------------------------------------
// Many processes.
// ---------------------------------------------------------------------

/// What a child process is told, in its environment.
const DIR_ENV: &str = "FAULTMAP_TEST_DISK_DIR";
const MAX_ENV: &str = "FAULTMAP_TEST_DISK_MAX";
const SEED_ENV: &str = "FAULTMAP_TEST_DISK_SEED";

/// Starts this binary as test `name`'s child, reading through the cache
/// in `dir` (bounded by `max`, if given).
fn spawn(name: &str, dir: &Path, max: Option<u64>, seed: u64) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env(DIR_ENV, dir)
        .env(SEED_ENV, seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(max) = max {
        command.env(MAX_ENV, max.to_string());
    }
    command.spawn().expect("spawn a child")
}

/// The cache a child was told of.
fn child_config() -> DiskCacheConfig {
    let dir = std::env::var_os(DIR_ENV).expect("the cache's directory");
    let mut config = DiskCacheConfig::new(dir);
    config.max_bytes = std::env::var(MAX_ENV).ok().map(|m| m.parse().unwrap());
    config
}

fn child_seed() -> u64 {
    std::env::var(SEED_ENV).unwrap().parse().unwrap()
}

/// Waits for `child` (at most `limit`) and returns its stdout; fails the
/// test if it failed.
fn finish(child: Child, limit: Duration) -> String {
    let pid = child.id();
    let out = watchdog(limit, move || child.wait_with_output().expect("wait"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "child {pid}: {:?}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The number after `key=` in a child's output.
fn field(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {out}"))
        .parse()
        .unwrap()
}

const SHARED_LEN: u64 = 48 * MIB;

#[test]
fn processes_reading_one_object_at_once_download_it_once() {
    let name = "processes_reading_one_object_at_once_download_it_once";
    if is_child(name) {
        // A slow link, so that the readers overlap.
        let gen = Gen {
            delay: Duration::from_millis(4),
            ..Gen::new(SHARED_LEN, child_seed(), "v1")
        };
        let expected = gen.bytes();
        let store = cached(gen, &child_config());
        let bytes = fault_all(store.clone());
        let right = bytes == expected;
        let s = store.stats();
        println!(
            "right={} network={} disk={} waits={}",
            u8::from(right),
            s.network_bytes,
            s.disk_bytes,
            s.waits
        );
        assert!(right, "wrong bytes");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let children: Vec<Child> = (0..3).map(|_| spawn(name, &cache, None, 11)).collect();
    let outs: Vec<String> = children
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(120)))
        .collect();
    let network: u64 = outs.iter().map(|o| field(o, "network")).sum();
    let disk: u64 = outs.iter().map(|o| field(o, "disk")).sum();
    assert_eq!(
        network, SHARED_LEN,
        "each page downloaded once over all processes: {outs:?}"
    );
    assert_eq!(network + disk, 3 * SHARED_LEN, "{outs:?}");
    let found = DiskCache::open(&DiskCacheConfig::new(&cache))
        .unwrap()
        .verify(None)
        .unwrap();
    assert!(found.bad_pages.is_empty() && found.bad_chunks.is_empty());
    assert_eq!(found.good_pages, SHARED_LEN / 4096);
}

#[test]
fn processes_killed_at_random_points_leave_no_wrong_bytes_and_no_locks() {
    let name = "processes_killed_at_random_points_leave_no_wrong_bytes_and_no_locks";
    if is_child(name) {
        // Random reads, by the fault path and by read_at, every byte
        // checked, until killed; eviction runs all along (the maximum is
        // a third of the object).
        let seed = child_seed();
        let gen = Gen {
            delay: Duration::from_millis(1),
            ..Gen::new(SHARED_LEN, 21, "v1")
        };
        let expected = gen.bytes();
        let store = cached(gen, &child_config());
        let pager = Pager::new(Config::default()).expect("pager");
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            let at = next() % (SHARED_LEN / 4096) * 4096;
            let len = (1 + next() % 600) * 4096;
            let len = len.min(SHARED_LEN - at);
            let got = if next() % 2 == 0 {
                let mut buf = vec![0u8; len as usize];
                store.read_at(at, &mut buf).expect("read_at");
                buf
            } else {
                let map = pager
                    .map_trusted(store.clone(), MapOptions::new().offset(at).len(len))
                    .expect("map");
                map.to_vec()
            };
            assert!(
                got == expected[at as usize..(at + len) as usize],
                "wrong bytes at {at}+{len}"
            );
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let max = Some(SHARED_LEN / 3);
    let mut seed = 1u64;
    let mut children: Vec<Child> = (0..3)
        .map(|_| {
            seed += 1;
            spawn(name, &cache, max, seed)
        })
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for _ in 0..16 {
        std::thread::sleep(Duration::from_millis(50 + rand(400)));
        for child in &mut children {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("a reader ended on its own: {status:?}");
            }
        }
        let victim = rand(children.len() as u64) as usize;
        children[victim].kill().unwrap();
        children[victim].wait().unwrap();
        seed += 1;
        children[victim] = spawn(name, &cache, max, seed);
    }
    for child in &mut children {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("a reader ended on its own: {status:?}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // No page fails its checksum (a kill can cut a write, which leaves the
    // page absent, never bad), and no lock is left: a reader claims every
    // page again, at once.
    let config = DiskCacheConfig::new(&cache);
    let found = DiskCache::open(&config).unwrap().verify(None).unwrap();
    assert!(found.bad_pages.is_empty(), "{:?}", found.bad_pages);
    assert!(found.bad_chunks.is_empty(), "{:?}", found.bad_chunks);
    let gen = Gen::new(SHARED_LEN, 21, "v1");
    let expected = gen.bytes();
    let cache = DiskCache::open(&config).unwrap();
    let store = match CachedStore::new(gen, cache, Duration::ZERO).unwrap() {
        Ok(store) => store,
        Err(_) => panic!("cached"),
    };
    assert_bytes(&read_all(&store, 8 * MIB), &expected, "after the kills");
    assert_eq!(store.stats().waits, 0, "a lock was left behind");
}
