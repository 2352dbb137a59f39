//! The data every engine serves: one file, and a memfd copy of it.
//!
//! Either the user names a file (`--file`), or a file of `--size` bytes of
//! pseudo-random, non-zero content is written into a fresh temporary
//! directory, synced (so that writeback does not run during the
//! measurements), and removed when the benchmark ends. Non-zero, so that no
//! page is the zero page and every page is a real copy of data.
//!
//! The memfd copy is what `kernel-memfd` maps: the same bytes in 4 KiB shmem
//! pages, the like-for-like baseline for faultmap, whose cache is a memfd too.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use faultmap::{FileStore, Store};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use tempfile::TempDir;

/// The seed of the generated content.
pub const DATA_SEED: u64 = 0xfa17_0000;

/// Bytes generated and written per step.
const CHUNK: usize = 4 << 20;

/// The benchmark's data file.
#[derive(Debug)]
pub struct Data {
    /// Keeps the generated file's directory alive; removes it on drop.
    dir: Option<TempDir>,
    path: PathBuf,
    len: u64,
}

impl Data {
    /// Writes `len` bytes of pseudo-random non-zero content into a new
    /// temporary directory.
    pub fn generate(len: u64) -> Result<Data> {
        let dir = tempfile::Builder::new()
            .prefix("faultmap-bench.")
            .tempdir()
            .context("creating a temporary directory for the data file")?;
        let path = dir.path().join("data");
        let mut file =
            File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        write_random(&mut file, len)
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(Data {
            dir: Some(dir),
            path,
            len,
        })
    }

    /// Uses an existing file, which must be a non-empty regular file.
    pub fn existing(path: &Path) -> Result<Data> {
        let store = FileStore::open(path)?;
        if store.is_empty() {
            bail!(
                "{}: the file is empty, there is nothing to benchmark",
                path.display()
            );
        }
        Ok(Data {
            dir: None,
            path: path.to_path_buf(),
            len: store.len(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file was generated (and will be removed).
    pub fn generated(&self) -> bool {
        self.dir.is_some()
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Opens the file for reading.
    pub fn open(&self) -> Result<File> {
        File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))
    }

    /// A memfd holding a copy of the file.
    pub fn memfd_copy(&self) -> Result<File> {
        let mut memfd = faultmap::measure::memfd(c"faultmap-bench", self.len)
            .context("creating the memfd for kernel-memfd")?;
        let copied =
            io::copy(&mut self.open()?, &mut memfd).context("copying the data into the memfd")?;
        if copied != self.len {
            bail!(
                "{} changed size while being copied ({} bytes, then {copied})",
                self.path.display(),
                self.len
            );
        }
        Ok(memfd)
    }
}

/// Writes `len` pseudo-random bytes, none of them zero.
fn write_random(out: &mut impl Write, len: u64) -> io::Result<()> {
    let mut rng = StdRng::seed_from_u64(DATA_SEED);
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        let chunk = &mut buf[..n];
        rng.fill_bytes(chunk);
        for b in chunk.iter_mut() {
            *b |= u8::from(*b == 0);
        }
        out.write_all(chunk)?;
        left -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_non_zero_data_of_the_size_asked() {
        let data = Data::generate(CHUNK as u64 + 4097).unwrap();
        let bytes = std::fs::read(data.path()).unwrap();
        assert_eq!(bytes.len() as u64, data.len());
        assert!(bytes.iter().all(|&b| b != 0));
        let dir = data.path().parent().unwrap().to_path_buf();
        drop(data);
        assert!(!dir.exists());
    }

    #[test]
    fn refuses_empty_and_odd_files() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        File::create(&empty).unwrap();
        assert!(Data::existing(&empty).is_err());
        assert!(Data::existing(dir.path()).is_err());
    }
}
