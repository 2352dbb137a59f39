//! `faultmap`: the command-line face of the faultmap pager.
//!
//! This file holds only the command line (clap definitions, with the help
//! text of every command and option) and the dispatch to the modules that do
//! the work:
//!
//! - [`scan`]: map a file through faultmap, read every byte, print its CRC-32;
//! - [`bench`](mod@bench): the seed benchmarks, faultmap against kernel `mmap` in one
//!   run (seed 000's fault-around table);
//! - [`units`] and [`table`]: parsing and printing helpers shared by both.
//!
//! Errors are `anyhow` chains printed as one line on stderr, with exit code
//! 1; clap's own usage errors exit with 2. Nothing on a bad input panics:
//! even a closed stdout (`faultmap scan f | head -c1`) is an error, not a
//! panic, because every command writes through a `Write` whose errors it
//! returns.

mod bench;
mod scan;
mod table;
mod units;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::bench::workload::Workload;

/// A user-space pager on userfaultfd with the Linux kernel's fault-path
/// algorithms.
///
/// faultmap maps an object (a file, a buffer) and serves its page faults in
/// user space with the kernel's fault-around algorithm. Linux 6.6 or later.
/// As root (or with read-write access to /dev/userfaultfd) it also serves
/// the faults the kernel takes on the program's behalf; see the README.
#[derive(Debug, Parser)]
#[command(name = "faultmap", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Map a file through faultmap, read every byte, print its CRC-32 and the
    /// fault counters.
    ///
    /// The CRC-32 is the IEEE one (zlib's, Python's `zlib.crc32`), so the
    /// output can be checked against any other tool. With several threads
    /// the mapping is cut into contiguous parts, each thread checksums its
    /// part, and the parts' CRCs are combined in order.
    Scan(ScanArgs),
    /// Run the seed benchmarks: faultmap at each fault-around order against
    /// the kernel's mmap of the same data, in one process, one after another.
    ///
    /// Reproduces seed 000's fault-around table: for each workload, the
    /// faults and the time (median of the repetitions) per thread count and
    /// per engine, plus the time ratios of the kernel baselines to faultmap.
    ///
    /// Engines: `kernel-file` is the kernel's mmap of the file, its page
    /// cache re-read and checked resident (mincore) before every repetition;
    /// the header says whether its folios were large or 4 KiB. `kernel-memfd`
    /// is the kernel's mmap of a memfd holding the same bytes (4 KiB shmem
    /// pages): the like-for-like baseline, since faultmap's cache is a memfd
    /// too. `order=N` is faultmap with fault-around windows of 2^N pages; its
    /// cache is filled once before the runs, so like the kernel's they measure
    /// warm minor faults.
    ///
    /// Each thread has its own mapping of the same data and walks the whole
    /// of it (so faults scale with threads, as in the seed); the threads start
    /// together, and the time is from their start to the last one's end.
    Bench(BenchArgs),
}

/// Options of `faultmap scan`.
#[derive(Debug, Args)]
struct ScanArgs {
    /// The file to read (a regular file; directories, FIFOs and devices are
    /// refused).
    file: PathBuf,
    /// Fault-around order: each fault maps a window of 2^N pages (0..=9).
    #[arg(long, short, default_value_t = 4, value_name = "N")]
    order: u8,
    /// Threads reading the mapping, each a contiguous part of it.
    #[arg(long, short, default_value_t = 1, value_name = "T",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// faultmap handler threads serving the faults.
    #[arg(long, default_value_t = 1, value_name = "H",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    handler_threads: u16,
    /// Print one JSON object instead of the human-readable report.
    #[arg(long)]
    json: bool,
}

/// Options of `faultmap bench`.
#[derive(Debug, Args)]
struct BenchArgs {
    /// Workloads, comma-separated (seed 000's three synthetic tests).
    ///
    /// Each thread walks the whole file, in its own mapping.
    ///
    /// rand differs from the seed's fully random word order on purpose: the
    /// pages are visited in a random permutation (fixed seed, one per
    /// thread) and the words of each page in order. Fault-around only sees
    /// the order of the pages' first touches, which is fully random either
    /// way, so the faults are those of a random word order, while a run
    /// takes seconds instead of minutes of cache and TLB misses.
    #[arg(
        long,
        short,
        value_enum,
        value_delimiter = ',',
        default_value = "seq,rand,sparse",
        value_name = "LIST"
    )]
    workload: Vec<Workload>,
    /// faultmap fault-around orders to measure (windows of 2^N pages, 0..=9),
    /// comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,1,3,4,5,7,9",
        value_name = "LIST"
    )]
    orders: Vec<u8>,
    /// Thread counts, comma-separated; each thread maps and walks the whole
    /// file.
    #[arg(long, short, value_delimiter = ',', default_value = "1,2", value_name = "LIST",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Vec<u16>,
    /// Size of the generated data file: bytes, or with a K, M or G suffix
    /// (powers of 1024), e.g. 512M.
    #[arg(long, short, default_value = "1G", value_parser = units::parse_size,
          conflicts_with = "file", value_name = "SIZE")]
    size: u64,
    /// Benchmark this existing file instead of a generated one (it must not
    /// change during the run).
    #[arg(long, short, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Samples of every cell; the report gives the median (and the min in
    /// JSON). Default: 3 per cell, and up to 11 for the cells that are cheap
    /// enough (2 s per cell in all, within a 150 s run); each JSON row says
    /// how many it has.
    #[arg(long, short, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    repetitions: Option<u32>,
    /// faultmap handler threads serving the faults.
    #[arg(long, default_value_t = 1, value_name = "H",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    handler_threads: u16,
    /// Print only one JSON document, {"machine": {...}, "results": [...]},
    /// on stdout (progress and notes still go to stderr).
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Scan(args) => scan::run(&args),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Not eprintln!: it panics when stderr is closed.
            // `{:#}`: the error and its causes on one line, `: `-separated.
            let _ = writeln!(std::io::stderr(), "faultmap: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
