//! What a forked child gets over the parent's mappings.
//!
//! ## The problem
//!
//! A mapping is `MADV_DONTFORK` (`sys::dont_fork`): a child's inherited
//! copy would lose its userfaultfd registration (without
//! `UFFD_FEATURE_EVENT_FORK`, which needs `CAP_SYS_PTRACE`) and read every
//! page not yet cached as zeros, into the shared memfd. So in the child
//! the range is free address space, and a pointer the parent handed out
//! before the fork (a `&[u8]` of a [`crate::Mapping`], a Python
//! `memoryview` or numpy array over one) would read whatever the child
//! maps there next (glibc's malloc arenas, `mmap.mmap`, numpy's buffers),
//! and a write through it would corrupt that.
//!
//! ## The fix
//!
//! Every range faultmap maps and keeps out of children is listed in a
//! process-wide *registry*, with the memfd and offset it maps when it is a
//! mapping's. An at-fork child handler (`pthread_atfork`; it runs in the
//! child before `fork` returns there, though after child handlers
//! registered before faultmap's) goes through the list:
//!
//! - in a child of a process that serves guests (`sys::share`), each
//!   mapping's range is mapped again at its address from the inherited
//!   memfd and registered with the child's own userfaultfd, whose faults
//!   the parent serves: the pointer works in the child, with the same
//!   bytes (under the Protect engine the range is mapped `PROT_NONE`
//!   instead, and the parent grants its pages: `sys::revoke`);
//! - anything else (a range that could not be mapped again, or a child of
//!   a child) gets an inaccessible placeholder:
//!
//! ```text
//!   parent   |-- mapping A (DONTFORK) --|  malloc  |-- mapping B --|
//!   child    |== A again, served =======|  malloc  |== placeholder ==|
//!              mmap(addr, len, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|
//!                   MAP_NORESERVE|MAP_FIXED_NOREPLACE)
//! ```
//!
//! so a stale pointer faults (SIGSEGV: the range is mapped, not
//! accessible) instead of aliasing, and no `mmap` without `MAP_FIXED` can
//! land there. The placeholder costs address space only (`MAP_NORESERVE`,
//! never touched). It is not `DONTFORK`: a grandchild inherits it. Then
//! the handler forgets the parent's entries but the ranges it mapped
//! again, which stay listed without their memfd (DONTFORK in the child
//! too: the child's own children get placeholders there). A placeholder
//! stays for the child's life: the child's drop of a parent's `Mapping`
//! leaves everything of the parent's alone (see "fork" in
//! `api/pager.rs`); the child may `munmap` it, or map over it with
//! `MAP_FIXED`, itself.
//!
//! A range something else is already mapped at in the child (the parent's
//! own memory, inherited: a range the application unmapped or mapped over
//! whose event the pager has not handled yet) makes `MAP_FIXED_NOREPLACE`
//! fail with `EEXIST`: it is not mapped again, and the handler bisects the
//! range down to pages and reserves only its holes (`reserve_holes`):
//! `NOREPLACE` never replaces anything, so a stale entry is harmless.
//!
//! ## State and invariants
//!
//! - Listed: from just before `MADV_DONTFORK` is applied until the range is
//!   unmapped (`MappedRegion`'s drop), or given up to the application
//!   ([`crate::sys::MappedRegion::disown`]: it unmapped or moved it; what
//!   faultmap still owns of it is listed again by the successors that adopt
//!   the parts, at their addresses, since the kernel keeps `VM_DONTCOPY`
//!   through splits and `mremap`). So every `DONTFORK` range faultmap owns
//!   is listed while a pointer into it can be live. An entry is a value: a
//!   range listed twice (a successor that adopts a part in place) is two
//!   entries, each removed by its owner.
//! - The registry's lock is a futex word, never held across anything but a
//!   `Vec` push (within capacity), a search and a `swap_remove`: a writer
//!   neither allocates nor frees under it (`insert` grows the `Vec` outside
//!   the lock and swaps the buffers under it), so no allocator's lock, which
//!   an allocator's own at-fork handler may take first, is ever waited for
//!   under it.
//! - The *prepare* handler takes the lock; the *parent* handler and the
//!   *child* handler let it go. So in the child the list is consistent (no
//!   writer was half-way), and the parent's writers resume after the fork.
//!
//! ## Why the child handler is async-signal-safe
//!
//! The child has one thread, the one that forked, which holds the lock
//! (prepare took it). The handler reads the list in place, makes raw
//! system calls (`mmap`, not libc's wrapper: musl's takes a lock for
//! `MAP_FIXED`; `userfaultfd`, `ioctl`, `socketpair`, `sendmsg`, `close`:
//! `sys::share`) over stack buffers, shrinks the `Vec` in place without
//! freeing it (`retain` on a `Vec` of plain values only moves entries and
//! sets its length), stores a few atomics, and lets the lock go (an atomic swap, and a futex wake when a parent thread was
//! waiting: no one wakes in the child). It allocates nothing, takes no other
//! lock, and saves and restores `errno`.
//!
//! ## Registration, and its failure
//!
//! The three handlers are registered when the library is loaded (an ELF
//! constructor, like the fork counter in `sys`), before any mapping exists
//! and before any thread of the library's. If `pthread_atfork` fails
//! (`ENOMEM` at load), nothing is listed ([`children_reserved`] is false)
//! and a child sees the parent's ranges as free address space, as the
//! kernel leaves `DONTFORK` ranges: a stale pointer may then read the
//! child's memory.
//!
//! ## Known inaccuracies
//!
//! - Forks that run no at-fork handlers (`vfork`, `posix_spawn`, a raw
//!   `clone`, glibc's `_Fork`) get no placeholders. They exec or exit at
//!   once, as they must.
//! - A fork from a signal handler that interrupted this thread inside the
//!   registry's lock deadlocks in the prepare handler (as glibc's own
//!   at-fork locks do when the handler interrupts `malloc`).
//! - Out of memory or of `vm.max_map_count` in the child, a range may be
//!   left (in part) unreserved: counted in [`fork_reservations`].
//! - A part the application moved with `mremap` is listed at its new
//!   address only once its pager has read the REMAP event.
//! - Each fork costs a few system calls per listed range in the child
//!   (a placeholder: about 2.4 µs a mapping; a range mapped again and
//!   registered: an `mmap`, an `madvise` and an ioctl), and, in a child
//!   of a process that serves guests, a userfaultfd, a socket pair and a
//!   message per 64 ranges; forks that exec at once included.
//! - A pager thread that adopts or gives up a range (after an
//!   application's `munmap` or `mremap`) waits for the registry while a
//!   fork is under way. An at-fork prepare handler registered before
//!   faultmap's runs while the registry is held: if it touched a page of
//!   a faultmap mapping that such a pager thread would have to serve, the
//!   fork would deadlock. Prepare handlers that read mapped files are
//!   unheard of; this one is written down rather than engineered around.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use super::share::{self, RangeList, Share};
use super::{errno_get, errno_set, futex_wait, futex_wake, PAGE_SIZE};

/// A listed range, and what a child needs to map it again (`None`: a
/// placeholder only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    addr: usize,
    len: usize,
    share: Option<Share>,
    /// Mapped again in this process, a forked child, and served by its
    /// parent (`sys::share`).
    served: bool,
}

/// The registry's lock word.
const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
/// Locked, and a thread may sleep on the word: the unlock wakes one.
const CONTENDED: u32 = 2;

/// Marks an entry to keep, in the child handler (lengths are page
/// multiples, so the low bit is free).
const KEEP: usize = 1;

/// The capacity the list first grows to.
const FIRST_CAPACITY: usize = 16;

/// Every range of this process to reserve in a forked child.
struct Registry {
    lock: AtomicU32,
    /// Guarded by `lock`.
    ranges: UnsafeCell<Vec<Entry>>,
}

// SAFETY: `ranges` is reached only through a `Locked`, made only by
// `Registry::lock`, or by the at-fork child handler, which runs alone
// (one thread in the child) holding the lock its prepare handler took.
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry {
    lock: AtomicU32::new(UNLOCKED),
    ranges: UnsafeCell::new(Vec::new()),
};

/// Whether the at-fork handlers are registered (a child inherits it, and
/// the handlers).
static ARMED: AtomicBool = AtomicBool::new(false);

/// Ranges reserved in this process by the child handler of the fork that
/// made it, and ranges it left (in part) unreserved: counters for tests and
/// diagnosis (a child of a child counts its own fork only).
static RESERVED: AtomicUsize = AtomicUsize::new(0);
static UNRESERVED: AtomicUsize = AtomicUsize::new(0);

/// The registry's lock, held.
struct Locked(&'static Registry);

impl Registry {
    /// Takes the lock (a futex mutex: Drepper's "mutex3").
    fn lock(&'static self) -> Locked {
        self.acquire();
        Locked(self)
    }

    fn acquire(&self) {
        if self
            .lock
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        // Acquire: what the last holder wrote under the lock is seen.
        while self.lock.swap(CONTENDED, Ordering::Acquire) != UNLOCKED {
            futex_wait(&self.lock, CONTENDED, None);
        }
    }

    /// Lets the lock go. Async-signal-safe (an atomic, a futex wake).
    fn release(&self) {
        // Release: what was written under the lock is seen by the next
        // holder.
        if self.lock.swap(UNLOCKED, Ordering::Release) == CONTENDED {
            futex_wake(&self.lock, 1);
        }
    }
}

impl Locked {
    fn ranges(&mut self) -> &mut Vec<Entry> {
        // SAFETY: `self` holds the lock (made by `Registry::lock`), and
        // `&mut self` makes this the only reference through it.
        unsafe { &mut *self.0.ranges.get() }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Lists `[addr, addr + len)` to be reserved in every forked child, until
/// [`unlist`]; with `share`, to be mapped again there and served by this
/// process if it serves guests (`sys::share`). Returns whether it was
/// listed (false if the at-fork handlers could not be registered: nothing
/// would read the list).
pub(super) fn list(addr: usize, len: usize, share: Option<Share>) -> bool {
    if !ARMED.load(Ordering::Acquire) {
        return false;
    }
    let entry = Entry {
        addr,
        len,
        share,
        served: false,
    };
    // A bigger buffer, allocated (and the old one freed) outside the lock.
    let mut spare: Vec<Entry> = Vec::new();
    loop {
        let mut locked = REGISTRY.lock();
        let ranges = locked.ranges();
        if ranges.len() < ranges.capacity() {
            ranges.push(entry); // within capacity: no allocation
            return true;
        }
        if spare.capacity() > ranges.len() {
            // Within capacity too: `spare` is empty and holds one more.
            spare.extend_from_slice(ranges);
            spare.push(entry);
            std::mem::swap(ranges, &mut spare);
            // `locked` goes first (declared last), then the old buffer.
            return true;
        }
        let want = ranges.capacity().saturating_mul(2).max(FIRST_CAPACITY);
        drop(locked);
        spare = Vec::with_capacity(want);
    }
}

/// Takes one entry `[addr, addr + len)` off the list (one listed by
/// [`list`]; none if there is no such entry).
pub(super) fn unlist(addr: usize, len: usize) {
    let mut locked = REGISTRY.lock();
    let ranges = locked.ranges();
    // From the back: mappings often go in the reverse order of their making.
    if let Some(i) = ranges.iter().rposition(|r| (r.addr, r.len) == (addr, len)) {
        ranges.swap_remove(i); // frees nothing
    }
}

/// Whether `[addr, addr + len)` is covered by ranges this process (a
/// forked child) inherited and its parent serves (`sys::share`): one, or
/// several side by side (a mapping the parent split). Not for a signal
/// handler (it takes the registry's lock).
pub(crate) fn served(addr: usize, len: usize) -> bool {
    let mut locked = REGISTRY.lock();
    let ranges = locked.ranges();
    let end = addr.saturating_add(len);
    let mut at = addr;
    while at < end {
        match ranges
            .iter()
            .find(|e| e.served && e.addr <= at && at < e.addr + e.len)
        {
            Some(e) => at = e.addr + e.len,
            None => return false,
        }
    }
    true
}

/// Whether forked children get placeholders (the at-fork handlers are
/// registered).
pub fn children_reserved() -> bool {
    ARMED.load(Ordering::Acquire)
}

/// `(reserved, unreserved)`: how many listed ranges the fork that made
/// this process reserved whole, and how many it left (in part) unreserved
/// for lack of memory or of map count. `(0, 0)` in a process not made by
/// `fork`.
pub fn fork_reservations() -> (usize, usize) {
    (
        RESERVED.load(Ordering::Relaxed),
        UNRESERVED.load(Ordering::Relaxed),
    )
}

/// At-fork prepare handler: no writer is half-way through the list while
/// the address space is copied.
extern "C" fn prepare() {
    REGISTRY.acquire();
}

/// At-fork parent handler (also after a failed `fork`).
extern "C" fn parent() {
    REGISTRY.release();
}

/// At-fork child handler: a placeholder over every listed range, then the
/// parent's entries forgotten. Async-signal-safe (see the module's
/// documentation).
extern "C" fn child() {
    let errno = errno_get();
    // SAFETY: `prepare` took the lock on this thread before the fork, and
    // the child has no other thread: nothing else reaches the list until
    // the release below.
    let ranges = unsafe { &mut *REGISTRY.ranges.get() };
    let (mut reserved, mut unreserved) = (0, 0);
    // A child of an owner maps its shared ranges again and is served by
    // the owner (`sys::share`); anything else gets a placeholder.
    let guest = share::start_child();
    let mut sent = guest.as_ref().map(|g| RangeList::new(g.channel));
    let mut shared = 0;
    for entry in ranges.iter_mut() {
        let share = entry.share.take();
        if let (Some(g), Some(s), Some(list)) = (&guest, share, sent.as_mut()) {
            if share::map_in_child(g.uffd, g.protect(), entry.addr, entry.len, s).is_ok() {
                list.push(s.id, entry.addr, entry.len);
                shared += 1;
                // Kept (a placeholder in this child's children: the range
                // is DONTFORK here too); every other entry goes.
                entry.len |= KEEP;
                entry.served = true;
                continue;
            }
        }
        if reserve_holes(entry.addr, entry.len) {
            reserved += 1;
        } else {
            unreserved += 1;
        }
    }
    if let (Some(g), Some(mut list)) = (guest, sent) {
        let (uffd, channel) = (g.uffd, g.channel);
        list.flush();
        // The greeting last: its mailbox and alive pages are mapped now,
        // where the ranges mapped again (and the placeholders) are not.
        let greeted = shared > 0 && g.send();
        if shared == 0 {
            share::abandon(uffd, channel);
        } else if list.failed || !greeted {
            // The owner is gone before it heard of them. The ranges stay
            // registered (the userfaultfd stays open), so they never read
            // as zeros: their SIGBUS finds no owner and is the
            // application's.
            share::abandon_channel(channel);
        } else {
            share::become_guest(uffd, channel);
        }
    }
    // The list is the parent's: this child's own mappings are listed from
    // scratch. The ranges it mapped again stay listed, without their share
    // (its children get placeholders there). `retain` on a `Vec` of plain
    // values moves and shrinks in place: no allocation, no free.
    ranges.retain(|e| e.len & KEEP != 0);
    for entry in ranges.iter_mut() {
        entry.len &= !KEEP;
    }
    RESERVED.store(reserved, Ordering::Relaxed);
    UNRESERVED.store(unreserved, Ordering::Relaxed);
    REGISTRY.release();
    errno_set(errno);
}

/// Maps an inaccessible placeholder over every part of `[addr, addr+len)`
/// that nothing is mapped at: the whole range at once, else (`EEXIST`:
/// something is mapped in it) nothing if it is mapped whole (`msync`
/// finds no hole: one call, so a range inherited whole costs two), else
/// each half, down to single pages. Returns false if a hole was left for
/// another reason (out of memory or of map count). No allocation;
/// recursion depth at most log2 of the pages; calls about the number of
/// boundaries times that depth.
fn reserve_holes(addr: usize, len: usize) -> bool {
    match mmap_placeholder(addr, len) {
        Ok(()) => true,
        Err(libc::EEXIST) if !has_hole(addr, len) => true,
        Err(libc::EEXIST) if len > PAGE_SIZE => {
            // At least a page, so that both halves shrink.
            let half = (len / PAGE_SIZE / 2).max(1) * PAGE_SIZE;
            let first = reserve_holes(addr, half);
            reserve_holes(addr + half, len - half) && first
        }
        // One page, mapped already: not a hole.
        Err(libc::EEXIST) => true,
        Err(_) => false,
    }
}

/// Whether `[addr, addr + len)` has a part nothing is mapped at:
/// `msync(MS_ASYNC)` fails with `ENOMEM` exactly then, and otherwise does
/// nothing (since Linux 2.6.19 `MS_ASYNC` starts no write-back). A raw
/// system call: async-signal-safe.
fn has_hole(addr: usize, len: usize) -> bool {
    // SAFETY: msync reads no memory of ours and changes no mapping; on a
    // range with a hole it fails with ENOMEM.
    let rc = unsafe { libc::syscall(libc::SYS_msync, addr, len, libc::MS_ASYNC) };
    rc != 0 && errno_get() == libc::ENOMEM
}

/// `mmap(addr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
/// MAP_FIXED_NOREPLACE)` as a raw system call; the error is the errno.
/// Async-signal-safe.
fn mmap_placeholder(addr: usize, len: usize) -> Result<(), i32> {
    // SAFETY: an anonymous mapping with MAP_FIXED_NOREPLACE never replaces
    // a mapping (it fails with EEXIST instead): it takes free address space
    // only. No memory of ours is passed.
    let got = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1 as libc::c_int,
            0 as libc::off_t,
        )
    };
    if got == -1 {
        return Err(errno_get());
    }
    if got as usize != addr {
        // A kernel older than 4.17 takes NOREPLACE for a hint and maps
        // elsewhere when the range is taken: undo, and call it taken.
        // SAFETY: the range the kernel just mapped for us; nothing else
        // knows it.
        unsafe { libc::syscall(libc::SYS_munmap, got, len) };
        return Err(libc::EEXIST);
    }
    Ok(())
}

/// Registers the three handlers when the library is loaded (an ELF
/// constructor): before any mapping exists and before any thread of the
/// library's, so no fork can come half-way.
extern "C" fn arm() {
    if super::at_fork(prepare, parent, child).is_ok() {
        ARMED.store(true, Ordering::Release);
    }
}

#[used]
#[link_section = ".init_array"]
static ARM: extern "C" fn() = arm;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sys::true_in_fork_child;

    /// Whether anything is mapped at `[addr, addr + len)` in this process.
    fn anything_at(addr: usize, len: usize) -> bool {
        match mmap_placeholder(addr, len) {
            Ok(()) => {
                // SAFETY: the placeholder just made, which nothing uses.
                unsafe { libc::munmap(addr as *mut libc::c_void, len) };
                false
            }
            Err(_) => true,
        }
    }

    /// A fresh anonymous, DONTFORK range of `pages` pages.
    fn dontfork_range(pages: usize) -> (usize, usize) {
        let len = pages * PAGE_SIZE;
        // SAFETY: an anonymous mapping at the kernel's choice of address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the range just mapped.
        assert_eq!(unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) }, 0);
        (p as usize, len)
    }

    #[test]
    fn a_listed_range_is_reserved_in_a_child_and_an_unlisted_one_is_not() {
        assert!(children_reserved(), "the ELF constructor registered them");
        let (listed, len) = dontfork_range(8);
        let (unlisted, _) = dontfork_range(8);
        assert!(list(listed, len, None));
        assert!(true_in_fork_child(|| {
            anything_at(listed, len)
                && !anything_at(unlisted, len)
                && fork_reservations().0 >= 1
                && fork_reservations().1 == 0
        }));
        unlist(listed, len);
        assert!(true_in_fork_child(|| !anything_at(listed, len)));
        // SAFETY: the test's own ranges.
        unsafe {
            libc::munmap(listed as *mut libc::c_void, len);
            libc::munmap(unlisted as *mut libc::c_void, len);
        }
    }

    #[test]
    fn the_holes_around_inherited_memory_are_reserved() {
        // Pages 2 and 5 of a listed range are not DONTFORK: the child
        // inherits them (and their bytes); the rest is reserved around them.
        let (addr, len) = dontfork_range(8);
        for page in [2, 5] {
            let at = (addr + page * PAGE_SIZE) as *mut libc::c_void;
            // SAFETY: part of the test's own range.
            let rc = unsafe { libc::madvise(at, PAGE_SIZE, libc::MADV_DOFORK) };
            assert_eq!(rc, 0);
        }
        assert!(list(addr, len, None));
        assert!(true_in_fork_child(|| {
            (0..8).all(|p| anything_at(addr + p * PAGE_SIZE, PAGE_SIZE))
                && fork_reservations().1 == 0
        }));
        unlist(addr, len);
        // SAFETY: the test's own range.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    }

    #[test]
    fn the_list_grows_outside_its_lock_and_keeps_every_entry() {
        // Far above anything mapped here (a child of a concurrent test
        // reserves these: harmless).
        let base = 1usize << 45;
        let n = 3 * FIRST_CAPACITY + 1;
        for i in 0..n {
            assert!(list(base + i * PAGE_SIZE, PAGE_SIZE, None));
        }
        let count = |locked: &mut Locked| {
            locked
                .ranges()
                .iter()
                .filter(|e| e.addr >= base && e.addr < base + n * PAGE_SIZE)
                .count()
        };
        assert_eq!(count(&mut REGISTRY.lock()), n);
        for i in 0..n {
            unlist(base + i * PAGE_SIZE, PAGE_SIZE);
        }
        assert_eq!(count(&mut REGISTRY.lock()), 0);
    }
}
