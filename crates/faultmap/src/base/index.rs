//! Index newtypes: an object page is not a region page, and neither is an
//! address.
//!
//! faultmap speaks of three kinds of position, and mixing them up is the
//! classic pager bug (an object page used as a region page is off by the
//! mapping's offset; an address used as a page index is off by
//! everything):
//!
//! - an **object page** ([`ObjectPage`]): page `i` of an object and of its
//!   memfd, bytes `[i * P, (i + 1) * P)` of the store, `P` the object's
//!   page size (`PAGE_SIZE`, or 2 MiB: `crate::PageSize`);
//! - a **region page** ([`RegionPage`]): page `i` of one mapping (a
//!   region), counted from its first page;
//! - a **host address** ([`HostAddr`]): where a byte is mapped in this
//!   process.
//!
//! ```text
//!   object pages   0    1    2    3    4    5    6    7
//!   region          ......[ 0  | 1  | 2  | 3  ]......     first_page = 2
//!   host addresses        ^ start        ^ start + 2 * PAGE_SIZE
//! ```
//!
//! Each type's arithmetic stays within its kind (a page `n` pages on, the
//! pages or bytes between two positions of one kind). What relates two
//! kinds depends on a mapping, so it is a method of the region
//! (`crate::mm::space::Region`): `object_page` (region page → object page),
//! `page_of` (address → region page), `addr_of` (region page → address),
//! `region_pages` (object pages → the region pages that map them). Mixing
//! kinds without one is a compile error.
//!
//! Raw integers remain at the edges: the system calls (`crate::sys` takes
//! `usize` addresses: [`HostAddr::get`]), the policy's pure functions
//! (`crate::policy` lies below this layer and counts pages in `u64`s), the
//! atomics that store an address, and the crate's public API, which keeps
//! its `usize` offsets and lengths.

use std::ops::Range;

use crate::base::config::PageSize;
use crate::sys::{PAGE_SIZE, PTRS_PER_PTE};

/// A page index in an object, and so in its memfd: page `i` covers bytes
/// `[i * P, (i + 1) * P)`, `P` the object's page size. Kept apart from region pages
/// ([`RegionPage`]) and from addresses ([`HostAddr`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectPage(pub(crate) u64);

impl ObjectPage {
    /// The page `n` pages after this one.
    pub(crate) fn add(self, n: u64) -> ObjectPage {
        ObjectPage(self.0 + n)
    }

    /// The object offset of the page's first byte, in pages of `size`
    /// (the object's: `Cache::offset` says which).
    pub(crate) fn offset_in(self, size: PageSize) -> u64 {
        self.0 << size.shift()
    }

    /// Object pages `pages`, given as raw numbers (as reclaim's page lists
    /// hold them).
    pub(crate) fn range(pages: Range<u64>) -> Range<ObjectPage> {
        ObjectPage(pages.start)..ObjectPage(pages.end)
    }
}

/// A page index in one region (mapping): page `i` is the region's `i`-th
/// page, at `start + i * P` (`P` its object's page size), whatever object
/// page it maps. Only the
/// region relates it to an object page or an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub(crate) struct RegionPage(pub(crate) u64);

impl RegionPage {
    /// The page `n` pages after this one.
    pub(crate) fn add(self, n: u64) -> RegionPage {
        RegionPage(self.0 + n)
    }

    /// How many pages this one lies after `base` (`base <= self`).
    pub(crate) fn since(self, base: RegionPage) -> u64 {
        self.0 - base.0
    }
}

/// An address in this process: where a byte is mapped. Kept apart from
/// page indices; [`HostAddr::get`] hands the raw address to a system call.
/// Stored raw (`usize`) in atomics, converted at the load and the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub(crate) struct HostAddr(pub(crate) usize);

impl HostAddr {
    /// The raw address, for a system call.
    pub(crate) fn get(self) -> usize {
        self.0
    }

    /// The address of the first byte of the 4 KiB page that holds this
    /// one (a region of 2 MiB pages rounds further: `Region::page_of`).
    pub(crate) fn page_down(self) -> HostAddr {
        HostAddr(self.0 & !(PAGE_SIZE - 1))
    }

    /// The address `bytes` bytes after this one.
    pub(crate) fn add(self, bytes: usize) -> HostAddr {
        HostAddr(self.0 + bytes)
    }

    /// How many bytes this address lies after `base` (`base <= self`).
    pub(crate) fn since(self, base: HostAddr) -> usize {
        self.0 - base.0
    }

    /// The index of its page in the page table that maps it (the kernel's
    /// `pte_index`): the slot the fault-around window is aligned on.
    pub(crate) fn pte_index(self) -> usize {
        (self.0 / PAGE_SIZE) % PTRS_PER_PTE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_addr_helpers() {
        let a = HostAddr(5 * PAGE_SIZE + 17);
        assert_eq!(a.page_down(), HostAddr(5 * PAGE_SIZE));
        assert_eq!(a.page_down().page_down(), a.page_down());
        assert_eq!(a.add(PAGE_SIZE).since(a), PAGE_SIZE);
        assert_eq!(a.pte_index(), 5);
        assert_eq!(HostAddr((PTRS_PER_PTE + 3) * PAGE_SIZE).pte_index(), 3);
    }

    #[test]
    fn region_page_helpers() {
        let p = RegionPage(7);
        assert_eq!(p.add(3), RegionPage(10));
        assert_eq!(p.add(3).since(p), 3);
    }
}
