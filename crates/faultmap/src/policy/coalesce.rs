//! Batched prefetch: which requests to make for a list of byte ranges.
//!
//! A caller that knows its next accesses (a batch of sample indices, the
//! tensors a layer needs, a query's row groups) hands them over at once
//! (`Mapping::prefetch_ranges`). Each range becomes pages; pages closer
//! than a *hole limit* are read in one request, holes and all, as long as
//! the request stays under a *request limit*; the requests then go out
//! together. Reading a hole costs its bytes; a request of its own costs a
//! first-byte latency. Arrow's `ReadRangeCache::MakeFromNetworkMetrics`
//! sets the hole limit to latency × bandwidth: a hole that takes less than
//! a round trip to transfer is cheaper read than skipped.
//!
//! That rule assumes the requests go one after another. faultmap sends up
//! to `io_depth` at once, and with `d` requests in flight another request
//! costs about a `d`-th of a round trip of wall time, while the hole's
//! bytes still cross the one link. So the hole limit here is
//! latency × bandwidth / `d` ([`hole_pages`]): with 32 in flight, a
//! 20 ms, 1 GB/s link merges holes under about 600 KiB, where Arrow's rule
//! would read 20 MB holes (and a batch of random rows would fetch most of
//! a large object). `d = 1` gives Arrow's rule.
//!
//! The request limit is the store's request size (`Store::io_pages`, 8 MiB
//! for a remote store, within S3's guidance of 8 to 16 MiB): a longer
//! merge would be split into such requests anyway, and several requests of
//! that size in flight move more bytes per round trip than one large one.
//!
//! Pure: a function of page ranges and two limits.

use std::ops::Range;
use std::time::Duration;

/// The hole limit in pages (see the module doc): the bytes
/// `latency × bytes_per_sec / depth` can move, rounded down to whole
/// pages. 0 merges only ranges that touch or overlap.
pub fn hole_pages(latency: Duration, bytes_per_sec: u64, depth: usize, page_size: u64) -> u64 {
    let bytes = latency.as_secs_f64() * bytes_per_sec as f64 / depth.max(1) as f64;
    if !bytes.is_finite() || bytes <= 0.0 {
        return 0;
    }
    // `as` saturates: an absurd product is a huge limit, never a wrap.
    (bytes as u64) / page_size.max(1)
}

/// The requests for page ranges `ranges` (in any order, overlapping or
/// empty): sorted, disjoint, covering every page of every range. Two
/// neighbouring runs are merged when the hole between them has at most
/// `hole` pages and the merged request has at most `max` pages; a run
/// longer than `max` is cut into pieces of `max` pages. `max` is taken as
/// at least 1.
pub fn coalesce(ranges: &[Range<u64>], hole: u64, max: u64) -> Vec<Range<u64>> {
    let max = max.max(1);
    let runs = union(ranges);
    // Requests: a run joins the request before it when the hole is
    //    small and the request stays within `max`; else it starts its own,
    //    cut into pieces of `max`.
    let mut out: Vec<Range<u64>> = Vec::with_capacity(runs.len());
    for run in runs {
        if let Some(last) = out.last_mut() {
            if run.start - last.end <= hole && run.end - last.start <= max {
                last.end = run.end;
                continue;
            }
        }
        let mut start = run.start;
        while start < run.end {
            let end = start.saturating_add(max).min(run.end);
            out.push(start..end);
            start = end;
        }
    }
    out
}

/// The union of `ranges` (in any order, overlapping or empty): sorted,
/// disjoint runs, two that touch made one.
pub fn union(ranges: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_unstable_by_key(|r| r.start);
    let mut runs: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match runs.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => runs.push(r),
        }
    }
    runs
}

#[cfg(test)]
// A list of one range is a list of ranges here, not a range made a list.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn close_ranges_merge_far_ones_do_not() {
        // Pages 0, 2 and 10: a hole of 1 merges, one of 7 does not.
        let got = coalesce(&[10..11, 0..1, 2..3], 1, 256);
        assert_eq!(got, vec![0..3, 10..11]);
        assert_eq!(coalesce(&[10..11, 0..1, 2..3], 7, 256), vec![0..11]);
        // Overlaps and touching ranges are one run whatever the hole.
        assert_eq!(coalesce(&[0..4, 2..6, 6..8], 0, 256), vec![0..8]);
        assert_eq!(coalesce(&[], 4, 8), Vec::<Range<u64>>::new());
        assert_eq!(coalesce(&[5..5], 4, 8), Vec::<Range<u64>>::new());
    }

    #[test]
    fn a_merge_stops_at_the_request_limit_and_long_runs_are_cut() {
        assert_eq!(coalesce(&[0..2, 3..5, 6..8], 1, 5), vec![0..5, 6..8]);
        assert_eq!(coalesce(&[0..10], 0, 4), vec![0..4, 4..8, 8..10]);
    }

    #[test]
    fn the_hole_limit_is_a_share_of_a_round_trip() {
        let ms20 = Duration::from_millis(20);
        // Arrow's rule at depth 1: 20 ms at 1 GB/s is 20 MB.
        assert_eq!(hole_pages(ms20, 1_000_000_000, 1, 4096), 20_000_000 / 4096);
        // A 32nd of it with 32 in flight.
        assert_eq!(hole_pages(ms20, 1_000_000_000, 32, 4096), 625_000 / 4096);
        assert_eq!(hole_pages(Duration::ZERO, 1 << 30, 8, 4096), 0);
        assert_eq!(hole_pages(ms20, 0, 0, 0), 0);
        assert!(hole_pages(Duration::MAX, u64::MAX, 1, 4096) > 0);
    }

    fn ranges() -> impl Strategy<Value = Vec<Range<u64>>> {
        prop::collection::vec((0u64..2000, 0u64..40).prop_map(|(s, l)| s..s + l), 0..40)
    }

    proptest! {
        #[test]
        fn requests_cover_every_page_and_respect_both_limits(
            rs in ranges(),
            hole in 0u64..64,
            max in 1u64..128,
        ) {
            let got = coalesce(&rs, hole, max);
            // Sorted, disjoint, non-empty, none longer than `max`.
            for w in got.windows(2) {
                prop_assert!(w[0].end <= w[1].start, "{got:?}");
            }
            for r in &got {
                prop_assert!(r.start < r.end && r.end - r.start <= max, "{got:?}");
            }
            // Every asked page is in a request.
            for r in &rs {
                for p in r.clone() {
                    prop_assert!(got.iter().any(|g| g.contains(&p)), "page {p} of {got:?}");
                }
            }
            // A page read but not asked for lies in a hole of at most
            // `hole` pages between asked pages.
            let asked = |p: u64| rs.iter().any(|r| r.contains(&p));
            for g in &got {
                let mut gap = 0u64;
                for p in g.clone() {
                    if asked(p) {
                        gap = 0;
                    } else {
                        gap += 1;
                        prop_assert!(gap <= hole, "hole over {hole} at {p} in {got:?}");
                    }
                }
                prop_assert!(asked(g.start) && asked(g.end - 1), "{g:?} ends in a hole");
            }
            // Two requests in a row are apart by more than `hole`, or
            // merging them would pass `max` (else they would be one).
            for w in got.windows(2) {
                let merged = w[1].end - w[0].start;
                prop_assert!(w[1].start - w[0].end > hole || merged > max, "{got:?}");
            }
        }
    }
}
