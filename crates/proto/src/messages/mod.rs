//! Request and response bodies of every service. Names follow `<Verb><Noun>`; the frame header
//! carries the request id, and chunk data travels as the frame's raw payload, never in a body.

use crate::access::Capability;
use crate::error::WireError;
use crate::ids::{
    ClientId, GroupId, GroupVersion, InodeId, MemberId, NodeId, StoragePoolId, TargetId,
};
use crate::layout::{FileLayout, SlotSet, StripePattern};
use crate::wire::Wire;
use serde::{Deserialize, Serialize};

mod cluster;
mod meta;
mod mgmt;
mod status;
mod storage;

pub use cluster::*;
pub use meta::*;
pub use mgmt::*;
pub use status::*;
pub use storage::*;

/// The extended attribute holding a directory's default spread: new subdirectories are spread
/// over that many metadata servers (a decimal number) and inherit it.
pub const DIR_SPREAD_XATTR: &str = "trusted.weft.spread";

/// Longest name of one directory entry, as on Linux.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symbolic link target, as Linux's PATH_MAX.
pub const SYMLINK_BYTES_MAX: usize = 4096;
/// Most entries one directory listing reply carries.
pub const READDIR_ENTRIES_MAX: u32 = 1024;
/// Most bytes one read request asks for; clients cut larger reads into pieces.
pub const IO_BYTES_MAX: u32 = 8 * 1024 * 1024;

/// `len` zero bytes (at most [`IO_BYTES_MAX`]): slices of one buffer allocated on first use,
/// for holes in reads and the network benchmark's answers.
///
/// # Panics
/// If `len` is above [`IO_BYTES_MAX`].
pub fn zeros(len: usize) -> bytes::Bytes {
    static ZEROS: std::sync::OnceLock<bytes::Bytes> = std::sync::OnceLock::new();
    ZEROS
        .get_or_init(|| bytes::Bytes::from(vec![0u8; IO_BYTES_MAX as usize]))
        .slice(..len)
}
/// Longest extended attribute name, as Linux's XATTR_NAME_MAX.
pub const XATTR_NAME_BYTES_MAX: usize = 255;
/// Largest extended attribute value, as Linux's XATTR_SIZE_MAX.
pub const XATTR_VALUE_BYTES_MAX: usize = 64 * 1024;
/// Largest list of one inode's attribute names, as Linux's XATTR_LIST_MAX.
pub const XATTR_LIST_BYTES_MAX: usize = 64 * 1024;
/// Longest a server waits for a conflicting lock within one request.
pub const LOCK_WAIT_MS_MAX: u32 = 5_000;
/// Most objects one ListObjects reply carries.
pub const OBJECTS_PER_LIST_MAX: u32 = 65_536;
/// Most bytes of an object one ObjectChecksum reads: one request stays well within a
/// request's deadline on a slow disk.
pub const CHECKSUM_BYTES_MAX: u64 = 64 << 20;
/// Most problems one consistency check reports in detail (the counts are always complete).
pub const CHECK_FINDINGS_MAX: usize = 1000;
/// Most addresses a node announces.
pub const NODE_ADDRESSES_MAX: usize = 16;

/// The addresses (rails) of a node peers name by `address`: a node with several network
/// interfaces announces one address per rail, and is named by all of them, comma-separated
/// (`10.0.1.5:7002,10.0.2.5:7002`).
pub fn rails(address: &str) -> impl Iterator<Item = &str> {
    address
        .split(',')
        .map(str::trim)
        .filter(|rail| !rail.is_empty())
}

/// The address peers name a node by: its rails, comma-separated (the inverse of [`rails`]).
pub fn rail_address(addresses: &[String]) -> String {
    addresses.join(",")
}

/// Any request, tagged with the service that serves it.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum Request {
    /// For management.
    #[wire(tag = 0)]
    Mgmt(MgmtRequest),
    /// For a metadata server: the home it is routed to, the request, and who it acts for
    /// (what a squashing client's root is checked as; `None` from servers and tools).
    #[wire(tag = 1)]
    Meta(
        MetaRoute,
        MetaRequest,
        #[serde(with = "crate::wire::since_2")] Option<crate::access::Caller>,
    ),
    /// For a storage server.
    #[wire(tag = 2)]
    Storage(StorageRequest),
    /// Any server's load counters since it started ([`NodeStats`]); answered by the server
    /// loop itself, for `weft stats` and management's cluster view.
    #[wire(tag = 3)]
    Stats,
}

impl Request {
    /// The operation's name for metrics and statistics: the request's variant in snake case
    /// (`create`, `write`, `heartbeat`).
    pub fn op_name(&self) -> &'static str {
        match self {
            Request::Mgmt(request) => request.into(),
            Request::Meta(_, request, _) => request.into(),
            Request::Storage(request) => request.into(),
            Request::Stats => "stats",
        }
    }
}

/// The body of a response frame: a service's response (`MetaResponse`, `MgmtResponse`,
/// `StorageResponse`, `StatsResponse`), or the error.
pub type Reply<R> = Result<R, WireError>;
