//! One chunk file: [`CHUNK_PAGES`] pages of one version of one object,
//! with a checksum per page.
//!
//! ```text
//! [0, 64)         header: "FMDISK01", pages per chunk (u32), page size
//!                 (u32), chunk index (u64), object length (u64), the
//!                 object key's hash (16 bytes), CRC-32 of the above (u32)
//! [4096, 8192)    the table: one u32 per page, 0 while the page is absent,
//!                 else the page's checksum (never 0)
//! [8192, ...)     page i at 8192 + i * 4096 (the object's last page is cut
//!                 at its end)
//! ```
//!
//! All little-endian. A chunk file is born whole: its header and empty
//! table are written to a file in `tmp/`, which is then linked to its name
//! (`link` fails if the name exists: the first creator wins, the others
//! open its file). Pages are written in place: data first, then the table
//! entries. A page's checksum covers the object key's hash, the chunk's
//! index, the page's index and its bytes, so a page is served only if its
//! bytes are those written for that place of that version. A write torn
//! by a kill, a full disk or a power cut leaves an entry that is 0 or does
//! not match the data: the page is absent, and read again from the
//! network. Every writer of a key writes the same bytes (the key names a
//! pinned version), so a page rewritten while another process reads it
//! reads the same.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::sys;

/// Bytes per page of the cache: its unit of presence and checksum.
pub(crate) const PAGE: u64 = sys::PAGE_SIZE as u64;

/// Pages per chunk file: 4 MiB, the unit of eviction.
pub(crate) const CHUNK_PAGES: u64 = 1024;

/// Bytes of object per chunk file.
pub(crate) const CHUNK_BYTES: u64 = CHUNK_PAGES * PAGE;

const MAGIC: &[u8; 8] = b"FMDISK01";
const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 8 + 16 + 4;
const TABLE: u64 = 4096;
const DATA: u64 = TABLE + CHUNK_PAGES * 4;

/// What a chunk file says it holds: the chunk `index` of the object of
/// length `object_len` whose key hashes to `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) key: [u8; 16],
    pub(crate) index: u64,
    pub(crate) object_len: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&(CHUNK_PAGES as u32).to_le_bytes());
        out[12..16].copy_from_slice(&(PAGE as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.index.to_le_bytes());
        out[24..32].copy_from_slice(&self.object_len.to_le_bytes());
        out[32..48].copy_from_slice(&self.key);
        let sum = crc32fast::hash(&out[..48]);
        out[48..52].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// The header in `bytes`, if they hold a whole, well-formed one of
    /// this format.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Header> {
        let bytes = bytes.get(..HEADER_LEN)?;
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        let whole = &bytes[..8] == MAGIC
            && u32_at(8) as u64 == CHUNK_PAGES
            && u32_at(12) as u64 == PAGE
            && u32_at(48) == crc32fast::hash(&bytes[..48]);
        whole.then(|| Header {
            key: bytes[32..48].try_into().unwrap_or([0; 16]),
            index: u64_at(16),
            object_len: u64_at(24),
        })
    }

    /// How many bytes of page `page` (of this chunk) are in the object.
    pub(crate) fn page_len(&self, page: u64) -> usize {
        let start = (self.index * CHUNK_PAGES + page) * PAGE;
        self.object_len.saturating_sub(start).min(PAGE) as usize
    }
}

/// The checksum of page `page` of chunk `header.index` holding `data`:
/// never 0, which marks an absent page.
pub(crate) fn page_sum(header: &Header, page: u64, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header.key);
    h.update(&header.index.to_le_bytes());
    h.update(&page.to_le_bytes());
    h.update(data);
    h.finalize().max(1)
}

/// Why an existing chunk file cannot be used.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// No such file.
    Missing,
    /// Its header is not this chunk's (torn, foreign, another format).
    Foreign,
    /// The file system failed.
    Io(io::Error),
}

/// An open chunk file whose header is the expected one.
#[derive(Debug)]
pub(crate) struct Chunk {
    file: File,
    header: Header,
}

impl Chunk {
    /// Opens the chunk file at `path`, checking that its header is
    /// `header`.
    pub(crate) fn open(path: &Path, header: Header) -> Result<Chunk, OpenError> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(OpenError::Missing),
            Err(e) => return Err(OpenError::Io(e)),
        };
        let mut bytes = [0u8; HEADER_LEN];
        match file.read_exact_at(&mut bytes, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(OpenError::Foreign),
            Err(e) => return Err(OpenError::Io(e)),
        }
        if Header::decode(&bytes) != Some(header) {
            return Err(OpenError::Foreign);
        }
        Ok(Chunk { file, header })
    }

    /// Opens the chunk file at `path`, creating it whole (header and empty
    /// table) through a file in `tmp` if it is missing, or replacing it if
    /// its header is not `header`.
    pub(crate) fn open_or_create(path: &Path, tmp: &Path, header: Header) -> io::Result<Chunk> {
        match Chunk::open(path, header) {
            Ok(chunk) => return Ok(chunk),
            Err(OpenError::Io(e)) => return Err(e),
            Err(OpenError::Foreign) => {
                // Not this chunk's bytes: nothing in it can be served.
                let _ = std::fs::remove_file(path);
            }
            Err(OpenError::Missing) => {}
        }
        let staged = tmp.join(temp_name());
        let made = (|| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&staged)?;
            file.write_all_at(&header.encode(), 0)?;
            file.set_len(DATA)?;
            match std::fs::hard_link(&staged, path) {
                Ok(()) => Ok(()),
                // Another creator won: its file is as good.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(e),
            }
        })();
        let _ = std::fs::remove_file(&staged);
        made?;
        Chunk::open(path, header).map_err(|e| match e {
            OpenError::Io(e) => e,
            OpenError::Missing => io::Error::from(io::ErrorKind::NotFound),
            OpenError::Foreign => io::Error::other("a chunk file changed under its creator"),
        })
    }

    /// The header.
    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// The file.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The table entries of pages `[first, first + out.len())` of this
    /// chunk (0: absent). A table cut short reads as absent pages.
    pub(crate) fn sums(&self, first: u64, out: &mut [u32]) -> io::Result<()> {
        let mut bytes = vec![0u8; out.len() * 4];
        let mut got = 0;
        while got < bytes.len() {
            match self
                .file
                .read_at(&mut bytes[got..], TABLE + first * 4 + got as u64)
            {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        for (sum, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *sum = u32::from_le_bytes(b.try_into().unwrap_or([0; 4]));
        }
        Ok(())
    }

    /// Reads the data of pages from `first` on into `buf` (whole pages,
    /// the object's last cut at its end), as far as the file goes:
    /// returns how many bytes it read (fewer if the file ends first, in
    /// pages whose data never made it).
    ///
    /// Buffered: what is read stays in the kernel's page cache for the
    /// next run (`O_DIRECT` reads measured no faster here).
    pub(crate) fn read(&self, first: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self
                .file
                .read_at(&mut buf[got..], DATA + first * PAGE + got as u64)
            {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    /// Writes pages from `first` on: `data` (whole pages, the object's
    /// last cut at its end), then their table entries, checksums of
    /// `data`. `padded`, if given, holds the same bytes, its last page
    /// filled up with zeros, at a page-aligned address: it is written
    /// with `O_DIRECT` (the device's DMA instead of a copy into the page
    /// cache and its write-back, which cost the CPU the network needs),
    /// or as `data` is if the file system refuses.
    pub(crate) fn write(&self, first: u64, data: &[u8], padded: Option<&[u8]>) -> io::Result<()> {
        let at = DATA + first * PAGE;
        let direct = padded.is_some_and(|p| {
            p.as_ptr() as usize % PAGE as usize == 0
                && p.len() as u64 % PAGE == 0
                && p.len() >= data.len()
                && self.write_direct(at, p)
        });
        if !direct {
            self.file.write_all_at(data, at)?;
        }
        let mut table = Vec::with_capacity(data.len().div_ceil(PAGE as usize) * 4);
        for (i, page) in data.chunks(PAGE as usize).enumerate() {
            table.extend_from_slice(&page_sum(&self.header, first + i as u64, page).to_le_bytes());
        }
        self.file.write_all_at(&table, TABLE + first * 4)
    }

    /// Writes `padded` at `at` with `O_DIRECT`, if the file system takes
    /// it at page alignment: `false` if it does not (nothing is then
    /// written, or what was is written again, buffered).
    fn write_direct(&self, at: u64, padded: &[u8]) -> bool {
        // Asked at each write (a `statx`), not at each open: most opens
        // are reads.
        let direct = sys::dio_alignment(std::os::fd::AsFd::as_fd(&self.file))
            .ok()
            .flatten()
            .is_some_and(|(mem, offset)| {
                mem > 0 && offset > 0 && PAGE % u64::from(mem) == 0 && PAGE % u64::from(offset) == 0
            });
        if !direct || sys::set_direct(&self.file, true).is_err() {
            return false;
        }
        let written = self.file.write_all_at(padded, at).is_ok();
        // Buffered again, for the table's small writes; if that fails the
        // table write fails and says so.
        let _ = sys::set_direct(&self.file, false);
        written
    }

    /// Tries to take the right to fetch and write pages `[first, first +
    /// n)` of this chunk, against every other open description of the
    /// file, in any process: a record lock on their table entries. Gone
    /// with [`Chunk::unlock`], or with the process.
    pub(crate) fn try_lock(&self, first: u64, n: u64) -> io::Result<bool> {
        sys::range_lock_try(&self.file, TABLE + first * 4, n * 4)
    }

    /// Gives back what [`Chunk::try_lock`] took.
    pub(crate) fn unlock(&self, first: u64, n: u64) {
        let _ = sys::range_unlock(&self.file, TABLE + first * 4, n * 4);
    }
}

/// A name for a staged file, unique on this machine for this process's
/// life: the process id, a counter, and the time.
pub(crate) fn temp_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        sys::monotonic_ns()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            key: [7; 16],
            index: 3,
            object_len: 3 * CHUNK_BYTES + 10_000,
        }
    }

    #[test]
    fn a_header_reads_back_and_a_torn_one_does_not() {
        let h = header();
        let bytes = h.encode();
        assert_eq!(Header::decode(&bytes), Some(h));
        for i in 0..bytes.len() {
            let mut torn = bytes;
            torn[i] ^= 0x40;
            assert_eq!(Header::decode(&torn), None, "byte {i} flipped");
        }
        assert_eq!(Header::decode(&bytes[..HEADER_LEN - 1]), None);
        assert_eq!(Header::decode(&[0; 64]), None);
    }

    #[test]
    fn the_last_page_is_cut_at_the_object_end() {
        let h = header();
        assert_eq!(h.page_len(0), 4096);
        assert_eq!(h.page_len(2), 10_000 - 8192);
        assert_eq!(h.page_len(3), 0);
    }

    #[test]
    fn a_checksum_names_its_place_and_is_never_zero() {
        let h = header();
        let data = vec![5u8; 4096];
        let s = page_sum(&h, 1, &data);
        assert_ne!(s, 0);
        assert_ne!(s, page_sum(&h, 2, &data));
        assert_ne!(s, page_sum(&Header { index: 4, ..h }, 1, &data));
        assert_ne!(s, page_sum(&Header { key: [8; 16], ..h }, 1, &data));
    }

    #[test]
    fn pages_written_read_back_and_torn_ones_do_not_match() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        let h = header();
        let chunk = Chunk::open_or_create(&path, dir.path(), h).unwrap();
        let mut sums = [9u32; 4];
        chunk.sums(0, &mut sums).unwrap();
        assert_eq!(sums, [0; 4], "a new chunk holds nothing");
        let data: Vec<u8> = (0..2 * 4096 + 10_000 - 8192).map(|i| i as u8).collect();
        chunk.write(0, &data[..8192], None).unwrap();
        chunk.write(2, &data[8192..], None).unwrap();
        chunk.sums(0, &mut sums).unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(chunk.read(0, &mut back).unwrap(), data.len());
        assert_eq!(back, data);
        for (page, bytes) in data.chunks(4096).enumerate() {
            assert_eq!(sums[page], page_sum(&h, page as u64, bytes));
        }
        assert_eq!(sums[3], 0);
        // Another opener sees the same file; a wrong header is refused.
        assert!(Chunk::open(&path, h).is_ok());
        assert!(matches!(
            Chunk::open(&path, Header { index: 2, ..h }),
            Err(OpenError::Foreign)
        ));
        // A flipped byte of data no longer matches its entry.
        chunk.file().write_all_at(&[0xff], DATA + 5).unwrap();
        let mut page = vec![0u8; 4096];
        assert_eq!(chunk.read(0, &mut page).unwrap(), 4096);
        assert_ne!(page_sum(&h, 0, &page), sums[0]);
        // The data of a page beyond the file's end is not there.
        assert_eq!(chunk.read(5, &mut page).unwrap(), 0);
    }

    #[test]
    fn a_padded_aligned_write_reads_back_and_an_unaligned_one_is_written_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        let h = Header {
            object_len: 10 * CHUNK_BYTES,
            ..header()
        };
        let chunk = Chunk::open_or_create(&path, dir.path(), h).unwrap();
        let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i * 7) as u8).collect();
        let mut raw = vec![0u8; 6 * 4096];
        let at = raw.as_ptr().align_offset(4096);
        raw[at..at + data.len()].copy_from_slice(&data);
        // Aligned (O_DIRECT where the file system takes it), then not.
        chunk
            .write(0, &data, Some(&raw[at..at + 4 * 4096]))
            .unwrap();
        chunk
            .write(8, &data, Some(&raw[at + 1..at + 1 + 4 * 4096]))
            .unwrap();
        for first in [0, 8] {
            let mut back = vec![0u8; data.len()];
            assert_eq!(chunk.read(first, &mut back).unwrap(), data.len());
            assert_eq!(back, data, "pages from {first}");
            let mut sums = [0u32; 4];
            chunk.sums(first, &mut sums).unwrap();
            for (i, page) in data.chunks(4096).enumerate() {
                assert_eq!(sums[i], page_sum(&h, first + i as u64, page));
            }
        }
    }

    #[test]
    fn record_locks_exclude_other_descriptions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        let h = header();
        let a = Chunk::open_or_create(&path, dir.path(), h).unwrap();
        let b = Chunk::open(&path, h).unwrap();
        assert!(a.try_lock(0, 16).unwrap());
        assert!(!b.try_lock(8, 16).unwrap(), "overlapping");
        assert!(b.try_lock(16, 16).unwrap(), "disjoint");
        a.unlock(0, 16);
        assert!(b.try_lock(0, 8).unwrap());
    }
}
