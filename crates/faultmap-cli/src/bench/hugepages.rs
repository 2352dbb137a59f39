//! The huge pages a benchmark of 2 MiB pages needs, reserved for the run.
//!
//! faultmap's 2 MiB pages come from the kernel's pool of huge pages, which
//! only root can grow (`/proc/sys/vm/nr_hugepages`). [`Reservation`] grows
//! the pool by what the data needs (under a lock file shared with the
//! project's tests) and takes as much out again when dropped; without
//! root (or when the kernel cannot find the memory) it says why, and the
//! benchmark leaves the 2 MiB columns out with that line.

use std::fs::File;
use std::os::fd::AsRawFd;

use faultmap::HUGE_PAGE_SIZE;

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// The lock file that this project's tests and benchmarks hold while they
/// change the pool: each grows it by what it needs and shrinks it by as
/// much, never writing back a size it read earlier.
const POOL_LOCK: &str = "/tmp/faultmap-hugepages.lock";

/// Huge pages added to the pool for the run (under the pool's lock, held
/// until the drop), taken out again on drop.
#[derive(Debug)]
pub struct Reservation {
    added: u64,
    _lock: File,
}

impl Reservation {
    /// Grows the pool by the huge pages that `bytes` of data take (and one
    /// more, for the tail), less those it has free already.
    pub fn for_bytes(bytes: u64) -> Result<Reservation, String> {
        let need = bytes.div_ceil(HUGE_PAGE_SIZE as u64) + 1;
        // Read-only if it exists (flock needs no more, and a file another
        // user made stays usable), else made.
        let lock = File::open(POOL_LOCK)
            .or_else(|_| {
                File::options()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(POOL_LOCK)
            })
            .map_err(|e| format!("cannot open {POOL_LOCK} ({e})"))?;
        // SAFETY: flock on a descriptor this File owns, for the call.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!(
                "cannot lock {POOL_LOCK} ({})",
                std::io::Error::last_os_error()
            ));
        }
        let old = read(NR_HUGEPAGES)?;
        let free = read("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")?;
        let reserved = read("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages")?;
        let short = need.saturating_sub(free.saturating_sub(reserved));
        let want = old + short;
        if short > 0 {
            std::fs::write(NR_HUGEPAGES, want.to_string()).map_err(|e| {
                format!(
                    "{need} huge pages of 2 MiB are needed and {NR_HUGEPAGES} cannot be raised \
                     to {want} ({e}; root can)"
                )
            })?;
        }
        // What the kernel added (perhaps less than asked) is what the drop
        // takes out again.
        let got = read(NR_HUGEPAGES)?;
        let reservation = Reservation {
            added: got.saturating_sub(old),
            _lock: lock,
        };
        if got < want {
            return Err(format!(
                "{need} huge pages of 2 MiB are needed and the kernel found memory for {} of \
                 {short} more",
                got.saturating_sub(old)
            ));
        }
        Ok(reservation)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.added == 0 {
            return;
        }
        if let Ok(now) = read(NR_HUGEPAGES) {
            let _ = std::fs::write(NR_HUGEPAGES, now.saturating_sub(self.added).to_string());
        }
    }
}

fn read(path: &str) -> Result<u64, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{path} cannot be read ({e}): this kernel has no 2 MiB pool"))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{path} says {text:?}, not a number"))
}
