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

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::index::HostAddr;
use crate::cache::wait::Uffd;
use crate::mm::fault::{self, Origin};
use crate::mm::object::{self, ObjectCore};
use crate::mm::pager_core::Core;
use crate::mm::signal;
use crate::mm::space::{Region, RegionTable};
use crate::sys::share::{self, Answer, Received};
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
}

impl GuestFault {
    /// Answers the child, once (a second answer is dropped).
    pub(crate) fn complete(&self, answer: Answer) {
        if !self.answered.swap(true, Ordering::AcqRel) {
            share::answer(&self.answer, answer);
        }
    }
}

/// Starts this process's service thread, once per fork generation, and
/// makes the process an owner: children forked from now on are served
/// here. `core` is the first pager's (the userfaultfd's source and the
/// features a child asks for come from it).
pub(crate) fn serve(core: &Core, source: UffdSource) -> std::io::Result<()> {
    static STARTED: sys::ForkLocal<Mutex<bool>> = sys::ForkLocal::new();
    let started = STARTED.get_or_init(|| Mutex::new(false));
    let mut started = started.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return Ok(());
    }
    // A child inherits the SIGBUS disposition: faultmap's handler forwards
    // its faults here.
    signal::install()?;
    let (recv, send) = share::seqpacket_pair()?;
    let mut features = feature::MISSING_SHMEM | feature::MINOR_SHMEM;
    if core.write_protect {
        features |= feature::WP_HUGETLBFS_SHMEM;
    }
    if core.hugetlb {
        features |= feature::MINOR_HUGETLBFS | feature::MISSING_HUGETLBFS;
    }
    let recv_fd = recv.as_raw_fd();
    std::thread::Builder::new()
        .name("faultmap-guests".into())
        .spawn(move || Service::default().run(recv))?;
    // Children close their copy of the receiving end first thing (listed
    // once the thread owns it: a child forked before keeps a copy).
    share::own_fd(recv_fd);
    // The sending end stays open for the process's life: every child
    // inherits it.
    share::serve(send.into_raw_fd(), source, features);
    *started = true;
    Ok(())
}

/// One forked child.
struct Guest {
    uffd: Arc<Uffd>,
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
            // Each guest's channel while it is open, then its pidfd.
            let mut fds = vec![&recv];
            fds.extend(
                self.guests
                    .iter()
                    .filter_map(|g| g.channel.as_ref().or(g.pidfd.as_ref())),
            );
            let Ok(ready) = sys::poll_all(&fds, -1) else {
                continue;
            };
            if ready[0] {
                self.accept(&recv, &mut words);
            }
            let mut ended = Vec::new();
            for (i, ready) in ready[1..].iter().enumerate() {
                if *ready && !self.guests[i].serve(&mut words) {
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
                    let Ok::<[OwnedFd; 2], _>([uffd, channel]) = fds.try_into() else {
                        continue;
                    };
                    if n < 2 || words[0] != share::HELLO {
                        continue;
                    }
                    // The child that made the channel, by the kernel's
                    // word (SO_PEERCRED), must be the one that greeted.
                    let pid = words[1] as i32;
                    let pidfd = share::peer_pidfd(&channel).or_else(|| {
                        (share::peer_pid(&channel) == Some(pid))
                            .then(|| share::pidfd_open(pid).ok())
                            .flatten()
                    });
                    share::own_fd(uffd.as_raw_fd());
                    share::own_fd(channel.as_raw_fd());
                    self.guests.push(Guest {
                        uffd: Arc::new(Uffd::new(uffd)),
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
}

impl Guest {
    /// Handles what is ready: the records on the channel, or the child's
    /// exit. Returns false once the guest is over: the child exited (or,
    /// without a pidfd, closed its channel).
    fn serve(&mut self, words: &mut [u64]) -> bool {
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
                    Some(&share::RANGES) if n >= 2 => {
                        let count = (words[1] as usize).min((n - 2) / 3);
                        for r in 0..count {
                            let [id, addr, len] = [0, 1, 2].map(|k| words[2 + 3 * r + k]);
                            self.add_range(id, addr as usize, len as usize);
                        }
                    }
                    Some(&share::FAULT) if n >= 3 && fds.len() == 1 => {
                        let fault = Arc::new(GuestFault {
                            answer: fds.remove(0),
                            write: words[2] & share::FLAG_WRITE != 0,
                            retry: words[2] & share::FLAG_RETRY != 0,
                            answered: AtomicBool::new(false),
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
        let core = match self
            .cores
            .iter()
            .find(|(pager, _)| Arc::ptr_eq(pager, &region.owner))
        {
            Some((_, core)) => core.clone(),
            None => {
                let core = Arc::new(
                    region
                        .owner
                        .for_guest(self.uffd.clone(), self.table.clone()),
                );
                self.cores.push((region.owner.clone(), core.clone()));
                core
            }
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

    /// Resolves the child's fault at `addr`.
    fn fault(&self, addr: usize, fault: &Arc<GuestFault>) {
        let region = self.table.lock().lookup(HostAddr(addr)).cloned();
        match region {
            Some(region) => {
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
        share::disown_fd(self.uffd.as_raw_fd());
        if let Some(fd) = &self.channel {
            share::disown_fd(fd.as_raw_fd());
        }
        // The handles last, on a thread of their own: a last one closes
        // its object, which may wait for its final write-back, and this
        // thread serves every other child meanwhile.
        // (With no thread to be had, the handles go here, with the closure.)
        let regions = self.regions;
        let _ = std::thread::Builder::new()
            .name("faultmap-guest-end".into())
            .spawn(move || drop(regions));
    }
}
