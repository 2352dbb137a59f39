//! The response body the proxy sends: the upstream's body, paced under the
//! bandwidth cap, counted, and cut short when a fault says so.
//!
//! [`FaultBody::poll_frame`] is one loop over four steps:
//!
//! 1. a piece waiting for its slot under the cap is released when its timer
//!    fires;
//! 2. at the cut point, the body waits for one socket flush (see
//!    [`crate::conn`]) and then fails, which makes hyper drop the connection
//!    with the head's `Content-Length` unmet;
//! 3. when nothing is buffered, the next frame comes from the upstream
//!    (trailers pass through as they are);
//! 4. otherwise the next piece is split off: up to the cut point, and at most
//!    [`PACE_PIECE`] bytes while a cap is set.
//!
//! `size_hint` is the upstream's, so hyper keeps the upstream's framing even
//! when the body will be cut.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Sleep;

use crate::conn::ConnState;
use crate::faults::Shared;

/// The errors a proxied body can end with.
pub(crate) type BodyError = Box<dyn Error + Send + Sync>;

/// Every response body the proxy sends.
pub(crate) type ProxyBody = BoxBody<Bytes, BodyError>;

/// The largest piece sent at once while a bandwidth cap is set: small enough
/// that pacing is smooth, large enough that its timer costs little.
pub(crate) const PACE_PIECE: u64 = 64 * 1024;

/// The error a cut body ends with.
#[derive(Debug)]
pub(crate) struct CutShort;

impl fmt::Display for CutShort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("faultmap-proxy: body cut short by an injected fault")
    }
}

impl Error for CutShort {}

/// Where and how a body is cut.
pub(crate) struct Cut {
    /// Bytes still to send before the cut.
    left: u64,
    /// End with a reset (RST) rather than a close (FIN).
    reset: bool,
    /// The connection's flush count when the cut point was reached.
    flushes_at_cut: Option<u64>,
}

impl Cut {
    /// A cut after `at` bytes.
    pub(crate) fn after(at: u64, reset: bool) -> Cut {
        Cut {
            left: at,
            reset,
            flushes_at_cut: None,
        }
    }
}

/// The upstream's body as the client receives it.
pub(crate) struct FaultBody {
    upstream: Incoming,
    shared: Arc<Shared>,
    conn: Arc<ConnState>,
    /// Bytes received from the upstream and not yet sent.
    buf: Bytes,
    /// A piece waiting for its slot under the bandwidth cap.
    paced: Option<(Bytes, Pin<Box<Sleep>>)>,
    cut: Option<Cut>,
}

impl FaultBody {
    pub(crate) fn new(
        upstream: Incoming,
        shared: Arc<Shared>,
        conn: Arc<ConnState>,
        cut: Option<Cut>,
    ) -> FaultBody {
        FaultBody {
            upstream,
            shared,
            conn,
            buf: Bytes::new(),
            paced: None,
            cut,
        }
    }

    fn send(&self, piece: Bytes) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Shared::add(&self.shared.counters.body_bytes, piece.len() as u64);
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    /// Step 2: fail once everything sent before the cut has been flushed.
    fn poll_cut(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let flushes = self.conn.flushes();
        let Some(cut) = self.cut.as_mut() else {
            return Poll::Ready(None);
        };
        match cut.flushes_at_cut {
            Some(at) if flushes > at => {
                if cut.reset {
                    self.conn.reset_on_close();
                }
                self.cut = None;
                Poll::Ready(Some(Err(Box::new(CutShort))))
            }
            _ => {
                cut.flushes_at_cut.get_or_insert(flushes);
                self.conn.wake_at_flush(cx.waker());
                Poll::Pending
            }
        }
    }
}

impl Body for FaultBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            // 1. A piece waiting for its slot.
            if let Some((_, timer)) = this.paced.as_mut() {
                ready!(timer.as_mut().poll(cx));
                if let Some((piece, _)) = this.paced.take() {
                    return this.send(piece);
                }
            }
            // 2. The cut point.
            if this.cut.as_ref().is_some_and(|cut| cut.left == 0) {
                return this.poll_cut(cx);
            }
            // 3. Refill from the upstream.
            if this.buf.is_empty() {
                match ready!(Pin::new(&mut this.upstream).poll_frame(cx)) {
                    None => return Poll::Ready(None),
                    Some(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => this.buf = data,
                        Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                    },
                }
                continue;
            }
            // 4. The next piece.
            let rate = this.shared.bandwidth();
            let mut len = this.buf.len() as u64;
            if rate.is_some() {
                len = len.min(PACE_PIECE);
            }
            if let Some(cut) = this.cut.as_mut() {
                len = len.min(cut.left);
                cut.left -= len;
            }
            // len <= buf.len(), a usize.
            let piece = this
                .buf
                .split_to(usize::try_from(len).unwrap_or(usize::MAX));
            match rate {
                None => return this.send(piece),
                Some(rate) => {
                    let release = this.shared.pace(len, rate);
                    let timer = Box::pin(tokio::time::sleep_until(release.into()));
                    this.paced = Some((piece, timer));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.buf.is_empty()
            && self.paced.is_none()
            && !matches!(&self.cut, Some(cut) if cut.left == 0)
            && self.upstream.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.upstream.size_hint()
    }
}
