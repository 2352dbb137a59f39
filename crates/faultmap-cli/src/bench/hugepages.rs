//! The huge pages a benchmark of 2 MiB pages needs, reserved for the run.
//!
//! faultmap's 2 MiB pages come from the kernel's pool of huge pages, which
//! only root can grow (`/proc/sys/vm/nr_hugepages`). [`Reservation`] holds
//! the pool ([`HugePagePool`]: a lock file shared with the project's
//! tests) for the run, grows it by what the data needs and takes as much
//! out again when dropped; without root (or when the kernel cannot find
//! the memory) it says why, and the benchmark leaves the 2 MiB columns out
//! with that line.

use faultmap::measure::HugePagePool;
use faultmap::HUGE_PAGE_SIZE;

/// The pool held for the run, grown by what it lacked.
#[derive(Debug)]
pub struct Reservation {
    _pool: HugePagePool,
}

impl Reservation {
    /// Holds the pool and grows it by the huge pages that `bytes` of data
    /// take (and one more, for the tail), less those it has free already.
    pub fn for_bytes(bytes: u64) -> Result<Reservation, String> {
        let need = bytes.div_ceil(HUGE_PAGE_SIZE as u64) + 1;
        let mut pool = HugePagePool::lock()
            .map_err(|e| format!("cannot lock {} ({e})", faultmap::measure::HUGE_POOL_LOCK))?;
        let available = HugePagePool::available()
            .ok_or_else(|| "this kernel has no pool of 2 MiB pages".to_string())?;
        let short = need.saturating_sub(available);
        pool.grow(short).map_err(|e| {
            format!(
                "{need} huge pages of 2 MiB are needed and the pool cannot be grown by {short} \
                 ({e}; root can, through /proc/sys/vm/nr_hugepages)"
            )
        })?;
        Ok(Reservation { _pool: pool })
    }
}
