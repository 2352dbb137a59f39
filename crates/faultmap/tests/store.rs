//! `FileStore` on real files, in each I/O mode: exact bytes for aligned
//! ranges of many sizes, the last partial page, tiny and multi-chunk reads,
//! concurrent readers, ranges outside the file, a file that shrank, the
//! fallback on a filesystem without O_DIRECT, and `ra_pages` from sysfs.
//!
//! The O_DIRECT modes need a directory whose filesystem takes O_DIRECT:
//! the system's temporary directory if it does, else Cargo's target
//! temporary directory. With neither, the modes fall back to buffered reads:
//! the byte checks still run, and the tests that are about O_DIRECT itself
//! say that they skip.

mod common;
use common::MapTrusted;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;
use faultmap::{Config, FileStore, MapOptions, Pager, Store, StoreError};

/// The modes, by name (`FileIo` values are built by parsing, as a command
/// line would).
const MODES: [&str; 3] = ["buffered", "direct", "uring"];

/// 9 MiB + 123 B: several io_uring chunks and a partial last page.
const BIG: usize = (9 << 20) + 123;

fn open(path: &Path, mode: &str) -> FileStore {
    FileStore::open_with(path, mode.parse().expect("mode name")).expect("open")
}

/// Whether a file in `dir` can be read with O_DIRECT.
fn takes_o_direct(dir: &Path) -> bool {
    let Ok(probe) = tempfile::tempdir_in(dir) else {
        return false;
    };
    let path = probe.path().join("probe");
    if std::fs::write(&path, vec![7u8; PAGE]).is_err() {
        return false;
    }
    FileStore::open_with(&path, "direct".parse().expect("mode name"))
        .is_ok_and(|store| store.io().to_string() == "direct")
}

/// A directory on a filesystem that takes O_DIRECT, if there is one.
fn direct_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        [
            std::env::temp_dir(),
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        ]
        .into_iter()
        .find(|dir| takes_o_direct(dir))
    })
    .as_deref()
}

/// A file of `len` pattern bytes, in the O_DIRECT directory if any.
struct File {
    _dir: tempfile::TempDir,
    path: PathBuf,
    data: Vec<u8>,
}

impl File {
    fn new(len: usize, seed: u64) -> Self {
        let dir = match direct_dir() {
            Some(base) => tempfile::tempdir_in(base),
            None => tempfile::tempdir(),
        }
        .expect("tempdir");
        let path = dir.path().join(format!("store-{len}-{seed}.bin"));
        let data = pattern(len, seed);
        std::fs::write(&path, &data).expect("write test file");
        Self {
            _dir: dir,
            path,
            data,
        }
    }

    /// Opens the file in `mode`, checking that the mode is in force where
    /// the directory takes O_DIRECT.
    fn open(&self, mode: &str) -> FileStore {
        let store = open(&self.path, mode);
        if direct_dir().is_some() {
            assert_eq!(store.io().to_string(), mode, "{}", self.path.display());
        }
        store
    }
}

/// `len` bytes of page-aligned memory (as the fault path's alias mapping
/// is), followed by a page of canary bytes that no read may touch.
struct Aligned {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

const CANARY: u8 = 0xa5;

impl Aligned {
    fn new(len: usize) -> Self {
        let raw = vec![CANARY; len + 2 * PAGE];
        let start = raw.as_ptr().align_offset(PAGE);
        Self { raw, start, len }
    }

    fn buf(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    fn canary_intact(&self) -> bool {
        let end = self.start + self.len;
        self.raw[end..end + PAGE].iter().all(|&b| b == CANARY)
    }
}

/// Reads `[offset, offset + len)` into aligned memory and checks the bytes
/// and the canary after them.
fn check_read(store: &FileStore, data: &[u8], offset: usize, len: usize, what: &str) {
    let mut mem = Aligned::new(len);
    store
        .read_at(offset as u64, mem.buf())
        .unwrap_or_else(|e| panic!("{what}: read {len} at {offset}: {e}"));
    assert_bytes(mem.buf(), &data[offset..offset + len], what);
    assert!(mem.canary_intact(), "{what}: wrote past the buffer");
}

#[test]
fn every_mode_reads_aligned_ranges_of_many_sizes() {
    watchdog(WATCHDOG, || {
        let file = File::new(BIG, 1);
        let sizes = [
            PAGE,
            2 * PAGE,
            3 * PAGE,
            16 * PAGE,
            64 * PAGE,
            65 * PAGE,
            256 * PAGE,
            257 * PAGE,
            1024 * PAGE,
            2048 * PAGE,
        ];
        let offsets = [0, PAGE, 63 * PAGE, 255 * PAGE, 1 << 20, 5 << 20];
        for mode in MODES {
            let store = file.open(mode);
            for len in sizes {
                for offset in offsets.into_iter().filter(|o| o + len <= BIG) {
                    check_read(&store, &file.data, offset, len, mode);
                }
            }
        }
    });
}

#[test]
fn every_mode_reads_the_last_partial_page() {
    watchdog(WATCHDOG, || {
        for (i, len) in [PAGE + 1, 3 * PAGE + 123, BIG, 5 * PAGE - 1]
            .into_iter()
            .enumerate()
        {
            let file = File::new(len, 10 + i as u64);
            let last = len / PAGE * PAGE;
            for mode in MODES {
                let store = file.open(mode);
                let what = format!("{mode}, file of {len}");
                // The partial page alone, then with whole pages before it.
                check_read(&store, &file.data, last, len - last, &what);
                check_read(&store, &file.data, last - PAGE, len - last + PAGE, &what);
                check_read(&store, &file.data, 0, len, &what);
            }
        }
    });
}

#[test]
fn every_mode_reads_a_one_byte_file() {
    watchdog(WATCHDOG, || {
        let file = File::new(1, 20);
        for mode in MODES {
            let store = file.open(mode);
            assert_eq!(store.len(), 1);
            check_read(&store, &file.data, 0, 1, mode);
            assert!(matches!(
                store.read_at(0, &mut [0u8; 2]),
                Err(StoreError::OutOfRange { .. })
            ));
        }
    });
}

#[test]
fn every_mode_opens_an_empty_file() {
    watchdog(WATCHDOG, || {
        let file = File::new(0, 21);
        for mode in MODES {
            let store = open(&file.path, mode);
            assert_eq!(store.len(), 0);
            store.read_at(0, &mut []).expect("an empty read");
            assert!(matches!(
                store.read_at(0, &mut [0u8; 1]),
                Err(StoreError::OutOfRange { .. })
            ));
        }
    });
}

#[test]
fn every_mode_reads_a_large_file_in_one_call() {
    watchdog(WATCHDOG, || {
        let file = File::new(BIG, 30);
        for mode in MODES {
            let store = file.open(mode);
            check_read(&store, &file.data, 0, BIG, mode);
            check_read(&store, &file.data, PAGE, BIG - PAGE, mode);
        }
    });
}

#[test]
fn unaligned_requests_are_served_too() {
    watchdog(WATCHDOG, || {
        let file = File::new(BIG, 40);
        for mode in MODES {
            let store = file.open(mode);
            // An unaligned offset, and an aligned offset into unaligned memory.
            let mut buf = vec![0u8; 10_000];
            store.read_at(12_345, &mut buf).expect("unaligned offset");
            assert_bytes(&buf, &file.data[12_345..22_345], mode);
            let mut mem = Aligned::new(2 * PAGE + 1);
            let skewed = &mut mem.buf()[1..];
            store
                .read_at(PAGE as u64, skewed)
                .expect("unaligned memory");
            assert_bytes(skewed, &file.data[PAGE..3 * PAGE], mode);
        }
    });
}

#[test]
fn every_mode_fills_a_pagers_mapping() {
    // The real destination: the cache's memfd alias, filled by the I/O
    // threads (O_DIRECT into shmem pages).
    watchdog(WATCHDOG, || {
        let file = File::new(BIG, 45);
        let pager = Pager::new(Config::default()).expect("Pager::new");
        for mode in MODES {
            let map = pager
                .map_trusted(file.open(mode), MapOptions::new().fault_around_order(4))
                .expect("map");
            assert_bytes(&map, &file.data, mode);
            assert!(read_tail(&map).iter().all(|&b| b == 0), "{mode}: tail");
        }
    });
}

#[test]
fn every_mode_serves_four_concurrent_readers() {
    watchdog(WATCHDOG, || {
        let file = File::new(BIG, 50);
        for mode in MODES {
            let store = file.open(mode);
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let (store, data) = (&store, &file.data);
                    s.spawn(move || {
                        let mut rng = 0x9e37_79b9 ^ t;
                        for _ in 0..40 {
                            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                            let pages = BIG.div_ceil(PAGE);
                            let first = (rng >> 33) as usize % pages;
                            let count = 1 + (rng >> 20) as usize % 600;
                            let offset = first * PAGE;
                            let len = (count * PAGE).min(BIG - offset);
                            check_read(store, data, offset, len, &format!("{mode} thread {t}"));
                        }
                    });
                }
            });
        }
    });
}

#[test]
fn reads_outside_the_file_are_out_of_range() {
    watchdog(WATCHDOG, || {
        let file = File::new(3 * PAGE + 5, 60);
        for mode in MODES {
            let store = file.open(mode);
            let mut mem = Aligned::new(PAGE);
            let len = store.len();
            for (offset, n) in [
                (len, 1),
                (3 * PAGE as u64, 6),
                (0, PAGE * 4),
                (u64::MAX - 1, 2),
            ] {
                let mut big = Aligned::new(n);
                assert!(
                    matches!(
                        store.read_at(offset, big.buf()),
                        Err(StoreError::OutOfRange { .. })
                    ),
                    "{mode}: {n} at {offset}"
                );
            }
            assert!(matches!(
                store.read_at(4 * PAGE as u64, mem.buf()),
                Err(StoreError::OutOfRange { .. })
            ));
        }
    });
}

#[test]
fn a_file_that_shrank_is_a_read_error_not_stale_bytes() {
    watchdog(WATCHDOG, || {
        for mode in MODES {
            let file = File::new(BIG, 70);
            let store = file.open(mode);
            let shrunk = std::fs::OpenOptions::new()
                .write(true)
                .open(&file.path)
                .expect("reopen");
            shrunk.set_len((2 << 20) + 100).expect("truncate");
            let mut mem = Aligned::new(4 << 20);
            match store.read_at(0, mem.buf()) {
                Err(StoreError::Short {
                    offset: 0,
                    expected,
                    got,
                    ..
                }) => assert_eq!((expected, got), (4 << 20, (2 << 20) + 100)),
                other => panic!("{mode}: expected a short read error, got {other:?}"),
            }
            // What is still there reads fine, and the store is still usable.
            check_read(&store, &file.data, 0, 2 << 20, mode);
        }
    });
}

#[test]
fn a_filesystem_without_o_direct_falls_back_to_buffered() {
    // sysfs refuses O_DIRECT at open; its binary attributes have real sizes.
    let path = Path::new("/sys/kernel/notes");
    let Ok(data) = std::fs::read(path) else {
        missing_feature(&format!("{} is not readable here", path.display()));
        return;
    };
    for mode in MODES {
        let store = open(path, mode);
        assert_eq!(store.io().to_string(), "buffered", "{mode}");
        let mut mem = Aligned::new(data.len());
        store.read_at(0, mem.buf()).expect("buffered read");
        assert_bytes(mem.buf(), &data, mode);
    }
}

#[test]
fn o_direct_is_used_where_the_filesystem_takes_it() {
    let Some(dir) = direct_dir() else {
        missing_feature("neither the temporary directory nor target/ takes O_DIRECT");
        return;
    };
    let file = File::new(PAGE, 80);
    assert!(file.path.starts_with(dir));
    for mode in MODES {
        assert_eq!(open(&file.path, mode).io().to_string(), mode);
    }
}

#[test]
fn ra_pages_is_the_devices_read_ahead_kb() {
    let file = File::new(PAGE, 90);
    let dev = std::fs::metadata(&file.path).expect("stat").dev();
    let id = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let sysfs = Path::new("/sys/dev/block").join(&id);
    let kb = ["queue/read_ahead_kb", "../queue/read_ahead_kb"]
        .iter()
        .find_map(|rel| std::fs::read_to_string(sysfs.join(rel)).ok());
    let Some(kb) = kb else {
        missing_feature(&format!(
            "{} is on no block device ({id})",
            file.path.display()
        ));
        return;
    };
    let kb: u64 = kb.trim().parse().expect("read_ahead_kb is a number");
    for mode in MODES {
        assert_eq!(open(&file.path, mode).ra_pages(), kb / 4, "{mode}");
    }
}

#[test]
fn ra_pages_falls_back_off_block_devices() {
    // tmpfs has no block device and no bdi of its own in sysfs.
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        missing_feature("no /dev/shm");
        return;
    };
    let path = dir.path().join("f");
    std::fs::write(&path, [1u8; 10]).expect("write");
    assert_eq!(open(&path, "buffered").ra_pages(), 32);
}

#[test]
fn direct_read_rate_reads_the_whole_file() {
    watchdog(WATCHDOG, || {
        let file = File::new(BIG, 100);
        for chunk in [1, PAGE, 256 << 10, 1 << 20, 8 << 20] {
            let (bytes, secs) =
                FileStore::direct_read_rate(&file.path, chunk).expect("direct_read_rate");
            assert_eq!(bytes, BIG as u64, "chunk {chunk}");
            assert!(secs >= 0.0);
        }
        let empty = File::new(0, 101);
        assert_eq!(
            FileStore::direct_read_rate(&empty.path, 1 << 20)
                .expect("empty")
                .0,
            0
        );
        assert!(matches!(
            FileStore::direct_read_rate(&file.path.with_extension("missing"), 1 << 20),
            Err(StoreError::Open { .. })
        ));
    });
}

#[test]
fn files_whose_size_is_not_their_content_are_refused() {
    for path in ["/proc/cpuinfo", "/proc/self/maps"] {
        match FileStore::open(path) {
            Err(StoreError::PseudoFile { fs, .. }) => assert_eq!(fs, "procfs", "{path}"),
            other => panic!("{path}: {other:?}"),
        }
    }
    // A sysfs text attribute reports 4096 bytes and holds a few.
    let path = "/sys/kernel/mm/transparent_hugepage/enabled";
    match FileStore::open(path) {
        Err(StoreError::UnknownSize { reported, .. }) => assert_eq!(reported, 4096),
        other => panic!("{path}: {other:?}"),
    }
}

#[test]
fn what_is_not_a_regular_file_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let socket = dir.path().join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    for (path, kind) in [
        (fifo.as_path(), "FIFO"),
        (socket.as_path(), "socket"),
        (Path::new("/dev/null"), "device"),
        (dir.path(), "directory"),
    ] {
        match FileStore::open(path) {
            Err(StoreError::NotAFile { kind: found, .. }) => assert_eq!(found, kind, "{path:?}"),
            other => panic!("{path:?}: {other:?}"),
        }
    }
    assert!(matches!(
        FileStore::open(dir.path().join("missing")),
        Err(StoreError::Open { .. })
    ));
}
