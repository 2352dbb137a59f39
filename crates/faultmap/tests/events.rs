//! The application unmaps or moves (part of) a mapping itself: faultmap
//! learns it from userfaultfd UNMAP/REMAP events, never touches that range
//! again, keeps serving what is left, and a fault there never hangs.
//!
//! Each scenario runs with both deliveries. Outcomes that are signals run
//! in a child process (`common::run_child`).

mod common;
use common::MapTrusted;

use std::time::Duration;

use common::*;
use faultmap::{Advice, Config, Delivery, MapOptions, Mapping, MemStore, Pager};

fn pager(delivery: Delivery) -> Pager {
    Pager::new(Config::default().delivery(delivery)).expect("Pager::new")
}

/// The mapping's page-aligned address range.
fn range_of(map: &Mapping) -> (usize, usize) {
    (map.as_ptr() as usize - lead(map), mapped_pages(map) * PAGE)
}

fn munmap(addr: usize, len: usize) {
    // SAFETY: the test gives up this part of its own mapping and never
    // reads it through the Mapping again.
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    assert_eq!(rc, 0, "munmap: {}", std::io::Error::last_os_error());
}

/// Maps anonymous read-write memory exactly at `addr` (which must be free),
/// filled with `fill`.
/// The application maps fresh memory over `[addr, addr + len)`, part of a
/// faultmap mapping, with `MAP_FIXED`: the kernel unmaps what was there
/// (an UNMAP event for the pager) and maps the new memory in one step, so
/// that no other thread's `mmap` can take the range in between (as it
/// could between a `munmap` and a second `mmap`).
fn map_anon_over(addr: usize, len: usize, fill: u8) {
    // SAFETY: the range is the test's own mapping (a faultmap mapping it
    // holds and never reads through `map` inside that range afterwards).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(
        p as usize,
        addr,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: just mapped, read-write, `len` bytes.
    unsafe { std::ptr::write_bytes(addr as *mut u8, fill, len) };
}

fn all_bytes_are(addr: usize, len: usize, fill: u8) -> bool {
    // SAFETY: the caller's own anonymous mapping of `len` bytes.
    let s = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    s.iter().all(|&b| b == fill)
}

fn read_at(addr: usize) -> u8 {
    // SAFETY: the test reads an address it knows to be one of its
    // mappings (moved or left in place), or, in a child, one it knows to be
    // gone: that access faults, which is what the test asserts.
    unsafe { std::ptr::read_volatile(addr as *const u8) }
}

const BEFORE: &str = "CHILD: touching the range that is gone";

/// What the child prints before the `/proc/self/maps` line that covers an
/// address it could read.
const COVERED: &str = "CHILD: covered by ";

/// The line of `/proc/self/maps` whose range holds `addr`, if any.
fn maps_line(addr: usize) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .find(|l| {
            let range = l.split(' ').next().unwrap_or_default();
            let Some((a, b)) = range.split_once('-') else {
                return false;
            };
            let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                return false;
            };
            (a..b).contains(&addr)
        })
        .map(str::to_string)
}

const CHILD_LIMIT: Duration = Duration::from_secs(30);

#[track_caller]
fn assert_died_of(name: &str, end: &ChildEnd, signal: i32) {
    let what = format!(
        "child {name}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        end.status, end.stdout, end.stderr
    );
    assert!(
        end.status.is_some(),
        "hung: killed after {CHILD_LIMIT:?}; {what}"
    );
    assert!(
        end.stdout.contains(BEFORE),
        "the child did not get there; {what}"
    );
    assert_eq!(end.signal(), Some(signal), "{what}");
}

/// Two tests per scenario: signal delivery and handler threads.
macro_rules! both_deliveries {
    ($scenario:ident: $signal:ident, $handler:ident) => {
        #[test]
        fn $signal() {
            $scenario(Delivery::Signal, stringify!($signal));
        }
        #[test]
        fn $handler() {
            $scenario(Delivery::Handler, stringify!($handler));
        }
    };
}

/// After an event, the pager still serves a new mapping.
fn still_serves(pager: &Pager, seed: u64) {
    let data = pattern(24 * PAGE, seed);
    let map = pager
        .map_trusted(MemStore::new("after", data.clone()), MapOptions::new())
        .unwrap();
    assert_bytes(&map, &data, "a mapping made after the event");
}

fn whole_unmap(delivery: Delivery, _name: &str) {
    watchdog(WATCHDOG, move || {
        let pager = pager(delivery);
        let data = pattern(16 * PAGE, 950);
        let map = pager
            .map_trusted(MemStore::new("whole", data.clone()), MapOptions::new())
            .unwrap();
        assert_bytes(&map, &data, "before");
        let (addr, len) = range_of(&map);
        map_anon_over(addr, len, 0x3C);
        // Invalidating the object must not zap the application's memory.
        map.object().invalidate(0..data.len() as u64).unwrap();
        assert!(all_bytes_are(addr, len, 0x3C), "invalidation zapped it");
        drop(map);
        assert!(all_bytes_are(addr, len, 0x3C), "the drop unmapped it");
        still_serves(&pager, 951);
        // SAFETY: the test's own anonymous mapping.
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    });
}

both_deliveries!(whole_unmap: an_unmapped_range_reused_by_the_app_survives_the_drop_signal, an_unmapped_range_reused_by_the_app_survives_the_drop_handler);

fn partial_unmap(delivery: Delivery, name: &str) {
    let data = pattern(16 * PAGE, 952);
    if is_child(name) {
        let pager = pager(delivery);
        let map = pager
            .map_trusted(MemStore::new("partial", data.clone()), MapOptions::new())
            .unwrap();
        let (addr, _) = range_of(&map);
        munmap(addr + 4 * PAGE, 4 * PAGE);
        println!("{BEFORE}");
        let v = read_at(addr + 5 * PAGE);
        println!("CHILD: read {v} from an unmapped page");
        println!(
            "{COVERED}{}",
            maps_line(addr + 5 * PAGE).unwrap_or_default()
        );
        return;
    }
    // Another thread of the child (a new thread's signal stack, say) may
    // map into the freed hole before the access: then the access reads
    // that, through no fault of faultmap's. Such a run proves nothing and
    // is run again (a few times at most); a faultmap mapping there fails.
    let mut end = run_child(name, CHILD_LIMIT);
    for _ in 0..3 {
        let reused = end
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(COVERED))
            .is_some_and(|line| !line.is_empty() && !line.contains("memfd:"));
        if !reused {
            break;
        }
        end = run_child(name, CHILD_LIMIT);
    }
    assert_died_of(name, &end, libc::SIGSEGV);
    watchdog(WATCHDOG, move || {
        let pager = pager(delivery);
        let object = pager.open(MemStore::new("partial", data.clone())).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(4))
            .unwrap();
        let (addr, len) = range_of(&map);
        // Pages 0..2 touched before, the rest after the munmap.
        for p in 0..2 {
            touch(&map, p);
        }
        map_anon_over(addr + 4 * PAGE, 4 * PAGE, 0x5D);
        // What is left of the mapping keeps working, as a kernel mapping's.
        let keep = |m: &Mapping| {
            for p in (0..16).filter(|p| !(4..8).contains(p)) {
                let r = page_range(m, p);
                assert_bytes(&m[r.clone()], &data[r], &format!("page {p}"));
            }
        };
        keep(&map);
        // Invalidation drops the kept pages (they read again) and never
        // touches the application's pages.
        object.invalidate(0..data.len() as u64).unwrap();
        assert!(all_bytes_are(addr + 4 * PAGE, 4 * PAGE, 0x5D));
        keep(&map);
        drop(map);
        assert!(
            all_bytes_are(addr + 4 * PAGE, 4 * PAGE, 0x5D),
            "the drop unmapped the application's memory"
        );
        let _ = len;
        still_serves(&pager, 953);
        // SAFETY: the test's own anonymous mapping.
        unsafe { libc::munmap((addr + 4 * PAGE) as *mut libc::c_void, 4 * PAGE) };
    });
}

both_deliveries!(partial_unmap: a_partly_unmapped_mapping_serves_the_rest_signal, a_partly_unmapped_mapping_serves_the_rest_handler);

/// Whether any page of `[addr, addr + len)` is mapped in this process.
fn is_mapped(addr: usize, len: usize) -> bool {
    let mut vec = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: mincore only reports on the range; ENOMEM says some of it is
    // not mapped.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
    rc == 0
}

const MOVED_OK: &str = "CHILD: the moved pages were served";

fn moved(delivery: Delivery, name: &str) {
    // The application moves a mapping (whole, then part of another): the
    // moved pages keep being served at their new address, as a kernel
    // mapping's would, with the object's data (a page cached before the
    // move, and one never read), and the mapping's drop unmaps them there.
    // In a child process: its reservations for the destinations could
    // land in the holes that other tests of this binary unmap and map
    // again.
    if !is_child(name) {
        let end = run_child(name, Duration::from_secs(60));
        assert!(
            end.status.is_some_and(|s| s.success()) && end.stdout.contains(MOVED_OK),
            "{end:?}"
        );
        return;
    }
    {
        let data = pattern(16 * PAGE, 954);
        let pager = pager(delivery);
        let map = pager
            .map_trusted(MemStore::new("moved", data.clone()), MapOptions::new())
            .unwrap();
        touch(&map, 0);
        let (addr, len) = range_of(&map);
        let dest = mremap_away(addr, len);
        for page in [0, 9, 15] {
            let at = page * PAGE + 7;
            assert_eq!(
                read_at(dest + at),
                data[at],
                "{delivery:?}: moved page {page}"
            );
        }
        still_serves(&pager, 955);
        drop(map);
        // Unmapped once the last handler or read that held the region
        // lets go of it.
        assert!(
            wait_until(Duration::from_secs(10), || !is_mapped(dest, len)),
            "{delivery:?}: the drop unmaps the moved range"
        );
        still_serves(&pager, 956);
        assert_eq!(pager.mappings(), 0);

        // Part of a mapping: pages 4..8 move; the rest stays in place.
        let map = pager
            .map_trusted(MemStore::new("moved-part", data.clone()), MapOptions::new())
            .unwrap();
        let (addr, _) = range_of(&map);
        let dest = mremap_away(addr + 4 * PAGE, 4 * PAGE);
        for page in 4..8 {
            let at = (page - 4) * PAGE + 11;
            assert_eq!(
                read_at(dest + at),
                data[page * PAGE + 11],
                "{delivery:?}: moved part"
            );
        }
        for page in (0..4).chain(8..16) {
            assert_eq!(
                read_at(addr + page * PAGE + 3),
                data[page * PAGE + 3],
                "{delivery:?}: left part"
            );
        }
        // Settings reach every part (no panic, no error).
        map.set_fault_around_order(0).unwrap();
        map.advise(Advice::DontNeed, 0..map.len()).unwrap();
        assert_eq!(read_at(dest + 5), data[4 * PAGE + 5]);
        drop(map);
        assert!(wait_until(Duration::from_secs(10), || !is_mapped(
            dest,
            4 * PAGE
        )));
        assert_eq!(pager.mappings(), 0);
        println!("{MOVED_OK}");
    }
}

both_deliveries!(moved: an_mremap_destination_keeps_being_served_signal, an_mremap_destination_keeps_being_served_handler);

const MOVED_AT_ONCE_OK: &str = "moved-at-once: every move served";

fn moved_and_touched_at_once(delivery: Delivery, name: &str) {
    // The application's mremap returns once a pager thread has *read* the
    // REMAP event, before the successor at the destination is published:
    // a touch right after it must wait for that, not be taken for a SIGBUS
    // that is not faultmap's (which would end the process). Many moves,
    // each touched at once, to meet that window. In a child process, as
    // `moved`.
    if !is_child(name) {
        let end = run_child(name, Duration::from_secs(120));
        assert!(
            end.status.is_some_and(|s| s.success()) && end.stdout.contains(MOVED_AT_ONCE_OK),
            "{end:?}"
        );
        return;
    }
    let data = pattern(8 * PAGE, 957);
    let pager = pager(delivery);
    for round in 0..3000 {
        let map = pager
            .map_trusted(
                MemStore::new("moved-at-once", data.clone()),
                MapOptions::new(),
            )
            .unwrap();
        let (addr, _) = range_of(&map);
        let dest = mremap_away(addr + 4 * PAGE, 4 * PAGE);
        assert_eq!(
            read_at(dest + 1),
            data[4 * PAGE + 1],
            "{delivery:?}: round {round}"
        );
        drop(map);
    }
    println!("{MOVED_AT_ONCE_OK}");
}

both_deliveries!(moved_and_touched_at_once: an_mremap_destination_touched_at_once_is_served_signal, an_mremap_destination_touched_at_once_is_served_handler);

fn forked(delivery: Delivery, name: &str) {
    // A forked child maps the range again and its parent serves it
    // (`mm::guest`; tests/fork.rs): it reads the byte.
    if is_child(name) {
        let pager = pager(delivery);
        let data = pattern(8 * PAGE, 957);
        let map = pager
            .map_trusted(MemStore::new("forked", data.clone()), MapOptions::new())
            .unwrap();
        assert_bytes(&map, &data, "before the fork");
        let (addr, _) = range_of(&map);
        println!("{BEFORE}");
        // SAFETY: the child only reads one byte and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let v = read_at(addr + PAGE);
            // SAFETY: leaves the forked child at once.
            unsafe { libc::_exit(i32::from(v) + 1) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let want = (i32::from(data[PAGE]) + 1) & 0xff;
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == want,
            "the fork child: status {status:#x}, want exit {want}"
        );
        // The parent's mapping is unaffected.
        assert_bytes(&map, &data, "after the fork");
        println!("{FORK_OK}");
        return;
    }
    let end = run_child(name, Duration::from_secs(30));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains(FORK_OK),
        "{end:?}"
    );
}

const FORK_OK: &str = "CHILD: the fork child read the byte, the parent reads on";

both_deliveries!(forked: a_fork_child_reads_a_mapping_its_parent_serves_signal, a_fork_child_reads_a_mapping_its_parent_serves_handler);

fn forked_drop(delivery: Delivery, name: &str) {
    // A fork child that drops the mapping and the pager it inherited
    // leaves the parent's alone and its own memory too: it neither unmaps
    // the range (which holds an inaccessible placeholder, `sys::fork`,
    // that the child has mapped memory of its own over since) nor waits
    // for pager threads it does not have; the parent's mapping reads on.
    if is_child(name) {
        let pager = pager(delivery);
        let data = pattern(16 * PAGE, 958);
        let map = pager
            .map_trusted(
                MemStore::new("forked-drop", data.clone()),
                MapOptions::new(),
            )
            .unwrap();
        assert_bytes(&map[..PAGE], &data[..PAGE], "before the fork");
        let (addr, len) = range_of(&map);
        // SAFETY: the child maps, drops and checks, then exits at once.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let map_at = |flags| {
                // SAFETY: the range holds the child's placeholder (the
                // parent's mapping is MADV_DONTFORK): NOREPLACE replaces
                // nothing, MAP_FIXED replaces the placeholder only.
                unsafe {
                    libc::mmap(
                        addr as *mut libc::c_void,
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                        -1,
                        0,
                    )
                }
            };
            // The placeholder is there: NOREPLACE fails with EEXIST.
            let refused = map_at(libc::MAP_FIXED_NOREPLACE) == libc::MAP_FAILED
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST);
            let mine = map_at(libc::MAP_FIXED);
            if !refused || mine != addr as *mut libc::c_void {
                // SAFETY: leaves the forked child at once.
                unsafe { libc::_exit(2) };
            }
            // SAFETY: the child's own fresh mapping, `len` bytes.
            unsafe { std::ptr::write_volatile(mine.cast::<u8>().add(PAGE), 0x5a) };
            let start = std::time::Instant::now();
            drop(map);
            drop(pager);
            let quick = start.elapsed() < Duration::from_secs(5);
            // Still mapped, still the child's byte (a munmap would SIGSEGV).
            let kept = read_at(addr + PAGE) == 0x5a;
            // SAFETY: leaves the forked child at once.
            unsafe { libc::_exit(if quick && kept { 0 } else { 3 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the fork child: {status:#x}"
        );
        assert_bytes(&map, &data, "after the fork");
        println!("{FORK_DROP_OK}");
        return;
    }
    let end = run_child(name, Duration::from_secs(30));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains(FORK_DROP_OK),
        "{end:?}"
    );
}

const FORK_DROP_OK: &str = "CHILD: the fork child dropped its copies quickly, the parent reads on";

both_deliveries!(forked_drop: a_fork_child_dropping_the_parents_mapping_leaves_it_be_signal, a_fork_child_dropping_the_parents_mapping_leaves_it_be_handler);

fn forked_object(delivery: Delivery, name: &str) {
    // The child holds the last handle of an object with dirty pages (the
    // application kept the `Object`, its writable mapping is gone): its
    // drop writes nothing back, so a newer write of the parent's cannot be
    // overwritten by the child's stale copy; the parent's flush writes.
    if is_child(name) {
        let file = TestFile::new(8 * PAGE, 959);
        let pager = pager(delivery);
        let object = pager
            .open(faultmap::FileStore::open_rw(&file.path).unwrap())
            .unwrap();
        let mut map = pager.map_mut_trusted(&object, MapOptions::new()).unwrap();
        map[..4].copy_from_slice(b"DIRT");
        drop(map);
        // SAFETY: the child drops the object and exits at once.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let start = std::time::Instant::now();
            drop(object);
            drop(pager);
            let quick = start.elapsed() < Duration::from_secs(5);
            // SAFETY: leaves the forked child at once.
            unsafe { libc::_exit(if quick { 0 } else { 3 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the fork child: {status:#x}"
        );
        let on_disk = std::fs::read(&file.path).unwrap();
        assert_bytes(
            &on_disk[..4],
            &file.data[..4],
            "the file after the child's drop",
        );
        object.flush().unwrap();
        let on_disk = std::fs::read(&file.path).unwrap();
        assert_eq!(&on_disk[..4], b"DIRT", "the parent's flush");
        println!("{FORK_OBJECT_OK}");
        return;
    }
    let end = run_child(name, Duration::from_secs(30));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains(FORK_OBJECT_OK),
        "{end:?}"
    );
}

const FORK_OBJECT_OK: &str = "CHILD: the fork child's drop of the last object handle wrote nothing";

both_deliveries!(forked_object: a_fork_child_dropping_the_last_object_handle_writes_nothing_signal, a_fork_child_dropping_the_last_object_handle_writes_nothing_handler);

/// The application unmaps a whole mapping itself and at once maps the
/// object again, in one thread: the new mapping often gets the same
/// address, and the old region (its UNMAP event read, so the `munmap`
/// returned) must be detached before the new one is inserted, or the
/// event's handling would detach the new one and its faults would never
/// be served. (A review's stand-alone program hung within a few dozen
/// rounds before `Pager::map` waited for events read; here the pager
/// thread, on the same CPU, usually handles the event first.)
///
/// Both deliveries run it at once, on two threads: one's `munmap` often
/// hands its address to the other's `Pager::map` before its pager has
/// read the event; that map must wait for it, or a fault on the new
/// mapping finds the stale region (with signal delivery: SIGBUS, as not
/// faultmap's; without the wait this test died so every time).
fn unmap_then_map_again(delivery: Delivery, seed: u64) {
    let pager = pager(delivery);
    let data = pattern(512 * PAGE, seed);
    let object = pager
        .open(MemStore::new("again", data.clone()))
        .expect("open");
    for round in 0..200 {
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&map, &data, &format!("{delivery:?} round {round}, first"));
        let (addr, len) = range_of(&map);
        munmap(addr, len);
        let again = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&again, &data, &format!("{delivery:?} round {round}"));
        // The old Mapping's drop must not unmap the new one.
        drop(map);
        assert_bytes(
            &again,
            &data,
            &format!("{delivery:?} round {round}, old dropped"),
        );
    }
}

#[test]
fn a_mapping_made_right_after_an_unmap_is_served() {
    watchdog(WATCHDOG, || {
        std::thread::scope(|s| {
            s.spawn(|| unmap_then_map_again(Delivery::Signal, 960));
            s.spawn(|| unmap_then_map_again(Delivery::Handler, 961));
        });
    });
}

/// Pins the calling thread (and the threads it spawns later) to its first
/// allowed CPU. Returns false when the affinity cannot be read or set.
fn pin_to_one_cpu() -> bool {
    // SAFETY: an all-zero cpu_set_t is a valid (empty) set;
    // sched_getaffinity/sched_setaffinity read or write at most its size,
    // and `set` lives across both calls; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) != 0 {
            return false;
        }
        let Some(cpu) = (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set)) else {
            return false;
        };
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        libc::sched_setaffinity(0, std::mem::size_of_val(&one), &one) == 0
    }
}

/// The application unmaps while other threads fault without a pause, all
/// on one CPU with handler delivery, whose one pinned handler reads one
/// message at a time. The kernel hands out pending faults before events,
/// and while an UNMAP waits every `UFFDIO_CONTINUE` fails with `EAGAIN`
/// and its thread faults again at once: such a handler could read faults
/// and never the event, and the `munmap` would never return. Each must
/// return (the watchdog fails the test if one does not), and the walkers'
/// bytes stay right. (The handler drains the userfaultfd when an event
/// may be waiting and once in every 64 reads; in runs here the scheduler
/// never starved the event even without that, so this guards the
/// behaviour, not the mechanism.)
#[test]
fn an_unmap_is_read_while_other_threads_fault_without_a_pause() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    const WALKERS: usize = 3;
    /// Stops the walkers however the unmapping loop ends (a failed
    /// assertion too), so its message is what the test reports.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    watchdog(WATCHDOG, || {
        // The cache pool's refill thread starts with the first object of
        // the process and keeps the mask of the thread that started it:
        // start it before pinning, so that no other test inherits one CPU.
        drop(pager(Delivery::Handler).open(MemStore::new("pool", vec![0; PAGE])));
        assert!(pin_to_one_cpu(), "pinning the test to one CPU");
        let pager = pager(Delivery::Handler);
        let walked = pattern(64 * PAGE, 970);
        let walk = pager
            .map_trusted(
                MemStore::new("walked", walked.clone()),
                MapOptions::new().fault_around_order(0),
            )
            .unwrap();
        assert_bytes(&walk, &walked, "before");
        let done = AtomicBool::new(false);
        let passes = AtomicU32::new(0);
        std::thread::scope(|s| {
            let _done = Done(&done);
            for _ in 0..WALKERS {
                s.spawn(|| {
                    // Bounded: 100,000 passes are far more than the unmaps
                    // below need.
                    for pass in 0..100_000u32 {
                        if done.load(Ordering::Relaxed) {
                            break;
                        }
                        passes.fetch_add(1, Ordering::Relaxed);
                        walk.advise(Advice::DontNeed, 0..walked.len()).unwrap();
                        for page in 0..64 {
                            assert_eq!(
                                read_byte(&walk, page * PAGE),
                                walked[page * PAGE],
                                "pass {pass}, page {page}"
                            );
                        }
                    }
                });
            }
            let data = pattern(16 * PAGE, 971);
            for round in 0..200 {
                // Each unmap while the walkers are faulting.
                let seen = passes.load(Ordering::Relaxed);
                assert!(
                    wait_until(Duration::from_secs(10), || passes.load(Ordering::Relaxed)
                        > seen + 1),
                    "round {round}: the walkers stopped"
                );
                let map = pager
                    .map_trusted(MemStore::new("unmapped", data.clone()), MapOptions::new())
                    .unwrap();
                assert_bytes(&map, &data, &format!("round {round}"));
                let (addr, len) = range_of(&map);
                munmap(addr, len);
                drop(map);
            }
        });
        assert_bytes(&walk, &walked, "after");
    });
}
