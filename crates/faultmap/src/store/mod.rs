//! Stores: where an object's bytes come from.
//!
//! A [`Store`] is a random-access byte source of fixed length: a local file
//! ([`FileStore`], module `file`), a buffer ([`MemStore`], module
//! `memory`), an object behind HTTP ([`HttpStore`], module `http`), in an
//! S3-compatible service ([`S3Store`], module `s3`), in Google Cloud
//! Storage ([`GcsStore`], module `gcs`) or in Azure Blob Storage
//! ([`AzureStore`], module `azure`), the last four on the shared remote
//! core (module `remote`). [`open_url`] (module `url`) opens whichever a
//! URL or path names. The fault path asks for a contiguous run of pages in one call
//! ([`Store::read_at`]) and hands the store the final destination (the
//! cache's alias mapping), so a store that can read straight into it
//! (pread, a socket read) copies nothing twice.
//!
//! A store may also take writes ([`Store::writable`],
//! [`Store::write_at`], [`Store::sync`]): write-back of writable mappings
//! (`crate::mm::writeback`) hands it runs of whole pages straight from the
//! cache's alias mapping, and syncs it when a flush asks.
//! [`FileStore::open_rw`] writes with `pwrite` on its buffered descriptor
//! (short writes resubmitted, `EINTR` retried) and syncs with `fdatasync`;
//! a [`MemStore`] writes into its buffer.
//!
//! Reads come in two shapes. [`Store::read_at`] fills a buffer and
//! returns: enough for a file, whose requests cost microseconds, and for a
//! simple custom store. [`Store::start_read`] starts a read into a
//! [`ReadBuf`] and calls back when it ends: a remote store returns at once
//! and keeps many requests in flight on one small runtime, so the I/O
//! layer needs no thread per request (its default calls `read_at`).
//!
//! A remote store may be read through a cache on local disk
//! ([`CachedStore`], module `disk`), which [`open_url_with`] puts in front
//! of it when its tuning names one.
//!
//! Layer rule: uses [`crate::base`], [`crate::policy`] (the default
//! readahead window) and [`crate::sys`]. The page cache above fills itself
//! through this trait and knows no kind of store.

#[cfg(not(loom))]
mod azure;
#[cfg(not(loom))]
pub mod disk;
mod file;
#[cfg(not(loom))]
mod gcs;
#[cfg(not(loom))]
mod http;
mod memory;
#[cfg(not(loom))]
mod remote;
#[cfg(not(loom))]
mod s3;
#[cfg(not(loom))]
mod url;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

#[cfg(not(loom))]
pub use azure::{AzureOptions, AzureStore};
#[cfg(not(loom))]
pub use disk::{CachedStore, DiskCache, DiskCacheError, DiskCacheStats};
pub use file::{FileIo, FileStore, ParseFileIoError};
#[cfg(not(loom))]
pub use gcs::{GcsOptions, GcsStore};
#[cfg(not(loom))]
pub use http::HttpStore;
pub use memory::MemStore;
#[cfg(not(loom))]
pub use remote::{RemoteErrorKind, RemoteTuning};
#[cfg(not(loom))]
pub use s3::{S3Options, S3Store};
#[cfg(not(loom))]
pub use url::{open_url, open_url_with};

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
    /// The file is on procfs, whose files report sizes that are not their
    /// contents (`/proc/cpuinfo`: 0 bytes). Mapping it would give wrong
    /// bytes; read it into memory (`std::fs::read`) and map a [`MemStore`].
    #[error(
        "{path} is on {fs}, whose files do not report their real size: \
         read it into memory and map a MemStore instead"
    )]
    PseudoFile {
        /// The path as given.
        path: PathBuf,
        /// The filesystem ("procfs").
        fs: &'static str,
    },
    /// The file's reported size is not its content: it says 0 bytes but
    /// reads more (some FUSE filesystems, for generated files), or ends
    /// before its size (a sysfs attribute reports 4096 bytes whatever it
    /// holds).
    #[error(
        "{path} reports {reported} bytes but holds a different amount: \
         its real size is unknown; read it into memory and map a MemStore instead"
    )]
    UnknownSize {
        /// The path as given.
        path: PathBuf,
        /// The size the file reports.
        reported: u64,
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
    /// A read came back with fewer bytes than asked for, inside the object
    /// (the backing file shrank): never zeros or stale bytes in their place.
    #[error(
        "{name}: short read at offset {offset}: {got} of {expected} bytes (the object shrank?)"
    )]
    Short {
        /// The store's name.
        name: String,
        /// The first byte asked for.
        offset: u64,
        /// How many bytes were asked for.
        expected: u64,
        /// How many the store had.
        got: u64,
    },
    /// A write failed.
    #[error("writing {len} bytes at offset {offset} of {name}")]
    Write {
        /// The store's name.
        name: String,
        /// The first byte written.
        offset: u64,
        /// How many bytes were to be written.
        len: usize,
        /// The underlying error (`WriteZero` for a write that made no
        /// progress).
        source: io::Error,
    },
    /// Making the writes durable (`fdatasync`) failed.
    #[error("syncing {name}")]
    Sync {
        /// The store's name.
        name: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A write to a store that does not take writes.
    #[error("{name} is read-only")]
    ReadOnly {
        /// The store's name.
        name: String,
    },
    /// A remote object could not be opened or read. `url` never holds
    /// credentials, nor does the source's text.
    #[cfg(not(loom))]
    #[error("{url}: {kind}")]
    Remote {
        /// The object's URL.
        url: String,
        /// What went wrong.
        kind: RemoteErrorKind,
        /// The client's own words, when it had any.
        source: Option<io::Error>,
    },
    /// The disk cache ([`crate::Config::disk_cache`]) cannot be used:
    /// its directory is unsafe or cannot be made.
    #[cfg(not(loom))]
    #[error(transparent)]
    DiskCache(#[from] DiskCacheError),
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

impl StoreError {
    /// Whether trying the request again may help: a failed read, or a
    /// remote failure that is transient (timeouts, throttling, 5xx, a
    /// broken transfer). Not a read outside the object, a short read (the
    /// object shrank) or a changed object.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Read { .. } => true,
            #[cfg(not(loom))]
            StoreError::Remote { kind, .. } => kind.is_transient(),
            _ => false,
        }
    }
}

/// Where an asynchronous read ([`Store::start_read`]) puts its bytes:
/// writable memory that stays valid, and is this buffer's alone, for as
/// long as the buffer lives. The fault path hands out buffers over the
/// cache itself (the pages being read, which nothing else touches until
/// the read ends); [`ReadBuf::from`] makes one over a `Vec`.
pub struct ReadBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// Keeps the memory alive.
    _owner: Owner,
}

enum Owner {
    Vec(#[allow(dead_code)] Vec<u8>),
    Shared(#[allow(dead_code)] Arc<dyn std::any::Any + Send + Sync>),
}

// SAFETY: a ReadBuf is the only way to reach its bytes while it lives (the
// constructors' contract), so moving it to another thread moves that
// exclusive access with it; its owner is `Send` (a `Vec`, or an `Arc` of a
// `Send + Sync` value).
unsafe impl Send for ReadBuf {}

impl ReadBuf {
    /// A buffer over `[ptr, ptr + len)`, kept alive by `owner`.
    ///
    /// # Safety
    ///
    /// The bytes must be valid for reads and writes for as long as `owner`
    /// lives, and nothing else may read or write them while the buffer
    /// lives.
    pub(crate) unsafe fn from_raw(
        ptr: std::ptr::NonNull<u8>,
        len: usize,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            ptr,
            len,
            _owner: Owner::Shared(owner),
        }
    }

    /// How many bytes the read is for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: valid for writes and ours alone while we live (the
        // constructors' contract); `&mut self` makes this the only slice.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl From<Vec<u8>> for ReadBuf {
    fn from(mut v: Vec<u8>) -> Self {
        let len = v.len();
        // A Vec's pointer is non-null (dangling but aligned when empty),
        // and its heap buffer does not move when the Vec does.
        let ptr = std::ptr::NonNull::new(v.as_mut_ptr()).unwrap_or(std::ptr::NonNull::dangling());
        Self {
            ptr,
            len,
            _owner: Owner::Vec(v),
        }
    }
}

impl std::fmt::Debug for ReadBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBuf").field("len", &self.len).finish()
    }
}

/// What a request to a store costs ([`Store::link`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// From sending a request to its first byte.
    pub latency: std::time::Duration,
    /// The link's rate, in bytes per second, across the requests in
    /// flight.
    pub bytes_per_sec: u64,
}

/// What an asynchronous read calls when it ends: the buffer back, and the
/// result.
pub type ReadDone = Box<dyn FnOnce(ReadBuf, Result<(), StoreError>) + Send>;

/// An object of fixed length that faultmap pages in (and, if the store
/// takes writes, writes back: [`Store::writable`]).
///
/// Implementations must be thread-safe: several handler threads may read
/// different ranges at once, and the flusher may write while they read.
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
        crate::policy::readahead::DEFAULT_RA_PAGES
    }

    /// The window read around a random-looking miss, in pages, if it is
    /// not `ra_pages` (the kernel's choice, and the default: `None`). A
    /// remote store, whose readahead window is tens of MiB, asks for less
    /// (see `policy::readahead`, "Read-around on a remote store"). At most
    /// the mapping's `ra_pages` is used. A store that wraps another should
    /// forward this with `ra_pages`: else a remote store's 64 MiB window is
    /// read around every random miss.
    fn around_pages(&self) -> Option<u64> {
        None
    }

    /// The largest request this store serves well, in pages: readahead
    /// windows are split into requests of at most this many pages, which
    /// the I/O threads run in parallel (the kernel's `bdi->io_pages`).
    /// Default: 256 (1 MiB).
    fn io_pages(&self) -> u64 {
        256
    }

    /// What a request to this store costs, as measured so far: its
    /// first-byte latency and its link's bandwidth (the bytes of all
    /// bodies over the time any was arriving). Batched
    /// prefetch (`Mapping::prefetch_ranges`) reads a hole between two
    /// ranges rather than make another request when the hole moves in less
    /// than a share of a round trip (`crate::policy::coalesce`). Default:
    /// `None` (a local store: only ranges that touch are merged). A store
    /// that wraps another should forward it.
    fn link(&self) -> Option<Link> {
        None
    }

    /// Fills all of `buf` with the object's bytes at `[offset, offset +
    /// buf.len())`. The fault path calls it with a page-aligned `offset` and a
    /// range that lies inside the object (the last page of a range is cut at
    /// the object's end), covering a contiguous run of pages, so one call is
    /// one request to the backend. A short read is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// Starts reading `[offset, offset + buf.len())` into `buf`, and calls
    /// `done` exactly once, with the buffer and the result, when the read
    /// ends, on whatever thread it ends on. The same contract as
    /// [`Store::read_at`] otherwise. The default reads with `read_at` on
    /// the calling thread; a store that can keep many requests in flight
    /// (a remote one) returns at once instead, so that the pager's I/O
    /// threads can start the next request.
    fn start_read(&self, offset: u64, mut buf: ReadBuf, done: ReadDone) {
        let result = self.read_at(offset, buf.as_mut_slice());
        done(buf, result);
    }

    /// The object's length now, if the store can tell cheaply (a file:
    /// `fstat`); `None` (the default) if it cannot. The pager's watchdog
    /// polls it about once a second: a length below [`Store::len`] means
    /// the object was truncated, and the pages beyond the new end stop
    /// being served (SIGBUS, as with a truncated kernel mapping).
    fn len_now(&self) -> Option<u64> {
        None
    }

    /// What identifies this version of the object's bytes, if the store
    /// can tell: a remote object's ETag (and version id, or its
    /// Last-Modified when it has no ETag), a file's modification time. An
    /// access trace ([`crate::Trace`]) keeps it, and is replayed only on
    /// an object that reports the same. Default: `None` (a trace recorded
    /// on such a store replays only on one that reports none either).
    fn version(&self) -> Option<String> {
        None
    }

    /// What names this version of the object's bytes to other processes,
    /// so that those that map it share one cache (`Config::shared`): a
    /// remote object's URL, length and pinned version, a file's device,
    /// inode, length and modification time. Two stores with the same key
    /// must hold the same bytes. Default: `None`, never shared.
    fn share_key(&self) -> Option<String> {
        None
    }

    /// What the disk cache in front of this store did, if there is one
    /// ([`CachedStore`], which first waits for the pages it handed over to
    /// reach the disk). Default: `None`. A store that wraps another
    /// should forward it.
    #[cfg(not(loom))]
    fn disk_cache_stats(&self) -> Option<DiskCacheStats> {
        None
    }

    /// What names this version of the object's bytes exactly, for a disk
    /// cache that keeps them across runs ([`CachedStore`]): `None` (the
    /// default) if the store has no such name, and is then not cached.
    /// A remote object's URL, length and pinned version when the version
    /// is byte-exact: a version id, or a strong ETag. Not a weak ETag
    /// (`W/`: equivalent, not identical, bytes) nor a Last-Modified alone
    /// (a rewrite within its second is unseen), which are good enough to
    /// pin one mapping's life but not to serve bytes from disk for days.
    /// Two stores with the same key must hold the same bytes. A store that
    /// wraps another should forward it.
    fn disk_cache_key(&self) -> Option<String> {
        None
    }

    /// Whether the store takes writes ([`Store::write_at`]): only such a
    /// store can be mapped writable. Default: false.
    fn writable(&self) -> bool {
        false
    }

    /// Writes all of `buf` at `[offset, offset + buf.len())`. Write-back
    /// calls it with a page-aligned `offset` and a run of whole pages (the
    /// last cut at the object's end), inside the object. The bytes need not
    /// be durable until [`Store::sync`]. Default: [`StoreError::ReadOnly`].
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        let _ = (offset, buf);
        Err(StoreError::ReadOnly {
            name: self.name().to_string(),
        })
    }

    /// Makes every write that returned `Ok` durable (`fdatasync`). A flush
    /// calls it after its writes. Default: nothing to do.
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// `Store` for a smart pointer to a store: every method is the pointee's.
macro_rules! forward_store {
    ($($ptr:ident),*) => {$(
        impl<S: Store + ?Sized> Store for $ptr<S> {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn len_now(&self) -> Option<u64> {
                (**self).len_now()
            }
            fn len(&self) -> u64 {
                (**self).len()
            }
            fn ra_pages(&self) -> u64 {
                (**self).ra_pages()
            }
            fn around_pages(&self) -> Option<u64> {
                (**self).around_pages()
            }
            fn io_pages(&self) -> u64 {
                (**self).io_pages()
            }
            fn link(&self) -> Option<Link> {
                (**self).link()
            }
            fn version(&self) -> Option<String> {
                (**self).version()
            }
            fn share_key(&self) -> Option<String> {
                (**self).share_key()
            }
            #[cfg(not(loom))]
            fn disk_cache_stats(&self) -> Option<DiskCacheStats> {
                (**self).disk_cache_stats()
            }
            fn disk_cache_key(&self) -> Option<String> {
                (**self).disk_cache_key()
            }
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
                (**self).read_at(offset, buf)
            }
            fn start_read(&self, offset: u64, buf: ReadBuf, done: ReadDone) {
                (**self).start_read(offset, buf, done)
            }
            fn writable(&self) -> bool {
                (**self).writable()
            }
            fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
                (**self).write_at(offset, buf)
            }
            fn sync(&self) -> Result<(), StoreError> {
                (**self).sync()
            }
        }
    )*};
}

forward_store!(Arc, Box);

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
