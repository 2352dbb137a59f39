#![cfg(not(loom))]
//! Remote objects on real servers: nginx for HTTP ranges, versitygw for
//! S3, a GCS stub (GCS's XML API over a folder) and Azurite for Azure
//! Blob, all started by `scripts/remote-servers up` (which
//! `scripts/test-all` runs around `cargo test`), and the fault-injecting
//! proxy of `faultmap-proxy` between faultmap and them.
//!
//! Every object is a file written into a server's root (a blob put into
//! Azurite, which keeps them in memory); every read is checked byte for
//! byte (CRC and a full comparison) against those bytes. Each test that
//! runs for one object store runs for every kind (`KINDS`), or says why
//! not.

mod common;
use common::MapTrusted;

use std::sync::Arc;
use std::time::Duration;

use common::remote::*;
use common::*;
use faultmap::{
    open_url, Advice, AzureOptions, AzureStore, Config, Delivery, GcsOptions, GcsStore, HttpStore,
    IoErrorKind, MapOptions, Pager, RemoteErrorKind, RemoteTuning, S3Options, S3Store, Store,
};
use faultmap_proxy::{ErrorStatus, Fault, Proxy};

fn pager(delivery: Delivery) -> Pager {
    Pager::new(Config::default().delivery(delivery)).unwrap()
}

const DELIVERIES: [Delivery; 2] = [Delivery::Signal, Delivery::Handler];

// ---------------------------------------------------------------------------
// Bytes.
// ---------------------------------------------------------------------------

#[test]
fn small_objects_read_right_on_every_server_every_order_both_deliveries() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            for len in [0usize, 1, 4095, 4096, 4097, 3 * 4096 + 17] {
                let file = put(kind, "small", len, len as u64 + 1);
                for delivery in DELIVERIES {
                    let pager = pager(delivery);
                    for order in 0..=9u8 {
                        let store = open(kind, &file.url).unwrap();
                        assert_eq!(store.len(), len as u64);
                        let map = pager
                            .map_trusted(store, MapOptions::new().fault_around_order(order))
                            .unwrap();
                        let what = format!("{kind:?} {len} bytes, {delivery:?}, order {order}");
                        assert_eq!(crc(&map), crc(&file.data), "{what}");
                        assert_bytes(&map, &file.data, &what);
                    }
                }
            }
        }
    });
}

#[test]
fn a_few_mib_of_odd_length_read_right_in_every_order() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "mib", 5 * (1 << 20) + 1234, 11);
            for delivery in DELIVERIES {
                let pager = pager(delivery);
                for order in [0u8, 4, 9] {
                    let map = pager
                        .map_trusted(
                            open(kind, &file.url).unwrap(),
                            MapOptions::new().fault_around_order(order),
                        )
                        .unwrap();
                    let what = format!("{kind:?} {delivery:?} order {order}");
                    assert_bytes(&map, &file.data, &what);
                    let s = map.stats();
                    assert!(s.io_bytes >= file.data.len() as u64, "{what}: {s:?}");
                }
            }
        }
    });
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

#[test]
fn open_url_opens_every_server_and_local_paths() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "url", 10_000, 12);
            let store = open_url(&file.url).unwrap();
            assert_eq!(store.len(), 10_000);
            assert_eq!(store.name(), file.url);
            // Where the object lives is part of its key for shared caches
            // (a `gs://` or `az://` URL does not say).
            let key = store.share_key().unwrap();
            assert!(key.contains(&server_url(kind)), "{kind:?}: {key}");
            let mut buf = vec![0u8; 100];
            store.read_at(4000, &mut buf).unwrap();
            assert_eq!(buf, file.data[4000..4100]);
        }
        let local = TestFile::new(5000, 13);
        assert_eq!(open_url(local.path.to_str().unwrap()).unwrap().len(), 5000);
    });
}

#[test]
fn threads_and_several_mappings_of_one_object_read_right() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = Arc::new(put(kind, "threads", 3 * (1 << 20) + 77, 14));
            let pager = Arc::new(pager(Delivery::Signal));
            let object = pager.open(open(kind, &file.url).unwrap()).unwrap();
            let maps: Vec<_> = (0..3)
                .map(|_| Arc::new(pager.map_trusted(&object, MapOptions::new()).unwrap()))
                .collect();
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let (map, file) = (maps[t % maps.len()].clone(), file.clone());
                    std::thread::spawn(move || {
                        // Each thread reads from another starting point.
                        let n = file.data.len();
                        let start = (t * n / 4) & !(PAGE - 1);
                        let mut sum = 0u64;
                        for i in (start..n).chain(0..start).step_by(509) {
                            assert_eq!(map[i], file.data[i], "byte {i}");
                            sum += u64::from(map[i]);
                        }
                        sum
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            for map in &maps {
                assert_bytes(map, &file.data, &format!("{kind:?} mapping"));
            }
        }
    });
}

// ---------------------------------------------------------------------------
// Errors at open.
// ---------------------------------------------------------------------------

#[test]
fn a_missing_object_is_not_found_naming_the_url() {
    let s = servers();
    for (kind, url) in [
        (Kind::Http, format!("{}/no-such-object", s.http_url)),
        (Kind::S3, format!("s3://{}/no-such-object", s.s3_bucket)),
        (Kind::Gcs, format!("gs://{}/no-such-object", s.gs_bucket)),
        (
            Kind::Azure,
            format!("az://{}/no-such-object", s.az_container),
        ),
    ] {
        let e = open(kind, &url).err().expect("opened a missing object");
        assert_eq!(remote_kind(&e), RemoteErrorKind::NotFound, "{kind:?}: {e}");
        assert!(e.to_string().contains(&url), "{e}");
    }
}

/// A missing bucket (S3, GCS) or container (Azure) on each object store.
#[test]
fn a_missing_bucket_is_told_apart_from_a_missing_key() {
    for (kind, url) in [
        (Kind::S3, "s3://no-such-bucket-faultmap/key"),
        (Kind::Gcs, "gs://no-such-bucket-faultmap/key"),
        (Kind::Azure, "az://no-such-container-faultmap/key"),
    ] {
        let e = open(kind, url).err().expect("opened in a missing bucket");
        assert_eq!(
            remote_kind(&e),
            RemoteErrorKind::NoSuchBucket,
            "{kind:?}: {e}"
        );
        assert!(e.to_string().contains(url), "{kind:?}: {e}");
    }
}

#[test]
fn a_connection_refused_a_dns_failure_and_a_tls_failure_are_told_apart() {
    let dead = free_port();
    for kind in KINDS {
        // Plain HTTP finds its server in the object's URL; an object
        // store, at its endpoint.
        let fail = |endpoint: &str| {
            let url = match kind {
                Kind::Http => format!("{endpoint}/x"),
                _ => object_url(kind, "x"),
            };
            try_open_at(kind, endpoint, &url, RemoteTuning::default())
                .err()
                .expect("opened")
        };
        let e = fail(&format!("http://127.0.0.1:{dead}"));
        let refused = RemoteErrorKind::ConnectionRefused;
        assert_eq!(remote_kind(&e), refused, "{kind:?}: {e}");
        let e = fail("http://no-such-host.invalid");
        assert_eq!(remote_kind(&e), RemoteErrorKind::Dns, "{kind:?}: {e}");
        // TLS to the server's plain-HTTP port.
        let e = fail(&server_url(kind).replacen("http://", "https://", 1));
        assert_eq!(remote_kind(&e), RemoteErrorKind::Tls, "{kind:?}: {e}");
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    port
}

/// S3 with a wrong secret key, Azure with a wrong account key (in a
/// private container: Azurite serves a public one's blobs whatever the
/// key). Not GCS: its stub (`scripts/gcs-stub.py`) checks no credentials
/// (the client sends none with `disable_oauth`, as against
/// fake-gcs-server), so no key is wrong there; its secrets are checked by
/// `a_gcs_key_is_never_shown` below and by the store's unit tests.
#[test]
fn wrong_credentials_are_access_denied_and_never_shown() {
    // S3.
    let file = put(Kind::S3, "denied", 5000, 15);
    let secret = "faultmap-wrong-secret-0123456789";
    let options = S3Options {
        credentials: Some((env("AWS_ACCESS_KEY_ID"), secret.to_string())),
        ..S3Options::default()
    };
    let e = S3Store::open_with(&file.url, &options).unwrap_err();
    assert_eq!(remote_kind(&e), RemoteErrorKind::AccessDenied, "{e}");
    let text = format!("{e} {e:?} {} {options:?}", error_chain(&e));
    assert!(!text.contains(secret), "the secret leaked: {text}");

    // Azure: an account key is base64 (anything else is refused before a
    // request is made). The right key reads the blob.
    let file = put_private_blob("denied", 5000, 15);
    let (account, key) = azurite_account();
    let right = AzureOptions {
        credentials: Some((account.clone(), key)),
        ..AzureOptions::default()
    };
    assert_eq!(
        AzureStore::open_with(&file.url, &right).unwrap().len(),
        5000
    );
    let secret = "ZmF1bHRtYXAtd3Jvbmctc2VjcmV0LTAxMjM0NTY3ODk=";
    let options = AzureOptions {
        credentials: Some((account, secret.to_string())),
        ..AzureOptions::default()
    };
    let e = AzureStore::open_with(&file.url, &options).unwrap_err();
    assert_eq!(remote_kind(&e), RemoteErrorKind::AccessDenied, "{e}");
    let text = format!("{e} {e:?} {} {options:?}", error_chain(&e));
    assert!(!text.contains(secret), "the secret leaked: {text}");
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut s = e.source();
    while let Some(x) = s {
        out += &format!(": {x}");
        s = x.source();
    }
    out
}

#[test]
fn the_store_debug_output_holds_no_secret() {
    let file = put(Kind::S3, "debug", 100, 16);
    let store = S3Store::open(&file.url).unwrap();
    let text = format!("{store:?}");
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    assert!(!text.contains(&secret), "{text}");
    assert!(text.contains(&file.url), "{text}");

    // Azure, with the account's key given.
    let file = put(Kind::Azure, "debug", 100, 16);
    let (account, key) = azurite_account();
    let options = AzureOptions {
        credentials: Some((account, key.clone())),
        ..AzureOptions::default()
    };
    let store = AzureStore::open_with(&file.url, &options).unwrap();
    let text = format!("{store:?} {options:?}");
    assert!(!text.contains(&key), "{text}");
    assert!(text.contains(&file.url), "{text}");
}

/// A made-up private key and key ID, in a service account's JSON key
/// that points the client at the GCS stub (`disable_oauth`: the key is
/// never used to sign, as with the stub's own service account file).
const GCS_KEY_LINE: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj";
const GCS_KEY_ID: &str = "0123456789abcdef0123456789abcdef01234567";

fn gcs_key() -> String {
    format!(
        "{{\"gcs_base_url\": \"{}\", \"disable_oauth\": true, \
         \"client_email\": \"faultmap@example.iam.gserviceaccount.com\", \
         \"private_key_id\": \"{GCS_KEY_ID}\", \"private_key\": \
         \"-----BEGIN PRIVATE KEY-----\\n{GCS_KEY_LINE}\\n-----END PRIVATE KEY-----\\n\"}}",
        server_url(Kind::Gcs)
    )
}

#[test]
fn a_gcs_key_is_never_shown() {
    let file = put(Kind::Gcs, "gcskey", 100, 16);
    let options = GcsOptions {
        service_account_key: Some(gcs_key()),
        ..GcsOptions::default()
    };
    let store = GcsStore::open_with(&file.url, &options).unwrap();
    let mut buf = [0u8; 100];
    store.read_at(0, &mut buf).unwrap();
    assert_eq!(buf[..], file.data[..]);
    let missing = object_url(Kind::Gcs, "no-such-object");
    let e = GcsStore::open_with(&missing, &options).unwrap_err();
    assert_eq!(remote_kind(&e), RemoteErrorKind::NotFound, "{e}");
    let text = format!("{store:?} {options:?} {e} {e:?} {}", error_chain(&e));
    for secret in [GCS_KEY_LINE, GCS_KEY_ID] {
        assert!(!text.contains(secret), "the key leaked: {text}");
    }
    assert!(text.contains(&file.url), "{text}");
}

// ---------------------------------------------------------------------------
// Consistency.
// ---------------------------------------------------------------------------

#[test]
fn a_changed_object_fails_its_unread_pages_never_mixing_versions() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "changed", 64 * PAGE, 17);
            let pager = pager(Delivery::Signal);
            let store = open(kind, &file.url).unwrap();
            let object = pager.open(store).unwrap();
            // Another store of the object, read directly below.
            let direct = open(kind, &file.url).unwrap();
            // Read page 0 only (no readahead window reaches the rest).
            let map = pager
                .map_trusted(&object, MapOptions::new().fault_around_order(0))
                .unwrap();
            map.advise(faultmap::Advice::Random, 0..map.len()).unwrap();
            assert_eq!(touch(&map, 0), file.data[0]);
            // A new version of the object, same length.
            file.rewrite(&pattern(64 * PAGE, 18));
            // Let the mtime move on for servers with one-second ETags.
            std::thread::sleep(Duration::from_millis(1100));
            file.rewrite(&pattern(64 * PAGE, 18));
            let mut buf = vec![0u8; PAGE];
            let e = direct.read_at(40 * PAGE as u64, &mut buf).unwrap_err();
            assert_eq!(remote_kind(&e), RemoteErrorKind::Changed, "{kind:?}: {e}");
            let r = page_range(&map, 40);
            map.advise(faultmap::Advice::WillNeed, r).unwrap();
            assert!(
                wait_until(Duration::from_secs(20), || !object.io_errors().is_empty()),
                "{kind:?}: no error for a read of the changed object"
            );
            let reports = object.io_errors();
            let report = &reports[0];
            assert_eq!(report.kind, IoErrorKind::Read);
            assert_eq!(report.object, file.url);
            assert!(report.message.contains("changed"), "{kind:?}: {report:?}");
            assert!(
                !object.is_cached(40),
                "{kind:?}: page 40 must not be cached"
            );
        }
    });
}

#[test]
fn a_trace_recorded_on_a_remote_object_replays_on_it_and_not_on_a_new_version() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "traced", 256 * PAGE, 19);
            let recorder = pager(Delivery::Signal);
            let opts = MapOptions::new().record_trace();
            let map = recorder
                .map_trusted(open(kind, &file.url).unwrap(), opts)
                .unwrap();
            for p in [200, 3, 100, 4] {
                assert_eq!(touch(&map, p), file.data[p * PAGE]);
            }
            let trace = map.trace().unwrap();
            drop(map);
            assert_eq!(trace.runs(), &[200..201, 3..4, 100..101, 4..5]);
            // Every server gives an ETag (versitygw the one `put` gave the
            // file, as an upload would; GCS a generation too: pinned, not
            // sent).
            let version = trace.object_version().unwrap();
            let want: &[&str] = match kind {
                Kind::Http | Kind::Azure | Kind::S3 => &["etag"],
                Kind::Gcs => &["etag", "version id"],
            };
            for want in want {
                assert!(version.contains(want), "{kind:?}: {version}");
            }
            // The same version: replayed, every page read before it is
            // touched.
            let cold = pager(Delivery::Signal);
            let opts = MapOptions::new()
                .readahead(faultmap::ReadaheadMode::Off)
                .replay_trace(trace.clone());
            let map = cold
                .map_trusted(open(kind, &file.url).unwrap(), opts)
                .unwrap();
            let pages = [200, 3, 100, 4];
            let cached = || pages.iter().all(|&p| map.object().is_cached(p as u64));
            wait_until(Duration::from_secs(20), cached);
            assert!(cached(), "{kind:?}: {:?}", map.replay_progress());
            for p in pages {
                assert_eq!(touch(&map, p), file.data[p * PAGE]);
            }
            assert_eq!(map.stats().pgmajfault, 0, "{kind:?}");
            drop(map);
            // A new version (its ETag moves with the mtime): refused.
            std::thread::sleep(Duration::from_millis(1100));
            file.rewrite(&pattern(256 * PAGE, 20));
            let e = cold
                .map_trusted(
                    open(kind, &file.url).unwrap(),
                    MapOptions::new().replay_trace(trace),
                )
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    faultmap::MapError::Trace(faultmap::TraceError::Mismatch { .. })
                ),
                "{kind:?}: {e}"
            );
            assert!(e.to_string().contains(&file.url), "{kind:?}: {e}");
        }
    });
}

// ---------------------------------------------------------------------------
// Errors during reads, through the fault-injecting proxy.
// ---------------------------------------------------------------------------

/// Small requests, so that one object takes many.
fn small_requests() -> RemoteTuning {
    RemoteTuning {
        request_bytes: 64 << 10,
        readahead_bytes: 256 << 10,
        ..RemoteTuning::default()
    }
}

#[test]
fn transient_failures_are_retried_and_the_bytes_are_right() {
    watchdog(WATCHDOG, || {
        let faults = [
            Fault::Status(ErrorStatus::SlowDown),
            Fault::Status(ErrorStatus::InternalError),
            Fault::Reset,
            Fault::ResetMidBody,
            Fault::CutBody,
        ];
        for kind in KINDS {
            let file = put(kind, "transient", 2 * (1 << 20) + 999, 20);
            for fault in faults {
                let proxy = Proxy::start(upstream(kind)).unwrap();
                let store = open_via(kind, &proxy, &file, small_requests());
                let pager = Pager::new(Config::default().io_retries(3)).unwrap();
                let object = pager.open(store).unwrap();
                let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
                // One injected failure, after the open.
                proxy.faults().inject(fault, 1);
                let what = format!("{kind:?} {fault:?}");
                assert_bytes(&map, &file.data, &what);
                drop(map);
                drop(pager);
                let (s, p) = (object.stats(), proxy.stats());
                assert_eq!(
                    proxy.faults().pending(),
                    0,
                    "{what}: the fault was not taken: {p:?}"
                );
                assert!(
                    object.io_errors().is_empty(),
                    "{what}: {:?}",
                    object.io_errors()
                );
                assert_eq!(s.io_errors, 0, "{what}: {s:?}");
                if matches!(fault, Fault::Status(_)) {
                    assert!(s.io_retries >= 1, "{what}: no retry counted: {s:?} {p:?}");
                }
            }
        }
    });
}

#[test]
fn persistent_failures_fail_the_pages_with_a_report_naming_the_url() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "persistent", 64 * PAGE, 21);
            for fault in [Fault::Status(ErrorStatus::InternalError), Fault::CutBody] {
                let proxy = Proxy::start(upstream(kind)).unwrap();
                let store = open_via(kind, &proxy, &file, small_requests());
                let pager = Pager::new(Config::default().io_retries(1)).unwrap();
                let object = pager.open(store).unwrap();
                let map = pager
                    .map_trusted(&object, MapOptions::new().fault_around_order(0))
                    .unwrap();
                map.advise(Advice::Random, 0..map.len()).unwrap();
                proxy.faults().inject(fault, 1000);
                let r = page_range(&map, 10);
                map.advise(Advice::WillNeed, r).unwrap();
                let what = format!("{kind:?} {fault:?}");
                assert!(
                    wait_until(Duration::from_secs(20), || !object.io_errors().is_empty()),
                    "{what}: no report"
                );
                let report = object.io_errors()[0].clone();
                assert_eq!(report.object, object.name(), "{what}");
                assert!(
                    report.object.ends_with(&file.url[file.url.len() - 10..]),
                    "{what}"
                );
                assert_eq!(report.kind, IoErrorKind::Read, "{what}");
                assert!(!object.is_cached(10), "{what}: a failed page is cached");
                // The server recovers: the page reads right.
                proxy.faults().clear();
                let r = page_range(&map, 10);
                assert_bytes(&map[r.clone()], &file.data[r], &what);
            }
        }
    });
}

#[test]
fn a_failed_remote_page_is_sigbus_at_the_access() {
    const NAME: &str = "a_failed_remote_page_is_sigbus_at_the_access";
    if is_child(NAME) {
        let file = put(Kind::Http, "sigbus", 16 * PAGE, 22);
        let proxy = Proxy::start(upstream(Kind::Http)).unwrap();
        let store = open_via(Kind::Http, &proxy, &file, small_requests());
        let pager = Pager::new(Config::default().io_retries(1)).unwrap();
        let map = pager
            .map_trusted(store, MapOptions::new().fault_around_order(0))
            .unwrap();
        map.advise(Advice::Random, 0..map.len()).unwrap();
        assert_eq!(touch(&map, 0), file.data[0]);
        proxy
            .faults()
            .inject(Fault::Status(ErrorStatus::SlowDown), 1000);
        println!("{BEFORE}");
        let v = touch(&map, 9);
        println!("CHILD: the page read as {v:#04x}: no SIGBUS");
        return;
    }
    watchdog(WATCHDOG, || {
        let end = run_child(NAME, Duration::from_secs(30));
        // The child died by the signal, before its file's Drop: remove it.
        for entry in std::fs::read_dir(servers().http_root).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("sigbus-") && name.ends_with("-22") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let what = format!("{:?}\n{}\n{}", end.status, end.stdout, end.stderr);
        assert!(end.stdout.contains(BEFORE), "{what}");
        assert_eq!(end.signal(), Some(SIGBUS), "{what}");
    });
}

const BEFORE: &str = "CHILD: touching the failing page";

#[test]
fn a_server_that_stops_answering_times_out_and_the_pager_still_drops() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "silent", 64 * PAGE, 23);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            let store = open_via(kind, &proxy, &file, small_requests());
            let pager =
                Pager::new(Config::default().io_timeout(Duration::from_millis(300))).unwrap();
            let object = pager.open(store).unwrap();
            let map = pager
                .map_trusted(&object, MapOptions::new().fault_around_order(0))
                .unwrap();
            map.advise(Advice::Random, 0..map.len()).unwrap();
            // The server stops answering.
            proxy.faults().set_latency(Duration::from_secs(3600));
            map.advise(Advice::WillNeed, page_range(&map, 20)).unwrap();
            assert!(
                wait_until(Duration::from_secs(20), || pager.stats().io_timeouts >= 1),
                "{kind:?}: no timeout: {:?}",
                pager.stats()
            );
            let reports = pager.io_errors();
            let report = reports
                .iter()
                .find(|r| r.kind == IoErrorKind::Timeout)
                .unwrap_or_else(|| panic!("{kind:?}: no timeout report: {reports:?}"));
            assert_eq!(report.object, object.name());
            // Dropping everything returns although a request hangs.
            drop(map);
            drop(object);
            drop(pager);
            drop(proxy);
        }
    });
}

#[test]
fn a_server_that_ignores_ranges_is_refused_at_open() {
    let s = servers();
    let dir = s.http_root.join("noranges");
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("whole-{}", std::process::id());
    std::fs::write(dir.join(&name), pattern(10_000, 24)).unwrap();
    let url = format!("{}/noranges/{name}", s.http_url);
    let e = HttpStore::open(&url).unwrap_err();
    let _ = std::fs::remove_file(dir.join(&name));
    assert_eq!(remote_kind(&e), RemoteErrorKind::RangesNotSupported, "{e}");
    assert!(e.to_string().contains(&url), "{e}");
}

#[test]
fn a_remote_scan_stays_within_the_memory_budget() {
    const BUDGET: u64 = 8 << 20;
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "budget", 40 << 20, 25);
            let pager = Pager::new(Config::default().memory_budget(BUDGET)).unwrap();
            let map = pager
                .map_trusted(open(kind, &file.url).unwrap(), MapOptions::new())
                .unwrap();
            for chunk in (0..file.data.len()).step_by(1 << 20) {
                let end = (chunk + (1 << 20)).min(file.data.len());
                assert_bytes(&map[chunk..end], &file.data[chunk..end], "scan");
            }
            let mem = pager.memory();
            // As in the budget tests: the pages faults wait for while the
            // evictor catches up may pass it, one per fault in flight.
            assert!(mem.peak <= BUDGET + 8 * PAGE as u64, "{kind:?}: {mem:?}");
            assert!(pager.stats().evicted > 0, "{kind:?}: {:?}", pager.stats());
        }
    });
}

#[test]
fn a_random_miss_reads_the_small_read_around_window_and_a_stream_ramps_up() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "around", 12 << 20, 27);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            // The defaults: 64 MiB windows (here, the whole object), 1 MiB
            // read around a random miss.
            let store = open_via(kind, &proxy, &file, RemoteTuning::default());
            let pager = Pager::new(Config::default()).unwrap();
            let object = pager.open(store).unwrap();
            let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
            let before = proxy.stats();
            // A first touch in the middle: not sequential, read around.
            let at = 6 << 20;
            assert_eq!(map[at], file.data[at], "{kind:?}");
            let around = proxy.stats().since(&before);
            assert_eq!(around.range_bytes, 1 << 20, "{kind:?}: {around:?}");
            assert!(object.is_cached((at / PAGE) as u64));
            assert!(!object.is_cached(((at + (1 << 20)) / PAGE) as u64));
            // Reading on from there is a stream: the rest of the object
            // comes in growing windows, in far fewer requests than 1 MiB
            // read-arounds would take.
            let before = proxy.stats();
            assert_eq!(&map[at..], &file.data[at..], "{kind:?}");
            let stream = proxy.stats().since(&before);
            assert!(stream.requests < 6, "{kind:?}: {stream:?}");
        }
    });
}

/// Batched prefetch through a link with a 20 ms first-byte latency: the
/// store measures it (the open's probe is the first sample), so rows a
/// few pages apart are read as one request, holes and all, and the rows
/// then read without another request.
#[test]
fn a_batch_of_close_rows_is_one_request_over_a_slow_link() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "rows", 4 << 20, 31);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            proxy.faults().set_latency(Duration::from_millis(20));
            let store = open_via(kind, &proxy, &file, RemoteTuning::default());
            let link = store.link().expect("a remote store measures its link");
            assert!(
                link.latency >= Duration::from_millis(20),
                "{kind:?}: {link:?}"
            );
            let pager = Pager::new(Config::default()).unwrap();
            let object = pager.open(store).unwrap();
            let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
            // 16 rows of 100 bytes, 8 pages apart: holes of 7 pages, under
            // the limit (20 ms at the default 100 MB/s over 32 in flight:
            // 15 pages).
            let rows: Vec<std::ops::Range<u64>> = (0..16u64)
                .map(|i| {
                    let at = (100 + i * 8) * PAGE as u64 + 7;
                    at..at + 100
                })
                .collect();
            let before = proxy.stats();
            let got = map.prefetch_ranges(&rows).unwrap();
            map.wait_ranges(&rows).unwrap();
            assert!(got.hole_pages >= 7, "{kind:?}: {got:?}");
            assert_eq!(got.requests, 1, "{kind:?}: {got:?}");
            for r in &rows {
                let (a, b) = (r.start as usize, r.end as usize);
                assert_eq!(&map[a..b], &file.data[a..b], "{kind:?}: {r:?}");
            }
            let d = proxy.stats().since(&before);
            assert_eq!(d.requests, 1, "{kind:?}: {d:?}");
            assert_eq!(d.range_bytes, (15 * 8 + 1) * PAGE as u64, "{kind:?}: {d:?}");
        }
    });
}

#[test]
fn prefetch_reads_ahead_in_large_requests_and_the_access_then_needs_none() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "prefetch", 6 * (1 << 20) + 5, 26);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            let tuning = RemoteTuning {
                request_bytes: 1 << 20,
                ..RemoteTuning::default()
            };
            let store = open_via(kind, &proxy, &file, tuning);
            let pager = Pager::new(Config::default()).unwrap();
            let object = pager.open(store).unwrap();
            let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
            let before = proxy.stats();
            map.prefetch(0..map.len()).unwrap();
            let pages = map.len().div_ceil(PAGE) as u64;
            assert!(
                wait_until(Duration::from_secs(20), || (0..pages)
                    .all(|p| object.is_cached(p))),
                "{kind:?}: the prefetch did not complete"
            );
            let fetched = proxy.stats().since(&before);
            // Seven requests of at most 1 MiB, never one per page.
            assert!(fetched.requests <= 8, "{kind:?}: {fetched:?}");
            let after = proxy.stats();
            assert_bytes(&map, &file.data, &format!("{kind:?}"));
            assert_eq!(
                proxy.stats().since(&after).requests,
                0,
                "{kind:?}: the access read again"
            );
            assert!(map.prefetch(0..map.len() + 1).is_err());
        }
    });
}

/// A prefetch of a whole object through a slow link (20 ms first-byte
/// latency, 16 MiB/s shared), and the mapping and object dropped a few
/// requests in: the reads still queued are never sent, and those in
/// flight are not kept when they answer, so every page not cached at the
/// close is counted cancelled, the cache empties, and the pager's depth
/// serves another object's prefetch.
#[test]
fn closing_an_object_cancels_its_prefetch() {
    const REQUEST: usize = 256 << 10;
    const LEN: usize = 64 << 20; // 256 requests
    const PAGES: u64 = (LEN / PAGE) as u64;
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "cancelled", LEN, 28);
            let other = put(kind, "afterwards", 4 * REQUEST + 5, 29);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            proxy.faults().set_latency(Duration::from_millis(20));
            proxy
                .faults()
                .set_bandwidth(std::num::NonZeroU64::new(16 << 20));
            let tuning = RemoteTuning {
                request_bytes: REQUEST as u64,
                ..RemoteTuning::default()
            };
            let config = Config::default();
            let bound = (config.io_depth + config.io_threads) as u64;
            let pager = Pager::new(config).unwrap();
            let object = pager
                .open(open_via(kind, &proxy, &file, tuning.clone()))
                .unwrap();
            let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
            map.prefetch(0..map.len()).unwrap();
            // Many reads at the server when it closes, so that their
            // answers (not kept) weigh in the count below.
            assert!(
                wait_until(Duration::from_secs(20), || proxy.stats().requests >= 16),
                "{kind:?}: the prefetch did not start: {:?}",
                proxy.stats()
            );
            // Reads answer every 16 ms or so (32 in flight share the
            // link): what is cached now is what was read before the close,
            // give or take a few answers.
            let cached_pages = (0..PAGES).filter(|&p| object.is_cached(p)).count() as u64;
            drop(map);
            drop(object);
            let at_close = proxy.stats().requests;
            assert!(
                at_close < (LEN / REQUEST) as u64,
                "{kind:?}: all sent before the close"
            );
            assert!(
                wait_until(Duration::from_secs(20), || pager.memory().cached == 0),
                "{kind:?}: the cache still holds {:?}",
                pager.memory()
            );
            // The cache emptied, so every read of the object ended (a read
            // holds its pages' charge, and the object, until it ends): at
            // most what was in flight at the close reached the server
            // after it (`io_depth` reads its client had sent or was
            // sending) or was being started then (one a thread, past its
            // last look at the flag), never the rest of the 256.
            let after = proxy.stats().requests - at_close;
            eprintln!(
                "{kind:?}: {at_close} requests before the close, {after} after (of {}); \
                 {cached_pages} pages cached at the close, io_cancelled {} of {PAGES} pages",
                LEN / REQUEST,
                pager.stats().io_cancelled,
            );
            assert!(
                after <= bound,
                "{kind:?}: {after} requests after the close (bound {bound}), of {}",
                LEN / REQUEST
            );
            // Every page is accounted for: cached before the close (give
            // or take the few answers between the count and the close), or
            // cancelled (never asked for, or not kept when it came).
            assert!(
                wait_until(Duration::from_secs(20), || {
                    pager.stats().io_cancelled + cached_pages + 4 * (REQUEST / PAGE) as u64 >= PAGES
                }),
                "{kind:?}: {cached_pages} pages cached at the close, {:?}",
                pager.stats()
            );
            // Another object on the same pager: its prefetch (reads ahead,
            // which wait for depth slots) ends, and it reads right.
            let object = pager.open(open_via(kind, &proxy, &other, tuning)).unwrap();
            let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
            map.prefetch(0..map.len()).unwrap();
            let other_pages = other.data.len().div_ceil(PAGE) as u64;
            assert!(
                wait_until(Duration::from_secs(20), || (0..other_pages)
                    .all(|p| object.is_cached(p))),
                "{kind:?}: the next object's prefetch did not end: {:?}",
                pager.stats()
            );
            assert_bytes(&map, &other.data, &format!("{kind:?}: the next object"));
            drop((map, object));
        }
    });
}

#[test]
fn a_prefetch_larger_than_the_budget_stays_within_it() {
    const BUDGET: u64 = 4 << 20;
    watchdog(WATCHDOG, || {
        let file = put(Kind::Http, "prefetch-budget", 24 << 20, 27);
        let pager = Pager::new(Config::default().memory_budget(BUDGET)).unwrap();
        let object = pager.open(open(Kind::Http, &file.url).unwrap()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        map.prefetch(0..map.len()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            pager.memory().peak <= BUDGET + 8 * PAGE as u64,
            "{:?}",
            pager.memory()
        );
        // What was left out reads right on access.
        assert_bytes(&map, &file.data, "after a prefetch over the budget");
        assert!(
            pager.memory().peak <= BUDGET + 8 * PAGE as u64,
            "{:?}",
            pager.memory()
        );
    });
}

/// The disk cache on every store: a second run, in another pager, reads
/// the object from the disk and sends the server its `HEAD` alone (the
/// open's range probe is left out when the cache holds the version); no
/// object bytes cross the network.
#[test]
fn a_second_run_reads_the_disk_cache_and_sends_headers_only() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let len = (3 << 20) + 77;
            let file = put(kind, "disk-cache", len, 41);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let config = faultmap::DiskCacheConfig::new(dir.path().join("cache"));
            let tuning = RemoteTuning {
                disk_cache: Some(config.clone()),
                ..RemoteTuning::default()
            };
            let run = || {
                let store = open_via(kind, &proxy, &file, tuning.clone());
                let cache = faultmap::DiskCache::open(&config).unwrap();
                let cached = faultmap::CachedStore::new(store, cache, Duration::from_secs(30))
                    .unwrap()
                    .ok()
                    .unwrap_or_else(|| panic!("{kind:?}: a pinned object is cached"));
                let cached = Arc::new(cached);
                let pager = Pager::new(Config::default()).unwrap();
                let map = pager
                    .map_trusted(cached.clone(), MapOptions::new())
                    .unwrap();
                assert_bytes(&map, &file.data, &format!("{kind:?}"));
                drop(map);
                drop(pager);
                cached.wait_written(Duration::from_secs(60));
                cached.stats()
            };
            let before = proxy.stats();
            let first = run();
            let between = proxy.stats();
            let second = run();
            let (d1, d2) = (between.since(&before), proxy.stats().since(&between));
            assert_eq!(first.network_bytes, len as u64, "{kind:?}: {first:?}");
            assert!(d1.body_bytes >= len as u64, "{kind:?}: {d1:?}");
            assert_eq!(
                (second.network_bytes, second.disk_bytes),
                (0, len as u64),
                "{kind:?}: {second:?}"
            );
            assert_eq!(d2.body_bytes, 0, "{kind:?}: no object bytes: {d2:?}");
            assert_eq!(d2.ranged_requests, 0, "{kind:?}: {d2:?}");
        }
    });
}

/// An object whose only version is its Last-Modified (versitygw's
/// answer for a file written into its folder, without the ETag an upload
/// gets) is read, not kept on disk: a rewrite within its second would be
/// unseen across runs.
#[test]
fn an_object_pinned_by_its_last_modified_alone_is_not_disk_cached() {
    watchdog(WATCHDOG, || {
        let s = servers();
        let name = format!("disk-lm-{}", std::process::id());
        let path = s.s3_root.join(&name);
        let data = pattern(100_000, 44);
        std::fs::write(&path, &data).unwrap();
        let url = object_url(Kind::S3, &name);
        let dir = tempfile::tempdir().unwrap();
        let tuning = RemoteTuning {
            disk_cache: Some(faultmap::DiskCacheConfig::new(dir.path().join("cache"))),
            ..RemoteTuning::default()
        };
        let store = faultmap::open_url_with(&url, &tuning).unwrap();
        assert!(store.version().unwrap().contains("last-modified"));
        assert!(store.disk_cache_stats().is_none(), "read, not cached");
        let mut buf = vec![0u8; data.len()];
        store.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, data);
        let _ = std::fs::remove_file(&path);
    });
}

/// `open_url_with` puts the tuning's disk cache in front of a remote
/// object, never of a local file, and refuses a directory others may
/// write to, naming it.
#[test]
fn open_url_with_reads_remote_objects_through_the_disk_cache() {
    watchdog(WATCHDOG, || {
        let file = put(Kind::Http, "disk-url", 100_000, 43);
        let dir = tempfile::tempdir().unwrap();
        let cache_dir = dir.path().join("cache");
        let tuning = RemoteTuning {
            disk_cache: Some(faultmap::DiskCacheConfig::new(&cache_dir)),
            ..RemoteTuning::default()
        };
        let store = faultmap::open_url_with(&file.url, &tuning).unwrap();
        let mut buf = vec![0u8; 100_000];
        store.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, file.data);
        let stats = store.disk_cache_stats().expect("through the disk cache");
        assert_eq!(stats.network_bytes, 100_000);
        let again = faultmap::open_url_with(&file.url, &tuning).unwrap();
        again.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, file.data);
        assert_eq!(again.disk_cache_stats().unwrap().disk_bytes, 100_000);

        let local = TestFile::new(5000, 1);
        let plain = faultmap::open_url_with(local.path.to_str().unwrap(), &tuning).unwrap();
        assert!(
            plain.disk_cache_stats().is_none(),
            "a local file is not cached"
        );

        use std::os::unix::fs::PermissionsExt;
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let tuning = RemoteTuning {
            disk_cache: Some(faultmap::DiskCacheConfig::new(&open)),
            ..RemoteTuning::default()
        };
        let e = faultmap::open_url_with(&file.url, &tuning)
            .err()
            .expect("refused");
        assert!(matches!(e, faultmap::StoreError::DiskCache(_)), "{e}");
        let text = e.to_string();
        assert!(text.contains(&open.display().to_string()), "{text}");
        assert!(text.contains("others may write"), "{text}");
    });
}
