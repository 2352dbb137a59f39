//! The project's servers for the remote-store tests: nginx (HTTP),
//! versitygw (S3), a GCS stub (`scripts/gcs-stub.py`, GCS's XML API over a
//! folder) and Azurite (Azure Blob), started by `scripts/remote-servers up`
//! (which `scripts/test-all` runs around `cargo test`), whose variables say
//! where they are; objects put into their roots (Azurite's blobs through
//! its API); and stores opened through the fault-injecting proxy of
//! `faultmap-proxy`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use faultmap::{
    AzureOptions, AzureStore, GcsOptions, GcsStore, HttpStore, RemoteErrorKind, RemoteTuning,
    S3Options, S3Store, Store, StoreError,
};
use faultmap_proxy::Proxy;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::{ObjectStore, ObjectStoreExt};

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
    pub gs_bucket: String,
    pub gs_root: PathBuf,
    pub az_container: String,
}

pub fn servers() -> Servers {
    Servers {
        http_url: env("FAULTMAP_HTTP_URL"),
        http_root: PathBuf::from(env("FAULTMAP_HTTP_ROOT")),
        s3_bucket: env("FAULTMAP_S3_BUCKET"),
        s3_root: PathBuf::from(env("FAULTMAP_S3_ROOT")),
        gs_bucket: env("FAULTMAP_GS_BUCKET"),
        gs_root: PathBuf::from(env("FAULTMAP_GS_ROOT")),
        az_container: env("FAULTMAP_AZ_CONTAINER"),
    }
}

/// Azurite's development account and its key, which Microsoft publishes
/// (the emulator accepts no other unless told), unless the environment
/// names another account.
pub fn azurite_account() -> (String, String) {
    const ACCOUNT: &str = "devstoreaccount1";
    const KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
    (
        std::env::var("AZURE_STORAGE_ACCOUNT_NAME").unwrap_or_else(|_| ACCOUNT.to_string()),
        std::env::var("AZURE_STORAGE_ACCOUNT_KEY").unwrap_or_else(|_| KEY.to_string()),
    )
}

/// Which server an object is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Http,
    S3,
    Gcs,
    Azure,
}

pub const KINDS: [Kind; 4] = [Kind::Http, Kind::S3, Kind::Gcs, Kind::Azure];

/// The object stores: every kind but plain HTTP.
pub const OBJECT_STORES: [Kind; 3] = [Kind::S3, Kind::Gcs, Kind::Azure];

/// An object put on a server, removed when dropped.
pub struct RemoteFile {
    place: Place,
    /// Its name under the server's root (the key, for S3 and GCS; the
    /// blob, for Azure).
    pub name: String,
    /// Its URL on the server.
    pub url: String,
    pub data: Vec<u8>,
}

/// Where an object's bytes are.
enum Place {
    /// A file in the server's root.
    File(PathBuf),
    /// A blob in this container of Azurite's, which keeps them in memory.
    Blob(String),
}

impl RemoteFile {
    /// Replaces the object's bytes with `data` (a new version: a new
    /// ETag).
    pub fn rewrite(&self, data: &[u8]) {
        match &self.place {
            // A new file renamed over the old (a new inode, as an upload
            // makes): the GCS stub's ETag names the inode, and an in-place
            // write of the same length within one clock tick would keep
            // its ETag.
            Place::File(path) => {
                let tmp = path.with_extension("rewrite.tmp");
                std::fs::write(&tmp, data).unwrap();
                if path.starts_with(servers().s3_root) {
                    give_s3_etag(&tmp, data);
                }
                std::fs::rename(&tmp, path).unwrap();
            }
            Place::Blob(container) => azure_put(container, &self.name, data),
        }
    }
}

impl Drop for RemoteFile {
    fn drop(&mut self) {
        match &self.place {
            Place::File(path) => {
                let _ = std::fs::remove_file(path);
            }
            Place::Blob(container) => {
                let name = object_store::path::Path::from(self.name.as_str());
                let _ = azure().block_on(azure_client(container).delete(&name));
            }
        }
    }
}

/// Gives a file placed in versitygw's bucket folder the ETag an upload
/// would have (versitygw keeps it in the `user.etag` attribute, and
/// answers without one for a file it did not write): 32 hex digits, new
/// for every version, as S3's always are.
pub fn give_s3_etag(path: &std::path::Path, data: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let etag = format!(
        "{:08x}{:08x}{:08x}{:08x}",
        crc32fast::hash(data),
        data.len() as u32,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed) as u32
    );
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path, name and a value that live for the
    // call; setxattr reads them only.
    let rc = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.etag".as_ptr(),
            etag.as_ptr().cast(),
            etag.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr user.etag on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Puts `len` pattern bytes under a fresh name made of `name` on `kind`'s
/// server (`name` may hold folders).
pub fn put(kind: Kind, name: &str, len: usize, seed: u64) -> RemoteFile {
    let s = servers();
    let name = format!("{name}-{}-{seed}", std::process::id());
    let data = pattern(len, seed);
    let url = object_url(kind, &name);
    let place = match kind {
        Kind::Http => Place::File(s.http_root.join(&name)),
        Kind::S3 => Place::File(s.s3_root.join(&name)),
        Kind::Gcs => Place::File(s.gs_root.join(&name)),
        Kind::Azure => Place::Blob(s.az_container),
    };
    match &place {
        Place::File(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).unwrap();
            }
            std::fs::write(path, &data).unwrap();
            if kind == Kind::S3 {
                give_s3_etag(path, &data);
            }
        }
        Place::Blob(container) => azure_put(container, &name, &data),
    }
    RemoteFile {
        place,
        name,
        url,
        data,
    }
}

/// The URL of the object `name` on `kind`'s server.
pub fn object_url(kind: Kind, name: &str) -> String {
    let s = servers();
    match kind {
        Kind::Http => format!("{}/{name}", s.http_url),
        Kind::S3 => format!("s3://{}/{name}", s.s3_bucket),
        Kind::Gcs => format!("gs://{}/{name}", s.gs_bucket),
        Kind::Azure => format!("az://{}/{name}", s.az_container),
    }
}

/// [`put`] for Azure, into a container that only the account's key
/// reads ([`azure_private_container`]).
pub fn put_private_blob(name: &str, len: usize, seed: u64) -> RemoteFile {
    let container = azure_private_container();
    let name = format!("{name}-{}-{seed}", std::process::id());
    let data = pattern(len, seed);
    azure_put(&container, &name, &data);
    RemoteFile {
        url: format!("az://{container}/{name}"),
        place: Place::Blob(container),
        name,
        data,
    }
}

/// A container of Azurite's that is not public, created on first use:
/// the project's container (`FAULTMAP_AZ_CONTAINER`) is public-read, and
/// Azurite then serves its blobs whatever the credentials (a wrong
/// signature falls back to anonymous access; Azure refuses it), so a
/// wrong key shows only here. Created with a `PUT ?restype=container`
/// that the client library's own SharedKey signer signs.
pub fn azure_private_container() -> String {
    use object_store::azure::{AzureAccessKey, AzureAuthorizer, AzureCredential};
    use object_store::client::{HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector};
    const NAME: &str = "faultmap-private";
    static CREATED: OnceLock<()> = OnceLock::new();
    CREATED.get_or_init(|| {
        let (account, key) = azurite_account();
        let url = format!(
            "{}/{account}/{NAME}?restype=container",
            server_url(Kind::Azure)
        );
        let mut request = HttpRequest::new(HttpRequestBody::from(Vec::new()));
        *request.method_mut() = "PUT".parse().unwrap();
        *request.uri_mut() = url.parse().unwrap();
        request
            .headers_mut()
            .insert("content-length", "0".parse().unwrap());
        let credential = AzureCredential::AccessKey(AzureAccessKey::try_new(&key).unwrap());
        AzureAuthorizer::new(&credential, &account)
            .try_authorize(&mut request)
            .unwrap();
        let options = object_store::ClientOptions::new().with_allow_http(true);
        let client = ReqwestConnector::default().connect(&options).unwrap();
        let response = azure()
            .block_on(client.execute(request))
            .unwrap_or_else(|e| panic!("creating the container {NAME}: {e}"));
        // 409: it exists.
        let status = response.status().as_u16();
        assert!(matches!(status, 201 | 409), "creating {NAME}: {status}");
    });
    NAME.to_string()
}

/// The runtime the tests' own Azure requests run on.
fn azure() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// A client of Azurite's `container`, configured from the environment as
/// the store is.
fn azure_client(container: &str) -> Arc<dyn ObjectStore> {
    let client = MicrosoftAzureBuilder::from_env()
        .with_container_name(container)
        .build()
        .unwrap();
    Arc::new(client)
}

/// Puts `data` as the blob `name` in Azurite's `container`.
fn azure_put(container: &str, name: &str, data: &[u8]) {
    let path = object_store::path::Path::from(name);
    let payload = object_store::PutPayload::from(data.to_vec());
    azure()
        .block_on(azure_client(container).put(&path, payload))
        .unwrap_or_else(|e| panic!("putting {name} into Azurite's {container}: {e}"));
}

/// Opens `url` on `kind`'s server directly.
pub fn open(kind: Kind, url: &str) -> Result<Box<dyn Store>, StoreError> {
    match kind {
        Kind::Http => HttpStore::open(url).map(|s| Box::new(s) as Box<dyn Store>),
        Kind::S3 => S3Store::open(url).map(|s| Box::new(s) as Box<dyn Store>),
        Kind::Gcs => GcsStore::open(url).map(|s| Box::new(s) as Box<dyn Store>),
        Kind::Azure => AzureStore::open(url).map(|s| Box::new(s) as Box<dyn Store>),
    }
}

/// The kind of a remote error (any other error fails the test).
pub fn remote_kind(e: &StoreError) -> RemoteErrorKind {
    match e {
        StoreError::Remote { kind, .. } => kind.clone(),
        other => panic!("expected a remote error, got {other}"),
    }
}

/// The URL of `kind`'s server.
pub fn server_url(kind: Kind) -> String {
    match kind {
        Kind::Http => env("FAULTMAP_HTTP_URL"),
        Kind::S3 => env("AWS_ENDPOINT_URL"),
        Kind::Gcs => env("FAULTMAP_GCS_ENDPOINT"),
        Kind::Azure => env("AZURITE_BLOB_STORAGE_URL"),
    }
}

/// The address of `kind`'s server, for a proxy in front of it.
pub fn upstream(kind: Kind) -> SocketAddr {
    let url = server_url(kind);
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    hostport.parse().unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Opens the object store `url` names through the service at `endpoint`
/// (`http://host:port`; Azurite's account is added to its path), with
/// `tuning`. Plain HTTP has no endpoint apart from its URL: its `url` is
/// opened as is.
pub fn try_open_at(
    kind: Kind,
    endpoint: &str,
    url: &str,
    tuning: RemoteTuning,
) -> Result<Box<dyn Store>, StoreError> {
    match kind {
        Kind::Http => HttpStore::open_with(url, tuning).map(|s| Box::new(s) as Box<dyn Store>),
        Kind::S3 => {
            let options = S3Options {
                endpoint: Some(endpoint.to_string()),
                allow_http: Some(true),
                tuning,
                ..S3Options::default()
            };
            S3Store::open_with(url, &options).map(|s| Box::new(s) as Box<dyn Store>)
        }
        Kind::Gcs => {
            let options = GcsOptions {
                endpoint: Some(endpoint.to_string()),
                tuning,
                ..GcsOptions::default()
            };
            GcsStore::open_with(url, &options).map(|s| Box::new(s) as Box<dyn Store>)
        }
        Kind::Azure => {
            let (account, key) = azurite_account();
            let options = AzureOptions {
                endpoint: Some(format!("{endpoint}/{account}")),
                credentials: Some((account, key)),
                allow_http: Some(true),
                tuning,
            };
            AzureStore::open_with(url, &options).map(|s| Box::new(s) as Box<dyn Store>)
        }
    }
}

/// Opens `file` through `proxy` with `tuning` (an object store's object
/// with the proxy as its endpoint).
pub fn try_open_via(
    kind: Kind,
    proxy: &Proxy,
    file: &RemoteFile,
    tuning: RemoteTuning,
) -> Result<Box<dyn Store>, StoreError> {
    match kind {
        Kind::Http => HttpStore::open_with(&format!("{}/{}", proxy.url(), file.name), tuning)
            .map(|s| Box::new(s) as Box<dyn Store>),
        _ => try_open_at(kind, &proxy.url(), &file.url, tuning),
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
