//! An object in any S3-compatible service: [`S3Store`].

use std::fmt;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

use object_store::ClientConfigKey;

use super::remote::{build_failed, Remote, RemoteTuning, Secrets};
use super::url::{bucket_and_key, parse, BucketUrl};
use super::StoreError;

/// An object at an `s3://bucket/key` URL in AWS S3 or any S3-compatible
/// service (versitygw, MinIO, Ceph RGW, ...).
///
/// The client is configured from the standard AWS environment, as the
/// `object_store` crate reads it: `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` (default
/// `us-east-1`), `AWS_ENDPOINT_URL` (another service than AWS),
/// `AWS_ALLOW_HTTP` (`true` for a plain-HTTP endpoint),
/// `AWS_VIRTUAL_HOSTED_STYLE_REQUEST` (`true` for
/// `bucket.host/key` addressing; path-style `host/bucket/key` otherwise),
/// `AWS_SKIP_SIGNATURE` (public buckets), and the container, web-identity
/// and instance credential providers. Profiles in `~/.aws` are not read
/// (the client library does not): export a profile's keys, for example
/// with `aws configure export-credentials --format env`.
///
/// The key is the URL's path after the bucket, its percent-escapes
/// decoded (`s3://b/a%20b` is the key `a b`); an escaped `/` (`%2F`) is
/// refused, since tools disagree on whether it names the key `a/b` or the
/// key `a%2Fb`, and so is a key that ends in `/` (the client would drop
/// the `/` and read another key). A bucket name with an escape is
/// refused too.
///
/// The object's length, ETag and version id are pinned at open; every
/// read is a ranged GET conditional on them (see the `store` module).
/// Credentials never appear in its errors or its `Debug` output.
pub struct S3Store {
    remote: Remote,
}

/// Settings of an [`S3Store`] that override the AWS environment, and its
/// request sizes and timeouts. `Debug` never shows the secret.
#[derive(Clone, Default)]
pub struct S3Options {
    /// The service's URL (`AWS_ENDPOINT_URL` otherwise; AWS if neither).
    pub endpoint: Option<String>,
    /// The key pair (`AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`
    /// otherwise).
    pub credentials: Option<(String, String)>,
    /// The region (`AWS_REGION` otherwise, then `us-east-1`).
    pub region: Option<String>,
    /// Whether a plain-HTTP endpoint is allowed (`AWS_ALLOW_HTTP`
    /// otherwise).
    pub allow_http: Option<bool>,
    /// Request sizes and timeouts.
    pub tuning: RemoteTuning,
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key ID is masked too: the stores treat it as a secret
        // everywhere else (`Secrets`), and it names the account.
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.credentials.as_ref().map(|_| "***"))
            .field(
                "secret_access_key",
                &self.credentials.as_ref().map(|_| "***"),
            )
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("tuning", &self.tuning)
            .finish()
    }
}

impl S3Store {
    /// Opens `s3://bucket/key`, configured from the AWS environment.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, &S3Options::default())
    }

    /// Opens `s3://bucket/key` with `options` over the AWS environment.
    pub fn open_with(url: &str, options: &S3Options) -> Result<Self, StoreError> {
        let tuning = options.tuning.clone();
        let (parsed, shown) = parse(url)?;
        let (bucket, path) = bucket_and_key(&parsed, &shown, &S3_URL)?;
        let mut secrets = Secrets::default();
        for var in [
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_ACCESS_KEY_ID",
        ] {
            secrets.add(std::env::var(var).ok());
        }
        let mut client_options = tuning.client_options(false);
        match options.allow_http {
            Some(allow) => client_options = client_options.with_allow_http(allow),
            None => {
                if let Ok(allow) = std::env::var("AWS_ALLOW_HTTP") {
                    client_options = client_options.with_config(ClientConfigKey::AllowHttp, allow);
                }
            }
        }
        // Explicit keys replace the environment's, session token included
        // (a temporary token in the environment belongs to other keys).
        let mut builder = match &options.credentials {
            None => AmazonS3Builder::from_env(),
            Some(_) => std::env::vars()
                .filter(|(k, _)| k.starts_with("AWS_"))
                .filter(|(k, _)| !matches!(k.as_str(), "AWS_SESSION_TOKEN" | "AWS_TOKEN"))
                .filter_map(|(k, v)| Some((k.to_ascii_lowercase().parse().ok()?, v)))
                .fold(AmazonS3Builder::new(), |b, (k, v)| b.with_config(k, v)),
        }
        .with_bucket_name(bucket)
        .with_client_options(client_options)
        .with_retry(tuning.retry_config());
        let env_region =
            std::env::var_os("AWS_REGION").or_else(|| std::env::var_os("AWS_DEFAULT_REGION"));
        match (&options.region, env_region) {
            (Some(region), _) => builder = builder.with_region(region),
            (None, None) => builder = builder.with_region("us-east-1"),
            (None, Some(_)) => {}
        }
        if let Some(endpoint) = &options.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some((id, secret)) = &options.credentials {
            secrets.add(Some(id.clone()));
            secrets.add(Some(secret.clone()));
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        // Where the bucket is, for the version key of shared caches
        // (`Store::share_key`): an `s3://` URL does not say.
        let origin = [AmazonS3ConfigKey::Endpoint, AmazonS3ConfigKey::Region]
            .iter()
            .map(|k| builder.get_config_value(k).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(" ");
        let client = builder
            .build()
            .map_err(|e| build_failed(&shown, &secrets, e))?;
        let remote =
            Remote::open(Arc::new(client), path, shown, secrets, tuning)?.with_origin(origin);
        Ok(Self { remote })
    }

    /// The ETag pinned at open.
    pub fn etag(&self) -> Option<&str> {
        self.remote.etag()
    }
}

super::remote::remote_store!(S3Store);

/// The words of an `s3://` URL.
const S3_URL: BucketUrl = BucketUrl {
    scheme: "s3",
    wrong_scheme: "an S3Store opens s3://bucket/key URLs",
    no_bucket: "no bucket (s3://bucket/key)",
    no_key: "no key after the bucket (s3://bucket/key)",
};

/// The object path of an `s3://` URL's path (see `url::object_key`).
#[cfg(test)]
fn key_path(url_path: &str) -> Result<object_store::path::Path, &'static str> {
    super::url::object_key(url_path, S3_URL.no_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_escaped_slash_in_a_key_is_refused_other_escapes_are_decoded() {
        for bad in ["/a%2Fb.bin", "/a%2fb", "/%2F", "/dir/x%2F"] {
            assert!(key_path(bad).unwrap_err().contains("%2F"), "{bad}");
        }
        assert_eq!(key_path("/a%20b/c").unwrap().as_ref(), "a b/c");
        assert_eq!(key_path("/a/b.bin").unwrap().as_ref(), "a/b.bin");
        assert!(key_path("/").is_err());
        assert!(key_path("/dir/").unwrap_err().contains("ends in '/'"));
    }

    #[test]
    fn a_bucket_name_with_an_escape_is_refused_before_any_request() {
        let e = S3Store::open("s3://bucket%2Fother/key").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("bucket name"), "{text}");
    }

    #[test]
    fn debug_shows_neither_the_key_id_nor_the_secret() {
        let options = S3Options {
            credentials: Some(("AKIAEXAMPLEKEYID".into(), "wJalrSECRETKEY".into())),
            ..S3Options::default()
        };
        let text = format!("{options:?}");
        assert!(!text.contains("AKIAEXAMPLEKEYID"), "{text}");
        assert!(!text.contains("wJalrSECRETKEY"), "{text}");
        assert!(text.contains("access_key_id: Some(\"***\")"), "{text}");
    }
}
