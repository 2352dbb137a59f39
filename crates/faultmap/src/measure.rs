//! Helpers for benchmarks that compare faultmap with the kernel's own
//! mappings of the same data and with the device itself. Their system calls
//! live in the `sys` module with all the others.

use std::fs::File;
use std::io;
use std::path::Path;

pub use crate::sys::{mincore_resident, rusage_faults};

/// Where the kernel sizes its pool of 2 MiB huge pages (root only).
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Where it counts the pool's free pages.
const FREE_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

/// The lock file that everything of this project that changes the pool
/// holds meanwhile: `faultmap bench` and the Rust, C and Python tests
/// (the C and Python tests take it themselves, by this same name).
pub const HUGE_POOL_LOCK: &str = "/tmp/faultmap-hugepages.lock";

/// The kernel's pool of 2 MiB huge pages, held for a benchmark or a test:
/// [`HugePagePool::lock`] takes [`HUGE_POOL_LOCK`] (waiting for whoever
/// holds it), [`HugePagePool::grow`] adds pages, and the drop takes out
/// as many as were added, then lets the lock go. The pool is only ever
/// changed relatively, so holders in other processes never undo each
/// other's pages.
#[derive(Debug)]
pub struct HugePagePool {
    added: u64,
    _lock: File,
}

impl HugePagePool {
    /// Takes the pool's lock file: read-only if it exists (`flock` needs
    /// no more, and a file another user made stays usable), else made.
    pub fn lock() -> io::Result<HugePagePool> {
        let lock = File::open(HUGE_POOL_LOCK).or_else(|_| {
            File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(HUGE_POOL_LOCK)
        })?;
        crate::sys::flock_exclusive(&lock)?;
        Ok(HugePagePool {
            added: 0,
            _lock: lock,
        })
    }

    /// Grows the pool by `extra` pages (root only). What the kernel added
    /// is taken out again on drop, even when it found memory for fewer
    /// (then the error says how many).
    pub fn grow(&mut self, extra: u64) -> io::Result<()> {
        if extra == 0 {
            return Ok(());
        }
        let old = Self::size()?;
        std::fs::write(NR_HUGEPAGES, (old + extra).to_string())?;
        let now = Self::size()?;
        self.added += now.saturating_sub(old);
        if now < old + extra {
            return Err(io::Error::other(format!(
                "the kernel found memory for {} of {extra} huge pages asked",
                now.saturating_sub(old)
            )));
        }
        Ok(())
    }

    /// The pages this holder added.
    pub fn added(&self) -> u64 {
        self.added
    }

    /// The pool's size (`vm.nr_hugepages`).
    pub fn size() -> io::Result<u64> {
        read_number(NR_HUGEPAGES)
    }

    /// The pool's free pages, reserved ones included (`free_hugepages`).
    pub fn free() -> io::Result<u64> {
        read_number(FREE_HUGEPAGES)
    }

    /// The pool's pages free for a new object: free less reserved
    /// (`None` if the kernel has no 2 MiB pool).
    pub fn available() -> Option<u64> {
        crate::sys::huge_pages_available().map(|(available, _)| available)
    }
}

impl Drop for HugePagePool {
    fn drop(&mut self) {
        if self.added == 0 {
            return;
        }
        if let Ok(now) = Self::size() {
            let _ = std::fs::write(NR_HUGEPAGES, now.saturating_sub(self.added).to_string());
        }
    }
}

/// The number in the file at `path`.
fn read_number(path: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path} says {text:?}, not a number"),
        )
    })
}

/// A close-on-exec memfd of `len` bytes named `name`, as a file: the
/// like-for-like kernel baseline (shmem pages, as faultmap's cache).
pub fn memfd(name: &std::ffi::CStr, len: u64) -> io::Result<File> {
    crate::sys::memfd_create(name, len, false).map(File::from)
}

/// The device's sequential read rate for `path`: reads the whole file with
/// O_DIRECT (bypassing the page cache, whatever it holds) in `chunk`-byte
/// requests, several in flight through io_uring
/// ([`crate::FileStore::direct_read_rate`]). Returns the bytes read and the
/// seconds it took.
pub fn direct_read_rate(path: &Path, chunk: usize) -> io::Result<(u64, f64)> {
    crate::FileStore::direct_read_rate(path, chunk).map_err(io::Error::other)
}

pub use crate::sys::{allowed_cpus, pin_current_thread};

/// The bare userfaultfd round trip, for comparison with faultmap's handler
/// delivery: a memfd mapped `MAP_SHARED` and registered MINOR, and one
/// handler thread, pinned to one CPU, that sleeps in `poll` on the
/// userfaultfd and answers each fault with a one-page `UFFDIO_CONTINUE`.
/// Nothing else: no region lookup, no page state, no fault-around.
///
/// Where the faulting thread runs decides the cost on a virtual machine: on
/// the handler's CPU the fault wakes the handler and the `CONTINUE` wakes
/// the faulting thread locally; on another CPU each wake-up is an IPI
/// (`faultmap bench`'s `uffd-probe` columns measure both).
pub struct UffdProbe {
    uffd: std::sync::Arc<std::os::fd::OwnedFd>,
    memfd: std::os::fd::OwnedFd,
    len: usize,
    stop: std::os::fd::OwnedFd,
    handler: Option<std::thread::JoinHandle<()>>,
}

impl UffdProbe {
    /// Starts a probe over the first `len` bytes of `memfd` (a memfd, such
    /// as [`memfd`] makes), its handler thread pinned to `handler_cpu`.
    ///
    /// # Safety
    ///
    /// `memfd` must be a memfd whose first `len` bytes are written (no
    /// hole: a hole raises no minor fault, and a page past its end
    /// SIGBUS), and must not be written or truncated while a
    /// [`ProbeView`] of the probe lives: a view hands out `&[u8]` over it.
    pub unsafe fn start(memfd: &File, len: usize, handler_cpu: usize) -> io::Result<UffdProbe> {
        use crate::sys::{self, feature};
        let memfd: std::os::fd::OwnedFd = memfd.try_clone()?.into();
        let (uffd, _) = sys::open_userfaultfd()?;
        sys::uffd_api(&uffd, feature::MINOR_SHMEM)?;
        let uffd = std::sync::Arc::new(uffd);
        let stop = sys::eventfd()?;
        let (thread_uffd, thread_stop) = (uffd.clone(), stop.try_clone()?);
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
        let handler = std::thread::Builder::new()
            .name("uffd-probe".into())
            .spawn(move || {
                let pinned = sys::pin_current_thread(&[handler_cpu]);
                let ok = pinned.is_ok();
                let _ = pinned_tx.send(pinned);
                if ok {
                    probe_loop(&thread_uffd, &thread_stop);
                }
            })?;
        let pinned = pinned_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the probe thread ended")));
        let probe = UffdProbe {
            uffd,
            memfd,
            len,
            stop,
            handler: Some(handler),
        };
        pinned.map(|()| probe)
    }

    /// A fresh read-only mapping of the memfd, registered with the probe:
    /// the first touch of each page is one round trip to the handler.
    pub fn map(&self) -> io::Result<ProbeView<'_>> {
        use crate::sys::{self, mode, range_ioctl, PAGE_SIZE};
        // Whole pages: userfaultfd registers no partial page.
        let pages = self.len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let region = sys::mmap_shared_aligned(&self.memfd, pages, 0, 1 << 21, sys::Prot::Read)?;
        let ioctls = sys::uffd_register(&self.uffd, region.addr(), region.len(), mode::MINOR)?;
        let view = ProbeView {
            region,
            probe: self,
        };
        if ioctls & range_ioctl::CONTINUE == 0 {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        Ok(view)
    }
}

impl Drop for UffdProbe {
    fn drop(&mut self) {
        let _ = crate::sys::eventfd_signal(&self.stop);
        if let Some(handler) = self.handler.take() {
            let _ = handler.join();
        }
    }
}

/// One mapping of a [`UffdProbe`]'s memfd; unregistered and unmapped on
/// drop.
pub struct ProbeView<'a> {
    region: crate::sys::MappedRegion,
    probe: &'a UffdProbe,
}

impl std::ops::Deref for ProbeView<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the region is a readable mapping of `len` bytes rounded
        // up to whole pages, owned by this view until it drops. Its memfd
        // is written up to `len` and not changed while views live
        // (`UffdProbe::start`'s contract), so every byte reads as the
        // memfd's once the handler maps its page, and nothing writes it
        // while the slice lives.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr(), self.probe.len) }
    }
}

impl Drop for ProbeView<'_> {
    fn drop(&mut self) {
        // Unregistered first: the unmap (the region's drop) raises no event.
        let _ =
            crate::sys::uffd_unregister(&self.probe.uffd, self.region.addr(), self.region.len());
    }
}

/// The probe's handler: sleep in `poll`, read what is pending, map each
/// faulting page with one `UFFDIO_CONTINUE` that wakes its thread.
fn probe_loop(uffd: &std::os::fd::OwnedFd, stop: &std::os::fd::OwnedFd) {
    use crate::sys::{self, UffdMsg, PAGE_SIZE};
    let mut msgs = [UffdMsg::default(); 16];
    loop {
        match sys::poll_readable(&[uffd, stop], -1) {
            Ok(ready) if ready & 0b10 != 0 => return,
            Ok(_) => {}
            // No failure a valid poll meets; never leave a fault unserved.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
        let n = match sys::uffd_read(uffd, &mut msgs) {
            Ok(n) => n,
            // None is expected on a live userfaultfd; do not spin on one
            // (poll would report it readable at once).
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(1));
                0
            }
        };
        for msg in msgs[..n]
            .iter()
            .filter(|m| m.event == sys::UFFD_EVENT_PAGEFAULT)
        {
            let page = msg.address as usize & !(PAGE_SIZE - 1);
            // Already mapped (another thread's fault on the page won):
            // wake this one too, or it would sleep for good.
            if sys::uffd_continue(uffd, page, PAGE_SIZE, true, false) != sys::ContinueResult::Done {
                let _ = sys::uffd_wake(uffd, page, PAGE_SIZE);
            }
        }
    }
}
