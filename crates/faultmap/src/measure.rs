//! Helpers for benchmarks that compare faultmap with the kernel's own
//! mappings of the same data and with the device itself. Their system calls
//! live in the `sys` module with all the others.

use std::fs::File;
use std::io;
use std::path::Path;

pub use crate::sys::{mincore_resident, rusage_faults};

/// A close-on-exec memfd of `len` bytes named `name`, as a file: the
/// like-for-like kernel baseline (shmem pages, as faultmap's cache).
pub fn memfd(name: &std::ffi::CStr, len: u64) -> io::Result<File> {
    crate::sys::memfd_create(name, len).map(File::from)
}

/// The device's sequential read rate for `path`: reads the whole file with
/// O_DIRECT (bypassing the page cache, whatever it holds) in `chunk`-byte
/// requests, several in flight through io_uring
/// ([`crate::FileStore::direct_read_rate`]). Returns the bytes read and the
/// seconds it took.
pub fn direct_read_rate(path: &Path, chunk: usize) -> io::Result<(u64, f64)> {
    crate::FileStore::direct_read_rate(path, chunk).map_err(io::Error::other)
}
