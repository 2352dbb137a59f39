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

use std::os::fd::{IntoRawFd, OwnedFd};
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
    std::thread::Builder::new()
        .name("faultmap-guests".into())
        .spawn(move || Service::default().run(recv))?;
    // The sending end stays open for the process's life: every child
    // inherits it.
    share::serve(send.into_raw_fd(), source, features);
    *started = true;
    Ok(())
}

/// One forked child.
struct Guest {
    uffd: Arc<Uffd>,
    channel: OwnedFd,
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
            let mut fds = vec![&recv];
            fds.extend(self.guests.iter().map(|g| &g.channel));
            let Ok(ready) = sys::poll_all(&fds, -1) else {
                continue;
            };
            if ready[0] {
                self.accept(&recv, &mut words);
            }
            let mut ended = Vec::new();
            for (i, ready) in ready[1..].iter().enumerate() {
                if *ready && !self.guests[i].drain(&mut words) {
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
                    self.guests.push(Guest {
                        uffd: Arc::new(Uffd::new(uffd)),
                        channel,
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
    /// Handles every record waiting on the channel. Returns false once the
    /// child is gone (its channel closed).
    fn drain(&mut self, words: &mut [u64]) -> bool {
        loop {
            match share::recv(&self.channel, words) {
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
        // The handles last: a last one closes its object.
        drop(self.regions);
    }
}
