//! The Protect engine (`Engine::Protect`: `PROT_NONE`, SIGSEGV, `mprotect`),
//! asked for explicitly, so that these run wherever the tests run; and
//! `Engine::Auto`'s choice of it where userfaultfd is refused
//! (`scripts/nouffd`, as in a default container). The engine-independent
//! tests (data, writes, budget, remote stores, errors) run under it too:
//! `./scripts/test-all` runs them through `scripts/nouffd`.

mod common;
use common::MapTrusted;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use faultmap::{Config, Engine, FileStore, MapOptions, Pager};
use rand::{Rng, SeedableRng};

fn protect() -> Config {
    Config::default().engine(Engine::Protect)
}

fn pager() -> Pager {
    Pager::new(protect()).expect("Pager::new")
}

/// The launcher that refuses userfaultfd (`scripts/nouffd`), built with
/// the C compiler on first use; `FAULTMAP_NOUFFD` names it where this
/// checkout cannot be reached (`scripts/protect-tests` as nobody).
fn nouffd() -> PathBuf {
    if let Some(path) = std::env::var_os("FAULTMAP_NOUFFD") {
        return PathBuf::from(path);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nouffd");
    let out = std::process::Command::new(&script)
        .arg("--path")
        .output()
        .expect("run scripts/nouffd --path");
    assert!(
        out.status.success(),
        "scripts/nouffd --path: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

#[test]
fn protect_reads_a_file_at_every_order_and_says_it_runs() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(3 * TABLE + 5 * PAGE + 77, 2801);
        let pager = pager();
        let engine = pager.engine();
        assert_eq!(engine.engine, Engine::Protect, "{engine}");
        assert!(!pager.serves_kernel_faults());
        assert!(pager.areas().is_some());
        for order in [0u8, 4, 9] {
            let map = pager
                .map_trusted(file.store(), MapOptions::new().fault_around_order(order))
                .unwrap();
            assert_bytes(&map, &file.data, &format!("order {order}"));
            let s = map.stats();
            assert!(s.pgfault > 0 && s.forwarded > 0, "{s:?}");
        }
    });
}

#[test]
fn the_environment_overrides_the_configuration_and_a_bad_name_is_an_error() {
    // In a child: the environment is the process's.
    const NAME: &str = "the_environment_overrides_the_configuration_and_a_bad_name_is_an_error";
    if is_child(NAME) {
        std::env::set_var(faultmap::ENGINE_ENV, "protect");
        let p = Pager::new(Config::default().engine(Engine::Userfaultfd)).unwrap();
        assert_eq!(p.engine().engine, Engine::Protect);
        assert!(p.engine().why.contains("FAULTMAP_ENGINE"), "{}", p.engine());
        std::env::set_var(faultmap::ENGINE_ENV, "mprotect-please");
        let err = Pager::new(Config::default()).unwrap_err().to_string();
        assert!(err.contains("FAULTMAP_ENGINE must be"), "{err}");
        assert!(err.contains("mprotect-please"), "{err}");
        println!("CHILD OK");
        return;
    }
    let end = run_child(NAME, Duration::from_secs(60));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains("CHILD OK"),
        "{end:?}"
    );
    assert_eq!("Protect".parse::<Engine>().unwrap(), Engine::Protect);
    assert_eq!(" uffd ".parse::<Engine>().unwrap(), Engine::Userfaultfd);
    assert!("".parse::<Engine>().is_err());
}

/// Where userfaultfd is refused (`scripts/nouffd`: a container's seccomp
/// profile), `Engine::Auto` runs Protect, says why, and reads the file; a
/// pager that insists on userfaultfd fails with a message that names the
/// way out.
#[test]
fn auto_falls_back_to_protect_where_userfaultfd_is_refused() {
    const NAME: &str = "auto_falls_back_to_protect_where_userfaultfd_is_refused";
    if is_child(NAME) {
        let file = TestFile::new(TABLE + 3 * PAGE + 5, 2802);
        let p = Pager::new(Config::default()).unwrap();
        assert_eq!(p.engine().engine, Engine::Protect, "{}", p.engine());
        assert!(
            p.engine().why.starts_with("auto: userfaultfd refused"),
            "{}",
            p.engine()
        );
        let map = p.map_trusted(file.store(), MapOptions::new()).unwrap();
        assert_bytes(&map, &file.data, "under nouffd");
        let err = Pager::new(Config::default().engine(Engine::Userfaultfd))
            .unwrap_err()
            .to_string();
        assert!(err.contains("In containers"), "{err}");
        println!("CHILD OK");
        return;
    }
    if std::env::var_os(faultmap::ENGINE_ENV).is_some() {
        // The environment would decide for the child: let it not.
        std::env::remove_var(faultmap::ENGINE_ENV);
    }
    let end = run_child_under(NAME, Duration::from_secs(60), Some(&nouffd()));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains("CHILD OK"),
        "{end:?}"
    );
}

/// A writable Protect mapping: the first write to a page faults (it is
/// mapped readable), is tracked dirty, reaches the file on flush; a write
/// after the write-back faults again and is written by the next flush.
#[test]
fn protect_tracks_writes_and_writes_them_back() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(2 * TABLE + 3 * PAGE + 9, 2803);
        let pager = pager();
        let store = FileStore::open_rw(&file.path).unwrap();
        let mut map = pager
            .map_mut_trusted(store, MapOptions::new().fault_around_order(4))
            .unwrap();
        let mut expected = file.data.clone();
        for round in 0..3u8 {
            for p in (0..map.len() / PAGE).step_by(7) {
                let at = p * PAGE + usize::from(round);
                map[at] = round.wrapping_add(0xA0);
                expected[at] = round.wrapping_add(0xA0);
            }
            let written = map.flush(0..map.len()).unwrap();
            assert!(written > 0, "round {round}: nothing written back");
            let mut back = vec![0u8; expected.len()];
            std::fs::File::open(&file.path)
                .unwrap()
                .read_exact_at(&mut back, 0)
                .unwrap();
            assert_bytes(&back, &expected, &format!("the file after round {round}"));
            assert_bytes(&map, &expected, &format!("the mapping after round {round}"));
        }
        let s = map.stats();
        assert!(s.write_faults >= 3 * (map.len() / PAGE / 7) as u64, "{s:?}");
    });
}

/// The kernel's own accesses: `write(2)` from a cold Protect mapping
/// fails with `EFAULT`; after `populate` it copies the object's bytes; a
/// `read(2)` into a populated writable mapping lands, and is written back.
#[test]
fn populate_lets_system_calls_use_the_mapping() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(64 * PAGE + 100, 2804);
        let pager = pager();
        let map = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
        let out_path = file.dir.path().join("out.bin");
        let mut out = std::fs::File::create(&out_path).unwrap();
        let err = out.write(&map[5 * PAGE..9 * PAGE]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
        map.populate(5 * PAGE + 1..9 * PAGE - 1).unwrap();
        out.write_all(&map[5 * PAGE..9 * PAGE]).unwrap();
        drop(out);
        assert_bytes(
            &std::fs::read(&out_path).unwrap(),
            &file.data[5 * PAGE..9 * PAGE],
            "written from the populated range",
        );
        assert!(map.populate(0..map.len() + 1).is_err());
        map.populate(3..3).unwrap();

        // A read(2) into a writable mapping.
        let source = TestFile::new(8 * PAGE, 2805);
        let rw = pager
            .map_mut_trusted(FileStore::open_rw(&file.path).unwrap(), MapOptions::new())
            .unwrap();
        let dst = rw.as_mut_ptr();
        let src = std::fs::File::open(&source.path).unwrap();
        // SAFETY: 8 pages from the mapping's start are inside it (64+
        // pages); nothing else refers to them meanwhile.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst.add(PAGE), 8 * PAGE) };
        let err = src.read_exact_at(buf, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
        rw.populate(PAGE..9 * PAGE).unwrap();
        src.read_exact_at(buf, 0).unwrap();
        rw.flush(0..rw.len()).unwrap();
        let mut back = vec![0u8; 8 * PAGE];
        std::fs::File::open(&file.path)
            .unwrap()
            .read_exact_at(&mut back, PAGE as u64)
            .unwrap();
        assert_bytes(
            &back,
            &source.data,
            "read(2) into the mapping, written back",
        );
    });
}

/// The worst case for memory areas: random 4 KiB touches, one page per
/// fault, over an object far larger than the budget. With `mprotect`
/// (writable mappings, kernels before 6.15) each cached page would be its
/// own area between inaccessible ones: the process never reaches
/// `vm.max_map_count` (an `mprotect` past it would fail), since the engine
/// protects whole regions again before. With guard markers (read-only
/// mappings on this kernel) no area is added at all. Every byte read is
/// right either way. Prints the areas counted in `/proc/self/maps`.
#[test]
fn random_touches_over_a_large_object_stay_under_the_area_limit() {
    watchdog(Duration::from_secs(300), || {
        const OBJECT: u64 = 16 << 30;
        const TOUCHES: usize = 60_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse.bin");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(OBJECT).unwrap();
        let pages = OBJECT / PAGE as u64;
        let mut rng = rand::rngs::StdRng::seed_from_u64(2806);
        let touched: Vec<u64> = (0..TOUCHES).map(|_| rng.random_range(0..pages)).collect();
        // Each touched page names itself in its first 8 bytes.
        for &p in &touched {
            file.write_all_at(&p.to_le_bytes(), p * PAGE as u64)
                .unwrap();
        }
        let limit = {
            let s = std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap();
            s.trim().parse::<usize>().unwrap()
        };
        for mprotect_only in [true, false] {
            let mut config = protect().memory_budget(512 << 20);
            config.protect_mprotect_only = mprotect_only;
            let pager = Pager::new(config).unwrap();
            let map = pager
                .map_trusted(
                    FileStore::open(&path).unwrap(),
                    MapOptions::new().fault_around_order(0).ra_pages(0),
                )
                .unwrap();
            map.advise(faultmap::Advice::Random, 0..map.len()).unwrap();
            let before = faultmap::sys::process_map_areas().unwrap();
            let resets_before = pager.areas().unwrap().resets;
            let mut peak = before;
            for (i, &p) in touched.iter().enumerate() {
                let at = p as usize * PAGE;
                let mut word = [0u8; 8];
                word.copy_from_slice(&map[at..at + 8]);
                assert_eq!(u64::from_le_bytes(word), p, "touch {i}: page {p}");
                if i % 2000 == 0 {
                    peak = peak.max(faultmap::sys::process_map_areas().unwrap());
                }
            }
            let areas = pager.areas().unwrap();
            eprintln!(
                "mprotect only {mprotect_only}: areas {before} before, peak {peak} in \
                 /proc/self/maps (limit {limit}); engine: {areas:?}; memory {:?}",
                pager.memory()
            );
            assert!(peak < limit, "{peak} areas, limit {limit}");
            if mprotect_only || !areas.guard_regions {
                assert!(
                    areas.resets > resets_before,
                    "a budget of 131072 pages of isolated touches passes the mark: {areas:?}"
                );
                assert!(
                    (areas.peak as usize) <= areas.mark as usize + 64,
                    "the estimate never passes the mark for long: {areas:?}"
                );
            } else {
                // A few for the pager's threads' stacks, none per page.
                assert!(
                    peak <= before + 64,
                    "guard markers add no areas: {peak} > {before}"
                );
                assert_eq!(areas.resets, resets_before, "{areas:?}");
            }
        }
    });
}

/// Eviction under Protect, with guard markers and with `mprotect`: a
/// budget far smaller than the object, threads reading it in random order,
/// every byte right (an evicted page is inaccessible before its hole is
/// punched, so nothing ever reads a hole as zeros).
#[test]
fn eviction_never_exposes_a_hole() {
    watchdog(Duration::from_secs(120), || {
        let file = TestFile::new(64 << 20, 2807);
        for mprotect_only in [false, true] {
            let mut config = protect().memory_budget(4 << 20);
            config.protect_mprotect_only = mprotect_only;
            let pager = Pager::new(config).unwrap();
            let map = pager
                .map_trusted(file.store(), MapOptions::new().fault_around_order(4))
                .unwrap();
            std::thread::scope(|s| {
                for t in 0..3u64 {
                    let (map, data) = (&map, &file.data);
                    s.spawn(move || {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(2807 + t);
                        for _ in 0..20_000 {
                            let at = rng.random_range(0..data.len() - 64);
                            assert_eq!(&map[at..at + 64], &data[at..at + 64], "bytes at {at}");
                        }
                    });
                }
            });
            let s = pager.stats();
            assert!(s.evicted > 0 && s.refault > 0, "{s:?}");
        }
    });
}

/// A SIGSEGV that is not faultmap's behaves as without faultmap: with no
/// handler of the application's, the process dies of it; with one
/// installed before the pager, that handler gets it, with the faulting
/// address. A write to a read-only Protect mapping is the application's
/// own fault too: SIGSEGV, not a loop.
#[test]
fn a_foreign_sigsegv_is_the_applications() {
    const NULL: &str = "a_foreign_sigsegv_is_the_applications";
    if is_child(NULL) {
        let file = TestFile::new(4 * PAGE, 2808);
        let pager = pager();
        let map = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
        assert_bytes(&map, &file.data, "before");
        match std::env::var("PROTECT_ROLE").as_deref() {
            Ok("null") => {
                println!("CHILD: touching an unmapped address");
                // SAFETY: not safe: the point is the fault.
                let v = unsafe { std::ptr::read_volatile(16usize as *const u8) };
                println!("CHILD: survived ({v})");
            }
            Ok("write") => {
                println!("CHILD: writing a read-only mapping");
                // SAFETY: not safe: the point is the fault.
                unsafe { std::ptr::write_volatile(map.as_ptr() as *mut u8, 1) };
                println!("CHILD: survived");
            }
            other => panic!("role {other:?}"),
        }
        return;
    }
    for role in ["null", "write"] {
        std::env::set_var("PROTECT_ROLE", role);
        let end = run_child(NULL, Duration::from_secs(60));
        assert!(
            end.stdout.contains("CHILD: t") || end.stdout.contains("CHILD: w"),
            "{end:?}"
        );
        assert!(!end.stdout.contains("survived"), "{role}: {end:?}");
        assert_eq!(end.signal(), Some(libc::SIGSEGV), "{role}: {end:?}");
    }
}

/// A forked child reads a mapping it inherited under the protect engine
/// (served by the parent, `sys::revoke`), and a mapping the child opens
/// itself; the parent reads on. (`tests/fork.rs` has the rest: writes,
/// budgets, kills, the parent's death.)
#[test]
fn a_forked_child_reads_an_inherited_protect_mapping() {
    watchdog(WATCHDOG, || {
        let file = TestFile::new(8 * PAGE, 2809);
        let pager = pager();
        let map = pager.map_trusted(file.store(), MapOptions::new()).unwrap();
        assert_eq!(map[0], file.data[0]);
        let at = map.as_ptr() as usize + 3 * PAGE + 5;
        let want = file.data[3 * PAGE + 5];
        // SAFETY: the child only reads one byte and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: inside the inherited mapping, served by the parent.
            let v = unsafe { std::ptr::read_volatile(at as *const u8) };
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(if v == want { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child ended with status {status:#x}"
        );
        assert_bytes(&map, &file.data, "the parent after the fork");
    });
}

/// A file of `pages` pages, each naming itself in its first 8 bytes.
fn named_pages(pages: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("named.bin");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(pages * PAGE as u64).unwrap();
    for p in 0..pages {
        f.write_all_at(&p.to_le_bytes(), p * PAGE as u64).unwrap();
    }
    (dir, path)
}

/// With `mprotect`, a region that holds the areas near the mark does not
/// hold up a fault in another region (which resetting itself would not
/// help): the fault is resolved and reads the right bytes. In a child: the
/// area estimate is the process's.
#[test]
fn a_region_near_the_mark_does_not_hold_up_another() {
    const NAME: &str = "a_region_near_the_mark_does_not_hold_up_another";
    if is_child(NAME) {
        let mut config = protect();
        config.protect_mprotect_only = true;
        let pager = Pager::new(config).unwrap();
        let mark = pager.areas().unwrap().mark;
        let n = mark / 2;
        let (_a, path_a) = named_pages(2 * n + 2);
        let (_b, path_b) = named_pages(16);
        let opts = || MapOptions::new().fault_around_order(0).ra_pages(0);
        let a = pager
            .map_trusted(FileStore::open(&path_a).unwrap(), opts())
            .unwrap();
        a.advise(faultmap::Advice::Random, 0..a.len()).unwrap();
        for i in 0..n {
            let p = 2 * i + 1;
            let at = p as usize * PAGE;
            assert_eq!(u64::from_le_bytes(a[at..at + 8].try_into().unwrap()), p);
        }
        let b = pager
            .map_trusted(FileStore::open(&path_b).unwrap(), opts())
            .unwrap();
        for p in 0..16u64 {
            let at = p as usize * PAGE;
            assert_eq!(u64::from_le_bytes(b[at..at + 8].try_into().unwrap()), p);
        }
        println!("CHILD OK {:?}", pager.areas());
        return;
    }
    let end = run_child(NAME, Duration::from_secs(120));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains("CHILD OK"),
        "{end:?}"
    );
}

/// A process at `vm.max_map_count` through its own mappings: the first
/// write to a readable page of a writable Protect mapping (which needs a
/// split) is not a fault for ever; the engine gives its region's areas
/// back and the write lands. In a child: it takes every area it can.
#[test]
fn a_write_at_the_area_limit_lands() {
    const NAME: &str = "a_write_at_the_area_limit_lands";
    if is_child(NAME) {
        let pager = pager();
        let (_d, path) = named_pages(64);
        let map = pager
            .map_mut_trusted(
                FileStore::open_rw(&path).unwrap(),
                MapOptions::new().fault_around_order(2).ra_pages(0),
            )
            .unwrap();
        // SAFETY: inside the mapping: maps pages 8..12 readable.
        let _ = unsafe { std::ptr::read_volatile(map.as_ptr().add(8 * PAGE)) };
        let mut last = 0usize;
        for held in 0usize.. {
            // SAFETY: a fresh private page, never touched; alternate
            // protections so that neighbours never merge.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    PAGE,
                    if held % 2 == 0 {
                        libc::PROT_READ
                    } else {
                        libc::PROT_NONE
                    },
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                break;
            }
            last = p as usize;
        }
        // One area free: a split needs two.
        // SAFETY: the last page mapped above, unused.
        unsafe { libc::munmap(last as *mut libc::c_void, PAGE) };
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(map.as_mut_ptr().add(9 * PAGE + 1), 7) };
        // SAFETY: as above.
        let back = unsafe { std::ptr::read_volatile(map.as_ptr().add(9 * PAGE + 1)) };
        // No allocation from here: the process has no areas left.
        let line = if back == 7 {
            "CHILD OK wrote 7\n"
        } else {
            "CHILD wrote no 7\n"
        };
        // SAFETY: writes a static string to stdout, then leaves at once
        // (the harness would allocate).
        unsafe {
            libc::write(1, line.as_ptr().cast(), line.len());
            libc::_exit(0);
        }
    }
    let end = run_child(NAME, Duration::from_secs(60));
    assert!(
        end.status.is_some_and(|s| s.success()) && end.stdout.contains("CHILD OK wrote 7"),
        "{end:?}"
    );
}
