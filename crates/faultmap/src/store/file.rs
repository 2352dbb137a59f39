//! A local file as a store: [`FileStore`].
//!
//! # Local files: three ways to read
//!
//! A [`FileStore`] reads in the mode ([`FileIo`]) given at open
//! ([`FileStore::open_with`]; [`FileStore::open`] takes the default):
//!
//! - **`Buffered`**: `pread` through the kernel's page cache, then a copy
//!   into the caller's buffer. The kernel's own readahead (the file's
//!   `read_ahead_kb`) runs under faultmap's, in large folios, so the device
//!   sees large requests; the pages stay cached twice (the kernel's copy and
//!   faultmap's) until the kernel reclaims its own.
//! - **`Direct`**: `pread` on a second descriptor opened with `O_DIRECT`: the
//!   device writes straight into the caller's pages, nothing is copied or
//!   cached twice. One call is one `pread`; the block layer cuts it into
//!   requests of at most `max_segments` pages.
//! - **`Uring`**: the same `O_DIRECT` reads through the calling thread's
//!   io_uring, cut into [`URING_CHUNK`] pieces that are all in flight
//!   together (`sys::uring`: short reads resubmitted, `EINTR`/`EAGAIN`
//!   retried, every read reaped before the call returns, even on error).
//!
//! ```text
//!   read_at(offset, buf)       offset and buf page-aligned (the fault path's)
//!   |<------------------ body: whole pages ------------------>|<-tail->|
//!   | 256 KiB | 256 KiB | 256 KiB | ...                        | bounce |  Uring: all in flight
//!   |<--------------------- one O_DIRECT pread --------------->| bounce |  Direct
//!                                         the file's last partial page: a
//!                   whole page read into a bounce page (short at the end of
//!                      the file) and copied, so the device never writes past
//!                                                                   `buf`.
//! ```
//!
//! A request whose offset or memory is not page-aligned is read buffered in
//! every mode: `O_DIRECT` needs both aligned (to the logical block; a page
//! covers every device with blocks up to 4 KiB), and the fault path always
//! aligns them. A short read is resubmitted; 0 bytes before the length seen
//! at open (the file shrank) is a [`StoreError::Short`], never stale
//! bytes.
//!
//! Fallbacks are decided once, at open, and [`FileStore::io`] tells the mode
//! in force: a filesystem that refuses `O_DIRECT` (`EINVAL` at open: procfs,
//! sysfs, some FUSE), or whose `statx` `STATX_DIOALIGN` asks for more than a
//! page, or that does not say and fails a probe read of the first page,
//! reads `Buffered`; a kernel without io_uring (or a thread that cannot get
//! a ring) reads `Direct`.
//!
//! # The measured choice: `Buffered`, requests of 1 MiB
//!
//! Cold reads of a 1 GiB file on the project's machine (2 vCPUs, shared;
//! ext4 on virtio-blk, `read_ahead_kb` 8192, `max_sectors_kb` 4096,
//! `max_segments` 254), page cache dropped before each cell, reads landing
//! in a fresh memfd mapping as the cache's alias
//! (`examples/io_modes.rs`). GB/s, medians of 5 runs on a quieter machine
//! (load 1.0-2.7) / 7 runs on a busier one (load 2.7-3.4):
//!
//! | request, threads | Buffered    | Direct      | Uring       |
//! |------------------|-------------|-------------|-------------|
//! | 256 KiB, 1       | 0.42 / 0.42 | 0.74 / 0.69 | 0.72 / 0.64 |
//! | 256 KiB, 4       | 2.50 / 2.28 | 1.23 / 1.23 | 1.39 / 1.13 |
//! | 1 MiB, 1         | 1.40 / 1.37 | 0.89 / 0.82 | 0.89 / 0.82 |
//! | 1 MiB, 4         | 2.26 / 1.51 | 1.63 / 1.47 | 1.43 / 1.54 |
//! | 8 MiB, 1         | 1.36 / 1.24 | 0.97 / 0.88 | 0.96 / 1.16 |
//! | 8 MiB, 4         | 1.54 / 1.37 | 1.49 / 1.44 | 1.56 / 1.45 |
//! | random 4 KiB, 1  | 16.9 / 15.2 | 14.0 / 15.9 | 15.4 / 14.8 | (K reads/s)
//! | random 4 KiB, 4  | 36.5 / 37.4 | 37.8 / 38.2 | 37.3 / 36.0 | (K reads/s)
//!
//! [`FileStore::direct_read_rate`] (O_DIRECT, 32 MiB in flight) measured
//! 1.19-1.35 / 1.08-1.15 GB/s in the same runs. Why the page cache wins
//! here: the disk's counters (`/sys/block/vda/stat`) show buffered 1 MiB
//! reads reaching the device as 4 MiB requests (readahead in large folios),
//! while `O_DIRECT` into 4 KiB pages is cut at 254 segments: 8 MiB reads
//! arrived as 585 KiB requests on average (1 MiB bios split 1016 + 8 KiB).
//! This virtio disk costs about 0.4 ms per request plus 0.37 ms per MiB, so
//! fewer, larger requests win, the more so when the guest is busy. On a
//! quiet machine (load about 1) fio's `O_DIRECT` 1 MiB reads at queue depth
//! 8 or more reached 2.0-2.5 GB/s, the platform's reference figure, but the
//! interleaved runs above never saw `Buffered` lose a 4-thread sequential
//! cell by more than noise, and random reads cost the same in every mode.
//! So the default is `Buffered`, at the price of the page cache's second
//! copy; `Direct`/`Uring` remain for memory-tight uses and faster devices.
//! Requests of 1 MiB ([`Store::io_pages`] = 256) are the one size that is
//! good from 1 thread and from 4 (256 KiB is best from 4 threads, worst
//! from 1). io_uring's chunk size (256 KiB, 1016 KiB, 1 MiB, 4 MiB) made
//! no difference beyond noise.
//!
//! Not here, measured slower (`measurements/part5-experiments-2026-11-27.txt`):
//! uncached buffered reads (`preadv2` with `RWF_DONTCACHE`, Linux 6.14),
//! which would keep the kernel's readahead without its second copy, lost
//! to both `Buffered` and `Direct` at 1, 4 and 8 MiB requests; and
//! `splice` from the file into the cache's memfd (no alias faults, no
//! zeroing) serialises the I/O threads on the memfd's inode lock.
//!
//! # `ra_pages`
//!
//! As the kernel's `bdi->ra_pages`: the file's `st_dev`, then sysfs
//! `/sys/dev/block/MAJ:MIN/queue/read_ahead_kb` (a disk), or the same under
//! `..` (a partition), or `/sys/class/bdi/MAJ:MIN/read_ahead_kb` (NFS and
//! other filesystems with a backing device of their own), divided by 4;
//! [`crate::policy::readahead::DEFAULT_RA_PAGES`] (32) when none says (tmpfs,
//! overlay). Read once at open.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::str::FromStr;
use std::time::Instant;

use crate::sys::{self, uring, uring::UringError, PAGE_SIZE};

use super::{check_range, Store, StoreError};

/// How a [`FileStore`] reads. See the module doc for the measurements
/// behind the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FileIo {
    /// `pread` through the kernel's page cache: one copy, and the pages stay
    /// cached twice (the kernel's and faultmap's). The default: the fastest
    /// on the project's machine (module doc).
    #[default]
    Buffered,
    /// `pread` on a second descriptor opened with `O_DIRECT`: the device
    /// writes straight into the caller's buffer, one request per call.
    Direct,
    /// `O_DIRECT` through io_uring: a read is cut into chunks of 256 KiB
    /// that are all in flight at once.
    Uring,
}

impl FileIo {
    /// The mode's name, as [`FromStr`] parses it.
    pub fn as_str(self) -> &'static str {
        match self {
            FileIo::Buffered => "buffered",
            FileIo::Direct => "direct",
            FileIo::Uring => "uring",
        }
    }
}

impl fmt::Display for FileIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a [`FileIo`] mode.
#[derive(Debug, thiserror::Error)]
#[error("unknown I/O mode {0:?}: expected buffered, direct or uring")]
pub struct ParseFileIoError(String);

impl FromStr for FileIo {
    type Err = ParseFileIoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "buffered" => Ok(FileIo::Buffered),
            "direct" => Ok(FileIo::Direct),
            "uring" => Ok(FileIo::Uring),
            _ => Err(ParseFileIoError(s.to_string())),
        }
    }
}

/// O_DIRECT alignment the store keeps to: offsets, lengths and buffer
/// addresses on page boundaries satisfy any device with logical blocks of
/// at most a page. Files that need more are read buffered.
const DIO_ALIGN: usize = PAGE_SIZE;

/// The size of the chunks a [`FileIo::Uring`] read is cut into: a 1 MiB
/// request ([`FILE_IO_PAGES`]) is 4 reads in flight. Larger chunks measured
/// the same (module doc).
const URING_CHUNK: usize = 256 << 10;

/// The most chunks of one read in flight at once.
const URING_DEPTH: usize = uring::RING_ENTRIES as usize;

/// [`FileStore::direct_read_rate`] keeps about this many bytes in flight.
const RATE_IN_FLIGHT_BYTES: usize = 32 << 20;

/// [`Store::io_pages`] of a [`FileStore`]: 1 MiB, the request size that
/// measured well from 1 and from 4 threads (module doc).
const FILE_IO_PAGES: u64 = 256;

/// A local regular file, read with `pread` or `O_DIRECT` ([`FileIo`]).
pub struct FileStore {
    /// Opened without O_DIRECT: buffered reads, and the fallback for
    /// requests that are not page-aligned.
    file: File,
    /// The same file with O_DIRECT, when the mode is Direct or Uring and the
    /// filesystem takes it.
    direct: Option<File>,
    /// The mode in force (the one asked for, or what it fell back to).
    io: FileIo,
    len: u64,
    ra_pages: u64,
    name: String,
    /// Opened read-write ([`FileStore::open_rw`]).
    writable: bool,
    /// The modification time at open ([`Store::version`]).
    mtime: (i64, i64),
    /// The file's device and inode, and its change time
    /// ([`Store::share_key`]).
    id: (u64, u64),
    ctime: (i64, i64),
}

impl fmt::Debug for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStore")
            .field("name", &self.name)
            .field("len", &self.len)
            .field("io", &self.io)
            .field("ra_pages", &self.ra_pages)
            .finish()
    }
}

impl FileStore {
    /// Opens a regular file read-only, in the default mode
    /// ([`FileIo::default`]). Directories, FIFOs, sockets and devices are
    /// refused with [`StoreError::NotAFile`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, FileIo::default())
    }

    /// Opens a regular file read-only, reading it in mode `io`. A mode the
    /// file or the kernel cannot do falls back, once, here: `Uring` to
    /// `Direct` without io_uring, `Direct` to `Buffered` on a filesystem
    /// that refuses `O_DIRECT` (procfs, sysfs, FUSE without direct I/O) or
    /// needs alignment beyond a page. [`FileStore::io`] says which mode is
    /// in force.
    pub fn open_with(path: impl AsRef<Path>, io: FileIo) -> Result<Self, StoreError> {
        Self::open_mode(path.as_ref(), io, false)
    }

    /// Opens a regular file read-write, in the default mode: it can be
    /// mapped writable ([`crate::Pager::map_mut`]). Writes go through
    /// `pwrite` on the buffered descriptor, [`Store::sync`] is `fdatasync`.
    pub fn open_rw(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_rw_with(path, FileIo::default())
    }

    /// [`FileStore::open_rw`], reading in mode `io` (writes are buffered in
    /// every mode; the kernel keeps `O_DIRECT` reads coherent with them).
    pub fn open_rw_with(path: impl AsRef<Path>, io: FileIo) -> Result<Self, StoreError> {
        Self::open_mode(path.as_ref(), io, true)
    }

    fn open_mode(path: &Path, io: FileIo, writable: bool) -> Result<Self, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        // 1. Look before opening: opening a FIFO for reading would block.
        let meta = std::fs::metadata(path).map_err(open_err)?;
        let kind = meta.file_type();
        let not_a_file = |kind| StoreError::NotAFile {
            path: path.to_path_buf(),
            kind,
        };
        if kind.is_dir() {
            return Err(not_a_file("directory"));
        }
        if kind.is_fifo() {
            return Err(not_a_file("FIFO"));
        }
        if kind.is_socket() {
            return Err(not_a_file("socket"));
        }
        if kind.is_block_device() || kind.is_char_device() {
            return Err(not_a_file("device"));
        }
        // 2. The buffered descriptor, and what it is. O_NONBLOCK: if the
        //    path became a FIFO since step 1, the open must not block (and
        //    step 1's checks are made again on what was opened).
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if !meta.file_type().is_file() {
            return Err(not_a_file("file of another kind"));
        }
        sys::clear_nonblock(file.as_fd()).map_err(open_err)?;
        let len = meta.len();
        // 3. A size that is not the content: procfs; a file that says 0
        //    bytes but reads more (some FUSE filesystems); a file that ends
        //    before its size (a sysfs text attribute says 4096 bytes). One
        //    byte is read on each side of the size. A non-empty file that
        //    reads past its size is only growing (a log being written): its
        //    mapping ends at the size it had, as with `mmap`.
        if let Some(fs) = sys::pseudo_fs(file.as_fd()).map_err(open_err)? {
            return Err(StoreError::PseudoFile {
                path: path.to_path_buf(),
                fs,
            });
        }
        let mut probe = [0u8; 1];
        let mut probe_at =
            |offset| sys::pread_some(file.as_fd(), &mut probe, offset).map_err(open_err);
        let wrong = if len == 0 {
            probe_at(0)? > 0
        } else {
            probe_at(len - 1)? == 0
        };
        if wrong {
            return Err(StoreError::UnknownSize {
                path: path.to_path_buf(),
                reported: len,
            });
        }
        let ra_pages = device_ra_pages(Path::new("/sys"), meta.dev())
            .unwrap_or(crate::policy::readahead::DEFAULT_RA_PAGES);
        // 4. The O_DIRECT descriptor, if the mode wants one and the file
        //    takes it; io_uring, if the mode wants it and the kernel has it.
        let direct = match io {
            FileIo::Buffered => None,
            FileIo::Direct | FileIo::Uring => open_direct(path, &meta).map_err(open_err)?,
        };
        let io = match (io, &direct) {
            (_, None) => FileIo::Buffered,
            (FileIo::Uring, Some(_)) if !uring::available() => FileIo::Direct,
            (io, Some(_)) => io,
        };
        Ok(Self {
            file,
            direct,
            io,
            len,
            ra_pages,
            name: path.display().to_string(),
            writable,
            mtime: (meta.mtime(), meta.mtime_nsec()),
            id: (meta.dev(), meta.ino()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }

    /// The mode in force: the one asked for at open, or its fallback.
    pub fn io(&self) -> FileIo {
        self.io
    }

    /// The device's sequential read rate for `path`: reads the whole file with
    /// O_DIRECT (bypassing the page cache, whatever it holds) in `chunk`-byte
    /// requests, several in flight through io_uring (about 32 MiB's worth, at
    /// least 2), as the [`FileIo::Uring`] path does. Returns the bytes read and the seconds
    /// the reads took. `chunk` is rounded up to a multiple of 4 KiB (at most
    /// 64 MiB). Without io_uring the requests go one at a time with `pread`;
    /// on a filesystem without O_DIRECT, through the page cache.
    pub fn direct_read_rate(path: &Path, chunk: usize) -> Result<(u64, f64), StoreError> {
        let store = Self::open_with(path, FileIo::Uring)?;
        let chunk = chunk.clamp(1, 64 << 20).next_multiple_of(DIO_ALIGN);
        let depth = (RATE_IN_FLIGHT_BYTES / chunk).clamp(2, URING_DEPTH);
        let mut slots = AlignedBuf::new(depth * chunk);
        let read_err = |offset, source| StoreError::Read {
            name: store.name.clone(),
            offset,
            len: chunk,
            source,
        };
        let start = Instant::now();
        let streamed = match (&store.direct, store.io) {
            (Some(direct), FileIo::Uring) => {
                uring::read_stream(direct.as_raw_fd(), store.len, slots.as_mut(), chunk, depth)
            }
            _ => Err(UringError::Setup),
        };
        let bytes = match streamed {
            Ok(bytes) => bytes,
            Err(UringError::Read { offset, source }) => return Err(read_err(offset, source)),
            Err(UringError::Setup) => {
                let file = store.direct.as_ref().unwrap_or(&store.file);
                let buf = &mut slots.as_mut()[..chunk];
                let mut offset = 0;
                while offset < store.len {
                    pread_direct(file, store.len, offset, buf).map_err(|e| read_err(offset, e))?;
                    offset += chunk as u64;
                }
                store.len
            }
        };
        Ok((bytes, start.elapsed().as_secs_f64()))
    }

    /// Reads with the page cache.
    fn read_buffered(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // read_exact_at loops over short reads and EINTR; a read that ends
        // early (the file shrank) is UnexpectedEof.
        self.file.read_exact_at(buf, offset)
    }

    /// Reads with O_DIRECT and `pread`: the page-aligned body straight into
    /// `buf`, a partial last page through a bounce page.
    fn read_direct(&self, direct: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (body, tail) = buf.split_at_mut(buf.len() / DIO_ALIGN * DIO_ALIGN);
        pread_direct(direct, self.len, offset, body)?;
        if !tail.is_empty() {
            let mut bounce = AlignedBuf::new(DIO_ALIGN);
            pread_direct(
                direct,
                self.len,
                offset + body.len() as u64,
                bounce.as_mut(),
            )?;
            tail.copy_from_slice(&bounce.as_mut()[..tail.len()]);
        }
        Ok(())
    }

    /// Reads with O_DIRECT through this thread's io_uring: the body in
    /// chunks all in flight, with the bounce page for a partial last page
    /// as one more read in the same batch.
    fn read_uring(&self, direct: &File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (body, tail) = buf.split_at_mut(buf.len() / DIO_ALIGN * DIO_ALIGN);
        let tail_offset = offset + body.len() as u64;
        let mut bounce = AlignedBuf::new(if tail.is_empty() { 0 } else { DIO_ALIGN });
        let mut segments = [(offset, body), (tail_offset, bounce.as_mut())];
        let result = uring::read_segments(
            direct.as_raw_fd(),
            self.len,
            &mut segments,
            URING_CHUNK,
            URING_DEPTH,
        );
        match result {
            Ok(()) => {}
            Err(UringError::Read { source, .. }) => return Err(source),
            // No ring on this thread: the same reads, one at a time.
            Err(UringError::Setup) => {
                let [(_, body), _] = segments;
                pread_direct(direct, self.len, offset, body)?;
                if !tail.is_empty() {
                    pread_direct(direct, self.len, tail_offset, bounce.as_mut())?;
                }
            }
        }
        tail.copy_from_slice(&bounce.as_mut()[..tail.len()]);
        Ok(())
    }
}

impl Store for FileStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.len
    }

    /// The kernel's default for the file's block device (its
    /// `read_ahead_kb`), read from sysfs at open; 32 pages when the file is
    /// on no block device (tmpfs, overlay).
    fn ra_pages(&self) -> u64 {
        self.ra_pages
    }

    fn io_pages(&self) -> u64 {
        FILE_IO_PAGES
    }

    /// The file's modification time when it was opened (a trace recorded
    /// on it replays only while the file keeps that time: `touch` or any
    /// write makes it another version, a copy that keeps the time the same
    /// one). A writable mapping's trace keeps the time of its open, so
    /// once written back the file is another version.
    fn version(&self) -> Option<String> {
        let (secs, nanos) = self.mtime;
        Some(format!("mtime {secs}.{nanos:09}"))
    }

    fn share_key(&self) -> Option<String> {
        let ((dev, ino), (secs, nanos), (csecs, cnanos)) = (self.id, self.mtime, self.ctime);
        Some(format!(
            "file dev {dev} inode {ino} {} bytes, mtime {secs}.{nanos:09}, ctime {csecs}.{cnanos:09}",
            self.len
        ))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(self.name(), self.len, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        // O_DIRECT only for page-aligned requests into page-aligned memory
        // (what the fault path asks for); anything else goes buffered.
        let aligned = offset % DIO_ALIGN as u64 == 0 && buf.as_ptr().align_offset(DIO_ALIGN) == 0;
        let result = match (&self.direct, self.io) {
            (Some(direct), FileIo::Uring) if aligned => self.read_uring(direct, offset, buf),
            (Some(direct), FileIo::Direct) if aligned => self.read_direct(direct, offset, buf),
            _ => self.read_buffered(offset, buf),
        };
        result.map_err(|source| match source.kind() {
            // The file ended early: it shrank since it was opened.
            io::ErrorKind::UnexpectedEof => StoreError::Short {
                name: self.name.clone(),
                offset,
                expected: buf.len() as u64,
                got: self
                    .len_now()
                    .map_or(0, |now| now.saturating_sub(offset).min(buf.len() as u64)),
            },
            _ => StoreError::Read {
                name: self.name.clone(),
                offset,
                len: buf.len(),
                source,
            },
        })
    }

    /// `fstat` of the open file.
    fn len_now(&self) -> Option<u64> {
        self.file.metadata().ok().map(|m| m.len())
    }

    fn writable(&self) -> bool {
        self.writable
    }

    /// `pwrite` on the buffered descriptor: short writes resubmitted,
    /// `EINTR` retried (`write_all_at`).
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        if !self.writable {
            return Err(StoreError::ReadOnly {
                name: self.name.clone(),
            });
        }
        check_range(self.name(), self.len, offset, buf.len())?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|source| StoreError::Write {
                name: self.name.clone(),
                offset,
                len: buf.len(),
                source,
            })
    }

    /// `fdatasync`, when the file is open for writing.
    fn sync(&self) -> Result<(), StoreError> {
        if !self.writable {
            return Ok(());
        }
        self.file.sync_data().map_err(|source| StoreError::Sync {
            name: self.name.clone(),
            source,
        })
    }
}

/// Opens `path` again with O_DIRECT, if its filesystem does direct I/O at
/// page alignment; `None` if not. `meta` is the buffered descriptor's, to
/// check that both name the same file.
fn open_direct(path: &Path, meta: &std::fs::Metadata) -> io::Result<Option<File>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(e),
    };
    let same = file.metadata()?;
    if (same.dev(), same.ino()) != (meta.dev(), meta.ino()) {
        // Renamed over between the two opens: read the first one, buffered.
        return Ok(None);
    }
    let fits = |align: u32| align != 0 && DIO_ALIGN % align as usize == 0;
    let takes_direct = match sys::dio_alignment(file.as_fd()) {
        Ok(Some((mem, offset))) => fits(mem) && fits(offset),
        // The filesystem does not say: try the first page.
        Ok(None) | Err(_) => {
            let mut probe = AlignedBuf::new(DIO_ALIGN);
            meta.len() == 0 || pread_direct(&file, meta.len(), 0, probe.as_mut()).is_ok()
        }
    };
    Ok(takes_direct.then_some(file))
}

/// Fills `buf` from `file` at `offset`, or up to `file_len` if that comes
/// first: O_DIRECT reads of the last block end short at the end of file.
/// Loops over short reads and `EINTR`; 0 bytes before `file_len` (the file
/// shrank) is `UnexpectedEof`.
fn pread_direct(file: &File, file_len: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() && offset + (done as u64) < file_len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A zeroed, page-aligned buffer: an aligned window of a slightly larger
/// vector (O_DIRECT needs aligned memory; no `unsafe` needed).
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let raw = vec![0u8; len + DIO_ALIGN];
        let start = raw.as_ptr().align_offset(DIO_ALIGN);
        Self { raw, start, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// The readahead default, in pages, that the kernel gives files on the
/// device `dev` (a `st_dev`), read from the sysfs mounted at `sysfs`: the
/// disk's `queue/read_ahead_kb` (through the parent directory for a
/// partition), else the backing device's (`class/bdi`, for non-block
/// filesystems that have one, like NFS). `None` if no file says (tmpfs,
/// overlay, btrfs's anonymous devices). Capped at the largest window a
/// mapping may ask for.
fn device_ra_pages(sysfs: &Path, dev: u64) -> Option<u64> {
    let (major, minor) = dev_major_minor(dev);
    let id = format!("{major}:{minor}");
    let block = sysfs.join("dev/block").join(&id);
    let candidates = [
        block.join("queue/read_ahead_kb"),
        block.join("../queue/read_ahead_kb"),
        sysfs.join("class/bdi").join(&id).join("read_ahead_kb"),
    ];
    let kb = candidates.iter().find_map(|path| {
        let text = std::fs::read_to_string(path).ok()?;
        text.trim().parse::<u64>().ok()
    })?;
    Some((kb / (PAGE_SIZE as u64 / 1024)).min(crate::base::config::MAX_RA_PAGES))
}

/// Splits a `dev_t` as glibc's `major()`/`minor()` do (12+20 bit and
/// 32+32 bit encodings alike).
fn dev_major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x00ff);
    (major, minor)
}

/// An object held in memory: for tests, and for data an application already
/// has in a buffer. Writable: write-back lands in the buffer, which clones
#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs: a disk 254:0 (read_ahead_kb 8192) with a partition
    /// 254:1 behind a symlink, as the kernel lays them out; a bdi 0:50
    /// (1024); a disk 8:0 whose file holds garbage.
    fn fake_sysfs() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let path = root.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("devices/virtio1/block/vda/queue/read_ahead_kb", "8192\n");
        std::fs::create_dir_all(root.path().join("devices/virtio1/block/vda/vda1")).unwrap();
        write("devices/sda/queue/read_ahead_kb", "lots\n");
        write("class/bdi/0:50/read_ahead_kb", "1024\n");
        std::fs::create_dir_all(root.path().join("dev/block")).unwrap();
        for (id, target) in [
            ("254:0", "../../devices/virtio1/block/vda"),
            ("254:1", "../../devices/virtio1/block/vda/vda1"),
            ("8:0", "../../devices/sda"),
        ] {
            std::os::unix::fs::symlink(target, root.path().join("dev/block").join(id)).unwrap();
        }
        root
    }

    /// A `dev_t` in glibc's encoding.
    fn makedev(major: u64, minor: u64) -> u64 {
        ((major & 0xffff_f000) << 32)
            | ((major & 0x0fff) << 8)
            | ((minor & 0xffff_ff00) << 12)
            | (minor & 0x00ff)
    }

    #[test]
    fn ra_pages_comes_from_the_disk_the_partition_or_the_bdi() {
        let sysfs = fake_sysfs();
        let ra = |major, minor| device_ra_pages(sysfs.path(), makedev(major, minor));
        assert_eq!(
            ra(254, 0),
            Some(2048),
            "whole disk: queue/read_ahead_kb / 4"
        );
        assert_eq!(ra(254, 1), Some(2048), "partition: the parent disk's queue");
        assert_eq!(ra(0, 50), Some(256), "no block device: the bdi");
        assert_eq!(ra(8, 0), None, "garbage is not a number");
        assert_eq!(ra(0, 51), None, "tmpfs: nothing in sysfs");
        assert_eq!(
            device_ra_pages(Path::new("/nonexistent"), makedev(254, 0)),
            None
        );
    }

    #[test]
    fn ra_pages_is_capped() {
        let sysfs = fake_sysfs();
        std::fs::write(sysfs.path().join("class/bdi/0:50/read_ahead_kb"), "1048576").unwrap();
        assert_eq!(
            device_ra_pages(sysfs.path(), makedev(0, 50)),
            Some(crate::base::config::MAX_RA_PAGES)
        );
    }

    #[test]
    fn dev_t_splits_like_glibc() {
        assert_eq!(dev_major_minor(0xfe00), (254, 0));
        assert_eq!(dev_major_minor(0x0801), (8, 1));
        for (major, minor) in [(0, 0), (259, 3), (4095, 255), (0x1234_5678, 0x9abc_def0)] {
            assert_eq!(dev_major_minor(makedev(major, minor)), (major, minor));
        }
    }

    #[test]
    fn file_io_names_round_trip() {
        for io in [FileIo::Buffered, FileIo::Direct, FileIo::Uring] {
            assert_eq!(io.to_string().parse::<FileIo>().unwrap(), io);
        }
        assert!("O_DIRECT".parse::<FileIo>().is_err());
    }

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        for len in [0, 1, 4096, 12345] {
            let mut buf = AlignedBuf::new(len);
            let slice = buf.as_mut();
            assert_eq!(slice.len(), len);
            assert_eq!(slice.as_ptr().align_offset(DIO_ALIGN), 0);
            assert!(slice.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn file_store_refuses_what_is_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            FileStore::open(dir.path()),
            Err(StoreError::NotAFile {
                kind: "directory",
                ..
            })
        ));
        assert!(matches!(
            FileStore::open(dir.path().join("missing")),
            Err(StoreError::Open { .. })
        ));
    }
}
