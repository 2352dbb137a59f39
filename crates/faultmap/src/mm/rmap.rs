//! Object-based reverse mapping (the objrmap series): which regions map a page.
//!
//! Every object keeps the regions that map it in an interval tree keyed by
//! the object pages they cover, the way the kernel keeps a file's VMAs in
//! `mapping->i_mmap`, keyed by `[vm_pgoff, vm_pgoff + pages)`. "Unmap object
//! pages R everywhere" (the CLOCK hand's sampling, eviction, invalidation)
//! asks the tree for the regions that overlap R: O(log n + hits), never a
//! per-page list of mappings, never a walk over every region of the object.
//!
//! ```text
//!   object pages   0        100       200       300       400
//!   region A       [---------------------)                      pages 0..250
//!   region B                 [----------)                         pages 120..200
//!   region C                                    [--------)        pages 320..400
//!   query 180..190             A, B
//! ```
//!
//! The tree is `iset`'s augmented red-black tree (each node keeps the
//! largest end in its subtree, as `rb_subtree_last` does). Several regions
//! can cover the same pages, so a key holds every region with that exact
//! interval. A region is told apart from the others by its identity, not
//! by its start address: two regions can have the same interval *and* the
//! same start (a successor moved where another pager's region of the
//! object still is, until that pager reads its UNMAP event:
//! `crate::mm::events`), and forgetting one must keep the other. Regions
//! are held weakly: the tree never keeps a region alive, and a region
//! being dropped is skipped.
//!
//! Locking: a read-write lock, as `i_mmap_rwsem`: written by map and unmap,
//! read by the walkers. Never taken on the fault path.

use std::ops::Range;
use std::sync::{Arc, RwLock, Weak};

use iset::IntervalMap;

use crate::base::index::ObjectPage;
use crate::mm::space::Region;

/// The regions that map one object, by the object pages they cover.
/// Generic over the region type only so that the property test can run it
/// on plain values.
pub(crate) struct Rmap<R = Region> {
    tree: RwLock<Tree<R>>,
}

/// Interval → the regions (weak handles) with exactly it.
type Tree<R> = IntervalMap<ObjectPage, Vec<Weak<R>>>;

impl<R> Default for Rmap<R> {
    fn default() -> Self {
        Self {
            tree: RwLock::new(IntervalMap::new()),
        }
    }
}

impl<R> Rmap<R> {
    /// Records that `region` maps object pages `pages`.
    pub(crate) fn insert(&self, pages: Range<ObjectPage>, region: &Arc<R>) {
        if pages.is_empty() {
            return;
        }
        let mut tree = self.tree.write().unwrap_or_else(|e| e.into_inner());
        let entry = Arc::downgrade(region);
        match tree.get_mut(pages.clone()) {
            Some(list) => list.push(entry),
            None => {
                tree.insert(pages, vec![entry]);
            }
        }
    }

    /// Forgets `region`, which mapped `pages`.
    pub(crate) fn remove(&self, pages: Range<ObjectPage>, region: &R) {
        if pages.is_empty() {
            return;
        }
        let mut tree = self.tree.write().unwrap_or_else(|e| e.into_inner());
        let now_empty = match tree.get_mut(pages.clone()) {
            Some(list) => {
                list.retain(|w| !std::ptr::eq(w.as_ptr(), region));
                list.is_empty()
            }
            None => false,
        };
        if now_empty {
            tree.remove(pages);
        }
    }

    /// The live regions that map any of object pages `pages`.
    pub(crate) fn overlapping(&self, pages: Range<ObjectPage>) -> Vec<Arc<R>> {
        if pages.is_empty() {
            return Vec::new();
        }
        let tree = self.tree.read().unwrap_or_else(|e| e.into_inner());
        tree.values(pages)
            .flat_map(|list| list.iter().filter_map(Weak::upgrade))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pages(r: Range<u64>) -> Range<ObjectPage> {
        ObjectPage(r.start)..ObjectPage(r.end)
    }

    proptest! {
        /// Inserts and removes (several regions may share an interval),
        /// then overlap queries: the tree's answer is exactly a naive
        /// scan's.
        #[test]
        fn overlap_queries_match_a_naive_scan(
            ops in proptest::collection::vec((0u64..64, 1u64..32, any::<bool>(), 0usize..40), 1..120),
            queries in proptest::collection::vec((0u64..96, 1u64..40), 1..20),
        ) {
            let rmap: Rmap<usize> = Rmap::default();
            let mut live: Vec<(Range<u64>, Arc<usize>)> = Vec::new();
            for (i, (start, len, remove, pick)) in ops.into_iter().enumerate() {
                if remove && !live.is_empty() {
                    let (r, id) = live.remove(pick % live.len());
                    rmap.remove(pages(r), &*id);
                } else {
                    let r = start..start + len;
                    let id = Arc::new(i);
                    rmap.insert(pages(r.clone()), &id);
                    live.push((r, id));
                }
            }
            for (qs, ql) in queries {
                let q = qs..qs + ql;
                let mut want: Vec<usize> = live
                    .iter()
                    .filter(|(r, _)| r.start < q.end && q.start < r.end)
                    .map(|(_, id)| **id)
                    .collect();
                want.sort_unstable();
                let mut got: Vec<usize> = rmap.overlapping(pages(q)).iter().map(|a| **a).collect();
                got.sort_unstable();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn dropped_regions_are_skipped_and_empty_queries_answer_nothing() {
        let rmap: Rmap<u32> = Rmap::default();
        assert!(rmap.overlapping(pages(0..10)).is_empty());
        let a = Arc::new(1);
        rmap.insert(pages(0..10), &a);
        assert!(rmap.overlapping(pages(5..5)).is_empty());
        assert_eq!(rmap.overlapping(pages(0..u64::MAX)).len(), 1);
        drop(a);
        assert!(rmap.overlapping(pages(0..10)).is_empty(), "held weakly");
    }

    /// A successor moved where another pager's region of the object still
    /// is (same object pages, same start address), until that pager reads
    /// its UNMAP event and forgets its region: the successor stays listed.
    /// (With regions keyed by start address, forgetting one forgot both,
    /// and write-back no longer write-protected the successor's pages.)
    #[test]
    fn regions_sharing_interval_and_start_are_forgotten_one_by_one() {
        let rmap: Rmap<u32> = Rmap::default();
        let (stale, moved) = (Arc::new(1), Arc::new(2));
        rmap.insert(pages(0..10), &stale);
        rmap.insert(pages(0..10), &moved);
        rmap.remove(pages(0..10), &stale);
        let left: Vec<u32> = rmap.overlapping(pages(0..10)).iter().map(|a| **a).collect();
        assert_eq!(
            left,
            vec![2],
            "forgetting the stale region forgot the successor"
        );
        rmap.remove(pages(0..10), &moved);
        assert!(rmap.overlapping(pages(0..10)).is_empty());
    }
}
