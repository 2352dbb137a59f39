//! An object in Azure Blob Storage, or in Azurite, its emulator:
//! [`AzureStore`].
//!
//! **Pinning.** The client reads a blob's ETag and its version id
//! (`x-ms-version-id`) from the `HEAD` at open, and sends both with every
//! GET (`If-Match`, `?versionid=`), as the S3 store does. The version id
//! is there only on an account with blob versioning on: there, an
//! overwritten blob's pinned version stays readable (it becomes a
//! previous version), so its unread pages are read from the pinned bytes
//! rather than failing as changed, as on a versioned S3 bucket. Without
//! versioning (Azure's default, and Azurite, which has none), a changed
//! blob fails `If-Match` with `412` and its unread pages fail
//! ([`RemoteErrorKind::Changed`]).
//!
//! **A missing container.** A `HEAD` answers a missing container and a
//! missing blob alike (a bare 404: the reason is in a header the client
//! does not keep). When the open finds no blob, one more GET asks: its
//! body names `ContainerNotFound`, which is reported as
//! [`RemoteErrorKind::NoSuchBucket`].

use std::fmt;
use std::io;
use std::sync::Arc;

use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::path::Path;
use object_store::{ClientConfigKey, GetOptions, GetRange, ObjectStore};

use super::remote::{block_on, build_failed, Remote, RemoteErrorKind, RemoteTuning, Secrets};
use super::url::{bad_url, object_key, parse_with_user};
use super::StoreError;
use crate::base::report::error_text;

/// An object at an `az://container/key` URL in Azure Blob Storage or
/// Azurite; `abfs://` and `abfss://` are read the same way, with the
/// container as the host (`abfss://container/key`) or, as the Hadoop
/// driver writes them, with the account too
/// (`abfss://container@account.dfs.core.windows.net/key`; `.blob.` and
/// Fabric's `.dfs.fabric.microsoft.com` hosts as well). The blob is read
/// through the Blob API in every case.
///
/// The client is configured from the standard Azure environment, as the
/// `object_store` crate reads it: `AZURE_STORAGE_ACCOUNT_NAME`,
/// `AZURE_STORAGE_ACCOUNT_KEY` (also `AZURE_STORAGE_ACCESS_KEY`),
/// `AZURE_STORAGE_SAS_KEY` (also `AZURE_STORAGE_SAS_TOKEN`: a shared
/// access signature, percent-encoded as the portal gives it),
/// `AZURE_STORAGE_TOKEN` (a bearer token), a service principal
/// (`AZURE_STORAGE_CLIENT_ID`, `AZURE_STORAGE_CLIENT_SECRET`,
/// `AZURE_STORAGE_TENANT_ID`), workload identity
/// (`AZURE_FEDERATED_TOKEN_FILE` with the client and tenant ids),
/// `AZURE_USE_AZURE_CLI`, the managed identity of the machine otherwise
/// (`AZURE_MSI_ENDPOINT`, `AZURE_OBJECT_ID`, `AZURE_MSI_RESOURCE_ID`),
/// `AZURE_CREDENTIAL_TYPE` to choose among several,
/// `AZURE_STORAGE_ENDPOINT` (another endpoint than
/// `https://<account>.blob.core.windows.net`), `AZURE_ALLOW_HTTP`
/// (`true` for a plain-HTTP endpoint), `AZURE_SKIP_SIGNATURE` (public
/// containers), and `AZURE_STORAGE_ENCRYPTION_KEY` (a customer-provided
/// key). `AZURE_STORAGE_USE_EMULATOR=true` reads from Azurite instead, at
/// `AZURITE_BLOB_STORAGE_URL` (default `http://127.0.0.1:10000`), as
/// account `devstoreaccount1` with Azurite's well-known key unless the
/// variables above name others. `AZURE_CONTAINER_NAME` is ignored: the
/// URL names the container.
///
/// The key is the URL's path after the container, its percent-escapes
/// decoded (`az://c/a%20b` is the blob `a b`); an escaped `/` (`%2F`) is
/// refused, since tools disagree on whether it names the blob `a/b` or
/// the blob `a%2Fb`, and so is a key that ends in `/`. A container name
/// other than lowercase letters, digits and '-' is refused too.
///
/// The blob's length, ETag and version id (with blob versioning) are
/// pinned at open; every read is a ranged GET conditional on them (see
/// the module doc, and the `store` module). Credentials never appear in
/// its errors or its `Debug` output.
pub struct AzureStore {
    remote: Remote,
}

/// Settings of an [`AzureStore`] that override the Azure environment,
/// and its request sizes and timeouts. `Debug` never shows the key.
#[derive(Clone, Default)]
pub struct AzureOptions {
    /// The blob service's URL (`AZURE_STORAGE_ENDPOINT` otherwise;
    /// `https://<account>.blob.core.windows.net` if neither). Given, it
    /// turns the emulator mode (`AZURE_STORAGE_USE_EMULATOR`) off: to
    /// reach Azurite through it, name the account in its path
    /// (`http://127.0.0.1:10000/devstoreaccount1`) and give the account's
    /// key in `credentials`.
    pub endpoint: Option<String>,
    /// The account's name and key. They replace every credential of the
    /// environment (`AZURE_STORAGE_ACCOUNT_NAME` and
    /// `AZURE_STORAGE_ACCOUNT_KEY` otherwise).
    pub credentials: Option<(String, String)>,
    /// Whether a plain-HTTP endpoint is allowed (`AZURE_ALLOW_HTTP`
    /// otherwise; the emulator mode always allows it).
    pub allow_http: Option<bool>,
    /// Request sizes and timeouts.
    pub tuning: RemoteTuning,
}

impl fmt::Debug for AzureOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureOptions")
            .field("endpoint", &self.endpoint)
            .field(
                "account",
                &self.credentials.as_ref().map(|(account, _)| account),
            )
            .field("key", &self.credentials.as_ref().map(|_| "***"))
            .field("allow_http", &self.allow_http)
            .field("tuning", &self.tuning)
            .finish()
    }
}

impl AzureStore {
    /// Opens `az://container/key` (or `abfs[s]://`), configured from the
    /// Azure environment.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with(url, &AzureOptions::default())
    }

    /// Opens `az://container/key` (or `abfs[s]://`) with `options` over
    /// the Azure environment.
    pub fn open_with(url: &str, options: &AzureOptions) -> Result<Self, StoreError> {
        let tuning = options.tuning.clone();
        let (parsed, shown) = parse_with_user(url)?;
        let place = locate(&parsed).map_err(|why| bad_url(&shown, why))?;
        let path = object_key(
            parsed.path(),
            "no key after the container (az://container/key)",
        )
        .map_err(|why| bad_url(&shown, why))?;
        let mut secrets = Secrets::default();
        for (key, value) in azure_env() {
            if is_secret(key) {
                add_secret(&mut secrets, key, &value);
            }
        }
        let mut builder = MicrosoftAzureBuilder::from_env().with_container_name(place.container);
        if let Some(account) = place.account {
            builder = builder.with_account(account);
        }
        if place.fabric {
            builder = builder.with_config(AzureConfigKey::UseFabricEndpoint, "true");
        }
        if let Some(endpoint) = &options.endpoint {
            builder = builder
                .with_config(AzureConfigKey::UseEmulator, "false")
                .with_endpoint(endpoint.clone());
        }
        if let Some((account, key)) = &options.credentials {
            secrets.add(Some(key.clone()));
            // The type: else a bearer token or a SAS of the environment
            // would win over the key.
            builder = builder
                .with_account(account)
                .with_access_key(key)
                .with_config(AzureConfigKey::CredentialType, "access_key");
        }
        // The client's options are replaced by the tuning's: keep the
        // environment's word on plain HTTP.
        let allow_http = AzureConfigKey::Client(ClientConfigKey::AllowHttp);
        let mut client_options = tuning.client_options(false);
        match options.allow_http {
            Some(allow) => client_options = client_options.with_allow_http(allow),
            None => {
                if let Some(allow) = builder.get_config_value(&allow_http) {
                    client_options = client_options.with_config(ClientConfigKey::AllowHttp, allow);
                }
            }
        }
        builder = builder
            .with_client_options(client_options)
            .with_retry(tuning.retry_config());
        let origin = origin(&builder);
        let client: Arc<dyn ObjectStore> = Arc::new(
            builder
                .build()
                .map_err(|e| build_failed(&shown, &secrets, e))?,
        );
        let opened = std::time::Instant::now();
        let remote = Remote::open(
            client.clone(),
            path.clone(),
            shown,
            secrets.clone(),
            tuning.clone(),
        )
        .map_err(|e| {
            // What is left of the open's deadline bounds the extra GET.
            let left = tuning.open_timeout.saturating_sub(opened.elapsed());
            tell_missing_container(&client, &path, &secrets, left, e)
        })?
        .with_origin(origin);
        Ok(Self { remote })
    }

    /// The ETag pinned at open.
    pub fn etag(&self) -> Option<&str> {
        self.remote.etag()
    }
}

super::remote::remote_store!(AzureStore);

/// Where a URL says a blob is.
#[derive(Debug, PartialEq, Eq)]
struct Place<'a> {
    container: &'a str,
    /// The account, if the URL names it (`container@account.dfs...`).
    account: Option<&'a str>,
    /// Whether the account is Fabric's (`*.fabric.microsoft.com`).
    fabric: bool,
}

/// The container and account of an `az://`, `abfs://` or `abfss://` URL:
/// the host, or the user and the host's first label, as `object_store`
/// reads them.
fn locate(url: &url::Url) -> Result<Place<'_>, &'static str> {
    if !matches!(url.scheme(), "az" | "abfs" | "abfss") {
        return Err("an AzureStore opens az://container/key, abfs:// and abfss:// URLs");
    }
    let host = url.host_str().unwrap_or_default();
    let place = if url.username().is_empty() {
        Place {
            container: host,
            account: None,
            fabric: false,
        }
    } else {
        let (account, domain) = host.split_once('.').unwrap_or((host, ""));
        let fabric = match domain {
            "dfs.core.windows.net" | "blob.core.windows.net" => false,
            "dfs.fabric.microsoft.com" | "blob.fabric.microsoft.com" => true,
            _ => {
                return Err(
                    "the host of container@host is not an Azure storage account's \
                     (<account>.dfs.core.windows.net or .blob.core.windows.net)",
                )
            }
        };
        if account.is_empty() || !account.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err("an account name is letters and digits");
        }
        Place {
            container: url.username(),
            account: Some(account),
            fabric,
        }
    };
    if place.container.is_empty() {
        return Err("no container (az://container/key)");
    }
    let name_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
    if !place.container.bytes().all(name_char) {
        return Err("a container name is lowercase letters, digits and '-' (no escapes)");
    }
    Ok(place)
}

/// The `AZURE_*` variables of the environment that configure the client,
/// as `MicrosoftAzureBuilder::from_env` reads them (not a variable that
/// is not Unicode, which it skips), with their keys.
fn azure_env() -> impl Iterator<Item = (AzureConfigKey, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("AZURE_"))
        .filter_map(|(k, v)| Some((k.to_ascii_lowercase().parse().ok()?, v)))
}

/// Whether `key`'s value is a secret.
fn is_secret(key: AzureConfigKey) -> bool {
    matches!(
        key,
        AzureConfigKey::AccessKey
            | AzureConfigKey::SasKey
            | AzureConfigKey::Token
            | AzureConfigKey::ClientSecret
            | AzureConfigKey::FabricSessionToken
            | AzureConfigKey::EncryptionKey
    )
}

/// Adds the secret `value` of `key` to `secrets`; for a SAS, its
/// signature too, as the SAS gives it, decoded, and encoded as a request
/// URL carries it (the client sends the SAS as query pairs, which a
/// message may quote).
fn add_secret(secrets: &mut Secrets, key: AzureConfigKey, value: &str) {
    secrets.add(Some(value.to_string()));
    if key != AzureConfigKey::SasKey {
        return;
    }
    let pairs = value.trim_start_matches('?').split('&');
    for signature in pairs.filter_map(|pair| pair.trim().strip_prefix("sig=")) {
        let decoded = percent_decode(signature);
        let encoded: String = url::form_urlencoded::byte_serialize(decoded.as_bytes()).collect();
        secrets.add(Some(signature.to_string()));
        secrets.add(Some(encoded));
        secrets.add(Some(decoded));
    }
}

/// `text` with its `%XX` escapes decoded, as the client decodes a SAS
/// (an invalid escape is kept; a `+` stays a `+`).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escape = bytes
            .get(at + 1..at + 3)
            .filter(|hex| bytes[at] == b'%' && hex.iter().all(u8::is_ascii_hexdigit))
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match escape {
            Some(byte) => {
                out.push(byte);
                at += 3;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the container is, for the version key of shared caches
/// (`Store::share_key`): an `az://` URL does not say. The settings that
/// choose the service, as given (two that name one place in different
/// words only share less).
fn origin(builder: &MicrosoftAzureBuilder) -> String {
    let emulator = builder
        .get_config_value(&AzureConfigKey::UseEmulator)
        .unwrap_or_default();
    let emulator_url = std::env::var("AZURITE_BLOB_STORAGE_URL").unwrap_or_default();
    let rest = [
        AzureConfigKey::Endpoint,
        AzureConfigKey::AccountName,
        AzureConfigKey::UseFabricEndpoint,
    ]
    .map(|k| builder.get_config_value(&k).unwrap_or_default());
    format!(
        "emulator {emulator} {emulator_url} endpoint {} account {} fabric {}",
        rest[0], rest[1], rest[2]
    )
}

/// `e`, or, if it is a missing blob and a GET of its first byte (within
/// `left`, what is left of the open's deadline) says its container is
/// missing, [`RemoteErrorKind::NoSuchBucket`] (see the module doc).
fn tell_missing_container(
    client: &Arc<dyn ObjectStore>,
    path: &Path,
    secrets: &Secrets,
    left: std::time::Duration,
    e: StoreError,
) -> StoreError {
    let StoreError::Remote {
        url,
        kind: RemoteErrorKind::NotFound,
        ..
    } = &e
    else {
        return e;
    };
    if left.is_zero() {
        return e;
    }
    let (c, p, timeout) = (client.clone(), path.clone(), left);
    let options = GetOptions {
        range: Some(GetRange::Bounded(0..1)),
        ..GetOptions::default()
    };
    let get = async move { tokio::time::timeout(timeout, c.get_opts(&p, options)).await };
    match block_on(get) {
        Ok(Ok(Err(get))) if error_text(&get).contains("ContainerNotFound") => StoreError::Remote {
            url: url.clone(),
            kind: RemoteErrorKind::NoSuchBucket,
            source: Some(io::Error::other(secrets.scrub(&error_text(&get)))),
        },
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(url: &str) -> Result<(String, Option<String>, bool), &'static str> {
        let parsed = url::Url::parse(url).unwrap();
        locate(&parsed).map(|p| {
            (
                p.container.to_string(),
                p.account.map(str::to_string),
                p.fabric,
            )
        })
    }

    fn bad_url_reason(url: &str) -> &'static str {
        match AzureStore::open(url) {
            Err(StoreError::Remote {
                kind: RemoteErrorKind::BadUrl(why),
                ..
            }) => why,
            Err(other) => panic!("{url}: expected a bad URL, got {other}"),
            Ok(_) => panic!("{url}: opened"),
        }
    }

    #[test]
    fn containers_and_accounts_are_read_as_object_store_reads_them() {
        assert_eq!(place("az://data/k"), Ok(("data".into(), None, false)));
        assert_eq!(place("abfs://data/k"), Ok(("data".into(), None, false)));
        assert_eq!(
            place("abfss://data@acct.dfs.core.windows.net/k"),
            Ok(("data".into(), Some("acct".into()), false))
        );
        assert_eq!(
            place("abfs://data@acct.blob.core.windows.net/k"),
            Ok(("data".into(), Some("acct".into()), false))
        );
        assert_eq!(
            place("abfss://data@acct.dfs.fabric.microsoft.com/k"),
            Ok(("data".into(), Some("acct".into()), true))
        );
        assert!(place("abfss://data@example.com/k").is_err());
        assert!(place("abfss://data@.dfs.core.windows.net/k").is_err());
        assert!(place("gs://data/k").is_err());
    }

    #[test]
    fn a_container_and_a_key_are_required_and_checked_before_any_request() {
        assert!(bad_url_reason("az:///key").contains("no container"));
        assert!(bad_url_reason("az://container").contains("no key"));
        assert!(bad_url_reason("az://container/").contains("no key"));
        assert!(bad_url_reason("az://container/dir/").contains("ends in '/'"));
        assert!(bad_url_reason("az://container/a%2Fb").contains("%2F"));
        assert!(bad_url_reason("az://Container/key").contains("container name"));
        assert!(bad_url_reason("az://con%20tainer/key").contains("container name"));
        assert!(bad_url_reason("abfss://c@example.com/key").contains("host"));
        assert!(bad_url_reason("http://c/key").contains("az://"));
    }

    #[test]
    fn a_password_or_a_sas_in_the_url_is_refused_and_never_shown() {
        for url in [
            "abfss://c:hunter2secret@acct.dfs.core.windows.net/key",
            "az://c/key?sv=2022&sig=hunter2secret",
        ] {
            let e = AzureStore::open(url).unwrap_err();
            let text = format!("{e} {e:?}");
            assert!(!text.contains("hunter2"), "{text}");
            assert!(matches!(
                e,
                StoreError::Remote {
                    kind: RemoteErrorKind::BadUrl(_),
                    ..
                }
            ));
        }
        // The container of `container@account` is shown: it is no secret.
        let e = AzureStore::open("abfss://c:pw12345@acct.dfs.core.windows.net/key").unwrap_err();
        assert!(e.to_string().contains("abfss://c@acct"), "{e}");
    }

    #[test]
    fn a_sas_signature_is_secret_in_every_encoding() {
        let sas = "sv=2022-11-02&ss=b&srt=o&sp=r&sig=abc%2Bdef%2Fghi%3D";
        let mut secrets = Secrets::default();
        add_secret(&mut secrets, AzureConfigKey::SasKey, sas);
        for shown in [
            sas,
            "abc%2Bdef%2Fghi%3D",
            "abc+def/ghi=",
            "abc%2Bdef%2Fghi%3D",
        ] {
            let text = secrets.scrub(&format!("GET http://h/c/k?{shown} failed"));
            assert!(!text.contains("abc"), "{text}");
        }
        assert_eq!(percent_decode("a%2Bb%zz+c%2"), "a+b%zz+c%2");
    }

    #[test]
    fn debug_shows_the_account_but_not_its_key() {
        let options = AzureOptions {
            credentials: Some(("acct".into(), "S3CRETKEYBASE64==".into())),
            ..AzureOptions::default()
        };
        let text = format!("{options:?}");
        assert!(!text.contains("S3CRETKEY"), "{text}");
        assert!(
            text.contains("acct") && text.contains("key: Some(\"***\")"),
            "{text}"
        );
    }

    #[test]
    fn an_invalid_key_fails_the_open_without_showing_it() {
        // Not base64: refused when the client is built, before any request.
        let options = AzureOptions {
            endpoint: Some("http://127.0.0.1:9/acct".into()),
            credentials: Some(("acct".into(), "not*base64*hunter2secret".into())),
            ..AzureOptions::default()
        };
        let e = AzureStore::open_with("az://c/key", &options).unwrap_err();
        let text = format!("{e} {e:?} {}", error_text(&e));
        assert!(text.contains("az://c/key"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
}
