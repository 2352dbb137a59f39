//! Fault-around: which neighbours of a faulting page to map with it.
//!
//! # The problem
//!
//! Every page fault that reaches faultmap costs a userfaultfd round trip
//! (about 4 µs here, against 0.13 µs per page for the kernel's own minor
//! fault). Most accesses are near the previous one, so on each fault we also
//! map the neighbouring pages that are already cached and up to date. This is
//! the kernel's `do_fault_around` / `filemap_map_pages` (3.15, Kirill
//! Shutemov's `->map_pages` series). Registering a mapping in MINOR
//! mode turns the kernel's fault-around off for it, so this module is the only
//! fault-around such a mapping gets, and its window is configurable.
//!
//! # The window
//!
//! The window has `N = 2^order` pages (order 0..=9, default 4 = 64 KiB, the
//! kernel's `fault_around_bytes`). Like the kernel since 3.15, it is aligned
//! in *virtual address* space, by the slot of the faulting page in its PTE
//! table, never crosses a PTE table (2 MiB, one page-table lock in the kernel)
//! and never leaves the mapping. When the mapping's start cuts the aligned
//! window, the window slides right to start at the mapping's first page
//! instead of shrinking:
//!
//! ```text
//!   PTE table (512 slots, 2 MiB)
//!   |....:....:....:....|....:....:....:....|  ...  |
//!         ^ mapping start        ^ fault (slot 37, N = 16)
//!
//!   aligned window      [32 ............ 47]         from = align_down(37, 16)
//!   at mapping start    [mapping start, +16)         slides right, keeps N pages
//!   at a table's end    [.. 511]                     clipped, never crosses
//!   at mapping end      [.. last page]               clipped
//! ```
//!
//! In the kernel's terms, with `pte_off` the faulting page's slot and
//! `vma_off` its page index inside the mapping:
//!
//! ```text
//!   from = max(align_down(pte_off, N), pte_off - min(pte_off, vma_off))
//!   to   = min(from + N, 512, pte_off + vma_pages - vma_off) - 1
//! ```
//!
//! faultmap places each mapping at an address congruent to its object offset
//! modulo 2 MiB (as the kernel does for large-folio file mappings), so for a
//! mapping at object offset 0 the windows are aligned in the object too, and a
//! sequential read of `P` cached pages takes exactly `ceil(P / N)` faults.
//!
//! # What is mapped
//!
//! Only pages that are up to date in the cache; a page being read, absent, or
//! (from the readahead issue on) carrying the readahead marker is skipped and
//! faults for real when touched. This module only computes the window; the
//! fault path (`crate::mm::fault`) walks it.
//!
//! # Adaptive windows
//!
//! No fixed order suits every access pattern: a walk wants whole tables
//! (one fault per 2 MiB), isolated touches want one page (a window of 512
//! costs ten times the fault it saves, for pages never used). With
//! [`AUTO`], each fault's order comes from two things faultmap sees
//! without accessed bits: how much of the fault's page table is mapped
//! already ([`auto_order`]: a table being filled grows its windows), and
//! a per-mapping *density*, the share of a table the application went on
//! to use in the tables it touched before ([`auto`]: it rises on faults
//! in tables with mapped pages, and falls on first faults in fresh ones).
//! The density sizes a fresh table's first window, from one page to the
//! whole table.
//!
//! # Known inaccuracies
//!
//! The kernel also stops at EOF (`filemap_map_pages` clips to `i_size`);
//! faultmap's memfd is exactly the object rounded up to a page, and a mapping
//! never extends past it, so clipping to the mapping is the same thing.

use std::ops::Range;

use crate::sys::PTRS_PER_PTE;

/// The largest fault-around order: 512 pages, one whole PTE table.
pub const MAX_ORDER: u8 = 9;

/// The default order: 16 pages (64 KiB), the kernel's `fault_around_bytes`.
pub const DEFAULT_ORDER: u8 = 4;

/// The order value of a mapping whose window size follows its accesses
/// ([`auto`]); not an order itself.
pub const AUTO: u8 = u8::MAX;

/// The smallest window [`auto_order`] picks, in a page table the
/// application has touched before: 4 pages. (The first window of a table
/// follows the mapping's density instead, down to one page: [`auto`].)
pub const AUTO_MIN_ORDER: u8 = 2;

/// Adaptive fault-around: the order of a fault's window, from how much of
/// its neighbourhood the application has already touched.
///
/// - `block`: the pages of the faulting page's PTE table (the 512-page,
///   2 MiB block that every window lies in) that are mapped now;
/// - `before`: the mapped pages of the block before it, counted only when
///   the page just before the faulting one is mapped (a walk that comes in
///   from below), else 0.
///
/// The order is `floor(log2(block + before + 1)) + 2`, clamped to
/// [`AUTO_MIN_ORDER`]..=[`MAX_ORDER`]: a window two to four times what the
/// application has touched around the fault. So:
///
/// ```text
///   dense    the block fills: 4, 16, 64, 256, 512 pages -> ~5 faults a block
///   walk     the block below is full, its last page too -> 512 pages at once
/// ```
///
/// [`auto`] uses it for faults in a block with pages mapped (`block > 0`),
/// so the walk's case only applies to a fault at a block's first page
/// whose block has pages mapped already.
///
/// The mapped bits are faultmap's own (`MappedPages`), so the policy sees
/// what fault-around and earlier faults mapped, and what eviction's
/// sampling unmapped: a neighbourhood that stops being used shrinks the
/// next windows. This is the growth inside one block; [`auto`] adds the
/// mapping's memory of how its blocks were used, which sizes the first
/// window of a block too.
pub fn auto_order(block: u32, before: u32) -> u8 {
    let seen = block.saturating_add(before).saturating_add(1);
    let order = (u32::BITS - seen.leading_zeros()) as u8 + 1;
    order.clamp(AUTO_MIN_ORDER, MAX_ORDER)
}

/// The pages [`auto_order`] counts for a fault at mapping page `page` in
/// PTE-table slot `slot` of a mapping of `mapping_pages` pages: the part of
/// the faulting page's PTE table inside the mapping, and, when the fault is
/// at that table's first page and the table does not start before the
/// mapping, the part of the table below inside the mapping (where a walk
/// comes in from: counted only if the page just below the fault is
/// mapped).
pub fn auto_neighbourhood(
    slot: usize,
    page: u64,
    mapping_pages: u64,
) -> (Range<u64>, Option<Range<u64>>) {
    let table = PTRS_PER_PTE as u64;
    let slot = (slot % PTRS_PER_PTE) as u64;
    let page = page.min(mapping_pages.saturating_sub(1));
    let start = page.saturating_sub(slot);
    let end = page.saturating_add(table - slot).min(mapping_pages);
    let below = (page >= slot && slot == 0 && page > 0).then(|| page.saturating_sub(table)..page);
    (start..end, below)
}

/// The density estimate of [`auto`] when it knows everything is used:
/// fixed point, `DENSITY_ONE` is a whole page table.
pub const DENSITY_ONE: u32 = 1 << 16;

/// The density a mapping starts with: a first window of 16 pages, the
/// kernel's `fault_around_bytes` (see [`density_order`]).
pub const DENSITY_START: u32 = 16 * (DENSITY_ONE / 1024);

/// A fault that used what earlier windows mapped closes this share of the
/// gap to [`DENSITY_ONE`]: `1 / 2^DENSITY_UP_SHIFT`.
const DENSITY_UP_SHIFT: u32 = 2;

/// A fault in a page table nothing was mapped in takes this share off the
/// density: `1 / 2^DENSITY_DOWN_SHIFT`.
const DENSITY_DOWN_SHIFT: u32 = 4;

/// What a fault tells adaptive fault-around about the use of its windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Touch {
    /// The first fault in a page table (nothing of it mapped): the window
    /// is a guess from the density, and the density goes down (a table
    /// that is touched only here pays for nothing more than this fault).
    /// A walk coming in from the table below is one too: the pages mapped
    /// below may be the last window's, not the application's.
    Fresh,
    /// A fault in a page table with pages mapped already: the application
    /// went past what was mapped around it. The density goes up.
    Revisit,
}

/// What [`auto`] decided for one fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Auto {
    /// The window's order.
    pub order: u8,
    /// The mapping's density after this fault.
    pub density: u32,
    /// What the fault told.
    pub touch: Touch,
}

/// The order of the first window in a page table for a mapping of density
/// `density`: `floor(log2(pages))` with `pages = 1024 * density /
/// DENSITY_ONE` (0 up to 2 pages), clamped to [`MAX_ORDER`]. A window twice
/// what the application is expected to use: a whole table from half of it
/// on.
pub fn density_order(density: u32) -> u8 {
    let pages = density.min(DENSITY_ONE) / (DENSITY_ONE / 1024);
    let order = (u32::BITS - pages.leading_zeros()).saturating_sub(1) as u8;
    order.min(MAX_ORDER)
}

/// Adaptive fault-around for one fault: the window's order and the
/// mapping's new density, from its density before and the fault's
/// neighbourhood (`block` and `before` as in [`auto_order`]).
///
/// The density is the mapping's estimate of how much of a page table the
/// application goes on to use once it touches it. Its only evidence is the
/// faults themselves, since faultmap cannot see which mapped pages are read
/// (no accessed bits from user space):
///
/// ```text
///   Fresh    first fault in a table      density -= density / 16
///            window: density_order(density)
///   Revisit  a table with mapped pages   density += (ONE - density) / 4
///            window: max(auto_order(block, before), density_order(after))
/// ```
///
/// A window of the whole table leaves nothing to fault on, so a dense
/// mapping sees no evidence while it maps whole tables and its density
/// decays: after about 11 fresh tables it maps half tables again, an
/// application that uses them faults in them once more, and the density
/// rises back. That probe costs about one fault in a few tables. Measured
/// in a model of the fault costs (6 µs a fault, 0.17 µs a page mapped) and
/// in `faultmap bench --orders 0,..,9,auto`:
///
/// - `sparse` (one page per table): only fresh faults, the density decays
///   from 16 pages to 1 in about 30 faults, and the windows with it (also
///   after a dense phase: a stride's faults are fresh, whatever the last
///   window mapped below them);
/// - `seq` and `rand` (every page): the first tables revisit, the density
///   rises to whole tables within a few faults, and a table takes 1.3 to
///   1.4 faults on average (one at order 9) instead of about five (growth
///   alone); within 3 % of order 9 in the model;
/// - a few random pages per table: the worst case. One revisit in a table
///   moves the density a quarter of the way to whole tables and a fresh
///   table only a sixteenth down, so with 2 to 8 touches per table it
///   settles near whole tables, which map hundreds of pages for a few
///   used: in models 6 to 7, 4.4 to 5, 2.7 to 3.1 and 1.7 to 1.9 times
///   the time of the best fixed order (order 0) for 2, 3, 5 and 8 random
///   pages per table. A revisit cannot tell a table used sparsely after a
///   small window from one used densely; this is why adaptive fault-around
///   is not the default.
///
/// Increases and decreases are shares of the distance to the bound, so the
/// density stays in `0..=DENSITY_ONE` for any input.
pub fn auto(density: u32, block: u32, before: u32) -> Auto {
    let touch = if block == 0 {
        Touch::Fresh
    } else {
        Touch::Revisit
    };
    let after = density_step(density, touch);
    let order = match touch {
        Touch::Fresh => density_order(density.min(DENSITY_ONE)),
        Touch::Revisit => auto_order(block, before).max(density_order(after)),
    };
    Auto {
        order,
        density: after,
        touch,
    }
}

/// The density after a fault that told `touch`, from the density before
/// (the step of [`auto`]; the fault path applies it to the density as it
/// is when the fault ends, so that concurrent faults' steps add up).
pub fn density_step(density: u32, touch: Touch) -> u32 {
    let density = density.min(DENSITY_ONE);
    match touch {
        Touch::Fresh => density - (density >> DENSITY_DOWN_SHIFT),
        Touch::Revisit => density + ((DENSITY_ONE - density) >> DENSITY_UP_SHIFT),
    }
}

/// The fault-around window for a fault, as a range of page indices inside the
/// mapping.
///
/// - `slot`: the faulting page's slot in its PTE table, `(addr / PAGE) % 512`.
/// - `page`: the faulting page's index inside the mapping.
/// - `mapping_pages`: the mapping's length in pages (`page < mapping_pages`).
/// - `order`: `log2` of the window size, at most [`MAX_ORDER`].
///
/// The result always contains `page`, has at most `2^order` pages, lies inside
/// the mapping and inside `page`'s PTE table. Inputs out of range are clamped
/// (the caller validated them; this function must not panic in a fault path).
pub fn window(slot: usize, page: u64, mapping_pages: u64, order: u8) -> Range<u64> {
    let n = 1usize << order.min(MAX_ORDER);
    let slot = slot % PTRS_PER_PTE;
    let page = page.min(mapping_pages.saturating_sub(1));
    // Distances in pages from the faulting page back to the mapping's start and
    // forward to its end, as seen from inside this PTE table.
    let back = usize::try_from(page).map_or(slot, |p| p.min(slot));
    let ahead = usize::try_from(mapping_pages - page).unwrap_or(PTRS_PER_PTE);
    let from = (slot & !(n - 1)).max(slot - back);
    let to = (from + n).min(PTRS_PER_PTE).min(slot.saturating_add(ahead));
    let first = page - (slot - from) as u64;
    first..first + (to - from) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn aligned_window_in_the_middle() {
        // Slot 37, page 37 of a 1000-page mapping that starts on a table.
        assert_eq!(window(37, 37, 1000, 4), 32..48);
        assert_eq!(window(37, 37, 1000, 0), 37..38);
        assert_eq!(window(37, 37, 1000, 9), 0..512);
    }

    #[test]
    fn slides_right_at_the_mapping_start() {
        // The mapping starts at slot 34: a fault at slot 37 (page 3) would
        // align to slot 32, before the mapping; the window is slots 34..50.
        assert_eq!(window(37, 3, 1000, 4), 0..16);
        // Starting at slot 30, the aligned window 32..48 is inside: no slide.
        assert_eq!(window(37, 7, 1000, 4), 2..18);
        // The faulting page is the first one.
        assert_eq!(window(30, 0, 1000, 4), 0..16);
    }

    #[test]
    fn clipped_at_the_table_end_and_the_mapping_end() {
        // Slot 510 with a 16-page window: aligned 496..512 fits.
        assert_eq!(window(510, 1000, 5000, 4), 986..1002);
        // Mapping start at slot 500: sliding right would cross the table.
        assert_eq!(window(505, 5, 5000, 4), 0..12);
        // Mapping of 40 pages from slot 0: fault at page 39.
        assert_eq!(window(39, 39, 40, 4), 32..40);
        // A one-page mapping.
        assert_eq!(window(77, 0, 1, 9), 0..1);
    }

    #[test]
    fn reproduces_the_kernel_probe() {
        // kernel-mechanisms.md §6.3: a 64-page memfd touched at page 21 with
        // the VA base at slot 0 maps 16..31; with the base at slot 1 (page
        // 21 is then in slot 22) it maps pages 15..30.
        assert_eq!(window(21, 21, 64, 4), 16..32);
        assert_eq!(window(22, 21, 64, 4), 15..31);
    }

    /// The kernel's formula, written the kernel's way over signed integers,
    /// as the reference the implementation is checked against.
    fn reference(slot: i64, page: i64, pages: i64, order: u32) -> (i64, i64) {
        let n = 1i64 << order;
        let from = (slot - slot % n).max(slot - slot.min(page));
        let to = (from + n).min(512).min(slot + pages - page) - 1;
        (page - (slot - from), page + (to - slot))
    }

    #[test]
    fn auto_neighbourhood_is_the_faulting_table_inside_the_mapping() {
        // A mapping that starts on a table: page 700 is slot 188 of the
        // second table.
        assert_eq!(auto_neighbourhood(188, 700, 2000), (512..1024, None));
        // The first page of a table, a table below it: the walk's case.
        assert_eq!(auto_neighbourhood(0, 512, 2000), (512..1024, Some(0..512)));
        // A mapping that starts at slot 256: its first 256 pages are the
        // rest of the first table, and nothing is below them.
        assert_eq!(auto_neighbourhood(266, 10, 2000), (0..256, None));
        assert_eq!(auto_neighbourhood(0, 256, 2000), (256..768, Some(0..256)));
        // Clipped at the mapping's end.
        assert_eq!(auto_neighbourhood(5, 1029, 1030), (1024..1030, None));
    }

    #[test]
    fn auto_grows_with_what_was_touched() {
        assert_eq!(auto_order(0, 0), 2);
        assert_eq!(auto_order(1, 0), 3);
        assert_eq!(auto_order(2, 0), 3);
        assert_eq!(auto_order(3, 0), 4);
        assert_eq!(auto_order(14, 0), 5);
        assert_eq!(auto_order(126, 0), 8);
        assert_eq!(auto_order(127, 0), 9);
        // A walk coming in from a full block below.
        assert_eq!(auto_order(0, 512), MAX_ORDER);
        assert_eq!(auto_order(u32::MAX, u32::MAX), MAX_ORDER);
    }

    /// Adaptive fault-around over `accesses` (mapping pages, the mapping
    /// starting on a page table) as the fault path runs it: a page faults
    /// when it is not mapped, and its window is mapped. Returns the faults
    /// and the pages mapped.
    fn simulate(accesses: impl IntoIterator<Item = u64>, pages: u64) -> (u64, u64) {
        let mut mapped = vec![false; pages as usize];
        let mut density = DENSITY_START;
        let (mut faults, mut mapped_pages) = (0, 0);
        let count = |m: &[bool], r: Range<u64>| {
            m[r.start as usize..r.end as usize]
                .iter()
                .filter(|&&b| b)
                .count() as u32
        };
        for p in accesses {
            if mapped[p as usize] {
                continue;
            }
            faults += 1;
            let slot = (p % 512) as usize;
            let (table, below) = auto_neighbourhood(slot, p, pages);
            let block = count(&mapped, table.clone());
            let before = match below {
                Some(b) if mapped[p as usize - 1] => count(&mapped, b),
                _ => 0,
            };
            let decision = auto(density, block, before);
            density = decision.density;
            for q in window(slot, p, pages, decision.order) {
                mapped_pages += u64::from(!mapped[q as usize]);
                mapped[q as usize] = true;
            }
            assert!(mapped[p as usize], "the faulting page is mapped");
        }
        (faults, mapped_pages)
    }

    /// A permutation of `0..n` from `seed` (xorshift, Fisher-Yates).
    fn shuffled(n: u64, seed: u64) -> Vec<u64> {
        let mut v: Vec<u64> = (0..n).collect();
        let mut x = seed | 1;
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
        v
    }

    #[test]
    fn density_orders() {
        assert_eq!(density_order(DENSITY_START), DEFAULT_ORDER);
        assert_eq!(density_order(0), 0);
        assert_eq!(density_order(DENSITY_ONE / 1024 * 2 - 1), 0);
        assert_eq!(density_order(DENSITY_ONE / 1024 * 2), 1);
        assert_eq!(density_order(DENSITY_ONE / 2 - 1), 8);
        assert_eq!(density_order(DENSITY_ONE / 2), MAX_ORDER);
        assert_eq!(density_order(u32::MAX), MAX_ORDER);
    }

    #[test]
    fn auto_tells_fresh_faults_from_revisits() {
        let fresh = auto(DENSITY_START, 0, 0);
        assert_eq!((fresh.touch, fresh.order), (Touch::Fresh, DEFAULT_ORDER));
        assert!(fresh.density < DENSITY_START);
        let revisit = auto(DENSITY_START, 16, 0);
        assert_eq!(revisit.touch, Touch::Revisit);
        assert!(revisit.density > DENSITY_START);
        // One revisit from the start: the density is a quarter of the way
        // to whole tables, windows of 256 pages.
        assert_eq!(revisit.order, 8);
        assert!(revisit.order > auto_order(16, 0));
        // A walk in from below is fresh: the density decides.
        let walk = auto(0, 0, 512);
        assert_eq!((walk.touch, walk.order), (Touch::Fresh, 0));
        // A dense mapping's fresh table gets all of it at once.
        assert_eq!(auto(DENSITY_ONE, 0, 0).order, MAX_ORDER);
    }

    #[test]
    fn the_workloads_of_the_bench() {
        let tables = 128u64;
        let pages = tables * 512;
        // seq: the first tables grow, later ones are mapped whole or in
        // halves (the probe after the density decayed).
        let (faults, mapped) = simulate(0..pages, pages);
        assert!(faults <= tables + tables / 2, "seq: {faults} faults");
        assert_eq!(mapped, pages);
        // sparse: one page per table; the density decays to one-page
        // windows, having mapped at most 16 pages per fault on the way.
        let (faults, mapped) = simulate((0..tables).map(|t| t * 512), pages);
        assert_eq!(faults, tables);
        assert!(mapped <= tables + 16 * 32, "sparse: {mapped} pages mapped");
        let (_, mapped_long) = simulate((0..4 * tables).map(|t| t * 512), 4 * pages);
        assert_eq!(
            mapped_long - mapped,
            3 * tables,
            "one page a fault, once decayed"
        );
        // A stride after a dense phase: the first page of each table, the
        // page below it mapped by the last whole-table window. Its faults
        // are fresh, so the windows decay as on a fresh mapping.
        let dense = 32;
        let stride = (dense..4 * tables).map(|t| t * 512);
        let (faults, mapped) = simulate((0..dense * 512).chain(stride), 4 * pages);
        let stride_faults = 4 * tables - dense;
        assert!(faults >= stride_faults);
        assert!(
            mapped - dense * 512 <= stride_faults + 512 * 16,
            "stride: {} pages mapped for {stride_faults} touches",
            mapped - dense * 512
        );
    }

    proptest! {
        #[test]
        fn auto_keeps_its_bounds(density in any::<u32>(), block in 0u32..=512, before in 0u32..=512) {
            let d = auto(density, block, before);
            prop_assert!(d.order <= MAX_ORDER);
            prop_assert!(d.density <= DENSITY_ONE);
            let was = density.min(DENSITY_ONE);
            match d.touch {
                Touch::Fresh => {
                    prop_assert_eq!(block, 0);
                    prop_assert!(d.density <= was);
                    prop_assert_eq!(d.order, density_order(was));
                }
                Touch::Revisit => {
                    prop_assert!(d.density >= was);
                    prop_assert!(d.order >= auto_order(block, before));
                }
            }
            // A denser mapping never gets a smaller window.
            let denser = auto(was.saturating_add(DENSITY_ONE / 8), block, before);
            prop_assert!(denser.order >= d.order);
        }

        /// Random access over every page: under two faults per table once
        /// the density has risen, against about five for the growth alone;
        /// every page mapped once.
        #[test]
        fn auto_on_random_access(seed in any::<u64>()) {
            let tables = 64u64;
            let pages = tables * 512;
            let (faults, mapped) = simulate(shuffled(pages, seed), pages);
            prop_assert_eq!(mapped, pages);
            prop_assert!(faults <= 2 * tables, "{} faults for {} tables", faults, tables);
        }

        #[test]
        fn auto_neighbourhood_matches_the_page_tables(
            start_slot in 0usize..512,
            pages in 1u64..5000,
            page_frac in 0.0f64..1.0,
        ) {
            // Mapping page p sits in slot (start_slot + p) % 512; its table
            // holds the mapping pages with the same (start_slot + p) / 512.
            let page = ((pages as f64 * page_frac) as u64).min(pages - 1);
            let abs = start_slot as u64 + page;
            let slot = (abs % 512) as usize;
            let (table, below) = auto_neighbourhood(slot, page, pages);
            let same: Vec<u64> = (0..pages).filter(|q| (start_slot as u64 + q) / 512 == abs / 512).collect();
            prop_assert_eq!(table.clone(), same[0]..same[same.len() - 1] + 1);
            prop_assert!(table.contains(&page));
            match below {
                Some(b) => {
                    prop_assert_eq!(slot, 0);
                    prop_assert_eq!(b.end, page);
                    let prev: Vec<u64> = (0..pages).filter(|q| (start_slot as u64 + q) / 512 + 1 == abs / 512).collect();
                    prop_assert_eq!(b, prev[0]..prev[prev.len() - 1] + 1);
                }
                None => prop_assert!(slot != 0 || page == 0),
            }
        }

        #[test]
        fn auto_is_bounded_and_monotone(
            block in 0u32..=512,
            before in 0u32..=512,
            more in 0u32..=512,
        ) {
            let o = auto_order(block, before);
            prop_assert!((AUTO_MIN_ORDER..=MAX_ORDER).contains(&o));
            // More touched pages never shrink the window.
            prop_assert!(auto_order(block.saturating_add(more), before) >= o);
            prop_assert!(auto_order(block, before.saturating_add(more)) >= o);
            // The window is at most four times what was touched (plus
            // one), and larger than it.
            let seen = u64::from(block) + u64::from(before);
            if o < MAX_ORDER {
                prop_assert!(1u64 << o <= 4 * (seen + 1));
                prop_assert!(2 * seen < 1u64 << o);
            }
        }

        /// A dense access (every page of a block touched, in any order)
        /// takes few faults per block from the growth alone.
        #[test]
        fn auto_order_on_dense_blocks(seed in any::<u64>()) {
            // Dense: a random page order over one 512-page block.
            let mut order: Vec<u64> = (0..512).collect();
            let mut x = seed | 1;
            for i in (1..order.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut mapped = [false; 512];
            let mut faults = 0;
            for &p in &order {
                if mapped[p as usize] {
                    continue;
                }
                faults += 1;
                let block = mapped.iter().filter(|&&m| m).count() as u32;
                let w = window(p as usize, p, 512, auto_order(block, 0));
                for q in w {
                    mapped[q as usize] = true;
                }
            }
            prop_assert!(faults <= 24, "{} faults for one dense block", faults);
        }

        #[test]
        fn matches_the_kernel_formula(
            slot in 0usize..512,
            pages in 1u64..5000,
            page_frac in 0.0f64..1.0,
            order in 0u8..=9,
        ) {
            let page = ((pages as f64 * page_frac) as u64).min(pages - 1);
            let w = window(slot, page, pages, order);
            let (first, last) = reference(slot as i64, page as i64, pages as i64, order.into());
            prop_assert_eq!((w.start as i64, w.end as i64 - 1), (first, last));
            // The invariants the fault path relies on.
            prop_assert!(w.contains(&page));
            prop_assert!(w.end - w.start <= 1u64 << order);
            prop_assert!(w.end <= pages);
            let first_slot = slot as i64 - (page - w.start) as i64;
            let last_slot = slot as i64 + (w.end - 1 - page) as i64;
            prop_assert!(first_slot >= 0 && last_slot < 512);
        }

        #[test]
        fn sequential_faults_per_aligned_mapping(pages in 1u64..4000, order in 0u8..=9) {
            // A mapping that starts on a table: every fault maps a whole
            // window, so a sequential walk takes ceil(pages / N) faults.
            let mut faults = 0u64;
            let mut next = 0u64;
            while next < pages {
                let w = window((next % 512) as usize, next, pages, order);
                prop_assert_eq!(w.start, next);
                next = w.end;
                faults += 1;
            }
            prop_assert_eq!(faults, pages.div_ceil(1 << order));
        }
    }
}
