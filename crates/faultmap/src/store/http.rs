//! An object behind any HTTP(S) server that answers range requests:
//! [`HttpStore`].

use std::sync::Arc;

use object_store::http::HttpBuilder;
use object_store::path::Path;

use super::remote::{build_failed, Remote, RemoteTuning, Secrets};
use super::url::{bad_url, parse};
use super::StoreError;

/// An object at an `http://` or `https://` URL, read with ranged GETs.
///
/// Its length and version come from a `HEAD` at open. Every read is
/// conditional on a strong ETag (`If-Match`; a weak one is not sent, since
/// `If-Match` compares strongly) and checked against the pin; with
/// no ETag, each response's `Last-Modified` and length are checked
/// instead (no condition is sent), and an object with neither validator is
/// refused unless [`RemoteTuning::allow_unpinned`] is set: see the
/// `store::remote` module for what happens when the object changes. The
/// server must honour `Range` (a server that answers a ranged GET with the
/// whole object is refused at open). URLs with user information or a query
/// string are refused: faultmap could not keep them out of messages.
///
/// Every request goes to the URL's path as parsed, escapes kept:
/// `http://host/a%2Fb.bin` asks the server for `/a%2Fb.bin`, never for
/// `/a/b.bin`. (URL parsing itself resolves dot segments, `.` and `..`,
/// escaped or not, as browsers and HTTP clients do.)
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
        if parsed.host_str().is_none() {
            return Err(bad_url(&shown, "no host"));
        }
        if parsed.path().trim_start_matches('/').is_empty() {
            return Err(bad_url(&shown, "no object path after the host"));
        }
        // The client is given the whole URL as its base and asked for the
        // empty path, so each request goes to the URL's path exactly as
        // written. (Asked for a path of its own, it would decode the
        // escapes and encode the parts again: `%2F` would become a `/`,
        // another object.)
        let mut base = parsed.clone();
        base.set_fragment(None);
        let path = Path::default();
        let client = HttpBuilder::new()
            .with_url(base.as_str())
            .with_client_options(tuning.client_options(scheme == "http"))
            .with_retry(tuning.retry_config())
            .build()
            .map_err(|e| build_failed(&shown, &Secrets::default(), e))?;
        let remote = Remote::open(Arc::new(client), path, shown, Secrets::default(), tuning)?;
        Ok(Self { remote })
    }

    /// The ETag pinned at open, if the server sent one.
    pub fn etag(&self) -> Option<&str> {
        self.remote.etag()
    }
}

super::remote::remote_store!(HttpStore);
