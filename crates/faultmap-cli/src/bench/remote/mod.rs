//! `faultmap bench --remote`: faultmap against raw ranged GETs and the
//! FUSE peers a user would pick, on the project's own HTTP (nginx) and S3
//! (versitygw) servers, all in one run.
//!
//! 1. [`setup::Setup`] starts the servers (`scripts/remote-servers`),
//!    writes the object (1 GiB by default) into both, starts a proxy in
//!    front of each (`faultmap-proxy`: it counts every engine's requests
//!    the same way, and adds `--latency-ms` of first-byte latency), and
//!    mounts `s3fs` and `rclone` through those proxies
//!    (`scripts/fuse-peers`; a peer that cannot be mounted is skipped with
//!    one line saying why).
//! 2. For each latency, store, workload and thread count, each engine
//!    ([`engines`]) reads the object cold, `--repetitions` times, engines
//!    interleaved within a repetition: `raw-get` (seq only: the best of a
//!    few request sizes and depths, probed first), `faultmap` with full
//!    readahead and with read-around only, and each FUSE peer through a
//!    kernel `mmap`. Every run's checksum must equal the first of its
//!    workload: an engine that read wrong bytes fails the benchmark.
//! 3. The report: a table of medians, or one JSON document; then the goals.

pub mod engines;
pub mod setup;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Result};
use faultmap::ReadaheadMode;
use serde::Serialize;

use crate::access::{Access, AccessPlan, Coverage};
use crate::table::Table;
use crate::units;
use engines::{StoreKind, Target};

/// What `faultmap bench --remote` was asked for.
#[derive(Debug)]
pub struct RemoteOptions {
    pub stores: Vec<StoreKind>,
    pub workloads: Vec<Access>,
    pub latencies_ms: Vec<u64>,
    pub threads: Vec<u16>,
    pub size: u64,
    pub repetitions: u32,
    pub budget: Option<u64>,
    pub sample_pages: u64,
    pub no_fuse: bool,
    pub json: bool,
    pub state: PathBuf,
}

/// One result: the medians of one engine's runs of one cell.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub engine: String,
    /// `full` or `around` for faultmap; the request size and depth for
    /// raw-get; empty for the FUSE peers.
    pub setting: String,
    pub store: &'static str,
    pub latency_ms: u64,
    pub workload: &'static str,
    pub threads: u16,
    pub repetitions: usize,
    pub seconds: f64,
    /// Object bytes the workload touched.
    pub bytes: u64,
    pub bytes_per_second: f64,
    pub requests: u64,
    pub mean_request_bytes: Option<f64>,
    /// Bytes the servers sent.
    pub transferred: u64,
    pub peak_bytes: u64,
}

/// Runs `faultmap bench --remote`.
pub fn run(o: &RemoteOptions) -> Result<()> {
    if o.stores.is_empty() || o.workloads.is_empty() || o.threads.is_empty() {
        bail!("--remote needs at least one store, workload and thread count");
    }
    let setup = setup::Setup::start(&o.state, o.size, o.no_fuse)?;
    let mut rows = Vec::new();
    for &latency in &o.latencies_ms {
        for proxy in [&setup.http_proxy, &setup.s3_proxy] {
            proxy
                .faults()
                .set_latency(std::time::Duration::from_millis(latency));
        }
        for &kind in &o.stores {
            let target = Target {
                kind,
                proxy: setup.proxy(kind),
                name: &setup.name,
                bucket: setup.bucket(),
                len: setup.len,
            };
            rows.extend(measure_store(o, &setup, &target, latency)?);
        }
    }
    drop(setup);
    if o.json {
        let doc = serde_json::json!({ "benchmark": "remote", "results": rows, "goals": goals(&rows, o.budget) });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", render(&rows));
        print!("{}", render_goals(&goals(&rows, o.budget)));
    }
    Ok(())
}

/// One engine of a cell: a name, a setting, and how it runs a plan.
type Engine<'a> = (
    String,
    String,
    Box<dyn Fn(&AccessPlan) -> Result<engines::Run> + 'a>,
);

fn measure_store(
    o: &RemoteOptions,
    setup: &setup::Setup,
    target: &Target<'_>,
    latency: u64,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let raw = if o.workloads.contains(&Access::Seq) {
        Some(best_raw_get(target)?)
    } else {
        None
    };
    for &access in &o.workloads {
        let thread_counts: Vec<u16> = if access == Access::Seq {
            o.threads.clone()
        } else {
            vec![1]
        };
        for &threads in &thread_counts {
            let coverage = match access {
                Access::Seq => Coverage::All,
                _ => Coverage::Sample(o.sample_pages),
            };
            let plan =
                AccessPlan::new(access, target.len as usize, usize::from(threads), coverage)?;
            let mut list: Vec<Engine<'_>> = Vec::new();
            if let (Access::Seq, 1, Some((request, depth))) = (access, threads, raw) {
                list.push((
                    "raw-get".into(),
                    format!("{} x{depth}", units::bytes(request)),
                    Box::new(move |_| engines::raw_get(target, request, depth)),
                ));
            }
            for (mode, name) in [
                (ReadaheadMode::Full, "full"),
                (ReadaheadMode::AroundOnly, "around"),
            ] {
                if access == Access::Seq && mode == ReadaheadMode::AroundOnly && threads > 1 {
                    continue;
                }
                let budget = o.budget;
                list.push((
                    "faultmap".into(),
                    name.into(),
                    Box::new(move |plan| engines::faultmap(target, plan, mode, budget)),
                ));
            }
            if threads == 1 {
                for (engine, kind, path) in &setup.fuse {
                    if *kind == target.kind {
                        let proxy = target.proxy;
                        list.push((
                            engine.to_string(),
                            String::new(),
                            Box::new(move |plan| engines::fuse(path, proxy, plan)),
                        ));
                    }
                }
            }
            let mut runs: Vec<Vec<engines::Run>> = vec![Vec::new(); list.len()];
            let mut checksum = None;
            for rep in 0..o.repetitions {
                for (i, (engine, setting, f)) in list.iter().enumerate() {
                    eprintln!(
                        "  {} {latency} ms {} {threads}T {engine} {setting} (rep {}/{})",
                        target.kind.name(),
                        access.name(),
                        rep + 1,
                        o.repetitions
                    );
                    let r = f(&plan)?;
                    // raw-get sums every word; the walks of seq too.
                    if engine != "raw-get" || access == Access::Seq {
                        match checksum {
                            None => checksum = Some(r.checksum),
                            Some(c) if c != r.checksum => bail!(
                                "{engine} {setting} read other bytes than the first engine of {} ({:#x} vs {c:#x})",
                                access.name(),
                                r.checksum
                            ),
                            Some(_) => {}
                        }
                    }
                    runs[i].push(r);
                }
            }
            for ((engine, setting, _), runs) in list.iter().zip(runs) {
                let bytes = plan.pages_touched() * faultmap::PAGE_SIZE as u64;
                let bytes = bytes.min(target.len);
                let seconds = median(runs.iter().map(|r| r.seconds));
                let requests = median_u(runs.iter().map(|r| r.requests));
                let request_bytes = median_u(runs.iter().map(|r| r.request_bytes));
                rows.push(Row {
                    engine: engine.clone(),
                    setting: setting.clone(),
                    store: target.kind.name(),
                    latency_ms: latency,
                    workload: access.name(),
                    threads,
                    repetitions: runs.len(),
                    seconds,
                    bytes,
                    bytes_per_second: bytes as f64 / seconds.max(1e-9),
                    requests,
                    mean_request_bytes: (requests > 0)
                        .then(|| request_bytes as f64 / requests as f64),
                    transferred: median_u(runs.iter().map(|r| r.transferred)),
                    peak_bytes: runs.iter().map(|r| r.peak_bytes).max().unwrap_or(0),
                });
            }
        }
    }
    Ok(rows)
}

/// The best request size and depth for raw GETs of this store at this
/// latency: each candidate reads the whole object once, the fastest wins.
fn best_raw_get(target: &Target<'_>) -> Result<(u64, usize)> {
    let mut best = (8 << 20, 16, f64::INFINITY);
    for (request, depth) in [(1 << 20, 32), (8 << 20, 8), (8 << 20, 32), (16 << 20, 16)] {
        eprintln!(
            "  {} raw-get probe: {} x{depth}",
            target.kind.name(),
            units::bytes(request)
        );
        let r = engines::raw_get(target, request, depth)?;
        if r.seconds < best.2 {
            best = (request, depth, r.seconds);
        }
    }
    Ok((best.0, best.1))
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn median_u(values: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn render(rows: &[Row]) -> String {
    let mut t = Table::new(6);
    t.row([
        "store",
        "latency",
        "workload",
        "threads",
        "engine",
        "setting",
        "seconds",
        "MiB/s",
        "requests",
        "mean request",
        "transferred",
        "peak memory",
    ]);
    for r in rows {
        t.row([
            r.store.to_string(),
            format!("{} ms", r.latency_ms),
            r.workload.to_string(),
            r.threads.to_string(),
            r.engine.clone(),
            r.setting.clone(),
            format!("{:.3}", r.seconds),
            format!("{:.0}", r.bytes_per_second / f64::from(1 << 20)),
            r.requests.to_string(),
            r.mean_request_bytes
                .map_or("-".into(), |b| units::bytes(b as u64)),
            units::bytes(r.transferred),
            units::bytes(r.peak_bytes),
        ]);
    }
    t.render()
}

/// One goal of the table and what this run measured for it.
#[derive(Debug, Serialize)]
pub struct Goal {
    pub goal: String,
    pub target: String,
    pub measured: Option<f64>,
    pub met: Option<bool>,
}

fn find<'a>(
    rows: &'a [Row],
    store: &str,
    latency: u64,
    workload: &str,
    engine: &str,
    setting: Option<&str>,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.store == store
            && r.latency_ms == latency
            && r.workload == workload
            && r.threads == 1
            && r.engine == engine
            && setting.map_or(true, |s| r.setting == s)
    })
}

fn goals(rows: &[Row], budget: Option<u64>) -> Vec<Goal> {
    let mut out = Vec::new();
    let latencies: std::collections::BTreeSet<u64> = rows.iter().map(|r| r.latency_ms).collect();
    let stores: Vec<&str> = {
        let mut s: Vec<_> = rows.iter().map(|r| r.store).collect();
        s.dedup();
        s
    };
    for &latency in &latencies {
        for store in &stores {
            let fm = find(rows, store, latency, "seq", "faultmap", Some("full"));
            if let (Some(fm), Some(raw)) = (fm, find(rows, store, latency, "seq", "raw-get", None))
            {
                let ratio = raw.seconds / fm.seconds;
                out.push(Goal {
                    goal: format!("cold seq, faultmap over raw-get, {store} at {latency} ms"),
                    target: ">= 0.8".into(),
                    measured: Some(ratio),
                    met: Some(ratio >= 0.8),
                });
            }
            let best_fuse = rows
                .iter()
                .filter(|r| {
                    r.store == *store
                        && r.latency_ms == latency
                        && r.workload == "seq"
                        && r.threads == 1
                        && (r.engine == "s3fs" || r.engine == "rclone")
                })
                .min_by(|a, b| a.seconds.total_cmp(&b.seconds));
            if let (Some(fm), Some(peer)) = (fm, best_fuse) {
                let ratio = peer.seconds / fm.seconds;
                out.push(Goal {
                    goal: format!(
                        "cold seq, faultmap over the best FUSE peer ({}), {store} at {latency} ms",
                        peer.engine
                    ),
                    target: ">= 2".into(),
                    measured: Some(ratio),
                    met: Some(ratio >= 2.0),
                });
            }
            if latency >= 20 {
                for workload in ["rand", "clustered"] {
                    let full = find(rows, store, latency, workload, "faultmap", Some("full"));
                    let around = find(rows, store, latency, workload, "faultmap", Some("around"));
                    if let (Some(full), Some(around)) = (full, around) {
                        let less = 1.0 - full.seconds / around.seconds;
                        out.push(Goal { goal: format!("{workload} at {latency} ms, {store}: readahead's wall time below read-around's"), target: ">= 30 % less".into(), measured: Some(less * 100.0), met: Some(less >= 0.3) });
                    }
                }
            }
        }
    }
    if let Some(budget) = budget {
        let peak = rows
            .iter()
            .filter(|r| r.engine == "faultmap")
            .map(|r| r.peak_bytes)
            .max()
            .unwrap_or(0);
        let over = peak as f64 / budget as f64;
        out.push(Goal {
            goal: format!(
                "faultmap's peak memory within the budget ({})",
                units::bytes(budget)
            ),
            target: "<= budget + 1 %".into(),
            measured: Some(over * 100.0),
            met: Some(over <= 1.01),
        });
    }
    out
}

fn render_goals(goals: &[Goal]) -> String {
    let mut t = Table::new(1);
    t.row(["goal", "target", "measured", "met"]);
    for g in goals {
        t.row([
            g.goal.clone(),
            g.target.clone(),
            g.measured.map_or("-".into(), |m| format!("{m:.2}")),
            g.met
                .map_or("-".into(), |m| if m { "yes".into() } else { "NO".into() }),
        ]);
    }
    let _ = BTreeMap::<u8, u8>::new();
    format!("\n{}", t.render())
}
