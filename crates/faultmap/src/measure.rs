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
        let region = sys::mmap_shared_aligned(&self.memfd, pages, 0, 1 << 21, false)?;
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
        let n = sys::uffd_read(uffd, &mut msgs).unwrap_or(0);
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
