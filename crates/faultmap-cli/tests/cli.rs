//! The `faultmap` binary, driven as a user would: real files, real
//! processes, real userfaultfd (these tests need what faultmap needs: root
//! or access to /dev/userfaultfd).
//!
//! They assert behaviour only, never timing: CRCs against `crc32fast`, JSON
//! shapes, exact fault counts where the fault-around algorithm fixes them,
//! and clean failures (non-zero exit, a message, no panic) on bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use serde_json::Value;

fn faultmap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_faultmap"))
        .args(args)
        .output()
        .expect("the faultmap binary runs")
}

fn stdout_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "faultmap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

/// Asserts a clean failure: non-zero exit, a message containing `needle`,
/// no panic.
fn assert_fails_cleanly(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    assert!(
        stderr.to_lowercase().contains(&needle.to_lowercase()),
        "stderr does not mention {needle:?}: {stderr}"
    );
}

fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap();
    path
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    data
}

fn scan_json(path: &Path, order: u8, threads: u16) -> Value {
    let (order, threads) = (order.to_string(), threads.to_string());
    let path = path.to_str().unwrap();
    stdout_json(&faultmap(&[
        "scan",
        path,
        "--order",
        &order,
        "--threads",
        &threads,
        "--json",
    ]))
}

#[test]
fn scan_crc_equals_crc32_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [0usize, 1, 4095, 4096, 4097, (3 << 20) + 123];
    for (i, &len) in sizes.iter().enumerate() {
        let data = random_bytes(len, i as u64);
        let path = write(dir.path(), &format!("f{len}"), &data);
        let want = crc32fast::hash(&data);
        for order in [0u8, 4, 9] {
            for threads in [1u16, 2, 3] {
                let v = scan_json(&path, order, threads);
                assert_eq!(
                    v["crc32"], want,
                    "len {len} order {order} threads {threads}"
                );
                assert_eq!(v["bytes"], len as u64);
                assert_eq!(v["order"], order);
                assert_eq!(v["threads"], threads);
            }
        }
    }
}

#[test]
fn scan_json_has_the_fields_and_counts_faults() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(64 * 4096, 99);
    let path = write(dir.path(), "f", &data);
    let v = scan_json(&path, 4, 1);
    for field in ["crc32", "bytes", "seconds", "order", "threads", "stats"] {
        assert!(!v[field].is_null(), "missing {field}: {v}");
    }
    assert!(v["seconds"].is_f64());
    let stats = &v["stats"];
    // One thread reading 64 pages in order, 16-page windows: 4 faults, each
    // reading its window from the store.
    assert_eq!(stats["pgfault"], 4);
    assert_eq!(stats["pgmajfault"], 4);
    assert_eq!(stats["io_bytes"], 64 * 4096);
    assert_eq!(stats["io_errors"], 0);
}

#[test]
fn scan_human_output_shows_the_crc_in_decimal_and_hex() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(10_000, 5);
    let path = write(dir.path(), "f", &data);
    let out = faultmap(&["scan", path.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let crc = crc32fast::hash(&data);
    assert!(text.contains(&crc.to_string()), "{text}");
    assert!(text.contains(&format!("0x{crc:08x}")), "{text}");
    assert!(text.contains("pgfault"), "{text}");
}

#[test]
fn scan_refuses_what_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    assert_fails_cleanly(
        &faultmap(&["scan", missing.to_str().unwrap()]),
        "cannot open",
    );
    assert_fails_cleanly(
        &faultmap(&["scan", dir.path().to_str().unwrap()]),
        "directory",
    );
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    assert_fails_cleanly(&faultmap(&["scan", fifo.to_str().unwrap()]), "FIFO");
    let file = write(dir.path(), "f", b"data");
    let file = file.to_str().unwrap();
    assert_fails_cleanly(&faultmap(&["scan", file, "--order", "10"]), "order");
    assert_fails_cleanly(&faultmap(&["scan", file, "--threads", "0"]), "threads");
    assert_fails_cleanly(&faultmap(&["scan"]), "FILE");
}

#[test]
fn bench_refuses_bad_arguments() {
    assert_fails_cleanly(&faultmap(&["bench", "--orders", "4,10"]), "order");
    assert_fails_cleanly(&faultmap(&["bench", "--size", "0"]), "size");
    assert_fails_cleanly(&faultmap(&["bench", "--size", "12Q"]), "suffix");
    assert_fails_cleanly(&faultmap(&["bench", "--workload", "zigzag"]), "workload");
    assert_fails_cleanly(
        &faultmap(&["bench", "--file", "/nonexistent/x"]),
        "cannot open",
    );
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "empty", b"");
    assert_fails_cleanly(
        &faultmap(&["bench", "--file", empty.to_str().unwrap()]),
        "empty",
    );
}

#[test]
fn every_command_has_help() {
    for args in [&["--help"][..], &["scan", "--help"], &["bench", "--help"]] {
        let out = faultmap(args);
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("Usage"), "{text}");
    }
    let bench = String::from_utf8(faultmap(&["bench", "--help"]).stdout).unwrap();
    for option in [
        "--workload",
        "--orders",
        "--threads",
        "--size",
        "--file",
        "--repetitions",
        "--json",
    ] {
        assert!(bench.contains(option), "bench --help lacks {option}");
    }
    assert!(bench.contains("random permutation"));
}

/// The rows of one engine/variant, keyed by (workload, threads).
fn rows<'a>(doc: &'a Value, engine: &str, variant: &str) -> Vec<&'a Value> {
    doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["engine"] == engine && r["variant"] == variant)
        .collect()
}

#[test]
fn bench_json_has_a_row_per_cell_with_exact_faultmap_faults() {
    let doc = stdout_json(&faultmap(&[
        "bench",
        "--size",
        "8M",
        "--repetitions",
        "1",
        "--json",
    ]));
    let machine = &doc["machine"];
    assert_eq!(machine["pages"], 2048);
    assert_eq!(machine["repetitions"], 1);
    assert!(machine["kernel"].is_string());

    let results = doc["results"].as_array().unwrap();
    // 3 workloads x 2 thread counts x (2 kernel engines + 7 orders).
    assert_eq!(results.len(), 3 * 2 * 9);
    let fields = [
        "workload",
        "threads",
        "engine",
        "variant",
        "order",
        "pages",
        "faults",
        "major_faults",
        "io_count",
        "io_bytes",
        "seconds",
        "repetitions",
    ];
    for row in results {
        for field in fields {
            assert!(row.get(field).is_some(), "row lacks {field}: {row}");
        }
        assert_eq!(row["pages"], 2048);
        assert_eq!(row["repetitions"], 1);
        assert!(row["seconds"].as_f64().unwrap() >= 0.0);
    }
    for engine in ["kernel-file", "kernel-memfd"] {
        let rows = rows(&doc, engine, "default");
        assert_eq!(rows.len(), 6, "{engine}");
        for row in rows {
            assert!(row["order"].is_null() && row["io_count"].is_null(), "{row}");
        }
    }
    // faultmap's windows are aligned in the object: a walk of 2048 cached
    // pages takes exactly 2048 / 2^order faults per thread, for seq and rand
    // alike; sparse touches 4 pages, one per window at every order.
    for order in [0u32, 1, 3, 4, 5, 7, 9] {
        let rows = rows(&doc, "faultmap", &format!("order={order}"));
        assert_eq!(rows.len(), 6, "order {order}");
        for row in rows {
            let threads = row["threads"].as_u64().unwrap();
            let per_thread = match row["workload"].as_str().unwrap() {
                "seq" | "rand" => 2048 >> order,
                "sparse" => 4,
                other => panic!("unexpected workload {other}"),
            };
            assert_eq!(row["faults"], threads * per_thread, "{row}");
            assert_eq!(row["order"], order);
            // The cache was filled before the runs: no store I/O in a walk.
            assert_eq!(row["major_faults"], 0, "{row}");
            assert_eq!(row["io_count"], 0, "{row}");
            assert_eq!(row["io_bytes"], 0, "{row}");
        }
    }
    let seq4 = rows(&doc, "faultmap", "order=4");
    let seq4_1 = seq4
        .iter()
        .find(|r| r["workload"] == "seq" && r["threads"] == 1)
        .unwrap();
    assert_eq!(seq4_1["faults"], 128);
}

#[test]
fn bench_prints_the_table_on_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(4 << 20, 3);
    let path = write(dir.path(), "data", &data);
    let out = faultmap(&[
        "bench",
        "--file",
        path.to_str().unwrap(),
        "--repetitions",
        "1",
        "--workload",
        "seq",
        "--orders",
        "0,4",
        "--threads",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "kernel-file",
        "kernel-memfd",
        "order=0",
        "order=4",
        "minor-faults",
        "time, seconds",
        "vs kernel-file",
        "vs kernel-memfd",
        "1,024",
    ] {
        assert!(text.contains(needle), "table lacks {needle:?}:\n{text}");
    }
    assert!(path.exists(), "a --file must not be removed");
}
