//! The Weft client: the native library and the FUSE adapter over it.
//!
//! Layout:
//! - [`client`] — [`Client`] — a session with management, routing of every inode to its home
//!   metadata server, and retry identity for mutating requests.
//! - `io`: striped reads and writes — a request is cut with the layout math of `proto` and
//!   its pieces go to their targets in parallel; holes read as zeros; what comes back stays in
//!   its pieces ([`ReadData`]) until a caller needs one buffer.
//! - `locks`: the locks this client holds, reclaimed after a metadata server restarts.
//! - [`behind`] — write-behind: the writes of a file in flight with a byte budget, used by
//!   the mount and by [`FileWriter`] for native callers.
//! - [`ahead`] — read-ahead: windows read before a sequential reader asks, used by the mount
//!   and by [`FileReader`] for native callers.
//! - [`fuse`] — the FUSE file system over [`Client`], and mounting (stale-mount detection,
//!   clean unmount on SIGINT / SIGTERM, a mounts file for several file systems).
//!
//! The client depends on `proto` and `net` only.

pub mod ahead;
pub mod behind;
pub mod client;
pub mod fuse;
mod io;
mod locks;
mod unserved;

pub use ahead::FileReader;
pub use behind::FileWriter;
pub use client::{Client, ClientConfig, ClientError, Created};
pub use io::ReadData;
