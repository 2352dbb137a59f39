//! Workingset detection: telling a refault from a first read
//! (`mm/workingset.c`).
//!
//! When the hand evicts a page, it leaves a *shadow*: the value of the
//! budget's nonresident age counter, which counts evictions. When a miss
//! later reads that page again, the distance `now - shadow` is how many
//! pages were evicted in between: the page's *refault distance*. A page
//! whose refault distance is small was evicted too early: it belongs to the
//! working set, and it goes straight into the active set instead of
//! starting over on the inactive side, where the next scan would push it
//! out again.
//!
//! ```text
//!   age:      100          160                     260
//!   page 7:   evicted ---------------------------> read again
//!             shadow = 100                          distance = 160
//!   threshold (2 x budget, say 512 pages): 160 <= 512 -> refault, ACTIVE
//! ```
//!
//! # Deviation: the threshold
//!
//! The kernel activates a refaulting file page if its distance is at most
//! the active list's size ("it would have stayed resident had the active
//! pages been deactivated"). Its active list is rarely empty: a page read
//! twice through `read(2)` is activated by `mark_page_accessed`. faultmap
//! sees uses only through faults, so its active set starts empty and a
//! page can only be seen used twice if the hand passes it twice; with the
//! kernel's rule nothing would ever be activated by a refault. faultmap
//! compares the distance to twice the budget instead: a page that came
//! back before two budgets' worth of other pages went through the cache.
//! A one-pass scan never refaults (each page is read once), so it cannot
//! fill the active set this way; the active set is capped at half the
//! budget by the hand in any case (`crate::policy::clock`).
//!
//! The shadows themselves and the age counter are state, and live with the
//! page cache (`crate::cache::shadow`); this module is the decision.

/// Whether a page evicted at age `shadow` and read again at age `now` is a
/// refault (to activate), given `threshold`.
pub fn is_refault(now: u64, shadow: u64, threshold: u64) -> bool {
    now.wrapping_sub(shadow) <= threshold
}

/// The refault threshold for a budget of `budget_pages`: twice the budget.
pub fn threshold(budget_pages: u64) -> u64 {
    budget_pages.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_threshold_is_two_budgets_and_saturates() {
        assert_eq!(threshold(256), 512);
        assert_eq!(threshold(u64::MAX), u64::MAX);
        assert!(is_refault(260, 100, 512));
        assert!(!is_refault(1000, 100, 512));
    }

    proptest! {
        /// The distance is taken modulo 2^64, as the kernel's
        /// `nonresident_age` wraps: a page evicted just before the counter
        /// wrapped is judged by its true distance.
        #[test]
        fn distances_survive_the_counter_wrapping(
            shadow in any::<u64>(),
            distance in 0u64..1 << 40,
            threshold in 0u64..1 << 40,
        ) {
            let now = shadow.wrapping_add(distance);
            prop_assert_eq!(is_refault(now, shadow, threshold), distance <= threshold);
        }
    }
}
