//! What the HTTP and S3 stores share: a pinned remote object read with
//! conditional ranged GETs through the `object_store` client, on one small
//! tokio runtime.
//!
//! **Why `object_store`.** It is the Arrow project's client for S3-style
//! stores and plain HTTP: ranged GETs, SigV4 signing, the standard AWS
//! environment, connection pooling and TLS (rustls). faultmap writes no
//! HTTP client or signer of its own. Its own retry loop is switched off
//! (`max_retries = 0`): a failed request goes back to faultmap's I/O layer,
//! which retries it with its own policy (`Config::io_retries`, with
//! backoff) and its own timeout (`Config::io_timeout`), the same for every
//! store.
//!
//! **The runtime.** The client is asynchronous. One process-wide runtime
//! with two worker threads (`faultmap-net`) drives every remote request,
//! so that a pager keeps many requests in flight without an OS thread
//! each ([`Store::start_read`](super::Store::start_read)). It is built on first use and never
//! dropped: a runtime may not be dropped from one of its own threads, and
//! the last reference to a store can be let go anywhere.
//!
//! **Consistency.** An object must not change under a mapping. At open the
//! store pins the object's version: its length and ETag (and version id
//! where the service has one). Every ranged GET then carries `If-Match`
//! with that ETag, so a changed object answers `412 Precondition Failed`
//! and its unread pages fail ([`RemoteErrorKind::Changed`]); bytes of two
//! versions are never mixed. Each response is also checked against the pin
//! (ETag, Last-Modified, length and range), so a server that ignores the
//! condition is caught too; a response without the pinned ETag is a
//! change. (A weak ETag, `W/"..."`, is not sent as `If-Match`, which
//! compares strongly; it is checked against each answer only.) A server that sends no ETag (versitygw for files put in its
//! folder by hand, some HTTP servers) is pinned by length and
//! `Last-Modified` alone, checked on every response: weaker, since a
//! rewrite within the same second that keeps the length goes unseen. No
//! condition is sent then: `If-Unmodified-Since` has one-second precision
//! on the wire, and servers that compare it with finer modification times
//! refuse an unchanged object.
//!
//! An object with **neither** validator cannot be pinned at all. The
//! client fills a missing `Last-Modified` with the epoch, in the `HEAD` and
//! in every GET alike, so comparing those would always pass: such an
//! object is refused at open ([`RemoteErrorKind::NoValidator`]) unless the
//! caller opts in to an unpinned mapping
//! ([`RemoteTuning::allow_unpinned`]), where a change goes unseen and two
//! versions may be mixed. A defaulted (epoch) `Last-Modified` never counts
//! as a match.
//!
//! **Opening.** One deadline ([`RemoteTuning::open_timeout`]) bounds the
//! whole open: the `HEAD`, its retries and the one-byte range probe. A
//! transient failure other than a timeout is tried again while the
//! deadline allows ([`RemoteTuning::open_retries`]); a timeout is not, so
//! a server that never answers fails the open after the deadline, once.
//!
//! **Secrets.** Credentials never appear in an error, a log line, `Debug`
//! output or JSON: the stores' `Debug` prints the URL and the pin only,
//! URLs with user information are refused, and every message that comes
//! from the client passes through [`Secrets::scrub`] first.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt};

use super::{check_range, ReadBuf, ReadDone, StoreError};
use crate::base::config::{Config, DEFAULT_IO_RETRIES, DEFAULT_IO_TIMEOUT};
use crate::base::report::error_text;
use crate::sys;

/// What went wrong with a remote object, for [`StoreError::Remote`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemoteErrorKind {
    /// The URL is not one faultmap can open (the reason says why).
    BadUrl(&'static str),
    /// The server has no such object (HTTP 404, S3 `NoSuchKey`).
    NotFound,
    /// The bucket does not exist (S3 `NoSuchBucket`).
    NoSuchBucket,
    /// The server refused the credentials or the request (HTTP 401/403).
    AccessDenied,
    /// Nothing listens at the host and port.
    ConnectionRefused,
    /// The host name does not resolve.
    Dns,
    /// The TLS handshake failed (not a TLS server, or a certificate that is
    /// not trusted).
    Tls,
    /// The request took longer than the store's request timeout.
    Timeout,
    /// The server answered a ranged GET with the whole object: it does not
    /// honour range requests.
    RangesNotSupported,
    /// The object changed since it was opened (its ETag or
    /// `Last-Modified` no longer matches): its unread pages fail.
    Changed,
    /// The server sends neither an ETag nor a `Last-Modified` for the
    /// object, so a change while it is mapped could not be seen: refused
    /// at open unless [`RemoteTuning::allow_unpinned`] is set.
    NoValidator,
    /// The server is throttling requests (HTTP 503 `SlowDown`, 429).
    Throttled,
    /// The server failed (HTTP 5xx other than throttling).
    ServerError,
    /// The connection broke, or the body did not match the request (cut
    /// short, too long, another range).
    Transfer,
    /// Anything else the client reported.
    Other,
}

impl RemoteErrorKind {
    /// Whether trying the request again may help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout
                | Self::Throttled
                | Self::ServerError
                | Self::Transfer
                | Self::ConnectionRefused
        )
    }
}

impl fmt::Display for RemoteErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadUrl(why) => write!(f, "not a URL faultmap can open: {why}"),
            Self::NotFound => f.write_str("no such object"),
            Self::NoSuchBucket => f.write_str("no such bucket"),
            Self::AccessDenied => f.write_str("access denied (check the credentials and the object's permissions)"),
            Self::ConnectionRefused => f.write_str("connection refused (is the server running?)"),
            Self::Dns => f.write_str("the host name does not resolve"),
            Self::Tls => f.write_str("the TLS handshake failed"),
            Self::Timeout => f.write_str("the request timed out"),
            Self::RangesNotSupported => f.write_str("the server does not honour range requests"),
            Self::Changed => f.write_str(
                "the object changed since it was opened (its ETag or Last-Modified no longer matches)",
            ),
            Self::NoValidator => f.write_str(
                "the server sends neither an ETag nor a Last-Modified for the object, so a change \
                 while it is mapped could not be detected and two versions could be mixed; to map \
                 it anyway, allow unpinned objects (RemoteTuning::allow_unpinned, Python \
                 allow_unpinned=True, C FM_ALLOW_UNPINNED)",
            ),
            Self::Throttled => f.write_str("the server is throttling requests (503 SlowDown / 429)"),
            Self::ServerError => f.write_str("server error"),
            Self::Transfer => f.write_str("the transfer failed"),
            Self::Other => f.write_str("request failed"),
        }
    }
}

/// Strings that must never leave the process in a message.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Vec<String>);

impl Secrets {
    /// Adds `value` (ignored when empty or too short to be a secret worth
    /// hiding and too likely to appear by chance).
    pub(crate) fn add(&mut self, value: Option<String>) {
        if let Some(v) = value.filter(|v| v.len() >= 4) {
            self.0.push(v);
        }
    }

    /// `text` without the parts of a server's answer that echo the
    /// request ([`drop_echoes`]), and with every secret replaced by
    /// `***`, the longest first (a secret that holds another is hidden
    /// whole).
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut secrets: Vec<&String> = self.0.iter().collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets
            .into_iter()
            .fold(drop_echoes(text), |t, s| t.replace(s.as_str(), "***"))
    }
}

/// The runtime that drives every remote request (see the module doc): one
/// per fork generation ([`crate::sys::fork_generation`]). A forked child
/// does not have its parent's runtime threads, so it builds a runtime of
/// its own; the parent's is leaked there, never dropped (its drop would
/// wait for those threads).
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, io::Error> {
    static RUNTIME: sys::ForkLocal<tokio::runtime::Runtime> = sys::ForkLocal::new();
    RUNTIME.get_or_try_init(
        || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(NET_THREAD)
                .enable_all()
                .build()
        },
        // Another thread published first: ours is shut down without
        // waiting (a plain drop panics in another runtime's async context,
        // where `block_on` may be called).
        tokio::runtime::Runtime::shutdown_background,
    )
}

/// The name of the runtime's threads.
const NET_THREAD: &str = "faultmap-net";

/// Runs `future` on the runtime and waits for it, from any thread
/// (including one of another runtime's: the future runs on ours), except
/// one of the runtime's own: waiting there could take the last thread the
/// future needs (a `ReadDone` that reads synchronously), so it is an
/// error.
pub(crate) fn block_on<T: Send + 'static>(
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, io::Error> {
    if std::thread::current().name() == Some(NET_THREAD) {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "a synchronous remote read from the network runtime's own thread (a ReadDone \
             callback?) would wait for itself: use Store::start_read there",
        ));
    }
    let rt = runtime()?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv()
        .map_err(|_| io::Error::other("the network runtime dropped a request"))
}

/// Request sizes and windows a remote store asks the fault path for, its
/// timeouts, and the disk cache it reads through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteTuning {
    /// The largest ranged GET, in bytes (default 8 MiB: S3's guidance for
    /// sequential reads is 8 to 16 MiB per request).
    pub request_bytes: u64,
    /// The default readahead window, in bytes (default 64 MiB, the most a
    /// window may be: eight requests in flight per stream, enough to keep
    /// a link of a few GB/s busy across a 20 ms first-byte latency). The
    /// memory budget, when there is one, shrinks it.
    pub readahead_bytes: u64,
    /// The window read around a random miss under full readahead, in bytes
    /// (default 1 MiB: about a millisecond of transfer against a round trip
    /// of tens of milliseconds; a stream that starts there ramps up to
    /// `readahead_bytes`). Read-around alone (`ReadaheadMode::AroundOnly`)
    /// reads `readahead_bytes` around every miss.
    pub around_bytes: u64,
    /// How long one request may take, connecting included (default 30 s).
    pub request_timeout: Duration,
    /// How long connecting may take (default 5 s).
    pub connect_timeout: Duration,
    /// The deadline of the whole open: the `HEAD`, its retries and the
    /// range probe (default 30 s). A timeout at open is not tried again.
    pub open_timeout: Duration,
    /// How many times a transient failure at open, other than a timeout,
    /// is tried again within `open_timeout` (default 2).
    pub open_retries: u32,
    /// Whether an object whose server sends neither an ETag nor a
    /// `Last-Modified` may be opened (default `false`: it is refused with
    /// [`RemoteErrorKind::NoValidator`]). Such an object is read unpinned:
    /// if it changes while mapped, pages of two versions are mixed
    /// unseen.
    pub allow_unpinned: bool,
    /// The disk cache that [`open_url_with`](super::open_url_with) puts
    /// in front of the object (default `None`: none;
    /// [`RemoteTuning::for_config`] takes the pager's,
    /// [`Config::disk_cache`]). An object opened unpinned is never cached.
    pub disk_cache: Option<crate::base::config::DiskCacheConfig>,
}

impl Default for RemoteTuning {
    fn default() -> Self {
        Self {
            request_bytes: 8 << 20,
            readahead_bytes: 64 << 20,
            around_bytes: 1 << 20,
            request_timeout: DEFAULT_IO_TIMEOUT,
            connect_timeout: MAX_CONNECT_TIMEOUT,
            open_timeout: DEFAULT_IO_TIMEOUT,
            open_retries: DEFAULT_IO_RETRIES,
            allow_unpinned: false,
            disk_cache: None,
        }
    }
}

/// The longest a connection may take to set up.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl RemoteTuning {
    /// The default tuning under `config`'s I/O settings: each request, and
    /// the whole open, within `io_timeout` (connecting within the lesser
    /// of it and 5 s); a transient failure at open tried `io_retries`
    /// times, as a read's is.
    pub fn for_config(config: &Config) -> Self {
        Self {
            request_timeout: config.io_timeout,
            connect_timeout: config.io_timeout.min(MAX_CONNECT_TIMEOUT),
            open_timeout: config.io_timeout,
            open_retries: config.io_retries,
            disk_cache: config.disk_cache.clone(),
            ..Self::default()
        }
    }

    /// The read-around window in pages (the store's `around_pages`).
    pub(crate) fn around_pages(&self) -> u64 {
        (self.around_bytes / crate::sys::PAGE_SIZE as u64).max(1)
    }

    /// The readahead window in pages (the store's `ra_pages`).
    pub(crate) fn ra_pages(&self) -> u64 {
        (self.readahead_bytes / crate::sys::PAGE_SIZE as u64)
            .clamp(1, crate::base::config::MAX_RA_PAGES)
    }

    /// The largest request in pages (the store's `io_pages`).
    pub(crate) fn io_pages(&self) -> u64 {
        (self.request_bytes / crate::sys::PAGE_SIZE as u64).max(1)
    }

    /// The client options these timeouts ask for.
    pub(crate) fn client_options(&self, allow_http: bool) -> object_store::ClientOptions {
        object_store::ClientOptions::new()
            .with_allow_http(allow_http)
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.connect_timeout)
    }

    /// No retries inside the client: faultmap's I/O layer retries.
    pub(crate) fn retry_config(&self) -> object_store::RetryConfig {
        object_store::RetryConfig {
            max_retries: 0,
            retry_timeout: self.request_timeout,
            ..Default::default()
        }
    }
}

/// `Store` (every method the [`Remote`]'s in the type's `remote` field)
/// and a `Debug` that shows the URL and the pin, never a credential, for
/// one of the remote stores.
macro_rules! remote_store {
    ($name:ident) => {
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($name))
                    .field(&self.remote)
                    .finish()
            }
        }

        impl $crate::store::Store for $name {
            fn name(&self) -> &str {
                self.remote.url()
            }

            fn len(&self) -> u64 {
                self.remote.len()
            }

            fn ra_pages(&self) -> u64 {
                self.remote.tuning().ra_pages()
            }

            fn around_pages(&self) -> Option<u64> {
                Some(self.remote.tuning().around_pages())
            }
            fn io_pages(&self) -> u64 {
                self.remote.tuning().io_pages()
            }

            fn link(&self) -> Option<$crate::store::Link> {
                Some(self.remote.link())
            }

            fn version(&self) -> Option<String> {
                Some(self.remote.version())
            }

            fn share_key(&self) -> Option<String> {
                self.remote.share_key()
            }

            fn disk_cache_key(&self) -> Option<String> {
                self.remote.disk_cache_key()
            }

            fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
                self.remote.read_blocking(offset, buf)
            }

            fn start_read(
                &self,
                offset: u64,
                buf: $crate::store::ReadBuf,
                done: $crate::store::ReadDone,
            ) {
                self.remote.start_read(offset, buf, done)
            }
        }
    };
}
pub(crate) use remote_store;

/// The first backoff before a `HEAD` at open is tried again; it doubles
/// with each retry, up to [`OPEN_BACKOFF_MAX`].
const OPEN_BACKOFF: Duration = Duration::from_millis(20);

/// The longest backoff between two tries of the `HEAD` at open.
const OPEN_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A remote object pinned at open: the client, its path, its version.
pub(crate) struct Remote {
    client: Arc<dyn ObjectStore>,
    path: Path,
    /// The URL as shown in messages (no credentials: see `url_for_display`).
    url: String,
    /// The version pinned at open.
    pin: ObjectMeta,
    secrets: Secrets,
    tuning: RemoteTuning,
    /// Where the object lives beyond its URL ([`Remote::with_origin`]).
    origin: String,
    /// What its requests have cost so far.
    meter: Arc<LinkMeter>,
}

/// The bandwidth a store's [`Link`](super::Link) reports before a body
/// large enough to measure it has arrived: 100 MB/s, about what one
/// connection to a cloud object store moves. Low on purpose: it only sets
/// how large a hole batched prefetch reads rather than skip.
const DEFAULT_BYTES_PER_SEC: u64 = 100_000_000;

/// The bytes of bodies the link must have moved before their rate is
/// trusted: less is all latency and scheduling.
const MIN_BANDWIDTH_SAMPLE: u64 = 256 << 10;

/// A remote object's request costs: the first-byte latency, a moving
/// average (each sample weighs an eighth) of every whole GET's, and the
/// link's bandwidth: the bytes of all bodies over the time at least one
/// body was arriving. Not one body's rate: with `d` requests in flight
/// each body gets about a `d`-th of the link, and batched prefetch divides
/// by the requests in flight itself (`policy::coalesce`). The latency is a
/// load and a store (lossy under races: an estimate); the bodies' clock is
/// under a mutex, taken twice per GET.
#[derive(Debug, Default)]
struct LinkMeter {
    /// Nanoseconds; 0: no sample yet.
    latency_ns: std::sync::atomic::AtomicU64,
    bodies: std::sync::Mutex<Bodies>,
}

/// The bodies' clock of a [`LinkMeter`].
#[derive(Debug, Default)]
struct Bodies {
    /// Bodies arriving now.
    open: u32,
    /// Since when at least one has been arriving.
    since: Option<Instant>,
    /// Time with at least one arriving, before `since`.
    busy: Duration,
    /// Bytes of the bodies that ended.
    bytes: u64,
}

impl LinkMeter {
    /// A whole GET's first byte came `first_byte` after it was sent.
    fn record_latency(&self, first_byte: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let sample = (first_byte.as_nanos().min(u64::MAX as u128) as u64).max(1);
        let old = self.latency_ns.load(Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.latency_ns.store(new.max(1), Relaxed);
    }

    fn bodies(&self) -> std::sync::MutexGuard<'_, Bodies> {
        self.bodies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A body starts arriving; the guard says how many bytes it brought
    /// ([`Body::end`]; none if it is dropped: a failed GET).
    fn body(&self) -> Body<'_> {
        let mut b = self.bodies();
        if b.open == 0 {
            b.since = Some(Instant::now());
        }
        b.open += 1;
        Body {
            meter: self,
            bytes: 0,
        }
    }

    fn link(&self) -> super::Link {
        use std::sync::atomic::Ordering::Relaxed;
        let b = self.bodies();
        let busy = b.busy + b.since.map_or(Duration::ZERO, |s| s.elapsed());
        let bytes_per_sec = if b.bytes >= MIN_BANDWIDTH_SAMPLE && !busy.is_zero() {
            // `as` saturates.
            ((b.bytes as f64 / busy.as_secs_f64()) as u64).max(1)
        } else {
            DEFAULT_BYTES_PER_SEC
        };
        super::Link {
            latency: Duration::from_nanos(self.latency_ns.load(Relaxed)),
            bytes_per_sec,
        }
    }
}

/// One body arriving, on a [`LinkMeter`]'s clock.
struct Body<'a> {
    meter: &'a LinkMeter,
    bytes: u64,
}

impl Body<'_> {
    /// The body ended whole, with `bytes` bytes.
    fn end(mut self, bytes: usize) {
        self.bytes = bytes as u64;
    }
}

impl Drop for Body<'_> {
    fn drop(&mut self) {
        let mut b = self.meter.bodies();
        b.bytes = b.bytes.saturating_add(self.bytes);
        b.open = b.open.saturating_sub(1);
        if b.open == 0 {
            if let Some(since) = b.since.take() {
                // A body that failed alone (a stall until the timeout, a
                // reset) says nothing of the link: its time is not kept.
                if self.bytes > 0 {
                    b.busy += since.elapsed();
                }
            }
        }
    }
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("len", &self.pin.size)
            .field("etag", &self.pin.e_tag)
            .field("version", &self.pin.version)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// Opens the object at `path` through `client`, all within
    /// `tuning.open_timeout`: pins its version (`HEAD`), refuses it if it
    /// has no validator (unless allowed), and checks that the server
    /// honours ranges (a one-byte ranged GET, conditional on the pin;
    /// left out when `tuning.disk_cache` holds this version already).
    /// `url` names it in messages.
    pub(crate) fn open(
        client: Arc<dyn ObjectStore>,
        path: Path,
        url: String,
        secrets: Secrets,
        tuning: RemoteTuning,
    ) -> Result<Self, StoreError> {
        let deadline = Deadline::after(tuning.open_timeout);
        let pin = head_pin(&client, &path, &url, &secrets, &tuning, deadline)?;
        if !has_validator(&pin) && !tuning.allow_unpinned {
            return Err(StoreError::Remote {
                url,
                kind: RemoteErrorKind::NoValidator,
                source: None,
            });
        }
        let remote = Self {
            client,
            path,
            url,
            pin,
            secrets,
            tuning,
            origin: String::new(),
            meter: Arc::default(),
        };
        // A disk cache that holds this version was filled from this
        // server by ranges: no need to ask again.
        let known = remote.tuning.disk_cache.as_ref().is_some_and(|cache| {
            super::disk::holds(cache, &remote.url, &remote.version(), remote.pin.size)
        });
        if remote.pin.size > 0 && !known {
            let mut probe = [0u8; 1];
            remote
                .read_within(0, &mut probe, deadline.left())
                .map_err(|e| deadline.name_timeout(e))?;
        }
        Ok(remote)
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Where the object lives beyond its URL (an S3 endpoint and region).
    pub(crate) fn with_origin(mut self, origin: String) -> Self {
        self.origin = origin;
        self
    }

    /// What names this version of the object to other processes
    /// (`Store::share_key`): the pin this process's own reads are checked
    /// against, so a joiner is served the bytes its own reads would have
    /// had. `None` for an object opened with nothing to pin
    /// (`allow_unpinned`).
    /// What names this version to a disk cache (`Store::disk_cache_key`):
    /// the share key, if the pin is byte-exact (a version id, or a strong
    /// ETag).
    pub(crate) fn disk_cache_key(&self) -> Option<String> {
        let strong_etag = self
            .pin
            .e_tag
            .as_ref()
            .is_some_and(|t| !t.starts_with("W/"));
        (self.pin.version.is_some() || strong_etag)
            .then(|| self.share_key())
            .flatten()
    }

    pub(crate) fn share_key(&self) -> Option<String> {
        if !has_validator(&self.pin) {
            return None;
        }
        Some(format!(
            "{} {} {} bytes, {}",
            self.url,
            self.origin,
            self.pin.size,
            self.version()
        ))
    }

    pub(crate) fn len(&self) -> u64 {
        self.pin.size
    }

    pub(crate) fn etag(&self) -> Option<&str> {
        self.pin.e_tag.as_deref()
    }

    /// The pinned version, as [`crate::Store::version`] reports it: the
    /// ETag and the version id, or the Last-Modified time when there is
    /// no ETag.
    pub(crate) fn version(&self) -> String {
        let mut parts = Vec::new();
        if let Some(etag) = &self.pin.e_tag {
            parts.push(format!("etag {etag}"));
        }
        if let Some(id) = &self.pin.version {
            parts.push(format!("version id {id}"));
        }
        if self.pin.e_tag.is_none() {
            parts.push(format!(
                "last-modified {}",
                self.pin.last_modified.to_rfc3339()
            ));
        }
        parts.join(", ")
    }

    pub(crate) fn tuning(&self) -> &RemoteTuning {
        &self.tuning
    }

    /// What its requests have cost so far (the probe at open is the first
    /// sample).
    pub(crate) fn link(&self) -> super::Link {
        self.meter.link()
    }

    /// The GET options of a read of `range`: the range, conditional on the
    /// pinned version.
    fn options(&self, range: Range<u64>) -> GetOptions {
        // Without an ETag, no condition is sent: `If-Unmodified-Since` has
        // one-second precision on the wire, and servers compare it with
        // finer modification times (versitygw answers 412 to an unchanged
        // object). Each response's Last-Modified and length are checked
        // against the pin instead (`check_pin`).
        GetOptions {
            range: Some(GetRange::Bounded(range)),
            // `If-Match` compares strongly: a weak ETag (`W/"..."`) would
            // fail it on an unchanged object. A weak one is checked against
            // each answer only.
            if_match: self.pin.e_tag.clone().filter(|t| !t.starts_with("W/")),
            version: self.pin.version.clone(),
            ..GetOptions::default()
        }
    }

    /// Reads `[offset, offset + buf.len())` into `buf`, waiting.
    pub(crate) fn read_blocking(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.read_within(offset, buf, self.tuning.request_timeout)
    }

    /// [`Self::read_blocking`], failing with a timeout after `timeout`.
    fn read_within(
        &self,
        offset: u64,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<(), StoreError> {
        check_range(&self.url, self.pin.size, offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let buffer = ReadBuf::from(vec![0u8; buf.len()]);
        let read = self.read_future(offset, buffer, timeout);
        let (mut owned, result) = block_on(read).map_err(|e| runtime_error(&self.url, e))?;
        result?;
        buf.copy_from_slice(owned.as_mut_slice());
        Ok(())
    }

    /// Starts reading `[offset, offset + buf.len())` into `buf` on the
    /// runtime; `done` gets the buffer and the result there.
    pub(crate) fn start_read(&self, offset: u64, buf: ReadBuf, done: ReadDone) {
        if let Err(e) = check_range(&self.url, self.pin.size, offset, buf.len()) {
            return done(buf, Err(e));
        }
        if buf.is_empty() {
            return done(buf, Ok(()));
        }
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => return done(buf, Err(runtime_error(&self.url, e))),
        };
        let read = self.read_future(offset, buf, self.tuning.request_timeout);
        rt.spawn(async move {
            let (buf, result) = read.await;
            done(buf, result);
        });
    }

    /// The future of one ranged GET into `buf`, which fails with a timeout
    /// after `timeout`: `'static`, it owns what it needs (the client, the
    /// pin, the buffer).
    fn read_future(
        &self,
        offset: u64,
        mut buf: ReadBuf,
        timeout: Duration,
    ) -> impl std::future::Future<Output = (ReadBuf, Result<(), StoreError>)> + Send + 'static {
        let client = self.client.clone();
        let path = self.path.clone();
        let url = self.url.clone();
        let secrets = self.secrets.clone();
        let pin = self.pin.clone();
        let meter = self.meter.clone();
        let range = offset..offset + buf.len() as u64;
        let options = self.options(range.clone());
        async move {
            let fetch = fetch_into(
                &*client,
                &path,
                options,
                range,
                &pin,
                buf.as_mut_slice(),
                &meter,
            );
            let result = match tokio::time::timeout(timeout, fetch).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(failure)) => Err(failure.into_store_error(&url, &secrets)),
                Err(_) => Err(StoreError::Remote {
                    url: url.clone(),
                    kind: RemoteErrorKind::Timeout,
                    source: None,
                }),
            };
            (buf, result)
        }
    }
}

/// Why one ranged GET failed.
enum Failure {
    /// The client failed.
    Client(object_store::Error),
    /// The response did not match the request.
    Mismatch(RemoteErrorKind, String),
}

impl Failure {
    fn into_store_error(self, url: &str, secrets: &Secrets) -> StoreError {
        match self {
            Failure::Client(e) => {
                let kind = classify(&e);
                StoreError::Remote {
                    url: url.to_string(),
                    kind,
                    source: Some(io::Error::other(secrets.scrub(&error_text(&e)))),
                }
            }
            Failure::Mismatch(kind, detail) => StoreError::Remote {
                url: url.to_string(),
                kind,
                source: Some(io::Error::other(detail)),
            },
        }
    }
}

/// One ranged GET of `range` into `buf` (exactly `range`'s length),
/// checked against the pin: the same ETag, the range asked for, and
/// exactly as many bytes. A whole answer is a sample for `meter`.
async fn fetch_into(
    client: &dyn ObjectStore,
    path: &Path,
    options: GetOptions,
    range: Range<u64>,
    pin: &ObjectMeta,
    buf: &mut [u8],
    meter: &LinkMeter,
) -> Result<(), Failure> {
    let sent = Instant::now();
    let result = client
        .get_opts(path, options)
        .await
        .map_err(Failure::Client)?;
    // The client returns once the headers are in: the first byte.
    let first_byte = sent.elapsed();
    let body = meter.body();
    check_pin(pin, &result.meta)?;
    if result.range != range {
        return Err(Failure::Mismatch(
            RemoteErrorKind::Transfer,
            format!(
                "asked for bytes {}..{}, got {}..{}",
                range.start, range.end, result.range.start, result.range.end
            ),
        ));
    }
    let mut stream = result.into_stream();
    let mut filled = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(Failure::Client)?;
        let end = filled + chunk.len();
        let Some(dest) = buf.get_mut(filled..end) else {
            return Err(Failure::Mismatch(
                RemoteErrorKind::Transfer,
                format!("the body is longer than the {} bytes asked for", buf.len()),
            ));
        };
        dest.copy_from_slice(&chunk);
        filled = end;
    }
    if filled != buf.len() {
        return Err(Failure::Mismatch(
            RemoteErrorKind::Transfer,
            format!("the body ended after {filled} of {} bytes", buf.len()),
        ));
    }
    body.end(filled);
    meter.record_latency(first_byte);
    Ok(())
}

/// Whether a response's object is the pinned version, and the same
/// length: the pinned ETag, if there is one (a response without it is a
/// change); else the pinned Last-Modified, which a response must carry (a
/// defaulted one never matches). An unpinned object (no validator at
/// open, allowed by the caller) is checked by its length alone.
fn check_pin(pin: &ObjectMeta, got: &ObjectMeta) -> Result<(), Failure> {
    let changed = match (&pin.e_tag, &got.e_tag) {
        (Some(pinned), Some(now)) => {
            (pinned != now).then(|| format!("ETag {now}, pinned {pinned}"))
        }
        (Some(pinned), None) => Some(format!("no ETag, pinned {pinned}")),
        (None, _) if !has_validator(pin) => None,
        (None, _) if !has_last_modified(got) => {
            Some(format!("no Last-Modified, pinned {}", pin.last_modified))
        }
        (None, _) => (pin.last_modified != got.last_modified).then(|| {
            format!(
                "Last-Modified {}, pinned {}",
                got.last_modified, pin.last_modified
            )
        }),
    };
    let changed = changed.or_else(|| {
        (pin.size != got.size).then(|| format!("{} bytes long, pinned at {}", got.size, pin.size))
    });
    match changed {
        Some(detail) => Err(Failure::Mismatch(RemoteErrorKind::Changed, detail)),
        None => Ok(()),
    }
}

/// Whether the server sent a `Last-Modified` with `meta`: the client
/// fills a missing one with the epoch, which no real object on a server
/// faultmap reads carries.
fn has_last_modified(meta: &ObjectMeta) -> bool {
    meta.last_modified.timestamp_nanos_opt() != Some(0)
}

/// Whether `meta` can pin a version: it has an ETag or a `Last-Modified`.
fn has_validator(meta: &ObjectMeta) -> bool {
    meta.e_tag.is_some() || has_last_modified(meta)
}

/// The deadline of an open.
#[derive(Clone, Copy)]
struct Deadline {
    /// `None`: too far to be represented, so none.
    at: Option<Instant>,
    whole: Duration,
}

/// A timeout with this little of the deadline left is the deadline's.
const DEADLINE_SLACK: Duration = Duration::from_millis(50);

impl Deadline {
    fn after(whole: Duration) -> Self {
        Self {
            at: Instant::now().checked_add(whole),
            whole,
        }
    }

    /// What is left of it.
    fn left(&self) -> Duration {
        self.at.map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// The error of an open that ran out of time.
    fn timeout(&self, url: &str) -> StoreError {
        StoreError::Remote {
            url: url.to_string(),
            kind: RemoteErrorKind::Timeout,
            source: Some(io::Error::other(format!(
                "no answer within the open deadline of {:?}",
                self.whole
            ))),
        }
    }

    /// `e`, said to be the open's deadline if it is a timeout that came
    /// when the deadline ran out (a request's or a connection's own,
    /// shorter, timeout keeps its own words).
    fn name_timeout(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Remote {
                url,
                kind: RemoteErrorKind::Timeout,
                ..
            } if self.left() <= DEADLINE_SLACK => self.timeout(&url),
            other => other,
        }
    }
}

/// The `HEAD` of an open, within `deadline`: a transient failure (5xx,
/// throttling, a reset) is tried again up to `tuning.open_retries` times,
/// with backoff, while the deadline allows; a timeout, or any other
/// failure, fails the open at once.
fn head_pin(
    client: &Arc<dyn ObjectStore>,
    path: &Path,
    url: &str,
    secrets: &Secrets,
    tuning: &RemoteTuning,
    deadline: Deadline,
) -> Result<ObjectMeta, StoreError> {
    let mut backoff = OPEN_BACKOFF;
    let mut attempt = 0;
    loop {
        let (c, p, left) = (client.clone(), path.clone(), deadline.left());
        let head = block_on(async move { tokio::time::timeout(left, c.head(&p)).await })
            .map_err(|e| runtime_error(url, e))?;
        let e = match head {
            Ok(Ok(meta)) => return Ok(meta),
            Ok(Err(e)) => e,
            Err(_elapsed) => return Err(deadline.timeout(url)),
        };
        let kind = classify(&e);
        let again = attempt < tuning.open_retries
            && kind.is_transient()
            && kind != RemoteErrorKind::Timeout
            && backoff < deadline.left();
        if !again {
            let e = classify_open(client, path, url, secrets, e, deadline);
            return Err(deadline.name_timeout(e));
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(OPEN_BACKOFF_MAX);
        attempt += 1;
    }
}

/// What kind of failure `e` is: typed first (the client's variants, an
/// `io::Error` in the chain), then by the words of the chain (DNS and TLS
/// failures reach us only as text through `reqwest` and `hyper`).
pub(crate) fn classify(e: &object_store::Error) -> RemoteErrorKind {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } if error_text(e).contains("NoSuchBucket") => {
            return RemoteErrorKind::NoSuchBucket
        }
        E::NotFound { .. } => return RemoteErrorKind::NotFound,
        E::Precondition { .. } | E::NotModified { .. } => return RemoteErrorKind::Changed,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            return RemoteErrorKind::AccessDenied
        }
        E::NotSupported { .. } if error_text(e).contains("Range") => {
            return RemoteErrorKind::RangesNotSupported
        }
        _ => {}
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(http) = s.downcast_ref::<object_store::client::HttpError>() {
            use object_store::client::HttpErrorKind as K;
            match http.kind() {
                K::Timeout => return RemoteErrorKind::Timeout,
                K::Request | K::Interrupted | K::Decode => return RemoteErrorKind::Transfer,
                // Connect: refused, DNS or TLS, told apart below.
                _ => {}
            }
        }
        if let Some(io) = s.downcast_ref::<io::Error>() {
            match io.kind() {
                io::ErrorKind::ConnectionRefused => return RemoteErrorKind::ConnectionRefused,
                io::ErrorKind::TimedOut => return RemoteErrorKind::Timeout,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof => return RemoteErrorKind::Transfer,
                _ => {}
            }
        }
        source = s.source();
    }
    let text = error_text(e);
    if let Some(status) = status_code(&text) {
        return match status {
            401 | 403 => RemoteErrorKind::AccessDenied,
            404 if text.contains("NoSuchBucket") => RemoteErrorKind::NoSuchBucket,
            404 => RemoteErrorKind::NotFound,
            412 => RemoteErrorKind::Changed,
            429 | 503 => RemoteErrorKind::Throttled,
            500..=599 => RemoteErrorKind::ServerError,
            _ => RemoteErrorKind::Other,
        };
    }
    // The words of the chain, without its URLs: a host, bucket or key
    // named "tls-certificates" must not make a reset look like a TLS
    // failure.
    let text = strip_urls(&text).to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if has(&[
        "dns error",
        "failed to lookup address",
        "name or service not known",
    ]) {
        RemoteErrorKind::Dns
    } else if has(&[
        "tls",
        "certificate",
        "invalidcontenttype",
        "corrupt message",
        "handshake",
    ]) {
        RemoteErrorKind::Tls
    } else if has(&["connection refused"]) {
        RemoteErrorKind::ConnectionRefused
    } else if has(&["timed out", "timeout"]) {
        RemoteErrorKind::Timeout
    } else if has(&[
        "connection reset",
        "connection closed",
        "incomplete",
        "broken pipe",
        "unexpected eof",
        "error reading a body",
        "error decoding response body",
        "end of file before message length reached",
    ]) {
        RemoteErrorKind::Transfer
    } else {
        RemoteErrorKind::Other
    }
}

/// `text` without the URLs in it (each `http://...` or `https://...` up
/// to the next blank).
fn strip_urls(text: &str) -> String {
    text.split(' ')
        .filter(|w| !w.starts_with("http://") && !w.starts_with("https://"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A server's error body without what echoes the request: S3's
/// `SignatureDoesNotMatch` answer repeats the canonical request (which
/// holds the session token) and the string to sign, as text and as hex.
pub(crate) fn drop_echoes(text: &str) -> String {
    const ECHOES: [&str; 5] = [
        "CanonicalRequest",
        "CanonicalRequestBytes",
        "StringToSign",
        "StringToSignBytes",
        "SignatureProvided",
    ];
    let mut out = text.to_string();
    for tag in ECHOES {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        while let Some(start) = out.find(&open) {
            let end = out[start..]
                .find(&close)
                .map_or(out.len(), |e| start + e + close.len());
            out.replace_range(start..end, "");
        }
    }
    out
}

/// The HTTP status of a failed request, from the client's words ("...
/// status code: 503 Service Unavailable ..."): its error type that holds
/// the status is not public.
fn status_code(text: &str) -> Option<u16> {
    const MARK: &str = "status code: ";
    let at = text.find(MARK)? + MARK.len();
    text.get(at..at + 3)?.parse().ok()
}

/// The error of a failed open: `NoSuchBucket` is told apart from a
/// missing key by a GET (a `HEAD` answers both with a bare 404).
fn classify_open(
    client: &Arc<dyn ObjectStore>,
    path: &Path,
    url: &str,
    secrets: &Secrets,
    e: object_store::Error,
    deadline: Deadline,
) -> StoreError {
    let mut kind = classify(&e);
    let mut detail = error_text(&e);
    if kind == RemoteErrorKind::NotFound {
        let (c, p, left) = (client.clone(), path.clone(), deadline.left());
        let options = GetOptions {
            range: Some(GetRange::Bounded(0..1)),
            ..GetOptions::default()
        };
        let get = async move { tokio::time::timeout(left, c.get_opts(&p, options)).await };
        if let Ok(Ok(Err(get))) = block_on(get) {
            let again = classify(&get);
            if again == RemoteErrorKind::NoSuchBucket {
                kind = again;
                detail = error_text(&get);
            }
        }
    }
    StoreError::Remote {
        url: url.to_string(),
        kind,
        source: Some(io::Error::other(secrets.scrub(&detail))),
    }
}

/// The error of a client that could not be built (a bad setting in the
/// environment or the options), its words scrubbed of `secrets`.
pub(crate) fn build_failed(url: &str, secrets: &Secrets, e: object_store::Error) -> StoreError {
    StoreError::Remote {
        url: url.to_string(),
        kind: RemoteErrorKind::Other,
        source: Some(io::Error::other(secrets.scrub(&e.to_string()))),
    }
}

/// The runtime could not be started, or dropped a request.
fn runtime_error(url: &str, e: io::Error) -> StoreError {
    StoreError::Remote {
        url: url.to_string(),
        kind: RemoteErrorKind::Other,
        source: Some(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_scrubbed() {
        let mut s = Secrets::default();
        s.add(Some("wJalrXUtnFEMI".to_string()));
        s.add(Some("ab".to_string()));
        s.add(None);
        assert_eq!(s.scrub("key wJalrXUtnFEMI in ab"), "key *** in ab");
    }

    #[test]
    fn echoed_requests_are_dropped_from_error_bodies() {
        let body =
            "403: <Error><Code>SignatureDoesNotMatch</Code><StringToSign>AWS4 x</StringToSign>\
                    <CanonicalRequest>GET /b/k x-amz-security-token:TOKEN</CanonicalRequest>\
                    <CanonicalRequestBytes>54 4f 4b</CanonicalRequestBytes></Error>";
        let out = Secrets::default().scrub(body);
        assert!(out.contains("SignatureDoesNotMatch"), "{out}");
        assert!(
            !out.contains("TOKEN") && !out.contains("54 4f") && !out.contains("AWS4"),
            "{out}"
        );
        // An unclosed echo is cut to the end.
        assert_eq!(drop_echoes("a <StringToSign>secret"), "a ");
    }

    #[test]
    fn urls_do_not_classify_errors() {
        let t = "Error performing GET http://h/tls-certificates.tar in 1ms - connection closed";
        assert!(!strip_urls(t).contains("tls"));
        assert!(strip_urls(t).contains("connection closed"));
    }

    #[test]
    fn statuses_are_read_from_the_clients_words() {
        let t = "Error performing GET http://h/x in 412.5µs - Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code>";
        assert_eq!(status_code(t), Some(503));
        assert_eq!(status_code("Error performing GET in 412ms"), None);
        assert_eq!(status_code("status code: 4"), None);
    }

    /// Object metadata as the client makes it from a response's headers:
    /// a missing Last-Modified is the epoch.
    fn meta(etag: Option<&str>, last_modified_secs: u64, size: u64) -> ObjectMeta {
        let mut meta = ObjectMeta {
            location: Path::default(),
            last_modified: Default::default(),
            size,
            e_tag: etag.map(str::to_string),
            version: None,
        };
        meta.last_modified += Duration::from_secs(last_modified_secs);
        meta
    }

    fn is_change(pin: &ObjectMeta, got: &ObjectMeta) -> bool {
        matches!(
            check_pin(pin, got),
            Err(Failure::Mismatch(RemoteErrorKind::Changed, _))
        )
    }

    #[test]
    fn two_defaulted_timestamps_never_count_as_a_match() {
        // Pinned by an ETag alone (no Last-Modified): an answer without the
        // ETag is a change, though both timestamps are the epoch.
        let pin = meta(Some("\"v1\""), 0, 10);
        assert!(!has_last_modified(&pin) && has_validator(&pin));
        assert!(is_change(&pin, &meta(None, 0, 10)));
        assert!(is_change(&pin, &meta(Some("\"v2\""), 0, 10)));
        assert!(!is_change(&pin, &meta(Some("\"v1\""), 0, 10)));
        // Pinned by a Last-Modified alone: an answer without one is a
        // change, and so is another time.
        let pin = meta(None, 1_700_000_000, 10);
        assert!(is_change(&pin, &meta(None, 0, 10)));
        assert!(is_change(&pin, &meta(None, 1_700_000_001, 10)));
        assert!(!is_change(&pin, &meta(None, 1_700_000_000, 10)));
        assert!(is_change(&pin, &meta(None, 1_700_000_000, 11)));
    }

    #[test]
    fn an_unpinned_object_is_checked_by_its_length_alone() {
        // Only reachable with `allow_unpinned` (the open refuses it else).
        let pin = meta(None, 0, 10);
        assert!(!has_validator(&pin));
        assert!(!is_change(&pin, &meta(None, 0, 10)));
        assert!(is_change(&pin, &meta(None, 0, 11)));
    }

    #[test]
    fn transient_kinds_are_the_retriable_ones() {
        assert!(RemoteErrorKind::Throttled.is_transient());
        assert!(RemoteErrorKind::Transfer.is_transient());
        assert!(!RemoteErrorKind::Changed.is_transient());
        assert!(!RemoteErrorKind::NotFound.is_transient());
        assert!(!RemoteErrorKind::AccessDenied.is_transient());
    }

    #[test]
    fn the_link_meter_times_the_link_not_one_body() {
        let m = LinkMeter::default();
        // Before any sample: no latency, the default bandwidth.
        assert_eq!(m.link().latency, Duration::ZERO);
        assert_eq!(m.link().bytes_per_sec, DEFAULT_BYTES_PER_SEC);
        let ms = Duration::from_millis;
        m.record_latency(ms(20));
        assert_eq!(m.link().latency, ms(20));
        // A new sample weighs an eighth.
        m.record_latency(ms(100));
        assert_eq!(m.link().latency, ms(30));
        // Two bodies of 1 MiB arriving together over 50 ms: 2 MiB over the
        // time either was arriving, not 1 MiB over 50 ms.
        let (a, b) = (m.body(), m.body());
        std::thread::sleep(ms(50));
        a.end(1 << 20);
        b.end(1 << 20);
        let rate = m.link().bytes_per_sec;
        assert!(rate <= (2 << 20) * 20, "{rate}");
        assert_ne!(rate, DEFAULT_BYTES_PER_SEC);
        // A body that fails alone is not kept: the rate stands.
        let before = m.link().bytes_per_sec;
        let failed = m.body();
        std::thread::sleep(ms(20));
        drop(failed);
        assert_eq!(m.link().bytes_per_sec, before);
        // Less than MIN_BANDWIDTH_SAMPLE in all: the default.
        let small = LinkMeter::default();
        small.body().end(4096);
        assert_eq!(small.link().bytes_per_sec, DEFAULT_BYTES_PER_SEC);
    }

    #[test]
    fn block_on_works_inside_another_runtime() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = outer.block_on(async { block_on(async { 7 }).unwrap() });
        assert_eq!(got, 7);
    }
}
