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

/// Successful answers.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum Response {
    /// Done, nothing to return.
    #[wire(tag = 0)]
    Done,
    /// The node's id.
    #[wire(tag = 1)]
    NodeRegistered {
        /// Allocated or confirmed id.
        node: NodeId,
    },
    /// The target's id.
    #[wire(tag = 2)]
    TargetRegistered {
        /// Allocated or confirmed id.
        target: TargetId,
    },
    /// The client's session.
    #[wire(tag = 3)]
    ClientRegistered {
        /// The new session id.
        client: ClientId,
        /// How long management keeps the session without a heartbeat, in milliseconds (0:
        /// not said, from a server of version 6). The client heartbeats well within it.
        #[serde(default, with = "crate::wire::since_7")]
        session_timeout_ms: u64,
    },
    /// The maps.
    #[wire(tag = 4)]
    ClusterMap(ClusterMap),
    /// An inode's attributes.
    #[wire(tag = 5)]
    Attr(InodeAttr),
    /// A new entry's attributes, with its directory's as they are after the change (when
    /// the directory's entries all live with it, so they are what a get-attributes would
    /// answer), which saves the client asking for them.
    #[wire(tag = 6)]
    Created {
        /// The new entry.
        attr: InodeAttr,
        /// Its directory, unless that is spread over several servers.
        parent: Option<InodeAttr>,
        /// For a file created open by a client whose access the servers check: the grant of
        /// access to its objects.
        #[serde(default, with = "crate::wire::since_3_advisory")]
        capability: Option<Capability>,
    },
    /// A page of a directory listing.
    #[wire(tag = 7)]
    DirEntries {
        /// Entries in cookie order.
        entries: Vec<DirEntry>,
        /// True when the listing reached the end.
        end: bool,
    },
    /// A symbolic link's target.
    #[wire(tag = 8)]
    LinkTarget(String),
    /// An extended attribute's value.
    #[wire(tag = 9)]
    XattrValue(Vec<u8>),
    /// An inode's extended attribute names.
    #[wire(tag = 10)]
    XattrNames(Vec<String>),
    /// Bytes written; data read is in the payload.
    #[wire(tag = 11)]
    Written {
        /// Bytes written.
        len: u32,
        /// Changes when writes acknowledged but not yet synced may have been lost (a storage
        /// server's boot id, or a mirror group's loss epoch); a sync answers it too, and a
        /// client whose unsynced writes carried another one reports EIO.
        verifier: u64,
    },
    /// An object's data is durable; `verifier` as in [`Response::Written`].
    #[wire(tag = 12)]
    Synced {
        /// The verifier now.
        verifier: u64,
    },
    /// Data is in the payload.
    #[wire(tag = 13)]
    Data,
    /// An object's length.
    #[wire(tag = 14)]
    Length(u64),
    /// Objects as (inode, length), in inode order; `end` when nothing follows.
    #[wire(tag = 15)]
    Objects {
        /// The objects.
        objects: Vec<(InodeId, u64)>,
        /// True when the listing reached the end.
        end: bool,
    },
    /// The result of a consistency check.
    #[wire(tag = 16)]
    CheckReport(CheckReport),
    /// The lock that conflicts, or none.
    #[wire(tag = 17)]
    LockConflict(Option<LockRange>),
    /// The server's lock epoch.
    #[wire(tag = 18)]
    LockEpoch(u64),
    /// A list of inodes.
    #[wire(tag = 19)]
    Inodes(Vec<InodeId>),
    /// Nothing needed doing (a rename onto another name of the same inode).
    #[wire(tag = 20)]
    Unchanged,
    /// A storage server's StorageBench state.
    #[wire(tag = 21)]
    StorageBench(StorageBenchStatus),
    /// A server's load counters.
    #[wire(tag = 22)]
    Stats(NodeStats),
    /// Management's view of the cluster.
    #[wire(tag = 23)]
    ClusterStatus(ClusterStatus),
    /// Mirror groups (the ones just created).
    #[wire(tag = 24)]
    MirrorGroups(Vec<MirrorGroupInfo>),
    /// Resyncs of storage mirror members, as their primaries last reported them.
    #[wire(tag = 25)]
    ResyncStats(Vec<ResyncProgress>),
    /// Management's answer to a heartbeat.
    #[wire(tag = 26)]
    HeartbeatAck {
        /// A primary may serve until this long after it sent the heartbeat.
        lease_ms: u64,
        /// The storage mirror groups the node's targets are members of.
        mirror_groups: Vec<MirrorGroupInfo>,
        /// Management's clock when it answered, in milliseconds since the Unix epoch: the
        /// cluster's clock, which capabilities' expiry is granted and checked by (0 from a
        /// management of version 7).
        #[serde(default, with = "crate::wire::since_8")]
        unix_ms: u64,
    },
    /// How far a consistency check is.
    #[wire(tag = 27)]
    CheckProgress(CheckProgress),
    /// An object's length, and the CRC32C of the range of it asked for (holes read as zeros).
    #[wire(tag = 28)]
    Checksum {
        /// The object's length.
        length: u64,
        /// CRC32C of the bytes of the range that lie before `length`.
        crc: u32,
    },
    /// A file opened by a client whose access the servers check: its attributes, and the
    /// grant of access to its objects the storage servers want from that client.
    #[wire(tag = 29, since = 3)]
    Opened {
        /// The file.
        attr: InodeAttr,
        /// The grant.
        capability: Capability,
    },
    /// A storage pool.
    #[wire(tag = 30, since = 4)]
    Pool(crate::pools::PoolInfo),
    /// What users, groups and projects use, per pool.
    #[wire(tag = 31, since = 4)]
    QuotaUsage(#[serde(with = "crate::quota::spoken_rows")] Vec<crate::quota::QuotaUsage>),
    /// Quota rules with their use and state.
    #[wire(tag = 32, since = 4)]
    Quotas(#[serde(with = "crate::quota::spoken_rows")] Vec<crate::quota::QuotaState>),
    /// A push of an object to another target is done ([`StorageRequest::Push`]).
    #[wire(tag = 33, since = 4)]
    Pushed {
        /// Bytes it copied.
        copied: u64,
    },
    /// How far a file's move is ([`MetaRequest::Migrate`]).
    #[wire(tag = 34, since = 4)]
    Migration {
        /// Slots of the layout that move (0: the file was where it should be).
        moving: u16,
        /// Whether the move is done.
        done: bool,
    },
    /// The answer to a [`MgmtRequest::Raft`], in the payload.
    #[wire(tag = 35, since = 7)]
    Raft,
    /// The end an open may grow its file to ([`MetaRequest::Reserve`]).
    #[wire(tag = 36, since = 9)]
    Reserved {
        /// The end.
        to: u64,
        /// For a client whose access the servers check: a new grant of the open, which lets
        /// its writes grow the file's objects as far as the room.
        capability: Option<Capability>,
    },
    /// What a home now holds of a quota ([`MgmtRequest::GrantQuota`]).
    #[wire(tag = 37, since = 9)]
    QuotaGranted {
        /// Bytes.
        bytes: u64,
        /// Inodes.
        inodes: u64,
    },
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

/// The body of a response frame.
pub type Reply = Result<Response, WireError>;
