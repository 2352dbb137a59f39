//! A forked child does not inherit faultmap's mappings (`MADV_DONTFORK`),
//! but it gets an inaccessible placeholder over each (`sys::fork`): a
//! pointer the parent took before the fork faults there (SIGSEGV), however
//! much the child maps, and never reads or writes the child's own memory.
//!
//! Each test forks its own thread of the (multithreaded) test process:
//! after the fork the child uses raw `libc` calls and plain loads and
//! stores only, and reports to the parent through a pipe in fixed records.

mod common;
use common::MapTrusted;

use common::*;
use faultmap::{Config, Delivery, FileStore, MapOptions, Pager};

/// What the child fills its own memory with.
const SECRET: &[u8; 16] = b"CHILD-SECRET-001";
/// What the child writes through the parent's pointer to a writable mapping.
const SCRIBBLE: &[u8; 16] = b"PARENT-PTR-WRITE";
/// How many anonymous mappings the child makes.
const ANON_MAPS: usize = 200;

/// The child's records: how many of its mappings landed in the parent's
/// range (then a `u32`, little-endian), the 16 bytes it read through the
/// parent's pointer, how many of its own secret blocks a write through the
/// parent's pointer changed (then a `u32`), and its last words before a
/// normal exit.
const LANDED: u8 = b'L';
const READ: u8 = b'R';
const WROTE: u8 = b'W';
const SURVIVED: u8 = b'S';

#[derive(Clone, Copy, Debug)]
enum Touch {
    /// Read 16 bytes through a read-only mapping's pointer.
    Read,
    /// Write 16 bytes through a writable mapping's pointer.
    Write,
}

fn pager(delivery: Delivery) -> Pager {
    Pager::new(Config::default().delivery(delivery)).expect("Pager::new")
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

/// The forked child. Raw libc, loads and stores only: the process it was
/// forked from has other threads, whose locks (malloc's, stdout's) may be
/// held here for good. Never returns.
///
/// 1. Maps [`ANON_MAPS`] anonymous ranges the size of the parent's
///    mapping, the first with the parent's address as a hint (as any
///    allocator may pass), and fills them with [`SECRET`].
/// 2. Reports how many landed in the parent's range (before touching it).
/// 3. Touches the parent's pointer: reads 16 bytes and reports them, or
///    writes [`SCRIBBLE`] and reports how many of its secret blocks
///    changed.
/// 4. Exits 0: only if the touch did not fault.
fn child(fd: i32, base: usize, len: usize, touch: Touch) -> ! {
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
            put(fd, b"mmap failed");
            // SAFETY: leaves the forked child at once.
            unsafe { libc::_exit(3) };
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
    match touch {
        Touch::Read => {
            // SAFETY: none: the parent's address, which the test expects to
            // fault here. (Without the placeholder it would read whatever
            // the child mapped there.)
            let got = unsafe { std::ptr::read_volatile(base as *const [u8; 16]) };
            let mut record = [READ; 17];
            record[1..].copy_from_slice(&got);
            put(fd, &record);
        }
        Touch::Write => {
            // SAFETY: none, as above: the write is expected to fault.
            unsafe { std::ptr::write_volatile(base as *mut [u8; 16], *SCRIBBLE) };
            let mut changed: u32 = 0;
            for &p in &mine {
                for block in (0..len).step_by(SECRET.len()) {
                    // SAFETY: the child's own mapping, as above.
                    let b = unsafe { std::ptr::read_volatile((p + block) as *const [u8; 16]) };
                    changed += u32::from(b != *SECRET);
                }
            }
            put_count(fd, WROTE, changed);
        }
    }
    put(fd, &[SURVIVED]);
    // SAFETY: leaves the forked child at once.
    unsafe { libc::_exit(0) }
}

/// Maps a file, reads it in the parent, forks, and lets [`child`] touch the
/// mapping's address; the child must die of SIGSEGV having seen nothing of
/// its own memory there, and the parent's mapping reads on.
fn scenario(delivery: Delivery, touch: Touch, seed: u64) {
    watchdog(WATCHDOG, move || {
        let file = TestFile::new(16 * PAGE, seed);
        let pager = pager(delivery);
        // A read-only or a writable mapping, held as its bytes.
        let map: Box<dyn std::ops::Deref<Target = [u8]> + Send> = match touch {
            Touch::Read => Box::new(
                pager
                    .map_trusted(file.store(), MapOptions::new())
                    .expect("map"),
            ),
            Touch::Write => Box::new(
                pager
                    .map_mut_trusted(
                        FileStore::open_rw(&file.path).expect("open_rw"),
                        MapOptions::new(),
                    )
                    .expect("map_mut"),
            ),
        };
        assert_bytes(&map, &file.data, "the parent, before the fork");
        // Offset 0 starts a page; the file is whole pages.
        let (base, len) = (map.as_ptr() as usize, file.data.len());
        assert_eq!(base % PAGE, 0);

        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
        let [rd, wr] = fds;
        // SAFETY: the child calls raw libc only, then _exit (see `child`).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            child(wr, base, len, touch);
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid, "waitpid: {}", std::io::Error::last_os_error());
        // The child is gone: all it wrote is in the pipe (non-blocking: a
        // concurrent test's child may hold a copy of the write end).
        let mut said = vec![0u8; 64 * 1024];
        // SAFETY: reads into a live buffer of its length.
        let n = unsafe { libc::read(rd, said.as_mut_ptr().cast(), said.len()) };
        said.truncate(usize::try_from(n).unwrap_or(0));
        // SAFETY: the test's own descriptors.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        let report = Report::parse(&said);
        let what = format!("{delivery:?} {touch:?}: status {status:#x}, the child said {report:?}");
        assert_eq!(
            report.landed,
            Some(0),
            "the child's mappings landed in the parent's range; {what}"
        );
        assert!(
            !said.windows(SECRET.len()).any(|w| w == SECRET),
            "the child read its own secret through the parent's pointer; {what}"
        );
        assert_eq!(
            report.changed, None,
            "the child wrote through the parent's pointer; {what}"
        );
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
            "the child did not die of SIGSEGV; {what}"
        );
        assert_bytes(&map, &file.data, "the parent, after the fork");
        if let Touch::Write = touch {
            assert_eq!(
                std::fs::read(&file.path).expect("read the file"),
                file.data,
                "the file"
            );
        }
    });
}

/// What the child reported.
#[derive(Debug, Default)]
struct Report {
    landed: Option<u32>,
    read: Option<String>,
    changed: Option<u32>,
    survived: bool,
    other: Vec<u8>,
}

impl Report {
    fn parse(mut said: &[u8]) -> Report {
        let mut r = Report::default();
        let count = |b: &[u8]| {
            b.get(1..5)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        while let Some(&tag) = said.first() {
            said = match tag {
                LANDED => {
                    r.landed = count(said);
                    &said[5.min(said.len())..]
                }
                WROTE => {
                    r.changed = count(said);
                    &said[5.min(said.len())..]
                }
                READ => {
                    let bytes = &said[1..17.min(said.len())];
                    r.read = Some(String::from_utf8_lossy(bytes).into_owned());
                    &said[17.min(said.len())..]
                }
                SURVIVED => {
                    r.survived = true;
                    &said[1..]
                }
                _ => {
                    r.other = said.to_vec();
                    &[]
                }
            };
        }
        r
    }
}

/// A part of a mapping the application moved with `mremap` is served at
/// its new address, and is reserved there in a forked child too (its pager
/// adopted it when it read the REMAP event): mapping over it in the child
/// is refused, and reading it is SIGSEGV. So is the part left in place.
fn moved(delivery: Delivery, seed: u64) {
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

        // SAFETY: the child probes with NOREPLACE mmaps (which replace
        // nothing), reads and _exits; raw libc only.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
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
                    // SAFETY: leaves the forked child at once.
                    unsafe { libc::_exit(10 + i as i32) };
                }
            }
            // SAFETY: none: the moved part's address, expected to fault.
            let v = unsafe { std::ptr::read_volatile(dest as *const u8) };
            // SAFETY: leaves the forked child at once.
            unsafe { libc::_exit(20 + i32::from(v % 8)) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid, "waitpid: {}", std::io::Error::last_os_error());
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
            "{delivery:?}: the child did not die of SIGSEGV: status {status:#x} \
             (exit 10/11: nothing at the part left in place/moved; 2x: read it)"
        );
        // SAFETY: the moved part, still the test's mapping.
        let again = unsafe { std::slice::from_raw_parts(dest as *const u8, 4 * PAGE) };
        assert_bytes(again, &data[4 * PAGE..], "the moved part, after the fork");
    });
}

#[test]
fn a_fork_child_reading_a_parents_mapping_gets_sigsegv_not_its_own_memory_signal() {
    scenario(Delivery::Signal, Touch::Read, 2601);
}

#[test]
fn a_fork_child_reading_a_parents_mapping_gets_sigsegv_not_its_own_memory_handler() {
    scenario(Delivery::Handler, Touch::Read, 2602);
}

#[test]
fn a_fork_child_writing_a_parents_writable_mapping_gets_sigsegv_signal() {
    scenario(Delivery::Signal, Touch::Write, 2603);
}

#[test]
fn a_fork_child_writing_a_parents_writable_mapping_gets_sigsegv_handler() {
    scenario(Delivery::Handler, Touch::Write, 2604);
}

#[test]
fn a_fork_child_gets_a_placeholder_where_a_part_was_moved_signal() {
    moved(Delivery::Signal, 2605);
}

#[test]
fn a_fork_child_gets_a_placeholder_where_a_part_was_moved_handler() {
    moved(Delivery::Handler, 2606);
}
