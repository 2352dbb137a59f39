//! The proxy in front of the real servers that `scripts/remote-servers up`
//! starts (scripts/test-all does, and exports their variables). Without
//! those variables this test fails: it does not skip.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;

use common::{pattern, Client};
use faultmap_proxy::{ErrorStatus, Fault, Proxy};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: this test needs the servers of scripts/remote-servers. \
             Run it under scripts/test-all, or first: eval \"$(scripts/remote-servers up)\""
        )
    })
}

/// `http://127.0.0.1:PORT` as a socket address.
fn addr_of(url: &str) -> SocketAddr {
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    host.parse()
        .unwrap_or_else(|e| panic!("{url}: not http://IP:PORT: {e}"))
}

#[test]
fn nginx_through_the_proxy() {
    let (url, root) = (
        var("FAULTMAP_HTTP_URL"),
        PathBuf::from(var("FAULTMAP_HTTP_ROOT")),
    );
    let name = format!("faultmap-proxy-test-{}.bin", std::process::id());
    let object = pattern(1 << 20);
    std::fs::write(root.join(&name), &object).unwrap();
    let path = format!("/{name}");

    let proxy = Proxy::start(addr_of(&url)).unwrap();
    let mut client = Client::connect(proxy.addr()).unwrap();
    let reply = client.get(&path, &[("Range", "bytes=4096-12287")]).unwrap();
    assert_eq!(reply.status, 206);
    assert_eq!(reply.body, object[4096..12288]);
    let head = client.request("HEAD", &path, &[], &[]).unwrap();
    assert_eq!(head.content_length(), Some(object.len()));

    proxy
        .faults()
        .inject(Fault::Status(ErrorStatus::SlowDown), 1);
    proxy.faults().inject(Fault::CutBody, 1);
    assert_eq!(client.get(&path, &[]).unwrap().status, 503);
    let cut = client.get(&path, &[("Range", "bytes=0-65535")]).unwrap();
    assert_eq!(cut.content_length(), Some(65536));
    assert_eq!(cut.body, object[..32768]);

    let mut client = Client::connect(proxy.addr()).unwrap();
    let whole = client.get(&path, &[]).unwrap();
    assert_eq!(whole.body, object);
    let stats = proxy.stats();
    assert_eq!((stats.requests, stats.ranged_requests), (5, 2));
    assert_eq!(stats.range_bytes, 8192 + 65536);
    assert_eq!(stats.body_bytes, 8192 + 32768 + object.len() as u64);
    std::fs::remove_file(root.join(&name)).unwrap();
}

/// Signed S3 reads through the proxy are the S3 store's tests; here the
/// proxy only has to reach versitygw and bring back its S3 error answer to
/// an unsigned request, untouched.
#[test]
fn versitygw_through_the_proxy() {
    let endpoint = var("AWS_ENDPOINT_URL");
    let bucket = var("FAULTMAP_S3_BUCKET");
    let proxy = Proxy::start(addr_of(&endpoint)).unwrap();
    let mut client = Client::connect(proxy.addr()).unwrap();
    let reply = client.get(&format!("/{bucket}/no-such-key"), &[]).unwrap();
    assert_eq!(reply.status, 403);
    assert_eq!(reply.header("server"), Some("VERSITYGW"));
    let body = String::from_utf8(reply.body).unwrap();
    assert!(body.contains("<Code>AccessDenied</Code>"), "{body}");
}
