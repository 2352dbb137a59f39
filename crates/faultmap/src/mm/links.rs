//! Links: the ranges this process joined of other processes' caches
//! (`crate::api::shared`), each with its channel to the owner and a pidfd
//! of the owner, for the SIGBUS handler to find a faulting address's
//! owner with no lock and no allocation.
//!
//! A fixed table of slots. Writers (a joined mapping made or dropped:
//! ordinary threads) take the table's mutex and change a slot inside a
//! write section of its sequence count (`crate::sync::seqcount`); the
//! handler reads a slot's words between `begin` and `still`, and reads it
//! again if a writer changed it meanwhile, so it never acts on a mix of
//! two links' words (one slot freed and taken by another mapping while
//! the handler looked at it). A slot in a write section is skipped: it is
//! a range being made (not handed out yet) or dropped (no access may
//! fault on it while its mapping is dropped). Modelled by `loom_models_a_link_is_never_read_torn`.
//!
//! The table is one per fork generation (`sys::ForkLocal`): a forked
//! child has no links (its parent's ranges are placeholders there), and
//! the child closes its copies of the link's descriptors first thing
//! (they are listed with `share::own_fd`).

use std::os::fd::RawFd;

use crate::sync::seqcount::SeqCount;
use crate::sync::{AtomicUsize, Mutex, Ordering};
use crate::sys::revoke::{ChildState, Granted, Mailbox};
use crate::sys::share::{self, Answer, Grant};

/// Links a process may have at once (one per joined mapping).
pub(crate) const LINKS_MAX: usize = 1024;

/// One link: the range `[start, end)` (`end` 0: a free slot), the channel
/// to its owner and the owner's pidfd, each stored as the descriptor plus
/// one (0: none).
#[derive(Default)]
struct Link {
    seq: SeqCount,
    start: AtomicUsize,
    end: AtomicUsize,
    channel: AtomicUsize,
    owner: AtomicUsize,
    /// Under the Protect engine: the mailbox the owner's revokes come in
    /// (`crate::sys::revoke`), attached while the link is.
    state: ChildState,
}

/// The table of links.
pub(crate) struct Links {
    slots: Box<[Link]>,
    writers: Mutex<()>,
}

impl Links {
    pub(crate) fn new(slots: usize) -> Links {
        Links {
            slots: (0..slots).map(|_| Link::default()).collect(),
            writers: Mutex::new(()),
        }
    }

    /// Links `[start, start + len)` to the owner at the other end of
    /// `channel` (`owner`: a pidfd of it). Returns the slot, or `None` if
    /// every slot is taken.
    ///
    /// With `mailbox` (the Protect engine: the caller keeps it mapped
    /// until [`Links::unlink`] returns), the owner's revokes are read
    /// there from now on.
    pub(crate) fn link(
        &self,
        start: usize,
        len: usize,
        channel: RawFd,
        owner: Option<RawFd>,
        mailbox: Option<*const Mailbox>,
    ) -> Option<usize> {
        let _w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let slot = self
            .slots
            .iter()
            .position(|l| l.end.load(Ordering::Relaxed) == 0)?;
        let l = &self.slots[slot];
        if let Some(mailbox) = mailbox {
            #[cfg(not(loom))]
            crate::sys::with_async_signals_blocked(|| l.state.attach(mailbox));
            #[cfg(loom)]
            l.state.attach(mailbox);
        }
        l.seq.write_begin();
        l.start.store(start, Ordering::Relaxed);
        l.end.store(start + len, Ordering::Relaxed);
        l.channel.store(channel as usize + 1, Ordering::Relaxed);
        l.owner
            .store(owner.map_or(0, |o| o as usize + 1), Ordering::Relaxed);
        l.seq.write_end();
        Some(slot)
    }

    /// Frees `slot` (its mapping is being dropped: unmapped next).
    pub(crate) fn unlink(&self, slot: usize) {
        let _w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = self.slots.get(slot) {
            // Its mailbox first: once detached, no handler reads it.
            #[cfg(not(loom))]
            crate::sys::with_async_signals_blocked(|| l.state.detach());
            #[cfg(loom)]
            l.state.detach();
            l.seq.write_begin();
            for word in [&l.start, &l.end, &l.channel, &l.owner] {
                word.store(0, Ordering::Relaxed);
            }
            l.seq.write_end();
        }
    }

    /// The channel and owner pidfd (-1: none) of the link holding `addr`.
    /// No lock, no allocation: async-signal-safe.
    pub(crate) fn find(&self, addr: usize) -> Option<(RawFd, RawFd)> {
        self.find_slot(addr).map(|f| (f.channel, f.owner))
    }

    /// What [`Links::find`] finds, with the slot and its range.
    fn find_slot(&self, addr: usize) -> Option<Found> {
        for (slot, l) in self.slots.iter().enumerate() {
            // A writer at work (odd count): a range being made or
            // unmapped, skipped.
            while let Some(seen) = l.seq.begin() {
                let start = l.start.load(Ordering::Relaxed);
                let end = l.end.load(Ordering::Relaxed);
                let channel = l.channel.load(Ordering::Relaxed);
                let owner = l.owner.load(Ordering::Relaxed);
                if !l.seq.still(seen) {
                    continue;
                }
                if start <= addr && addr < end && channel > 0 {
                    return Some(Found {
                        channel: channel as RawFd - 1,
                        owner: owner as RawFd - 1,
                        slot,
                        range: start..end,
                    });
                }
                break;
            }
        }
        None
    }

    /// Applies the grant a Protect joiner's owner answered for a fault in
    /// the link's `range` at `slot`: each entry inside the range and
    /// read-only (a joined range is never writable), else refused.
    fn grant(
        &self,
        slot: usize,
        range: &std::ops::Range<usize>,
        grant: &Grant,
        addr: usize,
    ) -> Granted {
        let Some(l) = self.slots.get(slot) else {
            return Granted::Stale;
        };
        let entries = &grant.entries[..grant.n.min(share::GRANT_MAX)];
        let inside = entries.iter().all(|e| {
            e.prot != crate::sys::Prot::ReadWrite
                && e.addr >= range.start
                && e.addr
                    .checked_add(e.len)
                    .is_some_and(|end| end <= range.end)
        });
        if !inside {
            return Granted::Failed(libc::EINVAL);
        }
        let reset = || self.reset_all();
        // A neighbour's failure is no failure of the access.
        let apply = |e: &crate::sys::revoke::Entry| match share::grant_entry(e, &reset) {
            Err(errno) if e.addr <= addr && addr - e.addr < e.len => Err(errno),
            _ => Ok(()),
        };
        #[cfg(not(loom))]
        return crate::sys::with_async_signals_blocked(|| l.state.grant(grant.g, entries, apply));
        #[cfg(loom)]
        l.state.grant(grant.g, entries, apply)
    }

    /// Protects every linked range with a mailbox `PROT_NONE` again (which
    /// only takes away): out of memory areas.
    fn reset_all(&self) {
        for l in self.slots.iter() {
            if !l.state.attached() {
                continue;
            }
            if let Some(seen) = l.seq.begin() {
                let (start, end) = (
                    l.start.load(Ordering::Relaxed),
                    l.end.load(Ordering::Relaxed),
                );
                if l.seq.still(seen) && end > start {
                    let _ = crate::sys::protect(start, end - start, crate::sys::Prot::None);
                }
            }
        }
    }
}

/// A link found for an address.
struct Found {
    channel: RawFd,
    owner: RawFd,
    slot: usize,
    range: std::ops::Range<usize>,
}

/// The SIGURG handler's work in a Protect joiner: each link's mailbox's
/// newest record applied and acknowledged. Async-signal-safe.
pub(crate) fn on_revoke() {
    let Some(links) = LINKS.get() else {
        return;
    };
    let reset = || links.reset_all();
    for l in links.slots.iter().filter(|l| l.state.attached()) {
        l.state.revoke(|e| share::revoke_entry(e, &reset));
    }
}

/// A Protect joiner's fault at `addr`: `None` if no link with a mailbox
/// holds it; else the owner is asked, and its grant applied. Whether the
/// access may run again (`Some(true)`) or must fail (`Some(false)`: the
/// owner is gone, or the page cannot be had). `in_handler`: called by the
/// SIGSEGV handler, whose mask blocks SIGURG, unblocked while it waits (a
/// thread that blocks SIGURG itself keeps it blocked). Async-signal-safe.
pub(crate) fn protect_fault(addr: usize, write: bool, in_handler: bool) -> Option<bool> {
    let links = LINKS.get()?;
    let found = links.find_slot(addr)?;
    if !links.slots.get(found.slot)?.state.attached() {
        return None;
    }
    if write && crate::sys::FAULT_WRITE_KNOWN {
        // A joined range is read-only: the application's own fault.
        return None;
    }
    let page = addr & !(crate::sys::PAGE_SIZE - 1);
    // While this thread waits, it answers the owner's revokes (see
    // `crate::mm::signal::protect_child`).
    #[cfg(not(loom))]
    if in_handler {
        crate::sys::signal_mask_one(libc::SIGURG, false);
    }
    #[cfg(loom)]
    let _ = in_handler;
    let mut retry = false;
    loop {
        match share::request_on(found.channel, found.owner, page, write, retry) {
            Answer::Retry => retry = true,
            Answer::Mapped => return Some(true),
            Answer::Failed => return Some(false),
            Answer::Grant(grant) => {
                return Some(matches!(
                    links.grant(found.slot, &found.range, &grant, addr),
                    Granted::Applied | Granted::Stale
                ))
            }
        }
    }
}

/// This process's links (none in a forked child of the process that
/// made them).
static LINKS: crate::sys::ForkLocal<Links> = crate::sys::ForkLocal::new();

/// This process's table, made on first use.
pub(crate) fn links() -> &'static Links {
    LINKS.get_or_init(|| Links::new(LINKS_MAX))
}

/// Asks whoever serves the page at `addr` to resolve a fault there and
/// waits for the answer: the owner of the joined range that holds it, or
/// this process's parent if it is a forked child of an owner
/// (`share::request`). `None`: nobody serves it. Async-signal-safe.
pub(crate) fn request(addr: usize, write: bool, retry: bool) -> Option<Answer> {
    match LINKS.get().and_then(|l| l.find(addr)) {
        Some((channel, owner)) => Some(share::request_on(channel, owner, addr, write, retry)),
        None => share::request(addr, write, retry),
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::Links;
    use loom::sync::Arc;
    use loom::thread;

    /// A joined mapping is dropped (its slot freed) and another made in
    /// the same slot, with another channel, while the SIGBUS handler looks
    /// up an address of each: a lookup finds a range with its own channel,
    /// never the other's (a torn read of the two links), and an address is
    /// found only while its link is there.
    #[test]
    fn loom_models_a_link_is_never_read_torn() {
        // Two preemptions find a torn read (checked by dropping `still`
        // from `find`) in a tenth of the default bound's time.
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(|| {
            let links = Arc::new(Links::new(1));
            let first = links
                .link(0x1000, 0x1000, 10, Some(20), None)
                .expect("a slot");
            let l = links.clone();
            let writer = thread::spawn(move || {
                l.unlink(first);
                l.link(0x3000, 0x2000, 11, None, None)
                    .expect("the slot again")
            });
            // In the second range: found with its own channel, or not
            // yet. Between the two ranges: never (a torn read of the first
            // link's start and the second's end would find it).
            if let Some(found) = links.find(0x4000) {
                assert_eq!(found, (11, -1), "the link found for 0x4000");
            }
            assert_eq!(links.find(0x2800), None, "a torn read");
            let second = writer.join().unwrap();
            assert_eq!(links.find(0x4000), Some((11, -1)));
            assert_eq!(links.find(0x1800), None);
            links.unlink(second);
            assert_eq!(links.find(0x4000), None);
        });
    }
}
