//! Where unrelated processes of one user find the process that owns an
//! object's cache: a directory of the user's own, with a lock file and a
//! listening socket per object version (`crate::mm::guest` hosts, and
//! `crate::api::pager` joins).
//!
//! ```text
//!   $FAULTMAP_SHARED_DIR, or $XDG_RUNTIME_DIR/faultmap, or /tmp/faultmap-<euid>
//!     (a directory owned by this user, mode 0700, not a symlink)
//!       <hash of the version key>.lock   flock'd while a process decides
//!       <hash of the version key>.sock   SOCK_SEQPACKET, mode 0600, listened
//!                                        on by the owner
//! ```
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
//! - The version key names the bytes (a remote object's URL and pinned
//!   ETag or version, a file's device, inode, size and modification time),
//!   and the owner compares the whole key a process sends, not its hash.
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

/// The file names for a version key: a 64-bit FNV-1a hash in hex (the
/// owner compares the whole key, so a collision only refuses).
pub(crate) fn name(key: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// An exclusive `flock` on `<dir>/<name>.lock`, held until dropped (or the
/// process dies): the one process that decides at a time whether to join
/// the socket's owner or to become it.
pub(crate) struct Decide(#[allow(dead_code)] std::fs::File);

pub(crate) fn decide(dir: &Path, name: &str) -> io::Result<Decide> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(format!("{name}.lock")))?;
    loop {
        // SAFETY: flock on an open file.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(Decide(file));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
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

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket returns a new fd or -1.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects to the socket at `path`: `None` if nobody listens there (no
/// such file, or a socket its owner left when it died).
pub(crate) fn connect(path: &Path) -> io::Result<Option<OwnedFd>> {
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
            return Ok(Some(sock));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ENOENT | libc::ECONNREFUSED) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Listens at `path` (a stale socket there is removed first: call under
/// [`decide`], after [`connect`] found nobody), mode 0600, non-blocking.
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
    // SAFETY: listen and fcntl on an open socket.
    unsafe {
        if libc::listen(sock.as_raw_fd(), 64) != 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = libc::fcntl(sock.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(sock.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
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
