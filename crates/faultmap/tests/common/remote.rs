//! The project's servers for the remote-store tests: nginx (HTTP) and
//! versitygw (S3), started by `scripts/remote-servers up` (which
//! `scripts/test-all` runs around `cargo test`), whose variables say where
//! they are; objects put into their roots; and stores opened through the
//! fault-injecting proxy of `faultmap-proxy`.

use std::net::SocketAddr;
use std::path::PathBuf;

use faultmap::{HttpStore, RemoteErrorKind, RemoteTuning, S3Options, S3Store, Store, StoreError};
use faultmap_proxy::Proxy;

use super::pattern;

/// A variable of the project's servers; a test that needs them fails
/// (never skips) without them.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests need the project's servers; run them under \
             ./scripts/test-all, or eval \"$(scripts/remote-servers up)\" first"
        )
    })
}

/// The servers `scripts/remote-servers up` started, from its variables.
pub struct Servers {
    pub http_url: String,
    pub http_root: PathBuf,
    pub s3_bucket: String,
    pub s3_root: PathBuf,
}

pub fn servers() -> Servers {
    Servers {
        http_url: env("FAULTMAP_HTTP_URL"),
        http_root: PathBuf::from(env("FAULTMAP_HTTP_ROOT")),
        s3_bucket: env("FAULTMAP_S3_BUCKET"),
        s3_root: PathBuf::from(env("FAULTMAP_S3_ROOT")),
    }
}

/// Which server an object is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Http,
    S3,
}

pub const KINDS: [Kind; 2] = [Kind::Http, Kind::S3];

/// A file in a server's root, removed when dropped.
pub struct RemoteFile {
    pub path: PathBuf,
    /// Its name under the server's root (the key, for S3).
    pub name: String,
    /// Its URL on the server.
    pub url: String,
    pub data: Vec<u8>,
}

impl Drop for RemoteFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Puts `len` pattern bytes under a fresh name made of `name` on `kind`'s
/// server (`name` may hold folders).
pub fn put(kind: Kind, name: &str, len: usize, seed: u64) -> RemoteFile {
    let s = servers();
    let name = format!("{name}-{}-{seed}", std::process::id());
    let (path, url) = match kind {
        Kind::Http => (s.http_root.join(&name), format!("{}/{name}", s.http_url)),
        Kind::S3 => (
            s.s3_root.join(&name),
            format!("s3://{}/{name}", s.s3_bucket),
        ),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let data = pattern(len, seed);
    std::fs::write(&path, &data).unwrap();
    RemoteFile {
        path,
        name,
        url,
        data,
    }
}

/// Opens `url` on `kind`'s server directly.
pub fn open(kind: Kind, url: &str) -> Result<Box<dyn Store>, StoreError> {
    match kind {
        Kind::Http => HttpStore::open(url).map(|s| Box::new(s) as Box<dyn Store>),
        Kind::S3 => S3Store::open(url).map(|s| Box::new(s) as Box<dyn Store>),
    }
}

/// The kind of a remote error (any other error fails the test).
pub fn remote_kind(e: &StoreError) -> RemoteErrorKind {
    match e {
        StoreError::Remote { kind, .. } => kind.clone(),
        other => panic!("expected a remote error, got {other}"),
    }
}

/// The address of `kind`'s server, for a proxy in front of it.
pub fn upstream(kind: Kind) -> SocketAddr {
    let url = match kind {
        Kind::Http => env("FAULTMAP_HTTP_URL"),
        Kind::S3 => env("AWS_ENDPOINT_URL"),
    };
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    hostport.parse().unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Opens `file` through `proxy` with `tuning` (an S3 object with the
/// proxy as its endpoint).
pub fn try_open_via(
    kind: Kind,
    proxy: &Proxy,
    file: &RemoteFile,
    tuning: RemoteTuning,
) -> Result<Box<dyn Store>, StoreError> {
    match kind {
        Kind::Http => HttpStore::open_with(&format!("{}/{}", proxy.url(), file.name), tuning)
            .map(|s| Box::new(s) as Box<dyn Store>),
        Kind::S3 => {
            let options = S3Options {
                endpoint: Some(proxy.url()),
                allow_http: Some(true),
                tuning,
                ..S3Options::default()
            };
            S3Store::open_with(&file.url, &options).map(|s| Box::new(s) as Box<dyn Store>)
        }
    }
}

/// [`try_open_via`], which must open.
pub fn open_via(
    kind: Kind,
    proxy: &Proxy,
    file: &RemoteFile,
    tuning: RemoteTuning,
) -> Box<dyn Store> {
    try_open_via(kind, proxy, file, tuning).unwrap()
}
