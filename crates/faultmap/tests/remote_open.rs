#![cfg(not(loom))]
//! Opening remote objects, against real servers (nginx, versitygw, the GCS
//! stub and Azurite, started by `scripts/remote-servers up`) behind the
//! fault-injecting proxy of `faultmap-proxy`, which here plays the servers
//! a review found faultmap mishandling: one that sends no validators, one
//! that never answers, and one whose log shows each request's path
//! exactly as it arrived.

mod common;
use common::MapTrusted;

use std::time::Duration;

use common::remote::*;
use common::*;
use faultmap::{
    open_url, open_url_with, Config, HttpStore, IoErrorKind, MapOptions, Pager, RemoteErrorKind,
    RemoteTuning, Store,
};
use faultmap_proxy::{ErrorStatus, Fault, Proxy};

/// The error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

// ---------------------------------------------------------------------------
// An object without validators.
// ---------------------------------------------------------------------------

#[test]
fn an_object_without_validators_is_refused_at_open_unless_allowed() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "novalidators", 8 * PAGE + 17, 41);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            proxy.faults().set_drop_validators(true);
            if matches!(kind, Kind::Gcs | Kind::Azure) {
                refused_by_the_client(kind, &proxy, &file);
                continue;
            }
            let e = try_open_via(kind, &proxy, &file, RemoteTuning::default())
                .err()
                .expect("the open fails");
            assert_eq!(
                remote_kind(&e),
                RemoteErrorKind::NoValidator,
                "{kind:?}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains(&file.name),
                "{kind:?}: the URL is named: {text}"
            );
            assert!(
                text.contains("allow"),
                "{kind:?}: the way out is named: {text}"
            );

            // Allowed explicitly, it opens unpinned and reads right.
            let tuning = RemoteTuning {
                allow_unpinned: true,
                ..RemoteTuning::default()
            };
            let store = try_open_via(kind, &proxy, &file, tuning).unwrap();
            let mut got = vec![0u8; file.data.len()];
            store.read_at(0, &mut got).unwrap();
            assert!(got == file.data, "{kind:?}: the bytes differ");
        }
    });
}

/// GCS and Azure always send an ETag and a Last-Modified, and their
/// client requires both in every answer: one without them is the
/// client's error, so such an object is refused at open even when
/// unpinned objects are allowed, and never read unpinned.
fn refused_by_the_client(kind: Kind, proxy: &Proxy, file: &RemoteFile) {
    for allow_unpinned in [false, true] {
        let tuning = RemoteTuning {
            allow_unpinned,
            ..RemoteTuning::default()
        };
        let e = try_open_via(kind, proxy, file, tuning)
            .err()
            .expect("the open fails");
        let text = chain(&e);
        assert!(
            text.contains(&file.name),
            "{kind:?}: the URL is named: {text}"
        );
        assert!(
            text.contains("Header missing"),
            "{kind:?}: the missing header is named: {text}"
        );
    }
}

/// Pinned by an ETag alone (the server sends no `Last-Modified`, so the
/// client's pin has the epoch there), the object changes and its answers
/// lose the ETag: both timestamps are the epoch, which must not count as
/// a match. (nginx sends an ETag; versitygw sends none for files put in
/// its folder, so it is the Last-Modified-only case there. The GCS stub
/// and Azurite honour `If-Match`: they refuse the read of the new version
/// with 412 before an answer without validators is seen, which their
/// client would refuse anyway: see `refused_by_the_client`.)
#[test]
fn a_pinned_object_whose_answers_lose_their_validators_counts_as_changed() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "losesvalidators", 64 * PAGE, 42);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            if kind == Kind::Http {
                proxy.faults().set_drop_last_modified(true);
            }
            let store = try_open_via(kind, &proxy, &file, RemoteTuning::default()).unwrap();
            let pager = Pager::new(Config::default()).unwrap();
            let object = pager.open(store).unwrap();
            let map = pager
                .map_trusted(&object, MapOptions::new().fault_around_order(0))
                .unwrap();
            map.advise(faultmap::Advice::Random, 0..map.len()).unwrap();
            assert_eq!(touch(&map, 0), file.data[0]);
            // Another version of the same length, served without validators.
            file.rewrite(&pattern(64 * PAGE, 43));
            proxy.faults().set_drop_validators(true);
            map.advise(faultmap::Advice::WillNeed, page_range(&map, 40))
                .unwrap();
            assert!(
                wait_until(Duration::from_secs(20), || !object.io_errors().is_empty()),
                "{kind:?}: no error for a read of the object without its validators"
            );
            let report = &object.io_errors()[0];
            assert_eq!(report.kind, IoErrorKind::Read);
            assert!(report.message.contains("changed"), "{kind:?}: {report:?}");
            assert!(
                !object.is_cached(40),
                "{kind:?}: page 40 must not be cached"
            );
        }
    });
}

/// The GCS store pins an object's generation but does not send it: a GET
/// of a generation that is no longer live answers 404 in a bucket without
/// versioning (GCS's default; the stub does the same), so a change would
/// read as a missing object (see the `gcs` module). Its GETs are
/// conditional on the ETag alone, which the stub, as GCS, checks (412 on
/// a change: `a_changed_object_fails_its_unread_pages_never_mixing_versions`
/// in `remote.rs`).
#[test]
fn gcs_reads_pin_the_generation_without_sending_it() {
    watchdog(WATCHDOG, || {
        let file = put(Kind::Gcs, "pinned", 3 * PAGE, 49);
        let proxy = Proxy::start(upstream(Kind::Gcs)).unwrap();
        let store = try_open_via(Kind::Gcs, &proxy, &file, RemoteTuning::default()).unwrap();
        let version = store.version().unwrap();
        assert!(
            version.contains("etag") && version.contains("version id"),
            "{version}"
        );
        let mut got = vec![0u8; file.data.len()];
        store.read_at(0, &mut got).unwrap();
        assert!(got == file.data, "the bytes differ");
        let requests = proxy.faults().requests();
        assert!(
            requests.iter().filter(|r| r.starts_with("GET ")).count() >= 2,
            "the probe at open and the read: {requests:?}"
        );
        assert!(
            !requests.iter().any(|r| r.contains("generation=")),
            "{requests:?}"
        );
    });
}

// ---------------------------------------------------------------------------
// Escapes in the URL.
// ---------------------------------------------------------------------------

#[test]
fn an_http_url_is_requested_with_its_escapes_kept() {
    watchdog(WATCHDOG, || {
        // nginx decodes `%2F` itself, so the file is at `dir/b`: both the
        // right request and the wrong one would find it. The proxy's log
        // tells them apart.
        let file = put(Kind::Http, "escaped/b.bin", 3 * PAGE, 44);
        let (dir, leaf) = file.name.split_once('/').unwrap();
        let proxy = Proxy::start(upstream(Kind::Http)).unwrap();
        for (written, sent) in [
            (format!("{dir}%2F{leaf}"), format!("/{dir}%2F{leaf}")),
            (format!("{dir}%2f{leaf}"), format!("/{dir}%2f{leaf}")),
            (format!("{dir}/{leaf}"), format!("/{dir}/{leaf}")),
        ] {
            let url = format!("{}/{written}", proxy.url());
            let store = HttpStore::open(&url).unwrap();
            let mut got = vec![0u8; file.data.len()];
            store.read_at(0, &mut got).unwrap();
            assert!(got == file.data, "{url}: the bytes differ");
            let requests = proxy.faults().requests();
            let paths: Vec<&str> = requests
                .iter()
                .filter_map(|r| r.split_once(' ').map(|(_, path)| path))
                .collect();
            assert!(
                !paths.is_empty() && paths.iter().all(|p| *p == sent),
                "{url}: every request must go to {sent}: {requests:?}"
            );
            // The next URL's requests alone.
            drop(store);
            proxy.faults().clear_requests();
        }
    });
}

#[test]
fn an_escaped_slash_in_an_object_key_is_refused_before_any_request() {
    for kind in OBJECT_STORES {
        let proxy = Proxy::start(upstream(kind)).unwrap();
        for name in ["a%2Fb.bin", "dir/a%2fb.bin"] {
            let url = object_url(kind, name);
            let e = try_open_at(kind, &proxy.url(), &url, RemoteTuning::default())
                .err()
                .expect("refused");
            assert!(
                matches!(remote_kind(&e), RemoteErrorKind::BadUrl(why) if why.contains("%2F")),
                "{url}: {e}"
            );
            assert!(e.to_string().contains(&url), "{e}");
            assert!(matches!(
                remote_kind(&open_url(&url).err().expect("refused")),
                RemoteErrorKind::BadUrl(_)
            ));
        }
        let requests = proxy.faults().requests();
        assert_eq!(proxy.stats().requests, 0, "{kind:?}: {requests:?}");
    }
}

// ---------------------------------------------------------------------------
// One deadline for the whole open.
// ---------------------------------------------------------------------------

#[test]
fn a_server_that_never_answers_fails_the_open_once_at_its_deadline() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "neveranswers", PAGE, 45);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            proxy.faults().set_latency(Duration::from_secs(3600));
            let tuning = RemoteTuning {
                open_timeout: Duration::from_millis(400),
                open_retries: 5,
                ..RemoteTuning::default()
            };
            let e = try_open_via(kind, &proxy, &file, tuning)
                .err()
                .expect("the open fails");
            assert_eq!(remote_kind(&e), RemoteErrorKind::Timeout, "{kind:?}: {e}");
            let text = chain(&e);
            assert!(text.contains("open deadline of 400ms"), "{kind:?}: {text}");
            // A timeout at open is not tried again: at most one request
            // reached the server (none if the deadline ran out while the
            // connection was being made).
            assert!(
                proxy.stats().requests <= 1,
                "{kind:?}: {:?}",
                proxy.faults().requests()
            );
        }
    });
}

#[test]
fn a_pagers_io_timeout_bounds_the_open_through_open_url_with() {
    watchdog(WATCHDOG, || {
        let file = put(Kind::Http, "iotimeout", PAGE, 46);
        let proxy = Proxy::start(upstream(Kind::Http)).unwrap();
        proxy.faults().set_latency(Duration::from_secs(3600));
        let config = Config::default().io_timeout(Duration::from_millis(300));
        let url = format!("{}/{}", proxy.url(), file.name);
        let e = open_url_with(&url, &RemoteTuning::for_config(&config))
            .err()
            .expect("a silent server fails the open");
        assert_eq!(remote_kind(&e), RemoteErrorKind::Timeout, "{e}");
        assert!(
            chain(&e).contains("open deadline of 300ms"),
            "{}",
            chain(&e)
        );
    });
}

#[test]
fn a_transient_failure_at_open_is_tried_again_within_the_deadline() {
    watchdog(WATCHDOG, || {
        for kind in KINDS {
            let file = put(kind, "transientopen", 2 * PAGE, 47);
            let proxy = Proxy::start(upstream(kind)).unwrap();
            proxy
                .faults()
                .inject(Fault::Status(ErrorStatus::SlowDown), 2);
            let store = try_open_via(kind, &proxy, &file, RemoteTuning::default()).unwrap();
            let mut got = vec![0u8; file.data.len()];
            store.read_at(0, &mut got).unwrap();
            assert!(got == file.data, "{kind:?}: the bytes differ");

            // With no retries at open, the same failure fails it.
            proxy
                .faults()
                .inject(Fault::Status(ErrorStatus::SlowDown), 1);
            let tuning = RemoteTuning {
                open_retries: 0,
                ..RemoteTuning::default()
            };
            let e = try_open_via(kind, &proxy, &file, tuning)
                .err()
                .expect("the open fails");
            assert_eq!(remote_kind(&e), RemoteErrorKind::Throttled, "{kind:?}: {e}");
        }
    });
}

#[test]
fn a_timeout_too_long_to_compute_is_refused_or_no_deadline_never_a_panic() {
    watchdog(WATCHDOG, || {
        // Through a pager's settings: refused by the configuration.
        let config = Config::default().io_timeout(Duration::MAX);
        assert!(config.validate().is_err());
        assert!(Pager::new(config).is_err());
        // A tuning made by hand: no deadline to compute, and the open works.
        let file = put(Kind::Http, "longtimeout", PAGE, 48);
        let proxy = Proxy::start(upstream(Kind::Http)).unwrap();
        let tuning = RemoteTuning {
            open_timeout: Duration::MAX,
            ..RemoteTuning::default()
        };
        let store = try_open_via(Kind::Http, &proxy, &file, tuning).unwrap();
        assert_eq!(store.len(), PAGE as u64);
    });
}
