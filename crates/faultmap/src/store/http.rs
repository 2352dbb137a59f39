//! An object behind any HTTP(S) server that answers range requests:
//! [`HttpStore`].

use std::sync::Arc;

use object_store::http::HttpBuilder;
use object_store::path::Path;

use super::remote::{Remote, RemoteErrorKind, RemoteTuning, Secrets};
use super::url::{bad_url, parse};
use super::StoreError;

/// An object at an `http://` or `https://` URL, read with ranged GETs.
///
/// Its length and ETag come from a `HEAD` at open, and every read is
/// conditional on that ETag (`If-Match`; `If-Unmodified-Since` when the
/// server sends no ETag): see the `store` module for what happens when the
/// object changes. The server must honour `Range` (a server that answers a
/// ranged GET with the whole object is refused at open). URLs with user
/// information or a query string are refused: faultmap could not keep them
/// out of messages.
pub struct HttpStore {
    remote: Remote,
}

impl HttpStore {
    /// Opens the object at `url` with the default [`RemoteTuning`].
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, RemoteTuning::default())
    }

    /// Opens the object at `url` with `tuning`'s request sizes and
    /// timeouts.
    pub fn open_with(url: &str, tuning: RemoteTuning) -> Result<Self, StoreError> {
        let (parsed, shown) = parse(url)?;
        let scheme = parsed.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(bad_url(
                &shown,
                "an HttpStore opens http:// and https:// URLs",
            ));
        }
        let Some(host) = parsed.host_str() else {
            return Err(bad_url(&shown, "no host"));
        };
        let base = match parsed.port() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        };
        let path = Path::from_url_path(parsed.path())
            .map_err(|_| bad_url(&shown, "the path is not a valid object path"))?;
        if path.as_ref().is_empty() {
            return Err(bad_url(&shown, "no object path after the host"));
        }
        let client = HttpBuilder::new()
            .with_url(base)
            .with_client_options(tuning.client_options(scheme == "http"))
            .with_retry(tuning.retry_config())
            .build()
            .map_err(|e| StoreError::Remote {
                url: shown.clone(),
                kind: RemoteErrorKind::Other,
                source: Some(std::io::Error::other(e.to_string())),
            })?;
        let remote = Remote::open(Arc::new(client), path, shown, Secrets::default(), tuning)?;
        Ok(Self { remote })
    }

    /// The ETag pinned at open, if the server sent one.
    pub fn etag(&self) -> Option<&str> {
        self.remote.etag()
    }
}

super::remote::remote_store!(HttpStore);
