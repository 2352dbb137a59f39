//! The `faultmap` binary, driven as a user would: real files, real
//! processes, real userfaultfd (these tests need what faultmap needs: root
//! or access to /dev/userfaultfd).
//!
//! They assert behaviour only, never timing: CRCs against `crc32fast`, JSON
//! shapes, exact fault counts where the fault-around algorithm fixes them,
//! and clean failures (non-zero exit, a message, no panic) on bad input.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use faultmap::measure::HugePagePool;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use serde_json::Value;

fn faultmap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_faultmap"))
        .args(args)
        .output()
        .expect("the faultmap binary runs")
}

/// Stdout of a run that must have succeeded (its stderr in the message if
/// not).
fn stdout_text(out: &Output) -> String {
    assert!(
        out.status.success(),
        "faultmap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_str(&stdout_text(out)).expect("stdout is one JSON document")
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

fn scan_json(path: &Path, order: u8, threads: u16, readahead: &str) -> Value {
    let (order, threads) = (order.to_string(), threads.to_string());
    let path = path.to_str().unwrap();
    stdout_json(&faultmap(&[
        "scan",
        path,
        "--order",
        &order,
        "--threads",
        &threads,
        "--readahead",
        readahead,
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
        for (order, readahead) in [(0u8, "full"), (4, "around"), (4, "off"), (9, "full")] {
            for threads in [1u16, 2, 3] {
                let v = scan_json(&path, order, threads, readahead);
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
fn scan_records_a_trace_replays_it_and_refuses_another_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes((3 << 20) + 123, 41);
    let path = write(dir.path(), "data", &data);
    let trace = dir.path().join("scan.trace");
    let (p, t) = (path.to_str().unwrap(), trace.to_str().unwrap());
    let want = crc32fast::hash(&data);
    // One thread reads every page in order: one run of every page, each
    // page's first touch a fault of its own.
    let rec = stdout_json(&faultmap(&["scan", p, "--record-trace", t, "--json"]));
    let pages = data.len().div_ceil(4096) as u64;
    assert_eq!(rec["crc32"], want);
    assert_eq!(rec["trace"]["pages"], pages, "{rec}");
    assert_eq!(rec["trace"]["runs"], 1, "{rec}");
    assert_eq!(rec["trace"]["file"], t);
    let size = std::fs::metadata(&trace).unwrap().len();
    assert_eq!(rec["trace"]["bytes"], size);
    assert_eq!(rec["stats"]["trace_recorded"], pages, "{rec}");
    assert_eq!(rec["stats"]["pgfault"], pages, "one page per fault");
    // Replayed: the same bytes (how far the replay got before the scan
    // ended is the library tests' business).
    let rep = stdout_json(&faultmap(&["scan", p, "--replay-trace", t, "--json"]));
    assert_eq!(rep["crc32"], want);
    assert!(rep["stats"]["trace_replayed"].is_u64(), "{rep}");
    assert!(rep["trace"].is_null(), "nothing recorded: {rep}");
    // Another file (another length), or a file that is not a trace.
    let other = write(dir.path(), "other", &data[..data.len() - 1]);
    let out = faultmap(&["scan", other.to_str().unwrap(), "--replay-trace", t]);
    assert_fails_cleanly(&out, "recorded on");
    assert_fails_cleanly(
        &faultmap(&["scan", p, "--replay-trace", p]),
        "not a usable faultmap trace",
    );
    assert_fails_cleanly(
        &faultmap(&["scan", p, "--replay-trace", dir.path().to_str().unwrap()]),
        "not a regular file",
    );
}

#[test]
fn scan_json_has_the_fields_and_counts_faults() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(64 * 4096, 99);
    let path = write(dir.path(), "f", &data);
    let v = scan_json(&path, 4, 1, "off");
    for field in [
        "crc32",
        "bytes",
        "seconds",
        "order",
        "readahead",
        "threads",
        "stats",
    ] {
        assert!(!v[field].is_null(), "missing {field}: {v}");
    }
    assert!(v["seconds"].is_f64());
    assert_eq!(v["readahead"], "off");
    let stats = &v["stats"];
    // One thread reading 64 pages in order, readahead off: every page is a
    // miss that reads that page alone, and fault-around has no cached
    // neighbour to map.
    assert_eq!(stats["pgfault"], 64);
    assert_eq!(stats["pgmajfault"], 64);
    assert_eq!(stats["io_count"], 64);
    assert_eq!(stats["io_bytes"], 64 * 4096);
    assert_eq!(stats["io_errors"], 0);
    // With readahead, whatever the windows: at most one fault per page, at
    // least one per 16-page fault-around window, every page read once.
    let v = scan_json(&path, 4, 1, "full");
    let stats = &v["stats"];
    let faults = stats["pgfault"].as_u64().unwrap();
    assert!((4..=64).contains(&faults), "{stats}");
    assert!(stats["pgmajfault"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(stats["io_bytes"], 64 * 4096, "{stats}");
}

#[test]
fn scan_human_output_shows_the_crc_in_decimal_and_hex() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(10_000, 5);
    let path = write(dir.path(), "f", &data);
    let out = faultmap(&["scan", path.to_str().unwrap()]);
    let text = stdout_text(&out);
    let crc = crc32fast::hash(&data);
    assert!(text.contains(&crc.to_string()), "{text}");
    assert!(text.contains(&format!("0x{crc:08x}")), "{text}");
    assert!(text.contains("pgfault"), "{text}");
    assert!(text.contains("fault-around order 4"), "the default: {text}");
    // Adaptive fault-around is asked for and named.
    let path = path.to_str().unwrap();
    let v = stdout_json(&faultmap(&["scan", path, "--order", "auto", "--json"]));
    assert_eq!(v["order"], "auto", "{v}");
    assert_eq!(v["crc32"], crc, "{v}");
    assert!(
        v["stats"]["fault_around_auto"].as_u64().unwrap() >= 1,
        "{v}"
    );
    let v = stdout_json(&faultmap(&["stats", path, "--order", "auto", "--json"]));
    assert_eq!(v["order"], "auto", "{v}");
    let v = stdout_json(&faultmap(&["scan", path, "--json"]));
    assert_eq!(
        (&v["order"], &v["stats"]["fault_around_auto"]),
        (&4.into(), &0.into())
    );
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
    // Files whose size is not their content: never 0 bytes and CRC 0.
    assert_fails_cleanly(&faultmap(&["scan", "/proc/cpuinfo"]), "procfs");
    assert_fails_cleanly(&faultmap(&["scan", "/proc/self/status"]), "procfs");
    assert_fails_cleanly(
        &faultmap(&["scan", "/sys/kernel/mm/transparent_hugepage/enabled"]),
        "reports 4096 bytes",
    );
    assert_fails_cleanly(&faultmap(&["scan", "/dev/null"]), "device");
    assert_fails_cleanly(&faultmap(&["scan", "/dev/zero"]), "device");
    let file = write(dir.path(), "f", b"data");
    let file = file.to_str().unwrap();
    assert_fails_cleanly(&faultmap(&["scan", file, "--order", "10"]), "order");
    assert_fails_cleanly(&faultmap(&["scan", file, "--threads", "0"]), "threads");
    assert_fails_cleanly(&faultmap(&["scan"]), "FILE");
}

#[test]
fn scan_without_permission_says_so() {
    // As root every file is readable: the scan runs as `nobody`, on a file
    // that only its owner may read.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = write(dir.path(), "secret", b"data");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A copy of the binary that `nobody` may run (the build folder may sit
    // in a folder only root can enter).
    let exe = dir.path().join("faultmap");
    std::fs::copy(env!("CARGO_BIN_EXE_faultmap"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&exe)
        .args(["scan", file.to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_fails_cleanly(&out, "cannot open");
    assert_fails_cleanly(&out, "Permission denied");
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
    for args in [
        &["--help"][..],
        &["scan", "--help"],
        &["stats", "--help"],
        &["bench", "--help"],
    ] {
        let out = faultmap(args);
        let text = stdout_text(&out);
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
    for needle in [
        "--cold",
        "--ra-pages",
        "--file-io",
        "--io-threads",
        "clustered",
        "O_DIRECT",
        "--delivery",
        "--parts",
        "--churn",
        "--duration",
        "global-mutex",
        "speculative",
        "uffd-probe",
        "cross-cpu",
    ] {
        assert!(bench.contains(needle), "bench --help lacks {needle}");
    }
    let stats = String::from_utf8(faultmap(&["stats", "--help"]).stdout).unwrap();
    for needle in [
        "--access",
        "--order",
        "--ra-pages",
        "--readahead",
        "--file-io",
        "--cold",
        "--threads",
        "--json",
        "clusters",
        "Read-around only",
    ] {
        assert!(stats.contains(needle), "stats --help lacks {needle}");
    }
}

/// The uffd-probe's variants the run measured: `cpu=cross` only when it
/// was not skipped (one CPU), and then the machine says why.
fn probe_placements(machine: &Value) -> Vec<&'static str> {
    match machine["uffd_probe_skipped"].as_str() {
        None => vec!["cpu=same", "cpu=cross"],
        Some(why) => {
            assert!(why.contains("cross-cpu"), "{why}");
            vec!["cpu=same"]
        }
    }
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
        "--full",
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

    assert_eq!(
        machine["deliveries"],
        serde_json::json!(["signal", "handler"])
    );

    let results = doc["results"].as_array().unwrap();
    // 3 workloads x 2 thread counts x (2 kernel engines + the uffd-probe's
    // placements + 8 orders (7 fixed and auto) x 2 delivery modes).
    let placements = probe_placements(machine);
    assert_eq!(results.len(), 3 * 2 * (2 + placements.len() + 8 * 2));
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
            assert!(row["delivery"].is_null(), "{row}");
        }
    }
    // faultmap's windows are aligned in the object: a walk of 2048 cached
    // pages takes exactly 2048 / 2^order faults per thread, for seq and rand
    // alike, in either delivery mode; sparse touches 4 pages, one per window
    // at every order.
    let variants = [0u32, 1, 3, 4, 5, 7, 9].into_iter().flat_map(|order| {
        [
            (order, format!("order={order}"), "signal"),
            (order, format!("order={order},delivery=handler"), "handler"),
        ]
    });
    for (order, variant, delivery) in variants {
        let rows = rows(&doc, "faultmap", &variant);
        assert_eq!(rows.len(), 6, "{variant}");
        for row in rows {
            assert_eq!(row["delivery"], delivery, "{row}");
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
    // The uffd-probe takes one round trip per page it touches, at least
    // (the count is the whole process's getrusage).
    for variant in placements {
        let rows = rows(&doc, "uffd-probe", variant);
        assert_eq!(rows.len(), 6, "{variant}");
        for row in rows {
            assert!(row["order"].is_null() && row["delivery"].is_null(), "{row}");
            let threads = row["threads"].as_u64().unwrap();
            let per_thread = if row["workload"] == "sparse" { 4 } else { 2048 };
            assert!(
                row["faults"].as_u64().unwrap() >= threads * per_thread,
                "{row}"
            );
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
    let text = stdout_text(&out);
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
        "headline",
    ] {
        assert!(text.contains(needle), "table lacks {needle:?}:\n{text}");
    }
    assert!(path.exists(), "a --file must not be removed");
}

#[test]
fn plain_bench_measures_the_subset_and_full_the_whole_table() {
    let doc = stdout_json(&faultmap(&[
        "bench",
        "--size",
        "4M",
        "--repetitions",
        "1",
        "--json",
    ]));
    assert_eq!(doc["machine"]["full"], false);
    let results = doc["results"].as_array().unwrap();
    // 3 workloads x 2 thread counts x (2 kernel engines + the uffd-probe's
    // placements + 4 orders (0, 4, 9, auto) x 2 delivery modes).
    let placements = probe_placements(&doc["machine"]).len();
    assert_eq!(results.len(), 3 * 2 * (2 + placements + 4 * 2));
    let mut orders: Vec<u64> = results.iter().filter_map(|r| r["order"].as_u64()).collect();
    orders.sort_unstable();
    orders.dedup();
    assert_eq!(orders, [0, 4, 9]);
    let auto = results
        .iter()
        .filter(|r| {
            r["variant"]
                .as_str()
                .is_some_and(|v| v.starts_with("order=auto"))
        })
        .count();
    assert_eq!(auto, 3 * 2 * 2, "an order=auto column per delivery mode");
    let help = String::from_utf8(faultmap(&["bench", "--help"]).stdout).unwrap();
    let summary = &help[..help.find("Usage").unwrap()];
    for mode in [
        "--full", "--cold", "--parts", "--churn", "--budget", "--plot",
    ] {
        assert!(
            summary.contains(mode),
            "the summary lacks {mode}: {summary}"
        );
    }
    let text = stdout_text(&faultmap(&[
        "bench",
        "--size",
        "4M",
        "--repetitions",
        "1",
        "--workload",
        "seq",
        "--threads",
        "1",
    ]));
    for needle in [
        "headline",
        "× kernel-file",
        "× kernel-memfd",
        "order=9",
        "uffd-probe",
        "same-cpu",
        "handler/signal",
        "handler/probe-same",
        "order=auto",
        "adaptive fault-around",
        "auto ÷ best",
    ] {
        assert!(text.contains(needle), "report lacks {needle:?}:\n{text}");
    }
    assert_fails_cleanly(&faultmap(&["bench", "--full", "--cold"]), "--full");
}

/// The text of every `<text>` element of an SVG document, which must parse
/// as XML with an `svg` root.
fn svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).expect("the plot was written");
    let doc = roxmltree::Document::parse(&svg).expect("the plot is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

#[test]
fn bench_plot_draws_every_series() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("warm.svg");
    stdout_text(&faultmap(&[
        "bench",
        "--size",
        "4M",
        "--repetitions",
        "1",
        "--orders",
        "0,4",
        "--threads",
        "1",
        "--plot",
        plot.to_str().unwrap(),
    ]));
    let texts = svg_texts(&plot);
    for label in [
        "faultmap signal, 1 thread",
        "faultmap handler, 1 thread",
        "kernel-file, 1 thread",
        "kernel-memfd, 1 thread",
        "seq: time, seconds",
        "sparse: minor faults",
        "fault-around order",
    ] {
        assert!(
            texts.iter().any(|t| t == label),
            "no {label:?} in {texts:?}"
        );
    }
    let plot = dir.path().join("parts.svg");
    stdout_text(&faultmap(&[
        "bench",
        "--parts",
        "--size",
        "1M",
        "--repetitions",
        "1",
        "--plot",
        plot.to_str().unwrap(),
    ]));
    let texts = svg_texts(&plot);
    for label in ["kernel-memfd", "lock-free, signal", "global-mutex, signal"] {
        assert!(
            texts.iter().any(|t| t == label),
            "no {label:?} in {texts:?}"
        );
    }
    // A missing directory fails at once, before any measurement.
    assert_fails_cleanly(
        &faultmap(&["bench", "--plot", "/nonexistent/dir/x.svg"]),
        "does not exist",
    );
}

// ---------------------------------------------------------------------------
// faultmap stats
// ---------------------------------------------------------------------------

/// The six rows of the readahead table, in order.
const RA_ROWS: [&str; 6] = ["initial", "subsequent", "marker", "around", "random", "all"];

/// The columns of each row.
const RA_COLUMNS: [&str; 7] = [
    "ra_count",
    "io_count",
    "sync_count",
    "eof_count",
    "ra_size",
    "async_size",
    "io_size",
];

/// Checks a `readahead_stats` object: six rows with every column, `all`
/// the sum of the others' counts, a miss ratio that is null or a ratio.
fn check_ra_stats(ra: &Value) {
    for row in RA_ROWS {
        for column in RA_COLUMNS {
            assert!(ra[row][column].is_number(), "{row}.{column}: {ra}");
        }
    }
    for column in ["ra_count", "io_count", "sync_count", "eof_count"] {
        let parts: u64 = RA_ROWS[..5]
            .iter()
            .map(|r| ra[*r][column].as_u64().unwrap())
            .sum();
        assert_eq!(ra["all"][column], parts, "all.{column}: {ra}");
    }
    let miss = &ra["miss_ratio"];
    assert!(
        miss.is_null() || (0.0..=1.0).contains(&miss.as_f64().unwrap()),
        "{ra}"
    );
    assert!(ra["read_ahead_used"].as_u64() <= ra["read_ahead_pages"].as_u64());
}

#[test]
fn stats_prints_the_readahead_table_and_the_counters() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "f", &random_bytes(256 * 4096, 11));
    for access in ["seq", "rand", "clustered"] {
        let out = faultmap(&["stats", path.to_str().unwrap(), "--access", access]);
        let text = stdout_text(&out);
        let header = text
            .lines()
            .find(|l| l.starts_with("pattern"))
            .unwrap_or_else(|| panic!("no table header:\n{text}"));
        for column in RA_COLUMNS {
            assert!(header.contains(column), "{header}");
        }
        for row in RA_ROWS {
            assert!(
                text.lines().any(|l| l.starts_with(row)),
                "no {row} row:\n{text}"
            );
        }
        for counter in [
            "pgmajfault",
            "fault_wait",
            "io_count",
            "io_bytes",
            "readahead miss ratio",
            "pgfault",
        ] {
            assert!(text.contains(counter), "no {counter}:\n{text}");
        }
    }
}

#[test]
fn stats_json_has_the_fields_and_reads_every_page_once() {
    let dir = tempfile::tempdir().unwrap();
    let pages = 300u64;
    let path = write(dir.path(), "f", &random_bytes(pages as usize * 4096, 12));
    let path = path.to_str().unwrap();
    for (access, readahead, threads, file_io) in [
        ("seq", "full", "1", "buffered"),
        ("seq", "around", "2", "direct"),
        ("rand", "full", "1", "uring"),
        ("rand", "off", "1", "buffered"),
        ("clustered", "full", "2", "direct"),
    ] {
        let v = stdout_json(&faultmap(&[
            "stats",
            path,
            "--access",
            access,
            "--readahead",
            readahead,
            "--threads",
            threads,
            "--order",
            "3",
            "--ra-pages",
            "64",
            "--file-io",
            file_io,
            "--cold",
            "--json",
        ]));
        let what = format!("{access} {readahead} x{threads} {file_io}: {v}");
        for field in [
            "file",
            "access",
            "order",
            "ra_pages",
            "readahead",
            "seconds",
            "stats",
            "readahead_stats",
        ] {
            assert!(!v[field].is_null(), "missing {field}: {what}");
        }
        assert_eq!(v["access"], access, "{what}");
        assert_eq!(v["readahead"], readahead, "{what}");
        assert_eq!(v["order"], 3, "{what}");
        assert_eq!(v["ra_pages"], 64, "{what}");
        assert_eq!(v["pages"], pages, "{what}");
        assert_eq!(v["pages_touched"], pages, "{what}");
        // The mode asked for, or buffered where O_DIRECT cannot be had.
        assert!(
            v["file_io"] == file_io || v["file_io"] == "buffered",
            "{what}"
        );
        assert!(v["seconds"].as_f64().unwrap() >= 0.0);
        // A new object: every page touched was read, and none twice.
        let stats = &v["stats"];
        assert_eq!(stats["io_bytes"], pages * 4096, "{what}");
        assert_eq!(stats["io_errors"], 0, "{what}");
        assert!(stats["pgmajfault"].as_u64().unwrap() >= 1, "{what}");
        check_ra_stats(&v["readahead_stats"]);
    }
}

#[test]
fn stats_refuses_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "f", b"data");
    let file = file.to_str().unwrap();
    assert_fails_cleanly(
        &faultmap(&["stats", file, "--readahead", "bogus"]),
        "possible values: full, around, off",
    );
    assert_fails_cleanly(
        &faultmap(&["stats", file, "--ra-pages", "100000"]),
        "ra_pages",
    );
    assert_fails_cleanly(
        &faultmap(&["stats", file, "--ra-pages", "99999999999999999999999"]),
        "--ra-pages",
    );
    assert_fails_cleanly(&faultmap(&["stats", file, "--access", "zigzag"]), "access");
    assert_fails_cleanly(&faultmap(&["stats", file, "--file-io", "mmap"]), "file-io");
    assert_fails_cleanly(&faultmap(&["stats", file, "--order", "10"]), "order");
    assert_fails_cleanly(&faultmap(&["stats", file, "--threads", "0"]), "threads");
    assert_fails_cleanly(
        &faultmap(&["stats", file, "--io-threads", "0"]),
        "io-threads",
    );
    assert_fails_cleanly(
        &faultmap(&["stats", dir.path().to_str().unwrap()]),
        "directory",
    );
    assert_fails_cleanly(&faultmap(&["stats"]), "FILE");
}

// ---------------------------------------------------------------------------
// faultmap bench --cold
// ---------------------------------------------------------------------------

#[test]
fn bench_cold_refuses_bad_arguments() {
    assert_fails_cleanly(&faultmap(&["bench", "--ra-pages", "8"]), "--cold");
    assert_fails_cleanly(&faultmap(&["bench", "--file-io", "direct"]), "--cold");
    assert_fails_cleanly(
        &faultmap(&["bench", "--cold", "--ra-pages", "100000"]),
        "ra_pages",
    );
    assert_fails_cleanly(
        &faultmap(&["bench", "--cold", "--orders", "3,4"]),
        "one fault-around order",
    );
    assert_fails_cleanly(
        &faultmap(&["bench", "--cold", "--workload", "sparse"]),
        "not a cold workload",
    );
    assert_fails_cleanly(&faultmap(&["bench", "--workload", "clustered"]), "--cold");
}

#[test]
fn bench_cold_json_has_a_row_per_engine_and_workload() {
    let out = faultmap(&[
        "bench",
        "--cold",
        "--size",
        "16M",
        "--repetitions",
        "1",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = stdout_json(&out);
    let pages = 4096u64;
    let machine = &doc["machine"];
    assert_eq!(machine["cold"], true);
    assert_eq!(machine["pages"], pages);
    assert_eq!(machine["repetitions"], 1);
    assert_eq!(machine["sample_pages"], 256);
    assert!(machine["goals"].is_array());

    let results = doc["results"].as_array().unwrap();
    let find = |w: &str, t: u64, engine: &str, variant: &str| -> Vec<&Value> {
        results
            .iter()
            .filter(|r| {
                r["workload"] == w
                    && r["threads"] == t
                    && r["engine"] == engine
                    && r["variant"] == variant
            })
            .collect()
    };
    // Without the permission to drop the page cache, no kernel rows (and
    // a note says so); likewise the device rows need O_DIRECT.
    let kernel = machine["caches_dropped"].is_string();
    assert_eq!(
        kernel,
        !stderr.contains("skipping the kernel column"),
        "{stderr}"
    );
    let device = !stderr.contains("no device column");
    for row in results {
        for field in [
            "workload",
            "threads",
            "engine",
            "variant",
            "order",
            "pages",
            "pages_touched",
            "faults",
            "major_faults",
            "io_count",
            "io_bytes",
            "io_size_kib",
            "miss_ratio",
            "seconds",
            "repetitions",
        ] {
            assert!(row.get(field).is_some(), "row lacks {field}: {row}");
        }
        assert_eq!(row["pages"], pages);
        assert_eq!(row["repetitions"], 1);
        assert!(row["seconds"].as_f64().unwrap() >= 0.0, "{row}");
    }
    for (w, threads, touched) in [
        ("seq", 1, pages),
        ("seq", 2, pages),
        ("rand", 1, 256),
        ("clustered", 1, 256),
    ] {
        if threads == 1 {
            let rows = find(w, 1, "device", "cold");
            assert_eq!(rows.len(), usize::from(device), "device {w}");
            for row in rows {
                assert_eq!(row["io_bytes"], pages * 4096, "{row}");
                assert_eq!(row["io_count"], 16, "{row}");
                assert!(row["major_faults"].is_null() && row["miss_ratio"].is_null());
            }
        }
        let rows = find(w, threads, "kernel-file", "cold");
        assert_eq!(rows.len(), usize::from(kernel), "kernel {w} x{threads}");
        for row in rows {
            assert!(row["faults"].as_u64().unwrap() > 0, "{row}");
            assert!(
                row["order"].is_null() && row["miss_ratio"].is_null(),
                "{row}"
            );
            assert_eq!(row["pages_touched"], touched, "{row}");
        }
        for variant in ["readahead=around", "readahead=full"] {
            let rows = find(w, threads, "faultmap", variant);
            assert_eq!(rows.len(), 1, "{variant} {w} x{threads}");
            let row = rows[0];
            assert_eq!(row["order"], 4, "{row}");
            assert_eq!(row["pages_touched"], touched, "{row}");
            // A new object per run: every page touched is read, none twice.
            let io_bytes = row["io_bytes"].as_u64().unwrap();
            assert!(
                io_bytes >= touched * 4096 && io_bytes <= pages * 4096,
                "{row}"
            );
            if w == "seq" {
                assert_eq!(io_bytes, pages * 4096, "{row}");
            }
            assert!(row["io_count"].as_u64().unwrap() > 0, "{row}");
            assert!(row["io_size_kib"].as_f64().unwrap() >= 4.0, "{row}");
            let major = row["major_faults"].as_u64().unwrap();
            assert!(
                major > 0 && major <= row["faults"].as_u64().unwrap(),
                "{row}"
            );
            check_ra_stats(&row["readahead_stats"]);
            assert_eq!(row["stats"]["io_errors"], 0, "{row}");
        }
    }
}

#[test]
fn bench_cold_prints_the_table_and_the_readahead_tables() {
    let out = faultmap(&[
        "bench",
        "--cold",
        "--size",
        "4M",
        "--repetitions",
        "1",
        "--workload",
        "seq,clustered",
        "--threads",
        "1",
    ]);
    let text = stdout_text(&out);
    for needle in [
        "seq:",
        "clustered:",
        "device",
        "around",
        "readahead",
        "seconds",
        "MB/s",
        "major faults",
        "I/O count",
        "I/O size, KiB",
        "miss ratio",
        "vs device, time",
        "major faults / around",
        "goals",
        "seq, 1 thread, readahead=full:",
        "clustered, 1 thread, readahead=around:",
        "readahead miss ratio",
    ] {
        assert!(text.contains(needle), "report lacks {needle:?}:\n{text}");
    }
    assert!(!text.contains("rand:"), "{text}");
}

// ---------------------------------------------------------------------------
// faultmap bench --delivery, --parts, --churn
// ---------------------------------------------------------------------------

#[test]
fn bench_concurrency_options_refuse_bad_combinations() {
    let conflict = "cannot be used with";
    assert_fails_cleanly(&faultmap(&["bench", "--parts", "--cold"]), conflict);
    assert_fails_cleanly(&faultmap(&["bench", "--parts", "--churn"]), conflict);
    assert_fails_cleanly(&faultmap(&["bench", "--churn", "--cold"]), conflict);
    assert_fails_cleanly(&faultmap(&["bench", "--parts", "--orders", "4"]), conflict);
    assert_fails_cleanly(
        &faultmap(&["bench", "--churn", "--workload", "seq"]),
        conflict,
    );
    assert_fails_cleanly(
        &faultmap(&["bench", "--cold", "--delivery", "handler"]),
        conflict,
    );
    assert_fails_cleanly(&faultmap(&["bench", "--duration", "1"]), "--churn");
    assert_fails_cleanly(
        &faultmap(&["bench", "--churn", "--duration", "0"]),
        "duration",
    );
    assert_fails_cleanly(
        &faultmap(&["bench", "--churn", "--duration", "x"]),
        "seconds",
    );
    assert_fails_cleanly(&faultmap(&["bench", "--delivery", "carrier"]), "delivery");
}

#[test]
fn bench_delivery_gives_columns_per_mode_with_exact_faults() {
    let out = faultmap(&[
        "bench",
        "--size",
        "4M",
        "--repetitions",
        "1",
        "--workload",
        "seq,rand",
        "--orders",
        "0,4",
        "--threads",
        "1",
        "--delivery",
        "handler,signal,handler",
        "--json",
    ]);
    let doc = stdout_json(&out);
    // In the order asked, without repeats.
    assert_eq!(
        doc["machine"]["deliveries"],
        serde_json::json!(["handler", "signal"])
    );
    let results = doc["results"].as_array().unwrap();
    // 2 workloads x 1 thread count x (2 kernel engines + the uffd-probe's
    // placements + 2 orders x 2 modes).
    let placements = probe_placements(&doc["machine"]);
    assert_eq!(results.len(), 2 * (2 + placements.len() + 2 * 2));
    for order in [0u64, 4] {
        for (variant, delivery) in [
            (format!("order={order}"), "signal"),
            (format!("order={order},delivery=handler"), "handler"),
        ] {
            let rows = rows(&doc, "faultmap", &variant);
            assert_eq!(rows.len(), 2, "{variant}");
            for row in rows {
                assert_eq!(row["delivery"], delivery, "{row}");
                assert_eq!(row["order"], order, "{row}");
                assert_eq!(row["faults"], 1024 >> order, "{row}");
                assert_eq!(row["io_count"], 0, "{row}");
            }
        }
    }
    // The table has a second heading line with the uffd-probe's placements
    // and the modes.
    let second: Vec<&str> = ["same-cpu", "cross-cpu"][..placements.len()]
        .iter()
        .chain(&["signal", "handler"])
        .copied()
        .collect();
    let text = stdout_text(&faultmap(&[
        "bench",
        "--size",
        "1M",
        "--repetitions",
        "1",
        "--workload",
        "seq",
        "--orders",
        "4",
        "--threads",
        "1",
    ]));
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().eq(second.iter().copied())),
        "no heading line {second:?}:\n{text}"
    );
}

/// The rows of a parts or churn document, with their variant.
fn variant_rows<'a>(doc: &'a Value, threads: u64, variant: &str) -> Vec<&'a Value> {
    doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["threads"] == threads && r["variant"] == variant)
        .collect()
}

/// Checks the speculative-lookup counters of a faultmap row: every fault
/// was counted by exactly one of them.
fn spf_sum(row: &Value) -> u64 {
    ["spf_success", "spf_abort", "spf_fallback"]
        .iter()
        .map(|f| row[*f].as_u64().unwrap_or_else(|| panic!("{f}: {row}")))
        .sum()
}

#[test]
fn bench_parts_json_has_exact_faults_per_column_and_thread_count() {
    let doc = stdout_json(&faultmap(&[
        "bench",
        "--parts",
        "--size",
        "4M",
        "--repetitions",
        "2",
        "--threads",
        "1,2,3",
        "--delivery",
        "signal,handler",
        "--json",
    ]));
    let pages = 1024u64;
    let machine = &doc["machine"];
    assert_eq!(machine["benchmark"], "parts");
    assert_eq!(machine["pages"], pages);
    assert_eq!(machine["order"], 0);
    assert_eq!(machine["repetitions"], 2);
    assert!(machine["duration_seconds"].is_null());
    // One scaling goal (2 threads over 1) per delivery mode.
    let goals = machine["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 2, "{goals:?}");
    for g in goals {
        assert_eq!(g["threads"], 2);
        assert_eq!(g["at_least"], 1.7);
        assert!(g["value"].is_number() && g["met"].is_boolean(), "{g}");
    }
    let results = doc["results"].as_array().unwrap();
    // 3 thread counts x (kernel-memfd + 2 caches x 2 modes).
    assert_eq!(results.len(), 3 * 5);
    for row in results {
        assert_eq!(row["workload"], "parts", "{row}");
        assert_eq!(row["pages"], pages, "{row}");
        assert_eq!(row["repetitions"], 2, "{row}");
        // Every thread touches one byte per page of its part: every page once.
        assert_eq!(row["pages_touched"], pages, "{row}");
        assert!(row["seconds"].as_f64().unwrap() >= 0.0, "{row}");
        assert!(row["faults_per_second"].as_f64().unwrap() >= 0.0, "{row}");
        assert!(
            row["maps"].is_null() && row["maps_per_second"].is_null(),
            "{row}"
        );
    }
    for threads in [1u64, 2, 3] {
        let kernel = variant_rows(&doc, threads, "default");
        assert_eq!(kernel.len(), 1);
        let k = kernel[0];
        assert_eq!(k["engine"], "kernel-memfd");
        assert!(k["faults"].as_u64().unwrap() > 0, "{k}");
        for field in [
            "order",
            "delivery",
            "cache",
            "io_count",
            "spf_success",
            "stats",
        ] {
            assert!(k[field].is_null(), "{field}: {k}");
        }
        for (variant, cache, delivery) in [
            ("cache=lock-free", "lock-free", "signal"),
            ("cache=global-mutex", "global-mutex", "signal"),
            ("cache=lock-free,delivery=handler", "lock-free", "handler"),
            (
                "cache=global-mutex,delivery=handler",
                "global-mutex",
                "handler",
            ),
        ] {
            let rows = variant_rows(&doc, threads, variant);
            assert_eq!(rows.len(), 1, "{variant} x{threads}");
            let row = rows[0];
            assert_eq!(row["engine"], "faultmap");
            assert_eq!(row["cache"], cache);
            assert_eq!(row["delivery"], delivery);
            assert_eq!(row["order"], 0);
            assert!(row["region_lookup"].is_null());
            // Order 0 on a filled cache: exactly one minor fault per page.
            assert_eq!(row["faults"], pages, "{row}");
            assert_eq!(row["stats"]["pgfault"], pages, "{row}");
            assert_eq!(row["major_faults"], 0, "{row}");
            assert_eq!(row["io_count"], 0, "{row}");
            assert_eq!(row["stats"]["map_calls"], pages, "{row}");
            // The default lookup is speculative: each fault counted once.
            assert_eq!(spf_sum(row), pages, "{row}");
            assert!(row["spf_success"].as_u64().unwrap() > 0, "{row}");
            if delivery == "handler" {
                assert_eq!(row["forwarded"], 0, "{row}");
            }
        }
    }
}

#[test]
fn bench_parts_prints_the_table() {
    let text = stdout_text(&faultmap(&[
        "bench",
        "--parts",
        "--size",
        "1M",
        "--repetitions",
        "1",
    ]));
    for needle in [
        "the lockless page cache benchmark",
        "kernel-memfd",
        "lock-free",
        "global-mutex",
        "1 thread",
        "2 threads",
        "faults/s",
        "vs kernel-memfd, time",
        "vs global-mutex, faults/s",
        "vs 1 thread, faults/s",
        "signal delivery",
        "goals",
        "2 threads over 1 thread",
    ] {
        assert!(text.contains(needle), "report lacks {needle:?}:\n{text}");
    }
}

#[test]
fn bench_churn_json_counts_faults_maps_and_spf() {
    let doc = stdout_json(&faultmap(&[
        "bench",
        "--churn",
        "--size",
        "2M",
        "--duration",
        "0.05",
        "--repetitions",
        "1",
        "--threads",
        "1,2",
        "--json",
    ]));
    let machine = &doc["machine"];
    assert_eq!(machine["benchmark"], "churn");
    assert_eq!(machine["pages"], 512);
    assert_eq!(machine["duration_seconds"], 0.05);
    assert_eq!(machine["churn_region_pages"], 16);
    assert!(machine["churn_live_regions"].as_u64().unwrap() > 0);
    assert_eq!(
        machine["deliveries"],
        serde_json::json!(["signal", "handler"])
    );
    // speculative over classic, per delivery mode and thread count.
    assert_eq!(machine["goals"].as_array().unwrap().len(), 2 * 2);
    let results = doc["results"].as_array().unwrap();
    // 2 thread counts x (kernel-memfd + 2 lookups x 2 modes).
    assert_eq!(results.len(), 2 * 5);
    for row in results {
        assert_eq!(row["workload"], "churn", "{row}");
        assert!(row["pages_touched"].as_u64().unwrap() > 0, "{row}");
        // The churn thread maps at least once.
        assert!(row["maps"].as_u64().unwrap() >= 1, "{row}");
        assert!(row["maps_per_second"].as_f64().unwrap() >= 0.0, "{row}");
        assert!(row["seconds"].as_f64().unwrap() >= 0.0, "{row}");
    }
    for threads in [1u64, 2] {
        let k = variant_rows(&doc, threads, "default")[0];
        assert_eq!(k["engine"], "kernel-memfd");
        assert!(
            k["spf_success"].is_null() && k["region_lookup"].is_null(),
            "{k}"
        );
        for (variant, lookup, delivery) in [
            ("lookup=speculative", "speculative", "signal"),
            ("lookup=classic", "classic", "signal"),
            (
                "lookup=speculative,delivery=handler",
                "speculative",
                "handler",
            ),
            ("lookup=classic,delivery=handler", "classic", "handler"),
        ] {
            let rows = variant_rows(&doc, threads, variant);
            assert_eq!(rows.len(), 1, "{variant} x{threads}");
            let row = rows[0];
            assert_eq!(row["region_lookup"], lookup, "{row}");
            assert_eq!(row["delivery"], delivery, "{row}");
            assert!(row["cache"].is_null(), "{row}");
            // Every touch after a fresh mapping or a DONTNEED faults once,
            // at order 0, from the cache.
            let faults = row["faults"].as_u64().unwrap();
            assert_eq!(row["pages_touched"], faults, "{row}");
            assert_eq!(row["stats"]["pgfault"], faults, "{row}");
            assert_eq!(row["io_count"], 0, "{row}");
            if lookup == "speculative" {
                assert!(row["spf_success"].as_u64().unwrap() > 0, "{row}");
                assert_eq!(spf_sum(row), faults, "{row}");
            }
            if lookup == "classic" {
                // The classic lookup never speculates.
                assert_eq!(spf_sum(row), 0, "{row}");
            }
            // Only SIGBUS handlers forward, and these faults are all hits,
            // which they resolve themselves (under the table's lock with
            // the classic lookup).
            assert_eq!(row["forwarded"], 0, "{row}");
        }
    }
}

#[test]
fn bench_churn_prints_the_table_with_the_counters() {
    let text = stdout_text(&faultmap(&[
        "bench",
        "--churn",
        "--size",
        "1M",
        "--duration",
        "0.02",
        "--repetitions",
        "1",
        "--threads",
        "1",
        "--delivery",
        "handler",
    ]));
    for needle in [
        "the speculative fault benchmark",
        "kernel-memfd",
        "speculative",
        "classic",
        "faults/s",
        "pages/s",
        "vs kernel-memfd, pages/s",
        "vs classic, faults/s",
        "churn maps/s",
        "spf_success",
        "spf_abort",
        "spf_fallback",
        "forwarded",
        "goals",
        "handler delivery",
    ] {
        assert!(text.contains(needle), "report lacks {needle:?}:\n{text}");
    }
}

// ---------------------------------------------------------------------------
// faultmap bench --budget
// ---------------------------------------------------------------------------

#[test]
fn bench_budget_refuses_bad_combinations() {
    let conflict = "cannot be used with";
    let refused: [(&[&str], &str); 14] = [
        (&["--budget", "--cold"], conflict),
        (&["--budget", "--parts"], conflict),
        (
            &["--budget", "--workload", "seq,sparse"],
            "not a workload of --budget",
        ),
        (&["--workload", "hotcold"], "add --budget"),
        // --full conflicts with --budget: not "add --budget".
        (
            &["--full", "--workload", "hotcold"],
            "with --budget instead of --full",
        ),
        (&["--cold", "--workload", "hotcold"], "not a cold workload"),
        (&["--parts", "--file-io", "direct"], "--cold or --budget"),
        // clap does not check `requires` next to a conflicting option:
        // these must still be refused, not ignored.
        (
            &["--budget", "--ra-pages", "3"],
            "--ra-pages goes with --cold",
        ),
        (
            &["--budget", "--memory-budget", "1M"],
            "--memory-budget goes with --remote",
        ),
        (
            &["--cold", "--budget-mib", "4"],
            "--budget-mib goes with --budget",
        ),
        (
            &["--budget", "--duration", "1"],
            "--duration goes with --churn",
        ),
        (
            &["--remote", "--delivery", "handler"],
            "--delivery goes with",
        ),
        (&["--budget-mib", "4"], "--budget"),
        (&["--budget", "--budget-mib", "0"], "budget-mib"),
    ];
    for (args, needle) in refused {
        let args: Vec<&str> = std::iter::once("bench")
            .chain(args.iter().copied())
            .collect();
        assert_fails_cleanly(&faultmap(&args), needle);
    }
    // Too small for a budget of at least 1 MiB on an object 4 times larger.
    let dir = tempfile::tempdir().unwrap();
    let small = write(dir.path(), "small", &[7u8; 1 << 20]);
    assert_fails_cleanly(
        &faultmap(&["bench", "--budget", "--file", small.to_str().unwrap()]),
        "too small",
    );
}

/// A file of `len` bytes whose pages differ, cheap to make in a debug build.
fn patterned(dir: &Path, len: usize) -> PathBuf {
    let data: Vec<u8> = (0..len)
        .map(|i| (i / 4096 % 251) as u8 + (i % 3) as u8 + 1)
        .collect();
    write(dir, "data", &data)
}

#[test]
fn bench_budget_json_has_a_row_per_cell_within_the_budget() {
    // 16 MiB asked: the file is 8 MiB, so the budget shrinks to 2 MiB.
    let dir = tempfile::tempdir().unwrap();
    let file = patterned(dir.path(), 8 << 20);
    let doc = stdout_json(&faultmap(&[
        "bench",
        "--budget",
        "--budget-mib",
        "16",
        "--file",
        file.to_str().unwrap(),
        "--json",
    ]));
    let machine = &doc["machine"];
    assert_eq!(machine["benchmark"], "budget", "{machine}");
    assert_eq!(machine["budget_bytes"], 2 << 20, "{machine}");
    assert_eq!(machine["budget_asked_bytes"], 16 << 20, "{machine}");
    assert_eq!(machine["pages"], 2048, "{machine}");
    let results = doc["results"].as_array().unwrap();
    let faultmap_rows: Vec<&Value> = results
        .iter()
        .filter(|r| r["engine"] == "faultmap")
        .collect();
    let workloads: Vec<&str> = faultmap_rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["seq", "rand", "hotcold"]);
    for row in results {
        for field in [
            "workload",
            "engine",
            "variant",
            "seconds",
            "touches",
            "hit_ratio",
            "evicted",
            "refault",
            "peak_bytes",
            "budget_bytes",
            "within_budget",
        ] {
            assert!(row.get(field).is_some(), "row lacks {field}: {row}");
        }
        assert_eq!(row["variant"], "budget=2MiB", "{row}");
        assert_eq!(row["budget_bytes"], 2 << 20, "{row}");
        let touches = if row["workload"] == "seq" { 4096 } else { 2048 };
        assert_eq!(row["touches"], touches, "{row}");
        let hit = row["hit_ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&hit), "{row}");
        let engine = row["engine"].as_str().unwrap();
        assert!(engine == "faultmap" || engine == "kernel-file", "{row}");
        if engine == "kernel-file" {
            assert!(row["evicted"].is_null(), "{row}");
        }
    }
    for row in faultmap_rows {
        assert_eq!(row["within_budget"], true, "{row}");
        let peak = row["peak_bytes"].as_u64().unwrap();
        assert!(peak > 0 && peak <= (2 << 20) + (2 << 20) / 100, "{row}");
        assert!(row["evicted"].as_u64().is_some(), "{row}");
        assert!(row["refault"].as_u64().is_some(), "{row}");
    }
    // Every page of the object is read at least once through a 2 MiB
    // budget: seq must evict.
    let seq = results
        .iter()
        .find(|r| r["engine"] == "faultmap" && r["workload"] == "seq")
        .unwrap();
    assert!(seq["evicted"].as_u64().unwrap() > 0, "{seq}");
}

/// `faultmap bench --budget --budget-mib 2 --file FILE EXTRA...`.
fn bench_budget_of_2_mib(file: &Path, extra: &[&str]) -> Output {
    let file = file.to_str().unwrap();
    let mut args = vec!["bench", "--budget", "--budget-mib", "2", "--file", file];
    args.extend_from_slice(extra);
    faultmap(&args)
}

#[test]
fn bench_budget_runs_the_workloads_and_file_io_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let file = patterned(dir.path(), 8 << 20);
    let run = |workloads: &str, io: Option<&str>| {
        let mut extra = vec!["--workload", workloads, "--json"];
        if let Some(io) = io {
            extra.extend(["--file-io", io]);
        }
        stdout_json(&bench_budget_of_2_mib(&file, &extra))
    };
    // The default mode is direct, or what direct falls back to on this
    // filesystem (buffered without O_DIRECT: then the two runs below
    // cannot differ in their mode).
    let direct = faultmap::FileStore::open_with(&file, faultmap::FileIo::Direct)
        .unwrap()
        .io();
    let default = run("seq", None);
    assert_eq!(default["machine"]["file_io"], direct.as_str());
    let doc = run("hotcold,seq", Some("buffered"));
    let machine = &doc["machine"];
    assert_eq!(machine["file_io"], "buffered", "{machine}");
    let results = doc["results"].as_array().unwrap();
    // Report order, whatever the order asked in.
    let workloads: Vec<&str> = results
        .iter()
        .filter(|r| r["engine"] == "faultmap")
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["seq", "hotcold"]);
    assert!(results.iter().all(|r| r["workload"] != "rand"));
}

#[test]
fn bench_budget_prints_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let file = patterned(dir.path(), 8 << 20);
    let text = stdout_text(&bench_budget_of_2_mib(&file, &[]));
    for needle in [
        "faultmap bench --budget",
        "8.00 MiB (2,048 pages), given with --file",
        "RSS bound: peak cached must stay within budget + 1%",
        "touches/s",
        "hit ratio",
        "evictions/s",
        "refaults",
        "peak cached",
        "peak RSS",
        "≤ budget+1%",
    ] {
        assert!(text.contains(needle), "report lacks {needle:?}:\n{text}");
    }
    for workload in ["seq", "rand", "hotcold"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(workload) && l.contains("faultmap"))
            .unwrap_or_else(|| panic!("no faultmap row for {workload}:\n{text}"));
        assert!(line.trim_end().ends_with("yes"), "{line}");
    }
}

/// A variable `scripts/remote-servers up` exports (`scripts/test-all`
/// runs the tests under it); missing, the test fails and says so.
fn server_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run under ./scripts/test-all, or \
             eval \"$(scripts/remote-servers up)\" first"
        )
    })
}

#[test]
fn scan_of_http_and_s3_urls_gives_the_files_crc() {
    let data = random_bytes((5 << 20) + 321, 77);
    let name = format!("cli-scan-{}", std::process::id());
    let http_root = PathBuf::from(server_env("FAULTMAP_HTTP_ROOT"));
    let s3_root = PathBuf::from(server_env("FAULTMAP_S3_ROOT"));
    std::fs::write(http_root.join(&name), &data).unwrap();
    std::fs::write(s3_root.join(&name), &data).unwrap();
    let urls = [
        format!("{}/{name}", server_env("FAULTMAP_HTTP_URL")),
        format!("s3://{}/{name}", server_env("FAULTMAP_S3_BUCKET")),
    ];
    let results: Vec<Value> = urls
        .iter()
        .map(|url| stdout_json(&faultmap(&["scan", url, "--threads", "2", "--json"])))
        .collect();
    let _ = std::fs::remove_file(http_root.join(&name));
    let _ = std::fs::remove_file(s3_root.join(&name));
    for (url, v) in urls.iter().zip(results) {
        assert_eq!(v["crc32"], crc32fast::hash(&data), "{url}");
        assert_eq!(v["bytes"], data.len() as u64, "{url}");
        assert_eq!(v["file"], url.as_str());
    }
    let missing = format!("s3://{}/no-such-object", server_env("FAULTMAP_S3_BUCKET"));
    assert_fails_cleanly(&faultmap(&["scan", &missing]), "no such object");
    assert_fails_cleanly(
        &faultmap(&["scan", "ftp://example.com/x"]),
        "unsupported scheme",
    );
}

/// `bench --remote` runs start and stop the servers under one state
/// folder (`target/bench-remote`): one at a time.
static REMOTE_BENCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn bench_remote_json_has_every_engine_and_the_goals() {
    let _one = REMOTE_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultmap(&[
        "bench",
        "--remote",
        "--no-fuse",
        "--size",
        "8M",
        "--repetitions",
        "1",
        "--sample-pages",
        "16",
        "--threads",
        "1",
        "--json",
    ]);
    let doc = stdout_json(&out);
    let rows = doc["results"].as_array().expect("results");
    for store in ["http", "s3"] {
        for (workload, engine, setting) in [
            ("seq", "raw-get", None),
            ("seq", "faultmap", Some("full")),
            ("seq", "faultmap", Some("around")),
            ("rand", "faultmap", Some("full")),
            ("clustered", "faultmap", Some("around")),
        ] {
            let row = rows
                .iter()
                .find(|r| {
                    r["store"] == store
                        && r["workload"] == workload
                        && r["engine"] == engine
                        && setting.is_none_or(|s| r["setting"] == s)
                })
                .unwrap_or_else(|| panic!("no {store} {workload} {engine} row: {doc}"));
            for field in [
                "latency_ms",
                "threads",
                "repetitions",
                "seconds",
                "bytes",
                "bytes_per_second",
                "requests",
                "mean_request_bytes",
                "transferred",
                "peak_bytes",
            ] {
                assert!(row.get(field).is_some(), "row lacks {field}: {row}");
            }
            assert!(row["requests"].as_u64().unwrap() > 0, "{row}");
        }
        // seq reads the whole object.
        let seq = rows
            .iter()
            .find(|r| r["store"] == store && r["workload"] == "seq" && r["engine"] == "faultmap")
            .unwrap();
        assert_eq!(seq["bytes"], 8 << 20);
    }
    let goals = doc["machine"]["goals"].as_array().expect("goals");
    for store in ["http", "s3"] {
        let place = format!("{store} at 0 ms");
        assert!(
            goals.iter().any(|g| g["place"] == place.as_str()
                && g["what"].as_str().unwrap().contains("over raw-get")
                && g["met"].is_boolean()),
            "{doc}"
        );
    }
}

/// Holds the pool of 2 MiB huge pages for a test, grown by `extra` pages
/// (taken out again, and the pool's lock file let go, on drop): the lock
/// file keeps every other holder out, in this process and in others.
fn huge_pool(extra: u64) -> HugePagePool {
    let mut pool = HugePagePool::lock().expect("the pool's lock file");
    pool.grow(extra).expect("these tests run as root");
    pool
}

#[test]
fn scan_with_2_mib_pages_gives_the_files_crc_or_says_how_many_pages_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes((5 << 20) + 123, 77);
    let path = write(dir.path(), "huge", &data);
    let p = path.to_str().unwrap();
    {
        let _pool = huge_pool(3);
        let v = stdout_json(&faultmap(&["scan", p, "--page-size", "2M", "--json"]));
        assert_eq!(v["crc32"], crc32fast::hash(&data));
        // Three 2 MiB pages, one fault each.
        assert_eq!(v["stats"]["pgfault"], 3, "{v}");
    }
    {
        // The pool as it is, held: a sparse file 3 pages larger than it
        // has free.
        let _pool = huge_pool(0);
        let pages = HugePagePool::free().unwrap() + 3;
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(pages << 21)
            .unwrap();
        let out = faultmap(&["scan", big.to_str().unwrap(), "--page-size", "2M"]);
        assert_fails_cleanly(&out, &format!("needs {pages} huge pages of 2 MiB"));
        assert_fails_cleanly(&out, "vm.nr_hugepages");
    }
    assert_fails_cleanly(&faultmap(&["scan", p, "--page-size", "1G"]), "4K or 2M");
}

#[test]
fn bench_page_size_2m_adds_columns_and_gives_the_pool_back() {
    // The pool read under its locks, before and after (outside them every
    // user has given its pages back), but not during the benchmark, which
    // takes the lock file itself.
    let pool_now = || {
        let _pool = huge_pool(0);
        HugePagePool::size().unwrap()
    };
    let before = pool_now();
    let doc = stdout_json(&faultmap(&[
        "bench",
        "--page-size",
        "4K,2M",
        "--workload",
        "pages",
        "--orders",
        "0",
        "--threads",
        "1",
        "--size",
        "5M",
        "--repetitions",
        "1",
        "--json",
    ]));
    // Given back: the pool is as the benchmark found it.
    assert_eq!(pool_now(), before);
    assert!(doc["machine"]["page_size_skipped"].is_null(), "{doc}");
    for (delivery_variant, faults) in [("page=2M", 3), ("page=2M,delivery=handler", 3)] {
        let rows = rows(&doc, "faultmap", delivery_variant);
        assert_eq!(rows.len(), 1, "{delivery_variant}");
        assert_eq!(rows[0]["page_size"], 2 << 20);
        assert_eq!(rows[0]["workload"], "pages");
        assert_eq!(rows[0]["faults"], faults, "{}", rows[0]);
    }
    let base = rows(&doc, "faultmap", "order=0");
    assert_eq!(base[0]["page_size"], 4096);
    // One fault per 4 KiB page at order 0.
    assert_eq!(base[0]["faults"], 5 * 256);
    assert!(rows(&doc, "kernel-file", "default")[0]["page_size"].is_null());
}

/// `scan --cache-dir`: the second run reads the object from the disk
/// cache; `faultmap cache` lists, measures, verifies (and fails on a
/// damaged page) and clears it; an unsafe directory is refused.
#[test]
fn scan_through_a_disk_cache_and_the_cache_command() {
    let data = random_bytes((5 << 20) + 123, 78);
    let name = format!("cli-disk-{}", std::process::id());
    let http_root = PathBuf::from(server_env("FAULTMAP_HTTP_ROOT"));
    std::fs::write(http_root.join(&name), &data).unwrap();
    let url = format!("{}/{name}", server_env("FAULTMAP_HTTP_URL"));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache = cache.to_str().unwrap();
    let scan = || stdout_json(&faultmap(&["scan", &url, "--cache-dir", cache, "--json"]));
    let first = scan();
    let second = scan();
    let len = data.len() as u64;
    for v in [&first, &second] {
        assert_eq!(v["crc32"], crc32fast::hash(&data));
    }
    assert_eq!(first["disk_cache"]["network_bytes"], len, "{first}");
    assert_eq!(first["disk_cache"]["written_bytes"], len, "{first}");
    assert_eq!(second["disk_cache"]["network_bytes"], 0, "{second}");
    assert_eq!(second["disk_cache"]["disk_bytes"], len, "{second}");

    let cache_cmd = |args: &[&str]| {
        let mut all = vec!["cache", "--cache-dir", cache];
        all.extend_from_slice(args);
        faultmap(&all)
    };
    let ls = stdout_json(&cache_cmd(&["ls", "--json"]));
    let objects = ls.as_array().expect("a list");
    assert_eq!(objects.len(), 1, "{ls}");
    assert_eq!(objects[0]["url"], url.as_str());
    assert_eq!(objects[0]["cached_bytes"], len);
    assert_eq!(objects[0]["len"], len);
    let du = stdout_json(&cache_cmd(&["du", "--json"]));
    assert!(du["bytes"].as_u64().unwrap() >= len, "{du}");
    let verify = stdout_json(&cache_cmd(&["verify", "--json"]));
    assert_eq!(verify["good_pages"], len.div_ceil(4096), "{verify}");
    let human = stdout_text(&cache_cmd(&["ls"]));
    assert!(human.contains(&url), "{human}");

    // A damaged page: verify names it and fails; a scan still reads right.
    let chunk = Path::new(cache)
        .join("objects")
        .read_dir()
        .unwrap()
        .flatten()
        .flat_map(|u| u.path().read_dir().unwrap().flatten())
        .map(|v| v.path().join("0.chunk"))
        .next()
        .expect("a chunk file");
    let mut bytes = std::fs::read(&chunk).unwrap();
    bytes[8192 + 3 * 4096 + 5] ^= 0xff;
    std::fs::write(&chunk, &bytes).unwrap();
    assert_fails_cleanly(&cache_cmd(&["verify"]), "do not match");
    assert_eq!(scan()["crc32"], crc32fast::hash(&data));

    let cleared = stdout_json(&cache_cmd(&["clear", &url, "--json"]));
    assert!(cleared["freed_bytes"].as_u64().unwrap() >= len, "{cleared}");
    let ls = stdout_json(&cache_cmd(&["ls", "--json"]));
    assert_eq!(ls.as_array().map(Vec::len), Some(0), "{ls}");

    // No cache named: a clear error. An unsafe one: refused, named.
    let out = Command::new(env!("CARGO_BIN_EXE_faultmap"))
        .args(["cache", "ls"])
        .env_remove("FAULTMAP_CACHE_DIR")
        .output()
        .unwrap();
    assert_fails_cleanly(&out, "no disk cache");
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = faultmap(&["scan", &url, "--cache-dir", open.to_str().unwrap()]);
    assert_fails_cleanly(&out, "others may write");
    assert_fails_cleanly(
        &faultmap(&["scan", &url, "--cache-dir", cache, "--cache-max", "0"]),
        "at least 1 byte",
    );
    let _ = std::fs::remove_file(http_root.join(&name));
}

/// `bench --remote --disk-cache`: first, second and cold second runs per
/// store; the second moves no object bytes and reads them all from the
/// disk. `--disk-cache` alone is refused.
#[test]
fn bench_remote_disk_cache_json_has_the_runs_and_the_goals() {
    let _one = REMOTE_BENCH.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultmap(&[
        "bench",
        "--remote",
        "--disk-cache",
        "--no-fuse",
        "--size",
        "8M",
        "--repetitions",
        "1",
        "--latency-ms",
        "20",
        "--json",
    ]);
    let doc = stdout_json(&out);
    let rows = doc["results"].as_array().expect("results");
    for store in ["http", "s3"] {
        let row = |setting: &str| {
            rows.iter()
                .find(|r| r["store"] == store && r["setting"] == setting)
                .unwrap_or_else(|| panic!("no {store} {setting} row: {doc}"))
        };
        // The object, and the open's one-byte range probe.
        assert_eq!(row("disk-first")["transferred"], (8 << 20) + 1, "{doc}");
        assert_eq!(row("disk-first")["disk_bytes"], 0, "{doc}");
        assert_eq!(row("disk-second")["transferred"], 0, "{doc}");
        assert_eq!(row("disk-second")["disk_bytes"], 8 << 20, "{doc}");
        assert!(row("full")["seconds"].as_f64().unwrap() > 0.0);
        // The cold second run needs root to drop the page cache.
        if let Some(cold) = rows
            .iter()
            .find(|r| r["store"] == store && r["setting"] == "disk-second-cold")
        {
            assert_eq!(cold["transferred"], 0, "{doc}");
        }
    }
    let goals = doc["machine"]["goals"].as_array().expect("goals");
    assert!(
        goals.iter().any(|g| g["what"]
            .as_str()
            .unwrap()
            .contains("second run: object bytes from the network")
            && g["met"] == true),
        "{doc}"
    );
    assert_fails_cleanly(
        &faultmap(&["bench", "--disk-cache"]),
        "--disk-cache goes with",
    );
}
