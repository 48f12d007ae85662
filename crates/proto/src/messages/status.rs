//! Management's view of the cluster ([`ClusterStatus`]) and the load counters servers keep
//! ([`NodeStats`]).

use super::*;

/// Management's view of the cluster ([`MgmtRequest::GetClusterStatus`], and as JSON at
/// `/api/cluster` on management's port). Rates are per second over management's last two
/// samples of each server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// When this view was made, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Milliseconds between management's samples of the servers.
    pub sample_interval_ms: u64,
    /// Sums over the cluster.
    pub totals: ClusterTotals,
    /// Metadata and storage nodes.
    pub nodes: Vec<NodeStatus>,
    /// Storage targets.
    pub targets: Vec<TargetStatus>,
    /// The busiest client sessions over the whole cluster.
    pub clients: Vec<ClientStatus>,
    /// The cluster's throughput over the last minutes, oldest first.
    pub history: Vec<ClusterSample>,
    /// Recent events (nodes going offline or coming back, targets filling up), oldest first.
    pub events: Vec<ClusterEvent>,
    /// Quota rules with their use and state.
    #[serde(default, with = "crate::quota::spoken_rows")]
    pub quotas: Vec<crate::quota::QuotaState>,
}

impl ClusterStatus {
    /// The view for those who are not the cluster's members (a client key, or anyone over
    /// HTTP): without the client sessions and the quotas, which tell who uses what.
    pub fn without_details(mut self) -> ClusterStatus {
        self.clients.clear();
        self.quotas.clear();
        self
    }
}

/// Sums over the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterTotals {
    /// Metadata and storage nodes registered.
    pub nodes: u64,
    /// Of them, online.
    pub nodes_online: u64,
    /// Storage targets registered.
    pub targets: u64,
    /// Of them, online.
    pub targets_online: u64,
    /// Live client sessions.
    pub client_sessions: u64,
    /// Bytes all storage targets may hold.
    pub capacity_bytes: u64,
    /// Bytes free on all storage targets.
    pub free_bytes: u64,
    /// Inodes in the namespace (sum over metadata servers).
    pub inodes: u64,
    /// The latest throughput.
    pub now: ClusterSample,
}

/// The cluster's throughput at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSample {
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Bytes per second read from storage targets.
    pub read_bytes_per_second: u64,
    /// Bytes per second written to storage targets.
    pub written_bytes_per_second: u64,
    /// Requests per second answered by metadata servers.
    pub meta_ops_per_second: u64,
}

/// One node as management sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub id: NodeId,
    /// Metadata or storage.
    pub kind: NodeKind,
    /// Its alias.
    pub alias: String,
    /// Its addresses (also where its metrics are: `http://ADDRESS/metrics`).
    pub addresses: Vec<String>,
    /// Whether heartbeats arrive.
    pub reachability: Reachability,
    /// Milliseconds since the service started; 0 when it was not sampled.
    pub uptime_ms: u64,
    /// Requests per second.
    pub requests_per_second: u64,
    /// Bytes per second received (clients' writes, requests).
    pub received_bytes_per_second: u64,
    /// Bytes per second sent (clients' reads, answers).
    pub sent_bytes_per_second: u64,
    /// Requests waiting or running when sampled.
    pub in_flight: u64,
    /// A metadata server's target space.
    pub meta_usage: Option<SpaceUsage>,
    /// A metadata server's inodes.
    pub meta_inodes: Option<u64>,
}

/// One storage target as management sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStatus {
    /// The target.
    pub id: TargetId,
    /// Its storage node.
    pub node: NodeId,
    /// Its pool.
    pub pool: StoragePoolId,
    /// Whether its node's heartbeats arrive.
    pub reachability: Reachability,
    /// `good`, `needs-resync` or `bad`: its state in its mirror group (good outside any).
    pub consistency: String,
    /// Space and inodes as last reported.
    pub usage: SpaceUsage,
    /// Bytes per second read.
    pub read_bytes_per_second: u64,
    /// Bytes per second written.
    pub written_bytes_per_second: u64,
    /// Disk operations per second.
    pub operations_per_second: u64,
    /// Disk operations queued or running when sampled.
    pub queue_depth: u64,
    /// While it drains: files that still use it, as the metadata servers last told.
    #[serde(default, with = "crate::wire::since_4")]
    pub drain_left: Option<u64>,
    /// While it drains: why some of those files cannot move off (and what to do), when
    /// the metadata servers found some that cannot.
    #[serde(default, with = "crate::wire::since_8")]
    pub drain_blocked: Option<DrainBlock>,
}

/// Files of a draining target that cannot move off it, as a metadata home (or, summed,
/// management) found them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainBlock {
    /// The draining target.
    pub target: TargetId,
    /// How many files that use it found no place to move to.
    pub files: u64,
    /// Why (of the first), and what to do.
    pub why: String,
}

/// One client session's load over the whole cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStatus {
    /// The session.
    pub client: ClientId,
    /// Requests per second to every server.
    pub requests_per_second: u64,
    /// Bytes per second it writes to storage servers.
    pub written_bytes_per_second: u64,
    /// Bytes per second it reads from storage servers.
    pub read_bytes_per_second: u64,
}

/// Something that happened in the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEvent {
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// `info` or `warning`.
    pub level: String,
    /// What happened, in words.
    pub message: String,
}

/// Most clients one [`NodeStats`] lists (the busiest).
pub const STATS_CLIENTS_MAX: usize = 1000;

/// A server's counters since it started. Rates are differences of two of these.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Milliseconds since the service started.
    pub uptime_ms: u64,
    /// Requests answered.
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Bytes of frames received.
    pub received_bytes: u64,
    /// Bytes of frames sent.
    pub sent_bytes: u64,
    /// Requests received and not answered yet.
    pub in_flight: u64,
    /// Requests answered, by operation name, in name order.
    pub ops: Vec<(String, u64)>,
    /// The busiest client sessions, at most [`STATS_CLIENTS_MAX`].
    pub clients: Vec<ClientStats>,
    /// A storage server's targets.
    pub targets: Vec<TargetStats>,
}

/// One client session's load on one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStats {
    /// The session (its id's low 32 bits; 0 for servers and tools without a session).
    pub client: ClientId,
    /// Requests answered.
    pub requests: u64,
    /// Bytes received from the session (what it wrote).
    pub received_bytes: u64,
    /// Bytes sent to the session (what it read).
    pub sent_bytes: u64,
}

/// One storage target's disk counters since its server started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStats {
    /// The target.
    pub target: TargetId,
    /// Disk operations done.
    pub operations: u64,
    /// Bytes read from the target.
    pub read_bytes: u64,
    /// Bytes written to the target.
    pub written_bytes: u64,
    /// Disk operations queued or running now.
    pub queue_depth: u64,
    /// Space and inodes now.
    pub usage: SpaceUsage,
}

/// What any server answers to [`Request::Stats`]: its load counters.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum StatsResponse {
    /// A server's load counters.
    #[wire(tag = 22)]
    Stats(NodeStats),
}
