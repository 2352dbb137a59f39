//! The proxy: a listener on 127.0.0.1, one hyper HTTP/1.1 server connection
//! per client connection, and one pooled hyper client to the upstream.
//!
//! Threads: `start` binds the listener and builds a single-threaded tokio
//! runtime on the caller's thread (so both fail there, as an `io::Error`),
//! then moves the runtime to a thread of its own, `faultmap-proxy`, which
//! runs the accept loop and every connection task until it is told to stop.
//! One thread, because a request then crosses no thread on its way through
//! (cross-CPU wake-ups cost tens of µs on the project's VMs), because the
//! proxy then takes at most one core of the machine from the pager under
//! test, and because the hook can simply run inline. It still forwards
//! 8 MiB ranges from nginx at about 1 GB/s, and serves many connections at
//! once (they are tasks).
//!
//! Stopping drops the stop sender; the accept loop ends, the runtime shuts
//! down (cancelling every connection task, which closes its socket) on the
//! proxy's own thread, and that thread is joined. Dropping the runtime there,
//! never on the caller's thread, is what lets a proxy be stopped from inside
//! another tokio runtime.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, ETAG, LAST_MODIFIED, RANGE};
use http::uri::{Authority, Scheme, Uri};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::body::{BodyError, Cut, FaultBody, ProxyBody};
use crate::conn::{ConnState, FaultIo};
use crate::faults::{range_len, Fault, Faults, Shared, Stats};

/// How long a stopping proxy waits for the runtime's blocking tasks (the
/// resolver's, which a socket-address upstream never starts) before leaving
/// them to finish on their own.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long the accept loop pauses after a failed accept (out of file
/// descriptors, say) before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// Idle upstream connections kept per proxy; more than any test opens.
const UPSTREAM_IDLE_MAX: usize = 256;

/// How long an idle upstream connection is kept: less than the servers'
/// own idle limits (nginx's `keepalive_timeout` is 75 s in
/// scripts/remote-servers), so the proxy drops a connection before the
/// server does rather than racing the server's close with a new request.
const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A running fault-injecting proxy in front of one upstream HTTP server.
///
/// It listens on `127.0.0.1` on a free port; [`Proxy::stop`] or dropping it
/// stops it. See the crate documentation for what it does per request.
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    faults: Faults,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free port of 127.0.0.1.
    ///
    /// Fails if the listener, the runtime or the proxy's thread cannot be
    /// created. An upstream that does not answer is not an error here: its
    /// requests get 502 (counted in [`Stats::upstream_errors`]).
    pub fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared::default());
        let route = Arc::new(Route::new(upstream, Arc::clone(&shared)));
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("faultmap-proxy".into())
            .spawn(move || {
                runtime.block_on(accept_loop(listener, route, stopped));
                runtime.shutdown_timeout(SHUTDOWN_GRACE);
            })?;
        Ok(Proxy {
            addr,
            upstream,
            faults: Faults::new(shared),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's base URL, `http://127.0.0.1:PORT`, without a trailing
    /// slash: the endpoint a store under test is given.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The upstream the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The handle to this proxy's faults and counters.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// The counters now (the same as `self.faults().stats()`).
    pub fn stats(&self) -> Stats {
        self.faults.stats()
    }

    /// Stops the proxy: stops accepting, closes every connection and joins
    /// the proxy's threads. Dropping the proxy does the same.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        // Dropping the sender ends the accept loop.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A panic on the proxy's thread has already been reported there.
            let _ = thread.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

async fn accept_loop(listener: TcpListener, route: Arc<Route>, mut stopped: oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(stream, Arc::clone(&route)));
                }
                Err(_) => tokio::time::sleep(ACCEPT_BACKOFF).await,
            },
        }
    }
}

/// Serves one client connection until the client closes it, a fault ends
/// it, or the proxy stops.
async fn serve_connection(stream: TcpStream, route: Arc<Route>) {
    // Small responses (errors, HEAD) must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    let conn = Arc::new(ConnState::default());
    let io = TokioIo::new(FaultIo::new(stream, Arc::clone(&conn)));
    let service = service_fn(move |request| {
        let route = Arc::clone(&route);
        let conn = Arc::clone(&conn);
        async move { route.handle(request, conn).await }
    });
    // An error here is a fault we injected or a client that went away; the
    // connection ends either way.
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .serve_connection(io, service)
        .await;
}

/// The error a request handler returns to make hyper drop the connection
/// without an answer.
#[derive(Debug)]
struct InjectedReset;

impl std::fmt::Display for InjectedReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("faultmap-proxy: connection reset by an injected fault")
    }
}

impl std::error::Error for InjectedReset {}

/// Where requests go, and the state their faults read.
struct Route {
    upstream: Authority,
    shared: Arc<Shared>,
    client: Client<HttpConnector, Incoming>,
}

impl Route {
    fn new(upstream: SocketAddr, shared: Arc<Shared>) -> Route {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(UPSTREAM_IDLE_MAX)
            .pool_idle_timeout(UPSTREAM_IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .build(connector);
        // A socket address always parses as an authority.
        let upstream = Authority::try_from(upstream.to_string())
            .unwrap_or_else(|_| Authority::from_static("127.0.0.1"));
        Route {
            upstream,
            shared,
            client,
        }
    }

    /// Handles one request, in the steps of the crate documentation.
    async fn handle(
        &self,
        request: Request<Incoming>,
        conn: Arc<ConnState>,
    ) -> Result<Response<ProxyBody>, InjectedReset> {
        let counters = &self.shared.counters;
        // 1. Log, count the request and its range.
        let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
        self.shared.log_request(request.method().as_str(), target);
        let number = counters
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let range = request.headers().get(RANGE).and_then(|v| v.to_str().ok());
        if let Some(len) = range.and_then(range_len) {
            Shared::add(&counters.ranged_requests, 1);
            Shared::add(&counters.range_bytes, len);
        }
        // 2. The hook, on the proxy's one thread: every connection waits.
        self.shared.run_hook(number);
        // 3. At most one one-shot fault; those answered here answer now.
        let fault = self.shared.next_fault();
        let is_head = request.method() == Method::HEAD;
        match fault {
            Some(Fault::Reset) => {
                self.first_byte_latency().await;
                Shared::add(&counters.resets, 1);
                conn.reset_on_close();
                return Err(InjectedReset);
            }
            Some(Fault::Status(status)) => {
                self.first_byte_latency().await;
                Shared::add(&counters.error_statuses, 1);
                return Ok(fixed(status.code(), "application/xml", status.xml(number)));
            }
            Some(Fault::CutBody | Fault::ResetMidBody) | None => {}
        }
        // 4. Forward; the latency falls between the upstream's head and ours.
        let response = match self.forward(request).await {
            Ok(response) => response,
            Err(e) => {
                Shared::add(&counters.upstream_errors, 1);
                self.first_byte_latency().await;
                let text = format!("faultmap-proxy: upstream {}: {e}\n", self.upstream);
                return Ok(fixed(StatusCode::BAD_GATEWAY, "text/plain", text));
            }
        };
        self.first_byte_latency().await;
        // 5. The head, without validators if asked; the body, cut at half its length if the fault says so.
        let cut = match fault {
            Some(Fault::CutBody) if !is_head => {
                Shared::add(&counters.cut_bodies, 1);
                Some(Cut::after(half_body(&response), false))
            }
            Some(Fault::ResetMidBody) if !is_head => {
                Shared::add(&counters.resets, 1);
                Some(Cut::after(half_body(&response), true))
            }
            _ => None,
        };
        let (mut head, body) = response.into_parts();
        let (drop_etag, drop_last_modified) = self.shared.drops_validators();
        if drop_etag {
            head.headers.remove(ETAG);
        }
        if drop_last_modified {
            head.headers.remove(LAST_MODIFIED);
        }
        let body = FaultBody::new(body, Arc::clone(&self.shared), conn, cut);
        Ok(Response::from_parts(head, BodyExt::boxed(body)))
    }

    /// Sends `request` to the upstream as it came: same method, path,
    /// query, headers (`Host` included) and body.
    async fn forward(&self, request: Request<Incoming>) -> Result<Response<Incoming>, BodyError> {
        let (mut head, body) = request.into_parts();
        let mut uri = head.uri.clone().into_parts();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(self.upstream.clone());
        if uri.path_and_query.is_none() {
            uri.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        head.uri = Uri::from_parts(uri)?;
        Ok(self.client.request(Request::from_parts(head, body)).await?)
    }

    async fn first_byte_latency(&self) {
        let latency = self.shared.latency();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }
}

/// Half of a response body's length: from `Content-Length`, else from the
/// body's exact size; 0 (the head, then the cut) when neither is known.
fn half_body(response: &Response<Incoming>) -> u64 {
    let from_header = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    from_header
        .or(response.body().size_hint().exact())
        .unwrap_or(0)
        / 2
}

/// A response the proxy makes itself (injected errors, 502).
fn fixed(status: StatusCode, content_type: &'static str, body: String) -> Response<ProxyBody> {
    let len = body.len();
    let body = Full::new(Bytes::from(body)).map_err(|never| match never {});
    let mut response = Response::new(BodyExt::boxed(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    headers.insert(CONTENT_LENGTH, http::HeaderValue::from(len));
    response
}
