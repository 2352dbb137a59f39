//! Signal delivery and the application's own SIGBUS: faultmap's process-wide
//! handler must serve faultmap's faults and pass every other SIGBUS on to
//! the disposition installed before it, as if faultmap were not there.
//!
//! A test that installs a SIGBUS disposition, or whose expected outcome is
//! a death by SIGBUS, runs as a child process (`common::run_child`): the
//! disposition is process-wide, and faultmap's handler is installed once,
//! by the first signal-delivery pager of the process. The parent asserts
//! how the child ended and that it printed [`OK`] (or [`BEFORE`], for a
//! child expected to die).
//!
//! The application's handler used here records the signal, and, for a
//! fault, maps an anonymous page over the faulting page and returns: the
//! access runs again and reads zeros.

mod common;
use common::MapTrusted;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use faultmap::{Config, Delivery, MapOptions, Mapping, MemStore, Pager};

/// What a child prints once everything it checks held.
const OK: &str = "CHILD: all checks held";
/// What a child expected to die prints right before the fatal access.
const BEFORE: &str = "CHILD: touching the page that must raise SIGBUS";

fn pager(delivery: Delivery) -> Pager {
    Pager::new(Config::default().delivery(delivery))
        .unwrap_or_else(|e| panic!("Pager::new({delivery:?}): {e}"))
}

// ---------------------------------------------------------------------------
// The application's handler, and dispositions.
// ---------------------------------------------------------------------------

/// How many times the application's handler ran.
static CALLS: AtomicUsize = AtomicUsize::new(0);
/// The last `si_addr` it saw.
static ADDR: AtomicUsize = AtomicUsize::new(0);
/// The last `si_code` it saw.
static CODE: AtomicI32 = AtomicI32::new(i32::MIN);
/// The last `si_pid` of a sent signal it saw.
static PID: AtomicI32 = AtomicI32::new(0);

/// The application's `SA_SIGINFO` handler: records the signal; for a fault
/// (`si_code > 0`), maps a zero page over the faulting page so that the
/// access succeeds when it runs again. Async-signal-safe: atomics and mmap.
extern "C" fn app_handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel's (or faultmap's chained) siginfo for SIGBUS,
    // readable for the handler's duration.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    CODE.store(code, Ordering::SeqCst);
    if code <= 0 {
        // SAFETY: a sent signal's siginfo carries the sender's pid.
        PID.store(unsafe { (*info).si_pid() }, Ordering::SeqCst);
    } else {
        ADDR.store(addr, Ordering::SeqCst);
        // SAFETY: replaces the one page that faulted with anonymous memory;
        // the test owns that page's mapping and reads it as zeros after.
        unsafe {
            libc::mmap(
                (addr & !(PAGE - 1)) as *mut libc::c_void,
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
        }
    }
    CALLS.fetch_add(1, Ordering::SeqCst);
}

/// A plain (not `SA_SIGINFO`) handler: counts.
static PLAIN_CALLS: AtomicUsize = AtomicUsize::new(0);
extern "C" fn plain_handler(_sig: libc::c_int) {
    PLAIN_CALLS.fetch_add(1, Ordering::SeqCst);
}

/// Sets SIGBUS's disposition to `handler` (an address, `SIG_DFL` or
/// `SIG_IGN`) with `flags`.
fn set_sigbus(handler: libc::sighandler_t, flags: libc::c_int) {
    // SAFETY: an all-zero sigaction is valid (empty mask), filled in; the
    // handler, if a function, has the signature `flags` says.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = flags;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
}

fn install_app_handler() {
    set_sigbus(app_handler as *const () as usize, libc::SA_SIGINFO);
}

/// SIGBUS's current handler.
fn sigbus_handler() -> libc::sighandler_t {
    // SAFETY: queries only; `old` is a live struct.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old), 0);
        old.sa_sigaction
    }
}

/// Creates a signal-delivery pager and checks that faultmap's handler
/// replaced `before` (else these tests would test nothing).
fn signal_pager_replacing(before: libc::sighandler_t) -> Pager {
    let pager = pager(Delivery::Signal);
    let now = sigbus_handler();
    assert_ne!(now, before, "faultmap did not install its SIGBUS handler");
    assert_ne!(now, libc::SIG_DFL);
    pager
}

/// A mapping of a fresh object of `pages` pages, read whole and checked.
fn mapped_and_checked(pager: &Pager, pages: usize, seed: u64, what: &str) -> (Mapping, Vec<u8>) {
    let data = pattern(pages * PAGE - 10, seed);
    let map = pager
        .map_trusted(
            MemStore::new("sig", data.clone()),
            MapOptions::new().fault_around_order(2),
        )
        .unwrap();
    assert_bytes(&map, &data, what);
    (map, data)
}

/// A kernel mapping of two pages of a file, then the file truncated to 0:
/// returns the file (keep it) and the mapping's address. Touching either
/// page is SIGBUS (`BUS_ADRERR`) from the kernel, nothing to do with
/// faultmap.
fn truncated_file_mapping() -> (TestFile, usize) {
    let file = TestFile::new(2 * PAGE, 9100);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file.path)
        .unwrap();
    // SAFETY: a new shared read-only mapping of a file we own; nothing else
    // uses the range. It is never unmapped (the child exits).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * PAGE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let p = p as usize;
    // SAFETY: inside the mapping, and the file is still long enough.
    let first = unsafe { std::ptr::read_volatile(p as *const u8) };
    assert_eq!(first, file.data[0]);
    f.set_len(0).unwrap();
    (file, p)
}

/// Reads one byte at `addr`.
///
/// # Safety
///
/// `addr` must be mapped readable, or its fault handled by a SIGBUS handler
/// that makes it so.
unsafe fn read_at(addr: usize) -> u8 {
    // SAFETY: the caller's.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

/// Runs test `name` as a child and asserts it printed [`OK`] and exited 0.
#[track_caller]
fn assert_child_ok(name: &str) {
    let end = run_child(name, Duration::from_secs(20));
    let what = format!(
        "child {name}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        end.status, end.stdout, end.stderr
    );
    assert!(end.status.is_some(), "hung, killed; {what}");
    assert!(
        end.stdout.contains(OK),
        "the child's checks did not all hold; {what}"
    );
    assert!(end.status.unwrap().success(), "{what}");
}

/// Runs test `name` as a child and asserts it died of SIGBUS right after
/// printing [`BEFORE`].
#[track_caller]
fn assert_child_dies_of_sigbus(name: &str) {
    let end = run_child(name, Duration::from_secs(20));
    let what = format!(
        "child {name}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        end.status, end.stdout, end.stderr
    );
    assert!(end.status.is_some(), "hung, killed; {what}");
    assert!(
        end.stdout.contains(BEFORE),
        "the child did not get to the access; {what}"
    );
    assert!(!end.stdout.contains(OK), "the access did not fault; {what}");
    assert_eq!(
        end.signal(),
        Some(SIGBUS),
        "expected death by SIGBUS; {what}"
    );
}

// ---------------------------------------------------------------------------
// (a), (b): a SIGBUS that is not faultmap's.
// ---------------------------------------------------------------------------

#[test]
fn an_app_handler_installed_first_gets_the_sigbus_of_a_truncated_file() {
    const NAME: &str = "an_app_handler_installed_first_gets_the_sigbus_of_a_truncated_file";
    if is_child(NAME) {
        install_app_handler();
        let pager = signal_pager_replacing(app_handler as *const () as usize);
        let (before, data) = mapped_and_checked(&pager, 32, 9000, "before");
        let (_file, p) = truncated_file_mapping();
        let target = p + PAGE + 123;
        // SAFETY: the app's handler maps the page when the access faults.
        let v = unsafe { read_at(target) };
        assert_eq!(
            CALLS.load(Ordering::SeqCst),
            1,
            "the app's handler did not run once"
        );
        assert_eq!(ADDR.load(Ordering::SeqCst), target, "si_addr");
        assert_eq!(CODE.load(Ordering::SeqCst), libc::BUS_ADRERR, "si_code");
        assert_eq!(v, 0, "the page the handler mapped reads as zeros");
        // faultmap goes on working: the old mapping (dropped and read
        // again), a new one, a fault served after the foreign SIGBUS.
        assert_eq!(before.invalidate(0..before.len()).unwrap(), 32);
        assert_bytes(&before, &data, "after, re-read");
        mapped_and_checked(&pager, 16, 9001, "after, new mapping");
        assert_eq!(
            CALLS.load(Ordering::SeqCst),
            1,
            "faultmap's faults reached the app"
        );
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_ok(NAME));
}

#[test]
fn without_an_app_handler_a_truncated_file_kills_by_sigbus() {
    const NAME: &str = "without_an_app_handler_a_truncated_file_kills_by_sigbus";
    if is_child(NAME) {
        let pager = signal_pager_replacing(libc::SIG_DFL);
        let _map = mapped_and_checked(&pager, 8, 9002, "before");
        let (_file, p) = truncated_file_mapping();
        println!("{BEFORE}");
        // SAFETY: faults: SIGBUS, the default action ends the process.
        let v = unsafe { read_at(p + PAGE) };
        println!("CHILD: read {v} from a truncated file's page: no SIGBUS");
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_dies_of_sigbus(NAME));
}

// ---------------------------------------------------------------------------
// (c): signal masks.
// ---------------------------------------------------------------------------

/// Blocks every signal but SIGBUS and SIGSEGV in the calling thread (and,
/// with `sigbus_too`, SIGBUS as well); checks the mask took.
fn block_signals(sigbus_too: bool) {
    // SAFETY: sigset operations on sets we own; pthread_sigmask changes
    // only the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        if !sigbus_too {
            libc::sigdelset(&mut set, libc::SIGBUS);
        }
        libc::sigdelset(&mut set, libc::SIGSEGV);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()),
            0
        );
        let mut now: libc::sigset_t = std::mem::zeroed();
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut now),
            0
        );
        assert_eq!(libc::sigismember(&now, libc::SIGUSR1), 1);
        assert_eq!(libc::sigismember(&now, libc::SIGBUS), i32::from(sigbus_too));
    }
}

#[test]
fn a_thread_that_blocks_every_other_signal_is_served() {
    watchdog(WATCHDOG, || {
        let pager = Arc::new(pager(Delivery::Signal));
        let data = Arc::new(pattern(300 * PAGE + 7, 9010));
        let object = pager.open(MemStore::new("masked", data.to_vec())).unwrap();
        let reader = {
            let (pager, object, data) = (pager.clone(), object.clone(), data.clone());
            std::thread::spawn(move || {
                block_signals(false);
                // Misses (forwarded), hits (in the handler), random order,
                // and a read that waits for another's read.
                for order in [0u8, 4] {
                    let map = pager
                        .map_trusted(&object, MapOptions::new().fault_around_order(order))
                        .unwrap();
                    for p in (0..301).rev().step_by(7) {
                        let r = page_range(&map, p);
                        assert_bytes(&map[r.clone()], &data[r], &format!("page {p}"));
                    }
                    assert_bytes(&map, &data, &format!("order {order}"));
                }
            })
        };
        reader.join().expect("the masked thread failed");
        let s = pager.stats();
        assert!(s.forwarded > 0 && s.spf_success > 0, "{s:?}");
    });
}

#[test]
fn a_thread_that_blocks_sigbus_dies_of_it_rather_than_hang() {
    // README: "SIGBUS must not be blocked in a thread that touches a
    // mapping": the kernel forces a fault's SIGBUS, so the process dies,
    // as with any blocked SIGBUS fault; it must not hang.
    const NAME: &str = "a_thread_that_blocks_sigbus_dies_of_it_rather_than_hang";
    if is_child(NAME) {
        let pager = pager(Delivery::Signal);
        let data = pattern(8 * PAGE, 9011);
        let map = pager
            .map_trusted(MemStore::new("blocked", data), MapOptions::new())
            .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                block_signals(true);
                println!("{BEFORE}");
                let v = touch(&map, 3);
                println!("CHILD: read {v} with SIGBUS blocked");
            });
        });
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_dies_of_sigbus(NAME));
}

// ---------------------------------------------------------------------------
// (d): a failed store read.
// ---------------------------------------------------------------------------

#[test]
fn a_failed_read_reaches_the_app_handler_with_the_faulting_address() {
    const NAME: &str = "a_failed_read_reaches_the_app_handler_with_the_faulting_address";
    if is_child(NAME) {
        install_app_handler();
        let pager = signal_pager_replacing(app_handler as *const () as usize);
        let data = pattern(16 * PAGE, 9020);
        let store = Instrumented::mem(&data, Faults::bad([5]));
        let map = pager
            .map_trusted(store.clone(), MapOptions::new().fault_around_order(0))
            .unwrap();
        for p in [0, 4, 6, 15] {
            let r = page_range(&map, p);
            assert_bytes(&map[r.clone()], &data[r], &format!("good page {p}"));
        }
        assert_eq!(CALLS.load(Ordering::SeqCst), 0);
        let offset = 5 * PAGE + 77;
        let target = map.as_ptr() as usize + offset;
        let v = read_byte(&map, offset);
        assert_eq!(
            CALLS.load(Ordering::SeqCst),
            1,
            "the app's handler did not run once"
        );
        let got = ADDR.load(Ordering::SeqCst);
        let inside = (map.as_ptr() as usize..map.as_ptr() as usize + map.len()).contains(&got);
        assert!(inside, "si_addr {got:#x} is not inside the mapping");
        assert_eq!(
            got & !(PAGE - 1),
            target & !(PAGE - 1),
            "si_addr is not in page 5"
        );
        if got != target {
            println!("CHILD: si_addr {got:#x} is page 5 but not the byte {target:#x}");
        }
        assert!(CODE.load(Ordering::SeqCst) > 0, "si_code of a fault");
        assert_eq!(v, 0, "the page the handler mapped reads as zeros");
        // Every other page still reads right, and a new mapping works.
        for p in (0..16).filter(|&p| p != 5) {
            let r = page_range(&map, p);
            assert_bytes(&map[r.clone()], &data[r], &format!("page {p} after"));
        }
        mapped_and_checked(&pager, 8, 9021, "new mapping after");
        assert_eq!(CALLS.load(Ordering::SeqCst), 1);
        let s = map.stats();
        assert!(s.io_errors > 0, "{s:?}");
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_ok(NAME));
}

#[test]
fn a_failed_read_without_an_app_handler_kills_by_sigbus() {
    const NAME: &str = "a_failed_read_without_an_app_handler_kills_by_sigbus";
    if is_child(NAME) {
        let pager = signal_pager_replacing(libc::SIG_DFL);
        let data = pattern(16 * PAGE, 9022);
        let map = pager
            .map_trusted(
                Instrumented::mem(&data, Faults::bad([5])),
                MapOptions::new().fault_around_order(3),
            )
            .unwrap();
        assert_eq!(touch(&map, 4), data[4 * PAGE]);
        println!("{BEFORE}");
        let v = touch(&map, 5);
        println!("CHILD: the bad page read as {v:#04x}: no SIGBUS");
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_dies_of_sigbus(NAME));
}

// ---------------------------------------------------------------------------
// (e): both deliveries in one process; a sent SIGBUS.
// ---------------------------------------------------------------------------

#[test]
fn handler_and_signal_pagers_work_side_by_side() {
    watchdog(WATCHDOG, || {
        let signal = Arc::new(pager(Delivery::Signal));
        let handler = Arc::new(pager(Delivery::Handler));
        let data = Arc::new(pattern(512 * PAGE + 99, 9030));
        // One object both pagers map, and one each of their own.
        let shared = signal.open(MemStore::new("shared", data.to_vec())).unwrap();
        let threads: Vec<_> = [signal.clone(), handler.clone()]
            .into_iter()
            .enumerate()
            .map(|(i, pager)| {
                let (shared, data) = (shared.clone(), data.clone());
                std::thread::spawn(move || {
                    let own = pager
                        .map_trusted(MemStore::new("own", data.to_vec()), MapOptions::new())
                        .unwrap();
                    let both = pager
                        .map_trusted(&shared, MapOptions::new().fault_around_order(3 * i as u8))
                        .unwrap();
                    for p in (0..513).step_by(5 + i) {
                        let r = page_range(&both, p);
                        assert_bytes(&both[r.clone()], &data[r], &format!("pager {i}, page {p}"));
                    }
                    assert_bytes(&own, &data, &format!("pager {i}, own object"));
                    assert_bytes(&both, &data, &format!("pager {i}, shared object"));
                    both
                })
            })
            .collect();
        let maps: Vec<Mapping> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        // Dropped from both pagers' mappings at once, then read again.
        assert_eq!(shared.invalidate(0..data.len() as u64).unwrap(), 513);
        for (i, m) in maps.iter().enumerate() {
            assert_bytes(m, &data, &format!("pager {i}, after invalidate"));
        }
        let (s, h) = (signal.stats(), handler.stats());
        assert!(s.forwarded > 0, "signal pager: {s:?}");
        assert_eq!(h.forwarded, 0, "handler pager: {h:?}");
        assert!(s.pgfault > 0 && h.pgfault > 0, "{s:?} {h:?}");
    });
}

#[test]
fn a_sent_sigbus_reaches_the_app_handler() {
    const NAME: &str = "a_sent_sigbus_reaches_the_app_handler";
    if is_child(NAME) {
        install_app_handler();
        let signal = signal_pager_replacing(app_handler as *const () as usize);
        let handler = pager(Delivery::Handler);
        let (a, da) = mapped_and_checked(&signal, 16, 9040, "signal pager");
        let (b, db) = mapped_and_checked(&handler, 16, 9041, "handler pager");
        // SAFETY: getpid and kill have no memory effects here.
        let me = unsafe { libc::getpid() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(me, libc::SIGBUS) }, 0);
        // Delivered to some thread of the process, maybe not this one.
        assert!(
            wait_until(Duration::from_secs(5), || CALLS.load(Ordering::SeqCst) == 1),
            "kill(getpid(), SIGBUS) never reached the app's handler"
        );
        assert_eq!(CODE.load(Ordering::SeqCst), libc::SI_USER, "si_code");
        assert_eq!(PID.load(Ordering::SeqCst), me, "si_pid");
        // raise() is delivered to this thread before it returns.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::raise(libc::SIGBUS) }, 0);
        assert_eq!(
            CALLS.load(Ordering::SeqCst),
            2,
            "raise(SIGBUS) did not reach it"
        );
        assert_eq!(
            CODE.load(Ordering::SeqCst),
            libc::SI_TKILL,
            "si_code of raise"
        );
        // Both pagers still serve faults, and theirs never reach the app.
        for (m, d) in [(&a, &da), (&b, &db)] {
            m.invalidate(0..m.len()).unwrap();
            assert_bytes(m, d, "after the sent signals");
        }
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_ok(NAME));
}

#[test]
fn a_failed_read_of_a_handler_delivery_pager_reaches_the_app_handler() {
    // With a signal-delivery pager in the process (so faultmap's handler is
    // installed), a handler-delivery pager's failed read (UFFDIO_POISON:
    // the kernel's SIGBUS) is not faultmap's to resolve: it goes on to the
    // app's handler.
    const NAME: &str = "a_failed_read_of_a_handler_delivery_pager_reaches_the_app_handler";
    if is_child(NAME) {
        install_app_handler();
        let _signal = signal_pager_replacing(app_handler as *const () as usize);
        let handler = pager(Delivery::Handler);
        let data = pattern(8 * PAGE, 9042);
        let map = handler
            .map_trusted(
                Instrumented::mem(&data, Faults::bad([2])),
                MapOptions::new().fault_around_order(0),
            )
            .unwrap();
        assert_eq!(touch(&map, 1), data[PAGE]);
        let target = map.as_ptr() as usize + 2 * PAGE + 5;
        let v = read_byte(&map, 2 * PAGE + 5);
        assert_eq!(
            CALLS.load(Ordering::SeqCst),
            1,
            "the app's handler did not run once"
        );
        assert_eq!(
            ADDR.load(Ordering::SeqCst) & !(PAGE - 1),
            target & !(PAGE - 1)
        );
        assert!(CODE.load(Ordering::SeqCst) > 0, "si_code of a fault");
        assert_eq!(v, 0);
        assert_eq!(touch(&map, 3), data[3 * PAGE]);
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_ok(NAME));
}

#[test]
fn a_sent_sigbus_is_ignored_when_the_app_ignores_sigbus() {
    // Without faultmap, a sent SIGBUS whose disposition is SIG_IGN is
    // discarded. "As if faultmap were not there" (signal.rs, step 4): the
    // process must live on.
    const NAME: &str = "a_sent_sigbus_is_ignored_when_the_app_ignores_sigbus";
    if is_child(NAME) {
        set_sigbus(libc::SIG_IGN, 0);
        let pager = signal_pager_replacing(libc::SIG_IGN);
        let (map, data) = mapped_and_checked(&pager, 8, 9050, "before");
        println!("CHILD: raising SIGBUS");
        // SAFETY: raise has no memory effects here; the signal is delivered
        // to this thread before it returns.
        assert_eq!(unsafe { libc::raise(libc::SIGBUS) }, 0);
        map.invalidate(0..map.len()).unwrap();
        assert_bytes(&map, &data, "after");
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_ok(NAME));
}

#[test]
fn a_plain_app_handler_installed_first_gets_a_sent_sigbus() {
    const NAME: &str = "a_plain_app_handler_installed_first_gets_a_sent_sigbus";
    if is_child(NAME) {
        set_sigbus(plain_handler as *const () as usize, 0);
        let pager = signal_pager_replacing(plain_handler as *const () as usize);
        let (map, data) = mapped_and_checked(&pager, 8, 9060, "before");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::raise(libc::SIGBUS) }, 0);
        assert_eq!(PLAIN_CALLS.load(Ordering::SeqCst), 1);
        map.invalidate(0..map.len()).unwrap();
        assert_bytes(&map, &data, "after");
        assert_eq!(PLAIN_CALLS.load(Ordering::SeqCst), 1);
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_ok(NAME));
}

#[test]
fn a_stray_sent_sigbus_does_not_turn_faultmap_off() {
    // A Rust program's SIGBUS disposition before faultmap's is std's
    // stack-overflow handler, which, for any SIGBUS that is not a guard-page
    // hit, resets SIGBUS to SIG_DFL and returns. Without faultmap, a sent
    // SIGBUS (`kill -BUS`) therefore leaves the process running. With
    // faultmap it must too, and faultmap's faults must still be served
    // afterwards.
    const NAME: &str = "a_stray_sent_sigbus_does_not_turn_faultmap_off";
    if is_child(NAME) {
        let before = sigbus_handler();
        let pager = signal_pager_replacing(before);
        let (_map, _) = mapped_and_checked(&pager, 8, 9070, "before");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::raise(libc::SIGBUS) }, 0);
        println!("CHILD: survived raise(SIGBUS)");
        let after = sigbus_handler();
        println!(
            "CHILD: SIGBUS handler before faultmap {before:#x}, now {after:#x}{}",
            if after == libc::SIG_DFL {
                " (SIG_DFL)"
            } else {
                ""
            }
        );
        println!("CHILD: faulting after the sent SIGBUS");
        mapped_and_checked(&pager, 8, 9071, "a new mapping after the sent SIGBUS");
        println!("{OK}");
        return;
    }
    watchdog(WATCHDOG, || assert_child_ok(NAME));
}

/// A forked child that creates its own pager gets correct bytes: it does not
/// inherit the parent's regions (the region table starts empty after fork),
/// even where its new mapping lands on the range the parent's used.
#[test]
fn a_forked_child_uses_a_pager_of_its_own() {
    const NAME: &str = "a_forked_child_uses_a_pager_of_its_own";
    if is_child(NAME) {
        let parent = pager(Delivery::Signal);
        let (map, data) = mapped_and_checked(&parent, 64, 9100, "parent");
        let addr = map.as_ptr() as usize;
        // SAFETY: the child below only maps, reads and _exits; it touches
        // none of the parent's faultmap objects.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(|| {
                let child = pager(Delivery::Signal);
                let mut reused = false;
                for i in 0..8u64 {
                    let (m, _) = mapped_and_checked(&child, 64, 9200 + i, "child");
                    reused |= m.as_ptr() as usize == addr;
                    std::mem::forget(m);
                }
                println!("child mappings reused the parent's range: {reused}");
            })
            .map_or(1, |()| 0);
            // SAFETY: ends the forked child without running the parent's
            // destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the forked child failed: status {status:#x}"
        );
        assert_bytes(&map, &data, "parent after the fork");
        println!("{OK}");
        return;
    }
    assert_child_ok(NAME);
}

/// The interrupted code's errno survives faultmap's SIGBUS handler, which
/// makes system calls (and sees EEXIST when threads race for a page).
#[test]
fn errno_survives_faults() {
    watchdog(WATCHDOG, || {
        let pager = Arc::new(pager(Delivery::Signal));
        let data = Arc::new(pattern(512 * PAGE, 9300));
        let object = pager.open(MemStore::new("errno", data.to_vec())).unwrap();
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (pager, object, data) = (pager.clone(), object.clone(), data.clone());
                std::thread::spawn(move || {
                    for round in 0..4 {
                        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
                        for p in 0..512 {
                            let sentinel = 1000 + t * 100 + round;
                            // SAFETY: sets this thread's errno.
                            unsafe { *libc::__errno_location() = sentinel };
                            let b = map[p * PAGE + 5];
                            // SAFETY: reads this thread's errno.
                            let now = unsafe { *libc::__errno_location() };
                            assert_eq!(now, sentinel, "errno changed across a fault on page {p}");
                            assert_eq!(b, data[p * PAGE + 5]);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
}
