//! The Weft client: the native library and the FUSE adapter over it.
//!
//! Layout:
//! - [`client`] — [`Client`] — a session with management, routing of every inode to its home
//!   metadata server, and retry identity for mutating requests.
//! - [`file`] — [`OpenFile`], a file open here: what this client knows of it beyond its
//!   metadata server (the size it wrote, its write errors), reads and writes through it. The
//!   mount and native callers both use it.
//! - `io`: the data path — a request is cut with the layout math of `proto` and its pieces go
//!   to their targets in parallel, over a [`Transport`] (the storage servers' [`Objects`], or
//!   a tool's own, such as the network benchmark's); holes read as zeros; what comes back
//!   stays in its pieces ([`ReadData`]) until a caller needs one buffer.
//! - `behind`: write-behind — the writes of a file in flight within a byte budget.
//! - `ahead`: read-ahead — windows read before a sequential reader asks.
//! - `locks`: the locks this client holds, reclaimed after a metadata server restarts.
//! - [`fuse`] — the FUSE file system over [`Client`], and mounting (stale-mount detection,
//!   clean unmount on SIGINT / SIGTERM, a mounts file for several file systems).
//!
//! The client depends on `proto` and `net` only.

mod ahead;
mod behind;
pub mod client;
mod error;
pub mod file;
pub mod fuse;
mod io;
mod session;
mod unserved;

pub use client::{Client, ClientConfig, ClientError, Created};
pub use file::OpenFile;
pub use io::{Objects, PieceRead, PieceWrite, ReadData, Transport};
