//! Forked children as guests: the owner's side of `sys::share`.
//!
//! A process that maps anything runs one *service* thread
//! (`faultmap-guests`). A child forked from it maps the shared ranges it
//! inherited again, registers them with a userfaultfd of its own and sends
//! that userfaultfd here (`sys::share` has the wire and the child's side).
//! For each child (a *guest*) this thread keeps:
//!
//! - a region table of its own, with one region per range the child
//!   mapped, each a copy of the owner's region it names (same object, same
//!   offset, same options), marked foreign (`MappedRegion::foreign`: never
//!   unmapped or advised from here);
//! - per pager, a `Core` that is the pager's own but for the userfaultfd
//!   (the child's) and the table (`Core::for_guest`).
//!
//! A guest's fault runs the fault path the owner's own faults run
//! (`fault::handle`) on the guest's table: the same page-state words, the
//! same readahead state, the same I/O threads and memory budget; a fault
//! parks on a read in flight like any other (`Origin::Guest`) and is
//! answered when the read ends. `UFFDIO_CONTINUE` on the child's
//! userfaultfd maps the page in the child.
//!
//! The guest's regions are in their objects' rmaps, so write-back
//! write-protects a writable page in every child before it copies it out
//! (`writeback::protect`, through the region's core: the child's
//! userfaultfd), and a child's write after that faults and marks the page
//! dirty again: written back once, never lost. Eviction and invalidation
//! punch the hole, which unmaps the page from every process (the sample
//! unmap of the CLOCK hand cannot reach a child: `invalidate::zap`).
//!
//! Under the Protect engine a guest has no userfaultfd: it sends a
//! mailbox, and its core's engine is `PagingEngine::Child` with its
//! [`ChildLink`]. A fault's mapping becomes a grant in the answer, which
//! the guest applies itself; a zap or write-protect is a record it must
//! acknowledge first (`sys::revoke`). The same holds for joiners that
//! send a `JOIN_PROTECT`.
//!
//! ## Invariants
//!
//! - A guest region is made only from the owner's live region whose
//!   mapping has the id the child sent, at the address and length it sent
//!   (`add_range`): a range the owner unmapped since the fork is never
//!   served with another object's pages (its faults get SIGBUS).
//! - Only this thread changes a guest's table; it joins the object's rmap
//!   before the table (write-back finds it before a fault can map it
//!   writable), and leaves the rmap when the guest ends.
//! - Every fault is answered once (`GuestFault::complete`), or its socket
//!   is dropped unanswered, which the child reads as end-of-file: never a
//!   thread left waiting.
//!
//! ## Unrelated processes
//!
//! With sharing on (`Config::shared`), the first process of a user to map
//! an object version *hosts* it ([`host`]): it listens on a named socket
//! (`sys::rendezvous`) whose connections this thread takes in as guests
//! too. Such a guest (a *joiner*) sends a `JOIN` with the version key and
//! its userfaultfd, gets the object's memfd, maps the range it wants from
//! it, and sends `RANGE_OF`; its regions are made from the object itself
//! (`Region::for_joiner`), not from one of the owner's mappings, and it
//! ends when its channel closes (its mapping's drop, or its death).
//!
//! - A joiner gets the object only while the object is open: its handle is
//!   taken with `try_acquire`, which never raises a count from zero, so a
//!   closing object is never opened again (the joiner is refused and maps
//!   a cache of its own).
//! - The object is unhosted when it closes (its last handle, the owner's
//!   own and its joiners', goes): its socket is removed if it is still
//!   the one this process bound (its device and inode), and the listener
//!   closes. A joiner's guest also ends when the joiner exits (its pidfd
//!   is watched beside its channel).

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::base::index::HostAddr;
use crate::cache::wait::Uffd;
use crate::mm::engine::PagingEngine;
use crate::mm::fault::{self, Origin};
use crate::mm::object::{self, ObjectCore};
use crate::mm::pager_core::Core;
use crate::mm::signal;
use crate::mm::space::{Region, RegionTable};
use crate::sys::rendezvous;
use crate::sys::revoke::{self, Entry};
use crate::sys::share::{self, Answer, Grant, Received};
use crate::sys::{self, feature, UffdSource};

/// A guest's fault, waiting for its answer.
#[derive(Debug)]
pub(crate) struct GuestFault {
    /// The socket the child waits on.
    answer: OwnedFd,
    /// The access may be a write.
    pub(crate) write: bool,
    /// The retry of a fault answered [`Answer::Retry`].
    pub(crate) retry: bool,
    answered: AtomicBool,
    /// A Protect child's link: a mapped fault is answered with the grant
    /// its fault path made.
    link: Option<Arc<ChildLink>>,
}

impl GuestFault {
    /// Answers the child, once (a second answer is dropped). A Protect
    /// child's mapped fault gets its grant.
    pub(crate) fn complete(&self, answer: Answer) {
        if self.answered.swap(true, Ordering::AcqRel) {
            return;
        }
        let answer = match (&self.link, answer) {
            (Some(link), Answer::Mapped) => link.take_grant().map_or(Answer::Mapped, Answer::Grant),
            (_, answer) => answer,
        };
        share::answer(&self.answer, answer);
    }
}

impl Drop for ChildLink {
    fn drop(&mut self) {
        share::disown_fd(self.pidfd.as_raw_fd());
        share::disown_fd(self.alive.as_raw_fd());
    }
}

impl std::fmt::Debug for ChildLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildLink")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// The owner's side of a forked child under the Protect engine
/// (`sys::revoke`): the child's mailbox, mapped here too, and the grant
/// the fault being served makes.
pub(crate) struct ChildLink {
    mailbox: sys::MappedRegion,
    /// The guest's alive page (`share::ALIVE`): sealing it against writes
    /// fails while the guest still maps it.
    alive: OwnedFd,
    pid: i32,
    pidfd: OwnedFd,
    /// Serialises the records (and keeps their state).
    records: Mutex<Records>,
    /// The grant of the fault the service thread is serving (only it
    /// maps for this child).
    pending: Mutex<Option<Grant>>,
    /// The child's channel closed: it exec'd, or closed its descriptors
    /// and lives on.
    closed: AtomicBool,
    /// The pages (their addresses in the child) it was granted writable
    /// since their last write-back.
    writable: Mutex<std::collections::BTreeSet<usize>>,
}

#[derive(Default)]
struct Records {
    /// A record the child did not acknowledge in time: until it does, the
    /// next revoke fails at once.
    unacked: Option<u64>,
    /// The child exec'd: nothing of it is reachable any more.
    execd: bool,
}

impl ChildLink {
    fn new(mailbox: OwnedFd, alive: OwnedFd, pid: i32, pidfd: OwnedFd) -> std::io::Result<Self> {
        // A page of exactly the mailbox's size that cannot shrink: the
        // mapping below never faults past the file's end.
        if !sys::sealed_size(&mailbox, revoke::MAILBOX_BYTES as u64) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mailbox = sys::mmap_shared_rw(&mailbox, revoke::MAILBOX_BYTES, 0)?;
        // Not this process's children's: a sibling must not reach (nor
        // keep) another child's mailbox.
        sys::madvise_dontfork(mailbox.as_ptr().cast(), mailbox.len())?;
        // Nor its pidfd, nor its alive page.
        share::own_fd(pidfd.as_raw_fd());
        share::own_fd(alive.as_raw_fd());
        Ok(Self {
            mailbox,
            alive,
            pid,
            pidfd,
            records: Mutex::new(Records::default()),
            pending: Mutex::new(None),
            closed: AtomicBool::new(false),
            writable: Mutex::new(std::collections::BTreeSet::new()),
        })
    }

    fn mailbox(&self) -> &revoke::Mailbox {
        // SAFETY: `mailbox` maps MAILBOX_BYTES of a memfd, page-aligned,
        // for as long as `self` lives; `Mailbox` fits in them and is all
        // atomics, which both processes only touch atomically.
        unsafe { &*self.mailbox.as_ptr().cast::<revoke::Mailbox>() }
    }

    /// Adds `entry` to the grant of the fault being served (its pages are
    /// pinned by the caller: the grant's number is read now, R1). False
    /// if the grant is full.
    pub(crate) fn grant(&self, entry: Entry) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let grant = pending.get_or_insert_with(|| Grant {
            g: self.mailbox().newest(),
            n: 0,
            entries: [Entry::EMPTY; share::GRANT_MAX],
        });
        let Some(slot) = grant.entries.get_mut(grant.n) else {
            return false;
        };
        *slot = entry;
        grant.n += 1;
        true
    }

    /// Notes that the child may write `[addr, addr + len)` (a writable
    /// grant): write-back takes that back before it copies.
    pub(crate) fn note_writable(&self, addr: usize, len: usize) {
        let mut w = self.writable.lock().unwrap_or_else(|e| e.into_inner());
        w.extend((addr..addr + len).step_by(sys::PAGE_SIZE));
    }

    /// [`crate::mm::engine::PagingEngine::zap`] for a child's region: the
    /// pages of `pages` it may reach (their mapped bits, taken in one
    /// atomic step each word, so a bit a concurrent grant sets is either
    /// revoked here or kept) are taken back; if the child does not answer,
    /// their bits are set again and the error says the pages may still be
    /// reached.
    pub(crate) fn zap(
        &self,
        region: &crate::mm::space::Region,
        pages: std::ops::Range<crate::base::index::RegionPage>,
    ) -> std::io::Result<()> {
        use crate::base::index::RegionPage;
        let runs = region.mapped.take(pages.start.0..pages.end.0);
        let entries: Vec<Entry> = runs
            .iter()
            .map(|r| Entry {
                addr: region.addr_of(RegionPage(r.start)).get(),
                len: ((r.end - r.start) as usize) << region.page_shift,
                prot: sys::Prot::None,
            })
            .collect();
        let result = self.revoke(&entries);
        match &result {
            Ok(()) => {
                let mut w = self.writable.lock().unwrap_or_else(|e| e.into_inner());
                for e in &entries {
                    let gone: Vec<usize> = w.range(e.addr..e.addr + e.len).copied().collect();
                    for a in gone {
                        w.remove(&a);
                    }
                }
            }
            Err(_) => {
                // The child may still reach them: a later eviction asks
                // again (for those pages only).
                for r in &runs {
                    region
                        .mapped
                        .mark(RegionPage(r.start)..RegionPage(r.end), true);
                }
            }
        }
        result
    }

    /// [`crate::mm::engine::PagingEngine::protect_write`] for a child's
    /// region: the pages of `[addr, addr + len)` the child was granted
    /// writable are made read-only there first (the ones it only reads are
    /// left alone: a child that only reads never holds up a write-back).
    pub(crate) fn protect_write(&self, addr: usize, len: usize) -> std::io::Result<()> {
        let taken: Vec<usize> = {
            let mut w = self.writable.lock().unwrap_or_else(|e| e.into_inner());
            let taken: Vec<usize> = w.range(addr..addr + len).copied().collect();
            for a in &taken {
                w.remove(a);
            }
            taken
        };
        let mut entries: Vec<Entry> = Vec::new();
        for &a in &taken {
            match entries.last_mut() {
                Some(e) if e.addr + e.len == a => e.len += sys::PAGE_SIZE,
                _ => entries.push(Entry {
                    addr: a,
                    len: sys::PAGE_SIZE,
                    prot: sys::Prot::Read,
                }),
            }
        }
        let result = self.revoke(&entries);
        if result.is_err() {
            let mut w = self.writable.lock().unwrap_or_else(|e| e.into_inner());
            w.extend(taken);
        }
        result
    }

    /// The grant made since the last call, if any.
    fn take_grant(&self) -> Option<Grant> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Has the child apply `entries` (each taking away) and waits for its
    /// acknowledgement (R2). `Ok` too if the child exited or exec'd (it
    /// reaches nothing); an error if it did not answer in
    /// [`revoke::REVOKE_WAIT`] (the caller keeps the pages).
    pub(crate) fn revoke(&self, entries: &[Entry]) -> std::io::Result<()> {
        use crate::mm::engine::{CHILD_REVOKES, CHILD_REVOKES_FAILED};
        if entries.is_empty() {
            return Ok(());
        }
        let result = self.revoke_inner(entries);
        let counter = match &result {
            Ok(()) => &CHILD_REVOKES,
            Err(_) => &CHILD_REVOKES_FAILED,
        };
        counter.fetch_add(entries.len() as u64, Ordering::Relaxed);
        result
    }

    fn revoke_inner(&self, entries: &[Entry]) -> std::io::Result<()> {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.execd || share::exited(&self.pidfd) {
            return Ok(());
        }
        let timed_out = || std::io::Error::from(std::io::ErrorKind::TimedOut);
        // A channel closed: the guest exec'd (or closed its descriptors
        // and lives on, still answering). Not waited for long.
        let wait = match self.closed.load(Ordering::Acquire) {
            true => CLOSED_WAIT,
            false => revoke::REVOKE_WAIT,
        };
        if let Some(r) = records.unacked {
            if !self.mailbox().acked(r) {
                // Its signal may have been lost (ignored, taken by
                // sigwait, not chained by another handler): ask again,
                // briefly.
                let _ = share::signal_child(&self.pidfd);
                let until = std::time::Instant::now() + UNACKED_WAIT;
                if !share::wait_ack(self.mailbox(), r, &self.pidfd, until) {
                    if self.gone_by_exec() {
                        records.execd = true;
                        return Ok(());
                    }
                    return Err(timed_out());
                }
            }
            records.unacked = None;
        }
        for chunk in entries.chunks(revoke::ENTRIES) {
            let r = self.mailbox().post(chunk);
            // Another error (EAGAIN: the queue is full) leaves a SIGURG
            // pending, which reads the newest record: wait for it.
            if let Err(libc::ESRCH) = share::signal_child(&self.pidfd) {
                return Ok(());
            }
            let until = std::time::Instant::now() + wait;
            if !share::wait_ack(self.mailbox(), r, &self.pidfd, until) {
                if self.gone_by_exec() {
                    records.execd = true;
                    return Ok(());
                }
                records.unacked = Some(r);
                return Err(timed_out());
            }
        }
        Ok(())
    }

    /// Whether the guest exec'd: its channel closed, and its alive page
    /// has no writable mapping left (`F_SEAL_WRITE` on it succeeds; it
    /// fails with `EBUSY` while the guest's program still maps it). The
    /// pidfd says it has not exited. No `/proc` needed: a program that is
    /// not dumpable is told apart too. Any other answer: not gone.
    fn gone_by_exec(&self) -> bool {
        self.closed.load(Ordering::Acquire) && sys::seal_write(&self.alive)
    }
}

/// How long a revoke waits for a guest whose channel closed.
const CLOSED_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// How long a guest that did not answer a record is asked again.
const UNACKED_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Starts this process's service thread, once per fork generation, and
/// makes the process an owner: children forked from now on are served
/// here. `core` is the first pager's (the userfaultfd's source and the
/// features a child asks for come from it).
pub(crate) fn serve(core: &Core, source: Option<UffdSource>) -> std::io::Result<()> {
    static STARTED: sys::ForkLocal<Mutex<bool>> = sys::ForkLocal::new();
    let started = STARTED.get_or_init(|| Mutex::new(false));
    let mut started = started.lock().unwrap_or_else(|e| e.into_inner());
    // How this pager's ranges are served in a child (each pager's: a
    // process may have pagers of both engines). A child inherits the
    // SIGBUS disposition: faultmap's handler forwards its userfaultfd
    // faults here. A Protect range's come as SIGSEGV (the pager installed
    // that handler already), and its revokes as SIGURG.
    match source {
        Some(source) => {
            signal::install()?;
            share::serve_uffd(source, features(core));
        }
        None => {
            signal::install_revoke()?;
            share::serve_protect();
        }
    }
    if *started {
        return Ok(());
    }
    let (recv, send) = share::seqpacket_pair()?;
    let recv_fd = recv.as_raw_fd();
    std::thread::Builder::new()
        .name("faultmap-guests".into())
        .spawn(move || Service::default().run(recv))?;
    // Children close their copy of the receiving end first thing (listed
    // once the thread owns it: a child forked before keeps a copy).
    share::own_fd(recv_fd);
    // The sending end stays open for the process's life: every child
    // inherits it.
    share::start_service(send.into_raw_fd());
    *started = true;
    Ok(())
}

/// The features a guest's userfaultfd asks for (`UFFD_FEATURE_SIGBUS`
/// besides) to be served as `core`'s own.
pub(crate) fn features(core: &Core) -> u64 {
    let mut features = feature::MISSING_SHMEM | feature::MINOR_SHMEM;
    if core.write_protect {
        features |= feature::WP_HUGETLBFS_SHMEM;
    }
    if core.hugetlb {
        features |= feature::MINOR_HUGETLBFS | feature::MISSING_HUGETLBFS;
    }
    features
}

/// An object this process hosts for unrelated processes.
struct Hosted {
    /// Never reused in this process.
    id: u64,
    key: String,
    object: Weak<ObjectCore>,
    /// The pager whose policy and budget serve the joiners.
    pager: Arc<Core>,
    /// The pager's threads (its I/O threads, evictor, watchdog), kept
    /// running while the object is hosted or a joiner is served.
    threads: Keep,
    listener: Arc<OwnedFd>,
    dir: PathBuf,
    name: String,
    /// The device and inode of the socket file bound.
    file: (u64, u64),
}

/// Something kept alive (a pager's threads) by whoever holds a clone.
pub(crate) type Keep = Arc<dyn std::any::Any + Send + Sync>;

/// What this process hosts (a forked child hosts nothing of its parent's).
static HOSTED: sys::ForkLocal<Mutex<Vec<Hosted>>> = sys::ForkLocal::new();

fn hosted() -> std::sync::MutexGuard<'static, Vec<Hosted>> {
    HOSTED
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A handle on the object this process hosts under `key`, if it is open:
/// the process maps that one rather than a second copy.
pub(crate) fn hosted_object(key: &str) -> Option<Arc<ObjectCore>> {
    hosted().iter().find(|h| h.key == key).and_then(|h| {
        let object = h.object.upgrade()?;
        object.try_acquire().then_some(object)
    })
}

/// Hosts `object` under `key` for unrelated processes of this user: listens
/// at `<dir>/<name>.sock`. The caller holds the lock file
/// (`rendezvous::decide`) and found nobody listening there; the service
/// thread runs (`serve`).
pub(crate) fn host(
    object: &Arc<ObjectCore>,
    pager: &Arc<Core>,
    threads: Keep,
    key: &str,
    dir: &Path,
    name: &str,
) -> std::io::Result<()> {
    let path = rendezvous::socket_path(dir, name);
    let listener = rendezvous::listen(&path)?;
    let file = rendezvous::file_id(&path).unwrap_or((0, 0));
    // A child closes its copy first thing: the owner's death must leave
    // nobody listening (else no one hosts).
    if !share::own_fd(listener.as_raw_fd()) {
        rendezvous::unlink_if(&path, file);
        return Err(std::io::Error::other(
            "too many descriptors for forked children to close",
        ));
    }
    object.hosted.store(true, Ordering::Release);
    hosted().push(Hosted {
        id: crate::sys::next_map_id(),
        key: key.to_string(),
        object: Arc::downgrade(object),
        pager: pager.clone(),
        threads,
        listener: Arc::new(listener),
        dir: dir.to_path_buf(),
        name: name.to_string(),
        file,
    });
    share::wake();
    Ok(())
}

/// Stops hosting `object` (it closed): its socket is removed if it is still
/// this process's, and the service thread closes the listener.
pub(crate) fn unhost(object: &ObjectCore) {
    if !object.hosted.load(Ordering::Acquire) {
        return;
    }
    let gone: Vec<Hosted> = {
        let mut list = hosted();
        let (gone, kept) = std::mem::take(&mut *list)
            .into_iter()
            .partition(|h| std::ptr::eq(h.object.as_ptr(), object));
        *list = kept;
        gone
    };
    // No lock needed: while the socket file is ours and our listener is
    // open, nobody finds it dead, so nobody replaces it before the unlink;
    // after it, a successor's file is never ours.
    for h in gone {
        rendezvous::unlink_if(&rendezvous::socket_path(&h.dir, &h.name), h.file);
        share::disown_fd(h.listener.as_raw_fd());
    }
    share::wake();
}

/// What a joiner joined: the object (a handle on it) and the pager that
/// serves it, whose threads run while it is served.
struct Joined {
    id: u64,
    hold: Hold,
    pager: Arc<Core>,
    _threads: Keep,
}

/// One forked child, or one unrelated process's mapping.
struct Guest {
    /// Its userfaultfd (a joiner's comes with its `JOIN`).
    uffd: Option<Arc<Uffd>>,
    /// A Protect joiner said it unmapped its range (`UNLINKED`).
    unlinked: bool,
    /// A Protect child's link (no userfaultfd).
    link: Option<Arc<ChildLink>>,
    /// An unrelated process's: the hosted object it connected for, until
    /// it joins, then what it joined. It ends with its channel.
    hosted: Option<u64>,
    joined: Option<Joined>,
    /// Its channel, until the child closes it (it exited, exec'd, or
    /// closed its descriptors).
    channel: Option<OwnedFd>,
    /// A pidfd of the child: the guest ends when the child exits, not when
    /// its channel closes, since the child's ranges stay registered only
    /// while a copy of its userfaultfd is open (a child that closed all
    /// its descriptors would otherwise read holes as zeros). `None` if
    /// `pidfd_open` is refused: the guest ends with its channel.
    pidfd: Option<OwnedFd>,
    table: Arc<RegionTable>,
    /// Per pager: the pager's core, and the one that serves this guest.
    cores: Vec<(Arc<Core>, Arc<Core>)>,
    regions: Vec<(Arc<Region>, Hold)>,
}

/// A handle on an object a guest maps, as a mapping holds one: the object
/// is not closed (its reads cancelled) while a child maps it, and closes
/// when the last of the parent's handles and the children's goes.
struct Hold(Arc<ObjectCore>);

impl Hold {
    /// A handle taken with `try_acquire` already.
    fn adopt(object: Arc<ObjectCore>) -> Hold {
        Hold(object)
    }

    /// A handle made from a live one: the caller holds the region table's
    /// lock over a published region of the object, whose mapping holds a
    /// handle until after the region leaves the table.
    fn new(object: &Arc<ObjectCore>) -> Hold {
        object.acquire();
        Hold(object.clone())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0.release() {
            object::close(&self.0);
        }
    }
}

#[derive(Default)]
struct Service {
    guests: Vec<Guest>,
}

impl Service {
    fn run(mut self, recv: OwnedFd) {
        let mut words = [0u64; share::MAX_WORDS];
        loop {
            // The hosted objects' listeners (looked at again after every
            // wake: `host` and `unhost` send one).
            let listeners: Vec<(u64, Arc<OwnedFd>)> = hosted()
                .iter()
                .map(|h| (h.id, h.listener.clone()))
                .collect();
            // Each guest's channel while it is open, then its pidfd; a
            // joiner's pidfd too (its death ends it even while a forked
            // child of it keeps a copy of its channel), each with the
            // guest it is of.
            let mut fds = vec![&recv];
            fds.extend(listeners.iter().map(|(_, l)| &**l));
            let mut of = Vec::new();
            for (i, g) in self.guests.iter().enumerate() {
                let watched = match (&g.channel, &g.pidfd) {
                    (Some(c), Some(p)) if g.hosted.is_some() => vec![c, p],
                    (Some(c), _) => vec![c],
                    (None, Some(p)) => vec![p],
                    (None, None) => vec![],
                };
                of.extend(std::iter::repeat(i).take(watched.len()));
                fds.extend(watched);
            }
            // While something is hosted, a second at most: a wake lost to
            // a full service socket delays a new listener by that much.
            let timeout = if listeners.is_empty() { -1 } else { 1000 };
            let Ok(ready) = sys::poll_all(&fds, timeout) else {
                continue;
            };
            if ready[0] {
                self.accept(&recv, &mut words);
            }
            for (k, (id, listener)) in listeners.iter().enumerate() {
                if ready[1 + k] {
                    self.accept_joiners(*id, listener);
                }
            }
            let first_guest = 1 + listeners.len();
            let mut ready_guests: Vec<usize> = ready[first_guest..]
                .iter()
                .zip(&of)
                .filter(|(r, _)| **r)
                .map(|(_, &i)| i)
                .collect();
            ready_guests.dedup();
            let mut ended = Vec::new();
            for i in ready_guests {
                if !self.guests[i].serve(&mut words) {
                    ended.push(i);
                }
            }
            for i in ended.into_iter().rev() {
                self.guests.swap_remove(i).end();
            }
        }
    }

    /// Takes in the children that greeted the service.
    fn accept(&mut self, recv: &OwnedFd, words: &mut [u64]) {
        loop {
            match share::recv(recv, words) {
                Ok(Received::Record(n, fds)) => {
                    if n < 3 || words[0] != share::HELLO {
                        continue;
                    }
                    // Its userfaultfd, its mailbox (either or both, as
                    // the flags say), then its channel.
                    let flags = words[2];
                    let uffds = usize::from(flags & share::HELLO_UFFD != 0);
                    let protects = usize::from(flags & share::HELLO_PROTECT != 0);
                    if fds.len() != uffds + 2 * protects + 1 {
                        continue;
                    }
                    let mut fds = fds.into_iter();
                    let uffd = (uffds == 1).then(|| fds.next()).flatten();
                    let mailbox = (protects == 1)
                        .then(|| Some((fds.next()?, fds.next()?)))
                        .flatten();
                    let Some(channel) = fds.next() else {
                        continue;
                    };
                    // The child that made the channel, by the kernel's
                    // word (SO_PEERCRED), must be the one that greeted.
                    let pid = words[1] as i32;
                    let pidfd = share::peer_pidfd(&channel).or_else(|| {
                        (share::peer_pid(&channel) == Some(pid))
                            .then(|| share::pidfd_open(pid).ok())
                            .flatten()
                    });
                    // Signalled through its pidfd only (a pid may be
                    // reused): no pidfd, no Protect ranges served (their
                    // faults get SIGBUS).
                    let link = mailbox.and_then(|(mailbox, alive)| {
                        let pidfd = pidfd.as_ref()?.try_clone().ok()?;
                        ChildLink::new(mailbox, alive, pid, pidfd)
                            .ok()
                            .map(Arc::new)
                    });
                    let uffd = uffd.map(|uffd| {
                        share::own_fd(uffd.as_raw_fd());
                        Arc::new(Uffd::new(uffd))
                    });
                    if uffd.is_none() && link.is_none() {
                        continue;
                    }
                    if let Some(p) = &pidfd {
                        share::own_fd(p.as_raw_fd());
                    }
                    share::own_fd(channel.as_raw_fd());
                    self.guests.push(Guest {
                        uffd,
                        unlinked: false,
                        link,
                        hosted: None,
                        joined: None,
                        channel: Some(channel),
                        pidfd,
                        table: Arc::new(RegionTable::new()),
                        cores: Vec::new(),
                        regions: Vec::new(),
                    });
                }
                Ok(Received::Empty) | Ok(Received::Closed) | Err(_) => return,
            }
        }
    }

    /// Takes in the processes that connected to hosted object `id`: those
    /// of this user only (`SO_PEERCRED`), as guests that have yet to join.
    fn accept_joiners(&mut self, id: u64, listener: &OwnedFd) {
        loop {
            let conn = match rendezvous::accept(listener) {
                Ok(Some(conn)) => conn,
                Ok(None) => return,
                Err(_) => {
                    // Out of descriptors, say: the listener stays readable,
                    // so the next poll would return at once. Breathe.
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    return;
                }
            };
            if rendezvous::peer_uid(&conn) != Some(rendezvous::euid()) {
                continue;
            }
            let pidfd = share::peer_pidfd(&conn);
            if !share::own_fd(conn.as_raw_fd()) {
                // A forked child of this process would keep the channel
                // open after the joiner's death: refused (it hangs up).
                continue;
            }
            self.guests.push(Guest {
                uffd: None,
                unlinked: false,
                link: None,
                hosted: Some(id),
                joined: None,
                channel: Some(conn),
                pidfd,
                table: Arc::new(RegionTable::new()),
                cores: Vec::new(),
                regions: Vec::new(),
            });
        }
    }
}

impl Guest {
    /// Handles what is ready: the records on the channel, or the child's
    /// exit. Returns false once the guest is over: the child exited (or,
    /// without a pidfd, closed its channel).
    fn serve(&mut self, words: &mut [u64]) -> bool {
        if self.hosted.is_some() && self.pidfd.as_ref().is_some_and(share::exited) {
            // A joiner that exited (a child of it may hold its channel).
            return false;
        }
        if self.channel.is_some() {
            if self.drain(words) {
                return true;
            }
            // The channel is closed: the child exited or exec'd, or
            // closed its descriptors and lives on (its ranges must stay
            // registered: the userfaultfd's copy here is kept until it
            // exits; its faults get SIGBUS, the channel being gone).
            if let Some(fd) = self.channel.take() {
                share::disown_fd(fd.as_raw_fd());
            }
            if let Some(link) = &self.link {
                link.closed.store(true, Ordering::Release);
            }
            if self.hosted.is_some() && (self.link.is_none() || self.unlinked) {
                // A joiner: its channel closes after its range is unmapped
                // (or with the process). A Protect joiner says so first
                // (`UNLINKED`); one whose channel closed without it (it
                // closed its descriptors, or exec'd) may still reach pages
                // it was granted: served (its revokes) until it exits.
                return false;
            }
            return self.pidfd.as_ref().is_some_and(|p| !share::exited(p));
        }
        // Only the pidfd is polled now: readable once the child exited.
        self.pidfd.as_ref().is_some_and(|p| !share::exited(p))
    }

    /// Handles every record waiting on the channel. Returns false once the
    /// channel is closed.
    fn drain(&mut self, words: &mut [u64]) -> bool {
        loop {
            let received = match self.channel.as_ref() {
                Some(channel) => share::recv(channel, words),
                None => return false,
            };
            match received {
                Ok(Received::Record(n, mut fds)) => match words.first() {
                    Some(&share::RANGES) if n >= 2 && self.hosted.is_none() => {
                        let count = (words[1] as usize).min((n - 2) / 3);
                        for r in 0..count {
                            let [id, addr, len] = [0, 1, 2].map(|k| words[2 + 3 * r + k]);
                            self.add_range(id, addr as usize, len as usize);
                        }
                    }
                    Some(&share::JOIN) if n >= 3 && fds.len() == 1 => {
                        let fd = fds.remove(0);
                        let joined = self.join(&words[..n], fd, None);
                        if !joined {
                            return false;
                        }
                    }
                    Some(&share::JOIN_PROTECT) if n >= 3 && fds.len() == 2 => {
                        let alive = fds.remove(1);
                        let fd = fds.remove(0);
                        let joined = self.join(&words[..n], fd, Some(alive));
                        if !joined {
                            return false;
                        }
                    }
                    Some(&share::UNLINKED) => self.unlinked = true,
                    Some(&share::RANGE_OF) if n >= 6 => {
                        let [id, addr, len, first, pages] = [1, 2, 3, 4, 5].map(|k| words[k]);
                        self.add_range_of(id, addr as usize, len as usize, first, pages);
                    }
                    Some(&share::FAULT)
                        if n >= 3
                            && fds.len() == 1
                            && (self.uffd.is_some() || self.link.is_some()) =>
                    {
                        let fault = Arc::new(GuestFault {
                            answer: fds.remove(0),
                            write: words[2] & share::FLAG_WRITE != 0,
                            retry: words[2] & share::FLAG_RETRY != 0,
                            answered: AtomicBool::new(false),
                            link: self.link.clone(),
                        });
                        self.fault(words[1] as usize, &fault);
                    }
                    // Not a record of ours: dropped (its fds closed).
                    _ => {}
                },
                Ok(Received::Empty) => return true,
                Ok(Received::Closed) | Err(_) => return false,
            }
        }
    }

    /// Serves the child's range `[addr, addr + len)`, a copy of the
    /// owner's mapping `id`, if that mapping is still there.
    fn add_range(&mut self, id: u64, addr: usize, len: usize) {
        let Some(table) = RegionTable::get_if_ready() else {
            return;
        };
        let (region, hold) = {
            let lock = table.lock();
            match lock.lookup(HostAddr(addr)) {
                Some(r)
                    if r.map.id() == id
                        && r.start().get() == addr
                        && r.map.len() == len
                        && !r.map.is_disowned() =>
                {
                    (r.clone(), Hold::new(&r.object))
                }
                _ => return,
            }
        };
        let Some(core) = self.core_for(&region.owner) else {
            return;
        };
        let Some(guest) = region.for_guest(core) else {
            return;
        };
        // The rmap first: write-back finds (and write-protects) every
        // region a fault can make writable.
        guest.object.add_mapping(&guest);
        self.table.lock().insert(guest.clone());
        self.regions.push((guest, hold));
    }

    /// A joiner's `JOIN` (`words`, with its userfaultfd): if it names the
    /// key of the object it connected for, and that object is open, it
    /// gets the object's memfd. Returns false if it is refused (the
    /// guest then ends).
    /// Under the Protect engine (with its `alive` page), the joiner's fd
    /// is its mailbox, not a userfaultfd.
    fn join(&mut self, words: &[u64], uffd: OwnedFd, alive: Option<OwnedFd>) -> bool {
        let (Some(id), None, Some(channel)) = (self.hosted, &self.joined, &self.channel) else {
            return false;
        };
        let key_len = words[2] as usize;
        let key: Vec<u8> = words[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
        let found = (key_len <= key.len())
            .then(|| {
                hosted()
                    .iter()
                    .find(|h| h.id == id && h.key.as_bytes() == &key[..key_len])
                    .and_then(|h| Some((h.object.upgrade()?, h.pager.clone(), h.threads.clone())))
            })
            .flatten()
            .filter(|(object, _, _)| object.try_acquire());
        let Some((object, pager, threads)) = found else {
            let _ = share::send(channel, &[share::REFUSED], &[]);
            return false;
        };
        let hold = Hold::adopt(object);
        // A Protect joiner is signalled through its pidfd only.
        let link = match alive {
            Some(alive) => {
                let pid = share::peer_cred(channel).map_or(0, |c| c.pid);
                let link = self
                    .pidfd
                    .as_ref()
                    .and_then(|p| p.try_clone().ok())
                    .and_then(|p| ChildLink::new(uffd, alive, pid, p).ok());
                match link {
                    Some(link) => Some(Arc::new(link)),
                    None => {
                        let _ = share::send(channel, &[share::REFUSED], &[]);
                        release_elsewhere((hold, threads));
                        return false;
                    }
                }
            }
            None => {
                if !share::own_fd(uffd.as_raw_fd()) {
                    release_elsewhere((hold, threads));
                    return false;
                }
                self.uffd = Some(Arc::new(Uffd::new(uffd)));
                None
            }
        };
        let page_bytes = hold.0.cache.bytes(1);
        let reply = [share::JOINED, id, hold.0.len, page_bytes];
        let memfd: RawFd = hold.0.cache.memfd().as_raw_fd();
        if share::send(channel, &reply, &[memfd]).is_err() {
            if let Some(uffd) = self.uffd.take() {
                share::disown_fd(uffd.as_raw_fd());
            }
            // Perhaps the object's last handle, and the pager's threads'
            // last keeper: let go elsewhere, not on this thread.
            release_elsewhere((hold, threads));
            return false;
        }
        self.link = link;
        self.joined = Some(Joined {
            id,
            hold,
            pager,
            _threads: threads,
        });
        true
    }

    /// Serves a joiner's range `[addr, addr + len)`, which maps `pages`
    /// pages of the object it joined from `first`.
    fn add_range_of(&mut self, id: u64, addr: usize, len: usize, first: u64, pages: u64) {
        let Some(joined) = &self.joined else {
            return;
        };
        let object = &joined.hold.0;
        let fits = first
            .checked_add(pages)
            .is_some_and(|end| end <= object.cache.page_count())
            && pages > 0
            && object.cache.bytes(pages) == len as u64;
        if joined.id != id || !fits {
            return;
        }
        let (object, pager) = (object.clone(), joined.pager.clone());
        let Some(core) = self.core_for(&pager) else {
            return;
        };
        let Some(region) = Region::for_joiner(&object, core, addr, first, pages) else {
            return;
        };
        if self.table.lock().overlaps(region.start()..region.end()) {
            return;
        }
        let hold = Hold::new(&object);
        region.object.add_mapping(&region);
        self.table.lock().insert(region.clone());
        self.regions.push((region, hold));
    }

    /// The core that serves this guest for `pager` (made on first use).
    fn core_for(&mut self, pager: &Arc<Core>) -> Option<Arc<Core>> {
        if let Some((_, core)) = self.cores.iter().find(|(p, _)| Arc::ptr_eq(p, pager)) {
            return Some(core.clone());
        }
        // The pager's own engine says how its ranges are served here.
        let engine = match pager.engine.protect() {
            Some(_) => PagingEngine::Child(self.link.clone()?),
            None => PagingEngine::Userfaultfd(self.uffd.clone()?),
        };
        let core = Arc::new(pager.for_guest(engine, self.table.clone()));
        self.cores.push((pager.clone(), core.clone()));
        Some(core)
    }

    /// Resolves the child's fault at `addr`.
    fn fault(&self, addr: usize, fault: &Arc<GuestFault>) {
        let region = self.table.lock().lookup(HostAddr(addr)).cloned();
        match region {
            Some(region) => {
                // A Protect child's grant is this fault's alone (only this
                // thread maps for the child).
                if let Some(link) = &self.link {
                    link.take_grant();
                }
                let env = region.owner.env();
                fault::handle(&env, HostAddr(addr), Origin::Guest(fault));
            }
            // Not a range it inherited (or one whose mapping is gone): the
            // SIGBUS is the application's.
            None => fault.complete(Answer::Failed),
        }
    }

    /// The child is gone: its regions leave their objects and its table.
    fn end(self) {
        let lock = self.table.lock();
        for (region, _) in &self.regions {
            region.object.remove_mapping(region);
            lock.remove(region.start());
        }
        drop(lock);
        if let Some(uffd) = &self.uffd {
            share::disown_fd(uffd.as_raw_fd());
        }
        if let Some(fd) = &self.channel {
            share::disown_fd(fd.as_raw_fd());
        }
        if let Some(fd) = &self.pidfd {
            share::disown_fd(fd.as_raw_fd());
        }
        // The handles last, on a thread of their own: a last one closes
        // its object, which may wait for its final write-back, and this
        // thread serves every other child meanwhile.
        if !self.regions.is_empty() || self.joined.is_some() {
            release_elsewhere((self.regions, self.joined));
        }
    }
}

/// Drops `what` (object handles, a pager's threads) on a thread of its
/// own: a last handle closes its object (unhosts it, waits for its final
/// write-back), and a last keeper of a pager's threads joins them, while
/// the service thread serves every other guest. With no thread to be
/// had, here.
fn release_elsewhere<T: Send + 'static>(what: T) {
    let slot = Arc::new(Mutex::new(Some(what)));
    let theirs = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("faultmap-guest-end".into())
        .spawn(move || drop(theirs.lock().map(|mut w| w.take())));
    if spawned.is_err() {
        drop(slot.lock().map(|mut w| w.take()));
    }
}
