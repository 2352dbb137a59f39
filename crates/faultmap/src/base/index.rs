//! Index newtypes: an object page is not a region page, and neither is an
//! address.
//!
//! faultmap speaks of three kinds of position, and mixing them up is the
//! classic pager bug (an object page used as a region page is off by the
//! mapping's offset):
//!
//! - an **object page** ([`ObjectPage`]): page `i` of an object and of its
//!   memfd, bytes `[i * PAGE_SIZE, (i + 1) * PAGE_SIZE)` of the store;
//! - a **region page**: page `i` of one mapping, counted from its first
//!   page (a `u64` in the fault path; `Region::object_page` turns it into
//!   an object page);
//! - a **host address**: where a byte is mapped in this process (`usize`).
//!
//! Only object pages cross layers (the page cache, the rmap, reclaim, the
//! I/O jobs), so only they have a type here.

use crate::sys::PAGE_SIZE;

/// A page index in an object, and so in its memfd: page `i` covers bytes
/// `[i * PAGE_SIZE, (i + 1) * PAGE_SIZE)`. Kept apart from region-relative
/// page indices (plain `u64`s in the fault path) and from addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectPage(pub(crate) u64);

impl ObjectPage {
    /// The page `n` pages after this one.
    pub(crate) fn add(self, n: u64) -> ObjectPage {
        ObjectPage(self.0 + n)
    }

    /// The object offset of the page's first byte.
    pub(crate) fn offset(self) -> u64 {
        self.0 * PAGE_SIZE as u64
    }
}
