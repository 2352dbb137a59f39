//! Where a pager's handler threads run (`Config::handler_placement`). Its
//! own test binary: it counts the process's threads by name, so no other
//! test's pager may be running.

mod common;
use common::MapTrusted;

use common::*;
use faultmap::{Config, Delivery, HandlerPlacement, MapOptions, Pager};

/// This process's threads whose name starts with `prefix`: (name, CPUs
/// it may run on, as `/proc/self/task/*/status` lists them).
fn threads(prefix: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("a task").path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        let name = name.trim().to_string();
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or("")
            .trim()
            .to_string();
        found.push((name, cpus));
    }
    found.sort();
    found
}

/// Waits (bounded) until `want` threads named `prefix*` exist (with a
/// number after `prefix`), pinned to that number's CPU if `pinned`: a new
/// thread pins itself first thing.
fn settle(prefix: &str, want: usize, pinned: bool) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for _ in 0..500 {
        seen = threads(prefix);
        seen.retain(|(name, _)| name[prefix.len()..].parse::<u32>().is_ok());
        let done = seen.len() == want
            && seen.iter().all(|(name, cpus)| {
                let cpu = name.trim_start_matches(prefix);
                !pinned || cpus == cpu
            });
        if done {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    seen
}

#[test]
fn handler_threads_are_one_per_cpu_and_pinned_and_serve_faults() {
    watchdog(WATCHDOG, || {
        let cpus = faultmap::measure::allowed_cpus().expect("sched_getaffinity");
        let file = TestFile::new(TABLE + 7, 31);

        // Handler delivery, the default placement: faultmap-cpuN on CPU N,
        // for every CPU this process may use.
        let pager = Pager::new(Config::default().delivery(Delivery::Handler)).unwrap();
        let seen = settle("faultmap-cpu", cpus.len(), true);
        let want: Vec<String> = cpus.iter().map(|c| format!("faultmap-cpu{c}")).collect();
        let mut names: Vec<String> = seen.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(names, want_sorted, "one handler per CPU: {seen:?}");
        for (name, allowed) in &seen {
            assert_eq!(
                *allowed,
                name.trim_start_matches("faultmap-cpu"),
                "{name} is pinned to its CPU"
            );
        }
        // They serve faults, from threads on every CPU.
        let object = pager.open(file.store()).unwrap();
        let map = pager
            .map_trusted(&object, MapOptions::new().fault_around_order(0))
            .unwrap();
        std::thread::scope(|s| {
            for &cpu in &cpus {
                let (map, data) = (&map, &file.data);
                s.spawn(move || {
                    faultmap::measure::pin_current_thread(&[cpu]).unwrap();
                    assert_bytes(map, data, &format!("read from CPU {cpu}"));
                });
            }
        });
        drop(map);
        drop(object);
        drop(pager);
        assert_eq!(settle("faultmap-cpu", 0, false), vec![], "all joined");

        // Floating: handler_threads threads, unpinned.
        let pager = Pager::new(
            Config::default()
                .delivery(Delivery::Handler)
                .handler_placement(HandlerPlacement::Floating)
                .handler_threads(3),
        )
        .unwrap();
        assert!(settle("faultmap-cpu", 0, false).is_empty());
        let floating = settle("faultmap-", 3, false);
        assert_eq!(floating.len(), 3, "{floating:?}");
        let object = pager.open(file.store()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&map, &file.data, "floating handlers");
        drop(map);
        drop(object);
        drop(pager);

        // Signal delivery ignores the placement: handler_threads floating
        // pager threads.
        let pager = Pager::new(Config::default().handler_threads(2)).unwrap();
        assert!(settle("faultmap-cpu", 0, false).is_empty());
        let object = pager.open(file.store()).unwrap();
        let map = pager.map_trusted(&object, MapOptions::new()).unwrap();
        assert_bytes(&map, &file.data, "signal delivery");
    });
}
