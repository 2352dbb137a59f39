//! Cold reads of one file through `FileStore` in each I/O mode: the
//! measurement behind `FileIo::default()` and `FileStore::io_pages()`.
//!
//! ```text
//! cargo run --release -p faultmap --example io_modes -- FILE [REPS] [MODES]
//! ```
//!
//! MODES is a comma-separated list (default `buffered,direct,uring`); an
//! empty one measures the device column alone.
//!
//! FILE is made (1 GiB) if it does not exist. Before every cell the kernel's
//! page cache is dropped (root only). Reads land in a fresh memfd mapping as
//! long as the file, at the file's offsets, as the pager's cache alias: every
//! read fills pages never touched before. Sequential cells read the whole
//! file with requests of 256 KiB, 1 MiB or 8 MiB taken in order from a shared
//! counter by 1 or 4 threads, as the pager's I/O workers take a readahead
//! window's requests; random cells read 4 KiB pages at random offsets. The
//! device column is `FileStore::direct_read_rate`. Each cell runs REPS times
//! (default 5), interleaved; the table shows medians, with the range.

use std::error::Error;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use faultmap::{FileStore, Store, StoreError};

const FILE_LEN: u64 = 1 << 30;
const SIZES: [usize; 3] = [256 << 10, 1 << 20, 8 << 20];
const THREADS: [usize; 2] = [1, 4];
const RANDOM_READS_PER_THREAD: usize = 3000;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: io_modes FILE [REPS] [MODES]")?;
    let path = Path::new(&path);
    let reps: usize = args.next().map_or(Ok(5), |r| r.parse())?;
    let modes: Vec<String> = args.next().map_or_else(
        || vec!["buffered".into(), "direct".into(), "uring".into()],
        |m| {
            m.split(',')
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect()
        },
    );
    if !path.exists() {
        make_file(path)?;
    }
    // (name, samples): GB/s for sequential and device cells, K reads/s for random.
    let mut cells: Vec<(String, Vec<f64>)> = Vec::new();
    let mut record = |name: String, value: f64| match cells.iter_mut().find(|c| c.0 == name) {
        Some(cell) => cell.1.push(value),
        None => cells.push((name, vec![value])),
    };
    for rep in 0..reps {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        eprintln!("repetition {} of {reps}, load {load}", rep + 1);
        for &size in &SIZES {
            drop_caches()?;
            let (bytes, secs) = FileStore::direct_read_rate(path, size)?;
            record(
                format!("device | {} |", kib(size)),
                bytes as f64 / secs / 1e9,
            );
        }
        for mode in &modes {
            for &size in &SIZES {
                for &threads in &THREADS {
                    let store = open(path, mode)?;
                    let gbps = sequential(&store, size, threads)?;
                    record(format!("{mode} seq {threads}t | {} |", kib(size)), gbps);
                }
            }
            for &threads in &THREADS {
                let store = open(path, mode)?;
                let kreads = random(&store, threads)?;
                record(format!("{mode} rand {threads}t | 4 KiB |"), kreads);
            }
        }
    }
    println!("| cell | request | median | range |\n|---|---|---|---|");
    for (name, mut samples) in cells {
        samples.sort_by(f64::total_cmp);
        let unit = if name.contains("rand") {
            "K reads/s"
        } else {
            "GB/s"
        };
        let (lo, mid, hi) = (
            samples[0],
            samples[samples.len() / 2],
            samples[samples.len() - 1],
        );
        println!("| {name} {mid:.2} {unit} | {lo:.2}–{hi:.2} |");
    }
    Ok(())
}

/// Drops the caches, then opens `path` in `mode`.
fn open(path: &Path, mode: &str) -> Result<FileStore, Box<dyn Error>> {
    drop_caches()?;
    let store = FileStore::open_with(path, mode.parse()?)?;
    if store.io().to_string() != mode {
        return Err(format!("{mode} fell back to {}", store.io()).into());
    }
    Ok(store)
}

/// Reads the whole store in `size`-byte requests from `threads` threads
/// sharing one cursor; returns GB/s.
fn sequential(store: &FileStore, size: usize, threads: usize) -> Result<f64, Box<dyn Error>> {
    let alias = Alias::new(store.len())?;
    let cursor = AtomicU64::new(0);
    let start = Instant::now();
    on_threads(threads, |_| loop {
        let offset = cursor.fetch_add(size as u64, Ordering::Relaxed);
        if offset >= store.len() {
            return Ok(());
        }
        let len = size.min((store.len() - offset) as usize);
        // SAFETY: the cursor hands each range to one thread.
        store.read_at(offset, unsafe { alias.range(offset, len) })?;
    })?;
    Ok(store.len() as f64 / start.elapsed().as_secs_f64() / 1e9)
}

/// Reads random 4 KiB pages from `threads` threads; returns thousands of
/// reads per second.
fn random(store: &FileStore, threads: usize) -> Result<f64, Box<dyn Error>> {
    let alias = Alias::new(store.len())?;
    let pages = store.len() / 4096 / threads as u64;
    let start = Instant::now();
    on_threads(threads, |t| {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ ((t as u64) << 17);
        for _ in 0..RANDOM_READS_PER_THREAD {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let page = (rng % pages) * threads as u64 + t as u64;
            // SAFETY: thread t reads only pages congruent to t.
            store.read_at(page * 4096, unsafe { alias.range(page * 4096, 4096) })?;
        }
        Ok(())
    })?;
    let reads = (threads * RANDOM_READS_PER_THREAD) as f64;
    Ok(reads / start.elapsed().as_secs_f64() / 1e3)
}

/// Runs `body(thread index)` on `threads` threads and waits for them all.
fn on_threads(
    threads: usize,
    body: impl Fn(usize) -> Result<(), StoreError> + Sync,
) -> Result<(), Box<dyn Error>> {
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let body = &body;
                s.spawn(move || body(t))
            })
            .collect();
        for worker in workers {
            worker.join().map_err(|_| "a reader panicked")??;
        }
        Ok(())
    })
}

/// A fresh `MAP_SHARED` mapping of a memfd: the pager's cache alias.
struct Alias {
    ptr: *mut u8,
    len: usize,
    _memfd: std::fs::File,
}

// SAFETY: the mapping is plain shared memory; `range` says who may write
// which part.
unsafe impl Sync for Alias {}

impl Alias {
    fn new(len: u64) -> std::io::Result<Self> {
        let memfd = faultmap::measure::memfd(c"io_modes", len)?;
        let len = len as usize;
        // SAFETY: a new shared mapping of our own memfd, at an address the
        // kernel picks.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
            _memfd: memfd,
        })
    }

    /// The bytes at `[offset, offset + len)`.
    ///
    /// # Safety
    ///
    /// No other live slice from `range` may overlap it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, offset: u64, len: usize) -> &mut [u8] {
        assert!(offset as usize + len <= self.len);
        // SAFETY: inside the mapping (asserted), which lives as long as
        // `self`; the caller keeps slices disjoint.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset as usize), len) }
    }
}

impl Drop for Alias {
    fn drop(&mut self) {
        // SAFETY: our mapping; the slices borrowed from it are gone.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn kib(size: usize) -> String {
    match size {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

fn drop_caches() -> std::io::Result<()> {
    std::fs::write("/proc/sys/vm/drop_caches", "3")
}

/// Writes FILE_LEN bytes that no layer below can compress or dedupe.
fn make_file(path: &Path) -> std::io::Result<()> {
    eprintln!("making {} ({} MiB)", path.display(), FILE_LEN >> 20);
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..FILE_LEN >> 20 {
        for word in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        file.write_all(&block)?;
    }
    file.into_inner().map_err(|e| e.into_error())?.sync_all()
}
