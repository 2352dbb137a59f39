//! The public API: [`crate::Pager`], [`crate::Object`], [`crate::Mapping`].
//!
//! - `pager`: the pager (one userfaultfd, its handler, I/O, evictor and
//!   flusher threads), mapping and its safety contract, the handler
//!   threads' loop, and the lifetimes that bound shutdown;
//! - `object`: the counted handle to an object, with invalidation, flush,
//!   statistics and the error log;
//! - `shared`: whether a mapping owns its object's cache or joins another
//!   process's (`Config::shared`), and the joining side;
//! - `errno`: the error number an error stands for, for the C and Python
//!   bindings.
//!
//! Layer rule: the top. It builds the pager's `Core` for [`crate::mm`] and
//! owns the threads; nothing below imports it.

pub(crate) mod errno;
pub(crate) mod object;
pub(crate) mod pager;
pub(crate) mod shared;
