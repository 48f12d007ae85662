//! The typed answer of each request: what a caller gets out of its service's response.
//!
//! Every request variant declares its answer (`#[request(answer = T)]`, see
//! [`crate::access::Declared`]); the client stubs return that type, and a server checks in
//! debug builds that what it answers carries it ([`MetaRequest::answer_fits`] and its
//! siblings). A caller therefore never matches a response variant its request cannot get, and
//! a server that answers a variant its request did not declare is caught by the tests.
//!
//! [`MetaRequest::answer_fits`]: crate::messages::MetaRequest::answer_fits

use crate::access::Capability;
use crate::ids::InodeId;
use crate::messages::{
    CheckProgress, CheckReport, ClusterMap, ClusterStatus, DirEntry, DirEntryPlus, InodeAttr,
    LockRange, MetaResponse, MgmtResponse, MirrorGroupInfo, NodeStats, ResyncProgress,
    StatsResponse, StorageBenchStatus, StorageResponse,
};
use crate::pools::PoolInfo;
use crate::quota::{QuotaState, QuotaUsage};
use crate::{ClientId, NodeId, TargetId};

/// A request's answer, taken out of its service's response `R`.
pub trait Answer<R>: Sized {
    /// Whether `response` carries this answer.
    fn fits(response: &R) -> bool;
    /// The answer `response` carries, or the response back when it carries another.
    ///
    /// # Errors
    /// The response itself, when it is not this answer.
    fn take(response: R) -> Result<Self, R>;
}

/// Declares, per answer type, the response variants that carry it and how it is taken out.
macro_rules! answers {
    ($response:ident { $($answer:ty: $($pattern:pat => $value:expr),+;)* }) => {
        $(
            impl Answer<$response> for $answer {
                #[allow(unused_variables, unreachable_patterns)]
                fn fits(response: &$response) -> bool {
                    match response {
                        $($pattern => true,)+
                        _ => false,
                    }
                }

                #[allow(unreachable_patterns)]
                fn take(response: $response) -> Result<Self, $response> {
                    match response {
                        $($pattern => Ok($value),)+
                        other => Err(other),
                    }
                }
            }
        )*
    };
}

/// Any response: the answer of the steps servers take with each other, whose callers (the
/// cross-server protocols) read every outcome the step can have.
macro_rules! any_answer {
    ($($response:ident),*) => {
        $(
            impl Answer<$response> for $response {
                fn fits(_: &$response) -> bool {
                    true
                }

                fn take(response: $response) -> Result<Self, $response> {
                    Ok(response)
                }
            }
        )*
    };
}

any_answer!(MetaResponse, MgmtResponse, StorageResponse);

/// What a create answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateReply {
    /// The new entry.
    pub attr: InodeAttr,
    /// Its directory after the change, when its server could tell.
    pub parent: Option<InodeAttr>,
    /// For a file created open by a client whose access the servers check: the grant of
    /// access to its objects.
    pub capability: Option<Capability>,
    /// For a new directory, its names lease in milliseconds from the request's first send
    /// (0: none).
    pub lease_ms: u32,
    /// The names lease on the directory it was made in, renewed for this many milliseconds
    /// from the request's first send (0: not renewed).
    pub parent_lease_ms: u32,
}

answers!(MetaResponse {
    (): MetaResponse::Done => ();
    InodeAttr: MetaResponse::Attr(attr) => attr;
    CreateReply:
        MetaResponse::Created { attr, parent, capability, lease_ms, parent_lease_ms } =>
            CreateReply { attr, parent, capability, lease_ms, parent_lease_ms },
        MetaResponse::Attr(attr) =>
            CreateReply { attr, parent: None, capability: None, lease_ms: 0, parent_lease_ms: 0 };
    Option<InodeAttr>:
        MetaResponse::Removed { parent } => parent,
        MetaResponse::Done => None;
    (Vec<DirEntry>, bool): MetaResponse::DirEntries { entries, end } => (entries, end);
    (Vec<DirEntryPlus>, bool): MetaResponse::DirEntriesPlus { entries, end } => (entries, end);
    String: MetaResponse::LinkTarget(target) => target;
    Vec<u8>: MetaResponse::XattrValue(value) => value;
    Vec<String>: MetaResponse::XattrNames(names) => names;
    CheckReport: MetaResponse::CheckReport(report) => report;
    Option<LockRange>: MetaResponse::LockConflict(conflict) => conflict;
    u64: MetaResponse::LockEpoch(epoch) => epoch, MetaResponse::Synced(number) => number;
    Vec<InodeId>: MetaResponse::Inodes(inodes) => inodes;
    CheckProgress: MetaResponse::CheckProgress(progress) => progress;
    (InodeAttr, Option<Capability>):
        MetaResponse::Opened { attr, capability } => (attr, Some(capability)),
        MetaResponse::Attr(attr) => (attr, None);
    Vec<QuotaUsage>: MetaResponse::QuotaUsage(usage) => usage;
    (u16, bool): MetaResponse::Migration { moving, done } => (moving, done);
    (u64, Option<Capability>): MetaResponse::Reserved { to, capability } => (to, capability);
});

/// What a client session's registration answered: the session, and how long management keeps
/// it without a heartbeat in milliseconds (0: not said, from a server of version 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The new session.
    pub client: ClientId,
    /// The session's timeout in milliseconds; 0 when the server did not say.
    pub session_timeout_ms: u64,
}

/// Management's answer to a heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatAck {
    /// A primary may serve until this long after it sent the heartbeat.
    pub lease_ms: u64,
    /// The storage mirror groups the node's targets are members of.
    pub mirror_groups: Vec<MirrorGroupInfo>,
    /// Management's clock when it answered, in milliseconds since the Unix epoch (0 from a
    /// management of version 7).
    pub unix_ms: u64,
}

/// The answer of a request whose answer is its payload ([`MgmtResponse::Raft`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InPayload;

answers!(MgmtResponse {
    (): MgmtResponse::Done => ();
    NodeId: MgmtResponse::NodeRegistered { node } => node;
    TargetId: MgmtResponse::TargetRegistered { target } => target;
    Registered: MgmtResponse::ClientRegistered { client, session_timeout_ms } =>
        Registered { client, session_timeout_ms };
    ClusterMap: MgmtResponse::ClusterMap(map) => map;
    ClusterStatus: MgmtResponse::ClusterStatus(status) => status;
    Vec<MirrorGroupInfo>: MgmtResponse::MirrorGroups(groups) => groups;
    Vec<ResyncProgress>: MgmtResponse::ResyncStats(stats) => stats;
    HeartbeatAck: MgmtResponse::HeartbeatAck { lease_ms, mirror_groups, unix_ms } =>
        HeartbeatAck { lease_ms, mirror_groups, unix_ms };
    PoolInfo: MgmtResponse::Pool(pool) => pool;
    Vec<QuotaState>: MgmtResponse::Quotas(quotas) => quotas;
    InPayload: MgmtResponse::Raft => InPayload;
    (u64, u64): MgmtResponse::QuotaGranted { bytes, inodes } => (bytes, inodes);
});

/// What a write answered: bytes written, and the verifier (see [`StorageResponse::Written`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Bytes written.
    pub len: u32,
    /// The verifier the write was made under.
    pub verifier: u64,
}

/// What a sync answered: the verifier now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Synced {
    /// The verifier.
    pub verifier: u64,
}

/// What a read answered: the data is in the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Data;

/// An object's length, and the CRC32C of the range of it asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checksum {
    /// The object's length.
    pub length: u64,
    /// CRC32C of the bytes of the range that lie before `length`.
    pub crc: u32,
}

/// A page of a target's objects, as (inode, length) in inode order, and whether it ends the
/// listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectsPage {
    /// The objects.
    pub objects: Vec<(InodeId, u64)>,
    /// True when the listing reached the end.
    pub end: bool,
}

/// Bytes a push copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// Bytes.
    pub copied: u64,
}

answers!(StorageResponse {
    (): StorageResponse::Done => ();
    Written: StorageResponse::Written { len, verifier } => Written { len, verifier };
    Synced: StorageResponse::Synced { verifier } => Synced { verifier };
    Data: StorageResponse::Data => Data;
    u64: StorageResponse::Length(length) => length;
    ObjectsPage: StorageResponse::Objects { objects, end } => ObjectsPage { objects, end };
    StorageBenchStatus: StorageResponse::StorageBench(status) => status;
    Checksum: StorageResponse::Checksum { length, crc } => Checksum { length, crc };
    Pushed: StorageResponse::Pushed { copied } => Pushed { copied };
});

answers!(StatsResponse {
    NodeStats: StatsResponse::Stats(stats) => stats;
});

/// A service's request enum, and the response its requests are answered with.
pub trait Service {
    /// The response.
    type Response;
}

/// Checks, in debug builds, that a server's reply to request `op` carries the answer the
/// request declares (`fits`, from its `answer_fits`): a server that answers otherwise has a
/// bug its callers would meet as an unexpected response.
///
/// # Panics
/// In debug builds, when the reply is a response that does not fit.
pub fn debug_check<R: std::fmt::Debug>(
    op: &str,
    fits: impl Fn(&R) -> bool,
    reply: &Result<R, crate::error::WireError>,
) {
    if let Ok(response) = reply {
        debug_assert!(
            fits(response),
            "{op} answered {response:?}, which does not carry the answer it declares"
        );
    }
}
