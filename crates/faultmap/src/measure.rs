//! Helpers for benchmarks that compare faultmap with the kernel's own
//! mappings of the same data and with the device itself. Their system calls
//! live in the `sys` module with all the others.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

pub use crate::sys::{mincore_resident, rusage_faults};

/// A close-on-exec memfd of `len` bytes named `name`, as a file: the
/// like-for-like kernel baseline (shmem pages, as faultmap's cache).
pub fn memfd(name: &std::ffi::CStr, len: u64) -> io::Result<File> {
    crate::sys::memfd_create(name, len).map(File::from)
}

/// The device's sequential read rate for `path`: reads the whole file with
/// O_DIRECT (bypassing the page cache, whatever it holds) in `chunk`-byte
/// requests, one after another. Returns the bytes read and the seconds it
/// took. `chunk` is rounded up to a multiple of 4 KiB.
pub fn direct_read_rate(path: &Path, chunk: usize) -> io::Result<(u64, f64)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let chunk = chunk.max(1).next_multiple_of(4096);
    // O_DIRECT needs a block-aligned buffer: take an aligned window of a
    // slightly larger vector.
    let mut raw = vec![0u8; chunk + 4096];
    let skew = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[skew..skew + chunk];
    let start = Instant::now();
    let mut offset = 0u64;
    loop {
        match file.read_at(buf, offset) {
            Ok(0) => break,
            Ok(n) => offset += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok((offset, start.elapsed().as_secs_f64()))
}
