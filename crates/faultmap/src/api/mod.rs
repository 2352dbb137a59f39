//! The public API: pagers, objects and mappings.
//!
//! PLACEHOLDER

pub(crate) mod object;
pub(crate) mod pager;
