//! Writable mappings: writes reach the store through `flush` and the
//! background flusher, every mapping of an object sees them at once, a
//! failed write-back keeps its pages dirty and is reported, a write during a
//! write-back is never lost, and what `flush` returned `Ok` for survives a
//! crash of the process. Real files in temporary directories; both fault
//! deliveries.

mod common;
use common::MapTrusted;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use faultmap::{
    Config, Delivery, FileStore, MapError, MapOptions, MemStore, Pager, Store, StoreError,
    WriteBackError,
};
use rand::{Rng, SeedableRng};

/// Three PTE tables and a bit, ending inside a page.
const SIZE: usize = 3 * TABLE + 5 * PAGE + 123;

const DELIVERIES: [Delivery; 2] = [Delivery::Signal, Delivery::Handler];

fn pager(delivery: Delivery) -> Pager {
    Pager::new(Config::default().delivery(delivery)).expect("Pager::new")
}

fn rw_store(file: &TestFile) -> FileStore {
    FileStore::open_rw(&file.path).expect("open_rw")
}

/// Writes `byte` at a spread of offsets (every 3rd page, the last byte)
/// through `map` and into `expected`.
fn scribble(map: &mut faultmap::MappingMut, expected: &mut [u8], byte: u8) {
    let len = map.len();
    let mut offsets: Vec<usize> = (0..len).step_by(3 * PAGE + 17).collect();
    offsets.push(len - 1);
    for off in offsets {
        map[off] = byte;
        expected[off] = byte;
    }
}

#[test]
fn writes_reach_the_file_on_flush() {
    for delivery in DELIVERIES {
        watchdog(WATCHDOG, move || {
            let file = TestFile::new(SIZE, 700);
            let pager = pager(delivery);
            let mut map = pager
                .map_mut_trusted(rw_store(&file), MapOptions::new())
                .unwrap();
            assert!(map.is_writable());
            let mut expected = file.data.clone();
            // Read first (pages mapped write-protected), then write; and
            // write pages never read (a MINOR fault, then a WP fault).
            assert_bytes(&map[..TABLE], &expected[..TABLE], "before writing");
            scribble(&mut map, &mut expected, 0xA5);
            map[TABLE + 7..TABLE + 7 + 5000].fill(0x3C);
            expected[TABLE + 7..TABLE + 7 + 5000].fill(0x3C);
            assert_bytes(&map, &expected, "the mapping reads its writes");
            let dirty = map.object().dirty_bytes();
            assert!(dirty > 0, "{delivery:?}: pages are dirty");
            let t = Instant::now();
            let written = map.flush(0..map.len()).expect("flush");
            let took = t.elapsed();
            assert_eq!(written * PAGE as u64, dirty, "{delivery:?}");
            assert_eq!(map.object().dirty_bytes(), 0);
            let on_disk = std::fs::read(&file.path).unwrap();
            assert_bytes(&on_disk, &expected, "the file after flush");
            let s = map.stats();
            assert_eq!(s.written_back, written, "{s:?}");
            assert!(s.write_faults >= written, "{s:?}");
            println!(
                "{delivery:?}: flushed {written} pages ({} KiB) in {took:?}; {s:?}",
                written * 4
            );
            // A second round: the pages were protected again by the flush.
            scribble(&mut map, &mut expected, 0x5A);
            assert!(map.object().dirty_bytes() > 0, "written again: dirty again");
            map.object().flush().expect("Object::flush");
            assert_bytes(&std::fs::read(&file.path).unwrap(), &expected, "round 2");
        });
    }
}

#[test]
fn mappings_of_one_object_see_each_others_writes_at_once() {
    for delivery in DELIVERIES {
        watchdog(WATCHDOG, move || {
            let file = TestFile::new(SIZE, 701);
            let pager = pager(delivery);
            let object = pager.open(rw_store(&file)).unwrap();
            let mut a = pager.map_mut_trusted(&object, MapOptions::new()).unwrap();
            let mut b = pager.map_mut_trusted(&object, MapOptions::new()).unwrap();
            let ro = pager.map_trusted(&object, MapOptions::new()).unwrap();
            let part = pager
                .map_trusted(
                    &object,
                    MapOptions::new()
                        .offset(PAGE as u64 + 5)
                        .len(3 * PAGE as u64),
                )
                .unwrap();
            for (i, off) in [0usize, PAGE + 9, TABLE + 1, SIZE - 1]
                .into_iter()
                .enumerate()
            {
                let v = 0x10 + i as u8;
                a[off] = v;
                assert_eq!(b[off], v, "{delivery:?}: b sees a's write at {off}");
                assert_eq!(ro[off], v, "{delivery:?}: a read-only mapping sees it");
                b[off] = v + 0x40;
                assert_eq!(a[off], v + 0x40, "{delivery:?}: a sees b's write");
            }
            assert_eq!(
                part[PAGE + 9 - (PAGE + 5)],
                0x51,
                "an offset mapping sees it"
            );
            b.flush(0..b.len()).unwrap();
            let on_disk = std::fs::read(&file.path).unwrap();
            assert_eq!(on_disk[SIZE - 1], 0x53);
            assert_eq!(on_disk[PAGE + 9], 0x51);
        });
    }
}

#[test]
fn flush_with_nothing_dirty_is_a_no_op() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(SIZE, 702);
        let pager = pager(Delivery::Signal);
        let map = pager
            .map_mut_trusted(rw_store(&file), MapOptions::new())
            .unwrap();
        assert_bytes(&map, &file.data, "read only");
        assert_eq!(map.flush(0..map.len()).unwrap(), 0);
        assert_eq!(map.flush(0..0).unwrap(), 0);
        assert_eq!(map.object().flush().unwrap(), 0);
        let s = map.stats();
        assert_eq!((s.written_back, s.write_faults), (0, 0), "{s:?}");
        assert!(matches!(
            map.flush(5..map.len() + 1),
            Err(WriteBackError::Range { .. })
        ));
        // A read-only object has nothing to flush.
        let ro = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
        assert_eq!(ro.object().flush().unwrap(), 0);
    });
}

#[test]
fn mem_store_takes_writes() {
    for delivery in DELIVERIES {
        watchdog(WATCHDOG, move || {
            let data = pattern(SIZE, 703);
            let store = MemStore::new("mem", data.clone());
            let pager = pager(delivery);
            let mut map = pager
                .map_mut_trusted(store.clone(), MapOptions::new())
                .unwrap();
            let mut expected = data.clone();
            scribble(&mut map, &mut expected, 0x77);
            assert_bytes(&store.snapshot(), &data, "nothing written back yet");
            map.flush(0..map.len()).unwrap();
            assert_bytes(&store.snapshot(), &expected, "after flush");
        });
    }
}

/// A store that does not take writes (only `read_at`).
struct ReadOnly(MemStore);

impl Store for ReadOnly {
    fn name(&self) -> &str {
        "read-only"
    }
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read_at(offset, buf)
    }
}

#[test]
fn a_read_only_store_cannot_be_mapped_writable() {
    let file = TestFile::new(SIZE, 704);
    let pager = pager(Delivery::Signal);
    let err = pager
        .map_mut_trusted(file.store(), MapOptions::new())
        .unwrap_err();
    assert!(matches!(err, MapError::ReadOnlyStore { .. }), "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");
    let store = ReadOnly(MemStore::new("m", vec![1u8; 100]));
    assert!(!store.writable());
    assert!(matches!(
        store.write_at(0, &[1]),
        Err(StoreError::ReadOnly { .. })
    ));
    assert!(matches!(
        pager.map_mut_trusted(store, MapOptions::new()),
        Err(MapError::ReadOnlyStore { .. })
    ));
    // A read-only mapping has no mutable access at all (the compile_fail
    // examples on `faultmap::Mapping` check that it does not compile).
    let ro = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
    assert!(!ro.is_writable());
}

/// A writable file store whose writes can be made to fail, or to wait at a
/// gate.
struct Flaky {
    inner: FileStore,
    fail: AtomicBool,
    gated: AtomicBool,
    gate: WriteGate,
    writes: AtomicU64,
    log: Mutex<Vec<(u64, usize)>>,
}

impl Flaky {
    fn new(file: &TestFile) -> Arc<Self> {
        Arc::new(Self {
            inner: rw_store(file),
            fail: AtomicBool::new(false),
            gated: AtomicBool::new(false),
            gate: WriteGate::default(),
            writes: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
        })
    }
}

impl Store for Flaky {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_at(offset, buf)
    }
    fn writable(&self) -> bool {
        true
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push((offset, buf.len()));
        if self.gated.load(Ordering::SeqCst) {
            self.gate.pass();
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Write {
                name: self.name().to_string(),
                offset,
                len: buf.len(),
                source: std::io::Error::other("injected write failure"),
            });
        }
        self.inner.write_at(offset, buf)
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync()
    }
}

/// Holds store writes until opened.
#[derive(Default)]
struct WriteGate {
    open: Mutex<bool>,
    cv: std::sync::Condvar,
    entered: AtomicU64,
}

impl WriteGate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    fn wait_entered(&self, n: u64, limit: Duration) -> bool {
        wait_until(limit, || self.entered.load(Ordering::SeqCst) >= n)
    }

    fn pass(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let open = self.open.lock().unwrap();
        // Bounded: a failing test must not leave a flush blocked for ever.
        let _ = self
            .cv
            .wait_timeout_while(open, Duration::from_secs(30), |open| !*open)
            .unwrap();
    }
}

#[test]
fn a_failed_write_back_keeps_pages_dirty_and_is_reported_once() {
    for delivery in DELIVERIES {
        watchdog(WATCHDOG, move || {
            let file = TestFile::new(SIZE, 705);
            let store = Flaky::new(&file);
            let pager = pager(delivery);
            let mut map = pager
                .map_mut_trusted(store.clone(), MapOptions::new())
                .unwrap();
            let mut expected = file.data.clone();
            let off = 2 * PAGE + 100;
            map[off] = 0xEE;
            expected[off] = 0xEE;
            store.fail.store(true, Ordering::SeqCst);
            let err = map.flush(0..map.len()).unwrap_err();
            match &err {
                WriteBackError::Write { offset, name, .. } => {
                    assert_eq!(*offset, 2 * PAGE as u64, "{err}");
                    assert_eq!(name, &file.path.display().to_string());
                }
                other => panic!("{delivery:?}: {other}"),
            }
            assert!(err.to_string().contains("offset 8192"), "{err}");
            assert_eq!(map.object().dirty_bytes(), PAGE as u64, "still dirty");
            assert_eq!(map.stats().writeback_errors, 1);
            assert_eq!(std::fs::read(&file.path).unwrap(), file.data, "not written");
            // Reported once: this flush (the store still fails) reports its
            // own new failure; after recovery the next one succeeds.
            store.fail.store(false, Ordering::SeqCst);
            assert_eq!(map.flush(0..map.len()).unwrap(), 1, "{delivery:?}");
            assert_eq!(map.object().dirty_bytes(), 0);
            assert_bytes(&std::fs::read(&file.path).unwrap(), &expected, "recovered");
            assert_eq!(map.flush(0..map.len()).unwrap(), 0, "cleared");

            // A failure of a write-back nobody waited for (flush_async) is
            // reported by the next flush, once.
            map[off] = 0xEF;
            expected[off] = 0xEF;
            store.fail.store(true, Ordering::SeqCst);
            map.flush_async(0..map.len()).unwrap();
            assert!(
                wait_until(Duration::from_secs(10), || map
                    .object()
                    .stats()
                    .writeback_errors
                    >= 2),
                "the flusher ran the queued range"
            );
            store.fail.store(false, Ordering::SeqCst);
            let err = map.flush(0..PAGE).unwrap_err();
            assert!(
                matches!(err, WriteBackError::Write { offset: 8192, .. }),
                "{err}"
            );
            // That flush did not cover page 2; the next one writes it.
            assert_eq!(map.object().dirty_bytes(), PAGE as u64);
            assert_eq!(map.flush(0..map.len()).unwrap(), 1);
            assert_bytes(&std::fs::read(&file.path).unwrap(), &expected, "final");
        });
    }
}

#[test]
fn a_page_written_during_its_write_back_stays_dirty() {
    for delivery in DELIVERIES {
        watchdog(WATCHDOG, move || {
            let file = TestFile::new(SIZE, 706);
            let store = Flaky::new(&file);
            let pager = pager(delivery);
            let object = pager.open(store.clone()).unwrap();
            let mut map = pager.map_mut_trusted(&object, MapOptions::new()).unwrap();
            let writer_map = pager.map_mut_trusted(&object, MapOptions::new()).unwrap();
            let mut expected = file.data.clone();
            let off = 5 * PAGE + 1;
            map[off] = 1;
            store.gated.store(true, Ordering::SeqCst);
            let flusher = {
                let object = object.clone();
                std::thread::spawn(move || object.flush())
            };
            assert!(store.gate.wait_entered(1, Duration::from_secs(10)));
            // The write-back of page 5 is blocked in the store: the page is
            // write-protected again, so this write faults, and must leave
            // the page dirty.
            // SAFETY: a writable mapping; no slice of it is live.
            unsafe { writer_map.as_mut_ptr().add(off).write_volatile(2) };
            expected[off] = 2;
            assert_eq!(map[off], 2);
            assert_eq!(
                object.dirty_bytes(),
                PAGE as u64,
                "{delivery:?}: dirty again"
            );
            store.gated.store(false, Ordering::SeqCst);
            store.gate.open();
            flusher.join().unwrap().expect("first flush");
            assert_eq!(
                object.dirty_bytes(),
                PAGE as u64,
                "{delivery:?}: still dirty"
            );
            assert_eq!(object.flush().unwrap(), 1, "the next flush writes it");
            assert_bytes(&std::fs::read(&file.path).unwrap(), &expected, "new bytes");
            drop(map);
        });
    }
}

#[test]
fn the_background_flusher_writes_pages_after_dirty_expire() {
    for delivery in DELIVERIES {
        watchdog(WATCHDOG, move || {
            let file = TestFile::new(SIZE, 707);
            let config = Config::default()
                .delivery(delivery)
                .dirty_expire(Duration::from_millis(200));
            let pager = Pager::new(config).unwrap();
            let mut map = pager
                .map_mut_trusted(rw_store(&file), MapOptions::new())
                .unwrap();
            let mut expected = file.data.clone();
            scribble(&mut map, &mut expected, 0x42);
            // A page stops counting as dirty when its write-back starts,
            // and the pass publishes its count after the last batch, so
            // the wait is for all three.
            let written = wait_until(Duration::from_secs(20), || {
                map.object().dirty_bytes() == 0
                    && std::fs::read(&file.path).unwrap() == expected
                    && pager.stats().written_back > 0
            });
            assert!(
                written,
                "{delivery:?}: the flusher wrote the pages: {:?}",
                pager.stats()
            );
        });
    }
}

#[test]
fn dirty_pages_are_written_back_when_the_object_goes() {
    let file = TestFile::new(SIZE, 708);
    let mut expected = file.data.clone();
    {
        let pager = pager(Delivery::Signal);
        let mut map = pager
            .map_mut_trusted(rw_store(&file), MapOptions::new())
            .unwrap();
        scribble(&mut map, &mut expected, 0x99);
    }
    assert_bytes(&std::fs::read(&file.path).unwrap(), &expected, "after drop");
}

// ---------------------------------------------------------------------------
// Crash: what flush returned Ok for survives a SIGKILL.
// ---------------------------------------------------------------------------

const CRASH_PAGES: usize = 64;
const CRASH_DATA: &str = "FAULTMAP_CRASH_DATA";
const CRASH_SIDE: &str = "FAULTMAP_CRASH_SIDE";
const CRASH_DELIVERY: &str = "FAULTMAP_CRASH_DELIVERY";

/// The child: writes generation N into every word of every page, flushes,
/// then records N in the side file (pwrite + fdatasync), for ever.
fn crash_child() {
    let data = PathBuf::from(std::env::var(CRASH_DATA).unwrap());
    let side = std::fs::OpenOptions::new()
        .write(true)
        .open(std::env::var(CRASH_SIDE).unwrap())
        .unwrap();
    let delivery = match std::env::var(CRASH_DELIVERY).as_deref() {
        Ok("handler") => Delivery::Handler,
        _ => Delivery::Signal,
    };
    let pager = Pager::new(Config::default().delivery(delivery)).unwrap();
    let mut map = pager
        .map_mut_trusted(FileStore::open_rw(&data).unwrap(), MapOptions::new())
        .unwrap();
    let mut gen = u64::from_le_bytes(map[..8].try_into().unwrap());
    loop {
        gen += 1;
        for word in map.chunks_exact_mut(8) {
            word.copy_from_slice(&gen.to_le_bytes());
        }
        map.flush(0..map.len()).unwrap();
        side.write_all_at(&gen.to_le_bytes(), 0).unwrap();
        side.sync_data().unwrap();
    }
}

#[test]
fn flushed_generations_survive_sigkill() {
    if is_child("flushed_generations_survive_sigkill") {
        crash_child();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.bin");
    let side = dir.path().join("side.bin");
    std::fs::write(&data, vec![0u8; CRASH_PAGES * PAGE]).unwrap();
    std::fs::write(&side, [0u8; 8]).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(709);
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let kills = 18;
    for i in 0..kills {
        let delivery = if i % 2 == 0 { "signal" } else { "handler" };
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "flushed_generations_survive_sigkill",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "flushed_generations_survive_sigkill")
            .env(CRASH_DATA, &data)
            .env(CRASH_SIDE, &side)
            .env(CRASH_DELIVERY, delivery)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(rng.random_range(50..400));
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        assert!(
            status.code().is_none(),
            "the child ended by itself ({status}): {err}"
        );
        let reported = u64::from_le_bytes(std::fs::read(&side).unwrap()[..8].try_into().unwrap());
        let bytes = std::fs::read(&data).unwrap();
        let mut min = u64::MAX;
        let mut max = 0;
        for (w, word) in bytes.chunks_exact(8).enumerate() {
            let g = u64::from_le_bytes(word.try_into().unwrap());
            assert!(
                g >= reported && g <= reported + 1,
                "kill {i} ({delivery}, after {delay:?}): word {w} (page {}) holds generation \
                 {g}, the child had reported {reported}",
                w * 8 / PAGE
            );
            min = min.min(g);
            max = max.max(g);
        }
        println!(
            "kill {i:2} ({delivery:7}) after {delay:?}: reported {reported}, file holds {min}..={max}"
        );
        std::io::stdout().flush().unwrap();
    }
    println!(
        "{kills} kills of a child flushing {CRASH_PAGES} pages ({} KiB) in a loop, {:?} in all",
        CRASH_PAGES * 4,
        started.elapsed()
    );
}
