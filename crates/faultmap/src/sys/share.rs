//! Guests: a forked child's faults on the mappings it inherited, and an
//! unrelated process's on the ranges it joined (`crate::api::shared`),
//! served by the process that owns their cache (the *owner*,
//! `crate::mm::guest`).
//!
//! ## Why the owner serves them
//!
//! A child of `fork` gets no pager thread, and without
//! `UFFD_FEATURE_EVENT_FORK` (which needs `CAP_SYS_PTRACE`) its copy of a
//! registered range loses the registration: a page not in the cache would
//! read as zeros, and that zero page would land in the shared memfd. So a
//! mapping is `MADV_DONTFORK`, and the at-fork child handler (`sys::fork`)
//! maps each *shared* range again, at its address, from the memfd the child
//! inherited, registers it with a userfaultfd of its own (SIGBUS delivery,
//! user-mode only when the owner's is), and hands that userfaultfd to the
//! owner over a Unix socket (`SCM_RIGHTS`). From then on the child's faults
//! there are SIGBUSes, which its (inherited) handler forwards to the owner;
//! the owner resolves them in the child's address space with
//! `UFFDIO_CONTINUE` on the child's userfaultfd, from its one page cache,
//! under its one memory budget. A page any process read is not read again.
//!
//! ## The wire
//!
//! Every message is a `SOCK_SEQPACKET` record of native-endian `u64` words
//! (both ends are the same program on the same machine):
//!
//! ```text
//!   child -> service socket   [HELLO, pid, flags]   + fds [userfaultfd?, mailbox?, alive?, channel]
//!   child -> its channel      [RANGES, n, (id, addr, len) x n]   (n <= RANGES_MAX)
//!   child -> its channel      [FAULT, addr, flags]         + fd  [answer socket]
//!   owner -> answer socket    [answer]                      (MAPPED, RETRY, FAILED)
//! ```
//!
//! `flags` says what the greeting carries: a userfaultfd for the owner's
//! userfaultfd-engine ranges (`HELLO_UFFD`), a mailbox and an alive page
//! for its Protect ranges (`HELLO_PROTECT`, `sys::revoke`), or both. A
//! Protect range's fault is answered with a grant, and its pages are taken
//! back by records:
//!
//! ```text
//!   owner -> answer socket    [GRANT, g, n, (addr, len, prot) x n]   (or MAPPED, RETRY, FAILED)
//!   owner -> child            SIGURG (pidfd_send_signal), a record in the mailbox
//! ```
//!
//! An unrelated process (one that shares with the switch on, see
//! `sys::rendezvous`) connects to the owner's named socket, and that
//! connection is its channel:
//!
//! ```text
//!   joiner -> channel   [JOIN, pid, key bytes, key...]        + fd [userfaultfd]
//!                    or [JOIN_PROTECT, ...]                  + fds [mailbox, alive page]
//!   owner  -> channel   [JOINED, object id, length, page bytes] + fd [memfd]
//!                    or [REFUSED]
//!   joiner -> channel   [RANGE_OF, object id, addr, len, first page, pages]
//!   joiner -> channel   [FAULT, addr, flags]                  + fd [answer socket]
//!   joiner -> channel   [UNLINKED]     (Protect: its range is unmapped, before it closes)
//! ```
//!
//! Its ranges are *links* (`crate::mm::links`): the SIGBUS handler finds
//! the channel of a faulting address there and asks with
//! [`request_on`]; the owner's death is seen by a pidfd of the owner
//! (`SO_PEERPIDFD`) or, without one, by the channel's end-of-file.
//!
//! `id` names the owner's mapping the range copies (`MappedRegion::id`,
//! never reused), so a range the owner unmapped and mapped again since is
//! never taken for the old one. A fault carries a socket of its own for the
//! answer, so any number of the child's threads can wait at once without a
//! lock.
//!
//! ## Invariants
//!
//! - A child's range is registered before the child runs any code of its
//!   own, and stays registered while the child lives: the child never
//!   closes its userfaultfd, and the owner keeps its copy until the child
//!   exits (not only until its channel closes: a child that closes every
//!   descriptor it has keeps its ranges registered). So no page of it is
//!   ever served by the kernel's shmem fault (which would fill a hole with
//!   zeros), whatever happens to the owner.
//! - The owner's death is seen by the child: it is no longer the child's
//!   parent (`getppid`, which needs no descriptor, so no copy another
//!   process holds can hide the death), looked at whenever a send would
//!   wait and every 100 ms of a wait for an answer; and every child closes
//!   the owner's descriptors of its siblings' sockets first thing
//!   (`OWNER_FDS`), so end-of-file comes at once in the usual case. The
//!   access then gets SIGBUS (`FAILED`). Never zeros, never a wait for a
//!   process that is gone.
//! - The child's death closes its channel: the owner stops reading it and
//!   drops the child's ranges and userfaultfd once the child's pidfd says
//!   it exited. A read the child's fault started belongs to the owner, so
//!   it ends (and is kept) as any read does; an answer to a dead child is
//!   dropped.
//! - A descriptor the child stored (its channel, its userfaultfd) is used
//!   or closed only while it is still the file it was
//!   (`Ident`: its device and inode): a number the application closed and
//!   reused is never written to or closed.
//! - A child of a child gets placeholders (`sys::fork`), not ranges: only
//!   the owner's own children are guests.
//!
//! ## Limits
//!
//! - A child must not `mremap` a range it inherited: without
//!   `UFFD_FEATURE_EVENT_REMAP` (whose events someone would have to read)
//!   the kernel drops the moved range's registration, and it reads holes
//!   as zeros.
//! - A child's writes after the owner exits are not written back (the
//!   owner's cache and dirty tracking go with it): join writing children
//!   before the owner exits, as with any writer.
//! - A child that `exec`s, or closed its descriptors, keeps its guest
//!   state (its object handles) in the owner until it exits.
//! - The owner lists at most `OWNER_FDS_MAX` descriptors for children to
//!   close; beyond that, and for a child forked while the service thread
//!   takes in a new child, a child keeps copies (a leak, not a hang: the
//!   parent check still tells it of the owner's death).
//! - One service thread serves every child; with more mappings than fit in
//!   a socket's buffer (thousands), a `fork` waits for it to read them.
//! - A SIGBUS handler the application installs after faultmap's must chain
//!   to it, or a child's faults reach the application's handler instead
//!   (Python's `faulthandler` does not chain: enable it before the first
//!   mapping).
//!
//! Everything the child handler and the SIGBUS handler call here is a raw
//! system call over stack buffers: async-signal-safe.

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use super::revoke::{ChildState, Entry, Granted, MAILBOX_BYTES};
use super::UffdSource;
use super::{errno_get, feature, mode, Prot};

/// What a listed range needs for a child to map it again: the memfd (an fd
/// the child inherits), the offset of the range's first byte in it, and
/// whether it is writable. `id` names the mapping (`MappedRegion::id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub(crate) fd: RawFd,
    pub(crate) offset: u64,
    pub(crate) writable: bool,
    pub(crate) id: u64,
    /// A Protect mapping's: the child maps it `PROT_NONE` and is granted
    /// its pages (`sys::revoke`), rather than registering it with a
    /// userfaultfd.
    pub(crate) protect: bool,
}

/// The first word of a child's greeting ("faultmap" in ASCII).
pub(crate) const HELLO: u64 = 0x7061_6d74_6c75_6166;
/// A list of ranges the child mapped.
pub(crate) const RANGES: u64 = 1;
/// A fault to resolve.
pub(crate) const FAULT: u64 = 2;
/// Ranges per `RANGES` record.
pub(crate) const RANGES_MAX: usize = 64;
/// An unrelated process asks to join an object's cache (`sys::rendezvous`).
pub(crate) const JOIN: u64 = 4;
/// The owner's yes to a [`JOIN`], with the object's memfd.
pub(crate) const JOINED: u64 = 5;
/// The owner's no to a [`JOIN`] (another key, or the object is closing).
pub(crate) const REFUSED: u64 = 6;
/// A range an unrelated process mapped of the object it joined.
pub(crate) const RANGE_OF: u64 = 7;
/// Nothing but a wake of the service thread.
pub(crate) const WAKE: u64 = 8;
/// A [`JOIN`] under the Protect engine: its fds are the joiner's mailbox
/// and alive page (`sys::revoke`), not a userfaultfd.
pub(crate) const JOIN_PROTECT: u64 = 9;
/// A Protect joiner unmapped its range (sent before its channel closes):
/// it reaches nothing any more, and its guest may end.
pub(crate) const UNLINKED: u64 = 10;
/// The longest version key a [`JOIN`] carries, in bytes.
pub(crate) const KEY_MAX: usize = 8 * (MAX_WORDS - 3);
/// The longest record, in words.
pub(crate) const MAX_WORDS: usize = 2 + 3 * RANGES_MAX;
/// `FAULT` flags: the access may be a write; the fault is the retry of one
/// answered `RETRY`.
pub(crate) const FLAG_WRITE: u64 = 1;
pub(crate) const FLAG_RETRY: u64 = 2;

/// The owner's answer to a fault.
// A grant is carried by value: the SIGSEGV handler that receives it may
// not allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Mapped (or to be retried by faulting again): return.
    Mapped,
    /// The read it waited for ended: ask again.
    Retry,
    /// The page cannot be had, or the owner is gone: SIGBUS.
    Failed,
    /// Under the Protect engine: the child may make these ranges
    /// reachable itself (`sys::revoke`), then return.
    Grant(Grant),
}

/// What a Protect child may make reachable: `entries[..n]`, under grant
/// number `g` (`sys::revoke`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) g: u64,
    pub(crate) n: usize,
    pub(crate) entries: [Entry; GRANT_MAX],
}

/// Entries per grant.
pub(crate) const GRANT_MAX: usize = 8;
/// Answer words: what each answer's first word is.
const ANSWER_MAPPED: u64 = 1;
const ANSWER_RETRY: u64 = 2;
const ANSWER_FAILED: u64 = 3;
const ANSWER_GRANT: u64 = 4;
/// The longest answer: `[GRANT, g, n, (addr, len, prot) x GRANT_MAX]`.
const ANSWER_WORDS: usize = 3 + 3 * GRANT_MAX;
/// A greeting's third word's bits: the child sends a userfaultfd (for the
/// owner's userfaultfd-engine ranges), a mailbox (for its Protect ranges,
/// `sys::revoke`), or both, in that order before its channel.
pub(crate) const HELLO_UFFD: u64 = 1;
pub(crate) const HELLO_PROTECT: u64 = 2;

/// The owner's service socket (the end children send to), or -1: this
/// process serves no guests.
static SERVICE: AtomicI32 = AtomicI32::new(-1);
/// How a child opens its userfaultfd (`UffdSource` as 1, 2, 3) in the top
/// byte, and the features it asks for below.
static UFFD_HOW: AtomicU64 = AtomicU64::new(0);
/// In a guest: its channel to the owner and its userfaultfd (each with
/// its identity: a descriptor number the application closed and reused is
/// never taken for ours).
static CHANNEL: Ident = Ident::new();
static GUEST_UFFD: Ident = Ident::new();
/// This process's pid once it serves children (set by [`start_service`]); a child
/// inherits it as its parent's.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);
/// In a guest: the pid of the owner that serves it, its parent (set by
/// [`start_child`], kept when the guest becomes an owner itself, which
/// sets [`OWNER_PID`] anew). The owner is alive while `getppid()` says so
/// (a child is reparented when its parent dies, before the parent's pid
/// can be reused).
static SERVED_BY: AtomicI32 = AtomicI32::new(0);
/// How often a guest waiting on its owner looks whether the owner is
/// still its parent, in milliseconds.
const OWNER_CHECK_MS: i32 = 100;
/// The owner's own descriptors of its guests (channels, userfaultfds) and
/// its service socket's receiving end: a child of the owner inherits them
/// and closes them first thing, so that the owner's death closes every
/// copy (a child's sibling must not keep its channel open) and no child
/// carries its siblings' descriptors. Slots of -1 are free.
static OWNER_FDS: [AtomicI32; OWNER_FDS_MAX] = [const { AtomicI32::new(-1) }; OWNER_FDS_MAX];
const OWNER_FDS_MAX: usize = 4096;

/// Who serves a fault, and how its death is seen.
#[derive(Clone, Copy)]
enum Owner {
    /// This process's parent, forked from it (`getppid`).
    Parent,
    /// An unrelated process: gone once this pidfd is readable (-1: seen by
    /// the channel's end-of-file only).
    Pidfd(RawFd),
}

impl Owner {
    /// Whether the owner has exited. Async-signal-safe.
    fn gone(self) -> bool {
        match self {
            Owner::Parent => owner_gone(),
            Owner::Pidfd(fd) if fd >= 0 => {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
            }
            Owner::Pidfd(_) => false,
        }
    }
}

/// A descriptor of this process's, with the device and inode it had when
/// it was stored.
struct Ident {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Ident {
    const fn new() -> Self {
        Self {
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }

    fn set(&self, fd: RawFd) {
        let (dev, ino) = identity(fd).unwrap_or((0, 0));
        self.dev.store(dev, Ordering::Relaxed);
        self.ino.store(ino, Ordering::Relaxed);
        self.fd.store(fd, Ordering::Release);
    }

    /// The descriptor, if it is still the one stored (an `fstat`).
    fn get(&self) -> Option<RawFd> {
        let fd = self.fd.load(Ordering::Acquire);
        if fd < 0 {
            return None;
        }
        let want = (
            self.dev.load(Ordering::Relaxed),
            self.ino.load(Ordering::Relaxed),
        );
        (identity(fd) == Some(want)).then_some(fd)
    }

    /// Forgets the descriptor, closing it if it is still ours.
    fn forget(&self) {
        if let Some(fd) = self.get() {
            close(fd);
        }
        self.fd.store(-1, Ordering::Release);
    }
}

/// `(st_dev, st_ino)` of `fd` (a raw `fstat`).
fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one struct stat to a live value.
    if unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Lists `fd` as one of the owner's guest descriptors (see [`OWNER_FDS`]);
/// false if the list is full (a child then keeps a copy).
pub(crate) fn own_fd(fd: RawFd) -> bool {
    OWNER_FDS.iter().any(|slot| {
        slot.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// Takes `fd` off the list, before the owner closes it (so a child never
/// closes a number the owner closed and reused).
pub(crate) fn disown_fd(fd: RawFd) {
    if let Some(slot) = OWNER_FDS.iter().find(|s| s.load(Ordering::Acquire) == fd) {
        slot.store(-1, Ordering::Release);
    }
}

/// Makes this process an owner: children forked from now on greet the
/// service thread at `service` (the sending end of the owner's service
/// socket, kept open for the process's life). Called once, after
/// [`serve_uffd`] or [`serve_protect`] said how they are served.
pub(crate) fn start_service(service: RawFd) {
    // SAFETY: getpid cannot fail.
    OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    SERVICE.store(service, Ordering::Release);
}

/// Children forked from now on open a userfaultfd for their
/// userfaultfd-engine ranges, as `source` opened the owner's (the first
/// one's), with `features` (added to those asked for before;
/// `UFFD_FEATURE_SIGBUS` besides).
pub(crate) fn serve_uffd(source: UffdSource, features: u64) {
    let features = (features | feature::SIGBUS) & ((1 << 56) - 1);
    let _ = UFFD_HOW.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let how = match old >> 56 {
            0 => u64::from(how(source)),
            how => how,
        };
        Some(how << 56 | (old & ((1 << 56) - 1)) | features)
    });
}

/// Children forked from now on make a mailbox for their Protect ranges
/// (`sys::revoke`), which start inaccessible until granted.
pub(crate) fn serve_protect() {
    AREA_MARK.store(super::max_map_count() / 2, Ordering::Relaxed);
    SERVE_PROTECT.store(true, Ordering::Release);
}

/// Whether children make a mailbox ([`serve_protect`]).
static SERVE_PROTECT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is a guest whose owner is alive: its inherited
/// ranges are served by the process that forked it.
pub fn is_guest() -> bool {
    CHANNEL.get().is_some() && !owner_gone()
}

/// Whether this guest's owner has exited: it is no longer the parent.
/// Async-signal-safe (`getppid`); needs no descriptor, so no copy another
/// process holds can hide the death.
fn owner_gone() -> bool {
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    parent != SERVED_BY.load(Ordering::Relaxed)
}

/// A socket pair for records (`SOCK_SEQPACKET`), close-on-exec.
pub(crate) fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = raw_pair().map_err(std::io::Error::from_raw_os_error)?;
    // SAFETY: both fds were just returned by socketpair and belong to no one.
    Ok(unsafe { (OwnedFd::from_raw_fd(a), OwnedFd::from_raw_fd(b)) })
}

fn raw_pair() -> Result<(RawFd, RawFd), i32> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: socketpair writes two ints to a valid array of two.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(errno_get());
    }
    Ok((fds[0], fds[1]))
}

/// Sends `words` on `fd` with `fds` attached (at most four), never raising
/// SIGPIPE. Returns the errno on failure. Async-signal-safe.
fn send_raw(fd: RawFd, words: &[u64], fds: &[RawFd]) -> Result<(), i32> {
    send_raw_flags(fd, words, fds, 0)
}

/// [`send_raw`] with `flags` added to `MSG_NOSIGNAL`.
fn send_raw_flags(fd: RawFd, words: &[u64], fds: &[RawFd], flags: libc::c_int) -> Result<(), i32> {
    debug_assert!(fds.len() <= 4);
    let mut iov = libc::iovec {
        iov_base: words.as_ptr() as *mut libc::c_void,
        iov_len: std::mem::size_of_val(words),
    };
    // Room for one header with four fds, aligned for cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: an all-zero msghdr is valid (no name, no control yet).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        debug_assert!(msg.msg_controllen <= std::mem::size_of_val(&control));
        // SAFETY: msg_control points at `control`, big enough for one
        // header with `bytes` of data (checked above), so the first header
        // and its data are inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: `msg` points at `iov` and `control`, both live for the
        // call; the kernel only reads them.
        let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | flags) };
        if rc >= 0 {
            return Ok(());
        }
        let e = errno_get();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// What [`recv`] read.
pub(crate) enum Received {
    /// A record of this many words (a partial last word is dropped), and
    /// the fds that came with it.
    Record(usize, Vec<OwnedFd>),
    /// Nothing waiting (a non-blocking socket).
    Empty,
    /// The other end is closed.
    Closed,
}

/// Receives one record into `words`, with up to four fds (close-on-exec).
/// A record longer than `words` is cut (`MSG_TRUNC`), and a fd beyond
/// four closed by the kernel (`MSG_CTRUNC`).
pub(crate) fn recv(fd: &OwnedFd, words: &mut [u64]) -> std::io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: words.as_mut_ptr().cast(),
        iov_len: std::mem::size_of_val(words),
    };
    let mut control = [0u64; 4];
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: `msg` points at `iov` (over `words`) and `control`, which
        // outlive the call; the kernel writes at most their lengths.
        let rc = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut msg,
                libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
            )
        };
        if rc >= 0 {
            break rc as usize;
        }
        match errno_get() {
            libc::EINTR => continue,
            libc::EAGAIN => return Ok(Received::Empty),
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to msg_controllen with
    // well-formed headers; CMSG_FIRSTHDR/NXTHDR stay inside it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = data / std::mem::size_of::<RawFd>();
                let at = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    // The kernel installed these fds in this process for us.
                    fds.push(OwnedFd::from_raw_fd(at.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(Received::Closed);
    }
    Ok(Received::Record(n / 8, fds))
}

/// The pid of the process that made the other end of `sock` (a socket
/// pair's maker), by the kernel's word (`SO_PEERCRED`).
pub(crate) fn peer_pid(sock: &OwnedFd) -> Option<i32> {
    peer_cred(sock).map(|c| c.pid)
}

/// The credentials of the process at the other end of `sock` as they were
/// when it connected or made the pair (`SO_PEERCRED`).
pub(crate) fn peer_cred(sock: &OwnedFd) -> Option<libc::ucred> {
    // SAFETY: an all-zero ucred is a valid value to be overwritten.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

/// A pidfd of the process that made the other end of `sock`, by the
/// kernel's word (`SO_PEERPIDFD`, Linux 6.5): the very process, even if
/// it has exited and its pid was reused since.
pub(crate) fn peer_pidfd(sock: &OwnedFd) -> Option<OwnedFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel installed a new fd for us.
    (rc == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pidfd of process `pid` (close-on-exec).
pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process of `pidfd` has exited (it is readable).
pub(crate) fn exited(pidfd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
}

/// Wakes the owner's service thread (to look at its hosted objects again).
pub(crate) fn wake() {
    let service = SERVICE.load(Ordering::Acquire);
    if service >= 0 {
        let _ = send_raw_flags(service, &[WAKE], &[], libc::MSG_DONTWAIT);
    }
}

/// Sends a record without waiting: dropped if the socket is full or
/// closed.
pub(crate) fn send_now(fd: &OwnedFd, words: &[u64]) {
    let _ = send_raw_flags(fd.as_raw_fd(), words, &[], libc::MSG_DONTWAIT);
}

/// Sends a record with fds attached (at most four), waiting while the
/// socket is full.
pub(crate) fn send(fd: &OwnedFd, words: &[u64], fds: &[RawFd]) -> std::io::Result<()> {
    send_raw(fd.as_raw_fd(), words, fds).map_err(std::io::Error::from_raw_os_error)
}

/// Opens a userfaultfd for ranges another process serves: as `source`
/// opens one, with `features` and `UFFD_FEATURE_SIGBUS` (its faults are
/// this process's SIGBUSes, forwarded by its handler).
pub(crate) fn open_guest_uffd(source: UffdSource, features: u64) -> std::io::Result<OwnedFd> {
    let fd = open_uffd(how(source)).ok_or_else(std::io::Error::last_os_error)?;
    // SAFETY: `fd` was just opened and belongs to no one else.
    let uffd = unsafe { OwnedFd::from_raw_fd(fd) };
    super::uffd_api(&uffd, features | feature::SIGBUS)?;
    Ok(uffd)
}

/// Answers a fault on its answer socket. A child that died meanwhile is
/// not an error: nobody waits.
pub(crate) fn answer(fd: &OwnedFd, answer: Answer) {
    let mut words = [0u64; ANSWER_WORDS];
    let n = match answer {
        Answer::Mapped => {
            words[0] = ANSWER_MAPPED;
            1
        }
        Answer::Retry => {
            words[0] = ANSWER_RETRY;
            1
        }
        Answer::Failed => {
            words[0] = ANSWER_FAILED;
            1
        }
        Answer::Grant(grant) => {
            let n = grant.n.min(GRANT_MAX);
            words[..3].copy_from_slice(&[ANSWER_GRANT, grant.g, n as u64]);
            for (i, e) in grant.entries[..n].iter().enumerate() {
                words[3 + 3 * i..6 + 3 * i].copy_from_slice(&[
                    e.addr as u64,
                    e.len as u64,
                    prot_word(e.prot),
                ]);
            }
            3 + 3 * n
        }
    };
    // SAFETY: sends `n` words from a live array; MSG_DONTWAIT: an answer
    // socket holds one record, never more.
    let _ = unsafe {
        libc::send(
            fd.as_raw_fd(),
            words.as_ptr().cast(),
            8 * n,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
}

fn prot_word(p: Prot) -> u64 {
    match p {
        Prot::None => 0,
        Prot::Read => 1,
        Prot::ReadWrite => 2,
    }
}

fn word_prot(w: u64) -> Option<Prot> {
    match w {
        0 => Some(Prot::None),
        1 => Some(Prot::Read),
        2 => Some(Prot::ReadWrite),
        _ => None,
    }
}

/// Asks Protect child `pidfd` to apply its mailbox's newest record
/// (SIGURG, whose default action is to ignore it: a process that exec'd
/// since is not harmed). `Err(errno)`: `ESRCH` if it exited.
pub(crate) fn signal_child(pidfd: &OwnedFd) -> Result<(), i32> {
    // SAFETY: pidfd_send_signal takes a pidfd, a signal, a null siginfo
    // (the kernel fills in SI_USER and this process's pid) and flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGURG,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(errno_get());
    }
    Ok(())
}

/// Waits until the child acknowledged record `r` of `mailbox`, it exited
/// (`pidfd` readable), or `until` passed. Returns whether it acknowledged
/// or exited.
pub(crate) fn wait_ack(
    mailbox: &super::revoke::Mailbox,
    r: u64,
    pidfd: &OwnedFd,
    until: std::time::Instant,
) -> bool {
    loop {
        let seen = mailbox.ack_word().load(Ordering::Acquire);
        if mailbox.acked(r) || exited(pidfd) {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= until {
            return false;
        }
        // A shared futex (the word is in a page both processes map); a
        // few ms at a time, so that the child's exit is seen.
        let wait = (until - now).min(std::time::Duration::from_millis(5));
        #[cfg(not(loom))]
        super::futex_wait_shared(mailbox.ack_word(), seen, Some(wait));
        #[cfg(loom)]
        let _ = (seen, wait);
    }
}

// ---------------------------------------------------------------------------
// The child's side: async-signal-safe.
// ---------------------------------------------------------------------------

/// A child's start as a guest, from the at-fork child handler: forgets any
/// channel it inherited (a child of a guest is no guest), then, if the
/// parent is an owner, opens what its greeting sends (a userfaultfd for
/// the owner's userfaultfd-engine ranges; for its Protect ranges the
/// memfds of a mailbox and an alive page, mapped only once the ranges are
/// mapped again: `mmap` must not place them in a listed range, which is
/// free address space in the child until then) and a channel. `None`:
/// not an owner's child, or the owner cannot be reached (the caller
/// reserves instead).
pub(super) fn start_child() -> Option<Greeting> {
    // A guest's child: its parent's guest descriptors are not its own,
    // nor its mailbox.
    for ident in [&CHANNEL, &GUEST_UFFD] {
        ident.forget();
    }
    forget_mailbox();
    // An owner's child: the owner's descriptors of its other children are
    // not its own either (see OWNER_FDS).
    for slot in &OWNER_FDS {
        let fd = slot.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            close(fd);
        }
    }
    // The owner's socket is the parent's, not this process's: children of
    // this child are not guests.
    let service = SERVICE.swap(-1, Ordering::AcqRel);
    if service < 0 {
        return None;
    }
    // The parent's pid, as the parent stored it when it began to serve.
    SERVED_BY.store(OWNER_PID.load(Ordering::Relaxed), Ordering::Relaxed);
    if owner_gone() {
        // The owner died already (or this is not its child): nobody will
        // serve this child.
        close(service);
        return None;
    }
    let greeting = Greeting::prepare(service);
    if greeting.is_none() {
        close(service);
    }
    greeting
}

/// What a child greets its owner with (see [`start_child`]).
pub(super) struct Greeting {
    service: RawFd,
    /// The child's userfaultfd, or -1.
    pub(super) uffd: RawFd,
    /// The mailbox's and alive page's memfds (Protect ranges), or -1.
    mailbox: RawFd,
    alive: RawFd,
    /// The channel: this end, and the owner's.
    pub(super) channel: RawFd,
    theirs: RawFd,
}

impl Greeting {
    fn prepare(service: RawFd) -> Option<Greeting> {
        let how = UFFD_HOW.load(Ordering::Relaxed);
        let uffd = match (how >> 56) as u8 {
            0 => -1,
            source => open_uffd(source).unwrap_or(-1),
        };
        if uffd >= 0 {
            let features = how & ((1 << 56) - 1);
            // SAFETY: `uffd` was just opened and is closed only below or
            // by this process's exit; ManuallyDrop keeps the OwnedFd from
            // closing it.
            let owned = ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(uffd) });
            if super::uffd_api(&owned, features).is_err() {
                close(uffd);
                return None;
            }
        }
        let (mut mailbox, mut alive) = (-1, -1);
        if SERVE_PROTECT.load(Ordering::Acquire) {
            mailbox = sealed_page(b"faultmap-guest-mailbox\0").unwrap_or(-1);
            alive = sealed_page(b"faultmap-guest-alive\0").unwrap_or(-1);
            if mailbox < 0 || alive < 0 {
                for fd in [mailbox, alive] {
                    if fd >= 0 {
                        close(fd);
                    }
                }
                (mailbox, alive) = (-1, -1);
            }
        }
        let pair = match uffd >= 0 || mailbox >= 0 {
            true => raw_pair().ok(),
            false => None,
        };
        let Some((mine, theirs)) = pair else {
            for fd in [uffd, mailbox, alive] {
                if fd >= 0 {
                    close(fd);
                }
            }
            return None;
        };
        Some(Greeting {
            service,
            uffd,
            mailbox,
            alive,
            channel: mine,
            theirs,
        })
    }

    /// Whether Protect ranges can be served (the mailbox was made).
    pub(super) fn protect(&self) -> bool {
        self.mailbox >= 0
    }

    /// Maps the mailbox and alive pages (now that the ranges are mapped
    /// again: they land elsewhere), attaches the mailbox, and sends
    /// `[HELLO, pid, flags]` with the userfaultfd, the mailbox, the alive
    /// page (as the flags say) and the channel's other end. Returns
    /// whether it was sent. Closes the service socket and the fds sent.
    pub(super) fn send(self) -> bool {
        let mut flags = 0;
        if self.uffd >= 0 {
            flags |= HELLO_UFFD;
        }
        let mut ok = true;
        if self.mailbox >= 0 {
            flags |= HELLO_PROTECT;
            match (map_page(self.mailbox), map_page(self.alive)) {
                (Some(mailbox), Some(alive)) => {
                    CHILD_AREAS.store(0, Ordering::Relaxed);
                    child_state().reset();
                    child_state().attach(mailbox as *const super::revoke::Mailbox);
                    ALIVE.store(alive, Ordering::Relaxed);
                }
                _ => ok = false,
            }
        }
        let mut fds = [-1; 4];
        let mut n = 0;
        for fd in [self.uffd, self.mailbox, self.alive, self.theirs] {
            if fd >= 0 {
                fds[n] = fd;
                n += 1;
            }
        }
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u64;
        let sent = ok && send_raw(self.service, &[HELLO, pid, flags], &fds[..n]).is_ok();
        for fd in [self.service, self.theirs, self.mailbox, self.alive] {
            if fd >= 0 {
                close(fd);
            }
        }
        sent
    }
}

/// How [`open_uffd`] opens a userfaultfd as `source` did.
fn how(source: UffdSource) -> u8 {
    match source {
        UffdSource::Syscall => 1,
        UffdSource::Device => 2,
        UffdSource::UserModeOnly => 3,
    }
}

/// Opens a userfaultfd as the owner did (`how`: 1 the system call, 2
/// `/dev/userfaultfd`, 3 the system call for user-mode faults only).
/// Non-blocking, close-on-exec. Raw system calls only.
fn open_uffd(how: u8) -> Option<RawFd> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let fd = match how {
        1 | 3 => {
            let flags = if how == 3 {
                flags | super::UFFD_USER_MODE_ONLY
            } else {
                flags
            };
            // SAFETY: userfaultfd takes one int and returns a new fd or -1.
            unsafe { libc::syscall(libc::SYS_userfaultfd, flags) as RawFd }
        }
        2 => {
            let path = b"/dev/userfaultfd\0";
            // SAFETY: a NUL-terminated path; openat returns a new fd or -1.
            let dev = unsafe {
                libc::syscall(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    libc::O_RDWR | libc::O_CLOEXEC,
                ) as RawFd
            };
            if dev < 0 {
                return None;
            }
            // SAFETY: USERFAULTFD_IOC_NEW takes the open flags as its
            // integer argument and returns a new fd or -1.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_ioctl,
                    dev,
                    super::USERFAULTFD_IOC_NEW as libc::c_ulong,
                    flags,
                ) as RawFd
            };
            close(dev);
            fd
        }
        _ => -1,
    };
    (fd >= 0).then_some(fd)
}

/// Maps a shared range again in the child, at its address, from the memfd
/// the child inherited, keeps it out of the child's own children, and
/// registers it with the child's userfaultfd. Returns the errno of the
/// step that failed (the range is then unmapped again, if it was mapped).
pub(super) fn map_in_child(
    uffd: RawFd,
    protect_ok: bool,
    addr: usize,
    len: usize,
    share: Share,
) -> Result<(), i32> {
    // A Protect range starts inaccessible: its owner grants pages
    // (`sys::revoke`). Each kind needs what the greeting sent for it.
    let protect = share.protect;
    if (protect && !protect_ok) || (!protect && uffd < 0) {
        return Err(libc::EBADF);
    }
    let prot = if protect {
        libc::PROT_NONE
    } else if share.writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping (EEXIST
    // instead); `share.fd` is an open memfd the child inherited (the range
    // is listed, so its object, which owns the fd, was alive at the fork).
    let got = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
            share.fd,
            share.offset as libc::off_t,
        )
    };
    if got == -1 {
        return Err(errno_get());
    }
    let undo = |e: i32| {
        // SAFETY: the range this function just mapped.
        unsafe { libc::syscall(libc::SYS_munmap, got, len) };
        Err(e)
    };
    if got as usize != addr {
        return undo(libc::EEXIST);
    }
    // SAFETY: advises on the range just mapped; DONTFORK changes no content.
    if unsafe { libc::syscall(libc::SYS_madvise, addr, len, libc::MADV_DONTFORK) } != 0 {
        return undo(errno_get());
    }
    if protect {
        let free = CHILD_RANGES
            .iter()
            .find(|[_, l]| l.load(Ordering::Relaxed) == 0);
        let Some([a, l]) = free else {
            return undo(libc::ENOSPC);
        };
        a.store(addr, Ordering::Relaxed);
        l.store(
            len | (usize::from(share.writable) * WRITABLE),
            Ordering::Relaxed,
        );
        return Ok(());
    }
    let modes = if share.writable {
        mode::MISSING | mode::MINOR | mode::WP
    } else {
        mode::MISSING | mode::MINOR
    };
    // SAFETY: `uffd` is the child's open userfaultfd; ManuallyDrop keeps
    // the OwnedFd from closing it.
    let owned = ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(uffd) });
    if let Err(e) = super::uffd_register(&owned, addr, len, modes) {
        return undo(e.raw_os_error().unwrap_or(libc::EINVAL));
    }
    Ok(())
}

/// The ranges a child mapped, sent to the owner in records of at most
/// [`RANGES_MAX`] (on the stack).
pub(super) struct RangeList {
    words: [u64; MAX_WORDS],
    channel: RawFd,
    /// A record failed to go: the owner is gone.
    pub(super) failed: bool,
}

impl RangeList {
    pub(super) fn new(channel: RawFd) -> Self {
        let mut words = [0; MAX_WORDS];
        words[0] = RANGES;
        Self {
            words,
            channel,
            failed: false,
        }
    }

    pub(super) fn push(&mut self, id: u64, addr: usize, len: usize) {
        let n = self.words[1] as usize;
        self.words[2 + 3 * n..5 + 3 * n].copy_from_slice(&[id, addr as u64, len as u64]);
        self.words[1] += 1;
        if n + 1 == RANGES_MAX {
            self.flush();
        }
    }

    pub(super) fn flush(&mut self) {
        let n = self.words[1] as usize;
        if n == 0 {
            return;
        }
        if send_raw(self.channel, &self.words[..2 + 3 * n], &[]).is_err() {
            self.failed = true;
        }
        self.words[1] = 0;
    }
}

/// Publishes the child's guest state, once its ranges are sent.
pub(super) fn become_guest(uffd: RawFd, channel: RawFd) {
    GUEST_UFFD.set(uffd);
    CHANNEL.set(channel);
}

/// Gives up being a guest (nothing was mapped, or the owner is gone).
pub(super) fn abandon(uffd: RawFd, channel: RawFd) {
    close(channel);
    if uffd >= 0 {
        close(uffd);
    }
    drop_mailbox();
}

/// Forgets the channel to an owner that is gone, keeping the userfaultfd
/// (its ranges stay registered for the process's life).
pub(super) fn abandon_channel(channel: RawFd) {
    close(channel);
}

/// Asks the owner to resolve a fault of this guest at `addr` and waits for
/// the answer. `None` if this process is not a guest. Async-signal-safe:
/// called by the SIGBUS handler.
pub(crate) fn request(addr: usize, write: bool, retry: bool) -> Option<Answer> {
    let channel = CHANNEL.get()?;
    Some(ask(channel, Owner::Parent, addr, write, retry))
}

/// Asks the unrelated owner at the other end of `channel` (whose pidfd
/// is `owner`, or -1) to resolve a fault at `addr` of a range this
/// process joined, and waits for the answer. Async-signal-safe.
pub(crate) fn request_on(
    channel: RawFd,
    owner: RawFd,
    addr: usize,
    write: bool,
    retry: bool,
) -> Answer {
    ask(channel, Owner::Pidfd(owner), addr, write, retry)
}

fn ask(channel: RawFd, owner: Owner, addr: usize, write: bool, retry: bool) -> Answer {
    if owner.gone() {
        return Answer::Failed;
    }
    let Ok((mine, theirs)) = raw_pair() else {
        return Answer::Failed;
    };
    let flags = if write { FLAG_WRITE } else { 0 } | if retry { FLAG_RETRY } else { 0 };
    let sent = send_to_owner(channel, &[FAULT, addr as u64, flags], theirs, owner);
    close(theirs);
    let answer = match sent {
        Ok(()) => wait_answer(mine, owner),
        Err(_) => Answer::Failed,
    };
    close(mine);
    answer
}

/// Sends a fault record with its answer socket, without waiting for a
/// full channel for ever: while it is full, the owner is looked at every
/// [`OWNER_CHECK_MS`].
fn send_to_owner(channel: RawFd, words: &[u64], answer: RawFd, owner: Owner) -> Result<(), i32> {
    loop {
        match send_raw_flags(channel, words, &[answer], libc::MSG_DONTWAIT) {
            Err(libc::EAGAIN) => {
                if owner.gone() {
                    return Err(libc::EPIPE);
                }
                let mut pfd = libc::pollfd {
                    fd: channel,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, OWNER_CHECK_MS) };
            }
            done => return done,
        }
    }
}

/// Reads the one-word answer; end-of-file, or the owner's exit (seen by
/// [`Owner::gone`] every [`OWNER_CHECK_MS`]: another process may hold a
/// copy of the owner's end), is [`Answer::Failed`].
fn wait_answer(fd: RawFd, owner: Owner) -> Answer {
    let mut words = [0u64; ANSWER_WORDS];
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, OWNER_CHECK_MS) };
        if ready < 0 {
            if errno_get() == libc::EINTR {
                continue;
            }
            return Answer::Failed;
        }
        if ready == 0 {
            if owner.gone() {
                return Answer::Failed;
            }
            continue;
        }
        // SAFETY: reads at most the array's bytes into it.
        let rc = unsafe {
            libc::recv(
                fd,
                words.as_mut_ptr().cast(),
                std::mem::size_of_val(&words),
                libc::MSG_DONTWAIT,
            )
        };
        if rc >= 8 {
            return parse_answer(&words[..rc as usize / 8]);
        }
        if rc < 0 && matches!(errno_get(), libc::EINTR | libc::EAGAIN) {
            continue;
        }
        return Answer::Failed;
    }
}

/// An answer's words; anything malformed is [`Answer::Failed`].
fn parse_answer(words: &[u64]) -> Answer {
    match words {
        [ANSWER_MAPPED, ..] => Answer::Mapped,
        [ANSWER_RETRY, ..] => Answer::Retry,
        [ANSWER_GRANT, g, n, rest @ ..]
            if (*n as usize) <= GRANT_MAX && rest.len() >= 3 * *n as usize =>
        {
            let mut grant = Grant {
                g: *g,
                n: *n as usize,
                entries: [Entry::EMPTY; GRANT_MAX],
            };
            for (e, w) in grant
                .entries
                .iter_mut()
                .zip(rest.chunks_exact(3))
                .take(grant.n)
            {
                let Some(prot) = word_prot(w[2]) else {
                    return Answer::Failed;
                };
                *e = Entry {
                    addr: w[0] as usize,
                    len: w[1] as usize,
                    prot,
                };
            }
            Answer::Grant(grant)
        }
        _ => Answer::Failed,
    }
}

// ---------------------------------------------------------------------------
// A Protect child's side (`sys::revoke`): async-signal-safe.
// ---------------------------------------------------------------------------

/// In a Protect child: its lock and the newest record it applied.
#[cfg(not(loom))]
static CHILD: ChildState = ChildState::new();

#[cfg(not(loom))]
fn child_state() -> &'static ChildState {
    &CHILD
}

/// Loom's atomics are not const; no model reaches a child's state.
#[cfg(loom)]
fn child_state() -> &'static ChildState {
    Box::leak(Box::new(ChildState::new()))
}
/// In a Protect child: the ranges it maps again and asks its owner for:
/// `(addr, len | WRITABLE)` each, `(0, 0)` free.
static CHILD_RANGES: [[std::sync::atomic::AtomicUsize; 2]; CHILD_RANGES_MAX] =
    [const { [const { std::sync::atomic::AtomicUsize::new(0) }; 2] }; CHILD_RANGES_MAX];
const CHILD_RANGES_MAX: usize = 1024;
/// A range's length's low bit (lengths are page multiples): writable.
const WRITABLE: usize = 1;
/// In a Protect child: the memory areas its grants added, as estimated
/// (two per entry: errs high), and the estimate at which it protects every
/// range again first (half of `vm.max_map_count`, set by the owner).
static CHILD_AREAS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static AREA_MARK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(32_765);

/// In a Protect child: the range it serves that `addr` falls in, and
/// whether it is writable.
pub(crate) fn child_range(addr: usize) -> Option<(usize, usize, bool)> {
    if !child_state().attached() {
        return None;
    }
    CHILD_RANGES.iter().find_map(|[a, l]| {
        let (start, len) = (a.load(Ordering::Relaxed), l.load(Ordering::Relaxed));
        let bytes = len & !WRITABLE;
        (len != 0 && start <= addr && addr - start < bytes).then_some((
            start,
            bytes,
            len & WRITABLE != 0,
        ))
    })
}

/// Protects every range of this child `PROT_NONE` (one area each): its
/// pages fault back in, granted again. Only takes away.
fn reset_child_ranges() {
    for [a, l] in &CHILD_RANGES {
        let (start, len) = (
            a.load(Ordering::Relaxed),
            l.load(Ordering::Relaxed) & !WRITABLE,
        );
        if len != 0 {
            let _ = super::protect(start, len, Prot::None);
        }
    }
    CHILD_AREAS.store(0, Ordering::Relaxed);
}

fn apply_entry(e: &Entry) -> Result<(), i32> {
    grant_entry(e, &reset_child_ranges)
}

/// Applies a grant's entry, counting the areas it may add: past the mark,
/// or when the kernel refuses a split (`ENOMEM`), `reset` first protects
/// every range again (which only takes away), and it is tried once more.
pub(crate) fn grant_entry(e: &Entry, reset: &dyn Fn()) -> Result<(), i32> {
    let grows = e.prot != Prot::None;
    if grows && CHILD_AREAS.load(Ordering::Relaxed) + 2 > AREA_MARK.load(Ordering::Relaxed) {
        reset();
        CHILD_AREAS.store(0, Ordering::Relaxed);
    }
    let mut result = super::protect(e.addr, e.len, e.prot);
    if matches!(&result, Err(err) if err.raw_os_error() == Some(libc::ENOMEM)) {
        // Out of areas: give them all back and try once more.
        reset();
        CHILD_AREAS.store(0, Ordering::Relaxed);
        result = super::protect(e.addr, e.len, e.prot);
    }
    match result {
        Ok(()) => {
            if grows {
                CHILD_AREAS.fetch_add(2, Ordering::Relaxed);
            }
            Ok(())
        }
        Err(err) => Err(err.raw_os_error().unwrap_or(libc::EINVAL)),
    }
}

/// In a Protect child: applies `grant` (R3 of `sys::revoke`), each entry
/// checked to lie in one of the child's ranges (else the grant fails). An
/// entry that fails is a failure only if it holds `addr` (the faulting
/// address; a neighbour of fault-around just faults later).
pub(crate) fn apply_grant(grant: &Grant, addr: usize) -> Granted {
    let entries = &grant.entries[..grant.n.min(GRANT_MAX)];
    let inside = entries.iter().all(|e| {
        child_range(e.addr).is_some_and(|(start, len, writable)| {
            e.addr - start + e.len <= len && (writable || e.prot != Prot::ReadWrite)
        })
    });
    if !inside {
        return Granted::Failed(libc::EINVAL);
    }
    // No revoke on this thread while it holds the child's lock (it would
    // wait for itself).
    super::with_async_signals_blocked(|| {
        child_state().grant(grant.g, entries, |e| match apply_entry(e) {
            Err(errno) if e.addr <= addr && addr - e.addr < e.len => Err(errno),
            _ => Ok(()),
        })
    })
}

/// The SIGURG handler's work in a Protect child: applies its mailbox's
/// newest record and wakes the owner (nothing without a mailbox).
pub(crate) fn on_revoke() {
    child_state().revoke(|e| revoke_entry(e, &reset_child_ranges));
}

/// Applies a revoke's entry; a failure (`ENOMEM`) would leave the range
/// reachable, so `reset` takes everything away instead.
pub(crate) fn revoke_entry(e: &Entry, reset: &dyn Fn()) {
    if super::protect(e.addr, e.len, e.prot).is_err() {
        reset();
    }
}

/// In a Protect child: the address of its *alive* page (0: none), mapped
/// shared read-write for the process's life and kept from its children.
/// While this program runs in the process, the page has a writable
/// mapping, so its owner's `F_SEAL_WRITE` on it fails (`EBUSY`); once the
/// process exec'd (or exited), it succeeds: how the owner tells an exec
/// without `/proc`, which a program that is not dumpable hides.
static ALIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One zeroed memfd page named `name` (NUL-terminated), its size sealed
/// (the owner maps it and must never find it shorter): its fd. Raw system
/// calls only.
fn sealed_page(name: &[u8]) -> Option<RawFd> {
    // SAFETY: a NUL-terminated name and flags; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    } as RawFd;
    if fd < 0 {
        return None;
    }
    // SAFETY: ftruncate and fcntl of the memfd just made.
    let sized = unsafe {
        libc::syscall(libc::SYS_ftruncate, fd, MAILBOX_BYTES as libc::off_t) == 0
            && libc::syscall(
                libc::SYS_fcntl,
                fd,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            ) == 0
    };
    if !sized {
        close(fd);
        return None;
    }
    Some(fd)
}

/// Maps memfd page `fd` shared read-write where the kernel finds room,
/// kept from this process's children: its address. Raw system calls only.
fn map_page(fd: RawFd) -> Option<usize> {
    // SAFETY: a new shared mapping of the memfd at an address the kernel
    // picks: it replaces nothing.
    let at = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            0usize,
            MAILBOX_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0 as libc::off_t,
        )
    };
    if at == -1 {
        return None;
    }
    // SAFETY: advises on the page just mapped.
    unsafe { libc::syscall(libc::SYS_madvise, at, MAILBOX_BYTES, libc::MADV_DONTFORK) };
    Some(at as usize)
}

/// Unmaps this child's own mailbox, if it has one (it serves nothing:
/// the greeting failed, or no range was mapped again).
fn drop_mailbox() {
    let at = child_state().address();
    child_state().reset();
    if at != 0 {
        // SAFETY: the page `make_mailbox` mapped in this process, which
        // nothing reads any more (reset, one thread at the fork).
        unsafe { libc::syscall(libc::SYS_munmap, at, MAILBOX_BYTES) };
    }
}

/// Forgets the mailbox a Protect child's child inherited the address of
/// (the page itself is DONTFORK: not mapped here), and its ranges.
fn forget_mailbox() {
    child_state().reset();
    ALIVE.store(0, Ordering::Relaxed);
    for [a, l] in &CHILD_RANGES {
        a.store(0, Ordering::Relaxed);
        l.store(0, Ordering::Relaxed);
    }
}

fn close(fd: RawFd) {
    // SAFETY: closes an fd this module opened and owns; a raw system call.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}
