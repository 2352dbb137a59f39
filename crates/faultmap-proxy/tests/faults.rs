//! Each fault of the proxy, against an in-process upstream.

mod common;

use std::io;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{pattern, Client, Upstream};
use faultmap_proxy::{ErrorStatus, Fault, Proxy};

const OBJECT_LEN: usize = 256 * 1024;

fn setup() -> (Upstream, Proxy) {
    let upstream = Upstream::start(pattern(OBJECT_LEN));
    let proxy = Proxy::start(upstream.addr).expect("start the proxy");
    (upstream, proxy)
}

#[test]
fn passes_bodies_and_ranges_through_on_one_connection() {
    let (upstream, proxy) = setup();
    let object = pattern(OBJECT_LEN);
    let mut client = Client::connect(proxy.addr()).unwrap();

    let whole = client.get("/bucket/object", &[]).unwrap();
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body, object);

    for (first, last) in [(0, 9), (4096, 8191), (OBJECT_LEN - 100, OBJECT_LEN - 1)] {
        let range = format!("bytes={first}-{last}");
        let reply = client.get("/bucket/object", &[("Range", &range)]).unwrap();
        assert_eq!(reply.status, 206);
        assert_eq!(reply.body, object[first..=last]);
        let content_range = format!("bytes {first}-{last}/{OBJECT_LEN}");
        assert_eq!(reply.header("content-range"), Some(content_range.as_str()));
    }
    // Four requests on one client connection. (The upstream side is pooled,
    // but when a connection goes back to the pool is hyper's timing.)
    assert_eq!(upstream.seen().len(), 4);
    assert!(proxy.url().starts_with("http://127.0.0.1:"));
}

#[test]
fn head_answers_have_no_body() {
    let (_upstream, proxy) = setup();
    let mut client = Client::connect(proxy.addr()).unwrap();
    let head = client.request("HEAD", "/object", &[], &[]).unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(OBJECT_LEN));
    // A body after the HEAD answer would be read as the next status line.
    let next = client.get("/object", &[("Range", "bytes=0-3")]).unwrap();
    assert_eq!(next.status, 206);
    assert_eq!(next.body, pattern(OBJECT_LEN)[..4]);
}

#[test]
fn methods_headers_and_bodies_pass_through_unchanged() {
    let (upstream, proxy) = setup();
    let mut client = Client::connect(proxy.addr()).unwrap();
    let signed = [
        ("Host", "example-bucket.test:9000"),
        ("Authorization", "AWS4-HMAC-SHA256 Credential=K/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"),
        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ("x-amz-date", "20260101T000000Z"),
        ("If-Match", "\"test\""),
    ];
    let put = client
        .request(
            "PUT",
            "/bucket/key%20one?partNumber=1&x=%2F",
            &signed,
            b"new object",
        )
        .unwrap();
    assert_eq!(put.status, 200);
    let seen = upstream.seen();
    let put = seen.last().unwrap();
    assert_eq!(put.method, "PUT");
    assert_eq!(put.target, "/bucket/key%20one?partNumber=1&x=%2F");
    assert_eq!(put.body, b"new object");
    for (name, value) in signed {
        assert_eq!(put.header(name), Some(value), "header {name}");
    }
    let get = client.get("/bucket/key", &[]).unwrap();
    assert_eq!(get.body, b"new object");
}

#[test]
fn the_first_byte_waits_at_least_the_latency() {
    let (_upstream, proxy) = setup();
    let latency = Duration::from_millis(150);
    proxy.faults().set_latency(latency);
    let mut client = Client::connect(proxy.addr()).unwrap();
    for _ in 0..2 {
        let start = Instant::now();
        let reply = client.get("/object", &[("Range", "bytes=0-0")]).unwrap();
        assert_eq!(reply.status, 206);
        assert!(start.elapsed() >= latency, "took {:?}", start.elapsed());
    }
    // Injected errors wait too.
    proxy
        .faults()
        .inject(Fault::Status(ErrorStatus::InternalError), 1);
    let start = Instant::now();
    assert_eq!(client.get("/object", &[]).unwrap().status, 500);
    assert!(start.elapsed() >= latency);
    proxy.faults().set_latency(Duration::ZERO);
    assert_eq!(proxy.faults().latency(), Duration::ZERO);
}

#[test]
fn error_statuses_answer_then_requests_succeed_again() {
    let (upstream, proxy) = setup();
    let faults = proxy.faults();
    faults.inject(Fault::Status(ErrorStatus::SlowDown), 2);
    faults.inject(Fault::Status(ErrorStatus::InternalError), 1);
    let mut client = Client::connect(proxy.addr()).unwrap();
    for expected in [503, 503, 500] {
        let reply = client.get("/object", &[("Range", "bytes=0-9")]).unwrap();
        assert_eq!(reply.status, expected);
        assert_eq!(reply.header("content-type"), Some("application/xml"));
        let body = String::from_utf8(reply.body).unwrap();
        let code = if expected == 503 {
            "SlowDown"
        } else {
            "InternalError"
        };
        assert!(
            body.contains(&format!("<Error><Code>{code}</Code>")),
            "{body}"
        );
    }
    let reply = client.get("/object", &[("Range", "bytes=0-9")]).unwrap();
    assert_eq!(reply.status, 206);
    assert_eq!(reply.body, pattern(OBJECT_LEN)[..10]);
    // The faulted requests never reached the upstream.
    assert_eq!(upstream.seen().len(), 1);
    assert_eq!(proxy.stats().error_statuses, 3);
    assert_eq!(faults.pending(), 0);
}

#[test]
fn reset_closes_the_connection_without_an_answer() {
    let (upstream, proxy) = setup();
    proxy.faults().inject(Fault::Reset, 1);
    let mut client = Client::connect(proxy.addr()).unwrap();
    let err = client.get("/object", &[]).unwrap_err();
    // A reset (RST), not a close (FIN, which would read as EOF).
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err:?}");
    assert_eq!(upstream.seen().len(), 0);
    // The next connection is served.
    let mut client = Client::connect(proxy.addr()).unwrap();
    assert_eq!(client.get("/object", &[]).unwrap().body.len(), OBJECT_LEN);
    assert_eq!(proxy.stats().resets, 1);
}

#[test]
fn cut_bodies_stop_at_half_with_the_real_content_length() {
    let (_upstream, proxy) = setup();
    let object = pattern(OBJECT_LEN);
    proxy.faults().inject(Fault::CutBody, 1);
    let mut client = Client::connect(proxy.addr()).unwrap();
    let reply = client.get("/object", &[]).unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.content_length(), Some(OBJECT_LEN));
    assert!(reply.body.len() < OBJECT_LEN);
    assert_eq!(reply.body_error, Some(io::ErrorKind::UnexpectedEof));
    // Everything handed over before the cut arrives: exactly half.
    assert_eq!(reply.body.len(), OBJECT_LEN / 2);
    assert_eq!(reply.body, object[..OBJECT_LEN / 2]);
    assert_eq!(proxy.stats().cut_bodies, 1);

    // Ranged answers are cut at half of the range.
    proxy.faults().inject(Fault::CutBody, 1);
    let mut client = Client::connect(proxy.addr()).unwrap();
    let reply = client
        .get("/object", &[("Range", "bytes=1000-1999")])
        .unwrap();
    assert_eq!((reply.status, reply.content_length()), (206, Some(1000)));
    assert_eq!(reply.body, object[1000..1500]);
}

#[test]
fn reset_mid_body_ends_the_body_early() {
    let (_upstream, proxy) = setup();
    proxy.faults().inject(Fault::ResetMidBody, 1);
    let mut client = Client::connect(proxy.addr()).unwrap();
    let reply = client.get("/object", &[]).unwrap();
    assert_eq!(reply.content_length(), Some(OBJECT_LEN));
    // At most half: a reset also discards what the client had not read yet.
    assert!(reply.body.len() <= OBJECT_LEN / 2);
    assert_eq!(reply.body_error, Some(io::ErrorKind::ConnectionReset));
    assert_eq!(reply.body, pattern(OBJECT_LEN)[..reply.body.len()]);
    assert_eq!(proxy.stats().resets, 1);
}

#[test]
fn the_hook_runs_before_each_request_is_forwarded() {
    let (upstream, proxy) = setup();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (hook_calls, object) = (Arc::clone(&calls), Arc::clone(&upstream.object));
    // Before request 1, the object changes on the upstream's "disk".
    proxy.faults().set_hook(Box::new(move |request| {
        hook_calls.lock().unwrap().push(request);
        if request == 1 {
            object.lock().unwrap().fill(0xAB);
        }
    }));
    let mut client = Client::connect(proxy.addr()).unwrap();
    let before = client.get("/object", &[("Range", "bytes=0-7")]).unwrap();
    let after = client.get("/object", &[("Range", "bytes=0-7")]).unwrap();
    assert_eq!(before.body, pattern(OBJECT_LEN)[..8]);
    assert_eq!(after.body, [0xAB; 8]);
    proxy.faults().clear_hook();
    client.get("/object", &[("Range", "bytes=0-7")]).unwrap();
    assert_eq!(*calls.lock().unwrap(), [0, 1]);
}

#[test]
fn counters_count_requests_bytes_and_ranges() {
    let (_upstream, proxy) = setup();
    let mut client = Client::connect(proxy.addr()).unwrap();
    let before = proxy.stats();
    for (first, last) in [(0u64, 4095u64), (8192, 16383), (100, 100)] {
        let range = format!("bytes={first}-{last}");
        client.get("/object", &[("Range", &range)]).unwrap();
    }
    client.get("/object", &[]).unwrap();
    client.get("/object", &[("Range", "bytes=-10")]).unwrap();
    let stats = proxy.stats().since(&before);
    assert_eq!(stats.requests, 5);
    assert_eq!(stats.ranged_requests, 4);
    assert_eq!(stats.range_bytes, 4096 + 8192 + 1 + 10);
    assert_eq!(stats.body_bytes, 4096 + 8192 + 1 + OBJECT_LEN as u64 + 10);
    assert_eq!(
        stats.mean_range_bytes(),
        Some((4096 + 8192 + 1 + 10) as f64 / 4.0)
    );
    assert_eq!(
        (stats.resets, stats.error_statuses, stats.cut_bodies),
        (0, 0, 0)
    );
}

#[test]
fn bandwidth_cap_slows_bodies_down() {
    let (_upstream, proxy) = setup();
    let rate = 2 * 1024 * 1024;
    proxy.faults().set_bandwidth(NonZeroU64::new(rate));
    let mut client = Client::connect(proxy.addr()).unwrap();
    let start = Instant::now();
    let reply = client.get("/object", &[]).unwrap();
    assert_eq!(reply.body, pattern(OBJECT_LEN));
    // 256 KiB at 2 MiB/s: at least 125 ms.
    let floor = Duration::from_secs_f64(OBJECT_LEN as f64 / rate as f64);
    assert!(start.elapsed() >= floor, "took {:?}", start.elapsed());
    proxy.faults().clear();
    assert_eq!(proxy.faults().bandwidth(), None);
}

#[test]
fn serves_many_connections_at_once() {
    let (_upstream, proxy) = setup();
    let object = Arc::new(pattern(OBJECT_LEN));
    let addr = proxy.addr();
    let workers: Vec<_> = (0..64)
        .map(|i| {
            let object = Arc::clone(&object);
            thread::spawn(move || {
                let mut client = Client::connect(addr).unwrap();
                for j in 0..4 {
                    let first = (i * 4096 + j * 512) % (OBJECT_LEN - 4096);
                    let range = format!("bytes={first}-{}", first + 4095);
                    let reply = client.get("/object", &[("Range", &range)]).unwrap();
                    assert_eq!(reply.body, object[first..first + 4096]);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(proxy.stats().requests, 64 * 4);
}

#[test]
fn stop_closes_open_connections() {
    let (_upstream, proxy) = setup();
    let addr = proxy.addr();
    let mut client = Client::connect(addr).unwrap();
    assert_eq!(
        client
            .get("/object", &[("Range", "bytes=0-0")])
            .unwrap()
            .status,
        206
    );
    proxy.stop();
    // The kept-alive connection is closed, not left hanging.
    assert!(client.get("/object", &[("Range", "bytes=0-0")]).is_err());
    assert!(Client::connect(addr).is_err());
}

#[test]
fn a_dead_upstream_gets_502() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap();
    drop(listener);
    let proxy = Proxy::start(dead).unwrap();
    let mut client = Client::connect(proxy.addr()).unwrap();
    assert_eq!(client.get("/object", &[]).unwrap().status, 502);
    assert_eq!(proxy.stats().upstream_errors, 1);
}

#[test]
fn stops_from_inside_another_tokio_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (_upstream, proxy) = setup();
        drop(proxy);
    });
}
