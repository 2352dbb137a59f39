//! Unrelated processes share one cache with the switch on
//! (`Config::shared`): the first process of a user to map an object
//! version owns its cache and serves the others' faults; a page any of
//! them read is read once; the owner's death gives the others an error,
//! never zeros nor a hang, and the next mapping makes a fresh cache; the
//! memory budget is the owner's, over all of them; another user's process
//! never reaches the cache.
//!
//! Each process is this test binary run again (`Command`: not a fork, so
//! nothing is inherited) with one of the `role_*` helpers below, which
//! are ignored in a plain run and named by `FAULTMAP_ROLE`. They talk to
//! the test over their standard input and output, one line at a time.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use faultmap::{Config, Delivery, FileStore, MapOptions, Pager, Sharing};

/// The object's length: 16 MiB and a bit.
const LEN: usize = (16 << 20) + 12_345;
/// How long a helper may take to say its next line.
const LINE_LIMIT: Duration = Duration::from_secs(60);

std::thread_local! {
    /// Helpers started on this thread now run the protect engine.
    static PROTECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A helper process and its lines.
struct Helper {
    child: Child,
    input: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Helper {
    /// Runs `role` of this binary over `file`, with sharing on and its
    /// rendezvous directory `dir` (`None`: the default one), as `uid`.
    fn start(
        role: &str,
        file: &Path,
        delivery: Delivery,
        dir: Option<&Path>,
        uid: Option<u32>,
    ) -> Helper {
        let exe = std::env::current_exe().expect("exe");
        Self::start_exe(&exe, role, file, delivery, dir, uid, None)
    }

    /// [`Helper::start`] under the protect engine (`FAULTMAP_ENGINE`,
    /// which overrides the configuration), meeting in `dir`.
    fn start_protect(role: &str, file: &Path, dir: &Path) -> Helper {
        PROTECT.with(|p| p.set(true));
        let helper = Self::start(role, file, Delivery::Signal, Some(dir), None);
        PROTECT.with(|p| p.set(false));
        helper
    }

    /// `role_reader` over `file`, signal delivery, meeting in `dir`.
    fn reader(file: &Path, dir: &Path) -> Helper {
        Self::start("role_reader", file, Delivery::Signal, Some(dir), None)
    }

    /// As [`Helper::start`], mapping only `len` bytes from `offset`.
    fn start_window(role: &str, file: &Path, dir: &Path, offset: u64, len: u64) -> Helper {
        let exe = std::env::current_exe().expect("exe");
        let window = Some((offset, len));
        Self::start_exe(&exe, role, file, Delivery::Signal, Some(dir), None, window)
    }

    fn start_exe(
        exe: &Path,
        role: &str,
        file: &Path,
        delivery: Delivery,
        dir: Option<&Path>,
        uid: Option<u32>,
        window: Option<(u64, u64)>,
    ) -> Helper {
        let mut cmd = Command::new(exe);
        if let Some((offset, len)) = window {
            cmd.env("FAULTMAP_WINDOW", format!("{offset},{len}"));
        }
        cmd.args([
            role,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("FAULTMAP_ROLE", role)
        .env("FAULTMAP_FILE", file)
        .env("FAULTMAP_DELIVERY", format!("{delivery:?}"))
        .env("FAULTMAP_SHARED", "1")
        .env(
            faultmap::ENGINE_ENV,
            if PROTECT.with(|p| p.get()) {
                "protect"
            } else {
                ""
            },
        )
        .env_remove(faultmap::SHARED_DIR_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if let Some(dir) = dir {
            cmd.env(faultmap::SHARED_DIR_ENV, dir);
        }
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid).env_remove("XDG_RUNTIME_DIR");
        }
        let mut child = cmd.spawn().expect("spawn a helper");
        let out: ChildStdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // The helper's own lines; the test harness's are not ours.
                if let Some(line) = line.strip_prefix("@ ") {
                    if tx.send(line.to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        Helper {
            input: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The helper's next line.
    fn line(&self) -> String {
        self.lines
            .recv_timeout(LINE_LIMIT)
            .expect("the helper said nothing in time")
    }

    /// Tells the helper to go on.
    fn go(&mut self) {
        let input = self.input.as_mut().expect("stdin");
        input.write_all(b"go\n").expect("write to a helper");
        input.flush().expect("flush");
    }

    /// Waits for the helper; asserts it passed.
    fn passed(mut self, what: &str) {
        drop(self.input.take());
        let deadline = std::time::Instant::now() + LINE_LIMIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{what}: did not exit in {LINE_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "{what}: {status}");
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// The helpers (run in processes of their own).
// ---------------------------------------------------------------------------

/// A line to the test.
fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@ {line}").unwrap();
    out.flush().unwrap();
}

/// Waits for the test's word.
fn wait_go() {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
}

/// The helper's setting: the file, a pager with sharing on (from the
/// environment, as users turn it on), the expected bytes.
fn helper_setup(budget: Option<u64>) -> Option<(PathBuf, Pager, Vec<u8>)> {
    let role = std::env::var("FAULTMAP_ROLE").ok()?;
    let file = PathBuf::from(std::env::var_os("FAULTMAP_FILE")?);
    let delivery = match std::env::var("FAULTMAP_DELIVERY").as_deref() {
        Ok("Handler") => Delivery::Handler,
        _ => Delivery::Signal,
    };
    let mut config = Config::default().delivery(delivery);
    assert!(config.shared, "{role}: FAULTMAP_SHARED=1 turns sharing on");
    if let Some(b) = budget {
        config = config.memory_budget(b);
    }
    let pager = Pager::new(config).expect("Pager::new");
    let data = std::fs::read(&file).expect("read the file");
    Some((file, pager, data))
}

fn map(pager: &Pager, file: &Path) -> faultmap::Mapping {
    // SAFETY: the test's file, which nobody writes while it is mapped.
    unsafe { pager.map(FileStore::open(file).expect("open"), window().0) }.expect("map")
}

/// The part of the file a helper maps (`FAULTMAP_WINDOW=offset,len`;
/// default the whole file), and its first byte.
fn window() -> (MapOptions, usize) {
    match std::env::var("FAULTMAP_WINDOW") {
        Ok(w) => {
            let (offset, len) = w.split_once(',').expect("offset,len");
            let (offset, len): (u64, u64) = (offset.parse().unwrap(), len.parse().unwrap());
            (MapOptions::new().offset(offset).len(len), offset as usize)
        }
        Err(_) => (MapOptions::new(), 0),
    }
}

fn sharing_name(s: &Sharing) -> String {
    match s {
        Sharing::Owner => "owner".into(),
        Sharing::Joined => "joined".into(),
        Sharing::Private { why } => format!("private {}", why.as_deref().unwrap_or("")),
        _ => "other".into(),
    }
}

/// Every byte through the slice, then random samples with `read_at`.
fn read_all(map: &faultmap::Mapping, data: &[u8], what: &str) {
    assert_bytes(map, data, what);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = [0u8; 100];
    for _ in 0..500 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let at = (x >> 11) as usize % (data.len() - buf.len());
        map.read_at(at, &mut buf).expect("read_at");
        assert_eq!(&buf[..], &data[at..at + buf.len()], "{what}: bytes at {at}");
    }
}

/// Maps, says how it shares, waits, reads everything, says its store
/// bytes, and waits again before it exits (an owner serves the others
/// meanwhile).
#[test]
#[ignore = "a helper: run as a process of its own by the tests in this file"]
fn role_reader() {
    let Some((file, pager, data)) = helper_setup(None) else {
        return;
    };
    let m = map(&pager, &file);
    say(sharing_name(m.sharing()));
    wait_go();
    let first = window().1;
    read_all(&m, &data[first..first + m.len()], "a reader");
    say("read");
    wait_go();
    say(pager.stats().io_bytes);
    wait_go();
}

/// As `role_reader`, with a memory budget of 4 MiB: says the peak bytes
/// cached at the end.
#[test]
#[ignore = "a helper: run as a process of its own by the tests in this file"]
fn role_budget_owner() {
    budget_owner(false);
}

/// As `role_budget_owner`, then says how many ranges its joiners took
/// back (`revokes N`: the protect engine's).
#[test]
#[ignore = "a helper: run as a process of its own by the tests in this file"]
fn role_protect_owner() {
    budget_owner(true);
}

fn budget_owner(say_revokes: bool) {
    let Some((file, pager, data)) = helper_setup(Some(4 << 20)) else {
        return;
    };
    let m = map(&pager, &file);
    say(sharing_name(m.sharing()));
    wait_go();
    read_all(&m, &data, "the owner");
    say("read");
    wait_go();
    say(pager.memory().peak);
    if say_revokes {
        let areas = pager.areas().expect("the protect engine");
        say(format!("revokes {}", areas.child_revokes));
    }
    wait_go();
}

/// Maps (owns), waits, drops its mapping (not its pager), says so, and
/// waits.
#[test]
#[ignore = "a helper: run as a process of its own by the tests in this file"]
fn role_closer() {
    let Some((file, pager, _)) = helper_setup(None) else {
        return;
    };
    let m = map(&pager, &file);
    say(sharing_name(m.sharing()));
    wait_go();
    // The mapping only: its object closes with it, while the pager lives.
    drop(m);
    say("closed");
    wait_go();
    drop(pager);
}

/// Maps (joins), forks a child that sleeps (it keeps whatever it
/// inherited), drops its mapping, says so, waits, and kills the child.
#[test]
#[ignore = "a helper: run as a process of its own by the tests in this file"]
fn role_forking_joiner() {
    let Some((file, pager, data)) = helper_setup(None) else {
        return;
    };
    let m = map(&pager, &file);
    say(sharing_name(m.sharing()));
    assert_bytes(&m[..4096], &data[..4096], "the joiner's first page");
    // SAFETY: the child only sleeps and exits (async-signal-safe calls).
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: as above.
        unsafe {
            libc::sleep(60);
            libc::_exit(0);
        }
    }
    assert!(child > 0, "fork");
    drop(m);
    say("dropped");
    wait_go();
    // SAFETY: the child this process forked.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
}

/// Maps (joins), reads the first half, waits (the owner is killed), then
/// reads the second half, which must fail (never zeros), and maps again:
/// a fresh cache of its own, right bytes.
#[test]
#[ignore = "a helper: run as a process of its own by the tests in this file"]
fn role_survivor() {
    let Some((file, pager, data)) = helper_setup(None) else {
        return;
    };
    let m = map(&pager, &file);
    say(sharing_name(m.sharing()));
    let half = data.len() / 2;
    let mut buf = vec![0u8; half];
    m.read_at(0, &mut buf).expect("the first half");
    assert_eq!(buf, data[..half], "the first half");
    say("half");
    wait_go();
    let mut rest = vec![0u8; data.len() - half];
    let started = std::time::Instant::now();
    match m.read_at(half, &mut rest) {
        Ok(()) => {
            assert_eq!(rest, data[half..], "the second half, if it could be read");
            say("read anyway");
        }
        Err(e) => say(format!("error {e}")),
    }
    say(format!("took {}", started.elapsed().as_secs()));
    let again = map(&pager, &file);
    say(sharing_name(again.sharing()));
    read_all(&again, &data, "the new mapping");
    say("fresh");
}

// ---------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------

/// The end of a run with an owner `a` and a joiner `b` that waits for its
/// go: `b` reads everything, then `a`; `b` exits; returns `a`'s last line
/// (its store bytes, or its peak with `role_budget_owner`).
fn both_read_then_owner_says(mut a: Helper, mut b: Helper) -> u64 {
    assert_eq!(b.line(), "joined");
    b.go();
    assert_eq!(b.line(), "read");
    a.go();
    assert_eq!(a.line(), "read");
    b.go();
    let _ = b.line();
    b.passed("the joiner");
    a.go();
    let said = a.line().parse().unwrap();
    a.passed("the owner");
    said
}

/// The owners' sockets in rendezvous directory `dir`.
fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sock"))
        .collect()
}

/// [`setting`], and a reader that owns the file's cache there.
fn with_owner(seed: u64) -> (TestFile, tempfile::TempDir, Helper) {
    with_owner_as("role_reader", seed)
}

/// [`setting`], and a helper in `role` that owns the file's cache there.
fn with_owner_as(role: &str, seed: u64) -> (TestFile, tempfile::TempDir, Helper) {
    let (file, dir) = setting(seed);
    let owner = Helper::start(role, &file.path, Delivery::Signal, Some(dir.path()), None);
    assert_eq!(owner.line(), "owner", "the first process");
    (file, dir, owner)
}

/// A file for these tests, in a directory of its own; and a rendezvous
/// directory of its own (mode 0700), so that tests running at once never
/// meet.
fn setting(seed: u64) -> (TestFile, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    let file = TestFile::new(LEN, seed);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    (file, dir)
}

fn two_processes_share(delivery: Delivery, seed: u64) {
    let (file, dir) = setting(seed);
    let mut a = Helper::start("role_reader", &file.path, delivery, Some(dir.path()), None);
    assert_eq!(a.line(), "owner", "{delivery:?}: the first process");
    let mut b = Helper::start("role_reader", &file.path, delivery, Some(dir.path()), None);
    assert_eq!(b.line(), "joined", "{delivery:?}: the second process");
    // Both read at once.
    a.go();
    b.go();
    assert_eq!(a.line(), "read");
    assert_eq!(b.line(), "read");
    b.go();
    let b_bytes: u64 = b.line().parse().unwrap();
    a.go();
    let a_bytes: u64 = a.line().parse().unwrap();
    b.passed("the joiner");
    a.passed("the owner");
    assert_eq!(
        b_bytes, 0,
        "{delivery:?}: the joiner read nothing from the store itself"
    );
    let limit = LEN as u64 * 11 / 10;
    assert!(
        a_bytes + b_bytes <= limit,
        "{delivery:?}: {} bytes read from the store for an object of {LEN}",
        a_bytes + b_bytes
    );
    assert!(
        a_bytes >= LEN as u64,
        "{delivery:?}: the owner read the object"
    );
}

#[test]
fn two_unrelated_processes_share_one_cache_signal() {
    two_processes_share(Delivery::Signal, 301);
}

#[test]
fn two_unrelated_processes_share_one_cache_handler() {
    two_processes_share(Delivery::Handler, 302);
}

/// Under the protect engine: the joiner's range starts inaccessible, and
/// the owner grants it pages and takes them back (`sys::revoke`). Both
/// read every byte right, the joiner reads nothing itself, and with the
/// owner's budget (a quarter of the object) pages the joiner held are
/// taken back and evicted.
#[test]
fn two_unrelated_processes_share_one_cache_protect() {
    let (file, dir) = setting(309);
    let mut a = Helper::start_protect("role_protect_owner", &file.path, dir.path());
    assert_eq!(a.line(), "owner", "the first process");
    let mut b = Helper::start_protect("role_reader", &file.path, dir.path());
    assert_eq!(b.line(), "joined", "the second process");
    a.go();
    b.go();
    assert_eq!(a.line(), "read");
    assert_eq!(b.line(), "read");
    b.go();
    let b_bytes: u64 = b.line().parse().unwrap();
    a.go();
    let peak: u64 = a.line().parse().unwrap();
    let revokes: u64 = a.line().strip_prefix("revokes ").unwrap().parse().unwrap();
    b.passed("the joiner");
    a.passed("the owner");
    assert_eq!(b_bytes, 0, "the joiner read nothing from the store itself");
    let budget = 4u64 << 20;
    assert!(
        peak <= budget + 4 * 8 * 4096,
        "peak {peak} bytes cached, budget {budget}"
    );
    assert!(
        revokes > 0,
        "the joiner was never asked to take a page back"
    );
}

/// The owner's death: the joiner's next read of a page it has not mapped
/// fails (never zeros), within the owner check's bound, and its next
/// mapping is a fresh cache with the right bytes.
#[test]
fn the_owners_death_gives_an_error_then_a_fresh_cache() {
    let (file, dir, a) = with_owner(303);
    let mut b = Helper::start(
        "role_survivor",
        &file.path,
        Delivery::Signal,
        Some(dir.path()),
        None,
    );
    assert_eq!(b.line(), "joined");
    assert_eq!(b.line(), "half");
    a.kill();
    b.go();
    // The second half is 8 MiB; the joiner maps at most 2 MiB around a
    // fault, so some page of it is not mapped here yet.
    let outcome = b.line();
    assert!(
        outcome.starts_with("error ") && outcome.contains("gone"),
        "after the owner's death: {outcome}"
    );
    let took: u64 = b.line().strip_prefix("took ").unwrap().parse().unwrap();
    assert!(took < 30, "the read waited {took} s for a dead owner");
    assert_eq!(b.line(), "owner", "the next mapping makes a fresh cache");
    assert_eq!(b.line(), "fresh");
    b.passed("the survivor");
}

/// Joiners killed at random points (starting, joining, with faults
/// waiting on reads in flight) leave the owner's cache whole: a joiner
/// after them reads every byte right, and the object is read from the
/// store about once over all of them.
#[test]
fn joiners_killed_at_random_points_leave_the_cache_whole() {
    let (file, dir, a) = with_owner(307);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for round in 0..12 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut victim = Helper::reader(&file.path, dir.path());
        if round % 2 == 0 {
            // Killed once it joined, while it reads.
            assert_eq!(victim.line(), "joined", "round {round}");
            victim.go();
        }
        std::thread::sleep(Duration::from_micros(x % 40_000));
        victim.kill();
    }
    let b = Helper::reader(&file.path, dir.path());
    let read = both_read_then_owner_says(a, b);
    assert!(
        read <= LEN as u64 * 11 / 10,
        "{read} bytes read from the store for an object of {LEN}"
    );
}

/// The owner's budget holds over every process: a joiner reads an object
/// four times the owner's budget, and the owner's peak stays within it.
#[test]
fn the_owners_budget_holds_across_processes() {
    let (file, dir) = setting(304);
    let a = Helper::start(
        "role_budget_owner",
        &file.path,
        Delivery::Signal,
        Some(dir.path()),
        None,
    );
    assert_eq!(a.line(), "owner");
    let b = Helper::reader(&file.path, dir.path());
    let peak = both_read_then_owner_says(a, b);
    let budget = 4u64 << 20;
    let slack = 4 * 8 * 4096;
    assert!(
        peak <= budget + slack,
        "peak {peak} bytes cached, budget {budget}"
    );
}

/// The rendezvous directory is this user's alone (0700), its socket 0600;
/// a directory open to others, or another user's, is refused (the mapping
/// is private, and says why).
#[test]
fn the_rendezvous_is_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let (file, dir, a) = with_owner(305);
    let socket = sockets_in(dir.path()).pop().expect("the owner's socket");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket's mode");
    // A directory others may enter is refused.
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let b = Helper::start(
        "role_reader",
        &file.path,
        Delivery::Signal,
        Some(open.path()),
        None,
    );
    let line = b.line();
    assert!(
        line.starts_with("private ") && line.contains("group or others"),
        "a directory open to others: {line}"
    );
    b.kill();
    a.kill();
}

/// Another user's process with the switch on never joins, and a process
/// never joins another user's owner, even when that owner's socket is put
/// where it looks:
///
/// - nobody, given root's directory, is refused (not its own);
/// - nobody, with its own directory, owns a cache of its own;
/// - a socket of nobody's owner, moved (by root) to the name a root
///   process looks for, is refused by the root process (`SO_PEERCRED`),
///   which then keeps a private cache: it never reads nobody's cache.
///
/// Run as root (CI is): the other user is `nobody`.
#[test]
fn another_users_owner_is_never_joined() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        missing_feature("root, to run a process as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let (file, dir) = setting(306);
    // nobody must reach the file and the binary: both in a directory it
    // may enter, and a rendezvous directory of its own.
    let shelf = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shelf.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = shelf.path().join("helper");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    let data = shelf.path().join("data.bin");
    std::fs::copy(&file.path, &data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o644)).unwrap();
    let theirs = shelf.path().join("meet");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    let start = |dir: Option<&Path>, uid: Option<u32>| {
        Helper::start_exe(&exe, "role_reader", &data, Delivery::Signal, dir, uid, None)
    };
    let socket_in = |dir: &Path| sockets_in(dir).pop().expect("an owner's socket");

    // Root's owner: its socket's name is the one root's processes look for.
    let a = start(Some(dir.path()), None);
    assert_eq!(a.line(), "owner");
    let root_name = socket_in(dir.path());
    // nobody, given root's directory: refused; with its own: an owner.
    let b = start(Some(dir.path()), Some(NOBODY));
    let line = b.line();
    assert!(
        line.starts_with("private ") && line.contains("another user"),
        "nobody in root's directory: {line}"
    );
    b.kill();
    let c = start(Some(&theirs), Some(NOBODY));
    assert_eq!(c.line(), "owner", "nobody in its own directory");
    // nobody's socket where root looks (root's owner gone).
    a.kill();
    std::fs::rename(socket_in(&theirs), &root_name).unwrap();
    let mut d = start(Some(dir.path()), None);
    let line = d.line();
    assert!(
        line.starts_with("private ") && line.contains("another user"),
        "root given nobody's socket: {line}"
    );
    d.go();
    assert_eq!(d.line(), "read", "root reads its own cache");
    d.go();
    let _ = d.line();
    d.passed("root's reader");
    c.kill();
}

/// An owner that closes its object removes its socket: the next process
/// owns a fresh cache at once (no dead socket to find, no wait).
#[test]
fn an_owner_that_closes_its_object_removes_its_socket() {
    let (file, dir, mut a) = with_owner_as("role_closer", 309);
    let sockets = || sockets_in(dir.path()).len();
    assert_eq!(sockets(), 1, "the owner's socket");
    a.go();
    assert_eq!(a.line(), "closed");
    assert_eq!(sockets(), 0, "the socket after the object closed");
    let b = Helper::reader(&file.path, dir.path());
    assert_eq!(b.line(), "owner", "the next process");
    b.kill();
    a.passed("the closer");
}

/// A joiner's forked child keeps no copy of the joiner's channel: once the
/// joiner drops its mapping (its child alive), the owner ends the guest,
/// and the owner's own drop then closes the object and removes its socket.
#[test]
fn a_joiners_child_does_not_keep_its_guest_alive() {
    let (file, dir, mut a) = with_owner_as("role_closer", 310);
    let mut b = Helper::start(
        "role_forking_joiner",
        &file.path,
        Delivery::Signal,
        Some(dir.path()),
        None,
    );
    assert_eq!(b.line(), "joined");
    assert_eq!(b.line(), "dropped");
    a.go();
    assert_eq!(a.line(), "closed");
    let gone = wait_until(Duration::from_secs(10), || {
        sockets_in(dir.path()).is_empty()
    });
    assert!(
        gone,
        "the owner's socket outlived every mapping: a guest was kept alive"
    );
    b.go();
    b.passed("the joiner");
    a.passed("the closer");
}

/// A joiner that maps a part of the object (not from its first page, nor
/// from a page boundary) reads that part's bytes from the owner's cache.
#[test]
fn a_joiner_maps_a_part_of_the_object() {
    let (file, dir, a) = with_owner(308);
    let (offset, len) = (5 * 4096 + 123, (3 << 20) + 777);
    let b = Helper::start_window("role_reader", &file.path, dir.path(), offset, len);
    let read = both_read_then_owner_says(a, b);
    assert!(read >= LEN as u64, "the owner read the object");
}
