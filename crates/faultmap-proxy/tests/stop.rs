//! Stopping a proxy joins its threads. (A test binary of its own: no other
//! proxy may run in the process while it counts threads.)

mod common;

use std::time::{Duration, Instant};

use common::{pattern, Client, Upstream};
use faultmap_proxy::Proxy;

/// The threads of this process whose name starts with `faultmap-proxy`.
fn proxy_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("faultmap-proxy"))
        .count()
}

#[test]
fn stop_joins_the_proxy_threads() {
    let upstream = Upstream::start(pattern(4096));
    let proxy = Proxy::start(upstream.addr).unwrap();
    let mut client = Client::connect(proxy.addr()).unwrap();
    assert_eq!(client.get("/object", &[]).unwrap().status, 200);
    assert!(proxy_threads() >= 1);
    proxy.stop();
    // A joined thread leaves /proc/self/task as it exits: allow a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy_threads() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(proxy_threads(), 0);
}
