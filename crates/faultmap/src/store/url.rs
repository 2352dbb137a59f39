//! Opening by URL: [`open_url`] turns `s3://bucket/key`,
//! `http(s)://host/path` or a local path into a store.

use super::remote::{RemoteErrorKind, RemoteTuning};
use super::{FileStore, HttpStore, S3Options, S3Store, Store, StoreError};

/// Opens the object that `target` names: `s3://bucket/key` (an
/// [`S3Store`]), `http://` or `https://` (an [`HttpStore`]), `file:///path`
/// or a plain path (a [`FileStore`]). Any other scheme is a clear error
/// naming it. Remote objects are opened with the default
/// [`RemoteTuning`]; see [`open_url_with`].
pub fn open_url(target: &str) -> Result<Box<dyn Store>, StoreError> {
    open_url_with(target, &RemoteTuning::default())
}

/// [`open_url`], opening a remote object with `tuning` (its timeouts, its
/// open deadline, whether an unpinned object is allowed). A pager's I/O
/// settings give [`RemoteTuning::for_config`].
pub fn open_url_with(target: &str, tuning: &RemoteTuning) -> Result<Box<dyn Store>, StoreError> {
    let Some((scheme, _)) = target.split_once("://") else {
        return Ok(Box::new(FileStore::open(target)?));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "s3" => {
            let options = S3Options {
                tuning: *tuning,
                ..S3Options::default()
            };
            Ok(Box::new(S3Store::open_with(target, &options)?))
        }
        "http" | "https" => Ok(Box::new(HttpStore::open_with(target, *tuning)?)),
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
                "unsupported scheme (faultmap opens s3://, http://, https://, file:// and local paths)",
            ))
        }
    }
}

/// Parses `target`, and gives it back as it may be shown: URLs with user
/// information or a query string are refused, since their secrets would
/// end up in messages.
pub(crate) fn parse(target: &str) -> Result<(url::Url, String), StoreError> {
    let parsed =
        url::Url::parse(target).map_err(|_| bad_url(&redact(target), "not a valid URL"))?;
    let mut shown = parsed.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    let shown = shown.to_string();
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad_url(
            &shown,
            "credentials in the URL are not supported (S3 reads the AWS environment)",
        ));
    }
    if parsed.query().is_some() {
        return Err(bad_url(
            &shown,
            "query strings (presigned URLs) are not supported",
        ));
    }
    Ok((parsed, shown))
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
