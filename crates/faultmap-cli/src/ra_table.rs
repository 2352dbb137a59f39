//! The readahead table (one row per readahead pattern) and the counters that go with it, as text;
//! shared by `faultmap stats` and the cold benchmark's report.
//!
//! ```text
//!   pattern     ra_count  io_count  sync_count  eof_count  ra_size  async_size  io_size
//!   initial            4         4           4          0      4.0         3.0      4.0
//!   subsequent       275       165           2         33     32.0        31.0     33.0
//!   ...
//!   all            1,200       953         761        523     25.0        15.0     11.0
//!
//!   pgmajfault                   225
//!   fault_wait                    12
//!   io_count                     953
//!   io_bytes              42,938,368  (40.95 MiB)
//!   readahead miss ratio       32.4%  (3,666 of 11,312 pages read ahead never mapped)
//!   pgfault                      ...  (then the other counters, in the library's order)
//! ```
//!
//! Counts are the table's rows' sums; `ra_size`, `async_size` and
//! `io_size` are means in pages, with one decimal.

use faultmap::{RaStats, Stats};

use crate::table::Table;
use crate::units;

/// The counters shown first, in this order, before the miss ratio.
const FIRST: [&str; 4] = ["pgmajfault", "fault_wait", "io_count", "io_bytes"];

/// The per-pattern readahead table.
pub fn ra_table(ra: &RaStats) -> String {
    let mut t = Table::new(1);
    t.row([
        "pattern",
        "ra_count",
        "io_count",
        "sync_count",
        "eof_count",
        "ra_size",
        "async_size",
        "io_size",
    ]);
    for (name, row) in ra.rows() {
        t.row([
            name.to_string(),
            units::count(row.ra_count),
            units::count(row.io_count),
            units::count(row.sync_count),
            units::count(row.eof_count),
            format!("{:.1}", row.ra_size),
            format!("{:.1}", row.async_size),
            format!("{:.1}", row.io_size),
        ]);
    }
    t.render()
}

/// The readahead miss ratio, and a note of what it is made of.
pub fn miss_ratio(ra: &RaStats) -> (String, String) {
    match ra.miss_ratio {
        Some(ratio) => (
            percent(ratio),
            format!(
                "({} of {} pages read ahead never mapped)",
                units::count(ra.read_ahead_pages.saturating_sub(ra.read_ahead_used)),
                units::count(ra.read_ahead_pages)
            ),
        ),
        None => ("-".into(), "(no page was read ahead)".into()),
    }
}

/// A ratio as a percentage with one decimal.
pub fn percent(ratio: f64) -> String {
    format!("{:.1}%", 100.0 * ratio)
}

/// `pgmajfault`, `fault_wait`, `io_count`, `io_bytes`, the readahead miss
/// ratio, then every other counter.
pub fn counters(stats: &Stats, ra: &RaStats) -> String {
    let fields = stats.fields();
    let mut t = Table::new(1).note_column(2);
    for name in FIRST {
        if let Some(&(_, value)) = fields.iter().find(|(n, _)| *n == name) {
            let note = if name == "io_bytes" {
                format!("({})", units::bytes(value))
            } else {
                String::new()
            };
            t.row([name.to_string(), units::count(value), note]);
        }
    }
    let (ratio, note) = miss_ratio(ra);
    t.row(["readahead miss ratio".to_string(), ratio, note]);
    for (name, value) in fields.iter().filter(|(n, _)| !FIRST.contains(n)) {
        t.row([name.to_string(), units::count(*value)]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_the_seed_rows_and_columns() {
        let mut ra = RaStats::default();
        ra.around.ra_count = 383;
        ra.around.ra_size = 60.0;
        ra.all.ra_count = 1002;
        let text = ra_table(&ra);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7);
        assert!(lines[0].starts_with("pattern") && lines[0].ends_with("io_size"));
        for (line, name) in
            lines[1..]
                .iter()
                .zip(["initial", "subsequent", "marker", "around", "random", "all"])
        {
            assert!(line.starts_with(name), "{line}");
        }
        assert!(lines[4].contains("383") && lines[4].contains("60.0"));
        assert!(lines[6].contains("1,002"));
    }

    #[test]
    fn counters_come_in_order_with_the_miss_ratio() {
        let stats = Stats {
            pgmajfault: 225,
            io_bytes: 4096,
            ..Stats::default()
        };
        let ra = RaStats {
            read_ahead_pages: 1000,
            read_ahead_used: 684,
            miss_ratio: Some(0.316),
            ..RaStats::default()
        };
        let text = counters(&stats, &ra);
        let pos = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} in {text}"));
        assert!(pos("pgmajfault") < pos("fault_wait"));
        assert!(pos("io_bytes") < pos("readahead miss ratio"));
        assert!(pos("readahead miss ratio") < pos("pgfault "));
        assert!(text.contains("31.6%  (316 of 1,000"), "{text}");
        assert!(text.contains("(4.00 KiB)"));
        assert_eq!(miss_ratio(&RaStats::default()).0, "-");
    }
}
