//! `faultmap bench --remote`: faultmap against raw ranged GETs and the
//! FUSE peers, on the project's own HTTP and S3 servers.

#[allow(dead_code)]
pub mod engines;
#[allow(dead_code)]
pub mod setup;
