//! Stores: where an object's bytes come from.
//!
//! A [`Store`] is a read-only, random-access byte source of fixed length: a
//! local file ([`FileStore`]), a buffer ([`MemStore`]), and later an HTTP URL
//! or an S3 object. The fault path asks for a contiguous run of pages in one
//! call ([`Store::read_at`]) and hands the store the final destination (the
//! cache's alias mapping), so a store that can read straight into it (pread,
//! a socket read) copies nothing twice.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a store could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be opened.
    #[error("cannot open {path}")]
    Open {
        /// The path as given.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The path names something that is not a regular file.
    #[error("{path} is a {kind}, not a regular file")]
    NotAFile {
        /// The path as given.
        path: PathBuf,
        /// What it is instead ("directory", "FIFO", ...).
        kind: &'static str,
    },
    /// A read failed.
    #[error("reading {len} bytes at offset {offset} of {name}")]
    Read {
        /// The store's name.
        name: String,
        /// The first byte asked for.
        offset: u64,
        /// How many bytes were asked for.
        len: usize,
        /// The underlying error (`UnexpectedEof` for a short read).
        source: io::Error,
    },
    /// A read asked for bytes outside the object.
    #[error(
        "{name}: read of {len} bytes at offset {offset} is outside the object ({object_len} bytes)"
    )]
    OutOfRange {
        /// The store's name.
        name: String,
        /// The first byte asked for.
        offset: u64,
        /// How many bytes were asked for.
        len: usize,
        /// The object's length.
        object_len: u64,
    },
}

/// A read-only object of fixed length that faultmap pages in.
///
/// Implementations must be thread-safe: several handler threads may read
/// different ranges at once.
pub trait Store: Send + Sync + 'static {
    /// A short name for statistics and errors (a path, a URL).
    fn name(&self) -> &str;

    /// The object's length in bytes. It must not change while mapped.
    fn len(&self) -> u64;

    /// Whether the object has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The readahead window this store wants by default, in pages (the
    /// kernel's `ra_pages`). Default: 32 (128 KiB, `VM_READAHEAD_PAGES`).
    /// Remote stores, whose requests cost milliseconds, want MiBs.
    fn ra_pages(&self) -> u64 {
        crate::readahead::DEFAULT_RA_PAGES
    }

    /// The largest request this store serves well, in pages: readahead
    /// windows are split into requests of at most this many pages, which
    /// the I/O threads run in parallel (the kernel's `bdi->io_pages`).
    /// Default: 256 (1 MiB).
    fn io_pages(&self) -> u64 {
        256
    }

    /// Fills all of `buf` with the object's bytes at `[offset, offset +
    /// buf.len())`. The fault path calls it with a page-aligned `offset` and a
    /// range that lies inside the object (the last page of a range is cut at
    /// the object's end), covering a contiguous run of pages, so one call is
    /// one request to the backend. A short read is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn ra_pages(&self) -> u64 {
        (**self).ra_pages()
    }
    fn io_pages(&self) -> u64 {
        (**self).io_pages()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        (**self).read_at(offset, buf)
    }
}

impl<S: Store + ?Sized> Store for Box<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn ra_pages(&self) -> u64 {
        (**self).ra_pages()
    }
    fn io_pages(&self) -> u64 {
        (**self).io_pages()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        (**self).read_at(offset, buf)
    }
}

/// A local regular file, read with `pread`.
pub struct FileStore {
    file: File,
    len: u64,
    name: String,
}

impl fmt::Debug for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStore")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}

impl FileStore {
    /// Opens a regular file read-only. Directories, FIFOs, sockets and
    /// devices are refused with [`StoreError::NotAFile`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let open_err = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        // Look before opening: opening a FIFO for reading would block.
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
        let file = File::open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        Ok(Self {
            file,
            len,
            name: path.display().to_string(),
        })
    }
}

impl Store for FileStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(self.name(), self.len, offset, buf.len())?;
        // read_exact_at loops over short reads and EINTR; a read that ends
        // early (the file shrank) is UnexpectedEof.
        self.file
            .read_exact_at(buf, offset)
            .map_err(|source| StoreError::Read {
                name: self.name.clone(),
                offset,
                len: buf.len(),
                source,
            })
    }
}

/// An object held in memory: for tests, and for data an application already
/// has in a buffer.
#[derive(Clone, Debug)]
pub struct MemStore {
    name: String,
    data: Arc<[u8]>,
}

impl MemStore {
    /// A store over `data`, named `name`.
    pub fn new(name: impl Into<String>, data: impl Into<Arc<[u8]>>) -> Self {
        Self {
            name: name.into(),
            data: data.into(),
        }
    }

    /// The bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

impl Store for MemStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn len(&self) -> u64 {
        self.data.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        check_range(&self.name, self.len(), offset, buf.len())?;
        // check_range proved offset + len <= data.len(), which is a usize.
        let start = offset as usize;
        buf.copy_from_slice(&self.data[start..start + buf.len()]);
        Ok(())
    }
}

/// Refuses a read outside `[0, object_len)`.
pub(crate) fn check_range(
    name: &str,
    object_len: u64,
    offset: u64,
    len: usize,
) -> Result<(), StoreError> {
    let inside = offset
        .checked_add(len as u64)
        .is_some_and(|end| end <= object_len);
    if inside {
        Ok(())
    } else {
        Err(StoreError::OutOfRange {
            name: name.to_string(),
            offset,
            len,
            object_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_store_reads_and_refuses_out_of_range() {
        let s = MemStore::new("m", vec![1u8, 2, 3, 4, 5]);
        let mut buf = [0u8; 3];
        s.read_at(2, &mut buf).unwrap();
        assert_eq!(buf, [3, 4, 5]);
        assert!(matches!(
            s.read_at(3, &mut buf),
            Err(StoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            s.read_at(u64::MAX, &mut buf),
            Err(StoreError::OutOfRange { .. })
        ));
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
