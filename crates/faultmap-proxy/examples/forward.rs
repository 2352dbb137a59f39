//! Runs a proxy in front of an upstream until standard input closes, for
//! poking at it by hand (curl, an S3 client):
//!
//! ```text
//! cargo run -p faultmap-proxy --example forward -- 127.0.0.1:PORT [latency-ms]
//! ```
//!
//! It prints the proxy's URL on standard output, then its counters when
//! standard input closes.

use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use faultmap_proxy::Proxy;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let upstream: SocketAddr = args
        .next()
        .ok_or("usage: forward UPSTREAM_ADDR [LATENCY_MS]")?
        .parse()?;
    let latency_ms: u64 = args.next().map_or(Ok(0), |ms| ms.parse())?;
    let proxy = Proxy::start(upstream)?;
    proxy
        .faults()
        .set_latency(Duration::from_millis(latency_ms));
    println!("{}", proxy.url());
    std::io::stdin().read_to_end(&mut Vec::new())?;
    eprintln!("{:?}", proxy.stats());
    proxy.stop();
    Ok(())
}
