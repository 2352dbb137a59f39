//! Where unrelated processes of one user find the process that owns an
//! object's cache: a directory of the user's own, with a lock file and a
//! listening socket per object version (`crate::mm::guest` hosts, and
//! `crate::api::pager` joins).
//!
//! ```text
//!   $FAULTMAP_SHARED_DIR, or $XDG_RUNTIME_DIR/faultmap, or /tmp/faultmap-<euid>
//!     (a directory owned by this user, mode 0700, not a symlink)
//!       lock                     a POSIX record lock, held while a process
//!                                decides whether to join or to own
//!       secret                   16 random bytes, mode 0600: the key of
//!                                the socket names' hash
//!       <SipHash of the key>.sock   SOCK_SEQPACKET, mode 0600, listened
//!                                   on by the owner
//! ```
//!
//! The lock is a record lock (`fcntl(F_SETLK)`), not `flock`: a forked
//! child does not inherit it (a child forked while a thread decides must
//! not hold the directory for its life), and the kernel drops it when the
//! process dies. Threads of one process take an in-process mutex first
//! (record locks do not exclude one's own threads), one per fork
//! generation. A process waits at most [`DECIDE_WAIT`] for it, then
//! shares nothing. (Two copies of faultmap linked into one process, a
//! Python extension and a C library say, have a mutex each: their
//! decisions are not serialised against each other, and the first to let
//! go of the record lock lets go of the other's too. At worst both own a
//! cache: one socket replaces the other, never wrong bytes.)
//!
//! ## How it is secured
//!
//! - The directory must belong to this effective user and grant nothing
//!   to group or others (checked with `lstat`: a symlink, another user's
//!   directory, or one others can enter is refused, and nothing is
//!   shared). The kernel then refuses every other user's `connect` (search
//!   permission on the directory) but root's.
//! - Both ends check the other's user by the kernel's word
//!   (`SO_PEERCRED`): an owner serves only processes of its own effective
//!   user, and a process joins only an owner of its own user. A root
//!   process is no exception: it joins only root's owners.
//! - The version key names the bytes (a remote object's URL and the pin
//!   its reads are checked against, a file's device, inode, size, modification and
//!   change times), and the owner compares the whole key a process sends,
//!   not its hash.
//! - Socket names are listed to every user (`/proc/net/unix`): they are a
//!   SipHash of the key under the directory's secret, so another user
//!   cannot tell which objects are mapped by checking names.
//! - A set-user-ID or set-group-ID process (`AT_SECURE`) shares nothing:
//!   the environment that names the directory is not its user's.
//!
//! The socket is a `std`-less one (`SOCK_SEQPACKET` has no `std` type),
//! so its system calls are here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The environment variable that chooses the directory.
pub const DIR_ENV: &str = "FAULTMAP_SHARED_DIR";

/// The directory of this user's rendezvous sockets, made if missing, and
/// checked (see the module documentation).
pub(crate) fn dir() -> io::Result<PathBuf> {
    // SAFETY: getauxval reads the process's auxiliary vector.
    if unsafe { libc::getauxval(libc::AT_SECURE) } != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "a set-user-ID or set-group-ID process shares no cache",
        ));
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let dir = match std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            Some(run) if private_to(Path::new(&run), euid).is_ok() => {
                Path::new(&run).join("faultmap")
            }
            _ => PathBuf::from(format!("/tmp/faultmap-{euid}")),
        },
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    private_to(&dir, euid)?;
    Ok(dir)
}

/// Checks that `dir` is a directory (not a symlink) of user `uid` that
/// grants nothing to group or others.
fn private_to(dir: &Path, uid: u32) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    let refuse = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: {why}", dir.display()),
        ))
    };
    if !meta.file_type().is_dir() {
        return refuse("not a directory (a symlink is refused)");
    }
    if meta.uid() != uid {
        return refuse("owned by another user");
    }
    if meta.mode() & 0o077 != 0 {
        return refuse("open to group or others (it must be mode 0700)");
    }
    Ok(())
}

/// How long a process waits to decide (another process of this user
/// holds the directory's lock that long only if it is stopped).
pub(crate) const DECIDE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The directory's lock, held: the one process (and thread) that decides
/// at a time whether to join an owner or to become one, and reads or
/// makes the directory's secret.
pub(crate) struct Decide {
    /// Let go when the file closes (a record lock).
    _file: std::fs::File,
    _thread: std::sync::MutexGuard<'static, ()>,
    secret: [u64; 2],
}

impl Decide {
    /// The socket file name for a version key: its SipHash under the
    /// directory's secret, in hex (the owner compares the whole key, so a
    /// collision only refuses).
    pub(crate) fn name(&self, key: &str) -> String {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher24::new_with_keys(self.secret[0], self.secret[1]);
        h.write(key.as_bytes());
        format!("{:016x}", h.finish())
    }
}

/// Takes the directory's lock (see the module documentation), waiting at
/// most [`DECIDE_WAIT`].
pub(crate) fn decide(dir: &Path) -> io::Result<Decide> {
    static THREADS: super::ForkLocal<std::sync::Mutex<()>> = super::ForkLocal::new();
    let deadline = std::time::Instant::now() + DECIDE_WAIT;
    let threads = THREADS.get_or_init(|| std::sync::Mutex::new(()));
    let thread = loop {
        match threads.try_lock() {
            Ok(guard) => break guard,
            Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "another thread held the lock of {} for {DECIDE_WAIT:?}",
                    dir.display()
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join("lock"))?;
    loop {
        // SAFETY: an all-zero flock is valid; a write lock of the whole
        // file (l_start 0, l_len 0).
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: fcntl F_SETLK with a valid flock, on an open file.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::EACCES) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Some(libc::EAGAIN | libc::EACCES) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "another process held the lock of {} for {DECIDE_WAIT:?}",
                        dir.display()
                    ),
                ))
            }
            _ => return Err(e),
        }
    }
    let secret = secret(dir)?;
    Ok(Decide {
        _file: file,
        _thread: thread,
        secret,
    })
}

/// The directory's secret (made on first use; the caller holds the lock).
/// A secret file of the wrong length (a process died while it wrote one)
/// is made again: no socket name came from it. It is written whole under
/// another name and renamed into place.
fn secret(dir: &Path) -> io::Result<[u64; 2]> {
    use std::io::{Read, Write};
    let path = dir.join("secret");
    let mut bytes = [0u8; 16];
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut file| {
            let mut all = Vec::new();
            file.read_to_end(&mut all)?;
            Ok(all)
        });
    match read {
        Ok(all) if all.len() == bytes.len() => bytes.copy_from_slice(&all),
        Ok(_) | Err(_) => {
            getrandom(&mut bytes)?;
            let fresh = dir.join("secret.new");
            let _ = std::fs::remove_file(&fresh);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&fresh)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&fresh, &path)?;
        }
    }
    let word = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
    Ok([word(0), word(8)])
}

/// Fills `buf` from the kernel's random source.
fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into `buf`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
            continue;
        }
        done += n as usize;
    }
    Ok(())
}

/// Removes the sockets in `dir` that nobody listens on (their owners
/// died without closing their objects), at most `limit` of them. The
/// caller holds the lock.
pub(crate) fn sweep(dir: &Path, limit: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let stale = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .filter(|p| matches!(connect(p), Ok(Connected::Nobody)))
        .take(limit);
    for path in stale {
        let _ = std::fs::remove_file(path);
    }
}

/// `<dir>/<name>.sock`.
pub(crate) fn socket_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: longer than a Unix socket's path may be ({} bytes)",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A `SOCK_SEQPACKET` Unix socket, close-on-exec and non-blocking.
fn seqpacket() -> io::Result<OwnedFd> {
    let kind = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: socket returns a new fd or -1.
    let fd = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What [`connect`] found.
pub(crate) enum Connected {
    /// A connection, non-blocking (its owner may not have taken it in
    /// yet).
    To(OwnedFd),
    /// Nobody listens there: no such file, or a socket its owner left when
    /// it died.
    Nobody,
    /// Someone listens, but its queue of connections is full (it is
    /// stopped, or not taking them in): never waited for.
    Busy,
}

/// Connects to the socket at `path`, without waiting.
pub(crate) fn connect(path: &Path) -> io::Result<Connected> {
    let (addr, len) = sockaddr(path)?;
    let sock = seqpacket()?;
    loop {
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        let rc = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if rc == 0 {
            return Ok(Connected::To(sock));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ENOENT | libc::ECONNREFUSED) => return Ok(Connected::Nobody),
            Some(libc::EAGAIN) => return Ok(Connected::Busy),
            _ => return Err(e),
        }
    }
}

/// Listens at `path` (a stale socket there is removed first: call under
/// [`decide`], after [`connect`] found nobody), mode 0600, non-blocking
/// (the service thread takes connections in as they come).
pub(crate) fn listen(path: &Path) -> io::Result<OwnedFd> {
    let (addr, len) = sockaddr(path)?;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let sock = seqpacket()?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    if unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::chmod(cpath.as_ptr(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on an open socket.
    if unsafe { libc::listen(sock.as_raw_fd(), 64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// Takes one waiting connection from a non-blocking listener: `None` when
/// none is waiting. Close-on-exec and non-blocking.
pub(crate) fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    loop {
        // SAFETY: accept4 with no address; returns a new fd or -1.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just returned this fd to us.
            return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR | libc::ECONNABORTED) => continue,
            Some(libc::EAGAIN) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// The effective user of the process at the other end of `sock`, by the
/// kernel's word (`SO_PEERCRED`: as it was at `connect` or `listen`).
pub(crate) fn peer_uid(sock: &OwnedFd) -> Option<u32> {
    super::share::peer_cred(sock).map(|c| c.uid)
}

/// This process's effective user.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The device and inode of the file at `path` (not following a symlink).
pub(crate) fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes `path` if it is still the file `id` names (the socket this
/// process bound): a successor's socket there is left alone.
pub(crate) fn unlink_if(path: &Path, id: (u64, u64)) {
    if file_id(path) == Some(id) {
        let _ = std::fs::remove_file(path);
    }
}

/// Waits at most `timeout_ms` for `fd` to be readable. Returns false on
/// timeout.
pub(crate) fn wait_readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms as u64);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32) };
        if rc > 0 {
            return true;
        }
        if rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}
