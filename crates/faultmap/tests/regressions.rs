//! Regressions: each test here hung or failed on an earlier version of the
//! fault path (found in review), and must keep passing.
//!
//! The scenarios need reads held in flight at chosen moments, so they use a
//! store whose reads are *scripted by call number*: call `n` may wait for
//! gate `n` and may fail. Every wait is bounded, and a fault that never
//! returns fails the test through a channel timeout or the watchdog instead
//! of hanging the suite.

mod common;
use common::MapTrusted;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use common::{pattern, watchdog, PAGE, WATCHDOG};
use faultmap::{Config, MapOptions, Mapping, MemStore, Pager, Store, StoreError};

/// How long a fault that should complete may take before the test calls it
/// hung (generous: the machine is shared).
const HUNG: Duration = Duration::from_secs(20);

/// A store whose read call `n` waits for gate `n` when `n` is in `gated`,
/// then fails when `n` is in `fail`.
struct Scripted {
    inner: MemStore,
    calls: AtomicUsize,
    gates: Vec<(Mutex<bool>, Condvar)>,
    gated: Vec<usize>,
    fail: Vec<usize>,
    entered: Mutex<usize>,
}

impl Scripted {
    fn new(data: &[u8], gated: &[usize], fail: &[usize]) -> Arc<Self> {
        Arc::new(Self {
            inner: MemStore::new("scripted", data.to_vec()),
            calls: AtomicUsize::new(0),
            gates: (0..8)
                .map(|_| (Mutex::new(false), Condvar::new()))
                .collect(),
            gated: gated.to_vec(),
            fail: fail.to_vec(),
            entered: Mutex::new(0),
        })
    }

    /// Lets read call `n` go on.
    fn open(&self, n: usize) {
        *self.gates[n].0.lock().unwrap() = true;
        self.gates[n].1.notify_all();
    }

    /// Waits until read call `n` has started.
    fn wait_entered(&self, n: usize) {
        assert!(
            common::wait_until(HUNG, || *self.entered.lock().unwrap() > n),
            "read call {n} never started"
        );
    }
}

impl Store for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        *self.entered.lock().unwrap() += 1;
        if self.gated.contains(&n) {
            let (lock, cv) = &self.gates[n];
            let open = lock.lock().unwrap();
            let _ = cv.wait_timeout_while(open, HUNG, |o| !*o).unwrap();
        }
        if self.fail.contains(&n) {
            return Err(StoreError::Read {
                name: "scripted".into(),
                offset,
                len: buf.len(),
                source: std::io::Error::other("injected"),
            });
        }
        self.inner.read_at(offset, buf)
    }
}

/// Reads byte `offset` of `map` on a new thread; the byte arrives on the
/// channel when the access returns.
fn touch_async(map: &Arc<Mapping>, offset: usize) -> mpsc::Receiver<u8> {
    let (tx, rx) = mpsc::channel();
    let map = map.clone();
    std::thread::spawn(move || {
        let _ = tx.send(common::read_byte(&map, offset));
    });
    rx
}

#[track_caller]
fn expect_byte(rx: &mpsc::Receiver<u8>, want: u8, what: &str) {
    match rx.recv_timeout(HUNG) {
        Ok(got) => assert_eq!(got, want, "{what}: wrong byte"),
        Err(_) => panic!("{what}: the access never returned (its fault hangs)"),
    }
}

/// Two pagers map one object. A fault through pager B waits for a read that
/// pager A's handler has in flight; A's reader must wake it on B's
/// userfaultfd, not its own.
#[test]
fn a_waiter_of_another_pager_is_woken() {
    watchdog(WATCHDOG, || {
        let data = pattern(32 * PAGE, 1);
        let store = Scripted::new(&data, &[0], &[]);
        let a = Pager::new(Config::default()).unwrap();
        let b = Pager::new(Config::default()).unwrap();
        let object = a.open(store.clone()).unwrap();
        let order0 = || MapOptions::new().fault_around_order(0);
        let ma = Arc::new(a.map_trusted(&object, order0()).unwrap());
        let mb = Arc::new(b.map_trusted(&object, order0()).unwrap());
        let ra = touch_async(&ma, 5 * PAGE);
        store.wait_entered(0);
        let rb = touch_async(&mb, 5 * PAGE + 1);
        assert!(common::wait_until(HUNG, || object.stats().fault_wait >= 1));
        store.open(0);
        expect_byte(&ra, data[5 * PAGE], "pager A's fault");
        expect_byte(&rb, data[5 * PAGE + 1], "pager B's waiting fault");
    });
}

/// `madvise` on part of a mapping splits its VMA. A fault-around run that
/// crosses the split makes `UFFDIO_CONTINUE` fail with ENOENT; the fault
/// must still complete and map the right bytes on both sides.
#[test]
fn a_split_mapping_still_resolves_faults() {
    watchdog(WATCHDOG, || {
        let data = pattern(64 * PAGE, 2);
        let pager = Pager::new(Config::default()).unwrap();
        let order4 = MapOptions::new().fault_around_order(4);
        let map = Arc::new(
            pager
                .map_trusted(MemStore::new("m", data.clone()), order4)
                .unwrap(),
        );
        // SAFETY: madvise(MADV_RANDOM) on one page inside our own mapping
        // changes only its VMA flags (splitting the VMA), never its content.
        let rc = unsafe {
            libc::madvise(
                map.as_ptr().add(8 * PAGE) as *mut libc::c_void,
                PAGE,
                libc::MADV_RANDOM,
            )
        };
        assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
        for page in [0, 8, 9, 15, 20] {
            let rx = touch_async(&map, page * PAGE + 3);
            expect_byte(&rx, data[page * PAGE + 3], &format!("page {page}"));
        }
        common::assert_bytes(&map[..], &data, "the whole split mapping");
    });
}

/// Two handler threads. A window read fails while a fault of another
/// mapping is parked on one of its pages: the parked fault must be woken,
/// read its page alone (the kernel's `read_folio` after a failed
/// readahead), and get the right bytes; so must the fault that read the
/// window. (An earlier version woke parked faults by the state of their
/// page, and lost one whose page failed and was claimed again before the
/// wake pass; the wait list is loom-modelled for that race.)
#[test]
fn a_waiter_survives_its_page_failing_and_being_claimed_again() {
    watchdog(WATCHDOG, || {
        let data = pattern(32 * PAGE, 3);
        // Call 0: the read-around window [0..16) of the fault on page 0,
        // held, then failed. Calls after it: the pages alone, at once.
        let store = Scripted::new(&data, &[0], &[0]);
        // No retries: the window's one failure must be its end (a retry
        // would be call 1, which succeeds).
        let pager = Pager::new(Config::default().handler_threads(2).io_retries(0)).unwrap();
        let object = pager.open(store.clone()).unwrap();
        let around = MapOptions::new()
            .ra_pages(16)
            .readahead(faultmap::ReadaheadMode::AroundOnly);
        let map = Arc::new(
            pager
                .map_trusted(&object, around.clone().fault_around_order(4))
                .unwrap(),
        );
        let other = Arc::new(
            pager
                .map_trusted(&object, around.fault_around_order(0))
                .unwrap(),
        );
        let first = touch_async(&map, 0);
        store.wait_entered(0);
        let parked = touch_async(&other, 5 * PAGE);
        assert!(common::wait_until(HUNG, || object.stats().fault_wait >= 1));
        store.open(0);
        expect_byte(&first, data[0], "the fault whose window failed");
        expect_byte(&parked, data[5 * PAGE], "the parked fault");
        let s = object.stats();
        assert!(s.io_errors >= 1 && s.io_retry_single >= 2, "{s:?}");
        common::assert_bytes(&map[..], &data, "everything, after the failure");
    });
}

/// A fault message that is stale when handled (its page was mapped by
/// another fault's window meanwhile) must not cost an ioctl per page of the
/// window: the faulting page's EEXIST ends the fault.
#[test]
fn a_stale_fault_message_costs_no_ioctl_per_page() {
    watchdog(WATCHDOG, || {
        let data = pattern(512 * PAGE, 4);
        let pager = Pager::new(Config::default()).unwrap();
        let object = pager.open(MemStore::new("m", data.clone())).unwrap();
        let order9 = || MapOptions::new().fault_around_order(9);
        let warm = pager.map_trusted(&object, order9()).unwrap();
        common::touch(&warm, 0);
        drop(warm);
        // Hold the only handler thread in a read, so that both faults below
        // queue up before either is handled.
        let blocker = Scripted::new(&data, &[0], &[]);
        let held = Arc::new(pager.map_trusted(blocker.clone(), order9()).unwrap());
        let unblock = touch_async(&held, 0);
        blocker.wait_entered(0);
        let map = Arc::new(pager.map_trusted(&object, order9()).unwrap());
        let a = touch_async(&map, 0);
        let b = touch_async(&map, PAGE);
        blocker.open(0);
        expect_byte(&unblock, data[0], "the blocked mapping");
        expect_byte(&a, data[0], "fault a");
        expect_byte(&b, data[PAGE], "fault b");
        let s = common::settle(&map, 1);
        assert!(
            s.map_calls <= 2 * s.pgfault,
            "{} UFFDIO_CONTINUE calls for {} faults: {s:?}",
            s.map_calls,
            s.pgfault
        );
    });
}

/// A store name longer than the kernel's memfd name limit (249 bytes) still
/// maps.
#[test]
fn a_long_store_name_maps() {
    let pager = Pager::new(Config::default()).unwrap();
    let name = "d/".repeat(200) + "file.bin";
    let map = pager
        .map_trusted(MemStore::new(name, vec![7u8; 100]), MapOptions::new())
        .unwrap();
    assert_eq!(&map[..], &[7u8; 100][..]);
}

/// A store that claims an absurd length is refused with a typed error, not
/// a panic or an abort.
#[test]
fn an_absurd_store_length_is_refused() {
    struct Huge;
    impl Store for Huge {
        fn name(&self) -> &str {
            "huge"
        }
        fn len(&self) -> u64 {
            u64::MAX
        }
        fn read_at(&self, _: u64, _: &mut [u8]) -> Result<(), StoreError> {
            Ok(())
        }
    }
    let pager = Pager::new(Config::default()).unwrap();
    assert!(matches!(
        pager.open(Huge),
        Err(faultmap::MapError::Cache(
            faultmap::CacheError::TooLarge { .. }
        ))
    ));
}
