//! Access traces: the order in which an application first touched an
//! object's pages, as runs of pages, and the file that holds one.
//!
//! A mapping made with `MapOptions::record_trace` notes every page's first
//! fault (`crate::mm::trace`); its [`Trace`] is those pages in that order,
//! consecutive pages merged into runs. A later mapping of the same object
//! made with `MapOptions::replay_trace` reads the runs ahead of the
//! application, in order (the snapshot loaders' "record once, prefetch
//! next time").
//!
//! A trace names the object it was recorded on: its length and its version
//! ([`crate::Store::version`]: a remote object's ETag, a file's
//! modification time). Replaying it on an object of another length or
//! version is refused ([`TraceError::Mismatch`]): its pages would be the
//! wrong ones. That is all that is checked (not the name: a copy of a
//! file that keeps its modification time, `cp -p`, is taken as the same
//! version). A wrong trace can only prefetch the wrong pages: the bytes a
//! mapping reads are always the store's.
//!
//! # The file
//!
//! Little-endian, integers as unsigned LEB128 (`leb128`), so that a trace
//! of a random read costs about 3 bytes per run:
//!
//! ```text
//!   "FMTRACE\0"          8 bytes, the magic
//!   1                    1 byte, the format's version
//!   page size            the page size the runs count in (4096)
//!   object length        bytes
//!   name                 length, then UTF-8 (for messages only)
//!   version              0 (none), or length + 1, then UTF-8
//!   runs                 how many, then per run:
//!     gap                zigzag(start - end of the run before), signed
//!     length - 1         pages
//!   CRC-32               4 bytes, IEEE (zlib's), of everything before
//! ```
//!
//! Reading checks everything before trusting anything: the magic, the
//! version, the checksum, the page size, that every run is non-empty,
//! inside the object and disjoint from the others, and that no length
//! asks for more than the file holds.
//!
//! Layer rule: uses [`crate::sys`] (the page size) only.

use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::config::PageSize;

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"FMTRACE\0";

/// The format this code writes and reads.
const FORMAT: u8 = 1;

/// The longest name or version a trace file may hold, in bytes.
const MAX_TEXT: u64 = 64 << 10;

/// The longest name a trace keeps (it is for messages only).
const MAX_NAME: usize = 4096;

/// The largest trace file read: 16 MiB, about 5 million runs of a random
/// read. Reading one takes up to about 20 bytes of memory per run (and a
/// run takes 2 bytes of file at least): at most about 160 MiB.
const MAX_FILE: u64 = 16 << 20;

/// How much of a name or version an error message shows.
const SHOWN: usize = 200;

/// Why a trace could not be read, written, or replayed on an object.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading or writing the file failed.
    #[error("{op} the trace {path}")]
    Io {
        /// "reading" or "writing".
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The bytes are not a trace this build can read.
    #[error("{path}: not a usable faultmap trace: {reason}")]
    Format {
        /// The file (empty for bytes given in memory).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The trace was recorded on another object, or another version of it.
    #[error(
        "the trace was recorded on {recorded_name} ({recorded}); \
         {name} is {current}: replaying it would read the wrong pages"
    )]
    Mismatch {
        /// The object the trace was recorded on.
        recorded_name: String,
        /// Its length and version then.
        recorded: String,
        /// The object being mapped.
        name: String,
        /// Its length and version now.
        current: String,
    },
}

/// The first-touch order of an object's pages, as runs (see the module
/// documentation). Made by a recording mapping (`Mapping::trace`) or read
/// from a file ([`Trace::load`], [`Trace::from_bytes`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Trace {
    object_len: u64,
    /// The size of the pages the runs count.
    page_size: PageSize,
    name: String,
    version: Option<String>,
    /// Object pages, in first-touch order; non-empty, disjoint.
    runs: Vec<Range<u64>>,
}

/// A summary: the object, how many runs and pages (not every run).
impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("object", &self.name)
            .field("object_len", &self.object_len)
            .field("page_size", &self.page_size)
            .field("version", &self.version)
            .field("runs", &self.runs.len())
            .field("pages", &self.pages())
            .finish()
    }
}

impl Trace {
    /// The trace of object pages `pages` touched in this order (each page
    /// at most once: the recorder's bitmap sees to it), merged into runs.
    pub(crate) fn from_pages(
        object_len: u64,
        page_size: PageSize,
        name: &str,
        version: Option<String>,
        pages: impl IntoIterator<Item = u64>,
    ) -> Trace {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for page in pages {
            match runs.last_mut() {
                Some(run) if run.end == page => run.end += 1,
                _ => runs.push(page..page + 1),
            }
        }
        Trace {
            object_len,
            page_size,
            name: truncated(name, MAX_NAME).to_string(),
            version,
            runs,
        }
    }

    /// A trace of `runs` (disjoint, inside the object), for tests.
    #[cfg(test)]
    pub(crate) fn with_runs(object_len: u64, runs: Vec<Range<u64>>) -> Trace {
        Trace {
            object_len,
            page_size: PageSize::Base,
            name: "test".into(),
            version: None,
            runs,
        }
    }

    /// The runs of object pages (page `i`: bytes `[i * P, (i + 1) * P)`,
    /// `P` the [`Trace::page_size`]), in the order they were first
    /// touched.
    pub fn runs(&self) -> &[Range<u64>] {
        &self.runs
    }

    /// How many pages the trace holds.
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.end - r.start).sum()
    }

    /// The size of the pages it counts: the page size of the object it
    /// was recorded on.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// The length of the object it was recorded on, in bytes.
    pub fn object_len(&self) -> u64 {
        self.object_len
    }

    /// The name of the object it was recorded on (a path, a URL).
    pub fn object_name(&self) -> &str {
        &self.name
    }

    /// The version of the object it was recorded on
    /// ([`crate::Store::version`]), if its store had one.
    pub fn object_version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// Refuses to replay the trace on object `name` of `len` bytes at
    /// `version` in pages of `page_size`, unless that is the object it was
    /// recorded on: the same length, the same version (a trace recorded
    /// without a version matches only an object without one) and the
    /// same page size.
    pub fn check(
        &self,
        name: &str,
        len: u64,
        version: Option<&str>,
        page_size: PageSize,
    ) -> Result<(), TraceError> {
        if self.object_len == len
            && self.version.as_deref() == version
            && self.page_size == page_size
        {
            return Ok(());
        }
        // A trace file's text is shown escaped and cut: it is the file's,
        // whoever wrote it.
        let describe = |len: u64, version: Option<&str>, page: PageSize| {
            let pages = match page {
                PageSize::Base => String::new(),
                PageSize::Huge => " in 2 MiB pages".to_string(),
            };
            match version {
                Some(v) => format!("{len} bytes{pages}, version {}", shown(v)),
                None => format!("{len} bytes{pages}, no version"),
            }
        };
        Err(TraceError::Mismatch {
            recorded_name: shown(&self.name),
            recorded: describe(self.object_len, self.version.as_deref(), self.page_size),
            name: name.to_string(),
            current: describe(len, version, page_size),
        })
    }

    /// The trace in its file format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.name.len() + 3 * self.runs.len());
        out.extend_from_slice(MAGIC);
        out.push(FORMAT);
        let put = |v: u64, out: &mut Vec<u8>| {
            // Writing to a Vec cannot fail.
            let _ = leb128::write::unsigned(out, v);
        };
        put(self.page_size.bytes() as u64, &mut out);
        put(self.object_len, &mut out);
        put(self.name.len() as u64, &mut out);
        out.extend_from_slice(self.name.as_bytes());
        match &self.version {
            None => put(0, &mut out),
            Some(v) => {
                put(v.len() as u64 + 1, &mut out);
                out.extend_from_slice(v.as_bytes());
            }
        }
        put(self.runs.len() as u64, &mut out);
        let mut end = 0u64;
        for run in &self.runs {
            put(zigzag(run.start.wrapping_sub(end) as i64), &mut out);
            put(run.end - run.start - 1, &mut out);
            end = run.end;
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a trace from its file format (see the module documentation
    /// for what is checked).
    pub fn from_bytes(bytes: &[u8]) -> Result<Trace, TraceError> {
        Self::decode(bytes).map_err(|reason| TraceError::Format {
            path: PathBuf::new(),
            reason,
        })
    }

    /// Writes the trace to `path`: to a new temporary file beside it
    /// (created exclusively, so never through a link planted there),
    /// synced, renamed over `path`, and the directory synced, so that a
    /// reader never sees half a trace and a crash leaves the old file or
    /// the new one. A trace whose file would be larger than [`Trace::load`]
    /// reads (16 MiB, about 5 million runs of a random read) is refused
    /// with [`TraceError::Format`], and nothing is written. Returns the
    /// file's size in bytes.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<u64, TraceError> {
        let path = path.as_ref();
        let io = |source| TraceError::Io {
            op: "writing",
            path: path.to_path_buf(),
            source,
        };
        // A name of this process and this call alone: two saves to one
        // path, at once, each write a whole file, and the last rename wins.
        static SAVES: AtomicU64 = AtomicU64::new(0);
        let n = SAVES.fetch_add(1, Ordering::Relaxed);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp{}.{n}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        // What could not be read back is not written.
        let bytes = self.to_bytes();
        if bytes.len() as u64 > MAX_FILE {
            return Err(TraceError::Format {
                path: path.to_path_buf(),
                reason: format!(
                    "the trace is {} bytes ({} runs), larger than a trace may be \
                     ({MAX_FILE} bytes)",
                    bytes.len(),
                    self.runs.len()
                ),
            });
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io)?;
        let written = (&file).write_all(&bytes).and_then(|()| file.sync_all());
        drop(file);
        let renamed = written.and_then(|()| std::fs::rename(&tmp, path));
        if renamed.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        renamed.map_err(io)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // The trace is in place: a directory this process may not open
        // (write and search permission only) just goes unsynced.
        if let Ok(d) = std::fs::File::open(dir) {
            d.sync_all().map_err(io)?;
        }
        Ok(bytes.len() as u64)
    }

    /// Reads the trace in `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
        let path = path.as_ref();
        let io = |source| TraceError::Io {
            op: "reading",
            path: path.to_path_buf(),
            source,
        };
        let format = |reason: String| TraceError::Format {
            path: path.to_path_buf(),
            reason,
        };
        // A file named by mistake (a device, a FIFO) is refused before it
        // is opened (opening some devices does something); and opened
        // non-blocking, not as a terminal, in case it changed since, so
        // that a FIFO without a writer is refused below, not waited on.
        if !std::fs::metadata(path).map_err(io)?.is_file() {
            return Err(format("it is not a regular file".into()));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        // A file named by mistake (a device, a FIFO, a data file) is
        // refused before anything is read into memory.
        if !meta.is_file() {
            return Err(format("it is not a regular file".into()));
        }
        if meta.len() > MAX_FILE {
            return Err(format(format!(
                "it is {} bytes, larger than a trace may be ({MAX_FILE})",
                meta.len()
            )));
        }
        let mut bytes = Vec::new();
        (&file)
            .take(MAX_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(format(format!(
                "it is larger than a trace may be ({MAX_FILE} bytes)"
            )));
        }
        Self::decode(&bytes).map_err(|reason| TraceError::Format {
            path: path.to_path_buf(),
            reason,
        })
    }

    fn decode(bytes: &[u8]) -> Result<Trace, String> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err("it does not start with a faultmap trace's magic bytes".into());
        }
        let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
            return Err("it is truncated".into());
        };
        if body.len() <= MAGIC.len() {
            return Err("it is truncated".into());
        }
        if body[MAGIC.len()] != FORMAT {
            return Err(format!(
                "format version {} (this build reads version {FORMAT})",
                body[MAGIC.len()]
            ));
        }
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err("its checksum does not match: the file is damaged".into());
        }
        let mut r = &body[MAGIC.len() + 1..];
        let page_bytes = uint(&mut r)?;
        let page_size = PageSize::from_bytes(page_bytes).ok_or_else(|| {
            format!("its pages are {page_bytes} bytes (this build's are 4096 or 2097152)")
        })?;
        let object_len = uint(&mut r)?;
        let name_len = uint(&mut r)?;
        let name = text(&mut r, name_len)?;
        let version = match uint(&mut r)? {
            0 => None,
            n => Some(text(&mut r, n - 1)?),
        };
        let count = uint(&mut r)?;
        // Each run takes at least two bytes: no count the file cannot hold
        // is allocated for.
        if count > r.len() as u64 / 2 {
            return Err(format!("it says {count} runs but is too short for them"));
        }
        let object_pages = object_len.div_ceil(page_bytes);
        let mut runs = Vec::new();
        runs.try_reserve_exact(count as usize)
            .map_err(|_| format!("{count} runs do not fit in memory"))?;
        let mut end = 0u64;
        for _ in 0..count {
            let gap = unzigzag(uint(&mut r)?);
            let len = uint(&mut r)?.checked_add(1);
            let start = end.checked_add_signed(gap);
            let run = start
                .zip(len)
                .and_then(|(s, l)| Some(s..s.checked_add(l)?))
                .filter(|run| run.end <= object_pages)
                .ok_or_else(|| format!("a run lies outside the object ({object_pages} pages)"))?;
            end = run.end;
            runs.push(run);
        }
        if !r.is_empty() {
            return Err(format!("{} bytes follow the last run", r.len()));
        }
        // The overlap check sorts run indices, 4 bytes each.
        let n = u32::try_from(runs.len()).map_err(|_| format!("{count} runs are too many"))?;
        let mut sorted: Vec<u32> = Vec::new();
        sorted
            .try_reserve_exact(runs.len())
            .map_err(|_| format!("{count} runs do not fit in memory"))?;
        sorted.extend(0..n);
        sorted.sort_unstable_by_key(|&i| runs[i as usize].start);
        let overlap = sorted
            .windows(2)
            .any(|w| runs[w[0] as usize].end > runs[w[1] as usize].start);
        if overlap {
            return Err("two runs overlap (a page is listed twice)".into());
        }
        Ok(Trace {
            object_len,
            page_size,
            name,
            version,
            runs,
        })
    }
}

/// `text` cut at `max` bytes (on a character boundary).
fn truncated(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` as a message shows it: control characters escaped, cut at
/// [`SHOWN`] characters.
fn shown(text: &str) -> String {
    let cut = truncated(text, SHOWN);
    let mut out = String::with_capacity(cut.len());
    for c in cut.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if cut.len() < text.len() {
        out.push_str("...");
    }
    out
}

/// One LEB128 integer.
fn uint(r: &mut &[u8]) -> Result<u64, String> {
    leb128::read::unsigned(r).map_err(|e| match e {
        leb128::read::Error::IoError(_) => "it is truncated".to_string(),
        leb128::read::Error::Overflow => "an integer is out of range".to_string(),
    })
}

/// `len` bytes of UTF-8.
fn text(r: &mut &[u8], len: u64) -> Result<String, String> {
    if len > MAX_TEXT || len > r.len() as u64 {
        return Err("a name or version is longer than the file allows".into());
    }
    let mut buf = vec![0; len as usize];
    r.read_exact(&mut buf)
        .map_err(|_| "it is truncated".to_string())?;
    String::from_utf8(buf).map_err(|_| "a name or version is not UTF-8".into())
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn trace(pages: &[u64]) -> Trace {
        Trace::from_pages(
            1 << 20,
            PageSize::Base,
            "obj",
            Some("etag \"x\"".into()),
            pages.iter().copied(),
        )
    }

    #[test]
    fn consecutive_pages_make_runs_in_touch_order() {
        let t = trace(&[5, 6, 7, 2, 9, 10, 3]);
        assert_eq!(t.runs(), &[5..8, 2..3, 9..11, 3..4]);
        assert_eq!(t.pages(), 7);
    }

    #[test]
    fn a_random_trace_costs_a_few_bytes_per_run() {
        // 1000 scattered pages of a 1 GiB object.
        let pages: Vec<u64> = (0..1000u64).map(|i| (i * 7919) % 262_144).collect();
        let t = Trace::from_pages(1 << 30, PageSize::Base, "o", None, pages);
        assert_eq!(t.runs().len(), 1000);
        assert!(t.to_bytes().len() < 5 * 1000, "{}", t.to_bytes().len());
    }

    #[test]
    fn damaged_and_foreign_files_are_refused() {
        let bytes = trace(&[1, 2, 3, 100]).to_bytes();
        let reason = |b: &[u8]| match Trace::from_bytes(b) {
            Err(TraceError::Format { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(reason(b"hello world, not a trace").contains("magic"));
        assert!(reason(&bytes[..10]).contains("truncated"));
        let mut flipped = bytes.clone();
        flipped[12] ^= 1;
        assert!(reason(&flipped).contains("checksum"));
        let mut newer = bytes.clone();
        newer[8] = 9;
        assert!(reason(&newer).contains("format version 9"));
        assert!(reason(&[]).contains("magic"));
    }

    #[test]
    fn runs_outside_the_object_or_overlapping_are_refused() {
        let outside = Trace::with_runs(4096 * 4, vec![0..2, 3..5]);
        let e = Trace::from_bytes(&outside.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("outside the object"), "{e}");
        let overlap = Trace::with_runs(4096 * 8, vec![0..3, 2..5]);
        let e = Trace::from_bytes(&overlap.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
    }

    #[test]
    fn replay_is_refused_on_another_length_or_version() {
        let t = trace(&[1]);
        t.check("obj", 1 << 20, Some("etag \"x\""), PageSize::Base)
            .unwrap();
        let e = t
            .check("obj2", 1 << 21, Some("etag \"x\""), PageSize::Base)
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("1048576 bytes") && msg.contains("2097152 bytes"),
            "{msg}"
        );
        let e = t
            .check("obj", 1 << 20, Some("etag \"y\""), PageSize::Base)
            .unwrap_err();
        assert!(e.to_string().contains("etag \"y\""), "{e}");
        let e = t.check("obj", 1 << 20, None, PageSize::Base).unwrap_err();
        assert!(e.to_string().contains("no version"), "{e}");
        // A file's own text is shown escaped and cut.
        let odd = Trace::from_pages(
            1,
            PageSize::Base,
            &format!("a\u{1b}[2J{}", "x".repeat(500)),
            None,
            [],
        );
        let e = odd
            .check("obj", 2, None, PageSize::Base)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a\\u{1b}[2J") && e.contains("...") && e.len() < 400,
            "{e}"
        );
        // Another page size: the runs count other pages.
        let e = t
            .check("obj", 1 << 20, Some("etag \"x\""), PageSize::Huge)
            .unwrap_err();
        assert!(e.to_string().contains("in 2 MiB pages"), "{e}");
    }

    #[test]
    fn a_trace_too_large_to_read_back_is_not_written() {
        // Runs 2^14 pages apart: 4 bytes each in the file, 4.5 million.
        let runs: Vec<Range<u64>> = (0..4_500_000u64).map(|i| i << 14..(i << 14) + 1).collect();
        let trace = Trace::with_runs(1 << 60, runs);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.trace");
        let e = trace.save(&path).unwrap_err();
        assert!(matches!(e, TraceError::Format { .. }), "{e:?}");
        assert!(e.to_string().contains("larger than a trace may be"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn saves_and_loads_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.trace");
        let t = trace(&[4, 5, 0]);
        t.save(&path).unwrap();
        assert_eq!(Trace::load(&path).unwrap(), t);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary left"
        );
        let e = Trace::load(dir.path().join("missing")).unwrap_err();
        assert!(matches!(e, TraceError::Io { op: "reading", .. }), "{e}");
    }

    proptest! {
        #[test]
        fn every_trace_survives_its_file(
            pages in proptest::sample::subsequence((0u64..4096).collect::<Vec<_>>(), 0..300)
                .prop_shuffle(),
            version in proptest::option::of("[a-z0-9\" ]{0,20}"),
        ) {
            let t = Trace::from_pages(4096 * 4096, PageSize::Base, "s3://b/k", version, pages.clone());
            prop_assert_eq!(t.pages(), pages.len() as u64);
            let flat: Vec<u64> = t.runs().iter().flat_map(|r| r.clone()).collect();
            prop_assert_eq!(&flat, &pages);
            prop_assert_eq!(Trace::from_bytes(&t.to_bytes()).unwrap(), t);
        }

        #[test]
        fn no_byte_string_panics_the_reader(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            count in 0u64..100,
            object_pages in 0u64..1000,
        ) {
            // Random bytes after the magic, and a valid header (so that the
            // runs' checks see random input) then random runs, each framed
            // with a good checksum so that decoding goes past it.
            let framed = |body: &[u8]| {
                let mut out = body.to_vec();
                out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
                out
            };
            let mut raw = MAGIC.to_vec();
            raw.push(FORMAT);
            raw.extend_from_slice(&bytes);
            let mut header = MAGIC.to_vec();
            header.push(FORMAT);
            for v in [4096, object_pages * 4096, 1] {
                leb128::write::unsigned(&mut header, v).unwrap();
            }
            header.push(b'n');
            leb128::write::unsigned(&mut header, 0).unwrap();
            leb128::write::unsigned(&mut header, count).unwrap();
            header.extend_from_slice(&bytes);
            for b in [framed(&raw), framed(&header), bytes.clone()] {
                if let Ok(t) = Trace::from_bytes(&b) {
                    // What is accepted is a valid trace: inside the object,
                    // disjoint.
                    let mut pages: Vec<u64> = t.runs().iter().flat_map(|r| r.clone()).collect();
                    prop_assert!(pages.iter().all(|&p| p < object_pages));
                    let n = pages.len();
                    pages.sort_unstable();
                    pages.dedup();
                    prop_assert_eq!(pages.len(), n);
                }
            }
        }
    }
}
