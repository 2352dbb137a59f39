//! Opening by URL: [`open_url`] turns `s3://bucket/key`,
//! `gs://bucket/key`, `az://container/key` (or `abfs[s]://`),
//! `http(s)://host/path` or a local path into a store; and the URL
//! checks every remote store shares (no credentials in a URL, an object
//! key's escapes).

use object_store::path::Path;

use super::remote::{RemoteErrorKind, RemoteTuning};
use super::{
    AzureOptions, AzureStore, FileStore, GcsOptions, GcsStore, HttpStore, S3Options, S3Store,
    Store, StoreError,
};

/// Opens the object that `target` names: `s3://bucket/key` (an
/// [`S3Store`]), `gs://bucket/key` (a [`GcsStore`]), `az://container/key`,
/// `abfs://` or `abfss://` (an [`AzureStore`]), `http://` or `https://`
/// (an [`HttpStore`]), `file:///path` or a plain path (a [`FileStore`]).
/// Any other scheme is a clear error naming it. Remote objects are opened
/// with the default [`RemoteTuning`]; see [`open_url_with`].
pub fn open_url(target: &str) -> Result<Box<dyn Store>, StoreError> {
    open_url_with(target, &RemoteTuning::default())
}

/// [`open_url`], opening a remote object with `tuning` (its timeouts, its
/// open deadline, whether an unpinned object is allowed). A pager's I/O
/// settings give [`RemoteTuning::for_config`].
///
/// A remote object is read through the disk cache `tuning.disk_cache`
/// names, if any ([`super::CachedStore`]); a local file never is.
pub fn open_url_with(target: &str, tuning: &RemoteTuning) -> Result<Box<dyn Store>, StoreError> {
    let store = open_uncached(target, tuning)?;
    let remote = target
        .split_once("://")
        .is_some_and(|(scheme, _)| !scheme.eq_ignore_ascii_case("file"));
    match &tuning.disk_cache {
        Some(cache) if remote => super::disk::wrap(store, cache, tuning.request_timeout),
        _ => Ok(store),
    }
}

/// [`open_url_with`] without the disk cache.
fn open_uncached(target: &str, tuning: &RemoteTuning) -> Result<Box<dyn Store>, StoreError> {
    let Some((scheme, _)) = target.split_once("://") else {
        return Ok(Box::new(FileStore::open(target)?));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "s3" => {
            let options = S3Options {
                tuning: tuning.clone(),
                ..S3Options::default()
            };
            Ok(Box::new(S3Store::open_with(target, &options)?))
        }
        "gs" => {
            let options = GcsOptions {
                tuning: tuning.clone(),
                ..GcsOptions::default()
            };
            Ok(Box::new(GcsStore::open_with(target, &options)?))
        }
        "az" | "abfs" | "abfss" => {
            let options = AzureOptions {
                tuning: tuning.clone(),
                ..AzureOptions::default()
            };
            Ok(Box::new(AzureStore::open_with(target, &options)?))
        }
        "http" | "https" => Ok(Box::new(HttpStore::open_with(target, tuning.clone())?)),
        "file" => {
            let (parsed, shown) = parse(target)?;
            let path = parsed
                .to_file_path()
                .map_err(|()| bad_url(&shown, "not a local file URL"))?;
            Ok(Box::new(FileStore::open(path)?))
        }
        _ => {
            let shown = parse(target)
                .map(|(_, shown)| shown)
                .unwrap_or_else(|e| match e {
                    StoreError::Remote { url, .. } => url,
                    _ => String::new(),
                });
            Err(bad_url(
                &shown,
                "unsupported scheme (faultmap opens s3://, gs://, az://, abfs://, abfss://, \
                 http://, https://, file:// and local paths)",
            ))
        }
    }
}

/// Parses `target`, and gives it back as it may be shown: URLs with user
/// information or a query string are refused, since their secrets would
/// end up in messages.
pub(crate) fn parse(target: &str) -> Result<(url::Url, String), StoreError> {
    parse_url(target, false)
}

/// [`parse`], keeping a user name without a password: in
/// `abfss://container@account.dfs.core.windows.net/key` it names the
/// container, not a user, and is shown. A password is refused as in
/// `parse`, and so is a query string.
pub(crate) fn parse_with_user(target: &str) -> Result<(url::Url, String), StoreError> {
    parse_url(target, true)
}

/// [`parse`], or [`parse_with_user`] if `user_is_a_name`.
fn parse_url(target: &str, user_is_a_name: bool) -> Result<(url::Url, String), StoreError> {
    let parsed =
        url::Url::parse(target).map_err(|_| bad_url(&redact(target), "not a valid URL"))?;
    let mut shown = parsed.clone();
    if !user_is_a_name {
        let _ = shown.set_username("");
    }
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    let shown = shown.to_string();
    let user = !parsed.username().is_empty() && !user_is_a_name;
    if user || parsed.password().is_some() {
        return Err(bad_url(
            &shown,
            "credentials in the URL are not supported (each store reads its service's \
             environment: AWS_*, GOOGLE_*, AZURE_*)",
        ));
    }
    if parsed.query().is_some() {
        return Err(bad_url(
            &shown,
            "query strings (presigned URLs, SAS tokens) are not supported",
        ));
    }
    Ok((parsed, shown))
}

/// What an `s3://` or `gs://` URL's words are for: the scheme, and the
/// reasons given when it is wrong, the bucket missing, the key missing.
pub(crate) struct BucketUrl {
    pub(crate) scheme: &'static str,
    pub(crate) wrong_scheme: &'static str,
    pub(crate) no_bucket: &'static str,
    pub(crate) no_key: &'static str,
}

/// The bucket and the object path of a `scheme://bucket/key` URL (parsed,
/// and `shown` for messages): the scheme must be `url.scheme`; a bucket
/// name is letters, digits, `-`, `.` and `_` (an escape is refused); the
/// key as [`object_key`] reads it.
pub(crate) fn bucket_and_key<'u>(
    parsed: &'u url::Url,
    shown: &str,
    url: &BucketUrl,
) -> Result<(&'u str, Path), StoreError> {
    if parsed.scheme() != url.scheme {
        return Err(bad_url(shown, url.wrong_scheme));
    }
    let Some(bucket) = parsed.host_str().filter(|b| !b.is_empty()) else {
        return Err(bad_url(shown, url.no_bucket));
    };
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    {
        return Err(bad_url(
            shown,
            "a bucket name is letters, digits, '-', '.' and '_' (no escapes)",
        ));
    }
    let path = object_key(parsed.path(), url.no_key).map_err(|why| bad_url(shown, why))?;
    Ok((bucket, path))
}

/// The object path of an `s3://`, `gs://` or `az://` URL's path: its escapes
/// decoded, each `/` a separator. Refuses an escaped `/` (tools disagree
/// on whether `a%2Fb` names the key `a/b` or the key `a%2Fb`), a key that
/// ends in `/` (a folder: the client would drop the `/` and read another
/// key), and an empty key, with `no_key` as the reason.
pub(crate) fn object_key(url_path: &str, no_key: &'static str) -> Result<Path, &'static str> {
    let escaped_slash = url_path
        .as_bytes()
        .windows(3)
        .any(|w| w[0] == b'%' && w[1] == b'2' && w[2].eq_ignore_ascii_case(&b'f'));
    if escaped_slash {
        return Err(
            "an escaped '/' (%2F) in the key is ambiguous (some tools read it as a \
             separator, others as the three characters): write the key's '/' as is",
        );
    }
    if url_path.trim_start_matches('/').is_empty() {
        return Err(no_key);
    }
    if url_path.ends_with('/') {
        return Err("the key ends in '/' (a folder, not an object)");
    }
    Path::from_url_path(url_path).map_err(|_| "the key is not a valid object path")
}

/// `target` without anything between `://` and an `@` (user
/// information), and without a query, for a message about a string that
/// did not even parse.
fn redact(target: &str) -> String {
    let no_query = target.split(['?', '#']).next().unwrap_or_default();
    let Some((scheme, rest)) = no_query.split_once("://") else {
        return no_query.to_string();
    };
    // The authority ends at the first '/'; user information ends at its
    // last '@' (a password may hold '@' too).
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{path}"),
        None => no_query.to_string(),
    }
}

/// The error for a URL faultmap cannot open.
pub(crate) fn bad_url(shown: &str, why: &'static str) -> StoreError {
    StoreError::Remote {
        url: shown.to_string(),
        kind: RemoteErrorKind::BadUrl(why),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(r: Result<Box<dyn Store>, StoreError>) -> (String, RemoteErrorKind) {
        match r {
            Err(StoreError::Remote { url, kind, .. }) => (url, kind),
            Err(other) => panic!("expected a Remote error, got {other}"),
            Ok(s) => panic!("expected an error, opened {}", s.name()),
        }
    }

    #[test]
    fn unsupported_schemes_are_named() {
        let (url, k) = kind(open_url("ftp://example.com/x"));
        assert_eq!(url, "ftp://example.com/x");
        assert!(matches!(k, RemoteErrorKind::BadUrl(why) if why.contains("unsupported scheme")));
        for scheme in ["s3://", "gs://", "az://", "abfss://"] {
            assert!(matches!(&k, RemoteErrorKind::BadUrl(why) if why.contains(scheme)));
        }
    }

    #[test]
    fn credentials_never_reach_the_message() {
        for target in [
            "http://user:hunter2secret@127.0.0.1:9/x",
            "s3://AKIA:hunter2secret@bucket/key",
            "http://127.0.0.1:9/x?X-Amz-Signature=hunter2secret",
            "http://user:hunter2secret@[bad/x",
            "http://user:hunter2@topsecret@[bad/x",
            "http://user:p@ss@host:9/x",
            "gs://user:hunter2secret@bucket/key",
            "gs://bucket/key?GoogleAccessId=a&Signature=hunter2secret",
            "az://container/key?sv=2022-11-02&sig=hunter2secret",
            "abfss://container:hunter2secret@acct.dfs.core.windows.net/key",
        ] {
            let e = open_url(target).err().expect("refused");
            let text = format!("{e} {e:?}");
            for secret in ["hunter2", "topsecret", "p@ss"] {
                assert!(!text.contains(secret), "{text}");
            }
        }
    }

    #[test]
    fn bucket_and_key_are_required() {
        assert!(matches!(
            kind(open_url("s3://bucket")).1,
            RemoteErrorKind::BadUrl(_)
        ));
        assert!(matches!(
            kind(open_url("s3:///key")).1,
            RemoteErrorKind::BadUrl(_)
        ));
        assert!(matches!(
            kind(open_url("http://127.0.0.1:9")).1,
            RemoteErrorKind::BadUrl(_)
        ));
        for target in [
            "gs://bucket",
            "gs:///key",
            "az://container",
            "az:///key",
            "abfs://container/",
            "abfss://container@acct.dfs.core.windows.net",
            "abfss://container@acct.dfs.core.windows.net/dir/",
        ] {
            let (url, k) = kind(open_url(target));
            assert!(matches!(k, RemoteErrorKind::BadUrl(_)), "{target}: {k}");
            assert!(!url.is_empty(), "{target}");
        }
    }

    #[test]
    fn an_object_key_decodes_its_escapes_and_refuses_an_escaped_slash() {
        let no_key = "no key";
        for bad in ["/a%2Fb.bin", "/a%2fb", "/%2F", "/dir/x%2F"] {
            assert!(
                object_key(bad, no_key).unwrap_err().contains("%2F"),
                "{bad}"
            );
        }
        assert_eq!(object_key("/a%20b/c", no_key).unwrap().as_ref(), "a b/c");
        assert_eq!(object_key("/a/b.bin", no_key).unwrap().as_ref(), "a/b.bin");
        assert_eq!(object_key("/", no_key), Err(no_key));
        assert_eq!(object_key("", no_key), Err(no_key));
        assert!(object_key("/dir/", no_key)
            .unwrap_err()
            .contains("ends in '/'"));
    }

    #[test]
    fn a_container_in_the_user_part_is_shown_a_password_never() {
        let (_, shown) = parse_with_user("abfss://c@acct.dfs.core.windows.net/k").unwrap();
        assert_eq!(shown, "abfss://c@acct.dfs.core.windows.net/k");
        let e = parse_with_user("abfss://c:hunter2@acct.dfs.core.windows.net/k").unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains("hunter2"), "{text}");
        // A plain `parse` shows no user at all.
        let e = parse("s3://AKIAUSERNAME@bucket/key").unwrap_err();
        assert!(!format!("{e} {e:?}").contains("AKIAUSERNAME"));
    }

    #[test]
    fn plain_paths_and_file_urls_open_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(open_url(p.to_str().unwrap()).unwrap().len(), 5);
        let url = format!("file://{}", p.display());
        assert_eq!(open_url(&url).unwrap().len(), 5);
        assert!(matches!(
            open_url(dir.path().join("missing").to_str().unwrap()),
            Err(StoreError::Open { .. })
        ));
    }
}
