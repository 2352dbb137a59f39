//! Signal delivery: the faulting thread resolves its own fault in a SIGBUS
//! handler, with no handler-thread round trip.
//!
//! A pager created with [`crate::Delivery::Signal`] asks for
//! `UFFD_FEATURE_SIGBUS`: a fault in its mappings raises SIGBUS
//! (`BUS_ADRERR`) in the faulting thread instead of queueing a message. The
//! process-wide handler installed here ([`install`]) then:
//!
//! 1. looks the address up speculatively in the region table
//!    (`crate::mm::space`, an SRCU read section: no lock, no allocation);
//!    an address no signal-delivery pager maps is not ours, once it has
//!    been looked up again after any userfaultfd events in flight (an
//!    `mremap` destination is served before its region is published: the
//!    pager thread handling the event is in a passage until it is, which a
//!    settled lock waits for: `crate::mm::events`);
//! 2. on a plain hit (the page UPTODATE, no readahead marker) pins and maps
//!    the fault-around window with `UFFDIO_CONTINUE` and returns: the
//!    access runs again and finds its page ([`crate::mm::fault::fast`]);
//! 3. otherwise (a miss, a read in flight, a marker, a failed page, a
//!    region being changed) it **forwards** the fault: ends its read
//!    section, posts the address in a free slot of the pager's request
//!    array, rings the pager's doorbell (an eventfd write), and waits on the
//!    slot with a futex. A pager thread runs the full fault path on it
//!    (readahead policy, I/O submission, parking) exactly as for a
//!    userfaultfd message, and completes the slot: mapped (return), retry
//!    (the read it waited for ended: look again, uncounted), or failed;
//! 4. a SIGBUS that is not ours (another mapping's, a truncated file, a
//!    `kill`), or a failed read of ours, goes to the disposition that was
//!    installed before faultmap's, as if faultmap were not there: the
//!    application's handler is called with the same arguments, or the
//!    default action ends the process with SIGBUS.
//!
//! # Why a miss is forwarded, not read in the handler
//!
//! The issue allowed either a `pread` in the handler or a hand-off. A
//! `Store` is arbitrary code (an HTTP or S3 client allocates and locks), and
//! the readahead decision takes the object's readahead lock: neither may
//! run in a signal handler. A miss costs a store read (tens of µs at least),
//! so the hand-off's futex round trip is small beside it; the hit, which is
//! what a warm scan does, never leaves the faulting thread.
//!
//! # What the handler may do
//!
//! Atomics, `UFFDIO_CONTINUE`, `eventfd` writes, `futex`, `sched_getcpu`,
//! `sigaction` and `raise`: all async-signal-safe. No allocation (page-state
//! chunks are only ever allocated on the miss path, on pager threads, from
//! `crate::cache::pool`), no lock (but the benchmark-only global cache lock, and the
//! table's lock with `RegionLookup::Classic`, or the events gate and the
//! mutexes of its SRCU domain for an address with no region while a pager
//! thread reads userfaultfd events: see `classic` for why those are safe
//! here), no thread-local storage, no panic (slices are indexed
//! with `get`; the arithmetic cannot overflow on addresses inside a
//! region).
//!
//! # What the application must know
//!
//! - SIGBUS must not be blocked in a thread that touches a mapping (a
//!   fault's SIGBUS is forced: the kernel kills a process whose faulting
//!   thread blocks it). Other signals may be blocked freely.
//! - A system call that reads from a mapping's page that is not mapped yet
//!   (`write(fd, &map[..])`) gets `EFAULT`: the kernel raises no signal for
//!   its own accesses. Touch the range first, or use handler-thread
//!   delivery, which serves the kernel's accesses too.
//! - An application that installs its own SIGBUS handler *after* creating a
//!   signal-delivery pager replaces faultmap's; it must chain to the
//!   disposition it replaced, as faultmap does.

use std::sync::{Arc, OnceLock};

use crate::sync::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use crate::base::index::HostAddr;
use crate::mm::fault::{self, Fast};
use crate::mm::pager_core::Core;
use crate::mm::space::{RegionTable, Speculated};
use crate::sys::share::Answer;
use crate::sys::{self, Disposition};

/// Requests a pager can have in flight from SIGBUS handlers; a thread that
/// finds none free sleeps briefly and faults again.
#[cfg(not(loom))]
const SLOTS: usize = 128;
/// One under loom, so that the model's requests reuse it.
#[cfg(loom)]
const SLOTS: usize = 1;

/// How long a forwarding handler polls its slot before it sleeps on it (a
/// pager thread that is polling answers a hit-after-read in a few µs;
/// waking a sleeping thread costs about 40 µs on this machine).
#[cfg_attr(loom, allow(dead_code))]
const SPIN: Duration = Duration::from_micros(30);

// Slot states.
const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const POSTED: u32 = 2;
const TAKEN: u32 = 3;
const DONE_MAPPED: u32 = 4;
const DONE_RETRY: u32 = 5;
const DONE_FAILED: u32 = 6;

/// How a forwarded fault was completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The page is mapped (or the fault has nothing left to do): return.
    Mapped,
    /// The read the fault waited for ended: look again (a retry, not
    /// counted as a new fault).
    Retry,
    /// The page cannot be read: SIGBUS to the application.
    Failed,
}

struct Slot {
    state: AtomicU32,
    /// The faulting page's address ([`HostAddr`], stored raw).
    addr: AtomicUsize,
    retry: AtomicBool,
    /// The access may be a write (see [`RequestRef::may_write`]).
    write: AtomicBool,
}

/// A pager's request slots and its doorbell.
pub(crate) struct Requests {
    slots: Box<[Slot]>,
    /// Written (made readable) after a request is posted; the pager threads
    /// poll it.
    doorbell: std::os::fd::OwnedFd,
}

/// One posted request, as the pager thread that took it (or the parked
/// fault waiting on its read) holds it.
#[derive(Clone)]
pub(crate) struct RequestRef {
    requests: Arc<Requests>,
    index: usize,
}

impl std::fmt::Debug for RequestRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestRef")
            .field("index", &self.index)
            .finish()
    }
}

impl RequestRef {
    fn slot(&self) -> Option<&Slot> {
        self.requests.slots.get(self.index)
    }

    /// Whether the forwarding handler already counted this fault.
    pub(crate) fn is_retry(&self) -> bool {
        self.slot().is_some_and(|s| s.retry.load(Ordering::Relaxed))
    }

    /// Whether the faulting access may be a write: the page-fault error
    /// code the kernel gave the SIGBUS says so (x86-64; elsewhere every
    /// access may be). A read that finds its page mapped already by
    /// another fault must not be taken for a write to a write-protected
    /// page (which would mark the page dirty).
    pub(crate) fn may_write(&self) -> bool {
        self.slot()
            .map_or(true, |s| s.write.load(Ordering::Relaxed))
    }

    /// Completes the request; the waiting handler returns or looks again.
    pub(crate) fn complete(&self, reply: Reply) {
        let Some(slot) = self.slot() else { return };
        let state = match reply {
            Reply::Mapped => DONE_MAPPED,
            Reply::Retry => DONE_RETRY,
            Reply::Failed => DONE_FAILED,
        };
        slot.state.store(state, Ordering::Release);
        wake(&slot.state);
    }
}

/// Wakes the handler sleeping on a slot's state word.
#[cfg(not(loom))]
fn wake(state: &AtomicU32) {
    sys::futex_wake(state, 1);
}

/// Under loom the handler yields instead of sleeping: nothing to wake.
#[cfg(loom)]
fn wake(_state: &AtomicU32) {}

/// Waits until the request in `slot` is done; returns the DONE_ state.
/// Spins `SPIN` first, then sleeps on the state word (futex).
#[cfg(not(loom))]
fn wait_done(slot: &Slot) -> u32 {
    let spin_until = sys::monotonic_ns().saturating_add(SPIN.as_nanos() as u64);
    loop {
        let s = slot.state.load(Ordering::Acquire);
        if s >= DONE_MAPPED {
            return s;
        }
        if sys::monotonic_ns() < spin_until {
            std::hint::spin_loop();
        } else {
            sys::futex_wait(&slot.state, s, None);
        }
    }
}

/// Under loom: yields until the request is done.
#[cfg(loom)]
fn wait_done(slot: &Slot) -> u32 {
    loop {
        let s = slot.state.load(Ordering::Acquire);
        if s >= DONE_MAPPED {
            return s;
        }
        loom::thread::yield_now();
    }
}

impl Requests {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self {
            slots: (0..SLOTS)
                .map(|_| Slot {
                    state: AtomicU32::new(FREE),
                    addr: AtomicUsize::new(0),
                    retry: AtomicBool::new(false),
                    write: AtomicBool::new(true),
                })
                .collect(),
            doorbell: sys::eventfd()?,
        })
    }

    /// The doorbell, for the pager threads' `poll`.
    pub(crate) fn doorbell(&self) -> &std::os::fd::OwnedFd {
        &self.doorbell
    }

    /// Runs `f` on every posted request (a pager thread). Returns how many
    /// it ran.
    pub(crate) fn serve(self: &Arc<Self>, mut f: impl FnMut(HostAddr, &RequestRef)) -> usize {
        let mut n = 0;
        for (index, slot) in self.slots.iter().enumerate() {
            if slot.state.load(Ordering::Acquire) != POSTED
                || slot
                    .state
                    .compare_exchange(POSTED, TAKEN, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let r = RequestRef {
                requests: self.clone(),
                index,
            };
            f(HostAddr(slot.addr.load(Ordering::Relaxed)), &r);
            n += 1;
        }
        n
    }

    /// Forwards the fault at `addr` and waits for its completion (in a
    /// SIGBUS handler: async-signal-safe). `None`: no slot was free; the
    /// caller returns and the access faults again.
    fn forward(&self, addr: HostAddr, retry: bool, write: bool) -> Option<Reply> {
        let Some(slot) = self.post(addr, retry, write) else {
            // Every slot is busy: back off a little (a futex wait on a word
            // that never changes is an async-signal-safe sleep).
            #[cfg(not(loom))]
            sys::futex_wait(&AtomicU32::new(0), 0, Some(Duration::from_micros(100)));
            return None;
        };
        let _ = sys::eventfd_signal(&self.doorbell);
        Some(Self::finish(slot, wait_done(slot)))
    }

    /// Claims a free slot (FREE → CLAIMED) and posts the request in it
    /// (→ POSTED, Release: a pager thread that takes it sees `addr`,
    /// `retry` and `write`). `None` if no slot is free.
    fn post(&self, addr: HostAddr, retry: bool, write: bool) -> Option<&Slot> {
        let slot = self.slots.iter().find(|s| {
            s.state.load(Ordering::Relaxed) == FREE
                && s.state
                    .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        })?;
        slot.addr.store(addr.get(), Ordering::Relaxed);
        slot.retry.store(retry, Ordering::Relaxed);
        slot.write.store(write, Ordering::Relaxed);
        slot.state.store(POSTED, Ordering::Release);
        Some(slot)
    }

    /// Frees a done slot (→ FREE) and says how the request ended.
    fn finish(slot: &Slot, done: u32) -> Reply {
        slot.state.store(FREE, Ordering::Release);
        match done {
            DONE_RETRY => Reply::Retry,
            DONE_FAILED => Reply::Failed,
            _ => Reply::Mapped,
        }
    }
}

/// The SIGBUS disposition faultmap's handler replaced, to chain to.
static PREVIOUS: OnceLock<Disposition> = OnceLock::new();
/// The SIGSEGV dispositions the Protect engine's handler replaced: the
/// first when it was installed, then each one that replaced it in turn
/// (`keep_protect_handler`). Write-once slots, so that a handler reading
/// one never races its writer; the current one is `SEGV_CURRENT`'s.
static PREVIOUS_SEGV: [OnceLock<Disposition>; SEGV_CHAIN] = [const { OnceLock::new() }; SEGV_CHAIN];
/// How many times faultmap's SIGSEGV handler is put back at most.
const SEGV_CHAIN: usize = 64;
/// The slot of `PREVIOUS_SEGV` the handler chains to.
static SEGV_CURRENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Installs the process's SIGBUS handler, once. Called by the first
/// signal-delivery pager, before any of its mappings exists.
pub(crate) fn install() -> std::io::Result<()> {
    install_for(libc::SIGBUS, &PREVIOUS, on_sigbus)
}

/// Installs the process's SIGSEGV handler, once. Called by the first
/// Protect-engine pager, before any of its mappings exists.
pub(crate) fn install_protect() -> std::io::Result<()> {
    install_for(libc::SIGSEGV, &PREVIOUS_SEGV[0], on_sigsegv)
}

/// The SIGURG disposition faultmap's revoke handler replaced.
static PREVIOUS_URG: OnceLock<Disposition> = OnceLock::new();

/// Installs the process's SIGURG handler, once: a Protect owner's forked
/// children inherit it and take pages back on their owner's word
/// (`crate::sys::revoke`). Called before the first such child is forked.
pub(crate) fn install_revoke() -> std::io::Result<()> {
    static INSTALLED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut done = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return Ok(());
    }
    let _ = PREVIOUS_URG.set(sys::fault_signal_query(libc::SIGURG)?);
    // Every asynchronous signal, SIGURG included, is blocked while it runs
    // (as while the SIGSEGV handler runs): a revoke never interrupts a
    // grant or another revoke on the same thread. SA_RESTART: a child's
    // blocking `read` is not cut short by its owner's evictions.
    sys::async_signal_install(libc::SIGURG, on_sigurg)?;
    *done = true;
    Ok(())
}

extern "C" fn on_sigurg(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let errno = sys::errno_get();
    // A Protect child applies its mailbox's newest record, a joiner each
    // of its links' (nothing new: nothing done).
    crate::sys::share::on_revoke();
    crate::mm::links::on_revoke();
    // SIGURG is not queued: an owner's and the application's (its
    // sockets' urgent data, or a runtime's own use of it) may arrive as
    // one. So a handler the application installed before faultmap's is
    // always called too; SIGURG's default action is to ignore it.
    if let Some(prev) = PREVIOUS_URG.get().filter(|p| !p.is_default_or_ignore()) {
        // SAFETY: the arguments are this handler's own.
        unsafe { sys::fault_signal_chain(prev, sig, info, ctx, true) };
    }
    sys::errno_set(errno);
}

/// Puts the Protect engine's SIGSEGV handler back if something replaced
/// it since (Python's `faulthandler.enable()`, or its `disable()`, which
/// restores what it found before it: pytest does both), chaining to the
/// replacement from then on. Called before each Protect mapping is
/// published: an access to a mapping faults into faultmap's handler as
/// long as nothing replaces it after the mapping is made (see "In
/// containers" in the README). Gives up after [`SEGV_CHAIN`] times.
pub(crate) fn keep_protect_handler() -> std::io::Result<()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let now = sys::fault_signal_query(libc::SIGSEGV)?;
    if now.is(on_sigsegv) {
        return Ok(());
    }
    let next = SEGV_CURRENT.load(Ordering::Relaxed) + 1;
    // Recorded, then published, then installed: a SIGSEGV in between is
    // chained to the handler that runs now either way. Past the last slot
    // faultmap's handler still goes back, chaining to the last recorded.
    if let Some(slot) = PREVIOUS_SEGV.get(next) {
        let _ = slot.set(now);
        SEGV_CURRENT.store(next, Ordering::Release);
    }
    sys::fault_signal_install(libc::SIGSEGV, on_sigsegv).map(drop)
}

fn install_for(
    sig: libc::c_int,
    previous: &OnceLock<Disposition>,
    handler: sys::SigInfoHandler,
) -> std::io::Result<()> {
    static INSTALLED: std::sync::Mutex<[bool; 2]> = std::sync::Mutex::new([false; 2]);
    let mut done = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    let which = usize::from(sig == libc::SIGSEGV);
    if done[which] {
        return Ok(());
    }
    // Recorded before ours goes in: a signal in between is chained.
    let _ = previous.set(sys::fault_signal_query(sig)?);
    sys::fault_signal_install(sig, handler)?;
    done[which] = true;
    Ok(())
}

/// What the handler made of a SIGBUS or SIGSEGV.
enum Outcome {
    /// Resolved (or to be retried by faulting again): return.
    Resolved,
    /// Not a fault faultmap serves, or one it cannot: chain.
    NotOurs,
    /// A Protect mapping's page that cannot be read: SIGBUS, as the
    /// kernel raises for a file page it cannot read.
    Failed,
}

/// Which engine's faults a signal carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// SIGBUS from a userfaultfd (`UFFD_FEATURE_SIGBUS`).
    Userfaultfd,
    /// SIGSEGV on a Protect mapping's `PROT_NONE` (or read-only) page.
    Protect,
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The interrupted code's errno survives the system calls made here.
    let errno = sys::errno_get();
    handle_sigbus(sig, info, ctx);
    sys::errno_set(errno);
}

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let errno = sys::errno_get();
    handle_sigsegv(sig, info, ctx);
    sys::errno_set(errno);
}

fn handle_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: `info` is the kernel's siginfo for this SA_SIGINFO handler.
    let fault = unsafe { sys::siginfo_fault(info) };
    // Only a userfaultfd's SIGBUS (BUS_ADRERR); a sent SIGBUS, a machine
    // check (BUS_MCEERR_*) or an alignment fault is never ours.
    if let Some((addr, libc::BUS_ADRERR)) = fault {
        // SAFETY: `ctx` is the kernel's ucontext for this SA_SIGINFO
        // handler (or null).
        let write = unsafe { sys::fault_may_write(ctx) };
        if let Outcome::Resolved = resolve(HostAddr(addr), write, Via::Userfaultfd) {
            return;
        }
    }
    let sent = !matches!(fault, Some((_, code)) if code > 0);
    // SAFETY: the arguments are this handler's own.
    unsafe { chain_sigbus(sig, info, ctx, sent) };
}

/// Hands a SIGBUS to the disposition faultmap's handler replaced (or, with
/// no SIGBUS handler of faultmap's, the current one).
///
/// # Safety
///
/// `info` and `ctx` must be a running handler's arguments (`info` may be a
/// copy changed to say SIGBUS).
unsafe fn chain_sigbus(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    sent: bool,
) {
    let installed = matches!(sys::fault_signal_query(libc::SIGBUS), Ok(now) if now.is(on_sigbus));
    let prev = match (installed, PREVIOUS.get()) {
        (true, Some(prev)) => *prev,
        (true, None) => return,
        (false, _) => match sys::fault_signal_query(libc::SIGBUS) {
            Ok(now) => now,
            Err(_) => return sys::fault_signal_die(libc::SIGBUS),
        },
    };
    // SAFETY: the caller's contract.
    unsafe { sys::fault_signal_chain(&prev, sig, info, ctx, sent) };
    // A chained handler may reset SIGBUS to the default and return (Rust's
    // stack-overflow handler does, for an address outside a guard page).
    // After a fault that is the kernel's way to die on the access's retry;
    // die now instead, since the retry may succeed (another thread mapped
    // the page) and leave the process with no SIGBUS handler for
    // faultmap's faults, and a Protect mapping's retry raises SIGSEGV, not
    // SIGBUS. After a sent signal the process goes on: put faultmap's
    // handler back.
    match sys::fault_signal_query(libc::SIGBUS) {
        Ok(now) if !now.is(on_sigbus) && now.is_default_or_ignore() && !sent => {
            sys::fault_signal_die(libc::SIGBUS)
        }
        Ok(now) if !now.is(on_sigbus) && sent && installed => {
            let _ = sys::fault_signal_reinstall(libc::SIGBUS, on_sigbus);
        }
        _ => {}
    }
}

fn handle_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: `info` is the kernel's siginfo for this SA_SIGINFO handler.
    let fault = unsafe { sys::siginfo_fault(info) };
    // Only an access refused by a mapping's protection (SEGV_ACCERR) or
    // by a guard marker (SEGV_MAPERR); a sent SIGSEGV is never ours, nor
    // an address outside every Protect region (`resolve`).
    if let Some((addr, sys::SEGV_ACCERR | sys::SEGV_MAPERR)) = fault {
        // SAFETY: as in `handle_sigbus`.
        let write = unsafe { sys::fault_may_write(ctx) };
        match resolve(HostAddr(addr), write, Via::Protect) {
            Outcome::Resolved => return,
            Outcome::NotOurs => {}
            Outcome::Failed => {
                // The page cannot be read: the application gets SIGBUS at
                // the same address, as for a kernel file's failed page.
                // SAFETY: `info` is readable (above); the copy is ours.
                let mut bus = unsafe { *info };
                bus.si_signo = libc::SIGBUS;
                bus.si_code = libc::BUS_ADRERR;
                // SAFETY: `bus` is a siginfo changed to say SIGBUS; `ctx`
                // is this handler's.
                unsafe { chain_sigbus(libc::SIGBUS, &mut bus, ctx, false) };
                return;
            }
        }
    }
    let sent = !matches!(fault, Some((_, code)) if code > 0);
    let current = SEGV_CURRENT.load(Ordering::Acquire);
    let Some(prev) = PREVIOUS_SEGV.get(current).and_then(OnceLock::get) else {
        return;
    };
    let thread = chaining_slot();
    // Raised by the handler faultmap chained to, from inside it (Python's
    // faulthandler prints, restores what it replaced, which is faultmap's
    // handler again, and raises): the default action, once.
    if sent && thread.is_some_and(|t| t.depth.load(Ordering::Relaxed) > 0) {
        sys::fault_signal_die(libc::SIGSEGV);
        return;
    }
    if prev.is_default_or_ignore() && !sent {
        // The default action, exactly as without faultmap: put it back and
        // return; the access faults again and the kernel ends the process
        // with the very same SIGSEGV (and core dump).
        sys::fault_signal_default(libc::SIGSEGV);
        return;
    }
    if let Some(t) = thread {
        t.depth.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: the arguments are this handler's own.
    unsafe { sys::fault_signal_chain(prev, sig, info, ctx, sent) };
    if let Some(t) = thread {
        t.depth.fetch_sub(1, Ordering::Relaxed);
    }
    // As for SIGBUS: after a sent signal, put faultmap's handler back if
    // the chained one took itself out; after a fault, a handler that reset
    // the default and returned gets the access's retry, as it expects.
    if sent && matches!(sys::fault_signal_query(libc::SIGSEGV), Ok(now) if now.is_default()) {
        let _ = sys::fault_signal_reinstall(libc::SIGSEGV, on_sigsegv);
    }
}

/// A thread's record of the foreign SIGSEGVs faultmap chained: how deep it
/// is in chained handlers now.
struct Chaining {
    // std's atomics: a static (loom's are not const), no part of a model.
    tid: std::sync::atomic::AtomicU32,
    depth: std::sync::atomic::AtomicU32,
}

/// Threads that had a foreign SIGSEGV chained (a slot is taken for good: a
/// thread's first foreign SIGSEGV usually ends the process).
const CHAINING_THREADS: usize = 64;

static CHAINING: [Chaining; CHAINING_THREADS] = [const {
    Chaining {
        tid: std::sync::atomic::AtomicU32::new(0),
        depth: std::sync::atomic::AtomicU32::new(0),
    }
}; CHAINING_THREADS];

/// This thread's [`Chaining`] record, taken if it has none (`None`: every
/// slot is taken). Async-signal-safe: `gettid` and atomics.
fn chaining_slot() -> Option<&'static Chaining> {
    let tid = sys::gettid();
    if let Some(t) = CHAINING
        .iter()
        .find(|t| t.tid.load(Ordering::Relaxed) == tid)
    {
        return Some(t);
    }
    CHAINING.iter().find(|t| {
        t.tid
            .compare_exchange(0, tid, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    })
}

/// Counts a forwarded fault of `region`.
fn count_forwarded(pager: &crate::base::stats::Counters, region: &crate::mm::space::Region) {
    for counters in [pager, &region.counters, &region.object.counters] {
        counters.forwarded.fetch_add(1, Ordering::Relaxed);
    }
}

/// `RegionLookup::Classic` in the handler: the plain hit, under the table's
/// lock, as the kernel's fault took `mmap_lock` before SPF. Returns whether
/// the page is mapped (else the fault is forwarded).
///
/// A lock in a signal handler deadlocks if the interrupted code holds it.
/// Nothing does here: the table's lock (and, for the settled lock of a
/// fault with no region, the events gate's writer mutex and its SRCU
/// domain's) is held only inside faultmap's own calls (map, a mapping's
/// drop, option changes, eviction, invalidation), none of which touches a
/// mapping's memory, and this handler runs only on such a touch; async
/// signals are blocked while it runs. They are futex locks: no
/// allocation.
fn classic(
    table: &RegionTable,
    core: &Core,
    page_addr: HostAddr,
    retry: bool,
    write: bool,
) -> bool {
    let env = core.env();
    let lock = table.lock();
    let Some(region) = lock.lookup(page_addr) else {
        return false;
    };
    if let Fast::Mapped = fault::fast(&env, region, None, page_addr, retry, write) {
        return true;
    }
    count_forwarded(env.counters, region);
    false
}

/// Steps 1 to 3 of the module documentation, for an access at `addr`
/// that may be a write (`write`), raised as `via` says: a region of the
/// other engine's is not this signal's.
fn resolve(addr: HostAddr, write: bool, via: Via) -> Outcome {
    let Some(table) = RegionTable::get_if_ready() else {
        return match via {
            Via::Userfaultfd => guest(addr, write),
            Via::Protect => protect_child(addr, write),
        };
    };
    let ours = |core: &Core| (core.engine.protect().is_some()) == (via == Via::Protect);
    let page_addr = addr.page_down();
    let mut retry = false;
    let mut waited = false;
    loop {
        // The pager's request array, found inside the read section and used
        // after it: the pager's `Core` (which owns it) lives as long as any
        // mapping of it, and the application is touching one.
        let requests: *const Requests = match table.speculate(page_addr) {
            Speculated::Found(spec) => {
                let core: &Core = &spec.region.owner;
                let Some(requests) = core.requests().filter(|_| ours(core)) else {
                    return Outcome::NotOurs;
                };
                // A write to a read-only Protect mapping is the
                // application's own fault, as it would be to any
                // read-only mapping.
                if via == Via::Protect && write && !spec.region.writable && sys::FAULT_WRITE_KNOWN {
                    return Outcome::NotOurs;
                }
                let env = core.env();
                if !env.speculative {
                    let core: *const Core = core;
                    drop(spec);
                    // SAFETY: as for `requests` below: the Core outlives
                    // every access to its mappings.
                    let core = unsafe { &*core };
                    if classic(table, core, page_addr, retry, write) {
                        return Outcome::Resolved;
                    }
                    Arc::as_ptr(requests)
                } else {
                    if let Fast::Mapped =
                        fault::fast(&env, spec.region, Some(&spec), page_addr, retry, write)
                    {
                        return Outcome::Resolved;
                    }
                    count_forwarded(env.counters, spec.region);
                    Arc::as_ptr(requests)
                }
            }
            Speculated::Busy(region, _section) => {
                match region.owner.requests().filter(|_| ours(&region.owner)) {
                    Some(requests) => Arc::as_ptr(requests),
                    None => return Outcome::NotOurs,
                }
            }
            // No region here, yet. An mremap destination is ours before
            // its successor is published: the application's mremap
            // returns once a pager thread has *read* its REMAP event, and
            // that thread read it in a passage that lasts until it has
            // published the successor (`crate::mm::events`). So: while a
            // passage is in progress, wait for it (the settled lock);
            // then, or at once, look again (the passage may have ended
            // between the lookup and the look at it); still nothing: not
            // ours. A SIGBUS that is not faultmap's waits only while a
            // pager thread reads the userfaultfd.
            // A Protect mapping has no events to wait for.
            Speculated::None if via == Via::Protect => return protect_child(addr, write),
            Speculated::None if !waited => {
                if table.events_in_flight() {
                    drop(table.settled());
                }
                waited = true;
                continue;
            }
            Speculated::None => return guest(addr, write),
        };
        // SAFETY: see above: the Core that owns the requests outlives every
        // access to its mappings, this one included.
        let requests = unsafe { &*requests };
        match requests.forward(page_addr, retry, write) {
            Some(Reply::Mapped) | None => return Outcome::Resolved,
            Some(Reply::Retry) => retry = true,
            Some(Reply::Failed) if via == Via::Protect => return Outcome::Failed,
            Some(Reply::Failed) => return Outcome::NotOurs,
        }
    }
}

/// A fault on a range another process serves: one this process joined of
/// an unrelated owner's cache (`crate::mm::links`), or, in a forked child,
/// one it inherited. The owner resolves it (`crate::sys::share`), and the
/// access runs again, or gets SIGBUS (the page cannot be read, the owner
/// is gone, or the address is not a range the owner serves). Neither: not
/// ours.
fn guest(addr: HostAddr, write: bool) -> Outcome {
    let page_addr = addr.page_down().get();
    let mut retry = false;
    loop {
        match crate::mm::links::request(page_addr, write, retry) {
            // A grant is a Protect child's, never a userfaultfd guest's.
            None | Some(Answer::Failed | Answer::Grant(_)) => return Outcome::NotOurs,
            Some(Answer::Mapped) => return Outcome::Resolved,
            Some(Answer::Retry) => retry = true,
        }
    }
}

/// A fault in a forked child of a Protect owner, on a range it inherited
/// (`crate::sys::revoke`): the owner resolves it and answers with a
/// grant, which the child applies and the access runs again; a page that
/// cannot be had (or an owner that is gone) is SIGBUS. An address outside
/// those ranges, or a write to a read-only one, is not ours.
fn protect_child(addr: HostAddr, write: bool) -> Outcome {
    use crate::sys::revoke::Granted;
    use crate::sys::share;
    let Some((_, _, writable)) = share::child_range(addr.get()) else {
        // A range this process joined of an unrelated owner's cache.
        return match crate::mm::links::protect_fault(addr.get(), write, true) {
            None => Outcome::NotOurs,
            Some(true) => Outcome::Resolved,
            Some(false) => Outcome::Failed,
        };
    };
    if write && !writable && sys::FAULT_WRITE_KNOWN {
        return Outcome::NotOurs;
    }
    let page_addr = addr.page_down().get();
    let mut retry = false;
    // While this thread waits for its owner, it answers its owner's
    // revokes: the owner's fault path may be waiting for memory that only
    // a revoke of this child's pages frees. (The handler's mask, which
    // blocks SIGURG, comes back when it returns.)
    sys::signal_mask_one(libc::SIGURG, false);
    loop {
        match crate::mm::links::request(page_addr, write, retry) {
            None | Some(Answer::Failed) => return Outcome::Failed,
            Some(Answer::Mapped) => return Outcome::Resolved,
            Some(Answer::Retry) => retry = true,
            Some(Answer::Grant(grant)) => {
                return match share::apply_grant(&grant, addr.get()) {
                    // Stale: a newer record came first; the access faults
                    // again and asks anew.
                    Granted::Applied | Granted::Stale => Outcome::Resolved,
                    Granted::Failed(_) => Outcome::Failed,
                };
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::{wait_done, Reply, Requests};
    use crate::base::index::HostAddr;
    // std's Arc: `serve` takes one; its count is no part of the protocol.
    use loom::thread;
    use std::sync::Arc;

    /// A SIGBUS handler forwards two faults, one after the other, through
    /// the production slot protocol (`post`, `wait_done`, `finish`) over
    /// one slot, while a pager thread serves them (`serve`,
    /// `RequestRef::complete`): each request is served once, with the
    /// address and write flag it was posted with (the second flips the
    /// first's, so a reused slot never shows a stale one), the handler gets
    /// the reply the server
    /// gave it, and the slot is reused only once it is free again.
    #[test]
    fn loom_models_signal_slots() {
        loom::model(|| {
            let requests = Arc::new(Requests::new().expect("eventfd"));
            let r = requests.clone();
            let handler = thread::spawn(move || {
                for (addr, want) in [(4096, Reply::Mapped), (8192, Reply::Retry)] {
                    let write = addr == 4096;
                    let slot = loop {
                        // The slot is not free yet: the access faults again.
                        match r.post(HostAddr(addr), false, write) {
                            Some(slot) => break slot,
                            None => thread::yield_now(),
                        }
                    };
                    let reply = Requests::finish(slot, wait_done(slot));
                    assert_eq!(reply, want, "the reply to {addr:#x}");
                }
            });
            let mut served = Vec::new();
            while served.len() < 2 {
                requests.serve(|addr, req| {
                    let addr = addr.get();
                    assert_eq!(req.may_write(), addr == 4096, "the write flag of {addr:#x}");
                    served.push(addr);
                    req.complete(if addr == 4096 {
                        Reply::Mapped
                    } else {
                        Reply::Retry
                    });
                });
                thread::yield_now();
            }
            handler.join().unwrap();
            assert_eq!(served, [4096, 8192]);
        });
    }
}
