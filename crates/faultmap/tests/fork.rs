//! A forked child reads and writes the mappings it inherited, served by
//! its parent from the parent's one page cache (`mm::guest`,
//! `sys::share`): the child maps each range again at its address, from the
//! memfd, with a userfaultfd of its own that it hands to the parent. A page
//! any process read is read once; a write in one process is seen by the
//! others and written back once; a child killed in the middle of a read
//! leaves nothing stuck; the parent's death gives the child SIGBUS, never
//! zeros; the memory budget holds across all of them. A pointer the parent
//! took before the fork never reads the child's own memory.
//!
//! Each test forks its own thread of the (multithreaded) test process:
//! after the fork the child uses raw `libc` calls and plain loads and
//! stores only, and reports to the parent through a pipe in fixed records.

mod common;
use common::MapTrusted;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use faultmap::{Config, Delivery, Engine, FileStore, MapOptions, Pager};

/// What the child fills its own memory with.
const SECRET: &[u8; 16] = b"CHILD-SECRET-001";
/// How many anonymous mappings the child makes.
const ANON_MAPS: usize = 200;

/// The child's records: how many of its mappings landed in the parent's
/// range (then a `u32`, little-endian), the 16 bytes it read through the
/// parent's pointer, how many of its own secret blocks changed (then a
/// `u32`), and its last words before a normal exit.
const LANDED: u8 = b'L';
const READ: u8 = b'R';
const WROTE: u8 = b'W';
const SURVIVED: u8 = b'S';

/// How the parent's pager takes faults: a userfaultfd with either
/// delivery, or the protect engine (whose children change their own
/// protections at its word: `sys::revoke`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Signal,
    Handler,
    Protect,
}

impl Mode {
    fn config(self) -> Config {
        match self {
            Mode::Signal => Config::default().delivery(Delivery::Signal),
            Mode::Handler => Config::default().delivery(Delivery::Handler),
            Mode::Protect => Config::default().engine(Engine::Protect),
        }
    }
}

fn pager(delivery: Mode) -> Pager {
    Pager::new(delivery.config()).expect("Pager::new")
}

/// Writes `bytes` to `fd` (the child's pipe), whole or not at all (a pipe
/// write of at most `PIPE_BUF` bytes is atomic).
fn put(fd: i32, bytes: &[u8]) {
    // SAFETY: writes `bytes.len()` bytes from a live slice.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}

/// A record: its tag and a `u32`.
fn put_count(fd: i32, tag: u8, n: u32) {
    let b = n.to_le_bytes();
    put(fd, &[tag, b[0], b[1], b[2], b[3]]);
}

/// FNV-1a over `len` bytes at `addr`, with volatile loads (no allocation:
/// callable in a forked child).
fn hash_at(addr: usize, len: usize) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..len {
        // SAFETY: the caller passes a readable range.
        let b = unsafe { std::ptr::read_volatile((addr + i) as *const u8) };
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn hash(bytes: &[u8]) -> u64 {
    hash_at(bytes.as_ptr() as usize, bytes.len())
}

/// A pipe, close-on-exec: `(read end, write end)`.
fn pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    (fds[0], fds[1])
}

fn close(fd: i32) {
    // SAFETY: the test's own descriptor.
    unsafe { libc::close(fd) };
}

/// Reads exactly `buf.len()` bytes from `fd`, waiting at most `limit`;
/// returns how many came (fewer: the writer closed it, or time ran out).
fn get(fd: i32, buf: &mut [u8], limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    let mut done = 0;
    while done < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
        if ready <= 0 {
            if ready < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return done;
        }
        // SAFETY: reads into the unfilled part of a live buffer.
        let n = unsafe { libc::read(fd, buf[done..].as_mut_ptr().cast(), buf.len() - done) };
        if n <= 0 {
            return done;
        }
        done += n as usize;
    }
    done
}

/// Forks; the child runs `f` (raw libc, loads and stores only: see the
/// module's documentation) and exits with what it returns. It is killed if
/// the thread that forked it ends first (a failed test leaves no child
/// behind).
fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    fork_then(true, f)
}

/// [`fork_child`], but the child outlives its parent (`tied`: false).
fn fork_then(tied: bool, f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child runs `f`, which keeps to raw libc calls, then
    // _exits; nothing of the parent's threads is used there.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        if tied {
            // SAFETY: a process attribute; no memory passed.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
        }
        let code = f();
        // SAFETY: leaves the forked child at once.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for child `pid` at most `limit` (then kills it); its status.
fn wait_for(pid: libc::pid_t, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: polls the test's own child.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got == pid {
            return status;
        }
        assert!(got == 0, "waitpid: {}", std::io::Error::last_os_error());
        if Instant::now() >= deadline {
            // SAFETY: the test's own child, which hangs.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: reaps it.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            panic!("child {pid} still running after {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn exited_0(status: i32) -> bool {
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

fn died_of(status: i32, signal: i32) -> bool {
    libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == signal
}

const CHILD_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Reading: the same bytes, from the same cache.
// ---------------------------------------------------------------------------

/// The child: maps [`ANON_MAPS`] anonymous ranges the size of the parent's
/// mapping, the first with the parent's address as a hint, fills them with
/// [`SECRET`], reports how many landed in the parent's range, then reads
/// the whole mapping through the parent's pointer and reports its hash,
/// and how many of its secret blocks changed. With `grandchild`, it then
/// forks a child of its own that reads the range (a child of a child is
/// not served: it must die of SIGSEGV) and reports that child's status.
fn reader(fd: i32, base: usize, len: usize, grandchild: bool) -> i32 {
    let mut landed: u32 = 0;
    let mut mine = [0usize; ANON_MAPS];
    for (i, slot) in mine.iter_mut().enumerate() {
        let hint = if i == 0 { base } else { 0 };
        // SAFETY: an anonymous mapping without MAP_FIXED: the kernel takes
        // free address space only (the hint, if it is free).
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return 3;
        }
        let p = p as usize;
        if p < base + len && base < p + len {
            landed += 1;
        }
        for block in (0..len).step_by(SECRET.len()) {
            // SAFETY: inside the child's own fresh read-write mapping of
            // `len` bytes (a multiple of 16).
            unsafe { std::ptr::write_volatile((p + block) as *mut [u8; 16], *SECRET) };
        }
        *slot = p;
    }
    put_count(fd, LANDED, landed);
    let h = hash_at(base, len).to_le_bytes();
    let mut record = [READ; 9];
    record[1..].copy_from_slice(&h);
    put(fd, &record);
    let mut changed: u32 = 0;
    for &p in &mine {
        for block in (0..len).step_by(SECRET.len()) {
            // SAFETY: the child's own mapping, as above.
            let b = unsafe { std::ptr::read_volatile((p + block) as *const [u8; 16]) };
            changed += u32::from(b != *SECRET);
        }
    }
    put_count(fd, WROTE, changed);
    if grandchild {
        let pid = fork_child(|| {
            // SAFETY: none: expected to fault (SIGSEGV on the placeholder).
            let v = unsafe { std::ptr::read_volatile(base as *const u8) };
            40 + i32::from(v % 8)
        });
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        put_count(fd, b'G', status as u32);
    }
    put(fd, &[SURVIVED]);
    0
}

/// What [`reader`] reported.
#[derive(Debug, Default)]
struct Report {
    landed: Option<u32>,
    hash: Option<u64>,
    changed: Option<u32>,
    grandchild: Option<i32>,
    survived: bool,
}

impl Report {
    fn parse(mut said: &[u8]) -> Report {
        let mut r = Report::default();
        let count = |b: &[u8]| {
            b.get(1..5)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        while let Some(&tag) = said.first() {
            let used = match tag {
                LANDED => {
                    r.landed = count(said);
                    5
                }
                WROTE => {
                    r.changed = count(said);
                    5
                }
                b'G' => {
                    r.grandchild = count(said).map(|s| s as i32);
                    5
                }
                READ => {
                    r.hash = said
                        .get(1..9)
                        .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
                    9
                }
                SURVIVED => {
                    r.survived = true;
                    1
                }
                _ => said.len(),
            };
            said = &said[used.min(said.len())..];
        }
        r
    }
}

/// Runs [`reader`] in a child over `[base, base + len)` and returns what
/// it said, once it exited 0.
fn read_in_child(base: usize, len: usize, grandchild: bool) -> Report {
    let (rd, wr) = pipe();
    let pid = fork_child(|| reader(wr, base, len, grandchild));
    close(wr);
    let status = wait_for(pid, CHILD_LIMIT);
    let mut said = vec![0u8; 4096];
    let n = get(rd, &mut said, Duration::from_secs(5));
    said.truncate(n);
    close(rd);
    let report = Report::parse(&said);
    assert!(
        exited_0(status),
        "the child did not exit 0: status {status:#x}, it said {report:?}"
    );
    report
}

/// Maps a store in the parent, reads half of it, and lets two children one
/// after the other read all of it through the parent's pointer: both see
/// the object's bytes (none of their own memory), every page is read from
/// the store exactly once, and a child of a child gets SIGSEGV there.
fn inherited_reads(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        let data = pattern(64 * PAGE, seed);
        let store = Instrumented::mem(&data, Faults::default());
        let pager = pager(delivery);
        let map = pager
            .map_trusted(store.clone(), MapOptions::new())
            .expect("map");
        assert_bytes(&map[..32 * PAGE], &data[..32 * PAGE], "the parent's half");
        let (base, len) = (map.as_ptr() as usize, map.len());
        assert_eq!(base % PAGE, 0);
        for (i, grandchild) in [(1, false), (2, true)] {
            let report = read_in_child(base, len, grandchild);
            let what = format!("{delivery:?}, child {i}: {report:?}");
            assert_eq!(report.landed, Some(0), "{what}: a mapping landed there");
            assert_eq!(report.hash, Some(hash(&data)), "{what}: the bytes");
            assert_eq!(report.changed, Some(0), "{what}: its own memory changed");
            assert!(report.survived, "{what}");
            if grandchild {
                let g = report.grandchild.expect("the grandchild's status");
                assert!(
                    died_of(g, libc::SIGSEGV),
                    "{what}: the grandchild's status {g:#x}"
                );
            }
            assert_eq!(
                store.page_reads(),
                vec![1; 64],
                "{what}: each page read from the store once"
            );
        }
        assert_bytes(&map, &data, "the parent, after the children");
        assert_eq!(store.page_reads(), vec![1; 64]);
        store.assert_contract_kept();
    });
}

#[test]
fn a_fork_child_reads_a_parents_mapping_from_the_same_cache_signal() {
    inherited_reads(Mode::Signal, 2701);
}

#[test]
fn a_fork_child_reads_a_parents_mapping_from_the_same_cache_handler() {
    inherited_reads(Mode::Handler, 2702);
}

#[test]
fn a_fork_child_reads_a_parents_mapping_from_the_same_cache_protect() {
    inherited_reads(Mode::Protect, 2731);
}

/// Two children fault on the same page at once, while its read is held at
/// the store: the page is read once, and both read it right.
fn concurrent_children(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        let data = pattern(64 * PAGE, seed);
        let store = Instrumented::mem(&data, Faults::gated([10]));
        let pager = pager(delivery);
        let opts = MapOptions::new().readahead(faultmap::ReadaheadMode::Off);
        let map = pager.map_trusted(store.clone(), opts).expect("map");
        let (base, len) = (map.as_ptr() as usize, map.len());
        let page = base + 10 * PAGE;
        let children: Vec<_> = (0..2)
            .map(|_| {
                let (rd, wr) = pipe();
                let pid = fork_child(|| {
                    put(wr, &hash_at(page, PAGE).to_le_bytes());
                    0
                });
                close(wr);
                (pid, rd)
            })
            .collect();
        assert!(
            store.gate.wait_entered(1, Duration::from_secs(20)),
            "{delivery:?}: no read reached the store"
        );
        // Both children's faults reach the pager (one reads, one waits),
        // or the second comes once the page is in: read once either way.
        wait_until(Duration::from_secs(2), || pager.stats().pgfault >= 2);
        store.gate.open();
        for (pid, rd) in children {
            let status = wait_for(pid, CHILD_LIMIT);
            assert!(exited_0(status), "{delivery:?}: status {status:#x}");
            let mut h = [0u8; 8];
            assert_eq!(get(rd, &mut h, Duration::from_secs(5)), 8);
            close(rd);
            assert_eq!(
                u64::from_le_bytes(h),
                hash(&data[10 * PAGE..11 * PAGE]),
                "{delivery:?}: the bytes"
            );
        }
        assert_eq!(store.page_reads()[10], 1, "{delivery:?}: read once");
        assert_eq!(len, data.len());
    });
}

#[test]
fn two_children_faulting_on_one_page_read_it_once_signal() {
    concurrent_children(Mode::Signal, 2703);
}

#[test]
fn two_children_faulting_on_one_page_read_it_once_handler() {
    concurrent_children(Mode::Handler, 2704);
}

#[test]
fn two_children_faulting_on_one_page_read_it_once_protect() {
    concurrent_children(Mode::Protect, 2732);
}

// ---------------------------------------------------------------------------
// Writing: MAP_SHARED semantics across processes.
// ---------------------------------------------------------------------------

/// The parent writes page 1, the child writes page 2 and reads page 1: each
/// sees the other's write. A flush writes both pages back once. The child
/// writes page 2 again after that flush: the flush write-protected the
/// page in the child too, so the write is seen as dirty, and the next
/// flush writes it back, once (a stale copy never wins).
fn shared_writes(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        let file = TestFile::new(16 * PAGE, seed);
        let pager = pager(delivery);
        let mut map = pager
            .map_mut_trusted(
                FileStore::open_rw(&file.path).expect("open_rw"),
                MapOptions::new(),
            )
            .expect("map_mut");
        let base = map.as_ptr() as usize;
        map[PAGE..PAGE + 16].copy_from_slice(&[b'A'; 16]);
        let (from_child, to_parent) = pipe();
        let (from_parent, to_child) = pipe();
        let pid = fork_child(|| {
            // SAFETY: the inherited writable mapping, served by the parent.
            unsafe { std::ptr::write_volatile((base + 2 * PAGE) as *mut [u8; 16], [b'B'; 16]) };
            // SAFETY: as above.
            let seen = unsafe { std::ptr::read_volatile((base + PAGE) as *const [u8; 16]) };
            put(to_parent, &seen);
            let mut go = [0u8; 1];
            // SAFETY: a blocking read of one byte into a live buffer.
            if unsafe { libc::read(from_parent, go.as_mut_ptr().cast(), 1) } != 1 {
                return 5;
            }
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile((base + 2 * PAGE) as *mut [u8; 16], [b'C'; 16]) };
            put(to_parent, b"d");
            // SAFETY: as above: wait for the parent's last word.
            if unsafe { libc::read(from_parent, go.as_mut_ptr().cast(), 1) } != 1 {
                return 6;
            }
            0
        });
        close(to_parent);
        close(from_parent);
        let mut seen = [0u8; 16];
        assert_eq!(
            get(from_child, &mut seen, CHILD_LIMIT),
            16,
            "{delivery:?}: the child's report"
        );
        assert_eq!(
            &seen, &[b'A'; 16],
            "{delivery:?}: the child sees the parent's write"
        );
        assert_eq!(
            &map[2 * PAGE..2 * PAGE + 16],
            &[b'B'; 16],
            "{delivery:?}: the parent sees the child's"
        );
        let object = map.object().clone();
        let written = || object.stats().written_back;
        let before = written();
        map.flush(0..map.len()).expect("flush");
        assert_eq!(
            written() - before,
            2,
            "{delivery:?}: pages 1 and 2, once each"
        );
        map.flush(0..map.len()).expect("flush again");
        assert_eq!(written() - before, 2, "{delivery:?}: nothing more to write");
        let on_disk = std::fs::read(&file.path).expect("read the file");
        assert_eq!(&on_disk[PAGE..PAGE + 16], &[b'A'; 16]);
        assert_eq!(&on_disk[2 * PAGE..2 * PAGE + 16], &[b'B'; 16]);

        put(to_child, b"g");
        let mut d = [0u8; 1];
        assert_eq!(
            get(from_child, &mut d, CHILD_LIMIT),
            1,
            "{delivery:?}: the second write"
        );
        assert_eq!(&map[2 * PAGE..2 * PAGE + 16], &[b'C'; 16]);
        map.flush(0..map.len())
            .expect("flush after the second write");
        assert_eq!(written() - before, 3, "{delivery:?}: page 2 again, once");
        let on_disk = std::fs::read(&file.path).expect("read the file");
        assert_eq!(
            &on_disk[2 * PAGE..2 * PAGE + 16],
            &[b'C'; 16],
            "{delivery:?}: the newer copy"
        );
        let mut expected = file.data.clone();
        expected[PAGE..PAGE + 16].copy_from_slice(&[b'A'; 16]);
        expected[2 * PAGE..2 * PAGE + 16].copy_from_slice(&[b'C'; 16]);
        assert_eq!(on_disk, expected, "{delivery:?}: nothing else changed");
        put(to_child, b"x");
        let status = wait_for(pid, CHILD_LIMIT);
        assert!(exited_0(status), "{delivery:?}: status {status:#x}");
        close(to_child);
        close(from_child);
    });
}

#[test]
fn a_writable_mapping_shared_with_a_child_is_written_back_once_signal() {
    shared_writes(Mode::Signal, 2705);
}

#[test]
fn a_writable_mapping_shared_with_a_child_is_written_back_once_handler() {
    shared_writes(Mode::Handler, 2706);
}

#[test]
fn a_writable_mapping_shared_with_a_child_is_written_back_once_protect() {
    shared_writes(Mode::Protect, 2733);
}

// ---------------------------------------------------------------------------
// Failures: a child killed mid-read; the owner's death.
// ---------------------------------------------------------------------------

/// A child killed (SIGKILL) while the read its fault started is held at the
/// store: the read ends and is kept; the parent and a later child read the
/// page right, and it is read once.
fn killed_mid_read(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        let data = pattern(32 * PAGE, seed);
        let store = Instrumented::mem(&data, Faults::gated([5]));
        let pager = pager(delivery);
        let opts = MapOptions::new().readahead(faultmap::ReadaheadMode::Off);
        let map = pager.map_trusted(store.clone(), opts).expect("map");
        let base = map.as_ptr() as usize;
        let pid = fork_child(|| {
            // SAFETY: the inherited mapping, served by the parent.
            let _ = unsafe { std::ptr::read_volatile((base + 5 * PAGE) as *const u8) };
            7
        });
        assert!(
            store.gate.wait_entered(1, Duration::from_secs(20)),
            "{delivery:?}: the child's read did not reach the store"
        );
        // SAFETY: the test's own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let status = wait_for(pid, CHILD_LIMIT);
        assert!(
            died_of(status, libc::SIGKILL),
            "{delivery:?}: status {status:#x}"
        );
        store.gate.open();
        assert_bytes(
            &map[5 * PAGE..6 * PAGE],
            &data[5 * PAGE..6 * PAGE],
            "the parent",
        );
        let report = read_in_child(base, map.len(), false);
        assert_eq!(
            report.hash,
            Some(hash(&data)),
            "{delivery:?}: a later child"
        );
        assert_eq!(store.page_reads()[5], 1, "{delivery:?}: page 5 read once");
    });
}

#[test]
fn a_child_killed_in_the_middle_of_a_read_leaves_nothing_stuck_signal() {
    killed_mid_read(Mode::Signal, 2707);
}

#[test]
fn a_child_killed_in_the_middle_of_a_read_leaves_nothing_stuck_handler() {
    killed_mid_read(Mode::Handler, 2708);
}

#[test]
fn a_child_killed_in_the_middle_of_a_read_leaves_nothing_stuck_protect() {
    killed_mid_read(Mode::Protect, 2734);
}

/// The memory budget is one: a parent and three children read an object
/// four times the budget, and the cache's peak stays within it.
fn budget_across(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        const BUDGET: u64 = 4 << 20;
        let data = Arc::new(pattern(16 << 20, seed));
        let pager = Pager::new(delivery.config().memory_budget(BUDGET)).expect("pager");
        let map = pager
            .map_trusted(
                faultmap::MemStore::new("budget", data.as_ref().clone()),
                MapOptions::new(),
            )
            .expect("map");
        let (base, len) = (map.as_ptr() as usize, map.len());
        let children: Vec<_> = (0..3)
            .map(|_| {
                let (rd, wr) = pipe();
                let pid = fork_child(|| {
                    put(wr, &hash_at(base, len).to_le_bytes());
                    0
                });
                close(wr);
                (pid, rd)
            })
            .collect();
        assert_bytes(&map, &data, "the parent");
        for (pid, rd) in children {
            let status = wait_for(pid, CHILD_LIMIT);
            assert!(exited_0(status), "{delivery:?}: status {status:#x}");
            let mut h = [0u8; 8];
            assert_eq!(get(rd, &mut h, Duration::from_secs(5)), 8);
            close(rd);
            assert_eq!(
                u64::from_le_bytes(h),
                hash(&data),
                "{delivery:?}: a child's bytes"
            );
        }
        let mem = pager.memory();
        let slack = 8 * PAGE as u64 * 4;
        assert!(
            mem.peak <= BUDGET + slack,
            "{delivery:?}: peak {} bytes cached, budget {BUDGET}",
            mem.peak
        );
        assert!(pager.stats().evicted > 0, "{delivery:?}: nothing evicted");
        if delivery == Mode::Protect {
            let areas = pager.areas().expect("the protect engine's areas");
            assert!(
                areas.child_revokes > 0,
                "the children took nothing back: {areas:?}"
            );
        }
    });
}

#[test]
fn the_memory_budget_holds_across_a_parent_and_its_children_signal() {
    budget_across(Mode::Signal, 2709);
}

#[test]
fn the_memory_budget_holds_across_a_parent_and_its_children_handler() {
    budget_across(Mode::Handler, 2710);
}

#[test]
fn the_memory_budget_holds_across_a_parent_and_its_children_protect() {
    budget_across(Mode::Protect, 2735);
}

/// The owner dies (SIGKILL) while a child lives, and a sibling forked
/// after it too (it holds copies of whatever the owner had open then): the
/// child's next fault on a page it has not mapped gets SIGBUS, never zeros
/// and never a hang; so does a fault that was waiting for a read when the
/// owner died (`in_flight`). The test process re-runs itself as an observer, which
/// forks the owner, which forks the child; the observer is a subreaper, so
/// the child is its own once the owner is gone.
fn owner_death(name: &str, delivery: Mode, in_flight: bool, seed: u64) {
    if is_child(name) {
        observe_owner_death(delivery, in_flight, seed);
        return;
    }
    let end = run_child(name, Duration::from_secs(120));
    assert!(
        end.status.is_some_and(|s| s.success()),
        "{delivery:?}, in flight {in_flight}: the observer failed: {end:?}"
    );
}

fn observe_owner_death(delivery: Mode, in_flight: bool, seed: u64) {
    // SAFETY: a process attribute; no memory passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "prctl: {}", std::io::Error::last_os_error());
    let (rd, wr) = pipe();
    let (go_rd, go_wr) = pipe();
    let owner = fork_child(|| {
        let data = pattern(64 * PAGE, seed);
        let store = Instrumented::mem(&data, Faults::gated([40]));
        let pager = pager(delivery);
        let opts = MapOptions::new().readahead(faultmap::ReadaheadMode::Off);
        let map = pager.map_trusted(store.clone(), opts).expect("map");
        let base = map.as_ptr() as usize;
        let expect = data[PAGE + 3];
        // Not tied to the owner: it must outlive it. The observer reaps (or
        // kills) it.
        let guest = fork_then(false, || {
            // SAFETY: the inherited mapping, served by the owner.
            let v = unsafe { std::ptr::read_volatile((base + PAGE + 3) as *const u8) };
            put(wr, if v == expect { b"r" } else { b"!" });
            if !in_flight {
                let mut go = [0u8; 1];
                // SAFETY: a blocking read of one byte.
                unsafe { libc::read(go_rd, go.as_mut_ptr().cast(), 1) };
            }
            let page = if in_flight { 40 } else { 20 };
            // SAFETY: as above: expected to get SIGBUS once the owner is
            // gone.
            let v = unsafe { std::ptr::read_volatile((base + page * PAGE) as *const u8) };
            put(wr, &[b'z', v]);
            0
        });
        // A sibling forked after it, alive when the owner dies: it
        // inherits the owner's descriptors of the first child's sockets,
        // which must not keep that child waiting.
        // Once the first child is served (its descriptors are open here).
        wait_until(Duration::from_secs(20), || pager.stats().pgfault >= 1);
        let (never_rd, _never_wr) = pipe();
        let sibling = fork_then(false, || {
            let mut never = [0u8; 1];
            // SAFETY: a blocking read of a pipe nobody writes; the
            // observer kills this process.
            unsafe { libc::read(never_rd, never.as_mut_ptr().cast(), 1) };
            0
        });
        let p = guest.to_le_bytes();
        put(wr, &[b'P', p[0], p[1], p[2], p[3]]);
        let q = sibling.to_le_bytes();
        put(wr, &[b'Q', q[0], q[1], q[2], q[3]]);
        if in_flight && store.gate.wait_entered(1, Duration::from_secs(20)) {
            put(wr, b"e");
        }
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    close(wr);
    close(go_rd);
    // Two records, in either order: the child's tag (one byte, 'r' or
    // '!') and the owner's 'P' with the child's pid.
    let (mut tag, mut pid, mut sibling) = (None, None, None);
    while tag.is_none() || pid.is_none() || sibling.is_none() {
        let mut t = [0u8; 1];
        assert_eq!(get(rd, &mut t, CHILD_LIMIT), 1, "the first records");
        if t[0] == b'P' || t[0] == b'Q' {
            let mut p = [0u8; 4];
            assert_eq!(get(rd, &mut p, CHILD_LIMIT), 4);
            let p = Some(i32::from_le_bytes(p));
            if t[0] == b'P' {
                pid = p;
            } else {
                sibling = p;
            }
        } else {
            tag = Some(t[0]);
        }
    }
    let (tag, pid, sibling) = (tag.unwrap(), pid.unwrap(), sibling.unwrap());
    assert_eq!(tag, b'r', "the child read a cached page wrong");
    if in_flight {
        let mut e = [0u8; 1];
        assert_eq!(
            get(rd, &mut e, CHILD_LIMIT),
            1,
            "the child's read at the store"
        );
        assert_eq!(e[0], b'e');
    }
    // SAFETY: the observer's own child.
    unsafe { libc::kill(owner, libc::SIGKILL) };
    let status = wait_for(owner, CHILD_LIMIT);
    assert!(died_of(status, libc::SIGKILL), "the owner: {status:#x}");
    put(go_wr, b"g");
    let status = wait_for(pid, Duration::from_secs(30));
    // SAFETY: the observer's own child now (it is the subreaper).
    unsafe { libc::kill(sibling, libc::SIGKILL) };
    let _ = wait_for(sibling, Duration::from_secs(30));
    let mut rest = [0u8; 2];
    let n = get(rd, &mut rest, Duration::from_millis(100));
    assert!(
        died_of(status, libc::SIGBUS),
        "{delivery:?}, in flight {in_flight}: the child's status {status:#x}, it said {:?}",
        &rest[..n]
    );
}

#[test]
fn the_owners_death_gives_its_child_sigbus_not_zeros_signal() {
    owner_death(
        "the_owners_death_gives_its_child_sigbus_not_zeros_signal",
        Mode::Signal,
        false,
        2711,
    );
}

#[test]
fn the_owners_death_gives_its_child_sigbus_not_zeros_handler() {
    owner_death(
        "the_owners_death_gives_its_child_sigbus_not_zeros_handler",
        Mode::Handler,
        false,
        2712,
    );
}

#[test]
fn the_owners_death_gives_its_child_sigbus_not_zeros_protect() {
    owner_death(
        "the_owners_death_gives_its_child_sigbus_not_zeros_protect",
        Mode::Protect,
        false,
        2738,
    );
}

#[test]
fn the_owners_death_ends_a_childs_fault_waiting_for_a_read_with_sigbus_signal() {
    owner_death(
        "the_owners_death_ends_a_childs_fault_waiting_for_a_read_with_sigbus_signal",
        Mode::Signal,
        true,
        2713,
    );
}

#[test]
fn the_owners_death_ends_a_childs_fault_waiting_for_a_read_with_sigbus_handler() {
    owner_death(
        "the_owners_death_ends_a_childs_fault_waiting_for_a_read_with_sigbus_handler",
        Mode::Handler,
        true,
        2714,
    );
}

#[test]
fn the_owners_death_ends_a_childs_fault_waiting_for_a_read_with_sigbus_protect() {
    owner_death(
        "the_owners_death_ends_a_childs_fault_waiting_for_a_read_with_sigbus_protect",
        Mode::Protect,
        true,
        2739,
    );
}

/// The next number of a xorshift generator (never 0 from a non-zero seed).
fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Children read random bytes of a slow store while the parent kills them
/// (SIGKILL) at random moments, and forks more: killed as they start (the
/// at-fork handler registering), while a request waits for its answer, or
/// while the read it started is in the store. Every child that is not
/// killed reads right; afterwards no page is stuck (a last child and the
/// parent read everything right), and no page was read twice (a read a
/// killed child started is kept).
fn killed_at_random(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        const PAGES: usize = 256;
        let data = pattern(PAGES * PAGE, seed);
        let faults = Faults {
            slow: Some(Duration::from_millis(1)),
            ..Faults::default()
        };
        let store = Instrumented::new(faultmap::MemStore::new("stress", data.clone()), faults);
        let pager = pager(delivery);
        let opts = MapOptions::new().readahead(faultmap::ReadaheadMode::AroundOnly);
        let map = pager.map_trusted(store.clone(), opts).expect("map");
        let (base, len) = (map.as_ptr() as usize, map.len());
        let mut rng = seed | 1;
        let mut live: Vec<libc::pid_t> = Vec::new();
        let (mut killed, mut finished) = (0, 0);
        let reap = |pid: libc::pid_t, status: i32, killed: &mut u32, finished: &mut u32| {
            if died_of(status, libc::SIGKILL) {
                *killed += 1;
            } else {
                assert!(
                    exited_0(status),
                    "{delivery:?}: child {pid} read wrong: {status:#x}"
                );
                *finished += 1;
            }
        };
        for _ in 0..48 {
            rng = xorshift(rng);
            let start = rng;
            let data = &data;
            live.push(fork_child(move || {
                let mut x = start;
                for _ in 0..64 {
                    x = xorshift(x);
                    let at = (x % len as u64) as usize;
                    // SAFETY: inside the inherited mapping, served by the
                    // parent.
                    let v = unsafe { std::ptr::read_volatile((base + at) as *const u8) };
                    if v != data[at] {
                        return 1;
                    }
                }
                0
            }));
            rng = xorshift(rng);
            std::thread::sleep(Duration::from_micros(rng % 3000));
            if rng % 3 != 0 {
                let victim = live[(rng >> 8) as usize % live.len()];
                // SAFETY: the test's own child (perhaps exited, not reaped:
                // the signal then does nothing).
                unsafe { libc::kill(victim, libc::SIGKILL) };
            }
            live.retain(|&pid| {
                let mut status = 0;
                // SAFETY: polls the test's own child.
                match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
                    0 => true,
                    _ => {
                        reap(pid, status, &mut killed, &mut finished);
                        false
                    }
                }
            });
        }
        for pid in live {
            let status = wait_for(pid, CHILD_LIMIT);
            reap(pid, status, &mut killed, &mut finished);
        }
        assert!(
            killed > 0 && finished > 0,
            "{delivery:?}: {killed} killed, {finished} finished"
        );
        let report = read_in_child(base, len, false);
        assert_eq!(report.hash, Some(hash(&data)), "{delivery:?}: a last child");
        assert_bytes(&map, &data, "the parent");
        let reads = store.page_reads();
        assert!(
            reads.iter().all(|&n| n == 1),
            "{delivery:?}: pages read more than once: {:?}",
            reads
                .iter()
                .enumerate()
                .filter(|(_, &n)| n != 1)
                .collect::<Vec<_>>()
        );
        store.assert_contract_kept();
    });
}

#[test]
fn children_killed_at_random_points_leave_the_cache_whole_signal() {
    killed_at_random(Mode::Signal, 2717);
}

#[test]
fn children_killed_at_random_points_leave_the_cache_whole_handler() {
    killed_at_random(Mode::Handler, 2718);
}

#[test]
fn children_killed_at_random_points_leave_the_cache_whole_protect() {
    killed_at_random(Mode::Protect, 2736);
}

/// A child that unmaps the range it inherited and maps a short file there
/// gets the kernel's SIGBUS for an access past the file's end, as it would
/// without faultmap: the parent, asked about it, finds the range is no
/// longer the one the child registered and says so (never "mapped", which
/// would have the access fault again for ever).
fn child_maps_over(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        let data = pattern(16 * PAGE, seed);
        let pager = pager(delivery);
        let map = pager
            .map_trusted(
                faultmap::MemStore::new("over", data.clone()),
                MapOptions::new(),
            )
            .expect("map");
        let (base, len) = (map.as_ptr() as usize, map.len());
        let short = TestFile::new(PAGE, seed + 1);
        let file = std::fs::File::open(&short.path).expect("open");
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let pid = fork_child(|| {
            // SAFETY: the child's own copy of the range: replaced whole by
            // a shared mapping of a one-page file.
            let p = unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    0,
                )
            };
            if p as usize != base {
                return 3;
            }
            // SAFETY: the file's second page: past its end, SIGBUS.
            let _ = unsafe { std::ptr::read_volatile((base + 2 * PAGE) as *const u8) };
            4
        });
        let status = wait_for(pid, CHILD_LIMIT);
        assert!(
            died_of(status, libc::SIGBUS),
            "{delivery:?}: status {status:#x}"
        );
        assert_bytes(&map, &data, "the parent");
    });
}

#[test]
fn a_child_that_maps_over_its_range_gets_the_kernels_sigbus_signal() {
    child_maps_over(Mode::Signal, 2719);
}

#[test]
fn a_child_that_maps_over_its_range_gets_the_kernels_sigbus_handler() {
    child_maps_over(Mode::Handler, 2720);
}

/// A child that closes every descriptor it has (as a daemon does, or
/// `close_range`), its userfaultfd and its channel to the parent among
/// them: its ranges stay registered (the parent keeps its copy of the
/// child's userfaultfd until the child exits), so a page it has not read
/// gets SIGBUS, never zeros.
fn child_closes_everything(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        let data = pattern(64 * PAGE, seed);
        let pager = pager(delivery);
        let opts = MapOptions::new().readahead(faultmap::ReadaheadMode::Off);
        let map = pager
            .map_trusted(faultmap::MemStore::new("closed", data.clone()), opts)
            .expect("map");
        let base = map.as_ptr() as usize;
        let pid = fork_child(|| {
            // SAFETY: closes this child's descriptors from 3 up; no memory
            // passed.
            if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) } != 0 {
                return 3;
            }
            // Time for the parent to see the channel close.
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: the inherited range: expected to get SIGBUS.
            let v = unsafe { std::ptr::read_volatile((base + 40 * PAGE) as *const u8) };
            if v == 0 {
                10
            } else {
                11
            }
        });
        let status = wait_for(pid, CHILD_LIMIT);
        assert!(
            died_of(status, libc::SIGBUS),
            "{delivery:?}: status {status:#x} (exit 10: it read a zero)"
        );
        assert_bytes(&map, &data, "the parent");
    });
}

#[test]
fn a_child_that_closes_its_descriptors_gets_sigbus_not_zeros_signal() {
    child_closes_everything(Mode::Signal, 2721);
}

#[test]
fn a_child_that_closes_its_descriptors_gets_sigbus_not_zeros_handler() {
    child_closes_everything(Mode::Handler, 2722);
}

#[test]
fn a_child_that_closes_its_descriptors_gets_sigbus_not_zeros_protect() {
    child_closes_everything(Mode::Protect, 2737);
}

// ---------------------------------------------------------------------------
// A part the application moved.
// ---------------------------------------------------------------------------

/// A part of a mapping the application moved with `mremap` is served at
/// its new address, and so it is in a forked child (its pager adopted it,
/// with its place in the memfd, when it read the REMAP event): nothing can
/// be mapped over either part in the child, and both read right there.
fn moved(delivery: Mode, seed: u64) {
    watchdog(WATCHDOG, move || {
        let data = pattern(8 * PAGE, seed);
        let pager = pager(delivery);
        let map = pager
            .map_trusted(
                faultmap::MemStore::new("moved", data.clone()),
                MapOptions::new(),
            )
            .expect("map");
        let base = map.as_ptr() as usize;
        let dest = mremap_away(base + 4 * PAGE, 4 * PAGE);
        // Served at the new address: its pager has adopted the part.
        // SAFETY: the part just moved there, still the test's mapping.
        let first = unsafe { std::ptr::read_volatile((dest + 1) as *const u8) };
        assert_eq!(first, data[4 * PAGE + 1]);
        assert_bytes(
            &map[..4 * PAGE],
            &data[..4 * PAGE],
            "the part left in place",
        );
        let (kept, moved) = (hash(&data[..4 * PAGE]), hash(&data[4 * PAGE..]));
        let pid = fork_child(|| {
            for (i, at) in [base, dest].into_iter().enumerate() {
                // SAFETY: NOREPLACE takes free address space only.
                let p = unsafe {
                    libc::mmap(
                        at as *mut libc::c_void,
                        4 * PAGE,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                if p != libc::MAP_FAILED {
                    return 10 + i as i32;
                }
            }
            if hash_at(base, 4 * PAGE) != kept {
                return 20;
            }
            if hash_at(dest, 4 * PAGE) != moved {
                return 21;
            }
            0
        });
        let status = wait_for(pid, CHILD_LIMIT);
        assert!(
            exited_0(status),
            "{delivery:?}: status {status:#x} (exit 10/11: nothing at the part left in \
             place/moved; 20/21: it read wrong)"
        );
        // SAFETY: the moved part, still the test's mapping.
        let again = unsafe { std::slice::from_raw_parts(dest as *const u8, 4 * PAGE) };
        assert_bytes(again, &data[4 * PAGE..], "the moved part, after the fork");
    });
}

#[test]
fn a_fork_child_is_served_where_a_part_was_moved_signal() {
    moved(Mode::Signal, 2715);
}

#[test]
fn a_fork_child_is_served_where_a_part_was_moved_handler() {
    moved(Mode::Handler, 2716);
}

/// Under the protect engine, children read random bytes of an object four
/// times the memory budget while the parent reads too (so pages they were
/// granted are evicted, and taken back from them first: `sys::revoke`),
/// and most are killed at random points (in a fault, a grant, a revoke).
/// One child is stopped (SIGSTOP) while it holds pages: the revokes it
/// cannot answer fail after their wait, its pages stay cached, and the
/// parent goes on. Every byte any child or the parent read is right; once
/// the stopped child runs again, its pages are taken back and evicted.
#[test]
fn protect_children_killed_and_stopped_at_random_never_read_a_punched_page() {
    watchdog(WATCHDOG, || {
        const PAGES: usize = 1024;
        const BUDGET: u64 = (PAGES as u64 / 4) * PAGE as u64;
        let seed = 2740;
        let data = pattern(PAGES * PAGE, seed);
        let pager = pager_with_budget(BUDGET);
        let opts = MapOptions::new().readahead(faultmap::ReadaheadMode::Off);
        let map = pager
            .map_trusted(faultmap::MemStore::new("revokes", data.clone()), opts)
            .expect("map");
        let (base, len) = (map.as_ptr() as usize, map.len());
        let random_reads = |start: u64, n: usize| -> i32 {
            let mut x = start | 1;
            for _ in 0..n {
                x = xorshift(x);
                let at = (x % len as u64) as usize;
                // SAFETY: inside the inherited mapping, served by the parent.
                let v = unsafe { std::ptr::read_volatile((base + at) as *const u8) };
                if v != data[at] {
                    return 1;
                }
            }
            0
        };
        // The stopped one: maps 32 pages, says so, and waits to be stopped.
        let (said, says) = pipe();
        let (go_rd, go_wr) = pipe();
        let stopped = fork_child(|| {
            for p in 0..32 {
                // SAFETY: inside the inherited mapping.
                let v = unsafe { std::ptr::read_volatile((base + p * PAGE) as *const u8) };
                if v != data[p * PAGE] {
                    return 1;
                }
            }
            put(says, b"m");
            let mut go = [0u8; 1];
            // SAFETY: a blocking read of one byte into a live buffer.
            if unsafe { libc::read(go_rd, go.as_mut_ptr().cast(), 1) } != 1 {
                return 2;
            }
            // Its pages again, once taken back: granted anew.
            for p in 0..32 {
                // SAFETY: as above.
                let v = unsafe { std::ptr::read_volatile((base + p * PAGE) as *const u8) };
                if v != data[p * PAGE] {
                    return 3;
                }
            }
            0
        });
        let mut m = [0u8; 1];
        assert_eq!(get(said, &mut m, CHILD_LIMIT), 1, "the child to be stopped");
        // SAFETY: the test's own child.
        unsafe { libc::kill(stopped, libc::SIGSTOP) };
        let before = pager.areas().expect("areas").child_revokes_failed;
        let mut rng = seed | 1;
        let (mut killed, mut finished) = (0u32, 0u32);
        let mut live: Vec<libc::pid_t> = Vec::new();
        for round in 0..24 {
            rng = xorshift(rng);
            let start = rng;
            live.push(fork_child(move || random_reads(start, 1500)));
            // The parent reads too: the budget evicts what children hold.
            assert_eq!(random_reads(rng ^ round, 1000), 0, "the parent read wrong");
            rng = xorshift(rng);
            if rng % 3 != 0 {
                let victim = live[(rng >> 8) as usize % live.len()];
                // SAFETY: the test's own child (perhaps exited, not reaped).
                unsafe { libc::kill(victim, libc::SIGKILL) };
            }
            live.retain(|&pid| {
                let mut status = 0;
                // SAFETY: polls the test's own child.
                match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
                    0 => true,
                    _ => {
                        if died_of(status, libc::SIGKILL) {
                            killed += 1;
                        } else {
                            assert!(exited_0(status), "child {pid} read wrong: {status:#x}");
                            finished += 1;
                        }
                        false
                    }
                }
            });
        }
        for pid in live {
            let status = wait_for(pid, CHILD_LIMIT);
            if died_of(status, libc::SIGKILL) {
                killed += 1;
            } else {
                assert!(exited_0(status), "child {pid} read wrong: {status:#x}");
                finished += 1;
            }
        }
        assert!(
            killed > 0 && finished > 0,
            "{killed} killed, {finished} finished"
        );
        // Every page of the object went through the budget several times:
        // the stopped child's 32 were asked for, in vain.
        let areas = pager.areas().expect("areas");
        assert!(areas.child_revokes > 0, "nothing taken back: {areas:?}");
        assert!(
            areas.child_revokes_failed > before,
            "the stopped child answered: {areas:?}"
        );
        // It runs again: its pending record is answered, and its pages
        // are taken back and evicted like any others.
        // SAFETY: the test's own child.
        unsafe { libc::kill(stopped, libc::SIGCONT) };
        put(go_wr, b"g");
        let status = wait_for(stopped, CHILD_LIMIT);
        assert!(
            exited_0(status),
            "the stopped child read wrong: {status:#x}"
        );
        let failed = pager.areas().expect("areas").child_revokes_failed;
        assert_eq!(random_reads(rng, 20_000), 0, "the parent read wrong");
        assert_bytes(&map, &data, "the parent, at the end");
        assert_eq!(
            pager.areas().expect("areas").child_revokes_failed,
            failed,
            "a revoke failed after every child was running or gone"
        );
        let mem = pager.memory();
        assert!(
            mem.cached <= BUDGET + 64 * PAGE as u64,
            "{} bytes cached over a budget of {BUDGET}",
            mem.cached
        );
        for fd in [said, says, go_rd, go_wr] {
            close(fd);
        }
    });
}

fn pager_with_budget(budget: u64) -> Pager {
    Pager::new(Mode::Protect.config().memory_budget(budget)).expect("pager")
}

/// A process with pagers of both engines: a child reads a mapping of
/// each (one served through its userfaultfd, the other granted), and the
/// protect one's pages are taken back from it when the parent's budget
/// evicts them.
#[test]
fn a_child_of_pagers_of_both_engines_reads_both() {
    watchdog(WATCHDOG, || {
        const PAGES: usize = 2048;
        let a_data = pattern(PAGES * PAGE, 2741);
        let b_data = pattern(PAGES * PAGE, 2742);
        let uffd = pager(Mode::Signal);
        let protect = pager_with_budget((PAGES as u64 / 4) * PAGE as u64);
        let opts = MapOptions::new().readahead(faultmap::ReadaheadMode::Off);
        let a = uffd
            .map_trusted(faultmap::MemStore::new("a", a_data.clone()), opts.clone())
            .expect("map a");
        let b = protect
            .map_trusted(faultmap::MemStore::new("b", b_data.clone()), opts)
            .expect("map b");
        let (a_base, b_base) = (a.as_ptr() as usize, b.as_ptr() as usize);
        let len = PAGES * PAGE;
        let before = protect.areas().expect("areas").child_revokes;
        let pid = fork_child(|| {
            // Twice over each: the second pass finds pages of b that the
            // parent's budget took back meanwhile.
            for _ in 0..2 {
                if hash_at(a_base, len) != hash(&a_data) || hash_at(b_base, len) != hash(&b_data) {
                    return 1;
                }
            }
            0
        });
        let status = wait_for(pid, CHILD_LIMIT);
        assert!(exited_0(status), "the child read wrong: {status:#x}");
        assert_bytes(&a, &a_data, "a, in the parent");
        assert_bytes(&b, &b_data, "b, in the parent");
        let areas = protect.areas().expect("areas");
        assert!(
            areas.child_revokes > before,
            "the protect mapping's pages were never taken back from the child: {areas:?}"
        );
    });
}
