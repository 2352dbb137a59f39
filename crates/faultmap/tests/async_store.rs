//! Stores that read asynchronously (`Store::start_read` returns before the
//! read ends, as the remote stores' do): many reads in flight without a
//! thread each, bounded by `Config::io_depth`; a store that drops a read
//! without answering fails it; a store that keeps a read's buffer holds
//! the read's end until it lets go; the reads of an object whose last
//! handle goes end with it (queued ones unread, answered ones not kept).

mod common;
use common::MapTrusted;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use faultmap::{Config, IoErrorKind, MapOptions, Pager, ReadBuf, ReadDone, Store, StoreError};

/// What an [`Async`] store does with each read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Answers on a thread of its own once `gather` reads are in flight
    /// (or after two seconds).
    Answer { gather: usize },
    /// Drops the callback and the buffer without answering.
    Drop,
    /// Drops the callback, keeps the buffer until released.
    Keep,
}

struct Async {
    data: Vec<u8>,
    mode: Mode,
    max_in_flight: AtomicUsize,
    started: AtomicUsize,
    /// The gate that holds answers back until enough reads are in
    /// flight, and the count of reads in flight.
    gate: Arc<(Mutex<bool>, Condvar, AtomicUsize)>,
    kept: Mutex<Vec<ReadBuf>>,
}

impl Async {
    fn new(data: Vec<u8>, mode: Mode) -> Arc<Self> {
        Arc::new(Self {
            data,
            mode,
            max_in_flight: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            gate: Arc::new((Mutex::new(false), Condvar::new(), AtomicUsize::new(0))),
            kept: Mutex::new(Vec::new()),
        })
    }

    fn release_kept(&self) {
        self.kept.lock().unwrap().clear();
    }
}

impl Store for Async {
    fn name(&self) -> &str {
        "async"
    }
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn io_pages(&self) -> u64 {
        4
    }
    fn ra_pages(&self) -> u64 {
        64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let o = offset as usize;
        buf.copy_from_slice(&self.data[o..o + buf.len()]);
        Ok(())
    }
    fn start_read(&self, offset: u64, mut buf: ReadBuf, done: ReadDone) {
        self.started.fetch_add(1, Ordering::SeqCst);
        match self.mode {
            Mode::Drop => drop((buf, done)),
            Mode::Keep => {
                drop(done);
                self.kept.lock().unwrap().push(buf);
            }
            Mode::Answer { gather } => {
                let now = self.gate.2.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_in_flight.fetch_max(now, Ordering::SeqCst);
                if now >= gather {
                    *self.gate.0.lock().unwrap() = true;
                    self.gate.1.notify_all();
                }
                let o = offset as usize;
                let bytes = self.data[o..o + buf.len()].to_vec();
                let gate = self.gate.clone();
                std::thread::spawn(move || {
                    let (lock, cv, _) = &*gate;
                    let open = lock.lock().unwrap();
                    let _open = cv
                        .wait_timeout_while(open, Duration::from_secs(2), |o| !*o)
                        .unwrap();
                    buf.as_mut_slice().copy_from_slice(&bytes);
                    gate.2.fetch_sub(1, Ordering::SeqCst);
                    done(buf, Ok(()));
                });
            }
        }
    }
}

#[test]
fn many_reads_are_in_flight_without_a_thread_each_and_within_io_depth() {
    watchdog(WATCHDOG, || {
        let data = pattern(256 * PAGE, 61);
        // 4 I/O threads, a depth of 8: the store sees more reads at once
        // than there are threads, and never more than the depth.
        let store = Async::new(data.clone(), Mode::Answer { gather: 6 });
        let pager = Pager::new(Config::default().io_threads(4).io_depth(8)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        map.prefetch(0..map.len()).unwrap();
        assert!(
            wait_until(Duration::from_secs(30), || (0..256)
                .all(|p| object.is_cached(p))),
            "the prefetch did not end"
        );
        let max = store.max_in_flight.load(Ordering::SeqCst);
        assert!(max >= 6, "at most {max} reads in flight: one per thread?");
        assert!(max <= 8, "{max} reads in flight, above io_depth 8");
        assert_bytes(&map, &data, "async store");
        assert!(object.io_errors().is_empty());
    });
}

#[test]
fn a_store_that_drops_a_read_without_answering_fails_it() {
    watchdog(WATCHDOG, || {
        let store = Async::new(pattern(16 * PAGE, 62), Mode::Drop);
        let pager = Pager::new(Config::default().io_retries(0)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        map.prefetch(page_range(&map, 3)).unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || !object.io_errors().is_empty()),
            "no report"
        );
        let report = object.io_errors()[0].clone();
        assert_eq!(report.kind, IoErrorKind::Read);
        assert!(report.message.contains("without an answer"), "{report:?}");
        assert!(!object.is_cached(3));
    });
}

#[test]
fn a_read_ends_only_when_the_store_lets_go_of_its_buffer() {
    watchdog(WATCHDOG, || {
        let store = Async::new(pattern(16 * PAGE, 63), Mode::Keep);
        let pager = Pager::new(Config::default().io_retries(0)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        map.prefetch(page_range(&map, 3)).unwrap();
        assert!(wait_until(Duration::from_secs(20), || store
            .started
            .load(Ordering::SeqCst)
            >= 1));
        // The callback is gone but the buffer is held: the read has not
        // ended, so nothing is reported yet.
        std::thread::sleep(Duration::from_millis(200));
        assert!(object.io_errors().is_empty(), "{:?}", object.io_errors());
        store.release_kept();
        assert!(
            wait_until(Duration::from_secs(20), || !object.io_errors().is_empty()),
            "the read did not end when the buffer went"
        );
        assert!(!object.is_cached(3));
    });
}

/// A store whose every call takes 30 ms, one page a request; it counts
/// its calls.
struct Slow(Vec<u8>, AtomicUsize);

impl Store for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn io_pages(&self) -> u64 {
        1
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        let o = offset as usize;
        buf.copy_from_slice(&self.0[o..o + buf.len()]);
        Ok(())
    }
}

#[test]
fn a_long_prefetch_queued_behind_itself_is_not_a_timeout() {
    watchdog(WATCHDOG, || {
        // 64 requests of 30 ms on one thread: the last waits about 2 s in
        // the queue, twice the store timeout, without any store call
        // taking longer than 30 ms (a second apart, for a loaded machine).
        let data = pattern(64 * PAGE, 64);
        let pager = Pager::new(
            Config::default()
                .io_threads(1)
                .io_timeout(Duration::from_secs(1)),
        )
        .unwrap();
        let object = pager.open(Slow(data.clone(), AtomicUsize::new(0))).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().ra_pages(64))
            .unwrap();
        map.prefetch(0..map.len()).unwrap();
        assert!(
            wait_until(Duration::from_secs(30), || (0..64)
                .all(|p| object.is_cached(p))),
            "the prefetch did not end"
        );
        assert_eq!(pager.stats().io_timeouts, 0, "{:?}", pager.io_errors());
        assert_bytes(&map, &data, "after the prefetch");
    });
}

#[test]
fn a_stopping_pager_drops_its_queued_reads_ahead_unread() {
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 65);
        let store = Arc::new(Slow(data.clone(), AtomicUsize::new(0)));
        let pager = Pager::new(Config::default().io_threads(1)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().ra_pages(64))
            .unwrap();
        // 64 one-page reads queued behind one thread; the pager stops at
        // once.
        map.prefetch(0..map.len()).unwrap();
        drop(map);
        drop(pager);
        let calls = store.1.load(Ordering::SeqCst);
        assert!(
            calls < 64,
            "the stopping pager read all {calls} pages first"
        );
        // The pages it dropped are ABSENT again, not stuck READING: another
        // pager maps the object and reads every byte.
        let pager = Pager::new(Config::default()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&map, &data, "after the drop");
        assert!(object.io_errors().is_empty(), "{:?}", object.io_errors());
    });
}

/// A store that holds every read until the test answers it (in the order
/// they came), and counts the reads it was asked for.
struct Held {
    data: Vec<u8>,
    started: AtomicUsize,
    held: Mutex<std::collections::VecDeque<(u64, ReadBuf, ReadDone)>>,
}

impl Held {
    fn new(data: Vec<u8>) -> Arc<Self> {
        Arc::new(Self {
            data,
            started: AtomicUsize::new(0),
            held: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Answers the `n` oldest reads held, with their bytes.
    fn answer(&self, n: usize) {
        for _ in 0..n {
            let Some((offset, mut buf, done)) = self.held.lock().unwrap().pop_front() else {
                return;
            };
            let o = offset as usize;
            let len = buf.as_mut_slice().len();
            buf.as_mut_slice().copy_from_slice(&self.data[o..o + len]);
            done(buf, Ok(()));
        }
    }
}

impl Store for Held {
    fn name(&self) -> &str {
        "held"
    }
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn io_pages(&self) -> u64 {
        4
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let o = offset as usize;
        buf.copy_from_slice(&self.data[o..o + buf.len()]);
        Ok(())
    }
    fn start_read(&self, offset: u64, buf: ReadBuf, done: ReadDone) {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.held.lock().unwrap().push_back((offset, buf, done));
    }
}

/// A prefetch of 64 requests, 4 of them at the store (the depth), 2 taken
/// by the I/O threads and waiting for a slot, the rest queued, and the
/// object's last mapping and handle dropped: the queued reads and the
/// threads' are ended unread at once (their pages uncharged), the reads at
/// the store are not kept when they answer (the cache holds exactly what
/// is still at the store), nothing more is asked of the store, and the
/// pager's depth then serves another object.
#[test]
fn closing_an_object_drops_its_queued_reads_and_keeps_none_in_flight() {
    const PAGES: usize = 256;
    const REQUEST: usize = 4; // pages, the store's io_pages
    const DEPTH: usize = 4;
    const THREADS: usize = 2;
    watchdog(WATCHDOG, || {
        let data = pattern(PAGES * PAGE, 66);
        let store = Held::new(data);
        let pager = Pager::new(Config::default().io_threads(THREADS).io_depth(DEPTH)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        map.prefetch(0..map.len()).unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || store.started() == DEPTH),
            "{} reads at the store, not the depth {DEPTH}",
            store.started()
        );
        assert_eq!(pager.memory().cached, (PAGES * PAGE) as u64, "all claimed");
        drop(map);
        drop(object);
        // 1. What is not at the store is ended unread (the queued reads at
        //    the close itself, the threads' when they see it): the cache
        //    holds only the reads at the store.
        let at_store = (DEPTH * REQUEST * PAGE) as u64;
        assert!(
            wait_until(Duration::from_secs(20), || pager.memory().cached
                == at_store),
            "{:?} cached, {at_store} at the store; {:?}",
            pager.memory(),
            pager.stats()
        );
        assert_eq!(
            pager.stats().io_cancelled,
            ((PAGES / REQUEST - DEPTH) * REQUEST) as u64,
            "every page not at the store is cancelled"
        );
        // 2. The reads at the store answer, one at a time: none is kept,
        //    and none frees a slot for another read of the object.
        for answered in 1..=DEPTH {
            store.answer(1);
            let left = ((DEPTH - answered) * REQUEST * PAGE) as u64;
            assert!(
                wait_until(Duration::from_secs(20), || pager.memory().cached == left),
                "{answered} answered: {:?} cached, {left} still at the store",
                pager.memory()
            );
        }
        let stats = pager.stats();
        assert_eq!(store.started(), DEPTH, "asked for more after the close");
        assert_eq!(stats.io_cancelled, PAGES as u64, "{stats:?}");
        assert_eq!(stats.io_bytes, at_store, "the answers are counted");
        assert_eq!(pager.memory().cached, 0);
        assert!(pager.io_errors().is_empty(), "{:?}", pager.io_errors());
        // 3. The depth is free: another object's prefetch is served whole.
        let data = pattern(64 * PAGE, 67);
        let other = Async::new(data.clone(), Mode::Answer { gather: 1 });
        let object = pager.open(other).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        map.prefetch(0..map.len()).unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || (0..64)
                .all(|p| object.is_cached(p))),
            "the next object's prefetch did not end"
        );
        assert_bytes(&map, &data, "the next object");
    });
}
