//! Weft's built-in benchmarks.
//!
//! Layout:
//! - [`meta`] — an mdtest-like metadata workload (mkdir, create, stat, read-small, unlink,
//!   rmdir) over private directories or one shared directory, with a thread sweep, run through
//!   any POSIX directory (a Weft mount, a local disk, a passthrough) or through the native
//!   client library.
//! - [`io`] — an IOR/IOzone-like data workload: sequential write and read with a file per
//!   thread (N-N) or one shared file (N-1), random 4 KiB writes and reads, a thread sweep,
//!   buffered or O_DIRECT, through any POSIX directory or the native client library; reads
//!   check the data.
//! - [`io500`] — an IO500-style run (ior-easy, ior-hard, mdtest-easy, mdtest-hard, find)
//!   through any POSIX directory, scored with IO500's formula.
//! - [`mgmt`] — management under many simulated servers and client sessions: heartbeat
//!   latency, map push latency, management's CPU and bytes sent.
//! - [`svg`] — line charts of the results.
//! - [`cpu`] — machine CPU use over a phase, to tell whether the CPU was the limit.

pub mod cpu;
pub mod io;
pub mod io500;
pub mod meta;
pub mod mgmt;
pub mod svg;

/// The regular file the native-client benchmarks create: mode 0644 (umask 022), owned by root.
pub(crate) fn new_file() -> weft_proto::messages::NewInode {
    weft_client::client::regular_file(0o644, 0o022, (0, 0))
}
