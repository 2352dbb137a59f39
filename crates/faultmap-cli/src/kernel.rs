//! The kernel's own I/O state, read and written with plain file I/O:
//! dropping its page cache, and a block device's read counters.
//!
//! # Dropping the page cache
//!
//! Writing `1` to `/proc/sys/vm/drop_caches` drops the clean pages of the
//! page cache; `3` also drops the dentry and inode caches. Only root may
//! write it (the file is mode 0200). Dirty pages are not dropped: the
//! benchmark's generated file is synced when written, so all of it goes.
//! [`CacheDropper::probe`] tries once, so a command can say up front that it
//! cannot make the kernel cold, and go on without.
//!
//! # Block-device counters
//!
//! A file lives on the device `st_dev` names; `/sys/dev/block/MAJ:MIN/stat`
//! holds that device's (or partition's) counters since boot:
//!
//! ```text
//!   reads  merged  sectors  ticks   writes ...      (sectors of 512 bytes)
//!   236218  26340  9545346  407687  20587  ...
//!   ^^^^^^         ^^^^^^^
//!   requests completed, sectors read
//! ```
//!
//! The difference over a run is what the whole machine read from that disk
//! in that time: the run's reads, plus any other process's. A file on a
//! filesystem without a block device (tmpfs, overlay on tmpfs) has no such
//! counters: [`BlockDevice::of_file`] answers `None`.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The kernel's switch that drops its caches.
pub const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Bytes per sector in `/sys/block/*/stat`, whatever the device's own.
const SECTOR: u64 = 512;

/// What to drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caches {
    /// Clean page-cache pages (`echo 1`).
    PageCache,
    /// Page cache, dentries and inodes (`echo 3`).
    All,
}

impl Caches {
    /// The value written to `drop_caches`.
    fn value(self) -> &'static [u8] {
        match self {
            Caches::PageCache => b"1\n",
            Caches::All => b"3\n",
        }
    }

    /// The command a user would type, for reports.
    pub fn command(self) -> String {
        let n = match self {
            Caches::PageCache => 1,
            Caches::All => 3,
        };
        format!("echo {n} > {DROP_CACHES}")
    }
}

/// Drops the kernel's caches through a `drop_caches` file known to work.
#[derive(Clone, Debug)]
pub struct CacheDropper {
    path: PathBuf,
    what: Caches,
}

impl CacheDropper {
    /// Drops `what` once through `path` (normally [`DROP_CACHES`]); on
    /// success returns a dropper for the next times, else the error, whose
    /// message names the file.
    pub fn probe(path: impl Into<PathBuf>, what: Caches) -> io::Result<CacheDropper> {
        let dropper = CacheDropper {
            path: path.into(),
            what,
        };
        dropper.drop_caches()?;
        Ok(dropper)
    }

    /// Drops the caches.
    pub fn drop_caches(&self) -> io::Result<()> {
        OpenOptions::new()
            .write(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(self.what.value()))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))
    }

    /// What it drops.
    pub fn what(&self) -> Caches {
        self.what
    }
}

/// The block device (or partition) a file lives on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    /// Its kernel name (`vda`, `nvme0n1p2`).
    pub name: String,
    /// `MAJ:MIN`.
    pub number: String,
    /// Its `/sys/dev/block/MAJ:MIN` directory.
    dir: PathBuf,
}

/// A block device's read counters at one moment, or their change over a
/// run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockReads {
    /// Read requests completed.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
}

impl BlockReads {
    /// The counts from `earlier` to `self`.
    pub fn since(self, earlier: BlockReads) -> BlockReads {
        BlockReads {
            reads: self.reads.saturating_sub(earlier.reads),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

impl BlockDevice {
    /// The device `path` lives on, if it has block-device counters.
    pub fn of_file(path: &Path) -> Option<BlockDevice> {
        let dev = std::fs::metadata(path).ok()?.dev();
        let number = format!("{}:{}", dev_major(dev), dev_minor(dev));
        let dir = Path::new("/sys/dev/block").join(&number);
        let name = std::fs::canonicalize(&dir)
            .ok()?
            .file_name()?
            .to_string_lossy()
            .into_owned();
        let device = BlockDevice { name, number, dir };
        device.reads().map(|_| device)
    }

    /// The `stat` file the counters come from.
    pub fn stat_path(&self) -> PathBuf {
        self.dir.join("stat")
    }

    /// The counters now.
    pub fn reads(&self) -> Option<BlockReads> {
        parse_stat(&std::fs::read_to_string(self.stat_path()).ok()?)
    }

    /// The device's `read_ahead_kb` (a partition's is its disk's).
    pub fn read_ahead_kb(&self) -> Option<u64> {
        let read = |dir: &Path| {
            std::fs::read_to_string(dir.join("queue/read_ahead_kb"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        read(&self.dir).or_else(|| read(&self.dir.join("..")))
    }
}

/// Reads completed and bytes read, from the text of a block `stat` file.
fn parse_stat(text: &str) -> Option<BlockReads> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    let reads = fields.next()?.ok()?;
    let sectors = fields.nth(1)?.ok()?;
    Some(BlockReads {
        reads,
        bytes: sectors.saturating_mul(SECTOR),
    })
}

/// The major number of a Linux `dev_t` (glibc's `gnu_dev_major`).
fn dev_major(dev: u64) -> u64 {
    ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)
}

/// The minor number of a Linux `dev_t` (glibc's `gnu_dev_minor`).
fn dev_minor(dev: u64) -> u64 {
    (dev & 0xff) | ((dev >> 12) & !0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_device_numbers() {
        assert_eq!((dev_major(0xfe00), dev_minor(0xfe00)), (254, 0));
        assert_eq!((dev_major(0x0803), dev_minor(0x0803)), (8, 3));
        // A large minor spills into the high bits.
        let dev = (259 << 8) | (0x12345 & 0xff) | ((0x12345 & !0xff) << 12);
        assert_eq!((dev_major(dev), dev_minor(dev)), (259, 0x12345));
    }

    #[test]
    fn parses_block_stat() {
        let text = "  236218    26340  9545346   407687    20587    41257 23189840\n";
        assert_eq!(
            parse_stat(text),
            Some(BlockReads {
                reads: 236_218,
                bytes: 9_545_346 * 512
            })
        );
        assert_eq!(parse_stat("1 2"), None);
        assert_eq!(parse_stat("x 2 3"), None);
        let later = BlockReads {
            reads: 10,
            bytes: 4096,
        };
        let earlier = BlockReads { reads: 4, bytes: 0 };
        assert_eq!(
            later.since(earlier),
            BlockReads {
                reads: 6,
                bytes: 4096
            }
        );
    }

    #[test]
    fn a_dropper_that_cannot_write_says_which_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/file");
        let err = CacheDropper::probe(&missing, Caches::PageCache).unwrap_err();
        assert!(err.to_string().contains("no/such/file"), "{err}");
    }

    #[test]
    fn a_dropper_writes_its_value() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("drop_caches");
        std::fs::write(&file, "").unwrap();
        let d = CacheDropper::probe(&file, Caches::All).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "3\n");
        assert_eq!(d.what(), Caches::All);
        assert_eq!(
            Caches::PageCache.command(),
            format!("echo 1 > {DROP_CACHES}")
        );
    }

    #[test]
    fn a_tmpfs_or_missing_file_has_no_device_or_its_counters_read() {
        assert_eq!(BlockDevice::of_file(Path::new("/nonexistent/x")), None);
        if let Some(d) = BlockDevice::of_file(Path::new("/")) {
            assert!(d.reads().is_some());
            assert!(d.number.contains(':'));
        }
    }
}
