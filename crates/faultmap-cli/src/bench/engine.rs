//! The engines that serve the benchmark's data, and one measurement of one.
//!
//! | engine         | what a thread's view is                     | faults counted by            |
//! |----------------|---------------------------------------------|------------------------------|
//! | `kernel-file`  | kernel `mmap` of the data file              | `getrusage` minor faults      |
//! | `kernel-memfd` | kernel `mmap` of a memfd copy (4 KiB shmem) | `getrusage` minor faults      |
//! | `uffd-probe`   | the memfd copy registered MINOR with a bare | `getrusage` minor faults      |
//! |                | userfaultfd handler, the walking thread     | (one per page touched)        |
//! |                | pinned on its CPU (`same-cpu`) or another   |                               |
//! |                | (`cross-cpu`)                               |                               |
//! | `faultmap`     | a faultmap mapping at fault-around order N, | the mappings' `pgfault`       |
//! |                | through the pager of its delivery mode      |                               |
//! | `faultmap`     | the same with 2 MiB pages (`page=2M`): a    | the mappings' `pgfault`       |
//! | (`page=2M`)    | hugetlb cache, one fault per 2 MiB          |                               |
//!
//! All measure *warm* minor faults: the data is in memory and only the page
//! tables are empty.
//!
//! - `kernel-file`'s page cache is re-read right before every measurement,
//!   because this machine's DAMON evicts page-cache pages idle for about a
//!   minute; residency is then checked with `mincore`, and the folios of a
//!   few pages are sampled (large or 4 KiB: see [`super::probe`]).
//! - `kernel-memfd`'s pages are shmem, never reclaimed here (no swap).
//! - `uffd-probe` maps that same memfd; its probes, one per CPU, are
//!   started once ([`super::uffd_probe`] has the placement of the threads).
//! - faultmap's data is opened as one [`Object`] whose cache (a memfd) is
//!   filled once, before any measurement, through an order-9 mapping. Each
//!   delivery mode has its own pager; all of them map that one object.
//!   With `--page-size 2M`, a second object over the same file has 2 MiB
//!   pages (its huge pages reserved by [`super::hugepages`]), filled the
//!   same way.
//!
//! # One measurement ([`Engines::measure`])
//!
//! 0. Sleep [`SETTLE`], so that the previous measurement's teardown (the
//!    kernel frees a walked gigabyte's page tables after an RCU grace
//!    period, in the background) does not run during this one's walk.
//! 1. Map one fresh view per thread (so each faults again), and for
//!    `kernel-file` re-warm the page cache. Untimed.
//! 2. Run the workload on the views ([`run_timed`]). Timed.
//! 3. Read the fault counts, then drop the views. Untimed.
//!
//! `uffd-probe` takes the same steps in [`Probes::measure`], its walking
//! threads pinned for step 2.

use std::fs::File;
use std::hint::black_box;
use std::ops::Deref;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use crate::Fault;
use anyhow::{bail, Context, Result};
use faultmap::policy::fault_around::{AUTO, MAX_ORDER};
use faultmap::{FileStore, MapOptions, Mapping, Object, PageSize, Pager, Stats, PAGE_SIZE};
use memmap2::Mmap;

use super::data::Data;
use super::grid::{Column, Sample};
use super::probe::{self, FolioSample};
use super::uffd_probe::{ProbeCpu, Probes};
use super::workload::{run_timed, Plan};

/// Bytes read per `pread` when re-warming the file's page cache.
const REWARM_CHUNK: usize = 8 << 20;

/// The pause before every measurement. Measured on sparse (0.5 % of the
/// walks' pages, 3 to 5 ms a walk) without it: a column measured right
/// after order 9 with handler delivery (a whole gigabyte mapped, then
/// unmapped, twice with 2 threads) ran 20 to 40 % slower than the same
/// order elsewhere in the row; with it, 0 to 12 % in the runs since. It
/// lowers the effect, it does not remove it all.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// One way of serving the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The kernel's mmap of the data file.
    KernelFile,
    /// The kernel's mmap of a memfd holding the same data.
    KernelMemfd,
    /// That memfd through a bare userfaultfd handler, the walking thread
    /// on the handler's CPU or another.
    UffdProbe(ProbeCpu),
    /// faultmap at a fault-around order, with a delivery mode, in pages
    /// of a size.
    Faultmap {
        /// The fault-around order (windows of `2^order` pages; moot with
        /// 2 MiB pages, where it is 0).
        order: u8,
        /// How faults reach the pager.
        delivery: Fault,
        /// The object's page size.
        page: PageSize,
    },
}

impl Engine {
    /// The engines of a run: the two kernel baselines, the uffd-probe at
    /// each placement of `probes`, then faultmap with 4 KiB pages (if
    /// `pages` has them) at each order, in each delivery mode, then with
    /// 2 MiB pages (if `pages` has them) in each delivery mode.
    pub fn all(
        orders: &[u8],
        deliveries: &[Fault],
        probes: &[ProbeCpu],
        pages: &[PageSize],
    ) -> Vec<Engine> {
        let mut engines = vec![Engine::KernelFile, Engine::KernelMemfd];
        engines.extend(probes.iter().map(|&cpu| Engine::UffdProbe(cpu)));
        if pages.contains(&PageSize::Base) {
            for &order in orders {
                engines.extend(deliveries.iter().map(|&delivery| Engine::Faultmap {
                    order,
                    delivery,
                    page: PageSize::Base,
                }));
            }
        }
        if pages.contains(&PageSize::Huge) {
            engines.extend(deliveries.iter().map(|&delivery| Engine::Faultmap {
                order: 0,
                delivery,
                page: PageSize::Huge,
            }));
        }
        engines
    }

    /// The page size of faultmap's object (`None` for the other engines).
    pub fn page_size(self) -> Option<PageSize> {
        match self {
            Engine::Faultmap { page, .. } => Some(page),
            Engine::KernelFile | Engine::KernelMemfd | Engine::UffdProbe(_) => None,
        }
    }

    /// The `engine` field of a JSON row.
    pub fn name(self) -> &'static str {
        match self {
            Engine::KernelFile => "kernel-file",
            Engine::KernelMemfd => "kernel-memfd",
            Engine::UffdProbe(_) => "uffd-probe",
            Engine::Faultmap { .. } => "faultmap",
        }
    }

    /// The fault-around order, for faultmap at a fixed order (adaptive
    /// fault-around has none: its JSON rows say `order=auto` in the
    /// variant).
    pub fn order(self) -> Option<u8> {
        match self {
            Engine::Faultmap {
                order,
                page: PageSize::Base,
                ..
            } if order != AUTO => Some(order),
            Engine::Faultmap { .. }
            | Engine::KernelFile
            | Engine::KernelMemfd
            | Engine::UffdProbe(_) => None,
        }
    }
}

impl Column for Engine {
    /// `order=N` for faultmap (the delivery mode goes on a second heading
    /// line, as the uffd-probe's placement does).
    fn heading(self) -> String {
        match self {
            Engine::KernelFile | Engine::KernelMemfd | Engine::UffdProbe(_) => self.name().into(),
            Engine::Faultmap {
                page: PageSize::Huge,
                ..
            } => "page=2M".into(),
            Engine::Faultmap { order, .. } => format!("order={}", crate::order_name(order)),
        }
    }

    /// `same-cpu` or `cross-cpu` for the uffd-probe.
    fn subheading(self) -> &'static str {
        match self {
            Engine::UffdProbe(cpu) => cpu.heading(),
            Engine::KernelFile | Engine::KernelMemfd | Engine::Faultmap { .. } => "",
        }
    }

    fn engine(self) -> &'static str {
        self.name()
    }

    /// `order=N` (`page=2M` with 2 MiB pages), and `,delivery=handler`
    /// when the delivery is not the library's default; `cpu=same` or
    /// `cpu=cross` for the uffd-probe.
    fn variant(self) -> String {
        match self {
            Engine::KernelFile | Engine::KernelMemfd => "default".into(),
            Engine::UffdProbe(cpu) => format!("cpu={}", cpu.name()),
            Engine::Faultmap {
                order,
                delivery,
                page,
            } => {
                let mut v = match page {
                    PageSize::Base => format!("order={}", crate::order_name(order)),
                    PageSize::Huge => "page=2M".into(),
                };
                if delivery != Fault::default() {
                    v += &format!(",delivery={}", crate::delivery_name(delivery));
                }
                v
            }
        }
    }

    fn delivery(self) -> Option<Fault> {
        match self {
            Engine::Faultmap { delivery, .. } => Some(delivery),
            Engine::KernelFile | Engine::KernelMemfd | Engine::UffdProbe(_) => None,
        }
    }
}

/// How faultmap's cache was filled before the measurements.
#[derive(Clone, Copy, Debug)]
pub struct WarmUp {
    /// Wall time of the fill.
    pub seconds: f64,
    /// The object's counters after the fill (its store reads).
    pub stats: Stats,
    /// Percent of the object's pages cached after it.
    pub cached_pct: f64,
}

/// A thread's view of the data: a kernel mapping or a faultmap mapping.
enum View {
    Kernel(Mmap),
    Faultmap(Mapping),
}

impl Deref for View {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            View::Kernel(m) => m,
            View::Faultmap(m) => m,
        }
    }
}

/// Every engine's state, kept for the whole benchmark.
pub struct Engines {
    len: usize,
    file: File,
    memfd: File,
    /// One pager per delivery mode measured.
    pagers: Vec<(Fault, Pager)>,
    object: Object,
    /// The same file with 2 MiB pages (`--page-size 2M`).
    huge: Option<Object>,
    warm_up: WarmUp,
    /// How `huge`'s cache was filled.
    huge_warm_up: Option<WarmUp>,
    /// The uffd-probe's handlers, over `memfd`.
    probes: Probes,
    rewarm_buf: Vec<u8>,
}

impl Engines {
    /// Sets up every engine over `data`: opens the file, copies it into a
    /// memfd, starts the uffd-probes over that memfd for walks of up to
    /// `threads` threads, opens the file as a faultmap object and fills
    /// that object's cache (through the first pager; `pagers` must not be
    /// empty), and with `huge` a second object of 2 MiB pages over the
    /// file, filled too (its huge pages reserved by the caller).
    pub fn new(
        data: &Data,
        pagers: Vec<(Fault, Pager)>,
        threads: usize,
        huge: bool,
    ) -> Result<Engines> {
        let len = usize::try_from(data.len()).context("the file does not fit the address space")?;
        let file = data.open()?;
        let memfd = data.memfd_copy()?;
        let probes = Probes::start(&memfd, len, threads)?;
        let (_, first) = pagers.first().context("no pager to measure")?;
        let object = first.open(FileStore::open(data.path())?)?;
        let warm_up = warm_object(first, &object)?;
        let (huge, huge_warm_up) = if huge {
            let object = first
                .open_with_page_size(FileStore::open(data.path())?, PageSize::Huge)
                .context("opening the data with 2 MiB pages")?;
            let warm_up = warm_object(first, &object)?;
            (Some(object), Some(warm_up))
        } else {
            (None, None)
        };
        Ok(Engines {
            len,
            file,
            memfd,
            pagers,
            object,
            huge,
            warm_up,
            huge_warm_up,
            probes,
            rewarm_buf: vec![0; REWARM_CHUNK],
        })
    }

    /// How faultmap's cache was filled.
    pub fn warm_up(&self) -> WarmUp {
        self.warm_up
    }

    /// How the cache of 2 MiB pages was filled, if there is one.
    pub fn huge_warm_up(&self) -> Option<WarmUp> {
        self.huge_warm_up
    }

    /// The uffd-probe's handlers.
    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    /// Measures `engine` running `plan` with `threads` threads (see the
    /// module documentation for the steps).
    pub fn measure(&mut self, engine: Engine, plan: &Plan, threads: usize) -> Result<Sample> {
        // 0. Let the previous sample's teardown end (SETTLE).
        std::thread::sleep(SETTLE);
        if let Engine::UffdProbe(cpu) = engine {
            return self.probes.measure(cpu, plan, threads);
        }
        // 1. Fresh views; re-warm kernel-file's page cache.
        let views = self.views(engine, threads)?;
        let cache = match engine {
            Engine::KernelFile => Some(self.rewarm_file()?),
            Engine::KernelMemfd | Engine::UffdProbe(_) | Engine::Faultmap { .. } => None,
        };
        // 2. The timed walk.
        let slices: Vec<&[u8]> = views.iter().map(|v| &**v).collect();
        let timed = run_timed(plan, &slices)?;
        // 3. Fault counts.
        let mut sample = Sample {
            seconds: timed.seconds,
            faults: Some(timed.minor_faults),
            major_faults: Some(timed.major_faults),
            resident_pct: cache.map(|c| c.0),
            folios: cache.map(|c| c.1),
            checksum: Some(timed.checksum),
            ..Sample::default()
        };
        if let Engine::KernelMemfd = engine {
            sample.folios = Some(probe::sample_folios(&views[0]));
        }
        if let Engine::Faultmap { .. } = engine {
            add_faultmap_counts(&mut sample, &views);
        }
        Ok(sample)
    }

    /// One fresh view of the data per thread.
    fn views(&self, engine: Engine, threads: usize) -> Result<Vec<View>> {
        (0..threads)
            .map(|_| match engine {
                Engine::KernelFile => kernel_map(&self.file).map(View::Kernel),
                Engine::KernelMemfd => kernel_map(&self.memfd).map(View::Kernel),
                Engine::UffdProbe(_) => bail!("the uffd-probe maps its own views"),
                Engine::Faultmap {
                    order,
                    delivery,
                    page: PageSize::Base,
                } => crate::map_readonly(
                    self.pager(delivery)?,
                    &self.object,
                    crate::order_options(order),
                )
                .map(View::Faultmap)
                .context("mapping the data through faultmap"),
                Engine::Faultmap {
                    delivery,
                    page: PageSize::Huge,
                    ..
                } => crate::map_readonly(
                    self.pager(delivery)?,
                    self.huge.as_ref().context("no object of 2 MiB pages")?,
                    MapOptions::new(),
                )
                .map(View::Faultmap)
                .context("mapping the data through faultmap with 2 MiB pages"),
            })
            .collect()
    }

    /// The pager of a delivery mode.
    fn pager(&self, delivery: Fault) -> Result<&Pager> {
        self.pagers
            .iter()
            .find(|(d, _)| *d == delivery)
            .map(|(_, p)| p)
            .with_context(|| format!("no pager for {} delivery", crate::delivery_name(delivery)))
    }

    /// Reads the whole file so its page cache is warm, then returns the
    /// percentage of its pages resident and a sample of their folios.
    fn rewarm_file(&mut self) -> Result<(f64, FolioSample)> {
        read_all(&self.file, &mut self.rewarm_buf).context("re-reading the data file")?;
        let probe_map = kernel_map(&self.file)?;
        let resident = faultmap::measure::mincore_resident(probe_map.as_ptr(), probe_map.len())
            .context("mincore")?;
        let pages = self.len.div_ceil(PAGE_SIZE);
        touch_samples(&probe_map);
        let folios = probe::sample_folios(&probe_map);
        Ok((100.0 * resident as f64 / pages as f64, folios))
    }
}

/// Maps `file` read-only and shared with the kernel's mmap.
pub(super) fn kernel_map(file: &File) -> Result<Mmap> {
    // SAFETY: memmap2 requires that the file is not truncated or modified
    // while mapped. The benchmark's files are a generated file in its own
    // temporary directory, its own memfd, or a file the user named and was
    // told (`--file`'s help) must not change during the run; nothing in this
    // process writes to any of them once the engines are set up.
    unsafe { Mmap::map(file) }.context("mmap")
}

/// Touches the pages [`probe::sample_folios`] will look at, so they are
/// present in this process's page tables.
fn touch_samples(view: &[u8]) {
    for page in probe::sample_pages(view.len()) {
        black_box(view[page * PAGE_SIZE]);
    }
}

/// Reads all of `file` into `buf`-sized chunks, discarding the bytes.
fn read_all(file: &File, buf: &mut [u8]) -> std::io::Result<()> {
    let mut offset = 0u64;
    loop {
        match file.read_at(buf, offset)? {
            0 => return Ok(()),
            n => offset += n as u64,
        }
    }
}

/// Fills `object`'s cache through one order-9 mapping, touching one byte
/// per page.
pub(super) fn warm_object(pager: &Pager, object: &Object) -> Result<WarmUp> {
    let start = Instant::now();
    let map = crate::map_readonly(
        pager,
        object,
        MapOptions::new().fault_around_order(MAX_ORDER),
    )
    .context("mapping the data through faultmap")?;
    let mut x = 0u8;
    for i in (0..map.len()).step_by(PAGE_SIZE) {
        x ^= map[i];
    }
    black_box(x);
    drop(map);
    let page = object.page_size().bytes() as u64;
    let pages = object.len().div_ceil(page).max(1);
    Ok(WarmUp {
        seconds: start.elapsed().as_secs_f64(),
        stats: object.stats(),
        cached_pct: 100.0 * object.cached_bytes() as f64 / (pages * page) as f64,
    })
}

/// Sets a faultmap sample's counts from its mappings' counters.
fn add_faultmap_counts(sample: &mut Sample, views: &[View]) {
    let mut total = Stats::default();
    for view in views {
        if let View::Faultmap(m) = view {
            let s = m.stats();
            total.pgfault += s.pgfault;
            total.pgmajfault += s.pgmajfault;
            total.pgfault_around += s.pgfault_around;
            total.io_count += s.io_count;
            total.io_bytes += s.io_bytes;
        }
    }
    sample.faults = Some(total.pgfault);
    sample.major_faults = Some(total.pgmajfault);
    sample.io_count = Some(total.io_count);
    sample.io_bytes = Some(total.io_bytes);
    sample.fault_around_pages = Some(total.pgfault_around);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_and_variants() {
        let deliveries = [Fault::Signal, Fault::Handler];
        let engines = Engine::all(&[0, 4], &deliveries, &ProbeCpu::ALL, &[PageSize::Base]);
        let v: Vec<String> = engines.iter().map(|e| e.variant()).collect();
        assert_eq!(
            v,
            [
                "default",
                "default",
                "cpu=same",
                "cpu=cross",
                "order=0",
                "order=0,delivery=handler",
                "order=4",
                "order=4,delivery=handler"
            ]
        );
        let names: Vec<&str> = engines.iter().map(|e| e.engine()).collect();
        assert_eq!(
            names[..4],
            ["kernel-file", "kernel-memfd", "uffd-probe", "uffd-probe"]
        );
        let probe = Engine::UffdProbe(ProbeCpu::Cross);
        assert_eq!(probe.heading(), "uffd-probe");
        assert_eq!(probe.subheading(), "cross-cpu");
        assert_eq!((probe.order(), probe.delivery()), (None, None));
        assert_eq!(engines[5].subheading(), "");
        // Without cross-cpu (one CPU), the probe has one column.
        let one = Engine::all(&[0], &deliveries, &[ProbeCpu::Same], &[PageSize::Base]);
        assert_eq!(one.len(), 2 + 1 + 2);
        // 2 MiB pages: one column per delivery, whatever the orders.
        let both = Engine::all(&[0, 4], &deliveries, &[], &[PageSize::Base, PageSize::Huge]);
        let v: Vec<String> = both[6..].iter().map(|e| e.variant()).collect();
        assert_eq!(v, ["page=2M", "page=2M,delivery=handler"]);
        assert_eq!(both[6].heading(), "page=2M");
        assert_eq!(
            (both[6].order(), both[6].page_size()),
            (None, Some(PageSize::Huge))
        );
        assert_eq!(both[2].page_size(), Some(PageSize::Base));
        let huge_only = Engine::all(&[0, 4], &deliveries, &[], &[PageSize::Huge]);
        assert_eq!(huge_only.len(), 2 + 2);
    }

    #[test]
    fn adaptive_fault_around_is_named_auto_and_has_no_order() {
        let auto = Engine::Faultmap {
            order: AUTO,
            delivery: Fault::Signal,
            page: PageSize::Base,
        };
        assert_eq!(auto.heading(), "order=auto");
        assert_eq!(auto.variant(), "order=auto");
        assert_eq!(auto.order(), None);
        let handler = Engine::Faultmap {
            order: AUTO,
            delivery: Fault::Handler,
            page: PageSize::Base,
        };
        assert_eq!(handler.variant(), "order=auto,delivery=handler");
    }
}
