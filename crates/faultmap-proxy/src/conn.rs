//! One client connection's socket, wrapped so that faults can end it.
//!
//! hyper owns the socket while it serves a connection, so two things a fault
//! needs are reached through [`ConnState`], shared by the socket wrapper
//! ([`FaultIo`]) and the connection's request handler and bodies:
//!
//! - `reset`: set by a reset fault before the connection is dropped; the
//!   wrapper's `Drop` then sets `SO_LINGER` to zero, so closing sends RST
//!   instead of FIN.
//! - `flushes`: counts the socket flushes hyper completes. hyper buffers body
//!   bytes and writes them at its next flush, and an error from a body drops
//!   the buffer unwritten; so a body that is cut waits for one flush after its
//!   last piece (every byte handed over is then in the socket) before it
//!   fails. The body and the socket are driven by the same task, so a flush
//!   cannot slip between the body's check and its waker's registration.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// What a connection's faults share with its socket.
#[derive(Default)]
pub(crate) struct ConnState {
    reset: AtomicBool,
    flushes: AtomicU64,
    flush_waker: Mutex<Option<Waker>>,
}

impl ConnState {
    /// Makes the close of this connection a reset (RST).
    pub(crate) fn reset_on_close(&self) {
        self.reset.store(true, Relaxed);
    }

    /// Flushes completed so far.
    pub(crate) fn flushes(&self) -> u64 {
        self.flushes.load(Relaxed)
    }

    /// Wakes `waker` at the next completed flush.
    pub(crate) fn wake_at_flush(&self, waker: &Waker) {
        *self
            .flush_waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
    }

    fn flushed(&self) {
        self.flushes.fetch_add(1, Relaxed);
        let waker = self
            .flush_waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A client socket that reports flushes and can close with a reset.
pub(crate) struct FaultIo {
    stream: TcpStream,
    state: std::sync::Arc<ConnState>,
}

impl FaultIo {
    pub(crate) fn new(stream: TcpStream, state: std::sync::Arc<ConnState>) -> FaultIo {
        FaultIo { stream, state }
    }
}

impl Drop for FaultIo {
    fn drop(&mut self) {
        if self.state.reset.load(Relaxed) {
            // Linger zero: close() discards unsent data and sends RST; it
            // does not block. If it fails the close is a FIN, still an end.
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for FaultIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for FaultIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.stream).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            this.state.flushed();
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
