//! An object in Google Cloud Storage, or in a server that speaks its XML
//! API (fake-gcs-server): [`GcsStore`].
//!
//! **Pinning.** The client reads an object's ETag and its generation
//! (`x-goog-generation`, which it reports as the version) from the
//! `HEAD` at open, and would send the generation with every GET
//! (`?generation=N`). That would turn a change into the wrong failure:
//! a GET of a generation that is no longer live answers 404 in a bucket
//! without object versioning (GCS's default, and fake-gcs-server's), so
//! the unread pages of an overwritten object would fail as "no such
//! object" rather than as changed. So the generation is pinned (it is
//! part of [`Store::version`](super::Store::version) and of the share
//! key) but not sent: every GET is conditional on the ETag alone
//! (`If-Match`, which GCS honours with `412`), and each answer's ETag is
//! checked against the pin (fake-gcs-server ignores `If-Match`; its
//! answers carry the new ETag, a change all the same). A GCS ETag is the
//! MD5 of the bytes (of a non-composite object), so an ETag that matches
//! is the same bytes, whatever the generation.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use object_store::gcp::{GoogleCloudStorage, GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::path::Path;
use object_store::{
    ClientConfigKey, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use super::remote::{build_failed, Remote, RemoteTuning, Secrets};
use super::url::{bucket_and_key, parse, BucketUrl};
use super::StoreError;

/// An object at a `gs://bucket/key` URL in Google Cloud Storage or a
/// server that speaks its XML API (fake-gcs-server).
///
/// The client is configured from the standard Google environment, as the
/// `object_store` crate reads it: `GOOGLE_SERVICE_ACCOUNT` (also
/// `GOOGLE_SERVICE_ACCOUNT_PATH`, `SERVICE_ACCOUNT`: the path of a service
/// account's JSON key file, whose `gcs_base_url` and `disable_oauth`
/// fields point the client at an emulator), `GOOGLE_SERVICE_ACCOUNT_KEY`
/// (the JSON key itself), `GOOGLE_APPLICATION_CREDENTIALS` (application
/// default credentials: a service account or an authorized user, as
/// `gcloud auth application-default login` writes them; read from
/// `~/.config/gcloud/application_default_credentials.json` when unset),
/// `GOOGLE_BEARER_TOKEN` (a static OAuth token), `GOOGLE_BASE_URL`
/// (another endpoint than `https://storage.googleapis.com`),
/// `GOOGLE_SKIP_SIGNATURE` (public buckets) and `GOOGLE_ALLOW_HTTP`
/// (`false` to refuse a plain-HTTP base URL; allowed by default, as the
/// client does). With none of these, the instance metadata server's
/// credentials are used (Compute Engine, GKE workload identity).
/// `GOOGLE_BUCKET` is ignored: the URL names the bucket.
///
/// The key is the URL's path after the bucket, its percent-escapes
/// decoded (`gs://b/a%20b` is the key `a b`); an escaped `/` (`%2F`) is
/// refused, since tools disagree on whether it names the key `a/b` or the
/// key `a%2Fb`, and so is a key that ends in `/`. A bucket name with an
/// escape is refused too.
///
/// The object's length, ETag and generation are pinned at open; every
/// read is a ranged GET conditional on the ETag (see the module doc for
/// why the generation is not sent, and the `store` module for the rest).
/// Credentials never appear in its errors or its `Debug` output.
pub struct GcsStore {
    remote: Remote,
}

/// Settings of a [`GcsStore`] that override the Google environment, and
/// its request sizes and timeouts. `Debug` never shows the key.
#[derive(Clone, Default)]
pub struct GcsOptions {
    /// The service's base URL (`GOOGLE_BASE_URL` otherwise, then the
    /// service account's `gcs_base_url`; `https://storage.googleapis.com`
    /// if none).
    pub endpoint: Option<String>,
    /// A service account's JSON key. It replaces every credential of the
    /// environment (`GOOGLE_SERVICE_ACCOUNT*`,
    /// `GOOGLE_APPLICATION_CREDENTIALS`, `GOOGLE_BEARER_TOKEN`).
    pub service_account_key: Option<String>,
    /// Whether a plain-HTTP base URL is allowed (`GOOGLE_ALLOW_HTTP`
    /// otherwise; allowed if neither says).
    pub allow_http: Option<bool>,
    /// Request sizes and timeouts.
    pub tuning: RemoteTuning,
}

impl fmt::Debug for GcsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcsOptions")
            .field("endpoint", &self.endpoint)
            .field(
                "service_account_key",
                &self.service_account_key.as_ref().map(|_| "***"),
            )
            .field("allow_http", &self.allow_http)
            .field("tuning", &self.tuning)
            .finish()
    }
}

impl GcsStore {
    /// Opens `gs://bucket/key`, configured from the Google environment.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, &GcsOptions::default())
    }

    /// Opens `gs://bucket/key` with `options` over the Google environment.
    pub fn open_with(url: &str, options: &GcsOptions) -> Result<Self, StoreError> {
        let tuning = options.tuning.clone();
        let (parsed, shown) = parse(url)?;
        let url = BucketUrl {
            scheme: "gs",
            wrong_scheme: "a GcsStore opens gs://bucket/key URLs",
            no_bucket: "no bucket (gs://bucket/key)",
            no_key: "no key after the bucket (gs://bucket/key)",
        };
        let (bucket, path) = bucket_and_key(&parsed, &shown, &url)?;
        let mut secrets = Secrets::default();
        let mut builder = match &options.service_account_key {
            None => GoogleCloudStorageBuilder::from_env(),
            // Every other credential of the environment would conflict
            // with the key (a path and a key are refused together) or win
            // over it (a bearer token).
            Some(key) => google_env()
                .filter(|(k, _)| !is_credential(*k))
                .fold(GoogleCloudStorageBuilder::new(), |b, (k, v)| {
                    b.with_config(k, v)
                })
                .with_service_account_key(key),
        };
        for (key, value) in google_env() {
            if is_secret(key) {
                add_key_secrets(&mut secrets, &value);
            }
        }
        if let Some(key) = &options.service_account_key {
            add_key_secrets(&mut secrets, key);
        }
        // The client's options are replaced by the tuning's: keep the
        // environment's word on plain HTTP, which the client allows by
        // default (the base URL decides).
        let allow_http = GoogleConfigKey::Client(ClientConfigKey::AllowHttp);
        let mut client_options = tuning.client_options(true);
        match options.allow_http {
            Some(allow) => client_options = client_options.with_allow_http(allow),
            None => {
                if let Some(allow) = builder.get_config_value(&allow_http) {
                    client_options = client_options.with_config(ClientConfigKey::AllowHttp, allow);
                }
            }
        }
        builder = builder
            .with_bucket_name(bucket)
            .with_client_options(client_options)
            .with_retry(tuning.retry_config());
        if let Some(endpoint) = &options.endpoint {
            builder = builder.with_base_url(endpoint);
        }
        let client = builder
            .build()
            .map_err(|e| build_failed(&shown, &secrets, e))?;
        // Where the bucket is, for the version key of shared caches
        // (`Store::share_key`): a `gs://` URL does not say.
        let origin = base_url(&client).unwrap_or_default();
        let client = Arc::new(GenerationUnsent(client));
        let remote = Remote::open(client, path, shown, secrets, tuning)?.with_origin(origin);
        Ok(Self { remote })
    }

    /// The ETag pinned at open.
    pub fn etag(&self) -> Option<&str> {
        self.remote.etag()
    }
}

super::remote::remote_store!(GcsStore);

/// The `GOOGLE_*` variables of the environment that configure the client,
/// as `GoogleCloudStorageBuilder::from_env` reads them (`SERVICE_ACCOUNT`
/// too; not a variable that is not Unicode, which it skips), with their
/// keys.
fn google_env() -> impl Iterator<Item = (GoogleConfigKey, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("GOOGLE_") || k == "SERVICE_ACCOUNT")
        .filter_map(|(k, v)| Some((k.to_ascii_lowercase().parse().ok()?, v)))
}

/// Whether `key` says which credentials the client uses.
fn is_credential(key: GoogleConfigKey) -> bool {
    matches!(
        key,
        GoogleConfigKey::ServiceAccount
            | GoogleConfigKey::ServiceAccountKey
            | GoogleConfigKey::ApplicationCredentials
            | GoogleConfigKey::BearerToken
    )
}

/// Whether `key`'s value is itself a secret (not a path to one).
fn is_secret(key: GoogleConfigKey) -> bool {
    matches!(
        key,
        GoogleConfigKey::ServiceAccountKey | GoogleConfigKey::BearerToken
    )
}

/// The shortest run of base64 characters in a key's text taken for key
/// material: a PEM line is 64, a private key ID 40 hex digits; an e-mail
/// address or a URL is never such a run.
const MIN_KEY_RUN: usize = 40;

/// Adds a secret's text (a bearer token, a service account's JSON key)
/// to `secrets`, and every long run of base64 characters in it: the lines
/// of the key's PEM body, its key ID. A message that quoted part of the
/// key would show those, never the whole JSON.
fn add_key_secrets(secrets: &mut Secrets, text: &str) {
    secrets.add(Some(text.to_string()));
    let is_base64 = |c: char| c.is_ascii_alphanumeric() || "+/=".contains(c);
    // JSON writes the PEM's line breaks as `\n`.
    for run in text.replace("\\n", "\n").split(|c: char| !is_base64(c)) {
        if run.len() >= MIN_KEY_RUN {
            secrets.add(Some(run.to_string()));
        }
    }
}

/// The base URL `client` sends its requests to. The client does not say
/// but in its `Debug` output (the configuration: `base_url: "..."`),
/// which is the only place that knows the `gcs_base_url` of a service
/// account file. Read, never shown (it holds the credentials' state too).
/// `None` if the output no longer has it (a test catches that).
fn base_url(client: &GoogleCloudStorage) -> Option<String> {
    const FIELD: &str = "base_url: \"";
    let debug = format!("{client:?}");
    let start = debug.find(FIELD)? + FIELD.len();
    let len = debug[start..].find('"')?;
    Some(debug[start..start + len].to_string())
}

/// The GCS client, its GETs sent without the pinned generation: see the
/// module doc, "Pinning". Everything else is the client's.
#[derive(Debug)]
struct GenerationUnsent(GoogleCloudStorage);

impl fmt::Display for GenerationUnsent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

// `ObjectStore` is an `async_trait`: its async methods are written here as
// the boxed futures that the macro makes of them, the client's own.
impl ObjectStore for GenerationUnsent {
    fn get_opts<'s, 'p, 'f>(
        &'s self,
        location: &'p Path,
        options: GetOptions,
    ) -> BoxFuture<'f, object_store::Result<GetResult>>
    where
        's: 'f,
        'p: 'f,
        Self: 'f,
    {
        let options = GetOptions {
            version: None,
            ..options
        };
        self.0.get_opts(location, options)
    }

    fn put_opts<'s, 'p, 'f>(
        &'s self,
        location: &'p Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> BoxFuture<'f, object_store::Result<PutResult>>
    where
        's: 'f,
        'p: 'f,
        Self: 'f,
    {
        self.0.put_opts(location, payload, opts)
    }

    fn put_multipart_opts<'s, 'p, 'f>(
        &'s self,
        location: &'p Path,
        opts: PutMultipartOptions,
    ) -> BoxFuture<'f, object_store::Result<Box<dyn MultipartUpload>>>
    where
        's: 'f,
        'p: 'f,
        Self: 'f,
    {
        self.0.put_multipart_opts(location, opts)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }

    fn list_with_delimiter<'s, 'p, 'f>(
        &'s self,
        prefix: Option<&'p Path>,
    ) -> BoxFuture<'f, object_store::Result<ListResult>>
    where
        's: 'f,
        'p: 'f,
        Self: 'f,
    {
        self.0.list_with_delimiter(prefix)
    }

    fn copy_opts<'s, 'a, 'b, 'f>(
        &'s self,
        from: &'a Path,
        to: &'b Path,
        options: CopyOptions,
    ) -> BoxFuture<'f, object_store::Result<()>>
    where
        's: 'f,
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        self.0.copy_opts(from, to, options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RemoteErrorKind;

    fn bad_url_reason(url: &str) -> &'static str {
        match GcsStore::open(url) {
            Err(StoreError::Remote {
                kind: RemoteErrorKind::BadUrl(why),
                ..
            }) => why,
            Err(other) => panic!("{url}: expected a bad URL, got {other}"),
            Ok(_) => panic!("{url}: opened"),
        }
    }

    #[test]
    fn a_bucket_and_a_key_are_required_and_checked_before_any_request() {
        assert!(bad_url_reason("gs:///key").contains("no bucket"));
        assert!(bad_url_reason("gs://bucket").contains("no key"));
        assert!(bad_url_reason("gs://bucket/").contains("no key"));
        assert!(bad_url_reason("gs://bucket/dir/").contains("ends in '/'"));
        assert!(bad_url_reason("gs://bucket/a%2Fb").contains("%2F"));
        assert!(bad_url_reason("gs://bucket%2Fother/key").contains("bucket name"));
        assert!(bad_url_reason("s3://bucket/key").contains("gs://"));
    }

    #[test]
    fn escapes_in_a_key_are_decoded() {
        let key = super::super::url::object_key("/a%20b/c", "no key").unwrap();
        assert_eq!(key.as_ref(), "a b/c");
    }

    #[test]
    fn debug_shows_no_key() {
        let options = GcsOptions {
            service_account_key: Some("{\"private_key\": \"MIIEvQIBADANBgkq\"}".into()),
            ..GcsOptions::default()
        };
        let text = format!("{options:?}");
        assert!(!text.contains("MIIEvQ"), "{text}");
        assert!(
            text.contains("service_account_key: Some(\"***\")"),
            "{text}"
        );
    }

    /// A made-up key in the shape of a service account's JSON key.
    const KEY_LINE: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj";
    const KEY_ID: &str = "0123456789abcdef0123456789abcdef01234567";

    fn fake_key() -> String {
        format!(
            "{{\"type\": \"service_account\", \"private_key_id\": \"{KEY_ID}\", \
             \"private_key\": \"-----BEGIN PRIVATE KEY-----\\n{KEY_LINE}\\n\
             -----END PRIVATE KEY-----\\n\", \"client_email\": \"a@b.iam.gserviceaccount.com\"}}"
        )
    }

    #[test]
    fn a_keys_material_is_secret_its_email_is_not() {
        let mut secrets = Secrets::default();
        add_key_secrets(&mut secrets, &fake_key());
        let text = format!(
            "{} {KEY_ID} {KEY_LINE} a@b.iam.gserviceaccount.com",
            fake_key()
        );
        let scrubbed = secrets.scrub(&text);
        assert!(!scrubbed.contains(KEY_ID), "{scrubbed}");
        assert!(!scrubbed.contains(KEY_LINE), "{scrubbed}");
        assert!(
            scrubbed.contains("a@b.iam.gserviceaccount.com"),
            "{scrubbed}"
        );
    }

    #[test]
    fn a_bad_key_fails_the_open_without_showing_it() {
        // The key is not a valid RSA key: the client refuses it when it
        // is built, before any request.
        let options = GcsOptions {
            service_account_key: Some(fake_key()),
            endpoint: Some("http://127.0.0.1:9".into()),
            ..GcsOptions::default()
        };
        let e = GcsStore::open_with("gs://bucket/key", &options).unwrap_err();
        let text = format!("{e} {e:?} {}", crate::base::report::error_text(&e));
        assert!(text.contains("gs://bucket/key"), "{text}");
        assert!(!text.contains(KEY_LINE) && !text.contains(KEY_ID), "{text}");
    }

    #[test]
    fn the_base_url_is_read_from_the_client() {
        let client = GoogleCloudStorageBuilder::new()
            .with_bucket_name("b")
            .with_bearer_token("t0ken")
            .with_base_url("http://127.0.0.1:4443")
            .build()
            .unwrap();
        assert_eq!(base_url(&client).as_deref(), Some("http://127.0.0.1:4443"));
    }
}
