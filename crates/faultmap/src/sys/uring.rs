//! io_uring batches: several O_DIRECT reads in flight for one caller.
//!
//! A single `pread` of a large range is one request at a time from the
//! caller's point of view; the file store's `Uring` mode instead cuts a range
//! into chunks and hands them all to the kernel at once, so the device sees a
//! deep queue even when one thread asks. This module is the only place that
//! gives the kernel a raw buffer pointer for later; the store above it only
//! sees two safe functions, [`read_segments`] and [`read_stream`].
//!
//! ## State
//!
//! Each thread owns one ring (`thread_local!`), made on first use with
//! [`RING_ENTRIES`] entries, `IORING_SETUP_SINGLE_ISSUER` and
//! `DEFER_TASKRUN` when the kernel has them (completions are then run only
//! when the thread waits, which it does right away). The fault path's I/O
//! threads live as long as the pager, so a ring costs one setup per thread,
//! and needs no lock. A call runs one *batch*: up to `depth` *slots*, each
//! holding at most one read in flight; a read's `user_data` is its slot.
//!
//! ```text
//!   caller's buffer  |-- chunk 0 --|-- chunk 1 --|-- chunk 2 --| ... |-- n --|
//!   slots               [0] flying    [1] flying    [2] flying       waiting
//!                        \ a CQE frees slot 0: chunk 3 goes into it
//! ```
//!
//! ## Invariant
//!
//! A buffer handed to the kernel stays valid, and is touched by nobody
//! else, until the CQE of its read has been reaped. The safe entry points
//! take `&mut [u8]` borrows that outlive their batch, and a batch is drained
//! (every read in flight reaped) before it goes away, on success, on error
//! and on unwinding ([`Batch`]'s `Drop`).
//!
//! ## Completions
//!
//! - all the bytes asked for: the slot is free.
//! - fewer (a short read): done if the read reached `file_len` (end of
//!   file), else the rest is resubmitted.
//! - 0 before `file_len`: the file shrank; `UnexpectedEof` at that offset.
//! - `-EINTR`, `-EAGAIN`: resubmitted as is, at most [`MAX_RETRIES`] times.
//! - any other error: the batch's error (the first one wins, with the
//!   offset of the failed read). No new read starts; those in flight are
//!   reaped, then the error is returned.
//!
//! If the ring itself fails (`io_uring_enter` with an error other than
//! `EINTR`, `EAGAIN`, `EBUSY`, which a working ring never returns), waiting
//! goes on with short sleeps rather than return while the kernel may still
//! write into a buffer: the invariant is kept at the cost of a hang.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use io_uring::{opcode, types, IoUring};

/// Submission entries of each thread's ring, and the most reads one batch
/// keeps in flight.
pub(crate) const RING_ENTRIES: u32 = 64;

/// The most one read moves (the kernel's `MAX_RW_COUNT`, page-aligned).
const MAX_RW_COUNT: u32 = 0x7fff_f000;

/// How often an `EINTR` or `EAGAIN` read is resubmitted before it counts as
/// an error.
const MAX_RETRIES: u32 = 16;

/// Why a batch did not fill its buffers.
#[derive(Debug)]
pub(crate) enum UringError {
    /// This thread has no ring (io_uring disabled or refused, out of
    /// memory, or the ring is busy in an outer call): read another way.
    Setup,
    /// A read failed.
    Read {
        /// The first byte of the read that failed.
        offset: u64,
        /// The kernel's error (`UnexpectedEof` if the file ended early).
        source: io::Error,
    },
}

/// A thread's ring, with the process that made it: a child of `fork` must
/// not use its parent's ring.
struct ThreadRing {
    pid: u32,
    ring: Result<IoUring, ()>,
}

thread_local! {
    static RING: RefCell<Option<ThreadRing>> = const { RefCell::new(None) };
}

/// A new ring, tuned if the kernel allows, else plain.
fn new_ring() -> Result<IoUring, ()> {
    IoUring::builder()
        .dontfork()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_ENTRIES)
        .or_else(|_| IoUring::builder().dontfork().build(RING_ENTRIES))
        .map_err(drop)
}

/// Runs `f` with this thread's ring, making it on first use.
fn with_ring<T>(f: impl FnOnce(&mut IoUring) -> Result<T, UringError>) -> Result<T, UringError> {
    RING.try_with(|cell| {
        let mut entry = cell.try_borrow_mut().map_err(|_| UringError::Setup)?;
        let pid = std::process::id();
        if entry.as_ref().is_some_and(|r| r.pid != pid) {
            // Inherited through fork: the ring's memory was not (dontfork),
            // so dropping it would unmap whatever the child has there now.
            // Leak the parent's ring and make our own.
            std::mem::forget(entry.take());
        }
        let thread_ring = entry.get_or_insert_with(|| ThreadRing {
            pid,
            ring: new_ring(),
        });
        match &mut thread_ring.ring {
            Ok(ring) => f(ring),
            Err(()) => Err(UringError::Setup),
        }
    })
    .unwrap_or(Err(UringError::Setup))
}

/// Whether this thread can have a ring (making it if it has none yet): the
/// check at open, so that a kernel without io_uring is found then.
pub(crate) fn available() -> bool {
    with_ring(|_| Ok(())).is_ok()
}

/// Fills every segment `(file offset, buffer)` with the bytes of `fd` there,
/// in reads of at most `chunk` bytes, at most `depth` in flight. A read may
/// end short only at `file_len`, whatever its buffer's length: a segment
/// that runs past the end of the file is filled up to it.
///
/// For O_DIRECT, every offset, buffer address and `chunk` must be aligned
/// as the file requires (else the reads fail with `EINVAL`).
pub(crate) fn read_segments(
    fd: RawFd,
    file_len: u64,
    segments: &mut [(u64, &mut [u8])],
    chunk: usize,
    depth: usize,
) -> Result<(), UringError> {
    let chunk = chunk.max(1);
    // All the reads, in order: (offset, buffer pointer, length).
    let mut reads = segments.iter_mut().flat_map(|(offset, buf)| {
        let base = *offset;
        buf.chunks_mut(chunk)
            .enumerate()
            .map(move |(i, part)| (base + (i * chunk) as u64, part.as_mut_ptr(), part.len()))
    });
    with_ring(|ring| {
        let mut batch = Batch::new(ring, fd, file_len, depth);
        loop {
            // 1. Start reads in every free slot.
            while let Some(slot) = batch.free_slot() {
                let Some((offset, ptr, len)) = reads.next() else {
                    break;
                };
                // SAFETY: `ptr..ptr+len` is a chunk of one of `segments`'
                // buffers, which are exclusively borrowed for this whole
                // call; chunks do not overlap; `batch` is drained before
                // this closure returns (explicitly below, or by its Drop).
                unsafe { batch.start(slot, offset, ptr, len) };
            }
            if batch.in_flight == 0 {
                break;
            }
            // 2. Wait for one to finish (short reads are resubmitted inside).
            batch.complete_one();
        }
        batch.result().map(|_| ())
    })
}

/// Reads `fd` from 0 to `file_len` in `chunk`-byte requests, `depth` in
/// flight, through `slots` (at least `depth * chunk` bytes: one buffer per
/// slot, reused as each read completes). Returns the bytes read. The data is
/// thrown away: this measures the device.
pub(crate) fn read_stream(
    fd: RawFd,
    file_len: u64,
    slots: &mut [u8],
    chunk: usize,
    depth: usize,
) -> Result<u64, UringError> {
    let chunk = chunk.max(1);
    let depth = depth.min(slots.len() / chunk).min(RING_ENTRIES as usize);
    if depth == 0 {
        return Err(UringError::Read {
            offset: 0,
            source: io::ErrorKind::InvalidInput.into(),
        });
    }
    let base = slots.as_mut_ptr();
    with_ring(|ring| {
        let mut batch = Batch::new(ring, fd, file_len, depth);
        let mut next = 0u64;
        let start = |batch: &mut Batch<'_>, slot: usize, next: &mut u64| {
            if *next < file_len && batch.error.is_none() {
                // SAFETY: slot < depth <= slots.len() / chunk, so the slot's
                // chunk lies inside `slots`, which is exclusively borrowed for
                // this call; the slot is free, so no read in flight uses it;
                // `batch` is drained before this closure returns.
                unsafe { batch.start(slot, *next, base.add(slot * chunk), chunk) };
                *next += chunk as u64;
            }
        };
        for slot in 0..depth {
            start(&mut batch, slot, &mut next);
        }
        while batch.in_flight > 0 {
            let slot = batch.complete_one();
            start(&mut batch, slot, &mut next);
        }
        batch.result()
    })
}

/// One read in flight: `len` bytes of the file at `offset` into `ptr`, of
/// which `done` have arrived.
struct Op {
    offset: u64,
    ptr: *mut u8,
    len: usize,
    done: usize,
    retries: u32,
}

/// The reads one call has in flight on its thread's ring.
struct Batch<'r> {
    ring: &'r mut IoUring,
    fd: RawFd,
    file_len: u64,
    slots: Vec<Option<Op>>,
    in_flight: usize,
    /// Bytes read by the reads that completed.
    bytes: u64,
    /// The first error: no read starts or restarts after it.
    error: Option<(u64, io::Error)>,
    /// Set by `Drop`: reap, do not resubmit.
    stopping: bool,
}

impl<'r> Batch<'r> {
    fn new(ring: &'r mut IoUring, fd: RawFd, file_len: u64, depth: usize) -> Self {
        let depth = depth.clamp(1, RING_ENTRIES as usize);
        Self {
            ring,
            fd,
            file_len,
            slots: (0..depth).map(|_| None).collect(),
            in_flight: 0,
            bytes: 0,
            error: None,
            stopping: false,
        }
    }

    /// A slot with no read in flight, unless the batch has failed.
    fn free_slot(&self) -> Option<usize> {
        if self.error.is_some() {
            return None;
        }
        self.slots.iter().position(Option::is_none)
    }

    /// Starts a read of `len` bytes at `offset` into `ptr`, in `slot`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be valid for writes and used by nothing else
    /// (no other read in flight included) until this batch has reaped the
    /// read's completion: until `slot` is returned by `complete_one` or the
    /// batch is dropped. `slot` must be free.
    unsafe fn start(&mut self, slot: usize, offset: u64, ptr: *mut u8, len: usize) {
        self.slots[slot] = Some(Op {
            offset,
            ptr,
            len,
            done: 0,
            retries: 0,
        });
        self.in_flight += 1;
        self.push(slot);
    }

    /// Queues the rest of `slot`'s read on the ring.
    fn push(&mut self, slot: usize) {
        let Some(op) = &self.slots[slot] else {
            return;
        };
        let rest = op.len - op.done;
        // One read moves at most MAX_RW_COUNT anyway; a short read
        // resubmits the rest.
        let len = u32::try_from(rest).map_or(MAX_RW_COUNT, |l| l.min(MAX_RW_COUNT));
        // SAFETY: op.ptr + op.done stays inside the buffer `start` was given
        // (done < len).
        let ptr = unsafe { op.ptr.add(op.done) };
        let sqe = opcode::Read::new(types::Fd(self.fd), ptr, len)
            .offset(op.offset + op.done as u64)
            .build()
            .user_data(slot as u64);
        loop {
            // SAFETY: the entry points into the buffer of an Op accepted by
            // `start`, whose contract keeps it valid and unshared until the
            // completion is reaped, which this batch does before it ends.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            // The queue is full: hand it to the kernel and retry.
            if let Err(e) = self.ring.submit() {
                if !is_transient(&e) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Waits for one read to finish (resubmitting short and interrupted
    /// reads) and returns its slot, now free.
    fn complete_one(&mut self) -> usize {
        loop {
            let (user_data, res) = self.next_cqe();
            let Ok(slot) = usize::try_from(user_data) else {
                continue;
            };
            let Some(op) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue; // not ours: cannot happen on a private ring
            };
            let abandon = self.error.is_some() || self.stopping;
            let at = op.offset + op.done as u64;
            if res > 0 {
                op.done += res.unsigned_abs() as usize;
                let reached_eof = op.offset + op.done as u64 >= self.file_len;
                if op.done < op.len && !reached_eof && !abandon {
                    self.push(slot);
                    continue;
                }
            } else if res == 0 {
                if at < self.file_len && self.error.is_none() {
                    self.error = Some((at, io::ErrorKind::UnexpectedEof.into()));
                }
            } else {
                let errno = -res;
                let transient = errno == libc::EINTR || errno == libc::EAGAIN;
                if transient && op.retries < MAX_RETRIES && !abandon {
                    op.retries += 1;
                    self.push(slot);
                    continue;
                }
                if self.error.is_none() {
                    self.error = Some((at, io::Error::from_raw_os_error(errno)));
                }
            }
            // The read is over: count it and free its slot.
            let done = (op.offset + op.done as u64).min(self.file_len);
            self.bytes += done.saturating_sub(op.offset);
            self.slots[slot] = None;
            self.in_flight -= 1;
            return slot;
        }
    }

    /// The next completion `(user_data, result)`, submitting what is queued
    /// and waiting as needed.
    fn next_cqe(&mut self) -> (u64, i32) {
        loop {
            if let Some(cqe) = self.ring.completion().next() {
                return (cqe.user_data(), cqe.result());
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                if !is_transient(&e) {
                    // See the module doc: never return with reads in flight.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// The bytes read, or the first error.
    fn result(&mut self) -> Result<u64, UringError> {
        match self.error.take() {
            None => Ok(self.bytes),
            Some((offset, source)) => Err(UringError::Read { offset, source }),
        }
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.stopping = true;
        while self.in_flight > 0 {
            self.complete_one();
        }
    }
}

/// Errors of `io_uring_enter` that a retry clears.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
}
