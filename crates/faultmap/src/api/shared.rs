//! Sharing one cache with unrelated processes ([`crate::Config::shared`]):
//! whether a read-only mapping owns its object's cache or joins another
//! process's, and the joining side.
//!
//! The first process of a user to map an object version (its store's
//! [`crate::Store::share_key`]) *owns* the cache: it maps the object as
//! usual and hosts it (`crate::mm::guest::host`), listening on a socket of
//! the user's (`crate::sys::rendezvous`). A later process of the same
//! user that maps the same version *joins*: it hands the owner a
//! userfaultfd (SIGBUS delivery), gets the object's memfd back, maps its
//! range from it, and its faults there are forwarded to the owner by its
//! SIGBUS handler (`crate::sys::share::request`), as a forked child's are.
//! A page any of them read is not read again, and the owner's memory
//! budget holds over all of them.
//!
//! One process decides at a time (the lock file): it joins if someone
//! listens, else it becomes the owner (removing a socket a dead owner
//! left). A process that cannot join (the owner refuses, is of another
//! user, does not answer in time) maps a cache of its own, and
//! [`crate::Mapping::sharing`] says why.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::api::object::Object;
use crate::base::config::{Extent, PageSize};
use crate::mm::guest;
use crate::mm::links;
use crate::mm::pager_core::Core;
use crate::mm::signal;
use crate::sys::rendezvous::{self, Connected};
use crate::sys::revoke::{Mailbox, MAILBOX_BYTES};
use crate::sys::share::{self, Received};
use crate::sys::{self, mode, range_ioctl, UffdSource, PAGE_SIZE, PTRS_PER_PTE};

/// Whose cache a mapping reads ([`crate::Mapping::sharing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharing {
    /// A cache of this process's object, shared with no other process:
    /// sharing is off, the mapping is writable or replays or records a
    /// trace, the store names no version, or `why` (the reason the
    /// owner's cache could not be joined nor this one offered).
    Private {
        /// Why the cache is not shared although sharing is on.
        why: Option<String>,
    },
    /// This process owns the cache: other processes of this user that map
    /// the same object version read it.
    Owner,
    /// Another process of this user owns the cache and serves this
    /// mapping's faults (its policy, budget and statistics are the
    /// owner's).
    Joined,
}

/// How a read-only mapping with sharing on gets its cache.
pub(crate) enum Plan {
    /// Map this object (the one the caller opened, or the one this process
    /// hosts already under the same key) as usual; it is hosted.
    Own(Object),
    /// Map nothing of this process's: the range is another's.
    Join(Box<JoinedMap>),
    /// Map the caller's object, shared with nobody, for this reason.
    Private(String),
}

/// How long a joiner waits for the owner's answer to its `JOIN`.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Decides how a read-only mapping of `extent` of `object` (whose version
/// key is `key`) gets its cache, for the pager of `core`.
pub(crate) fn plan(
    core: &Arc<Core>,
    threads: guest::Keep,
    source: Option<UffdSource>,
    object: &Object,
    key: &str,
    extent: &Extent,
    timeout: Duration,
) -> Plan {
    if let Some(hosted) = guest::hosted_object(key) {
        return Plan::Own(Object::adopt(hosted));
    }
    let dir = match rendezvous::dir() {
        Ok(dir) => dir,
        Err(e) => return Plan::Private(format!("no private directory to meet in: {e}")),
    };
    let decide = match rendezvous::decide(&dir) {
        Ok(lock) => lock,
        Err(e) => return Plan::Private(format!("deciding in {}: {e}", dir.display())),
    };
    // Once a process: the sockets of owners that died without closing
    // their objects go.
    static SWEPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SWEPT.swap(true, std::sync::atomic::Ordering::Relaxed) {
        rendezvous::sweep(&dir, SWEEP_MAX);
    }
    // Another thread of this process may have hosted it meanwhile.
    if let Some(hosted) = guest::hosted_object(key) {
        return Plan::Own(Object::adopt(hosted));
    }
    let name = decide.name(key);
    let path = rendezvous::socket_path(&dir, &name);
    match rendezvous::connect(&path) {
        Ok(Connected::To(conn)) => {
            // Connected: the owner takes it in whatever happens to the
            // lock now, and a process that decides next must not wait
            // for this one's handshake.
            drop(decide);
            match join(
                core,
                source,
                object,
                key,
                extent,
                conn,
                timeout.min(JOIN_TIMEOUT),
            ) {
                Ok(joined) => Plan::Join(Box::new(joined)),
                Err(why) => Plan::Private(why),
            }
        }
        Ok(Connected::Busy) => {
            Plan::Private("the owner of the cache is not taking processes in (stopped?)".into())
        }
        Ok(Connected::Nobody) => {
            let hosted = guest::serve(core, source)
                .and_then(|()| guest::host(&object.0, core, threads, key, &dir, &name));
            match hosted {
                Ok(()) => Plan::Own(object.clone()),
                Err(e) => Plan::Private(format!("offering the cache to other processes: {e}")),
            }
        }
        Err(e) => Plan::Private(format!("connecting to {}: {e}", path.display())),
    }
}

/// The most stale sockets a process removes (once).
const SWEEP_MAX: usize = 64;

/// Descriptors listed for forked children to close (`share::own_fd`),
/// from their making: a child forked meanwhile must not keep a copy (it
/// would keep this process's guest alive in the owner, or hide the
/// owner's death). Taken off the list when dropped, before they close.
#[derive(Default)]
struct Listed(Vec<RawFd>);

impl Listed {
    fn add(&mut self, fd: RawFd) -> Result<(), String> {
        if !share::own_fd(fd) {
            return Err("too many descriptors for forked children to close".into());
        }
        self.0.push(fd);
        Ok(())
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.0.iter().for_each(|&fd| share::disown_fd(fd));
    }
}

/// A range of this process's served by the process that owns its object's
/// cache: the memfd mapped read-only, registered with a userfaultfd of its
/// own (SIGBUS delivery) that the owner holds a copy of, and linked to the
/// owner's channel (`mm::links`) for the SIGBUS handler. Its descriptors
/// are listed for forked children to close (`share::own_fd`).
pub(crate) struct JoinedMap {
    /// `None` once unmapped, in the drop.
    map: Option<sys::MappedRegion>,
    /// The object offset of the mapping's first byte.
    pub(crate) base: u64,
    slot: usize,
    /// Off the list before the descriptors below close (field order).
    _listed: Listed,
    _channel: OwnedFd,
    /// Its userfaultfd, or its mailbox (kept mapped until the link is
    /// gone: field order, after `map`'s unlink in the drop).
    _via: Via,
    _owner: Option<OwnedFd>,
}

/// How the owner serves a joined range.
enum Via {
    /// Its faults are this userfaultfd's (SIGBUS delivery).
    Uffd(OwnedFd),
    /// Under the Protect engine: the mailbox memfd and its page here
    /// (`crate::sys::revoke`), and the alive page's.
    Mailbox {
        fd: OwnedFd,
        page: sys::MappedRegion,
        alive: OwnedFd,
        /// Kept mapped (writable) while the range is joined.
        _alive_page: sys::MappedRegion,
    },
}

impl Via {
    /// The descriptor sent with the `JOIN`.
    fn fd(&self) -> RawFd {
        match self {
            Via::Uffd(fd) | Via::Mailbox { fd, .. } => fd.as_raw_fd(),
        }
    }
}

impl JoinedMap {
    /// The range's first byte.
    pub(crate) fn addr(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.addr())
    }

    /// Whether the owner grants its pages (the Protect engine) rather
    /// than mapping them through a userfaultfd.
    pub(crate) fn by_protection(&self) -> bool {
        matches!(self._via, Via::Mailbox { .. })
    }
}

impl Drop for JoinedMap {
    fn drop(&mut self) {
        // Unlinked first, then unmapped: a mapping made at this address
        // after the unmap must never find this link.
        links::links().unlink(self.slot);
        drop(self.map.take());
        // A Protect joiner says it reaches nothing any more: without that
        // word the owner serves it (takes pages back) until it exits.
        if self.by_protection() {
            share::send_now(&self._channel, &[share::UNLINKED]);
        }
        // Then the descriptors are taken off the list and close (the
        // fields, in order): the channel's end ends this guest in the
        // owner.
    }
}

/// Joins the owner at the other end of `conn`: see the module
/// documentation. The error says why (no secret: the key names a URL
/// without credentials, and is not repeated).
fn join(
    core: &Arc<Core>,
    source: Option<UffdSource>,
    object: &Object,
    key: &str,
    extent: &Extent,
    conn: OwnedFd,
    timeout: Duration,
) -> Result<JoinedMap, String> {
    if rendezvous::peer_uid(&conn) != Some(rendezvous::euid()) {
        return Err("the process listening on the cache's socket is another user's".into());
    }
    // Its death is seen by a pidfd (by the kernel's word, or made from
    // its pid now, while it is connected and so alive).
    let owner = share::peer_pidfd(&conn)
        .or_else(|| share::peer_pid(&conn).and_then(|pid| share::pidfd_open(pid).ok()));
    // What the owner serves this process through: a userfaultfd, or under
    // the Protect engine a mailbox for its revokes (`crate::sys::revoke`).
    let via = match source {
        Some(source) => Via::Uffd(
            share::open_guest_uffd(source, guest::features(core))
                .map_err(|e| format!("opening a userfaultfd for the owner: {e}"))?,
        ),
        None => {
            if owner.is_none() {
                // Revokes are signals, sent only through a pidfd.
                return Err("no pidfd of the owner to answer its revokes through".into());
            }
            // The mailbox, and the page whose writable mapping says this
            // program still runs here (`sys::share`'s alive page).
            let (fd, page) = guest_page(c"faultmap-joiner-mailbox")?;
            let (alive, alive_page) = guest_page(c"faultmap-joiner-alive")?;
            signal::install_revoke().map_err(|e| format!("sigaction(SIGURG): {e}"))?;
            Via::Mailbox {
                fd,
                page,
                alive,
                _alive_page: alive_page,
            }
        }
    };
    // Listed before the handshake, and declared after the descriptors:
    // taken off the list before they close, on every way out.
    let mut listed = Listed::default();
    let owner_fd = owner.as_ref().map(|o| o.as_raw_fd());
    for fd in [Some(conn.as_raw_fd()), Some(via.fd()), owner_fd]
        .into_iter()
        .flatten()
    {
        listed.add(fd)?;
    }
    let key = key.as_bytes();
    if key.len() > share::KEY_MAX {
        return Err("the object's version key is too long to send".into());
    }
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u64;
    let kind = match via {
        Via::Uffd(_) => share::JOIN,
        Via::Mailbox { .. } => share::JOIN_PROTECT,
    };
    let mut words = vec![kind, pid, key.len() as u64];
    words.extend(key.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_ne_bytes(w)
    }));
    let fds = match &via {
        Via::Uffd(fd) => vec![fd.as_raw_fd()],
        Via::Mailbox { fd, alive, .. } => vec![fd.as_raw_fd(), alive.as_raw_fd()],
    };
    share::send(&conn, &words, &fds).map_err(|e| format!("sending to the owner: {e}"))?;
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    if !rendezvous::wait_readable(conn.as_raw_fd(), timeout_ms) {
        return Err(format!("the owner did not answer in {timeout:?}"));
    }
    let mut reply = [0u64; share::MAX_WORDS];
    let memfd = match share::recv(&conn, &mut reply) {
        Ok(Received::Record(n, mut fds))
            if n >= 4 && reply[0] == share::JOINED && fds.len() == 1 =>
        {
            fds.remove(0)
        }
        Ok(Received::Record(_, _)) if reply[0] == share::REFUSED => {
            return Err("the owner refused (its object is closing)".into())
        }
        Ok(_) => return Err("the owner hung up".into()),
        Err(e) => return Err(format!("reading the owner's answer: {e}")),
    };
    let [id, len, page_bytes] = [reply[1], reply[2], reply[3]];
    let size = object.page_size();
    if len != object.len() || page_bytes != size.bytes() as u64 {
        return Err("the owner's object is not this one (length or page size)".into());
    }
    let fds = (conn, via, owner, listed);
    map_joined(&memfd, extent, size, id, fds)
}

/// A sealed memfd page for the owner (`crate::sys::revoke`), mapped here
/// shared read-write and kept from this process's children (a forked
/// child is no joiner: it must not reach the owner's records).
fn guest_page(name: &std::ffi::CStr) -> Result<(OwnedFd, sys::MappedRegion), String> {
    let fd = sys::memfd_sealed(name, MAILBOX_BYTES as u64)
        .map_err(|e| format!("making a page for the owner: {e}"))?;
    let page = sys::mmap_shared_rw(&fd, MAILBOX_BYTES, 0)
        .map_err(|e| format!("mapping a page for the owner: {e}"))?;
    sys::madvise_dontfork(page.as_ptr().cast(), page.len())
        .map_err(|e| format!("madvise(MADV_DONTFORK): {e}"))?;
    Ok((fd, page))
}

/// Maps `extent` of the owner's `memfd` here, registers it, links it, and
/// tells the owner (`RANGE_OF`).
fn map_joined(
    memfd: &OwnedFd,
    extent: &Extent,
    size: PageSize,
    id: u64,
    // `listed` last: dropped first on an error, before the descriptors.
    (conn, via, owner, listed): (OwnedFd, Via, Option<OwnedFd>, Listed),
) -> Result<JoinedMap, String> {
    let bytes = extent.pages as usize * size.bytes();
    let offset = extent.first_page * size.bytes() as u64;
    // Under the Protect engine the range starts inaccessible: its owner
    // grants pages.
    let prot = match via {
        Via::Uffd(_) => sys::Prot::Read,
        Via::Mailbox { .. } => sys::Prot::None,
    };
    let map = sys::mmap_shared_aligned(memfd, bytes, offset, PTRS_PER_PTE * PAGE_SIZE, prot)
        .map_err(|e| format!("mapping the owner's cache: {e}"))?;
    // A forked child of this process gets a placeholder here (its parent's
    // owner does not serve it).
    sys::dont_fork(&map, None).map_err(|e| format!("madvise(MADV_DONTFORK): {e}"))?;
    let mailbox = match &via {
        Via::Uffd(uffd) => {
            let ioctls =
                sys::uffd_register(uffd, map.addr(), map.len(), mode::MISSING | mode::MINOR)
                    .map_err(|e| format!("UFFDIO_REGISTER: {e}"))?;
            if ioctls & range_ioctl::CONTINUE == 0 {
                let _ = sys::uffd_unregister(uffd, map.addr(), map.len());
                return Err("UFFDIO_CONTINUE is not allowed on the owner's cache".into());
            }
            signal::install().map_err(|e| format!("installing the SIGBUS handler: {e}"))?;
            None
        }
        Via::Mailbox { page, .. } => {
            signal::keep_protect_handler().map_err(|e| format!("sigaction(SIGSEGV): {e}"))?;
            Some(page.as_ptr().cast_const().cast::<Mailbox>())
        }
    };
    let owner_fd: Option<RawFd> = owner.as_ref().map(|o| o.as_raw_fd());
    let slot = links::links()
        .link(map.addr(), map.len(), conn.as_raw_fd(), owner_fd, mailbox)
        .ok_or_else(|| format!("more than {} joined mappings at once", links::LINKS_MAX))?;
    let joined = JoinedMap {
        map: Some(map),
        base: 0,
        slot,
        _listed: listed,
        _channel: conn,
        _via: via,
        _owner: owner,
    };
    let (addr, len) = (joined.addr(), bytes);
    let words = [
        share::RANGE_OF,
        id,
        addr as u64,
        len as u64,
        extent.first_page,
        extent.pages,
    ];
    share::send(&joined._channel, &words, &[])
        .map_err(|e| format!("sending the range to the owner: {e}"))?;
    Ok(joined)
}
