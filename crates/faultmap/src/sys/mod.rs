//! The only module that makes raw system calls.
//!
//! Everything above this layer is typed: it never sees an `ioctl` number, a
//! raw pointer from `mmap`, or an `errno`. Each wrapper returns
//! [`std::io::Result`] and the layer above adds context (which operation,
//! which object) when it turns the error into its own typed error.
//!
//! Debian's installed kernel headers are 6.1's, and the `libc` crate does not
//! carry the userfaultfd ABI, so the structures and ioctl numbers are defined
//! here from `include/uapi/linux/userfaultfd.h` (x86-64 and every other
//! architecture with the generic `_IOC` layout). The `userfaultfd` crate was
//! considered: it does not expose `UFFDIO_CONTINUE`'s partial progress
//! (`mapped`), `UFFDIO_POISON`, or the `/dev/userfaultfd` fallback, all of
//! which the fault path needs.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

pub(crate) mod fork;
pub(crate) mod rendezvous;
pub(crate) mod revoke;
pub(crate) mod share;
pub(crate) mod uring;

pub use fork::{children_reserved, fork_reservations};
pub use share::is_guest;

/// The base page size this crate works in. Checked against `sysconf` when a
/// pager is created (`page_size_matches`).
pub const PAGE_SIZE: usize = 4096;

/// One PTE table maps this many pages (2 MiB on x86-64 with 4 KiB pages).
pub(crate) const PTRS_PER_PTE: usize = 512;

/// The huge page size faultmap uses: one PMD, 2 MiB on x86-64.
pub const HUGE_PAGE_SIZE: usize = PTRS_PER_PTE * PAGE_SIZE;

/// Where the kernel counts 2 MiB huge pages.
const HUGEPAGES_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

// ---------------------------------------------------------------------------
// The userfaultfd ABI.
// ---------------------------------------------------------------------------

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// Feature bits of `uffdio_api.features`.
pub(crate) mod feature {
    pub const EVENT_FORK: u64 = 1 << 1;
    pub const EVENT_REMAP: u64 = 1 << 2;
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    pub const MISSING_SHMEM: u64 = 1 << 5;
    pub const EVENT_UNMAP: u64 = 1 << 6;
    pub const SIGBUS: u64 = 1 << 7;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    pub const MINOR_SHMEM: u64 = 1 << 10;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const POISON: u64 = 1 << 14;
    pub const WP_ASYNC: u64 = 1 << 15;

    /// The kernel's name of a single feature bit, for error messages.
    pub fn name(bit: u64) -> &'static str {
        match bit {
            EVENT_FORK => "UFFD_FEATURE_EVENT_FORK",
            EVENT_REMAP => "UFFD_FEATURE_EVENT_REMAP",
            EVENT_REMOVE => "UFFD_FEATURE_EVENT_REMOVE",
            MISSING_HUGETLBFS => "UFFD_FEATURE_MISSING_HUGETLBFS",
            MISSING_SHMEM => "UFFD_FEATURE_MISSING_SHMEM",
            EVENT_UNMAP => "UFFD_FEATURE_EVENT_UNMAP",
            SIGBUS => "UFFD_FEATURE_SIGBUS",
            THREAD_ID => "UFFD_FEATURE_THREAD_ID",
            MINOR_HUGETLBFS => "UFFD_FEATURE_MINOR_HUGETLBFS",
            MINOR_SHMEM => "UFFD_FEATURE_MINOR_SHMEM",
            EXACT_ADDRESS => "UFFD_FEATURE_EXACT_ADDRESS",
            WP_HUGETLBFS_SHMEM => "UFFD_FEATURE_WP_HUGETLBFS_SHMEM",
            WP_UNPOPULATED => "UFFD_FEATURE_WP_UNPOPULATED",
            POISON => "UFFD_FEATURE_POISON",
            WP_ASYNC => "UFFD_FEATURE_WP_ASYNC",
            _ => "an unnamed userfaultfd feature",
        }
    }
}

/// Registration modes of `uffdio_register.mode`.
pub(crate) mod mode {
    pub const MISSING: u64 = 1 << 0;
    /// Write-protect tracking (`UFFDIO_REGISTER_MODE_WP`).
    pub const WP: u64 = 1 << 1;
    pub const MINOR: u64 = 1 << 2;
}

/// Bits of `uffdio_register.ioctls`: which range ioctls the range supports.
pub(crate) mod range_ioctl {
    pub const WAKE: u64 = 1 << 0x02;
    pub const WRITEPROTECT: u64 = 1 << 0x06;
    pub const CONTINUE: u64 = 1 << 0x07;
    pub const POISON: u64 = 1 << 0x08;
}

/// `uffd_msg.event` of a page fault.
pub(crate) const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// `uffd_msg.event` of an `mremap` of a registered range
/// (`UFFD_FEATURE_EVENT_REMAP`): `arg.remap` is `{from, to, len}`.
pub(crate) const UFFD_EVENT_REMAP: u8 = 0x14;
/// `uffd_msg.event` of an `munmap` of (part of) a registered range
/// (`UFFD_FEATURE_EVENT_UNMAP`): `arg.remove` is `{start, end}`.
pub(crate) const UFFD_EVENT_UNMAP: u8 = 0x16;

/// `uffd_msg.arg.pagefault.flags`: a write to a write-protected page.
pub(crate) const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

const CONTINUE_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_CONTINUE_MODE_WP`: map the pages write-protected.
const CONTINUE_MODE_WP: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
struct UffdioPoison {
    range: UffdioRange,
    mode: u64,
    updated: i64,
}

/// `struct uffd_msg`: 32 bytes, the page-fault member of its union decoded.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct UffdMsg {
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// `arg.pagefault.flags` for a page fault.
    pub flags: u64,
    /// `arg.pagefault.address` for a page fault.
    pub address: u64,
    feat: u64,
}

impl UffdMsg {
    /// `arg.pagefault.feat.ptid`: the faulting thread's id (with
    /// `UFFD_FEATURE_THREAD_ID`).
    pub fn thread_id(&self) -> u32 {
        // The union's first member is a u32 at the start of the u64 field;
        // x86-64 (like every little-endian target) keeps it in the low half.
        self.feat as u32
    }

    /// `arg.remove` of an UNMAP event: the unmapped range `start..end`.
    pub fn unmapped(&self) -> std::ops::Range<usize> {
        // The union's first two u64s, which the pagefault member names
        // flags and address.
        self.flags as usize..self.address as usize
    }

    /// `arg.remap` of a REMAP event: `(from, to, len)`.
    pub fn remapped(&self) -> (usize, usize, usize) {
        (
            self.flags as usize,
            self.address as usize,
            self.feat as usize,
        )
    }
}

const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioContinue>() == 32);

const fn iowr(nr: u64, size: usize) -> u64 {
    // _IOC(_IOC_READ|_IOC_WRITE, 0xAA, nr, size) with the generic layout.
    (3 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}

const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}

const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_CONTINUE: u64 = iowr(0x07, std::mem::size_of::<UffdioContinue>());
const UFFDIO_POISON: u64 = iowr(0x08, std::mem::size_of::<UffdioPoison>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`: `_IO(0xAA, 0x00)`.
const USERFAULTFD_IOC_NEW: u64 = 0xAA << 8;

const _: () = assert!(UFFDIO_API == 0xC018_AA3F);
const _: () = assert!(UFFDIO_REGISTER == 0xC020_AA00);
const _: () = assert!(UFFDIO_WAKE == 0x8010_AA02);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_AA01);
const _: () = assert!(UFFDIO_CONTINUE == 0xC020_AA07);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xC018_AA06);

/// How a userfaultfd was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UffdSource {
    /// The `userfaultfd(2)` system call: needs `CAP_SYS_PTRACE` or
    /// `vm.unprivileged_userfaultfd=1`. Serves faults the kernel takes on the
    /// application's behalf (`write(2)` from a mapping, O_DIRECT) too.
    Syscall,
    /// `/dev/userfaultfd`: needs read-write access to the device. Serves
    /// kernel-mode faults too.
    Device,
    /// The system call with `UFFD_USER_MODE_ONLY`, which any user may make:
    /// only faults taken in user mode reach the handler, so a system call
    /// that reads a page not yet mapped (`write(fd, mapping, ..)`) fails with
    /// `EFAULT` instead of waiting for it.
    UserModeOnly,
}

impl UffdSource {
    /// How it was opened, in words.
    pub fn describe(self) -> &'static str {
        match self {
            UffdSource::Syscall => "the userfaultfd system call",
            UffdSource::Device => "/dev/userfaultfd",
            UffdSource::UserModeOnly => "the userfaultfd system call, user-mode faults only",
        }
    }

    /// Whether faults that the kernel takes on the application's behalf
    /// (inside `write(2)`, `send(2)`, O_DIRECT reads) are served.
    pub fn serves_kernel_faults(self) -> bool {
        self != UffdSource::UserModeOnly
    }
}

/// Opens a userfaultfd (non-blocking, close-on-exec), preferring one that
/// also serves kernel-mode faults: the system call, then `/dev/userfaultfd`,
/// then the system call with `UFFD_USER_MODE_ONLY`. Returns the first error
/// if all fail.
pub(crate) fn open_userfaultfd() -> io::Result<(OwnedFd, UffdSource)> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let first_err = match userfaultfd_syscall(flags) {
        Ok(fd) => return Ok((fd, UffdSource::Syscall)),
        Err(e) => e,
    };
    if let Ok(dev) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        // SAFETY: USERFAULTFD_IOC_NEW takes the open flags as its integer
        // argument and returns a new fd or -1; `dev` is a valid open fd.
        let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
        if fd >= 0 {
            // SAFETY: the kernel just returned this fd to us; nobody else owns it.
            return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, UffdSource::Device));
        }
    }
    userfaultfd_syscall(flags | UFFD_USER_MODE_ONLY)
        .map(|fd| (fd, UffdSource::UserModeOnly))
        .map_err(|_| first_err)
}

fn userfaultfd_syscall(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes one int argument and returns a new fd or -1;
    // no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `UFFDIO_API` handshake requesting `features`. Returns the features the
/// kernel reports. The kernel accepts the handshake once per fd, and fails it
/// with `EINVAL` if a requested feature is unsupported: probe with 0 on a
/// throw-away fd first to learn what is there.
pub(crate) fn uffd_api(uffd: &OwnedFd, features: u64) -> io::Result<u64> {
    let mut api = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one `struct uffdio_api`, which `api`
    // is (repr(C), same layout); it lives for the whole call.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API as _, &mut api) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(api.features)
}

/// Registers `[start, start+len)` with `modes`. Returns the range ioctls the
/// kernel allows on it (`range_ioctl` bits).
pub(crate) fn uffd_register(
    uffd: &OwnedFd,
    start: usize,
    len: usize,
    modes: u64,
) -> io::Result<u64> {
    let mut reg = UffdioRegister {
        range: UffdioRange {
            start: start as u64,
            len: len as u64,
        },
        mode: modes,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`;
    // the range is only an address range, the kernel validates it.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER as _, &mut reg) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(reg.ioctls)
}

/// Unregisters `[start, start+len)` from `uffd`: the kernel sends no more
/// events for it (an `munmap` of it then neither sends an UNMAP event nor
/// waits for one to be read) and faults in it no longer reach `uffd`.
pub(crate) fn uffd_unregister(uffd: &OwnedFd, start: usize, len: usize) -> io::Result<()> {
    let mut range = UffdioRange {
        start: start as u64,
        len: len as u64,
    };
    // SAFETY: UFFDIO_UNREGISTER reads one `struct uffdio_range`; the range
    // is only an address range, the kernel validates it.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut range) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The outcome of one `UFFDIO_CONTINUE` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ContinueResult {
    /// The whole range is mapped (and woken unless DONTWAKE).
    Done,
    /// Only the first `bytes` were mapped (and woken); the page after them
    /// stopped the call. Call again from there to learn why.
    Partial { bytes: usize },
    /// The first page of the range failed with this errno: `EEXIST` (already
    /// mapped), `EFAULT` (not in the memfd), `EAGAIN` (the address space is
    /// changing), `ENOENT` (the mapping is gone), or another error.
    Failed { errno: i32 },
}

/// `UFFDIO_CONTINUE` over `[start, start+len)`: map the memfd's cached pages
/// there. `wake` wakes the threads waiting in the range when it succeeds;
/// `write_protect` maps them write-protected (`UFFDIO_CONTINUE_MODE_WP`:
/// the first write to each raises a WP fault).
pub(crate) fn uffd_continue(
    uffd: &OwnedFd,
    start: usize,
    len: usize,
    wake: bool,
    write_protect: bool,
) -> ContinueResult {
    let mut mode = if wake { 0 } else { CONTINUE_MODE_DONTWAKE };
    if write_protect {
        mode |= CONTINUE_MODE_WP;
    }
    let mut arg = UffdioContinue {
        range: UffdioRange {
            start: start as u64,
            len: len as u64,
        },
        mode,
        mapped: 0,
    };
    // SAFETY: UFFDIO_CONTINUE reads and writes one `struct uffdio_continue`.
    // It installs PTEs for pages of the registered mapping's own file: it
    // never writes to memory we hold references to.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_CONTINUE as _, &mut arg) };
    if rc == 0 {
        return ContinueResult::Done;
    }
    if arg.mapped > 0 {
        return ContinueResult::Partial {
            bytes: arg.mapped as usize,
        };
    }
    ContinueResult::Failed {
        errno: io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    }
}

/// `UFFDIO_WAKE` over `[start, start+len)`.
pub(crate) fn uffd_wake(uffd: &OwnedFd, start: usize, len: usize) -> io::Result<()> {
    let mut range = UffdioRange {
        start: start as u64,
        len: len as u64,
    };
    // SAFETY: UFFDIO_WAKE reads one `struct uffdio_range`.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_WAKE as _, &mut range) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `UFFDIO_WRITEPROTECT` over `[start, start+len)` of a range registered
/// in WP mode: `protect` write-protects the pages (a write then faults;
/// pages not mapped get the kernel's uffd-wp marker, so they are protected
/// when mapped again), else removes the protection and, unless
/// `dont_wake`, wakes the threads that wait in the range.
pub(crate) fn uffd_writeprotect(
    uffd: &OwnedFd,
    start: usize,
    len: usize,
    protect: bool,
    dont_wake: bool,
) -> io::Result<()> {
    let mut mode = if protect { WRITEPROTECT_MODE_WP } else { 0 };
    if dont_wake {
        mode |= WRITEPROTECT_MODE_DONTWAKE;
    }
    let mut arg = UffdioWriteprotect {
        range: UffdioRange {
            start: start as u64,
            len: len as u64,
        },
        mode,
    };
    // SAFETY: UFFDIO_WRITEPROTECT reads one `struct uffdio_writeprotect`; it
    // changes the protection of PTEs of the registered range only, never
    // the contents of memory.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_WRITEPROTECT as _, &mut arg) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `UFFDIO_POISON` over `[start, start+len)`: the next access there gets
/// SIGBUS, as a kernel mapping does when a page cannot be read. Wakes waiters.
pub(crate) fn uffd_poison(uffd: &OwnedFd, start: usize, len: usize) -> io::Result<()> {
    let mut arg = UffdioPoison {
        range: UffdioRange {
            start: start as u64,
            len: len as u64,
        },
        mode: 0,
        updated: 0,
    };
    // SAFETY: UFFDIO_POISON reads and writes one `struct uffdio_poison`; it
    // installs poison markers in the registered range only.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_POISON as _, &mut arg) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads as many pending messages as fit into `buf` from a non-blocking
/// userfaultfd. Returns how many were read: 0 when none was pending (another
/// handler thread took them).
pub(crate) fn uffd_read(uffd: &OwnedFd, buf: &mut [UffdMsg]) -> io::Result<usize> {
    let bytes = std::mem::size_of_val(buf);
    // SAFETY: `buf` is valid for writes of `bytes` bytes, and any bit pattern
    // is a valid UffdMsg (plain integers).
    let n = unsafe { libc::read(uffd.as_raw_fd(), buf.as_mut_ptr().cast(), bytes) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
            _ => Err(err),
        };
    }
    Ok(n as usize / std::mem::size_of::<UffdMsg>())
}

// ---------------------------------------------------------------------------
// memfd, eventfd, poll.
// ---------------------------------------------------------------------------

/// Creates a close-on-exec memfd of `len` bytes named `name`.
pub(crate) fn memfd_create(name: &CStr, len: u64, huge: bool) -> io::Result<OwnedFd> {
    let flags = if huge {
        libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB
    } else {
        libc::MFD_CLOEXEC
    };
    // SAFETY: `name` is a valid NUL-terminated string for the whole call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: ftruncate on an fd we own; no memory is passed.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The 2 MiB huge pages free for a new reservation: the pool's free pages
/// less those already reserved (`free_hugepages - resv_hugepages`), and
/// the pool's size (`nr_hugepages`). `None` if the kernel has no 2 MiB
/// pool.
pub(crate) fn huge_pages_available() -> Option<(u64, u64)> {
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(format!("{HUGEPAGES_2M}/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let free = read("free_hugepages")?;
    let reserved = read("resv_hugepages")?;
    Some((free.saturating_sub(reserved), read("nr_hugepages")?))
}

/// Takes an exclusive `flock` on `file`, waiting for it (released when the
/// file is closed).
pub(crate) fn flock_exclusive(file: &File) -> io::Result<()> {
    // SAFETY: flock on a descriptor `file` owns, for the call; no memory
    // is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Tries to take a `flock` on `file` without waiting: exclusive or
/// shared. `Ok(false)` if another open file description holds a
/// conflicting one. Released by [`flock_unlock`] or when every descriptor
/// of this open file description is closed.
pub(crate) fn flock_try(file: &File, exclusive: bool) -> io::Result<bool> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on a descriptor `file` owns, for the call; no memory
    // is passed.
    if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e)
}

/// Releases this open file description's `flock` on `file` (for every
/// process that shares the description, a forked child included).
pub(crate) fn flock_unlock(file: &File) -> io::Result<()> {
    // SAFETY: flock on a descriptor `file` owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An open-file-description record lock (`F_OFD_SETLK`) of type `kind`
/// (`F_WRLCK` or `F_UNLCK`) on bytes `[start, start + len)` of `file`.
fn ofd_lock(file: &File, kind: libc::c_short, start: u64, len: u64) -> io::Result<bool> {
    let (Ok(start), Ok(len)) = (libc::off_t::try_from(start), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: an all-zero flock is a valid value; the fields are set below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = start;
    lock.l_len = len;
    // SAFETY: fcntl reads one live flock for the call (l_pid is 0, as OFD
    // locks require); `file` owns the descriptor.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Tries to take an exclusive record lock on bytes `[start, start + len)`
/// of `file`, owned by this open file description (`F_OFD_SETLK`): it
/// conflicts with every other description's, in this process or another,
/// and goes when the description is closed, by an exit or a kill too.
/// `Ok(false)` if another description holds an overlapping lock.
pub(crate) fn range_lock_try(file: &File, start: u64, len: u64) -> io::Result<bool> {
    ofd_lock(file, libc::F_WRLCK as libc::c_short, start, len)
}

/// Releases the record lock [`range_lock_try`] took on `[start, start +
/// len)`: for every process that shares the description (a child forked
/// while it was held would otherwise keep it until it closes its copy).
pub(crate) fn range_unlock(file: &File, start: u64, len: u64) -> io::Result<()> {
    ofd_lock(file, libc::F_UNLCK as libc::c_short, start, len).map(|_| ())
}

/// Turns `O_DIRECT` on or off on `file`'s open file description
/// (`F_SETFL`): its reads and writes then bypass the page cache, and must
/// be aligned as `statx` says (`dio_alignment`).
pub(crate) fn set_direct(file: &File, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL on a descriptor `file` owns; no memory is passed.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: F_SETFL on a descriptor `file` owns, with an int argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's effective user id.
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

/// The size and the bytes an unprivileged writer may still use of the
/// file system of `path` (`statvfs`'s `f_blocks` and `f_bavail`).
pub fn fs_space(path: &std::path::Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and lives for the call; statvfs writes
    // one struct to a live value.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((
        (st.f_blocks as u64).saturating_mul(frsize),
        (st.f_bavail as u64).saturating_mul(frsize),
    ))
}

/// Allocates the pages of `[offset, offset+len)` of a memfd (`fallocate`,
/// mode 0): a hugetlb memfd's pages are then in its page cache, zeroed, so
/// a store that copies into them through a mapping never meets an empty
/// pool (which would be SIGBUS in the middle of a copy); here that is
/// `ENOSPC`.
pub(crate) fn allocate(fd: &OwnedFd, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate on an fd we own; no memory is passed.
    let rc = unsafe { libc::fallocate(fd.as_raw_fd(), 0, offset, len) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates a non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes an eventfd readable (adds 1 to its counter).
pub(crate) fn eventfd_signal(fd: &OwnedFd) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
    let n = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    if n != 8 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until one of `fds` (any number) is readable, closed or in error.
/// Returns whether each is, in order (none after `EINTR`).
pub(crate) fn poll_all(fds: &[&OwnedFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of pollfd for the whole call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
        pfds.iter_mut().for_each(|p| p.revents = 0);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// Waits until one of `fds` is readable (or has an error). Returns a bit per
/// fd, in order: bit i set when `fds[i]` is ready. `EINTR` returns 0.
pub(crate) fn poll_readable(fds: &[&OwnedFd], timeout_ms: i32) -> io::Result<u32> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 4];
    let n = fds.len().min(pfds.len());
    for (p, fd) in pfds.iter_mut().zip(fds) {
        p.fd = fd.as_raw_fd();
        p.events = libc::POLLIN;
    }
    // SAFETY: `pfds[..n]` is a valid array of pollfd for the whole call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::EINTR) {
            Ok(0)
        } else {
            Err(err)
        };
    }
    let mut ready = 0;
    for (i, p) in pfds[..n].iter().enumerate() {
        if p.revents != 0 {
            ready |= 1 << i;
        }
    }
    Ok(ready)
}

/// Whether the system page size is [`PAGE_SIZE`].
pub(crate) fn page_size_matches() -> bool {
    // SAFETY: sysconf takes an integer and returns an integer.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    size == PAGE_SIZE as libc::c_long
}

// ---------------------------------------------------------------------------
// Memory mappings.
// ---------------------------------------------------------------------------

/// An owned memory mapping, unmapped on drop (unless given up with
/// [`MappedRegion::disown`]).
#[derive(Debug)]
pub(crate) struct MappedRegion {
    ptr: NonNull<u8>,
    len: usize,
    /// The range is no longer ours (the application unmapped or moved
    /// it): dropping must not unmap it.
    disowned: std::sync::atomic::AtomicBool,
    /// The range is listed for forked children ([`dont_fork`],
    /// `sys::fork`): to take off the list when it is unmapped or disowned,
    /// whichever comes first.
    listed: std::sync::atomic::AtomicBool,
    /// Never reused in a process: names the mapping to a forked child's
    /// owner (`sys::share`).
    id: u64,
    /// Where it maps its memfd, for a forked child to map it again
    /// (`sys::share`); set once, by [`dont_fork`].
    share: std::sync::OnceLock<share::Share>,
    /// Another process's range (a forked child's, `crate::mm::guest`):
    /// never unmapped, listed or advised here.
    foreign: bool,
}

/// The next [`MappedRegion::id`].
static NEXT_MAP_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub(crate) fn next_map_id() -> u64 {
    NEXT_MAP_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

// SAFETY: a MappedRegion is an address range; it owns no thread-local state
// and munmap may be called from any thread.
unsafe impl Send for MappedRegion {}
// SAFETY: shared references only read `ptr`/`len`; what the memory holds is
// synchronised by the users of the range.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// The first byte of the mapping.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The first byte, as a raw pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Takes ownership of `[addr, addr+len)`, a part of `from` (a mapping
    /// whose owner is giving it up, [`MappedRegion::disown`]) now at `addr`:
    /// the part the application left mapped after unmapping the rest, or
    /// moved there with `mremap`. A part of a [`dont_fork`] range is
    /// `DONTFORK` too (the kernel keeps `VM_DONTCOPY` through splits and
    /// moves), and is listed for children at its address, with its offset
    /// in the memfd.
    ///
    /// # Safety
    ///
    /// The range must be mapped, be a part of `from`'s that `from` gives up
    /// ([`MappedRegion::disown`]) before the result is dropped, and not be
    /// owned by any other `MappedRegion`.
    /// `skip` is the part's offset in `from`, in bytes.
    pub unsafe fn adopt(
        from: &MappedRegion,
        skip: usize,
        addr: usize,
        len: usize,
    ) -> Option<MappedRegion> {
        let share = from.share.get().map(|s| share::Share {
            offset: s.offset + skip as u64,
            id: next_map_id(),
            ..*s
        });
        let part = MappedRegion {
            ptr: NonNull::new(addr as *mut u8)?,
            len,
            disowned: std::sync::atomic::AtomicBool::new(false),
            listed: std::sync::atomic::AtomicBool::new(false),
            id: share.map_or_else(next_map_id, |s| s.id),
            share: share.map(std::sync::OnceLock::from).unwrap_or_default(),
            foreign: false,
        };
        if from.listed.load(std::sync::atomic::Ordering::Acquire) {
            part.list_for_children();
        }
        Some(part)
    }

    /// A forked child's range `[addr, addr + len)`, as the owner sees it
    /// (`crate::mm::guest`): only an address range, never unmapped or
    /// listed here.
    pub(crate) fn foreign(addr: usize, len: usize) -> Option<MappedRegion> {
        Some(MappedRegion {
            ptr: NonNull::new(addr as *mut u8)?,
            len,
            disowned: std::sync::atomic::AtomicBool::new(false),
            listed: std::sync::atomic::AtomicBool::new(false),
            id: next_map_id(),
            share: std::sync::OnceLock::new(),
            foreign: true,
        })
    }

    /// The mapping's name, never reused in this process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether this is another process's range ([`MappedRegion::foreign`]).
    pub(crate) fn is_foreign(&self) -> bool {
        self.foreign
    }

    /// Gives the range up: dropping `self` will not unmap it. For a range
    /// the application unmapped or moved itself: what is there now is not
    /// ours to unmap, nor to reserve in a forked child (the parts faultmap
    /// keeps were adopted, and listed, by their new owners).
    pub fn disown(&self) {
        self.disowned
            .store(true, std::sync::atomic::Ordering::Release);
        self.unlist_for_children();
    }

    /// Lists the range for every forked child (`sys::fork`), until it is
    /// unmapped or disowned.
    fn list_for_children(&self) {
        if fork::list(self.addr(), self.len, self.share.get().copied()) {
            self.listed
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Takes the range off the list, if it is on it (once).
    fn unlist_for_children(&self) {
        if self.listed.swap(false, std::sync::atomic::Ordering::AcqRel) {
            fork::unlist(self.addr(), self.len);
        }
    }

    /// Whether [`MappedRegion::disown`] was called.
    pub fn is_disowned(&self) -> bool {
        self.disowned.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        if self.is_disowned() || self.foreign {
            return;
        }
        // Unlisted before the unmap: once unmapped, another thread may map
        // something else (another library's DONTFORK range) at the address,
        // which a child must not find reserved. A child forked between the
        // two still inherits nothing here (the range is DONTFORK).
        self.unlist_for_children();
        // SAFETY: `ptr`/`len` came from a successful mmap that this value owns;
        // nothing else unmaps it. Its users hold borrows of `self`, so none is
        // live here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A memfd of `len` bytes named `name`, sealed against growing and
/// shrinking (a page another process maps: `sys::revoke`'s mailbox).
pub(crate) fn memfd_sealed(name: &CStr, len: u64) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name and flags; returns a new fd or -1.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate and fcntl of the memfd just made.
    let sized = unsafe {
        libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) == 0
            && libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            ) == 0
    };
    if !sized {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Seals memfd `fd` against writes (`F_SEAL_WRITE`); whether that
/// worked: it fails (`EBUSY`) while a writable shared mapping of it
/// exists anywhere.
pub(crate) fn seal_write(fd: &OwnedFd) -> bool {
    // SAFETY: F_ADD_SEALS takes an integer.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) == 0 }
}

/// Whether memfd `fd` is `len` bytes long and sealed against shrinking
/// (`F_SEAL_SHRINK`): a mapping of it never faults past its end.
pub(crate) fn sealed_size(fd: &OwnedFd, len: u64) -> bool {
    // SAFETY: F_GET_SEALS takes no argument.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return false;
    }
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one struct stat to a live value.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0) && st.st_size as u64 == len
}

/// `madvise(MADV_DONTFORK)` on `[addr, addr + len)`, a mapping this
/// process owns.
pub(crate) fn madvise_dontfork(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: DONTFORK changes no content of a range the caller owns.
    if unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps `len` bytes of `fd` at file offset `offset`, `MAP_SHARED`, read-write,
/// with no reservation: the private alias through which the cache is filled.
pub(crate) fn mmap_shared_rw(fd: &OwnedFd, len: usize, offset: u64) -> io::Result<MappedRegion> {
    mmap_at(
        None,
        fd,
        len,
        offset,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_NORESERVE,
    )
}

/// What a mapping's range lets the application do: its `mprotect`
/// protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prot {
    /// `PROT_NONE`: every access faults (SIGSEGV).
    None,
    /// `PROT_READ`.
    Read,
    /// `PROT_READ | PROT_WRITE`.
    ReadWrite,
}

impl Prot {
    fn bits(self) -> libc::c_int {
        match self {
            Prot::None => libc::PROT_NONE,
            Prot::Read => libc::PROT_READ,
            Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

/// `mprotect` on `[addr, addr + len)` of a faultmap mapping (page-aligned,
/// inside a live region). Async-signal-safe.
///
/// `ENOMEM` here is the process's `vm.max_map_count`: the change would
/// split an area past the limit.
pub(crate) fn protect(addr: usize, len: usize, prot: Prot) -> io::Result<()> {
    // SAFETY: changes the protection of a page-aligned range inside a
    // shared memfd mapping this process owns (the caller computed it from a
    // live region). No Rust reference is created or invalidated: the
    // application reaches the range through raw pointers, and an access
    // the new protection refuses faults into faultmap's SIGSEGV handler.
    let rc = unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot.bits()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `MADV_GUARD_INSTALL` and `MADV_GUARD_REMOVE` (Linux 6.13; on file and
/// shmem mappings since 6.15); the `libc` crate does not carry them.
const MADV_GUARD_INSTALL: libc::c_int = 102;
const MADV_GUARD_REMOVE: libc::c_int = 103;

/// Installs guard markers over `[addr, addr + len)` of a faultmap mapping
/// (page-aligned, inside a live region): its PTEs are zapped and every
/// access faults (SIGSEGV, `SEGV_MAPERR`) until the markers are removed,
/// without changing the area's protection (no split). The markers stay
/// through a hole punched in the file. Async-signal-safe.
pub(crate) fn guard_install(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: advises on a page-aligned range inside a shared memfd
    // mapping this process owns (the caller computed it from a live
    // region); the range's bytes stay in the memfd, and an access faults
    // into faultmap's SIGSEGV handler.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, MADV_GUARD_INSTALL) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes the guard markers of `[addr, addr + len)` (see
/// [`guard_install`]): the next access maps the memfd's pages.
/// Async-signal-safe.
pub(crate) fn guard_remove(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: as in `guard_install`; removing markers maps nothing by
    // itself.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, MADV_GUARD_REMOVE) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this kernel installs guard markers in a shared memfd mapping
/// (Linux 6.15 and later): tried on a page of a throw-away memfd.
pub(crate) fn guard_regions_work() -> bool {
    let Ok(fd) = memfd_create_plain("faultmap-guard-probe") else {
        return false;
    };
    // SAFETY: a new one-page shared mapping of our own memfd, unmapped
    // below; nothing else refers to it.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), PAGE_SIZE as libc::off_t) != 0 {
            return false;
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            PAGE_SIZE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        let works = libc::madvise(p, PAGE_SIZE, MADV_GUARD_INSTALL) == 0
            && libc::madvise(p, PAGE_SIZE, MADV_GUARD_REMOVE) == 0;
        libc::munmap(p, PAGE_SIZE);
        works
    }
}

/// A plain memfd (close-on-exec), for probes.
fn memfd_create_plain(name: &str) -> io::Result<OwnedFd> {
    let name =
        std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated name; memfd_create returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `si_code` of a SIGSEGV raised by an access to no mapping, or to a
/// guard marker.
pub(crate) const SEGV_MAPERR: libc::c_int = 1;

/// The kernel's limit on a process's memory areas (`vm.max_map_count`;
/// 65,530 unless the file cannot be read).
pub(crate) fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530)
}

/// How many memory areas this process has now: the lines of
/// `/proc/self/maps` (reads the whole file: for measurements and tests).
pub fn process_map_areas() -> io::Result<usize> {
    use std::io::BufRead;
    let file = std::io::BufReader::new(File::open("/proc/self/maps")?);
    let mut n = 0;
    for line in file.split(b'\n') {
        line?;
        n += 1;
    }
    Ok(n)
}

/// Maps `len` bytes of `fd` at file offset `offset`, `MAP_SHARED`,
/// with protection `prot`, at an address congruent to
/// `offset` modulo `align` (a power of two), so that the VA-aligned
/// fault-around window is aligned in the file too, as the kernel arranges
/// for large-folio file mappings.
pub(crate) fn mmap_shared_aligned(
    fd: &OwnedFd,
    len: usize,
    offset: u64,
    align: usize,
    prot: Prot,
) -> io::Result<MappedRegion> {
    let prot = prot.bits();
    // 1. Reserve len + align bytes of address space, inaccessible.
    let reserve_len = len
        .checked_add(align)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // SAFETY: an anonymous PROT_NONE reservation at an address of the kernel's
    // choice touches no existing mapping.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            reserve_len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = base as usize;
    // 2. Pick the first address in it congruent to offset mod align.
    let want = (offset as usize) & (align - 1);
    let start = base + ((want + align - (base & (align - 1))) & (align - 1));
    // 3. Map the file there (MAP_FIXED replaces part of our own reservation).
    let mapped = mmap_at(
        Some(start),
        fd,
        len,
        offset,
        prot,
        // No reservation: a hugetlb memfd's pages are allocated when they
        // are filled (`allocate`), and a fault here never allocates (the
        // range is registered MISSING, so a hole goes to the pager). For
        // shmem the flag changes nothing (the memfd is accounted whole).
        libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
    );
    // 4. Give back the unused head and tail of the reservation.
    let end = start + len;
    // SAFETY: [base, start) and [end, base+reserve_len) are parts of the
    // reservation made above that nothing else uses.
    unsafe {
        if start > base {
            libc::munmap(base as *mut libc::c_void, start - base);
        }
        if base + reserve_len > end {
            libc::munmap(end as *mut libc::c_void, base + reserve_len - end);
        }
    }
    if mapped.is_err() {
        // SAFETY: the middle of our reservation, still ours when MAP_FIXED failed.
        unsafe { libc::munmap(start as *mut libc::c_void, len) };
    }
    mapped
}

fn mmap_at(
    at: Option<usize>,
    fd: &OwnedFd,
    len: usize,
    offset: u64,
    prot: libc::c_int,
    flags: libc::c_int,
) -> io::Result<MappedRegion> {
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let hint = at.map_or(std::ptr::null_mut(), |a| a as *mut libc::c_void);
    // SAFETY: maps a file; with MAP_FIXED the caller guarantees `at` lies in a
    // reservation it owns (see mmap_shared_aligned), otherwise the kernel
    // picks an unused range.
    let ptr = unsafe { libc::mmap(hint, len, prot, flags, fd.as_raw_fd(), offset) };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let ptr =
        NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(MappedRegion {
        ptr,
        len,
        disowned: std::sync::atomic::AtomicBool::new(false),
        listed: std::sync::atomic::AtomicBool::new(false),
        id: next_map_id(),
        share: std::sync::OnceLock::new(),
        foreign: false,
    })
}

/// `"procfs"` when the file lives on procfs (`fstatfs`'s magic), whose
/// files report sizes that are not their contents; `None` elsewhere.
pub(crate) fn pseudo_fs(fd: BorrowedFd<'_>) -> io::Result<Option<&'static str>> {
    // SAFETY: statfs is plain old data; zeroes are a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one `struct statfs` to `st`, which outlives the
    // call; `fd` is a live descriptor.
    let rc = unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    Ok((magic == PROC_SUPER_MAGIC).then_some("procfs"))
}

/// Clears `O_NONBLOCK` on `fd` (set only to open a path without blocking
/// on a FIFO; some FUSE filesystems would honour it on reads).
pub(crate) fn clear_nonblock(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL read and set the descriptor's status flags;
    // no memory is passed.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads at most `buf.len()` bytes at `offset` (one `pread`), returning how
/// many it read.
pub(crate) fn pread_some(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // SAFETY: pread writes at most buf.len() bytes into `buf`, which we hold
    // mutably for the call.
    let rc = unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            offset as libc::off_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Copies `dst.len()` bytes from this process's address `src` into `dst`
/// with the kernel's access (`process_vm_readv` on this process), returning
/// how many it copied: fewer at a page the kernel cannot read (`EFAULT`
/// when none). A userfaultfd-registered page is faulted in by the
/// userfaultfd's handler (one that serves kernel faults) while the call
/// waits; a poisoned page ends the copy instead of raising SIGBUS.
pub(crate) fn read_own_memory(src: *const u8, dst: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src.cast_mut().cast(),
        iov_len: dst.len(),
    };
    // SAFETY: the kernel writes at most `dst.len()` bytes into `dst`, which
    // we hold mutably for the call, and only reads at `src` through its own
    // checked access: an address that is not readable is an error
    // (EFAULT or a short count), never a fault in this thread.
    let rc = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// Keeps the range out of forked children: `madvise(MADV_DONTFORK)`, so
/// that a child does not inherit it (its copy would lose the userfaultfd
/// registration), and lists it for the at-fork child handler
/// (`sys::fork`): with `shared` (the memfd, the range's offset in it, and
/// whether it is writable), a child of a process that serves guests maps
/// the range again there and has it served by this process
/// (`sys::share`); otherwise, or where that fails, the child gets an
/// inaccessible placeholder, so that a pointer into it faults (SIGSEGV)
/// instead of reading what the child maps in its place. Listed first: the
/// range is never `DONTFORK` without being listed (unless the at-fork
/// handlers could not be registered, [`children_reserved`]). On error the
/// range stays listed until `region` is dropped.
pub(crate) fn dont_fork(
    region: &MappedRegion,
    shared: Option<(&OwnedFd, u64, bool, bool)>,
) -> io::Result<()> {
    if let Some((fd, offset, writable, protect)) = shared {
        let _ = region.share.set(share::Share {
            fd: fd.as_raw_fd(),
            offset,
            writable,
            id: region.id,
            protect,
        });
    }
    region.list_for_children();
    // SAFETY: advises on a range this process mapped and owns; DONTFORK
    // changes no content.
    let rc = unsafe { libc::madvise(region.as_ptr().cast(), region.len(), libc::MADV_DONTFORK) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Measurement helpers for the benchmarks' kernel baselines.
// ---------------------------------------------------------------------------

/// Minor and major faults of this process so far (`getrusage(RUSAGE_SELF)`).
pub fn rusage_faults() -> io::Result<(u64, u64)> {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one struct rusage to a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((ru.ru_minflt as u64, ru.ru_majflt as u64))
}

/// Bytes an unprivileged writer may still use on the file system of `path`
/// (`statvfs`'s `f_bavail` blocks).
pub fn free_bytes(path: &std::path::Path) -> io::Result<u64> {
    fs_space(path).map(|(_, free)| free)
}

/// How many pages of `[addr, addr+len)` are resident in the page cache
/// (`mincore`). `addr` must be page-aligned and the range mapped.
pub fn mincore_resident(addr: *const u8, len: usize) -> io::Result<usize> {
    let pages = len.div_ceil(PAGE_SIZE);
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only reads the page tables of the range and writes one
    // byte per page into `vec`, which has exactly `pages` bytes.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count())
}

// ---------------------------------------------------------------------------
// O_DIRECT.
// ---------------------------------------------------------------------------

/// The alignment O_DIRECT needs on `fd`, as `(memory, file offset and
/// length)` in bytes, from `statx(STATX_DIOALIGN)` (Linux 6.1). `Ok(None)`
/// when the filesystem does not say; `Some((0, 0))` when it says that it
/// does not support direct I/O on this file.
pub(crate) fn dio_alignment(fd: BorrowedFd<'_>) -> io::Result<Option<(u32, u32)>> {
    // SAFETY: an all-zero statx is a valid value to be overwritten.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: with AT_EMPTY_PATH and an empty path, statx describes `fd`,
    // which the borrow keeps open for the call; it writes one struct statx
    // to a valid, exclusively borrowed pointer.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    Ok(Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align)))
}

/// `madvise(MADV_DONTNEED)` on `[addr, addr+len)` of a faultmap mapping:
/// drops its PTEs; the memfd keeps the pages, so the next touch is a MINOR
/// fault that maps them again without I/O.
pub(crate) fn madvise_dontneed(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: advises on a page-aligned range inside a shared memfd mapping
    // this process owns (the caller computed it from a live region). For a
    // shared mapping DONTNEED only drops PTEs; no memory the program holds a
    // reference into changes content.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Punches a hole over `[offset, offset+len)` of a memfd: its pages leave
/// the page cache and read as zeros; the file keeps its size.
pub(crate) fn punch_hole(fd: &OwnedFd, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate on an fd we own; no memory is passed.
    let rc = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Futexes, CPU number, signals: what the signal-delivery path may call.
// Each of these is a single system call (or a vDSO/rseq read) and is
// async-signal-safe.
// ---------------------------------------------------------------------------

/// Sleeps while `word` holds `expected`, at most `timeout` (none: no limit).
/// Returns on a wake, a changed value, a signal or the timeout, without
/// saying which: callers re-check `word`.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn futex_wait(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: Option<std::time::Duration>,
) {
    futex_wait_op(
        word,
        expected,
        timeout,
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
    );
}

/// Wakes up to `n` threads sleeping in [`futex_wait`] on `word`.
pub(crate) fn futex_wake(word: &std::sync::atomic::AtomicU32, n: i32) {
    futex_wake_op(word, n, libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG);
}

/// [`futex_wait`] on a word in memory another process maps too (a shared
/// futex: keyed by the page, not the address).
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn futex_wait_shared(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: Option<std::time::Duration>,
) {
    futex_wait_op(word, expected, timeout, libc::FUTEX_WAIT);
}

/// Wakes up to `n` threads of any process sleeping in
/// [`futex_wait_shared`] on `word`. Async-signal-safe.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn futex_wake_shared(word: &std::sync::atomic::AtomicU32, n: i32) {
    futex_wake_op(word, n, libc::FUTEX_WAKE);
}

#[cfg_attr(loom, allow(dead_code))]
fn futex_wait_op(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: Option<std::time::Duration>,
    op: libc::c_int,
) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the u32 at `word` (a live, aligned atomic) and
    // the optional timespec, which lives across the call.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op, expected, ts_ptr);
    }
}

fn futex_wake_op(word: &std::sync::atomic::AtomicU32, n: i32, op: libc::c_int) {
    // SAFETY: FUTEX_WAKE only uses `word`'s address as a key; it reads and
    // writes no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op, n);
    }
}

/// The CPU this thread runs on (a hint: it may move at once), 0 if unknown.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn current_cpu() -> usize {
    // SAFETY: sched_getcpu takes no argument; glibc reads it from the rseq
    // area or the vDSO.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// The CPUs the calling thread may run on (its affinity mask), in order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()`
    // bytes into `set`, which lives for the whole call; pid 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size in CPUs.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Pins the calling thread to `cpus` (its affinity mask becomes exactly
/// that set). `EINVAL` if the set is empty or names no CPU the thread may
/// use.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of
    // `set`, which lives for the whole call; pid 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A SIGBUS or SIGSEGV handler with `SA_SIGINFO`'s arguments.
pub(crate) type SigInfoHandler =
    extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// A saved signal disposition (what `sigaction` returned).
#[derive(Clone, Copy)]
pub(crate) struct Disposition(libc::sigaction);

/// Installs `handler` for `sig`, SIGBUS or SIGSEGV (`SA_SIGINFO | SA_NODEFER`; every
/// asynchronous signal blocked while it runs, so no other handler can run
/// inside it; synchronous ones, SIGBUS included, are not) and returns the
/// disposition it replaced.
///
/// Not `SA_ONSTACK`: the handler runs on the faulting thread's own stack.
/// The alternate stacks Rust's runtime gives its threads are a few KiB
/// (`SIGSTKSZ`), and an AVX-512 signal frame alone takes about 3 KiB of
/// that; the fault path's frames (larger in unoptimised builds) overflowed
/// it. A thread that faults on a mapping with less stack left than one
/// fault needs would overflow anyway on its next call.
pub(crate) fn fault_signal_install(
    sig: libc::c_int,
    handler: SigInfoHandler,
) -> io::Result<Disposition> {
    signal_install(sig, handler, libc::SA_SIGINFO | libc::SA_NODEFER)
}

/// Installs `handler` for an asynchronous signal (the Protect engine's
/// SIGURG): `SA_SIGINFO | SA_RESTART` (a system call it interrupts is
/// restarted where the kernel can), every asynchronous signal blocked
/// while it runs, itself included. Returns the disposition it replaced.
pub(crate) fn async_signal_install(
    sig: libc::c_int,
    handler: SigInfoHandler,
) -> io::Result<Disposition> {
    signal_install(sig, handler, libc::SA_SIGINFO | libc::SA_RESTART)
}

/// `sigaction(sig)` with `handler`, `flags`, and every asynchronous signal
/// blocked while it runs ([`async_signals`]); the disposition replaced.
fn signal_install(
    sig: libc::c_int,
    handler: SigInfoHandler,
    flags: libc::c_int,
) -> io::Result<Disposition> {
    // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, no flags,
    // empty mask), filled in below.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = handler as usize;
    new.sa_flags = flags;
    new.sa_mask = async_signals();
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: sigaction reads `new` and writes `old`, both live.
    if unsafe { libc::sigaction(sig, &new, &mut old) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Disposition(old))
}

/// Every signal but the synchronous ones (SIGBUS, SIGSEGV, SIGILL,
/// SIGFPE, SIGTRAP: a fault must reach its handler).
fn async_signals() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid value for sigfillset to
    // fill; sigdelset changes the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sync in [
            libc::SIGBUS,
            libc::SIGSEGV,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
        ] {
            libc::sigdelset(&mut set, sync);
        }
        set
    }
}

/// Blocks (`block`) or unblocks signal `sig` in the calling thread.
/// Async-signal-safe (`pthread_sigmask`); inside a handler the mask it
/// interrupted is restored when it returns.
pub(crate) fn signal_mask_one(sig: libc::c_int, block: bool) {
    // SAFETY: an empty set, one signal added, and pthread_sigmask reading
    // it (no old set asked for).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Runs `f` with every asynchronous signal blocked in the calling thread
/// (SIGURG included: no revoke, and no application handler that could
/// touch a mapping, interrupts it), then puts the thread's mask back as
/// it was. Async-signal-safe.
pub(crate) fn with_async_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    let set = async_signals();
    // SAFETY: an all-zero sigset_t is a valid value to be overwritten;
    // pthread_sigmask reads `set` and writes the old mask into `old`, then
    // reads `old` back.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        let out = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        out
    }
}

/// Puts `handler` back as the handler of `sig` if something replaced it.
pub(crate) fn fault_signal_reinstall(sig: libc::c_int, handler: SigInfoHandler) -> io::Result<()> {
    if fault_signal_query(sig)?.is(handler) {
        return Ok(());
    }
    fault_signal_install(sig, handler).map(drop)
}

/// The faulting address and the `si_code` of a SIGBUS or SIGSEGV.
///
/// # Safety
///
/// `info` must be the `siginfo_t` the kernel passed to an `SA_SIGINFO`
/// handler (or null).
pub(crate) unsafe fn siginfo_fault(info: *const libc::siginfo_t) -> Option<(usize, i32)> {
    if info.is_null() {
        return None;
    }
    // SAFETY: the caller passes the kernel's siginfo, readable for the
    // handler's duration; si_addr is valid for SIGBUS.
    unsafe { Some(((*info).si_addr() as usize, (*info).si_code)) }
}

/// `si_code` of a SIGSEGV raised by an access that the mapping's
/// protection refuses (the `libc` crate does not carry it).
pub(crate) const SEGV_ACCERR: libc::c_int = 2;

/// Whether [`fault_may_write`] tells reads from writes (x86-64's error
/// code), rather than answering "may be" for every access.
pub(crate) const FAULT_WRITE_KNOWN: bool = cfg!(target_arch = "x86_64");

/// Whether the access that raised a SIGBUS or SIGSEGV may be a write: on x86-64 the
/// page-fault error code the kernel saved in the signal frame (`REG_ERR`,
/// bit 1: a write); elsewhere, or without a frame, it may be.
///
/// # Safety
///
/// `ctx` must be the `ucontext_t` the kernel passed to an `SA_SIGINFO`
/// handler (or null).
pub(crate) unsafe fn fault_may_write(ctx: *const libc::c_void) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if ctx.is_null() {
            return true;
        }
        const PF_WRITE: libc::greg_t = 1 << 1;
        // SAFETY: the caller passes the kernel's ucontext, readable for the
        // handler's duration; REG_ERR is inside `gregs`.
        let err =
            unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] };
        err & PF_WRITE != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ctx;
        true
    }
}

/// Hands signal `sig` (SIGBUS or SIGSEGV) to the disposition `prev` as if
/// it had been delivered there (`sent`: by kill/raise, not by a fault): its
/// handler is called with the same arguments; an ignored sent signal is
/// dropped; the default (or ignore, which the kernel does not honour for a
/// fault) is restored and the signal raised again, which ends the process
/// with `sig` as it would have ended without faultmap.
///
/// # Safety
///
/// `info` and `ctx` must be the arguments the kernel passed to the running
/// handler (or `info` a copy of them, changed to say `sig`).
pub(crate) unsafe fn fault_signal_chain(
    prev: &Disposition,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    sent: bool,
) {
    let action = prev.0.sa_sigaction;
    // An ignored signal that was sent (kill, raise) is dropped; an ignored
    // fault is not honoured by the kernel, which kills.
    if action == libc::SIG_IGN && sent {
        return;
    }
    if action == libc::SIG_DFL || action == libc::SIG_IGN {
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
        let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        dfl.sa_sigaction = libc::SIG_DFL;
        // SAFETY: sigaction reads a live struct; raise takes an integer.
        // The signal is not blocked in the handler (SA_NODEFER), so the
        // raise ends the process here. (Returning and letting the access
        // fault again would not do: another thread may map the page
        // meanwhile, and the process would go on with no handler at all.)
        unsafe {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            libc::raise(sig);
        }
        return;
    }
    if prev.0.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the application installed this value as an SA_SIGINFO
        // handler, so it is a function with this signature.
        let f: SigInfoHandler = unsafe { std::mem::transmute::<usize, SigInfoHandler>(action) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the application installed this value as a plain handler.
        let f: extern "C" fn(libc::c_int) =
            unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(action) };
        f(sig);
    }
}

/// Empties an eventfd's counter (it stops being readable). Errors (nothing
/// to read) are ignored.
pub(crate) fn eventfd_drain(fd: &OwnedFd) {
    let mut count: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}

/// CLOCK_MONOTONIC in nanoseconds (vDSO; async-signal-safe).
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// How many forks this process descends from since the counting hook was
/// registered: what was made under an older generation belongs to an
/// ancestor process.
static FORK_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether the counting hook is registered (a child inherits it, and the
/// hook).
static FORK_COUNTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// In a child of `fork`: a new generation (atomics only: async-signal-safe).
extern "C" fn count_fork() {
    FORK_GENERATION.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
}

/// Registers [`count_fork`] when the library is loaded (an ELF
/// constructor): before any thread of the library's exists, so that no
/// fork can come while it is half done (a `Once` taken by a thread that
/// the child does not have would block the child for good).
extern "C" fn register_fork_counter() {
    if at_fork_child(count_fork).is_ok() {
        FORK_COUNTED.store(true, std::sync::atomic::Ordering::Release);
    }
}

#[used]
#[link_section = ".init_array"]
static REGISTER_FORK_COUNTER: extern "C" fn() = register_fork_counter;

/// The process's fork generation, to record in what it makes (a pager's
/// threads, an object, a mapping, the network runtime) and compare before
/// using or dropping it: a forked child has none of its parent's threads,
/// and a lock a parent thread held at the fork stays held in the child.
/// An opaque number: compare two for equality only. (If the at-fork hook
/// could not be registered, it is made of the process id. Children made
/// without the at-fork handlers, by a raw `clone`, are not told apart.)
/// Atomics and `getpid` only: async-signal-safe.
pub fn fork_generation() -> u64 {
    if FORK_COUNTED.load(std::sync::atomic::Ordering::Acquire) {
        FORK_GENERATION.load(std::sync::atomic::Ordering::Acquire)
    } else {
        // SAFETY: getpid has no preconditions and cannot fail.
        (1 << 63) | u64::from(unsafe { libc::getpid() } as u32)
    }
}

/// A value per fork generation, for a `static`: made on first use in a
/// process, and made anew in a forked child, where the parent's value is
/// leaked, never dropped (its drop could wait for threads the child does
/// not have, or take a lock a parent thread held at the fork). Values are
/// never freed: at most one per generation, each inherited copy-on-write.
pub(crate) struct ForkLocal<T> {
    current: std::sync::atomic::AtomicPtr<(u64, T)>,
    /// Shared like a `&T` (Sync only for `T: Sync`), owned like a `T`.
    _value: std::marker::PhantomData<T>,
}

impl<T> ForkLocal<T> {
    pub(crate) const fn new() -> Self {
        Self {
            current: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            _value: std::marker::PhantomData,
        }
    }

    /// This generation's value, if it was made. Atomics only:
    /// async-signal-safe.
    pub(crate) fn get(&self) -> Option<&T> {
        let current = self.current.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: a published value is never freed (`get_or_try_init`
        // frees only values it did not publish).
        let (born, value) = unsafe { current.as_ref() }?;
        (*born == fork_generation()).then_some(value)
    }

    /// This generation's value, made by `make` if there is none yet (a
    /// thread that loses the race to publish drops its own).
    pub(crate) fn get_or_init(&self, make: impl FnOnce() -> T) -> &T {
        match self.get_or_try_init(|| Ok::<T, std::convert::Infallible>(make()), drop) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    /// This generation's value, made by `make` if there is none yet. A
    /// thread that loses the race to publish hands its own to `discard`.
    pub(crate) fn get_or_try_init<E>(
        &self,
        make: impl FnOnce() -> Result<T, E>,
        discard: impl FnOnce(T),
    ) -> Result<&T, E> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        if let Some(value) = self.get() {
            return Ok(value);
        }
        let fresh = Box::into_raw(Box::new((fork_generation(), make()?)));
        let mut current = self.current.load(Acquire);
        loop {
            // SAFETY: as in `get`: published values are never freed.
            if let Some((born, value)) = unsafe { current.as_ref() } {
                if *born == fork_generation() {
                    // Another thread published this generation's first.
                    // SAFETY: `fresh` came from Box::into_raw and was
                    // never published.
                    discard(unsafe { Box::from_raw(fresh) }.1);
                    return Ok(value);
                }
            }
            // None yet, or an ancestor's (leaked: not freed here).
            match self
                .current
                .compare_exchange(current, fresh, AcqRel, Acquire)
            {
                // SAFETY: just published, never freed.
                Ok(_) => return Ok(unsafe { &(*fresh).1 }),
                Err(seen) => current = seen,
            }
        }
    }
}

/// Registers `child` to run in the child process right after every
/// `fork` (`pthread_atfork`).
pub(crate) fn at_fork_child(child: extern "C" fn()) -> io::Result<()> {
    // SAFETY: registers a plain function pointer, valid for the program's
    // life; no prepare or parent handler.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(child)) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Registers `prepare` to run in the forking thread before every `fork`,
/// and `parent` and `child` after it, in the parent (also when the fork
/// failed) and in the child (`pthread_atfork`): all three or none.
pub(crate) fn at_fork(
    prepare: extern "C" fn(),
    parent: extern "C" fn(),
    child: extern "C" fn(),
) -> io::Result<()> {
    // SAFETY: registers plain function pointers, valid for the program's
    // life.
    let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// The calling thread's `errno`.
pub(crate) fn errno_get() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
pub(crate) fn errno_set(value: i32) {
    // SAFETY: as in `errno_get`; the slot is writable.
    unsafe { *libc::__errno_location() = value };
}

/// The current disposition of `sig`.
pub(crate) fn fault_signal_query(sig: libc::c_int) -> io::Result<Disposition> {
    // SAFETY: an all-zero sigaction is a valid value to be overwritten.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries the current one into `cur`.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Disposition(cur))
}

impl Disposition {
    /// Whether this is `handler`.
    pub fn is(&self, handler: SigInfoHandler) -> bool {
        self.0.sa_sigaction == handler as usize
    }

    /// Whether this is the default action.
    pub fn is_default(&self) -> bool {
        self.0.sa_sigaction == libc::SIG_DFL
    }

    /// Whether this is the default action or ignore.
    pub fn is_default_or_ignore(&self) -> bool {
        self.0.sa_sigaction == libc::SIG_DFL || self.0.sa_sigaction == libc::SIG_IGN
    }
}

/// The calling thread's id. Async-signal-safe.
pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Puts the default disposition of `sig` back. Async-signal-safe.
pub(crate) fn fault_signal_default(sig: libc::c_int) {
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags; sigaction
    // reads it.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}

/// Ends the process with `sig` now: the default disposition, raised.
pub(crate) fn fault_signal_die(sig: libc::c_int) {
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags; sigaction
    // reads it; raise takes an integer.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// Runs `check` in a forked child and tells whether it returned true
/// there (for tests of what a child sees; `check` should do little: the
/// child has only the forking thread).
#[cfg(all(test, not(loom)))]
pub(crate) fn true_in_fork_child(check: impl FnOnce() -> bool) -> bool {
    // SAFETY: the child runs `check` and leaves at once with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let ok = check();
        // SAFETY: leaves the forked child at once.
        unsafe { libc::_exit(i32::from(!ok)) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_fork_counter_is_registered_at_load_and_counts_a_fork() {
        // The ELF constructor ran (else the generation falls back to the
        // process id, which a raw clone would not change).
        assert!(FORK_COUNTED.load(std::sync::atomic::Ordering::Acquire));
        let parent = fork_generation();
        assert!(true_in_fork_child(|| fork_generation() != parent));
        assert_eq!(
            fork_generation(),
            parent,
            "the parent's generation is its own"
        );
    }
}
