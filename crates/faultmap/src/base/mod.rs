//! The ground: the vocabulary every layer speaks.
//!
//! - `index`: index newtypes, so that an object page cannot be mixed up
//!   with a region page or an address;
//! - `config`: the pager's and a mapping's settings, bounded and
//!   validated in one place;
//! - `stats`: the counters, named as the kernel names them, and the
//!   readahead table;
//! - `report`: store failures as the application sees them (the error
//!   reports and their bounded logs);
//! - `trace`: access traces (first-touch order as page runs) and their
//!   file format.
//!
//! Layer rule: uses [`crate::policy`] (the readahead mode and patterns that
//! configuration and statistics name), [`crate::sync`] and [`crate::sys`];
//! never a mechanism. Every layer above may use it.

pub(crate) mod config;
pub(crate) mod index;
pub(crate) mod report;
pub(crate) mod stats;
pub(crate) mod trace;
