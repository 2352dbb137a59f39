//! The human-readable report: a header about the machine and the baselines,
//! then one table per workload in seed 000's shape.
//!
//! ```text
//!   seq: sequential access: every 8-byte word in order
//!                             kernel-file  kernel-memfd   order=0   order=0  ...
//!                                                          signal   handler  ...
//!   1 thread   minor-faults         4,096        16,384   262,144   262,144  ...
//!              time, seconds     0.061234      0.093121  1.021234  ...
//!              vs kernel-file                      0.66      0.06  ...
//!              vs kernel-memfd       1.52                    0.09  ...
//! ```
//!
//! Every number is the median over the repetitions. A `vs X` line divides
//! X's time by each column's: above 1, that column was faster than X. The
//! second heading line (the delivery mode) is there when the run measured
//! more than one.

use faultmap::Delivery;

use super::engine::Engine;
use super::probe::FolioSample;
use super::reps::{CELL_BUDGET, MIN_REPS};
use super::results::{RepsFrom, Run};
use super::workload::Workload;
use crate::table::Table;
use crate::units;

/// The whole report.
pub fn render(run: &Run) -> String {
    let mut out = header(run);
    for &w in &run.workloads {
        out.push('\n');
        out.push_str(&block(run, w));
    }
    out.push_str(&legend());
    out
}

fn header(run: &Run) -> String {
    let mut t = Table::new(2);
    t.row(["machine".to_string(), run.machine.line()]);
    t.row(["data".to_string(), data_line(run)]);
    t.row(["repetitions".to_string(), reps_line(run)]);
    t.row(["kernel-file".to_string(), kernel_file_line(run)]);
    t.row([
        "kernel-memfd".to_string(),
        format!(
            "a memfd copy of the data; folios: {}",
            folio_text(run.folios(Engine::KernelMemfd))
        ),
    ]);
    t.row(["faultmap".to_string(), faultmap_line(run)]);
    format!(
        "faultmap bench: seed 000's fault-around table, faultmap against kernel mmap\n\n{}",
        t.render()
    )
}

fn data_line(run: &Run) -> String {
    let d = &run.data;
    let origin = if d.generated {
        "generated (pseudo-random, non-zero), removed after"
    } else {
        "given with --file"
    };
    format!(
        "{} ({} bytes, {} pages), {}: {}",
        units::bytes(d.bytes),
        units::count(d.bytes),
        units::count(d.pages),
        origin,
        d.path
    )
}

fn reps_line(run: &Run) -> String {
    let how = match run.repetitions_from {
        RepsFrom::Argument => format!("{} per cell, as asked", run.repetitions),
        RepsFrom::Budget => format!(
            "{MIN_REPS} per cell, up to {} for cells that fit {} s in all",
            run.repetitions,
            CELL_BUDGET.as_secs()
        ),
    };
    format!(
        "{how}; each cell is the median of its samples; total wall time {:.1} s",
        run.wall_seconds
    )
}

fn kernel_file_line(run: &Run) -> String {
    let resident = run
        .min_resident_pct()
        .map_or("not measured".to_string(), |p| {
            format!("at least {p:.1}% resident")
        });
    format!(
        "page cache re-read before every repetition, then {resident}; folios: {}",
        folio_text(run.folios(Engine::KernelFile))
    )
}

fn faultmap_line(run: &Run) -> String {
    let w = &run.warm_up;
    format!(
        "{}; {} handler thread(s); cache filled once before the runs in {:.2} s \
         ({} store reads, {}), {:.1}% cached",
        deliveries_text(&run.deliveries),
        run.handler_threads,
        w.seconds,
        units::count(w.stats.io_count),
        units::bytes(w.stats.io_bytes),
        w.cached_pct
    )
}

/// What the delivery modes of a run are.
pub(super) fn deliveries_text(deliveries: &[Delivery]) -> String {
    let text: Vec<&str> = deliveries
        .iter()
        .map(|&d| match d {
            Delivery::Signal => {
                "signal delivery (the faulting thread resolves its own hit in a SIGBUS handler)"
            }
            Delivery::Handler => {
                "handler delivery (a handler thread reads the userfaultfd message and \
                 wakes the faulting thread)"
            }
        })
        .collect();
    text.join(" and ")
}

fn folio_text(sample: Option<FolioSample>) -> String {
    match sample {
        Some(s) if s.sampled > 0 => format!(
            "{} ({} of {} sampled pages in large folios)",
            s.kind().name(),
            units::count(u64::from(s.large)),
            units::count(u64::from(s.sampled))
        ),
        _ => "unknown (page frames unreadable: /proc/self/pagemap and /proc/kpageflags need root)"
            .into(),
    }
}

/// One workload's table.
fn block(run: &Run, w: Workload) -> String {
    let mut t = Table::new(2);
    let mut heading = vec![String::new(), String::new()];
    heading.extend(run.engines.iter().map(|e| e.column()));
    t.row(heading);
    if run.deliveries.len() > 1 {
        let mut second = vec![String::new(), String::new()];
        second.extend(
            run.engines
                .iter()
                .map(|e| e.delivery().map_or("", crate::delivery_name).to_string()),
        );
        t.row(second);
    }
    let any_major = run
        .cells
        .iter()
        .any(|c| c.workload == w && c.summary().major_faults > 0);
    for &threads in &run.threads {
        let label = if threads == 1 {
            "1 thread".to_string()
        } else {
            format!("{threads} threads")
        };
        let medians = |f: fn(&Run, Workload, u16, Engine) -> String| -> Vec<String> {
            run.engines.iter().map(|&e| f(run, w, threads, e)).collect()
        };
        row(&mut t, &label, "minor-faults", medians(faults_cell));
        if any_major {
            row(&mut t, "", "major-faults", medians(major_cell));
        }
        row(&mut t, "", "time, seconds", medians(seconds_cell));
        for reference in [Engine::KernelFile, Engine::KernelMemfd] {
            let cells = run
                .engines
                .iter()
                .map(|&e| ratio_cell(run, w, threads, reference, e))
                .collect();
            row(&mut t, "", &format!("vs {}", reference.name()), cells);
        }
    }
    format!("{}: {}\n{}", w.name(), w.describe(), t.render())
}

fn row(t: &mut Table, label: &str, what: &str, cells: Vec<String>) {
    let mut r = vec![label.to_string(), what.to_string()];
    r.extend(cells);
    t.row(r);
}

fn faults_cell(run: &Run, w: Workload, threads: u16, e: Engine) -> String {
    run.cell(w, threads, e)
        .map_or_else(String::new, |c| units::count(c.summary().faults))
}

fn major_cell(run: &Run, w: Workload, threads: u16, e: Engine) -> String {
    run.cell(w, threads, e)
        .map_or_else(String::new, |c| units::count(c.summary().major_faults))
}

fn seconds_cell(run: &Run, w: Workload, threads: u16, e: Engine) -> String {
    run.cell(w, threads, e)
        .map_or_else(String::new, |c| format!("{:.6}", c.summary().seconds))
}

/// `reference`'s median time over `e`'s; blank in the reference's own column.
fn ratio_cell(run: &Run, w: Workload, threads: u16, reference: Engine, e: Engine) -> String {
    if e == reference {
        return String::new();
    }
    let seconds = |e| run.cell(w, threads, e).map(|c| c.summary().seconds);
    match (seconds(reference), seconds(e)) {
        (Some(r), Some(s)) if s > 0.0 => format!("{:.2}", r / s),
        _ => "-".into(),
    }
}

fn legend() -> String {
    "\nminor-faults: getrusage minor faults of the process during the walk (kernel \
     columns), faults handled by faultmap (pgfault, order=N columns); all threads \
     together, each thread walking its own mapping of the whole file.\n\
     signal / handler: faultmap's fault delivery (a SIGBUS handler in the faulting \
     thread, or a handler thread reading userfaultfd messages).\n\
     vs X: X's median time divided by the column's; above 1, the column was faster \
     than X.\n"
        .into()
}
