//! The management service: the registry of nodes, targets and client sessions, id allocation,
//! and reachability from heartbeats.
//!
//! Layout:
//! - `config`: [`MgmtConfig`].
//! - `store`: the redb tables (nodes, targets, counters, clients), committed before replies.
//! - `service`: the request handler and the in-memory heartbeat view.
//! - `mirrors`: mirror groups: versions, primaries, member states and leases, driven by the
//!   storage servers' heartbeats, committed before they are published.
//! - `pools`: storage pools: created, removed, targets moved between them, capacity limits.
//! - `replication`: the store replicated over 3 or 5 management servers with Raft; only the
//!   leader serves.
//! - `monitor`: samples every server's load, keeps recent throughput, turns state changes
//!   into events; the cluster view (`/api/cluster`, `weft cluster`) comes from it.
//!
//! Ids are allocated per node kind (metadata nodes 1, 2, …; storage nodes 1, 2, …) and never
//! reused. After a restart, management counts every node as heard from at its own start, so it
//! waits a full offline timeout before it marks anything offline.

pub mod config;
mod mirrors;
mod monitor;
mod pools;
mod replication;
mod service;
mod store;

/// Entry points for the fuzzers (`fuzz/` at the top of the repository).
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `bytes` as each kind of record management stores; none may panic, whatever the
    /// bytes.
    pub fn decode_stored_records(bytes: &[u8]) {
        let _ = postcard::from_bytes::<crate::store::NodeRecord>(bytes);
        let _ = postcard::from_bytes::<crate::store::TargetRecord>(bytes);
        let _ = postcard::from_bytes::<crate::store::PoolRecord>(bytes);
        let _ = postcard::from_bytes::<weft_proto::access::ClientRule>(bytes);
        let _ = postcard::from_bytes::<weft_mirror::ControllerDurable>(bytes);
    }
}

pub use config::MgmtConfig;
pub use service::run;

/// Why the management service stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MgmtError {
    /// The configuration is unusable (its authentication settings, its key file).
    #[error("{0}")]
    Config(String),
    /// The data directory cannot be used.
    #[error("management data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An address in the config cannot be listened on.
    #[error("{0}")]
    Listen(String),
    /// The store could not be opened or written.
    #[error("management store: {0}")]
    Store(String),
    /// A change refused the same way by every management server (no id is left).
    #[error("{0}")]
    Refused(String),
    /// This server is not the leader of a replicated management (the message names the
    /// leader), or lost its majority before a change was committed.
    #[error("{0}")]
    NotLeader(String),
    /// A target removed from the cluster (`weft target remove`) registers again.
    #[error("target {0} was removed from the cluster: take its directory out of the storage server's config (its data is no longer part of the file system)")]
    TargetRemoved(weft_proto::ids::TargetId),
    /// A heartbeat of an earlier start of a mirror member than one management heard.
    #[error(
        "heartbeat of an earlier start of member {member} (boot id {boot}; management heard {known}): \
         a late message, or the node's boot.id was lost while its clock is behind — it gets no \
         lease until its clock passes its last start"
    )]
    EarlierStart {
        /// The member.
        member: weft_proto::ids::MemberId,
        /// The heartbeat's boot id.
        boot: u64,
        /// The boot id management heard last.
        known: u64,
    },
}
