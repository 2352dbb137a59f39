//! Write-back throughput and the cost of a first write, for the write-back
//! design notes (`crate::writeback`).
//!
//! ```text
//! cargo run --release -p faultmap --example flush_rate -- [FILE] [MIB] [REPS]
//! ```
//!
//! FILE (default `target/flush_rate.bin`) is made MIB MiB long (default
//! 256). Each repetition (default 3), interleaved:
//!
//! - **flush**: dirties every byte of a writable mapping of FILE (signal
//!   delivery), then times `MappingMut::flush` of the whole mapping (store
//!   writes with `pwrite` in runs of up to 8 MiB, then `fdatasync`);
//! - **pwrite+fsync**: the same bytes from a buffer, one `pwrite` of the
//!   whole length and `fdatasync`, on the same file;
//! - **first write** per delivery: every page of a writable mapping is read
//!   first (mapped write-protected), then one byte per page is written, in
//!   order: each write is one synchronous write-protect fault (unprotect +
//!   DIRTY). Timed per page.
//!
//! Medians over the repetitions, with the range.

use std::error::Error;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use faultmap::{Config, Delivery, FileStore, MapOptions, Pager, PAGE_SIZE};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn fmt(name: &str, unit: &str, mut v: Vec<f64>) {
    let (lo, hi) = (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "{name:<34} {:>9.2} {unit}  ({lo:.2}..{hi:.2})",
        median(&mut v)
    );
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "target/flush_rate.bin".into()),
    );
    let mib: usize = args.next().map_or(Ok(256), |s| s.parse())?;
    let reps: usize = args.next().map_or(Ok(3), |s| s.parse())?;
    let len = mib << 20;
    std::fs::write(&path, vec![0u8; len])?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)?;
    file.sync_all()?;
    let mb = len as f64 / 1e6;
    let (mut flush, mut pwrite, mut dirty) = (Vec::new(), Vec::new(), Vec::new());
    let mut first_write: Vec<(Delivery, Vec<f64>, Vec<f64>)> = vec![
        (Delivery::Signal, Vec::new(), Vec::new()),
        (Delivery::Handler, Vec::new(), Vec::new()),
    ];
    for rep in 0..reps {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        eprintln!("repetition {} of {reps}, load {}", rep + 1, load.trim());
        let byte = rep as u8 + 1;
        // flush.
        {
            let pager = Pager::new(Config::default())?;
            let store = FileStore::open_rw(&path)?;
            // SAFETY: the example's own scratch file; nothing else writes it
            // while it is mapped.
            let mut map = unsafe { pager.map_mut(store, MapOptions::new())? };
            let t = Instant::now();
            map.fill(byte);
            dirty.push(t.elapsed().as_secs_f64() * 1e9 / (len / PAGE_SIZE) as f64);
            let t = Instant::now();
            let pages = map.flush(0..map.len())?;
            flush.push(mb / t.elapsed().as_secs_f64());
            assert_eq!(pages as usize, len / PAGE_SIZE);
        }
        // pwrite + fsync of the same bytes.
        {
            let buf = vec![byte.wrapping_add(100); len];
            let t = Instant::now();
            file.write_all_at(&buf, 0)?;
            file.sync_data()?;
            pwrite.push(mb / t.elapsed().as_secs_f64());
        }
        // First write to a clean, mapped page.
        for (delivery, samples, minor) in &mut first_write {
            let pager = Pager::new(Config::default().delivery(*delivery))?;
            let object = pager.open(FileStore::open_rw(&path)?)?;
            // SAFETY: as above; this is the object's only mapping.
            let mut map =
                unsafe { pager.map_mut(&object, MapOptions::new().fault_around_order(9))? };
            let mut sum = 0u64;
            for p in (0..len).step_by(PAGE_SIZE) {
                sum += u64::from(map[p]);
            }
            std::hint::black_box(sum);
            // The same machine's read fault, for scale: a second mapping
            // of the cached object, one MINOR fault per page (order 0).
            {
                // SAFETY: as above; the writable mapping is dropped by now.
                let ro = unsafe { pager.map(&object, MapOptions::new().fault_around_order(0))? };
                let t = Instant::now();
                for p in (0..len).step_by(PAGE_SIZE) {
                    sum += u64::from(ro[p]);
                }
                std::hint::black_box(sum);
                minor.push(t.elapsed().as_secs_f64() * 1e6 / (len / PAGE_SIZE) as f64);
            }
            let before = map.stats().write_faults;
            let t = Instant::now();
            for p in (0..len).step_by(PAGE_SIZE) {
                map[p] = byte;
            }
            let ns = t.elapsed().as_secs_f64() * 1e9;
            let faults = map.stats().write_faults - before;
            assert_eq!(faults as usize, len / PAGE_SIZE, "one WP fault per page");
            samples.push(ns / faults as f64 / 1000.0);
            map.flush(0..map.len())?;
        }
    }
    println!("{mib} MiB, {reps} repetitions (median, range)");
    fmt("flush (faultmap, pwrite runs+fsync)", "MB/s", flush);
    fmt("pwrite + fdatasync", "MB/s", pwrite);
    fmt("dirtying: memset through mapping", "ns/page", dirty);
    for (d, v, minor) in first_write {
        fmt(&format!("first write, WP fault, {d:?}"), "us/page", v);
        fmt(
            &format!("read, MINOR fault (scale), {d:?}"),
            "us/page",
            minor,
        );
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(())
}
