//! Weft's built-in benchmarks.
//!
//! Layout:
//! - [`meta`] — an mdtest-like metadata workload (mkdir, create, stat, read-small, unlink,
//!   rmdir) over private directories or one shared directory, with a thread sweep, run through
//!   any POSIX directory (a Weft mount, a local disk, a passthrough) or through the native
//!   client library.
//! - [`cpu`] — machine CPU use over a phase, to tell whether the CPU was the limit.

pub mod cpu;
pub mod meta;
