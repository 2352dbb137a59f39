//! The CLOCK policy: what the eviction hand does with the page under it.
//!
//! Pure code, no syscalls: `crate::mm::evict` applies the decision (one CAS on
//! the page-state word, then the unmapping, write-back or eviction it asks
//! for).
//!
//! # Why a CLOCK, and how references are seen
//!
//! The kernel ages pages on two LRU lists (active, inactive) and learns of
//! uses from the accessed bits of the PTEs that map them
//! (`folio_referenced`). User space sees no accessed bits. What it does see
//! is faults: once a page is unmapped from every mapping that maps it
//! (`MADV_DONTNEED` keeps it in the memfd), its next use is a MINOR fault,
//! which faultmap resolves like any other and which sets the page's
//! REFERENCED flag. So the hand *unmaps to sample*: REFERENCED plays the
//! PTE's accessed bit, and a page's MAPPED flag says whether a mapping may
//! be using it unseen.
//!
//! The lists become one flag, ACTIVE, and a hand that sweeps all cached
//! pages in object order, the way the two-handed CLOCK of 4.4BSD and
//! Solaris approximates LRU. SECOND plays `PG_referenced`: the kernel's
//! `folio_check_references` keeps a mapped page that was referenced once
//! for another trip round the inactive list, and activates it if it is
//! referenced again by then; a page used once (a scan) is reclaimed on the
//! next trip.
//!
//! # The decision
//!
//! ```text
//!  inactive page
//!    referenced, SECOND        -> ACTIVE, unmap          (used on two visits)
//!    referenced                -> SECOND, unmap          (used once: one more trip)
//!    not referenced, MAPPED    -> unmap                  (may be in use unseen)
//!    not referenced, unmapped  -> write back if dirty, else EVICT
//!  active page
//!    referenced                -> unmap                  (stays active)
//!    not referenced, over target -> inactive, unmap    (shrink_active_list)
//!    not referenced, MAPPED    -> unmap                  (sample again)
//!    otherwise                 -> keep
//! ```
//!
//! Every "unmap" also clears REFERENCED and MAPPED: the next use faults and
//! sets them again. The active set is kept at most `active_target` pages
//! (half the budget: the kernel's `inactive_ratio` for small memories is
//! 1), so a one-pass scan, whose pages are used once, only ever cycles
//! through the inactive half. A page read again soon after its eviction
//! goes to the active set at once (`crate::policy::workingset`): that is what saves
//! a hot set that the first scan did evict.
//!
//! # Known inaccuracies
//!
//! - Sampling costs a MINOR fault per used page per trip of the hand; the
//!   kernel's accessed bits cost nothing to set. The hand moves only under
//!   memory pressure, so an idle or fitting workload pays nothing.
//! - A page mapped by fault-around is MAPPED but not REFERENCED (the kernel
//!   maps fault-around pages "old" too); if the application uses it through
//!   that mapping, the hand sees the use only after it unmapped the page
//!   once.

/// The CLOCK's view of one page (its page-state flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bits {
    /// A fault mapped the page since the hand's last visit.
    pub referenced: bool,
    /// The hand found it referenced once already (`PG_referenced`).
    pub second: bool,
    /// In the active set.
    pub active: bool,
    /// Mapped somewhere since the hand last unmapped it.
    pub mapped: bool,
    /// Dirty or being written back: never evicted as it is (read only:
    /// the policy does not change it).
    pub dirty: bool,
}

/// What the hand does with the page once its flags are rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    Keep,
    /// Unmap it from every mapping (sample its next use).
    Unmap,
    /// Write it back to the store (it is dirty); evicted on a later visit.
    WriteBack,
    /// Evict it: it was not used since the last visit and is clean.
    Evict,
}

/// What the hand found, for the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The page was referenced (`clock_referenced`).
    pub referenced: bool,
    /// The page moved into the active set (`clock_activated`).
    pub activated: bool,
    /// The page left the active set.
    pub deactivated: bool,
}

/// The hand's visit to one page: its new flags, what to do, what it saw.
/// `active_over_target`: the active set holds more than its target.
pub fn visit(b: Bits, active_over_target: bool) -> (Bits, Action, Seen) {
    let mut seen = Seen {
        referenced: b.referenced,
        ..Seen::default()
    };
    let unmapped = |active, second| Bits {
        referenced: false,
        second,
        active,
        mapped: false,
        dirty: b.dirty,
    };
    let (bits, action) = if b.active {
        if b.referenced {
            (unmapped(true, false), Action::Unmap)
        } else if active_over_target {
            seen.deactivated = true;
            (unmapped(false, false), Action::Unmap)
        } else if b.mapped {
            (unmapped(true, false), Action::Unmap)
        } else {
            (b, Action::Keep)
        }
    } else if b.referenced {
        if b.second {
            seen.activated = true;
            (unmapped(true, false), Action::Unmap)
        } else {
            (unmapped(false, true), Action::Unmap)
        }
    } else if b.mapped {
        (unmapped(false, b.second), Action::Unmap)
    } else if b.dirty {
        (b, Action::WriteBack)
    } else {
        (b, Action::Evict)
    };
    (bits, action, seen)
}

/// The active set's target size for a budget of `budget_pages`: half of it.
pub fn active_target(budget_pages: u64) -> u64 {
    budget_pages / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bits() -> impl Strategy<Value = Bits> {
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(referenced, second, active, mapped, dirty)| Bits {
                referenced,
                second,
                active,
                mapped,
                dirty,
            })
    }

    /// Applies visits with no use in between until the page is evicted or
    /// written back; returns how many visits that took.
    fn visits_until_gone(mut b: Bits, over: bool) -> Option<usize> {
        for n in 1..=8 {
            let (next, action, _) = visit(b, over);
            match action {
                Action::Evict | Action::WriteBack => return Some(n),
                Action::Keep | Action::Unmap => b = next,
            }
        }
        None
    }

    #[test]
    fn a_page_used_once_is_evicted_on_the_second_visit() {
        // A scan page: faulted once (referenced, mapped), never used again.
        let scan = Bits {
            referenced: true,
            mapped: true,
            ..Bits::default()
        };
        assert_eq!(visits_until_gone(scan, false), Some(2));
    }

    #[test]
    fn a_page_used_between_visits_becomes_active() {
        let b = Bits {
            referenced: true,
            mapped: true,
            ..Bits::default()
        };
        let (b, action, seen) = visit(b, false);
        assert_eq!(action, Action::Unmap);
        assert!(b.second && !b.active && !seen.activated);
        // Used again: the fault sets REFERENCED and MAPPED.
        let b = Bits {
            referenced: true,
            mapped: true,
            ..b
        };
        let (b, action, seen) = visit(b, false);
        assert_eq!(action, Action::Unmap);
        assert!(b.active && seen.activated);
    }

    #[test]
    fn a_fault_around_page_gets_one_more_trip() {
        let b = Bits {
            mapped: true,
            ..Bits::default()
        };
        assert_eq!(visits_until_gone(b, false), Some(2));
    }

    #[test]
    fn active_pages_are_kept_while_the_set_is_within_target() {
        let b = Bits {
            active: true,
            ..Bits::default()
        };
        assert_eq!(visits_until_gone(b, false), None);
        // Over target: deactivated, then evicted like any inactive page.
        let (b2, action, seen) = visit(b, true);
        assert!(!b2.active && seen.deactivated);
        assert_eq!(action, Action::Unmap);
        assert_eq!(visits_until_gone(b2, true), Some(1));
    }

    #[test]
    fn dirty_pages_are_written_back_not_evicted() {
        let b = Bits {
            dirty: true,
            ..Bits::default()
        };
        assert_eq!(visit(b, true).1, Action::WriteBack);
    }

    proptest! {
        /// Whatever the flags, a page that is not used any more leaves the
        /// cache within four visits (the hand always makes progress), and
        /// a dirty one is written back rather than evicted.
        #[test]
        fn unused_pages_leave_within_four_visits(b in bits()) {
            let n = visits_until_gone(b, true).expect("never evicted");
            prop_assert!(n <= 4);
            let mut cur = b;
            loop {
                let (next, action, _) = visit(cur, true);
                match action {
                    Action::Evict => { prop_assert!(!cur.dirty); break; }
                    Action::WriteBack => { prop_assert!(cur.dirty); break; }
                    _ => cur = next,
                }
            }
        }

        /// Every visit that unmaps clears REFERENCED and MAPPED (the next
        /// use is sampled); eviction needs both clear; `dirty` is never
        /// changed by the policy; a referenced page is never evicted.
        #[test]
        fn decisions_are_consistent(b in bits(), over in any::<bool>()) {
            let (next, action, seen) = visit(b, over);
            prop_assert_eq!(next.dirty, b.dirty);
            prop_assert_eq!(seen.referenced, b.referenced);
            match action {
                Action::Unmap => prop_assert!(!next.referenced && !next.mapped),
                Action::Evict => prop_assert!(!b.referenced && !b.mapped && !b.dirty && !b.active),
                Action::WriteBack => prop_assert!(!b.referenced && !b.mapped && b.dirty),
                Action::Keep => prop_assert!(b.active && !b.referenced && !b.mapped && !over),
            }
            if b.referenced {
                prop_assert!(action == Action::Unmap);
            }
            if seen.activated {
                prop_assert!(!b.active && next.active && b.second);
            }
        }

        /// An active page is never evicted straight away: it must first be
        /// deactivated, and only when the active set is over its target.
        #[test]
        fn active_pages_are_deactivated_before_eviction(b in bits(), over in any::<bool>()) {
            let b = Bits { active: true, ..b };
            let (next, action, _) = visit(b, over);
            prop_assert!(action != Action::Evict && action != Action::WriteBack);
            if !over {
                prop_assert!(next.active);
            }
        }
    }
}
