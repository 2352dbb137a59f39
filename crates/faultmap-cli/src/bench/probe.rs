//! What the benchmark needs to know about the machine and the kernel's page
//! cache, read from `/proc` with plain file I/O.
//!
//! # Folios
//!
//! The kernel's page cache holds a file in 4 KiB folios or in large folios
//! (up to 2 MiB), depending on how it was read; large folios are mapped whole
//! per fault and cost 3-4x less per page, so a `kernel-file` baseline must say
//! which it measured. [`sample_folios`] looks at up to [`FOLIO_SAMPLES`]
//! pages of a mapping, spread evenly:
//!
//! ```text
//!   /proc/self/pagemap   8 bytes per virtual page: bits 0-54 PFN, bit 63 present
//!          │ PFN (0 without CAP_SYS_ADMIN)
//!          ▼
//!   /proc/kpageflags     8 bytes per PFN: bit 15 COMPOUND_HEAD,
//!                        bit 16 COMPOUND_TAIL, bit 22 THP
//! ```
//!
//! A page that belongs to a compound (head or tail) page is in a large folio.
//! Pages not present in the page table are skipped. When nothing could be
//! read (no privilege, no `/proc`) the answer is [`FolioKind::Unknown`].

use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::fs::FileExt;

use serde::Serialize;

use faultmap::PAGE_SIZE;

use crate::units;

/// How many pages [`sample_folios`] looks at.
pub const FOLIO_SAMPLES: usize = 64;

const PAGEMAP_PRESENT: u64 = 1 << 63;
const PAGEMAP_PFN_MASK: u64 = (1 << 55) - 1;
const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;

/// Facts about the machine for the report's header.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// The CPU's model name, if `/proc/cpuinfo` says.
    pub cpu_model: Option<String>,
    /// `MemTotal` of `/proc/meminfo`, in bytes.
    pub memory_bytes: Option<u64>,
    /// The base page size.
    pub page_size: usize,
}

impl Machine {
    /// Reads the facts; whatever cannot be read is left out.
    pub fn read() -> Machine {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Machine {
            kernel,
            cpus,
            cpu_model: proc_field("/proc/cpuinfo", "model name"),
            memory_bytes: proc_field("/proc/meminfo", "MemTotal")
                .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib * 1024),
            page_size: PAGE_SIZE,
        }
    }

    /// The reports' `machine` line: `Linux 6.8.0, 8 CPUs (model), 16 GiB memory`.
    pub fn line(&self) -> String {
        let mut line = format!("Linux {}, {} CPUs", self.kernel, self.cpus);
        if let Some(model) = &self.cpu_model {
            let _ = write!(line, " ({model})");
        }
        if let Some(mem) = self.memory_bytes {
            let _ = write!(line, ", {} memory", units::bytes(mem));
        }
        line
    }
}

/// The value of the first `key: value` line of a `/proc` file.
fn proc_field(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// What the sampled pages' folios were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FolioSample {
    /// Pages whose flags could be read.
    pub sampled: u32,
    /// Of those, pages in a large (compound) folio.
    pub large: u32,
}

/// The verdict on a [`FolioSample`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FolioKind {
    /// Most sampled pages are in large folios.
    Large,
    /// No sampled page is in a large folio.
    #[serde(rename = "4k")]
    Small,
    /// Some are, most are not.
    Mixed,
    /// Nothing could be read.
    Unknown,
}

impl FolioSample {
    /// Large if most sampled pages are compound, 4k if none is.
    pub fn kind(self) -> FolioKind {
        match (self.sampled, self.large) {
            (0, _) => FolioKind::Unknown,
            (_, 0) => FolioKind::Small,
            (n, l) if 2 * l > n => FolioKind::Large,
            _ => FolioKind::Mixed,
        }
    }

    /// Adds another sample's counts.
    pub fn merge(self, other: FolioSample) -> FolioSample {
        FolioSample {
            sampled: self.sampled + other.sampled,
            large: self.large + other.large,
        }
    }
}

impl FolioKind {
    /// The name used in the report and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            FolioKind::Large => "large",
            FolioKind::Small => "4k",
            FolioKind::Mixed => "mixed",
            FolioKind::Unknown => "unknown",
        }
    }
}

/// Samples the folios behind up to [`FOLIO_SAMPLES`] evenly spread pages of
/// `view`, a page-aligned mapping. Only pages present in this process's page
/// tables count: touch them first.
pub fn sample_folios(view: &[u8]) -> FolioSample {
    let (Ok(pagemap), Ok(kpageflags)) = (
        File::open("/proc/self/pagemap"),
        File::open("/proc/kpageflags"),
    ) else {
        return FolioSample::default();
    };
    let first_vpn = view.as_ptr() as u64 / PAGE_SIZE as u64;
    let mut sample = FolioSample::default();
    for page in sample_pages(view.len()) {
        let Some(entry) = read_u64(&pagemap, (first_vpn + page as u64) * 8) else {
            continue;
        };
        let pfn = entry & PAGEMAP_PFN_MASK;
        if entry & PAGEMAP_PRESENT == 0 || pfn == 0 {
            continue;
        }
        let Some(flags) = read_u64(&kpageflags, pfn * 8) else {
            continue;
        };
        sample.sampled += 1;
        if flags & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) != 0 {
            sample.large += 1;
        }
    }
    sample
}

/// Up to [`FOLIO_SAMPLES`] page indices spread evenly over `len` bytes.
pub fn sample_pages(len: usize) -> impl Iterator<Item = usize> {
    let pages = len.div_ceil(PAGE_SIZE);
    let n = pages.min(FOLIO_SAMPLES);
    (0..n).map(move |i| i * pages / n)
}

fn read_u64(file: &File, offset: u64) -> Option<u64> {
    let mut buf = [0u8; 8];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(u64::from_ne_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_samples() {
        let s = |sampled, large| FolioSample { sampled, large };
        assert_eq!(s(0, 0).kind(), FolioKind::Unknown);
        assert_eq!(s(64, 0).kind(), FolioKind::Small);
        assert_eq!(s(64, 64).kind(), FolioKind::Large);
        assert_eq!(s(64, 33).kind(), FolioKind::Large);
        assert_eq!(s(64, 32).kind(), FolioKind::Mixed);
        assert_eq!(s(2, 1).merge(s(2, 2)), s(4, 3));
    }

    #[test]
    fn samples_spread_over_the_range() {
        assert_eq!(sample_pages(0).count(), 0);
        assert_eq!(sample_pages(3 * PAGE_SIZE).collect::<Vec<_>>(), [0, 1, 2]);
        let many: Vec<_> = sample_pages(1 << 30).collect();
        assert_eq!(many.len(), FOLIO_SAMPLES);
        assert_eq!(many[1], 4096);
    }

    #[test]
    fn heap_pages_are_sampled_or_unknown() {
        let v = vec![1u8; 64 * PAGE_SIZE];
        let s = sample_folios(&v);
        assert!(s.sampled <= FOLIO_SAMPLES as u32);
    }
}
