//! The huge pages a benchmark of 2 MiB pages needs, reserved for the run.
//!
//! faultmap's 2 MiB pages come from the kernel's pool of huge pages, which
//! only root can grow (`/proc/sys/vm/nr_hugepages`). [`Reservation`] grows
//! the pool by what the data needs and gives it back when dropped; without
//! root (or when the kernel cannot find the memory) it says why, and the
//! benchmark leaves the 2 MiB columns out with that line.

use faultmap::HUGE_PAGE_SIZE;

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Huge pages added to the pool for the run; the old size comes back on
/// drop.
#[derive(Debug)]
pub struct Reservation {
    old: u64,
}

impl Reservation {
    /// Grows the pool by the huge pages that `bytes` of data take (and one
    /// more, for the tail), unless it has that many free already.
    pub fn for_bytes(bytes: u64) -> Result<Reservation, String> {
        let need = bytes.div_ceil(HUGE_PAGE_SIZE as u64) + 1;
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
        let reservation = Reservation { old };
        let got = read(NR_HUGEPAGES)?;
        if got < want {
            return Err(format!(
                "{need} huge pages of 2 MiB are needed and the kernel found memory for {} of \
                 {short} more",
                got - old
            ));
        }
        Ok(reservation)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.old.to_string());
    }
}

fn read(path: &str) -> Result<u64, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{path} cannot be read ({e}): this kernel has no 2 MiB pool"))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{path} says {text:?}, not a number"))
}
