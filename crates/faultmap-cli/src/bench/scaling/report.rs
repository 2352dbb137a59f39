//! The human-readable parts and churn reports: a header, one table in the
//! seed's shape (faults/s by thread count), the goals, and notes on what
//! the counters showed.
//!
//! ```text
//!   parts: each thread touches one byte per page of its own 1/T of the data
//!                                        kernel-memfd   lock-free  global-mutex
//!   1 thread   faults                           4,096      65,536        65,536
//!              time, seconds                 0.025000    0.580000      0.600000
//!              faults/s                       163,840     112,993       109,226
//!              vs kernel-memfd, time                         0.04          0.04
//!              vs global-mutex, faults/s                     1.03
//!   2 threads  ...
//!              vs 1 thread, faults/s             1.80        1.93          1.10
//! ```
//!
//! churn's table has, per thread count: faults, pages touched, time,
//! faults/s, pages/s, the ratio to kernel-memfd's pages/s, speculative over
//! classic, the churn thread's maps/s, and the pager's `spf_success`,
//! `spf_abort`, `spf_fallback` and `forwarded`. A row that applies to no
//! column of a thread count is left out. Every number is the median over
//! the repetitions; the counters are the median sample's.

use faultmap::{Delivery, Stats, PAGE_SIZE};

use super::churn::{CHURN_LIVE, CHURN_PAGES};
use super::results::{ratio, Goal, ScaleRun, Summary};
use super::{Column, Kind, Setting};
use crate::bench::report::deliveries_text;
use crate::table::Table;
use crate::units;

/// The whole report.
pub fn render(run: &ScaleRun) -> String {
    let mut out = header(run);
    out.push('\n');
    out.push_str(&table(run));
    out.push_str(&goals(&run.goals()));
    out.push_str(&notes(run));
    out.push_str(legend(run.kind));
    out
}

fn header(run: &ScaleRun) -> String {
    let mut t = Table::new(2);
    t.row(["machine".to_string(), run.machine.line()]);
    t.row(["data".to_string(), run.data.line()]);
    t.row(["faultmap".to_string(), faultmap_line(run)]);
    t.row(["".to_string(), setting_line(run.kind).to_string()]);
    t.row(["delivery".to_string(), delivery_line(run)]);
    t.row([
        "kernel-memfd".to_string(),
        kernel_line(run.kind).to_string(),
    ]);
    t.row([
        "repetitions".to_string(),
        format!(
            "{} per cell; each cell is the median of its samples; total wall time {:.1} s",
            run.repetitions, run.wall_seconds
        ),
    ]);
    let title = match run.kind {
        Kind::Parts => {
            "faultmap bench --parts: seed 003's lockless page cache, threads faulting on \
             their own parts of one cached object"
        }
        Kind::Churn => {
            "faultmap bench --churn: seed 004's speculative page faults, threads faulting \
             while another maps and unmaps (like ebizzy)"
        }
    };
    format!("{title}\n\n{}", t.render())
}

fn faultmap_line(run: &ScaleRun) -> String {
    let w = &run.warm_up;
    format!(
        "fault-around order 0 (one page lookup and one UFFDIO_CONTINUE per fault); \
         {} handler thread(s); a new pager per sample over one object, whose cache was \
         filled once before the runs in {:.2} s ({} store reads, {}), {:.1}% cached",
        run.handler_threads,
        w.seconds,
        units::count(w.stats.io_count),
        units::bytes(w.stats.io_bytes),
        w.cached_pct
    )
}

fn setting_line(kind: Kind) -> &'static str {
    match kind {
        Kind::Parts => {
            "lock-free: page lookups pin the page's state word with a CAS, no lock; \
             global-mutex: every page lookup under one process-wide mutex \
             (Config::bench_global_cache_lock), the cache before seed 003"
        }
        Kind::Churn => {
            "speculative: a fault finds its region without a lock, validated by the \
             region's sequence count; classic: under the region table's lock, which map \
             and unmap hold throughout (like mmap_lock before SPF)"
        }
    }
}

fn delivery_line(run: &ScaleRun) -> String {
    let why = match run.kind {
        Kind::Parts if run.deliveries.contains(&Delivery::Handler) => {
            "; with handler delivery one handler thread takes every fault, so those columns \
             measure that thread, not the cache"
        }
        Kind::Parts => {
            ", so each thread resolves its own faults (with handler delivery one handler \
             thread would take every fault, and the benchmark would measure that thread, not \
             the cache)"
        }
        Kind::Churn if run.deliveries.contains(&Delivery::Signal) => {
            "; with signal delivery a classic fault's SIGBUS handler takes the table's lock \
             itself, so each delivery's two columns compare the lookups on one path"
        }
        Kind::Churn => "",
    };
    format!("{}{why}", deliveries_text(&run.deliveries))
}

fn kernel_line(kind: Kind) -> &'static str {
    match kind {
        Kind::Parts => {
            "the same threads on kernel mmaps of a memfd holding the same data (4 KiB \
             shmem pages; the kernel maps its fault-around window, 16 pages, per fault)"
        }
        Kind::Churn => {
            "the same on kernel mmaps of a memfd holding the same data (16 pages mapped \
             per fault), the churn thread calling mmap and munmap (mmap_lock for writing)"
        }
    }
}

/// The table: per thread count, the rows of the benchmark.
fn table(run: &ScaleRun) -> String {
    let mut t = Table::new(2);
    let mut heading = vec![String::new(), String::new()];
    heading.extend(run.columns.iter().map(|c| c.heading().to_string()));
    t.row(heading);
    if run.deliveries.len() > 1 {
        let mut second = vec![String::new(), String::new()];
        second.extend(
            run.columns
                .iter()
                .map(|c| c.delivery().map_or("", crate::delivery_name).to_string()),
        );
        t.row(second);
    }
    let rows = match run.kind {
        Kind::Parts => PARTS_ROWS.as_slice(),
        Kind::Churn => CHURN_ROWS.as_slice(),
    };
    for &threads in &run.threads {
        let mut label = if threads == 1 {
            "1 thread".to_string()
        } else {
            format!("{threads} threads")
        };
        for (what, f) in rows {
            let cells: Vec<String> = run.columns.iter().map(|&c| f(run, threads, c)).collect();
            if cells.iter().all(String::is_empty) {
                continue;
            }
            let mut r = vec![std::mem::take(&mut label), what.to_string()];
            r.extend(cells);
            t.row(r);
        }
    }
    let what = match run.kind {
        Kind::Parts => {
            "parts: each thread touches one byte per page of its own contiguous 1/T of the \
             data, through its own mapping"
        }
        Kind::Churn => "churn: each thread touches one byte per page of its own 1/T of the data",
    };
    let how = match (run.kind, run.duration) {
        (Kind::Churn, Some(d)) => format!(
            "\n  through its own mapping, MADV_DONTNEED after each pass, for {:.2} s, while one \
             more thread maps a {} KiB region\n  and unmaps the oldest of the {CHURN_LIVE} it \
             keeps, in a loop",
            d.as_secs_f64(),
            CHURN_PAGES * PAGE_SIZE as u64 / 1024
        ),
        _ => String::new(),
    };
    format!("{what}{how}\n{}", t.render())
}

/// A row: its label and the cell of a (thread count, column).
type Row = (&'static str, fn(&ScaleRun, u16, Column) -> String);

const PARTS_ROWS: [Row; 6] = [
    ("faults", |r, t, c| count(r, t, c, |s| s.faults)),
    ("time, seconds", |r, t, c| {
        r.value(t, c, |s| s.seconds)
            .map_or_else(String::new, |v| format!("{v:.6}"))
    }),
    ("faults/s", |r, t, c| rate(r, t, c, |s| s.faults_per_second)),
    ("vs kernel-memfd, time", |r, t, c| {
        let s = |c| r.value(t, c, |s| s.seconds);
        versus_kernel(c, || ratio(s(Column::KernelMemfd)?, s(c)?))
    }),
    ("vs global-mutex, faults/s", |r, t, c| {
        only(c, Setting::LockFree, || {
            r.versus_setting(t, c, Setting::GlobalMutex)
        })
    }),
    ("vs 1 thread, faults/s", |r, t, c| {
        if t == 1 {
            return String::new();
        }
        r.scaling(t, c).map_or_else(|| "-".into(), two)
    }),
];

const CHURN_ROWS: [Row; 12] = [
    ("faults", |r, t, c| count(r, t, c, |s| s.faults)),
    ("pages touched", |r, t, c| {
        count(r, t, c, |s| s.pages_touched)
    }),
    ("time, seconds", |r, t, c| {
        r.value(t, c, |s| s.seconds)
            .map_or_else(String::new, |v| format!("{v:.3}"))
    }),
    ("faults/s", |r, t, c| rate(r, t, c, |s| s.faults_per_second)),
    ("pages/s", |r, t, c| rate(r, t, c, |s| s.pages_per_second)),
    ("vs kernel-memfd, pages/s", |r, t, c| {
        let pps = |c| r.value(t, c, |s| s.pages_per_second);
        versus_kernel(c, || ratio(pps(c)?, pps(Column::KernelMemfd)?))
    }),
    ("vs classic, faults/s", |r, t, c| {
        only(c, Setting::Speculative, || {
            r.versus_setting(t, c, Setting::Classic)
        })
    }),
    ("churn maps/s", |r, t, c| {
        rate(r, t, c, |s| s.maps_per_second.unwrap_or(0.0))
    }),
    ("spf_success", |r, t, c| counter(r, t, c, |s| s.spf_success)),
    ("spf_abort", |r, t, c| counter(r, t, c, |s| s.spf_abort)),
    ("spf_fallback", |r, t, c| {
        counter(r, t, c, |s| s.spf_fallback)
    }),
    ("forwarded", |r, t, c| counter(r, t, c, |s| s.forwarded)),
];

fn count(run: &ScaleRun, threads: u16, column: Column, f: fn(&Summary) -> u64) -> String {
    run.cell(threads, column)
        .map_or_else(String::new, |c| units::count(f(&c.summary())))
}

fn rate(run: &ScaleRun, threads: u16, column: Column, f: fn(&Summary) -> f64) -> String {
    run.value(threads, column, f)
        .map_or_else(String::new, |v| units::count(v.round() as u64))
}

/// A counter of the median sample (faultmap columns).
fn counter(run: &ScaleRun, threads: u16, column: Column, f: fn(&Stats) -> u64) -> String {
    run.cell(threads, column)
        .and_then(|c| c.summary().stats)
        .map_or_else(String::new, |s| units::count(f(&s)))
}

/// A ratio against the kernel column: blank in the kernel's own.
fn versus_kernel(column: Column, value: impl FnOnce() -> Option<f64>) -> String {
    if column == Column::KernelMemfd {
        return String::new();
    }
    value().map_or_else(|| "-".into(), two)
}

/// A ratio shown only in the columns of `setting`.
fn only(column: Column, setting: Setting, value: impl FnOnce() -> Option<f64>) -> String {
    if column.setting() != Some(setting) {
        return String::new();
    }
    value().map_or_else(|| "-".into(), two)
}

fn two(v: f64) -> String {
    format!("{v:.2}")
}

/// The goals: what, the bound, the value, met or not.
fn goals(goals: &[Goal]) -> String {
    if goals.is_empty() {
        return String::new();
    }
    let mut t = Table::new(1).note_column(3);
    for g in goals {
        t.row([
            format!(
                "  {}, {} delivery",
                g.what,
                crate::delivery_name(g.delivery)
            ),
            format!("at least {:.2}", g.bound),
            format!("{:.2}", g.value),
            if g.met() { "met" } else { "NOT met" }.to_string(),
        ]);
    }
    format!("\ngoals\n{}", t.render())
}

/// What the counters showed that the reader should know: a classic column
/// whose faults were resolved speculatively is not the comparison it claims
/// to be.
fn notes(run: &ScaleRun) -> String {
    let mut out = String::new();
    for cell in &run.cells {
        let Column::Faultmap {
            setting: Setting::Classic,
            delivery,
        } = cell.column
        else {
            continue;
        };
        let Some(stats) = cell.summary().stats.filter(|s| s.spf_success > 0) else {
            continue;
        };
        out.push_str(&format!(
            "\nnote: classic, {} delivery, {} thread(s): the library resolved {} of {} faults \
             on a speculatively found region (spf_success), so this column does not measure \
             the classic lookup.\n",
            crate::delivery_name(delivery),
            cell.threads,
            units::count(stats.spf_success),
            units::count(stats.pgfault)
        ));
    }
    out
}

fn legend(kind: Kind) -> &'static str {
    match kind {
        Kind::Parts => {
            "\nfaults: faultmap's pgfault (one per page at order 0), or the process's getrusage \
             minor faults (kernel-memfd); all threads together.\n\
             vs kernel-memfd, time: kernel-memfd's median time over the column's (above 1, the \
             column was faster).\n\
             vs global-mutex: lock-free's faults/s over global-mutex's; vs 1 thread: the \
             column's faults/s over its own at 1 thread (linear scaling: the thread count).\n"
        }
        Kind::Churn => {
            "\nfaults: faultmap's pgfault (one per page touched at order 0), or the process's \
             getrusage minor faults (kernel-memfd); all faulting threads together.\n\
             vs kernel-memfd, pages/s: the column's pages touched per second over \
             kernel-memfd's; vs classic: speculative's faults/s over classic's, same delivery.\n\
             churn maps/s: regions the churn thread mapped (and unmapped) per second.\n\
             spf_success, spf_abort, spf_fallback, forwarded: the pager's counters of the \
             median sample (faults resolved on a speculatively found region; speculative \
             attempts that found their region changing; faults the speculative lookup did not \
             find; faults a SIGBUS handler forwarded to a pager thread).\n"
        }
    }
}
