//! Shadows of evicted pages and the nonresident age: the state behind
//! workingset detection (`crate::policy::workingset` is the decision).
//!
//! When the hand evicts a page it leaves a shadow, the budget's
//! nonresident age at that moment, as the kernel leaves a shadow entry in
//! the page cache's xarray slot. Shadows are kept per object in a map from
//! page to age, pruned of shadows too old to matter once the map outgrows
//! the threshold (the kernel bounds its shadow nodes by memory the same
//! way).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::policy::workingset::is_refault;

/// One object's shadows: page → age at eviction.
#[derive(Default)]
pub(crate) struct Shadows {
    map: Mutex<HashMap<u64, u64>>,
    /// The map's size, to skip the lock while there are none.
    len: AtomicUsize,
}

impl Shadows {
    /// Records that pages `pages` were evicted at ages `first_age`,
    /// `first_age + step`, ... (`step`: the age one page counts for, in
    /// 4 KiB pages: 512 for a page of 2 MiB); then prunes shadows older
    /// than `threshold` if the map grew too large.
    pub(crate) fn record(&self, pages: &[u64], first_age: u64, step: u64, threshold: u64) {
        if pages.is_empty() {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &p) in pages.iter().enumerate() {
            map.insert(p, first_age + i as u64 * step);
        }
        let now = first_age + pages.len() as u64 * step;
        if map.len() as u64 > threshold.saturating_add(1024) {
            map.retain(|_, &mut age| is_refault(now, age, threshold));
        }
        self.len.store(map.len(), Ordering::Relaxed);
    }

    /// Takes the shadows of `pages` (being read now, at age `now`): returns
    /// the pages that are refaults.
    pub(crate) fn take_refaults(
        &self,
        pages: impl Iterator<Item = u64>,
        now: u64,
        threshold: u64,
    ) -> Vec<u64> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let out = pages
            .filter(|p| {
                map.remove(p)
                    .is_some_and(|age| is_refault(now, age, threshold))
            })
            .collect();
        self.len.store(map.len(), Ordering::Relaxed);
        out
    }

    /// Forgets every shadow of `pages` (invalidated: what comes back is a
    /// new read, not a refault).
    pub(crate) fn forget(&self, pages: std::ops::Range<u64>) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if (pages.end - pages.start) as usize > map.len() {
            map.retain(|p, _| !pages.contains(p));
        } else {
            for p in pages {
                map.remove(&p);
            }
        }
        self.len.store(map.len(), Ordering::Relaxed);
    }
}

/// The nonresident age: a counter of evictions, in 4 KiB pages (a page of
/// 2 MiB counts 512; `lruvec->nonresident_age`).
#[derive(Default)]
pub(crate) struct Age(AtomicU64);

impl Age {
    /// The current age.
    pub(crate) fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Advances the age by `n` evicted 4 KiB pages; returns the age of the
    /// first.
    pub(crate) fn advance(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_page_back_within_the_threshold_is_a_refault() {
        let s = Shadows::default();
        s.record(&[7, 8], 100, 1, 512);
        assert_eq!(s.take_refaults([7].into_iter(), 260, 512), vec![7]);
        assert!(
            s.take_refaults([7].into_iter(), 260, 512).is_empty(),
            "taken once"
        );
        assert!(
            s.take_refaults([8].into_iter(), 1000, 512).is_empty(),
            "too old"
        );
        assert!(
            s.take_refaults([9].into_iter(), 101, 512).is_empty(),
            "never evicted"
        );
    }

    #[test]
    fn invalidated_pages_are_not_refaults() {
        let s = Shadows::default();
        s.record(&[1, 2, 3], 0, 1, 100);
        s.forget(2..3);
        assert_eq!(s.take_refaults(1..4, 5, 100), vec![1, 3]);
    }

    proptest! {
        /// The map stays bounded whatever is evicted, and pruning never
        /// drops a shadow that would still count as a refault.
        #[test]
        fn pruning_keeps_what_matters(
            pages in proptest::collection::vec(0u64..5000, 1..400),
            threshold in 1u64..300,
        ) {
            let s = Shadows::default();
            let mut age = 0;
            for chunk in pages.chunks(7) {
                s.record(chunk, age, 1, threshold);
                age += chunk.len() as u64;
            }
            let len = s.map.lock().unwrap().len() as u64;
            prop_assert!(len <= threshold + 1024 + 7);
            // The most recent eviction of each page within the threshold
            // is still there.
            let mut last = HashMap::new();
            for (a, &p) in pages.iter().enumerate() {
                last.insert(p, a as u64);
            }
            for (&p, &at) in &last {
                if is_refault(age, at, threshold) {
                    prop_assert_eq!(s.map.lock().unwrap().get(&p).copied(), Some(at));
                }
            }
        }
    }
}
