//! A fault-injecting HTTP/1.1 proxy for faultmap's remote-store tests and
//! benchmarks.
//!
//! A test starts a [`Proxy`] in-process between faultmap's HTTP or S3 store
//! and a real server (nginx, versitygw; see `scripts/remote-servers`), points
//! the store at [`Proxy::url`], and turns faults on and off through a
//! [`Faults`] handle from any thread while the store reads:
//!
//! ```text
//!   faultmap store ──HTTP/1.1──▶ Proxy (127.0.0.1:port) ──HTTP/1.1──▶ nginx / versitygw
//!                                  │ per request, in this order:
//!                                  │  1. log its raw target; count it, and its Range length
//!                                  │  2. call the hook with its number
//!                                  │  3. take at most one one-shot fault:
//!                                  │     Reset | Status(500/503) → answered here, not forwarded
//!                                  │     CutBody | ResetMidBody  → forwarded, body cut at half
//!                                  │  4. forward; wait the first-byte latency; send the head
//!                                  │  5. drop the validators if asked; stream the body
//!                                  │     under the bandwidth cap
//! ```
//!
//! # Faults
//!
//! - **First-byte latency** ([`Faults::set_latency`]): slept before each
//!   response head (and before an injected reset or error status).
//! - **Bandwidth cap** ([`Faults::set_bandwidth`]): bytes per second for
//!   response bodies, **global** to the proxy: all connections share one
//!   link, paced in pieces of at most 64 KiB, so N parallel readers each get
//!   about 1/N of it, as behind one network link.
//! - **One-shot faults** ([`Faults::inject`]`(fault, n)`): the next `n`
//!   requests each take one [`Fault`] from a FIFO queue. [`Fault::Reset`]
//!   closes the TCP connection with a reset (RST) and no answer;
//!   [`Fault::Status`] answers 500 `InternalError` or 503 `SlowDown` with an
//!   S3-style XML body; [`Fault::CutBody`] sends the head with the real
//!   `Content-Length`, half the body, then closes (FIN);
//!   [`Fault::ResetMidBody`] does the same but ends with a reset.
//! - **Hook** ([`Faults::set_hook`]): called with each request's number
//!   (0, 1, 2, … in arrival order) before it is forwarded, so a test can
//!   change the object on disk between two reads of one logical read.
//! - **No validators** ([`Faults::set_drop_validators`],
//!   [`Faults::set_drop_last_modified`]): responses lose their `ETag` and
//!   `Last-Modified`, or their `Last-Modified` alone, as from a server that
//!   sends neither, or an ETag only.
//! - **Request log** ([`Faults::requests`]): each request's method and
//!   target exactly as the client sent it (escapes kept), the first
//!   [`REQUEST_LOG_MAX`].
//! - **Counters** ([`Proxy::stats`], [`Faults::stats`]): requests, response
//!   body bytes, ranged requests and the sum of their range lengths (so a
//!   benchmark can report requests and mean request size), and one counter
//!   per injected fault.
//!
//! Requests pass through unchanged: method (GET, HEAD, PUT, …), path and
//! query, every header (`Authorization`, `x-amz-*`, `If-Match`, `Range`)
//! and the request body. Responses pass through unchanged too (status,
//! headers, body bytes) unless a fault says otherwise. The proxy adds no
//! headers.
//!
//! # S3 through the proxy
//!
//! SigV4 signs the `Host` header. The proxy forwards `Host` as the client
//! sent it, that is the proxy's own `127.0.0.1:port`, so an S3 client must
//! treat the proxy as *the* endpoint (`AmazonS3Builder::with_endpoint(
//! proxy.url())`, path-style) and sign for it; versitygw checks the
//! signature against the `Host` it receives, which is that same value.
//! (Checked with `curl --aws-sigv4` through `examples/forward.rs`: a signed
//! ranged GET and a signed PUT to versitygw through the proxy succeed.)
//!
//! `examples/forward.rs` runs a proxy by hand:
//! `cargo run -p faultmap-proxy --example forward -- 127.0.0.1:PORT`.
//!
//! # Why a hand-written proxy
//!
//! No well-kept Rust crate is a programmable, HTTP-aware fault-injecting
//! proxy. Toxiproxy is an external Go service driven over a REST API (the
//! `toxiproxy_rust` and `noxious-client` crates are its clients), and it and
//! its Rust port `noxious` (last released 2021) work on raw TCP streams: they
//! can delay, throttle or cut a stream, but cannot answer one request with a
//! 503, cut one response at half its body, count ranges, or call a test's
//! code between two requests of one keep-alive connection. Mock servers
//! (`wiremock`, `httpmock`) answer from canned responses instead of
//! forwarding to a real store. So this crate puts the faults on top of
//! hyper (server and client), which faultmap's S3/HTTP stores already
//! build on through `object_store` and reqwest: it parses no HTTP itself.
//!
//! # Runtime
//!
//! Each [`Proxy`] owns a single-threaded tokio runtime on a thread of its
//! own, so it can be used from synchronous tests and from inside another
//! tokio runtime alike, and takes at most one core from the code under test.
//! [`Proxy::stop`] (or dropping the proxy) stops accepting, closes every
//! connection and joins the proxy's thread.

#![warn(missing_docs)]

mod body;
mod conn;
mod faults;
mod proxy;

pub use faults::{ErrorStatus, Fault, Faults, Hook, Stats, REQUEST_LOG_MAX};
pub use proxy::Proxy;
