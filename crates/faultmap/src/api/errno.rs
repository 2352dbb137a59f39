//! The `errno` a faultmap error stands for, for bindings that speak in
//! error numbers (the C API's negative return codes, Python's `OSError`
//! subclasses).
//!
//! The first operating-system error in the error's source chain wins (a
//! missing file is `ENOENT`, a denied one `EACCES`, as `open(2)` says);
//! faultmap's own typed errors that carry none map to the nearest number:
//! a directory is `EISDIR`, a remote object that does not exist `ENOENT`,
//! a bad argument or setting `EINVAL`, a kernel without a needed feature
//! `ENOSYS`, an object too large to cache `EFBIG`, and anything else `EIO`.
//! Errors marked `#[error(transparent)]` (`MapError::Store`, `PagerError::Config`,
//! ...) hand their inner error's *source* to `source()`, skipping the inner
//! error itself, so they are looked into here.

use std::error::Error;
use std::io;

use crate::store::StoreError;
use crate::{CacheError, ConfigError, MapError, PagerError, TraceError};

/// The error number `err` stands for (positive, as in `errno`).
pub fn errno_of(err: &(dyn Error + 'static)) -> i32 {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(n) = typed(e) {
            return n;
        }
        if let Some(os) = e
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return os;
        }
        next = e.source();
    }
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return from_kind(io.kind());
        }
        next = e.source();
    }
    libc::EIO
}

/// The number of one of faultmap's typed errors that says more than its
/// source would, if it is one.
fn typed(e: &(dyn Error + 'static)) -> Option<i32> {
    if e.downcast_ref::<ConfigError>().is_some() {
        return Some(libc::EINVAL);
    }
    if let Some(p) = e.downcast_ref::<PagerError>() {
        return match p {
            PagerError::Config(_) => Some(libc::EINVAL),
            PagerError::MissingFeature { .. } | PagerError::PageSize => Some(libc::ENOSYS),
            _ => None,
        };
    }
    match e.downcast_ref::<CacheError>() {
        Some(CacheError::TooLarge { .. }) => return Some(libc::EFBIG),
        Some(CacheError::HugePages { .. }) => return Some(libc::ENOMEM),
        _ => {}
    }
    if let Some(m) = e.downcast_ref::<MapError>() {
        return match m {
            MapError::ReadOnlyStore { .. } => Some(libc::EROFS),
            MapError::Options(_) => Some(libc::EINVAL),
            MapError::MissingIoctl { .. } => Some(libc::ENOSYS),
            MapError::PageSize { .. } => Some(libc::EINVAL),
            MapError::Read { .. } => Some(libc::EIO),
            // Transparent: their `source` is the inner error's source,
            // which would skip the inner error itself.
            MapError::Store(inner) => Some(errno_of(inner)),
            MapError::Cache(inner) => Some(errno_of(inner)),
            MapError::Trace(inner) => Some(errno_of(inner)),
            _ => None,
        };
    }
    if let Some(t) = e.downcast_ref::<TraceError>() {
        return match t {
            // A trace that is not one, or not this object's: a bad
            // argument.
            TraceError::Format { .. } | TraceError::Mismatch { .. } => Some(libc::EINVAL),
            TraceError::Io { .. } => None,
        };
    }
    let s = e.downcast_ref::<StoreError>()?;
    Some(match s {
        StoreError::NotAFile { kind, .. } if *kind == "directory" => libc::EISDIR,
        StoreError::NotAFile { .. } | StoreError::PseudoFile { .. } => libc::EINVAL,
        StoreError::UnknownSize { .. } => libc::EINVAL,
        StoreError::OutOfRange { .. } => libc::EINVAL,
        StoreError::ReadOnly { .. } => libc::EROFS,
        #[cfg(not(loom))]
        StoreError::Remote { kind, .. } => remote(kind),
        // A cache directory another user owns or others may write to.
        #[cfg(not(loom))]
        StoreError::DiskCache(crate::DiskCacheError::Unsafe { .. }) => libc::EACCES,
        #[cfg(not(loom))]
        StoreError::DiskCache(crate::DiskCacheError::NotADirectory { .. }) => libc::ENOTDIR,
        _ => return None,
    })
}

#[cfg(not(loom))]
fn remote(kind: &crate::RemoteErrorKind) -> i32 {
    use crate::RemoteErrorKind as K;
    match kind {
        K::BadUrl(_) => libc::EINVAL,
        K::NotFound | K::NoSuchBucket => libc::ENOENT,
        K::AccessDenied => libc::EACCES,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::Dns => libc::EHOSTUNREACH,
        K::Tls => libc::EPROTO,
        K::Timeout => libc::ETIMEDOUT,
        K::RangesNotSupported | K::NoValidator => libc::EOPNOTSUPP,
        K::Changed => libc::ESTALE,
        K::Throttled => libc::EAGAIN,
        K::ServerError | K::Transfer | K::Other => libc::EIO,
    }
}

/// The number of an I/O error that carries no OS error.
fn from_kind(kind: io::ErrorKind) -> i32 {
    use io::ErrorKind as K;
    match kind {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::InvalidInput | K::InvalidData => libc::EINVAL,
        K::TimedOut => libc::ETIMEDOUT,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::UnexpectedEof => libc::EIO,
        K::OutOfMemory => libc::ENOMEM,
        K::Unsupported => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::FileStore;

    #[test]
    fn open_errors_give_the_os_number_and_typed_ones_theirs() {
        let missing = FileStore::open("/nonexistent/faultmap-errno").unwrap_err();
        assert_eq!(errno_of(&missing), libc::ENOENT);
        let dir = FileStore::open("/").unwrap_err();
        assert_eq!(errno_of(&dir), libc::EISDIR);
        let map: MapError = dir.into();
        assert_eq!(errno_of(&map), libc::EISDIR);
        let Err(bad) = crate::open_url("gopher://example.invalid/x") else {
            panic!("a gopher URL opened");
        };
        assert_eq!(errno_of(&bad), libc::EINVAL);
        let plain = io::Error::new(io::ErrorKind::PermissionDenied, "no");
        assert_eq!(errno_of(&plain), libc::EACCES);
        assert_eq!(errno_of(&io::Error::other("?")), libc::EIO);
        let config = crate::Pager::new(crate::Config::default().io_threads(100_000)).unwrap_err();
        assert_eq!(errno_of(&config), libc::EINVAL);
        let huge = crate::cache::Cache::new("huge", u64::MAX, crate::PageSize::Base, None)
            .err()
            .unwrap();
        assert_eq!(errno_of(&huge), libc::EFBIG);
    }
}
