//! Units: reading sizes from the command line and printing quantities.
//!
//! Sizes are powers of 1024 (`K`, `M`, `G`, `T`, optionally followed by
//! `iB` or `B`, any case), as everywhere in memory management. Counts are
//! printed with thousands separators (`262,144`).

use std::time::Duration;

const KIB: u64 = 1024;

pub use faultmap::parse_size;

/// `1234567` as `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count in the largest binary unit that keeps it at least 1
/// (`1.00 GiB`, `4.00 KiB`, `17 B`).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < KIB {
        return format!("{n} B");
    }
    let mut value = n as f64 / KIB as f64;
    let mut unit = 0;
    while value >= KIB as f64 && unit + 1 < UNITS.len() {
        value /= KIB as f64;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Bytes per second over `elapsed`, as `1.23 GiB/s` (or `-` for no time).
pub fn throughput(n: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return "-".into();
    }
    format!("{}/s", bytes((n as f64 / secs) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size(" 512K "), Ok(512 << 10));
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("1X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn prints_counts_and_bytes() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(262_144), "262,144");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(bytes(17), "17 B");
        assert_eq!(bytes(4096), "4.00 KiB");
        assert_eq!(bytes(1 << 30), "1.00 GiB");
        assert_eq!(throughput(1 << 30, Duration::from_secs(2)), "512.00 MiB/s");
    }
}
